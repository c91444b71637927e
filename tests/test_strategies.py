"""Sharded data parallelism and context parallelism (docs/model.md section 15): the worked examples by hand, memory
and volumes by hand, invariants over random environments of every schedule and dispatcher, the workload's
derivations, the command line, and nothing changed without them."""

import json
import random
import re
from dataclasses import replace

import pytest
from conftest import assert_one_line_error, run_here, sweep_csv

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.engine import simulate
from pipeline_sim.model import DEFAULT_POLICY, EnvParams, ParameterError, TaskKind
from pipeline_sim.schedules import SCHEDULES
from pipeline_sim.validate import validate_schedule
from pipeline_sim.workload import (
    ModelShape,
    Workload,
    derived_parameters,
    gpu_memory_gb,
    seconds_text,
    sharded_collectives,
    workload_environment,
    workload_report,
)

FREE = dict(fwd_impact=0, bwd_impact=0)
K = TaskKind


def spans(schedule, kind):
    return {(t.gpu, t.index): (t.start, t.end) for t in schedule.tasks if t.kind == kind}


def test_zero3_prefetch_by_hand():
    run = calculate_full_pipeline_schedule(num_gpus=1, n=2, fwd_len=1, bwd_len=2, prop_len=0, sync_base_len=0,
                                           zero=3, gather_len=1, **FREE)
    assert spans(run, K.FWD_GATHER) == {(0, 0): (0.0, 1.0), (0, 1): (1.0, 3.0)}
    assert spans(run, K.BWD_GATHER) == {(0, 0): (1.0, 3.0), (0, 1): (3.0, 4.0)}
    assert spans(run, K.FORWARD) == {(0, 0): (1.0, 2.0), (0, 1): (5.0, 6.0)}
    assert spans(run, K.BACKWARD) == {(0, 0): (3.0, 5.0), (0, 1): (6.0, 8.0)}
    assert run.completion_time == 8.0
    assert {t.kind.priority_class for t in run.tasks if not t.kind.is_compute} == {K.GRAD_SYNC}
    assert run.lower_bound <= run.completion_time


def test_zero1_gathers_after_the_step_by_hand():
    example = dict(num_gpus=2, n=2, sync_freq=2, fwd_len=1, bwd_len=2, prop_len=0, sync_base_len=2,
                   optimizer_len=1.5, **FREE)
    plain = calculate_full_pipeline_schedule(**example)
    run = calculate_full_pipeline_schedule(**example, zero=1, gather_len=1)
    assert spans(run, K.PARAM_GATHER) == {(0, 0): (12.5, 13.5), (1, 0): (10.5, 11.5)}
    assert run.completion_time == 13.5 and plain.completion_time == 12.5
    # everything before the gathers runs as without them
    assert [(t.start, t.end) for t in run.tasks if t.kind != K.PARAM_GATHER] == \
        [(t.start, t.end) for t in plain.tasks]


def test_an_exchange_longer_than_its_compute_by_hand():
    run = calculate_full_pipeline_schedule(num_gpus=2, n=1, fwd_len=1, bwd_len=2, prop_len=1, sync_base_len=0,
                                           cp_len=2, **FREE)
    assert spans(run, K.KV_EXCHANGE) == {(0, 0): (0.0, 2.0), (1, 0): (3.0, 5.0)}
    assert spans(run, K.KV_GRAD_EXCHANGE) == {(1, 0): (5.0, 9.0), (0, 0): (10.0, 14.0)}
    assert spans(run, K.FWD_PROP) == {(0, 0): (2.0, 3.0)} and spans(run, K.GRAD_PROP) == {(1, 0): (9.0, 10.0)}
    assert spans(run, K.BACKWARD) == {(1, 0): (5.0, 7.0), (0, 0): (10.0, 12.0)}
    assert run.completion_time == 14.0
    assert {t.kind: t.kind.priority_class for t in run.tasks if t.kind.name.startswith("KV")} == \
        {K.KV_EXCHANGE: K.FWD_PROP, K.KV_GRAD_EXCHANGE: K.GRAD_PROP}


def test_new_tasks_have_text_ids_and_replay():
    run = simulate(EnvParams(num_gpus=2, n=4, zero=3, gather_len=0.5, cp_len=0.3), DEFAULT_POLICY)
    assert {str(t.id) for t in run.tasks} >= {"0FG0", "0BG3", "1KV2", "1KG0"}
    texts = [[str(run.tasks[i].id) for i in order] for order in run.orders]
    again = simulate(run.params, DEFAULT_POLICY, order=texts)
    assert [(t.start, t.end) for t in again.tasks] == [(t.start, t.end) for t in run.tasks]


