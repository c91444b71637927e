"""The learned file, the Gymnasium environment, the charts, the training's outputs and the lower bound, guarded as
every other input and output: one line naming the file and the problem, nothing mixed, nothing replaced."""

import csv
import io
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import replace

import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, run_here, run_script

from pipeline_sim.config import EnvironmentGrid
from pipeline_sim.learned import LearnedPolicy, load_policy
from pipeline_sim.model import EnvParams, ParameterError, Policy
from pipeline_sim.sweep import SweepPlan, run_sweep, simulate_chunk
from tests.test_hardening import quick_rows, with_cell
from tests.test_learned import GREEDY_ORDER, ranked, written

BASE = EnvParams(n=4, num_gpus=2, schedule="zb-h1")
FORWARD_FIRST = [2.0, 3.0, 1.0, 0.0]  # another network: the same shapes, other decisions
#: A learned sweep of a few seconds: 8 environments of 37 policies at step 0.5, 10 samples.
LEARNED_GRID = {"n": [4, 6], "num_gpus": 2, "schedule": "zb-h1", "dispatch": ["greedy", "learned:p.npz"],
                "compute_jitter": [0.1, 0.2], "samples": 10}


def network(preference, path):
    return written(ranked(BASE, preference, hidden=8), path)


def learned_folder(folder, preference=GREEDY_ORDER):
    network(preference, folder / "p.npz")
    (folder / "grid.json").write_text(json.dumps(LEARNED_GRID))


# -- the learned file: its rows are its network's -------------------------------------------------

def test_the_network_travels_with_the_work_and_no_worker_reads_a_file(tmp_path, monkeypatch):
    """A worker elsewhere (a Dask worker in its own folder) gets the network the sweep read, never the file at the
    same relative path in its own folder."""
    learned_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    plan = SweepPlan(EnvironmentGrid.load("grid.json"), step=0.5)
    chunks = list(plan.chunks(0, 37))
    here = [simulate_chunk(chunk) for chunk in chunks]
    worker = tmp_path / "worker"
    worker.mkdir()
    network(FORWARD_FIRST, worker / "p.npz")
    monkeypatch.chdir(worker)
    there = [simulate_chunk(pickle.loads(pickle.dumps(chunk))) for chunk in chunks]
    assert there == here
    os.unlink(worker / "p.npz")
    assert [simulate_chunk(pickle.loads(pickle.dumps(chunk))) for chunk in chunks] == here


def test_a_policy_file_replaced_while_a_sweep_runs_does_not_mix(tmp_path, monkeypatch):
    learned_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    for output in ("clean.csv", "replaced.csv"):
        network(GREEDY_ORDER, tmp_path / "p.npz")
        sweep = run_sweep(SweepPlan(EnvironmentGrid.load("grid.json"), step=0.5), output, workers=1)
        next(sweep)
        next(sweep)  # the first rows are on disk
        if output == "replaced.csv":
            network(FORWARD_FIRST, tmp_path / "p.npz")
        for _ in sweep:
            pass
    assert (tmp_path / "replaced.csv").read_bytes() == (tmp_path / "clean.csv").read_bytes()


