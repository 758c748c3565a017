"""The deterministic demos learn bit for bit what they learned when the fingerprints were
recorded (issue 34, deliverable 5): `demo cartpole`, `pendulum`, a short `breakout` and a short
`r2d2-cartpole`, each at ``benchmarks/fingerprint.py``'s fixed budget and seed, against
``benchmarks/fingerprints.json``: env and SGD steps, the greedy evaluation, a SHA-256 of every
training episode and of every metric value (wall-clock rates left out).

Floating point depends on the machine: the demos run with TensorFlow's threads pinned to one
and oneDNN's custom ops off (`fingerprint.PINNED_ENV`), yet XLA compiles for the host CPU and
another TensorFlow version may sum in another order. So each case compares only against a
fingerprint recorded with the same TensorFlow version on the same kind of CPU (model and vector
instructions) and skips otherwise, saying so; re-record on the new setup *before* changing
code, from a commit that still passes, with
``python benchmarks/fingerprint.py --write benchmarks/fingerprints.json``. Together about two
minutes on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "benchmarks" / "fingerprints.json"


def _load_tool():
    spec = importlib.util.spec_from_file_location(
        "fingerprint", ROOT / "benchmarks" / "fingerprint.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fingerprint = _load_tool()


@pytest.fixture(scope="module")
def recorded() -> dict:
    document = json.loads(RECORDED.read_text())
    here = fingerprint.machine()
    other = {k: (document[k], v) for k, v in here.items() if document.get(k) != v}
    if other:
        pytest.skip(
            "fingerprints recorded on another setup ("
            + "; ".join(f"{k}: recorded {a!r}, here {b!r}" for k, (a, b) in other.items())
            + "): record them here from a commit that passes before comparing"
        )
    return document


@pytest.mark.parametrize("name", list(fingerprint.RUNS))
def test_demo_learns_bit_identical_to_its_recorded_fingerprint(name, recorded):
    assert recorded["flags"][name] == fingerprint.RUNS[name], "budget changed: record again"
    assert recorded["env"] == fingerprint.PINNED_ENV
    with tempfile.TemporaryDirectory(prefix=f"fingerprint-{name}-") as folder:
        stdout, _ = fingerprint.run_demo(name, folder)
        got = fingerprint.fingerprint(stdout, folder)
    assert fingerprint.differences(name, recorded["runs"][name], got) == []
    assert got == recorded["runs"][name]
