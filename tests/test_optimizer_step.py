"""The optimizer step (docs/model.md section 6.7): each GPU's last task, after its last gradient sync; the worked
example by hand, invariants over random environments and dispatchers, a workload's step by hand, and nothing
changed without it."""

import csv
import json
import random
from dataclasses import replace

import pytest
from conftest import assert_one_line_error, run_here, sweep_csv

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.engine import simulate
from pipeline_sim.episode import Episode
from pipeline_sim.model import DEFAULT_POLICY, EnvParams, ParameterError, TaskKind
from pipeline_sim.schedules import SCHEDULES
from pipeline_sim.validate import validate_schedule
from pipeline_sim.workload import ModelShape, Workload, stage_params, workload_environment, workload_report

# the worked example of sections 6.6 and 6.7: 1F1B, 2 GPUs, 2 micro-batches, one sync of 2 after the last backward,
# free compute contention
EXAMPLE = dict(schedule="1f1b", num_gpus=2, n=2, sync_freq=2, fwd_len=1, bwd_len=2, prop_len=0, sync_base_len=2,
               fwd_impact=0, bwd_impact=0)
_O = TaskKind.OPTIMIZER_STEP


def spans(schedule, kind):
    return {t.gpu: (t.start, t.end) for t in schedule.tasks if t.kind == kind}


@pytest.mark.parametrize("dispatch", ["static", "greedy", "zb-adaptive"])
def test_the_worked_example_by_hand(dispatch):
    plain = calculate_full_pipeline_schedule(**EXAMPLE, dispatch=dispatch)
    assert plain.completion_time == 11.0 and not spans(plain, _O)
    stepped = calculate_full_pipeline_schedule(**EXAMPLE, optimizer_len=1.5, dispatch=dispatch)
    assert spans(stepped, TaskKind.GRAD_SYNC) == {0: (9.0, 11.0), 1: (7.0, 9.0)}
    assert spans(stepped, _O) == {0: (11.0, 12.5), 1: (9.0, 10.5)}
    assert stepped.completion_time == 12.5
    uneven = calculate_full_pipeline_schedule(**EXAMPLE, optimizer_len=1.5, sync_weights=[1.5, 0.5], dispatch=dispatch)
    assert spans(uneven, TaskKind.GRAD_SYNC) == {0: (9.0, 12.0), 1: (7.0, 8.0)}
    assert spans(uneven, _O) == {0: (12.0, 14.25), 1: (8.0, 8.75)}
    assert uneven.completion_time == 14.25
    # everything before the step runs as without it
    before = [(t.start, t.end) for t in plain.tasks]
    assert [(t.start, t.end) for t in stepped.tasks if t.kind != _O] == before


def test_a_step_is_text_label_and_order():
    schedule = calculate_full_pipeline_schedule(**EXAMPLE, optimizer_len=1.5)
    steps = [t for t in schedule.tasks if t.kind == _O]
    assert [str(t.id) for t in steps] == ["0O0", "1O0"] and {t.label for t in steps} == {"O"}
    assert [schedule.tasks[order[-1]].kind for order in schedule.orders] == [_O, _O]
    # a run's order, steps included, replays to the same run
    texts = [[str(schedule.tasks[i].id) for i in order] for order in schedule.orders]
    again = simulate(schedule.params, DEFAULT_POLICY, order=texts)
    assert [(t.start, t.end) for t in again.tasks] == [(t.start, t.end) for t in schedule.tasks]


def _random_environment(rng: random.Random, seed: int) -> EnvParams | None:
    try:
        return EnvParams(schedule=rng.choice(list(SCHEDULES)), num_gpus=rng.randint(1, 5), n=rng.randint(1, 10),
                         sync_freq=rng.randint(1, 3), fwd_len=rng.choice([0.5, 1, 2]), bwd_len=rng.choice([1, 2, 3]),
                         prop_len=rng.choice([0, 0.5, 1]), sync_base_len=rng.choice([0, 1, 2]),
                         optimizer_len=rng.choice([0.25, 1, 3]),
                         dispatch=rng.choice(["static", "greedy", "critical-path", "zb-adaptive"]),
                         compute_jitter=rng.choice([0, 0.2]), comm_jitter=rng.choice([0, 0.2]),
                         slow_gpu=rng.choice([-1, 0]), slow_factor=1.5, seed=seed)
    except ParameterError:  # a schedule's requirement on n or the GPUs
        return None


