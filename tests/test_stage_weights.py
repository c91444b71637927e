"""Uneven stages (docs/model.md section 6.6): worked examples 9 and 10, invariants, and the parameter everywhere."""

import csv
import json
import random
from dataclasses import replace

import pytest
from conftest import assert_one_line_error, assert_png_drawn, run_script

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.config import ConfigError, EnvironmentGrid
from pipeline_sim.engine import simulate, simulate_figures
from pipeline_sim.model import DEFAULT_POLICY, EnvParams, ParameterError, Policy
from pipeline_sim.results import env_slug, env_title
from pipeline_sim.schedules import SCHEDULES
from pipeline_sim.validate import validate_schedule

EXAMPLE = dict(num_gpus=2, n=2, fwd_len=1, bwd_len=2, prop_len=0, sync_base_len=0, stage_weights=[2, 1])


def timeline(schedule):
    return {text: (schedule.find(text).start, schedule.find(text).end) for order in schedule.order_text()
            for text in order}


def test_example_9_uneven_1f1b():
    s = calculate_full_pipeline_schedule(**EXAMPLE)
    assert timeline(s) == {"0F0": (0, 2), "0F1": (2, 4), "0B0": (5, 9), "0B1": (9, 13),
                           "1F0": (2, 3), "1B0": (3, 5), "1F1": (5, 6), "1B1": (6, 8)}
    assert s.completion_time == 13.0 and s.lower_bound == 12.0
    assert s.peak_activations == (4.0, 1.0)
    assert validate_schedule(s) == []
    even = calculate_full_pipeline_schedule(**{**EXAMPLE, "stage_weights": []})
    double = calculate_full_pipeline_schedule(**{**EXAMPLE, "stage_weights": [2, 2]})
    assert (even.completion_time, double.completion_time) == (9.0, 18.0)


def test_example_10_uneven_zb_h1():
    s = calculate_full_pipeline_schedule(**EXAMPLE, schedule="zb-h1")
    assert timeline(s) == {"0F0": (0, 2), "0F1": (2, 4), "0I0": (4, 6), "0W0": (6, 8), "0I1": (8, 10),
                           "0W1": (10, 12), "1F0": (2, 3), "1I0": (3, 4), "1F1": (4, 5), "1I1": (5, 6),
                           "1W0": (6, 7), "1W1": (7, 8)}
    assert s.completion_time == s.lower_bound == 12.0
    assert s.peak_activations == (4.0, 2.0)
    assert validate_schedule(s) == []


def environments(seed, count):
    """Random environments of every schedule, with communication, noise or neither."""
    rng = random.Random(seed)
    for _ in range(count):
        schedule = rng.choice(sorted(SCHEDULES))
        p = rng.randint(1, 4) if schedule not in ("zb-v", "dualpipe-v") else rng.randint(2, 4)
        n = p * rng.randint(2, 3)
        yield EnvParams(n=n, num_gpus=p, schedule=schedule, fb_overlap=rng.choice([0.0, 0.3]),
                        prop_len=rng.choice([0.0, 0.5, 1.0]), sync_base_len=rng.choice([0.0, 2.0]),
                        compute_jitter=rng.choice([0.0, 0.2]), ingress_capacity=rng.choice([0.5, 1.0]))


@pytest.mark.parametrize("seed", range(3))
def test_no_weights_is_every_weight_one_and_every_weight_c_scales_the_lengths(seed):
    for params in environments(seed, 8):
        stages = params.num_gpus * params.v
        ones = replace(params, stage_weights=(1.0,) * stages)
        base = simulate(params, DEFAULT_POLICY)
        same = simulate(ones, DEFAULT_POLICY)
        assert [(t.start, t.end) for t in base.tasks] == [(t.start, t.end) for t in same.tasks]
        assert same.peak_activations == base.peak_activations
        # a power of two: the products are exact, so the timelines are the same to the bit
        for c in (0.5, 2.0):
            weighted = simulate(replace(params, stage_weights=(c,) * stages), DEFAULT_POLICY)
            scaled = simulate(replace(params, fwd_len=params.fwd_len * c, bwd_len=params.bwd_len * c), DEFAULT_POLICY)
            assert [(t.start, t.end) for t in weighted.tasks] == [(t.start, t.end) for t in scaled.tasks]
            assert weighted.peak_activations == tuple(c * peak for peak in scaled.peak_activations)


