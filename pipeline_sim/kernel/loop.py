"""The event loop (docs/model.md sections 2 and 3): readiness chains, endings, and the loop that runs an
iteration from time 0 to its last end."""

from __future__ import annotations

import numpy as np
from numba import types

from .allocation import (
    SCRATCH_FLOATS,
    SCRATCH_INTS,
    compute_rates,
    contended_rates,
    group_flows,
    ready_key,
    scratch_width,
    sending_sets,
    set_group_rates,
)
from .events import heap_pop, mark, push, set_rate
from .figures import figures
from .jit import (
    HUGE_PAGE_BYTES,
    PREFETCH_TASKS,
    advise_huge_pages,
    at_address,
    compiled,
    exposed,
    inlined,
    inner,
    prefetch_row,
    within,
)
from .next_task import dispatch, enter_candidates, leave_candidates, next_decider, take_next, wake
from .state import (
    BEFORE,
    BUSY,
    CANDIDATES,
    COMM,
    DECIDE,
    DIRTY_COMM,
    DIRTY_COMM_COUNT,
    DIRTY_COMM_LIST,
    DIRTY_COMPUTE,
    DIRTY_COMPUTE_COUNT,
    DIRTY_COMPUTE_LIST,
    DISPATCH_KEY,
    DONE,
    DONE_COUNT,
    END,
    END_TOLERANCE,
    EXTERNAL,
    FALLS,
    GPU,
    GPU_INTS,
    HEAP_SIZE,
    HELD,
    HOLD_CLASS,
    HOLDING,
    IMPACT,
    INDEX,
    KEY,
    KIND_CLASS,
    LAST_TAKEN,
    LENGTH,
    PRIORITY,
    RANK,
    READY,
    READY_COUNT,
    READY_QUEUE,
    RECEIVER,
    RELEASE,
    REMAINING,
    RESERVE,
    RUNNING,
    SEGMENTS,
    STACK,
    STAGE,
    START,
    STATIC,
    STEP_CLASS,
    STUCK,
    TAKEN,
    TASK_FLOATS,
    TASK_INTS,
    THROTTLED,
    THROTTLED_TIME,
    TIER,
    TRY_START,
    WAITED,
    WAITING,
)


@inner
def _start(task: int, s: int, now: float, F: np.ndarray, I: np.ndarray, P: np.ndarray, K: np.ndarray,
           C: np.ndarray, release_start: np.ndarray, release_task: np.ndarray) -> None:
    """GPU s takes compute task ``task`` now: it runs, or, with no work, ends at once and stacks its releases, the
    all-to-alls its end issues holding the GPU from then, before anything it releases or issues may start another
    task there; either way the transfers its start issues (row ``n + task`` of the releases) become ready."""
    F[task, READY] = now
    leave_candidates(task, I, P)
    P[LAST_TAKEN, s] = task
    I[task, RANK] = P[TAKEN, s]
    P[TAKEN, s] += 1
    P[HELD, s] += I[task, RESERVE]
    if F[task, LENGTH] == 0.0:  # a W of no work ends the instant it may start
        F[task, START] = now
        F[task, END] = now
        C[DONE_COUNT] += 1
        P[HELD, s] -= I[task, FALLS]
        for k in range(release_start[task], release_start[task + 1]):
            if I[release_task[k], KIND_CLASS] == HOLD_CLASS:
                P[HOLDING, s] += 1
        push(K, C, RELEASE, task)
    else:
        P[BUSY, s] = task
        mark(P, C, DIRTY_COMPUTE, DIRTY_COMPUTE_LIST, DIRTY_COMPUTE_COUNT, s)
        if F.shape[0] >= PREFETCH_TASKS:  # what its end reads, fetched as it runs
            for k in range(release_start[task], release_start[task + 1]):
                prefetch_row(I, release_task[k])
                prefetch_row(F, release_task[k])
    push(K, C, RELEASE, F.shape[0] + task)