def test_a_file_of_the_same_size_and_time_is_read_again(tmp_path):
    path = network(GREEDY_ORDER, tmp_path / "p.npz")
    params = replace(BASE, dispatch=f"learned:{path}")
    stat = os.stat(path)
    first = load_policy(params)
    network(FORWARD_FIRST, path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = load_policy(params)
    assert second.digest != first.digest and second.layers[-1][1].tolist() == FORWARD_FIRST


def test_a_resume_after_the_network_changed_is_refused_in_one_line(tmp_path, monkeypatch):
    learned_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    sweep = run_sweep(SweepPlan(EnvironmentGrid.load("grid.json"), step=0.5), "out.csv")
    next(sweep)
    next(sweep)
    sweep.close()  # stopped with rows of the first network on disk
    network(FORWARD_FIRST, tmp_path / "p.npz")
    resumed = run_here("data_generator.py", "-c", "grid.json", "-o", "out.csv", "--step", "0.5", "--resume",
                       cwd=tmp_path)
    assert_one_line_error(resumed, "out.csv.partial holds rows of another network: p.npz changed since they were "
                                   "written; pass --overwrite")
    assert not (tmp_path / "out.csv").exists()
    fresh = run_here("data_generator.py", "-c", "grid.json", "-o", "fresh.csv", "--step", "0.5", cwd=tmp_path)
    again = run_here("data_generator.py", "-c", "grid.json", "-o", "out.csv", "--step", "0.5", "--overwrite",
                     cwd=tmp_path)
    assert fresh.returncode == again.returncode == 0, again.stderr
    assert (tmp_path / "out.csv").read_bytes() == (tmp_path / "fresh.csv").read_bytes()


def test_a_network_of_nan_or_infinite_weights_is_refused_naming_the_file(tmp_path):
    for value in (np.nan, np.inf):
        policy = ranked(BASE, GREEDY_ORDER, hidden=8)
        weight = policy.layers[0][0].copy()
        weight[3, 2] = value
        written(LearnedPolicy(((weight, policy.layers[0][1]), policy.layers[1]), policy.fields, policy.actions,
                              policy.about), tmp_path / "diverged.npz")
        with pytest.raises(ParameterError, match="'learned:.*diverged.npz': has weights that are NaN or infinite"):
            load_policy(replace(BASE, dispatch=f"learned:{tmp_path / 'diverged.npz'}"))
    (tmp_path / "grid.json").write_text(json.dumps(LEARNED_GRID | {"dispatch": "learned:diverged.npz"}))
    result = run_here("data_generator.py", "-c", "grid.json", "-o", "x.csv", cwd=tmp_path)
    assert_one_line_error(result, "dispatch = 'learned:diverged.npz': has weights that are NaN or infinite")
    chart = run_here("schedule_visualizer_single_channel.py", "-n", "4", "--num-gpus", "2", "--schedule", "zb-h1",
                     "--dispatch", "learned:diverged.npz", "--no-show", "--output", "c.png", cwd=tmp_path)
    assert_one_line_error(chart, "--dispatch: dispatch = 'learned:diverged.npz': has weights that are NaN")
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "c.png").exists()


