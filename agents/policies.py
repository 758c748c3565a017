"""Numpy policies over mirrored network weights; this module imports no TensorFlow.

Actors (Ape-X actor processes, the acting loops of DQN and SAC) choose actions with these, so
acting costs a few small matrix products per vector step instead of a TensorFlow call.
Weights are the ``[w0, b0, w1, b1, ...]`` lists of ``agents.networks.MLP.numpy_weights()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Weights = Sequence[np.ndarray]


def numpy_mlp(weights: Weights, x: np.ndarray) -> np.ndarray:
    """A ReLU MLP with a linear output layer: ``[B, in] -> [B, out]``."""
    n = len(weights) // 2
    for i in range(n):
        x = x @ weights[2 * i] + weights[2 * i + 1]
        if i < n - 1:
            x = np.maximum(x, 0.0)
    return x


def greedy_q_policy(weights: Weights) -> Callable[[np.ndarray], np.ndarray]:
    """``[B, *obs] -> [B]`` int64 argmax actions of a Q-network."""

    def act(obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        return numpy_mlp(weights, x).argmax(axis=1).astype(np.int64)

    return act


def epsilon_greedy_actions(
    greedy: Callable[[np.ndarray], np.ndarray],
    obs: np.ndarray,
    epsilon: float | np.ndarray,
    num_actions: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``[B]`` int64 actions: uniform with probability ``epsilon`` (per env), else greedy.

    The greedy policy is skipped when every env explores, which early in training is most steps.
    """
    n = len(obs)
    explore = rng.random(n) < epsilon
    actions = rng.integers(num_actions, size=n).astype(np.int64)
    if not explore.all():
        actions = np.where(explore, actions, greedy(obs))
    return actions
