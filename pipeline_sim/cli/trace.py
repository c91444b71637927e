"""pipeline_trace.py: record real PyTorch pipeline runs, replay their traces, predict other schedules from them."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
from contextlib import suppress
from pathlib import Path
from statistics import median
from typing import Sequence

from ..files import atomic_output, output_target
from ..measured import CommFit, MeasuredRun, TraceError, fit_comm, input_lead, read_run
from ..model import EnvParams
from ..parameters import ParameterError
from ..schedules import SCHEDULES, get_schedule
from ..taskgraph import MAX_TASKS, estimated_tasks
from .common import Parser, UserError, command_to_resume, counted, positive_int, run_command, script_name, use_display

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
    record.add_argument("--schedule", nargs="+", default=list(RECORDABLE), choices=RECORDABLE, type=str.lower,
                        help="schedules to run (default: all)")
    record.add_argument("--rounds", type=positive_int, default=1, help="runs of each schedule (default 1)")
    record.add_argument("--iterations", type=positive_int, default=3, help="traced iterations per run (default 3)")
    record.add_argument("--microbatches", type=positive_int, default=8, help="micro-batches (default 8)")
    record.add_argument("--ranks", type=positive_int, default=2, help="processes, one per rank (default 2)")
    record.add_argument("--batch", type=positive_int, default=64, help="rows per micro-batch (default 64)")
    record.add_argument("--width", type=positive_int, default=512, help="hidden size (default 512)")
    record.add_argument("--layers", type=positive_int, default=None,
                        help="Linear+ReLU layers of the model, split evenly over the stages (default 8)")
    record.add_argument("--backend", default="gloo", choices=("gloo", "nccl"), help="default gloo (CPU)")
    record.add_argument("--overwrite", action="store_true",
                        help="replace the traces of runs already in --out (without it, they are refused)")
    record.add_argument("--resume", action="store_true",
                        help="keep the runs already whole in --out with these settings (an interrupted recording's) "
                             "and record only the others")
    record.add_argument("--port", type=port_number, default=29517,
                        help="the rendezvous port (default 29517; under torchrun, its --master-port instead)")

    replay = commands.add_parser("replay", help="simulate traced iterations on their measured lengths", description=(
        "Replay every iteration of a traced run (a folder of one trace per rank) in the order each rank ran it, on "
        "its measured lengths; print the iteration error and the per-task start error."))
    replay.add_argument("run", type=Path, nargs="+", help="a run's folder or its rank files")
    replay.add_argument("--schedule", choices=list(SCHEDULES), type=str.lower,
                        help="the schedule run (default: named in the trace)")
    replay.add_argument("--plot", type=Path, help="draw measured and simulated Gantt charts of --iteration to this "
                                                  "image (.png, .svg or .pdf)")
    replay.add_argument("--iteration", type=int, default=0,
                        help="which traced iteration to draw or write (default 0)")
    replay.add_argument("--lengths-out", type=Path, metavar="FILE.json",
                        help="write --iteration's length of every task, and its environment, as JSON: the visualizers "
                             "read it with --lengths, a sweep config with the key lengths")
    replay.add_argument("--overwrite", action="store_true",
                        help="replace an existing --plot or --lengths-out file (without it, it is refused)")

    predict = commands.add_parser("predict", help="predict other schedules from one trace", description=(
        "Simulate each schedule on the lengths measured in SOURCE (each stage's mean forward and backward, the "
        "measured spread of its actions put back as jitter); with --runtime-from, the runtime's costs (its time "
        "between actions, what a split backward costs) as measured on those runs; with --measured runs, compare "
        "with their measured iteration time."))
    predict.add_argument("source", type=Path, help="the folder of the traced run to predict from")
    predict.add_argument("--schedule", nargs="+", default=list(RECORDABLE), choices=list(SCHEDULES), type=str.lower,
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


#: The chart formats of ``replay --plot``, by file name.
PLOT_FORMATS = (".png", ".svg", ".pdf")


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: must be from 1 to 65535")
    return value


def _record(args) -> int:
    if importlib.util.find_spec("torch") is None:
        raise UserError("record needs torch: pip install \"pipeline-sim[trace]\" (requirements-trace.txt)")
    from torch.multiprocessing.spawn import ProcessException

    from ..recorder import RunSpec, launched, record_rounds, recorded

    if launched() and args.resume:  # the ranks must agree on the runs they skip, and a host sees its own traces only
        raise UserError("--resume: under a launcher each host holds only its own ranks' traces, so which runs are "
                        "whole is not known here; record the remaining rounds into another --out")
    if launched() and int(os.environ["WORLD_SIZE"]) != args.ranks:
        raise UserError(f"--ranks {args.ranks}: the launcher started {os.environ['WORLD_SIZE']} processes; give "
                        "--ranks the same number")
    layers = {"layers": args.layers} if args.layers else {}  # else the recorder's default
    specs = [RunSpec(name, ranks=args.ranks, microbatches=args.microbatches, batch=args.batch, width=args.width,
                     iterations=args.iterations, backend=args.backend, port=args.port, **layers)
             for name in dict.fromkeys(args.schedule)]  # a schedule named twice is recorded once
    for spec in specs:
        try:
            get_schedule(spec.schedule).check(spec.microbatches, spec.ranks)
        except ParameterError as error:
            raise UserError(f"--microbatches {spec.microbatches}: {error}") from None
        if spec.microbatches < spec.least_microbatches:
            raise UserError(f"--microbatches {spec.microbatches}: PyTorch's {spec.schedule} needs at least one per "
                            f"stage, {spec.least_microbatches}")
        if spec.layers % spec.stages:
            raise UserError(f"--layers {spec.layers}: must be a multiple of {spec.schedule}'s {spec.stages} stages"
                            if args.layers else f"--ranks {spec.ranks}: {spec.schedule}'s {spec.stages} stages do not "
                            f"divide the model's {spec.layers} layers (--layers, by default); give --layers a "
                            f"multiple of {spec.stages}")
    if not _backend_available(args.backend):
        raise UserError(f"--backend {args.backend}: this installation of torch cannot run it"
                        f"{' (it needs CUDA GPUs and a torch built with NCCL)' if args.backend == 'nccl' else ''}; "
                        f"use --backend gloo, which runs on CPUs")
    runs = [(args.out / spec.schedule / f"run{r}", spec) for r in range(args.rounds) for spec in specs]
    kept = frozenset(folder for folder, spec in runs if args.resume and recorded(spec, folder))
    held = [folder for folder, _ in runs if folder not in kept and any(folder.glob("rank*.json*"))]
    if held and not args.overwrite:
        more = f" (and {len(held) - 1} more)" if len(held) > 1 else ""
        other = " of other settings" if args.resume else ""
        raise UserError(f"--out {args.out}: {held[0]} already holds traces{other}{more}; pass --overwrite to replace "
                        f"them{'' if args.resume else ', or --resume to keep those of these settings'}")
    for folder in held:  # a run of fewer ranks must not leave the files of more beside its own
        for stale in folder.glob("rank*.json*"):
            stale.unlink(missing_ok=True)
    total = len(specs) * args.rounds
    speaks = not launched() or os.environ["RANK"] == "0"  # under a launcher, one rank reports for all
    if speaks:
        print(f"recording {len(specs)} schedule(s) x {args.rounds} round(s) into {args.out}", file=sys.stderr)
    made = [folder for folder in (args.out, *(args.out / spec.schedule for spec in specs)) if not folder.exists()]
    done = 0
    try:
        for done, (folder, was_kept) in enumerate(record_rounds(specs, args.out, args.rounds, kept), 1):
            if speaks:
                print(f"[{done}/{total}] {folder}{' (kept)' if was_kept else ''}", flush=True)
    except BaseException as error:
        for folder in reversed(made):  # the folders this run made, left empty by a run stopped or failed
            with suppress(OSError):
                folder.rmdir()
        if isinstance(error, ProcessException):  # a rank failed: PyTorch's own message, on its last line, says why
            lines = [line for line in str(error).splitlines() if line.strip()]
            why = lines[-1].strip() if lines else str(error)
            busy = "EADDRINUSE" in why and not launched()
            whole = (f"; {counted(done, 'whole run')} before it {'is' if done == 1 else 'are'} kept in {args.out}: "
                     f"to continue, {command_to_resume()}" if done and not launched() else "")
            raise UserError(f"a rank failed: {why}" + (f"; another program holds --port {args.port}: pass a free "
                                                       f"one" if busy else "") + whole) from None
        if isinstance(error, KeyboardInterrupt) and done and not launched():
            raise KeyboardInterrupt(f"{str(error) or 'interrupted'} after {done} of {total} runs, which are kept in "
                                    f"{args.out}; to continue: {command_to_resume()}") from None
        raise
    return 0


def _backend_available(backend: str) -> bool:
    """Whether this torch can run ranks over ``backend`` (gloo on CPUs, NCCL on CUDA GPUs)."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        return dist.is_nccl_available() and torch.cuda.is_available()
    return dist.is_gloo_available()


