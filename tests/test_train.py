"""Training a learned dispatcher (docs/model.md section 12.5): a tiny run learns something, is reproducible, and the
command line trains from a sweep config whose sweep then reads the policy. Needs the [rl] extra."""

from __future__ import annotations

import csv
import errno
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest

pytest.importorskip("sb3_contrib")

from pipeline_sim.episode import Episode  # noqa: E402
from pipeline_sim.learned import LearnedPolicy  # noqa: E402
from pipeline_sim.model import DEFAULT_POLICY, EnvParams  # noqa: E402
from pipeline_sim.rl.train import VALIDATION_SAMPLES, Settings, savings, train  # noqa: E402
from tests.conftest import ROOT, assert_one_line_error, assert_png_drawn, run_here  # noqa: E402

ENVIRONMENTS = [EnvParams(n=8, num_gpus=4, schedule="zb-h1", compute_jitter=0.2, comm_jitter=0.2)]
TINY = Settings(steps=6144, rollout=256, evaluate_every=2048, validation_samples=2, seed=3)


def random_time(params: EnvParams, samples: range, seed: int = 0) -> float:
    """Mean iteration time of a policy choosing uniformly among the actions the mask allows."""
    rng = np.random.default_rng(seed)
    episode = Episode(params, DEFAULT_POLICY)
    times = []
    for sample in samples:
        episode.reset(sample)
        while not episode.done:
            episode.step(int(rng.choice(np.flatnonzero(episode.mask()))))
        times.append(episode.completion_time)
    return math.fsum(times) / len(times)


def played_time(params: EnvParams, policy: LearnedPolicy, samples: range) -> float:
    from pipeline_sim.learned import play

    episode = Episode(params, DEFAULT_POLICY)
    return math.fsum(play(episode, policy, sample).completion_time for sample in samples) / len(samples)


@pytest.fixture(scope="module")
def tiny_run():
    return train(ENVIRONMENTS, DEFAULT_POLICY, TINY)


def test_a_few_thousand_decisions_beat_a_random_policy(tiny_run):
    policy, curve, completed = tiny_run
    assert completed and curve[-1].steps >= TINY.steps
    assert [point.steps for point in curve] == [4, 2048, 4096, 6144]  # one update of 4 x 256 decisions a step
    samples = range(10)  # sweep samples: neither training nor validation draws
    learned, random = played_time(ENVIRONMENTS[0], policy, samples), random_time(ENVIRONMENTS[0], samples)
    assert learned < 0.97 * random, (learned, random)
    assert policy.fields == Episode.layout(ENVIRONMENTS[0])[0]
    assert policy.about["steps"] == TINY.steps and policy.about["reference"] == "zb-h1"
    # the kept network is the best played on the validation draws
    validation = [VALIDATION_SAMPLES + k for k in range(TINY.validation_samples)]
    assert savings(ENVIRONMENTS, DEFAULT_POLICY, policy, validation) == max(p.validation_saving for p in curve)


def test_a_checkpoint_plays_the_network_trained_on_every_rollout_before_it(monkeypatch):
    """A checkpoint due on a rollout's last decision waits until the network is trained on that rollout."""
    from pipeline_sim.rl import train as module

    updates = []
    original = module.extract

    def extract(model, fields, actions, about):
        updates.append((about["trained_steps"], model._n_updates))
        return original(model, fields, actions, about)
    monkeypatch.setattr(module, "extract", extract)
    settings = Settings(steps=2048, rollout=256, evaluate_every=1024, validation_samples=1, seed=7)
    _, curve, _ = train(ENVIRONMENTS, DEFAULT_POLICY, settings)
    assert [point.steps for point in curve] == [4, 1024, 2048]
    per_rollout = updates[-1][1] // 2  # gradient steps per rollout trained on
    assert per_rollout > 0 and updates == [(4, 0), (1024, per_rollout), (2048, 2 * per_rollout)]


