"""Chrome / Perfetto trace of a schedule (the JSON "Trace Event Format"), no plotting library needed."""

from __future__ import annotations

from .model import Schedule, TaskKind

#: Trace timestamps are microseconds; one model time unit is shown as one millisecond.
MICROSECONDS_PER_UNIT = 1000.0

_CHANNELS = {"compute": 0, "communication": 1}


def chrome_trace(schedule: Schedule) -> dict:
    """One process per GPU, one thread per channel, one complete ("X") event per task.

    Concurrent transfers share the communication thread; each event's ``args``
    carries the task's ready time, rate segments and throttling.
    """
    events: list[dict] = []
    for gpu in range(schedule.params.num_gpus):
        events.append({"ph": "M", "name": "process_name", "pid": gpu, "tid": 0, "args": {"name": f"GPU {gpu}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": gpu, "tid": 0, "args": {"sort_index": gpu}})
        for name, tid in _CHANNELS.items():
            events.append({"ph": "M", "name": "thread_name", "pid": gpu, "tid": tid, "args": {"name": name}})
    for task in schedule.tasks:
        channel = "compute" if task.parts else "communication"
        events.append({
            "ph": "X", "name": task.label, "cat": str(task.kind), "pid": task.gpu, "tid": _CHANNELS[channel],
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
