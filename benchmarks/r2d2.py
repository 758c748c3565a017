"""Recurrent replay (issue 25): prioritized sequence sampling with a stored LSTM state, and the
R2D2 learner's SGD steps/s in the fused loop.

The table is R2D2's (`replaygpu.agents.r2d2.agent.table_spec`): masked-CartPole steps (obs [2]
float32, action, reward, terminated, truncated) with the LSTM state before each step
(``recurrent_state``, ``concat([h, c])``, [2 x --hidden] float32) and ``state_stored``. It
holds --sequences + T - 1 rows of one episode, so exactly --sequences windows of T rows are
valid starts; priorities are exponential(1).

Sections:

  sample   ``rg.Sampler(table, rg.Prioritized(0.6, 0.4), rg.Sequence(T, burn_in,
           state_field="recurrent_state"))``: each call draws --draws batches of --batch
           windows in one `tf.while_loop` and reduces every field into a checksum (nothing is
           pruned); samples/s (windows) and batches/s, medians of --repeats calls. Rows: T=80
           without burn-in (with and without XLA), with R2D2's burn-in 40, and with burn-in 40
           and a state stored every 40 rows (``state_start_field``: the other starts are
           redrawn and get priority 0, as served actors with ``period`` 40 mark them).
  learner  the R2D2 agent (`replaygpu.agents.r2d2.agent`: LSTM Q-network, burn-in, 5-step double Q
           with value rescaling, eta-mixed priorities written back, target sync in the graph)
           trained by `rg.Learner` on that table: ``train(--sgd-steps)`` calls, SGD steps/s the
           median of --repeats calls, at two shapes: the demo's (batch 32, burn-in 10 + T 20,
           LSTM 64, torso 64, a state every 10 rows; XLA) and R2D2's paper shape at CartPole
           width (batch 64, burn-in 40 + T 80, LSTM 64, a state every 40 rows), with XLA (the
           LSTM unrolled in a loop over time) and without (a static unroll); "first call" is
           the first ``train(1)``, compilation included.

benchmarks/peers/r2d2_acme.py measures Acme's R2D2 on Reverb at the same shapes. Run:

    python benchmarks/r2d2.py                 # both sections, ~5 min on 2 cores
    python benchmarks/r2d2.py --section sample --quick
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gymnasium as gym
import numpy as np
import tensorflow as tf
from common import CHUNK

import replaygpu as rg
from replaygpu.agents.r2d2 import agent as r2d2

OBS_DIM, NUM_ACTIONS = 2, 2  # masked CartPole: position and angle; left, right
#: (name, batch, burn-in, T, LSTM units, state period, XLA) of the learner section; with XLA the
#: LSTM unrolls in counted loops over time (`r2d2.network`), without it statically
#: (`LSTMQNetwork`'s ``loop``)
LEARNER_SHAPES = (
    ("demo", 32, 10, 20, 64, 10, True),
    ("R2D2 paper", 64, 40, 80, 64, 40, True),
    ("R2D2 paper", 64, 40, 80, 64, 40, False),
)


def filled_table(config: r2d2.R2D2Config, rows: int, seed: int = 0) -> rg.ReplayTable:
    """A full table of ``rows`` random rows of R2D2's spec for ``config``, one episode, the
    state stored every ``config.period`` rows."""
    env = gym.make(config.env_id)
    table = rg.ReplayTable(r2d2.table_spec(config, env), rows)
    env.close()
    rng = np.random.default_rng(seed)
    width = 2 * config.lstm_units
    for start in range(0, rows, CHUNK):
        n = min(CHUNK, rows - start)
        table.append(
            {
                "obs": rng.normal(size=(n, OBS_DIM)).astype(np.float32),
                "action": rng.integers(0, NUM_ACTIONS, n),
                "reward": np.ones(n, np.float32),
                "terminated": np.zeros(n, bool),
                "truncated": np.zeros(n, bool),
                r2d2.STATE: rng.normal(size=(n, width)).astype(np.float32),
                r2d2.STATE_STORED: (np.arange(start, start + n) % config.period) == 0,
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
        f"LSTM state [2 x {args.hidden}] float32 stored per row, {args.draws} draws per call, "
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
        config = r2d2.R2D2Config(
            sequence_length=burn_in + T, burn_in=burn_in, period=period, lstm_units=args.hidden
        )
        table = filled_table(config, rows)
        view = rg.Sequence(
            T,
            burn_in,
            state_field=r2d2.STATE,
            state_start_field=r2d2.STATE_STORED if period > 1 else None,
        )
        sampler = rg.Sampler(table, rg.Prioritized(0.6, 0.4), view, seed=1)
        write_exponential_priorities(sampler, rows, burn_in, period)
        loop = sample_loop(sampler, args.batch, xla)
        n = tf.constant(args.draws, tf.int64)
        # warm-up: new rows hold the max priority until drawn; with a state every 40 rows the
        # 39 of 40 starts that hold none are refused and zeroed in their first draws
        seconds = median_seconds(lambda loop=loop, n=n: loop(n).numpy(), args.repeats, 10)
        batches = args.draws / seconds
        print(
            f"  {name:42s} {batches * args.batch:>11,.0f} samples/s  {batches:>8,.0f} "
            f"batches/s  ({seconds / args.draws * 1e3:.3f} ms/batch, "
            f"invalid draws {int(sampler.invalid_draws.numpy())})",
            flush=True,
        )
        del sampler, table, loop


def bench_learner(args: argparse.Namespace) -> None:
    print(
        f"R2D2 learner: SGD steps in the fused loop (rg.Learner), {args.sgd_steps} steps "
        f"per call, median of {args.repeats} calls; the table as above ({args.sequences} "
        "windows), 5-step double Q, h(x) rescaling, eta 0.9 priorities written back"
    )
    for name, batch, burn_in, T, units, period, xla in LEARNER_SHAPES:
        config = r2d2.R2D2Config(
            sequence_length=burn_in + T,
            burn_in=burn_in,
            period=period,
            lstm_units=units,
            torso_size=units,
            batch_size=batch,
            jit_compile=xla,
        )
        rows = args.sequences + config.sequence_length - 1
        table = filled_table(config, rows)
        env = gym.make(config.env_id)
        agent = r2d2.make_agent(config, env)
        env.close()
        sampler = r2d2.make_sampler(config, table, agent)
        learner = rg.Learner(
            table,
            sampler,
            agent.update,
            batch_size=batch,
            jit_compile=xla,
            autograph=False,
            chunk_steps=args.sgd_steps,
        )
        start = time.perf_counter()
        learner.train(1)
        compile_s = time.perf_counter() - start
        train = functools.partial(learner.train, args.sgd_steps)
        seconds = median_seconds(train, args.repeats, 2)
        rate = args.sgd_steps / seconds
        print(
            f"  {name:10s} batch {batch:3d}, burn-in {burn_in:2d} + T {T:2d}, LSTM {units}, "
            f"torso {units}, state every {period:2d} rows, {'XLA' if xla else 'no XLA'}: "
            f"{rate:7.1f} SGD steps/s "
            f"({rate * batch:,.0f} sequences/s; first call {compile_s:.0f} s)",
            flush=True,
        )
        del learner, sampler, agent, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--section", choices=("all", "sample", "learner"), default="all")
    parser.add_argument("--sequences", type=int, default=100_000)
    parser.add_argument("--length", type=int, default=80, help="T")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64, help="LSTM width")
    parser.add_argument("--draws", type=int, default=100, help="batches per sampling call")
    parser.add_argument("--sgd-steps", type=int, default=50, help="SGD steps per learner call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1e4 sequences, 3 repeats")
    args = parser.parse_args()
    if args.quick:
        args.sequences, args.repeats, args.draws, args.sgd_steps = 10_000, 3, 20, 10
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"tensorflow {tf.__version__}, replaygpu {rg.__version__}, {os.cpu_count()} CPUs, "
        f"load average {load}"
    )
    if args.section in ("all", "sample"):
        bench_sample(args)
    if args.section in ("all", "learner"):
        bench_learner(args)


if __name__ == "__main__":
    main()
