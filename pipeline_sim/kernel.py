"""The simulation kernel: the event loop and the layered allocation over arrays, compiled by numba.

This is the one implementation of docs/model.md sections 2, 3 and 6. Between two
events every active task progresses at a constant rate; an event is a task ending
(every readiness follows from an ending, or from time 0). At an event the loop applies
all endings and the readiness chains they cause, then recomputes rates, only where the
event can change them: the sending sets of the GPUs whose ready transfers changed, and
the layered allocation of the group of GPUs those transfers couple through ingress
limits. Everything else keeps its rate, which is what a recomputation from scratch
would give it; a task's remaining work is brought up to date only when its rate changes.

The functions take the task graph as arrays (``engine.GraphArrays``) and never ask
which schedule produced it. They are plain Python that numba compiles once per
installation (``cache=True``); with ``NUMBA_DISABLE_JIT=1`` the very same code runs
uncompiled, for debugging. Every float operation is written in the order the model's
reference takes it, so compiled and uncompiled runs give the same bits.

Left out on purpose: latency (a transfer's cost is its work only), contention inside a
GPU other than through ``grad_sync`` traffic, and the receiving side of ``grad_sync``
(data-parallel peers are outside the model).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

#: Tasks whose projected ends lie within this relative distance end at the same event.
END_TOLERANCE = 1e-9
#: Two rates closer than this (relative) are the same rate: no new segment starts between them.
RATE_TOLERANCE = 1e-12
#: Two levels closer than this (relative) saturate together in progressive filling.
LEVEL_TOLERANCE = 1e-12
#: A transfer below its sender-only share by more than this (relative) is throttled.
THROTTLE_TOLERANCE = 1e-9
#: Layer numbers of the shared and the zero-priority sending sets; exclusive tier ranks (0 = 'a') come first.
SHARED_LAYER = 1_000
ZERO_LAYER = 1_001
#: The position of grad_sync in COMM_KINDS (fwd_prop, grad_prop, grad_sync), which is also the tie order.
GRAD_SYNC = 2

#: Compiled once per installation and kept in numba's cache.
_compiled: Any = njit(cache=True)  # numba's dispatchers take any arrays; their calls are not type-checked
#: The same, for functions that allocate nothing: without reference counting of their array arguments, which
#: per call cost more than the function's own work.
_inner: Any = njit(cache=True, _nrt=False)  # type: ignore[call-overload]  # an option numba's stubs lack

#: What ``simulate`` returns in ``status``.
DONE, STUCK = 0, 1

_RELEASE, _TRY_START = 0, 1  # frames of the explicit stack that replaces recursion


# -- the allocation (section 3.2) -------------------------------------------------------


@_inner
def ready_key(ready: float) -> float:
    """The ready time as exclusive tiers compare it: in units of 1e-9, rounded, so that float noise
    cannot reorder transfers that became ready together."""
    return np.rint(ready * 1e9)


@_inner
def key_before(a_tier: int, a_ready: float, a_index: int, a_kind: int, a_stage: int,
               b_tier: int, b_ready: float, b_index: int, b_kind: int, b_stage: int) -> bool:
    """Whether transfer a sends before b in an exclusive tier: tier ('a' first), then earliest ready
    time (``ready_key``), lowest micro-batch or sync index, kind order, lowest sending stage."""
    if a_tier != b_tier:
        return a_tier < b_tier
    if a_ready != b_ready:
        return a_ready < b_ready
    if a_index != b_index:
        return a_index < b_index
    if a_kind != b_kind:
        return a_kind < b_kind
    return a_stage < b_stage


# The loop's state lives in a few 2D arrays, one row per quantity, so that helpers take a
# handful of arguments: numba reference-counts every array passed, and tuples of thirty
# arrays per call cost more than the simulation itself.
# Per task, floats (F):
LENGTH, IMPACT, REMAINING, RATE, SINCE, START, END, READY, THROTTLED_TIME, KEY, WEIGHT, SHARE, PRIORITY = range(13)
TASK_FLOATS = 13
# per task, integers (I):
GPU, RECEIVER, COMM, STAGE, INDEX, WAITING, LIVE, THROTTLED_NOW, THROTTLED, TIER, LAYER = range(11)
TASK_INTS = 11
# per GPU, integers (P; a list fills a row from the left, its length in C or in a count row):
NEXT, BUSY, READY_COUNT, SENDING_COUNT, DIRTY_COMM, DIRTY_COMPUTE, DIRTY_COMM_LIST, DIRTY_COMPUTE_LIST, SEED, \
    GROUPED, GROUP, GROUP_END = range(12)
# per GPU, floats (PF):
SYNC_RATE, INFLOW = range(2)
# queues Q[READY_QUEUE, g] and Q[SENDING_SET, g]: task numbers in ready order
READY_QUEUE, SENDING_SET = range(2)
# counters (C):
_SEQ, _DONE, _SEGMENTS, _HEAP_SIZE, _DIRTY_COMM, _DIRTY_COMPUTE, _STACK = range(7)


# Scratch of the allocation: rows of A (integers) and AF (floats), each at least twice as
# wide as the flows of a group and as wide as the GPUs. A flow's number is its column.
FLOWS, CHOSEN, SENDER, RECEIVER_OF, LAYER_OF, MEMBER, EGRESS_OF, INGRESS_OF, PORTS, OPEN, FROZEN = range(11)
WEIGHT_OF, RATE_OF, CAPACITY, FREE, UNFROZEN, LEVEL, LEFT = range(7)


@_inner
def _insert(A: np.ndarray, first: int, stop: int, value: int) -> int:
    """Insert ``value`` into the sorted distinct ``A[PORTS, first:stop]`` unless present; return the new stop."""
    k = stop
    for j in range(first, stop):
        if A[PORTS, j] == value:
            return stop
        if A[PORTS, j] > value:
            k = j
            break
    for j in range(stop, k, -1):
        A[PORTS, j] = A[PORTS, j - 1]
    A[PORTS, k] = value
    return stop + 1


@_inner
def _position(A: np.ndarray, first: int, stop: int, value: int) -> int:
    for j in range(first, stop):
        if A[PORTS, j] == value:
            return j
    return -1


@_inner
def _fill(count: int, A: np.ndarray, AF: np.ndarray) -> None:
    """Weighted max-min fair rates of the flows ``A[MEMBER, :count]`` (one layer), by progressive filling.

    Flow f leaves GPU ``A[SENDER, f]`` (egress capacity 1) and enters GPU ``A[RECEIVER_OF, f]``
    (-1 for traffic leaving the modelled GPUs), whose free ingress is ``AF[LEFT, receiver]``.
    Every unfrozen flow's rate rises as ``AF[WEIGHT_OF, f] x level``; when a capacity is
    reached its flows freeze, and ``AF[RATE_OF, f]`` is set. Weights must be positive.

    A flow frozen by a capacity gets ``weight x free / sum of unfrozen weights`` of it:
    the same expression as the sender-only share ``weight / sum of weights`` when its
    egress binds, so that equal rates are equal floats however they were reached.
    Constraints are taken egress before ingress, each by GPU number.
    """
    egress = 0
    for k in range(count):
        egress = _insert(A, 0, egress, A[SENDER, A[MEMBER, k]])
    total = egress
    for k in range(count):
        if A[RECEIVER_OF, A[MEMBER, k]] >= 0:
            total = _insert(A, egress, total, A[RECEIVER_OF, A[MEMBER, k]])
    for c in range(total):
        AF[CAPACITY, c] = 1.0 if c < egress else AF[LEFT, A[PORTS, c]]
        A[OPEN, c] = c
    for k in range(count):
        f = A[MEMBER, k]
        A[EGRESS_OF, k] = _position(A, 0, egress, A[SENDER, f])
        A[INGRESS_OF, k] = _position(A, egress, total, A[RECEIVER_OF, f]) if A[RECEIVER_OF, f] >= 0 else -1
        A[FROZEN, k] = 0
        AF[RATE_OF, f] = 0.0
    open_count = total
    while open_count > 0:
        lowest = np.inf
        for j in range(open_count):
            c = A[OPEN, j]
            used = 0.0
            unfrozen = 0.0
            for k in range(count):
                if A[EGRESS_OF, k] == c or A[INGRESS_OF, k] == c:
                    if A[FROZEN, k] == 1:
                        used += AF[RATE_OF, A[MEMBER, k]]
                    else:
                        unfrozen += AF[WEIGHT_OF, A[MEMBER, k]]
            left = AF[CAPACITY, c] - used
            AF[FREE, c] = left if left > 0.0 else 0.0
            AF[UNFROZEN, c] = unfrozen
            AF[LEVEL, c] = AF[FREE, c] / unfrozen
            if AF[LEVEL, c] < lowest:
                lowest = AF[LEVEL, c]
        for j in range(open_count):
            c = A[OPEN, j]
            if AF[LEVEL, c] <= lowest * (1.0 + LEVEL_TOLERANCE):
                for k in range(count):
                    if (A[EGRESS_OF, k] == c or A[INGRESS_OF, k] == c) and A[FROZEN, k] == 0:
                        f = A[MEMBER, k]
                        AF[RATE_OF, f] = AF[WEIGHT_OF, f] * AF[FREE, c] / AF[UNFROZEN, c]
                        A[FROZEN, k] = 1
        still_open = 0
        for j in range(open_count):
            c = A[OPEN, j]
            for k in range(count):
                if (A[EGRESS_OF, k] == c or A[INGRESS_OF, k] == c) and A[FROZEN, k] == 0:
                    A[OPEN, still_open] = c
                    still_open += 1
                    break
        open_count = still_open


@_inner
def _layered(count: int, ingress_capacity: float, num_gpus: int, A: np.ndarray, AF: np.ndarray) -> None:
    """Rates ``AF[RATE_OF, :count]`` of every sending set's flows: layer by layer, lowest layer number first.

    ``A[LAYER_OF, f]`` ranks flow f (exclusive tiers first, then ``SHARED_LAYER``, then
    ``ZERO_LAYER``). Each layer is one max-min fair allocation (``_fill``) within the
    ingress the layers before it left; a GPU's sending set is of one layer, so its egress
    is whole for that layer. A flow whose receiver is saturated by higher layers gets 0.
    """
    for g in range(num_gpus):
        AF[LEFT, g] = ingress_capacity
    previous = -1
    while True:
        layer = -1
        for f in range(count):
            if A[LAYER_OF, f] > previous and (layer < 0 or A[LAYER_OF, f] < layer):
                layer = A[LAYER_OF, f]
        if layer < 0:
            return
        members = 0
        for f in range(count):
            if A[LAYER_OF, f] == layer:
                A[MEMBER, members] = f
                members += 1
        _fill(members, A, AF)
        for k in range(members):
            f = A[MEMBER, k]
            r = A[RECEIVER_OF, f]
            if r >= 0:
                rest = AF[LEFT, r] - AF[RATE_OF, f]
                AF[LEFT, r] = rest if rest > 0.0 else 0.0
        previous = layer


@_compiled
def scratch(flows: int, num_gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """Scratch rows for ``flows`` flows among ``num_gpus`` GPUs (``A``, ``AF``)."""
    width = max(2 * flows, num_gpus) + 1
    return np.zeros((11, width), dtype=np.int64), np.zeros((7, width))


def layered_rates(senders: list[int], receivers: list[int | None], weights: list[float], layers: list[int],
                  ingress_capacity: float) -> list[float]:
    """The layered allocation (section 3.2) of flows given as lists, for tests and worked examples.

    ``receivers[i]`` is None for traffic leaving the modelled GPUs.
    """
    count = len(weights)
    num_gpus = max([*senders, *(r for r in receivers if r is not None)], default=0) + 1
    A, AF = scratch(count, num_gpus)
    A[SENDER, :count] = senders
    A[RECEIVER_OF, :count] = [-1 if r is None else r for r in receivers]
    A[LAYER_OF, :count] = layers
    AF[WEIGHT_OF, :count] = weights
    _layered(count, ingress_capacity, num_gpus, A, AF)
    return AF[RATE_OF, :count].tolist()


@_inner
def choose_sending_set(s: int, count: int, Q: np.ndarray, F: np.ndarray, I: np.ndarray, A: np.ndarray) -> int:
    """Fill ``A[CHOSEN]`` with the sending set among GPU s's ``count`` ready transfers (``Q[READY_QUEUE, s]``, in
    ready order) and return its size; set ``WEIGHT``, ``SHARE`` and ``LAYER`` of each chosen task.

    1. exclusive: the transfer with the earliest key (``key_before``) sends alone, weight 1;
    2. shared: else every transfer with priority > 0, weighted by it;
    3. zero: else every transfer, weight 1.
    ``SHARE`` is the sender-only share, ``weight / sum of weights``.
    """
    winner = -1
    for k in range(count):
        i = Q[READY_QUEUE, s, k]
        if I[TIER, i] >= 0 and (winner < 0 or key_before(I[TIER, i], F[KEY, i], I[INDEX, i], I[COMM, i], I[STAGE, i],
                                                          I[TIER, winner], F[KEY, winner], I[INDEX, winner],
                                                          I[COMM, winner], I[STAGE, winner])):
            winner = i
    if winner >= 0:
        F[WEIGHT, winner] = 1.0
        F[SHARE, winner] = 1.0
        I[LAYER, winner] = I[TIER, winner]
        A[CHOSEN, 0] = winner
        return 1
    size = 0
    for k in range(count):
        i = Q[READY_QUEUE, s, k]
        if F[PRIORITY, i] > 0.0:
            A[CHOSEN, size] = i
            size += 1
            F[WEIGHT, i] = F[PRIORITY, i]
            I[LAYER, i] = SHARED_LAYER
    if size == 0:
        for k in range(count):
            i = Q[READY_QUEUE, s, k]
            A[CHOSEN, size] = i
            size += 1
            F[WEIGHT, i] = 1.0
            I[LAYER, i] = ZERO_LAYER
    total = 0.0
    for k in range(size):
        total += F[WEIGHT, A[CHOSEN, k]]
    for k in range(size):
        F[SHARE, A[CHOSEN, k]] = F[WEIGHT, A[CHOSEN, k]] / total
    return size


# -- the event loop (sections 2, 3 and 6) -----------------------------------------------


@_inner
def _heap_less(HT: np.ndarray, HI: np.ndarray, a: int, b: int) -> bool:
    return HT[a] < HT[b] or (HT[a] == HT[b] and HI[0, a] < HI[0, b])


@_inner
def _heap_swap(HT: np.ndarray, HI: np.ndarray, a: int, b: int) -> None:
    HT[a], HT[b] = HT[b], HT[a]
    HI[0, a], HI[0, b] = HI[0, b], HI[0, a]
    HI[1, a], HI[1, b] = HI[1, b], HI[1, a]


@_inner
def _sift_down(HT: np.ndarray, HI: np.ndarray, size: int, i: int) -> None:
    while True:
        child = 2 * i + 1
        if child >= size:
            return
        if child + 1 < size and _heap_less(HT, HI, child + 1, child):
            child += 1
        if not _heap_less(HT, HI, child, i):
            return
        _heap_swap(HT, HI, i, child)
        i = child


@_inner
def _heap_push(HT: np.ndarray, HI: np.ndarray, I: np.ndarray, C: np.ndarray, at: float, number: int,
               task: int) -> None:
    """Push ``(at, number, task)`` (time, sequence number, task) on the heap of projected ends.

    A full heap first drops its stale entries: at most one per task is live."""
    size = C[_HEAP_SIZE]
    if size == len(HT):
        kept = 0
        for k in range(size):
            if I[LIVE, HI[1, k]] == HI[0, k]:
                HT[kept], HI[0, kept], HI[1, kept] = HT[k], HI[0, k], HI[1, k]
                kept += 1
        size = kept
        for k in range(size // 2 - 1, -1, -1):
            _sift_down(HT, HI, size, k)
    HT[size], HI[0, size], HI[1, size] = at, number, task
    i = size
    while i > 0:
        parent = (i - 1) // 2
        if not _heap_less(HT, HI, i, parent):
            break
        _heap_swap(HT, HI, i, parent)
        i = parent
    C[_HEAP_SIZE] = size + 1


@_inner
def _heap_pop(HT: np.ndarray, HI: np.ndarray, C: np.ndarray) -> None:
    size = C[_HEAP_SIZE] - 1
    _heap_swap(HT, HI, 0, size)
    C[_HEAP_SIZE] = size
    _sift_down(HT, HI, size, 0)


@_inner
def _set_rate(i: int, rate: float, throttled: bool, now: float, F: np.ndarray, I: np.ndarray, HT: np.ndarray,
              HI: np.ndarray, SI: np.ndarray, SF: np.ndarray, C: np.ndarray) -> None:
    """Close task i's stretch at its old rate and continue at the new one.

    A throttled stretch at rate 0 (a flow waiting at a receiver that higher layers
    saturate) counts as throttled time but is no segment: nothing progresses.
    """
    old = F[RATE, i]
    if throttled == (I[THROTTLED_NOW, i] == 1) and abs(rate - old) <= RATE_TOLERANCE * old:
        return  # the same rate: a new segment starts only when something really changes
    since = F[SINCE, i]
    if now > since:
        if old > 0.0:
            F[REMAINING, i] -= old * (now - since)
            k = C[_SEGMENTS]
            if k < len(SI):
                SI[k], SF[0, k], SF[1, k], SF[2, k] = i, since, now, old
            C[_SEGMENTS] = k + 1  # counted even when not kept: the caller then runs again with room
        if I[THROTTLED_NOW, i] == 1:  # flagged only once the stretch has lasted, never for an instant
            F[THROTTLED_TIME, i] += now - since
            I[THROTTLED, i] = 1
    F[SINCE, i] = now
    F[RATE, i] = rate
    I[THROTTLED_NOW, i] = 1 if throttled else 0
    if rate > 0.0:
        if np.isnan(F[START, i]):
            F[START, i] = now
        C[_SEQ] += 1
        I[LIVE, i] = C[_SEQ]
        left = F[REMAINING, i] if F[REMAINING, i] > 0.0 else 0.0
        _heap_push(HT, HI, I, C, now + left / rate, C[_SEQ], i)
    else:
        I[LIVE, i] = -1


@_inner
def _mark(P: np.ndarray, C: np.ndarray, flag: int, members: int, counter: int, g: int) -> None:
    if P[flag, g] == 0:
        P[flag, g] = 1
        P[members, C[counter]] = g
        C[counter] += 1


@_inner
def _push(K: np.ndarray, C: np.ndarray, kind: int, a: int) -> None:
    top = C[_STACK]
    K[0, top], K[1, top], K[2, top] = kind, a, 0
    C[_STACK] = top + 1


@_inner
def _settle(now: float, F: np.ndarray, I: np.ndarray, P: np.ndarray, Q: np.ndarray, K: np.ndarray, C: np.ndarray,
            release_start: np.ndarray, release_task: np.ndarray, order_start: np.ndarray,
            order_task: np.ndarray) -> None:
    """Apply the readiness chains on the stack K: releases of ended tasks and compute starts (section 2).

    Zero-work tasks end the instant they may start and release in turn; the stack
    reproduces the depth-first order of a recursive walk.
    """
    while C[_STACK] > 0:
        top = C[_STACK] - 1
        if K[0, top] == _RELEASE:
            node, k = K[1, top], K[2, top]
            if release_start[node] + k >= release_start[node + 1]:
                C[_STACK] = top
                continue
            K[2, top] = k + 1
            dependent = release_task[release_start[node] + k]
            if I[COMM, dependent] >= 0:  # a transfer becomes ready
                F[READY, dependent] = now
                if F[LENGTH, dependent] == 0.0:
                    F[START, dependent] = now
                    F[END, dependent] = now
                    C[_DONE] += 1
                    _push(K, C, _RELEASE, dependent)
                    continue
                if I[TIER, dependent] >= 0:
                    F[KEY, dependent] = ready_key(now)
                s = I[GPU, dependent]
                Q[READY_QUEUE, s, P[READY_COUNT, s]] = dependent
                P[READY_COUNT, s] += 1
                _mark(P, C, DIRTY_COMM, DIRTY_COMM_LIST, _DIRTY_COMM, s)
            else:
                I[WAITING, dependent] -= 1
                _push(K, C, _TRY_START, I[GPU, dependent])
        else:
            s = K[1, top]
            if P[BUSY, s] >= 0 or P[NEXT, s] >= order_start[s + 1] - order_start[s]:
                C[_STACK] = top
                continue
            task = order_task[order_start[s] + P[NEXT, s]]
            if I[WAITING, task] > 0:
                C[_STACK] = top
                continue
            P[NEXT, s] += 1
            F[READY, task] = now
            if F[LENGTH, task] == 0.0:  # a W of no work ends the instant it may start
                F[START, task] = now
                F[END, task] = now
                C[_DONE] += 1
                _push(K, C, _RELEASE, task)
                continue
            P[BUSY, s] = task
            _mark(P, C, DIRTY_COMPUTE, DIRTY_COMPUTE_LIST, _DIRTY_COMPUTE, s)


@_inner
def _sort_row(P: np.ndarray, row: int, first: int, stop: int) -> None:
    """Sort ``P[row, first:stop]`` in place (insertion sort: the rows are a few GPUs long)."""
    for k in range(first + 1, stop):
        value = P[row, k]
        j = k - 1
        while j >= first and P[row, j] > value:
            P[row, j + 1] = P[row, j]
            j -= 1
        P[row, j + 1] = value


@_inner
def _coupled(h: int, other: int, P: np.ndarray, Q: np.ndarray, I: np.ndarray) -> bool:
    """Whether a flow of one GPU's sending set goes to the other."""
    for k in range(P[SENDING_COUNT, h]):
        if I[RECEIVER, Q[SENDING_SET, h, k]] == other:
            return True
    for k in range(P[SENDING_COUNT, other]):
        if I[RECEIVER, Q[SENDING_SET, other, k]] == h:
            return True
    return False


