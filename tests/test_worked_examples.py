"""docs/model.md section 4, and further timelines worked out by hand."""

import numpy as np
import pytest

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.kernel import SHARED_LAYER, ZERO_LAYER, allocation, layered_rates, state
from pipeline_sim.metrics import ideal_time
from pipeline_sim.validate import validate_schedule


def timeline(schedule):
    return {str(t.id): (t.start, t.end) for t in schedule.tasks}


def assert_timeline(schedule, expected):
    got = timeline(schedule)
    for task, (start, end) in expected.items():
        assert got[task] == pytest.approx((start, end), abs=1e-9), task
    assert validate_schedule(schedule) == []


def test_example_1_grad_sync_slows_the_next_forward():
    s = calculate_full_pipeline_schedule(num_gpus=1, n=2, fwd_len=1, bwd_len=2, sync_base_len=2, sync_freq=1,
                                         fwd_impact=0.5, bwd_impact=0.5)
    assert_timeline(s, {"0F0": (0, 1), "0B0": (1, 3), "0GS0": (3, 5), "0F1": (3, 5), "0B1": (5, 7),
                        "0GS1": (7, 9)})
    assert s.task("forward", 0, 1).segments == [(3.0, 5.0, 0.5)]
    assert s.completion_time == 9.0
    assert len(s.tasks) == 6


def test_example_2_two_stages_one_micro_batch():
    s = calculate_full_pipeline_schedule(num_gpus=2, n=1, fwd_len=1, bwd_len=1, prop_len=1, sync_base_len=0)
    assert_timeline(s, {"0F0": (0, 1), "0FP0": (1, 2), "1F0": (2, 3), "1B0": (3, 4), "1GP0": (4, 5),
                        "0B0": (5, 6), "1GS0": (4, 4), "0GS0": (6, 6)})
    assert s.completion_time == 6.0
    zero = s.task("grad_sync", 1, 0)
    assert zero.ready == zero.start == zero.end == 4.0 and zero.segments == []


@pytest.mark.parametrize("p", range(1, 7))
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("fwd, bwd", [(1.0, 2.0), (0.7, 1.3)])
def test_example_3_textbook_1f1b_time(p, n, fwd, bwd):
    s = calculate_full_pipeline_schedule(num_gpus=p, n=n, fwd_len=fwd, bwd_len=bwd, prop_len=0, sync_base_len=0,
                                         fwd_impact=0, bwd_impact=0)
    assert s.completion_time == pytest.approx((n + p - 1) * (fwd + bwd), rel=1e-12)
    assert s.completion_time == pytest.approx(ideal_time(s.params), rel=1e-12)


def test_example_4_ingress_saturates_first():
    # flows: GPU0 fwd_prop -> GPU1 (0.5), GPU0 grad_sync (0.5), GPU2 grad_prop -> GPU1 (1.0)
    rates = layered_rates([0, 0, 2], [1, None, 1], [0.5, 0.5, 1.0], [SHARED_LAYER] * 3, ingress_capacity=1.0)
    assert rates == pytest.approx([1 / 3, 2 / 3, 2 / 3], abs=1e-12)
    shares = [0.5, 0.5, 1.0]
    assert [is_throttled(r, share) for r, share in zip(rates, shares)] == [True, False, True]


@pytest.mark.parametrize("ingress, expected", [(1.5, [1.0, 0.5]), (0.8, [0.8, 0.0])])
def test_example_6_layers_at_a_receiver(ingress, expected):
    # GPU 0 sends fwd_prop alone with tier 'a'; GPU 2 sends grad_prop alone, shared; both into GPU 1.
    fwd, grad = Ready("fp", tier_rank=0), Ready("gp", priority=1.0)
    flows = choose_sending_set([fwd]) + choose_sending_set([grad])
    rates = layered_rates([0, 2], [1, 1], [f.weight for f in flows], [f.layer for f in flows], ingress)
    assert rates == pytest.approx(expected, abs=1e-12)
    assert [is_throttled(rate, f.share) for rate, f in zip(rates, flows)] == [ingress < 1.0, True]
    # the same with fwd_prop shared (0.3) and grad_prop at priority 0: the zero layer gets what is left
    fwd, grad = Ready("fp", priority=0.3), Ready("gp", priority=0.0)
    flows = choose_sending_set([fwd]) + choose_sending_set([grad])
    assert [f.layer for f in flows] == [SHARED_LAYER, ZERO_LAYER] and [f.share for f in flows] == [1.0, 1.0]
    rates = layered_rates([0, 2], [1, 1], [f.weight for f in flows], [f.layer for f in flows], ingress)
    assert rates == pytest.approx(expected, abs=1e-12)


def test_a_lower_layer_never_outranks_a_higher_one_at_a_receiver():
    # Under the old single filling, priority 0 (weight 1) got 1/3 and priority 0.5 got 1/6 of GPU 1's 0.5.
    assert layered_rates([0, 2], [1, 1], [1.0, 0.5], [ZERO_LAYER, SHARED_LAYER], 0.5) == [0.0, 0.5]


