"""An iteration run one decision at a time (docs/model.md section 12.4): the kernel's event loop stops wherever a
free GPU must choose its next compute task, hands the choice to the caller, and continues from its own arrays.

This is what a learned scheduler trains on; it is the same loop as every other run, under the rule ``EXTERNAL``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import numba
import numpy as np

from .engine import (
    Share,
    activation_units,
    claim_shares,
    compile_shared,
    dispatch_arguments,
    figure_columns,
    graph_arrays,
    in_unit,
    kernel,
    kernel_is_compiled,
    lower_bound,
    memory_in_force,
    policy_arrays,
    schedule_of,
)
from .kernel.observation import GPU_WIDTH
from .kernel.state import DONE_COUNT
from .model import EnvParams, ParameterError, Policy, Schedule
from .taskgraph import TaskGraph, build_task_graph, check_size, graph_structure, task_lengths

_EXTERNAL = kernel.EXTERNAL
#: The kinds of compute an action names, in the order dispatchers rank them (section 12.1).
ACTION_KINDS = ("B/I", "F", "W")
#: What the observation holds for each GPU of the window, deciding GPU's upstream neighbour, itself and its
#: downstream neighbour (``kernel.observation``), then for the run, then the action mask (section 12.4).
GPU_FIELDS = ("present", "busy", "busy_left", "idle_for", "held", "ready_backward", "ready_forward", "ready_weight",
              "progress", "sends_queued", "send_rate")
WINDOW = ("up", "self", "down")
GLOBAL_FIELDS = ("time", "gpu_position", "tasks_done", "can_wait")
assert len(GPU_FIELDS) == GPU_WIDTH


def action_names(chunks: int) -> tuple[str, ...]:
    return (*(f"{kind}.{chunk}" for kind in ACTION_KINDS for chunk in range(chunks)), "wait")


def observation_fields(actions: int) -> tuple[str, ...]:
    """The observation's fields, in order, for an episode of ``actions`` actions."""
    return (*(f"{place}.{field}" for place in WINDOW for field in GPU_FIELDS), *GLOBAL_FIELDS,
            *(f"mask.{i}" for i in range(actions)))


#: The observation of one chunk per GPU (four actions); ``Episode.fields`` in general.
OBSERVATION_FIELDS = observation_fields(len(ACTION_KINDS) + 1)


