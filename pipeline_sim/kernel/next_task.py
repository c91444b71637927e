"""The choice of a GPU's next compute task, made when its compute channel is free (docs/model.md sections 2, 12)."""

from __future__ import annotations

import numpy as np

from .jit import inner
from .state import (
    DISPATCH_KEY,
    HELD,
    INDEX,
    KIND_CLASS,
    NEXT,
    READY,
    RESERVE,
    STAGE,
    WAITING,
    WEIGHT_CLASS,
    ZB_ADAPTIVE,
)


@inner
def take_next(s: int, I: np.ndarray, P: np.ndarray, order_start: np.ndarray, order_task: np.ndarray) -> int:
    """The compute task GPU s starts now under its static order, taken off the order, or -1 when it must wait:
    the GPU's next listed task, once every need is met."""
    position = P[NEXT, s]
    if position >= order_start[s + 1] - order_start[s]:
        return -1
    task = order_task[order_start[s] + position]
    if I[WAITING, task] > 0:
        return -1
    P[NEXT, s] = position + 1
    return task


@inner
def _before(a: int, b: int, F: np.ndarray, I: np.ndarray) -> bool:
    """Whether a dispatcher prefers task a to task b: the rule's key (lowest first), then backward work before
    F before W, then the lowest micro-batch, then the lowest stage."""
    if F[DISPATCH_KEY, a] != F[DISPATCH_KEY, b]:
        return F[DISPATCH_KEY, a] < F[DISPATCH_KEY, b]
    if I[KIND_CLASS, a] != I[KIND_CLASS, b]:
        return I[KIND_CLASS, a] < I[KIND_CLASS, b]
    if I[INDEX, a] != I[INDEX, b]:
        return I[INDEX, a] < I[INDEX, b]
    return I[STAGE, a] < I[STAGE, b]


@inner
def dispatch(s: int, rule: int, memory: int, F: np.ndarray, I: np.ndarray, P: np.ndarray, order_start: np.ndarray,
             order_task: np.ndarray) -> int:
    """The compute task a dispatcher starts on GPU s now, or -1 when none is ready and admissible (section 12.1).

    Candidates are the GPU's tasks not yet taken (``READY`` is set when one is) whose needs are met. An F that
    starts a micro-batch on the GPU is admissible while the room held plus its ``RESERVE`` stays within
    ``memory`` (in 1/v units). ``zb-adaptive`` runs a ready W first when the limit holds an F back.
    """
    first, stop = order_start[s], order_start[s + 1]
    position = P[NEXT, s]  # every task before it has been taken
    while first + position < stop and not np.isnan(F[READY, order_task[first + position]]):
        position += 1
    P[NEXT, s] = position
    best = -1
    weight = -1
    held_back = False
    for j in range(first + position, stop):
        task = order_task[j]
        if I[WAITING, task] > 0 or not np.isnan(F[READY, task]):
            continue
        if I[RESERVE, task] > 0 and P[HELD, s] + I[RESERVE, task] > memory:
            held_back = True
            continue
        if best < 0 or _before(task, best, F, I):
            best = task
        if I[KIND_CLASS, task] == WEIGHT_CLASS and (weight < 0 or _before(task, weight, F, I)):
            weight = task
    if rule == ZB_ADAPTIVE and held_back and weight >= 0:
        return weight
    return best
