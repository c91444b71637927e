"""The sweep library: rows equal direct simulations, order and bytes fixed, interruptions lose nothing."""

import csv
import io
import json
import re

import pytest

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.config import EnvironmentGrid
from pipeline_sim.sweep import ResumeError, SweepPlan, partial_paths, rows_per_chunk, run_sweep, sweep_columns

SMALL = {"n": [3, 5], "num_gpus": [2, 3], "sync_freq": [1, 2]}


@pytest.fixture
def plan():
    return SweepPlan(EnvironmentGrid.from_mapping(SMALL), step=0.25)


def sweep(plan, output, **kwargs):
    for _ in run_sweep(plan, output, **kwargs):
        pass
    return output.read_bytes()


def test_rows_equal_direct_calls(plan, tmp_path):
    rows = list(csv.DictReader(io.StringIO(sweep(plan, tmp_path / "out.csv").decode())))
    assert len(rows) == plan.num_simulations == 8 * len(plan.policies)
    assert list(rows[0]) == list(sweep_columns(workload=False)[0])
    for row in rows[::7]:
        priorities = {k: float(row[f"prio_{k}"]) for k in ("fwd_prop", "grad_prop", "grad_sync") if row[f"prio_{k}"]}
        tiers = {k: row[f"tier_{k}"] for k in ("fwd_prop", "grad_prop", "grad_sync") if row[f"tier_{k}"]}
        assert not set(priorities) & set(tiers)
        direct = calculate_full_pipeline_schedule(
            n=int(row["n"]), num_gpus=int(row["num_gpus"]), sync_freq=int(row["sync_freq"]),
            fwd_len=float(row["fwd_len"]), bwd_len=float(row["bwd_len"]), prop_len=float(row["prop_len"]),
            sync_base_len=float(row["sync_base_len"]), fwd_impact=float(row["fwd_impact"]),
            bwd_impact=float(row["bwd_impact"]), ingress_capacity=float(row["ingress_capacity"]),
            priorities=priorities, exclusive_tiers=tiers)
        assert float(row["completion_time"]) == direct.completion_time
        assert row["policy"] == direct.policy.label


def test_grid_then_policy_order(plan, tmp_path):
    rows = list(csv.DictReader(io.StringIO(sweep(plan, tmp_path / "out.csv").decode())))
    per_env = len(plan.policies)
    labels = [p.label for p in plan.policies]
    for e, env in enumerate(plan.grid):
        block = rows[e * per_env:(e + 1) * per_env]
        assert {(int(r["n"]), int(r["num_gpus"]), int(r["sync_freq"])) for r in block} == \
               {(env.n, env.num_gpus, env.sync_freq)}
        assert [r["policy"] for r in block] == labels


def test_same_bytes_whatever_the_workers(plan, tmp_path):
    serial = sweep(plan, tmp_path / "one.csv", workers=1)
    parallel = sweep(plan, tmp_path / "two.csv", workers=2)
    again = sweep(plan, tmp_path / "three.csv", workers=3)
    assert serial == parallel == again
    assert not list(tmp_path.glob("*.partial*"))


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("stop_after", [1, 3])
def test_interrupted_then_resumed_equals_uninterrupted(plan, tmp_path, workers, stop_after):
    reference = sweep(plan, tmp_path / "reference.csv")
    output = tmp_path / "out.csv"
    progress = run_sweep(plan, output, workers=workers)
    for _, done in zip(range(stop_after + 1), progress):
        pass
    progress.close()  # what Ctrl-C does to the generator
    partial, meta = partial_paths(output)
    assert not output.exists() and partial.exists() and meta.exists()
    kept = partial.read_bytes()
    assert kept.count(b"\n") - 1 == done and 0 < done < plan.num_simulations
    assert reference.startswith(kept)
    progress = run_sweep(plan, output, workers=workers, resume=True)
    assert next(progress) == done
    for _ in progress:
        pass
    assert output.read_bytes() == reference
    assert not partial.exists() and not meta.exists()


def _stopped(plan, tmp_path):
    """The reference bytes of ``plan``'s sweep, and a sweep of it stopped after its first rows: its output and
    partial file."""
    reference = sweep(plan, tmp_path / "reference.csv")
    output = tmp_path / "out.csv"
    progress = run_sweep(plan, output)
    next(progress), next(progress)
    progress.close()
    return reference, output, partial_paths(output)[0]


