"""The schedules' orders as first written, in numpy and plain Python, one function per schedule: the reference that
the compiled orders (``pipeline_sim.kernel.orders``) are checked against, action by action."""

from __future__ import annotations

from collections import deque
from itertools import chain, repeat
from typing import Callable, Iterable

import numpy as np

from pipeline_sim.model import KIND_INDEX, KINDS, Action, EnvParams, Pair, TaskKind

F, B, I, W = TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT

#: A GPU's compute actions in the order it runs them.
Order = list[Action | Pair]


#: An action as the schedules of ``ORDERS`` write it, without an ``Action`` each (their orders of a large environment
#: hold hundreds of thousands): its kind number (``KIND_INDEX``), stage and micro-batch; a pair as two such.
Step = tuple[int, int, int]
Steps = list[Step | tuple[Step, Step]]
_F, _B, _I, _W = (KIND_INDEX[kind] for kind in (F, B, I, W))

#: The orders of every GPU as three rows, the kind number (``KIND_INDEX``), stage and micro-batch of each action,
#: each row GPU by GPU and in each GPU's order (shape 3 x p x actions per GPU): the schedules without pairs write
#: their orders so, with numpy, for orders of millions of actions.
Columns = np.ndarray


def _actions(kinds: Iterable[TaskKind], stages: Iterable[int], mbs: Iterable[int]) -> Order:
    """``Action(kind, stage, mb)`` for each kind, stage and micro-batch of the three in turn, made without a Python call
    each (the orders of a large environment hold hundreds of thousands)."""
    return list(map(tuple.__new__, repeat(Action), zip(kinds, stages, mbs)))


def _columns(kind: TaskKind, stages: np.ndarray, mbs: np.ndarray) -> Columns:
    """Per GPU (rows of ``stages``, broadcast along columns of ``mbs``), actions of ``kind`` on ``stages`` for
    ``mbs``."""
    out = np.empty((3, len(stages), mbs.shape[1]), dtype=np.int64)
    out[0], out[1], out[2] = KIND_INDEX[kind], stages, mbs
    return out


def _one_to_one(forwards: Columns, backwards: Columns, warmup: np.ndarray) -> Columns:
    """Per GPU, its ``warmup`` first forwards, then a forward and a backward in turn, then the backwards left: with
    w of them, forward j stands at j (j < w) or w + 2 (j - w), backward j at w + 2 j + 1 or, once the forwards are
    done, at the number of forwards plus j."""
    count = forwards.shape[2]
    j, w = np.arange(count), warmup[:, None]
    out = np.empty((3, len(warmup), 2 * count), dtype=np.int64)
    gpus = np.arange(len(warmup))[:, None]
    out[:, gpus, np.where(j < w, j, w + 2 * (j - w))] = forwards
    out[:, gpus, np.where(j < count - w, w + 2 * j + 1, count + j)] = backwards
    return out


def _gpipe(p: int, n: int, v: int) -> Columns:
    r, m = np.arange(p)[:, None], np.arange(n)[None, :]
    return np.concatenate([_columns(F, r, m), _columns(B, r, m)], axis=2)


def _one_f_one_b(p: int, n: int, v: int) -> Columns:
    r, m = np.arange(p)[:, None], np.arange(n)[None, :]
    return _one_to_one(_columns(F, r, m), _columns(B, r, m), np.minimum(p - r[:, 0] - 1, n))


