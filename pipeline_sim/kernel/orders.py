"""Each GPU's compute order under every schedule (docs/model.md section 6.4), compiled: ``orders.order_parts``.

One function per schedule writes GPU r's actions in the order it runs them, part by part: the kind (of the four
``codes`` names: forward, backward, input gradient, weight gradient), stage and micro-batch of each, and whether it
is the second part of a pair (a forward and another micro-batch's backward run as one task). A schedule is known
here by its number in ``SCHEDULES`` only; ``schedules.py`` holds its other facts.
"""

from __future__ import annotations

import numpy as np

from .jit import compiled, within

#: The schedules whose orders are written here, by the number ``schedule_parts`` takes.
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v")
GPIPE, ONE_F_ONE_B, INTERLEAVED, ZB_H1, ZB_V, DUALPIPE_V = range(len(SCHEDULES))
#: The rows of ``_Orders``'s buffer: kind, stage, micro-batch, and whether the part is a pair's second.
_KIND, _STAGE, _MB, _SECOND = range(4)


@within
def _put(out: np.ndarray, at: int, kind: int, stage: int, mb: int, second: int) -> int:
    """An action's part at ``at`` of ``out``; returns the place after it."""
    out[_KIND, at] = kind
    out[_STAGE, at] = stage
    out[_MB, at] = mb
    out[_SECOND, at] = second
    return at + 1


@within
def _one_to_one(out: np.ndarray, at: int, forwards: np.ndarray, backwards: np.ndarray, warmup: int, codes: np.ndarray
                ) -> int:
    """``warmup`` forwards, then a forward and a backward in turn, then the backwards left (``forwards`` and
    ``backwards``: the stage and micro-batch of each, in order)."""
    count = forwards.shape[1]
    for j in range(warmup):
        at = _put(out, at, codes[0], forwards[0, j], forwards[1, j], 0)
    for j in range(count - warmup):
        at = _put(out, at, codes[0], forwards[0, warmup + j], forwards[1, warmup + j], 0)
        at = _put(out, at, codes[1], backwards[0, j], backwards[1, j], 0)
    for j in range(count - warmup, count):
        at = _put(out, at, codes[1], backwards[0, j], backwards[1, j], 0)
    return at


@within
def _gpipe(out: np.ndarray, at: int, r: int, p: int, n: int, codes: np.ndarray) -> int:
    for m in range(n):
        at = _put(out, at, codes[0], r, m, 0)
    for m in range(n):
        at = _put(out, at, codes[1], r, m, 0)
    return at


@within
def _one_f_one_b(out: np.ndarray, at: int, r: int, p: int, n: int, codes: np.ndarray) -> int:
    actions = np.empty((2, n), dtype=np.int64)
    for m in range(n):
        actions[0, m] = r
        actions[1, m] = m
    return _one_to_one(out, at, actions, actions, min(p - r - 1, n), codes)


