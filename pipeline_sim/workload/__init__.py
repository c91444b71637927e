"""From a model, a GPU, a parallel layout and a network to the simulator's parameters, in seconds and bytes.

A workload is one more way to fill in an environment (docs/model.md section 11): it
derives ``n``, ``fwd_len``, ``bwd_len``, ``prop_len``, ``sync_base_len``, ``w_fraction``
and (unless given) ``sync_freq``, all times in seconds; the simulator does not change.
After a simulation, ``workload_report`` turns its completion time and activation peaks
into iteration seconds, tokens per second, achieved MFU and memory per GPU.

Sources: FLOPs as Megatron-LM's ``num_floating_point_operations`` (training =
3 x forward; logits 2 s h V); activation bytes per layer from Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (2022), table 2;
static memory 16 bytes per parameter (bf16 weights and gradients, fp32 master copy and
two Adam moments); gradient sync as a ring all-reduce, 2 (d - 1) / d of the bytes.
"""

from __future__ import annotations

from .collectives import sharded_collectives, tp_forward_seconds
from .definition import (
    OPTIONAL_WORKLOAD_KEYS,
    RECOMPUTE_MODES,
    UNKNOWABLE_KEYS,
    WORKLOAD_KEYS,
    Workload,
    default_bytes_per_param,
    imbalance_limit,
    workload_columns,
)
from .environment import (
    DERIVED_KEYS,
    auto_candidates,
    backward_weights,
    derived_parameters,
    with_layers,
    workload_environment,
)
from .flops import (
    ELEMENTWISE_BACKWARD,
    Elementwise,
    elementwise_forward,
    embedding_forward_seconds,
    iteration_flops,
    layer_forward_flops,
    layer_params,
    logits_forward_flops,
    stage_costs,
)
from .memory import (
    activation_bytes_per_layer,
    activation_factors,
    gpu_memory_gb,
    gpu_params,
    recompute_shares,
    stage_params,
    static_bytes,
    static_memory,
)
from .partition import auto_splits, bottleneck_split, split_neighbours, stage_layers
from .report import AUTO_COLUMNS, REPORT_COLUMNS, WorkloadReport, seconds_text, workload_report
from .shapes import GPU_PRESETS, MODEL_PRESETS, GpuSpec, ModelShape, faithful_defaults, gpu_from_cell, model_from_cell

__all__ = [
    "AUTO_COLUMNS", "DERIVED_KEYS", "ELEMENTWISE_BACKWARD", "Elementwise", "GPU_PRESETS", "GpuSpec",
    "MODEL_PRESETS", "ModelShape", "OPTIONAL_WORKLOAD_KEYS", "RECOMPUTE_MODES", "REPORT_COLUMNS", "UNKNOWABLE_KEYS",
    "WORKLOAD_KEYS", "Workload", "WorkloadReport", "activation_bytes_per_layer", "activation_factors",
    "default_bytes_per_param", "imbalance_limit",
    "auto_candidates", "auto_splits", "backward_weights", "bottleneck_split", "derived_parameters",
    "elementwise_forward", "embedding_forward_seconds", "faithful_defaults", "gpu_from_cell", "gpu_memory_gb",
    "gpu_params", "iteration_flops", "layer_forward_flops", "layer_params", "logits_forward_flops",
    "model_from_cell", "recompute_shares", "seconds_text", "sharded_collectives", "split_neighbours", "stage_costs",
    "stage_layers", "stage_params", "static_bytes", "static_memory", "tp_forward_seconds", "with_layers",
    "workload_columns", "workload_environment", "workload_report"
]
