"""FLOPs and compute seconds of a workload: Megatron-LM's count of a layer and the logits, the input embedding and the
memory-bound element-wise work (docs/model.md section 11)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .collectives import tp_forward_seconds
from .shapes import ModelShape

if TYPE_CHECKING:
    from .definition import Workload


def layer_forward_flops(shape: ModelShape, seq_len: int, imbalance: float = 1.0) -> float:
    """One transformer layer's forward FLOPs for one sequence: 4 s h^2 (1 + g/a + s/h) + 4 s h f'; of a model with
    experts or attention of its own kind (``ModelShape.plain`` false), the mean of its layers' (``layer_flops``)."""
    if not shape.plain:
        return sum(layer_flops(shape, seq_len, layer, imbalance) for layer in range(shape.layers)) / shape.layers
    s, h = seq_len, shape.hidden
    ffn = shape.ffn_hidden * (1.5 if shape.gated_mlp else 1.0)
    assert shape.kv_heads is not None
    return 4.0 * s * h * h * (1.0 + shape.kv_heads / shape.heads + s / h) + 4.0 * s * h * ffn


def _attention_params(shape: ModelShape) -> float:
    """A layer's attention projections: ``attention_params``, or 2 h^2 (1 + g/a)."""
    assert shape.kv_heads is not None
    h = shape.hidden
    return float(shape.attention_params) or 2.0 * h * h * (1.0 + shape.kv_heads / shape.heads)


def _mlp_params(shape: ModelShape, width: int) -> float:
    """One MLP (a dense layer's, or one expert) of ``width``: 2 h f, gated 3 h f."""
    return 2.0 * shape.hidden * width * (1.5 if shape.gated_mlp else 1.0)


def layer_flops(shape: ModelShape, seq_len: int, layer: int, imbalance: float = 1.0) -> float:
    """Layer ``layer``'s forward FLOPs for one sequence, counted by its active parameters (docs/model.md section
    16): 2 s per projection parameter, 2 s^2 a (d_qk + d_v) for the scores, and in a MoE layer ``top_k`` routed
    experts (times ``imbalance``, the busiest GPU's load over the mean), the shared experts and the router's 2 s h E.
    """
    s, h = seq_len, shape.hidden
    qk, value = shape.qk_head_dim or h / shape.heads, shape.v_head_dim or h / shape.heads
    attention = 2.0 * s * _attention_params(shape) + 2.0 * s * s * shape.heads * (qk + value)
    if not shape.is_moe(layer):
        return attention + 2.0 * s * _mlp_params(shape, shape.ffn_hidden)
    experts = shape.top_k * imbalance + shape.shared_experts
    return attention + 2.0 * s * (experts * _mlp_params(shape, shape.expert_ffn_hidden) + h * shape.experts)


def logits_forward_flops(shape: ModelShape, seq_len: int) -> float:
    """The output layer's forward FLOPs for one sequence: 2 s h V."""
    return 2.0 * seq_len * shape.hidden * shape.vocab


def iteration_flops(workload: Workload, global_batch: int) -> float:
    """Model FLOPs of one training iteration: 3 x forward over every layer and the logits (no recompute)."""
    shape, s = workload.shape, workload.seq_len
    assert s is not None
    return 3.0 * global_batch * (shape.layers * layer_forward_flops(shape, s) + logits_forward_flops(shape, s))


def layer_params(shape: ModelShape) -> float:
    """Parameters of one layer: attention 2 h^2 (1 + g/a), MLP 2 h f', two norms 2 h (biases left out); of a model
    with experts, the mean layer's on one GPU of no expert parallelism (``held_params``)."""
    if not shape.plain:
        return sum(sum(held_params(shape, 1, layer)) for layer in range(shape.layers)) / shape.layers
    h = shape.hidden
    ffn = shape.ffn_hidden * (1.5 if shape.gated_mlp else 1.0)
    assert shape.kv_heads is not None
    return 2.0 * h * h * (1.0 + shape.kv_heads / shape.heads) + 2.0 * h * ffn + 2.0 * h


def held_params(shape: ModelShape, expert_parallel: int, layer: int) -> tuple[float, float]:
    """The parameters of layer ``layer`` a GPU holds (before tensor parallelism), as (replicated, expert): the
    attention, norms, router and shared experts, and ``experts / expert_parallel`` routed experts (section 16)."""
    replicated = _attention_params(shape) + 2.0 * shape.hidden
    if not shape.is_moe(layer):
        return replicated + _mlp_params(shape, shape.ffn_hidden), 0.0
    expert = _mlp_params(shape, shape.expert_ffn_hidden)
    return (replicated + shape.hidden * shape.experts + shape.shared_experts * expert,
            shape.experts / expert_parallel * expert)


