"""Noise (docs/model.md section 8): common random numbers, distributions, stragglers, sweep statistics."""

import csv
import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, assert_one_line_error, run_here, run_script

from pipeline_sim import EnvParams, ParameterError, Policy, calculate_full_pipeline_schedule, simulate
from pipeline_sim.config import ConfigError, EnvironmentGrid
from pipeline_sim.noise import KIND_NUMBERS, standard_normals, work_factors
from pipeline_sim.schedules import SCHEDULES
from pipeline_sim.sweep import STATISTICS, SweepPlan, partial_paths, run_sweep, samples_path
from pipeline_sim.taskgraph import build_task_graph
from pipeline_sim.validate import validate_schedule

ALL = tuple(SCHEDULES)


def timeline(schedule):
    return [(str(t.id), t.start, t.end, t.segments) for t in schedule.tasks]


@pytest.mark.parametrize("schedule", ALL)
def test_zero_noise_is_the_noise_free_simulation_exactly(schedule):
    n = 10 if schedule == "dualpipe-v" else 8
    plain = calculate_full_pipeline_schedule(schedule=schedule, n=n)
    for sample in (0, 3):
        zero = calculate_full_pipeline_schedule(schedule=schedule, n=n, compute_jitter=0.0, comm_jitter=0.0,
                                                jitter_dist="normal", seed=7, sample=sample)
        assert timeline(zero) == timeline(plain)
    noisy = calculate_full_pipeline_schedule(schedule=schedule, n=n, compute_jitter=0.2, comm_jitter=0.1)
    assert noisy.completion_time != plain.completion_time
    assert validate_schedule(noisy) == []


def lengths(params, sample=0):
    graph = build_task_graph(params, sample)
    return {(t.kind, t.stage, t.index): t.length for t in graph.tasks}


def test_a_factor_depends_on_seed_sample_and_identity_only():
    params = EnvParams(compute_jitter=0.3, comm_jitter=0.3, seed=11)
    base = lengths(params)
    # the same tasks in a longer iteration (more micro-batches, other tasks around them) draw the same factors
    longer = lengths(EnvParams(compute_jitter=0.3, comm_jitter=0.3, seed=11, n=16))
    assert all(longer[key] == value for key, value in base.items() if key[0] != "grad_sync")
    # another schedule sharing an identity (the forward of micro-batch 3 on stage 1) draws the same factor
    assert lengths(EnvParams(compute_jitter=0.3, seed=11, schedule="gpipe"))["forward", 1, 3] == base["forward", 1, 3]
    assert lengths(EnvParams(compute_jitter=0.3, comm_jitter=0.3, seed=11), 1) != base
    assert lengths(EnvParams(compute_jitter=0.3, comm_jitter=0.3, seed=12)) != base


def test_two_policies_see_identical_draws():
    params = EnvParams(compute_jitter=0.3, comm_jitter=0.3, seed=5)
    a = simulate(params, Policy(priorities={"fwd_prop": 0.9}), 2)
    b = simulate(params, Policy(exclusive_tiers={"grad_sync": "a"}), 2)
    assert [t.length for t in a.tasks] == [t.length for t in b.tasks]
    assert a.completion_time != b.completion_time


def test_the_generator_is_fixed_across_processes():
    """Reproducible years later: these draws are part of the contract (seed 0, sample 0)."""
    identities = np.array([[KIND_NUMBERS["forward"], 0, 0], [KIND_NUMBERS["grad_sync"], 3, 1]], dtype=np.int64)
    here = standard_normals(0, 0, identities).tolist()
    code = ("import numpy as np, sys; sys.path.insert(0, %r); from pipeline_sim.noise import standard_normals; "
            "print(repr(standard_normals(0, 0, np.array([[1, 0, 0], [7, 3, 1]], dtype=np.int64)).tolist()))"
            % str(ROOT))
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(there) == here
    assert here == pytest.approx([documented_normal(0, 0, 1, 0, 0), documented_normal(0, 0, 7, 3, 1)], rel=1e-14)


