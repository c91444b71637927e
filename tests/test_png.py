"""The project's PNG writer: every pixel read back as written, the resolution kept, and a figure saved through it
the same pixels as matplotlib's own PNG."""

from __future__ import annotations

import io

import matplotlib
import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image

from pipeline_sim.plotting.png import ROWS_PER_BLOCK, save_figure, write_png

matplotlib.use("Agg")


@pytest.mark.parametrize("height, width", [(1, 1), (2, 3), (ROWS_PER_BLOCK, 5), (ROWS_PER_BLOCK + 1, 17),
                                           (3 * ROWS_PER_BLOCK + 7, 300)])
def test_every_pixel_is_read_back_as_written(height, width, tmp_path):
    pixels = np.random.default_rng(height * width).integers(0, 256, (height, width, 4), dtype=np.uint8)
    path = tmp_path / "p.png"
    write_png(pixels, path, 130)
    with Image.open(path) as image:
        assert (image.mode, image.size) == ("RGBA", (width, height))
        assert image.info["dpi"] == pytest.approx((130, 130), abs=0.01)
        assert np.array_equal(np.asarray(image), pixels)


def test_a_binary_file_takes_the_same_bytes_as_a_path(tmp_path):
    pixels = np.zeros((40, 30, 4), dtype=np.uint8)
    pixels[10:20, 5:25] = (200, 30, 40, 255)
    buffer = io.BytesIO()
    write_png(pixels, buffer, 110)
    write_png(pixels, tmp_path / "p.png", 110)
    assert buffer.getvalue() == (tmp_path / "p.png").read_bytes()


def test_pixels_in_any_memory_order_are_written_as_they_read(tmp_path):
    pixels = np.random.default_rng(1).integers(0, 256, (300, 40, 4), dtype=np.uint8)
    for view in (pixels[::-1], pixels[:, ::2], pixels[..., ::-1], np.asfortranarray(pixels)):
        write_png(view, tmp_path / "p.png", 110)
        with Image.open(tmp_path / "p.png") as image:
            assert np.array_equal(np.asarray(image), view)


@pytest.mark.parametrize("pixels", [np.zeros((4, 4, 3), dtype=np.uint8), np.zeros((4, 4, 4), dtype=np.float64),
                                    np.zeros((0, 4, 4), dtype=np.uint8), np.zeros((4, 0, 4), dtype=np.uint8),
                                    np.zeros((16,), dtype=np.uint8)])
def test_what_is_not_rgba_bytes_is_refused(pixels, tmp_path):
    with pytest.raises(ValueError, match="RGBA pixels of 8 bits"):
        write_png(pixels, tmp_path / "p.png", 110)


def _figure() -> Figure:
    fig = Figure(figsize=(4, 3), layout="constrained")
    ax = fig.add_subplot()
    ax.plot([0, 1, 2], [2, 0, 1], label="a line")
    ax.barh([0, 1], [3, 1], color=["tab:blue", "tab:orange"])
    ax.set_title("a title")
    ax.legend()
    return fig


def test_a_figure_saved_through_it_has_matplotlibs_own_pixels(tmp_path):
    fig = _figure()
    canvas = fig.canvas
    save_figure(fig, tmp_path / "ours.png", 130)
    assert fig.canvas is canvas  # the figure keeps its canvas
    fig.savefig(tmp_path / "theirs.png", dpi=130, format="png")
    with Image.open(tmp_path / "ours.png") as ours, Image.open(tmp_path / "theirs.png") as theirs:
        assert ours.size == theirs.size == (520, 390)
        assert np.array_equal(np.asarray(ours), np.asarray(theirs))


def test_other_formats_are_matplotlibs(tmp_path):
    save_figure(_figure(), tmp_path / "f.svg", 130, "svg")
    assert (tmp_path / "f.svg").read_text().lstrip().startswith("<?xml")
