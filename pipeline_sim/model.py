"""Parameters, task kinds, policies and the result records of one simulation.

Times are abstract units (say, 1.0 = one forward pass at full speed); rates are
fractions of full speed (compute) or of one link's bandwidth (communication).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Mapping


class TaskKind(StrEnum):
    """What a task is. Compares equal to its plain name (``TaskKind.FORWARD == "forward"``)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    FWD_PROP = "fwd_prop"
    GRAD_PROP = "grad_prop"
    GRAD_SYNC = "grad_sync"

    @property
    def code(self) -> str:
        return _KIND_CODE[self]

    @property
    def is_compute(self) -> bool:
        return self in (TaskKind.FORWARD, TaskKind.BACKWARD)


_KIND_CODE = {
    TaskKind.FORWARD: "F",
    TaskKind.BACKWARD: "B",
    TaskKind.FWD_PROP: "FP",
    TaskKind.GRAD_PROP: "GP",
    TaskKind.GRAD_SYNC: "GS",
}
_CODE_KIND = {code: kind for kind, code in _KIND_CODE.items()}

#: The communication kinds, in the order that breaks exclusive-tier ties.
COMM_KINDS: tuple[TaskKind, ...] = (TaskKind.FWD_PROP, TaskKind.GRAD_PROP, TaskKind.GRAD_SYNC)


@dataclass(frozen=True, slots=True)
class TaskId:
    """A task's identity, with the text form ``<gpu><code><index>`` (``"2F0"``, ``"1GS3"``)."""

    kind: TaskKind
    gpu: int
    index: int

    def __str__(self) -> str:
        return f"{self.gpu}{self.kind.code}{self.index}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        match = re.fullmatch(r"(\d+)([A-Z]+)(\d+)", text.strip())
        if not match or match.group(2) not in _CODE_KIND:
            raise ValueError(f"task id {text!r} is not of the form <gpu><F|B|FP|GP|GS><index>, e.g. '2F0'")
        return cls(_CODE_KIND[match.group(2)], int(match.group(1)), int(match.group(3)))


@dataclass(slots=True, eq=False)
class Task:
    """One task of an iteration and what happened to it.

    ``gpu`` is the GPU doing the work (the sender, for transfers); ``index`` is the
    micro-batch, or the sync ordinal for ``grad_sync``. ``segments`` lists
    ``(t0, t1, rate)`` for every stretch in which the task progressed at a constant
    positive rate; a zero-length task has none and ``start == end == ready``.
    ``throttled_time`` is how long a transfer ran below its sender-only share.
    """

    kind: TaskKind
    gpu: int
    index: int
    length: float
    ready: float = math.nan
    start: float = math.nan
    end: float = math.nan
    throttled: bool = False
    throttled_time: float = 0.0
    segments: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def id(self) -> TaskId:
        return TaskId(self.kind, self.gpu, self.index)

    @property
    def label(self) -> str:
        """Short label for charts: ``F3``, ``B3``, ``FP3``, ``GS0``."""
        return f"{self.kind.code}{self.index}"

    def __repr__(self) -> str:
        return (f"Task({self.id}, ready={self.ready:.6g}, start={self.start:.6g}, "
                f"end={self.end:.6g}, throttled={self.throttled})")


class ParameterError(ValueError):
    """An invalid parameter; ``name`` is the parameter, the message says what is allowed."""

    def __init__(self, name: str, value: object, allowed: str) -> None:
        super().__init__(f"{name} = {value!r}: {allowed}")
        self.name = name
        self.value = value


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ParameterError(name, value, f"must be an integer >= {minimum}")


def _check_float(name: str, value: object, low: float, *, low_open: bool = False,
                 high: float | None = None) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value < high)
    if not ok:
        allowed = f"{'>' if low_open else '>='} {low:g}"
        if high is not None:
            allowed = f"with {low:g} <= x < {high:g}"
        raise ParameterError(name, value, f"must be a finite number {allowed}")


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvParams:
    """One environment (docs/model.md section 1). Invalid values raise ``ValueError``."""

    n: int = 8
    num_gpus: int = 4
    sync_freq: int = 1
    fwd_len: float = 1.0
    bwd_len: float = 2.0
    prop_len: float = 1.0
    sync_base_len: float = 2.0
    fwd_impact: float = 0.2
    bwd_impact: float = 0.2
    ingress_capacity: float = 1.0

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1)
        _check_int("num_gpus", self.num_gpus, 1)
        _check_int("sync_freq", self.sync_freq, 1)
        _check_float("fwd_len", self.fwd_len, 0.0, low_open=True)
        _check_float("bwd_len", self.bwd_len, 0.0, low_open=True)
        _check_float("prop_len", self.prop_len, 0.0)
        _check_float("sync_base_len", self.sync_base_len, 0.0)
        _check_float("fwd_impact", self.fwd_impact, 0.0, high=1.0)
        _check_float("bwd_impact", self.bwd_impact, 0.0, high=1.0)
        _check_float("ingress_capacity", self.ingress_capacity, 0.0, low_open=True)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def as_dict(self) -> dict[str, int | float]:
        return {name: getattr(self, name) for name in self.names()}

    @property
    def ideal_time(self) -> float:
        """Textbook 1F1B time with free communication: ``(n + p - 1) x (fwd_len + bwd_len)``."""
        return (self.n + self.num_gpus - 1) * (self.fwd_len + self.bwd_len)


