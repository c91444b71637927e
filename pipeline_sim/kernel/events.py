"""What the loop does to one task or GPU: a rate that changes (closing a segment, projecting the end on a
heap), a GPU marked for recomputation, a frame pushed on the readiness stack."""

from __future__ import annotations

import numpy as np

from .jit import inner
from .state import (
    HEAP_SIZE,
    RATE,
    RATE_TOLERANCE,
    REMAINING,
    SEGMENTS,
    SEQ,
    SINCE,
    STACK,
    START,
    THROTTLED,
    THROTTLED_NOW,
    THROTTLED_TIME,
)

#: Children per entry of the heap of projected ends: four halve its depth against two, and a sift then moves an
#: entry fewer times (each move also writes the moved task's place, ``HI[2, task]``, a line of its own in a large run).
#: The order of the pops is the same whatever the shape: no two entries have the same time and number.
ARITY = 4


@inner
def _move(HT: np.ndarray, HI: np.ndarray, to: int, at: int) -> None:
    """Entry ``at`` moved to place ``to`` (the hole a sift carries)."""
    HT[to], HI[0, to], HI[1, to] = HT[at], HI[0, at], HI[1, at]
    HI[2, HI[1, to]] = to


@inner
def _sift(HT: np.ndarray, HI: np.ndarray, size: int, i: int, at: float, number: int, task: int) -> None:
    """Put the entry ``(at, number, task)`` in place ``i`` of a heap of ``size`` entries, whose entry there is free:
    up while it comes before the entry above, else down while an entry below comes before it."""
    risen = False
    while i > 0:
        parent = (i - 1) // ARITY
        if not (at < HT[parent] or (at == HT[parent] and number < HI[0, parent])):
            break
        _move(HT, HI, i, parent)
        i = parent
        risen = True
    while not risen:
        first = ARITY * i + 1
        if first >= size:
            break
        best = first
        for child in range(first + 1, min(first + ARITY, size)):
            if HT[child] < HT[best] or (HT[child] == HT[best] and HI[0, child] < HI[0, best]):
                best = child
        if not (HT[best] < at or (HT[best] == at and HI[0, best] < number)):
            break
        _move(HT, HI, i, best)
        i = best
    HT[i], HI[0, i], HI[1, i] = at, number, task
    HI[2, task] = i


@inner
def heap_set(HT: np.ndarray, HI: np.ndarray, C: np.ndarray, at: float, number: int, task: int) -> None:
    """Give ``task`` the projected end ``at`` with sequence number ``number`` (which orders equal times) on the heap
    of projected ends: its one entry moved, or a new one. A task holds one entry at most, at ``HI[2, task]``, so
    the heap holds no stale entries: it pops the tasks in the order of their latest ends and numbers."""
    i = HI[2, task]
    if i < 0:
        i = C[HEAP_SIZE]
        C[HEAP_SIZE] = i + 1
    _sift(HT, HI, C[HEAP_SIZE], i, at, number, task)


@inner
def heap_remove(HT: np.ndarray, HI: np.ndarray, C: np.ndarray, task: int) -> None:
    """Take ``task``'s entry, if it has one, off the heap of projected ends."""
    i = HI[2, task]
    if i < 0:
        return
    last = C[HEAP_SIZE] - 1
    C[HEAP_SIZE] = last
    HI[2, task] = -1
    if i < last:
        _sift(HT, HI, last, i, HT[last], HI[0, last], HI[1, last])


@inner
def heap_pop(HT: np.ndarray, HI: np.ndarray, C: np.ndarray) -> None:
    """Take the earliest end (``HT[0]``, its task ``HI[1, 0]``) off a heap that holds one."""
    heap_remove(HT, HI, C, HI[1, 0])


@inner
def set_rate(i: int, rate: float, throttled: bool, now: float, F: np.ndarray, I: np.ndarray, HT: np.ndarray,
              HI: np.ndarray, SI: np.ndarray, SF: np.ndarray, C: np.ndarray) -> None:
    """Close task i's stretch at its old rate and continue at the new one.

    A throttled stretch at rate 0 (a flow waiting at a receiver that higher layers
    saturate) counts as throttled time but is no segment: nothing progresses.
    """
    old = F[i, RATE]
    if throttled == (I[i, THROTTLED_NOW] == 1) and abs(rate - old) <= RATE_TOLERANCE * old:
        return  # the same rate: a new segment starts only when something really changes
    since = F[i, SINCE]
    if now > since:
        if old > 0.0:
            F[i, REMAINING] -= old * (now - since)
            k = C[SEGMENTS]
            if k < len(SI):
                SI[k], SF[0, k], SF[1, k], SF[2, k] = i, since, now, old
            C[SEGMENTS] = k + 1  # counted even when not kept: the caller then runs again with room
        if I[i, THROTTLED_NOW] == 1:  # flagged only once the stretch has lasted, never for an instant
            F[i, THROTTLED_TIME] += now - since
            I[i, THROTTLED] = 1
    F[i, SINCE] = now
    F[i, RATE] = rate
    I[i, THROTTLED_NOW] = 1 if throttled else 0
    if rate > 0.0:
        if np.isnan(F[i, START]):
            F[i, START] = now
        C[SEQ] += 1
        left = F[i, REMAINING] if F[i, REMAINING] > 0.0 else 0.0
        heap_set(HT, HI, C, now + left / rate, C[SEQ], i)
    else:
        heap_remove(HT, HI, C, i)


@inner
def mark(P: np.ndarray, C: np.ndarray, flag: int, members: int, counter: int, g: int) -> None:
    if P[flag, g] == 0:
        P[flag, g] = 1
        P[members, C[counter]] = g
        C[counter] += 1


@inner
def push(K: np.ndarray, C: np.ndarray, kind: int, a: int) -> None:
    top = C[STACK]
    K[0, top], K[1, top], K[2, top] = kind, a, 0
    C[STACK] = top + 1


@inner
def sort_row(P: np.ndarray, row: int, first: int, stop: int) -> None:
    """Sort ``P[row, first:stop]`` in place (insertion sort: the rows are a few GPUs long)."""
    for k in range(first + 1, stop):
        value = P[row, k]
        j = k - 1
        while j >= first and P[row, j] > value:
            P[row, j + 1] = P[row, j]
            j -= 1
        P[row, j + 1] = value
