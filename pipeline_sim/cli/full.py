"""run_full_pipeline.py: config -> CSV -> heatmaps -> summary, in one command."""

from __future__ import annotations

import glob
import math
import re
import sys
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..results import SCHEDULE_KEYS, identity, parameter_value
from .common import Parser, counted, run_command, script_name
from .generate import DATA_DIR, add_sweep_arguments, generate
from .heatmap import add_metric_argument, describe, drawing_stopped, mark_incomplete, write_heatmaps

if TYPE_CHECKING:
    from ..sweep import SweepPlan

HEATMAP_DIR = Path("outputs/heatmaps")
SUMMARY_LINES = 20


def build_parser(prog: str) -> Parser:
    parser = Parser(prog=prog, description="Sweep every priority policy over a JSON grid of environments "
                                           "(CSV into outputs/data/), draw one heatmap per environment "
                                           "(into outputs/heatmaps/<run>/), and summarise the best policies.",
                    epilog=f"Example: {prog} -c configs/example.json")
    parser.add_argument("-c", "--config", type=Path, required=True, metavar="FILE",
                        help="JSON grid of environments: each parameter a value, a list, or "
                             "{\"start\": a, \"stop\": b, \"step\": s}; see configs/")
    add_sweep_arguments(parser, step_flags=("--priority_step", "--priority-step", "--step"))
    add_metric_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    args = build_parser(prog).parse_args(argv)

    def body() -> int:
        with ExitStack() as locks:  # the CSV, its samples and its figures' folder, held until the run ends
            plan, csv = generate(args.config, step=args.step, simulator=args.simulator, output=None,
                                 workers=args.workers, resume=args.resume, skip_invalid=args.skip_invalid,
                                 samples=args.samples, samples_output=args.samples_output, overwrite=args.overwrite,
                                 allow_large=args.allow_large, cluster=args.cluster, format=args.format, locks=locks,
                                 also_lock=heatmap_folder, unfinished=lambda plan: stopped_drawing(args.config, plan))
            heatmap_dir = heatmap_folder(csv)
            # a stop before the first figure leaves the folder marked too, with the sweep that --resume matches
            mark_incomplete(csv, heatmap_dir, plan.fingerprint())
            # the folder of this CSV alone, named after it: what it holds was drawn from this CSV as it was
            drawn = write_heatmaps(csv, heatmap_dir, args.workers, args.metric, overwrite=True)
        draws = f" x {plan.samples} samples" if plan.samples > 1 else ""
        print(f"\n{counted(plan.num_environments, 'environment')}, {counted(plan.num_simulations, 'simulation')} "
              f"({counted(len(plan.policies), 'policy', 'policies')}{draws} each)")
        varying = [name for name in plan.grid.varying() if name not in SCHEDULE_KEYS] or \
            (["model", "num_gpus"] if plan.grid.has_workload else ["n", "num_gpus"])
        if drawn.comparisons:
            print_schedule_summary(drawn.comparisons, varying, args.metric)
            # an environment whose schedule has no other to compare with is in no group: listed on its own
            groups = Counter(identity(params, workload, SCHEDULE_KEYS) for params, workload, _, _ in drawn.heatmaps)
            alone = [heatmap for heatmap in drawn.heatmaps if groups[identity(*heatmap[:2], SCHEDULE_KEYS)] < 2]
            if alone:
                print_best_policies(alone, [*varying, "schedule"], args.metric,
                                    "best policy of each environment with no other schedule to compare")
        else:
            print_best_policies(drawn.heatmaps, varying, args.metric,
                                f"best policy per environment (by {', '.join(varying)})")
        print(f"{plan.format.replace('csv', 'CSV').replace('parquet', 'Parquet')}: {csv}\nfigures: {heatmap_dir}/ "
              f"({describe(drawn)})")
        return 0

    return run_command(prog, body, resumes=True)


def heatmap_folder(csv: Path) -> Path:
    """Where the run draws the figures of ``csv``."""
    return HEATMAP_DIR / csv.stem


