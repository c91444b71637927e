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

from pipeline_sim.model import EnvParams
from tests.test_learned import ranked

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


#: A learned sweep (a few seconds on two workers): greedy and a network, 8 environments of 37 policies, 10 samples.
LEARNED_GRID = {"n": [4, 6], "num_gpus": 2, "schedule": "zb-h1", "dispatch": ["greedy", "learned:p.npz"],
                "compute_jitter": [0.1, 0.2], "samples": 10}
PREFERENCES = {"old": [3.0, 2.0, 1.0, 0.0], "new": [2.0, 3.0, 1.0, 0.0]}  # greedy's ranking; forwards first


def learned_command(*extra):
    return [sys.executable, str(ROOT / "data_generator.py"), "-c", "grid.json", "-o", "out.csv", "--step", "0.5",
            "--workers", "2", *extra]


def write_network(folder, which):
    (folder / "p.npz").write_bytes(ranked(EnvParams(n=4, num_gpus=2, schedule="zb-h1"), PREFERENCES[which],
                                          hidden=8).to_bytes())


@pytest.fixture(scope="module")
def learned_clean(tmp_path_factory):
    """Per network: the bytes of an uninterrupted run, and how long it took."""
    runs = {}
    for which in PREFERENCES:
        folder = tmp_path_factory.mktemp(f"learned-{which}")
        (folder / "grid.json").write_text(json.dumps(LEARNED_GRID))
        write_network(folder, which)
        started = time.monotonic()
        result = subprocess.run(learned_command(), cwd=folder, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        runs[which] = ((folder / "out.csv").read_bytes(), time.monotonic() - started)
    assert runs["old"][0] != runs["new"][0]
    return runs


@pytest.mark.parametrize("changed", [False, True], ids=["same network", "network changed"])
def test_a_learned_sweep_killed_then_resumed_never_mixes_two_networks(tmp_path, learned_clean, changed):
    """Killed at random instants, resumed with the policy file as it was (the same bytes as an uninterrupted run)
    or after it changed: then the resume is refused in one line naming the file, or, with nothing of the old
    network's on disk, starts over; either way the output is the new network's alone."""
    expected, _ = learned_clean["new" if changed else "old"]
    seconds = learned_clean["old"][1]
    chance = random.Random(f"{SEED}-learned-{changed}")
    for kill in range(KILLS):
        for path in tmp_path.iterdir():
            subprocess.run(["rm", "-rf", str(path)], check=True)
        (tmp_path / "grid.json").write_text(json.dumps(LEARNED_GRID))
        write_network(tmp_path, "old")
        instant = chance.uniform(0.3, 0.9) * seconds
        group = kill % 2 == 0
        process = subprocess.Popen(learned_command(), cwd=tmp_path, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(instant)
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        process.communicate(timeout=60)
        what = f"seed {SEED}, kill {kill} at {instant:.2f} s of {seconds:.2f} s ({'group' if group else 'main'})"
        finished = (tmp_path / "out.csv").exists() and not (tmp_path / "out.csv.partial.json").exists()
        if changed:
            write_network(tmp_path, "new")
        if finished:
            if changed:  # a finished output of the old network stays as it is until --overwrite
                assert subprocess.run(learned_command("--overwrite"), cwd=tmp_path, capture_output=True,
                                      timeout=300).returncode == 0, what
        else:
            had_rows = (tmp_path / "out.csv.partial").exists()
            resumed = subprocess.run(learned_command("--resume"), cwd=tmp_path, capture_output=True, text=True,
                                     timeout=300)
            if changed and had_rows:
                lines = resumed.stderr.strip().splitlines()
                assert resumed.returncode == 2 and len(lines) == 1, f"{what}: {resumed.stderr}"
                assert "holds rows of another network: p.npz changed since they were written" in lines[0], what
                assert not (tmp_path / "out.csv").exists(), what
                resumed = subprocess.run(learned_command("--overwrite"), cwd=tmp_path, capture_output=True,
                                         text=True, timeout=300)
            assert resumed.returncode == 0, f"{what}: {resumed.stderr}"
        assert (tmp_path / "out.csv").read_bytes() == expected, what
        leftovers = sorted(path.name for path in tmp_path.iterdir()
                           if path.name not in ("grid.json", "p.npz", "out.csv", "out.csv.lock"))
        assert leftovers == [], f"{what}: {leftovers}"


def test_destructors_failing_after_an_interrupt_stay_silent(capsys, monkeypatch):
    """An object the signal cut short in its constructor fails in its destructor, as late as the interpreter's exit
    (llvmlite's do, mid-compile): after our one line nothing more is reported; before an interrupt, such a failure
    goes to the hook as always."""
    import gc

    from pipeline_sim.cli.common import _interrupted, run_command

    reported: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(str(unraisable.exc_value)))

    class Broken:
        def __del__(self) -> None:
            raise AttributeError("half-built")

    def body() -> int:
        _interrupted(2, None)
        return 0

    assert run_command("prog", body) == 130
    Broken()
    gc.collect()
    assert capsys.readouterr().err.strip() == "prog: interrupted" and reported == []
    assert run_command("prog", lambda: 0) == 0  # a run without an interrupt: reported again
    Broken()
    gc.collect()
    assert reported == ["half-built"]
