"""The choice of a GPU's next compute task, made when its compute channel is free (docs/model.md sections 2, 12)."""

from __future__ import annotations

import numpy as np

from .jit import exposed, inner, within
from .state import (
    AFTER,
    BEFORE,
    BUSY,
    CANDIDATES,
    DECIDE,
    DISPATCH_KEY,
    GPU,
    HELD,
    HOLDING,
    INDEX,
    KIND_CLASS,
    NEXT,
    READY,
    READY_COUNT,
    RESERVE,
    STAGE,
    WAITED,
    WAITING,
    WEIGHT_CLASS,
    ZB_ADAPTIVE,
)


@within
def enter_candidates(task: int, I: np.ndarray, P: np.ndarray) -> None:
    """Compute task ``task``, its needs now met, joins its GPU's candidates (first in their list)."""
    s = I[task, GPU]
    first = P[CANDIDATES, s]
    I[task, AFTER] = first
    I[task, BEFORE] = -1
    if first >= 0:
        I[first, BEFORE] = task
    P[CANDIDATES, s] = task


@within
def leave_candidates(task: int, I: np.ndarray, P: np.ndarray) -> None:
    """Compute task ``task``, taken by its GPU, leaves its candidates."""
    before, after = I[task, BEFORE], I[task, AFTER]
    if before == -2:
        return
    if before >= 0:
        I[before, AFTER] = after
    else:
        P[CANDIDATES, I[task, GPU]] = after
    if after >= 0:
        I[after, BEFORE] = before
    I[task, BEFORE] = -2


@inner
def take_next(s: int, F: np.ndarray, I: np.ndarray, P: np.ndarray, order_start: np.ndarray,
              order_task: np.ndarray) -> int:
    """The compute task GPU s starts now under its static order, taken off the order, or -1 when it must wait:
    the GPU's next listed task not yet taken, once every need is met. (Only the look-ahead's trials, section
    12.7, take tasks out of the order before the static order continues it.)"""
    position = P[NEXT, s]
    count = order_start[s + 1] - order_start[s]
    while position < count and not np.isnan(F[order_task[order_start[s] + position], READY]):
        position += 1
    P[NEXT, s] = position
    if position >= count:
        return -1
    task = order_task[order_start[s] + position]
    if I[task, WAITING] > 0:
        return -1
    P[NEXT, s] = position + 1
    return task


@inner
def _before(a: int, b: int, F: np.ndarray, I: np.ndarray) -> bool:
    """Whether a dispatcher prefers task a to task b: the rule's key (lowest first), then backward work before
    F before W, then the lowest micro-batch, then the lowest stage."""
    if F[a, DISPATCH_KEY] != F[b, DISPATCH_KEY]:
        return F[a, DISPATCH_KEY] < F[b, DISPATCH_KEY]
    if I[a, KIND_CLASS] != I[b, KIND_CLASS]:
        return I[a, KIND_CLASS] < I[b, KIND_CLASS]
    if I[a, INDEX] != I[b, INDEX]:
        return I[a, INDEX] < I[b, INDEX]
    return I[a, STAGE] < I[b, STAGE]


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
    while first + position < stop and not np.isnan(F[order_task[first + position], READY]):
        position += 1
    P[NEXT, s] = position
    best = -1
    weight = -1
    held_back = False
    task = P[CANDIDATES, s]
    while task >= 0:  # its tasks not yet taken whose needs are met, in any order: the choice is the same
        if I[task, RESERVE] > 0 and P[HELD, s] + I[task, RESERVE] > memory:
            held_back = True
        else:
            if best < 0 or _before(task, best, F, I):
                best = task
            if I[task, KIND_CLASS] == WEIGHT_CLASS and (weight < 0 or _before(task, weight, F, I)):
                weight = task
        task = I[task, AFTER]
    if rule == ZB_ADAPTIVE and held_back and weight >= 0:
        return weight
    return best


@exposed
def choices(s: int, memory: int, F: np.ndarray, I: np.ndarray, P: np.ndarray, order_start: np.ndarray,
            order_task: np.ndarray, out: np.ndarray) -> int:
    """For a decision handed to the caller (section 12.4): per action (``out``'s index), the task it starts on
    GPU s: of the candidates ``dispatch`` would weigh whose ``DISPATCH_KEY`` is that action, the lowest
    micro-batch, then stage; -1 where there is none. The last entry is waiting, possible (0) only while
    something is under way that brings another event, or another GPU still decides in this instant and, being
    asked later, cannot wait with nothing under way. Returns how many tasks can start."""
    out[:] = -1
    count = 0
    task = P[CANDIDATES, s]
    while task >= 0:
        if I[task, RESERVE] == 0 or P[HELD, s] + I[task, RESERVE] <= memory:
            action = int(F[task, DISPATCH_KEY])
            best = out[action]
            if best < 0:
                count += 1
            if best < 0 or I[task, INDEX] < I[best, INDEX] or (I[task, INDEX] == I[best, INDEX]
                                                                and I[task, STAGE] < I[best, STAGE]):
                out[action] = task
        task = I[task, AFTER]
    for g in range(P.shape[1]):
        if P[BUSY, g] >= 0 or P[HOLDING, g] > 0 or P[READY_COUNT, g] > 0 or (
                g > s and P[DECIDE, g] == 1 and _can_start(g, memory, F, I, P, order_start, order_task)):
            out[len(out) - 1] = 0
    return count


@inner
def _can_start(s: int, memory: int, F: np.ndarray, I: np.ndarray, P: np.ndarray, order_start: np.ndarray,
               order_task: np.ndarray) -> bool:
    """Whether free GPU s has a task whose needs are met and that fits the memory limit."""
    task = P[CANDIDATES, s]
    while task >= 0:
        if I[task, RESERVE] == 0 or P[HELD, s] + I[task, RESERVE] <= memory:
            return True
        task = I[task, AFTER]
    return False


@inner
def next_decider(memory: int, F: np.ndarray, I: np.ndarray, P: np.ndarray, order_start: np.ndarray,
                 order_task: np.ndarray) -> int:
    """The lowest free GPU marked to decide that has a task it may start, or -1; GPUs marked without one are
    unmarked, as a compiled dispatcher leaves them."""
    for s in range(P.shape[1]):
        if P[DECIDE, s] == 0:
            continue
        if P[BUSY, s] < 0 and P[HOLDING, s] == 0 and _can_start(s, memory, F, I, P, order_start, order_task):
            return s
        P[DECIDE, s] = 0
    return -1


@inner
def wake(P: np.ndarray) -> None:
    """After an event, every free GPU that chose to wait decides again."""
    for s in range(P.shape[1]):
        if P[WAITED, s] == 1:
            P[WAITED, s] = 0
            if P[BUSY, s] < 0:
                P[DECIDE, s] = 1
