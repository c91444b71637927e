"""Per-stage gradient syncs and backwards (docs/model.md sections 6.6 and 11): ``sync_weights``, ``bwd_weights`` and a
workload's ``recompute_per_stage``, by hand; bad input in one line; nothing changes without them."""


import pytest
from conftest import assert_one_line_error, run_here, sweep_csv

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.config import ConfigError, EnvironmentGrid
from pipeline_sim.model import EnvParams, ParameterError, TaskKind
from pipeline_sim.results import environments, load_results, workload_of
from pipeline_sim.workload import (
    ModelShape,
    Workload,
    activation_bytes_per_layer,
    gpu_memory_gb,
    stage_params,
    workload_environment,
)

DERIVE = ModelShape(layers=4, hidden=8, heads=2, kv_heads=2, ffn_hidden=32, vocab=16, seq_len=4)


def tiny_workload(**kwargs):
    # 1,000 FLOP/s peak at efficiency 0.5; 100 bytes/s links (as in test_workload.py)
    values = dict(model=DERIVE, gpu={"tflops": 1e-9, "memory_gb": 3.5e-5}, compute_efficiency=0.5, data_parallel=2,
                  micro_batch_size=2, global_batch_size=8, p2p_bandwidth=1e-7, dp_bandwidth=1e-7,
                  embedding_on_first=False, head_on_last=False)
    return Workload(**(values | kwargs))


# the worked example of section 6.6: 1F1B, 2 GPUs, 2 micro-batches, one sync of 2 after the last backward, free
# compute contention
EXAMPLE = dict(schedule="1f1b", num_gpus=2, n=2, sync_freq=2, fwd_len=1, bwd_len=2, prop_len=0, sync_base_len=2,
               fwd_impact=0, bwd_impact=0)


def spans(schedule, kind):
    return {(t.gpu, t.stage, t.index): (t.start, t.end) for t in schedule.tasks if t.kind == kind}


def test_uneven_sync_weights_by_hand():
    equal = calculate_full_pipeline_schedule(**EXAMPLE)
    assert equal.completion_time == 11.0  # GPU 0's sync of 2 runs [9, 11]
    uneven = calculate_full_pipeline_schedule(**EXAMPLE, sync_weights=[1.5, 0.5])
    assert spans(uneven, TaskKind.GRAD_SYNC) == {(0, 0, 0): (9.0, 12.0), (1, 1, 0): (7.0, 8.0)}
    assert spans(uneven, TaskKind.BACKWARD) == {(0, 0, 0): (4.0, 6.0), (0, 0, 1): (7.0, 9.0),
                                                (1, 1, 0): (2.0, 4.0), (1, 1, 1): (5.0, 7.0)}
    assert uneven.completion_time == 12.0


