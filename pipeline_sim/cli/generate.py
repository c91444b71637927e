"""data_generator.py: every policy in every environment of a JSON grid, into one CSV."""

from __future__ import annotations

import glob
import os
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Generator, Sequence

from ..cluster import ClusterError, ClusterLost, TaskKilled, connected
from ..config import EnvironmentGrid
from ..files import LockLost, exclusive_writer, output_folder, output_target
from ..model import LOOKAHEAD
from ..parallel import interrupt_behind
from ..results import FORMATS, SIMULATORS
from ..scenarios import DEFAULT_STEP
from .common import (
    Parser,
    UserError,
    add_cluster_argument,
    bar_width,
    check_interrupt,
    command_to_resume,
    counted,
    positive_int,
    ready_kernel,
    run_command,
    script_name,
)

if TYPE_CHECKING:
    from ..sweep import SweepPlan

DATA_DIR = Path("outputs/data")


def add_sweep_arguments(parser: Parser, *, step_flags: Sequence[str]) -> None:
    parser.add_argument("--simulator", choices=SIMULATORS, default="single_channel",
                        help="recorded in the CSV; both simulators share one core, so numbers are equal "
                             "(default %(default)s)")
    parser.add_argument(*step_flags, dest="step", type=float, default=DEFAULT_STEP,
                        help="resolution of the shared priorities; must divide 1 and be at least 0.01 "
                             "(default %(default)s: 121 policies per environment)")
    parser.add_argument("--workers", type=positive_int, metavar="N", default=os.cpu_count() or 1,
                        help="worker processes (default: all %(default)s cores; 1 runs serially)")
    add_cluster_argument(parser)
    parser.add_argument("--format", choices=FORMATS, default="csv",
                        help="the output's format: csv, or parquet (typed columns in row groups, written as the "
                             "sweep streams; needs pip install \"pipeline-sim[cluster]\"); the samples file stays CSV "
                             "(default %(default)s)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted sweep from its .partial file instead of starting over")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing output and discard an unfinished sweep's .partial file "
                             "(without it, both are refused)")
    parser.add_argument("--samples", type=positive_int, metavar="N", default=None,
                        help="noise draws per (environment, policy) (default: the config's \"samples\", else 1); "
                             "rows then give the mean completion time and its spread")
    parser.add_argument("--samples-output", type=Path, metavar="FILE", default=None,
                        help="also write one row per (environment, policy, sample) with its completion time")
    parser.add_argument("--allow-large", action="store_true",
                        help="run a sweep beyond the size limits (a million tasks per simulation, a million "
                             "combinations, a step finer than 0.01, a day of estimated work) instead of refusing it")
    parser.add_argument("--skip-invalid", action="store_true",
                        help="leave out the combinations of the grid that cannot run (a schedule's requirement, "
                             "e.g. interleaved-1f1b: n a multiple of num_gpus, dualpipe-v: n >= 2 x num_gpus; "
                             "weights of another length than the stages; a table or policy file that does not fit "
                             "or cannot be read) instead of refusing the config")


def default_output(config: Path, plan: SweepPlan, resume: bool) -> Path:
    """``outputs/data/<config name>_<timestamp>.csv`` (``.parquet``); with ``resume``, the newest unfinished sweep of
    this plan, found by its partial's record: written first and removed last, it is there whatever the sweep's
    state (a partial file or folder, or a finished output whose cleanup was cut short)."""
    from ..sweep import finished, partial_paths, resumable

    if resume:
        candidates = sorted(DATA_DIR.glob(f"{config.stem}_*.{plan.format}.partial.json"), reverse=True)
        for meta in candidates:
            output = meta.with_name(meta.name.removesuffix(".partial.json"))
            if resumable(output, plan) or finished(output, plan):
                return output
    stem = f"{config.stem}_{time.strftime('%Y%m%d-%H%M%S')}"
    for suffix in ("", *(f"-{k}" for k in range(2, 1000))):  # runs started in one second get their own files
        output = DATA_DIR / f"{stem}{suffix}.{plan.format}"
        if not any(path.exists() for path in (output, *partial_paths(output), output.with_name(output.name + ".lock"))):
            return output
    raise UserError(f"{DATA_DIR}: a thousand sweeps of {config.stem} started this second; give --output")