def test_a_torn_last_line_is_cut_and_redone(plan, tmp_path):
    reference, output, partial = _stopped(plan, tmp_path)
    with open(partial, "ab") as handle:
        handle.write(b"8,4,1,1.0,2.0,1.0,2.0,0.2")  # killed in the middle of a write
    assert sweep(plan, output, resume=True) == reference


@pytest.mark.parametrize("line", [b"xx,yy\n", b"\n"])
def test_a_line_that_is_no_row_is_computed_again_with_the_rows_after_it(plan, tmp_path, line):
    reference, output, partial = _stopped(plan, tmp_path)
    rows = partial.read_bytes().count(b"\n") - 1
    with open(partial, "ab") as handle:
        handle.write(line + reference.splitlines(keepends=True)[rows + 1])  # a real row after it
    told = []
    progress = run_sweep(plan, output, resume=True, report=told.append)
    assert next(progress) == rows
    for _ in progress:
        pass
    assert output.read_bytes() == reference
    assert told == [f"{partial}: row {rows + 1:,} is not a row of this sweep; computing the rows from {rows:,} on "
                    f"again"]


def test_a_resume_of_a_sweep_that_finished_says_what_it_found_and_leaves_it(plan, tmp_path):
    """Killed after its cleanup, before its process ended: no record is left to say whose rows the file holds."""
    output = tmp_path / "out.csv"
    reference = sweep(plan, output)
    with pytest.raises(ResumeError, match=r"out\.csv exists and nothing of a sweep of it is left to continue: if this "
                                          r"command wrote it, it is complete; pass --overwrite to compute it again"):
        next(run_sweep(plan, output, resume=True))
    assert output.read_bytes() == reference


def test_resume_refuses_a_different_plan(plan, tmp_path):
    output = tmp_path / "out.csv"
    progress = run_sweep(plan, output)
    next(progress), next(progress)
    progress.close()
    other = SweepPlan(EnvironmentGrid.from_mapping(SMALL), step=0.5)
    with pytest.raises(ResumeError, match=r"out\.csv\.partial was written with --step 0\.25 \(this run: 0\.5\); "
                                          r"rerun with its settings and --resume to continue it"):
        next(run_sweep(other, output, resume=True))


def test_resume_without_partial_starts_fresh(plan, tmp_path):
    assert sweep(plan, tmp_path / "a.csv", resume=True) == sweep(plan, tmp_path / "b.csv")


def test_chunks_cover_every_row_once(plan):
    for workers in (1, 2, 8, 64):
        size = rows_per_chunk(plan, workers)
        for start in (0, 5, len(plan.policies), plan.num_simulations - 1):
            chunks = list(plan.chunks(start, size))
            assert sum(c.stop - c.first for c in chunks) == plan.num_simulations - start
            assert all(0 < c.stop - c.first <= size for c in chunks)


def test_a_look_ahead_environment_is_cut_into_units_of_minutes():
    """A look-ahead iteration of 16 GPUs and 64 micro-batches takes about a minute: a unit of 20 samples of a
    hundred policies took hours before it reported progress or kept any work. Compiled rules keep their units."""
    from pipeline_sim.cost import simulation_seconds
    from pipeline_sim.sweep import CHUNK_SECONDS
    from pipeline_sim.taskgraph import estimated_tasks

    grid = EnvironmentGrid.from_mapping({"n": [8, 64], "num_gpus": 16, "schedule": "zb-h1", "compute_jitter": 0.2,
                                         "dispatch": ["static", "lookahead"], "samples": 20})
    plan = SweepPlan(grid, allow_large=True)
    size = rows_per_chunk(plan, 2)
    chunks = list(plan.chunks(0, size))
    assert sum(chunk.stop - chunk.first for chunk in chunks) == plan.num_rows
    for params in grid:
        rows = [chunk.stop - chunk.first for chunk in chunks if chunk.params == params]
        row_seconds = simulation_seconds(params, estimated_tasks(params)) * plan.samples
        if params.dispatch == "static":
            assert rows[:-1] == [size] * (len(rows) - 1)
        else:
            assert all(count == 1 or count * row_seconds <= CHUNK_SECONDS for count in rows)
            assert max(rows) < size
    assert max(chunk.stop - chunk.first for chunk in chunks if chunk.params.n == 64 and
               chunk.params.dispatch == "lookahead") == 1


