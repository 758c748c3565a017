"""Prioritized replay, sample + priority update per step: cpprb and TorchRL vs replaygpu.

Each step draws a batch of 256 transitions in proportion to priority (alpha 0.6, beta 0.4),
gathers them (obs [8] float32, action int64, reward float32, next_obs [8] float32,
terminated, truncated), computes a TD-like value from the batch, ``|td|``, and writes it back
as the rows' new priorities. Tables of 1e4 and 1e6 rows, filled with random transitions and
exponential(1) priorities before timing.

  cpprb       ``cpprb.PrioritizedReplayBuffer``: ``sample(256, beta)``, numpy TD,
              ``update_priorities(indexes, |td|)``.
  torchrl     ``torchrl.data.PrioritizedReplayBuffer`` over ``LazyTensorStorage`` (its
              ``PrioritizedSampler``, a C++ sum tree): ``sample(return_info=True)``, torch TD,
              ``update_priority(info["index"], |td|)``.
  replaygpu   ``Sampler(table, Prioritized())`` (default: its draw and write are XLA clusters):
              eager     ``sample(256)`` then ``update_priorities`` from Python, one step a call;
              loop      the fused `Learner` loop (a tf.function tf.while_loop of --loop-steps
                        steps, sample + update_fn + priority write in each), jit_compile=False;
              loop+xla  the same loop compiled whole with jit_compile=True.

Each library runs in its own subprocess (cpprb in benchmarks/peers/.venv-peers, TorchRL in
benchmarks/peers/.venv-torchrl, both made by setup.sh: TorchRL's C++ extension needs the torch
its wheel was built against, 2.14.1; replaygpu in this interpreter's venv), one per (capacity,
round, library), the libraries alternating within each round; a subprocess prints one JSON
line with the median seconds per step over --repeats timed runs. Reports the median over
rounds and the speed of each replaygpu mode over the best peer (target at 1e6 rows: >= 2x).
Run:

    bash benchmarks/peers/setup.sh
    .venv/bin/python benchmarks/peers/prioritized.py            # ~5 min on 2 cores
    .venv/bin/python benchmarks/peers/prioritized.py --rounds 1 --capacities 10000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# benchmarks/ for common.py, which imports only numpy: every venv this script runs in has it
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import dqn_spec, random_transitions

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PEERS_PYTHON = os.path.join(HERE, ".venv-peers", "bin", "python")
TORCHRL_PYTHON = os.path.join(HERE, ".venv-torchrl", "bin", "python")
BATCH = 256
OBS_DIM = 8
ALPHA, BETA = 0.6, 0.4
CHUNK = 100_000
PEERS = ("cpprb", "torchrl")
PEER_PYTHONS = {"cpprb": PEERS_PYTHON, "torchrl": TORCHRL_PYTHON}
MODES = ("eager", "loop", "loop+xla")


def random_chunk(rng: Any, n: int) -> tuple[dict[str, Any], Any]:
    """``n`` random transitions as numpy arrays, and their exponential(1) priorities."""
    return random_transitions(rng, n, OBS_DIM), rng.exponential(size=n)


def time_steps(step, steps: int, repeats: int) -> float:
    """Median seconds per call of ``step()`` over ``repeats`` runs of ``steps`` calls."""
    for _ in range(min(steps, 50)):
        step()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def bench_cpprb(capacity: int, args: argparse.Namespace) -> dict[str, float]:
    import cpprb
    import numpy as np

    rng = np.random.default_rng(0)
    env_dict = {
        "obs": {"shape": OBS_DIM, "dtype": np.float32},
        "action": {"dtype": np.int64},
        "reward": {"dtype": np.float32},
        "next_obs": {"shape": OBS_DIM, "dtype": np.float32},
        "terminated": {"dtype": np.bool_},
        "truncated": {"dtype": np.bool_},
    }
    rb = cpprb.PrioritizedReplayBuffer(capacity, env_dict, alpha=ALPHA)
    for start in range(0, capacity, CHUNK):
        data, priorities = random_chunk(rng, min(CHUNK, capacity - start))
        rb.add(**data, priorities=priorities)

    def step() -> None:
        batch = rb.sample(BATCH, beta=BETA)
        td = batch["obs"].mean(1) + batch["reward"][:, 0] + batch["next_obs"].mean(1)
        float((batch["weights"] * td).mean())
        rb.update_priorities(batch["indexes"], np.abs(td))

    return {"step": time_steps(step, args.steps, args.repeats)}


def bench_torchrl(capacity: int, args: argparse.Namespace) -> dict[str, float]:
    import numpy as np
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    rb = PrioritizedReplayBuffer(
        alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(capacity), batch_size=BATCH
    )
    for start in range(0, capacity, CHUNK):
        data, priorities = random_chunk(rng, min(CHUNK, capacity - start))
        n = len(priorities)
        td = TensorDict({k: torch.from_numpy(v) for k, v in data.items()}, batch_size=[n])
        index = rb.extend(td)
        rb.update_priority(index, torch.from_numpy(priorities).float())  # fp32 sum tree

    def step() -> None:
        batch, info = rb.sample(return_info=True)
        td = batch["obs"].mean(1) + batch["reward"] + batch["next_obs"].mean(1)
        float((torch.as_tensor(info["priority_weight"]) * td).mean())
        rb.update_priority(info["index"], td.abs())

    return {"step": time_steps(step, args.steps, args.repeats)}


def bench_replaygpu(capacity: int, args: argparse.Namespace) -> dict[str, float]:
    import numpy as np

    import replaygpu as rg

    rng = np.random.default_rng(0)
    table = rg.ReplayTable(dqn_spec(OBS_DIM), capacity)
    priorities = []
    for start in range(0, capacity, CHUNK):
        data, p = random_chunk(rng, min(CHUNK, capacity - start))
        table.append(data)
        priorities.append(p)
    return {mode: time_replaygpu(table, priorities, mode, args) for mode in MODES}


def time_replaygpu(table: Any, priorities: list[Any], mode: str, args: argparse.Namespace) -> float:
    """Median seconds per step of a fresh prioritized `Sampler` over ``table`` in ``mode``."""
    import tensorflow as tf

    import replaygpu as rg
    from replaygpu.keys import IMPORTANCE_WEIGHTS, PRIORITIES

    sampler = rg.Sampler(table, rg.Prioritized(alpha=ALPHA, beta=BETA), seed=1)
    for i, p in enumerate(priorities):
        rows = tf.range(i * CHUNK, i * CHUNK + len(p), dtype=tf.int64)
        sampler.update_priorities(rows, tf.constant(p))

    def td_of(batch: dict[str, tf.Tensor]) -> tf.Tensor:
        obs, next_obs = batch["obs"], batch["next_obs"]
        return tf.reduce_mean(obs, axis=1) + batch["reward"] + tf.reduce_mean(next_obs, axis=1)

    if mode == "eager":

        def step() -> None:
            indices, batch = sampler.sample(BATCH)
            td = td_of(batch)
            float(tf.reduce_mean(batch[IMPORTANCE_WEIGHTS] * td))
            sampler.update_priorities(indices, tf.abs(td))

        return time_steps(step, args.steps, args.repeats)

    def update_fn(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        td = td_of(batch)
        value = tf.reduce_mean(batch[IMPORTANCE_WEIGHTS] * td)
        return {"value": value, PRIORITIES: tf.abs(td)}

    learner = rg.Learner(
        table, sampler, update_fn, batch_size=BATCH, jit_compile=mode == "loop+xla"
    )
    learner.train(args.loop_steps)  # trace, compile, warm up
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        learner.train(args.loop_steps)
        times.append((time.perf_counter() - start) / args.loop_steps)
    return statistics.median(times)


def child(args: argparse.Namespace) -> None:
    bench = {"cpprb": bench_cpprb, "torchrl": bench_torchrl, "replaygpu": bench_replaygpu}
    print(json.dumps(bench[args.child](args.capacity, args)))


def run_child(lib: str, capacity: int, args: argparse.Namespace) -> dict[str, float]:
    python = PEER_PYTHONS.get(lib, sys.executable)
    cmd = [python, os.path.abspath(__file__), "--child", lib, "--capacity", str(capacity)]
    cmd += ["--steps", str(args.steps), "--loop-steps", str(args.loop_steps)]
    cmd += ["--repeats", str(args.repeats)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{lib} at {capacity} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacities", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=3, help="subprocesses per library")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per subprocess")
    parser.add_argument("--steps", type=int, default=500, help="steps per timed eager run")
    parser.add_argument("--loop-steps", type=int, default=2000, help="steps per loop call")
    parser.add_argument(
        "--child", choices=("cpprb", "torchrl", "replaygpu"), help=argparse.SUPPRESS
    )
    parser.add_argument("--capacity", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    missing = [p for p in PEERS if not os.path.exists(PEER_PYTHONS[p])]
    if len(missing) == len(PEERS):
        sys.exit(f"no peer venvs at {HERE}: run bash benchmarks/peers/setup.sh first")
    load = "load average {:.2f} {:.2f} {:.2f}".format
    print(
        f"prioritized sample + priority update, batch {BATCH}, obs dim {OBS_DIM}, alpha {ALPHA}, "
        f"beta {BETA}; {args.rounds} round(s) of alternating subprocesses, each the median of "
        f"{args.repeats} runs; microseconds per step; {os.cpu_count()} CPUs, "
        f"{load(*os.getloadavg())}",
        flush=True,
    )
    for lib in missing:
        print(f"  {lib}: no venv at {PEER_PYTHONS[lib]} (bash benchmarks/peers/setup.sh), left out")
    libs = ["replaygpu", *PEERS]
    peers = [p for p in PEERS if p not in missing]
    for capacity in args.capacities:
        rounds: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for lib in libs[r % 3 :] + libs[: r % 3]:  # rotate who goes first
                if lib in PEERS and lib not in peers:
                    continue
                try:
                    result = run_child(lib, capacity, args)
                except RuntimeError as err:
                    if lib not in PEERS:
                        raise
                    peers.remove(lib)  # a peer that cannot run is reported and left out
                    print(f"  {lib}: failed, left out: {str(err).strip().splitlines()[-1]}")
                    continue
                for name, sec in result.items():
                    key = lib if lib in PEERS else f"replaygpu {name}"
                    rounds.setdefault(key, []).append(sec)
        medians = {key: statistics.median(v) for key, v in rounds.items()}
        best_peer = min(peers, key=lambda p: medians[p])
        for key, sec in medians.items():
            spread = " ".join(f"{s * 1e6:.0f}" for s in rounds[key])
            print(
                f"  capacity {capacity:>9,d}  {key:20} {sec * 1e6:8.1f} us/step "
                f"{1 / sec:8.0f} steps/s  (rounds: {spread})",
                flush=True,
            )
        for mode in MODES:
            ratio = medians[best_peer] / medians[f"replaygpu {mode}"]
            target = " (target >= 2x)" if capacity >= 1_000_000 else ""
            print(
                f"  capacity {capacity:>9,d}  replaygpu {mode:8} vs best peer ({best_peer}): "
                f"{ratio:.2f}x faster{target}"
            )
    print(f"done, {load(*os.getloadavg())}")


if __name__ == "__main__":
    main()
