"""The keras.io DDPG example (Pendulum) as published, with a four-line fix, and ported onto
replaygpu at k = 1 and k = 50 SGD steps per train call: wall and CPU seconds, and returns,
side by side (issue 49).

One algorithm in four programs, written here after the example
(keras.io/examples/rl/ddpg_pendulum, Keras 3): its actor (256-256, tanh x 2, last layer drawn
in +-3e-3) and critic (state 16-32 and action 32 branches, then 256-256), Adam at 1e-3 (actor)
and 2e-3 (critic), gamma 0.99, tau 0.005, batch 64, a 50,000-row buffer, Ornstein-Uhlenbeck
noise (std 0.2), 100 episodes of 200 steps with one SGD step per env step.

  published   the example's own loop: a float64 numpy buffer, one ``tf.function`` update per
              env step, the target networks blended in eager Python through
              ``get_weights``/``set_weights``, the actor called eagerly on each observation
  fixed       the same, the target blend moved into a ``tf.function`` over the variables:
              four lines, no library
  k=1         replaygpu the way docs/recipes.md writes it: ``table.writer``, one
              ``learner.train(1)`` per env step (XLA), acting with `NumpyModel` refreshed
              after every call, as the example acts with weights one step old
  k=50        the same, ``learner.train(50)`` every 50 env steps: the policy lags by at most
              50 steps, as the recipe's does

Each (program, seed) runs in a fresh process, the programs in a rotating order per seed, and
prints the training loop's wall and CPU seconds, the example's own score (the mean return of
the last 40 training episodes) and a greedy return over 10 fresh episodes. Run::

    python benchmarks/ddpg_port.py --seeds 0 1
    python benchmarks/ddpg_port.py --seeds 0 --episodes 10   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PROGRAMS = ("published", "fixed", "k=1", "k=50")
GAMMA, TAU, BATCH, CAPACITY, STD = 0.99, 0.005, 64, 50_000, 0.2


def run(program: str, seed: int, episodes: int) -> dict:
    """Train one program for ``episodes`` episodes; its times and returns."""
    import gymnasium as gym
    import keras
    import numpy as np
    import tensorflow as tf

    import replaygpu as rg
    from replaygpu.numpy_model import NumpyModel
    from replaygpu.specs import specs_from_env
    from replaygpu.targets import update_target

    keras.utils.set_random_seed(seed)  # numpy's global stream too: the example's noise
    env = gym.make("Pendulum-v1")

    def get_actor() -> keras.Model:
        last_init = keras.initializers.RandomUniform(minval=-0.003, maxval=0.003)
        inputs = keras.Input((3,))
        out = keras.layers.Dense(256, activation="relu")(inputs)
        out = keras.layers.Dense(256, activation="relu")(out)
        out = keras.layers.Dense(1, activation="tanh", kernel_initializer=last_init)(out)
        return keras.Model(inputs, out * 2.0)

    def get_critic() -> keras.Model:
        state_input, action_input = keras.Input((3,)), keras.Input((1,))
        state_out = keras.layers.Dense(16, activation="relu")(state_input)
        state_out = keras.layers.Dense(32, activation="relu")(state_out)
        action_out = keras.layers.Dense(32, activation="relu")(action_input)
        out = keras.layers.Concatenate()([state_out, action_out])
        out = keras.layers.Dense(256, activation="relu")(out)
        out = keras.layers.Dense(256, activation="relu")(out)
        return keras.Model([state_input, action_input], keras.layers.Dense(1)(out))

    actor, critic, target_actor, target_critic = (
        get_actor(),
        get_critic(),
        get_actor(),
        get_critic(),
    )
    target_actor.set_weights(actor.get_weights())
    target_critic.set_weights(critic.get_weights())
    actor_opt, critic_opt = keras.optimizers.Adam(0.001), keras.optimizers.Adam(0.002)

    def sgd_step(obs, action, reward, next_obs) -> tf.Tensor:  # reward [B, 1], as the example's
        with tf.GradientTape() as tape:
            y = reward + GAMMA * target_critic([next_obs, target_actor(next_obs)])
            critic_loss = tf.reduce_mean(tf.square(y - critic([obs, action])))
        grads = tape.gradient(critic_loss, critic.trainable_variables)
        critic_opt.apply_gradients(zip(grads, critic.trainable_variables, strict=True))
        with tf.GradientTape() as tape:
            actor_loss = -tf.reduce_mean(critic([obs, actor(obs)]))
        grads = tape.gradient(actor_loss, actor.trainable_variables)
        actor_opt.apply_gradients(zip(grads, actor.trainable_variables, strict=True))
        return critic_loss

    theta, dt, noise = 0.15, 1e-2, np.zeros(1)

    def ou_noise() -> np.ndarray:
        nonlocal noise
        noise = noise - theta * noise * dt + STD * np.sqrt(dt) * np.random.normal(size=1)
        return noise

    if program in ("published", "fixed"):
        buffers = [np.zeros((CAPACITY, n)) for n in (3, 1, 1, 3)]  # float64, as published
        count = [0]
        update = tf.function(sgd_step)

        pairs = ((target_actor, actor), (target_critic, critic))

        def blend_targets() -> None:  # as published: eager, through numpy copies
            for target, source in pairs:
                weights, new = target.get_weights(), source.get_weights()
                target.set_weights(
                    [n * TAU + w * (1 - TAU) for w, n in zip(weights, new, strict=True)]
                )

        if program == "fixed":  # the fix: the same blend in a tf.function over the variables

            @tf.function
            def blend_targets() -> None:
                for target, source in pairs:
                    for a, b in zip(target.variables, source.variables, strict=True):
                        a.assign(b * TAU + a * (1 - TAU))

        def act(obs: np.ndarray) -> np.ndarray:
            return np.asarray(keras.ops.squeeze(actor(keras.ops.expand_dims(obs, 0))))

        def record(obs, action, reward, next_obs, terminated, truncated) -> None:
            for buffer, value in zip(buffers, (obs, action, reward, next_obs), strict=True):
                buffer[count[0] % CAPACITY] = value
            count[0] += 1

        def learn(step: int) -> None:
            rows = np.random.choice(min(count[0], CAPACITY), BATCH)
            obs, action, reward, next_obs = (tf.convert_to_tensor(b[rows]) for b in buffers)
            update(obs, action, tf.cast(reward, tf.float32), next_obs)
            blend_targets()

    else:
        k = int(program.removeprefix("k="))
        table = rg.ReplayTable(specs_from_env(env), capacity=CAPACITY)
        writer = table.writer(chunk=k)
        policy = NumpyModel.from_keras(actor)
        actor_opt.build(actor.trainable_variables)  # as the recipe does: the Learner asks it
        critic_opt.build(critic.trainable_variables)

        def update_fn(batch: dict) -> dict:
            critic_loss = sgd_step(
                batch["obs"], batch["action"], batch["reward"][:, None], batch["next_obs"]
            )
            update_target(target_actor, actor, TAU)
            update_target(target_critic, critic, TAU)
            return {"critic_loss": critic_loss}

        learner = rg.Learner(
            table,
            rg.Sampler(table, seed=seed),
            update_fn,
            batch_size=BATCH,
            jit_compile=True,
            chunk_steps=k,
        )

        def act(obs: np.ndarray) -> np.ndarray:
            return policy(obs[None])[0]

        def record(obs, action, reward, next_obs, terminated, truncated) -> None:
            writer.add(
                {
                    "obs": obs,
                    "action": action,
                    "reward": reward,
                    "next_obs": next_obs,
                    "terminated": terminated,
                    "truncated": truncated,
                }
            )

        def learn(step: int) -> None:
            if (step + 1) % k == 0:
                learner.train(k)
                policy.set_weights(actor.get_weights())

    scores, step = [], 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(episodes):
        obs, _ = env.reset()
        total, done = 0.0, False
        while not done:
            action = np.clip(act(obs) + ou_noise(), -2.0, 2.0).astype(np.float32)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            record(obs, action, reward, next_obs, terminated, truncated)
            total += reward
            learn(step)
            step += 1
            done = terminated or truncated
            obs = next_obs
        scores.append(total)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    greedy = []
    for episode in range(10):
        obs, _ = env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(np.asarray(actor(obs[None])[0]))
            total += reward
            done = terminated or truncated
        greedy.append(total)
    return {
        "program": program,
        "seed": seed,
        "env_steps": step,
        "wall_s": wall,
        "cpu_s": cpu,
        "last40_return": float(np.mean(scores[-40:])),
        "greedy_return": float(np.mean(greedy)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--episodes", type=int, default=100, help="the example's 100")
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=PROGRAMS)
    parser.add_argument("--one", nargs=2, metavar=("PROGRAM", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run(args.one[0], int(args.one[1]), args.episodes)))
        return
    print(
        f"# ddpg_port  {time.strftime('%Y-%m-%d %H:%M')}  {platform.node()}  "
        f"{os.cpu_count()} CPUs  load {os.getloadavg()[0]:.2f}; keras.io DDPG, Pendulum-v1, "
        f"{args.episodes} episodes of 200 steps, one SGD step per env step, batch {BATCH}"
    )
    print(f"{'program':<10} {'seed':>4} {'wall s':>8} {'cpu s':>8} {'last 40':>8} {'greedy':>8}")
    results = []
    for i, seed in enumerate(args.seeds):
        order = args.programs[i % len(args.programs) :] + args.programs[: i % len(args.programs)]
        for program in order:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    program,
                    str(seed),
                    "--episodes",
                    str(args.episodes),
                ],
                capture_output=True,
                text=True,
            )
            if out.returncode:
                sys.exit(f"{program} seed {seed} failed:\n{out.stderr[-3000:]}")
            line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
            r = json.loads(line.removeprefix("RESULT "))
            results.append(r)
            print(
                f"{r['program']:<10} {r['seed']:>4} {r['wall_s']:8.1f} {r['cpu_s']:8.1f} "
                f"{r['last40_return']:8.1f} {r['greedy_return']:8.1f}",
                flush=True,
            )
    print("# medians over seeds; ratios are the published program's time over each")
    base = (
        {
            m: statistics.median(r[m] for r in results if r["program"] == "published")
            for m in ("wall_s", "cpu_s")
        }
        if "published" in args.programs
        else None
    )
    for program in args.programs:
        mine = [r for r in results if r["program"] == program]
        wall = statistics.median(r["wall_s"] for r in mine)
        cpu = statistics.median(r["cpu_s"] for r in mine)
        speed = (
            f"  {base['wall_s'] / wall:5.2f}x wall  {base['cpu_s'] / cpu:5.2f}x cpu" if base else ""
        )
        print(
            f"{program:<10} wall {wall:7.1f} s  cpu {cpu:7.1f} s  last 40 "
            f"{statistics.median(r['last40_return'] for r in mine):8.1f}  greedy "
            f"{statistics.median(r['greedy_return'] for r in mine):8.1f}{speed}"
        )


if __name__ == "__main__":
    main()
