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


def plot_plan(ax, memory_gb: Sequence[float], seconds: Sequence[float], fits: Sequence[bool], gpu_memory_gb: float,
              best: int, best_label: str, title: str) -> None:
    """Every layout as a point (grey crosses: those that do not fit), the Pareto front of those that fit as a step
    line, the GPU's memory as a dashed line and the best layout named."""
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
    ax.scatter([memory_gb[best]], [seconds[best]], s=120, facecolors="none", edgecolors="tab:green", linewidths=2,
               zorder=5, label="best")
    ax.annotate(best_label, (memory_gb[best], seconds[best]), xytext=(12, 18), textcoords="offset points",
                fontsize=8, color="tab:green", arrowprops={"arrowstyle": "-", "color": "tab:green"},
                bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "tab:green", "alpha": 0.9})
    ax.set_xlabel("peak memory per GPU (GB)")
    ax.set_ylabel("iteration time (s)")
    ax.set_title(title, fontsize=9, loc="left")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="best")
