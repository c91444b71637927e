"""The sweep's JSON grid of environments.

Each key is an environment parameter (``EnvParams``); its value is a scalar, a list
of values, or a range ``{"start": a, "stop": b, "step": s}`` that includes ``stop``
when it falls on the grid (``schedule``: a name or a list of names). Missing keys take
the model's defaults. The environments are the Cartesian product, the last parameter
varying fastest, with two exceptions: a parameter that an environment does not read
(``unread_parameters``: another schedule's, the noise's without noise, ...) never multiplies its
environments (each distinct simulation appears once; a key no environment reads is refused), and
a combination that breaks a schedule's requirement (interleaved-1f1b with n not a
multiple of num_gpus, say) or names a straggler beyond its last GPU is listed by
``invalid()`` instead of being run. The key ``samples`` is a sweep setting: noise
draws per (environment, policy). A key given as ``{"same_as": "<other key>"}`` takes the
other key's value in every environment instead of multiplying them (``"comm_jitter":
{"same_as": "compute_jitter"}``: one jitter for both). With the key ``model``, the grid also sweeps the
workload keys (``workload.WORKLOAD_KEYS``) and each environment's ``n``, lengths and
``sync_freq`` come from its workload (docs/model.md section 11). With the key ``lengths``, a table of every task's
length (a file, or a list of them: ``tables.read_table``), each table's flags set the parameters of its environment
that the file does not give, and the work keys (``model.TABLE_WORK``) and the weights that scale the work
(``model.TABLE_SCALES``) may not be given: the table holds the work.
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import asdict, dataclass, fields
from decimal import Decimal
from difflib import get_close_matches
from functools import cached_property
from itertools import islice, product
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import numpy as np

from .inputs import TooLarge, read_at_most
from .model import (
    EP_OVERLAP_SCHEDULES,
    HINDSIGHT,
    LIST_KEYS,
    PARAMETER,
    PARAMETERS,
    SCHEDULE_PARAMETERS,
    TABLE_SCALES,
    TABLE_WORK,
    EnvParams,
    ParameterError,
)
from .parameters import OPTIONAL_GROUPS, Names
from .schedules import SCHEDULES, get_schedule
from .tables import LengthTable, read_table
from .taskgraph import estimated_tasks, lengths_of_table
from .workload import (
    DERIVED_KEYS,
    GPU_PRESETS,
    MODEL_PRESETS,
    OPTIONAL_WORKLOAD_KEYS,
    WORKLOAD_KEYS,
    GpuSpec,
    ModelShape,
    Workload,
    default_bytes_per_param,
    workload_environment,
)

if TYPE_CHECKING:
    from .learned import LearnedPolicy


def _keys(kind: type) -> tuple[str, ...]:
    """The environment parameters and workload keys of type ``kind`` (a workload's ``int | None`` included)."""
    return tuple(p.name for p in PARAMETERS if p.type is kind) + \
        tuple(f.name for f in fields(Workload) if str(f.type).split(" | ")[0] == kind.__name__)


INTEGER_KEYS = _keys(int)
STRING_KEYS = _keys(str)
BOOLEAN_KEYS = _keys(bool)
#: Workload keys whose values are a preset name or an object of fields, or a list of those.
OBJECT_KEYS = ("model", "gpu")
#: Workload keys whose value may be a list of numbers (one per stage): such a list is one value, a list of lists (or
#: names) several.
WORKLOAD_LIST_KEYS = ("layers_per_stage", "recompute_per_stage")
#: Keys of the grid file that are settings of the sweep, not environment parameters.
SETTING_KEYS = ("samples",)
MAX_RANGE_VALUES = 100_000  # values of one key, as a range or a list
#: Combinations of a grid (before the schedule rules thin them); more is a typo, not a study.
MAX_COMBINATIONS = 1_000_000
MAX_CONFIG_BYTES = 10 * 2 ** 20


class ConfigError(ValueError):
    """A config the sweep cannot run; the message is one line naming the key and the value."""


def _shown(value: object) -> str:
    """A config value as its file spells it: JSON's null, true and false; anything else as Python writes it."""
    return json.dumps(value) if value is None or isinstance(value, bool) else repr(value)


def _number(key: str, value: object, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "an integer" if key in INTEGER_KEYS else "a number"
        raise ConfigError(f"{where}: {_shown(value)} is not {kind}")
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {value!r} is not a finite number")
    if key in INTEGER_KEYS:
        # A number written with a fraction or an exponent is read as a float, exact only up to 2^53; one written
        # in digits is exact, and its parameter's domain bounds it (a seed goes to 2^63 - 1).
        if isinstance(value, float) and (not value.is_integer() or abs(value) > 2 ** 53):
            raise ConfigError(f"{where}: {value!r} is not an integer (at most 2^53)")
        return int(value)
    return float(value)


def _expand_range(key: str, spec: Mapping[str, object]) -> list[int | float]:
    where = f"config key {key!r}"
    if set(spec) != {"start", "stop", "step"}:
        raise ConfigError(f"{where}: a range needs exactly the keys start, stop, step; got {', '.join(sorted(spec))}")
    start, stop, step = (_number(key, spec[name], f"{where} {name}") for name in ("start", "stop", "step"))
    if step <= 0:
        raise ConfigError(f"{where}: range step {step!r} must be > 0")
    if stop < start:
        raise ConfigError(f"{where}: range stop {stop!r} is below start {start!r}")
    # Decimal arithmetic on the written values: 2.0..3.0 step 0.5 gives 2.5, never 2.4999999.
    first, last, stride = (Decimal(repr(v)) for v in (start, stop, step))
    count = int((last - first) / stride) + 1
    if count > MAX_RANGE_VALUES:
        raise ConfigError(f"{where}: range gives {count} values; at most {MAX_RANGE_VALUES} are allowed")
    values = [first + i * stride for i in range(count)]
    return [int(v) if key in INTEGER_KEYS else float(v) for v in values]


def _name(key: str, name: Any) -> str:
    """``name`` of parameter ``key`` as an environment stores it, checked (even where a default environment would
    ignore the parameter)."""
    domain = PARAMETER[key].domain
    domain.check(key, name)
    assert isinstance(domain, Names)  # Dispatchers is one
    return domain.normal(name)


def _names(key: str, raw: Any) -> list[Any]:
    where = f"config key {key!r}"
    names = raw if isinstance(raw, list) else [raw]
    if not names:
        raise ConfigError(f"{where}: empty list; give at least one name")
    try:
        values = [get_schedule(name).name if key == "schedule" else _name(key, name) for name in names]
        if key == "lengths":
            for value in values:
                if not value:
                    raise ParameterError(key, value, "must name a table file; leave the key out for none")
                read_table(value)  # a file that cannot be read or is no table is refused before anything runs
    except ParameterError as error:
        raise ConfigError(f"{where}: {error}") from None
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}: names repeat ({names}); each must be listed once")
    return values


def _workload_values(key: str, raw: object, base: Mapping[str, Any],
                     suspect: set[tuple[str, int]] | None = None) -> list:
    """The values of a workload key, each checked in the workload ``base``; a value whose error names the key is
    refused, or, given ``suspect``, kept there by (key, its place) for ``_workload_grid`` to judge against the
    config's other values."""
    where = f"config key {key!r}"
    items = raw if isinstance(raw, list) else [raw]
    if key in WORKLOAD_LIST_KEYS and isinstance(raw, list) and raw and \
            not any(isinstance(item, (list, str)) for item in raw):  # one list of numbers is one value
        items = [raw]
    if not items:
        raise ConfigError(f"{where}: empty list; give at least one value")
    if isinstance(raw, dict) and key not in OBJECT_KEYS:
        items = _expand_range(key, raw)
    values: list = []
    for item in items:
        if key in BOOLEAN_KEYS and not isinstance(item, bool):
            raise ConfigError(f"{where}: {_shown(item)} is not true or false")
        if key in STRING_KEYS and not isinstance(item, str) and key not in WORKLOAD_LIST_KEYS:
            raise ConfigError(f"{where}: {_shown(item)} is not a name")
        if key not in OBJECT_KEYS + BOOLEAN_KEYS + STRING_KEYS + WORKLOAD_LIST_KEYS:
            item = _number(key, item, where)
        try:
            workload = Workload(**{**base, key: item})
        except ParameterError as error:
            kept = tuple(item) if isinstance(item, list) else item
            if error.name.split(".")[0] == key:
                # a model's or a GPU's fields are checked on their own, and what holds a list or an object inside
                # (no layer count, no share) is wrong beside any other key
                if suspect is None or key in OBJECT_KEYS or not _hashable(kept):
                    raise ConfigError(f"{where}: {error}") from None
                suspect.add((key, len(values)))
            values.append(kept)  # a clash with another key: judged per combination
            continue
        values.append(getattr(workload, key) if key in OBJECT_KEYS + WORKLOAD_LIST_KEYS else item)
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}: values repeat; each workload must be listed once")
    return values


