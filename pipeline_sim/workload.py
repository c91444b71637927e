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

import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Collection, Mapping, NamedTuple, Sequence, TypeVar

import numpy as np

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from .model import PARAMETER, EnvParams, ParameterError
from .parameters import Integers, Interval
from .schedules import get_schedule

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """A transformer's shape; ``kv_heads`` None means as many as ``heads``; ``seq_len`` its training length."""

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    kv_heads: int | None = None
    gated_mlp: bool = False
    seq_len: int = 2048
    dropout: bool = True  # trained with dropout (GPT-3, Megatron-LM's models) or without it (the Llama models)
    name: str = ""

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len"):
            Integers(1).check(f"model.{key}", getattr(self, key))
        kv_heads = self.heads if self.kv_heads is None else self.kv_heads
        object.__setattr__(self, "kv_heads", kv_heads)
        Integers(1).check("model.kv_heads", kv_heads)
        if self.heads % kv_heads:
            raise ParameterError("model.kv_heads", self.kv_heads, f"must divide heads = {self.heads}")
        if not isinstance(self.dropout, bool):
            raise ParameterError("model.dropout", self.dropout, "must be true or false")
        if not isinstance(self.gated_mlp, bool):
            raise ParameterError("model.gated_mlp", self.gated_mlp, "must be true or false")
        if not self.name:
            object.__setattr__(self, "name", self.describe())

    def describe(self) -> str:
        """Every field, for a custom model: ``layers=2 hidden=64 heads=4 kv_heads=4 ffn_hidden=256 vocab=1000``."""
        text = " ".join(f"{key}={getattr(self, key)}" for key in ("layers", "hidden", "heads", "kv_heads",
                                                                  "ffn_hidden", "vocab", "seq_len"))
        return text + (" gated" if self.gated_mlp else "") + ("" if self.dropout else " no-dropout")


MODEL_PRESETS: dict[str, ModelShape] = {shape.name: shape for shape in (
    ModelShape(name="gpt3-175b", layers=96, hidden=12288, heads=96, ffn_hidden=49152, vocab=51200, seq_len=2048),
    ModelShape(name="llama2-7b", layers=32, hidden=4096, heads=32, ffn_hidden=11008, vocab=32000, gated_mlp=True,
               seq_len=4096, dropout=False),
    ModelShape(name="llama2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=32000,
               gated_mlp=True, seq_len=4096, dropout=False),
    ModelShape(name="llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
               gated_mlp=True, seq_len=8192, dropout=False),
    ModelShape(name="llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256,
               gated_mlp=True, seq_len=8192, dropout=False),
    ModelShape(name="llama3-405b", layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256,
               gated_mlp=True, seq_len=8192, dropout=False),
)}


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """Peak dense BF16 throughput (TFLOP/s), memory (GB, 10^9 bytes), memory bandwidth and NVLink bandwidth (GB/s,
    NVLink as NVIDIA states it: both directions of all links together; None: not known)."""

    tflops: float
    memory_gb: float
    memory_bandwidth: float | None = None
    nvlink_bandwidth: float | None = None
    name: str = ""

    def __post_init__(self) -> None:
        Interval(0.0, low_open=True).check("gpu.tflops", self.tflops)
        Interval(0.0, low_open=True).check("gpu.memory_gb", self.memory_gb)
        for key in ("memory_bandwidth", "nvlink_bandwidth"):
            if getattr(self, key) is not None:
                Interval(0.0, low_open=True).check(f"gpu.{key}", getattr(self, key))
        if not self.name:
            extra = "".join(f" {key}={getattr(self, key):g}" for key in ("memory_bandwidth", "nvlink_bandwidth")
                            if getattr(self, key) is not None)
            object.__setattr__(self, "name", f"tflops={self.tflops:g} memory_gb={self.memory_gb:g}{extra}")


#: NVIDIA's figures: dense BF16 (the datasheets' sparse figure halved), HBM capacity and bandwidth, NVLink of the
#: SXM parts (A100: 12 NVLink 3 links, H100 and H200: 18 NVLink 4 links). docs/model.md section 11 names the sources.
GPU_PRESETS: dict[str, GpuSpec] = {gpu.name: gpu for gpu in (
    GpuSpec(name="a100-40gb", tflops=312.0, memory_gb=40.0, memory_bandwidth=1555.0, nvlink_bandwidth=600.0),
    GpuSpec(name="a100-80gb", tflops=312.0, memory_gb=80.0, memory_bandwidth=2039.0, nvlink_bandwidth=600.0),
    GpuSpec(name="h100-80gb", tflops=989.0, memory_gb=80.0, memory_bandwidth=3350.0, nvlink_bandwidth=900.0),
    GpuSpec(name="h200-141gb", tflops=989.0, memory_gb=141.0, memory_bandwidth=4800.0, nvlink_bandwidth=900.0),
)}


_Preset = TypeVar("_Preset", bound="DataclassInstance")


