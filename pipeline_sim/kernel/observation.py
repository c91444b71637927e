"""What a deciding GPU sees of an episode's state (docs/model.md section 12.4): a fixed-size vector for a learned
scheduler, read straight off the loop's arrays (``rl.env`` names the fields)."""

from __future__ import annotations

import numpy as np

from .jit import exposed
from .state import (
    AFTER,
    BUSY,
    CANDIDATES,
    END,
    HELD,
    KIND_CLASS,
    LAST_TAKEN,
    LENGTH,
    RATE,
    READY_COUNT,
    READY_QUEUE,
    REMAINING,
    SINCE,
    STEP_CLASS,
    TAKEN,
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
            # the latest end of its tasks: the last it took's (it runs one at a time, and free, that one has ended)
            since = 0.0
            last = P[LAST_TAKEN, g]
            if last >= 0 and F[last, END] > since:
                since = F[last, END]
            out[base + 3] = min(10.0, (now - since) / unit) / 10.0
        out[base + 4] = min(1.0, P[HELD, g] / memory)
        task = P[CANDIDATES, g]
        while task >= 0:
            if I[task, KIND_CLASS] < STEP_CLASS:
                out[base + 5 + I[task, KIND_CLASS]] += 0.25
            task = I[task, AFTER]
        for k in range(3):
            out[base + 5 + k] = min(1.0, out[base + 5 + k])
        out[base + 8] = P[TAKEN, g] / max(1, stop - first)
        out[base + 9] = min(1.0, P[READY_COUNT, g] / 4.0)
        rate = 0.0
        for j in range(P[READY_COUNT, g]):
            rate += F[Q[READY_QUEUE, g, j], RATE]
        out[base + 10] = min(1.0, rate)
