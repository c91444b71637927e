"""Who sends and at what rate (docs/model.md sections 3.1 to 3.3): sending sets, the layered max-min
allocation of the GPUs an event couples, and the compute rates that grad_sync traffic slows."""

from __future__ import annotations

import numpy as np

from .events import mark, set_rate, sort_row
from .jit import exposed, inner, within
from .state import (
    BOUND_MEMBER,
    BOUND_START,
    BUSY,
    CAPACITY,
    CHOSEN,
    CHOSEN_NOW,
    COMM,
    DIRTY_COMM,
    DIRTY_COMM_COUNT,
    DIRTY_COMM_LIST,
    DIRTY_COMPUTE,
    DIRTY_COMPUTE_COUNT,
    DIRTY_COMPUTE_LIST,
    EGRESS_OF,
    EGRESS_SLOT,
    FLOWS,
    FREE,
    FROZEN,
    GPU,
    GRAD_SYNC,
    GROUP,
    GROUP_END,
    GROUPED,
    IMPACT,
    INDEX,
    INFLOW,
    INGRESS_OF,
    INGRESS_SLOT,
    KEY,
    LAYER,
    LAYER_OF,
    LEFT,
    LEVEL,
    LEVEL_TOLERANCE,
    LIVE,
    MEMBER,
    OPEN,
    PORTS,
    PRIORITY,
    RATE,
    RATE_OF,
    READY_COUNT,
    READY_QUEUE,
    RECEIVER,
    RECEIVER_OF,
    SEED,
    SEED_LIST,
    SENDER,
    SENDING_COUNT,
    SENDING_SET,
    SHARE,
    SHARED_LAYER,
    STAGE,
    STALE,
    SYNC_RATE,
    THROTTLE_TOLERANCE,
    THROTTLED_NOW,
    TIER,
    UNFROZEN,
    WEIGHT,
    WEIGHT_OF,
    ZERO_LAYER,
)


@exposed
def ready_key(ready: float) -> float:
    """The ready time as exclusive tiers compare it: in units of 1e-9, rounded, so that float noise
    cannot reorder transfers that became ready together."""
    return np.rint(ready * 1e9)


@inner
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


@inner
def _froze(c: int, A: np.ndarray) -> None:
    """One flow of capacity c (-1: none) froze: one fewer of its flows is unfrozen, and its level is stale."""
    if c >= 0:
        A[LIVE, c] -= 1
        A[STALE, c] = 1


