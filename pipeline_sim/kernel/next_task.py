"""The choice of a GPU's next compute task, made when its compute channel is free."""

from __future__ import annotations

import numpy as np

from .jit import inner
from .state import NEXT, WAITING


@inner
def take_next(s: int, I: np.ndarray, P: np.ndarray, order_start: np.ndarray, order_task: np.ndarray) -> int:
    """The compute task GPU s starts now, taken off its order, or -1 when it must wait.

    The static order (section 2): the GPU's next listed task, once every need is met.
    """
    position = P[NEXT, s]
    if position >= order_start[s + 1] - order_start[s]:
        return -1
    task = order_task[order_start[s] + position]
    if I[WAITING, task] > 0:
        return -1
    P[NEXT, s] = position + 1
    return task
