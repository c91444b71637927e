"""The task graph's construction task by task, from the records: the reference the compiled structure's arrays
(``pipeline_sim.kernel.structure``) and the records made from them are compared with, to the bit
(tests/test_graph_arrays.py)."""

from __future__ import annotations

import numpy as np
from reference_orders import build_orders

from pipeline_sim.kernel import work
from pipeline_sim.kernel.state import HOLD_CLASS
from pipeline_sim.model import A2A_KINDS, TRANSFER_KINDS, Action, EnvParams, Pair, TaskKind
from pipeline_sim.noise import KIND_NUMBERS
from pipeline_sim.schedules import get_schedule
from pipeline_sim.taskgraph import (
    _COMM_NUMBER,
    _FALLS,
    _KIND_CLASS,
    _SAME_ROWS,
    ISSUED_KINDS,
    GraphTask,
    ScheduleError,
    TaskGraph,
)

_PER_STAGE, _PER_GPU = ([TaskKind(name) for name in names] for names in (work.PER_STAGE, work.PER_GPU))
_F, _B, _I, _W = TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT
_O = TaskKind.OPTIMIZER_STEP


def structure_of(params: EnvParams) -> TaskGraph:
    """The old construction, task by task."""
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

    syncs = [m for m in range(n) if (m + 1) % params.sync_freq == 0 or m == n - 1]  # a sync's micro-batches
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


def work_index(params: EnvParams, graph: TaskGraph) -> tuple[np.ndarray, ...]:
    """Per task its row in the table of work and its impact (0 none, 1 a forward's, 2 a backward's); and each
    overlapped pair's task and the stages of its forward and its backward."""
    stages, p = params.num_gpus * params.v, params.num_gpus
    tasks = graph.tasks
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
    return (ints([row(task) for task in tasks]),
            ints([1 if task.kind is _F else 2 if task.kind in (_B, _I, _W) else 0 for task in tasks]),
            ints([pairs, [tasks[i].parts[0].stage for i in pairs], [tasks[i].parts[1].stage for i in pairs]]))


def draws(graph: TaskGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The identity ``(kind number, stage, index)`` of every noise draw, the task owning it and whether it is compute
    work; per task whether it is compute work (a straggler's is slowed), and its GPU."""
    rows, owners, compute = [], [], []
    tasks = graph.tasks
    for i, task in enumerate(tasks):
        for kind, stage, index in (task.parts or ((task.kind, task.stage, task.index),)):
            rows.append((KIND_NUMBERS[kind], stage, index))
            owners.append(i)
            compute.append(bool(task.parts))
    return (np.array(rows, dtype=np.int64), np.array(owners), np.array(compute),
            np.array([bool(task.parts) for task in tasks]), np.array([task.gpu for task in tasks]))


def rows(lists) -> tuple[np.ndarray, np.ndarray]:
    starts = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in lists], out=starts[1:])
    return starts, np.array([x for row in lists for x in row], dtype=np.int64)


def release_lists(graph: TaskGraph) -> list[tuple[int, ...]]:
    issued: list[list[int]] = [[] for _ in range(len(graph.tasks) + 1)]
    for transfer, issuer in sorted(graph.issued_by.items()):
        issued[issuer].append(transfer)  # -1, time 0: the last row
    return [*graph.releases, *map(tuple, issued)]


def skeleton(params: EnvParams, graph: TaskGraph) -> dict[str, np.ndarray]:
    """The structure's arrays of ``engine.GraphArrays`` and of ``taskgraph.GraphStructure``, task by task."""
    tasks = graph.tasks
    ints = lambda values: np.array(values, dtype=np.int64)  # noqa: E731

    def part_stages(kinds):
        return ints([next((part.stage for part in t.parts if part.kind in kinds), -1) for t in tasks])
    release_start, release_task = rows(release_lists(graph))
    order_start, order_task = rows(graph.orders)
    peer_start, peer_task = rows(graph.peers)
    return {
        "gpu": ints([t.gpu for t in tasks]),
        "receiver": ints([-1 if t.receiver is None else t.receiver for t in tasks]),
        "comm": ints([_COMM_NUMBER[params.priority_class(t.kind)] if not t.kind.is_compute else -1 for t in tasks]),
        "stage": ints([t.stage for t in tasks]), "index": ints([t.index for t in tasks]),
        "needs_count": ints([len(needs) for needs in graph.needs]), "release_start": release_start,
        "release_task": release_task, "order_start": order_start, "order_task": order_task, "peer_start": peer_start,
        "peer_task": peer_task,
        "kind_class": ints([HOLD_CLASS if i in graph.holds else _KIND_CLASS.get(t.kind, -1)
                            for i, t in enumerate(tasks)]),
        "first_forward": ints([t.kind is TaskKind.FORWARD and graph.stage_chunk[t.stage] == 0 for t in tasks]),
        "rise_stage": part_stages((TaskKind.FORWARD,)), "fall_stage": part_stages(_FALLS)}


_CHAIN_KINDS = (TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT,
                TaskKind.FWD_PROP, TaskKind.GRAD_PROP)


def memory_jobs(graph: TaskGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    tasks = graph.tasks
    where = {(t.kind, t.stage, t.index): i for i, t in enumerate(tasks) if t.kind in _CHAIN_KINDS}
    rise, back, fall = [], [], []
    if not any(t.kind is TaskKind.OVERLAP_F_B for t in tasks):
        for (kind, stage, mb), i in where.items():
            if kind is TaskKind.FORWARD:
                gradient = where.get((TaskKind.BACKWARD_INPUT, stage, mb), where.get((TaskKind.BACKWARD, stage, mb)))
                assert gradient is not None
                rise.append(i)
                back.append(gradient)
                fall.append(where.get((TaskKind.BACKWARD_WEIGHT, stage, mb), gradient))
    ints = lambda values: np.array(values, dtype=np.int64)  # noqa: E731
    return ints(rise), ints(back), ints(fall), np.array([t.kind in _CHAIN_KINDS for t in tasks])