def test_gathers_are_read_only_with_zero():
    assert EnvParams(gather_len=1.0) == EnvParams() and EnvParams(zero=1, gather_len=1.0).gather_len == 1.0
    with pytest.raises(ParameterError, match="zero"):
        EnvParams(zero=4)


def test_defaults_change_nothing():
    base = EnvParams(num_gpus=3, n=6, schedule="zb-h1", compute_jitter=0.1, comm_jitter=0.1, seed=3)
    for params in (base, replace(base, zero=2), replace(base, zero=3)):  # no gather work: no gather tasks
        run = simulate(params, DEFAULT_POLICY, 1)
        assert len(run.tasks) == len(simulate(base, DEFAULT_POLICY, 1).tasks)
        assert run.completion_time == simulate(base, DEFAULT_POLICY, 1).completion_time


def _random_environment(rng: random.Random, seed: int) -> EnvParams | None:
    zero = rng.choice([0, 1, 2, 3])
    try:
        return EnvParams(schedule=rng.choice(list(SCHEDULES)), num_gpus=rng.randint(1, 4), n=rng.randint(1, 9),
                         sync_freq=rng.randint(1, 3), fwd_len=rng.choice([0.5, 1, 2]), bwd_len=rng.choice([1, 2, 3]),
                         prop_len=rng.choice([0, 0.5, 1]), sync_base_len=rng.choice([0, 1, 2]),
                         optimizer_len=rng.choice([0, 1]), zero=zero,
                         gather_len=rng.choice([0.25, 1, 3]) if zero else 0.0, cp_len=rng.choice([0, 0, 0.2, 2]),
                         dispatch=rng.choice(["static", "greedy", "critical-path", "zb-adaptive"]),
                         compute_jitter=rng.choice([0, 0.2]), comm_jitter=rng.choice([0, 0.2]),
                         ingress_capacity=rng.choice([0.5, 1.0]), seed=seed)
    except ParameterError:  # a schedule's requirement on n or the GPUs
        return None


def test_invariants_over_random_environments():
    rng = random.Random(33)
    checked = 0
    while checked < 200:
        params = _random_environment(rng, checked)
        if params is None:
            continue
        checked += 1
        run = simulate(params, DEFAULT_POLICY, sample=checked % 3)
        assert validate_schedule(run) == [], params
        assert run.lower_bound <= run.completion_time * (1 + 1e-9), params
        for task in run.tasks:  # who waits: section 15.1
            for part in task.parts:
                if part.kind in (K.FORWARD, K.BACKWARD, K.BACKWARD_INPUT) and params.zero == 3 and params.gather_len:
                    gather = run.task("fwd_gather" if part.kind == K.FORWARD else "bwd_gather", part.stage, part.mb)
                    assert gather.end <= task.start + 1e-9, (params, task)


def test_a_sweep_names_the_new_columns_only_when_given(tmp_path):
    header, rows = sweep_csv(tmp_path, "plain", {"n": [4], "num_gpus": [2]})
    assert not {"zero", "gather_len", "cp_len"} & set(header)
    header, rows = sweep_csv(tmp_path, "sharded", {"n": [4], "num_gpus": [2], "zero": [3], "gather_len": [0.5],
                                                   "cp_len": [0, 0.3]})
    assert {"zero", "gather_len", "cp_len"} <= set(header)
    times = {row["cp_len"]: float(row["completion_time"]) for row in rows if row["policy"] == rows[0]["policy"]}
    assert times["0.3"] > times["0.0"]


# section 11's tiny model: layers of 784 parameters, embeddings of 128
TINY = ModelShape(layers=4, hidden=8, heads=2, kv_heads=2, ffn_hidden=32, vocab=16, seq_len=4)
TINY_GPU = {"tflops": 1e-9, "memory_gb": 1.0, "memory_bandwidth": 1.6e-7}


def _tiny(**keys):
    return Workload(**{"model": TINY, "gpu": TINY_GPU, "compute_efficiency": 0.5, "data_parallel": 4,
                       "global_batch_size": 8, "p2p_bandwidth": 1e-7, "dp_bandwidth": 1e-7, **keys})