def documented_uniforms(seed, sample, kind, stage, index):
    """Steps 1 and 2 of the generator as pipeline_sim/noise.py documents them, in plain Python integers."""
    mask = (1 << 64) - 1

    def mix(x):
        z = (x + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    h = mix(seed)
    for value in (sample, kind, stage, index):
        h = mix(h ^ value)
    first = mix(h)
    second = mix(first)
    return ((first >> 11) + 0.5) / 2 ** 53, ((second >> 11) + 0.5) / 2 ** 53


def documented_normal(seed, sample, kind, stage, index):
    """The generator as pipeline_sim/noise.py documents it."""
    u1, u2 = documented_uniforms(seed, sample, kind, stage, index)
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def test_the_compiled_uniforms_are_the_documented_generators_to_the_bit():
    from pipeline_sim.kernel.draws import uniforms
    rng = np.random.default_rng(4)
    for seed, sample in [(0, 0), (2 ** 63 - 1, 0), (11, 2 ** 31 - 1), *rng.integers(0, 2 ** 62, (6, 2)).tolist()]:
        identities = np.column_stack([rng.integers(1, 16, 40), rng.integers(0, 4096, 40),
                                      rng.integers(0, 10 ** 6, 40)]).astype(np.int64)
        first, second = np.empty(40), np.empty(40)
        with np.errstate(over="ignore"):  # run uncompiled, numpy's scalars warn as SplitMix64's products wrap
            uniforms(np.uint64(seed), np.uint64(sample), identities, first, second)
        assert list(zip(first.tolist(), second.tolist())) == [documented_uniforms(seed, sample, *map(int, row))
                                                              for row in identities]


@pytest.mark.parametrize("distribution", ["lognormal", "normal"])
@pytest.mark.parametrize("variation", [0.05, 0.2, 0.4])
def test_factors_have_mean_one_and_the_asked_variation(distribution, variation):
    count = 200_000
    identities = np.stack([np.full(count, 1), np.zeros(count, dtype=np.int64), np.arange(count)], axis=1)
    factors = work_factors(standard_normals(3, 0, identities), variation, distribution)
    assert factors.min() >= 0.0
    # sampling error of the mean: variation / sqrt(count); of the standard deviation, a few times that
    assert abs(factors.mean() - 1.0) < 5 * variation / math.sqrt(count)
    assert abs(factors.std() / factors.mean() - variation) < 0.02 * variation + 5 * variation / math.sqrt(count)


def test_normal_factors_are_clipped_at_zero():
    z = np.array([-5.0, -1.0, 0.0, 2.0])
    assert work_factors(z, 1.0, "normal").tolist() == [0.0, 0.0, 1.0, 3.0]
    s = calculate_full_pipeline_schedule(compute_jitter=1.0, comm_jitter=1.0, jitter_dist="normal", seed=3)
    assert any(t.length == 0.0 for t in s.tasks) and validate_schedule(s) == []


def test_a_straggler_is_its_gpu_compute_scaled():
    plain, slow = EnvParams(num_gpus=3), EnvParams(num_gpus=3, slow_gpu=1, slow_factor=1.5)
    for a, b in zip(build_task_graph(plain).tasks, build_task_graph(slow).tasks):
        assert b.length == (a.length * 1.5 if a.parts and a.gpu == 1 else a.length)
    # by hand: one GPU, n=1, fwd 1, bwd 2, twice slower: F [0,2], B [2,6]
    s = calculate_full_pipeline_schedule(num_gpus=1, n=1, slow_gpu=0, slow_factor=2.0, sync_base_len=0)
    assert (s.find("0F0").start, s.find("0F0").end, s.find("0B0").end, s.completion_time) == (0, 2, 6, 6)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"compute_jitter": 1.5}, "compute_jitter = 1.5: must be a finite number with 0 <= x <= 1"),
    ({"jitter_dist": "cauchy"}, "jitter_dist = 'cauchy': must be one of lognormal, normal"),
    ({"slow_gpu": 4}, "slow_gpu = 4: must be -1 (no straggler) or a GPU 0..3"),
    ({"slow_factor": 0.5}, "slow_factor = 0.5: must be a finite number with 1 <= x <= 1e+06"),
    ({"seed": -1}, "seed = -1: must be an integer from 0 to 2^63 - 1"),
    ({"sample": -2}, "sample = -2: must be an integer from 0 to 2^63 - 1"),
])
def test_bad_noise_parameters(kwargs, fragment):
    with pytest.raises(ParameterError) as info:
        calculate_full_pipeline_schedule(**kwargs)
    assert fragment in str(info.value)


