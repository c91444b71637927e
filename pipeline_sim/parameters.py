"""What an environment parameter is: its type, domain, default, help and short labels, said once.

``EnvParams`` (model.py) declares each of its fields with ``parameter(...)``; that class
body is the one table of the environment's parameters. ``PARAMETERS`` reads it back, and
from it come the visualizers' flags, the config checks, the CSV columns, the heatmaps'
file names and the figures' titles.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from difflib import get_close_matches
from typing import Any

#: Bounds of a task's work (docs/model.md section 9): every accepted environment gives finite times. Work below
#: ``UNIT_FLOOR`` is not swallowed by the engine's tolerances, because such an environment is simulated in a time
#: unit of its own (``EnvParams.time_unit``); ``MIN_LENGTH`` is a picosecond for a workload's seconds.
MIN_LENGTH, MAX_LENGTH = 1e-12, 1e9
#: The shortest work the engine's absolute grains (1e-9) were chosen for: a thousand of them. Environments whose
#: every work reaches it are simulated in their own unit, as they always were.
UNIT_FLOOR = 1e-6

#: Parameter groups, in the order flags, file names and titles list them. A group's parameters matter to a
#: simulation only under a condition (``EnvParams.relevant``): the schedule's own, and the noise's when there is any.
GROUPS = ("environment", "schedule", "stages", "optimizer", "strategies", "dispatch", "jitter", "straggler",
          "lengths")
#: Groups whose parameters a grid's output has columns for only when the grid names one of them, so that a grid
#: written before they existed writes the columns it always wrote.
OPTIONAL_GROUPS = ("stages", "optimizer", "strategies", "dispatch", "lengths")


class ParameterError(ValueError):
    """An invalid parameter; ``name`` is the parameter, the message says what is allowed."""

    def __init__(self, name: str, value: object, allowed: str) -> None:
        super().__init__(f"{name} = {value!r}: {allowed}")
        self.name = name
        self.value = value
        self.allowed = allowed

    def __reduce__(self) -> tuple[type, tuple[str, object, str]]:
        """Made again from its three parts: an error raised in a worker process reaches the parent whole."""
        return type(self), (self.name, self.value, self.allowed)


class _NotGiven:
    """The value of a field left out, as an error names it."""

    def __repr__(self) -> str:
        return "not given"


#: The value a ``ParameterError`` names for a field that was left out.
NOT_GIVEN = _NotGiven()


def _is_real(value: object) -> bool:
    if type(value) is float or type(value) is int:  # most values: without numbers.Real's slower abstract check
        return math.isfinite(value)
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Integers:
    """Integers from ``minimum``, up to ``maximum`` when there is one."""

    minimum: int
    maximum: int | None = None
    maximum_text: str = ""  # how the bound reads, when its digits would not (``2^63 - 1``)

    def check(self, name: str, value: object) -> None:
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)) or \
                int(value) < self.minimum or \
                (self.maximum is not None and int(value) > self.maximum):
            raise ParameterError(name, value, f"must be {self.describe()}")

    def describe(self) -> str:
        if self.maximum is None:
            return f"an integer >= {self.minimum}"
        return f"an integer from {self.minimum} to {self.maximum_text or self.maximum}"


@dataclass(frozen=True)
class Interval:
    """Finite numbers from ``low`` (excluded when ``low_open``), below ``high`` (or to it, ``high_closed``) when
    there is a ``high``."""

    low: float
    high: float | None = None
    low_open: bool = False
    high_closed: bool = False

    def check(self, name: str, value: object) -> None:
        ok = _is_real(value)
        if ok:
            number = float(value)  # type: ignore[arg-type]
            ok = (number > self.low if self.low_open else number >= self.low) and \
                (self.high is None or (number <= self.high if self.high_closed else number < self.high))
        if not ok:
            raise ParameterError(name, value, f"must be {self.describe()}")

    def describe(self) -> str:
        if self.high is None:
            return f"a finite number {'>' if self.low_open else '>='} {self.low:g}"
        return (f"a finite number with {self.low:g} {'<' if self.low_open else '<='} x "
                f"{'<=' if self.high_closed else '<'} {self.high:g}")

    @property
    def brief(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{']' if self.high_closed else ')'}"


@dataclass(frozen=True)
class Lengths:
    """The work of a task: ``MIN_LENGTH`` to ``MAX_LENGTH``, or 0 when ``zero`` (no such task)."""

    zero: bool = False

    def check(self, name: str, value: object) -> None:
        if not (_is_real(value) and (MIN_LENGTH <= float(value) <= MAX_LENGTH  # type: ignore[arg-type]
                                     or (self.zero and value == 0))):
            raise ParameterError(name, value, f"must be {self.describe()}")

    def describe(self) -> str:
        allowed = f"0 or {MIN_LENGTH:g}..{MAX_LENGTH:g}" if self.zero else f"from {MIN_LENGTH:g} to {MAX_LENGTH:g}"
        return f"a finite number {allowed}"

    @property
    def brief(self) -> str:
        return f"0 or {MIN_LENGTH:g} to {MAX_LENGTH:g}" if self.zero else f"{MIN_LENGTH:g} to {MAX_LENGTH:g}"


@dataclass(frozen=True)
class Names:
    """One of ``names``."""

    names: tuple[str, ...]
    case_insensitive: bool = False

    def check(self, name: str, value: object) -> None:
        if not isinstance(value, str) or self.normal(value) not in self.names:
            # a name spelt another way ('look-ahead', 'critical_path') is told the one meant
            near = get_close_matches(self.normal(value).replace("_", "-"), self.names, n=1, cutoff=0.75) \
                if isinstance(value, str) else []
            raise ParameterError(name, value, (f"did you mean {near[0]!r}? It " if near else "") +
                                 f"must be {self.describe()}")

    def normal(self, value: str) -> str:
        return value.strip().lower() if self.case_insensitive else value

    def describe(self) -> str:
        return f"one of {', '.join(self.names)}"

    @property
    def brief(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class Dispatchers(Names):
    """One of ``names``, or ``learned:<file>``: a policy file of a learned scheduler (docs/model.md section 12.5)."""

    PREFIX = "learned:"

    def check(self, name: str, value: object) -> None:
        if isinstance(value, str) and self.normal(value).startswith(self.PREFIX):
            if not value.strip()[len(self.PREFIX):].strip():
                raise ParameterError(name, value, "must name a policy file after learned:")
            return
        super().check(name, value)

    def normal(self, value: str) -> str:
        """The rule's name in lower case; a policy file's name as given."""
        text = value.strip()
        if text.lower().startswith(self.PREFIX):
            return self.PREFIX + text[len(self.PREFIX):].strip()
        return text.lower()

    def describe(self) -> str:
        return f"{super().describe()}, or learned:<policy file>"

    def shown(self, value: str) -> str:
        """``value`` in a title: a policy file by its name, without its folders (``learned:policy.npz``)."""
        if value.startswith(self.PREFIX):
            return self.PREFIX + value[len(self.PREFIX):].replace("\\", "/").rsplit("/", 1)[-1]
        return value

    def file_name(self, value: str) -> str:
        """``value`` in a file name (after ``shown``): a policy file by its stem (``learned-policy``)."""
        if value.startswith(self.PREFIX):
            return "learned-" + value[len(self.PREFIX):].rsplit(".", 1)[0]
        return value


@dataclass(frozen=True)
class TableFiles(Names):
    """A JSON file of every task's length (``tables.read_table``), named as given; empty for none. Only the name is
    judged here: the environment never reads a file, the engine does when it needs the lengths."""

    SUFFIX = ".json"

    def check(self, name: str, value: object) -> None:
        if not isinstance(value, str) or (value.strip() and not value.strip().lower().endswith(self.SUFFIX)):
            raise ParameterError(name, value, f"must be {self.describe()}")

    def normal(self, value: str) -> str:
        return value.strip()

    def describe(self) -> str:
        return "a table of lengths: a JSON file (.json), as pipeline_trace.py replay --lengths-out writes one"

    @property
    def brief(self) -> str:
        return "a .json file"

    @staticmethod
    def shown(value: str) -> str:
        """A table in a title: its file's name, without its folders."""
        return value.replace("\\", "/").rsplit("/", 1)[-1]

    @staticmethod
    def file_name(value: str) -> str:
        """A table in a file name (after ``shown``): its file's stem."""
        return value.rsplit(".", 1)[0]