def _interleaved(p: int, n: int, v: int) -> Columns:
    """Megatron-LM's interleaved 1F1B, micro-batch groups of p (model section 6.4): the k-th forward of GPU r runs
    chunk (k mod pv) div p of micro-batch (k div pv) p + k mod p, its k-th backward the chunks in reverse."""
    total = n * v
    k, r = np.arange(total)[None, :], np.arange(p)[:, None]
    micro_batch, chunk = (k // (p * v)) * p + k % p, (k % (p * v)) // p
    return _one_to_one(_columns(F, chunk * p + r, micro_batch), _columns(B, (v - 1 - chunk) * p + r, micro_batch),
                       np.minimum(2 * (p - r[:, 0] - 1) + (v - 1) * p, total))


def _zb_h1(p: int, n: int, v: int) -> Columns:
    """GPU r's warm-up forwards, then per step k an I of micro-batch k between the next forward (while any is left)
    and, from step r on, the next W; then the Ws left. Each action gets its place as a key: the warm-up's below 0,
    step k's at 3k, 3k + 1 and 3k + 2, the last Ws' after 3n."""
    r, m = np.arange(p)[:, None], np.arange(n)[None, :]
    warmup = np.minimum(p - r - 1, n)
    keys = np.concatenate([np.where(m < warmup, m - warmup, 3 * (m - warmup)), (3 * m + 1).repeat(p, axis=0),
                           np.where(m + r < n, 3 * (m + r) + 2, 3 * n + m)], axis=1)
    actions = np.concatenate([_columns(F, r, m), _columns(I, r, m), _columns(W, r, m)], axis=2)
    return np.ascontiguousarray(actions[:, r, keys.argsort(axis=1, kind="stable")])  # the index's order is not C's


def _zb_v(p: int, n: int, v: int) -> list[Steps]:
    """PyTorch's ScheduleZBVZeroBubble, written for max(2p - 1, n) micro-batches and cut to n."""
    big_n = max(2 * p - 1, n)
    orders: list[Steps] = []
    for r in range(p):
        stage = (r, 2 * p - 1 - r)
        f, b = [0, 0], [0, 0]  # next forward and next input-gradient micro-batch of each chunk
        order: list[Step] = []

        def forward(chunk: int) -> None:
            order.append((_F, stage[chunk], f[chunk]))
            f[chunk] += 1

        def input_grad(chunk: int, with_weight: bool = False) -> None:
            order.append((_I, stage[chunk], b[chunk]))
            if with_weight:
                order.append((_W, stage[chunk], b[chunk]))
            b[chunk] += 1

        for _ in range(2 * (p - r) - 1):
            forward(0)
        for _ in range(r):
            forward(1)
            forward(0)
        for _ in range(p - r):
            forward(1)
            input_grad(1, with_weight=True)
        while f[1] < f[0] or f[0] < big_n:
            if f[0] < big_n:
                forward(0)
            input_grad(0, with_weight=True)
            forward(1)
            input_grad(1, with_weight=True)
        w0, w1 = b
        for _ in range(r):
            input_grad(0)
            input_grad(1)
        for _ in range(p - r):
            input_grad(0)
            order.append((_W, stage[0], w0))
            w0 += 1
        order += [(_W, stage[1], m) for m in range(w1, b[1])]
        order += [(_W, stage[0], m) for m in range(w0, b[0])]
        orders.append([step for step in order if step[2] < n])
    return orders


def _dualpipe_v(p: int, n: int, v: int) -> list[Steps]:
    """DeepSeek's DualPipeV (PyTorch's ScheduleDualPipeV), model section 6.4."""
    orders: list[Steps] = []
    for r in range(p):
        stage = (r, 2 * p - 1 - r)
        forwards, backwards = [0, 0], [0, 0]
        queued_w: deque[Step] = deque()
        order: Steps = []

        def forward(chunk: int) -> Step:
            forwards[chunk] += 1
            return _F, stage[chunk], forwards[chunk] - 1

        def backward(chunk: int, split: bool) -> Step:
            backwards[chunk] += 1
            step = (_I if split else _B, stage[chunk], backwards[chunk] - 1)
            if split:
                queued_w.append((_W, step[1], step[2]))
            return step

        def weight() -> None:
            if queued_w:
                order.append(queued_w.popleft())

        for _ in range(2 * (p - r - 1)):
            order.append(forward(0))
        for _ in range(r + 1):
            order += [forward(0), forward(1)]
        for _ in range(p - r - 1):
            order.append(backward(1, split=True))
            weight()
            order.append(forward(1))
        for step in range(n - 2 * p + r + 1):
            if step == 0 and r == p - 1:  # the turn of the V: B1 needs this very F0's activation
                order += [forward(0), backward(1, split=False)]
            else:
                order.append((forward(0), backward(1, split=False)))
            order.append((forward(1), backward(0, split=False)))
        for _ in range(p - r - 1):
            order.append(backward(1, split=False))
            order.append((forward(1), backward(0, split=False)))
        split = False
        turn = (r + 1) // 2
        for i in range(r + 1):
            if i == turn and r % 2 == 1:
                split = True
            order.append(backward(1, split))
            if i == turn and r % 2 == 0:
                split = True
            order.append(backward(0, split))
        for _ in range(p - r - 1):
            weight()
            order.append(backward(0, split=True))
        for _ in range(r + 1):
            weight()
        orders.append(order)
    return orders


#: Per schedule name (the keys of ``SCHEDULES``), the function ``(num_gpus, n, v) -> per GPU its order``: as
#: ``Columns`` for the schedules in ``COLUMNS``, as ``Steps`` for the others.
COLUMNS: dict[str, Callable[[int, int, int], Columns]] = {
    "gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved-1f1b": _interleaved, "zb-h1": _zb_h1}
ORDERS: dict[str, Callable[[int, int, int], list[Steps]]] = {"zb-v": _zb_v, "dualpipe-v": _dualpipe_v}


def _action(step: Step) -> Action:
    return Action(KINDS[step[0]], step[1], step[2])


def _step(action: Action) -> Step:
    return KIND_INDEX[action.kind], action.stage, action.mb


def build_orders(params: EnvParams) -> list[Order]:
    """Per GPU, the actions of ``params``' schedule in the order it runs them; with ``ep_overlap``, each forward
    and a neighbouring backward paired (``paired``)."""
    if params.schedule in COLUMNS:
        columns = COLUMNS[params.schedule](params.num_gpus, params.n, params.v).tolist()
        orders = [_actions(map(KINDS.__getitem__, kinds), stages, mbs) for kinds, stages, mbs in zip(*columns)]
    else:
        orders = [[Pair(_action(step[0]), _action(step[1])) if len(step) == 2 else _action(step)
                   for step in steps] for steps in ORDERS[params.schedule](params.num_gpus, params.n, params.v)]
    return [paired(order) for order in orders] if _pairing(params) else orders


def _pairing(params: EnvParams) -> bool:
    """Whether ``params``' orders pair forwards and backwards for the all-to-all's overlap (section 16.1)."""
    return bool(params.ep_overlap) and params.a2a_len > 0


def paired(order: Order) -> Order:
    """``order`` with each whole backward run beside the forward right after it, of another micro-batch (docs/model.md
    section 16.1). Pairing a backward with the forward before it would deadlock 1F1B: that forward's successor
    stage pairs it with the backward this one waits for."""
    out: Order = []
    k = 0
    while k < len(order):
        first, second = order[k], order[k + 1] if k + 1 < len(order) else None
        if isinstance(first, Action) and isinstance(second, Action) and first.kind is B and second.kind is F \
                and first.mb != second.mb:
            out.append(Pair(second, first))
            k += 2
        else:
            out.append(first)
            k += 1
    return out


def order_parts(params: EnvParams, split: bool | None = None) -> tuple[np.ndarray, ...]:
    """Every part of the actions of ``params``' orders, GPU after GPU: its GPU, kind number (``KIND_INDEX``), stage
    and micro-batch, and whether it is the second part of a pair run as one task (``split``: each part of a pair run
    as a task of its own, as a dispatcher runs them; None: as ``params``' dispatcher runs them)."""
    if params.schedule in COLUMNS and not _pairing(params):
        columns = COLUMNS[params.schedule](params.num_gpus, params.n, params.v)
        kinds, stages, mbs = columns.reshape(3, -1)
        return (np.arange(params.num_gpus).repeat(columns.shape[2]), kinds, stages, mbs,
                np.zeros(len(kinds), dtype=bool))
    split = params.dispatch != "static" if split is None else split
    if params.schedule in ORDERS and not _pairing(params):
        orders = ORDERS[params.schedule](params.num_gpus, params.n, params.v)
    else:
        orders = [[(_step(action[0]), _step(action[1])) if isinstance(action, Pair) else _step(action)
                   for action in order] for order in build_orders(params)]
    flat: list[Step] = []  # every part
    counts: list[int] = []  # per GPU, its parts
    seconds: list[int] = []  # the parts run as the second of a pair's task
    for order in orders:
        first = len(flat)
        if 2 in set(map(len, order)):  # pairs
            for step in order:
                if len(step) == 2:
                    flat += step
                    if not split:
                        seconds.append(len(flat) - 1)
                else:
                    flat.append(step)
        else:
            flat += order  # type: ignore[arg-type]
        counts.append(len(flat) - first)
    kinds, stages, mbs = np.fromiter(chain.from_iterable(flat), np.int64, 3 * len(flat)).reshape(-1, 3).T.copy()
    second = np.zeros(len(flat), dtype=bool)
    second[seconds] = True
    return np.arange(len(orders)).repeat(counts), kinds, stages, mbs, second
