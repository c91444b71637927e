"""The planner: which layout, schedule, partition and policy to run a model on a number of GPUs (docs/model.md
section 14).

Layouts are enumerated (tensor, pipeline and data-parallel degrees that multiply to the
GPU count and divide the model, micro-batch size, schedule, recomputation, partition),
pruned by memory and by a lower bound on the iteration time, and the survivors simulated
with the workload model: every one screened under the default policy on two short runs
of its pipeline, extrapolated to the iteration's micro-batches (a pipeline's time is
affine in them once it is full), then the ``TOP`` fastest simulated in full over a small
policy grid. Nothing here prints; progress goes to a callback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import product
from typing import Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np

from .cluster import DaskCluster
from .model import EnvParams, ParameterError, Policy
from .parallel import ordered_map
from .scenarios import policy_grid
from .schedules import get_schedule
from .taskgraph import MAX_TASKS, estimated_tasks
from .workload import (
    RECOMPUTE_MODES,
    Workload,
    gpu_memory_gb,
    imbalance_limit,
    iteration_flops,
    stage_layers,
    static_bytes,
    workload_environment,
)

#: Tensor parallelism stays within a node, whose GPUs NVLink joins (tp_bandwidth is NVLink's).
GPUS_PER_NODE = 8
#: Why a GPU without an NVLink figure (and no tp_bandwidth given) gets no tensor parallelism.
NO_TENSOR_PARALLEL = "the gpu states no nvlink_bandwidth; give it, or --tp-bandwidth"
MICRO_BATCH_SIZES = (1, 2, 4)
#: The schedules searched (the one-chunk ones dominate gpipe, and dualpipe-v is left to the sweep: its two-way
#: traffic needs a policy grid of its own to be judged); interleaved-1f1b with every chunk count of ``chunk_counts``.
SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v")
#: For a model with experts, dualpipe-v too: its pairs hide the all-to-all (docs/model.md section 16).
EXPERT_SCHEDULES = (*SCHEDULES, "dualpipe-v")
ZERO_STAGES = (0, 1, 2, 3)
#: Context parallelism is for sequences too long for one GPU: each rank keeps at least this many tokens. Below it a
#: rank's matrix products shrink and its attention exchange is no longer hidden, which one efficiency for every
#: shape does not capture (docs/model.md section 14); pin --context-parallel to search shorter shares.
MIN_CONTEXT_TOKENS = 8192
#: The partitions tried, by name, and the ``layers_per_stage`` each gives: balanced, and the split of least
#: bottleneck stage (``auto``'s first step; its simulated neighbours are left to the sweep).
PARTITIONS = {"balanced": "balanced", "bottleneck": "auto"}
#: The policy grid the fastest layouts are simulated over (31 policies).
POLICY_STEP = 1.0
#: The planner lists this many fastest runs (``--by run``), or the fastest run of each of ``TOP_LAYOUTS`` fastest
#: layouts (tensor, context, pipeline and data-parallel degrees); each listed run is simulated over the policy grid.
TOP = 10
TOP_LAYOUTS = 5
#: Peaks of the static order are reached within the warm-up and first steady rounds, so the memory check before
#: simulating counts them on at most this many micro-batches per pipeline stage (fewer can only lower a peak).
PEAK_ROUNDS = 4
#: The screening runs take this many micro-batches per stage and twice as many: the pipeline is then full, and
#: both are multiples of p and at least 2 p, as the schedules require.
SCREEN_ROUNDS = 2
#: The dimensions a user may pin (``Filters``), by the workload's or the environment's word.
DIMENSIONS = ("tensor_parallel", "context_parallel", "expert_parallel", "pipeline_parallel", "data_parallel", "zero",
              "micro_batch_size", "schedule", "chunks", "recompute")
COLUMNS = ("rank", "layout_rank", "tensor_parallel", "context_parallel", "expert_parallel", "pipeline_parallel",
           "data_parallel", "zero", "micro_batch_size", "schedule", "chunks", "recompute", "partition",
           "layers_per_stage", "iteration_seconds", "tokens_per_second", "tflops_per_gpu", "mfu", "memory_gb",
           "gpu_memory_gb", "budget_gb", "over_gb", "policy", "simulated")
#: The columns of a layout itself (``Layout.row``): what ``--mark`` may name.
LAYOUT_COLUMNS = COLUMNS[2:14]
#: What the ``simulated`` column says of a layout that was not simulated.
OVER_MEMORY, ABOVE_BOUND = "no: over memory", "no: bound above the listed"
LOWER_ZERO = "no: a lower zero stage was faster"

#: Per dimension, the values a user allows (a dimension left out is searched whole).
Filters = Mapping[str, frozenset]


class PlanError(ValueError):
    """A request no layout answers; the message is one line naming what was tried."""


@dataclass(frozen=True)
class Layout:
    """One way to run the workload: its degrees, schedule, sharding, recomputation and partition, and its
    environment."""

    workload: Workload
    params: EnvParams
    partition: str
    bound: float  # seconds no run of it can beat (``_bound``: a GPU's compute, and what must precede and follow it)

    @property
    def tensor(self) -> int:
        return self.workload.tensor_parallel

    @property
    def context(self) -> int:
        return self.workload.context_parallel

    @property
    def pipeline(self) -> int:
        return self.params.num_gpus

    @property
    def data(self) -> int:
        return self.workload.data_parallel

    @property
    def degrees(self) -> tuple[int, int, int, int, int]:
        """Tensor, context, pipeline, data and expert-parallel degrees: the layout a user names, whatever runs on
        it (the experts split within data x tensor, so they add no GPU)."""
        return self.tensor, self.context, self.pipeline, self.data, self.workload.expert_parallel

    def describe(self) -> str:
        """``t 8 p 16 d 64, b 1, interleaved-1f1b x4, zero 1, recompute none, balanced`` (``c`` when above 1)."""
        return describe(self.workload, self.params.num_gpus, self.params.schedule, self.params.v, self.params.zero,
                        self.partition)

    def row(self) -> list[object]:
        """The CSV cells of the layout itself, from ``tensor_parallel`` to ``layers_per_stage``."""
        w, p = self.workload, self.params
        return layout_cells(w, p.num_gpus, p.schedule, p.v, p.zero, self.partition)


def describe(workload: Workload, pipeline: int, schedule: str, v: int, zero: int, partition: str) -> str:
    context = f" c {workload.context_parallel}" if workload.context_parallel > 1 else ""
    chunks = f" x{v}" if schedule == "interleaved-1f1b" else ""
    experts = f" e {workload.expert_parallel}" if workload.expert_parallel > 1 else ""
    return (f"t {workload.tensor_parallel}{context} p {pipeline} d {workload.data_parallel}{experts}, b "
            f"{workload.micro_batch_size}, {schedule}{chunks}, zero {zero}, recompute {workload.recompute}, "
            f"{partition}")


def layout_cells(workload: Workload, pipeline: int, schedule: str, v: int, zero: int, partition: str) -> list[object]:
    layers = stage_layers(workload, pipeline * v)
    return [workload.tensor_parallel, workload.context_parallel, workload.expert_parallel, pipeline,
            workload.data_parallel, zero,
            workload.micro_batch_size, schedule, v if v > 1 else "", workload.recompute, partition,
            " ".join(map(str, layers))]


@dataclass(frozen=True)
class Outcome:
    """A simulated layout: its iteration seconds (the mean, or the 95th percentile under jitter) under its best
    policy found, and its memory."""

    layout: Layout
    seconds: float
    memory_gb: float
    policy: str
    tokens_per_second: float
    mfu: float
    full: bool  # simulated on all the iteration's micro-batches (else extrapolated from the screening runs)
    budget_gb: float  # the memory a layout may use: the GPU's, less the headroom asked for

    @property
    def fits(self) -> bool:
        return self.memory_gb <= self.budget_gb

    def cells(self, rank: int | str, layout_rank: int | str) -> list[object]:
        w = self.layout.workload
        return [rank, layout_rank, *self.layout.row(), self.seconds, self.tokens_per_second, self.mfu * w.device.tflops,
                self.mfu, self.memory_gb, w.device.memory_gb, self.budget_gb, max(0.0, self.memory_gb - self.budget_gb),
                self.policy, "full" if self.full else "extrapolated"]


@dataclass(frozen=True)
class Unsimulated:
    """A layout enumerated but not simulated: its memory already over the budget (``memory_gb``: at least this, the
    parameters' or the estimate's), or its bound above the time of the last listed (the tenth fastest run or the
    fifth fastest layout, the slower)."""

    cells: tuple[object, ...]  # the layout's own cells (``Layout.row``)
    memory_gb: float
    budget_gb: float
    gpu_memory_gb: float
    reason: str

    def row(self) -> list[object]:
        over = max(0.0, self.memory_gb - self.budget_gb)
        return ["", "", *self.cells, "", "", "", "", self.memory_gb, self.gpu_memory_gb, self.budget_gb,
                over if over else "", "", self.reason]


@dataclass(frozen=True)
class PlanResult:
    """Every simulated layout (``tried``), those that fit fastest first (``ranked``), every other layout enumerated
    (``unsimulated``), and what was pruned."""

    tried: tuple[Outcome, ...]
    ranked: tuple[Outcome, ...]
    enumerated: int
    pruned_memory: int
    pruned_bound: int
    unsimulated: tuple[Unsimulated, ...] = ()

    def layout_ranks(self) -> dict[tuple[int, ...], int]:
        """Each layout's (``Layout.degrees``) rank by its fastest run that fits."""
        ranks: dict[tuple[int, ...], int] = {}
        for outcome in self.ranked:
            ranks.setdefault(outcome.layout.degrees, len(ranks) + 1)
        return ranks

    def best_layouts(self) -> list[Outcome]:
        """The fastest run of each of the ``TOP_LAYOUTS`` fastest layouts, fastest first (exact: every run not
        simulated is bounded above the last one's)."""
        return _layout_leaders(self.ranked)

    def rows(self) -> list[list[object]]:
        """The CSV's rows: the runs that fit, fastest first and ranked (with their layout's rank); the simulated
        ones that do not, fastest first; then those not simulated, lightest first."""
        over = sorted((o for o in self.tried if not o.fits), key=lambda o: o.seconds)
        ranks = self.layout_ranks()
        return [*(o.cells(rank, ranks[o.layout.degrees]) for rank, o in enumerate(self.ranked, 1)),
                *(o.cells("", "") for o in over),
                *(u.row() for u in sorted(self.unsimulated, key=lambda u: u.memory_gb))]


