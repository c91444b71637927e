"""How well the simulator follows real runs: replay, cross-schedule prediction and spread over a folder of traces.

The folder holds ``<schedule>/run<r>/`` (what ``pipeline-sim-trace record`` writes): round r ran every schedule
once, one after another, so that round r's runs saw the host alike. For each schedule it reports the replay errors
(``replay.replay``, every iteration of every run), the measured iteration's own spread, the iteration time
predicted from the 1F1B runs (``replay.predicted_time``, alone and with the runtime's costs measured on the other
schedules' runs) against the measured one, and whether the jitter model (docs/model.md section 8) at the measured
per-task spread gives the measured spread of the iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median
from typing import Iterator

import numpy as np

from .engine import simulate
from .measured import MeasuredRun, TraceError, fit_comm, read_run
from .model import Policy
from .replay import check_run, predicted_time, replay, runtime_costs, task_spread, variation

#: The schedule whose trace predicts the others.
SOURCE = "1f1b"


@dataclass(frozen=True)
class ScheduleFigures:
    schedule: str
    runs: int
    iterations: int
    measured_ms: float  # median iteration time
    spread: float  # the iterations' coefficient of variation (all runs)
    replay_error: float  # median |relative error| of the iteration time over all replays
    replay_worst: float
    start_median: float  # per-task start error relative to the measured start, median over all tasks of all replays
    start_worst: float
    predicted_ms: float | None  # median over every 1F1B iteration of the time predicted from it, 1F1B alone
    prediction_error: float | None  # predicted_ms / measured_ms - 1
    calibrated_ms: float | None  # the same with the runtime's costs measured on the runs of the other schedules
    calibrated_error: float | None
    task_cv: float  # median over tasks of the coefficient of variation of a task's duration across iterations
    jitter_spread: float  # the simulated iteration's coefficient of variation at compute_jitter = task_cv
    send_posting: float  # median share of the ranks' time spent inside c10d::send


def study_runs(folder: Path) -> dict[str, list[MeasuredRun]]:
    """Per schedule (as its traces name it), the runs under ``folder``; ``TraceError`` unless they all ran the same
    micro-batches on the same ranks, as the study's comparisons need."""
    if not folder.is_dir():
        raise TraceError(f"{folder}: no such folder")
    runs: dict[str, list[MeasuredRun]] = {}
    first: tuple[Path, MeasuredRun] | None = None
    for schedule_folder in sorted(p for p in folder.iterdir() if p.is_dir()):
        for run_folder in sorted(p for p in schedule_folder.iterdir() if p.is_dir()):
            run = read_run([run_folder])
            if first is None:
                first = run_folder, run
            elif (run.microbatches, run.ranks) != (first[1].microbatches, first[1].ranks):
                raise TraceError(f"{run_folder}: {run.microbatches} micro-batches on {run.ranks} ranks, where "
                                 f"{first[0]} ran {first[1].microbatches} on {first[1].ranks}: a study compares "
                                 "runs of one size")
            elif differs := first[1].differs(run):
                raise TraceError(f"{run_folder}: ran another model than {first[0]} ({differs}): a study compares "
                                 "runs of one model (record them into another folder)")
            runs.setdefault(run.schedule, []).append(run)
    if not runs:
        raise TraceError(f"{folder}: no <schedule>/run<r>/ folders of traces")
    for own in runs.values():  # every run before any figure: a study reports nothing of a folder it cannot read
        for run in own:
            check_run(run)
    return runs


def jitter_spread(run: MeasuredRun, cv: float, samples: int = 40) -> float:
    """The coefficient of variation of the simulated iteration time of ``run``'s first iteration, on its replayed
    lengths with compute jitter ``cv`` on top, over ``samples`` draws (under the schedule's static order, which is
    the order the committed runs ran in)."""
    replayed = replay(run, 0, fit_comm(run.iterations)).simulated
    params = replace(replayed.params, compute_jitter=cv)
    lengths = [task.length for task in replayed.tasks]
    return variation([simulate(params, Policy(), sample, lengths=lengths).completion_time for sample in range(samples)])


def _predicted(sources: list[MeasuredRun], schedule: str, others: list[MeasuredRun] | None) -> float:
    """The median over every iteration of ``sources`` of the time of ``schedule`` predicted from it, with the
    runtime's costs measured on ``others`` (``None``: each source's own)."""
    times = []
    for source in sources:
        comm, runtime = fit_comm(source.iterations), None if others is None else runtime_costs(others, source)
        times += [predicted_time(source, k, comm, schedule, runtime=runtime) for k in range(len(source.iterations))]
    return float(median(times))


def study(runs: dict[str, list[MeasuredRun]]) -> Iterator[ScheduleFigures]:
    """``ScheduleFigures`` of every schedule of ``runs`` (``study_runs``), ``SOURCE`` first, each as it is made."""
    sources = runs.get(SOURCE, [])
    for schedule in sorted(runs, key=lambda name: (name != SOURCE, name)):
        errors: list[float] = []
        starts: list[float] = []
        times: list[float] = []
        posting: list[float] = []
        for run in runs[schedule]:
            comm = fit_comm(run.iterations)
            for k, iteration in enumerate(run.iterations):
                result = replay(run, k, comm)
                errors.append(result.iteration_error)
                starts.extend(result.start_errors.tolist())
                times.append(iteration.time)
                posting.append(iteration.send_posting / (run.ranks * iteration.time))
        measured = float(np.median(times))
        others = [run for name, own in runs.items() if name not in (SOURCE, schedule) for run in own]
        alone = _predicted(sources, schedule, None) if sources else None
        calibrated = _predicted(sources, schedule, others) if sources and others else None  # none to measure on
        task_cv = float(np.median([task_spread(run) for run in runs[schedule]]))
        yield ScheduleFigures(
            schedule, len(runs[schedule]), len(times), measured, variation(times),
            float(np.median(np.abs(errors))), float(np.max(np.abs(errors))), float(np.median(starts)),
            float(np.max(starts)), alone, None if alone is None else alone / measured - 1.0,
            calibrated, None if calibrated is None else calibrated / measured - 1.0,
            task_cv, jitter_spread(runs[schedule][0], task_cv), float(np.median(posting)))
