"""What a served learner is built from, per algorithm: one `learner.LearnerService` runs every
agent by asking the builder of its config for the parts.

=====================  =============  ==================================  =======================
config                 builder        table                               sampler
=====================  =============  ==================================  =======================
`ApexConfig`           `VectorDQN`    transitions + the actor env's       Uniform / Prioritized x
(``--agent dqn``)                     stream id (sharded by it with       NStep (3-step returns)
                                      ``--devices``)
`SACLearnerConfig`     `ServedSAC`    transitions (sharded with           Uniform x Transition
(``--agent sac``)                     ``--devices``)
`ApexAtariConfig`      `FrameDQN`     a frame table (each 84x84 frame     Uniform / Prioritized x
(``--agent dqn``,                     once)                               FrameStack(4, n_step)
an ALE env)
`R2D2LearnerConfig`    `ServedR2D2`   steps + the LSTM state, each        Prioritized x Sequence
(``--agent r2d2``)                    sequence a block of its own         (burn-in, stored state)
=====================  =============  ==================================  =======================

A builder also names the weights actors pull, the actor settings that ``replaygpu actor ADDRESS``
learns from ``Info`` (`ActorConfig.to_settings`), the server's message limit, whether the run syncs
a target network, and how the greedy policy is evaluated. Adding an algorithm to the learner service
is one config, one builder here and one row in `registry.ALGORITHMS`; the service, its CLI,
checkpoints and the demos' driver need no change.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents import apex_config, atari, dqn, r2d2, sac
from replaygpu.agents.actor import STREAM_FIELD
from replaygpu.agents.actor_config import ActorConfig
from replaygpu.agents.apex_atari_config import ApexAtariConfig
from replaygpu.agents.apex_config import ApexConfig
from replaygpu.agents.envs import evaluate
from replaygpu.agents.frame_actor import segment_client_config
from replaygpu.agents.r2d2_config import R2D2LearnerConfig
from replaygpu.agents.registry import builder_for
from replaygpu.agents.sac_config import SACLearnerConfig
from replaygpu.samplers import make_frame_table
from replaygpu.service.config import AgentSettings, ServerConfig
from replaygpu.sharded import mirrored_strategy
from replaygpu.specs import specs_from_env

Table = Any  # rg.ReplayTable or rg.ShardedReplayTable


class Builder:
    """The parts of a served run of one algorithm (see the module doc). Subclasses override
    what differs; every method takes the run's config."""

    #: whether the service copies the online network into a target every
    #: ``config.target_update_interval`` SGD steps
    syncs_target: ClassVar[bool] = False
    #: the update's metric that Info, /metrics and the progress line show as the loss
    loss_key: ClassVar[str] = "losses/td_loss"

    def check_env(self, env_id: str) -> gym.Env:
        """The env the algorithm runs (made to read its spaces; close it)."""
        raise NotImplementedError

    def make_table(
        self, config: Any, env: gym.Env
    ) -> tuple[Table, contextlib.AbstractContextManager[Any]]:
        """The replay table, and the scope the networks are made in (a strategy's, or the
        table's device)."""
        raise NotImplementedError

    def make_agent(self, config: Any, env: gym.Env) -> Any:
        """The networks, optimizer and in-graph update (``agent.update``)."""
        raise NotImplementedError

    def make_sampler(self, config: Any, table: Table) -> rg.Sampler:
        raise NotImplementedError

    def policy(self, agent: Any) -> Any:
        """What ``publish_weights`` snapshots for the actors."""
        raise NotImplementedError

    def actor_settings(self, config: Any) -> AgentSettings:
        """The settings document its actors run (`ActorConfig.to_settings`)."""
        raise NotImplementedError

    def jit_compile(self, config: Any, table: Table) -> bool:
        return bool(config.jit_compile)

    def server_config(self, config: Any, given: ServerConfig | None) -> ServerConfig | None:
        """The server's config: ``given`` (None: the defaults), raised where the algorithm's
        requests need it."""
        return given

    def greedy_policy(self, agent: Any) -> Any:
        """The greedy numpy policy ``obs [B, ...] -> actions [B, ...]``."""
        raise NotImplementedError

    def evaluate(self, config: Any, agent: Any, episodes: int, seed: int) -> np.ndarray:
        """Returns of ``episodes`` greedy episodes (seeds ``seed + i``)."""
        return evaluate(self.greedy_policy(agent), config.env_id, episodes, seed)


