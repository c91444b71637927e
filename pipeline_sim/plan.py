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
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np

from .cluster import DaskCluster
from .engine import gpu_order_peaks, simulate_figures
from .model import EnvParams, ParameterError, Policy
from .parallel import ordered_map
from .scenarios import policy_grid
from .schedules import get_schedule
from .workload import (
    RECOMPUTE_MODES,
    Workload,
    gpu_memory_gb,
    gpu_params,
    iteration_flops,
    stage_layers,
    workload_environment,
)

#: Tensor parallelism stays within a node, whose GPUs NVLink joins (tp_bandwidth is NVLink's).
GPUS_PER_NODE = 8
#: Why a GPU without an NVLink figure (and no tp_bandwidth given) gets no tensor parallelism.
NO_TENSOR_PARALLEL = "the gpu states no nvlink_bandwidth; give it, or --tp-bandwidth"
MICRO_BATCH_SIZES = (1, 2, 4)
#: The schedules searched, each with two chunks where it has chunks (the one-chunk ones dominate gpipe and dualpipe-v
#: is left to the sweep: its two-way traffic needs a policy grid of its own to be judged).
SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v")
CHUNKS = 2
#: The partitions tried, by name, and the ``layers_per_stage`` each gives: balanced, and the split of least
#: bottleneck stage (``auto``'s first step; its simulated neighbours are left to the sweep).
PARTITIONS = {"balanced": "balanced", "bottleneck": "auto"}
#: The policy grid the fastest layouts are simulated over (31 policies).
POLICY_STEP = 1.0
TOP = 10
#: Peaks of the static order are reached within the warm-up and first steady rounds, so the memory check before
#: simulating counts them on at most this many micro-batches per pipeline stage (fewer can only lower a peak).
PEAK_ROUNDS = 4
#: The screening runs take this many micro-batches per stage and twice as many: the pipeline is then full, and
#: both are multiples of p and at least 2 p, as the schedules require.
SCREEN_ROUNDS = 2
COLUMNS = ("rank", "tensor_parallel", "pipeline_parallel", "data_parallel", "micro_batch_size", "schedule", "chunks",
           "recompute", "partition", "layers_per_stage", "iteration_seconds", "tokens_per_second", "mfu",
           "memory_gb", "gpu_memory_gb", "policy", "simulated")


class PlanError(ValueError):
    """A request no layout answers; the message is one line naming what was tried."""


@dataclass(frozen=True)
class Layout:
    """One way to run the workload: its degrees, schedule, recomputation and partition, and its environment."""

    workload: Workload
    params: EnvParams
    partition: str
    bound: float  # seconds no run of it can beat: its busiest GPU's compute

    @property
    def tensor(self) -> int:
        return self.workload.tensor_parallel

    @property
    def pipeline(self) -> int:
        return self.params.num_gpus

    @property
    def data(self) -> int:
        return self.workload.data_parallel

    def describe(self) -> str:
        """``t 8 p 4 d 2, b 1, zb-v, recompute selective, bottleneck``."""
        return (f"t {self.tensor} p {self.pipeline} d {self.data}, b {self.workload.micro_batch_size}, "
                f"{self.params.schedule}, "
                f"recompute {self.workload.recompute}, {self.partition}")


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

    @property
    def fits(self) -> bool:
        return self.memory_gb <= self.layout.workload.device.memory_gb

    def cells(self, rank: int) -> list[object]:
        w, p = self.layout.workload, self.layout.params
        layers = stage_layers(w, p.num_gpus * get_schedule(p.schedule).v(p.chunks))
        return [rank, w.tensor_parallel, p.num_gpus, w.data_parallel, w.micro_batch_size, p.schedule,
                p.chunks if get_schedule(p.schedule).v(p.chunks) > 1 else "", w.recompute, self.layout.partition,
                " ".join(map(str, layers)), self.seconds, self.tokens_per_second, self.mfu, self.memory_gb,
                w.device.memory_gb, self.policy, "full" if self.full else "extrapolated"]


@dataclass(frozen=True)
class PlanResult:
    """Every simulated layout (``tried``), those that fit fastest first (``ranked``), and what was pruned."""

    tried: tuple[Outcome, ...]
    ranked: tuple[Outcome, ...]
    enumerated: int
    pruned_memory: int
    pruned_bound: int


def _divisors(number: int) -> list[int]:
    return [k for k in range(1, number + 1) if number % k == 0]


