"""plan.py: which layout, schedule, partition and policy to run a model on a number of GPUs."""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from ..cluster import ClusterLost, DaskCluster, connected
from ..files import atomic_output, exclusive_writer, output_target
from ..model import A2A_CLASSES
from ..plan import (
    COLUMNS,
    DIMENSIONS,
    EXPERT_SCHEDULES,
    LAYOUT_COLUMNS,
    NO_TENSOR_PARALLEL,
    PARTITIONS,
    SCHEDULES,
    TOP,
    ZERO_STAGES,
    Outcome,
    PlanResult,
    plan,
)
from ..results import safe_name
from ..taskgraph import MAX_TASKS
from ..workload import (
    GPU_PRESETS,
    MODEL_PRESETS,
    RECOMPUTE_MODES,
    Workload,
    default_bytes_per_param,
    faithful_defaults,
    seconds_text,
)
from .common import (
    Parser,
    UserError,
    add_cluster_argument,
    bar_width,
    bounded_int,
    check_interrupt,
    counted,
    positive_int,
    preset_or_object,
    ready_kernel,
    run_command,
    script_name,
    use_display,
)

#: The most GPUs a plan is asked for: a billion, far past any cluster; a larger count is a mistake, and its divisors
#: alone would take minutes to find.
MAX_GPUS = 10 ** 9
#: Each pinned dimension: its values' type, and what its option says.
_PINS = (
    ("tensor_parallel", int, "tensor-parallel degrees"), ("context_parallel", int, "context-parallel degrees"),
    ("expert_parallel", int, "expert-parallel degrees of a model with experts (default: every degree dividing "
                             "its experts and data x tensor)"),
    ("pipeline_parallel", int, "pipeline degrees (GPUs of one pipeline)"),
    ("data_parallel", int, "data-parallel degrees"), ("zero", int, "ZeRO stages 0 to 3 (FSDP is 3)"),
    ("micro_batch_size", int, "micro-batch sizes"), ("schedule", str, f"schedules ({', '.join(SCHEDULES)}; "
                                                         "dualpipe-v too for a model with experts)"),
    ("chunks", int, "chunks per GPU of interleaved-1f1b, 2 or more (default: every count dividing a GPU's "
                    "layers); the other schedules have their own, 1 or 2 (zb-v, dualpipe-v)"),
    ("recompute", str, f"recomputation ({', '.join(RECOMPUTE_MODES)})"),
)
#: The type of each pinned dimension's values.
DIMENSION_TYPES = {key: kind for key, kind, _ in _PINS}
#: Draws per layout under --jitter unless --samples says.
SAMPLES = 8