def _env(workload, zero=0, **env):
    return workload_environment(workload, num_gpus=2, zero=zero, **env)


def test_memory_per_zero_stage_by_hand():
    def static_bytes(workload, zero, **env):
        return [round(gb * 1e9, 6) for gb in gpu_memory_gb(workload, _env(workload, zero, **env), [0.0, 0.0])]
    assert static_bytes(_tiny(), 0) == [27136.0, 27136.0]
    assert static_bytes(_tiny(), 1) == [11872.0, 11872.0]
    assert static_bytes(_tiny(), 2) == [9328.0, 9328.0]
    assert static_bytes(_tiny(), 3) == [11488.0, 11488.0]
    assert static_bytes(_tiny(shard_group=2), 1) == [16960.0, 16960.0]
    # zero 2 accumulating over several micro-batches keeps whole gradients, as zero 1
    assert static_bytes(_tiny(), 2, sync_freq=2) == [11872.0, 11872.0]
    # gradients in fp32 (worked example 18): 2 + 4 + 12 bytes, the gradient's 4 sharded from zero 2 on
    fp32 = _tiny(grad_bytes=4, bytes_per_param=18.0)
    assert static_bytes(fp32, 0) == [1696 * 18.0] * 2
    assert static_bytes(fp32, 1) == [15264.0, 15264.0]
    assert static_bytes(fp32, 2) == [10176.0, 10176.0]
    assert static_bytes(fp32, 3) == [13904.0, 13904.0]
    assert static_bytes(_tiny(grad_bytes=2), 3) == static_bytes(_tiny(), 3)  # the default's width given: the same
    # given, it sets the bytes a parameter too, unless they are given: 2 + 4 + 12
    assert (_tiny(grad_bytes=4).bytes_per_param, _tiny(dtype_bytes=4).bytes_per_param) == (18.0, 16.0)
    assert static_bytes(_tiny(grad_bytes=4), 1) == static_bytes(fp32, 1)
    with pytest.raises(ParameterError, match=r"bytes_per_param = 5.0: must hold a weight and a gradient "
                                             r"\(dtype_bytes \+ grad_bytes = 6\) for zero 1"):
        _env(_tiny(grad_bytes=4, bytes_per_param=5.0), 1)


def test_gradients_in_fp32_move_twice_the_bytes_and_gathers_the_same():
    for zero in (0, 1, 3):
        sync, gather = sharded_collectives(_tiny(), zero)
        sync32, gather32 = sharded_collectives(_tiny(grad_bytes=4, bytes_per_param=18.0), zero)
        assert sync32 == pytest.approx(2 * sync) and gather32 == gather
    run = simulate(_env(_tiny(grad_bytes=4, bytes_per_param=18.0), 3), DEFAULT_POLICY)
    rate = 1e-7 * 1e9
    sent = {kind: sum(t.length for t in run.tasks if t.gpu == 0 and t.kind == kind) * rate
            for kind in (K.GRAD_SYNC, K.FWD_GATHER, K.BWD_GATHER)}
    assert sent == pytest.approx({K.GRAD_SYNC: 2 * 0.75 * 1696 * 4, K.FWD_GATHER: 2 * 0.75 * 1696 * 2,
                                  K.BWD_GATHER: 2 * 0.75 * 1696 * 2})


def test_zero3_volume_per_iteration():
    """Two gathers and one reduce-scatter of 3/4 of a stage's bytes per micro-batch: 1.5 times zero 0's
    all-reduces at sync_freq 1."""
    params = _env(_tiny(), 3)
    assert params.sync_freq == 1 and params.n == 2
    run = simulate(params, DEFAULT_POLICY)
    rate = 1e-7 * 1e9  # bytes a second
    sent = {g: sum(t.length for t in run.tasks if t.gpu == g and t.kind in (K.GRAD_SYNC, K.FWD_GATHER,
                                                                            K.BWD_GATHER)) * rate for g in (0, 1)}
    assert sent == pytest.approx({0: 3 * 2 * 0.75 * 1696 * 2, 1: 3 * 2 * 0.75 * 1696 * 2})
    plain = _env(_tiny(), sync_freq=1)
    all_reduces = sum(t.length for t in simulate(plain, DEFAULT_POLICY).tasks
                      if t.gpu == 0 and t.kind == K.GRAD_SYNC) * rate
    assert sent[0] == pytest.approx(1.5 * all_reduces)


