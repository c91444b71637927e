"""An iteration run decision by decision (docs/model.md section 12.4): the kernel stops at each choice and goes on
from its own arrays; replaying a run's choices gives that run bit for bit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline_sim import EnvParams
from pipeline_sim.engine import simulate, texts_of
from pipeline_sim.episode import ACTION_KINDS, Episode
from pipeline_sim.kernel.state import AFTER, BEFORE, CANDIDATES, HELD, READY, RESERVE, START, WAITING
from pipeline_sim.model import DEFAULT_POLICY, ParameterError, Policy


def _replay(params: EnvParams, policy: Policy, sample: int, orders, memory_limit: float = 0.0) -> Episode:
    """Each deciding GPU starts the next task of ``orders`` when an action offers it, and waits otherwise."""
    episode = Episode(replace(params, dispatch="greedy", memory_limit=memory_limit), policy)
    episode.reset(sample)
    position = [0] * params.num_gpus
    while not episode.done:
        g = episode.gpu
        wanted = orders[g][position[g]]
        if wanted in episode.choices()[:-1]:
            episode.start_task(wanted)
            position[g] += 1
        else:
            episode.start_task(-1)
    assert position == [len(order) for order in orders]
    return episode


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v"])
@pytest.mark.parametrize("dispatch", ["greedy", "critical-path", "zb-adaptive"])
def test_replaying_a_dispatcher_gives_its_run(schedule: str, dispatch: str) -> None:
    params = EnvParams(n=8, num_gpus=4, schedule=schedule, compute_jitter=0.2, comm_jitter=0.2, seed=3,
                       slow_gpu=1, slow_factor=1.3)
    for sample in range(3):
        run = simulate(replace(params, dispatch=dispatch), DEFAULT_POLICY, sample)
        episode = _replay(params, DEFAULT_POLICY, sample, run.orders)
        assert episode.completion_time == run.completion_time
        F = episode.state[0]
        assert [t.start for t in run.tasks] == F[:, START].tolist()


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v"])
def test_replaying_the_static_order_gives_the_static_run(schedule: str) -> None:
    """Within a limit that admits the static order: a dispatcher takes a micro-batch's whole room on a GPU at its
    first forward there, which interleaved and V orders can exceed at their own peak (section 12.1)."""
    params = EnvParams(n=8, num_gpus=4, schedule=schedule, compute_jitter=0.3, comm_jitter=0.3, seed=5)
    for sample in range(4):
        run = simulate(params, DEFAULT_POLICY, sample)
        episode = _replay(params, DEFAULT_POLICY, sample, run.orders, memory_limit=100.0)
        assert episode.completion_time == run.completion_time
        assert [t.start for t in run.tasks] == episode.state[0][:, START].tolist()


def test_a_small_model_decides_in_its_own_time_unit() -> None:
    """A forward of 0.24 us runs in a power-of-two unit (docs/model.md section 9); an episode counts in it too and
    reports seconds: replaying greedy's run gives it to the bit."""
    from pipeline_sim.workload import Workload, workload_environment

    small = {"layers": 2, "hidden": 128, "heads": 4, "ffn_hidden": 512, "vocab": 1000, "seq_len": 64}
    params = replace(workload_environment(Workload(model=small, global_batch_size=16), num_gpus=2, schedule="zb-h1"),
                     compute_jitter=0.2, comm_jitter=0.2)
    assert params.time_unit < 1e-6
    run = simulate(replace(params, dispatch="greedy"), DEFAULT_POLICY, 1)
    episode = _replay(params, DEFAULT_POLICY, 1, run.orders)
    assert episode.completion_time == run.completion_time
    assert [t.start for t in run.tasks] == (episode.state[0][:, START] * episode.unit).tolist()
    assert 0 < episode.bound() <= run.completion_time


def test_masks_only_offer_what_can_start_and_random_play_always_finishes() -> None:
    rng = np.random.default_rng(0)
    for trial in range(40):
        params = EnvParams(n=int(rng.integers(2, 12)), num_gpus=int(rng.integers(2, 6)),
                           schedule=str(rng.choice(["1f1b", "zb-h1", "gpipe"])), compute_jitter=0.3,
                           comm_jitter=0.3, seed=trial, memory_limit=float(rng.choice([0.0, 1.0, 2.0, 3.0])))
        episode = Episode(params, DEFAULT_POLICY)
        episode.reset(trial)
        decisions = 0
        while not episode.done:
            out = episode.choices()
            mask = out >= 0
            assert mask.any()
            F, I, P = episode.state[:3]
            for action in np.flatnonzero(mask[:-1]):
                task = out[action]
                assert I[task, WAITING] == 0 and np.isnan(F[task, READY])  # its needs met, not yet taken
                assert P[HELD, episode.gpu] + I[task, RESERVE] <= episode.memory_units
            episode.step(int(rng.choice(np.flatnonzero(mask))))
            decisions += 1
        assert decisions >= sum(len(o) for o in episode.graph.orders)
        assert episode.completion_time >= episode.bound() - 1e-9


def test_the_action_names_the_kind_and_chunk() -> None:
    episode = Episode(EnvParams(n=4, num_gpus=2, schedule="zb-h1"), DEFAULT_POLICY)
    assert episode.actions == len(ACTION_KINDS) + 1
    episode.reset()
    assert episode.gpu == 0 and episode.now == 0.0
    out = episode.choices()
    assert texts_of(episode.graph, [out[ACTION_KINDS.index("F")]]) == ["0F0"]
    assert (out[:-1] >= 0).tolist() == [False, True, False]
    assert out[-1] < 0  # nothing is under way: waiting would stop the iteration
    with pytest.raises(ValueError, match="not possible"):
        episode.step(ACTION_KINDS.index("W"))
    assert Episode(EnvParams(schedule="zb-v"), DEFAULT_POLICY).actions == 3 * 2 + 1


def test_pairs_and_small_limits_are_refused_in_one_line() -> None:
    with pytest.raises(ParameterError, match="fb_overlap"):
        Episode(EnvParams(n=10, schedule="dualpipe-v", fb_overlap=0.2), DEFAULT_POLICY)
    with pytest.raises(ParameterError, match="memory_limit"):
        Episode(EnvParams(dispatch="greedy", memory_limit=0.5), DEFAULT_POLICY)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v"])
def test_each_gpus_candidates_are_its_tasks_whose_needs_are_met_and_not_yet_taken(schedule):
    """The list the dispatchers, a decision's choices and the observation read holds, at every decision of random
    episodes, exactly the GPU's compute tasks whose needs are met and that it has not taken, each once, linked
    both ways."""
    rng = np.random.default_rng(11)
    params = EnvParams(n=6, num_gpus=3, schedule=schedule, compute_jitter=0.3, comm_jitter=0.3, memory_limit=2.0)
    checked = 0
    for sample in range(3):
        episode = Episode(params, DEFAULT_POLICY)
        episode.reset(sample)
        while not episode.done:
            F, I, P = episode.state[:3]
            arrays = episode.arrays
            for s in range(params.num_gpus):
                listed, task, before = [], P[CANDIDATES, s], -1
                while task >= 0:
                    assert I[task, BEFORE] == before
                    listed.append(int(task))
                    before, task = task, I[task, AFTER]
                order = arrays.order_task[arrays.order_start[s]:arrays.order_start[s + 1]]
                expected = [int(t) for t in order if I[t, WAITING] == 0 and np.isnan(F[t, READY])]
                assert sorted(listed) == sorted(expected) and len(set(listed)) == len(listed)
                checked += len(listed)
            episode.step(int(rng.choice(np.flatnonzero(episode.mask()))))
    assert checked > 100
