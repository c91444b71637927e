"""Run-time dispatch and the lower bound (docs/model.md section 12)."""

import csv
import json
import random
from dataclasses import replace

import pytest
from conftest import assert_one_line_error, assert_png_drawn, run_here, run_script
from reference_dispatch import run as reference_run

from pipeline_sim import EnvParams, ParameterError, Policy, calculate_full_pipeline_schedule, simulate
from pipeline_sim.config import EnvironmentGrid
from pipeline_sim.engine import dispatch_arguments, lower_bound, memory_bound, memory_in_force, simulate_figures
from pipeline_sim.model import DISPATCHERS
from pipeline_sim.orders import format_orders, parse_orders
from pipeline_sim.schedules import SCHEDULES
from pipeline_sim.sweep import BOUND_COLUMNS
from pipeline_sim.validate import validate_schedule

RULES = DISPATCHERS[1:]


def timeline(schedule):
    return {str(t.id): (t.start, t.end) for t in schedule.tasks if t.parts}


def test_worked_example_7_greedy_runs_a_ready_forward_where_the_order_waits():
    s = calculate_full_pipeline_schedule(num_gpus=3, n=3, prop_len=0, sync_base_len=0, dispatch="greedy")
    assert timeline(s) == {
        "0F0": (0, 1), "0F1": (1, 2), "0F2": (2, 3), "0B0": (7, 9), "0B1": (10, 12), "0B2": (13, 15),
        "1F0": (1, 2), "1F1": (2, 3), "1F2": (3, 4), "1B0": (5, 7), "1B1": (8, 10), "1B2": (11, 13),
        "2F0": (2, 3), "2B0": (3, 5), "2F1": (5, 6), "2B1": (6, 8), "2F2": (8, 9), "2B2": (9, 11)}
    assert s.completion_time == s.lower_bound == 15 and s.memory_limit == 3
    assert s.order_text()[1] == ["1F0", "1F1", "1F2", "1B0", "1B1", "1B2"]
    static = calculate_full_pipeline_schedule(num_gpus=3, n=3, prop_len=0, sync_base_len=0)
    assert static.order_text()[1] == ["1F0", "1F1", "1B0", "1F2", "1B1", "1B2"]
    assert timeline(static)["1F2"] == (7, 8)  # the static order waits for B0 before F2


def test_worked_example_8_a_memory_limit_of_one_micro_batch_serialises_them():
    s = calculate_full_pipeline_schedule(num_gpus=3, n=3, prop_len=0, sync_base_len=0, dispatch="greedy",
                                         memory_limit=1)
    assert s.completion_time == 27 and s.memory_limit == 1
    assert [timeline(s)[f"0F{m}"] for m in range(3)] == [(0, 1), (9, 10), (18, 19)]
    assert max(s.peak_activations) == 1
    assert validate_schedule(s) == []


def test_zb_adaptive_frees_memory_with_w_before_an_input_gradient():
    """At the limit, zb-adaptive runs a ready W first (it frees what the held-back F needs); greedy runs I."""
    common = dict(num_gpus=2, n=6, prop_len=0, sync_base_len=0, schedule="zb-h1", memory_limit=3)
    greedy = calculate_full_pipeline_schedule(**common, dispatch="greedy")
    adaptive = calculate_full_pipeline_schedule(**common, dispatch="zb-adaptive")
    # GPU 0 holds three micro-batches after 0F3 at t = 9, F4 is held back, W1 and I2 are ready
    assert greedy.order_text()[0][6:10] == ["0F3", "0I2", "0W1", "0F4"]
    assert adaptive.order_text()[0][6:10] == ["0F3", "0W1", "0I2", "0F4"]
    assert validate_schedule(greedy) == [] and validate_schedule(adaptive) == []