def unfinished_elsewhere(config: Path, plan: SweepPlan) -> tuple[str, str]:
    """Why ``--resume`` finds nothing of ``plan`` to continue when the newest unfinished sweep of ``config`` in
    ``DATA_DIR`` (of any format) was written under other settings: said with them, so that the user continues it or
    starts another knowingly (empty when there is none); and, when the newest was written from another grid (the
    config edited since, or another file of that name), what a new sweep leaves beside it."""
    from ..sweep import ANOTHER_GRID, not_resumable, settings_changed, sweep_record

    beside = ""
    for meta in sorted(DATA_DIR.glob(f"{glob.escape(config.stem)}_*.partial.json"), reverse=True):
        partial = meta.with_name(meta.name.removesuffix(".json"))
        differences = settings_changed(sweep_record(meta).get("settings"), plan)
        if partial.exists() and differences and differences != [ANOTHER_GRID]:
            return (f"{partial} is an unfinished sweep of {config.name} written {', '.join(differences)}; rerun with "
                    f"its settings and --resume to continue it, or without --resume to start another"), ""
        if partial.exists() and not beside and differences:
            beside = (f" beside {partial}, an unfinished sweep of another grid named {config.name} (edited since, or "
                      f"another file: put it back to resume that one, or remove it)")
        elif partial.exists() and not beside:  # its own grid and settings: a table, a network or the model changed
            reason = not_resumable(partial, meta, plan).split("; ")[0].removeprefix(f"{partial} ")
            beside = f" beside {partial}, an unfinished sweep of {config.name} that cannot be continued: it {reason}"
    return "", beside


def _where(workers: int, cluster: str | None) -> str:
    processes = counted(workers, "worker")
    if cluster is None:
        return processes
    return f"a local Dask cluster of {processes}" if cluster == "local" else f"the Dask cluster at {cluster}"


def generate(config: Path, *, step: float, simulator: str, output: Path | None, workers: int,
             resume: bool, skip_invalid: bool = False, samples: int | None = None,
             samples_output: Path | None = None, overwrite: bool = False,
             allow_large: bool = False, cluster: str | None = None, format: str = "csv",
             locks: ExitStack | None = None, also_lock: Callable[[Path], Path] | None = None,
             unfinished: Callable[[SweepPlan], Path | None] | None = None) -> tuple[SweepPlan, Path]:
    """Run the sweep with a progress bar; report on stderr/stdout. Returns the plan and the CSV written.

    The output and the samples file are locked (``files.exclusive_writer``) before anything is
    written, and so is ``also_lock(output)``, a folder the caller writes next; given ``locks``,
    they stay locked until it closes, so that a whole pipeline holds everything it writes. With ``resume`` and no
    sweep of this plan to continue, ``unfinished(plan)`` may name a complete output of it whose caller's work was
    stopped: that output is returned, nothing simulated.
    """
    from ..sweep import SweepPlan, partial_paths, useful_workers  # the simulator's, once the arguments are read

    if output is not None and output.suffix.lower() in (".csv", ".parquet") and output.suffix.lower()[1:] != format:
        raise UserError(f"--output {output}: a {format.replace('csv', 'CSV').replace('parquet', 'Parquet')} file "
                        f"named {output.suffix}; name it .{format}, or pass --format {output.suffix.lower()[1:]}")
    plan = SweepPlan(EnvironmentGrid.load(config, allow_large), step=step, simulator=simulator,
                     skip_invalid=skip_invalid, samples=samples or 0, with_samples=samples_output is not None,
                     allow_large=allow_large, format=format, workers=workers, remote=cluster not in (None, "local"))
    asked = workers
    workers = useful_workers(plan, workers)
    complete, beside = None, ""
    if output is None:
        output = default_output(config, plan, resume)
        if resume and not any(path.exists() for path in partial_paths(output)):
            complete = unfinished(plan) if unfinished is not None else None
            output = complete or output
            if complete is None:
                elsewhere, beside = unfinished_elsewhere(config, plan)
                if elsewhere:
                    raise UserError(elsewhere)
    for written in filter(None, (output, samples_output)):
        if written.resolve() == config.resolve():
            raise UserError(f"{written} is the config itself; choose another output")
    partial, _ = partial_paths(output)
    with ExitStack() as own:
        held = own if locks is None else locks
        for path in (output, samples_output):
            held.enter_context(exclusive_writer(None if path is None else output_target(path)))
        if also_lock is not None:
            held.enter_context(exclusive_writer(output_folder(also_lock(output))))
        if complete is not None:
            print(f"resuming: the sweep of {complete} is complete; drawing what was not drawn", flush=True)
        else:
            _run(plan, output, partial, workers, asked, resume, samples_output, overwrite, cluster, beside)
    return plan, output