def _lists(key: str, raw: object) -> list[tuple[float, ...]]:
    """The values of a key whose value is a list (one weight per stage): a list of numbers is one value, a list
    of such lists several. Each is checked against its domain here; its length against each environment's stage
    count, per combination."""
    where = f"config key {key!r}"
    if not isinstance(raw, (list, tuple)):
        raise ConfigError(f"{where}: {raw!r} is not a list; give one number per stage, or a list of such lists")
    items = raw if raw and all(isinstance(item, (list, tuple)) for item in raw) else [raw]
    values = []
    for item in items:
        try:
            PARAMETER[key].domain.check(key, item)
        except ParameterError as error:
            raise ConfigError(f"{where}: {error}") from None
        values.append(tuple(float(x) for x in item))
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}: values repeat; each environment must be listed once")
    return values


def _values(key: str, raw: object, base: Mapping[str, Any]) -> list:
    """The values of ``key``, each checked against its domain in the environment ``base``."""
    where = f"config key {key!r}"
    if key in STRING_KEYS:
        return _names(key, raw)
    if key in LIST_KEYS:
        return _lists(key, raw)
    if isinstance(raw, dict):
        values = _expand_range(key, raw)
    elif isinstance(raw, list):
        if not raw:
            raise ConfigError(f"{where}: empty list; give at least one value")
        if len(raw) > MAX_RANGE_VALUES:
            raise ConfigError(f"{where}: list of {len(raw):,} values; at most {MAX_RANGE_VALUES:,} are allowed")
        values = [_number(key, item, where) for item in raw]
    else:
        values = [_number(key, raw, where)]
    for value in values:
        try:
            EnvParams(**{**base, key: value})
        except ParameterError as error:
            if error.name == key:  # a schedule's requirement on a combination is judged per environment
                raise ConfigError(f"{where}: {error}") from None
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}: values repeat ({values}); each environment must be listed once")
    return values