def _replay(args) -> int:
    from ..replay import replay  # the simulator, once the arguments are read

    if args.plot and args.plot.suffix.lower() not in PLOT_FORMATS:
        raise UserError(f"--plot {args.plot}: the file name must end in one of {', '.join(PLOT_FORMATS)}")
    if args.lengths_out and args.lengths_out.suffix.lower() != ".json":
        raise UserError(f"--lengths-out {args.lengths_out}: a table of lengths is JSON; give a path ending in .json")
    for flag, path in (("--plot", args.plot), ("--lengths-out", args.lengths_out)):
        if path is not None and output_target(path).exists() and not args.overwrite:
            raise UserError(f"{flag} {path}: the file exists; pass --overwrite to replace it")
        folders = {(run if run.is_dir() else run.parent).resolve() for run in args.run}
        if path is not None and path.name.lower().endswith((".json", ".json.gz")) and path.resolve().parent in folders:
            raise UserError(f"{flag} {path}: inside the run's folder, where every JSON file is read as a rank's "
                            "trace; write it elsewhere")
    run = read_run(args.run, args.schedule)
    if not 0 <= args.iteration < len(run.iterations):
        raise UserError(f"--iteration {args.iteration}: must be from 0 to {len(run.iterations) - 1}")
    comm = fitted(run)
    iterations = counted(len(run.iterations), "iteration")
    rate = f"bytes / {comm.bandwidth / 1e3:.3g} MB/s" if math.isfinite(comm.bandwidth) else "no time to measure"
    transfers = (f"transfers: {comm.time(0) * 1e3:.0f} us + {rate}, from {comm.samples} waited-for transfers"
                 if comm.samples else "no transfers")
    print(f"{run.schedule}: {counted(run.ranks, 'rank')}, {counted(run.stages, 'stage')}, "
          f"{counted(run.microbatches, 'micro-batch', 'micro-batches')}, {iterations}; {transfers}")
    results = [replay(run, k, comm) for k in range(len(run.iterations))]
    _note_lead(run)  # once the run is known to be one that can be
    departed = next((k for k, result in enumerate(results) if result.departure), None)
    if departed is not None:  # a runtime may order its own way; a trace of another schedule surely does
        print(f"note: iteration {departed} ran in another order than {run.schedule}'s own "
              f"({results[departed].departure}); the replay follows the order as it ran", file=sys.stderr)
    for k, result in enumerate(results):
        print(f"iteration {k}: measured {result.measured.completion_time:.2f} ms, simulated "
              f"{result.simulated.completion_time:.2f} ms ({result.iteration_error:+.1%}); task start error median "
              f"{median(result.start_errors):.1%}, worst {max(result.start_errors):.1%}")
    if args.lengths_out:
        simulated = results[args.iteration].simulated
        params = simulated.params
        # the environment as replayed; its mean lengths only set the ideal time that a chart's title quotes
        chunks = {"--chunks": params.chunks} if "chunks" in get_schedule(params.schedule).parameters else {}
        flags = {"--schedule": params.schedule, "-n": params.n, "--num-gpus": params.num_gpus, **chunks,
                 "--fwd-len": f"{params.fwd_len:.6g}", "--bwd-len": f"{params.bwd_len:.6g}",
                 "--prop-len": f"{params.prop_len:.6g}", "--sync-base-len": 0, "--fwd-impact": 0, "--bwd-impact": 0}
        table = {"source": f"{' '.join(map(str, args.run))}, iteration {args.iteration}",
                 "flags": " ".join(f"{flag} {value}" for flag, value in flags.items()), "unit": "ms",
                 "lengths": {str(task.id): task.length for task in simulated.tasks}}
        with atomic_output(args.lengths_out) as temporary:
            temporary.write_text(json.dumps(table, indent=1))
        print(f"wrote {args.lengths_out} ({table['flags']}); the visualizers draw it with --lengths "
              f"{args.lengths_out}, a sweep config names it with \"lengths\": \"{args.lengths_out}\"")
    if args.plot:
        use_display(True)
        from ..plotting.replay import replay_figure

        figure = replay_figure(results[args.iteration], title=f"{run.schedule}, iteration {args.iteration}")
        with atomic_output(args.plot) as temporary:
            figure.savefig(temporary, format=args.plot.suffix.lower()[1:], dpi=110)
        print(f"wrote {args.plot}")
    return 0


