"""A learned dispatcher's training curve: what it saves of static ZB-H1's time as it trains."""

from __future__ import annotations

from typing import Sequence

from matplotlib.ticker import PercentFormatter


def plot_training(ax, steps: Sequence[int], training: Sequence[float], validation: Sequence[float],
                  rule: float, title: str, reference: str = "static zb-h1") -> None:
    """The played network on the validation draws (the line that picks the file's network), the training
    episodes' mean return, the compiled greedy rule on the same validation draws, and the ``reference`` (static
    ZB-H1) at 0."""
    ax.axhline(0.0, color="0.3", linewidth=1, label=reference)
    ax.axhline(rule, color="tab:green", linestyle="--", linewidth=1.5, label=f"greedy rule ({rule:+.2%})")
    ax.plot(steps, training, color="tab:gray", linewidth=1, marker=".", alpha=0.8,
            label="training episodes (sampled actions, last 200)")
    ax.plot(steps, validation, color="tab:blue", linewidth=2, marker="o", markersize=4,
            label="learned, validation draws (played as a sweep plays it)")
    best = max(range(len(validation)), key=validation.__getitem__)
    ax.scatter([steps[best]], [validation[best]], s=140, facecolors="none", edgecolors="tab:blue", linewidths=2,
               zorder=5, label=f"kept: decision {steps[best]:,} ({validation[best]:+.2%})")
    low = min(min((v for v in training if v == v), default=0.0), min(validation), rule, 0.0)
    floor = max(low, -0.5) - 0.01
    ax.set_ylim(floor, max(max(validation), rule, 0.0) + 0.02)
    below = [(step, value) for step, value in zip(steps, validation) if value < floor]
    if below:  # a network that stalls is off any useful scale: marked on the floor with its value
        ax.scatter([step for step, _ in below], [floor] * len(below), marker="v", s=50, color="tab:blue",
                   clip_on=False, zorder=6, label=f"off scale (down to {min(v for _, v in below):+.0%})")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("training decisions")
    ax.set_ylabel(f"time saved against {reference} (higher is better)")
    ax.set_title(title, fontsize=9, loc="left")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