def _preset(key: str, value: object, presets: Mapping[str, _Preset], kind: type[_Preset]) -> _Preset:
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        found = presets.get(value.lower())
        if found is None:
            raise ParameterError(key, value, f"unknown preset; valid: {', '.join(presets)}, or an object of fields")
        return found
    if isinstance(value, Mapping):
        allowed = [f.name for f in fields(kind) if f.name != "name"]
        unknown = [name for name in value if name not in allowed]
        if unknown:
            raise ParameterError(key, unknown[0], f"unknown field; allowed: {', '.join(allowed)}")
        try:
            return kind(**value)
        except TypeError:
            missing = [name for name in allowed if name not in value and name in _REQUIRED[kind]]
            raise ParameterError(key, dict(value), f"lacks {', '.join(missing)}") from None
    raise ParameterError(key, value, f"must be a preset name ({', '.join(presets)}) or an object of fields")


def faithful_defaults(keys: Mapping[str, Any]) -> dict[str, Any]:
    """Workload keys with what a user who names a model and a GPU means by default (docs/model.md section 11): the
    element-wise work and the optimizer step on when the GPU states its memory bandwidth, and dropout as the
    model was trained. Keys given stay as given. The library's own defaults stay those of every earlier result."""
    model = _preset("model", keys["model"], MODEL_PRESETS, ModelShape)
    gpu = _preset("gpu", keys.get("gpu", "a100-80gb"), GPU_PRESETS, GpuSpec)
    known = gpu.memory_bandwidth is not None
    return {"elementwise": known, "optimizer_step": known, "dropout": model.dropout} | dict(keys)


