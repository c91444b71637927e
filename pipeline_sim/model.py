"""Parameters, task kinds, policies and the result records of one simulation.

Times are abstract units (say, 1.0 = one forward pass at full speed); rates are
fractions of full speed (compute) or of one link's bandwidth (communication).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Iterable, Iterator, MutableSequence, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Mapping, NamedTuple, overload

import numpy as np

from .noise import JITTER_DISTRIBUTIONS
from .parameters import (
    OPTIONAL_GROUPS,
    UNIT_FLOOR,
    Dispatchers,
    Integers,
    Interval,
    Lengths,
    Names,
    ParameterError,
    TableFiles,
    Weights,
    parameter,
    parameters_of,
)
from .schedules import SCHEDULES, get_schedule


class TaskKind(StrEnum):
    """What a task is. Compares equal to its plain name (``TaskKind.FORWARD == "forward"``)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_INPUT = "backward_input"
    BACKWARD_WEIGHT = "backward_weight"
    OVERLAP_F_B = "overlap_f_b"
    FWD_PROP = "fwd_prop"
    GRAD_PROP = "grad_prop"
    GRAD_SYNC = "grad_sync"
    OPTIMIZER_STEP = "optimizer_step"
    PARAM_GATHER = "param_gather"
    FWD_GATHER = "fwd_gather"
    BWD_GATHER = "bwd_gather"
    KV_EXCHANGE = "kv_exchange"
    KV_GRAD_EXCHANGE = "kv_grad_exchange"
    A2A = "a2a"
    A2A_GRAD = "a2a_grad"

    @property
    def code(self) -> str:
        return _KIND_CODE[self]

    @property
    def is_compute(self) -> bool:
        return self not in TRANSFER_KINDS

    @property
    def priority_class(self) -> TaskKind:
        """The kind of ``COMM_KINDS`` whose priority and tier this transfer takes (docs/model.md section 15)."""
        return PRIORITY_CLASS[self]


#: Every kind of task, numbered by its place here (``KIND_INDEX``): arrays of tasks and orders hold these numbers.
KINDS: tuple[TaskKind, ...] = tuple(TaskKind)
KIND_INDEX = {kind: number for number, kind in enumerate(KINDS)}

_KIND_CODE = {
    TaskKind.FORWARD: "F",
    TaskKind.BACKWARD: "B",
    TaskKind.BACKWARD_INPUT: "I",
    TaskKind.BACKWARD_WEIGHT: "W",
    TaskKind.OVERLAP_F_B: "FB",
    TaskKind.FWD_PROP: "FP",
    TaskKind.GRAD_PROP: "GP",
    TaskKind.GRAD_SYNC: "GS",
    TaskKind.OPTIMIZER_STEP: "O",
    TaskKind.PARAM_GATHER: "PG",
    TaskKind.FWD_GATHER: "FG",
    TaskKind.BWD_GATHER: "BG",
    TaskKind.KV_EXCHANGE: "KV",
    TaskKind.KV_GRAD_EXCHANGE: "KG",
    TaskKind.A2A: "AA",
    TaskKind.A2A_GRAD: "AG",
}
_CODE_KIND = {code: kind for kind, code in _KIND_CODE.items()}

#: The communication kinds, in the order that breaks exclusive-tier ties.
COMM_KINDS: tuple[TaskKind, ...] = (TaskKind.FWD_PROP, TaskKind.GRAD_PROP, TaskKind.GRAD_SYNC)
#: Every kind of transfer: the three a policy names, then the traffic of sharded data parallelism and of context
#: parallelism (docs/model.md section 15) and the all-to-all of expert parallelism (section 16), each of which takes
#: the priority and tier of one of the three.
PRIORITY_CLASS: dict[TaskKind, TaskKind] = {
    **{kind: kind for kind in COMM_KINDS},
    TaskKind.PARAM_GATHER: TaskKind.GRAD_SYNC, TaskKind.FWD_GATHER: TaskKind.GRAD_SYNC,
    TaskKind.BWD_GATHER: TaskKind.GRAD_SYNC, TaskKind.KV_EXCHANGE: TaskKind.FWD_PROP,
    TaskKind.KV_GRAD_EXCHANGE: TaskKind.GRAD_PROP, TaskKind.A2A: TaskKind.FWD_PROP,
    TaskKind.A2A_GRAD: TaskKind.GRAD_PROP}
#: The all-to-all of expert parallelism (section 16), whose class ``a2a_class`` may move to the data-parallel one.
A2A_KINDS = (TaskKind.A2A, TaskKind.A2A_GRAD)
#: The schedules whose orders ``ep_overlap`` pairs (the others have pairs of their own, no whole backward to pair
#: or, GPipe, no backward followed by a forward).
EP_OVERLAP_SCHEDULES = ("1f1b", "interleaved-1f1b")
#: The classes ``a2a_class`` names: the pipeline's (each all-to-all as above) or the data-parallel one.
A2A_CLASSES = ("pipeline", "grad_sync")
TRANSFER_KINDS: tuple[TaskKind, ...] = tuple(PRIORITY_CLASS)
#: The kinds of work a GPU's compute channel runs.
COMPUTE_KINDS: tuple[TaskKind, ...] = (TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT,
                                       TaskKind.BACKWARD_WEIGHT, TaskKind.OVERLAP_F_B, TaskKind.OPTIMIZER_STEP)


