"""The integer half of the noise draw (``noise``; docs/model.md section 8), compiled: each identity's two uniforms
by SplitMix64, in one pass over the identities rather than one array operation per step. Integer arithmetic and
exact conversions only, so the uniforms are the same bits as the steps written out in ``noise``."""

from __future__ import annotations

import numpy as np

from .jit import exposed, inlined

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SHIFTS = (np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11))


@inlined
def mix(x: np.uint64) -> np.uint64:
    """One SplitMix64 step (uint64 arithmetic wraps modulo 2^64)."""
    z = x + _GAMMA
    z = (z ^ (z >> _SHIFTS[0])) * _M1
    z = (z ^ (z >> _SHIFTS[1])) * _M2
    return z ^ (z >> _SHIFTS[2])


@inlined
def uniform(x: np.uint64) -> float:
    """The top 53 bits of ``x`` as a uniform in (0, 1): ``((x >> 11) + 0.5) / 2^53``, exact."""
    return (np.float64(x >> _SHIFTS[3]) + 0.5) / 2.0 ** 53


@exposed
def uniforms(seed: np.uint64, sample: np.uint64, identities: np.ndarray, first: np.ndarray,
             second: np.ndarray) -> None:
    """``first[r]`` and ``second[r]``: the two uniforms of identity ``identities[r]`` (kind number, stage, index)
    in draw ``sample`` of stream ``seed``."""
    start = mix(mix(seed) ^ sample)
    for r in range(identities.shape[0]):
        h = start
        for column in range(3):
            h = mix(h ^ np.uint64(identities[r, column]))
        h = mix(h)
        first[r] = uniform(h)
        second[r] = uniform(mix(h))
