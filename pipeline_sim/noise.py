"""Work factors of noisy task times (docs/model.md section 8), by common random numbers.

A task's factor is a fixed function of ``(seed, sample, kind, stage, index)`` and of
nothing else, so every policy of an environment sees the same draws in one sample and
no result depends on worker count or run order. The generator, written out here (steps 1
and 2 compiled, in ``kernel.draws``) so that a result can be reproduced years later
whatever library versions are installed:

1. the identity is folded into one 64-bit state with SplitMix64 (Steele, Lea and Flood,
   "Fast splittable pseudorandom number generators", 2014): ``h = mix(seed)``, then
   ``h = mix(h xor v)`` for v = sample, the kind's number (``KIND_NUMBERS``), the
   stage and the index, in that order; ``mix`` is one SplitMix64 step (add the golden
   gamma 0x9E3779B97F4A7C15, then its two xor-shift-multiply rounds);
2. two more SplitMix64 steps give two uniforms, ``u = ((x >> 11) + 0.5) / 2^53`` in (0, 1);
3. Box-Muller: ``z = sqrt(-2 ln u1) cos(2 pi u2)``, a standard normal;
4. lognormal: ``X = exp(-s^2/2 + s z)`` with ``s^2 = ln(1 + c^2)``; normal: ``X = max(0, 1 + c z)``.
"""

from __future__ import annotations

import numpy as np

from .compile_cache import load_kernel

JITTER_DISTRIBUTIONS = ("lognormal", "normal")

#: A kind's number in the identity of its draws; fixed forever, whatever the order of TaskKind.
KIND_NUMBERS = {"forward": 1, "backward": 2, "backward_input": 3, "backward_weight": 4, "fwd_prop": 5,
                "grad_prop": 6, "grad_sync": 7, "optimizer_step": 8, "param_gather": 9, "fwd_gather": 10,
                "bwd_gather": 11, "kv_exchange": 12, "kv_grad_exchange": 13, "a2a": 14, "a2a_grad": 15}

def standard_normals(seed: int, sample: int, identities: np.ndarray) -> np.ndarray:
    """One standard normal per row ``(kind number, stage, index)`` of ``identities``: steps 1 and 2 compiled
    (``kernel.draws``), Box-Muller here."""
    u1, u2 = np.empty(len(identities)), np.empty(len(identities))
    with np.errstate(over="ignore"):  # SplitMix64's products wrap, and warn when run uncompiled
        load_kernel().uniforms(np.uint64(seed), np.uint64(sample), np.ascontiguousarray(identities, dtype=np.int64),
                               u1, u2)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def work_factors(z: np.ndarray, variation: float, distribution: str) -> np.ndarray:
    """Factors of mean 1 and coefficient of variation ``variation`` from standard normals ``z``."""
    if variation == 0.0:
        return np.ones_like(z)
    if distribution == "lognormal":
        s2 = np.log1p(variation ** 2)
        return np.exp(-s2 / 2.0 + np.sqrt(s2) * z)
    return np.maximum(0.0, 1.0 + variation * z)
