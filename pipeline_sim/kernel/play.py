"""A learned dispatcher's play inside the compiled loop (docs/model.md section 12.5): the actor network evaluated
on each decision's observation, without a return to Python between decisions.

``act`` is the one evaluation of a network, used by the compiled play and by a step-by-step episode alike: the same
sums in the same order, so that a replayed episode takes the same decisions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from .jit import compiled, inlined, inner, vectorized
from .loop import advance_apart, begin_apart, decision, prepare_apart
from .next_task import choices
from .observation import GPU_WIDTH, observe
from .state import DONE_COUNT, EXTERNAL, RUNNING, SEGMENTS

#: GPUs a deciding GPU sees: the one above it, itself and the one below.
WINDOW_GPUS = 3


def power_of_two(n: Any) -> float:
    """``2.0 ** n``, exactly, for an integer ``n`` of -1022 to 1023."""
    return math.ldexp(1.0, int(n))


@intrinsic
def _exponent_field(typingctx: Any, n: Any) -> tuple:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        biased = builder.add(args[0], ir.Constant(ir.IntType(64), 1023))
        return builder.bitcast(builder.shl(biased, ir.Constant(ir.IntType(64), 52)), ir.DoubleType())
    return types.float64(types.int64), codegen


@overload(power_of_two)
def _power_of_two_compiled(n: Any) -> Any:
    # compiled, the float's exponent field is written directly: no library call, so a loop over it vectorizes
    def written(n: Any) -> float:
        return _exponent_field(n)  # type: ignore[call-arg]
    return written


#: ln 2 in two parts, the first with its low bits zero so that ``n * LN2_HIGH`` is exact for ``|n| < 2 ** 11``.
LN2_HIGH, LN2_LOW = 6.93147180369123816490e-01, 1.90821492927058770002e-10


@inlined
def tanh(x: float) -> float:
    """tanh in arithmetic alone, within 3 units in the last place of the C library's on every double (a test checks
    this): ``-expm1(-2|x|) / (2 + expm1(-2|x|))`` with the sign of ``x``, ``expm1`` reduced by ``n`` ln 2 to ``r``
    of at most ln 2 / 2 and summed to ``r ** 13`` (the first term left out is below 2 ** -56 of the sum). No library
    call and no branch: the same bits on every machine, and a loop of them vectorizes."""
    y = -2.0 * min(abs(x), 20.0)  # tanh(20) is 1.0 in doubles
    n = np.floor(y * 1.44269504088896338700 + 0.5)
    r = (y - n * LN2_HIGH) - n * LN2_LOW
    q = r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720 + r * (
        1.0 / 5040 + r * (1.0 / 40320 + r * (1.0 / 362880 + r * (1.0 / 3628800 + r * (1.0 / 39916800 + r * (
            1.0 / 479001600 + r * (1.0 / 6227020800)))))))))))))  # expm1(r)
    scale = power_of_two(np.int64(n))
    expm1 = scale * q + (scale - 1.0)  # exact at n = 0, where the difference would cancel
    return math.copysign(-expm1 / (2.0 + expm1), x)


@vectorized
def act(observation: np.ndarray, mask: np.ndarray, weights: np.ndarray, biases: np.ndarray, shapes: np.ndarray,
        first: np.ndarray, second: np.ndarray) -> int:
    """The allowed action of the highest logit (the first of equal ones) of the network whose layers are
    ``shapes[k] = (inputs, outputs)``, their weights row after row in ``weights`` and biases in ``biases``,
    ``tanh`` between them; the observation taken at 32-bit precision, as the network saw it in training.
    ``weights`` of 32 or 64 bits (compiled for each): each is taken as a double, so that a network whose weights are
    32-bit floats gives the same sums from either, and stored in 32 bits takes half the cache.
    ``first`` and ``second``: two arrays, each with room for any layer's outputs, the one layer's inputs and the
    other's outputs in turn."""
    for j in range(len(observation)):
        first[j] = np.float64(np.float32(observation[j]))
    w = b = 0
    source, target = first, second
    layers = shapes.shape[0]
    for k in range(layers):
        inputs, outputs = shapes[k, 0], shapes[k, 1]
        # each output summed over its inputs in order, from 0.0, then its bias. Four inputs at a time into every
        # output (weights are stored row after row): a loop the compiler turns into vector instructions, each sum
        # loaded and stored once per four inputs. Four zero inputs are skipped: they would add zeros, which leave
        # every sum as it is (weights are finite).
        out, bias = target[:outputs], biases[b:b + outputs]
        for j in range(outputs):
            out[j] = 0.0
        i = 0
        while i + 4 <= inputs:
            v0, v1, v2, v3 = source[i], source[i + 1], source[i + 2], source[i + 3]
            if v0 != 0.0 or v1 != 0.0 or v2 != 0.0 or v3 != 0.0:
                r0 = weights[w + i * outputs:w + (i + 1) * outputs]
                r1 = weights[w + (i + 1) * outputs:w + (i + 2) * outputs]
                r2 = weights[w + (i + 2) * outputs:w + (i + 3) * outputs]
                r3 = weights[w + (i + 3) * outputs:w + (i + 4) * outputs]
                for j in range(outputs):
                    out[j] = (out[j] + v0 * np.float64(r0[j]) + v1 * np.float64(r1[j]) + v2 * np.float64(r2[j])
                              + v3 * np.float64(r3[j]))
            i += 4
        for i in range(i, inputs):
            value, row = source[i], weights[w + i * outputs:w + (i + 1) * outputs]
            for j in range(outputs):
                out[j] += value * np.float64(row[j])
        if k < layers - 1:
            for j in range(outputs):
                out[j] = tanh(out[j] + bias[j])
        else:
            for j in range(outputs):
                out[j] += bias[j]
        w += inputs * outputs
        b += outputs
        source, target = target, source
    best = -1
    for j in range(len(mask)):
        if mask[j] and (best < 0 or source[j] > source[best]):
            best = j
    return best


