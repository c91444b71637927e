"""Nothing lost, nothing overwritten, nothing hangs: each class of hostile input, in a temporary directory."""

import csv
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import BIG, ROOT, assert_one_line_error, run_here, run_on_terminal, run_script, write_config

from pipeline_sim import EnvParams, Policy, calculate_full_pipeline_schedule
from pipeline_sim.cli.common import counted, run_command
from pipeline_sim.hindsight import solver_available
from pipeline_sim.model import ParameterError

QUICK = ROOT / "configs" / "quick.json"
# -- data that must never be lost or destroyed --------------------------------------------

def special_files(folder):
    fifo = folder / "fifo"
    os.mkfifo(fifo)
    made = {"a FIFO": fifo, "a folder": folder / "adir"}
    made["a folder"].mkdir()
    try:
        os.mknod(folder / "device", stat.S_IFCHR | 0o600, os.makedev(1, 7))
        made["a device"] = folder / "device"
    except PermissionError:
        pass  # not root: no device node to test with
    return made


def test_an_output_that_is_not_a_regular_file_is_refused_and_kept(tmp_path):
    for kind, path in special_files(tmp_path).items():
        before = os.lstat(path)
        sweep = run_script("data_generator.py", "-c", str(QUICK), "-o", str(path), cwd=tmp_path)
        assert_one_line_error(sweep, f"{path} is {kind}")
        chart = run_script("schedule_visualizer_single_channel.py", "--no-show", "--output", str(path),
                           cwd=tmp_path)
        assert_one_line_error(chart, f"{path} is {kind}")
        after = os.lstat(path)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)


def test_a_symlink_is_written_through(tmp_path):
    (tmp_path / "link.csv").symlink_to("target.csv")
    result = run_here("data_generator.py", "-c", str(QUICK), "-o", "link.csv", "--step", "0.5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "link.csv").is_symlink() and (tmp_path / "target.csv").stat().st_size > 0
    assert not list(tmp_path.glob("*.partial*")) and not list(tmp_path.glob("*.lock"))


def test_a_file_in_the_middle_of_an_output_path(tmp_path):
    (tmp_path / "afile").write_text("keep me")
    result = run_here("data_generator.py", "-c", str(QUICK), "-o", "afile/out.csv", cwd=tmp_path)
    assert_one_line_error(result, "cannot write afile/out.csv: afile is a file, not a folder")
    maps = run_here("plot_heatmap.py", str(ROOT / "tests" / "data" / "quick_step0.5.csv"), "-o", "afile/maps",
                      cwd=tmp_path)
    assert_one_line_error(maps, "cannot write into afile/maps: afile is a file, not a folder")
    assert (tmp_path / "afile").read_text() == "keep me"


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="a folder that takes no new file: Linux's /proc")
def test_a_folder_that_takes_no_file_is_named_not_its_lock(tmp_path):
    result = run_here("schedule_visualizer_single_channel.py", "--no-show", "-o", "/proc/x.png", cwd=tmp_path)
    assert_one_line_error(result, "cannot write /proc/x.png: No such file or directory (its folder /proc takes no "
                                  "lock file beside it)")


def start(args, cwd):
    return subprocess.Popen([sys.executable, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_rows(partial, process, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if partial.exists() and partial.read_text().count("\n") > 1:
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.1)
    raise AssertionError("the sweep wrote no row")


def interrupted_sweep(folder):
    """BIG, stopped by Ctrl-C after its first rows, into ``out.csv``; returns the config."""
    config = write_config(folder, BIG)
    process = start([ROOT / "data_generator.py", "-c", config, "-o", "out.csv", "--workers", "1"], folder)
    wait_for_rows(folder / "out.csv.partial", process)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=60)
    return config


def test_one_writer_per_output(tmp_path, big_reference):
    config = write_config(tmp_path, BIG)
    first = start([ROOT / "data_generator.py", "-c", config, "-o", "out.csv", "--workers", "1"], tmp_path)
    try:
        wait_for_rows(tmp_path / "out.csv.partial", first)
        for extra in ([], ["--resume"], ["--overwrite"]):
            second = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", *extra, cwd=tmp_path)
            assert_one_line_error(second, f"another run (pid {first.pid}) is writing out.csv")
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    # the first run's rows are intact: a resume completes it to the same bytes as one clean run
    resumed = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "out.csv").read_bytes() == big_reference


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_lock_file_removed_by_hand_lets_no_second_writer_in(tmp_path, big_reference, fmt, how):
    """flock holds a file, not a name: with the lock file of a running sweep removed (or replaced) by hand, a
    second run locks a new file of that name. It is refused all the same, by the lock the first run holds on
    its partial itself, and the first run stops at its next commit point, naming its lock; nothing is lost."""
    from pipeline_sim.config import EnvironmentGrid
    from pipeline_sim.files import OutputError
    from pipeline_sim.sweep import SweepPlan, run_sweep

    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    config = write_config(tmp_path, BIG)
    output = tmp_path / f"out.{fmt}"
    first = run_sweep(SweepPlan(EnvironmentGrid.from_mapping(BIG), format=fmt), output, workers=1)
    assert next(first) == 0 and next(first) > 0  # a chunk of rows is written
    lock = tmp_path / f"out.{fmt}.lock"
    lock.unlink()
    try:
        for extra in (["--resume"], ["--overwrite"]):
            second = run_script("data_generator.py", "-c", str(config), "-o", output.name, "--format", fmt, *extra,
                                cwd=tmp_path)
            assert_one_line_error(second, f"another run is writing out.{fmt}.partial")
        if how == "replaced":
            lock.write_text("")
        with pytest.raises(OutputError, match=f"out.{fmt}.lock was {how} while this run held it"):
            while True:
                next(first)
    finally:
        first.close()
    resumed = run_here("data_generator.py", "-c", str(config), "-o", output.name, "--format", fmt, "--resume",
                         cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    if fmt == "csv":
        assert output.read_bytes() == big_reference
    else:
        clean = run_here("data_generator.py", "-c", str(config), "-o", "clean.parquet", "--format", fmt,
                           cwd=tmp_path)
        assert clean.returncode == 0, clean.stderr
        assert output.read_bytes() == (tmp_path / "clean.parquet").read_bytes()


def test_a_sweep_whose_lock_file_is_removed_stops_in_one_line(tmp_path, big_reference):
    config = write_config(tmp_path, BIG)
    process = start([ROOT / "data_generator.py", "-c", config, "-o", "out.csv", "--workers", "1"], tmp_path)
    wait_for_rows(tmp_path / "out.csv.partial", process)
    (tmp_path / "out.csv.lock").unlink()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2, err
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "out.csv.lock was removed while this run held it" in last and "Traceback" not in err
    assert "rows kept in out.csv.partial; once no other run writes it, continue with python " in last
    assert last.endswith(f"data_generator.py -c {config} -o out.csv --workers 1 --resume"), last
    resumed = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "out.csv").read_bytes() == big_reference


