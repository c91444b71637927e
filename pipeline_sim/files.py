"""Writing outputs so that an interrupted run never leaves a half-written file behind, and never replaces
what is not an ordinary file."""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import os
import re
import stat
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator


class OutputError(ValueError):
    """An output path that cannot or must not be written; the message is one line."""


class WriteError(OSError):
    """An output that could not be written (a full disk, say); the message names it."""


class LockLost(OutputError):
    """A lock file this run holds was removed or replaced by hand: another run may now hold that name."""


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
        raise OutputError(f"{path} is {_kind(mode)}; give the path of a file to write")
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
    """Yield a temporary path beside ``path``; it replaces ``path`` only if the block succeeds. A failure to write
    (a full disk) names ``path``.

    A symlink is written through (its target is replaced, the link stays). When this process holds the lock of
    ``path`` (or of its folder), the temporaries a killed writer of ``path`` left beside it are removed first: no
    other run may be writing them.
    """
    target = output_target(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if _locked_here(target):
            for leftover in target.parent.glob(f".{glob.escape(target.name)}.*{glob.escape(target.suffix)}"):
                if _TEMPORARY.fullmatch(leftover.name[len(target.name) + 2:len(leftover.name) - len(target.suffix)]):
                    leftover.unlink(missing_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    except OSError as error:
        raise WriteError(error.errno, f"cannot write {path}: {error.strerror or error}") from None
    os.close(handle)
    os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes files private; outputs are ordinary files
    try:
        yield Path(temporary)
        os.replace(temporary, target)
    except WriteError:
        raise  # another output's, named already
    except OSError as error:
        raise WriteError(error.errno, f"cannot write {path}: {error.strerror or error}") from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


#: The random part of a name ``tempfile.mkstemp`` makes.
_TEMPORARY = re.compile(r"[a-z0-9_]{8}")


def _locked_here(target: Path) -> bool:
    """Whether this process holds the lock of ``target`` or of a folder it lies in."""
    where = Path(os.path.abspath(target))
    return any(Path(os.path.abspath(output)) in (where, *where.parents) for _, output in _held.values())


#: The locks this process holds, by lock path: its descriptor and the output it guards. A run nests blocks of one
#: lock (the whole pipeline holds its CSV while the sweep inside it takes the same lock): the outermost holds it.
_held: dict[Path, tuple[int, Path]] = {}


def lock_path(output: Path) -> Path:
    """Where the lock of ``output`` (a file or a folder) lives: ``<output>.lock`` beside it."""
    output = Path(os.path.abspath(output))
    return output.with_name(output.name + ".lock") if output.name else output / ".lock"


@contextmanager
def exclusive_writer(output: Path | None) -> Iterator[None]:
    """Hold the lock of ``output`` for the block: a second run on the same output is refused, naming the first's
    pid. Nothing is locked when ``output`` is None.

    The lock is the operating system's (``flock``) on ``<output>.lock``, so it ends with the
    process however it ends, and there is never a stale lock to delete. The file is opened
    without following a link and must be an ordinary file, so nothing is written through a
    link, a FIFO or a device put there. The holder removes the file while it still holds
    the lock; a run that locked the removed file sees that the path no longer names it and
    tries again, so two runs never hold two different files of one path. A lock file
    removed or replaced by hand is found at the holder's next ``check_locks``.
    """
    if output is None:
        yield
        return
    lock = lock_path(output)
    if lock in _held:
        yield
        return
    handle = _take(lock, output)
    _held[lock] = (handle, output)
    try:
        yield
    finally:
        del _held[lock]
        try:
            if _names(lock, handle):  # a file put in its place by hand may be another run's lock now
                lock.unlink()  # while still locked: see above
        finally:
            os.close(handle)


def _take(lock: Path, output: Path) -> int:
    """Open and lock ``lock``; the descriptor, or ``OutputError`` in one line."""
    while True:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            # O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOFOLLOW: never through a link.
            handle = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise OutputError(f"{lock} is a link; remove it (the lock of {output} must be an ordinary "
                                  f"file)") from None
            if error.errno == errno.EISDIR:
                raise OutputError(f"{lock} is a folder; remove it (the lock of {output} must be an ordinary "
                                  f"file)") from None
            raise OSError(error.errno, f"cannot write {output}: {error.strerror or error} (its folder "
                                       f"{lock.parent} takes no lock file beside it)") from None
        try:
            mode = os.fstat(handle).st_mode
            if not stat.S_ISREG(mode):
                raise OutputError(f"{lock} is {_kind(mode)}; remove it (the lock of {output} must be an "
                                  f"ordinary file)")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                if error.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise OSError(error.errno, f"cannot lock {lock}: {error.strerror or error}") from None
                holder = os.pread(handle, 32, 0).decode(errors="replace").strip() or "unknown"
                raise OutputError(f"another run (pid {holder}) is writing {output}; wait for it to finish or "
                                  f"choose another output") from None
            if _names(lock, handle):
                os.ftruncate(handle, 0)
                os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
                return handle
        except BaseException:
            os.close(handle)
            raise
        os.close(handle)  # the holder removed this file as we locked it: lock the path's new file


def check_locks() -> None:
    """At a commit point (rows, a part or a figure about to be written): every lock this process holds is still
    the file at its path. Else ``LockLost``, naming the lock: a run that then took that name may write the same
    output, so this one stops before writing more."""
    for lock, (handle, output) in _held.items():
        if not _names(lock, handle):
            how = "replaced" if os.path.lexists(lock) else "removed"
            raise LockLost(f"{lock} was {how} while this run held it, so another run may be writing {output}; "
                           f"stopped before writing more")


def hold(path: Path, stack: ExitStack) -> None:
    """Lock ``path`` itself, a partial file or folder that a run continues, replaces or writes, until ``stack``
    closes; nothing when it does not exist. Its output's lock keeps a second run out unless that lock file was
    removed by hand; this one still does, so that a partial is never written by two runs. ``OutputError`` when
    another process holds it."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    stack.callback(os.close, handle)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise OSError(error.errno, f"cannot lock {path}: {error.strerror or error}") from None
        raise OutputError(f"another run is writing {path} (the lock file beside it was removed or replaced by "
                          f"hand); wait for it to finish or choose another output") from None


def _names(lock: Path, handle: int) -> bool:
    """Whether the path ``lock`` names the file open as ``handle``."""
    try:
        return os.path.samestat(os.fstat(handle), os.lstat(lock))
    except FileNotFoundError:
        return False


def _kind(mode: int) -> str:
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "not a regular file")


def file_digest(path: str | os.PathLike) -> str:
    """A file's checksum (BLAKE2b, 128 bits, in hex), read in blocks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