def _run(plan: SweepPlan, output: Path, partial: Path, workers: int, asked: int, resume: bool,
         samples_output: Path | None, overwrite: bool, cluster: str | None, beside: str = "") -> None:
    from ..sweep import run_sweep

    continuing = resume and partial.exists()  # a partial of no rows yet is continued all the same
    bar: list[_Bar] = []  # the progress bar, once it is shown

    def running(simulations: int, seconds: float) -> None:  # units of minutes (a hindsight environment's) move it
        if bar:
            bar[0].show(simulations, seconds)
    with connected(cluster, workers) as dask:  # an unreachable one: one line, no files
        if dask is not None and plan.remote:
            plan.check_hours(dask.threads(), " of the cluster as reached")  # more may join later
        progress = run_sweep(plan, output, workers=workers, resume=resume, samples_output=samples_output,
                             overwrite=overwrite, cluster=dask, report=lambda line: print(line, flush=True),
                             running=running)
        try:
            _announce(plan, progress, output, partial, workers, asked, resume and not continuing, cluster, bar, beside)
        finally:
            progress.close()  # a sweep that stopped early keeps its rows and releases its lock


def _announce(plan: SweepPlan, progress: Generator[int, None, None], output: Path, partial: Path, workers: int,
              asked: int, nothing_to_resume: bool, cluster: str | None, bar: list[_Bar], beside: str = "") -> None:
    """Say what the sweep runs and where, then follow it to the end (its progress bar put in ``bar``)."""
    done = next(progress) * plan.samples  # checks that the output can be written before announcing the work
    draws = f" x {plan.samples} samples" if plan.samples > 1 else ""
    print(f"{counted(plan.num_environments, 'environment')} x {counted(len(plan.policies), 'policy', 'policies')}"
          f"{draws} = {counted(plan.num_simulations, 'simulation')} on {_where(workers, cluster)} -> {output}"
          + (f" (--workers {asked}: no more chunks of work than that)" if workers < asked and cluster in (None, "local")
             else ""), flush=True)
    if skipped := len(plan.grid.invalid()):
        where, why = plan.grid.invalid()[0]
        print(f"left out {counted(skipped, 'combination')} that cannot run (--skip-invalid), e.g. {where}: {why}",
              flush=True)
    if done == plan.num_simulations:
        pass  # nothing left to simulate, nor a kernel to load
    elif done:
        print(f"resuming: {done // plan.samples:,} rows already in {partial}", flush=True)
    elif nothing_to_resume:
        print(f"nothing to resume for this config; starting a new sweep{beside}", flush=True)
    if done < plan.num_simulations:
        try:
            ready_kernel(episodes=bool(plan.grid.networks()) or any(
                name == "dispatch" and any(str(v).strip().lower() == LOOKAHEAD for v in values)
                for name, values in plan.grid.values),
                parts=("figures", "records") if plan.grid.has_dispatch else ("figures",))  # records: the bound
        except (KeyboardInterrupt, SystemError) as error:  # stopped as the kernel loads: as the sweep says it
            interrupt = interrupt_behind(error)
            if interrupt is None:
                raise
            raise KeyboardInterrupt(f"{str(interrupt) or 'interrupted'} after {done:,} of "
                                    f"{plan.num_simulations:,} simulations; rows kept in {partial}; to continue: "
                                    f"{command_to_resume()}") from None
    _follow(progress, plan, done, partial, bar)