@_inner
def _sending_sets(now: float, F: np.ndarray, I: np.ndarray, P: np.ndarray, Q: np.ndarray, A: np.ndarray,
                  HT: np.ndarray, HI: np.ndarray, SI: np.ndarray, SF: np.ndarray, C: np.ndarray,
                  peer_start: np.ndarray, peer_task: np.ndarray) -> int:
    """New sending sets of the GPUs whose ready transfers changed, and the groups of GPUs whose rates that can
    change: ``P[GROUP]`` lists them one after the other, group g ending at ``P[GROUP_END, g]``. Returns how
    many groups there are."""
    p = P.shape[1]
    if C[_DIRTY_COMM] == 0:
        return 0
    for s in range(p):
        P[SEED, s] = 0
    for k in range(C[_DIRTY_COMM]):
        s = P[DIRTY_COMM_LIST, k]
        P[SEED, s] = 1
        size = choose_sending_set(s, P[READY_COUNT, s], Q, F, I, A)
        for j in range(P[SENDING_COUNT, s]):
            i = Q[SENDING_SET, s, j]
            if I[RECEIVER, i] >= 0:
                P[SEED, I[RECEIVER, i]] = 1  # its receiver's other inflow may speed up
            if F[RATE, i] != 0.0 or I[THROTTLED_NOW, i] == 1:
                kept = False
                for c in range(size):
                    if A[CHOSEN, c] == i:
                        kept = True
                if not kept:
                    _set_rate(i, 0.0, False, now, F, I, HT, HI, SI, SF, C)
        for c in range(size):
            Q[SENDING_SET, s, c] = A[CHOSEN, c]
        P[SENDING_COUNT, s] = size
        P[DIRTY_COMM, s] = 0
    C[_DIRTY_COMM] = 0
    # Two GPUs are coupled while a flow between them shares an ingress limit. The rates
    # that can change are those of the connected groups of coupled GPUs around the
    # seeds; a walk over each GPU's peers in the task graph finds them, whatever the
    # shape of the network (a line, a ring, flows both ways).
    for s in range(p):
        P[GROUPED, s] = 0
    groups = 0
    size = 0
    for seed in range(p):
        if P[SEED, seed] == 0 or P[GROUPED, seed] == 1:
            continue
        P[GROUPED, seed] = 1
        first = size
        P[GROUP, size] = seed
        size += 1
        k = first
        while k < size:  # breadth first
            h = P[GROUP, k]
            k += 1
            for j in range(peer_start[h], peer_start[h + 1]):
                other = peer_task[j]
                if P[GROUPED, other] == 0 and _coupled(h, other, P, Q, I):
                    P[GROUPED, other] = 1
                    P[GROUP, size] = other
                    size += 1
        _sort_row(P, GROUP, first, size)
        P[GROUP_END, groups] = size
        groups += 1
    return groups


