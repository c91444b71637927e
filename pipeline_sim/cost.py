"""What a simulation costs on one core, estimated before any is run: a sweep's check that its grid finishes in a
day, and the size of its units of work. Each figure is a slow day's, above what ``benchmarks/bench.py`` measures."""

from __future__ import annotations

from .hindsight import SOLVED_TASKS
from .model import HINDSIGHT, LOOKAHEAD, EnvParams
from .schedules import get_schedule

#: The longest run, by this estimate on one core's share, that a command starts without --allow-large.
MAX_HOURS = 24

#: One task of a simulation (measured: 0.25 to 0.45 us on most environments, up to 3 us where syncs pile up).
SECONDS_PER_TASK = 2e-6
#: The look-ahead, per GPU and squared task: at each decision with a choice, every candidate runs a copy of the
#: iteration to its end (docs/model.md section 12.7), so a copy grows with the tasks and the decisions with the
#: tasks and the GPUs. A schedule that splits its backward (one that reads ``w_fraction``) has a third kind of task
#: to choose, and many more decisions: ZB-H1 at 16 GPUs and 64 micro-batches took 78 s an iteration without jitter
#: (1.35e-7 s) and 33 s at 20% (0.6e-7), at 8 GPUs and 32 micro-batches 0.9e-7; 1F1B at 16 GPUs and 64 4 to 11 s
#: (0.7e-8 to 1.9e-8), GPipe at 8 GPUs and 32 0.7e-8.
LOOKAHEAD_SECONDS = 3e-8
LOOKAHEAD_SPLIT_SECONDS = 1.5e-7
#: A hindsight draw's solve, shared by every policy (measured: 1.7 s median, 2.6 s at most, at n = 8 on 4 GPUs,
#: within the solver's deterministic work limit).
SOLVE_SECONDS = 5.0


def simulation_seconds(params: EnvParams, tasks: int) -> float:
    """One simulation of ``params``, of about ``tasks`` tasks (``taskgraph.estimated_tasks``)."""
    if params.dispatch == LOOKAHEAD:
        split = "w_fraction" in get_schedule(params.schedule).parameters
        return (LOOKAHEAD_SPLIT_SECONDS if split else LOOKAHEAD_SECONDS) * params.num_gpus * tasks ** 2
    return SECONDS_PER_TASK * tasks


def draw_seconds(params: EnvParams, tasks: int) -> float:
    """The work of one draw of ``params`` that every policy shares: a hindsight order's solve, where the solver
    takes the environment (``hindsight.SOLVED_TASKS``)."""
    return SOLVE_SECONDS if params.dispatch == HINDSIGHT and tasks <= SOLVED_TASKS else 0.0
