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
#: Colours of the named points, in the order they are named (the best that fits first).
NAMED_COLORS = ("tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def plot_plan(ax, memory_gb: Sequence[float], seconds: Sequence[float], fits: Sequence[bool], gpu_memory_gb: float,
              budget_gb: float, named: Sequence[tuple[int, str]], title: str,
              time_label: str = "iteration time (s)") -> None:
    """Every layout as a point (grey crosses: those that do not fit), the Pareto front of those that fit as a step
    line, the GPU's memory (and the budget under a headroom) as dashed lines and the ``named`` points ringed and
    numbered, their labels numbered alike in a band above the points, two a row, so that none covers a point or
    another. Times spanning more than ``LOG_SPAN`` times over are drawn on a log scale."""
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
    corners = ((0.02, 0.98, "left"), (0.98, 0.98, "right"), (0.02, 0.885, "left"), (0.98, 0.885, "right"),
               (0.02, 0.79, "left"), (0.98, 0.79, "right"))
    shown = named[:len(corners)]
    low, high = min(seconds), max(seconds)
    band = 0.15 + 0.16 * ((len(shown) + 1) // 2)  # of the points' span, above them
    if high > LOG_SPAN * low:
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(low / (high / low) ** 0.05, high * (high / low) ** band)
    else:
        ax.set_ylim(low - 0.05 * (high - low or high), high + band * (high - low or high))
    for k, (index, label) in enumerate(shown):
        color = NAMED_COLORS[k % len(NAMED_COLORS)]
        x, y, horizontal = corners[k]
        ax.scatter([memory_gb[index]], [seconds[index]], s=140 + 60 * k, facecolors="none", edgecolors=color,
                   linewidths=2, zorder=5)
        ax.annotate(str(k + 1), (memory_gb[index], seconds[index]), xytext=(7 + 2 * k, 7 + 2 * k),
                    textcoords="offset points", fontsize=10, fontweight="bold", color=color, zorder=6)
        ax.text(x, y, f"{k + 1}  {label}", transform=ax.transAxes, ha=horizontal, va="top", fontsize=8, color=color,
                bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": color, "alpha": 0.92})
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel(time_label)
    ax.set_title(fitted(title, ax.figure, 9), fontsize=9, loc="left")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="best")