def test_training_is_reproducible_under_a_seed():
    settings = Settings(steps=1024, rollout=256, evaluate_every=1024, validation_samples=1, seed=7)
    first, _, _ = train(ENVIRONMENTS, DEFAULT_POLICY, settings)
    second, _, _ = train(ENVIRONMENTS, DEFAULT_POLICY, settings)
    assert first.to_bytes() == second.to_bytes()


def test_one_network_reads_one_layout():
    from pipeline_sim.model import ParameterError

    mixed = [ENVIRONMENTS[0], EnvParams(n=8, num_gpus=4, schedule="interleaved-1f1b")]
    with pytest.raises(ParameterError, match="one network plays one layout"):
        train(mixed, DEFAULT_POLICY, Settings(steps=16))


def test_the_command_trains_from_a_sweep_config_and_the_sweep_reads_it(tmp_path):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": "zb-h1", "compute_jitter": [0.0, 0.2],
                                  "comm_jitter": {"same_as": "compute_jitter"}, "samples": 2,
                                  "dispatch": ["static", "greedy", "learned:policies/tiny.npz"]}))
    result = run_here("train.py", "-c", str(config), "--steps", "1024", "--evaluate-every", "1024",
                      "--validation-samples", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "training policies/tiny.npz on 2 environments" in result.stderr
    assert "train.py: note: --steps 1,024 is less than one update of the network (4 x 1,024 decisions): the " \
        "network written is the untrained one" in result.stderr
    assert "measured against it too" not in result.stdout  # ZB-H1 environments alone, as the reference
    assert "policy: policies/tiny.npz" in result.stdout
    policy = LearnedPolicy.from_file(tmp_path / "policies" / "tiny.npz")
    assert policy.actions == ("B/I.0", "F.0", "W.0", "wait") and policy.about["environments"] == 2
    with open(tmp_path / "policies" / "tiny_training.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["steps"]) for row in rows] == [4, 1024]  # --steps decisions, not a whole update of 4 x 1024
    assert {row["network"] for row in rows} == {policy.digest[:16]}
    assert all(-1.0 < float(row["validation_saving"]) < 0.5 for row in rows)
    assert_png_drawn(tmp_path / "policies" / "tiny_training.png", min_width=1000, min_height=600)
    again = run_here("train.py", "-c", str(config), "--steps", "64", cwd=tmp_path)
    assert_one_line_error(again, "policies/tiny.npz exists; pass --overwrite")
    swept = run_here("data_generator.py", "-c", str(config), "-o", "rows.csv", "--step", "1.0", cwd=tmp_path)
    assert swept.returncode == 0, swept.stderr
    with open(tmp_path / "rows.csv", newline="") as handle:
        dispatches = {row["dispatch"] for row in csv.DictReader(handle)}
    assert dispatches == {"static", "greedy", "learned:policies/tiny.npz"}
    drawn = run_here("plot_heatmap.py", "rows.csv", "-o", "figures", cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert "6 heatmaps, 2 schedule comparisons, 1 dispatch figure, 3 robustness figures" in drawn.stdout
    (figure,) = (tmp_path / "figures").glob("dispatch_jitter_*.png")
    assert_png_drawn(figure, min_width=1200, min_height=650)
    assert len(list((tmp_path / "figures").glob("n8_*learned-tiny*.png"))) == 2  # the file's stem names its heatmaps
    # the jitters vary together: one robustness figure per way, on both at once
    assert len(list((tmp_path / "figures").glob("robustness_jitter_*.png"))) == 3


def test_a_run_of_one_update_says_what_else_it_measured(tmp_path):
    config = tmp_path / "two.json"
    config.write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": ["zb-h1", "1f1b"], "compute_jitter": 0.2,
                                  "dispatch": "learned:p.npz"}))
    # 4,093 decisions, taken 4 at a time, fill the first rollout of 4 x 1,024: the network is trained once
    result = run_here("train.py", "-c", str(config), "--steps", "4093", "--evaluate-every", "4096",
                      "--validation-samples", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "note:" not in result.stderr
    assert "1f1b environments are measured against it too" in result.stdout


def test_bad_training_requests_in_one_line(tmp_path):
    config = tmp_path / "none.json"
    config.write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": "zb-h1"}))  # no dispatch at all
    assert_one_line_error(run_here("train.py", "-c", str(config), cwd=tmp_path),
                          "no dispatch value is learned:<file>")
    config.write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": "zb-h1", "dispatch": ["greedy"]}))
    assert_one_line_error(run_here("train.py", "-c", str(config), cwd=tmp_path),
                          "no dispatch value is learned:<file>")
    config.write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": "zb-h1",
                                  "dispatch": ["learned:a.npz", "learned:b.npz"]}))
    assert_one_line_error(run_here("train.py", "-c", str(config), cwd=tmp_path),
                          "names 2 policy files (a.npz, b.npz); choose one with --policy-file")
    config.write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": "dualpipe-v", "fb_overlap": 0.5,
                                  "dispatch": ["learned:a.npz"]}))
    assert_one_line_error(run_here("train.py", "-c", str(config), cwd=tmp_path), "dispatch = 'learned:a.npz'",
                          "fb_overlap")  # the dispatch the config names, not the rule that stands for it
    config.write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": "zb-h1", "memory_limit": 0.5,
                                  "dispatch": ["learned:a.npz"]}))
    assert_one_line_error(run_here("train.py", "-c", str(config), cwd=tmp_path), "memory_limit = 0.5")
    for seed in ("-1", str(2 ** 32)):  # the generators' seeds are 32-bit: refused before any work
        assert_one_line_error(run_here("train.py", "-c", str(config), "--seed", seed, cwd=tmp_path),
                              f"argument --seed: {seed} must be from 0 to 4,294,967,295")


