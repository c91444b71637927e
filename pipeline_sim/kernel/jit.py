"""The kernel's two decorators: compiled once per installation and kept in numba's cache.

numba caches each function under its own source file; a function's cached code does not
notice a change to a function it calls in another file, so the engine clears the
kernel's cache whenever any file of this package changed (``engine.compile_kernel``).
"""

from __future__ import annotations

from typing import Any

from numba import njit

#: Compiled once per installation and kept in numba's cache.
compiled: Any = njit(cache=True)  # numba's dispatchers take any arrays; their calls are not type-checked
#: The same, for functions that allocate nothing: without reference counting of their array arguments, which
#: per call cost more than the function's own work.
inner: Any = njit(cache=True, _nrt=False)  # type: ignore[call-overload]  # an option numba's stubs lack
#: The same, with its body compiled into each compiled caller: arrays it allocates are then the caller's own, which
#: lets the compiler keep them apart from every other array in the caller's loop.
inlined: Any = njit(cache=True, inline="always")
