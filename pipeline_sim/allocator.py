"""The process's memory allocator, told to keep what a simulation frees for the next one (glibc only).

Every simulation allocates its state arrays (a few hundred bytes a task) and frees them at its end. By default glibc
hands a large freed block back to the system at once, and the next simulation's arrays fault every page in again:
for an environment of thousands of tasks that costs as long as a third to a half of the simulation itself. Above
``MMAP_THRESHOLD`` a block still comes from the system and goes back to it; below, blocks come from the heap, whose
freed top is kept until it exceeds ``TRIM_THRESHOLD``. A run's peak memory is unchanged; what changes is that memory
freed late in a run is returned at its end rather than at once.

A setting the user made (glibc's ``MALLOC_*_`` environment variables) is left as it is, and elsewhere than on glibc
nothing is done.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache

#: glibc's ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Blocks from this size up are taken from the system and given back when freed (glibc's own highest automatic
#: threshold): a simulation's arrays of up to about 100,000 tasks come from the heap.
MMAP_THRESHOLD = 32 << 20
#: The freed top of the heap kept for later allocations, at most.
TRIM_THRESHOLD = 256 << 20
#: The environment variables by which a user sets glibc's thresholds.
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


@cache
def keep_freed_memory() -> bool:
    """Set glibc's thresholds to ``MMAP_THRESHOLD`` and ``TRIM_THRESHOLD``, once per process (forked workers inherit
    them); whether they were set: not when the user set any (``USER_SETTINGS``), nor without glibc."""
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, TypeError):  # no mallopt: not glibc (macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
