"""The process's memory allocator, told to keep what a simulation frees for the next one (glibc only).

A sweep builds each new environment's graph into arrays and simulates it in a state of a few hundred bytes a
task, freeing both at the end. glibc, left to itself, returns the freed top of its heap to the system once it
exceeds twice the largest block freed so far, and blocks larger than its current threshold to the system at once;
the next environment then faults those pages in again (a sweep over micro-batches on 8 GPUs, n = 256 to 1,024:
twice the page faults, and up to a tenth more time). With the thresholds here, blocks below ``MMAP_THRESHOLD`` come
from the heap and its freed top is kept up to ``TRIM_THRESHOLD``: the next environment reuses those pages. (The
state of one environment simulated again and again needs none of this: it is one block, which glibc reuses
itself, and from 32,768 tasks up the engine keeps it, ``engine.ROOM_KEPT_TASKS``.) A simulation's peak is the
same; the difference is that memory a large simulation freed stays with the process, up to ``TRIM_THRESHOLD``,
until it exits.

This changes the whole process, so only a command that simulates does it, before its first simulation
(``cli.common.ready_kernel``; a sweep's workers, forked from it, inherit it, and a local Dask cluster's workers are
started with glibc's variables for it, ``child_environment``), never the library on its own: a program
that imports the package keeps its allocator as it was, and may call ``keep_freed_memory`` itself. Drawing figures
gains nothing from it and would hold more memory at its peak (a tenth more for 827 heatmaps), so ``plot_heatmap.py``
leaves it; ``run_full_pipeline.py`` draws after its sweep, in the same process, with it.

Nothing is changed when the user set glibc's thresholds (``USER_SETTINGS``, or their names in ``GLIBC_TUNABLES``),
when ``PIPELINE_SIM_KEEP_FREED_MEMORY`` is ``0``, or where there is no ``mallopt`` (musl, macOS, Windows).
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from typing import Mapping

#: glibc's ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Blocks from this size up are taken from the system and given back when freed, as glibc's highest automatic
#: threshold does: a simulation's arrays of up to about 240,000 tasks come from the heap.
MMAP_THRESHOLD = 32 << 20
#: The freed top of the heap kept for later allocations, at most.
TRIM_THRESHOLD = 256 << 20
#: The environment variables by which a user sets glibc's thresholds (each stops glibc's own adjustment of them).
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
#: The same settings in ``GLIBC_TUNABLES``.
USER_TUNABLES = ("glibc.malloc.trim_threshold", "glibc.malloc.mmap_threshold", "glibc.malloc.top_pad",
                 "glibc.malloc.mmap_max")
#: Set to ``0``, the environment variable that leaves the allocator as it is.
SWITCH = "PIPELINE_SIM_KEEP_FREED_MEMORY"


def left_as_it_is(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for the allocator to be left alone: the user set one of glibc's thresholds, or
    ``SWITCH`` to ``0``."""
    tunables = {item.partition("=")[0].strip() for item in environ.get("GLIBC_TUNABLES", "").split(":")}
    return environ.get(SWITCH, "").strip() == "0" or any(name in environ for name in USER_SETTINGS) or \
        bool(tunables.intersection(USER_TUNABLES))


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a process of ours that does not fork from a command (the workers of a local Dask cluster):
    with glibc's own variables for ``MMAP_THRESHOLD`` and ``TRIM_THRESHOLD``, which it reads as it starts, unless
    ``left_as_it_is``. Elsewhere than glibc they mean nothing."""
    if left_as_it_is(environ):
        return dict(environ)
    return {**environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}


@cache
def keep_freed_memory() -> bool:
    """Set glibc's thresholds to ``MMAP_THRESHOLD`` and ``TRIM_THRESHOLD``, once per process; whether they were set
    (not when ``left_as_it_is``, nor without ``mallopt``)."""
    if left_as_it_is(os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, TypeError):  # no mallopt: not glibc (musl, macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # the mmap threshold first: setting either stops glibc's own adjustment of both, and a trim threshold alone,
    # with the mmap threshold left at its initial 128 KiB, would send every large block to the system
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
