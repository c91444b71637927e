"""In-order parallel map over worker processes, with bounded memory and clean interrupts."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


def _init_worker() -> None:
    # Ctrl-C goes to the whole process group; only the parent should react to it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A parent killed outright (SIGKILL) must not leave its workers running; Linux only.
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def ordered_map(function: Callable[[_Item], _Result], items: Iterable[_Item], workers: int) -> Iterator[_Result]:
    """``map`` over processes, results in input order, at most ``4 x workers`` items in flight.

    Each function call should take long enough (tens of milliseconds or more) for
    process overhead to stay small; callers chunk their work accordingly.
    """
    if workers <= 1:
        yield from map(function, items)
        return
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_init_worker)
    try:
        pending = deque()
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= 4 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
