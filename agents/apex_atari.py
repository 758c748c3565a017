"""Ape-X on pixels: a frame-table learner served over gRPC, Atari actor processes feeding it.

Reads top to bottom: the config, then ``train``: build the learner (a `rg.make_frame_table`
holding each 84x84 frame once, prioritized replay whose `rg.FrameStack` view rebuilds the
``[B, 4, 84, 84]`` stacks and 3-step returns in the graph, the Nature CNN double-DQN update of
`atari.AtariDQN`, a samples-per-insert rate limiter), serve it with the frame actors'
`rg.ActorSettings`, start the actor processes (`fleet`: the one actor loop, `actor.run_actor`,
with a `frame_actor.FrameExperience`, which acts with a numpy copy of the Nature CNN and pulls
its weights every K env steps; actor i explores with eps_i = 0.4^(1 + 7 i/(N-1))), then commit
their appends, train, publish weights, sync the target network and checkpoint until the actors
delivered ``steps`` env steps and the learner used up its replay budget; then evaluate the
greedy policy. More actors can join a running learner with ``replaygpu actor ADDRESS``.

Differences from the Ape-X paper, and why:

- Prioritized replay as in the paper (alpha 0.6, beta 0.4, priorities |TD error| of the 3-step
  double-DQN targets), but the priorities of new rows are the max priority seen so far, not
  ones the actors compute from their own Q-values: actors would need the target network too.
- Rows of several actors share one frame table, which needs each episode's rows contiguous:
  actors send whole table episodes (a life, when a lost life is terminal), each in one request
  that the server commits contiguously; an episode longer than ``segment_steps`` is cut as a
  time-limit truncation and continued as a new table episode whose first k-1 stacks are padded
  with its first frame instead of the true history (see `frame_actor`).

Preprocessing, reward clipping and lives are those of `atari` (``demo breakout``). The defaults
fit a 2-core CPU in minutes (2 actors, 20k env steps, 2 sampled rows per inserted row, a replay
of 5e4 rows = 0.35 GB); `ApexAtariConfig` says what to raise on a GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents import atari
from replaygpu.agents.actor_config import ActorConfig
from replaygpu.agents.checks import (
    require,
    require_positive,
    require_positive_ints,
    require_unit_interval,
)
from replaygpu.agents.flags import helptext
from replaygpu.agents.fleet import ActorFleet, split_steps
from replaygpu.agents.frame_actor import segment_client_config
from replaygpu.agents.progress import NullRecorder, Recorder, TrainResult
from replaygpu.agents.runs import LoopState, RunControl

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ApexAtariConfig:
    """Ape-X DQN on Atari frames: the Nature DQN's Adam 1e-4 and batch 32, with a run length
    and replay ratio sized for a 2-core CPU (a Nature CNN SGD step of batch 32 took ~0.2 s
    there beside two actors), which is a smoke run, not enough to learn Breakout; to learn,
    on a GPU: --steps 10000000 --buffer-size 1000000 --learning-starts 50000
    --samples-per-insert 8 --num-actors 8."""

    #: values of fields added later, for runs saved before them (`runs.RunControl` resumes)
    LEGACY_VALUES: ClassVar[dict[str, Any]] = {"n_step": 1, "prioritized": False}

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
        if self.learning_starts > self.steps:
            raise rg.ConfigError(
                f"learning_starts: got {self.learning_starts}, expected <= steps ({self.steps}); "
                "the learner would never start"
            )
        if self.buffer_size <= 2 * (self.segment_steps + 1):
            raise rg.ConfigError(
                f"buffer_size: got {self.buffer_size}, expected > 2 * (segment_steps + 1) = "
                f"{2 * (self.segment_steps + 1)} so a segment never overwrites the one before"
            )

    @property
    def dqn_config(self) -> atari.AtariDQNConfig:
        """The `atari.AtariDQNConfig` of the update and the evaluation."""
        return atari.AtariDQNConfig(
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
    def actor_settings(self) -> rg.ActorSettings:
        """What the actors run (served in ``Info``, so ``replaygpu actor ADDRESS`` can join)."""
        return rg.ActorSettings(
            env_id=self.env_id,
            weight_pull_interval=self.weight_pull_interval,
            seed=self.seed,
            num_actors=self.num_actors,
            frame_stack=self.frame_stack,
            segment_steps=self.segment_steps,
            repeat_action_probability=self.repeat_action_probability,
            terminal_on_life_loss=self.terminal_on_life_loss,
            clip_rewards=self.clip_rewards,
        )

    def actor_config(self, index: int, steps: int, seed: int) -> ActorConfig:
        """The config of actor process ``index`` collecting ``steps`` env steps (one game
        each, finished segments sent once they hold 256 steps)."""
        return ActorConfig.from_settings(
            self.actor_settings,
            actor_index=index,
            actor_id_prefix="apex-atari",
            num_envs=1,
            seed=seed,
            steps=steps,
            send_interval=256,
            insert_slack=self.insert_slack,
        )


def check_env(env_id: str) -> gym.Env:
    """`atari.check_env`: an ALE game, preprocessed; returns it (close it)."""
    return atari.check_env(env_id)


def make_agent(config: ApexAtariConfig, env: gym.Env) -> atari.AtariDQN:
    """The agent's networks for ``env`` (what ``replaygpu eval`` restores)."""
    return atari.AtariDQN(int(env.action_space.n), config.dqn_config)


