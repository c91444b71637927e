"""Mixtures of experts (docs/model.md section 16): the worked examples by hand, one MoE layer's bytes by hand, the
presets' published sizes, invariants over random environments of every schedule and dispatcher, the tools, and
nothing changed without experts."""

import random
from dataclasses import replace

import pytest
from conftest import assert_one_line_error, run_here, sweep_csv

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.engine import simulate
from pipeline_sim.model import DEFAULT_POLICY, EnvParams, ParameterError, Policy, TaskKind
from pipeline_sim.schedules import SCHEDULES
from pipeline_sim.validate import validate_schedule
from pipeline_sim.workload import MODEL_PRESETS, Workload, gpu_memory_gb, iteration_flops, workload_environment
from pipeline_sim.workload.flops import active_ffn, elementwise_forward, held_params, layer_flops
from pipeline_sim.workload.memory import static_memory

FREE = dict(fwd_impact=0, bwd_impact=0, sync_base_len=0)
K = TaskKind


def spans(schedule, kind):
    return {(t.gpu, t.index): (t.start, t.end) for t in schedule.tasks if t.kind == kind}


def test_an_all_to_all_after_each_task_by_hand():
    run = calculate_full_pipeline_schedule(num_gpus=2, n=1, fwd_len=1, bwd_len=2, prop_len=1, a2a_len=1, **FREE)
    assert spans(run, K.A2A) == {(0, 0): (1.0, 2.0), (1, 0): (4.0, 5.0)}
    assert spans(run, K.A2A_GRAD) == {(1, 0): (7.0, 8.0), (0, 0): (11.0, 12.0)}
    assert spans(run, K.FWD_PROP) == {(0, 0): (2.0, 3.0)} and spans(run, K.GRAD_PROP) == {(1, 0): (8.0, 9.0)}
    assert spans(run, K.BACKWARD) == {(1, 0): (5.0, 7.0), (0, 0): (9.0, 11.0)}
    assert run.completion_time == 12.0
    assert calculate_full_pipeline_schedule(num_gpus=2, n=1, fwd_len=1, bwd_len=2, prop_len=1,
                                            **FREE).completion_time == 8.0


def test_the_hold_and_the_port_by_hand():
    example = dict(num_gpus=2, n=2, fwd_len=1, bwd_len=2, prop_len=2, a2a_len=1, **FREE)
    run = calculate_full_pipeline_schedule(**example)
    assert spans(run, K.FORWARD) == {(0, 0): (0.0, 1.0), (0, 1): (2.0, 3.0), (1, 0): (5.0, 6.0), (1, 1): (10.0, 11.0)}
    assert spans(run, K.A2A)[0, 1] == (3.0, 5.0) and spans(run, K.FWD_PROP)[0, 0] == (2.0, 5.0)
    assert spans(run, K.GRAD_PROP)[1, 0] == (10.0, 13.0) and spans(run, K.A2A)[1, 1] == (11.0, 13.0)
    assert spans(run, K.BACKWARD) == {(1, 0): (7.0, 9.0), (1, 1): (13.0, 15.0), (0, 0): (13.0, 15.0),
                                      (0, 1): (18.0, 20.0)}
    assert run.completion_time == 21.0
    first = calculate_full_pipeline_schedule(**example, a2a_class="grad_sync",
                                             exclusive_tiers={"fwd_prop": "a", "grad_prop": "a"})
    assert spans(first, K.FWD_PROP)[0, 0] == (2.0, 4.0) and spans(first, K.A2A)[0, 1] == (4.0, 5.0)
    assert spans(first, K.GRAD_PROP)[1, 0] == (9.0, 11.0) and spans(first, K.A2A)[1, 1] == (11.0, 12.0)
    assert first.completion_time == 20.0


