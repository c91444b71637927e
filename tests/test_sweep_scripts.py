"""data_generator.py, plot_heatmap.py and run_full_pipeline.py run as a user runs them (their answers to mistakes
checked in this process)."""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, assert_one_line_error, assert_png_drawn, run_here, run_on_terminal, run_script

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.cli.heatmap import INCOMPLETE_MARKER
from pipeline_sim.files import exclusive_writer
from pipeline_sim.metrics import schedule_metrics


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_full_pipeline_on_the_example_config(tmp_path):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    result = run_script("run_full_pipeline.py", "-c", "configs/example.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    csvs = list((tmp_path / "outputs" / "data").glob("example_*.csv"))
    assert len(csvs) == 1
    rows = read_rows(csvs[0])
    assert len(rows) == 2178
    assert len({(r["n"], r["sync_freq"], r["bwd_len"]) for r in rows}) == 18
    heatmaps = sorted((tmp_path / "outputs" / "heatmaps" / csvs[0].stem).glob("*.png"))
    assert len(heatmaps) == 18
    for path in heatmaps[::6]:
        assert_png_drawn(path, min_width=1200, min_height=700)
    assert "18 environments, 2,178 simulations (121 policies each)" in result.stdout
    assert str(csvs[0].relative_to(tmp_path)) in result.stdout
    assert "best policy per environment (by n, sync_freq, bwd_len):" in result.stdout
    summary = [line for line in result.stdout.splitlines() if line.startswith("  n=")]
    assert len(summary) == 18  # one best policy per environment
    first = rows[0]
    direct = calculate_full_pipeline_schedule(n=8, sync_freq=1, bwd_len=2.0,
                                              priorities={"fwd_prop": 0.0, "grad_prop": 0.0, "grad_sync": 1.0})
    assert first["policy"] == "F0 G0 S1" and float(first["completion_time"]) == direct.completion_time
    best = min(rows[:121], key=lambda r: float(r["completion_time"]))
    assert f"-> {best['policy']}" in result.stdout


def test_generator_is_deterministic_across_workers(tmp_path):
    config = tmp_path / "small.json"
    config.write_text(json.dumps({"n": [4, 6], "num_gpus": 3}))
    outputs = []
    for workers in ("1", "2"):
        output = tmp_path / f"w{workers}.csv"
        result = run_script("data_generator.py", "--config", str(config), "--workers", workers, "--step", "0.2",
                            "--output", str(output), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "2 environments x 61 policies = 122 simulations" in result.stdout
        outputs.append(output.read_bytes())
    assert outputs[0] == outputs[1]


def test_default_output_name_and_simulator_column(tmp_path):
    config = tmp_path / "tiny.json"
    config.write_text('{"n": 2, "num_gpus": 2}')
    result = run_script("data_generator.py", "-c", str(config), "--step", "1", "--simulator", "dual_channel",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (output,) = (tmp_path / "outputs" / "data").glob("tiny_*.csv")
    rows = read_rows(output)
    assert len(rows) == 31 and {r["simulator"] for r in rows} == {"dual_channel"}


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_generator_resumes_to_identical_bytes(tmp_path, how):
    config = tmp_path / "long.json"
    config.write_text(json.dumps({"n": [16, 24], "sync_freq": [1, 2, 3, 4, 5, 6]}))
    reference = tmp_path / "reference.csv"
    assert run_script("data_generator.py", "-c", str(config), "-o", str(reference), cwd=tmp_path).returncode == 0

    output = tmp_path / "out.csv"
    partial = tmp_path / "out.csv.partial"
    command = [sys.executable, str(ROOT / "data_generator.py"), "-c", str(config), "-o", str(output)]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not partial.exists() or partial.read_bytes().count(b"\n") < 200):
        time.sleep(0.02)
    process.send_signal(how)
    _, stderr = process.communicate(timeout=60)
    assert not output.exists(), "the sweep finished before it could be interrupted"
    if how == signal.SIGINT:
        assert process.returncode == 130
        last = stderr.strip().splitlines()[-1]
        assert "interrupted after" in last and "--resume" in last and "Traceback" not in stderr
    kept = partial.read_bytes()
    assert reference.read_bytes().startswith(kept[:kept.rfind(b"\n") + 1])

    resumed = run_script("data_generator.py", "-c", str(config), "-o", str(output), "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming:" in resumed.stdout
    assert output.read_bytes() == reference.read_bytes()
    assert not partial.exists()


def test_full_pipeline_resumes_the_newest_partial(tmp_path):
    config = tmp_path / "resume.json"
    config.write_text(json.dumps({"n": [16, 24], "sync_freq": [1, 2, 3, 4]}))
    command = [sys.executable, str(ROOT / "run_full_pipeline.py"), "-c", str(config)]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    partials = []
    while time.monotonic() < deadline:
        partials = list((tmp_path / "outputs" / "data").glob("resume_*.csv.partial"))
        if partials and partials[0].read_bytes().count(b"\n") > 150:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=60)
    assert process.returncode == 130
    result = run_script("run_full_pipeline.py", "-c", str(config), "--resume", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "resuming: " in result.stdout
    (final,) = (tmp_path / "outputs" / "data").glob("resume_*.csv")
    assert final.name == partials[0].name.removesuffix(".partial")
    assert len(read_rows(final)) == 8 * 121
    assert len(list((tmp_path / "outputs" / "heatmaps" / final.stem).glob("*.png"))) == 8


def test_full_pipeline_resume_draws_what_a_stopped_run_left_undrawn(tmp_path, monkeypatch):
    """Stopped after its CSV was complete, before or while its figures were drawn: the folder says so from the
    moment the sweep ends, the interrupt says how to draw them, and --resume draws them from that CSV without
    simulating again; a CSV of another step is not taken for it."""
    from pipeline_sim.cli import heatmap

    config = tmp_path / "d.json"
    config.write_text(json.dumps({"n": [4, 6]}))
    reading = heatmap.environments

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(heatmap, "environments", interrupted)
    stopped = run_here("run_full_pipeline.py", "-c", str(config), "--step", "0.5", cwd=tmp_path)
    (csv,) = (tmp_path / "outputs" / "data").glob("d_*.csv")
    folder = tmp_path / "outputs" / "heatmaps" / csv.stem
    assert stopped.returncode == 130
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"run_full_pipeline.py: interrupted while the file was read, before any figure was drawn; draw them all with "
        f"plot_heatmap.py outputs/data/{csv.name} -o outputs/heatmaps/{csv.stem}")
    assert [path.name for path in folder.iterdir()] == [heatmap.INCOMPLETE_MARKER]
    monkeypatch.setattr(heatmap, "environments", reading)
    rows = csv.read_bytes()
    # none of these is that sweep: another step, as many rows of another samples setting, another config whose
    # name begins with this one's, another config of the same name elsewhere
    (tmp_path / "d_v2.json").write_text(json.dumps({"n": [4, 6]}))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "d.json").write_text(json.dumps({"n": [8, 10]}))
    for others in (("-c", str(config), "--step", "1.0"), ("-c", str(config), "--step", "0.5", "--samples", "3"),
                   ("-c", "d_v2.json", "--step", "0.5"), ("-c", "elsewhere/d.json", "--step", "0.5")):
        other = run_here("run_full_pipeline.py", *others, "--resume", cwd=tmp_path)
        assert other.returncode == 0 and "nothing to resume" in other.stdout, (others, other.stderr)
    resumed = run_here("run_full_pipeline.py", "-c", str(config), "--step", "0.5", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming: the sweep of outputs/data/{csv.name} is complete" in resumed.stdout
    assert "figure/s" in resumed.stderr and not re.search(r"/[\d,]+ sim\b", resumed.stderr)  # no sweep's bar
    assert csv.read_bytes() == rows and len(list((tmp_path / "outputs" / "data").glob("d_*.csv"))) == 5
    assert sorted(path.suffix for path in folder.iterdir()) == [".png", ".png"]  # the marker gone
    again = run_here("run_full_pipeline.py", "-c", str(config), "--step", "0.5", "--resume", cwd=tmp_path)
    assert "nothing to resume" in again.stdout  # its figures all drawn now


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_full_pipeline_resume_finds_a_sweep_by_its_record(tmp_path, fmt):
    """Without -o, --resume finds the newest unfinished sweep of its config by the partial's record, which is
    written first and removed last: a partial file or Parquet folder, and an output whose cleanup was cut short
    (nothing named .partial is left, and the resume finishes the cleanup instead of running the sweep again)."""
    from pipeline_sim.config import EnvironmentGrid
    from pipeline_sim.files import file_digest
    from pipeline_sim.sweep import SweepPlan, partial_paths, run_sweep

    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    config = tmp_path / "q.json"
    config.write_text(json.dumps({"n": [4, 6]}))
    plan = SweepPlan(EnvironmentGrid.load(config), step=0.5, format=fmt)
    data = tmp_path / "outputs" / "data"
    command = ("run_full_pipeline.py", "-c", str(config), "--priority_step", "0.5", "--format", fmt, "--resume")
    interrupted = data / f"q_20260101-000000.{fmt}"
    progress = run_sweep(plan, interrupted, workers=1)
    assert next(progress) == 0 and next(progress) == 37  # one environment of two
    progress.close()
    result = run_script(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"resuming: 37 rows already in outputs/data/{interrupted.name}.partial" in result.stdout
    assert interrupted.is_file() and not partial_paths(interrupted)[1].exists()
    cut_short = data / f"q_20260101-000001.{fmt}"
    list(run_sweep(plan, cut_short, workers=1))
    partial_paths(cut_short)[1].write_text(json.dumps({"fingerprint": plan.fingerprint(), "output": str(cut_short),
                                                       "complete": file_digest(cut_short)}))
    before = cut_short.read_bytes()
    result = run_script(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"outputs/data/{cut_short.name} is already complete; removed what its sweep left behind" in result.stdout
    assert cut_short.read_bytes() == before and not partial_paths(cut_short)[1].exists()
    assert sorted(path.name for path in data.iterdir()) == [interrupted.name, cut_short.name]


def test_full_pipeline_resume_names_the_settings_of_an_unfinished_sweep_it_cannot_continue(tmp_path, monkeypatch):
    """--resume under other settings than an unfinished sweep of its config was written with (another step, samples
    setting or format) stops in one line that names them, rather than start a new sweep beside it; a sweep whose
    figures were stopped is still drawn, and a sweep of another grid of that name is not taken for it."""
    from pipeline_sim.cli import heatmap
    from pipeline_sim.config import EnvironmentGrid
    from pipeline_sim.sweep import SweepPlan, run_sweep

    config = tmp_path / "q.json"
    config.write_text(json.dumps({"n": [4, 6]}))
    data = tmp_path / "outputs" / "data"
    interrupted = data / "q_20260101-000000.csv"
    progress = run_sweep(SweepPlan(EnvironmentGrid.load(config), step=0.5, samples=2), interrupted, workers=1)
    assert next(progress) == 0 and next(progress) == 37
    progress.close()
    result = run_here("run_full_pipeline.py", "-c", str(config), "--resume", cwd=tmp_path)
    assert_one_line_error(result, "outputs/data/q_20260101-000000.csv.partial is an unfinished sweep of q.json written "
                                  "with --step 0.5 (this run: 0.1), with --samples 2 (this run: 1); rerun with its "
                                  "settings and --resume to continue it, or without --resume to start another")
    assert sorted(path.name for path in data.iterdir()) == [f"{interrupted.name}.partial",
                                                           f"{interrupted.name}.partial.json"]
    result = run_here("run_full_pipeline.py", "-c", str(config), "--priority_step", "0.5", "--samples", "2",
                      "--format", "parquet", "--resume", cwd=tmp_path)
    assert_one_line_error(result, "is an unfinished sweep of q.json written with --format csv (this run: parquet)")
    # a whole sweep at another step, its figures stopped: --resume at that step draws them, the other one aside
    reading = heatmap.environments

    def interrupted_drawing(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(heatmap, "environments", interrupted_drawing)
    assert run_here("run_full_pipeline.py", "-c", str(config), "--step", "1", cwd=tmp_path).returncode == 130
    monkeypatch.setattr(heatmap, "environments", reading)
    drawn = run_here("run_full_pipeline.py", "-c", str(config), "--step", "1", "--resume", cwd=tmp_path)
    assert drawn.returncode == 0 and "resuming: the sweep of outputs/data/q_" in drawn.stdout, drawn.stderr
    resumed = run_here("run_full_pipeline.py", "-c", str(config), "--priority_step", "0.5", "--samples", "2",
                       "--resume", cwd=tmp_path)
    assert resumed.returncode == 0 and "resuming: 37 rows already in" in resumed.stdout, resumed.stderr
    progress = run_sweep(SweepPlan(EnvironmentGrid.load(config), step=0.5), data / "q_20260101-000001.csv",
                         workers=1)
    assert next(progress) == 0 and next(progress) == 37
    progress.close()
    config.write_text(json.dumps({"n": [8, 10]}))  # another grid of that name: its sweep is not this one's
    fresh = run_here("run_full_pipeline.py", "-c", str(config), "--priority_step", "0.5", "--resume", cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert "nothing to resume for this config; starting a new sweep beside outputs/data/q_20260101-000001.csv.partial" \
           ", an unfinished sweep of another grid named q.json (edited since, or another file: put it back to resume " \
           "that one, or remove it)" in fresh.stdout


@pytest.mark.parametrize("content, fragments", [
    (None, ["no such file"]),
    ('{"n": [8, 16],\n "fwd_len": [1.0,]}', ["invalid JSON at line 2, column 18"]),
    ('{"m": 8}', ["unknown key 'm'", "valid keys: n, num_gpus, sync_freq"]),
    ('{"n": "8"}', ["config key 'n'", "'8' is not an integer"]),
    ('{"n": []}', ["config key 'n'", "empty list"]),
    ('{"bwd_len": {"start": 2, "stop": 3, "step": 0}}', ["config key 'bwd_len'", "step 0.0 must be > 0"]),
    ('{"bwd_len": {"start": 3, "stop": 2, "step": 0.5}}', ["config key 'bwd_len'", "stop 2.0 is below start 3.0"]),
    ('{"bwd_impact": 1.0}', ["config key 'bwd_impact'", "bwd_impact = 1.0", "0 <= x < 1"]),
    ('{"ingress_capacity": -1}', ["ingress_capacity = -1.0", "1e-06 <= x <= 1e+06"]),
    ("[]", ["top level must be a JSON object"]),
])
def test_generator_config_mistakes(tmp_path, content, fragments):
    config = tmp_path / "config.json"
    if content is not None:
        config.write_text(content)
    result = run_here("data_generator.py", "-c", str(config), "-o", "out.csv", cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "out.csv.partial").exists()


@pytest.mark.parametrize("args, fragments", [
    (["--step", "0.3"], ["step = 0.3", "does not divide 1"]),
    (["--step", "0"], ["step = 0.0"]),
    (["--workers", "0"], ["--workers", "must be >= 1"]),
    (["--simulator", "quad"], ["--simulator", "invalid choice"]),
    (["-o", "blocker/out.csv"], ["cannot write blocker/out.csv"]),
])
def test_generator_argument_mistakes(tmp_path, args, fragments):
    (tmp_path / "blocker").write_text("a file, not a folder")
    (tmp_path / "config.json").write_text("{}")
    result = run_here("data_generator.py", "-c", "config.json", *args, cwd=tmp_path)
    assert_one_line_error(result, *fragments)


def test_full_pipeline_step_mistake(tmp_path):
    result = run_here("run_full_pipeline.py", "-c", str(ROOT / "configs" / "quick.json"), "--priority_step",
                        "0.15", cwd=tmp_path)
    assert_one_line_error(result, "step = 0.15")


def test_plot_heatmap_default_folder_and_readable_steps(tmp_path):
    config = tmp_path / "c.json"
    config.write_text('{"n": 4, "num_gpus": 3, "sync_freq": [1, 2]}')
    for step in ("0.2", "0.05"):
        csv_path = tmp_path / f"s{step}.csv"
        assert run_script("data_generator.py", "-c", str(config), "--step", step, "-o", str(csv_path),
                          cwd=tmp_path).returncode == 0
        result = run_script("plot_heatmap.py", str(csv_path), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        pngs = sorted((tmp_path / "heatmaps_output").glob("*.png"))
        assert [p.name for p in pngs] == ["n4_gpus3_sf1_fwd1_bwd2_prop1_sync2_fi0.2_bi0.2_in1_1f1b.png",
                                          "n4_gpus3_sf2_fwd1_bwd2_prop1_sync2_fi0.2_bi0.2_in1_1f1b.png"]
        for png in pngs:
            assert_png_drawn(png, min_width=1200, min_height=700)
        shutil.rmtree(tmp_path / "heatmaps_output")


@pytest.mark.parametrize("content, fragments", [
    ("a,b\n1,2\n", ["lacks the generator's columns", "data_generator.py"]),
    ("", ["not a readable CSV"]),
    (None, ["no such file"]),
])
def test_plot_heatmap_rejects_other_csvs(tmp_path, content, fragments):
    path = tmp_path / "other.csv"
    if content is not None:
        path.write_text(content)
    result = run_here("plot_heatmap.py", str(path), "-o", "figures/of/maps", cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    assert sorted(tmp_path.iterdir()) == ([] if content is None else [path])  # no folder on the way, no lock


def test_plot_heatmap_rejects_a_cut_csv(tmp_path):
    config = tmp_path / "c.json"
    config.write_text('{"n": 3, "num_gpus": 2}')
    full = tmp_path / "full.csv"
    assert run_here("data_generator.py", "-c", str(config), "-o", str(full), cwd=tmp_path).returncode == 0
    lines = full.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.csv"
    cut.write_text("".join(lines[:40]))
    result = run_here("plot_heatmap.py", str(cut), cwd=tmp_path)
    assert_one_line_error(result, "has 39 rows, not a whole policy grid; pass --skip-incomplete")


def test_plot_heatmap_never_mixes_the_figures_of_two_files(tmp_path):
    for name, n, flag in (("a", 3, "--step"), ("b", 4, "--priority-step")):  # either name of the step
        (tmp_path / f"{name}.json").write_text(json.dumps({"n": n, "num_gpus": 2}))
        made = run_here("data_generator.py", "-c", f"{name}.json", "-o", f"{name}.csv", flag, "0.5", cwd=tmp_path)
        assert made.returncode == 0, made.stderr
    assert "1 environment x 37 policies" in made.stdout  # step 0.5, not the default 0.1
    assert run_here("plot_heatmap.py", "a.csv", "-o", "maps", cwd=tmp_path).returncode == 0
    (first,) = (tmp_path / "maps").iterdir()
    drawn = first.read_bytes()
    refused = run_here("plot_heatmap.py", "b.csv", "-o", "maps", cwd=tmp_path)
    assert_one_line_error(refused, "maps holds 1 .png file already; pass --overwrite to draw into it anyway")
    assert list((tmp_path / "maps").iterdir()) == [first] and first.read_bytes() == drawn
    # a stopped drawing of the same file is drawn again in full; another file's is refused
    (tmp_path / "maps" / INCOMPLETE_MARKER).write_text("The figures of a.csv are being drawn here")
    assert run_here("plot_heatmap.py", "a.csv", "-o", "maps", cwd=tmp_path).returncode == 0
    assert list((tmp_path / "maps").iterdir()) == [first]
    (tmp_path / "maps" / INCOMPLETE_MARKER).write_text("The figures of a.csv are being drawn here")
    refused = run_here("plot_heatmap.py", "b.csv", "-o", "maps", cwd=tmp_path)
    assert_one_line_error(refused, "maps holds the stopped drawing of another file (INCOMPLETE.txt)")
    with exclusive_writer(tmp_path / "maps"):  # not stopped: drawn right now by another run
        busy = run_script("plot_heatmap.py", "b.csv", "-o", "maps", cwd=tmp_path)
    assert_one_line_error(busy, f"another run (pid {os.getpid()}) is writing")
    (tmp_path / "maps" / INCOMPLETE_MARKER).unlink()
    (tmp_path / "maps" / "holiday.png").write_bytes(b"not ours")
    drawn_in = run_here("plot_heatmap.py", "b.csv", "-o", "maps", "--overwrite", cwd=tmp_path)
    assert drawn_in.returncode == 0, drawn_in.stderr
    assert len(list((tmp_path / "maps").iterdir())) == 3  # a.csv's, b.csv's and the user's file, kept
    assert (tmp_path / "maps" / "holiday.png").read_bytes() == b"not ours" and first.read_bytes() == drawn
    full = run_here("run_full_pipeline.py", "-c", "a.json", "--step", "0.5", cwd=tmp_path)  # its step's other name
    assert full.returncode == 0, full.stderr
    assert "1 environment, 37 simulations (37 policies each)" in full.stdout


@pytest.mark.parametrize("script, flags", [
    ("data_generator.py", ["--config", "--simulator", "--step", "--output", "--workers", "--resume"]),
    ("plot_heatmap.py", ["--output_dir", "--output-dir", "heatmaps_output", "--workers", "--overwrite"]),
    ("run_full_pipeline.py", ["--config", "--simulator", "--priority_step", "--workers", "--resume"]),
])
def test_help(tmp_path, script, flags):
    result = run_here(script, "--help", cwd=tmp_path)
    assert result.returncode == 0
    for flag in flags:
        assert flag in result.stdout


def test_schedules_config_through_the_pipeline(tmp_path):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    result = run_script("run_full_pipeline.py", "-c", "configs/schedules.json", "--priority_step", "0.5",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (output,) = (tmp_path / "outputs" / "data").glob("schedules_*.csv")
    rows = read_rows(output)
    policies = 6 + 9 + 9 + 13
    assert len(rows) == 6 * 4 * policies  # six schedules x four environments, each simulation once
    by_schedule = {r["schedule"]: r for r in rows}
    assert set(by_schedule) == {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v"}
    assert by_schedule["interleaved-1f1b"]["chunks"] == "2" and by_schedule["1f1b"]["chunks"] == ""
    assert by_schedule["dualpipe-v"]["fb_overlap"] == "0.0" and by_schedule["zb-h1"]["fb_overlap"] == ""
    assert by_schedule["gpipe"]["peak_activations"] == "8.0" and by_schedule["1f1b"]["peak_activations"] == "4.0"
    assert by_schedule["interleaved-1f1b"]["ideal_time"] == "28.5"
    for row in rows[::97]:
        direct = calculate_full_pipeline_schedule(
            schedule=row["schedule"], n=8, num_gpus=4, prop_len=float(row["prop_len"]),
            ingress_capacity=float(row["ingress_capacity"]),
            priorities={k: float(row[f"prio_{k}"]) for k in ("fwd_prop", "grad_prop", "grad_sync") if row[f"prio_{k}"]},
            exclusive_tiers={k: row[f"tier_{k}"] for k in ("fwd_prop", "grad_prop", "grad_sync") if row[f"tier_{k}"]})
        assert float(row["completion_time"]) == direct.completion_time
        assert float(row["max_span"]) == schedule_metrics(direct).max_span
    folder = tmp_path / "outputs" / "heatmaps" / output.stem
    comparisons = sorted(folder.glob("compare_*.png"))
    assert len(comparisons) == 4 and len(list(folder.glob("n8_*.png"))) == 24
    for path in comparisons:
        assert_png_drawn(path, min_width=1200, min_height=500)
    assert "best policy per schedule" in result.stdout
    for schedule in ("gpipe", "interleaved-1f1b v=2", "zb-h1 wf=0.5", "dualpipe-v wf=0.5 fbo=0"):
        assert schedule in result.stdout
    assert result.stdout.count(" * ") == 4  # one fastest schedule per environment


def test_invalid_schedule_combinations_are_reported_up_front(tmp_path):
    config = tmp_path / "mixed.json"
    config.write_text(json.dumps({"schedule": ["1f1b", "interleaved-1f1b", "dualpipe-v"], "n": [6, 8],
                                  "num_gpus": 4}))
    refused = run_here("data_generator.py", "-c", str(config), "--step", "1", cwd=tmp_path)
    assert_one_line_error(refused, "2 combinations of the grid cannot run", "schedule=interleaved-1f1b, n=6",
                          "multiple of num_gpus", "--skip-invalid")
    assert not (tmp_path / "outputs").exists()
    output = tmp_path / "out.csv"
    result = run_here("data_generator.py", "-c", str(config), "--step", "1", "--skip-invalid", "-o", str(output),
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "left out 2 combinations that cannot run (--skip-invalid), e.g. schedule=interleaved-1f1b, n=6, " \
           "num_gpus=4: n = 6: schedule interleaved-1f1b" in result.stdout
    assert [(r["schedule"], r["n"]) for r in read_rows(output)][::31] == [
        ("1f1b", "6"), ("1f1b", "8"), ("interleaved-1f1b", "8"), ("dualpipe-v", "8")]


def test_the_full_pipelines_summary_names_every_environment_and_what_ties(tmp_path):
    """An environment whose schedule has no other to compare with is listed on its own after the comparisons; a best
    policy that others tie with says so, and where the priorities change nothing no policy is called the best."""
    config = tmp_path / "mixed.json"
    config.write_text(json.dumps({"schedule": ["1f1b", "interleaved-1f1b"], "n": [6, 8], "num_gpus": 4,
                                  "prop_len": [0.0, 1.0]}))
    result = run_here("run_full_pipeline.py", "-c", str(config), "--step", "0.5", "--skip-invalid", "--workers", "1",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = result.stdout[result.stdout.index("best policy per schedule"):]
    alone = summary[summary.index("best policy of each environment with no other schedule to compare:"):]
    assert re.search(r"\n  n=6 +prop_len=0 +schedule=1f1b +-> any policy \(all 37 tie\) ", alone), alone
    assert re.search(r"\n  n=6 +prop_len=1 +schedule=1f1b +-> F \| G1 S0 \(and 2 tied\) ", alone), alone
    assert summary.count(" -> ") == 2 and "any policy (all 37 tie)" in summary[:summary.index(alone)]
    # the comparisons' columns line up down the list, whatever each group's longest label
    compared = [line for line in summary[:summary.index(alone)].splitlines() if line.startswith(("   * ", "     "))]
    assert len(compared) > 2 and len({line.index(" ideal ") for line in compared}) == 1, compared


def test_two_tables_of_one_file_name_get_figures_of_their_own(tmp_path):
    """Tables (or policy files) of one file name in two folders: the figures of each are numbered, none written over,
    and as many are on disk as the run says it drew."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        shutil.copy(ROOT / "configs" / "tables" / "1f1b.json", tmp_path / folder / "1f1b.json")
    config = tmp_path / "dup.json"
    config.write_text(json.dumps({"lengths": ["a/1f1b.json", "b/1f1b.json"], "dispatch": ["static", "greedy"],
                                  "compute_jitter": [0.0, 0.3], "samples": 3}))
    result = run_here("run_full_pipeline.py", "-c", str(config), "--step", "1", "--workers", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    drawn = re.search(r"\((\d+) heatmaps, (\d+) schedule comparisons, (\d+) dispatch figures, (\d+) robustness "
                      r"figures\)", result.stdout)
    assert drawn, result.stdout
    (folder,) = (tmp_path / "outputs" / "heatmaps").iterdir()
    kinds = ("compare_", "dispatch_", "robustness_")
    names = [path.name for path in folder.glob("*.png")]
    heatmaps = [name for name in names if not name.startswith(kinds)]
    assert [len(heatmaps), *(sum(name.startswith(kind) for name in names) for kind in kinds)] == \
        [int(count) for count in drawn.groups()] == [8, 4, 2, 4]
    assert sum(name.endswith("_2.png") for name in names) == 9  # one of each pair numbered


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_combination_left_out_is_never_simulated(tmp_path, workers):
    """--skip-invalid leaves out what the config's checks refuse beyond the schedule's requirements too (a memory
    limit the iteration cannot run within, a damaged policy file): the sweep writes the other rows."""
    policy = tmp_path / "flip.npz"
    policy.write_bytes(b"not an archive")
    config = tmp_path / "limits.json"
    config.write_text(json.dumps({"n": 8, "num_gpus": 4, "dispatch": ["greedy", f"learned:{policy}"],
                                  "memory_limit": [0.5, 4]}))
    output = tmp_path / "out.csv"
    result = run_here("data_generator.py", "-c", str(config), "--step", "1", "--skip-invalid", "-o", str(output),
                      "--workers", workers, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "left out 3 combinations" in result.stdout
    assert {(r["dispatch"], r["memory_limit"]) for r in read_rows(output)} == {("greedy", "4.0")}


def test_ignored_parameters_never_multiply_rows(tmp_path):
    config = tmp_path / "grid.json"
    config.write_text(json.dumps({"schedule": ["1f1b", "interleaved-1f1b", "zb-h1"], "chunks": [2, 3],
                                  "w_fraction": [0.25, 0.5], "n": 8, "num_gpus": 2}))
    output = tmp_path / "out.csv"
    result = run_script("data_generator.py", "-c", str(config), "--step", "1", "-o", str(output), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = read_rows(output)
    environments = [(r["schedule"], r["chunks"], r["w_fraction"]) for r in rows[::31]]
    assert environments == [("1f1b", "", ""), ("interleaved-1f1b", "2", ""), ("interleaved-1f1b", "3", ""),
                            ("zb-h1", "", "0.25"), ("zb-h1", "", "0.5")]


def test_jitter_config_through_the_pipeline(tmp_path):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    result = run_script("run_full_pipeline.py", "-c", "configs/jitter.json", "--samples", "6", "--priority_step",
                        "0.5", "--metric", "completion_p95", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "12 environments, 2,664 simulations (37 policies x 6 samples each)" in result.stdout
    (output,) = (tmp_path / "outputs" / "data").glob("jitter_*.csv")
    rows = read_rows(output)
    assert len(rows) == 12 * 37 and {r["samples"] for r in rows} == {"6"}
    noisy = [r for r in rows if r["compute_jitter"] != "0.0"]
    assert all(float(r["completion_min"]) <= float(r["completion_p95"]) <= float(r["completion_max"]) for r in noisy)
    assert any(float(r["completion_std"]) > 0 for r in noisy)
    assert all(r["completion_std"] == "0.0" for r in rows if r["compute_jitter"] == "0.0")
    folder = tmp_path / "outputs" / "heatmaps" / output.stem
    robustness = sorted(folder.glob("robustness_compute_jitter_*.png"))
    assert [p.name.rsplit("_in1_", 1)[1] for p in robustness] == ["1f1b.png", "zb-h1_wf0.5.png", "zb-v_wf0.5.png"]
    for path in robustness:
        assert_png_drawn(path, min_width=1000, min_height=500)
    assert len(list(folder.glob("compare_*.png"))) == 4  # one per jitter level
    assert "12 heatmaps, 4 schedule comparisons, 3 robustness figures" in result.stdout


def test_plot_heatmap_metric_needs_the_column(tmp_path):
    csv_path = ROOT / "tests" / "data" / "quick_step0.5.csv"
    result = run_here("plot_heatmap.py", str(csv_path), "--metric", "slowdown", "-o", "maps", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_png_drawn(next((tmp_path / "maps").glob("*.png")), min_width=1000, min_height=500)
    legacy = tmp_path / "legacy.csv"
    text = csv_path.read_text().splitlines()
    header = text[0].split(",")
    keep = [i for i, name in enumerate(header) if name != "completion_p95"]
    legacy.write_text("\n".join(",".join(line.split(",")[i] for i in keep) for line in text) + "\n")
    bad = run_here("plot_heatmap.py", str(legacy), "--metric", "completion_p95", cwd=tmp_path)
    assert_one_line_error(bad, "no column 'completion_p95'")


def test_the_progress_bar_shows_on_a_terminal_of_no_size(tmp_path):
    """A pseudo-terminal that reports 0 columns and 0 lines (as ``script`` makes, and some CI runners) gets a bar of
    80 columns, where tqdm would draw none: a long sweep is not silent there."""
    (tmp_path / "grid.json").write_text(json.dumps({"n": 4, "num_gpus": 2}))
    code, _, seen = run_on_terminal("data_generator.py", "-c", "grid.json", "-o", "out.csv", cwd=tmp_path,
                                    timeout=120)
    assert code == 0, seen
    bars = [line for line in seen.splitlines() if "121/121" in line]
    assert bars and all(len(line) == 80 for line in bars), seen
