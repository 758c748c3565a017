"""The GPU measurement kit runs end to end on this CPU, so it is ready the day a GPU is lent.

``benchmarks/gpu/export.py`` exports the fused train calls here (TensorFlow); ``check.py`` runs
``run.py`` with JAX alone once per XLA flag set, each in its own process: one SGD step checked
against TensorFlow's, timing, the loops XLA compiled (``hlo_loops``: trip counts, kernels per
step), the JAX + flashbax DQN beside them, and ``roundtrip.py``'s counted/uncounted pair. On a
lent GPU machine the same scripts run (see ``benchmarks/gpu/README.md``); here JAX's CPU
backend stands in for the GPU (it accepts the GPU flags and ignores them).

JAX 0.11.2 needs Python 3.12, so the kit runs in a side environment named by
``REPLAYGPU_JAX_PYTHON`` (``.ci/gpu-checks`` makes it); without it the kit's test skips, and
with ``REPLAYGPU_GPU_KIT=1`` a missing one is a failure. The counting rules of ``hlo_loops``
(pure Python) are checked here on every run.
"""

from __future__ import annotations

import importlib.util
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

needs_jax = pytest.mark.skipif(
    not JAX_PYTHON, reason="REPLAYGPU_JAX_PYTHON is unset (.ci/gpu-checks sets it)"
)

# loaded from its file: putting benchmarks/gpu/ on sys.path would shadow modules named run, check
_spec = importlib.util.spec_from_file_location("hlo_loops", KIT / "hlo_loops.py")
hlo_loops = sys.modules["hlo_loops"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hlo_loops)

#: an optimized GPU-like module: a counted loop of 5 whose body holds one fusion, a cuBLAS call,
#: a command buffer of two fusions, a nested counted loop of 3 (one fusion) and no-op glue;
#: then a loop of unknown count over a second loop that runs inside a command buffer
HLO = """HloModule m, is_scheduled=true

%fused_a (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %s = f32[8]{0} sine(%p)
}

%inner (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  %x = f32[8]{0} get-tuple-element(%t), index=1
  %f = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused_a
  ROOT %r = (s32[], f32[8]{0}) tuple(%i, %f)
}

%command_buffer (p0: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  %f1 = f32[8]{0} fusion(%p0), kind=kLoop, calls=%fused_a
  ROOT %f2 = f32[8]{0} fusion(%f1), kind=kLoop, calls=%fused_a
}

%body (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  %x = f32[8]{0} get-tuple-element(%t), index=1
  %c = f32[] constant(1)
  %f = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused_a
  %g = (f32[8,8]{1,0}, s8[0]{0}) custom-call(%f, %f), custom_call_target="__cublas$gemm"
  %cb = f32[8]{0} call(%f), to_apply=%command_buffer
  %w = (s32[], f32[8]) while(%t), condition=%c, body=%inner, backend_config=COUNTED_3
  %b = f32[8]{0} bitcast(%cb)
  ROOT %r = (s32[], f32[8]{0}) tuple(%i, %b)
}

%command_buffer.1 (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  ROOT %w = (s32[], f32[8]) while(%t), condition=%c, body=%inner, metadata={op_name="graphed"}
}

%outer (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  ROOT %cb = (s32[], f32[8]{0}) call(%t), to_apply=%command_buffer.1
}

ENTRY %main (a: (s32[], f32[8])) -> (s32[], f32[8]) {
  %a = (s32[], f32[8]{0}) parameter(0)
  %w = (s32[], f32[8]) while(%a), condition=%c, body=%body, metadata=SGD, backend_config=COUNTED_5
  ROOT %o = (s32[], f32[8]) while(%w), condition=%c, body=%outer, metadata={op_name="rest"}
}
"""
for name, value in {
    "COUNTED_3": '{"known_trip_count":{"n":"3"}}',
    "COUNTED_5": '{"known_trip_count":{"n":"5"},"known_init_step":{"init":"0","step":"1"}}',
    "SGD": '{op_name="sgd_chunks/sgd_steps" source_file="x"}',
}.items():
    HLO = HLO.replace(name, value)  # one line per instruction, as XLA prints them


def test_hlo_loops_counts_kernels_per_iteration_and_host_launches_by_its_rules():
    found = {loop["op_name"]: loop for loop in hlo_loops.loops(HLO)}
    sgd = hlo_loops.sgd_loop(list(found.values()))
    assert sgd is found["sgd_chunks/sgd_steps"] and sgd["known_trip_count"] == 5
    # fusion + cuBLAS + 2 fusions in the command buffer + 3 iterations of 1 fusion; the
    # constant, get-tuple-element, bitcast and tuple run nothing
    assert sgd["kernels_per_iteration"] == 7 and not sgd["nested_unknown"]
    # the host launches the fusion, the cuBLAS call, one graph, and the 3 inner fusions
    assert sgd["launches_per_iteration"] == 6 and sgd["command_buffers_per_iteration"] == 1
    rest = found["rest"]
    assert rest["known_trip_count"] is None and rest["kernels_per_iteration"] == 1
    assert rest["launches_per_iteration"] == 1  # its body is one graph: the inner loop in it
    graphed = found["graphed"]
    assert graphed["in_command_buffer"] and graphed["launches_per_iteration"] == 0
    assert hlo_loops.summary([sgd, rest]) == "sgd_chunks/sgd_steps n=5, rest n=?"