@inner
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
    if count == 0:
        return
    # the capacities: each sending GPU's egress, then each receiving GPU's ingress, by GPU number (a GPU's slot in
    # each is marked, then counted, over the range of GPUs the flows touch)
    low, high = A[SENDER, A[MEMBER, 0]], A[SENDER, A[MEMBER, 0]]
    for k in range(count):
        f = A[MEMBER, k]
        low, high = min(low, A[SENDER, f]), max(high, A[SENDER, f])
        if A[RECEIVER_OF, f] >= 0:
            low, high = min(low, A[RECEIVER_OF, f]), max(high, A[RECEIVER_OF, f])
    for g in range(low, high + 1):
        A[EGRESS_SLOT, g] = -1
        A[INGRESS_SLOT, g] = -1
    for k in range(count):
        f = A[MEMBER, k]
        A[EGRESS_SLOT, A[SENDER, f]] = 0
        if A[RECEIVER_OF, f] >= 0:
            A[INGRESS_SLOT, A[RECEIVER_OF, f]] = 0
    total = 0
    for g in range(low, high + 1):
        if A[EGRESS_SLOT, g] == 0:
            A[EGRESS_SLOT, g] = total
            A[PORTS, total] = g
            AF[CAPACITY, total] = 1.0
            total += 1
    for g in range(low, high + 1):
        if A[INGRESS_SLOT, g] == 0:
            A[INGRESS_SLOT, g] = total
            A[PORTS, total] = g
            AF[CAPACITY, total] = AF[LEFT, g]
            total += 1
    for c in range(total + 1):
        A[BOUND_START, c] = 0
    for c in range(total):
        A[OPEN, c] = c
    for k in range(count):
        f = A[MEMBER, k]
        A[EGRESS_OF, k] = A[EGRESS_SLOT, A[SENDER, f]]
        A[INGRESS_OF, k] = A[INGRESS_SLOT, A[RECEIVER_OF, f]] if A[RECEIVER_OF, f] >= 0 else -1
        A[FROZEN, k] = 0
        AF[RATE_OF, f] = 0.0
        A[BOUND_START, A[EGRESS_OF, k] + 1] += 1
        if A[INGRESS_OF, k] >= 0:
            A[BOUND_START, A[INGRESS_OF, k] + 1] += 1
    # each capacity's flows, in their order: every sum over them below adds in the order of the flows, the same
    # floats whichever way they are found
    for c in range(total):
        A[BOUND_START, c + 1] += A[BOUND_START, c]
    for k in range(count):
        c = A[EGRESS_OF, k]
        A[BOUND_MEMBER, A[BOUND_START, c]] = k
        A[BOUND_START, c] += 1
        c = A[INGRESS_OF, k]
        if c >= 0:
            A[BOUND_MEMBER, A[BOUND_START, c]] = k
            A[BOUND_START, c] += 1
    for c in range(total, 0, -1):
        A[BOUND_START, c] = A[BOUND_START, c - 1]
    A[BOUND_START, 0] = 0
    for c in range(total):
        A[STALE, c] = 1
        A[LIVE, c] = A[BOUND_START, c + 1] - A[BOUND_START, c]
    open_count = total
    while open_count > 0:
        lowest = np.inf
        for j in range(open_count):
            c = A[OPEN, j]
            # a capacity's level changes only when one of its flows freezes: found again then, in the same way, and
            # otherwise the same floats as before
            if A[STALE, c] == 1:
                A[STALE, c] = 0
                used = 0.0
                unfrozen = 0.0
                for m in range(A[BOUND_START, c], A[BOUND_START, c + 1]):
                    k = A[BOUND_MEMBER, m]
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
                for m in range(A[BOUND_START, c], A[BOUND_START, c + 1]):
                    k = A[BOUND_MEMBER, m]
                    if A[FROZEN, k] == 0:
                        f = A[MEMBER, k]
                        AF[RATE_OF, f] = AF[WEIGHT_OF, f] * AF[FREE, c] / AF[UNFROZEN, c]
                        A[FROZEN, k] = 1
                        _froze(A[EGRESS_OF, k], A)
                        _froze(A[INGRESS_OF, k], A)
        still_open = 0
        for j in range(open_count):
            c = A[OPEN, j]
            if A[LIVE, c] > 0:
                A[OPEN, still_open] = c
                still_open += 1
        open_count = still_open



@exposed
def _layered(count: int, ingress_capacity: float, A: np.ndarray, AF: np.ndarray) -> None:
    """Rates ``AF[RATE_OF, :count]`` of every sending set's flows: layer by layer, lowest layer number first.

    ``A[LAYER_OF, f]`` ranks flow f (exclusive tiers first, then ``SHARED_LAYER``, then
    ``ZERO_LAYER``). Each layer is one max-min fair allocation (``_fill``) within the
    ingress the layers before it left; a GPU's sending set is of one layer, so its egress
    is whole for that layer. A flow whose receiver is saturated by higher layers gets 0.
    """
    for f in range(count):  # the ingress of the flows' receivers, the only GPUs ``_fill`` reads it of
        if A[RECEIVER_OF, f] >= 0:
            AF[LEFT, A[RECEIVER_OF, f]] = ingress_capacity
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


#: The rows of the scratch ``A`` (integers) and ``AF`` (floats).
SCRATCH_INTS, SCRATCH_FLOATS = 17, 7


