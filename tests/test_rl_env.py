"""The Gymnasium environment over episodes (docs/model.md section 12.4)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("gymnasium")
from gymnasium.utils.env_checker import check_env  # noqa: E402

from pipeline_sim import EnvParams  # noqa: E402
from pipeline_sim.engine import simulate  # noqa: E402
from pipeline_sim.model import DEFAULT_POLICY, ParameterError  # noqa: E402
from pipeline_sim.rl import PipelineDispatchEnv  # noqa: E402

PARAMS = EnvParams(n=8, num_gpus=4, schedule="zb-h1", compute_jitter=0.2, comm_jitter=0.2, seed=7)


def _play(env: PipelineDispatchEnv, choose, **reset) -> tuple[list[np.ndarray], float, dict]:
    obs, info = env.reset(**reset)
    seen, total, done = [obs], 0.0, False
    while not done:
        obs, reward, done, truncated, info = env.step(choose(env))
        assert not truncated
        seen.append(obs)
        total += reward
    return seen, total, info


def test_the_environment_passes_gymnasiums_checker() -> None:
    check_env(PipelineDispatchEnv(PARAMS, DEFAULT_POLICY), skip_render_check=True)


def test_an_episode_returns_minus_its_iteration_time_and_observations_stay_in_bounds() -> None:
    env = PipelineDispatchEnv(PARAMS, DEFAULT_POLICY)
    rng = np.random.default_rng(1)
    for episode in range(20):
        seen, total, info = _play(env, lambda e: int(rng.choice(np.flatnonzero(e.action_masks()))),
                                  seed=episode)
        assert total == pytest.approx(-info["completion_time"], rel=1e-12)
        assert info["lower_bound"] <= info["completion_time"]
        assert all(env.observation_space.contains(obs) for obs in seen)


def test_the_same_seed_plays_the_same_episode() -> None:
    env = PipelineDispatchEnv(PARAMS, DEFAULT_POLICY)
    first = _play(env, lambda e: int(np.flatnonzero(e.action_masks())[-1]), seed=42)
    second = _play(env, lambda e: int(np.flatnonzero(e.action_masks())[-1]), seed=42)
    assert first[1] == second[1] and all(np.array_equal(a, b) for a, b in zip(first[0], second[0]))
    assert _play(env, lambda e: int(np.argmax(e.action_masks())), seed=43)[2]["sample"] != first[2]["sample"]


def test_evaluation_replays_the_sweeps_samples() -> None:
    """The first possible action is backward work, then F, then W: greedy's own choice on one chunk per GPU."""
    env = PipelineDispatchEnv(PARAMS, DEFAULT_POLICY, samples=range(3))
    greedy = replace(PARAMS, dispatch="greedy")
    for sample in range(3):
        info = _play(env, lambda e: int(np.argmax(e.action_masks())))[2]
        assert info["sample"] == sample
        assert info["completion_time"] == simulate(greedy, DEFAULT_POLICY, sample).completion_time


def test_the_relative_reward_is_the_share_of_static_zb_h1s_time_saved() -> None:
    env = PipelineDispatchEnv(PARAMS, DEFAULT_POLICY, samples=[5], reward="relative")
    total, info = _play(env, lambda e: int(np.argmax(e.action_masks())))[1:]
    static = simulate(PARAMS, DEFAULT_POLICY, 5).completion_time
    assert total == pytest.approx(1 - info["completion_time"] / static, abs=1e-12)


def test_an_impossible_action_takes_the_first_possible_one() -> None:
    env = PipelineDispatchEnv(PARAMS, DEFAULT_POLICY)
    env.reset(seed=0)
    masked = int(np.flatnonzero(~env.action_masks())[0])
    info = env.step(masked)[4]
    assert info["masked_action"] == masked


def test_bad_input_is_one_line() -> None:
    with pytest.raises(ParameterError, match="reward"):
        PipelineDispatchEnv(PARAMS, DEFAULT_POLICY, reward="speed")
    with pytest.raises(ParameterError, match="fb_overlap"):
        PipelineDispatchEnv(EnvParams(n=10, schedule="dualpipe-v", fb_overlap=0.2), DEFAULT_POLICY)
    with pytest.raises(ParameterError, match="samples"):
        PipelineDispatchEnv(PARAMS, DEFAULT_POLICY, samples=[])
    with pytest.raises(ParameterError, match="policy = 'foo': must be a Policy"):
        PipelineDispatchEnv(PARAMS, "foo")
    env = PipelineDispatchEnv(PARAMS, DEFAULT_POLICY)
    with pytest.raises(ParameterError, match="action = 0: comes before the episode has begun: reset it first"):
        env.step(0)
    with pytest.raises(ParameterError, match="episode = 'not begun': action_masks\\(\\) and step\\(\\) come after"):
        env.action_masks()
    env.reset()
    assert env.action_masks().any()


def test_a_missing_extra_is_named() -> None:
    code = "import sys; sys.modules['gymnasium'] = None\nimport pipeline_sim.rl"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert "pipeline_sim.rl needs the [rl] extra" in result.stderr
