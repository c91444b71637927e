"""The task graph of one environment (docs/model.md sections 2 and 6.2-6.3), built once and read everywhere.

Per GPU its ordered compute tasks; per task its work, the GPU doing it and, for a
transfer, the GPU receiving it; what each task waits for (``needs``) and what its end
releases (``releases``). The engine runs it, the validator checks a result against
it, the plots and metrics read it; none of them knows which schedule produced it.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from functools import lru_cache, wraps
from itertools import accumulate
from typing import Callable, Iterator, Mapping, NamedTuple, TypeVar

import numpy as np

from .model import (
    A2A_KINDS,
    KIND_INDEX,
    KINDS,
    TRANSFER_KINDS,
    Action,
    EnvParams,
    ParameterError,
    TaskKind,
    sync_points,
)
from .noise import KIND_NUMBERS, standard_normals, work_factors
from .orders import order_parts
from .schedules import get_schedule
from .tables import LengthTable, read_table

_F, _B, _I, _W = TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT
_O = TaskKind.OPTIMIZER_STEP
#: Transfers issued when a compute task starts, or at time 0 (docs/model.md section 15): the prefetched gathers of
#: zero 3 and the attention exchanges of context parallelism.
ISSUED_KINDS = (TaskKind.FWD_GATHER, TaskKind.BWD_GATHER, TaskKind.KV_EXCHANGE, TaskKind.KV_GRAD_EXCHANGE)


class GraphTask(NamedTuple):
    """One task before it runs. ``impact`` scales the compute slowdown by ``grad_sync`` traffic (section 3.3)."""

    kind: TaskKind
    gpu: int
    stage: int
    index: int  # type: ignore[assignment]  # the micro-batch or sync ordinal, as in Task; shadows tuple.index
    length: float
    receiver: int | None = None
    parts: tuple[Action, ...] = ()
    impact: float = 0.0


class TaskGraph(NamedTuple):
    """Every task of an iteration and how they depend on each other.

    ``orders[g]`` lists GPU ``g``'s compute tasks (indices into ``tasks``) in the order
    it runs them. ``needs[i]`` are the tasks whose end task ``i`` waits for (a transfer:
    the one compute task that sends it); ``releases[i]`` the tasks whose wait ends with
    task ``i``, transfers first. ``peers[g]`` are the GPUs that ``g`` exchanges transfers
    with; ``stage_gpu[s]`` is where stage ``s`` lives and ``stage_chunk[s]`` which of its
    GPU's chunks it is (0 for the first). ``issued_by`` maps each transfer that a compute task's start issues
    (section 15) to that task, or to -1 when it is issued at time 0; such a transfer has no ``needs``. ``holds`` are
    the transfers that hold their GPU's compute until they end (the all-to-alls a task's end issues, section 16).
    """

    params: EnvParams
    tasks: tuple[GraphTask, ...]
    needs: tuple[tuple[int, ...], ...]
    releases: tuple[tuple[int, ...], ...]
    orders: tuple[tuple[int, ...], ...]
    peers: tuple[tuple[int, ...], ...]
    stage_gpu: tuple[int, ...]
    stage_chunk: tuple[int, ...]
    issued_by: dict[int, int]
    holds: frozenset[int] = frozenset()


class ScheduleError(ValueError):
    """A schedule's orders that do not describe one runnable iteration (a defect in its builder)."""


#: The most tasks one simulation may have: beyond it memory runs to gigabytes (about 1 kB a task).
MAX_TASKS = 1_000_000


