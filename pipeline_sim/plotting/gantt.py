"""Gantt charts of one schedule: compute bars and bandwidth-share stacks of transfers."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from typing import Sequence

from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from ..model import COMM_KINDS, Schedule, Task, TaskKind

KIND_COLORS = {
    TaskKind.FORWARD: "#4C72B0",
    TaskKind.BACKWARD: "#8172B3",
    TaskKind.FWD_PROP: "#55A868",
    TaskKind.GRAD_PROP: "#DD8452",
    TaskKind.GRAD_SYNC: "#64B5CD",
}
THROTTLE_COLOR = "#D62728"
ROW_HEIGHT = 0.8

#: Row layouts: per GPU, the rows drawn and the task kinds each holds.
LAYOUTS = {
    "single_channel": (("compute", (TaskKind.FORWARD, TaskKind.BACKWARD)), ("comm", COMM_KINDS)),
    "dual_channel": (("compute", (TaskKind.FORWARD, TaskKind.BACKWARD)),
                     ("pipeline", (TaskKind.FWD_PROP, TaskKind.GRAD_PROP)), ("sync", (TaskKind.GRAD_SYNC,))),
}


def _stacked_pieces(tasks: Sequence[Task]) -> list[tuple[Task, float, float, float, float]]:
    """Rectangles ``(task, x0, x1, y0, height)`` stacking concurrent transfers by their rates.

    Heights are rates (1 = the whole port); within each interval tasks stack in
    kind, then index order, so a task keeps its place while the set around it holds.
    """
    breaks = sorted({t for task in tasks for t0, t1, _ in task.segments for t in (t0, t1)})
    active = defaultdict(list)
    for task in tasks:
        for t0, t1, rate in task.segments:
            for i in range(bisect_left(breaks, t0), bisect_left(breaks, t1)):
                active[i].append((task, rate))
    order = {kind: i for i, kind in enumerate(COMM_KINDS)}
    pieces: list[list] = []
    open_piece: dict[int, list] = {}
    for i in sorted(active):
        x0, x1 = breaks[i], breaks[i + 1]
        y0 = 0.0
        for task, rate in sorted(active[i], key=lambda item: (order[item[0].kind], item[0].index)):
            piece = open_piece.get(id(task))
            if piece is not None and piece[2] == x0 and piece[3] == y0 and piece[4] == rate:
                piece[2] = x1
            else:
                piece = [task, x0, x1, y0, rate]
                open_piece[id(task)] = piece
                pieces.append(piece)
            y0 += rate
    return [(task, x0, x1, y0, height) for task, x0, x1, y0, height in pieces]


def _label(ax: Axes, text: str, x0: float, x1: float, y: float, min_width: float, size: float) -> None:
    if x1 - x0 >= min_width * len(text):
        ax.text((x0 + x1) / 2, y, text, ha="center", va="center", fontsize=size, color="white", clip_on=True)


def plot_gantt(ax: Axes, schedule: Schedule, *, layout: str = "single_channel", show_throttling: bool = False,
               show_completion_time: bool = False) -> list:
    """Draw ``schedule`` on ``ax``, one row group per GPU; return the patches drawn.

    Compute tasks are full-height bars. In communication rows, a transfer's height
    at any time is its rate, so concurrent transfers stack from the row's floor up
    to the port's capacity.
    """
    rows = LAYOUTS[layout]
    p = schedule.params.num_gpus
    span = max(schedule.completion_time, 1e-9)
    label_size = 7
    axes_points = ax.figure.get_size_inches()[0] * 72 * ax.get_position().width
    char_width = span * 1.02 * 0.62 * label_size / axes_points  # data units one label character needs
    by_gpu_kind = defaultdict(list)
    for task in schedule.tasks:
        if task.end > task.start:
            by_gpu_kind[task.gpu, task.kind].append(task)

    artists = []
    ticks, tick_labels = [], []
    for gpu in range(p):
        for r, (row_name, kinds) in enumerate(rows):
            y = gpu * (len(rows) + 0.5) + r  # rows of one GPU together, a gap between GPUs
            ticks.append(y)
            tick_labels.append(f"GPU {gpu} {row_name}")
            tasks = [task for kind in kinds for task in by_gpu_kind[gpu, kind]]
            if row_name == "compute":
                for task in tasks:
                    artists.append(ax.add_patch(Rectangle(
                        (task.start, y - ROW_HEIGHT / 2), task.end - task.start, ROW_HEIGHT,
                        facecolor=KIND_COLORS[task.kind], edgecolor="white", linewidth=0.5)))
                    _label(ax, task.label, task.start, task.end, y, char_width, label_size)
                continue
            widest: dict[int, tuple] = {}
            for task, x0, x1, y0, height in _stacked_pieces(tasks):
                throttled = show_throttling and task.throttled
                artists.append(ax.add_patch(Rectangle(
                    (x0, y + ROW_HEIGHT / 2 - (y0 + height) * ROW_HEIGHT), x1 - x0, height * ROW_HEIGHT,
                    facecolor=KIND_COLORS[task.kind],
                    edgecolor=THROTTLE_COLOR if throttled else "white",
                    linewidth=1.2 if throttled else 0.3)))
                best = widest.get(id(task))
                if best is None or (x1 - x0) * height > (best[1] - best[0]) * best[3]:
                    widest[id(task)] = (x0, x1, y + ROW_HEIGHT / 2 - (y0 + height / 2) * ROW_HEIGHT, height, task)
            for x0, x1, label_y, height, task in widest.values():
                if height >= 0.3:
                    _label(ax, task.label, x0, x1, label_y, char_width, label_size - 1)

    ax.set_yticks(ticks, tick_labels)
    ax.set_ylim(ticks[-1] + 0.75, -0.75)
    ax.set_xlim(0, span * 1.02)
    ax.set_xlabel("time (model units)")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    ax.set_axisbelow(True)

    handles = [Patch(facecolor=KIND_COLORS[kind], label=str(kind)) for kind in TaskKind
               if any(by_gpu_kind[gpu, kind] for gpu in range(p))]
    if show_throttling:
        handles.append(Patch(facecolor="white", edgecolor=THROTTLE_COLOR, linewidth=1.2, label="throttled"))
    if show_completion_time:
        total = schedule.completion_time
        ax.axvline(total, color=THROTTLE_COLOR, linestyle="--", linewidth=1.2)
        label_gpu = 1 if p > 1 else 0
        label_y = ticks[label_gpu * len(rows)] - 0.45
        ax.text(total, label_y, f"completion {total:.4g} ", color=THROTTLE_COLOR, fontsize=8,
                ha="right", va="bottom", backgroundcolor="white")
        handles.append(Line2D([], [], color=THROTTLE_COLOR, linestyle="--", label=f"completion time {total:.4g}"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    return artists


def gantt_title(schedule: Schedule) -> str:
    params = schedule.params
    first = (f"1F1B, {params.num_gpus} GPUs, n={params.n} micro-batches, sync every {params.sync_freq}; "
             f"completion time {schedule.completion_time:.4g} (ideal {params.ideal_time:.4g})")
    second = (f"fwd {params.fwd_len:g}, bwd {params.bwd_len:g}, prop {params.prop_len:g}, "
              f"sync {params.sync_base_len:g}, impact fwd {params.fwd_impact:g} / bwd {params.bwd_impact:g}, "
              f"ingress {params.ingress_capacity:g}; policy {schedule.policy.label}")
    return f"{first}\n{second}"
