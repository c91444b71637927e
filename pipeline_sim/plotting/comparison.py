"""One figure per group of environments that differ only by schedule: which schedule wins, and at what memory.

Reads the summary that ``results.schedule_groups`` made from a sweep's rows; never simulates.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from . import fitted

BEST, DEFAULT, WORST, IDEAL, BOUND = "#1A9850", "#222222", "#D73027", "#4575B4", "#762A83"


def figure_size(count: int) -> tuple[float, float]:
    """Inches for ``count`` schedules: one readable row each."""
    return 12.0, 2.2 + 0.62 * count


def plot_schedule_comparison(fig: Figure, summary: pd.DataFrame, *, title: str, unit: str = "model units") -> dict:
    """Draw each schedule's best, default-policy and worst completion time, its ideal, its lower bound (when the
    sweep has one) and its peak activations.

    One row per schedule: a bar from the best to the worst policy, the best policy
    named beside it; on the right, the largest per-GPU activation peak in micro-batches,
    or, for a workload, the peak memory of the fullest GPU in GB against the GPU's
    capacity (red where it does not fit; throughput and MFU beside the best time).
    The fastest schedule's name is set in bold. Returns the axes by name.
    """
    count = len(summary)
    width, height = figure_size(count)
    # room on the left for the longest schedule name (about 0.085 inch a character at 9 points in bold, as the
    # fastest's is: 0.075 cut a bold name of 37 characters)
    left = max(1.75, 0.085 * max(len(str(name)) for name in summary["schedule"]) + 0.2) / width
    right, bottom, top = 0.25 / width, 0.75 / height, 1.35 / height
    times = fig.add_axes((left, bottom, 0.68 - left, 1 - bottom - top))
    memory = fig.add_axes((0.76, bottom, 1 - right - 0.76, 1 - bottom - top), sharey=times)
    y = np.arange(count)
    winner = int(summary["best_time"].idxmin())

    times.hlines(y, summary["best_time"], summary["worst_time"], color="#BBBBBB", linewidth=7, zorder=1)
    sampled = bool((summary["samples"] > 1).any()) if "samples" in summary else False
    if sampled:  # the best policy's spread over samples: whiskers min..max, box p50..p95
        times.hlines(y + 0.25, summary["best_min"], summary["best_max"], color=BEST, linewidth=1, zorder=2)
        times.hlines(y + 0.25, summary["best_p50"], summary["best_p95"], color=BEST, linewidth=5, alpha=0.5,
                     zorder=2)
    times.scatter(summary["best_time"], y, color=BEST, s=55, zorder=3)
    times.scatter(summary["default_time"], y, color=DEFAULT, marker="D", s=30, zorder=3)
    times.scatter(summary["worst_time"], y, color=WORST, marker="X", s=55, zorder=3)
    times.scatter(summary["ideal_time"], y, color=IDEAL, marker="|", s=260, linewidths=2.2, zorder=2)
    bounded = "lower_bound" in summary and bool(summary["lower_bound"].notna().any())
    if bounded:  # docs/model.md section 12.2: no schedule, static or dispatched, can finish before it
        times.scatter(summary["lower_bound"], y, color=BOUND, marker=">", s=45, zorder=3)
    floor = float(summary["lower_bound"].min()) if bounded else np.inf
    # the slowest mark: the worst policy's mean, or the best one's slowest sample when it lies beyond
    top = float(max(summary["worst_time"].max(), summary["best_max"].max() if sampled else -np.inf))
    span = top - float(min(summary["ideal_time"].min(), summary["best_time"].min(), floor))
    low = float(min(summary["ideal_time"].min(), summary["best_time"].min(), floor,
                    summary["best_min"].min() if sampled else np.inf))
    left_end, right_end = low - 0.05 * span - 1e-9, top + 0.16 * span + 1e-9
    times.set_xlim(left_end, right_end)
    workload = "peak_memory_gb" in summary
    renderer = RendererAgg(int(fig.bbox.width), int(fig.bbox.height), fig.dpi)  # to measure the labels as drawn
    for row in summary.itertuples():
        extra = f"  {row.tokens_per_second:,.0f} tokens/s, MFU {row.mfu:.1%}" if workload else ""
        if bounded and not math.isnan(row.lower_bound):
            extra += f"  ({row.best_time / row.lower_bound - 1:+.1%} on the bound)"
        # a label reads from its point towards the side where it fits inside the axes, as drawn; where it fits on
        # neither, from the axes' left edge, above the row's marks
        note = times.annotate(f"{row.best_time:.4g}  {row.best_policy}{extra}", (row.best_time, row.Index),
                              xytext=(0, 9), textcoords="offset points", ha="left", va="bottom", fontsize=8,
                              color=BEST)
        inside, drawn = times.get_window_extent(renderer), note.get_window_extent(renderer)
        if drawn.x1 > inside.x1:
            note.set_horizontalalignment("right")
            if drawn.x0 - drawn.width < inside.x0:  # read leftwards, it would start before the axes
                note.set_horizontalalignment("left")
                note.xy = (left_end, row.Index)
        times.annotate(f"{row.worst_time:.4g}", (row.worst_time, row.Index), xytext=(6, 0),
                       textcoords="offset points", ha="left", va="center", fontsize=8, color=WORST)
    times.set_yticks(y, summary["schedule"])
    times.get_yticklabels()[winner].set_fontweight("bold")
    if workload:  # a layout that does not fit is flagged, never dropped
        for label, fits in zip(times.get_yticklabels(), summary["memory_fits"].astype(str).eq("True")):
            if not fits:
                label.set_color(WORST)
    times.set_ylim(count - 0.5 + 0.2 * sampled, -0.7)
    times.set_xlabel(f"mean completion time over samples ({unit})" if sampled else f"completion time ({unit})")
    times.grid(axis="x", linestyle=":", linewidth=0.6)
    times.set_axisbelow(True)
    times.tick_params(axis="y", length=0, labelsize=9)
    has_default = bool(summary["default_time"].notna().any())
    times.legend(handles=[
        Line2D([], [], color=BEST, marker="o", linestyle="", label="best policy")]
        + ([Line2D([], [], color=DEFAULT, marker="D", linestyle="", label="default policy (F0.5 G0.3 S0.2)")]
           if has_default else []) + [
        Line2D([], [], color=WORST, marker="X", linestyle="", label="worst policy"),
        Line2D([], [], color=IDEAL, marker="|", linestyle="", markersize=12, markeredgewidth=2,
               label="ideal (free communication, no jitter)")]
        + ([Line2D([], [], color=BOUND, marker=">", linestyle="",
                          label="lower bound (no order of its tasks can beat it)")]
           if bounded else [])
        + ([Line2D([], [], color=BEST, linewidth=5, alpha=0.5,
                   label=f"best policy over {int(summary['samples'].max())} samples: p50-p95, whiskers min-max")]
           if sampled else []),
        loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3 if sampled else 4, fontsize=8, frameon=False)

    if workload:
        _memory_in_gb(memory, summary)
    else:
        peaks = summary["peak_activations"].to_numpy(dtype=float)
        memory.barh(y, peaks, color="#9E9AC8", height=0.55)
        for i, peak in enumerate(peaks):
            if not math.isnan(peak):
                memory.text(peak, i, f" {peak:g}", va="center", ha="left", fontsize=8)
        memory.set_xlim(0, np.nanmax(peaks) * 1.25 if np.isfinite(peaks).any() else 1)
        memory.set_xlabel("peak activations\n(micro-batches, busiest GPU)")
    memory.tick_params(axis="y", left=False, labelleft=False)
    memory.grid(axis="x", linestyle=":", linewidth=0.6)
    memory.set_axisbelow(True)

    best = summary.loc[winner]
    if workload and not bool(summary["memory_fits"].astype(str).eq("True").all()):
        title += "\nred: does not fit in the GPU's memory"
    fig.suptitle(fitted(f"{title}\nfastest: {best['schedule']} with {best['best_policy']} = "
                        f"{best['best_time']:.5g}{' s' if workload else ''}", fig, 10), fontsize=10,
                 y=1 - 0.12 / height, va="top")
    return {"times": times, "memory": memory}


def _memory_in_gb(ax, summary: pd.DataFrame) -> None:
    """Peak memory of the fullest GPU per schedule, red where it exceeds the GPU's memory (dashed line)."""
    peaks = summary["peak_memory_gb"].to_numpy(dtype=float)
    fits = summary["memory_fits"].astype(str).eq("True").to_numpy()
    capacity = float(summary["gpu_memory_gb"].iloc[0])
    ax.barh(np.arange(len(peaks)), peaks, color=np.where(fits, "#9E9AC8", WORST), height=0.55)
    right = max(np.nanmax(peaks), capacity) * 1.5
    for i, (peak, activations) in enumerate(zip(peaks, summary["peak_activations"])):
        text = f"{peak:.1f} GB\n{activations:.3g} micro-batches"
        if peak > right * 0.6:  # a long bar holds its label: beside it, the label would run off the axes
            ax.text(peak - right * 0.01, i, text, va="center", ha="right", fontsize=7.5, linespacing=1.1,
                    color="#222222" if fits[i] else "white")
        else:
            ax.text(peak + right * 0.01, i, text, va="center", ha="left", fontsize=7.5, linespacing=1.1,
                    color="#222222" if fits[i] else WORST)
    ax.axvline(capacity, color=WORST, linestyle="--", linewidth=1)
    ax.set_xlim(0, right)
    ax.set_xlabel(f"peak memory, fullest GPU (GB)\n(dashed: the GPU's {capacity:g} GB)")
