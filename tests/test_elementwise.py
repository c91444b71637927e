"""Element-wise work and flash attention (docs/model.md section 11): the hand example's bytes and seconds, a derived
environment by hand, invariants over the presets, nothing changed without them, and the keys from a config, a
visualizer and the planner."""

from dataclasses import replace

import pytest
from conftest import assert_one_line_error, run_here, sweep_csv

from pipeline_sim.model import ParameterError
from pipeline_sim.workload import (
    MODEL_PRESETS,
    ModelShape,
    Workload,
    activation_bytes_per_layer,
    derived_parameters,
    elementwise_forward,
    stage_costs,
)

# docs/model.md section 11's tiny model, s = 4, on a GPU of 1,000 FLOP/s and 100 bytes/s
TINY = ModelShape(layers=4, hidden=8, heads=2, ffn_hidden=32, vocab=16, seq_len=4)
GPU = {"tflops": 1e-9, "memory_gb": 1.0, "memory_bandwidth": 1e-7}


def tiny(**kwargs):
    return Workload(**({"model": TINY, "gpu": GPU, "compute_efficiency": 1.0, "elementwise": True} | kwargs))


def test_the_hand_example():
    # H = s b h = 32, A = a s^2 b / t = 32, F = s b f / t = 128: (10 H + 4 A + 2 F) x 2 + 2 H + A = 1504 bytes
    # a layer, of which the scores' 4 A x 2 + A = 288; the loss (2 + 16) x s b V / t = 1152 bytes
    assert elementwise_forward(tiny()) == pytest.approx((15.04, 2.88, 11.52))
    # flash attention: no scores, (10 H + 2 F) x 2 + 2 H = 1216 bytes
    assert elementwise_forward(tiny(flash_attention=True)) == pytest.approx((12.16, 0.0, 11.52))
    # no dropout: no masks, the softmax alone on the scores, (10 H + 2 A + 2 F) x 2 = 1280 bytes, 128 of them scores
    assert elementwise_forward(tiny(dropout=False)) == pytest.approx((12.8, 1.28, 11.52))
    # a gated MLP reads gate and up: 3 F
    gated = replace(TINY, gated_mlp=True, name="")
    assert elementwise_forward(tiny(model=gated)).layer == pytest.approx(15.04 + 128 * 2 / 100)
    # sequence parallelism puts norms and residual adds on s b h / t (t = 2: H = 16, A = 16, F = 64)
    split = tiny(gpu=GPU | {"nvlink_bandwidth": 1e-6}, tensor_parallel=2, sequence_parallel=True)
    assert elementwise_forward(split).layer == pytest.approx(((160 + 64 + 128) * 2 + 32 + 16) / 100)
    assert elementwise_forward(tiny(elementwise=False)) == (0.0, 0.0, 0.0)


def test_a_derived_environment_by_hand():
    # a layer's matrix products 6,656 FLOPs (6.656 s), the logits 1,024 (1.024 s), the embedding's lookup 2 x 32 x 2
    # bytes (1.28 s); stages of 2 and 2 layers: 2 (6.656 + 15.04) + 1.28 = 44.672 s and 2 x 21.696 + 1.024 + 11.52
    # = 55.936 s
    layer, e, scores = 6.656, 15.04, 2.88
    params = derived_parameters(tiny(global_batch_size=4), num_gpus=2)
    fwd = (44.672 + 55.936) / 2
    assert params["fwd_len"] == pytest.approx(fwd)
    assert params["stage_weights"] == pytest.approx((44.672 / fwd, 55.936 / fwd))
    # backward: (2 layer + 1.5 e) / (layer + e); full recompute (3 layer + 2.5 e) / (layer + e); selective adds the
    # scores' element-wise work again
    assert params["bwd_len"] == pytest.approx(fwd * (2 * layer + 1.5 * e) / (layer + e))
    full = derived_parameters(tiny(global_batch_size=4, recompute="full"), num_gpus=2)
    assert full["bwd_len"] == pytest.approx(fwd * (3 * layer + 2.5 * e) / (layer + e))
    selective = derived_parameters(tiny(global_batch_size=4, recompute="selective"), num_gpus=2)
    assert selective["bwd_len"] == pytest.approx(fwd * (2 * layer + 1.5 * e + scores) / (layer + e))
    # per-stage recompute weighs the element-wise backward too: (2.5 layer + 2 e) / (2 layer + 1.5 e) at c = 0.5;
    # over selective, the half not fully recomputed keeps its scores' share: + 0.5 x scores over + scores
    mixed = derived_parameters(tiny(global_batch_size=4, recompute_per_stage=(0.0, 0.5)), num_gpus=2)
    assert mixed["bwd_weights"] == pytest.approx((1.0, (2.5 * layer + 2.0 * e) / (2 * layer + 1.5 * e)))
    mixed = derived_parameters(tiny(global_batch_size=4, recompute="selective", recompute_per_stage=(0.0, 0.5)),
                               num_gpus=2)
    assert mixed["bwd_weights"] == pytest.approx(
        (1.0, (2.5 * layer + 2.0 * e + 0.5 * scores) / (2 * layer + 1.5 * e + scores)))
    # auto's layer cost and the last stage's extra include them
    cost, _, last = stage_costs(tiny())
    assert (cost, last) == pytest.approx((layer + e, 1.024 + 11.52))


