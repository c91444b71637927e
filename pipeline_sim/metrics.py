"""Figures a user wants beside the completion time, computed once from a schedule."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .model import Schedule


@dataclass(frozen=True, slots=True)
class ScheduleMetrics:
    """Summary of one schedule. Times are in the model's units.

    ``busy_time[g]`` is GPU ``g``'s compute time; its bubble fraction is the share of
    the iteration its compute channel is idle. ``throttled_time`` sums, over
    transfers, the time each ran below its sender-only share (held back by a
    receiver's ingress limit). ``ideal_time`` is the textbook 1F1B time with free
    communication, and ``slowdown`` the completion time over it.
    """

    completion_time: float
    ideal_time: float
    slowdown: float
    busy_time: tuple[float, ...]
    bubble_fraction: tuple[float, ...]
    mean_bubble_fraction: float
    max_bubble_fraction: float
    throttled_time: float
    throttled_transfers: int

    #: The scalar fields, in the order the sweep's CSV writes them.
    SCALARS = ("completion_time", "ideal_time", "slowdown", "mean_bubble_fraction", "max_bubble_fraction",
               "throttled_time", "throttled_transfers")

    def scalars(self) -> dict[str, float | int]:
        values = asdict(self)
        return {name: values[name] for name in self.SCALARS}


def schedule_metrics(schedule: Schedule) -> ScheduleMetrics:
    total = schedule.completion_time
    busy = [0.0] * schedule.params.num_gpus
    throttled_time = 0.0
    throttled = 0
    for task in schedule.tasks:
        if task.kind.is_compute:
            busy[task.gpu] += task.end - task.start
        elif task.throttled:
            throttled += 1
            throttled_time += task.throttled_time
    bubbles = tuple(1.0 - b / total for b in busy)
    ideal = schedule.params.ideal_time
    return ScheduleMetrics(
        completion_time=total, ideal_time=ideal, slowdown=total / ideal, busy_time=tuple(busy),
        bubble_fraction=bubbles, mean_bubble_fraction=sum(bubbles) / len(bubbles),
        max_bubble_fraction=max(bubbles), throttled_time=throttled_time, throttled_transfers=throttled)
