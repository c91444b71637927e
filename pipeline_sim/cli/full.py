"""run_full_pipeline.py: config -> CSV -> heatmaps -> summary, in one command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from .common import Parser, run_command, script_name
from .generate import add_sweep_arguments, generate
from .heatmap import write_heatmaps

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
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    args = build_parser(prog).parse_args(argv)

    def body() -> int:
        plan, csv = generate(args.config, step=args.step, simulator=args.simulator, output=None,
                             workers=args.workers, resume=args.resume)
        heatmap_dir = HEATMAP_DIR / csv.stem
        written = write_heatmaps(csv, heatmap_dir, args.workers)
        print(f"\n{plan.num_environments:,} environments, {plan.num_simulations:,} simulations "
              f"({len(plan.policies)} policies each)")
        varying = [name for name, values in plan.grid.values if len(values) > 1] or ["n", "num_gpus"]
        print(f"best policy per environment (by {', '.join(varying)}):")
        for params, policy, time, _ in written[:SUMMARY_LINES]:
            where = "  ".join(f"{name}={getattr(params, name):<6g}" for name in varying)
            print(f"  {where} -> {policy:<20} {time:.6g}")
        if len(written) > SUMMARY_LINES:
            print(f"  ... and {len(written) - SUMMARY_LINES:,} more environments (see the CSV)")
        print(f"CSV: {csv}\nheatmaps: {heatmap_dir}/ ({len(written)} files)")
        return 0

    return run_command(prog, body)