def test_critical_path_prefers_the_longest_remaining_path():
    """GPU 0 of 1F1B with 4 micro-batches: after its warm-up, a forward starts a chain through every GPU and back,
    longer than what follows any backward, so critical-path runs every forward first (as GPipe does)."""
    s = calculate_full_pipeline_schedule(num_gpus=2, n=4, prop_len=0, sync_base_len=0, dispatch="critical-path",
                                         memory_limit=4)
    assert s.order_text()[0][:4] == ["0F0", "0F1", "0F2", "0F3"]
    assert validate_schedule(s) == []


def random_environment(rng, schedules=tuple(SCHEDULES), **fixed):
    schedule = rng.choice(list(schedules))
    p = rng.randint(1, 4)
    n = rng.randint(1, 7)
    if schedule == "interleaved-1f1b":
        n = p * rng.randint(1, 3)
    if schedule == "dualpipe-v":
        n = max(n, 2 * p)
    noisy = rng.random() < 0.7
    values = dict(schedule=schedule, num_gpus=p, n=n, sync_freq=rng.randint(1, 3), fwd_len=rng.choice([1.0, 0.7]),
                  bwd_len=rng.choice([2.0, 1.3]), w_fraction=rng.choice([0.0, 0.3, 0.5]),
                  compute_jitter=rng.choice([0.1, 0.3]) if noisy else 0.0, comm_jitter=0.0,
                  slow_gpu=rng.randrange(p) if rng.random() < 0.3 else -1, slow_factor=1.5,
                  seed=rng.randrange(1000), dispatch=rng.choice(DISPATCHERS))
    values.update(fixed)
    return EnvParams(**values)


@pytest.mark.parametrize("seed", range(6))
def test_the_kernel_equals_a_reference_dispatcher_written_from_the_text(seed):
    """Free communication (every transfer of no work) leaves the decisions alone: 50 random environments per
    seed, every schedule and dispatcher, noise and stragglers, limits from 1 to the default."""
    rng = random.Random(seed)
    for _ in range(50):
        params = random_environment(rng, prop_len=0.0, sync_base_len=0.0)
        if params.dispatch != "static" and rng.random() < 0.5:
            params = EnvParams(**{**params.as_dict(), "memory_limit": rng.choice([1.0, 1.5, 2.0, 3.0])})
        sample = rng.randrange(5)
        schedule = simulate(params, Policy(), sample)
        start, end, completion = reference_run(params, sample, schedule.memory_limit)
        assert [t.start for t in schedule.tasks] == start, params
        assert [t.end for t in schedule.tasks] == end, params
        assert schedule.completion_time == completion