@_inner
def _group_flows(g: int, ingress_capacity: float, F: np.ndarray, I: np.ndarray, P: np.ndarray, PF: np.ndarray,
                 Q: np.ndarray, A: np.ndarray) -> int:
    """List the flows of group g in ``A[FLOWS]`` and return their count, negative when sender-only shares
    already respect every ingress limit: they are then the layered max-min allocation, and none is throttled."""
    first = P[GROUP_END, g - 1] if g > 0 else 0
    count = 0
    for k in range(first, P[GROUP_END, g]):
        PF[INFLOW, P[GROUP, k]] = 0.0
    for k in range(first, P[GROUP_END, g]):
        h = P[GROUP, k]
        for j in range(P[SENDING_COUNT, h]):
            i = Q[SENDING_SET, h, j]
            A[FLOWS, count] = i
            count += 1
            if I[RECEIVER, i] >= 0:
                PF[INFLOW, I[RECEIVER, i]] += F[SHARE, i]  # the group is closed: every receiver lies in it
    highest = 0.0
    for k in range(first, P[GROUP_END, g]):
        if PF[INFLOW, P[GROUP, k]] > highest:
            highest = PF[INFLOW, P[GROUP, k]]
    return -count if highest <= ingress_capacity * (1.0 + LEVEL_TOLERANCE) else count


