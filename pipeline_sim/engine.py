"""Simulating an environment: the task graph as arrays, handed to the compiled kernel (``kernel/``).

``simulate`` returns every task's timeline (for charts, traces, the validator and the
API); ``simulate_figures`` returns only the figures a sweep keeps, for many policies in
one kernel call. Both run the same kernel; neither asks which schedule built the graph.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import multiprocessing.process
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import llvmlite.binding
import numba
import numpy as np

from . import compile_cache
from .model import (
    COMM_KINDS,
    DISPATCHERS,
    HINDSIGHT,
    KIND_INDEX,
    LOOKAHEAD,
    ROOM_UNIT,
    SAMPLES,
    EnvParams,
    ParameterError,
    Policy,
    Run,
    RunTasks,
    Schedule,
    Task,
    TaskKind,
)
from .noise import standard_normals
from .orders import order_parts
from .tables import LengthTable
from .taskgraph import (
    _FALLING,
    _RISING,
    TaskGraph,
    _structure_of,
    _work_of,
    build_task_graph,
    check_size,
    environment_computed,
    gpu_rooms,
    graph_structure,
    graph_work,
    per_environment,
    per_structure,
    stage_rooms,
    table_of,
    task_lengths,
    task_texts,
)

compile_cache.load_kernel()  # a place to keep the kernel's machine code found before its functions look for one
from . import kernel  # noqa: E402
from .kernel import jit, loop  # noqa: E402
from .kernel.state import END_TOLERANCE  # noqa: E402

#: How long the first compile of the kernel takes on a 2-core machine (benchmarks/bench.py); and that of a part of it
#: once the other part is compiled, which shares the loop and its callees (a first sweep after a first chart: 4 s; a
#: first chart after a first sweep: 6 s).
COMPILE_SECONDS = 13
REST_SECONDS = 6


class SimulationStuckError(RuntimeError):
    """Nothing can progress although tasks remain; the message names them."""


class GraphArrays(NamedTuple):
    """A task graph's structure as the kernel reads it; ``*_start``/``*_task`` pairs are compressed rows.

    Per task: its GPU, receiver (-1: none), transfer kind number (-1: compute), stage,
    index, compute impact, how many tasks it waits for, its class for dispatchers
    (``taskgraph._KIND_CLASS``; -1 for a transfer or a pair; an optimizer step's is never chosen), the room for
    activations it takes when it starts (``reserve``: a micro-batch's whole share on its GPU, at the forward of its
    first stage there; docs/model.md section 12.1), the activations of the forward part
    starting with it (``rises``) and of the backward or weight-gradient part ending with
    it (``falls``), all in units of ``ROOM_UNIT`` per stage of weight 1.
    """

    gpu: np.ndarray
    receiver: np.ndarray
    comm: np.ndarray
    stage: np.ndarray
    index: np.ndarray  # type: ignore[assignment]  # shadows tuple.index, as GraphTask's
    impact: np.ndarray
    needs_count: np.ndarray
    release_start: np.ndarray
    release_task: np.ndarray
    order_start: np.ndarray
    order_task: np.ndarray
    peer_start: np.ndarray
    peer_task: np.ndarray
    kind_class: np.ndarray
    reserve: np.ndarray
    rises: np.ndarray
    falls: np.ndarray

    def kernel_arguments(self, lengths: np.ndarray, params: EnvParams) -> tuple:
        """The arguments of ``kernel.simulate`` from ``length`` to ``memory``: the graph and the dispatch rule."""
        key, rule, memory = dispatch_arguments(params)
        return (lengths, *self[:15], self.falls, key, rule, memory)


def _rows(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in lists], out=starts[1:])
    return starts, np.array([x for row in lists for x in row], dtype=np.int64)


@per_environment(256)
def graph_arrays(params: EnvParams) -> GraphArrays:
    """The arrays of ``params``' task graph (its structure: the same for every noise draw), without its records:
    the structure's own once per structure, those of the work and activations from a few values per stage."""
    environment_computed(params)
    structure, work = graph_structure(params), graph_work(params)
    return GraphArrays(structure.gpu, structure.receiver, structure.comm, structure.stage, structure.index, work.impact,
                       structure.needs_count, structure.issue_start, structure.issue_task, structure.order_start,
                       structure.order_task, structure.peer_start, structure.peer_task, structure.kind_class,
                       work.reserve, work.rises, work.falls)


def activation_units(params: EnvParams) -> int:
    """Units per micro-batch of a GPU's whole share of the model, in which peaks are told (section 7)."""
    return params.v * ROOM_UNIT


@lru_cache(maxsize=64)
def policy_arrays(policies: tuple[Policy, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per policy and transfer kind (``COMM_KINDS`` order): exclusive tier rank (0 = 'a', -1 shared), priority."""
    tiers = np.full((len(policies), len(COMM_KINDS)), -1, dtype=np.int64)
    priorities = np.zeros((len(policies), len(COMM_KINDS)))
    for row, policy in enumerate(policies):
        letters = sorted(set(policy.exclusive_tiers.values()))
        for k, kind in enumerate(COMM_KINDS):
            tier = policy.tier(kind)
            tiers[row, k] = -1 if tier is None else letters.index(tier)
            priorities[row, k] = policy.shared_priority(kind)
    return tiers, priorities


def gpu_order_peaks(params: EnvParams, orders: Sequence[Sequence[int]] | None = None) -> list[float]:
    """Each GPU's peak activations when each GPU runs ``orders`` (section 7; None: the graph's own): a GPU's
    activations rise and fall only with its own tasks, in its order, so the peak does not depend on noise or
    communication."""
    arrays = graph_arrays(params)
    starts, tasks = (arrays.order_start, arrays.order_task) if orders is None else _rows(orders)
    return _order_peaks(params, arrays.rises[tasks], arrays.falls[tasks], starts)


def _order_peaks(params: EnvParams, rises: np.ndarray, falls: np.ndarray, starts: np.ndarray) -> list[float]:
    """Each GPU's peak activations when it runs tasks whose activations rise by ``rises`` as each starts and fall by
    ``falls`` as it ends, GPU after GPU (compressed rows ``starts``), each GPU's in its order."""
    after = np.cumsum(rises - falls)  # the level after each task, as if one GPU ran all orders one after another
    before = np.concatenate(([0], after))[starts[:-1]]  # that level when each GPU's order begins
    during = after + falls - np.repeat(before, np.diff(starts))  # a GPU's level while each of its tasks runs
    peaks = [int(row.max(initial=0)) for row in np.split(during, starts[1:-1])]
    return [peak / activation_units(params) for peak in peaks]


def static_order_peaks(params: EnvParams) -> list[float]:
    """What ``gpu_order_peaks`` gives for the schedule's static order, read from the orders alone: the planner asks
    it of layouts it never simulates, whose task graphs would cost more than this."""
    gpus, kinds, stages, _, second = order_parts(params, split=False)
    first = second == 0
    task = np.cumsum(first) - 1  # each part's task: a pair is one
    room = np.array(stage_rooms(params), dtype=np.int64)[stages]
    count = int(task[-1]) + 1 if len(task) else 0
    rises, falls = (np.bincount(task, weights=np.where(chosen[kinds], room, 0), minlength=count).astype(np.int64)
                    for chosen in (_RISING, _FALLING))
    starts = np.zeros(params.num_gpus + 1, dtype=np.int64)
    np.cumsum(np.bincount(gpus[first], minlength=params.num_gpus), out=starts[1:])
    return _order_peaks(params, rises, falls, starts)


def order_peak(params: EnvParams, orders: Sequence[Sequence[int]]) -> float:
    """The busiest GPU's peak activations when each GPU runs ``orders``."""
    return max(gpu_order_peaks(params, orders))


@lru_cache(maxsize=256)
def static_peak(params: EnvParams) -> float:
    """The busiest GPU's peak activations under the schedule's static order."""
    return max(static_order_peaks(params))


def given_order(params: EnvParams, order: Sequence[Sequence[str]]) -> tuple[tuple[int, ...], ...]:
    """Per GPU, the tasks (indices into the task graph) of a static order given as text, one list per GPU
    (``"0F3"``, ``"(0F7;7B3)"``: what ``--print-order`` prints); ``ParameterError`` naming ``order`` unless each GPU
    lists exactly its own compute tasks, each once."""
    if params.dispatch != "static":
        raise ParameterError("dispatch", params.dispatch, "a given order is a static order: it runs with dispatch "
                             "static")
    if isinstance(order, str) or not all(isinstance(tasks, Sequence) and not isinstance(tasks, str)
                                         for tasks in order):
        raise ParameterError("order", order, "must be one list of task texts per GPU (['0F0', '0B0', ...]), as "
                             "Schedule.order_text() gives them")
    graph = build_task_graph(params)
    if len(order) != params.num_gpus:
        lacking = f"; GPU {len(order)} and on are missing" if len(order) < params.num_gpus else \
            f"; GPU {params.num_gpus} and on are not there"
        raise ParameterError("order", f"{len(order)} GPUs", f"must list each of the {params.num_gpus} GPUs{lacking}")
    where = {str(Task(t.kind, t.gpu, t.stage, t.index, 0.0, parts=t.parts).id): i for i, t in enumerate(graph.tasks)
             if t.parts}
    result = []
    for gpu, (texts, own) in enumerate(zip(order, graph.orders)):
        tasks = [where.get(text.strip(), -1) for text in texts]
        wrong = next((text for text, i in zip(texts, tasks) if i not in own), None)
        if wrong is not None:
            pair = next((text for text in texts_of(graph, own) if text.startswith("(")
                         and wrong.strip() in text.strip("()").split(";")), None)
            if pair is not None:  # a dispatched run's order: its dispatcher ran the pair's halves apart
                raise ParameterError("order", wrong, f"runs within the pair {pair} under static {params.schedule}, "
                                     "which runs its pairs whole: an order that splits them (a dispatcher's) cannot "
                                     "be replayed")
            raise ParameterError("order", wrong, f"is no compute task of GPU {gpu} under {params.schedule}: "
                                 f"GPU {gpu} runs {len(own)} tasks, e.g. {', '.join(texts_of(graph, own[:3]))}")
        if len(set(tasks)) != len(tasks) or len(tasks) != len(own):
            missing = [i for i in own if i not in tasks]
            twice = next((text.strip() for k, text in enumerate(texts) if tasks[k] in tasks[:k]), None)
            raise ParameterError("order", f"GPU {gpu}", f"must list each of its {len(own)} tasks once"
                                 + (f"; it lacks {', '.join(texts_of(graph, missing[:3]))}" if missing else "")
                                 + (f"; {twice} appears twice" if twice else ""))
        step = next((i for i in own if graph.tasks[i].kind is TaskKind.OPTIMIZER_STEP), None)
        if step is not None and tasks[-1] != step:
            raise ParameterError("order", texts_of(graph, [step])[0], f"must end GPU {gpu}'s order: the optimizer "
                                 "step waits for every other task of its GPU (docs/model.md section 6.7)")
        result.append(tuple(tasks))
    return tuple(result)


def texts_of(graph: TaskGraph, tasks: Sequence[int]) -> list[str]:
    texts = task_texts(graph.params)
    return [texts[i] for i in tasks]


def memory_in_force(params: EnvParams, peak: float | None = None) -> float:
    """The memory limit a run keeps to (section 12.1): a static order's peak (``peak``: that of a given order
    instead of the schedule's), or a dispatcher's limit, in whole steps of 1/v when the stages are equal (with
    ``stage_weights`` rooms are no whole steps: the limit holds as given); ``ParameterError`` for a limit that
    cannot run the iteration."""
    if params.dispatch == "static" or params.memory_limit == 0.0:
        return static_peak(params) if peak is None else peak
    room = max(gpu_rooms(params)) / activation_units(params)
    if params.memory_limit < room:
        raise ParameterError("memory_limit", params.memory_limit,
                             f"a dispatcher needs room for one micro-batch's activations: {room:g} is the smallest "
                             f"limit that runs the iteration (or 0 for the static order's peak)")
    if params.dispatch == LOOKAHEAD and params.memory_limit < (peak := static_peak(params)):
        raise ParameterError("memory_limit", params.memory_limit,
                             f"the look-ahead continues the static order, which holds {peak:g} (its peak), in every "
                             f"copy it runs: a limit below it would foretell runs it cannot take; give at least "
                             f"{peak:g}, or 0 for it")
    if params.stage_weights:
        return params.memory_limit
    return math.floor(params.memory_limit * params.v + 1e-9) / params.v


def dispatch_arguments(params: EnvParams) -> tuple[np.ndarray, int, int]:
    """The kernel's dispatch arguments: each task's key (lowest first), the rule's number and the memory limit
    in units (the static order reads neither). ``critical-path`` keys a task by minus its expected remaining
    path to the end: the lengths without jitter, whose factors have mean 1, a straggler kept (section 12.1)."""
    return _dispatch_arguments(params, table_of(params))


@per_environment(256)
def _dispatch_arguments(params: EnvParams, table: LengthTable | None) -> tuple[np.ndarray, int, int]:
    """``dispatch_arguments`` of ``params`` and its table of lengths as read."""
    arrays = graph_arrays(params)
    if params.dispatch == "critical-path":
        lengths = task_lengths(replace(params, compute_jitter=0.0, comm_jitter=0.0))
        _, tail = kernel.path_times(lengths, arrays.needs_count, arrays.release_start, arrays.release_task)
        key = -(lengths + tail)
        key.flags.writeable = False
    else:
        key = _no_keys(len(arrays.gpu))
    if params.dispatch == "static":
        return key, DISPATCHERS.index("static"), 0
    if params.dispatch == HINDSIGHT:
        raise ParameterError("dispatch", params.dispatch, "a hindsight order is solved and replayed by "
                             "pipeline_sim.hindsight (simulate_hindsight, hindsight_figures), not compiled into the "
                             "kernel")
    if params.dispatch == LOOKAHEAD:
        raise ParameterError("dispatch", params.dispatch, "the look-ahead is played by pipeline_sim.lookahead "
                             "(simulate_lookahead, lookahead_figures), not compiled into the kernel's rules")
    if params.learned:
        raise ParameterError("dispatch", params.dispatch, "a learned policy is played by pipeline_sim.learned "
                             "(simulate_learned, figures), not compiled into the kernel")
    # a limit between two rooms counts as the lower; the tolerance keeps a limit that is a sum of rooms one
    return key, DISPATCHERS.index(params.dispatch), math.floor(memory_in_force(params) * activation_units(params)
                                                               + 1e-6)


@lru_cache(maxsize=64)
def _no_keys(tasks: int) -> np.ndarray:
    """The keys of rules that read none: zeros, made once per size."""
    key = np.zeros(tasks)
    key.flags.writeable = False
    return key


def in_unit(lengths: np.ndarray, unit: float) -> np.ndarray:
    """``lengths`` in the engine's time unit (``EnvParams.time_unit``, a power of two: the division is exact),
    read-only as the kernel is compiled for."""
    if unit == 1.0:
        return lengths
    scaled = lengths / unit
    scaled.setflags(write=False)
    return scaled


def lower_bound(params: EnvParams, sample: int = 0, lengths: np.ndarray | None = None) -> float:
    """What no dispatcher and no order can beat in the ``sample``-th draw of ``params`` (section 12.2), or on
    ``lengths``, every task's work given (``given_lengths``)."""
    arrays = graph_arrays(params)
    lengths = task_lengths(params, sample) if lengths is None else lengths
    return float(kernel.lower_bound(lengths, arrays.gpu, arrays.comm, arrays.kind_class,
                                    arrays.needs_count, arrays.release_start, arrays.release_task, params.num_gpus))


class _Jobs(NamedTuple):
    """Per micro-batch and stage (a job of section 12.2's memory term): its forward, its input-gradient task (B or
    I) and the task whose end gives its activations back (B or W); per task whether it belongs to one micro-batch's
    chain of forwards, backwards and pipeline transfers."""

    rise: np.ndarray
    back: np.ndarray
    fall: np.ndarray
    chain: np.ndarray


_CHAIN_KINDS = (TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT,
                TaskKind.FWD_PROP, TaskKind.GRAD_PROP)


@per_structure
def _memory_jobs(params: EnvParams) -> _Jobs:
    structure = graph_structure(params)
    kind = structure.kind
    rise = np.flatnonzero(kind == KIND_INDEX[TaskKind.FORWARD])
    if (kind == KIND_INDEX[TaskKind.OVERLAP_F_B]).any():  # a pair holds two micro-batches: no jobs then
        rise = rise[:0]
    _, whole, split_input, weight = (table[structure.stage[rise], structure.index[rise]]
                                     for table in structure.compute_task)
    back = np.where(split_input >= 0, split_input, whole)
    jobs = _Jobs(rise, back, np.where(weight >= 0, weight, back),
                 np.isin(kind, [KIND_INDEX[kind_of] for kind_of in _CHAIN_KINDS]))
    for array in jobs:
        array.flags.writeable = False
    return jobs


def memory_bound(params: EnvParams, sample: int = 0, limit: float | None = None) -> float:
    """What no order keeping within ``limit`` activations per GPU (section 7's unit; None: the limit in force,
    ``memory_in_force``) can beat in the ``sample``-th draw of ``params``: the larger of ``lower_bound`` and the
    memory term of section 12.2."""
    return bound_of_lengths(params, task_lengths(params, sample), limit)


def bound_of_lengths(params: EnvParams, lengths: np.ndarray, limit: float | None = None) -> float:
    """``memory_bound`` for tasks of ``lengths`` (of ``params``' task graph, in task order)."""
    arrays = graph_arrays(params)
    free = kernel.lower_bound(lengths, arrays.gpu, arrays.comm, arrays.kind_class, arrays.needs_count,
                              arrays.release_start, arrays.release_task, params.num_gpus)
    return max(free, _memory_term(params, lengths, _units_within(params, limit)))


def _units_within(params: EnvParams, limit: float | None) -> int:
    """``limit`` activations per GPU (None: the limit in force) in the units of ``activation_units``."""
    return math.floor((memory_in_force(params) if limit is None else limit) * activation_units(params) + 1e-6)


def _memory_term(params: EnvParams, lengths: np.ndarray, units: int) -> float:
    """The memory term of section 12.2 for tasks of ``lengths``, within ``units`` activation units per GPU."""
    arrays = graph_arrays(params)
    jobs = _memory_jobs(params)
    return float(kernel.memory_bound(lengths, arrays.needs_count, arrays.release_start, arrays.release_task,
                                     arrays.gpu, arrays.index, jobs.chain, jobs.rise, jobs.back, jobs.fall,
                                     arrays.rises[jobs.rise].astype(np.float64), units, params.num_gpus))


def bound_of_run(bound: float, completion: float, params: EnvParams) -> float:
    """The lower bound ``bound`` of a run of ``params`` that took ``completion``, as the run reports it: the kernel
    ends a task at an event when its projected end lies within ``END_TOLERANCE`` of that event's time
    (``kernel.state``), so each task of a run may end up to that much early, and a bound computed on the exact
    lengths may lie above the run by as much per task (a transfer of 0.01 beside forwards of 10^6). Within that
    tolerance the bound is the run's own time, so that a bound never exceeds its run; beyond it, a bound above its
    run is left as it is for the tests to see."""
    tasks = len(graph_arrays(params).gpu)
    slack = END_TOLERANCE * max(params.time_unit, completion) * tasks
    return completion if completion < bound <= completion + slack else bound


def given_lengths(params: EnvParams, lengths: Sequence[float]) -> np.ndarray:
    """``lengths``, every task's work in task order (a measured run's, say), as the kernel reads them;
    ``ParameterError`` naming ``lengths`` unless there is one finite, non-negative value per task of ``params``'
    graph."""
    count = len(graph_arrays(params).gpu)
    try:
        array = np.array(lengths, dtype=np.float64)
    except (TypeError, ValueError):
        raise ParameterError("lengths", lengths, f"must be one finite length >= 0 per task: {count} under "
                             f"{params.schedule} with n = {params.n} on {params.num_gpus} GPUs") from None
    if array.shape != (count,) or not np.all(np.isfinite(array)) or np.any(array < 0.0):
        raise ParameterError("lengths", f"{array.size} values", f"must be one finite length >= 0 per task: "
                             f"{count} under {params.schedule} with n = {params.n} on {params.num_gpus} GPUs")
    array.flags.writeable = False
    return array


def check_run(caller: str, params: object, policy: object, sample: object) -> None:
    """``TypeError`` or ``ParameterError`` for what a run's caller (``simulate``, ``simulate_lookahead``, ...) was
    given that is no environment, no policy or no draw's number."""
    for name, value, kind, example in (("params", params, EnvParams, "EnvParams(n=8, num_gpus=4)"),
                                       ("policy", policy, Policy, "Policy(priorities={'fwd_prop': 0.5})")):
        if not isinstance(value, kind):
            raise TypeError(f"{caller}: {name} must be {example} or another {kind.__name__}, not "
                            f"{type(value).__name__}")
    SAMPLES.check("sample", sample)


def simulate(params: EnvParams, policy: Policy, sample: int = 0,
             order: Sequence[Sequence[str]] | None = None, lengths: Sequence[float] | None = None) -> Schedule:
    """Simulate one iteration of ``params`` under ``policy``: the ``sample``-th draw of its noise, if any.

    ``order``, per GPU the text of its compute tasks (as ``Schedule.order_text`` gives them), runs instead of the
    schedule's own static order: a dispatcher's choices, say, replayed. ``lengths``, every task's work in task order
    (``given_lengths``; a measured run's, say), runs instead of the lengths ``params`` give them, with ``params``'
    noise and straggler on top (the keys of ``critical-path`` still read ``params``' own lengths: what the
    dispatcher expects, not what the tasks take; an environment of a table of lengths, ``params.lengths``, expects
    its table's).
    """
    check_run("simulate", params, policy, sample)
    arrays = graph_arrays(params)
    work = task_lengths(params, sample, None if lengths is None else given_lengths(params, lengths))
    tiers, priorities = policy_arrays((policy,))
    unit = params.time_unit
    arguments = list(arrays.kernel_arguments(in_unit(work, unit), params))
    memory = None
    orders = None if order is None else given_order(params, order)
    if orders is not None:
        order_task = np.array([i for tasks in orders for i in tasks], dtype=np.int64)
        order_task.flags.writeable = False  # as the graph's own: the kernel is compiled for read-only arrays
        arguments[11] = order_task
        memory = memory_in_force(params, order_peak(params, orders))
    room = 4 * len(work) + 64
    while True:
        status, F, I, segment_count, seg_task, seg_times, P, _, _ = kernel.simulate(
            *arguments, tiers[0], priorities[0], params.ingress_capacity, room, None, 0.0)
        if segment_count <= room:
            break
        room = segment_count  # the same run again, with room for every segment
    return schedule_of(params, policy, sample, status, F, I, P, seg_task, seg_times,
                       memory=memory_in_force(params) if memory is None else memory, orders=orders,
                       lengths=None if lengths is None else work)


def with_lengths(graph: TaskGraph, lengths: np.ndarray) -> TaskGraph:
    """``graph`` with every task's length ``lengths``' (in task order)."""
    return graph._replace(tasks=tuple(task._replace(length=length) for task, length in zip(graph.tasks,
                                                                                          lengths.tolist())))


def schedule_of(params: EnvParams, policy: Policy, sample: int, status: int, F: np.ndarray, I: np.ndarray,
                P: np.ndarray, seg_task: np.ndarray, seg_times: np.ndarray, *, memory: float,
                orders: Sequence[Sequence[int]] | None = None, lengths: np.ndarray | None = None) -> Schedule:
    """The kernel's final arrays of a run (in ``params.time_unit``; ``seg_task`` and ``seg_times`` every segment
    kept) as a ``Schedule``, its tasks' records made when first read; ``SimulationStuckError`` naming what waits if
    the run stuck. ``orders``: per GPU its compute tasks, when the run followed an order given rather than its
    schedule's; ``lengths``: the run's lengths, when given rather than ``params``' own (its lower bound is on
    them)."""
    unit = params.time_unit
    F = F.copy()
    seg_times = seg_times.copy()
    arrays = graph_arrays(params)
    for row in (kernel.READY, kernel.START, kernel.END, kernel.THROTTLED_TIME):
        F[:, row] *= unit
    seg_times[:2] *= unit  # each segment's t0 and t1; its rate has no unit
    if status == kernel.STUCK:
        graph = _graph(params, sample, lengths)
        if orders is not None:
            graph = graph._replace(orders=tuple(tuple(order) for order in orders))
        raise SimulationStuckError(_stuck_message(graph, F[:, kernel.READY].tolist(), F[:, kernel.END].tolist(),
                                                  P[kernel.NEXT].tolist(), P[kernel.BUSY].tolist()))
    structure = graph_structure(params)
    by_task = np.argsort(seg_task, kind="stable")  # each task's segments together, in the order they ran
    seg_task, seg_times = seg_task[by_task], seg_times[:, by_task]
    run = Run(arrays.gpu, structure.kind, structure.part_kind, structure.part_stage,
              task_lengths(params, sample) if lengths is None else lengths, F[:, kernel.READY], F[:, kernel.START],
              F[:, kernel.END], I[:, kernel.THROTTLED] == 1, F[:, kernel.THROTTLED_TIME], seg_task, seg_times)
    p = params.num_gpus
    figures = np.empty(3 + 3 * p)
    kernel.figures(arrays.gpu, arrays.comm, arrays.rises, arrays.falls, p, activation_units(params),
                   *figure_columns(F, I), figures)
    rank = I[:, kernel.RANK].tolist()
    given = orders is not None
    if orders is None:
        bounds, order_task = arrays.order_start.tolist(), arrays.order_task.tolist()
        orders = [order_task[a:b] for a, b in zip(bounds, bounds[1:])]
    end = float(F[:, kernel.END].max())
    return Schedule(params=params, policy=policy, tasks=RunTasks(run, partial(_records, params, sample, lengths, run)),
                    completion_time=end, spans=tuple(figures[3 + p:3 + 2 * p].tolist()),
                    peak_activations=tuple(figures[3 + 2 * p:].tolist()),
                    lower_bound=bound_of_run(lower_bound(params, sample, lengths), end, params),
                    memory_limit=memory, orders=tuple(tuple(sorted(order, key=rank.__getitem__)) for order in orders),
                    given_order=given, sample=sample)


def _graph(params: EnvParams, sample: int, lengths: np.ndarray | None) -> TaskGraph:
    """The records of ``params``' graph in draw ``sample``, its tasks of ``lengths`` when given."""
    graph = build_task_graph(params, sample)
    return graph if lengths is None else with_lengths(graph, lengths)


def _records(params: EnvParams, sample: int, lengths: np.ndarray | None, run: Run) -> list[Task]:
    """Every task of ``run`` (of ``params``' draw ``sample``, of ``lengths`` when given) as a record."""
    graph = _graph(params, sample, lengths)
    segments: list[list[tuple[float, float, float]]] = [[] for _ in graph.tasks]
    for i, t0, t1, rate in zip(run.seg_task.tolist(), *run.seg_times.tolist()):
        segments[i].append((t0, t1, rate))
    return [Task(spec.kind, spec.gpu, spec.stage, spec.index, spec.length, spec.receiver, spec.parts, r, s, e, flag,
                 wait, stretch)
            for spec, r, s, e, flag, wait, stretch in zip(graph.tasks, run.ready.tolist(), run.start.tolist(),
                                                         run.end.tolist(), run.throttled.tolist(),
                                                         run.throttled_time.tolist(), segments)]


def figure_columns(F: np.ndarray, I: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every task's start, end, whether it was throttled and for how long, from the kernel's state (one row per task),
    each a contiguous array, as ``kernel.figures`` takes them."""
    return (np.ascontiguousarray(F[:, kernel.START]), np.ascontiguousarray(F[:, kernel.END]),
            np.ascontiguousarray(I[:, kernel.THROTTLED]), np.ascontiguousarray(F[:, kernel.THROTTLED_TIME]))


#: Simulations of this many tasks or more, whose state outgrows the caches (``kernel.jit.PREFETCH_TASKS``), take it
#: from one room kept for the next (``simulate_figures``): a large environment's state is then faulted in once, not
#: on every simulation (from 32 MiB, about 57,000 tasks, the C library maps a block anew each time: about a fifth of
#: a million-task run). The process holds that room until it ends: 560 to 660 bytes per task of the largest
#: environment simulated, of which about 360 are ever written and so in memory (the allocation's scratch, room for
#: the most flows an event could couple, is written only as far as an event's flows reach). Smaller simulations each
#: make their own, in one block that the C library reuses for the next.
ROOM_KEPT_TASKS = 32_768
#: The room kept: the largest a simulation of ``ROOM_KEPT_TASKS`` or more used so far, and the most tasks it was
#: used for; and no room.
_kept_room = _NO_ROOM = np.empty(0, dtype=np.int64)
_kept_tasks = 0


def simulate_figures(params: EnvParams, policies: Sequence[Policy], sample: int = 0,
                     orders: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """The figures of ``kernel.figures`` for every policy of ``policies`` in draw ``sample``, one row each;
    ``orders``, per GPU its compute tasks (indices into the task graph, as ``given_order`` reads them), run instead
    of the schedule's static order."""
    arrays = graph_arrays(params)
    tiers, priorities = policy_arrays(tuple(policies))
    unit = params.time_unit
    arguments = list(arrays.kernel_arguments(in_unit(task_lengths(params, sample), unit), params))
    if orders is not None:
        arguments[11] = _rows(orders)[1]
    global _kept_room, _kept_tasks
    tasks = len(arrays.gpu)
    if tasks > _kept_tasks:
        _kept_room = _NO_ROOM  # freed before the kernel makes a larger one
    out, room = kernel.simulate_policies(*arguments, arrays.rises, activation_units(params), tiers, priorities,
                                         params.ingress_capacity, _kept_room)
    if tasks >= ROOM_KEPT_TASKS:
        _kept_room, _kept_tasks = room, max(tasks, _kept_tasks)
    p = params.num_gpus
    out[:, :2] *= unit  # the times among the figures: completion, throttled time, each GPU's busy time and span
    out[:, 3:3 + 2 * p] *= unit
    stuck = np.isnan(out[:, 0])
    if stuck.any():
        simulate(params, policies[int(np.argmax(stuck))], sample)  # raises, naming what waits
    return out


#: What a run calls in the kernel, compiled before its work (``compile_kernel``): ``figures``, many policies'
#: figures in one call (a sweep, the planner, a chart's ideal time); ``records``, one simulation's every task and
#: its lower bounds (a chart, the API, a sweep of dispatchers). Each part is compiled when a run first needs it.
KERNEL_PARTS = ("figures", "records")


def _kernel_stamp() -> str:
    """What numba's cached kernel depends on: its sources (by content, so that a checkout's or a copy's new file
    times keep it), numba, Python and the CPU."""
    sources = hashlib.sha256(b"".join(path.name.encode() + path.read_bytes()
                                      for path in sorted(Path(kernel.__file__).parent.glob("*.py"))))
    return " ".join(map(str, (sources.hexdigest(), numba.__version__, sys.version_info[:2],
                              llvmlite.binding.get_host_cpu_name())))


def _stamp_path() -> Path:
    return compile_cache.cache_folder(kernel) / "pipeline_sim_kernel.stamp"


def _compiled_parts() -> set[str] | None:
    """The parts of ``KERNEL_PARTS`` compiled for the kernel as it is, or None when its cache is of another kernel
    (or none)."""
    try:
        stamp, *parts = _stamp_path().read_text().split("\n")
    except OSError:
        return None
    return set(parts) if stamp == _kernel_stamp() else None


def kernel_is_compiled(parts: Sequence[str] = KERNEL_PARTS) -> bool:
    """Whether this installation has compiled ``parts`` of the kernel before: using them then loads them in a
    second.

    Numba caches the machine code beside the package, or in a user directory when the
    package is read-only; a stamp there records each completed compile.
    """
    if getattr(numba.config, "DISABLE_JIT"):
        return True
    done = _compiled_parts()
    return done is not None and set(parts) <= done


def compile_kernel(parts: Sequence[str] = KERNEL_PARTS) -> None:
    """Compile the kernel's entry points of ``parts`` (``KERNEL_PARTS``), or load them from the cache (worker
    processes forked later share them); about ``COMPILE_SECONDS`` the first time on an installation.

    numba checks a cached function against its own file only, not against the files of the functions it
    calls; so when any file of the kernel changed, every cached function of the kernel is dropped first.
    """
    jit = not getattr(numba.config, "DISABLE_JIT")
    done = _compiled_parts() if jit else set()
    if done is None:
        done = set()
        folder = compile_cache.cache_folder(kernel)
        for cached in [*folder.glob("*.nbi"), *folder.glob("*.nbc")]:
            try:
                cached.unlink()
            except OSError:
                pass  # another process's, or not ours to remove: numba then compiles in memory
    if jit and not set(parts) <= done:
        compile_shared(partial(_kernel_shares, tuple(parts)))
    params = EnvParams(n=2, num_gpus=2)
    if "figures" in parts:
        simulate_figures(params, [Policy()])
        _draw_once()  # loaded here, before a sweep's workers are forked, rather than by each of them
    if "records" in parts:
        simulate(params, Policy())
        memory_bound(params)
    if jit and not set(parts) <= done:
        _write_stamp(done | set(parts))


#: How long a compile waits for the process compiling beside it before compiling what that one has not written.
BESIDE_SECONDS = 60


def compile_shared(shares: Callable[[Path, Callable[[], bool]], None]) -> None:
    """Compile ``shares`` here and, at once, in a second process on the machine's other core, into the same cache:
    ``shares(claims, other_alive)`` compiles each function that the other process has not claimed in the folder
    ``claims`` (``claim_shares``), so that the two share the work, and this process then loads from the cache
    what the other wrote. A second process that fails, or that cannot start, only makes the compile take as long as
    it would alone. ``shares`` is a module's function (or a ``partial`` of one), so that a spawned process can run
    it too."""
    claims = Path(tempfile.mkdtemp(prefix="pipeline-sim-compile-"))
    beside = _compile_beside(shares, claims)
    try:
        shares(claims, beside.is_alive if beside is not None else lambda: False)
        if beside is not None:
            beside.join(BESIDE_SECONDS)  # until what it claimed is written
    finally:
        if beside is not None and beside.is_alive():
            beside.kill()
            beside.join()
        shutil.rmtree(claims, ignore_errors=True)


def _compile_beside(shares: Callable[[Path, Callable[[], bool]], None],
                    claims: Path) -> multiprocessing.process.BaseProcess | None:
    """The process of ``compile_shared``: forked where the platform forks, so that it starts at once, with this
    process's imports. None when none started."""
    from .parallel import process_context

    context: Any = process_context()  # a fork or a spawn context: both make a Process
    beside = context.Process(target=_compile_aside, args=(shares, str(claims), os.getpid()), daemon=True)
    try:
        beside.start()
    except OSError:
        return None
    return beside


def _compile_aside(shares: Callable[[Path, Callable[[], bool]], None], claims: str, parent: int) -> None:
    """What ``_compile_beside`` runs: ``shares`` while its parent, the run, lives; silent (the run says what it
    does)."""
    sys.stdout = sys.stderr = open(os.devnull, "w")
    shares(Path(claims), lambda: os.getppid() == parent)


class Share(NamedTuple):
    """A function of a first compile, as ``claim_shares`` takes it: its name, a call that compiles it (or loads it
    from the cache), and the names of the shares it calls, which must be written before it starts."""

    name: str
    compile: Callable[[], object]
    needs: tuple[str, ...] = ()


def claim_shares(claims: Path, shares: Sequence[Share], other_alive: Callable[[], bool]) -> None:
    """Compile each of ``shares`` that the other process compiling beside has not claimed, in their order, each
    once all it ``needs`` is written: a process claims a share by creating its file in ``claims``, and says it is
    written with a second file, so that the two compile each share once, whichever is the faster; what two shares
    call in common (``set_rate``, say) the second loads from the cache once the first has written it. With nothing
    ready to claim, a process waits for the other's; when ``other_alive`` says the other has ended, or after
    ``BESIDE_SECONDS`` with nothing claimed, it claims the rest without waiting (what it does not find written, it
    compiles). A function that a share calls at its address (``jit.at_address``) and that the other process is
    compiling, the share waits for as it is compiled (``jit.awaiting``), so that the two compile at once."""
    def written(name: str) -> bool:
        return (claims / f"{name}.written").exists()

    mine: set[str] = set()

    def wait_for(name: str) -> None:  # a function the other process compiles, which a caller here is to call
        deadline = time.monotonic() + BESIDE_SECONDS
        while name not in mine and (claims / name).exists() and not written(name) and other_alive() and \
                time.monotonic() < deadline:
            time.sleep(0.02)

    pending = list(shares)
    deadline = time.monotonic() + BESIDE_SECONDS
    jit.awaiting = wait_for
    try:
        while pending:
            waiting = other_alive() and time.monotonic() < deadline
            share = next((share for share in pending if not waiting or all(map(written, share.needs))), None)
            if share is None:
                time.sleep(0.02)
                continue
            pending.remove(share)
            deadline = time.monotonic() + BESIDE_SECONDS  # for the next share: the whole compile may take longer
            try:
                os.close(os.open(claims / share.name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue  # the other process's
            except OSError:
                pass  # no claims folder to share (removed): compiled here
            mine.add(share.name)
            share.compile()
            try:
                (claims / f"{share.name}.written").touch()
            except OSError:
                pass
    finally:
        jit.awaiting = jit.no_wait


def _kernel_shares(parts: Sequence[str], claims: Path, other_alive: Callable[[], bool]) -> None:
    """The shares of ``compile_kernel``: the callees of the loop and of the entry points (``loop.SHARED_COMPILE``;
    the lower bounds for ``records``), the loop ``advance`` once all it calls is written, and the entry points that
    call it, at the same time: ``simulate_policies`` for ``figures``, ``simulate`` for ``records``."""
    params = EnvParams(n=2, num_gpus=2)
    with compile_cache.plain_builds():  # this graph's builders are shares
        arrays = graph_arrays(params)
    named = _run_arguments(params)
    figures = partial(kernel.figures, arrays.gpu, arrays.comm, arrays.rises, arrays.falls, params.num_gpus,
                      activation_units(params), *figure_columns(named["F"], named["I"]),
                      np.empty(3 + 3 * params.num_gpus))
    callees = [Share(function.py_func.__name__, figures if function is kernel.figures else
                     partial(_compile_loop_function, function, named)) for function in loop.SHARED_COMPILE]
    if "records" in parts:
        lengths = task_lengths(params)
        # the memory term, the longest, first; the lower bound once the function both call is likely written
        callees.insert(0, Share("memory_bound", partial(_memory_term, params, lengths, _units_within(params, None))))
        callees.insert(len(callees) // 2, Share("lower_bound", partial(lower_bound, params)))
    callees.insert(1, Share("uniforms", _draw_once))  # the noise draw's, which a run with jitter asks for first
    # the builders of a graph's arrays, the structure's the longest, each calling the others' plain Python
    callees.insert(0, Share("build_structure", partial(_built_with, ("schedule_parts",), _structure_of,
                                                       replace(params, n=3))))
    callees.insert(2, Share("schedule_parts", partial(order_parts, params)))
    callees.insert(3, Share("graph_work", partial(_built_with, ("schedule_parts", "build_structure"),
                                                  _work_of.__wrapped__, replace(params, n=4), None)))
    # the loop calls all of them but these (``begin``'s share compiles the loop's ``_settle``)
    outside = ("build_structure", "schedule_parts", "graph_work", "memory_bound", "lower_bound", "prepare", "figures",
               "uniforms")
    loop_callees = tuple(share.name for share in callees if share.name not in outside)
    callees.append(Share("advance", partial(_compile_loop_function, loop.advance, named), loop_callees))
    entries = []
    called = ("begin", "prepare", "figures")  # and the loop, which it waits for as it is compiled (``jit.awaiting``)
    if "figures" in parts:
        entries.append(Share("simulate_policies", partial(simulate_figures, params, [Policy()]), called))
    if "records" in parts:
        entries.append(Share("simulate", partial(simulate, params, Policy()), called))
    claim_shares(claims, callees + entries, other_alive)


def _built_with(plain: tuple[str, ...], function: Callable[..., object], *arguments: object) -> None:
    """``function(*arguments)``, graphs built by the plain Python of the builders ``plain``: their compiles are
    shares of their own."""
    with compile_cache.plain_builds(*plain):
        function(*arguments)


def _draw_once() -> None:
    """A noise draw: its compiled steps compiled, or loaded from the cache."""
    standard_normals(0, 0, np.zeros((1, 3), dtype=np.int64))


def _run_arguments(params: EnvParams) -> dict[str, Any]:
    """A compiled run's arguments by the names ``simulate``, ``advance`` and the loop's functions give them: the
    graph's arrays, the policy's, and the state at time 0 as ``prepare`` makes it, run as plain Python (no
    compile)."""
    tiers, priorities = policy_arrays((Policy(),))
    arguments = graph_arrays(params).kernel_arguments(in_unit(task_lengths(params), 1.0), params)
    named = dict(zip(_parameters(kernel.simulate), (*arguments, tiers[0], priorities[0], params.ingress_capacity, 0)),
                 num_gpus=params.num_gpus, room=np.empty(0, dtype=np.int64))
    state = kernel.prepare.py_func(*(named[name] for name in _parameters(kernel.prepare)))
    names = list(_parameters(loop.advance))
    named.update(zip(names[names.index("F"):names.index("ending") + 1], state))
    return named


def _compile_loop_function(function: Any, named: dict[str, Any]) -> None:
    """Compile one of the loop's functions (or load it from the cache) for the types the compiled run passes it,
    its arguments named as ``simulate`` and ``advance`` name them (``_run_arguments``)."""
    scalars = {"int": numba.types.int64, "float": numba.types.float64, "bool": numba.types.boolean}
    function.compile(tuple(numba.typeof(named[name]) if name in named else scalars[annotation]
                           for name, annotation in _parameters(function).items()))


def _parameters(function: Any) -> dict[str, str]:
    """A compiled function's parameters and their annotations, by name, in order."""
    return {name: str(parameter.annotation) for name, parameter in
            inspect.signature(function.py_func).parameters.items()}


def mark_compiled(parts: Sequence[str]) -> None:
    """Record that ``parts`` beyond ``KERNEL_PARTS`` (the episodes' entry points, compiled by their own module) are
    compiled for the kernel as it is, so that ``kernel_is_compiled`` knows them next time."""
    done = _compiled_parts()
    if done is not None and not getattr(numba.config, "DISABLE_JIT") and not set(parts) <= done:
        _write_stamp(done | set(parts))


def _write_stamp(parts: set[str]) -> None:
    try:
        _stamp_path().write_text("\n".join([_kernel_stamp(), *sorted(parts)]))
    except OSError:
        pass  # a cache nobody may write to: numba compiles in memory, and so will the next run


def _stuck_message(graph: TaskGraph, ready: list[float], end: list[float], next_compute: list[int],
                   busy: list[int]) -> str:
    tasks = graph.tasks
    ident = lambda i: Task(tasks[i].kind, tasks[i].gpu, tasks[i].stage, tasks[i].index, 0.0,  # noqa: E731
                           parts=tasks[i].parts).id
    waiting = []
    for s, order in enumerate(graph.orders):
        if busy[s] < 0 and next_compute[s] < len(order):
            node = order[next_compute[s]]
            unmet = [str(ident(i)) for i in graph.needs[node] if math.isnan(end[i])]
            more = f" and {len(unmet) - 3} more" if len(unmet) > 3 else ""
            waiting.append(f"{ident(node)} waits for {', '.join(unmet[:3]) + more or 'its predecessor'}")
        waiting.extend(f"{ident(i)} is ready but gets no bandwidth" for i, task in enumerate(tasks)
                       if task.gpu == s and not task.kind.is_compute and not math.isnan(ready[i])
                       and math.isnan(end[i]))
    return "simulation stuck, nothing can progress: " + "; ".join(waiting or ["no task is ready"])


def calculate_full_pipeline_schedule(
        *, n: int = 8, num_gpus: int = 4, sync_freq: int = 1, fwd_len: float = 1.0, bwd_len: float = 2.0,
        prop_len: float = 1.0, sync_base_len: float = 2.0, fwd_impact: float = 0.2, bwd_impact: float = 0.2,
        ingress_capacity: float = 1.0, schedule: str = "1f1b", chunks: int = 2, w_fraction: float = 0.5,
        fb_overlap: float = 0.0, stage_weights: Sequence[float] = (), sync_weights: Sequence[float] = (),
        bwd_weights: Sequence[float] = (), optimizer_len: float = 0.0, zero: int = 0, gather_len: float = 0.0,
        cp_len: float = 0.0, a2a_len: float = 0.0, a2a_weights: Sequence[float] = (), a2a_class: str = "pipeline",
        ep_overlap: int = 0, dispatch: str = "static",
        memory_limit: float = 0.0, compute_jitter: float = 0.0, comm_jitter: float = 0.0,
        jitter_dist: str = "lognormal", slow_gpu: int = -1, slow_factor: float = 1.0, seed: int = 0, lengths: str = "",
        sample: int = 0,
        priorities: Mapping[str, float] | None = None, exclusive_tiers: Mapping[str, str] | None = None,
        allow_large: bool = False) -> Schedule:
    """Simulate one training iteration and return every task's timeline (docs/model.md describes the model).

    Times are abstract units; rates are fractions of full speed or of one link.
    ``schedule`` is one of ``gpipe``, ``1f1b``, ``interleaved-1f1b`` (``chunks`` model
    chunks per GPU), ``zb-h1``, ``zb-v``, ``dualpipe-v``; ``w_fraction`` is the share of a
    split backward that computes weight gradients, ``fb_overlap`` the work an overlapped
    forward/backward pair saves. ``stage_weights``, one factor per stage (v x ``num_gpus``
    of them, chunks included; empty: all 1), multiplies each stage's forward, backward and
    weight work and its activations (docs/model.md section 6.6); ``sync_weights`` each stage's ``grad_sync`` and
    ``bwd_weights`` its backward alone, the same way; ``optimizer_len`` (0: none) is the work of each GPU's
    optimizer step after its last ``grad_sync`` (section 6.7). ``zero`` (1 to 3) shards data parallelism with
    all-gathers of ``gather_len`` work; ``cp_len`` (0: none) is the attention exchange of context parallelism
    (section 15). ``a2a_len`` (0: none) is the all-to-all of expert parallelism, ``a2a_weights`` each stage's share
    of it and ``a2a_class`` whose priority it takes (``pipeline`` or ``grad_sync``); ``ep_overlap`` 1 runs
    each whole backward beside the forward right after it in its GPU's order, as one pair, so that their
    all-to-alls overlap (section 16). ``priorities``
    maps a transfer kind (``fwd_prop``,
    ``grad_prop``, ``grad_sync``) to a shared priority, 0 or from 1e-6 to 1 (missing kinds get 1.0);
    ``exclusive_tiers`` maps a kind to a tier letter, ``'a'`` highest, which overrides its
    shared priority. ``compute_jitter`` and ``comm_jitter`` are the coefficients of
    variation of compute and transfer work (``jitter_dist`` ``lognormal`` or ``normal``);
    ``slow_gpu`` (-1: none) computes ``slow_factor`` times slower; the result is draw
    number ``sample`` of the random stream ``seed``. ``lengths`` (empty: none) names a JSON table of every task's
    work (``tables.read_table``: a measured iteration's, say), which replaces the work parameters, noise on top.
    ``dispatch`` (``static``, ``greedy``, ``critical-path``, ``zb-adaptive``) chooses each free GPU's next task
    at run time within ``memory_limit`` activations per GPU (0: the static order's busiest peak); the
    result's ``lower_bound`` is what no order of its tasks could beat on this run's lengths.
    Invalid arguments raise ``ValueError`` naming the argument, its value and what is
    allowed; so does an environment of more tasks than fit in memory, as the command line
    refuses it, unless ``allow_large``. ``metrics.schedule_metrics`` gives its summary
    figures (spans, bubbles, peak activations per GPU).
    """
    arguments = locals()  # the signature spells out EnvParams' fields for readers; tests hold it to the table
    params = EnvParams(**{name: arguments[name] for name in EnvParams.names()})
    SAMPLES.check("sample", sample)
    if not allow_large:
        check_size(params, " (allow_large=True to try anyway)")
    policy = Policy(priorities={} if priorities is None else priorities,
                    exclusive_tiers={} if exclusive_tiers is None else exclusive_tiers)
    return simulate(params, policy, int(sample))