class VectorBuilder(Builder):
    """Transitions of vector observations, on one device or one shard per device."""

    #: an integer field naming each row's actor env (n-step returns stay in one env)
    stream_field: ClassVar[str] = ""

    def make_table(
        self, config: Any, env: gym.Env
    ) -> tuple[Table, contextlib.AbstractContextManager[Any]]:
        spec = dict(specs_from_env(env))
        if self.stream_field:
            spec[self.stream_field] = tf.TensorSpec([], tf.int64, name=self.stream_field)
        if config.devices and config.device:
            raise rg.ConfigError(
                f"device {config.device!r} and devices {config.devices!r}: give one of them"
            )
        if config.devices:  # one replay shard per device; n-step streams stay in their shard
            strategy = mirrored_strategy(config.devices)
            shard_by = self.stream_field or None
            table = rg.ShardedReplayTable(spec, config.buffer_size, strategy, shard_by)
            return table, strategy.scope()
        table = rg.ReplayTable(spec, config.buffer_size, device=config.device or None)
        return table, tf.device(table.device)

    def settings(self, config: Any, agent: Literal["dqn", "sac"]) -> AgentSettings:
        actor = ActorConfig(
            env_id=config.env_id,
            agent=agent,
            weight_pull_interval=config.weight_pull_interval,
            num_envs=config.actor_envs,
            seed=config.seed,
            num_actors=config.num_actors,
        )
        return actor.to_settings(agent)


class VectorDQN(VectorBuilder):
    """Ape-X DQN on vector observations: `ApexConfig`."""

    syncs_target = True
    stream_field = STREAM_FIELD

    def check_env(self, env_id: str) -> gym.Env:
        return dqn.check_env(env_id)

    def make_agent(self, config: ApexConfig, env: gym.Env) -> dqn.DQN:
        return apex_config.make_agent(config, env)

    def make_sampler(self, config: ApexConfig, table: Table) -> rg.Sampler:
        distribution = (
            rg.Prioritized(config.priority_alpha, config.priority_beta)
            if config.prioritized
            else rg.Uniform()
        )
        # Actors' batches interleave in the table; the stream field keeps a return in one env.
        view = rg.NStep(config.n_step, config.gamma, stream_field=STREAM_FIELD)
        return rg.Sampler(table, distribution, view, seed=config.seed)

    def policy(self, agent: dqn.DQN) -> Any:
        return agent.q

    def actor_settings(self, config: ApexConfig) -> AgentSettings:
        return self.settings(config, "dqn")

    def greedy_policy(self, agent: dqn.DQN) -> Any:
        return dqn.greedy_policy(agent)


class ServedSAC(VectorBuilder):
    """SAC served to remote actors: `SACLearnerConfig`."""

    loss_key = "losses/critic_loss"

    def check_env(self, env_id: str) -> gym.Env:
        return sac.check_env(env_id)

    def make_agent(self, config: SACLearnerConfig, env: gym.Env) -> sac.SAC:
        return sac.make_agent(config, env)

    def make_sampler(self, config: SACLearnerConfig, table: Table) -> rg.Sampler:
        return rg.Sampler(table, seed=config.seed)

    def policy(self, agent: sac.SAC) -> Any:
        return agent.actor

    def actor_settings(self, config: SACLearnerConfig) -> AgentSettings:
        return self.settings(config, "sac")

    def greedy_policy(self, agent: sac.SAC) -> Any:
        return sac.greedy_policy(agent)