class Action(NamedTuple):
    """One compute action of a GPU's order: a kind of work on one stage for one micro-batch.

    Text form as in PyTorch's pipelining schedules: stage, kind letter, micro-batch
    (``"0F3"``, ``"7B2"``, ``"5I0"``, ``"5W0"``).
    """

    kind: TaskKind
    stage: int
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.code}{self.mb}"


class Pair(NamedTuple):
    """An overlapped forward and whole backward run as one compute task; text ``"(0F7;7B3)"``."""

    forward: Action
    backward: Action

    def __str__(self) -> str:
        return f"({self.forward};{self.backward})"


_ACTION_RE = re.compile(r"(\d+)([A-Z]+)(\d+)")


@dataclass(frozen=True, slots=True)
class TaskId:
    """A task's identity, with the text form ``<stage><code><index>`` (``"2F0"``, ``"1GS3"``).

    ``stage`` is the stage worked on (a transfer: its sending stage). A pair is named by
    its parts, ``"(0F7;7B3)"``: ``stage`` and ``index`` are its forward's, ``partner``
    its backward's ``(stage, micro-batch)``. With one stage per GPU, stage = GPU.
    """

    kind: TaskKind
    stage: int
    index: int
    partner: tuple[int, int] | None = None

    def __str__(self) -> str:
        if self.partner is not None:
            return f"({self.stage}F{self.index};{self.partner[0]}B{self.partner[1]})"
        return f"{self.stage}{self.kind.code}{self.index}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        text = text.strip()
        pair = re.fullmatch(r"\((\d+)F(\d+);(\d+)B(\d+)\)", text)
        if pair:
            stage, mb, other_stage, other_mb = map(int, pair.groups())
            return cls(TaskKind.OVERLAP_F_B, stage, mb, (other_stage, other_mb))
        match = _ACTION_RE.fullmatch(text)
        if not match or match.group(2) not in _CODE_KIND or match.group(2) == "FB":
            raise ValueError(f"task id {text!r} is not of the form <stage><F|B|I|W|FP|GP|GS|O><index> "
                             f"or (<stage>F<index>;<stage>B<index>), e.g. '2F0'")
        return cls(_CODE_KIND[match.group(2)], int(match.group(1)), int(match.group(3)))


@dataclass(slots=True, eq=False)
class Task:
    """One task of an iteration and what happened to it.

    ``gpu`` is the GPU doing the work (the sender, for transfers) and ``receiver`` the
    GPU a ``fwd_prop`` or ``grad_prop`` goes to (None otherwise). ``stage`` is the stage
    worked on (a transfer: its sending stage; a ``grad_sync``: the stage it syncs);
    ``index`` is the micro-batch, or the sync ordinal for ``grad_sync``. A compute task's
    ``parts`` are the actions it runs: one, or a pair's forward and backward.
    ``segments`` lists ``(t0, t1, rate)`` for every stretch in which the task progressed
    at a constant positive rate; a zero-length task has none and
    ``start == end == ready``. ``throttled_time`` is how long a transfer ran below its
    sender-only share, waiting at rate 0 included.
    """

    kind: TaskKind
    gpu: int
    stage: int
    index: int
    length: float
    receiver: int | None = None
    parts: tuple[Action, ...] = ()
    ready: float = math.nan
    start: float = math.nan
    end: float = math.nan
    throttled: bool = False
    throttled_time: float = 0.0
    segments: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def id(self) -> TaskId:
        if self.kind is TaskKind.OVERLAP_F_B:
            backward = self.parts[1]
            return TaskId(self.kind, self.stage, self.index, (backward.stage, backward.mb))
        return TaskId(self.kind, self.stage, self.index)

    @property
    def label(self) -> str:
        """Short label for charts: ``F3``, ``B3``, ``W3``, ``FP3``, ``GS0``, a pair ``F7|B3``, an optimizer step
        ``O``."""
        if self.kind is TaskKind.OPTIMIZER_STEP:
            return self.kind.code
        if self.parts:
            return "|".join(f"{part.kind.code}{part.mb}" for part in self.parts)
        return f"{self.kind.code}{self.index}"

    def __repr__(self) -> str:
        return (f"Task({self.id}, ready={self.ready:.6g}, start={self.start:.6g}, "
                f"end={self.end:.6g}, throttled={self.throttled})")


#: Activations are counted in whole units of 1 / ROOM_UNIT of one stage's (docs/model.md section 7): a power of two,
#: so that with every stage weight 1 each level is the count it always was, scaled exactly.
ROOM_UNIT = 2 ** 20