def test_invariants_over_random_environments():
    rng = random.Random(24)
    checked = 0
    while checked < 150:
        params = _random_environment(rng, checked)
        if params is None:
            continue
        checked += 1
        schedule = simulate(params, DEFAULT_POLICY, sample=checked % 3)
        assert validate_schedule(schedule) == [], params
        steps = {t.gpu: t for t in schedule.tasks if t.kind == _O}
        assert sorted(steps) == list(range(params.num_gpus))
        for task in schedule.tasks:
            if task.kind != _O and (task.parts or task.kind == TaskKind.GRAD_SYNC):
                assert task.end <= steps[task.gpu].start + 1e-9, (params, task)
        for gpu, step in steps.items():  # nothing slows it: its work takes exactly its time
            assert step.end - step.start == pytest.approx(step.length)
        assert schedule.lower_bound <= schedule.completion_time + 1e-9


def test_steps_take_compute_jitter_and_the_straggler():
    params = EnvParams(**EXAMPLE, optimizer_len=1.5, compute_jitter=0.3, seed=7)
    lengths = {simulate(params, DEFAULT_POLICY, sample).tasks[-1].length for sample in range(5)}
    assert len(lengths) == 5
    slow = simulate(replace(params, compute_jitter=0.0, slow_gpu=1, slow_factor=2.0), DEFAULT_POLICY)
    assert {t.gpu: t.length for t in slow.tasks if t.kind == _O} == {0: 1.5, 1: 3.0}


def test_a_step_is_never_a_decision():
    """Replaying a dispatcher's run through an episode decides every task but the steps, the same decisions with
    and without them, and gives the run."""
    base = EnvParams(n=6, num_gpus=3, schedule="zb-h1", compute_jitter=0.2, seed=2)
    counts = []
    for optimizer_len in (0.0, 2.0):
        params = replace(base, optimizer_len=optimizer_len, dispatch="greedy")
        run = simulate(params, DEFAULT_POLICY, 1)
        episode = Episode(params, DEFAULT_POLICY)
        episode.reset(1)
        position = [0] * params.num_gpus
        decisions = 0
        while not episode.done:
            g = episode.gpu
            wanted = run.orders[g][position[g]]
            assert run.tasks[wanted].kind != _O
            if wanted in episode.choices()[:-1]:
                episode.start_task(wanted)
                position[g] += 1
            else:
                episode.start_task(-1)
            decisions += 1
        assert position == [len(order) - (optimizer_len > 0) for order in run.orders]
        assert episode.completion_time == run.completion_time
        counts.append(decisions)
    assert counts[0] == counts[1]


# a tiny model: 1,000 FLOP/s at efficiency 0.5, links of 100 bytes/s, memory of 160 bytes/s
DERIVE = ModelShape(layers=4, hidden=8, heads=2, kv_heads=2, ffn_hidden=32, vocab=16, seq_len=4)
GPU = {"tflops": 1e-9, "memory_gb": 3.5e-5, "memory_bandwidth": 1.6e-7}


def tiny_workload(**kwargs):
    values = dict(model=DERIVE, gpu=GPU, compute_efficiency=0.5, data_parallel=2, micro_batch_size=2,
                  global_batch_size=8, p2p_bandwidth=1e-7, dp_bandwidth=1e-7, embedding_on_first=False,
                  head_on_last=False, optimizer_step=True)
    return Workload(**(values | kwargs))


