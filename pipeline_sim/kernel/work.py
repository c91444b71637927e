"""An environment's work on its graph, compiled: every task's noise-free length, its impact and the activations it
takes (``taskgraph.graph_work``), read from a few values per stage and GPU along ``structure``'s columns.

Each value is computed by the same float operations in the same order as the model's sections (docs/model.md 3.3,
6.6, 6.7, 7 and 15-16), so that a length is the same to the bit however the graph is simulated: e.g. a forward's is
``fwd_len * weight / v``.
"""

from __future__ import annotations

import numpy as np

from .jit import compiled, read_only, within
from .structure import FALL_STAGE, FIRST_FORWARD, GPU, IMPACT, RISE_STAGE, WORK_ROW

#: The values ``graph_work`` takes in ``values``, in this order.
VALUES = ("fwd_len", "bwd_len", "w_fraction", "sync_base_len", "gather_len", "cp_len", "a2a_len", "prop_len",
          "fwd_impact", "bwd_impact", "fb_overlap")
#: The rows of its ``weights``, per stage.
WEIGHTS = ("stage_weights", "bwd_weights", "sync_weights", "a2a_weights")
#: The blocks of the table of work whose row a task reads (``build_structure``'s ``WORK_ROW``), in order: one row per
#: stage of each of ``PER_STAGE``, one per GPU of each of ``PER_GPU``, then the pipeline transfers' one row.
PER_STAGE = ("forward", "backward", "backward_input", "backward_weight", "grad_sync", "fwd_gather", "kv_exchange",
             "kv_grad_exchange", "a2a")
PER_GPU = ("optimizer_step", "param_gather")


@within
def _table(values: np.ndarray, weights: np.ndarray, per_gpu: np.ndarray, v: int) -> tuple:
    """The table of work (``PER_STAGE``, ``PER_GPU``, the pipeline transfers' row), and per stage a forward's and a
    backward's work."""
    fwd_len, bwd_len, w_fraction, sync_base_len, gather_len, cp_len, a2a_len, prop_len = values[:8]
    stages, p = weights.shape[1], per_gpu.shape[1]
    table = np.empty(len(PER_STAGE) * stages + len(PER_GPU) * p + 1)
    forwards = np.empty(stages)
    backwards = np.empty(stages)
    for s in range(stages):
        forward = fwd_len * weights[0, s] / v
        backward = bwd_len * weights[0, s] * weights[1, s] / v
        exchange = cp_len / v * weights[0, s]
        forwards[s], backwards[s] = forward, backward
        table[s] = forward
        table[stages + s] = backward
        table[2 * stages + s] = backward * (1.0 - w_fraction)
        table[3 * stages + s] = backward * w_fraction
        table[4 * stages + s] = sync_base_len / v * weights[2, s]
        table[5 * stages + s] = gather_len / v * weights[2, s]
        table[6 * stages + s] = exchange
        table[7 * stages + s] = 2.0 * exchange  # the keys' and values' gradients travel back with them
        table[8 * stages + s] = a2a_len / v * weights[3, s]
    for g in range(p):
        table[len(PER_STAGE) * stages + g] = per_gpu[0, g]
        table[len(PER_STAGE) * stages + p + g] = per_gpu[1, g]
    table[-1] = prop_len
    return table, forwards, backwards


@compiled
def graph_work(columns: np.ndarray, pairs: np.ndarray, values: np.ndarray, weights: np.ndarray, per_gpu: np.ndarray,
               v: int, stage_rooms: np.ndarray, gpu_rooms: np.ndarray) -> tuple:
    """Per task of ``columns`` (``build_structure``'s): its work, the row ``WORK_ROW`` of the table of work of
    ``values`` (``VALUES``), ``weights`` (``WEIGHTS``, per stage) and ``per_gpu`` (each GPU's optimizer step and
    parameter gather) over ``v`` chunks; its impact (none, a forward's, a backward's) by ``IMPACT``; the room it
    reserves as it starts, its GPU's of ``gpu_rooms`` for the forward of a micro-batch's first stage there; and the
    activations of its stages in ``stage_rooms`` that rise as it starts and fall as it ends. An overlapped pair of
    ``pairs`` (its task, the stages of its forward and its backward) mixes its forward's work and its backward's:
    their sum less the overlap, and the impact weighted by each.

    Returns ``(floats, integers)``, read-only: rows of lengths and impacts, and rows of reserves, rises and falls."""
    table, forwards, backwards = _table(values, weights, per_gpu, v)
    fwd_impact, bwd_impact, fb_overlap = values[8], values[9], values[10]
    count = columns.shape[1]
    floats = np.empty((2, count))  # one array for each type: each array returned costs Python a conversion
    integers = np.empty((3, count), dtype=np.int64)
    lengths, impact = floats[0], floats[1]
    reserve, rises, falls = integers[0], integers[1], integers[2]
    for t in range(count):
        lengths[t] = table[columns[WORK_ROW, t]]
        kind = columns[IMPACT, t]
        impact[t] = fwd_impact if kind == 1 else bwd_impact if kind == 2 else 0.0
        reserve[t] = gpu_rooms[columns[GPU, t]] if columns[FIRST_FORWARD, t] else 0
        rises[t] = stage_rooms[columns[RISE_STAGE, t]] if columns[RISE_STAGE, t] >= 0 else 0
        falls[t] = stage_rooms[columns[FALL_STAGE, t]] if columns[FALL_STAGE, t] >= 0 else 0
    for k in range(pairs.shape[1]):
        t = pairs[0, k]
        forward, backward = forwards[pairs[1, k]], backwards[pairs[2, k]]
        both = forward + backward
        impact[t] = (forward * fwd_impact + backward * bwd_impact) / both if both != 0.0 else np.nan
        lengths[t] = both * (1.0 - fb_overlap)
    return read_only(floats), read_only(integers)
