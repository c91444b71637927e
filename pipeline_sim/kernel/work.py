"""An environment's work on its graph, compiled: every task's noise-free length, its impact and the activations it
takes (``taskgraph.graph_work``), read from a few values per stage and GPU along ``structure``'s columns.

Each value is computed by the same float operations in the same order as the model's sections (docs/model.md 3.3,
6.6 and 7), so that a length is the same to the bit however the graph is simulated.
"""

from __future__ import annotations

import numpy as np

from .jit import compiled
from .structure import FALL_STAGE, FIRST_FORWARD, GPU, IMPACT, RISE_STAGE, WORK_ROW


@compiled
def graph_work(columns: np.ndarray, pairs: np.ndarray, table: np.ndarray, impacts: np.ndarray, fb_overlap: float,
               forwards: np.ndarray, backwards: np.ndarray, stage_rooms: np.ndarray, gpu_rooms: np.ndarray) -> tuple:
    """Per task of ``columns`` (``build_structure``'s): its work, the row ``WORK_ROW`` of ``table``; its impact,
    ``impacts`` (none, a forward's, a backward's) by ``IMPACT``; the room it reserves as it starts, its GPU's of
    ``gpu_rooms`` for the forward of a micro-batch's first stage there; and the activations of its stages in
    ``stage_rooms`` that rise as it starts and fall as it ends. An overlapped pair of ``pairs`` (its task, the
    stages of its forward and its backward) mixes its forward's work of ``forwards`` and backward's of
    ``backwards``: their sum less the overlap, and the impact weighted by each."""
    count = columns.shape[1]
    lengths = np.empty(count)
    impact = np.empty(count)
    reserve = np.empty(count, dtype=np.int64)
    rises = np.empty(count, dtype=np.int64)
    falls = np.empty(count, dtype=np.int64)
    for t in range(count):
        lengths[t] = table[columns[WORK_ROW, t]]
        impact[t] = impacts[columns[IMPACT, t]]
        reserve[t] = gpu_rooms[columns[GPU, t]] if columns[FIRST_FORWARD, t] else 0
        rises[t] = stage_rooms[columns[RISE_STAGE, t]] if columns[RISE_STAGE, t] >= 0 else 0
        falls[t] = stage_rooms[columns[FALL_STAGE, t]] if columns[FALL_STAGE, t] >= 0 else 0
    for k in range(pairs.shape[1]):
        t = pairs[0, k]
        forward, backward = forwards[pairs[1, k]], backwards[pairs[2, k]]
        both = forward + backward
        impact[t] = (forward * impacts[1] + backward * impacts[2]) / both if both != 0.0 else np.nan
        lengths[t] = both * (1.0 - fb_overlap)
    return lengths, impact, reserve, rises, falls