@pytest.mark.parametrize("seed", range(4))
def test_a_dispatched_order_pasted_back_as_a_static_order_gives_the_same_timeline(seed):
    """With contended ports, priorities and noise: what a dispatcher decided is an order like any other. Its text,
    as --print-order prints it, runs as a static order and reproduces the run to the bit."""
    rng = random.Random(100 + seed)
    for _ in range(25):
        params = random_environment(rng, dispatch=rng.choice(RULES), prop_len=rng.choice([0.5, 1.0]),
                                    sync_base_len=rng.choice([0.0, 2.0]), ingress_capacity=rng.choice([0.5, 1.0]),
                                    comm_jitter=0.2, schedules=[s for s in SCHEDULES if s != "dualpipe-v"])
        policy = Policy(priorities={"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2},
                        exclusive_tiers={"grad_prop": "a"} if rng.random() < 0.5 else {})
        sample = rng.randrange(3)
        schedule = simulate(params, policy, sample)
        assert validate_schedule(schedule) == [], params
        text = format_orders(schedule.order_text())
        replay = simulate(replace(params, dispatch="static", memory_limit=0.0), policy, sample, parse_orders(text))
        assert [(t.start, t.end) for t in replay.tasks] == [(t.start, t.end) for t in schedule.tasks], params
        assert replay.order_text() == schedule.order_text() and replay.given_order
        assert validate_schedule(replay) == []


def test_a_given_order_runs_on_the_kernel_compiled_for_every_run():
    """Its arrays are read-only as a graph's own, so --order FILE costs no compile of its own (13 s)."""
    import numba

    from pipeline_sim import kernel

    if numba.config.DISABLE_JIT:
        pytest.skip("nothing is compiled under NUMBA_DISABLE_JIT")
    params = EnvParams(n=4, num_gpus=2)
    compiled = list(kernel.simulate.signatures)
    run = simulate(params, Policy(), 0, simulate(params, Policy()).order_text())
    assert run.given_order and list(kernel.simulate.signatures) == compiled


def test_a_given_order_that_is_not_the_gpus_own_is_refused():
    params = EnvParams(schedule="zb-h1", n=4, num_gpus=2)
    own = simulate(params, Policy()).order_text()
    for order, value, words in (
            ([own[0], own[1][:-1]], "GPU 1", "must list each of its 12 tasks once; it lacks 1W3"),
            ([own[0][:1] + own[0], own[1]], "GPU 0", f"must list each of its 12 tasks once; {own[0][0]} appears "
                                                      f"twice"),
            ([own[0][:1] + own[0][:-1], own[1]], "GPU 0", f"; it lacks 0W3; {own[0][0]} appears twice"),
            ([own[1], own[0]], "1F0", "is no compute task of GPU 0"),
            ([own[0]], "1 GPUs", "must list each of the 2 GPUs; GPU 1 and on are missing")):
        with pytest.raises(ParameterError) as error:
            simulate(params, Policy(), 0, order)
        assert error.value.name == "order" and error.value.value == value and words in str(error.value)
    # a line of the file out of turn says which, and what it should read
    from pipeline_sim.orders import parse_orders

    with pytest.raises(ParameterError, match=r"line 2 must read 'GPU 1: 1F0 1F1 \.\.\.'"):
        parse_orders(f"GPU 0: {' '.join(own[0])}\nGPU 2: {' '.join(own[1])}")
    with pytest.raises(ParameterError, match="dispatch"):
        simulate(replace(params, dispatch="greedy"), Policy(), 0, own)
    with pytest.raises(ParameterError, match="'GPU 0: 0F0 0F1 ...'"):
        parse_orders("GPU 1: 1F0")
    with pytest.raises(ParameterError, match="'GPU 0: 0F0 0F1 ...'"):  # before the orders, a line is a mistake
        parse_orders("1f1b: completion time 8\nGPU 0: 0F0")
    # a dispatcher's DualPipeV order runs a pair's halves apart: the static schedule, which runs them whole, says so
    dual = EnvParams(schedule="dualpipe-v", n=8, num_gpus=4)
    split = simulate(replace(dual, dispatch="greedy"), Policy()).order_text()
    with pytest.raises(ParameterError, match=r"runs within the pair \(\d+F\d+;\d+B\d+\) under static dualpipe-v, which "
                                             r"runs its pairs whole: an order that splits them \(a dispatcher's\) "
                                             r"cannot be replayed"):
        simulate(dual, Policy(), 0, split)
    # --print-order's whole output reads back: its report after the orders is not theirs
    assert parse_orders("GPU 0: 0F0 0B0\nGPU 1: 1F0 1B0\n1f1b: completion time 8 (ideal 6)\n  chart: c.png\n") == \
        [["0F0", "0B0"], ["1F0", "1B0"]]


def test_the_validator_accepts_dispatched_runs_within_their_limit():
    rng = random.Random(7)
    for _ in range(60):
        params = random_environment(rng, dispatch=rng.choice(RULES), comm_jitter=0.1)
        schedule = simulate(params, Policy(), rng.randrange(3))
        assert validate_schedule(schedule) == [], params
        assert max(schedule.peak_activations) <= schedule.memory_limit + 1e-12


def test_the_bounds_never_exceed_a_completion_time():
    """Thousands of runs: every schedule and dispatcher, memory limits, policies, contention, noise; the
    memory-aware bound (section 12.2) at each run's limit in force, never below the plain bound."""
    rng = random.Random(11)
    policies = [Policy(), Policy(priorities={"fwd_prop": 0.1, "grad_prop": 0.1, "grad_sync": 1.0}),
                Policy(exclusive_tiers={"grad_sync": "a"}), Policy(exclusive_tiers={"fwd_prop": "a", "grad_prop": "b"})]
    runs = tightened = 0
    for _ in range(400):
        params = random_environment(rng, prop_len=rng.choice([0.0, 0.3, 1.0]), sync_base_len=rng.choice([0.0, 2.0]),
                                    ingress_capacity=rng.choice([0.5, 1.0, 2.0]), comm_jitter=rng.choice([0.0, 0.2]))
        if params.dispatch != "static" and rng.random() < 0.5:
            params = replace(params, memory_limit=float(rng.randint(2, 4)))  # a V schedule's room is 2 chunks of 1/2
        elif rng.random() < 0.3:  # rooms of their own per stage: the smallest bounds the jobs in flight
            params = replace(params, stage_weights=tuple(rng.choice([0.5, 1.0, 1.5])
                                                         for _ in range(params.v * params.num_gpus)))
        sample = rng.randrange(4)
        figures = simulate_figures(params, policies, sample)
        times = figures[:, 0]
        plain, held = lower_bound(params, sample), memory_bound(params, sample)
        assert plain <= held and (held <= times * (1 + 1e-9)).all(), params
        peaks = figures[:, 3 + 2 * params.num_gpus:]
        assert (peaks <= memory_in_force(params) + 1e-12).all(), params
        runs += len(times)
        tightened += held > plain
    assert runs >= 1600 and tightened >= 40


def free(**values):
    return EnvParams(prop_len=0.0, sync_base_len=0.0, **values)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_the_bound_is_exact_for_static_gpipe_and_1f1b_on_free_links(schedule):
    for p in range(1, 6):
        for n in range(1, 10):
            params = free(schedule=schedule, num_gpus=p, n=n, fwd_len=1.0, bwd_len=2.0)
            time = simulate(params, Policy()).completion_time
            assert lower_bound(params) == time == (n + p - 1) * 3.0


def test_the_bound_is_exact_for_static_zb_h1_at_its_default_lengths_once_n_reaches_the_gpus():
    for p in range(1, 6):
        for n in range(p, 12):
            params = free(schedule="zb-h1", num_gpus=p, n=n)
            assert lower_bound(params) == simulate(params, Policy()).completion_time == (p - 1) * 1.0 + n * 3.0


def test_the_bound_is_exact_on_one_gpu_without_gradient_syncs():
    """One GPU sends nothing but gradient syncs; without them it computes without a pause, noise or not."""
    rng = random.Random(3)
    for _ in range(40):
        params = random_environment(rng, num_gpus=1, n=rng.randint(1, 6), schedule=rng.choice(["1f1b", "zb-h1"]),
                                    sync_base_len=0.0, slow_gpu=-1)
        sample = rng.randrange(3)
        assert lower_bound(params, sample) == pytest.approx(simulate(params, Policy(), sample).completion_time,
                                                            rel=1e-12)


def test_the_static_order_ignores_a_memory_limit():
    """It cannot adapt to one: the limit is checked against its domain, then set to 0, as a schedule parameter
    its schedule does not read; a grid's static rows do not multiply by it."""
    base = calculate_full_pipeline_schedule(schedule="zb-h1", n=8, num_gpus=4)
    for limit in (2.0, 4.0, 9.0):
        limited = calculate_full_pipeline_schedule(schedule="zb-h1", n=8, num_gpus=4, memory_limit=limit)
        assert timeline(base) == timeline(limited) and limited.memory_limit == 4 and limited.params.memory_limit == 0
    grid = EnvironmentGrid.from_mapping({"dispatch": ["static", "greedy"], "memory_limit": [0, 2, 3]})
    assert [(p.dispatch, p.memory_limit) for p in grid] == [("static", 0.0), ("greedy", 0.0), ("greedy", 2.0),
                                                            ("greedy", 3.0)]


def test_a_dispatcher_limit_counts_whole_steps_of_one_chunk():
    for v_schedule, limit, in_force in (("1f1b", 1.5, 1.0), ("zb-v", 1.7, 1.5), ("interleaved-1f1b", 2.33, 2.0)):
        s = calculate_full_pipeline_schedule(schedule=v_schedule, dispatch="greedy", memory_limit=limit)
        assert s.memory_limit == in_force and max(s.peak_activations) <= in_force


def test_dispatch_names_are_case_insensitive():
    assert EnvParams(dispatch=" Greedy ").dispatch == "greedy"


@pytest.mark.parametrize("values, name, allowed", [
    (dict(dispatch="fastest"), "dispatch", "one of static, greedy, critical-path, zb-adaptive"),
    (dict(memory_limit=-1.0), "memory_limit", "0 <= x <= 1e+09"),
    (dict(dispatch="greedy", memory_limit=0.5), "memory_limit", "1 is the smallest limit"),
    (dict(dispatch="greedy", schedule="dualpipe-v", fb_overlap=0.2), "dispatch", "no run-time form"),
])
def test_bad_dispatch_input_names_the_argument(values, name, allowed):
    with pytest.raises(ParameterError) as error:
        calculate_full_pipeline_schedule(**values)
    assert error.value.name == name and allowed in str(error.value)


def test_dualpipe_v_without_overlap_dispatches_its_pairs_as_two_tasks():
    s = calculate_full_pipeline_schedule(schedule="dualpipe-v", n=8, num_gpus=2, dispatch="greedy")
    assert not any(t.kind == "overlap_f_b" for t in s.tasks)
    assert validate_schedule(s) == []
    assert dispatch_arguments(s.params)[1] == DISPATCHERS.index("greedy")


def test_a_dispatch_sweep_end_to_end(tmp_path):
    """run_full_pipeline.py on a grid that names the dispatchers: their columns, the bound, the static rows as a
    grid without them writes them, and a comparison figure per noise level with every dispatcher on it."""
    config = tmp_path / "dispatch.json"
    config.write_text(json.dumps({"n": 6, "num_gpus": 3, "schedule": "zb-h1", "dispatch": [*DISPATCHERS, "lookahead"],
                                  "compute_jitter": [0.0, 0.2], "samples": 4}))
    result = run_script("run_full_pipeline.py", "-c", str(config), "--priority-step", "0.5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [path] = (tmp_path / "outputs" / "data").glob("dispatch_*.csv")
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 10 * 37  # 37 policies at step 0.5
    assert {row["dispatch"] for row in rows} == {*DISPATCHERS, "lookahead"}
    header = list(rows[0])
    assert header.index("dispatch") == header.index("fb_overlap") + 1 and tuple(header[-5:]) == BOUND_COLUMNS
    for row in rows:
        assert float(row["lower_bound"]) <= float(row["memory_bound"]) <= float(row["completion_min"]) * (1 + 1e-12)
        assert float(row["bound_gap"]) == pytest.approx(float(row["completion_time"]) / float(row["lower_bound"]) - 1)
        assert float(row["memory_gap"]) == pytest.approx(float(row["completion_time"]) / float(row["memory_bound"]) - 1)
        assert row["hindsight_optimal"] == ""  # a column of hindsight's rows only
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"n": 6, "num_gpus": 3, "schedule": "zb-h1", "compute_jitter": [0.0, 0.2],
                                 "samples": 4}))
    result = run_script("data_generator.py", "-c", str(plain), "--step", "0.5", "-o", "plain.csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "plain.csv", newline="") as handle:
        static = list(csv.DictReader(handle))
    dispatched_static = [r for r in rows if r["dispatch"] == "static"]
    assert [{k: r[k] for k in static[0]} for r in dispatched_static] == static
    compare = sorted((tmp_path / "outputs" / "heatmaps" / path.stem).glob("compare_*.png"))
    assert len(compare) == 2
    assert_png_drawn(compare[0], min_width=1000, min_height=500)


def test_bad_dispatch_input_on_the_command_line(tmp_path):
    for flags, words in ((["--dispatch", "fastest"], "--dispatch: dispatch = 'fastest': must be one of static, "
                                                       "greedy, critical-path, zb-adaptive"),
                         (["--dispatch", "look-ahead"], "--dispatch: dispatch = 'look-ahead': did you mean "
                                                         "'lookahead'? It must be one of static, greedy"),
                         (["--dispatch", "critical_path"], "did you mean 'critical-path'? It must be one of"),
                         (["--dispatch", "greedy", "--memory-limit", "0.5"], "--memory-limit: memory_limit = 0.5"),
                         (["--memory-limit", "-2"], "--memory-limit: memory_limit = -2.0")):
        result = run_here("schedule_visualizer_single_channel.py", *flags, "--no-show", cwd=tmp_path)
        assert_one_line_error(result)
        assert words in result.stderr
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"dispatch": "greedy", "memory_limit": 0.5}))
    result = run_here("data_generator.py", "-c", str(config), "-o", "x.csv", cwd=tmp_path)
    assert_one_line_error(result)
    assert "memory_limit" in result.stderr and "1 is the smallest limit" in result.stderr
    assert not (tmp_path / "x.csv").exists()


