"""The planner's figure: iteration time against memory per GPU for every layout simulated."""

from __future__ import annotations

from typing import Sequence

from . import fitted


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both memory (first) and time (second), by memory."""
    front, best = [], float("inf")
    for i in sorted(range(len(points)), key=lambda i: points[i]):
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


#: Times spanning more than this many times over are drawn on a log scale: the few layouts far slower than the rest
#: would crush the rest into a line.
LOG_SPAN = 4.0
#: A GPU's memory more than this many times every layout's peak is left off the memory axis.
FAR = 4.0
#: Colours of the named points, in the order they are named (the best that fits first); as many are drawn.
NAMED_COLORS = ("tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
MAX_NAMED = len(NAMED_COLORS)
#: Of the axes: the room between two labels, beside or above each other, and the width a label may take.
GAP = 0.01
WIDTH = 1.0 - 4 * GAP
#: Of the axes' height: room kept between the labels and the points, the room above the points without labels, and
#: the most the labels may take (a small figure's labels then cover points rather than turn the axis over).
MARGIN, NO_LABELS, MOST_TAKEN = 0.08, 0.1, 0.85


def _label_rows(ax, labels: list, texts: list[str]) -> float:
    """Place ``labels`` (texts in axes coordinates, set to ``texts`` again) in rows from the top, a second beside the
    first (at the right) only where both fit the axes' width, a label wider than it broken between words; returns
    the share of the axes' height they take."""
    figure = ax.figure
    renderer = figure.canvas.get_renderer()

    def measured() -> list[tuple[float, float]]:
        figure.draw_without_rendering()  # lays the axes out, so that the labels are measured against them
        box = ax.get_window_extent(renderer)
        return [(extent.width / box.width, extent.height / box.height)
                for extent in (label.get_bbox_patch().get_window_extent(renderer) for label in labels)]

    for label, text in zip(labels, texts):
        label.set_text(text)
    sizes = measured()
    if any(width > WIDTH for width, _ in sizes):
        share = WIDTH * ax.get_position().width  # of the figure's width
        for label, text, (width, _) in zip(labels, texts, sizes):
            if width > WIDTH:
                label.set_text(fitted(text, figure, label.get_fontsize(), share))
        sizes = measured()
    top, below, beside = 1.0 - 2 * GAP, 1.0 - 2 * GAP, None  # the row's top and bottom; what may go at its right
    for label, (width, height) in zip(labels, sizes):
        if beside is not None and beside + width + GAP <= WIDTH:
            label.set_position((1.0 - 2 * GAP, top))
            label.set_horizontalalignment("right")
            below, beside = min(below, top - height), None
            continue
        top = below - (GAP if beside is not None or top != below else 0.0)
        label.set_position((2 * GAP, top))
        label.set_horizontalalignment("left")
        below, beside = top - height, width
    return 1.0 - below


def plot_plan(ax, memory_gb: Sequence[float], seconds: Sequence[float], fits: Sequence[bool], gpu_memory_gb: float,
              budget_gb: float, named: Sequence[tuple[int, str]], title: str,
              time_label: str = "iteration time") -> None:
    """Every layout as a point (grey crosses: those that do not fit), the Pareto front of those that fit as a step
    line, the GPU's memory (and the budget under a headroom) as dashed lines and the ``named`` points ringed and
    numbered, their labels numbered alike in a band above the points, two a row where both fit its width, so that
    none covers a point or another. Times spanning more than ``LOG_SPAN`` times over are drawn on a log scale, in
    the unit their largest reads best in (s, ms, us). A GPU's memory beyond ``FAR`` times every point's is left off
    the axis, which the legend says, so that a small model's points are not crushed against zero."""
    scale, unit = next((scale, unit) for scale, unit, least in ((1.0, "s", 1.0), (1e3, "ms", 1e-3), (1e6, "us", 0.0))
                       if max(seconds) >= least)
    seconds = [time * scale for time in seconds]
    far = gpu_memory_gb > FAR * max(memory_gb)
    off = " (off the axis, right)" if far else ""
    inside = [i for i, ok in enumerate(fits) if ok]
    outside = [i for i, ok in enumerate(fits) if not ok]
    ax.scatter([memory_gb[i] for i in inside], [seconds[i] for i in inside], s=14, color="tab:blue", alpha=0.55,
               label=f"fits ({len(inside)})")
    if outside:
        ax.scatter([memory_gb[i] for i in outside], [seconds[i] for i in outside], s=14, color="0.6", marker="x",
                   label=f"does not fit ({len(outside)})")
    front = [inside[k] for k in pareto_front([(memory_gb[i], seconds[i]) for i in inside])]
    ax.step([memory_gb[i] for i in front], [seconds[i] for i in front], where="post", color="tab:orange",
            linewidth=1.5, marker="o", markersize=5, label="Pareto front")
    ax.axvline(gpu_memory_gb, color="tab:red", linestyle="--", linewidth=1,
               label=f"GPU memory {gpu_memory_gb:g} GB{off}")
    if budget_gb < gpu_memory_gb:
        ax.axvline(budget_gb, color="tab:red", linestyle=":", linewidth=1,
                   label=f"with headroom {budget_gb:g} GB{off if budget_gb > FAR * max(memory_gb) else ''}")
    if far:
        ax.set_xlim(0.0, 1.15 * max(memory_gb))
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel(f"{time_label} ({unit})")
    ax.set_title(fitted(title, ax.figure, 9), fontsize=9, loc="left")
    ax.grid(True, which="both", alpha=0.25)
    low, high = min(seconds), max(seconds)
    log = high > LOG_SPAN * low
    if log:
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    texts = [f"{k + 1}  {label}" for k, (_, label) in enumerate(named[:MAX_NAMED])]
    labels = []
    for k, (index, _) in enumerate(named[:MAX_NAMED]):
        color = NAMED_COLORS[k]
        ax.scatter([memory_gb[index]], [seconds[index]], s=140 + 60 * k, facecolors="none", edgecolors=color,
                   linewidths=2, zorder=5)
        ax.annotate(str(k + 1), (memory_gb[index], seconds[index]), xytext=(7 + 2 * k, 7 + 2 * k),
                    textcoords="offset points", fontsize=10, fontweight="bold", color=color, zorder=6,
                    bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8})
        labels.append(ax.text(0.02, 0.98, texts[k], transform=ax.transAxes, ha="left", va="top", fontsize=8,
                              color=color,
                              bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": color, "alpha": 0.92},
                              in_layout=False))  # placed within the axes, never a reason to shrink them
    # measured on the axes as laid out, then again within the limits that leaves them (their ticks' labels move the
    # axes' edge)
    for _ in range(2 if labels else 1):
        taken = min(MOST_TAKEN, _label_rows(ax, labels, texts) + MARGIN) if labels else NO_LABELS
        band = 1.05 * taken / (1.0 - taken)  # of the points' span, above them, with 0.05 of it below them
        if log:
            ax.set_ylim(low / (high / low) ** 0.05, high * (high / low) ** band)
        else:
            ax.set_ylim(low - 0.05 * (high - low or high), high + band * (high - low or high))
    ax.legend(fontsize=8, loc="best")
