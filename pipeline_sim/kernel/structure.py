"""A task graph's structure built from its orders' parts, compiled: ``taskgraph.graph_structure``'s arrays.

What docs/model.md sections 2, 6 and 15-16 say a graph holds, task by task in plain loops: a graph of a few
hundred tasks is built in microseconds, where numpy's fixed cost per call was most of the time, and a graph of a
million in time proportional to its tasks (what each task releases is sorted by counting, not compared).

The caller gives the kind numbers it means (``codes``, in ``CODES`` order) and per kind number the tables it reads
(``lookup``, in ``LOOKUP`` order, each with one more entry for "no kind", -1); nothing here knows a schedule.
"""

from __future__ import annotations

import numpy as np

from .jit import compiled, read_only, within
from .state import HOLD_CLASS

#: The kind numbers ``build_structure`` takes in ``codes``, in this order.
CODES = ("fwd_prop", "grad_prop", "grad_sync", "optimizer_step", "param_gather", "overlap_f_b", "fwd_gather",
         "kv_exchange", "a2a", "a2a_grad", "forward")
#: The rows of ``lookup``, per kind number: where a task of that kind stands among what one end releases; its place
#: among the forward, backward, input and weight parts; which table of inputs a part waits for (0 a forward's, 1 a
#: backward's or I's, 2 a W's, 3 none); which gather (0 a forward's, 1 a backward's, 2 none); its table among the
#: transfers of a stage and micro-batch (forward and backward gathers, the two exchanges, the two all-to-alls; -1
#: none); its block of rows in the table of work, in stages and in GPUs; what numbers its row in that block (0
#: nothing, 1 its stage, 2 its GPU); its impact (0 none, 1 a forward's, 2 a backward's); its class for dispatchers
#: (``engine.GraphArrays.kind_class``); whether activations rise as a part of that kind starts (a forward), and
#: whether they fall as it ends (a backward or a W).
LOOKUP = ("release_rank", "part_slot", "input_of", "gather_of", "per_microbatch", "row_in_stages", "row_in_gpus",
          "row_by", "impact_of", "kind_class", "rising", "falling")
#: The rows of ``build_structure``'s ``columns``, per task.
KIND, GPU, STAGE, INDEX, RECEIVER, WORK_ROW, IMPACT, COMM, KIND_CLASS, NEEDS, FIRST_FORWARD, RISE_STAGE, \
    FALL_STAGE = range(13)
#: Errors ``build_structure`` reports in ``error[0]``, with the part (its number in the orders' parts), the stage and
#: micro-batch, or the kind, stage and micro-batch of the task's first part in ``error[1:]``.
FINE, NO_PART, OUTSIDE, ELSEWHERE, TWICE, NO_FORWARD, NO_GRADIENT, NO_WEIGHT, OWN_TASK = range(9)
#: How many kinds of transfer ``per_microbatch`` numbers.
PER_MICROBATCH = 6


@within
def _order_bucket(values: np.ndarray, keys: np.ndarray, first: int, stop: int) -> None:
    """Sort ``values[first:stop]`` by ``keys`` of each, then by value: an insertion sort, as a bucket holds a few."""
    for i in range(first + 1, stop):
        value = values[i]
        j = i - 1
        while j >= first and (keys[values[j]] > keys[value] or keys[values[j]] == keys[value] and values[j] > value):
            values[j + 1] = values[j]
            j -= 1
        values[j + 1] = value


@within
def _none(size: int) -> np.ndarray:
    """``size`` entries of -1 (no task): a loop, as numba's ``np.full`` takes seconds to compile."""
    out = np.empty(size, dtype=np.int64)
    for i in range(size):
        out[i] = -1
    return out


@within
def _put(block: np.ndarray, b: int, kind: int, gpu: int, stage: int, length: int, receiver: int) -> int:
    """Block ``b`` of ``_blocks``'s table; returns the next block's number."""
    block[0, b] = kind
    block[1, b] = gpu
    block[2, b] = stage
    block[3, b] = length
    block[4, b] = receiver
    return b + 1


@within
def _starts(counts: np.ndarray) -> np.ndarray:
    """The starts of compressed rows of ``counts`` entries each."""
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    for i in range(len(counts)):
        starts[i + 1] = starts[i] + counts[i]
    return starts


