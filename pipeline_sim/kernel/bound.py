"""The lower bound of docs/model.md section 12.2: what no dispatcher and no order can beat."""

from __future__ import annotations

import numpy as np

from .jit import compiled
from .state import STEP_CLASS


@compiled
def path_times(length: np.ndarray, needs_count: np.ndarray, release_start: np.ndarray,
               release_task: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per task, ``head``: the earliest it can start (the longest chain of needs before it), and ``tail``: the
    least time that must follow its end (the longest chain of tasks depending on it); transfers at full speed."""
    n = len(length)
    waiting = needs_count.copy()
    order = np.empty(n, dtype=np.int64)
    count = 0
    for i in range(n):
        if waiting[i] == 0:
            order[count] = i
            count += 1
    head = np.zeros(n)
    k = 0
    while k < count:  # breadth first over the dependency graph: a topological order
        i = order[k]
        k += 1
        done = head[i] + length[i]
        for j in range(release_start[i], release_start[i + 1]):
            dependent = release_task[j]
            if done > head[dependent]:
                head[dependent] = done
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                order[count] = dependent
                count += 1
    tail = np.zeros(n)
    for k in range(count - 1, -1, -1):
        i = order[k]
        for j in range(release_start[i], release_start[i + 1]):
            dependent = release_task[j]
            after = length[dependent] + tail[dependent]
            if after > tail[i]:
                tail[i] = after
    return head, tail


@compiled
def lower_bound(length: np.ndarray, gpu: np.ndarray, comm: np.ndarray, kind_class: np.ndarray,
                needs_count: np.ndarray, release_start: np.ndarray, release_task: np.ndarray, num_gpus: int) -> float:
    """The largest of the longest dependency path and, over GPUs, earliest head + compute work + least tail. A GPU's
    optimizer step is left out of its sum: it follows every other task there, so it is in each of their tails."""
    head, tail = path_times(length, needs_count, release_start, release_task)
    bound = 0.0
    first = np.full(num_gpus, np.inf)
    last = np.full(num_gpus, np.inf)
    work = np.zeros(num_gpus)
    for i in range(len(length)):
        path = head[i] + length[i] + tail[i]
        if path > bound:
            bound = path
        if comm[i] < 0 and kind_class[i] != STEP_CLASS:
            g = gpu[i]
            work[g] += length[i]
            if head[i] < first[g]:
                first[g] = head[i]
            if tail[i] < last[g]:
                last[g] = tail[i]
    for g in range(num_gpus):
        if work[g] > 0.0 and first[g] + work[g] + last[g] > bound:
            bound = first[g] + work[g] + last[g]
    return bound
