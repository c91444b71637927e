"""Parameters, policies, task ids and the 1F1B order."""

import copy
import pickle
from dataclasses import fields, replace

import pytest

from pipeline_sim import (
    EnvParams,
    ParameterError,
    Policy,
    TaskId,
    TaskKind,
    calculate_full_pipeline_schedule,
    compute_orders,
)
from pipeline_sim.kernel.structure import sync_points
from pipeline_sim.metrics import schedule_metrics


@pytest.mark.parametrize("name, value, fragment", [
    ("n", 0, "n = 0: must be an integer >= 1"),
    ("n", 2.5, "n = 2.5"),
    ("num_gpus", True, "num_gpus = True"),
    ("sync_freq", -1, "sync_freq = -1"),
    ("fwd_len", 0.0, "fwd_len = 0.0: must be a finite number from 1e-12 to 1e+09"),
    ("fwd_len", 1e308, "fwd_len = 1e+308: must be a finite number from 1e-12 to 1e+09"),
    ("bwd_len", float("nan"), "bwd_len = nan"),
    ("prop_len", -0.1, "prop_len = -0.1: must be a finite number 0 or 1e-12..1e+09"),
    ("prop_len", 1e-320, "prop_len = 1e-320"),
    ("sync_base_len", float("inf"), "sync_base_len = inf"),
    ("fwd_impact", 1.0, "fwd_impact = 1.0: must be a finite number with 0 <= x < 1"),
    ("bwd_impact", -0.2, "bwd_impact = -0.2"),
    ("ingress_capacity", 0, "ingress_capacity = 0"),
    ("ingress_capacity", 1e-320, "ingress_capacity = 1e-320: must be a finite number with 1e-06 <= x <= 1e+06"),
    ("slow_factor", 1e300, "slow_factor = 1e+300"),
])
def test_invalid_parameters_name_the_field_value_and_range(name, value, fragment):
    with pytest.raises(ValueError, match=None) as info:
        calculate_full_pipeline_schedule(**{name: value})
    assert fragment in str(info.value)
    assert info.value.name == name


@pytest.mark.parametrize("kwargs, fragment", [
    ({"priorities": {"fwd_prop": 1.5}}, "priorities[fwd_prop] = 1.5: must be 0 or a number from 1e-06 to 1"),
    ({"priorities": {"fwd_prop": 1e-310}}, "priorities[fwd_prop] = 1e-310: must be 0 or a number from 1e-06 to 1"),
    ({"priorities": {"activations": 0.5}}, "unknown kind; allowed kinds: fwd_prop, grad_prop, grad_sync"),
    ({"exclusive_tiers": {"grad_sync": "9"}}, "exclusive_tiers[grad_sync] = '9': must be one letter"),
    ({"exclusive_tiers": {"grad_sync": "A"}}, "exclusive_tiers[grad_sync] = 'A'"),
])
def test_invalid_policies(kwargs, fragment):
    with pytest.raises(ParameterError) as info:
        calculate_full_pipeline_schedule(**kwargs)
    assert fragment in str(info.value)


@pytest.mark.parametrize("arguments, message", [
    (({"n": 8}, Policy()), "simulate: params must be EnvParams(n=8, num_gpus=4) or another EnvParams, not dict"),
    ((EnvParams(), None), "simulate: policy must be Policy(priorities={'fwd_prop': 0.5}) or another Policy, not "
                          "NoneType"),
])
def test_simulate_names_an_argument_of_the_wrong_type(arguments, message):
    from pipeline_sim import simulate

    with pytest.raises(TypeError) as info:
        simulate(*arguments)
    assert str(info.value) == message