def test_an_overlapped_pair_hides_its_all_to_all():
    example = dict(schedule="dualpipe-v", num_gpus=2, n=4, fwd_len=1, bwd_len=2, prop_len=0, **FREE)
    run = calculate_full_pipeline_schedule(**example, a2a_len=1)
    pair = next(t for t in run.tasks if str(t.id) == "(0F3;3B1)")
    assert (pair.start, pair.end) == (6.5, 8.0)
    beside = [t for t in run.tasks if t.kind in (K.A2A, K.A2A_GRAD) and t.start == pair.start and t.gpu == 0]
    assert sorted(str(t.id) for t in beside) == ["0AA3", "3AG1"] and all(t.end == 7.5 for t in beside)
    assert run.completion_time == 18.5
    assert calculate_full_pipeline_schedule(**example).completion_time == 13.0
    assert calculate_full_pipeline_schedule(**example, a2a_len=1, dispatch="greedy").completion_time == 22.0


def test_expert_parallel_overlap_pairs_a_backward_with_the_next_forward():
    example = dict(num_gpus=2, n=4, fwd_len=1, bwd_len=2, prop_len=0, a2a_len=1, **FREE)
    assert calculate_full_pipeline_schedule(schedule="interleaved-1f1b", **example).completion_time == 22.5
    run = calculate_full_pipeline_schedule(schedule="interleaved-1f1b", ep_overlap=1, **example)
    assert run.completion_time == 17.5 and validate_schedule(run) == []
    one = calculate_full_pipeline_schedule(schedule="1f1b", ep_overlap=1, **example)
    assert [[str(one.tasks[i].id) for i in order] for order in one.orders] == [
        ["0F0", "0F1", "(0F2;0B0)", "(0F3;0B1)", "0B2", "0B3"], ["1F0", "(1F1;1B0)", "(1F2;1B1)", "(1F3;1B2)", "1B3"]]
    assert one.completion_time == calculate_full_pipeline_schedule(schedule="1f1b", **example).completion_time == 25
    # read only where it pairs: without an all-to-all, or in a schedule of its own pairs, it is the default
    assert EnvParams(ep_overlap=1) == EnvParams()
    assert EnvParams(schedule="zb-h1", a2a_len=1, ep_overlap=1).ep_overlap == 0
    with pytest.raises(ParameterError, match="dispatch"):
        EnvParams(a2a_len=1, ep_overlap=1, dispatch="greedy")


def test_one_moe_layer_by_hand():
    mixtral = MODEL_PRESETS["mixtral-8x7b"]
    w = Workload(model=mixtral, gpu="h100-80gb", data_parallel=8, expert_parallel=8, micro_batch_size=1, node_gpus=4,
                 seq_len=4096)
    env = workload_environment(w, num_gpus=4, n=8)
    copy = 4096 * 4096 * 2  # one copy of a GPU's tokens, bytes
    across, within = 2 * 2 * copy * 4 / 8, 2 * 2 * copy * 3 / 8  # dispatch and combine, top-2, 4 of 8 peers away
    assert (across, within) == (67_108_864, 50_331_648)
    assert env.a2a_len == pytest.approx(8 * max(across / 50e9, within / 450e9), rel=1e-12)
    assert env.a2a_len == pytest.approx(10.74e-3, abs=1e-5) and env.a2a_weights == ()
    stretched = workload_environment(replace(w, expert_imbalance=1.25), num_gpus=4, n=8)
    assert stretched.a2a_len == pytest.approx(1.25 * env.a2a_len, rel=1e-12)
    routed = 2 * 4096 * 2 * 3 * 4096 * 14336
    assert layer_flops(mixtral, 4096, 5, 1.25) - layer_flops(mixtral, 4096, 5) == pytest.approx(0.25 * routed)
    assert stretched.fwd_len > env.fwd_len
    # node-limited routing: at most route_nodes copies cross
    assert workload_environment(replace(w, route_nodes=1), num_gpus=4, n=8).a2a_len == pytest.approx(env.a2a_len / 2)
    # all eight in one node: NVLink alone, 117,440,512 bytes at 450 GB/s a layer
    one_node = workload_environment(replace(w, node_gpus=8), num_gpus=4, n=8)
    assert one_node.a2a_len == pytest.approx(8 * 117_440_512 / 450e9, rel=1e-12)
    # no expert parallelism: no all-to-all
    assert workload_environment(replace(w, expert_parallel=1), num_gpus=4, n=8).a2a_len == 0.0