@within
def _check(n: int, stage_gpu: np.ndarray, part_gpu: np.ndarray, part_kind: np.ndarray, part_stage: np.ndarray,
           part_mb: np.ndarray, part_slot: np.ndarray, error: np.ndarray) -> None:
    """Each part of a part's kind (a forward, backward, I or W), within the graph, on its stage's GPU, once; else
    ``error`` says which is not."""
    stages = len(stage_gpu)
    for k in range(len(part_gpu)):
        if part_kind[k] < 0 or part_kind[k] >= len(part_slot) - 1 or part_slot[part_kind[k]] < 0:
            error[0] = NO_PART
            error[1] = k
            return
    for k in range(len(part_gpu)):
        if part_stage[k] < 0 or part_stage[k] >= stages or part_mb[k] < 0 or part_mb[k] >= n:
            error[0] = OUTSIDE
            error[1] = k
            return
    for k in range(len(part_gpu)):
        if stage_gpu[part_stage[k]] != part_gpu[k]:
            error[0] = ELSEWHERE
            error[1] = k
            return
    seen = np.zeros(4 * stages * n, dtype=np.int64)
    for k in range(len(part_gpu)):
        seen[(part_slot[part_kind[k]] * stages + part_stage[k]) * n + part_mb[k]] += 1
    for k in range(len(part_gpu)):
        if seen[(part_slot[part_kind[k]] * stages + part_stage[k]) * n + part_mb[k]] > 1:
            error[0] = TWICE
            error[1] = k
            return


@within
def _blocks(p: int, n: int, stage_gpu: np.ndarray, syncs: int, per_stage: np.ndarray, optimizer: int,
            param_gather: int, part_gpu: np.ndarray, second: np.ndarray, codes: np.ndarray) -> tuple:
    """The blocks of tasks, GPU after GPU (``block``: rows kind, -1 for the GPU's compute tasks, GPU, stage, length
    and receiver, one column a block): per GPU its compute tasks, its forward, then backward, pipeline transfers,
    its stages' syncs, each stage's transfers of ``per_stage`` kinds, its optimizer step and its gather. Also per
    GPU its stages ascending (compressed rows ``own_start``, ``own``), its compute tasks' count and its blocks of
    compute tasks, first sync and optimizer step (``firsts``); per stage its place among its GPU's."""
    stages = len(stage_gpu)
    own_start = np.zeros(p + 1, dtype=np.int64)
    for s in range(stages):
        own_start[stage_gpu[s] + 1] += 1
    for g in range(p):
        own_start[g + 1] += own_start[g]
    own = np.empty(stages, dtype=np.int64)
    stage_chunk = np.empty(stages, dtype=np.int64)
    filled = own_start[:p].copy()
    for s in range(stages):
        g = stage_gpu[s]
        stage_chunk[s] = filled[g] - own_start[g]
        own[filled[g]] = s
        filled[g] += 1
    computes = np.zeros(p, dtype=np.int64)
    for k in range(len(part_gpu)):
        if not second[k]:
            computes[part_gpu[k]] += 1
    block = np.empty((5, 3 * p + stages * (3 + len(per_stage))), dtype=np.int64)
    firsts = np.empty((3, p), dtype=np.int64)  # per GPU, the blocks of its compute tasks, its first sync, its step
    b = 0
    for g in range(p):
        firsts[0, g] = b
        b = _put(block, b, -1, g, 0, computes[g], -1)
        for i in range(own_start[g], own_start[g + 1]):
            s = own[i]
            if s < stages - 1 and stage_gpu[s + 1] != g:
                b = _put(block, b, codes[0], g, s, n, stage_gpu[s + 1])
        for i in range(own_start[g], own_start[g + 1]):
            s = own[i]
            if s > 0 and stage_gpu[s - 1] != g:
                b = _put(block, b, codes[1], g, s, n, stage_gpu[s - 1])
        firsts[1, g] = b
        for i in range(own_start[g], own_start[g + 1]):
            b = _put(block, b, codes[2], g, own[i], syncs, -1)
        for i in range(own_start[g], own_start[g + 1]):
            for kind in per_stage:
                b = _put(block, b, kind, g, own[i], n, -1)
        firsts[2, g] = b
        if optimizer:
            b = _put(block, b, codes[3], g, own[own_start[g]], 1, -1)
        if param_gather:
            b = _put(block, b, codes[4], g, own[own_start[g]], 1, -1)
    return block[:, :b].copy(), own_start, own, stage_chunk, computes, firsts