@inner
def _settle(now: float, rule: int, F: np.ndarray, I: np.ndarray, P: np.ndarray, Q: np.ndarray, K: np.ndarray,
            C: np.ndarray, release_start: np.ndarray, release_task: np.ndarray, order_start: np.ndarray,
            order_task: np.ndarray) -> None:
    """Apply the readiness chains on the stack K: releases of ended tasks and compute starts (section 2).

    Zero-work tasks end the instant they may start and release in turn; the stack
    reproduces the depth-first order of a recursive walk. Under a dispatcher a free GPU
    is only marked here: it decides once the whole instant has settled (``_decide``).
    """
    while C[STACK] > 0:
        top = C[STACK] - 1
        if K[0, top] == RELEASE:
            node, k = K[1, top], K[2, top]
            if release_start[node] + k >= release_start[node + 1]:
                C[STACK] = top
                continue
            K[2, top] = k + 1
            dependent = release_task[release_start[node] + k]
            if I[dependent, COMM] >= 0:  # a transfer becomes ready once all it waits for has ended
                if I[dependent, WAITING] > 1:
                    I[dependent, WAITING] -= 1
                    continue
                I[dependent, WAITING] = 0
                F[dependent, READY] = now
                if F[dependent, LENGTH] == 0.0:
                    F[dependent, START] = now
                    F[dependent, END] = now
                    C[DONE_COUNT] += 1
                    push(K, C, RELEASE, dependent)
                    if I[dependent, KIND_CLASS] == HOLD_CLASS:
                        _release_hold(I[dependent, GPU], P, K, C)
                    continue
                if I[dependent, TIER] >= 0:
                    F[dependent, KEY] = ready_key(now)
                if F.shape[0] >= PREFETCH_TASKS:  # as a compute task's start does
                    for j in range(release_start[dependent], release_start[dependent + 1]):
                        prefetch_row(I, release_task[j])
                        prefetch_row(F, release_task[j])
                s = I[dependent, GPU]
                Q[READY_QUEUE, s, P[READY_COUNT, s]] = dependent
                P[READY_COUNT, s] += 1
                mark(P, C, DIRTY_COMM, DIRTY_COMM_LIST, DIRTY_COMM_COUNT, s)
            else:
                I[dependent, WAITING] -= 1
                if I[dependent, WAITING] == 0:
                    enter_candidates(dependent, I, P)
                push(K, C, TRY_START, I[dependent, GPU])
        else:
            s = K[1, top]
            if P[HOLDING, s] > 0:  # an all-to-all holds the GPU (section 16): it starts nothing
                C[STACK] = top
                continue
            if rule != STATIC:
                C[STACK] = top
                if P[BUSY, s] < 0:
                    last = order_task[max(order_start[s], order_start[s + 1] - 1)]  # an optimizer step is no
                    if I[last, KIND_CLASS] == STEP_CLASS and I[last, WAITING] == 0 and \
                            np.isnan(F[last, READY]):  # decision (section 6.7)
                        _start(last, s, now, F, I, P, K, C, release_start, release_task)
                    else:
                        P[DECIDE, s] = 1
                continue
            task = take_next(s, F, I, P, order_start, order_task) if P[BUSY, s] < 0 else -1
            if task < 0:
                C[STACK] = top
                continue
            _start(task, s, now, F, I, P, K, C, release_start, release_task)


@inner
def _decide(now: float, rule: int, memory: int, F: np.ndarray, I: np.ndarray, P: np.ndarray, Q: np.ndarray,
            K: np.ndarray, C: np.ndarray, release_start: np.ndarray, release_task: np.ndarray,
            order_start: np.ndarray, order_task: np.ndarray) -> None:
    """Every free GPU marked since the last decisions chooses its next task, lowest GPU first (section 12.1).

    A task of no work ends at once; what it makes ready is settled, and the GPUs it frees
    or feeds decide in turn, within the same instant.
    """
    p = P.shape[1]
    while True:
        s = -1
        for g in range(p):
            if P[DECIDE, g] == 1:
                s = g
                break
        if s < 0:
            return
        P[DECIDE, s] = 0
        if P[BUSY, s] >= 0 or P[HOLDING, s] > 0:
            continue
        task = dispatch(s, rule, memory, F, I, P, order_start, order_task)
        if task < 0:
            continue
        _start(task, s, now, F, I, P, K, C, release_start, release_task)
        if P[BUSY, s] < 0:
            P[DECIDE, s] = 1
        _settle(now, rule, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)


