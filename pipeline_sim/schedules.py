"""Pipeline schedules as data (docs/model.md section 6): placement of stages and each GPU's compute order.

A schedule is a ``ScheduleSpec`` found by name in ``SCHEDULES``: how many model chunks
each GPU holds, where each stage lives, which of the parameters ``chunks``,
``w_fraction`` and ``fb_overlap`` it reads, what it requires of ``n`` and ``num_gpus``,
and one function that writes every GPU's ordered list of actions. Nothing else in the
package knows a schedule by its name: the task graph, the engine, the validator and
the plots read these values.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from .model import Action, Pair, ParameterError, TaskKind

F, B, I, W = TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT

#: A GPU's compute order: its actions in the order it runs them.
Order = list[Action | Pair]  # a GPU's compute actions in the order it runs them


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule. ``chunks`` is its fixed v, or None when the ``chunks`` parameter sets it."""

    name: str
    summary: str
    chunks: int | None
    placement: Callable[[int, int, int], int]  # (stage, num_gpus, v) -> GPU
    build: Callable[[int, int, int], list[Order]]  # (num_gpus, n, v) -> per GPU its order
    parameters: tuple[str, ...] = ()  # which of chunks, w_fraction, fb_overlap it reads
    requires: Callable[[int, int], str | None] = lambda n, num_gpus: None  # a failed requirement, said

    def v(self, chunks: int) -> int:
        return self.chunks if self.chunks is not None else chunks

    def check(self, n: int, num_gpus: int) -> None:
        """Raise ``ParameterError`` naming ``n`` when the schedule cannot run ``n`` micro-batches on ``num_gpus``."""
        problem = self.requires(n, num_gpus)
        if problem:
            raise ParameterError("n", n, f"schedule {self.name} with num_gpus = {num_gpus} {problem}")


# -- placement --------------------------------------------------------------------------

def _linear(stage: int, num_gpus: int, v: int) -> int:
    return stage


def _round_robin(stage: int, num_gpus: int, v: int) -> int:
    return stage % num_gpus


def _v_shape(stage: int, num_gpus: int, v: int) -> int:
    return stage if stage < num_gpus else 2 * num_gpus - 1 - stage


# -- orders -----------------------------------------------------------------------------

def _gpipe(p: int, n: int, v: int) -> list[Order]:
    return [[*(Action(F, r, m) for m in range(n)), *(Action(B, r, m) for m in range(n))] for r in range(p)]


def _one_f_one_b(p: int, n: int, v: int) -> list[Order]:
    orders: list[Order] = []
    for r in range(p):
        warmup = min(p - r - 1, n)
        order: Order = [Action(F, r, m) for m in range(warmup)]
        for k, m in enumerate(range(warmup, n)):
            order += [Action(F, r, m), Action(B, r, k)]
        order += [Action(B, r, m) for m in range(n - warmup, n)]
        orders.append(order)
    return orders


def _interleaved(p: int, n: int, v: int) -> list[Order]:
    """Megatron-LM's interleaved 1F1B, micro-batch groups of p (model section 6.4)."""
    total = n * v

    def micro_batch(k: int) -> int:
        return (k // (p * v)) * p + k % p

    orders: list[Order] = []
    for r in range(p):
        def forward(k: int) -> Action:
            return Action(F, ((k % (p * v)) // p) * p + r, micro_batch(k))

        def backward(k: int) -> Action:
            return Action(B, (v - 1 - (k % (p * v)) // p) * p + r, micro_batch(k))

        warmup = min(2 * (p - r - 1) + (v - 1) * p, total)
        order: Order = [forward(k) for k in range(warmup)]
        for k in range(total - warmup):
            order += [forward(k + warmup), backward(k)]
        order += [backward(k) for k in range(total - warmup, total)]
        orders.append(order)
    return orders


def _zb_h1(p: int, n: int, v: int) -> list[Order]:
    orders: list[Order] = []
    for r in range(p):
        warmup = min(p - r - 1, n)
        order: Order = [Action(F, r, m) for m in range(warmup)]
        next_w = 0
        for k in range(n):
            if warmup + k < n:
                order.append(Action(F, r, warmup + k))
            order.append(Action(I, r, k))
            if k >= r:
                order.append(Action(W, r, next_w))
                next_w += 1
        order += [Action(W, r, m) for m in range(next_w, n)]
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


def _multiple_of_gpus(n: int, num_gpus: int) -> str | None:
    return None if n % num_gpus == 0 else f"requires n to be a multiple of num_gpus ({num_gpus})"


def _at_least_twice_the_gpus(n: int, num_gpus: int) -> str | None:
    return None if n >= 2 * num_gpus else f"requires n >= 2 x num_gpus ({2 * num_gpus})"


SCHEDULES: dict[str, ScheduleSpec] = {spec.name: spec for spec in (
    ScheduleSpec("gpipe", "all forwards, then all backwards", 1, _linear, _gpipe),
    ScheduleSpec("1f1b", "warm-up forwards, then one forward / one backward", 1, _linear, _one_f_one_b),
    ScheduleSpec("interleaved-1f1b", "1F1B over v chunks per GPU, placed round robin", None, _round_robin,
                 _interleaved, ("chunks",), _multiple_of_gpus),
    ScheduleSpec("zb-h1", "1F1B with backwards split into I and W, W deferred to fill bubbles", 1, _linear,
                 _zb_h1, ("w_fraction",)),
    ScheduleSpec("zb-v", "zero bubble on a V of two chunks per GPU", 2, _v_shape, _zb_v, ("w_fraction",)),
    ScheduleSpec("dualpipe-v", "two chunks on a V, forward and backward of two micro-batches overlapped",
                 2, _v_shape, _dualpipe_v, ("w_fraction", "fb_overlap"), _at_least_twice_the_gpus),
)}



def get_schedule(name: object) -> ScheduleSpec:
    """The schedule called ``name`` (case-insensitive); ``ParameterError`` lists the valid names."""
    spec = SCHEDULES.get(name.strip().lower()) if isinstance(name, str) else None
    if spec is None:
        raise ParameterError("schedule", name, f"must be one of {', '.join(SCHEDULES)}")
    return spec


def compute_orders(schedule: str, *, num_gpus: int, n: int, chunks: int = 2) -> list[list[str]]:
    """Per GPU, the text of each action in the order it runs (``"0F3"``, ``"(0F7;7B3)"``)."""
    from .model import EnvParams

    params = EnvParams(schedule=schedule, num_gpus=num_gpus, n=n, chunks=chunks)
    spec = get_schedule(params.schedule)
    return [[str(action) for action in order] for order in spec.build(num_gpus, n, params.v)]


def format_orders(orders: Sequence[Sequence[str]]) -> str:
    """One line per GPU: ``GPU 0: 0F0 0F1 ...``."""
    return "\n".join(f"GPU {gpu}: {' '.join(order)}" for gpu, order in enumerate(orders))
