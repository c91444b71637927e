"""A table of lengths as an environment (docs/model.md section 8): a measured iteration's lengths swept under every
policy, dispatcher and noise level, drawn, bounded, played by a learned dispatcher; bad tables refused in one line."""

from __future__ import annotations

import csv
import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, assert_png_drawn, run_here, write_config

from pipeline_sim.config import EnvironmentGrid
from pipeline_sim.engine import bound_of_lengths, bound_of_run, lower_bound, memory_bound, simulate
from pipeline_sim.learned import figures_of
from pipeline_sim.model import EnvParams, ParameterError, Policy
from pipeline_sim.scenarios import policy_grid
from pipeline_sim.schedules import SCHEDULES
from pipeline_sim.sweep import SweepPlan, run_sweep
from pipeline_sim.taskgraph import build_task_graph, task_lengths, task_texts
from tests.test_learned import GREEDY_ORDER, ranked, written

TABLES = ROOT / "configs" / "tables"


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _policy(row: dict[str, str]) -> Policy:
    return next(policy for policy in policy_grid(1.0) if policy.label == row["policy"])


def test_the_shipped_table_config_sweeps_each_table_in_its_own_environment():
    plan = SweepPlan(EnvironmentGrid.load(ROOT / "configs" / "measured.json"))
    environments = list(plan.grid)
    assert len(environments) == 24 and plan.grid.invalid() == ()
    assert list(EnvironmentGrid.from_mapping(plan.grid.given_dict())) == environments
    # a grid without a table reads, and its sweep's record is, as before tables existed
    assert "lengths" not in EnvironmentGrid.from_mapping({"n": 8}).as_dict()
    for params in environments:
        table = json.loads(Path(params.lengths).read_text())
        assert f"--schedule {params.schedule} -n {params.n} --num-gpus {params.num_gpus}" in table["flags"]
        assert set(table["lengths"]) == set(task_texts(params))
        assert (params.sync_base_len, params.fwd_impact, params.bwd_impact) == (0.0, 0.0, 0.0)  # as measured