_REQUIRED = {ModelShape: ("layers", "hidden", "heads", "ffn_hidden", "vocab"), GpuSpec: ("tflops", "memory_gb")}


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A model on a cluster (docs/model.md section 11). Invalid values raise ``ParameterError``.

    ``model`` and ``gpu`` take a preset name or an object of fields. ``seq_len`` None:
    the model's training length; ``global_batch_size`` None: micro-batch size x data
    parallel x the environment's ``n``; ``sequence_parallel`` None: on when
    ``tensor_parallel`` > 1. Bandwidths are GB/s per GPU.
    """

    model: ModelShape | str | Mapping
    gpu: GpuSpec | str | Mapping = "a100-80gb"
    seq_len: int | None = None
    compute_efficiency: float = 0.5
    tensor_parallel: int = 1
    data_parallel: int = 1
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    sequence_parallel: bool | None = None
    recompute: str = "none"
    dtype_bytes: int = 2
    bytes_per_param: float = 16.0
    p2p_bandwidth: float = 50.0
    dp_bandwidth: float = 50.0
    layers_per_stage: str | tuple[int, ...] = "balanced"
    embedding_on_first: bool = True
    head_on_last: bool = True
    tp_bandwidth: float | None = None
    recompute_per_stage: tuple[float, ...] | None = None
    optimizer_step: bool = False
    elementwise: bool = False
    flash_attention: bool = False
    dropout: bool = True
    shard_group: int | None = None
    context_parallel: int = 1

    def __post_init__(self) -> None:
        model = _preset("model", self.model, MODEL_PRESETS, ModelShape)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "gpu", _preset("gpu", self.gpu, GPU_PRESETS, GpuSpec))
        if self.seq_len is None:
            object.__setattr__(self, "seq_len", model.seq_len)
        Integers(1).check("seq_len", self.seq_len)
        Interval(0.0, 1.0, low_open=True, high_closed=True).check("compute_efficiency", self.compute_efficiency)
        for key in ("tensor_parallel", "data_parallel", "micro_batch_size", "dtype_bytes", "context_parallel"):
            Integers(1).check(key, getattr(self, key))
        if self.shard_group is not None:
            Integers(1).check("shard_group", self.shard_group)
        if self.data_parallel % self.sharding:
            raise ParameterError("shard_group", self.shard_group, f"must divide data_parallel = {self.data_parallel}")
        c, tokens = self.context_parallel, self.seq_len or model.seq_len
        if c > 1 and tokens % (2 * c):
            raise ParameterError("context_parallel", c, f"must cut seq_len = {self.seq_len} into 2 x {c} equal "
                                                        f"chunks (each rank takes two, for causal balance)")
        t = self.tensor_parallel
        if model.heads % t or (model.kv_heads or model.heads) % t:
            raise ParameterError("tensor_parallel", t, f"must divide heads = {model.heads} and kv_heads = "
                                                       f"{model.kv_heads} of {model.name}")
        if self.global_batch_size is not None:
            Integers(1).check("global_batch_size", self.global_batch_size)
            per_step = self.micro_batch_size * self.data_parallel
            if self.global_batch_size % per_step:
                raise ParameterError("global_batch_size", self.global_batch_size,
                                     f"must be a multiple of micro_batch_size x data_parallel = {per_step}")
        if self.sequence_parallel is None:
            object.__setattr__(self, "sequence_parallel", t > 1)
        if not isinstance(self.sequence_parallel, bool):
            raise ParameterError("sequence_parallel", self.sequence_parallel, "must be true or false")
        if self.recompute not in RECOMPUTE_MODES:
            raise ParameterError("recompute", self.recompute, f"must be one of {', '.join(RECOMPUTE_MODES)}")
        Interval(0.0).check("bytes_per_param", self.bytes_per_param)
        Interval(0.0, low_open=True).check("p2p_bandwidth", self.p2p_bandwidth)
        Interval(0.0, low_open=True).check("dp_bandwidth", self.dp_bandwidth)
        for key in ("embedding_on_first", "head_on_last", "optimizer_step", "elementwise", "flash_attention",
                    "dropout"):
            if not isinstance(getattr(self, key), bool):
                raise ParameterError(key, getattr(self, key), "must be true or false")
        layers = self.layers_per_stage
        if isinstance(layers, str):
            if layers not in ("balanced", "auto"):
                raise ParameterError("layers_per_stage", layers, "must be balanced, auto or a list of layer counts, "
                                                                 "one per stage")
        else:
            if not isinstance(layers, (list, tuple)) or not layers or \
                    any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in layers):
                raise ParameterError("layers_per_stage", layers, "must be balanced, auto or a list of layer counts "
                                                                 ">= 1, one per stage")
            if sum(layers) != model.layers:
                raise ParameterError("layers_per_stage", layers, f"must add up to the {model.layers} layers of "
                                                                 f"{model.name}, not {sum(layers)}")
            object.__setattr__(self, "layers_per_stage", tuple(layers))
        shares = self.recompute_per_stage
        if shares is not None:
            if not isinstance(shares, (list, tuple)) or not shares or \
                    any(isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0
                        for x in shares):
                raise ParameterError("recompute_per_stage", shares, "must be a list of shares from 0 to 1, one per "
                                                                    "stage")
            if self.recompute == "full":
                raise ParameterError("recompute_per_stage", shares, "needs recompute none or selective (full "
                                                                    "already recomputes every layer)")
            object.__setattr__(self, "recompute_per_stage", tuple(float(x) for x in shares))
        if self.tp_bandwidth is None and self.device.nvlink_bandwidth is not None:
            # a ring all-reduce sends each byte one way round the ring: one direction of NVLink, half its figure
            object.__setattr__(self, "tp_bandwidth", self.device.nvlink_bandwidth / 2)
        if self.tp_bandwidth is None and t > 1:
            raise ParameterError("tp_bandwidth", None, f"is needed with tensor_parallel = {t}: the gpu has no "
                                                       f"nvlink_bandwidth")
        if self.tp_bandwidth is not None:
            Interval(0.0, low_open=True).check("tp_bandwidth", self.tp_bandwidth)
        if self.optimizer_step and self.bytes_per_param == 0:
            raise ParameterError("optimizer_step", True, "needs bytes_per_param > 0: the step reads and writes "
                                                         "each parameter's bytes")
        if self.optimizer_step and self.device.memory_bandwidth is None:
            raise ParameterError("optimizer_step", True, f"needs the gpu's memory_bandwidth (GB/s), which "
                                                         f"{self.device.name} does not state")
        if self.elementwise and self.device.memory_bandwidth is None:
            raise ParameterError("elementwise", True, f"needs the gpu's memory_bandwidth (GB/s), which "
                                                      f"{self.device.name} does not state")

    @property
    def shape(self) -> ModelShape:
        assert isinstance(self.model, ModelShape)
        return self.model

    @property
    def device(self) -> GpuSpec:
        assert isinstance(self.gpu, GpuSpec)
        return self.gpu

    @property
    def rank_batch(self) -> float:
        """Sequences of one micro-batch that one GPU works on: ``micro_batch_size``, over the context-parallel degree
        (every per-micro-batch FLOP and byte is linear in it; docs/model.md section 15)."""
        c = self.context_parallel
        return self.micro_batch_size if c == 1 else self.micro_batch_size / c

    @property
    def sharding(self) -> int:
        """The GPUs that the environment's ``zero`` shards over: ``shard_group``, or all of data parallelism
        (docs/model.md section 15)."""
        return self.data_parallel if self.shard_group is None else self.shard_group

    @property
    def shards(self) -> int:
        """How many GPUs share one copy of each sharded byte: ``sharding`` times the context-parallel degree."""
        return self.sharding * self.context_parallel

    @property
    def model_parallel(self) -> int:
        """GPUs of one pipeline stage's replica: tensor x context."""
        return self.tensor_parallel * self.context_parallel

    def micro_batches(self, n: int | None = None) -> int:
        """Micro-batches per iteration: global batch / (micro-batch size x data parallel), else ``n``."""
        if self.global_batch_size is None:
            if n is None:
                raise ParameterError("global_batch_size", None, "is needed when n is not given")
            return n
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel)

    def cells(self) -> dict[str, object]:
        """The workload's columns of a CSV row (a preset by name, a custom model or GPU by its fields, a list of
        layer counts separated by spaces)."""
        def cell(value: object) -> object:
            if isinstance(value, (ModelShape, GpuSpec)):
                return value.name
            return " ".join(map(str, value)) if isinstance(value, tuple) else value
        return {f.name: cell(getattr(self, f.name)) for f in fields(self)}

    def label(self, num_gpus: int, n: int | None = None, zero: int = 0) -> str:
        """``gpt3-175b on 64 x a100-80gb (tensor 8, pipeline 8, data 1), batch 64 x 2048 tokens``; without a global
        batch, that of ``n`` micro-batches."""
        total = num_gpus * self.model_parallel * self.data_parallel
        batch = self.global_batch_size if self.global_batch_size is not None else \
            "?" if n is None else n * self.micro_batch_size * self.data_parallel
        context = f", context {self.context_parallel}" if self.context_parallel > 1 else ""
        sharding = "" if not zero else f", zero {zero}" + \
            (f" in groups of {self.sharding}" if self.sharding != self.data_parallel else "")
        return (f"{self.shape.name} on {total} x {self.device.name} (tensor {self.tensor_parallel}{context}, "
                f"pipeline {num_gpus}, data {self.data_parallel}{sharding}), batch {batch} x {self.seq_len} tokens")