def test_the_day_limit_prices_samples_only_where_noise_draws_them(monkeypatch):
    """A noise-free environment runs once whatever ``samples`` says: 50 samples of a look-ahead grid of about two
    hours were priced as 50 runs and refused."""
    from pipeline_sim.config import ConfigError

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    still = {"n": 64, "num_gpus": 16, "schedule": "zb-h1", "dispatch": "lookahead", "samples": 50}
    assert SweepPlan(EnvironmentGrid.from_mapping(still)).num_simulations == 121 * 50
    with pytest.raises(ConfigError, match=r"would take about \d+ hours on 2 workers \(each look-ahead"):
        SweepPlan(EnvironmentGrid.from_mapping({**still, "compute_jitter": 0.1}))
    # a schedule that does not split its backward has fewer decisions to try: 1F1B here takes 4 to 11 s an
    # iteration, where ZB-H1 takes 33 to 78
    assert SweepPlan(EnvironmentGrid.from_mapping({**still, "schedule": "1f1b", "compute_jitter": [0.1, 0.2],
                                                   "samples": 20}))
    # beyond the solver's size a hindsight order is a rule's: the time is the simulations', not the solver's
    with pytest.raises(ConfigError, match=r"hours on 2 workers; at most 24 hours") as refused:
        SweepPlan(EnvironmentGrid.from_mapping({"n": {"start": 300, "stop": 310, "step": 1}, "num_gpus": 64,
                                                "dispatch": "hindsight", "compute_jitter": 0.1, "samples": 1000}))
    assert "solver" not in str(refused.value)


def test_the_day_limit_counts_the_workers_a_sweep_runs_in(monkeypatch):
    """``--workers 1`` on two cores takes twice the hours that every core would: the estimate counts the workers
    asked for, never more than the cores or the sweep's units of work."""
    from pipeline_sim.config import ConfigError

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    grid = EnvironmentGrid.from_mapping({"n": {"start": 300, "stop": 310, "step": 1}, "num_gpus": 64,
                                         "dispatch": "hindsight", "compute_jitter": 0.1, "samples": 1000})
    said = {}
    for workers in (0, 1, 2, 8):
        with pytest.raises(ConfigError, match=r"hours on \d worker") as refused:
            SweepPlan(grid, workers=workers)
        hours, running = re.search(r"about ([\d,]+) hours on (\d) worker", str(refused.value)).groups()
        said[workers] = (int(hours.replace(",", "")), int(running))
    assert [said[workers][1] for workers in (0, 1, 2, 8)] == [2, 1, 2, 2]
    assert said[0] == said[2] == said[8] and abs(said[1][0] - 2 * said[2][0]) <= 1
    # a hindsight environment is one unit of work: two workers asked for, one runs it
    with pytest.raises(ConfigError, match=r"about \d+ hours on 1 worker;"):
        SweepPlan(EnvironmentGrid.from_mapping({"n": 300, "num_gpus": 64, "dispatch": "hindsight",
                                                "compute_jitter": 0.1, "samples": 4000}), workers=2)


def test_a_remote_sweep_is_priced_once_its_workers_are_counted(monkeypatch):
    """A plan for a remote cluster leaves the day limit until the cluster's workers are known; then it counts them
    (no more than the sweep's units of work), not this machine's cores."""
    from pipeline_sim.config import ConfigError

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    grid = EnvironmentGrid.from_mapping({"n": 64, "num_gpus": 16, "schedule": "zb-h1", "dispatch": "lookahead",
                                         "samples": 50, "compute_jitter": 0.1})
    with pytest.raises(ConfigError, match=r"hours on 2 workers"):
        SweepPlan(grid)
    plan = SweepPlan(grid, remote=True)
    with pytest.raises(ConfigError, match=r"about \d+ hours on 2 workers"):
        plan.check_hours(2)
    plan.check_hours(16)
    SweepPlan(grid, remote=True, allow_large=True).check_hours(1)


def test_plan_rejects_bad_simulator():
    with pytest.raises(ValueError, match="simulator"):
        SweepPlan(EnvironmentGrid.from_mapping({}), simulator="triple")


def test_golden_csv(tmp_path):
    """Regenerate after an intended model change with:
    python data_generator.py -c configs/quick.json --step 0.5 -o tests/data/quick_step0.5.csv
    """
    from conftest import ROOT

    plan = SweepPlan(EnvironmentGrid.load(ROOT / "configs" / "quick.json"), step=0.5)
    golden = (ROOT / "tests" / "data" / "quick_step0.5.csv").read_bytes()
    assert sweep(plan, tmp_path / "quick.csv", workers=2) == golden


