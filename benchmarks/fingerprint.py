"""Fingerprints of the deterministic demos: a refactor must not change what they learn (issue 34,
deliverable 5).

Each demo below runs as ``python -m replaygpu demo NAME --seed 1 ...`` at a small fixed budget
in a fresh run folder, in a subprocess. Its fingerprint is what a seeded run makes and nothing
that depends on the clock:

  env steps, SGD steps  from the demo's result line;
  eval                  the greedy evaluation's mean, std, min and max (the printed line);
  episodes              count and SHA-256 of every training episode in order: (env step,
                        return, length), from the TensorBoard events ``charts/episodic_return``
                        and ``charts/episodic_length``, float32 as written;
  metrics               per tag, count and SHA-256 of every (env step, float32 value) in order:
                        losses, Q values, epsilon, alpha, periodic and final evaluations;
  sha256                over all of the above.

Left out, as wall-clock figures: the tags in `WALL_CLOCK_TAGS` (``charts/SPS``,
``charts/SGD_steps_per_s``), the seconds and rates of the result line and the events' wall
times. The demos write every value as reported (`EventsRecorder` with ``every_s`` 0; the
``--summary-every-s`` cadence belongs to ``replaygpu learner`` only), so no cadence enters.

The subprocesses run with `PINNED_ENV`: one TensorFlow thread per op and between ops (a
reduction split over as many threads as the machine has cores adds in another order) and
oneDNN's custom ops off (they choose kernels by the CPU's instruction set). Floating point still
differs between CPUs (XLA compiles for the host) and TensorFlow versions: compare against a
fingerprint recorded on the same TensorFlow version and kind of CPU (``tf_version`` and
``cpu`` are recorded beside the runs; `--check` says when they differ).

    python benchmarks/fingerprint.py                                    # print the lines
    python benchmarks/fingerprint.py --write benchmarks/fingerprints.json
    python benchmarks/fingerprint.py --check benchmarks/fingerprints.json [--only cartpole]

``--check`` exits 1 naming each field that differs (a metric tag by name).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

#: the demos and their fixed budgets; every run is seed 1. Small, but each trains: hundreds to
#: thousands of SGD steps, a target sync, a periodic evaluation where the demo has one
RUNS: dict[str, list[str]] = {
    "cartpole": ["--steps", "5000"],
    "pendulum": ["--steps", "1500"],
    "breakout": [
        "--steps",
        "2000",
        "--learning-starts",
        "500",
        "--buffer-size",
        "5000",
        "--target-update-interval",
        "250",
        "--report-interval",
        "100",
        "--eval-episodes",
        "1",
    ],
    "r2d2-cartpole": ["--steps", "4000", "--learning-starts", "2000", "--eval-episodes", "5"],
}
SEED = 1

#: TensorBoard tags whose values are wall-clock rates
WALL_CLOCK_TAGS = frozenset({"charts/SPS", "charts/SGD_steps_per_s"})
#: the tags of one training episode
EPISODE_TAGS = ("charts/episodic_return", "charts/episodic_length")

#: the environment of the demo subprocesses (see the module doc)
PINNED_ENV = {
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}

_STEPS = re.compile(r"^(?P<name>\S+): (?P<env>\d+) env steps, (?P<sgd>\d+) SGD steps", re.M)
_EVAL = re.compile(
    r"greedy evaluation over (?P<n>\d+) episodes: mean return (?P<mean>\S+) "
    r"\(std (?P<std>\S+), min (?P<min>\S+), max (?P<max>\S+)\)"
)


def run_demo(name: str, folder: str) -> tuple[str, float]:
    """Run demo ``name`` at its `RUNS` budget into ``folder``; its stdout and wall seconds.

    Raises:
        RuntimeError: the demo failed (its output's tail in the message).
    """
    command = [sys.executable, "-m", "replaygpu", "demo", name, "--seed", str(SEED)]
    command += [*RUNS[name], "--run-dir", folder]
    began = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **PINNED_ENV}, check=False
    )
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-2000:]}"
            f"{done.stderr[-4000:]}"
        )
    return done.stdout, seconds


def _records(path: str) -> Iterator[bytes]:
    """The records of a TFRecord file (length, its CRC, data, its CRC; CRCs not checked)."""
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        yield data[at + 12 : at + 12 + length]
        at += 12 + length + 4


def read_scalars(folder: str) -> dict[str, list[tuple[int, bytes]]]:
    """Every scalar in the event files of ``folder``: tag -> [(step, float32 bytes)] in order."""
    from tensorboard.compat.proto import event_pb2

    files = sorted(f for f in os.listdir(folder) if f.startswith("events.out.tfevents."))
    if len(files) != 1:
        raise RuntimeError(f"{folder}: expected one event file, found {files}")
    scalars: dict[str, list[tuple[int, bytes]]] = {}
    for record in _records(os.path.join(folder, files[0])):
        event = event_pb2.Event.FromString(record)
        for value in event.summary.value:
            tensor = value.HasField("tensor")  # tf.summary writes a tensor; TF1 a simple_value
            number = value.tensor.float_val[0] if tensor else value.simple_value
            scalars.setdefault(value.tag, []).append((event.step, struct.pack("<f", number)))
    return scalars


def _sha256(rows: Sequence[tuple[int, bytes]]) -> str:
    digest = hashlib.sha256()
    for step, value in rows:
        digest.update(struct.pack("<q", step) + value)
    return digest.hexdigest()


def fingerprint(stdout: str, folder: str) -> dict[str, Any]:
    """The fingerprint of one finished demo run: its result line and the events in ``folder``."""
    steps, evaluation = _STEPS.search(stdout), _EVAL.search(stdout)
    if steps is None or evaluation is None:
        raise RuntimeError(f"no result line in the demo's output:\n{stdout[-2000:]}")
    scalars = read_scalars(folder)
    returns, lengths = (scalars.pop(tag, []) for tag in EPISODE_TAGS)
    if [s for s, _ in returns] != [s for s, _ in lengths]:
        raise RuntimeError(f"{folder}: episodic returns and lengths at different steps")
    episodes = [(s, r + n) for (s, r), (_, n) in zip(returns, lengths, strict=True)]
    metrics = {
        tag: [len(rows), _sha256(rows)]
        for tag, rows in sorted(scalars.items())
        if tag not in WALL_CLOCK_TAGS
    }
    record: dict[str, Any] = {
        "env_steps": int(steps["env"]),
        "sgd_steps": int(steps["sgd"]),
        "eval": {k: float(evaluation[k]) for k in ("mean", "std", "min", "max")}
        | {"episodes": int(evaluation["n"])},
        "episodes": [len(episodes), _sha256(episodes)],
        "metrics": metrics,
    }
    record["sha256"] = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return record


def line(name: str, record: dict[str, Any], seconds: float | None = None) -> str:
    """One demo's fingerprint as a printed line."""
    ev = record["eval"]
    tail = f"  ({seconds:.0f} s)" if seconds is not None else ""
    return (
        f"{name:14s} {record['sha256'][:16]}  eval {ev['mean']:g} (std {ev['std']:g}, "
        f"min {ev['min']:g}, max {ev['max']:g}, {ev['episodes']} ep)  {record['env_steps']} "
        f"env steps, {record['sgd_steps']} SGD steps, {record['episodes'][0]} episodes, "
        f"{sum(n for n, _ in record['metrics'].values())} metric values{tail}"
    )


def differences(name: str, want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints of demo ``name``, a line per field or tag."""
    found = []
    for key in ("env_steps", "sgd_steps", "eval", "episodes"):
        if want.get(key) != got.get(key):
            found.append(f"{name}: {key}: recorded {want.get(key)}, now {got.get(key)}")
    old, new = want.get("metrics", {}), got.get("metrics", {})
    for tag in sorted(old.keys() | new.keys()):
        if old.get(tag) != new.get(tag):
            found.append(f"{name}: metric {tag}: recorded {old.get(tag)}, now {new.get(tag)}")
    if not found and want.get("sha256") != got.get("sha256"):
        found.append(f"{name}: sha256: recorded {want.get('sha256')}, now {got.get('sha256')}")
    return found


#: the CPU features that choose XLA's and Eigen's kernels, and so the order of float sums
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile")


def machine() -> dict[str, str]:
    """What the floating point depends on: TensorFlow's version, the CPU and its vector
    instructions (`ISA_FLAGS`, from /proc/cpuinfo where there is one)."""
    import tensorflow as tf

    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for row in f:
                key, _, value = row.partition(":")
                if key.strip() == "model name":
                    cpu = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = " ".join(flag for flag in ISA_FLAGS if flag in flags)
    return {"tf_version": tf.__version__, "cpu": f"{cpu} ({isa})" if isa else cpu}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(RUNS), help="these demos only")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--write", metavar="JSON", help="record the fingerprints into JSON (with --only: those)"
    )
    group.add_argument("--check", metavar="JSON", help="compare with JSON; exit 1 if any differs")
    args = parser.parse_args(argv)
    names = args.only or list(RUNS)
    recorded: dict[str, Any] = {}
    if args.check:
        with open(args.check) as f:
            recorded = json.load(f)
        missing = [n for n in names if n not in recorded.get("runs", {})]
        if missing:
            parser.error(f"{args.check} records no fingerprint of {', '.join(missing)}")
        if recorded.get("flags") and any(recorded["flags"][n] != RUNS[n] for n in names):
            parser.error(f"{args.check} was recorded with other flags: {recorded['flags']}")
    here = machine()
    pins = " ".join(f"{k}={v}" for k, v in PINNED_ENV.items())
    print(f"TensorFlow {here['tf_version']} on {here['cpu']}; {pins}")
    runs: dict[str, Any] = {}
    found: list[str] = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"fingerprint-{name}-") as folder:
            stdout, seconds = run_demo(name, folder)
            runs[name] = fingerprint(stdout, folder)
        print(line(name, runs[name], seconds), flush=True)
        if args.check:
            found += differences(name, recorded["runs"][name], runs[name])
    if args.write:
        if args.only and os.path.exists(args.write):  # re-record some: keep the others
            with open(args.write) as f:
                runs = {**json.load(f)["runs"], **runs}
        document = {**here, "seed": SEED, "env": PINNED_ENV, "flags": RUNS, "runs": runs}
        with open(args.write, "w") as f:
            json.dump(document, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"recorded {', '.join(runs)} in {args.write}")
    if args.check:
        other = {k: (recorded.get(k), v) for k, v in here.items() if recorded.get(k) != v}
        for key, (then, now) in other.items():
            print(f"note: recorded with {key} {then!r}, this is {now!r}: floats may differ")
        if found:
            print("\n".join(["fingerprints differ:", *found]))
            return 1
        print(f"{', '.join(names)}: identical to {args.check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
