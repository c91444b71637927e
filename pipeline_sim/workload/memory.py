"""Memory of a workload: activation bytes per layer (Korthikanti et al. 2022), parameters per GPU and stage, what
zero keeps of them, and a GPU's memory after a run (docs/model.md sections 11 and 15)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..model import EnvParams, ParameterError
from ..schedules import get_schedule
from .flops import held_params, layer_params
from .partition import stage_layers

if TYPE_CHECKING:
    from .definition import Workload


def activation_bytes_per_layer(workload: Workload) -> float:
    """Bytes one layer keeps for one micro-batch until its backward (Korthikanti et al. 2022, table 2).

    The paper counts 16-bit activations; another ``dtype_bytes`` scales the count.
    """
    shape, s, b, t = workload.shape, workload.seq_len, workload.rank_batch, workload.tensor_parallel
    assert s is not None
    sbh, h, a = s * b * shape.hidden, shape.hidden, shape.heads
    # without dropout no masks: 34 -> 32 (10 -> 8 of them on every tensor rank), 5 a s / h -> 2 a s / h
    kept, replicated, scores = (34.0, 10.0, 5.0) if workload.dropout else (32.0, 8.0, 2.0)
    if workload.recompute == "full":  # the layer's input alone, split over the tensor ranks with the sequence
        per_token = 2.0 / t if workload.sequence_parallel else 2.0
    elif workload.recompute == "selective" or workload.flash_attention:  # the attention scores not kept
        per_token = kept / t if workload.sequence_parallel else replicated + 24.0 / t
    elif workload.sequence_parallel:
        per_token = (kept + scores * a * s / h) / t
    else:
        per_token = replicated + 24.0 / t + scores * a * s / (h * t)
    return sbh * per_token * workload.dtype_bytes / 2.0


def gpu_params(workload: Workload, num_gpus: int, schedule: str = "1f1b", chunks: int = 2) -> list[float]:
    """Parameters held by each GPU (per tensor-parallel rank): the layers of its stages, and the embeddings of the
    first and last stage wherever the schedule places them."""
    shape, t = workload.shape, workload.tensor_parallel
    spec = get_schedule(schedule)
    v = spec.v(chunks)
    stages = num_gpus * v
    layers = stage_layers(workload, stages)
    if not shape.plain:
        held = [0.0] * num_gpus
        for stage, split in enumerate(stage_param_split(workload, stages)):
            held[spec.placement(stage, num_gpus, v)] += sum(split)
    elif workload.layers_per_stage == "balanced" and shape.layers % stages == 0:
        held = [shape.layers / num_gpus * layer_params(shape) / t] * num_gpus  # the even split, as it always was
    else:
        held, per_layer = [0.0] * num_gpus, layer_params(shape)
        for stage, count in enumerate(layers):
            held[spec.placement(stage, num_gpus, v)] += count * per_layer / t
    embedding = shape.vocab * shape.hidden / t
    for stage in (0, stages - 1):
        held[spec.placement(stage, num_gpus, v)] += embedding
    return held


def stage_params(workload: Workload, stages: int) -> list[float]:
    """Parameters of each stage (per tensor-parallel rank): its layers, the input embedding on the first stage and the
    output layer on the last (both where gradients are synced, whatever ``embedding_on_first`` says of the work)."""
    shape, t = workload.shape, workload.tensor_parallel
    if shape.plain:
        per_layer = layer_params(shape)
        held = [count * per_layer / t for count in stage_layers(workload, stages)]
    else:
        held = [sum(split) for split in stage_param_split(workload, stages)]
    for stage in (0, stages - 1):
        held[stage] += shape.vocab * shape.hidden / t
    return held


def stage_param_split(workload: Workload, stages: int) -> list[tuple[float, float]]:
    """Each stage's layer parameters a GPU holds, as (replicated, expert): the replicated ones per tensor-parallel
    rank, the routed experts split over ``expert_parallel`` GPUs and not over tensor ranks (docs/model.md section
    16); no embedding."""
    shape, t, e = workload.shape, workload.tensor_parallel, workload.expert_parallel
    split, first = [], 0
    for count in stage_layers(workload, stages):
        parts = [held_params(shape, e, layer) for layer in range(first, first + count)]
        split.append((sum(part[0] for part in parts) / t, sum(part[1] for part in parts)))
        first += count
    return split


def gpu_expert_params(workload: Workload, num_gpus: int, schedule: str = "1f1b", chunks: int = 2) -> list[float]:
    """Of ``gpu_params``, the routed experts' (all 0 without experts)."""
    spec = get_schedule(schedule)
    v = spec.v(chunks)
    held = [0.0] * num_gpus
    if workload.shape.experts:
        for stage, (_, expert) in enumerate(stage_param_split(workload, num_gpus * v)):
            held[spec.placement(stage, num_gpus, v)] += expert
    return held