def test_a_table_runs_through_the_pipeline_as_the_engine_runs_it(tmp_path):
    shutil.copytree(ROOT / "configs" / "tables", tmp_path / "configs" / "tables")
    config = write_config(tmp_path, {"lengths": "configs/tables/zb-h1.json", "dispatch": ["static", "greedy"],
                                     "compute_jitter": [0.0, 0.3], "samples": 3}, "zbh1.json")
    result = run_here("run_full_pipeline.py", "-c", str(config), "--priority_step", "1.0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [output] = (tmp_path / "outputs" / "data").glob("zbh1_*.csv")
    rows = _rows(output)
    assert len(rows) == 4 * 31 and {row["lengths"] for row in rows} == {"configs/tables/zb-h1.json"}
    assert {(row["schedule"], row["n"], row["num_gpus"], row["sync_base_len"]) for row in rows} == \
        {("zb-h1", "8", "2", "0.0")}  # the table's flags
    for row in rows[::13]:
        params = EnvParams(n=8, num_gpus=2, schedule="zb-h1", fwd_len=float(row["fwd_len"]),
                           bwd_len=float(row["bwd_len"]), prop_len=float(row["prop_len"]), sync_base_len=0.0,
                           fwd_impact=0.0, bwd_impact=0.0, dispatch=row["dispatch"],
                           compute_jitter=float(row["compute_jitter"]), lengths="configs/tables/zb-h1.json")
        draws = 3 if params.jittered else 1
        with_cwd = replace(params, lengths=str(tmp_path / params.lengths))
        runs = [simulate(with_cwd, _policy(row), sample) for sample in range(draws)]
        assert float(row["completion_time"]) == math.fsum(run.completion_time for run in runs) / draws
        assert float(row["lower_bound"]) == math.fsum(run.lower_bound for run in runs) / draws
        assert float(row["lower_bound"]) <= float(row["memory_bound"]) <= float(row["completion_time"])
    figures = tmp_path / "outputs" / "heatmaps" / output.stem
    heatmaps = sorted(figures.glob("table-zb-h1_n8_gpus2_*.png"))
    assert len(heatmaps) == 4 and len(list(figures.glob("dispatch_*table-zb-h1*.png"))) == 1
    for path in heatmaps[::3]:
        assert_png_drawn(path, min_width=1200, min_height=700)
    best = min(float(row["completion_time"]) for row in rows if row["dispatch"] == "greedy")
    assert "zb-h1 greedy" in result.stdout and f" {best:.6g} " in result.stdout
    again = run_here("data_generator.py", "-c", str(config), "--step", "1.0", "-o", "again.csv", "--workers", "1",
                     cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again.csv").read_bytes() == output.read_bytes()


@pytest.mark.parametrize("change, fragments", [
    (lambda table: table["lengths"].pop("1B3"), ("lengths = 'bad.json': lacks 1B3 of 1f1b with n = 8 on 2 GPUs",)),
    (lambda table: table["lengths"].update({"0F3": "fast"}),
     ("lengths = 'bad.json': task 0F3: \"fast\" is no length; each must be a finite number from 0 to",)),
    (lambda table: table["lengths"].update({"0F3": -1.0}), ("task 0F3: -1.0 is no length",)),
    (lambda table: table.update(unit=["ms"]), ("lengths = 'bad.json': 'unit' must be the lengths' unit as a short "
                                                "string (\"ms\"), at most 16 characters",)),
    (lambda table: table.update(flags="--schedule 1f1b --slow 3"),
     ("lengths = 'bad.json': flag --slow 3: the flags name the environment's parameters",)),
    (lambda table: table.update(flags="--schedule zb-h1"),
     ("1 combination of the grid cannot run", "lengths = 'bad.json': lacks 0I0, 0W0, 0I1 and 125 more of zb-h1 "
      "with n = 8 on 4 GPUs; fix the config or pass --skip-invalid")),
    (lambda table: table.update(flags=table["flags"].replace("-n 8", "-n 4")),
     ("lengths = 'bad.json': holds 0B4, is no task of 1f1b with n = 4 on 2 GPUs",)),
])
def test_a_bad_table_is_refused_in_one_line(tmp_path, change, fragments):
    table = json.loads((TABLES / "1f1b.json").read_text())
    change(table)
    (tmp_path / "bad.json").write_text(json.dumps(table))
    config = write_config(tmp_path, {"lengths": "bad.json"})
    result = run_here("data_generator.py", "-c", str(config), "-o", "x.csv", cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("grid, fragments", [
    ({"lengths": "none.json"}, ("config key 'lengths': lengths = 'none.json': cannot be read (No such file",
                                "; a relative path is read from the current folder, ")),
    ({"lengths": "table.txt"}, ("config key 'lengths': lengths = 'table.txt': must be a table of lengths: a JSON",)),
    ({"lengths": "configs/tables/1f1b.json", "fwd_len": 2.0},
     ("config key 'fwd_len': a table of 'lengths' gives every task's work; leave 'fwd_len' out",)),
    # weights that scale the work would change the mean-based ideal time and critical path, not the run
    ({"lengths": "configs/tables/1f1b.json", "stage_weights": [[1, 1], [5, 1]]},
     ("config key 'stage_weights': a table of 'lengths' gives every task's work; leave 'stage_weights' out",)),
    ({"lengths": "configs/tables/1f1b.json", "schedule": "zb-h1"},
     ("schedule=zb-h1, n=8, num_gpus=2: lengths = 'configs/tables/1f1b.json': lacks 0I0",)),
    ({"lengths": "configs/tables/1f1b.json", "num_gpus": 4},
     ("num_gpus=4: lengths = 'configs/tables/1f1b.json': lacks 1FP0, 1FP1, 1FP2 and 77 more of 1f1b with n = 8 on 4 "
      "GPUs",)),
])
def test_a_config_naming_a_table_it_cannot_run_is_refused_in_one_line(tmp_path, grid, fragments):
    shutil.copytree(ROOT / "configs" / "tables", tmp_path / "configs" / "tables")
    (tmp_path / "table.txt").write_text("{}")
    result = run_here("data_generator.py", "-c", str(write_config(tmp_path, grid)), "-o", "x.csv", cwd=tmp_path)
    assert_one_line_error(result, *fragments)


@pytest.mark.parametrize("flags", [["--fwd-len", "5"], ["--bwd-weights", "1,3"], ["--prop-len", "3"]])
def test_the_visualizer_refuses_work_beside_a_table_other_than_its_own(tmp_path, flags):
    result = run_here("schedule_visualizer_single_channel.py", "--lengths", str(ROOT / "configs" / "tables" /
                      "1f1b.json"), *flags, "--no-show", "-o", "c.png", cwd=tmp_path)
    assert_one_line_error(result, f"{flags[0]}: ", "a table of --lengths gives every task's work; leave it out")
    assert not (tmp_path / "c.png").exists()


def _random_table(rng: np.random.Generator, params: EnvParams, path: Path) -> EnvParams:
    """``params`` on a table of random lengths: compute from 0.1 to 10, transfers from 0 to 3 (some none)."""
    own = replace(params, compute_jitter=0.0, comm_jitter=0.0, slow_gpu=-1)
    texts, work = task_texts(own), task_lengths(own)
    compute = np.array([bool(task.parts) for task in build_task_graph(own).tasks])
    lengths = np.where(compute, rng.uniform(0.1, 10.0, len(texts)),
                       np.where(rng.random(len(texts)) < 0.2, 0.0, rng.uniform(0.0, 3.0, len(texts))))
    lengths = np.where(work == 0.0, 0.0, lengths)  # a task of no work stays one (a grad_sync of a zero sync_base_len)
    path.write_text(json.dumps({"lengths": dict(zip(texts, lengths.tolist()))}))
    return replace(params, lengths=str(path))


def test_the_bounds_never_exceed_the_run_on_random_tables(tmp_path):
    rng = np.random.default_rng(11)
    policies = [Policy(), Policy(priorities={"fwd_prop": 0.2, "grad_prop": 1.0, "grad_sync": 0.0}),
                Policy(exclusive_tiers={"grad_sync": "a"})]
    cases = 0
    for case in range(40):
        schedule = str(rng.choice(list(SCHEDULES)))
        dispatch = "static" if schedule == "dualpipe-v" or rng.random() < 0.3 else \
            str(rng.choice(["greedy", "critical-path", "zb-adaptive"]))
        try:
            base = EnvParams(n=int(rng.integers(2, 9)), num_gpus=int(rng.integers(2, 4)), schedule=schedule,
                             dispatch=dispatch, sync_freq=int(rng.integers(1, 3)),
                             ingress_capacity=float(rng.choice([0.5, 1.0])),
                             compute_jitter=float(rng.choice([0.0, 0.3])), seed=case)
        except ParameterError:  # a schedule's requirement on n
            continue
        cases += 1
        params = _random_table(rng, base, tmp_path / f"table{case}.json")
        for sample in range(2):
            figures = figures_of(params, policies, sample)
            free, held = lower_bound(params, sample), memory_bound(params, sample)
            assert free <= held
            for i, policy in enumerate(policies):
                run = simulate(params, policy, sample)
                assert run.completion_time == figures[i, 0]
                assert bound_of_run(free, run.completion_time, params) <= run.completion_time, (params, policy)
                assert bound_of_run(held, run.completion_time, params) <= run.completion_time, (params, policy)
                assert run.lower_bound == bound_of_run(free, run.completion_time, params)
    assert cases >= 20


def test_a_table_is_the_environments_work_everywhere_noise_on_top(tmp_path):
    base = EnvParams(n=4, num_gpus=2, schedule="zb-h1", compute_jitter=0.2, slow_gpu=1, slow_factor=1.5, seed=3)
    params = _random_table(np.random.default_rng(5), base, tmp_path / "t.json")
    table = np.array(task_lengths(replace(params, compute_jitter=0.0, slow_gpu=-1)))
    for sample in range(3):
        given = simulate(base, Policy(), sample, lengths=table.tolist())
        named = simulate(params, Policy(), sample)
        assert [(t.start, t.end) for t in named.tasks] == [(t.start, t.end) for t in given.tasks]
        assert named.lower_bound == given.lower_bound
        assert lower_bound(params, sample) == lower_bound(base, sample, task_lengths(params, sample))
        assert memory_bound(params, sample) == bound_of_lengths(base, task_lengths(params, sample))
        assert task_lengths(params, sample).tolist() != task_lengths(base, sample).tolist()


def test_a_learned_policy_plays_on_a_table_through_the_sweep(tmp_path):
    shutil.copytree(ROOT / "configs" / "tables", tmp_path / "configs" / "tables")
    params = EnvParams(n=8, num_gpus=2, schedule="zb-h1", lengths="configs/tables/zb-h1.json")
    written(ranked(params, GREEDY_ORDER, hidden=4), tmp_path / "greedy.npz")
    config = write_config(tmp_path, {"lengths": "configs/tables/zb-h1.json", "compute_jitter": [0.0, 0.2],
                                     "dispatch": ["greedy", "learned:greedy.npz"], "samples": 2})
    result = run_here("data_generator.py", "-c", str(config), "--step", "1.0", "-o", "x.csv", "--workers", "1",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = _rows(tmp_path / "x.csv")
    by = {(row["dispatch"], row["compute_jitter"], row["policy"]): row for row in rows}
    learned = [row for row in rows if row["dispatch"] == "learned:greedy.npz"]
    assert len(learned) == 2 * 31
    for row in learned:  # a network that ranks as greedy plays greedy, on the table's lengths too
        twin = by["greedy", row["compute_jitter"], row["policy"]]
        assert row["completion_time"] == twin["completion_time"] and row["lower_bound"] == twin["lower_bound"]
    greedy = simulate(replace(params, dispatch="greedy", lengths=str(tmp_path / params.lengths)), _policy(rows[0]))
    assert float(by["greedy", "0.0", rows[0]["policy"]]["completion_time"]) == greedy.completion_time


def test_an_episode_on_a_table_is_the_dispatched_run_and_its_reward_is_against_the_tables_own_order():
    pytest.importorskip("gymnasium")
    from pipeline_sim.rl import PipelineDispatchEnv

    params = EnvParams(n=8, num_gpus=2, schedule="1f1b", compute_jitter=0.2, sync_base_len=0.0, fwd_impact=0.0,
                       bwd_impact=0.0, lengths=str(TABLES / "1f1b.json"))
    env = PipelineDispatchEnv(params, Policy(), samples=[0, 1], reward="relative")
    for sample in (0, 1):
        env.reset()
        done, total, info = False, 0.0, {}
        while not done:
            _, reward, done, _, info = env.step(int(np.argmax(env.action_masks())))  # greedy's choice
            total += reward
        greedy = simulate(replace(params, dispatch="greedy"), Policy(), sample)
        assert info["completion_time"] == greedy.completion_time and info["lower_bound"] == greedy.lower_bound
        static = simulate(params, Policy(), sample).completion_time  # 1F1B's own order: zb-h1 has no table here
        assert total == pytest.approx(1.0 - greedy.completion_time / static, abs=1e-12)


def test_a_learned_dispatcher_trains_on_tables_against_each_tables_own_order(tmp_path):
    pytest.importorskip("sb3_contrib")
    shutil.copytree(ROOT / "configs" / "tables", tmp_path / "configs" / "tables")
    config = write_config(tmp_path, {"lengths": ["configs/tables/1f1b.json", "configs/tables/zb-h1.json"],
                                     "dispatch": ["static", "learned:p/t.npz"], "compute_jitter": 0.2})
    result = run_here("train.py", "-c", str(config), "--steps", "64", "--evaluate-every", "64",
                      "--validation-samples", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "training p/t.npz on 2 environments" in result.stderr
    assert "validation draws, time saved against each table's static order (higher is better): " in result.stdout
    assert_png_drawn(tmp_path / "p" / "t_training.png", min_width=1000, min_height=600)
    swept = run_here("data_generator.py", "-c", str(config), "-o", "rows.csv", "--step", "1.0", cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr
    assert {row["dispatch"] for row in _rows(tmp_path / "rows.csv")} == {"static", "learned:p/t.npz"}


def _scaled(source: Path, target: Path, factor: float) -> None:
    table = json.loads(source.read_text())
    table["lengths"] = {text: length * factor for text, length in table["lengths"].items()}
    target.write_text(json.dumps(table))


def test_a_table_replaced_while_a_sweep_runs_does_not_mix_and_a_resume_onto_another_is_refused(tmp_path,
                                                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path, {"lengths": "t.json", "compute_jitter": [0.0, 0.1, 0.2, 0.3]})
    for output in ("clean.csv", "replaced.csv"):
        _scaled(TABLES / "1f1b.json", tmp_path / "t.json", 1.0)
        sweep = run_sweep(SweepPlan(EnvironmentGrid.load("grid.json"), step=0.5), output, workers=2)
        next(sweep)
        next(sweep)  # the first rows are on disk
        if output == "replaced.csv":
            _scaled(TABLES / "1f1b.json", tmp_path / "t.json", 2.0)  # every later worker would read twice the work
        for _ in sweep:
            pass
    assert (tmp_path / "replaced.csv").read_bytes() == (tmp_path / "clean.csv").read_bytes()
    sweep = run_sweep(SweepPlan(EnvironmentGrid.load("grid.json"), step=0.5), "out.csv")
    next(sweep)
    next(sweep)
    sweep.close()  # stopped with rows of the doubled table on disk
    _scaled(TABLES / "1f1b.json", tmp_path / "t.json", 1.0)
    resumed = run_here("data_generator.py", "-c", "grid.json", "-o", "out.csv", "--step", "0.5", "--resume",
                       cwd=tmp_path)
    assert_one_line_error(resumed, "out.csv.partial holds rows of another table of lengths: t.json changed since "
                                   "they were written")
    # the engine reads a table changed on disk again, and what it computed from the old one is not reused
    params = EnvParams(n=8, num_gpus=2, sync_base_len=0.0, dispatch="critical-path", lengths="t.json")
    before = simulate(params, Policy()).completion_time
    _scaled(TABLES / "1f1b.json", tmp_path / "t.json", 3.0)
    assert simulate(params, Policy()).completion_time == pytest.approx(3.0 * before, rel=1e-9)


def test_the_visualizer_takes_a_tables_environment_unless_a_flag_says_otherwise(tmp_path):
    shutil.copytree(ROOT / "configs" / "tables", tmp_path / "configs" / "tables")
    table = "configs/tables/1f1b.json"
    for flags, schedule in (((), "1f1b"), (("--schedule", "gpipe"), "gpipe")):
        chart = run_here("schedule_visualizer_single_channel.py", "--lengths", table, *flags, "--no-show", "--output",
                         f"{schedule}.png", cwd=tmp_path)
        assert chart.returncode == 0, chart.stderr
        environment = json.loads((tmp_path / table).read_text())["flags"].split()
        params = EnvParams(n=8, num_gpus=2, schedule=schedule, fwd_len=float(environment[9]),
                           bwd_len=float(environment[11]), prop_len=float(environment[13]), sync_base_len=0.0,
                           fwd_impact=0.0, bwd_impact=0.0, lengths=str(tmp_path / table))
        run = simulate(params, Policy(priorities={"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2}))
        assert chart.stdout.startswith(f"{schedule}: completion time {run.completion_time:.6g} ms (ideal ")
        assert f"lower bound {run.lower_bound:.6g} ms: " in chart.stdout  # in the unit the table names
        assert_png_drawn(tmp_path / f"{schedule}.png")
    wrong = run_here("schedule_visualizer_single_channel.py", "--lengths", table, "--num-gpus", "4", "--no-show",
                     cwd=tmp_path)
    assert_one_line_error(wrong, f"--lengths: lengths = '{table}': lacks 1FP0, 1FP1, 1FP2 and 77 more of 1f1b with "
                                 "n = 8 on 4 GPUs")


def test_a_chart_of_a_table_names_its_times_by_the_table_and_a_model_chart_in_model_units(tmp_path):
    """A table that names no unit: its chart's time axis says its times are as in the table; one that names its unit
    (a trace's, ms): in that unit, from the table."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline_sim.plotting.gantt import plot_gantt

    base = EnvParams(n=4, num_gpus=2)
    params = _random_table(np.random.default_rng(2), base, tmp_path / "measured.json")
    labels = []
    for environment in (params, base):
        fig, ax = plt.subplots()
        plot_gantt(ax, simulate(environment, Policy()))
        labels.append(ax.get_xlabel())
        plt.close(fig)
    assert labels == ["time (as in measured.json)", "time (model units)"]
    fig, ax = plt.subplots()
    plot_gantt(ax, simulate(EnvParams(n=8, num_gpus=2, lengths=str(TABLES / "1f1b.json")), Policy()))
    assert ax.get_xlabel() == "time (ms, from 1f1b.json)"
    plt.close(fig)
    # the sweep's figures name the table's unit too; a table gone since the sweep, model units
    from pipeline_sim.cli.heatmap import _unit
    assert _unit(EnvParams(n=8, num_gpus=2, lengths=str(TABLES / "1f1b.json")), None) == "ms"
    assert _unit(replace(params, lengths=str(tmp_path / "gone.json")), None) == "model units"
    assert _unit(base, None) == "model units"


def test_a_task_given_twice_in_a_table_is_refused(tmp_path):
    text = (TABLES / "1f1b.json").read_text().replace('"lengths": {', '"lengths": {\n  "0F0": 1.0,', 1)
    (tmp_path / "twice.json").write_text(text)
    config = write_config(tmp_path, {"lengths": "twice.json"})
    assert_one_line_error(run_here("data_generator.py", "-c", str(config), "-o", "x.csv", cwd=tmp_path),
                          "lengths = 'twice.json': task 0F0 is given twice; give each once")
