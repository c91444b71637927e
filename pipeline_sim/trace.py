"""Chrome / Perfetto trace of a schedule (the JSON "Trace Event Format"), no plotting library needed."""

from __future__ import annotations

from .model import Schedule, TaskKind

#: Trace timestamps are microseconds; one model time unit is shown as one millisecond.
MICROSECONDS_PER_UNIT = 1000.0


def _lanes(schedule: Schedule) -> tuple[dict[int, int], dict[int, int]]:
    """Per transfer (by its place in ``schedule.tasks``), its lane on its GPU: the first whose transfers have all
    ended when it starts, as a thread's complete events must nest; and per GPU, how many lanes it has."""
    lanes: dict[int, int] = {}
    ends: dict[int, list[float]] = {}  # per GPU, the end of each lane's last transfer
    transfers = sorted((task.start, task.end, k) for k, task in enumerate(schedule.tasks) if not task.parts)
    for start, end, k in transfers:
        gpu_ends = ends.setdefault(schedule.tasks[k].gpu, [])
        lane = next((lane for lane, last in enumerate(gpu_ends) if last <= start), len(gpu_ends))
        if lane == len(gpu_ends):
            gpu_ends.append(end)
        else:
            gpu_ends[lane] = end
        lanes[k] = lane
    return lanes, {gpu: len(gpu_ends) for gpu, gpu_ends in ends.items()}


def chrome_trace(schedule: Schedule) -> dict:
    """One process per GPU; a thread for its compute and one for its transfers, with more ("communication 2", ...)
    where transfers run at once, as events on one thread must nest; one complete ("X") event per task, whose
    ``args`` carry the task's ready time, rate segments and throttling."""
    lanes, counts = _lanes(schedule)
    events: list[dict] = []
    for gpu in range(schedule.params.num_gpus):
        events.append({"ph": "M", "name": "process_name", "pid": gpu, "tid": 0, "args": {"name": f"GPU {gpu}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": gpu, "tid": 0, "args": {"sort_index": gpu}})
        for tid in range(1 + max(1, counts.get(gpu, 0))):
            name = "compute" if tid == 0 else "communication" if tid == 1 else f"communication {tid}"
            events.append({"ph": "M", "name": "thread_name", "pid": gpu, "tid": tid, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": gpu, "tid": tid, "args": {"sort_index": tid}})
    for k, task in enumerate(schedule.tasks):
        events.append({
            "ph": "X", "name": task.label, "cat": str(task.kind), "pid": task.gpu, "tid": 1 + lanes.get(k, -1),
            "ts": task.start * MICROSECONDS_PER_UNIT, "dur": (task.end - task.start) * MICROSECONDS_PER_UNIT,
            "args": {"task": str(task.id), "stage": task.stage, "receiver": task.receiver, "ready": task.ready,
                     "throttled": task.throttled, "segments": [list(segment) for segment in task.segments]},
        })
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"time_unit": "1 model time unit = 1 ms", "completion_time": schedule.completion_time,
                      "parameters": schedule.params.as_dict(), "policy": schedule.policy.label,
                      "kinds": [str(kind) for kind in TaskKind]},
    }
