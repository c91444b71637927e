"""The single-run visualizers: one simulation, drawn as a Gantt chart, optionally a trace."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..files import atomic_output, exclusive_writer, output_target
from ..inputs import TooLarge, read_at_most
from ..model import (
    COMM_KINDS,
    DEFAULT_POLICY,
    HINDSIGHT,
    KIND_INDEX,
    LOOKAHEAD,
    MIN_PRIORITY,
    PARAMETER,
    PARAMETERS,
    SAMPLES,
    TABLE_SCALES,
    TABLE_WORK,
    EnvParams,
    ParameterError,
    Policy,
    Schedule,
    TaskKind,
)
from ..orders import format_orders, parse_orders
from ..parameters import Dispatchers, Parameter, Weights
from ..results import layout_words, memory_name, safe_name, schedule_name, workload_title
from ..tables import read_table
from ..taskgraph import check_size, estimated_tasks, graph_structure, task_lengths
from ..workload import (
    DERIVED_KEYS,
    GPU_PRESETS,
    MODEL_PRESETS,
    RECOMPUTE_MODES,
    WORKLOAD_KEYS,
    Workload,
    auto_candidates,
    faithful_defaults,
    seconds_text,
    workload_environment,
    workload_report,
)
from .common import (
    Parser,
    UserError,
    bar_width,
    busy_note,
    preset_or_object,
    ready_kernel,
    run_command,
    script_name,
    use_display,
)

#: The GPU of a workload that names none.
_DEFAULT_GPU = next(field.default for field in fields(Workload) if field.name == "gpu")

if TYPE_CHECKING:
    from ..hindsight import Hindsight
    from ..learned import LearnedPolicy

#: The flag that sets each library parameter, for error messages.
FLAGS = {
    **{p.name: p.flag for p in PARAMETERS}, "sample": "--sample", "priorities": "--priority",
    "exclusive_tiers": "--exclusive", "order": "--order",
    **{key: "--" + key.replace("_", "-") for key in WORKLOAD_KEYS},
}

_DESCRIPTIONS = {
    "single_channel": "per GPU a compute row and one communication row, where concurrent transfers "
                      "stack by their bandwidth shares over time",
    "dual_channel": "per GPU a compute row and two communication rows: pipeline transfers "
                    "(fwd_prop, grad_prop) and grad_sync, each stacked by bandwidth share",
}


def _flag_type(p: Parameter) -> Callable[[str], object]:
    """What turns a flag's text into the parameter's value: its type, or for a list its domain's parser, whose
    complaint argparse then says in one line."""
    if not isinstance(p.domain, Weights):
        return p.type

    def parse(text: str) -> object:
        try:
            return p.domain.parse(text, p.name)  # type: ignore[union-attr]
        except ParameterError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return parse


def build_parser(prog: str, layout: str, priorities: Mapping[str, float], tiers: Mapping[str, str]) -> Parser:
    policy = Policy(priorities=priorities, exclusive_tiers=tiers).label
    parser = Parser(
        prog=prog,
        description=f"Simulate one training iteration of a pipeline schedule and draw it as a Gantt chart: "
                    f"{_DESCRIPTIONS[layout]}. Times are model units (1.0 = one forward at full speed by default).",
        epilog=f"Default policy: {policy} (DEFAULT_PRIORITIES / DEFAULT_EXCLUSIVE_TIERS at the top of this "
               f"script). Kinds: {', '.join(COMM_KINDS)}. Example: {prog} -n 8 --num-gpus 4 "
               f"--exclusive grad_sync=a --show-throttling --show-completion-time --no-show")
    groups = {"environment": parser.add_argument_group("environment (see docs/model.md)"),
              "stages": parser.add_argument_group("uneven stages (see docs/model.md section 6.6)"),
              "optimizer": parser.add_argument_group("the optimizer step (see docs/model.md section 6.7)"),
              "strategies": parser.add_argument_group("sharded data parallelism, context parallelism and the "
                                                      "all-to-all of experts (see docs/model.md sections 15, 16)"),
              "schedule": parser.add_argument_group("schedule (see docs/model.md section 6)"),
              "dispatch": parser.add_argument_group("run-time dispatch (see docs/model.md section 12)"),
              "lengths": parser.add_argument_group("a table of lengths: an object 'lengths' of task texts (0F3, 0FP3, "
                                                   "(0F7;7B3)) to lengths, as pipeline_trace.py replay --lengths-out "
                                                   "writes a measured iteration's with the flags of its environment")}
    groups["jitter"] = groups["straggler"] = noise = parser.add_argument_group(
        "noise (see docs/model.md section 8): one sampled iteration is drawn")
    for p in PARAMETERS:
        # the parameters a workload derives default to None, so that giving one beside --model can be refused
        derived = p.name in DERIVED_KEYS
        default = f"default {p.default if p.default != '' else 'none'}" + ("" if not derived else {
            "n": "; with --model, from --global-batch-size when it is given",
            "sync_freq": "; with --model, n (one sync an iteration; 1 under --zero 2 and 3) unless given"}.get(
                p.name, "; derived with --model"))
        groups[p.group].add_argument(*p.flag_names, dest=p.name, type=_flag_type(p), metavar=p.metavar,
                                     default=None if derived else p.default,
                                     help=f"{p.help}; {p.allowed} ({default})")
    groups["dispatch"].add_argument(
        "--order", type=Path, default=None, metavar="FILE",
        help="run this static order instead of the schedule's: per GPU a line 'GPU g: 0F0 0F1 ...', as "
             "--print-order prints it (a dispatcher's choices replayed, say)")
    parser.add_argument_group("compatibility").add_argument(
        "--sync-solo-w", type=float, default=None, metavar="W",
        help="accepted for compatibility with older command lines; has no effect")
    noise.add_argument("--sample", type=int, default=0, help="which draw of the stream to show (default %(default)s)")
    work = parser.add_argument_group(
        "workload (see docs/model.md section 11): with --model, n, the lengths and sync_freq come from a model on "
        "a cluster, and times are seconds")
    work.add_argument("--model", default=None, metavar="NAME|JSON",
                      help=f"a preset ({', '.join(MODEL_PRESETS)}) or a JSON object with layers, hidden, heads, "
                           "ffn_hidden, vocab[, kv_heads, gated_mlp, seq_len; experts, expert_ffn_hidden, top_k, "
                           "shared_experts, dense_layers for a mixture of experts]")
    work.add_argument("--gpu", default=None, metavar="NAME|JSON",
                      help=f"a preset ({', '.join(GPU_PRESETS)}; default {_DEFAULT_GPU}) or a JSON object with tflops, "
                           "memory_gb[, memory_bandwidth, nvlink_bandwidth] (GB/s; memory_bandwidth is needed by "
                           "--elementwise and --optimizer-step, nvlink_bandwidth by --tensor-parallel)")
    for key, kind, text in (
            ("seq_len", int, "tokens per sequence (default: the model's training length)"),
            ("compute_efficiency", float, "achieved share of peak FLOP/s (default 0.5)"),
            ("tensor_parallel", int, "tensor-parallel degree (default 1)"),
            ("context_parallel", int, "context-parallel degree: the sequence split over this many GPUs, their "
                                      "keys and values exchanged on the ports (default 1)"),
            ("data_parallel", int, "data-parallel degree (default 1)"),
            ("shard_group", int, "GPUs --zero shards over, a divisor of --data-parallel (HSDP; default: all of "
                                 "data parallelism)"),
            ("micro_batch_size", int, "sequences per micro-batch (default 1)"),
            ("global_batch_size", int, "sequences per iteration (default: micro-batch size x data parallel x n)"),
            ("dtype_bytes", int, "bytes per activation and gradient value (default 2)"),
            ("bytes_per_param", float, "static bytes per parameter (default 16: weights, gradients, Adam; with "
                                       "--grad-bytes, --dtype-bytes + that + 12)"),
            ("grad_bytes", int, "bytes of a gradient as kept and reduced (default --dtype-bytes; 4: in fp32)"),
            ("p2p_bandwidth", float, "pipeline bandwidth per GPU, GB/s (default 50)"),
            ("dp_bandwidth", float, "data-parallel bandwidth per GPU, GB/s (default 50)"),
            ("expert_parallel", int, "expert-parallel degree of a model with experts: its experts split over this "
                                     "many GPUs of data parallelism, the all-to-all on the ports (default 1)"),
            ("expert_imbalance", float, "the busiest expert GPU's tokens over the mean, stretching expert compute "
                                        "and the all-to-all (default 1)"),
            ("ep_bandwidth", float, "all-to-all bandwidth per GPU, GB/s (default: --dp-bandwidth)"),
            ("route_nodes", int, "node-limited routing: at most this many copies of a token cross the network "
                                 "(default: top_k)"),
            ("node_gpus", int, "GPUs per node: the all-to-all within a node goes over NVLink (default 8)")):
        work.add_argument("--" + key.replace("_", "-"), type=kind, default=None, help=text)
    work.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                      help="sequence parallelism (default: on when --tensor-parallel > 1)")
    work.add_argument("--tp-bandwidth", type=float, default=None, metavar="GB/S",
                      help="tensor-parallel all-reduce bandwidth per GPU (default: half the GPU's NVLink figure, "
                           "one direction)")
    work.add_argument("--layers-per-stage", default=None, metavar="balanced|auto|N,N,...",
                      help="transformer layers of each stage, chunks included (default balanced); auto: the split "
                           "of least bottleneck and its neighbours simulated, the fastest kept")
    for key, text in (("embedding_on_first", "the input embedding's work on the first stage"),
                      ("head_on_last", "the output layer and loss on the last stage")):
        work.add_argument("--" + key.replace("_", "-"), action=argparse.BooleanOptionalAction, default=None,
                          help=f"{text} (default on; off: spread evenly over the stages)")
    work.add_argument("--optimizer-step", action=argparse.BooleanOptionalAction, default=None,
                      help="end the iteration with each GPU's optimizer step, its parameters' bytes_per_param read "
                           "and written at the GPU's memory bandwidth (default on when the GPU states it)")
    work.add_argument("--elementwise", action=argparse.BooleanOptionalAction, default=None,
                      help="add each layer's memory-bound element-wise work (norms, softmax, dropout, activation, "
                           "residual adds) and the loss's at the GPU's memory bandwidth (default on when the GPU "
                           "states it)")
    work.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=None,
                      help="a fused attention kernel: the attention scores neither kept nor moved (default off)")
    work.add_argument("--dropout", action=argparse.BooleanOptionalAction, default=None,
                      help="dropout on the attention probabilities and residual branches, its masks kept and written "
                           "(default: as the model was trained; the Llama presets without)")
    work.add_argument("--recompute", default=None, choices=RECOMPUTE_MODES, type=str.lower,
                      help="activation recomputation (default none)")
    work.add_argument("--recompute-per-stage", default=None, metavar="C,C,...",
                      help="share from 0 to 1 of each stage's layers fully recomputed, chunks included (default: "
                           "--recompute everywhere)")
    pol = parser.add_argument_group("communication policy")
    pol.add_argument("--priority", action="append", default=[], metavar="KIND=VALUE",
                     help=f"shared priority of a transfer kind: 0, or from {MIN_PRIORITY:g} to 1 (repeatable; "
                          f"replaces the defaults)")
    pol.add_argument("--exclusive", action="append", default=[], metavar="KIND=TIER",
                     help="exclusive tier letter of a kind, 'a' highest (repeatable; replaces the defaults)")
    out = parser.add_argument_group("output")
    out.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                     help=f"chart to write, in the format its extension names (.png, .svg, .pdf, .jpg, ...; "
                          f"default outputs/gantt/gantt_{layout}[_<model>]_<schedule>[_<dispatch>]_n<N>_gpus<P>.png, "
                          f"the dispatcher named unless static)")
    out.add_argument("--overwrite", action="store_true", help="replace an existing chart or trace")
    out.add_argument("--allow-large", action="store_true",
                     help="run beyond the size limits: a million tasks, a day's estimated simulation")
    out.add_argument("--trace", type=Path, default=None, metavar="FILE.json",
                     help="also write a Chrome/Perfetto trace (one process per GPU, one thread per channel), "
                          "with the chart: both or neither")
    out.add_argument("--no-show", action="store_true", help="save only, never open a window")
    out.add_argument("--show-throttling", action="store_true",
                     help="outline in red the transfers that a receiver's ingress limit held back")
    out.add_argument("--show-completion-time", action="store_true",
                     help="draw the completion time as a labelled red dashed line")
    out.add_argument("--show-memory", action="store_true",
                     help="add a row per GPU with its activations in flight (micro-batches) over time")
    out.add_argument("--print-order", action="store_true",
                     help="print each GPU's compute order as it ran (0F0 0F1 ... (0F7;7B3) ...; under a dispatcher, "
                          "the order it took)")
    return parser


def _given(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The destinations the command line ``argv`` gives a value to (``parser``'s, without its defaults)."""
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def _environment(args, given: set[str]) -> tuple[EnvParams, Workload | None]:
    """The environment the flags describe, and its workload when --model is given; with a table of lengths, the
    table's flags set the parameters the command line does not (``given``)."""
    env = {p.name: getattr(args, p.name) for p in PARAMETERS if getattr(args, p.name) is not None}
    if 0 <= env.get("slow_gpu", -1) < env.get("num_gpus", PARAMETER["num_gpus"].default) and \
            env.get("slow_factor", PARAMETER["slow_factor"].default) == 1.0:  # a GPU not there is refused as such
        raise ParameterError("slow_gpu", env["slow_gpu"], f"a straggler needs --slow-factor above 1 (at 1, GPU "
                                                          f"{env['slow_gpu']} computes as fast as the others)")
    keys = {key: getattr(args, key) for key in WORKLOAD_KEYS if getattr(args, key) is not None}
    if args.model is None:
        if keys:
            raise ParameterError(next(iter(keys)), next(iter(keys.values())), "needs --model")
        if args.lengths:
            PARAMETER["lengths"].domain.check("lengths", args.lengths)  # a name that is no table's is not opened
            table = read_table(args.lengths.strip()).environment
            for key in (*TABLE_WORK, *TABLE_SCALES):  # the table's own flags, given again, change nothing
                if key in given and env[key] != table.get(key, PARAMETER[key].default):
                    raise ParameterError(key, env[key], "a table of --lengths gives every task's work; leave it out "
                                                        "(the table's flags give its mean)")
            env.update((key, value) for key, value in table.items() if key not in given)
        params = EnvParams(**env)
        if params.zero and not params.gather_len and "zero" in given:
            raise ParameterError("zero", params.zero, "gathers nothing with no --gather-len (or 0; the work of "
                                                      "one all-gather): give it, or --model, which computes it")
        return params, None
    for key in ("model", "gpu"):
        if key in keys:
            keys[key] = preset_or_object(key, keys[key])
    if "recompute_per_stage" in keys:
        keys["recompute_per_stage"] = Weights.parse(keys["recompute_per_stage"], "recompute_per_stage")
    if keys.get("layers_per_stage", "balanced") not in ("balanced", "auto"):
        try:
            keys["layers_per_stage"] = tuple(int(word) for word in keys["layers_per_stage"].replace(",", " ").split())
        except ValueError:
            raise ParameterError("layers_per_stage", keys["layers_per_stage"], "must be balanced, auto or whole "
                                                                               "numbers separated by commas") from None
    workload = Workload(**faithful_defaults(keys))
    return workload_environment(workload, **env), workload