@pytest.mark.parametrize("sample", [2.9, True, -1, "a", None, 10 ** 30])
@pytest.mark.parametrize("caller", ["simulate", "simulate_lookahead", "simulate_hindsight", "simulate_learned"])
def test_every_run_checks_its_sample_as_the_full_call_does(caller, sample):
    """The dispatchers' own runs too: a look-ahead's sample of -1 was an OverflowError of numpy's, 1.5 taken."""
    from pipeline_sim import simulate
    from pipeline_sim.hindsight import simulate_hindsight
    from pipeline_sim.learned import simulate_learned
    from pipeline_sim.lookahead import simulate_lookahead

    run = {"simulate": simulate, "simulate_lookahead": simulate_lookahead, "simulate_hindsight": simulate_hindsight,
           "simulate_learned": simulate_learned}[caller]
    with pytest.raises(ParameterError, match=r"^sample = .*: must be an integer from 0 to 2\^63 - 1$"):
        run(EnvParams(compute_jitter=0.2, n=4, num_gpus=2, schedule="zb-h1"), Policy(), sample)
    with pytest.raises(TypeError, match=rf"^{caller}: params must be EnvParams"):
        run({"n": 4}, Policy(), 0)


def test_a_libraries_misuse_names_what_it_wanted():
    from pipeline_sim import compute_orders, simulate

    params = EnvParams(n=4, num_gpus=2)
    run = simulate(params, Policy())
    with pytest.raises(TypeError, match="find: a task's text, such as '0F3', not int"):
        run.find(3)
    with pytest.raises(ParameterError, match="lengths = 'abc': must be one finite length >= 0 per task: 32 under"):
        simulate(params, Policy(), lengths="abc")
    for order in ("GPU 0: 0F0", ["0F0 0B0", "1F0 1B0"]):
        with pytest.raises(ParameterError, match=r"must be one list of task texts per GPU \(\['0F0', '0B0', ...\]\)"):
            simulate(params, Policy(), order=order)
    with pytest.raises(ParameterError, match=r"^n = 100000000: on 4 GPUs gives about 2,400,000,004 tasks; at most "
                                             r"1,000,000 fit in memory \(allow_large=True to try anyway\)$"):
        compute_orders("1f1b", num_gpus=4, n=10 ** 8)


def test_arguments_are_keyword_only_with_model_defaults():
    with pytest.raises(TypeError):
        calculate_full_pipeline_schedule(8)
    s = calculate_full_pipeline_schedule()
    assert s.params == EnvParams(n=8, num_gpus=4, sync_freq=1, fwd_len=1.0, bwd_len=2.0, prop_len=1.0,
                                 sync_base_len=2.0, fwd_impact=0.2, bwd_impact=0.2, ingress_capacity=1.0,
                                 schedule="1f1b", chunks=2, w_fraction=0.5, fb_overlap=0.0)
    assert len(s.tasks) == 4 * 8 * 2 + 3 * 8 * 2 + 4 * 8


