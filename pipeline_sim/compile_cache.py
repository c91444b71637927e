"""The simulation kernel's compile cache, kept from stopping a run.

numba keeps the kernel's machine code beside the package, or in the user's cache folder
when the package is read-only, and every later run loads it. Two things could break that:
a cache file damaged on disk (a crash while it was written, a disk error), which numba
would fail to unpickle on every run until someone deleted it, and no writable place at
all, which numba refuses when the kernel is imported. Here a damaged entry is a miss
(compiled again and written anew), and with nowhere to write, numba is pointed at a
temporary folder for this run only. ``NOTICES`` says what happened, in one line each.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import shutil
import tempfile
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

#: The module whose numba functions are the kernel (a package: its modules too).
KERNEL = "pipeline_sim.kernel"
#: What this process had to do about the cache, for the command line to say.
NOTICES: list[str] = []


def kernel_folder() -> Path | None:
    """The folder of the kernel's source: numba's cache is its ``__pycache__`` when that is writable."""
    spec = importlib.util.find_spec(KERNEL)
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def _writable(folder: Path) -> bool:
    """Whether numba could keep a cache in ``folder`` (its own test: make it, write a file in it)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
        return True
    except OSError:
        return False


def ensure_writable() -> None:
    """Before the kernel is imported: with no writable cache beside the package nor in the user's cache folder,
    point numba at a temporary folder, removed at exit, instead of letting the import fail."""
    import numba
    from numba.misc.appdirs import AppDirs

    config: Any = numba.config  # its settings are made at run time, unknown to type checkers
    if config.DISABLE_JIT or config.CACHE_DIR:  # no cache, or one the user chose
        return
    folder = kernel_folder()
    places = ([folder / "__pycache__"] if folder else []) + \
        [Path(AppDirs(appname="numba", appauthor=False).user_cache_dir)]
    if any(_writable(place) for place in places):
        return
    config.CACHE_DIR = tempfile.mkdtemp(prefix="pipeline-sim-kernel-")
    atexit.register(shutil.rmtree, config.CACHE_DIR, True)
    NOTICES.append(f"no writable compile cache (neither {places[0]} nor {places[-1]}): the kernel is compiled for "
                   f"this run only")


@cache
def load_kernel() -> ModuleType:
    """The kernel, imported once as every run needs it: a place to keep its machine code found first
    (``ensure_writable``), then every load of its functions from the cache guarded (``guard_loads``)."""
    ensure_writable()
    kernel = importlib.import_module(KERNEL)
    guard_loads(kernel, kernel.jit.loadable)
    return kernel


def guard_loads(kernel: ModuleType, loadable: Callable[..., bool]) -> None:
    """Every load of one of the kernel's functions from the cache: first ``loadable(cache, argument types,
    target)``, which gives the cached code the addresses it calls (``jit.loadable``) and with False makes the load a
    miss; then the load, a damaged entry being a miss too (its files removed, and numba compiles the function again
    and writes them anew)."""
    import sys

    modules = [module for name, module in list(sys.modules.items())
               if module is not None and (name == kernel.__name__ or name.startswith(kernel.__name__ + "."))]
    for module in modules:
        for function in vars(module).values():
            cache = getattr(function, "_cache", None)
            if cache is not None and callable(getattr(cache, "load_overload", None)) and \
                    not getattr(cache, "_guarded", False):
                cache.load_overload = _guarded_load(cache, cache.load_overload, loadable)
                cache._guarded = True


def _guarded_load(cache: Any, load: Any, loadable: Callable[..., bool]) -> Any:
    def load_overload(*args: Any, **kwargs: Any) -> Any:
        if not loadable(cache, *args, **kwargs):
            return None  # a miss: numba compiles
        try:
            return load(*args, **kwargs)
        except Exception as error:  # an unreadable index or data file: numba raises whatever unpickling raised
            _remove_entry(cache)
            if not NOTICES or not NOTICES[-1].startswith("the compile cache"):
                NOTICES.append(f"the compile cache was damaged ({type(error).__name__}); the kernel was compiled "
                               f"again and its cache rewritten")
            return None  # a miss: numba compiles
    return load_overload


def _remove_entry(cache: Any) -> None:
    """The index of one function's cache and its data files (``<name>.nbi``, ``<name>.<n>.nbc``)."""
    index = Path(getattr(getattr(cache, "_cache_file", None), "_index_path", ""))
    if index.suffix != ".nbi":
        return
    for path in (index, *index.parent.glob(f"{index.stem}.*.nbc")):
        path.unlink(missing_ok=True)


def cache_folder(kernel: ModuleType) -> Path:
    """Where numba keeps the kernel's compiled code in this process."""
    return Path(str(kernel.simulate_policies.stats.cache_path))


#: The builders whose plain Python builds graphs now (``plain_builds``), by name ("*": all).
_plain: frozenset[str] = frozenset()


@contextmanager
def plain_builds(*names: str) -> Iterator[None]:
    """Graphs built by the plain Python of the kernel's builders ``names`` (all when none is named) while in force
    (``built``): a first compile's own small graph, so that the builders are compiled beside the rest of the kernel
    rather than before it."""
    global _plain
    before, _plain = _plain, frozenset(names or ("*",))
    try:
        yield
    finally:
        _plain = before


def built(builder: Callable) -> Callable:
    """``builder``, a compiled function of the kernel that builds a graph's arrays, as graphs are now built: its
    plain Python under ``plain_builds``."""
    if not _plain:  # as always but in a first compile
        return builder
    plain = getattr(builder, "py_func", None)
    return plain if plain is not None and ("*" in _plain or plain.__name__ in _plain) else builder
