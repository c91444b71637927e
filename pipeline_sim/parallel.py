"""In-order parallel map over worker processes, with bounded memory and clean interrupts."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import multiprocessing
import multiprocessing.context
import signal
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, Callable, Generator, Iterable, Iterator, TypeVar

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
#: The signals that stop a run: held while this process forks (``stops_held``).
_STOPS = frozenset({signal.SIGINT, signal.SIGTERM})

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


#: In a worker, the count shared with its parent that ``tick`` adds to (``ordered_map``'s ``ticks``); None elsewhere.
_ticks: Any = None
#: How long the parent waits for a result before it reads the ticks again (``ordered_map``'s ``waiting``).
WAIT_SECONDS = 0.5


def _init_worker(ticks: Any = None) -> None:
    # Ctrl-C goes to the whole process group; only the parent should react to it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's clean-stop handler is not for workers
    release_stops()
    die_with_parent()
    global _ticks
    _ticks = ticks


def tick(count: int, weight: float = 0.0) -> None:
    """Tell the parent that ``count`` more units of work, of ``weight`` (estimated seconds, say), are done within the
    call this worker runs (nothing outside a worker of ``ordered_map`` given ``ticks``)."""
    if _ticks is not None:
        with _ticks.get_lock():
            _ticks[0] += count
            _ticks[1] += weight


def shared_values() -> Any:
    """In a worker of ``ordered_map`` given ``ticks``, the shared values as an array of floats that compiled code can
    write while it runs (for a parent that reads item 0 as absolute progress rather than ``tick``'s sums); None
    elsewhere."""
    if _ticks is None:
        return None
    import numpy as np

    return np.frombuffer(_ticks.get_obj(), dtype=np.float64)


def interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The interrupt (Ctrl-C or a SIGTERM made one) behind ``error``: itself, or for a ``SystemError`` the one it was
    raised from. A signal handler's exception raised while compiled code called back into Python (numba loading a
    cached kernel) comes back out of that call as ``SystemError: ... returned a result with an exception set``."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        if not isinstance(error, SystemError):
            return None
        seen.add(id(error))
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return None


@contextmanager
def stops_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM in this thread meanwhile, for the processes it forks. A forked child starts with its
    parent's handlers and a copy of its parent's stack: a stop that reached it before it set its own handlers would
    raise the parent's interrupt there, unwind the copied stack and run the parent's clean-up (removing folders the
    parent still uses) and then its work, as if it were the parent. Each child, its own handlers set, calls
    ``release_stops``; a stop that came meanwhile is then taken, by those handlers."""
    if not hasattr(signal, "pthread_sigmask"):  # no such masks (Windows), and no fork either
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def release_stops() -> None:
    """In a child forked under ``stops_held``, once its own handlers are set: take the stops again."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


def die_with_parent() -> None:
    """Have this process terminated when its parent dies, even killed outright (SIGKILL), so that no worker is
    left running; Linux only (elsewhere, nothing). Kept across ``exec``."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def ordered_map(function: Callable[[_Item], _Result], items: Iterable[_Item],
                workers: int, isolate: bool = False, ticks: Any = None,
                waiting: Callable[[], None] | None = None) -> Generator[_Result, None, None]:
    """``map`` over processes, results in input order, at most ``4 x workers`` items in flight.

    Each function call should take long enough (tens of milliseconds or more) for
    process overhead to stay small; callers chunk their work accordingly. One worker maps
    in this process, unless ``isolate``: a call into compiled code does not return to the
    interpreter until it is done, so only a call in another process can be stopped at once.
    ``ticks`` (a ``multiprocessing.Value`` of this process's context, ``shared_count``) is what ``tick`` adds to in
    the workers; ``waiting`` is called every ``WAIT_SECONDS`` while the next result is not in, so that the caller can
    read it.
    """
    if workers <= 1 and not isolate:
        yield from map(function, items)
        return
    context = process_context()
    if context.get_start_method() == "fork":
        # Forked workers share the parent's memory until a page is written. The cyclic collector writes to
        # every object it visits, so in each worker it would copy all that the parent holds (a drawing's
        # first reading: about 4.5 KB per environment); frozen objects it leaves alone.
        gc.freeze()
    workers = max(1, workers)
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(ticks,), mp_context=context)
    finished = False
    try:
        pending: deque[Future[_Result]] = deque()
        for item in items:
            with stops_held():  # the workers are forked by the first submission
                pending.append(pool.submit(function, item))
            if len(pending) >= 4 * workers:
                yield _result(pending.popleft(), waiting)
        while pending:
            yield _result(pending.popleft(), waiting)
        finished = True
    finally:
        if not finished:
            _stop_now(pool)
        pool.shutdown(wait=finished, cancel_futures=True)
        gc.unfreeze()


def _result(future: Future[_Result], waiting: Callable[[], None] | None) -> _Result:
    """``future``'s result, once it is in; ``waiting`` called every ``WAIT_SECONDS`` until then. (Waited for apart
    from taking its result: a call that raised a ``TimeoutError`` of its own is not a wait that timed out.)"""
    if waiting is not None:
        while not wait([future], WAIT_SECONDS).done:
            waiting()
    return future.result()


def shared_count() -> Any:
    """A count and a weight that workers of ``ordered_map`` add to (``tick``) and this process reads (items 0 and 1;
    a count of up to 2^53 is exact)."""
    return process_context().Array("d", 2)


def _stop_now(pool: ProcessPoolExecutor) -> None:
    """Stop an interrupted or abandoned pool's workers at once instead of letting them finish work that is no
    longer wanted (a second Ctrl-C would otherwise wait on them)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        process.kill()
    for process in processes:
        process.join()
    # A worker killed while sending its result leaves half a message in the result pipe, and the pool's
    # thread would wait for the rest forever (so would the interpreter's exit, which joins that thread).
    # Closing our copy of the pipe's writing end, the last one once the workers are gone, turns that wait
    # into an end of file, which the pool handles as a broken pool.
    result_queue = getattr(pool, "_result_queue", None)
    if result_queue is not None:
        result_queue._writer.close()


def process_context() -> multiprocessing.context.BaseContext:
    """Fork where the platform has it (workers start at once and share the parent's imports), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")
