"""Ape-X DQN: one learner serving its replay table over gRPC, N actor processes feeding it.

Reads top to bottom: the config, then ``train``: build the table, the double-DQN agent (the
update of `agents.dqn.DQN` on 3-step returns of each actor env) and the learner; serve them with
`rg.serve`; start the actor processes (`agents.actor`, no TensorFlow in them), which step
vector envs with a numpy epsilon-greedy policy (actor i: eps_i = 0.4^(1 + 7 i/(N-1))) and pull
weights every K env steps; train with `rg.learner_step` under a samples-per-insert rate limiter
until the actors delivered ``steps`` transitions and the learner used up its replay budget
(a fixed number of SGD steps, whatever the machine load), decaying the learning rate over
those steps; then evaluate the greedy policy.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import tensorflow as tf

import replaygpu as rg
from agents.actor import STREAM_FIELD, ActorConfig, run_actor_process
from agents.checks import (
    require_positive,
    require_positive_ints,
    require_unit_interval,
    require_widths,
)
from agents.dqn import DQN
from agents.envs import evaluate
from agents.flags import helptext
from agents.policies import greedy_q_policy
from agents.progress import NullRecorder, Recorder, TrainResult


@dataclass(frozen=True)
class ApexConfig:
    """Ape-X DQN hyperparameters: the rl-zoo3 CartPole DQN network and replay ratio, with the
    Ape-X paper's 3-step returns, batch 128 and a learning rate decayed linearly to 0 (with a
    constant one the greedy policy reached 500 and then fell again in some runs; see
    benchmarks/README.md)."""

    env_id: str = field(default="CartPole-v1", metadata=helptext("gymnasium env id (Discrete)"))
    seed: int = field(default=1, metadata=helptext("seed of actors, networks and sampling"))
    steps: int = field(default=80_000, metadata=helptext("env steps collected by all actors"))
    num_actors: int = field(default=2, metadata=helptext("actor processes"))
    actor_envs: int = field(
        default=1,
        metadata=helptext(
            "envs per actor, one batched policy call per vector step (on CartPole with this "
            "step budget, wider vector envs learned worse; see benchmarks/README.md)"
        ),
    )
    weight_pull_interval: int = field(
        default=512, metadata=helptext("actor env steps between weight pulls (K)")
    )
    learning_rate: float = field(default=2e-3, metadata=helptext("Adam step size at the start"))
    final_learning_rate: float = field(
        default=0.0,
        metadata=helptext(
            "Adam step size at the end: linear decay over the SGD steps that the replay "
            "budget allows (steps x samples_per_insert / batch_size)"
        ),
    )
    batch_size: int = field(default=128, metadata=helptext("minibatch size of each SGD step"))
    buffer_size: int = field(default=100_000, metadata=helptext("replay table capacity"))
    learning_starts: int = field(default=1000, metadata=helptext("rows before the first SGD step"))
    samples_per_insert: float = field(
        default=32.0, metadata=helptext("rate limit: sampled rows per inserted row")
    )
    steps_per_call: int = field(default=128, metadata=helptext("SGD steps per Learner.train call"))
    target_update_interval: int = field(
        default=128, metadata=helptext("SGD steps between target-network syncs")
    )
    gamma: float = field(default=0.99, metadata=helptext("discount factor"))
    n_step: int = field(
        default=3,
        metadata=helptext(
            "n-step returns (Ape-X: 3) by rg.NStepSampler over each actor env's own rows; "
            "1: one-step targets"
        ),
    )
    hidden_sizes: tuple[int, ...] = field(default=(256, 256), metadata=helptext("MLP widths"))
    max_grad_norm: float = field(default=10.0, metadata=helptext("gradient clipping global norm"))
    double_q: bool = field(default=True, metadata=helptext("double DQN targets"))
    prioritized: bool = field(
        default=False,
        metadata=helptext(
            "prioritized replay as in the Ape-X paper (off by default: with these "
            "hyperparameters it learned CartPole worse; see benchmarks/README.md)"
        ),
    )
    priority_alpha: float = field(default=0.6, metadata=helptext("priority exponent"))
    priority_beta: float = field(default=0.4, metadata=helptext("importance-weight exponent"))
    eval_episodes: int = field(default=20, metadata=helptext("greedy evaluation episodes"))
    jit_compile: bool = field(default=True, metadata=helptext("compile the SGD loop with XLA"))
    address: str = field(default="127.0.0.1:0", metadata=helptext("where the learner serves"))
    device: str = field(default="", metadata=helptext("TF device; empty: first GPU, else CPU"))

    def __post_init__(self) -> None:
        positive = [
            "steps",
            "num_actors",
            "actor_envs",
            "weight_pull_interval",
            "batch_size",
            "buffer_size",
            "learning_starts",
            "steps_per_call",
            "target_update_interval",
            "n_step",
            "eval_episodes",
        ]
        require_positive_ints(self, *positive)
        require_positive(self, "learning_rate", "samples_per_insert")
        if not 0.0 <= self.final_learning_rate <= self.learning_rate:
            raise rg.ConfigError(
                f"final_learning_rate: got {self.final_learning_rate}, expected in "
                f"[0, learning_rate={self.learning_rate}]"
            )
        require_unit_interval(self, "gamma")
        if self.learning_starts > self.steps:
            raise rg.ConfigError(
                f"learning_starts: got {self.learning_starts}, expected <= steps ({self.steps}); "
                "the learner would never start"
            )
        require_widths(self)

    @property
    def total_sgd_steps(self) -> int:
        """SGD steps the rate limiter allows once all ``steps`` rows are inserted."""
        budget = self.samples_per_insert * (self.steps - self.learning_starts)
        return max(1, int((budget + self.batch_size * self.steps_per_call) // self.batch_size))

    @property
    def learning_rate_schedule(self) -> rg.LinearSchedule:
        """Adam's step size: linear from ``learning_rate`` to ``final_learning_rate`` over the
        SGD steps of the replay budget (evaluated in the graph at every step)."""
        return rg.LinearSchedule(self.learning_rate, self.final_learning_rate, self.total_sgd_steps)

    def actor_config(self, index: int) -> ActorConfig:
        """The config of actor ``index``: its share of the steps and its Ape-X epsilon."""
        share = self.steps // self.num_actors + (index < self.steps % self.num_actors)
        return ActorConfig(
            env_id=self.env_id,
            actor_index=index,
            num_actors=self.num_actors,
            num_envs=self.actor_envs,
            seed=self.seed,
            steps=share,
            weight_pull_interval=self.weight_pull_interval,
        )


def train(config: ApexConfig, recorder: Recorder | None = None) -> TrainResult:
    """Run the learner service and ``num_actors`` actor processes, then evaluate greedily.

    Raises:
        RuntimeError: when an actor process fails.
    """
    recorder = recorder or NullRecorder()
    probe = gym.make(config.env_id)
    spec = dict(rg.specs_from_env(probe))
    spec[STREAM_FIELD] = tf.TensorSpec([], tf.int64, name=STREAM_FIELD)  # env of each row
    obs_dim = int(np.prod(probe.observation_space.shape))
    num_actions = int(probe.action_space.n)
    probe.close()

    table = rg.ReplayTable(spec, config.buffer_size, device=config.device or None)
    with tf.device(table.device):
        agent = DQN(obs_dim, num_actions, config, learning_rate=config.learning_rate_schedule)
    if config.prioritized:
        sampler = rg.PrioritizedSampler(
            table, alpha=config.priority_alpha, beta=config.priority_beta, seed=config.seed
        )
    else:
        sampler = rg.UniformSampler(table, seed=config.seed)
    # Actors' batches interleave in the table; the stream field keeps each return in one env.
    sampler = rg.NStepSampler(
        sampler, n=config.n_step, gamma=config.gamma, stream_field=STREAM_FIELD
    )
    limiter = rg.SampleToInsertRatio(
        config.samples_per_insert,
        min_size_to_sample=config.learning_starts,
        error_buffer=config.batch_size * config.steps_per_call,
    )
    learner = rg.Learner(
        table,
        sampler,
        agent.update,
        batch_size=config.batch_size,
        rate_limiter=limiter,
        jit_compile=config.jit_compile,
    )
    learner.train(0)  # trace and compile the fused loop before the actors start
    server = rg.serve(learner, config.address)
    learner.publish_weights(agent.q)

    ctx = mp.get_context("spawn")  # actors import no TensorFlow and share nothing with us
    stop = ctx.Event()
    reports = ctx.Queue(maxsize=10_000)
    actors = [
        ctx.Process(
            target=run_actor_process,
            args=(config.actor_config(i), server.address, stop, reports),
            name=f"apex-actor-{i}",
            daemon=True,
        )
        for i in range(config.num_actors)
    ]
    actor_steps = [0] * config.num_actors
    actor_stats: dict[int, dict] = {}
    returns: list[float] = []
    sgd_steps, last_sync, sgd_seconds, first_steps = 0, 0, 0.0, 0
    compile_seconds = 0.0
    start = time.perf_counter()
    try:
        for proc in actors:
            proc.start()
        while True:
            actors_done = all(p.exitcode == 0 for p in actors)  # before: data may still come
            began = time.perf_counter()
            out = rg.learner_step(server, learner, config.steps_per_call, idle_wait_s=0.5)
            ran = int(out["steps"])
            if ran:
                if not first_steps:
                    compile_seconds, first_steps = time.perf_counter() - began, ran
                else:
                    sgd_seconds += time.perf_counter() - began
                sgd_steps += ran
                if sgd_steps - last_sync >= config.target_update_interval:
                    agent.sync_target()
                    last_sync = sgd_steps
                learner.publish_weights(agent.q)
                recorder.metrics(
                    table.total_inserted, {k: v for k, v in out.items() if k.startswith("losses/")}
                )
            _drain(reports, actor_steps, actor_stats, returns, recorder)
            recent = float(np.mean(returns[-20:])) if returns else float("nan")
            recorder.progress(table.total_inserted, int(learner.steps.numpy()), recent)
            failed = [p.name for p in actors if p.exitcode not in (0, None)]
            if failed:
                raise RuntimeError(f"actor processes {failed} failed; see their log above")
            if actors_done and not ran:
                _drain(reports, actor_steps, actor_stats, returns, recorder)
                break
    finally:
        stop.set()
        for proc in (p for p in actors if p.pid is not None):
            proc.join(30)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        server.stop()
        reports.close()
    elapsed = time.perf_counter() - start

    greedy = greedy_q_policy(agent.q.numpy_weights())
    eval_returns = evaluate(greedy, config.env_id, config.eval_episodes, seed=config.seed + 10_000)
    actor_rates = [s["env_steps_per_s"] for s in actor_stats.values()]
    trained_steps = sgd_steps - first_steps
    return TrainResult(
        eval_returns=eval_returns,
        env_steps=table.total_inserted,
        sgd_steps=int(learner.steps.numpy()),
        train_seconds=elapsed,
        env_steps_per_s=float(np.sum(actor_rates)) if actor_rates else float("nan"),
        sgd_steps_per_s=trained_steps / sgd_seconds if sgd_seconds > 0 else float("nan"),
        compile_seconds=compile_seconds,
        episodes=len(returns),
    )


def _drain(
    reports, actor_steps: list[int], actor_stats: dict, returns: list[float], recorder: Recorder
) -> None:
    """Move actor reports from the queue to the recorder without blocking."""
    while True:
        try:
            kind, index, payload = reports.get_nowait()
        except queue.Empty:
            return
        if kind == "episode":
            steps, episodic_return, length = payload
            actor_steps[index] = steps
            returns.append(episodic_return)
            recorder.episode(sum(actor_steps), episodic_return, length)
        elif kind == "done":
            actor_stats[index] = dict(payload)