@dataclass(frozen=True)
class EnvironmentGrid:
    """The values of every parameter; iterating gives the environments in grid order."""

    values: tuple[tuple[str, tuple[Any, ...]], ...]
    samples: int = 1  # noise draws per (environment, policy): a sweep setting the file may give
    given: frozenset[str] = frozenset()  # the keys the file gave (a workload derives the others it sets)
    ties: tuple[tuple[str, str], ...] = ()  # (key, the key whose value it takes)

    @property
    def has_workload(self) -> bool:
        return "model" in self.given

    @property
    def has_auto(self) -> bool:
        """Whether a ``layers_per_stage`` of the grid is ``auto``: its rows then say the split chosen."""
        return any(name == "layers_per_stage" and "auto" in values for name, values in self.values)

    @property
    def optional_groups(self) -> frozenset[str]:
        """The optional groups (``OPTIONAL_GROUPS``) the grid names a parameter of, and the optional workload keys
        (``workload.OPTIONAL_WORKLOAD_KEYS``) it gives: its rows carry their columns."""
        return frozenset(p.group for p in PARAMETERS if p.group in OPTIONAL_GROUPS and p.name in self.given) | \
            frozenset(key for key in OPTIONAL_WORKLOAD_KEYS if key in self.given) | \
            frozenset(("strategies",) if "expert_parallel" in self.given else ())  # its all-to-all's columns

    @property
    def has_dispatch(self) -> bool:
        """Whether the grid names a parameter of run-time dispatch: its rows then carry them and the bound."""
        return "dispatch" in self.optional_groups

    @classmethod
    def from_mapping(cls, raw: object, source: str = "config", allow_large: bool = False) -> EnvironmentGrid:
        """The grid of a config's object; more than ``MAX_COMBINATIONS`` combinations are refused unless
        ``allow_large``."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: the top level must be a JSON object of parameter names, "
                              f"got {type(raw).__name__}")
        if {"flags", "lengths", "unit"} <= raw.keys():  # what ``pipeline-sim-trace replay --lengths-out`` writes
            raise ConfigError(f"{source}: a table of lengths, not a sweep config: name it in a config under the key "
                              f"lengths (\"lengths\": \"<its path>\"), or draw it with a visualizer's --lengths")
        names = EnvParams.names()
        for p in PARAMETERS:  # a parameter's other name (pipeline_parallel for num_gpus) reads as the parameter
            if p.alias in raw:
                if p.name in raw:
                    raise ConfigError(f"{source}: both {p.name!r} and {p.alias!r} given; they name one parameter, "
                                      f"give one")
                raw = {(p.name if key == p.alias else key): value for key, value in raw.items()}
        valid = names + WORKLOAD_KEYS + SETTING_KEYS
        unknown = [key for key in raw if key not in valid]
        if unknown:
            aliases = {p.alias: p.name for p in PARAMETERS if p.alias}
            unused = [key for key in [*valid, *aliases] if key not in raw and aliases.get(key) not in raw]
            guess = get_close_matches(str(unknown[0]), unused, n=1)
            raise ConfigError(f"{source}: unknown key {unknown[0]!r}"
                              + (f"; did you mean {guess[0]!r}? Valid" if guess else "; valid")
                              + f" keys: {', '.join(valid)}"
                              + "".join(f"; {alias} is another name for {name}" for alias, name in aliases.items()))
        if "lengths" in raw:
            beside = [key for key in (*TABLE_WORK, *TABLE_SCALES, "model") if key in raw]
            if beside:
                raise ConfigError(f"config key {beside[0]!r}: a table of 'lengths' gives every task's work; leave "
                                  f"{beside[0]!r} out (the table's flags give its mean)")
        ties = _ties(raw)
        raw = {key: value for key, value in raw.items() if key not in dict(ties)}
        samples = raw.get("samples", 1)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ConfigError(f"config key 'samples': {json.dumps(samples)} must be one integer >= 1")
        defaults = EnvParams().as_dict()
        # each value is judged in the default environment, on the grid's largest GPU count (for slow_gpu)
        gpus = _values("num_gpus", raw["num_gpus"], defaults) if "num_gpus" in raw else [defaults["num_gpus"]]
        base = {**defaults, "num_gpus": max(gpus)}
        for key, value in raw.items():  # sizes first, before anything is expanded
            if _count(value, key) > MAX_RANGE_VALUES:
                what = "list of" if isinstance(value, list) else "range gives"
                raise ConfigError(f"config key {key!r}: {what} {_count(value, key):,} values; at most "
                                  f"{MAX_RANGE_VALUES:,} are allowed")
        counts = [_count(raw[key], key) for key in raw if key not in SETTING_KEYS]
        if math.prod(counts) > MAX_COMBINATIONS and not allow_large:
            raise ConfigError(f"{source}: the values multiply to {math.prod(counts):,} combinations; at most "
                              f"{MAX_COMBINATIONS:,} are allowed (pass --allow-large to try anyway)")
        values = [(name, tuple(_values(name, raw[name], base)) if name in raw else (defaults[name],))
                  for name in names]
        given = dict(values)
        slowed = [gpu for gpu in given["slow_gpu"] if gpu >= 0]
        if slowed and set(given["slow_factor"]) == {1.0}:
            raise ConfigError(f"config key 'slow_gpu': a straggler needs 'slow_factor' above 1 (at 1, "
                              f"{'the default, ' if 'slow_factor' not in raw else ''}GPU {slowed[0]} computes as "
                              f"fast as the others); give one")
        sharded = [zero for zero in given["zero"] if zero >= 1]
        if sharded and set(given["gather_len"]) == {0.0} and "model" not in raw and "lengths" not in raw:
            raise ConfigError(f"config key 'zero': {sharded[0]} gathers nothing with 'gather_len' 0"
                              f"{' (the default)' if 'gather_len' not in raw else ''}, the work of one all-gather: "
                              f"give it, or 'model', which computes it")
        workload_keys = [key for key in WORKLOAD_KEYS if key in raw]
        if workload_keys and "model" not in raw:
            raise ConfigError(f"config key {workload_keys[0]!r}: a workload key needs 'model' (a preset or an "
                              f"object of fields)")
        if "model" in raw:
            values += _workload_grid(raw)
        combinations = math.prod(len(v) for _, v in values)
        if combinations > MAX_COMBINATIONS and not allow_large:
            raise ConfigError(f"{source}: the values multiply to {combinations:,} combinations; at most "
                              f"{MAX_COMBINATIONS:,} are allowed (pass --allow-large to try anyway)")
        grid = cls(tuple(values), samples, frozenset(raw) - set(SETTING_KEYS) | {key for key, _ in ties}, ties)
        grid._check_read(raw)
        return grid

    @classmethod
    def load(cls, path: str | Path, allow_large: bool = False) -> EnvironmentGrid:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"config {path}: is a folder; give a JSON file")
        try:
            text = read_at_most(path, MAX_CONFIG_BYTES).decode("utf-8-sig")  # a byte-order mark is no mistake
        except TooLarge as error:
            raise ConfigError(f"config {path}: {error}; a grid config is a few lines of JSON") from None
        except FileNotFoundError:
            raise ConfigError(f"config {path}: no such file") from None
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"config {path}: cannot read it ({getattr(error, 'strerror', None) or error})") from None
        try:
            raw = json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as error:
            raise ConfigError(f"config {path}: invalid JSON at line {error.lineno}, column {error.colno}: "
                              f"{error.msg}") from None
        except RecursionError:
            raise ConfigError(f"config {path}: JSON nested too deeply; a grid config is one object of "
                              f"values and lists") from None
        return cls.from_mapping(raw, f"config {path}", allow_large)

    def _environment(self, combo: Mapping[str, Any]) -> tuple[EnvParams, Workload | None]:
        """One combination's environment, and its workload if the grid has one."""
        if not self.has_workload:
            params = EnvParams(**combo)
            if params.lengths:  # the table must hold this environment's tasks, no more, no fewer
                lengths_of_table(params, self.length_tables[params.lengths].lengths, params.lengths)
            return params, None
        workload = Workload(**{key: combo[key] for key in WORKLOAD_KEYS})
        env = {key: value for key, value in combo.items() if key in EnvParams.names() and
               (key not in DERIVED_KEYS or key in self.given)}
        return workload_environment(workload, **env), workload

    def _expanded(self) -> Iterator[tuple[tuple[int, ...], dict[str, Any], dict[str, str]]]:
        """Every combination in grid order: the place of each value in its list, the combination, and what it does
        not read (``unread_parameters``)."""
        names = [name for name, _ in self.values]
        table_at = names.index("lengths")
        for indices in product(*(range(len(values)) for _, values in self.values)):
            combo = [values[i] for (_, values), i in zip(self.values, indices)]
            if combo[table_at]:  # the table's environment, where the file gives no value of its own
                for key, value in self.length_tables[combo[table_at]].environment.items():
                    if key not in self.given:
                        combo[names.index(key)] = value
            named = dict(zip(names, combo))
            for key, other in self.ties:
                named[key] = named[other]
            unread = unread_parameters(named, self.has_workload)
            for key, other in self.ties:  # a key read through another tied to it is read
                if key not in unread:
                    unread.pop(other, None)
            yield indices, named, unread

    def _combinations(self) -> Iterator[dict[str, Any]]:
        """Every combination in grid order, without those that differ only by a parameter they do not read
        (``unread_parameters``): each distinct simulation appears once, with the first value of what it ignores
        that the combination can take (``_kept_at``)."""
        position = {name: i for i, (name, _) in enumerate(self.values)}
        for indices, combo, unread in self._expanded():
            if all(indices[position[name]] == _kept_at(name, self.values[position[name]][1], combo)
                   for name in unread):
                yield combo

    @cached_property
    def collapses_anew(self) -> bool:
        """Whether this grid's environments differ from those it gave before ``unread_parameters`` left out more
        than other schedules' parameters, a memory limit under the static order and the all-to-all's without one
        (and before a tie made its source read): a sweep's partial file of then must not resume now."""
        position = {name: i for i, (name, _) in enumerate(self.values)}
        if not self.ties and all(len(values) == 1 for name, values in self.values if name in _UNREAD_SINCE):
            return False
        for indices, combo, unread in self._expanded():
            before = set(unread_parameters(combo, self.has_workload)) - _UNREAD_SINCE
            now = all(indices[position[name]] == _kept_at(name, self.values[position[name]][1], combo)
                      for name in unread)
            if now != (not any(indices[position[name]] for name in before)):
                return True
        return False

    def _check_read(self, raw: Mapping[str, object]) -> None:
        """Refuse a key the config gives, other than at its default, that no combination reads: it would change
        nothing, with nothing said. (At its default it changes nothing either way: a grid written back whole,
        ``as_dict``, reads as itself.)"""
        defaults = {**{f.name: f.default for f in fields(Workload)}, **EnvParams().as_dict()}
        unused = {name for name, values in self.values if name in self.given and name in raw
                  and name in _IGNORABLE_BY_RULE and any(value != defaults[name] for value in values)}
        why: dict[str, str] = {}
        for _, _, unread in self._expanded():
            for name in list(unused):
                if name in unread:
                    why.setdefault(name, unread[name])
                else:
                    unused.discard(name)
            if not unused:
                return
        name = next(key for key in raw if key in unused)
        raise ConfigError(f"config key {name!r}: {_shown(raw[name])} changes nothing, as {why[name]}; leave it out "
                          f"or give what reads it")

    @cached_property
    def _scan(self) -> tuple[int, tuple[tuple[str, str], ...], int, int, str, dict[str, LearnedPolicy], frozenset[int],
                             tuple[tuple[float, float], tuple[float, float]], np.ndarray]:
        """Valid count, the invalid combinations, the summed and the largest estimated tasks (and where), the
        networks of the policy files the valid ones name, each file read once, the places of the invalid
        combinations among ``_combinations``, and the estimated seconds of one simulation and of one draw's shared
        work (``cost``) of every valid one summed, those of environments with noise apart (a sweep runs their
        samples; the others run once); and those of each valid one (``environment_seconds``)."""
        # the checks that need the kernel, loaded once a config is read, not when a command only shows its --help
        from .cost import draw_seconds, simulation_seconds
        from .engine import memory_in_force
        from .hindsight import check_hindsight
        from .learned import LearnedPolicy, load_policy, read_policy

        valid, invalid, total, largest, where, invalid_at = 0, [], 0, 0, "", set()
        simulations, draws = [0.0, 0.0], [0.0, 0.0]  # noise-free, noisy
        each = array("d")  # per valid environment: a simulation's seconds, a draw's shared seconds, noisy or not
        networks: dict[str, LearnedPolicy | ParameterError] = {}
        for place, combo in enumerate(self._combinations()):
            try:
                params, _ = self._environment(combo)
                if params.memory_limit != 0.0:  # a limit that cannot run the iteration (docs/model.md 12.1)
                    memory_in_force(params)
                if params.dispatch == HINDSIGHT:  # a schedule whose static order cannot replay it, or no solver
                    check_hindsight(params)
                if params.learned:  # a policy file that is missing, or not made for this environment
                    if params.dispatch not in networks:
                        try:
                            networks[params.dispatch] = read_policy(params)
                        except ParameterError as error:
                            networks[params.dispatch] = error
                    network = networks[params.dispatch]
                    if isinstance(network, ParameterError):
                        raise network
                    load_policy(params, network)
            except ParameterError as error:
                invalid.append((_describe(combo, self), str(error)))
                invalid_at.add(place)
                continue
            valid += 1
            tasks = estimated_tasks(params)
            total += tasks
            simulation, draw = simulation_seconds(params, tasks), draw_seconds(params, tasks)
            simulations[params.jittered] += simulation
            draws[params.jittered] += draw
            each.extend((simulation, draw, float(params.jittered)))
            if tasks > largest:
                largest, where = tasks, _describe(combo, self) + (
                    f" (n = {params.n:,} micro-batches: global_batch_size over micro_batch_size x data_parallel)"
                    if self.has_workload and "n" not in self.given else "")
        read = {name: network for name, network in networks.items() if isinstance(network, LearnedPolicy)}
        return valid, tuple(invalid), total, largest, where, read, frozenset(invalid_at), \
            ((simulations[0], simulations[1]), (draws[0], draws[1])), np.frombuffer(each).reshape((-1, 3))

    @cached_property
    def length_tables(self) -> dict[str, LengthTable]:
        """By file, each table of lengths the grid names, as first read: a sweep sends these with its work, never
        reading the files again."""
        return {path: read_table(path) for name, values in self.values if name == "lengths" for path in values
                if path}

    def tables(self) -> dict[str, str]:
        """By file, the checksum of each table of lengths the grid names."""
        return {path: table.digest for path, table in self.length_tables.items()}

    def networks(self) -> dict[str, LearnedPolicy]:
        """By ``dispatch`` value (``learned:<file>``), the network each policy file of the grid held when the grid
        was first checked: a sweep plays these and sends them with its work, never reading the files again."""
        return self._scan[5]

    def task_estimate(self) -> tuple[int, int, str]:
        """Estimated tasks of one simulation of every valid environment summed, the largest, and its environment."""
        return self._scan[2], self._scan[3], self._scan[4]

    def seconds_estimate(self, policies: int, samples: int) -> tuple[float, float]:
        """Estimated seconds on one core (``cost``) of ``policies`` simulations of every valid environment, each
        over ``samples`` draws where it has noise (once without), and of each draw's work that every policy of an
        environment shares; and of the latter alone."""
        (still, noisy), (still_draws, noisy_draws) = self._scan[7]
        shared = still_draws + noisy_draws * samples
        return (still + noisy * samples) * policies + shared, shared

    def environment_seconds(self, policies: int, samples: int) -> np.ndarray:
        """Per valid environment, in grid order, the estimated seconds on one core (``cost``) of its ``policies``
        simulations, over ``samples`` draws where it has noise, with each draw's shared work (``seconds_estimate``
        of each alone)."""
        each = self._scan[8]
        draws = np.where(each[:, 2] == 1.0, float(samples), 1.0)
        return draws * (each[:, 0] * policies + each[:, 1])

    def invalid(self) -> tuple[tuple[str, str], ...]:
        """The combinations that break a schedule's requirement: (the varying parameters, the reason)."""
        return self._scan[1]

    def __len__(self) -> int:
        """How many valid, distinct environments the grid holds."""
        return self._scan[0]

    def __iter__(self) -> Iterator[EnvParams]:
        return self.environments()

    def environments(self, start: int = 0) -> Iterator[EnvParams]:
        """The valid environments in grid order, from the ``start``-th on."""
        return (params for params, _ in self.cases(start))

    def cases(self, start: int = 0) -> Iterator[tuple[EnvParams, Workload | None]]:
        """The valid environments in grid order, from the ``start``-th on, each with its workload (or None)."""
        def valid() -> Iterator[tuple[EnvParams, Workload | None]]:
            invalid_at = self._scan[6]  # what the scan found invalid, by the same checks as it
            for place, combo in enumerate(self._combinations()):
                if place not in invalid_at:
                    yield self._environment(combo)
        return islice(valid(), start, None)

    def varying(self) -> list[str]:
        """The parameters given more than one value."""
        return [name for name, values in self.values if len(values) > 1]

    def as_dict(self) -> dict[str, Any]:
        """Every parameter's values (``lengths`` only when the grid names a table: a grid without one reads as it did
        before tables existed, and its sweep's record is the same)."""
        tied = dict(self.ties)
        return {name: {"same_as": tied[name]} if name in tied else [_plain(value) for value in values]
                for name, values in self.values
                if (name != "lengths" or values != ("",)) and (name != "grad_bytes" or values != (None,))} | \
            {"samples": self.samples}

    def given_dict(self) -> dict[str, Any]:
        """The keys the config gave, as a config writes them: one that reads as this grid (a table's or a workload's
        sets the rest; a preset model or GPU by its name, another by its fields)."""
        return {key: [_as_given(item) for item in value] if key in ("model", "gpu") else value
                for key, value in self.as_dict().items() if key in self.given or key == "samples"}


