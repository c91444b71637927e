"""What a workload is: a model on a GPU in a parallel layout over a network, its keys checked (docs/model.md
sections 11 and 15)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Collection, Mapping

from ..model import ParameterError
from ..parameters import Integers, Interval
from .shapes import GPU_PRESETS, MODEL_PRESETS, GpuSpec, ModelShape, _preset

RECOMPUTE_MODES = ("none", "selective", "full")


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
    bytes_per_param: float = None  # type: ignore[assignment]  # 16, or dtype + grad + 12 with grad_bytes given
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
    expert_parallel: int = 1
    expert_imbalance: float = 1.0
    ep_bandwidth: float | None = None
    route_nodes: int | None = None
    node_gpus: int = 8
    grad_bytes: int | None = None

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
        if self.grad_bytes is not None:
            Integers(1).check("grad_bytes", self.grad_bytes)
        if self.bytes_per_param is None:
            object.__setattr__(self, "bytes_per_param", default_bytes_per_param(self.dtype_bytes, self.grad_bytes))
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
        self._check_experts(model)
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

    def _check_experts(self, model: ModelShape) -> None:
        """The keys of expert parallelism (docs/model.md section 16)."""
        e = self.expert_parallel
        Integers(1).check("expert_parallel", e)
        if e > 1 and not model.experts:
            raise ParameterError("expert_parallel", e, f"{model.name} has no experts to split over GPUs")
        if model.experts % e:
            raise ParameterError("expert_parallel", e, f"must divide the {model.experts} experts of {model.name}")
        if (self.data_parallel * self.tensor_parallel) % e:
            raise ParameterError("data_parallel", self.data_parallel, f"times tensor_parallel = "
                                 f"{self.tensor_parallel} must be a multiple of expert_parallel = {e}: the experts are "
                                 f"split over GPUs of the data- and tensor-parallel groups")
        Interval(1.0, 1e3, high_closed=True).check("expert_imbalance", self.expert_imbalance)
        if e > 1:
            most = imbalance_limit(model, e)
            if self.expert_imbalance > most:
                raise ParameterError("expert_imbalance", self.expert_imbalance,
                                     f"must be at most {most:g} with expert_parallel = {e}: the busiest GPU holds "
                                     f"{model.experts // e} of the {model.experts} experts, each token's {model.top_k} "
                                     f"copies at most {min(model.top_k, model.experts // e)} of them")
        if self.ep_bandwidth is None:
            object.__setattr__(self, "ep_bandwidth", self.dp_bandwidth)
        Interval(0.0, low_open=True).check("ep_bandwidth", self.ep_bandwidth)
        if self.route_nodes is not None:
            Integers(1).check("route_nodes", self.route_nodes)
        Integers(1).check("node_gpus", self.node_gpus)

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
    def expert_shards(self) -> int:
        """How many GPUs share one copy of each sharded byte of a routed expert: those holding the same experts, d x t
        / e of them, times the context-parallel degree (the expert data-parallel group, docs/model.md section 16)."""
        return self.data_parallel * self.tensor_parallel // self.expert_parallel * self.context_parallel

    @property
    def gradient_bytes(self) -> int:
        """Bytes of a gradient value as it is kept and reduced: ``grad_bytes``, else ``dtype_bytes``."""
        return self.dtype_bytes if self.grad_bytes is None else self.grad_bytes

    @property
    def imbalance(self) -> float:
        """The busiest GPU's expert tokens over the mean (docs/model.md section 16): ``expert_imbalance``, and 1
        without expert parallelism, where each GPU computes its own tokens' experts."""
        return self.expert_imbalance if self.expert_parallel > 1 else 1.0

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
        context += f", expert {self.expert_parallel}" if self.expert_parallel > 1 else ""
        sharding = "" if not zero else f", zero {zero}" + \
            (f" in groups of {self.sharding}" if self.sharding != self.data_parallel else "")
        return (f"{self.shape.name} on {total} x {self.device.name} (tensor {self.tensor_parallel}{context}, "
                f"pipeline {num_gpus}, data {self.data_parallel}{sharding}), batch {batch} x {self.seq_len} tokens")


def imbalance_limit(model: ModelShape, expert_parallel: int) -> float:
    """The most ``expert_imbalance`` can be on ``expert_parallel`` GPUs: the busiest takes at most min(top_k, experts
    / e) of each token's top_k copies, against top_k / e on the mean GPU (docs/model.md section 16)."""
    e = expert_parallel
    return e * min(model.top_k, model.experts // e) / model.top_k


def default_bytes_per_param(dtype_bytes: int, grad_bytes: int | None) -> float:
    """Mixed-precision Adam's static bytes a parameter: 16 (docs/model.md section 11), or with ``grad_bytes`` given
    a weight, a gradient and 12 bytes of fp32 state (section 15). A workload resolves it when made: ``replace``
    keeps the resolved value, so a copy with another ``grad_bytes`` gives ``bytes_per_param=None`` to follow it."""
    return 16.0 if grad_bytes is None else float(dtype_bytes + grad_bytes + 12)


WORKLOAD_KEYS = tuple(f.name for f in fields(Workload))
#: Workload keys a sweep's CSV carries only when its grid gives them (so that older grids write what they always did).
OPTIONAL_WORKLOAD_KEYS = ("recompute_per_stage", "optimizer_step", "elementwise", "flash_attention", "dropout",
                          "shard_group", "context_parallel", "expert_parallel", "expert_imbalance", "ep_bandwidth",
                          "route_nodes", "node_gpus", "grad_bytes")


def workload_columns(given: Collection[str] = ()) -> tuple[str, ...]:
    """The workload keys of a sweep's rows: all but the optional ones its grid does not give (``given``)."""
    return tuple(key for key in WORKLOAD_KEYS if key not in OPTIONAL_WORKLOAD_KEYS or key in given)
#: Workload keys that stay empty when nothing gives them and nothing needs them (a custom GPU without NVLink, no
#: tensor parallelism; a batch a grid gives as n).
UNKNOWABLE_KEYS = ("tp_bandwidth", "global_batch_size", "route_nodes")
