"""The one table of environment parameters, and everything derived from it."""

import inspect

import pytest

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.cli import visualize
from pipeline_sim.config import ConfigError, EnvironmentGrid
from pipeline_sim.model import DEFAULT_POLICY, PARAMETERS, EnvParams, ParameterError
from pipeline_sim.parameters import OPTIONAL_GROUPS, Integers, Interval, Lengths, Names, Weights
from pipeline_sim.results import env_slug, env_title
from pipeline_sim.sweep import BOUND_COLUMNS, sweep_columns
from pipeline_sim.workload import DERIVED_KEYS


def outside(domain):
    """A value just outside ``domain``."""
    if isinstance(domain, Integers):
        return domain.minimum - 1
    if isinstance(domain, Interval):
        return domain.high + 1.0 if domain.high is not None else domain.low - 1.0
    if isinstance(domain, Lengths):
        return -1.0
    if isinstance(domain, Weights):
        return (1.0, -1.0, 1.0, 1.0)
    assert isinstance(domain, Names)
    return "no-such-name"


def test_the_table_is_the_dataclass():
    assert tuple(p.name for p in PARAMETERS) == EnvParams.names()
    defaults = EnvParams()
    for p in PARAMETERS:
        assert getattr(defaults, p.name) == p.default and type(p.default) is p.type
        p.domain.check(p.name, p.default)  # a default lies in its own domain
        assert p.help and p.group
    columns = sweep_columns(workload=False, optional=frozenset(OPTIONAL_GROUPS))[0]
    assert columns[:len(PARAMETERS)] == EnvParams.names()
    # a grid that names no parameter of an optional group writes the columns it always wrote
    assert sweep_columns(workload=False)[0] == tuple(c for c in columns if c not in ("stage_weights", "sync_weights",
                                                                                     "bwd_weights", "optimizer_len",
                                                                                     "zero", "gather_len", "cp_len",
                                                                                     "a2a_len", "a2a_weights",
                                                                                     "a2a_class", "ep_overlap",
                                                                                     "dispatch",
                                                                                     "memory_limit", "lengths",
                                                                                     *BOUND_COLUMNS))


def test_the_api_signature_follows_the_table():
    signature = inspect.signature(calculate_full_pipeline_schedule).parameters
    assert {p.name: p.default for p in PARAMETERS} == {name: signature[name].default for name in EnvParams.names()}


@pytest.mark.parametrize("p", PARAMETERS, ids=lambda p: p.name)
def test_each_domain_is_checked_everywhere(p, capsys):
    bad = outside(p.domain)
    with pytest.raises(ParameterError) as error:
        EnvParams(**{p.name: bad})
    assert error.value.name == p.name and p.domain.describe() in str(error.value)
    with pytest.raises(ConfigError, match=f"config key '{p.name}'"):
        EnvironmentGrid.from_mapping({p.name: bad})
    code = visualize.main([p.flag_names[-1], str(bad), "--no-show"], layout="single_channel", prog="viz",
                          default_priorities=DEFAULT_POLICY.priorities, default_exclusive_tiers={})
    message = capsys.readouterr().err.strip()
    assert code != 0 and len(message.splitlines()) == 1
    assert p.flag in message and repr(bad) in message, message


def test_flags_and_help_come_from_the_table():
    parser = visualize.build_parser("viz", "single_channel", DEFAULT_POLICY.priorities, {})
    args = parser.parse_args([])
    text = parser.format_help().replace("\n", " ")
    text = " ".join(text.split())
    for p in PARAMETERS:
        assert getattr(args, p.name) == (None if p.name in DERIVED_KEYS else p.default)
        assert f"{p.help}; {p.allowed}" in text, p.name
        assert all(flag in text for flag in p.flag_names)


def test_file_names_and_titles_come_from_the_table():
    params = EnvParams(n=8, num_gpus=4, schedule="zb-h1", w_fraction=0.25, compute_jitter=0.1, slow_gpu=2,
                       slow_factor=1.5, seed=7)
    slug, title = env_slug(params), env_title(params)
    for p in PARAMETERS:
        if p.name in params.relevant():
            assert f"_{p.slug(getattr(params, p.name))}" in f"_{slug}", p.name
            assert p.title(getattr(params, p.name)) in title, p.name
    assert slug == ("n8_gpus4_sf1_fwd1_bwd2_prop1_sync2_fi0.2_bi0.2_in1_zb-h1_wf0.25_cj0.1_mj0_lognormal_seed7"
                    "_slow2_x1.5")
    # what a simulation ignores stays out of its names
    quiet = EnvParams()
    assert set(quiet.relevant()).isdisjoint({"chunks", "w_fraction", "fb_overlap", "compute_jitter", "seed",
                                             "slow_gpu", "slow_factor"})
    assert "wf" not in env_slug(quiet) and "seed" not in env_title(quiet)


def test_a_parameter_error_raised_in_a_worker_reaches_the_parent_whole():
    import pickle

    error = pickle.loads(pickle.dumps(ParameterError("n", 3, "must be >= 4")))
    assert (type(error), str(error), error.name, error.value) == (ParameterError, "n = 3: must be >= 4", "n", 3)
