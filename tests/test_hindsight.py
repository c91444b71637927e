"""The memory-aware bound (docs/model.md section 12.2) and dispatch = hindsight (section 12.6)."""

import csv
import json

import pytest
from conftest import run_script

from pipeline_sim import EnvParams, Policy, simulate
from pipeline_sim import hindsight as hindsight_module
from pipeline_sim.engine import build_task_graph, lower_bound, memory_bound, texts_of
from pipeline_sim.hindsight import simulate_hindsight, solve, solver_available, static_params

needs_solver = pytest.mark.skipif(not solver_available(), reason="the [solver] extra (OR-Tools) is not installed")


def test_worked_example_13_the_memory_limit_lifts_the_bound_of_zb_h1():
    """n = 8, 4 GPUs, ZB-H1 at its default lengths and communication, the dispatchers' default limit of 4: the
    plain bound is 32, the memory term 41 (GPU 0's last forward cannot start before 24)."""
    params = EnvParams(n=8, num_gpus=4, schedule="zb-h1", dispatch="greedy")
    assert lower_bound(params) == 32.0 and memory_bound(params) == 41.0
    assert memory_bound(params, limit=8.0) == 32.0  # room for every micro-batch: no memory term
    assert memory_bound(EnvParams(n=8, num_gpus=4, schedule="zb-h1")) == 41.0  # static: its own peak, 4


def test_worked_example_8_the_bound_of_one_micro_batch_at_a_time_is_its_run():
    params = EnvParams(num_gpus=3, n=3, prop_len=0.0, sync_base_len=0.0, dispatch="greedy", memory_limit=1.0)
    assert lower_bound(params) == 15.0
    assert memory_bound(params) == simulate(params, Policy()).completion_time == 27.0


SMALL = [EnvParams(schedule=schedule, n=n, num_gpus=p, prop_len=prop, sync_base_len=2 * prop, dispatch="greedy",
                   memory_limit=float(limit))
         for schedule in ("1f1b", "zb-h1") for n, p in ((4, 2), (4, 3)) for limit in (1, 2)
         for prop in (0.0, 1.0)]


@needs_solver
def test_the_memory_bound_is_within_5_percent_of_proven_optima_and_never_above_them():
    """Without noise the bound meets every optimum the solver proves; with 20% jitter it stays below them."""
    proven = 0
    for params in SMALL:
        found = solve(static_params(params), 0, params.memory_limit)
        assert found is not None
        bound = memory_bound(params)
        assert bound <= found.relaxed * (1 + 1e-3)  # the solver's whole steps round each task by half a step
        if found.status == "optimal":
            proven += 1
            assert bound >= 0.95 * found.relaxed, params
    assert proven >= len(SMALL) - 2
    for params in SMALL[:4]:
        noisy = EnvParams(**{**params.as_dict(), "compute_jitter": 0.2, "comm_jitter": 0.2})
        for sample in range(1):
            found = solve(static_params(noisy), sample, noisy.memory_limit)
            assert found is not None and memory_bound(noisy, sample) <= found.relaxed * (1 + 1e-3)


@needs_solver
def test_a_hindsight_order_is_a_given_order_replayed_by_the_kernel(monkeypatch):
    """On free links the replay of the solved order takes no longer than the relaxation says and no less than
    the solver proved; it keeps the limit and is never slower than the static order."""
    monkeypatch.setattr(hindsight_module, "WORK_LIMIT", 0.3)
    params = EnvParams(n=6, num_gpus=3, schedule="zb-h1", prop_len=0.0, sync_base_len=0.0, compute_jitter=0.2,
                       dispatch="hindsight", seed=7)
    for sample in range(2):
        found = hindsight_module.hindsight(params, sample)
        static = static_params(params)
        graph = build_task_graph(static)
        replay = simulate(static, Policy(), sample, [texts_of(graph, tasks) for tasks in found.order])
        assert found.relaxed_bound * (1 - 2e-3) <= replay.completion_time <= found.relaxed * (1 + 2e-3)
        assert max(replay.peak_activations) <= 3.0 and replay.given_order
        assert found.relaxed_bound >= memory_bound(params, sample) * (1 - 2e-3)
        run = simulate_hindsight(params, Policy(), sample)
        assert run.completion_time <= min(replay.completion_time, simulate(static, Policy(), sample).completion_time)
    still = EnvParams(**{**params.as_dict(), "compute_jitter": 0.0})
    assert hindsight_module.hindsight(still, 0).status == "optimal"


