"""Greedy evaluations while training, and the weights of the best one (rl-zoo3's best model).

The greedy policy of DQN on CartPole swings from one training call to the next: over a run's
last chunks its return jumps between ~100 and 500, so the final weights are a draw
(benchmarks/README.md, "CartPole: the best evaluated weights"). `BestPolicy` keeps a copy of the
weights of the best of the periodic evaluations (``eval_every`` env steps, the same
``periodic_eval_episodes`` seeds each time, ties to the later weights) and of the final weights;
the run hands those back. Its variables are checkpointed with the run, so a resumed run keeps
them and ``replaygpu eval`` plays them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

logger = logging.getLogger(__name__)

#: the first seed of the periodic evaluations' episodes, above the run's seed; the final
#: evaluation uses ``seed + 10_000 + i``, so its episodes are not those the weights were picked on
PERIODIC_EVAL_SEED = 30_000


def evaluation_due(every: int, before: int, after: int) -> bool:
    """Whether a periodic evaluation falls in the env steps ``(before, after]`` (every ``every``
    steps; ``every`` 0: never)."""
    return every > 0 and after // every > before // every


class BestPolicy(tf.Module):
    """The weights of the best greedy evaluation so far, with its mean return and env step.

    Args:
        like: the acting weights (numpy arrays) whose shapes and dtypes the copy has.
    """

    def __init__(self, like: Sequence[np.ndarray]) -> None:
        super().__init__(name="best_policy")
        with tf.device("CPU:0"):  # a host copy: read only to act, written only on a new best
            self.weights = [
                tf.Variable(np.zeros(w.shape, w.dtype), trainable=False, name=f"w{i}")
                for i, w in enumerate(like)
            ]
            self.mean_return = tf.Variable(-np.inf, dtype=tf.float64, trainable=False)
            self.env_step = tf.Variable(-1, dtype=tf.int64, trainable=False)
            self.evaluations = tf.Variable(0, dtype=tf.int64, trainable=False)

    @property
    def found(self) -> bool:
        """Whether any evaluation was considered."""
        return int(self.env_step.numpy()) >= 0

    def consider(self, env_step: int, returns: np.ndarray, weights: Sequence[np.ndarray]) -> bool:
        """Keep ``weights`` if their ``returns`` (one evaluation's episodes) have the best mean
        so far, or as good a one (the later weights win ties). Returns whether they were kept."""
        mean = float(np.mean(returns))
        self.evaluations.assign_add(1)
        if mean < float(self.mean_return.numpy()):
            return False
        for variable, value in zip(self.weights, weights, strict=True):
            variable.assign(value)
        self.mean_return.assign(mean)
        self.env_step.assign(env_step)
        logger.debug("best policy: env step %d, mean return %.1f", env_step, mean)
        return True

    def numpy_weights(self) -> list[np.ndarray]:
        """A numpy copy of the kept weights."""
        return [v.numpy() for v in self.weights]

    def describe(self) -> str:
        """Where the kept weights come from, for the run's report."""
        step, count = int(self.env_step.numpy()), int(self.evaluations.numpy())
        mean = float(self.mean_return.numpy())
        if count == 1:
            return f"the weights of env step {step}, its one greedy evaluation (mean {mean:.1f})"
        return (
            f"the weights of env step {step}, the best of {count} greedy evaluations during "
            f"training (mean return {mean:.1f} there)"
        )
