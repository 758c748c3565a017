"""R2D2 (Kapturowski et al. 2019): recurrent DQN on prioritized, overlapping sequences (windows
of the stored steps).

Reads top to bottom: the loss's pieces (value rescaling, n-step double-Q targets inside a
sequence, eta-mixed priorities), the agent, the table and sampler, and the training loop of
``replaygpu demo r2d2-cartpole``.

Each table row is one env step with the LSTM state the actor had *before* it (``concat([h, c])``),
stored every ``period`` steps of an episode (``state_stored`` marks those rows). A prioritized
`rg.Sequence` view draws ``[B, burn_in + T]`` windows that start at a stored state (``[B, 2U]``),
with a mask that ends at the episode's end. The update unrolls the burn-in from that state without
gradients, then the T steps, with n-step double-Q targets in the rescaled space `value_rescale`;
all of it, the target sync included, runs in `rg.Learner`'s XLA-compiled ``tf.while_loop``.
Acting never calls TensorFlow: the actor steps a numpy mirror (`acting.RecurrentQPolicy`) and
resets its state at episode starts.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

import gymnasium as gym
import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.keys import IMPORTANCE_WEIGHTS, MASK, PRIORITIES
from replaygpu.specs import host_spec, specs_from_env
from replaygpu.table import Table
from replaygpu.targets import update_target

from ..builder import Builder
from ..dqn.agent import fused_learner, obs_size
from ..envs import discrete_actions_env as check_env
from ..evaluation import BestPolicy, evaluate_while_training, evaluation_due
from ..networks import Adam
from ..progress import FINAL_WEIGHTS, NullRecorder, Recorder, TrainResult, TrainTimer
from ..rollouts import EpisodeStats, evaluate
from ..runs import RunControl, checkpoint_when_due, resume, stopped_early
from .acting import RecurrentQPolicy
from .config import R2D2Config, R2D2LearnerConfig, R2D2Settings
from .experience import BLOCK_START, STATE_STORED
from .experience import STATE_FIELD as STATE
from .network import LSTMQNetwork, unroll_together

logger = logging.getLogger(__name__)


def value_rescale(x: tf.Tensor, eps: float) -> tf.Tensor:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al. 2018)."""
    return tf.sign(x) * (tf.sqrt(tf.abs(x) + 1.0) - 1.0) + eps * x


