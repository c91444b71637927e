"""Traces of real pipeline runs: reading them, replaying them through the engine, predicting from them."""

import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, assert_png_drawn, run_here, run_script

from pipeline_sim.engine import simulate
from pipeline_sim.measured import TraceError, fit_comm, read_run
from pipeline_sim.model import EnvParams, ParameterError, Policy
from pipeline_sim.replay import (
    RuntimeCosts,
    effective_lengths,
    predict,
    predicted_time,
    replay,
    runtime_costs,
    task_spread,
)
from pipeline_sim.taskgraph import compute_orders, lengths_of_table, task_lengths

TRACES = ROOT / "tests" / "data" / "traces"
SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v")


def _runs():
    """Every committed run of the two studies (the repeat has no ZB-H1)."""
    return [(schedule, folder) for root in (TRACES, ROOT / "tests" / "data" / "traces-repeat")
            for schedule in SCHEDULES if (root / schedule).is_dir() for folder in sorted((root / schedule).iterdir())]


@pytest.mark.parametrize("schedule, folder", _runs(), ids=lambda x: x if isinstance(x, str) else
                         f"{x.parent.parent.name}-{x.name}")
def test_each_committed_trace_reads_as_the_run_it_was(schedule, folder):
    run = read_run([folder])
    assert (run.schedule, run.ranks, run.microbatches, len(run.iterations)) == (schedule, 2, 8, 3)
    assert run.stages == (2 if schedule in ("1f1b", "gpipe", "zb-h1") else 4)
    for iteration in run.iterations:
        kinds = {task.kind for task in iteration.tasks}
        assert kinds <= set("FBIW") and "F" in kinds
        assert all(task.end > task.start for task in iteration.tasks)
        assert all(send.size == 64 * 512 * 4 for send in iteration.sends)  # a micro-batch's activations, float32


@pytest.mark.parametrize("schedule, folder", _runs(), ids=lambda x: x if isinstance(x, str) else
                         f"{x.parent.parent.name}-{x.name}")
def test_pytorch_ran_each_rank_in_the_order_the_simulator_gives_its_schedule(schedule, folder):
    run = read_run([folder])
    expected = compute_orders(schedule, num_gpus=2, n=8)
    for iteration in run.iterations:
        for rank in range(2):
            ran = [task.text for task in iteration.tasks if task.rank == rank]
            flat = [part for text in expected[rank] for part in text.strip("()").split(";")]
            assert ran == flat


def test_the_transfer_fit_reads_the_waited_for_transfers():
    run = read_run([TRACES / "1f1b" / "run0"])
    comm = fit_comm(run.iterations)
    assert comm.samples >= 3 and comm.latency == 0.0  # one message size: a time per message, no line
    assert 0.01 < comm.time(64 * 512 * 4) < 10.0  # ms, on one host


def _trace_of(schedule, rank: int) -> dict:
    """A rank's trace, as the recorder writes it, of a simulated iteration (ms -> us)."""
    events = [{"ph": "X", "name": "pipeline:iteration 0", "ts": 0.0, "dur": schedule.completion_time * 1000}]
    for task in schedule.tasks:
        if task.gpu != rank:
            continue
        if task.parts:
            events.append({"ph": "X", "name": f"pipeline:{task.parts[0]}", "ts": task.start * 1000,
                           "dur": (task.end - task.start) * 1000})
        elif task.kind in ("fwd_prop", "grad_prop"):
            letter = "F" if task.kind == "fwd_prop" else "B"
            events.append({"ph": "X", "name": f"pipeline:send {task.stage}{letter}{task.index} 4096",
                           "ts": task.start * 1000, "dur": 1.0})
    return {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 2},
            "pipelineRun": {"schedule": schedule.params.schedule}}


@pytest.mark.parametrize("schedule_name", ["gpipe", "1f1b", "zb-v"])
def test_a_trace_of_a_simulated_iteration_replays_to_itself(schedule_name, tmp_path):
    """Uneven lengths, transfers on free ports: read back, fitted and replayed, every task starts where it did."""
    params = EnvParams(n=4, num_gpus=2, schedule=schedule_name, fwd_len=3.0, bwd_len=5.0, prop_len=0.75,
                       sync_base_len=0.0, fwd_impact=0.0, bwd_impact=0.0, compute_jitter=0.3, seed=7)
    original = simulate(params, Policy())
    for rank in range(2):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(_trace_of(original, rank)))
    run = read_run([tmp_path])
    comm = fit_comm(run.iterations)
    assert comm.time(4096) == pytest.approx(0.75, rel=1e-9)
    result = replay(run, 0, comm)
    assert result.iteration_error == pytest.approx(0.0, abs=1e-9)
    assert np.max(result.start_errors) < 1e-9
    given = effective_lengths(run.iterations[0], comm)
    for task in result.simulated.tasks:
        if task.parts:
            part = task.parts[0]
            assert task.length == pytest.approx(given[part.stage, part.kind.code, part.mb], rel=1e-12)
            assert task.end - task.start == pytest.approx(task.length, rel=1e-9)  # no impact slows compute


def test_given_lengths_equal_to_the_environments_own_change_nothing_and_take_its_noise_on_top():
    params = EnvParams(n=6, num_gpus=3, schedule="zb-v", compute_jitter=0.2, comm_jitter=0.1, slow_gpu=1,
                       slow_factor=1.5, seed=3)
    own = simulate(params, Policy(), sample=2)
    quiet = replace(params, compute_jitter=0.0, comm_jitter=0.0, slow_gpu=-1)
    given = simulate(params, Policy(), sample=2, lengths=task_lengths(quiet).tolist())
    assert [(t.start, t.end) for t in given.tasks] == [(t.start, t.end) for t in own.tasks]
    assert given.completion_time == own.completion_time and given.lower_bound == own.lower_bound
    with pytest.raises(ParameterError, match="lengths"):
        simulate(params, Policy(), lengths=[1.0, 2.0])
    with pytest.raises(ParameterError, match="lengths"):
        simulate(params, Policy(), lengths=[-1.0] * len(own.tasks))


def test_replay_of_every_committed_run_stays_within_five_percent():
    errors = []
    for _, folder in _runs():
        run = read_run([folder])
        comm = fit_comm(run.iterations)
        errors += [replay(run, k, comm).iteration_error for k in range(len(run.iterations))]
    assert np.median(np.abs(errors)) < 0.05


def test_a_prediction_runs_the_target_schedules_own_order():
    source = read_run([TRACES / "1f1b" / "run0"])
    comm = fit_comm(source.iterations)
    for schedule in SCHEDULES:
        predicted = predict(source, 0, comm, schedule)
        assert predicted.params.schedule == schedule and not predicted.given_order
        assert predicted.completion_time > 0.0