def _check_read(args: argparse.Namespace, params: EnvParams, workload: Workload | None, given: set[str]) -> None:
    """Refuse a flag the run does not read (``config.unread_parameters``), other than at its default, as a sweep
    refuses such a key: it would change nothing, with nothing said."""
    from ..config import unread_parameters

    read = {**params.as_dict(), **({"expert_parallel": workload.expert_parallel} if workload is not None else {})}
    unread = unread_parameters(read, workload is not None)
    defaults = {**{f.name: f.default for f in fields(Workload)}, **EnvParams().as_dict()}
    for name in sorted(given & unread.keys()):
        if getattr(args, name) != defaults[name]:
            raise ParameterError(name, getattr(args, name), f"changes nothing, as {unread[name]}; leave it out")


def _untried(network: LearnedPolicy, params: EnvParams) -> str:
    """A note when the config ``network`` was trained on (its record's ``config``, where that file is still there)
    has no environment of ``params``' schedule, micro-batches and GPUs: its decisions there were never tried."""
    from ..config import ConfigError, EnvironmentGrid

    config = network.about.get("config")
    if not isinstance(config, str) or not Path(config).is_file():
        return ""
    try:
        trained = {(env.schedule, env.n, env.num_gpus, env.v) for env in EnvironmentGrid.load(config)}
    except (ConfigError, ParameterError, OSError):
        return ""
    if (params.schedule, params.n, params.num_gpus, params.v) in trained:
        return ""
    return (f"note: {params.dispatch[len('learned:'):]} was trained on {config}, which has no {params.schedule} of "
            f"{params.n} micro-batches on {params.num_gpus} GPUs: its decisions here were never tried")


