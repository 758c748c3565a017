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

from collections.abc import Callable

import gymnasium as gym
import numpy as np

from replaygpu.agents.actor_config import ActorConfig

# in apex_config, which learner.py shares; re-exported because this is the module that
# `registry.ALGORITHMS` names for "apex": the demo and ``replaygpu eval`` look them up here
from replaygpu.agents.apex_config import ApexConfig as ApexConfig
from replaygpu.agents.apex_config import make_agent as make_agent
from replaygpu.agents.dqn import DQN
from replaygpu.agents.dqn import check_env as dqn_check_env
from replaygpu.agents.learner import LearnerService, train_with_actors
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
    service = LearnerService(config, run)

    def actor_config(index: int, steps: int, seed: int) -> ActorConfig:
        return ActorConfig.from_settings(
            service.actor_settings, actor_index=index, steps=steps, seed=seed
        )

    return train_with_actors(service, actor_config, recorder or NullRecorder(), "apex-actor")
