"""The simulation kernel: the event loop and the layered allocation over arrays, compiled by numba.

This is the one implementation of docs/model.md sections 2, 3 and 6. Between two
events every active task progresses at a constant rate; an event is a task ending
(every readiness follows from an ending, or from time 0). At an event the loop applies
all endings and the readiness chains they cause, then recomputes rates, only where the
event can change them: the sending sets of the GPUs whose ready transfers changed, and
the layered allocation of the group of GPUs those transfers couple through ingress
limits. Everything else keeps its rate, which is what a recomputation from scratch
would give it; a task's remaining work is brought up to date only when its rate changes.

One compiled loop in rooms of its own: ``state`` (the constants and the rows of the
state arrays), ``events`` (rate changes, the heap of projected ends), ``allocation``
(sending sets and rates), ``next_task`` (which compute task a free GPU starts: its static order or a
dispatch rule), ``bound`` (the lower bound of section 12.2), ``observation`` (what a deciding GPU sees), ``play``
(a learned dispatcher's decisions, its network evaluated in the loop), ``lookahead`` (candidates tried forward on
expected lengths), ``loop`` (readiness chains and the loop itself), ``figures`` (what a sweep keeps),
``sorting`` (the one sort the figures and the bound use), ``draws`` (the integer steps of the noise draw),
``orders`` (each schedule's compute orders), ``structure`` (a task graph's arrays built from its orders) and
``work`` (an environment's lengths and activations on them).

The functions take the task graph as arrays (``engine.GraphArrays``) and never ask
which schedule produced it. They are plain Python that numba compiles once per
installation (``cache=True``); with ``NUMBA_DISABLE_JIT=1`` the very same code runs
uncompiled, for debugging. Every float operation is written in the order the model's
reference takes it, so compiled and uncompiled runs give the same bits.

Left out on purpose: latency (a transfer's cost is its work only), contention inside a
GPU other than through ``grad_sync`` traffic, and the receiving side of ``grad_sync``
(data-parallel peers are outside the model).
"""

from .allocation import layered_rates
from .bound import lower_bound, memory_bound, path_times
from .draws import uniforms
from .figures import figures
from .lookahead import look_ahead
from .loop import begin, decision, prepare, simulate, simulate_policies
from .next_task import choices
from .observation import observe
from .orders import schedule_parts
from .play import act, play
from .state import (
    BUSY,
    DONE,
    END,
    EXTERNAL,
    NEXT,
    RANK,
    READY,
    RUNNING,
    SHARED_LAYER,
    START,
    STUCK,
    THROTTLED,
    THROTTLED_TIME,
    ZERO_LAYER,
)
from .structure import build_structure
from .work import graph_work

__all__ = ["BUSY", "DONE", "END", "EXTERNAL", "NEXT", "RANK", "READY", "RUNNING", "SHARED_LAYER", "START", "STUCK",
           "THROTTLED", "THROTTLED_TIME", "ZERO_LAYER", "act", "begin", "build_structure", "choices", "decision",
           "figures", "graph_work", "layered_rates", "look_ahead", "lower_bound", "memory_bound", "observe",
           "path_times", "play", "prepare", "schedule_parts", "simulate", "simulate_policies", "uniforms"]
