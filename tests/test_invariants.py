"""The validator over many random environments and policies, and the validator's own teeth."""

import copy
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_allocation import choose_sending_set, exclusive_key, layered_rates

from pipeline_sim import COMM_KINDS, EnvParams, Policy, TaskKind, simulate
from pipeline_sim.metrics import ideal_time, schedule_metrics
from pipeline_sim.validate import validate_schedule

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v")


def random_case(rng: random.Random) -> tuple[EnvParams, Policy]:
    schedule = rng.choice(SCHEDULES)
    p = rng.randint(1, 6)
    n = {"interleaved-1f1b": p * rng.randint(1, 3), "dualpipe-v": 2 * p + rng.randint(0, 3)}.get(
        schedule, rng.randint(1, 10))
    params = EnvParams(
        n=n, num_gpus=p, sync_freq=rng.randint(1, 4), schedule=schedule, chunks=rng.randint(2, 3),
        w_fraction=rng.choice([0.0, 0.5, rng.uniform(0, 0.99)]), fb_overlap=rng.choice([0.0, rng.uniform(0, 0.5)]),
        fwd_len=rng.choice([0.5, 1.0, rng.uniform(0.1, 3)]), bwd_len=rng.choice([1.0, 2.0, rng.uniform(0.1, 4)]),
        prop_len=rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 3)]),
        sync_base_len=rng.choice([0.0, 2.0, rng.uniform(0, 5)]),
        fwd_impact=rng.choice([0.0, 0.2, rng.uniform(0, 0.99)]),
        bwd_impact=rng.choice([0.0, 0.2, rng.uniform(0, 0.99)]),
        ingress_capacity=rng.choice([0.5, 1.0, 1.5, 2.0, rng.uniform(0.1, 3)]))
    priorities, tiers = {}, {}
    for kind in COMM_KINDS:
        choice = rng.random()
        if choice < 0.3:
            tiers[kind] = rng.choice("abc")
        elif choice < 0.45:
            priorities[kind] = 0.0
        elif choice < 0.9:
            priorities[kind] = round(rng.random(), 2)
    return params, Policy(priorities=priorities, exclusive_tiers=tiers)


@pytest.mark.parametrize("seed", range(200))
def test_random_schedules_are_valid(seed):
    params, policy = random_case(random.Random(seed))
    schedule = simulate(params, policy)
    assert validate_schedule(schedule) == [], (params, policy)
    assert schedule.completion_time >= ideal_time(params) * (1 - 1e-9)
    assert all(0 < span <= schedule.completion_time * (1 + 1e-12) for span in schedule_metrics(schedule).spans)
    metrics = schedule_metrics(schedule)
    assert all(0.0 <= b < 1.0 for b in metrics.bubble_fraction)
    assert metrics.throttled_time >= 0.0
    assert all(task.throttled == (task.throttled_time > 0) for task in schedule.tasks)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6), p=st.integers(1, 5), sync_freq=st.integers(1, 3),
       prop=st.sampled_from([0.0, 0.3, 1.0, 2.5]), sync=st.sampled_from([0.0, 1.0, 3.0]),
       impact=st.floats(0, 0.9), ingress=st.sampled_from([0.25, 1.0, 2.0]),
       tiers=st.dictionaries(st.sampled_from(COMM_KINDS), st.sampled_from("ab")),
       priorities=st.dictionaries(st.sampled_from(COMM_KINDS), st.sampled_from([0.0, 0.1, 0.5, 1.0])))
def test_hypothesis_schedules_are_valid_and_deterministic(n, p, sync_freq, prop, sync, impact, ingress, tiers,
                                                          priorities):
    params = EnvParams(n=n, num_gpus=p, sync_freq=sync_freq, prop_len=prop, sync_base_len=sync,
                       fwd_impact=impact, bwd_impact=impact, ingress_capacity=ingress)
    policy = Policy(priorities=priorities, exclusive_tiers=tiers)
    first, second = simulate(params, policy), simulate(params, policy)
    assert validate_schedule(first) == []
    assert [(t.id, t.start, t.end, t.segments) for t in first.tasks] == \
           [(t.id, t.start, t.end, t.segments) for t in second.tasks]