def _layout_leaders(ranked: Sequence[Outcome]) -> list[Outcome]:
    """The first run of each layout in ``ranked``, for the first ``TOP_LAYOUTS`` layouts."""
    seen: set[tuple[int, ...]] = set()
    leaders = []
    for outcome in ranked:
        if outcome.layout.degrees not in seen and len(seen) < TOP_LAYOUTS:
            seen.add(outcome.layout.degrees)
            leaders.append(outcome)
    return leaders


def _leading(ranked: Sequence[Outcome]) -> list[Outcome]:
    """What the planner lists, by run or by layout: the ``TOP`` fastest runs and the fastest run of each of the
    ``TOP_LAYOUTS`` fastest layouts."""
    return list({id(o): o for o in (*ranked[:TOP], *_layout_leaders(ranked))}.values())


class _Leaders:
    """The fastest fitting times screened so far: of the ``TOP`` fastest runs, and of each layout."""

    def __init__(self) -> None:
        self.runs: list[float] = []
        self.layouts: dict[tuple[int, ...], float] = {}

    def record(self, outcomes: list[Outcome | float | None]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Outcome) and outcome.fits:
                self.runs.append(outcome.seconds)
                key = outcome.layout.degrees
                self.layouts[key] = min(self.layouts.get(key, math.inf), outcome.seconds)
        self.runs.sort()
        del self.runs[TOP:]

    def threshold(self) -> float:
        """A run bounded at or above this time can enter neither the ``TOP`` fastest runs nor the
        ``TOP_LAYOUTS`` fastest layouts."""
        if len(self.runs) < TOP or len(self.layouts) < TOP_LAYOUTS:
            return math.inf
        return max(self.runs[TOP - 1], sorted(self.layouts.values())[TOP_LAYOUTS - 1])


