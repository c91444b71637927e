"""``dispatch = hindsight`` (docs/model.md section 12.6): the best static order for one draw's lengths, known in
advance, solved on the fixed-delay relaxation and replayed through the kernel as any given order.

The relaxation keeps every dependency, one compute task at a time per GPU and the memory limit of section 12.1
(each micro-batch's activations on a stage held from its forward's start to the end of the work that gives them
back), and lets every transfer take exactly its work, alone on its port. OR-Tools' CP-SAT (the ``[solver]``
extra) solves it within a deterministic work limit and on one thread, so that the same draw gives the same order
on any machine; its answer says whether the order is proven optimal for the relaxation. Beyond ``SOLVED_TASKS``
tasks, or when the solver finds nothing in its limit, the order is the fastest rule's on this draw.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple, Sequence

import numpy as np

from .engine import (
    bound_of_lengths,
    build_task_graph,
    check_run,
    graph_arrays,
    memory_in_force,
    simulate,
    simulate_figures,
    static_peak,
    task_lengths,
    texts_of,
)
from .model import ROOM_UNIT, EnvParams, ParameterError, Policy, Schedule, TaskKind
from .tables import LengthTable
from .taskgraph import per_environment, table_of

#: The most tasks the solver is given (n = 32 on 8 GPUs has about 1,300): beyond them the order is a rule's.
SOLVED_TASKS = 2_000
#: CP-SAT's deterministic time limit (its own unit of work, a few seconds on one core): the same on every machine.
WORK_LIMIT = 1.0
#: Integer time steps per mean compute task: the solver works in whole steps.
STEPS = 1000
#: The rules whose orders stand in for the solver's beyond ``SOLVED_TASKS``: the fastest on the draw is taken.
FALLBACK_RULES = ("greedy", "critical-path", "zb-adaptive")


class Hindsight(NamedTuple):
    """The order found for one draw: per GPU its compute tasks (indices into the static task graph); ``status``
    "optimal" (proven for the relaxation), "feasible" (the solver's best within its limit) or "heuristic" (the
    fastest of ``FALLBACK_RULES``' orders); ``relaxed`` its time in the relaxation and ``relaxed_bound`` what the
    solver proved no order beats there, itself a lower bound of every run within the limit (NaN for a heuristic)."""

    order: tuple[tuple[int, ...], ...]
    status: str
    relaxed: float
    relaxed_bound: float


def static_params(params: EnvParams) -> EnvParams:
    """``params`` as the static order that replays a hindsight order runs it; ``ParameterError`` where no static
    order has the dispatchers' task graph (DualPipeV's static order runs its pairs as single tasks)."""
    static = replace(params, dispatch="static", memory_limit=0.0)
    if any(task.kind is TaskKind.OVERLAP_F_B for task in build_task_graph(static).tasks):
        raise ParameterError("dispatch", params.dispatch, f"a hindsight order is replayed as a static order, and "
                             f"{params.schedule}'s static order runs its pairs as single tasks; use another schedule")
    return static


def solver_available() -> bool:
    """Whether the ``[solver]`` extra (OR-Tools) is installed."""
    try:
        import ortools.sat.python.cp_model  # noqa: F401
    except ImportError:
        return False
    return True


def check_hindsight(params: EnvParams) -> None:
    """``ParameterError`` naming ``dispatch`` where hindsight cannot run ``params``: a schedule whose static order
    cannot replay its order, or an environment small enough for the solver without the ``[solver]`` extra."""
    static = static_params(params)
    if len(graph_arrays(static).gpu) <= SOLVED_TASKS and not solver_available():
        raise ParameterError("dispatch", params.dispatch, "needs the [solver] extra: pip install -r "
                             "requirements-solver.txt")


def hindsight(params: EnvParams, sample: int = 0) -> Hindsight:
    """The hindsight order of ``params``' ``sample``-th draw within its memory limit in force (section 12.1)."""
    return _hindsight(params, sample, table_of(params))


@per_environment(256)
def _hindsight(params: EnvParams, sample: int, table: LengthTable | None) -> Hindsight:
    """``hindsight`` of ``params``' draw on its table of lengths as read."""
    check_hindsight(params)
    static = static_params(params)
    if len(graph_arrays(static).gpu) <= SOLVED_TASKS:
        found = solve(static, sample, memory_in_force(params))
        if found is not None:
            return found
    runs = [simulate(replace(params, dispatch=rule), Policy(), sample) for rule in FALLBACK_RULES]
    fastest = min(runs, key=lambda run: run.completion_time)
    graph = build_task_graph(static)
    where = {text: i for order in graph.orders for i, text in zip(order, texts_of(graph, order))}
    return Hindsight(tuple(tuple(where[text] for text in texts) for texts in fastest.order_text()), "heuristic",
                     math.nan, math.nan)