def test_more_bandwidth_never_hurts_with_one_stage():
    # With one GPU there is no ingress coupling: a faster sync can only help.
    slow = simulate(EnvParams(num_gpus=1, sync_base_len=3.0), Policy())
    fast = simulate(EnvParams(num_gpus=1, sync_base_len=1.0), Policy())
    assert fast.completion_time < slow.completion_time


@pytest.fixture
def good():
    return simulate(EnvParams(n=4, num_gpus=3), Policy(priorities={"fwd_prop": 0.5}))


def test_validator_catches_a_late_dependency(good):
    broken = copy.deepcopy(good)
    fwd = broken.task(TaskKind.FORWARD, 1, 2)
    fwd.start -= 0.5
    assert any("1F2" in error for error in validate_schedule(broken))


def test_validator_catches_missing_work(good):
    broken = copy.deepcopy(good)
    prop = broken.task(TaskKind.FWD_PROP, 0, 1)
    t0, t1, rate = prop.segments[-1]
    prop.segments[-1] = (t0, t1, rate / 2)
    assert any("work done" in error for error in validate_schedule(broken))


def test_validator_catches_egress_overload(good):
    broken = copy.deepcopy(good)
    for task in broken.tasks:
        if task.gpu == 0 and not task.kind.is_compute:
            task.segments = [(t0, t1, 1.0) for t0, t1, _ in task.segments]
    assert any("egress" in error or "work done" in error for error in validate_schedule(broken))


def test_validator_catches_a_missing_task(good):
    broken = copy.deepcopy(good)
    broken.tasks.pop()
    assert "task set is wrong" in validate_schedule(broken)[0]


def test_validator_catches_a_wrong_completion_time(good):
    broken = copy.deepcopy(good)
    broken.completion_time += 1.0
    assert any("completion time" in error for error in validate_schedule(broken))


def test_a_stuck_simulation_names_what_waits(monkeypatch):
    from pipeline_sim import SimulationStuckError, engine

    params = EnvParams(n=2, num_gpus=2)
    arrays = engine.graph_arrays(params)
    graph = engine.build_task_graph(params)
    needs = arrays.needs_count.copy()
    needs[graph.orders[1][0]] += 1  # a dependency that no task will ever satisfy
    needs.flags.writeable = False  # as the graph's own arrays, so the compiled kernel serves it without compiling
    monkeypatch.setattr(engine, "graph_arrays", lambda _: arrays._replace(needs_count=needs))
    with pytest.raises(SimulationStuckError, match=r"1F0 waits for its predecessor"):
        simulate(params, Policy())
    with pytest.raises(SimulationStuckError, match=r"1F0 waits for its predecessor"):
        engine.simulate_figures(params, [Policy(), Policy(priorities={"fwd_prop": 0.5})])


class _Proxy:
    def __init__(self, task, policy, tier_letters):
        tier = policy.tier(task.kind)
        self.task = task
        self.tier_rank = tier_letters.index(tier) if tier else None
        self.key = exclusive_key(self.tier_rank, task.ready, task.index, COMM_KINDS.index(task.kind),
                                 task.stage) if tier else ()
        self.priority = policy.shared_priority(task.kind)
        self.receiver = task.receiver


def rate_at(task, t):
    return next((rate for t0, t1, rate in task.segments if t0 <= t < t1), 0.0)


def from_scratch_mismatches(schedule):
    """Compare every rate with a recomputation from scratch at the middle of each interval between events."""
    params, policy = schedule.params, schedule.policy
    tier_letters = sorted(set(policy.exclusive_tiers.values()))
    times = sorted({x for task in schedule.tasks for x in (task.ready, task.end)})
    comm = [task for task in schedule.tasks if not task.kind.is_compute and task.length > 0]
    compute = [task for task in schedule.tasks if task.kind.is_compute]
    problems = []
    for t0, t1 in zip(times, times[1:]):
        if t1 - t0 < 1e-7:
            continue
        t = (t0 + t1) / 2
        flows = []
        for gpu in range(params.num_gpus):
            ready = [_Proxy(task, policy, tier_letters) for task in comm
                     if task.gpu == gpu and task.ready <= t < task.end]
            flows.extend(choose_sending_set(ready))
        rates = layered_rates([f.task.gpu for f in flows], [f.receiver for f in flows],
                              [f.weight for f in flows], [f.layer for f in flows], params.ingress_capacity)
        expected = {id(f.task): rate for f, rate in zip(flows, rates)}
        for task in comm:
            if task.ready <= t < task.end:
                want = expected.get(id(task), 0.0)
                if abs(rate_at(task, t) - want) > 1e-9:
                    problems.append(f"t={t}: {task.id} runs at {rate_at(task, t)}, from scratch {want}")
        sync = [0.0] * params.num_gpus
        for f, rate in zip(flows, rates):
            if f.task.kind == "grad_sync":
                sync[f.task.gpu] += rate
        for task in compute:
            if task.start <= t < task.end:
                impact = params.fwd_impact if task.kind == "forward" else params.bwd_impact
                if task.kind == "overlap_f_b":  # work-weighted (section 6.2)
                    f, b = params.fwd_len / params.v, params.bwd_len / params.v
                    impact = (f * params.fwd_impact + b * params.bwd_impact) / (f + b)
                if abs(rate_at(task, t) - (1 - impact * sync[task.gpu])) > 1e-9:
                    problems.append(f"t={t}: {task.id} computes at {rate_at(task, t)}")
    return problems