@within
def scratch_width(flows: int, num_gpus: int) -> int:
    """The columns of the scratch rows for ``flows`` flows among ``num_gpus`` GPUs: an odd number of cache lines (of 8
    words), so that one column's entries of every row lie in different sets of the processor's caches (rows a power
    of two of lines apart, as they were for most graphs, compete for one set, eight lines at most)."""
    return 8 * (((max(2 * flows, num_gpus) + 8) // 8) | 1)


@within
def scratch(flows: int, num_gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """Scratch rows for ``flows`` flows among ``num_gpus`` GPUs (``A``, ``AF``), zero: compiled into the compiled code
    that calls it, and plain numpy from Python (no compile before a first compile's first function)."""
    width = scratch_width(flows, num_gpus)
    A = np.empty((SCRATCH_INTS, width), dtype=np.int64)
    AF = np.empty((SCRATCH_FLOATS, width))
    A[:] = 0
    AF[:] = 0.0
    return A, AF


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
    _layered(count, ingress_capacity, A, AF)
    return AF[RATE_OF, :count].tolist()


@exposed
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
        if I[i, TIER] >= 0 and (winner < 0 or key_before(I[i, TIER], F[i, KEY], I[i, INDEX], I[i, COMM], I[i, STAGE],
                                                          I[winner, TIER], F[winner, KEY], I[winner, INDEX],
                                                          I[winner, COMM], I[winner, STAGE])):
            winner = i
    if winner >= 0:
        F[winner, WEIGHT] = 1.0
        F[winner, SHARE] = 1.0
        I[winner, LAYER] = I[winner, TIER]
        A[CHOSEN, 0] = winner
        return 1
    size = 0
    for k in range(count):
        i = Q[READY_QUEUE, s, k]
        if F[i, PRIORITY] > 0.0:
            A[CHOSEN, size] = i
            size += 1
            F[i, WEIGHT] = F[i, PRIORITY]
            I[i, LAYER] = SHARED_LAYER
    if size == 0:
        for k in range(count):
            i = Q[READY_QUEUE, s, k]
            A[CHOSEN, size] = i
            size += 1
            F[i, WEIGHT] = 1.0
            I[i, LAYER] = ZERO_LAYER
    total = 0.0
    for k in range(size):
        total += F[A[CHOSEN, k], WEIGHT]
    for k in range(size):
        F[A[CHOSEN, k], SHARE] = F[A[CHOSEN, k], WEIGHT] / total
    return size


@inner
def _coupled(h: int, other: int, P: np.ndarray, Q: np.ndarray, I: np.ndarray) -> bool:
    """Whether a flow of one GPU's sending set goes to the other."""
    for k in range(P[SENDING_COUNT, h]):
        if I[Q[SENDING_SET, h, k], RECEIVER] == other:
            return True
    for k in range(P[SENDING_COUNT, other]):
        if I[Q[SENDING_SET, other, k], RECEIVER] == h:
            return True
    return False


@inner
def sending_sets(now: float, F: np.ndarray, I: np.ndarray, P: np.ndarray, Q: np.ndarray, A: np.ndarray,
                  HT: np.ndarray, HI: np.ndarray, SI: np.ndarray, SF: np.ndarray, C: np.ndarray,
                  peer_start: np.ndarray, peer_task: np.ndarray) -> int:
    """New sending sets of the GPUs whose ready transfers changed, and the groups of GPUs whose rates that can
    change: ``P[GROUP]`` lists them one after the other, group g ending at ``P[GROUP_END, g]``. Returns how
    many groups there are."""
    if C[DIRTY_COMM_COUNT] == 0:
        return 0
    seeds = 0  # listed in P[SEED_LIST], each once: the work of an event follows what it changed, not the GPUs
    for k in range(C[DIRTY_COMM_COUNT]):
        s = P[DIRTY_COMM_LIST, k]
        seeds = _seed(s, seeds, P)
        size = choose_sending_set(s, P[READY_COUNT, s], Q, F, I, A)
        for c in range(size):
            I[A[CHOSEN, c], CHOSEN_NOW] = 1
        for j in range(P[SENDING_COUNT, s]):
            i = Q[SENDING_SET, s, j]
            if I[i, RECEIVER] >= 0:
                seeds = _seed(I[i, RECEIVER], seeds, P)  # its receiver's other inflow may speed up
            if (F[i, RATE] != 0.0 or I[i, THROTTLED_NOW] == 1) and I[i, CHOSEN_NOW] == 0:
                set_rate(i, 0.0, False, now, F, I, HT, HI, SI, SF, C)  # no longer sending
        for c in range(size):
            Q[SENDING_SET, s, c] = A[CHOSEN, c]
            I[A[CHOSEN, c], CHOSEN_NOW] = 0
        P[SENDING_COUNT, s] = size
        P[DIRTY_COMM, s] = 0
    C[DIRTY_COMM_COUNT] = 0
    # Two GPUs are coupled while a flow between them shares an ingress limit. The rates
    # that can change are those of the connected groups of coupled GPUs around the
    # seeds; a walk over each GPU's peers in the task graph finds them, whatever the
    # shape of the network (a line, a ring, flows both ways).
    sort_row(P, SEED_LIST, 0, seeds)  # the groups in the order of their lowest seed
    groups = 0
    size = 0
    for m in range(seeds):
        seed = P[SEED_LIST, m]
        P[SEED, seed] = 0
        if P[GROUPED, seed] == 1:
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
        sort_row(P, GROUP, first, size)
        P[GROUP_END, groups] = size
        groups += 1
    for k in range(size):
        P[GROUPED, P[GROUP, k]] = 0
    return groups


@inner
def _seed(s: int, seeds: int, P: np.ndarray) -> int:
    """GPU s listed among the seeds (once); returns how many there are."""
    if P[SEED, s] == 0:
        P[SEED, s] = 1
        P[SEED_LIST, seeds] = s
        seeds += 1
    return seeds


@inner
def group_flows(g: int, ingress_capacity: float, F: np.ndarray, I: np.ndarray, P: np.ndarray, PF: np.ndarray,
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
            if I[i, RECEIVER] >= 0:
                PF[INFLOW, I[i, RECEIVER]] += F[i, SHARE]  # the group is closed: every receiver lies in it
    highest = 0.0
    for k in range(first, P[GROUP_END, g]):
        if PF[INFLOW, P[GROUP, k]] > highest:
            highest = PF[INFLOW, P[GROUP, k]]
    return -count if highest <= ingress_capacity * (1.0 + LEVEL_TOLERANCE) else count


@inner
def contended_rates(count: int, ingress_capacity: float, F: np.ndarray, I: np.ndarray, A: np.ndarray,
                    AF: np.ndarray) -> None:
    """The layered allocation of the flows ``A[FLOWS, :count]``, into ``AF[RATE_OF, :count]``."""
    for f in range(count):
        i = A[FLOWS, f]
        A[SENDER, f] = I[i, GPU]
        A[RECEIVER_OF, f] = I[i, RECEIVER]
        A[LAYER_OF, f] = I[i, LAYER]
        AF[WEIGHT_OF, f] = F[i, WEIGHT]
    _layered(count, ingress_capacity, A, AF)


@inner
def set_group_rates(g: int, count: int, contended: bool, now: float, F: np.ndarray, I: np.ndarray, P: np.ndarray,
                     PF: np.ndarray, Q: np.ndarray, A: np.ndarray, AF: np.ndarray, HT: np.ndarray, HI: np.ndarray,
                     SI: np.ndarray, SF: np.ndarray, C: np.ndarray) -> None:
    """Give group g's flows their rates (sender-only shares, or ``AF[RATE_OF]`` when contended), then the grad_sync
    rate of each of its GPUs (section 3.3), marking the GPUs whose compute it changes."""
    for k in range(count):
        i = A[FLOWS, k]
        if contended:
            rate = AF[RATE_OF, k]
            set_rate(i, rate, rate < F[i, SHARE] * (1.0 - THROTTLE_TOLERANCE), now, F, I, HT, HI, SI, SF, C)
        elif F[i, SHARE] != F[i, RATE] or I[i, THROTTLED_NOW] == 1:
            set_rate(i, F[i, SHARE], False, now, F, I, HT, HI, SI, SF, C)
    for k in range(P[GROUP_END, g - 1] if g > 0 else 0, P[GROUP_END, g]):
        h = P[GROUP, k]
        sync = 0.0
        for j in range(P[SENDING_COUNT, h]):
            i = Q[SENDING_SET, h, j]
            if I[i, COMM] == GRAD_SYNC:
                sync += F[i, RATE]
        if sync != PF[SYNC_RATE, h]:
            PF[SYNC_RATE, h] = sync
            mark(P, C, DIRTY_COMPUTE, DIRTY_COMPUTE_LIST, DIRTY_COMPUTE_COUNT, h)


@inner
def compute_rates(now: float, F: np.ndarray, I: np.ndarray, P: np.ndarray, PF: np.ndarray, HT: np.ndarray,
                   HI: np.ndarray, SI: np.ndarray, SF: np.ndarray, C: np.ndarray) -> None:
    """New rates of the running compute on GPUs whose grad_sync rate changed or that started a task."""
    count = C[DIRTY_COMPUTE_COUNT]
    sort_row(P, DIRTY_COMPUTE_LIST, 0, count)
    for k in range(count):
        s = P[DIRTY_COMPUTE_LIST, k]
        P[DIRTY_COMPUTE, s] = 0
        task = P[BUSY, s]
        if task >= 0:
            set_rate(task, 1.0 - F[task, IMPACT] * PF[SYNC_RATE, s], False, now, F, I, HT, HI, SI, SF, C)
    C[DIRTY_COMPUTE_COUNT] = 0
