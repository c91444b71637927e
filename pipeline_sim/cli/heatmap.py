"""plot_heatmap.py: one heatmap PNG per environment of a sweep's CSV."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from ..files import atomic_output
from ..model import EnvParams
from ..results import ResultsError, best_rows, env_slug, env_title, environments, load_results, simplex_steps
from .common import Parser, run_command, script_name


def write_heatmaps(csv: Path, output_dir: Path) -> list[tuple[EnvParams, str, float, Path]]:
    """Draw every environment of ``csv`` into ``output_dir``; return (environment, best policy, time, file)."""
    from matplotlib.figure import Figure
    from tqdm import tqdm

    from ..plotting.heatmap import figure_size, plot_policy_heatmaps

    frame = load_results(csv)
    groups = list(environments(frame))
    written = []
    for params, rows in tqdm(groups, unit="heatmap", file=sys.stderr, dynamic_ncols=True, mininterval=0.5,
                             disable=len(groups) < 2):
        if rows["policy"].duplicated().any():
            raise ResultsError(f"CSV {csv}: environment {env_slug(params)} lists a policy twice")
        k = simplex_steps(rows)
        fig = Figure(figsize=figure_size(k), layout="constrained")
        plot_policy_heatmaps(fig, rows, k, title=env_title(params))
        path = output_dir / f"{env_slug(params)}.png"
        with atomic_output(path) as temporary:
            fig.savefig(temporary, dpi=110, format="png")
        best = best_rows(rows).iloc[0]
        written.append((params, best["policy"], float(best["completion_time"]), path))
    return written


def build_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, description="Draw one heatmap per environment of a data_generator.py CSV: every "
                                           "policy's completion time on one colour scale, the best one outlined.",
                    epilog=f"Example: {prog} outputs/data/example_20260101-120000.csv -o heatmaps")
    parser.add_argument("csv", type=Path, help="CSV written by data_generator.py")
    parser.add_argument("-o", "--output_dir", type=Path, default=Path("heatmaps_output"),
                        help="folder for the PNGs (default %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    args = build_parser(prog).parse_args(argv)

    def body() -> int:
        written = write_heatmaps(args.csv, args.output_dir)
        print(f"wrote {len(written)} heatmap{'s' if len(written) != 1 else ''} to {args.output_dir}")
        return 0

    return run_command(prog, body)
