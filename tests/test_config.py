"""The sweep's JSON grid grammar."""

import json

import pytest

from pipeline_sim import EnvParams
from pipeline_sim.config import ConfigError, EnvironmentGrid

EXAMPLE = {"n": [8, 16], "sync_freq": [1, 2, 4], "fwd_len": [1.0],
           "bwd_len": {"start": 2.0, "stop": 3.0, "step": 0.5}, "prop_len": [1.0],
           "sync_base_len": [2.0], "fwd_impact": [0.2], "bwd_impact": [0.2]}


def test_example_grid():
    grid = EnvironmentGrid.from_mapping(EXAMPLE)
    assert len(grid) == 18
    values = grid.as_dict()
    assert values["bwd_len"] == [2.0, 2.5, 3.0]
    assert values["num_gpus"] == [4] and values["ingress_capacity"] == [1.0]  # defaults
    envs = list(grid)
    assert envs[0] == EnvParams(n=8, sync_freq=1, bwd_len=2.0)
    assert envs[1] == EnvParams(n=8, sync_freq=1, bwd_len=2.5)  # the last key varies fastest
    assert envs[-1] == EnvParams(n=16, sync_freq=4, bwd_len=3.0)
    assert list(grid.environments(16)) == envs[16:]


@pytest.mark.parametrize("spec, expected", [
    ({"start": 0.0, "stop": 0.9, "step": 0.1}, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]),
    ({"start": 0.0, "stop": 1.0, "step": 0.3}, [0.0, 0.3, 0.6, 0.9]),  # stop off the grid
    ({"start": 0.1, "stop": 0.7, "step": 0.2}, [0.1, 0.3, 0.5, 0.7]),
    ({"start": 0.5, "stop": 0.5, "step": 0.1}, [0.5]),
])
def test_ranges_have_no_drift(spec, expected):
    values = EnvironmentGrid.from_mapping({"fwd_impact": spec}).as_dict()["fwd_impact"]
    assert values == expected
    assert [repr(v) for v in values] == [repr(v) for v in expected]


def test_integer_ranges_and_scalars():
    grid = EnvironmentGrid.from_mapping({"n": {"start": 4, "stop": 16, "step": 4}, "num_gpus": 2})
    assert grid.as_dict()["n"] == [4, 8, 12, 16]
    assert all(isinstance(v, int) for v in grid.as_dict()["n"])
    assert grid.as_dict()["num_gpus"] == [2]


def test_pipeline_parallel_is_the_pipeline_degree():
    named = EnvironmentGrid.from_mapping({"pipeline_parallel": [2, 4], "schedule": ["1f1b", "zb-h1"]})
    assert list(named) == list(EnvironmentGrid.from_mapping({"num_gpus": [2, 4], "schedule": ["1f1b", "zb-h1"]}))
    assert named.varying() == ["num_gpus", "schedule"]


