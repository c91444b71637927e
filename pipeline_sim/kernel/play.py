"""A learned dispatcher's play inside the compiled loop (docs/model.md section 12.5): the actor network evaluated
on each decision's observation, without a return to Python between decisions.

``act`` is the one evaluation of a network, used by the compiled play and by a step-by-step episode alike: the same
sums in the same order, so that a replayed episode takes the same decisions.
"""

from __future__ import annotations

import numpy as np

from .jit import compiled, inner
from .loop import begin, decision, prepare, resume
from .next_task import choices
from .observation import GPU_WIDTH, observe
from .state import DONE, DONE_COUNT, EXTERNAL, RUNNING

#: GPUs a deciding GPU sees: the one above it, itself and the one below.
WINDOW_GPUS = 3


@inner
def act(observation: np.ndarray, mask: np.ndarray, weights: np.ndarray, biases: np.ndarray, shapes: np.ndarray,
        first: np.ndarray, second: np.ndarray) -> int:
    """The allowed action of the highest logit (the first of equal ones) of the network whose layers are
    ``shapes[k] = (inputs, outputs)``, their weights row after row in ``weights`` and biases in ``biases``, tanh
    between them; the observation taken at 32-bit precision, as the network saw it in training. ``first`` and
    ``second``: two arrays, each with room for any layer's outputs, the one layer's inputs and the other's
    outputs in turn."""
    for j in range(len(observation)):
        first[j] = np.float64(np.float32(observation[j]))
    w = b = 0
    source, target = first, second
    layers = shapes.shape[0]
    for k in range(layers):
        inputs, outputs = shapes[k, 0], shapes[k, 1]
        # each output summed over its inputs in order, from 0.0, then its bias; four outputs at a time, their sums
        # kept in registers over the inputs rather than stored back after each (weights are stored row after row)
        j = 0
        while j + 4 <= outputs:
            a0 = a1 = a2 = a3 = 0.0
            row = w + j
            for i in range(inputs):
                value = source[i]
                a0 += value * weights[row]
                a1 += value * weights[row + 1]
                a2 += value * weights[row + 2]
                a3 += value * weights[row + 3]
                row += outputs
            target[j], target[j + 1], target[j + 2], target[j + 3] = a0, a1, a2, a3
            j += 4
        for j in range(j, outputs):
            a0 = 0.0
            for i in range(inputs):
                a0 += source[i] * weights[w + i * outputs + j]
            target[j] = a0
        for j in range(outputs):
            total = target[j] + biases[b + j]
            target[j] = np.tanh(total) if k < layers - 1 else total
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
    out[base + 2] = C[DONE_COUNT] / F.shape[1]
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
    state = prepare(length, gpu, receiver, comm, stage, index, impact, needs_count, kind_class, reserve, falls,
                    dispatch_key, len(order_start) - 1, kind_tier, kind_priority, segment_room)
    F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending = state
    begin(EXTERNAL, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
    out = np.empty(actions, dtype=np.int64)
    mask = np.empty(actions, dtype=np.bool_)
    observation = np.zeros(fields)
    room = max(fields, shapes[:, 1].max())
    first, second = np.empty(room), np.empty(room)
    now = 0.0
    while True:
        status, segments, now, s = resume(memory, ingress_capacity, release_start, release_task, order_start,
                                          order_task, peer_start, peer_task, state, now)
        if status != RUNNING:  # DONE or STUCK
            return status, now, segments, state
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
    return DONE, now, 0, state
