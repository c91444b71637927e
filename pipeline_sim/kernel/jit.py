"""The kernel's decorators: compiled once per installation and kept in numba's cache.

numba caches each function under its own source file; a function's cached code does not
notice a change to a function it calls in another file, so the engine clears the
kernel's cache whenever any file of this package changed (``engine.compile_kernel``).
"""

from __future__ import annotations

from typing import Any

from numba import njit, types
from numba.extending import register_jitable


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