@pytest.fixture(scope="module")
def quick_kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kit = tmp_path_factory.mktemp("gpu") / "kit"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    export = subprocess.run(
        [sys.executable, str(KIT / "export.py"), "--out", str(kit), "--quick"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert export.returncode == 0, export.stderr[-3000:]
    return kit


@needs_jax
def test_exported_calls_run_under_two_flag_sets_with_counted_sgd_loops_parity_and_round_trip(
    quick_kit, tmp_path
):
    cases = sorted(p.stem for p in quick_kit.glob("*.json"))
    assert cases == ["atari", "dqn64", "sac"], cases
    carried = sum(p.stat().st_size for p in quick_kit.iterdir())
    assert carried < 48 << 20, f"the quick kit is {carried / 2**20:.1f} MiB"
    manifests = {c: json.loads((quick_kit / f"{c}.json").read_text()) for c in cases}
    assert all(m["chunk_steps"] == m["k"] for m in manifests.values()), manifests

    report = tmp_path / "report.json"
    command = [JAX_PYTHON, str(KIT / "check.py"), "--kit", str(quick_kit), "--json", str(report)]
    command += ["--flag-sets", "default", "while", "--set-timeout", "400", "--repeats", "2"]
    command += ["--roundtrip-iterations", "100", "1000"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    sets = {s["name"]: s for s in json.loads(report.read_text())["flag_sets"]}
    assert sorted(sets) == ["default", "while"]
    # each set ran in its own process under its own flags, which XLA parsed (an unknown one aborts)
    assert sets["default"]["xla_flags"] == ""
    assert sets["while"]["xla_flags"] == "--xla_gpu_enable_command_buffer=+WHILE"
    for set_name, s in sets.items():
        assert s["rc"] == 0 and not s["timed_out"], s
        reports = {r["case"]: r for r in s["cases"]}
        assert sorted(reports) == cases
        for name, r in reports.items():
            where = (set_name, name)
            parity = r["parity"]
            # one SGD step of the same HLO on another XLA: integers (random state, counters,
            # the rows drawn) identical, floats to float32 rounding (measured here: <= 5e-7)
            assert parity["ok"] and parity["int_mismatches"] == [], (where, parity)
            assert parity["max_float_rel_diff"] < 1e-5, (where, parity)
            assert parity["compared"] > 10, (where, parity)  # the metrics and updated variables
            assert r["steps_per_call"] == r["k"] and r["steps_per_s"] > 0, (where, r)
            assert r["us_per_step"] == pytest.approx(1e6 / r["steps_per_s"]), (where, r)
            # a call of k steps is one loop XLA counts (chunk_steps = k), read from the HLO
            # JAX compiled, its op name carried from TensorFlow's graph
            sgd = r["sgd_loop"]
            assert sgd["op_name"].split("/")[-1] == "sgd_steps", (where, sgd)
            assert sgd["known_trip_count"] == r["k"], (where, r["loops"])
            assert r["kernels_per_step"] == sgd["kernels_per_iteration"] > 5, (where, sgd)
            rest = [loop for loop in r["loops"] if loop["op_name"].endswith("sgd_steps_rest")]
            assert [loop["known_trip_count"] for loop in rest] == [None], (where, r["loops"])
        dqn = reports["dqn64"]
        assert dqn["jax_flashbax_fused"] > 0 and dqn["jax_host_feed"] > 0

        pair = s["roundtrip"]
        assert pair["iterations"] == [100, 1000]
        counted, uncounted = pair["fori"], pair["while"]
        assert [loop["known_trip_count"] for loop in counted["loops"]] == [1000], counted
        assert [loop["known_trip_count"] for loop in uncounted["loops"]] == [None], uncounted
        for form in (counted, uncounted):
            assert form["us_per_iteration_slope"] > 0, pair
            assert set(form["us_per_iteration"]) == {"100", "1000"}, pair
        assert pair["round_trip_us"] == pytest.approx(
            uncounted["us_per_iteration_slope"] - counted["us_per_iteration_slope"]
        )
    assert "replaygpu fused loop" in run.stdout and "JAX + flashbax fused" in run.stdout
    assert "SGD steps/s" in run.stdout and "fori us/iter" in run.stdout  # the summary table