class Episode:
    """One iteration of ``params`` under ``policy``, decided step by step.

    An action names a kind of compute (``ACTION_KINDS``) on one of the deciding GPU's chunks: ``kind * chunks +
    chunk``; it starts the lowest ready micro-batch of that kind there. The last action, ``wait``, starts nothing
    until the next event. ``mask()`` says which are possible now: a task exists, fits the memory limit, and
    waiting leaves something under way. ``params``' memory limit holds as a dispatcher's (section 12.1).
    """

    def __init__(self, params: EnvParams, policy: Policy, *, segment_room: int = 0, allow_large: bool = False) -> None:
        if not isinstance(policy, Policy):
            raise ParameterError("policy", policy, "must be a Policy, such as Policy() or Policy(priorities={...})")
        if not allow_large:  # refused before anything is built, as every entry point of the library refuses it
            check_size(params, " (allow_large=True to try anyway)")
        if params.fb_overlap > 0:
            raise ParameterError("fb_overlap", params.fb_overlap, "an episode decides single tasks: overlapped "
                                 "forward/backward pairs (fb_overlap > 0) cannot be split into decisions; use 0")
        self.params = replace(params, dispatch="greedy")  # the graph and memory a dispatcher runs with
        self.chunks = self.params.v
        self.fields, self.action_names = self.layout(self.params)
        self.actions = len(self.action_names)
        self.arrays = graph_arrays(self.params)
        self.memory_limit = memory_in_force(self.params)
        memory = dispatch_arguments(self.params)[2]
        stage_chunk = graph_structure(self.params).stage_chunk
        choosable = (self.arrays.kind_class >= 0) & (self.arrays.kind_class < len(ACTION_KINDS))  # not a step
        key = np.where(choosable,
                       self.arrays.kind_class * self.chunks + stage_chunk[self.arrays.stage], 0).astype(float)
        key.flags.writeable = False  # as every graph array: the compiled functions the kernel shares take it so
        tiers, priorities = policy_arrays((policy,))
        a = self.arrays
        self._structure = (*a[:15], a.falls, key, _EXTERNAL, memory, tiers[0], priorities[0],
                           params.ingress_capacity, segment_room)
        self.segment_room = segment_room  # segments recorded; ``segment_count`` says how many there were
        self.memory_units = memory
        self._out = np.full(self.actions, -1, dtype=np.int64)
        self._fresh = False
        self.sample = 0
        self.unit = self.params.time_unit  # the kernel counts in it; ``now`` and ``completion_time`` do not
        self.clock = 0.0  # ``now`` in the kernel's unit
        compute = self.arrays.kind_class >= 0
        # observed times count in mean compute tasks, the run's time in its lower bound
        self._task_time = float(np.mean(task_lengths(self.params)[compute])) / self.unit
        self._bound = 1.0
        self.segment_count = 0
        self.gpu = -1
        self.status = kernel.DONE
        self.started = False  # whether a draw was begun (``reset``, ``play``, ``look_ahead``)

    @property
    def graph(self) -> TaskGraph:
        """The task graph the episode runs, as records (the run itself reads its arrays)."""
        return build_task_graph(self.params)

    @staticmethod
    def layout(params: EnvParams) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The observation's fields and the actions of ``params``' episodes."""
        actions = action_names(params.v)
        return observation_fields(len(actions)), actions

    def _draw(self, sample: int, lengths: np.ndarray | None = None) -> None:
        self.sample = sample
        self.started = True
        work = task_lengths(self.params, sample, lengths)
        self.lengths = in_unit(work, self.unit)
        # the bound of the parameters' own draw (``bound``): of the work just drawn, unless given work replaced it
        bound = lower_bound(self.params, sample, work) if lengths is None else self.bound()
        self._bound = max(self._task_time, bound / self.unit)

    def reset(self, sample: int = 0) -> None:
        """Begin the ``sample``-th noise draw of the environment at time 0 and run to the first decision."""
        self._draw(sample)
        a = self.arrays
        self._state = kernel.prepare(self.lengths, a.gpu, a.receiver, a.comm, a.stage, a.index, a.impact,
                                     a.needs_count, a.kind_class, a.reserve, a.falls, self._structure[16],
                                     self.params.num_gpus, self._structure[19], self._structure[20],
                                     self._structure[-1], np.empty(0, dtype=np.int64))
        F, I, P, _, Q, _, _, C, _, _, _, _, K, _ = self._state
        kernel.begin(_EXTERNAL, F, I, P, Q, K, C, a.release_start, a.release_task, a.order_start, a.order_task)
        self.clock = 0.0
        self._run()

    def play(self, sample: int, weights: np.ndarray, biases: np.ndarray, shapes: np.ndarray) -> None:
        """The ``sample``-th draw run to its end inside the compiled loop, every decision the network's
        (``kernel.act``: the layers ``shapes``, ``weights`` and ``biases``), a decision with one possible action
        taken without asking it: what ``reset`` and a ``step`` per decision by ``kernel.act`` give, the same
        bits."""
        self._draw(sample)
        s = self._structure
        self.status, self.clock, segments, self._state = kernel.play(
            self.lengths, *s[:17], *s[18:23], self._task_time, self._bound, len(self.fields), self.actions, weights,
            biases, shapes)
        self.segment_count = int(segments)
        self._fresh = False
        self.gpu = -1
        if self.status != kernel.DONE:
            raise RuntimeError("the episode is stuck: every GPU waited with nothing under way")

    def look_ahead(self, sample: int, lengths: np.ndarray | None = None, progress: np.ndarray | None = None) -> int:
        """The ``sample``-th draw run to its end inside the compiled loop, every decision the look-ahead's
        (docs/model.md section 12.7); returns how many copies it ran to the end. ``lengths``, every task's work
        (``engine.given_lengths``), runs instead of the parameters' own, their noise on top; the look-ahead still
        expects the parameters' own. ``progress[0]``, if given, is kept at the tasks ended while it runs."""
        self._draw(sample, lengths)
        s = self._structure
        expected = in_unit(task_lengths(replace(self.params, compute_jitter=0.0, comm_jitter=0.0)), self.unit)
        self.status, self.clock, segments, self._state, rollouts = kernel.look_ahead(
            self.lengths, *s[:17], *s[18:23], expected, self.actions,
            np.zeros(1) if progress is None else progress)
        self.segment_count = int(segments)
        self._fresh = False
        self.gpu = -1
        if self.status != kernel.DONE:
            raise RuntimeError("the look-ahead's run is stuck")
        return int(rollouts)

    def _run(self) -> None:
        result = kernel.simulate(self.lengths, *self._structure, self._state, self.clock)
        self.status, self.clock, self.gpu = int(result[0]), float(result[7]), int(result[8])
        self.segment_count = int(result[3])
        self._fresh = False
        if self.status == kernel.DONE:
            self.gpu = -1
        elif self.status == kernel.STUCK:
            raise RuntimeError("the episode is stuck: every GPU waited with nothing under way")

    @property
    def now(self) -> float:
        return self.clock * self.unit

    @property
    def done(self) -> bool:
        return self.status == kernel.DONE

    def choices(self) -> np.ndarray:
        """Per action, the task it would start on the deciding GPU (-1: not possible; the last entry, wait: 0 when
        possible)."""
        if not self._fresh:  # the state moves only in ``_run``
            F, I, P = self._state[:3]
            a = self.arrays
            kernel.choices(self.gpu, self.memory_units, F, I, P, a.order_start, a.order_task, self._out)
            self._fresh = True
        return self._out

    def mask(self) -> np.ndarray:
        return self.choices() >= 0

    def checked_action(self, action: object) -> int:
        """``action`` as the index of one of this episode's actions: a whole number (a numpy integer is one) from 0
        to ``actions`` - 1, while the episode runs; ``ParameterError`` naming it otherwise."""
        if isinstance(action, np.ndarray) and action.shape == ():
            action = action.item()
        if isinstance(action, bool) or not isinstance(action, (int, np.integer)) or \
                not 0 <= action < self.actions:
            raise ParameterError("action", action, f"must be a whole number from 0 to {self.actions - 1} (one of "
                                                   f"{', '.join(self.action_names)})")
        if not self.started:
            raise ParameterError("action", int(action), "comes before the episode has begun: reset it first")
        if self.done:
            raise ParameterError("action", int(action), "comes after the episode's end: reset it first")
        return int(action)

    def step(self, action: int) -> None:
        """The deciding GPU takes ``action`` (it must be possible), and the loop runs to the next decision or the
        end."""
        action = self.checked_action(action)
        task = int(self.choices()[action]) if action < self.actions - 1 else -1
        if action >= self.actions - 1 and self._out[-1] < 0 or action < self.actions - 1 and task < 0:
            raise ValueError(f"action {action} is not possible for GPU {self.gpu} now (mask: "
                             f"{self.mask().astype(int).tolist()})")
        F, I, P, _, Q, _, _, C, _, _, _, _, K, _ = self._state
        a = self.arrays
        kernel.decision(self.gpu, task, self.clock, _EXTERNAL, F, I, P, Q, K, C, a.release_start, a.release_task,
                        a.order_start, a.order_task)
        self._run()

    def start_task(self, task: int) -> None:
        """The deciding GPU starts ``task`` (a task index of the graph), or waits with -1: for replaying a run's
        order through the same decisions an action makes."""
        if task < 0:
            self.step(self.actions - 1)
            return
        out = self.choices()
        hits = np.flatnonzero(out[:-1] == task)
        if len(hits) == 0:
            raise ValueError(f"task {task} is not the lowest ready of its kind on GPU {self.gpu}")
        self.step(int(hits[0]))

    @property
    def tasks_done(self) -> int:
        return int(self._state[7][DONE_COUNT])

    @property
    def completion_time(self) -> float:
        return float(np.max(self._state[0][:, kernel.END])) * self.unit

    def bound(self) -> float:
        return lower_bound(self.params, self.sample)

    def observe(self) -> np.ndarray:
        """The deciding GPU's view (``fields``), every figure in [0, 1]: its window's GPUs (section 12.4), the time
        against the run's lower bound (capped at ten bounds), the GPU's place in the pipeline, the share of tasks
        done, and the mask."""
        F, I, P, _, Q = self._state[:5]
        a = self.arrays
        out = np.zeros(len(self.fields))
        kernel.observe(self.gpu, self.clock, self._task_time, self.memory_units, F, I, P, Q, a.order_start,
                       a.order_task, out)
        mask = self.mask()
        base = len(WINDOW) * GPU_WIDTH
        out[base] = min(10.0, self.clock / self._bound) / 10.0
        out[base + 1] = self.gpu / max(1, P.shape[1] - 1)
        out[base + 2] = self.tasks_done / F.shape[0]
        out[base + 3] = float(mask[-1])
        out[base + 4:] = mask
        return out

    def figures(self) -> np.ndarray:
        """The finished run's figures, as one row of ``engine.simulate_figures``."""
        F, I = self._state[:2]
        a, p = self.arrays, self.params.num_gpus
        out = np.empty(3 + 3 * p)
        kernel.figures(a.gpu, a.comm, a.rises, a.falls, p, activation_units(self.params), *figure_columns(F, I), out)
        out[:2] *= self.unit
        out[3:3 + 2 * p] *= self.unit
        return out

    @property
    def state(self) -> tuple:
        """The kernel's arrays (``kernel.simulate``'s ``F, I, P, ...``), read-only by convention."""
        return self._state


