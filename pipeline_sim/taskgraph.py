"""The task graph of one environment (docs/model.md sections 2 and 6.2-6.3), built once and read everywhere.

Per GPU its ordered compute tasks; per task its work, the GPU doing it and, for a
transfer, the GPU receiving it; what each task waits for (``needs``) and what its end
releases (``releases``). The engine runs it, the validator checks a result against
it, the plots and metrics read it; none of them knows which schedule produced it.
"""

from __future__ import annotations

import gc
import threading
from collections import OrderedDict
from contextlib import contextmanager
from functools import cache, lru_cache, wraps
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, NamedTuple, TypeVar

import numpy as np

from .compile_cache import built, load_kernel
from .model import (
    COMM_KINDS,
    KIND_INDEX,
    KINDS,
    ROOM_UNIT,
    TRANSFER_KINDS,
    Action,
    EnvParams,
    ParameterError,
    TaskKind,
    room_units,
)
from .noise import KIND_NUMBERS, standard_normals, work_factors
from .orders import build_orders, order_parts
from .schedules import get_schedule
from .tables import LengthTable, read_table

if TYPE_CHECKING:
    from functools import _lru_cache_wrapper

_F, _B, _I, _W = TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT
_O = TaskKind.OPTIMIZER_STEP
_COMM_NUMBER = {kind: number for number, kind in enumerate(COMM_KINDS)}
_FALLS = (_B, _W)
#: Per kind number, and -1 for no part (the last entry), whether a part of it raises a GPU's activations as it
#: starts, and whether one lowers them as it ends.
_RISING, _FALLING = (np.array([kind in of for kind in (*KINDS, None)]) for of in ((_F,), _FALLS))
#: How dispatchers rank a compute task's kind: backward work first, then forwards, then weight gradients; an
#: optimizer step is no choice (it starts itself, section 6.7).
_KIND_CLASS = {_B: 0, _I: 0, _F: 1, _W: 2, _O: 3}
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


def compute_orders(schedule: str, *, num_gpus: int, n: int, chunks: int = 2, allow_large: bool = False) \
        -> list[list[str]]:
    """Per GPU, the text of each action in the order it runs (``"0F3"``, ``"(0F7;7B3)"``); an environment of more
    tasks than fit in memory is refused, as ``calculate_full_pipeline_schedule`` refuses it, unless
    ``allow_large``."""
    params = EnvParams(schedule=schedule, num_gpus=num_gpus, n=n, chunks=chunks)
    if not allow_large:
        check_size(params, " (allow_large=True to try anyway)")
    return [[str(action) for action in order] for order in build_orders(params)]


_T = TypeVar("_T")
#: Structures kept per function of ``per_structure``: the least recently used goes beyond it.
STRUCTURES_KEPT = 64
#: The most tasks of the environments whose values a cache holds: a cache of ``per_structure`` lets its least
#: recently used structures go beyond it, the caches of ``per_environment`` are emptied together
#: (``environment_computed``); the value computed last is kept whatever its size. Values take tens to hundreds of
#: bytes a task (a structure about 220, an environment's work 40): 256 works of million-task environments would
#: hold 10 GB. Small environments never reach it.
KEPT_TASKS = 1_000_000


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


#: The environment sized last and its tasks (``_tasks_of``), as one tuple (threads may ask).
_sized: list[tuple] = [(None, 0)]


def _tasks_of(params: EnvParams) -> int:
    """``estimated_tasks(params)``: a new environment is sized for two caches, one after the other."""
    asked, tasks = _sized[0]
    if asked is not params:
        tasks = estimated_tasks(params)
        _sized[0] = (params, tasks)
    return tasks


class Kept(NamedTuple):
    """What a cache of ``per_structure`` or ``per_environment`` holds: its values and (an upper bound on) the
    tasks of their environments."""

    values: int
    tasks: int


#: Every cache of ``per_structure``.
_STRUCTURE_CACHES: list[Callable] = []