def _bound(workload: Workload, params: EnvParams) -> float:
    """The busiest GPU's compute over the iteration: no schedule or policy finishes sooner (jitter has mean 1)."""
    spec = get_schedule(params.schedule)
    v = spec.v(params.chunks)
    load = [0.0] * params.num_gpus
    if not params.bwd_weights:
        for stage in range(params.num_gpus * v):
            load[spec.placement(stage, params.num_gpus, v)] += params.stage_weight(stage) / v
        return params.n * (params.fwd_len + params.bwd_len) * max(load)
    for stage in range(params.num_gpus * v):  # a backward weighted on its own (section 6.6)
        load[spec.placement(stage, params.num_gpus, v)] += \
            params.stage_weight(stage) * (params.fwd_len + params.bwd_len * params.bwd_weight(stage)) / v
    return params.n * max(load)


@dataclass(frozen=True)
class Enumeration:
    """The layouts whose parameters and optimizer state fit, how many were enumerated, and the least such memory
    of any (GB, and its layout) for the message when none fits."""

    layouts: list[Layout]
    enumerated: int
    least_static: tuple[float, str]


def enumerate_layouts(base: Workload, gpus: int, env: dict[str, object] | None = None) -> Enumeration:
    """Every layout of ``base`` (its model, GPU, batch and network) on ``gpus`` GPUs that is a valid environment
    and whose parameters and optimizer state fit the GPU (checked before its environment is built).

    Tensor degrees divide the GPU count, the heads and the key-value heads, up to ``GPUS_PER_NODE``, with
    sequence parallelism; pipeline degrees divide what is left, with a layer for each stage; the micro-batch size
    times the data-parallel degree divides the global batch. ``env``: the environment's other parameters (jitter,
    seed).
    """
    shape = base.shape
    assert base.global_batch_size is not None
    layouts, enumerated, least = [], 0, (math.inf, "")
    for t in _divisors(gpus):
        if t > GPUS_PER_NODE or shape.heads % t or (shape.kv_heads or shape.heads) % t or \
                (t > 1 and base.tp_bandwidth is None):  # a GPU without NVLink figures and no tp_bandwidth given
            continue
        for p in _divisors(gpus // t):
            d = gpus // (t * p)
            for b in MICRO_BATCH_SIZES:
                if base.global_batch_size % (b * d):
                    continue
                for schedule in SCHEDULES:
                    v = get_schedule(schedule).v(CHUNKS)
                    if p * v > shape.layers or (p == 1 and v > 1):  # chunks on one GPU only add transfers
                        continue
                    for recompute in RECOMPUTE_MODES:
                        if recompute == "selective" and base.flash_attention:
                            continue  # what selective recomputes, flash attention never keeps: none's layout again
                        balanced: tuple[int, ...] | None = None  # the split of the first partition
                        for partition, split in PARTITIONS.items():
                            workload = replace(base, tensor_parallel=t, data_parallel=d, micro_batch_size=b,
                                               recompute=recompute, layers_per_stage=split, sequence_parallel=None)
                            layers = stage_layers(workload, p * get_schedule(schedule).v(CHUNKS))
                            if layers == balanced:
                                continue  # the same split twice
                            balanced = layers
                            enumerated += 1
                            # the split itself, so that a worker need not find it again
                            workload = replace(workload, layers_per_stage=layers)
                            static = max(gpu_params(workload, p, schedule, CHUNKS)) * workload.bytes_per_param / 1e9
                            if static > base.device.memory_gb:
                                if static < least[0]:
                                    least = (static, f"t {t} p {p} d {d}, {schedule}")
                                continue
                            try:
                                params = workload_environment(workload, num_gpus=p, schedule=schedule, chunks=CHUNKS,
                                                              **(env or {}))
                            except ParameterError:  # a schedule's requirement on n, a length out of its domain
                                enumerated -= 1
                                break
                            layouts.append(Layout(workload, params, partition, _bound(workload, params)))
    return Enumeration(layouts, enumerated, least)


def _shortened(params: EnvParams, rounds: int) -> EnvParams:
    """``params`` on ``rounds`` x p micro-batches (at most its own), one gradient sync at the end as in the
    iteration."""
    n = min(params.n, rounds * params.num_gpus)
    return replace(params, n=n, sync_freq=n)


@lru_cache(maxsize=256)
def _unit_peaks(schedule: str, num_gpus: int, chunks: int, n: int) -> tuple[float, ...]:
    """Each GPU's peak activations under the static order of equal stages."""
    return tuple(gpu_order_peaks(EnvParams(schedule=schedule, num_gpus=num_gpus, chunks=chunks, n=n, sync_freq=n)))


def estimated_memory_gb(layout: Layout) -> float:
    """No more than the fullest GPU's memory under the static order: its peaks counted on at most
    ``PEAK_ROUNDS`` x p micro-batches, with every stage as light as the lightest (a GPU's activations at any
    instant are a sum of its stages' weights over the micro-batches in flight, so at least the lightest weight
    times their count). Equal stages share one count per schedule, p and n, whatever the model."""
    params = layout.params
    peaks = _unit_peaks(params.schedule, params.num_gpus, params.chunks, _shortened(params, PEAK_ROUNDS).n)
    lightest = min(params.stage_weights, default=1.0)
    return max(gpu_memory_gb(layout.workload, params, tuple(lightest * peak for peak in peaks)))


def _draws(params: EnvParams, samples: int) -> int:
    return samples if params.jittered else 1


def _measure(params: EnvParams, policies: tuple[Policy, ...], samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Per policy, the iteration seconds (mean of the draws, or their 95th percentile under jitter), and the first
    policy's per-GPU peak activations (the static order's: the same for every draw)."""
    figures = [simulate_figures(params, policies, sample) for sample in range(_draws(params, samples))]
    times = np.array([f[:, 0] for f in figures])
    seconds = np.percentile(times, 95, axis=0) if params.jittered else times[0]
    p = params.num_gpus
    return seconds, figures[0][0, 3 + 2 * p:]


def _outcome(layout: Layout, seconds: float, peaks: np.ndarray, policy: str, full: bool) -> Outcome:
    w, params = layout.workload, layout.params
    assert w.global_batch_size is not None and w.seq_len is not None
    memory = max(gpu_memory_gb(w, params, tuple(peaks.tolist())))
    gpus = params.num_gpus * w.tensor_parallel * w.data_parallel
    mfu = iteration_flops(w, w.global_batch_size) / (seconds * gpus * w.device.tflops * 1e12)
    return Outcome(layout, float(seconds), memory, policy, w.global_batch_size * w.seq_len / seconds, mfu, full)


def _screen(item: tuple[Layout, int]) -> Outcome | None:
    """A layout under the default policy, or None when its estimated memory does not fit (nothing simulated).

    Two short runs, on ``SCREEN_ROUNDS`` x p and twice as many micro-batches, give the time of one more
    micro-batch once the pipeline is full; the iteration's n is extrapolated from them (or simulated when it is
    no longer than the second run)."""
    layout, samples = item
    if estimated_memory_gb(layout) > layout.workload.device.memory_gb:
        return None
    params, policy = layout.params, (Policy(),)
    first, second = _shortened(params, SCREEN_ROUNDS), _shortened(params, 2 * SCREEN_ROUNDS)
    if second.n == params.n:
        seconds, peaks = _measure(params, policy, samples)
        return _outcome(layout, float(seconds[0]), peaks, Policy().label, True)
    short, peaks = _measure(first, policy, samples)
    longer, _ = _measure(second, policy, samples)
    per_microbatch = (longer[0] - short[0]) / (second.n - first.n)
    return _outcome(layout, float(longer[0] + per_microbatch * (params.n - second.n)), peaks, Policy().label, False)


def _policy_pass(item: tuple[Outcome, int]) -> Outcome:
    """A layout over the planner's policy grid: the policies compared on the screening's two short runs
    (extrapolated alike), then the best and the default simulated in full, the faster kept (the default on a
    tie)."""
    outcome, samples = item
    params, grid = outcome.layout.params, policy_grid(POLICY_STEP)
    first, second = _shortened(params, SCREEN_ROUNDS), _shortened(params, 2 * SCREEN_ROUNDS)
    policies = tuple(dict.fromkeys((Policy(), *grid)))
    if second.n < params.n:
        short, _ = _measure(first, grid, samples)
        longer, _ = _measure(second, grid, samples)
        estimate = longer + (longer - short) / (second.n - first.n) * (params.n - second.n)
        policies = tuple(dict.fromkeys((Policy(), grid[int(np.argmin(estimate))])))
    seconds, peaks = _measure(params, policies, samples)
    best = int(np.argmin(seconds))
    if seconds[best] >= seconds[0]:
        best = 0
    return _outcome(outcome.layout, float(seconds[best]), peaks, policies[best].label, True)


_Item = TypeVar("_Item")
_Result = TypeVar("_Result")


def _map(function: Callable[[_Item], _Result], items: Iterable[_Item], workers: int,
         cluster: DaskCluster | None) -> Iterator[_Result]:
    """``function`` over ``items`` in input order, on ``cluster`` or else on ``workers`` processes."""
    return cluster.map(function, items) if cluster is not None else ordered_map(function, items, workers)


def plan(base: Workload, gpus: int, *, env: dict[str, object] | None = None, samples: int = 8, workers: int = 1,
         progress: Callable[[int, int], None] | None = None, cluster: DaskCluster | None = None) -> PlanResult:
    """Search the layouts of ``base`` on ``gpus`` GPUs (``base`` gives the model, GPU, global batch, sequence and
    network; its degrees, micro-batch, recomputation and partition are searched). ``env``: other environment
    parameters (``compute_jitter``, ``comm_jitter``, ``seed``); under jitter ``samples`` draws a layout and the
    95th percentile ranks. ``progress(done, total)`` is called as layouts are settled. ``PlanError`` when no
    layout divides or fits. With ``cluster`` (``cluster.DaskCluster``) the simulations run there instead of on
    ``workers`` processes; the result is the same."""
    if base.global_batch_size is None:
        raise PlanError("global_batch_size = None: the planner needs the global batch (sequences per iteration)")
    found = enumerate_layouts(base, gpus, env)
    degrees = f"tensor degrees dividing {gpus} up to {GPUS_PER_NODE} and its {base.shape.heads} heads" \
        if base.tp_bandwidth is not None else f"tensor degree 1 only ({NO_TENSOR_PARALLEL})"
    if not found.enumerated:
        raise PlanError(f"gpus = {gpus}: no layout of {base.shape.name} on {gpus} GPUs; tried {degrees}, "
                        f"pipeline degrees up "
                        f"to its {base.shape.layers} layers, micro-batches {'/'.join(map(str, MICRO_BATCH_SIZES))} "
                        f"whose product with the data-parallel degree divides the global batch "
                        f"{base.global_batch_size}")
    gpu_memory = base.device.memory_gb
    small = found.layouts
    if not small:
        raise PlanError(f"model = {base.shape.name}: fits no layout on {gpus} x {base.device.name}; the least "
                        f"parameter and optimizer memory, {found.least_static[0]:.1f} GB per GPU "
                        f"({found.least_static[1]}), is above its {gpu_memory:g} GB before any activation"
                        + (f"; tensor degree 1 only ({NO_TENSOR_PARALLEL})" if base.tp_bandwidth is None else ""))
    small.sort(key=lambda layout: layout.bound)
    total = len(small) + min(TOP, len(small))
    live: list[float] = []  # the TOP fastest fitting times screened so far, ascending
    settled = 0

    def items() -> Iterator[tuple[Layout, int]]:
        nonlocal settled
        for index, layout in enumerate(small):
            # a layout whose bound is above the TOP-th fastest time found cannot make the list; bounds ascend, so
            # neither can any after it
            if len(live) >= TOP and layout.bound >= live[TOP - 1]:
                settled += len(small) - index
                return
            yield layout, samples

    def fastest(times: list[float], outcome: Outcome | None) -> None:
        if outcome is not None and outcome.fits:
            times.append(outcome.seconds)
            times.sort()
            del times[TOP:]

    screened: list[Outcome | None] = []
    for outcome in _map(_screen, items(), workers, cluster):
        settled += 1
        screened.append(outcome)
        fastest(live, outcome)
        if progress:
            progress(settled, total)
    # What a serial search screens: the layouts in flight when the bound was crossed are kept only if they were
    # below it when their turn came, so that the result is the same on any number of workers or a cluster.
    tried: list[Outcome] = []
    serial: list[float] = []
    too_large = 0
    for layout, outcome in zip(small, screened):
        if len(serial) >= TOP and layout.bound >= serial[TOP - 1]:
            break
        if outcome is None:
            too_large += 1
        else:
            tried.append(outcome)
        fastest(serial, outcome)
    skipped = len(small) - too_large - len(tried)
    fitting = sorted((o for o in tried if o.fits), key=lambda o: o.seconds)
    if not fitting:
        lightest = min(tried, key=lambda o: o.memory_gb) if tried else None
        where = f"; the least simulated was {lightest.memory_gb:.1f} GB ({lightest.layout.describe()})" \
            if lightest else ""
        raise PlanError(f"model = {base.shape.name}: fits no layout on {gpus} x {base.device.name} with "
                        f"{gpu_memory:g} GB per GPU, recomputation included{where}"
                        + (f"; tensor degree 1 only ({NO_TENSOR_PARALLEL})" if base.tp_bandwidth is None else ""))
    improved = {}  # the fastest, again over the policy grid
    for old, new in zip(fitting[:TOP], _map(_policy_pass, ((o, samples) for o in fitting[:TOP]), workers, cluster)):
        improved[id(old)] = new
        settled += 1
        if progress:
            progress(settled, total)
    tried = [improved.get(id(o), o) for o in tried]
    ranked = sorted((o for o in tried if o.fits), key=lambda o: o.seconds)
    return PlanResult(tuple(tried), tuple(ranked), found.enumerated, found.enumerated - len(small) + too_large,
                      skipped)