def test_the_dispatch_figure_names_a_way_hidden_under_another():
    """Two ways with the same times (or within 1% of the axis) draw one line: the hidden one's legend says which."""
    import pandas as pd

    from pipeline_sim.plotting.dispatch import _hidden_note

    def rows(way, schedule, dispatch, means):
        return [{"way": way, "schedule": schedule, "dispatch": dispatch, "level": level, "mean_vs": mean,
                 "p95_vs": mean, "bound_vs": -0.3} for level, mean in zip((0.0, 0.1), means)]

    family = pd.DataFrame(rows("zb-h1 greedy", "zb-h1", "greedy", (0.0, -0.04))
                          + rows("zb-h1 zb-adaptive", "zb-h1", "zb-adaptive", (0.0, -0.04))
                          + rows("1f1b greedy", "1f1b", "greedy", (0.1, 0.0999))
                          + rows("1f1b", "1f1b", "static", (0.1, 0.1)))
    way = {name: row for name, row in family.drop_duplicates("way").set_index("way", drop=False).iterrows()}
    assert _hidden_note(family, way["zb-h1 greedy"], [way["zb-h1 zb-adaptive"]]) == " (same as zb-adaptive)"
    assert _hidden_note(family, way["1f1b greedy"], [way["1f1b"]]) == " (drawn under 1f1b)"
    assert _hidden_note(family, way["zb-h1 greedy"], [way["1f1b"]]) == ""
    assert _hidden_note(family, way["1f1b greedy"], []) == ""


def test_the_dispatch_figure_reads_each_ways_share_of_the_headroom_to_hindsight():
    """(reference - way) / (reference - hindsight) at the highest level where hindsight is faster, mean / p95."""
    import pandas as pd

    from pipeline_sim.plotting.dispatch import _shares

    def rows(dispatch, means, p95s):
        return [{"way": f"zb-h1 {dispatch}", "schedule": "zb-h1", "dispatch": dispatch, "level": level,
                 "mean_vs": mean, "p95_vs": p95} for level, mean, p95 in zip((0.0, 0.2, 0.3), means, p95s)]

    family = pd.DataFrame(rows("static", (0, 0, 0), (0, 0, 0)) + rows("hindsight", (0, -0.04, -0.05), (0, -0.02, 0.0))
                          + rows("lookahead", (0, -0.03, -0.02), (0, 0.0, 0.01)))
    shares, level = _shares(family, "zb-h1 static")
    assert level == 0.3 and shares == {"zb-h1 lookahead": "\n  captures 40% / n/a of the headroom"}
    assert _shares(family[family["dispatch"] != "hindsight"], "zb-h1 static")[0] == {}