@_inner
def _contended_rates(count: int, ingress_capacity: float, num_gpus: int, F: np.ndarray, I: np.ndarray,
                     A: np.ndarray, AF: np.ndarray) -> None:
    """The layered allocation of the flows ``A[FLOWS, :count]``, into ``AF[RATE_OF, :count]``."""
    for f in range(count):
        i = A[FLOWS, f]
        A[SENDER, f] = I[GPU, i]
        A[RECEIVER_OF, f] = I[RECEIVER, i]
        A[LAYER_OF, f] = I[LAYER, i]
        AF[WEIGHT_OF, f] = F[WEIGHT, i]
    _layered(count, ingress_capacity, num_gpus, A, AF)


@_inner
def _set_group_rates(g: int, count: int, contended: bool, now: float, F: np.ndarray, I: np.ndarray, P: np.ndarray,
                     PF: np.ndarray, Q: np.ndarray, A: np.ndarray, AF: np.ndarray, HT: np.ndarray, HI: np.ndarray,
                     SI: np.ndarray, SF: np.ndarray, C: np.ndarray) -> None:
    """Give group g's flows their rates (sender-only shares, or ``AF[RATE_OF]`` when contended), then the grad_sync
    rate of each of its GPUs (section 3.3), marking the GPUs whose compute it changes."""
    for k in range(count):
        i = A[FLOWS, k]
        if contended:
            rate = AF[RATE_OF, k]
            _set_rate(i, rate, rate < F[SHARE, i] * (1.0 - THROTTLE_TOLERANCE), now, F, I, HT, HI, SI, SF, C)
        elif F[SHARE, i] != F[RATE, i] or I[THROTTLED_NOW, i] == 1:
            _set_rate(i, F[SHARE, i], False, now, F, I, HT, HI, SI, SF, C)
    for k in range(P[GROUP_END, g - 1] if g > 0 else 0, P[GROUP_END, g]):
        h = P[GROUP, k]
        sync = 0.0
        for j in range(P[SENDING_COUNT, h]):
            i = Q[SENDING_SET, h, j]
            if I[COMM, i] == GRAD_SYNC:
                sync += F[RATE, i]
        if sync != PF[SYNC_RATE, h]:
            PF[SYNC_RATE, h] = sync
            _mark(P, C, DIRTY_COMPUTE, DIRTY_COMPUTE_LIST, _DIRTY_COMPUTE, h)


