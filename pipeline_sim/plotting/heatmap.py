"""One figure per environment: every policy's completion time on one colour scale.

Left, the shared-priority simplex (x: fwd_prop share, y: grad_prop share, the rest
grad_sync); right, the policies with one, two and three exclusive kinds. The best
policy is outlined and named. Reads the sweep's rows only; never simulates.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..model import COMM_KINDS
from ..results import METRICS, PRIO_COLUMNS, TIER_COLUMNS, best_rows, policy_family

CMAP = "RdYlGn_r"  # green = fast
BEST_EDGE = "black"
_SHORT = {"fwd_prop": "F", "grad_prop": "G", "grad_sync": "S"}
_PAIRS = ((0, 1), (0, 2), (1, 2))
_PAIR_ORDERS = (("a", "b"), ("b", "a"), ("a", "a"))


def _grid(shape: tuple[int, int]) -> np.ndarray:
    return np.full(shape, np.nan)


def _first_shared(alone: int) -> int:
    """With kind ``alone`` exclusive, the shared kind whose share is the one-exclusive panel's x axis."""
    return 1 if alone == 0 else 0


def _panels(rows: pd.DataFrame, k: int, metric: str) -> dict[str, tuple[np.ndarray, dict, list[str], list[str]]]:
    """Each panel's matrix, the CSV row behind each cell, and its tick labels."""
    family = policy_family(rows)
    times = rows[metric].to_numpy(dtype=float)
    prios = rows[list(PRIO_COLUMNS)].to_numpy(dtype=float)
    tiers = rows[list(TIER_COLUMNS)].to_numpy(dtype=object)
    simplex, single, double = _grid((k + 1, k + 1)), _grid((3, k + 1)), _grid((3, 3))
    cells: dict[str, dict[tuple[int, int], int]] = {"simplex": {}, "one": {}, "two": {}, "three": {}}
    triple_labels: list[str] = []
    triple_times: list[float] = []
    for position, (fam, time, prio, tier) in enumerate(zip(family, times, prios, tiers)):
        tiered = [i for i in range(3) if isinstance(tier[i], str)]
        if fam == 0:
            i, j = round(prio[0] * k), round(prio[1] * k)
            simplex[k - j, i] = time  # grad_prop share grows upwards
            cells["simplex"][k - j, i] = position
        elif fam == 1:
            alone = tiered[0]
            col = round(prio[_first_shared(alone)] * k)
            single[alone, col] = time
            cells["one"][alone, col] = position
        elif fam == 2:
            pair = _PAIRS.index(tuple(tiered))
            order = _PAIR_ORDERS.index((tier[tiered[0]], tier[tiered[1]]))
            double[pair, order] = time
            cells["two"][pair, order] = position
        else:
            cells["three"][0, len(triple_times)] = position
            triple_times.append(time)
            triple_labels.append(rows["policy"].iloc[position])
    shares = [f"{i / k:g}" for i in range(k + 1)]
    one_rows = [f"{_SHORT[COMM_KINDS[alone]]} excl.\n(x: {_SHORT[COMM_KINDS[_first_shared(alone)]]} share)"
                for alone in range(3)]
    two_rows = [f"{_SHORT[COMM_KINDS[a]]},{_SHORT[COMM_KINDS[b]]} excl." for a, b in _PAIRS]
    return {
        "simplex": (simplex, cells["simplex"], shares, shares[::-1]),
        "one": (single, cells["one"], shares, one_rows),
        "two": (double, cells["two"], ["X>Y", "Y>X", "X=Y"], two_rows),
        "three": (np.array([triple_times]) if triple_times else _grid((1, 1)), cells["three"], triple_labels, [""]),
    }


def figure_size(k: int) -> tuple[float, float]:
    """Inches for a sweep of ``k`` steps per unit: cells stay large enough to read their numbers."""
    side = max(6.0, 0.42 * (k + 1))
    return 2 * side + 1.8, side + 1.6


