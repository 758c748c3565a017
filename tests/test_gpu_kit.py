"""The GPU measurement kit runs end to end on this CPU, so it is ready the day a GPU is lent.

``benchmarks/gpu/export.py`` exports the fused train calls here (TensorFlow); ``run.py`` runs
them with JAX alone, checks one SGD step against TensorFlow's, times them and runs the JAX +
flashbax DQN beside them. On a lent GPU machine the same two scripts run (see
``benchmarks/gpu/README.md``); here JAX's CPU backend stands in for the GPU.

JAX 0.11.2 needs Python 3.12, so ``run.py`` runs in a side environment named by
``REPLAYGPU_JAX_PYTHON`` (``.ci/gpu-checks`` makes it); without it this test skips, and with
``REPLAYGPU_GPU_KIT=1`` a missing one is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "benchmarks" / "gpu"
JAX_PYTHON = os.environ.get("REPLAYGPU_JAX_PYTHON")

if os.environ.get("REPLAYGPU_GPU_KIT") == "1" and not JAX_PYTHON:
    raise RuntimeError("REPLAYGPU_GPU_KIT=1 but REPLAYGPU_JAX_PYTHON names no JAX interpreter")

pytestmark = pytest.mark.skipif(
    not JAX_PYTHON, reason="REPLAYGPU_JAX_PYTHON is unset (.ci/gpu-checks sets it)"
)


def test_exported_train_calls_run_in_jax_with_parity_and_the_flashbax_baseline(tmp_path):
    kit = tmp_path / "kit"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    export = subprocess.run(
        [sys.executable, str(KIT / "export.py"), "--out", str(kit), "--quick"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert export.returncode == 0, export.stderr[-3000:]
    cases = sorted(p.stem for p in kit.glob("*.json"))
    assert cases == ["atari", "dqn64", "sac"], cases
    carried = sum(p.stat().st_size for p in kit.iterdir())
    assert carried < 48 << 20, f"the quick kit is {carried / 2**20:.1f} MiB"

    report = tmp_path / "report.json"
    command = [JAX_PYTHON, str(KIT / "run.py"), "--kit", str(kit), "--repeats", "2"]
    run = subprocess.run(
        [*command, "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    reports = {r["case"]: r for r in json.loads(report.read_text())["cases"]}
    assert sorted(reports) == cases
    for name, r in reports.items():
        parity = r["parity"]
        # one SGD step of the same HLO on another XLA: integers (random state, counters, the
        # rows drawn) identical, floats to float32 rounding (measured here: <= 5e-7)
        assert parity["int_mismatches"] == [], (name, parity)
        assert parity["max_float_rel_diff"] < 1e-5, (name, parity)
        assert parity["compared"] > 10, (name, parity)  # the metrics and the updated variables
        assert r["steps_per_call"] == r["k"] and r["steps_per_s"] > 0, (name, r)
    dqn = reports["dqn64"]
    assert dqn["jax_flashbax_fused"] > 0 and dqn["jax_host_feed"] > 0
    assert "replaygpu fused loop" in run.stdout and "JAX + flashbax fused" in run.stdout