@within
def _tasks(block: np.ndarray, block_start: np.ndarray, compute_block: np.ndarray, stages: int, n: int,
           part_gpu: np.ndarray, part_kind: np.ndarray, part_stage: np.ndarray, part_mb: np.ndarray,
           second: np.ndarray, part_slot: np.ndarray, step_kind: int, pair_kind: int) -> tuple:
    """Per task (``columns``' first five rows) its kind, GPU, stage, index and receiver; its parts' kinds, stages and
    micro-batches (``parts``, two columns, -1 for none); and per part kind, stage and micro-batch, its task
    (``compute_task``)."""
    count = block_start[-1]
    columns = np.empty((13, count), dtype=np.int64)
    for b in range(block.shape[1]):
        for i in range(block[3, b]):
            t = block_start[b] + i
            columns[0, t] = block[0, b]
            columns[1, t] = block[1, b]
            columns[2, t] = block[2, b]
            columns[3, t] = i
            columns[4, t] = block[4, b]
    parts = _none(3 * count * 2).reshape((3, count, 2))
    compute_task = _none(4 * stages * n).reshape((4, stages, n))
    placed = np.zeros(len(compute_block), dtype=np.int64)
    task = -1
    for k in range(len(part_gpu)):
        column = 1 if second[k] else 0
        if column == 0:
            task = block_start[compute_block[part_gpu[k]]] + placed[part_gpu[k]]
            placed[part_gpu[k]] += 1
        parts[0, task, column] = part_kind[k]
        parts[1, task, column] = part_stage[k]
        parts[2, task, column] = part_mb[k]
        compute_task[part_slot[part_kind[k]], part_stage[k], part_mb[k]] = task
    for t in range(count):
        if columns[0, t] < 0:
            columns[0, t] = pair_kind if parts[0, t, 1] >= 0 else parts[0, t, 0]
            columns[2, t] = parts[1, t, 0]
            columns[3, t] = parts[2, t, 0]
        elif columns[0, t] == step_kind:
            parts[0, t, 0] = step_kind
            parts[1, t, 0] = columns[2, t]
            parts[2, t, 0] = 0
    return columns, parts, compute_task


