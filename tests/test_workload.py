"""The workload layer (docs/model.md section 11): formulas by hand, derived environments, reports, bad input."""

import csv

import pytest
from conftest import assert_one_line_error, run_here, run_script

from pipeline_sim import ParameterError, Policy, simulate
from pipeline_sim.config import ConfigError, EnvironmentGrid
from pipeline_sim.metrics import schedule_metrics
from pipeline_sim.workload import (
    MODEL_PRESETS,
    ModelShape,
    Workload,
    activation_bytes_per_layer,
    gpu_params,
    iteration_flops,
    layer_forward_flops,
    layer_params,
    logits_forward_flops,
    workload_environment,
    workload_report,
)

TINY = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, ffn_hidden=16, vocab=10, seq_len=4)


def test_flops_of_a_tiny_model_by_hand():
    # 4 s h^2 (1 + g/a + s/h) + 4 s h f = 4*4*64*(1 + 1/2 + 4/8) + 4*4*8*16 = 2048 + 2048
    assert layer_forward_flops(TINY, 4) == 4096
    gated = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, ffn_hidden=16, vocab=10, gated_mlp=True)
    assert layer_forward_flops(gated, 4) == 2048 + 4 * 4 * 8 * 24
    assert logits_forward_flops(TINY, 4) == 2 * 4 * 8 * 10
    # three global-batch sequences: 3 x 3 x (2 layers x 4096 + 640)
    assert iteration_flops(Workload(model=TINY), 3) == 9 * (2 * 4096 + 640)


@pytest.mark.parametrize("batch, seq_len", [(1, 2048), (64, 2048), (512, 4096)])
def test_flops_of_gpt3_equal_the_closed_form(batch, seq_len):
    shape = MODEL_PRESETS["gpt3-175b"]
    s, l, h, v = seq_len, shape.layers, shape.hidden, shape.vocab
    closed = 72 * batch * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert iteration_flops(Workload(model=shape, seq_len=seq_len), batch) == pytest.approx(closed, rel=1e-12)


def test_parameters_of_gpt3_are_175_billion():
    shape = MODEL_PRESETS["gpt3-175b"]
    total = shape.layers * layer_params(shape) + 2 * shape.vocab * shape.hidden
    assert 174e9 < total < 176e9


ACT = ModelShape(layers=2, hidden=8, heads=2, kv_heads=2, ffn_hidden=16, vocab=10, seq_len=4)


@pytest.mark.parametrize("recompute, tensor, sequence, expected", [
    ("none", 1, False, 64 * (34 + 5)),             # s b h (34 + 5 a s / h), s b h = 4 * 2 * 8 = 64, 5as/h = 5
    ("none", 2, False, 64 * (10 + 12 + 2.5)),      # s b h (10 + 24/t + 5 a s / (h t))
    ("none", 2, True, 64 * 39 / 2),                # divided by t with sequence parallelism
    ("selective", 2, True, 64 * 34 / 2),           # 34 s b h / t
    ("selective", 2, False, 64 * (10 + 12)),       # s b h (10 + 24/t): only the attention core is recomputed
    ("selective", 1, False, 64 * 34),
    ("full", 2, True, 64 * 2 / 2),                 # 2 s b h / t: the layer's input alone, split with the sequence
    ("full", 2, False, 64 * 2),                    # 2 s b h: every tensor rank keeps the whole input
])
def test_activation_bytes_per_layer_by_hand(recompute, tensor, sequence, expected):
    workload = Workload(model=ACT, micro_batch_size=2, tensor_parallel=tensor, sequence_parallel=sequence,
                        recompute=recompute)
    assert activation_bytes_per_layer(workload) == pytest.approx(expected)
    assert activation_bytes_per_layer(Workload(model=ACT, micro_batch_size=2, tensor_parallel=tensor,
                                               sequence_parallel=sequence, recompute=recompute, dtype_bytes=4)) \
        == pytest.approx(2 * expected)


DERIVE = ModelShape(layers=4, hidden=8, heads=2, kv_heads=2, ffn_hidden=32, vocab=16, seq_len=4)


