"""plot_heatmap.py: one heatmap PNG per environment of a sweep's CSV."""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Iterator, Sequence

import numpy as np

from ..files import OutputError, atomic_output, check_locks, exclusive_writer, output_folder
from ..model import EnvParams
from ..parallel import interrupt_behind, ordered_map
from ..parameters import ParameterError
from ..results import (
    JITTER_KEYS,
    METRICS,
    PRIO_COLUMNS,
    REPORT_SUMMARY,
    TIER_COLUMNS,
    ResultsError,
    best_label,
    best_rows,
    curve_rows,
    dispatch_families,
    env_slug,
    env_title,
    environments,
    group_slug,
    jitter_families,
    jitter_keys,
    jitter_level,
    open_results,
    read_results,
    schedule_groups,
    schedule_summary,
    simplex_steps,
    workload_of,
)
from ..scenarios import policy_count
from ..tables import read_table
from ..workload import Workload
from .common import Parser, bar_width, check_interrupt, counted, positive_int, run_command, script_name

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class HeatmapJob:
    """One environment's rows and where its figure goes."""

    params: EnvParams
    workload: Workload | None
    rows: pd.DataFrame
    steps: int
    path: Path
    metric: str = "completion_time"

    def draw(self) -> Path:
        from ..plotting.heatmap import heatmap_figure

        figure = heatmap_figure(self.steps)  # one per worker, redrawn for each environment
        figure.draw(self.rows, title=env_title(self.params, self.workload), metric=self.metric,
                    unit=_unit(self.params, self.workload))
        with atomic_output(self.path) as temporary:
            figure.save(temporary)
        return self.path


@dataclass(frozen=True)
class ComparisonJob:
    """One group of environments that differ only by schedule, summarised per schedule."""

    params: EnvParams
    workload: Workload | None
    summary: pd.DataFrame
    path: Path

    def draw(self) -> Path:
        from matplotlib.figure import Figure

        from ..plotting.comparison import figure_size, plot_schedule_comparison

        fig = Figure(figsize=figure_size(len(self.summary)))
        plot_schedule_comparison(fig, self.summary, title=env_title(self.params, self.workload, schedule=False),
                                 unit=_unit(self.params, self.workload))
        return _save(fig, self.path)


@dataclass(frozen=True)
class FamilyJob:
    """A family of environments along a jitter (``key``), summarised for one figure titled at no jitter."""

    params: EnvParams
    workload: Workload | None
    key: str
    family: pd.DataFrame
    path: Path

    def title(self, **kwargs: bool) -> str:
        return env_title(replace(self.params, **_lowest(self.key)), self.workload, **kwargs)


class RobustnessJob(FamilyJob):
    """Environments that differ only by a jitter level, with the policies they follow."""

    def draw(self) -> Path:
        from matplotlib.figure import Figure

        from ..plotting.robustness import figure_size, plot_robustness

        fig = Figure(figsize=figure_size())
        plot_robustness(fig, self.family, self.key, title=self.title(), unit=_unit(self.params, self.workload))
        return _save(fig, self.path)


class DispatchJob(FamilyJob):
    """Environments that differ by schedule or dispatcher and by jitter: every way against the noise."""

    def draw(self) -> Path:
        from matplotlib.figure import Figure

        from ..plotting.dispatch import figure_size, plot_dispatch

        fig = Figure(figsize=figure_size())
        plot_dispatch(fig, self.family, self.key, title=self.title(schedule=False))
        return _save(fig, self.path)


def _unit(params: EnvParams, workload: Workload | None) -> str:
    """What a time of the CSV is measured in: a workload's are seconds, a table's in the unit it names (model
    units when it names none, or is no longer where the sweep read it)."""
    if workload is not None:
        return "s"
    try:
        return (read_table(params.lengths).unit if params.lengths else "") or "model units"
    except ParameterError:
        return "model units"


def _save(fig, path: Path) -> Path:
    with atomic_output(path) as temporary:
        fig.savefig(temporary, dpi=110, format="png")
    return path


def _draw(job: HeatmapJob | ComparisonJob | RobustnessJob | DispatchJob) -> Path:
    """Render and save one figure (runs in worker processes)."""
    return job.draw()


