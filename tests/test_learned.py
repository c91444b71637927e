"""A learned dispatcher (docs/model.md section 12.5): a policy file played through the kernel's episodes, wherever a
rule runs. These tests need no training stack: a policy is a few arrays."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline_sim.engine import simulate, simulate_figures
from pipeline_sim.episode import Episode
from pipeline_sim.learned import LearnedPolicy, figures_of, load_policy, simulate_learned
from pipeline_sim.model import DEFAULT_POLICY, EnvParams, ParameterError, Policy
from pipeline_sim.validate import validate_schedule
from tests.conftest import assert_one_line_error, run_here


def ranked(params: EnvParams, preference: list[float], hidden: int = 0) -> LearnedPolicy:
    """A policy that ignores what it sees and prefers actions in the order of ``preference`` (highest first)."""
    fields, actions = Episode.layout(params)
    if hidden:  # the same preference through a tanh layer: the zeros keep the hidden units at 0
        layers = ((np.zeros((len(fields), hidden)), np.zeros(hidden)),
                  (np.zeros((hidden, len(actions))), np.array(preference)))
    else:
        layers = ((np.zeros((len(fields), len(actions))), np.array(preference)),)
    return LearnedPolicy(layers, fields, actions, {"made": "by hand"})


def written(policy: LearnedPolicy, path: Path) -> Path:
    path.write_bytes(policy.to_bytes())
    return path


GREEDY_ORDER = [3.0, 2.0, 1.0, 0.0]  # backward work, then F, then W, then wait: the greedy rule's ranking


@pytest.mark.parametrize("schedule, jitter", [("zb-h1", 0.0), ("zb-h1", 0.3), ("1f1b", 0.2), ("gpipe", 0.0)])
def test_a_policy_ranking_as_greedy_plays_greedy_to_the_bit(tmp_path, schedule, jitter):
    base = EnvParams(n=8, num_gpus=4, schedule=schedule, compute_jitter=jitter, comm_jitter=jitter, seed=5)
    path = written(ranked(base, GREEDY_ORDER, hidden=8), tmp_path / "greedy.npz")
    learned = replace(base, dispatch=f"learned:{path}")
    greedy = replace(base, dispatch="greedy")
    policies = [DEFAULT_POLICY, Policy(priorities={"fwd_prop": 0.0, "grad_prop": 1.0, "grad_sync": 0.5})]
    for sample in (0, 3):
        assert (figures_of(learned, policies, sample) == simulate_figures(greedy, policies, sample)).all()
        run, reference = simulate_learned(learned, policies[1], sample), simulate(greedy, policies[1], sample)
        assert run.completion_time == reference.completion_time
        assert [(t.start, t.end, t.segments) for t in run.tasks] == \
            [(t.start, t.end, t.segments) for t in reference.tasks]
        assert run.orders == reference.orders and run.lower_bound == reference.lower_bound
        assert run.params.dispatch == f"learned:{path}"
        assert validate_schedule(run) == []


@pytest.mark.parametrize("schedule, jitter, bits", [("zb-h1", 0.2, 64), ("1f1b", 0.0, 64),
                                                    ("interleaved-1f1b", 0.3, 64), ("zb-h1", 0.2, 32)])
def test_the_compiled_play_takes_the_decisions_of_a_step_by_step_episode(schedule, jitter, bits):
    params = EnvParams(n=8, num_gpus=4, schedule=schedule, compute_jitter=jitter, comm_jitter=jitter, seed=2,
                       memory_limit=3.0)
    fields, actions = Episode.layout(params)
    rng = np.random.default_rng(7)  # a network that reads what it sees: random weights, two tanh layers
    layers = ((rng.normal(size=(len(fields), 16)), rng.normal(size=16)),
              (rng.normal(size=(16, 16)) / 4, rng.normal(size=16)), (rng.normal(size=(16, len(actions))),
                                                                      rng.normal(size=len(actions))))
    if bits == 32:  # weights of 32-bit floats, as training gives them: packed in 32 bits
        layers = tuple((weight.astype(np.float32).astype(np.float64), bias) for weight, bias in layers)
    network = LearnedPolicy(layers, fields, actions, {"made": "at random"})
    assert network.packed[0].dtype == {32: np.float32, 64: np.float64}[bits]
    for sample in (0, 1):
        stepped, decisions = Episode(params, DEFAULT_POLICY), 0
        stepped.reset(sample)
        while not stepped.done:
            mask = stepped.mask()
            allowed = np.flatnonzero(mask)
            decisions += len(allowed) > 1
            stepped.step(int(allowed[0]) if len(allowed) == 1 else network.act(stepped.observe(), mask))
        played = Episode(params, DEFAULT_POLICY)
        played.play(sample, *network.packed)
        assert decisions > 10 and played.done and played.segment_count == stepped.segment_count
        assert (played.figures() == stepped.figures()).all()
        for a, b in zip(played.state[:3], stepped.state[:3]):
            assert np.array_equal(a, b, equal_nan=True)
    # the compiled network is the network: its logits are numpy's up to the order of the sums
    observation, mask = rng.uniform(size=len(fields)), np.ones(len(actions), dtype=bool)
    h = observation.astype(np.float32).astype(np.float64)
    for k, (weight, bias) in enumerate(layers):
        h = h @ weight + bias if k == len(layers) - 1 else np.tanh(h @ weight + bias)
    assert network.act(observation, mask) == int(np.argmax(h))


def test_a_network_of_32_bit_weights_plays_the_same_packed_in_either_width():
    params = EnvParams(n=8, num_gpus=4, schedule="zb-h1", compute_jitter=0.3, comm_jitter=0.3)
    fields, actions = Episode.layout(params)
    rng = np.random.default_rng(3)
    shapes = ((len(fields), 32), (32, 32), (32, len(actions)))
    layers = tuple(((rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32).astype(np.float64),
                    rng.normal(size=shape[1]) / 10) for shape in shapes)
    network = LearnedPolicy(layers, fields, actions, {})
    narrow, biases, widths = network.packed
    assert narrow.dtype == np.float32 and np.array_equal(narrow, np.concatenate([w.ravel() for w, _ in layers]))
    for sample in range(6):
        played = [Episode(params, DEFAULT_POLICY), Episode(params, DEFAULT_POLICY)]
        played[0].play(sample, narrow, biases, widths)
        played[1].play(sample, narrow.astype(np.float64), biases, widths)
        assert (played[0].figures() == played[1].figures()).all()
        for a, b in zip(played[0].state[:3], played[1].state[:3]):
            assert np.array_equal(a, b, equal_nan=True)
    # one weight that a 32-bit float cannot hold keeps the whole network in 64 bits
    wider = (layers[0][0].copy(), layers[0][1])
    wider[0][0, 0] += 2.0 ** -40
    assert LearnedPolicy((wider, *layers[1:]), fields, actions, {}).packed[0].dtype == np.float64


def test_the_networks_tanh_is_the_c_librarys_within_three_units_in_the_last_place():
    from pipeline_sim.kernel.play import tanh
    tiny = np.geomspace(1e-300, 1.0, 400)
    xs = np.concatenate([np.linspace(-25.0, 25.0, 4001), tiny, -tiny, [0.0, 19.06, 19.07, 20.0, 1e300, np.inf]])
    ours, library = np.array([tanh(x) for x in xs]), np.tanh(xs)
    assert (np.abs(ours - library) <= 3 * np.spacing(np.abs(library))).all()
    assert (np.signbit(ours) == np.signbit(xs)).all()  # tanh(-0.0) is -0.0
    assert ours[-1] == 1.0 and (ours[(xs >= 19.07) & (xs < 30)] == 1.0).all()
    assert tanh(0.5) == 0.46211715726000974  # docs/model.md's worked example


def test_a_different_preference_gives_a_different_valid_run(tmp_path):
    base = EnvParams(n=8, num_gpus=4, schedule="zb-h1", compute_jitter=0.2)
    forward_first = replace(base, dispatch=f"learned:{written(ranked(base, [2.0, 3.0, 1.0, 0.0]), tmp_path / 'f.npz')}")
    run = simulate_learned(forward_first, DEFAULT_POLICY, 1)
    assert validate_schedule(run) == []
    assert run.completion_time != simulate(replace(base, dispatch="greedy"), DEFAULT_POLICY, 1).completion_time
    assert run.completion_time >= run.lower_bound


def test_bad_policy_files_in_one_line(tmp_path):
    base = EnvParams(n=8, num_gpus=4, schedule="zb-h1")
    with pytest.raises(ParameterError, match="no such policy file"):
        load_policy(replace(base, dispatch=f"learned:{tmp_path / 'none.npz'}"))
    (tmp_path / "text.npz").write_text("not a policy")
    with pytest.raises(ParameterError, match="is not a readable policy file"):
        load_policy(replace(base, dispatch=f"learned:{tmp_path / 'text.npz'}"))
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(ParameterError, match=r"is not a policy file of format 1 \(no 'format' entry; train.py writes "
                                             r"one: its network's layers"):
        load_policy(replace(base, dispatch=f"learned:{tmp_path / 'other.npz'}"))
    # trained for one chunk per GPU, asked to run two (interleaved): another observation layout
    path = written(ranked(base, GREEDY_ORDER), tmp_path / "one_chunk.npz")
    interleaved = EnvParams(n=8, num_gpus=4, schedule="interleaved-1f1b", dispatch=f"learned:{path}")
    with pytest.raises(ParameterError, match=r"was trained on an observation of 41 fields and 4 actions .*"
                                             r"interleaved-1f1b on 4 GPUs has 44 and 7"):
        load_policy(interleaved)
    with pytest.raises(ParameterError, match="must name a policy file after learned:"):
        EnvParams(dispatch="learned: ")


def test_a_sweep_and_the_visualizer_read_a_policy_file(tmp_path):
    base = EnvParams(n=8, num_gpus=4, schedule="zb-h1")
    written(ranked(base, GREEDY_ORDER), tmp_path / "greedy.npz")
    config = tmp_path / "learned.json"
    config.write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": "zb-h1", "compute_jitter": 0.2, "samples": 3,
                                  "dispatch": ["greedy", "learned:greedy.npz"]}))
    result = run_here("data_generator.py", "-c", str(config), "-o", "rows.csv", "--step", "0.5",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "rows.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    by = {(row["dispatch"], row["policy"]): row for row in rows}
    assert {row["dispatch"] for row in rows} == {"greedy", "learned:greedy.npz"}
    for (dispatch, policy), row in by.items():
        if dispatch == "greedy":
            twin = by["learned:greedy.npz", policy]
            assert {k: v for k, v in row.items() if k != "dispatch"} == \
                {k: v for k, v in twin.items() if k != "dispatch"}
    shown = run_here("schedule_visualizer_single_channel.py", "--schedule", "zb-h1", "--dispatch",
                     "learned:greedy.npz", "--no-show", "--output", "g.png", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("zb-h1")
    assert (tmp_path / "g.png").stat().st_size > 10_000
    config.write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": "zb-v", "dispatch": "learned:greedy.npz"}))
    refused = run_here("data_generator.py", "-c", str(config), "-o", "v.csv", cwd=tmp_path)
    assert_one_line_error(refused, "dispatch = 'learned:greedy.npz': was trained on an observation of 41 fields")
    missing = run_here("schedule_visualizer_single_channel.py", "--schedule", "zb-h1", "--dispatch",
                       "learned:nothing.npz", "--no-show", cwd=tmp_path)
    assert_one_line_error(missing, "--dispatch: dispatch = 'learned:nothing.npz': no such policy file",
                          f"; a relative path is read from the current folder, {tmp_path})")


def test_the_dispatch_figure_reads_every_way_against_the_best_static_order():
    from pipeline_sim.results import dispatch_families, schedule_summary

    def summary(params: EnvParams, mean: float, p95: float, bound: float, held: float | None = None) -> tuple:
        rows = pd.DataFrame([{"policy": "F=G=S", "completion_time": mean, "completion_p95": p95,
                              "lower_bound": bound, **({} if held is None else {"memory_bound": held})}])
        return params, None, schedule_summary(params, rows)

    members = []
    for level in (0.0, 0.2):
        noise = {"compute_jitter": level, "comm_jitter": level}
        members += [summary(EnvParams(schedule="1f1b", **noise), 12.0 + level, 13.0 + level, 9.0),
                    summary(EnvParams(schedule="zb-h1", **noise), 10.0 + 10 * level, 10.0 + 20 * level, 8.0),
                    summary(EnvParams(schedule="zb-h1", dispatch="greedy", **noise), 9.0 + 5 * level, 11.0, 8.0)]
    members.append(summary(EnvParams(schedule="zb-h1", n=16), 20.0, 20.0, 16.0))  # another environment, alone
    (family,) = list(dispatch_families(members))
    params, workload, key, rows = family
    assert key == "jitter" and workload is None and params.n == 8
    assert set(rows["reference"]) == {"zb-h1 wf=0.5"}  # the static order of least mean at 0%
    greedy = rows[rows["dispatch"] == "greedy"].set_index("level")
    assert greedy.loc[0.0, "mean_vs"] == pytest.approx(9.0 / 10.0 - 1)
    assert greedy.loc[0.2, "mean_vs"] == pytest.approx(10.0 / 12.0 - 1)
    assert greedy.loc[0.2, "p95_vs"] == pytest.approx(11.0 / 14.0 - 1)
    assert greedy.loc[0.2, "bound_vs"] == pytest.approx(8.0 / 12.0 - 1)
    assert rows["memory_bound_vs"].isna().all()  # a sweep without the memory-aware bound
    # with it (a dispatch sweep), the reference's memory-aware bound is drawn beneath the ways and the title reads
    # the fastest against it
    held = [summary(EnvParams(schedule="zb-h1", dispatch=d, compute_jitter=j, comm_jitter=j), mean, mean, 8.0, 9.5)
            for d, mean in (("static", 12.0), ("greedy", 11.0)) for j in (0.0, 0.2)]
    (family,) = list(dispatch_families(held))
    frame = family[3]
    assert frame.set_index(["dispatch", "level"]).loc[("static", 0.2), "memory_bound_vs"] == pytest.approx(9.5 / 12 - 1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline_sim.plotting.dispatch import plot_dispatch
    fig = plt.figure()
    ax = plot_dispatch(fig, frame, family[2], title="t")["dispatch"]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert any(label.startswith("memory-aware bound of zb-h1") for label in labels)
    assert f"{11.0 / 9.5 - 1:.1%} above its memory-aware bound" in fig.texts[0].get_text().replace("\n", " ")
    plt.close(fig)
    # jitters that vary apart (a product) make no such figure: its axis would be two-dimensional
    apart = [summary(EnvParams(schedule=s, dispatch=d, compute_jitter=c, comm_jitter=m), 10.0, 10.0, 8.0)
             for s, d in (("zb-h1", "static"), ("zb-h1", "greedy")) for c in (0.0, 0.1) for m in (0.0, 0.1)]
    assert list(dispatch_families(apart)) == []


def test_a_key_tied_to_another_takes_its_value_in_every_environment():
    from pipeline_sim.config import ConfigError, EnvironmentGrid

    grid = EnvironmentGrid.from_mapping({"n": 8, "num_gpus": 4, "schedule": ["1f1b", "zb-h1"],
                                         "compute_jitter": [0.0, 0.1, 0.3],
                                         "comm_jitter": {"same_as": "compute_jitter"}})
    assert [(p.schedule, p.compute_jitter, p.comm_jitter) for p in grid] == [
        (s, j, j) for s in ("1f1b", "zb-h1") for j in (0.0, 0.1, 0.3)]
    assert grid.as_dict()["comm_jitter"] == {"same_as": "compute_jitter"}
    assert list(EnvironmentGrid.from_mapping(grid.as_dict())) == list(grid)
    for raw, fragment in [({"comm_jitter": {"same_as": "n"}}, "both must be number parameters of one domain"),
                          ({"comm_jitter": {"same_as": "compute_jiter"}},
                           "same_as 'compute_jiter': no such key; did you mean 'compute_jitter'"),
                          ({"comm_jitter": {"same_as": "compute_jitter"}}, "must give 'compute_jitter' values"),
                          ({"compute_jitter": 0.1, "comm_jitter": {"same_as": "compute_jitter", "x": 1}},
                           "a tie is")]:
        with pytest.raises(ConfigError, match=fragment):
            EnvironmentGrid.from_mapping(raw)


def test_the_visualizer_notes_an_environment_the_network_was_never_trained_on(tmp_path):
    """A network keeps the config it was trained on: where that config has no environment of the run's schedule,
    micro-batches and GPUs, the visualizer says its decisions there were never tried (and runs all the same)."""
    base = EnvParams(n=8, num_gpus=4, schedule="zb-h1")
    policy = replace(ranked(base, GREEDY_ORDER), about={"config": "trained.json"})
    written(policy, tmp_path / "net.npz")
    (tmp_path / "trained.json").write_text(json.dumps({"n": 8, "num_gpus": 4, "schedule": "zb-h1"}))
    common = ["--schedule", "zb-h1", "--dispatch", "learned:net.npz", "--no-show", "-o", "chart.png", "--overwrite"]
    seen = run_here("schedule_visualizer_single_channel.py", *common, cwd=tmp_path)
    assert seen.returncode == 0 and "never tried" not in seen.stderr, seen.stderr
    unseen = run_here("schedule_visualizer_single_channel.py", *common, "-n", "16", cwd=tmp_path)
    assert unseen.returncode == 0, unseen.stderr
    assert "note: net.npz was trained on trained.json, which has no zb-h1 of 16 micro-batches on 4 GPUs: its " \
           "decisions here were never tried" in unseen.stderr