@pytest.mark.parametrize("seed", range(3))
def test_uneven_runs_are_valid_and_never_beat_their_bound(seed):
    rng = random.Random(100 + seed)
    for params in environments(seed, 10):
        weights = tuple(rng.choice([0.25, 0.7, 1.0, 1.3, 3.0]) for _ in range(params.num_gpus * params.v))
        weighted = replace(params, stage_weights=weights)
        for dispatch in ("static", "greedy", "zb-adaptive"):
            if dispatch != "static" and weighted.fb_overlap > 0:
                continue
            run = replace(weighted, dispatch=dispatch)
            s = simulate(run, Policy(priorities={"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2}), sample=1)
            assert validate_schedule(s) == [], (run, validate_schedule(s))
            assert s.lower_bound <= s.completion_time * (1 + 1e-9)
            # the sweep's figures are the same run's
            figures = simulate_figures(run, [s.policy], sample=1)[0]
            assert figures[0] == s.completion_time
            assert max(figures[-run.num_gpus:]) == pytest.approx(max(s.peak_activations), abs=1e-6)


def test_a_dispatcher_needs_room_for_one_micro_batch_of_the_heaviest_gpu():
    with pytest.raises(ParameterError, match=r"memory_limit = 2\.0: .*3 is the smallest limit"):
        calculate_full_pipeline_schedule(**{**EXAMPLE, "stage_weights": [3, 1]}, dispatch="greedy", memory_limit=2.0)
    s = calculate_full_pipeline_schedule(**{**EXAMPLE, "stage_weights": [3, 1]}, dispatch="greedy", memory_limit=3.0)
    assert max(s.peak_activations) == 3.0 and s.memory_limit == 3.0 and validate_schedule(s) == []


@pytest.mark.parametrize("weights, fragment", [
    ([2, 1], "must have one weight per stage: 4 for 1f1b on 4 GPUs"),
    ([1, 1, 0, 1], "from 0.001 to 1000"),
    ([1, 1, float("inf"), 1], "from 0.001 to 1000"),
    ("2,1,1,1", "must be a list of finite numbers"),
])
def test_bad_weights_are_named(weights, fragment):
    with pytest.raises(ParameterError, match="stage_weights = ") as error:
        EnvParams(stage_weights=weights)
    assert fragment in str(error.value) and error.value.name == "stage_weights"


@pytest.mark.parametrize("dispatch", ["greedy", "critical-path", "zb-adaptive"])
def test_a_dispatcher_keeps_its_limit_where_a_gpu_s_room_passes_32_bits(dispatch):
    """Rooms are counted in 2**20 units a micro-batch of a uniform stage: three chunks of weight 1,000 on a GPU hold
    3,145,728,000 units, past a 32-bit count, which would wrap below zero and let every forward in. The limit holds."""
    params = EnvParams(schedule="interleaved-1f1b", num_gpus=2, n=4, chunks=3, stage_weights=(1000.0,) * 6,
                       dispatch=dispatch, memory_limit=1000.0)
    run = simulate(params, Policy())
    assert max(run.peak_activations) <= 1000.0 + 1e-9
    validate_schedule(run)


def test_a_flag_s_weights_leave_none_out():
    from pipeline_sim.parameters import Weights

    assert Weights.parse("2, 1,1 ,1") == Weights.parse("2 1 1 1") == (2.0, 1.0, 1.0, 1.0)
    assert Weights.parse("(2.0,)") == (2.0,)  # a tuple of one as Python writes it
    for text in ("1,,1,1", "1,1,1,1,", ",1"):  # a weight left out would shift every stage after it
        with pytest.raises(ParameterError, match="has an empty weight between commas"):
            Weights.parse(text)


def test_names_and_titles_show_weights_compactly_and_only_when_given():
    params = EnvParams(num_gpus=4, schedule="interleaved-1f1b", stage_weights=[1.5] + [1.0] * 6 + [2.0])
    assert "_sw1.5-1x6-2_" in env_slug(params) + "_"
    assert "stage weights=1.5,1x6,2" in env_title(params)
    assert "sw" not in env_slug(EnvParams()) and "stage weights" not in env_title(EnvParams())


def test_a_grid_sweeps_one_list_per_value():
    grid = EnvironmentGrid.from_mapping({"num_gpus": 2, "stage_weights": [[1, 1], [2, 1]]})
    assert [p.stage_weights for p in grid] == [(1.0, 1.0), (2.0, 1.0)]
    assert [p.stage_weights for p in EnvironmentGrid.from_mapping({"num_gpus": 2, "stage_weights": [3, 1]})] == \
        [(3.0, 1.0)]
    with pytest.raises(ConfigError, match=r"config key 'stage_weights': stage_weights = \[1, -2\]"):
        EnvironmentGrid.from_mapping({"num_gpus": 2, "stage_weights": [[1, 1], [1, -2]]})
    # a length that fits one schedule and not another is a combination that cannot run, named up front
    grid = EnvironmentGrid.from_mapping({"num_gpus": 2, "schedule": ["1f1b", "zb-v"], "stage_weights": [2, 1]})
    assert len(grid) == 1 and "4 for zb-v on 2 GPUs" in grid.invalid()[0][1]


def test_sweep_and_heatmap_end_to_end(tmp_path):
    config = tmp_path / "uneven.json"
    config.write_text(json.dumps({"n": 4, "num_gpus": 2, "schedule": ["1f1b", "zb-h1"],
                                  "stage_weights": [[1, 1], [2, 1]]}))
    result = run_script("data_generator.py", "-c", str(config), "-o", "out.csv", "--step", "0.5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "out.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["stage_weights"] for row in rows} == {"1.0 1.0", "2.0 1.0"}
    heavy, = [row for row in rows if row["stage_weights"] == "2.0 1.0" and row["schedule"] == "1f1b"
              and row["policy"] == "F0.5 G0.5 S0"]
    expected = calculate_full_pipeline_schedule(n=4, num_gpus=2, stage_weights=[2, 1],
                                                priorities={"fwd_prop": 0.5, "grad_prop": 0.5, "grad_sync": 0.0})
    assert float(heavy["completion_time"]) == expected.completion_time
    assert float(heavy["peak_activations"]) == max(expected.peak_activations) == 4.0
    result = run_script("plot_heatmap.py", "out.csv", "-o", "maps", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    names = sorted(path.name for path in (tmp_path / "maps").glob("n4_*.png"))
    assert "n4_gpus2_sf1_fwd1_bwd2_prop1_sync2_fi0.2_bi0.2_in1_sw2-1_1f1b.png" in names and len(names) == 4
    assert_png_drawn(tmp_path / "maps" / "n4_gpus2_sf1_fwd1_bwd2_prop1_sync2_fi0.2_bi0.2_in1_sw2-1_1f1b.png")


def test_the_visualizer_takes_the_flag(tmp_path):
    result = run_script("schedule_visualizer_single_channel.py", "--num-gpus", "2", "-n", "2", "--prop-len", "0",
                        "--sync-base-len", "0", "--stage-weights", "2,1", "--show-memory", "--no-show",
                        "--output", "g.png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "completion time 13 " in result.stdout and "peak activations 4 " in result.stdout
    assert_png_drawn(tmp_path / "g.png")
    assert_one_line_error(run_script("schedule_visualizer_single_channel.py", "--stage-weights", "2,1", "--no-show",
                                     cwd=tmp_path), "--stage-weights: stage_weights = (2.0, 1.0)", "4 for 1f1b")
    assert_one_line_error(run_script("schedule_visualizer_single_channel.py", "--stage-weights", "2,x", "--no-show",
                                     cwd=tmp_path), "--stage-weights", "'2,x'")