@within
def _wants(columns: np.ndarray, parts: np.ndarray, compute_task: np.ndarray, block: np.ndarray,
           block_start: np.ndarray, syncs: np.ndarray, per_use: bool, codes: np.ndarray, input_of: np.ndarray,
           gather_of: np.ndarray, table_of: np.ndarray, error: np.ndarray) -> tuple:
    """What each task waits for, in order (``wants``, four columns, -1 for none): per part its pipeline input, then
    its gather (a pair's later duplicates dropped); a transfer's producer; a sync's backward or W. Also per stage
    and micro-batch the task computing its input gradient and the transfer of each kind of ``table_of`` (the
    gathers, exchanges and all-to-alls; -1 none). ``error`` says what the orders never run, or which pair waits for
    its own task."""
    stages, n = compute_task.shape[1], compute_task.shape[2]
    count = columns.shape[1]
    forward, whole, split_input, weight = compute_task[0], compute_task[1], compute_task[2], compute_task[3]
    gradient = np.empty((stages, n), dtype=np.int64)
    for s in range(stages):
        for m in range(n):
            gradient[s, m] = whole[s, m] if whole[s, m] >= 0 else split_input[s, m]
    for code, table in ((NO_FORWARD, forward), (NO_GRADIENT, gradient)):
        for s in range(stages):
            for m in range(n):
                if table[s, m] < 0:
                    error[0] = code
                    error[1] = s
                    error[2] = m
                    return gradient, gradient, gradient.reshape((1, stages, n))
    for s in range(stages):
        for m in range(n):
            if split_input[s, m] >= 0 and weight[s, m] < 0:
                error[0] = NO_WEIGHT
                error[1] = s
                error[2] = m
                return gradient, gradient, gradient.reshape((1, stages, n))
    # what a part waits for, by input_of its kind: a forward its input from the stage before, a backward or I the
    # gradient from the stage after (the last stage's: its own forward), a W its I; what another GPU's stage sends,
    # its transfer
    inputs = _none(4 * stages * n).reshape((4, stages, n))
    transfers = _none((PER_MICROBATCH + 1) * stages * n).reshape((PER_MICROBATCH + 1, stages, n))  # last: none
    for s in range(stages):
        for m in range(n):
            if s > 0:
                inputs[0, s, m] = forward[s - 1, m]
            inputs[1, s, m] = gradient[s + 1, m] if s < stages - 1 else forward[s, m]
            inputs[2, s, m] = split_input[s, m]
    for b in range(block.shape[1]):
        kind, s = block[0, b], block[2, b]
        for m in range(block[3, b]):
            if kind == codes[0]:
                inputs[0, s + 1, m] = block_start[b] + m
            elif kind == codes[1]:
                inputs[1, s - 1, m] = block_start[b] + m
            elif kind >= 0 and table_of[kind] >= 0:
                transfers[table_of[kind], s, m] = block_start[b] + m
    wants = _none(count * 4).reshape((count, 4))
    for t in range(count):
        if parts[0, t, 0] < 0 or columns[0, t] == codes[3]:
            continue
        for column in range(2):
            kind, s, m = parts[0, t, column], parts[1, t, column], parts[2, t, column]
            if kind < 0:
                continue
            wants[t, 2 * column] = inputs[input_of[kind], s, m]
            if per_use:
                gather = gather_of[kind]
                wants[t, 2 * column + 1] = transfers[gather if gather < 2 else PER_MICROBATCH, s, m]
        if parts[0, t, 1] >= 0:
            for column in range(2, 4):  # a pair's second part's needs that its first has
                for earlier in range(column):
                    if wants[t, column] == wants[t, earlier]:
                        wants[t, column] = -1
                        break
            for column in range(4):
                if wants[t, column] == t:
                    error[0] = OWN_TASK
                    error[1] = parts[0, t, 0]
                    error[2] = parts[1, t, 0]
                    error[3] = parts[2, t, 0]
                    return gradient, gradient, transfers
    for b in range(block.shape[1]):
        kind, s = block[0, b], block[2, b]
        for m in range(block[3, b]):
            t = block_start[b] + m
            if kind == codes[0]:
                wants[t, 0] = forward[s, m]
            elif kind == codes[1]:
                wants[t, 0] = gradient[s, m]
            elif kind == codes[2]:
                wants[t, 0] = weight[s, syncs[m]] if weight[s, syncs[m]] >= 0 else whole[s, syncs[m]]
    return wants, gradient, transfers


@within
def _issues(columns: np.ndarray, forward: np.ndarray, gradient: np.ndarray, transfers: np.ndarray, wants: np.ndarray,
            exchanging: bool, pair_kind: int) -> tuple:
    """The all-to-alls (section 16), issued by their task's end, holding its GPU (``held``; their task then in
    ``wants``), or by an overlapped pair's start; the transfers a start issues (section 15), as ``issued_task``
    and ``issued_by`` (-1: time 0); and per issuer its exchanges (``exchanges``, four columns: the all-to-alls of a
    forward and of a backward, the two attention exchanges), which what waits for it waits for too."""
    stages, n = forward.shape
    count = columns.shape[1]
    issued_task = np.empty(6 * stages * n, dtype=np.int64)
    issued_by = np.empty(6 * stages * n, dtype=np.int64)
    issued = 0
    held = np.zeros(count, dtype=np.int64)
    exchanges = _none((count if exchanging else 0) * 4).reshape((count if exchanging else 0, 4))
    for column in range(6):  # the two all-to-alls, then the forward's and the backward's gathers, the two exchanges
        table = transfers[4 + column if column < 2 else column - 2]
        for s in range(stages):
            for m in range(n):
                transfer = table[s, m]
                if transfer < 0:
                    continue
                if column == 0 or column == 4:
                    issuer = forward[s, m]
                elif column == 1 or column == 5:
                    issuer = gradient[s, m]
                elif column == 2:
                    issuer = forward[s, m - 1] if m > 0 else -1
                else:
                    issuer = gradient[s, m - 1] if m > 0 else forward[s, 0]
                if column < 2 and columns[0, issuer] != pair_kind:
                    held[transfer] = 1
                    wants[transfer, 0] = issuer
                else:
                    issued_task[issued] = transfer
                    issued_by[issued] = issuer
                    issued += 1
                if column < 2 or column >= 4:
                    exchanges[issuer, column if column < 2 else column - 2] = transfer
    k = 0
    for t in range(count):
        k += held[t]
    holds = np.empty(k, dtype=np.int64)
    k = 0
    for t in range(count):
        if held[t]:
            holds[k] = t
            k += 1
    return issued_task[:issued], issued_by[:issued], holds, exchanges