class _Bar:
    """A sweep's progress bar, measured in its estimated seconds of work (``SweepPlan.seconds_done``), so that its
    share done and its time left weigh each environment by its cost (a hindsight draw's solve takes thousands of
    plain simulations' time), with the simulations done and their rate beside it."""

    def __init__(self, plan: SweepPlan, done: int) -> None:
        from tqdm import tqdm

        self.plan, self.first, self.simulations = plan, done, done
        # redrawn at most twice a second, whatever came before (and however little: a sweep of less than an
        # estimated second is no less followed): a sweep's fast units would otherwise have the bar wait for as much
        # work again before it redraws, minutes where a hindsight environment's draws come slowly. Its time left is
        # the run's average rate (smoothing 0): tqdm's moving average takes the time of a step's work from the last
        # redraw, which a redraw without progress moves, and so said a fifth of the time left
        self.bar = tqdm(total=plan.estimated_seconds, initial=plan.seconds_done(done // plan.samples), **bar_width(),
                        mininterval=0.5, miniters=0, smoothing=0, file=sys.stderr, desc=self._described(0.0),
                        bar_format="{percentage:3.0f}%|{bar}| {desc} [{elapsed}<{remaining}]")

    def show(self, simulations: int, seconds: float) -> None:
        """The simulations done and their estimated seconds, those of rows still running included; never less than
        shown before (the rows written catch up with what the workers said), nor more than the total (the chunks'
        shares of it sum to it within a rounding)."""
        self.simulations = max(self.simulations, simulations)
        self.bar.set_description_str(self._described(self.bar.format_dict["elapsed"]), refresh=False)
        self.bar.update(max(0.0, min(seconds, self.plan.estimated_seconds) - self.bar.n))

    def _described(self, elapsed: float) -> str:
        rate = f", {(self.simulations - self.first) / elapsed:,.0f} sim/s" if elapsed > 0 else ""
        return f"{self.simulations:,}/{self.plan.num_simulations:,} sim{rate}"

    def close(self) -> None:
        self.bar.close()


def _follow(progress: Generator[int, None, None], plan: SweepPlan, done: int, partial: Path,
            shown: list[_Bar]) -> None:
    """Show the sweep's progress until it ends (the bar put in ``shown``); an interruption says what is kept and how
    to continue."""
    bar = _Bar(plan, done)
    shown.append(bar)
    kept = done  # the simulations of the rows on disk: the bar may show those of rows still running too
    try:
        for rows in progress:
            kept = rows * plan.samples
            bar.show(kept, plan.seconds_done(rows))
            check_interrupt()
    except ClusterLost as error:
        progress.close()
        bar.close()
        raise ClusterError(f"{error} after {_so_far(plan, kept)}; rows kept in "
                           f"{partial}; to continue: {command_to_resume()}") from None
    except TaskKilled as error:
        progress.close()
        bar.close()
        raise ClusterError(f"{error}; the rows before it are kept; to continue: {command_to_resume()}") from None
    except LockLost as error:
        progress.close()
        bar.close()
        raise LockLost(f"{error}; rows kept in {partial}; once no other run writes it, continue with "
                       f"{command_to_resume()}") from None
    except (KeyboardInterrupt, BrokenProcessPool, SystemError) as error:
        interrupt = interrupt_behind(error)
        if interrupt is None and not isinstance(error, BrokenProcessPool):
            raise
        progress.close()
        bar.close()
        why = "a worker process died" if interrupt is None else str(interrupt) or "interrupted"
        raise KeyboardInterrupt(f"{why} after {_so_far(plan, kept)}; "
                                f"rows kept in {partial}; to continue: {command_to_resume()}") from None
    bar.close()


def _so_far(plan: SweepPlan, simulations: int) -> str:
    """The simulations whose rows are on disk, of the sweep's, and with samples those rows of its rows."""
    rows = f" ({simulations // plan.samples:,} of {plan.num_rows:,} rows)" if plan.samples > 1 else ""
    return f"{simulations:,} of {plan.num_simulations:,} simulations{rows}"


def build_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, description="Run every communication-priority policy in every environment of a "
                                           "JSON grid, in parallel, into one CSV (one row per simulation).",
                    epilog="Rows stream to <output>.partial in a fixed order and become <output> when the sweep "
                           "completes; after an interruption, rerun the same command with --resume. "
                           f"Example: {prog} --config configs/example.json --workers 2")
    parser.add_argument("--config", "-c", type=Path, required=True, metavar="FILE",
                        help="JSON grid of environments: each parameter a value, a list, or "
                             "{\"start\": a, \"stop\": b, \"step\": s}; see configs/")
    parser.add_argument("--output", "-o", type=Path, default=None, metavar="PATH",
                        help=f"file to write (default {DATA_DIR}/<config name>_<timestamp>.csv, or .parquet)")
    add_sweep_arguments(parser, step_flags=("--step", "--priority_step", "--priority-step"))
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    args = build_parser(prog).parse_args(argv)

    def body() -> int:
        plan, output = generate(args.config, step=args.step, simulator=args.simulator, output=args.output,
                                workers=args.workers, resume=args.resume, skip_invalid=args.skip_invalid,
                                samples=args.samples, samples_output=args.samples_output, overwrite=args.overwrite,
                                allow_large=args.allow_large, cluster=args.cluster, format=args.format)
        print(f"wrote {plan.num_rows:,} rows to {output}")
        if args.samples_output:
            print(f"wrote {plan.num_simulations:,} samples to {args.samples_output}")
        return 0

    return run_command(prog, body, resumes=True)