@pytest.mark.parametrize("model", sorted(MODEL_PRESETS))
@pytest.mark.parametrize("t, p", [(1, 1), (2, 4), (8, 8)])
def test_each_layer_and_the_loss_add_their_seconds(model, t, p):
    """Turning the work on adds a GPU's mean share of it to fwd_len exactly, lengthens the backward by 1.5 times as
    much (2.5 under full recompute) and changes nothing else."""
    shape = MODEL_PRESETS[model]
    if shape.layers < p or shape.kv_heads % t:
        pytest.skip("no such layout")
    for recompute in ("none", "full"):
        base = Workload(model=model, gpu="h100-80gb", tensor_parallel=t, recompute=recompute)
        off = derived_parameters(base, num_gpus=p, n=8)
        on = derived_parameters(replace(base, elementwise=True), num_gpus=p, n=8)
        work = elementwise_forward(replace(base, elementwise=True))
        added = (shape.layers * work.layer + work.loss) / p
        assert on["fwd_len"] - off["fwd_len"] == pytest.approx(added, rel=1e-9)
        ratio = 2.5 if recompute == "full" else 1.5
        assert on["bwd_len"] - off["bwd_len"] == pytest.approx(ratio * added, rel=0.02)  # the head: a layer's ratio
        assert {k: v for k, v in on.items() if k not in ("fwd_len", "bwd_len", "stage_weights")} == \
            {k: v for k, v in off.items() if k not in ("fwd_len", "bwd_len", "stage_weights")}


def test_flash_attention_keeps_no_scores():
    for sequence_parallel in (False, True):
        w = Workload(model="gpt3-175b", tensor_parallel=8, sequence_parallel=sequence_parallel)
        assert activation_bytes_per_layer(replace(w, flash_attention=True)) == \
            activation_bytes_per_layer(replace(w, recompute="selective")) < activation_bytes_per_layer(w)
    full = Workload(model="gpt3-175b", recompute="full")
    assert activation_bytes_per_layer(replace(full, flash_attention=True)) == activation_bytes_per_layer(full)


def test_without_dropout_no_masks_are_kept():
    # s = 2048, h = 4096, a = 32, t = 1, per value of s b h: 34 + 5 a s / h = 114 bytes with dropout, 32 + 2 a s / h
    # = 64 without (docs/model.md section 11)
    shape = ModelShape(layers=2, hidden=4096, heads=32, ffn_hidden=16384, vocab=1000, seq_len=2048)
    sbh = 2048 * 4096
    assert activation_bytes_per_layer(Workload(model=shape)) == 114 * sbh
    assert activation_bytes_per_layer(Workload(model=shape, dropout=False)) == 64 * sbh
    assert activation_bytes_per_layer(Workload(model=shape, dropout=False, recompute="selective")) == 32 * sbh
    split = dict(model=shape, tensor_parallel=4, gpu="h100-80gb")
    assert activation_bytes_per_layer(Workload(**split, sequence_parallel=False, dropout=False)) == \
        pytest.approx(sbh * (8 + 24 / 4 + 2 * 32 * 2048 / (4096 * 4)))
    assert activation_bytes_per_layer(Workload(**split, dropout=False)) == pytest.approx(sbh * 64 / 4)
    assert activation_bytes_per_layer(Workload(model=shape, dropout=False, recompute="full")) == 2 * sbh


