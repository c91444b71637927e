"""The event-driven fluid simulation of one 1F1B iteration (docs/model.md sections 2 and 3).

Between two events every active task progresses at a constant rate; an event is a
task ending (every readiness follows from an ending, or from time 0). At an event
the loop applies all endings and the readiness chains they cause, then recomputes
rates. Rates are recomputed only where the event can change them: the sending
sets of the GPUs whose ready transfers changed, and the max-min allocation of the
group of GPUs those transfers couple through ingress limits. Everything else keeps
its rate, which is what a recomputation from scratch would give it, so this is the
same model, evaluated lazily: a task's remaining work is brought up to date only
when its rate changes.

Left out on purpose: latency (a transfer's cost is its work only), contention
inside a GPU other than through ``grad_sync`` traffic, and the receiving side of
``grad_sync`` (data-parallel peers are outside the model).
"""

from __future__ import annotations

import heapq
import math
from typing import Mapping

from .allocation import LEVEL_TOLERANCE, choose_sending_set, exclusive_key, is_throttled, layered_rates
from .model import COMM_KINDS, EnvParams, Policy, Schedule, Task, TaskKind, one_f_one_b_order, sync_points

#: Tasks whose projected ends lie within this relative distance end at the same event.
END_TOLERANCE = 1e-9
#: Two rates closer than this (relative) are the same rate: no new segment starts between them.
RATE_TOLERANCE = 1e-12

_FWD_PROP, _GRAD_PROP, _GRAD_SYNC = range(3)  # positions in COMM_KINDS; also the tie order


class SimulationStuckError(RuntimeError):
    """Nothing can progress although tasks remain; the message names them."""


class _Run:
    """Mutable simulation state of one task (the public record is ``task``)."""

    __slots__ = ("task", "comm", "remaining", "rate", "since", "heap_seq", "throttled_now",
                 "waiting", "weight", "share", "layer", "receiver", "tier_rank", "priority", "key")

    def __init__(self, task: Task, comm: int, receiver: int | None = None,
                 tier_rank: int | None = None, priority: float = 0.0) -> None:
        self.task = task
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
        self.receiver = receiver
        self.tier_rank = tier_rank
        self.priority = priority
        self.key: tuple = ()


