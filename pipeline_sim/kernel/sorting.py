"""Sorting inside the kernel: one merge sort, compiled once, for every caller."""

from __future__ import annotations

import numpy as np

from .jit import inner, internal


@inner
def _merge(times: np.ndarray, source: np.ndarray, target: np.ndarray, first: int, middle: int, stop: int) -> None:
    """Merge the sorted runs ``source[first:middle]`` and ``source[middle:stop]`` into ``target``, the first run's
    index first at equal times."""
    a, b = first, middle
    for k in range(first, stop):
        if a < middle and (b >= stop or times[source[a]] <= times[source[b]]):
            target[k] = source[a]
            a += 1
        else:
            target[k] = source[b]
            b += 1


@internal
def stable_order(times: np.ndarray) -> np.ndarray:
    """The indices of ``times`` in ascending order, equal times in index order: ``np.argsort(times,
    kind="mergesort")``, written out, as numba's generic sorts take several times longer to compile."""
    n = len(times)
    order = np.empty(n, dtype=np.int64)
    spare = np.empty(n, dtype=np.int64)
    for i in range(n):
        order[i] = i
    width = 1
    while width < n:  # bottom-up: runs of width 1, 2, 4, ... merged pairwise
        for first in range(0, n, 2 * width):
            _merge(times, order, spare, first, min(first + width, n), min(first + 2 * width, n))
        order, spare = spare, order
        width *= 2
    return order
