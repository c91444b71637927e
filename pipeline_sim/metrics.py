"""Figures a user wants beside the completion time, computed once from a schedule."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import lru_cache

import numpy as np

from .engine import activation_units, graph_arrays
from .kernel import figures
from .learned import LearnedPolicy, figures_of
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
def ideal_time(params: EnvParams, network: LearnedPolicy | None = None) -> float:
    """The completion time of ``params``' schedule with free communication and no jitter (a straggler kept); a
    learned dispatcher's played by ``network`` when given (``learned.load_policy``).

    For ``1f1b`` with no straggler that is ``(n + p - 1) x (fwd_len + bwd_len)``.
    Computed by the one engine, once per environment. An environment of a table of lengths is measured against its
    work parameters (the mean lengths its table's flags give), since its table's transfers are given, not free.
    """
    free = replace(params, prop_len=0.0, sync_base_len=0.0, compute_jitter=0.0, comm_jitter=0.0, lengths="")
    return float(figures_of(free, [Policy()], 0, network)[0, 0])


def metric_columns(figures: np.ndarray, ideal: float) -> dict[str, list]:
    """Per simulation (rows of ``kernel.figures``' output), every ``ScheduleMetrics`` field, as Python values.

    Per-GPU fields are tuples; ``throttled_transfers`` is an int. Sums over GPUs run in GPU order.
    """
    p = (figures.shape[1] - 3) // 3
    total = figures[:, 0]
    busy, spans, peaks = figures[:, 3:3 + p], figures[:, 3 + p:3 + 2 * p], figures[:, 3 + 2 * p:]
    bubbles = 1.0 - busy / total[:, None]
    summed = bubbles[:, 0].copy()
    for g in range(1, p):
        summed += bubbles[:, g]
    rows = lambda array: [tuple(row) for row in array.tolist()]  # noqa: E731
    return {"completion_time": total.tolist(), "ideal_time": [ideal] * len(total),
            "slowdown": (total / ideal).tolist(), "busy_time": rows(busy), "bubble_fraction": rows(bubbles),
            "mean_bubble_fraction": (summed / p).tolist(), "max_bubble_fraction": bubbles.max(axis=1).tolist(),
            "throttled_time": figures[:, 1].tolist(), "throttled_transfers": figures[:, 2].astype(int).tolist(),
            "spans": rows(spans), "max_span": spans.max(axis=1).tolist(), "gpu_peak_activations": rows(peaks),
            "peak_activations": peaks.max(axis=1).tolist()}


def schedule_metrics(schedule: Schedule) -> ScheduleMetrics:
    """The summary of one simulated schedule, by the same figures a sweep computes."""
    run = schedule.run

    def ints(values: np.ndarray) -> np.ndarray:
        array = np.array(values, dtype=np.int64)
        array.flags.writeable = False  # as the graph's arrays: one compiled signature serves both
        return array

    p = schedule.params.num_gpus
    arrays = graph_arrays(schedule.params)  # a schedule's tasks are its graph's, in order
    out = np.empty((1, 3 + 3 * p))
    figures(ints(run.gpu), ints(np.where(run.part_kind[:, 0] >= 0, -1, 0)), arrays.rises, arrays.falls, p,
            activation_units(schedule.params), np.array(run.start), np.array(run.end),
            run.throttled.astype(np.int64), np.array(run.throttled_time), out[0])
    columns = metric_columns(out, ideal_time(schedule.params))
    return ScheduleMetrics(**{name: values[0] for name, values in columns.items()})
