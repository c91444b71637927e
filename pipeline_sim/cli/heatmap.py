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
from ..results import ResultsError, best_rows, env_slug, env_title, environments, load_results, simplex_steps
from .common import Parser, positive_int, run_command, script_name


@dataclass(frozen=True)
class HeatmapJob:
    """One environment's rows and where its figure goes."""

    params: EnvParams
    rows: pd.DataFrame
    steps: int
    path: Path


def draw_heatmap(job: HeatmapJob) -> Path:
    """Render and save one environment's figure (runs in worker processes)."""
    from matplotlib.figure import Figure

    from ..plotting.heatmap import figure_size, plot_policy_heatmaps

    fig = Figure(figsize=figure_size(job.steps), layout="constrained")
    plot_policy_heatmaps(fig, job.rows, job.steps, title=env_title(job.params))
    with atomic_output(job.path) as temporary:
        fig.savefig(temporary, dpi=110, format="png")
    return job.path


def write_heatmaps(csv: Path, output_dir: Path, workers: int = 1) -> list[tuple[EnvParams, str, float, Path]]:
    """Draw every environment of ``csv`` into ``output_dir``; return (environment, best policy, time, file)."""
    from tqdm import tqdm

    frame = load_results(csv)
    jobs, summary = [], []
    for params, rows in environments(frame):  # check every environment before drawing any
        if rows["policy"].duplicated().any():
            raise ResultsError(f"CSV {csv}: environment {env_slug(params)} lists a policy twice")
        job = HeatmapJob(params, rows, simplex_steps(rows), output_dir / f"{env_slug(params)}.png")
        best = best_rows(rows).iloc[0]
        jobs.append(job)
        summary.append((params, best["policy"], float(best["completion_time"]), job.path))
    drawn = ordered_map(draw_heatmap, jobs, min(workers, len(jobs)))
    for _ in tqdm(drawn, total=len(jobs), unit="heatmap", file=sys.stderr, dynamic_ncols=True, mininterval=0.5,
                  disable=len(jobs) < 2):
        pass
    return summary


def build_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, description="Draw one heatmap per environment of a data_generator.py CSV: every "
                                           "policy's completion time on one colour scale, the best one outlined.",
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
        written = write_heatmaps(args.csv, args.output_dir, args.workers)
        print(f"wrote {len(written)} heatmap{'s' if len(written) != 1 else ''} to {args.output_dir}")
        return 0

    return run_command(prog, body)
