"""How a workload's layers are cut into stages: balanced, given, or the split of least bottleneck stage and its
neighbours (docs/model.md section 11.1)."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..model import ParameterError
from .flops import stage_costs

if TYPE_CHECKING:
    from .definition import Workload


def stage_layers(workload: Workload, stages: int) -> tuple[int, ...]:
    """Transformer layers of each stage: ``layers_per_stage``; ``balanced``: as even as whole layers allow, the
    extra layers on the stages after the first (which holds the embedding), in order; ``auto``: the split of
    least bottleneck stage (``bottleneck_split``; docs/model.md section 11.1)."""
    layers = workload.layers_per_stage
    total = workload.shape.layers
    if isinstance(layers, tuple):
        if len(layers) != stages:
            raise ParameterError("layers_per_stage", list(layers), f"must give one count per stage: {stages} here")
        return layers
    if total < stages:
        raise ParameterError("layers_per_stage", layers, f"cannot give each of {stages} stages a layer of the "
                                                         f"{total} of {workload.shape.name}")
    if layers == "auto":
        layer, first, last = stage_costs(workload)
        return _uniform_split(layer, total, first, last, stages)
    base, extra = divmod(total, stages)
    return tuple(base + (1 if 1 <= s <= extra else 0) for s in range(stages))


@lru_cache(maxsize=1024)
def _uniform_split(layer: float, count: int, first: float, last: float, stages: int) -> tuple[int, ...]:
    """``bottleneck_split`` of ``count`` layers of cost ``layer`` (the planner asks for many alike)."""
    return bottleneck_split([layer] * count, first, last, stages)


def bottleneck_split(costs: Sequence[float], first: float, last: float, stages: int) -> tuple[int, ...]:
    """The contiguous split of layers of ``costs`` into ``stages`` stages of at least one layer each that minimises
    the largest stage cost, ``first`` added to the first stage and ``last`` to the last: dynamic programming over
    split points (PipeDream, Narayanan et al. 2019, section 3.1), exact.

    ``best[j]`` after stage k is the least bottleneck of stages 0..k holding layers 0..j-1; each stage is one
    vectorised minimum over where it starts, so the cost is O(stages x layers^2) arithmetic in numpy.
    """
    count = len(costs)
    if not 1 <= stages <= count:
        raise ParameterError("stages", stages, f"must be from 1 to the {count} layers")
    prefix = np.concatenate(([0.0], np.cumsum(np.asarray(costs, dtype=float))))
    span = prefix[None, :] - prefix[:, None]  # span[i, j]: layers i..j-1
    span[np.tril_indices(count + 1)] = np.inf  # j <= i: no layer, never a stage
    best = np.full(count + 1, np.inf)
    best[1:] = prefix[1:] + first  # stage 0 holds layers 0..j-1
    starts = np.zeros((stages, count + 1), dtype=int)
    for k in range(1, stages):
        # stage k holds layers i..j-1 (i >= k: a layer for each stage before it, j > i)
        candidates = np.maximum(best[:, None], span + last if k == stages - 1 else span)
        candidates[:k, :] = np.inf
        starts[k] = np.argmin(candidates, axis=0)
        best = candidates[starts[k], np.arange(count + 1)]
    if stages == 1:
        return (count,)
    split, end = [], count
    for k in range(stages - 1, 0, -1):
        start = int(starts[k, end])
        split.append(end - start)
        end = start
    return (end, *reversed(split))


def split_neighbours(split: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The splits one layer away from ``split``: one layer moved across one boundary, either way, no stage empty."""
    found = []
    for k in range(len(split) - 1):
        for step in (1, -1):
            moved = list(split)
            moved[k] -= step
            moved[k + 1] += step
            if min(moved[k], moved[k + 1]) >= 1:
                found.append(tuple(moved))
    return found


def auto_splits(workload: Workload, stages: int) -> list[tuple[int, ...]]:
    """What ``auto`` simulates: the balanced split first (so auto is never slower than it), the bottleneck optimum
    and its neighbours, each once."""
    balanced = stage_layers(replace(workload, layers_per_stage="balanced"), stages)
    optimum = stage_layers(replace(workload, layers_per_stage="auto"), stages)
    return list(dict.fromkeys([balanced, optimum, *split_neighbours(optimum)]))