def recompute_shares(workload: Workload, stages: int) -> tuple[float, ...]:
    """The share of each stage's layers fully recomputed on top of ``recompute``: ``recompute_per_stage``, or all 0."""
    shares = workload.recompute_per_stage
    if shares is None:
        return (0.0,) * stages
    if len(shares) != stages:
        raise ParameterError("recompute_per_stage", list(shares), f"must give one share per stage: {stages} here")
    return shares


def activation_factors(workload: Workload, stages: int) -> tuple[float, ...]:
    """Each stage's activations per layer over those of ``recompute``: ``c x full / base + 1 - c`` with c of its
    layers fully recomputed (``recompute_per_stage``; all 1 without it)."""
    shares = recompute_shares(workload, stages)
    if not any(shares):
        return (1.0,) * stages
    full = activation_bytes_per_layer(replace(workload, recompute="full", recompute_per_stage=None))
    base = activation_bytes_per_layer(workload)
    return tuple(c * full / base + 1.0 - c for c in shares)


def gpu_memory_gb(workload: Workload, params: EnvParams,
                  gpu_peak_activations: list[float] | tuple[float, ...]) -> tuple[float, ...]:
    """Per GPU, GB of parameters and optimizer state and of its peak activations (section 7's unit)."""
    per_microbatch = activation_bytes_per_layer(workload) * workload.shape.layers / params.num_gpus
    static = static_bytes(workload, params.num_gpus, params.schedule, params.chunks, params.zero, params.sync_freq)
    if workload.recompute_per_stage is None:
        return tuple((held + peak * per_microbatch) / 1e9 for held, peak in zip(static, gpu_peak_activations))
    # a GPU's activations scaled by the largest factor of its stages (exact with one stage a GPU)
    spec, v = get_schedule(params.schedule), params.v
    factors = [0.0] * params.num_gpus
    for stage, factor in enumerate(activation_factors(workload, params.num_gpus * v)):
        gpu = spec.placement(stage, params.num_gpus, v)
        factors[gpu] = max(factors[gpu], factor)
    return tuple((held + peak * factor * per_microbatch) / 1e9
                 for held, peak, factor in zip(static, gpu_peak_activations, factors))


def static_bytes(workload: Workload, num_gpus: int, schedule: str, chunks: int, zero: int,
                 sync_freq: int) -> list[float]:
    """Per GPU, the bytes of its parameters, gradients and optimizer state under ``zero`` (``static_memory``), the
    routed experts sharded over their own data-parallel group (docs/model.md section 16)."""
    per_param, working = static_memory(workload, zero, sync_freq)
    static = [held * per_param + working for held in gpu_params(workload, num_gpus, schedule, chunks)]
    if workload.shape.experts:
        extra = static_memory(workload, zero, sync_freq, expert=True)[0] - per_param
        static = [value + held * extra for value, held in zip(static, gpu_expert_params(workload, num_gpus, schedule,
                                                                                          chunks))]
    return static


def static_memory(workload: Workload, zero: int, sync_freq: int, expert: bool = False) -> tuple[float, float]:
    """Bytes a GPU keeps per parameter it holds, and the bytes of zero 3's gathered working set (docs/model.md
    section 15; Rajbhandari et al. 2020, "ZeRO", section 5).

    Of ``bytes_per_param``, a weight takes ``dtype_bytes``, a gradient ``gradient_bytes`` and the optimizer state
    the rest.
    Over S = ``shards`` GPUs, zero 1 divides the optimizer state by S, zero 2 the gradients too (when each
    micro-batch's are reduce-scattered, ``sync_freq`` 1; accumulated over several, a whole gradient is kept), and
    zero 3 everything. A zero-3 GPU also holds, unsharded, the weights of the layer it computes and of the one it
    prefetches and the gradients of one layer before they are reduce-scattered: three of its largest units (a layer,
    or the embedding), two weights and a gradient. A routed ``expert`` parameter is sharded over the GPUs holding
    the same experts, ``expert_shards`` of them (section 16).
    """
    total = workload.bytes_per_param
    if not zero:
        return total, 0.0
    shards, value = workload.expert_shards if expert else workload.shards, float(workload.dtype_bytes)
    gradient = float(workload.gradient_bytes)
    if zero == 1 or (zero == 2 and sync_freq > 1):
        pair = value + gradient
        return pair + (total - pair) / shards, 0.0
    if zero == 2:
        return value + (total - value) / shards, 0.0
    shape = workload.shape
    layer = layer_params(shape) if shape.plain else \
        max(sum(held_params(shape, workload.expert_parallel, k)) for k in range(shape.layers))
    unit = max(layer, shape.vocab * shape.hidden) / workload.tensor_parallel
    # 3 x unit x value exactly as before when the gradient is a weight's width
    return total / shards, 3.0 * unit * value if gradient == value else unit * (2.0 * value + gradient)