def build_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, description=(
        "Search the layouts of a model on a number of GPUs: tensor, context, pipeline and data-parallel degrees "
        "that divide the GPUs and the model, and for each the micro-batch size, schedule, chunks, zero stage, "
        "recomputation and partition of its runs. Runs that cannot fit in memory or cannot beat those listed are "
        "left out before simulating; those listed are simulated again over a policy grid. Lists the fastest run "
        "of each of the five fastest layouts (--by run: the ten fastest runs), writes every run enumerated to a "
        "CSV and draws iteration time against memory per GPU (docs/model.md section 14)."))
    parser.add_argument("--model", required=True, metavar="NAME|JSON",
                        help=f"a preset ({', '.join(MODEL_PRESETS)}) or a JSON object with layers, hidden, heads, "
                             f"ffn_hidden, vocab[, kv_heads, gated_mlp, seq_len]")
    parser.add_argument("--gpu", default="h100-80gb", metavar="NAME|JSON",
                        help=f"a preset ({', '.join(GPU_PRESETS)}; default %(default)s) or a JSON object with tflops, "
                             f"memory_gb[, memory_bandwidth, nvlink_bandwidth]")
    parser.add_argument("--gpus", type=lambda text: bounded_int(text, 1, MAX_GPUS), required=True,
                        help=f"GPUs in all, up to {MAX_GPUS:,}")
    parser.add_argument("--global-batch-size", type=positive_int, required=True, help="sequences per iteration")
    parser.add_argument("--seq-len", type=positive_int, default=None, help="tokens per sequence (default: the "
                                                                            "model's training length)")
    parser.add_argument("--compute-efficiency", type=float, default=0.5,
                        help="achieved share of peak FLOP/s in transformer layers (default %(default)s)")
    parser.add_argument("--p2p-bandwidth", type=float, default=50.0, help="pipeline bandwidth per GPU, GB/s "
                                                                          "(default %(default)s)")
    parser.add_argument("--dp-bandwidth", type=float, default=50.0, help="data-parallel bandwidth per GPU, GB/s "
                                                                         "(default %(default)s)")
    parser.add_argument("--tp-bandwidth", type=float, default=None, metavar="GB/S",
                        help="tensor-parallel bandwidth per GPU (default: half the GPU's NVLink figure)")
    experts = parser.add_argument_group("a model with experts (docs/model.md section 16)")
    experts.add_argument("--expert-imbalance", type=float, default=1.0,
                         help="the busiest expert GPU's tokens over the mean (default %(default)s)")
    experts.add_argument("--route-nodes", type=positive_int, default=None,
                         help="node-limited routing: at most this many copies of a token cross the network "
                              "(default: top_k)")
    experts.add_argument("--node-gpus", type=positive_int, default=8,
                         help="GPUs per node; the all-to-all within one goes over NVLink (default %(default)s)")
    experts.add_argument("--a2a-class", choices=A2A_CLASSES, default="pipeline",
                         help="whose priority the all-to-all takes (default %(default)s; grad_sync: with the syncs, "
                              "its kernels slowing the compute they overlap)")
    parser.add_argument("--bytes-per-param", type=float, default=None,
                        help="static bytes per parameter: weight, gradient and optimizer state (default 16: bf16 "
                             "weights and gradients, fp32 Adam; with --grad-bytes, 2 + that + 12)")
    parser.add_argument("--grad-bytes", type=positive_int, default=None,
                        help="bytes of a gradient as kept and reduced (default 2, a weight's; 4: accumulated and "
                             "reduced in fp32, as Megatron-LM's bf16 runs and Llama 3's)")
    parser.add_argument("--optimizer-step", action=argparse.BooleanOptionalAction, default=None,
                        help="end each iteration with the optimizer step at the GPU's memory bandwidth (default on "
                             "when the GPU states it)")
    parser.add_argument("--elementwise", action=argparse.BooleanOptionalAction, default=None,
                        help="add the layers' memory-bound element-wise work at the GPU's memory bandwidth (default "
                             "on when the GPU states it)")
    parser.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=False,
                        help="a fused attention kernel: the attention scores neither kept nor moved (default off)")
    parser.add_argument("--dropout", action=argparse.BooleanOptionalAction, default=None,
                        help="dropout on the attention probabilities and residual branches, its masks kept and "
                             "written (default: as the model was trained; the Llama presets without)")
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="compute and communication jitter (coefficient of variation); above 0 each layout is "
                             "drawn --samples times and ranked by the 95th percentile (default 0: the mean of one "
                             "noiseless run)")
    parser.add_argument("--samples", type=positive_int, default=None, help=f"draws per layout under --jitter "
                                                                           f"(default {SAMPLES})")
    parser.add_argument("--seed", type=lambda text: bounded_int(text, 0, 2 ** 63 - 1), default=None,
                        help="seed of the draws under --jitter (default 0)")
    parser.add_argument("--workers", type=positive_int, metavar="N", default=os.cpu_count() or 1,
                        help="worker processes (default: all %(default)s cores; 1 runs serially)")
    add_cluster_argument(parser)
    pins = parser.add_argument_group(
        "pinning: each takes one value or several separated by commas; the other layouts are not searched")
    for key, kind, text in _PINS:
        pins.add_argument("--" + key.replace("_", "-"), dest=key, default=None, metavar="V[,V...]",
                          type=_values(key, kind), help=text)
    parser.add_argument("--by", choices=("layout", "run"), default="layout",
                        help="list the five fastest layouts (tensor, context, pipeline, data and expert-parallel "
                             "degrees), "
                             "each by its fastest run, or the ten fastest runs, several of one layout with other "
                             "schedules, sharding or recomputation (default %(default)s; the CSV has "
                             "both ranks)")
    parser.add_argument("--memory-headroom", type=float, default=0.0, metavar="GB",
                        help="memory each GPU keeps free (fragmentation, buffers): a layout fits within the GPU's "
                             "memory less this (default %(default)s)")
    parser.add_argument("--mark", action="append", default=[], metavar="KEY=V,...",
                        help="name on the figure the fastest simulated run with these values, and say in the "
                             "listing where it ranks, e.g. tensor_parallel=8,pipeline_parallel=16,data_parallel=64 "
                             "(repeatable; the figure names six runs at most)")
    parser.add_argument("--output", "-o", type=Path, default=None,
                        help="CSV of every layout enumerated: those that fit, fastest first and ranked, then those "
                             "simulated that do not fit, then those not simulated and why, with how far over the "
                             "memory each is (default outputs/plan/plan_<every input that changes the answer>.csv); "
                             "the figure is written beside it as .png")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier plan of the same name")
    return parser


