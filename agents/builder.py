"""The Builder protocol: what an algorithm hands a runner (its table, agent, sampler, actor
settings and evaluation), and the parts and fused learner a served run trains with them.

A served algorithm subclasses `Builder` (vector observations: `VectorBuilder`) beside its agent;
`registry.ALGORITHMS` names it, and `LearnerService` (`distributed.learner`) runs any of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.service.config import AgentSettings, ServerConfig
from replaygpu.sharded import mirrored_strategy
from replaygpu.specs import specs_from_env
from replaygpu.table import Table

from .distributed.actor_config import ActorConfig
from .registry import builder_for
from .rollouts import evaluate


class Builder:
    """The parts of a served run of one algorithm; subclasses override what differs."""

    #: copy the online network to a target every ``config.target_update_interval`` SGD steps
    syncs_target: ClassVar[bool] = False
    #: the update's metric that Info, /metrics and the progress line show as the loss
    loss_key: ClassVar[str] = "losses/td_loss"
    #: the agent of the settings document its actors run (`ActorConfig.to_settings`)
    agent: ClassVar[str] = "dqn"

    def make_table(
        self, config: Any, env: gym.Env
    ) -> tuple[Table, contextlib.AbstractContextManager[Any]]:
        """The table and the scope for the networks (a strategy's, or the table's device)."""
        raise NotImplementedError

    def make_agent(self, config: Any, env: gym.Env) -> Any:
        """The networks, optimizer and in-graph update (``agent.update``)."""
        raise NotImplementedError

    def make_sampler(self, config: Any, table: Table) -> rg.Sampler:
        raise NotImplementedError

    def policy(self, agent: Any) -> Any:
        """What ``publish_weights`` snapshots for the actors."""
        raise NotImplementedError

    def actor_fields(self, config: Any) -> dict[str, Any]:
        """The `ActorConfig` fields of its actors beyond env, seed and sizes."""
        return {}

    def actor_settings(self, config: Any) -> AgentSettings:
        """The settings document its actors run (`ActorConfig.to_settings`)."""
        fields = self.actor_fields(config)
        return ActorConfig.settings_of(config, self.agent, num_envs=config.actor_envs, **fields)

    def jit_compile(self, config: Any, table: Table) -> bool:
        return bool(config.jit_compile)

    def server_config(self, config: Any, given: ServerConfig | None) -> ServerConfig | None:
        """``given`` (None: the defaults), raised where the algorithm's requests need it."""
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

    def actor_fields(self, config: Any) -> dict[str, Any]:
        return {"agent": self.agent}


@dataclasses.dataclass(frozen=True)
class Parts:
    """What a served run of one config trains: its builder, table, agent and sampler."""

    builder: Builder
    table: Table
    agent: Any
    sampler: rg.Sampler


def make_parts(config: Any) -> Parts:
    """``config``'s builder and its parts (the agent made in the table's device or strategy).

    Raises:
        ConfigError: a config no builder takes, or an env the algorithm cannot run.
    """
    builder = builder_for(config)
    probe = type(config).ENV_CHECK(config.env_id)
    table, scope = builder.make_table(config, probe)
    with scope:
        agent = builder.make_agent(config, probe)
    probe.close()
    return Parts(builder, table, agent, builder.make_sampler(config, table))


def make_learner(config: Any, parts: Parts) -> rg.Learner:
    """The fused learner a served run of ``config`` trains: ``steps_per_call`` steps a call,
    under the ``samples_per_insert`` rate limiter, in counted loops of that many steps."""
    limiter = rg.SampleToInsertRatio(
        config.samples_per_insert,
        min_size_to_sample=config.learning_starts,
        error_buffer=config.batch_size * config.steps_per_call,
    )
    return rg.Learner(
        parts.table,
        parts.sampler,
        parts.agent.update,
        config.batch_size,
        limiter,
        jit_compile=parts.builder.jit_compile(config, parts.table),
        chunk_steps=config.steps_per_call,
    )
