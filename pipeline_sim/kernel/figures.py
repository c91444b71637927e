"""The per-simulation figures a sweep keeps, from every task's start and end."""

from __future__ import annotations

import numpy as np

from .jit import compiled
from .sorting import stable_order


@compiled
def figures(gpu: np.ndarray, comm: np.ndarray, rises: np.ndarray, falls: np.ndarray,
            num_gpus: int, units: int, start: np.ndarray, end: np.ndarray, throttled: np.ndarray,
            throttled_time: np.ndarray, out: np.ndarray) -> None:
    """The per-simulation figures a sweep keeps, into ``out``: completion time, throttled time, throttled
    transfers, then per GPU its compute time, span and peak activations (``3 + 3 x num_gpus`` values).

    Sums run in task order. Activations (section 7): ``rises[i]`` units rise when task i
    starts (its forward part), ``falls[i]`` fall when it ends (its backward or
    weight-gradient part); at one instant falls come first; peaks are in micro-batches
    of a GPU's whole share, ``units`` of them.
    """
    n = len(gpu)
    completion = -np.inf
    throttle_sum = 0.0
    throttle_count = 0
    busy = out[3:3 + num_gpus]
    span = out[3 + num_gpus:3 + 2 * num_gpus]
    peak = out[3 + 2 * num_gpus:3 + 3 * num_gpus]
    first = np.empty(num_gpus)
    last = np.empty(num_gpus)
    first[:] = np.inf
    last[:] = -np.inf
    busy[:] = 0.0
    events = 0
    for i in range(n):
        if end[i] > completion:
            completion = end[i]
        if comm[i] < 0:
            busy[gpu[i]] += end[i] - start[i]
            if start[i] < first[gpu[i]]:
                first[gpu[i]] = start[i]
            if end[i] > last[gpu[i]]:
                last[gpu[i]] = end[i]
            if rises[i] > 0:
                events += 1
            if falls[i] > 0:
                events += 1
        elif throttled[i] == 1:
            throttle_count += 1
            throttle_sum += throttled_time[i]
    times = np.empty(events)
    owners = np.empty(events, dtype=np.int64)
    deltas = np.empty(events, dtype=np.int64)
    k = 0
    for i in range(n):  # falls first, so that a stable sort by time keeps them before rises at one instant
        if comm[i] < 0 and falls[i] > 0:
            times[k], owners[k], deltas[k] = end[i], gpu[i], -falls[i]
            k += 1
    for i in range(n):
        if comm[i] < 0 and rises[i] > 0:
            times[k], owners[k], deltas[k] = start[i], gpu[i], rises[i]
            k += 1
    level = np.empty(num_gpus, dtype=np.int64)
    highest = np.empty(num_gpus, dtype=np.int64)
    level[:] = 0
    highest[:] = 0
    for k in stable_order(times):
        h = owners[k]
        level[h] += deltas[k]
        if level[h] > highest[h]:
            highest[h] = level[h]
    for h in range(num_gpus):
        span[h] = last[h] - first[h]
        peak[h] = highest[h] / units
    out[0] = completion
    out[1] = throttle_sum
    out[2] = throttle_count