def test_a_holder_never_removes_a_lock_file_that_is_not_its_own(tmp_path):
    """Every lock a run holds is checked at each commit point (figures too), and a lock file put in place of the
    run's own, perhaps another run's now, is left where it is."""
    from pipeline_sim.files import LockLost, check_locks, exclusive_writer

    with exclusive_writer(tmp_path / "maps"), exclusive_writer(tmp_path / "out.csv"):
        check_locks()
        (tmp_path / "maps.lock").unlink()
        (tmp_path / "maps.lock").write_text("4242\n")
        with pytest.raises(LockLost, match="maps.lock was replaced while this run held it, so another run may be "
                                           "writing .*maps; stopped before writing more"):
            check_locks()
    assert (tmp_path / "maps.lock").read_text() == "4242\n" and not (tmp_path / "out.csv.lock").exists()


def test_every_output_of_a_run_is_locked(tmp_path):
    """The samples file and the figures' folder are held as the main output is: a second run writing any of
    them is refused, naming the first."""
    from pipeline_sim.files import exclusive_writer

    config = write_config(tmp_path, BIG)
    first = start([ROOT / "data_generator.py", "-c", config, "-o", "out.csv", "--workers", "1",
                   "--samples-output", "samples.csv"], tmp_path)
    try:
        wait_for_rows(tmp_path / "out.csv.partial", first)
        second = run_here("data_generator.py", "-c", str(QUICK), "-o", "samples.csv", cwd=tmp_path)
        assert_one_line_error(second, f"another run (pid {first.pid}) is writing", "samples.csv")
        third = run_here("data_generator.py", "-c", str(QUICK), "-o", "other.csv", "--samples-output",
                           "samples.csv", cwd=tmp_path)
        assert_one_line_error(third, f"another run (pid {first.pid}) is writing", "samples.csv")
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    assert not (tmp_path / "other.csv").exists()
    with exclusive_writer((tmp_path / "maps").resolve()):
        drawn = run_script("plot_heatmap.py", str(ROOT / "tests" / "data" / "quick_step0.5.csv"), "-o", "maps",
                           cwd=tmp_path)
        assert_one_line_error(drawn, f"another run (pid {os.getpid()}) is writing", "maps")
    assert not (tmp_path / "maps").exists()


def test_a_lock_path_that_is_not_an_ordinary_file_is_named_and_never_written(tmp_path):
    (tmp_path / "victim.txt").write_text("keep me")
    (tmp_path / "out.csv.lock").symlink_to("victim.txt")
    result = run_script("data_generator.py", "-c", str(QUICK), "-o", "out.csv", cwd=tmp_path)
    assert_one_line_error(result, "out.csv.lock is a link; remove it")
    assert (tmp_path / "victim.txt").read_text() == "keep me" and (tmp_path / "out.csv.lock").is_symlink()
    for kind, path in special_files(tmp_path).items():
        output = path.with_name(path.name + ".csv")
        path.rename(output.with_name(output.name + ".lock"))
        result = run_script("data_generator.py", "-c", str(QUICK), "-o", str(output), cwd=tmp_path, timeout=60)
        assert_one_line_error(result, f"{output}.lock is {kind}; remove it")
        assert not output.exists()


@pytest.mark.parametrize("side", ["out.csv.partial", "out.csv.partial.json", "out.csv.samples.partial"])
def test_a_link_at_a_side_path_is_refused_and_never_written_through(tmp_path, side):
    (tmp_path / "victim.txt").write_text("keep me")
    (tmp_path / side).symlink_to("victim.txt")
    result = run_here("data_generator.py", "-c", str(QUICK), "-o", "out.csv", "--resume", cwd=tmp_path)
    assert_one_line_error(result, f"{side} is a link; remove it")
    assert (tmp_path / "victim.txt").read_text() == "keep me" and (tmp_path / side).is_symlink()
    assert not (tmp_path / "out.csv").exists()


