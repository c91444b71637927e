"""The priority policies a sweep runs for one environment (docs/model.md section 5)."""

from __future__ import annotations

from functools import lru_cache
from itertools import product

from .model import COMM_KINDS, ParameterError, Policy

DEFAULT_STEP = 0.1


#: The finest priority grid: step 0.01.
MAX_STEPS = 100


def policy_count(steps: int) -> int:
    """Policies of the grid with ``steps`` steps per unit: simplex, one exclusive, two exclusive, weak orders."""
    return (steps + 1) * (steps + 2) // 2 + 3 * (steps + 1) + 9 + 13


def steps_per_unit(step: float) -> int:
    """How many steps of ``step`` make 1; raises ``ParameterError`` unless that is a whole number."""
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not 0.0 < step <= 1.0:
        raise ParameterError("step", step, "must be a number in (0, 1] that divides 1, e.g. 0.2, 0.1, 0.05")
    count = round(1.0 / step)
    if abs(count * step - 1.0) > 1e-9:
        raise ParameterError("step", step, f"does not divide 1 into a whole number of steps "
                                           f"(1 / {step!r} = {1.0 / step:.12g}); try 0.2, 0.1 or 0.05")
    return count


def check_step(step: float) -> None:
    """Refuse a step finer than ``1 / MAX_STEPS`` (a sweep's size limit, which ``--allow-large`` lifts)."""
    if steps_per_unit(step) > MAX_STEPS:
        raise ParameterError("step", step, f"is finer than 1/{MAX_STEPS} = {1 / MAX_STEPS:g}, which already gives "
                                           f"{policy_count(MAX_STEPS):,} policies per environment (pass "
                                           f"--allow-large to try anyway)")


def _weak_orders(kinds: tuple[str, ...]) -> list[dict[str, str]]:
    """Every ranking of ``kinds`` into tiers 'a', 'b', ... with ties allowed, fewest tiers first."""
    orders = []
    for ranks in product(range(len(kinds)), repeat=len(kinds)):
        used = sorted(set(ranks))
        if used == list(range(len(used))):  # tiers are consecutive from 'a'
            orders.append((len(used), ranks))
    orders.sort()
    return [{kind: "abc"[rank] for kind, rank in zip(kinds, ranks)} for _, ranks in orders]


@lru_cache(maxsize=8)
def policy_grid(step: float = DEFAULT_STEP) -> tuple[Policy, ...]:
    """Every distinct policy at resolution ``step``, each once, in the sweep's order.

    1. no exclusive kind: every split of shared priorities on the simplex, by
       ``fwd_prop`` share then ``grad_prop`` share;
    2. one exclusive kind (tier 'a'): each kind, times every split of the other two;
    3. two exclusive kinds: each pair, tiers a/b, b/a and a/a; the third kind shared (1.0);
    4. three exclusive kinds: the 13 weak orders, fewest tiers first.
    At step 0.1 that is 66 + 33 + 9 + 13 = 121 policies.
    """
    k = steps_per_unit(step)
    fwd, grad, sync = COMM_KINDS
    policies = [Policy(priorities={fwd: i / k, grad: j / k, sync: (k - i - j) / k})
                for i in range(k + 1) for j in range(k + 1 - i)]
    for alone in COMM_KINDS:
        first, second = (kind for kind in COMM_KINDS if kind != alone)
        policies.extend(Policy(priorities={first: i / k, second: (k - i) / k}, exclusive_tiers={alone: "a"})
                        for i in range(k + 1))
    for pair in ((fwd, grad), (fwd, sync), (grad, sync)):
        shared = next(kind for kind in COMM_KINDS if kind not in pair)
        for tiers in (("a", "b"), ("b", "a"), ("a", "a")):
            policies.append(Policy(priorities={shared: 1.0}, exclusive_tiers=dict(zip(pair, tiers))))
    policies.extend(Policy(exclusive_tiers=order) for order in _weak_orders(COMM_KINDS))
    return tuple(policies)
