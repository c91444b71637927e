"""The validator's teeth: for each invariant, a corrupted schedule that only that check catches."""

import copy

import pytest

from pipeline_sim import EnvParams, Policy, simulate, validate
from pipeline_sim.taskgraph import build_task_graph


def failing_checks(schedule):
    graph = build_task_graph(schedule.params)
    tol = 1e-6 * max(1.0, schedule.completion_time)
    return [check for check in validate.CHECKS if check(schedule, graph, tol)]


def corrupt_one(schedule, mutate, target):
    """The first task whose corruption by ``mutate`` fails ``target`` and no other check, as a new schedule."""
    for position, task in enumerate(schedule.tasks):
        broken = copy.deepcopy(schedule)
        if mutate(broken.tasks[position]) is False:
            continue
        if failing_checks(broken) == [target]:
            return broken
    raise AssertionError(f"no task of this schedule can be corrupted so that only {target.__name__} fails")


def front_loaded(task):
    """One segment's work done in its first half at twice its rate (at most 1): start, end and work unchanged."""
    slow = [i for i, (_, _, rate) in enumerate(task.segments) if rate <= 0.5]
    if task.parts or not slow:
        return False
    t0, t1, rate = task.segments[slow[0]]
    task.segments[slow[0]] = (t0, (t0 + t1) / 2, 2 * rate)


def late(task):
    """A transfer that runs at half its rate for twice as long: it ends later than its consumer starts."""
    if task.parts or not task.segments or task.kind == "grad_sync":
        return False
    t0 = task.segments[0][0]
    task.segments = [(t0 + 2 * (a - t0), t0 + 2 * (b - t0), rate / 2) for a, b, rate in task.segments]
    task.end = task.segments[-1][1]


def starved(task):
    """A grad_sync that does less work than its length."""
    if task.kind != "grad_sync" or not task.segments:
        return False
    t0, t1, rate = task.segments[-1]
    task.segments[-1] = (t0, t1, rate / 2)


CONTENDED = EnvParams(n=6, num_gpus=3, ingress_capacity=0.5, schedule="1f1b")
POLICY = Policy(priorities={"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2})


@pytest.mark.parametrize("target, mutate", [
    (validate.check_egress, front_loaded),
    (validate.check_ingress, front_loaded),
    (validate.check_dependencies, late),
    (validate.check_work, starved),
])
def test_each_check_alone_catches_its_corruption(monkeypatch, target, mutate):
    schedule = simulate(CONTENDED, POLICY)
    assert validate.validate_schedule(schedule) == []
    broken = corrupt_one(schedule, mutate, target)
    assert validate.validate_schedule(broken)
    monkeypatch.setattr(validate, "CHECKS", tuple(c for c in validate.CHECKS if c is not target))
    assert validate.validate_schedule(broken) == []


def test_the_order_check_alone_catches_a_swapped_order(monkeypatch):
    # One GPU under GPipe: F0 and F1 need nothing, so running F1 first breaks only the order.
    schedule = simulate(EnvParams(num_gpus=1, n=2, schedule="gpipe", sync_base_len=0), Policy())
    broken = copy.deepcopy(schedule)
    f0, f1 = broken.find("0F0"), broken.find("0F1")
    for field in ("ready", "start", "end", "segments"):
        first, second = getattr(f0, field), getattr(f1, field)
        setattr(f0, field, second)
        setattr(f1, field, first)
    assert failing_checks(broken) == [validate.check_order]
    assert any("runs ['0F1'" in error for error in validate.validate_schedule(broken))
    monkeypatch.setattr(validate, "CHECKS", tuple(c for c in validate.CHECKS if c is not validate.check_order))
    assert validate.validate_schedule(broken) == []


def test_a_missing_task_is_reported_alone():
    schedule = simulate(EnvParams(n=4, num_gpus=3), Policy())
    broken = copy.deepcopy(schedule)
    broken.tasks.pop()
    errors = validate.validate_schedule(broken)
    assert len(errors) == 1 and "task set is wrong" in errors[0]


def test_a_wrong_completion_time():
    broken = simulate(EnvParams(n=4, num_gpus=3), Policy())
    broken.completion_time += 1.0
    assert failing_checks(broken) == [validate.check_completion]