def test_a_missing_training_extra_is_one_line(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys; sys.modules['sb3_contrib'] = None; sys.argv = ['train.py', '--help']; "
            "from pipeline_sim.cli.train import main; raise SystemExit(main())")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_one_line_error(result, "training needs the [rl] extra (sb3_contrib is missing): pip install -r "
                                  "requirements-rl.txt")


def test_help_answers_without_loading_pytorch():
    """train.py's --help and its argument errors need the extra's presence, not PyTorch loaded (3 s)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = ("import sys; sys.argv = ['train.py', '--help']\n"
            "from pipeline_sim.cli.train import main\n"
            "try:\n    main()\nexcept SystemExit as end:\n    assert end.code == 0\n"
            "assert 'torch' not in sys.modules and 'sb3_contrib' not in sys.modules, 'loaded'")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--steps" in result.stdout and "decisions to train on (default 300,000)" in " ".join(result.stdout.split())


def test_the_vectorised_form_steps_copies_with_their_masks():
    from pipeline_sim.rl.train import vector_env

    vector = vector_env(ENVIRONMENTS * 2, DEFAULT_POLICY, copies=3, seed=1)
    observations = vector.reset()
    assert observations.shape == (3, len(Episode.layout(ENVIRONMENTS[0])[0]))
    for _ in range(50):
        masks = np.array(vector.env_method("action_masks"))
        assert masks.shape == (3, 4) and masks.any(axis=1).all()
        observations, rewards, dones, infos = vector.step(masks.argmax(axis=1))
        assert ((0 <= observations) & (observations <= 1)).all()


def test_training_stops_at_its_steps_and_leaves_nothing_behind(tmp_path, monkeypatch):
    """Not a whole update of 4 x 256 decisions past them (a rollout that fills up is trained on: see tiny_run); and
    no folder of its own in the temporary directory, where the learning library's logger made a new one a run (torch
    keeps its cache of compiled kernels there, one folder a user)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    settings = Settings(steps=1000, rollout=256, evaluate_every=512, validation_samples=1, seed=7)
    _, curve, completed = train(ENVIRONMENTS, DEFAULT_POLICY, settings)
    assert completed and [point.steps for point in curve] == [4, 512, 1000]
    assert [path.name for path in tmp_path.iterdir() if not path.name.startswith("torchinductor_")] == []


