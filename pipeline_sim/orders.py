"""Each GPU's compute order under every schedule of ``SCHEDULES`` (docs/model.md section 6.4).

The orders are written in the compiled ``kernel.orders``, one function per schedule, found by the schedule's name
there; here they are read as parts (``order_parts``), as actions (``build_orders``) and as text.
"""

from __future__ import annotations

from functools import cache
from typing import Sequence

import numpy as np

from .compile_cache import built, load_kernel
from .model import KIND_INDEX, KINDS, Action, EnvParams, Pair, ParameterError, TaskKind

#: A GPU's compute actions in the order it runs them.
Order = list[Action | Pair]


@cache
def _schedule_numbers() -> tuple[dict[str, int], np.ndarray]:
    """Per schedule name, its number in ``kernel.orders``; and the kind numbers of the forward, backward, I and W
    there."""
    from .kernel import orders

    kinds = (TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT)
    return ({name: number for number, name in enumerate(orders.SCHEDULES)},
            np.array([KIND_INDEX[kind] for kind in kinds], dtype=np.int64))


def _pairing(params: EnvParams) -> bool:
    """Whether ``params``' orders pair forwards and backwards for the all-to-all's overlap (section 16.1)."""
    return bool(params.ep_overlap) and params.a2a_len > 0


def order_parts(params: EnvParams, split: bool | None = None) -> np.ndarray:
    """Every part of the actions of ``params``' orders, GPU after GPU, as the rows of one array: its GPU, kind number
    (``KIND_INDEX``), stage and micro-batch, and whether (1 or 0) it is the second part of a pair run as one task
    (``split``: each part of a pair run as a task of its own, as a dispatcher runs them; None: as ``params``'
    dispatcher runs them)."""
    numbers, codes = _schedule_numbers()
    split = params.dispatch != "static" if split is None else split
    return built(load_kernel().schedule_parts)(numbers[params.schedule], params.num_gpus, params.n, params.v,
                                               _pairing(params), split, codes)


def build_orders(params: EnvParams) -> list[Order]:
    """Per GPU, the actions of ``params``' schedule in the order it runs them; with ``ep_overlap``, each whole
    backward and the forward after it paired (``kernel.orders``)."""
    gpus, kinds, stages, mbs, second = (values.tolist() for values in order_parts(params, split=False))
    orders: list[Order] = [[] for _ in range(params.num_gpus)]
    for gpu, kind, stage, mb, paired in zip(gpus, kinds, stages, mbs, second):
        action = Action(KINDS[kind], stage, mb)
        orders[gpu].append(Pair(orders[gpu].pop(), action) if paired else action)
    return orders


def format_orders(orders: Sequence[Sequence[str]]) -> str:
    """One line per GPU: ``GPU 0: 0F0 0F1 ...``."""
    return "\n".join(f"GPU {gpu}: {' '.join(order)}" for gpu, order in enumerate(orders))


def parse_orders(text: str) -> list[list[str]]:
    """The orders ``format_orders`` writes, read back: per GPU the text of its tasks. Blank lines are skipped, and
    what follows the GPUs' lines (the report of a visualizer's run that ``--print-order`` printed them in);
    ``ParameterError`` naming ``order`` for a line that is not ``GPU <g>: <task> ...`` with g = 0, 1, ... in turn."""
    orders: list[list[str]] = []
    for number, line in enumerate((line.strip() for line in text.splitlines()), 1):
        if not line:
            continue
        if orders and not line.startswith("GPU"):
            break
        head, colon, tasks = line.partition(":")
        if not colon or head.split() != ["GPU", str(len(orders))]:
            gpu = len(orders)
            raise ParameterError("order", line[:40], f"line {number} must read 'GPU {gpu}: {gpu}F0 {gpu}F1 ...' "
                                 "(the GPUs in turn from 0, as --print-order prints them)")
        orders.append(tasks.split())
    return orders