@dataclass(frozen=True)
class Weights:
    """One factor per stage, each a finite number from ``low`` to ``high``; empty means every factor is 1. How many
    there must be depends on the environment (its stage count), so the environment checks the count."""

    low: float = 1e-3
    high: float = 1e3

    def check(self, name: str, value: object) -> None:
        if type(value) is tuple and value and set(map(type, value)) == {float} and \
                not any(map(math.isnan, value)) and self.low <= min(value) and max(value) <= self.high:
            return  # the common case, a tuple of floats, without a Python step per stage
        if not isinstance(value, (list, tuple)) or \
                not all(_is_real(x) and self.low <= float(x) <= self.high for x in value):
            raise ParameterError(name, value, f"must be {self.describe()}")

    def describe(self) -> str:
        return f"a list of finite numbers from {self.low:g} to {self.high:g}, one per stage (empty: every stage 1)"

    @property
    def brief(self) -> str:
        return f"one number from {self.low:g} to {self.high:g} per stage, comma-separated"

    @staticmethod
    def parse(text: str, name: str = "stage_weights") -> tuple[float, ...]:
        """Weights of parameter ``name`` from a flag or a CSV cell: numbers separated by commas or spaces
        (``2,1,1,1``, ``2.0 1.0``)."""
        inner = text.strip().strip("[]()")
        if text.strip().startswith("(") and inner.endswith(","):  # a tuple of one, as Python writes it: (2.0,)
            inner = inner[:-1]
        words = [word.strip() for word in inner.split(",")] if "," in inner else inner.split()
        if "" in words:  # "1,,1" or "1,1,": a weight left out, which would shift every stage after it
            raise ParameterError(name, text, "has an empty weight between commas; give one number per stage, e.g. "
                                             "2,1,1,1")
        try:
            return tuple(float(word) for word in words)
        except ValueError:
            raise ParameterError(name, text, "must be numbers separated by commas, e.g. 2,1,1,1") from None

    @staticmethod
    def cell(value: tuple[float, ...]) -> str:
        """A CSV cell: every weight exactly, separated by spaces (empty: every stage 1)."""
        return " ".join(repr(x) for x in value)


