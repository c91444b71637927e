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


@inner
def _heap_less(HT: np.ndarray, HI: np.ndarray, a: int, b: int) -> bool:
    return HT[a] < HT[b] or (HT[a] == HT[b] and HI[0, a] < HI[0, b])


@inner
def _heap_swap(HT: np.ndarray, HI: np.ndarray, a: int, b: int) -> None:
    HT[a], HT[b] = HT[b], HT[a]
    HI[0, a], HI[0, b] = HI[0, b], HI[0, a]
    HI[1, a], HI[1, b] = HI[1, b], HI[1, a]
    HI[2, HI[1, a]] = a
    HI[2, HI[1, b]] = b


@inner
def _sift_up(HT: np.ndarray, HI: np.ndarray, i: int) -> int:
    """Move entry i up to its place; returns where it ends."""
    while i > 0:
        parent = (i - 1) // 2
        if not _heap_less(HT, HI, i, parent):
            break
        _heap_swap(HT, HI, i, parent)
        i = parent
    return i


@inner
def _sift_down(HT: np.ndarray, HI: np.ndarray, size: int, i: int) -> None:
    while True:
        child = 2 * i + 1
        if child >= size:
            return
        if child + 1 < size and _heap_less(HT, HI, child + 1, child):
            child += 1
        if not _heap_less(HT, HI, child, i):
            return
        _heap_swap(HT, HI, i, child)
        i = child


@inner
def heap_set(HT: np.ndarray, HI: np.ndarray, C: np.ndarray, at: float, number: int, task: int) -> None:
    """Give ``task`` the projected end ``at`` with sequence number ``number`` (which orders equal times) on the heap
    of projected ends: its one entry moved, or a new one. A task holds one entry at most, at ``HI[2, task]``, so
    the heap holds no stale entries: it pops the tasks in the order of their latest ends and numbers."""
    i = HI[2, task]
    if i < 0:
        i = C[HEAP_SIZE]
        C[HEAP_SIZE] = i + 1
        HI[1, i] = task
        HI[2, task] = i
    HT[i], HI[0, i] = at, number
    if _sift_up(HT, HI, i) == i:
        _sift_down(HT, HI, C[HEAP_SIZE], i)


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
        HT[i], HI[0, i], HI[1, i] = HT[last], HI[0, last], HI[1, last]
        HI[2, HI[1, i]] = i
        if _sift_up(HT, HI, i) == i:
            _sift_down(HT, HI, last, i)


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