def test_a_workloads_step_by_hand():
    # 16 bytes per parameter read and written at 160 B/s: 0.2 s per parameter. Stages of 1 and 3 layers hold 912
    # and 2480 parameters (784 a layer, 128 an embedding): steps of 182.4 s and 496 s
    workload = tiny_workload(layers_per_stage=[1, 3])
    assert stage_params(workload, 2) == [912, 2480]
    params = workload_environment(workload, num_gpus=2)
    assert params.optimizer_len == pytest.approx(0.2 * 1696)
    assert params.step_lengths() == pytest.approx((182.4, 496.0))
    schedule = calculate_full_pipeline_schedule(**params.as_dict())
    assert {t.gpu: t.length for t in schedule.tasks if t.kind == _O} == pytest.approx({0: 182.4, 1: 496.0})
    report = workload_report(workload, params, schedule.completion_time, [1.0, 1.0])
    assert report.lines()[0].endswith("sync 33.9 s, optimizer step 496 s (fullest GPU)")
    # even stages: every GPU steps over the fullest GPU's parameters, 2 x 784 + 128 = 1696
    even = workload_environment(tiny_workload(), num_gpus=2)
    assert even.sync_weights == () and even.step_lengths() == pytest.approx((339.2, 339.2))
    # without data parallelism, uneven stages still step their own parameters
    alone = workload_environment(tiny_workload(layers_per_stage=[1, 3], data_parallel=1, global_batch_size=4),
                                 num_gpus=2)
    assert alone.sync_base_len == 0.0 and alone.step_lengths() == pytest.approx((182.4, 496.0))
    # off: no step, the environment as before
    assert workload_environment(tiny_workload(optimizer_step=False), num_gpus=2).optimizer_len == 0.0


def test_a_step_needs_the_memory_bandwidth():
    with pytest.raises(ParameterError, match="optimizer_step = True: needs the gpu's memory_bandwidth"):
        tiny_workload(gpu={"tflops": 1e-9, "memory_gb": 3.5e-5})
    with pytest.raises(ParameterError, match="optimizer_len = -1: "):
        EnvParams(optimizer_len=-1)