def test_bad_values_are_refused():
    with pytest.raises(ParameterError, match="elementwise = True: needs the gpu's memory_bandwidth"):
        tiny(gpu={"tflops": 1.0, "memory_gb": 1.0})
    for key in ("elementwise", "flash_attention"):
        with pytest.raises(ParameterError, match=f"{key} = 'yes': must be true or false"):
            tiny(**{key: "yes"})


def test_a_sweep_writes_the_columns_only_when_given(tmp_path):
    base = {"model": "llama3-8b", "gpu": "h100-80gb", "num_gpus": 2, "global_batch_size": 8, "seq_len": 2048,
            "schedule": "1f1b"}
    headers, rows = {}, {}
    for name, extra in (("plain", {}), ("ew", {"elementwise": [False, True], "flash_attention": [True],
                                               "dropout": [False]})):
        headers[name], rows[name] = sweep_csv(tmp_path, name, base | extra)
    assert not {"elementwise", "flash_attention", "dropout"} & set(headers["plain"])
    assert {"elementwise", "flash_attention", "dropout"} <= set(headers["ew"])
    plain = {row["policy"]: float(row["completion_time"]) for row in rows["plain"]}
    off = {row["policy"]: float(row["completion_time"]) for row in rows["ew"] if row["elementwise"] == "False"}
    on = {row["policy"]: float(row["completion_time"]) for row in rows["ew"] if row["elementwise"] == "True"}
    assert off == plain  # flash attention and dropout change memory, not time, without element-wise work
    assert all(on[policy] > plain[policy] for policy in plain)
    assert all(float(row["peak_memory_gb"]) < float(rows["plain"][0]["peak_memory_gb"]) for row in rows["ew"])
    result = run_here("plot_heatmap.py", str(tmp_path / "ew.csv"), "-o", str(tmp_path / "figures"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    names = [path.name for path in (tmp_path / "figures").iterdir()]
    assert any("_ew" in name and "flash_nodrop" in name for name in names), names


def test_the_visualizer_reports_it(tmp_path):
    args = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "2", "--global-batch-size", "8", "--no-show"]
    times = {}
    for extra in (["--no-elementwise"], ["--elementwise"]):
        result = run_here("schedule_visualizer_single_channel.py", *args, *extra, "--output",
                          str(tmp_path / f"g{extra[0]}.png"), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        line = next(line for line in result.stdout.splitlines() if line.strip().startswith("iteration "))
        times[extra[0]] = line
        assert (tmp_path / f"g{extra[0]}.png").stat().st_size > 0
    assert times["--no-elementwise"] != times["--elementwise"]
    result = run_here("schedule_visualizer_single_channel.py", *args, "--gpu", '{"tflops": 100, "memory_gb": 80}',
                      "--elementwise", cwd=tmp_path)
    assert_one_line_error(result, "--elementwise: elementwise = True: needs the gpu's memory_bandwidth (GB/s)")
    result = run_here("schedule_visualizer_single_channel.py", *args, "--gpu",
                      '{"tflops": 100, "memory_gb": 80, "memory_bandwidth": 1e-30}', "--elementwise", cwd=tmp_path)
    assert_one_line_error(result, "--model: model = 'llama3-8b': gives fwd_len = ",
                          "(and the gpu's memory_bandwidth, for elementwise), outside")


def test_the_planner_takes_them(tmp_path):
    from conftest import run_script

    small = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--gpus", "4", "--global-batch-size", "16", "--seq-len",
             "2048", "--workers", "1"]
    result = run_script("plan.py", *small, "--elementwise", "--flash-attention", "--no-dropout", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("llama3-8b on 4 x h100-80gb, batch 16 x 2048 tokens, "
                                                    "efficiency 0.5, optimizer step, element-wise work, flash "
                                                    "attention, no dropout: ")
    folder = tmp_path / "outputs" / "plan"
    assert {path.name for path in folder.iterdir()} == {
        f"plan_llama3-8b_4xh100-80gb_gbs16_s2048_eff0.5_opt_ew_flash_nodrop.{ext}" for ext in ("csv", "png")}