def test_a_moe_layers_activation_runs_on_its_active_experts():
    """Element-wise work (section 16): Mixtral's two routed experts of 14,336 move twice what a dense layer of its
    ffn_hidden would, stretched by the imbalance as their FLOPs are; DeepSeek-V3's and Qwen3's active experts equal
    their ffn_hidden; a dense model's is its ffn_hidden."""
    mixtral = MODEL_PRESETS["mixtral-8x7b"]
    assert (active_ffn(mixtral), active_ffn(mixtral, 1.25)) == (2 * 14336, 2.5 * 14336)
    deepseek, qwen = MODEL_PRESETS["deepseek-v3"], MODEL_PRESETS["qwen3-235b-a22b"]
    assert (active_ffn(deepseek), active_ffn(qwen)) == (18432, 12288)
    assert active_ffn(deepseek, 1.25) == pytest.approx((3 * 18432 + 58 * (8 * 1.25 + 1) * 2048) / 61)
    assert active_ffn(MODEL_PRESETS["llama3-8b"], 1.25) == 14336
    w = Workload(model=mixtral, gpu="h100-80gb", seq_len=4096, elementwise=True, dropout=False)
    gated = 3 * 4096 * 2 * 14336 * 2  # gate, up and their product: 3 values of s x f a routed expert, 2 experts
    dense = Workload(model=replace(mixtral, experts=0, expert_ffn_hidden=0, top_k=0), gpu="h100-80gb", seq_len=4096,
                     elementwise=True, dropout=False)
    assert (elementwise_forward(w).layer - elementwise_forward(dense).layer) * 3.35e12 == pytest.approx(gated / 2)


@pytest.mark.parametrize("name, total, active", [("mixtral-8x7b", 46.7, 12.9), ("deepseek-v3", 671.0, 37.6),
                                                 ("qwen3-235b-a22b", 235.1, 22.2)])
def test_presets_have_their_published_sizes(name, total, active):
    shape = MODEL_PRESETS[name]
    embeddings = 2 * shape.vocab * shape.hidden
    held = sum(sum(held_params(shape, 1, k)) for k in range(shape.layers)) + embeddings
    on = sum(held_params(shape, shape.experts, k)[0] + (shape.top_k * 3 * shape.hidden * shape.expert_ffn_hidden
                                                         if shape.is_moe(k) else 0) for k in range(shape.layers))
    assert held / 1e9 == pytest.approx(total, abs=0.1) and (on + embeddings) / 1e9 == pytest.approx(active, abs=0.1)


def test_deepseek_v3_dense_stages_have_no_all_to_all():
    w = Workload(model="deepseek-v3", gpu="h100-80gb", data_parallel=128, expert_parallel=64, global_batch_size=1536)
    env = workload_environment(w, num_gpus=16, zero=1)
    assert env.a2a_weights[0] == 0.0 and sum(env.a2a_weights) == pytest.approx(16)  # layers 0-2 are dense
    run = simulate(env, DEFAULT_POLICY)
    assert {t.end - t.start for t in run.tasks if t.kind == K.A2A and t.stage == 0} == {0.0}
    assert validate_schedule(run) == []
    # the experts are held by 64 GPUs: a GPU holds far less than the model over 16 stages
    memory = gpu_memory_gb(w, env, [1.0] * 16)
    assert max(memory) < 671e9 * 16 / 16 / 1e9 / 4