def room_units(weight: float) -> int:
    """One micro-batch's activations on a stage of ``weight``, in whole units."""
    return round(weight * ROOM_UNIT)


#: Who chooses the compute task a free GPU starts (docs/model.md section 12): the schedule's static order, or a rule
#: applied at run time. The kernel numbers the rules in this order.
DISPATCHERS = ("static", "greedy", "critical-path", "zb-adaptive")
#: Besides them: the best order with hindsight of a draw's lengths (section 12.6), replayed as a given static order.
HINDSIGHT = "hindsight"
#: And a rule that tries each candidate forward on expected lengths (section 12.7), run as an episode's decisions.
LOOKAHEAD = "lookahead"


#: The parameters that only set the work of a kind of task: a table of lengths (``EnvParams.lengths``) replaces
#: them (its flags give their means, which the ideal time reads).
TABLE_WORK = ("fwd_len", "bwd_len", "prop_len", "sync_base_len", "w_fraction")
#: What scales the work a table of lengths gives (its mean lengths, the ideal time and the critical path's
#: expectations are read from it): refused beside a table, as the work is.
TABLE_SCALES = ("stage_weights", "bwd_weights")
#: The per-stage lists of an environment (section 6.6), each one factor per stage or empty.
STAGE_LISTS = ("stage_weights", "sync_weights", "bwd_weights", "a2a_weights")


