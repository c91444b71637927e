"""Training a learned dispatcher (docs/model.md section 12.5): masked PPO (sb3-contrib's MaskablePPO) on a mix of
environments, the policy written as a policy file that ``dispatch = learned:<file>`` plays.

Every episode draws one of the environments and a fresh noise sample never used by a sweep. The reward is the
share of static ZB-H1's time saved on the same draw (``PipelineDispatchEnv``'s ``relative`` reward), which puts
environments of different lengths on one scale. Every ``evaluate_every`` steps the network is played exactly as
a sweep plays it, deterministically, on validation draws (neither training nor sweep samples); the best so far
is what the file keeps. Nothing here prints; progress goes to a callback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from .settings import Settings, missing_extra

try:
    import sb3_contrib  # noqa: F401
    import torch
except ImportError as error:  # one line naming the extra, not a traceback far from its cause
    raise ImportError(missing_extra(error.name or "a library")) from error

from ..engine import simulate
from ..episode import Episode
from ..learned import LearnedPolicy, play
from ..model import EnvParams, ParameterError, Policy
from ..parallel import interrupt_behind
from .env import PipelineDispatchEnv, reference_run

#: Validation draws: below the training stream (2^40 on) and far above any sweep's samples (0, 1, ...).
VALIDATION_SAMPLES = 2 ** 39
#: The static order a run is measured against, and the compiled rule shown beside the learned one.
REFERENCE = "zb-h1"
RULE = "greedy"
#: The wait action's logit starts this much below the others: about 1 decision in 60 waits at first, not 1 in 4, and
#: what waiting is worth is left to be learned.
WAIT_PRIOR = 3.0


@dataclass(frozen=True)
class Checkpoint:
    """One point of the training curve: after ``steps`` decisions, the mean return of the last episodes (the share
    of static ZB-H1's time saved, training draws) and the played network's mean saving on the validation draws,
    beside the compiled rule's on the same draws."""

    steps: int
    episodes: int
    training_saving: float
    validation_saving: float
    rule_saving: float


class MixedEnv(gym.Env):
    """One ``PipelineDispatchEnv`` per environment; each reset plays one of them, drawn from the seed stream."""

    metadata = {"render_modes": []}

    def __init__(self, environments: Sequence[EnvParams], policy: Policy) -> None:
        self.envs = [PipelineDispatchEnv(params, policy, reward="relative", reference=REFERENCE)
                     for params in environments]
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self.current = self.envs[0]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.current = self.envs[int(self.np_random.integers(len(self.envs)))]
        return self.current.reset(seed=int(self.np_random.integers(2 ** 62)), options=options)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return self.current.step(action)

    def action_masks(self) -> np.ndarray:
        return self.current.action_masks()


def vector_env(environments: Sequence[EnvParams], policy: Policy, copies: int, seed: int = 0) -> Any:
    """The vectorised form training steps: ``copies`` ``MixedEnv``s in one stable-baselines3 ``DummyVecEnv`` (masks
    read through ``env_method("action_masks")``), each seeded apart."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    def make(k: int) -> Callable[[], gym.Env]:
        def build() -> gym.Env:
            env = MixedEnv(environments, policy)
            env.reset(seed=seed * 1000 + k)
            return env
        return build

    vector = DummyVecEnv([make(k) for k in range(copies)])
    vector.seed(seed)
    return vector


def check_layouts(environments: Sequence[EnvParams]) -> None:
    """One network reads every environment: they must share the observation and the actions."""
    if not environments:
        raise ParameterError("environments", "[]", "must list at least one environment to train on")
    first = Episode.layout(environments[0])
    for params in environments:
        if params.fb_overlap > 0:
            raise ParameterError("fb_overlap", params.fb_overlap, "an episode decides single tasks: "
                                 "overlapped forward/backward pairs cannot be learned; use 0")
        Episode(params, Policy())  # a memory limit too small for a micro-batch, say, is refused here
        if Episode.layout(params) != first:
            raise ParameterError("schedule", params.schedule,
                                 f"has {len(Episode.layout(params)[1])} actions on {params.num_gpus} GPUs where "
                                 f"{environments[0].schedule} has {len(first[1])}: one network plays one layout; "
                                 "train schedules of different chunk counts apart")


def extract(model: Any, fields: tuple[str, ...], actions: tuple[str, ...], about: dict) -> LearnedPolicy:
    """The actor of a MaskablePPO ``model`` as plain arrays: its hidden layers, then the action layer."""
    linear = [m for m in model.policy.mlp_extractor.policy_net if isinstance(m, torch.nn.Linear)]
    linear.append(model.policy.action_net)
    layers = tuple((m.weight.detach().cpu().numpy().T.astype(np.float64).copy(),
                    m.bias.detach().cpu().numpy().astype(np.float64).copy()) for m in linear)
    return LearnedPolicy(layers, fields, actions, about)


def savings(environments: Sequence[EnvParams], policy: Policy, learned: LearnedPolicy | None,
            samples: Sequence[int]) -> float:
    """Mean share of static ZB-H1's time saved over ``environments`` and ``samples`` (``reference_run``: a table's own
    schedule's): by ``learned`` played, or by the compiled rule when ``learned`` is None."""
    shares = []
    for params in environments:
        reference = reference_run(params, REFERENCE)
        episode = Episode(params, policy)
        for sample in samples:
            base = simulate(reference, policy, sample).completion_time
            if learned is None:
                time = simulate(replace(params, dispatch=RULE), policy, sample).completion_time
            else:
                time = play(episode, learned, sample).completion_time
            shares.append(1.0 - time / base)
    return math.fsum(shares) / len(shares)


def train(environments: Sequence[EnvParams], policy: Policy, settings: Settings = Settings(), *,
          about: dict | None = None,
          progress: Callable[[int, Checkpoint | None], None] | None = None
          ) -> tuple[LearnedPolicy, list[Checkpoint], bool]:
    """Train on ``environments`` (each with its own jitter, straggler and memory limit) under the transfer
    priorities of ``policy``; return the best network seen at the checkpoints, the training curve, and whether
    training ran to the end (Ctrl-C stops it early with what it has).
    ``progress(steps, checkpoint)`` is called as steps are taken, with a ``Checkpoint`` at each evaluation."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger

    check_layouts(environments)
    torch.set_num_threads(1)  # a small network: one thread is faster than several contending
    fields, actions = Episode.layout(environments[0])
    note: dict = dict(about or {}) | {"steps": settings.steps, "seed": settings.seed, "reward": "relative",
                                 "reference": REFERENCE, "policy": policy.label}
    validation = [VALIDATION_SAMPLES + k for k in range(settings.validation_samples)]
    rule = savings(environments, policy, None, validation)

    vector = vector_env(environments, policy, settings.environments_per_update, settings.seed)
    model = MaskablePPO("MlpPolicy", vector, n_steps=settings.rollout, batch_size=settings.batch_size,
                        n_epochs=settings.epochs, learning_rate=settings.learning_rate, ent_coef=settings.entropy,
                        gamma=1.0, gae_lambda=0.95, seed=settings.seed, device="cpu", verbose=0,
                        policy_kwargs={"net_arch": {"pi": list(settings.hidden), "vf": list(settings.hidden)}})
    # a logger that writes nowhere: the library's default makes an empty folder in the system's temporary directory
    # on every run, and the progress reported here is all the run says
    model.set_logger(Logger(folder=None, output_formats=[]))
    with torch.no_grad():  # a prior against waiting, which most decisions allow and which, at random, stalls
        bias = model.policy.action_net.bias
        assert isinstance(bias, torch.Tensor)
        bias[-1] -= WAIT_PRIOR
    curve: list[Checkpoint] = []
    best: list[tuple[float, LearnedPolicy]] = []
    returns: list[float] = []

    def checkpoint_at(steps: int) -> Checkpoint:
        """The network as trained so far, played on the validation draws, and kept when it is the best yet."""
        played = extract(model, fields, actions, note | {"trained_steps": steps})
        saving = savings(environments, policy, played, validation)
        recent = returns[-200:]
        point = Checkpoint(steps, len(returns), math.fsum(recent) / len(recent) if recent else math.nan, saving, rule)
        curve.append(point)
        if not best or saving > best[0][0]:
            best[:] = [(saving, played)]
        if progress is not None:
            progress(steps, point)
        return point

    class Report(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_evaluation = 0
            # a checkpoint due on a rollout's last decision waits until the network is trained on that rollout
            self.deferred = False
            self.updated = False  # whether the network was trained on a rollout since the last checkpoint

        def _on_rollout_start(self) -> None:  # the rollout before is trained on
            if self.deferred:
                self.deferred = self.updated = False
                checkpoint_at(self.num_timesteps)

        def _on_rollout_end(self) -> None:  # a full rollout, which the network is trained on next
            self.updated = True

        def _on_step(self) -> bool:
            for info, done in zip(self.locals["infos"], self.locals["dones"]):
                if done and "completion_time" in info:
                    returns.append(1.0 - info["completion_time"] / info["reference_time"])
            steps = self.num_timesteps
            last = model.rollout_buffer.pos == model.n_steps - 1  # this decision fills the rollout
            due = steps >= self.next_evaluation
            if due:
                self.next_evaluation += settings.evaluate_every
                self.deferred = last
            if due and not last:
                self.updated = False
                checkpoint_at(steps)
            elif progress is not None:
                progress(steps, None)
            # ``steps`` decisions, not a whole rollout past them: collecting stops there, and the rollout is
            # trained on only when it is full
            return steps < settings.steps or last

    report = Report()
    try:
        model.learn(total_timesteps=settings.steps, callback=report)
    except (KeyboardInterrupt, SystemError) as error:  # the best network so far is a result: the caller writes it
        interrupt = interrupt_behind(error)
        if interrupt is None:
            raise
        if not best:
            raise interrupt from None
        return best[0][1], curve, False
    # the last update ended after the last checkpoint, or the run stopped between two
    if report.updated or curve[-1].steps < model.num_timesteps:
        checkpoint_at(model.num_timesteps)
    return best[0][1], curve, True