def _divisors(number: int) -> list[int]:
    """The divisors of ``number``, ascending: found in pairs up to its square root, so that a count of a billion
    GPUs is answered at once."""
    low = [k for k in range(1, math.isqrt(max(number, 0)) + 1) if number % k == 0]
    return low + [number // k for k in reversed(low) if k * k != number]


def chunk_counts(layers: int, pipeline: int) -> list[int]:
    """The chunk counts of interleaved-1f1b searched on ``pipeline`` GPUs: every count from 2 that divides a GPU's
    share of the layers (rounded down or up when they do not divide), each chunk holding a layer."""
    shares = {layers // pipeline, -(-layers // pipeline)}
    return sorted({v for share in shares for v in _divisors(share) if v >= 2 and pipeline * v <= layers})


def _bound(workload: Workload, params: EnvParams) -> float:
    """Seconds no schedule or policy beats (jitter has mean 1): over GPUs, the earliest its first forward can start,
    its compute, and the least that must follow its last task.

    GPU g's first forward, on its lowest stage r, waits for the forwards of stages 0 .. r-1 and the transfers
    between them; every task of g (a W of a split backward aside: none may follow it) is followed by the
    backwards of the stages below r and their transfers. For 1F1B on equal stages this is the textbook
    ``(n + p - 1)(F + B)``; a transfer takes at least its work, at full speed."""
    spec = get_schedule(params.schedule)
    v = spec.v(params.chunks)
    stages = params.num_gpus * v
    gpu = [spec.placement(stage, params.num_gpus, v) for stage in range(stages)]
    forward = [params.fwd_len * params.stage_weight(s) / v for s in range(stages)]
    backward = [params.bwd_len * params.stage_weight(s) * params.bwd_weight(s) / v for s in range(stages)]
    split = "w_fraction" in spec.parameters
    work = [0.0] * params.num_gpus
    for stage in range(stages):
        work[gpu[stage]] += params.n * (forward[stage] + backward[stage])
    bound, head, tail = 0.0, 0.0, 0.0
    for stage in range(stages):  # stages in forward order: a GPU's first one is its lowest
        if gpu[stage] not in gpu[:stage]:
            bound = max(bound, head + work[gpu[stage]] + (0.0 if split else tail))
        hop = params.prop_len if stage + 1 < stages and gpu[stage + 1] != gpu[stage] else 0.0
        head += forward[stage] + hop
        tail += backward[stage] + hop
    return bound


@dataclass(frozen=True)
class Enumeration:
    """The layouts whose parameters and optimizer state fit, how many were enumerated, the least such memory of any
    (GB, and its layout) for the message when none fits, and the layouts that do not fit."""

    layouts: list[Layout]
    enumerated: int
    least_static: tuple[float, str]
    too_large: list[Unsimulated]


def _allowed(filters: Filters | None, dimension: str, values: Iterable) -> list:
    pinned = (filters or {}).get(dimension)
    return [value for value in values if pinned is None or value in pinned]


#: The degrees whose product is a layout's GPUs.
_FACTORS = ("tensor_parallel", "context_parallel", "pipeline_parallel", "data_parallel")


def _check_pins(base: Workload, gpus: int, filters: Filters) -> None:
    """``PlanError`` for pinned values no layout can take together: expert degrees for a model without experts,
    degrees whose product cannot make the GPUs, or chunks a GPU that no schedule searched has (interleaved-1f1b's
    from the model's layers, the others' fixed)."""
    experts = sorted(filters.get("expert_parallel", ()))
    if experts and not base.shape.experts and 1 not in experts:
        raise PlanError(f"expert_parallel = {'/'.join(map(str, experts))}: {base.shape.name} has no experts to "
                        f"split; pin expert_parallel 1, or leave it out")
    if base.shape.experts and (split := [e for e in experts if base.shape.experts % e]):
        raise PlanError(f"expert_parallel = {'/'.join(map(str, split))}: must divide the {base.shape.experts} "
                        f"experts of {base.shape.name}")
    degrees = [e for e in (experts or _divisors(base.shape.experts)) if e > 1] if base.shape.experts else []
    if base.expert_imbalance > 1 and degrees and \
            not any(base.expert_imbalance <= imbalance_limit(base.shape, e) for e in degrees):
        limits = ", ".join(f"{imbalance_limit(base.shape, e):g} at {e}" for e in degrees)
        raise PlanError(f"expert_imbalance = {base.expert_imbalance:g}: more than the busiest GPU can take at any "
                        f"{'pinned ' if experts else ''}expert degree (at most {limits}), and without expert "
                        f"parallelism it means nothing")
    contexts = sorted(filters.get("context_parallel", ()))
    assert base.seq_len is not None
    if uncut := [c for c in contexts if c > 1 and base.seq_len % (2 * c)]:
        raise PlanError(f"context_parallel = {'/'.join(map(str, uncut))}: must cut seq_len = {base.seq_len} into "
                        f"2 x c equal chunks (each rank takes two, for causal balance)")
    zeros = sorted(filters.get("zero", ()))
    pair = base.dtype_bytes + base.gradient_bytes
    if base.bytes_per_param < pair and any(zeros):
        raise PlanError(f"bytes_per_param = {base.bytes_per_param:g}: must hold a weight and a gradient ({pair} "
                        f"bytes) for zero {'/'.join(map(str, [z for z in zeros if z]))} to shard the rest")
    pinned = [(key, sorted(filters[key])) for key in _FACTORS if filters.get(key)]
    for key, values in pinned:
        if all(gpus % value for value in values):
            verb = "none divides" if len(values) > 1 else "does not divide"
            raise PlanError(f"{key} = {'/'.join(map(str, values))}: {verb} gpus = {gpus}; a layout's tensor x "
                            f"context x pipeline x data degrees make its GPUs")
    combinations = [dict(zip([key for key, _ in pinned], values)) for values in product(*(v for _, v in pinned))]
    if len(pinned) > 1 and all(gpus % math.prod(together.values()) for together in combinations):
        least = min(combinations, key=lambda together: math.prod(together.values()))
        product_of = math.prod(least.values())
        raise PlanError(f"{' x '.join(f'{key} {value}' for key, value in least.items())} = {product_of}: "
                        f"{'more than' if product_of > gpus else 'does not divide'} gpus = {gpus}"
                        f"{' (the least of the pinned degrees together)' if len(combinations) > 1 else ''}; a "
                        f"layout's tensor x context x pipeline x data degrees make its GPUs")
    chunks = sorted(filters.get("chunks", ()))
    if not chunks:
        return
    # the chunks a GPU each schedule searched has: interleaved-1f1b's as enumerated, the others' fixed
    pipelines = [p for p in _divisors(gpus) if p > 1 and p in filters.get("pipeline_parallel", {p})]
    interleaved = sorted({v for p in pipelines for v in chunk_counts(base.shape.layers, p)})
    offered = {schedule: interleaved if schedule == "interleaved-1f1b" else [get_schedule(schedule).v(2)]
               for schedule in _allowed(filters, "schedule", EXPERT_SCHEDULES if base.shape.experts else SCHEDULES)}
    if not any(set(chunks) & set(counts) for counts in offered.values()):
        said = ", ".join(f"{schedule} {'/'.join(map(str, counts)) or 'none'}" + (
            f" (its {base.shape.layers} layers on pipelines of {'/'.join(map(str, pipelines)) or 'no'} GPUs)"
            if schedule == "interleaved-1f1b" else "") for schedule, counts in offered.items())
        raise PlanError(f"chunks = {'/'.join(map(str, chunks))}: no schedule searched has "
                        f"{'that many' if len(chunks) == 1 else 'any of these'} chunks a GPU: {said}")


def enumerate_layouts(base: Workload, gpus: int, env: dict[str, object] | None = None,
                      filters: Filters | None = None, headroom_gb: float = 0.0, workers: int = 1,
                      progress: Callable[[int, int], None] | None = None) -> Enumeration:
    """Every layout of ``base`` (its model, GPU, batch and network) on ``gpus`` GPUs that is a valid environment,
    within ``filters``; those whose parameters and optimizer state leave no room in the GPU (less ``headroom_gb``)
    are set apart before their environment is built.

    Tensor degrees divide the GPU count, the heads and the key-value heads, up to ``GPUS_PER_NODE``, with
    sequence parallelism; context degrees cut the sequence into 2c chunks of ``MIN_CONTEXT_TOKENS`` or more;
    pipeline degrees divide what is left, with a layer for each stage; the micro-batch size times the
    data-parallel degree divides the global batch; zero 1 to 3 only with data parallelism. ``env``: the
    environment's other parameters (jitter, seed). The choices' partitions are built on ``workers`` processes, in
    chunks, and gathered in order: the result is the same on any number. ``progress(done, total)`` is told the
    choices of degrees, micro-batch, schedule and recomputation whose partitions are built, as chunks come in.
    """
    shape = base.shape
    assert base.global_batch_size is not None and base.seq_len is not None
    budget = base.device.memory_gb - headroom_gb
    choices = []  # the arguments of ``_partitions``, in the order their layouts are listed
    tensors = [t for t in _divisors(gpus) if t <= GPUS_PER_NODE and not shape.heads % t and
               not (shape.kv_heads or shape.heads) % t and (t == 1 or base.tp_bandwidth is not None)]
    for t in _allowed(filters, "tensor_parallel", tensors):
        pinned_contexts = (filters or {}).get("context_parallel", ())  # pinned, below MIN_CONTEXT_TOKENS too
        contexts = [c for c in _divisors(gpus // t) if c == 1 or (not base.seq_len % (2 * c) and (
            base.seq_len // c >= MIN_CONTEXT_TOKENS or c in pinned_contexts))]
        for c in _allowed(filters, "context_parallel", contexts):
            for p in _allowed(filters, "pipeline_parallel", _divisors(gpus // (t * c))):
                d = gpus // (t * c * p)
                if not _allowed(filters, "data_parallel", [d]) or p > shape.layers:
                    continue
                experts = [e for e in _divisors(shape.experts) if not (d * t) % e and (
                    e == 1 or base.expert_imbalance <= imbalance_limit(shape, e))] if shape.experts else [1]
                for e, b in product(_allowed(filters, "expert_parallel", experts),
                                    _allowed(filters, "micro_batch_size", MICRO_BATCH_SIZES)):
                    if base.global_batch_size % (b * d):
                        continue
                    for schedule in _allowed(filters, "schedule", EXPERT_SCHEDULES if shape.experts else SCHEDULES):
                        chunks = _allowed(filters, "chunks", chunk_counts(shape.layers, p)) \
                            if schedule == "interleaved-1f1b" else [get_schedule(schedule).v(2)]
                        for v in chunks:
                            if (p == 1 and v > 1) or p * v > shape.layers:
                                continue  # chunks on one GPU only add transfers
                            for recompute in _allowed(filters, "recompute", RECOMPUTE_MODES):
                                if recompute == "selective" and base.flash_attention and \
                                        "none" in _allowed(filters, "recompute", RECOMPUTE_MODES):
                                    continue  # what selective recomputes, flash attention never keeps: none again
                                choices.append((base, t, c, e, d, b, recompute, p, schedule, v, env, filters,
                                                budget))
    layouts, enumerated, least, too_large = [], 0, (math.inf, ""), []
    size = max(1, -(-len(choices) // (ENUMERATION_CHUNKS * workers)))
    chunks = [choices[k:k + size] for k in range(0, len(choices), size)]
    built = 0
    for chunk in ordered_map(_partitions_of, chunks, workers if len(chunks) > 1 else 1):
        built += len(chunk)
        if progress:
            progress(built, len(choices))
        for found in chunk:
            enumerated += found[0]
            layouts.extend(found[1])
            too_large.extend(found[2])
            if found[3][0] < least[0]:
                least = found[3]
    return Enumeration(layouts, enumerated, least, too_large)


#: Chunks per worker of an enumeration: enough that the workers end together, few enough that each is worth a call.
ENUMERATION_CHUNKS = 8


def _partitions_of(chunk: list[tuple]) -> list[tuple[int, list[Layout], list[Unsimulated], tuple[float, str]]]:
    return [_partitions(*arguments) for arguments in chunk]


def _partitions(base: Workload, t: int, c: int, e: int, d: int, b: int, recompute: str, p: int, schedule: str, v: int,
                env: dict[str, object] | None, filters: Filters | None,
                budget: float) -> tuple[int, list[Layout], list[Unsimulated], tuple[float, str]]:
    """The layouts of one choice of degrees, micro-batch, schedule and recomputation, over partitions and zero:
    how many, those whose parameters leave room, those that do not, and the least parameter memory."""
    enumerated, layouts, too_large, least = 0, [], [], (math.inf, "")
    balanced: tuple[int, ...] | None = None  # the split of the first partition
    zeros = _allowed(filters, "zero", ZERO_STAGES if d > 1 else (0,))
    for partition, split in PARTITIONS.items():
        workload = replace(base, tensor_parallel=t, context_parallel=c, expert_parallel=e, data_parallel=d,
                           micro_batch_size=b, recompute=recompute, layers_per_stage=split, sequence_parallel=None)
        layers = stage_layers(workload, p * v)
        if layers == balanced:
            continue  # the same split twice
        balanced = layers
        # the split itself, so that a worker need not find it again
        workload = replace(workload, layers_per_stage=layers)
        for zero in zeros:
            enumerated += 1
            static = max(static_bytes(workload, p, schedule, v, zero, 1)) / 1e9  # gradients sharded as zero 2 does
            if static > budget:
                if static < least[0]:
                    least = (static, f"t {t} p {p} d {d}, {schedule}")
                too_large.append(Unsimulated(tuple(layout_cells(workload, p, schedule, v, zero, partition)), static,
                                             budget, base.device.memory_gb, OVER_MEMORY))
                continue
            try:
                params = workload_environment(workload, num_gpus=p, schedule=schedule, chunks=max(v, 2), zero=zero,
                                              **(env or {}))
            except ParameterError:  # a schedule's requirement on n, a length out of its domain
                enumerated -= 1
                continue
            layouts.append(Layout(workload, params, partition, _bound(workload, params)))
    return enumerated, layouts, too_large, least


def _shortened(params: EnvParams, rounds: int) -> EnvParams:
    """``params`` on ``rounds`` x p micro-batches (at most its own), its gradients synced as in the iteration: once
    at the end, or after every ``sync_freq`` micro-batches when it syncs more often (zero 2 and 3 after each)."""
    n = _shortened_n(params, rounds)
    return replace(params, n=n, sync_freq=n if params.sync_freq >= params.n else params.sync_freq)


def _shortened_n(params: EnvParams, rounds: int) -> int:
    """The micro-batches of ``_shortened(params, rounds)``, without making it."""
    return min(params.n, rounds * params.num_gpus)


@lru_cache(maxsize=256)
def _unit_peaks(schedule: str, num_gpus: int, chunks: int, n: int) -> tuple[float, ...]:
    """Each GPU's peak activations under the static order of equal stages."""
    from .engine import static_order_peaks  # the simulator, loaded by a search, not by the planner's --help

    return tuple(static_order_peaks(EnvParams(schedule=schedule, num_gpus=num_gpus, chunks=chunks, n=n, sync_freq=n)))


def estimated_memory_gb(layout: Layout) -> float:
    """No more than the fullest GPU's memory under the static order: its peaks counted on at most
    ``PEAK_ROUNDS`` x p micro-batches, with every stage as light as the lightest (a GPU's activations at any
    instant are a sum of its stages' weights over the micro-batches in flight, so at least the lightest weight
    times their count). Equal stages share one count per schedule, p and n, whatever the model."""
    params = layout.params
    peaks = _unit_peaks(params.schedule, params.num_gpus, params.chunks, _shortened_n(params, PEAK_ROUNDS))
    lightest = min(params.stage_weights, default=1.0)
    return max(gpu_memory_gb(layout.workload, params, tuple(lightest * peak for peak in peaks)))


def _draws(params: EnvParams, samples: int) -> int:
    return samples if params.jittered else 1


def _measure(params: EnvParams, policies: tuple[Policy, ...], samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Per policy, the iteration seconds (mean of the draws, or their 95th percentile under jitter), and the first
    policy's per-GPU peak activations (the static order's: the same for every draw)."""
    from .engine import simulate_figures

    figures = [simulate_figures(params, policies, sample) for sample in range(_draws(params, samples))]
    times = np.array([f[:, 0] for f in figures])
    seconds = np.percentile(times, 95, axis=0) if params.jittered else times[0]
    p = params.num_gpus
    return seconds, figures[0][0, 3 + 2 * p:]


def _outcome(layout: Layout, seconds: float, peaks: np.ndarray, policy: str, full: bool, budget: float) -> Outcome:
    w, params = layout.workload, layout.params
    assert w.global_batch_size is not None and w.seq_len is not None
    memory = max(gpu_memory_gb(w, params, tuple(peaks.tolist())))
    gpus = params.num_gpus * w.model_parallel * w.data_parallel
    mfu = iteration_flops(w, w.global_batch_size) / (seconds * gpus * w.device.tflops * 1e12)
    return Outcome(layout, float(seconds), memory, policy, w.global_batch_size * w.seq_len / seconds, mfu, full,
                   budget)


def _screen(item: tuple[tuple[Layout, ...], int, float]) -> list[Outcome | float | None]:
    """The zero stages of one layout, from the least, under the default policy: per layout an ``Outcome``, or its
    estimated memory (GB) when that is over the budget (nothing simulated), or None when a lower stage was already
    faster than the stage before it (each stage moves at least as many bytes on the same port as the one below)."""
    family, samples, budget = item
    found: list[Outcome | float | None] = []
    best = math.inf
    for layout in family:
        if found and isinstance(found[-1], Outcome) and found[-1].fits and found[-1].seconds > best:
            found.append(None)
            continue
        estimate = estimated_memory_gb(layout)
        if estimate > budget:
            found.append(estimate)
            continue
        outcome = _screen_one(layout, samples, budget)
        found.append(outcome)
        if outcome.fits:
            best = min(best, outcome.seconds)
    return found


def _screen_one(layout: Layout, samples: int, budget: float) -> Outcome:
    """A layout under the default policy. Two short runs, on ``SCREEN_ROUNDS`` x p and twice as many
    micro-batches, give the time of one more micro-batch once the pipeline is full; the iteration's n is
    extrapolated from them (or simulated when it is no longer than the second run)."""
    params, policy = layout.params, (Policy(),)
    first, second = _shortened(params, SCREEN_ROUNDS), _shortened(params, 2 * SCREEN_ROUNDS)
    if second.n == params.n:
        seconds, peaks = _measure(params, policy, samples)
        return _outcome(layout, float(seconds[0]), peaks, Policy().label, True, budget)
    short, peaks = _measure(first, policy, samples)
    longer, _ = _measure(second, policy, samples)
    per_microbatch = (longer[0] - short[0]) / (second.n - first.n)
    return _outcome(layout, float(longer[0] + per_microbatch * (params.n - second.n)), peaks, Policy().label, False,
                    budget)


def _policy_pass(item: tuple[Outcome, int]) -> Outcome:
    """A layout over the planner's policy grid: the policies compared on the screening's two short runs
    (extrapolated alike), then the best and the default simulated in full, the faster kept (the default on a
    tie). An iteration of more than ``MAX_TASKS`` tasks is not simulated in full: its outcome stays extrapolated,
    under the best policy of the short runs."""
    outcome, samples = item
    params, grid = outcome.layout.params, policy_grid(POLICY_STEP)
    first, second = _shortened(params, SCREEN_ROUNDS), _shortened(params, 2 * SCREEN_ROUNDS)
    policies = tuple(dict.fromkeys((Policy(), *grid)))
    if second.n < params.n:
        short, peaks = _measure(first, grid, samples)
        longer, _ = _measure(second, grid, samples)
        estimate = longer + (longer - short) / (second.n - first.n) * (params.n - second.n)
        best = int(np.argmin(estimate))
        if estimated_tasks(params) > MAX_TASKS:  # the default's estimate is the screening's
            if estimate[best] >= outcome.seconds:
                return outcome
            return _outcome(outcome.layout, float(estimate[best]), peaks, grid[best].label, False, outcome.budget_gb)
        policies = tuple(dict.fromkeys((Policy(), grid[best])))
    seconds, peaks = _measure(params, policies, samples)
    best = int(np.argmin(seconds))
    if seconds[best] >= seconds[0]:
        best = 0
    return _outcome(outcome.layout, float(seconds[best]), peaks, policies[best].label, True, outcome.budget_gb)


_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


def _map(function: Callable[[_Item], _Result], items: Iterable[_Item], workers: int,
         cluster: DaskCluster | None) -> Iterator[_Result]:
    """``function`` over ``items`` in input order, on ``cluster`` or else on ``workers`` processes."""
    return cluster.map(function, items) if cluster is not None else ordered_map(function, items, workers)


def plan(base: Workload, gpus: int, *, env: dict[str, object] | None = None, samples: int = 8, workers: int = 1,
         progress: Callable[[int, int, str], None] | None = None, cluster: DaskCluster | None = None,
         filters: Filters | None = None, headroom_gb: float = 0.0) -> PlanResult:
    """Search the layouts of ``base`` on ``gpus`` GPUs (``base`` gives the model, GPU, global batch, sequence and
    network; its degrees, sharding, micro-batch, schedule, chunks, recomputation and partition are searched, within
    ``filters``). A layout fits when its memory leaves ``headroom_gb`` of the GPU's free. ``env``: other
    environment parameters (``compute_jitter``, ``comm_jitter``, ``seed``); under jitter ``samples`` draws a layout
    and the 95th percentile ranks. ``progress(done, total, unit)`` is called as the choices of degrees are
    enumerated (``unit`` "choice"; tens of seconds for a large model), then as layouts are settled ("layout").
    ``PlanError`` when
    no layout divides or fits. With ``cluster`` (``cluster.DaskCluster``) the simulations run there instead of on
    ``workers`` processes; the result is the same."""
    if base.global_batch_size is None:
        raise PlanError("global_batch_size = None: the planner needs the global batch (sequences per iteration)")
    pinned_schedules = sorted((filters or {}).get("schedule", ()))
    if not base.shape.experts and pinned_schedules and not set(pinned_schedules) & set(SCHEDULES):
        raise PlanError(f"schedule = {'/'.join(pinned_schedules)}: not searched for {base.shape.name}, a model "
                        f"without experts (dualpipe-v's overlapped pairs hide an all-to-all); the planner searches "
                        f"{', '.join(SCHEDULES)}")
    _check_pins(base, gpus, filters or {})
    found = enumerate_layouts(base, gpus, env, filters, headroom_gb, workers,
                              None if progress is None else lambda done, total: progress(done, total, "choice"))
    degrees = f"tensor degrees dividing {gpus} up to {GPUS_PER_NODE} and its {base.shape.heads} heads" \
        if base.tp_bandwidth is not None else f"tensor degree 1 only ({NO_TENSOR_PARALLEL})"
    pinned = "; within " + ", ".join(f"{key} {'/'.join(map(str, sorted(values)))}"
                                     for key, values in (filters or {}).items()) if filters else ""
    if not found.enumerated:
        raise PlanError(f"gpus = {gpus}: no layout of {base.shape.name} on {gpus} GPUs; tried {degrees}, "
                        f"pipeline degrees up "
                        f"to its {base.shape.layers} layers, micro-batches {'/'.join(map(str, MICRO_BATCH_SIZES))} "
                        f"whose product with the data-parallel degree divides the global batch "
                        f"{base.global_batch_size}{pinned}")
    budget = base.device.memory_gb - headroom_gb
    room = f"{budget:g} GB per GPU" + (f" ({headroom_gb:g} GB of headroom)" if headroom_gb else "")
    small = found.layouts
    if not small:
        raise PlanError(f"model = {base.shape.name}: fits no layout on {gpus} x {base.device.name}; the least "
                        f"parameter and optimizer memory, {found.least_static[0]:.1f} GB per GPU "
                        f"({found.least_static[1]}), is above its {room} before any activation"
                        + (f"; tensor degree 1 only ({NO_TENSOR_PARALLEL})" if base.tp_bandwidth is None else "")
                        + pinned)
    # a layout's zero stages, screened together from the least: one family, in order of their common bound
    families: dict[tuple, list[Layout]] = {}
    for layout in small:
        families.setdefault((tuple(layout.row()[:4]), *layout.row()[5:]), []).append(layout)
    ordered = sorted((tuple(sorted(members, key=lambda layout: layout.params.zero)) for members in families.values()),
                     key=lambda members: members[0].bound)
    total = len(ordered) + min(TOP, len(small))
    live = _Leaders()
    settled = 0

    def items() -> Iterator[tuple[tuple[Layout, ...], int, float]]:
        nonlocal settled
        for index, family in enumerate(ordered):
            # a run whose bound is above the TOP-th fastest layout's time cannot make either list; bounds ascend,
            # so neither can any after it
            if family[0].bound >= live.threshold():
                settled += len(ordered) - index
                return
            yield family, samples, budget

    screened: list[list[Outcome | float | None]] = []
    for outcomes in _map(_screen, items(), workers, cluster):
        settled += 1
        screened.append(outcomes)
        live.record(outcomes)
        if progress:
            progress(settled, total, "layout")
    # What a serial search screens: the layouts in flight when the bound was crossed are kept only if they were
    # below it when their turn came, so that the result is the same on any number of workers or a cluster.
    tried: list[Outcome] = []
    unsimulated = list(found.too_large)
    serial = _Leaders()
    count = 0
    for family, outcomes in zip(ordered, screened):
        if family[0].bound >= serial.threshold():
            break
        count += 1
        for layout, outcome in zip(family, outcomes):
            if isinstance(outcome, Outcome):
                tried.append(outcome)
            else:
                unsimulated.append(Unsimulated(tuple(layout.row()), estimated_memory_gb(layout) if outcome is None
                                               else outcome, budget, base.device.memory_gb,
                                               LOWER_ZERO if outcome is None else OVER_MEMORY))
        serial.record(outcomes)
    # those the bound left are told apart by their memory estimate as a screened one is: over the budget is why
    # they cannot be run at all (step 2 before step 3)
    late = [(layout, estimated_memory_gb(layout)) for family in ordered[count:] for layout in family]
    unsimulated.extend(Unsimulated(tuple(layout.row()), estimate, budget, base.device.memory_gb,
                                   OVER_MEMORY if estimate > budget else ABOVE_BOUND) for layout, estimate in late)
    too_large = sum(1 for u in unsimulated if u.reason == OVER_MEMORY) - len(found.too_large)
    skipped = sum(1 for _, estimate in late if estimate <= budget)
    fitting = sorted((o for o in tried if o.fits), key=lambda o: o.seconds)
    passed: set[int] = set()  # outcomes of the policy pass
    if not fitting:
        lightest = min(tried, key=lambda o: o.memory_gb) if tried else None
        where = f"; the least simulated was {lightest.memory_gb:.1f} GB ({lightest.layout.describe()})" \
            if lightest else ""
        raise PlanError(f"model = {base.shape.name}: fits no layout on {gpus} x {base.device.name} with "
                        f"{room}, recomputation and zero included{where}"
                        + (f"; tensor degree 1 only ({NO_TENSOR_PARALLEL})" if base.tp_bandwidth is None else "")
                        + pinned)
    # the fastest runs and layouts, again over the policy grid and in full; until those listed are all such (a
    # run simulated in full may turn out slower than the screening's extrapolation of the next)
    ranked = fitting
    while pending := sorted((o for o in _leading(ranked) if (not o.full or o.policy == Policy().label)
                             and id(o) not in passed), key=lambda o: -estimated_tasks(o.layout.params)):
        # the largest first, so that the workers end at about the same time (the result is the same in any order)
        for old, new in zip(pending, _map(_policy_pass, ((o, samples) for o in pending), workers, cluster)):
            passed.add(id(new))
            tried[tried.index(old)] = new
            settled += 1
            if progress:
                progress(settled, max(total, settled), "layout")
        ranked = sorted((o for o in tried if o.fits), key=lambda o: o.seconds)
    if progress:  # fewer passes than the total foresaw: the bar ends at what was done
        progress(settled, settled, "layout")
    return PlanResult(tuple(tried), tuple(ranked), found.enumerated, len(found.too_large) + too_large, skipped,
                      tuple(unsimulated))