WORKLOAD_KEYS = tuple(f.name for f in fields(Workload))
#: Workload keys a sweep's CSV carries only when its grid gives them (so that older grids write what they always did).
OPTIONAL_WORKLOAD_KEYS = ("recompute_per_stage", "optimizer_step", "elementwise", "flash_attention", "dropout",
                          "shard_group", "context_parallel")


def workload_columns(given: Collection[str] = ()) -> tuple[str, ...]:
    """The workload keys of a sweep's rows: all but the optional ones its grid does not give (``given``)."""
    return tuple(key for key in WORKLOAD_KEYS if key not in OPTIONAL_WORKLOAD_KEYS or key in given)
#: Workload keys that stay empty when nothing gives them and nothing needs them (a custom GPU without NVLink, no
#: tensor parallelism; a batch a grid gives as n).
UNKNOWABLE_KEYS = ("tp_bandwidth", "global_batch_size")


def model_from_cell(text: str) -> ModelShape:
    """A model from its CSV cell: a preset's name or a custom model's ``describe()`` text."""
    if text in MODEL_PRESETS:
        return MODEL_PRESETS[text]
    words = text.split()
    values = dict(word.split("=", 1) for word in words if "=" in word)
    shape: dict[str, Any] = {key: int(value) for key, value in values.items()}
    return ModelShape(**shape, gated_mlp="gated" in words, dropout="no-dropout" not in words)


def gpu_from_cell(text: str) -> GpuSpec:
    """A GPU from its CSV cell: a preset's name or a custom GPU's ``tflops=... memory_gb=...`` text."""
    if text in GPU_PRESETS:
        return GPU_PRESETS[text]
    values = dict(word.split("=", 1) for word in text.split())
    def known(key: str) -> float | None:
        return float(values[key]) if key in values else None
    return GpuSpec(tflops=float(values["tflops"]), memory_gb=float(values["memory_gb"]),
                   memory_bandwidth=known("memory_bandwidth"), nvlink_bandwidth=known("nvlink_bandwidth"))


def seconds_text(seconds: float) -> str:
    """``73.6 ms``, ``15.7 s``, ``126 us``: a duration in the unit that reads best."""
    if seconds >= 1.0 or seconds == 0.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


# -- formulas (docs/model.md section 11) ------------------------------------------------

def layer_forward_flops(shape: ModelShape, seq_len: int) -> float:
    """One transformer layer's forward FLOPs for one sequence: 4 s h^2 (1 + g/a + s/h) + 4 s h f'."""
    s, h = seq_len, shape.hidden
    ffn = shape.ffn_hidden * (1.5 if shape.gated_mlp else 1.0)
    assert shape.kv_heads is not None
    return 4.0 * s * h * h * (1.0 + shape.kv_heads / shape.heads + s / h) + 4.0 * s * h * ffn


def logits_forward_flops(shape: ModelShape, seq_len: int) -> float:
    """The output layer's forward FLOPs for one sequence: 2 s h V."""
    return 2.0 * seq_len * shape.hidden * shape.vocab


def iteration_flops(workload: Workload, global_batch: int) -> float:
    """Model FLOPs of one training iteration: 3 x forward over every layer and the logits (no recompute)."""
    shape, s = workload.shape, workload.seq_len
    assert s is not None
    return 3.0 * global_batch * (shape.layers * layer_forward_flops(shape, s) + logits_forward_flops(shape, s))