#: The largest order file read: a million tasks' names, several times over.
MAX_ORDER_BYTES = 64 * 2 ** 20


def _read_order(path: Path) -> list[list[str]]:
    """The order ``path`` holds (``--order``), read once and no further than ``MAX_ORDER_BYTES``."""
    try:
        text = read_at_most(path, MAX_ORDER_BYTES).decode()
    except TooLarge as error:
        raise UserError(f"--order {path}: {error}; an order file is one line per GPU") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"--order {path}: cannot be read ({getattr(error, 'strerror', None) or error})") from None
    return parse_orders(text)


#: What the chart may be saved as, by file extension.
IMAGE_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf", ".jpg": "jpg", ".jpeg": "jpg", ".eps": "eps",
                 ".ps": "ps", ".tif": "tif", ".tiff": "tif", ".webp": "webp"}


def _image_format(path: Path) -> str:
    """The format the output's extension names; an unknown extension is refused."""
    found = IMAGE_FORMATS.get(path.suffix.lower())
    if found is None:
        raise UserError(f"--output {path}: the extension {path.suffix or '(none)'!r} names no image format; "
                        f"use one of {', '.join(IMAGE_FORMATS)}")
    return found


def _pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep or kind not in COMM_KINDS:
            raise UserError(f"{flag} {item!r}: expected KIND=VALUE with KIND one of {', '.join(COMM_KINDS)}")
        if kind in pairs:
            raise UserError(f"{flag} {item!r}: {kind} is given twice ({flag} {kind}={pairs[kind]} too); give it once")
        pairs[kind] = value
    return pairs


