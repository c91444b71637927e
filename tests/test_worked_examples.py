"""docs/model.md section 4, and further timelines worked out by hand."""

import pytest

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.allocation import choose_sending_set, exclusive_key, is_throttled, max_min_fair_rates
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
    assert s.completion_time == pytest.approx(s.params.ideal_time, rel=1e-12)


def test_example_4_ingress_saturates_first():
    # flows: GPU0 fwd_prop -> GPU1 (0.5), GPU0 grad_sync (0.5), GPU2 grad_prop -> GPU1 (1.0)
    rates = max_min_fair_rates([0, 0, 2], [1, None, 1], [0.5, 0.5, 1.0], ingress_capacity=1.0)
    assert rates == pytest.approx([1 / 3, 2 / 3, 2 / 3], abs=1e-12)
    shares = [0.5, 0.5, 1.0]
    assert [is_throttled(r, share) for r, share in zip(rates, shares)] == [True, False, True]


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


class Ready:
    """A ready transfer as the allocation sees it."""

    def __init__(self, name, priority=1.0, tier_rank=None, ready=0.0, index=0, kind_order=0):
        self.name, self.priority, self.tier_rank = name, priority, tier_rank
        self.key = exclusive_key(tier_rank, ready, index, kind_order) if tier_rank is not None else ()
        self.weight = self.share = None


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