def greedy_policy(agent: atari.AtariDQN) -> Callable[[np.ndarray], np.ndarray]:
    """``[B, k, 84, 84]`` uint8 stacks ``-> [B]`` int64 greedy actions."""
    return atari.greedy_policy(agent)


def evaluate_agent(
    config: ApexAtariConfig, agent: atari.AtariDQN, episodes: int, seed: int
) -> np.ndarray:
    """`atari.evaluate_agent`: raw returns of ``episodes`` full games."""
    return atari.evaluate_agent(config.dqn_config, agent, episodes, seed)


def train(
    config: ApexAtariConfig, recorder: Recorder | None = None, run: RunControl | None = None
) -> TrainResult:
    """Run the frame-table learner and ``num_actors`` actor processes, then evaluate.

    With ``run``: resume from its newest checkpoint (actors collect what is left of
    ``steps``), save periodically, stop early with a checkpoint on SIGTERM or Ctrl-C.

    Raises:
        ConfigError: ale-py missing or not an ALE game id.
        RuntimeError: when an actor process fails.
    """
    recorder = recorder or NullRecorder()
    dqn = config.dqn_config
    probe = check_env(config.env_id)
    num_actions = int(probe.action_space.n)
    probe.close()
    table = rg.make_frame_table(config.buffer_size, atari.FRAME_SHAPE, device=config.device or None)
    with tf.device(table.device):
        agent = atari.AtariDQN(num_actions, dqn)
    sampler = atari.make_frame_sampler(table, dqn)
    limiter = rg.SampleToInsertRatio(
        config.samples_per_insert,
        min_size_to_sample=config.learning_starts,
        error_buffer=config.batch_size * config.steps_per_call,
    )
    xla = config.jit_compile == "on" or (config.jit_compile == "auto" and "GPU" in table.device)
    learner = rg.Learner(
        table,
        sampler,
        agent.update,
        batch_size=config.batch_size,
        rate_limiter=limiter,
        jit_compile=xla,
    )
    ledger, loop = rg.SequenceLedger(), LoopState()
    if run is not None and run.attach(
        table=table, sampler=sampler, learner=learner, agent=agent, ledger=ledger, loop=loop
    ):
        logger.info("resumed at env step %d", int(loop.env_steps.numpy()))
    base_steps, last_sync = int(loop.env_steps.numpy()), int(loop.last_sync.numpy())
    learner.train(0)  # trace the fused loop before actors connect
    request = segment_client_config(config.segment_steps).max_message_bytes
    server = rg.serve(
        learner,
        config.address,
        config=rg.ServerConfig(max_message_bytes=max(request, 64 << 20)),
        ledger=ledger,
        actor_settings=config.actor_settings,
    )

    def weights() -> list[tf.Variable]:
        return agent.q.weights  # `NatureCNN.weights` order, what `cnn_policy` reads

    learner.publish_weights(weights)

    shares = split_steps(max(0, config.steps - base_steps), config.num_actors)
    configs = [
        config.actor_config(i, share, config.seed + base_steps)
        for i, share in enumerate(shares)
        if share
    ]
    fleet = ActorFleet(configs, server.address, recorder, base_steps, name="apex-atari-actor")
    first_steps, sgd_seconds, compile_seconds = 0, 0.0, 0.0
    start = time.perf_counter()

    def commit() -> None:
        with server.training_turn():
            server.commit_pending()

    try:
        fleet.start()
        while True:
            actors_done = fleet.finished  # before: data may still come
            began = time.perf_counter()
            out = rg.learner_step(server, learner, config.steps_per_call, idle_wait_s=0.2)
            ran = int(out["steps"])
            if ran:
                if not first_steps:
                    compile_seconds, first_steps = time.perf_counter() - began, ran
                else:
                    sgd_seconds += time.perf_counter() - began
                sgd = int(learner.steps.numpy())
                if sgd - last_sync >= config.target_update_interval:
                    agent.sync_target()
                    last_sync = sgd
                learner.publish_weights(weights)
                recorder.metrics(
                    fleet.env_steps, {k: v for k, v in out.items() if k.startswith("losses/")}
                )
            fleet.drain()
            recorder.progress(fleet.env_steps, int(learner.steps.numpy()), fleet.recent_return)
            fleet.raise_failed()
            if run is not None and run.stop.is_set():
                break  # the final checkpoint follows
            if run is not None and run.due():
                loop.capture(fleet.env_steps, last_sync)
                run.save(server)
            if actors_done and not ran:
                break
    finally:
        fleet.stop(commit)
        server.stop()
    elapsed = time.perf_counter() - start
    if run is not None:
        loop.capture(fleet.env_steps, last_sync)
        run.save()

    stopped = run is not None and run.stop.is_set() and fleet.env_steps < config.steps
    eval_returns = (
        np.zeros(0)
        if stopped or not config.eval_episodes
        else evaluate_agent(config, agent, config.eval_episodes, seed=config.seed + 10_000)
    )
    recorder.metrics(fleet.env_steps, {"charts/rows_acked": float(fleet.acked)})  # with finals
    trained = int(learner.steps.numpy()) - first_steps
    return TrainResult(
        eval_returns=eval_returns,
        env_steps=fleet.env_steps,
        sgd_steps=int(learner.steps.numpy()),
        train_seconds=elapsed,
        env_steps_per_s=fleet.env_steps_per_s,
        sgd_steps_per_s=trained / sgd_seconds if sgd_seconds > 0 else float("nan"),
        compile_seconds=compile_seconds,
        episodes=len(fleet.returns),
        stopped=stopped,
    )