def layer_params(shape: ModelShape) -> float:
    """Parameters of one layer: attention 2 h^2 (1 + g/a), MLP 2 h f', two norms 2 h (biases left out)."""
    h = shape.hidden
    ffn = shape.ffn_hidden * (1.5 if shape.gated_mlp else 1.0)
    assert shape.kv_heads is not None
    return 2.0 * h * h * (1.0 + shape.kv_heads / shape.heads) + 2.0 * h * ffn + 2.0 * h


def activation_bytes_per_layer(workload: Workload) -> float:
    """Bytes one layer keeps for one micro-batch until its backward (Korthikanti et al. 2022, table 2).

    The paper counts 16-bit activations; another ``dtype_bytes`` scales the count.
    """
    shape, s, b, t = workload.shape, workload.seq_len, workload.rank_batch, workload.tensor_parallel
    assert s is not None
    sbh, h, a = s * b * shape.hidden, shape.hidden, shape.heads
    # without dropout no masks: 34 -> 32 (10 -> 8 of them on every tensor rank), 5 a s / h -> 2 a s / h
    kept, replicated, scores = (34.0, 10.0, 5.0) if workload.dropout else (32.0, 8.0, 2.0)
    if workload.recompute == "full":
        per_token = 2.0
    elif workload.recompute == "selective" or workload.flash_attention:  # the attention scores not kept
        per_token = kept / t if workload.sequence_parallel else replicated + 24.0 / t
    elif workload.sequence_parallel:
        per_token = (kept + scores * a * s / h) / t
    else:
        per_token = replicated + 24.0 / t + scores * a * s / (h * t)
    return sbh * per_token * workload.dtype_bytes / 2.0


def stage_layers(workload: Workload, stages: int) -> tuple[int, ...]:
    """Transformer layers of each stage: ``layers_per_stage``; ``balanced``: as even as whole layers allow, the
    extra layers on the stages after the first (which holds the embedding), in order; ``auto``: the split of
    least bottleneck stage (``bottleneck_split``; docs/model.md section 11.1)."""
    layers = workload.layers_per_stage
    total = workload.shape.layers
    if isinstance(layers, tuple):
        if len(layers) != stages:
            raise ParameterError("layers_per_stage", list(layers), f"must give one count per stage: {stages} here")
        return layers
    if total < stages:
        raise ParameterError("layers_per_stage", layers, f"cannot give each of {stages} stages a layer of the "
                                                         f"{total} of {workload.shape.name}")
    if layers == "auto":
        layer, first, last = stage_costs(workload)
        return _uniform_split(layer, total, first, last, stages)
    base, extra = divmod(total, stages)
    return tuple(base + (1 if 1 <= s <= extra else 0) for s in range(stages))


@lru_cache(maxsize=1024)
def _uniform_split(layer: float, count: int, first: float, last: float, stages: int) -> tuple[int, ...]:
    """``bottleneck_split`` of ``count`` layers of cost ``layer`` (the planner asks for many alike)."""
    return bottleneck_split([layer] * count, first, last, stages)


def bottleneck_split(costs: Sequence[float], first: float, last: float, stages: int) -> tuple[int, ...]:
    """The contiguous split of layers of ``costs`` into ``stages`` stages of at least one layer each that minimises
    the largest stage cost, ``first`` added to the first stage and ``last`` to the last: dynamic programming over
    split points (PipeDream, Narayanan et al. 2019, section 3.1), exact.

    ``best[j]`` after stage k is the least bottleneck of stages 0..k holding layers 0..j-1; each stage is one
    vectorised minimum over where it starts, so the cost is O(stages x layers^2) arithmetic in numpy.
    """
    count = len(costs)
    if not 1 <= stages <= count:
        raise ParameterError("stages", stages, f"must be from 1 to the {count} layers")
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(costs, dtype=float))))
    span = prefix[None, :] - prefix[:, None]  # span[i, j]: layers i..j-1
    best = np.full(count + 1, np.inf)
    best[1:] = prefix[1:] + first  # stage 0 holds layers 0..j-1
    starts = np.zeros((stages, count + 1), dtype=int)
    empty = np.tril_indices(count + 1)  # j <= i: no layer
    for k in range(1, stages):
        extra = last if k == stages - 1 else 0.0
        # stage k holds layers i..j-1 (i >= k: a layer for each stage before it, j > i)
        candidates = np.maximum(best[:, None], span + extra)
        candidates[empty] = np.inf
        candidates[:k, :] = np.inf
        starts[k] = np.argmin(candidates, axis=0)
        best = candidates[starts[k], np.arange(count + 1)]
    if stages == 1:
        return (count,)
    split, end = [], count
    for k in range(stages - 1, 0, -1):
        start = int(starts[k, end])
        split.append(end - start)
        end = start
    return (end, *reversed(split))


