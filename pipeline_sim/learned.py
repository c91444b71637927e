"""A learned dispatcher (docs/model.md section 12.5): a policy network, read from its file, takes every decision of
an episode. It runs wherever a rule does (``dispatch = learned:<file>``): sweep rows, visualizers, the validator.

The file is an ``.npz`` of plain arrays, read without the training stack: the actor's layers (``weight.<k>``,
``bias.<k>``, tanh between them), its observation layout (``fields``), its actions (``actions``) and a note of
how it was trained (``about``, JSON). The decision is the highest logit among the actions the mask allows.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import zipfile
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from . import kernel
from .engine import check_run, simulate_figures
from .episode import Episode, episode_schedule
from .hindsight import hindsight_figures
from .inputs import TooLarge, read_at_most, where_relative
from .lookahead import lookahead_figures
from .model import HINDSIGHT, LOOKAHEAD, EnvParams, ParameterError, Policy, Schedule

#: The file's layout; a file of another format is refused by name.
POLICY_FORMAT = 1


#: The largest policy file read, and the most its arrays may take unpacked: a network of a few hundred thousand
#: weights takes a few MB.
MAX_POLICY_BYTES = 64 * 2 ** 20
_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


@dataclass(frozen=True, eq=False)
class LearnedPolicy:
    """An actor network: ``layers`` of (weight, bias), tanh between them, logits out. ``digest``: the checksum
    (SHA-256) of the file's bytes it was read from, empty for one made in memory."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    fields: tuple[str, ...]
    actions: tuple[str, ...]
    about: Mapping[str, object]
    digest: str = ""

    @cached_property
    def packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The layers as ``kernel.act`` reads them: every weight row after row, every bias, each layer's shape.
        The weights in 32 bits when every one of them is a 32-bit float, as a network trained by ``train.py`` has
        them: the same values in half the memory, which the network's evaluation reads at every decision."""
        weights = np.concatenate([weight.ravel() for weight, _ in self.layers])
        with np.errstate(over="ignore"):  # a weight beyond 32 bits' range becomes inf, unequal: kept in 64
            narrow = weights.astype(np.float32)
        return (narrow if np.array_equal(narrow, weights) else weights,
                np.concatenate([bias for _, bias in self.layers]),
                np.array([weight.shape for weight, _ in self.layers], dtype=np.int64))

    def act(self, observation: np.ndarray, mask: np.ndarray) -> int:
        """The allowed action of the highest logit (the first of equal ones), as the compiled play takes it."""
        weights, biases, shapes = self.packed
        room = max(len(observation), int(shapes[:, 1].max()))
        return int(kernel.act(np.asarray(observation, dtype=np.float64), np.asarray(mask, dtype=np.bool_), weights,
                              biases, shapes, np.empty(room), np.empty(room)))

    def to_bytes(self) -> bytes:
        arrays: dict[str, np.ndarray] = {"format": np.array(POLICY_FORMAT), "fields": np.array(self.fields),
                                         "actions": np.array(self.actions),
                                         "about": np.array(json.dumps(dict(self.about), sort_keys=True))}
        for k, (weight, bias) in enumerate(self.layers):
            arrays[f"weight.{k}"], arrays[f"bias.{k}"] = weight, bias
        buffer = io.BytesIO()
        np.savez(buffer, allow_pickle=False, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_file(cls, path: str | Path) -> LearnedPolicy:
        """Read a policy file; ``ValueError`` in one line for a file that is not one."""
        try:
            data = read_at_most(path, MAX_POLICY_BYTES)
        except FileNotFoundError:
            raise ValueError(f"no such policy file (train.py writes one: python train.py -c CONFIG"
                             f"{where_relative(path)})") from None
        except TooLarge as error:
            raise ValueError(f"is {error}, more than any policy file") from None
        except OSError as error:
            raise ValueError(f"is not a readable policy file ({error.strerror or type(error).__name__})") from None
        return _parsed(data)

    @classmethod
    def from_bytes(cls, data: bytes) -> LearnedPolicy:
        """A policy file's bytes read; ``ValueError`` in one line when they are not one."""
        arrays = _arrays(data)
        if "format" not in arrays or arrays["format"].shape != () or int(arrays["format"]) != POLICY_FORMAT:
            found = "no 'format' entry" if "format" not in arrays else f"'format' {arrays['format'].tolist()!r}"
            raise ValueError(f"is not a policy file of format {POLICY_FORMAT} ({found}; train.py writes one: its "
                             f"network's layers, the observation's fields, the actions and what it was trained on)")
        try:
            count = sum(1 for key in arrays if key.startswith("weight."))
            layers = tuple((np.asarray(arrays[f"weight.{k}"], dtype=np.float64),
                            np.asarray(arrays[f"bias.{k}"], dtype=np.float64)) for k in range(count))
            fields = tuple(str(name) for name in arrays["fields"].tolist())
            actions = tuple(str(name) for name in arrays["actions"].tolist())
            about = json.loads(str(arrays["about"]))
        except (KeyError, ValueError, TypeError):
            raise ValueError(f"is not a policy file of format {POLICY_FORMAT}: a part is missing or damaged") from None
        width = len(fields)
        for weight, bias in layers:
            if weight.ndim != 2 or weight.shape[0] != width or bias.shape != (weight.shape[1],):
                raise ValueError("is not a policy file: its layers do not chain")
            width = weight.shape[1]
        if not layers or width != len(actions):
            raise ValueError("is not a policy file: its last layer does not give one logit per action")
        if not all(np.isfinite(array).all() for layer in layers for array in layer):
            raise ValueError("has weights that are NaN or infinite (a training that diverged); train it again")
        return cls(layers, fields, actions, about, hashlib.sha256(data).hexdigest())


def _arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz``'s bytes. Each member's header is read first and what it claims (shape, type) held
    against the bytes the member holds, so that a damaged or hostile header allocates nothing."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        begins = data[:4] == b"PK\x03\x04"  # an archive's first bytes, its index (at the end) cut off or damaged
        raise ValueError("is not a readable policy file (" + ("an .npz archive cut short or damaged: its index is "
                         "missing; copy the file again" if begins else "not an .npz archive: a .npy or another "
                         "file renamed?") + ")") from None
    with archive:
        members = archive.infolist()
        unpacked = sum(info.file_size for info in members)
        if unpacked > MAX_POLICY_BYTES:
            raise ValueError(f"unpacks to {unpacked:,} bytes, more than any policy file "
                             f"({MAX_POLICY_BYTES // 2 ** 20} MB)")
        arrays = {}
        for info in members:
            name = info.filename.removesuffix(".npy")
            try:
                with archive.open(info) as member:
                    read_header = _HEADERS.get(np.lib.format.read_magic(member))
                    if read_header is None:
                        raise ValueError("an array format numpy does not write for plain arrays")
                    shape, _, dtype = read_header(member)
                    claimed = math.prod(shape) * dtype.itemsize
                    if dtype.hasobject or claimed > info.file_size:
                        raise ValueError(f"its header claims {shape} of {dtype} in {info.file_size:,} bytes")
                with archive.open(info) as member:
                    arrays[name] = np.lib.format.read_array(member, allow_pickle=False)
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
                raise ValueError(f"is not a readable policy file: its array {name} is damaged ({error})") from None
    return arrays


@lru_cache(maxsize=8)
def _parsed(data: bytes) -> LearnedPolicy:
    """Per process, each content read once: a file replaced by another of the same size and time is another
    network."""
    return LearnedPolicy.from_bytes(data)


def read_policy(params: EnvParams) -> LearnedPolicy:
    """The network of ``params``' policy file, as its bytes are now; ``ParameterError`` naming ``dispatch`` when
    there is none or it is not a policy file."""
    name = params.learned
    if name is None:
        raise ParameterError("dispatch", params.dispatch, "is not a learned dispatcher (learned:<policy file>)")
    try:
        return LearnedPolicy.from_file(name)
    except ValueError as error:
        raise ParameterError("dispatch", params.dispatch, str(error)) from None


def load_policy(params: EnvParams, network: LearnedPolicy | None = None) -> LearnedPolicy:
    """``params``' learned policy: ``network``, the one a sweep read once and sends with its work, or else its file
    read now; checked against the observation and actions of ``params``' episodes, ``ParameterError`` naming
    ``dispatch`` otherwise."""
    policy = read_policy(params) if network is None else network
    fields = Episode.layout(params)
    if policy.fields != fields[0] or policy.actions != fields[1]:
        raise ParameterError("dispatch", params.dispatch,
                             f"was trained on an observation of {len(policy.fields)} fields and "
                             f"{len(policy.actions)} actions ({', '.join(policy.actions)}); {params.schedule} on "
                             f"{params.num_gpus} GPUs has {len(fields[0])} and {len(fields[1])} "
                             f"({', '.join(fields[1])}): train a policy for it")
    return policy


def play(episode: Episode, policy: LearnedPolicy, sample: int) -> Episode:
    """Run ``episode``'s ``sample``-th draw to its end, every decision ``policy``'s (a decision with one possible
    action is no decision: the network could only take it), inside the compiled loop."""
    episode.play(sample, *policy.packed)
    return episode


def figures_of(params: EnvParams, policies: Sequence[Policy], sample: int = 0,
               network: LearnedPolicy | None = None) -> np.ndarray:
    """``engine.simulate_figures``, a learned dispatcher's, hindsight's and the look-ahead's included: for hindsight
    its replayed order (``hindsight.hindsight_figures``); for the look-ahead its episode per policy
    (``lookahead.lookahead_figures``); for a learned one one played episode per policy, by
    ``network`` when given (``load_policy``)."""
    if params.dispatch == HINDSIGHT:
        return hindsight_figures(params, policies, sample)
    if params.dispatch == LOOKAHEAD:
        return lookahead_figures(params, policies, sample)
    if params.learned is None:
        return simulate_figures(params, policies, sample)
    learned = load_policy(params, network)
    return np.array([play(Episode(params, policy, allow_large=True), learned, sample).figures()
                     for policy in policies])


def simulate_learned(params: EnvParams, policy: Policy, sample: int = 0,
                     network: LearnedPolicy | None = None) -> Schedule:
    """``engine.simulate`` for a learned dispatcher: the played episode as a ``Schedule`` (by ``network`` when
    given, ``load_policy``)."""
    check_run("simulate_learned", params, policy, sample)
    learned = load_policy(params, network)
    return episode_schedule(params, policy, sample, lambda episode: play(episode, learned, sample))