def plot_policy_heatmaps(fig: Figure, rows: pd.DataFrame, k: int, *, title: str,
                         metric: str = "completion_time", unit: str = "model units") -> dict:
    """Draw every policy of one environment's ``rows`` (a sweep with ``k`` steps per unit) on ``fig``.

    Cells show ``metric`` (a column of the rows, lower is better). Returns the axes by
    panel name. Colours share one scale; the best policy's cell is outlined, its number
    set in bold, and its label given in the title.
    """
    panels = _panels(rows, k, metric)
    times = rows[metric].to_numpy(dtype=float)
    norm = Normalize(vmin=float(times.min()), vmax=float(times.max()) if times.max() > times.min() else times.min() + 1)
    winners = best_rows(rows, metric=metric)
    best_positions = set(rows.index.get_indexer(winners.index))

    side = figure_size(k)[1] - 1.6
    cell_points = 72 * side / (k + 1)
    font = float(np.clip(cell_points * 0.27, 3.5, 9))
    grid = fig.add_gridspec(3, 2, width_ratios=[1, 1], height_ratios=[3, 3, 1.6])
    axes = {"simplex": fig.add_subplot(grid[:, 0]), "one": fig.add_subplot(grid[0, 1]),
            "two": fig.add_subplot(grid[1, 1]), "three": fig.add_subplot(grid[2, 1])}
    titles = {"simplex": "shared priorities (rest: grad_sync share)", "one": "one exclusive kind (tier a), "
              "the other two shared", "two": "two exclusive kinds (X, Y as listed), the third shared",
              "three": "three exclusive kinds (weak orders)"}
    for name, ax in axes.items():
        matrix, cells, xlabels, ylabels = panels[name]
        size = font if name in ("simplex", "one") else min(9.0, font + 1.5)
        sns.heatmap(matrix, ax=ax, cmap=CMAP, norm=norm, cbar=False, annot=True, fmt=".4g",
                    annot_kws={"size": size}, mask=np.isnan(matrix), linewidths=0.4, linecolor="white",
                    xticklabels=xlabels, yticklabels=ylabels, square=(name == "simplex"))
        ax.set_title(titles[name], fontsize=9)
        ax.tick_params(labelsize=7, length=0)
        if name == "simplex":
            step = 1 if k <= 10 else 2
            ax.set_xticks(np.arange(0, k + 1, step) + 0.5, xlabels[::step], rotation=0)
            ax.set_yticks(np.arange(0, k + 1, step) + 0.5, ylabels[::step], rotation=0)
            ax.set_xlabel("fwd_prop share")
            ax.set_ylabel("grad_prop share")
        elif name == "one":
            ax.set_xlabel("share of the first shared kind (F before G before S)", fontsize=8)
            ax.tick_params(axis="y", rotation=0)
        elif name == "three":
            ax.tick_params(axis="x", rotation=45)
            ax.set_yticks([])
        else:
            ax.tick_params(axis="y", rotation=0)
        for (row, col), position in cells.items():
            if position in best_positions:
                ax.add_patch(Rectangle((col, row), 1, 1, fill=False, edgecolor=BEST_EDGE, linewidth=2.5,
                                       clip_on=False))
                for text in ax.texts:
                    x, y = text.get_position()
                    if int(x) == col and int(y) == row:
                        text.set_fontweight("bold")
    mappable = axes["simplex"].collections[0]
    name = METRICS.get(metric, metric)
    fig.colorbar(mappable, ax=list(axes.values()), shrink=0.8,
                 label=name if metric == "slowdown" else f"{name} ({unit})")

    worst = rows.loc[rows[metric].idxmax()]
    first = winners.iloc[0]
    gain = 100 * (1 - first[metric] / worst[metric]) if worst[metric] else 0.0
    ties = f" (and {len(winners) - 1} tied)" if len(winners) > 1 else ""
    samples = int(first.get("samples", 1))
    over = f" over {samples} samples" if samples > 1 else ""
    fig.suptitle(f"{title}\n{name}{over} - best: {first['policy']} = {first[metric]:.6g}{ties};  "
                 f"worst: {worst['policy']} = {worst[metric]:.6g} - the best is {gain:.1f}% lower",
                 fontsize=10)
    return axes
