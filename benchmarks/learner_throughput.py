"""Learner throughput: how a DQN update is fed, measured side by side in one process.

Variants, for MLP 64x64 and 256x256 Q-networks, batch 256, obs dim 8, 4 actions:
  (a) numpy host feed: numpy indices and gather, one tf.function call per step
  (b) tf.data: from_tensor_slices -> shuffle -> batch -> prefetch, one call per step
  (c) in-graph sampling, 1 step per call      (rg.Learner.train(1))
  (d) in-graph sampling, 100 steps per call   (rg.Learner.train(100))
  (e) (d) compiled with XLA                   (jit_compile=True)
and in-graph sample-only throughput (uniform indices + gather of every field, inside a
tf.while_loop) at capacity 1e4, 1e5, 1e6, with and without XLA.

Prints steps/s (median of --repeats) and each ratio to (a). Run:
    python benchmarks/learner_throughput.py            # full table (~10 min on 2 cores)
    python benchmarks/learner_throughput.py --quick    # one size, shorter windows
    python benchmarks/learner_throughput.py --sharded  # data-parallel learner, 1 vs N devices

The sharded section (alone, as it must split the CPU before TensorFlow starts) compares the
single-device learner with `rg.ShardedReplayTable` learners over ``MirroredStrategy`` of 1 and N
replicas: N GPUs where the machine has them, else N logical CPU devices carved out of the one
CPU, where it measures the strategy's overhead (both replicas share the same cores), not a
speed-up. Each replica samples batch / N rows of its own shard; the gradients are all-reduced.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from common import dqn_spec, sample_loop

import replaygpu as rg
from replaygpu.device import resolve_device
from replaygpu.sharded import mirrored_strategy

OBS_DIM, NUM_ACTIONS, BATCH = 8, 4, 256
SPEC = dqn_spec(OBS_DIM)


class MLP(tf.Module):
    """A ReLU MLP of plain variables: [B, in] -> [B, out]."""

    def __init__(self, sizes: list[int], seed: int) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.layers = []
        for fan_in, fan_out in itertools.pairwise(sizes):
            w = rng.normal(0, np.sqrt(2 / fan_in), (fan_in, fan_out)).astype(np.float32)
            self.layers.append((tf.Variable(w), tf.Variable(tf.zeros([fan_out]))))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                x = tf.nn.relu(x)
        return x


def make_dqn_update(
    hidden: int, seed: int = 0, strategy: tf.distribute.Strategy | None = None
) -> Callable[[dict], dict]:
    """A double-DQN update (Huber loss, Adam, soft target update) on a fresh network.

    With a ``strategy`` the networks and optimizer are made in its scope, and the loss is
    divided by the number of replicas: Keras optimizers *sum* the replicas' gradients, so this is
    the usual `tf.distribute` scaling that makes the step the one of the whole batch's mean loss.
    """
    sizes = [OBS_DIM, hidden, hidden, NUM_ACTIONS]
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        q, target = MLP(sizes, seed), MLP(sizes, seed)
        opt = tf.keras.optimizers.Adam(1e-3)
        opt.build(q.trainable_variables)  # slots now: under a strategy they cannot be lazy
    gamma = 0.99
    replicas = strategy.num_replicas_in_sync

    def update(batch: dict) -> dict:
        next_q = q(batch["next_obs"])
        next_a = tf.argmax(next_q, axis=1)
        next_v = tf.gather(target(batch["next_obs"]), next_a, batch_dims=1)
        not_done = 1.0 - tf.cast(batch["terminated"], tf.float32)
        y = tf.stop_gradient(batch["reward"] + gamma * not_done * next_v)
        with tf.GradientTape() as tape:
            q_a = tf.gather(q(batch["obs"]), batch["action"], batch_dims=1)
            loss = tf.reduce_mean(tf.keras.losses.huber(y[:, None], q_a[:, None]))
            scaled = loss / replicas
        variables = q.trainable_variables
        opt.apply_gradients(zip(tape.gradient(scaled, variables), variables, strict=True))
        for (tw, tb), (w, b) in zip(target.layers, q.layers, strict=True):
            tw.assign(0.995 * tw + 0.005 * w)
            tb.assign(0.995 * tb + 0.005 * b)
        return {"loss": loss}

    return update


def make_data(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n, OBS_DIM), np.float32)
    return {
        "obs": obs,
        "action": rng.integers(0, NUM_ACTIONS, n),
        "reward": rng.standard_normal(n, np.float32),
        "next_obs": np.roll(obs, -1, axis=0),
        "terminated": rng.random(n) < 0.01,
        "truncated": np.zeros(n, bool),
    }


def interleaved_rates(
    runners: dict[str, Callable[[], int]], seconds: float, repeats: int
) -> dict[str, float]:
    """Median work units/s of each runner; ``run()`` does some work and returns its units.

    Every runner is warmed up (traced, compiled) first; then the timing windows go round-robin
    (a window of each runner, ``repeats`` times), so a change in the machine's load hits all
    variants alike and the ratios between them stay meaningful on a shared, noisy machine.
    """
    for run in runners.values():
        run()
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            done, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < seconds:
                done += run()
            rates[name].append(done / elapsed)
    return {name: statistics.median(values) for name, values in rates.items()}


def learner_runners(hidden: int, capacity: int, data: dict) -> dict[str, Callable[[], int]]:
    """Runners of variants (a)-(e) for one network size and capacity; each returns steps."""
    rng = np.random.default_rng(1)
    step = tf.function(make_dqn_update(hidden))

    def numpy_feed() -> int:
        for _ in range(20):
            idx = rng.integers(0, capacity, BATCH)
            step({k: v[idx] for k, v in data.items()})
        return 20

    step_b = tf.function(make_dqn_update(hidden))
    dataset = (
        tf.data.Dataset.from_tensor_slices(data)
        .shuffle(10_000, seed=0, reshuffle_each_iteration=True)
        .repeat()
        .batch(BATCH, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    iterator = iter(dataset)

    def tf_data() -> int:
        for _ in range(20):
            step_b(next(iterator))
        return 20

    runners = {"a numpy feed": numpy_feed, "b tf.data": tf_data}
    table = rg.ReplayTable(SPEC, capacity=capacity)
    table.append(data)
    variants = (
        ("c in-graph k=1", 1, False),
        ("d in-graph k=100", 100, False),
        ("e in-graph k=100 XLA", 100, True),
    )
    for name, k, jit in variants:
        learner = uniform_learner(table, hidden, jit)
        calls = max(1, 20 // k)
        runners[name] = lambda k=k, c=calls, lr=learner: _train(lr, k, c)
    return runners


def uniform_learner(
    table: rg.ReplayTable, hidden: int, jit: bool, chunk_steps: int = 100
) -> rg.Learner:
    """The fused learner of variants (c)-(e): uniform sampling (seed 0) of ``table`` into a
    fresh `make_dqn_update` network, batch `BATCH`, compiled with XLA if ``jit``, its SGD steps
    in counted loops of ``chunk_steps`` (`rg.Learner`'s argument and default)."""
    sampler = rg.Sampler(table, seed=0)
    return rg.Learner(
        table,
        sampler,
        make_dqn_update(hidden),
        batch_size=BATCH,
        jit_compile=jit,
        chunk_steps=chunk_steps,
    )


def _train(learner: rg.Learner, k: int, calls: int) -> int:
    for _ in range(calls):
        learner.train(k)
    return k * calls


def sample_only_runner(capacity: int, jit: bool, steps: int = 1000) -> Callable[[], int]:
    """A runner of uniform sampling + gather of every field inside a while_loop (transitions)."""
    table = rg.ReplayTable(SPEC, capacity=capacity)
    chunk = 100_000
    for start in range(0, capacity, chunk):
        table.append(make_data(min(chunk, capacity - start), seed=start))
    loop = sample_loop(rg.Sampler(table, seed=0), BATCH, jit)
    n = tf.constant(steps, tf.int64)

    def run() -> int:
        loop(n).numpy()
        return steps * BATCH

    return run


def split_devices(replicas: int) -> list[str]:
    """``replicas`` GPUs when there are that many, else as many logical CPUs (before TF starts)."""
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= replicas:
        return [f"/gpu:{i}" for i in range(replicas)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)]
    )
    return [f"/cpu:{i}" for i in range(replicas)]