def test_a_task_of_no_work_holds_its_gpu_with_the_all_to_all_its_end_issues():
    # a forward of no work ends the instant it starts; the dispatch it issues holds the GPU all the same, and every
    # later hold still counts (an uncounted first hold once released them all)
    example = EnvParams(num_gpus=1, n=3, fwd_len=1, bwd_len=2, prop_len=0, a2a_len=1, **FREE)
    lengths = [0.0 if (t.kind, t.index) == (K.FORWARD, 0) else t.length for t in simulate(example, Policy()).tasks]
    for dispatch in ("static", "greedy"):
        run = simulate(replace(example, dispatch=dispatch), Policy(), lengths=lengths)
        assert spans(run, K.A2A) == {(0, 0): (0.0, 1.0), (0, 1): (5.0, 6.0), (0, 2): (10.0, 11.0)}
        assert spans(run, K.BACKWARD) == {(0, 0): (1.0, 3.0), (0, 1): (6.0, 8.0), (0, 2): (11.0, 13.0)}
        assert spans(run, K.FORWARD)[(0, 1)] == (4.0, 5.0) and run.completion_time == 14.0
    # the hold starts with the task's end, before what its start issued is settled: a gather of no work issued by F0
    # makes F1 ready at once, which still waits for F0's dispatch
    gathered = EnvParams(num_gpus=2, n=4, fwd_len=1, bwd_len=2, prop_len=0, a2a_len=1, zero=3, gather_len=1, **FREE)
    lengths = [0.0 if (t.stage, t.kind, t.index) in ((0, K.FORWARD, 0), (0, K.FWD_GATHER, 1)) else t.length
               for t in simulate(gathered, Policy()).tasks]
    for dispatch in ("static", "greedy"):
        run = simulate(replace(gathered, dispatch=dispatch), Policy(), lengths=lengths)
        assert spans(run, K.FORWARD)[(0, 1)][0] == 3.0 and run.completion_time == 27.0
    # noise drawn from a normal distribution takes some compute to no work at all
    noisy = replace(example, compute_jitter=1.0, jitter_dist="normal", seed=1)
    assert min(t.length for t in simulate(noisy, Policy()).tasks if t.kind == K.BACKWARD) == 0.0
    for seed in range(1, 40):
        for dispatch in ("static", "greedy", "critical-path"):
            run = simulate(replace(noisy, seed=seed, num_gpus=2, n=4, dispatch=dispatch), Policy())
            assert validate_schedule(run) == [], (seed, dispatch)


def test_memory_and_syncs_split_the_experts():
    w = Workload(model="mixtral-8x7b", gpu="h100-80gb", data_parallel=8, micro_batch_size=1, global_batch_size=64)
    alone, split = (workload_environment(replace(w, expert_parallel=e), num_gpus=4, zero=1) for e in (1, 8))
    assert split.sync_base_len < alone.sync_base_len / 4  # each GPU syncs an eighth of the experts
    held = [gpu_memory_gb(replace(w, expert_parallel=e), env, [0.0] * 4)[0] for e, env in ((1, alone), (8, split))]
    assert held[1] < held[0] / 2  # experts split 8 ways, where zero 1 over 8 GPUs shards their optimizer state alone
    assert iteration_flops(w, 64) == iteration_flops(replace(w, expert_parallel=8), 64)  # active FLOPs only


@pytest.mark.parametrize("t, d, e, zero, expected", [
    (1, 128, 64, 1, 4 + 12 / 2), (2, 64, 64, 1, 4 + 12 / 2), (4, 32, 32, 1, 4 + 12 / 4), (8, 16, 16, 1, 4 + 12 / 8),
    (2, 64, 64, 3, 16 / 2), (2, 8, 4, 0, 16.0)])
def test_zero_shards_an_expert_over_the_gpus_holding_it(t, d, e, zero, expected):
    # an expert is held by d x t / e GPUs, not split over tensor ranks: zero shards it over those, as they sync it
    w = Workload(model="deepseek-v3", tensor_parallel=t, data_parallel=d, expert_parallel=e)
    assert w.expert_shards == d * t // e
    assert static_memory(w, zero, 1 if zero == 3 else 8, expert=True)[0] == expected
    assert static_memory(w, zero, 8)[0] == (16.0 if not zero else 4 + 12 / d if zero == 1 else 16 / d)


