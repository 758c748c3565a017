"""DQN (double DQN optional; Huber loss, target network, linear epsilon and learning-rate
schedules; Discrete actions). Reads top to bottom: the agent, the training loop, the kept best
weights, the served form (`VectorDQN`).

Acting never calls TensorFlow: it uses a numpy copy of the Q-network weights (`numpy_mlp`).
Every ``train_freq`` env steps a training job appends the chunk, runs ``gradient_steps`` SGD
steps in one `Learner.train` call (one XLA graph execution), syncs the target and reads the new
weights; with ``overlap_training`` jobs run in order on a background thread while the next chunk
is acted, so acting (Python, one core) and training (the graph, without the GIL) overlap
(`rollouts.TrainingJobs`). Every ``eval_every`` env steps the acting thread plays greedy episodes
with the acting weights and keeps the best (``keep_best``, `BestPolicy`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.keys import DISCOUNT, IMPORTANCE_WEIGHTS, PRIORITIES
from replaygpu.nest import flatten as flatten_nest
from replaygpu.specs import host_spec, specs_from_env
from replaygpu.table import Table
from replaygpu.targets import update_target

from .. import runs
from ..builder import VectorBuilder
from ..configs import next_chunk
from ..distributed.experience import STREAM_FIELD
from ..envs import discrete_actions_env as check_env
from ..envs import make_vector_env
from ..evaluation import BestPolicy, evaluate_while_training, evaluation_due
from ..networks import Adam, Schedule, mlp
from ..policies import epsilon_greedy_actions, greedy_q_policy
from ..progress import FINAL_WEIGHTS, NullRecorder, Recorder, TrainResult, TrainTimer
from ..rollouts import ChunkCollector, TrainingJobs, evaluate
from ..runs import RunControl
from .config import ApexConfig, DQNConfig


class QAgent(tf.Module):
    """Online and target Q-networks, Adam, the target sync and the in-graph (double) DQN update.

    The update takes 1-step rows (``terminated`` ends bootstrapping, truncation does not) or
    n-step rows with ``DISCOUNT``, and with importance weights returns new priorities too.
    Subclasses pick the networks and their input (`inputs`).

    Args:
        q, target: networks of one architecture, ``[B, ...] -> [B, num_actions]`` with a
            ``weights`` list; ``target`` starts with ``q``'s weights.
        config: with ``gamma``, ``double_q``, ``max_grad_norm``, ``learning_rate``.
        learning_rate: Adam's step size or schedule; None: ``config.learning_rate``.
    """

    def __init__(
        self,
        q: Any,
        target: Any,
        num_actions: int,
        config: Any,
        learning_rate: float | Schedule | None = None,
        name: str = "dqn",
    ) -> None:
        super().__init__(name=name)
        self.config = config
        self.num_actions = num_actions
        self.q = q
        self.target = target
        lr = config.learning_rate if learning_rate is None else learning_rate
        self.optimizer = Adam(self.q.weights, lr, config.max_grad_norm)
        update_target(self.target.weights, self.q.weights)
        self._sync = tf.function(lambda: update_target(self.target.weights, self.q.weights))
        self._sync_and_read = tf.function(self._sync_and_read_graph)  # a trace per bool

    def inputs(self, obs: Any) -> tf.Tensor:
        """The networks' input: a flat float32 ``[B, D]`` here."""
        return flat_obs(obs)

    def update(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """One SGD step on a minibatch ``{field: [B, ...]}``; runs inside `Learner.train`."""
        gamma = self.config.gamma
        obs, next_obs = self.inputs(batch["obs"]), self.inputs(batch["next_obs"])
        next_q_target = self.target(next_obs)
        chooser = self.q(next_obs) if self.config.double_q else next_q_target
        next_action = tf.one_hot(tf.argmax(chooser, axis=1), self.num_actions)
        next_value = tf.reduce_sum(next_q_target * next_action, axis=1)
        if DISCOUNT in batch:  # n-step rows (NStep view): gamma^k, 0 where terminated
            discount = batch[DISCOUNT]
        else:  # one-step rows: bootstrap on truncation, not on termination
            discount = gamma * (1.0 - tf.cast(batch["terminated"], tf.float32))
        target = batch["reward"] + discount * next_value
        taken = tf.one_hot(batch["action"], self.num_actions)
        with tf.GradientTape() as tape:
            q_taken = tf.reduce_sum(self.q(obs) * taken, axis=1)
            error = target - q_taken
            abs_error = tf.abs(error)
            huber = tf.where(abs_error <= 1.0, 0.5 * tf.square(error), abs_error - 0.5)
            weights = batch.get(IMPORTANCE_WEIGHTS)  # present with rg.Prioritized()
            loss = tf.reduce_mean(huber if weights is None else weights * huber)
        self.optimizer.apply(tape.gradient(loss, self.q.weights))
        out = {"losses/td_loss": loss, "losses/q_values": tf.reduce_mean(q_taken)}
        if weights is not None:
            out[PRIORITIES] = abs_error  # the sampler's new priorities for these rows
        return out

    def sync_target(self) -> None:
        self._sync()

    def sync_and_mirror(self, sync: bool) -> list[np.ndarray]:
        """Sync the target if ``sync``; a numpy copy of the online weights (``[w0, b0, ...]``).
        One graph call: it is on the critical path, where each eager read or call costs ~1 ms
        from cold caches."""
        return [w.numpy() for w in self._sync_and_read(sync)]

    def _sync_and_read_graph(self, sync: bool) -> list[tf.Tensor]:
        if sync:
            update_target(self.target.weights, self.q.weights)
        return [tf.identity(w) for w in self.q.weights]


class DQN(QAgent):
    """`QAgent` with MLP Q-networks over ``obs_dim`` (`obs_size`) flattened observation values."""

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        config: DQNConfig,
        learning_rate: float | Schedule | None = None,
    ) -> None:
        sizes = [obs_dim, *config.hidden_sizes, num_actions]
        q = mlp(sizes, seed=config.seed, name="q")
        target = mlp(sizes, seed=config.seed, name="q_target")
        super().__init__(q, target, num_actions, config, learning_rate, name="dqn")


