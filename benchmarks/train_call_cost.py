"""What one `rg.Learner.train` call costs beyond its SGD steps, side by side in one process.

Two updates, both compiled with XLA: the DQN 64x64 update of `learner_throughput`
(``make_dqn_update(64)``, `common.dqn_spec` rows, batch 256) and the DDPG recipe's update
(docs/recipes.md: Keras actor and critic, their target networks, two Adam optimizers built
first; random Pendulum rows, batch 64). Each runs, on a table of 100,000 rows, as

  bare        a ``tf.function`` (XLA) that draws one minibatch in the graph
              (``sampler.sample(B)``) and runs the update once, its metrics read back as floats:
              the least one in-graph SGD step costs
  train(k)    ``learner.train(k)`` (``chunk_steps=k``): k steps in one call
  numpy feed  a numpy ring buffer (numpy indices and gather on the host) feeding the update, one
              ``tf.function`` (XLA) call per step, the metrics read back every 10 steps

``train(1)`` against ``bare`` is the fixed cost of a train call (the target: within 1.1x);
``train(k)`` per step against ``numpy feed`` is what fusing k steps gains. ``--xla`` measures
instead what XLA gains inside ``train(100)``, by layer width and batch: DQN 64x64 and 256x256
at batch 256, DDPG at batch 64 and 256, ``jit_compile`` on against off (the README's XLA advice).
``--breakdown`` times, on the DQN case, each piece a ``train(1)`` call paid before ab7db8c and
what replaced it, one piece at a time (microseconds per call).

All runners share the table and the networks; the timing windows go round-robin
(`learner_throughput.interleaved_rates`), so a shared machine's load hits every figure alike;
each figure is the median of ``--repeats`` windows. Run::

    python benchmarks/train_call_cost.py           # 9 windows of 1 s per figure (~2 min)
    python benchmarks/train_call_cost.py --quick   # 5 windows of 0.3 s
    python benchmarks/train_call_cost.py --xla     # XLA on / off in train(100), 4 shapes
    python benchmarks/train_call_cost.py --breakdown  # where a call's fixed cost went
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from keras_ddpg_loop import recipe_ddpg
from learner_throughput import BATCH, SPEC, interleaved_rates, make_data, make_dqn_update
from per_step_writer import SPEC as DDPG_SPEC

import replaygpu as rg
from replaygpu.device import resolve_device
from replaygpu.samplers.sampler import check_not_empty

CAPACITY = 100_000
#: SGD steps per call of the numpy feed's runner (its metrics are read back once per call)
FEED_STEPS = 10
#: the most a train(1) call may cost, in bare tf.function calls
TARGET = 1.1
DDPG_BATCH = 64

Update = Callable[[dict], dict]


def dqn_case() -> tuple[dict, dict[str, np.ndarray], Update, int]:
    """The DQN 64x64 case: ``(spec, rows, update, batch size)``."""
    return SPEC, make_data(CAPACITY), make_dqn_update(64), BATCH


def ddpg_case() -> tuple[dict, dict[str, np.ndarray], Update, int]:
    """The DDPG recipe's case: ``(spec, rows, update, batch size)``; rows of Pendulum's ranges."""
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1.0, 1.0, (CAPACITY, 3)).astype(np.float32)
    rows = {
        "obs": obs,
        "action": rng.uniform(-2.0, 2.0, (CAPACITY, 1)).astype(np.float32),
        "reward": rng.uniform(-16.0, 0.0, CAPACITY).astype(np.float32),
        "next_obs": np.roll(obs, -1, axis=0),
        "terminated": np.zeros(CAPACITY, bool),
        "truncated": rng.random(CAPACITY) < 0.005,
    }
    return DDPG_SPEC, rows, recipe_ddpg(0)[1], DDPG_BATCH


def runners(
    spec: dict, rows: dict[str, np.ndarray], update: Update, batch: int, ks: tuple[int, ...]
) -> dict[str, Callable[[], int]]:
    """``{name: run}``, each ``run()`` doing some work and returning its units (calls for
    ``bare``, SGD steps for the others): the variants of the module doc on one table."""
    table = rg.ReplayTable(spec, CAPACITY)
    table.append(rows)
    sampler = rg.Sampler(table, seed=0)

    @tf.function(jit_compile=True)
    def bare() -> dict:
        return update(sampler.sample(batch)[1])

    def bare_call() -> int:
        {k: float(v) for k, v in bare().items()}
        return 1

    fed = tf.function(update, jit_compile=True)
    rng = np.random.default_rng(0)

    def numpy_feed() -> int:
        for _ in range(FEED_STEPS):
            metrics = fed({k: v[rng.integers(0, CAPACITY, batch)] for k, v in rows.items()})
        {k: float(v) for k, v in metrics.items()}
        return FEED_STEPS

    out: dict[str, Callable[[], int]] = {"bare": bare_call, "numpy feed": numpy_feed}
    for k in ks:
        learner = rg.Learner(
            table,
            rg.Sampler(table, seed=0),
            update,
            batch_size=batch,
            jit_compile=True,
            chunk_steps=k,
        )
        out[f"train({k})"] = lambda k=k, learner=learner: learner.train(k) and k
    return out


def xla_choice(seconds: float, repeats: int) -> None:
    """Per-step microseconds of ``train(100)`` with XLA and without, for four shapes."""
    print(f"{'model':<10} {'batch':>5} {'XLA us/step':>12} {'plain us/step':>14} {'XLA gain':>9}")
    dqn_rows = make_data(CAPACITY)
    _, ddpg_rows, _, _ = ddpg_case()
    shapes = [
        ("dqn 64x64", SPEC, dqn_rows, lambda: make_dqn_update(64), BATCH),
        ("dqn 256", SPEC, dqn_rows, lambda: make_dqn_update(256), BATCH),
        ("ddpg", DDPG_SPEC, ddpg_rows, lambda: recipe_ddpg(0)[1], DDPG_BATCH),
        ("ddpg", DDPG_SPEC, ddpg_rows, lambda: recipe_ddpg(0)[1], 256),
    ]
    for model, spec, rows, make_update, batch in shapes:
        table = rg.ReplayTable(spec, CAPACITY)
        table.append(rows)
        variants = {}
        for jit in (True, False):
            learner = rg.Learner(
                table,
                rg.Sampler(table, seed=0),
                make_update(),
                batch_size=batch,
                jit_compile=jit,
                chunk_steps=100,
            )
            variants[str(jit)] = lambda learner=learner: learner.train(100) and 100
        rates = interleaved_rates(variants, seconds, repeats)
        xla, plain = 1e6 / rates["True"], 1e6 / rates["False"]
        print(f"{model:<10} {batch:>5} {xla:12.1f} {plain:14.1f} {plain / xla:8.2f}x", flush=True)


def breakdown(seconds: float, repeats: int) -> None:
    """Microseconds per call of each piece of a DQN ``train(1)`` call, old way and new."""
    table = rg.ReplayTable(SPEC, CAPACITY)
    table.append(make_data(CAPACITY))
    learner = rg.Learner(
        table, rg.Sampler(table, seed=0), make_dqn_update(64), batch_size=BATCH, jit_compile=True
    )
    learner.train(1)  # traced
    fn, concrete = learner.train_function, learner.train_function.get_concrete_function()
    one = tf.constant(1, tf.int64)
    names = ["steps", *learner.metric_names]
    values = concrete(one)

    def in_scope(function: Any, steps: tf.Tensor) -> Any:
        with tf.device(table.device):
            return function(steps)

    def times(piece: Callable[[], Any]) -> Callable[[], int]:
        def run() -> int:
            for _ in range(20):
                piece()
            return 20

        return run

    pieces = {
        "whole call: train(1)": lambda: learner.train(1),
        "loop via tf.function, fresh tensor (before)": lambda: fn(tf.constant(1, tf.int64)),
        "loop via concrete function, cached (after)": lambda: concrete(one),
        "the same in the table's device scope (after)": lambda: in_scope(concrete, one),
        "trace count read (both)": lambda: learner.trace_count,
        "emptiness: eager read of shard sizes (before)": lambda: check_not_empty(table),
        "writer flush, no writers (both)": table.flush_writers,
        "readback: float() of each element (before)": lambda: {
            k: float(v) for k, v in zip([*names, "filled"], values.numpy(), strict=True)
        },
        "readback: .tolist() (after)": lambda: dict(
            zip([*names, "filled"], values.numpy().tolist(), strict=True)
        ),
    }
    rates = interleaved_rates({k: times(v) for k, v in pieces.items()}, seconds, repeats)
    print(f"{'piece of a DQN 64x64 train(1) call':<48} {'us/call':>8}")
    for name, rate in rates.items():
        print(f"{name:<48} {1e6 / rate:8.1f}", flush=True)


def report(model: str, rates: dict[str, float], ks: tuple[int, ...]) -> list[str]:
    """The printed lines of one model: microseconds per unit and the ratios."""
    us = {name: 1e6 / rate for name, rate in rates.items()}
    fixed = us["train(1)"] / us["bare"]
    lines = [
        f"{model:<10} {'bare tf.function, per call':<30} {us['bare']:9.1f}",
        f"{model:<10} {'train(1), per call':<30} {us['train(1)']:9.1f} {fixed:6.3f}x bare  "
        f"(target <= {TARGET}x: {'holds' if fixed <= TARGET else 'MISSED'})",
        f"{model:<10} {'numpy feed, per step':<30} {us['numpy feed']:9.1f}",
    ]
    for k in ks:
        name = f"train({k})"
        lines.append(
            f"{model:<10} {name + ', per step':<30} {us[name]:9.1f} "
            f"{us[name] / us['numpy feed']:6.3f}x numpy feed"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 windows of 0.3 s per figure")
    parser.add_argument("--seconds", type=float, default=1.0, help="timing window")
    parser.add_argument("--repeats", type=int, default=9, help="windows per figure (median)")
    parser.add_argument("--xla", action="store_true", help="XLA on / off in train(100)")
    parser.add_argument("--breakdown", action="store_true", help="where a call's cost goes")
    args = parser.parse_args()
    seconds, repeats = (0.3, 5) if args.quick else (args.seconds, args.repeats)
    ks = (1, 10, 100)
    print(
        f"# train_call_cost  {time.strftime('%Y-%m-%d')}  {platform.node()}  "
        f"{os.cpu_count()} CPUs  TF {tf.__version__}  device {resolve_device()}"
    )
    print(
        f"# XLA; table of {CAPACITY} rows; median of {repeats} x {seconds:.1f} s windows, "
        "interleaved; cost ratios (lower is cheaper)"
    )
    if args.xla or args.breakdown:
        (xla_choice if args.xla else breakdown)(seconds, repeats)
        return
    print(f"{'model':<10} {'figure':<30} {'us':>9} ratio")
    cases: dict[str, Callable[[], Any]] = {"dqn 64x64": dqn_case, "ddpg": ddpg_case}
    for model, make in cases.items():
        variants = runners(*make(), ks)
        rates = interleaved_rates(variants, seconds, repeats)
        print("\n".join(report(model, rates, ks)), flush=True)
        del variants


if __name__ == "__main__":
    main()
