"""An independent reference of bandwidth sharing (docs/model.md sections 3.1 and 3.2), in plain Python over
lists and objects, against which the tests check the compiled kernel's rates.

Two steps: each sending GPU picks its *sending set* from its ready transfers
(exclusive tier, else shared priorities, else the priority-0 layer), then the
sending sets share the links layer by layer (exclusive tier 'a', 'b', ..., shared,
zero): each layer one weighted max-min fair allocation under egress (1 per GPU)
and the ingress (``ingress_capacity`` per GPU) that the layers before it left.
"""

from __future__ import annotations

from typing import Mapping, Sequence

#: Two levels closer than this (relative) saturate together in progressive filling.
LEVEL_TOLERANCE = 1e-12


def exclusive_key(tier_rank: int, ready: float, index: int, kind_order: int,
                  stage: int = 0) -> tuple[int, float, int, int, int]:
    """Sort key of a transfer with an exclusive tier; the lowest key sends.

    Lower means more important: tier ('a' = 0 first), then earliest ready time
    (rounded to 9 decimals so that float noise cannot reorder simultaneous
    transfers), then lowest micro-batch or sync index, then kind order
    ``fwd_prop < grad_prop < grad_sync``, then the lowest sending stage.
    """
    return (tier_rank, round(ready, 9), index, kind_order, stage)


#: Layer numbers of the shared and the zero-priority sending sets; exclusive tier ranks (0 = 'a') come first.
SHARED_LAYER = 1_000
ZERO_LAYER = 1_001


def choose_sending_set(ready: Sequence) -> list:
    """The sending set among one GPU's ready transfers, with ``weight``, ``share`` and ``layer`` set on each.

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
        winner.layer = winner.tier_rank
        return [winner]
    chosen = [run for run in ready if run.priority > 0.0]
    if chosen:
        for run in chosen:
            run.weight = run.priority
            run.layer = SHARED_LAYER
    else:
        chosen = list(ready)
        for run in chosen:
            run.weight = 1.0
            run.layer = ZERO_LAYER
    total = sum(run.weight for run in chosen)
    for run in chosen:
        run.share = run.weight / total
    return chosen


def max_min_fair_rates(senders: Sequence[int], receivers: Sequence[int | None], weights: Sequence[float],
                       ingress: float | Mapping[int, float]) -> list[float]:
    """Weighted max-min fair rates of one layer's flows, by progressive filling.

    Flow ``i`` leaves GPU ``senders[i]`` (egress capacity 1) and enters GPU
    ``receivers[i]`` (``None`` for traffic leaving the modelled GPUs), whose ingress
    capacity is ``ingress`` (one number for every GPU, or a mapping per GPU).
    Every unfrozen flow's rate rises as ``weights[i] x level``; when a capacity is
    reached its flows freeze. Weights must be positive.

    A flow frozen by a capacity gets ``weight x free / sum of unfrozen weights`` of it:
    the same expression as the sender-only share ``weight / sum of weights`` when its
    egress binds, so that equal rates are equal floats however they were reached.
    """
    count = len(weights)
    members: dict[tuple[int, int], list[int]] = {}
    capacity: dict[tuple[int, int], float] = {}
    for i in range(count):
        egress = (0, senders[i])
        members.setdefault(egress, []).append(i)
        capacity[egress] = 1.0
        receiver = receivers[i]
        if receiver is not None:
            key = (1, receiver)
            members.setdefault(key, []).append(i)
            capacity[key] = ingress if isinstance(ingress, (int, float)) else ingress[receiver]
    rates = [0.0] * count
    frozen = [False] * count
    open_constraints = sorted(members)  # egress before ingress: a flow whose egress binds gets its share exactly
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
            free = max(capacity[key] - used, 0.0)
            levels.append((free / weight, free, weight, key))
        lowest = min(level for level, _, _, _ in levels)
        for level, free, weight, key in levels:
            if level <= lowest * (1.0 + LEVEL_TOLERANCE):
                for i in members[key]:
                    if not frozen[i]:
                        rates[i] = weights[i] * free / weight
                        frozen[i] = True
        open_constraints = [key for key in open_constraints if not all(frozen[i] for i in members[key])]
    return rates


def layered_rates(senders: Sequence[int], receivers: Sequence[int | None], weights: Sequence[float],
                  layers: Sequence[int], ingress_capacity: float) -> list[float]:
    """Rates of every sending set's flows: layer by layer, lowest layer number first (section 3.2).

    ``layers[i]`` ranks flow ``i`` (exclusive tiers first, then shared, then zero:
    ``choose_sending_set`` sets it). Each layer is one max-min fair allocation within the ingress
    the layers before it left; a GPU's sending set is of one layer, so its egress is
    whole for that layer. A flow whose receiver is saturated by higher layers gets 0.
    """
    rates = [0.0] * len(weights)
    left: dict[int, float] = {}
    for layer in sorted(set(layers)):
        flows = [i for i, rank in enumerate(layers) if rank == layer]
        for i in flows:
            if receivers[i] is not None:
                left.setdefault(receivers[i], ingress_capacity)
        layer_rates = max_min_fair_rates([senders[i] for i in flows], [receivers[i] for i in flows],
                                         [weights[i] for i in flows], left)
        for i, rate in zip(flows, layer_rates):
            rates[i] = rate
            if receivers[i] is not None:
                left[receivers[i]] = max(left[receivers[i]] - rate, 0.0)
    return rates


def is_throttled(rate: float, share: float) -> bool:
    """A transfer is throttled when its rate is below its sender-only share."""
    return rate < share * (1.0 - 1e-9)