def test_issue_scale_example_gives_one_result():
    kw = dict(n=4, num_gpus=3, fwd_len=1, bwd_len=1, prop_len=2, sync_base_len=2, fwd_impact=0, bwd_impact=0,
              ingress_capacity=0.5)
    half = calculate_full_pipeline_schedule(**kw, priorities={"fwd_prop": 0, "grad_prop": 0.5, "grad_sync": 0.5})
    whole = calculate_full_pipeline_schedule(**kw, priorities={"fwd_prop": 0, "grad_prop": 1, "grad_sync": 1})
    assert half.completion_time == whole.completion_time == 68.5


def test_a_segment_starts_only_when_the_rate_changes():
    s = calculate_full_pipeline_schedule(n=2, num_gpus=3, fwd_len=2, bwd_len=1, prop_len=2, sync_base_len=2,
                                         fwd_impact=0, bwd_impact=0, ingress_capacity=0.7,
                                         priorities={"fwd_prop": 0.5, "grad_prop": 1.0, "grad_sync": 0.3})
    rates = [rate for _, _, rate in s.task("grad_sync", 2, 0).segments]
    assert rates == pytest.approx([0.3, 1.0, 0.1875, 0.5])
    assert validate_schedule(s) == []


def test_waiting_at_a_saturated_receiver_is_throttled():
    # 2GP2 (shared, alone on GPU 2's port) flows into GPU 1 at its ingress 0.8 from 13; at 13.5 0FP3
    # (tier a) from GPU 0 takes all of GPU 1's ingress, so 2GP2 waits at rate 0, throttled, until 14.75.
    s = calculate_full_pipeline_schedule(n=4, num_gpus=3, fwd_len=1, bwd_len=1, prop_len=1, sync_base_len=0,
                                         fwd_impact=0, bwd_impact=0, ingress_capacity=0.8,
                                         exclusive_tiers={"fwd_prop": "a"})
    fp3, gp2 = s.task("fwd_prop", 0, 3), s.task("grad_prop", 2, 2)
    assert fp3.segments == [(13.5, 14.75, 0.8)]
    assert gp2.ready == gp2.start == 13.0 and gp2.end == 15.5
    assert gp2.segments == [(13.0, 13.5, 0.8), (14.75, 15.5, 0.8)]
    assert gp2.throttled and gp2.throttled_time == pytest.approx(0.5 + 1.25 + 0.75)  # waiting counts
    assert validate_schedule(s) == []