class _Remembered:
    """What an environment computes of itself as it is made and keeps: its hash and its chunks per GPU, in slots
    beside its fields, which equality, ``replace`` and pickling ignore (a copy computes them again when first asked).
    Every cache of the simulation is keyed by environments, and a hash of all their fields took longer than a
    lookup."""

    __slots__ = ("_hash", "_v")
    _hash: int
    _v: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvParams(_Remembered):
    """One environment (docs/model.md sections 1 and 6). Invalid values raise ``ValueError``.

    Each field is a row of the one table of environment parameters (``PARAMETERS``):
    type, default, domain, help and labels. A schedule ignores the parameters it does not
    read (``chunks`` outside ``interleaved-1f1b``, ``w_fraction`` where nothing is split,
    ``fb_overlap`` outside ``dualpipe-v``): they are checked, then set to their defaults,
    so that one simulation has one ``EnvParams``. ``schedule`` is stored in lower case.
    """

    n: int = parameter(8, Integers(1), "micro-batches per iteration", short="n", label="n", group="environment",
                       metavar="N", flags=("-n", "--num_groups", "--num-groups"))
    num_gpus: int = parameter(4, Integers(1), "the pipeline degree: GPUs of one pipeline, a stage (or v chunks) "
                              "each", short="gpus", label="GPUs", group="environment", metavar="P",
                              alias="pipeline_parallel")
    sync_freq: int = parameter(1, Integers(1), "a grad_sync follows every SYNC_FREQ-th backward", short="sf",
                               label="sync_freq", group="environment")
    fwd_len: float = parameter(1.0, Lengths(), "work of one forward", short="fwd", label="fwd", group="environment")
    bwd_len: float = parameter(2.0, Lengths(), "work of one backward", short="bwd", label="bwd", group="environment")
    prop_len: float = parameter(1.0, Lengths(zero=True), "work of one activation or gradient transfer", short="prop",
                                label="prop", group="environment")
    sync_base_len: float = parameter(2.0, Lengths(zero=True), "work of one grad_sync", short="sync", label="sync",
                                     group="environment")
    fwd_impact: float = parameter(0.2, Interval(0.0, 1.0), "slowdown of forwards by grad_sync traffic", short="fi",
                                  label="fwd impact", group="environment")
    bwd_impact: float = parameter(0.2, Interval(0.0, 1.0), "slowdown of backwards by grad_sync traffic", short="bi",
                                  label="bwd impact", group="environment")
    ingress_capacity: float = parameter(1.0, Interval(1e-6, 1e6, high_closed=True),
                                        "receive capacity of each GPU, in links", short="in", label="ingress",
                                        group="environment")
    schedule: str = parameter("1f1b", Names(tuple(SCHEDULES), case_insensitive=True),
                              "the pipeline schedule, case-insensitive", short="", label="", group="schedule",
                              metavar="NAME")
    chunks: int = parameter(2, Integers(2), "model chunks per GPU of interleaved-1f1b", short="v", label="v",
                            group="schedule", metavar="V")
    w_fraction: float = parameter(0.5, Interval(0.0, 1.0), "share of a split backward that computes weight "
                                  "gradients (zb-h1, zb-v, dualpipe-v)", short="wf", label="wf", group="schedule",
                                  metavar="X")
    fb_overlap: float = parameter(0.0, Interval(0.0, 1.0), "share of the work saved by overlapping a forward and a "
                                  "backward (dualpipe-v)", short="fbo", label="fbo", group="schedule", metavar="X")
    stage_weights: tuple[float, ...] = parameter((), Weights(), "one factor per stage (v x GPUs of them, chunks "
                                                 "included) on its forward, backward and weight work and its "
                                                 "activations", short="sw", label="stage weights", group="stages",
                                                 metavar="W,W,...")
    sync_weights: tuple[float, ...] = parameter((), Weights(), "one factor per stage (v x GPUs of them) on its "
                                                "grad_sync: an uneven stage syncs its own parameters", short="yw",
                                                label="sync weights", group="stages", metavar="W,W,...")
    bwd_weights: tuple[float, ...] = parameter((), Weights(), "one factor per stage (v x GPUs of them) on its "
                                               "backward only, on top of its stage weight (a recomputed forward)",
                                               short="bww", label="bwd weights", group="stages",
                                               metavar="W,W,...")
    optimizer_len: float = parameter(0.0, Lengths(zero=True), "work of each GPU's optimizer step after its last "
                                     "grad_sync, for 1/p of the model (times its stages' sync weights); 0: none",
                                     short="opt", label="optimizer", group="optimizer")
    zero: int = parameter(0, Integers(0, 3), "sharded data parallelism (ZeRO stage; FSDP is 3): 1 and 2 gather each "
                          "GPU's updated parameters after its step, 3 gathers a stage's before each forward and "
                          "backward", short="zero", label="zero", group="strategies", metavar="Z")
    gather_len: float = parameter(0.0, Lengths(zero=True), "work of one all-gather of 1/p of the model's parameters "
                                  "(times a stage's sync weight); read only with zero >= 1", short="gather",
                                  label="gather", group="strategies")
    cp_len: float = parameter(0.0, Lengths(zero=True), "work of the attention exchange of context parallelism in one "
                              "forward of 1/p of the model (a backward's is twice, a stage's times its weight); 0: "
                              "none", short="cp", label="cp exchange", group="strategies")
    a2a_len: float = parameter(0.0, Lengths(zero=True), "work of the all-to-all of expert parallelism (every MoE "
                               "layer's dispatch and combine) in one forward of 1/p of the model; a backward's the "
                               "same, a stage's times its a2a weight; 0: none", short="a2a", label="all-to-all",
                               group="strategies")
    a2a_weights: tuple[float, ...] = parameter((), Weights(low=0.0), "one factor per stage (v x GPUs of them) on its "
                                               "all-to-all: its share of the MoE layers, 0 for dense stages",
                                               short="aw", label="a2a weights", group="strategies",
                                               metavar="W,W,...")
    a2a_class: str = parameter("pipeline", Names(A2A_CLASSES), "whose priority and tier the all-to-all takes: the "
                               "pipeline transfers' (a forward's fwd_prop's, a backward's grad_prop's) or grad_sync's",
                               short="class", label="a2a class", group="strategies", metavar="CLASS")
    ep_overlap: int = parameter(0, Integers(0, 1), "1: each backward beside the forward of another micro-batch "
                                "after it in its GPU's order, as one pair whose all-to-alls hide behind each other's "
                                "compute (1f1b, interleaved-1f1b; Megatron-Core's expert-parallel overlap)",
                                short="epo", label="ep overlap", group="strategies", metavar="0|1")
    dispatch: str = parameter("static", Dispatchers((*DISPATCHERS, HINDSIGHT, LOOKAHEAD), case_insensitive=True),
                              "who chooses a free GPU's next compute task: the schedule's order, a rule at run "
                              "time (case-insensitive), or a learned policy's file", short="", label="",
                              group="dispatch", metavar="RULE")
    memory_limit: float = parameter(0.0, Interval(0.0, 1e9, high_closed=True), "the most activations in flight per "
                                    "GPU a dispatcher may hold, in steps of 1/v (between two, the lower holds); 0: the "
                                    "static order's busiest peak, else at least one micro-batch's room (1 with equal "
                                    "stages); the static order does not read it", short="mem",
                                    label="memory limit", group="dispatch", metavar="M")
    compute_jitter: float = parameter(0.0, Interval(0.0, 1.0, high_closed=True), "coefficient of variation of each "
                                      "compute task's work", short="cj", label="compute jitter", group="jitter",
                                      metavar="C")
    comm_jitter: float = parameter(0.0, Interval(0.0, 1.0, high_closed=True), "coefficient of variation of each "
                                   "transfer's work", short="mj", label="comm jitter", group="jitter", metavar="C")
    jitter_dist: str = parameter("lognormal", Names(JITTER_DISTRIBUTIONS), "distribution of the jitter factors",
                                 short="", label="", group="jitter", metavar="DIST")
    slow_gpu: int = parameter(-1, Integers(-1), "a straggler GPU, -1 for none", short="slow", label="straggler GPU",
                              group="straggler", metavar="G")
    slow_factor: float = parameter(1.0, Interval(1.0, 1e6, high_closed=True), "how many times slower the straggler "
                                   "computes", short="x", label="straggler factor", group="straggler", metavar="K")
    seed: int = parameter(0, Integers(0, 2 ** 63 - 1, "2^63 - 1"), "the random stream of the jitter", short="seed",
                          label="seed", group="jitter")
    lengths: str = parameter("", TableFiles(()), "every task's work from this table of lengths (a measured "
                             "iteration's, say) instead of the work parameters; noise and a straggler multiply it",
                             short="table-", label="lengths", group="lengths", metavar="FILE.json")

    def __post_init__(self) -> None:
        for p in PARAMETERS:
            p.domain.check(p.name, getattr(self, p.name))
        spec = get_schedule(self.schedule)
        spec.check(self.n, self.num_gpus)
        object.__setattr__(self, "schedule", spec.name)
        object.__setattr__(self, "dispatch", Dispatchers((*DISPATCHERS, HINDSIGHT)).normal(self.dispatch))
        object.__setattr__(self, "lengths", self.lengths.strip())
        if self.dispatch != "static" and self.ep_overlap and self.a2a_len > 0 and spec.name in EP_OVERLAP_SCHEDULES:
            raise ParameterError("dispatch", self.dispatch, "with ep_overlap 1 pairs a forward and a backward of the "
                                 "static order, which a dispatcher would run apart: use dispatch static, or "
                                 "ep_overlap 0")
        if self.dispatch != "static" and "fb_overlap" in spec.parameters and self.fb_overlap > 0:
            raise ParameterError("dispatch", self.dispatch, f"{spec.name} with fb_overlap > 0 overlaps a forward and a "
                                 "backward as one task, which has no run-time form: use dispatch static, or "
                                 "fb_overlap 0")
        if self.dispatch == LOOKAHEAD and spec.v(self.chunks) > 1:
            raise ParameterError("dispatch", self.dispatch, f"{spec.name} runs {spec.v(self.chunks)} chunks per GPU, "
                                 "and a dispatcher takes a micro-batch's room on all of them at once, so the static "
                                 "order the look-ahead continues cannot run within the limit; use a schedule of one "
                                 "chunk (gpipe, 1f1b, zb-h1)")
        stages = self.num_gpus * spec.v(self.chunks)
        for name in STAGE_LISTS:
            object.__setattr__(self, name, tuple(map(float, getattr(self, name))))
            if getattr(self, name) and len(getattr(self, name)) != stages:
                raise ParameterError(name, getattr(self, name),
                                     f"must have one weight per stage: {stages} for {spec.name} on {self.num_gpus} "
                                     f"GPUs ({spec.v(self.chunks)} per GPU), or none for every stage 1")
        if not self.slow_gpu < self.num_gpus:
            raise ParameterError("slow_gpu", self.slow_gpu,
                                 f"must be -1 (no straggler) or a GPU 0..{self.num_gpus - 1}")
        for name in self.ignored():
            object.__setattr__(self, name, _DEFAULTS[name])
        for p in PARAMETERS:  # numpy scalars and the like become plain Python numbers
            value = getattr(self, p.name)
            if type(value) is not p.type and p.type is not tuple:
                object.__setattr__(self, p.name, p.type(value))
        object.__setattr__(self, "_v", spec.v(self.chunks))
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, name) for name in _FIELD_NAMES)))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def as_dict(self) -> dict[str, int | float | str | tuple[float, ...]]:
        return {name: getattr(self, name) for name in self.names()}

    def ignored(self) -> tuple[str, ...]:
        """The parameters this environment does not read: the schedule parameters its schedule does not, the
        memory limit under the static order (which cannot adapt to one), the gathers' work without zero and the
        all-to-all's weights and class without an all-to-all."""
        used = get_schedule(self.schedule).parameters
        return tuple(name for name in SCHEDULE_PARAMETERS if name not in used) + \
            (("memory_limit",) if self.dispatch == "static" else ()) + (("gather_len",) if self.zero == 0 else ()) + \
            (("a2a_weights", "a2a_class", "ep_overlap") if self.a2a_len == 0.0 else ()) + \
            (("ep_overlap",) if self.a2a_len > 0.0 and self.schedule not in EP_OVERLAP_SCHEDULES else ())

    def relevant(self) -> tuple[str, ...]:
        """The parameters that make this simulation what it is, in table order: all but those its schedule
        ignores, the jitter's without jitter, the straggler's without a straggler, and a parameter of an optional
        group at its default (equal stages; the schedule's order, the static order's peak); with a table of lengths,
        not the work it replaces (``TABLE_WORK``)."""
        ignored = set(self.ignored()) | (set(TABLE_WORK) if self.lengths else set())
        groups = {"environment", "schedule"} | ({"jitter"} if self.jittered else set()) | \
            ({"straggler"} if self.slow_gpu >= 0 else set())
        given = {p.name for p in PARAMETERS if p.group in OPTIONAL_GROUPS and getattr(self, p.name) != p.default}
        return tuple(p.name for p in PARAMETERS if (p.group in groups and p.name not in ignored) or p.name in given)

    def priority_class(self, kind: TaskKind) -> TaskKind:
        """The kind of ``COMM_KINDS`` whose priority and tier a transfer of ``kind`` takes here (sections 15, 16)."""
        if kind in A2A_KINDS and self.a2a_class == "grad_sync":
            return TaskKind.GRAD_SYNC
        return PRIORITY_CLASS[kind]

    def a2a_weight(self, stage: int) -> float:
        """The factor on stage ``stage``'s all-to-all (section 16)."""
        return self.a2a_weights[stage] if self.a2a_weights else 1.0

    def stage_weight(self, stage: int) -> float:
        """The factor on stage ``stage``'s work and activations (section 6.6)."""
        return self.stage_weights[stage] if self.stage_weights else 1.0

    def sync_weight(self, stage: int) -> float:
        """The factor on stage ``stage``'s grad_sync (section 6.6)."""
        return self.sync_weights[stage] if self.sync_weights else 1.0

    def bwd_weight(self, stage: int) -> float:
        """The factor on stage ``stage``'s backward alone, on top of its stage weight (section 6.6)."""
        return self.bwd_weights[stage] if self.bwd_weights else 1.0

    def _gpu_shares(self) -> list[float]:
        """Per GPU, the sync weights of its stages over v: its share of the parameters, 1 with equal stages."""
        spec, v = get_schedule(self.schedule), self.v
        shares = [0.0] * self.num_gpus
        for stage in range(self.num_gpus * v):
            shares[spec.placement(stage, self.num_gpus, v)] += self.sync_weight(stage) / v
        return shares

    def step_lengths(self) -> tuple[float, ...]:
        """Each GPU's optimizer step (section 6.7): ``optimizer_len`` times the sync weights of its stages over v."""
        return tuple(self.optimizer_len * share for share in self._gpu_shares())

    def gather_lengths(self) -> tuple[float, ...]:
        """Each GPU's all-gather of its updated parameters after its step under zero 1 and 2 (section 15): like
        the step, ``gather_len`` times the sync weights of its stages over v."""
        return tuple(self.gather_len * share for share in self._gpu_shares())

    @property
    def learned(self) -> str | None:
        """The policy file of a learned dispatcher (``dispatch = learned:<file>``), or None."""
        prefix = Dispatchers.PREFIX
        return self.dispatch[len(prefix):] if self.dispatch.startswith(prefix) else None

    @property
    def may_wait(self) -> bool:
        """Whether the dispatcher's decisions may leave a free GPU waiting while a task could start: those of an
        episode (sections 12.4, 12.5 and 12.7), which start a task only at an event."""
        return self.learned is not None or self.dispatch == LOOKAHEAD

    @property
    def dispatched(self) -> bool:
        """Whether a rule, or a memory limit, departs from the schedule's static order as it always ran."""
        return self.dispatch != "static" or self.memory_limit != 0.0

    @property
    def jittered(self) -> bool:
        """Whether task times are drawn at random (then the sample number matters)."""
        return self.compute_jitter > 0.0 or self.comm_jitter > 0.0

    @property
    def v(self) -> int:
        """Model chunks (stages) per GPU."""
        try:
            return self._v
        except AttributeError:  # a copy, or an unpickled environment: its fields were set without ``__post_init__``
            object.__setattr__(self, "_v", get_schedule(self.schedule).v(self.chunks))
            return self._v

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:  # as ``v``'s
            object.__setattr__(self, "_hash", hash(tuple(getattr(self, name) for name in _FIELD_NAMES)))
            return self._hash

    @property
    def time_unit(self) -> float:
        """The unit the engine simulates in (docs/model.md section 9): 1, or, when a nonzero length is shorter than
        ``UNIT_FLOOR``, the largest power of two not above the shortest, so that the engine's absolute tolerances
        stay a billionth of the shortest work. Dividing by it and multiplying back are exact."""
        shortest = min(length for length in (self.fwd_len, self.bwd_len, self.prop_len, self.sync_base_len,
                                             self.optimizer_len, self.gather_len, self.cp_len, self.a2a_len)
                       if length > 0.0)
        return 1.0 if shortest >= UNIT_FLOOR else math.ldexp(1.0, math.frexp(shortest)[1] - 1)


