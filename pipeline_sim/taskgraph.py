"""The task graph of one environment (docs/model.md sections 2 and 6.2-6.3), built once and read everywhere.

Per GPU its ordered compute tasks; per task its work, the GPU doing it and, for a
transfer, the GPU receiving it; what each task waits for (``needs``) and what its end
releases (``releases``). The engine runs it, the validator checks a result against
it, the plots and metrics read it; none of them knows which schedule produced it.
"""

from __future__ import annotations

import gc
from functools import lru_cache, wraps
from typing import Callable, NamedTuple, TypeVar

import numpy as np

from .model import A2A_KINDS, TRANSFER_KINDS, Action, EnvParams, Pair, ParameterError, TaskKind, sync_points
from .noise import KIND_NUMBERS, standard_normals, work_factors
from .orders import build_orders
from .schedules import get_schedule

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

    Its records are for readers of single tasks (the validator, charts, ``engine.schedule_of``); a simulation reads
    ``task_structure``, ``task_lengths`` and ``task_impacts``, which build none.
    """
    graph = _build(params)
    if not params.jittered and params.slow_gpu < 0:
        return graph
    lengths = task_lengths(params, sample).tolist()
    return graph._replace(tasks=tuple(task._replace(length=length) for task, length in zip(graph.tasks, lengths)))


@lru_cache(maxsize=256)
def _build(params: EnvParams) -> TaskGraph:
    """``task_structure``'s graph with ``params``' work and impact in each task."""
    graph = task_structure(params)
    lengths, impacts = (values.tolist() for values in _work(params))
    return graph._replace(params=params, tasks=tuple(task._replace(length=length, impact=impact) for task, length,
                                                     impact in zip(graph.tasks, lengths, impacts)))


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


@lru_cache(maxsize=256)
def _work(params: EnvParams) -> tuple[np.ndarray, np.ndarray]:
    """Every task's noise-free work and its impact, read-only: each from a table of a few rows per stage and GPU.

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
    forward, backward = forwards[index.pair_forward], backwards[index.pair_backward]
    impact[index.pairs] = (forward * params.fwd_impact + backward * params.bwd_impact) / (forward + backward)
    lengths[index.pairs] = (forward + backward) * (1.0 - params.fb_overlap)
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


def per_structure(function: Callable[[EnvParams], _T]) -> Callable[[EnvParams], _T]:
    """``function``, computed once per structure (``structure_key``) of the ``STRUCTURES_KEPT`` used last."""
    kept: dict[tuple, _T] = {}

    @wraps(function)
    def cached(params: EnvParams) -> _T:
        key = structure_key(params)
        if key in kept:
            value = kept.pop(key)
        else:
            # what a structure holds is tens of thousands of small objects and no cycle: the cyclic collector, run
            # again and again while they are made, would spend most of the time scanning what the caches hold
            collecting = gc.isenabled()
            gc.disable()
            try:
                value = function(params)
            finally:
                if collecting:
                    gc.enable()
            if len(kept) >= STRUCTURES_KEPT:
                del kept[next(iter(kept))]  # the least recently used
        kept[key] = value
        return value
    return cached


@per_structure
def task_structure(params: EnvParams) -> TaskGraph:
    """The graph of ``params`` but for each task's work and impact (zero), and with the ``params`` of the first
    environment of its structure."""
    return _structure_of(params)


@per_structure
def _work_index(params: EnvParams) -> _WorkIndex:
    stages, p = params.num_gpus * params.v, params.num_gpus
    tasks = task_structure(params).tasks
    blocks = {kind: number * stages for number, kind in enumerate(_PER_STAGE)}
    blocks |= {kind: len(_PER_STAGE) * stages + number * p for number, kind in enumerate(_PER_GPU)}
    transfer = len(_PER_STAGE) * stages + len(_PER_GPU) * p  # a pair's row too: its work is computed apart

    def row(task: GraphTask) -> int:
        kind = _SAME_ROWS.get(task.kind, task.kind)
        if kind not in blocks:
            return transfer
        return blocks[kind] + (task.gpu if kind in _PER_GPU else task.stage)
    pairs = [i for i, task in enumerate(tasks) if task.kind is TaskKind.OVERLAP_F_B]
    ints = lambda values: np.array(values, dtype=np.int64)  # noqa: E731
    return _WorkIndex(ints([row(task) for task in tasks]),
                      ints([1 if task.kind is _F else 2 if task.kind in (_B, _I, _W) else 0 for task in tasks]),
                      ints(pairs), ints([tasks[i].parts[0].stage for i in pairs]),
                      ints([tasks[i].parts[1].stage for i in pairs]))


