"""DQN on CartPole-v1 learns: its greedy return ends far above a random policy's."""

import numpy as np
import tensorflow as tf

from replaygpu.agents.dqn import agent as dqn
from replaygpu.agents.progress import NullRecorder
from replaygpu.agents.rollouts import evaluate


def test_dqn_cartpole_greedy_return_is_far_above_random_within_15k_steps():
    recorder = NullRecorder()
    result = dqn.train(dqn.DQNConfig(seed=0, steps=15_000, eval_episodes=10), recorder)

    rng = np.random.default_rng(0)
    random_returns = evaluate(
        lambda obs: rng.integers(2, size=len(obs)), "CartPole-v1", episodes=10, seed=10_000
    )
    trained = result.eval_returns.mean()
    assert random_returns.mean() < 40  # a random policy balances ~22 steps
    assert trained >= 3 * random_returns.mean(), (trained, random_returns.mean())
    assert trained >= 75, result.eval_returns
    assert result.env_steps == 15_000
    # after each chunk of 256 past 1,000 env steps, 1,024 to 14,848; then 152 steps trained 76
    assert result.sgd_steps == 128 * ((14_848 - 1_024) // 256 + 1) + 128 * 152 // 256
    assert np.isfinite(recorder.last_metrics["losses/td_loss"])


class _CallLog(NullRecorder):
    """Records the env step of every training call's metrics (not the evaluations')."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def metrics(self, step, values):
        super().metrics(step, values)
        if "losses/td_loss" in values:
            self.calls.append(step)


def test_overlapped_training_keeps_the_sequential_schedule_of_sgd_steps_per_chunk():
    results, logs = {}, {}
    for overlap in (True, False):
        logs[overlap] = _CallLog()
        config = dqn.DQNConfig(
            seed=3, steps=3_000, gradient_steps=8, eval_episodes=1, overlap_training=overlap
        )
        results[overlap] = dqn.train(config, logs[overlap])
    # one call per chunk past 1,000 env steps, at its env step; the last chunk ends at 3,000
    chunks_after_start = [s for s in range(256, 3_000, 256) if s > 1_000] + [3_000]
    for overlap in (True, False):
        assert results[overlap].env_steps == 3_000  # whole chunks ran 3,072
        assert logs[overlap].calls == chunks_after_start
        assert results[overlap].sgd_steps == 8 * (len(chunks_after_start) - 1) + 8 * 184 // 256
        assert np.isfinite(logs[overlap].last_metrics["losses/td_loss"])


def test_sync_and_mirror_returns_the_online_weights_and_syncs_the_target_only_when_asked():
    agent = dqn.DQN(4, 2, dqn.DQNConfig(hidden_sizes=(8,)))
    for w in agent.q.weights:  # the online net moves away from the target
        w.assign_add(tf.ones_like(w))
    before = [t.numpy() for t in agent.target.weights]
    mirror = agent.sync_and_mirror(False)
    for m, w, t, b in zip(mirror, agent.q.weights, agent.target.weights, before, strict=True):
        np.testing.assert_array_equal(m, w.numpy())
        np.testing.assert_array_equal(t.numpy(), b)  # target untouched
    first = agent.q.weights[0].numpy().copy()
    agent.q.weights[0].assign_add(tf.ones_like(agent.q.weights[0]))
    np.testing.assert_array_equal(mirror[0], first)  # a snapshot, not the live variable
    mirror = agent.sync_and_mirror(True)
    for m, w, t in zip(mirror, agent.q.weights, agent.target.weights, strict=True):
        np.testing.assert_array_equal(m, w.numpy())
        np.testing.assert_array_equal(t.numpy(), w.numpy())
