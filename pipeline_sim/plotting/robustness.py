"""Does the winner at zero noise stay the winner? One figure per family of environments that differ by jitter.

Reads the summary that ``results.jitter_families`` made from a sweep's rows; never simulates.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from . import fitted

#: Colours of the policies followed, in the order they are listed.
PALETTE = ("#1B9E77", "#D95F02", "#7570B3", "#E7298A", "#66A61E", "#E6AB02", "#A6761D", "#666666")

JITTER_LABELS = {"jitter": "compute and communication jitter (coefficient of variation of all work)",
                 "compute_jitter": "compute jitter (coefficient of variation of compute work)",
                 "comm_jitter": "communication jitter (coefficient of variation of transfer work)"}


def figure_size() -> tuple[float, float]:
    return 11.0, 6.0


def plot_robustness(fig: Figure, family: pd.DataFrame, key: str, *, title: str, unit: str = "model units") -> dict:
    """Mean (solid) and p95 (dashed) completion time against the jitter level, one colour per policy followed.

    The policies are the few best at the lowest level and the best at each other level;
    the legend says why each is shown. Returns the axes.
    """
    ax = fig.add_axes((0.08, 0.11, 0.6, 0.76))
    for i, (colour, (policy, rows)) in enumerate(zip(PALETTE * 4, family.groupby("policy", sort=False))):
        rows = rows.sort_values("level")
        why = rows["why"].iloc[0]
        # Each curve is drawn thinner than the one before, so that near-equal curves stay visible.
        width, size = max(1.0, 3.4 - 0.6 * i), max(4.0, 9.0 - 1.2 * i)
        ax.plot(rows["level"], rows["mean"], color=colour, marker="o", markersize=size, linewidth=width,
                label=f"{policy}  ({why})" if why else policy)
        ax.plot(rows["level"], rows["p95"], color=colour, marker="^", markersize=size, linewidth=width * 0.7,
                linestyle="--")
    ax.plot([], [], color="#444444", linestyle="-", marker="o", label="mean over samples")
    ax.plot([], [], color="#444444", linestyle="--", marker="^", label="p95 over samples")
    levels = sorted(family["level"].unique())
    ax.set_xticks(levels, [f"{level:.0%}" for level in levels])
    ax.set_xlabel(JITTER_LABELS.get(key, key))
    ax.set_ylabel(f"completion time ({unit})")
    ax.grid(linestyle=":", linewidth=0.6)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False, title="policy (why shown)",
              title_fontsize=8)
    winners = [family[family["level"] == level].nsmallest(1, "mean")["policy"].iloc[0] for level in levels]
    verdict = ("the winner at the lowest level stays the winner at every level" if len(set(winners)) == 1
               else "the winner changes: " + ", ".join(f"{level:.0%}: {w}" for level, w in zip(levels, winners)))
    fig.suptitle(fitted(f"{title}\n{verdict}", fig, 10), fontsize=10)
    return {"robustness": ax}