#: The environment parameters, in ``EnvParams`` field order.
PARAMETERS = parameters_of(EnvParams)
_FIELD_NAMES = EnvParams.names()
PARAMETER = {p.name: p for p in PARAMETERS}
_DEFAULTS = {p.name: p.default for p in PARAMETERS}
#: The parameters that only some schedules read.
SCHEDULE_PARAMETERS = tuple(p.name for p in PARAMETERS if p.group == "schedule" and p.name != "schedule")
#: The parameters of run-time dispatch (section 12), which a grid's output carries only when it names them.
DISPATCH_KEYS = tuple(p.name for p in PARAMETERS if p.group == "dispatch")
#: The parameters whose value is one number per stage (``Weights``): a JSON grid gives a list per value.
LIST_KEYS = tuple(p.name for p in PARAMETERS if p.type is tuple)
#: The parameters some environments ignore (``EnvParams.ignored``): their cells may be empty.
IGNORABLE = (*SCHEDULE_PARAMETERS, "memory_limit", "gather_len", "a2a_weights", "a2a_class", "ep_overlap")


#: Which draw of an environment's noise a simulation is (docs/model.md section 8): 64 bits of the generator's state.
SAMPLES = Integers(0, 2 ** 63 - 1, "2^63 - 1")

_TIER_RE = re.compile(r"[a-z]")
#: The smallest positive shared priority: smaller ones would round a transfer's rate to nothing.
MIN_PRIORITY = 1e-6


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
        for name, example in (("priorities", "{'fwd_prop': 0.5}"), ("exclusive_tiers", "{'grad_sync': 'a'}")):
            if not isinstance(getattr(self, name), Mapping):
                raise ParameterError(name, getattr(self, name), f"must be a mapping of transfer kind to "
                                                                f"{'priority' if name == 'priorities' else 'tier'}, "
                                                                f"e.g. {example}")
        for kind, value in self.priorities.items():
            if kind not in COMM_KINDS:
                raise ParameterError("priorities", kind, f"unknown kind; allowed kinds: {names}")
            # numbers.Real: numpy scalars of every width are numbers too
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                    not (value == 0.0 or MIN_PRIORITY <= value <= 1.0):
                raise ParameterError(f"priorities[{kind}]", value, f"must be 0 or a number from {MIN_PRIORITY:g} to 1")
        for kind, tier in self.exclusive_tiers.items():
            if kind not in COMM_KINDS:
                raise ParameterError("exclusive_tiers", kind, f"unknown kind; allowed kinds: {names}")
            if not isinstance(tier, str) or not _TIER_RE.fullmatch(tier):
                raise ParameterError(f"exclusive_tiers[{kind}]", tier, "must be one letter 'a'..'z' ('a' highest)")
        # Normalise to plain dicts in kind order so that equal policies compare and hash alike.
        object.__setattr__(self, "priorities",
                           {TaskKind(k).value: float(self.priorities[k]) for k in COMM_KINDS if k in self.priorities})
        tiers = self.exclusive_tiers
        object.__setattr__(self, "exclusive_tiers", {TaskKind(k).value: tiers[k] for k in COMM_KINDS if k in tiers})

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
        shared = " ".join(f"{letter[k]}{self.shared_priority(k):g}" for k in COMM_KINDS
                          if k not in self.exclusive_tiers)
        return " | ".join(part for part in (exclusive, shared) if part)


