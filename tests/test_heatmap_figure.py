"""The heatmap figure at coarse and fine priority steps: numbers where they can be read, a bounded size."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import run_script
from PIL import Image

from pipeline_sim.plotting.heatmap import DPI, MAX_SIDE, HeatmapFigure
from pipeline_sim.results import environments, load_results


def _rows(tmp_path, step: str) -> pd.DataFrame:
    config = tmp_path / "c.json"
    config.write_text('{"n": 2, "num_gpus": 2}')
    csv = tmp_path / f"s{step}.csv"
    result = run_script("data_generator.py", "-c", str(config), "--step", step, "-o", str(csv), "--workers", "1",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (_, rows), = environments(load_results(csv))
    return rows


def _labels(ax) -> list[str]:
    return [label.get_text() for label in ax.get_xticklabels()]


@pytest.mark.parametrize("step, k, numbered, shares", [
    ("0.1", 10, True, ["0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1"]),
    ("0.05", 20, True, ["0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1"]),
    ("0.01", 100, False, ["0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1"]),
])
def test_numbers_where_readable_and_about_ten_share_labels(tmp_path, step, k, numbered, shares):
    rows = _rows(tmp_path, step)
    figure = HeatmapFigure(k)
    figure.draw(rows, title="t")
    counts = {name: len(texts.get_paths()) for name, texts in figure.texts.items()}
    simplex, one = (k + 1) * (k + 2) // 2, 3 * (k + 1)
    assert counts == {"simplex": simplex if numbered else 0, "one": one if numbered else 0, "two": 9, "three": 13}
    assert figure.axes["simplex"].get_title().endswith("cells too small for numbers") is not numbered
    assert _labels(figure.axes["simplex"]) == shares
    assert _labels(figure.axes["one"]) == shares
    # Every cell is coloured whether or not it shows its number; the best one is outlined.
    assert np.ma.count(figure.meshes["simplex"].get_array()) == simplex
    assert len(figure.outlines) >= 1
    png = tmp_path / "h.png"
    figure.save(png)
    width, height = Image.open(png).size
    assert width <= round((2 * MAX_SIDE + 1.8) * DPI) and height <= round((MAX_SIDE + 1.6) * DPI)
    pixels = np.asarray(Image.open(png).convert("L"), dtype=float)
    assert pixels.std() > 20  # drawn, not blank


def test_the_shipped_step_keeps_its_size():
    width, height = HeatmapFigure(10).fig.get_size_inches()
    assert (width, height) == (13.8, 7.6)


@pytest.mark.parametrize("factor, label", [(1.0, "completion time (model units)"),
                                           (1e-6, "completion time (1e-5 model units)"),
                                           (1e7, "completion time (1e8 model units)")])
def test_tiny_and_huge_times_are_drawn_in_a_power_of_ten_the_colour_bar_names(tmp_path, factor, label):
    """A tiny model's times (1e-5 s) would not fit their cells as 0.00002996: they are drawn as 2.996 under a
    colour bar labelled in 1e-5 of the unit; times between 1e-3 and 1e5 as they are."""
    rows = _rows(tmp_path, "0.5")
    rows = rows.assign(completion_time=rows["completion_time"] * factor)
    figure = HeatmapFigure(2)
    figure.draw(rows, title="t")
    assert figure.colorbar.ax.get_ylabel() == label
    best = rows["completion_time"].min()
    power = 0 if factor == 1.0 else int(np.floor(np.log10(rows["completion_time"].max())))
    assert figure.colorbar.formatter(best, 0) == f"{best / 10.0 ** power:.4g}"
    # one value everywhere: one colour and one tick, at that value
    same = rows.assign(completion_time=best)
    figure.draw(same, title="t")
    assert [float(t) for t in figure.colorbar.get_ticks()] == [best]
    # where every policy ties, no cell is outlined as the best and the title says so, naming no best nor worst
    assert figure.outlines == []
    assert f"every policy ties at {best:.6g}: the priorities change nothing here" in figure.title.get_text()
    assert "worst" not in figure.title.get_text()
    # no spread under any policy (no noise) says nothing of what the priorities change
    spread = same.assign(completion_std=0.0)
    figure.draw(spread, title="t", metric="completion_std")
    told = figure.title.get_text()
    assert "every policy ties at 0" in told and "change nothing" not in told


def test_every_number_stays_within_its_cell(tmp_path):
    """Values below 1 of four significant figures (0.8461) are the widest a cell shows: drawn smaller where they
    would cross its borders, in the narrow cells of the weak orders as in the others."""
    rows = _rows(tmp_path, "0.1")
    rows = rows.assign(completion_time=0.8 + rows["completion_time"] / rows["completion_time"].max() / 10 + 1e-5)
    figure = HeatmapFigure(10)
    figure.draw(rows, title="t")
    for name, texts in figure.texts.items():
        for path in texts.get_paths():
            left, right = path.vertices[:, 0].min(), path.vertices[:, 0].max()
            assert math.floor(left) == math.floor(right - 1e-9), (name, left, right)  # within one cell's column


def test_a_memory_bar_s_label_stays_within_its_axes():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from pipeline_sim.plotting.comparison import _memory_in_gb

    summary = pd.DataFrame({"peak_memory_gb": [2029.8, 2228.4, 60.0], "memory_fits": [False, False, True],
                            "gpu_memory_gb": [80.0] * 3, "peak_activations": [7.9, 8.73, 4.0]})
    fig, ax = plt.subplots(figsize=(3.2, 2.5))
    _memory_in_gb(ax, summary)
    fig.canvas.draw()
    box = ax.get_window_extent()
    for text in ax.texts:
        extent = text.get_window_extent()
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1, text.get_text()
    plt.close(fig)


def test_times_below_any_power_a_float_holds_are_drawn_not_raised(tmp_path):
    rows = _rows(tmp_path, "0.5")
    figure = HeatmapFigure(2)
    figure.draw(rows.assign(completion_time=rows["completion_time"] * 1e-321), title="t")  # subnormal times
    assert figure.colorbar.ax.get_ylabel() == "completion time (1e-300 model units)"


def test_a_comparison_keeps_every_name_and_label_inside_its_figure():
    """The fastest schedule's name is bold, wider than its plain letters: a 37-character one lost its first letters at
    the figure's edge, and a best policy's label too long for either side of its point ran past the axes."""
    import pandas as pd
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.figure import Figure

    from pipeline_sim.plotting.comparison import figure_size, plot_schedule_comparison

    names = ["zb-h1 wf=0.5", "zb-h1 wf=0.5 lookahead", "zb-h1 wf=0.5 lookahead memory limit=4",
             "zb-h1 wf=0.5 lookahead memory limit=6"]
    summary = pd.DataFrame({"schedule": names, "best_time": [44.58, 43.13, 43.13, 39.0],
                            "worst_time": [52.12, 45.46, 45.46, 45.46], "default_time": [float("nan")] * 4,
                            "ideal_time": [27.0] * 4, "lower_bound": [32.0] * 4,
                            "best_policy": ["F | G1 S0 (and 2 tied)", "F=G | S1 (and 1 tied)", "F=G | S1 (and 1 tied)",
                                            "F | G1 S0 (and 2 tied)"], "peak_activations": [4.0, 4.0, 4.0, 6.0]})
    fig = Figure(figsize=figure_size(len(summary)))
    axes = plot_schedule_comparison(fig, summary, title="n=8, GPUs=4")
    renderer = RendererAgg(int(fig.bbox.width), int(fig.bbox.height), fig.dpi)
    times = axes["times"]
    labels = times.get_yticklabels()
    assert labels[3].get_fontweight() == "bold"
    assert min(label.get_window_extent(renderer).x0 for label in labels) >= 0
    inside = times.get_window_extent(renderer)
    notes = [text for text in times.texts if "tied" in text.get_text()]
    assert len(notes) == 4
    for note in notes:
        drawn = note.get_window_extent(renderer)
        assert inside.x0 - 1 <= drawn.x0 and drawn.x1 <= inside.x1 + 1, note.get_text()
