"""What a deciding GPU sees of an episode's state (docs/model.md section 12.4): a fixed-size vector for a learned
scheduler, read straight off the loop's arrays (``rl.env`` names the fields)."""

from __future__ import annotations

import numpy as np

from .jit import exposed
from .state import (
    BUSY,
    END,
    HELD,
    KIND_CLASS,
    LENGTH,
    NEXT,
    RATE,
    READY,
    READY_COUNT,
    READY_QUEUE,
    REMAINING,
    SINCE,
    STEP_CLASS,
    TAKEN,
    WAITING,
)

#: Per GPU of the window: present, busy, busy_left, idle_for, held, ready per class (3), progress, sends queued,
#: send rate.
GPU_WIDTH = 11


@exposed
def observe(s: int, now: float, unit: float, memory: int, F: np.ndarray, I: np.ndarray, P: np.ndarray,
            Q: np.ndarray, order_start: np.ndarray, order_task: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out[:3 * GPU_WIDTH]`` for GPUs s - 1, s and s + 1 (zeros past either end), every figure in [0, 1]:
    times in ``unit`` (the mean compute task) capped at ten, counts capped at four."""
    p = P.shape[1]
    for slot in range(3):
        g = s + slot - 1
        base = slot * GPU_WIDTH
        for k in range(GPU_WIDTH):
            out[base + k] = 0.0
        if g < 0 or g >= p:
            continue
        out[base] = 1.0
        first, stop = order_start[g], order_start[g + 1]
        busy = P[BUSY, g]
        if busy >= 0:
            out[base + 1] = 1.0
            if F[busy, LENGTH] > 0.0:
                left = (F[busy, REMAINING] - F[busy, RATE] * (now - F[busy, SINCE])) / F[busy, LENGTH]
                out[base + 2] = min(1.0, max(0.0, left))
        else:
            since = 0.0
            for j in range(first, stop):
                end = F[order_task[j], END]
                if not np.isnan(end) and end > since:
                    since = end
            out[base + 3] = min(10.0, (now - since) / unit) / 10.0
        out[base + 4] = min(1.0, P[HELD, g] / memory)
        for j in range(first + P[NEXT, g], stop):
            task = order_task[j]
            if I[task, WAITING] == 0 and np.isnan(F[task, READY]) and I[task, KIND_CLASS] < STEP_CLASS:
                out[base + 5 + I[task, KIND_CLASS]] += 0.25
        for k in range(3):
            out[base + 5 + k] = min(1.0, out[base + 5 + k])
        out[base + 8] = P[TAKEN, g] / max(1, stop - first)
        out[base + 9] = min(1.0, P[READY_COUNT, g] / 4.0)
        rate = 0.0
        for j in range(P[READY_COUNT, g]):
            rate += F[Q[READY_QUEUE, g, j], RATE]
        out[base + 10] = min(1.0, rate)