@inner
def _release_hold(s: int, P: np.ndarray, K: np.ndarray, C: np.ndarray) -> None:
    """A transfer holding GPU s has ended: once none holds it, it tries its next compute (before the releases)."""
    P[HOLDING, s] -= 1
    if P[HOLDING, s] == 0:
        push(K, C, TRY_START, s)


@inner
def _finish(i: int, now: float, F: np.ndarray, I: np.ndarray, P: np.ndarray, Q: np.ndarray, K: np.ndarray,
            HT: np.ndarray, HI: np.ndarray, SI: np.ndarray, SF: np.ndarray, C: np.ndarray,
            release_start: np.ndarray, release_task: np.ndarray) -> None:
    """End task i now and stack what follows: the next compute of its GPU, then its releases."""
    set_rate(i, 0.0, False, now, F, I, HT, HI, SI, SF, C)
    F[i, REMAINING] = 0.0
    F[i, END] = now
    C[DONE_COUNT] += 1
    s = I[i, GPU]
    push(K, C, RELEASE, i)
    if I[i, COMM] < 0:
        P[BUSY, s] = -1
        P[HELD, s] -= I[i, FALLS]
        for k in range(release_start[i], release_start[i + 1]):  # the all-to-alls its end issues hold the GPU
            if I[release_task[k], KIND_CLASS] == HOLD_CLASS:
                P[HOLDING, s] += 1
        push(K, C, TRY_START, s)  # the next compute starts before the releases
    else:
        if I[i, KIND_CLASS] == HOLD_CLASS:
            _release_hold(s, P, K, C)
        last = P[READY_COUNT, s] - 1
        j = 0
        while Q[READY_QUEUE, s, j] != i:
            j += 1
        for j in range(j, last):
            Q[READY_QUEUE, s, j] = Q[READY_QUEUE, s, j + 1]
        P[READY_COUNT, s] = last
        mark(P, C, DIRTY_COMM, DIRTY_COMM_LIST, DIRTY_COMM_COUNT, s)


@within
def queue_room(gpu: np.ndarray, comm: np.ndarray, p: int) -> int:
    """The most transfers one GPU has (at least 1): the room of its queue of ready transfers."""
    per_gpu = np.zeros(p, dtype=np.int64)
    for i in range(len(comm)):
        if comm[i] >= 0:
            per_gpu[gpu[i]] += 1
    room = 1
    for s in range(p):  # not per_gpu.max(), which compiles numpy's reduction for a few numbers
        room = max(room, per_gpu[s])
    return room


@within
def state_words(n: int, p: int, queue: int) -> int:
    """The words (8 bytes each) of the state arrays that grow with the tasks, which ``prepare`` takes from its room,
    for ``n`` tasks on ``p`` GPUs of ``queue`` transfers at most: ``F``, ``HT``, ``AF``, then ``I``, ``HI``, ``K``,
    ``ending``, ``Q`` and ``A``."""
    width = scratch_width(p * queue, p)
    return n * (TASK_FLOATS + 1 + TASK_INTS + 3 + 1) + 3 * (3 * n + 2 * p + 8) + 2 * p * queue + \
        (SCRATCH_FLOATS + SCRATCH_INTS) * width


