"""``PipelineDispatchEnv``: one episode is one training iteration; one step is one GPU's choice of its next
compute task (docs/model.md section 12.4), made on the kernel's own state.

The observation is ``Episode.observe``'s (``episode.OBSERVATION_FIELDS``), as float32.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from ..engine import bound_of_run, simulate
from ..episode import Episode
from ..model import EnvParams, ParameterError, Policy

#: The training draws' sample numbers start here, so that no training draw is a sweep's (samples 0, 1, ...).
TRAINING_SAMPLES = 2 ** 40
REWARDS = ("time", "relative")


def reference_run(params: EnvParams, schedule: str) -> EnvParams:
    """The static order a ``relative`` reward is measured against: ``schedule``'s in ``params``' environment, or in
    an environment of a table of lengths its own schedule's (the only one whose tasks its table holds)."""
    return replace(params, schedule=params.schedule if params.lengths else schedule, dispatch="static",
                   memory_limit=0.0)


def reference_name(environments: Sequence[EnvParams], schedule: str) -> str:
    """What ``reference_run`` measures ``environments`` against, in words."""
    tables = sum(bool(params.lengths) for params in environments)
    if tables == 0:
        return f"static {schedule}"
    return "each table's static order" if tables == len(environments) else \
        f"static {schedule} (a table's environment: its own static order)"


class PipelineDispatchEnv(gym.Env):
    """The dispatch decisions of ``params`` under ``policy`` as a Gymnasium environment.

    ``samples``: the noise draws to play, in turn (evaluation: the sweep's own samples, 0 to k - 1, for common
    random numbers with its rows); ``None`` (training) draws a fresh sample from the environment's seed stream at
    every reset, never one a sweep uses. ``reward``: ``time`` (each step minus the time until the next decision,
    so an episode returns minus its iteration time) or ``relative`` (the same over static ``reference``'s time on
    the same draw, plus 1 at the end: the share of the reference's time saved; ``reference_run``). An action the
    mask forbids takes the first possible action instead (``info["masked_action"]`` says so), as a greedy
    dispatcher would; an action outside the action space, or a step after the episode's end, is a
    ``ParameterError``. An environment of more tasks than fit in memory is refused at once, unless
    ``allow_large``.
    """

    metadata = {"render_modes": []}

    def __init__(self, params: EnvParams, policy: Policy, *, samples: Sequence[int] | None = None,
                 reward: str = "time", reference: str = "zb-h1", allow_large: bool = False) -> None:
        if reward not in REWARDS:
            raise ParameterError("reward", reward, f"is one of {', '.join(REWARDS)}")
        self.episode = Episode(params, policy, allow_large=allow_large)
        self.params, self.policy = params, policy
        self.samples = None if samples is None else [int(s) for s in samples]
        if self.samples is not None and not self.samples:
            raise ParameterError("samples", "[]", "lists at least one sample, or is None for fresh draws")
        self.reward_kind, self.reference = reward, reference
        episode = self.episode
        self.fields = episode.fields
        self.action_space = gym.spaces.Discrete(episode.actions)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (len(self.fields),), dtype=np.float32)
        self._next = 0
        self._scale = 1.0
        self._mask = np.zeros(self.episode.actions, dtype=bool)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if options and "sample" in options:
            sample = int(options["sample"])
        elif self.samples is None:
            sample = int(self.np_random.integers(TRAINING_SAMPLES, 2 ** 62))
        else:
            sample = self.samples[self._next % len(self.samples)]
            self._next += 1
        self.episode.reset(sample)
        self._scale = 1.0
        if self.reward_kind == "relative":
            self._scale = simulate(reference_run(self.params, self.reference), self.policy, sample).completion_time
        self._mask = self.episode.mask()
        return self._observe(), {"sample": sample, "action_mask": self._mask.copy()}

    def action_masks(self) -> np.ndarray:
        """Which actions are possible now (for masked policies); ``ParameterError`` before the first ``reset``."""
        if not self.episode.started:
            raise ParameterError("episode", "not begun", "action_masks() and step() come after reset()")
        return self._mask.copy()

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        episode = self.episode
        before = episode.now
        action = episode.checked_action(action)
        info: dict[str, Any] = {"sample": episode.sample}
        if not self._mask[action]:  # an unmasked agent's impossible choice: the first possible one instead
            info["masked_action"] = action
            action = int(np.argmax(self._mask))
        episode.step(action)
        if episode.done:
            end = episode.completion_time
            reward = -(end - before) / self._scale
            info.update(completion_time=end, lower_bound=bound_of_run(episode.bound(), end, episode.params))
            if self.reward_kind == "relative":
                reward += 1.0
                info["reference_time"] = self._scale
            self._mask = np.zeros(episode.actions, dtype=bool)
            return np.zeros(len(self.fields), dtype=np.float32), reward, True, False, info
        self._mask = episode.mask()
        info["action_mask"] = self._mask.copy()
        return self._observe(), -(episode.now - before) / self._scale, False, False, info

    def _observe(self) -> np.ndarray:
        return self.episode.observe().astype(np.float32)
