"""Gantt charts of one schedule: compute bars and bandwidth-share stacks of transfers."""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from pathlib import PurePath
from typing import Sequence, cast

import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter
from matplotlib.transforms import Bbox

from ..model import COMPUTE_KINDS, KIND_INDEX, KINDS, TRANSFER_KINDS, Run, Schedule, Task, TaskKind
from ..results import ENVIRONMENT_KEYS, TABLE_KEYS, noise_name, titles
from ..tables import read_table

KIND_COLORS = {
    TaskKind.FORWARD: "#4C72B0",
    TaskKind.BACKWARD: "#8172B3",
    TaskKind.BACKWARD_INPUT: "#8172B3",  # the input-gradient half of a backward
    TaskKind.BACKWARD_WEIGHT: "#B07A3B",
    TaskKind.FWD_PROP: "#55A868",
    TaskKind.GRAD_PROP: "#DD8452",
    TaskKind.GRAD_SYNC: "#64B5CD",
    TaskKind.OPTIMIZER_STEP: "#C44E52",
    TaskKind.PARAM_GATHER: "#2A7F9E",
    TaskKind.FWD_GATHER: "#2A7F9E",
    TaskKind.BWD_GATHER: "#1B5670",
    TaskKind.KV_EXCHANGE: "#A6C85C",
    TaskKind.KV_GRAD_EXCHANGE: "#E8B04A",
    TaskKind.A2A: "#D45FA0",  # expert parallelism's all-to-all: magenta, apart from every other traffic
    TaskKind.A2A_GRAD: "#8E2C6A",
}
LEGEND_NAMES = {TaskKind.BACKWARD_INPUT: "backward_input (I)", TaskKind.BACKWARD_WEIGHT: "backward_weight (W)",
                TaskKind.OPTIMIZER_STEP: "optimizer_step (O)"}
THROTTLE_COLOR = "#D62728"
MEMORY_COLOR = "#6A3D9A"
ROW_HEIGHT = 0.8
#: How much lighter the last chunk of a GPU is drawn than its first (chunks between, in proportion).
CHUNK_LIGHTEN = 0.45
#: The resolution charts are saved at (dots per inch).
DPI = 130
#: A chart's height, in inches, per row and for its title and axis; at most ``MAX_HEIGHT`` in all (15,600 pixels at
#: ``DPI``: a 40-inch chart stays under the 89 million pixels an image library opens without a warning), so that a
#: deep pipeline's rows grow thinner rather than the image beyond what a viewer opens.
ROW_INCHES, MARGIN_INCHES, MAX_HEIGHT = 0.42, 1.2, 120.0
#: Rows of room above the first GPU for the completion time's label.
COMPLETION_BAND = 0.7
#: The least distance between two labels of the GPU axis, in points: closer rows are labelled every few GPUs.
LABEL_PITCH = 11.0
#: Below this median width of a compute bar, in pixels, bars are no longer drawn one by one: each pixel column of
#: a row shows what ran in it (``_Columns``), the only thing a reader could see there.
MIN_BAR_PIXELS = 3.0

