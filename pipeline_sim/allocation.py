"""Bandwidth sharing between transfers (docs/model.md sections 3.1 and 3.2).

Two steps: each sending GPU picks its *sending set* from its ready transfers
(exclusive tier, else shared priorities, else the priority-0 layer), then all
sending sets share the links by one weighted max-min fair allocation under egress
(1 per GPU) and ingress (``ingress_capacity`` per GPU) limits.
"""

from __future__ import annotations

from typing import Sequence

#: Two levels closer than this (relative) saturate together in progressive filling.
LEVEL_TOLERANCE = 1e-12


def exclusive_key(tier_rank: int, ready: float, index: int, kind_order: int) -> tuple[int, float, int, int]:
    """Sort key of a transfer with an exclusive tier; the lowest key sends.

    Lower means more important: tier ('a' = 0 first), then earliest ready time
    (rounded to 9 decimals so that float noise cannot reorder simultaneous
    transfers), then lowest micro-batch or sync index, then kind order
    ``fwd_prop < grad_prop < grad_sync``.
    """
    return (tier_rank, round(ready, 9), index, kind_order)


def choose_sending_set(ready: Sequence) -> list:
    """The sending set among one GPU's ready transfers, with ``weight`` and ``share`` set on each.

    Each transfer carries ``tier_rank`` (None when shared), ``key`` (its
    ``exclusive_key``) and ``priority`` (its kind's shared priority).
    1. exclusive: the transfer with the lowest key sends alone, weight 1;
    2. shared: else every transfer with priority > 0, weighted by it;
    3. zero: else every transfer, weight 1.
    ``share`` is the sender-only share, ``weight / sum of weights``.
    """
    winner = None
    for run in ready:
        if run.tier_rank is not None and (winner is None or run.key < winner.key):
            winner = run
    if winner is not None:
        winner.weight = winner.share = 1.0
        return [winner]
    chosen = [run for run in ready if run.priority > 0.0]
    if chosen:
        for run in chosen:
            run.weight = run.priority
    else:
        chosen = list(ready)
        for run in chosen:
            run.weight = 1.0
    total = sum(run.weight for run in chosen)
    for run in chosen:
        run.share = run.weight / total
    return chosen


def max_min_fair_rates(senders: Sequence[int], receivers: Sequence[int | None],
                       weights: Sequence[float], ingress_capacity: float) -> list[float]:
    """Weighted max-min fair rates of flows, by progressive filling.

    Flow ``i`` leaves GPU ``senders[i]`` (egress capacity 1) and enters GPU
    ``receivers[i]`` (ingress capacity ``ingress_capacity``; ``None`` for traffic
    leaving the modelled GPUs). Every unfrozen flow's rate rises as
    ``weights[i] x level``; when a capacity is reached its flows freeze.
    Weights must be positive.

    When the sender-only shares (``weight / sum of weights`` per sender) already
    respect every ingress limit, they are the result: no ingress limit is reached
    before the egress limits freeze every flow. Callers use that to skip filling.
    """
    count = len(weights)
    members: dict[tuple[int, int], list[int]] = {}
    capacity: dict[tuple[int, int], float] = {}
    for i in range(count):
        egress = (0, senders[i])
        members.setdefault(egress, []).append(i)
        capacity[egress] = 1.0
        if receivers[i] is not None:
            ingress = (1, receivers[i])
            members.setdefault(ingress, []).append(i)
            capacity[ingress] = ingress_capacity
    rates = [0.0] * count
    frozen = [False] * count
    open_constraints = sorted(members)
    while open_constraints:
        levels = []
        for key in open_constraints:
            used = 0.0
            weight = 0.0
            for i in members[key]:
                if frozen[i]:
                    used += rates[i]
                else:
                    weight += weights[i]
            levels.append((max(capacity[key] - used, 0.0) / weight, key))
        lowest = min(level for level, _ in levels)
        for level, key in levels:
            if level <= lowest * (1.0 + LEVEL_TOLERANCE):
                for i in members[key]:
                    if not frozen[i]:
                        rates[i] = weights[i] * lowest
                        frozen[i] = True
        open_constraints = [key for key in open_constraints if not all(frozen[i] for i in members[key])]
    return rates


def is_throttled(rate: float, share: float) -> bool:
    """A transfer is throttled when its rate is below its sender-only share."""
    return rate < share * (1.0 - 1e-9)