def with_member(data, name, header, payload=b""):
    """An ``.npz``'s bytes with member ``name`` replaced by an array header ``header`` and ``payload``."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            if info.filename == f"{name}.npy":
                member = io.BytesIO()
                np.lib.format.write_array_header_1_0(member, header)
                target.writestr(info, member.getvalue() + payload)
            else:
                target.writestr(info, source.read(info))
    return out.getvalue()


@pytest.mark.parametrize("make, fragment", [
    (lambda data: (buffer := io.BytesIO(), np.save(buffer, np.zeros((41, 4))), buffer.getvalue())[2],
     "is not a readable policy file (not an .npz archive"),
    (lambda data: with_member(data, "weight.0", {"descr": "<f8", "fortran_order": False, "shape": (10 ** 12, 8)},
                              b"\0" * 64),
     "is not a readable policy file: its array weight.0 is damaged (its header claims (1000000000000, 8) of "
     "float64 in"),
    (lambda data: with_member(data, "fields", {"descr": "<U50000000", "fortran_order": False, "shape": (41,)}),
     "is not a readable policy file: its array fields is damaged (its header claims (41,) of <U50000000 in"),
    (lambda data: with_member(data, "bias.0", {"descr": "|O", "fortran_order": False, "shape": (8,)}),
     "is not a readable policy file: its array bias.0 is damaged"),
    (lambda data: data[:len(data) // 2], "is not a readable policy file (an .npz archive cut short or damaged"),
])
def test_a_policy_file_that_is_no_policy_or_claims_a_huge_shape_is_one_line(tmp_path, monkeypatch, make, fragment):
    data = network(GREEDY_ORDER, tmp_path / "p.npz").read_bytes()
    (tmp_path / "bad.npz").write_bytes(make(data))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParameterError) as refused:
        load_policy(replace(BASE, dispatch="learned:bad.npz"))
    assert str(refused.value).startswith("dispatch = 'learned:bad.npz': " + fragment), refused.value
    (tmp_path / "grid.json").write_text(json.dumps(LEARNED_GRID | {"dispatch": "learned:bad.npz"}))
    assert_one_line_error(run_here("data_generator.py", "-c", "grid.json", "-o", "x.csv", cwd=tmp_path), fragment)


def test_a_policy_file_larger_than_any_network_is_not_read_whole(tmp_path):
    with open(tmp_path / "huge.npz", "wb") as handle:
        handle.truncate(65 * 2 ** 20)  # sparse: no disk taken
    with pytest.raises(ParameterError, match="'learned:.*huge.npz': is larger than 64 MB, more than any policy file"):
        load_policy(replace(BASE, dispatch=f"learned:{tmp_path / 'huge.npz'}"))


# -- the Gymnasium environment and its episodes ---------------------------------------------------

def test_an_episode_or_environment_too_large_is_refused_at_once():
    from pipeline_sim.episode import Episode
    from pipeline_sim.rl import PipelineDispatchEnv

    huge = EnvParams(n=3_000_000, num_gpus=4, schedule="zb-h1")
    for make in (lambda: Episode(huge, Policy()), lambda: PipelineDispatchEnv(huge, Policy())):
        started = time.monotonic()
        with pytest.raises(ParameterError, match=r"^n = 3000000: on 4 GPUs gives about [\d,]+ tasks; at most "
                                                 r"1,000,000 fit in memory \(allow_large=True to try anyway\)$"):
            make()
        assert time.monotonic() - started < 1.0
    assert Episode(EnvParams(n=8, num_gpus=4), Policy(), allow_large=True).actions == 4


def test_an_action_outside_the_space_or_after_the_end_is_one_line():
    from pipeline_sim.rl import PipelineDispatchEnv

    env = PipelineDispatchEnv(EnvParams(n=4, num_gpus=2, schedule="zb-h1"), Policy())
    env.reset(seed=0)
    for action in (-1, 4, 2.7, 2.0, "1", True, np.float64(1.0)):
        with pytest.raises(ParameterError, match=r"^action = .*: must be a whole number from 0 to 3 \(one of "
                                                 r"B/I.0, F.0, W.0, wait\)$"):
            env.step(action)
    done = False
    while not done:
        done = env.step(np.int64(np.argmax(env.action_masks())))[2]
    with pytest.raises(ParameterError, match=r"^action = 0: comes after the episode's end: reset it first$"):
        env.step(0)
    with pytest.raises(ParameterError, match="after the episode's end"):
        env.episode.step(0)
    env.reset(seed=0)
    assert env.step(np.array(int(np.argmax(env.action_masks()))))[1] <= 0.0


# -- the compile cache of the observation ---------------------------------------------------------

def test_a_damaged_compile_cache_of_the_observation_is_compiled_again_with_one_line(tmp_path):
    shutil.copytree(ROOT / "pipeline_sim", tmp_path / "pipeline_sim")
    network(GREEDY_ORDER, tmp_path / "p.npz")
    code = "import sys; from pipeline_sim.cli.visualize import single_channel; sys.exit(single_channel())"
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg"}

    def chart(name):
        return subprocess.run([sys.executable, "-c", code, "-n", "4", "--num-gpus", "2", "--schedule", "zb-h1",
                               "--dispatch", "learned:p.npz", "--no-show", "--output", name], cwd=tmp_path,
                              env=environment, capture_output=True, text=True, timeout=300)

    assert chart("made.png").returncode == 0  # the observation compiled into this copy's cache, if it was not
    (data,) = (tmp_path / "pipeline_sim" / "kernel" / "__pycache__").glob("observation.observe-*.1.nbc")
    data.write_bytes(bytes(range(256)) * 16)
    first = chart("a.png")
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    (notice,) = [line for line in first.stderr.splitlines() if "compile" in line]
    assert re.fullmatch(r"the compile cache was damaged \(\w+\); the kernel was compiled again and its cache "
                        r"rewritten", notice), notice
    assert len(data.read_bytes()) != 4096
    second = chart("b.png")
    assert second.returncode == 0 and "compile" not in second.stderr, second.stderr


# -- inputs read within a limit -------------------------------------------------------------------

@pytest.mark.parametrize("endless", [False, True], ids=["a huge file", "/dev/zero"])
def test_an_order_file_is_not_read_whole(tmp_path, endless):
    path = "/dev/zero"
    if not endless:
        path = str(tmp_path / "huge.txt")
        with open(path, "wb") as handle:
            handle.truncate(100 * 2 ** 20)  # sparse: no disk taken
    started = time.monotonic()
    result = run_here("schedule_visualizer_single_channel.py", "--order", path, "--no-show", "--output", "c.png",
                      cwd=tmp_path)
    assert_one_line_error(result, f"--order {path}: larger than 64 MB; an order file is one line per GPU")
    assert time.monotonic() - started < 10 and not (tmp_path / "c.png").exists()


# -- plot_heatmap checks the bound and the priorities ---------------------------------------------

@pytest.fixture(scope="module")
def dispatch_rows(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dispatch")
    (folder / "grid.json").write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": "zb-h1",
                                                  "dispatch": ["static", "greedy"]}))
    made = run_here("data_generator.py", "-c", "grid.json", "-o", "d.csv", "--step", "0.5", cwd=folder)
    assert made.returncode == 0, made.stderr
    return (folder / "d.csv").read_text().splitlines(keepends=True)


@pytest.mark.parametrize("value, shown", [("-3.0", "-3"), ("nan", "an empty cell"), ("", "an empty cell"),
                                          ("inf", "inf"), ("0", "0"), ("1e9", "1e+09"), ("high", "'high'")])
def test_plot_heatmap_checks_the_lower_bound(tmp_path, dispatch_rows, value, shown):
    (tmp_path / "bad.csv").write_text("".join(with_cell(dispatch_rows, 5, "lower_bound", value)))
    result = run_here("plot_heatmap.py", "bad.csv", "-o", "maps", cwd=tmp_path)
    assert_one_line_error(result, f"CSV bad.csv: line 6 has lower_bound = {shown}; a lower bound must be a finite "
                                  f"number > 0, at most its row's completion_time")
    assert not (tmp_path / "maps").exists()


def test_plot_heatmap_names_a_blank_priority(tmp_path):
    (tmp_path / "blank.csv").write_text("".join(with_cell(quick_rows(), 3, "prio_fwd_prop", "")))
    result = run_here("plot_heatmap.py", "blank.csv", "-o", "maps", cwd=tmp_path)
    assert_one_line_error(result, "CSV blank.csv: line 4 has prio_fwd_prop = an empty cell; must be a number (only "
                                  "a kind with an exclusive tier, tier_fwd_prop, has none)")


# -- the lower bound at extreme length ratios -----------------------------------------------------

#: Forwards of about 3 x 10^6 against transfers of 0.014: the kernel ends transfers that close to an event at the
#: event (its tolerance, relative to the time), and the run comes in 0.03 under the bound on the exact lengths.
EXTREME = {"n": 6, "num_gpus": 4, "fwd_len": 2973826.788334166, "bwd_len": 5375228.434950271,
           "prop_len": 0.014490845602804317, "sync_base_len": 0.0, "schedule": "gpipe", "dispatch": "critical-path"}


def extreme_environments(count):
    rng = random.Random(38)
    yield EnvParams(**EXTREME), 0
    while count:
        big, small = 10 ** rng.uniform(4, 7), 10 ** rng.uniform(-2, 0)
        try:
            params = EnvParams(n=rng.randint(2, 8), num_gpus=rng.randint(2, 4), fwd_len=big,
                               bwd_len=big * rng.uniform(1, 3), prop_len=small,
                               sync_base_len=rng.choice([small, 0.0, big]),
                               schedule=rng.choice(["gpipe", "1f1b", "zb-h1", "zb-v"]),
                               dispatch=rng.choice(["static", "greedy", "critical-path", "zb-adaptive"]),
                               compute_jitter=rng.choice([0.0, 0.2]), comm_jitter=rng.choice([0.0, 0.2]),
                               ingress_capacity=rng.choice([0.5, 1.0]))
        except ParameterError:
            continue
        count -= 1
        yield params, rng.randrange(3)


def test_the_bound_never_exceeds_a_run_at_extreme_length_ratios():
    from pipeline_sim.engine import simulate
    from pipeline_sim.rl import PipelineDispatchEnv

    policies = [Policy(), Policy(exclusive_tiers={"grad_sync": "a"}),
                Policy(priorities={"fwd_prop": 0.1, "grad_prop": 0.1, "grad_sync": 1.0})]
    for params, sample in extreme_environments(150):
        for policy in policies:
            run = simulate(params, policy, sample)
            assert run.lower_bound <= run.completion_time, (params, sample)
    env = PipelineDispatchEnv(EnvParams(**EXTREME), Policy())
    env.reset(seed=0)
    done = False
    while not done:
        _, _, done, _, info = env.step(int(np.argmax(env.action_masks())))
    assert info["lower_bound"] <= info["completion_time"]
    plan = SweepPlan(EnvironmentGrid.from_mapping(EXTREME | {"samples": 1}, "extreme"), step=0.5)
    (chunk,) = plan.chunks(0, 100)
    rows = list(csv.DictReader(io.StringIO(plan.header + simulate_chunk(chunk)[0])))
    assert len(rows) == 37 and all(float(row["lower_bound"]) <= float(row["completion_time"]) and
                                   float(row["bound_gap"]) >= 0.0 for row in rows)


# -- charts: named by dispatcher, locked, never replaced silently; a kill leaves no temporary ----------------

CHART = "schedule_visualizer_single_channel.py"
SMALL = ("-n", "4", "--num-gpus", "2", "--schedule", "zb-h1", "--no-show")


def test_a_chart_is_named_by_its_dispatcher_and_never_replaced_silently(tmp_path):
    network(GREEDY_ORDER, tmp_path / "p.npz")
    for dispatch in ("static", "greedy", "learned:p.npz"):
        made = run_here(CHART, *SMALL, "--dispatch", dispatch, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
    gantt = tmp_path / "outputs" / "gantt"
    assert sorted(path.name for path in gantt.iterdir()) == [
        "gantt_single_channel_zb-h1_greedy_n4_gpus2.png", "gantt_single_channel_zb-h1_learned-p_n4_gpus2.png",
        "gantt_single_channel_zb-h1_n4_gpus2.png"]
    static = gantt / "gantt_single_channel_zb-h1_n4_gpus2.png"
    before = static.read_bytes()
    again = run_here(CHART, *SMALL, "--slow-gpu", "1", "--slow-factor", "2", cwd=tmp_path)
    assert_one_line_error(again, "outputs/gantt/gantt_single_channel_zb-h1_n4_gpus2.png exists; pass --overwrite "
                                 "to replace it or choose another --output")
    assert static.read_bytes() == before
    model = run_here(CHART, *SMALL, "--model", "llama3-8b", "--tensor-parallel", "8", cwd=tmp_path)
    assert model.returncode == 0, model.stderr  # a model's chart is its own
    assert (gantt / "gantt_single_channel_llama3-8b_t8_zb-h1_n4_gpus2.png").is_file() and static.read_bytes() == before
    trace = run_here(CHART, *SMALL, "--output", "c.png", "--trace", str(tmp_path / "greedy.npz.json"), cwd=tmp_path)
    assert trace.returncode == 0, trace.stderr
    chart = (tmp_path / "c.png").read_bytes()
    traced = run_here(CHART, *SMALL, "--output", "d.png", "--trace", "greedy.npz.json", cwd=tmp_path)
    assert_one_line_error(traced, "greedy.npz.json exists; pass --overwrite to replace it or choose another --trace")
    assert not (tmp_path / "d.png").exists()
    replaced = run_here(CHART, *SMALL, "--slow-gpu", "1", "--slow-factor", "2", "--output", "c.png", "--overwrite",
                        cwd=tmp_path)
    assert replaced.returncode == 0 and (tmp_path / "c.png").read_bytes() != chart


def test_a_chart_is_locked_as_every_output(tmp_path):
    from pipeline_sim.files import exclusive_writer

    with exclusive_writer(tmp_path / "c.png"):
        result = run_script(CHART, *SMALL, "--output", "c.png", cwd=tmp_path)
    assert_one_line_error(result, f"another run (pid {os.getpid()}) is writing c.png")
    assert not (tmp_path / "c.png").exists()


def test_a_chart_killed_while_written_leaves_no_temporary_for_good(tmp_path):
    """The kill leaves its temporary beside the chart; the next run of that chart, holding its lock, removes it."""
    big = ("-n", "48", "--num-gpus", "8", "--schedule", "zb-h1", "--no-show", "--show-memory", "--output", "c.png")
    for attempt in range(5):
        process = subprocess.Popen([sys.executable, str(ROOT / CHART), *big], cwd=tmp_path,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".c.png.*.png")) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        process.kill()
        process.wait(timeout=60)
        if list(tmp_path.glob(".c.png.*.png")):
            break
        (tmp_path / "c.png").unlink(missing_ok=True)
    (leftover,) = tmp_path.glob(".c.png.*.png")
    again = run_here(CHART, *SMALL, "--output", "c.png", "--overwrite", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.png"], leftover