def test_a_sweep_carries_the_step_only_when_given(tmp_path):
    headers, rows = {}, {}
    for name, extra in (("plain", {}), ("step", {"optimizer_len": [0, 2]})):
        headers[name], rows[name] = sweep_csv(tmp_path, name, {"n": 4, "num_gpus": 2} | extra)
    assert "optimizer_len" not in headers["plain"] and "optimizer_len" in headers["step"]
    plain = {row["policy"]: row["completion_time"] for row in rows["plain"]}
    zero = {row["policy"]: row["completion_time"] for row in rows["step"] if float(row["optimizer_len"]) == 0}
    two = {row["policy"]: float(row["completion_time"]) for row in rows["step"] if float(row["optimizer_len"]) == 2}
    assert zero == plain and all(two[policy] > float(plain[policy]) for policy in plain)
    result = run_here("plot_heatmap.py", str(tmp_path / "step.csv"), "-o", str(tmp_path / "figures"),
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert any("opt2" in path.name for path in (tmp_path / "figures").iterdir())


def test_the_visualizer_draws_and_reports_the_step(tmp_path):
    result = run_here("schedule_visualizer_duel_channel.py", "-n", "4", "--num-gpus", "2", "--optimizer-len", "1.5",
                      "--print-order", "--no-show", "--output", str(tmp_path / "g.png"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "0O0" in result.stdout and (tmp_path / "g.png").stat().st_size > 0


def test_the_bound_counts_the_step():
    """The step follows every other task of its GPU, so it lengthens their tails: a static 1F1B bound on free links
    stays exact, and no bound falls when a step is added."""
    free = dict(prop_len=0, sync_base_len=0, fwd_impact=0, bwd_impact=0)
    assert calculate_full_pipeline_schedule(**free).lower_bound == 33.0
    stepped = calculate_full_pipeline_schedule(**free, optimizer_len=1)
    assert stepped.lower_bound == stepped.completion_time == 34.0
    # the worked example: critical-path meets the bound, 10.5 with equal syncs and 11.25 with sync_weights
    for weights, bound in (((), 10.5), ((1.5, 0.5), 11.25)):
        run = calculate_full_pipeline_schedule(**EXAMPLE, optimizer_len=1.5, sync_weights=weights,
                                               dispatch="critical-path")
        assert run.lower_bound == run.completion_time == bound
    rng = random.Random(6)
    for seed in range(60):
        params = _random_environment(rng, seed)
        if params is not None:
            without = simulate(replace(params, optimizer_len=0.0), DEFAULT_POLICY, 1).lower_bound
            assert simulate(params, DEFAULT_POLICY, 1).lower_bound >= without


def test_an_order_must_end_with_the_step(tmp_path):
    order = tmp_path / "order.txt"
    order.write_text("GPU 0: 0O0 0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3\nGPU 1: 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 1O0\n")
    args = ["-n", "4", "--num-gpus", "2", "--optimizer-len", "1", "--no-show", "--output", str(tmp_path / "g.png")]
    result = run_here("schedule_visualizer_single_channel.py", *args, "--order", str(order), cwd=tmp_path)
    assert_one_line_error(result, "--order: order = '0O0': must end GPU 0's order: the optimizer step waits")
    order.write_text("GPU 0: 0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3 0O0\nGPU 1: 1B0 1F0 1F1 1B1 1F2 1B2 1F3 1B3 1O0\n")
    result = run_here("schedule_visualizer_single_channel.py", *args, "--order", str(order), cwd=tmp_path)
    assert_one_line_error(result, "the order cannot run to its end: simulation stuck, nothing can progress: 0B0 "
                                  "waits for 1GP0; 1B0 waits for 1F0")


def test_a_workloads_step_out_of_range_names_what_the_user_gave(tmp_path):
    result = run_here("schedule_visualizer_single_channel.py", "--model", "llama3-8b", "--optimizer-step",
                      "--bytes-per-param", "1e12", "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "--bytes-per-param: bytes_per_param = 1000000000000.0: gives optimizer_len = "
                                  "1.97e+09 s for the optimizer step of v mean stages (optimizer_step)")
    with pytest.raises(ParameterError, match="optimizer_step = True: needs bytes_per_param > 0"):
        tiny_workload(bytes_per_param=0)


def test_a_plan_with_the_step_says_so(tmp_path):
    from conftest import run_script

    small = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--gpus", "4", "--global-batch-size", "16", "--seq-len",
             "2048", "--workers", "1"]
    plain = run_script("plan.py", *small, "--no-optimizer-step", cwd=tmp_path)
    stepped = run_script("plan.py", *small, "--optimizer-step", cwd=tmp_path)
    assert plain.returncode == stepped.returncode == 0, plain.stderr + stepped.stderr
    assert "optimizer step" not in plain.stdout.splitlines()[0]
    assert stepped.stdout.splitlines()[0].startswith("llama3-8b on 4 x h100-80gb, batch 16 x 2048 tokens, "
                                                     "efficiency 0.5, optimizer step, element-wise work, no dropout: ")
    folder = tmp_path / "outputs" / "plan"
    name = "plan_llama3-8b_4xh100-80gb_gbs16_s2048_eff0.5"
    assert {path.name for path in folder.iterdir()} == {f"{name}{suffix}_ew_nodrop.{ext}"
                                                        for suffix in ("", "_opt") for ext in ("csv", "png")}
    times = {}
    for suffix in ("", "_opt"):
        with open(folder / f"{name}{suffix}_ew_nodrop.csv", newline="") as handle:
            times[suffix] = float(next(csv.DictReader(handle))["iteration_seconds"])
    assert times["_opt"] > times[""]


def test_a_workload_grid_that_gives_n_is_drawn(tmp_path):
    model = {"layers": 4, "hidden": 64, "heads": 2, "ffn_hidden": 128, "vocab": 100, "seq_len": 64}
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"model": model, "num_gpus": 2, "n": [4, 8], "optimizer_step": True}))
    result = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--step", "0.5", "--workers", "1",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    result = run_here("plot_heatmap.py", "out.csv", "-o", "figures", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    names = sorted(path.name for path in (tmp_path / "figures").iterdir())
    assert len(names) == 3 and all("_opt_" in name or name.endswith("_opt.png") for name in names)
    assert any("gbs4" in name for name in names) and any("gbs8" in name for name in names)
