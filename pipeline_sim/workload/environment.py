"""A workload turned into an environment: the lengths, weights and counts it derives, times in seconds (docs/model.md
sections 11 and 15)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..model import PARAMETER, EnvParams, ParameterError
from ..schedules import get_schedule
from .collectives import sharded_collectives, tp_forward_seconds
from .flops import (
    ELEMENTWISE_BACKWARD,
    elementwise_forward,
    embedding_forward_seconds,
    layer_flops,
    layer_forward_flops,
    logits_forward_flops,
)
from .memory import gpu_params, recompute_shares, stage_param_split, stage_params
from .partition import auto_splits, stage_layers

if TYPE_CHECKING:
    from .definition import Workload


def derived_parameters(workload: Workload, *, num_gpus: int, schedule: str = "1f1b", chunks: int = 2,
                       n: int | None = None, zero: int = 0) -> dict[str, Any]:
    """The environment parameters a workload sets, times in seconds (without ``sync_freq``), under ZeRO stage
    ``zero`` (docs/model.md section 15)."""
    shape, s, b, t, d = (workload.shape, workload.seq_len, workload.rank_batch, workload.tensor_parallel,
                         workload.data_parallel)
    assert s is not None
    speed = workload.device.tflops * 1e12 * workload.compute_efficiency
    v = get_schedule(schedule).v(chunks)
    stages = num_gpus * v
    if not isinstance(workload.layers_per_stage, tuple) and shape.layers < stages:  # the GPUs asked for too many
        raise ParameterError("num_gpus", num_gpus, f"{stages} stages{f' ({v} chunks a GPU)' if v > 1 else ''} "
                                                   f"cannot each take one of the {shape.layers} layers of "
                                                   f"{shape.name}")
    layers = stage_layers(workload, stages)
    imbalance = workload.imbalance
    layer = layer_forward_flops(shape, s, imbalance) * b / t / speed
    work = elementwise_forward(workload)
    elementwise, loss = work.layer, work.loss
    logits = logits_forward_flops(shape, s) * b / t / speed + loss
    comm = tp_forward_seconds(workload)
    embedding = embedding_forward_seconds(workload)
    # Each stage's forward: its layers, each with its tensor-parallel all-reduces, the input embedding on the first
    # stage and the output layer on the last; without embedding_on_first or head_on_last that work is spread evenly,
    # as the model did before stages were uneven.
    ends = [(embedding if workload.embedding_on_first and stage == 0 else 0.0) +
            (logits if workload.head_on_last and stage == stages - 1 else 0.0) for stage in range(stages)]
    spread = (0.0 if workload.embedding_on_first else embedding) + (0.0 if workload.head_on_last else logits)
    if shape.plain:
        stage_forward = [count * (layer + comm + elementwise) + extra + spread / stages
                         for count, extra in zip(layers, ends)]
    else:  # layers of their own sizes (dense and MoE layers, section 16)
        firsts = [sum(layers[:stage]) for stage in range(stages)]
        stage_forward = [math.fsum(layer_flops(shape, s, k, imbalance) for k in range(first, first + count)) * b / t
                         / speed + count * (comm + elementwise) + extra + spread / stages
                         for first, count, extra in zip(firsts, layers, ends)]
    if shape.plain and len(set(stage_forward)) == 1 and embedding == 0.0:  # equal stages: as always computed
        fwd = (shape.layers * layer_forward_flops(shape, s) + logits_forward_flops(shape, s)) / num_gpus * b / t \
            / speed + shape.layers / num_gpus * comm + (shape.layers * elementwise + loss) / num_gpus
        weights: tuple[float, ...] = ()
    else:
        fwd = math.fsum(stage_forward) / num_gpus
        weights = tuple(forward * v / fwd for forward in stage_forward)
    # a layer's backward is twice its forward's FLOPs with the same all-reduces and 1.5 times its element-wise
    # bytes, plus the forward again under full recomputation (the attention scores' element-wise work again under
    # selective); the ratio of a layer holds for the whole stage
    recompute = workload.recompute == "full"
    scores = work.scores if workload.recompute == "selective" else 0.0
    ratio = ((2.0 + recompute) * layer + (1.0 + recompute) * comm + (ELEMENTWISE_BACKWARD + recompute) * elementwise
             + scores) / (layer + comm + elementwise)
    bwd = 2.0 * fwd + (fwd if recompute else 0.0) if comm == 0.0 and elementwise == 0.0 else ratio * fwd
    message = s * b * shape.hidden * workload.dtype_bytes / (t if workload.sequence_parallel else 1)
    held = stage_params(workload, stages)
    share, gather_share = sharded_collectives(workload, zero)  # seconds per parameter
    sync_weights: tuple[float, ...] = ()
    # the optimizer step reads and writes each parameter's bytes_per_param once at the memory bandwidth; under zero a
    # GPU steps its shard alone
    step = 2.0 * workload.bytes_per_param / (workload.device.memory_bandwidth or 1.0) / 1e9 \
        if workload.optimizer_step else 0.0  # seconds per parameter
    if zero:
        step /= workload.shards
    if not shape.plain:
        sync, optimizer, gather, sync_weights = _expert_syncs(workload, zero, stages, v, share, gather_share, step)
    elif len(set(held)) == 1 or (d == 1 and not step):  # equal stages, or nothing per stage: the fullest GPU's
        fullest = max(gpu_params(workload, num_gpus, schedule, chunks))
        sync, optimizer, gather = share * fullest, step * fullest, gather_share * fullest
    else:  # each stage syncs (and steps) its own parameters; the lengths are the mean stage's, v of them
        mean = math.fsum(held) / stages
        sync, optimizer, gather = share * mean * v, step * mean * v, gather_share * mean * v
        sync_weights = tuple(count / mean for count in held)
    # context parallelism: each layer's keys and values pass the other c - 1 ranks (ring or all-gather, the same
    # bytes), for a GPU's share of the layers
    c = workload.context_parallel
    assert shape.kv_heads is not None
    key, value = shape.qk_head_dim or shape.hidden / shape.heads, shape.v_head_dim or shape.hidden / shape.heads
    kv_block = s * b * shape.kv_heads * (key + value) * workload.dtype_bytes / t
    exchange = (c - 1) * kv_block * shape.layers / num_gpus / (workload.p2p_bandwidth * 1e9)
    a2a, a2a_weights = all_to_all(workload, stages, num_gpus)
    return {"n": workload.micro_batches(n), "fwd_len": fwd, "bwd_len": bwd,
            "prop_len": message / (workload.p2p_bandwidth * 1e9), "sync_base_len": sync, "w_fraction": 0.5,
            "stage_weights": weights, "sync_weights": sync_weights,
            "bwd_weights": backward_weights(workload, stages), "optimizer_len": optimizer, "gather_len": gather,
            "cp_len": exchange, "a2a_len": a2a, "a2a_weights": a2a_weights}


def all_to_all(workload: Workload, stages: int, num_gpus: int) -> tuple[float, tuple[float, ...]]:
    """``a2a_len`` and ``a2a_weights`` (docs/model.md section 16): per MoE layer and micro-batch a dispatch and a
    combine, each sending a GPU's ``tokens x copies x h x dtype_bytes``, the busiest GPU's (``expert_imbalance``)
    setting the pace. Of the e GPUs, those of its node (``node_gpus``, the group packed into nodes) take their
    share over NVLink (``tp_bandwidth``), the rest over the network (``ep_bandwidth``), at once: the slower sets the
    time. Over the network ``copies`` is ``top_k``, or at most ``route_nodes`` when routing is node-limited (a token
    crosses to a node once and is forwarded there over NVLink)."""
    shape, e = workload.shape, workload.expert_parallel
    if e == 1:
        return 0.0, ()
    assert workload.seq_len is not None and workload.ep_bandwidth is not None
    tokens = workload.seq_len * workload.rank_batch / (workload.tensor_parallel if workload.sequence_parallel else 1)
    copies = shape.top_k if workload.route_nodes is None else min(shape.top_k, workload.route_nodes)
    local = min(e, workload.node_gpus)
    nvlink = workload.tp_bandwidth or workload.ep_bandwidth
    seconds = max(copies * (e - local) / e / workload.ep_bandwidth, shape.top_k * (local - 1) / e / nvlink) / 1e9
    per_layer = 2.0 * tokens * shape.hidden * workload.dtype_bytes * workload.imbalance * seconds
    layers, first, counts = stage_layers(workload, stages), 0, []
    for count in layers:
        counts.append(sum(shape.is_moe(k) for k in range(first, first + count)))
        first += count
    mean = sum(counts) / stages
    weights = () if len(set(counts)) == 1 else tuple(count / mean for count in counts)
    return per_layer * sum(counts) / num_gpus, weights


def _expert_syncs(workload: Workload, zero: int, stages: int, v: int, share: float, gather_share: float,
                  step: float) -> tuple[float, float, float, tuple[float, ...]]:
    """``sync_base_len``, ``optimizer_len``, ``gather_len`` and ``sync_weights`` of a model with experts (section
    16): replicated parameters synced, stepped and gathered as section 15 says, routed experts over the GPUs that hold
    the same experts (``data_parallel x tensor_parallel / expert_parallel`` of them, times c). The weights follow the
    syncs."""
    e = workload.expert_parallel
    experts = replace(workload, data_parallel=workload.data_parallel * workload.tensor_parallel // e,
                      shard_group=None, expert_parallel=1, global_batch_size=None, tensor_parallel=1,
                      tp_bandwidth=None)
    expert_share, expert_gather = sharded_collectives(experts, zero)
    expert_step = step * workload.shards / workload.expert_shards if zero else step
    split = stage_param_split(workload, stages)
    embedding = workload.shape.vocab * workload.shape.hidden / workload.tensor_parallel
    for stage in (0, stages - 1):
        split[stage] = (split[stage][0] + embedding, split[stage][1])
    syncs = [share * replicated + expert_share * expert for replicated, expert in split]
    totals = [replicated + expert for replicated, expert in split]
    basis = syncs if any(syncs) else totals
    mean = math.fsum(basis) / stages
    return (math.fsum(syncs) / stages * v, math.fsum(step * r + expert_step * x for r, x in split) / stages * v,
            math.fsum(gather_share * r + expert_gather * x for r, x in split) / stages * v,
            tuple(value / mean for value in basis))


def backward_weights(workload: Workload, stages: int) -> tuple[float, ...]:
    """``bwd_weights`` of ``recompute_per_stage`` (section 11): a stage's backward over its forward, ``((2 + c) layer
    + (1 + c) tp) / (layer + tp)`` with c of its layers recomputed, over the same with c = 0; empty when no layer
    is recomputed."""
    shares = recompute_shares(workload, stages)
    if not any(shares):
        return ()
    shape, t = workload.shape, workload.tensor_parallel
    assert workload.seq_len is not None
    speed = workload.device.tflops * 1e12 * workload.compute_efficiency
    layer = layer_forward_flops(shape, workload.seq_len) * workload.rank_batch / t / speed
    comm = tp_forward_seconds(workload)
    work = elementwise_forward(workload)
    scores = work.scores if workload.recompute == "selective" else 0.0  # the layers not fully recomputed
    base = 2.0 * layer + comm + ELEMENTWISE_BACKWARD * work.layer + scores
    return tuple(((2.0 + c) * layer + (1.0 + c) * comm + (ELEMENTWISE_BACKWARD + c) * work.layer
                  + (1.0 - c) * scores) / base for c in shares)


#: The environment parameters a workload sets; ``sync_freq`` is derived unless given (``workload_environment``).
DERIVED_KEYS = ("n", "fwd_len", "bwd_len", "prop_len", "sync_base_len", "w_fraction", "stage_weights",
                "sync_weights", "bwd_weights", "optimizer_len", "gather_len", "cp_len", "a2a_len", "a2a_weights",
                "sync_freq")


def workload_environment(workload: Workload, **env: Any) -> EnvParams:
    """The environment of ``workload`` with the other parameters ``env`` (``num_gpus``, ``schedule``, noise...).

    ``sync_freq`` defaults to ``n`` (one gradient sync per iteration), or to 1 under ``zero`` 2 and 3 (gradients
    reduce-scattered after every backward, docs/model.md section 15.2); ``n`` may be given
    only when the workload has no ``global_batch_size``.
    """
    for key in DERIVED_KEYS:
        if key in env and key not in ("n", "sync_freq"):
            raise ParameterError(key, env[key], "is derived from the workload; leave it out")
    if "n" in env and workload.global_batch_size is not None:
        raise ParameterError("n", env["n"], "is derived from global_batch_size; give one of them")
    # checks num_gpus, schedule...; with the workload's own n, which a schedule's requirement on n judges
    base = EnvParams(**{key: value for key, value in env.items() if key != "n"},
                     n=workload.micro_batches(env.get("n", PARAMETER["n"].default)))
    pair = workload.dtype_bytes + workload.gradient_bytes
    if base.zero and workload.bytes_per_param < pair:
        held = f"2 x dtype_bytes = {pair}" if workload.grad_bytes is None else \
            f"dtype_bytes + grad_bytes = {pair}"
        raise ParameterError("bytes_per_param", workload.bytes_per_param, f"must hold a weight and a gradient "
                             f"({held}) for zero {base.zero} to shard the rest")
    derived = derived_parameters(workload, num_gpus=base.num_gpus, schedule=base.schedule, chunks=base.chunks,
                                 n=env.get("n", PARAMETER["n"].default), zero=base.zero)
    # zero 2 and 3 reduce-scatter each micro-batch's gradients as its backward ends (section 15)
    sync_freq = env.get("sync_freq", 1 if base.zero >= 2 else derived["n"])
    compute = "with this gpu, compute_efficiency, micro_batch_size, seq_len and tensor_parallel" + \
        (" (and the gpu's memory_bandwidth, for elementwise)" if workload.elementwise else "")
    for key, given, value, what in (
            ("fwd_len", "model", workload.shape.name, compute),
            ("bwd_len", "model", workload.shape.name, compute),
            ("prop_len", "p2p_bandwidth", workload.p2p_bandwidth, "for each activation or gradient message"),
            ("sync_base_len", "dp_bandwidth", workload.dp_bandwidth, "for each gradient sync"),
            ("optimizer_len", "bytes_per_param", workload.bytes_per_param, "for the optimizer step of v mean stages "
                                                                           "(optimizer_step)"),
            ("gather_len", "dp_bandwidth", workload.dp_bandwidth, "for each all-gather of parameters (zero)"),
            ("cp_len", "p2p_bandwidth", workload.p2p_bandwidth, "for each attention exchange (context_parallel)"),
            ("a2a_len", "ep_bandwidth", workload.ep_bandwidth, "for each all-to-all (expert_parallel)")):
        try:  # a derived length out of its domain is said in terms of what the user gave
            PARAMETER[key].domain.check(key, derived[key])
        except ParameterError:
            raise ParameterError(given, value, f"gives {key} = {derived[key]:.3g} s {what}, outside "
                                               f"{PARAMETER[key].allowed} s") from None
    # what the base ignored for want of a derived length (the all-to-all's class and overlap) is read again beside it
    return replace(base, **derived, sync_freq=sync_freq, **{key: env[key] for key in ("a2a_class", "ep_overlap")
                                                             if key in env})


def with_layers(workload: Workload, params: EnvParams, layers: tuple[int, ...]) -> tuple[Workload, EnvParams]:
    """``workload`` and its environment ``params`` with the layers of each stage set to ``layers``."""
    chosen = replace(workload, layers_per_stage=layers)
    derived = derived_parameters(chosen, num_gpus=params.num_gpus, schedule=params.schedule, chunks=params.chunks,
                                 n=params.n, zero=params.zero)
    return chosen, replace(params, **derived)


def auto_candidates(workload: Workload, params: EnvParams) -> list[tuple[Workload, EnvParams]]:
    """The workloads and environments ``auto`` chooses among by simulating them (``auto_splits``), balanced first."""
    stages = params.num_gpus * get_schedule(params.schedule).v(params.chunks)
    return [with_layers(workload, params, layers) for layers in auto_splits(workload, stages)]