@pytest.mark.parametrize("raw, fragment", [
    ([1, 2], "top level must be a JSON object"),
    ({"nn": 3}, "unknown key 'nn'; did you mean 'n'? Valid keys: n, num_gpus"),
    ({"num_gpu": 4}, "unknown key 'num_gpu'; did you mean 'num_gpus'? Valid keys: n, num_gpus"),
    ({"pipeline_paralel": 4}, "did you mean 'pipeline_parallel'?"),
    ({"num_gpus": 4, "pipeline_paralel": 4}, "did you mean 'sequence_parallel'?"),  # num_gpus given already
    ({"nn": 3}, "; pipeline_parallel is another name for num_gpus"),
    ({"qqqq": 4}, "unknown key 'qqqq'; valid keys: n, num_gpus"),
    ({"num_gpus": 4, "pipeline_parallel": 4}, "both 'num_gpus' and 'pipeline_parallel' given; they name one parameter"),
    ({"n": "eight"}, "config key 'n': 'eight' is not an integer"),
    ({"n": 8.5}, "8.5 is not an integer"),
    ({"fwd_len": [1.0, "x"]}, "'x' is not a number"),
    ({"fwd_len": True}, "true is not a number"),
    ({"n": None}, "config key 'n': null is not an integer"),
    ({"model": "llama3-8b", "optimizer_step": None}, "config key 'optimizer_step': null is not true or false"),
    ({"n": []}, "config key 'n': empty list"),
    ({"bwd_len": {"start": 2.0, "stop": 3.0}}, "needs exactly the keys start, stop, step"),
    ({"bwd_len": {"start": 2.0, "stop": 3.0, "step": 0}}, "range step 0.0 must be > 0"),
    ({"bwd_len": {"start": 2.0, "stop": 3.0, "step": -0.5}}, "range step -0.5 must be > 0"),
    ({"bwd_len": {"start": 3.0, "stop": 2.0, "step": 0.5}}, "range stop 2.0 is below start 3.0"),
    ({"fwd_impact": [0.2, 1.5]}, "config key 'fwd_impact': fwd_impact = 1.5: must be a finite number with 0 <= x < 1"),
    ({"n": 0}, "n = 0: must be an integer >= 1"),
    ({"fwd_len": 0}, "fwd_len = 0.0: must be a finite number from 1e-12 to 1e+09"),
    ({"n": [8, 8]}, "values repeat"),
    ({"prop_len": {"start": 0, "stop": 1, "step": 1e-9}}, "range gives 1,000,000,001 values; at most 100,000"),
])
def test_bad_grids_name_the_key_and_value(raw, fragment):
    with pytest.raises(ConfigError) as info:
        EnvironmentGrid.from_mapping(raw)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        EnvironmentGrid.load(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"n": [8, 16],\n "fwd_len": [1.0,]}')
    with pytest.raises(ConfigError, match="invalid JSON at line 2, column 18"):
        EnvironmentGrid.load(broken)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(EXAMPLE))
    assert len(EnvironmentGrid.load(good)) == 18


@pytest.mark.parametrize("name", ["example.json", "quick.json", "ingress.json", "accumulation.json",
                                  "deep_pipeline.json"])
def test_shipped_configs_load(name):
    from conftest import ROOT

    grid = EnvironmentGrid.load(ROOT / "configs" / name)
    assert len(grid) >= 1
    if name == "example.json":
        assert json.loads((ROOT / "configs" / name).read_text()) == EXAMPLE


def test_a_config_that_begins_with_a_byte_order_mark_is_read(tmp_path):
    config = tmp_path / "bom.json"
    config.write_bytes(b"\xef\xbb\xbf" + b'{"n": [4, 6]}')
    assert [params.n for params in EnvironmentGrid.load(config)] == [4, 6]


def test_a_workload_grid_written_back_as_a_config_reads_as_itself():
    """What training reads back of a config (``given_dict``): a preset model or GPU by its name, a custom one by
    its fields without the name its object carries."""
    custom = {"layers": 4, "hidden": 256, "heads": 4, "ffn_hidden": 1024, "vocab": 1000}
    for model, gpu in (("llama3-8b", "h100-80gb"), (custom, {"tflops": 100, "memory_gb": 40})):
        grid = EnvironmentGrid.from_mapping({"model": model, "gpu": gpu, "num_gpus": 2, "global_batch_size": 8})
        given = grid.given_dict()
        if isinstance(model, str):
            assert (given["model"], given["gpu"]) == ([model], [gpu])
        else:  # every field, as the object holds it, but its name
            assert given["model"][0].items() >= model.items() and "name" not in given["model"][0]
        assert list(EnvironmentGrid.from_mapping(given)) == list(grid)


