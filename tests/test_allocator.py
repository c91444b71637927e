"""The allocator keeps what a simulation frees for the next one (pipeline_sim/allocator.py): measured in page faults,
in fresh processes, against a user's own setting, which is left as it is."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Rounds of allocating blocks of the sizes a simulation's arrays have, touching them and freeing them all: the page
#: faults of the last round, after the engine's import (the engine sets the allocator up).
_ROUNDS = """
import json, resource, sys
sys.path.insert(0, {root!r})
import numpy as np
import pipeline_sim.engine
from pipeline_sim import allocator

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

for _ in range(3):
    before = faults()
    blocks = [np.ones(512 * 1024 * (k + 1)) for k in range(6)]  # 4 to 24 MB, 84 MB in all
    del blocks
    last = faults() - before
print(json.dumps({{"set": allocator.keep_freed_memory(), "faults": last}}))
"""


def _last_round(**environment: str) -> dict:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    result = subprocess.run([sys.executable, "-c", _ROUNDS.format(root=str(ROOT))], env={**env, **environment},
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's allocator")
def test_freed_arrays_are_reused_without_faulting_their_pages_in_again():
    kept = _last_round()
    assert kept["set"] is True
    users = _last_round(MALLOC_MMAP_THRESHOLD_="131072")  # the user's own threshold, glibc's initial one
    assert users["set"] is False
    # 84 MB touched is over 20,000 pages: under the user's setting each round faults them in again (fewer with huge
    # pages, still many); kept, the last round reuses the first's
    assert users["faults"] > 1000
    assert kept["faults"] * 20 < users["faults"]