@compiled
def prepare(length: np.ndarray, gpu: np.ndarray, receiver: np.ndarray, comm: np.ndarray, stage: np.ndarray,
            index: np.ndarray, impact: np.ndarray, needs_count: np.ndarray, kind_class: np.ndarray,
            reserve: np.ndarray, falls: np.ndarray, dispatch_key: np.ndarray, num_gpus: int, kind_tier: np.ndarray,
            kind_priority: np.ndarray, segment_room: int, room: np.ndarray) -> tuple:
    """The state of an iteration at time 0, before anything starts: the arrays ``F, I, P, PF, Q, A, AF, C, HT, HI,
    SI, SF, K, ending`` that ``advance`` and the decisions carry from event to event. Those that grow with the tasks
    are taken from ``room`` (``state_words`` of it, anything it held overwritten), or from a new one when it is
    smaller: a run that gives the same room to one simulation after another faults its pages in once."""
    n = len(length)
    p = num_gpus
    queue = queue_room(gpu, comm, p)
    width = scratch_width(p * queue, p)
    words = state_words(n, p, queue)
    if len(room) < words:
        room = np.empty(words, dtype=np.int64)
    room = room[:words]
    floats = room[:n * (TASK_FLOATS + 1) + SCRATCH_FLOATS * width].view(np.float64)
    F = floats[:n * TASK_FLOATS].reshape((n, TASK_FLOATS))
    if F.nbytes >= HUGE_PAGE_BYTES:  # a large run's state in huge pages, which fault once per 2 MiB, not per 4 KiB
        advise_huge_pages(room)  # (asked for smaller, their wait for the system to free 2 MiB stalls some runs)
    HT = floats[n * TASK_FLOATS:n * (TASK_FLOATS + 1)]
    AF = floats[n * (TASK_FLOATS + 1):].reshape((SCRATCH_FLOATS, width))
    at = len(floats)
    I = room[at:at + n * TASK_INTS].reshape((n, TASK_INTS))
    at += n * TASK_INTS
    # the heap of projected ends, one entry a task at most: per entry its time (HT), number and task (HI rows 0
    # and 1); per task the place of its entry (HI row 2, -1: none)
    HI = room[at:at + 3 * n].reshape((3, n))
    at += 3 * n
    stack = 3 * n + 2 * p + 8
    K = room[at:at + 3 * stack].reshape((3, stack))
    at += 3 * stack
    ending = room[at:at + n]
    at += n
    Q = room[at:at + 2 * p * queue].reshape((2, p, queue))
    A = room[at + 2 * p * queue:].reshape((SCRATCH_INTS, width))
    P = np.empty((GPU_INTS, p), dtype=np.int64)
    P[:] = 0
    P[BUSY] = -1
    P[CANDIDATES] = -1
    P[LAST_TAKEN] = -1
    for i in range(n):  # element by element: a whole-row copy would compile a shape check and its error message
        for column in range(TASK_FLOATS):  # each row written in one pass, not a pass over the whole array first
            F[i, column] = 0.0
        for column in range(TASK_INTS):
            I[i, column] = 0
        F[i, LENGTH] = length[i]
        F[i, IMPACT] = impact[i]
        F[i, REMAINING] = length[i]
        F[i, START] = np.nan
        F[i, END] = np.nan
        F[i, READY] = np.nan
        F[i, DISPATCH_KEY] = dispatch_key[i]
        I[i, GPU] = gpu[i]
        I[i, RECEIVER] = receiver[i]
        I[i, COMM] = comm[i]
        I[i, STAGE] = stage[i]
        I[i, INDEX] = index[i]
        I[i, WAITING] = needs_count[i]
        I[i, TIER] = -1
        I[i, KIND_CLASS] = kind_class[i]
        I[i, RESERVE] = reserve[i]
        I[i, FALLS] = falls[i]
        I[i, BEFORE] = -2
        HI[2, i] = -1
        if comm[i] >= 0:
            I[i, TIER] = kind_tier[comm[i]]
            F[i, PRIORITY] = kind_priority[comm[i]]
        elif needs_count[i] == 0:  # a compute task that may start at time 0
            enter_candidates(i, I, P)
    PF = np.empty((2, p))
    PF[:] = 0.0
    C = np.empty(7, dtype=np.int64)
    C[:] = 0
    SI = np.empty(segment_room, dtype=np.int64)
    SF = np.empty((3, segment_room))
    return F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending


@exposed
def begin(rule: int, F: np.ndarray, I: np.ndarray, P: np.ndarray, Q: np.ndarray, K: np.ndarray, C: np.ndarray,
          release_start: np.ndarray, release_task: np.ndarray, order_start: np.ndarray,
          order_task: np.ndarray) -> None:
    """Time 0: the transfers issued at time 0 become ready (the last row of the releases), then every GPU tries its
    first task."""
    push(K, C, RELEASE, 2 * F.shape[0])
    _settle(0.0, rule, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
    try_all(0.0, rule, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)


@inner
def try_all(now: float, rule: int, F: np.ndarray, I: np.ndarray, P: np.ndarray, Q: np.ndarray, K: np.ndarray,
            C: np.ndarray, release_start: np.ndarray, release_task: np.ndarray, order_start: np.ndarray,
            order_task: np.ndarray) -> None:
    """Every GPU in turn tries to start its next task now."""
    for s in range(P.shape[1]):
        push(K, C, TRY_START, s)
        _settle(now, rule, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)


#: The loop's work at an event, called at each function's own address (``jit.at_address``): functions the compiler
#: keeps out of line in any case, whose code is then compiled once for all, in parallel, rather than again in the loop.
_decide_apart = at_address(_decide)
sending_sets_apart = at_address(sending_sets)
group_flows_apart = at_address(group_flows)
contended_rates_apart = at_address(contended_rates)
set_group_rates_apart = at_address(set_group_rates)
_finish_apart = at_address(_finish)
_settle_apart = at_address(_settle)
next_decider_apart = at_address(next_decider)


@inner
def advance(rule: int, memory: int, ingress_capacity: float, release_start: np.ndarray, release_task: np.ndarray,
            order_start: np.ndarray, order_task: np.ndarray, peer_start: np.ndarray, peer_task: np.ndarray,
            F: np.ndarray, I: np.ndarray, P: np.ndarray, PF: np.ndarray, Q: np.ndarray, A: np.ndarray,
            AF: np.ndarray, C: np.ndarray, HT: np.ndarray, HI: np.ndarray, SI: np.ndarray, SF: np.ndarray,
            K: np.ndarray, ending: np.ndarray, now: float) -> tuple:
    """The event loop from ``now`` to the end of the run, or under ``EXTERNAL`` to the next decision:
    ``(status, now, decider)`` (``simulate``). Its own function, allocating nothing, so that an episode's loop
    resumes it at every decision without counting references to every array."""
    n = F.shape[0]
    status = RUNNING
    decider = -1
    while True:
        if rule == EXTERNAL:
            decider = next_decider_apart(memory, F, I, P, order_start, order_task)
            if decider >= 0:
                break
        elif rule != STATIC:
            _decide_apart(now, rule, memory, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
        # new rates where the last event's changes reach
        for group in range(sending_sets_apart(now, F, I, P, Q, A, HT, HI, SI, SF, C, peer_start, peer_task)):
            count = group_flows_apart(group, ingress_capacity, F, I, P, PF, Q, A)
            if count > 0:
                contended_rates_apart(count, ingress_capacity, F, I, A, AF)
            set_group_rates_apart(group, abs(count), count > 0, now, F, I, P, PF, Q, A, AF, HT, HI, SI, SF, C)
        compute_rates(now, F, I, P, PF, HT, HI, SI, SF, C)
        if C[DONE_COUNT] >= n:
            status = DONE
            break
        # the next event: every task whose projected end lies within the tolerance of the earliest
        if C[HEAP_SIZE] == 0:
            status = STUCK
            break
        now = HT[0]
        limit = now + END_TOLERANCE * max(1.0, abs(now))
        count = 0
        while C[HEAP_SIZE] > 0 and HT[0] <= limit:
            ending[count] = HI[1, 0]
            count += 1
            heap_pop(HT, HI, C)
        for k in range(count):
            _finish_apart(ending[k], now, F, I, P, Q, K, HT, HI, SI, SF, C, release_start, release_task)
            _settle_apart(now, rule, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
        if rule == EXTERNAL:
            wake(P)
    return status, now, decider


#: What the entry points call, each at its own address: the loop and its start and end, which then are compiled once,
#: not again in each entry point; the loop's ``(status, now, decider)`` as its type, so that an entry point compiles
#: at the same time as the loop.
advance_apart = at_address(advance, types.Tuple((types.int64, types.float64, types.int64)))
prepare_apart = at_address(prepare)
begin_apart = at_address(begin)
figures_apart = at_address(figures)


@inlined
def start(length: np.ndarray, gpu: np.ndarray, receiver: np.ndarray, comm: np.ndarray, stage: np.ndarray,
          index: np.ndarray, impact: np.ndarray, needs_count: np.ndarray, release_start: np.ndarray,
          release_task: np.ndarray, order_start: np.ndarray, order_task: np.ndarray, kind_class: np.ndarray,
          reserve: np.ndarray, falls: np.ndarray, dispatch_key: np.ndarray, rule: int, kind_tier: np.ndarray,
          kind_priority: np.ndarray, segment_room: int, room: np.ndarray) -> tuple:
    """An iteration's state (``prepare``, in ``room``) once time 0 is settled (``begin``): what ``advance`` runs
    from."""
    state = prepare_apart(length, gpu, receiver, comm, stage, index, impact, needs_count, kind_class, reserve, falls,
                          dispatch_key, len(order_start) - 1, kind_tier, kind_priority, segment_room, room)
    F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending = state
    begin_apart(rule, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)
    return state


#: What a first compile shares between the run and a second process on the other core (``engine.compile_kernel``)
#: besides the loop ``advance`` and the entry points: every function they call, each compiled by whichever process
#: reaches it first, into the cache from which the other loads it. In an order that starts each process on a function
#: that needs none of the others, brings each to a callee both use (``set_rate``, ``_settle``) only once the other has
#: likely written it, and ends on the loop's short functions, so that both processes are done at about the same time,
#: the loop then compiled (it needs all it calls at their addresses), then the entry points.
SHARED_COMPILE = (begin, contended_rates, sending_sets, _decide, figures, prepare, group_flows, next_decider,
                  set_group_rates, compute_rates, _finish, heap_pop, wake)


@compiled
def simulate(length: np.ndarray, gpu: np.ndarray, receiver: np.ndarray, comm: np.ndarray, stage: np.ndarray,
             index: np.ndarray, impact: np.ndarray, needs_count: np.ndarray, release_start: np.ndarray,
             release_task: np.ndarray, order_start: np.ndarray, order_task: np.ndarray, peer_start: np.ndarray,
             peer_task: np.ndarray, kind_class: np.ndarray, reserve: np.ndarray, falls: np.ndarray,
             dispatch_key: np.ndarray, rule: int, memory: int, kind_tier: np.ndarray, kind_priority: np.ndarray,
             ingress_capacity: float, segment_room: int, state: tuple | None = None, now: float = 0.0) -> tuple:
    """Simulate one iteration of the task graph given as arrays under one policy.

    ``kind_tier[k]`` is the exclusive tier rank (0 = 'a') of transfer kind ``k`` in
    ``COMM_KINDS`` order, -1 for shared; ``kind_priority[k]`` its shared priority.
    ``rule`` is ``STATIC`` (each GPU runs ``order_task`` in order) or a dispatcher, which
    chooses by ``dispatch_key``, then ``kind_class``, micro-batch and stage, within
    ``memory`` (1/v units; ``reserve`` and ``falls``: the room a task takes and gives back).
    Returns ``(status, F, I, segments, segment_task, segment_times, P, now, decider)``: ``status`` is
    ``DONE`` or ``STUCK``; the columns ``READY``, ``START``, ``END`` and ``THROTTLED_TIME`` of
    ``F`` and ``THROTTLED`` and ``RANK`` (its place in its GPU's run) of ``I`` are every task's
    record; ``segments`` counts the stretches at a constant positive rate, of which the first ``segment_room`` are kept:
    task, then ``(t0, t1, rate)`` rows. ``P`` holds each GPU's next compute and busy task.

    Under the ``EXTERNAL`` rule the loop stops at each decision with ``status`` ``RUNNING``, the instant ``now``
    and the GPU that must decide (``decider``); the caller starts a task (``decision``) and calls again with
    ``state``, the arrays of ``prepare`` it began with, and ``now``: the same loop continues where it stopped.
    Without ``state`` the compiler removes those branches, and the state stays local to this function.
    """
    if state is None:
        state = start(length, gpu, receiver, comm, stage, index, impact, needs_count, release_start, release_task,
                      order_start, order_task, kind_class, reserve, falls, dispatch_key, rule, kind_tier,
                      kind_priority, segment_room, np.empty(0, dtype=np.int64))  # its own: the caller keeps it
    F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending = state
    status, now, decider = advance_apart(rule, memory, ingress_capacity, release_start, release_task, order_start,
                                         order_task, peer_start, peer_task, F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF,
                                         K, ending, now)
    kept = min(C[SEGMENTS], segment_room)
    return status, F, I, C[SEGMENTS], SI[:kept], SF[:, :kept], P, now, decider


@inlined
def resume(memory: int, ingress_capacity: float, release_start: np.ndarray, release_task: np.ndarray,
           order_start: np.ndarray, order_task: np.ndarray, peer_start: np.ndarray, peer_task: np.ndarray,
           state: tuple, now: float) -> tuple:
    """A run whose every decision is its caller's (``EXTERNAL``), continued from ``state`` at ``now`` to its next
    decision or its end: ``(status, segments, now, decider)``, as ``simulate`` gives them."""
    F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending = state
    status, now, decider = advance_apart(EXTERNAL, memory, ingress_capacity, release_start, release_task,
                                         order_start, order_task, peer_start, peer_task, F, I, P, PF, Q, A, AF, C, HT,
                                         HI, SI, SF, K, ending, now)
    return status, C[SEGMENTS], now, decider


@exposed
def decision(s: int, task: int, now: float, rule: int, F: np.ndarray, I: np.ndarray, P: np.ndarray,
             Q: np.ndarray, K: np.ndarray, C: np.ndarray, release_start: np.ndarray, release_task: np.ndarray,
             order_start: np.ndarray, order_task: np.ndarray) -> None:
    """GPU s, stopped at a decision, starts ``task`` now, or with -1 waits for the next event (docs/model.md
    section 12.4); what it makes ready is settled as a compiled dispatcher's choice would be."""
    P[DECIDE, s] = 0
    if task < 0:
        P[WAITED, s] = 1
        return
    _start(task, s, now, F, I, P, K, C, release_start, release_task)
    if P[BUSY, s] < 0:
        P[DECIDE, s] = 1
    _settle(now, rule, F, I, P, Q, K, C, release_start, release_task, order_start, order_task)


@compiled
def simulate_policies(length: np.ndarray, gpu: np.ndarray, receiver: np.ndarray, comm: np.ndarray,
                      stage: np.ndarray, index: np.ndarray, impact: np.ndarray, needs_count: np.ndarray,
                      release_start: np.ndarray, release_task: np.ndarray, order_start: np.ndarray,
                      order_task: np.ndarray, peer_start: np.ndarray, peer_task: np.ndarray,
                      kind_class: np.ndarray, reserve: np.ndarray, falls: np.ndarray, dispatch_key: np.ndarray,
                      rule: int, memory: int, rises: np.ndarray, units: int, kind_tiers: np.ndarray,
                      kind_priorities: np.ndarray, ingress_capacity: float, room: np.ndarray) -> tuple:
    """``figures`` of one simulation per policy (rows of ``kind_tiers`` and ``kind_priorities``), in one call, each
    simulation's state in ``room`` (``prepare``'s; a new one when it is smaller), one after another. Returns the
    figures, a stuck simulation's row all NaN, and the room used.
    """
    p = len(order_start) - 1
    out = np.empty((len(kind_tiers), 3 + 3 * p))
    out[:] = np.nan
    words = state_words(len(length), p, queue_room(gpu, comm, p))
    if len(room) < words:
        room = np.empty(words, dtype=np.int64)
    starts, ends, throttled_time = np.empty(len(length)), np.empty(len(length)), np.empty(len(length))
    throttled = np.empty(len(length), dtype=np.int64)
    for row in range(len(kind_tiers)):
        F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending = start(
            length, gpu, receiver, comm, stage, index, impact, needs_count, release_start, release_task,
            order_start, order_task, kind_class, reserve, falls, dispatch_key, rule, kind_tiers[row],
            kind_priorities[row], 0, room)
        status = advance_apart(rule, memory, ingress_capacity, release_start, release_task, order_start, order_task,
                               peer_start, peer_task, F, I, P, PF, Q, A, AF, C, HT, HI, SI, SF, K, ending, 0.0)[0]
        if status == DONE:
            # the columns copied, in one pass over the rows: the figures' one signature takes contiguous arrays, as a
            # schedule's records
            for i in range(len(length)):
                starts[i], ends[i] = F[i, START], F[i, END]
                throttled[i], throttled_time[i] = I[i, THROTTLED], F[i, THROTTLED_TIME]
            figures_apart(gpu, comm, rises, falls, p, units, starts, ends, throttled, throttled_time, out[row])
    return out, room
