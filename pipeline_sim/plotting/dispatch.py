"""Every way of running one environment against its noise: static orders, compiled rules and learned policies, each
at its best policy, relative to the best static order; the lower bound beneath them.

Reads the summary that ``results.dispatch_families`` made from a sweep's rows; never simulates.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from ..model import HINDSIGHT, PARAMETER
from . import fitted

#: One colour per dispatcher, the static order first; a schedule other than the reference's is drawn faded.
PALETTE = ("#333333", "#1B9E77", "#D95F02", "#7570B3", "#E7298A", "#66A61E", "#E6AB02", "#A6761D", "#1F78B4")
LABELS = {"jitter": "compute and communication jitter (coefficient of variation)",
          "compute_jitter": "compute jitter (coefficient of variation)",
          "comm_jitter": "communication jitter (coefficient of variation)"}


def figure_size() -> tuple[float, float]:
    return 11.5, 6.2


def plot_dispatch(fig: Figure, family: pd.DataFrame, key: str, *, title: str) -> dict:
    """Mean (solid, circles) and p95 (dashed, triangles) of each way's best policy against the jitter, relative to
    the reference; one colour per dispatcher, the reference's schedule bold and the others faded; the reference's
    lower bound dotted, and its memory-aware bound dash-dotted where a dispatch sweep gives one above it; with
    hindsight among the ways, each other way's share of the reference's headroom to it in the legend. The title
    names the two fastest ways at the highest level and how far above the higher bound the fastest stays."""
    ax = fig.add_axes((0.1, 0.11, 0.58, 0.72))  # room at the left for a tick as long as "-0.080%"
    reference = family["reference"].iloc[0]
    home = family.loc[family["way"] == reference, "schedule"].iloc[0]
    dispatchers = list(dict.fromkeys(["static", *family["dispatch"]]))
    colour = dict(zip(dispatchers, PALETTE * 4))
    order = family.drop_duplicates("way").sort_values(["schedule", "dispatch"], key=lambda column: column.map(
        lambda value: (value != home, value) if column.name == "schedule" else (dispatchers.index(value), value)))
    ways = [way for _, way in order.iterrows()]
    shares, level = _shares(family, reference)
    for i, way in enumerate(ways):
        rows = family[family["way"] == way["way"]]
        bold = way["schedule"] == home
        style = {"color": colour[way["dispatch"]], "alpha": 1.0 if bold else 0.45}
        note = _hidden_note(family, way, ways[i + 1:])
        ax.plot(rows["level"], rows["mean_vs"], marker="o", linewidth=2.4 if bold else 1.4, markersize=6,
                label=way["way"] + (" (reference)" if way["way"] == reference else "") + note
                + shares.get(way["way"], ""), **style)
        ax.plot(rows["level"], rows["p95_vs"], marker="^", linewidth=1.2 if bold else 0.8, markersize=4,
                linestyle="--", **style)
    bound = family[family["way"] == reference]
    ax.plot(bound["level"], bound["bound_vs"], color="black", linestyle=":", marker="_", markersize=12, linewidth=1.5,
            label=f"lower bound of {home} (no order beats it)")
    held = "memory_bound_vs" in bound and bound["memory_bound_vs"].notna().all() and \
        (bound["memory_bound_vs"] > bound["bound_vs"]).any()
    if held:
        ax.plot(bound["level"], bound["memory_bound_vs"], color="black", linestyle="-.", marker="_", markersize=12,
                linewidth=1.2, label=f"memory-aware bound of {home} (within its limit)")
    ax.plot([], [], color="#777777", marker="o", label="mean over samples")
    ax.plot([], [], color="#777777", marker="^", linestyle="--", label="p95 over samples")
    ax.axhline(0.0, color="#999999", linewidth=0.8)
    levels = sorted(family["level"].unique())
    ax.set_xticks(levels, [f"{level:.0%}" for level in levels])
    ax.set_xlabel(LABELS.get(key, key))
    ax.set_ylabel(f"time against {reference}, best policy of each (lower is better)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(linestyle=":", linewidth=0.6)
    # long handles: the bounds' dotted and dash-dotted lines show past their markers
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False, handlelength=4.5,
              title="schedule and dispatch" + (f"; its share of the headroom\nto hindsight at {level:.0%} (mean / p95)"
                                               if shares else ""), title_fontsize=8)
    top = family[family["level"] == levels[-1]].nsmallest(2, "mean_vs")
    first = top.iloc[0]
    floor = max(first["bound"], first["memory_bound"]) if held else first["bound"]
    gap = first["mean"] / floor - 1.0 if floor > 0 else math.nan
    lines = [f"{row['way']} ({row['mean_vs']:+.1%} mean, {row['p95_vs']:+.1%} p95)" for _, row in top.iterrows()]
    fig.suptitle(fitted(f"{title}\nat {levels[-1]:.0%} jitter, against {reference}: fastest {lines[0]}\n"
                        + (f"then {lines[1]}; " if len(lines) > 1 else "")
                        + f"the fastest is still {gap:.1%} above its "
                        + ("memory-aware bound" if held else "lower bound"), fig, 9.5), fontsize=9.5)
    return {"dispatch": ax}


def _shares(family: pd.DataFrame, reference: str) -> tuple[dict[str, str], float]:
    """Where the reference's schedule has a hindsight way: for each other way, the share of the reference's headroom
    to hindsight it captures at the highest level where hindsight is faster, of the mean and of the p95:
    ``(reference - way) / (reference - hindsight)`` (a statistic without headroom reads n/a); and that level."""
    home = family.loc[family["way"] == reference, "schedule"].iloc[0]
    best = family[(family["schedule"] == home) & (family["dispatch"] == HINDSIGHT)]
    room = best[(best["mean_vs"] < 0) | (best["p95_vs"] < 0)]
    if room.empty:
        return {}, math.nan
    level = room["level"].max()
    target = room[room["level"] == level].iloc[0]
    at = family[family["level"] == level].set_index("way")
    shares = {}
    for way, row in at.iterrows():
        if way in (reference, target["way"]):
            continue
        parts = [f"{row[column] / target[column]:.0%}" if target[column] < 0 else "n/a"
                 for column in ("mean_vs", "p95_vs")]
        shares[str(way)] = f"\n  captures {' / '.join(parts)} of the headroom"
    return shares, level


def _hidden_note(family: pd.DataFrame, way: pd.Series, later: list[pd.Series]) -> str:
    """`` (same as greedy)`` when a way drawn after ``way`` has its very times, `` (drawn under greedy)`` when its
    lines come within 1% of the axis everywhere (the later line covers it), else nothing."""
    def series(name: str) -> np.ndarray:
        return family.loc[family["way"] == name].sort_values("level")[["mean_vs", "p95_vs"]].to_numpy(dtype=float)

    span = float(np.nanmax(family[["mean_vs", "p95_vs", "bound_vs"]].to_numpy(dtype=float))
                 - np.nanmin(family[["mean_vs", "p95_vs", "bound_vs"]].to_numpy(dtype=float))) or 1.0
    mine = series(way["way"])
    for other in later:
        theirs = series(other["way"])
        if theirs.shape != mine.shape:
            continue
        name = PARAMETER["dispatch"].text(other["dispatch"]) \
            if other["schedule"] == way["schedule"] and other["dispatch"] != "static" else other["way"]
        if np.array_equal(theirs, mine):
            return f" (same as {name})"
        if np.nanmax(np.abs(theirs - mine)) < 0.01 * span:
            return f" (drawn under {name})"
    return ""