def test_a_prediction_for_more_micro_batches_adds_their_work():
    """1F1B on 2 ranks: each further micro-batch adds a forward and a backward to the busier rank's steady state."""
    source = read_run([TRACES / "1f1b" / "run0"])
    comm = fit_comm(source.iterations)
    eight, sixteen = (predict(source, 0, comm, "1f1b", microbatches=n) for n in (8, 16))
    assert sixteen.params.n == 16 and len(sixteen.tasks) > len(eight.tasks)
    per_rank = [sum(t.length for t in sixteen.tasks if t.parts and t.gpu == g and t.index >= 8) for g in range(2)]
    assert sixteen.completion_time - eight.completion_time >= max(per_rank) * (1 - 1e-9)


def test_a_predicted_split_backward_follows_the_runtime_costs_and_the_first_stage_computes_no_input_gradient():
    source = read_run([TRACES / "1f1b" / "run0"])
    comm = fit_comm(source.iterations)
    costs = RuntimeCosts(gap=0.25, split=1.3, input_share=0.4)
    predicted = predict(source, 0, comm, "zb-h1", runtime=costs)
    own = {(t.stage, t.kind, t.mb): t.end - t.start for t in source.iterations[0].tasks}
    whole = [sum(own[stage, "B", mb] for mb in range(source.microbatches)) / source.microbatches for stage in (0, 1)]
    lengths = {(t.parts[0].stage, t.parts[0].kind.code): t.length for t in predicted.tasks if t.parts}
    assert lengths[0, "I"] == pytest.approx(costs.gap)
    assert lengths[0, "W"] == pytest.approx(whole[0] + costs.gap)
    assert lengths[1, "I"] == pytest.approx(whole[1] * 1.3 * 0.4 + costs.gap)
    assert lengths[1, "W"] == pytest.approx(whole[1] * 1.3 * 0.6 + costs.gap)
    # a stage of the interleaved target has half a source stage's layers: half its forward
    halves = predict(source, 0, comm, "interleaved-1f1b", runtime=costs)
    forward = {t.parts[0].stage: t.length for t in halves.tasks if t.parts and t.parts[0].kind.code == "F"}
    mean_forward = sum(own[1, "F", mb] for mb in range(source.microbatches)) / source.microbatches
    assert forward[3] == pytest.approx(mean_forward / 2 + costs.gap)


def test_runtime_costs_measured_on_split_runs_read_their_halves_against_the_sources_whole_backward():
    source = read_run([TRACES / "1f1b" / "run0"])
    split = [read_run([TRACES / name / "run0"]) for name in ("zb-h1", "zb-v")]
    costs = runtime_costs(split, source)
    shares, per_forward = [], []
    for run in split:
        for it in run.iterations:
            took = {(t.stage, t.kind, t.mb): t.end - t.start for t in it.tasks}
            for (stage, kind, mb), inputs in took.items():
                if kind == "I" and stage > 0:
                    shares.append(inputs / (inputs + took[stage, "W", mb]))
                    per_forward.append((inputs + took[stage, "W", mb]) / took[stage, "F", mb])
    forward = {(t.stage, t.mb, k): t.end - t.start for k, it in enumerate(source.iterations) for t in it.tasks
               if t.kind == "F"}
    ratios = [(t.end - t.start) / forward[t.stage, t.mb, k] for k, it in enumerate(source.iterations)
              for t in it.tasks if t.kind == "B" and t.stage > 0]
    assert costs.input_share == pytest.approx(np.median(shares))
    assert costs.split == pytest.approx(np.median(per_forward) / np.median(ratios)) and costs.split_measured
    own = runtime_costs([], source)
    assert (own.split, own.input_share, own.split_measured) == (1.0, 0.5, False) and own.gap > 0.0
    said = run_here("pipeline_trace.py", "predict", str(TRACES / "1f1b" / "run0"), "--runtime-from",
                    str(TRACES / "gpipe" / "run0"), cwd=ROOT)
    assert said.returncode == 0 and ("the runtime's costs over 1 run: " in said.stderr
                                     and "no split backward to measure against a whole one" in said.stderr)


def test_predicted_time_puts_the_measured_spread_back_as_jitter():
    source = read_run([TRACES / "1f1b" / "run0"])
    comm = fit_comm(source.iterations)
    assert 0.0 < task_spread(source) < 1.0
    quiet = predict(source, 0, comm, "1f1b").completion_time
    draws = [predicted_time(source, 0, comm, "1f1b", draws=d) for d in (1, 9)]
    assert all(time != quiet for time in draws)  # jittered draws, not the noise-free run
    single = replace(source, iterations=source.iterations[:1])
    assert task_spread(single) == 0.0
    assert predicted_time(single, 0, comm, "1f1b") == predict(single, 0, comm, "1f1b").completion_time


def test_a_table_of_lengths_by_task_text_is_read_whole_or_refused():
    params = EnvParams(n=4, num_gpus=2, schedule="dualpipe-v", compute_jitter=0.1)
    run = simulate(params, Policy())
    table = {str(task.id): task.length for task in run.tasks}
    assert lengths_of_table(params, table) == [task.length for task in run.tasks]
    with pytest.raises(ParameterError, match=r"lengths .* lacks \(0F3;3B1\)"):
        lengths_of_table(params, {text: length for text, length in table.items() if text != "(0F3;3B1)"})
    with pytest.raises(ParameterError, match="lengths = '9F9': is no task of dualpipe-v"):
        lengths_of_table(params, {**table, "9F9": 1.0})
    with pytest.raises(ParameterError, match="under dispatch greedy: its overlapped pairs run as pairs under the "
                                             r"static order only \(dispatch static\)"):
        lengths_of_table(replace(params, dispatch="greedy"), table)


def test_a_replayed_iteration_draws_in_the_visualizer_from_its_table_of_lengths(tmp_path):
    result = run_here("pipeline_trace.py", "replay", str(TRACES / "zb-v" / "run0"), "--iteration", "2",
                      "--lengths-out", "zbv.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    replayed = float(result.stdout.splitlines()[3].split("simulated ")[1].split(" ms")[0])
    table = json.loads((tmp_path / "zbv.json").read_text())
    flags = table["flags"].split()
    assert table["unit"] == "ms"  # a trace's times
    chart = run_here("schedule_visualizer_single_channel.py", *flags, "--lengths", "zbv.json", "--no-show",
                     "--output", "zbv.png", cwd=tmp_path)
    assert chart.returncode == 0, chart.stderr
    assert float(chart.stdout.split("completion time ")[1].split()[0]) == pytest.approx(replayed, abs=0.006)
    assert re.search(r"completion time [\d.]+ ms \(ideal [\d.]+ ms, lower bound [\d.]+ ms: ", chart.stdout)  # its unit
    assert_png_drawn(tmp_path / "zbv.png")
    noisy = run_here("schedule_visualizer_single_channel.py", *flags, "--lengths", "zbv.json", "--compute-jitter",
                     "0.3", "--sample", "4", "--no-show", "--output", "noisy.png", cwd=tmp_path)
    assert noisy.returncode == 0, noisy.stderr
    assert "sample 4 of seed 0" in noisy.stdout
    assert float(noisy.stdout.split("completion time ")[1].split()[0]) != pytest.approx(replayed, abs=0.5)
    wrong = run_here("schedule_visualizer_single_channel.py", "--schedule", "1f1b", "--lengths", "zbv.json",
                     "--no-show", "--output", "x.png", cwd=tmp_path)
    assert_one_line_error(wrong, "--lengths", "lacks 0B0, 0B1, 0B2 and 13 more of 1f1b with n = 8 on 2 GPUs")
    (tmp_path / "bad.json").write_text("[1, 2]")
    bad = run_here("schedule_visualizer_single_channel.py", "--lengths", "bad.json", "--no-show", "--output", "y.png",
                   cwd=tmp_path)
    assert_one_line_error(bad, "--lengths: lengths = 'bad.json': not a JSON object whose 'lengths' maps task texts to "
                               "numbers")
    endless = run_here("schedule_visualizer_single_channel.py", "--lengths", "/dev/zero", "--no-show", "--output",
                       "z.png", cwd=tmp_path)
    assert_one_line_error(endless, "--lengths: lengths = '/dev/zero': must be a table of lengths: a JSON file (.json)")
    (tmp_path / "endless.json").symlink_to("/dev/zero")
    endless = run_here("schedule_visualizer_single_channel.py", "--lengths", "endless.json", "--no-show", "--output",
                       "z.png", cwd=tmp_path)
    assert_one_line_error(endless, "--lengths: lengths = 'endless.json': larger than 64 MB")


# -- refusals --------------------------------------------------------------------------------------------------


def _copy(tmp_path: Path, schedule: str = "1f1b") -> Path:
    folder = tmp_path / schedule
    shutil.copytree(TRACES / schedule / "run0", folder)
    return folder


def _edit(path: Path, change) -> None:
    trace = json.loads(gzip.decompress(path.read_bytes()))
    change(trace)
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))