def fitted(run: MeasuredRun) -> CommFit:
    """``fit_comm`` of ``run``'s iterations, a run that has nothing to fit named."""
    try:
        return fit_comm(run.iterations)
    except TraceError as error:
        raise TraceError(f"{run.source}: {error}") from None


def _note_lead(run: MeasuredRun) -> None:
    if said := input_lead(run):
        print(f"note: {said}", file=sys.stderr)


def _predict(args) -> int:
    from ..replay import check_run, predicted_time, runtime_costs

    source = read_run([args.source])
    check_run(source)  # a run no real one can be predicts nothing
    _note_lead(source)
    comm = fitted(source)
    n = args.microbatches or source.microbatches
    said = f"--microbatches {n}" if args.microbatches else f"{args.source}: its {n} micro-batches"
    schedules, left_out = [], {}
    for schedule in dict.fromkeys(args.schedule):  # one that cannot run n, or too large to simulate, is left out
        try:
            get_schedule(schedule).check(n, source.ranks)
            tasks = estimated_tasks(EnvParams(schedule=schedule, num_gpus=source.ranks, n=n))
            if tasks > MAX_TASKS:
                raise ParameterError("n", n, f"{schedule} on {counted(source.ranks, 'rank')} gives about {tasks:,} "
                                             f"tasks; a prediction simulates at most {MAX_TASKS:,}")
            schedules.append(schedule)
        except ParameterError as error:
            left_out[schedule] = error
    if not schedules:  # said once, by the first schedule's reason
        more = f"; nor can the {counted(len(left_out) - 1, 'other schedule')} given" if len(left_out) > 1 else ""
        raise UserError(f"{said}: {next(iter(left_out.values()))}{more}")
    for schedule, why in left_out.items():
        print(f"{schedule}: not predicted ({said}: {why})", file=sys.stderr)
    measured: dict[str, list[float]] = {}
    for folder in args.measured:
        run = read_run([folder])
        if (run.microbatches, run.ranks) != (n, source.ranks):
            print(f"{folder}: {counted(run.microbatches, 'micro-batch', 'micro-batches')} on "
                  f"{counted(run.ranks, 'rank')}, not {n} on {source.ranks}: not compared", file=sys.stderr)
        elif differs := source.differs(run):
            print(f"{folder}: another model than the source's ({differs}): not compared", file=sys.stderr)
        else:
            check_run(run)  # one compared is one a run can be
            measured.setdefault(run.schedule, []).extend(it.time for it in run.iterations)
    runtime = None
    if args.runtime_from:
        others = [read_run([folder]) for folder in args.runtime_from]
        for folder, run in zip(args.runtime_from, others):
            if (run.ranks, run.microbatches) != (source.ranks, source.microbatches):
                raise UserError(f"--runtime-from {folder}: {run.microbatches} micro-batches on "
                                f"{counted(run.ranks, 'rank')}; the source ran {source.microbatches} on "
                                f"{source.ranks}: measure the runtime on runs of the source's size")
            if differs := source.differs(run):
                raise UserError(f"--runtime-from {folder}: another model than the source's ({differs}): measure the "
                                "runtime on runs of the source's model")
            check_run(run)
        runtime = runtime_costs(others, source)
        split = (f"a split backward {runtime.split:.2f} times a whole one, {runtime.input_share:.0%} of it in I"
                 if runtime.split_measured else "no split backward to measure against a whole one: a split backward "
                 "taken to cost a whole one, half of it in I")
        print(f"the runtime's costs over {counted(len(others), 'run')}: {runtime.gap:.3f} ms between actions, {split}",
              file=sys.stderr)
    if len(source.iterations) < 2:
        print(f"{args.source}: one iteration: no task spread to put back as jitter", file=sys.stderr)
    for schedule in schedules:
        time = median(predicted_time(source, k, comm, schedule, runtime=runtime, microbatches=n)
                      for k in range(len(source.iterations)))
        line = f"{schedule:>17}: predicted {time:8.2f} ms"
        if schedule in measured:
            real = median(measured[schedule])
            line += f", measured {real:8.2f} ms ({time / real - 1:+.1%})"
        print(line)
    return 0