@_inner
def _compute_rates(now: float, F: np.ndarray, I: np.ndarray, P: np.ndarray, PF: np.ndarray, HT: np.ndarray,
                   HI: np.ndarray, SI: np.ndarray, SF: np.ndarray, C: np.ndarray) -> None:
    """New rates of the running compute on GPUs whose grad_sync rate changed or that started a task."""
    count = C[_DIRTY_COMPUTE]
    _sort_row(P, DIRTY_COMPUTE_LIST, 0, count)
    for k in range(count):
        s = P[DIRTY_COMPUTE_LIST, k]
        P[DIRTY_COMPUTE, s] = 0
        task = P[BUSY, s]
        if task >= 0:
            _set_rate(task, 1.0 - F[IMPACT, task] * PF[SYNC_RATE, s], False, now, F, I, HT, HI, SI, SF, C)
    C[_DIRTY_COMPUTE] = 0


@_inner
def _finish(i: int, now: float, F: np.ndarray, I: np.ndarray, P: np.ndarray, Q: np.ndarray, K: np.ndarray,
            HT: np.ndarray, HI: np.ndarray, SI: np.ndarray, SF: np.ndarray, C: np.ndarray) -> None:
    """End task i now and stack what follows: the next compute of its GPU, then its releases."""
    _set_rate(i, 0.0, False, now, F, I, HT, HI, SI, SF, C)
    F[REMAINING, i] = 0.0
    F[END, i] = now
    C[_DONE] += 1
    s = I[GPU, i]
    _push(K, C, _RELEASE, i)
    if I[COMM, i] < 0:
        P[BUSY, s] = -1
        _push(K, C, _TRY_START, s)  # the next compute starts before the releases
    else:
        last = P[READY_COUNT, s] - 1
        j = 0
        while Q[READY_QUEUE, s, j] != i:
            j += 1
        for j in range(j, last):
            Q[READY_QUEUE, s, j] = Q[READY_QUEUE, s, j + 1]
        P[READY_COUNT, s] = last
        _mark(P, C, DIRTY_COMM, DIRTY_COMM_LIST, _DIRTY_COMM, s)


