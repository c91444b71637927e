"""The kernel's constants and the layout of its state: the rows and columns of a few 2D arrays."""

from __future__ import annotations

#: Tasks whose projected ends lie within this relative distance end at the same event.
END_TOLERANCE = 1e-9
#: Two rates closer than this (relative) are the same rate: no new segment starts between them.
RATE_TOLERANCE = 1e-12
#: Two levels closer than this (relative) saturate together in progressive filling.
LEVEL_TOLERANCE = 1e-12
#: A transfer below its sender-only share by more than this (relative) is throttled.
THROTTLE_TOLERANCE = 1e-9
#: Layer numbers of the shared and the zero-priority sending sets; exclusive tier ranks (0 = 'a') come first.
SHARED_LAYER = 1_000
ZERO_LAYER = 1_001
#: The position of grad_sync in COMM_KINDS (fwd_prop, grad_prop, grad_sync), which is also the tie order.
GRAD_SYNC = 2

#: What ``simulate`` returns in ``status``; ``RUNNING`` while an episode waits for a decision.
DONE, STUCK, RUNNING = 0, 1, 2

RELEASE, TRY_START = 0, 1  # frames of the explicit stack that replaces recursion

#: Dispatch rules (docs/model.md section 12), in the order of ``model.DISPATCHERS``.
STATIC, GREEDY, CRITICAL_PATH, ZB_ADAPTIVE = range(4)
#: The rule of an episode (``episode``): each decision is handed back to the caller.
EXTERNAL = 4
#: A compute task's class as dispatchers rank it: backward work (B or I) first, then F, then W; an optimizer step,
#: a GPU's last task, is never chosen: it starts itself.
BACKWARD_CLASS, FORWARD_CLASS, WEIGHT_CLASS, STEP_CLASS = range(4)
#: A transfer's class when it holds its GPU's compute until it ends (an all-to-all, docs/model.md section 16); any
#: other transfer's, and a pair's, is -1.
HOLD_CLASS = -2


# The loop's state lives in a few 2D arrays, one row per quantity, so that helpers take a
# handful of arguments: numba reference-counts every array passed, and tuples of thirty
# arrays per call cost more than the simulation itself. The per-task arrays are the other
# way round, one row per task (``F[task, END]``): an event reads and writes several
# quantities of a few tasks, which then share a cache line, where a large run's rows per
# quantity would each cost a miss.
# Per task, floats (F):
LENGTH, IMPACT, REMAINING, RATE, SINCE, START, END, READY, THROTTLED_TIME, KEY, WEIGHT, SHARE, PRIORITY, \
    DISPATCH_KEY = range(14)
TASK_FLOATS = 14
# per task, integers (I; ``CHOSEN_NOW`` is 1 only while its GPU's new sending set is put in place; ``AFTER`` and
# ``BEFORE`` link a compute task into its GPU's candidates, ``BEFORE`` -2 when it is in none):
GPU, RECEIVER, COMM, STAGE, INDEX, WAITING, THROTTLED_NOW, THROTTLED, TIER, LAYER, KIND_CLASS, RESERVE, FALLS, RANK, \
    CHOSEN_NOW, AFTER, BEFORE = range(17)
TASK_INTS = 17
# per GPU, integers (P; a list fills a row from the left, its length in C or in a count row; ``CANDIDATES``: the
# first of the GPU's compute tasks whose needs are met and that it has not taken, linked by ``AFTER``, -1 for none;
# ``LAST_TAKEN``: the compute task it took last, -1 for none):
NEXT, BUSY, READY_COUNT, SENDING_COUNT, DIRTY_COMM, DIRTY_COMPUTE, DIRTY_COMM_LIST, DIRTY_COMPUTE_LIST, SEED, \
    SEED_LIST, GROUPED, GROUP, GROUP_END, HELD, DECIDE, TAKEN, WAITED, HOLDING, CANDIDATES, LAST_TAKEN = range(20)
GPU_INTS = 20
# per GPU, floats (PF):
SYNC_RATE, INFLOW = range(2)
# queues Q[READY_QUEUE, g] and Q[SENDING_SET, g]: task numbers in ready order
READY_QUEUE, SENDING_SET = range(2)
# counters (C):
SEQ, DONE_COUNT, SEGMENTS, HEAP_SIZE, DIRTY_COMM_COUNT, DIRTY_COMPUTE_COUNT, STACK = range(7)


# Scratch of the allocation: rows of A (integers) and AF (floats), each wider than twice the
# flows of a group and at least as wide as the GPUs. A flow's number is its column;
# BOUND_START and BOUND_MEMBER are compressed rows: per capacity (up to two per flow), its
# flows, BOUND_START one longer than the capacities; LIVE per capacity its flows not yet frozen,
# STALE whether one froze since its level was found; EGRESS_SLOT and INGRESS_SLOT per GPU its
# capacities (-1: none).
FLOWS, CHOSEN, SENDER, RECEIVER_OF, LAYER_OF, MEMBER, EGRESS_OF, INGRESS_OF, PORTS, OPEN, FROZEN, BOUND_START, \
    BOUND_MEMBER, LIVE, STALE, EGRESS_SLOT, INGRESS_SLOT = range(17)
WEIGHT_OF, RATE_OF, CAPACITY, FREE, UNFROZEN, LEVEL, LEFT = range(7)
