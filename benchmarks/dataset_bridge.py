"""The tf.data bridge against the fused learner: the same DQN update, fed two ways.

Variants, MLP 64x64 double-DQN update (Huber loss, Adam, soft target update; the update of
`learner_throughput.py`), batch 256, obs dim 8, 4 actions, uniform sampling, capacity 1e5:
  (a) ``sampler.as_dataset(256)``: one element and one ``tf.function`` training-step call per
      SGD step (how TF-Agents and Reverb agents train)
  (b) (a) with ``.prefetch(2)`` (sampling overlaps the step; batches are drawn 2 steps early)
  (c) ``rg.Learner.train(k)``: k SGD steps per ``tf.function`` call (default k=100)
  (d) (c) compiled with XLA (``jit_compile=True``)
Each variant is warmed up (traced, compiled) first, then timed in windows taken round-robin
across the variants, so load changes hit all alike. Prints steps/s (median of --repeats) and
each ratio to (a). Run:
    python benchmarks/dataset_bridge.py                       # ~1 min on 2 cores
    python benchmarks/dataset_bridge.py --seconds 1 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from learner_throughput import (
    BATCH,
    SPEC,
    interleaved_rates,
    make_data,
    make_dqn_update,
    uniform_learner,
)

import replaygpu as rg
from replaygpu.device import resolve_device


def runners(capacity: int, hidden: int, k: int) -> dict[str, Callable[[], int]]:
    """Runners of variants (a)-(d) on one table; each runs some steps and returns how many."""
    table = rg.ReplayTable(SPEC, capacity=capacity)
    table.append(make_data(capacity))
    out: dict[str, Callable[[], int]] = {}
    for name, prefetch in (("a as_dataset", 0), ("b as_dataset+prefetch", 2)):
        update = make_dqn_update(hidden)
        step = tf.function(lambda batch, update=update: update(batch))
        dataset = rg.Sampler(table, seed=0).as_dataset(BATCH)
        if prefetch:
            dataset = dataset.prefetch(prefetch)
        iterator = iter(dataset)

        def feed(iterator=iterator, step=step) -> int:
            for _ in range(20):
                _, batch = next(iterator)
                step(batch)
            return 20

        out[name] = feed
    for name, jit in ((f"c Learner k={k}", False), (f"d Learner k={k} XLA", True)):
        learner = uniform_learner(table, hidden, jit)

        def train(learner: rg.Learner = learner) -> int:
            return int(learner.train(k)["steps"])

        out[name] = train
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timing window per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="windows per figure (median)")
    parser.add_argument("--steps-per-call", type=int, default=100, help="k of the Learner")
    parser.add_argument("--capacity", type=int, default=100_000, help="table rows")
    parser.add_argument("--hidden", type=int, default=64, help="width of the two MLP layers")
    args = parser.parse_args()
    print(
        f"# dataset_bridge  {time.strftime('%Y-%m-%d')}  {platform.node()}  "
        f"{os.cpu_count()} CPUs  TF {tf.__version__}  device {resolve_device()}"
    )
    print(
        f"# double DQN MLP {args.hidden}x{args.hidden}, batch {BATCH}, capacity "
        f"{args.capacity:.0e}, uniform; median of {args.repeats} x {args.seconds:.1f} s, "
        "windows interleaved"
    )
    results = interleaved_rates(
        runners(args.capacity, args.hidden, args.steps_per_call), args.seconds, args.repeats
    )
    base = results["a as_dataset"]
    print(f"{'variant':<24} {'steps/s':>9} {'x (a)':>7}")
    for name, value in results.items():
        print(f"{name:<24} {value:>9.0f} {value / base:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
