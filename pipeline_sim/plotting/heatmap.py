"""One figure per environment: every policy's completion time on one colour scale.

Left, the shared-priority simplex (x: fwd_prop share, y: grad_prop share, the rest
grad_sync); right, the policies with one, two and three exclusive kinds. The best
policy is outlined and named. Reads the sweep's rows only; never simulates.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path as FilePath
from typing import IO

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Patch, Rectangle
from matplotlib.path import Path
from matplotlib.textpath import TextPath, text_to_path
from matplotlib.ticker import AutoLocator, FuncFormatter

from ..model import COMM_KINDS
from ..results import METRICS, PRIO_COLUMNS, TIER_COLUMNS, best_rows, policy_family
from . import fitted
from .png import write_png

CMAP = "RdYlGn_r"  # green = fast
DPI = 110
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


#: The simplex's largest side, in inches: finer sweeps get smaller cells, not a larger figure (step 0.01 would
#: otherwise draw a figure of 9,500 x 4,800 pixels).
MAX_SIDE = 10.0
#: Cells whose numbers would be set smaller than this (points) show their colour alone.
MIN_NUMBER_POINTS = 5.0


def figure_size(k: int) -> tuple[float, float]:
    """Inches for a sweep of ``k`` steps per unit: cells large enough to read their numbers, up to ``MAX_SIDE``."""
    side = min(MAX_SIDE, max(6.0, 0.42 * (k + 1)))
    return 2 * side + 1.8, side + 1.6


def tick_step(k: int) -> int:
    """Every how many cells a share is labelled: all up to 10 steps per unit, then about ten labels."""
    return 1 if k <= 10 else 2 if k <= 20 else -(-k // 10)


_TITLES = {"simplex": "shared priorities (rest: grad_sync share)",
           "one": "one exclusive kind (tier a), the other two shared",
           "two": "two exclusive kinds (X, Y as listed), the third shared",
           "three": "three exclusive kinds (weak orders)"}


def _rectangles(k: int) -> dict[str, tuple[float, float, float, float]]:
    """Each panel's and the colour bar's place, in inches from the figure's lower left: (x, y, width, height).

    Fixed, so that a figure is laid out once and redrawn for every environment: the
    simplex square on the left; on the right one-, two- and three-exclusive panels in
    heights 3 : 3 : 1.6, each with room for its ticks and title; the colour bar last.
    """
    width, height = figure_size(k)
    side = height - 1.6 - 0.4
    left, bottom = 0.65, 0.7
    right_x = left + side + 1.35
    right_w = width - 1.25 - right_x
    low = 1.15  # the weak orders' rotated labels below the lowest panel
    gaps = 0.5 + 0.8  # between the panels: tick labels, an axis label, a title
    unit = (bottom + side - low - gaps) / 7.6
    three = (right_x, low, right_w, 1.6 * unit)
    two = (right_x, low + 1.6 * unit + 0.5, right_w, 3 * unit)
    one = (right_x, low + 4.6 * unit + gaps, right_w, 3 * unit)
    return {"simplex": (left, bottom, side, side), "one": one, "two": two, "three": three,
            "colorbar": (width - 0.95, bottom, 0.18, side)}


def _text_colour(rgba: np.ndarray) -> np.ndarray:
    """Black on light cells, white on dark ones (relative luminance, as seaborn's annotated heatmaps)."""
    rgb = np.where(rgba[:, :3] <= 0.03928, rgba[:, :3] / 12.92, ((rgba[:, :3] + 0.055) / 1.055) ** 2.4)
    luminance = rgb @ np.array([0.2126, 0.7152, 0.0722])
    return np.where(luminance[:, None] > 0.408, [[0.15, 0.15, 0.15, 1.0]], [[1.0, 1.0, 1.0, 1.0]])


@lru_cache(maxsize=64)
def _glyph(char: str, bold: bool) -> tuple[np.ndarray, np.ndarray, float]:
    """One character's outline at size 1 (vertices, path codes) and its advance."""
    prop = FontProperties(weight="bold" if bold else "normal")
    outline = TextPath((0, 0), char, size=1, prop=prop)
    advance = text_to_path.get_text_width_height_descent(char, prop, ismath=False)[0] / prop.get_size_in_points()
    return outline.vertices, outline.codes, advance


def _number_path(text: str, bold: bool, x: float, y: float, scale_x: float, scale_y: float) -> Path:
    """``text`` centred on (x, y) in data units, as one filled outline: a cell's number.

    Numbers are drawn as paths of cached glyph outlines rather than as text artists:
    laying out and rendering a few hundred texts per figure would cost most of its time.
    """
    glyphs = [_glyph(char, bold) for char in text]
    width = sum(advance for _, _, advance in glyphs)
    if width * scale_x > 0.96:  # wider than its cell (0.8461 in a narrow one): made smaller, never over its borders
        fit = 0.96 / (width * scale_x)
        scale_x, scale_y = scale_x * fit, scale_y * fit
    left, vertices, codes = -width / 2, [], []
    for outline, kinds, advance in glyphs:
        if len(outline):
            vertices.append(outline + (left, -0.36))  # digits are about 0.73 high: centred on the cell
            codes.append(kinds)
        left += advance
    points = np.concatenate(vertices) * (scale_x, -scale_y) + (x, y)  # rows grow downwards
    return Path(points, np.concatenate(codes))


class HeatmapFigure:
    """The heatmap figure of sweeps with ``k`` steps per unit, laid out once and redrawn per environment.

    ``draw`` replaces the cell values, colours, numbers, outlines and titles; nothing
    is laid out again, so a worker draws environment after environment on one figure.
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.fig = fig = Figure(figsize=figure_size(k), dpi=DPI)
        width, height = figure_size(k)
        shapes = {"simplex": (k + 1, k + 1), "one": (3, k + 1), "two": (3, 3), "three": (1, 13)}
        self.norm = Normalize(0.0, 1.0)
        self.cmap = colormaps[CMAP]
        side = height - 2.0
        font = min(72 * side / (k + 1) * 0.27, 9.0)  # the simplex's and the one-exclusive panel's numbers
        self.numbered = font >= MIN_NUMBER_POINTS
        self.axes, self.meshes, self.texts, self.scales = {}, {}, {}, {}
        for name, (rows, cols) in shapes.items():
            x, y, w, h = _rectangles(k)[name]
            ax = fig.add_axes((x / width, y / height, w / width, h / height))
            mesh = ax.pcolormesh(np.ma.masked_all((rows, cols)), cmap=self.cmap, norm=self.norm, edgecolors="white",
                                 linewidth=0.4)
            ax.set_xlim(0, cols)
            ax.set_ylim(rows, 0)  # row 0 on top, as a table reads
            for spine in ax.spines.values():
                spine.set_visible(False)
            ax.tick_params(labelsize=7, length=0)
            fine = name in ("simplex", "one") and not self.numbered
            ax.set_title(_TITLES[name] + (" - colour only, cells too small for numbers" if fine else ""), fontsize=9)
            size = {"simplex": font, "one": font, "two": 9.0, "three": 8.0}[name]
            # data units per point of type, across and down
            self.scales[name] = (size / 72 * cols / w, size / 72 * rows / h)
            self.texts[name] = ax.add_collection(PathCollection([], linewidths=0, antialiased=True))
            self.axes[name], self.meshes[name] = ax, mesh
        shares = [f"{i / k:g}" for i in range(k + 1)]
        step = tick_step(k)
        simplex = self.axes["simplex"]
        simplex.set_xticks(np.arange(0, k + 1, step) + 0.5, shares[::step])
        simplex.set_yticks(np.arange(0, k + 1, step) + 0.5, shares[::-1][::step])
        simplex.set_xlabel("fwd_prop share")
        simplex.set_ylabel("grad_prop share")
        one = self.axes["one"]
        one.set_xticks(np.arange(0, k + 1, step) + 0.5, shares[::step])
        one.set_xlabel("share of the first shared kind (F before G before S)", fontsize=8)
        two = self.axes["two"]
        two.set_xticks(np.arange(3) + 0.5, ["X>Y", "Y>X", "X=Y"])
        two.set_yticks(np.arange(3) + 0.5, [f"{_SHORT[COMM_KINDS[a]]},{_SHORT[COMM_KINDS[b]]} excl."
                                            for a, b in _PAIRS])
        one.set_yticks(np.arange(3) + 0.5,
                       [f"{_SHORT[COMM_KINDS[alone]]} excl.\n(x: {_SHORT[COMM_KINDS[_first_shared(alone)]]} share)"
                        for alone in range(3)])
        self.axes["three"].set_yticks([])
        x, y, w, h = _rectangles(k)["colorbar"]
        self.colorbar = fig.colorbar(self.meshes["simplex"], cax=fig.add_axes((x / width, y / height, w / width,
                                                                                 h / height)))
        self.outlines: list[Patch] = []
        self.title = fig.suptitle("", fontsize=10)
        self.canvas = FigureCanvasAgg(fig)
        self.background = None  # the pixels of everything that no environment changes, once rendered

    def draw(self, rows: pd.DataFrame, *, title: str, metric: str = "completion_time",
             unit: str = "model units") -> None:
        """Show every policy of one environment's ``rows`` (lower ``metric`` is better).

        Colours share one scale; the best policy's cell is outlined, its number set in
        bold, and its label given in the title, with the worst and the gap between them.
        """
        panels = _panels(rows, self.k, metric)
        times = rows[metric].to_numpy(dtype=float)
        low, high = float(times.min()), float(times.max())
        # the norm all panels share, at least a thousandth of the times wide: equal times, or times that differ by
        # less, are (nearly) one colour instead of the scale's two ends
        least = abs(low) * 1e-3 or 1.0
        self.meshes["simplex"].set_clim(low, max(high, low + least))
        # times of a tiny model (or a huge one) in a unit of their own power of ten, the colour bar's label saying
        # it: 3.728 in 1e-4 s, not 0.0003728, so that numbers fit their cells
        top = max(abs(low), abs(high))
        # (within the powers a float holds: a time below 1e-300 is drawn in 1e-300 of the unit, as 0)
        power = max(-300, min(300, math.floor(math.log10(top)))) if top and not 1e-3 <= top < 1e5 else 0
        scale = 10.0 ** -power
        winners = best_rows(rows, metric=metric)
        tied = len(winners) == len(rows)  # then no cell is outlined: none is better than another
        best = set() if tied else set(rows.index.get_indexer(winners.index))
        for outline in self.outlines:
            outline.remove()
        self.outlines = []
        for name, (matrix, cells, xlabels, _) in panels.items():
            ax, texts = self.axes[name], self.texts[name]
            if name == "three":
                matrix = np.pad(matrix, ((0, 0), (0, 13 - matrix.shape[1])), constant_values=np.nan)
                if [label.get_text() for label in ax.get_xticklabels()] != xlabels:
                    ax.set_xticks(np.arange(len(xlabels)) + 0.5, xlabels, rotation=45, ha="right",
                                  rotation_mode="anchor")
                    self.background = None
            masked = np.ma.masked_invalid(matrix)
            self.meshes[name].set_array(masked)
            colours = _text_colour(self.cmap(self.norm(masked.filled(low)).ravel()))
            bold = {cell for cell, position in cells.items() if position in best}
            paths, faces = [], []
            if self.numbered or name in ("two", "three"):
                for (r, c), value in np.ndenumerate(matrix):
                    if not np.isnan(value):
                        paths.append(_number_path(f"{value * scale:.4g}", (r, c) in bold, c + 0.5, r + 0.5,
                                                  *self.scales[name]))
                        faces.append(colours[r * matrix.shape[1] + c])
            texts.set_paths(paths)
            texts.set_facecolor(faces)
            for r, c in bold:
                self.outlines.append(ax.add_patch(Rectangle((c, r), 1, 1, fill=False, edgecolor=BEST_EDGE,
                                                            linewidth=2.5, clip_on=False)))
        samples = int(winners.iloc[0].get("samples", 1))
        name = METRICS.get(metric, metric)
        if metric == "completion_time" and samples > 1:  # a sampled sweep's completion time is the samples' mean
            name = f"mean {name}"
        scaled = f"1e{power} {unit}" if power else unit
        self.colorbar.set_label(f"{name} (x 1e{power})" if metric == "slowdown" and power else
                                name if metric == "slowdown" else f"{name} ({scaled})")
        # digits enough to tell the ticks of a narrow scale apart (252.35 beside 252.3), at least 4
        digits = max(4, math.floor(math.log10(top or 1.0)) - math.floor(math.log10(max(high - low, least) / 5)) + 1)
        self.colorbar.formatter = FuncFormatter(lambda value, _: f"{value * scale:.{digits}g}")
        self.colorbar.set_ticks(AutoLocator() if high > low else [low])  # one value: one tick
        worst = rows.loc[rows[metric].idxmax()]
        first = winners.iloc[0]
        gain = 100 * (1 - first[metric] / worst[metric]) if worst[metric] else 0.0
        ties = f" (and {len(winners) - 1} tied)" if len(winners) > 1 else ""
        over = f" over {samples} samples" if samples > 1 else ""
        # the same time under every policy is a finding; the same spread (none, without noise) says nothing of it
        moot = ": the priorities change nothing here" if metric != "completion_std" else ""
        told = (f"every policy ties at {first[metric]:.6g}{moot}" if tied else
                f"best: {first['policy']} = {first[metric]:.6g}{ties};  worst: {worst['policy']} = "
                f"{worst[metric]:.6g} - the best is {gain:.1f}% lower")
        self.title.set_text(fitted(f"{title}\n{name}{over} - {told}", self.fig, 10))


    def _changing(self) -> list:
        """The artists that ``draw`` changes; the rest of the figure is rendered once."""
        return [*self.meshes.values(), *self.texts.values(), *self.outlines, self.colorbar.ax, self.title]

    def render_background(self) -> None:
        """Render, once, every pixel that no environment changes: axes, ticks, titles, labels."""
        changing = self._changing()
        for artist in changing:
            artist.set_visible(False)
        self.canvas.draw()
        self.background = self.canvas.copy_from_bbox(self.fig.bbox)
        for artist in changing:
            artist.set_visible(True)

    def save(self, target: str | FilePath | IO[bytes]) -> None:
        """Write the figure as a PNG at ``DPI``: the background once, then what changed since the last environment."""
        if self.background is None:
            self.render_background()
        self.canvas.restore_region(self.background)
        for artist in self._changing():
            self.fig.draw_artist(artist)
        write_png(np.asarray(self.canvas.buffer_rgba()), target, DPI)


@lru_cache(maxsize=4)
def heatmap_figure(k: int) -> HeatmapFigure:
    """This process's figure for sweeps of ``k`` steps per unit, made on first use."""
    return HeatmapFigure(k)