@dataclass(frozen=True)
class Drawn:
    """What ``write_heatmaps`` drew: per environment (params, workload, its best row, file); per group of
    schedules (params, workload, summary, file)."""

    heatmaps: list[tuple[EnvParams, Workload | None, dict[str, Any], Path]]
    comparisons: list[tuple[EnvParams, Workload | None, pd.DataFrame, Path]]
    robustness: list[Path]
    left_out: list[str]
    dispatch: list[Path]  # incomplete environments, named, with what is wrong


#: What the summary of a run keeps of an environment's best row.
_BEST_COLUMNS = ("policy", *METRICS, *REPORT_SUMMARY)


def write_heatmaps(csv: Path, output_dir: Path, workers: int = 1, metric: str = "completion_time",
                   skip_incomplete: bool = False, overwrite: bool = False) -> Drawn:
    """Draw every environment of ``csv`` (a sweep's CSV or Parquet output; coloured by ``metric``), every group of
    schedules to compare and every family of jitter levels into ``output_dir``.

    An incomplete environment (policies missing or repeated) is refused, or, with
    ``skip_incomplete``, left out of every figure and named in ``Drawn.left_out``. The
    file is opened once and read twice, in pieces, so that memory stays flat however many
    rows it has: once to check every environment before any figure is drawn, once to draw;
    a file changed in place meanwhile is refused. ``output_dir`` is locked once the file is
    checked, before anything is written (so a refused input leaves no folder or lock behind),
    until the end (``files.exclusive_writer``), and holds the marker ``INCOMPLETE_MARKER``
    until its last figure is written. Unless ``overwrite``, a folder that holds PNG files, or the marker of another
    file's drawing, is refused (``OutputError``) before the file is read and again once it is locked, so that the
    figures of two files never mix; a drawing of ``csv`` that was stopped is drawn again in full.
    """
    _check_folder(output_dir, csv, overwrite)
    with open_results(csv) as source, ExitStack() as lock:
        before = os.fstat(source.fileno())
        try:
            drawn = _write_heatmaps(csv, source, output_dir, workers, metric, skip_incomplete, overwrite, lock)
        except (KeyboardInterrupt, SystemError) as error:
            interrupt = interrupt_behind(error)
            if interrupt is None:
                raise
            if "plot_heatmap.py" in str(interrupt):  # stopped while drawing: it says how far
                raise interrupt from None
            raise KeyboardInterrupt(f"{str(interrupt) or 'interrupted'} while the file was read, before any figure "
                                    f"was drawn; draw them all with plot_heatmap.py {csv} -o {output_dir}") from None
        after = os.fstat(source.fileno())
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise ResultsError(f"{csv} changed while it was drawn; the figures in {output_dir} may mix two "
                               f"versions of it: draw them again")
        (output_dir / INCOMPLETE_MARKER).unlink(missing_ok=True)
    return drawn


#: The file that says a folder's figures are not all drawn: written before the first, removed after the last.
INCOMPLETE_MARKER = "INCOMPLETE.txt"


