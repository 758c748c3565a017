"""Keras's LSTM layer against R2D2's own LSTM cell in the fused loop (issue 36, item 5; issue
35, item 2): the R2D2 learner of `benchmarks/r2d2.py` (the same table of random windows, the
same update), its online and target networks either `agents.r2d2.network.LSTMQNetwork` (a cell of
plain variables: the input half of every step's gates in one product before the loop, the loop
a `tf.scan` under XLA, a static unroll without) or `KerasLSTMQNetwork` below (``Dense`` torso,
``keras.layers.LSTM`` with the window's mask, ``Dense`` head), at the demo's and the paper's
shapes, XLA on and off. Rounds interleave the variants; prints the median SGD steps/s of each
and the ratio Keras / own. Run::

    python benchmarks/keras_lstm.py --sgd-steps 10 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gymnasium as gym
import keras
import tensorflow as tf
from r2d2 import LEARNER_SHAPES, filled_table

import replaygpu as rg
from replaygpu.agents.networks import Adam, mlp
from replaygpu.agents.r2d2 import agent as r2d2


class KerasLSTMQNetwork:
    """`LSTMQNetwork`'s interface (``unroll``, ``weights``, ``state_size``) on Keras layers."""

    def __init__(self, obs_dim: int, num_actions: int, torso: int, units: int, seed: int):
        self.units = units
        self.torso = mlp([obs_dim, torso], seed)
        self.lstm = keras.layers.LSTM(units, return_sequences=True, return_state=True)
        self.lstm.build((None, None, torso))
        self.head = mlp([units, num_actions], seed + 2)

    @property
    def state_size(self) -> int:
        return 2 * self.units

    @property
    def weights(self) -> list:
        return [*self.torso.weights, *self.lstm.weights, *self.head.weights]

    def unroll(self, obs: tf.Tensor, state: tf.Tensor, mask: tf.Tensor | None = None):
        batch, steps = tf.shape(obs)[0], obs.shape[1]
        x = tf.nn.relu(self.torso(tf.reshape(obs, [batch * steps, -1])))
        x = tf.reshape(x, [batch, steps, -1])
        h, c = state[:, : self.units], state[:, self.units :]
        keep = None if mask is None else mask > 0
        out, h, c = self.lstm(x, initial_state=[h, c], mask=keep)
        q = self.head(tf.reshape(out, [batch * steps, self.units]))
        return tf.reshape(q, [batch, steps, -1]), tf.concat([h, c], axis=1)


def learner(config: r2d2.R2D2Config, table: rg.ReplayTable, variant: str) -> rg.Learner:
    env = gym.make(config.env_id)
    agent = r2d2.make_agent(config, env)
    if variant == "keras":
        sizes = (env.observation_space.shape[0], 2, config.torso_size, config.lstm_units, 0)
        agent.q, agent.target = KerasLSTMQNetwork(*sizes), KerasLSTMQNetwork(*sizes)
        agent.optimizer = Adam(agent.q.weights, config.learning_rate, config.max_grad_norm)
    env.close()
    sampler = r2d2.make_sampler(config, table, agent)
    return rg.Learner(
        table, sampler, agent.update, config.batch_size, jit_compile=config.jit_compile,
        autograph=False,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sgd-steps", type=int, default=10, help="SGD steps per train call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=10_000)
    args = parser.parse_args()
    print(f"# load {os.getloadavg()[0]:.2f}; {args.sgd_steps} SGD steps a call")
    for name, batch, burn_in, T, units, period, xla in LEARNER_SHAPES:
        config = r2d2.R2D2Config(
            sequence_length=burn_in + T, burn_in=burn_in, period=period, lstm_units=units,
            torso_size=units, batch_size=batch, jit_compile=xla,
        )  # fmt: skip
        table = filled_table(config, args.sequences + config.sequence_length - 1)
        learners, first = {}, {}
        for variant in ("own", "keras"):
            learners[variant] = learner(config, table, variant)
            start = time.perf_counter()
            learners[variant].train(1)
            first[variant] = time.perf_counter() - start
        rates: dict[str, list[float]] = {v: [] for v in learners}
        for _ in range(args.repeats):
            for variant, each in learners.items():
                start = time.perf_counter()
                each.train(args.sgd_steps)
                rates[variant].append(args.sgd_steps / (time.perf_counter() - start))
        own, ker = (statistics.median(rates[v]) for v in ("own", "keras"))
        print(
            f"{name:10s} B{batch} burn-in {burn_in} + T {T}, {'XLA' if xla else 'no XLA'}: "
            f"own {own:.1f} SGD steps/s (first call {first['own']:.0f} s), keras {ker:.1f} "
            f"(first call {first['keras']:.0f} s): keras / own {ker / own:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
