"""Simulating an environment: the task graph as arrays, handed to the compiled kernel (``kernel.py``).

``simulate`` returns every task's timeline (for charts, traces, the validator and the
API); ``simulate_figures`` returns only the figures a sweep keeps, for many policies in
one kernel call. Both run the same kernel; neither asks which schedule built the graph.
"""

from __future__ import annotations

import math
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

import llvmlite.binding
import numba
import numpy as np

from . import compile_cache
from .model import COMM_KINDS, SAMPLES, EnvParams, Policy, Schedule, Task, TaskKind
from .taskgraph import GraphTask, TaskGraph, build_task_graph, check_size, task_lengths

compile_cache.ensure_writable()  # before the kernel's functions look for a place to keep their machine code
from . import kernel  # noqa: E402

compile_cache.tolerate_damage(kernel)
_COMM_NUMBER = {kind: number for number, kind in enumerate(COMM_KINDS)}
_FALLS = (TaskKind.BACKWARD, TaskKind.BACKWARD_WEIGHT)


#: How long the first compile of the kernel takes on a 2-core machine (benchmarks/bench.py).
COMPILE_SECONDS = 30


class SimulationStuckError(RuntimeError):
    """Nothing can progress although tasks remain; the message names them."""


class GraphArrays(NamedTuple):
    """A task graph's structure as the kernel reads it; ``*_start``/``*_task`` pairs are compressed rows.

    Per task: its GPU, receiver (-1: none), transfer kind number (-1: compute), stage,
    index, compute impact, how many tasks it waits for, the forward parts starting with it
    (``rises``) and the backward or weight-gradient parts ending with it (``falls``).
    """

    gpu: np.ndarray
    receiver: np.ndarray
    comm: np.ndarray
    stage: np.ndarray
    index: np.ndarray  # type: ignore[assignment]  # shadows tuple.index, as GraphTask's
    impact: np.ndarray
    needs_count: np.ndarray
    release_start: np.ndarray
    release_task: np.ndarray
    order_start: np.ndarray
    order_task: np.ndarray
    peer_start: np.ndarray
    peer_task: np.ndarray
    rises: np.ndarray
    falls: np.ndarray

    def kernel_arguments(self, lengths: np.ndarray) -> tuple:
        """The graph arguments of ``kernel.simulate``, from ``length`` to ``peer_task``."""
        return (lengths, *self[:13])


def _rows(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in lists], out=starts[1:])
    return starts, np.array([x for row in lists for x in row], dtype=np.int64)


@lru_cache(maxsize=256)
def graph_arrays(params: EnvParams) -> GraphArrays:
    """The arrays of ``params``' task graph (its structure: the same for every noise draw)."""
    graph = build_task_graph(params)
    tasks = graph.tasks
    ints = lambda values: np.array(values, dtype=np.int64)  # noqa: E731
    arrays = GraphArrays(
        ints([t.gpu for t in tasks]), ints([-1 if t.receiver is None else t.receiver for t in tasks]),
        ints([_COMM_NUMBER.get(t.kind, -1) for t in tasks]), ints([t.stage for t in tasks]),
        ints([t.index for t in tasks]), np.array([t.impact for t in tasks], dtype=float),
        ints([len(needs) for needs in graph.needs]), *_rows(graph.releases), *_rows(graph.orders),
        *_rows(graph.peers), *activation_changes(tasks))
    for array in arrays:
        array.flags.writeable = False
    return arrays


def activation_changes(tasks: Sequence[GraphTask | Task]) -> tuple[np.ndarray, np.ndarray]:
    """Per task, the forward parts that start with it and the backward or weight-gradient parts that end with
    it: the rises and falls of its GPU's activations (docs/model.md section 7)."""
    return (np.array([sum(part.kind is TaskKind.FORWARD for part in t.parts) for t in tasks], dtype=np.int64),
            np.array([sum(part.kind in _FALLS for part in t.parts) for t in tasks], dtype=np.int64))