def _write_heatmaps(csv: Path, source: BinaryIO, output_dir: Path, workers: int, metric: str,
                    skip_incomplete: bool, overwrite: bool, lock: ExitStack) -> Drawn:
    heatmaps, left_out, summaries = [], [], []
    taken: dict[str, int] = {}  # per file name, the environments drawn under it
    # per environment, its jitter families, steps and heatmap's path; None: none
    drawable: list[tuple[list[tuple], int, Path] | None] = []
    steps_used: set[int] = set()
    levels: dict[tuple, list[float]] = {}  # per family of jitter levels, the levels of its environments
    incomplete = ""  # the first environment that is not a whole policy grid
    for params, rows in environments(read_results(csv, source=source), where=f"CSV {csv}"):
        if metric not in rows.columns:
            raise ResultsError(f"CSV {csv} has no column {metric!r} to colour; it was written before noise "
                               f"statistics existed, so use --metric completion_time")
        workload = workload_of(rows)
        slug = env_slug(params, workload)
        try:
            steps = _complete(rows)
        except ResultsError as problem:
            # said once the whole file is read: rows of the environment further on are a sorted or edited CSV,
            # which reading on finds, not a sweep cut short
            incomplete = incomplete or f"CSV {csv}: environment {slug} {problem}; pass --skip-incomplete to draw " \
                                       f"the others"
            left_out.append(f"{slug} ({problem})")
            drawable.append(None)
            continue
        steps_used.add(steps)
        best = best_rows(rows, metric=metric).iloc[0]
        heatmaps.append((params, workload, {**{name: best[name] for name in _BEST_COLUMNS if name in best},
                                            "policy": best_label(rows, metric)}, output_dir / figure_name(slug, taken)))
        summaries.append((params, workload, schedule_summary(params, rows)))
        families = jitter_keys(params, workload)
        for family in families:
            levels.setdefault(family, []).append(jitter_level(params, family[0]))
        drawable.append((families, steps, heatmaps[-1][3]))
    if incomplete and not skip_incomplete:
        raise ResultsError(incomplete)
    comparisons = [(params, workload, summary, output_dir / figure_name(f"compare_{group_slug(params, workload)}",
                                                                        taken))
                   for params, workload, summary in schedule_groups(summaries)]
    dispatch = [DispatchJob(params, workload, key, family, output_dir / figure_name(
                    f"dispatch_{key}_{group_slug(replace(params, **_lowest(key)), workload)}", taken))
                for params, workload, key, family in dispatch_families(summaries)]
    drawn = {family for family, values in levels.items() if len(set(values)) == len(values) >= 2}
    robustness: list[Path] = []
    draw = _Drawing(csv, source, output_dir, metric, taken, [None if planned is None else
                                                      (bool(drawn.intersection(planned[0])), *planned[1:])
                                                      for planned in drawable])
    jobs: Iterator[HeatmapJob | ComparisonJob | RobustnessJob | DispatchJob] = chain(
        draw.heatmaps(), (ComparisonJob(*comparison) for comparison in comparisons), iter(dispatch),
        draw.robustness(robustness))
    lock.enter_context(exclusive_writer(output_folder(output_dir)))
    _check_folder(output_dir, csv, overwrite)
    if len(heatmaps) > 1:
        from ..plotting.heatmap import heatmap_figure

        for steps in steps_used:
            heatmap_figure(steps).render_background()  # once here, not once per forked worker
    mark_incomplete(csv, output_dir)
    _run(jobs, workers, csv, output_dir, len(heatmaps) + len(comparisons) + len(dispatch) + len(drawn))
    return Drawn(heatmaps, comparisons, robustness, left_out, [job.path for job in dispatch])


def _marker_start(csv: Path) -> str:
    """How ``INCOMPLETE_MARKER`` begins in a folder where ``csv``'s figures are drawn."""
    return f"The figures of {csv}"


def mark_incomplete(csv: Path, output_dir: Path, sweep: str = "") -> None:
    """Write ``INCOMPLETE_MARKER`` into ``output_dir`` (made if need be): ``csv``'s figures are not all drawn there,
    and how to draw them; ``sweep``, the fingerprint of the sweep that wrote ``csv``, on a line of its own. A marker
    of ``csv`` already there is kept, with the fingerprint it holds."""
    output_dir.mkdir(parents=True, exist_ok=True)
    if _marker_of(output_dir, csv) is not None:
        return
    (output_dir / INCOMPLETE_MARKER).write_text(
        f"{_marker_start(csv)} are being drawn here, or their drawing was stopped: some may be missing. Draw them "
        f"all with plot_heatmap.py {csv} -o {output_dir}\n" + (f"{_SWEEP}{sweep}\n" if sweep else ""),
        encoding="utf-8")


#: How the marker's line naming the sweep that wrote the file begins.
_SWEEP = "sweep: "


def _marker_of(output_dir: Path, csv: Path) -> str | None:
    """The text of the marker of ``csv``'s stopped drawing in ``output_dir``, or None."""
    try:
        marker = (output_dir / INCOMPLETE_MARKER).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return marker if marker.startswith(_marker_start(csv) + " ") else None


def drawing_stopped(csv: Path, output_dir: Path, sweep: str) -> bool:
    """Whether ``output_dir`` holds the marker of a stopped drawing of ``csv``, written by the sweep of fingerprint
    ``sweep``."""
    marker = _marker_of(output_dir, csv)
    return marker is not None and f"\n{_SWEEP}{sweep}\n" in marker