@needs_solver
def test_a_hindsight_sweep_reports_its_proof(tmp_path):
    config = tmp_path / "h.json"
    config.write_text(json.dumps({"n": 4, "num_gpus": 2, "schedule": "zb-h1", "dispatch": ["static", "hindsight"]}))
    result = run_script("data_generator.py", "-c", str(config), "--step", "1.0", "-o", "h.csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "h.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 31
    for static, solved in zip(rows[:31], rows[31:]):
        assert static["hindsight_optimal"] == "" and solved["hindsight_optimal"] == "1.0"
        assert float(solved["memory_bound"]) <= float(solved["completion_time"]) <= float(static["completion_time"])


@needs_solver
def test_a_sweep_on_two_workers_solves_each_draw_once(monkeypatch, tmp_path):
    """A hindsight environment's rows are one unit of work, since each draw's order serves every policy: given to
    two workers in pieces, both solved every draw. The rows are those of one worker."""
    from pipeline_sim.config import EnvironmentGrid
    from pipeline_sim.sweep import SweepPlan, rows_per_chunk, run_sweep

    solved = tmp_path / "solved.txt"
    original = hindsight_module.solve

    def counted(static, sample, limit):
        with open(solved, "a") as handle:  # the workers are forked with this in place of the solver
            handle.write(f"{'ideal' if static.prop_len == 0.0 else sample}\n")
        return original(static, sample, limit)

    monkeypatch.setattr(hindsight_module, "solve", counted)
    grid = EnvironmentGrid.from_mapping({"n": 4, "num_gpus": 2, "schedule": "zb-h1", "compute_jitter": 0.2,
                                         "dispatch": ["greedy", "hindsight"], "samples": 3})
    plan = SweepPlan(grid, step=0.25)
    size = rows_per_chunk(plan, 2)
    assert size < len(plan.policies)  # the greedy environment is given in pieces
    for start in (0, len(plan.policies) + 5):
        chunks = [(chunk.params.dispatch, chunk.first, chunk.stop) for chunk in plan.chunks(start, size)]
        assert chunks[-1] == ("hindsight", start % len(plan.policies), len(plan.policies))
        assert all(dispatch == "greedy" for dispatch, _, _ in chunks[:-1])
    for _ in run_sweep(plan, tmp_path / "two.csv", workers=2):
        pass
    # each draw once, and once the free links' run of the environment's ideal time
    assert sorted(solved.read_text().split()) == ["0", "1", "2", "ideal"]
    solved.unlink()
    for _ in run_sweep(plan, tmp_path / "one.csv", workers=1):
        pass
    assert (tmp_path / "two.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()


@needs_solver
def test_the_visualizer_says_what_order_hindsight_ran(tmp_path):
    """Beyond the solver's size the order is a rule's, and the static order may beat the solved one on a draw: the
    run said neither."""
    from conftest import run_here

    def said(*flags):
        result = run_here("schedule_visualizer_single_channel.py", "--schedule", "zb-h1", "--dispatch", "hindsight",
                          *flags, "--no-show", "--output", str(tmp_path / "chart.png"), "--overwrite", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()[-1]

    assert said("-n", "4", "--num-gpus", "2") == \
        "  the hindsight order: proven optimal on the fixed-delay relaxation (19 there)"
    large = said("-n", "64", "--num-gpus", "8", "--compute-jitter", "0.2")
    assert large.startswith("  the hindsight order: the fastest on this draw of the orders greedy, critical-path "
                            "and zb-adaptive take (2,944 tasks; the solver takes 2,000 at most)"), large


def test_the_headroom_study_refuses_what_cannot_run_before_its_work(tmp_path):
    from conftest import assert_one_line_error, run_script

    (tmp_path / "kept.json").write_text("[]")
    (tmp_path / "damaged.npz").write_bytes(b"not an archive")
    for args, message in ((["--draws", "0"], "argument --draws: 0 must be >= 1"),
                          (["--learned", "none.npz"], "dispatch = 'learned:none.npz': no such policy file"),
                          (["--learned", "damaged.npz"], "dispatch = 'learned:damaged.npz': is not"),
                          (["--json", "kept.json"], "--json kept.json exists; pass --overwrite to replace it")):
        result = run_script("benchmarks/headroom.py", *args, cwd=tmp_path, timeout=60)
        assert_one_line_error(result, f"headroom.py: error: {message}")
    assert (tmp_path / "kept.json").read_text() == "[]"


@needs_solver
def test_the_visualizer_measures_a_hindsight_run_against_its_environments_ideal(tmp_path):
    """A hindsight run's schedule replays its order statically, under no memory limit: its ideal had been the
    schedule's static order's (27), below the memory-aware bound, where a sweep of the same environment says 72."""
    from conftest import run_here

    from pipeline_sim.metrics import ideal_time

    params = EnvParams(n=8, schedule="zb-h1", dispatch="hindsight", memory_limit=1)
    result = run_here("schedule_visualizer_single_channel.py", "--schedule", "zb-h1", "--dispatch", "hindsight",
                      "--memory-limit", "1", "--no-show", "-o", "chart.png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert ideal_time(params) == 72.0
    assert f"(ideal {ideal_time(params):.6g}, lower bound" in result.stdout