def episode_schedule(params: EnvParams, policy: Policy, sample: int, run: Callable[[Episode], object],
                     lengths: np.ndarray | None = None) -> Schedule:
    """The episode of ``params``' draw ``sample`` under ``policy`` that ``run`` takes to its end, as
    ``engine.simulate`` gives a run: every segment kept (the same decisions again, with more room, when the first
    room fell short); ``lengths``, the noise-free work ``run`` gave the tasks instead of the parameters'."""
    room = 4 * len(graph_arrays(replace(params, dispatch="greedy")).gpu) + 64
    episode = Episode(params, policy, segment_room=room, allow_large=True)
    run(episode)
    if episode.segment_count > room:
        episode = Episode(params, policy, segment_room=episode.segment_count, allow_large=True)
        run(episode)
    F, I, P = episode.state[:3]
    seg_task, seg_times = episode.state[10:12]
    kept = episode.segment_count
    work = None if lengths is None else task_lengths(params, sample, lengths)
    return schedule_of(params, policy, sample, episode.status, F, I, P, seg_task[:kept], seg_times[:, :kept],
                       memory=episode.memory_limit, lengths=work)


#: About how long ``compile_episode`` takes into an empty cache on a 2-core machine (said while waiting).
EPISODE_COMPILE_SECONDS = 9


