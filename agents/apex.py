"""Ape-X DQN: one learner serving its replay table over gRPC, N actor processes feeding it.

Reads top to bottom: the config, then ``train``: start `LearnerService` (what ``replaygpu
learner --agent dqn`` runs: the table, the double-DQN update of `dqn.DQN` on 3-step returns of
each actor env, a samples-per-insert rate limiter, the gRPC service) and the actor processes
(what ``replaygpu actor ADDRESS`` runs: `actor`, no TensorFlow in them), which step vector envs
with a numpy epsilon-greedy policy (actor i: eps_i = 0.4^(1 + 7 i/(N-1))) and pull weights every
K env steps; train until the actors delivered ``steps`` transitions and the learner used up its
replay budget (a fixed number of SGD steps, whatever the machine load), decaying the learning
rate over those steps; then evaluate the greedy policy.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

import replaygpu as rg
from replaygpu.agents.actor import actor_config, run_actor_process
from replaygpu.agents.checks import (
    require,
    require_positive,
    require_positive_ints,
    require_unit_interval,
    require_widths,
)
from replaygpu.agents.dqn import DQN, obs_size
from replaygpu.agents.dqn import check_env as dqn_check_env
from replaygpu.agents.envs import evaluate
from replaygpu.agents.flags import helptext
from replaygpu.agents.policies import greedy_q_policy
from replaygpu.agents.progress import NullRecorder, Recorder, TrainResult
from replaygpu.agents.runs import RunControl

#: help of the ``devices`` field of the learners' configs (`ApexConfig`, `SACLearnerConfig`)
DEVICES_HELP = helptext(
    "data-parallel learner over these devices, e.g. /gpu:0,/gpu:1 (one replay shard each; "
    "/cpu:0,/cpu:1 splits the CPU, to try it); empty: one device"
)


@dataclass(frozen=True)
class ApexConfig:
    """Ape-X DQN hyperparameters: the rl-zoo3 CartPole DQN network and replay ratio, with the
    Ape-X paper's 3-step returns, batch 128 and a learning rate decayed linearly to 0 (with a
    constant one the greedy policy reached 500 and then fell again in some runs; see
    benchmarks/README.md)."""

    env_id: str = field(default="CartPole-v1", metadata=helptext("gymnasium env id (Discrete)"))
    seed: int = field(default=1, metadata=helptext("seed of actors, networks and sampling"))
    steps: int = field(
        default=80_000,
        metadata=helptext(
            "env steps collected by all actors; 0: run until stopped (a service), with a "
            "constant learning rate"
        ),
    )
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
    devices: str = field(default="", metadata=DEVICES_HELP)

    def __post_init__(self) -> None:
        positive = [
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
        require(self, ["steps"], lambda v: v >= 0, ">= 0 (0: until stopped)")
        if self.steps and self.learning_starts > self.steps:
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
    def learning_rate_schedule(self) -> rg.LinearSchedule | float:
        """Adam's step size: linear from ``learning_rate`` to ``final_learning_rate`` over the
        SGD steps of the replay budget (evaluated in the graph at every step); constant for a
        run without an end (``steps`` 0)."""
        if not self.steps:
            return self.learning_rate
        return rg.LinearSchedule(self.learning_rate, self.final_learning_rate, self.total_sgd_steps)


def check_env(env_id: str) -> gym.Env:
    """`dqn.check_env`: Ape-X DQN needs Discrete actions."""
    return dqn_check_env(env_id)


def make_agent(config: ApexConfig, env: gym.Env) -> DQN:
    """The agent's networks for ``env`` (what ``replaygpu eval`` restores)."""
    obs_dim = obs_size(env.observation_space)
    return DQN(obs_dim, int(env.action_space.n), config, config.learning_rate_schedule)


def greedy_policy(agent: DQN) -> Callable[[np.ndarray], np.ndarray]:
    """The agent's greedy numpy policy."""
    return greedy_q_policy(agent.q.numpy_weights())