def tiny_workload(**kwargs):
    # 1,000 FLOP/s peak at efficiency 0.5; 100 bytes/s links
    values = dict(model=DERIVE, gpu={"tflops": 1e-9, "memory_gb": 3.5e-5}, compute_efficiency=0.5, data_parallel=2,
                  micro_batch_size=2, global_batch_size=8, p2p_bandwidth=1e-7, dp_bandwidth=1e-7,
                  embedding_on_first=False, head_on_last=False)  # the even stages of section 11 before 6.6
    return Workload(**(values | kwargs))


def test_the_derived_environment_of_a_tiny_workload_field_by_field():
    params = workload_environment(tiny_workload(), num_gpus=2)
    # n = 8 / (2 x 2); one gradient sync per iteration
    assert (params.n, params.sync_freq, params.num_gpus, params.w_fraction) == (2, 2, 2, 0.5)
    # layer: 4*4*64*(1 + 1 + 4/8) + 4*4*8*32 = 2560 + 4096; logits 2*4*8*16 = 1024, spread over 2 GPUs
    stage_flops = (4 * 6656 + 1024) / 2
    assert params.fwd_len == pytest.approx(stage_flops * 2 / 500)            # micro-batch 2, 500 FLOP/s
    assert params.bwd_len == pytest.approx(2 * params.fwd_len)
    assert params.prop_len == pytest.approx(4 * 2 * 8 * 2 / 100)             # s b h bytes at 100 B/s
    # per GPU: 2 layers x (2*64*2 + 2*8*32 + 2*8) + one embedding 16*8; ring all-reduce over 2 GPUs
    held = 2 * 784 + 128
    assert gpu_params(tiny_workload(), 2) == [held, held]
    assert params.sync_base_len == pytest.approx(2 * (1 / 2) * held * 2 / 100)
    full = workload_environment(tiny_workload(recompute="full"), num_gpus=2)
    assert full.bwd_len == pytest.approx(3 * full.fwd_len)
    assert workload_environment(tiny_workload(data_parallel=1, global_batch_size=2), num_gpus=2).sync_base_len == 0


def test_embeddings_follow_the_schedules_placement():
    shape = MODEL_PRESETS["gpt3-175b"]
    layers = shape.layers / 4 * layer_params(shape)
    embedding = shape.vocab * shape.hidden
    assert gpu_params(Workload(model=shape), 4, "1f1b") == [layers + embedding, layers, layers, layers + embedding]
    assert gpu_params(Workload(model=shape), 4, "zb-v") == [layers + 2 * embedding, layers, layers, layers]


def test_the_report_of_one_iteration():
    workload = tiny_workload()
    params = workload_environment(workload, num_gpus=2)
    schedule = simulate(params, Policy())
    peaks = schedule_metrics(schedule).gpu_peak_activations
    report = workload_report(workload, params, schedule.completion_time, peaks)
    assert peaks == (2, 1)
    assert report.iteration_seconds == schedule.completion_time
    assert report.tokens_per_second == pytest.approx(8 * 4 / schedule.completion_time)
    total_gpus = 2 * 1 * 2
    assert report.mfu == pytest.approx(iteration_flops(workload, 8) / (schedule.completion_time * total_gpus * 1000))
    per_microbatch = 4 * 2 * 8 * (34 + 5 * 2 * 4 / 8) * 2       # two layers per GPU, no recompute
    static = (2 * 784 + 128) * 16
    assert report.memory_gb == pytest.approx(((static + 2 * per_microbatch) / 1e9, (static + per_microbatch) / 1e9))
    assert not report.memory_fits and report.gpu_memory_gb == 3.5e-5
    assert report.lines()[2].endswith("DOES NOT FIT")


def test_the_report_refuses_a_negative_time_or_a_peak_count_of_other_gpus():
    workload = tiny_workload()
    params = workload_environment(workload, num_gpus=2)
    with pytest.raises(ParameterError, match="completion_time = -1.0: must be a time in seconds"):
        workload_report(workload, params, -1.0, (2, 1))
    with pytest.raises(ParameterError, match=r"gpu_peak_activations = \(2,\): must give one peak per GPU, 2"):
        workload_report(workload, params, 1.0, (2,))
    for peaks in ((2, -1), (2, float("nan")), (2, "1")):
        with pytest.raises(ParameterError, match="gpu_peak_activations = .*: must be micro-batches of activations, "
                                                 "each finite and >= 0"):
            workload_report(workload, params, 1.0, peaks)