@within
def _needs(columns: np.ndarray, wants: np.ndarray, exchanges: np.ndarray, block_start: np.ndarray,
           firsts: np.ndarray, counts: np.ndarray, optimizer: int, param_gather: int, codes: np.ndarray) -> tuple:
    """Each task's needs (compressed rows): its wants in their columns' order (a GPU's optimizer step: its compute
    tasks and syncs, ``counts`` per GPU of each; its gather: the step, or those), then the exchanges of each need,
    but for an all-to-all's."""
    count = columns.shape[1]
    step_kind, gather_kind = codes[3], codes[4]
    listed = np.zeros(count, dtype=np.int64)
    for t in range(count):
        kind = columns[0, t]
        if kind == step_kind or kind == gather_kind and not optimizer:
            listed[t] = counts[0, columns[1, t]] + counts[1, columns[1, t]]
        elif kind == gather_kind:
            listed[t] = 1
        else:
            for column in range(4):
                if wants[t, column] >= 0:
                    listed[t] += 1
    base_start = _starts(listed)
    base = np.empty(base_start[count], dtype=np.int64)
    for t in range(count):
        kind, g, j = columns[0, t], columns[1, t], base_start[t]
        if kind == step_kind or kind == gather_kind and not optimizer:
            for first, length in ((block_start[firsts[0, g]], counts[0, g]), (block_start[firsts[1, g]], counts[1, g])):
                for x in range(first, first + length):
                    base[j] = x
                    j += 1
        elif kind == gather_kind:
            base[j] = t - 1
        else:
            for column in range(4):
                if wants[t, column] >= 0:
                    base[j] = wants[t, column]
                    j += 1
    if len(exchanges) == 0:
        return base_start, base
    for t in range(count):
        if columns[0, t] != codes[8] and columns[0, t] != codes[9]:
            for j in range(base_start[t], base_start[t + 1]):
                for column in range(4):
                    if exchanges[base[j], column] >= 0:
                        listed[t] += 1
    needs_start = _starts(listed)
    needs_task = np.empty(needs_start[count], dtype=np.int64)
    for t in range(count):
        k = needs_start[t]
        for j in range(base_start[t], base_start[t + 1]):
            needs_task[k] = base[j]
            k += 1
        if columns[0, t] != codes[8] and columns[0, t] != codes[9]:
            for j in range(base_start[t], base_start[t + 1]):
                for column in range(4):
                    if exchanges[base[j], column] >= 0:
                        needs_task[k] = exchanges[base[j], column]
                        k += 1
    return needs_start, needs_task


@within
def _releases(columns: np.ndarray, needs_start: np.ndarray, needs_task: np.ndarray, issued_task: np.ndarray,
              issued_by: np.ndarray, release_rank: np.ndarray) -> tuple:
    """Each task's releases (rows 0 to tasks - 1): transfers first, in ``release_rank``'s order, then compute tasks,
    by index within a kind; then (row tasks + i) the transfers task i's start issues and (row 2 tasks) those issued
    at time 0, each row by task. Counted into place, each row then sorted: a row holds a few."""
    count = columns.shape[1]
    listed = np.zeros(2 * count + 1, dtype=np.int64)
    for j in range(len(needs_task)):
        listed[needs_task[j]] += 1
    for j in range(len(issued_by)):
        listed[count + (issued_by[j] if issued_by[j] >= 0 else count)] += 1
    release_start = _starts(listed)
    release_task = np.empty(release_start[-1], dtype=np.int64)
    filled = release_start[:-1].copy()
    for t in range(count):
        for j in range(needs_start[t], needs_start[t + 1]):
            release_task[filled[needs_task[j]]] = t
            filled[needs_task[j]] += 1
    for j in range(len(issued_by)):
        row = count + (issued_by[j] if issued_by[j] >= 0 else count)
        release_task[filled[row]] = issued_task[j]
        filled[row] += 1
    rank = np.empty(count, dtype=np.int64)
    for t in range(count):
        rank[t] = release_rank[columns[0, t]]
    for row in range(count):
        _order_bucket(release_task, rank, release_start[row], release_start[row + 1])
    rank[:] = 0
    for row in range(count, 2 * count + 1):
        _order_bucket(release_task, rank, release_start[row], release_start[row + 1])
    return release_start, release_task


