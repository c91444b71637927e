"""Static ZB-H1's headroom to the best order with hindsight, and the share of it each scheduler captures.

    python benchmarks/headroom.py               # 20 draws per environment, about 1.5 minutes on 2 cores
    python benchmarks/headroom.py --draws 5
    python benchmarks/headroom.py --unseen --draws 10         # about 6 minutes on 2 cores
    python benchmarks/headroom.py --held-out --learned outputs/learned/learned.npz --draws 10

n = 8 on 4 GPUs, ZB-H1, at the default transfer policy (F0.5 G0.3 S0.2), on the default communication and on
free links (prop_len = sync_base_len = 0), at 0, 20 and 30% compute and communication jitter, draws 0 to k - 1.
Per scheduler: mean and p95 of the iteration time against static ZB-H1's, and the share of static's headroom to
hindsight it captures, of the mean and of the p95: (static - it) / (static - hindsight). ``means`` is the
hindsight order of the noise-free lengths, run on every draw: a static order solved on expected lengths.
``--held-out`` measures instead environments configs/learned.json never trains on: n = 12, 6 GPUs, 50% jitter,
free links (one change each from n = 8, 4 GPUs, 30% jitter, the default communication); ``--unseen`` those the
look-ahead was never tuned on: n = 12 on 6 and 8 GPUs, at 20, 30 and 50% jitter, on the
default communication and on free links; ``--learned FILE`` adds a learned dispatcher. Needs the [solver] extra.
Prints a table; ``--json`` also writes it.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline_sim.cli.common import Parser, positive_int  # noqa: E402
from pipeline_sim.engine import memory_bound, simulate_figures  # noqa: E402
from pipeline_sim.files import OutputError, atomic_output, output_target  # noqa: E402
from pipeline_sim.hindsight import hindsight, static_params  # noqa: E402
from pipeline_sim.learned import figures_of, load_policy  # noqa: E402
from pipeline_sim.model import DEFAULT_POLICY, EnvParams, ParameterError  # noqa: E402

RULES = ("greedy", "critical-path", "zb-adaptive", "lookahead")
#: The environments of the study: (name, changes from n = 8, 4 GPUs, ZB-H1 at the default communication).
STUDY = [(f"{links} {jitter:.0%}", {**({"prop_len": 0.0, "sync_base_len": 0.0} if links == "free" else {}),
                                    "compute_jitter": jitter, "comm_jitter": jitter})
         for links in ("contended", "free") for jitter in (0.0, 0.2, 0.3)]
HELD_OUT = [("n = 12, 30%", {"n": 12, "compute_jitter": 0.3, "comm_jitter": 0.3}),
            ("6 GPUs, 30%", {"num_gpus": 6, "compute_jitter": 0.3, "comm_jitter": 0.3}),
            ("50% jitter", {"compute_jitter": 0.5, "comm_jitter": 0.5}),
            ("free, 30%", {"prop_len": 0.0, "sync_base_len": 0.0, "compute_jitter": 0.3, "comm_jitter": 0.3})]
UNSEEN = [(f"{gpus} GPUs {links} {jitter:.0%}", {"n": 12, "num_gpus": gpus, "compute_jitter": jitter,
                                                 "comm_jitter": jitter,
                                                 **({"prop_len": 0.0, "sync_base_len": 0.0} if links == "free"
                                                    else {})})
          for gpus in (6, 8) for links in ("contended", "free") for jitter in (0.2, 0.3, 0.5)]


def draw(case: tuple[str, dict, int, tuple[str, ...]]) -> dict:
    """Every way's time on one draw at the default policy, the memory-aware bound and hindsight's proof."""
    name, changes, sample, extra = case
    params = EnvParams(**{"n": 8, "num_gpus": 4, "schedule": "zb-h1", **changes})
    times = {"static": float(simulate_figures(params, [DEFAULT_POLICY], sample)[0, 0])}
    for rule in (*RULES, *extra, "hindsight"):
        times[rule] = float(figures_of(replace(params, dispatch=rule), [DEFAULT_POLICY], sample)[0, 0])
    means = hindsight(replace(params, compute_jitter=0.0, comm_jitter=0.0, dispatch="hindsight"), 0).order
    times["means"] = float(simulate_figures(static_params(params), [DEFAULT_POLICY], sample, means)[0, 0])
    return {"environment": name, "sample": sample, **times, "bound": memory_bound(params, sample),
            "proven": hindsight(replace(params, dispatch="hindsight"), sample).status == "optimal"}


def main() -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=positive_int, default=20, metavar="K",
                        help="draws per jittered environment (default %(default)s)")
    parser.add_argument("--workers", type=positive_int, default=2, metavar="N",
                        help="worker processes (default %(default)s)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write every draw's times as JSON")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    parser.add_argument("--held-out", action="store_true", help="the environments learned.json never trains on")
    parser.add_argument("--unseen", action="store_true", help="n = 12 on 6 and 8 GPUs, 20 to 50%% jitter, both links")
    parser.add_argument("--learned", help="a learned dispatcher's policy file, measured beside the rules")
    args = parser.parse_args()
    extra = (f"learned:{args.learned}",) if args.learned else ()
    ways = ("static", *RULES, *extra, "means", "hindsight")
    environments = UNSEEN if args.unseen else HELD_OUT if args.held_out else STUDY
    try:  # what cannot run is said before the minutes of work: the output's folder, the policy file
        if args.json is not None:
            output_target(args.json)
            if args.json.exists() and not args.overwrite:
                raise OutputError(f"--json {args.json} exists; pass --overwrite to replace it")
        for name, changes in environments if extra else ():
            load_policy(EnvParams(**{"n": 8, "num_gpus": 4, "schedule": "zb-h1", **changes, "dispatch": extra[0]}))
    except (OutputError, ParameterError) as error:
        parser.error(str(error))
    cases = [(name, changes, sample, extra) for name, changes in environments
             for sample in range(1 if not changes.get("compute_jitter") else args.draws)]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(draw, cases))
    print("environment           static mean/p95  " + "  ".join(f"{w.split('/')[-1]:>26}" for w in ways[1:])
          + "  proven  bound")
    for name, _ in environments:
        group = [r for r in rows if r["environment"] == name]
        stats = {w: (np.mean([r[w] for r in group]), np.percentile([r[w] for r in group], 95)) for w in ways}
        static, best = stats["static"], stats["hindsight"]
        cells = []
        for way in ways[1:]:
            mean, p95 = stats[way]
            share = [(s - v) / (s - h) if s - h > 1e-9 else float("nan")
                     for s, v, h in ((static[0], mean, best[0]), (static[1], p95, best[1]))]
            shares = "/".join("n/a" if np.isnan(part) else f"{part:.0%}" for part in share)
            cells.append(f"{mean / static[0] - 1:+.1%}/{p95 / static[1] - 1:+.1%} ({shares})")
        proven = sum(r["proven"] for r in group)
        bound = np.mean([r["bound"] for r in group])
        print(f"{name:<20} {static[0]:>7.2f}/{static[1]:<7.2f}  " + "  ".join(f"{c:>26}" for c in cells)
              + f"  {proven:>3}/{len(group):<3} {bound:6.2f}", flush=True)
    if args.json:
        with atomic_output(args.json) as temporary:
            temporary.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