def _policy(args, priorities: Mapping[str, float], tiers: Mapping[str, str]) -> Policy:
    if args.priority or args.exclusive:
        priorities, tiers = {}, {}
        for kind, value in _pairs(args.priority, "--priority").items():
            try:
                priorities[kind] = float(value)
            except ValueError:
                raise UserError(f"--priority {kind}={value!r}: the priority must be a number: 0, or from "
                                f"{MIN_PRIORITY:g} to 1") from None
        tiers = _pairs(args.exclusive, "--exclusive")
        both = [kind for kind in tiers if kind in priorities]
        if both:  # an exclusive kind sends alone in its tier: a shared priority would be ignored
            raise UserError(f"--priority {both[0]}={priorities[both[0]]:g}: {both[0]} is exclusive (--exclusive "
                            f"{both[0]}={tiers[both[0]]}), which takes no shared priority; give one of the two")
    return Policy(priorities=priorities, exclusive_tiers=tiers)


def main(argv: Sequence[str] | None = None, *, layout: str, prog: str,
         default_priorities: Mapping[str, float], default_exclusive_tiers: Mapping[str, str]) -> int:
    args = build_parser(prog, layout, default_priorities, default_exclusive_tiers).parse_args(argv)
    given = _given(build_parser(prog, layout, default_priorities, default_exclusive_tiers), argv)

    def body() -> int:
        from ..engine import given_order, memory_in_force, order_peak  # the simulator, once the arguments are read
        from ..learned import load_policy

        try:
            params, workload = _environment(args, given)
            _check_read(args, params, workload, given)
            SAMPLES.check("sample", args.sample)
            if args.sample and not params.jittered:  # every sample of a noise-free run is the same
                raise ParameterError("sample", args.sample, "changes nothing, as no length is drawn (compute_jitter "
                                                            "and comm_jitter 0); leave it out")
            policy = _policy(args, default_priorities, default_exclusive_tiers)
            try:
                if not args.allow_large:
                    check_size(params, " (pass --allow-large to try anyway)")
            except ParameterError as error:  # the product of two flags, or of the workload's batch and layout
                raise UserError(("-n and --num-gpus" if workload is None else "-n and --pipeline-parallel"
                                 if "n" in given else "--global-batch-size and --pipeline-parallel (n is the global "
                                 "batch over the micro-batch size and the data-parallel degree)") + f": {error}"
                                ) from None
            texts = None if args.order is None else _read_order(args.order)
            order = None if texts is None else given_order(params, texts)
            if params.lengths:
                if workload is not None:
                    raise UserError(f"--lengths {params.lengths}: a table of lengths replaces the work --model "
                                    "derives; give one or the other")
                task_lengths(params)  # a table that cannot be read, or lacks a task of the environment
            memory_in_force(params, None if order is None else order_peak(params, order))
            network = load_policy(params) if params.learned else None  # read once, played below
            if network is not None and (note := _untried(network, params)):
                print(note, file=sys.stderr, flush=True)
        except ParameterError as error:
            flag = FLAGS.get(error.name.split("[")[0], error.name)
            if error.name == "n" and args.model is not None and "n" not in given:  # n is the workload's, not given
                flag = "--global-batch-size (n is the global batch over the micro-batch size and the data-parallel " \
                       "degree)"
            raise UserError(f"{flag}: {error}") from None
        output = args.output or Path("outputs/gantt") / default_chart_name(layout, params, workload)
        output_target(output)  # a folder, a device or a FIFO is refused before its extension is judged
        image_format = _image_format(output)
        if args.trace is not None:
            if output_target(args.trace) == output_target(output):
                raise UserError(f"--trace and --output are both {output}; give them different paths")
            if args.trace.suffix.lower() != ".json":
                raise UserError(f"--trace {args.trace}: a trace is JSON; give a path ending in .json")
        with exclusive_writer(output), exclusive_writer(args.trace):
            for path in (output, args.trace):  # both are written whole, then moved into place one after the other
                if path is not None and path.exists() and not args.overwrite:
                    raise UserError(f"{path} exists; pass --overwrite to replace it or choose another "
                                    f"{'--output' if path == output else '--trace'}")
            return draw(args, params, workload, policy, network, texts, output, image_format, layout)

    return run_command(prog, body)