def split_neighbours(split: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The splits one layer away from ``split``: one layer moved across one boundary, either way, no stage empty."""
    found = []
    for k in range(len(split) - 1):
        for step in (1, -1):
            moved = list(split)
            moved[k] -= step
            moved[k + 1] += step
            if min(moved[k], moved[k + 1]) >= 1:
                found.append(tuple(moved))
    return found


def auto_splits(workload: Workload, stages: int) -> list[tuple[int, ...]]:
    """What ``auto`` simulates: the balanced split first (so auto is never slower than it), the bottleneck optimum
    and its neighbours, each once."""
    balanced = stage_layers(replace(workload, layers_per_stage="balanced"), stages)
    optimum = stage_layers(replace(workload, layers_per_stage="auto"), stages)
    return list(dict.fromkeys([balanced, optimum, *split_neighbours(optimum)]))


def gpu_params(workload: Workload, num_gpus: int, schedule: str = "1f1b", chunks: int = 2) -> list[float]:
    """Parameters held by each GPU (per tensor-parallel rank): the layers of its stages, and the embeddings of the
    first and last stage wherever the schedule places them."""
    shape, t = workload.shape, workload.tensor_parallel
    spec = get_schedule(schedule)
    v = spec.v(chunks)
    stages = num_gpus * v
    layers = stage_layers(workload, stages)
    if workload.layers_per_stage == "balanced" and shape.layers % stages == 0:
        held = [shape.layers / num_gpus * layer_params(shape) / t] * num_gpus  # the even split, as it always was
    else:
        held = [0.0] * num_gpus
        for stage, count in enumerate(layers):
            held[spec.placement(stage, num_gpus, v)] += count * layer_params(shape) / t
    embedding = shape.vocab * shape.hidden / t
    for stage in (0, stages - 1):
        held[spec.placement(stage, num_gpus, v)] += embedding
    return held


def embedding_forward_seconds(workload: Workload) -> float:
    """The input embedding's forward for one micro-batch: a lookup with no FLOPs, bound by memory (its s b h rows read
    and written once, at the GPU's memory bandwidth; 0 when that is not known), and under tensor parallelism one
    all-reduce of its output (Megatron-LM's vocabulary-parallel embedding), half a layer's."""
    assert workload.seq_len is not None
    values = workload.seq_len * workload.rank_batch * workload.shape.hidden
    bandwidth = workload.device.memory_bandwidth
    lookup = 2.0 * values * workload.dtype_bytes / (bandwidth * 1e9) if bandwidth else 0.0
    return lookup + tp_forward_seconds(workload) / 2.0


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
    ffn = s * b * shape.ffn_hidden / t
    dtype, bandwidth = workload.dtype_bytes, workload.device.memory_bandwidth * 1e9
    if workload.dropout:
        score_bytes, masks = 4.0 * scores * dtype + scores, 2.0 * hidden
    else:
        score_bytes, masks = 2.0 * scores * dtype, 0.0
    layer = (10.0 * hidden + (3.0 if shape.gated_mlp else 2.0) * ffn) * dtype + masks + score_bytes
    loss = (dtype + 16.0) * s * b * shape.vocab / t
    return Elementwise(layer / bandwidth, score_bytes / bandwidth, loss / bandwidth)


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
    layers = stage_layers(workload, stages)
    layer = layer_forward_flops(shape, s) * b / t / speed
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
    stage_forward = [count * (layer + comm + elementwise) + extra + spread / stages
                     for count, extra in zip(layers, ends)]
    if len(set(stage_forward)) == 1 and embedding == 0.0:  # equal stages: a GPU's share as always computed
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
    if len(set(held)) == 1 or (d == 1 and not step):  # equal stages, or nothing per stage: the fullest GPU's
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
    kv_block = 2.0 * s * b * shape.kv_heads * (shape.hidden / shape.heads) * workload.dtype_bytes / t
    exchange = (c - 1) * kv_block * shape.layers / num_gpus / (workload.p2p_bandwidth * 1e9)
    return {"n": workload.micro_batches(n), "fwd_len": fwd, "bwd_len": bwd,
            "prop_len": message / (workload.p2p_bandwidth * 1e9), "sync_base_len": sync, "w_fraction": 0.5,
            "stage_weights": weights, "sync_weights": sync_weights,
            "bwd_weights": backward_weights(workload, stages), "optimizer_len": optimizer, "gather_len": gather,
            "cp_len": exchange}


def sharded_collectives(workload: Workload, zero: int = 0) -> tuple[float, float]:
    """Seconds per parameter of a GPU's gradient sync and of one all-gather of its parameters (docs/model.md section
    15), each a ring over the data-parallel port. Without zero the sync is an all-reduce, ``2 (d - 1) / d`` of the
    bytes, and nothing is gathered. With zero over groups of D (``sharding``): a reduce-scatter within the group,
    ``(D - 1) / D``, and, when the d GPUs hold r = d / D replicas (HSDP), the shard's all-reduce across them,
    ``2 (r - 1) / r / D``; a gather moves ``(D - 1) / D``. The c ranks of context parallelism hold the same
    parameters, so their gradients are reduced with the data-parallel ones (d and D are multiplied by c), as
    Megatron-LM's gradient and optimizer groups do."""
    d, per_byte = workload.data_parallel * workload.context_parallel, workload.dtype_bytes / (workload.dp_bandwidth
                                                                                             * 1e9)
    if not zero:
        return 2.0 * (d - 1) / d * workload.dtype_bytes / (workload.dp_bandwidth * 1e9), 0.0
    group = workload.shards
    replicas = d // group
    return ((group - 1) / group + 2.0 * (replicas - 1) / replicas / group) * per_byte, (group - 1) / group * per_byte


def stage_params(workload: Workload, stages: int) -> list[float]:
    """Parameters of each stage (per tensor-parallel rank): its layers, the input embedding on the first stage and the
    output layer on the last (both where gradients are synced, whatever ``embedding_on_first`` says of the work)."""
    shape, t = workload.shape, workload.tensor_parallel
    held = [count * layer_params(shape) / t for count in stage_layers(workload, stages)]
    for stage in (0, stages - 1):
        held[stage] += shape.vocab * shape.hidden / t
    return held


def recompute_shares(workload: Workload, stages: int) -> tuple[float, ...]:
    """The share of each stage's layers fully recomputed on top of ``recompute``: ``recompute_per_stage``, or all 0."""
    shares = workload.recompute_per_stage
    if shares is None:
        return (0.0,) * stages
    if len(shares) != stages:
        raise ParameterError("recompute_per_stage", list(shares), f"must give one share per stage: {stages} here")
    return shares


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


def activation_factors(workload: Workload, stages: int) -> tuple[float, ...]:
    """Each stage's activations per layer over those of ``recompute``: ``c x full / base + 1 - c`` with c of its
    layers fully recomputed (``recompute_per_stage``; all 1 without it)."""
    shares = recompute_shares(workload, stages)
    if not any(shares):
        return (1.0,) * stages
    full = activation_bytes_per_layer(replace(workload, recompute="full", recompute_per_stage=None))
    base = activation_bytes_per_layer(workload)
    return tuple(c * full / base + 1.0 - c for c in shares)


#: The environment parameters a workload sets; ``sync_freq`` defaults to ``n`` unless given.
DERIVED_KEYS = ("n", "fwd_len", "bwd_len", "prop_len", "sync_base_len", "w_fraction", "stage_weights",
                "sync_weights", "bwd_weights", "optimizer_len", "gather_len", "cp_len", "sync_freq")


def workload_environment(workload: Workload, **env: Any) -> EnvParams:
    """The environment of ``workload`` with the other parameters ``env`` (``num_gpus``, ``schedule``, noise...).

    ``sync_freq`` defaults to ``n`` (one gradient sync per iteration); ``n`` may be given
    only when the workload has no ``global_batch_size``.
    """
    for key in DERIVED_KEYS:
        if key in env and key not in ("n", "sync_freq"):
            raise ParameterError(key, env[key], "is derived from the workload; leave it out")
    if "n" in env and workload.global_batch_size is not None:
        raise ParameterError("n", env["n"], "is derived from global_batch_size; give one of them")
    # checks num_gpus, schedule...; with the workload's own n, which a schedule's requirement on n judges
    base = EnvParams(**{key: value for key, value in env.items() if key != "n"},
                     n=workload.micro_batches(env.get("n", EnvParams().n)))
    if base.zero and workload.bytes_per_param < 2 * workload.dtype_bytes:
        raise ParameterError("bytes_per_param", workload.bytes_per_param, f"must hold a weight and a gradient (2 x "
                             f"dtype_bytes = {2 * workload.dtype_bytes}) for zero {base.zero} to shard the rest")
    derived = derived_parameters(workload, num_gpus=base.num_gpus, schedule=base.schedule, chunks=base.chunks,
                                 n=env.get("n", EnvParams().n), zero=base.zero)
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
            ("cp_len", "p2p_bandwidth", workload.p2p_bandwidth, "for each attention exchange (context_parallel)")):
        try:  # a derived length out of its domain is said in terms of what the user gave
            PARAMETER[key].domain.check(key, derived[key])
        except ParameterError:
            raise ParameterError(given, value, f"gives {key} = {derived[key]:.3g} s {what}, outside "
                                               f"{PARAMETER[key].allowed} s") from None
    return replace(base, **derived, sync_freq=sync_freq)


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


