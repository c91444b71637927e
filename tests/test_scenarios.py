"""The policy grid of a sweep (docs/model.md section 5)."""

import pytest

from pipeline_sim import ParameterError
from pipeline_sim.scenarios import policy_grid, steps_per_unit


def families(policies):
    counts = [0, 0, 0, 0]
    for policy in policies:
        counts[len(policy.exclusive_tiers)] += 1
    return counts


def test_121_distinct_policies_at_step_0_1():
    grid = policy_grid(0.1)
    assert families(grid) == [66, 33, 9, 13]
    assert len(set(grid)) == 121
    assert len({p.label for p in grid}) == 121


@pytest.mark.parametrize("step, expected", [(1.0, [3, 6, 9, 13]), (0.5, [6, 9, 9, 13]), (0.2, [21, 18, 9, 13]),
                                            (0.05, [231, 63, 9, 13])])
def test_counts_at_other_steps(step, expected):
    assert families(policy_grid(step)) == expected


def test_shares_are_exact_multiples_and_sum_to_one():
    for policy in policy_grid(0.1):
        shared = [v for k, v in policy.priorities.items() if k not in policy.exclusive_tiers]
        if not policy.exclusive_tiers:
            assert sum(shared) == pytest.approx(1.0)
        for value in shared:
            assert repr(value) in {"0.0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1.0"}


def test_weak_orders_of_three_kinds():
    labels = [p.label for p in policy_grid(0.1) if len(p.exclusive_tiers) == 3]
    assert labels[0] == "F=G=S"
    assert sorted(labels) == sorted(["F=G=S", "F=G>S", "S>F=G", "F=S>G", "G>F=S", "G=S>F", "F>G=S",
                                     "F>G>S", "F>S>G", "G>F>S", "G>S>F", "S>F>G", "S>G>F"])


def test_two_exclusive_policies_share_the_third_kind():
    two = [p for p in policy_grid(0.1) if len(p.exclusive_tiers) == 2]
    assert [p.label for p in two[:3]] == ["F>G | S1", "G>F | S1", "F=G | S1"]


@pytest.mark.parametrize("step", [0.3, 0.15, 0.0, -0.1, 1.5, 0.7])
def test_steps_that_do_not_divide_one(step):
    with pytest.raises(ParameterError, match="step"):
        steps_per_unit(step)


def test_steps_that_divide_one():
    assert [steps_per_unit(s) for s in (1.0, 0.5, 0.25, 0.2, 0.1, 0.05, 0.01)] == [1, 2, 4, 5, 10, 20, 100]