def _study(args) -> int:
    from ..tracestudy import SOURCE, study, study_runs

    runs = study_runs(args.folder)
    for own in runs.values():
        for run in own:
            _note_lead(run)
    total = sum(len(own) for own in runs.values())
    print(f"studying {len(runs)} schedule(s), {total} run(s) in {args.folder}", file=sys.stderr)
    if SOURCE not in runs:
        print(f"no {SOURCE} runs: the prediction columns stay empty", file=sys.stderr)
    print("| schedule | runs x iterations | measured (ms) | spread (CV) | replay error median (worst) | task start "
          f"error median (worst) | predicted from {SOURCE} (ms) | error | with the others' runtime costs (ms) | error "
          "| task CV | jitter model's CV | time posting sends |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for f in study(runs):
        predicted = "" if f.predicted_ms is None else f"{f.predicted_ms:.1f}"
        error = "" if f.prediction_error is None else f"{f.prediction_error:+.1%}"
        calibrated = "" if f.calibrated_ms is None else f"{f.calibrated_ms:.1f}"
        calibrated_error = "" if f.calibrated_error is None else f"{f.calibrated_error:+.1%}"
        # spreads over one iteration a run are not measured: shown as n/a, not as 0
        spread, task_cv, jitter = ((f"{f.spread:.1%}", f"{f.task_cv:.1%}", f"{f.jitter_spread:.1%}")
                                   if f.iterations > f.runs else ("n/a", "n/a", "n/a"))
        print(f"| {f.schedule} | {f.runs} x {f.iterations // f.runs} | {f.measured_ms:.1f} | {spread} | "
              f"{f.replay_error:.1%} ({f.replay_worst:.1%}) | {f.start_median:.1%} ({f.start_worst:.0%}) | "
              f"{predicted} | {error} | {calibrated} | {calibrated_error} | {task_cv} | {jitter} | "
              f"{f.send_posting:.1%} |", flush=True)
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    args = build_parser(prog).parse_args(argv)
    commands = {"record": _record, "replay": _replay, "predict": _predict, "study": _study}
    return run_command(prog, lambda: commands[args.command](args), resumes=args.command == "record")
