"""The look-ahead dispatcher (docs/model.md section 12.7): at each decision, every candidate is tried on a copy of
the loop's state whose unfinished tasks take their expected lengths, run to the end under a base rule, and the
candidate of the earliest end is started in the run itself.

A copy sees only what a scheduler at run time knows: what has ended, what runs and how much of it is done, and the
expected (noise-free) length of everything else; the draw's lengths of unfinished tasks are overwritten before the
copy moves.
"""

from __future__ import annotations

import numpy as np

from .events import heap_set
from .jit import compiled, inner, internal
from .loop import begin_apart, decision, prepare_apart, resume, simulate, try_all
from .next_task import choices
from .state import (
    COMM,
    DONE,
    DONE_COUNT,
    END,
    EXTERNAL,
    HELD,
    LENGTH,
    NEXT,
    RATE,
    READY,
    REMAINING,
    RESERVE,
    RUNNING,
    SEQ,
    SINCE,
    STACK,
    START,
    STATIC,
    STUCK,
    WAITING,
)


@internal
def _copy(state: tuple) -> tuple:
    """The loop's arrays copied; no segments kept. The scratch of the allocation (``A``, ``AF``) and of the ends
    (``ending``), which each event writes before it reads them, and the stack's free part are not copied: new arrays
    of their shape, only the stack's frames (none at a decision) copied in."""
    F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending = state
    stack = np.empty_like(K)
    stack[:, :C[STACK]] = K[:, :C[STACK]]
    return (F.copy(), I.copy(), P.copy(), PF.copy(), Q.copy(), np.empty_like(A), np.empty_like(AF), C.copy(),
            HT.copy(), HI.copy(), SI[:0].copy(), SF[:, :0].copy(), stack, np.empty_like(ending))


@inner
def expect(now: float, expected: np.ndarray, F: np.ndarray, I: np.ndarray, HT: np.ndarray, HI: np.ndarray,
           C: np.ndarray) -> None:
    """Every unfinished task's length set to ``expected``: one not begun takes it whole; one under way takes what
    it lacks of it after the work done by ``now`` (nothing, once it has run longer), its projected end moved to
    match. What has ended keeps its lengths."""
    for i in range(F.shape[0]):
        if not np.isnan(F[i, END]):
            continue
        if np.isnan(F[i, START]):
            F[i, LENGTH] = expected[i]
            F[i, REMAINING] = expected[i]
            continue
        rate = F[i, RATE]
        since = rate * (now - F[i, SINCE])  # the work done since its remaining work was last brought up to date
        done = F[i, LENGTH] - F[i, REMAINING] + since
        left = max(expected[i] - done, 0.0)
        F[i, LENGTH] = expected[i]
        F[i, REMAINING] = left + since
        if rate > 0.0:
            C[SEQ] += 1
            heap_set(HT, HI, C, now + left / rate, C[SEQ], i)


@inner
def planned(s: int, memory: int, F: np.ndarray, I: np.ndarray, P: np.ndarray, order_start: np.ndarray,
            order_task: np.ndarray) -> int:
    """GPU s's next task in its static order not yet taken, if it can start now (its needs met, within the memory
    limit), or -1."""
    for j in range(order_start[s] + P[NEXT, s], order_start[s + 1]):
        task = order_task[j]
        if np.isnan(F[task, READY]):
            if I[task, WAITING] > 0 or I[task, RESERVE] > 0 and P[HELD, s] + I[task, RESERVE] > memory:
                return -1
            return task
    return -1


@compiled
def look_ahead(length: np.ndarray, gpu: np.ndarray, receiver: np.ndarray, comm: np.ndarray, stage: np.ndarray,
               index: np.ndarray, impact: np.ndarray, needs_count: np.ndarray, release_start: np.ndarray,
               release_task: np.ndarray, order_start: np.ndarray, order_task: np.ndarray, peer_start: np.ndarray,
               peer_task: np.ndarray, kind_class: np.ndarray, reserve: np.ndarray, falls: np.ndarray,
               dispatch_key: np.ndarray, memory: int, kind_tier: np.ndarray, kind_priority: np.ndarray,
               ingress_capacity: float, segment_room: int, expected: np.ndarray, actions: int,
               progress: np.ndarray) -> tuple:
    """One iteration to its end, every decision the look-ahead's (docs/model.md section 12.7). The candidates of
    GPU s: the static order's next task if it can start, else waiting where that is possible; then every task the
    episode's actions start (``choices``). Each is taken on a copy of the state with expected lengths
    (``expect``), which the static order, each GPU's untaken tasks in order, runs to the end; the candidate of the
    earliest end is taken, the first on a tie. Returns ``(status, now, segments, state, rollouts)``: the state the
    arrays of ``prepare``, as ``simulate`` leaves them; ``rollouts`` how many copies ran to the end. ``progress[0]``
    is kept at the tasks ended so far, for another process to read while this one runs (a chart's bar)."""
    state = prepare_apart(length, gpu, receiver, comm, stage, index, impact, needs_count, kind_class, reserve, falls,
                          dispatch_key, len(order_start) - 1, kind_tier, kind_priority, segment_room,
                          np.empty(0, dtype=np.int64))
    F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending = state
    begin_apart(EXTERNAL, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
    out = np.empty(actions, dtype=np.int64)
    candidates = np.empty(actions + 1, dtype=np.int64)
    now = 0.0
    rollouts = 0
    while True:
        status, segments, now, s = resume(memory, ingress_capacity, release_start, release_task, order_start,
                                          order_task, peer_start, peer_task, state, now)
        progress[0] = C[DONE_COUNT]
        if status != RUNNING:  # DONE or STUCK
            return status, now, segments, state, rollouts
        choices(s, memory, F, I, P, order_start, order_task, out)
        first = planned(s, memory, F, I, P, order_start, order_task)
        count = 0
        if first >= 0 or out[actions - 1] == 0:  # the static order's own step: its next task, or waiting for it
            candidates[0] = first
            count = 1
        for j in range(actions - 1):
            if out[j] >= 0 and out[j] != first:
                candidates[count] = out[j]
                count += 1
        chosen = candidates[0]
        if count > 1:
            seen = _copy(state)
            expect(now, expected, seen[0], seen[1], seen[8], seen[9], seen[7])
            best = np.inf
            best_flow = np.inf
            for k in range(count):
                trial = _copy(seen)
                TF, TI, TP, _, TQ, _, _, TC, _, _, _, _, TK, _ = trial
                if candidates[k] >= 0:
                    decision(s, candidates[k], now, STATIC, TF, TI, TP, TQ, TK, TC, release_start, release_task,
                             order_start, order_task)
                try_all(now, STATIC, TF, TI, TP, TQ, TK, TC, release_start, release_task, order_start, order_task)
                ahead = simulate(expected, gpu, receiver, comm, stage, index, impact, needs_count, release_start,
                                 release_task, order_start, order_task, peer_start, peer_task, kind_class, reserve,
                                 falls, dispatch_key, STATIC, memory, kind_tier, kind_priority, ingress_capacity, 0,
                                 trial, now)
                rollouts += 1
                end = ahead[7] if ahead[0] == DONE else np.inf
                flow = (TF[:, END] * (TI[:, COMM] < 0)).sum() if ahead[0] == DONE else np.inf
                if end < best * (1.0 - 1e-9) or (end <= best * (1.0 + 1e-9) and flow < best_flow * (1.0 - 1e-9)):
                    best = end
                    best_flow = flow
                    chosen = candidates[k]
        decision(s, chosen, now, EXTERNAL, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
    return STUCK, now, 0, state, rollouts
