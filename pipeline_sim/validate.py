"""Invariant checks of a simulated schedule against its task graph, for tests and for users who extend the model.

Each check is a function of its own, listed in ``CHECKS``; ``validate_schedule`` runs
them all. None of them knows which schedule produced the graph.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from typing import Callable

from .model import Schedule, Task
from .taskgraph import TaskGraph, build_task_graph


def _peak_load(intervals: list[tuple[float, float, float]]) -> float:
    """Highest summed rate of ``(t0, t1, rate)`` intervals at any instant."""
    changes = sorted([(t0, rate) for t0, _, rate in intervals] + [(t1, -rate) for _, t1, rate in intervals])
    peak = load = 0.0
    for _, delta in changes:  # at equal times the decreases sort first
        load += delta
        peak = max(peak, load)
    return peak


def check_task_set(schedule: Schedule, graph: TaskGraph, tol: float) -> list[str]:
    """Every task of the graph appears once, as the graph describes it and in its order (the checks rely on it)."""
    expected = [(t.kind, t.gpu, t.stage, t.index, t.parts, t.receiver) for t in graph.tasks]
    got = [(t.kind, t.gpu, t.stage, t.index, t.parts, t.receiver) for t in schedule.tasks]
    if got == expected:
        return []
    missing = sorted(str(Task(*key[:4], 0.0, key[5], key[4]).id) for key in set(expected) - set(got))
    extra = sorted(str(Task(*key[:4], 0.0, key[5], key[4]).id) for key in set(got) - set(expected))
    return [f"task set is wrong: missing {missing[:5]}, unexpected {extra[:5]}, "
            f"{len(got) - len(set(got))} duplicated, or out of the graph's order"]


def check_work(schedule: Schedule, graph: TaskGraph, tol: float) -> list[str]:
    """ready <= start <= end; segments lie in [start, end] in order at rates in (0, 1]; they integrate to the length."""
    errors = []
    for task, spec in zip(schedule.tasks, graph.tasks):
        if not task.ready - tol <= task.start <= task.end + tol:
            errors.append(f"{task.id}: not ready <= start <= end ({task.ready}, {task.start}, {task.end})")
        work = 0.0
        previous_end = task.start
        for t0, t1, rate in task.segments:
            if t0 < previous_end - tol or t1 < t0 or t1 > task.end + tol or not 0.0 < rate <= 1.0 + tol:
                errors.append(f"{task.id}: segment {(t0, t1, rate)} overlaps, lies outside [start, end] "
                              f"or has a bad rate")
            work += (t1 - t0) * rate
            previous_end = t1
        if abs(work - spec.length) > tol * max(1.0, spec.length) or task.length != spec.length:
            errors.append(f"{task.id}: work done {work} differs from its length {spec.length}")
        if spec.length == 0.0 and not task.ready == task.start == task.end:
            errors.append(f"{task.id}: a zero-length task must end the instant it is ready")
    return errors


def check_readiness(schedule: Schedule, graph: TaskGraph, tol: float) -> list[str]:
    """A transfer is ready the instant the last task it waits for ends; one that a compute task's start issues, the
    instant that task starts (at time 0 when nothing issues it)."""
    errors = []
    for i, (task, needs) in enumerate(zip(schedule.tasks, graph.needs)):
        if task.parts:
            continue
        if i in graph.issued_by:
            issuer = graph.issued_by[i]
            when, what = (0.0, "time 0") if issuer < 0 else (schedule.tasks[issuer].start,
                                                              f"{schedule.tasks[issuer].id} started")
        else:
            producer = max((schedule.tasks[j] for j in needs), key=lambda t: t.end)
            when, what = producer.end, f"{producer.id} ended"
        if abs(task.ready - when) > tol:
            errors.append(f"{task.id}: ready at {task.ready}, but {what} at {when}")
    return errors


def check_dependencies(schedule: Schedule, graph: TaskGraph, tol: float) -> list[str]:
    """No compute task starts before every task it needs has ended."""
    errors = []
    for task, needs in zip(schedule.tasks, graph.needs):
        for producer in (schedule.tasks[i] for i in needs):
            if task.parts and task.start < producer.end - tol:
                errors.append(f"{task.id}: started at {task.start}, before {producer.id} ended at {producer.end}")
    return errors


def check_order(schedule: Schedule, graph: TaskGraph, tol: float) -> list[str]:
    """Each GPU runs exactly its order, one task at a time, each as soon as its predecessor, its needs and the
    all-to-alls holding the GPU (docs/model.md section 16) allow.

    Under a dispatcher, or with an order given, the order is the one that ran, which must hold exactly the GPU's
    tasks (section 12.1). A dispatcher that may wait (``EnvParams.may_wait``) starts a task later than that only
    at an event: the instant something ends."""
    errors = []
    events = sorted({task.end for task in schedule.tasks}) if schedule.params.may_wait else []
    orders = graph.orders
    holds: dict[int, list[int]] = defaultdict(list)  # a compute task: the all-to-alls its end issues
    for h in graph.holds:
        holds[graph.needs[h][0]].append(h)
    if schedule.params.dispatch != "static" or schedule.given_order:
        orders = schedule.orders
        errors += [f"GPU {gpu}: the dispatcher's order does not hold exactly its tasks"
                   for gpu, (took, own) in enumerate(zip(orders, graph.orders)) if sorted(took) != sorted(own)]
    for gpu, order in enumerate(orders):
        place = {i: k for k, i in enumerate(order)}  # tasks of no work at one instant may run in either order
        ran = [schedule.tasks[i] for i in sorted((i for i, t in enumerate(schedule.tasks) if t.parts and t.gpu == gpu),
                                                 key=lambda i: (schedule.tasks[i].start, schedule.tasks[i].end,
                                                                place.get(i, -1)))]
        expected = [str(schedule.tasks[i].id) for i in order]
        if [str(t.id) for t in ran] != expected:
            first = next(i for i, (a, b) in enumerate(zip([str(t.id) for t in ran] + [""], expected + [""]))
                         if a != b)
            errors.append(f"GPU {gpu}: runs {[str(t.id) for t in ran][first:first + 3]} where its order has "
                          f"{expected[first:first + 3]}")
            continue
        previous_end = held = 0.0
        for i in order:
            task = schedule.tasks[i]
            ready = max([previous_end, held] + [schedule.tasks[j].end for j in graph.needs[i]])
            if task.start < previous_end - tol:
                errors.append(f"{task.id}: started at {task.start}, before its predecessor ended at {previous_end}")
            elif task.start < held - tol:
                errors.append(f"{task.id}: started at {task.start}, while an all-to-all held its GPU until {held}")
            elif task.start > ready + tol and not _at_event(task.start, events, tol):
                errors.append(f"{task.id}: started at {task.start}, although it could start at {ready}")
            previous_end = task.end
            held = max([held, *(schedule.tasks[h].end for h in holds.get(i, ()))])
    return errors


def _at_event(time: float, events: list[float], tol: float) -> bool:
    """Whether ``time`` lies within ``tol`` of one of ``events`` (sorted)."""
    k = bisect.bisect_left(events, time - tol)
    return k < len(events) and events[k] <= time + tol


def _port_loads(schedule: Schedule, receiving: bool) -> dict[int, list[tuple[float, float, float]]]:
    loads: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for task in schedule.tasks:
        if task.parts:
            continue
        gpu = task.receiver if receiving else task.gpu
        if gpu is not None:
            loads[gpu].extend(task.segments)
    return loads


def check_egress(schedule: Schedule, graph: TaskGraph, tol: float) -> list[str]:
    """The transfers a GPU sends never add up to more than its port (1)."""
    return [f"GPU {gpu}: egress reaches {peak}, above its capacity 1"
            for gpu, intervals in sorted(_port_loads(schedule, receiving=False).items())
            if (peak := _peak_load(intervals)) > 1.0 + 1e-6]


def check_ingress(schedule: Schedule, graph: TaskGraph, tol: float) -> list[str]:
    """The activations and gradients a GPU receives, from any sender, never exceed ``ingress_capacity``."""
    capacity = schedule.params.ingress_capacity
    return [f"GPU {gpu}: ingress reaches {peak}, above its capacity {capacity}"
            for gpu, intervals in sorted(_port_loads(schedule, receiving=True).items())
            if (peak := _peak_load(intervals)) > capacity * (1.0 + 1e-6)]


def check_memory(schedule: Schedule, graph: TaskGraph, tol: float) -> list[str]:
    """No GPU holds more activations in flight than the memory limit in force (sections 7 and 12.1)."""
    return [f"GPU {gpu}: {peak:g} activations in flight, above the memory limit {schedule.memory_limit:g}"
            for gpu, steps in enumerate(schedule.activation_steps())
            if (peak := max(level for _, level in steps)) > schedule.memory_limit + 1e-9]


def check_completion(schedule: Schedule, graph: TaskGraph, tol: float) -> list[str]:
    """The completion time is the last end."""
    last_end = max(task.end for task in schedule.tasks)
    if abs(schedule.completion_time - last_end) > tol or not math.isfinite(schedule.completion_time):
        return [f"completion time {schedule.completion_time} is not the last end {last_end}"]
    return []


CHECKS: tuple[Callable[[Schedule, TaskGraph, float], list[str]], ...] = (
    check_task_set, check_work, check_readiness, check_dependencies, check_order, check_memory, check_egress,
    check_ingress, check_completion)


def validate_schedule(schedule: Schedule, tolerance: float = 1e-6) -> list[str]:
    """Return every violated invariant of ``schedule`` as a sentence; empty when it is sound.

    ``tolerance`` is relative to the completion time, or to the environment's time unit
    when the whole iteration is shorter (docs/model.md section 9). When the task set
    itself is wrong, only that is reported.
    """
    graph = build_task_graph(schedule.params, schedule.sample)
    tol = tolerance * max(schedule.params.time_unit, schedule.completion_time)
    errors = check_task_set(schedule, graph, tol)
    if errors:
        return errors
    for check in CHECKS:
        if check is not check_task_set:
            errors.extend(check(schedule, graph, tol))
    return errors
