"""plot_heatmap.py: one heatmap PNG per environment of a sweep's CSV."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from ..files import atomic_output
from ..model import EnvParams
from ..parallel import ordered_map
from ..results import (ResultsError, best_rows, env_slug, env_title, environments, group_slug, load_results,
                       schedule_groups, simplex_steps)
from .common import Parser, positive_int, run_command, script_name


@dataclass(frozen=True)
class HeatmapJob:
    """One environment's rows and where its figure goes."""

    params: EnvParams
    rows: pd.DataFrame
    steps: int
    path: Path

    def draw(self) -> Path:
        from matplotlib.figure import Figure

        from ..plotting.heatmap import figure_size, plot_policy_heatmaps

        fig = Figure(figsize=figure_size(self.steps), layout="constrained")
        plot_policy_heatmaps(fig, self.rows, self.steps, title=env_title(self.params))
        return _save(fig, self.path)


@dataclass(frozen=True)
class ComparisonJob:
    """One group of environments that differ only by schedule, summarised per schedule."""

    params: EnvParams
    summary: pd.DataFrame
    path: Path

    def draw(self) -> Path:
        from matplotlib.figure import Figure

        from ..plotting.comparison import figure_size, plot_schedule_comparison

        fig = Figure(figsize=figure_size(len(self.summary)))
        plot_schedule_comparison(fig, self.summary, title=env_title(self.params, schedule=False))
        return _save(fig, self.path)


def _save(fig, path: Path) -> Path:
    with atomic_output(path) as temporary:
        fig.savefig(temporary, dpi=110, format="png")
    return path


def _draw(job: HeatmapJob | ComparisonJob) -> Path:
    """Render and save one figure (runs in worker processes)."""
    return job.draw()


@dataclass(frozen=True)
class Drawn:
    """What ``write_heatmaps`` drew: per environment (params, best policy, its time, file); per group of
    schedules (params, summary, file)."""

    heatmaps: list[tuple[EnvParams, str, float, Path]]
    comparisons: list[tuple[EnvParams, pd.DataFrame, Path]]


def write_heatmaps(csv: Path, output_dir: Path, workers: int = 1) -> Drawn:
    """Draw every environment of ``csv``, and every group of schedules to compare, into ``output_dir``."""
    from tqdm import tqdm

    frame = load_results(csv)
    jobs: list[HeatmapJob | ComparisonJob] = []
    heatmaps, comparisons = [], []
    for params, rows in environments(frame):  # check every environment before drawing any
        if rows["policy"].duplicated().any():
            raise ResultsError(f"CSV {csv}: environment {env_slug(params)} lists a policy twice")
        job = HeatmapJob(params, rows, simplex_steps(rows), output_dir / f"{env_slug(params)}.png")
        best = best_rows(rows).iloc[0]
        jobs.append(job)
        heatmaps.append((params, best["policy"], float(best["completion_time"]), job.path))
    for params, summary in schedule_groups(frame):
        job = ComparisonJob(params, summary, output_dir / f"compare_{group_slug(params)}.png")
        jobs.append(job)
        comparisons.append((params, summary, job.path))
    drawn = ordered_map(_draw, jobs, min(workers, len(jobs)))
    for _ in tqdm(drawn, total=len(jobs), unit="figure", file=sys.stderr, dynamic_ncols=True, mininterval=0.5,
                  disable=len(jobs) < 2):
        pass
    return Drawn(heatmaps, comparisons)


def build_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, description="Draw one heatmap per environment of a data_generator.py CSV: every "
                                           "policy's completion time on one colour scale, the best one outlined. "
                                           "Environments that differ only by schedule also get one comparison "
                                           "figure (compare_*.png): best, default and worst policy per schedule, "
                                           "the ideal time and the peak activations.",
                    epilog=f"Example: {prog} outputs/data/example_20260101-120000.csv -o heatmaps")
    parser.add_argument("csv", type=Path, help="CSV written by data_generator.py")
    parser.add_argument("-o", "--output_dir", type=Path, default=Path("heatmaps_output"), metavar="DIR",
                        help="folder for the PNGs (default %(default)s)")
    parser.add_argument("--workers", type=positive_int, metavar="N", default=os.cpu_count() or 1,
                        help="processes drawing in parallel (default: all %(default)s cores)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    args = build_parser(prog).parse_args(argv)

    def body() -> int:
        drawn = write_heatmaps(args.csv, args.output_dir, args.workers)
        count = len(drawn.heatmaps)
        compared = f" and {len(drawn.comparisons)} schedule comparison{'s' if len(drawn.comparisons) != 1 else ''}" \
            if drawn.comparisons else ""
        print(f"wrote {count} heatmap{'s' if count != 1 else ''}{compared} to {args.output_dir}")
        return 0

    return run_command(prog, body)