def value_rescale_inverse(x: tf.Tensor, eps: float) -> tf.Tensor:
    """``h^-1(x)``; the identity for ``eps = 0`` is ``sign(x) ((|x| + 1)^2 - 1)``."""
    if eps == 0.0:
        return tf.sign(x) * (tf.square(tf.abs(x) + 1.0) - 1.0)
    root = (tf.sqrt(1.0 + 4.0 * eps * (tf.abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return tf.sign(x) * (tf.square(root) - 1.0)


def _ahead(x: tf.Tensor, k: int) -> tf.Tensor:
    """``x[:, t + k]`` at every t of ``[B, T]``, zeros (False) past T."""
    return tf.concat([x[:, k:], tf.zeros_like(x[:, :k])], axis=1)


def n_step_targets(
    reward: tf.Tensor,
    terminated: tf.Tensor,
    mask: tf.Tensor,
    value: tf.Tensor,
    gamma: float,
    n: int,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Raw n-step returns inside windows, as ``(targets [B, T] float32, has_target [B, T] bool)``.

    Step t's target is ``sum_{i<k} gamma^i r_{t+i} + gamma^k value_{t+k}`` with the largest
    ``k <= n`` whose step is real (``mask``) and not after a termination; if the episode
    terminates at ``t + i < t + n``, the rewards up to there without a bootstrap. A step with
    neither (the window's or a truncated episode's last real step) has no target.

    Args:
        reward, terminated, mask: ``[B, T]`` (float32, bool, float32).
        value: ``[B, T]`` raw bootstrap values (target net at the online greedy action, ``h^-1``).
    """
    real = mask > 0
    has = real & terminated
    ret = reward
    target = tf.where(has, ret, tf.zeros_like(ret))
    alive = real & tf.logical_not(terminated)
    for k in range(1, n + 1):
        usable = alive & (_ahead(mask, k) > 0)
        target = tf.where(usable, ret + gamma**k * _ahead(value, k), target)
        has = has | usable
        if k < n:
            ret = ret + tf.where(usable, gamma**k * _ahead(reward, k), tf.zeros_like(ret))
            ends = usable & _ahead(terminated, k)
            target = tf.where(ends, ret, target)
            has = has | ends
            alive = usable & tf.logical_not(_ahead(terminated, k))
    return target, has


def mixed_priorities(abs_td: tf.Tensor, has: tf.Tensor, eta: float) -> tf.Tensor:
    """``[B]`` priorities ``eta * max_t |TD| + (1 - eta) * mean_t |TD|`` over the steps with a
    target (``has [B, T]``). A sequence without one (drawn before its next steps were written)
    gets the batch's largest, as a new row does, so it is drawn again once they are there."""
    weight = tf.cast(has, abs_td.dtype)
    count = tf.reduce_sum(weight, axis=1)
    mean = tf.reduce_sum(abs_td * weight, axis=1) / tf.maximum(count, 1.0)
    priority = eta * tf.reduce_max(abs_td * weight, axis=1) + (1.0 - eta) * mean
    return tf.where(count > 0, priority, tf.reduce_max(priority))


class R2D2(tf.Module):
    """Online, target `LSTMQNetwork` (``obs_dim``: flat obs size), Adam, fused sequence update."""

    def __init__(self, obs_dim: int, num_actions: int, config: R2D2Settings) -> None:
        super().__init__(name="r2d2")
        self.config = config
        self.num_actions = int(num_actions)
        sizes = (obs_dim, num_actions, config.torso_size, config.lstm_units, config.seed)
        self.q = LSTMQNetwork(*sizes, loop=config.jit_compile, name="q")
        self.target = LSTMQNetwork(*sizes, loop=config.jit_compile, name="q_target")
        update_target(self.target.weights, self.q.weights)
        self.optimizer = Adam(self.q.weights, config.learning_rate_schedule, config.max_grad_norm)
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
        self._read = tf.function(lambda: [tf.identity(w) for w in self.q.weights])

    @property
    def state_spec(self) -> tf.TensorSpec:
        """The spec of one stored recurrent state: ``[2 * lstm_units]`` float32."""
        return tf.TensorSpec([self.q.state_size], tf.float32)

    def loss(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """``{"loss": scalar, "abs_td": [B, T], "has_target": [B, T] bool, "q": [B, T]}`` of a
        batch of windows; gradients flow through the T trained steps only, not the burn-in or
        the targets."""
        cfg = self.config
        burn, eps = cfg.burn_in, cfg.rescale_epsilon
        obs = tf.cast(batch["obs"], tf.float32)
        steps = obs.shape[1]
        obs = tf.reshape(obs, [tf.shape(obs)[0], steps, -1])
        mask, state = batch[MASK], batch[STATE]
        nets, states = [self.q, self.target], [state, state]
        if burn:  # no gradients: from the stored state to the trained steps' start
            _, states = unroll_together(nets, obs[:, :burn], states, mask[:, :burn], trained=0)
        obs, mask = obs[:, burn:], mask[:, burn:]
        (q, q_target), _ = unroll_together(nets, obs, states, mask, trained=1)
        greedy = tf.one_hot(tf.argmax(q, axis=2), self.num_actions)  # double Q
        value = value_rescale_inverse(tf.reduce_sum(q_target * greedy, axis=2), eps)
        reward = tf.cast(batch["reward"][:, burn:], tf.float32)
        ret, has = n_step_targets(
            reward, batch["terminated"][:, burn:], mask, value, cfg.gamma, cfg.n_step
        )
        target = tf.stop_gradient(value_rescale(ret, eps))
        taken = tf.one_hot(batch["action"][:, burn:], self.num_actions)
        q_taken = tf.reduce_sum(q * taken, axis=2)
        td = target - q_taken
        abs_td = tf.abs(td)
        huber = tf.where(abs_td <= 1.0, 0.5 * tf.square(td), abs_td - 0.5)
        weight = tf.cast(has, tf.float32)
        if IMPORTANCE_WEIGHTS in batch:
            weight *= batch[IMPORTANCE_WEIGHTS][:, None]
        loss = tf.reduce_sum(weight * huber) / tf.maximum(
            tf.reduce_sum(tf.cast(has, tf.float32)), 1.0
        )
        return {"loss": loss, "abs_td": abs_td, "has_target": has, "q": q_taken}

    def update(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """One SGD step on ``[B, burn_in + T]`` windows; syncs the target every
        ``target_update_period`` steps. Runs inside `Learner.train` (under XLA)."""
        with tf.GradientTape() as tape:
            out = self.loss(batch)
        self.optimizer.apply(tape.gradient(out["loss"], self.q.weights))
        updates = self.updates.assign_add(1)
        sync = tf.equal(updates % self.config.target_update_period, 0)
        for source, target in zip(self.q.weights, self.target.weights, strict=True):
            target.assign(tf.where(sync, source, target))
        has = tf.cast(out["has_target"], tf.float32)
        return {
            "losses/td_loss": out["loss"],
            "losses/q_values": tf.reduce_sum(out["q"] * has) / tf.maximum(tf.reduce_sum(has), 1.0),
            PRIORITIES: mixed_priorities(
                out["abs_td"], out["has_target"], self.config.priority_eta
            ),
        }

    def acting_weights(self) -> list[np.ndarray]:
        """A numpy copy of the online weights for `acting.RecurrentQPolicy` (one graph call)."""
        return [w.numpy() for w in self._read()]


def make_agent(config: R2D2Settings, env: gym.Env) -> R2D2:
    """The agent for ``env`` (its networks; what ``replaygpu eval`` restores)."""
    return R2D2(obs_size(env.observation_space), int(env.action_space.n), config)


def table_spec(config: R2D2Settings, env: gym.Env) -> dict[str, tf.TensorSpec]:
    """One row: obs, action, reward, terminated, truncated, the state before the step
    (``[2 * lstm_units]``) and whether it is stored there."""
    spec = specs_from_env(env)
    spec.pop("next_obs")  # targets come from the next rows of the window
    spec[STATE] = tf.TensorSpec([2 * config.lstm_units], tf.float32)
    spec[STATE_STORED] = tf.TensorSpec([], tf.bool)
    return spec


def make_sampler(config: R2D2Settings, table: Table, agent: R2D2) -> rg.Sampler:
    """Prioritized ``[B, burn_in + T]`` windows with the stored state at their start.

    Raises:
        ConfigError: the table's state field does not match the agent's network, or the
            table has none (the `rg.Sequence` view's check).
    """
    stored = table.spec.get(STATE)
    want = agent.state_spec
    if stored is not None and (stored.shape != want.shape or stored.dtype != want.dtype):
        raise rg.ConfigError(
            f"state_field '{STATE}': got {stored.dtype.name}{stored.shape.as_list()} in table "
            f"'{table.name}', expected {want.dtype.name}{want.shape.as_list()} (h and c of the "
            f"network's {config.lstm_units} LSTM units); store the network's state, or set "
            "lstm_units to the actors'"
        )
    return sequence_sampler(config, table)


def sequence_sampler(
    config: R2D2Settings, table: Table, start_field: str | None = None
) -> rg.Sampler:
    """`make_sampler`'s sampler, unchecked against a network; ``start_field``: a bool field where
    windows must stop (`experience.RecurrentExperience` marks each block's first row), None:
    at episode ends only. Raises ConfigError when the table has no state field."""
    view = rg.Sequence(
        config.trace_length,
        config.burn_in,
        pad=True,
        start_field=start_field,
        state_field=STATE,
        state_start_field=STATE_STORED,
    )
    distribution = rg.Prioritized(config.priority_exponent, config.importance_exponent)
    return rg.Sampler(table, distribution, view, seed=config.seed)


def evaluate_weights(
    config: R2D2Settings, weights: list[np.ndarray], episodes: int, seed: int
) -> np.ndarray:
    """Greedy returns of the network ``weights`` (`R2D2.acting_weights`) over ``episodes``
    episodes (seeds ``seed + i``), the state reset at each start."""
    env = gym.make(config.env_id)
    policy = RecurrentQPolicy(weights, int(env.action_space.n))
    env.close()
    return evaluate(policy, config.env_id, episodes, seed, on_reset=policy.reset)


def evaluate_agent(config: R2D2Settings, agent: R2D2, episodes: int, seed: int) -> np.ndarray:
    """`evaluate_weights` of the agent's online network."""
    return evaluate_weights(config, agent.acting_weights(), episodes, seed)


def train(
    config: R2D2Config, recorder: Recorder | None = None, run: RunControl | None = None
) -> TrainResult:
    """Train R2D2 on ``config.env_id`` with one env, then evaluate the weights it hands back
    (with ``keep_best`` the best of the periodic and final evaluations, else the final). Every
    ``train_freq`` env steps: one table append, ``gradient_steps`` SGD steps in one `Learner.train`
    call. ``run``: see `runs.RunControl`. Raises ConfigError unless the actions are Discrete."""
    recorder = recorder or NullRecorder()
    env = check_env(config.env_id)
    num_actions = int(env.action_space.n)
    spec = table_spec(config, env)
    table = rg.ReplayTable(spec, config.buffer_size, device=config.device or None)
    with tf.device(table.device):
        agent = make_agent(config, env)
    sampler = make_sampler(config, table, agent)
    learner = fused_learner(table, sampler, agent, config)
    # in every checkpoint, whatever keep_best says, so a resumed run may change it
    best = BestPolicy(agent.acting_weights())
    rng, loop, env_steps, _ = resume(
        run, config.seed, learner, table=table, sampler=sampler, agent=agent, best_policy=best
    )
    if not config.keep_best:
        best.forget()
    host = host_spec(spec)
    columns = {k: np.zeros((config.train_freq, *f.shape), f.numpy_dtype) for k, f in host.items()}
    actor = RecurrentQPolicy(agent.acting_weights(), num_actions)
    sgd_steps = int(learner.steps.numpy())
    stats = EpisodeStats(1)
    obs, _ = env.reset(seed=config.seed + env_steps)
    env.action_space.seed(config.seed)
    timer = TrainTimer(env_steps)  # rates over this process's work (a resumed run)
    while env_steps < config.steps:
        for i in range(config.train_freq):
            stored = stats.lengths[0] % config.period == 0  # every period steps of an episode
            action, state = actor.act(obs, config.epsilon(env_steps), rng)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            row = (obs, action, reward, terminated, truncated, state, stored)
            for name, value in zip(ROW_FIELDS, row, strict=True):
                columns[name][i] = value
            env_steps += 1
            obs = next_obs
            done = terminated or truncated
            for episodic_return, length in stats.step(np.array([reward]), np.array([done])):
                recorder.episode(env_steps, episodic_return, length)
            if done:
                obs, _ = env.reset()
                actor.reset()
        table.append({k: v.copy() for k, v in columns.items()})
        if env_steps >= config.learning_starts:
            metrics = timer.train(learner, config.gradient_steps)
            sgd_steps += int(metrics.pop("steps"))
            actor.weights = agent.acting_weights()
            metrics["charts/epsilon"] = config.epsilon(env_steps)
            recorder.metrics(env_steps, metrics)
        recorder.progress(env_steps, sgd_steps, stats.recent_mean)
        final = env_steps >= config.steps
        if evaluation_due(config, env_steps - config.train_freq, env_steps, final):
            play = functools.partial(evaluate_weights, config, actor.weights)
            evaluate_while_training(config, recorder, best, env_steps, play, actor.weights)
        if checkpoint_when_due(run, loop, env_steps, 0, rng, final=final):
            break
    env.close()
    weights, evaluated = actor.weights, FINAL_WEIGHTS
    if best.found:
        weights, evaluated = best.numpy_weights(), best.describe()
    return timer.finish(
        stopped_early(run, env_steps, config.steps),
        lambda: evaluate_weights(config, weights, config.eval_episodes, seed=config.seed + 10_000),
        env_steps,
        sgd_steps,
        recorder,
        evaluated,
    )


#: the order of a row's values in `train`'s acting loop
ROW_FIELDS = ("obs", "action", "reward", "terminated", "truncated", STATE, STATE_STORED)


class ServedR2D2(Builder):
    """R2D2 (`R2D2LearnerConfig`) on the steps of `experience.RecurrentExperience`: blocks of one
    env's steps, each stored once, the LSTM state marked where windows may start
    (`STATE_STORED`), the first row of each block (`BLOCK_START`) where windows stop."""

    agent = "r2d2"
    make_agent = staticmethod(make_agent)

    def make_table(
        self, config: R2D2LearnerConfig, env: gym.Env
    ) -> tuple[Table, contextlib.AbstractContextManager[Any]]:
        spec = {**table_spec(config, env), BLOCK_START: tf.TensorSpec([], tf.bool)}
        table = rg.ReplayTable(spec, config.buffer_size, device=config.device or None)
        return table, tf.device(table.device)

    def make_sampler(self, config: R2D2LearnerConfig, table: Table) -> rg.Sampler:
        # the table is the config's: its state field is the network's
        return sequence_sampler(config, table, start_field=BLOCK_START)

    def policy(self, agent: R2D2) -> Any:
        return lambda: agent.q.weights  # the order `acting.numpy_lstm_step` reads

    def actor_fields(self, config: R2D2LearnerConfig) -> dict[str, Any]:
        return {"sequence_period": config.period, "sequence_length": config.sequence_length}

    def evaluate(
        self, config: R2D2LearnerConfig, agent: R2D2, episodes: int, seed: int
    ) -> np.ndarray:
        return evaluate_agent(config, agent, episodes, seed)
