"""DQN on CartPole-v1 in Keras 3 on replaygpu (docs/recipes.md): a replay table, rows written one
env step at a time, k SGD steps per graph call under XLA, a target network, a greedy evaluation.
"""

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.specs import specs_from_env
from replaygpu.targets import update_target

STEPS = 50_000  # env steps; rl-zoo3's CartPole hyperparameters below
TRAIN_EVERY, GRADIENT_STEPS = 256, 128  # a train call of 128 SGD steps every 256 env steps
LEARNING_STARTS = 1_000
keras.utils.set_random_seed(0)

env = gym.make("CartPole-v1")
table = rg.ReplayTable(specs_from_env(env), capacity=50_000)  # obs [4], action [], reward [] ...
writer = table.writer(chunk=TRAIN_EVERY)


def q_network():
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(2),
        ]
    )


q, target = q_network(), q_network()
update_target(target, q)  # tau=1: a copy
optimizer = keras.optimizers.Adam(2.3e-3)
optimizer.build(q.trainable_variables)


def update_fn(batch):
    not_done = 1.0 - keras.ops.cast(batch["terminated"], "float32")  # [B]
    next_q = keras.ops.max(target(batch["next_obs"]), axis=1)  # [B, 2] -> [B]
    y = batch["reward"] + 0.99 * not_done * next_q  # [B]
    with tf.GradientTape() as tape:
        q_all = q(batch["obs"])  # [B, 2]
        q_taken = keras.ops.take_along_axis(q_all, batch["action"][:, None], axis=1)[:, 0]
        loss = keras.losses.Huber()(y, q_taken)
    grads = tape.gradient(loss, q.trainable_variables)
    optimizer.apply_gradients(zip(grads, q.trainable_variables, strict=True))
    return {"loss": loss, "q": keras.ops.mean(q_taken)}


learner = rg.Learner(
    table,
    rg.Sampler(table, seed=0),
    update_fn,
    batch_size=64,
    jit_compile=True,
    chunk_steps=GRADIENT_STEPS,
)  # train(k): chunks of k
rng = np.random.default_rng(0)
obs, _ = env.reset(seed=0)
for step in range(STEPS):
    epsilon = max(0.04, 1.0 - step / (0.16 * STEPS))
    if rng.random() < epsilon:
        action = int(rng.integers(2))
    else:
        action = int(np.argmax(q(obs[None], training=False)[0]))
    next_obs, reward, terminated, truncated, _ = env.step(action)
    writer.add(
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
    if step >= LEARNING_STARTS and step % TRAIN_EVERY == 0:
        metrics = learner.train(GRADIENT_STEPS)
        update_target(target, q)  # rl-zoo3: every 10 env steps, so after every call

returns = []
for episode in range(10):
    obs, _ = env.reset(seed=1000 + episode)
    done, total = False, 0.0
    while not done:
        obs, reward, terminated, truncated, _ = env.step(int(np.argmax(q(obs[None])[0])))
        total += reward
        done = terminated or truncated
    returns.append(total)
print(f"DQN CartPole: greedy return {np.mean(returns):.1f} over 10 episodes")