# -- the sweep -----------------------------------------------------------------------------

NOISY = {"n": 4, "num_gpus": 3, "compute_jitter": [0.0, 0.2], "comm_jitter": 0.1, "samples": 5}


def sweep(plan, output, **kwargs):
    for _ in run_sweep(plan, output, **kwargs):
        pass
    return output.read_bytes()


def read(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_statistics_columns_equal_a_direct_computation_from_the_samples(tmp_path):
    plan = SweepPlan(EnvironmentGrid.from_mapping(NOISY), step=0.5, with_samples=True)
    assert plan.samples == 5 and plan.num_simulations == 2 * 37 * 5
    sweep(plan, tmp_path / "out.csv", samples_output=tmp_path / "samples.csv")
    rows, samples = read(tmp_path / "out.csv"), read(tmp_path / "samples.csv")
    assert len(samples) == len(rows) * 5
    for i, row in enumerate(rows):
        mine = samples[5 * i:5 * i + 5]
        assert {s["policy"] for s in mine} == {row["policy"]} and [s["sample"] for s in mine] == list("01234")
        times = np.array([float(s["completion_time"]) for s in mine])
        assert float(row["completion_time"]) == pytest.approx(times.mean(), rel=1e-12)
        assert float(row["completion_std"]) == pytest.approx(times.std(ddof=1), rel=1e-9, abs=1e-12)
        assert float(row["completion_min"]) == times.min() and float(row["completion_max"]) == times.max()
        for q in (50, 95, 99):
            assert float(row[f"completion_p{q}"]) == pytest.approx(np.percentile(times, q), rel=1e-12)
        if row["compute_jitter"] == "0.0":
            continue
        direct = [calculate_full_pipeline_schedule(n=4, num_gpus=3, compute_jitter=0.2, comm_jitter=0.1, sample=k,
                                                   **_policy(row)).completion_time for k in range(5)]
        assert times.tolist() == direct


def _policy(row):
    kinds = ("fwd_prop", "grad_prop", "grad_sync")
    return {"priorities": {k: float(row[f"prio_{k}"]) for k in kinds if row[f"prio_{k}"]},
            "exclusive_tiers": {k: row[f"tier_{k}"] for k in kinds if row[f"tier_{k}"]}}


def test_one_sample_columns_equal_the_single_result(tmp_path):
    plan = SweepPlan(EnvironmentGrid.from_mapping({**NOISY, "samples": 1}), step=1.0)
    rows = read_bytes_rows(sweep(plan, tmp_path / "one.csv"))
    for row in rows:
        assert row["completion_std"] == "0.0"
        assert all(row[name] == row["completion_time"] for name in STATISTICS if name != "completion_std")


def read_bytes_rows(data):
    return list(csv.DictReader(data.decode().splitlines()))


@pytest.mark.parametrize("stop_after", [1, 3])
def test_noisy_sweeps_are_identical_across_workers_and_after_a_resume(tmp_path, stop_after):
    plan = SweepPlan(EnvironmentGrid.from_mapping(NOISY), step=0.5, with_samples=True)
    one = sweep(plan, tmp_path / "one.csv", workers=1, samples_output=tmp_path / "one.samples.csv")
    two = sweep(plan, tmp_path / "two.csv", workers=2, samples_output=tmp_path / "two.samples.csv")
    assert one == two
    assert (tmp_path / "one.samples.csv").read_bytes() == (tmp_path / "two.samples.csv").read_bytes()
    output = tmp_path / "cut.csv"
    progress = run_sweep(plan, output, workers=2, samples_output=tmp_path / "cut.samples.csv")
    for _, done in zip(range(stop_after + 1), progress):
        pass
    progress.close()
    with open(samples_path(output), "ab") as handle:
        handle.write(b"4,3,1,1.0,2.0")  # a torn line, and more samples than the summarised rows need
    assert partial_paths(output)[0].exists()
    assert sweep(plan, output, workers=1, resume=True, samples_output=tmp_path / "cut.samples.csv") == one
    assert (tmp_path / "cut.samples.csv").read_bytes() == (tmp_path / "one.samples.csv").read_bytes()


def test_the_samples_flag_wins_over_the_file_and_progress_counts_simulations(tmp_path):
    config = tmp_path / "noisy.json"
    config.write_text(json.dumps(NOISY))
    result = run_script("data_generator.py", "-c", str(config), "--step", "1", "--samples", "3", "--samples-output",
                        str(tmp_path / "s.csv"), "-o", str(tmp_path / "o.csv"), "--workers", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "2 environments x 31 policies x 3 samples = 186 simulations" in result.stdout
    assert "186/186" in result.stderr  # the bar counts simulations
    assert "wrote 62 rows" in result.stdout and "wrote 186 samples" in result.stdout
    assert len(read(tmp_path / "s.csv")) == 186 and {r["samples"] for r in read(tmp_path / "o.csv")} == {"3"}


@pytest.mark.parametrize("grid, fragment", [
    ({"compute_jitter": 1.5}, "config key 'compute_jitter': compute_jitter = 1.5"),
    ({"jitter_dist": "cauchy"}, "config key 'jitter_dist': jitter_dist = 'cauchy': must be one of lognormal"),
    ({"slow_gpu": 4}, "config key 'slow_gpu': slow_gpu = 4: must be -1 (no straggler) or a GPU 0..3"),
    ({"samples": 0}, "config key 'samples': 0 must be one integer >= 1"),
])
def test_bad_noise_config(grid, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        EnvironmentGrid.from_mapping(grid)
    assert fragment in str(info.value)


@pytest.mark.parametrize("grid, args, fragments", [
    ({"compute_jitter": 1.5}, [], ["compute_jitter = 1.5", "0 <= x <= 1"]),
    ({"jitter_dist": "cauchy"}, [], ["'cauchy'", "lognormal, normal"]),
    ({"num_gpus": [2, 4], "slow_gpu": 3, "slow_factor": 2.0}, [], ["cannot run", "slow_gpu = 3", "--skip-invalid"]),
    ({"slow_gpu": [-1, 3]}, [], ["config key 'slow_gpu': a straggler needs 'slow_factor' above 1 (at 1, the default, "
                                 "GPU 3 computes as fast as the others); give one"]),
    ({"slow_gpu": 1, "slow_factor": [1.0]}, [], ["'slow_factor' above 1 (at 1, GPU 1 computes as fast"]),
    ({"samples": 0}, [], ["'samples'", ">= 1"]),
    ({}, ["--samples", "0"], ["--samples", "0 must be >= 1"]),
])
def test_bad_noise_input_gets_one_line(tmp_path, grid, args, fragments):
    config = tmp_path / "bad.json"
    config.write_text(json.dumps(grid))
    result = run_here("data_generator.py", "-c", str(config), *args, cwd=tmp_path)
    assert_one_line_error(result, *fragments)


def test_a_straggler_without_a_slowdown_is_refused_by_the_visualizer(tmp_path):
    """--slow-gpu alone drew a run in which no GPU was slower, with nothing said."""
    result = run_here("schedule_visualizer_single_channel.py", "--slow-gpu", "1", "--no-show", "--output",
                      str(tmp_path / "chart.png"), cwd=tmp_path)
    assert_one_line_error(result, "--slow-gpu: slow_gpu = 1: a straggler needs --slow-factor above 1 (at 1, GPU 1 "
                                  "computes as fast as the others)")
    assert not (tmp_path / "chart.png").exists()
    # a GPU that is not there is refused as such first
    result = run_here("schedule_visualizer_single_channel.py", "--slow-gpu", "9", "--no-show", "--output",
                      str(tmp_path / "chart.png"), cwd=tmp_path)
    assert_one_line_error(result, "--slow-gpu: slow_gpu = 9: must be -1 (no straggler) or a GPU 0..3")


def test_visualizer_draws_one_sampled_iteration(tmp_path):
    from conftest import assert_png_drawn

    chart = tmp_path / "chart.png"
    result = run_here("schedule_visualizer_single_channel.py", "--compute-jitter", "0.2", "--seed", "4", "--sample",
                        "2", "--slow-gpu", "1", "--slow-factor", "1.5", "--no-show", "--output", str(chart),
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    direct = calculate_full_pipeline_schedule(compute_jitter=0.2, seed=4, sample=2, slow_gpu=1, slow_factor=1.5,
                                              priorities={"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2})
    assert f"sample 2 of seed 4: completion time {direct.completion_time:.6g}" in result.stdout
    assert_png_drawn(chart)
    bad = run_here("schedule_visualizer_single_channel.py", "--jitter-dist", "cauchy", "--no-show", cwd=tmp_path)
    assert_one_line_error(bad, "--jitter-dist", "'cauchy'")


def test_robustness_families_follow_the_winners_and_merge_identical_curves(tmp_path):
    from pipeline_sim.results import environments, jitter_families, load_results, workload_of

    base = load_results(ROOT / "tests" / "data" / "quick_step0.5.csv")
    base = base[(base["n"] == base["n"].iloc[0]) & (base["sync_freq"] == base["sync_freq"].iloc[0])]
    first, runner_up = base.nsmallest(2, "completion_time")["policy"]
    twin = next(p for p in base["policy"] if p not in (first, runner_up, "F=G=S"))
    frames = []
    for level, winner in ((0.0, first), (0.1, "F=G=S"), (0.2, "F=G=S")):
        rows = base.copy()
        rows["compute_jitter"] = level
        rows["completion_time"] = rows["completion_time"] + 10 * level
        rows.loc[rows["policy"] == winner, "completion_time"] = 1.0  # the best at this level
        rows.loc[rows["policy"] == twin, "completion_time"] = float(
            rows.loc[rows["policy"] == runner_up, "completion_time"].iloc[0])
        rows["completion_p95"] = rows["completion_time"] + 1.0
        frames.append(rows)
    frame = pd.concat(frames, ignore_index=True)
    # The twin behaves exactly like the runner-up at every level: one curve for both.
    (families,) = list(jitter_families(((params, workload_of(rows), rows) for params, rows in environments(frame)),
                                       top=3))
    params, workload, key, family = families
    assert workload is None
    assert key == "compute_jitter" and params.compute_jitter == 0.0
    why = dict(zip(family["policy"], family["why"]))
    assert why[first] == "best at 0%"
    pair = next(name for name in why if " = " in name)
    assert set(pair.split(" = ")) == {runner_up, twin} and why[pair] == "#2 at 0%; #3 at 0%"
    assert len(why) == 3
    assert why["F=G=S"] == "best at 10%, 20%"
    assert sorted(family["level"].unique()) == [0.0, 0.1, 0.2]
    winner_curve = family[family["policy"] == "F=G=S"].sort_values("level")
    assert list(winner_curve["mean"]) == pytest.approx([float(base.loc[base["policy"] == "F=G=S",
                                                                         "completion_time"].iloc[0]), 1.0, 1.0])
    assert list(winner_curve["p95"]) == pytest.approx(list(winner_curve["mean"] + 1.0))
