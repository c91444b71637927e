"""The model against published measurements: the table of docs/model.md section 13, computed again.

    python benchmarks/published.py            # both comparisons, as a Markdown table (a few seconds)
    python benchmarks/published.py --implied  # per Megatron-LM row, the efficiency that would meet it (about 10 s)

Megatron-LM's weak-scaling table (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", table 1: A100 80 GB, interleaved 1F1B, full recomputation, per-GPU TFLOP/s by their
equation 3) is simulated as a workload with one ``compute_efficiency``, calibrated on the 145.6B row. The zero-bubble
paper's throughputs (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", table 4: ZB-1p and 1F1B, samples per GPU
per second) are compared as the ratio ZB-1p / 1F1B against our ZB-H1 / 1F1B on their own profiled times (their
table 6: T_F, T_B, T_W, T_comm in ms per stage and micro-batch); ZB-1p is the searched schedule with 1F1B's memory,
whose bubble their table 5 computes equal to ZB-H1's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline_sim.cli.common import Parser  # noqa: E402
from pipeline_sim.engine import simulate  # noqa: E402
from pipeline_sim.model import DEFAULT_POLICY, EnvParams  # noqa: E402
from pipeline_sim.workload import Workload, iteration_flops, workload_environment  # noqa: E402


class MegatronRow(NamedTuple):
    """One row of Narayanan et al. 2021, table 1 (sequence 2048, vocabulary 51,200, micro-batch size not stated)."""

    billions: float
    heads: int
    hidden: int
    layers: int
    tensor: int
    pipeline: int
    gpus: int
    batch: int
    tflops: float  # achieved per GPU, by their equation 3 (recomputation's extra forward counted)


MEGATRON = (
    MegatronRow(1.7, 24, 2304, 24, 1, 1, 32, 512, 137), MegatronRow(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    MegatronRow(7.5, 32, 4096, 36, 4, 1, 128, 512, 142), MegatronRow(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    MegatronRow(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), MegatronRow(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    MegatronRow(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    MegatronRow(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    MegatronRow(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    MegatronRow(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)
#: The row one compute_efficiency is calibrated on (145.6B, GPT-3's size, the middle of the table's range of
#: implied efficiencies), and what that gives (bisection on it, to 4 digits).
CALIBRATION_ROW = 6
EFFICIENCY = 0.6020


def megatron_environment(row: MegatronRow, efficiency: float) -> EnvParams:
    """A row as a workload: micro-batch 1 (the paper's other runs use 1), interleaving with the fewest chunks per
    GPU above one that divide its layers (2, or 3 for 15 and 3 layers); data parallel the rest of the GPUs;
    8 x 200 Gb/s InfiniBand per 8-GPU node: 25 GB/s per GPU for pipeline and data-parallel traffic; no sequence
    parallelism (it came in 2022), but each pipeline message scattered over the t tensor ranks' links (the paper's
    scatter/gather, section 4.1): t x 25 GB/s for a whole message; the element-wise kernels (the paper's fused
    softmax and bias-dropout-add, no flash attention) and the optimizer step at the end (the paper's throughput is
    of end-to-end training)."""
    data = row.gpus // (row.tensor * row.pipeline)
    workload = Workload(model={"layers": row.layers, "hidden": row.hidden, "heads": row.heads,
                               "ffn_hidden": 4 * row.hidden, "vocab": 51200, "seq_len": 2048},
                        gpu="a100-80gb", compute_efficiency=efficiency, tensor_parallel=row.tensor,
                        data_parallel=data, micro_batch_size=1, global_batch_size=row.batch, sequence_parallel=False,
                        recompute="full", p2p_bandwidth=25.0 * row.tensor, dp_bandwidth=25.0, optimizer_step=True,
                        elementwise=True)
    per_gpu = row.layers // row.pipeline
    chunks = next(v for v in range(2, per_gpu + 1) if per_gpu % v == 0) if per_gpu > 1 else 1
    if row.pipeline == 1 or chunks == 1:
        return workload_environment(workload, num_gpus=row.pipeline)
    return workload_environment(workload, num_gpus=row.pipeline, schedule="interleaved-1f1b", chunks=chunks)


def megatron_tflops(row: MegatronRow, efficiency: float = EFFICIENCY) -> float:
    """Our per-GPU TFLOP/s of a row, counted as the paper counts (its equation 3: 96 B s l h^2 (1 + s/6h + V/16lh))."""
    params = megatron_environment(row, efficiency)
    time = simulate(params, DEFAULT_POLICY).completion_time
    s, h, l, vocab = 2048, row.hidden, row.layers, 51200
    flops = 96 * row.batch * s * l * h * h * (1 + s / (6 * h) + vocab / (16 * l * h))
    return flops / time / row.gpus / 1e12


class ZeroBubbleRow(NamedTuple):
    """Qi et al. 2024: table 6's profiled times (ms) and table 4's throughput (samples per GPU per second)."""

    model: str
    pipeline: int
    micro_batches: int
    t_f: float
    t_b: float
    t_w: float
    t_comm: float
    zb_1p: float
    one_f_one_b: float


ZERO_BUBBLE = (
    ZeroBubbleRow("1.5B", 8, 24, 18.522, 18.086, 9.337, 0.601, 12.9, 11.8),
    ZeroBubbleRow("1.5B", 8, 32, 18.513, 18.086, 9.331, 0.626, 13.4, 12.5),
    ZeroBubbleRow("1.5B", 8, 64, 18.546, 18.097, 9.321, 0.762, 14.2, 13.6),
    ZeroBubbleRow("6.2B", 8, 24, 29.718, 29.444, 19.927, 0.527, 3.88, 3.50),
    ZeroBubbleRow("6.2B", 8, 32, 29.802, 29.428, 19.530, 0.577, 4.00, 3.70),
    ZeroBubbleRow("6.2B", 8, 64, 29.935, 29.621, 19.388, 0.535, 4.20, 4.03),
    ZeroBubbleRow("14.6B", 16, 48, 11.347, 11.248, 8.132, 0.377, 1.61, 1.40),
    ZeroBubbleRow("14.6B", 16, 64, 11.307, 11.254, 8.101, 0.379, 1.67, 1.49),
    ZeroBubbleRow("14.6B", 16, 128, 11.325, 11.308, 8.109, 0.378, 1.76, 1.64),
    ZeroBubbleRow("28.3B", 32, 96, 10.419, 10.207, 7.715, 0.408, 0.87, 0.76),
    ZeroBubbleRow("28.3B", 32, 128, 10.408, 10.204, 7.703, 0.408, 0.90, 0.80),
    ZeroBubbleRow("28.3B", 32, 256, 10.402, 10.248, 7.698, 0.460, 0.96, 0.88),
)


def zero_bubble_ratio(row: ZeroBubbleRow) -> float:
    """Our ZB-H1 throughput over 1F1B's, on the row's profiled times: one pipeline (no data parallelism, no
    gradient sync), a backward of T_B + T_W split at T_W, messages of T_comm, stages equal (the paper gives the
    first and last one layer fewer to make up for the embedding and the loss)."""
    common = dict(n=row.micro_batches, num_gpus=row.pipeline, fwd_len=row.t_f, bwd_len=row.t_b + row.t_w,
                  w_fraction=row.t_w / (row.t_b + row.t_w), prop_len=row.t_comm, sync_base_len=0.0)
    one_f_one_b = simulate(EnvParams(**common), DEFAULT_POLICY).completion_time
    zb_h1 = simulate(EnvParams(**common, schedule="zb-h1"), DEFAULT_POLICY).completion_time
    return one_f_one_b / zb_h1


class LlamaRow(NamedTuple):
    """Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3, table 4: Llama 3 405B on H100 80 GB, BF16."""

    gpus: int
    tensor: int
    context: int
    pipeline: int
    data: int
    seq_len: int
    tflops: float  # per GPU, as the paper states it


#: The paper prints the long-context row's data-parallel degree as 4, which neither its 16,384 GPUs nor its 16M
#: tokens a batch allow; 8 gives both.
LLAMA3 = (LlamaRow(8192, 8, 1, 16, 64, 8192, 430), LlamaRow(16384, 8, 1, 16, 128, 8192, 400),
          LlamaRow(16384, 8, 16, 16, 8, 131072, 380))
#: Tokens a batch in every row (16M).
LLAMA3_TOKENS = 2048 * 8192


def llama_environment(row: LlamaRow, efficiency: float = EFFICIENCY) -> tuple[Workload, EnvParams]:
    """A row as a workload: the Llama 3 405B preset (trained without dropout, with flash attention), 16M tokens a
    batch in micro-batches of one sequence, interleaved 1F1B with two chunks (the paper does not state its count),
    sequence parallelism, no recomputation (section 3.3.2), parameters and gradients sharded as its FSDP does
    (optimizer state and gradients, not the parameters: zero 2), the element-wise kernels and the optimizer step;
    400 Gb/s RoCE per GPU (50 GB/s) for pipeline, context and data-parallel traffic."""
    workload = Workload(model="llama3-405b", gpu="h100-80gb", seq_len=row.seq_len, compute_efficiency=efficiency,
                        tensor_parallel=row.tensor, context_parallel=row.context, data_parallel=row.data,
                        global_batch_size=LLAMA3_TOKENS // row.seq_len, optimizer_step=True, elementwise=True,
                        flash_attention=True, dropout=False)
    return workload, workload_environment(workload, num_gpus=row.pipeline, schedule="interleaved-1f1b", chunks=2,
                                          zero=2)


def llama_tflops(row: LlamaRow, efficiency: float = EFFICIENCY) -> float:
    """Our per-GPU TFLOP/s of a row: model FLOPs (docs/model.md section 11) over the iteration and the GPUs."""
    workload, params = llama_environment(row, efficiency)
    time = simulate(params, DEFAULT_POLICY).completion_time
    return iteration_flops(workload, LLAMA3_TOKENS // row.seq_len) / time / row.gpus / 1e12


class SelectiveRow(NamedTuple):
    """Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", tables 3 and 5:
    GPT models on A100 80 GB with sequence parallelism and selective recomputation, tensor 8, sequence 2048,
    vocabulary 51,200; model FLOPs utilization as its appendix A counts it (no recomputation counted)."""

    name: str
    layers: int
    hidden: int
    heads: int
    pipeline: int
    gpus: int
    batch: int
    micro_batch: int
    chunks: int  # interleaving; 1: none (the 1T row's is not stated: 2 assumed)
    mfu: float


SELECTIVE = (
    SelectiveRow("22B", 48, 6144, 64, 1, 8, 4, 4, 1, 0.415),
    SelectiveRow("175B", 96, 12288, 96, 8, 64, 64, 1, 3, 0.514),
    SelectiveRow("530B", 105, 20480, 128, 35, 280, 280, 1, 3, 0.560),
    SelectiveRow("1T", 128, 25600, 160, 64, 512, 512, 1, 2, 0.563),
    SelectiveRow("530B, data 8", 105, 20480, 128, 35, 2240, 2240, 1, 3, 0.542),
)


def selective_mfu(row: SelectiveRow, efficiency: float = EFFICIENCY) -> float:
    """Our MFU of a row, on the Megatron-LM settings above (A100 80 GB, 25 GB/s per GPU, element-wise kernels, the
    optimizer step) with sequence parallelism and selective recomputation."""
    data = row.gpus // (8 * row.pipeline)
    workload = Workload(model={"layers": row.layers, "hidden": row.hidden, "heads": row.heads,
                               "ffn_hidden": 4 * row.hidden, "vocab": 51200, "seq_len": 2048},
                        gpu="a100-80gb", compute_efficiency=efficiency, tensor_parallel=8, data_parallel=data,
                        micro_batch_size=row.micro_batch, global_batch_size=row.batch, recompute="selective",
                        p2p_bandwidth=25.0, dp_bandwidth=25.0, optimizer_step=True, elementwise=True)
    schedule = {"schedule": "interleaved-1f1b", "chunks": row.chunks} if row.chunks > 1 else {}
    params = workload_environment(workload, num_gpus=row.pipeline, **schedule)
    time = simulate(params, DEFAULT_POLICY).completion_time
    return iteration_flops(workload, row.batch) / (time * row.gpus * workload.device.tflops * 1e12)


class MoeRow(NamedTuple):
    """A mixture of experts' published training throughput with its layout (docs/model.md section 16), sequences
    of 4,096 tokens, micro-batches of one, the distributed optimizer (zero 1), ``tokens`` per GPU per second."""

    source: str
    model: str
    gpu: str
    gpus: int
    tensor: int
    pipeline: int
    expert: int
    schedule: str
    chunks: int
    batch: int
    ep_overlap: int
    route_nodes: int | None
    tokens: float


#: DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", sections 1 and 3.2: 180K H800 GPU hours per trillion tokens
#: (1e12 / 180,000 / 3,600 tokens per GPU-second), DualPipe, node-limited routing to 4 nodes. NVIDIA Megatron-Bridge
#: performance summary (releases 25.09, 25.11 and 26.04; token counts force-balanced, dropless; FP8): DeepSeek-V3 and
#: Qwen3-235B-A22B on H100, DeepSeek-V3's recipe with the expert-parallel overlap. Megatron-LM's MoE README (Core
#: v0.9): Mixtral 8x7B at 468 TFLOP/s on its reference layout, BF16, by its count of 79.7 GFLOP a token.
MOE = (
    MoeRow("DeepSeek-V3 report", "deepseek-v3", "h800-80gb", 2048, 1, 16, 64, "dualpipe-v", 2, 15360, 0, 4,
           1e12 / 180_000 / 3600),
    MoeRow("Megatron-Bridge 25.09", "deepseek-v3", "h100-80gb", 1024, 2, 8, 64, "interleaved-1f1b", 4, 8192, 1,
           None, 1297),
    MoeRow("Megatron-Bridge 25.11", "qwen3-235b-a22b", "h100-80gb", 256, 2, 8, 32, "interleaved-1f1b", 4, 2048, 0,
           None, 1575),
    MoeRow("Megatron-Bridge 26.04", "qwen3-235b-a22b", "h100-80gb", 256, 2, 8, 32, "interleaved-1f1b", 4, 8192, 0,
           None, 1712),
    MoeRow("Megatron-LM MoE README", "mixtral-8x7b", "h100-80gb", 64, 1, 4, 8, "interleaved-1f1b", 8, 256, 0, None,
           468e12 / 79.7e9),
)
#: One efficiency for every mixture-of-experts row, calibrated on DeepSeek-V3's own (bisection, 4 digits). FP8
#: GEMMs are counted at the BF16 peak: the efficiency takes their speed-up in.
MOE_EFFICIENCY = 0.5914
#: The all-to-all in the data-parallel class: its kernels take SMs from the compute they overlap, which slows it as a
#: sync does (docs/model.md section 3.3, impact 0.2; DeepSeek-V3 gives 20 of an H800's 132 SMs to communication).
A2A_CLASS = "grad_sync"


def moe_environment(row: MoeRow, efficiency: float = MOE_EFFICIENCY) -> tuple[Workload, EnvParams]:
    """A row as a workload: its preset, layout and schedule, data parallel the rest of the GPUs, 50 GB/s of
    network per GPU (400 Gb/s InfiniBand) for every transfer across nodes, 8 GPUs a node, flash attention, the
    element-wise kernels and the optimizer step."""
    data = row.gpus // (row.tensor * row.pipeline)
    workload = Workload(model=row.model, gpu=row.gpu, compute_efficiency=efficiency, tensor_parallel=row.tensor,
                        data_parallel=data, expert_parallel=row.expert, global_batch_size=row.batch, seq_len=4096,
                        route_nodes=row.route_nodes, optimizer_step=True, elementwise=True, flash_attention=True)
    return workload, workload_environment(workload, num_gpus=row.pipeline, schedule=row.schedule, chunks=row.chunks,
                                          zero=1, ep_overlap=row.ep_overlap, a2a_class=A2A_CLASS)


def moe_tokens(row: MoeRow, efficiency: float = MOE_EFFICIENCY) -> float:
    """Our tokens per GPU per second of a row."""
    workload, params = moe_environment(row, efficiency)
    assert workload.seq_len is not None
    return row.batch * workload.seq_len / simulate(params, DEFAULT_POLICY).completion_time / row.gpus


def implied_efficiency(row: MegatronRow, steps: int = 14) -> float:
    """The ``compute_efficiency`` at which our throughput of ``row`` meets the published one (bisection on 0.3 to
    0.9, ``steps`` halvings): what one efficiency for every shape leaves out, row by row."""
    low, high = 0.3, 0.9
    for _ in range(steps):
        middle = (low + high) / 2
        low, high = (middle, high) if megatron_tflops(row, middle) < row.tflops else (low, middle)
    return (low + high) / 2


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description="The model against published measurements, as a Markdown table "
                                                 "(docs/model.md section 13).")
    parser.add_argument("--implied", action="store_true",
                        help="per Megatron-LM row, the compute efficiency that would meet it, instead of the table")
    if parser.parse_args(argv).implied:
        lines = ["| Megatron-LM row | hidden | efficiency that meets it |", "|---|---:|---:|"]
        lines += [f"| {row.billions:g}B, t {row.tensor} p {row.pipeline} | {row.hidden:,} | "
                  f"{implied_efficiency(row):.3f} |" for row in MEGATRON]
        sys.stdout.write("\n".join(lines) + "\n")
        return 0
    lines = ["| setting | published | ours | error |", "|---|---:|---:|---:|"]
    for i, row in enumerate(MEGATRON):
        ours = megatron_tflops(row)
        mark = " (calibration)" if i == CALIBRATION_ROW else ""
        lines.append(f"| Megatron-LM {row.billions:g}B, t {row.tensor} p {row.pipeline} on {row.gpus:,} A100, batch "
                     f"{row.batch}{mark}: TFLOP/s per GPU | {row.tflops:g} | {ours:.1f} | "
                     f"{100 * (ours / row.tflops - 1):+.1f}% |")
    for llama in LLAMA3:
        ours = llama_tflops(llama)
        context = f" c {llama.context}" if llama.context > 1 else ""
        lines.append(f"| Llama 3 405B, t {llama.tensor}{context} p {llama.pipeline} d {llama.data} on "
                     f"{llama.gpus:,} H100, {llama.seq_len:,} tokens: TFLOP/s per GPU | {llama.tflops:g} | "
                     f"{ours:.1f} | {100 * (ours / llama.tflops - 1):+.1f}% |")
    for selective in SELECTIVE:
        ours = selective_mfu(selective)
        lines.append(f"| selective recomputation {selective.name}, t 8 p {selective.pipeline} on {selective.gpus:,} "
                     f"A100: MFU | {selective.mfu:.1%} | {ours:.1%} | {100 * (ours / selective.mfu - 1):+.1f}% |")
    for moe in MOE:
        ours = moe_tokens(moe)
        mark = " (calibration)" if moe is MOE[0] else ""
        overlap = ", expert-parallel overlap" if moe.ep_overlap else ""
        lines.append(f"| {moe.model} on {moe.gpus:,} {moe.gpu[:4].upper()}, t {moe.tensor} p {moe.pipeline} e "
                     f"{moe.expert}, {moe.schedule}{overlap}, batch {moe.batch:,} ({moe.source}){mark}: tokens/s per "
                     f"GPU | {moe.tokens:,.0f} | {ours:,.0f} | {100 * (ours / moe.tokens - 1):+.1f}% |")
    for zb in ZERO_BUBBLE:
        published = zb.zb_1p / zb.one_f_one_b
        ours = zero_bubble_ratio(zb)
        lines.append(f"| zero bubble {zb.model}, p {zb.pipeline}, m {zb.micro_batches}: ZB-1p / 1F1B (ours ZB-H1 / "
                     f"1F1B) | {published:.3f} | {ours:.3f} | {100 * (ours - published):+.1f} points |")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