def scaled(policy: Policy, factor: float) -> Policy:
    return Policy(priorities={kind: value * factor for kind, value in policy.priorities.items()},
                  exclusive_tiers=policy.exclusive_tiers)


@pytest.mark.parametrize("seed", range(100))
def test_scaling_every_shared_priority_changes_nothing(seed):
    rng = random.Random(5000 + seed)
    params, policy = random_case(rng)
    # every kind gets an explicit priority, so the factor reaches the kinds that would default to 1.0
    policy = Policy(priorities={k: policy.priorities.get(k, 1.0) for k in COMM_KINDS},
                    exclusive_tiers=policy.exclusive_tiers)
    reference = simulate(params, policy)
    half = simulate(params, scaled(policy, 0.5))  # exact in binary floating point: the same bits
    assert half.completion_time == reference.completion_time, (params, policy)
    factor = rng.uniform(0.05, 1.0)
    other = simulate(params, scaled(policy, factor))
    assert other.completion_time == pytest.approx(reference.completion_time, rel=1e-9), (params, policy, factor)


@pytest.mark.parametrize("seed", range(100))
def test_lazy_rates_equal_a_recomputation_from_scratch(seed):
    params, policy = random_case(random.Random(1000 + seed))
    schedule = simulate(params, policy)
    assert from_scratch_mismatches(schedule) == [], (params, policy)


def test_the_from_scratch_check_has_teeth(good):
    broken = copy.deepcopy(good)
    prop = broken.task(TaskKind.FWD_PROP, 0, 1)
    t0, t1, rate = prop.segments[0]
    prop.segments[0] = (t0, t1, rate * 0.9)
    assert from_scratch_mismatches(good) == []
    assert any("0FP1" in problem for problem in from_scratch_mismatches(broken))


@pytest.mark.parametrize("seed", range(4))
def test_the_kernels_layered_allocation_is_the_references_to_the_bit(seed):
    """Many flows among many GPUs, in several layers, some leaving the modelled GPUs: every rate the kernel's
    progressive filling gives is the plain-Python reference's float, bit for bit (each capacity's sums over its
    flows in their order)."""
    from pipeline_sim.kernel import SHARED_LAYER, ZERO_LAYER
    from pipeline_sim.kernel import layered_rates as kernel_rates

    rng = random.Random(seed)
    for _ in range(150):
        gpus, count = rng.randint(2, 10), rng.randint(1, 40)
        senders = [rng.randrange(gpus) for _ in range(count)]
        receivers = [None if rng.random() < 0.1 else rng.choice([g for g in range(gpus) if g != sender])
                     for sender in senders]
        # a GPU's sending set is of one layer: one layer per sender
        layer_of = {g: rng.choice([0, 1, SHARED_LAYER, ZERO_LAYER]) for g in range(gpus)}
        layers = [layer_of[sender] for sender in senders]
        weights = [rng.choice([1.0, 0.5, 0.3, round(rng.uniform(0.01, 1), 2), rng.uniform(0.01, 1)])
                   for _ in range(count)]
        ingress = rng.choice([0.5, 1.0, 1.5, rng.uniform(0.1, 3)])
        assert kernel_rates(senders, receivers, weights, layers, ingress) == \
            layered_rates(senders, receivers, weights, layers, ingress)