def test_collectives_by_hand():
    per_byte = 2 / (1e-7 * 1e9)
    assert sharded_collectives(_tiny()) == pytest.approx((2 * 3 / 4 * per_byte, 0.0))
    assert sharded_collectives(_tiny(), 1) == pytest.approx((3 / 4 * per_byte, 3 / 4 * per_byte))
    # HSDP: groups of 2, 2 replicas: a reduce-scatter over 2 and the half shard all-reduced over 2
    assert sharded_collectives(_tiny(shard_group=2), 1) == pytest.approx(((1 / 2 + 2 * 1 / 2 / 2) * per_byte,
                                                                                1 / 2 * per_byte))
    # context parallelism joins the gradient group: d x c = 8
    assert sharded_collectives(_tiny(context_parallel=2)) == pytest.approx((2 * 7 / 8 * per_byte, 0.0))


def test_context_parallelism_divides_a_micro_batch():
    """A rank of c = 2 does the work of half a micro-batch: every per-micro-batch length halves, and its keys and
    values, 2 x (s/c) x b x g x h/a x 2 bytes a layer, pass one other rank for a GPU's two layers."""
    whole = derived_parameters(_tiny(), num_gpus=2)
    split = derived_parameters(_tiny(context_parallel=2), num_gpus=2)
    for key in ("fwd_len", "bwd_len", "prop_len"):
        assert split[key] == pytest.approx(whole[key] / 2)
    assert whole["cp_len"] == 0.0
    assert split["cp_len"] == pytest.approx(1 * 2 * 2 * 1 * 2 * 4 * 2 * 2 / 100.0)
    # heads of their own widths (latent attention's): a key's and a value's, in place of h/a each
    wide = replace(TINY, qk_head_dim=12, v_head_dim=4, attention_params=1000)
    split = derived_parameters(_tiny(context_parallel=2, model=wide), num_gpus=2)
    assert split["cp_len"] == pytest.approx(1 * 2 * 2 * 1 * 2 * (12 + 4) * 2 / 100.0)
    with pytest.raises(ParameterError, match="context_parallel"):
        _tiny(context_parallel=3)  # 4 tokens do not cut into 6 chunks