def compile_episode() -> None:
    """Compile the kernel's step-by-step entry points and the observation, or load them from the cache (a damaged
    entry is compiled again, ``compile_cache``), as ``engine.compile_kernel`` does the rest of the kernel: the
    first time on an installation, shared with a second process (``engine.compile_shared``)."""
    if not getattr(numba.config, "DISABLE_JIT") and not kernel_is_compiled(("episodes",)):
        compile_shared(_episode_shares)
    for share in _episode_entries():
        share.compile()


def _episode_shares(claims: Path, other_alive: Callable[[], bool]) -> None:
    claim_shares(claims, _episode_entries(), other_alive)


def _episode_entries() -> list[Share]:
    """What ``compile_episode`` compiles, in shares by the entry points they reach: the compiled play, by a network
    of one layer of zeros (in 32 bits, as a trained network's weights are packed); an episode's first steps, and its
    observation; the look-ahead."""
    params = EnvParams(n=2, num_gpus=2)

    def play() -> None:
        episode = Episode(params, Policy())
        width = len(episode.fields)
        episode.play(0, np.zeros(width * episode.actions, dtype=np.float32), np.zeros(episode.actions),
                     np.array([[width, episode.actions]], dtype=np.int64))

    def steps() -> None:
        episode = Episode(params, Policy())
        episode.reset()
        episode.observe()
        episode.step(int(np.flatnonzero(episode.mask())[0]))
    # the look-ahead runs its copies by ``kernel.simulate`` from a state, as the steps do: compiled once
    return [Share("play", play), Share("steps", steps),
            Share("look_ahead", lambda: Episode(params, Policy()).look_ahead(0), ("steps",))]
