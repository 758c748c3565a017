"""Keras layers and Keras's Adam against hand-written networks and Adam in the fused loop (issue
36, item 5): the same DQN update (Huber loss, Adam 1e-3, max target) with networks of plain
variables and a plain Adam written out here (`PlainMLP`, `PlainNatureCNN`, `PlainAdam`: the agents'
code before it moved to Keras) and with Keras (``agents.networks.mlp`` / ``nature_cnn``:
``Dense``, ``Conv2D``; the agents' `Adam`, Keras's), in a `Learner` over one table, XLA on and
off. Two networks (``--net``; R2D2's LSTM against Keras's is `keras_lstm.py`):

- ``mlp``: CartPole shapes, a [256, 256] ReLU MLP, batch 64, 50k rows;
- ``cnn``: Atari shapes, the Nature CNN on uint8 ``[4, 84, 84]`` stacks, 6 actions, batch 32.

Each variant runs ``train(--steps)`` calls round-robin (--repeats rounds, the first call apart:
tracing and XLA); the median SGD steps/s per variant and the ratio Keras / hand-written are
printed. ``--plain-adam-both`` gives both sides the plain Adam (the layers alone compared).
``benchmarks/gpu/export.py`` exports the same learners for the GPU kit. Run::

    python benchmarks/keras_layers.py --net mlp --steps 2000 --repeats 5
    python benchmarks/keras_layers.py --net cnn --steps 10 --repeats 3
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents.networks import NATURE_CONVS, Adam, mlp, nature_cnn

FRAMES = (4, 84, 84)
#: per network: observation shape and dtype, actions, batch size, table rows
NETS: dict[str, tuple[tuple[int, ...], tf.DType, int, int, int]] = {
    "mlp": ((4,), tf.float32, 2, 64, 50_000),
    "cnn": (FRAMES, tf.uint8, 6, 32, 1024),
}


class PlainAdam(tf.Module):
    """Adam written out over plain variables (the agents' Adam before Keras's)."""

    def __init__(self, variables: Sequence[tf.Variable], learning_rate: float) -> None:
        super().__init__()
        self.params, self.learning_rate = list(variables), learning_rate
        self.m = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.params]
        self.v = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.params]
        self.t = tf.Variable(0.0, trainable=False)

    def apply(self, grads: Sequence[tf.Tensor]) -> None:
        t = self.t.assign_add(1.0)
        scale = self.learning_rate * tf.sqrt(1.0 - 0.999**t) / (1.0 - 0.9**t)
        for var, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            m.assign(0.9 * m + 0.1 * g)
            v.assign(0.999 * v + 0.001 * tf.square(g))
            var.assign_sub(scale * m / (tf.sqrt(v) + 1e-8))


class PlainMLP(tf.Module):
    """A ReLU MLP of plain variables, PyTorch's initialisation: ``[B, in] -> [B, out]``."""

    def __init__(self, sizes: Sequence[int], seed: int) -> None:
        super().__init__()
        rng = tf.random.Generator.from_seed(seed)
        self.layers = []
        for fan_in, fan_out in itertools.pairwise(sizes):
            bound = 1.0 / np.sqrt(fan_in)
            w = tf.Variable(rng.uniform([fan_in, fan_out], -bound, bound))
            self.layers.append((w, tf.Variable(rng.uniform([fan_out], -bound, bound))))
        self.weights = [v for layer in self.layers for v in layer]

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        for i, (w, b) in enumerate(self.layers):
            x = tf.matmul(x, w) + b
            if i < len(self.layers) - 1:
                x = tf.nn.relu(x)
        return x


class PlainNatureCNN(tf.Module):
    """The Nature CNN of plain variables: uint8 ``[B, k, H, W] -> [B, A]``."""

    def __init__(self, frame_shape: Sequence[int], num_outputs: int, seed: int) -> None:
        super().__init__()
        channels, height, width = frame_shape
        rng = tf.random.Generator.from_seed(seed)
        self.convs = []
        for filters, kernel, stride in NATURE_CONVS:
            bound = 1.0 / np.sqrt(kernel * kernel * channels)
            w = tf.Variable(rng.uniform([kernel, kernel, channels, filters], -bound, bound))
            b = tf.Variable(rng.uniform([filters], -bound, bound))
            self.convs.append((w, b, stride))
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
            channels = filters
        self.head = PlainMLP([height * width * channels, 512, num_outputs], seed + 1)
        self.weights = [v for w, b, _ in self.convs for v in (w, b)] + self.head.weights

    def __call__(self, frames: tf.Tensor) -> tf.Tensor:
        x = tf.transpose(tf.cast(frames, tf.float32) / 255.0, [0, 2, 3, 1])
        for w, b, stride in self.convs:
            x = tf.nn.relu(tf.nn.conv2d(x, w, stride, "VALID") + b)
        return self.head(tf.reshape(x, [tf.shape(x)[0], -1]))