@pytest.mark.parametrize("raw, count, kept", [
    # the gathers' work without sharding: one zero-0 environment, not one per gather_len (which reads 0 there)
    ({"n": 8, "zero": [0, 3], "gather_len": [0.5, 1.0]}, 3, {"gather_len": [0.0, 0.5, 1.0]}),
    ({"n": 8, "slow_gpu": [-1, 1], "slow_factor": [1.5, 2.0]}, 3, {"slow_factor": [1.5, 1.5, 2.0]}),
    ({"n": 8, "compute_jitter": [0.0, 0.1], "jitter_dist": ["lognormal", "normal"], "seed": [1, 2]}, 5,
     {"seed": [1, 1, 2, 1, 2]}),
    ({"model": "llama3-8b", "data_parallel": 4, "zero": [0, 1], "shard_group": [2, 4]}, 3, {}),
    ({"model": "mixtral-8x7b", "data_parallel": 8, "expert_parallel": [1, 8], "route_nodes": [1, 2],
      "expert_imbalance": [1.0, 1.25]}, 5, {}),
])
def test_a_parameter_a_combination_does_not_read_never_multiplies_it(raw, count, kept):
    """Each distinct simulation is one environment, with the first value of what it ignores: a grid multiplied by
    such a parameter wrote the same simulation twice, which its heatmaps then drew twice or refused."""
    grid = EnvironmentGrid.from_mapping(raw)
    assert len(grid) == count
    environments = list(grid)
    for name, values in kept.items():
        assert [getattr(params, name) for params in environments] == values


@pytest.mark.parametrize("raw, message", [
    ({"n": 8, "slow_factor": 2}, "config key 'slow_factor': 2 changes nothing, as there is no straggler (slow_gpu -1); "
                                 "leave it out or give what reads it"),
    ({"n": 8, "jitter_dist": "normal"}, "'jitter_dist': 'normal' changes nothing, as no length is drawn "
                                        "(compute_jitter and comm_jitter 0)"),
    ({"n": 8, "seed": [5, 6]}, "'seed': [5, 6] changes nothing, as no length is drawn"),
    ({"n": 8, "gather_len": 1}, "'gather_len': 1 changes nothing, as nothing is sharded (zero 0)"),
    ({"schedule": ["1f1b", "gpipe"], "chunks": 3}, "'chunks': 3 changes nothing, as schedule 1f1b does not read it"),
    ({"memory_limit": 3}, "'memory_limit': 3 changes nothing, as the static order (dispatch static) does not adapt"),
    ({"a2a_class": "grad_sync"}, "'a2a_class': 'grad_sync' changes nothing, as there is no all-to-all (a2a_len 0)"),
    ({"model": "llama3-8b", "data_parallel": 4, "shard_group": 2}, "'shard_group': 2 changes nothing, as nothing is "
                                                                   "sharded (zero 0)"),
    ({"model": "llama3-8b", "expert_imbalance": 2}, "'expert_imbalance': 2 changes nothing, as there is no "
                                                    "all-to-all (expert_parallel 1)"),
    ({"model": "llama3-8b", "ep_bandwidth": 10}, "'ep_bandwidth': 10 changes nothing"),
    ({"model": "mixtral-8x7b", "route_nodes": 4}, "'route_nodes': 4 changes nothing"),
    ({"model": "mixtral-8x7b", "data_parallel": 8, "expert_parallel": 8, "ep_overlap": 1, "schedule": "zb-h1"},
     "'ep_overlap': 1 changes nothing, as schedule zb-h1 does not overlap an all-to-all with compute"),
])
def test_a_key_no_combination_reads_is_refused(raw, message):
    with pytest.raises(ConfigError) as refused:
        EnvironmentGrid.from_mapping(raw)
    assert message in str(refused.value)
    # read by one combination, it is kept
    reads = {"slow_factor": {"slow_gpu": [-1, 1]}, "jitter_dist": {"compute_jitter": [0.0, 0.1]},
             "gather_len": {"zero": [0, 1]}, "memory_limit": {"dispatch": ["static", "greedy"]}}
    name = next(iter(set(raw) & set(reads)), None)
    if name is not None:
        assert len(EnvironmentGrid.from_mapping({**raw, **reads[name]})) >= 1