def default_chart_name(layout: str, params: EnvParams, workload: Workload | None = None) -> str:
    """``gantt_<layout>[_<model>[_t<t>_c<c>_d<d>_e<e>_z<zero>]]_<schedule>[_<dispatch>]_n<N>_gpus<P>.png``: a model's
    chart says which, with each degree and zero stage other than 1 and 0, and a dispatcher's chart, unless static,
    says which (a learned one by its file's stem), so that neither replaces another's."""
    domain = PARAMETER["dispatch"].domain
    assert isinstance(domain, Dispatchers)
    way = "" if params.dispatch == "static" else "_" + domain.file_name(domain.shown(params.dispatch))
    model = ""
    if workload is not None:
        degrees = (("t", workload.tensor_parallel, 1), ("c", workload.context_parallel, 1),
                   ("d", workload.data_parallel, 1), ("e", workload.expert_parallel, 1), ("z", params.zero, 0))
        model = "_" + safe_name(workload.shape.name) + "".join(f"_{letter}{value}" for letter, value, plain in degrees
                                                               if value != plain)
    return f"gantt_{layout}{model}_{params.schedule}{way}_n{params.n}_gpus{params.num_gpus}.png"


#: A chart's run estimated to take this long or longer (``cost``, a slow day's seconds) is simulated in a process of
#: its own: a look-ahead or hindsight run of minutes.
APART_SECONDS = 2.0