def test_the_report_lists_a_few_gpus_peaks_and_sums_up_many():
    from dataclasses import replace

    from pipeline_sim.workload.report import LISTED_GPUS, WorkloadReport

    report = WorkloadReport(1.0, 2.0, 0.1, 0.2, 10.0, 1000.0, 0.4, (55.0, 1234.56), 80.0)
    assert report.lines()[2] == "peak memory per GPU: 55.0 1,234.6 GB of 80 GB: DOES NOT FIT"
    many = replace(report, memory_gb=tuple(40.0 + g for g in range(LISTED_GPUS + 1))[::-1])
    assert many.lines()[2] == (f"peak memory per GPU: 40.0 to {40.0 + LISTED_GPUS:.1f} GB (the most on GPU 0) of 80 "
                               f"GB: fits")


def test_n_and_sync_freq_may_be_given_when_the_workload_does_not_set_them():
    workload = Workload(model=DERIVE, gpu={"tflops": 1e-9, "memory_gb": 1.0}, p2p_bandwidth=1e-7)
    params = workload_environment(workload, num_gpus=2, n=6, sync_freq=3)
    assert (params.n, params.sync_freq) == (6, 3)
    with pytest.raises(ParameterError, match="derived from global_batch_size"):
        workload_environment(tiny_workload(), num_gpus=2, n=6)
    with pytest.raises(ParameterError, match="fwd_len"):
        workload_environment(tiny_workload(), num_gpus=2, fwd_len=1.0)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"model": "gpt4"}, "model = 'gpt4': unknown preset; valid: gpt3-175b, llama2-7b, llama2-70b, llama3-8b"),
    ({"model": "gpt3-175b", "global_batch_size": 65, "data_parallel": 2}, "must be a multiple of"),
    ({"model": "gpt3-175b", "p2p_bandwidth": -1.0}, "p2p_bandwidth = -1.0: must be a finite number > 0"),
    ({"model": "gpt3-175b", "tensor_parallel": 5}, "tensor_parallel = 5: must divide heads = 96"),
    ({"model": {"layers": 2}}, "lacks hidden, heads, ffn_hidden, vocab"),
    ({"model": {"layers": 2, "hidden": 130, "heads": 4, "ffn_hidden": 256, "vocab": 1000}},
     "model.heads = 4: must divide hidden = 130"),
    ({"model": "llama3-8b", "gpu": "v100"}, "valid: a100-40gb, a100-80gb, h100-80gb, h200-141gb"),
    ({"model": "llama3-8b", "recompute": "some"}, "must be one of none, selective, full"),
])
def test_bad_workloads(kwargs, fragment):
    with pytest.raises(ParameterError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Workload(**kwargs)


@pytest.mark.parametrize("grid, fragment", [
    ({"model": "gpt4"}, "config key 'model': model = 'gpt4': unknown preset; valid: gpt3-175b"),
    ({"model": "gpt3-175b", "global_batch_size": 65, "data_parallel": 2},
     "global_batch_size = 65: must be a multiple of micro_batch_size x data_parallel = 2"),
    ({"model": "gpt3-175b", "dp_bandwidth": [50, -2]}, "config key 'dp_bandwidth': dp_bandwidth = -2.0"),
    ({"model": ["gpt3-175b", "llama2-7b"], "tensor_parallel": 3}, "tensor_parallel = 3: must divide heads = 32"),
    ({"tensor_parallel": 2}, "config key 'tensor_parallel': a workload key needs 'model'"),
    ({"model": "gpt3-175b", "bwd_len": 2}, "config key 'bwd_len': derived from the workload"),
    ({"model": "gpt3-175b", "n": 4, "global_batch_size": 8}, "give n or global_batch_size, not both"),
])
def test_bad_workload_configs_get_one_line(tmp_path, grid, fragment):
    import json

    config = tmp_path / "bad.json"
    config.write_text(json.dumps(grid))
    result = run_here("data_generator.py", "--config", str(config), "-o", str(tmp_path / "x.csv"), cwd=tmp_path)
    assert_one_line_error(result, fragment)


@pytest.mark.parametrize("args, fragment", [
    (["--model", "gpt4"], "--model: model = 'gpt4': unknown preset; valid: gpt3-175b"),
    (["--model", "gpt3-175b", "--tensor-parallel", "5"], "--tensor-parallel: tensor_parallel = 5: must divide"),
    (["--model", "gpt3-175b", "--global-batch-size", "65", "--data-parallel", "2"], "--global-batch-size"),
    (["--model", "gpt3-175b", "--p2p-bandwidth", "-1"], "--p2p-bandwidth: p2p_bandwidth = -1.0"),
    (["--model", "gpt3-175b", "--fwd-len", "2"], "--fwd-len: fwd_len = 2.0: is derived from the workload"),
    (["--tensor-parallel", "2"], "--tensor-parallel: tensor_parallel = 2: needs --model"),
    (["--model", "{\"layers\": 2"], "--model: model = '{\"layers\": 2': is not a JSON object"),
])
def test_bad_workload_flags_get_one_line(tmp_path, args, fragment):
    result = run_here("schedule_visualizer_single_channel.py", *args, "--no-show", cwd=tmp_path)
    assert_one_line_error(result, fragment)


def test_a_grid_without_model_keeps_its_columns():
    grid = EnvironmentGrid.from_mapping({"n": [4, 8]})
    assert not grid.has_workload and [w for _, w in grid.cases()] == [None, None]


def test_a_workload_grid_sweeps_workload_keys_and_derives_the_rest():
    grid = EnvironmentGrid.from_mapping({"model": ["gpt3-175b", "llama3-8b"], "tensor_parallel": 8, "num_gpus": 8,
                                         "global_batch_size": 64, "p2p_bandwidth": [12.5, 25]})
    cases = list(grid.cases())
    assert len(grid) == 4 and grid.varying() == ["model", "p2p_bandwidth"]
    assert [(w.shape.name, w.p2p_bandwidth) for _, w in cases] == [
        ("gpt3-175b", 12.5), ("gpt3-175b", 25.0), ("llama3-8b", 12.5), ("llama3-8b", 25.0)]
    for params, workload in cases:
        assert params == workload_environment(workload, num_gpus=8)
        assert params.n == 64 and params.sync_freq == 64
    assert cases[0][0].prop_len == pytest.approx(2 * cases[1][0].prop_len)
    with pytest.raises(ConfigError):
        EnvironmentGrid.from_mapping({"model": "gpt3-175b", "fwd_len": 1.0})


def test_a_workload_sweep_through_the_pipeline(tmp_path):
    import json

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({
        "model": {"layers": 8, "hidden": 256, "heads": 8, "ffn_hidden": 1024, "vocab": 1000, "seq_len": 512},
        "gpu": ["a100-40gb", {"tflops": 100, "memory_gb": 0.05}], "num_gpus": 4, "data_parallel": 2,
        "global_batch_size": 16, "p2p_bandwidth": 0.05, "dp_bandwidth": 0.05, "schedule": ["1f1b", "zb-h1"]}))
    result = run_script("run_full_pipeline.py", "-c", str(config), "--priority_step", "0.5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "s/iteration" in result.stdout and "tokens/s, MFU" in result.stdout and "DOES NOT FIT" in result.stdout
    (output,) = (tmp_path / "outputs" / "data").glob("tiny_*.csv")
    with open(output, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4 * 37
    for row in rows:
        workload = Workload(model=json.loads(config.read_text())["model"],
                            gpu="a100-40gb" if row["gpu"] == "a100-40gb" else {"tflops": 100, "memory_gb": 0.05},
                            data_parallel=2, global_batch_size=16, p2p_bandwidth=0.05, dp_bandwidth=0.05)
        params = workload_environment(workload, num_gpus=4, schedule=row["schedule"])
        assert float(row["fwd_len"]) == params.fwd_len and float(row["sync_base_len"]) == params.sync_base_len
        assert int(row["n"]) == 8 and int(row["sync_freq"]) == 8
        time = float(row["completion_time"])
        assert float(row["tokens_per_second"]) == pytest.approx(16 * 512 / time)
        assert row["memory_fits"] == str(float(row["peak_memory_gb"]) <= float(row["gpu_memory_gb"]))
    assert {row["memory_fits"] for row in rows} == {"True", "False"}
    folder = tmp_path / "outputs" / "heatmaps" / output.stem
    comparisons = sorted(folder.glob("compare_*.png"))
    assert len(comparisons) == 2 and len(list(folder.glob("*.png"))) == 6
    assert all(path.name.startswith("compare_layers8-hidden256") or path.name.startswith("layers8-hidden256")
               for path in folder.glob("*.png"))


def test_the_visualizer_reports_a_workload_in_seconds(tmp_path):
    result = run_here("schedule_visualizer_single_channel.py", "--model", "gpt3-175b", "--num-gpus", "8",
                        "--tensor-parallel", "8", "--global-batch-size", "16", "--recompute", "selective",
                        "--no-elementwise", "--no-optimizer-step", "--no-show", "--output", "g.png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "completion time" in lines[0] and " s (ideal" in lines[0]
    assert lines[1].strip() == "gpt3-175b on 64 x a100-80gb (tensor 8, pipeline 8, data 1), batch 16 x 2048 tokens, " \
                               "selective recomputation"
    # 73.6 ms of FLOPs per GPU's forward, and 12 layers x 2 all-reduces of s h = 2048 x 12288 values, 2 bytes,
    # 2 x 7/8 of them over 300 GB/s (one direction of the A100's 600 GB/s NVLink): 12 x 0.587 ms = 7.05 ms
    assert lines[2].strip().startswith("derived times: fwd 80.7 ms, bwd 154 ms, prop 126 us, sync 0 s")
    assert "MFU" in lines[3] and lines[4].strip().endswith("fits")
    from conftest import assert_png_drawn
    assert_png_drawn(tmp_path / "g.png", min_width=1000, min_height=500)


def test_uneven_stages_of_a_tiny_workload_by_hand():
    # a layer's forward: 6656 FLOPs x micro-batch 2 at 500 FLOP/s = 26.624 s; the logits 1024 x 2 / 500 = 4.096 s
    workload = tiny_workload(embedding_on_first=True, head_on_last=True)
    params = workload_environment(workload, num_gpus=2)
    stages = [2 * 26.624, 2 * 26.624 + 4.096]  # the embedding is a lookup: no FLOPs, and this GPU states no bandwidth
    assert params.fwd_len == pytest.approx(sum(stages) / 2)
    assert params.stage_weights == pytest.approx([stage / params.fwd_len for stage in stages])
    assert params.bwd_len == pytest.approx(2 * params.fwd_len)
    # the lookup reads and writes s b h = 64 values of 2 bytes at 100 B/s
    gpu = {"tflops": 1e-9, "memory_gb": 3.5e-5, "memory_bandwidth": 1e-7}
    params = workload_environment(tiny_workload(gpu=gpu, embedding_on_first=True, head_on_last=True),
                                  num_gpus=2)
    assert params.fwd_len * params.stage_weights[0] == pytest.approx(2 * 26.624 + 2.56)
    # layers given per stage: one on the first, three on the last (the logits spread: 2.048 each); parameters
    # follow them
    uneven = tiny_workload(layers_per_stage=[1, 3])
    params = workload_environment(uneven, num_gpus=2)
    assert [params.fwd_len * w for w in params.stage_weights] == pytest.approx([28.672, 3 * 26.624 + 2.048])
    assert gpu_params(uneven, 2) == [784 + 128, 3 * 784 + 128]
    # with embedding and head spread and even layers, every stage is equal: no weights, the model as before
    assert workload_environment(tiny_workload(), num_gpus=2).stage_weights == ()


def test_tensor_parallel_all_reduces_by_hand():
    # t = 2 halves the FLOPs per GPU: a layer 13.312 s, the logits 2.048 s. Per layer forward two all-reduces of
    # s b h = 64 values, 2 bytes, a ring moving 2 (t - 1)/t of them, at 100 B/s: 4 x 64 x 1/2 x 2 / 100 = 2.56 s
    workload = tiny_workload(tensor_parallel=2, tp_bandwidth=1e-7, embedding_on_first=True, head_on_last=True)
    params = workload_environment(workload, num_gpus=2)
    stages = [2 * (13.312 + 2.56) + 1.28, 2 * (13.312 + 2.56) + 2.048]  # the embedding: one all-reduce
    assert [params.fwd_len * w for w in params.stage_weights] == pytest.approx(stages)
    # a layer's backward: twice its FLOPs and the same all-reduces
    assert params.bwd_len / params.fwd_len == pytest.approx((2 * 13.312 + 2.56) / (13.312 + 2.56))
    # by default half the GPU's NVLink: one direction of it
    assert Workload(model=DERIVE, gpu="h100-80gb", tensor_parallel=2).tp_bandwidth == 450.0
    assert Workload(model=DERIVE, gpu="a100-80gb").tp_bandwidth == 300.0


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(layers_per_stage=[1, 2]), "must add up to the 4 layers"),
    (dict(layers_per_stage=[0, 4]), "layer counts >= 1"),
    (dict(layers_per_stage="even"), "must be balanced, auto or a list"),
    (dict(tensor_parallel=2, gpu={"tflops": 1, "memory_gb": 1}), "tp_bandwidth = None: is needed"),
    (dict(head_on_last="yes"), "head_on_last = 'yes': must be true or false"),
])
def test_bad_stage_layouts(kwargs, fragment):
    with pytest.raises(ParameterError, match=fragment.replace("(", r"\(")):
        Workload(**({"model": DERIVE} | kwargs))


def test_layers_per_stage_must_fit_the_stages():
    with pytest.raises(ParameterError, match="must give one count per stage: 4 here"):
        workload_environment(Workload(model=DERIVE, layers_per_stage=[1, 3], global_batch_size=4), num_gpus=2,
                             schedule="zb-v")
    # a list of counts is one value, a list of lists (or names) several
    grid = EnvironmentGrid.from_mapping({"model": "llama3-8b", "num_gpus": 2, "global_batch_size": 4,
                                         "layers_per_stage": [[15, 17], "balanced"], "head_on_last": [True, False]})
    weights = [params.stage_weights for params in grid]
    assert weights[0][0] < 1 < weights[0][1] and weights[1][0] < 1 < weights[1][1]
    assert weights[3] == pytest.approx((1, 1), abs=1e-3)  # the embedding alone: a lookup of s h values
    assert len(list(EnvironmentGrid.from_mapping({"model": "llama3-8b", "num_gpus": 2, "global_batch_size": 4,
                                                  "layers_per_stage": [15, 17]}))) == 1


#: 2 layers of hidden 128 and 64-token sequences: a forward of 0.23 us on an A100, below the abstract floor of 1e-6.
SMALL = {"layers": 2, "hidden": 128, "heads": 4, "ffn_hidden": 512, "vocab": 1000, "seq_len": 64}
LENGTHS = ("fwd_len", "bwd_len", "prop_len", "sync_base_len")


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_a_small_model_is_simulated_in_a_unit_of_its_own_to_the_bit(schedule):
    """docs/model.md section 9: the run in seconds is the run of the same lengths counted in its time unit, every
    time multiplied back exactly, so the engine's tolerances stay a billionth of the shortest work."""
    from dataclasses import replace

    from pipeline_sim.engine import simulate_figures
    from pipeline_sim.validate import validate_schedule

    workload = Workload(model=SMALL, global_batch_size=8, data_parallel=2, dp_bandwidth=400)
    params = workload_environment(workload, num_gpus=2, schedule=schedule)
    # a layer 4*64*128^2*(1 + 1 + 64/128) + 4*64*128*512 = 27,262,976 FLOPs, logits 2*64*128*1000, over 2 GPUs;
    # the embedding's lookup reads and writes 64 x 128 values of 2 bytes at the A100's 2,039 GB/s
    lookup = 2 * 64 * 128 * 2 / 2039e9
    assert params.fwd_len == pytest.approx(((2 * 27_262_976 + 16_384_000) / 156e12 + lookup) / 2, rel=1e-12)
    assert params.sync_base_len > 0
    unit = params.time_unit
    assert unit == 2.0 ** -23 and 1.0 <= params.fwd_len / unit < 2.0
    counted = replace(params, **{key: getattr(params, key) / unit for key in LENGTHS})
    assert counted.time_unit == 1.0
    policies = [Policy(), Policy(exclusive_tiers={"grad_prop": "a", "fwd_prop": "b"}),
                Policy(priorities={"fwd_prop": 0.0, "grad_prop": 1.0, "grad_sync": 0.5})]
    for policy in policies:
        run, same = simulate(params, policy), simulate(counted, policy)
        assert validate_schedule(run) == []
        assert run.completion_time == same.completion_time * unit
        assert [(t.ready, t.start, t.end, t.throttled_time, t.segments) for t in run.tasks] == [
            (t.ready * unit, t.start * unit, t.end * unit, t.throttled_time * unit,
             [(t0 * unit, t1 * unit, rate) for t0, t1, rate in t.segments]) for t in same.tasks]
        assert run.spans == tuple(span * unit for span in same.spans)
        assert run.peak_activations == same.peak_activations
    figures, counted_figures = simulate_figures(params, policies), simulate_figures(counted, policies)
    times = [0, 1, 3, 4, 5, 6]  # completion, throttled time, each GPU's busy time and span
    assert (figures[:, times] == counted_figures[:, times] * unit).all()
    assert (figures[:, [2, 7, 8]] == counted_figures[:, [2, 7, 8]]).all()
    # and the numbers are sane: no faster than free links, and the report follows from the completion time
    free = simulate(replace(params, prop_len=0.0, sync_base_len=0.0), Policy()).completion_time
    if schedule == "1f1b":
        first, last = params.stage_weights  # the last stage, with the logits, is the bottleneck of 4 micro-batches
        assert free == pytest.approx((first + 4 * last) * (params.fwd_len + params.bwd_len), rel=1e-12)
    report = workload_report(workload, params, figures[0, 0], tuple(figures[0, 7:]))
    assert free <= figures[0, 0] < 3 * free
    assert report.tokens_per_second == pytest.approx(8 * 64 / figures[0, 0])
    assert 0.1 < report.mfu < workload.compute_efficiency


def test_a_small_model_runs_from_the_visualizer_and_a_sweep(tmp_path):
    import json

    shown = run_here("schedule_visualizer_single_channel.py", "--model", json.dumps(SMALL), "--num-gpus", "2",
                       "--global-batch-size", "8", "--no-elementwise", "--no-optimizer-step", "--no-show", "--output",
                       "s.png", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    run = simulate(workload_environment(Workload(model=SMALL, global_batch_size=8), num_gpus=2), Policy())
    assert lines[0].startswith(f"1f1b: completion time {run.completion_time:g} s")
    assert lines[2].strip() == "derived times: fwd 0.235 us, bwd 0.471 us, prop 0.328 us, sync 0 s"
    config = tmp_path / "small.json"
    config.write_text(json.dumps({"model": SMALL, "num_gpus": 2, "global_batch_size": 8,
                                  "schedule": ["1f1b", "zb-h1"]}))
    swept = run_here("run_full_pipeline.py", "-c", str(config), "--priority_step", "0.5", cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr
    (output,) = (tmp_path / "outputs" / "data").glob("small_*.csv")
    with open(output, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["policy"] == "F0.5 G0.5 S0"]
    assert [row["schedule"] for row in rows] == ["1f1b", "zb-h1"]
    assert float(rows[0]["completion_time"]) == simulate(
        run.params, Policy(priorities={"fwd_prop": 0.5, "grad_prop": 0.5, "grad_sync": 0.0})).completion_time
    assert float(rows[1]["completion_time"]) < float(rows[0]["completion_time"])  # zb-h1 fills 1f1b's bubbles
    assert len(list((tmp_path / "outputs" / "heatmaps" / output.stem).glob("*.png"))) == 3
