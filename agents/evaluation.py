"""Greedy evaluations while training, and the weights they keep: when one is due, the best
evaluation's weights (`BestPolicy`, checkpointed with the run) and loading them for
``replaygpu eval`` (rl-zoo3's best model; ``keep_best``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from .progress import PERIODIC_EVAL

logger = logging.getLogger(__name__)

#: periodic evaluations' first seed above the run's; the final one uses ``seed + 10_000 + i``,
#: so its episodes are not those the weights were picked on
PERIODIC_EVAL_SEED = 30_000


def evaluation_due(config: Any, before: int, after: int, final: bool = False) -> bool:
    """Whether an evaluation while training falls in the env steps ``(before, after]``: a
    multiple of ``config.eval_every`` (0: never) does, or ``final`` with ``config.keep_best``
    (the final weights compete too)."""
    every = config.eval_every
    return (every > 0 and after // every > before // every) or (final and config.keep_best)


class BestPolicy(tf.Module):
    """The best greedy evaluation's weights (shaped as ``like``), mean return and env step."""

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
        """Keep ``weights`` if their ``returns`` have the best mean so far (ties: later wins)."""
        mean = float(np.mean(returns))
        self.evaluations.assign_add(1)
        if mean < float(self.mean_return.numpy()):
            return False
        assign_all(self.weights, weights)
        self.mean_return.assign(mean)
        self.env_step.assign(env_step)
        logger.debug("best policy: env step %d, mean return %.1f", env_step, mean)
        return True

    def forget(self) -> None:
        """Found nothing yet (a resumed run without ``keep_best`` hands back no earlier best)."""
        self.mean_return.assign(-np.inf)
        self.env_step.assign(-1)
        self.evaluations.assign(0)

    def numpy_weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.weights]

    def load_into(self, variables: Sequence[tf.Variable]) -> str:
        """Assign the kept weights to the policy's ``variables``; what they are (`describe`)."""
        assign_all(variables, self.numpy_weights())
        return self.describe()

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


def assign_all(variables: Sequence[tf.Variable], values: Sequence[Any]) -> None:
    """``variables[i].assign(values[i])`` for every i (as many of each)."""
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


def load_kept(variables: Sequence[tf.Variable], checkpoint: str) -> str | None:
    """Load the ``keep_best`` weights that ``checkpoint`` holds (`BestPolicy`) into the policy's
    ``variables`` (``replaygpu eval``); what they are, or None if it kept none (the variables
    keep theirs). The checkpoint decides, not the config: ``keep_best`` may change on resume."""
    best = BestPolicy([v.numpy() for v in variables])
    tf.train.Checkpoint(best_policy=best).read(checkpoint).expect_partial()
    return best.load_into(variables) if best.found else None


def evaluate_while_training(
    config: Any,
    recorder: Any,
    best: BestPolicy,
    env_step: int,
    play: Callable[[int, int], np.ndarray],
    weights: Sequence[np.ndarray],
) -> np.ndarray:
    """A greedy evaluation while training: ``play(episodes, seed)`` of ``periodic_eval_episodes``
    on the same seeds each time, reported at ``env_step`` (``eval/periodic_return``) and, with
    ``keep_best``, the ``weights`` played offered to ``best``. Its returns."""
    returns = play(config.periodic_eval_episodes, config.seed + PERIODIC_EVAL_SEED)
    recorder.metrics(env_step, {PERIODIC_EVAL: float(np.mean(returns))})
    if config.keep_best:
        best.consider(env_step, returns, weights)
    return returns
