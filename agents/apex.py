"""Ape-X DQN: one learner serving its replay table over gRPC, N actor processes feeding it.

Reads top to bottom: ``train`` (its config, `ApexConfig`, and networks are in `apex_config`,
which the standalone learner shares): start `LearnerService` (what ``replaygpu learner --agent
dqn`` runs: the table, the double-DQN update of `dqn.DQN` on 3-step returns of each actor env, a
samples-per-insert rate limiter, the gRPC service) and the actor processes (what ``replaygpu
actor ADDRESS`` runs: `actor`, no TensorFlow in them), which step vector envs with a numpy
epsilon-greedy policy (actor i: eps_i = 0.4^(1 + 7 i/(N-1))) and pull weights every K env steps;
train until the actors delivered ``steps`` transitions and the learner used up its replay budget
(a fixed number of SGD steps, whatever the machine load), decaying the learning rate over those
steps; then evaluate the greedy policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from replaygpu.agents.actor_config import ActorConfig

# in apex_config, which learner.py shares; re-exported because the demo registry and
# ``replaygpu eval`` look them up by name on this module (the one a run.json records)
from replaygpu.agents.apex_config import ApexConfig as ApexConfig
from replaygpu.agents.apex_config import make_agent as make_agent
from replaygpu.agents.dqn import DQN
from replaygpu.agents.dqn import check_env as dqn_check_env
from replaygpu.agents.envs import evaluate
from replaygpu.agents.fleet import ActorFleet, split_steps
from replaygpu.agents.learner import LearnerService
from replaygpu.agents.policies import greedy_q_policy
from replaygpu.agents.progress import NullRecorder, Recorder, TrainResult
from replaygpu.agents.runs import RunControl


def check_env(env_id: str) -> gym.Env:
    """`dqn.check_env`: Ape-X DQN needs Discrete actions."""
    return dqn_check_env(env_id)


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
    recorder = recorder or NullRecorder()
    service = LearnerService("dqn", config, run)
    service.recorder = recorder
    table, learner = service.table, service.learner
    # a resumed run collects only what is left, with new env seeds; steps 0: until stopped
    inserted = table.total_inserted
    left = max(0, config.steps - inserted)
    shares = split_steps(left, config.num_actors) if config.steps else [0] * config.num_actors
    configs = [
        ActorConfig.from_settings(
            service.actor_settings, actor_index=i, steps=share, seed=config.seed + inserted
        )
        for i, share in enumerate(shares)
        if share or not config.steps
    ]
    fleet = ActorFleet(configs, service.address, recorder, inserted, name="apex-actor")
    first_steps, sgd_seconds, compile_seconds = 0, 0.0, 0.0
    start = time.perf_counter()
    try:
        fleet.start()
        while True:
            actors_done = fleet.finished  # before: data may still come
            began = time.perf_counter()
            ran = service.step()
            if ran:
                if not first_steps:
                    compile_seconds, first_steps = time.perf_counter() - began, ran
                else:
                    sgd_seconds += time.perf_counter() - began
            fleet.drain()
            recorder.progress(table.total_inserted, service.sgd_steps, fleet.recent_return)
            fleet.raise_failed()
            if service.run is not None and service.run.stop.is_set():
                break
            if actors_done and not ran:
                break
    finally:
        fleet.stop(service.commit)
        service.close()
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
    trained_steps = service.sgd_steps - first_steps
    return TrainResult(
        eval_returns=eval_returns,
        env_steps=table.total_inserted,
        sgd_steps=int(learner.steps.numpy()),
        train_seconds=elapsed,
        env_steps_per_s=fleet.env_steps_per_s,
        sgd_steps_per_s=trained_steps / sgd_seconds if sgd_seconds > 0 else float("nan"),
        compile_seconds=compile_seconds,
        episodes=len(fleet.returns),
        stopped=stopped,
    )