@dataclass(frozen=True, slots=True)
class WorkloadReport:
    """What an iteration of a workload means in seconds, tokens and bytes."""

    fwd_seconds: float
    bwd_seconds: float
    prop_seconds: float
    sync_seconds: float
    iteration_seconds: float
    tokens_per_second: float
    mfu: float
    memory_gb: tuple[float, ...]  # per GPU: static + peak activations
    gpu_memory_gb: float
    optimizer_seconds: float = 0.0  # the fullest GPU's step

    @property
    def peak_memory_gb(self) -> float:
        return max(self.memory_gb)

    @property
    def memory_fits(self) -> bool:
        return self.peak_memory_gb <= self.gpu_memory_gb

    def lines(self) -> list[str]:
        """The report as text, for the command line."""
        fits = "fits" if self.memory_fits else "DOES NOT FIT"
        return [f"derived times: fwd {seconds_text(self.fwd_seconds)}, bwd {seconds_text(self.bwd_seconds)}, "
                f"prop {seconds_text(self.prop_seconds)}, sync {seconds_text(self.sync_seconds)}"
                + (f", optimizer step {seconds_text(self.optimizer_seconds)} (fullest GPU)" if self.optimizer_seconds
                   else ""),
                f"iteration {seconds_text(self.iteration_seconds)}, {self.tokens_per_second:,.0f} tokens/s, "
                f"MFU {self.mfu:.1%}",
                f"peak memory per GPU: {' '.join(f'{gb:.1f}' for gb in self.memory_gb)} GB of "
                f"{self.gpu_memory_gb:g} GB: {fits}"]

    def columns(self) -> dict[str, float | bool]:
        return {"tokens_per_second": self.tokens_per_second, "mfu": self.mfu, "peak_memory_gb": self.peak_memory_gb,
                "gpu_memory_gb": self.gpu_memory_gb, "memory_fits": self.memory_fits}


