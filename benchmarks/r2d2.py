"""Recurrent replay (issue 25): prioritized sequence sampling with a stored LSTM state, and the
R2D2 learner's SGD steps/s in the fused loop.

Sections:

  sample   ``rg.Sampler(table, rg.Prioritized(0.6, 0.4), rg.Sequence(T, burn_in,
           state_field="state"))`` over a table of --sequences + T rows of masked-CartPole
           transitions (obs [2] float32, the gymnasium transition fields) with the LSTM state
           ``state/h``, ``state/c`` ([--hidden] float32 each) and a bool ``state_start``: one
           episode, so exactly --sequences windows of T rows are valid starts; priorities are
           exponential(1). Each call draws --draws batches of --batch windows in one
           `tf.while_loop` and reduces every field into a checksum (nothing is pruned); the
           figures are samples/s (windows) and batches/s, medians of --repeats calls. Rows: T=80
           without burn-in (with and without XLA), with R2D2's burn-in 40, and with burn-in 40
           and a state stored every 40 rows (``state_start_field``: the other starts are
           redrawn and get priority 0, as an actor with ``period`` 40 makes them).
  learner  the R2D2 agent (`replaygpu.agents.r2d2`) trained by `rg.Learner` on that table's
           shape: ``train(--steps-per-call)`` calls (sample + burn-in + unroll + n-step double
           Q + priority write in one `tf.while_loop`, under XLA when the agent allows it), its
           SGD steps/s the median of --repeats calls; batch, T, burn-in and hidden sizes are
           printed with it.

benchmarks/peers/r2d2_acme.py measures Acme's R2D2 on Reverb at the same shapes. Run:

    python benchmarks/r2d2.py                 # both sections, ~3 min on 2 cores
    python benchmarks/r2d2.py --section sample --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from common import CHUNK

import replaygpu as rg

OBS_DIM, NUM_ACTIONS = 2, 2  # masked CartPole: position and angle; left, right


def r2d2_spec(hidden: int) -> dict[str, object]:
    """A masked-CartPole transition with the LSTM state before the step and its mark."""
    return {
        "obs": tf.TensorSpec([OBS_DIM], tf.float32),
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
        "next_obs": tf.TensorSpec([OBS_DIM], tf.float32),
        "terminated": tf.TensorSpec([], tf.bool),
        "truncated": tf.TensorSpec([], tf.bool),
        "state": {
            "h": tf.TensorSpec([hidden], tf.float32),
            "c": tf.TensorSpec([hidden], tf.float32),
        },
        "state_start": tf.TensorSpec([], tf.bool),
    }


def filled_table(rows: int, hidden: int, period: int, seed: int = 0) -> rg.ReplayTable:
    """A full table of ``rows`` random rows of `r2d2_spec`, one episode; ``state_start`` set on
    every ``period``-th row."""
    table = rg.ReplayTable(r2d2_spec(hidden), rows)
    rng = np.random.default_rng(seed)
    for start in range(0, rows, CHUNK):
        n = min(CHUNK, rows - start)
        table.append(
            {
                "obs": rng.normal(size=(n, OBS_DIM)).astype(np.float32),
                "action": rng.integers(0, NUM_ACTIONS, n),
                "reward": np.ones(n, np.float32),
                "next_obs": rng.normal(size=(n, OBS_DIM)).astype(np.float32),
                "terminated": np.zeros(n, bool),
                "truncated": np.zeros(n, bool),
                "state": {
                    "h": rng.normal(size=(n, hidden)).astype(np.float32),
                    "c": rng.normal(size=(n, hidden)).astype(np.float32),
                },
                "state_start": (np.arange(start, start + n) % period) == 0,
            }
        )
    return table


def write_exponential_priorities(sampler: rg.Sampler, rows: int, burn_in: int, period: int) -> None:
    """Exponential(1) priorities on the starts the sampler can draw: those whose first real row
    (``start - burn_in``, or the episode's row 0) holds a stored state."""
    rng = np.random.default_rng(0)
    for start in range(0, rows, CHUNK):
        index = np.arange(start, min(start + CHUNK, rows))
        index = index[np.maximum(index - burn_in, 0) % period == 0]
        sampler.update_priorities(
            tf.constant(index, tf.int64), tf.constant(rng.exponential(size=len(index)))
        )


def checksum(batch: dict[str, tf.Tensor]) -> tf.Tensor:
    """Every field of ``batch`` reduced into one float32."""
    return tf.add_n([tf.reduce_sum(tf.cast(v, tf.float32)) for v in tf.nest.flatten(batch)])


def sample_loop(sampler: rg.Sampler, batch: int, xla: bool) -> Callable[[tf.Tensor], tf.Tensor]:
    @tf.function(jit_compile=xla)
    def loop(n: tf.Tensor) -> tf.Tensor:
        def body(i: tf.Tensor, acc: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            _, windows = sampler.sample(batch)
            return i + 1, acc + checksum(windows)

        return tf.while_loop(lambda i, _: i < n, body, (tf.constant(0, tf.int64), 0.0))[1]

    return loop


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``call()`` over ``repeats`` calls after ``warmup`` untimed ones (the
    first traces and compiles)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_sample(args: argparse.Namespace) -> None:
    T = args.length
    rows = args.sequences + T - 1
    print(
        f"sequence sampling: {args.sequences} windows of T={T} ({rows} rows, one episode), "
        f"prioritized (alpha 0.6, beta 0.4, exponential(1) priorities), batch {args.batch}, "
        f"LSTM state h, c [{args.hidden}] float32 stored per row, {args.draws} draws per call, "
        f"median of {args.repeats} calls"
    )
    variants = [
        ("T=80", 0, 1, True),
        ("T=80, no XLA", 0, 1, False),
        ("T=80 + burn-in 40", 40, 1, True),
        ("T=80 + burn-in 40, state every 40 rows", 40, 40, True),
    ]
    for name, burn_in, period, xla in variants:
        name = name.replace("80", str(T))
        table = filled_table(rows, args.hidden, period)
        view = rg.Sequence(
            T,
            burn_in,
            state_field="state",
            state_start_field="state_start" if period > 1 else None,
        )
        sampler = rg.Sampler(table, rg.Prioritized(0.6, 0.4), view, seed=1)
        write_exponential_priorities(sampler, rows, burn_in, period)
        loop = sample_loop(sampler, args.batch, xla)
        n = tf.constant(args.draws, tf.int64)
        # warm-up: new rows hold the max priority until drawn; with a state every 40 rows the
        # 39 of 40 starts that hold none are refused and zeroed in their first draws
        seconds = median_seconds(lambda loop=loop, n=n: loop(n).numpy(), args.repeats, 10)
        batches = args.draws / seconds
        invalid = int(sampler.invalid_draws.numpy()) if hasattr(sampler, "invalid_draws") else 0
        print(
            f"  {name:42s} {batches * args.batch:>11,.0f} samples/s  {batches:>8,.0f} "
            f"batches/s  ({seconds / args.draws * 1e3:.3f} ms/batch, invalid draws {invalid})",
            flush=True,
        )
        del sampler, table, loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--section", choices=("all", "sample", "learner"), default="all")
    parser.add_argument("--sequences", type=int, default=100_000)
    parser.add_argument("--length", type=int, default=80, help="T")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64, help="LSTM width")
    parser.add_argument("--draws", type=int, default=100, help="batches per sampling call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1e4 sequences, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.sequences, args.repeats, args.draws = 10_000, 3, 20
    print(f"tensorflow {tf.__version__}, replaygpu {rg.__version__}, {os.cpu_count()} CPUs")
    if args.section in ("all", "sample"):
        bench_sample(args)


if __name__ == "__main__":
    main()