_TIER_RE = re.compile(r"[a-z]")


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """Communication priorities of every sending GPU (docs/model.md section 3.1).

    A kind with an exclusive tier (a letter, ``'a'`` highest) ignores any shared
    priority it is also given. A kind with neither gets shared priority 1.0.
    """

    priorities: Mapping[str, float] = field(default_factory=dict)
    exclusive_tiers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = ", ".join(COMM_KINDS)
        for kind, value in self.priorities.items():
            if kind not in COMM_KINDS:
                raise ParameterError("priorities", kind, f"unknown kind; allowed kinds: {names}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ParameterError(f"priorities[{kind}]", value, "must be a number in [0, 1]")
        for kind, tier in self.exclusive_tiers.items():
            if kind not in COMM_KINDS:
                raise ParameterError("exclusive_tiers", kind, f"unknown kind; allowed kinds: {names}")
            if not isinstance(tier, str) or not _TIER_RE.fullmatch(tier):
                raise ParameterError(f"exclusive_tiers[{kind}]", tier, "must be one letter 'a'..'z' ('a' highest)")
        # Normalise to plain dicts in kind order so that equal policies compare and hash alike.
        object.__setattr__(self, "priorities",
                           {TaskKind(k).value: float(self.priorities[k]) for k in COMM_KINDS if k in self.priorities})
        object.__setattr__(self, "exclusive_tiers",
                           {TaskKind(k).value: self.exclusive_tiers[k] for k in COMM_KINDS if k in self.exclusive_tiers})

    def __hash__(self) -> int:
        return hash((tuple(self.priorities.items()), tuple(self.exclusive_tiers.items())))

    def tier(self, kind: str) -> str | None:
        return self.exclusive_tiers.get(kind)

    def shared_priority(self, kind: str) -> float:
        return self.priorities.get(kind, 1.0)

    @property
    def label(self) -> str:
        """Short readable form: exclusive kinds by tier (``S>F=G``), then shared shares (``F0.5 G0.3``)."""
        letter = {TaskKind.FWD_PROP: "F", TaskKind.GRAD_PROP: "G", TaskKind.GRAD_SYNC: "S"}
        tiers = sorted(set(self.exclusive_tiers.values()))
        exclusive = ">".join("=".join(letter[TaskKind(k)] for k in COMM_KINDS if self.exclusive_tiers.get(k) == t)
                             for t in tiers)
        shared = " ".join(f"{letter[k]}{self.shared_priority(k):g}" for k in COMM_KINDS if k not in self.exclusive_tiers)
        return " | ".join(part for part in (exclusive, shared) if part)


def one_f_one_b_order(stage: int, n: int, num_gpus: int) -> list[tuple[TaskKind, int]]:
    """Compute order of one stage: warm-up forwards, then one forward / one backward, then the rest.

    This is the order of Megatron-LM's non-interleaved schedule and PyTorch's ``Schedule1F1B``.
    """
    warmup = min(num_gpus - stage - 1, n)
    order = [(TaskKind.FORWARD, m) for m in range(warmup)]
    next_backward = 0
    for m in range(warmup, n):
        order.append((TaskKind.FORWARD, m))
        order.append((TaskKind.BACKWARD, next_backward))
        next_backward += 1
    order.extend((TaskKind.BACKWARD, m) for m in range(next_backward, n))
    return order


def sync_points(n: int, sync_freq: int) -> list[int]:
    """Micro-batches whose backward is followed by a ``grad_sync``, in order."""
    points = [m for m in range(n) if (m + 1) % sync_freq == 0]
    if not points or points[-1] != n - 1:
        points.append(n - 1)
    return points


@dataclass(slots=True)
class Schedule:
    """The result of one simulation: every task of the iteration and the completion time."""

    params: EnvParams
    policy: Policy
    tasks: list[Task]
    completion_time: float

    def task(self, kind: str, gpu: int, index: int) -> Task:
        for t in self.tasks:
            if t.kind == kind and t.gpu == gpu and t.index == index:
                return t
        raise KeyError(f"no task {kind}({index}) on GPU {gpu}")

    def by_id(self) -> dict[TaskId, Task]:
        return {t.id: t for t in self.tasks}
