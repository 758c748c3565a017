"""A DQN run hands back the weights of its best greedy evaluation while training (keep_best):
the evaluations, the choice, the checkpoint that keeps it, `replaygpu eval` and resuming a run
checkpointed before it existed."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents.dqn import agent as dqn
from replaygpu.agents.dqn.config import DQNConfig
from replaygpu.agents.evaluation import PERIODIC_EVAL_SEED, BestPolicy, evaluation_due, load_kept
from replaygpu.agents.progress import NullRecorder
from replaygpu.agents.r2d2.config import R2D2Config
from replaygpu.agents.rollouts import evaluate
from replaygpu.agents.runs import RunControl

SMALL = dict(
    steps=3_000,
    learning_starts=500,
    gradient_steps=16,
    hidden_sizes=(32, 32),
    jit_compile=False,
    eval_episodes=3,
    eval_every=512,
    periodic_eval_episodes=2,
)


def _leaning_policy(obs: np.ndarray) -> np.ndarray:
    """Push towards where the pole leans: episodes of different lengths for different seeds."""
    return (obs[:, 2] > 0).astype(np.int64)


class _Evals(NullRecorder):
    def __init__(self):
        super().__init__()
        self.evals = []

    def metrics(self, step, values):
        super().metrics(step, values)
        if "eval/periodic_return" in values:
            self.evals.append((step, values["eval/periodic_return"]))


def test_evaluation_is_due_once_per_interval_crossed_and_never_for_zero():
    every = DQNConfig(eval_every=2500, keep_best=False)
    assert evaluation_due(every, 2304, 2560)
    assert not evaluation_due(every, 2560, 2816)
    assert evaluation_due(every, 4864, 5000)  # the boundary itself
    assert not evaluation_due(every, 5000, 5120)
    assert not evaluation_due(every, 5000, 5120, final=True)  # no kept weights to compete for
    never = DQNConfig(eval_every=0, keep_best=False)
    assert not evaluation_due(never, 0, 10**6)


def test_the_final_weights_are_evaluated_when_the_best_are_kept():
    config = DQNConfig(eval_every=2500, keep_best=True)
    assert evaluation_due(config, 5000, 5120, final=True)
    assert not evaluation_due(config, 5000, 5120)
    assert evaluation_due(DQNConfig(eval_every=0, keep_best=True), 0, 10**6, final=True)


def test_best_policy_keeps_the_best_mean_ties_to_the_later_weights(tmp_path):
    like = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]
    best = BestPolicy(like)
    assert not best.found

    def weights(v):
        return [np.full((2, 3), v, np.float32), np.full(3, v, np.float32)]

    assert best.consider(100, np.array([10.0, 30.0]), weights(1))
    assert not best.consider(200, np.array([5.0, 5.0]), weights(2))
    assert best.consider(300, np.array([20.0, 20.0]), weights(3))  # a tie: the later
    assert not best.consider(400, np.array([19.0, 20.0]), weights(4))
    assert best.found and int(best.env_step.numpy()) == 300
    assert all((w == 3).all() for w in best.numpy_weights())
    assert best.describe() == (
        "the weights of env step 300, the best of 4 greedy evaluations during training "
        "(mean return 20.0 there)"
    )
    # kept in a checkpoint
    path = tf.train.Checkpoint(best_policy=best).write(str(tmp_path / "ckpt"))
    restored = BestPolicy(like)
    tf.train.Checkpoint(best_policy=restored).read(path).assert_consumed()
    assert int(restored.env_step.numpy()) == 300
    assert all((w == 3).all() for w in restored.numpy_weights())


def test_episodes_side_by_side_return_what_one_by_one_returns():
    side_by_side = evaluate(_leaning_policy, "CartPole-v1", 6, seed=7)
    one_by_one = evaluate(_leaning_policy, "CartPole-v1", 6, seed=7, on_reset=lambda: None)
    np.testing.assert_array_equal(side_by_side, one_by_one)
    assert len(set(side_by_side.tolist())) > 1  # the seeds gave different episodes


def test_dqn_hands_back_and_checkpoints_the_weights_of_its_best_evaluation(tmp_path):
    # a run whose best evaluation is neither the first nor the last, above the final weights'
    # (seed 2 with the uniform draws of full-range int64 modulo the size; seeds 1-6 give
    # 768 < best < 3000 for 2, 4 and 6)
    config = dqn.DQNConfig(seed=2, learning_rate=1e-2, **SMALL)
    recorder = _Evals()
    folder = str(tmp_path / "ckpt")
    with RunControl(folder, 3600.0, config) as run:
        result = dqn.train(config, recorder, run)
    # an evaluation in each chunk that crosses a multiple of 512 env steps, recorded at the step
    # of the weights it played (one chunk behind, training overlaps acting), and one of the
    # final weights
    assert [s for s, _ in recorder.evals] == [0, 768, 1280, 1792, 2304, 3000]
    best_step, best_mean = max(recorder.evals, key=lambda e: (e[1], e[0]))  # ties: the later
    assert best_step != 3000 and best_mean > recorder.evals[-1][1], recorder.evals
    assert result.evaluated == (
        f"the weights of env step {best_step}, the best of 6 greedy evaluations during training "
        f"(mean return {best_mean:.1f} there)"
    )

    # the final checkpoint holds those weights, not the final ones
    latest = tf.train.latest_checkpoint(folder)
    env = dqn.check_env(config.env_id)
    agent = dqn.make_agent(config, env)
    env.close()
    tf.train.Checkpoint(agent=agent).read(latest).expect_partial()
    periodic_seed = config.seed + PERIODIC_EVAL_SEED
    final = evaluate(
        dqn.greedy_policy(agent), config.env_id, config.periodic_eval_episodes, periodic_seed
    )
    assert final.mean() == recorder.evals[-1][1]
    assert load_kept(agent.q.weights, latest) == result.evaluated
    kept = dqn.greedy_policy(agent)
    replayed = evaluate(kept, config.env_id, config.periodic_eval_episodes, periodic_seed)
    assert replayed.mean() == best_mean
    again = evaluate(kept, config.env_id, config.eval_episodes, config.seed + 10_000)
    np.testing.assert_array_equal(again, result.eval_returns)
    # and `replaygpu eval` plays them
    out = subprocess.run(
        [sys.executable, "-m", "replaygpu", "eval", folder, "--episodes", "3",
         "--seed", str(config.seed + 10_000)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"mean return {result.eval_returns.mean():.1f}" in out.stdout
    assert result.evaluated in out.stdout


def test_without_keep_best_the_final_weights_are_handed_back(tmp_path):
    config = dqn.DQNConfig(seed=1, learning_rate=1e-2, keep_best=False, **SMALL)
    recorder = _Evals()
    folder = str(tmp_path / "ckpt")
    with RunControl(folder, 3600.0, config) as run:
        result = dqn.train(config, recorder, run)
    assert result.evaluated == "the final weights"
    # periodic evaluations still show the learning; none added for the final weights
    assert [s for s, _ in recorder.evals] == [0, 768, 1280, 1792, 2304]
    # the checkpoint keeps no weights apart: `replaygpu eval` plays the final ones, whatever a
    # resumed run's config says of keep_best
    agent = dqn.DQN(4, 2, config)
    before = agent.q.get_weights()
    assert load_kept(agent.q.weights, tf.train.latest_checkpoint(folder)) is None
    for have, had in zip(agent.q.get_weights(), before, strict=True):
        np.testing.assert_array_equal(have, had)  # and the weights stay as they were


@pytest.mark.parametrize(
    "flag, message",
    [
        ({"eval_every": -1}, "eval_every: got -1, expected >= 0"),
        ({"periodic_eval_episodes": 0}, "periodic_eval_episodes: got 0, expected >= 1"),
    ],
)
@pytest.mark.parametrize("config_class", [dqn.DQNConfig, R2D2Config])
def test_bad_evaluation_settings_are_refused(flag, message, config_class):
    with pytest.raises(rg.ConfigError, match=message):
        config_class(**flag)
