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

import multiprocessing as mp
import queue
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from replaygpu.agents.actor import actor_config, run_actor_process

# in apex_config, which learner.py shares; re-exported because the demo registry and
# ``replaygpu eval`` look them up by name on this module (the one a run.json records)
from replaygpu.agents.apex_config import ApexConfig as ApexConfig
from replaygpu.agents.apex_config import make_agent as make_agent
from replaygpu.agents.dqn import DQN
from replaygpu.agents.dqn import check_env as dqn_check_env
from replaygpu.agents.envs import evaluate
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
