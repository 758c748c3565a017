"""DQN on Atari (Mnih et al. 2015, Nature): the Nature CNN over a frame table.

Reads top to bottom: the agent, the training loop, the served form (`FrameDQN`).

One env (``envs.make_atari_env``: frame skip 4, 84x84 grey, up to 30 no-ops) writes its steps
in order into a `make_frame_table` (`experience.SegmentWriter`), storing each uint8 frame once;
`rg.FrameStack` rebuilds the ``[B, 4, 84, 84]`` uint8 stacks in the graph (1e6 rows: 7.07 GB).
Training marks a lost life terminal (the game plays on, as SB3's ``EpisodicLifeEnv``) and clips
rewards with ``np.sign``; the learning curve and evaluation report raw full-game returns.
Defaults: the Nature / rl-zoo3 Atari DQN hyperparameters, but a replay of 1e5 rows
(``--buffer-size 1000000`` for the paper's).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.samplers import make_frame_table
from replaygpu.service.config import AgentSettings, ServerConfig
from replaygpu.table import Table

from ..builder import Builder
from ..configs import next_chunk
from ..distributed.experience import SegmentWriter, play, segment_client_config
from ..envs import make_atari_env
from ..networks import nature_cnn
from ..policies import epsilon_greedy_actions
from ..progress import NullRecorder, Recorder, TrainResult, TrainTimer
from ..rollouts import EpisodeStats
from ..runs import RunControl, checkpoint_when_due, resume, stopped_early
from .agent import QAgent, distribution
from .config import ApexAtariConfig, AtariDQNConfig

with contextlib.suppress(ImportError):  # without ale-py, make_atari_env says how to install it
    import ale_py

    gym.register_envs(ale_py)  # the ALE/* ids, for `replaygpu eval`'s gym.make

FRAME_SHAPE = (84, 84)


def make_frame_sampler(table: rg.ReplayTable, config: AtariDQNConfig) -> rg.Sampler:
    """Uniform or prioritized, with n-step returns. A sample's priority is its row's (that of
    ``obs``'s newest frame); final rows are never drawn."""
    view = rg.FrameStack(config.frame_stack, n_step=config.n_step, gamma=config.gamma)
    return rg.Sampler(table, distribution(config), view, seed=config.seed)


class AtariDQN(QAgent):
    """`QAgent` with Nature CNNs on uint8 frame stacks (scaled to [0, 1] in the graph)."""

    def __init__(self, num_actions: int, config: AtariDQNConfig) -> None:
        shape = (config.frame_stack, *FRAME_SHAPE)
        q = nature_cnn(shape, num_actions, seed=config.seed, name="q")
        target = nature_cnn(shape, num_actions, seed=config.seed, name="q_target")
        super().__init__(q, target, num_actions, config, name="atari_dqn")
        self.act = tf.function(
            lambda obs: tf.argmax(self.q(obs), axis=1),
            input_signature=[tf.TensorSpec([None, *shape], tf.uint8)],
        )

    def inputs(self, obs: tf.Tensor) -> tf.Tensor:
        """``[B, k, 84, 84]`` uint8 stacks, as the Nature CNN takes them."""
        return obs


def xla(config: AtariDQNConfig | ApexAtariConfig, table: Table) -> bool:
    """XLA's CPU convolutions ran the Nature CNN update 6x slower: ``auto`` is on for GPU tables."""
    return config.jit_compile == "on" or (config.jit_compile == "auto" and "GPU" in table.device)


def make_agent(config: AtariDQNConfig, env: gym.Env) -> AtariDQN:
    """The agent for ``env`` (its networks; what ``replaygpu eval`` restores)."""
    return AtariDQN(int(env.action_space.n), config)


def greedy_policy(agent: AtariDQN) -> Callable[[np.ndarray], np.ndarray]:
    """``[B, k, 84, 84]`` uint8 stacks ``-> [B]`` int64 greedy actions."""
    return lambda obs: agent.act(np.asarray(obs, np.uint8)).numpy()


def evaluate_agent(config: AtariDQNConfig, agent: AtariDQN, episodes: int, seed: int) -> np.ndarray:
    """Raw returns of ``episodes`` full games, epsilon-greedy with ``config.eval_epsilon``."""
    env = make_atari_env(config.env_id, seed, config.repeat_action_probability)
    act, rng = greedy_policy(agent), np.random.default_rng(seed)
    writer = SegmentWriter(config.frame_stack)
    returns = np.zeros(episodes, np.float64)
    try:
        for ep in range(episodes):
            frame, _ = env.reset(seed=seed + ep)
            writer.start(frame)
            done = False
            while not done:
                stack = writer.stack[None]
                action = epsilon_greedy_actions(
                    act, stack, config.eval_epsilon, env.action_space.n, rng
                )
                frame, reward, terminated, truncated, _ = env.step(int(action[0]))
                writer.stack = np.concatenate([writer.stack[1:], frame[None]])
                returns[ep] += float(reward)
                done = terminated or truncated
    finally:
        env.close()
    return returns


def train(
    config: AtariDQNConfig, recorder: Recorder | None = None, run: RunControl | None = None
) -> TrainResult:
    """Train with one env, then evaluate ``eval_episodes`` games. With ``run``: resume (a new
    game; the table keeps its rows), save periodically, checkpoint and stop on SIGTERM / Ctrl-C.

    Raises:
        ConfigError: ale-py missing or not an ALE game id.
    """
    recorder = recorder or NullRecorder()
    env = make_atari_env(config.env_id, config.seed, config.repeat_action_probability)
    num_actions = int(env.action_space.n)
    table = make_frame_table(config.buffer_size, FRAME_SHAPE, device=config.device or None)
    with tf.device(table.device):
        agent = AtariDQN(num_actions, config)
    sampler = make_frame_sampler(table, config)
    learner = rg.Learner(
        table,
        sampler,
        agent.update,
        config.batch_size,
        jit_compile=xla(config, table),
        chunk_steps=config.gradient_steps,
    )
    stats = EpisodeStats(1)
    rng, loop, env_steps, last_sync = resume(
        run, config.seed, learner, table=table, sampler=sampler, agent=agent
    )
    act = greedy_policy(agent)
    writer = SegmentWriter(config.frame_stack)
    frame, info = env.reset(seed=config.seed + env_steps)
    writer.start(frame)
    lives = info.get("lives", 0)
    timer, metrics = TrainTimer(env_steps), {}
    next_report = env_steps + config.report_interval
    while env_steps < config.steps:
        size, sgd_steps = next_chunk(config, env_steps)  # the last chunk: what is left of steps
        for _ in range(size):
            eps = config.epsilon(env_steps)
            action = epsilon_greedy_actions(act, writer.stack[None], eps, num_actions, rng)[0]
            reward, done, lives = play(env, writer, int(action), lives, config)
            env_steps += 1
            for episodic_return, length in stats.step(np.array([reward]), np.array([done])):
                recorder.episode(env_steps, episodic_return, length)
        rows = writer.take_rows()
        if rows is not None:
            table.append(rows)
        if env_steps > config.learning_starts:
            metrics = timer.train(learner, sgd_steps)
            if env_steps - last_sync >= config.target_update_interval:
                agent.sync_target()
                last_sync = env_steps
        if env_steps >= next_report or env_steps >= config.steps:
            next_report = env_steps + config.report_interval
            if metrics:
                metrics.pop("steps", None)
                metrics["charts/epsilon"] = config.epsilon(env_steps)
                recorder.metrics(env_steps, metrics)
            recorder.progress(env_steps, int(learner.steps.numpy()), stats.recent_mean)
        if checkpoint_when_due(
            run, loop, env_steps, last_sync, rng, final=env_steps >= config.steps
        ):
            break
    env.close()
    return timer.finish(
        stopped_early(run, env_steps, config.steps),
        lambda: evaluate_agent(config, agent, config.eval_episodes, seed=config.seed + 10_000),
        env_steps,
        int(learner.steps.numpy()),
        recorder,
    )


class FrameDQN(Builder):
    """Served Ape-X DQN on Atari frames (`ApexAtariConfig`; ``demo apex-breakout``): a frame
    table, the Nature CNN; actors send whole table episodes (`distributed.experience`)."""

    syncs_target = True

    def make_table(
        self, config: ApexAtariConfig, env: gym.Env
    ) -> tuple[Table, contextlib.AbstractContextManager[Any]]:
        table = make_frame_table(config.buffer_size, FRAME_SHAPE, device=config.device or None)
        return table, tf.device(table.device)

    def make_agent(self, config: ApexAtariConfig, env: gym.Env) -> AtariDQN:
        return AtariDQN(int(env.action_space.n), config.dqn_config)

    def make_sampler(self, config: ApexAtariConfig, table: Table) -> rg.Sampler:
        return make_frame_sampler(table, config.dqn_config)

    def policy(self, agent: AtariDQN) -> Any:
        # the `nature_cnn` model's weights order, what `policies.nature_cnn_q_values` reads
        return lambda: agent.q.weights

    def actor_settings(self, config: ApexAtariConfig) -> AgentSettings:
        return config.actor_settings

    def jit_compile(self, config: ApexAtariConfig, table: Table) -> bool:
        return xla(config, table)

    def server_config(self, config: ApexAtariConfig, given: ServerConfig | None) -> ServerConfig:
        # an actor sends whole segments of up to segment_steps frames in one request
        request = segment_client_config(config.segment_steps).max_message_bytes
        base = given or ServerConfig()
        return dataclasses.replace(
            base, max_message_bytes=max(base.max_message_bytes, request, 64 << 20)
        )

    def evaluate(
        self, config: ApexAtariConfig, agent: AtariDQN, episodes: int, seed: int
    ) -> np.ndarray:
        return evaluate_agent(config.dqn_config, agent, episodes, seed)