@per_structure
def _draws(params: EnvParams) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The identity ``(kind number, stage, index)`` of every noise draw, the task owning it and whether it is compute
    work; per task whether it is compute work (a straggler's is slowed), and its GPU."""
    rows, owners, compute = [], [], []
    tasks = task_structure(params).tasks
    for i, task in enumerate(tasks):
        for kind, stage, index in (task.parts or ((task.kind, task.stage, task.index),)):
            rows.append((KIND_NUMBERS[kind], stage, index))
            owners.append(i)
            compute.append(bool(task.parts))
    return (np.array(rows, dtype=np.int64), np.array(owners), np.array(compute),
            np.array([bool(task.parts) for task in tasks]), np.array([task.gpu for task in tasks]))


def _structure_of(params: EnvParams) -> TaskGraph:
    spec = get_schedule(params.schedule)
    p, n, v = params.num_gpus, params.n, params.v
    stages = p * v
    stage_gpu = tuple(spec.placement(s, p, v) for s in range(stages))
    stage_chunk = tuple(sum(1 for t in range(s) if stage_gpu[t] == stage_gpu[s]) for s in range(stages))
    orders = build_orders(params)
    if params.dispatch != "static":  # a dispatcher runs an overlapped pair's two parts as tasks of their own
        orders = [[part for action in order for part in (action if isinstance(action, Pair) else (action,))]
                  for order in orders]

    def compute_task(gpu: int, action: Action | Pair) -> GraphTask:
        if isinstance(action, Pair):
            return GraphTask(TaskKind.OVERLAP_F_B, gpu, action.forward.stage, action.forward.mb, 0.0,
                             parts=tuple(action))
        return GraphTask(action.kind, gpu, action.stage, action.mb, 0.0, parts=(action,))

    syncs = sync_points(n, params.sync_freq)
    tasks: list[GraphTask] = []
    where: dict[tuple, int] = {}  # ("part", kind, stage, mb) or (transfer kind, stage, index) -> task
    gpu_orders = []
    step_needs: list[list[int]] = []  # per GPU, what its optimizer step waits for
    gather_needs: dict[int, list[int]] = {}  # a GPU's gather of updated parameters: what it waits for
    for gpu in range(p):
        order = []
        for action in orders[gpu]:
            task = compute_task(gpu, action)
            for part in task.parts:
                if stage_gpu[part.stage] != gpu:
                    raise ScheduleError(f"GPU {gpu} runs {part}, but stage {part.stage} lives on GPU "
                                        f"{stage_gpu[part.stage]}")
                if ("part", *part) in where:
                    raise ScheduleError(f"{part} appears twice in the orders of {params.schedule}")
                where["part", *part] = len(tasks)
            order.append(len(tasks))
            tasks.append(task)
        gpu_orders.append(tuple(order))
        mine = [s for s in range(stages) if stage_gpu[s] == gpu]
        for s in mine:
            if s < stages - 1 and stage_gpu[s + 1] != gpu:
                for m in range(n):
                    where[TaskKind.FWD_PROP, s, m] = len(tasks)
                    tasks.append(GraphTask(TaskKind.FWD_PROP, gpu, s, m, 0.0, stage_gpu[s + 1]))
        for s in mine:
            if s > 0 and stage_gpu[s - 1] != gpu:
                for m in range(n):
                    where[TaskKind.GRAD_PROP, s, m] = len(tasks)
                    tasks.append(GraphTask(TaskKind.GRAD_PROP, gpu, s, m, 0.0, stage_gpu[s - 1]))
        for s in mine:
            for k in range(len(syncs)):
                where[TaskKind.GRAD_SYNC, s, k] = len(tasks)
                tasks.append(GraphTask(TaskKind.GRAD_SYNC, gpu, s, k, 0.0))
        per_use = params.zero == 3 and params.gather_len > 0
        for s in mine:  # zero 3: a stage's parameters gathered before each forward and backward (section 15)
            for kind in (TaskKind.FWD_GATHER, TaskKind.BWD_GATHER) if per_use else ():
                for m in range(n):
                    where[kind, s, m] = len(tasks)
                    tasks.append(GraphTask(kind, gpu, s, m, 0.0))
            for kind in (TaskKind.KV_EXCHANGE, TaskKind.KV_GRAD_EXCHANGE) if params.cp_len > 0 else ():
                for m in range(n):
                    where[kind, s, m] = len(tasks)
                    tasks.append(GraphTask(kind, gpu, s, m, 0.0))
            for kind in A2A_KINDS if params.a2a_len > 0 else ():  # expert parallelism's all-to-all (section 16)
                for m in range(n):
                    where[kind, s, m] = len(tasks)
                    tasks.append(GraphTask(kind, gpu, s, m, 0.0))
        finals = [*order, *(where[TaskKind.GRAD_SYNC, s, k] for s in mine for k in range(len(syncs)))]
        if params.optimizer_len > 0:  # the GPU's last task (section 6.7)
            step_needs.append(finals)
            gpu_orders[gpu] += (len(tasks),)
            finals = [len(tasks)]
            tasks.append(GraphTask(_O, gpu, mine[0], 0, 0.0, parts=(Action(_O, mine[0], 0),)))
        if params.zero in (1, 2) and params.gather_len > 0:  # the updated parameters gathered after the step
            where[TaskKind.PARAM_GATHER, gpu] = len(tasks)
            gather_needs[len(tasks)] = finals
            tasks.append(GraphTask(TaskKind.PARAM_GATHER, gpu, mine[0], 0, 0.0))

    def part_task(kind: TaskKind, stage: int, mb: int) -> int | None:
        return where.get(("part", kind, stage, mb))

    def the_part(*kinds_stage_mb: tuple[TaskKind, int, int]) -> int:
        for key in kinds_stage_mb:
            found = part_task(*key)
            if found is not None:
                return found
        raise ScheduleError(f"the orders of {params.schedule} never run {Action(*kinds_stage_mb[0])}")

    def input_gradient(stage: int, mb: int) -> int:
        """The task that computes (mb, stage)'s input gradient: its whole backward or its I."""
        return the_part((_B, stage, mb), (_I, stage, mb))

    def arrival(transfer: TaskKind, stage: int, mb: int, producer: int) -> int:
        """What a consumer of (mb, stage)'s output waits for: the transfer, or the producer on its own GPU."""
        return where.get((transfer, stage, mb), producer)

    needs: list[list[int]] = [[] for _ in tasks]
    for i, task in enumerate(tasks):
        if task.kind is _O:  # every other compute task of its GPU and every sync of its stages
            needs[i] = step_needs[task.gpu]
            continue
        if task.kind is TaskKind.PARAM_GATHER:
            needs[i] = gather_needs[i]
            continue
        for action in task.parts:
            kind, s, m = action
            if kind is _F:
                if s > 0:
                    needs[i].append(arrival(TaskKind.FWD_PROP, s - 1, m, the_part((_F, s - 1, m))))
                if (TaskKind.FWD_GATHER, s, m) in where:
                    needs[i].append(where[TaskKind.FWD_GATHER, s, m])
            elif kind is _W:
                needs[i].append(the_part((_I, s, m)))
            else:
                if s < stages - 1:
                    needs[i].append(arrival(TaskKind.GRAD_PROP, s + 1, m, input_gradient(s + 1, m)))
                else:
                    needs[i].append(the_part((_F, s, m)))
                if (TaskKind.BWD_GATHER, s, m) in where:
                    needs[i].append(where[TaskKind.BWD_GATHER, s, m])
        if task.kind is TaskKind.FWD_PROP:
            needs[i].append(the_part((_F, task.stage, task.index)))
        elif task.kind is TaskKind.GRAD_PROP:
            needs[i].append(input_gradient(task.stage, task.index))
        elif task.kind is TaskKind.GRAD_SYNC:
            m = syncs[task.index]
            needs[i].append(the_part((_W, task.stage, m), (_B, task.stage, m)))
        if len(needs[i]) > 1:
            needs[i] = list(dict.fromkeys(needs[i]))
        if i in needs[i]:
            raise ScheduleError(f"{task.parts[0]} of {params.schedule} would wait for its own task")
    for s in range(stages):
        for m in range(n):
            the_part((_F, s, m))
            input_gradient(s, m)
            if part_task(_I, s, m) is not None and part_task(_W, s, m) is None:
                raise ScheduleError(f"the orders of {params.schedule} split {Action(_I, s, m)} but never run its W")

    # transfers issued by a compute task's start (section 15): a stage's next gathers, prefetched one use ahead, and
    # the attention exchange of the work that starts; what reads that work's results waits for its exchange too
    issued_by: dict[int, int] = {}
    exchanges: dict[int, list[int]] = {}
    holds: set[int] = set()
    issued = [(kind, s, m, i) for kind in ISSUED_KINDS for s in range(stages) for m in range(n)
              if (i := where.get((kind, s, m), -1)) >= 0] if per_use or params.cp_len > 0 else []
    # the all-to-all of a task: issued by its end, holding its GPU, or beside it by an overlapped pair's start
    for kind in A2A_KINDS if params.a2a_len > 0 else ():
        for s in range(stages):
            for m in range(n):
                i = where[kind, s, m]
                issuer = the_part((_F, s, m)) if kind is TaskKind.A2A else input_gradient(s, m)
                if tasks[issuer].kind is TaskKind.OVERLAP_F_B:
                    issued_by[i] = issuer
                else:
                    needs[i] = [issuer]
                    holds.add(i)
                exchanges.setdefault(issuer, []).append(i)
    for kind, s, m, i in issued:
        if kind is TaskKind.FWD_GATHER:
            issued_by[i] = the_part((_F, s, m - 1)) if m > 0 else -1
        elif kind is TaskKind.BWD_GATHER:
            issued_by[i] = input_gradient(s, m - 1) if m > 0 else the_part((_F, s, 0))
        else:
            issued_by[i] = the_part((_F, s, m)) if kind is TaskKind.KV_EXCHANGE else input_gradient(s, m)
            exchanges.setdefault(issued_by[i], []).append(i)
    if exchanges:
        for i, task in enumerate(tasks):
            if i not in issued_by and task.kind not in A2A_KINDS:
                needs[i] = list(dict.fromkeys([*needs[i], *(x for j in needs[i] for x in exchanges.get(j, ()))]))

    # each task's releases list transfers first, in TRANSFER_KINDS order, then compute tasks; by index within a kind
    rank = {kind: k for k, kind in enumerate(TRANSFER_KINDS)}
    buckets: list[list[int]] = [[] for _ in range(len(TRANSFER_KINDS) + 1)]
    for i, task in enumerate(tasks):
        buckets[rank.get(task.kind, len(TRANSFER_KINDS))].append(i)
    releases: list[list[int]] = [[] for _ in tasks]
    for i in (i for bucket in buckets for i in bucket):
        for producer in needs[i]:
            releases[producer].append(i)
    peers: list[set[int]] = [set() for _ in range(p)]
    for task in tasks:
        if task.receiver is not None:
            peers[task.gpu].add(task.receiver)
            peers[task.receiver].add(task.gpu)
    return TaskGraph(params, tuple(tasks), tuple(map(tuple, needs)), tuple(map(tuple, releases)),
                     tuple(gpu_orders), tuple(tuple(sorted(g)) for g in peers), stage_gpu, stage_chunk, issued_by,
                     frozenset(holds))