@lru_cache(maxsize=64)
def policy_arrays(policies: tuple[Policy, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per policy and transfer kind (``COMM_KINDS`` order): exclusive tier rank (0 = 'a', -1 shared), priority."""
    tiers = np.full((len(policies), len(COMM_KINDS)), -1, dtype=np.int64)
    priorities = np.zeros((len(policies), len(COMM_KINDS)))
    for row, policy in enumerate(policies):
        letters = sorted(set(policy.exclusive_tiers.values()))
        for k, kind in enumerate(COMM_KINDS):
            tier = policy.tier(kind)
            tiers[row, k] = -1 if tier is None else letters.index(tier)
            priorities[row, k] = policy.shared_priority(kind)
    return tiers, priorities


def simulate(params: EnvParams, policy: Policy, sample: int = 0) -> Schedule:
    """Simulate one iteration of ``params`` under ``policy``: the ``sample``-th draw of its noise, if any."""
    graph = build_task_graph(params, sample)
    arrays = graph_arrays(params)
    lengths = task_lengths(params, sample)
    tiers, priorities = policy_arrays((policy,))
    room = 4 * len(lengths) + 64
    while True:
        status, F, I, segment_count, seg_task, seg_times, P = kernel.simulate(
            *arrays.kernel_arguments(lengths), tiers[0], priorities[0], params.ingress_capacity, room)
        if segment_count <= room:
            break
        room = segment_count  # the same run again, with room for every segment
    ready, start, end = F[kernel.READY].tolist(), F[kernel.START].tolist(), F[kernel.END].tolist()
    if status == kernel.STUCK:
        raise SimulationStuckError(_stuck_message(graph, ready, end, P[kernel.NEXT].tolist(),
                                                  P[kernel.BUSY].tolist()))
    segments: list[list[tuple[float, float, float]]] = [[] for _ in graph.tasks]
    for i, t0, t1, rate in zip(seg_task.tolist(), *seg_times.tolist()):
        segments[i].append((t0, t1, rate))
    throttled = (I[kernel.THROTTLED] == 1).tolist()
    tasks = [Task(spec.kind, spec.gpu, spec.stage, spec.index, spec.length, spec.receiver, spec.parts, r, s, e,
                  flag, wait, stretch)
             for spec, r, s, e, flag, wait, stretch in zip(graph.tasks, ready, start, end, throttled,
                                                          F[kernel.THROTTLED_TIME].tolist(), segments)]
    return Schedule(params=params, policy=policy, tasks=tasks, completion_time=max(end), sample=sample)


def simulate_figures(params: EnvParams, policies: Sequence[Policy], sample: int = 0) -> np.ndarray:
    """The figures of ``kernel.figures`` for every policy of ``policies`` in draw ``sample``, one row each."""
    arrays = graph_arrays(params)
    tiers, priorities = policy_arrays(tuple(policies))
    out = kernel.simulate_policies(*arrays.kernel_arguments(task_lengths(params, sample)), arrays.rises,
                                   arrays.falls, params.v, tiers, priorities, params.ingress_capacity)
    stuck = np.isnan(out[:, 0])
    if stuck.any():
        simulate(params, policies[int(np.argmax(stuck))], sample)  # raises, naming what waits
    return out


def _kernel_stamp() -> str:
    """What numba's cached kernel depends on: its source, numba, Python and the CPU."""
    source = os.stat(kernel.__file__)
    return " ".join(map(str, (source.st_mtime_ns, source.st_size, numba.__version__, sys.version_info[:2],
                              llvmlite.binding.get_host_cpu_name())))


def _stamp_path() -> Path:
    return compile_cache.cache_folder(kernel) / "pipeline_sim_kernel.stamp"


def kernel_is_compiled() -> bool:
    """Whether this installation has compiled the kernel before: the next use then loads it in a second.

    Numba caches the machine code beside the package, or in a user directory when the
    package is read-only; a stamp there records a completed compile.
    """
    if getattr(numba.config, "DISABLE_JIT"):
        return True
    try:
        return _stamp_path().read_text() == _kernel_stamp()
    except OSError:
        return False


def compile_kernel() -> None:
    """Compile every entry point of the kernel, or load it from the cache (worker processes forked later share
    it); about ``COMPILE_SECONDS`` the first time on an installation."""
    from .metrics import schedule_metrics

    params = EnvParams(n=2, num_gpus=2)
    simulate_figures(params, [Policy()])
    schedule_metrics(simulate(params, Policy()))
    if not getattr(numba.config, "DISABLE_JIT"):
        try:
            _stamp_path().write_text(_kernel_stamp())
        except OSError:
            pass  # a cache nobody may write to: numba compiles in memory, and so will the next run


def _stuck_message(graph: TaskGraph, ready: list[float], end: list[float], next_compute: list[int],
                   busy: list[int]) -> str:
    tasks = graph.tasks
    ident = lambda i: Task(tasks[i].kind, tasks[i].gpu, tasks[i].stage, tasks[i].index, 0.0,  # noqa: E731
                           parts=tasks[i].parts).id
    waiting = []
    for s, order in enumerate(graph.orders):
        if busy[s] < 0 and next_compute[s] < len(order):
            node = order[next_compute[s]]
            unmet = [str(ident(i)) for i in graph.needs[node] if math.isnan(end[i])]
            waiting.append(f"{ident(node)} waits for {', '.join(unmet) or 'its predecessor'}")
        waiting.extend(f"{ident(i)} is ready but gets no bandwidth" for i, task in enumerate(tasks)
                       if task.gpu == s and task.kind in _COMM_NUMBER and not math.isnan(ready[i])
                       and math.isnan(end[i]))
    return "simulation stuck, nothing can progress: " + "; ".join(waiting or ["no task is ready"])


def calculate_full_pipeline_schedule(
        *, n: int = 8, num_gpus: int = 4, sync_freq: int = 1, fwd_len: float = 1.0, bwd_len: float = 2.0,
        prop_len: float = 1.0, sync_base_len: float = 2.0, fwd_impact: float = 0.2, bwd_impact: float = 0.2,
        ingress_capacity: float = 1.0, schedule: str = "1f1b", chunks: int = 2, w_fraction: float = 0.5,
        fb_overlap: float = 0.0, compute_jitter: float = 0.0, comm_jitter: float = 0.0,
        jitter_dist: str = "lognormal", slow_gpu: int = -1, slow_factor: float = 1.0, seed: int = 0,
        sample: int = 0, priorities: Mapping[str, float] | None = None,
        exclusive_tiers: Mapping[str, str] | None = None, allow_large: bool = False) -> Schedule:
    """Simulate one training iteration and return every task's timeline (docs/model.md describes the model).

    Times are abstract units; rates are fractions of full speed or of one link.
    ``schedule`` is one of ``gpipe``, ``1f1b``, ``interleaved-1f1b`` (``chunks`` model
    chunks per GPU), ``zb-h1``, ``zb-v``, ``dualpipe-v``; ``w_fraction`` is the share of a
    split backward that computes weight gradients, ``fb_overlap`` the work an overlapped
    forward/backward pair saves. ``priorities`` maps a transfer kind (``fwd_prop``,
    ``grad_prop``, ``grad_sync``) to a shared priority in [0, 1] (missing kinds get 1.0);
    ``exclusive_tiers`` maps a kind to a tier letter, ``'a'`` highest, which overrides its
    shared priority. ``compute_jitter`` and ``comm_jitter`` are the coefficients of
    variation of compute and transfer work (``jitter_dist`` ``lognormal`` or ``normal``);
    ``slow_gpu`` (-1: none) computes ``slow_factor`` times slower; the result is draw
    number ``sample`` of the random stream ``seed``. Invalid arguments raise
    ``ValueError`` naming the argument, its value and what is allowed; so does an environment
    of more tasks than fit in memory, as the command line refuses it, unless ``allow_large``.
    ``metrics.schedule_metrics`` gives its summary figures (spans, bubbles, peak activations
    per GPU).
    """
    arguments = locals()  # the signature spells out EnvParams' fields for readers; tests hold it to the table
    params = EnvParams(**{name: arguments[name] for name in EnvParams.names()})
    SAMPLES.check("sample", sample)
    if not allow_large:
        check_size(params, " (allow_large=True to try anyway)")
    policy = Policy(priorities={} if priorities is None else priorities,
                    exclusive_tiers={} if exclusive_tiers is None else exclusive_tiers)
    return simulate(params, policy, int(sample))
