"""The lower bound of docs/model.md section 12.2: what no dispatcher and no order can beat."""

from __future__ import annotations

import numpy as np

from .jit import compiled, internal
from .sorting import stable_order
from .state import STEP_CLASS


@internal
def topological(needs_count: np.ndarray, release_start: np.ndarray, release_task: np.ndarray) -> np.ndarray:
    """The tasks breadth first over the dependency graph: each after every task it needs."""
    n = len(needs_count)
    waiting = needs_count.copy()
    order = np.empty(n, dtype=np.int64)
    count = 0
    for i in range(n):
        if waiting[i] == 0:
            order[count] = i
            count += 1
    k = 0
    while k < count:
        i = order[k]
        k += 1
        for j in range(release_start[i], release_start[i + 1]):
            dependent = release_task[j]
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                order[count] = dependent
                count += 1
    return order[:count]


@compiled
def path_times(length: np.ndarray, needs_count: np.ndarray, release_start: np.ndarray,
               release_task: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per task, ``head``: the earliest it can start (the longest chain of needs before it), and ``tail``: the
    least time that must follow its end (the longest chain of tasks depending on it); transfers at full speed."""
    n = len(length)
    order = topological(needs_count, release_start, release_task)
    count = len(order)
    head = np.empty(n)
    head[:] = 0.0
    for k in range(count):
        i = order[k]
        done = head[i] + length[i]
        for j in range(release_start[i], release_start[i + 1]):
            dependent = release_task[j]
            if done > head[dependent]:
                head[dependent] = done
    tail = np.empty(n)
    tail[:] = 0.0
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
    first = np.empty(num_gpus)
    last = np.empty(num_gpus)
    work = np.empty(num_gpus)
    first[:] = np.inf
    last[:] = np.inf
    work[:] = 0.0
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


@compiled
def memory_bound(length: np.ndarray, needs_count: np.ndarray, release_start: np.ndarray, release_task: np.ndarray,
                 gpu: np.ndarray, index: np.ndarray, chain: np.ndarray, job_rise: np.ndarray, job_back: np.ndarray,
                 job_fall: np.ndarray, room: np.ndarray, limit: int, num_gpus: int) -> float:
    """The memory term of section 12.2: per GPU, the latest start its forwards can be held to when at most
    ``limit // room`` of its micro-batch stages are in flight, plus what must follow the last of them.

    A job is one micro-batch on one stage: it holds ``room`` units from its forward's start (``job_rise``) until its
    backward or weight-gradient work ends (``job_fall``); ``job_back`` is its input-gradient task (B or I). Its hold
    and the offset of its backward work are longest paths through the tasks of its own micro-batch (``chain`` marks
    the per-micro-batch tasks, ``index`` their micro-batch): a path through fewer tasks is shorter, so still a bound.
    """
    head, tail = path_times(length, needs_count, release_start, release_task)
    tasks = len(length)
    order = topological(needs_count, release_start, release_task)  # each micro-batch's tasks in this order
    batches = 0
    for i in range(tasks):
        if chain[i] and index[i] + 1 > batches:
            batches = index[i] + 1
    batch_start = np.empty(batches + 1, dtype=np.int64)
    batch_start[:] = 0
    for i in range(tasks):
        if chain[i]:
            batch_start[index[i] + 1] += 1
    for m in range(batches):
        batch_start[m + 1] += batch_start[m]
    filled = batch_start[:-1].copy()
    batch_task = np.empty(batch_start[batches], dtype=np.int64)
    position = np.empty(tasks, dtype=np.int64)
    position[:] = -1
    for k in range(len(order)):
        i = order[k]
        if chain[i]:
            position[i] = filled[index[i]]
            batch_task[filled[index[i]]] = i
            filled[index[i]] += 1
    jobs = len(job_rise)
    hold = np.empty(jobs)
    offset = np.empty(jobs)
    reach = np.empty(tasks)
    hold[:] = 0.0
    offset[:] = 0.0
    reach[:] = -np.inf
    for j in range(jobs):
        rise = job_rise[j]
        m = index[rise]
        reach[rise] = 0.0
        for k in range(position[rise], batch_start[m + 1]):
            i = batch_task[k]
            if reach[i] == -np.inf:
                continue
            done = reach[i] + length[i]
            for e in range(release_start[i], release_start[i + 1]):
                dependent = release_task[e]
                if chain[dependent] and index[dependent] == m and done > reach[dependent]:
                    reach[dependent] = done
        offset[j] = reach[job_back[j]]
        hold[j] = reach[job_fall[j]] + length[job_fall[j]]
        for k in range(batch_start[m], batch_start[m + 1]):
            reach[batch_task[k]] = -np.inf
    bound = 0.0
    for g in range(num_gpus):
        count = 0
        smallest_room = np.inf
        for j in range(jobs):
            if gpu[job_rise[j]] == g:
                count += 1
                smallest_room = min(smallest_room, room[j])
        if count == 0 or smallest_room <= 0:
            continue
        slots = int(limit // smallest_room)
        if slots < 1 or count <= slots:
            continue
        release = np.empty(count)
        forwards = np.empty(count)
        backs = np.empty(count)
        holds = np.empty(count)
        hold_min = offset_min = finish = np.inf
        c = 0
        for j in range(jobs):
            if gpu[job_rise[j]] == g:
                release[c] = head[job_rise[j]]
                forwards[c] = length[job_rise[j]]
                backs[c] = length[job_fall[j]] + (length[job_back[j]] if job_back[j] != job_fall[j] else 0.0)
                holds[c] = hold[j]
                c += 1
                hold_min = min(hold_min, hold[j])
                offset_min = min(offset_min, offset[j])
                finish = min(finish, hold[j] + tail[job_fall[j]])
        release = release[stable_order(release)]
        forwards = forwards[stable_order(forwards)]
        backs = backs[stable_order(backs)]
        holds = holds[stable_order(holds)]
        # the least work of any k forwards, of any k jobs' backward work, of any k holds: running sums, element by
        # element (a slice assignment would compile a shape check and its error message)
        forward_work = np.empty(count + 1)
        back_work = np.empty(count + 1)
        hold_work = np.empty(count + 1)
        forward_work[:] = 0.0
        back_work[:] = 0.0
        hold_work[:] = 0.0
        for k in range(count):
            forward_work[k + 1] = forward_work[k] + forwards[k]
            back_work[k + 1] = back_work[k] + backs[k]
            hold_work[k + 1] = hold_work[k] + holds[k]
        start = np.empty(count)  # a lower bound on the k-th earliest forward start of a job on GPU g
        start[0] = release[0]
        for k in range(1, count):
            # one compute task at a time; the k-th start waits for k + 1 - slots holds to end, at most slots at a
            # time since the first start; and no backward work of a job starts before the first start plus the least
            # offset, while at most slots jobs start before then: from that instant the GPU runs k + 1 - slots jobs'
            # backward work and k - slots forwards
            start[k] = max(release[k], start[0] + forward_work[k])
            if k >= slots:
                start[k] = max(start[k], start[k - slots] + hold_min, start[0] + hold_work[k + 1 - slots] / slots,
                               start[0] + offset_min + back_work[k + 1 - slots] + forward_work[k - slots])
        bound = max(bound, start[count - 1] + finish)
    return bound
