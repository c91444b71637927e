"""The kernel's decorators: compiled once per installation and kept in numba's cache.

numba caches each function under its own source file; a function's cached code does not
notice a change to a function it calls in another file, so the engine clears the
kernel's cache whenever any file of this package changed (``engine.compile_kernel``).

numba compiles a function's callees into it: their code is optimized and emitted again
in every caller. The loop's large steps and the loop itself are called instead at the
address of their own machine code (``at_address``), so that each is compiled once, and
the compiles of a first run need not wait for one another.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import sys
from pathlib import Path
from typing import Any, Callable

import llvmlite.binding
import llvmlite.ir
import numpy as np
from numba import config, njit, types
from numba.core import cgutils
from numba.core.imputils import impl_ret_borrowed
from numba.core.typing import signature
from numba.extending import intrinsic, overload, register_jitable


def _one_signature(options: dict[str, Any]) -> Any:
    """numba's ``njit`` with these options, whose functions compile one signature for every call from compiled code:
    a constant argument (``push(K, C, RELEASE, task)``) counts as its type, not as a literal value of its own, which
    would compile the function again for each constant it is called with."""
    def decorate(function: Any) -> Any:
        dispatcher = njit(**options)(function)
        if not hasattr(dispatcher, "get_call_template"):  # NUMBA_DISABLE_JIT: the plain function
            return dispatcher
        template = dispatcher.get_call_template
        dispatcher.get_call_template = lambda args, kws: template(
            tuple(types.unliteral(arg) for arg in args), {key: types.unliteral(arg) for key, arg in kws.items()})
        return dispatcher
    return decorate


#: Compiled once per installation and kept in numba's cache; called from Python. (numba's other wrapper, a C entry
#: point, is never used: not compiled.)
compiled: Any = _one_signature(dict(cache=True, no_cfunc_wrapper=True))  # dispatchers take any arrays; not type-checked
#: The same, with its body compiled into each compiled caller: arrays it allocates are then the caller's own, which
#: lets the compiler keep them apart from every other array in the caller's loop.
_INLINED: dict[str, Any] = dict(cache=True, inline="always", no_cfunc_wrapper=True)  # an option typing omits
inlined: Any = njit(**_INLINED)
#: The same as ``compiled``, for functions called only from compiled code: without the wrapper that converts Python's
#: arguments, which takes longer to compile than most of these functions (a call from Python would crash).
internal: Any = _one_signature(dict(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True))
#: The same, for functions that allocate nothing: without reference counting of their array arguments, which per call
#: cost more than the function's own work.
inner: Any = _one_signature(dict(cache=True, _nrt=False, no_cpython_wrapper=True, no_cfunc_wrapper=True))
#: ``inner``, called from Python as well: an episode's steps, the allocation of the worked examples.
exposed: Any = _one_signature(dict(cache=True, _nrt=False, no_cfunc_wrapper=True))
#: The same as ``exposed``, with IEEE arithmetic: a float division by zero gives inf or nan rather than raising, so
#: that the compiler may turn a loop of divisions into vector instructions.
vectorized: Any = _one_signature(dict(cache=True, _nrt=False, no_cfunc_wrapper=True, error_model="numpy"))
#: Compiled within each compiled caller, and plain Python when called from Python: for a small helper that Python
#: calls too, where compiling it would come before anything else of a first compile.
within: Any = register_jitable


#: The functions that compiled code calls at their address (``at_address``).
AT_ADDRESS: list[Any] = []
#: The names (``_symbol``) under which this process knows their addresses.
_LINKED: set[str] = set()


def at_address(function: Any, returns: Any = None) -> Any:
    """``function`` (a kernel function) as its compiled callers call it: at the address of its own machine code,
    rather than with a copy of its code compiled into each caller, which numba's call would make.

    A call is no slower: these are functions the compiler keeps out of line in any case (the loop's rate updates,
    its settling of what an event made ready, the loop itself from an entry point). What it saves is time to compile:
    the loop was otherwise compiled once for itself, with all it calls, and once more within each entry point, one
    after the other, as neither could start before its callees were compiled.

    With ``returns`` (numba's type of what ``function`` returns) a caller is typed without ``function``, which then
    need only be compiled as the caller's code is made, so that the two compile at the same time (``awaiting``).
    The caller names the address by a name of the function and its argument types, the same in every process, which
    ``loadable`` gives the address of the function's cached code before a caller is loaded from the cache.
    Without the compiler (``NUMBA_DISABLE_JIT``) this is ``function`` itself."""
    if getattr(config, "DISABLE_JIT"):
        return function
    AT_ADDRESS.append(function)

    @intrinsic
    def call(typingctx: Any, *args: Any) -> Any:
        argtypes = tuple(types.unliteral(arg) for arg in args)
        if returns is None:
            called = typingctx.resolve_function_type(typingctx.resolve_value_type(function), argtypes, {})
        else:
            called = signature(returns, *argtypes)

        def lower(context: Any, builder: Any, sig: Any, values: Any) -> Any:
            name = _link(function, called.args, called.return_type)
            native = context.call_conv.get_function_type(called.return_type, called.args)
            callee = cgutils.get_or_insert_function(builder.module, native, name)
            given = cgutils.unpack_tuple(builder, values[0])
            arguments = [context.cast(builder, value, fromty, toty)
                         for value, fromty, toty in zip(given, args, called.args)]
            status, result = context.call_conv.call_function(builder, callee, called.return_type, called.args,
                                                             arguments)
            with cgutils.if_unlikely(builder, status.is_error):
                context.call_conv.return_status_propagate(builder, status)
            return result
        return signature(called.return_type, types.StarArgTuple.from_types(args)), lower
    return call


def no_wait(name: str) -> None:
    """What ``awaiting`` is outside a first compile shared between two processes: nothing to wait for."""


#: Called with a function's name before it is compiled, or loaded from the cache, for a caller to call it: during
#: a first compile shared with a second process (``engine.claim_shares``), it waits while the other one compiles
#: it, so that it is loaded, not compiled twice.
awaiting: Callable[[str], None] = no_wait


def _symbol(function: Any, argtypes: tuple) -> str:
    """The name by which compiled callers call ``function`` compiled for ``argtypes``, the same in every process
    (numba's own names for its functions count the functions a process compiled)."""
    python = function.py_func
    described = f"{python.__module__}.{python.__qualname__}{argtypes}"
    return f"pipeline_sim.{python.__qualname__}.{hashlib.sha256(described.encode()).hexdigest()[:20]}"


def _link(function: Any, argtypes: tuple, returns: Any = None) -> str:
    """``function`` compiled for ``argtypes`` (or loaded from the cache), its address known by ``_symbol``; what it
    returns checked against ``returns``, the type its callers were given."""
    name = _symbol(function, argtypes)
    if name not in _LINKED:
        awaiting(function.py_func.__name__)
        function.compile(argtypes)
        compiled = function.overloads[argtypes]
        if returns is not None and compiled.signature.return_type != returns:
            raise TypeError(f"the kernel's {function.py_func.__qualname__} returns {compiled.signature.return_type}, "
                            f"its callers were told {returns}")
        address = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
        if not address:
            raise RuntimeError(f"the kernel's {function.py_func.__qualname__} has no machine code to call")
        llvmlite.binding.add_symbol(name, address)
        _LINKED.add(name)
    return name


def loadable(cache: Any, argtypes: tuple, target: Any) -> bool:
    """Whether the cached code of ``cache``'s function for ``argtypes`` may be loaded: every address it calls is
    known in this process, once the functions it calls at their address are loaded (or compiled) and linked. False
    when one of them has no code (its cache files removed while its callers' were kept): loaded, the caller would
    crash the process, so it is compiled anew."""
    try:
        name = cache._cache_file._load_index().get(cache._index_key(argtypes, target.codegen()))
        code = Path(cache._cache_file._data_path(name)).read_bytes() if name else b""
    except Exception:  # unreadable: the load itself finds it so, and compiles
        return True
    needed = {symbol.decode() for symbol in _SYMBOL.findall(code)} - _LINKED
    if needed:
        sources = {_symbol(function, compiled): (function, compiled) for function in AT_ADDRESS
                   for compiled in set(function.overloads) | _cached_signatures(function)}
        if not needed <= sources.keys():
            return False
        for symbol in sorted(needed):
            _link(*sources[symbol])
    return True


#: A name of ``_symbol`` within machine code.
_SYMBOL = re.compile(rb"pipeline_sim\.[A-Za-z_][A-Za-z_0-9]*\.[0-9a-f]{20}")


def _cached_signatures(function: Any) -> set[tuple]:
    """The argument types for which numba's cache keeps ``function``'s code for this machine and this source."""
    cache = function._cache
    try:
        index = cache._cache_file._load_index()
    except Exception:  # unreadable: nothing cached (its load removes it, and compiles)
        return set()
    codegen = function.targetctx.codegen()
    return {key[0] for key in index if key == cache._index_key(key[0], codegen)}


def read_only(array: np.ndarray) -> np.ndarray:
    """``array``, which no one is to write again: returned to Python, it arrives with its writeable flag off (and so
    every view of it). Compiled, this costs nothing: the array is typed read-only, and numba converts an array of
    that type so; a call of ``setflags`` per array a builder returns took longer than the builder's own work on a
    small graph."""
    array.setflags(write=False)
    return array


def _typed_read_only_call(typingctx: Any, array: Any) -> Any:
    """``array`` itself, typed read-only (the same data, one more reference)."""
    def lower(context: Any, builder: Any, sig: Any, values: Any) -> Any:
        return impl_ret_borrowed(context, builder, sig.return_type, values[0])
    return signature(array.copy(readonly=True), array), lower


_typed_read_only: Any = intrinsic(_typed_read_only_call)


@overload(read_only)
def _read_only_compiled(array: Any) -> Any:
    def typed(array: Any) -> Any:  # annotated as the overload is: numba compares the two signatures
        return _typed_read_only(array)
    return typed


#: Linux's advice that a range of memory be backed by huge pages of 2 MiB (``madvise``), which the system gives, in
#: its default mode of transparent huge pages, only to memory that asks.
MADV_HUGEPAGE = 14
#: Arrays from this size are advised (``advise_huge_pages``), and a run's state once its rows of floats alone come to
#: it (about 300,000 tasks): each of its 4 KiB pages would fault on first use. A million tasks' rows of floats and
#: integers, 300 MB, fault in 140 ms page by page and in 21 ms by huge pages; smaller state is not asked for them,
#: as a run that must wait for the system to free 2 MiB at a time can take longer than its faults.
HUGE_PAGE_BYTES = 32 * 2 ** 20


def _madvise_known() -> bool:
    """Whether compiled code may call the C library's ``madvise``: Linux, compiled, its address given to the
    compiler's linker under that name."""
    if not sys.platform.startswith("linux") or getattr(config, "DISABLE_JIT"):
        return False
    try:
        address = ctypes.cast(ctypes.CDLL(None).madvise, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return False
    llvmlite.binding.add_symbol("madvise", address)
    return True


HUGE_PAGES = _madvise_known()


def _madvise_call(typingctx: Any, address: Any, length: Any, advice: Any) -> Any:
    """``madvise(address, length, advice)`` in compiled code, its result (0, or -1 when refused) left alone."""
    def lower(context: Any, builder: Any, sig: Any, values: Any) -> Any:
        word = llvmlite.ir.IntType(64)
        native = llvmlite.ir.FunctionType(llvmlite.ir.IntType(32), [word, word, llvmlite.ir.IntType(32)])
        return builder.call(cgutils.get_or_insert_function(builder.module, native, "madvise"), values)
    return signature(types.int32, types.int64, types.int64, types.int32), lower


_madvise: Any = intrinsic(_madvise_call)


@inlined
def advise_huge_pages(array: Any) -> None:
    """Ask that ``array``'s whole pages be huge ones, before anything is written to it, when it is as large as
    ``HUGE_PAGE_BYTES`` (on Linux; elsewhere nothing)."""
    if HUGE_PAGES and array.nbytes >= HUGE_PAGE_BYTES:
        start = (array.ctypes.data + 4095) // 4096 * 4096
        end = (array.ctypes.data + array.nbytes) // 4096 * 4096
        _madvise(np.int64(start), np.int64(end - start), np.int32(MADV_HUGEPAGE))



def _prefetch_call(typingctx: Any, address: Any) -> Any:
    """The processor asked to bring the cache line at ``address`` into its caches, for reading, kept close."""
    def lower(context: Any, builder: Any, sig: Any, values: Any) -> Any:
        pointer = builder.inttoptr(values[0], llvmlite.ir.IntType(8).as_pointer())
        word = llvmlite.ir.IntType(32)
        native = llvmlite.ir.FunctionType(llvmlite.ir.VoidType(), [pointer.type, word, word, word])
        builder.call(cgutils.get_or_insert_function(builder.module, native, "llvm.prefetch.p0"),
                     [pointer, word(0), word(3), word(1)])
        return context.get_dummy_value()
    return signature(types.none, types.int64), lower


_prefetch: Any = intrinsic(_prefetch_call)
#: Whether code is compiled: uncompiled, nothing is asked for.
PREFETCH = not getattr(config, "DISABLE_JIT")
#: The loop asks for rows ahead in runs of this many tasks or more, whose state (about 250 bytes a task) outgrows
#: the CPU's own caches: below, the rows are there already and asking costs 2% of the time.
PREFETCH_TASKS = 32_768


@inlined
def prefetch_row(array: Any, row: int) -> None:
    """Ask for the cache lines of ``array[row]`` (a row of a C-ordered 2D array) ahead of their use."""
    if PREFETCH:
        first = array.ctypes.data + row * array.strides[0]
        for line in range(first // 64 * 64, first + array.strides[0], 64):
            _prefetch(np.int64(line))
