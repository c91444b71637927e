"""The event-driven fluid simulation of one iteration of any schedule (docs/model.md sections 2, 3 and 6).

Between two events every active task progresses at a constant rate; an event is a
task ending (every readiness follows from an ending, or from time 0). At an event
the loop applies all endings and the readiness chains they cause, then recomputes
rates. Rates are recomputed only where the event can change them: the sending
sets of the GPUs whose ready transfers changed, and the layered allocation of the
group of GPUs those transfers couple through ingress limits. Everything else keeps
its rate, which is what a recomputation from scratch would give it, so this is the
same model, evaluated lazily: a task's remaining work is brought up to date only
when its rate changes. The engine reads the task graph (``taskgraph.py``) and never
asks which schedule produced it.

Left out on purpose: latency (a transfer's cost is its work only), contention
inside a GPU other than through ``grad_sync`` traffic, and the receiving side of
``grad_sync`` (data-parallel peers are outside the model).
"""

from __future__ import annotations

import heapq
import math
import numbers
from typing import Mapping

from .allocation import LEVEL_TOLERANCE, choose_sending_set, exclusive_key, is_throttled, layered_rates
from .model import COMM_KINDS, EnvParams, ParameterError, Policy, Schedule, Task
from .taskgraph import TaskGraph, build_task_graph

#: Tasks whose projected ends lie within this relative distance end at the same event.
END_TOLERANCE = 1e-9
#: Two rates closer than this (relative) are the same rate: no new segment starts between them.
RATE_TOLERANCE = 1e-12

_GRAD_SYNC = COMM_KINDS.index("grad_sync")  # position in COMM_KINDS, which is also the tie order


class SimulationStuckError(RuntimeError):
    """Nothing can progress although tasks remain; the message names them."""


class _Run:
    """Mutable simulation state of one task (the public record is ``task``; ``node`` its place in the graph)."""

    __slots__ = ("task", "node", "comm", "remaining", "rate", "since", "heap_seq", "throttled_now",
                 "waiting", "weight", "share", "layer", "receiver", "tier_rank", "priority", "key", "impact")

    def __init__(self, task: Task, node: int, comm: int, impact: float = 0.0,
                 tier_rank: int | None = None, priority: float = 0.0) -> None:
        self.task = task
        self.node = node
        self.comm = comm  # -1 for compute, else the position in COMM_KINDS
        self.remaining = task.length
        self.rate = 0.0
        self.since = 0.0
        self.heap_seq = -1  # sequence number of this run's live heap entry, -1 if none
        self.throttled_now = False
        self.waiting = 0  # unmet dependencies (compute tasks)
        self.weight = 0.0
        self.share = 0.0
        self.layer = 0
        self.receiver = task.receiver
        self.tier_rank = tier_rank
        self.priority = priority
        self.key: tuple = ()
        self.impact = impact