def embedding_forward_seconds(workload: Workload) -> float:
    """The input embedding's forward for one micro-batch: a lookup with no FLOPs, bound by memory (its s b h rows read
    and written once, at the GPU's memory bandwidth; 0 when that is not known), and under tensor parallelism one
    all-reduce of its output (Megatron-LM's vocabulary-parallel embedding), half a layer's."""
    assert workload.seq_len is not None
    values = workload.seq_len * workload.rank_batch * workload.shape.hidden
    bandwidth = workload.device.memory_bandwidth
    lookup = 2.0 * values * workload.dtype_bytes / (bandwidth * 1e9) if bandwidth else 0.0
    return lookup + tp_forward_seconds(workload) / 2.0


#: Element-wise work's backward over its forward: each kernel reads its output's gradient and its saved input and
#: writes its input's gradient, three tensors where the forward moved two.
ELEMENTWISE_BACKWARD = 1.5


class Elementwise(NamedTuple):
    """Seconds of memory-bound element-wise work in one micro-batch's forward: a layer's, the part of it on the
    attention scores (what ``selective`` recomputes), and the loss's."""

    layer: float = 0.0
    scores: float = 0.0
    loss: float = 0.0


def elementwise_forward(workload: Workload) -> Elementwise:
    """Memory-bound element-wise work of one micro-batch's forward (``elementwise``; all 0 without it), its bytes at
    the GPU's memory bandwidth (docs/model.md section 11).

    A layer's kernels as Megatron-LM runs them, each reading its inputs and writing its outputs once: two layer
    norms (2 values each of s b h), the attention's softmax (2 of a s^2 b / t) and its dropout (2 and a one-byte
    mask), two bias-dropout-residual adds (3 values and a mask each) and the MLP's activation (2 of s b f / t, gated
    3); norms and residual adds on s b h / t with sequence parallelism; no attention scores with ``flash_attention``,
    no dropout kernel nor masks without ``dropout``. The loss casts the logits to 32 bits, reads them twice (maximum,
    then exponentials and sum) and writes the probabilities its backward takes: dtype_bytes + 16 bytes a logit.
    """
    if not workload.elementwise:
        return Elementwise()
    shape, s, b, t = workload.shape, workload.seq_len, workload.rank_batch, workload.tensor_parallel
    assert s is not None and workload.device.memory_bandwidth is not None
    hidden = s * b * shape.hidden / (t if workload.sequence_parallel else 1)
    scores = 0.0 if workload.flash_attention else shape.heads * s * s * b / t
    ffn = s * b * active_ffn(shape, workload.imbalance) / t
    dtype, bandwidth = workload.dtype_bytes, workload.device.memory_bandwidth * 1e9
    if workload.dropout:
        score_bytes, masks = 4.0 * scores * dtype + scores, 2.0 * hidden
    else:
        score_bytes, masks = 2.0 * scores * dtype, 0.0
    layer = (10.0 * hidden + (3.0 if shape.gated_mlp else 2.0) * ffn) * dtype + masks + score_bytes
    loss = (dtype + 16.0) * s * b * shape.vocab / t
    return Elementwise(layer / bandwidth, score_bytes / bandwidth, loss / bandwidth)


def active_ffn(shape: ModelShape, imbalance: float = 1.0) -> float:
    """The MLP values a token's activation runs on in a layer, the layers' mean: ``ffn_hidden`` in a dense layer, in
    a MoE layer its ``top_k`` routed experts (times ``imbalance``) and shared ones, ``expert_ffn_hidden`` each
    (docs/model.md section 16)."""
    if not shape.experts:
        return shape.ffn_hidden
    experts = shape.top_k * imbalance + shape.shared_experts
    return sum(experts * shape.expert_ffn_hidden if shape.is_moe(layer) else shape.ffn_hidden
               for layer in range(shape.layers)) / shape.layers


def stage_costs(workload: Workload) -> tuple[float, float, float]:
    """Forward seconds of one micro-batch: a layer with its tensor-parallel all-reduces, and what the first and the
    last stage add to their layers (the input embedding, the output layer), as ``derived_parameters`` counts them."""
    shape, t = workload.shape, workload.tensor_parallel
    assert workload.seq_len is not None
    speed = workload.device.tflops * 1e12 * workload.compute_efficiency
    work = elementwise_forward(workload)
    layer = layer_forward_flops(shape, workload.seq_len) * workload.rank_batch / t / speed + work.layer
    logits = logits_forward_flops(shape, workload.seq_len) * workload.rank_batch / t / speed + work.loss
    embedding = embedding_forward_seconds(workload)
    return (layer + tp_forward_seconds(workload), embedding if workload.embedding_on_first else 0.0,
            logits if workload.head_on_last else 0.0)
