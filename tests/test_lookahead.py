"""The look-ahead dispatcher (docs/model.md section 12.7): its worked example, its honesty about the future, and
the invariants of its runs."""

import random
from dataclasses import replace

import numpy as np
import pytest

from pipeline_sim import EnvParams, ParameterError, Policy, simulate
from pipeline_sim.engine import memory_bound, task_lengths
from pipeline_sim.learned import figures_of
from pipeline_sim.lookahead import simulate_lookahead
from pipeline_sim.model import DEFAULT_POLICY
from pipeline_sim.validate import validate_schedule


def timeline(schedule, gpu):
    return [(str(t.id), t.start, t.end) for t in sorted(schedule.tasks, key=lambda t: t.start)
            if t.parts and t.gpu == gpu]


def test_worked_example_20_the_look_ahead_runs_a_backward_where_the_static_order_waits():
    params = EnvParams(schedule="gpipe", num_gpus=2, n=3, prop_len=2.0, sync_base_len=0.0, dispatch="lookahead")
    run = simulate_lookahead(params, Policy())
    assert timeline(run, 0) == [("0F0", 0, 1), ("0F1", 1, 2), ("0F2", 2, 3), ("0B0", 9.5, 11.5),
                                ("0B1", 13.5, 15.5), ("0B2", 15.5, 17.5)]
    assert timeline(run, 1) == [("1F0", 4.5, 5.5), ("1B0", 5.5, 7.5), ("1F1", 7.5, 8.5), ("1F2", 8.5, 9.5),
                                ("1B1", 9.5, 11.5), ("1B2", 11.5, 13.5)]
    sends = {str(t.id): (t.start, t.end) for t in run.tasks if not t.parts}
    assert [sends[k] for k in ("0FP0", "0FP1", "0FP2", "1GP0", "1GP1", "1GP2")] == \
        [(1, 4.5), (2, 6.5), (3, 7), (7.5, 9.5), (11.5, 13.5), (13.5, 15.5)]
    assert run.completion_time == 17.5
    assert simulate(replace(params, dispatch="static"), Policy()).completion_time == 18.5  # waiting's copy
    assert validate_schedule(run) == []
    # at 8.5 F2 and B1 tie at 17.5, their copies' compute tasks still to end summing to 79 each: the static step F2
    assert sum(t.end for t in run.tasks if t.parts and t.end > 8.5) == 79
    greedy = simulate(replace(params, dispatch="greedy"), Policy())  # B1 before F2, to the same 17.5
    assert greedy.completion_time == 17.5
    assert [str(t.id) for t in sorted((t for t in greedy.tasks if t.gpu == 1 and t.parts), key=lambda t: t.start)] \
        == ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"]
    assert sum(t.end for t in greedy.tasks if t.parts and t.end > 8.5) == 79  # the tie the look-ahead broke


def test_the_look_ahead_never_reads_the_length_of_a_task_that_has_not_ended():
    """Two draws that agree on every task ended by time T, and make every other task longer in the second: the
    look-ahead starts the same tasks at the same instants before T in both."""
    params = EnvParams(n=8, num_gpus=4, schedule="zb-h1", dispatch="lookahead")
    rng = np.random.default_rng(3)
    first = task_lengths(params) * rng.lognormal(0.0, 0.3, size=len(task_lengths(params)))
    a = simulate_lookahead(params, DEFAULT_POLICY, lengths=first)
    cut = a.completion_time / 2
    ended = np.array([t.end <= cut for t in a.tasks])
    second = np.where(ended, first, first * rng.uniform(1.2, 2.0, size=len(first)))
    b = simulate_lookahead(params, DEFAULT_POLICY, lengths=second)
    before = [(str(t.id), t.start) for t in a.tasks if t.parts and t.start < cut]
    assert len(before) > 20 and ended.sum() > 20
    assert [(str(t.id), t.start) for t in b.tasks if t.parts and t.start < cut] == before
    assert [[i for i in order if a.tasks[i].start < cut] for order in a.orders] == \
        [[i for i in order if b.tasks[i].start < cut] for order in b.orders]
    assert b.completion_time > a.completion_time  # the draws do differ where the future begins


def test_random_look_ahead_runs_are_valid_and_without_noise_never_slower_than_the_static_order():
    rng = random.Random(11)
    for _ in range(24):
        jitter = rng.choice([0.0, 0.0, 0.2, 0.4])
        params = EnvParams(schedule=rng.choice(["gpipe", "1f1b", "zb-h1"]), num_gpus=rng.choice([2, 3, 4]),
                           n=rng.choice([4, 6]), prop_len=rng.choice([0.0, 0.5, 2.0]),
                           sync_base_len=rng.choice([0.0, 1.0]), fwd_len=rng.choice([1.0, 1.5]),
                           bwd_len=rng.choice([1.0, 2.0, 3.0]), compute_jitter=jitter, comm_jitter=jitter,
                           seed=rng.randrange(100), dispatch="lookahead")
        policy = rng.choice([DEFAULT_POLICY, Policy(), Policy(exclusive_tiers={"grad_prop": "a"})])
        sample = rng.randrange(4)
        progress = np.full(1, -1.0)  # what another process reads while the run goes on: the tasks ended
        run = simulate_lookahead(params, policy, sample, progress=progress)
        assert progress[0] == len(run.tasks), params
        assert validate_schedule(run) == [], params
        assert run.completion_time >= memory_bound(params, sample) * (1 - 1e-9)
        assert figures_of(params, [policy], sample)[0, 0] == run.completion_time
        if jitter == 0.0:
            static = simulate(replace(params, dispatch="static"), policy, sample)
            assert run.completion_time <= static.completion_time * (1 + 1e-9), params


def test_the_look_ahead_is_refused_for_schedules_of_several_chunks():
    for schedule in ("interleaved-1f1b", "zb-v", "dualpipe-v"):
        with pytest.raises(ParameterError, match="chunk"):
            EnvParams(schedule=schedule, n=8, num_gpus=4, dispatch="LookAhead")


def test_the_look_ahead_is_refused_below_the_static_orders_peak():
    """The copies continue the static order, which holds its peak: below it they foretell runs the look-ahead
    cannot take (GPipe at a limit of 2: 183 against greedy's 90); at the peak it runs."""
    gpipe = EnvParams(schedule="gpipe", n=8, num_gpus=4, dispatch="lookahead", memory_limit=2)
    with pytest.raises(ParameterError, match="memory_limit = 2.0: the look-ahead continues the static order, which "
                                             "holds 8 \\(its peak\\).*give at least 8, or 0 for it"):
        simulate_lookahead(gpipe, DEFAULT_POLICY)
    assert simulate_lookahead(replace(gpipe, memory_limit=8), DEFAULT_POLICY).completion_time > 0
