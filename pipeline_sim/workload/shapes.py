"""Model shapes and GPUs (docs/model.md section 11): the presets with their sources, and custom ones from an object of
fields or a CSV cell."""

from __future__ import annotations

from dataclasses import dataclass, fields
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any, Mapping, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from ..model import ParameterError
from ..parameters import NOT_GIVEN, Integers, Interval


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
    # a mixture of experts (docs/model.md section 16): ``experts`` routed experts of ``expert_ffn_hidden``, ``top_k``
    # of them per token, ``shared_experts`` always on, the first ``dense_layers`` layers dense (``ffn_hidden``)
    experts: int = 0
    expert_ffn_hidden: int = 0
    top_k: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    # attention other than section 11's: its parameters per layer (multi-head latent attention's projections), and
    # the widths of a head's queries and keys and of its values (0: hidden / heads)
    attention_params: int = 0
    qk_head_dim: int = 0
    v_head_dim: int = 0
    name: str = ""

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len"):
            Integers(1).check(f"model.{key}", getattr(self, key))
        for key in _OPTIONAL_FIELDS:
            Integers(0).check(f"model.{key}", getattr(self, key))
        if self.experts:
            for key in ("expert_ffn_hidden", "top_k"):
                if getattr(self, key) == 0:  # the default: left out
                    raise ParameterError(f"model.{key}", NOT_GIVEN, "a model with experts needs it, an integer >= 1")
                Integers(1).check(f"model.{key}", getattr(self, key))
            if self.top_k > self.experts:
                raise ParameterError("model.top_k", self.top_k, f"must be at most experts = {self.experts}")
            if self.dense_layers >= self.layers:
                raise ParameterError("model.dense_layers", self.dense_layers, f"must leave a MoE layer of the "
                                                                              f"{self.layers}")
        elif any(getattr(self, key) for key in ("expert_ffn_hidden", "top_k", "shared_experts", "dense_layers")):
            raise ParameterError("model.experts", self.experts, "must be at least 1 for expert_ffn_hidden, top_k, "
                                                                "shared_experts or dense_layers to mean anything")
        kv_heads = self.heads if self.kv_heads is None else self.kv_heads
        object.__setattr__(self, "kv_heads", kv_heads)
        Integers(1).check("model.kv_heads", kv_heads)
        if self.heads % kv_heads:
            raise ParameterError("model.kv_heads", self.kv_heads, f"must divide heads = {self.heads}")
        if self.hidden % self.heads:  # each head a slice of the hidden size, as attention cuts it
            raise ParameterError("model.heads", self.heads, f"must divide hidden = {self.hidden}")
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
        text += "".join(f" {key}={getattr(self, key)}" for key in _OPTIONAL_FIELDS if getattr(self, key))
        return text + (" gated" if self.gated_mlp else "") + ("" if self.dropout else " no-dropout")

    @property
    def plain(self) -> bool:
        """Whether every layer is section 11's dense layer: no experts, no attention of its own kind."""
        return not any(getattr(self, key) for key in _OPTIONAL_FIELDS)

    def is_moe(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) routes its tokens to experts."""
        return self.experts > 0 and layer >= self.dense_layers


#: The fields of a mixture of experts and of other attention, 0 when a model has none.
_OPTIONAL_FIELDS = ("experts", "expert_ffn_hidden", "top_k", "shared_experts", "dense_layers", "attention_params",
                    "qk_head_dim", "v_head_dim")


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
    # mixtures of experts (section 16), from each model's published config.json
    # Mixtral was trained on 32k-token sequences (Jiang et al. 2024, section 2)
    ModelShape(name="mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000,
               gated_mlp=True, seq_len=32768, dropout=False, experts=8, expert_ffn_hidden=14336, top_k=2),
    # multi-head latent attention counted by its projections: q 7168 x 1536 and 1536 x 128 x 192, kv 7168 x 576 and
    # 512 x 128 x 256, out 128 x 128 x 7168 (187,105,280 parameters); scores on 192-wide queries and keys
    ModelShape(name="deepseek-v3", layers=61, hidden=7168, heads=128, ffn_hidden=18432, vocab=129280,
               gated_mlp=True, seq_len=4096, dropout=False, experts=256, expert_ffn_hidden=2048, top_k=8,
               shared_experts=1, dense_layers=3, attention_params=187_105_280, qk_head_dim=192, v_head_dim=128),
    ModelShape(name="qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4, ffn_hidden=12288,
               vocab=151936, gated_mlp=True, seq_len=4096, dropout=False, experts=128, expert_ffn_hidden=1536,
               top_k=8, attention_params=71_303_168, qk_head_dim=128, v_head_dim=128),  # 64 heads of 128 > hidden
)}


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """Peak dense BF16 throughput (TFLOP/s), memory (GB, 10^9 bytes: a preset's is the whole device as ``nvidia-smi``
    reports it), memory bandwidth and NVLink bandwidth (GB/s, NVLink as NVIDIA states it: both directions of all links
    together; None: not known)."""

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


#: NVIDIA's figures: dense BF16 (the datasheets' sparse figure halved), HBM bandwidth, NVLink of the SXM parts (A100:
#: 12 NVLink 3 links, H100 and H200: 18 NVLink 4 links). docs/model.md section 11 names the sources. The capacities
#: are ``nvidia-smi``'s ``memory.total`` in 10^9 bytes: the names' 40, 80 and 141 GB count in MiB (A100 80 GB
#: 81,920 MiB; H100 and H800 81,559; H200 143,771; A100 40 GB 40,960).
GPU_PRESETS: dict[str, GpuSpec] = {gpu.name: gpu for gpu in (
    GpuSpec(name="a100-40gb", tflops=312.0, memory_gb=42.95, memory_bandwidth=1555.0, nvlink_bandwidth=600.0),
    GpuSpec(name="a100-80gb", tflops=312.0, memory_gb=85.90, memory_bandwidth=2039.0, nvlink_bandwidth=600.0),
    GpuSpec(name="h100-80gb", tflops=989.0, memory_gb=85.52, memory_bandwidth=3350.0, nvlink_bandwidth=900.0),
    GpuSpec(name="h200-141gb", tflops=989.0, memory_gb=150.75, memory_bandwidth=4800.0, nvlink_bandwidth=900.0),
    # H100's compute and memory with NVLink cut to 400 GB/s, as DeepSeek-V3 was trained on (its report: 160 GB/s
    # achieved per GPU)
    GpuSpec(name="h800-80gb", tflops=989.0, memory_gb=85.52, memory_bandwidth=3350.0, nvlink_bandwidth=400.0),
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
            guess = get_close_matches(str(unknown[0]), allowed, n=1)
            raise ParameterError(f"{key}.{unknown[0]}", value[unknown[0]], f"unknown field of a {key}"
                                 + (f" (did you mean {guess[0]!r}?)" if guess else "")
                                 + f"; allowed: {', '.join(allowed)}")
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
