"""A reference for docs/model.md section 12, written from the text in plain Python: no kernel, no arrays.

It runs one iteration with free communication (every transfer and gradient sync of no
work, so no port is ever shared and every compute task runs at full speed), which leaves
exactly what a dispatcher decides: which ready, admissible task a free GPU starts, and
when. The tests hold the kernel to it on random environments.
"""

import math

from pipeline_sim.model import TaskKind
from pipeline_sim.taskgraph import build_task_graph, task_lengths

CLASS = {TaskKind.BACKWARD: 0, TaskKind.BACKWARD_INPUT: 0, TaskKind.FORWARD: 1, TaskKind.BACKWARD_WEIGHT: 2}


def remaining_paths(graph, lengths):
    """Per task, its work plus the longest chain of work that depends on it."""
    dependents = [[] for _ in graph.tasks]
    for i, needs in enumerate(graph.needs):
        for j in needs:
            dependents[j].append(i)
    memo = {}

    def path(i):
        if i not in memo:
            memo[i] = lengths[i] + max((path(j) for j in dependents[i]), default=0.0)
        return memo[i]

    return [path(i) for i in range(len(graph.tasks))]


def run(params, sample, memory_limit):
    """Every task's (start, end) and the completion time, under ``params.dispatch`` within ``memory_limit``."""
    assert params.prop_len == 0 and params.sync_base_len == 0
    graph = build_task_graph(params, sample)
    tasks = graph.tasks
    lengths = list(task_lengths(params, sample))
    expected = remaining_paths(graph, [t.length for t in build_task_graph(params.__class__(
        **{**params.as_dict(), "compute_jitter": 0.0, "comm_jitter": 0.0})).tasks])
    p, v = params.num_gpus, params.v
    share = [graph.stage_gpu.count(g) for g in range(p)]
    units = math.floor(memory_limit * v + 1e-9)
    start, end = [None] * len(tasks), [None] * len(tasks)
    busy = [None] * p
    held = [0] * p
    position = [0] * p

    def reserve(i):
        t = tasks[i]
        return share[t.gpu] if t.kind is TaskKind.FORWARD and graph.stage_chunk[t.stage] == 0 else 0

    def falls(i):
        return sum(part.kind in (TaskKind.BACKWARD, TaskKind.BACKWARD_WEIGHT) for part in tasks[i].parts)

    def ready(i):
        return start[i] is None and all(end[j] is not None for j in graph.needs[i])

    def key(i):
        t = tasks[i]
        first = -expected[i] if params.dispatch == "critical-path" else 0.0
        return (first, CLASS[t.kind], t.index, t.stage)

    def choose(g):
        if params.dispatch == "static":
            order = graph.orders[g]
            if position[g] < len(order) and ready(order[position[g]]):
                position[g] += 1
                return order[position[g] - 1]
            return None
        candidates, held_back = [], False
        for i in graph.orders[g]:
            if ready(i):
                if reserve(i) and held[g] + reserve(i) > units:
                    held_back = True
                else:
                    candidates.append(i)
        weights = [i for i in candidates if tasks[i].kind is TaskKind.BACKWARD_WEIGHT]
        if params.dispatch == "zb-adaptive" and held_back and weights:
            return min(weights, key=key)
        return min(candidates, key=key) if candidates else None

    def settle(now):
        """Transfers of no work end with what they wait for; free GPUs decide, lowest first, until none can."""
        while True:
            changed = False
            for i, t in enumerate(tasks):
                if not t.parts and start[i] is None and all(end[j] is not None for j in graph.needs[i]):
                    start[i] = end[i] = now
                    changed = True
            for g in range(p):
                if busy[g] is None:
                    i = choose(g)
                    if i is not None:
                        start[i] = now
                        held[g] += reserve(i)
                        assert held[g] <= max(units, 10 ** 9 if params.dispatch == "static" else units)
                        if lengths[i] == 0.0:
                            end[i] = now
                            held[g] -= falls(i)
                        else:
                            busy[g] = i
                        changed = True
                        break  # the lowest GPU decided: readiness may have changed, start over
            if not changed:
                return

    settle(0.0)
    while any(b is not None for b in busy):
        now = min(start[b] + lengths[b] for b in busy if b is not None)
        limit = now + 1e-9 * max(1.0, abs(now))
        for g in range(p):
            b = busy[g]
            if b is not None and start[b] + lengths[b] <= limit:
                end[b] = now
                held[g] -= falls(b)
                busy[g] = None
        settle(now)
    assert all(e is not None for e in end), "the reference got stuck"
    return start, end, max(end)
