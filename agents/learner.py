"""The standalone learner: a served replay table, an agent's update under a rate limiter, weights
for the actors, checkpoints. ``replaygpu learner`` runs it; ``demo apex-cartpole`` runs it with
actor processes beside it.

Reads top to bottom: the SAC learner's config (DQN's is `ApexConfig`), then `LearnerService`:
build the table, the agent and the `rg.Learner`; restore the newest checkpoint; serve with the
`rg.ActorSettings` that tell ``replaygpu actor ADDRESS`` what to run; then `LearnerService.step`
commits the actors' appends and trains, until `LearnerService.done` (the run's ``steps``
transitions arrived and the replay budget is spent) or a stop signal.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

import replaygpu as rg
from replaygpu.agents import apex_config, dqn, sac
from replaygpu.agents.actor import STREAM_FIELD
from replaygpu.agents.apex_config import DEVICES_HELP, ApexConfig
from replaygpu.agents.checks import require_positive, require_positive_ints
from replaygpu.agents.flags import helptext
from replaygpu.agents.progress import NullRecorder, Recorder
from replaygpu.agents.runs import LoopState, RunControl

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SACLearnerConfig(sac.SACConfig):
    """SAC served to remote actors: `SACConfig`'s update, with a samples-per-insert rate limit
    in place of the demo's train_freq/gradient_steps (the defaults keep its ratio: 64 steps of
    256 rows per 64 env steps)."""

    steps: int = field(
        default=20_000,
        metadata=helptext("env steps collected by all actors; 0: run until stopped (a service)"),
    )
    samples_per_insert: float = field(
        default=256.0, metadata=helptext("rate limit: sampled rows per inserted row")
    )
    steps_per_call: int = field(default=64, metadata=helptext("SGD steps per Learner.train call"))
    num_actors: int = field(default=2, metadata=helptext("actor processes (demo) / fleet size"))
    actor_envs: int = field(default=1, metadata=helptext("envs per actor"))
    weight_pull_interval: int = field(
        default=256, metadata=helptext("actor env steps between weight pulls")
    )
    address: str = field(default="127.0.0.1:0", metadata=helptext("where the learner serves"))
    devices: str = field(default="", metadata=DEVICES_HELP)

    def __post_init__(self) -> None:
        if self.steps == 0:  # until stopped: check the other fields as if the run had a length
            dataclasses.replace(self, steps=1)
        elif self.steps < 0:
            raise rg.ConfigError(f"steps: got {self.steps}, expected >= 0 (0: until stopped)")
        else:
            super().__post_init__()
        require_positive_ints(
            self, "steps_per_call", "num_actors", "actor_envs", "weight_pull_interval"
        )
        require_positive(self, "samples_per_insert")


#: ``--agent`` -> (config class, agent module)
AGENTS: dict[str, tuple[type, Any]] = {"dqn": (ApexConfig, dqn), "sac": (SACLearnerConfig, sac)}


def make_agent(config: Any, env: Any) -> Any:
    """The networks of a learner run (what ``replaygpu eval`` restores)."""
    if isinstance(config, SACLearnerConfig):
        return sac.make_agent(config, env)
    return apex_config.make_agent(config, env)


def greedy_policy(agent: Any) -> Any:
    """The greedy numpy policy of a learner run's agent."""
    return sac.greedy_policy(agent) if isinstance(agent, sac.SAC) else dqn.greedy_policy(agent)


