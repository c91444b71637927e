"""``layers_per_stage: auto`` (docs/model.md section 11.1): the bottleneck optimum against brute force, the worked
example, and auto never slower than balanced in simulation."""

import csv
import itertools
import json
import random

import pytest
from conftest import run_here, run_script

from pipeline_sim import Policy, Workload, workload_environment
from pipeline_sim.engine import simulate_figures
from pipeline_sim.workload import auto_candidates, bottleneck_split, split_neighbours, stage_costs, stage_layers


def bottleneck(costs, first, last, split):
    bounds = list(itertools.accumulate(split, initial=0))
    return max(sum(costs[bounds[k]:bounds[k + 1]]) + (first if k == 0 else 0.0) + (last if k == len(split) - 1
                                                                                       else 0.0)
               for k in range(len(split)))


def brute_force(costs, first, last, stages):
    splits = [tuple(b - a for a, b in zip((0, *cuts), (*cuts, len(costs))))
              for cuts in itertools.combinations(range(1, len(costs)), stages - 1)]
    return min(bottleneck(costs, first, last, split) for split in splits)


def test_the_dynamic_programme_finds_the_least_bottleneck_of_every_split():
    draw = random.Random(24)
    for _ in range(400):
        layers = draw.randint(1, 9)
        stages = draw.randint(1, layers)
        costs = [draw.choice([1.0, draw.uniform(0.1, 3.0)]) for _ in range(layers)]
        first, last = draw.choice([0.0, draw.uniform(0, 5)]), draw.choice([0.0, draw.uniform(0, 5)])
        split = bottleneck_split(costs, first, last, stages)
        assert len(split) == stages and sum(split) == layers and min(split) >= 1
        assert bottleneck(costs, first, last, split) == pytest.approx(brute_force(costs, first, last, stages))


def test_neighbours_move_one_layer_across_one_boundary():
    # (3, 0, 3) and (2, 0, 4) would leave a stage empty
    assert split_neighbours((2, 1, 3)) == [(1, 2, 3), (2, 2, 2)]
    assert split_neighbours((1, 1)) == []


WORKED = dict(model="llama3-8b", gpu="h100-80gb", global_batch_size=16)


def test_the_worked_example():
    workload = Workload(**WORKED, layers_per_stage="auto")
    layer, first, last = stage_costs(workload)
    assert layer == pytest.approx(9.45e-3, rel=1e-3) and last / layer == pytest.approx(1.84, abs=5e-3)
    assert first == pytest.approx(4.0e-5, rel=1e-2)
    assert stage_layers(workload, 4) == (8, 8, 9, 7)
    assert stage_layers(Workload(**WORKED), 4) == (8, 8, 8, 8)
    params = workload_environment(workload, num_gpus=4)
    times = {w.layers_per_stage: float(simulate_figures(p, [Policy()])[0, 0]) for w, p in auto_candidates(workload,
                                                                                                          params)}
    assert list(times)[:2] == [(8, 8, 8, 8), (8, 8, 9, 7)]  # balanced first, then the optimum and its neighbours
    assert min(times, key=times.__getitem__) == (8, 9, 8, 7)
    assert times[(8, 8, 8, 8)] == pytest.approx(5.15, abs=0.005) and times[(8, 9, 8, 7)] == pytest.approx(4.77,
                                                                                                         abs=0.005)


def test_a_sweep_with_auto_is_never_slower_than_balanced(tmp_path):
    config = tmp_path / "auto.json"
    config.write_text(json.dumps({**WORKED, "num_gpus": 4, "layers_per_stage": ["balanced", "auto"],
                                  "schedule": ["1f1b", "zb-h1", "interleaved-1f1b"]}))
    result = run_script("data_generator.py", "-c", str(config), "-o", "auto.csv", "--step", "0.5",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "auto.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    balanced = {(row["schedule"], row["policy"]): float(row["completion_time"]) for row in rows
                if row["layers_per_stage"] == "balanced"}
    autos = [row for row in rows if row["layers_per_stage"] == "auto"]
    assert len(autos) == len(balanced) == len(rows) // 2
    gains = []
    for row in autos:
        time, before = float(row["completion_time"]), balanced[(row["schedule"], row["policy"])]
        assert time <= before
        assert float(row["auto_gain"]) == pytest.approx(1 - time / before)
        split = tuple(int(x) for x in row["auto_layers"].split())
        assert sum(split) == 32 and len(split) == (8 if row["schedule"] == "interleaved-1f1b" else 4)
        gains.append(float(row["auto_gain"]))
    assert max(gains) > 0.05  # the 128k vocabulary's output layer is worth moving layers off the last stage
    assert all(row["auto_layers"] == row["auto_gain"] == "" for row in rows if row["layers_per_stage"] == "balanced")


def test_the_visualizer_reports_the_split_auto_chose(tmp_path):
    result = run_script("schedule_visualizer_single_channel.py", "--model", "llama3-8b", "--gpu", "h100-80gb",
                        "--num-gpus", "4", "--global-batch-size", "16", "--layers-per-stage", "auto", "--no-show",
                        "--output", "g.png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "layers per stage (auto)" in line]
    assert "faster than balanced" in line and "splits simulated" in line


def test_a_balanced_and_an_auto_split_get_a_heatmap_each(tmp_path, monkeypatch):
    config = tmp_path / "lps.json"
    config.write_text(json.dumps({"model": "llama3-8b", "gpu": "h100-80gb", "num_gpus": 4, "global_batch_size": 16,
                                  "layers_per_stage": ["balanced", "auto"]}))
    made = run_here("data_generator.py", "-c", str(config), "-o", "lps.csv", "--step", "0.5", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    drawn = run_here("plot_heatmap.py", "lps.csv", "-o", "maps", cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    names = sorted(path.name for path in (tmp_path / "maps").glob("*.png"))
    assert len(names) == 2 and "_lpsauto_" in names[1] and "lps" not in names[0]
    # environments whose names coincide all the same are numbered, never drawn over one another
    from pipeline_sim.cli import heatmap
    monkeypatch.setattr(heatmap, "env_slug", lambda params, workload: "same")
    again = run_here("plot_heatmap.py", "lps.csv", "-o", "same", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert sorted(path.name for path in (tmp_path / "same").glob("*.png")) == ["same.png", "same_2.png"]
