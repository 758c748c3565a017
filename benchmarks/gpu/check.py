"""The device check: ``run.py`` once per XLA flag set, each in its own process (XLA reads
``XLA_FLAGS`` once per process), merged into one report and one summary table.

Each flag set runs every case of ``--kit`` (``export.py --device-check``: dqn64, dqn256,
r2d2-paper, atari) and ``roundtrip.py``'s pair. The sets (README, "Counted loops on the GPU"):

- ``default``: XLA's own settings;
- ``while``: whole ``while`` loops recorded into CUDA graphs too, when every thunk in them is a
  command;
- ``while-unroll``: the same, a loop with a known trip count unrolled into the graph;
- ``no-command-buffers``: no CUDA graphs at all, every kernel launched from the host.

A set's flags are added to the ``XLA_FLAGS`` this process was given (say, TF32 off), so
``default`` means no flags of its own. Needs only what ``run.py`` needs (JAX, numpy; flashbax and
optax for the DQN baselines). Run:
    python benchmarks/gpu/check.py --kit benchmarks/gpu/kit --json /tmp/check.json
    python benchmarks/gpu/check.py --kit KIT --flag-sets default while --repeats 2 --no-baselines
Options it does not know go to ``run.py`` (``--repeats``, ``--rtol``, ``--cases``, ...).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import hlo_loops

RUN = Path(__file__).resolve().parent / "run.py"
#: the flag sets, by name: what each adds to XLA_FLAGS
FLAG_SETS = {
    "default": "",
    "while": "--xla_gpu_enable_command_buffer=+WHILE",
    "while-unroll": (
        "--xla_gpu_enable_command_buffer=+WHILE --xla_gpu_command_buffer_unroll_loops=true"
    ),
    "no-command-buffers": "--xla_gpu_enable_command_buffer=",
}
#: lines of a failed set's output kept in the report
TAIL_LINES = 40


def run_set(
    name: str, kit: Path, forward: list[str], timeout: float, folder: Path
) -> dict[str, Any]:
    """One flag set in a process of its own: its run.py report, with the flags, the exit
    status, the seconds it took, and the end of its output when it failed."""
    flags = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), FLAG_SETS[name]) if f)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if flags:
        env["XLA_FLAGS"] = flags
    report_path = folder / f"{name}.json"
    command = [sys.executable, str(RUN), "--kit", str(kit), "--json", str(report_path)]
    command += ["--flag-set", name, "--roundtrip", *forward]
    print(f"[{name}] XLA_FLAGS={flags or '(unset)'}", flush=True)
    start = time.perf_counter()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        process.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    for text in process.stdout or []:
        tail.append(text.rstrip("\n"))
        print(f"[{name}] {text}", end="", flush=True)
    rc = process.wait()
    timer.cancel()
    timed_out = killed.is_set()
    result: dict[str, Any] = {"name": name, "xla_flags": flags, "rc": rc}
    result["seconds"] = time.perf_counter() - start
    result["timed_out"] = timed_out
    if report_path.exists():  # rewritten after each case: what a timed-out set finished
        result.update(json.loads(report_path.read_text()))
        result["xla_flags"] = flags
    if rc != 0:
        result["output_tail"] = list(tail)
    return result


def cell(value: Any, spec: str) -> str:
    """``value`` formatted by ``spec``, figures below 100 to 3 significant digits, "-" if None."""
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) < 100:
        return f"{value:.3g}"
    return format(value, spec)


def table(sets: list[dict[str, Any]]) -> list[str]:
    """The summary: one row per case and flag set, then one per flag set for the pair."""
    head = (
        f"{'case':<11} {'flag set':<19} {'SGD steps/s':>12} {'us/step':>9} {'sgd n':>6} "
        f"{'kernels/step':>12} {'launches/step':>13} {'in graph':>8} {'JAX fused':>10}  parity"
    )
    rows = [head, "-" * len(head)]
    by_case: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for s in sets:
        for case in s.get("cases", []):
            by_case.setdefault(case["case"], []).append((s["name"], case))
    for name, entries in by_case.items():
        for set_name, r in entries:
            sgd = r.get("sgd_loop") or {}
            parity = r.get("parity")
            verdict = (
                "timing only"
                if parity is None
                else f"{'ok' if parity['ok'] else 'MISMATCH'} {parity['max_float_rel_diff']:.1e}"
                + (f", ints differ: {parity['int_mismatches']}" if parity["int_mismatches"] else "")
            )
            rows.append(
                f"{name:<11} {set_name:<19} {cell(r.get('steps_per_s'), ',.0f'):>12} "
                f"{cell(r.get('us_per_step'), ',.0f'):>9} "
                f"{cell(sgd.get('known_trip_count'), 'd'):>6} "
                f"{cell(r.get('kernels_per_step'), 'd'):>12} "
                f"{cell(sgd.get('launches_per_iteration'), 'd'):>13} "
                f"{'yes' if sgd.get('in_command_buffer') else 'no':>8} "
                f"{cell(r.get('jax_flashbax_fused'), ',.0f'):>10}  {verdict}"
            )
    rows.append("")
    head = (
        f"{'round trip':<19} {'fori us/iter':>12} {'while us/iter':>13} {'difference':>10} "
        f"{'while in graph':>14}  (slope over iterations)"
    )
    rows += [head, "-" * len(head)]
    for s in sets:
        rt = s.get("roundtrip")
        if not rt:
            why = "timed out" if s["timed_out"] else f"rc {s['rc']}"
            rows.append(f"{s['name']:<19} not measured ({why})")
            continue
        in_graph = any(loop["in_command_buffer"] for loop in rt["while"]["loops"])
        rows.append(
            f"{s['name']:<19} {rt['fori']['us_per_iteration_slope']:>12.2f} "
            f"{rt['while']['us_per_iteration_slope']:>13.2f} {rt['round_trip_us']:>10.2f} "
            f"{'yes' if in_graph else 'no':>14}  {rt['iterations']}"
        )
    rows.append("")
    seen = set()
    for s in sets:
        for case in s.get("cases", []):
            if case["case"] not in seen:
                seen.add(case["case"])
                loops = hlo_loops.summary(case.get("loops", []))
                rows.append(f"loops of {case['case']} ({s['name']}): {loops}")
    return rows


def main() -> None:
    # no abbreviations: the options it does not know go to run.py (its --flag-set among them)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--kit", type=Path, required=True, help="the folder export.py wrote")
    parser.add_argument("--json", type=Path, required=True, help="write the report here")
    parser.add_argument(
        "--flag-sets", nargs="+", choices=sorted(FLAG_SETS), default=list(FLAG_SETS)
    )
    parser.add_argument(
        "--set-timeout",
        type=float,
        default=100,
        help="seconds one flag set may take (4 sets of 100 s fit a device call of 8 minutes)",
    )
    args, forward = parser.parse_known_args()
    sets = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.flag_sets:
            sets.append(run_set(name, args.kit, forward, args.set_timeout, Path(folder)))
            device = next((s["device"] for s in sets if "device" in s), None)
            report = {"device": device, "flag_sets": sets}
            args.json.write_text(json.dumps(report, indent=1))
    print("\n".join(table(sets)), flush=True)
    failed = [s["name"] for s in sets if s["rc"] != 0]
    if failed:
        raise SystemExit(f"flag sets that failed (parity, a crash or the timeout): {failed}")


if __name__ == "__main__":
    main()
