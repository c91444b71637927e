"""Writing outputs so that an interrupted run never leaves a half-written file behind, and never replaces
what is not an ordinary file."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class OutputError(ValueError):
    """An output path that cannot or must not be written; the message is one line."""


def output_target(path: str | os.PathLike) -> Path:
    """Where writing ``path`` really goes: the path itself, or a symlink's target.

    Refuses (``OutputError``) a path that exists and is not a regular file (a folder, a
    device, a FIFO, a socket), a symlink to one, and a path with a file where a folder
    should be.
    """
    target = Path(path)
    if target.is_symlink():
        target = target.resolve()
    for parent in reversed(target.parents):
        if parent.exists() and not parent.is_dir():
            raise OutputError(f"cannot write {path}: {parent} is a file, not a folder")
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target
    except OSError as error:
        raise OutputError(f"cannot write {path}: {error.strerror}") from None
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        raise OutputError(f"{path} is {kind}; give the path of a file to write")
    return target


def output_folder(path: str | os.PathLike) -> Path:
    """A folder to write into: refused (``OutputError``) when it, or a folder on its way, is a file."""
    folder = Path(path)
    for part in (*reversed(folder.parents), folder):
        if part.exists() and not part.is_dir():
            raise OutputError(f"cannot write into {path}: {part} is a file, not a folder")
    return folder


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; it replaces ``path`` only if the block succeeds.

    A symlink is written through (its target is replaced, the link stays).
    """
    target = output_target(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    except OSError as error:
        raise OSError(error.errno, f"cannot write {path}: {error.strerror or error}") from None
    os.close(handle)
    os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes files private; outputs are ordinary files
    try:
        yield Path(temporary)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


@contextmanager
def exclusive_writer(output: Path) -> Iterator[None]:
    """Hold ``<output>.lock`` for the block: a second run on the same output is refused, naming the first's pid.

    The lock is the kernel's (``flock``), so a run killed outright releases it.
    """
    lock = output.with_name(output.name + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as error:
        raise OSError(error.errno, f"cannot write {output}: {error.strerror or error}") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            holder = os.pread(handle, 32, 0).decode(errors="replace").strip() or "unknown"
            raise OutputError(f"another run (pid {holder}) is writing {output}; wait for it to finish or choose "
                              f"another output") from None
        os.ftruncate(handle, 0)
        os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)
    finally:
        os.close(handle)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