def test_a_backward_weighted_alone_by_hand():
    schedule = calculate_full_pipeline_schedule(**EXAMPLE, bwd_weights=[1, 1.5])
    assert spans(schedule, TaskKind.FORWARD) == {(0, 0, 0): (0.0, 1.0), (0, 0, 1): (1.0, 2.0),
                                                 (1, 1, 0): (1.0, 2.0), (1, 1, 1): (5.0, 6.0)}
    assert spans(schedule, TaskKind.BACKWARD) == {(0, 0, 0): (5.0, 7.0), (0, 0, 1): (9.0, 11.0),
                                                  (1, 1, 0): (2.0, 5.0), (1, 1, 1): (6.0, 9.0)}
    assert spans(schedule, TaskKind.GRAD_SYNC) == {(0, 0, 0): (11.0, 13.0), (1, 1, 0): (9.0, 11.0)}
    assert schedule.completion_time == 13.0
    # a split backward splits the weighted one: stage 1's I and W are 1.5 each under zb-h1
    split = calculate_full_pipeline_schedule(**(EXAMPLE | {"schedule": "zb-h1"}), bwd_weights=[1, 1.5])
    assert {t.end - t.start for t in split.tasks if t.stage == 1 and t.kind in ("backward_input", "backward_weight")} \
        == {1.5}


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b", "zb-v"])
def test_weights_of_one_change_nothing(schedule):
    base = EXAMPLE | {"schedule": schedule, "n": 4, "prop_len": 0.5, "fwd_impact": 0.2, "bwd_impact": 0.2}
    stages = 2 * (1 if schedule == "1f1b" else 2)
    plain = calculate_full_pipeline_schedule(**base)
    ones = calculate_full_pipeline_schedule(**base, sync_weights=[1.0] * stages, bwd_weights=[1.0] * stages)
    assert [(t.start, t.end) for t in plain.tasks] == [(t.start, t.end) for t in ones.tasks]
    assert plain.completion_time == ones.completion_time


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(sync_weights=[1.0]), "sync_weights = (1.0,): must have one weight per stage: 2 for 1f1b on 2 GPUs"),
    (dict(sync_weights=[1.0, 0.0]), "sync_weights = [1.0, 0.0]: must be a list of finite numbers from 0.001"),
    (dict(bwd_weights=[1.0, 2.0, 3.0]), "bwd_weights = (1.0, 2.0, 3.0): must have one weight per stage"),
    (dict(bwd_weights=[1.0, float("inf")]), "bwd_weights = [1.0, inf]: must be a list of finite numbers"),
])
def test_bad_weights(kwargs, fragment):
    with pytest.raises(ParameterError) as error:
        EnvParams(num_gpus=2, **kwargs)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_an_uneven_workload_syncs_each_stage_by_hand():
    # a layer holds 2*64*2 + 2*8*32 + 2*8 = 784 parameters, an embedding 16*8 = 128; stages of 1 and 3 layers hold
    # 912 and 2480, mean 1696. A parameter costs 2 (d - 1)/d x 2 bytes / 100 B/s = 0.02 s.
    workload = tiny_workload(layers_per_stage=[1, 3])
    assert stage_params(workload, 2) == [912, 2480]
    params = workload_environment(workload, num_gpus=2)
    assert params.sync_weights == pytest.approx([912 / 1696, 2480 / 1696])
    assert params.sync_base_len == pytest.approx(0.02 * 1696)
    schedule = calculate_full_pipeline_schedule(**params.as_dict())
    lengths = {t.stage: t.length for t in schedule.tasks if t.kind == TaskKind.GRAD_SYNC}  # work, at full rate
    assert lengths == pytest.approx({0: 18.24, 1: 49.6})
    # interleaved: four stages of one layer, the embeddings on stages 0 and 3, mean (2 x 912 + 2 x 784) / 4 = 848;
    # sync_base_len is v = 2 mean stages
    interleaved = workload_environment(tiny_workload(), num_gpus=2, schedule="interleaved-1f1b")
    assert interleaved.sync_weights == pytest.approx([912 / 848, 784 / 848, 784 / 848, 912 / 848])
    assert interleaved.sync_base_len == pytest.approx(0.02 * 848 * 2)
    # even stages (embeddings at both ends of two stages of two layers) or no data parallelism: no weights
    assert workload_environment(tiny_workload(), num_gpus=2).sync_weights == ()
    single = workload_environment(tiny_workload(layers_per_stage=[1, 3], data_parallel=1, global_batch_size=4),
                                  num_gpus=2)
    assert single.sync_weights == () and single.sync_base_len == 0.0