Domain = Integers | Interval | Lengths | Names | Weights


@dataclass(frozen=True)
class Parameter:
    """One environment parameter. ``short`` labels its value in file names (``fi`` in ``_fi0.2``; empty: the
    value alone), ``label`` in titles (``fwd impact=0.2``; empty: the value alone); ``flags`` are the
    visualizers' (by default ``--name-with-dashes``, and the alias's); ``alias`` another name a config accepts, the
    word other tools use for it (``pipeline_parallel``)."""

    name: str
    type: type
    default: Any
    domain: Domain
    help: str
    short: str
    label: str
    group: str
    metavar: str | None = None
    flags: tuple[str, ...] = ()
    alias: str | None = None

    @property
    def flag_names(self) -> tuple[str, ...]:
        names = self.flags or ("--" + self.name.replace("_", "-"),)
        return names + (("--" + self.alias.replace("_", "-"),) if self.alias else ())

    @property
    def flag(self) -> str:
        """How errors name its flag: ``--fwd-impact``, ``-n/--num_groups``."""
        return "/".join(self.flag_names)

    @property
    def allowed(self) -> str:
        """The domain in a few words, for --help."""
        domain = self.domain
        if isinstance(domain, Integers):
            return f">= {domain.minimum}" if domain.maximum is None else \
                f"{domain.minimum} to {domain.maximum_text or domain.maximum}"
        return domain.brief

    def text(self, value: object) -> str:
        """A value as titles and file names show it: numbers in ``g`` format; a list compactly, runs of one value
        counted (``2,1x14,1.5``)."""
        if isinstance(value, tuple):
            runs: list[list] = []
            for x in value:
                if runs and runs[-1][0] == x:
                    runs[-1][1] += 1
                else:
                    runs.append([x, 1])
            return ",".join(f"{x:g}" + (f"x{count}" if count > 1 else "") for x, count in runs)
        if isinstance(value, float):
            return f"{value:g}"
        return getattr(self.domain, "shown", str)(str(value))

    def slug(self, value: object) -> str:
        text = self.text(value)
        return f"{self.short}{getattr(self.domain, 'file_name', str)(text).replace(',', '-')}"

    def title(self, value: object) -> str:
        return f"{self.label}={self.text(value)}" if self.label else self.text(value)


_TYPES = {"int": int, "float": float, "str": str, "tuple[float, ...]": tuple}


def parameter(default: Any, domain: Domain, help: str, *, short: str, label: str, group: str,
              metavar: str | None = None, flags: tuple[str, ...] = (), alias: str | None = None) -> Any:
    """A dataclass field that carries its parameter's metadata (``parameters_of`` reads it back)."""
    if group not in GROUPS:
        raise ValueError(f"group {group!r} is none of {GROUPS}")
    return field(default=default, metadata={"parameter": dict(domain=domain, help=help, short=short, label=label,
                                                               group=group, metavar=metavar, flags=flags,
                                                               alias=alias)})


def parameters_of(cls: type) -> tuple[Parameter, ...]:
    """The parameters a dataclass declares with ``parameter(...)``, in field order."""
    return tuple(Parameter(name=f.name, type=_TYPES[str(f.type)], default=f.default, **f.metadata["parameter"])
                 for f in fields(cls))