def solve(static: EnvParams, sample: int, limit: float) -> Hindsight | None:
    """The relaxation of ``static``'s draw ``sample`` within ``limit`` solved by CP-SAT, or None if it found no
    order in ``WORK_LIMIT``."""
    from ortools.sat.python import cp_model

    graph = build_task_graph(static)
    arrays = graph_arrays(static)
    lengths = task_lengths(static, sample)
    scale = STEPS / max(float(lengths[arrays.comm < 0].mean()), 1e-300)
    work = np.rint(lengths * scale)
    # the static order's run is a schedule of the relaxation (every task took at least its work); within the
    # limit it bounds the makespan, and it is the first solution to beat
    run = simulate(static, Policy(), sample)
    fits = max(run.peak_activations) <= limit + 1e-9
    slack = len(work)  # whole steps: each task's rounding, at most one step along any chain
    horizon = int(math.ceil(run.completion_time * scale)) + slack if fits else int(work.sum()) + 1
    model = cp_model.CpModel()
    start = [model.new_int_var(0, horizon, f"s{i}") for i in range(len(work))]
    end = [model.new_int_var(0, horizon, f"e{i}") for i in range(len(work))]
    task = [model.new_interval_var(start[i], int(w), end[i], f"t{i}") for i, w in enumerate(work)]
    for i, needs in enumerate(graph.needs):
        for j in needs:
            model.add(start[i] >= end[j])
    for transfer, issuer in graph.issued_by.items():
        if issuer >= 0:
            model.add(start[transfer] >= start[issuer])
    for order in graph.orders:
        model.add_no_overlap([task[i] for i in order])
    held: list[list[cp_model.IntervalVar]] = [[] for _ in range(static.num_gpus)]
    rooms: list[list[int]] = [[] for _ in range(static.num_gpus)]
    where = {(t.kind, t.stage, t.index): i for i, t in enumerate(graph.tasks) if t.parts}
    for (kind, stage, mb), rise in where.items():
        if kind is TaskKind.FORWARD and arrays.rises[rise] > 0:  # held from the forward to the work giving it back
            fall = where.get((TaskKind.BACKWARD_WEIGHT, stage, mb), where.get((TaskKind.BACKWARD, stage, mb)))
            assert fall is not None
            span = model.new_int_var(0, horizon, f"h{rise}")
            held[graph.tasks[rise].gpu].append(model.new_interval_var(start[rise], span, end[fall], f"m{rise}"))
            rooms[graph.tasks[rise].gpu].append(int(arrays.rises[rise]))
    units = math.floor(limit * static.v * ROOM_UNIT + 1e-6)
    for g in range(static.num_gpus):
        model.add_cumulative(held[g], rooms[g], units)
    # the memory-aware bound holds in the relaxation too, on its whole steps: given, it often proves the optimum
    makespan = model.new_int_var(math.ceil(bound_of_lengths(static, work, limit) - 1e-6), horizon, "makespan")
    model.add_max_equality(makespan, end)
    model.minimize(makespan)
    if fits:
        for i, begun in enumerate(run.tasks):
            model.add_hint(start[i], int(round(begun.start * scale)))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = WORK_LIMIT
    solver.parameters.random_seed = 0
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    starts = [solver.value(s) for s in start]
    ordered = tuple(tuple(sorted(tasks, key=lambda i: (starts[i], i))) for tasks in graph.orders)
    return Hindsight(ordered, "optimal" if status == cp_model.OPTIMAL else "feasible", solver.objective_value / scale,
                     solver.best_objective_bound / scale)


def hindsight_figures(params: EnvParams, policies: Sequence[Policy], sample: int = 0) -> np.ndarray:
    """``engine.simulate_figures`` of the hindsight run of draw ``sample`` under each of ``policies``: per policy
    the faster of the hindsight order and the schedule's static order, each replayed through the kernel."""
    static = static_params(params)
    solved = simulate_figures(static, policies, sample, hindsight(params, sample).order)
    if not _static_fits(params):
        return solved
    own = simulate_figures(static, policies, sample)
    return np.where((own[:, 0] < solved[:, 0])[:, None], own, solved)


def _static_fits(params: EnvParams) -> bool:
    """Whether the schedule's static order keeps within ``params``' memory limit (the default limit is its peak)."""
    return static_peak(params) <= memory_in_force(params) + 1e-9


def simulate_hindsight(params: EnvParams, policy: Policy, sample: int = 0) -> Schedule:
    """The hindsight run of draw ``sample`` under ``policy``, as ``engine.simulate`` gives it."""
    check_run("simulate_hindsight", params, policy, sample)
    static = static_params(params)
    graph = build_task_graph(static)
    solved = simulate(static, policy, sample, [texts_of(graph, tasks) for tasks in hindsight(params, sample).order])
    if not _static_fits(params):
        return solved
    own = simulate(static, policy, sample)
    return own if own.completion_time < solved.completion_time else solved


def proven_share(params: EnvParams, draws: int) -> float:
    """The share of draws 0 to ``draws`` - 1 whose hindsight order is proven optimal for the relaxation."""
    return sum(hindsight(params, sample).status == "optimal" for sample in range(draws)) / draws