@inner
def observe_all(s: int, now: float, unit: float, bound: float, memory: int, mask: np.ndarray, F: np.ndarray,
                I: np.ndarray, P: np.ndarray, Q: np.ndarray, C: np.ndarray, order_start: np.ndarray,
                order_task: np.ndarray, out: np.ndarray) -> None:
    """The deciding GPU's whole view (docs/model.md section 12.4): its window's GPUs (``observe``), the time against
    the run's lower bound (capped at ten bounds), the GPU's place in the pipeline, the share of tasks done, and the
    mask, wait last among the globals."""
    observe(s, now, unit, memory, F, I, P, Q, order_start, order_task, out)
    base = WINDOW_GPUS * GPU_WIDTH
    out[base] = min(10.0, now / bound) / 10.0
    out[base + 1] = s / max(1, P.shape[1] - 1)
    out[base + 2] = C[DONE_COUNT] / F.shape[0]
    out[base + 3] = 1.0 if mask[len(mask) - 1] else 0.0
    for j in range(len(mask)):
        out[base + 4 + j] = 1.0 if mask[j] else 0.0


@compiled
def play(length: np.ndarray, gpu: np.ndarray, receiver: np.ndarray, comm: np.ndarray, stage: np.ndarray,
         index: np.ndarray, impact: np.ndarray, needs_count: np.ndarray, release_start: np.ndarray,
         release_task: np.ndarray, order_start: np.ndarray, order_task: np.ndarray, peer_start: np.ndarray,
         peer_task: np.ndarray, kind_class: np.ndarray, reserve: np.ndarray, falls: np.ndarray,
         dispatch_key: np.ndarray, memory: int, kind_tier: np.ndarray, kind_priority: np.ndarray,
         ingress_capacity: float, segment_room: int, unit: float, bound: float, fields: int, actions: int,
         weights: np.ndarray, biases: np.ndarray, shapes: np.ndarray) -> tuple:
    """One iteration to its end, every decision the network's (``act``) on the deciding GPU's view
    (``observe_all``, ``fields`` wide), a decision with one possible action taken without asking it. Returns
    ``(status, now, segments, state)``: the state the arrays of ``prepare``, as ``simulate`` leaves them."""
    state = prepare_apart(length, gpu, receiver, comm, stage, index, impact, needs_count, kind_class, reserve, falls,
                          dispatch_key, len(order_start) - 1, kind_tier, kind_priority, segment_room,
                          np.empty(0, dtype=np.int64))
    F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending = state
    begin_apart(EXTERNAL, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
    out = np.empty(actions, dtype=np.int64)
    mask = np.empty(actions, dtype=np.bool_)
    observation = np.empty(fields)
    observation[:] = 0.0
    room = max(fields, shapes[:, 1].max())
    first, second = np.empty(room), np.empty(room)
    status, now = _decide_all(memory, ingress_capacity, release_start, release_task, order_start, order_task,
                              peer_start, peer_task, F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending, unit, bound,
                              weights, biases, shapes, out, mask, observation, first, second)
    return status, now, C[SEGMENTS], state


@inner
def _decide_all(memory: int, ingress_capacity: float, release_start: np.ndarray, release_task: np.ndarray,
                order_start: np.ndarray, order_task: np.ndarray, peer_start: np.ndarray, peer_task: np.ndarray,
                F: np.ndarray, I: np.ndarray, P: np.ndarray, PF: np.ndarray, Q: np.ndarray, A: np.ndarray,
                AF: np.ndarray, C: np.ndarray, HT: np.ndarray, HI: np.ndarray, SI: np.ndarray, SF: np.ndarray,
                K: np.ndarray, ending: np.ndarray, unit: float, bound: float, weights: np.ndarray,
                biases: np.ndarray, shapes: np.ndarray, out: np.ndarray, mask: np.ndarray, observation: np.ndarray,
                first: np.ndarray, second: np.ndarray) -> tuple:
    """``play``'s run from its start to its end, ``(status, now)``: its own function, allocating nothing, so that
    its calls at every decision count no references to the arrays they are given."""
    actions = len(out)
    now = 0.0
    while True:
        status, now, s = advance_apart(EXTERNAL, memory, ingress_capacity, release_start, release_task, order_start,
                                       order_task, peer_start, peer_task, F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF,
                                       K, ending, now)
        if status != RUNNING:  # DONE or STUCK
            return status, now
        choices(s, memory, F, I, P, order_start, order_task, out)
        allowed = 0
        for j in range(actions):
            mask[j] = out[j] >= 0
            allowed += mask[j]
        if allowed == 1:
            action = int(np.argmax(mask))
        else:
            observe_all(s, now, unit, bound, memory, mask, F, I, P, Q, C, order_start, order_task, observation)
            action = act(observation, mask, weights, biases, shapes, first, second)
        task = out[action] if action < actions - 1 else -1
        decision(s, task, now, EXTERNAL, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