def simulated(job: tuple[EnvParams, Policy, int, LearnedPolicy | None, list[list[str]] | None]) \
        -> tuple[Schedule, Hindsight | None]:
    """The chart's run of ``job`` (its environment, policy, draw, learned network and given order), and for a
    hindsight run the order the solver found."""
    from ..engine import simulate
    from ..hindsight import hindsight, simulate_hindsight
    from ..learned import simulate_learned
    from ..lookahead import simulate_lookahead
    from ..parallel import shared_values

    params, policy, sample, network, texts = job
    schedule = simulate_learned(params, policy, sample, network) if params.learned else \
        simulate_hindsight(params, policy, sample) if params.dispatch == HINDSIGHT else \
        simulate_lookahead(params, policy, sample, progress=shared_values()) if params.dispatch == LOOKAHEAD else \
        simulate(params, policy, sample, texts)
    return schedule, hindsight(params, sample) if params.dispatch == HINDSIGHT else None


@contextlib.contextmanager
def _followed(params: EnvParams, tasks: int) -> Iterator[tuple[Any, Callable[[], None] | None]]:
    """For a look-ahead run apart, the value its process keeps at the tasks ended (``shared_values``) and what reads
    it into a bar on a terminal, with the time left at most: each decision runs the rest of the iteration once per
    candidate, so that a task costs less the later it comes, by as much as the schedule's candidates say (no
    share of the work holds across schedules). Other runs report nothing while they run: (None, None)."""
    if params.dispatch != LOOKAHEAD:
        yield None, None
        return
    from tqdm import tqdm

    from ..parallel import shared_count

    ticks = shared_count()
    bar = tqdm(total=tasks, file=sys.stderr, **bar_width(), mininterval=0.5, smoothing=0, leave=False, disable=None,
               bar_format="{percentage:3.0f}%|{bar}| {n:,}/{total:,} tasks ended [{elapsed}, at most {remaining} "
                          "left]")

    def waiting() -> None:
        bar.update(max(0, min(int(ticks[0]), tasks) - bar.n))

    try:
        yield ticks, waiting
    finally:
        bar.close()


def _batches(count: float) -> str:
    return f"{count:g} micro-batch{'' if count == 1 else 'es'}"