def stopped_drawing(config: Path, plan: SweepPlan) -> Path | None:
    """The newest CSV of ``config`` (named as ``generate.default_output`` names it) whose figures' folder says that
    their drawing by this command was stopped, the CSV written by a sweep of ``plan``'s fingerprint, or None."""
    if plan.format != "csv":
        return None
    named = re.compile(rf"{re.escape(config.stem)}_\d{{8}}-\d{{6}}(-\d+)?\.csv")
    fingerprint = plan.fingerprint()
    for csv in sorted((path for path in DATA_DIR.glob(f"{glob.escape(config.stem)}_*.csv")
                       if named.fullmatch(path.name)), key=lambda path: path.stem.removeprefix(config.stem),
                      reverse=True):
        if drawing_stopped(csv, heatmap_folder(csv), fingerprint):
            with open(csv, "rb") as rows:
                if rows.readline() == plan.header.encode() and sum(1 for _ in rows) == plan.num_rows:
                    return csv
    return None


def _where(params, workload, varying: list[str]) -> str:
    """``p2p_bandwidth=25  schedule=1f1b``: the varying parameters of one environment."""
    return "  ".join(f"{name}={_value(params, workload, name):<6}" for name in varying)


def _value(params, workload, name: str) -> str:
    """A parameter's value as the summary gives it; ``-`` where the environment does not read it, as the CSV's
    empty cell (an all-to-all's class without an all-to-all)."""
    return "-" if name in params.ignored() else _text(parameter_value(params, workload, name))


def _text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _report(row) -> str:
    """A workload's report of one row: iteration seconds, tokens per second, MFU, memory and whether it fits."""
    if "peak_memory_gb" not in row:
        return ""
    fits = "fits" if str(row["memory_fits"]) == "True" else "DOES NOT FIT"
    return (f", {row['tokens_per_second']:,.0f} tokens/s, MFU {row['mfu']:.1%}, peak memory "
            f"{row['peak_memory_gb']:.1f} of {row['gpu_memory_gb']:g} GB ({fits})")


def print_best_policies(heatmaps, varying: list[str], metric: str, title: str) -> None:
    """Under ``title``, each environment of ``heatmaps`` by its ``varying`` parameters, with its best policy and
    its ``metric`` (for a workload: its report), at most ``SUMMARY_LINES`` of them."""
    print(f"{title}:")
    shown = heatmaps[:SUMMARY_LINES]
    width = max([20, *(len(best["policy"]) for _, _, best, _ in shown)])  # a tie's label is longer
    for params, workload, best, _ in shown:
        unit = " s/iteration" if workload is not None and metric.startswith("completion") else ""
        print(f"  {_where(params, workload, varying)} -> {best['policy']:<{width}} {best[metric]:.6g}{unit}"
              f"{_report(best)}")
    if len(heatmaps) > SUMMARY_LINES:
        print(f"  ... and {counted(len(heatmaps) - SUMMARY_LINES, 'more environment')} (see the CSV)")


def print_schedule_summary(comparisons, varying: list[str], metric: str = "completion_time") -> None:
    """Per group of environments, each schedule's best policy, its time, the ideal and the peak activations
    (for a workload: its report); by completion time, as the comparison figures, whatever ``metric`` the heatmaps
    colour (then said)."""
    shown = comparisons[:max(1, SUMMARY_LINES // 4)]
    by = " by completion time, as the comparison figures" if metric != "completion_time" else ""
    print(f"best policy per schedule{by} (* = the fastest schedule of its environment):")
    # one set of columns for every group shown, so that they line up down the list
    width = max([24, *(len(name) for _, _, summary, _ in shown for name in summary["schedule"])])
    labels = max([18, *(len(label) for _, _, summary, _ in shown for label in summary["best_policy"])])
    for params, workload, summary, _ in shown:
        print("  " + ", ".join(f"{name}={_value(params, workload, name)}" for name in varying))
        fastest = summary["best_time"].idxmin()
        for i, row in summary.iterrows():
            mark = "*" if i == fastest else " "
            digits = ".4g" if workload is not None else ".6g"  # as the time it bounds is given, never rounded past it
            bound = "" if math.isnan(row.get("lower_bound", math.nan)) else \
                f", lower bound {row['lower_bound']:{digits}}"
            if workload is not None:
                print(f"   {mark} {row['schedule']:<{width}} {row['best_policy']:<{labels}} "
                      f"{format(row['best_time'], '.4g') + ' s/iteration':<17} (ideal {row['ideal_time']:.4g}{bound})"
                      f"{_report(row)}")
            else:
                print(f"   {mark} {row['schedule']:<{width}} {row['best_policy']:<{labels}} {row['best_time']:<10.6g} "
                      f"ideal {row['ideal_time']:<8.4g} peak activations {row['peak_activations']:g}{bound}")
    if len(comparisons) > len(shown):
        print(f"  ... and {counted(len(comparisons) - len(shown), 'more group')} (see the compare_*.png figures)")