#: The report's columns of a workload sweep's CSV (iteration seconds are ``completion_time``).
REPORT_COLUMNS = ("tokens_per_second", "mfu", "peak_memory_gb", "gpu_memory_gb", "memory_fits")
#: A sweep whose ``layers_per_stage`` takes ``auto`` adds the split auto chose and the share of the balanced split's
#: iteration time it saves (empty on rows of another ``layers_per_stage``).
AUTO_COLUMNS = ("auto_layers", "auto_gain")


def gpu_memory_gb(workload: Workload, params: EnvParams,
                  gpu_peak_activations: list[float] | tuple[float, ...]) -> tuple[float, ...]:
    """Per GPU, GB of parameters and optimizer state and of its peak activations (section 7's unit)."""
    per_microbatch = activation_bytes_per_layer(workload) * workload.shape.layers / params.num_gpus
    per_param, working = static_memory(workload, params.zero, params.sync_freq)
    static = [held * per_param + working for held in gpu_params(workload, params.num_gpus, params.schedule,
                                                                 params.chunks)]
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


def static_memory(workload: Workload, zero: int, sync_freq: int) -> tuple[float, float]:
    """Bytes a GPU keeps per parameter it holds, and the bytes of zero 3's gathered working set (docs/model.md
    section 15; Rajbhandari et al. 2020, "ZeRO", section 5).

    Of ``bytes_per_param``, a weight and a gradient take ``dtype_bytes`` each and the optimizer state the rest.
    Over S = ``shards`` GPUs, zero 1 divides the optimizer state by S, zero 2 the gradients too (when each
    micro-batch's are reduce-scattered, ``sync_freq`` 1; accumulated over several, a whole gradient is kept), and
    zero 3 everything. A zero-3 GPU also holds, unsharded, the weights of the layer it computes and of the one it
    prefetches and the gradients of one layer before they are reduce-scattered: three of its largest units (a layer,
    or the embedding) at ``dtype_bytes``.
    """
    total = workload.bytes_per_param
    if not zero:
        return total, 0.0
    shards, value = workload.shards, float(workload.dtype_bytes)
    if zero == 1 or (zero == 2 and sync_freq > 1):
        return 2 * value + (total - 2 * value) / shards, 0.0
    if zero == 2:
        return value + (total - value) / shards, 0.0
    shape = workload.shape
    unit = max(layer_params(shape), shape.vocab * shape.hidden) / workload.tensor_parallel
    return total / shards, 3.0 * unit * value


def workload_report(workload: Workload, params: EnvParams, completion_time: float,
                    gpu_peak_activations: list[float] | tuple[float, ...]) -> WorkloadReport:
    """Iteration time, throughput, MFU and memory of one simulated iteration of ``workload`` in ``params``."""
    batch = params.n * workload.micro_batch_size * workload.data_parallel
    total_gpus = params.num_gpus * workload.model_parallel * workload.data_parallel
    assert workload.seq_len is not None
    peak_flops = workload.device.tflops * 1e12
    flops = iteration_flops(workload, batch)
    mfu = flops / (completion_time * total_gpus * peak_flops) if completion_time else math.nan
    memory = gpu_memory_gb(workload, params, gpu_peak_activations)
    return WorkloadReport(fwd_seconds=params.fwd_len, bwd_seconds=params.bwd_len, prop_seconds=params.prop_len,
                          sync_seconds=params.sync_base_len, iteration_seconds=completion_time,
                          optimizer_seconds=max(params.step_lengths()),
                          tokens_per_second=batch * workload.seq_len / completion_time if completion_time else math.nan,
                          mfu=mfu, memory_gb=memory, gpu_memory_gb=workload.device.memory_gb)
