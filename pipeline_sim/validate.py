"""Invariant checks of a simulated schedule, for tests and for users who extend the model."""

from __future__ import annotations

from collections import defaultdict

from .model import Schedule, Task, TaskId, TaskKind, one_f_one_b_order, sync_points


def _expected_ids(schedule: Schedule) -> set[TaskId]:
    params = schedule.params
    p, n = params.num_gpus, params.n
    ids = set()
    for s in range(p):
        for m in range(n):
            ids.add(TaskId(TaskKind.FORWARD, s, m))
            ids.add(TaskId(TaskKind.BACKWARD, s, m))
            if s < p - 1:
                ids.add(TaskId(TaskKind.FWD_PROP, s, m))
            if s > 0:
                ids.add(TaskId(TaskKind.GRAD_PROP, s, m))
        ids.update(TaskId(TaskKind.GRAD_SYNC, s, k) for k in range(len(sync_points(n, params.sync_freq))))
    return ids


def _check_task(task: Task, tol: float) -> list[str]:
    errors = []
    if not task.ready - tol <= task.start <= task.end + tol:
        errors.append(f"{task.id}: not ready <= start <= end ({task.ready}, {task.start}, {task.end})")
    work = 0.0
    previous_end = task.start
    for t0, t1, rate in task.segments:
        if t0 < previous_end - tol or t1 < t0 or t1 > task.end + tol or not 0.0 < rate <= 1.0 + tol:
            errors.append(f"{task.id}: segment {(t0, t1, rate)} overlaps, lies outside [start, end] or has a bad rate")
        work += (t1 - t0) * rate
        previous_end = t1
    if abs(work - task.length) > tol * max(1.0, task.length):
        errors.append(f"{task.id}: work done {work} differs from its length {task.length}")
    if task.length == 0.0 and not task.ready == task.start == task.end:
        errors.append(f"{task.id}: a zero-length task must end the instant it is ready")
    return errors


def _peak_load(intervals: list[tuple[float, float, float]]) -> float:
    """Highest summed rate of ``(t0, t1, rate)`` intervals at any instant."""
    changes = sorted([(t0, rate) for t0, _, rate in intervals] + [(t1, -rate) for _, t1, rate in intervals])
    peak = load = 0.0
    for _, delta in changes:  # at equal times the decreases sort first
        load += delta
        peak = max(peak, load)
    return peak


def validate_schedule(schedule: Schedule, tolerance: float = 1e-6) -> list[str]:
    """Return every violated invariant of ``schedule`` as a sentence; empty when it is sound.

    Checked: the task set is complete, each transfer is ready when its producer ends,
    dependencies are respected, each compute channel runs its tasks one at a time in
    1F1B order and starts each as soon as it may, every task's segments integrate to
    its length, egress and ingress never exceed their capacity, and the completion
    time is the last end. ``tolerance`` is relative to the completion time.
    """
    params = schedule.params
    tol = tolerance * max(1.0, schedule.completion_time)
    tasks = schedule.by_id()
    errors = []
    expected = _expected_ids(schedule)
    if set(tasks) != expected or len(tasks) != len(schedule.tasks):
        missing = sorted(map(str, expected - set(tasks)))
        extra = sorted(map(str, set(tasks) - expected))
        return [f"task set is wrong: missing {missing[:5]}, unexpected {extra[:5]}, "
                f"{len(schedule.tasks) - len(tasks)} duplicated"]
    for task in schedule.tasks:
        errors.extend(_check_task(task, tol))

    p, n = params.num_gpus, params.n
    get = lambda kind, s, i: tasks[TaskId(kind, s, i)]  # noqa: E731
    syncs = sync_points(n, params.sync_freq)
    for s in range(p):
        for m in range(n):
            fwd, bwd = get(TaskKind.FORWARD, s, m), get(TaskKind.BACKWARD, s, m)
            producers = []
            if s < p - 1:
                producers.append((get(TaskKind.FWD_PROP, s, m), fwd))
            if s > 0:
                producers.append((get(TaskKind.GRAD_PROP, s, m), bwd))
            for comm, producer in producers:
                if abs(comm.ready - producer.end) > tol:
                    errors.append(f"{comm.id}: ready at {comm.ready}, but {producer.id} ended at {producer.end}")
        for k, m in enumerate(syncs):
            sync, bwd = get(TaskKind.GRAD_SYNC, s, k), get(TaskKind.BACKWARD, s, m)
            if abs(sync.ready - bwd.end) > tol:
                errors.append(f"{sync.id}: ready at {sync.ready}, but {bwd.id} ended at {bwd.end}")

        previous_end = 0.0
        for kind, m in one_f_one_b_order(s, n, p):
            task = get(kind, s, m)
            if kind is TaskKind.FORWARD:
                dependency = get(TaskKind.FWD_PROP, s - 1, m) if s > 0 else None
            else:
                dependency = get(TaskKind.GRAD_PROP, s + 1, m) if s < p - 1 else get(TaskKind.FORWARD, s, m)
            earliest = max(previous_end, dependency.end if dependency else 0.0)
            if abs(task.start - earliest) > tol:
                what = f"{dependency.id} ended at {dependency.end}, " if dependency else ""
                errors.append(f"{task.id}: started at {task.start}; {what}its 1F1B predecessor at {previous_end}")
            previous_end = task.end

    egress, ingress = defaultdict(list), defaultdict(list)
    for task in schedule.tasks:
        if task.kind.is_compute:
            continue
        egress[task.gpu].extend(task.segments)
        if task.kind is TaskKind.FWD_PROP:
            ingress[task.gpu + 1].extend(task.segments)
        elif task.kind is TaskKind.GRAD_PROP:
            ingress[task.gpu - 1].extend(task.segments)
    for gpu, intervals in sorted(egress.items()):
        if (peak := _peak_load(intervals)) > 1.0 + tolerance:
            errors.append(f"GPU {gpu}: egress reaches {peak}, above its capacity 1")
    for gpu, intervals in sorted(ingress.items()):
        if (peak := _peak_load(intervals)) > params.ingress_capacity * (1.0 + tolerance):
            errors.append(f"GPU {gpu}: ingress reaches {peak}, above its capacity {params.ingress_capacity}")

    last_end = max(task.end for task in schedule.tasks)
    if abs(schedule.completion_time - last_end) > tol:
        errors.append(f"completion time {schedule.completion_time} is not the last end {last_end}")
    return errors
