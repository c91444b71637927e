"""The planner's figure: iteration time against memory per GPU for every layout simulated."""

from __future__ import annotations

from typing import Sequence


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both memory (first) and time (second), by memory."""
    front, best = [], float("inf")
    for i in sorted(range(len(points)), key=lambda i: points[i]):
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


#: Colours of the named points, in the order they are named (the best that fits first).
NAMED_COLORS = ("tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def plot_plan(ax, memory_gb: Sequence[float], seconds: Sequence[float], fits: Sequence[bool], gpu_memory_gb: float,
              budget_gb: float, named: Sequence[tuple[int, str]], title: str) -> None:
    """Every layout as a point (grey crosses: those that do not fit), the Pareto front of those that fit as a step
    line, the GPU's memory (and the budget under a headroom) as dashed lines and the ``named`` points ringed and
    labelled, each label in a corner of its own so that none covers another."""
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
    ax.axvline(gpu_memory_gb, color="tab:red", linestyle="--", linewidth=1, label=f"GPU memory {gpu_memory_gb:g} GB")
    if budget_gb < gpu_memory_gb:
        ax.axvline(budget_gb, color="tab:red", linestyle=":", linewidth=1, label=f"with headroom {budget_gb:g} GB")
    # the labels go in a band kept free above the points, two a row, so that none covers a point or another
    corners = ((0.98, 0.98, "right", "top"), (0.02, 0.98, "left", "top"), (0.98, 0.885, "right", "top"),
               (0.02, 0.885, "left", "top"), (0.98, 0.79, "right", "top"), (0.02, 0.79, "left", "top"))
    low, high = min(seconds), max(seconds)
    rows = (min(len(named), len(corners)) + 1) // 2
    ax.set_ylim(low - 0.05 * (high - low or high), high + (0.15 + 0.16 * rows) * (high - low or high))
    for k, (index, label) in enumerate(named[:len(corners)]):
        color = NAMED_COLORS[k % len(NAMED_COLORS)]
        x, y, horizontal, vertical = corners[k]
        ax.scatter([memory_gb[index]], [seconds[index]], s=140 + 60 * k, facecolors="none", edgecolors=color,
                   linewidths=2, zorder=5)
        ax.annotate(label, (memory_gb[index], seconds[index]), xytext=(x, y), textcoords="axes fraction",
                    ha=horizontal, va=vertical, fontsize=8, color=color,
                    arrowprops={"arrowstyle": "-", "color": color, "alpha": 0.8},
                    bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": color, "alpha": 0.92})
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel("iteration time (s)")
    ax.set_title(title, fontsize=9, loc="left", wrap=True)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="center right")
