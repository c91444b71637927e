"""Which pipeline schedules exist (docs/model.md section 6): each one's facts, said once.

A schedule is a ``ScheduleSpec`` found by name in ``SCHEDULES``: how many model chunks
each GPU holds, where each stage lives, which of the parameters ``chunks``,
``w_fraction`` and ``fb_overlap`` it reads, and what it requires of ``n`` and
``num_gpus``. Each GPU's compute order is written in ``kernel/orders.py``, one function
per schedule, found by the same name. Nothing else in the package knows a schedule by its name:
the task graph, the engine, the validator and the plots read these values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .parameters import ParameterError


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule. ``chunks`` is its fixed v, or None when the ``chunks`` parameter sets it."""

    name: str
    summary: str
    chunks: int | None
    placement: Callable[[int, int, int], int]  # (stage, num_gpus, v) -> GPU
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


# -- requirements -----------------------------------------------------------------------

def _multiple_of_gpus(n: int, num_gpus: int) -> str | None:
    return None if n % num_gpus == 0 else f"requires n to be a multiple of num_gpus ({num_gpus})"


def _at_least_twice_the_gpus(n: int, num_gpus: int) -> str | None:
    return None if n >= 2 * num_gpus else f"requires n >= 2 x num_gpus ({2 * num_gpus})"


SCHEDULES: dict[str, ScheduleSpec] = {spec.name: spec for spec in (
    ScheduleSpec("gpipe", "all forwards, then all backwards", 1, _linear),
    ScheduleSpec("1f1b", "warm-up forwards, then one forward / one backward", 1, _linear),
    ScheduleSpec("interleaved-1f1b", "1F1B over v chunks per GPU, placed round robin", None, _round_robin,
                 ("chunks",), _multiple_of_gpus),
    ScheduleSpec("zb-h1", "1F1B with backwards split into I and W, W deferred to fill bubbles", 1, _linear,
                 ("w_fraction",)),
    ScheduleSpec("zb-v", "zero bubble on a V of two chunks per GPU", 2, _v_shape, ("w_fraction",)),
    ScheduleSpec("dualpipe-v", "two chunks on a V, forward and backward of two micro-batches overlapped",
                 2, _v_shape, ("w_fraction", "fb_overlap"), _at_least_twice_the_gpus),
)}


def get_schedule(name: object) -> ScheduleSpec:
    """The schedule called ``name`` (case-insensitive); ``ParameterError`` lists the valid names."""
    spec = SCHEDULES.get(name) if isinstance(name, str) else None  # a name as written: most calls' (``EnvParams.v``)
    if spec is None and isinstance(name, str):
        spec = SCHEDULES.get(name.strip().lower())
    if spec is None:
        raise ParameterError("schedule", name, f"must be one of {', '.join(SCHEDULES)}")
    return spec