class _Simulation:
    def __init__(self, params: EnvParams, policy: Policy) -> None:
        self.params = params
        p, n = params.num_gpus, params.n
        tier_letters = sorted(set(policy.exclusive_tiers.values()))
        tier_rank = {kind: tier_letters.index(policy.exclusive_tiers[kind]) if kind in policy.exclusive_tiers else None
                     for kind in COMM_KINDS}
        priority = {kind: policy.shared_priority(kind) for kind in COMM_KINDS}

        def comm_run(kind: TaskKind, gpu: int, index: int, length: float, receiver: int | None) -> _Run:
            return _Run(Task(kind, gpu, index, float(length)), COMM_KINDS.index(kind), receiver,
                        tier_rank[kind], priority[kind])

        self.tasks: list[Task] = []
        self.forward: list[list[_Run]] = []
        self.backward: list[list[_Run]] = []
        self.order: list[list[_Run]] = []
        self.fwd_prop: list[list[_Run]] = []
        self.grad_prop: list[list[_Run]] = []
        self.grad_sync: list[dict[int, _Run]] = []  # keyed by the micro-batch whose backward sends it
        syncs = sync_points(n, params.sync_freq)
        for s in range(p):
            fwd = [_Run(Task(TaskKind.FORWARD, s, m, float(params.fwd_len)), -1) for m in range(n)]
            bwd = [_Run(Task(TaskKind.BACKWARD, s, m, float(params.bwd_len)), -1) for m in range(n)]
            for m in range(n):
                fwd[m].waiting = 1 if s > 0 else 0
                bwd[m].waiting = 1  # grad_prop from downstream, or this stage's forward on the last one
            order = [fwd[m] if kind is TaskKind.FORWARD else bwd[m] for kind, m in one_f_one_b_order(s, n, p)]
            self.forward.append(fwd)
            self.backward.append(bwd)
            self.order.append(order)
            self.fwd_prop.append([comm_run(TaskKind.FWD_PROP, s, m, params.prop_len, s + 1) for m in range(n)]
                                 if s < p - 1 else [])
            self.grad_prop.append([comm_run(TaskKind.GRAD_PROP, s, m, params.prop_len, s - 1) for m in range(n)]
                                  if s > 0 else [])
            self.grad_sync.append({m: comm_run(TaskKind.GRAD_SYNC, s, k, params.sync_base_len, None)
                                   for k, m in enumerate(syncs)})
            self.tasks.extend(run.task for run in order)
            self.tasks.extend(run.task for run in self.fwd_prop[s])
            self.tasks.extend(run.task for run in self.grad_prop[s])
            self.tasks.extend(run.task for run in self.grad_sync[s].values())

        self.next_compute = [0] * p
        self.busy: list[_Run | None] = [None] * p
        self.ready_comm: list[list[_Run]] = [[] for _ in range(p)]
        self.sending: list[list[_Run]] = [[] for _ in range(p)]
        self.sends_down = [False] * p  # sending a fwd_prop to s + 1 now
        self.sends_up = [False] * p  # sending a grad_prop to s - 1 now
        self.sync_rate = [0.0] * p
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
        task = run.task
        s, m = task.gpu, task.index
        last = self.params.num_gpus - 1
        if task.kind is TaskKind.FORWARD:
            if s < last:
                self._make_ready(self.fwd_prop[s][m], now)
            else:
                self._satisfy(self.backward[s][m], now)
        elif task.kind is TaskKind.BACKWARD:
            if s > 0:
                self._make_ready(self.grad_prop[s][m], now)
            sync = self.grad_sync[s].get(m)
            if sync is not None:
                self._make_ready(sync, now)
        elif task.kind is TaskKind.FWD_PROP:
            self._satisfy(self.forward[s + 1][m], now)
        elif task.kind is TaskKind.GRAD_PROP:
            self._satisfy(self.backward[s - 1][m], now)

    def _satisfy(self, run: _Run, now: float) -> None:
        run.waiting -= 1
        self._try_start_compute(run.task.gpu, now)

    def _make_ready(self, run: _Run, now: float) -> None:
        task = run.task
        task.ready = now
        if task.length == 0.0:
            task.start = task.end = now
            self.done += 1
            self._release_dependents(run, now)
            return
        if run.tier_rank is not None:
            run.key = exclusive_key(run.tier_rank, now, task.index, run.comm)
        self.ready_comm[task.gpu].append(run)
        self.dirty_comm.add(task.gpu)

    def _try_start_compute(self, s: int, now: float) -> None:
        if self.busy[s] is not None or self.next_compute[s] == len(self.order[s]):
            return
        run = self.order[s][self.next_compute[s]]
        if run.waiting:
            return
        self.next_compute[s] += 1
        self.busy[s] = run
        run.task.ready = now
        self.dirty_compute.add(s)

    # -- rates ------------------------------------------------------------------------

    def _sending_set(self, s: int) -> list[_Run]:
        """The transfers GPU ``s`` sends now; also notes which neighbours they couple it to."""
        chosen = choose_sending_set(self.ready_comm[s])
        down = up = False
        for run in chosen:
            down = down or run.comm == _FWD_PROP
            up = up or run.comm == _GRAD_PROP
        self.sends_down[s] = down
        self.sends_up[s] = up
        return chosen

    def _reallocate(self, now: float) -> None:
        if self.dirty_comm:
            self._reallocate_comm(now)
        for s in sorted(self.dirty_compute):
            run = self.busy[s]
            if run is not None:
                impact = self.params.fwd_impact if run.task.kind is TaskKind.FORWARD else self.params.bwd_impact
                self._set_rate(run, 1.0 - impact * self.sync_rate[s], False, now)
        self.dirty_compute.clear()

    def _reallocate_comm(self, now: float) -> None:
        sending, sends_down, sends_up = self.sending, self.sends_down, self.sends_up
        seeds = set(self.dirty_comm)
        for s in self.dirty_comm:
            new = self._sending_set(s)
            for run in sending[s]:
                if run.receiver is not None:
                    seeds.add(run.receiver)  # its receiver's other inflow may speed up
                if (run.rate or run.throttled_now) and run not in new:
                    self._set_rate(run, 0.0, False, now)
            sending[s] = new
        self.dirty_comm.clear()

        # GPUs g and g+1 are coupled when a flow between them shares an ingress limit, so
        # the groups whose rates can change are maximal runs of coupled neighbours.
        last = self.params.num_gpus - 1
        covered = -1
        for seed in sorted(seeds):
            if seed <= covered:
                continue
            low = seed
            while low > 0 and (sends_down[low - 1] or sends_up[low]):
                low -= 1
            high = seed
            while high < last and (sends_down[high] or sends_up[high + 1]):
                high += 1
            covered = high
            self._allocate_group(low, high, now)

    def _allocate_group(self, low: int, high: int, now: float) -> None:
        """Rates of every flow sent by GPUs ``low..high``, a group no other flow couples to."""
        flows = []
        inflow = [0.0] * (high - low + 1)  # the group is closed: every receiver lies in it
        for g in range(low, high + 1):
            for run in self.sending[g]:
                flows.append(run)
                if run.receiver is not None:
                    inflow[run.receiver - low] += run.share
        capacity = self.params.ingress_capacity
        if max(inflow) <= capacity * (1.0 + LEVEL_TOLERANCE):
            # Sender-only shares that respect every ingress limit are already max-min fair,
            # and no flow is throttled; this loop apart from the general one is worth ~7%.
            for run in flows:
                if run.share != run.rate or run.throttled_now:
                    self._set_rate(run, run.share, False, now)
        else:
            rates = layered_rates([run.task.gpu for run in flows], [run.receiver for run in flows],
                                  [run.weight for run in flows], [run.layer for run in flows], capacity)
            for run, rate in zip(flows, rates):
                self._set_rate(run, rate, is_throttled(rate, run.share), now)
        sync_rate = self.sync_rate
        for g in range(low, high + 1):
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
                needs = ("fwd_prop from GPU %d" % (s - 1) if run.task.kind is TaskKind.FORWARD
                         else "grad_prop from GPU %d" % (s + 1) if s < self.params.num_gpus - 1
                         else "its forward")
                waiting.append(f"{run.task.id} waits for {needs}")
            waiting.extend(f"{run.task.id} is ready but gets no bandwidth" for run in self.ready_comm[s])
        return "simulation stuck, nothing can progress: " + "; ".join(waiting or ["no task is ready"])