def per_structure(function: Callable[[EnvParams], _T]) -> Callable[[EnvParams], _T]:
    """``function``, computed once per structure (``structure_key``) of the ``STRUCTURES_KEPT`` used last, of
    ``KEPT_TASKS`` tasks at most in all (``estimated_tasks``; the last computed is kept whatever its size).
    ``kept()`` says what it holds, ``clear()`` lets it all go."""
    # least recently used first: an ordered dictionary moves an entry to the end and lets the first go in constant
    # time (a plain one, taken from the front again and again, skips ever more freed slots to find its first)
    kept: OrderedDict[tuple, tuple[_T, int]] = OrderedDict()
    tasks = [0]  # of the environments kept
    lock = threading.Lock()  # the dictionary's reorder and eviction, as threads may ask at once
    # the environment asked for last, its key and its value once known, as one tuple (threads may ask): one
    # environment is asked again and again, and its key costs more than the lookup
    last: list[tuple] = [(None, (), None)]

    @wraps(function)
    def cached(params: EnvParams) -> _T:
        asked, key, value = last[0]
        if asked is params and value is not None:
            return value
        if asked is not params:
            key = structure_key(params)
            last[0] = (params, key, None)
        with lock:
            entry = kept.get(key)
            if entry is not None:
                kept.move_to_end(key)
                last[0] = (params, key, entry[0])
                return entry[0]
        collecting = gc.isenabled()
        gc.disable()  # as ``collector_paused``, without a context manager's cost for a structure of a few tasks
        try:
            value = function(params)
        finally:
            if collecting:
                gc.enable()
        size = _tasks_of(params)
        with lock:  # two threads may have built the same structure: either is it
            if key in kept:
                tasks[0] -= kept.pop(key)[1]
            while kept and (len(kept) >= STRUCTURES_KEPT or tasks[0] + size > KEPT_TASKS):
                tasks[0] -= kept.popitem(last=False)[1][1]
            kept[key] = (value, size)
            tasks[0] += size
        last[0] = (params, key, value)
        return value

    def clear() -> None:
        with lock:
            kept.clear()
            tasks[0] = 0
            last[0] = (None, (), None)

    cached.kept = lambda: Kept(len(kept), tasks[0])  # type: ignore[attr-defined]
    cached.clear = clear  # type: ignore[attr-defined]
    _STRUCTURE_CACHES.append(cached)
    return cached


#: Every cache of ``per_environment``, and the tasks of the environments computed since they were last emptied.
_ENVIRONMENT_CACHES: list[_lru_cache_wrapper] = []
_environment_tasks = [0]


def per_environment(entries: int) -> Callable[[Callable[..., _T]], _lru_cache_wrapper[_T]]:
    """``functools.lru_cache(entries)`` for a function of an environment (its first argument) and more, emptied with
    every other such cache when ``environment_computed`` says so. ``kept()`` says what it holds, at most."""
    def decorate(function: Callable[..., _T]) -> _lru_cache_wrapper[_T]:
        cached = lru_cache(maxsize=entries)(function)
        cached.kept = lambda: Kept(cached.cache_info().currsize, _environment_tasks[0])  # type: ignore[attr-defined]
        _ENVIRONMENT_CACHES.append(cached)
        return cached
    return decorate


def environment_computed(params: EnvParams) -> None:
    """Count the tasks of ``params`` (``estimated_tasks``), a new environment, among those whose values the caches of
    ``per_environment`` hold: when they would exceed ``KEPT_TASKS``, every such cache is emptied first. Called where
    every simulation passes, as its arrays are first made (``engine.graph_arrays``), so that the caches themselves
    count nothing and answer as fast as ``lru_cache``. (Threads counting at once may miss an environment's tasks:
    a bound all the same.)"""
    size = _tasks_of(params)
    if _environment_tasks[0] + size > KEPT_TASKS:
        _empty_environments()
    _environment_tasks[0] += size


def _empty_environments() -> None:
    for environment_cache in _ENVIRONMENT_CACHES:
        environment_cache.cache_clear()
    _environment_tasks[0] = 0


