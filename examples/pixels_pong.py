"""DQN on Atari frames on replaygpu (docs/recipes.md): each 84x84 frame stored once in a frame
table, stacks of 4 rebuilt in the graph; its budget is meant for a GPU (pip install -e ".[atari]").
"""

from collections import deque

import ale_py
import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.samplers import make_frame_table
from replaygpu.targets import update_target

STEPS = 1_000_000  # on a GPU; a CPU manages about 100 env steps/s with training
TRAIN_EVERY = 4
LEARNING_STARTS = 50_000
gym.register_envs(ale_py)
keras.utils.set_random_seed(0)

env = gym.wrappers.AtariPreprocessing(gym.make("ALE/Pong-v5", frameskip=1), frame_skip=4)
num_actions = int(env.action_space.n)
table = make_frame_table(capacity=min(1_000_000, STEPS), frame_shape=(84, 84))
writer = table.writer(chunk=256)
sampler = rg.Sampler(table, rg.Uniform(), rg.FrameStack(4), seed=0)


def nature_cnn():
    frames = keras.Input((4, 84, 84), dtype="uint8")
    x = keras.layers.Permute((2, 3, 1))(keras.ops.cast(frames, "float32") / 255.0)
    x = keras.layers.Conv2D(32, 8, strides=4, activation="relu")(x)
    x = keras.layers.Conv2D(64, 4, strides=2, activation="relu")(x)
    x = keras.layers.Conv2D(64, 3, strides=1, activation="relu")(x)
    x = keras.layers.Dense(512, activation="relu")(keras.layers.Flatten()(x))
    return keras.Model(frames, keras.layers.Dense(num_actions)(x))


q, target = nature_cnn(), nature_cnn()
update_target(target, q)
optimizer = keras.optimizers.Adam(1e-4)
optimizer.build(q.trainable_variables)


def update_fn(batch):  # obs, next_obs [B, 4, 84, 84] uint8; action, reward, terminated [B]
    not_done = 1.0 - keras.ops.cast(batch["terminated"], "float32")
    y = batch["reward"] + 0.99 * not_done * keras.ops.max(target(batch["next_obs"]), axis=1)
    with tf.GradientTape() as tape:
        q_all = q(batch["obs"])
        q_taken = keras.ops.take_along_axis(q_all, batch["action"][:, None], axis=1)[:, 0]
        loss = keras.losses.Huber()(y, q_taken)
    grads = tape.gradient(loss, q.trainable_variables)
    optimizer.apply_gradients(zip(grads, q.trainable_variables, strict=True))
    return {"loss": loss}


learner = rg.Learner(table, sampler, update_fn, batch_size=32)
rng = np.random.default_rng(0)
frame, _ = env.reset(seed=0)
stack, first = deque([frame] * 4, maxlen=4), True
for step in range(STEPS):
    epsilon = max(0.01, 1.0 - step / (0.1 * STEPS))
    if rng.random() < epsilon:
        action = int(rng.integers(num_actions))
    else:
        action = int(np.argmax(q(np.stack(stack)[None], training=False)[0]))
    next_frame, reward, terminated, truncated, _ = env.step(action)
    writer.add(
        {
            "frame": frame,
            "action": action,
            "reward": float(np.sign(reward)),
            "terminated": terminated,
            "truncated": truncated,
            "first": first,
            "final": False,
        }
    )
    frame, first = next_frame, False
    stack.append(frame)
    if terminated or truncated:  # the row that holds the episode's last frame
        writer.add(
            {
                "frame": frame,
                "action": 0,
                "reward": 0.0,
                "terminated": False,
                "truncated": False,
                "first": False,
                "final": True,
            }
        )
        frame, _ = env.reset()
        stack, first = deque([frame] * 4, maxlen=4), True
    if step >= LEARNING_STARTS and step % TRAIN_EVERY == 0:
        learner.train(1)
        if step % 10_000 == 0:
            update_target(target, q)
writer.flush()  # the rows staged since the last training call
print(f"Pong: {table.size} frame rows, {table.nbytes / 2**20:.0f} MiB on {table.device}")
