"""Keras layers and optimizer against the agents' hand-written ones in the fused loop (issue 36,
item 5): the same DQN update (CartPole shapes, a [256, 256] ReLU MLP, Adam, Huber loss, batch
64) written with `agents.networks.MLP` + `agents.networks.Adam` and with ``keras.layers.Dense``
+ ``keras.optimizers.Adam``, each in a `Learner` over one table, XLA on and off.

Each variant runs ``train(--steps)`` calls round-robin (--repeats rounds, the first call apart:
tracing and XLA); the median SGD steps/s per variant and the ratio Keras / hand-written are
printed. Run::

    python benchmarks/keras_layers.py --steps 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents.networks import MLP, Adam

SPEC = {
    "obs": tf.TensorSpec([4], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "reward": tf.TensorSpec([], tf.float32),
    "next_obs": tf.TensorSpec([4], tf.float32),
    "terminated": tf.TensorSpec([], tf.bool),
}


def table() -> rg.ReplayTable:
    rng = np.random.default_rng(0)
    t = rg.ReplayTable(SPEC, 50_000, device="/CPU:0")
    n = 50_000
    t.append(
        {
            "obs": rng.standard_normal((n, 4)).astype(np.float32),
            "action": rng.integers(2, size=n),
            "reward": np.ones(n, np.float32),
            "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
            "terminated": rng.random(n) < 0.02,
        }
    )
    return t


def dqn_update(q, target, apply):
    def update(batch):
        next_q = tf.reduce_max(target(batch["next_obs"]), axis=1)
        y = batch["reward"] + 0.99 * (1.0 - tf.cast(batch["terminated"], tf.float32)) * next_q
        with tf.GradientTape() as tape:
            q_taken = tf.gather(q(batch["obs"]), batch["action"], batch_dims=1)
            err = y - q_taken
            loss = tf.reduce_mean(tf.where(tf.abs(err) <= 1.0, 0.5 * err**2, tf.abs(err) - 0.5))
        apply(tape, loss)
        return {"loss": loss}

    return update


def handwritten():
    q, target = MLP([4, 256, 256, 2], seed=0), MLP([4, 256, 256, 2], seed=1)
    opt = Adam(q.weights, 1e-3)
    return dqn_update(q, target, lambda tape, loss: opt.apply(tape.gradient(loss, q.weights)))


def keras_layers():
    def net():
        return keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(2),
            ]
        )

    q, target = net(), net()
    opt = keras.optimizers.Adam(1e-3)
    opt.build(q.trainable_variables)

    def apply(tape, loss):
        grads = tape.gradient(loss, q.trainable_variables)
        opt.apply_gradients(zip(grads, q.trainable_variables, strict=True))

    return dqn_update(q, target, apply)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="SGD steps per train call")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    t = table()
    learners = {
        f"{name} {'XLA' if xla else 'graph'}": rg.Learner(
            t, rg.Sampler(t, seed=0), make(), batch_size=64, jit_compile=xla
        )
        for xla in (False, True)
        for name, make in (("hand-written", handwritten), ("keras", keras_layers))
    }
    for learner in learners.values():
        learner.train(10)  # trace, compile
    rates: dict[str, list[float]] = {name: [] for name in learners}
    for _ in range(args.repeats):
        for name, learner in learners.items():
            start = time.perf_counter()
            learner.train(args.steps)
            rates[name].append(args.steps / (time.perf_counter() - start))
    print(f"# load {os.getloadavg()[0]:.2f}; DQN [256, 256] batch 64, {args.steps} steps a call")
    for name, values in rates.items():
        print(f"{name:20s} {statistics.median(values):8.0f} SGD steps/s (median of {args.repeats})")
    for mode in ("graph", "XLA"):
        ratio = statistics.median(rates[f"keras {mode}"]) / statistics.median(
            rates[f"hand-written {mode}"]
        )
        print(f"keras / hand-written, {mode}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