def _check_folder(output_dir: Path, csv: Path, overwrite: bool) -> None:
    """Refuse (``OutputError``), unless ``overwrite``, a folder that holds PNG files or the marker of another file's
    drawing; a folder whose drawing of ``csv`` was stopped is drawn again in full."""
    if overwrite or not output_dir.is_dir():
        return
    try:
        marker = (output_dir / INCOMPLETE_MARKER).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        marker = None
    except OSError as error:
        raise OutputError(f"cannot read {output_dir / INCOMPLETE_MARKER}: {error.strerror}") from None
    if marker is not None:
        if marker.startswith(_marker_start(csv) + " "):
            return
        with exclusive_writer(output_folder(output_dir)):  # a drawing under way is another run's, named by its pid
            pass
        raise OutputError(f"{output_dir} holds the stopped drawing of another file ({INCOMPLETE_MARKER}); pass "
                          f"--overwrite to draw into it anyway, or choose another folder")
    pngs = sum(1 for _ in output_dir.glob("*.png"))
    if pngs:
        raise OutputError(f"{output_dir} holds {counted(pngs, '.png file')} already; pass --overwrite to draw into it "
                          f"anyway (a figure of the same name is replaced), or choose another folder")


def _lowest(key: str) -> dict[str, Any]:
    """The jitter of a dispatch figure's file name and title: none, the levels being its axis."""
    return {name: 0.0 for name in JITTER_KEYS if key in (name, "jitter")}


def figure_name(stem: str, taken: dict[str, int]) -> str:
    """``stem.png``, or ``stem_2.png`` and on when figures ``taken`` already has it: two environments or groups the
    name does not tell apart (two policy files or tables of one file name in two folders) are numbered, never lost
    nor written over."""
    taken[stem] = taken.get(stem, 0) + 1
    return f"{stem}.png" if taken[stem] == 1 else f"{stem}_{taken[stem]}.png"


class _Drawing:
    """The second reading of a sweep's output: its heatmap jobs, and on the way the curves of the environments
    that a robustness figure follows. ``planned``, per environment as the first reading found it: whether a
    robustness figure follows it, its policy grid's steps per unit and its heatmap's path; None for an environment left
    out."""

    def __init__(self, path: Path, source: BinaryIO, output_dir: Path, metric: str, taken: dict[str, int],
                 planned: list[tuple[bool, int, Path] | None]) -> None:
        self.path, self.source, self.output_dir, self.metric, self.planned = path, source, output_dir, metric, planned
        self.taken = taken
        self.curves: list[tuple[EnvParams, Workload | None, pd.DataFrame]] = []

    def heatmaps(self) -> Iterator[HeatmapJob]:
        for (params, rows), planned in zip(environments(read_results(self.path, source=self.source)), self.planned):
            if planned is not None:
                in_family, steps, heatmap = planned
                workload = workload_of(rows)
                if in_family:
                    self.curves.append((params, workload, curve_rows(rows)))
                yield HeatmapJob(params, workload, rows, steps, heatmap, self.metric)

    def robustness(self, paths: list[Path]) -> Iterator[RobustnessJob]:
        """Runs once every heatmap job was made (``chain`` asks for it last)."""
        for params, workload, key, family in jitter_families(self.curves):
            job = RobustnessJob(params, workload, key, family, self.output_dir / figure_name(
                f"robustness_{key}_{env_slug(params, workload)}", self.taken))
            paths.append(job.path)
            yield job


Job = HeatmapJob | ComparisonJob | RobustnessJob | DispatchJob


def _run(jobs: Iterator[Job], workers: int, csv: Path, output_dir: Path, total: int) -> None:
    """Draw ``jobs`` on ``workers`` processes with a progress bar (``total`` figures)."""
    from tqdm import tqdm

    drawn = ordered_map(_draw, jobs, workers)
    count = 0
    try:
        for _ in tqdm(drawn, total=total, unit="figure", file=sys.stderr, **bar_width(), mininterval=0.5,
                      disable=total < 2):
            check_locks()
            check_interrupt()
            count += 1
    except (KeyboardInterrupt, SystemError) as error:
        if interrupt_behind(error) is None:
            raise
        drawn.close()
        raise KeyboardInterrupt(f"interrupted after {count} of {total} figures (each written whole; "
                                f"{INCOMPLETE_MARKER} says the folder is not); the CSV is complete: draw them all "
                                f"with plot_heatmap.py {csv} -o {output_dir}") from None
    finally:
        drawn.close()
        # Workers stopped mid-figure cannot remove the file they were writing beside its name (atomic_output's).
        for temporary in output_dir.glob(".*.png.*.png"):
            temporary.unlink(missing_ok=True)