def test_a_refusal_names_what_the_config_wrote():
    """A step just off 0.1 showed 1 / 0.1 = 10, as if it divided 1; a global batch too large for memory was told
    as the task count of an n the config never wrote."""
    from pipeline_sim.model import ParameterError
    from pipeline_sim.scenarios import steps_per_unit
    from pipeline_sim.sweep import SweepPlan

    with pytest.raises(ParameterError, match=r"\(1 / 0\.1000000001 = 9\.99999999\)"):
        steps_per_unit(0.1000000001)
    with pytest.raises(ConfigError, match=r"\(n = 100,000 micro-batches: global_batch_size over micro_batch_size x "
                                          r"data_parallel\) has about [\d,]+ tasks per simulation"):
        SweepPlan(EnvironmentGrid.from_mapping({"model": "llama3-8b", "global_batch_size": 100000}))


def test_the_collapse_keeps_what_a_combination_can_take_and_what_a_tie_reads():
    """Under zero 0 a shard group is not read, but it must still divide the data-parallel degree: the value kept is
    the first that does, so that no environment is lost. A key tied to one its environment does not read reads it
    all the same: its values multiply the grid, and it is not refused."""
    grid = EnvironmentGrid.from_mapping({"model": "llama3-8b", "num_gpus": 4, "data_parallel": [4, 6],
                                         "shard_group": [4, 2], "zero": [0, 1]})
    assert len(grid.invalid()) == 1  # zero 1 over a group of 4 of 6 GPUs
    kept = [(params.zero, workload.data_parallel, workload.shard_group) for params, workload in grid.cases()]
    assert kept == [(0, 4, 4), (0, 6, 2), (1, 4, 4), (1, 4, 2), (1, 6, 2)]
    tied = {"zero": [0, 1], "gather_len": [1.0, 2.0], "cp_len": {"same_as": "gather_len"}}
    assert [(p.zero, p.cp_len) for p in EnvironmentGrid.from_mapping(tied)] == [(0, 1.0), (0, 2.0), (1, 1.0),
                                                                                (1, 2.0)]
    assert len(EnvironmentGrid.from_mapping({**tied, "zero": 0})) == 2
    # a table of lengths gives the environment's gather work: zero alone is not refused for want of it
    EnvironmentGrid.from_mapping({"lengths": "configs/tables/1f1b.json", "zero": 1})


@pytest.mark.parametrize("raw, anew", [
    ({"compute_jitter": [0.0, 0.1], "seed": [0, 1], "n": [8, 16]}, True),
    ({"slow_gpu": [-1, 1], "slow_factor": [1.5, 2.0]}, True),
    ({"schedule": ["1f1b", "zb-h1"], "w_fraction": [0.25, 0.5], "fwd_impact": {"same_as": "w_fraction"}}, True),
    ({"zero": [0, 1], "gather_len": [1.0, 2.0], "cp_len": {"same_as": "gather_len"}}, False),
    ({"schedule": ["1f1b", "zb-h1"], "w_fraction": [0.25, 0.5]}, False),
    (EXAMPLE, False),
])
def test_a_partial_written_before_the_collapse_does_not_resume(raw, anew, monkeypatch):
    """A sweep's partial file is continued at its row count: one written when the grid had more environments must
    not be continued by a plan of fewer, which would misalign every row after it. Such a grid changes its plan's
    fingerprint; any other keeps it, so that its partial files resume."""
    from pipeline_sim.sweep import SweepPlan

    grid = EnvironmentGrid.from_mapping(raw)
    assert grid.collapses_anew is anew
    now = SweepPlan(grid).fingerprint()
    monkeypatch.setattr(EnvironmentGrid, "collapses_anew", False)
    assert (SweepPlan(EnvironmentGrid.from_mapping(raw)).fingerprint() != now) is anew