def draw(args: argparse.Namespace, params: EnvParams, workload: Workload | None, policy: Policy,
         network: LearnedPolicy | None, texts: list[list[str]] | None, output: Path, image_format: str,
         layout: str) -> int:
    """Simulate the chart's run, draw it into ``output`` (locked by the caller) and report it."""
    from ..cost import MAX_HOURS, draw_seconds, simulation_seconds
    from ..engine import SimulationStuckError, bound_of_run, graph_arrays, memory_bound, simulate_figures
    from ..hindsight import FALLBACK_RULES, SOLVED_TASKS, static_params
    from ..metrics import ideal_time, schedule_metrics
    from ..parallel import ordered_map
    from ..trace import chrome_trace

    splits = workload.layers_per_stage == "auto" if workload is not None else False  # each split's figures
    ready_kernel(episodes=bool(params.learned) or params.dispatch == LOOKAHEAD,
                 parts=("figures", "records") if splits else ("records",))
    auto = ""
    if workload is not None and splits:
        # every candidate split under this policy and draw; the first is balanced, which auto is measured against
        timed = [(float(simulate_figures(p, [policy], args.sample)[0, 0]), w, p)
                 for w, p in auto_candidates(workload, params)]
        best = min(range(len(timed)), key=lambda i: timed[i][0])  # ties keep the first: balanced
        time, workload, params = timed[best]
        assert isinstance(workload.layers_per_stage, tuple)
        auto = (f"layers per stage (auto): {' '.join(map(str, workload.layers_per_stage))}, "
                f"{1.0 - time / timed[0][0]:.2%} faster than balanced ({seconds_text(timed[0][0])}; "
                f"{len(timed)} splits simulated)")
    job = (params, policy, args.sample, network, texts)
    tasks = estimated_tasks(params)
    seconds = simulation_seconds(params, tasks) + draw_seconds(params, tasks)
    hours = seconds / 3600
    about = f"{hours:,.2g} hours" if 1 <= hours < 10 else f"{hours:,.0f} hours" if hours >= 10 else \
        f"{seconds / 60:.2g} min" if seconds >= 60 else f"{seconds:.2g} s"
    if hours > MAX_HOURS and not args.allow_large:
        raise UserError(f"{params.dispatch} dispatch of {params.n:,} micro-batches on {params.num_gpus} GPUs would "
                        f"take up to about {about} (by a slow day's estimate); at most {MAX_HOURS} hours are allowed "
                        f"(fewer micro-batches or GPUs, or pass --allow-large)")
    try:
        if seconds < APART_SECONDS:
            schedule, found = simulated(job)
        else:  # in a process of its own, which Ctrl-C stops at once: compiled work does not return until done
            print(f"simulating: up to about {about} (by a slow day's estimate{busy_note()})", file=sys.stderr,
                  flush=True)
            with _followed(params, tasks) as (ticks, waiting):
                (schedule, found), = ordered_map(simulated, [job], 1, isolate=True, ticks=ticks, waiting=waiting)
    except SimulationStuckError as error:
        if args.order is None:
            raise
        raise UserError(f"--order {args.order}: the order cannot run to its end: {error}") from None
    if args.print_order:
        print(format_orders(schedule.order_text()))
    metrics = schedule_metrics(schedule)
    # the environment's own, as a sweep gives it: a hindsight run's schedule is a static replay of its order, whose
    # ideal would be the schedule's static order's, under no memory limit
    ideal = ideal_time(params, network)
    report = workload_report(workload, params, schedule.completion_time, metrics.gpu_peak_activations) \
        if workload is not None else None
    name = ", ".join(filter(None, (schedule_name(params), memory_name(params, schedule.memory_limit),
                                   f"the order of {args.order.name}" if args.order else "")))
    if params.jittered:
        name += f", sample {args.sample} of seed {params.seed}"

    show = use_display(args.no_show)
    import matplotlib.pyplot as plt

    from ..plotting import fitted
    from ..plotting.gantt import LAYOUTS, chart_height, gantt_title, plot_gantt
    from ..plotting.png import save_figure

    rows = params.num_gpus * (len(LAYOUTS[layout]) + args.show_memory + 0.5)
    # wide enough that the shortest compute bar holds a short label, within what a screen can take; an
    # optimizer step, however short, does not widen the chart, nor does a bar of almost nothing (a measured
    # first stage's input gradient, which computes nothing) among the others
    run = schedule.run
    works = run.length[(run.part_kind[:, 0] >= 0) & (run.length > 0)
                       & (run.kind != KIND_INDEX[TaskKind.OPTIMIZER_STEP])]
    shortest = max(float(works.min()), float(np.median(works)) / 3) if works.size else schedule.completion_time
    width = min(max(12.0, schedule.completion_time / shortest * 0.22), 40.0)
    fig, ax = plt.subplots(figsize=(width, chart_height(rows)), layout="constrained")
    plot_gantt(ax, schedule, layout=layout, show_throttling=args.show_throttling,
               show_completion_time=args.show_completion_time, show_memory=args.show_memory,
               stage_chunk=graph_structure(params).stage_chunk.tolist(), seconds=workload is not None)
    # left-aligned over the axes, which start a tenth of the way in
    title = gantt_title(schedule, schedule_name=name, ideal_time=ideal,
                        workload=workload_title(params, workload) if workload else None)
    ax.set_title(fitted(title, fig, 9, share=0.88), fontsize=9, loc="left")
    with atomic_output(output) as temporary, \
            (atomic_output(args.trace) if args.trace else contextlib.nullcontext()) as trace:  # both, or neither
        save_figure(fig, temporary, 130, image_format)  # a 64-GPU chart's 46 million pixels: the fast PNG writer
        if trace is not None:
            trace.write_text(json.dumps(chrome_trace(schedule)))
    peak = metrics.peak_activations
    unit = " s" if workload is not None else ""
    if workload is None and params.lengths and (named := read_table(params.lengths).unit):
        unit = f" {named}"  # a table's lengths are in the unit it names (ms from a trace)
    held = bound_of_run(memory_bound(schedule.params, args.sample, schedule.memory_limit), schedule.completion_time,
                        schedule.params)
    within = "" if held <= schedule.lower_bound else \
        f"; memory-aware bound {held:.6g}{unit}, at most {_batches(schedule.memory_limit)} of activations " \
        f"in flight: {schedule.completion_time / held - 1:.1%} above it"
    print(f"{name}: completion time {schedule.completion_time:.6g}{unit} (ideal {ideal:.6g}{unit}, lower bound "
          f"{schedule.lower_bound:.6g}{unit}: {schedule.bound_gap:.1%} above it{within}), peak activations "
          f"{_batches(peak)}; chart: {output}")
    if found is not None:
        tasks = len(graph_arrays(static_params(params)).gpu)
        print("  the hindsight order: " + {
            "optimal": f"proven optimal on the fixed-delay relaxation ({found.relaxed:.6g}{unit} there)",
            "feasible": f"the solver's best within its work limit ({found.relaxed:.6g}{unit} on the fixed-delay "
                        f"relaxation, where no order beats {found.relaxed_bound:.6g}{unit})",
            "heuristic": f"the fastest on this draw of the orders {', '.join(FALLBACK_RULES[:-1])} and "
                         f"{FALLBACK_RULES[-1]} take (" + (f"{tasks:,} tasks; the solver takes {SOLVED_TASKS:,} at most"
                                                            if tasks > SOLVED_TASKS else
                                                            "the solver found no order within its limit") + ")"
        }[found.status]
              + ("" if schedule.given_order else "; the schedule's static order, faster on this draw, was run"))
    if report is not None and workload is not None:
        recompute = [] if workload.recompute == "none" else [f"{workload.recompute} recomputation"]
        label = workload.label(params.num_gpus, params.n, params.zero) + \
            "".join(f", {word}" for word in [*recompute, *layout_words(workload, short=False)])
        print("\n".join(f"  {line}" for line in [label] + report.lines() + ([auto] if auto else [])))
    if args.trace:
        print(f"trace: {args.trace}")
    if show:
        plt.show()
    plt.close(fig)
    return 0