ABANDONED_MAP = """
import sys
from pipeline_sim.parallel import ordered_map

def large(index):
    return bytes(4_000_000)  # far more than a pipe holds: the worker is still sending it when stopped

results = ordered_map(large, range(16), 2)
next(results)
results.close()  # what Ctrl-C does to a sweep: the workers are stopped mid-send
print("closed", flush=True)
"""


def test_a_map_stopped_while_workers_send_lets_the_process_exit(tmp_path):
    """The interpreter's exit joins the pool's thread; it must not wait for the rest of a torn message."""
    import subprocess
    import sys

    from conftest import ROOT

    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", ABANDONED_MAP], cwd=ROOT, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0 and done.stdout == "closed\n" and not done.stderr, done.stderr


def _frozen_in_worker(_: int) -> int:
    import gc

    return gc.get_freeze_count()


def test_forked_workers_find_the_parents_objects_frozen():
    """The collector in a forked worker must not visit (and so copy) what the parent held before the fork; the
    parent's objects are collected again once the map ends."""
    import gc

    from pipeline_sim.parallel import ordered_map

    held = [{"environment": i} for i in range(10_000)]  # a drawing's first reading, in small
    assert gc.get_freeze_count() == 0
    frozen = list(ordered_map(_frozen_in_worker, range(4), 2))
    assert min(frozen) >= len(held)
    assert gc.get_freeze_count() == 0
    abandoned = ordered_map(_frozen_in_worker, range(40), 2)
    next(abandoned)
    abandoned.close()
    assert gc.get_freeze_count() == 0


def test_a_long_unit_moves_the_progress_as_each_draw_is_done(tmp_path, monkeypatch):
    """A unit of work can take minutes (a hindsight environment's draws): while it runs, ``running`` is told the
    simulations of each draw done, not only those of the rows written; the rows are the same."""
    import time

    from pipeline_sim import parallel
    from pipeline_sim import sweep as sweep_module

    original = sweep_module.figures_of

    def slow(*args):
        time.sleep(0.3)  # the workers are forked with this in place: each draw takes a while
        return original(*args)

    plan = SweepPlan(EnvironmentGrid.from_mapping({"n": 4, "num_gpus": 2, "compute_jitter": 0.2, "samples": 3}),
                     step=0.25)
    rows = len(plan.policies)
    told: list[tuple[int, float]] = []
    plain = list(run_sweep(plan, tmp_path / "plain.csv", workers=1))
    monkeypatch.setattr(sweep_module, "figures_of", slow)
    monkeypatch.setattr(parallel, "WAIT_SECONDS", 0.02)
    watched = list(run_sweep(plan, tmp_path / "watched.csv", workers=1,
                             running=lambda simulations, seconds: told.append((simulations, seconds))))
    assert plain == watched == [0, rows]  # the environment is one unit
    assert told == sorted(told) and told[-1][0] <= 3 * rows
    # before the first draw, after the first and after the second: a third of the environment's estimate each
    for draws in range(3):
        seconds = {round(seconds / plan.estimated_seconds, 9) for simulations, seconds in told
                   if simulations == draws * rows}
        assert seconds == {round(draws / 3, 9)}, told
    assert (tmp_path / "plain.csv").read_bytes() == (tmp_path / "watched.csv").read_bytes()