def _random_environment(rng: random.Random, seed: int) -> EnvParams | None:
    schedule = rng.choice(list(SCHEDULES))
    try:
        params = EnvParams(schedule=schedule, num_gpus=rng.randint(1, 4), n=rng.randint(1, 8),
                           sync_freq=rng.randint(1, 3), fwd_len=rng.choice([0.5, 1, 2]), bwd_len=rng.choice([1, 2]),
                           prop_len=rng.choice([0, 0.5, 1]), sync_base_len=rng.choice([0, 1]),
                           optimizer_len=rng.choice([0, 1]), cp_len=rng.choice([0, 0, 0.3]),
                           a2a_len=rng.choice([0.2, 1, 3]), a2a_class=rng.choice(["pipeline", "grad_sync"]),
                           fb_overlap=rng.choice([0, 0.3]), ep_overlap=rng.choice([0, 1]),
                           dispatch=rng.choice(["static", "static", "greedy", "critical-path", "zb-adaptive"]),
                           compute_jitter=rng.choice([0, 0.2]), comm_jitter=rng.choice([0, 0.2]),
                           ingress_capacity=rng.choice([0.5, 1.0]), seed=seed)
    except ParameterError:  # a schedule's requirement on n or the GPUs, or pairs under a dispatcher
        return None
    stages = params.num_gpus * params.v
    return replace(params, a2a_weights=tuple(rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(stages))) \
        if rng.random() < 0.3 else params


def test_invariants_over_random_environments():
    rng = random.Random(36)
    checked = 0
    while checked < 250:
        params = _random_environment(rng, checked)
        if params is None:
            continue
        checked += 1
        policy = Policy(priorities={"fwd_prop": rng.random(), "grad_prop": rng.random(), "grad_sync": rng.random()})
        run = simulate(params, policy, sample=checked % 3)
        assert validate_schedule(run) == [], params
        assert run.lower_bound <= run.completion_time * (1 + 1e-9), params
        without = simulate(replace(params, a2a_len=0.0), policy, sample=checked % 3)
        pairs = sum(t.kind == K.OVERLAP_F_B for t in run.tasks) - sum(t.kind == K.OVERLAP_F_B for t in without.tasks)
        assert len(run.tasks) == len(without.tasks) + 2 * params.n * params.num_gpus * params.v - pairs
        assert pairs == 0 or params.ep_overlap


def test_defaults_change_nothing():
    base = EnvParams(num_gpus=3, n=6, schedule="zb-h1", compute_jitter=0.1, comm_jitter=0.1, seed=3)
    assert replace(base, a2a_class="grad_sync", a2a_weights=(1.0,) * 3) == base  # read only with an all-to-all
    # and the summary of a run says so as the CSV's empty cell does
    from pipeline_sim.cli.full import _value

    assert _value(base, None, "a2a_class") == "-"
    assert _value(replace(base, a2a_len=0.5, a2a_class="grad_sync"), None, "a2a_class") == "grad_sync"
    with pytest.raises(ParameterError, match="a2a_class"):
        EnvParams(a2a_class="nowhere")


