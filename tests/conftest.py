import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def compiled_kernel():
    """The kernel is compiled (or loaded) once, before any test: the scripts run later load it from the cache."""
    from pipeline_sim.engine import compile_kernel

    compile_kernel()


def run_script(script: str, *args: str, cwd: Path, timeout: float = 300,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run one of the top-level scripts as a user would, from ``cwd`` (in ``env``, else this environment)."""
    env = {k: v for k, v in (env or os.environ).items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")}
    return subprocess.run([sys.executable, str(ROOT / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def assert_png_drawn(path: Path, min_width: int = 600, min_height: int = 300) -> None:
    """The file is a PNG of a real chart: large enough and far from blank."""
    import matplotlib.image as mpimg
    import numpy as np

    image = mpimg.imread(path)
    height, width = image.shape[:2]
    assert width >= min_width and height >= min_height, (width, height)
    rgb = image[..., :3]
    non_white = np.mean(np.any(rgb < 0.95, axis=-1))
    assert non_white > 0.03, f"{path} is nearly blank ({non_white:.1%} drawn)"
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 20, "too few colours for a chart"


@pytest.fixture
def load_json():
    return lambda path: json.loads(Path(path).read_text())