@within
def _orders(p: int, block: np.ndarray, block_start: np.ndarray, firsts: np.ndarray, computes: np.ndarray,
            optimizer: int) -> tuple:
    """Each GPU's order, its compute tasks then its optimizer step; and the GPUs it exchanges transfers with,
    ascending (compressed rows each)."""
    listed = np.empty(p, dtype=np.int64)
    for g in range(p):
        listed[g] = computes[g] + optimizer
    order_start = _starts(listed)
    order_task = np.empty(order_start[p], dtype=np.int64)
    for g in range(p):
        first = block_start[firsts[0, g]]
        for j in range(computes[g]):
            order_task[order_start[g] + j] = first + j
        if optimizer:
            order_task[order_start[g + 1] - 1] = block_start[firsts[2, g]]
    listed[:] = 0
    for b in range(block.shape[1]):
        if block[4, b] >= 0:
            listed[block[1, b]] += 1
            listed[block[4, b]] += 1
    link_start = _starts(listed)
    links = np.empty(link_start[p], dtype=np.int64)
    filled = link_start[:p].copy()
    for b in range(block.shape[1]):
        if block[4, b] >= 0:
            links[filled[block[1, b]]] = block[4, b]
            filled[block[1, b]] += 1
            links[filled[block[4, b]]] = block[1, b]
            filled[block[4, b]] += 1
    marked = np.zeros(p, dtype=np.int64)  # per GPU, the last GPU that found it a peer, plus 1
    level = np.zeros(p, dtype=np.int64)  # one key for every GPU: peers in their own order
    peer_start = np.zeros(p + 1, dtype=np.int64)
    peer_task = np.empty(len(links), dtype=np.int64)
    found = 0
    for g in range(p):
        first = found
        for j in range(link_start[g], link_start[g + 1]):
            if marked[links[j]] != g + 1:
                marked[links[j]] = g + 1
                peer_task[found] = links[j]
                found += 1
        _order_bucket(peer_task, level, first, found)
        peer_start[g + 1] = found
    return order_start, order_task, peer_start, peer_task[:found].copy()


@within
def _work(columns: np.ndarray, parts: np.ndarray, p: int, stages: int, pair_kind: int, row_in_stages: np.ndarray,
          row_in_gpus: np.ndarray, row_by: np.ndarray, impact_of: np.ndarray) -> np.ndarray:
    """Into ``columns``' last two rows, where each task finds its work in a table of a few rows per stage and GPU
    (by kind a block of rows, and within it the task's stage, GPU or nothing) and its impact, 0 (none), 1 (a
    forward's) or 2 (a backward's); returns each overlapped pair's task and its two parts' stages."""
    pairs = 0
    for t in range(columns.shape[1]):
        kind = columns[0, t]
        by = row_by[kind]
        columns[5, t] = row_in_stages[kind] * stages + row_in_gpus[kind] * p + (
            columns[2, t] if by == 1 else columns[1, t] if by == 2 else 0)
        columns[6, t] = impact_of[kind]
        if kind == pair_kind:
            pairs += 1
    paired = np.empty((3, pairs), dtype=np.int64)
    k = 0
    for t in range(columns.shape[1]):
        if columns[0, t] == pair_kind:
            paired[0, k] = t
            paired[1, k] = parts[1, t, 0]
            paired[2, k] = parts[1, t, 1]
            k += 1
    return paired