class _Simulation:
    def __init__(self, graph: TaskGraph, policy: Policy) -> None:
        self.graph = graph
        self.params = params = graph.params
        p = params.num_gpus
        tier_letters = sorted(set(policy.exclusive_tiers.values()))
        tier_rank = [tier_letters.index(policy.exclusive_tiers[kind]) if kind in policy.exclusive_tiers else None
                     for kind in COMM_KINDS]
        priority = [policy.shared_priority(kind) for kind in COMM_KINDS]
        comm_of = {kind: i for i, kind in enumerate(COMM_KINDS)}

        self.tasks: list[Task] = []
        self.runs: list[_Run] = []
        for node, (spec, needs) in enumerate(zip(graph.tasks, graph.needs)):
            task = Task(spec.kind, spec.gpu, spec.stage, spec.index, spec.length, spec.receiver, spec.parts)
            comm = comm_of.get(spec.kind, -1)
            if comm < 0:
                run = _Run(task, node, -1, spec.impact)
                run.waiting = len(needs)
            else:
                run = _Run(task, node, comm, 0.0, tier_rank[comm], priority[comm])
            self.tasks.append(task)
            self.runs.append(run)
        self.order = [[self.runs[i] for i in order] for order in graph.orders]

        self.next_compute = [0] * p
        self.busy: list[_Run | None] = [None] * p
        self.ready_comm: list[list[_Run]] = [[] for _ in range(p)]
        self.sending: list[list[_Run]] = [[] for _ in range(p)]
        self.sends_to: list[tuple[int, ...]] = [()] * p  # receivers of each GPU's sending set now
        self.sync_rate = [0.0] * p
        self.inflow = [0.0] * p  # scratch: summed sender-only shares into each GPU of a group
        self.dirty_comm: set[int] = set()
        self.dirty_compute: set[int] = set()
        self.heap: list[tuple[float, int, _Run]] = []
        self.seq = 0
        self.done = 0

    # -- running ----------------------------------------------------------------------

    def run(self) -> float:
        now = 0.0
        for s in range(self.params.num_gpus):
            self._try_start_compute(s, now)
        self._reallocate(now)
        total = len(self.tasks)
        while self.done < total:
            now, ending = self._next_endings()
            for run in ending:
                self._finish(run, now)
            self._reallocate(now)
        return max(task.end for task in self.tasks)

    def _next_endings(self) -> tuple[float, list[_Run]]:
        heap = self.heap
        while heap and heap[0][2].heap_seq != heap[0][1]:
            heapq.heappop(heap)
        if not heap:
            raise SimulationStuckError(self._stuck_message())
        now = heap[0][0]
        limit = now + END_TOLERANCE * max(1.0, abs(now))
        ending = []
        while heap and heap[0][0] <= limit:
            _, seq, run = heapq.heappop(heap)
            if run.heap_seq == seq:
                ending.append(run)
        return now, ending

    def _set_rate(self, run: _Run, rate: float, throttled: bool, now: float) -> None:
        """Close the stretch at the old rate and continue at the new one.

        A throttled stretch at rate 0 (a flow waiting at a receiver that higher layers
        saturate) counts as throttled time but is no segment: nothing progresses.
        """
        if throttled == run.throttled_now and abs(rate - run.rate) <= RATE_TOLERANCE * run.rate:
            return  # the same rate: a new segment starts only when something really changes
        task = run.task
        if now > run.since:
            if run.rate > 0.0:
                run.remaining -= run.rate * (now - run.since)
                task.segments.append((run.since, now, run.rate))
            if run.throttled_now:  # flagged only once the stretch has lasted, never for an instant
                task.throttled_time += now - run.since
                task.throttled = True
        run.since = now
        run.rate = rate
        run.throttled_now = throttled
        if rate > 0.0:
            if math.isnan(task.start):
                task.start = now
            self.seq += 1
            run.heap_seq = self.seq
            remaining = run.remaining if run.remaining > 0.0 else 0.0
            heapq.heappush(self.heap, (now + remaining / rate, self.seq, run))
        else:
            run.heap_seq = -1

    def _finish(self, run: _Run, now: float) -> None:
        self._set_rate(run, 0.0, False, now)
        run.remaining = 0.0
        run.task.end = now
        self.done += 1
        s = run.task.gpu
        if run.comm < 0:
            self.busy[s] = None
            self._try_start_compute(s, now)
        else:
            self.ready_comm[s].remove(run)
            self.dirty_comm.add(s)
        self._release_dependents(run, now)

    def _release_dependents(self, run: _Run, now: float) -> None:
        runs = self.runs
        for node in self.graph.releases[run.node]:
            dependent = runs[node]
            if dependent.comm >= 0:
                self._make_ready(dependent, now)
            else:
                dependent.waiting -= 1
                self._try_start_compute(dependent.task.gpu, now)

    def _make_ready(self, run: _Run, now: float) -> None:
        task = run.task
        task.ready = now
        if task.length == 0.0:
            task.start = task.end = now
            self.done += 1
            self._release_dependents(run, now)
            return
        if run.tier_rank is not None:
            run.key = exclusive_key(run.tier_rank, now, task.index, run.comm, task.stage)
        self.ready_comm[task.gpu].append(run)
        self.dirty_comm.add(task.gpu)

    def _try_start_compute(self, s: int, now: float) -> None:
        order = self.order[s]
        while self.busy[s] is None and self.next_compute[s] < len(order):
            run = order[self.next_compute[s]]
            if run.waiting:
                return
            self.next_compute[s] += 1
            task = run.task
            task.ready = now
            if task.length == 0.0:  # a W of no work ends the instant it may start
                task.start = task.end = now
                self.done += 1
                self._release_dependents(run, now)
                continue
            self.busy[s] = run
            self.dirty_compute.add(s)

    # -- rates ------------------------------------------------------------------------

    def _reallocate(self, now: float) -> None:
        if self.dirty_comm:
            self._reallocate_comm(now)
        for s in sorted(self.dirty_compute):
            run = self.busy[s]
            if run is not None:
                self._set_rate(run, 1.0 - run.impact * self.sync_rate[s], False, now)  # section 3.3
        self.dirty_compute.clear()

    def _reallocate_comm(self, now: float) -> None:
        sending, sends_to = self.sending, self.sends_to
        seeds = set(self.dirty_comm)
        for s in self.dirty_comm:
            new = choose_sending_set(self.ready_comm[s])
            for run in sending[s]:
                if run.receiver is not None:
                    seeds.add(run.receiver)  # its receiver's other inflow may speed up
                if (run.rate or run.throttled_now) and run not in new:
                    self._set_rate(run, 0.0, False, now)
            sending[s] = new
            sends_to[s] = tuple(run.receiver for run in new if run.receiver is not None)
        self.dirty_comm.clear()

        # Two GPUs are coupled while a flow between them shares an ingress limit. The rates
        # that can change are those of the connected groups of coupled GPUs around the
        # seeds; a walk over each GPU's peers in the task graph finds them, whatever the
        # shape of the network (a line, a ring, flows both ways).
        peers = self.graph.peers
        grouped: set[int] = set()
        for seed in sorted(seeds):
            if seed in grouped:
                continue
            grouped.add(seed)
            group = [seed]
            for g in group:  # grows while it is walked: breadth first
                for h in peers[g]:
                    if h not in grouped and (h in sends_to[g] or g in sends_to[h]):
                        grouped.add(h)
                        group.append(h)
            group.sort()
            self._allocate_group(group, now)

    def _allocate_group(self, group: list[int], now: float) -> None:
        """Rates of every flow sent by the GPUs of ``group``, which no other flow couples to."""
        flows = []
        inflow = self.inflow
        for g in group:
            inflow[g] = 0.0
        for g in group:
            for run in self.sending[g]:
                flows.append(run)
                if run.receiver is not None:
                    inflow[run.receiver] += run.share  # the group is closed: every receiver lies in it
        capacity = self.params.ingress_capacity
        if max([inflow[g] for g in group]) <= capacity * (1.0 + LEVEL_TOLERANCE):
            # Sender-only shares that respect every ingress limit are already the layered
            # max-min allocation, and no flow is throttled; this loop apart from the general
            # one is worth ~7%.
            for run in flows:
                if run.share != run.rate or run.throttled_now:
                    self._set_rate(run, run.share, False, now)
        else:
            rates = layered_rates([run.task.gpu for run in flows], [run.receiver for run in flows],
                                  [run.weight for run in flows], [run.layer for run in flows], capacity)
            for run, rate in zip(flows, rates):
                self._set_rate(run, rate, is_throttled(rate, run.share), now)
        sync_rate = self.sync_rate
        for g in group:
            sync = 0.0
            for run in self.sending[g]:
                if run.comm == _GRAD_SYNC:
                    sync += run.rate
            if sync != sync_rate[g]:
                sync_rate[g] = sync
                self.dirty_compute.add(g)

    def _stuck_message(self) -> str:
        waiting = []
        for s in range(self.params.num_gpus):
            if self.busy[s] is None and self.next_compute[s] < len(self.order[s]):
                run = self.order[s][self.next_compute[s]]
                unmet = [str(self.tasks[i].id) for i in self.graph.needs[run.node] if math.isnan(self.tasks[i].end)]
                waiting.append(f"{run.task.id} waits for {', '.join(unmet) or 'its predecessor'}")
            waiting.extend(f"{run.task.id} is ready but gets no bandwidth" for run in self.ready_comm[s])
        return "simulation stuck, nothing can progress: " + "; ".join(waiting or ["no task is ready"])