def empty_caches() -> None:
    """Let go of every structure and environment the caches of ``per_structure`` and ``per_environment`` hold: what
    follows is computed from nothing (a benchmark of a new structure's cost, which frees the one before it as a
    sweep's caches, once full, let one go for each they take)."""
    for structure_cache in _STRUCTURE_CACHES:
        structure_cache.clear()  # type: ignore[attr-defined]
    _empty_environments()


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
    lengths = graph_work(params).lengths if work is None else work
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
    lengths.setflags(write=False)  # as the noise-free lengths: the kernel is compiled for one array type
    return lengths


def task_impacts(params: EnvParams) -> np.ndarray:
    """Every task's compute impact (section 3.3), in task order: a transfer's is 0."""
    return graph_work(params).impact


#: The kinds whose work is that of another's row in the table of work (``kernel.work``): a zero 3 gather before a
#: backward is as long as the one before a forward, an all-to-all's gradient as its forward all-to-all.
_SAME_ROWS = {TaskKind.BWD_GATHER: TaskKind.FWD_GATHER, TaskKind.A2A_GRAD: TaskKind.A2A}


def table_of(params: EnvParams) -> LengthTable | None:
    """The table of lengths ``params`` names, as now read (``tables.read_table``), or None: what is computed from a
    table is kept per ``(params, table_of(params))``."""
    return read_table(params.lengths) if params.lengths else None


def _row(array: str, row: int) -> Any:
    """A property: row ``row`` of the field ``array``, a view made when read (a graph's construction makes none)."""
    return property(lambda self: getattr(self, array)[row], doc=f"``{array}[{row}]``")


class _WorkRows(NamedTuple):
    floats: np.ndarray
    integers: np.ndarray


class Work(_WorkRows):
    """An environment's work on its graph, per task and read-only: its noise-free length and impact (section 3.3),
    the room for activations it reserves as it starts (``engine.GraphArrays.reserve``), and the activations that rise
    as it starts and fall as it ends, in units of ``ROOM_UNIT`` per stage of weight 1: rows of ``floats`` (lengths,
    impacts) and ``integers`` (the rest), each read as a view."""

    __slots__ = ()
    lengths, impact = (_row("floats", row) for row in range(2))
    reserve, rises, falls = (_row("integers", row) for row in range(3))


def graph_work(params: EnvParams) -> Work:
    """``params``' ``Work``."""
    return _work_of(params, table_of(params))


@per_environment(256)
def _work_of(params: EnvParams, measured: LengthTable | None) -> Work:
    """``params``' ``Work``, built by the compiled ``kernel.graph_work`` from its values and weights per stage and GPU
    (every task's work from the table of lengths ``measured`` when there is one)."""
    structure = graph_structure(params)
    stage_rooms, gpu_rooms = _rooms(params)
    values, weights = _work_fields()
    floats, integers = built(load_kernel().graph_work)(
        structure.columns, structure.pairs, np.array(values(params)), _weights(params, weights), _per_gpu(params),
        params.v, stage_rooms, gpu_rooms)
    if measured is not None:  # a table gives every task's work; the parameters' still weigh a pair's impact
        floats = floats.copy()
        floats[0] = lengths_of_table(params, measured.lengths, params.lengths)
        floats.setflags(write=False)
    return Work(floats, integers)


@cache
def _work_fields() -> tuple[attrgetter, attrgetter]:
    """What reads ``kernel.work``'s ``VALUES`` and ``WEIGHTS`` from an environment."""
    from .kernel.work import VALUES, WEIGHTS

    return attrgetter(*VALUES), attrgetter(*WEIGHTS)


def _weights(params: EnvParams, fields: attrgetter) -> np.ndarray:
    """The weights ``fields`` reads of ``params`` (``kernel.work``'s ``WEIGHTS``), per stage (1 where none is
    given)."""
    given = fields(params)
    if not any(given):
        return _filled(1.0, len(given), params.num_gpus * params.v)
    return _read_only(np.array([weights or [1.0] * (params.num_gpus * params.v) for weights in given],
                               dtype=np.float64))