#: Row layouts: per GPU, the rows drawn and the task kinds each holds.
LAYOUTS = {
    "single_channel": (("compute", COMPUTE_KINDS), ("comm", TRANSFER_KINDS)),
    "dual_channel": (("compute", COMPUTE_KINDS),
                     ("pipeline", (TaskKind.FWD_PROP, TaskKind.GRAD_PROP, TaskKind.KV_EXCHANGE,
                                   TaskKind.KV_GRAD_EXCHANGE, TaskKind.A2A, TaskKind.A2A_GRAD)),
                     ("sync", (TaskKind.GRAD_SYNC, TaskKind.PARAM_GATHER, TaskKind.FWD_GATHER, TaskKind.BWD_GATHER))),
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
    order = {kind: i for i, kind in enumerate(TRANSFER_KINDS)}
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


def _label(ax: Axes, texts: Sequence[str], x0: float, x1: float, y: float, min_width: float, size: float) -> None:
    """The first of ``texts`` (the fullest first) that fits on the bar from ``x0`` to ``x1`` with a character's room
    to spare, so that labels of neighbouring bars never run together; none when none fits."""
    for text in texts:
        if x1 - x0 >= min_width * (len(text) + 1):
            ax.text((x0 + x1) / 2, y, text, ha="center", va="center", fontsize=size, color="white", clip_on=True)
            return


def _shade(color: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """``color`` lightened for a GPU's later chunks, so that chunks of one GPU tell apart."""
    fade = CHUNK_LIGHTEN * chunk / max(1, chunks - 1)
    red, green, blue = (c + (1.0 - c) * fade for c in to_rgb(color))
    return red, green, blue


def _compute_labels(task: Task, chunked: bool) -> tuple[str, ...]:
    """``F3``, or with chunks its stage too (``F3·s5``); a pair ``F7|B3``; then shorter forms for a narrower bar:
    without the stage, and the micro-batch alone (the colour tells the kind)."""
    bare = "".join(c for c in task.label if c.isdigit() or c == "|")
    if task.kind is TaskKind.OVERLAP_F_B or not chunked:
        return task.label, bare
    return f"{task.label}·s{task.stage}", task.label, bare


class _Bars:
    """Rectangles gathered for one collection: drawing 100,000 bars as patches one by one takes minutes."""

    def __init__(self, edge: str) -> None:
        self.edge = edge
        self.corners: list[tuple[float, float, float, float]] = []
        self.faces: list[object] = []
        self.widths: list[float] = []
        self.edges: list[str] = []

    def add(self, x0: float, y0: float, width: float, height: float, face: object, linewidth: float,
            edge: str | None = None) -> None:
        self.corners.append((x0, y0, width, height))
        self.faces.append(face)
        self.widths.append(linewidth)
        self.edges.append(edge or self.edge)

    def draw(self, ax: Axes) -> None:
        if not self.corners:
            return
        x0, y0, width, height = np.array(self.corners).T
        verts = np.stack([np.stack([x0, y0], 1), np.stack([x0 + width, y0], 1),
                          np.stack([x0 + width, y0 + height], 1), np.stack([x0, y0 + height], 1)], 1)
        ax.add_collection(PolyCollection(list(verts), facecolors=self.faces, edgecolors=self.edges,
                                         linewidths=self.widths), autolim=False)


def _draw_compute(ax: Axes, bars: _Bars, task: Task, y: float, stage_chunk: Sequence[int], chunks: int,
                  char_width: float, label_size: float) -> None:
    """One bar per part: a pair is one bar split in two halves, its forward then its backward."""
    width = (task.end - task.start) / len(task.parts)
    for i, part in enumerate(task.parts):
        bars.add(task.start + i * width, y - ROW_HEIGHT / 2, width, ROW_HEIGHT,
                 _shade(KIND_COLORS[part.kind], stage_chunk[part.stage], chunks), 0.5)
    _label(ax, _compute_labels(task, chunks > 1), task.start, task.end, y, char_width, label_size)


def _busy(starts: np.ndarray, ends: np.ndarray, rates: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per column between ``edges``, the integral of the rates of the intervals ``[starts, ends)`` over it: from
    the running integral ``sum r (t - s)`` over intervals begun by t, less the same over those ended by t."""
    def integral(points: np.ndarray, marks: np.ndarray) -> np.ndarray:
        order = np.argsort(marks, kind="stable")
        marks, weights = marks[order], rates[order]
        count = np.searchsorted(marks, edges, side="right")
        rate = np.concatenate([[0.0], np.cumsum(weights)])[count]
        moment = np.concatenate([[0.0], np.cumsum(weights * marks)])[count]
        return points * rate - moment
    running = integral(edges, starts) - integral(edges, ends)
    return np.diff(running)


class _ColumnRow(AxesImage):
    """A row drawn by pixel column: in column ``c``, bands stacked from the row's floor, band ``k`` up to
    ``tops[k, c]`` (a share of the row's height, not decreasing in ``k``) in ``colours[k, c]`` (RGBA bytes).

    Made at the resolution it is drawn at, one output pixel looked up per pixel, and kept for the draw after the one
    that lays the figure out: an image that matplotlib resamples costs ten times as much per pixel, twice, a polygon
    per colour as much again, and a chart of 64 GPUs has 40 million pixels.
    """

    def __init__(self, ax: Axes, tops: np.ndarray, colours: np.ndarray, edges: np.ndarray, y: float) -> None:
        super().__init__(ax, interpolation="nearest")
        self.tops = tops
        self.set_data(np.concatenate([colours, np.zeros((1, *colours.shape[1:]), np.uint8)]))  # clear above them
        self.pixels = np.ascontiguousarray(self.get_array()).view(np.uint32)[..., 0]  # a band's colour per column
        self.set_extent((edges[0], edges[-1], y + ROW_HEIGHT / 2, y - ROW_HEIGHT / 2))
        self.made: tuple = ((), None)

    def make_image(self, renderer, magnification=1.0, unsampled=False):
        x0, x1, floor, top = self.get_extent()
        (left, low), (right, high) = self.get_transform().transform([(x0, floor), (x1, top)])
        box = Bbox.intersection(self.get_window_extent(renderer), self.axes.bbox)
        if box is None:
            return None, 0, 0, None
        x, y, x_end, y_end = np.round(box.extents * magnification)
        width, height = int(x_end - x), int(y_end - y)
        if width <= 0 or height <= 0:
            return None, 0, 0, None
        key = (x, y, width, height, left, right, low, high, magnification)
        if self.made[0] != key:
            count = self.tops.shape[1]
            centres = (x + np.arange(width) + 0.5) / magnification
            columns = np.clip(((centres - left) / (right - left) * count).astype(np.int64), 0, count - 1)
            # each pixel row's height above the floor, a share of the row's; an image's first row is drawn lowest
            shares = ((y + np.arange(height) + 0.5) / magnification - low) / (high - low)
            pixels, tops = self.pixels[:, columns], self.tops[:, columns]
            image = np.repeat(pixels[-1:], height, 0)
            for k in reversed(range(len(tops))):  # each pixel in the lowest band whose top lies above it
                np.copyto(image, pixels[k][None], where=shares[:, None] < tops[k][None])
            self.made = (key, (image.view(np.uint8).reshape(height, width, 4), x / magnification, y / magnification,
                               None))
        return self.made[1]


class _Columns:
    """What rows drawn by pixel column read of a run (``Schedule.run``), as arrays in the order of its records (by
    task, then part or segment): every part of a compute task that ran, with its GPU, its task's kind, colour (a row
    of ``colours``), start and end (a pair's two halves each); every segment, with its task's GPU and kind."""

    def __init__(self, run: Run, edges: np.ndarray, stage_chunk: Sequence[int], chunks: int) -> None:
        self.edges = edges
        stages = len(stage_chunk)
        self.colours = np.zeros((len(KINDS) * stages, 3))
        for kind, colour in KIND_COLORS.items():
            for stage, chunk in enumerate(stage_chunk):
                self.colours[KIND_INDEX[kind] * stages + stage] = _shade(colour, chunk, chunks)
        ran = (run.end > run.start) & (run.part_kind[:, 0] >= 0)
        task, part = np.nonzero(ran[:, None] & (run.part_kind >= 0))
        width = (run.end[task] - run.start[task]) / (run.part_kind >= 0).sum(1)[task]
        self.part_task, self.part = task, part
        self.part_gpu, self.part_kind = run.gpu[task], run.kind[task]
        self.part_colour = run.part_kind[task, part] * stages + run.part_stage[task, part]
        self.part_start, self.part_end = run.start[task] + part * width, run.start[task] + (part + 1) * width
        self.seg_gpu, self.seg_kind, self.seg_times = run.gpu[run.seg_task], run.kind[run.seg_task], run.seg_times

    def compute(self, ax: Axes, gpu: int, kinds: Sequence[TaskKind], y: float) -> None:
        """GPU ``gpu``'s row of ``kinds``: each column in the colour of what ran longest in it, empty when the GPU
        was idle for more than half of it."""
        place = np.full(len(KINDS), -1)  # each kind's place in the row: the records' order is by it, then by task
        place[[KIND_INDEX[kind] for kind in kinds]] = np.arange(len(kinds))
        mine = np.flatnonzero(self.part_gpu == gpu)
        mine = mine[place[self.part_kind[mine]] >= 0]
        if not mine.size:
            return
        mine = mine[np.lexsort((self.part[mine], self.part_task[mine], place[self.part_kind[mine]]))]
        found, first, which = np.unique(self.part_colour[mine], return_index=True, return_inverse=True)
        rank = np.argsort(np.argsort(first))  # colours in the order they first appear, as ties fall to the first
        colours = self.colours[found[np.argsort(first)]]
        which = rank[which.reshape(-1)]
        starts, ends = self.part_start[mine], self.part_end[mine]
        busy = np.array([_busy(starts[which == c], ends[which == c], np.ones(int((which == c).sum())), self.edges)
                         for c in range(len(colours))])
        shown = busy.sum(0) >= np.diff(self.edges) / 2
        shade = (colours[busy.argmax(0)] * 255).astype(np.uint8)  # as matplotlib turns colours into bytes
        shade = np.concatenate([shade, np.full((len(shade), 1), 255, np.uint8)], 1)
        ax.add_image(_ColumnRow(ax, np.where(shown, 1.0, 0.0)[None], shade[None], self.edges, y))

    def transfers(self, ax: Axes, gpu: int, kinds: Sequence[TaskKind], y: float) -> None:
        """GPU ``gpu``'s row of ``kinds``: each column stacks the mean rate of each kind over it, in the order the
        bars stack, up to the port's capacity."""
        mine = np.flatnonzero(self.seg_gpu == gpu)
        pieces = [(kind, self.seg_times[:, mine[self.seg_kind[mine] == KIND_INDEX[kind]]]) for kind in TRANSFER_KINDS
                  if kind in kinds]
        pieces = [(kind, times) for kind, times in pieces if times.size]
        if not pieces:
            return
        rates = np.array([_busy(t0, t1, rate, self.edges) for _, (t0, t1, rate) in pieces]) / np.diff(self.edges)
        tops = np.minimum(np.cumsum(rates, 0), 1.0)  # each kind's top, a share of the row from its floor
        colours = (np.array([(*to_rgb(KIND_COLORS[kind]), 1.0) for kind, _ in pieces]) * 255).astype(np.uint8)
        ax.add_image(_ColumnRow(ax, tops, np.repeat(colours[:, None], len(self.edges) - 1, 1), self.edges, y))


def _draw_memory(ax: Axes, steps: list[tuple[float, float]], y: float, scale: float, end: float) -> None:
    """A GPU's in-flight activations as a step line filling its row at the busiest GPU's peak."""
    times = [t for t, _ in steps] + [end]
    levels = [level for _, level in steps]
    floor = y + ROW_HEIGHT / 2
    heights = [floor - level / scale * ROW_HEIGHT for level in levels]
    ax.stairs(heights, times, baseline=floor, fill=True, color=MEMORY_COLOR, alpha=0.18)
    ax.stairs(heights, times, baseline=None, color=MEMORY_COLOR, linewidth=1.0)
    # at the row's right end, inside the axes (the legend is beside them): the activations there are 0, drained;
    # on white, over the completion time's line, which passes there
    ax.text(end * 1.02, y, f"peak {max(levels):.3g} ", va="center", ha="right", fontsize=7, color=MEMORY_COLOR,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.9}, zorder=4)


def chart_height(rows: float) -> float:
    """The height in inches of a chart of ``rows`` rows (gaps between GPUs counted)."""
    return min(MARGIN_INCHES + ROW_INCHES * rows, MAX_HEIGHT)


def plot_gantt(ax: Axes, schedule: Schedule, *, layout: str = "single_channel", show_throttling: bool = False,
               show_completion_time: bool = False, show_memory: bool = False,
               stage_chunk: Sequence[int] | None = None, seconds: bool = False) -> bool:
    """Draw ``schedule`` on ``ax``, one row group per GPU; return whether it was drawn by pixel column.

    Compute tasks are full-height bars, a GPU's later chunks lighter (``stage_chunk[s]``:
    which of its GPU's chunks stage ``s`` is; by default every stage is a first chunk).
    In communication rows, a transfer's height at any time is its rate, so concurrent
    transfers stack from the row's floor up to the port's capacity. ``show_memory``
    adds a row per GPU with its in-flight activations (docs/model.md section 7). With
    ``seconds`` (a workload's times) the axis reads in ms or s, whichever fits.

    When the median compute bar would be narrower than ``MIN_BAR_PIXELS`` at ``DPI``, each row is drawn by pixel
    column instead of bar by bar: a compute row shows in each column what ran longest in it (nothing when the GPU
    idled most of it), a transfer row the stack of each kind's mean rate over it; no labels.
    """
    rows = LAYOUTS[layout] + ((("activations", ()),) if show_memory else ())
    p = schedule.params.num_gpus
    chunks = schedule.params.v
    stage_chunk = stage_chunk or [0] * (p * chunks)
    memory = schedule.activation_steps() if show_memory else []
    memory_scale = max((level for steps in memory for _, level in steps), default=1.0) or 1.0
    span = max(schedule.completion_time, 1e-9)
    label_size = 7
    axes_points = cast(Figure, ax.figure).get_size_inches()[0] * 72 * ax.get_position().width
    char_width = span * 1.02 * 0.62 * label_size / axes_points  # data units one label character needs
    pixels = max(1, round(axes_points / 72 * DPI))
    run = schedule.run
    ran = run.end > run.start
    widths = (run.end - run.start)[ran & (run.part_kind[:, 0] >= 0)]
    aggregated = bool(widths.size) and float(np.median(widths)) < MIN_BAR_PIXELS * span * 1.02 / pixels
    columns = _Columns(run, np.linspace(0.0, span * 1.02, pixels + 1), stage_chunk, chunks) if aggregated else None
    by_gpu_kind = defaultdict(list)
    for task in schedule.tasks if not aggregated else ():  # bar by bar: each task's record
        if task.end > task.start:
            by_gpu_kind[task.gpu, task.kind].append(task)

    compute_bars, transfer_bars = _Bars("white"), _Bars("white")
    ticks, tick_labels = [], []
    # on a chart whose rows are thinner than a label, the first row of every few GPUs alone is labelled
    pitch = max(cast(Figure, ax.figure).get_size_inches()[1] - MARGIN_INCHES, 0.1) * 72 / (p * (len(rows) + 0.5))
    every = 0 if pitch >= LABEL_PITCH else int(-(-LABEL_PITCH // (pitch * (len(rows) + 0.5))))  # 0: every row
    for gpu in range(p):
        for r, (row_name, kinds) in enumerate(rows):
            y = gpu * (len(rows) + 0.5) + r  # rows of one GPU together, a gap between GPUs
            ticks.append(y)
            tick_labels.append(f"GPU {gpu} {row_name}" if not every else f"GPU {gpu}" if r == 0 and not gpu % every
                               else "")
            tasks = [task for kind in kinds for task in by_gpu_kind[gpu, kind]]
            if row_name == "activations":
                _draw_memory(ax, memory[gpu], y, memory_scale, schedule.completion_time)
                continue
            if columns is not None:
                (columns.compute if row_name == "compute" else columns.transfers)(ax, gpu, kinds, y)
                continue
            if row_name == "compute":
                for task in tasks:
                    _draw_compute(ax, compute_bars, task, y, stage_chunk, chunks, char_width, label_size)
                continue
            widest: dict[int, tuple] = {}
            for task, x0, x1, y0, height in _stacked_pieces(tasks):
                throttled = show_throttling and task.throttled
                transfer_bars.add(x0, y + ROW_HEIGHT / 2 - (y0 + height) * ROW_HEIGHT, x1 - x0, height * ROW_HEIGHT,
                                  KIND_COLORS[task.kind], 1.2 if throttled else 0.3,
                                  THROTTLE_COLOR if throttled else None)
                best = widest.get(id(task))
                if best is None or (x1 - x0) * height > (best[1] - best[0]) * best[3]:
                    widest[id(task)] = (x0, x1, y + ROW_HEIGHT / 2 - (y0 + height / 2) * ROW_HEIGHT, height, task)
            for x0, x1, label_y, height, task in widest.values():
                if height >= 0.3:
                    _label(ax, (task.label,), x0, x1, label_y, char_width, label_size - 1)

    compute_bars.draw(ax)
    transfer_bars.draw(ax)
    ax.set_yticks(ticks, tick_labels)
    # the completion label gets a band of its own above the first GPU, where it covers no bar
    ax.set_ylim(ticks[-1] + 0.75, -0.75 - (COMPLETION_BAND if show_completion_time else 0.0))
    ax.set_xlim(0, span * 1.02)
    scale, unit = ((1e3, "ms") if span < 2.0 else (1.0, "s")) if seconds else (1.0, "")
    if seconds:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x * scale:g}"))
        ax.set_xlabel(f"time ({unit})")
    elif schedule.params.lengths:  # a table's lengths are in the unit it names, or in whatever it was written in
        unit = read_table(schedule.params.lengths).unit
        ax.set_xlabel(f"time ({unit}, from {PurePath(schedule.params.lengths).name})" if unit else
                      f"time (as in {PurePath(schedule.params.lengths).name})")
    else:
        ax.set_xlabel("time (model units)")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    ax.set_axisbelow(True)

    parts = run.part_kind[ran]
    drawn = {KINDS[k] for k in np.unique(parts[parts >= 0])}  # the parts of compute tasks, the transfers
    drawn |= {KINDS[k] for k in np.unique(run.kind[ran][parts[:, 0] < 0])}
    handles: list[Artist] = [Patch(facecolor=KIND_COLORS[kind], label=LEGEND_NAMES.get(kind, str(kind)))
                             for kind in KIND_COLORS
                             if kind in drawn and not (kind is TaskKind.BACKWARD_INPUT and TaskKind.BACKWARD in drawn)]
    if TaskKind.BACKWARD_INPUT in drawn and TaskKind.BACKWARD in drawn:
        handles[[h.get_label() for h in handles].index("backward")].set_label("backward (B, or I when split)")
    if (run.kind == KIND_INDEX[TaskKind.OVERLAP_F_B]).any():
        handles.append(Patch(facecolor="white", edgecolor="#555555", label="pair F|B: one bar in two halves"))
    if chunks > 1:  # each of a GPU's chunks lighter than the one before; past four, the first and the last
        shown = range(chunks) if chunks <= 4 else (0, chunks - 1)
        handles += [Patch(facecolor=_shade("#777777", chunk, chunks),
                          label=f"a GPU's chunk {chunk + 1}" + (" (lighter each chunk)" if chunk == 0 else ""))
                    for chunk in shown]
    if not aggregated:  # what a compute bar's label says, in the longest form it takes
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label="F3" + ("·s5" if chunks > 1 else "") + ": micro-batch 3's forward" +
                                   (" on stage 5" if chunks > 1 else "") + " (narrow: 3)"))
    if show_memory:
        handles.append(Line2D([], [], color=MEMORY_COLOR, label=f"activations in flight (top of row = "
                                                                f"{memory_scale:.3g} micro-batches)"))
    if show_throttling and not aggregated:
        handles.append(Patch(facecolor="white", edgecolor=THROTTLE_COLOR, linewidth=1.2, label="throttled"))
    if aggregated:
        handles.append(Patch(facecolor="none", edgecolor="none", label=f"{len(widths):,} compute bars, too narrow "
                             f"to draw one by one:\neach pixel column shows what ran\nlongest in it (blank: idle "
                             f"most of it)\nand the transfers' mean rates over it"))
    if show_completion_time:
        total = schedule.completion_time
        ax.axvline(total, color=THROTTLE_COLOR, linestyle="--", linewidth=1.2)
        told = f"{total * scale:.4g}{' ' + unit if unit else ''}"  # in the axis's unit
        ax.text(total, -0.75 - COMPLETION_BAND / 2, f"completion {told} ", color=THROTTLE_COLOR, fontsize=8,
                ha="right", va="center")
        handles.append(Line2D([], [], color=THROTTLE_COLOR, linestyle="--", label=f"completion time {told}"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    return aggregated


def gantt_title(schedule: Schedule, *, schedule_name: str, ideal_time: float, workload: str | None = None) -> str:
    """The chart's title; ``workload``, a workload's description (its times are then seconds)."""
    params = schedule.params
    unit = " s" if workload else ""
    run = schedule.run
    synced = ((run.kind == KIND_INDEX[TaskKind.GRAD_SYNC]) & (run.end > run.start)).any()  # a table's syncs too
    syncs = f"sync every {params.sync_freq}" if synced else "no gradient sync"
    first = (f"{schedule_name}, {params.num_gpus} GPUs, n={params.n} micro-batches, {syncs}; "
             f"completion time {schedule.completion_time:.4g}{unit} (ideal {ideal_time:.4g}{unit}, lower bound "
             f"{schedule.lower_bound:.4g}{unit})")
    if workload:
        second = f"{workload}; policy {schedule.policy.label}"
    else:
        shown = [*TABLE_KEYS, *(name for name in ENVIRONMENT_KEYS if name not in ("n", "num_gpus", "sync_freq"))]
        second = f"{', '.join(titles(params, shown))}; policy {schedule.policy.label}"
    noise = noise_name(params, sep="; ")
    if params.jittered:
        noise = f"one sampled iteration: {noise}"
    return "\n".join([first, second] + ([noise] if noise else []))