def test_a_foreign_json_is_refused(tmp_path):
    (tmp_path / "rank0.json").write_text(json.dumps({"results": [1, 2]}))
    with pytest.raises(TraceError, match="not a Chrome/Kineto trace: it has no traceEvents"):
        read_run([tmp_path])


def test_a_truncated_file_is_refused(tmp_path):
    folder = _copy(tmp_path)
    data = (folder / "rank1.json.gz").read_bytes()
    (folder / "rank1.json.gz").write_bytes(data[:len(data) // 2])
    with pytest.raises(TraceError, match=r"rank1\.json\.gz: truncated or not JSON"):
        read_run([folder])


@pytest.mark.parametrize("key", ["distributedInfo", "pipelineRun"])
def test_a_record_that_is_no_object_is_refused(tmp_path, key):
    folder = _copy(tmp_path)
    _edit(folder / "rank1.json.gz", lambda trace: trace.update({key: "rank 1"}))
    with pytest.raises(TraceError, match=rf"rank1\.json\.gz: its {key} is str, not an object of named fields"):
        read_run([folder])


def test_a_missing_rank_is_refused(tmp_path):
    folder = _copy(tmp_path)
    (folder / "rank1.json.gz").unlink()
    with pytest.raises(TraceError, match="missing rank 1 of 2"):
        read_run([folder])


def test_missing_actions_are_named(tmp_path):
    folder = _copy(tmp_path)
    _edit(folder / "rank1.json.gz",
          lambda trace: trace.update(traceEvents=[e for e in trace["traceEvents"] if e.get("name") != "pipeline:1B3"]))
    with pytest.raises(TraceError, match="iteration 0 lacks compute actions 1B3"):
        read_run([folder])


def test_an_action_traced_twice_or_backwards_is_refused(tmp_path):
    folder = _copy(tmp_path)
    _edit(folder / "rank1.json.gz", lambda trace: trace.update(traceEvents=[
        {**e, "ts": e["ts"] + 1} if e.get("name") == "pipeline:1B3" else e for e in trace["traceEvents"]]
        + [{**e, "ts": e["ts"] + 2} for e in trace["traceEvents"] if e.get("name") == "pipeline:1B3"]))
    with pytest.raises(TraceError, match="iteration 0 holds action 1B3 twice"):
        read_run([folder])
    folder = _copy(tmp_path / "negative")
    _edit(folder / "rank0.json.gz", lambda trace: trace.update(traceEvents=[
        {**e, "dur": -5.0} if e.get("name") == "pipeline:0F2" else e for e in trace["traceEvents"]]))
    with pytest.raises(TraceError, match="rank0.json.gz: event 'pipeline:0F2' has a negative duration"):
        read_run([folder])


def test_a_trace_without_pipeline_ranges_is_refused(tmp_path):
    folder = _copy(tmp_path)
    _edit(folder / "rank0.json.gz", lambda trace: trace.update(traceEvents=[{"ph": "X", "name": "aten::mm", "ts": 1,
                                                                             "dur": 2}]))
    with pytest.raises(TraceError, match="no pipeline:iteration ranges"):
        read_run([folder])


# -- the command -----------------------------------------------------------------------------------------------


def test_replay_and_predict_commands_write_and_report(tmp_path):
    result = run_here("pipeline_trace.py", "replay", str(TRACES / "zb-v" / "run0"), "--plot", "replay.png",
                      "--iteration", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("zb-v: 2 ranks, 4 stages, 8 micro-batches, 3 iterations")
    assert sum(line.startswith("iteration ") for line in lines) == 3
    assert_png_drawn(tmp_path / "replay.png", min_width=1200, min_height=500)
    drawn = (tmp_path / "replay.png").read_bytes()
    (tmp_path / "table.json").write_text("{}")
    for flag, name in (("--plot", "replay.png"), ("--lengths-out", "table.json")):
        again = run_here("pipeline_trace.py", "replay", str(TRACES / "zb-v" / "run0"), flag, name, cwd=tmp_path)
        assert_one_line_error(again, f"{flag} {name}: the file exists; pass --overwrite to replace it")
    assert (tmp_path / "replay.png").read_bytes() == drawn and (tmp_path / "table.json").read_text() == "{}"
    same = run_here("pipeline_trace.py", "replay", str(TRACES / "zb-v" / "run0"), "--plot", "both.png",
                    "--lengths-out", "both.png", cwd=tmp_path)
    assert_one_line_error(same, "--lengths-out both.png: a table of lengths is JSON; give a path ending in .json")
    again = run_here("pipeline_trace.py", "replay", str(TRACES / "zb-v" / "run0"), "--lengths-out", "table.json",
                     "--overwrite", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "table.json").read_text())["source"].endswith("iteration 0")
    result = run_here("pipeline_trace.py", "predict", str(TRACES / "1f1b" / "run0"), "--measured",
                      str(TRACES / "gpipe" / "run0"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    gpipe = next(line for line in result.stdout.splitlines() if line.strip().startswith("gpipe:"))
    assert "measured" in gpipe and "%" in gpipe


def test_predict_command_compares_another_micro_batch_count_with_runs_of_it(tmp_path):
    folder = ROOT / "tests" / "data" / "microbatches" / "round0"
    result = run_here("pipeline_trace.py", "predict", str(folder / "n8" / "1f1b" / "run0"), "--microbatches", "16",
                      "--schedule", "1f1b", "gpipe", "--measured", str(folder / "n16" / "1f1b" / "run0"),
                      str(folder / "n16" / "gpipe" / "run0"), str(folder / "n8" / "1f1b" / "run0"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and all("measured" in line for line in lines)
    measured = [float(line.split("measured")[1].split("ms")[0]) for line in lines]
    runs = [read_run([folder / "n16" / name / "run0"]) for name in ("1f1b", "gpipe")]
    assert measured == [round(float(np.median([it.time for it in run.iterations])), 2) for run in runs]


def test_study_command_tabulates_every_schedule(tmp_path):
    for schedule in ("1f1b", "gpipe"):
        shutil.copytree(TRACES / schedule / "run0", tmp_path / "runs" / schedule / "run0")
    result = run_here("pipeline_trace.py", "study", "runs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| 1f1b") or line.startswith("| gpipe")]
    assert len(rows) == 2 and all(row.count("|") == 14 for row in rows)
    # with the others' runtime costs: 1F1B's measured on GPipe's run; GPipe has no run of a third schedule to
    # measure them on, and its cells stay empty (they were filled, measured on nothing)
    cells = [[cell.strip() for cell in row.split("|")[9:11]] for row in rows]
    assert all(cells[0]) and cells[1] == ["", ""], rows


def test_predict_leaves_out_a_schedule_that_cannot_run_its_micro_batches(tmp_path):
    """Of every schedule, those that cannot run 3 micro-batches on 2 ranks are left out, said why; the others are
    predicted."""
    result = run_here("pipeline_trace.py", "predict", str(TRACES / "1f1b" / "run0"), "--microbatches", "3",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "interleaved-1f1b: not predicted (--microbatches 3: n = 3:" in result.stderr
    assert "dualpipe-v: not predicted" in result.stderr
    assert [line.split(":")[0].strip() for line in result.stdout.splitlines() if "predicted" in line] == \
        ["1f1b", "gpipe", "zb-h1", "zb-v"]


@pytest.mark.parametrize("args, fragments", [
    (["replay", "nowhere"], ["nowhere: no such file"]),
    (["replay", str(TRACES / "1f1b" / "run0"), "--iteration", "9", "--plot", "x.png"], ["--iteration 9"]),
    (["replay", str(TRACES / "1f1b" / "run0"), "--iteration", "-1"], ["--iteration -1: must be from 0 to 2"]),
    (["predict", str(TRACES / "1f1b" / "run0"), "--schedule", "zb-h2"], ["invalid choice: 'zb-h2'"]),
    (["predict", str(TRACES / "1f1b" / "run0"), "--schedule", "interleaved-1f1b", "--microbatches", "3"],
     ["--microbatches 3: n = 3: schedule interleaved-1f1b with num_gpus = 2 requires n to be a multiple"]),
    (["replay", str(TRACES / "1f1b" / "run0"), "--schedule", "zb-h1"],
     ["rank0.json.gz: the trace names its schedule, 1f1b, not zb-h1: leave the schedule out"]),
    (["replay", str(TRACES / "1f1b" / "run0"), "--plot", "chart.jpg"], ["--plot chart.jpg", ".png, .svg, .pdf"]),
    (["predict", str(TRACES / "1f1b" / "run0"), "--runtime-from",
      str(ROOT / "tests" / "data" / "microbatches" / "round0" / "n16" / "gpipe" / "run0")],
     ["--runtime-from", "16 micro-batches on 2 ranks", "the source ran 8 on 2"]),
    (["record", "--out", "x", "--port", "70000"], ["--port", "70000 is not a port"]),
    (["study", "nowhere"], ["nowhere: no such folder"]),
    (["replay", str(TRACES / "1f1b" / "run0" / "rank0.json.gz"), str(TRACES / "zb-v" / "run0" / "rank1.json.gz")],
     ["not the run of", "their pipelineRun.schedule, pipelineRun.stages differ"]),
    (["replay", str(TRACES / "1f1b" / "run0" / "rank0.json.gz"), str(TRACES / "1f1b" / "run1" / "rank1.json.gz")],
     ["began after", "not of one run"]),
])
def test_command_mistakes_get_one_line(args, fragments, tmp_path):
    assert_one_line_error(run_here("pipeline_trace.py", *args, cwd=tmp_path), *fragments)


def test_too_few_micro_batches_for_pytorchs_schedule_are_refused_before_the_ranks_start(tmp_path):
    pytest.importorskip("torch")
    for schedule, message in (("1f1b", "PyTorch's 1f1b needs at least one per stage, 2"),
                              ("dualpipe-v", "schedule dualpipe-v with num_gpus = 2 requires n >= 2 x num_gpus (4)")):
        result = run_here("pipeline_trace.py", "record", "--out", "x", "--schedule", schedule, "--microbatches", "1",
                          cwd=tmp_path)
        assert_one_line_error(result, "--microbatches 1: ", message)
    assert not (tmp_path / "x").exists()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_fresh_traces_of_a_real_run(tmp_path):
    """A real run under torch, as small as it gets: two ranks, two micro-batches, one traced iteration."""
    pytest.importorskip("torch")
    result = run_here("pipeline_trace.py", "record", "--out", "fresh", "--schedule", "1f1b", "--microbatches", "2",
                      "--iterations", "1", "--batch", "4", "--width", "32", "--layers", "2",
                      "--port", str(_free_port()),
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run = read_run([tmp_path / "fresh" / "1f1b" / "run0"])
    assert (run.schedule, run.ranks, run.stages, run.microbatches) == ("1f1b", 2, 2, 2)
    assert replay(run, 0, fit_comm(run.iterations)).simulated.completion_time > 0.0
    stale = tmp_path / "fresh" / "1f1b" / "run0" / "rank2.json.gz"  # as a run of more ranks would leave
    stale.write_bytes(b"")
    assert_one_line_error(run_here("pipeline_trace.py", "record", "--out", "fresh", "--schedule", "1f1b",
                                   cwd=tmp_path), "already holds traces", "--overwrite")
    assert stale.exists()


def test_a_run_stopped_while_recorded_leaves_no_half_run(tmp_path, monkeypatch):
    """Stopped after one rank wrote its file (and another left its temporaries): nothing of the run is left, so that
    a study of the folder never meets a run without all its ranks."""
    pytest.importorskip("torch")
    from pipeline_sim import recorder

    folder = tmp_path / "1f1b" / "run1"

    def stopped(*args, **kwargs):
        (folder / "rank0.json.gz").write_bytes(b"written")
        (folder / ".rank1.json").write_text("{}")
        (folder / "rank1.json.partial").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(recorder.mp, "start_processes", stopped)
    with pytest.raises(KeyboardInterrupt):
        recorder.record(recorder.RunSpec("1f1b"), folder)
    assert not folder.exists() and (tmp_path / "1f1b").is_dir()


def test_a_record_whose_ranks_fail_leaves_nothing_behind(tmp_path, monkeypatch):
    """A backend this torch cannot run is refused before any rank starts; ranks that fail leave no folder the run
    made and none of PyTorch's error files (by which a rank reports its failure) in the temporary directory."""
    pytest.importorskip("torch")
    import torch

    from pipeline_sim import recorder

    if not torch.cuda.is_available():
        assert_one_line_error(run_here("pipeline_trace.py", "record", "--out", "x", "--backend", "nccl",
                                       cwd=tmp_path), "--backend nccl: this installation of torch cannot run it")
        assert not (tmp_path / "x").exists()
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))

    def failing(rank, spec, out):
        raise RuntimeError(f"rank {rank} cannot start")

    monkeypatch.setattr(recorder, "_rank_main", failing)
    result = run_here("pipeline_trace.py", "record", "--out", "x", "--schedule", "1f1b", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert re.fullmatch(r"pipeline_trace.py: error: a rank failed: RuntimeError: rank \d cannot start",
                        result.stderr.strip().splitlines()[-1]), result.stderr
    assert not (tmp_path / "x").exists() and list(temporary.iterdir()) == []


def test_a_trace_that_does_not_name_its_schedule_is_checked_against_the_one_given(tmp_path):
    """--schedule is for a trace that names none: its actions must be that schedule's."""
    for rank in (0, 1):
        with gzip.open(TRACES / "1f1b" / "run0" / f"rank{rank}.json.gz", "rt") as handle:
            trace = json.load(handle)
        del trace["pipelineRun"]["schedule"]
        with gzip.open(tmp_path / f"rank{rank}.json.gz", "wt") as handle:
            json.dump(trace, handle)
    assert_one_line_error(run_here("pipeline_trace.py", "replay", str(tmp_path), cwd=tmp_path),
                          "no pipelineRun.schedule in the trace: name the schedule it ran")
    assert_one_line_error(run_here("pipeline_trace.py", "replay", str(tmp_path), "--schedule", "zb-h1",
                                   cwd=tmp_path), "does not match schedule zb-h1", "lacks zb-h1's actions 0I0")
    replayed = run_here("pipeline_trace.py", "replay", str(tmp_path), "--schedule", "1f1b", cwd=tmp_path)
    assert replayed.returncode == 0 and replayed.stdout.startswith("1f1b: 2 ranks"), replayed.stderr


def test_a_port_in_use_is_one_line_that_says_what_to_do(tmp_path):
    """Another program on the rendezvous port: the ranks cannot meet. The line says so and what to pass, and
    nothing of PyTorch's log of the ranks it stopped comes with it."""
    pytest.importorskip("torch")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        result = run_script("pipeline_trace.py", "record", "--out", "x", "--schedule", "1f1b", "--port", str(port),
                            cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    said, error = result.stderr.strip().splitlines()
    assert said.startswith("recording 1 schedule(s)") and error.startswith("pipeline_trace.py: error: a rank failed: ")
    assert "EADDRINUSE" in error and error.endswith(f"; another program holds --port {port}: pass a free one"), error
    assert not (tmp_path / "x").exists()


def test_a_rank_stopped_as_it_starts_runs_nothing_of_its_parent(tmp_path, monkeypatch):
    """PyTorch stops the other ranks (SIGTERM) as soon as one fails. A rank still starting then, before its own
    handlers are set, must take that stop as its own end: it had taken it with the recorder's handler, whose
    interrupt unwound the parent's stack copied into the rank, ran the recorder's clean-up (removing, among others,
    the error file by which the failed rank says why) and then carried on with the parent's own work."""
    pytest.importorskip("torch")
    import multiprocessing.process

    from pipeline_sim import recorder

    def failing(rank, spec, out):
        if rank == 0:
            raise RuntimeError("rank 0 cannot start")
        time.sleep(60)

    caught = tmp_path / "caught"
    bootstrap = multiprocessing.process.BaseProcess._bootstrap

    def slow_start(process, *args, **kwargs):  # rank 1 starts late: the stop comes before its own handlers
        if process._args[1] == 1:
            try:
                time.sleep(3)
            except BaseException:  # the parent's handler ran here: say so, and end as the fault's rank would not
                caught.touch()
                os._exit(3)
        return bootstrap(process, *args, **kwargs)

    monkeypatch.setattr(recorder, "_rank_main", failing)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "_bootstrap", slow_start)
    result = run_here("pipeline_trace.py", "record", "--out", "x", "--schedule", "1f1b", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        "pipeline_trace.py: error: a rank failed: RuntimeError: rank 0 cannot start"), result.stderr
    assert not caught.exists()


def test_an_interrupted_recording_says_what_it_kept_and_resumes_past_it(tmp_path, monkeypatch):
    """Ctrl-C after the first of two runs: the line says how many runs are kept and the command that continues;
    --resume keeps the whole run of those settings and records only the other; without it, the traces are refused
    with both ways on."""
    pytest.importorskip("torch")
    from pipeline_sim import recorder

    def traced(rank, spec, out):  # a rank's trace as the recorder writes it, without running the model
        with gzip.open(Path(out) / f"rank{rank}.json.gz", "wt") as handle:
            json.dump({"traceEvents": [], "pipelineRun": {**asdict(spec), "rank": rank}}, handle)

    monkeypatch.setattr(recorder, "_rank_main", traced)
    real = recorder.record
    calls = []

    def stopped_at_the_second(spec, folder):
        calls.append(folder)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(spec, folder)

    monkeypatch.setattr(recorder, "record", stopped_at_the_second)
    command = ("pipeline_trace.py", "record", "--out", "x", "--schedule", "1f1b", "--rounds", "2")
    result = run_here(*command, cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr.strip().splitlines()[-1] == (
        f"pipeline_trace.py: interrupted after 1 of 2 runs, which are kept in x; to continue: python "
        f"{ROOT / 'pipeline_trace.py'} record --out x --schedule 1f1b --rounds 2 --resume")
    assert recorder.recorded(recorder.RunSpec("1f1b"), tmp_path / "x" / "1f1b" / "run0")
    assert not (tmp_path / "x" / "1f1b" / "run1").exists()
    assert_one_line_error(run_here(*command, cwd=tmp_path), "x/1f1b/run0 already holds traces; pass --overwrite to "
                                                            "replace them, or --resume to keep those of these settings")
    assert_one_line_error(run_here(*command, "--iterations", "2", "--resume", cwd=tmp_path),
                          "x/1f1b/run0 already holds traces of other settings; pass --overwrite")
    calls.clear()
    monkeypatch.setattr(recorder, "record", lambda spec, folder: (calls.append(folder), real(spec, folder))[1])
    resumed = run_here(*command, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines() == ["[1/2] x/1f1b/run0 (kept)", "[2/2] x/1f1b/run1"]
    assert calls == [Path("x/1f1b/run1")]
    assert recorder.recorded(recorder.RunSpec("1f1b"), tmp_path / "x" / "1f1b" / "run1")


def test_fresh_traces_under_torchrun_one_process_per_rank(tmp_path):
    """Launched by torchrun (as on a cluster: one process per rank, the launcher's rendezvous), each process runs
    its own rank through every run, joining the process group once."""
    pytest.importorskip("torch")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(_free_port()),
               str(ROOT / "pipeline_trace.py"), "record", "--out", "fresh", "--schedule", "1f1b", "zb-v",
               "--microbatches", "4", "--iterations", "1", "--batch", "4", "--width", "32", "--layers", "4"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("[") == 2  # one rank reports the two runs
    for schedule, stages in (("1f1b", 2), ("zb-v", 4)):
        run = read_run([tmp_path / "fresh" / schedule / "run0"])
        assert (run.schedule, run.ranks, run.stages, run.microbatches) == (schedule, 2, stages, 4)


def test_a_launched_record_with_another_rank_count_is_refused(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29538")):
        monkeypatch.setenv(name, value)
    assert_one_line_error(run_here("pipeline_trace.py", "record", "--out", "x", "--ranks", "3", cwd=tmp_path),
                          "--ranks 3: the launcher started 2 processes")


def test_a_study_refuses_runs_of_different_sizes(tmp_path):
    shutil.copytree(TRACES / "1f1b" / "run0", tmp_path / "runs" / "1f1b" / "run0")
    shutil.copytree(ROOT / "tests" / "data" / "microbatches" / "round0" / "n16" / "gpipe" / "run0",
                    tmp_path / "runs" / "gpipe" / "run0")
    assert_one_line_error(run_here("pipeline_trace.py", "study", "runs", cwd=tmp_path),
                          "16 micro-batches on 2 ranks", "ran 8 on 2", "a study compares runs of one size")


def test_a_source_that_split_only_some_backwards_predicts_from_its_whole_ones():
    """DualPipeV splits a few backwards and runs the rest whole: a stage's backward is its whole ones' mean."""
    source = read_run([TRACES / "dualpipe-v" / "run0"])
    comm = fit_comm(source.iterations)
    predicted = predict(source, 0, comm, "1f1b", runtime=RuntimeCosts(gap=0.0))
    whole = {t.parts[0].stage: t.length for t in predicted.tasks if t.parts and t.parts[0].kind.code == "B"}
    for stage in (0, 1):  # 1F1B's stage k holds the layers of DualPipeV's stage 2k: twice its whole backward
        own = [t.end - t.start for t in source.iterations[0].tasks if t.stage == 2 * stage and t.kind == "B"]
        assert 0 < len(own) < source.microbatches or stage == 1
        assert whole[stage] == pytest.approx(2 * np.mean(own))


# -- traces no run can have, and runs that do not compare --------------------------------------------------------


def _rename(trace: dict, old: str, new: str) -> None:
    for event in trace["traceEvents"]:
        if event.get("name") == old:
            event["name"] = new


def _sends(name: str):
    def change(trace: dict) -> None:
        for event in trace["traceEvents"]:
            if str(event.get("name", "")).startswith("pipeline:send "):
                event["name"] = name(event["name"].split())
    return change


@pytest.mark.parametrize("name, fragment", [
    (lambda words: " ".join(words[:2]), "is not a send as the simulator reads one"),
    (lambda words: f"{words[0]} {words[1]} -5", "is not a send as the simulator reads one"),
    (lambda words: f"{words[0]} {words[1]} 1e30", "is not a send as the simulator reads one"),
    (lambda words: f"{words[0]} {words[1]} 0", "sends 0 bytes"),
])
def test_a_send_without_a_whole_positive_size_is_refused_not_left_out(tmp_path, name, fragment):
    folder = _copy(tmp_path)
    _edit(folder / "rank0.json.gz", _sends(name))
    with pytest.raises(TraceError, match=rf"rank0\.json\.gz: event 'pipeline:send 0F0.*{fragment}"):
        read_run([folder])


def test_an_event_at_no_finite_time_or_inside_another_action_of_its_rank_is_refused(tmp_path):
    folder = _copy(tmp_path)
    _edit(folder / "rank1.json.gz", lambda trace: [event.update(ts=float("nan")) for event in trace["traceEvents"]
                                                   if event.get("name") == "pipeline:1F1"])
    with pytest.raises(TraceError, match="event 'pipeline:1F1' has ts nan .* both must be finite"):
        read_run([folder])

    def inside(trace: dict) -> None:
        first = next(e for e in trace["traceEvents"] if e.get("name") == "pipeline:1F0")
        next(e for e in trace["traceEvents"] if e.get("name") == "pipeline:1F1")["ts"] = first["ts"] + 1.0
    folder = _copy(tmp_path / "overlap")
    _edit(folder / "rank1.json.gz", inside)
    run = read_run([folder])
    with pytest.raises(TraceError, match=r"iteration 0: rank 1's action 1F1 starts .* ms into the iteration, while "
                                         r"1F0 runs \(.* ms\): a rank runs one task at a time, and 1f1b has no task"):
        replay(run, 0, fit_comm(run.iterations))


def test_an_overlapped_forward_and_backward_of_one_task_is_read_and_replayed(tmp_path):
    """DualPipeV's overlapped pair, ``(0F3;3B1)``, one task of the simulator: its two actions may run at once."""
    folder = _copy(tmp_path, "dualpipe-v")

    def overlap(trace: dict) -> None:
        forwards = [e for e in trace["traceEvents"] if e.get("name") == "pipeline:0F3"]
        backwards = [e for e in trace["traceEvents"] if e.get("name") == "pipeline:3B1"]
        for forward, backward in zip(forwards, backwards):
            end = backward["ts"] + backward["dur"]
            forward["dur"] = backward["dur"] = end - forward["ts"]
            backward["ts"] = forward["ts"]
    _edit(folder / "rank0.json.gz", overlap)
    run = read_run([folder])
    assert abs(replay(run, 0, fit_comm(run.iterations)).iteration_error) < 0.05


def test_a_ranges_copy_on_a_gpu_stream_is_not_read_again(tmp_path):
    """With CUDA activity traced, Kineto writes each range a second time on the GPU's stream, later."""
    folder = _copy(tmp_path)
    for rank in (0, 1):
        _edit(folder / f"rank{rank}.json.gz", lambda trace: trace["traceEvents"].extend(
            {**e, "cat": "gpu_user_annotation", "pid": 0, "tid": 7, "ts": e["ts"] + 800}
            for e in list(trace["traceEvents"]) if str(e.get("name", "")).startswith("pipeline:")))
    assert read_run([folder]).iterations == read_run([TRACES / "1f1b" / "run0"]).iterations


def test_a_schedule_named_in_another_case_is_that_schedule(tmp_path):
    folder = _copy(tmp_path, "zb-h1")
    for rank in (0, 1):
        _edit(folder / f"rank{rank}.json.gz", lambda trace: trace["pipelineRun"].update(schedule="ZB-H1"))
    assert read_run([folder]).schedule == "zb-h1"
    assert read_run([folder], "Zb-H1").schedule == "zb-h1"
    for rank in (0, 1):
        _edit(folder / f"rank{rank}.json.gz", lambda trace: trace["pipelineRun"].pop("schedule"))
    with pytest.raises(TraceError, match=r"rank0\.json\.gz: schedule 'zb-h3' is not a schedule the simulator has"):
        read_run([folder], "zb-h3")


def test_a_run_its_schedule_cannot_have_says_so_not_that_its_lengths_are_too_large(tmp_path):
    folder = _copy(tmp_path, "interleaved-1f1b")
    for rank in (0, 1):
        _edit(folder / f"rank{rank}.json.gz", lambda trace: (trace["pipelineRun"].update(microbatches=7), trace.update(
            traceEvents=[e for e in trace["traceEvents"] if not re.match(r"pipeline:(send )?\d+[FB]7\b",
                                                                          str(e.get("name", "")))])))
    run = read_run([folder])
    with pytest.raises(TraceError, match="7 micro-batches on 2 ranks: n = 7: schedule interleaved-1f1b with "
                                         "num_gpus = 2 requires n to be a multiple"):
        replay(run, 0, fit_comm(run.iterations))


def test_ranges_as_begin_and_end_pairs_read_as_the_complete_events_they_are(tmp_path):
    def paired(trace: dict) -> None:
        events = []
        for event in trace["traceEvents"]:
            if event.get("ph") == "X" and str(event.get("name", "")).startswith("pipeline:"):
                events.append({**{k: v for k, v in event.items() if k != "dur"}, "ph": "B"})
                events.append({"ph": "E", "ts": event["ts"] + event["dur"], "pid": event.get("pid"),
                               "tid": event.get("tid")})
            else:
                events.append(event)
        trace["traceEvents"] = sorted(events, key=lambda e: e.get("ts", 0))
    folder = _copy(tmp_path)
    for rank in (0, 1):
        _edit(folder / f"rank{rank}.json.gz", paired)
    plain, pairs = read_run([TRACES / "1f1b" / "run0"]), read_run([folder])
    assert [(t.text, t.rank) for t in pairs.iterations[1].tasks] == \
        [(t.text, t.rank) for t in plain.iterations[1].tasks]
    assert [t.end - t.start for t in pairs.iterations[1].tasks] == \
        pytest.approx([t.end - t.start for t in plain.iterations[1].tasks])
    assert pairs.iterations[1].sends == plain.iterations[1].sends


@pytest.mark.parametrize("key, value, fragment", [
    ("microbatches", 0, "pipelineRun.microbatches is 0, but its actions are of 8 micro-batches"),
    ("microbatches", "four", 'pipelineRun.microbatches is "four", but its actions are of 8 micro-batches'),
    ("stages", 3, "pipelineRun.stages is 3, but its actions are of 2 stages"),
    ("layers", 0, "pipelineRun.layers is 0: must be an integer >= 1"),
    ("schedule", "foo", "pipelineRun.schedule 'foo' is not a schedule the simulator has: one of gpipe, 1f1b"),
])
def test_a_run_record_that_contradicts_its_actions_is_refused(tmp_path, key, value, fragment):
    folder = _copy(tmp_path)
    for rank in (0, 1):
        _edit(folder / f"rank{rank}.json.gz", lambda trace: trace["pipelineRun"].update({key: value}))
    with pytest.raises(TraceError, match=re.escape(fragment)):
        read_run([folder])


def test_an_order_no_run_can_have_is_named_not_a_stuck_simulation(tmp_path):
    folder = _copy(tmp_path)
    _edit(folder / "rank1.json.gz", lambda trace: (_rename(trace, "pipeline:1F0", "x"),
                                                   _rename(trace, "pipeline:1B0", "pipeline:1F0"),
                                                   _rename(trace, "x", "pipeline:1B0")))
    assert_one_line_error(run_here("pipeline_trace.py", "replay", str(folder), cwd=tmp_path),
                          "iteration 0: rank 1 ran 1B0 before 1F0, which it depends on")
    folder = _copy(tmp_path / "across")
    _edit(folder / "rank0.json.gz", lambda trace: (_rename(trace, "pipeline:0F0", "x"),
                                                   _rename(trace, "pipeline:0B0", "pipeline:0F0"),
                                                   _rename(trace, "x", "pipeline:0B0")))
    assert_one_line_error(run_here("pipeline_trace.py", "replay", str(folder), cwd=tmp_path),
                          "the ranks' orders cannot run", "0B0 waits for")


def test_a_trace_replayed_as_another_schedule_says_its_order_is_not_that_schedules(tmp_path):
    folder = _copy(tmp_path)
    for rank in (0, 1):
        _edit(folder / f"rank{rank}.json.gz", lambda trace: trace["pipelineRun"].pop("schedule"))
    result = run_here("pipeline_trace.py", "replay", str(folder), "--schedule", "gpipe", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "note: iteration 0 ran in another order than gpipe's own (rank 0's action 3 is 0B0, where gpipe runs " \
           "0F2)" in result.stderr
    assert "another order" not in run_here("pipeline_trace.py", "replay", str(folder), "--schedule", "1f1b",
                                           cwd=tmp_path).stderr
    assert_one_line_error(run_here("pipeline_trace.py", "replay", str(folder), "--schedule", "interleaved-1f1b",
                                   cwd=tmp_path),
                          "2 stages on 2 ranks, one a rank, where interleaved-1f1b runs two or more a rank")


def test_transfers_that_took_no_time_fit_an_unbounded_bandwidth():
    run = read_run([TRACES / "1f1b" / "run0"])
    iteration = run.iterations[0]
    consumer = {(t.stage, t.kind, t.mb): t for t in iteration.tasks}
    sends = tuple(replace(send, time=consumer[(1, "F", send.mb) if send.kind == "F" else (0, "B", send.mb)].start)
                  for send in iteration.sends)
    fit = fit_comm([replace(iteration, sends=sends)])
    assert fit.samples > 0 and fit.bandwidth == float("inf") and fit.time(10 ** 6) == 0.0


def test_runs_of_another_model_are_not_compared(tmp_path):
    for schedule in ("1f1b", "gpipe"):
        shutil.copytree(TRACES / schedule / "run0", tmp_path / "runs" / schedule / "run0")
    for rank in (0, 1):
        _edit(tmp_path / "runs" / "gpipe" / "run0" / f"rank{rank}.json.gz",
              lambda trace: trace["pipelineRun"].update(width=64))
    assert_one_line_error(run_here("pipeline_trace.py", "study", "runs", cwd=tmp_path),
                          "runs/gpipe/run0: ran another model than runs/1f1b/run0 (width 64, not 512)")
    source, other = str(tmp_path / "runs" / "1f1b" / "run0"), str(tmp_path / "runs" / "gpipe" / "run0")
    result = run_here("pipeline_trace.py", "predict", source, "--schedule", "gpipe", "gpipe", "--measured", other,
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "another model than the source's (width 64, not 512): not compared" in result.stderr
    assert [line.split(":")[0].strip() for line in result.stdout.splitlines()] == ["gpipe"]  # named twice, run once
    assert "measured" not in result.stdout
    assert_one_line_error(run_here("pipeline_trace.py", "predict", source, "--runtime-from", other, cwd=tmp_path),
                          f"--runtime-from {other}: another model than the source's (width 64, not 512)")


def test_a_prediction_too_large_to_simulate_is_refused_before_any_work(tmp_path, monkeypatch):
    assert_one_line_error(run_here("pipeline_trace.py", "predict", str(TRACES / "1f1b" / "run0"), "--microbatches",
                                   "100000000", cwd=tmp_path),
                          "--microbatches 100000000: n = 100000000: 1f1b on 2 ranks gives about 1,200,000,002 tasks; "
                          "a prediction simulates at most 1,000,000")
    # one schedule too large among others is left out, said why, as one that cannot run them is
    monkeypatch.setattr("pipeline_sim.cli.trace.MAX_TASKS", 150)  # 1f1b's 98 tasks at n = 8 fit, zb-v's 196 not
    result = run_here("pipeline_trace.py", "predict", str(TRACES / "zb-v" / "run0"), "--schedule", "1f1b", "zb-v",
                      "zb-v", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "zb-v: not predicted (tests/data/traces/zb-v/run0: its 8 micro-batches: n = 8: zb-v on 2 ranks gives " \
           "about 196 tasks; a prediction simulates at most 150)" in result.stderr.replace(str(ROOT) + "/", "")
    assert [line.split(":")[0].strip() for line in result.stdout.splitlines()] == ["1f1b"]


def test_a_table_written_into_the_run_it_reads_is_refused(tmp_path):
    folder = _copy(tmp_path)
    for given in ([str(folder)], [str(folder / "rank0.json.gz"), str(folder / "rank1.json.gz")]):
        assert_one_line_error(run_here("pipeline_trace.py", "replay", *given, "--lengths-out",
                                       str(folder / "lengths.json"), cwd=tmp_path),
                              "inside the run's folder, where every JSON file is read as a rank's trace")
    assert not (folder / "lengths.json").exists()
    chart = run_here("pipeline_trace.py", "replay", str(folder), "--plot", str(folder / "replay.png"), cwd=tmp_path)
    assert chart.returncode == 0, chart.stderr  # a chart is never read as a trace
    assert_png_drawn(folder / "replay.png")


def test_a_table_given_as_a_sweep_config_says_what_it_is(tmp_path):
    assert_one_line_error(run_here("data_generator.py", "-c", str(ROOT / "configs" / "tables" / "1f1b.json"),
                                   "-o", "out.csv", cwd=tmp_path),
                          "a table of lengths, not a sweep config: name it in a config under the key lengths")


def test_a_skewed_clock_is_said_and_a_run_no_real_one_can_be_predicts_nothing(tmp_path):
    folder = _copy(tmp_path / "skew")
    _edit(folder / "rank1.json.gz", lambda trace: [event.update(ts=event["ts"] + 5000) for event in trace["traceEvents"]
                                                   if "ts" in event])
    result = run_here("pipeline_trace.py", "replay", str(folder), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(r"note: .*skew/1f1b: rank 0's 0B7 starts 4\.6\d\d ms before rank 1 posts its input \(iteration "
                     r"0\): the ranks' clocks disagree by at least that much", result.stderr)
    assert "note:" not in run_here("pipeline_trace.py", "replay", str(TRACES / "1f1b" / "run0"), cwd=tmp_path).stderr
    # the checks a replay makes, made before a prediction from it or a comparison with it
    inside = _copy(tmp_path / "inside")
    _edit(inside / "rank1.json.gz", lambda trace: (_rename(trace, "pipeline:1F0", "x"),
                                                   _rename(trace, "pipeline:1B0", "pipeline:1F0"),
                                                   _rename(trace, "x", "pipeline:1B0")))
    for args in ([str(inside)], [str(TRACES / "1f1b" / "run0"), "--measured", str(inside)],
                 [str(TRACES / "1f1b" / "run0"), "--runtime-from", str(inside)]):
        assert_one_line_error(run_here("pipeline_trace.py", "predict", *args, "--schedule", "gpipe", cwd=tmp_path),
                              "rank 1 ran 1B0 before 1F0, which it depends on")


def test_a_study_checks_every_run_before_its_first_row(tmp_path):
    for schedule in ("1f1b", "gpipe"):
        shutil.copytree(TRACES / schedule / "run0", tmp_path / "runs" / schedule / "run0")
    _edit(tmp_path / "runs" / "gpipe" / "run0" / "rank1.json.gz",
          lambda trace: (_rename(trace, "pipeline:1F0", "x"), _rename(trace, "pipeline:1B0", "pipeline:1F0"),
                         _rename(trace, "x", "pipeline:1B0")))
    result = run_here("pipeline_trace.py", "study", "runs", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert "runs/gpipe/run0: iteration 0: rank 1 ran 1B0 before 1F0" in result.stderr


def test_rank_files_swapped_or_misnamed_are_named(tmp_path):
    folder = _copy(tmp_path)

    def rank(number: int):
        def change(trace: dict) -> None:
            trace["distributedInfo"]["rank"] = number
            trace["pipelineRun"]["rank"] = number
        return change
    _edit(folder / "rank0.json.gz", rank(1))
    _edit(folder / "rank1.json.gz", rank(0))
    with pytest.raises(TraceError, match=r"rank1\.json\.gz: rank 0 ran 1F0, where 1f1b places stage 1 on rank 1: its "
                                         r"files' ranks are not the ranks that ran them"):
        read_run([folder])
    # a schedule the trace names wrongly: the advice says so, not to name it
    named = _copy(tmp_path / "named", "1f1b")
    for number in (0, 1):
        _edit(named / f"rank{number}.json.gz", lambda trace: trace["pipelineRun"].update(schedule="zb-h1"))
    wrong = read_run([named])
    with pytest.raises(TraceError, match=r"named/1f1b: the trace does not match schedule zb-h1: .*\(its "
                                         r"pipelineRun\.schedule is not the schedule it ran\)"):
        replay(wrong, 0, fit_comm(wrong.iterations))


def test_file_names_and_formats_a_user_meets(tmp_path):
    folder = _copy(tmp_path)
    (folder / "rank0.json.gz").rename(folder / "rank0.JSON.GZ")
    (folder / "rank1.json.gz").rename(folder / "rank1.json")  # gzip data under a plain name
    (folder / "._rank0.json.gz").write_bytes(b"\x00\x05\x16\x07")  # a copier's companion file
    assert read_run([folder]).iterations == read_run([TRACES / "1f1b" / "run0"]).iterations
    _edit(folder / "rank1.json", lambda trace: trace["pipelineRun"].update(iterations=4))
    _edit(folder / "rank0.JSON.GZ", lambda trace: trace["pipelineRun"].update(iterations=4))
    with pytest.raises(TraceError, match="pipelineRun.iterations is 4, but its actions are of 3 iterations"):
        read_run([folder])
    huge = _copy(tmp_path / "huge")
    _edit(huge / "rank0.json.gz", _sends(lambda words: f"{words[0]} {words[1]} {10 ** 30}"))
    with pytest.raises(TraceError, match="sends 1,000,000,000,000,000,000,000,000,000,000 bytes: .* an integer from 1 "
                                         "to 1,000,000,000,000,000"):
        read_run([huge])
    result = run_here("pipeline_trace.py", "replay", str(TRACES / "zb-v" / "run0"), "--schedule", "ZB-V",
                      cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("zb-v: "), result.stderr
