"""run_full_pipeline.py: config -> CSV -> heatmaps -> summary, in one command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from .common import Parser, run_command, script_name
from .generate import add_sweep_arguments, generate
from ..results import SCHEDULE_KEYS
from .heatmap import add_metric_argument, describe, write_heatmaps

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
    add_sweep_arguments(parser, step_flags=("--priority_step", "--priority-step"))
    add_metric_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    args = build_parser(prog).parse_args(argv)

    def body() -> int:
        plan, csv = generate(args.config, step=args.step, simulator=args.simulator, output=None,
                             workers=args.workers, resume=args.resume, skip_invalid=args.skip_invalid,
                             samples=args.samples, samples_output=args.samples_output)
        heatmap_dir = HEATMAP_DIR / csv.stem
        drawn = write_heatmaps(csv, heatmap_dir, args.workers, args.metric)
        draws = f" x {plan.samples} samples" if plan.samples > 1 else ""
        print(f"\n{plan.num_environments:,} environments, {plan.num_simulations:,} simulations "
              f"({len(plan.policies)} policies{draws} each)")
        varying = [name for name in plan.grid.varying() if name not in SCHEDULE_KEYS] or ["n", "num_gpus"]
        if drawn.comparisons:
            print_schedule_summary(drawn.comparisons, varying)
        else:
            print(f"best policy per environment (by {', '.join(varying)}):")
            for params, policy, time, _ in drawn.heatmaps[:SUMMARY_LINES]:
                where = "  ".join(f"{name}={getattr(params, name):<6g}" for name in varying)
                print(f"  {where} -> {policy:<20} {time:.6g}")
            if len(drawn.heatmaps) > SUMMARY_LINES:
                print(f"  ... and {len(drawn.heatmaps) - SUMMARY_LINES:,} more environments (see the CSV)")
        print(f"CSV: {csv}\nfigures: {heatmap_dir}/ ({describe(drawn)})")
        return 0

    return run_command(prog, body)


def print_schedule_summary(comparisons, varying: list[str]) -> None:
    """Per group of environments, each schedule's best policy, its time, the ideal and the peak activations."""
    shown = comparisons[:max(1, SUMMARY_LINES // 4)]
    print("best policy per schedule (* = the fastest schedule of its environment):")
    for params, summary, _ in shown:
        print("  " + ", ".join(f"{name}={getattr(params, name):g}" for name in varying))
        fastest = summary["best_time"].idxmin()
        for i, row in summary.iterrows():
            mark = "*" if i == fastest else " "
            print(f"   {mark} {row['schedule']:<24} {row['best_policy']:<18} {row['best_time']:<10.6g} "
                  f"ideal {row['ideal_time']:<8.4g} peak activations {row['peak_activations']:g}")
    if len(comparisons) > len(shown):
        print(f"  ... and {len(comparisons) - len(shown):,} more groups (see the compare_*.png figures)")
