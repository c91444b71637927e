"""The collectives of a workload in seconds: tensor parallelism's all-reduces, data parallelism's all-reduce or,
sharded, its reduce-scatters and gathers (docs/model.md sections 11 and 15)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .definition import Workload


def tp_forward_seconds(workload: Workload) -> float:
    """Tensor-parallel communication of one layer's forward for one micro-batch: two all-reduces (attention and
    MLP outputs; with sequence parallelism a reduce-scatter and an all-gather each, the same bytes) of s b h values,
    a ring moving 2 (t - 1) / t of them (Narayanan et al. 2021, section 3.2: 8 b s h (t - 1) / t per layer, forward
    and backward). The backward sends as much again."""
    t = workload.tensor_parallel
    if t == 1:
        return 0.0
    assert workload.seq_len is not None and workload.tp_bandwidth is not None
    values = workload.seq_len * workload.rank_batch * workload.shape.hidden
    return 4.0 * values * (t - 1) / t * workload.dtype_bytes / (workload.tp_bandwidth * 1e9)


def sharded_collectives(workload: Workload, zero: int = 0) -> tuple[float, float]:
    """Seconds per parameter of a GPU's gradient sync and of one all-gather of its parameters (docs/model.md section
    15), each a ring over the data-parallel port. Without zero the sync is an all-reduce, ``2 (d - 1) / d`` of the
    bytes, and nothing is gathered. With zero over groups of D (``sharding``): a reduce-scatter within the group,
    ``(D - 1) / D``, and, when the d GPUs hold r = d / D replicas (HSDP), the shard's all-reduce across them,
    ``2 (r - 1) / r / D``; a gather moves ``(D - 1) / D``. The c ranks of context parallelism hold the same
    parameters, so their gradients are reduced with the data-parallel ones (d and D are multiplied by c), as
    Megatron-LM's gradient and optimizer groups do. A gradient moves ``gradient_bytes``, a gathered weight
    ``dtype_bytes``."""
    d, bandwidth = workload.data_parallel * workload.context_parallel, workload.dp_bandwidth * 1e9
    if not zero:
        return 2.0 * (d - 1) / d * workload.gradient_bytes / bandwidth, 0.0
    group = workload.shards
    replicas = d // group
    return ((group - 1) / group + 2.0 * (replicas - 1) / replicas / group) * (workload.gradient_bytes / bandwidth), \
        (group - 1) / group * (workload.dtype_bytes / bandwidth)