def test_bad_strategy_keys_get_one_line(tmp_path):
    result = run_here("schedule_visualizer_single_channel.py", "--model", "llama3-8b", "--data-parallel", "4",
                      "--shard-group", "3", "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "shard_group", "3", "divide")
    result = run_here("schedule_visualizer_single_channel.py", "--zero", "5", "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "zero", "5")
    # without a model nothing computes its gathers: the stage alone would change nothing
    result = run_here("schedule_visualizer_single_channel.py", "--zero", "3", "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "zero = 3: gathers nothing with no --gather-len (or 0")
    result = run_here("schedule_visualizer_single_channel.py", "--zero", "3", "--gather-len", "0.5", "--no-show",
                      "-o", "zero.png", cwd=tmp_path)
    assert result.returncode == 0 and "zero" in result.stdout, result.stderr
    # nor in a sweep, where its rows would be those of zero 0
    (tmp_path / "zero.json").write_text(json.dumps({"num_gpus": 4, "zero": [0, 1]}))
    result = run_here("data_generator.py", "-c", "zero.json", "-o", "zero.csv", cwd=tmp_path)
    assert_one_line_error(result, "config key 'zero': 1 gathers nothing with 'gather_len' 0 (the default), the work "
                                  "of one all-gather: give it, or 'model', which computes it")
    assert not (tmp_path / "zero.csv").exists()
    (tmp_path / "zero.json").write_text(json.dumps({"num_gpus": 4, "zero": 1, "gather_len": [0, 0.5]}))
    result = run_here("data_generator.py", "-c", "zero.json", "-o", "zero.csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_config_judges_a_key_against_its_own_other_keys():
    """shard_group against the config's data_parallel, context_parallel against its seq_len: a value refused
    only beside the defaults is kept; one refused beside every value the config gives is refused, as the config's
    first combination has it."""
    from pipeline_sim.config import ConfigError, EnvironmentGrid

    base = {"model": "llama3-8b", "num_gpus": 4, "zero": 1}
    for fine in ({"data_parallel": 8, "shard_group": 4, "global_batch_size": 64},
                 {"data_parallel": [8], "shard_group": [2, 4], "global_batch_size": 64},
                 {"seq_len": 6144, "context_parallel": 3}):
        assert len(EnvironmentGrid.from_mapping(base | fine)) >= 1
    mixed = EnvironmentGrid.from_mapping(base | {"data_parallel": [2, 8], "shard_group": 4, "global_batch_size": 64})
    assert len(mixed) == 1 and "must divide data_parallel = 2" in mixed.invalid()[0][1]
    for key, wrong, message in (
            ("shard_group", {"data_parallel": 2, "shard_group": 4}, "shard_group = 4: must divide data_parallel = 2"),
            ("shard_group", {"shard_group": -1}, "shard_group = -1: must be an integer >= 1"),
            ("context_parallel", {"seq_len": 6144, "context_parallel": 5}, "must cut seq_len = 6144 into 2 x 5"),
            ("layers_per_stage", {"layers_per_stage": [[10, 10, 10, 10], [8, 8, 8, 8]]},
             "layers_per_stage = (10, 10, 10, 10): must add up to the 32 layers"),
            ("gpu", {"gpu": [{"tflops": 500, "memory_gb": 80}, {"tflops": -5, "memory_gb": 80}]},
             "gpu.tflops = -5: must be a finite number > 0"),
            ("layers_per_stage", {"layers_per_stage": [[16, 16], [16, [16]]]}, "layers_per_stage = [16, [16]]: must"),
            ("compute_efficiency", {"compute_efficiency": [0.5, 2.0], "dp_bandwidth": [10, 20, 30]},
             "compute_efficiency = 2.0: must be a finite number with 0 < x <= 1")):
        with pytest.raises(ConfigError, match=rf"^config key '{key}': .*{re.escape(message)}"):
            EnvironmentGrid.from_mapping(base | wrong)
    # never valid, though another key's clash comes first in some combinations: every combination is refused, and
    # with --skip-invalid the refusal still says why
    from pipeline_sim.sweep import SweepPlan
    hidden = base | {"context_parallel": 3, "shard_group": [1, 2], "data_parallel": [1, 2]}
    with pytest.raises(ConfigError, match=r"no combination of the grid can run, e\.g\. .*context_parallel = 3"):
        SweepPlan(EnvironmentGrid.from_mapping(hidden), skip_invalid=True)


def test_the_visualizer_draws_the_new_traffic(tmp_path):
    result = run_here("schedule_visualizer_duel_channel.py", "--model", "llama3-8b", "--gpu", "h100-80gb",
                      "--pipeline-parallel", "2", "--data-parallel", "4", "--context-parallel", "2", "--zero", "3",
                      "--global-batch-size", "16", "--flash-attention", "--no-dropout", "--no-show",
                      "--output", "chart.png", "--trace", "trace.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "context 2, pipeline 2, data 4, zero 3" in result.stdout
    assert (tmp_path / "chart.png").stat().st_size > 10_000
    text = (tmp_path / "trace.json").read_text()
    assert "FG0" in text and "KV0" in text


def test_a_workload_sweep_with_zero(tmp_path):
    header, rows = sweep_csv(tmp_path, "zero", {"model": ["llama3-8b"], "gpu": ["h100-80gb"], "num_gpus": [2],
                                                "data_parallel": [4], "global_batch_size": [16],
                                                "zero": [0, 3], "flash_attention": [True]})
    assert {"zero", "gather_len"} <= set(header)
    by_zero = {row["zero"]: row for row in rows if row["policy"] == rows[0]["policy"]}
    assert float(by_zero["3"]["peak_memory_gb"]) < float(by_zero["0"]["peak_memory_gb"])
    assert float(by_zero["3"]["gather_len"]) > 0.0 and by_zero["0"]["gather_len"] == ""  # not read without zero


def test_the_report_names_the_gathers_and_the_exchange():
    workload = _tiny(context_parallel=2)
    params = _env(workload, 3)
    run = simulate(params, DEFAULT_POLICY)
    line = workload_report(workload, params, run.completion_time, [0.0, 0.0]).lines()[0]
    assert f", gather {seconds_text(max(params.gather_lengths()))} (fullest GPU; before each forward and backward)" \
        in line
    assert f", key-value exchange {seconds_text(params.cp_len)} a forward" in line
    plain = _env(_tiny(), 0)
    assert "gather" not in workload_report(_tiny(), plain, 1.0, [0.0, 0.0]).lines()[0]
