"""The Keras DDPG loop on Pendulum: replaygpu (a per-step writer, a fused learner) against the
same program on a numpy ring buffer, side by side (issue 36, items 1 and 4).

Both variants are one program: `docs/recipes.md`'s DDPG (Keras 3 actor and critic, two Adam
optimizers, Polyak target networks, Gaussian exploration noise), one env step at a time,
``--train-every`` SGD steps every ``--train-every`` env steps after ``--learning-starts``.
Only the buffer and the update loop differ:

  numpy      the Keras example's buffer (one preallocated array per field, a write per field
             each step); each SGD step draws a minibatch with numpy and calls the update, one
             ``tf.function`` (XLA), as a Keras user who already fixed the speed would write it.
  replaygpu  ``table.writer`` per step; ``learner.train(k)``: k SGD steps in one XLA call,
             minibatches drawn in the graph.

Each (variant, seed) runs in a fresh process, the variants alternating per seed, and prints
wall-clock and CPU seconds of the training loop and the greedy return over 10 episodes; the
summary gives medians and ratios. Run::

    python benchmarks/keras_ddpg_loop.py --seeds 0 1 2 --steps 20000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GAMMA, TAU, BATCH = 0.99, 0.005, 256


def recipe_ddpg(seed: int) -> tuple:
    """docs/recipes.md's DDPG on fresh networks (Keras seed ``seed``), optimizers built:
    ``(actor, update)``, ``update(batch)`` one SGD step on a Pendulum batch (its metrics)."""
    import keras
    import tensorflow as tf

    from replaygpu.targets import update_target

    keras.utils.set_random_seed(seed)

    def make_actor():
        obs = keras.Input((3,))
        h = keras.layers.Dense(256, activation="relu")(obs)
        h = keras.layers.Dense(256, activation="relu")(h)
        return keras.Model(obs, 2.0 * keras.layers.Dense(1, activation="tanh")(h))

    def make_critic():
        obs, action = keras.Input((3,)), keras.Input((1,))
        h = keras.layers.Concatenate()([obs, action])
        h = keras.layers.Dense(256, activation="relu")(h)
        h = keras.layers.Dense(256, activation="relu")(h)
        return keras.Model([obs, action], keras.layers.Dense(1)(h))

    actor, critic, target_actor, target_critic = (
        make_actor(),
        make_critic(),
        make_actor(),
        make_critic(),
    )
    update_target(target_actor, actor)
    update_target(target_critic, critic)
    actor_opt, critic_opt = keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3)
    actor_opt.build(actor.trainable_variables)
    critic_opt.build(critic.trainable_variables)

    def update(batch):
        obs, action, next_obs = batch["obs"], batch["action"], batch["next_obs"]
        next_q = keras.ops.squeeze(target_critic([next_obs, target_actor(next_obs)]), -1)
        not_done = 1.0 - keras.ops.cast(batch["terminated"], "float32")
        y = batch["reward"] + GAMMA * not_done * next_q
        with tf.GradientTape() as tape:
            critic_loss = keras.ops.mean((keras.ops.squeeze(critic([obs, action]), -1) - y) ** 2)
        grads = tape.gradient(critic_loss, critic.trainable_variables)
        critic_opt.apply_gradients(zip(grads, critic.trainable_variables, strict=True))
        with tf.GradientTape() as tape:
            actor_loss = -keras.ops.mean(critic([obs, actor(obs)]))
        grads = tape.gradient(actor_loss, actor.trainable_variables)
        actor_opt.apply_gradients(zip(grads, actor.trainable_variables, strict=True))
        update_target(target_actor, actor, TAU)
        update_target(target_critic, critic, TAU)
        return {"critic_loss": critic_loss, "actor_loss": actor_loss}

    return actor, update


def run(variant: str, seed: int, steps: int, train_every: int, learning_starts: int) -> dict:
    import gymnasium as gym
    import numpy as np
    import tensorflow as tf

    import replaygpu as rg
    from replaygpu.specs import specs_from_env

    env = gym.make("Pendulum-v1")
    spec = specs_from_env(env)
    actor, update = recipe_ddpg(seed)
    capacity = 100_000
    if variant == "replaygpu":
        table = rg.ReplayTable(spec, capacity, device="/CPU:0")
        writer = table.writer(chunk=train_every)
        learner = rg.Learner(table, rg.Sampler(table, seed=seed), update, BATCH, jit_compile=True)
        add = writer.add

        def train(k: int) -> None:
            learner.train(k)
    else:
        arrays = {
            k: np.zeros((capacity, *s.shape), s.dtype.as_numpy_dtype) for k, s in spec.items()
        }
        filled = [0]
        sample_rng = np.random.default_rng(seed)
        step_fn = tf.function(update, jit_compile=True)

        def add(row: dict) -> None:
            i = filled[0] % capacity
            for k, array in arrays.items():
                array[i] = row[k]
            filled[0] += 1

        def train(k: int) -> None:
            for _ in range(k):
                rows = sample_rng.integers(min(filled[0], capacity), size=BATCH)
                step_fn({name: array[rows] for name, array in arrays.items()})

    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for step in range(steps):
        if step < learning_starts:
            action = rng.uniform(-2.0, 2.0, size=1).astype(np.float32)
        else:
            action = np.asarray(actor(obs[None], training=False)[0])
            action = np.clip(action + rng.normal(0.0, 0.2, size=1), -2.0, 2.0).astype(np.float32)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        add(
            {
                "obs": obs,
                "action": action,
                "reward": float(reward),
                "next_obs": next_obs,
                "terminated": terminated,
                "truncated": truncated,
            }
        )
        obs = next_obs if not (terminated or truncated) else env.reset()[0]
        if step >= learning_starts and step % train_every == 0:
            train(train_every)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    returns = []
    for episode in range(10):
        obs, _ = env.reset(seed=10_000 + episode)
        done, total = False, 0.0
        while not done:
            obs, reward, terminated, truncated, _ = env.step(np.asarray(actor(obs[None])[0]))
            total += reward
            done = terminated or truncated
        returns.append(total)
    return {
        "variant": variant,
        "seed": seed,
        "wall_s": wall,
        "cpu_s": cpu,
        "greedy_return": float(np.mean(returns)),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--train-every", type=int, default=50)
    parser.add_argument("--learning-starts", type=int, default=1_000)
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = run(
            args.one[0], int(args.one[1]), args.steps, args.train_every, args.learning_starts
        )
        print("RESULT " + json.dumps(result))
        return
    print(
        f"# {platform.node()}, python {platform.python_version()}, load "
        f"{os.getloadavg()[0]:.2f}; DDPG Pendulum-v1, {args.steps} env steps, train "
        f"{args.train_every} every {args.train_every}, batch {BATCH}"
    )
    results = []
    for i, seed in enumerate(args.seeds):
        order = ["numpy", "replaygpu"] if i % 2 == 0 else ["replaygpu", "numpy"]
        for variant in order:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    variant,
                    str(seed),
                    "--steps",
                    str(args.steps),
                    "--train-every",
                    str(args.train_every),
                    "--learning-starts",
                    str(args.learning_starts),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            result = json.loads(out.split("RESULT ", 1)[1])
            results.append(result)
            print(
                f"{variant:9s} seed {seed}: wall {result['wall_s']:6.1f} s, CPU "
                f"{result['cpu_s']:6.1f} s, greedy return {result['greedy_return']:8.1f}",
                flush=True,
            )
    med = {
        v: {
            k: statistics.median(r[k] for r in results if r["variant"] == v)
            for k in ("wall_s", "cpu_s", "greedy_return")
        }
        for v in ("numpy", "replaygpu")
    }
    for v, m in med.items():
        print(
            f"median {v:9s}: wall {m['wall_s']:6.1f} s, CPU {m['cpu_s']:6.1f} s, greedy "
            f"return {m['greedy_return']:8.1f}"
        )
    print(
        f"numpy / replaygpu: wall {med['numpy']['wall_s'] / med['replaygpu']['wall_s']:.2f}x, "
        f"CPU {med['numpy']['cpu_s'] / med['replaygpu']['cpu_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