class FrameDQN(Builder):
    """Ape-X DQN on Atari frames: `ApexAtariConfig`, a frame table and the Nature CNN."""

    syncs_target = True

    def check_env(self, env_id: str) -> gym.Env:
        return atari.check_env(env_id)

    def make_table(
        self, config: ApexAtariConfig, env: gym.Env
    ) -> tuple[Table, contextlib.AbstractContextManager[Any]]:
        table = make_frame_table(
            config.buffer_size, atari.FRAME_SHAPE, device=config.device or None
        )
        return table, tf.device(table.device)

    def make_agent(self, config: ApexAtariConfig, env: gym.Env) -> atari.AtariDQN:
        return atari.AtariDQN(int(env.action_space.n), config.dqn_config)

    def make_sampler(self, config: ApexAtariConfig, table: Table) -> rg.Sampler:
        return atari.make_frame_sampler(table, config.dqn_config)

    def policy(self, agent: atari.AtariDQN) -> Any:
        # `NatureCNN.weights` order, what `policies.nature_cnn_q_values` reads
        return lambda: agent.q.weights

    def actor_settings(self, config: ApexAtariConfig) -> AgentSettings:
        return config.actor_settings

    def jit_compile(self, config: ApexAtariConfig, table: Table) -> bool:
        # XLA's CPU convolutions ran the Nature CNN update 6x slower: auto is on for GPUs only
        return config.jit_compile == "on" or (
            config.jit_compile == "auto" and "GPU" in table.device
        )

    def server_config(self, config: ApexAtariConfig, given: ServerConfig | None) -> ServerConfig:
        # an actor sends whole segments of up to segment_steps frames in one request
        request = segment_client_config(config.segment_steps).max_message_bytes
        base = given or ServerConfig()
        return dataclasses.replace(
            base, max_message_bytes=max(base.max_message_bytes, request, 64 << 20)
        )

    def greedy_policy(self, agent: atari.AtariDQN) -> Any:
        return atari.greedy_policy(agent)

    def evaluate(
        self, config: ApexAtariConfig, agent: atari.AtariDQN, episodes: int, seed: int
    ) -> np.ndarray:
        return atari.evaluate_agent(config.dqn_config, agent, episodes, seed)


class ServedR2D2(Builder):
    """R2D2 on the overlapping sequences that recurrent actors send
    (`recurrent_actor.RecurrentExperience`): `R2D2LearnerConfig`. Each sequence is a block of
    rows whose first row holds the LSTM state (`r2d2.STATE_STORED` marks it), so the
    prioritized `rg.Sequence` view starts windows there and never runs past a block."""

    def check_env(self, env_id: str) -> gym.Env:
        return r2d2.check_env(env_id)

    def make_table(
        self, config: R2D2LearnerConfig, env: gym.Env
    ) -> tuple[Table, contextlib.AbstractContextManager[Any]]:
        spec = r2d2.table_spec(config, env)
        table = rg.ReplayTable(spec, config.buffer_size, device=config.device or None)
        return table, tf.device(table.device)

    def make_agent(self, config: R2D2LearnerConfig, env: gym.Env) -> r2d2.R2D2:
        return r2d2.make_agent(config, env)

    def make_sampler(self, config: R2D2LearnerConfig, table: Table) -> rg.Sampler:
        # the table is the config's: its state field is the network's
        return r2d2.sequence_sampler(config, table, start_field=r2d2.STATE_STORED)

    def policy(self, agent: r2d2.R2D2) -> Any:
        return lambda: agent.q.weights  # the order `policies.numpy_lstm_step` reads

    def actor_settings(self, config: R2D2LearnerConfig) -> AgentSettings:
        actor = ActorConfig(
            env_id=config.env_id,
            weight_pull_interval=config.weight_pull_interval,
            num_envs=config.actor_envs,
            seed=config.seed,
            num_actors=config.num_actors,
            sequence_period=config.period,
            sequence_length=config.sequence_length,
        )
        return actor.to_settings("r2d2")

    def evaluate(
        self, config: R2D2LearnerConfig, agent: r2d2.R2D2, episodes: int, seed: int
    ) -> np.ndarray:
        return r2d2.evaluate_agent(config, agent, episodes, seed)


@dataclasses.dataclass(frozen=True)
class Parts:
    """What a served run of one config trains: its builder, table, agent and sampler."""

    builder: Builder
    table: Table
    agent: Any
    sampler: rg.Sampler


def make_parts(config: Any) -> Parts:
    """The builder of ``config``'s algorithm and the table, agent and sampler it makes (the
    agent in the table's scope: its device, or its strategy).

    Raises:
        ConfigError: for a config no builder takes, or an env the algorithm cannot run.
    """
    builder = builder_for(config)
    probe = builder.check_env(config.env_id)
    table, scope = builder.make_table(config, probe)
    with scope:
        agent = builder.make_agent(config, probe)
    probe.close()
    return Parts(builder, table, agent, builder.make_sampler(config, table))