def table(net: str, rows: int | None = None, device: str | None = None) -> rg.ReplayTable:
    """A table of ``rows`` random transitions for ``net`` (2% terminal)."""
    shape, dtype, actions, _, default_rows = NETS[net]
    n = rows or default_rows
    spec = {
        "obs": tf.TensorSpec(shape, dtype),
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
        "next_obs": tf.TensorSpec(shape, dtype),
        "terminated": tf.TensorSpec([], tf.bool),
    }
    rng = np.random.default_rng(0)

    def obs() -> np.ndarray:
        if dtype == tf.uint8:
            return rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        return rng.standard_normal((n, *shape)).astype(np.float32)

    t = rg.ReplayTable(spec, n, device=device)
    t.append(
        {
            "obs": obs(),
            "action": rng.integers(actions, size=n),
            "reward": np.ones(n, np.float32),
            "next_obs": obs(),
            "terminated": rng.random(n) < 0.02,
        }
    )
    return t


Update = Callable[[dict[str, tf.Tensor]], dict[str, tf.Tensor]]


def dqn_update(q: Any, target: Any, plain_adam: bool) -> Update:
    params = list(q.weights)
    apply = (PlainAdam(params, 1e-3) if plain_adam else Adam(params, 1e-3)).apply

    def update(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        next_q = tf.reduce_max(target(batch["next_obs"]), axis=1)
        y = batch["reward"] + 0.99 * (1.0 - tf.cast(batch["terminated"], tf.float32)) * next_q
        with tf.GradientTape() as tape:
            q_taken = tf.gather(q(batch["obs"]), batch["action"], batch_dims=1)
            err = y - q_taken
            loss = tf.reduce_mean(tf.where(tf.abs(err) <= 1.0, 0.5 * err**2, tf.abs(err) - 0.5))
        apply(tape.gradient(loss, params))
        return {"loss": loss}

    return update


def networks(net: str, variant: str) -> tuple[Any, Any]:
    """Online and target networks of ``variant`` ("hand-written" or "keras")."""
    shape, _, actions, _, _ = NETS[net]
    if net == "mlp":
        sizes = [*shape, 256, 256, actions]
        make = PlainMLP if variant == "hand-written" else mlp
        return make(sizes, seed=0), make(sizes, seed=1)
    make = PlainNatureCNN if variant == "hand-written" else nature_cnn
    return make(shape, actions, seed=0), make(shape, actions, seed=1)


def learner(
    net: str,
    variant: str,
    t: rg.ReplayTable,
    xla: bool,
    plain_adam_both: bool = False,
    chunk_steps: int = 100,
) -> rg.Learner:
    q, target = networks(net, variant)
    update = dqn_update(q, target, plain_adam_both or variant == "hand-written")
    sampler = rg.Sampler(t, seed=0)
    return rg.Learner(t, sampler, update, NETS[net][3], jit_compile=xla, chunk_steps=chunk_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--net", choices=sorted(NETS), default="mlp")
    parser.add_argument("--steps", type=int, default=2000, help="SGD steps per train call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--plain-adam-both", action="store_true", help="the plain Adam on the Keras side too"
    )
    args = parser.parse_args()
    t = table(args.net, device="/CPU:0")
    learners = {
        f"{variant} {'XLA' if xla else 'graph'}": learner(
            args.net, variant, t, xla, args.plain_adam_both
        )
        for xla in (False, True)
        for variant in ("hand-written", "keras")
    }
    for each in learners.values():
        each.train(2)  # trace, compile
    rates: dict[str, list[float]] = {name: [] for name in learners}
    for _ in range(args.repeats):
        for name, each in learners.items():
            start = time.perf_counter()
            each.train(args.steps)
            rates[name].append(args.steps / (time.perf_counter() - start))
    batch = NETS[args.net][3]
    adam = "plain Adam on both sides" if args.plain_adam_both else "Keras Adam against plain Adam"
    load = os.getloadavg()[0]
    print(f"# load {load:.2f}; DQN {args.net}, batch {batch}, {args.steps} steps, {adam}")
    for name, values in rates.items():
        print(f"{name:20s} {statistics.median(values):8.1f} SGD steps/s (median of {args.repeats})")
    for mode in ("graph", "XLA"):
        ratio = statistics.median(rates[f"keras {mode}"]) / statistics.median(
            rates[f"hand-written {mode}"]
        )
        print(f"keras / hand-written, {mode}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