#: The parameters that some combinations do not read (``unread_parameters``).
_IGNORABLE_BY_RULE = frozenset({*SCHEDULE_PARAMETERS, "memory_limit", "a2a_weights", "a2a_class", "ep_overlap",
                                "expert_imbalance", "ep_bandwidth", "route_nodes", "gather_len", "shard_group",
                                "jitter_dist", "seed", "slow_factor"})


#: The parameters ``unread_parameters`` has named since grids were first collapsed (``collapses_anew``).
_UNREAD_SINCE = frozenset({"expert_imbalance", "ep_bandwidth", "route_nodes", "gather_len", "shard_group",
                           "jitter_dist", "seed", "slow_factor"})


def _kept_at(name: str, values: tuple[Any, ...], combo: Mapping[str, Any]) -> int:
    """Of a parameter ``combo`` does not read, the place of the value its environment keeps: the first that the
    combination can take (a shard group must divide the data-parallel degree, read or not)."""
    if name == "shard_group":
        return next((i for i, value in enumerate(values) if value is None or combo["data_parallel"] % value == 0), 0)
    return 0


def unread_parameters(combo: Mapping[str, Any], workload: bool) -> dict[str, str]:
    """The parameters ``combo`` does not read, each with why: those of other schedules, a memory limit under the
    static order, the all-to-all's without one, the gathers' without sharding, the noise's without noise and the
    straggler's without a straggler (docs/model.md sections 6, 8, 12, 15, 16)."""
    schedule = combo["schedule"]
    unread = {name: f"schedule {schedule} does not read it" for name in SCHEDULE_PARAMETERS
              if name not in SCHEDULES[schedule].parameters}
    if combo["dispatch"] == "static":
        unread["memory_limit"] = "the static order (dispatch static) does not adapt to a memory limit"
    if (combo["expert_parallel"] == 1) if workload else (combo["a2a_len"] == 0.0):
        for name in ("a2a_weights", "a2a_class", "ep_overlap",
                     *(("expert_imbalance", "ep_bandwidth", "route_nodes") if workload else ())):
            unread[name] = f"there is no all-to-all ({'expert_parallel 1' if workload else 'a2a_len 0'})"
    elif schedule not in EP_OVERLAP_SCHEDULES:
        unread["ep_overlap"] = f"schedule {schedule} does not overlap an all-to-all with compute"
    if combo["zero"] == 0:
        for name in ("gather_len", *(("shard_group",) if workload else ())):
            unread[name] = "nothing is sharded (zero 0)"
    if combo["compute_jitter"] == 0.0 and combo["comm_jitter"] == 0.0:
        for name in ("jitter_dist", "seed"):
            unread[name] = "no length is drawn (compute_jitter and comm_jitter 0)"
    if combo["slow_gpu"] < 0:
        unread["slow_factor"] = "there is no straggler (slow_gpu -1)"
    return unread