def sharded_runners(devices: list[str], hidden: int, capacity: int) -> dict:
    """Runners of the single-device learner and sharded learners over 1 and N replicas."""
    data = make_data(capacity)
    runners = {}

    def add(name: str, table, sampler, update, jit: bool = False) -> None:
        table.append(data)
        learner = rg.Learner(table, sampler, update, batch_size=BATCH, jit_compile=jit)
        runners[name] = lambda lr=learner: _train(lr, 100, 1)

    single = rg.ReplayTable(SPEC, capacity, device=devices[0])
    add("1 device", single, rg.Sampler(single, seed=0), make_dqn_update(hidden))
    single_xla = rg.ReplayTable(SPEC, capacity, device=devices[0])
    add(
        "1 device XLA",
        single_xla,
        rg.Sampler(single_xla, seed=0),
        make_dqn_update(hidden),
        jit=True,
    )
    for n in sorted({1, len(devices)}):
        strategy = mirrored_strategy(devices[:n])
        table = rg.ShardedReplayTable(SPEC, capacity, strategy)
        add(
            f"{n} replica{'s' if n > 1 else ''} sharded",
            table,
            rg.Sampler(table, seed=0),
            make_dqn_update(hidden, strategy=strategy),
            jit=True,  # XLA per replica step where every device is a GPU; ignored on CPUs
        )
    return runners