def test_example_5_three_stages_with_accumulation():
    s = calculate_full_pipeline_schedule(num_gpus=3, n=4, sync_freq=2, fwd_len=1, bwd_len=2, prop_len=1,
                                         sync_base_len=2, fwd_impact=0.2, bwd_impact=0.2,
                                         priorities={"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2})
    assert s.completion_time == pytest.approx(449 / 15, rel=1e-12)
    assert sum(t.kind == "grad_sync" for t in s.tasks) == 3 * 2
    assert validate_schedule(s) == []


def one_gpu_two_syncs(**policy):
    return calculate_full_pipeline_schedule(num_gpus=1, n=2, fwd_len=1, bwd_len=1, sync_base_len=3,
                                            fwd_impact=0, bwd_impact=0, **policy)


def test_two_ready_syncs_share_by_full_priority_each():
    # GS0 runs alone [2,4) (1 of 3 left), then shares equally with GS1 until it ends at 6.
    s = one_gpu_two_syncs()
    assert_timeline(s, {"0F0": (0, 1), "0B0": (1, 2), "0F1": (2, 3), "0B1": (3, 4), "0GS0": (2, 6),
                        "0GS1": (4, 8)})
    assert s.task("grad_sync", 0, 1).segments == [(4.0, 6.0, 0.5), (6.0, 8.0, 1.0)]


def test_exclusive_ties_go_to_the_earliest_ready():
    s = one_gpu_two_syncs(exclusive_tiers={"grad_sync": "a"})
    assert_timeline(s, {"0GS0": (2, 5), "0GS1": (5, 8)})
    assert s.task("grad_sync", 0, 1).ready == 4.0


def two_gpu_backward_tail(**policy):
    # GPU 1's B0 ends at 4, when its grad_prop and grad_sync become ready together.
    return calculate_full_pipeline_schedule(num_gpus=2, n=1, fwd_len=1, bwd_len=1, prop_len=1, sync_base_len=1,
                                            fwd_impact=0, bwd_impact=0, **policy)


def test_shared_priorities_split_the_port():
    s = two_gpu_backward_tail(priorities={"grad_prop": 1, "grad_sync": 1})
    assert_timeline(s, {"1GP0": (4, 6), "1GS0": (4, 6), "0B0": (6, 7), "0GS0": (7, 8)})
    assert s.completion_time == 8


def test_priority_zero_waits_for_the_shared_layer():
    s = two_gpu_backward_tail(priorities={"grad_prop": 0, "grad_sync": 1})
    assert_timeline(s, {"1GS0": (4, 5), "1GP0": (5, 6), "0B0": (6, 7), "0GS0": (7, 8)})
    assert s.task("grad_prop", 1, 0).ready == 4


def test_exclusive_tier_sends_alone():
    s = two_gpu_backward_tail(exclusive_tiers={"grad_prop": "a"})
    assert_timeline(s, {"1GP0": (4, 5), "1GS0": (5, 6), "0B0": (5, 6), "0GS0": (6, 7)})
    assert s.completion_time == 7


def test_higher_tier_preempts_a_running_lower_one():
    # On GPU 1, GS0 (tier b) waits for GP0 (tier a), runs from 5, and is preempted
    # at 6 when B1 ends and GP1 (tier a) becomes ready; it resumes at 7 and ends at 9.
    s = calculate_full_pipeline_schedule(num_gpus=2, n=2, fwd_len=1, bwd_len=1, prop_len=1, sync_base_len=3,
                                         fwd_impact=0, bwd_impact=0,
                                         exclusive_tiers={"fwd_prop": "a", "grad_prop": "a", "grad_sync": "b"})
    gs0 = s.task("grad_sync", 1, 0)
    gp1 = s.task("grad_prop", 1, 1)
    assert gp1.start == gp1.ready
    assert len(gs0.segments) == 2
    assert gs0.segments == [(5.0, 6.0, 1.0), (7.0, 9.0, 1.0)]
    assert (gp1.start, gp1.end) == (6.0, 7.0)
    assert validate_schedule(s) == []


def test_ingress_backpressure_marks_throttled_transfers():
    s = calculate_full_pipeline_schedule(n=8, num_gpus=4, ingress_capacity=1.0)
    throttled = [t for t in s.tasks if t.throttled]
    assert throttled and all(t.kind in ("fwd_prop", "grad_prop") for t in throttled)
    assert all(t.throttled_time > 0 for t in throttled)
    free = calculate_full_pipeline_schedule(n=8, num_gpus=4, ingress_capacity=2.0)
    assert not any(t.throttled for t in free.tasks)
    assert free.completion_time <= s.completion_time


def is_throttled(rate, share):
    return rate < share * (1.0 - state.THROTTLE_TOLERANCE)


class Ready:
    """A ready transfer as the allocation sees it."""

    def __init__(self, name, priority=1.0, tier_rank=None, ready=0.0, index=0, kind_order=0):
        self.name, self.priority, self.tier_rank = name, priority, tier_rank
        self.ready, self.index, self.kind_order = ready, index, kind_order
        self.weight = self.share = self.layer = None


def choose_sending_set(ready):
    """The kernel's sending set of one GPU whose ready transfers are ``ready``, in ready order."""
    count = len(ready)
    F = np.zeros((count, state.TASK_FLOATS))
    I = np.zeros((count, state.TASK_INTS), dtype=np.int64)
    Q = np.zeros((2, 1, count), dtype=np.int64)
    A, _ = allocation.scratch(count, 1)
    for i, run in enumerate(ready):
        Q[state.READY_QUEUE, 0, i] = i
        I[i, state.TIER] = -1 if run.tier_rank is None else run.tier_rank
        I[i, state.INDEX], I[i, state.COMM] = run.index, run.kind_order
        F[i, state.KEY], F[i, state.PRIORITY] = allocation.ready_key(run.ready), run.priority
    size = allocation.choose_sending_set(0, count, Q, F, I, A)
    chosen = [ready[i] for i in A[state.CHOSEN, :size]]
    for i, run in zip(A[state.CHOSEN, :size], chosen):
        run.weight, run.share, run.layer = F[i, state.WEIGHT], F[i, state.SHARE], I[i, state.LAYER]
    return chosen


def names(chosen):
    return [(run.name, run.weight, run.share) for run in chosen]


def test_sending_set_layers():
    shared = [Ready("fp", 0.5), Ready("gp", 0.3), Ready("gs", 0.2)]
    assert names(choose_sending_set(shared)) == [("fp", 0.5, 0.5), ("gp", 0.3, 0.3), ("gs", 0.2, 0.2)]
    two_fp = [Ready("fp0", 0.5), Ready("fp1", 0.5), Ready("gs", 0.0)]
    assert names(choose_sending_set(two_fp)) == [("fp0", 0.5, 0.5), ("fp1", 0.5, 0.5)]
    zeros = [Ready("fp", 0.0), Ready("gs", 0.0)]
    assert names(choose_sending_set(zeros)) == [("fp", 1.0, 0.5), ("gs", 1.0, 0.5)]


def test_exclusive_winner_by_tier_then_ready_then_index_then_kind():
    pick = lambda *runs: choose_sending_set(list(runs))[0].name  # noqa: E731
    assert pick(Ready("b", tier_rank=1), Ready("a", tier_rank=0, ready=5.0), Ready("shared")) == "a"
    assert pick(Ready("late", tier_rank=0, ready=2.0), Ready("early", tier_rank=0, ready=1.0)) == "early"
    # ready times equal after rounding to 9 decimals: the lower index wins
    assert pick(Ready("i3", tier_rank=0, ready=1.0 + 1e-12, index=3), Ready("i5", tier_rank=0, ready=1.0, index=5)) \
        == "i3"
    assert pick(Ready("sync", tier_rank=0, kind_order=2), Ready("grad", tier_rank=0, kind_order=1)) == "grad"