#: what a training job returns: the call's metrics and the new acting weights
JobResult = tuple[dict[str, float], list[np.ndarray]]


def flat_obs(obs: Any) -> tf.Tensor:
    """``[B, ...]`` -> ``[B, D]`` float32; nested (Dict, Tuple) as the actors' `flat_features`."""
    if isinstance(obs, (dict, tuple)):
        leaves = flatten_nest(obs)
        n = tf.shape(next(iter(leaves.values())))[0]
        return tf.concat(
            [tf.reshape(tf.cast(leaves[p], tf.float32), [n, -1]) for p in sorted(leaves)], axis=1
        )
    return tf.reshape(tf.cast(obs, tf.float32), [tf.shape(obs)[0], -1])


def obs_size(space: gym.Space) -> int:
    """D, the flat network input size of one observation of ``space`` (see `flat_obs`)."""
    if isinstance(space, gym.spaces.Dict):
        return sum(obs_size(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return sum(obs_size(s) for s in space.spaces)
    return int(np.prod(space.shape))


def make_agent(config: DQNConfig, env: gym.Env) -> DQN:
    """The agent for ``env`` (its networks; what ``replaygpu eval`` restores)."""
    return DQN(obs_size(env.observation_space), int(env.action_space.n), config)


def greedy_policy(agent: DQN) -> Callable[[np.ndarray], np.ndarray]:
    """The agent's greedy numpy policy (``[B, *obs] -> [B]`` actions)."""
    return greedy_q_policy(agent.q.get_weights())


def evaluate_agent(config: DQNConfig, agent: DQN, episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes of ``agent`` (``replaygpu eval``)."""
    return evaluate(greedy_policy(agent), config.env_id, episodes, seed)


def distribution(config: Any) -> rg.Uniform | rg.Prioritized:
    """Prioritized (|TD error| priorities) with ``config.prioritized``, else uniform."""
    if config.prioritized:
        return rg.Prioritized(config.priority_alpha, config.priority_beta)
    return rg.Uniform()


def fused_learner(table: rg.ReplayTable, sampler: Any, agent: Any, config: Any) -> rg.Learner:
    """A demo agent's (DQN, R2D2) `rg.Learner`, no autograph: no Python control flow on tensors."""
    return rg.Learner(
        table,
        sampler,
        agent.update,
        batch_size=config.batch_size,
        jit_compile=config.jit_compile,
        autograph=False,
        chunk_steps=config.gradient_steps,
    )


def train(
    config: DQNConfig, recorder: Recorder | None = None, run: RunControl | None = None
) -> TrainResult:
    """Train DQN for ``config.steps`` env steps, then evaluate the weights it hands back: with
    ``keep_best`` the best of the periodic and final evaluations (`BestPolicy`), else the final.
    A ``run`` resumes and checkpoints (`runs.RunControl`); stopped by a signal, the result has
    ``stopped`` set and no evaluation.

    Raises:
        ConfigError: the env's action space is not Discrete.
    """
    recorder = recorder or NullRecorder()
    check_env(config.env_id).close()
    env = make_vector_env(config.env_id, config.num_envs, config.seed)
    spec = specs_from_env(env)
    narrow = config.storage_dtype != "float32"
    # "obs" and "next_obs", or their leaf paths for a Dict observation
    observation_fields = flatten_nest({"obs": spec["obs"], "next_obs": spec["next_obs"]})
    table = rg.ReplayTable(
        spec,
        config.buffer_size,
        device=config.device or None,
        storage_dtypes=dict.fromkeys(observation_fields, config.storage_dtype) if narrow else None,
    )
    obs_dim = obs_size(env.single_observation_space)
    num_actions = int(env.single_action_space.n)
    with tf.device(table.device):
        agent = DQN(obs_dim, num_actions, config, config.learning_rate_schedule)
    sampler = rg.Sampler(table, seed=config.seed)
    learner = fused_learner(table, sampler, agent, config)
    # in every checkpoint, whatever keep_best says, so a resumed run may change it
    best = BestPolicy(agent.q.get_weights())
    rng, loop, env_steps, last_sync = runs.resume(
        run, config.seed, learner, table=table, sampler=sampler, agent=agent, best_policy=best
    )
    if not config.keep_best:
        best.forget()
    acting = ChunkCollector(
        env, host_spec(spec), config.train_freq, recorder.episode, config.seed, env_steps
    )
    act_weights = agent.q.get_weights()
    act_greedy = greedy_q_policy(act_weights)
    acted_since = env_steps  # the env step whose training call gave act_weights
    sgd_steps = int(learner.steps.numpy())
    # Once training has started, only the jobs touch the table, networks and learner variables.
    jobs: TrainingJobs[JobResult] = TrainingJobs(config.overlap_training, "dqn-train")

    def policy(obs: Any, step: int) -> np.ndarray:
        return epsilon_greedy_actions(act_greedy, obs, config.epsilon(step), num_actions, rng)

    def training_job(
        batch: dict[str, np.ndarray], num_steps: int, sync: bool, entering: Callable[[], None]
    ) -> JobResult:
        table.append(batch)  # the table is written only between training calls
        entering()
        metrics = timer.train(learner, num_steps)
        return metrics, agent.sync_and_mirror(sync)

    def finish_oldest() -> None:
        nonlocal act_weights, act_greedy, acted_since, sgd_steps
        (metrics, act_weights), at_steps = jobs.finish_oldest()
        acted_since = at_steps
        sgd_steps += int(metrics.pop("steps"))
        act_greedy = greedy_q_policy(act_weights)
        metrics["charts/epsilon"] = config.epsilon(at_steps)
        recorder.metrics(at_steps, metrics)

    def finish_all() -> None:
        while jobs.pending:
            finish_oldest()

    timer = TrainTimer(env_steps)
    try:
        while env_steps < config.steps:
            # one chunk of train_freq env steps (the last: what is left of steps)
            size, chunk_sgd_steps = next_chunk(config, env_steps)
            batch = acting.collect(policy, size)
            env_steps = acting.env_steps
            if env_steps <= config.learning_starts:
                table.append(batch)  # no job before training starts
            else:
                # gradient_steps (pro rata for a shorter last chunk) in one call; the target
                # sync is decided here, in call order, as if after the call
                sync = env_steps - last_sync >= config.target_update_interval
                if sync:
                    last_sync = env_steps
                job = functools.partial(training_job, batch, chunk_sgd_steps, sync)
                jobs.run(job, env_steps)
                while jobs.pending > jobs.lag:  # the job before: its weights act the next chunk
                    finish_oldest()
            recorder.progress(env_steps, sgd_steps, acting.recent_return)
            final = env_steps >= config.steps
            if final:
                finish_all()  # the final weights are evaluated too
            if evaluation_due(config, env_steps - size, env_steps, final):
                # at the env step whose training call gave the acting weights
                play = functools.partial(evaluate, act_greedy, config.env_id)
                evaluate_while_training(config, recorder, best, acted_since, play, act_weights)
            if runs.checkpoint_when_due(
                run, loop, env_steps, last_sync, rng, final=final, settle=finish_all
            ):
                break
        finish_all()
    finally:
        jobs.close()
    acting.close()
    evaluated = FINAL_WEIGHTS
    if best.found:
        act_greedy, evaluated = greedy_q_policy(best.numpy_weights()), best.describe()
    return timer.finish(
        runs.stopped_early(run, env_steps, config.steps),
        lambda: evaluate(act_greedy, config.env_id, config.eval_episodes, config.seed + 10_000),
        env_steps,
        sgd_steps,
        recorder,
        evaluated,
    )


class VectorDQN(VectorBuilder):
    """Served Ape-X DQN on vectors (`ApexConfig`; ``demo apex-cartpole``, ``replaygpu learner``):
    `DQN`'s update on 3-step returns per actor env. Priorities are |TD error| (alpha 0.6, beta
    0.4) as in the paper, but new rows get the max priority so far, not actor-computed ones
    (actors would need the target network)."""

    syncs_target = True
    stream_field = STREAM_FIELD
    greedy_policy = staticmethod(greedy_policy)

    def make_agent(self, config: ApexConfig, env: gym.Env) -> DQN:
        obs_dim = obs_size(env.observation_space)
        return DQN(obs_dim, int(env.action_space.n), config, config.learning_rate_schedule)

    def make_sampler(self, config: ApexConfig, table: Table) -> rg.Sampler:
        # Actors' batches interleave in the table; the stream field keeps a return in one env.
        view = rg.NStep(config.n_step, config.gamma, stream_field=STREAM_FIELD)
        return rg.Sampler(table, distribution(config), view, seed=config.seed)

    def policy(self, agent: DQN) -> Any:
        return agent.q
