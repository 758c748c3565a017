"""SAC on Pendulum-v1 in Keras 3 on replaygpu (docs/recipes.md): three optimizers, the entropy
temperature learned, random draws inside the graph.
"""

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.specs import specs_from_env
from replaygpu.targets import update_target

STEPS = 20_000
TRAIN_EVERY = 64
LEARNING_STARTS = 1_000
GAMMA, TAU, MAX_ACTION = 0.99, 0.005, 2.0
keras.utils.set_random_seed(0)

env = gym.make("Pendulum-v1")
table = rg.ReplayTable(specs_from_env(env), capacity=100_000)
writer = table.writer(chunk=TRAIN_EVERY)


def mlp(inputs, outputs):
    h = keras.layers.Dense(256, activation="relu")(inputs)
    h = keras.layers.Dense(256, activation="relu")(h)
    return keras.layers.Dense(outputs)(h)


obs_in = keras.Input((3,))
actor = keras.Model(obs_in, mlp(obs_in, 2))  # mean and log std of the pre-tanh action


def make_critic():
    obs, action = keras.Input((3,)), keras.Input((1,))
    return keras.Model([obs, action], mlp(keras.layers.Concatenate()([obs, action]), 1))


critics = [make_critic(), make_critic()]
targets = [make_critic(), make_critic()]
for target, critic in zip(targets, critics, strict=True):
    update_target(target, critic)
log_alpha = keras.Variable(0.0, name="log_alpha")
actor_opt, critic_opt, alpha_opt = (keras.optimizers.Adam(3e-4) for _ in range(3))
critic_vars = [v for c in critics for v in c.trainable_variables]
actor_opt.build(actor.trainable_variables)
critic_opt.build(critic_vars)
alpha_opt.build([log_alpha])
seeds = keras.random.SeedGenerator(0)


def sample_action(obs):
    mean, log_std = keras.ops.split(actor(obs), 2, axis=-1)
    log_std = keras.ops.clip(log_std, -20.0, 2.0)
    noise = keras.random.normal(keras.ops.shape(mean), seed=seeds)
    pre_tanh = mean + keras.ops.exp(log_std) * noise
    action = keras.ops.tanh(pre_tanh)
    log_prob = -0.5 * (noise**2 + 2.0 * log_std + np.log(2.0 * np.pi))
    log_prob -= keras.ops.log(1.0 - action**2 + 1e-6)
    return MAX_ACTION * action, keras.ops.sum(log_prob, axis=-1)  # [B, 1], [B]


def update_fn(batch):
    obs, action, next_obs = batch["obs"], batch["action"], batch["next_obs"]
    alpha = keras.ops.exp(log_alpha)
    next_action, next_log_prob = sample_action(next_obs)
    next_q = keras.ops.minimum(
        *[keras.ops.squeeze(t([next_obs, next_action]), -1) for t in targets]
    )
    not_done = 1.0 - keras.ops.cast(batch["terminated"], "float32")
    y = batch["reward"] + GAMMA * not_done * (next_q - alpha * next_log_prob)  # [B]
    with tf.GradientTape() as tape:
        critic_loss = sum(
            keras.ops.mean((keras.ops.squeeze(c([obs, action]), -1) - y) ** 2) for c in critics
        )
    critic_opt.apply_gradients(
        zip(tape.gradient(critic_loss, critic_vars), critic_vars, strict=True)
    )
    with tf.GradientTape() as tape:
        new_action, log_prob = sample_action(obs)
        q = keras.ops.minimum(*[keras.ops.squeeze(c([obs, new_action]), -1) for c in critics])
        actor_loss = keras.ops.mean(alpha * log_prob - q)
    grads = tape.gradient(actor_loss, actor.trainable_variables)
    actor_opt.apply_gradients(zip(grads, actor.trainable_variables, strict=True))
    with tf.GradientTape() as tape:  # target entropy: -(action dimensions)
        alpha_loss = -keras.ops.mean(log_alpha * keras.ops.stop_gradient(log_prob - 1.0))
    alpha_opt.apply_gradients(zip(tape.gradient(alpha_loss, [log_alpha]), [log_alpha], strict=True))
    for target, critic in zip(targets, critics, strict=True):
        update_target(target, critic, TAU)
    return {"critic_loss": critic_loss, "actor_loss": actor_loss, "alpha": alpha}


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
        action = rng.uniform(-MAX_ACTION, MAX_ACTION, size=1).astype(np.float32)
    else:
        action = np.asarray(sample_action(obs[None])[0][0])
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

returns = []
for episode in range(10):
    obs, _ = env.reset(seed=1000 + episode)
    done, total = False, 0.0
    while not done:
        mean = keras.ops.split(actor(obs[None]), 2, axis=-1)[0]
        obs, reward, terminated, truncated, _ = env.step(np.asarray(MAX_ACTION * np.tanh(mean[0])))
        total += reward
        done = terminated or truncated
    returns.append(total)
print(f"SAC Pendulum: greedy return {np.mean(returns):.1f} over 10 episodes")
