"""What a simulation costs on one core, estimated before any is run: a sweep's check that its grid finishes in a
day, and the size of its units of work. Each figure is a slow day's, above what ``benchmarks/bench.py`` measures."""

from __future__ import annotations

from .hindsight import SOLVED_TASKS
from .model import HINDSIGHT, LOOKAHEAD, EnvParams

#: One task of a simulation (measured: 0.25 to 0.45 us on most environments, up to 3 us where syncs pile up).
SECONDS_PER_TASK = 2e-6
#: The look-ahead, per GPU and squared task: at each decision with a choice, every candidate runs a copy of the
#: iteration to its end (docs/model.md section 12.7), so a copy grows with the tasks and the decisions with the
#: tasks and the GPUs. Measured 1.6e-8 to 3.5e-8 s on GPipe, 1F1B and ZB-H1 from 2 to 16 GPUs and 8 to 32
#: micro-batches at 20% jitter, 5e-8 to 6.7e-8 on ZB-H1 without jitter at 8 GPUs and 48 micro-batches and at 16
#: and 64 (78 s an iteration).
LOOKAHEAD_SECONDS = 1e-7
#: A hindsight draw's solve, shared by every policy (measured: 1.7 s median, 2.6 s at most, at n = 8 on 4 GPUs,
#: within the solver's deterministic work limit).
SOLVE_SECONDS = 5.0


def simulation_seconds(params: EnvParams, tasks: int) -> float:
    """One simulation of ``params``, of about ``tasks`` tasks (``taskgraph.estimated_tasks``)."""
    if params.dispatch == LOOKAHEAD:
        return LOOKAHEAD_SECONDS * params.num_gpus * tasks ** 2
    return SECONDS_PER_TASK * tasks


def draw_seconds(params: EnvParams, tasks: int) -> float:
    """The work of one draw of ``params`` that every policy shares: a hindsight order's solve, where the solver
    takes the environment (``hindsight.SOLVED_TASKS``)."""
    return SOLVE_SECONDS if params.dispatch == HINDSIGHT and tasks <= SOLVED_TASKS else 0.0