def test_recompute_per_stage_by_hand():
    # t = 1: a layer's backward is twice its forward, 2.5 times with half its layers recomputed
    workload = tiny_workload(recompute_per_stage=[0, 0.5])
    params = workload_environment(workload, num_gpus=2)
    plain = workload_environment(tiny_workload(), num_gpus=2)
    assert params.bwd_weights == pytest.approx([1.0, 1.25])
    assert (params.fwd_len, params.bwd_len, params.stage_weights) == (plain.fwd_len, plain.bwd_len, ())
    schedule = calculate_full_pipeline_schedule(**params.as_dict())
    lengths = {t.stage: t.length for t in schedule.tasks if t.kind == TaskKind.BACKWARD}
    assert lengths == pytest.approx({0: plain.bwd_len, 1: 1.25 * plain.bwd_len})
    # with tensor parallelism the all-reduces are recomputed too: (2.5 layer + 1.5 tp) / (2 layer + tp)
    tp = workload_environment(tiny_workload(tensor_parallel=2, tp_bandwidth=1e-7, recompute_per_stage=[1, 0]),
                              num_gpus=2)
    assert tp.bwd_weights == pytest.approx([(3 * 13.312 + 2 * 2.56) / (2 * 13.312 + 2.56), 1.0])
    # memory: s b h = 64 values a layer, 39 bytes each without recompute (34 + 5 a s / h), 2 with full: stage 1
    # keeps 0.5 x 2 / 39 + 0.5 of its activations. One micro-batch of a GPU's 2 layers: 2 x 64 x 39 = 4992 bytes
    assert activation_bytes_per_layer(workload) == 64 * 39
    static = (2 * 784 + 128) * 16
    memory = gpu_memory_gb(workload, params, [2.0, 1.0])
    assert memory == pytest.approx(((static + 2 * 4992) / 1e9, (static + 4992 * (0.5 * 2 / 39 + 0.5)) / 1e9))
    assert gpu_memory_gb(tiny_workload(), plain, [2.0, 1.0]) == ((static + 2 * 4992) / 1e9, (static + 4992) / 1e9)
    # nothing recomputed: the model as before
    assert workload_environment(tiny_workload(recompute_per_stage=[0, 0]), num_gpus=2) == plain


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(recompute_per_stage=[0.5, 1.5]), "recompute_per_stage = [0.5, 1.5]: must be a list of shares from 0 to 1"),
    (dict(recompute_per_stage=[]), "recompute_per_stage = []: must be a list of shares"),
    (dict(recompute_per_stage="half"), "recompute_per_stage = 'half': must be a list of shares"),
    (dict(recompute_per_stage=[True, 0]), "recompute_per_stage = [True, 0]: must be a list of shares"),
    (dict(recompute_per_stage=[0, 1], recompute="full"), "recompute_per_stage = [0, 1]: needs recompute none or"),
])
def test_bad_recompute_per_stage(kwargs, fragment):
    with pytest.raises(ParameterError) as error:
        tiny_workload(**kwargs)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_recompute_per_stage_needs_one_share_per_stage():
    with pytest.raises(ParameterError, match=r"recompute_per_stage = \[0.0, 1.0\]: must give one share per stage: "
                                             r"4 here"):
        workload_environment(tiny_workload(recompute_per_stage=[0, 1]), num_gpus=2, schedule="interleaved-1f1b")
    with pytest.raises(ConfigError, match="config key 'recompute_per_stage': recompute_per_stage = 2.0: must be"):
        EnvironmentGrid.from_mapping({"model": "gpt3-175b", "recompute_per_stage": [[0, 1], 2.0]})


def test_bad_recompute_per_stage_flag_gets_one_line(tmp_path):
    result = run_here("schedule_visualizer_single_channel.py", "--model", "gpt3-175b", "--recompute-per-stage",
                      "0,2,0,0", "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "--recompute-per-stage: recompute_per_stage = (0.0, 2.0, 0.0, 0.0): must be")


def test_a_sweep_carries_recompute_per_stage_only_when_given(tmp_path):
    model = {"layers": 4, "hidden": 64, "heads": 2, "ffn_hidden": 128, "vocab": 100, "seq_len": 64}
    base = {"model": model, "num_gpus": 2, "data_parallel": 2, "global_batch_size": 8}
    grid = EnvironmentGrid.from_mapping(base | {"recompute_per_stage": [[0, 0.5], [1, 0]]})
    assert [w.recompute_per_stage for _, w in grid.cases()] == [(0.0, 0.5), (1.0, 0.0)]
    assert [p.bwd_weights[0] for p, _ in grid.cases()] == [1.0, 1.5]
    headers = {name: sweep_csv(tmp_path, name, base | extra)[0]
               for name, extra in (("plain", {}), ("shares", {"recompute_per_stage": [0, 0.5]}))}
    assert "recompute_per_stage" not in headers["plain"] and "sync_weights" not in headers["plain"]
    assert headers["shares"] == [*headers["plain"][:headers["plain"].index("tp_bandwidth") + 1],
                                 "recompute_per_stage", *headers["plain"][headers["plain"].index("tp_bandwidth") + 1:]]
    ((params, rows),) = list(environments(load_results(tmp_path / "shares.csv")))
    workload = workload_of(rows)
    assert workload is not None and workload.recompute_per_stage == (0.0, 0.5)
    derived = workload_environment(workload, num_gpus=2)  # the per-stage lists are derived, not columns
    assert (derived.fwd_len, derived.bwd_len, derived.sync_base_len) == (params.fwd_len, params.bwd_len,
                                                                         params.sync_base_len)
    assert derived.bwd_weights == next(iter(grid.cases()))[0].bwd_weights


def test_titles_and_file_names_say_the_shares_recomputed():
    from pipeline_sim.results import env_slug, env_title

    workload = tiny_workload(recompute_per_stage=[0, 0.5])
    params = workload_environment(workload, num_gpus=2)
    assert "_rps0-0.5_" in env_slug(params, workload) and "recomputed per stage 0,0.5" in env_title(params, workload)
    assert "rps" not in env_slug(*(lambda w: (workload_environment(w, num_gpus=2), w))(tiny_workload()))
