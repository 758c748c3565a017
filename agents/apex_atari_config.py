"""Ape-X on pixels: its config and the networks it builds, what both runners share: the
in-process demo (`apex_atari.train`, ``demo apex-breakout``) and the standalone learner
(`learner.LearnerService`, ``replaygpu learner --agent dqn --env ALE/...``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import gymnasium as gym
import numpy as np

import replaygpu as rg
from replaygpu.agents.actor_config import ActorConfig
from replaygpu.agents.config_parts import (
    require,
    require_positive,
    require_positive_ints,
    require_trains,
    require_unit_interval,
)
from replaygpu.agents.dqn_config import AtariDQNConfig
from replaygpu.agents.flags import helptext
from replaygpu.service.config import AgentSettings

if TYPE_CHECKING:  # imported when an agent is made: the config alone needs no TensorFlow
    from replaygpu.agents import atari


@dataclass(frozen=True)
class ApexAtariConfig:
    """Ape-X DQN on Atari frames: the Nature DQN's Adam 1e-4 and batch 32, with a run length
    and replay ratio sized for a 2-core CPU (a Nature CNN SGD step of batch 32 took ~0.2 s
    there beside two actors), which is a smoke run, not enough to learn Breakout; to learn,
    on a GPU: --steps 10000000 --buffer-size 1000000 --learning-starts 50000
    --samples-per-insert 8 --num-actors 8."""

    env_id: str = field(default="ALE/Breakout-v5", metadata=helptext("ALE game id"))
    seed: int = field(default=1, metadata=helptext("seed of actors, networks and sampling"))
    steps: int = field(default=20_000, metadata=helptext("env steps collected by all actors"))
    num_actors: int = field(default=2, metadata=helptext("actor processes"))
    segment_steps: int = field(
        default=1000,
        metadata=helptext(
            "longest table episode an actor sends in one request; longer ones are cut as "
            "truncations (the first k-1 stacks after a cut are padded)"
        ),
    )
    weight_pull_interval: int = field(
        default=1000, metadata=helptext("actor env steps between weight pulls (K)")
    )
    insert_slack: int = field(
        default=4096,
        metadata=helptext(
            "rows an actor may run ahead of the learner's rate limit before it waits; -1: never"
        ),
    )
    learning_rate: float = field(default=1e-4, metadata=helptext("Adam step size"))
    batch_size: int = field(default=32, metadata=helptext("minibatch size of each SGD step"))
    buffer_size: int = field(
        default=50_000, metadata=helptext("frame-table rows (1e6: 7.07 GB of uint8 frames)")
    )
    learning_starts: int = field(default=2_000, metadata=helptext("rows before the first SGD"))
    samples_per_insert: float = field(
        default=2.0,
        metadata=helptext(
            "rate limit: sampled rows per inserted row (Nature DQN: 8; Ape-X: well below 1)"
        ),
    )
    steps_per_call: int = field(default=16, metadata=helptext("SGD steps per Learner.train call"))
    target_update_interval: int = field(
        default=250, metadata=helptext("SGD steps between target-network syncs")
    )
    gamma: float = field(default=0.99, metadata=helptext("discount factor"))
    n_step: int = field(default=3, metadata=helptext("n-step returns (Ape-X: 3)"))
    prioritized: bool = field(
        default=True, metadata=helptext("prioritized replay (Ape-X: yes; off: uniform)")
    )
    priority_alpha: float = field(default=0.6, metadata=helptext("priority exponent (Ape-X: 0.6)"))
    priority_beta: float = field(
        default=0.4, metadata=helptext("importance-weight exponent (Ape-X: 0.4)")
    )
    frame_stack: int = field(default=4, metadata=helptext("frames per observation stack"))
    max_grad_norm: float = field(default=10.0, metadata=helptext("gradient clipping global norm"))
    double_q: bool = field(default=True, metadata=helptext("double DQN targets (Ape-X: yes)"))
    repeat_action_probability: float = field(
        default=0.25, metadata=helptext("sticky actions of ALE v5 (Machado et al. 2018)")
    )
    terminal_on_life_loss: bool = field(
        default=True, metadata=helptext("training marks a lost life terminal (game plays on)")
    )
    clip_rewards: bool = field(default=True, metadata=helptext("train on sign(reward)"))
    eval_episodes: int = field(
        default=3, metadata=helptext("evaluation games after training (0: none)")
    )
    eval_epsilon: float = field(
        default=0.05, metadata=helptext("epsilon of the evaluation policy (Nature: 0.05)")
    )
    jit_compile: Literal["auto", "on", "off"] = field(
        default="auto", metadata=helptext("compile the SGD loop with XLA; auto: on a GPU only")
    )
    address: str = field(default="127.0.0.1:0", metadata=helptext("where the learner serves"))
    device: str = field(default="", metadata=helptext("TF device; empty: first GPU, else CPU"))

    def __post_init__(self) -> None:
        require_positive_ints(
            self,
            *["steps", "num_actors", "segment_steps", "weight_pull_interval", "batch_size"],
            *["buffer_size", "steps_per_call", "target_update_interval", "frame_stack"],
            "n_step",
        )
        require(self, ["learning_starts", "eval_episodes"], lambda v: v >= 0, ">= 0")
        require(self, ["insert_slack"], lambda v: v >= -1, ">= -1 (-1: never wait)")
        require_positive(self, "learning_rate", "samples_per_insert", "max_grad_norm")
        require_unit_interval(self, "gamma", "repeat_action_probability", "eval_epsilon")
        require_trains(self)
        if self.buffer_size <= 2 * (self.segment_steps + 1):
            raise rg.ConfigError(
                f"buffer_size: got {self.buffer_size}, expected > 2 * (segment_steps + 1) = "
                f"{2 * (self.segment_steps + 1)} so a segment never overwrites the one before"
            )

    @property
    def steps_to_train(self) -> int:
        """The least ``steps`` that trains (`config_parts.require_trains`): the rate limiter samples
        once the table holds ``learning_starts`` rows."""
        return max(1, self.learning_starts)

    @property
    def dqn_config(self) -> AtariDQNConfig:
        """The `AtariDQNConfig` of the update and the evaluation."""
        return AtariDQNConfig(
            env_id=self.env_id,
            seed=self.seed,
            steps=self.steps,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            buffer_size=self.buffer_size,
            learning_starts=self.learning_starts,
            gamma=self.gamma,
            n_step=self.n_step,
            prioritized=self.prioritized,
            priority_alpha=self.priority_alpha,
            priority_beta=self.priority_beta,
            frame_stack=self.frame_stack,
            max_grad_norm=self.max_grad_norm,
            double_q=self.double_q,
            repeat_action_probability=self.repeat_action_probability,
            terminal_on_life_loss=self.terminal_on_life_loss,
            clip_rewards=self.clip_rewards,
            eval_episodes=max(1, self.eval_episodes),
            eval_epsilon=self.eval_epsilon,
            jit_compile=self.jit_compile,
            device=self.device,
        )

    @property
    def actor_settings(self) -> AgentSettings:
        """What the actors run (served in ``Info``, so ``replaygpu actor ADDRESS`` can join)."""
        actor = ActorConfig(
            env_id=self.env_id,
            num_envs=1,  # one ALE game per actor process
            weight_pull_interval=self.weight_pull_interval,
            seed=self.seed,
            num_actors=self.num_actors,
            frame_stack=self.frame_stack,
            segment_steps=self.segment_steps,
            repeat_action_probability=self.repeat_action_probability,
            terminal_on_life_loss=self.terminal_on_life_loss,
            clip_rewards=self.clip_rewards,
            send_interval=256,  # finished segments go once they hold 256 steps
            insert_slack=self.insert_slack,
        )
        return actor.to_settings("dqn")

    def actor_config(self, index: int, steps: int, seed: int) -> ActorConfig:
        """The config of actor process ``index`` collecting ``steps`` env steps: the
        `actor_settings` that ``replaygpu actor ADDRESS`` takes over too, so the demo's actors
        and the command's run alike; only what is this process's own is set here."""
        return ActorConfig.from_settings(
            self.actor_settings,
            actor_index=index,
            actor_id_prefix="apex-atari",
            seed=seed,
            steps=steps,
        )


def check_env(env_id: str) -> gym.Env:
    """`atari.check_env`: an ALE game, preprocessed; returns it (close it)."""
    from replaygpu.agents import atari

    return atari.check_env(env_id)


def make_agent(config: ApexAtariConfig, env: gym.Env) -> atari.AtariDQN:
    """The agent's networks for ``env`` (what ``replaygpu eval`` restores)."""
    from replaygpu.agents import atari

    return atari.AtariDQN(int(env.action_space.n), config.dqn_config)


def greedy_policy(agent: atari.AtariDQN) -> Callable[[np.ndarray], np.ndarray]:
    """``[B, k, 84, 84]`` uint8 stacks ``-> [B]`` int64 greedy actions."""
    from replaygpu.agents import atari

    return atari.greedy_policy(agent)


def evaluate_agent(
    config: ApexAtariConfig, agent: atari.AtariDQN, episodes: int, seed: int
) -> np.ndarray:
    """`atari.evaluate_agent`: raw returns of ``episodes`` full games."""
    from replaygpu.agents import atari

    return atari.evaluate_agent(config.dqn_config, agent, episodes, seed)