@within
def _interleaved(out: np.ndarray, at: int, r: int, p: int, n: int, v: int, codes: np.ndarray) -> int:
    """Megatron-LM's interleaved 1F1B, micro-batch groups of p: the k-th forward of GPU r runs chunk (k mod pv)
    div p of micro-batch (k div pv) p + k mod p, its k-th backward the chunks in reverse."""
    total = n * v
    forwards = np.empty((2, total), dtype=np.int64)
    backwards = np.empty((2, total), dtype=np.int64)
    for k in range(total):
        mb, chunk = (k // (p * v)) * p + k % p, (k % (p * v)) // p
        forwards[0, k], forwards[1, k] = chunk * p + r, mb
        backwards[0, k], backwards[1, k] = (v - 1 - chunk) * p + r, mb
    return _one_to_one(out, at, forwards, backwards, min(2 * (p - r - 1) + (v - 1) * p, total), codes)


@within
def _zb_h1(out: np.ndarray, at: int, r: int, p: int, n: int, codes: np.ndarray) -> int:
    """GPU r's warm-up forwards, then per step k the next forward (while any is left), the I of micro-batch k and,
    from step r on, the next W; then the Ws left."""
    warmup = min(p - r - 1, n)
    for m in range(warmup):
        at = _put(out, at, codes[0], r, m, 0)
    for k in range(n):
        if k + warmup < n:
            at = _put(out, at, codes[0], r, k + warmup, 0)
        at = _put(out, at, codes[2], r, k, 0)
        if k >= r:
            at = _put(out, at, codes[3], r, k - r, 0)
    for m in range(max(n - r, 0), n):
        at = _put(out, at, codes[3], r, m, 0)
    return at


@within
def _cut(out: np.ndarray, at: int, kind: int, stage: int, mb: int, n: int) -> int:
    """``_put``, for an order written for more micro-batches than ``n``: nothing beyond them."""
    return _put(out, at, kind, stage, mb, 0) if mb < n else at


@within
def _take(out: np.ndarray, at: int, kind: int, stage: int, taken: np.ndarray, which: int, n: int) -> int:
    """``_cut``'s action of ``kind`` on ``stage`` for micro-batch ``taken[which]``, which then moves to the next."""
    at = _cut(out, at, kind, stage, taken[which], n)
    taken[which] += 1
    return at


@within
def _input_and_weight(out: np.ndarray, at: int, stage: int, taken: np.ndarray, which: int, n: int,
                      codes: np.ndarray) -> int:
    """``_take``'s I of ``stage``, and at once its W."""
    at = _cut(out, at, codes[2], stage, taken[which], n)
    return _take(out, at, codes[3], stage, taken, which, n)


@within
def _zb_v(out: np.ndarray, at: int, r: int, p: int, n: int, codes: np.ndarray) -> int:
    """PyTorch's ScheduleZBVZeroBubble, written for max(2p - 1, n) micro-batches and cut to n."""
    big_n = max(2 * p - 1, n)
    first, second = r, 2 * p - 1 - r
    F, I, W = codes[0], codes[2], codes[3]
    # the next micro-batch of each chunk's forward (0, 1) and input gradient (2, 3), and of the first chunk's W (4)
    taken = np.zeros(5, dtype=np.int64)
    for _ in range(2 * (p - r) - 1):
        at = _take(out, at, F, first, taken, 0, n)
    for _ in range(r):
        at = _take(out, at, F, second, taken, 1, n)
        at = _take(out, at, F, first, taken, 0, n)
    for _ in range(p - r):
        at = _take(out, at, F, second, taken, 1, n)
        at = _input_and_weight(out, at, second, taken, 3, n, codes)
    while taken[1] < taken[0] or taken[0] < big_n:
        if taken[0] < big_n:
            at = _take(out, at, F, first, taken, 0, n)
        at = _input_and_weight(out, at, first, taken, 2, n, codes)
        at = _take(out, at, F, second, taken, 1, n)
        at = _input_and_weight(out, at, second, taken, 3, n, codes)
    taken[4] = taken[2]
    weighed = taken[3]  # the second chunk's Ws done so far
    for _ in range(r):
        at = _take(out, at, I, first, taken, 2, n)
        at = _take(out, at, I, second, taken, 3, n)
    for _ in range(p - r):
        at = _take(out, at, I, first, taken, 2, n)
        at = _take(out, at, W, first, taken, 4, n)
    for m in range(weighed, taken[3]):
        at = _cut(out, at, W, second, m, n)
    for m in range(taken[4], taken[2]):
        at = _cut(out, at, W, first, m, n)
    return at


@within
def _backward(out: np.ndarray, at: int, stage: int, mb: int, split: bool, second: int, queued: np.ndarray,
              codes: np.ndarray) -> int:
    """DualPipeV's backward of ``stage`` for ``mb``: whole, or its I with its W queued (``queued``: from column 1 on,
    the stage and micro-batch of each W queued; in column 0 the place of the first waiting and the next free
    place)."""
    if split:
        end = queued[1, 0]
        queued[0, end], queued[1, end] = stage, mb
        queued[1, 0] = end + 1
        return _put(out, at, codes[2], stage, mb, second)
    return _put(out, at, codes[1], stage, mb, second)


@within
def _weight(out: np.ndarray, at: int, queued: np.ndarray, codes: np.ndarray) -> int:
    """The W queued first, if any."""
    first = queued[0, 0]
    if first == queued[1, 0]:
        return at
    queued[0, 0] = first + 1
    return _put(out, at, codes[3], queued[0, first], queued[1, first], 0)


@within
def _dualpipe_v(out: np.ndarray, at: int, r: int, p: int, n: int, codes: np.ndarray) -> int:
    """DeepSeek's DualPipeV (PyTorch's ScheduleDualPipeV): a pair is a forward, then as its second part the
    backward of the other chunk."""
    first, second = r, 2 * p - 1 - r
    F = codes[0]
    f0 = f1 = b0 = b1 = 0
    queued = np.empty((2, 2 * n + 1), dtype=np.int64)
    queued[0, 0] = queued[1, 0] = 1
    for _ in range(2 * (p - r - 1)):
        at = _put(out, at, F, first, f0, 0)
        f0 += 1
    for _ in range(r + 1):
        at = _put(out, at, F, first, f0, 0)
        f0 += 1
        at = _put(out, at, F, second, f1, 0)
        f1 += 1
    for _ in range(p - r - 1):
        at = _backward(out, at, second, b1, True, 0, queued, codes)
        b1 += 1
        at = _weight(out, at, queued, codes)
        at = _put(out, at, F, second, f1, 0)
        f1 += 1
    for step in range(n - 2 * p + r + 1):
        at = _put(out, at, F, first, f0, 0)  # the turn of the V (step 0 on the last GPU): B1 needs this F0's output
        f0 += 1
        at = _backward(out, at, second, b1, False, 0 if step == 0 and r == p - 1 else 1, queued, codes)
        b1 += 1
        at = _put(out, at, F, second, f1, 0)
        f1 += 1
        at = _backward(out, at, first, b0, False, 1, queued, codes)
        b0 += 1
    for _ in range(p - r - 1):
        at = _backward(out, at, second, b1, False, 0, queued, codes)
        b1 += 1
        at = _put(out, at, F, second, f1, 0)
        f1 += 1
        at = _backward(out, at, first, b0, False, 1, queued, codes)
        b0 += 1
    split = False
    turn = (r + 1) // 2
    for i in range(r + 1):
        if i == turn and r % 2 == 1:
            split = True
        at = _backward(out, at, second, b1, split, 0, queued, codes)
        b1 += 1
        if i == turn and r % 2 == 0:
            split = True
        at = _backward(out, at, first, b0, split, 0, queued, codes)
        b0 += 1
    for _ in range(p - r - 1):
        at = _weight(out, at, queued, codes)
        at = _backward(out, at, first, b0, True, 0, queued, codes)
        b0 += 1
    for _ in range(r + 1):
        at = _weight(out, at, queued, codes)
    return at


@within
def _paired(out: np.ndarray, start: int, stop: int, codes: np.ndarray) -> None:
    """``out[:, start:stop]`` with each whole backward run beside the forward right after it, of another micro-batch
    (docs/model.md section 16.1): the two become a pair, the forward first. Pairing a backward with the forward
    before it would deadlock 1F1B: that forward's successor stage pairs it with the backward this one waits for."""
    k = start
    while k < stop:
        single = k + 1 >= stop or out[_SECOND, k + 1] == 0
        if single and k + 1 < stop and out[_KIND, k] == codes[1] and out[_KIND, k + 1] == codes[0] and \
                (k + 2 >= stop or out[_SECOND, k + 2] == 0) and out[_MB, k] != out[_MB, k + 1]:
            for row in (_KIND, _STAGE, _MB):
                out[row, k], out[row, k + 1] = out[row, k + 1], out[row, k]
            out[_SECOND, k + 1] = 1
            k += 2
        elif single:
            k += 1
        else:
            k += 2


@compiled
def schedule_parts(schedule: int, p: int, n: int, v: int, pairing: bool, split: bool, codes: np.ndarray) -> np.ndarray:
    """Every part of the actions of the orders of schedule number ``schedule`` (``SCHEDULES``) on ``p`` GPUs for ``n``
    micro-batches of ``v`` chunks, GPU after GPU, each GPU's in its order, as the rows of one array: its GPU, kind (of
    ``codes``: forward, backward, I, W), stage and micro-batch, and whether (1 or 0) it is the second part of a pair
    run as one task (never,
    when ``split``: each part of a pair run as a task of its own, as a dispatcher runs them). With ``pairing``, each
    whole backward and the forward after it run as a pair (``_paired``)."""
    room = 3 * max(v, 2) * n  # the most parts any schedule gives a GPU: a forward, I and W of each stage it holds
    out = np.empty((4, p * room), dtype=np.int64)
    counts = np.empty(p, dtype=np.int64)
    for r in range(p):
        at = start = r * room
        if schedule == GPIPE:
            at = _gpipe(out, at, r, p, n, codes)
        elif schedule == ONE_F_ONE_B:
            at = _one_f_one_b(out, at, r, p, n, codes)
        elif schedule == INTERLEAVED:
            at = _interleaved(out, at, r, p, n, v, codes)
        elif schedule == ZB_H1:
            at = _zb_h1(out, at, r, p, n, codes)
        elif schedule == ZB_V:
            at = _zb_v(out, at, r, p, n, codes)
        else:
            at = _dualpipe_v(out, at, r, p, n, codes)
        if pairing:
            _paired(out, start, at, codes)
        counts[r] = at - start
    total = 0
    for r in range(p):
        total += counts[r]
    parts = np.empty((5, total), dtype=np.int64)  # one array: each array returned costs Python a conversion
    k = 0
    for r in range(p):
        for at in range(r * room, r * room + counts[r]):
            parts[0, k], parts[1, k], parts[2, k], parts[3, k] = r, out[_KIND, at], out[_STAGE, at], out[_MB, at]
            parts[4, k] = 1 if out[_SECOND, at] != 0 and not split else 0
            k += 1
    return parts