@lru_cache(maxsize=64)
def _filled(value: float, rows: int, columns: int) -> np.ndarray:
    """A read-only array of ``value``: what most environments give, made once."""
    array = np.full((rows, columns), value)
    array.flags.writeable = False
    return array


def _per_gpu(params: EnvParams) -> np.ndarray:
    """Each GPU's optimizer step and parameter gather, rows read only where there are any."""
    if params.optimizer_len <= 0 and params.gather_len <= 0:
        return _filled(0.0, 2, params.num_gpus)
    per_gpu = np.zeros((2, params.num_gpus))
    if params.optimizer_len > 0:
        per_gpu[0] = params.step_lengths()
    if params.gather_len > 0:
        per_gpu[1] = params.gather_lengths()
    return _read_only(per_gpu)


def _rooms(params: EnvParams) -> tuple[np.ndarray, np.ndarray]:
    """``stage_rooms`` and ``gpu_rooms`` as arrays."""
    if not params.stage_weights:
        return _equal_rooms(params.num_gpus, params.v)
    return _read_only(stage_rooms(params)), _read_only(gpu_rooms(params))


@lru_cache(maxsize=64)
def _equal_rooms(p: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    return _read_only([ROOM_UNIT] * (p * v)), _read_only([v * ROOM_UNIT] * p)


def stage_rooms(params: EnvParams) -> list[int]:
    """Per stage, one micro-batch's activations there, in units (``ROOM_UNIT`` per stage of weight 1)."""
    if not params.stage_weights:
        return [ROOM_UNIT] * (params.num_gpus * params.v)
    return [room_units(weight) for weight in params.stage_weights]


def gpu_rooms(params: EnvParams) -> list[int]:
    """Per GPU, one micro-batch's activations on all of its stages, in units (``ROOM_UNIT`` per stage of weight 1)."""
    if not params.stage_weights:
        return [params.v * ROOM_UNIT] * params.num_gpus  # v stages of ``ROOM_UNIT`` each on every GPU
    rooms = [0] * params.num_gpus
    spec = get_schedule(params.schedule)
    for stage, room in enumerate(stage_rooms(params)):
        rooms[spec.placement(stage, params.num_gpus, params.v)] += room
    return rooms


def structure_key(params: EnvParams) -> tuple:
    """What a graph's structure depends on: the schedule, p, v, n, the sync frequency, whether pairs are split,
    whether the GPUs step an optimizer, which gathers, exchanges and all-to-alls there are, the all-to-all's class
    (which the transfers' priority classes read) and whether its pairs overlap. Environments of one key differ
    only in their tasks' work and impact (layouts of one schedule, p, v and n share one: the planner's do)."""
    return (params.schedule, params.num_gpus, params.v, params.n, params.sync_freq, params.dispatch != "static",
            params.optimizer_len > 0, params.zero if params.gather_len > 0 else 0, params.cp_len > 0,
            (params.a2a_class, params.ep_overlap) if params.a2a_len > 0 else ())


def _row_form(kind: TaskKind, per_stage: tuple[str, ...], per_gpu: tuple[str, ...]) -> tuple[int, int, int]:
    """Where the table of work holds the work of a task of ``kind`` (``kernel.work``'s, of blocks ``per_stage`` and
    ``per_gpu``): its block's first row, in stages and GPUs (the block starts at ``stages * a + gpus * b``), and what
    numbers its row within the block: 0 nothing (a transfer's row, the last, and a pair's too: its work is computed
    apart), 1 its stage, 2 its GPU."""
    kind = _SAME_ROWS.get(kind, kind)
    if kind in per_stage:
        return per_stage.index(kind), 0, 1
    if kind in per_gpu:
        return len(per_stage), per_gpu.index(kind), 2
    return len(per_stage), len(per_gpu), 0


#: Per kind number, its impact: 0 (none), 1 (a forward's) or 2 (a backward's).
_IMPACT_OF = np.array([1 if kind is _F else 2 if kind in (_B, _I, _W) else 0 for kind in KINDS])


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
#: Per kind number, where a task of that kind stands among the tasks one task's end releases: transfers first, in
#: ``TRANSFER_KINDS`` order, then compute tasks.
_RELEASE_RANK = np.array([TRANSFER_KINDS.index(kind) if kind in TRANSFER_KINDS else len(TRANSFER_KINDS)
                          for kind in KINDS])
#: Per kind number, its place in ``_PART_KINDS`` (-1: none).
_PART_SLOT = np.array([_PART_KINDS.index(kind) if kind in _PART_KINDS else -1 for kind in KINDS])
#: Per kind number (and -1, no part: the last entry), which table of inputs a part of that kind waits for: 0 a
#: forward's, 1 a backward's or I's, 2 a W's, 3 none; and which gather: 0 a forward's, 1 a backward's or I's, 2 none.
_INPUT_OF = np.array([{_F: 0, _B: 1, _I: 1, _W: 2}.get(kind, 3) for kind in KINDS] + [3])
_GATHER_OF = np.array([{_F: 0, _B: 1, _I: 1}.get(kind, 2) for kind in KINDS] + [2])


class _Built(NamedTuple):
    """What ``kernel.build_structure`` returns, in its order, and each stage's GPU."""

    columns: np.ndarray
    parts: np.ndarray
    needs_start: np.ndarray
    needs_task: np.ndarray
    issue_start: np.ndarray
    issue_task: np.ndarray
    order_start: np.ndarray
    order_task: np.ndarray
    peer_start: np.ndarray
    peer_task: np.ndarray
    rare: np.ndarray
    pairs: np.ndarray
    stage_gpu: np.ndarray


class GraphStructure(_Built):
    """A task graph but for its work (``TaskGraph``'s records without lengths and impacts), as arrays: what the
    simulation reads, built by the compiled ``kernel.build_structure`` from the orders, once per structure.

    Per task: its kind (its number in ``KINDS``), GPU, stage, index and receiver (-1: none); its parts' kinds,
    stages and micro-batches (two columns, -1 where there is no part: a transfer has none, a pair two). Compressed
    rows (``*_start``, ``*_task``) of each task's ``needs`` and ``releases``, of each GPU's order and peers, as
    ``TaskGraph``'s. ``issued_task`` and ``issued_by`` pair each transfer a compute task's start issues with that
    task (-1: time 0), in the order ``TaskGraph.issued_by`` lists them; ``holds`` as ``TaskGraph``'s, ascending.
    ``compute_task[k, s, m]`` is the task running the part of kind ``_PART_KINDS[k]`` on stage s for micro-batch m
    (-1: none). ``issue_start`` and ``issue_task`` are the rows the kernel reads: each task's releases, then (row
    tasks + i) the transfers task i's start issues and (row 2 tasks) those issued at time 0, each by task. Per task
    its row in ``_work_of``'s table and its impact (0 none, 1 a forward's, 2 a backward's); ``pairs`` each
    overlapped pair's task and the stages of its forward and its backward. Per task as ``engine.GraphArrays`` holds
    them, its transfer class (``comm``), its class for dispatchers and how many tasks it waits for; whether it is
    the forward of a micro-batch's first stage on its GPU, and the stages of its part whose activations rise as it
    starts and fall as it ends (-1: none). ``columns``: the per-task rows, in one array (``kernel.structure.KIND`` ...),
    each read as a view of it; ``rare``: ``stage_chunk``, ``issued_task``, ``issued_by``, ``holds`` and
    ``compute_task``, which few read, in one array (``kernel.structure._rare``), each read as a view of it.
    """

    __slots__ = ()
    # in the order of ``kernel.structure``'s rows ``KIND`` ... ``FALL_STAGE``
    kind, gpu, stage, index, receiver, work_row, work_impact, comm, kind_class, needs_count, first_forward, \
        rise_stage, fall_stage = (_row("columns", row) for row in range(13))
    part_kind, part_stage, part_mb = (_row("parts", row) for row in range(3))

    @property
    def stage_chunk(self) -> np.ndarray:
        return self.rare[2:2 + len(self.stage_gpu)]

    @property
    def issued_task(self) -> np.ndarray:
        first = 2 + len(self.stage_gpu)
        return self.rare[first:first + int(self.rare[0])]

    @property
    def issued_by(self) -> np.ndarray:
        first = 2 + len(self.stage_gpu) + int(self.rare[0])
        return self.rare[first:first + int(self.rare[0])]

    @property
    def holds(self) -> np.ndarray:
        first = 2 + len(self.stage_gpu) + 2 * int(self.rare[0])
        return self.rare[first:first + int(self.rare[1])]

    @property
    def compute_task(self) -> np.ndarray:
        stages = len(self.stage_gpu)
        first = 2 + stages + 2 * int(self.rare[0]) + int(self.rare[1])
        return self.rare[first:].reshape((len(_PART_KINDS), stages, -1))

    @property
    def release_start(self) -> np.ndarray:
        return self.issue_start[:self.columns.shape[1] + 1]

    @property
    def release_task(self) -> np.ndarray:
        return self.issue_task[:self.issue_start[self.columns.shape[1]]]


@per_environment(256)
def _build(params: EnvParams) -> TaskGraph:
    """The records of ``params``' graph, from its structure's arrays, with ``params``' work and impact in each
    task."""
    structure = graph_structure(params)
    with collector_paused():
        return _records(params, structure)


def _records(params: EnvParams, structure: GraphStructure) -> TaskGraph:
    work = graph_work(params)
    lengths, impacts = work.lengths.tolist(), work.impact.tolist()
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
    return _structure_of(params)


@cache
def _builder_tables() -> tuple[np.ndarray, np.ndarray]:
    """What ``kernel.build_structure`` reads of the kinds: the kind numbers its ``CODES`` name, and per kind number
    (and -1, no kind: the last entry) the tables its ``LOOKUP`` names."""
    from .kernel import structure, work

    rows = np.array([_row_form(kind, work.PER_STAGE, work.PER_GPU) for kind in KINDS]).T
    per_microbatch = (TaskKind.FWD_GATHER, TaskKind.BWD_GATHER, TaskKind.KV_EXCHANGE, TaskKind.KV_GRAD_EXCHANGE,
                      TaskKind.A2A, TaskKind.A2A_GRAD)
    tables = {"release_rank": [*_RELEASE_RANK, 0], "part_slot": [*_PART_SLOT, -1], "input_of": _INPUT_OF,
              "gather_of": _GATHER_OF, "row_in_stages": [*rows[0], 0], "row_in_gpus": [*rows[1], 0],
              "row_by": [*rows[2], 0], "impact_of": [*_IMPACT_OF, 0],
              "kind_class": [_KIND_CLASS.get(kind, -1) for kind in KINDS] + [-1], "rising": _RISING,
              "falling": _FALLING,
              "per_microbatch": [per_microbatch.index(kind) if kind in per_microbatch else -1 for kind in KINDS] + [-1]}
    return (np.array([KIND_INDEX[TaskKind(name)] for name in structure.CODES], dtype=np.int64),
            np.array([tables[name] for name in structure.LOOKUP], dtype=np.int64))


def _structure_of(params: EnvParams) -> GraphStructure:
    """Per GPU: its compute tasks in their order, then its pipeline transfers (forward, then backward), its
    gradient syncs, each stage's gathers, exchanges and all-to-alls, its optimizer step and its gather of updated
    parameters; tasks numbered in that order, each block by stage and micro-batch (docs/model.md sections 2, 6
    and 15-16), built by the compiled ``kernel.build_structure`` from the orders' parts."""
    p, n = params.num_gpus, params.n
    stage_gpu = _stage_gpu(params.schedule, p, params.v)
    per_stage = _per_stage(params.zero == 3 and params.gather_len > 0, params.cp_len > 0, params.a2a_len > 0)
    parts = order_parts(params)
    error = np.zeros(4, dtype=np.int64)
    structure = built(load_kernel().build_structure)(
        p, n, stage_gpu, min(params.sync_freq, n), per_stage, int(params.optimizer_len > 0),  # the same syncs
        int(params.zero in (1, 2) and params.gather_len > 0), parts, *_builder_tables(), _comm_numbers(params), error)
    if error[0]:
        raise ScheduleError(_schedule_error(params, stage_gpu, error.tolist(), parts))
    return GraphStructure._make((*structure, stage_gpu))


def _read_only(values: list[int] | np.ndarray) -> np.ndarray:
    """``values`` as an array no one writes: every array a compiled builder takes of one argument is read-only, or
    every one writable, as numba compiles the builder anew for each kind."""
    array = np.array(values, dtype=np.int64) if isinstance(values, list) else values
    array.setflags(write=False)
    return array


@lru_cache(maxsize=256)
def _stage_gpu(schedule: str, p: int, v: int) -> np.ndarray:
    """Per stage, the GPU it lives on."""
    spec = get_schedule(schedule)
    return _read_only([spec.placement(s, p, v) for s in range(p * v)])


@cache
def _per_stage(per_use: bool, exchanges: bool, all_to_all: bool) -> np.ndarray:
    """The kind numbers of the transfers each stage has one of per micro-batch: the gathers of zero 3 (``per_use``),
    the exchanges of context parallelism, the all-to-alls."""
    return _read_only([KIND_INDEX[kind] for kind, wanted in (
        (TaskKind.FWD_GATHER, per_use), (TaskKind.BWD_GATHER, per_use), (TaskKind.KV_EXCHANGE, exchanges),
        (TaskKind.KV_GRAD_EXCHANGE, exchanges), (TaskKind.A2A, all_to_all), (TaskKind.A2A_GRAD, all_to_all))
        if wanted])


_COMM_NUMBERS: dict[str, np.ndarray] = {}


def _comm_numbers(params: EnvParams) -> np.ndarray:
    """Per kind number, the number in ``COMM_KINDS`` of the class whose priority a transfer of that kind takes under
    ``params`` (-1: compute), which only its ``a2a_class`` changes."""
    numbers = _COMM_NUMBERS.get(params.a2a_class)
    if numbers is None:
        numbers = _COMM_NUMBERS[params.a2a_class] = np.array(
            [-1 if kind_of.is_compute else _COMM_NUMBER[params.priority_class(kind_of)] for kind_of in KINDS])
    return numbers


def _schedule_error(params: EnvParams, stage_gpu: np.ndarray, error: list[int], parts: np.ndarray) -> str:
    """What ``kernel.build_structure``'s ``error`` says is wrong with ``params``' orders, in words."""
    from .kernel import structure as built

    code, *where = error
    if code == built.OWN_TASK:
        return f"{Action(KINDS[where[0]], where[1], where[2])} of {params.schedule} would wait for its own task"
    if code in (built.NO_FORWARD, built.NO_GRADIENT, built.NO_WEIGHT):
        stage, mb = where[:2]
        if code == built.NO_WEIGHT:
            return f"the orders of {params.schedule} split {Action(_I, stage, mb)} but never run its W"
        return f"the orders of {params.schedule} never run {Action(_F if code == built.NO_FORWARD else _B, stage, mb)}"
    part_gpu, part_kind, part_stage, part_mb = parts[:4, where[0]].tolist()
    if code == built.NO_PART:
        named = f" ({KINDS[part_kind]})" if 0 <= part_kind < len(KINDS) else ""
        return (f"the orders of {params.schedule} run a part of kind number {part_kind}{named}: an order runs "
                "forwards, backwards and their input and weight gradients only")
    action = Action(KINDS[part_kind], part_stage, part_mb)
    if code == built.OUTSIDE:
        return (f"the orders of {params.schedule} run {action}, beyond its {len(stage_gpu)} stages and {params.n} "
                "micro-batches")
    if code == built.ELSEWHERE:
        return f"GPU {part_gpu} runs {action}, but stage {action.stage} lives on GPU {stage_gpu[action.stage]}"
    return f"{action} appears twice in the orders of {params.schedule}"


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