def simulate(params: EnvParams, policy: Policy, sample: int = 0) -> Schedule:
    """Simulate one iteration of ``params`` under ``policy``: the ``sample``-th draw of its noise, if any."""
    sim = _Simulation(build_task_graph(params, sample), policy)
    completion = sim.run()
    return Schedule(params=params, policy=policy, tasks=sim.tasks, completion_time=completion, sample=sample)


def calculate_full_pipeline_schedule(
        *, n: int = 8, num_gpus: int = 4, sync_freq: int = 1, fwd_len: float = 1.0, bwd_len: float = 2.0,
        prop_len: float = 1.0, sync_base_len: float = 2.0, fwd_impact: float = 0.2, bwd_impact: float = 0.2,
        ingress_capacity: float = 1.0, schedule: str = "1f1b", chunks: int = 2, w_fraction: float = 0.5,
        fb_overlap: float = 0.0, compute_jitter: float = 0.0, comm_jitter: float = 0.0,
        jitter_dist: str = "lognormal", slow_gpu: int = -1, slow_factor: float = 1.0, seed: int = 0,
        sample: int = 0, priorities: Mapping[str, float] | None = None,
        exclusive_tiers: Mapping[str, str] | None = None) -> Schedule:
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
    ``ValueError`` naming the argument, its value and what is allowed. The result
    exposes per GPU ``spans`` and ``peak_activations``.
    """
    params = EnvParams(n=n, num_gpus=num_gpus, sync_freq=sync_freq, fwd_len=fwd_len, bwd_len=bwd_len,
                       prop_len=prop_len, sync_base_len=sync_base_len, fwd_impact=fwd_impact,
                       bwd_impact=bwd_impact, ingress_capacity=ingress_capacity, schedule=schedule, chunks=chunks,
                       w_fraction=w_fraction, fb_overlap=fb_overlap, compute_jitter=compute_jitter,
                       comm_jitter=comm_jitter, jitter_dist=jitter_dist, slow_gpu=slow_gpu, slow_factor=slow_factor,
                       seed=seed)
    if isinstance(sample, bool) or not isinstance(sample, numbers.Integral) or sample < 0:
        raise ParameterError("sample", sample, "must be an integer >= 0")
    policy = Policy(priorities=dict(priorities or {}), exclusive_tiers=dict(exclusive_tiers or {}))
    return simulate(params, policy, sample)
