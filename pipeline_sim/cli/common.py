"""What every command shares: one-line errors, the plotting backend, output paths."""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import json
import os
import re
import shlex
import shutil
import signal
import sys
import textwrap
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, NoReturn, Sequence, TextIO

from ..allocator import keep_freed_memory
from ..cluster import CLUSTER_VARIABLE
from ..parallel import interrupt_behind

if TYPE_CHECKING:
    from sys import UnraisableHookArgs


class UserError(Exception):
    """A mistake in the user's input; reported as one line, exit status 2."""


class _HelpFormatter(argparse.HelpFormatter):
    """Help lines wrapped between words only, so that names such as critical-path or zb-adaptive stay whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


#: Worker processes per core at most on this machine: more only wait on one another, and a mistyped count would fork
#: thousands.
WORKERS_PER_CORE = 4


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, not usage plus message."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        # a value such as -1e-5 or -inf is a value to check, not an unknown flag (argparse knows only -1 and -1.5)
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def _parse_optional(self, arg_string):  # noqa: D102 - argparse's hook
        # before argparse reads -nan as -n with the value "an"
        if self._negative_number_matcher.match(arg_string) and not self._has_negative_number_optionals:
            return None
        return super()._parse_optional(arg_string)

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):  # noqa: D102 - argparse's hook
        # --workers on this machine: at most WORKERS_PER_CORE a core (a remote --cluster's workers are its own)
        namespace, extras = super().parse_known_args(args, namespace)
        workers, cores = getattr(namespace, "workers", None), os.cpu_count() or 1
        if isinstance(workers, int) and getattr(namespace, "cluster", None) in (None, "local") and \
                workers > WORKERS_PER_CORE * cores:
            self.error(f"argument --workers: {workers} must be from 1 to {WORKERS_PER_CORE * cores} "
                       f"({WORKERS_PER_CORE} per core of this machine's {cores})")
        return namespace, extras


def preset_or_object(key: str, text: str) -> str | dict:
    """A ``--model`` or ``--gpu`` value: a preset's name as given, or the object of fields its JSON spells."""
    if text.lstrip()[:1] not in ("{", "[", '"'):
        return text
    from ..model import ParameterError

    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ParameterError(key, text, f"is not a JSON object ({error.msg})") from None
    if not isinstance(value, dict):
        raise ParameterError(key, text, "is not a JSON object of fields, nor a preset's name")
    return value


def add_cluster_argument(parser: argparse.ArgumentParser) -> None:
    """``--cluster ADDRESS``, shared by the sweep and the planner (``cluster.connected`` opens it)."""
    parser.add_argument("--cluster", metavar="ADDRESS", default=os.environ.get(CLUSTER_VARIABLE) or None,
                        type=lambda text: "local" if text.strip().lower() == "local" else text,
                        help="run the simulations on the Dask cluster at ADDRESS (tcp://host:8786), or on a local "
                             "one of --workers processes with 'local'; needs pip install \"pipeline-sim[cluster]\" "
                             f"(default: ${CLUSTER_VARIABLE}, else this machine's process pool)")


def ready_kernel(episodes: bool = False, parts: Sequence[str] = ("figures", "records")) -> None:
    """Compile the entry points of ``parts`` of the simulation kernel (``engine.KERNEL_PARTS``) before any work, or
    load them, saying so, and how long it took, when this installation has not compiled them before; with
    ``episodes``, its step-by-step entry points too (a learned dispatcher, training). Worker processes forked
    afterwards share them. The command owns its process: from here on its allocator keeps what a simulation frees
    for the next one (``allocator.keep_freed_memory``; forked workers inherit it)."""
    keep_freed_memory()
    from ..compile_cache import NOTICES
    from ..engine import COMPILE_SECONDS, KERNEL_PARTS, REST_SECONDS, compile_kernel, kernel_is_compiled, mark_compiled
    from ..episode import EPISODE_COMPILE_SECONDS, compile_episode

    said = bool(NOTICES) or not kernel_is_compiled(parts)
    if said:  # nowhere to keep the compiled kernel is said instead of the usual line
        rest = not NOTICES and any(kernel_is_compiled((part,)) for part in KERNEL_PARTS)
        what = "the rest of the simulation kernel" if rest else "the simulation kernel"
        with _waiting(f"{NOTICES[0] if NOTICES else f'compiling {what}, once per installation'}, "
                      f"about {REST_SECONDS if rest else COMPILE_SECONDS} s{busy_note()}"):
            compile_kernel(parts)
    else:
        compile_kernel(parts)
    if episodes and kernel_is_compiled(("episodes",)):
        compile_episode()
    elif episodes:
        with _waiting("compiling the step-by-step kernel of learned and look-ahead dispatch, once per installation, "
                      f"about {EPISODE_COMPILE_SECONDS} s{busy_note()}"):
            compile_episode()
        mark_compiled(("episodes",))
    if NOTICES and not said:  # a damaged cache, found while loading it
        print(NOTICES[0], file=sys.stderr, flush=True)