@_compiled
def simulate(length: np.ndarray, gpu: np.ndarray, receiver: np.ndarray, comm: np.ndarray, stage: np.ndarray,
             index: np.ndarray, impact: np.ndarray, needs_count: np.ndarray, release_start: np.ndarray,
             release_task: np.ndarray, order_start: np.ndarray, order_task: np.ndarray, peer_start: np.ndarray,
             peer_task: np.ndarray, kind_tier: np.ndarray, kind_priority: np.ndarray, ingress_capacity: float,
             segment_room: int) -> tuple:
    """Simulate one iteration of the task graph given as arrays under one policy.

    ``kind_tier[k]`` is the exclusive tier rank (0 = 'a') of transfer kind ``k`` in
    ``COMM_KINDS`` order, -1 for shared; ``kind_priority[k]`` its shared priority.
    Returns ``(status, F, I, segments, segment_task, segment_times, P)``: ``status`` is
    ``DONE`` or ``STUCK``; the rows ``READY``, ``START``, ``END`` and ``THROTTLED_TIME`` of
    ``F`` and ``THROTTLED`` of ``I`` are every task's record; ``segments`` counts the
    stretches at a constant positive rate, of which the first ``segment_room`` are kept:
    task, then ``(t0, t1, rate)`` rows. ``P`` holds each GPU's next compute and busy task.
    """
    n = len(length)
    p = len(order_start) - 1
    F = np.zeros((TASK_FLOATS, n))
    F[LENGTH] = length
    F[IMPACT] = impact
    F[REMAINING] = length
    F[START] = np.nan
    F[END] = np.nan
    F[READY] = np.nan
    I = np.zeros((TASK_INTS, n), dtype=np.int64)
    I[GPU] = gpu
    I[RECEIVER] = receiver
    I[COMM] = comm
    I[STAGE] = stage
    I[INDEX] = index
    I[WAITING] = needs_count
    I[LIVE] = -1
    I[TIER] = -1
    per_gpu = np.zeros(p, dtype=np.int64)
    for i in range(n):
        if comm[i] >= 0:
            per_gpu[gpu[i]] += 1
            I[TIER, i] = kind_tier[comm[i]]
            F[PRIORITY, i] = kind_priority[comm[i]]
    room = max(1, per_gpu.max())
    P = np.zeros((12, p), dtype=np.int64)
    P[BUSY] = -1
    PF = np.zeros((2, p))
    Q = np.empty((2, p, room), dtype=np.int64)
    A, AF = scratch(p * room, p)
    C = np.zeros(7, dtype=np.int64)
    heap_room = 2 * n + 16
    HT = np.empty(heap_room)
    HI = np.empty((2, heap_room), dtype=np.int64)
    SI = np.empty(segment_room, dtype=np.int64)
    SF = np.empty((3, segment_room))
    K = np.empty((3, 2 * n + 2 * p + 8), dtype=np.int64)

    now = 0.0
    for s in range(p):
        _push(K, C, _TRY_START, s)
        _settle(now, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
    ending = np.empty(n, dtype=np.int64)
    status = DONE
    while True:
        # new rates where the last event's changes reach
        for group in range(_sending_sets(now, F, I, P, Q, A, HT, HI, SI, SF, C, peer_start, peer_task)):
            count = _group_flows(group, ingress_capacity, F, I, P, PF, Q, A)
            if count > 0:
                _contended_rates(count, ingress_capacity, p, F, I, A, AF)
            _set_group_rates(group, abs(count), count > 0, now, F, I, P, PF, Q, A, AF, HT, HI, SI, SF, C)
        _compute_rates(now, F, I, P, PF, HT, HI, SI, SF, C)
        if C[_DONE] >= n:
            break
        # the next event: every task whose projected end lies within the tolerance of the earliest
        while C[_HEAP_SIZE] > 0 and I[LIVE, HI[1, 0]] != HI[0, 0]:
            _heap_pop(HT, HI, C)
        if C[_HEAP_SIZE] == 0:
            status = STUCK
            break
        now = HT[0]
        limit = now + END_TOLERANCE * max(1.0, abs(now))
        count = 0
        while C[_HEAP_SIZE] > 0 and HT[0] <= limit:
            number, i = HI[0, 0], HI[1, 0]
            _heap_pop(HT, HI, C)
            if I[LIVE, i] == number:
                ending[count] = i
                count += 1
        for k in range(count):
            _finish(ending[k], now, F, I, P, Q, K, HT, HI, SI, SF, C)
            _settle(now, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
    kept = min(C[_SEGMENTS], segment_room)
    return status, F, I, C[_SEGMENTS], SI[:kept], SF[:, :kept], P


@_compiled
def figures(gpu: np.ndarray, comm: np.ndarray, rises: np.ndarray, falls: np.ndarray,
            num_gpus: int, chunks: int, start: np.ndarray, end: np.ndarray, throttled: np.ndarray,
            throttled_time: np.ndarray, out: np.ndarray) -> None:
    """The per-simulation figures a sweep keeps, into ``out``: completion time, throttled time, throttled
    transfers, then per GPU its compute time, span and peak activations (``3 + 3 x num_gpus`` values).

    Sums run in task order. Activations (section 7): ``rises[i]`` forward parts of task i
    start with it, ``falls[i]`` backward or weight-gradient parts end with it; at one
    instant falls come first; peaks are in micro-batches of a GPU's whole share.
    """
    n = len(gpu)
    completion = -np.inf
    throttle_sum = 0.0
    throttle_count = 0
    busy = out[3:3 + num_gpus]
    span = out[3 + num_gpus:3 + 2 * num_gpus]
    peak = out[3 + 2 * num_gpus:3 + 3 * num_gpus]
    first = np.full(num_gpus, np.inf)
    last = np.full(num_gpus, -np.inf)
    busy[:] = 0.0
    events = 0
    for i in range(n):
        if end[i] > completion:
            completion = end[i]
        if comm[i] < 0:
            busy[gpu[i]] += end[i] - start[i]
            if start[i] < first[gpu[i]]:
                first[gpu[i]] = start[i]
            if end[i] > last[gpu[i]]:
                last[gpu[i]] = end[i]
            events += rises[i] + falls[i]
        elif throttled[i] == 1:
            throttle_count += 1
            throttle_sum += throttled_time[i]
    times = np.empty(events)
    owners = np.empty(events, dtype=np.int64)
    deltas = np.empty(events, dtype=np.int64)
    k = 0
    for i in range(n):  # falls first, so that a stable sort by time keeps them before rises at one instant
        for _ in range(falls[i]):
            times[k], owners[k], deltas[k] = end[i], gpu[i], -1
            k += 1
    for i in range(n):
        for _ in range(rises[i]):
            times[k], owners[k], deltas[k] = start[i], gpu[i], 1
            k += 1
    level = np.zeros(num_gpus, dtype=np.int64)
    highest = np.zeros(num_gpus, dtype=np.int64)
    for k in np.argsort(times, kind="mergesort"):
        h = owners[k]
        level[h] += deltas[k]
        if level[h] > highest[h]:
            highest[h] = level[h]
    for h in range(num_gpus):
        span[h] = last[h] - first[h]
        peak[h] = highest[h] / chunks
    out[0] = completion
    out[1] = throttle_sum
    out[2] = throttle_count


@_compiled
def simulate_policies(length: np.ndarray, gpu: np.ndarray, receiver: np.ndarray, comm: np.ndarray,
                      stage: np.ndarray, index: np.ndarray, impact: np.ndarray, needs_count: np.ndarray,
                      release_start: np.ndarray, release_task: np.ndarray, order_start: np.ndarray,
                      order_task: np.ndarray, peer_start: np.ndarray, peer_task: np.ndarray, rises: np.ndarray,
                      falls: np.ndarray, chunks: int, kind_tiers: np.ndarray, kind_priorities: np.ndarray,
                      ingress_capacity: float) -> np.ndarray:
    """``figures`` of one simulation per policy (rows of ``kind_tiers`` and ``kind_priorities``), in one call.

    A stuck simulation's row is all NaN.
    """
    p = len(order_start) - 1
    out = np.full((len(kind_tiers), 3 + 3 * p), np.nan)
    for row in range(len(kind_tiers)):
        result = simulate(length, gpu, receiver, comm, stage, index, impact, needs_count, release_start,
                          release_task, order_start, order_task, peer_start, peer_task, kind_tiers[row],
                          kind_priorities[row], ingress_capacity, 0)
        status, F, I = result[0], result[1], result[2]
        if status == DONE:
            figures(gpu, comm, rises, falls, p, chunks, F[START], F[END], I[THROTTLED], F[THROTTLED_TIME], out[row])
    return out
