"""Figures a user wants beside the completion time, computed once from a schedule."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import lru_cache

from .model import EnvParams, Policy, Schedule


@dataclass(frozen=True, slots=True)
class ScheduleMetrics:
    """Summary of one schedule. Times are in the model's units.

    ``busy_time[g]`` is GPU ``g``'s compute time; its bubble fraction is the share of
    the iteration its compute channel is idle. ``throttled_time`` sums, over
    transfers, the time each ran below its sender-only share (held back by a
    receiver's ingress limit). ``ideal_time`` is the same schedule's time with free
    communication (``ideal_time``), and ``slowdown`` the completion time over it.
    ``spans[g]`` runs from GPU ``g``'s first compute start to its last compute end;
    ``gpu_peak_activations[g]`` is its most activations in flight, in micro-batches of
    its whole share of the model (docs/model.md section 7); ``max_span`` and
    ``peak_activations`` are the largest over GPUs.
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
    spans: tuple[float, ...]
    max_span: float
    gpu_peak_activations: tuple[float, ...]
    peak_activations: float

    #: The scalar fields, in the order the sweep's CSV writes them.
    SCALARS = ("completion_time", "ideal_time", "slowdown", "mean_bubble_fraction", "max_bubble_fraction",
               "throttled_time", "throttled_transfers", "max_span", "peak_activations")

    def scalars(self) -> dict[str, float | int]:
        values = asdict(self)
        return {name: values[name] for name in self.SCALARS}


@lru_cache(maxsize=1024)
def ideal_time(params: EnvParams) -> float:
    """The completion time of ``params``' schedule with free communication and no jitter (a straggler kept).

    For ``1f1b`` with no straggler that is ``(n + p - 1) x (fwd_len + bwd_len)``.
    Computed by the one engine, once per environment.
    """
    from .engine import simulate

    free = replace(params, prop_len=0.0, sync_base_len=0.0, compute_jitter=0.0, comm_jitter=0.0)
    return simulate(free, Policy()).completion_time


def schedule_metrics(schedule: Schedule) -> ScheduleMetrics:
    total = schedule.completion_time
    busy = [0.0] * schedule.params.num_gpus
    throttled_time = 0.0
    throttled = 0
    for task in schedule.tasks:
        if task.parts:
            busy[task.gpu] += task.end - task.start
        elif task.throttled:
            throttled += 1
            throttled_time += task.throttled_time
    bubbles = tuple(1.0 - b / total for b in busy)
    ideal = ideal_time(schedule.params)
    spans, peaks = tuple(schedule.spans), tuple(schedule.peak_activations)
    return ScheduleMetrics(
        completion_time=total, ideal_time=ideal, slowdown=total / ideal, busy_time=tuple(busy),
        bubble_fraction=bubbles, mean_bubble_fraction=sum(bubbles) / len(bubbles),
        max_bubble_fraction=max(bubbles), throttled_time=throttled_time, throttled_transfers=throttled,
        spans=spans, max_span=max(spans), gpu_peak_activations=peaks, peak_activations=max(peaks))
