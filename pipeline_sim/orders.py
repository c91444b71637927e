"""Each GPU's compute order under every schedule of ``SCHEDULES`` (docs/model.md section 6.4).

One function per schedule writes, for p GPUs, n micro-batches and v chunks, every GPU's
ordered list of actions; ``ORDERS`` finds it by the schedule's name.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from typing import Callable, Iterable, Sequence

from .model import Action, EnvParams, Pair, ParameterError, TaskKind

F, B, I, W = TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT

#: A GPU's compute actions in the order it runs them.
Order = list[Action | Pair]


def _actions(kinds: Iterable[TaskKind], stages: Iterable[int], mbs: Iterable[int]) -> Order:
    """``Action(kind, stage, mb)`` for each kind, stage and micro-batch of the three in turn, made without a Python call
    each (the orders of a large environment hold hundreds of thousands)."""
    return list(map(tuple.__new__, repeat(Action), zip(kinds, stages, mbs)))


def _gpipe(p: int, n: int, v: int) -> list[Order]:
    return [_actions(repeat(F), repeat(r), range(n)) + _actions(repeat(B), repeat(r), range(n)) for r in range(p)]


def _one_f_one_b(p: int, n: int, v: int) -> list[Order]:
    orders: list[Order] = []
    for r in range(p):
        forwards, backwards = _actions(repeat(F), repeat(r), range(n)), _actions(repeat(B), repeat(r), range(n))
        warmup = min(p - r - 1, n)
        order = forwards[:warmup]
        for k, m in enumerate(range(warmup, n)):
            order += [forwards[m], backwards[k]]
        order += backwards[n - warmup:]
        orders.append(order)
    return orders


def _interleaved(p: int, n: int, v: int) -> list[Order]:
    """Megatron-LM's interleaved 1F1B, micro-batch groups of p (model section 6.4)."""
    total = n * v

    def micro_batch(k: int) -> int:
        return (k // (p * v)) * p + k % p

    orders: list[Order] = []
    micro_batches = [micro_batch(k) for k in range(total)]
    for r in range(p):
        forward = _actions(repeat(F), (((k % (p * v)) // p) * p + r for k in range(total)), micro_batches)
        backward = _actions(repeat(B), ((v - 1 - (k % (p * v)) // p) * p + r for k in range(total)), micro_batches)
        warmup = min(2 * (p - r - 1) + (v - 1) * p, total)
        order = forward[:warmup]
        for k in range(total - warmup):
            order += [forward[k + warmup], backward[k]]
        order += backward[total - warmup:]
        orders.append(order)
    return orders


def _zb_h1(p: int, n: int, v: int) -> list[Order]:
    orders: list[Order] = []
    for r in range(p):
        forward, input_grad, weight = (_actions(repeat(kind), repeat(r), range(n)) for kind in (F, I, W))
        warmup = min(p - r - 1, n)
        order = forward[:warmup]
        next_w = 0
        for k in range(n):
            if warmup + k < n:
                order.append(forward[warmup + k])
            order.append(input_grad[k])
            if k >= r:
                order.append(weight[next_w])
                next_w += 1
        order += weight[next_w:]
        orders.append(order)
    return orders


def _zb_v(p: int, n: int, v: int) -> list[Order]:
    """PyTorch's ScheduleZBVZeroBubble, written for max(2p - 1, n) micro-batches and cut to n."""
    big_n = max(2 * p - 1, n)
    orders: list[Order] = []
    for r in range(p):
        stage = (r, 2 * p - 1 - r)
        f, b = [0, 0], [0, 0]  # next forward and next input-gradient micro-batch of each chunk
        order: Order = []

        def forward(chunk: int) -> None:
            order.append(Action(F, stage[chunk], f[chunk]))
            f[chunk] += 1

        def input_grad(chunk: int, with_weight: bool = False) -> None:
            order.append(Action(I, stage[chunk], b[chunk]))
            if with_weight:
                order.append(Action(W, stage[chunk], b[chunk]))
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
            order.append(Action(W, stage[0], w0))
            w0 += 1
        order += [Action(W, stage[1], m) for m in range(w1, b[1])]
        order += [Action(W, stage[0], m) for m in range(w0, b[0])]
        orders.append([action for action in order if isinstance(action, Action) and action.mb < n])
    return orders


def _dualpipe_v(p: int, n: int, v: int) -> list[Order]:
    """DeepSeek's DualPipeV (PyTorch's ScheduleDualPipeV), model section 6.4."""
    orders: list[Order] = []
    for r in range(p):
        stage = (r, 2 * p - 1 - r)
        forwards, backwards = [0, 0], [0, 0]
        queued_w: deque[Action] = deque()
        order: Order = []

        def forward(chunk: int) -> Action:
            forwards[chunk] += 1
            return Action(F, stage[chunk], forwards[chunk] - 1)

        def backward(chunk: int, split: bool) -> Action:
            backwards[chunk] += 1
            action = Action(I if split else B, stage[chunk], backwards[chunk] - 1)
            if split:
                queued_w.append(Action(W, action.stage, action.mb))
            return action

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
                order.append(Pair(forward(0), backward(1, split=False)))
            order.append(Pair(forward(1), backward(0, split=False)))
        for _ in range(p - r - 1):
            order.append(backward(1, split=False))
            order.append(Pair(forward(1), backward(0, split=False)))
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


#: Per schedule name (the keys of ``SCHEDULES``), the function ``(num_gpus, n, v) -> per GPU its order``.
ORDERS: dict[str, Callable[[int, int, int], list[Order]]] = {
    "gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved-1f1b": _interleaved, "zb-h1": _zb_h1, "zb-v": _zb_v,
    "dualpipe-v": _dualpipe_v,
}


def build_orders(params: EnvParams) -> list[Order]:
    """Per GPU, the actions of ``params``' schedule in the order it runs them."""
    return ORDERS[params.schedule](params.num_gpus, params.n, params.v)


def compute_orders(schedule: str, *, num_gpus: int, n: int, chunks: int = 2) -> list[list[str]]:
    """Per GPU, the text of each action in the order it runs (``"0F3"``, ``"(0F7;7B3)"``)."""
    params = EnvParams(schedule=schedule, num_gpus=num_gpus, n=n, chunks=chunks)
    return [[str(action) for action in order] for order in build_orders(params)]


def format_orders(orders: Sequence[Sequence[str]]) -> str:
    """One line per GPU: ``GPU 0: 0F0 0F1 ...``."""
    return "\n".join(f"GPU {gpu}: {' '.join(order)}" for gpu, order in enumerate(orders))


def parse_orders(text: str) -> list[list[str]]:
    """The orders ``format_orders`` writes, read back: per GPU the text of its tasks. Blank lines are skipped;
    ``ParameterError`` naming ``order`` for a line that is not ``GPU <g>: <task> ...`` with g = 0, 1, ... in turn."""
    orders: list[list[str]] = []
    for line in filter(None, (line.strip() for line in text.splitlines())):
        head, colon, tasks = line.partition(":")
        if not colon or head.split() != ["GPU", str(len(orders))]:
            raise ParameterError("order", line[:40], f"each line must read 'GPU {len(orders)}: 0F0 0F1 ...' "
                                 "(the GPUs in turn from 0, as --print-order prints them)")
        orders.append(tasks.split())
    return orders