def busy_note() -> str:
    """What an estimate of time (an idle machine's: a compile's, a simulation's) should add when other work already
    holds the cores."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this system
        return ""
    return f" on an idle machine; this one is busy (load {load:.1f} on {cores} cores)" if load >= cores else ""


@contextlib.contextmanager
def _waiting(message: str) -> Iterator[None]:
    """``message`` on one line of stderr while the block runs, ended by the seconds it took; on a terminal the
    seconds so far count up meanwhile."""
    start = time.monotonic()
    stop = threading.Event()

    def count() -> None:
        while not stop.wait(1.0):
            print(f"\r{message}: {time.monotonic() - start:.0f} s", end="", file=sys.stderr, flush=True)

    print(message, end="", file=sys.stderr, flush=True)
    counter = threading.Thread(target=count, daemon=True)
    if sys.stderr.isatty():
        counter.start()
    finished = False
    try:
        yield
        finished = True
    finally:
        stop.set()
        if counter.is_alive():
            counter.join()
        again = f"\r{message}" if counter.ident is not None else ""  # over the count, or after the message
        print(f"{again}: done in {time.monotonic() - start:.0f} s" if finished else "", file=sys.stderr, flush=True)


_INTERRUPTS: list[str] = []  # what stopped the run, kept past the signal handler


def _terminated(signum: int, frame: object) -> None:
    _INTERRUPTS.append("terminated")
    raise KeyboardInterrupt("terminated")


def _interrupted(signum: int, frame: object) -> None:
    _INTERRUPTS.append("interrupted")
    raise KeyboardInterrupt


def _unraisable(previous: Callable[[UnraisableHookArgs], object]) -> Callable[[UnraisableHookArgs], None]:
    """A hook for exceptions Python cannot raise: once our interrupt has arrived they are silent (the interrupt,
    lost there, is raised again by ``check_interrupt``; an object it cut short in its constructor fails in its
    destructor, as late as the interpreter's exit); before it, they go to ``previous``."""
    def hook(unraisable: UnraisableHookArgs) -> None:
        if not _INTERRUPTS:
            previous(unraisable)
    return hook


def bar_width() -> dict[str, Any]:
    """tqdm's size for a progress bar on stderr: the terminal's width, followed as it changes; 80 columns of 24 lines
    where the terminal says it has none (a pseudo-terminal of no size, as ``script`` and some CI runners make), in
    which tqdm would draw nothing at all."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # not a terminal, or no descriptor: tqdm's own handling
        return {"dynamic_ncols": True}
    return {"dynamic_ncols": True} if size.columns > 0 and size.lines > 0 else {"ncols": 80, "nrows": 24}


def check_interrupt() -> None:
    """Raise the interrupt again if one arrived. A signal handler's exception is lost when it lands in code
    that swallows exceptions (a garbage-collector callback, a destructor), so long loops ask here too."""
    if _INTERRUPTS:
        raise KeyboardInterrupt("terminated" if "terminated" in _INTERRUPTS else "")


def interrupt_status() -> int:
    """The exit status of a run stopped by a signal, as a shell gives it: 128 + the signal's number (SIGTERM 143,
    Ctrl-C 130)."""
    return 128 + (signal.SIGTERM if "terminated" in _INTERRUPTS else signal.SIGINT)


class _QuietWhenClosed:
    """Standard output that, once its reader has gone (``| head``), writes nowhere and lets the run go on: what it
    writes to files (a sweep's CSV, the planner's) is still written."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # a stream without a descriptor has no reader to lose
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_command(prog: str, body: Callable[[], int], resumes: bool = False) -> int:
    """Run a command's body, turning user mistakes and interrupts into one line and an exit status.

    SIGTERM is handled as Ctrl-C is: the run stops cleanly and says how to resume (exit status 143 against 130). A
    full disk is said with what to do: free space and run again, with ``--resume`` for a command that ``resumes``.
    """
    _INTERRUPTS.clear()
    previous = signal.signal(signal.SIGTERM, _terminated)
    previous_int = signal.signal(signal.SIGINT, _interrupted)
    previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable(sys.unraisablehook)
    stdout, sys.stdout = sys.stdout, _QuietWhenClosed(sys.stdout)
    try:
        return body()
    except BrokenPipeError:
        # The reader of our output has gone (``| head``) where it is written past the wrapper: nothing is wrong with
        # the work, so stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
        return 0
    except (UserError, ValueError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        where = f"{error.filename}: " if error.filename else ""
        again = " with --resume, to continue where it stopped" if resumes else ""
        advice = f"; free some space and run the command again{again}" if error.errno == errno.ENOSPC else ""
        print(f"{prog}: error: {where}{error.strerror or error}{advice}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, SystemError) as error:
        interrupt = interrupt_behind(error)
        if interrupt is None:
            raise
        print(f"\n{prog}: {str(interrupt) or 'interrupted'}", file=sys.stderr)
        return interrupt_status()
    finally:
        sys.stdout = stdout
        if previous is not None:  # a command run in-process leaves its caller as it was
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
        if not _INTERRUPTS:  # after an interrupt, the exit's destructors stay silent too
            sys.unraisablehook = previous_hook


def exit_with(status: int) -> NoReturn:
    """End a script's process with ``status``. Every object is frozen first (kept out of the collector's reach),
    which spares the interpreter's exit its collections over all that the libraries loaded, numba's most: 0.8 s of
    the main command's 7 on this package's 2-core reference machine. The process ends and its memory with it."""
    gc.freeze()
    raise SystemExit(status)


def positive_int(text: str) -> int:
    return bounded_int(text, 1)




def bounded_int(text: str, low: int, high: int | None = None) -> int:
    """``text`` as an integer from ``low`` to ``high`` (no bound: None), or the argument's one-line error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low or high is not None and value > high:
        raise argparse.ArgumentTypeError(f"{value} must be >= {low}" if high is None else
                                         f"{value} must be from {low} to {high:,}")
    return value


def use_display(no_show: bool) -> bool:
    """Choose the matplotlib backend before pyplot is imported; True when a window may be shown."""
    import matplotlib

    has_display = sys.platform in ("darwin", "win32") or \
        bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    show = has_display and not no_show
    if not show:
        matplotlib.use("Agg")
    return show


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """``1 environment``, ``2,178 environments``: ``number`` and ``noun`` in its number (``plural``, or the noun and
    an s)."""
    return f"{number:,} {noun if number == 1 else plural or noun + 's'}"


def command_to_resume() -> str:
    """The command this process runs, as typed, with ``--resume``: what continues its work after an interruption
    (each setting it was given, so that the resume finds the sweep they made)."""
    script, *args = sys.argv
    python = os.path.basename(sys.executable)  # as the user would type it, where that name runs a Python
    program = [python if shutil.which(python) else sys.executable, script] if script.endswith(".py") else \
        [os.path.basename(script)]
    return shlex.join([*program, *args, *([] if "--resume" in args else ["--resume"])])


def script_name(path: str) -> str:
    """The name a command reports itself by: the script's file name."""
    return os.path.basename(path)
