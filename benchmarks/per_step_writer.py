"""Per-step cost of adding one transition: a numpy ring buffer, `ReplayTable.writer`, and
`ReplayTable.append` of one row, side by side (issue 36, item 1).

The Keras examples (DDPG on Pendulum, DQN on Breakout) record one transition per env step into
numpy arrays (``buffer[k][i] = value``). A table that is given one row per `append` pays a
graph call per step; `table.writer(chunk)` stages the row in numpy columns (checked on the way
in, as `append` checks a batch) and appends a chunk in one call, so its cost per step is the
numpy write plus the check plus 1/chunk of an append.

Rows are Pendulum-shaped (obs [3] float32, action [1] float32, reward, next_obs, terminated,
truncated), as an env loop gives them: numpy arrays for observations and actions, Python floats
and bools for the rest. Each variant adds --steps rows per round; the rounds go round-robin
(--repeats) so machine load hits the variants alike; the median per round is printed in
microseconds per step, with the ratio to the numpy ring buffer.

Run:
    python benchmarks/per_step_writer.py
    python benchmarks/per_step_writer.py --steps 20000 --repeats 7 --chunk 64 256 1024
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import replaygpu as rg

SPEC = {
    "obs": tf.TensorSpec([3], tf.float32),
    "action": tf.TensorSpec([1], tf.float32),
    "reward": tf.TensorSpec([], tf.float32),
    "next_obs": tf.TensorSpec([3], tf.float32),
    "terminated": tf.TensorSpec([], tf.bool),
    "truncated": tf.TensorSpec([], tf.bool),
}


def rows(n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((n + 1, 3)).astype(np.float32)
    actions = rng.uniform(-2, 2, (n, 1)).astype(np.float32)
    return [
        {
            "obs": obs[i],
            "action": actions[i],
            "reward": float(-(obs[i, 0] ** 2)),
            "next_obs": obs[i + 1],
            "terminated": False,
            "truncated": i % 200 == 199,
        }
        for i in range(n)
    ]


def numpy_ring(capacity: int) -> Callable[[dict], None]:
    """The Keras DDPG example's buffer: one preallocated array per field, a write per field."""
    arrays = {k: np.zeros((capacity, *s.shape), s.dtype.as_numpy_dtype) for k, s in SPEC.items()}
    cursor = [0]

    def add(row: dict) -> None:
        i = cursor[0] % capacity
        for k, array in arrays.items():
            array[i] = row[k]
        cursor[0] += 1

    return add


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="rows added per round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds per variant")
    parser.add_argument("--chunk", type=int, nargs="+", default=[256], help="writer chunks")
    parser.add_argument("--append-steps", type=int, default=1000, help="rows for append(1 row)")
    args = parser.parse_args()
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, "
        f"tensorflow {tf.__version__}, numpy {np.__version__}, load {os.getloadavg()[0]:.2f}"
    )
    data = rows(args.steps)
    capacity = 100_000
    table = rg.ReplayTable(SPEC, capacity, device="/CPU:0")
    variants: dict[str, tuple[Callable[[dict], None], Callable[[], None], int]] = {
        "numpy ring buffer": (numpy_ring(capacity), lambda: None, args.steps),
    }
    for chunk in args.chunk:
        writer = table.writer(chunk=chunk)
        variants[f"table.writer(chunk={chunk}).add"] = (writer.add, writer.flush, args.steps)

    def append_one(row: dict) -> None:
        table.append({k: np.asarray(v, SPEC[k].dtype.as_numpy_dtype)[None] for k, v in row.items()})

    variants["table.append(one row)"] = (append_one, lambda: None, args.append_steps)
    for add, flush, _ in variants.values():  # warm: traces, first allocations
        for row in data[:300]:
            add(row)
        flush()
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (add, flush, n) in variants.items():
            start = time.perf_counter()
            for row in data[:n]:
                add(row)
            flush()
            seconds[name].append((time.perf_counter() - start) / n)
    base = statistics.median(seconds["numpy ring buffer"])
    print(f"{'variant':36s} {'us/step (median)':>17s} {'min':>8s} {'x numpy':>8s}")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"{name:36s} {median * 1e6:17.2f} {min(values) * 1e6:8.2f} {median / base:8.2f}")


if __name__ == "__main__":
    main()