def test_issue_api_example():
    s = calculate_full_pipeline_schedule(
        n=8, num_gpus=4, sync_freq=1, fwd_len=1.0, bwd_len=2.0, prop_len=1.0, sync_base_len=2.0, fwd_impact=0.2,
        bwd_impact=0.2, ingress_capacity=1.0, priorities={"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2},
        exclusive_tiers={"grad_sync": "a"})
    assert isinstance(s.completion_time, float)
    kinds = {t.kind for t in s.tasks}
    assert kinds == {"forward", "backward", "fwd_prop", "grad_prop", "grad_sync"}
    for t in s.tasks:
        assert isinstance(t.gpu, int) and isinstance(t.index, int) and isinstance(t.throttled, bool)
        assert t.ready <= t.start <= t.end
        assert all(len(segment) == 3 for segment in t.segments)
    assert s.policy.label == "S | F0.5 G0.3"


def test_task_kind_compares_to_strings():
    assert TaskKind.FORWARD == "forward" and TaskKind("grad_sync") is TaskKind.GRAD_SYNC


@pytest.mark.parametrize("text", ["2F0", "0B11", "5I0", "5W0", "3FP2", "1GP0", "0GS3", "(0F7;7B3)"])
def test_task_id_text_round_trips(text):
    assert str(TaskId.parse(text)) == text


def test_task_id_rejects_garbage():
    with pytest.raises(ValueError, match="is not of the form"):
        TaskId.parse("F2")


def test_one_f_one_b_order():
    codes = lambda stage, n, p: " ".join(compute_orders("1f1b", num_gpus=p, n=n)[stage])  # noqa: E731
    assert codes(0, 4, 3) == "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3"
    assert codes(1, 4, 3) == "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3"
    assert codes(2, 4, 3) == "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3"
    assert codes(0, 2, 4) == "0F0 0F1 0B0 0B1"  # fewer micro-batches than warm-up slots


def test_an_environment_remembers_its_hash_and_chunks_apart_from_its_fields():
    """Kept in slots beside the fields: equal environments hash alike however made, a copy or a pickled one computes
    its own again, and neither equality, ``replace`` nor the fields see them."""
    params = EnvParams(schedule="zb-v", num_gpus=4, n=8, fwd_len=1.5, stage_weights=[1.0] * 8)
    twin = EnvParams(schedule="ZB-V", num_gpus=4, n=8, fwd_len=1.5, stage_weights=(1.0,) * 8)
    assert hash(params) == hash(params) == hash(twin) and params == twin and params.v == twin.v == 2
    assert hash(params) == hash(tuple(getattr(params, field.name) for field in fields(EnvParams)))
    for other in (pickle.loads(pickle.dumps(params)), copy.copy(params), copy.deepcopy(params)):
        assert other == params and hash(other) == hash(params) and other.v == 2
    assert "_hash" not in {field.name for field in fields(EnvParams)} and "_v" not in EnvParams.names()
    changed = replace(params, schedule="gpipe", stage_weights=[1.0] * 4)
    assert changed.v == 1 and changed != params and hash(changed) != hash(params)
    assert len({params: 1, twin: 2, changed: 3}) == 2


def test_sync_points():
    assert sync_points(8, 1).tolist() == list(range(8))
    assert sync_points(8, 4).tolist() == [3, 7]
    assert sync_points(7, 3).tolist() == [2, 5, 6]
    assert sync_points(2, 5).tolist() == [1]
    for n in range(1, 30):
        for every in range(1, 12):
            expected = [m for m in range(n) if (m + 1) % every == 0 or m == n - 1]
            assert sync_points(n, every).tolist() == expected, (n, every)


def test_a_sync_frequency_beyond_any_integer_syncs_once_at_the_end():
    """Any frequency from n up syncs once, after the last micro-batch: one too large for a machine integer too."""
    once = calculate_full_pipeline_schedule(num_gpus=4, n=8, sync_freq=8)
    for every in (9, 2 ** 63, 10 ** 30):
        schedule = calculate_full_pipeline_schedule(num_gpus=4, n=8, sync_freq=every)
        assert schedule.completion_time == once.completion_time
        assert [(t.start, t.end) for t in schedule.tasks] == [(t.start, t.end) for t in once.tasks]


def test_policy_labels_and_precedence():
    assert Policy().label == "F1 G1 S1"
    assert Policy(exclusive_tiers={"grad_sync": "a", "fwd_prop": "b", "grad_prop": "b"}).label == "S>F=G"
    both = Policy(priorities={"grad_sync": 0.2}, exclusive_tiers={"grad_sync": "a"})
    assert both.tier("grad_sync") == "a" and both.label == "S | F1 G1"


def test_metrics():
    s = calculate_full_pipeline_schedule(num_gpus=2, n=1, fwd_len=1, bwd_len=1, prop_len=1, sync_base_len=0)
    m = schedule_metrics(s)
    assert m.completion_time == 6 and m.ideal_time == 4 and m.slowdown == 1.5
    assert m.busy_time == (2.0, 2.0)
    assert m.bubble_fraction == pytest.approx((4 / 6, 4 / 6))
    assert m.throttled_time == 0 and m.throttled_transfers == 0