def _ties(raw: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """The keys given as ``{"same_as": other}``: each takes ``other``'s value, which must be a number of the same
    domain given in the file."""
    ties = []
    for key, value in raw.items():
        if not (isinstance(value, dict) and "same_as" in value):
            continue
        other = value["same_as"]
        if set(value) != {"same_as"} or not isinstance(other, str):
            raise ConfigError(f"config key {key!r}: {json.dumps(value)}: a tie is {{\"same_as\": \"<key>\"}} alone")
        mine, theirs = PARAMETER.get(key), PARAMETER.get(other)
        if theirs is None and other not in WORKLOAD_KEYS:
            guess = get_close_matches(other, [name for name in PARAMETER if name != key], n=1)
            raise ConfigError(f"config key {key!r}: same_as {other!r}: no such key"
                              + (f"; did you mean {guess[0]!r}?" if guess else ""))
        if mine is None or theirs is None or mine.domain != theirs.domain or key in LIST_KEYS:
            raise ConfigError(f"config key {key!r}: same_as {other!r}: both must be number parameters of one "
                              f"domain (compute_jitter and comm_jitter, say)")
        given = raw.get(other)
        if given is None or isinstance(given, dict) and "same_as" in given:
            raise ConfigError(f"config key {key!r}: same_as {other!r}: the file must give {other!r} values of its own")
        ties.append((key, other))
    return tuple(ties)


def _count(value: object, key: str) -> int:
    """How many values a key's entry gives, without expanding it (1 for what the checks will refuse)."""
    if isinstance(value, list) and key in LIST_KEYS:  # a list of numbers is one value
        return len(value) if value and all(isinstance(item, list) for item in value) else 1
    if isinstance(value, list):
        return len(value)
    if isinstance(value, dict) and all(isinstance(value.get(k), (int, float)) and not isinstance(value.get(k), bool)
                                       and math.isfinite(value[k]) for k in ("start", "stop", "step")):
        if value["step"] > 0 and value["stop"] >= value["start"]:
            start, stop, step = (Decimal(repr(value[k])) for k in ("start", "stop", "step"))
            return int((stop - start) / step) + 1  # as _expand_range counts
    return 1


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are each given once (JSON would silently keep the last)."""
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise ConfigError(f"config key {key!r} is given twice; give it once (a list for several values)")
        seen[key] = value
    return seen


def _as_given(fields_of: dict[str, Any]) -> str | dict[str, Any]:
    """A model's or GPU's fields (``_plain``'s) as a config gives them: a preset's name, or its fields but the name."""
    presets: Mapping[str, Any] = MODEL_PRESETS if "layers" in fields_of else GPU_PRESETS
    name = str(fields_of.get("name"))
    if name in presets and asdict(presets[name]) == fields_of:
        return name
    return {key: value for key, value in fields_of.items() if key != "name"}


def _plain(value: object) -> object:
    """A grid value as JSON: a model or GPU by its fields."""
    if isinstance(value, (ModelShape, GpuSpec)):
        return asdict(value)
    return value


def _workload_grid(raw: Mapping[str, object]) -> list[tuple[str, tuple[object, ...]]]:
    """The workload keys' values; the environment keys a workload derives may not be given beside it."""
    for key in DERIVED_KEYS:
        if key in raw and key not in ("n", "sync_freq"):
            raise ConfigError(f"config key {key!r}: derived from the workload when 'model' is given; leave it out")
    if "n" in raw and "global_batch_size" in raw:
        raise ConfigError("config key 'n': the workload's n is global_batch_size / (micro_batch_size x "
                          "data_parallel); give n or global_batch_size, not both")
    models = _workload_values("model", raw["model"], {})
    defaults = {f.name: f.default for f in fields(Workload)}  # None where the default follows another key
    if "grad_bytes" not in raw:  # the bytes a parameter as they always were: a grid's record the same
        defaults["bytes_per_param"] = default_bytes_per_param(2, None)
    suspect: set[tuple[str, int]] = set()
    grid = [("model", tuple(models))] + [
        (key, tuple(_workload_values(key, raw[key], {"model": models[0]}, suspect)) if key in raw
         else (defaults[key],)) for key in WORKLOAD_KEYS if key != "model"]
    given = {key: values for key, values in grid if key in raw}
    for key, place in sorted(suspect, key=lambda at: (WORKLOAD_KEYS.index(at[0]), at[1])):
        # refused in the defaults' workload: is it in every one of the config's?
        item = given[key][place]
        names = [name for name in given if name != key]
        combinations = (dict(zip(names, values)) for values in product(*(given[name] for name in names)))
        first = _fault(key, item, next(combinations))
        # the first combination that takes it ends the search; one refused in all of them is its own fault, said as
        # the config's first combination has it (the grid's scan meets every combination in any case)
        if first is not None and all(_fault(key, item, others) is not None for others in combinations):
            raise ConfigError(f"config key {key!r}: {first}")
    return grid


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _fault(key: str, item: object, others: Mapping[str, Any]) -> ParameterError | None:
    """The error of ``key = item`` among ``others``, if it is its own (a workload of them all refused for ``key``);
    else None."""
    try:
        Workload(**{**others, key: item})
    except ParameterError as error:
        return error if error.name.split(".")[0] == key else None
    return None


def _describe(combo: Mapping[str, object], grid: EnvironmentGrid) -> str:
    """The combination by its schedule, n (or model), num_gpus and the other parameters that vary and it reads."""
    ignored = set(SCHEDULE_PARAMETERS) - set(get_schedule(str(combo["schedule"])).parameters)
    if grid.has_workload:
        ignored |= set(DERIVED_KEYS) - grid.given
    first = ["schedule", "model" if grid.has_workload else "n", "num_gpus"]
    shown = first + [name for name in grid.varying() if name not in first and name not in ignored]
    return ", ".join(f"{name}={getattr(combo[name], 'name', combo[name])}" for name in shown)