def _values(key: str, kind: type) -> Callable[[str], frozenset]:
    allowed = {"schedule": EXPERT_SCHEDULES, "recompute": RECOMPUTE_MODES, "zero": ZERO_STAGES}.get(key)

    def parse(text: str) -> frozenset:
        values = set()
        for word in text.replace(" ", "").split(","):
            try:
                value = kind(word.lower()) if kind is str else kind(word)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{word!r} is not {'an integer' if kind is int else 'a name'}; "
                                                 f"give values separated by commas") from None
            if allowed is not None and value not in allowed:
                raise argparse.ArgumentTypeError(f"{word!r}: allowed {', '.join(map(str, allowed))}")
            least = {"zero": 0, "chunks": 2}.get(key, 1)
            if isinstance(value, int) and value < least:
                raise argparse.ArgumentTypeError(f"{word!r}: must be an integer >= {least}")
            values.add(value)
        return frozenset(values)
    return parse


def _marks(texts: list[str]) -> list[dict[str, str]]:
    """Each ``--mark``'s values by key, each value checked as its pin would be (``partition``: a name of
    ``PARTITIONS``)."""
    marks = []
    for text in texts:
        mark: dict[str, str] = {}
        for item in text.replace(" ", "").split(","):
            key, sep, value = item.partition("=")
            if not sep or key not in LAYOUT_COLUMNS[:-1]:
                raise UserError(f"--mark {text!r}: expected KEY=VALUE,... with KEY one of "
                                f"{', '.join(LAYOUT_COLUMNS[:-1])}")
            if key in mark:
                raise UserError(f"--mark {text!r}: {key} given twice; a run has one value of each")
            if key == "partition":
                if value not in PARTITIONS:
                    raise UserError(f"--mark {text!r}: partition {value!r}: allowed {', '.join(PARTITIONS)}")
            else:
                try:
                    value, = _values(key, DIMENSION_TYPES[key])(value)
                except (argparse.ArgumentTypeError, ValueError) as error:
                    raise UserError(f"--mark {text!r}: {key} {str(error).split(';')[0]}") from None
            mark[key] = str(value)
        marks.append(mark)
    return marks


