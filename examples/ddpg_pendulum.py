"""DDPG on Pendulum-v1 in Keras 3 on replaygpu (docs/recipes.md): two optimizers and two target
networks updated inside the fused loop, acting in numpy.
"""

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.numpy_model import NumpyModel
from replaygpu.specs import specs_from_env
from replaygpu.targets import update_target

STEPS = 20_000
TRAIN_EVERY = 50
LEARNING_STARTS = 1_000
GAMMA, TAU = 0.99, 0.005
keras.utils.set_random_seed(0)

env = gym.make("Pendulum-v1")  # obs [3], action [1] in [-2, 2]
table = rg.ReplayTable(specs_from_env(env), capacity=100_000)
writer = table.writer(chunk=TRAIN_EVERY)


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
    return keras.Model([obs, action], keras.layers.Dense(1)(h))  # [B, 1]


actor, critic = make_actor(), make_critic()
target_actor, target_critic = make_actor(), make_critic()
update_target(target_actor, actor)
update_target(target_critic, critic)
policy = NumpyModel.from_keras(actor)  # the actor's forward pass in numpy, for acting
actor_opt, critic_opt = keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3)
actor_opt.build(actor.trainable_variables)
critic_opt.build(critic.trainable_variables)


def update_fn(batch):
    obs, action, next_obs = batch["obs"], batch["action"], batch["next_obs"]
    next_q = keras.ops.squeeze(target_critic([next_obs, target_actor(next_obs)]), -1)  # [B]
    not_done = 1.0 - keras.ops.cast(batch["terminated"], "float32")
    y = batch["reward"] + GAMMA * not_done * next_q  # [B]: the squeeze keeps it so
    with tf.GradientTape() as tape:
        q = keras.ops.squeeze(critic([obs, action]), -1)
        critic_loss = keras.ops.mean(keras.ops.square(q - y))
    grads = tape.gradient(critic_loss, critic.trainable_variables)
    critic_opt.apply_gradients(zip(grads, critic.trainable_variables, strict=True))
    with tf.GradientTape() as tape:
        actor_loss = -keras.ops.mean(critic([obs, actor(obs)]))
    grads = tape.gradient(actor_loss, actor.trainable_variables)
    actor_opt.apply_gradients(zip(grads, actor.trainable_variables, strict=True))
    update_target(target_actor, actor, TAU)
    update_target(target_critic, critic, TAU)
    return {"critic_loss": critic_loss, "actor_loss": actor_loss}


learner = rg.Learner(
    table,
    rg.Sampler(table, seed=0),
    update_fn,
    batch_size=256,
    jit_compile=True,
    chunk_steps=TRAIN_EVERY,
)
rng = np.random.default_rng(0)
obs, _ = env.reset(seed=0)
for step in range(STEPS):
    if step < LEARNING_STARTS:
        action = rng.uniform(-2.0, 2.0, size=1).astype(np.float32)
    else:
        action = policy(obs[None])[0]  # as actor(obs[None], training=False)[0], in numpy
        action = np.clip(action + rng.normal(0.0, 0.2, size=1), -2.0, 2.0).astype(np.float32)
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
        learner.train(TRAIN_EVERY)
        policy.set_weights(actor.get_weights())

returns = []
for episode in range(10):
    obs, _ = env.reset(seed=1000 + episode)
    done, total = False, 0.0
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy(obs[None])[0])
        total += reward
        done = terminated or truncated
    returns.append(total)
print(f"DDPG Pendulum: greedy return {np.mean(returns):.1f} over 10 episodes")