def script_attribute(name: str) -> object:
    """A visualizer script's ``__getattr__``: ``calculate_full_pipeline_schedule``, part of the scripts' API, loaded
    when first asked for, as it brings the compiler, which ``--help`` does not need."""
    if name != "calculate_full_pipeline_schedule":
        raise AttributeError(f"a visualizer script has no attribute {name!r}")
    from ..engine import calculate_full_pipeline_schedule

    return calculate_full_pipeline_schedule


def script_main(layout: str, default_priorities: Mapping[str, float],
                default_exclusive_tiers: Mapping[str, str]) -> int:
    """Entry point of a visualizer script, with that script's default policy."""
    return main(sys.argv[1:], layout=layout, prog=script_name(sys.argv[0]), default_priorities=default_priorities,
                default_exclusive_tiers=default_exclusive_tiers)


def single_channel() -> int:
    """Console entry point ``pipeline-sim-gantt``: the single-channel visualizer with the default policy."""
    return script_main("single_channel", DEFAULT_POLICY.priorities, DEFAULT_POLICY.exclusive_tiers)


def dual_channel() -> int:
    """Console entry point ``pipeline-sim-gantt-dual``: the dual-channel visualizer with the default policy."""
    return script_main("dual_channel", DEFAULT_POLICY.priorities, DEFAULT_POLICY.exclusive_tiers)