@within
def _skeleton(columns: np.ndarray, parts: np.ndarray, needs_start: np.ndarray, holds: np.ndarray,
              stage_chunk: np.ndarray, comm: np.ndarray, kind_class: np.ndarray, rising: np.ndarray,
              falling: np.ndarray, forward: int) -> None:
    """Into ``columns``' rows from ``COMM`` on, per task: its transfer class (``comm``, -1 for compute), its class
    for dispatchers (a hold's ``HOLD_CLASS``), how many tasks it waits for, whether it is the forward of a
    micro-batch's first stage on its GPU, and the stages of its part whose activations rise as it starts and fall
    as it ends (-1: none; a task has one such part at most, a pair a forward and a whole backward)."""
    for t in range(columns.shape[1]):
        kind = columns[KIND, t]
        columns[COMM, t] = comm[kind]
        columns[KIND_CLASS, t] = kind_class[kind]
        columns[NEEDS, t] = needs_start[t + 1] - needs_start[t]
        columns[FIRST_FORWARD, t] = 1 if kind == forward and stage_chunk[columns[STAGE, t]] == 0 else 0
        first, second = parts[0, t, 0], parts[0, t, 1]
        columns[RISE_STAGE, t] = parts[1, t, 0] if rising[first] else parts[1, t, 1] if rising[second] else -1
        columns[FALL_STAGE, t] = parts[1, t, 0] if falling[first] else parts[1, t, 1] if falling[second] else -1
    for t in holds:
        columns[KIND_CLASS, t] = HOLD_CLASS


@within
def _rare(stage_chunk: np.ndarray, issued_task: np.ndarray, issued_by: np.ndarray, holds: np.ndarray,
          compute_task: np.ndarray) -> np.ndarray:
    """What few readers read, in one array (each array returned costs Python a conversion, about as long as a
    small graph's building): how many transfers a start issues and how many hold their GPU, then ``stage_chunk``,
    ``issued_task``, ``issued_by``, ``holds`` and ``compute_task`` flat (``taskgraph.GraphStructure`` reads them)."""
    issued, held = len(issued_task), len(holds)
    kinds, stages, n = compute_task.shape
    rare = np.empty(2 + stages + 2 * issued + held + kinds * stages * n, dtype=np.int64)
    rare[0], rare[1] = issued, held
    at = 2
    for values in (stage_chunk, issued_task, issued_by, holds):  # element by element: a slice's assignment takes
        for value in values:  # seconds to compile
            rare[at] = value
            at += 1
    for k in range(kinds):
        for s in range(stages):
            for m in range(n):
                rare[at] = compute_task[k, s, m]
                at += 1
    return rare


@within
def _failed() -> tuple:
    """What ``build_structure`` returns for orders that are wrong: empty arrays, made only then."""
    empty = read_only(np.zeros(0, dtype=np.int64))
    return (read_only(np.zeros((13, 0), dtype=np.int64)), read_only(np.zeros((3, 0, 2), dtype=np.int64)), empty,
            empty, empty, empty, empty, empty, empty, empty, read_only(np.zeros(2, dtype=np.int64)),
            read_only(np.zeros((3, 0), dtype=np.int64)))


