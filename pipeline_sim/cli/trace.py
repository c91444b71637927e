"""pipeline_trace.py: record real PyTorch pipeline runs, replay their traces, predict other schedules from them."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from statistics import median
from typing import Sequence

from ..files import atomic_output
from ..measured import fit_comm, read_run
from ..replay import predicted_time, replay, runtime_costs
from ..schedules import SCHEDULES, get_schedule
from ..tracestudy import SOURCE, study
from .common import Parser, UserError, positive_int, run_command, script_name, use_display

#: The schedules PyTorch runs that the simulator also has (``recorder.TORCH_SCHEDULES``; said here without torch).
RECORDABLE = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v")


def build_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, description=(
        "Real pipeline runs against the simulator. 'record' runs a stack of MLP blocks with "
        "torch.distributed.pipelining, one single-threaded process per rank, and writes each rank's torch.profiler "
        "trace (needs pip install \"pipeline-sim[trace]\"); 'replay' simulates each traced iteration on its measured "
        "lengths and compares the timelines; 'predict' simulates other schedules on a trace's lengths; 'study' does "
        "all of it over a folder of recorded rounds."))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    record = commands.add_parser("record", help="run schedules for real and trace them", description=(
        "Run each schedule --rounds times, in turn, writing OUT/<schedule>/run<r>/rank<k>.json.gz."))
    record.add_argument("--out", required=True, type=Path, help="folder to write the traces into")
    record.add_argument("--schedule", nargs="+", default=list(RECORDABLE), choices=RECORDABLE,
                        help="schedules to run (default: all)")
    record.add_argument("--rounds", type=positive_int, default=1, help="runs of each schedule (default 1)")
    record.add_argument("--iterations", type=positive_int, default=3, help="traced iterations per run (default 3)")
    record.add_argument("--microbatches", type=positive_int, default=8, help="micro-batches (default 8)")
    record.add_argument("--ranks", type=positive_int, default=2, help="processes, one per rank (default 2)")
    record.add_argument("--batch", type=positive_int, default=64, help="rows per micro-batch (default 64)")
    record.add_argument("--width", type=positive_int, default=512, help="hidden size (default 512)")
    record.add_argument("--layers", type=positive_int, default=8,
                        help="Linear+ReLU layers of the model, split evenly over the stages (default 8)")
    record.add_argument("--backend", default="gloo", choices=("gloo", "nccl"), help="default gloo (CPU)")
    record.add_argument("--port", type=positive_int, default=29517, help="the rendezvous port (default 29517)")

    replay = commands.add_parser("replay", help="simulate traced iterations on their measured lengths", description=(
        "Replay every iteration of a traced run (a folder of one trace per rank) in the order each rank ran it, on "
        "its measured lengths; print the iteration error and the per-task start error."))
    replay.add_argument("run", type=Path, nargs="+", help="a run's folder or its rank files")
    replay.add_argument("--schedule", choices=list(SCHEDULES), help="the schedule run (default: named in the trace)")
    replay.add_argument("--plot", type=Path, help="draw measured and simulated Gantt charts of --iteration to PNG")
    replay.add_argument("--iteration", type=int, default=0,
                        help="which traced iteration to draw or write (default 0)")
    replay.add_argument("--lengths-out", type=Path, metavar="FILE.json",
                        help="write --iteration's length of every task, and its environment, as JSON: the visualizers "
                             "read it with --lengths")

    predict = commands.add_parser("predict", help="predict other schedules from one trace", description=(
        "Simulate each schedule on the lengths measured in SOURCE (each stage's mean forward and backward, the "
        "measured spread of its actions put back as jitter); with --runtime-from, the runtime's costs (its time "
        "between actions, what a split backward costs) as measured on those runs; with --measured runs, compare "
        "with their measured iteration time."))
    predict.add_argument("source", type=Path, help="the folder of the traced run to predict from")
    predict.add_argument("--schedule", nargs="+", default=list(RECORDABLE), choices=list(SCHEDULES),
                         help="schedules to predict (default: all that PyTorch runs)")
    predict.add_argument("--microbatches", type=positive_int, help="micro-batches (default: the source's)")
    predict.add_argument("--runtime-from", type=Path, nargs="+", metavar="RUN",
                         help="run folders (of other schedules) to measure the runtime's costs on (default: the "
                              "source's own time between actions; a split backward costs a whole one)")
    predict.add_argument("--measured", type=Path, nargs="*", default=[],
                         help="run folders to compare with (those of the same micro-batch count)")

    study = commands.add_parser("study", help="replay, predict and spread over a folder of recorded rounds",
                                description="Every figure of the README's table, from OUT of 'record --rounds'.")
    study.add_argument("folder", type=Path, help="OUT of record: <schedule>/run<r>/ folders")
    return parser


def _record(args) -> int:
    if importlib.util.find_spec("torch") is None:
        raise UserError("record needs torch: pip install \"pipeline-sim[trace]\" (requirements-trace.txt)")
    from torch.multiprocessing.spawn import ProcessException

    from ..recorder import RunSpec, launched, record_rounds

    if launched() and int(os.environ["WORLD_SIZE"]) != args.ranks:
        raise UserError(f"--ranks {args.ranks}: the launcher started {os.environ['WORLD_SIZE']} processes; give "
                        "--ranks the same number")
    specs = [RunSpec(name, ranks=args.ranks, microbatches=args.microbatches, batch=args.batch, width=args.width,
                     layers=args.layers, iterations=args.iterations, backend=args.backend, port=args.port)
             for name in args.schedule]
    for spec in specs:
        get_schedule(spec.schedule).check(spec.microbatches, spec.ranks)
        if spec.layers % spec.stages:
            raise UserError(f"--layers {spec.layers}: must be a multiple of {spec.schedule}'s {spec.stages} stages")
    total = len(specs) * args.rounds
    speaks = not launched() or os.environ["RANK"] == "0"  # under a launcher, one rank reports for all
    if speaks:
        print(f"recording {len(specs)} schedule(s) x {args.rounds} round(s) into {args.out}", file=sys.stderr)
    try:
        for done, folder in enumerate(record_rounds(specs, args.out, args.rounds), 1):
            if speaks:
                print(f"[{done}/{total}] {folder}", flush=True)
    except ProcessException as error:  # a rank failed: PyTorch's own message, on its last line, says why
        lines = [line for line in str(error).splitlines() if line.strip()]
        raise UserError(f"a rank failed: {lines[-1].strip() if lines else error}") from None
    return 0


def _replay(args) -> int:
    run = read_run(args.run, args.schedule)
    comm = fit_comm(run.iterations)
    print(f"{run.schedule}: {run.ranks} ranks, {run.stages} stages, {run.microbatches} micro-batches, "
          f"{len(run.iterations)} iterations; transfers: {comm.time(0) * 1e3:.0f} us + bytes / "
          f"{comm.bandwidth / 1e3:.3g} MB/s, from {comm.samples} waited-for transfers")
    results = [replay(run, k, comm) for k in range(len(run.iterations))]
    for k, result in enumerate(results):
        print(f"iteration {k}: measured {result.measured.completion_time:.2f} ms, simulated "
              f"{result.simulated.completion_time:.2f} ms ({result.iteration_error:+.1%}); task start error median "
              f"{median(result.start_errors):.1%}, worst {max(result.start_errors):.1%}")
    if (args.plot or args.lengths_out) and not 0 <= args.iteration < len(results):
        raise UserError(f"--iteration {args.iteration}: must be from 0 to {len(results) - 1}")
    if args.lengths_out:
        simulated = results[args.iteration].simulated
        params = simulated.params
        # the environment as replayed; its mean lengths only set the ideal time that a chart's title quotes
        flags = {"--schedule": params.schedule, "-n": params.n, "--num-gpus": params.num_gpus,
                 "--chunks": params.chunks, "--fwd-len": f"{params.fwd_len:.6g}", "--bwd-len": f"{params.bwd_len:.6g}",
                 "--prop-len": f"{params.prop_len:.6g}", "--sync-base-len": 0, "--fwd-impact": 0, "--bwd-impact": 0}
        table = {"flags": " ".join(f"{flag} {value}" for flag, value in flags.items()),
                 "lengths": {str(task.id): task.length for task in simulated.tasks}}
        with atomic_output(args.lengths_out) as temporary:
            temporary.write_text(json.dumps(table, indent=1))
        print(f"wrote {args.lengths_out}; the visualizers draw it with {table['flags']} --lengths {args.lengths_out}")
    if args.plot:
        use_display(True)
        from ..plotting.replay import replay_figure

        figure = replay_figure(results[args.iteration], title=f"{run.schedule}, iteration {args.iteration}")
        with atomic_output(args.plot) as temporary:
            figure.savefig(temporary, format="png", dpi=110)
        print(f"wrote {args.plot}")
    return 0


def _predict(args) -> int:
    source = read_run([args.source])
    comm = fit_comm(source.iterations)
    measured: dict[str, list[float]] = {}
    n = args.microbatches or source.microbatches
    for folder in args.measured:
        run = read_run([folder])
        if run.microbatches == n:
            measured.setdefault(run.schedule, []).extend(it.time for it in run.iterations)
    runtime = runtime_costs([read_run([folder]) for folder in args.runtime_from], source) if args.runtime_from \
        else None
    for schedule in args.schedule:
        time = median(predicted_time(source, k, comm, schedule, runtime=runtime, microbatches=n)
                      for k in range(len(source.iterations)))
        line = f"{schedule:>17}: predicted {time:8.2f} ms"
        if schedule in measured:
            real = median(measured[schedule])
            line += f", measured {real:8.2f} ms ({time / real - 1:+.1%})"
        print(line)
    return 0


def _study(args) -> int:
    print("| schedule | runs x iterations | measured (ms) | spread (CV) | replay error median (worst) | task start "
          f"error median (worst) | predicted from {SOURCE} (ms) | error | with the others' runtime costs (ms) | error "
          "| task CV | jitter model's CV | time posting sends |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for f in study(args.folder):
        predicted = "" if f.predicted_ms is None else f"{f.predicted_ms:.1f}"
        error = "" if f.prediction_error is None else f"{f.prediction_error:+.1%}"
        calibrated = "" if f.calibrated_ms is None else f"{f.calibrated_ms:.1f}"
        calibrated_error = "" if f.calibrated_error is None else f"{f.calibrated_error:+.1%}"
        print(f"| {f.schedule} | {f.runs} x {f.iterations // f.runs} | {f.measured_ms:.1f} | {f.spread:.1%} | "
              f"{f.replay_error:.1%} ({f.replay_worst:.1%}) | {f.start_median:.1%} ({f.start_worst:.0%}) | "
              f"{predicted} | {error} | {calibrated} | {calibrated_error} | {f.task_cv:.1%} | {f.jitter_spread:.1%} | "
              f"{f.send_posting:.1%} |")
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    args = build_parser(prog).parse_args(argv)
    commands = {"record": _record, "replay": _replay, "predict": _predict, "study": _study}
    return run_command(prog, lambda: commands[args.command](args))
