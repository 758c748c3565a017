"""Storage dtypes: float32 vs float16 vs bfloat16 storage of observations, side by side.

Sections:

  sampling  uniform sampling inside a tf.function (a tf.while_loop of --steps draws of batch 256
            per call, every field of the batch reduced into a checksum so nothing is pruned),
            with and without XLA; and the gather of the ``obs`` field alone (fixed random rows,
            no RNG) in the same kind of loop. Tables of --capacity rows whose ``obs`` and
            ``next_obs`` (vector observations of --obs-dims sizes) are stored as float32,
            float16 or bfloat16; reads convert back to float32. Variants are timed round-robin,
            --repeats rounds, median per variant, so load changes hit all of them alike.
  dqn       DQN on CartPole-v1 (rl-zoo3 hyperparameters, `replaygpu demo cartpole`) with
            ``storage_dtype`` float32 / float16 / bfloat16 for each of --seeds, --dqn-steps env
            steps, with XLA (the demo's default) or without (--no-xla); greedy evaluation over
            20 episodes.

Run:
    python benchmarks/storage_dtypes.py                         # both sections
    python benchmarks/storage_dtypes.py --section sampling --quick
    python benchmarks/storage_dtypes.py --section dqn --seeds 0 1 --dqn-steps 50000
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
from common import dqn_spec, filled_table, sample_loop

import replaygpu as rg

tf.get_logger().setLevel("ERROR")  # each variant's first call traces: not a retracing problem
BATCH = 256
DTYPES = ("float32", "float16", "bfloat16")


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def stored_as(dim: int, capacity: int, dtype: str) -> rg.ReplayTable:
    """A random table whose ``obs`` and ``next_obs`` are stored as ``dtype``."""
    storage = None if dtype == "float32" else {"obs": dtype, "next_obs": dtype}
    return filled_table(capacity, dim, storage_dtypes=storage)


def uniform_loop(table: rg.ReplayTable, xla: bool) -> Callable[[tf.Tensor], tf.Tensor]:
    return sample_loop(rg.Sampler(table, seed=0), BATCH, xla)


def gather_loop(table: rg.ReplayTable) -> Callable[[tf.Tensor], tf.Tensor]:
    rng = np.random.default_rng(1)
    rows = tf.constant(rng.integers(0, table.capacity, (64, BATCH)), tf.int64)

    @tf.function
    def loop(n: tf.Tensor) -> tf.Tensor:
        def body(i: tf.Tensor, acc: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            obs = table.read("obs", rows[i % 64])  # [B, dim] float32, converted on read
            return i + 1, acc + tf.reduce_sum(obs)

        return tf.while_loop(lambda i, _: i < n, body, (tf.constant(0, tf.int64), 0.0))[1]

    return loop


def bench_sampling(args: argparse.Namespace) -> None:
    steps = tf.constant(args.steps, tf.int64)
    for dim in args.obs_dims:
        tables = {d: stored_as(dim, args.capacity, d) for d in DTYPES}
        variants: dict[tuple[str, str], Callable[[tf.Tensor], tf.Tensor]] = {}
        for d, table in tables.items():
            variants[("sample", d)] = uniform_loop(table, xla=False)
            variants[("sample+XLA", d)] = uniform_loop(table, xla=True)
            variants[("gather obs", d)] = gather_loop(table)
        for loop in variants.values():
            loop(steps)  # trace, compile, warm up
        times: dict[tuple[str, str], list[float]] = {k: [] for k in variants}
        for _ in range(args.repeats):
            for key, loop in variants.items():
                start = time.perf_counter()
                float(loop(steps))
                times[key].append(time.perf_counter() - start)
        print(
            f"\nobs dim {dim}, capacity {args.capacity:.0e}, batch {BATCH}, {args.steps} draws "
            f"per call, median of {args.repeats}; {load()}"
        )
        print(f"{'loop':<12}{'storage':<10}{'table MiB':>10}{'transitions/s':>15}{'x f32':>7}")
        for kind in ("sample", "sample+XLA", "gather obs"):
            base = statistics.median(times[(kind, "float32")])
            for d in DTYPES:
                med = statistics.median(times[(kind, d)])
                print(
                    f"{kind:<12}{d:<10}{tables[d].nbytes / 2**20:>10.1f}"
                    f"{args.steps * BATCH / med:>15.3e}{base / med:>7.2f}"
                )
        del tables, variants


def bench_dqn(args: argparse.Namespace) -> None:
    from replaygpu.agents.dqn import agent as dqn

    print(
        f"\nDQN CartPole-v1, rl-zoo3 hyperparameters, {args.dqn_steps} env steps, "
        f"{'no XLA' if args.no_xla else 'XLA'}; {load()}"
    )
    results: dict[str, list[float]] = {d: [] for d in DTYPES}
    for seed in args.seeds:
        for d in DTYPES:
            config = dqn.DQNConfig(
                seed=seed,
                steps=args.dqn_steps,
                eval_episodes=20,
                storage_dtype=d,
                jit_compile=not args.no_xla,
            )
            start = time.perf_counter()
            result = dqn.train(config)
            wall = time.perf_counter() - start
            returns = result.eval_returns
            results[d].append(float(returns.mean()))
            print(
                f"dqn storage {d:<8} seed {seed}: greedy eval mean {returns.mean():.1f} "
                f"(min {returns.min():.0f}) | train loop {result.train_seconds:.1f} s, wall "
                f"{wall:.1f} s | {result.sgd_steps_per_s:.0f} SGD steps/s | {load()}",
                flush=True,
            )
    for d in DTYPES:
        means = results[d]
        print(
            f"dqn storage {d:<8} summary: eval means {[round(m, 1) for m in means]}, "
            f"median {statistics.median(means):.1f}, >= 475 in "
            f"{sum(m >= 475 for m in means)}/{len(means)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=["all", "sampling", "dqn"], default="all")
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--obs-dims", type=int, nargs="*", default=[8, 64])
    parser.add_argument("--steps", type=int, default=1000, help="draws per timed call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--dqn-steps", type=int, default=50_000)
    parser.add_argument("--no-xla", action="store_true", help="DQN's SGD loop without XLA")
    parser.add_argument("--quick", action="store_true", help="capacity 1e5, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.capacity, args.repeats, args.steps = 100_000, 3, 300
    print(
        f"python {platform.python_version()}, tensorflow {tf.__version__}, "
        f"{os.cpu_count()} CPUs, device {rg.ReplayTable(dqn_spec(1), 1).device}; {load()}"
    )
    if args.section in ("all", "sampling"):
        bench_sampling(args)
    if args.section in ("all", "dqn"):
        bench_dqn(args)


if __name__ == "__main__":
    main()