def _complete(rows: pd.DataFrame) -> int:
    """The steps per unit of an environment's policy grid; ``ResultsError`` when a policy is missing or repeated."""
    if rows["policy"].duplicated().any():
        raise ResultsError("lists a policy twice")
    try:
        steps = simplex_steps(rows)
    except ResultsError:
        raise ResultsError(f"has {len(rows)} rows, not a whole policy grid") from None
    if len(rows) != policy_count(steps):
        raise ResultsError(f"has {len(rows)} of the {policy_count(steps)} policies of its grid")
    for column in PRIO_COLUMNS:  # a share off the grid would land in no cell, or in another policy's
        shares = rows[column].to_numpy(dtype=float) * steps
        off = np.abs(shares - np.round(shares)) > 1e-6 * steps
        if off.any():
            line = rows.index[int(np.flatnonzero(off)[0])]
            raise ResultsError(f"has {column} = {float(rows.at[line, column])!r} at line {line}, off its policy grid "
                               f"(step 1/{steps})")
    if rows[[*PRIO_COLUMNS, *TIER_COLUMNS]].duplicated().any():
        raise ResultsError("lists a policy twice")
    return steps


def describe(drawn: Drawn) -> str:
    """``18 heatmaps, 4 schedule comparisons, 3 robustness figures``."""
    counts = [(len(drawn.heatmaps), "heatmap"), (len(drawn.comparisons), "schedule comparison"),
              (len(drawn.dispatch), "dispatch figure"), (len(drawn.robustness), "robustness figure")]
    return ", ".join(counted(count, name) for count, name in counts if count or
                     name == "heatmap")


def add_metric_argument(parser: Parser) -> None:
    parser.add_argument("--metric", choices=tuple(METRICS), default="completion_time",
                        help="what the heatmaps colour and name the best by (lower is better; default %(default)s; "
                             "the p95, p99 and std columns need a sweep with --samples > 1 to differ from it); the "
                             "schedule comparisons and robustness figures rank by completion time whatever it is")


def build_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, description=(
                        "Draw one heatmap per environment of a data_generator.py CSV or Parquet "
                        "file: every policy's completion time on one colour scale, the best one "
                        "outlined. Environments that differ only by schedule also get one "
                        "comparison figure (compare_*.png): best, default and worst policy per "
                        "schedule, the ideal time and the peak activations; environments that "
                        "differ only by a jitter level get one robustness figure "
                        "(robustness_*.png): how the best policies' mean and p95 move with the "
                        "noise; and environments that differ by schedule or dispatcher and by "
                        "their jitter get one dispatch figure (dispatch_*.png): every way against "
                        "the noise, relative to the best static order, above the lower bound."),
                    epilog=f"Example: {prog} outputs/data/example_20260101-120000.csv -o heatmaps")
    parser.add_argument("csv", type=Path, help="CSV (or Parquet file) written by data_generator.py; read in pieces, "
                                               "so memory stays flat however many rows it has")
    parser.add_argument("-o", "--output_dir", "--output-dir", type=Path, default=Path("heatmaps_output"), metavar="DIR",
                        help="folder for the PNGs (default %(default)s)")
    parser.add_argument("--workers", type=positive_int, metavar="N", default=os.cpu_count() or 1,
                        help="processes drawing in parallel (default: all %(default)s cores)")
    add_metric_argument(parser)
    parser.add_argument("--skip-incomplete", action="store_true",
                        help="draw the complete environments of a CSV that has incomplete ones, and name those "
                             "(default: refuse the CSV)")
    parser.add_argument("--overwrite", action="store_true",
                        help="draw into a folder that holds .png files already, replacing those of the same names "
                             "(without it, such a folder is refused, so that two files' figures never mix)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    args = build_parser(prog).parse_args(argv)

    def body() -> int:
        drawn = write_heatmaps(args.csv, args.output_dir, args.workers, args.metric, args.skip_incomplete,
                               args.overwrite)
        print(f"wrote {describe(drawn)} to {args.output_dir}")
        if drawn.left_out:
            print(f"left out {counted(len(drawn.left_out), 'incomplete environment')}: "
                  + "; ".join(drawn.left_out))
        return 0

    return run_command(prog, body)