@within
def sync_points(n: int, sync_freq: int) -> np.ndarray:
    """The micro-batches whose backward is followed by a ``grad_sync``, in order: every ``sync_freq``-th, and the
    last."""
    uneven = n % sync_freq != 0  # the last micro-batch is not one of them: it is added
    points = np.empty(n // sync_freq + (1 if uneven else 0), dtype=np.int64)
    for k in range(n // sync_freq):
        points[k] = (k + 1) * sync_freq - 1
    if uneven:
        points[-1] = n - 1
    return points


@compiled
def build_structure(p: int, n: int, stage_gpu: np.ndarray, sync_freq: int, per_stage: np.ndarray,
                    optimizer: int, param_gather: int, orders: np.ndarray, codes: np.ndarray, lookup: np.ndarray,
                    comm: np.ndarray, error: np.ndarray) -> tuple:
    """The structure of a graph whose GPUs run the parts of ``orders`` (``schedule_parts``' rows: GPU, kind, stage,
    micro-batch and whether it is a second part, which shares the task of the part before it; GPU after GPU, each
    GPU's in its order); ``stage_gpu`` per stage its GPU, ``sync_freq`` how many micro-batches a stage syncs after
    (``sync_points``), ``per_stage`` the kinds of transfer each stage has one of per
    micro-batch (gathers, exchanges, all-to-alls), and whether each GPU steps an optimizer and gathers its
    parameters after it. Per GPU its compute tasks in their order, its pipeline transfers, syncs, per-stage
    transfers, step and gather, tasks numbered in that order.

    Returns ``(columns, parts, needs_start, needs_task, issue_start, issue_task, order_start, order_task,
    peer_start, peer_task, rare, pairs)``, each read-only (``rare``: ``_rare``'s of ``stage_chunk``, ``issued_task``,
    ``issued_by``, ``holds`` and ``compute_task``):
    ``columns`` per task (rows ``KIND`` to ``FALL_STAGE``) its kind, GPU, stage, index, receiver, row of work and
    impact (``_work``'s), then ``_skeleton``'s rows, its transfer class by ``comm`` (per kind number the class whose
    priority a transfer takes, -1 for compute) and more; ``parts`` (3 x tasks x 2) the kind, stage and micro-batch
    of each task's parts; the releases' rows, each task's then (row tasks + i) those task i's start issues and (row
    2 tasks) those issued at time 0; ``pairs`` each pair's task and its two parts' stages. Or, with ``error[0]`` set
    (one of ``NO_PART`` ... ``OWN_TASK``), where the orders are wrong, and empty arrays.
    """
    release_rank, part_slot, input_of, gather_of, table_of = lookup[0], lookup[1], lookup[2], lookup[3], lookup[4]
    part_gpu, part_kind, part_stage, part_mb, second = orders[0], orders[1], orders[2], orders[3], orders[4]
    stages = len(stage_gpu)
    syncs = sync_points(n, sync_freq)
    _check(n, stage_gpu, part_gpu, part_kind, part_stage, part_mb, part_slot, error)
    if error[0] != FINE:
        return _failed()
    block, own_start, own, stage_chunk, computes, firsts = _blocks(p, n, stage_gpu, len(syncs), per_stage, optimizer,
                                                                   param_gather, part_gpu, second, codes)
    block_start = _starts(block[3])
    columns, parts, compute_task = _tasks(block, block_start, firsts[0], stages, n, part_gpu, part_kind, part_stage,
                                          part_mb, second, part_slot, codes[3], codes[5])
    per_use, exchanging = False, False
    for kind in per_stage:
        per_use = per_use or kind == codes[6]
        exchanging = exchanging or kind == codes[7] or kind == codes[8]
    wants, gradient, transfers = _wants(columns, parts, compute_task, block, block_start, syncs, per_use, codes,
                                        input_of, gather_of, table_of, error)
    if error[0] != FINE:
        return _failed()
    issued_task, issued_by, holds, exchanges = _issues(columns, compute_task[0], gradient, transfers, wants,
                                                       exchanging, codes[5])
    counts = np.empty((2, p), dtype=np.int64)  # per GPU, its compute tasks and its syncs
    for g in range(p):
        counts[0, g] = computes[g]
        counts[1, g] = (own_start[g + 1] - own_start[g]) * len(syncs)
    needs_start, needs_task = _needs(columns, wants, exchanges, block_start, firsts, counts, optimizer, param_gather,
                                     codes)
    release_start, release_task = _releases(columns, needs_start, needs_task, issued_task, issued_by, release_rank)
    order_start, order_task, peer_start, peer_task = _orders(p, block, block_start, firsts, computes, optimizer)
    pairs = _work(columns, parts, p, stages, codes[5], lookup[5], lookup[6], lookup[7], lookup[8])
    _skeleton(columns, parts, needs_start, holds, stage_chunk, comm, lookup[9], lookup[10], lookup[11], codes[10])
    rare = _rare(stage_chunk, issued_task, issued_by, holds, compute_task)
    return (read_only(columns), read_only(parts), read_only(needs_start), read_only(needs_task),
            read_only(release_start), read_only(release_task), read_only(order_start), read_only(order_task),
            read_only(peer_start), read_only(peer_task), read_only(rare), read_only(pairs))