def simulate(params: EnvParams, policy: Policy) -> Schedule:
    """Simulate one iteration of ``params`` under ``policy``."""
    sim = _Simulation(params, policy)
    completion = sim.run()
    return Schedule(params=params, policy=policy, tasks=sim.tasks, completion_time=completion)


def calculate_full_pipeline_schedule(
        *, n: int = 8, num_gpus: int = 4, sync_freq: int = 1, fwd_len: float = 1.0, bwd_len: float = 2.0,
        prop_len: float = 1.0, sync_base_len: float = 2.0, fwd_impact: float = 0.2, bwd_impact: float = 0.2,
        ingress_capacity: float = 1.0, priorities: Mapping[str, float] | None = None,
        exclusive_tiers: Mapping[str, str] | None = None) -> Schedule:
    """Simulate one 1F1B iteration and return every task's timeline (docs/model.md describes the model).

    Times are abstract units; rates are fractions of full speed or of one link.
    ``priorities`` maps a transfer kind (``fwd_prop``, ``grad_prop``, ``grad_sync``)
    to a shared priority in [0, 1] (missing kinds get 1.0); ``exclusive_tiers`` maps a
    kind to a tier letter, ``'a'`` highest, which overrides its shared priority.
    Invalid arguments raise ``ValueError`` naming the argument, its value and what is allowed.
    """
    params = EnvParams(n=n, num_gpus=num_gpus, sync_freq=sync_freq, fwd_len=fwd_len, bwd_len=bwd_len,
                       prop_len=prop_len, sync_base_len=sync_base_len, fwd_impact=fwd_impact,
                       bwd_impact=bwd_impact, ingress_capacity=ingress_capacity)
    policy = Policy(priorities=dict(priorities or {}), exclusive_tiers=dict(exclusive_tiers or {}))
    return simulate(params, policy)
