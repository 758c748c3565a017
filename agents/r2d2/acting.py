"""R2D2's acting side in numpy (no TensorFlow): one step of `network.LSTMQNetwork`
(`numpy_lstm_step`), and `RecurrentQPolicy`, which carries its state across an episode's steps.
The LSTM is not a Keras layer (its backward pass is written out), so `NumpyModel` does not read
it; this mirror does, and tests compare the two to 1e-5."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..policies import Weights, flat_features


def numpy_lstm_step(
    weights: Weights, obs: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One step of `r2d2.network.LSTMQNetwork` in numpy: ``[B, D], [B, 2U] -> (Q [B, A], state
    [B, 2U])``; weights ``[torso w, torso b, kernel, bias, head w, head b]``, the state
    ``concat([h, c])``."""
    tw, tb, kernel, bias, hw, hb = weights
    units = kernel.shape[1] // 4
    x = np.maximum(obs @ tw + tb, 0.0)
    h, c = state[:, :units], state[:, units:]
    z = x @ kernel[:-units] + h @ kernel[-units:] + bias
    i, f, g, o = np.split(z, 4, axis=1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    h = _sigmoid(o) * np.tanh(c)
    return h @ hw + hb, np.concatenate([h, c], axis=1).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


class RecurrentQPolicy:
    """An `r2d2.network.LSTMQNetwork` mirror acting in one env, its state carried across steps;
    assign ``weights`` (``LSTMQNetwork.get_weights()``) to act with new ones. Call it
    (``[1, ...] -> [1]`` greedy actions, a policy for `rollouts.evaluate` with
    ``on_reset=policy.reset``) or `act`."""

    def __init__(self, weights: Weights, num_actions: int) -> None:
        self.weights = weights
        self.num_actions = int(num_actions)
        self.state = np.zeros((1, weights[2].shape[1] // 2), np.float32)

    def reset(self) -> None:
        """Start an episode: the zero state."""
        self.state = np.zeros_like(self.state)

    def __call__(self, obs: Any) -> np.ndarray:
        q, self.state = numpy_lstm_step(self.weights, flat_features(obs), self.state)
        return q.argmax(axis=1).astype(np.int64)

    def act(self, obs: Any, epsilon: float, rng: np.random.Generator) -> tuple[int, np.ndarray]:
        """An epsilon-greedy action for one observation, and the state ``[2U]`` the network had
        before it (what an actor stores with the step)."""
        before = self.state[0]
        greedy = int(self(np.asarray(obs)[None])[0])
        return (int(rng.integers(self.num_actions)) if rng.random() < epsilon else greedy), before
