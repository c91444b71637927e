import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def compiled_kernel():
    """The kernel is compiled (or loaded) once, before any test: the scripts run later load it from the cache, and
    no test may drop that cache (every later script would compile the kernel again, half a minute each)."""
    from pipeline_sim import compile_cache, kernel
    from pipeline_sim.engine import compile_kernel

    compile_kernel()
    indexes = sorted(compile_cache.cache_folder(kernel).glob("*.nbi"))
    yield
    assert [index for index in indexes if not index.exists()] == [], "a test dropped the kernel's compile cache"


#: A sweep long enough to interrupt (1,452 simulations, a few seconds).
BIG = {"n": [64, 128], "num_gpus": 8, "bwd_len": {"start": 1.0, "stop": 1.5, "step": 0.1}}


def write_config(folder: Path, grid: dict, name: str = "grid.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(grid))
    return path


@pytest.fixture(scope="session")
def big_reference(tmp_path_factory):
    """The bytes of one uninterrupted run of BIG into a CSV, for every test that interrupts one."""
    folder = tmp_path_factory.mktemp("reference")
    config = write_config(folder, BIG)
    result = run_here("data_generator.py", "-c", str(config), "-o", "clean.csv", cwd=folder)
    assert result.returncode == 0, result.stderr
    return (folder / "clean.csv").read_bytes()


def run_script(script: str, *args: str, cwd: Path, timeout: float = 300,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run one of the top-level scripts as a user would, from ``cwd`` (in ``env``, else this environment)."""
    env = {k: v for k, v in (env or os.environ).items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")}
    return subprocess.run([sys.executable, str(ROOT / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def run_on_terminal(script: str, *args: str, cwd: Path, timeout: float = 300) -> tuple[int, str, str]:
    """Run one of the top-level scripts with its stderr on a new pseudo-terminal (which reports no size, as
    ``script`` makes it): its exit status, its stdout, and all it drew on the terminal, carriage returns as new
    lines."""
    import pty

    master, terminal = pty.openpty()
    try:
        process = subprocess.Popen([sys.executable, str(ROOT / script), *args], cwd=cwd, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=terminal)
        os.close(terminal)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the other end closed: the command is done
                break
            if not chunk:
                break
            seen += chunk
        out, _ = process.communicate(timeout=timeout)
    finally:
        os.close(master)
    return process.returncode, out.decode(), seen.decode().replace("\r", "\n")


def run_here(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run one of the top-level scripts as ``run_script`` does, but in this process: the script file itself, with
    its arguments, from ``cwd``, without a display, its output and exit status captured.

    For checks of what a command says and writes, where a new interpreter would only add its start-up (imports
    and loading the compiled kernel, about two seconds). Whatever depends on the process itself (signals, kills,
    locks held by another run, the compile cache, pipes) runs with ``run_script``.
    """
    stdout, stderr = io.StringIO(), io.StringIO()
    argv, folder = sys.argv, os.getcwd()
    display = {key: os.environ.pop(key) for key in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND") if key in os.environ}
    sys.argv = [str(ROOT / script), *args]
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                runpy.run_path(str(ROOT / script), run_name="__main__")
                code = 0
            except SystemExit as end:
                code = end.code if isinstance(end.code, int) else 0 if end.code is None else 1
                if isinstance(end.code, str):
                    print(end.code, file=sys.stderr)
    finally:
        sys.argv = argv
        os.chdir(folder)
        os.environ.update(display)
    return subprocess.CompletedProcess([script, *args], code, stdout.getvalue(), stderr.getvalue())


def sweep_csv(folder: Path, name: str, grid: dict) -> tuple[list[str], list[dict[str, str]]]:
    """Sweep ``grid`` with data_generator.py (policy step 0.5, one worker) into ``folder/<name>.csv``: its header and
    rows."""
    import csv

    config = write_config(folder, grid, f"{name}.json")
    output = folder / f"{name}.csv"
    result = run_here("data_generator.py", "-c", str(config), "-o", str(output), "--step", "0.5", "--workers", "1",
                      cwd=folder)
    assert result.returncode == 0, result.stderr
    with open(output, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or ()), list(reader)


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
    # each pixel's colour as one integer (exact for 8- and 16-bit channels): unique rows would take seconds
    levels = np.rint(rgb.reshape(-1, 3) * 65535).astype(np.uint64)
    colours = np.unique((levels[:, 0] << 32) | (levels[:, 1] << 16) | levels[:, 2])
    assert len(colours) > 20, "too few colours for a chart"


@pytest.fixture
def load_json():
    return lambda path: json.loads(Path(path).read_text())