TINY_CONFIG = {"n": 8, "num_gpus": 4, "schedule": "zb-h1", "compute_jitter": 0.2, "dispatch": "learned:p/t.npz"}


def test_ctrl_c_writes_the_best_network_and_exits_130(tmp_path, monkeypatch):
    from pipeline_sim.cli import train as command

    (tmp_path / "c.json").write_text(json.dumps(TINY_CONFIG))
    calls = []

    def interrupted_later():
        calls.append(1)
        if len(calls) == 1500:
            raise KeyboardInterrupt

    monkeypatch.setattr(command, "check_interrupt", interrupted_later)
    result = run_here("train.py", "-c", "c.json", "--steps", "100000", "--evaluate-every", "1024",
                      "--validation-samples", "1", cwd=tmp_path)
    assert result.returncode == 130, result.stderr
    assert re.fullmatch(r"train.py: interrupted; the best network of the evaluations up to decision 5,120 is written",
                        result.stderr.strip().splitlines()[-1])
    policy = LearnedPolicy.from_file(tmp_path / "p" / "t.npz")
    with open(tmp_path / "p" / "t_training.csv", newline="") as handle:
        assert {row["network"] for row in csv.DictReader(handle)} == {policy.digest[:16]}


def limited(limit):
    """A child process that can write no file beyond ``limit`` bytes, as on a full disk (EFBIG, not a signal)."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_names_the_file_and_keeps_the_network_if_it_fits(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    (tmp_path / "c.json").write_text(json.dumps(TINY_CONFIG))
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "t_training.csv").write_text("a previous run's curve\n")
    arguments = ["-c", "c.json", "--steps", "64", "--evaluate-every", "64", "--validation-samples", "1", "--overwrite"]
    monkeypatch.setattr(Figure, "savefig", full)  # the disk fills up as the figure is written
    run = run_here("train.py", *arguments, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "train.py: error: cannot write p/t_training.png: No space left on device; the network alone is written to "
        "p/t.npz, without its training curve")
    assert LearnedPolicy.from_file(tmp_path / "p" / "t.npz").fields
    assert sorted(path.name for path in (tmp_path / "p").iterdir()) == ["t.npz"]
    monkeypatch.undo()
    nothing = subprocess.run([sys.executable, str(ROOT / "train.py"), *arguments], cwd=tmp_path, capture_output=True,
                             text=True, timeout=600, preexec_fn=limited(20_000))  # not even the network fits
    assert nothing.returncode == 2 and "Traceback" not in nothing.stderr
    assert nothing.stderr.strip().splitlines()[-1] == "train.py: error: cannot write p/t.npz: File too large"
    assert sorted(path.name for path in (tmp_path / "p").iterdir()) == ["t.npz"]


def test_the_network_and_its_curve_are_written_as_one(tmp_path, monkeypatch):
    """Stopped while the curve is drawn (as a kill would stop it), the run replaces nothing: the previous network
    stays beside its own curve, which names it, and no temporary is left."""
    from pipeline_sim.plotting import training

    (tmp_path / "c.json").write_text(json.dumps(TINY_CONFIG))
    arguments = ["-c", "c.json", "--steps", "64", "--evaluate-every", "64", "--validation-samples", "1"]
    assert run_here("train.py", *arguments, cwd=tmp_path).returncode == 0
    before = {path.name: path.read_bytes() for path in (tmp_path / "p").iterdir()}
    assert sorted(before) == ["t.npz", "t_training.csv", "t_training.png"]

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "plot_training", stopped)
    again = run_here("train.py", *arguments, "--seed", "1", "--overwrite", cwd=tmp_path)
    assert again.returncode == 130, again.stderr
    assert {path.name: path.read_bytes() for path in (tmp_path / "p").iterdir()} == before
    with open(tmp_path / "p" / "t_training.csv", newline="") as handle:
        assert {row["network"] for row in csv.DictReader(handle)} == \
            {LearnedPolicy.from_file(tmp_path / "p" / "t.npz").digest[:16]}
