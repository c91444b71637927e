"""A sweep killed outright at random instants, its main process alone or its whole process group, the final
merge and cleanup included, then resumed: every output is the same bytes as an uninterrupted run's.

``PIPELINE_SIM_KILLS`` sets the kills per format (default 3, a few seconds each); the instants come from
``PIPELINE_SIM_KILL_SEED`` (default: a new seed each run, printed when a kill loses or changes a byte).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

#: 180 environments of 121 policies: 21,780 rows, two Parquet parts, a couple of seconds on two workers.
GRID = {"n": [4, 6, 8], "num_gpus": 2, "bwd_len": {"start": 1.0, "stop": 3.9, "step": 0.1},
        "ingress_capacity": [0.5, 1.0]}
KILLS = int(os.environ.get("PIPELINE_SIM_KILLS", "3"))
SEED = int(os.environ.get("PIPELINE_SIM_KILL_SEED", str(random.SystemRandom().randrange(2 ** 32))))


def command(fmt, *extra):
    return [sys.executable, str(ROOT / "data_generator.py"), "-c", "grid.json", "-o", f"out.{fmt}", "--format", fmt,
            "--samples-output", f"samples.{fmt}.csv", "--workers", "2", *extra]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Per format: the bytes of an uninterrupted run, and how long it took."""
    if not _has_pyarrow():
        pytest.skip("Parquet needs the [cluster] extra (pyarrow)")
    folder = tmp_path_factory.mktemp("clean")
    (folder / "grid.json").write_text(json.dumps(GRID))
    runs = {}
    for fmt in ("csv", "parquet"):
        started = time.monotonic()
        result = subprocess.run(command(fmt), cwd=folder, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        runs[fmt] = ((folder / f"out.{fmt}").read_bytes(), (folder / f"samples.{fmt}.csv").read_bytes(),
                     time.monotonic() - started)
    return runs


def _has_pyarrow():
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_killed_at_random_instants_then_resumed_gives_the_same_bytes(tmp_path, clean, fmt):
    output, samples, seconds = clean[fmt]
    chance = random.Random(f"{SEED}-{fmt}")
    (tmp_path / "grid.json").write_text(json.dumps(GRID))
    for kill in range(KILLS):
        for path in tmp_path.iterdir():
            if path.name != "grid.json":
                subprocess.run(["rm", "-rf", str(path)], check=True)
        # half the instants late in the run, where the last parts are written, merged and cleaned up
        instant = chance.uniform(0.2, 1.0) * seconds if kill % 2 else chance.uniform(0.75, 1.1) * seconds
        group = kill % 4 < 2
        process = subprocess.Popen(command(fmt), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   start_new_session=True)
        time.sleep(instant)
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()  # the main process alone: its workers end with it
        process.communicate(timeout=60)
        what = f"seed {SEED}, {fmt}, kill {kill} at {instant:.2f} s of {seconds:.2f} s ({'group' if group else 'main'})"
        finished = (tmp_path / f"out.{fmt}").exists() and not (tmp_path / f"out.{fmt}.partial.json").exists()
        if not finished:
            resumed = subprocess.run(command(fmt, "--resume"), cwd=tmp_path, capture_output=True, text=True,
                                     timeout=300)
            assert resumed.returncode == 0, f"{what}: {resumed.stderr}"
        assert (tmp_path / f"out.{fmt}").read_bytes() == output, what
        assert (tmp_path / f"samples.{fmt}.csv").read_bytes() == samples, what
        leftovers = sorted(path.name for path in tmp_path.iterdir()
                           if path.name not in ("grid.json", f"out.{fmt}", f"samples.{fmt}.csv", f"out.{fmt}.lock",
                                                f"samples.{fmt}.csv.lock"))
        assert leftovers == [], f"{what}: {leftovers}"