def write_csv(result: PlanResult, path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(result.rows())


def _matches(outcome: Outcome, mark: dict[str, str]) -> bool:
    cells = dict(zip(LAYOUT_COLUMNS, outcome.layout.row()))
    return all(str(cells[key]) == value for key, value in mark.items())


def _mark_text(mark: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in mark.items())


def marked(result: PlanResult, marks: list[dict[str, str]]) -> list[tuple[str, Outcome | None, str]]:
    """Per ``--mark``: its text, its run (the fastest that fits of the simulated layouts it names, else the fastest)
    and where that run stands (its layout's and its own rank among those that fit); for a mark that names no
    simulated layout, no run and why: the reason of the first enumerated layout it names (the lightest, as the CSV
    lists them), or that no layout enumerated has its values."""
    said: list[tuple[str, Outcome | None, str]] = []
    ranks = result.layout_ranks()
    for mark in marks:
        text = _mark_text(mark)
        found = [o for o in result.tried if _matches(o, mark)]
        if found:
            chosen = min(found, key=lambda o: (not o.fits, o.seconds))
            where = (f"layout #{ranks[chosen.layout.degrees]}, run #{result.ranked.index(chosen) + 1}"
                     if chosen in result.ranked else "does not fit")
            said.append((text, chosen, where))
            continue
        reasons = [u.reason.removeprefix("no: ") for u in sorted(result.unsimulated, key=lambda u: u.memory_gb)
                   if all(str(dict(zip(LAYOUT_COLUMNS, u.cells))[key]) == value for key, value in mark.items())]
        said.append((text, None, f"not on the figure; its layouts were not simulated ({reasons[0]})" if reasons
                     else "not on the figure; no layout enumerated has these values"))
    return said


def _over(outcome: Outcome) -> str:
    return "" if outcome.fits else f", over by {outcome.memory_gb - outcome.budget_gb:.1f} GB"


def _label(outcome: Outcome, what: str) -> str:
    memory = f"{outcome.memory_gb:.1f} GB" if outcome.memory_gb >= 0.1 else f"{outcome.memory_gb * 1e3:.3g} MB"
    return (f"{what}: {outcome.layout.describe()}\n{seconds_text(outcome.seconds)}, MFU {outcome.mfu:.1%}, "
            f"{memory}{_over(outcome)}, policy {outcome.policy}")


def named_runs(result: PlanResult, marks: list[tuple[str, Outcome | None, str]]) -> list[tuple[Outcome, str]]:
    """The runs the figure names, in order, each once with all that names it: the best that fits, the fastest when
    it does not fit, then each marked run (``marked``), with where a marked run that fits stands."""
    names: dict[int, tuple[Outcome, list[str]]] = {}  # by run: what names it
    stands: dict[int, str] = {}  # by marked run that fits: where
    best, fastest = result.ranked[0], min(result.tried, key=lambda o: o.seconds)
    for outcome, what, where in ((best, "best that fits", ""),
                                 *([(fastest, "fastest, does not fit", "")] if fastest is not best else []),
                                 *((chosen, f"marked {text.replace(',', ', ')}", where if chosen.fits else "")
                                   for text, chosen, where in marks if chosen is not None)):
        names.setdefault(id(outcome), (outcome, []))[1].append(what)
        if where:
            stands.setdefault(id(outcome), where)
    return [(outcome, ", ".join(whats) + (f" ({stands[key]})" if key in stands else ""))
            for key, (outcome, whats) in names.items()]


def draw(result: PlanResult, path: Path, title: str, named: list[tuple[Outcome, str]], time_label: str) -> None:
    use_display(no_show=True)
    import matplotlib.pyplot as plt

    from ..plotting.plan import plot_plan

    tried = result.tried
    best = result.ranked[0]
    fig, ax = plt.subplots(figsize=(11, 7), layout="constrained")
    plot_plan(ax, [o.memory_gb for o in tried], [o.seconds for o in tried], [o.fits for o in tried],
              best.layout.workload.device.memory_gb, best.budget_gb,
              [(tried.index(outcome), _label(outcome, what)) for outcome, what in named], title,
              f"{time_label} time")
    fig.savefig(path, dpi=130, format="png")
    plt.close(fig)


def _search(base: Workload, args: argparse.Namespace, env: dict[str, object],
            cluster: DaskCluster | None) -> tuple[PlanResult, float]:
    """The planner's search with a progress bar, gone when it ends, and its seconds (the kernel ready)."""
    ready_kernel(parts=("figures",))
    from tqdm import tqdm

    started = time.monotonic()
    bars: list[tqdm] = []  # made at the first report, so that a request refused at once leaves no bar behind

    units: list[str] = []  # what the bar counts: the choices enumerated, then the layouts screened, a bar each

    def progress(done: int, total: int, unit: str) -> None:
        if bars and units[-1] != unit:
            bars.pop().close()
        if not bars:
            # none when stderr is not a terminal: what it drew there would precede an error's one line
            # the layouts are a most: the bound leaves out the rest at once when it passes them. Their time left is
            # at the run's average rate so far, an estimate: later layouts (deeper pipelines, more draws) may cost
            # more than the first
            most = {"bar_format": "{l_bar}{bar}| {n_fmt}/{total_fmt} layouts at most [{elapsed}, about "
                                  "{remaining} left]", "smoothing": 0} if unit == "layout" else {}
            bars.append(tqdm(total=total, unit=unit, file=sys.stderr, **bar_width(), mininterval=0.5,
                             leave=False, disable=None, **most))
            units.append(unit)
        bars[0].total = total
        bars[0].update(done - bars[0].n)
        check_interrupt()
    try:
        filters = {key: getattr(args, key) for key in DIMENSIONS if getattr(args, key) is not None}
        result = plan(base, args.gpus, env=env, samples=args.samples, workers=args.workers, progress=progress,
                      cluster=cluster, filters=filters, headroom_gb=args.memory_headroom)
        return result, time.monotonic() - started
    except ClusterLost as error:
        done = f" after {bars[0].n:,} of {bars[0].total:,} {units[-1]}s" if bars else ""
        raise ClusterLost(f"{error}{done}; nothing written") from None
    finally:
        for bar in bars:
            bar.close()


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    args = build_parser(prog).parse_args(argv)

    def body() -> int:
        given = {key: getattr(args, key) for key in ("optimizer_step", "elementwise", "dropout")
                 if getattr(args, key) is not None}
        base = Workload(**faithful_defaults(dict(
            model=preset_or_object("model", args.model), gpu=preset_or_object("gpu", args.gpu), seq_len=args.seq_len,
            global_batch_size=args.global_batch_size, compute_efficiency=args.compute_efficiency,
            p2p_bandwidth=args.p2p_bandwidth, dp_bandwidth=args.dp_bandwidth, tp_bandwidth=args.tp_bandwidth,
            flash_attention=args.flash_attention, expert_imbalance=args.expert_imbalance,
            route_nodes=args.route_nodes, node_gpus=args.node_gpus, bytes_per_param=args.bytes_per_param,
            grad_bytes=args.grad_bytes, **given)))
        if base.bytes_per_param == default_bytes_per_param(base.dtype_bytes, base.grad_bytes):
            args.bytes_per_param = None  # its default: named in neither the header nor the file name
        if args.jitter < 0 or args.jitter > 1:
            raise UserError(f"--jitter {args.jitter}: must be from 0 to 1")
        for option, value, default in (("--samples", args.samples, SAMPLES), ("--seed", args.seed, 0)):
            if value not in (None, default) and not args.jitter:  # at its default it changes nothing either way
                raise UserError(f"{option} {value}: draws are made only under --jitter above 0; give it, or leave "
                                f"{option} out")
        args.samples, args.seed = args.samples or SAMPLES, args.seed or 0
        if not base.shape.experts or args.expert_parallel == {1}:
            expert_options: tuple[tuple[str, object, object], ...] = (
                ("--expert-imbalance", args.expert_imbalance, 1.0), ("--route-nodes", args.route_nodes, None),
                ("--node-gpus", args.node_gpus, 8), ("--a2a-class", args.a2a_class, "pipeline"))
            why = f"{base.shape.name} has no experts" if not base.shape.experts else \
                "--expert-parallel 1 splits no experts over GPUs"
            for option, setting, unset in expert_options:
                if setting != unset:
                    raise UserError(f"{option} {setting}: {why}, so no all-to-all for it to change; leave it out")
        if not 0 <= args.memory_headroom < base.device.memory_gb:
            raise UserError(f"--memory-headroom {args.memory_headroom:g}: must be from 0 to below the GPU's "
                            f"{base.device.memory_gb:g} GB")
        marks = _marks(args.mark)
        env = {"compute_jitter": args.jitter, "comm_jitter": args.jitter, "seed": args.seed} if args.jitter else {}
        env |= {"a2a_class": args.a2a_class} if args.a2a_class != "pipeline" else {}
        switches = [(word, short) for on, word, short in (
            (base.optimizer_step, "optimizer step", "_opt"), (base.elementwise, "element-wise work", "_ew"),
            (base.flash_attention, "flash attention", "_flash"), (not base.dropout, "no dropout", "_nodrop")) if on]
        pinned = [(key, sorted(getattr(args, key))) for key in DIMENSIONS if getattr(args, key) is not None]
        extras = [*(word for word, _ in switches), *([f"jitter {args.jitter:g} (seed {args.seed})"] if args.jitter
                                                     else []),
                  *(f"{key.replace('_', ' ')} {'/'.join(map(str, values))}" for key, values in pinned),
                  *([f"headroom {args.memory_headroom:g} GB"] if args.memory_headroom else []),
                  *([f"gradients of {args.grad_bytes} bytes"] if args.grad_bytes is not None else []),
                  *([f"{args.bytes_per_param:g} bytes a parameter"] if args.bytes_per_param is not None else []),
                  *([f"expert imbalance {args.expert_imbalance:g}"] if args.expert_imbalance != 1.0 else []),
                  *([f"routed to {counted(args.route_nodes, 'node')}"] if args.route_nodes else []),
                  *([f"{args.node_gpus} GPUs a node"] if args.node_gpus != 8 else []),
                  *(["all-to-all with the syncs"] if args.a2a_class != "pipeline" else []),
                  *([f"tensor degree 1 only ({NO_TENSOR_PARALLEL})"] if base.tp_bandwidth is None else [])]
        output = args.output or Path("outputs/plan") / f"{plan_name(base, args, switches, pinned)}.csv"
        if output.suffix.lower() != ".csv":
            raise UserError(f"--output {output}: the planner writes CSV; give a path ending in .csv")
        figure = output.with_suffix(".png")
        for path in (output, figure):  # a folder or a device in either's place: refused before the search
            output_target(path)
        with exclusive_writer(output):  # a second planner on the same output is refused, naming this one
            # the figure is written with its CSV, and moved into place first: alone, it is what a stopped run left
            if output.exists() and not args.overwrite:
                raise UserError(f"{output} exists; pass --overwrite to replace it or choose another --output")
            with connected(args.cluster, args.workers) as cluster:  # an unreachable one: one line, nothing written
                result, elapsed = _search(base, args, env, cluster)
            rank_by = "p95 iteration" if args.jitter else "iteration"
            heading = (f"{base.shape.name} on {args.gpus} x {base.device.name}, batch {args.global_batch_size} x "
                       f"{base.seq_len} tokens, efficiency {base.compute_efficiency:g}"
                       f"{''.join(', ' + extra for extra in extras)}")
            counts = f"{len(result.tried)} runs simulated of {result.enumerated}"
            print(f"{heading}: {counts} ({result.pruned_memory} too large for memory, {result.pruned_bound} unable "
                  f"to beat those listed), {elapsed:.1f} s")
            if args.by == "layout":
                top = result.best_layouts()
                listed = f"the {len(top)} fastest layouts, each" if len(top) > 1 else "the one layout"  # as many as fit
                print(f"{listed} by its fastest run (--by run lists the {TOP} fastest runs):")
            else:
                top = list(result.ranked[:TOP])
            width = max([len("layout"), *(len(outcome.layout.describe()) for outcome in top)])
            print(f"{'':>3} {'layout':<{width}} {rank_by:>13} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} "
                  f"{'GB/GPU':>7}  policy")
            for rank, outcome in enumerate(top, 1):
                print(f"{rank:>3} {outcome.layout.describe():<{width}} {seconds_text(outcome.seconds):>13} "
                      f"{outcome.tokens_per_second:>10,.0f} {outcome.mfu * base.device.tflops:>8.0f} "
                      f"{outcome.mfu:>6.1%} {outcome.memory_gb:>7.1f}  {outcome.policy}")
            free = base.device.memory_gb - top[0].memory_gb
            if args.memory_headroom < FEW_GB and 0 <= free < FEW_GB:  # what a CUDA context and NCCL's buffers take
                print(f"note: the first leaves {free:.1f} GB of the GPU's {base.device.memory_gb:g} GB free, where a "
                      f"run needs a few GB beyond its parameters and activations (the CUDA context, NCCL's buffers); "
                      f"--memory-headroom {FEW_GB:g} ranks only runs that keep that much")
            estimated = sum(1 for outcome in top if not outcome.full)
            if estimated:
                print(f"{counted(estimated, 'listed run')} of more than {MAX_TASKS:,} tasks "
                      f"{'is' if estimated == 1 else 'are'} extrapolated from two short runs rather than simulated in "
                      f"full (the CSV's simulated column)")
            from ..plotting.plan import MAX_NAMED

            resolved = marked(result, marks)
            named = named_runs(result, resolved)
            drawn = {id(outcome) for outcome, _ in named[:MAX_NAMED]}
            for text, chosen, where in resolved:
                print(f"--mark {text}: {where}" if chosen is None else
                      f"--mark {text}: {where}: {chosen.layout.describe()}, {seconds_text(chosen.seconds)}, "
                      f"{chosen.mfu * base.device.tflops:.0f} TFLOP/s, {chosen.memory_gb:.1f} GB/GPU{_over(chosen)}"
                      + ("" if id(chosen) in drawn else f" (not on the figure, which names {MAX_NAMED} runs at most)"))
            with atomic_output(output) as table, atomic_output(figure) as chart:  # both, or neither
                write_csv(result, table)
                draw(result, chart, f"{heading}\n{counts}", named, rank_by)
        print(f"csv: {output}\nfigure: {figure}")
        return 0

    return run_command(prog, body)


#: Free GB on the GPU below which the planner's first answer gets a note: a run's context and buffers need about that.
FEW_GB = 3.0


def plan_name(base: Workload, args: argparse.Namespace, switches: list[tuple[str, str]],
              pinned: list[tuple[str, list]]) -> str:
    """The default file name: every input that changes the answer (defaults left out), so that a second question
    never lands on the first's answer."""
    words = [f"plan_{safe_name(base.shape.name)}_{args.gpus}x{safe_name(base.device.name)}",
             f"gbs{args.global_batch_size}", f"s{base.seq_len}", f"eff{base.compute_efficiency:g}"]
    for value, default, word in ((args.p2p_bandwidth, 50.0, "p2p"), (args.dp_bandwidth, 50.0, "dp"),
                                 (args.tp_bandwidth, None, "tp"), (args.memory_headroom, 0.0, "headroom"),
                                 (args.expert_imbalance, 1.0, "imb"), (args.route_nodes, None, "rn"),
                                 (args.node_gpus, 8, "node"), (args.a2a_class, "pipeline", "class"),
                                 (args.grad_bytes, None, "grad"), (args.bytes_per_param, None, "bpp")):
        if value != default:
            words.append(f"{word}{value}" if isinstance(value, str) else f"{word}{value:g}")
    words.extend(short.lstrip("_") for _, short in switches)
    if args.jitter:
        words.append(f"j{args.jitter:g}_seed{args.seed}_samples{args.samples}")
    words.extend(f"{key.split('_')[0]}{'-' if isinstance(values[0], str) else ''}{'-'.join(map(str, values))}"
                 for key, values in pinned)
    return "_".join(words)