def test_a_sweeps_progress_weighs_each_environment_by_its_estimated_cost():
    """A look-ahead environment costs a hundred static ones (``cost``): its rows weigh as much in the progress,
    so that the time left is not read off the static rows that go first."""
    from pipeline_sim.cost import simulation_seconds
    from pipeline_sim.model import EnvParams
    from pipeline_sim.taskgraph import estimated_tasks

    plan = SweepPlan(EnvironmentGrid.from_mapping({"n": 16, "num_gpus": 4, "schedule": "zb-h1",
                                                   "dispatch": ["static", "lookahead"]}), step=0.5)
    rows = len(plan.policies)
    static, ahead = (simulation_seconds(params, estimated_tasks(params)) * rows
                     for params in (EnvParams(n=16, num_gpus=4, schedule="zb-h1", dispatch=dispatch)
                                    for dispatch in ("static", "lookahead")))
    assert ahead > 100 * static
    assert plan.estimated_seconds == pytest.approx(static + ahead)
    assert [plan.seconds_done(done) for done in (0, rows, rows + rows // 2, 2 * rows)] == \
        pytest.approx([0.0, static, static + ahead * (rows // 2) / rows, static + ahead])
    assert plan.seconds_done(2 * rows) == plan.estimated_seconds  # the bar ends at its total


def test_a_sweeps_time_left_is_its_average_rate_over_the_work_left(monkeypatch):
    """Redraws without progress between a sweep's steps (the bar follows its workers twice a second) must not shorten
    the time a step's work is counted over: at a fifth of the estimated work done after 20 s, 80 s are left, not
    the 4 s that the last half-second's step alone would say."""
    import tqdm.std

    from pipeline_sim.cli.generate import _Bar

    now = [1000.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])
    plan = SweepPlan(EnvironmentGrid.from_mapping({"n": 8, "num_gpus": 4}), step=0.5)
    bar = _Bar(plan, 0)
    try:
        total = plan.estimated_seconds
        for second in range(1, 21):
            now[0] = 1000.0 + second - 0.5
            bar.show(0, total * (0.1 if second > 10 else 0.0))  # a redraw, nothing new
            now[0] = 1000.0 + second
            bar.show(0, total * (0.1 if second >= 10 else 0.0) + total * (0.1 if second >= 20 else 0.0))
        meter = bar.bar.format_meter(**bar.bar.format_dict)
        elapsed, minutes, seconds = map(int, re.search(r"\[00:(\d\d)<(\d\d):(\d\d)\]$", meter).groups())
        assert meter.startswith(" 20%|") and elapsed == 20 and abs(60 * minutes + seconds - 80) <= 1, meter
    finally:
        bar.close()


def _raises_its_own_timeout(_: int) -> None:
    raise TimeoutError("the worker's own")


def test_a_workers_own_timeout_error_reaches_the_caller():
    """Waiting for a result with the waits told (``waiting``) must not take a call's own ``TimeoutError`` for a wait
    that timed out, and wait again for ever."""
    from pipeline_sim.parallel import ordered_map, shared_count

    waits = []

    def waiting():
        waits.append(1)
        assert len(waits) < 20, "the error was taken for a wait"

    with pytest.raises(TimeoutError, match="the worker's own"):
        list(ordered_map(_raises_its_own_timeout, [0], 1, isolate=True, ticks=shared_count(), waiting=waiting))


def test_the_stops_are_held_only_where_the_system_has_signal_masks(monkeypatch):
    """Held while forking and taken again by each child; where there are no masks (Windows, which never forks)
    nothing is held and nothing fails."""
    import signal

    from pipeline_sim.parallel import release_stops, stops_held

    with stops_held():
        assert {signal.SIGINT, signal.SIGTERM} <= signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, [])
    monkeypatch.delattr(signal, "pthread_sigmask")
    with stops_held():
        release_stops()


def test_a_workload_grid_reads_as_before_and_a_partial_of_an_earlier_model_is_not_resumed(tmp_path):
    """A grid that gives no grad_bytes records what it did before the key existed (bytes_per_param 16, no
    grad_bytes), so that its settings still compare; a partial written by an earlier revision of the workload model
    (its record without the revision) is refused, saying so, rather than continued with rows of another model."""
    from pipeline_sim.sweep import WORKLOAD_REVISION, sweep_record

    config = {"model": "llama3-8b", "gpu": "h100-80gb", "num_gpus": 2, "data_parallel": 2, "global_batch_size": 8,
              "zero": [0, 1]}
    grid = EnvironmentGrid.from_mapping(config)
    assert "grad_bytes" not in grid.as_dict() and grid.as_dict()["bytes_per_param"] == [16.0]
    given = EnvironmentGrid.from_mapping({**config, "grad_bytes": 4}).as_dict()
    assert given["grad_bytes"] == [4] and given["bytes_per_param"] == [None]  # each workload follows its grad_bytes
    plan = SweepPlan(grid, step=0.5)
    output = tmp_path / "w.csv"
    progress = run_sweep(plan, output)
    next(progress), next(progress)
    progress.close()
    partial, meta = partial_paths(output)
    record = sweep_record(meta)
    assert record["workload_model"] == WORKLOAD_REVISION
    del record["workload_model"]
    record["fingerprint"] = "written before the revision"
    meta.write_text(json.dumps(record))
    with pytest.raises(ResumeError, match=r"w\.csv\.partial was written by an earlier revision of the workload model"):
        next(run_sweep(plan, output, resume=True))
