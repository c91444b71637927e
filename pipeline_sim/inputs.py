"""Reading an input file within a size limit: a file that is endless (``/dev/zero``) or far larger than any input
of its kind is refused after ``limit`` bytes, never read whole."""

from __future__ import annotations

import os
from typing import BinaryIO


class TooLarge(ValueError):
    """An input larger than its kind allows; the message says the limit."""


def open_input(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened to read bytes, as ``open`` would, except that a named pipe no program writes to is opened at
    once (and reads as empty) rather than waited on for ever."""
    nonblocking = getattr(os, "O_NONBLOCK", 0)
    descriptor = os.open(path, os.O_RDONLY | nonblocking)
    if nonblocking:  # a pipe's reads wait for its writer again, as a file's would
        import fcntl
        fcntl.fcntl(descriptor, fcntl.F_SETFL, fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~nonblocking)
    return os.fdopen(descriptor, "rb")


def read_at_most(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of ``path``; ``TooLarge`` when it holds more than ``limit``, read no further than that. ``OSError``
    as ``open`` raises it."""
    with open_input(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"larger than {limit // 2 ** 20} MB")
    return data
