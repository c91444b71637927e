"""Reading an input file within a size limit: a file that is endless (``/dev/zero``) or far larger than any input
of its kind is refused after ``limit`` bytes, never read whole."""

from __future__ import annotations

import errno
import os
import select
import stat
from typing import BinaryIO


class TooLarge(ValueError):
    """An input larger than its kind allows; the message says the limit."""


#: Seconds a named pipe may stay silent before it is taken for one that no program will write to.
PIPE_SECONDS = 10.0


def open_input(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened to read bytes, as ``open`` would, except that a named pipe is waited on for its first bytes
    at most ``PIPE_SECONDS`` (an ``OSError`` then, naming it) rather than for ever; POSIX only (elsewhere ``open``)."""
    nonblocking = getattr(os, "O_NONBLOCK", 0)
    if not nonblocking:
        return open(path, "rb")
    descriptor = os.open(path, os.O_RDONLY | nonblocking)  # a pipe opens at once, writer or not
    try:
        mode = os.fstat(descriptor).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if stat.S_ISFIFO(mode) and not select.select([descriptor], [], [], PIPE_SECONDS)[0]:
            raise OSError(errno.ETIMEDOUT, f"a named pipe nothing wrote to within {PIPE_SECONDS:g} s", str(path))
        import fcntl
        fcntl.fcntl(descriptor, fcntl.F_SETFL, fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~nonblocking)
        return os.fdopen(descriptor, "rb")  # reads wait for the writer, as a file's would
    except BaseException:
        os.close(descriptor)
        raise


def where_relative(path: str | os.PathLike) -> str:
    """For a relative ``path`` that names no file, the folder it was looked for in (the current one, not the
    config's: ``configs/tables/1f1b.json`` is read from the project's folder): "; a relative path is read from
    <folder>"; else ""."""
    if os.path.isabs(path) or os.path.exists(path):
        return ""
    return f"; a relative path is read from the current folder, {os.getcwd()}"


def read_at_most(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of ``path``; ``TooLarge`` when it holds more than ``limit``, read no further than that. ``OSError``
    as ``open`` raises it."""
    with open_input(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"larger than {limit // 2 ** 20} MB")
    return data