def test_bad_expert_keys_get_one_line(tmp_path):
    result = run_here("schedule_visualizer_single_channel.py", "--model", "mixtral-8x7b", "--data-parallel", "4",
                      "--expert-parallel", "8", "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "data_parallel", "expert_parallel = 8", "multiple")
    result = run_here("schedule_visualizer_single_channel.py", "--model", "llama3-8b", "--data-parallel", "4",
                      "--expert-parallel", "2", "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "--expert-parallel: expert_parallel = 2: llama3-8b has no experts to split")
    result = run_here("schedule_visualizer_single_channel.py", "--model", "mixtral-8x7b", "--data-parallel", "8",
                      "--expert-parallel", "3", "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "--expert-parallel: expert_parallel = 3: must divide the 8 experts of mixtral-8x7b")
    # a pipeline of more stages than the model has layers is the GPUs' count, not the partition's
    result = run_here("schedule_visualizer_single_channel.py", "--model", "llama3-8b", "--num-gpus", "64",
                      "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "--num-gpus/--pipeline-parallel: num_gpus = 64: 64 stages cannot each take one of "
                                  "the 32 layers of llama3-8b")


def test_the_visualizer_draws_the_all_to_all(tmp_path):
    result = run_here("schedule_visualizer_duel_channel.py", "--model", "mixtral-8x7b", "--gpu", "h100-80gb",
                      "--pipeline-parallel", "2", "--data-parallel", "8", "--expert-parallel", "8",
                      "--global-batch-size", "32", "--no-show", "--output", "chart.png", "--trace", "trace.json",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "expert 8, pipeline 2, data 8" in result.stdout and "all-to-all" in result.stdout
    assert (tmp_path / "chart.png").stat().st_size > 10_000
    text = (tmp_path / "trace.json").read_text()
    assert "AA0" in text and "AG0" in text


def test_a_sweep_over_the_all_to_all_class(tmp_path):
    header, rows = sweep_csv(tmp_path, "classes", {"n": [2], "num_gpus": [2], "prop_len": [2], "sync_base_len": [0],
                                                   "a2a_len": [0, 1], "a2a_class": ["pipeline", "grad_sync"]})
    assert {"a2a_len", "a2a_class"} <= set(header)
    by = {(row["a2a_len"], row["a2a_class"], row["policy"]): float(row["completion_time"]) for row in rows}
    policies = {row["policy"] for row in rows}
    assert {key[1] for key in by if key[0] == "0.0"} == {""}  # not read without an all-to-all: its cell is empty
    assert sum(row["a2a_len"] == "0.0" for row in rows) == len(policies)  # and that environment is swept once
    # example 22's port: the class decides which waits where pipeline messages are exclusive
    assert any(by["1.0", "pipeline", p] > by["1.0", "grad_sync", p] for p in policies)
    assert all(by["1.0", c, p] > by["0.0", "", p] for c in ("pipeline", "grad_sync") for p in policies)


def test_a_workload_sweep_with_experts(tmp_path):
    header, rows = sweep_csv(tmp_path, "moe", {"model": ["mixtral-8x7b"], "gpu": ["h100-80gb"], "num_gpus": [2],
                                               "data_parallel": [8], "global_batch_size": [32], "seq_len": [4096],
                                               "expert_parallel": [1, 8]})
    assert {"a2a_len", "expert_parallel"} <= set(header)
    lengths = {row["expert_parallel"]: float(row["a2a_len"]) for row in rows}
    assert lengths["1"] == 0.0 and lengths["8"] == pytest.approx(16 * 117_440_512 / 450e9)  # 16 layers, in a node


def test_the_planner_searches_expert_parallelism(tmp_path):
    from conftest import run_script
    result = run_script("plan.py", "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--gpus", "32",
                        "--global-batch-size", "64", "--seq-len", "4096", "--tensor-parallel", "1",
                        "--pipeline-parallel", "4",
                        "--micro-batch-size", "1", "--zero", "1", "--recompute", "none", "--node-gpus", "4",
                        "--schedule", "1f1b,dualpipe-v",
                        "-o", "plan.csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "4 GPUs a node" in result.stdout.splitlines()[0]
    with open(tmp_path / "plan.csv", newline="") as handle:
        rows = list(__import__("csv").DictReader(handle))
    searched = {row["expert_parallel"] for row in rows}
    assert searched == {"1", "2", "4", "8"}  # the divisors of 8 experts that divide d x t = 8
    assert {row["schedule"] for row in rows} == {"1f1b", "dualpipe-v"}  # a pin may name it: experts are here
    listed = [line for line in result.stdout.splitlines() if line[:3].strip().isdigit()]
    assert any(" e 8," in line or " e 4," in line or " e 2," in line for line in listed)
    # each expert degree is a layout of its own
    ranks = {(row["expert_parallel"], row["layout_rank"]) for row in rows if row["rank"]}
    assert len({rank for _, rank in ranks}) == len({e for e, _ in ranks})


def test_an_imbalance_no_routing_can_give_is_refused():
    """The busiest of e GPUs holds experts / e experts and takes at most min(top_k, experts / e) of a token's top_k
    copies: Mixtral's eight experts on 8 GPUs, top-2, at most 4 times the mean; on 2 GPUs, 2."""
    mixtral = MODEL_PRESETS["mixtral-8x7b"]
    for e, most in ((8, 4.0), (2, 2.0)):
        Workload(model=mixtral, data_parallel=8, expert_parallel=e, expert_imbalance=most)
        with pytest.raises(ParameterError, match=rf"expert_imbalance = {most + 0.5}: must be at most {most:g} with "
                                                 rf"expert_parallel = {e}"):
            Workload(model=mixtral, data_parallel=8, expert_parallel=e, expert_imbalance=most + 0.5)
