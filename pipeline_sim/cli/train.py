"""train.py: a learned dispatcher trained on the environments of a sweep config, for that sweep to compare."""

from __future__ import annotations

import csv
import hashlib
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..config import ConfigError, EnvironmentGrid
from ..files import atomic_output, check_locks, exclusive_writer, output_target
from ..model import DEFAULT_POLICY, EnvParams
from ..rl.settings import Settings, extra_missing
from .common import (
    Parser,
    UserError,
    bar_width,
    bounded_int,
    check_interrupt,
    counted,
    interrupt_status,
    positive_int,
    ready_kernel,
    run_command,
    script_name,
    use_display,
)

#: Seeds the training takes: its random generators take 32-bit seeds.
SEEDS = 2 ** 32

if TYPE_CHECKING:
    from ..learned import LearnedPolicy


def build_parser(prog: str, defaults: Settings) -> Parser:
    parser = Parser(prog=prog, description=(
        "Train a learned dispatcher with masked PPO on the environments of a sweep config: those whose dispatch is "
        "learned:<file>. Each episode is one iteration of one of them, on a fresh noise draw no sweep uses; the "
        "network is played on validation draws as it trains and the best one is written to <file>, with its "
        "training curve (CSV and PNG) beside it. The same config then sweeps it against the static orders and the "
        "compiled rules, on the sweep's own draws (docs/model.md section 12.5). Needs the [rl] extra."))
    parser.add_argument("-c", "--config", type=Path, required=True,
                        help="JSON grid naming learned:<file> among its dispatch values")
    parser.add_argument("--policy-file", type=Path, default=None, metavar="FILE",
                        help="which learned:<file> to train when the config names several")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help=f"decisions to train on (default {defaults.steps:,})")
    parser.add_argument("--evaluate-every", type=positive_int, default=None, metavar="STEPS",
                        help=f"decisions between validation plays (default {defaults.evaluate_every:,})")
    parser.add_argument("--validation-samples", type=positive_int, default=None, metavar="K",
                        help=f"validation draws per environment (default {defaults.validation_samples})")
    parser.add_argument("--seed", type=lambda text: bounded_int(text, 0, SEEDS - 1), default=0,
                        help=f"seed of the network, the draws and the environment mix, from 0 to {SEEDS - 1:,} "
                             f"(default %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing policy file")
    return parser


def training_environments(config: Path, chosen: Path | None) -> tuple[Path, list[EnvParams]]:
    """The policy file to write and the environments to train it on: the config's with ``learned:<that file>``."""
    grid = EnvironmentGrid.load(config)
    raw = grid.given_dict()
    names = sorted({value[len("learned:"):] for value in raw.get("dispatch", ()) if str(value).startswith("learned:")})
    if not names:
        raise UserError(f"config {config}: no dispatch value is learned:<file>; add one (\"dispatch\": [..., "
                        f"\"learned:outputs/learned/{config.stem}.npz\"]) to say which environments to train on and "
                        f"where the policy goes")
    if chosen is not None:
        if str(chosen) not in names:
            raise UserError(f"--policy-file {chosen}: the config names {', '.join(names)}")
        name = str(chosen)
    elif len(names) > 1:
        raise UserError(f"config {config} names {len(names)} policy files ({', '.join(names)}); choose one with "
                        f"--policy-file")
    else:
        name = names[0]
    # the learned environments, under the compiled rule whose graph and memory an episode takes
    training = EnvironmentGrid.from_mapping(raw | {"dispatch": ["greedy"]}, f"config {config}")
    environments = list(training.environments())
    if not environments:
        where, reason = training.invalid()[0]
        reason = reason.replace("dispatch = 'greedy'", f"dispatch = 'learned:{name}'")  # the rule stands for it
        raise UserError(f"config {config}: no environment of the grid can run under a dispatcher: {where}: {reason}")
    return Path(name), environments