class LearnerService:
    """A served learner for ``agent`` (``"dqn"`` or ``"sac"``).

    Args:
        agent: which algorithm.
        config: its `ApexConfig` or `SACLearnerConfig`.
        run: checkpoints and stop signals (restored from at once); None: neither.
        token, tls, server_config: passed to `rg.serve`.

    Raises:
        ConfigError: bad env for the agent, address that cannot be bound, a checkpoint of
            another run.
    """

    def __init__(
        self,
        agent: str,
        config: Any,
        run: RunControl | None = None,
        token: str | None = None,
        tls: rg.TLSConfig | None = None,
        server_config: rg.ServerConfig | None = None,
    ) -> None:
        config_cls, module = AGENTS[agent]
        if not isinstance(config, config_cls):
            raise rg.ConfigError(
                f"LearnerService: agent {agent!r} takes a {config_cls.__name__}, got "
                f"{type(config).__name__}"
            )
        self.kind, self.config, self.run = agent, config, run
        probe = module.check_env(config.env_id)
        spec = dict(rg.specs_from_env(probe))
        if agent == "dqn":
            spec[STREAM_FIELD] = tf.TensorSpec([], tf.int64, name=STREAM_FIELD)  # env of a row
        if config.devices and config.device:
            raise rg.ConfigError(
                f"device {config.device!r} and devices {config.devices!r}: give one of them"
            )
        if config.devices:  # one replay shard per device; n-step streams stay in their shard
            strategy = rg.mirrored_strategy(config.devices)
            shard_by = STREAM_FIELD if agent == "dqn" else None
            self.table = rg.ShardedReplayTable(spec, config.buffer_size, strategy, shard_by)
            scope = strategy.scope()
        else:
            self.table = rg.ReplayTable(spec, config.buffer_size, device=config.device or None)
            scope = tf.device(self.table.device)
        with scope:
            self.agent = make_agent(config, probe)
        probe.close()
        self.sampler, self.policy_net = self._sampler(), self._policy_net()
        limiter = rg.SampleToInsertRatio(
            config.samples_per_insert,
            min_size_to_sample=config.learning_starts,
            error_buffer=config.batch_size * config.steps_per_call,
        )
        self.learner = rg.Learner(
            self.table,
            self.sampler,
            self.agent.update,
            batch_size=config.batch_size,
            rate_limiter=limiter,
            jit_compile=config.jit_compile,
        )
        self.ledger = rg.SequenceLedger()
        self.loop = LoopState()
        self.restored = None
        if run is not None:
            self.restored = run.attach(
                table=self.table,
                sampler=self.sampler,
                learner=self.learner,
                agent=self.agent,
                ledger=self.ledger,
                loop=self.loop,
            )
        if self.restored:
            logger.info(
                "resumed from %s: %d transitions inserted, SGD step %d",
                self.restored,
                self.table.total_inserted,
                self.sgd_steps,
            )
        self.learner.train(0)  # trace and compile the fused loop before actors connect
        self.server = rg.serve(
            self.learner,
            config.address,
            token,
            tls,
            config=server_config,
            ledger=self.ledger,
            actor_settings=self.actor_settings,
        )
        self.learner.publish_weights(self.policy_net)
        self._last_sync = int(self.loop.last_sync.numpy())  # 0, or the restored run's
        self._rate = (time.monotonic(), self.sgd_steps, 0.0)
        self.recorder: Recorder = NullRecorder()

    def _sampler(self) -> rg.Sampler:
        c = self.config
        if self.kind == "sac":
            return rg.UniformSampler(self.table, seed=c.seed)
        distribution = (
            rg.Prioritized(c.priority_alpha, c.priority_beta) if c.prioritized else rg.Uniform()
        )
        # Actors' batches interleave in the table; the stream field keeps a return in one env.
        view = rg.NStep(c.n_step, c.gamma, stream_field=STREAM_FIELD)
        return rg.Sampler(self.table, distribution, view, seed=c.seed)

    def _policy_net(self) -> Any:
        return self.agent.q if self.kind == "dqn" else self.agent.actor

    @property
    def actor_settings(self) -> rg.ActorSettings:
        """What ``replaygpu actor ADDRESS`` learns from this learner's ``Info``."""
        c = self.config
        return rg.ActorSettings(
            env_id=c.env_id,
            agent=self.kind,  # type: ignore[arg-type]
            hidden_sizes=tuple(c.hidden_sizes),
            weight_pull_interval=c.weight_pull_interval,
            num_envs=c.actor_envs,
            stream_field=STREAM_FIELD if self.kind == "dqn" else "",
            seed=c.seed,
            num_actors=c.num_actors,
        )

    @property
    def address(self) -> str:
        """Where the learner serves (``host:port``, the port resolved)."""
        return self.server.address

    @property
    def sgd_steps(self) -> int:
        """SGD steps taken, restored runs included."""
        return int(self.learner.steps.numpy())

    def step(self, idle_wait_s: float = 0.5) -> int:
        """Commit staged appends and train one call; publish weights, sync the target network,
        checkpoint when due. Returns the SGD steps run."""
        out = rg.learner_step(self.server, self.learner, self.config.steps_per_call, idle_wait_s)
        ran = int(out["steps"])
        if ran:
            steps = self.sgd_steps
            if self.kind == "dqn" and steps - self._last_sync >= self.config.target_update_interval:
                self.agent.sync_target()
                self._last_sync = steps
            self.learner.publish_weights(self.policy_net)
            self.recorder.metrics(
                self.table.total_inserted,
                {k: v for k, v in out.items() if k.startswith("losses/")},
            )
        if self.run is not None and self.run.due() and not self.run.stop.is_set():
            self.loop.capture(self.table.total_inserted, self._last_sync)
            self.run.save(self.server)
        return ran

    def done(self, ran: int) -> bool:
        """Whether the run is over: ``steps`` rows arrived and the last call could not train
        (the replay budget is spent), or a stop signal came (the only end with ``steps`` 0)."""
        if self.run is not None and self.run.stop.is_set():
            return True
        if not self.config.steps:  # a service: until stopped
            return False
        return self.table.total_inserted >= self.config.steps and ran == 0

    def stats(self) -> dict[str, float]:
        """SGD steps, SGD steps/s since the last call, checkpoints and the last one's seconds
        (for the metrics endpoint and the log)."""
        now, steps = time.monotonic(), self.sgd_steps
        then, then_steps, rate = self._rate
        if now - then >= 1.0:
            rate = (steps - then_steps) / (now - then)
            self._rate = (now, steps, rate)
        run = self.run
        return {
            "sgd_steps": float(steps),
            "sgd_steps_per_s": rate,
            "checkpoints": float(run.checkpoints if run else 0),
            "checkpoint_seconds": float(run.checkpoint_seconds if run else 0.0),
        }

    def commit(self) -> int:
        """Commit what the actors staged, without training (e.g. while they flush and stop)."""
        with self.server.training_turn():
            return self.server.commit_pending()

    def close(self, save: bool = True) -> str | None:
        """Stop serving (staged batches not yet committed are refused with UNAVAILABLE, so
        their actors resend them to the next learner), then write the final checkpoint
        unless ``save`` is False; returns its path."""
        self.server.stop()
        if self.run is None or not save:
            return None
        self.loop.capture(self.table.total_inserted, self._last_sync)
        path = self.run.save()
        if path:
            logger.info("final checkpoint %s (SGD step %d)", path, self.sgd_steps)
        return path