def sharded_main(args: argparse.Namespace) -> None:
    devices = split_devices(args.replicas)
    print(
        f"# learner_throughput --sharded  {time.strftime('%Y-%m-%d')}  {platform.node()}  "
        f"{os.cpu_count()} CPUs  TF {tf.__version__}  devices {devices}"
    )
    print(
        f"# DQN MLP 64x64, batch {BATCH} in total, k=100 steps per call, capacity 1e5; "
        f"median of {args.repeats} x {args.seconds:.1f} s, windows interleaved"
    )
    if devices[0].startswith("/cpu"):
        print("# logical CPU devices share the same cores: this measures overhead, not speed-up")
    results = interleaved_rates(sharded_runners(devices, 64, 100_000), args.seconds, args.repeats)
    base = results["1 device"]
    print(f"{'variant':<22} {'steps/s':>9} {'x 1 device':>11}")
    for name, value in results.items():
        print(f"{name:<22} {value:>9.0f} {value / base:>10.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="MLP 64x64 and capacity 1e5 only")
    parser.add_argument("--seconds", type=float, default=2.0, help="timing window per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="windows per figure (median)")
    parser.add_argument("--sharded", action="store_true", help="only the sharded section")
    parser.add_argument("--replicas", type=int, default=2, help="replicas of --sharded")
    args = parser.parse_args()
    if args.sharded:
        sharded_main(args)
        return
    seconds = 0.7 if args.quick else args.seconds
    hiddens = [64] if args.quick else [64, 256]
    capacities = [100_000] if args.quick else [100_000, 1_000_000]

    print(
        f"# learner_throughput  {time.strftime('%Y-%m-%d')}  {platform.node()}  "
        f"{os.cpu_count()} CPUs  TF {tf.__version__}  device {resolve_device()}"
    )
    print(
        f"# batch {BATCH}, obs dim {OBS_DIM}, {NUM_ACTIONS} actions, double DQN + Adam; "
        f"median of {args.repeats} x {seconds:.1f} s"
    )
    print(f"{'mlp':>8} {'capacity':>9} {'variant':<22} {'steps/s':>9} {'x (a)':>7}")
    for hidden in hiddens:
        for capacity in capacities:
            data = make_data(capacity)
            results = interleaved_rates(
                learner_runners(hidden, capacity, data), seconds, args.repeats
            )
            base = results["a numpy feed"]
            for name, value in results.items():
                print(
                    f"{hidden}x{hidden:<5} {capacity:>9.0e} {name:<22} {value:>9.0f} "
                    f"{value / base:>6.2f}x",
                    flush=True,
                )
            del data

    print(
        f"\n{'sample-only':<12} {'capacity':>9} {'xla':>5} {'transitions/s':>14} {'cost x 1e4':>10}"
    )
    for jit in (False, True):
        capacities = (10_000, 100_000, 1_000_000)
        runners = {str(c): sample_only_runner(c, jit) for c in capacities}
        results = interleaved_rates(runners, seconds, args.repeats)
        base = results[str(capacities[0])]
        for capacity in capacities:
            value = results[str(capacity)]
            print(
                f"{'uniform':<12} {capacity:>9.0e} {jit!s:>5} {value:>14.3e} {base / value:>9.2f}x",
                flush=True,
            )
        del runners


if __name__ == "__main__":
    main()