def write_curve(curve: list, path: Path, network: str) -> None:
    """The training curve as CSV, each row naming the ``network`` it trained (its file's checksum)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        names = [f.name for f in fields(curve[0])]
        writer.writerow([*names, "network"])
        for point in curve:
            writer.writerow([*(repr(getattr(point, name)) for name in names), network])


def draw_curve(curve: list, path: Path, title: str, reference: str) -> None:
    use_display(no_show=True)
    import matplotlib.pyplot as plt

    from ..plotting.training import plot_training

    fig, ax = plt.subplots(figsize=(9, 5.5), layout="constrained")
    plot_training(ax, [p.steps for p in curve], [p.training_saving for p in curve],
                  [p.validation_saving for p in curve], curve[0].rule_saving, title, reference)
    try:
        fig.savefig(path, dpi=130, format="png")
    finally:
        plt.close(fig)


def save_training(policy: LearnedPolicy, curve: list, output: Path, curve_csv: Path, curve_png: Path,
                  title: str, reference: str) -> None:
    """The network and its training curve as one unit: each is written beside its name first, then all are moved
    into place together, the network last, and the curve names the network it belongs to (the checksum of its
    file, in the CSV and the figure's title). When they cannot all be written (a full disk), the network is still
    written alone if it can be, the previous run's curve removed so that none describes it, and the error names
    the file that failed."""
    data = policy.to_bytes()
    network = hashlib.sha256(data).hexdigest()[:16]
    try:
        with atomic_output(output) as policy_file:  # nested so that a failure is named by its own file
            policy_file.write_bytes(data)
            with atomic_output(curve_csv) as csv_file:
                write_curve(curve, csv_file, network)
                with atomic_output(curve_png) as png_file:
                    draw_curve(curve, png_file, f"{title} (network {network})", reference)
    except OSError as error:
        try:
            for path in (curve_csv, curve_png):
                path.unlink(missing_ok=True)
            with atomic_output(output) as policy_file:
                policy_file.write_bytes(data)
        except OSError:
            raise error from None
        raise UserError(f"{error.strerror}; the network alone is written to {output}, without its training "
                        f"curve") from None


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    prog = prog or script_name(sys.argv[0])
    missing = extra_missing()  # without the [rl] extra even --help has nothing to offer but how to install it
    if missing:
        print(f"{prog}: error: {missing}", file=sys.stderr)
        return 2
    args = build_parser(prog, Settings()).parse_args(argv)

    def body() -> int:
        try:  # PyTorch and the rest of the extra, loaded once the arguments are good
            from ..rl.env import reference_name
            from ..rl.train import REFERENCE, check_layouts, train
        except ImportError as error:
            raise UserError(str(error)) from None
        try:
            output, environments = training_environments(args.config, args.policy_file)
        except ConfigError as error:
            raise UserError(str(error)) from None
        settings = Settings(**{name: value for name, value in (("steps", args.steps), ("seed", args.seed),
                                                                ("evaluate_every", args.evaluate_every),
                                                                ("validation_samples", args.validation_samples))
                               if value is not None})
        check_layouts(environments)
        output_target(output)
        if output.suffix.lower() != ".npz":
            raise UserError(f"learned:{output}: a policy file is .npz; name it so in the config")
        if output.exists() and not args.overwrite:
            raise UserError(f"{output} exists; pass --overwrite to train it again")
        against = reference_name(environments, REFERENCE)
        curve_csv = output.with_name(output.stem + "_training.csv")
        curve_png = curve_csv.with_suffix(".png")
        output.parent.mkdir(parents=True, exist_ok=True)
        ready_kernel(episodes=True)
        from tqdm import tqdm

        with exclusive_writer(output), exclusive_writer(curve_csv), exclusive_writer(curve_png):
            print(f"training {output} on {counted(len(environments), 'environment')} of "
                  f"{args.config} for {settings.steps:,} decisions (seed {settings.seed})", file=sys.stderr)
            # decisions are taken a copy each at once: the first rollout fills once each copy took ``rollout``
            if -(-settings.steps // settings.environments_per_update) < settings.rollout:
                print(f"{prog}: note: --steps {settings.steps:,} is less than one update of the network "
                      f"({settings.environments_per_update} x {settings.rollout:,} decisions): the network written is "
                      f"the untrained one", file=sys.stderr)
            started = time.monotonic()
            # short enough beside a bar on 80 columns: the decisions (as the line above says), the time, the last
            # validation
            bar = tqdm(total=settings.steps, file=sys.stderr, **bar_width(), mininterval=0.5, leave=False,
                       bar_format="{percentage:3.0f}%|{bar}| {n:,}/{total:,} [{elapsed}<{remaining}]{postfix}")
            timed = [False]  # whether the bar's clock was started at the first decisions

            def progress(steps: int, checkpoint: object) -> None:
                if not timed[0] and steps > 0:  # the first validation, before any decision, says nothing of rates
                    bar.reset(total=settings.steps)
                    timed[0] = True
                bar.update(min(steps, settings.steps) - bar.n)
                check_interrupt()
                if checkpoint is not None:
                    bar.set_postfix_str(f"validation {checkpoint.validation_saving:+.1%} vs {against}")  # type: ignore[attr-defined]
            try:
                policy, curve, completed = train(environments, DEFAULT_POLICY, settings, progress=progress,
                                                 about={"config": str(args.config),
                                                        "environments": len(environments)})
            finally:
                bar.close()
            check_locks()
            save_training(policy, curve, output, curve_csv, curve_png,
                          f"{output.name}: {len(environments)} environments of {args.config.name}", against)
        best = max(curve, key=lambda p: p.validation_saving)
        print(f"trained {curve[-1].steps:,} decisions ({curve[-1].episodes:,} iterations) in "
              f"{(time.monotonic() - started) / 60:.1f} min")
        others = sorted({params.schedule for params in environments if not params.lengths} - {REFERENCE})
        below = f"; {', '.join(others)} environments are measured against it too" if others else ""
        print(f"validation draws, time saved against {against} (higher is better{below}): the kept network "
              f"(decision {best.steps:,}) {best.validation_saving:+.2%}, greedy {best.rule_saving:+.2%}")
        print(f"policy: {output}\ncurve: {curve_csv}, {curve_png}")
        print(f"compare it on the sweep's own draws: python run_full_pipeline.py -c {args.config} --priority-step 1.0 "
              f"(a learned row plays the network at each decision: the coarse step keeps the sweep short)")
        if not completed:  # stopped as every tool stops: the last line says so, the status is an interrupt's
            print(f"{prog}: interrupted; the best network of the evaluations up to decision {curve[-1].steps:,} "
                  f"is written", file=sys.stderr)
            return interrupt_status()
        return 0

    return run_command(prog, body)