def train(
    config: ApexConfig, recorder: Recorder | None = None, run: RunControl | None = None
) -> TrainResult:
    """Run the learner service (`LearnerService`, what ``replaygpu learner`` runs) and
    ``num_actors`` actor processes (what ``replaygpu actor ADDRESS`` runs), then evaluate.

    With ``run``: resume from its newest checkpoint, save periodically, stop early (with a
    checkpoint) on SIGTERM or Ctrl-C. Actors of a resumed run collect what is left of
    ``steps``.

    Raises:
        RuntimeError: when an actor process fails.
    """
    from replaygpu.agents.learner import LearnerService

    recorder = recorder or NullRecorder()
    service = LearnerService("dqn", config, run)
    service.recorder = recorder
    table, learner = service.table, service.learner
    left = max(0, config.steps - table.total_inserted)

    ctx = mp.get_context("spawn")  # actors import no TensorFlow and share nothing with us
    stop = ctx.Event()
    reports = ctx.Queue(maxsize=10_000)
    # a resumed run collects only what is left, with new env seeds; steps 0: until stopped
    inserted = table.total_inserted
    shares = _shares(left, config.num_actors) if config.steps else [0] * config.num_actors
    actors = [
        ctx.Process(
            target=run_actor_process,
            args=(
                actor_config(
                    service.actor_settings,
                    i,
                    config.num_actors,
                    steps=share,
                    seed=config.seed + inserted,
                ),
                service.address,
                stop,
                reports,
            ),
            name=f"apex-actor-{i}",
            daemon=True,
        )
        for i, share in enumerate(shares)
        if share or not config.steps
    ]
    actor_steps = [0] * config.num_actors
    actor_stats: dict[int, dict] = {}
    returns: list[float] = []
    first_steps, sgd_seconds, compile_seconds = 0, 0.0, 0.0
    start = time.perf_counter()
    try:
        for proc in actors:
            proc.start()
        while True:
            actors_done = all(p.exitcode == 0 for p in actors)  # before: data may still come
            began = time.perf_counter()
            ran = service.step()
            if ran:
                if not first_steps:
                    compile_seconds, first_steps = time.perf_counter() - began, ran
                else:
                    sgd_seconds += time.perf_counter() - began
            _drain(reports, actor_steps, actor_stats, returns, recorder)
            recent = float(np.mean(returns[-20:])) if returns else float("nan")
            recorder.progress(table.total_inserted, service.sgd_steps, recent)
            failed = [p.name for p in actors if p.exitcode not in (0, None)]
            if failed:
                raise RuntimeError(f"actor processes {failed} failed; see their log above")
            if service.run is not None and service.run.stop.is_set():
                break
            if actors_done and not ran:
                _drain(reports, actor_steps, actor_stats, returns, recorder)
                break
    finally:
        stop.set()
        # commit the actors' last batches while they flush, so their acks come and they exit
        deadline = time.monotonic() + 30
        while any(p.is_alive() for p in actors) and time.monotonic() < deadline:
            service.commit()
            time.sleep(0.05)
        for proc in (p for p in actors if p.pid is not None):
            if proc.is_alive():
                proc.terminate()
            proc.join()
        service.close()
        reports.close()
    elapsed = time.perf_counter() - start

    stopped = (
        service.run is not None
        and service.run.stop.is_set()
        and (not config.steps or table.total_inserted < config.steps)
    )
    greedy = greedy_q_policy(service.agent.q.numpy_weights())
    eval_returns = (
        np.zeros(0)
        if stopped
        else evaluate(greedy, config.env_id, config.eval_episodes, seed=config.seed + 10_000)
    )
    actor_rates = [s["env_steps_per_s"] for s in actor_stats.values()]
    trained_steps = service.sgd_steps - first_steps
    return TrainResult(
        eval_returns=eval_returns,
        env_steps=table.total_inserted,
        sgd_steps=int(learner.steps.numpy()),
        train_seconds=elapsed,
        env_steps_per_s=float(np.sum(actor_rates)) if actor_rates else float("nan"),
        sgd_steps_per_s=trained_steps / sgd_seconds if sgd_seconds > 0 else float("nan"),
        compile_seconds=compile_seconds,
        episodes=len(returns),
        stopped=stopped,
    )


def _shares(steps: int, num_actors: int) -> list[int]:
    """``steps`` split over the actors as evenly as possible (0: that actor is not needed)."""
    return [steps // num_actors + (i < steps % num_actors) for i in range(num_actors)]


def _drain(
    reports, actor_steps: list[int], actor_stats: dict, returns: list[float], recorder: Recorder
) -> None:
    """Move up to 1000 actor reports from the queue to the recorder without blocking (so a
    flood of short episodes never keeps the learner from committing and training)."""
    for _ in range(1000):
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