#: The policy the visualizers use unless told otherwise, and that the schedule comparison marks.
DEFAULT_POLICY = Policy(priorities={"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2})


class Run(NamedTuple):
    """The tasks of a run as arrays, in task order: what a reader of many tasks at once (the metrics, a chart of
    100,000 bars) takes without a record per task.

    Per task: its GPU; its kind (its number in ``KINDS``); its parts' kinds and stages (two columns, -1 where there
    is no part: a transfer has none, a pair two); its length; its ready, start and end times; whether it was
    throttled and for how long. ``seg_task`` and ``seg_times`` (rows t0, t1, rate): every segment, by task.
    """

    gpu: np.ndarray
    kind: np.ndarray
    part_kind: np.ndarray
    part_stage: np.ndarray
    length: np.ndarray
    ready: np.ndarray
    start: np.ndarray
    end: np.ndarray
    throttled: np.ndarray
    throttled_time: np.ndarray
    seg_task: np.ndarray
    seg_times: np.ndarray

    @classmethod
    def of(cls, tasks: Sequence[Task]) -> Run:
        """The arrays of ``tasks``."""
        def parts(value: Callable[[Action], int]) -> np.ndarray:
            return np.array([[value(part) for part in task.parts] + [-1] * (2 - len(task.parts)) for task in tasks],
                            dtype=np.int64).reshape(-1, 2)
        segments = [(i, *segment) for i, task in enumerate(tasks) for segment in task.segments]
        times = np.array([segment[1:] for segment in segments], dtype=np.float64).reshape(-1, 3).T
        def floats(value: Callable[[Task], float]) -> np.ndarray:
            return np.array([value(task) for task in tasks], dtype=np.float64)
        return cls(np.array([task.gpu for task in tasks], dtype=np.int64),
                   np.array([KIND_INDEX[task.kind] for task in tasks], dtype=np.int64),
                   parts(lambda part: KIND_INDEX[part.kind]), parts(lambda part: part.stage),
                   floats(lambda task: task.length), floats(lambda task: task.ready),
                   floats(lambda task: task.start), floats(lambda task: task.end),
                   np.array([task.throttled for task in tasks], dtype=bool), floats(lambda task: task.throttled_time),
                   np.array([segment[0] for segment in segments], dtype=np.int64), times)


class RunTasks(MutableSequence[Task]):
    """A run's tasks, made into records (``Task``) by ``make`` when first read one by one: 160,000 of them take a
    second, which a reader of the arrays alone (``run``) never spends."""

    def __init__(self, run: Run, make: Callable[[], list[Task]]) -> None:
        self._run = run
        self._make: Callable[[], list[Task]] | None = make
        self._tasks: list[Task] = []

    @property
    def run(self) -> Run:
        """The tasks as arrays: the kernel's until the records are made, from then on the records' (which their
        reader may change)."""
        return self._run if self._make is not None else Run.of(self._tasks)

    def _records(self) -> list[Task]:
        if self._make is not None:
            self._tasks, self._make = self._make(), None
        return self._tasks

    def __len__(self) -> int:
        return len(self._run.gpu) if self._make is not None else len(self._tasks)

    @overload
    def __getitem__(self, index: int) -> Task: ...

    @overload
    def __getitem__(self, index: slice) -> list[Task]: ...

    def __getitem__(self, index: int | slice) -> Task | list[Task]:
        return self._records()[index]

    @overload
    def __setitem__(self, index: int, value: Task) -> None: ...

    @overload
    def __setitem__(self, index: slice, value: Iterable[Task]) -> None: ...

    def __setitem__(self, index: int | slice, value: Task | Iterable[Task]) -> None:
        self._records()[index] = value  # type: ignore[index, assignment]

    def __delitem__(self, index: int | slice) -> None:
        del self._records()[index]

    def insert(self, index: int, value: Task) -> None:
        self._records().insert(index, value)

    def __iter__(self) -> Iterator[Task]:
        return iter(self._records())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._records() == list(other)

    __hash__ = None  # type: ignore[assignment]


@dataclass(slots=True)
class Schedule:
    """The result of one simulation: every task of the iteration and the figures the engine computed.

    ``spans[g]`` runs from GPU g's first compute start to its last compute end (section
    6.5); ``peak_activations[g]`` is its most activations in flight at once, in
    micro-batches of its whole share of the model (section 7). ``lower_bound`` is what no
    order could beat on this run's lengths and ``memory_limit`` the limit in force (section
    12); ``orders[g]`` lists GPU g's compute tasks (indices into ``tasks``) in the order it ran them.
    """

    params: EnvParams
    policy: Policy
    tasks: MutableSequence[Task]
    completion_time: float
    spans: tuple[float, ...]
    peak_activations: tuple[float, ...]
    lower_bound: float
    memory_limit: float
    orders: tuple[tuple[int, ...], ...]
    given_order: bool = False  # ran a static order given by the caller, not its schedule's (``orders`` holds it)
    sample: int = 0  # which draw of the noise (docs/model.md section 8); irrelevant without jitter

    @property
    def run(self) -> Run:
        """Its tasks as arrays: the kernel's own for a simulated schedule, else made from ``tasks``."""
        return self.tasks.run if isinstance(self.tasks, RunTasks) else Run.of(self.tasks)

    def task(self, kind: str, stage: int, index: int) -> Task:
        """The task of ``kind`` on ``stage`` for micro-batch (or sync ordinal) ``index``; a pair by its forward."""
        for t in self.tasks:
            if t.kind == kind and t.stage == stage and t.index == index:
                return t
        raise KeyError(f"no task {kind}({index}) on stage {stage}")

    @property
    def bound_gap(self) -> float:
        """How far the completion time lies above the lower bound, as a share of it."""
        return self.completion_time / self.lower_bound - 1.0

    def order_text(self) -> list[list[str]]:
        """Per GPU, the text of each compute task in the order it ran (``"0F3"``, ``"(0F7;7B3)"``)."""
        return [[str(self.tasks[i].id) for i in order] for order in self.orders]

    def find(self, text: str) -> Task:
        """The task whose id reads ``text`` (``"0F3"``, ``"2GP1"``, ``"(0F7;7B3)"``)."""
        if not isinstance(text, str):
            raise TypeError(f"find: a task's text, such as '0F3', not {type(text).__name__}")
        wanted = TaskId.parse(text)
        for t in self.tasks:
            if t.id == wanted:
                return t
        raise KeyError(f"no task {text}")

    def activation_steps(self) -> list[list[tuple[float, float]]]:
        """Per GPU, ``(time, in-flight activations from then on)``, starting with ``(0, 0)``.

        A stage's activations (its weight / v) rise when a forward part starts and fall when the
        weight-gradient work of the same micro-batch and stage ends; falls come first at
        one instant.
        """
        units = self.params.v * ROOM_UNIT
        changes: list[list[tuple[float, int, int]]] = [[] for _ in range(self.params.num_gpus)]
        for t in self.tasks:
            for part in t.parts:
                room = room_units(self.params.stage_weight(part.stage))
                if part.kind is TaskKind.FORWARD:
                    changes[t.gpu].append((t.start, 1, room))
                elif part.kind in (TaskKind.BACKWARD, TaskKind.BACKWARD_WEIGHT):
                    changes[t.gpu].append((t.end, 0, -room))
        steps = []
        for gpu_changes in changes:
            level, gpu_steps = 0, [(0.0, 0.0)]
            for time, _, delta in sorted(gpu_changes):
                level += delta
                gpu_steps.append((time, level / units))
            steps.append(gpu_steps)
        return steps
