"""Soft actor-critic for Box actions: twin critics, a tanh-squashed Gaussian actor and automatic
entropy tuning. Reads top to bottom: the agent (networks, in-graph update), the training loop
(as `dqn.agent`'s: a numpy actor, one append and one `Learner.train` call per chunk).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.specs import host_spec, specs_from_env
from replaygpu.table import Table
from replaygpu.targets import update_target

from .. import runs
from ..builder import VectorBuilder
from ..configs import next_chunk
from ..envs import box_actions_env as check_env
from ..envs import make_vector_env
from ..networks import Adam, mlp
from ..policies import LOG_STD_MAX, LOG_STD_MIN, squashed_gaussian_policy
from ..progress import NullRecorder, Recorder, TrainResult, TrainTimer
from ..rollouts import ChunkCollector, evaluate
from ..runs import RunControl
from .config import SACConfig, SACLearnerConfig


class SAC(tf.Module):
    """Actor, twin critics with Polyak targets, entropy coefficient, and the in-graph update;
    ``low``, ``high``: ``[act_dim]`` bounds of the Box action space."""

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray, config: SACConfig):
        super().__init__(name="sac")
        act_dim = len(low)
        hidden = list(config.hidden_sizes)
        self.config = config
        self.scale = ((high - low) / 2.0).astype(np.float32)
        self.bias = ((high + low) / 2.0).astype(np.float32)
        self.actor = mlp([obs_dim, *hidden, 2 * act_dim], seed=config.seed, name="actor")
        critic = [obs_dim + act_dim, *hidden, 1]  # each target starts as its critic: one seed
        self.critics = [mlp(critic, config.seed + 1 + i, name=f"critic{i}") for i in range(2)]
        self.targets = [mlp(critic, config.seed + 1 + i, name=f"target{i}") for i in range(2)]
        self.critic_weights = self.critics[0].weights + self.critics[1].weights
        self.target_weights = self.targets[0].weights + self.targets[1].weights
        self.log_alpha = tf.Variable(np.log(config.initial_alpha), dtype=tf.float32)
        self.target_entropy = -config.target_entropy_scale * act_dim
        lr = config.learning_rate
        self.actor_opt = Adam(self.actor.weights, lr, name="actor_adam")
        self.critic_opt = Adam(self.critic_weights, lr, name="critic_adam")
        self.alpha_opt = Adam([self.log_alpha], lr, name="alpha_adam")
        self.noise = tf.random.Generator.from_seed(config.seed + 100)

    def q_values(
        self, nets: list[keras.Model], obs: tf.Tensor, action: tf.Tensor
    ) -> list[tf.Tensor]:
        """``[B]`` Q-values of each critic in ``nets``; actions in [-1, 1] units."""
        x = tf.concat([obs, action], axis=1)
        return [tf.squeeze(net(x), axis=1) for net in nets]

    def sample_action(self, obs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(a [B, act_dim] in [-1, 1], log pi(a|s) [B])`` by the reparameterisation trick."""
        mean, log_std = tf.split(self.actor(obs), 2, axis=1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (1.0 + tf.tanh(log_std))
        std = tf.exp(log_std)
        eps = self.noise.normal(tf.shape(mean))
        u = mean + std * eps
        a = tf.tanh(u)
        log_prob = -0.5 * tf.square(eps) - log_std - 0.5 * np.log(2.0 * np.pi)
        log_prob -= tf.math.log(self.scale * (1.0 - tf.square(a)) + 1e-6)  # tanh + scale Jacobian
        return a, tf.reduce_sum(log_prob, axis=1)

    def update(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """One SGD step of critics, actor and entropy coefficient; runs inside `Learner.train`."""
        obs = tf.cast(batch["obs"], tf.float32)
        next_obs = tf.cast(batch["next_obs"], tf.float32)
        action = (tf.cast(batch["action"], tf.float32) - self.bias) / self.scale
        alpha = tf.exp(self.log_alpha)

        next_action, next_log_prob = self.sample_action(next_obs)
        next_q = tf.minimum(*self.q_values(self.targets, next_obs, next_action))
        not_terminal = 1.0 - tf.cast(batch["terminated"], tf.float32)  # bootstrap on truncation
        target = batch["reward"] + self.config.gamma * not_terminal * (
            next_q - alpha * next_log_prob
        )
        with tf.GradientTape() as tape:
            q1, q2 = self.q_values(self.critics, obs, action)
            critic_loss = 0.5 * (
                tf.reduce_mean(tf.square(q1 - target)) + tf.reduce_mean(tf.square(q2 - target))
            )
        self.critic_opt.apply(tape.gradient(critic_loss, self.critic_weights))

        with tf.GradientTape() as tape:
            new_action, log_prob = self.sample_action(obs)
            q_new = tf.minimum(*self.q_values(self.critics, obs, new_action))
            actor_loss = tf.reduce_mean(alpha * log_prob - q_new)
        self.actor_opt.apply(tape.gradient(actor_loss, self.actor.weights))

        with tf.GradientTape() as tape:
            alpha_loss = -tf.reduce_mean(
                self.log_alpha * tf.stop_gradient(log_prob + self.target_entropy)
            )
        self.alpha_opt.apply(tape.gradient(alpha_loss, [self.log_alpha]))

        update_target(self.target_weights, self.critic_weights, self.config.tau)
        return {
            "losses/critic_loss": critic_loss,
            "losses/actor_loss": actor_loss,
            "losses/alpha_loss": alpha_loss,
            "losses/alpha": alpha,
            "losses/q_values": tf.reduce_mean(q1),
            "losses/entropy": -tf.reduce_mean(log_prob),
        }


def make_agent(config: SACConfig, env: gym.Env) -> SAC:
    """The agent for ``env`` (its networks; what ``replaygpu eval`` restores)."""
    space = env.action_space
    obs_dim = int(np.prod(env.observation_space.shape))
    return SAC(obs_dim, space.low.astype(np.float64), space.high.astype(np.float64), config)


def greedy_policy(agent: SAC) -> Callable[[np.ndarray], np.ndarray]:
    """The agent's greedy (mean-action) numpy policy."""
    return squashed_gaussian_policy(agent.actor.get_weights(), agent.scale, agent.bias)


def evaluate_agent(config: SACConfig, agent: SAC, episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes of ``agent`` (``replaygpu eval``)."""
    return evaluate(greedy_policy(agent), config.env_id, episodes, seed)


def train(
    config: SACConfig, recorder: Recorder | None = None, run: RunControl | None = None
) -> TrainResult:
    """Train SAC on ``config.env_id``, then evaluate the greedy (mean) action; with ``run``,
    resumably (as `dqn.train`). Raises ConfigError unless the actions are a bounded Box."""
    recorder = recorder or NullRecorder()
    check_env(config.env_id).close()
    env = make_vector_env(config.env_id, config.num_envs, config.seed)
    space = env.single_action_space
    n = config.num_envs
    spec = specs_from_env(env)
    table = rg.ReplayTable(spec, config.buffer_size, device=config.device or None)
    obs_dim = int(np.prod(env.single_observation_space.shape))
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)
    with tf.device(table.device):
        agent = SAC(obs_dim, low, high, config)
    sampler = rg.Sampler(table, seed=config.seed)
    learner = rg.Learner(
        table,
        sampler,
        agent.update,
        batch_size=config.batch_size,
        jit_compile=config.jit_compile,
        chunk_steps=config.gradient_steps,
    )
    rng, loop, env_steps, _ = runs.resume(
        run, config.seed, learner, table=table, sampler=sampler, agent=agent
    )
    acting = ChunkCollector(
        env, host_spec(spec), config.train_freq, recorder.episode, config.seed, env_steps
    )
    act = squashed_gaussian_policy(agent.actor.get_weights(), agent.scale, agent.bias, rng)

    def policy(obs: np.ndarray, step: int) -> np.ndarray:
        """Uniform random actions before learning_starts, then the sampled policy."""
        if step < config.learning_starts:
            return rng.uniform(low, high, size=(n, len(low))).astype(np.float32)
        return act(obs)

    timer = TrainTimer(env_steps)
    while env_steps < config.steps:
        size, sgd_steps = next_chunk(config, env_steps)
        table.append(acting.collect(policy, size))
        env_steps = acting.env_steps

        if env_steps >= config.learning_starts:  # one fused call, then a new actor mirror
            metrics = timer.train(learner, sgd_steps)
            weights = agent.actor.get_weights()
            act = squashed_gaussian_policy(weights, agent.scale, agent.bias, rng)
            metrics.pop("steps")
            recorder.metrics(env_steps, metrics)
        recorder.progress(env_steps, int(learner.steps.numpy()), acting.recent_return)
        if runs.checkpoint_when_due(run, loop, env_steps, 0, rng, final=env_steps >= config.steps):
            break
    acting.close()
    greedy = greedy_policy(agent)
    return timer.finish(
        runs.stopped_early(run, env_steps, config.steps),
        lambda: evaluate(greedy, config.env_id, config.eval_episodes, seed=config.seed + 10_000),
        env_steps,
        int(learner.steps.numpy()),
        recorder,
    )


class ServedSAC(VectorBuilder):
    """SAC served to remote actors: `SACLearnerConfig`."""

    loss_key = "losses/critic_loss"
    agent = "sac"
    make_agent = staticmethod(make_agent)
    greedy_policy = staticmethod(greedy_policy)

    def make_sampler(self, config: SACLearnerConfig, table: Table) -> rg.Sampler:
        return rg.Sampler(table, seed=config.seed)

    def policy(self, agent: SAC) -> Any:
        return agent.actor