def test_a_killed_run_leaves_no_lock_to_delete(tmp_path, big_reference):
    """A run killed outright releases its lock with its process: the next run goes on without anyone deleting
    anything."""
    config = write_config(tmp_path, BIG)
    process = subprocess.Popen([sys.executable, str(ROOT / "data_generator.py"), "-c", str(config), "-o", "out.csv",
                                "--workers", "2"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    wait_for_rows(tmp_path / "out.csv.partial", process)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    resumed = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "out.csv").read_bytes() == big_reference and not (tmp_path / "out.csv.lock").exists()


def test_default_names_do_not_collide(tmp_path):
    for simulator in ("single_channel", "dual_channel"):
        result = run_here("data_generator.py", "-c", str(QUICK), "--step", "0.5", "--simulator", simulator,
                            cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    outputs = sorted((tmp_path / "outputs" / "data").glob("quick_*.csv"))
    assert len(outputs) == 2
    simulators = [{row["simulator"] for row in csv.DictReader(open(path))} for path in outputs]
    assert sorted(map(tuple, simulators)) == [("dual_channel",), ("single_channel",)]


def test_an_existing_output_or_partial_is_never_discarded_silently(tmp_path):
    config = interrupted_sweep(tmp_path)
    kept = (tmp_path / "out.csv.partial").read_bytes()
    again = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", cwd=tmp_path)
    assert_one_line_error(again, "out.csv.partial is an unfinished run of this very sweep; pass --resume",
                          "--overwrite")
    assert (tmp_path / "out.csv.partial").read_bytes() == kept
    other = run_here("data_generator.py", "-c", str(QUICK), "-o", "out.csv", cwd=tmp_path)
    assert_one_line_error(other, "holds rows of another sweep", "pass --overwrite to discard them")
    assert "--resume" not in other.stderr  # a resume of this config would be refused too
    done = run_here("data_generator.py", "-c", str(QUICK), "-o", "done.csv", cwd=tmp_path)
    assert done.returncode == 0
    assert_one_line_error(run_here("data_generator.py", "-c", str(QUICK), "-o", "done.csv", cwd=tmp_path),
                          "done.csv exists; pass --overwrite")
    replaced = run_here("data_generator.py", "-c", str(QUICK), "-o", "out.csv", "--overwrite", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    assert not (tmp_path / "out.csv.partial").exists()


def test_an_output_may_not_be_an_input_or_another_output(tmp_path):
    config = write_config(tmp_path, {"n": 4})
    text = config.read_text()
    assert_one_line_error(run_here("data_generator.py", "-c", str(config), "-o", str(config), cwd=tmp_path),
                          "is the config itself")
    assert_one_line_error(run_here("data_generator.py", "-c", str(config), "-o", "a.csv", "--samples-output",
                                     "a.csv", cwd=tmp_path), "the samples file and the CSV are both")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.csv").symlink_to(tmp_path / "a.csv")
    for other in (str(tmp_path / "a.csv"), "sub/../a.csv", "link.csv"):  # the same file, spelled otherwise
        assert_one_line_error(run_here("data_generator.py", "-c", str(config), "-o", "a.csv", "--samples-output",
                                         other, cwd=tmp_path), "the samples file and the CSV are both")
    assert_one_line_error(run_here("data_generator.py", "-c", str(config), "--format", "parquet", "-o", "a.parquet",
                                   "--samples-output", "s.parquet", cwd=tmp_path),
                          "--samples-output s.parquet: the samples file is CSV; give a path ending in .csv")
    for beside in ("a.csv.partial", "a.csv.partial.json", "a.csv.lock"):  # the sweep's own, removed when it ends
        assert_one_line_error(run_here("data_generator.py", "-c", str(config), "-o", "a.csv", "--samples", "2",
                                       "--samples-output", beside, cwd=tmp_path),
                              f"--samples-output {beside}: the sweep of a.csv keeps a file of its own there")
    assert config.read_text() == text and not (tmp_path / "a.csv").exists()
    chart = run_here("schedule_visualizer_single_channel.py", "--no-show", "--output", "c.png", "--trace", "c.png",
                       cwd=tmp_path)
    assert_one_line_error(chart, "--trace and --output are both c.png")
    assert not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("name, magic", [("c.svg", b"<?xml"), ("c.pdf", b"%PDF"), ("c.jpg", b"\xff\xd8\xff"),
                                         ("c.png", b"\x89PNG")])
def test_the_chart_has_the_format_its_extension_names(tmp_path, name, magic):
    result = run_here("schedule_visualizer_single_channel.py", "--no-show", "--output", name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / name).read_bytes().startswith(magic)


def test_an_unknown_extension_is_refused(tmp_path):
    result = run_here("schedule_visualizer_single_channel.py", "--no-show", "--output", "c.txt", cwd=tmp_path)
    assert_one_line_error(result, "the extension '.txt' names no image format; use one of .png, .svg, .pdf")
    result = run_here("schedule_visualizer_single_channel.py", "--no-show", "--trace", "t.png", cwd=tmp_path)
    assert_one_line_error(result, "--trace t.png: a trace is JSON; give a path ending in .json")
    assert not list(tmp_path.iterdir())


# -- nothing hangs, nothing explodes ------------------------------------------------------

@pytest.mark.parametrize("signals", [[signal.SIGINT], [signal.SIGINT, signal.SIGINT], [signal.SIGTERM]])
def test_interrupts_stop_at_once_keep_every_row_and_resume(tmp_path, signals, big_reference):
    config = write_config(tmp_path, BIG)
    process = start([ROOT / "data_generator.py", "-c", config, "-o", "out.csv", "--workers", "2"], tmp_path)
    wait_for_rows(tmp_path / "out.csv.partial", process)
    for sent in signals:
        process.send_signal(sent)
        time.sleep(0.05)
    _, err = process.communicate(timeout=30)  # a hang fails here
    if process.returncode == -signal.SIGINT:
        # A second Ctrl-C that lands while the first is being handled ends the process at once, unexplained.
        assert len(signals) == 2
    else:
        assert process.returncode == (143 if signals == [signal.SIGTERM] else 130)  # as a shell says either
        last = err.replace("\r", "\n").strip().splitlines()[-1]
        assert "rows kept in out.csv.partial; to continue: python " in last
        assert last.endswith(f"data_generator.py -c {config} -o out.csv --workers 2 --resume"), last
    resumed = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "out.csv").read_bytes() == big_reference


def test_an_interrupt_always_says_something(capsys):
    def body():
        raise KeyboardInterrupt()
    assert run_command("tool", body) == 130
    assert capsys.readouterr().err.strip() == "tool: interrupted"


def test_an_interrupt_that_lands_where_exceptions_are_swallowed_still_stops_the_sweep(tmp_path, monkeypatch):
    """Ctrl-C arriving inside a garbage-collector callback (as a cluster client's diagnostics install) is lost
    as an exception; the sweep still stops at its next report, with only the usual line and status."""
    import gc

    from pipeline_sim.cli import generate

    def swallowed(phase, info):  # the handler's KeyboardInterrupt is "ignored" by the collector
        gc.callbacks.remove(swallowed)
        signal.raise_signal(signal.SIGINT)

    def ready_then_interrupted(**_):
        gc.callbacks.append(swallowed)
        gc.collect()
    monkeypatch.setattr(generate, "ready_kernel", ready_then_interrupted)
    config = write_config(tmp_path, BIG)
    result = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--workers", "1", cwd=tmp_path)
    assert swallowed not in gc.callbacks
    lines = [line for line in result.stderr.replace("\r", "\n").splitlines() if line.strip() and "%|" not in line]
    assert result.returncode == 130 and len(lines) == 1 and re.fullmatch(
        r"data_generator\.py: interrupted after [\d,]+ of 1,452 simulations; rows kept in out\.csv\.partial; to "
        rf"continue: python \S+data_generator\.py -c {re.escape(str(config))} -o out\.csv --workers 1 --resume",
        lines[0]), result.stderr
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("grid, args, fragment", [
    ({"n": 10_000_000}, [], "n=10000000, num_gpus=4 has about 240,000,004 tasks per simulation; at most 1,000,000"),
    ({"num_gpus": 10_000_000}, [], "tasks per simulation; at most 1,000,000 fit in memory (pass --allow-large"),
    ({"n": 8}, ["--step", "1e-9"], "step = 1e-09: is finer than 1/100 = 0.01, which already gives 5,476 policies per "
                                   "environment (pass --allow-large to try anyway)"),
    ({"n": {"start": 1, "stop": 99999, "step": 1}, "bwd_len": {"start": 1, "stop": 99999, "step": 1},
      "fwd_len": {"start": 1, "stop": 99999, "step": 1}}, [], "combinations; at most 1,000,000 are allowed"),
    ({"n": list(range(1, 1_000_002))}, [], "list of 1,000,001 values; at most 100,000 are allowed"),
    ({"n": {"start": 1, "stop": 1000, "step": 1}, "num_gpus": [4, 8, 16, 32, 64, 128], "bwd_len": [1.0, 2.0]}, [],
     "hours on 1 worker; at most 24 hours are allowed (shrink the grid, or pass --allow-large)"),
    # priced as plain simulations, both took minutes; a look-ahead iteration of 16 GPUs and 64 micro-batches takes
    # about a minute, a hindsight draw seconds
    ({"n": 64, "num_gpus": 16, "schedule": "zb-h1", "dispatch": "lookahead", "samples": 100,
      "compute_jitter": {"start": 0.01, "stop": 0.5, "step": 0.01}}, [],
     "hours on 1 worker (each look-ahead decision runs the rest of the iteration once per candidate); at most 24"),
    pytest.param({"n": 8, "num_gpus": 4, "schedule": "zb-h1", "dispatch": "hindsight", "samples": 10_000,
                  "compute_jitter": {"start": 0.01, "stop": 0.5, "step": 0.01}}, [],
                 "hours on 1 worker (the hindsight solver takes seconds a draw); at most 24",
                 marks=pytest.mark.skipif(not solver_available(), reason="the [solver] extra is not installed")),
])
def test_work_that_cannot_finish_or_fit_is_refused_before_it_starts(tmp_path, grid, args, fragment):
    config = write_config(tmp_path, grid)
    result = run_here("data_generator.py", "-c", str(config), "-o", "x.csv", "--workers", "1", *args, cwd=tmp_path)
    assert_one_line_error(result, fragment)
    assert not list(tmp_path.glob("x.csv*"))


def test_allow_large_lifts_every_size_limit(tmp_path):
    from pipeline_sim.config import EnvironmentGrid

    huge = {"n": {"start": 1, "stop": 99999, "step": 1}, "bwd_len": {"start": 1, "stop": 99, "step": 1}}
    with pytest.raises(ValueError, match="pass --allow-large to try anyway"):
        EnvironmentGrid.from_mapping(huge)
    assert EnvironmentGrid.from_mapping(huge, allow_large=True).values[0][1][-1] == 99999
    config = write_config(tmp_path, {"n": 4, "num_gpus": 2, "sync_base_len": 0.0})
    result = run_here("data_generator.py", "-c", str(config), "-o", "fine.csv", "--step", "0.005",
                        "--allow-large", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "1 environment x 20,926 policies = 20,926 simulations" in result.stdout


def test_a_run_is_stopped_by_sigterm_during_a_long_simulation(tmp_path):
    """One environment of 720,000 tasks: its 121 policies take about 25 s in one call of compiled code, which does
    not return to the interpreter until it is done; the run still stops within seconds."""
    config = write_config(tmp_path, {"n": 15_000, "num_gpus": 8})
    process = start([ROOT / "data_generator.py", "-c", config, "-o", "long.csv", "--workers", "1"], tmp_path)
    assert "simulations on 1 worker" in process.stdout.readline()
    time.sleep(10)  # its task graph is built (about 1 s), and its policies are being simulated
    process.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    _, err = process.communicate(timeout=60)
    assert time.monotonic() - stopped < 5 and process.returncode == 143, err
    assert "terminated after 0 of 121 simulations; rows kept in long.csv.partial" in err


def test_allow_large_starts_what_it_lifts_and_the_run_still_stops_at_once(tmp_path):
    """Over the task limit and the day's estimate, a sweep is refused; --allow-large starts it (its first environment
    of 1.4 million tasks being built), and SIGTERM still stops it within seconds."""
    config = write_config(tmp_path, {"n": 30_000, "num_gpus": 8, "bwd_len": {"start": 1, "stop": 2000, "step": 1}})
    refused = run_here("data_generator.py", "-c", str(config), "-o", "big.csv", cwd=tmp_path)
    assert_one_line_error(refused, "about 1,440,008 tasks per simulation; at most 1,000,000", "--allow-large")
    config.write_text(json.dumps({"n": 20_000, "num_gpus": 8, "bwd_len": {"start": 1, "stop": 2000, "step": 1}}))
    refused = run_here("data_generator.py", "-c", str(config), "-o", "big.csv", cwd=tmp_path)
    assert_one_line_error(refused, " hours on ", "; at most 24 hours are allowed", "--allow-large")
    config.write_text(json.dumps({"n": 30_000, "num_gpus": 8, "bwd_len": {"start": 1, "stop": 2000, "step": 1}}))
    process = start([ROOT / "data_generator.py", "-c", config, "-o", "big.csv", "--workers", "1", "--allow-large"],
                    tmp_path)
    assert "2,000 environments x 121 policies = 242,000 simulations on 1 worker" in process.stdout.readline()
    time.sleep(3)
    process.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    _, err = process.communicate(timeout=60)
    assert time.monotonic() - stopped < 5 and process.returncode == 143, err
    assert "terminated after 0 of 242,000 simulations; rows kept in big.csv.partial" in err


def test_a_parquet_file_is_not_named_csv(tmp_path):
    for output, fmt, fragment in (("x.csv", "parquet", "--output x.csv: a Parquet file named .csv; name it .parquet"),
                                  ("x.parquet", "csv", "--output x.parquet: a CSV file named .parquet; name it .csv")):
        result = run_here("data_generator.py", "-c", str(QUICK), "-o", output, "--format", fmt, cwd=tmp_path)
        assert_one_line_error(result, fragment)
    assert not list(tmp_path.iterdir())


def test_the_visualizer_refuses_a_graph_too_large_to_draw(tmp_path):
    result = run_here("schedule_visualizer_single_channel.py", "-n", "10000000", "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "n = 10000000: on 4 GPUs gives about 240,000,004 tasks; at most 1,000,000")


def test_never_more_workers_than_chunks():
    from pipeline_sim.config import EnvironmentGrid
    from pipeline_sim.sweep import SweepPlan, useful_workers

    plan = SweepPlan(EnvironmentGrid.load(QUICK))
    chunks = len(list(plan.chunks(0, 1 << 30)))  # one chunk per environment at the least
    assert chunks == 2 and 2 <= useful_workers(plan, 1000) < 1000
    assert useful_workers(plan, 1) == 1


@pytest.mark.parametrize("script, args", [
    ("data_generator.py", ["-c", str(QUICK)]), ("plot_heatmap.py", ["missing.csv"]),
    ("plan.py", ["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "8"])])
def test_thousands_of_workers_are_refused_before_any_is_forked(tmp_path, script, args):
    cores = os.cpu_count() or 1
    result = run_here(script, *args, "--workers", "100000", cwd=tmp_path)
    assert_one_line_error(result, f"argument --workers: 100000 must be from 1 to {4 * cores} (4 per core of this "
                                  f"machine's {cores})")
    assert not list(tmp_path.iterdir())


def test_a_remote_cluster_takes_as_many_workers_as_asked():
    from pipeline_sim.cli.generate import build_parser

    args = build_parser("data_generator.py").parse_args(["-c", "x.json", "--workers", "100000", "--cluster",
                                                         "tcp://scheduler:8786"])
    assert args.workers == 100000  # its chunks: the cluster's workers are its own


# -- the compile cache ---------------------------------------------------------------------

def run_copy(copy, *args, env=None):
    """data_generator.py run from a copy of the package (its own compile cache), in that folder."""
    code = "import sys; from pipeline_sim.cli.generate import main; sys.exit(main(sys.argv[1:], 'data_generator.py'))"
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=copy, env=environment, capture_output=True,
                          text=True, timeout=300)


def notices(result):
    return [line for line in result.stderr.replace("\r", "\n").splitlines() if "compile" in line]


def test_a_damaged_compile_cache_is_compiled_again_with_one_line(tmp_path):
    shutil.copytree(ROOT / "pipeline_sim", tmp_path / "pipeline_sim")
    cache = tmp_path / "pipeline_sim" / "kernel" / "__pycache__"
    # the entry point a sweep loads and one function it calls: compiling them again on the rest of the cache takes
    # seconds, not the whole kernel's compile
    (data,) = cache.glob("loop.simulate_policies-*.1.nbc")
    data.write_bytes(bytes(range(256)) * 16)  # garbage in a data file (fixed: random bytes vary the error's type)
    (index,) = cache.glob("figures.figures-*.nbi")
    index.write_bytes(index.read_bytes()[:20])  # a truncated index
    first = run_copy(tmp_path, "-c", str(QUICK), "-o", "a.csv", "--step", "0.5")
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    (notice,) = notices(first)
    assert re.fullmatch(r"the compile cache was damaged \(\w+\); the kernel was compiled again and its cache "
                        r"rewritten", notice), notice
    assert len(index.read_bytes()) > 20 and len(data.read_bytes()) != 4096  # both rewritten
    second = run_copy(tmp_path, "-c", str(QUICK), "-o", "b.csv", "--step", "0.5")
    assert second.returncode == 0 and notices(second) == [], second.stderr
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()


def test_a_damaged_cache_entry_of_the_noise_draw_is_compiled_again_with_one_line(tmp_path):
    shutil.copytree(ROOT / "pipeline_sim", tmp_path / "pipeline_sim")
    (data,) = (tmp_path / "pipeline_sim" / "kernel" / "__pycache__").glob("draws.uniforms-*.1.nbc")
    data.write_bytes(bytes(range(256)) * 16)
    noisy = tmp_path / "noisy.json"
    noisy.write_text(json.dumps({"n": 8, "num_gpus": 4, "compute_jitter": 0.2, "samples": 3}))
    first = run_copy(tmp_path, "-c", str(noisy), "-o", "a.csv", "--step", "0.5")
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    (notice,) = notices(first)
    assert notice.startswith("the compile cache was damaged"), notice
    second = run_copy(tmp_path, "-c", str(noisy), "-o", "b.csv", "--step", "0.5")
    assert second.returncode == 0 and notices(second) == [], second.stderr
    rows = (tmp_path / "a.csv").read_bytes()
    assert rows.count(b"\n") > 10 and rows == (tmp_path / "b.csv").read_bytes()


def test_a_cache_kept_for_callers_but_not_for_the_function_they_call_is_compiled_again(tmp_path):
    """The loop's code removed from the cache by hand, its callers' kept: they call it at its address, which no
    cached code gives any more, so they are compiled again with it, where loading them would crash the process."""
    shutil.copytree(ROOT / "pipeline_sim", tmp_path / "pipeline_sim")
    cache = tmp_path / "pipeline_sim" / "kernel" / "__pycache__"
    removed = list(cache.glob("loop.advance-*"))
    assert removed and list(cache.glob("loop.simulate_policies-*.nbi"))
    for path in removed:
        path.unlink()
    first = run_copy(tmp_path, "-c", str(QUICK), "-o", "a.csv", "--step", "0.5")
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    assert list(cache.glob("loop.advance-*.nbi"))  # written anew
    second = run_copy(tmp_path, "-c", str(QUICK), "-o", "b.csv", "--step", "0.5")
    assert second.returncode == 0, second.stderr
    rows = (tmp_path / "a.csv").read_bytes()
    assert rows.count(b"\n") > 10 and rows == (tmp_path / "b.csv").read_bytes()


def test_no_writable_compile_cache_compiles_in_a_temporary_one(tmp_path):
    shutil.copytree(ROOT / "pipeline_sim", tmp_path / "pipeline_sim", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "pipeline_sim" / "kernel" / "__pycache__").write_text("")  # no folder can be made there, even by root
    (tmp_path / "home").write_text("")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    result = run_copy(tmp_path, "-c", str(QUICK), "-o", "a.csv", "--step", "0.5",
                      env={"XDG_CACHE_HOME": str(tmp_path / "home"), "TMPDIR": str(temporary)})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    (line,) = notices(result)
    assert "no writable compile cache" in line and "the kernel is compiled for this run only" in line
    assert not list(temporary.iterdir())  # the temporary cache went with the run


# -- every input, one clear line ------------------------------------------------------------

@pytest.mark.parametrize("text, fragment", [
    ('{"fwd_len": {"start": 1, "stop": Infinity, "step": 1}}', "config key 'fwd_len' stop: inf is not a finite"),
    ('{"fwd_len": {"start": -Infinity, "stop": 1, "step": 1}}', "config key 'fwd_len' start: -inf is not a finite"),
    ('{"fwd_len": {"start": 1, "stop": 2, "step": Infinity}}', "config key 'fwd_len' step: inf is not a finite"),
    ('{"fwd_len": {"start": NaN, "stop": 2, "step": 1}}', "config key 'fwd_len' start: nan is not a finite number"),
    ('{"fwd_len": NaN}', "config key 'fwd_len'"),
    ('{"n": 1e20}', "config key 'n': 1e+20 is not an integer (at most 2^53)"),
    ('{"n": 8, "n": 16}', "config key 'n' is given twice"),
    ("[" * 100_000, "JSON nested too deeply"),
    ('{"fwd_len": 1e308}', "fwd_len = 1e+308: must be a finite number from 1e-12 to 1e+09"),
])
def test_config_mistakes_get_one_line(tmp_path, text, fragment):
    (tmp_path / "bad.json").write_text(text)
    result = run_here("data_generator.py", "-c", "bad.json", "-o", "x.csv", cwd=tmp_path)
    assert_one_line_error(result, fragment)


def test_an_endless_config_is_not_read_whole(tmp_path):
    (tmp_path / "huge.json").write_bytes(b" " * (11 * 2 ** 20))
    assert_one_line_error(run_here("data_generator.py", "-c", "huge.json", "-o", "x.csv", cwd=tmp_path),
                          "larger than 10 MB")
    (tmp_path / "adir").mkdir()
    assert_one_line_error(run_here("data_generator.py", "-c", "adir", "-o", "x.csv", cwd=tmp_path),
                          "config adir: is a folder")


def test_accepted_values_give_finite_validated_results():
    from pipeline_sim.validate import validate_schedule

    for kwargs in ({"fwd_len": 1e9, "bwd_len": 1e-6}, {"prop_len": 1e9, "sync_base_len": 1e-6},
                   {"priorities": {"fwd_prop": 1e-6, "grad_prop": 1.0, "grad_sync": 1e-6}},
                   {"ingress_capacity": 1e-6}, {"ingress_capacity": 1e6}):
        schedule = calculate_full_pipeline_schedule(**kwargs)
        assert np.isfinite(schedule.completion_time) and schedule.completion_time > 0
        assert validate_schedule(schedule) == []


def test_numpy_integers_are_integers():
    params = EnvParams(n=np.int64(8), num_gpus=np.int32(4), fwd_len=np.float32(1.0))
    assert params == EnvParams() and type(params.n) is int and type(params.fwd_len) is float
    assert calculate_full_pipeline_schedule(n=np.int64(8), sample=np.int64(0)).completion_time > 0


def test_the_library_refuses_what_the_command_line_refuses():
    for kwargs, fragment in (({"n": 10 ** 7}, "n = 10000000: on 4 GPUs gives about 240,000,004 tasks"),
                             ({"n": 10 ** 30}, "n = 10000000000000000000000000000"),
                             ({"n": 10_000, "num_gpus": 100}, "allow_large=True to try anyway"),
                             ({"sample": 2 ** 70}, "sample = 1180591620717411303424: must be an integer from 0 to "
                                                   "2^63 - 1"),
                             ({"exclusive_tiers": "a"}, "exclusive_tiers = 'a': must be a mapping"),
                             ({"priorities": [0.5]}, "priorities = [0.5]: must be a mapping")):
        started = time.monotonic()
        with pytest.raises(ParameterError, match=re.escape(fragment)):
            calculate_full_pipeline_schedule(**kwargs)
        assert time.monotonic() - started < 1.0, kwargs
    assert calculate_full_pipeline_schedule(n=64, num_gpus=8, allow_large=True).completion_time > 0


@pytest.mark.parametrize("width", [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                   np.uint8, np.uint64])
def test_numpy_scalars_of_every_width_are_numbers(width):
    one = width(1)
    integers = {"n": width(8), "num_gpus": width(4), "seed": width(3), "sample": width(2)} \
        if np.issubdtype(width, np.integer) else {"seed": 3, "sample": 2}
    schedule = calculate_full_pipeline_schedule(**integers, fwd_len=one, ingress_capacity=one, compute_jitter=0.1,
                                                priorities={"fwd_prop": one, "grad_prop": one})
    assert schedule.completion_time == calculate_full_pipeline_schedule(
        seed=3, sample=2, compute_jitter=0.1, priorities={"fwd_prop": 1.0, "grad_prop": 1.0}).completion_time
    assert Policy(priorities={"fwd_prop": np.float32(0.5)}).priorities == {"fwd_prop": 0.5}


def test_a_seed_anywhere_in_its_domain_is_accepted_from_a_config(tmp_path):
    config = write_config(tmp_path, {"n": 4, "compute_jitter": 0.1, "seed": [0, 2 ** 63 - 1]})
    result = run_here("data_generator.py", "-c", str(config), "-o", "s.csv", "--step", "0.5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f",{2 ** 63 - 1}," in (tmp_path / "s.csv").read_text()
    config = write_config(tmp_path, {"seed": 2 ** 63})
    assert_one_line_error(run_here("data_generator.py", "-c", str(config), "-o", "t.csv", cwd=tmp_path),
                          "seed = 9223372036854775808: must be an integer from 0 to 2^63 - 1")


def test_a_derived_length_out_of_range_names_what_the_user_gave(tmp_path):
    result = run_here("schedule_visualizer_single_channel.py", "--model", "gpt3-175b", "--num-gpus", "8",
                        "--tensor-parallel", "8", "--p2p-bandwidth", "1e-12", "--no-show", cwd=tmp_path)
    assert_one_line_error(result, "--p2p-bandwidth: p2p_bandwidth = 1e-12: gives prop_len = 6.29e+09 s")
    tiny = {"layers": 2, "hidden": 128, "heads": 4, "ffn_hidden": 512, "vocab": 1000, "seq_len": 64}
    config = write_config(tmp_path, {"model": tiny, "gpu": {"tflops": 1e9, "memory_gb": 80}, "num_gpus": 2,
                                     "global_batch_size": 8})
    result = run_here("data_generator.py", "-c", str(config), "-o", "w.csv", cwd=tmp_path)
    assert_one_line_error(result, "model = 'layers=2 hidden=128", "gives fwd_len = 7.09e-14 s with this gpu",
                          "outside 1e-12 to 1e+09 s")


def quick_rows():
    return (ROOT / "tests" / "data" / "quick_step0.5.csv").read_text().splitlines(keepends=True)


def with_cell(rows, row, column, value):
    header = rows[0].rstrip("\n").split(",")
    cells = rows[row].rstrip("\n").split(",")
    cells[header.index(column)] = value
    return rows[:row] + [",".join(cells) + "\n"] + rows[row + 1:]


def sorted_by(rows, column):
    """The rows of a CSV sorted by one column's numbers, as a reader looking for the best one sorts them."""
    index = rows[0].rstrip("\n").split(",").index(column)
    return [rows[0], *sorted(rows[1:], key=lambda row: float(row.rstrip("\n").split(",")[index]))]


def without_column(rows, column):
    index = rows[0].rstrip("\n").split(",").index(column)
    return ["".join(",".join(cells[:index] + cells[index + 1:]) + "\n")
            for cells in (row.rstrip("\n").split(",") for row in rows)]


@pytest.mark.parametrize("name, lines, fragment", [
    ("no_fwd.csv", lambda rows: "".join(without_column(rows, "fwd_len")), "lacks the environment column fwd_len;"),
    ("no_schedule.csv", lambda rows: "".join(without_column(rows, "schedule")), "lacks the environment column "
                                                                                 "schedule;"),
    ("half.csv", lambda rows: "".join(with_cell(rows, 9, "n", "8.5")), "line 10 has n = 8.5; must be an integer"),
    ("blank.csv", lambda rows: "".join(with_cell(rows, 4, "bwd_len", "")), "line 5 has bwd_len = an empty cell"),
    ("text.csv", lambda rows: "".join(with_cell(rows, 3, "prio_fwd_prop", "high")),
     "line 4 has prio_fwd_prop = 'high'; must be a number"),
    ("chunks.csv", lambda rows: "".join(with_cell(with_cell(rows, 1, "schedule", "interleaved-1f1b"), 1, "chunks",
                                                  "")), "line 2 has chunks = an empty cell; schedule "
                                                        "interleaved-1f1b reads it"),
    ("name.csv", lambda rows: "".join(with_cell(rows, 6, "schedule", "1f1x")),
     "line 7 has schedule = '1f1x'; did you mean '1f1b'? It must be one of gpipe"),
    ("grid.csv", lambda rows: "".join(with_cell(with_cell(rows, 2, "prio_fwd_prop", "0.3"), 2, "prio_grad_prop",
                                                "0.7")), "has prio_fwd_prop = 0.3 at line 3, off its policy grid"),
    ("torn.csv", lambda rows: "".join(rows)[:3000], "its last line is cut (no line end)"),
    ("one.csv", lambda rows: "".join(rows[:2]), "has 1 of the 26 policies of its grid; pass --skip-incomplete"),
    ("part.csv", lambda rows: "".join(rows[:20]), "has 19 of the 37 policies of its grid; pass --skip-incomplete"),
    # every environment whole, its rows apart: said so at once, not taken for a cut sweep
    ("sorted.csv", lambda rows: "".join(sorted_by(rows, "completion_time")),
     "are not together; a sweep writes each environment's rows in one run (was the CSV sorted or edited?)"),
    ("negative.csv", lambda rows: "".join(with_cell(rows, 5, "completion_time", "-3.0")),
     "line 6 has completion_time = -3; every time must be a finite number > 0"),
    ("infinite.csv", lambda rows: "".join(with_cell(rows, 7, "completion_time", "inf")),
     "line 8 has completion_time = inf"),
    ("out.csv.partial", lambda rows: "".join(rows), "is an unfinished sweep's partial file; finish the sweep with"),
])
def test_plot_heatmap_checks_what_it_reads(tmp_path, name, lines, fragment):
    (tmp_path / name).write_text(lines(quick_rows()))
    result = run_here("plot_heatmap.py", name, "-o", "maps", cwd=tmp_path)
    assert_one_line_error(result, fragment)
    assert not list((tmp_path / "maps").glob("*.png")) if (tmp_path / "maps").exists() else True


@pytest.mark.parametrize("column, value, fragment", [
    ("model", "gpt3-175x", "line 2 has model = 'gpt3-175x'; must be a preset's name or a custom model's fields"),
    ("gpu", "tflops=abc memory_gb=80", "line 2 has gpu = 'tflops=abc memory_gb=80'; must be a preset's name"),
    ("tensor_parallel", "2.5", "line 2 has tensor_parallel = 2.5; must be an integer"),
])
def test_plot_heatmap_names_a_garbled_workload_cell(tmp_path, column, value, fragment):
    config = write_config(tmp_path, {"model": "gpt3-175b", "num_gpus": 8, "tensor_parallel": 8,
                                     "global_batch_size": 16})
    made = run_here("data_generator.py", "-c", str(config), "-o", "w.csv", "--step", "0.5", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    rows = (tmp_path / "w.csv").read_text().splitlines(keepends=True)
    header = next(csv.reader([rows[0]]))
    cells = next(csv.reader([rows[1]]))
    cells[header.index(column)] = value
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    (tmp_path / "bad.csv").write_text(rows[0] + buffer.getvalue() + "".join(rows[2:]))
    assert_one_line_error(run_here("plot_heatmap.py", "bad.csv", "-o", "maps", cwd=tmp_path), fragment)


def test_plot_heatmap_reads_one_file_however_it_is_replaced(tmp_path, monkeypatch):
    """A file replaced between the check and the drawing (as --overwrite of a running sweep does) is not read
    half old, half new: the drawing reads the file it opened."""
    from pipeline_sim.cli import heatmap

    rows = quick_rows()
    (tmp_path / "in.csv").write_text("".join(rows))
    (tmp_path / "other.csv").write_text("".join(rows[:1] + rows[38:]))  # the second environment alone
    groups = heatmap.schedule_groups

    def replaced(summaries):
        os.replace(tmp_path / "other.csv", tmp_path / "in.csv")
        return groups(summaries)

    monkeypatch.setattr(heatmap, "schedule_groups", replaced)
    drawn = heatmap.write_heatmaps(tmp_path / "in.csv", tmp_path / "maps")
    assert len(drawn.heatmaps) == 2 and len(list((tmp_path / "maps").glob("*.png"))) == 2
    assert not (tmp_path / "maps" / heatmap.INCOMPLETE_MARKER).exists()


def test_an_interrupted_drawing_leaves_a_marker_and_no_temporary_files(tmp_path):
    config = write_config(tmp_path, {"n": [4, 6, 8, 10, 12, 14], "bwd_len": [1.0, 1.5, 2.0, 2.5, 3.0],
                                     "ingress_capacity": [0.5, 1.0]})
    made = run_here("data_generator.py", "-c", str(config), "-o", "many.csv", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    process = subprocess.Popen([sys.executable, str(ROOT / "plot_heatmap.py"), "many.csv", "-o", "maps", "--workers",
                                "2"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "maps").glob("n*.png")) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "INCOMPLETE.txt says the folder is not" in err.strip().splitlines()[-1]
    names = [path.name for path in (tmp_path / "maps").iterdir()]
    assert "INCOMPLETE.txt" in names and all(name.endswith(".png") and not name.startswith(".")
                                             for name in names if name != "INCOMPLETE.txt"), names
    assert not (tmp_path / "maps.lock").exists()
    again = run_here("plot_heatmap.py", "many.csv", "-o", "maps", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert not (tmp_path / "maps" / "INCOMPLETE.txt").exists() and len(list((tmp_path / "maps").iterdir())) == 60


def test_misleading_messages_are_gone(tmp_path):
    (tmp_path / "adir").mkdir()
    assert_one_line_error(run_here("plot_heatmap.py", "adir", cwd=tmp_path), "adir: is a folder")
    assert_one_line_error(run_here("data_generator.py", "-c", str(QUICK), "-o", "adir", cwd=tmp_path),
                          "adir is a folder; give the path of a file to write")
    config = interrupted_sweep(tmp_path)
    record = (tmp_path / "out.csv.partial.json").read_text()
    (tmp_path / "out.csv.partial.json").write_text(record[:10])
    result = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--resume", cwd=tmp_path)
    assert_one_line_error(result, "out.csv.partial.json is damaged, so which sweep wrote out.csv.partial is unknown")
    (tmp_path / "out.csv.partial.json").unlink()
    result = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--resume", cwd=tmp_path)
    assert_one_line_error(result, "out.csv.partial has lost its record out.csv.partial.json")
    other = write_config(tmp_path, {"n": [4, 5]}, "other.json")
    (tmp_path / "out.csv.partial.json").write_text(record)
    result = run_here("data_generator.py", "-c", str(other), "-o", "out.csv", "--resume", cwd=tmp_path)
    assert_one_line_error(result, "out.csv.partial was written from another grid (its config has changed since, or "
                                  "is another file of that name); pass --overwrite to discard it")
    # another setting is named, with the run's own, and how to continue
    result = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--resume", "--step", "0.5",
                      "--samples", "2", cwd=tmp_path)
    assert_one_line_error(result, "out.csv.partial was written with --step 0.1 (this run: 0.5), with --samples 1 "
                                  "(this run: 2); rerun with its settings and --resume to continue it")
    result = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--step", "0.5", cwd=tmp_path)
    assert_one_line_error(result, "out.csv.partial holds rows of another sweep, written with --step 0.1 (this run: "
                                  "0.5); pass --overwrite")


def test_an_interrupt_as_the_kernel_loads_says_how_to_continue(tmp_path, monkeypatch):
    """Stopped after the banner, before any row: the same line as a sweep stopped later, and --resume continues the
    sweep it made (not "nothing to resume")."""
    from pipeline_sim.cli import generate

    def stopped(**_):
        raise KeyboardInterrupt

    config = write_config(tmp_path, {"n": [4, 6]})
    monkeypatch.setattr(generate, "ready_kernel", stopped)
    result = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--step", "0.5", cwd=tmp_path)
    assert result.returncode == 130
    assert re.fullmatch(r"data_generator\.py: interrupted after 0 of 74 simulations; rows kept in out\.csv\.partial; "
                        rf"to continue: python \S+data_generator\.py -c {re.escape(str(config))} -o out\.csv --step "
                        r"0\.5 --resume", result.stderr.strip().splitlines()[-1]), result.stderr
    monkeypatch.undo()
    resumed = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", "--step", "0.5", "--resume",
                       cwd=tmp_path)
    assert resumed.returncode == 0 and "nothing to resume" not in resumed.stdout, resumed.stdout
    assert (tmp_path / "out.csv").read_text().count("\n") == 2 * 37 + 1


def test_a_reader_that_stops_early_ends_the_run_quietly(tmp_path):
    process = subprocess.Popen([sys.executable, str(ROOT / "data_generator.py"), "-c", str(QUICK), "-o", "q.csv",
                                "--step", "0.5"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert "simulations on" in process.stdout.readline()
    process.stdout.close()  # as `| head -1` does
    err = process.stderr.read()
    process.wait(timeout=60)
    assert process.returncode == 0 and "error" not in err.lower(), err
    assert (tmp_path / "q.csv").read_text().count("\n") == 2 * 37 + 1


def test_plot_heatmap_can_draw_the_complete_environments_and_name_the_others(tmp_path):
    rows = quick_rows()
    (tmp_path / "cut.csv").write_text("".join(rows[:1] + rows[1:38] + rows[38:60]))  # the second environment cut
    result = run_here("plot_heatmap.py", "cut.csv", "-o", "maps", "--skip-incomplete", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(list((tmp_path / "maps").glob("*.png"))) == 1
    assert "left out 1 incomplete environment: n8_gpus4_sf4_" in result.stdout
    assert "(has 22 of the 37 policies of its grid)" in result.stdout


@pytest.mark.parametrize("value, shown", [("-1e-5", "-1e-05"), ("-inf", "-inf"), ("-2", "-2.0"),
                                         ("-nan", "nan")])
def test_a_negative_number_is_a_value_to_check_not_an_unknown_flag(tmp_path, value, shown):
    result = run_here("schedule_visualizer_single_channel.py", "--fwd-len", value, "--no-show", cwd=tmp_path)
    assert_one_line_error(result, f"--fwd-len: fwd_len = {shown}: must be")


def test_counts_are_told_in_their_number():
    assert counted(1, "environment") == "1 environment"
    assert counted(2178, "simulation") == "2,178 simulations"
    assert counted(0, "more group") == "0 more groups"
    assert (counted(1, "policy", "policies"), counted(121, "policy", "policies")) == ("1 policy", "121 policies")


def test_an_interrupt_that_surfaces_as_a_system_error_is_an_interrupt(capsys):
    """Ctrl-C landing while numba calls back into Python (loading a cached kernel) comes out of that call as a
    SystemError raised from the interrupt, chained as often as the calls nest: still the one-line interrupt, 130."""
    from pipeline_sim.parallel import interrupt_behind

    def nested(depth):
        try:
            if depth == 0:
                raise KeyboardInterrupt
            nested(depth - 1)
        except BaseException as error:
            raise SystemError("<function _numba_unpickle> returned a result with an exception set") from error

    def body():
        nested(3)
        return 0

    assert run_command("x.py", body) == 130
    assert capsys.readouterr().err == "\nx.py: interrupted\n"
    with pytest.raises(SystemError):  # a SystemError of its own is no interrupt: it stays a traceback
        run_command("x.py", lambda: (_ for _ in ()).throw(SystemError("a bug")))
    assert interrupt_behind(ValueError("x")) is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_nobody_writes_is_refused_not_waited_on(tmp_path):
    """A sweep's CSV is a file: a pipe is refused at once. A config may come through a pipe (``-c <(...)``): one
    silent for ``PIPE_SECONDS`` is refused; one whose writer comes late is read."""
    from pipeline_sim.inputs import PIPE_SECONDS

    os.mkfifo(tmp_path / "pipe.csv")
    assert_one_line_error(run_script("plot_heatmap.py", "pipe.csv", cwd=tmp_path), "pipe.csv: not a regular file")
    start = time.monotonic()
    assert_one_line_error(run_script("data_generator.py", "-c", "pipe.csv", cwd=tmp_path),
                          f"config pipe.csv: cannot read it (a named pipe nothing wrote to within {PIPE_SECONDS:g} s)")
    assert time.monotonic() - start < PIPE_SECONDS + 60
    writer = subprocess.Popen(["sh", "-c", 'sleep 1; printf \'{"n": 2}\' > pipe.csv'], cwd=tmp_path)
    late = run_script("data_generator.py", "-c", "pipe.csv", "-o", "late.csv", cwd=tmp_path)
    writer.wait(timeout=60)
    assert late.returncode == 0, late.stderr
    assert (tmp_path / "late.csv").read_text().count("\n") == 1 + 121


def test_a_full_disk_says_what_to_do(capsys):
    import errno

    def body():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    assert run_command("x.py", body) == 2
    assert capsys.readouterr().err == \
        "x.py: error: No space left on device; free some space and run the command again\n"
    assert run_command("x.py", body, resumes=True) == 2  # a command that resumes says how
    assert capsys.readouterr().err == ("x.py: error: No space left on device; free some space and run the command "
                                       "again with --resume, to continue where it stopped\n")


def test_a_chart_of_a_look_ahead_run_shows_its_progress_on_a_terminal(tmp_path):
    """A look-ahead run apart says on a terminal how far it is, in tasks ended, and how long it has left at most
    (each decision runs the rest of the iteration: a task costs less the later it comes)."""
    code, out, seen = run_on_terminal("schedule_visualizer_single_channel.py", "--dispatch", "lookahead", "--schedule",
                                      "zb-h1", "--num-gpus", "8", "-n", "32", "--compute-jitter", "0.2", "--no-show",
                                      "-o", "chart.png", cwd=tmp_path)
    assert code == 0 and "completion time" in out, seen
    bars = re.findall(r"(\d+)%\|[^|]*\| ([\d,]+)/1,544 tasks ended \[[\d:]+, at most [\d:?]+ left\]", seen)
    assert bars, seen
    ended = [int(count.replace(",", "")) for _, count in bars]
    assert ended == sorted(ended) and all(abs(int(percent) - 100 * count / 1544) <= 1
                                          for (percent, _), count in zip(bars, ended)), bars
    assert (tmp_path / "chart.png").exists()


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM])
def test_a_chart_of_a_long_run_stops_at_once(tmp_path, sent):
    """A look-ahead run of hours is simulated apart, so that Ctrl-C or a kill stops the visualizer at once (compiled
    work does not return to the interpreter until it is done); it says so before it starts, and leaves nothing
    running."""
    import select

    process = start([ROOT / "schedule_visualizer_single_channel.py", "--dispatch", "lookahead", "--schedule", "zb-h1",
                     "--num-gpus", "32", "-n", "256", "--compute-jitter", "0.2", "--no-show", "-o", "chart.png"],
                    tmp_path)
    deadline, before = time.monotonic() + 180, [""]  # the kernel may first be compiled, saying so on stderr
    try:
        while time.monotonic() < deadline and not before[-1].startswith("simulating:"):
            if select.select([process.stderr], [], [], 1)[0]:
                before.append(process.stderr.readline())
                assert before[-1], "the visualizer ended before it simulated"
        time.sleep(1)  # the run under way in its own process
        process.send_signal(sent)
        _, err = process.communicate(timeout=15)  # a hang fails here
    finally:
        process.kill()
    said = ("".join(before) + err).strip().splitlines()
    # on a busy machine the estimate says so (``busy_note``)
    assert before and re.fullmatch(r"simulating: up to about [\d.]+ hours \(by a slow day's estimate( on an idle "
                                   r"machine; this one is busy \(load [\d.]+ on \d+ cores\))?\)\n", before[-1]), said
    assert process.returncode == (130 if sent == signal.SIGINT else 143)
    assert said[-1] == \
        f"schedule_visualizer_single_channel.py: {'interrupted' if sent == signal.SIGINT else 'terminated'}"
    assert not (tmp_path / "chart.png").exists()
    ps = subprocess.run(["ps", "-eo", "ppid"], capture_output=True, text=True).stdout.split()
    assert str(process.pid) not in ps  # no worker left behind


def test_a_full_disk_while_the_sweeps_record_is_written_leaves_nothing_and_names_the_record(tmp_path, monkeypatch):
    import errno

    from pipeline_sim import sweep as sweeping
    from pipeline_sim.config import EnvironmentGrid

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sweeping.json, "dump", full)
    plan = sweeping.SweepPlan(EnvironmentGrid.from_mapping({"n": 4}), step=0.5)
    with pytest.raises(OSError, match=r"cannot write .*out\.csv\.partial\.json: No space left on device"):
        next(sweeping.run_sweep(plan, tmp_path / "out.csv"))
    assert sorted(path.name for path in tmp_path.iterdir()) == []