def estimated_tasks(params: EnvParams) -> int:
    """An upper bound on the tasks of ``params``' graph, computed without building it.

    Per micro-batch and stage: a forward, a backward (or its I and W halves) and the two
    pipeline transfers; plus the gradient syncs, the optimizer steps and the traffic of section 15.
    """
    stages = params.num_gpus * params.v
    syncs = stages * (params.n // params.sync_freq + 1)
    per_microbatch = 5 + (2 if params.zero == 3 and params.gather_len > 0 else 0) + (2 if params.cp_len > 0 else 0) \
        + (2 if params.a2a_len > 0 else 0)
    per_gpu = (params.optimizer_len > 0) + (params.zero in (1, 2) and params.gather_len > 0)
    return params.n * stages * per_microbatch + syncs + params.num_gpus * per_gpu


def check_size(params: EnvParams, hint: str = "") -> None:
    """Refuse (``ParameterError`` naming ``n``) an environment whose graph would not fit in memory (more than
    ``MAX_TASKS`` tasks), before anything is built; ``hint`` says how to try anyway."""
    tasks = estimated_tasks(params)
    if tasks > MAX_TASKS:
        raise ParameterError("n", params.n, f"on {params.num_gpus} GPUs gives about {tasks:,} tasks; at most "
                                            f"{MAX_TASKS:,} fit in memory{hint}")


def build_task_graph(params: EnvParams, sample: int = 0) -> TaskGraph:
    """The task graph of ``params``, with the work of its ``sample``-th noise draw (section 8).

    Its records are for readers of single tasks (the validator, charts, ``engine.schedule_of``), made from
    ``graph_structure``'s arrays when first asked for; a simulation reads those arrays, ``task_lengths`` and
    ``task_impacts``, which make none.
    """
    graph = _build(params)
    if not params.jittered and params.slow_gpu < 0:
        return graph
    lengths = task_lengths(params, sample).tolist()
    with collector_paused():
        return graph._replace(tasks=tuple(task._replace(length=length) for task, length in zip(graph.tasks, lengths)))


def task_lengths(params: EnvParams, sample: int = 0, work: np.ndarray | None = None) -> np.ndarray:
    """Every task's work in the ``sample``-th noise draw of ``params`` (section 8), in task order; ``work``, every
    task's noise-free work given (a table of lengths), instead of the parameters'.

    A task's factor is its own draw (a pair: the mean of its parts'), the straggler's on top.
    """
    lengths = _work(params)[0] if work is None else work
    if not params.jittered and params.slow_gpu < 0:
        return lengths
    rows, owners, compute, computes, gpus = _draws(params)
    z = standard_normals(params.seed, sample if params.jittered else 0, rows)
    factors = np.where(compute, work_factors(z, params.compute_jitter, params.jitter_dist),
                       work_factors(z, params.comm_jitter, params.jitter_dist))
    count = len(computes)
    per_task = np.bincount(owners, weights=factors, minlength=count) / np.bincount(owners, minlength=count)
    slow = computes & (gpus == params.slow_gpu)
    lengths = lengths * (per_task * np.where(slow, params.slow_factor, 1.0))
    lengths.flags.writeable = False  # as the noise-free lengths: the kernel is compiled for one array type
    return lengths


def task_impacts(params: EnvParams) -> np.ndarray:
    """Every task's compute impact (section 3.3), in task order: a transfer's is 0."""
    return _work(params)[1]


#: The blocks of ``_work``'s table of lengths, in order: one row per stage of each kind here (a zero 3 gather before a
#: backward is as long as the one before a forward), one row per GPU of each of ``_PER_GPU``, and the pipeline
#: transfers' one row.
_PER_STAGE = (_F, _B, _I, _W, TaskKind.GRAD_SYNC, TaskKind.FWD_GATHER, TaskKind.KV_EXCHANGE, TaskKind.KV_GRAD_EXCHANGE,
              TaskKind.A2A)
_PER_GPU = (_O, TaskKind.PARAM_GATHER)
_SAME_ROWS = {TaskKind.BWD_GATHER: TaskKind.FWD_GATHER, TaskKind.A2A_GRAD: TaskKind.A2A}


class _WorkIndex(NamedTuple):
    """Where each task of a structure finds its work in ``_work``'s table: ``row``; its impact, 0 (none), 1 (a
    forward's) or 2 (a backward's); and its overlapped pairs, which mix a forward's work with a backward's."""

    row: np.ndarray
    impact: np.ndarray
    pairs: np.ndarray
    pair_forward: np.ndarray  # the stage of each pair's forward
    pair_backward: np.ndarray  # and of its backward


def table_of(params: EnvParams) -> LengthTable | None:
    """The table of lengths ``params`` names, as now read (``tables.read_table``), or None: what is computed from a
    table is kept per ``(params, table_of(params))``."""
    return read_table(params.lengths) if params.lengths else None


def _work(params: EnvParams) -> tuple[np.ndarray, np.ndarray]:
    return _work_of(params, table_of(params))


@lru_cache(maxsize=256)
def _work_of(params: EnvParams, measured: LengthTable | None) -> tuple[np.ndarray, np.ndarray]:
    """Every task's noise-free work and its impact, read-only: each from a table of a few rows per stage and GPU
    (every task's work from the table of lengths ``measured`` when there is one).

    Each element is computed by the same float operations in the same order as the section it follows, so that a
    length is the same to the bit however the graph is simulated: e.g. a forward's is ``fwd_len * weight / v``.
    """
    index = _work_index(params)
    stages, v = params.num_gpus * params.v, params.v
    weights = np.array(params.stage_weights or (1.0,) * stages)
    syncs = np.array(params.sync_weights or (1.0,) * stages)
    forwards = params.fwd_len * weights / v  # section 6.6: a weight of 1 leaves fwd_len / v to the bit
    backwards = params.bwd_len * weights * np.array(params.bwd_weights or (1.0,) * stages) / v
    exchanges = params.cp_len / v * weights
    table = np.concatenate([forwards, backwards, backwards * (1.0 - params.w_fraction), backwards * params.w_fraction,
                            params.sync_base_len / v * syncs, params.gather_len / v * syncs, exchanges,
                            2.0 * exchanges,  # the keys' and values' gradients travel back with them
                            params.a2a_len / v * np.array(params.a2a_weights or (1.0,) * stages),
                            params.step_lengths(), params.gather_lengths(), (params.prop_len,)])
    lengths = table[index.row]
    impact = np.array((0.0, params.fwd_impact, params.bwd_impact))[index.impact]
    if len(index.pairs):
        forward, backward = forwards[index.pair_forward], backwards[index.pair_backward]
        impact[index.pairs] = (forward * params.fwd_impact + backward * params.bwd_impact) / (forward + backward)
        lengths[index.pairs] = (forward + backward) * (1.0 - params.fb_overlap)
    if measured is not None:  # a table gives every task's work; the parameters' still weigh a pair's impact
        lengths = np.array(lengths_of_table(params, measured.lengths, params.lengths))
    lengths.flags.writeable = impact.flags.writeable = False
    return lengths, impact


def structure_key(params: EnvParams) -> tuple:
    """What a graph's structure depends on: the schedule, p, v, n, the sync frequency, whether pairs are split,
    whether the GPUs step an optimizer, which gathers, exchanges and all-to-alls there are, the all-to-all's class
    (which the transfers' priority classes read) and whether its pairs overlap. Environments of one key differ
    only in their tasks' work and impact (layouts of one schedule, p, v and n share one: the planner's do)."""
    return (params.schedule, params.num_gpus, params.v, params.n, params.sync_freq, params.dispatch != "static",
            params.optimizer_len > 0, params.zero if params.gather_len > 0 else 0, params.cp_len > 0,
            (params.a2a_class, params.ep_overlap) if params.a2a_len > 0 else ())


_T = TypeVar("_T")
#: Structures kept per function of ``per_structure``: the least recently used goes beyond it.
STRUCTURES_KEPT = 64


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused: what a graph holds is up to millions of small objects and no cycle, and
    the collector, run again and again while they are made, would spend most of the time scanning what the caches
    hold."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def per_structure(function: Callable[[EnvParams], _T]) -> Callable[[EnvParams], _T]:
    """``function``, computed once per structure (``structure_key``) of the ``STRUCTURES_KEPT`` used last."""
    kept: dict[tuple, _T] = {}

    @wraps(function)
    def cached(params: EnvParams) -> _T:
        key = structure_key(params)
        if key in kept:
            value = kept.pop(key)
        else:
            with collector_paused():
                value = function(params)
            if len(kept) >= STRUCTURES_KEPT:
                del kept[next(iter(kept))]  # the least recently used
        kept[key] = value
        return value
    return cached


def _row_form(kind: TaskKind) -> tuple[int, int, int]:
    """Where ``_work``'s table holds the work of a task of ``kind``: its block's first row, in stages and GPUs
    (the block starts at ``stages * a + gpus * b``), and what numbers its row within the block: 0 nothing (a
    transfer's row, the last, and a pair's too: its work is computed apart), 1 its stage, 2 its GPU."""
    kind = _SAME_ROWS.get(kind, kind)
    if kind in _PER_STAGE:
        return _PER_STAGE.index(kind), 0, 1
    if kind in _PER_GPU:
        return len(_PER_STAGE), _PER_GPU.index(kind), 2
    return len(_PER_STAGE), len(_PER_GPU), 0


#: Per kind number, ``_row_form``'s three numbers; and its impact: 0 (none), 1 (a forward's) or 2 (a backward's).
_ROW_IN_STAGES, _ROW_IN_GPUS, _ROW_BY = np.array([_row_form(kind) for kind in KINDS]).T
_IMPACT_OF = np.array([1 if kind is _F else 2 if kind in (_B, _I, _W) else 0 for kind in KINDS])


@per_structure
def _work_index(params: EnvParams) -> _WorkIndex:
    structure = graph_structure(params)
    kinds = structure.kind
    by = _ROW_BY[kinds]
    row = (_ROW_IN_STAGES * (params.num_gpus * params.v) + _ROW_IN_GPUS * params.num_gpus)[kinds] + np.where(
        by == 1, structure.stage, np.where(by == 2, structure.gpu, 0))
    pairs = (kinds == KIND_INDEX[TaskKind.OVERLAP_F_B]).nonzero()[0]
    return _WorkIndex(row, _IMPACT_OF[kinds], pairs, structure.part_stage[pairs, 0], structure.part_stage[pairs, 1])


@per_structure
def _draws(params: EnvParams) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The identity ``(kind number, stage, index)`` of every noise draw, the task owning it and whether it is compute
    work; per task whether it is compute work (a straggler's is slowed), and its GPU: a task's draws are its parts',
    a transfer's its own."""
    structure = graph_structure(params)
    numbers = np.array([KIND_NUMBERS.get(kind, 0) for kind in KINDS], dtype=np.int64)
    computes = structure.part_kind[:, 0] >= 0
    first = np.column_stack([np.where(computes, numbers[structure.part_kind[:, 0]], numbers[structure.kind]),
                             np.where(computes, structure.part_stage[:, 0], structure.stage),
                             np.where(computes, structure.part_mb[:, 0], structure.index)])
    paired = structure.part_kind[:, 1] >= 0
    owners = np.repeat(np.arange(len(computes)), 1 + paired)
    rows = np.empty((len(owners), 3), dtype=np.int64)
    starts = np.flatnonzero(np.diff(owners, prepend=-1))
    rows[starts] = first
    seconds = starts[paired] + 1
    rows[seconds] = np.column_stack([numbers[structure.part_kind[paired, 1]], structure.part_stage[paired, 1],
                                     structure.part_mb[paired, 1]])
    return rows, owners, computes[owners], computes, structure.gpu


#: The kinds of work a schedule's orders name, in the order of ``GraphStructure.compute_task``'s first axis.
_PART_KINDS = (_F, _B, _I, _W)
#: The transfers of one stage and micro-batch each (a table of stages x micro-batches finds them).
#: Per kind number, where a task of that kind stands among the tasks one task's end releases: transfers first, in
#: ``TRANSFER_KINDS`` order, then compute tasks.
_RELEASE_RANK = np.array([TRANSFER_KINDS.index(kind) if kind in TRANSFER_KINDS else len(TRANSFER_KINDS)
                          for kind in KINDS])
#: Per kind number, its place in ``_PART_KINDS`` (-1: none).
_PART_SLOT = np.array([_PART_KINDS.index(kind) if kind in _PART_KINDS else -1 for kind in KINDS])
_PER_MICROBATCH = (TaskKind.FWD_PROP, TaskKind.GRAD_PROP, TaskKind.FWD_GATHER, TaskKind.BWD_GATHER,
                   TaskKind.KV_EXCHANGE, TaskKind.KV_GRAD_EXCHANGE, TaskKind.A2A, TaskKind.A2A_GRAD)
#: Per kind number (and -1, no part: the last entry), which of ``_structure_of``'s tables of inputs a part of that
#: kind waits for: 0 a forward's, 1 a backward's or I's, 2 a W's, 3 none; and which gather: 0 a forward's, 1 a
#: backward's or I's, 2 none.
_INPUT_OF = np.array([{_F: 0, _B: 1, _I: 1, _W: 2}.get(kind, 3) for kind in KINDS] + [3])
_GATHER_OF = np.array([{_F: 0, _B: 1, _I: 1}.get(kind, 2) for kind in KINDS] + [2])
#: Per kind number, whether it is an all-to-all's.
_IS_A2A = np.array([kind in A2A_KINDS for kind in KINDS])


class GraphStructure(NamedTuple):
    """A task graph but for its work (``TaskGraph``'s records without lengths and impacts), as arrays: what the
    simulation reads, built with numpy from the orders, once per structure.

    Per task: its kind (its number in ``KINDS``), GPU, stage, index and receiver (-1: none); its parts' kinds,
    stages and micro-batches (two columns, -1 where there is no part: a transfer has none, a pair two). Compressed
    rows (``*_start``, ``*_task``) of each task's ``needs`` and ``releases``, of each GPU's order and peers, as
    ``TaskGraph``'s. ``issued_task`` and ``issued_by`` pair each transfer a compute task's start issues with that
    task (-1: time 0), in the order ``TaskGraph.issued_by`` lists them; ``holds`` as ``TaskGraph``'s, ascending.
    ``compute_task[k, s, m]`` is the task running the part of kind ``_PART_KINDS[k]`` on stage s for micro-batch m
    (-1: none).
    """

    kind: np.ndarray
    gpu: np.ndarray
    stage: np.ndarray
    index: np.ndarray  # type: ignore[assignment]  # shadows tuple.index, as GraphTask's
    receiver: np.ndarray
    part_kind: np.ndarray
    part_stage: np.ndarray
    part_mb: np.ndarray
    needs_start: np.ndarray
    needs_task: np.ndarray
    release_start: np.ndarray
    release_task: np.ndarray
    order_start: np.ndarray
    order_task: np.ndarray
    peer_start: np.ndarray
    peer_task: np.ndarray
    stage_gpu: np.ndarray
    stage_chunk: np.ndarray
    issued_task: np.ndarray
    issued_by: np.ndarray
    holds: np.ndarray
    compute_task: np.ndarray


@lru_cache(maxsize=256)
def _build(params: EnvParams) -> TaskGraph:
    """The records of ``params``' graph, from its structure's arrays, with ``params``' work and impact in each
    task."""
    structure = graph_structure(params)
    with collector_paused():
        return _records(params, structure)


def _records(params: EnvParams, structure: GraphStructure) -> TaskGraph:
    lengths, impacts = (values.tolist() for values in _work(params))
    kinds = [KINDS[k] for k in structure.kind.tolist()]
    actions = [[None if k < 0 else Action(KINDS[k], s, m) for k, s, m in zip(*columns)]
               for columns in zip(*(array.T.tolist()
                                    for array in (structure.part_kind, structure.part_stage, structure.part_mb)))]
    parts = [() if first is None else (first,) if second is None else (first, second)
             for first, second in zip(*actions)]
    tasks = tuple(GraphTask(kind, gpu, stage, index, length, None if receiver < 0 else receiver, own, impact)
                  for kind, gpu, stage, index, length, receiver, own, impact in zip(
                      kinds, structure.gpu.tolist(), structure.stage.tolist(), structure.index.tolist(), lengths,
                      structure.receiver.tolist(), parts, impacts))
    return TaskGraph(params, tasks, _rows_of(structure.needs_start, structure.needs_task),
                     _rows_of(structure.release_start, structure.release_task),
                     _rows_of(structure.order_start, structure.order_task),
                     _rows_of(structure.peer_start, structure.peer_task),
                     tuple(structure.stage_gpu.tolist()), tuple(structure.stage_chunk.tolist()),
                     dict(zip(structure.issued_task.tolist(), structure.issued_by.tolist())),
                     frozenset(structure.holds.tolist()))


def _rows_of(starts: np.ndarray, values: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """Compressed rows as a tuple of tuples."""
    flat, bounds = values.tolist(), starts.tolist()
    return tuple(tuple(flat[a:b]) for a, b in zip(bounds, bounds[1:]))


@per_structure
def graph_structure(params: EnvParams) -> GraphStructure:
    """The structure of ``params``' graph (the same for every environment of its ``structure_key``)."""
    structure = _structure_of(params)
    for array in structure:
        array.flags.writeable = False
    return structure


def _starts(counts: np.ndarray | list[int]) -> np.ndarray:
    """The starts of compressed rows of ``counts`` entries each."""
    if isinstance(counts, list):  # a few rows: numpy's fixed cost per call is the most of it
        return np.array([0, *accumulate(counts)], dtype=np.int64)
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    starts[1:] = counts.cumsum()
    return starts


def _none(*shape: int) -> np.ndarray:
    """An array of ``shape`` holding -1 (no task) everywhere: ``np.full``'s work without its cost per call."""
    out = np.empty(shape, dtype=np.int64)
    out.fill(-1)
    return out


def _compressed(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The starts of compressed rows of ``counts`` entries each, and each entry's place within its row."""
    starts = _starts(counts)
    return starts, np.arange(starts[-1]) - starts[:-1].repeat(counts)


def _structure_of(params: EnvParams) -> GraphStructure:
    """Per GPU: its compute tasks in their order, then its pipeline transfers (forward, then backward), its
    gradient syncs, each stage's gathers, exchanges and all-to-alls, its optimizer step and its gather of updated
    parameters; tasks numbered in that order, each block by stage and micro-batch (docs/model.md sections 2, 6
    and 15-16).

    Small graphs are built in a few hundred microseconds, of which numpy's fixed cost per call is most: a step that
    a graph has nothing of (no pairs, gathers, exchanges or optimizer steps) is skipped rather than done on empty
    arrays."""
    spec = get_schedule(params.schedule)
    p, n, v = params.num_gpus, params.n, params.v
    stages = p * v
    placed = [spec.placement(s, p, v) for s in range(stages)]
    mine: list[list[int]] = [[] for _ in range(p)]
    chunks = []
    for s, gpu_of in enumerate(placed):
        chunks.append(len(mine[gpu_of]))
        mine[gpu_of].append(s)
    stage_gpu, stage_chunk = np.array(placed, dtype=np.int64), np.array(chunks, dtype=np.int64)
    syncs = np.array(sync_points(n, params.sync_freq), dtype=np.int64)
    per_use = params.zero == 3 and params.gather_len > 0
    optimizer = params.optimizer_len > 0
    param_gather = params.zero in (1, 2) and params.gather_len > 0

    # the orders' parts, checked: each on its stage's GPU, each once
    part_gpu, part_kind, part_stage, part_mb, second = order_parts(params)
    outside = (part_stage.view(np.uint64) >= stages) | (part_mb.view(np.uint64) >= n)  # a negative one too
    if outside.any():
        k = int(np.argmax(outside))
        action = Action(KINDS[part_kind[k]], int(part_stage[k]), int(part_mb[k]))
        raise ScheduleError(f"the orders of {params.schedule} run {action}, beyond its {stages} stages and {n} "
                            "micro-batches")
    elsewhere = stage_gpu[part_stage] != part_gpu
    if elsewhere.any():
        k = int(np.argmax(elsewhere))
        action = Action(KINDS[part_kind[k]], int(part_stage[k]), int(part_mb[k]))
        raise ScheduleError(f"GPU {part_gpu[k]} runs {action}, but stage {action.stage} lives on GPU "
                            f"{stage_gpu[action.stage]}")
    key = (_PART_SLOT[part_kind] * stages + part_stage) * n + part_mb
    twice = np.bincount(key, minlength=len(_PART_KINDS) * stages * n) > 1
    if twice.any():
        k = int(np.argmax(twice[key]))
        raise ScheduleError(f"{Action(KINDS[part_kind[k]], int(part_stage[k]), int(part_mb[k]))} appears twice in "
                            f"the orders of {params.schedule}")

    # the blocks of tasks, GPU after GPU: kind number (-1: the GPU's compute tasks), GPU, stage, length, receiver
    pairs = bool(second.any())
    computes = np.bincount(part_gpu[~second] if pairs else part_gpu, minlength=p).tolist()
    blocks: list[tuple[int, int, int, int, int]] = []
    per_stage = [kind for kind, wanted in ((TaskKind.FWD_GATHER, per_use), (TaskKind.BWD_GATHER, per_use),
                                           (TaskKind.KV_EXCHANGE, params.cp_len > 0),
                                           (TaskKind.KV_GRAD_EXCHANGE, params.cp_len > 0),
                                           (TaskKind.A2A, params.a2a_len > 0), (TaskKind.A2A_GRAD, params.a2a_len > 0))
                 if wanted]
    gsync, step, gather = KIND_INDEX[TaskKind.GRAD_SYNC], KIND_INDEX[_O], KIND_INDEX[TaskKind.PARAM_GATHER]
    finals: list[tuple[int, int]] = []  # per GPU, the blocks of its compute tasks and of its first sync
    for gpu_of, own in enumerate(mine):
        finals.append((len(blocks), len(blocks)))
        blocks.append((-1, gpu_of, 0, computes[gpu_of], -1))
        blocks += [(KIND_INDEX[TaskKind.FWD_PROP], gpu_of, s, n, placed[s + 1]) for s in own
                   if s < stages - 1 and placed[s + 1] != gpu_of]
        blocks += [(KIND_INDEX[TaskKind.GRAD_PROP], gpu_of, s, n, placed[s - 1]) for s in own
                   if s > 0 and placed[s - 1] != gpu_of]
        finals[-1] = (finals[-1][0], len(blocks))
        blocks += [(gsync, gpu_of, s, len(syncs), -1) for s in own]
        blocks += [(KIND_INDEX[kind], gpu_of, s, n, -1) for s in own for kind in per_stage]
        blocks += [(step, gpu_of, own[0], 1, -1)] * optimizer + [(gather, gpu_of, own[0], 1, -1)] * param_gather
    of_kind: dict[int, list[int]] = {}  # the blocks of each kind number
    for number, (kind_number, *_) in enumerate(blocks):
        of_kind.setdefault(kind_number, []).append(number)
    block = np.array(blocks, dtype=np.int64).T
    block_kind, block_gpu, block_stage, block_length, block_receiver = block
    block_start, index = _compressed(block_length)
    count = int(block_start[-1])
    kind, gpu, stage, receiver = block[[0, 1, 2, 4]].repeat(block_length, axis=1)
    task = np.arange(count)

    # the compute tasks: a part's task, and each task's parts (kind, stage and micro-batch: two columns each)
    compute = (kind < 0).nonzero()[0]
    parts = _none(3, count, 2)
    if pairs:
        part_task = compute[(~second).cumsum() - 1]
        parts[:, part_task[~second], 0] = np.array((part_kind, part_stage, part_mb))[:, ~second]
        parts[:, part_task[second], 1] = np.array((part_kind, part_stage, part_mb))[:, second]
        kind[compute] = np.where(parts[0, compute, 1] >= 0, KIND_INDEX[TaskKind.OVERLAP_F_B], parts[0, compute, 0])
    else:
        part_task = compute
        parts[:, compute, 0] = part_kind, part_stage, part_mb
        kind[compute] = part_kind
    stage[compute], index[compute] = parts[1, compute, 0], parts[2, compute, 0]
    steps = block_start[of_kind[step]] if optimizer else compute[:0]
    if optimizer:
        parts[0, steps, 0], parts[1, steps, 0], parts[2, steps, 0] = step, stage[steps], 0
    table = _none(len(_PART_KINDS), stages, n)
    table.reshape(-1)[key] = part_task

    # the transfers of each kind of _PER_MICROBATCH, block by block (rows of n), and their blocks' stages; per
    # stage and micro-batch, the transfer of each such kind but the pipeline's (-1: none)
    absent = _none(stages, n)  # read only: every kind of transfer this graph has none of
    tables = dict.fromkeys(_PER_MICROBATCH, absent)
    rows: dict[TaskKind, tuple[np.ndarray, np.ndarray]] = {}
    for kind_of in _PER_MICROBATCH:
        chosen = of_kind.get(KIND_INDEX[kind_of])
        if chosen:
            rows[kind_of] = (block_start[chosen, None] + np.arange(n), block_stage[chosen])
            if kind_of not in (TaskKind.FWD_PROP, TaskKind.GRAD_PROP):
                tables[kind_of] = absent.copy()
                tables[kind_of][rows[kind_of][1]] = rows[kind_of][0]

    forward, whole, split_input, weight = table
    gradient = np.where(whole >= 0, whole, split_input)  # the task computing a (stage, mb)'s input gradient
    unsplit = split_input.max() < 0  # no I: nothing waits for a W
    if forward.min() < 0 or gradient.min() < 0 or not unsplit and ((split_input >= 0) & (weight < 0)).any():
        for missing, name in ((forward < 0, _F), (gradient < 0, _B), ((split_input >= 0) & (weight < 0), None)):
            if missing.any():
                s, m = np.argwhere(missing)[0].tolist()
                raise ScheduleError(f"the orders of {params.schedule} never run {Action(name, s, m)}" if name else
                                    f"the orders of {params.schedule} split {Action(_I, s, m)} but never run its W")
    # what a part waits for, by _INPUT_OF its kind, stage and micro-batch: a forward its input from the stage
    # before, a backward or I the gradient from the stage after (the last stage's: its own forward), a W its I;
    # what another GPU's stage sends, its transfer
    inputs = np.empty((4, stages, n), dtype=np.int64)
    inputs[0, 0], inputs[0, 1:], inputs[3] = -1, forward[:-1], -1
    inputs[1, :-1], inputs[1, -1], inputs[2] = gradient[1:], forward[-1], split_input
    if TaskKind.FWD_PROP in rows:
        transfers, sender = rows[TaskKind.FWD_PROP]
        inputs[0, sender + 1] = transfers
    if TaskKind.GRAD_PROP in rows:
        transfers, sender = rows[TaskKind.GRAD_PROP]
        inputs[1, sender - 1] = transfers

    # what each task waits for, in order: per part its pipeline input, then its gather (a pair's later duplicates
    # dropped); a transfer's producer; a sync's backward or W
    wants = _none(count, 4)
    for column in (0, 1) if pairs else (0,):
        its_kind, its_stage, its_mb = parts[:, compute, column]  # -1 for no part: _INPUT_OF's and a table's last
        wants[compute, 2 * column] = inputs[_INPUT_OF[its_kind], its_stage, its_mb]
        if per_use:
            gathers = np.array((tables[TaskKind.FWD_GATHER], tables[TaskKind.BWD_GATHER], absent))
            wants[compute, 2 * column + 1] = gathers[_GATHER_OF[its_kind], its_stage, its_mb]
    paired = compute[parts[0, compute, 1] >= 0] if pairs else compute[:0]
    if pairs:
        for column in (2, 3):  # a pair's second part's needs that its first has
            repeated = paired[(wants[paired, column:column + 1] == wants[paired, :column]).any(axis=1)]
            wants[repeated, column] = -1
        own = (wants[paired] == paired[:, None]).any(axis=1)  # one part never waits for its own task
        if own.any():
            i = int(paired[np.argmax(own)])
            raise ScheduleError(f"{Action(KINDS[parts[0, i, 0]], parts[1, i, 0], parts[2, i, 0])} of "
                                f"{params.schedule} would wait for its own task")
    for kind_of, producers in ((TaskKind.FWD_PROP, forward), (TaskKind.GRAD_PROP, gradient)):
        if kind_of in rows:
            transfers, sender_stage = rows[kind_of]
            wants[transfers, 0] = producers[sender_stage]
    at = (kind == gsync).nonzero()[0]
    wants[at, 0] = np.where(weight >= 0, weight, whole)[stage[at], syncs[index[at]]]

    # the all-to-alls (section 16): issued by their task's end, holding its GPU, or by an overlapped pair's start;
    # the transfers a start issues (section 15); and each issuer's exchanges, which what waits for it waits for too
    pair = KIND_INDEX[TaskKind.OVERLAP_F_B]
    issued_task, issued_by, holds = [], [], []
    exchanging = params.a2a_len > 0 or params.cp_len > 0
    exchanges = _none(count if exchanging else 0, 4)
    for column, (kind_of, issuers) in enumerate(((TaskKind.A2A, forward), (TaskKind.A2A_GRAD, gradient))):
        if params.a2a_len > 0:
            transfer, issuer = tables[kind_of].reshape(-1), issuers.reshape(-1)
            paired = kind[issuer] == pair
            issued_task.append(transfer[paired])
            issued_by.append(issuer[paired])
            holds.append(transfer[~paired])
            wants[transfer[~paired], 0] = issuer[~paired]
            exchanges[issuer, column] = transfer
    starters = {TaskKind.FWD_GATHER: lambda: np.hstack([_none(stages, 1), forward[:, :-1]]),
                TaskKind.BWD_GATHER: lambda: np.hstack([forward[:, :1], gradient[:, :-1]]),
                TaskKind.KV_EXCHANGE: lambda: forward, TaskKind.KV_GRAD_EXCHANGE: lambda: gradient}
    for column, (kind_of, starter) in enumerate(starters.items()):
        if kind_of not in rows:
            continue
        transfer = tables[kind_of].reshape(-1)
        present = transfer >= 0
        issuers = starter().reshape(-1)[present]
        issued_task.append(transfer[present])
        issued_by.append(issuers)
        if column >= 2:
            exchanges[issuers, column] = transfer[present]

    # a GPU's optimizer step waits for its compute tasks and syncs; its gather for the step, or for those
    listed = wants >= 0
    counts = listed.sum(axis=1)
    needs = wants[listed]  # row by row, each row's in its columns' order
    if optimizer or param_gather:  # the steps' and gathers' rows, put in their places
        long_rows = block_start[sorted(of_kind.get(step, []) + of_kind.get(gather, []))]
        long_lists = [np.array([i - 1]) if kind[i] == gather and optimizer else
                      np.concatenate([np.arange(block_start[first], block_start[first + 1]), np.arange(
                          block_start[syncing], block_start[syncing] + len(mine[gpu[i]]) * len(syncs))])
                      for i in long_rows.tolist() for first, syncing in (finals[gpu[i]],)]
        needs = np.insert(needs, np.repeat(np.cumsum(counts)[long_rows], [len(values) for values in long_lists]),
                          np.concatenate(long_lists))
        counts[long_rows] = [len(values) for values in long_lists]
    starts = _starts(counts)
    consumer = task.repeat(counts)
    if exchanging:  # each need's exchanges appended, in the order of the needs
        extra = exchanges[needs]
        extra[_IS_A2A[kind[consumer]]] = -1
        more = extra >= 0
        per_need = more.sum(axis=1)
        added = np.bincount(consumer, weights=per_need, minlength=count).astype(np.int64)
        total = _starts(counts + added)
        merged = np.empty(total[-1], dtype=np.int64)
        merged[total[consumer] + np.arange(len(needs)) - starts[consumer]] = needs
        _, extra_place = _compressed(added)
        merged[(total[:-1] + counts)[np.repeat(consumer, per_need)] + extra_place] = extra[more]
        starts, needs, counts = total, merged, counts + added
        consumer = task.repeat(counts)

    # each task's releases: transfers first, in TRANSFER_KINDS order, then compute tasks; by index within a kind
    rank = _RELEASE_RANK[kind[consumer]]
    place = ((needs * (len(TRANSFER_KINDS) + 1) + rank) * count + consumer).argsort(kind="stable")
    release_start = _starts(np.bincount(needs, minlength=count))

    # each GPU's order: its compute tasks (GPU after GPU already), its optimizer step last; and the GPUs it exchanges
    # transfers with
    ordered = compute
    if optimizer:
        ordered = np.concatenate([compute, steps])
        ordered = ordered[gpu[ordered].argsort(kind="stable")]
    order_start = _starts([tasks + optimizer for tasks in computes])
    peers: list[set[int]] = [set() for _ in range(p)]
    for _, source, _, _, to in blocks:
        if to >= 0:
            peers[source].add(to)
            peers[to].add(source)
    peer_start = _starts([len(row) for row in peers])
    joined = lambda arrays: np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)  # noqa: E731
    return GraphStructure(kind, gpu, stage, index, receiver, parts[0], parts[1], parts[2], starts, needs, release_start,
                          consumer[place], order_start, ordered, peer_start,
                          np.array([g for row in peers for g in sorted(row)], dtype=np.int64), stage_gpu, stage_chunk,
                          joined(issued_task), joined(issued_by), np.sort(joined(holds)), table)


@per_structure
def task_texts(params: EnvParams) -> tuple[str, ...]:
    """Every task's text, in task order, as ``Task.id`` writes it (``0F3``, ``0FP3``, ``(0F7;7B3)``)."""
    structure = graph_structure(params)
    pair = KIND_INDEX[TaskKind.OVERLAP_F_B]
    return tuple(f"({stage}F{index};{back_stage}B{back_mb})" if kind == pair else f"{stage}{KINDS[kind].code}{index}"
                 for kind, stage, index, back_stage, back_mb in zip(
                     structure.kind.tolist(), structure.stage.tolist(), structure.index.tolist(),
                     structure.part_stage[:, 1].tolist(), structure.part_mb[:, 1].tolist()))


def lengths_of_table(params: EnvParams, table: Mapping[str, float], name: str | None = None) -> list[float]:
    """Every task's length, in task order, from ``table``: a length per task text (``task_texts``);
    ``ParameterError`` naming ``lengths`` (its value ``name``, the table's file, when given) for a task it lacks or
    a text that is no task of ``params``' graph."""
    texts = task_texts(params)
    where = f"{params.schedule} with n = {params.n} on {params.num_gpus} GPUs"
    missing = [text for text in texts if text not in table]
    if missing:
        # a table of overlapped pairs ("(0F7;7B3)") holds them as one task each: only its static order runs them
        pairs = params.dispatch != "static" and any(text.startswith("(") for text in table)
        raise ParameterError("lengths", name or f"{len(table)} tasks",
                             f"lacks {', '.join(missing[:3])}" + (f" and {len(missing) - 3} more" if len(missing) > 3
                                                                  else "") + f" of {where}"
                             + (f" under dispatch {params.dispatch}: its overlapped pairs run as pairs under the "
                                "static order only (dispatch static)" if pairs else ""))
    unknown = sorted(set(table) - set(texts))
    if unknown:
        raise ParameterError("lengths", name or unknown[0],
                             (f"holds {unknown[0]}, " if name else "") + f"is no task of {where}")
    return [table[text] for text in texts]
