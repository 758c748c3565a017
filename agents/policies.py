"""Numpy policies over mirrored network weights; this module imports no TensorFlow.

Actors and the DQN and SAC acting loops act with these: a few small matrix products per vector
step instead of a TensorFlow call (why: `networks`). `nature_cnn_q_values` mirrors
`networks.nature_cnn` exactly (same weight list, NHWC layout and flattening; tests compare them
to 1e-4), so Atari actors act without TensorFlow too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replaygpu.nest import flatten as flatten_nest

Weights = Sequence[np.ndarray]


def batch_size_of(obs: Any) -> int:
    """B of a ``[B, ...]`` observation batch, or of a nested one (a Dict/Tuple space's)."""
    if isinstance(obs, (dict, tuple)):
        return len(next(iter(flatten_nest(obs).values())))
    return len(obs)


def flat_features(obs: Any) -> np.ndarray:
    """``[B, D]`` float32 network input of an observation batch; a nested one's leaves, in
    leaf-path order, each ``[B, -1]``, concatenated (`dqn.flat_obs` in the graph)."""
    if isinstance(obs, (dict, tuple)):
        leaves = flatten_nest(obs)
        n = batch_size_of(obs)
        return np.concatenate(
            [np.asarray(leaves[p], np.float32).reshape(n, -1) for p in sorted(leaves)], axis=1
        )
    return np.asarray(obs, np.float32).reshape(len(obs), -1)


def numpy_mlp(weights: Weights, x: np.ndarray) -> np.ndarray:
    """A ReLU MLP with a linear output layer: ``[B, in] -> [B, out]``."""
    n = len(weights) // 2
    for i in range(n):
        x = x @ weights[2 * i]  # a new array: the in-place ops below never touch the input
        x += weights[2 * i + 1]
        if i < n - 1:
            np.maximum(x, 0.0, out=x)
    return x


def greedy_q_policy(weights: Weights) -> Callable[[np.ndarray], np.ndarray]:
    """``[B, *obs] -> [B]`` int64 argmax actions of a Q-network (nested obs: `flat_features`)."""

    def act(obs: np.ndarray) -> np.ndarray:
        x = flat_features(obs)
        return numpy_mlp(weights, x).argmax(axis=1).astype(np.int64)

    return act


def epsilon_greedy_actions(
    greedy: Callable[[np.ndarray], np.ndarray],
    obs: np.ndarray,
    epsilon: float | np.ndarray,
    num_actions: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``[B]`` int64 actions: uniform with probability ``epsilon`` (per env), else greedy; the
    greedy policy is skipped when every env explores (most steps early in training)."""
    n = batch_size_of(obs)
    explore = rng.random(n) < epsilon
    # Drawn every call, used or not: the random stream (and so a seed's run) stays what it was.
    random_actions = rng.integers(num_actions, size=n, dtype=np.int64)
    exploring = np.count_nonzero(explore)
    if exploring == n:
        return random_actions
    actions = greedy(obs)
    return np.where(explore, random_actions, actions) if exploring else actions


def squashed_gaussian_policy(
    weights: Weights,
    scale: np.ndarray,
    bias: np.ndarray,
    rng: np.random.Generator | None = None,
) -> Callable[[np.ndarray], np.ndarray]:
    """``[B, *obs] -> [B, act_dim]`` float32 actions ``tanh(u) * scale + bias`` of a SAC actor
    (outputs ``[mean, log_std]``): ``u ~ N(mean, std)`` with ``rng``, else ``u = mean``."""

    def act(obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        out = numpy_mlp(weights, x)
        mean, log_std = np.split(out, 2, axis=1)
        u = mean
        if rng is not None:
            # log_std squashed into [LOG_STD_MIN, LOG_STD_MAX] smoothly, as the TF update does
            log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (1.0 + np.tanh(log_std))
            std = np.exp(log_std)
            u = mean + std * rng.standard_normal(mean.shape)
        return (np.tanh(u) * scale + bias).astype(np.float32)

    return act


#: range of a SAC actor's log standard deviation (the TF update squashes it the same way).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


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


#: strides of the three convolutions, as in `networks.NATURE_CONVS` (kernels come from the weights)
STRIDES = (4, 2, 1)


def _conv_relu(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """VALID convolution + ReLU: ``[B, H, W, C]``, ``w [kh, kw, C, F]`` -> ``[B, H', W', F]``."""
    kh, kw, channels, filters = w.shape
    windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
    windows = windows[:, ::stride, ::stride]  # [B, H', W', C, kh, kw]
    batch, height, width = windows.shape[:3]
    patches = windows.transpose(0, 1, 2, 4, 5, 3).reshape(batch * height * width, -1)
    out = patches @ w.reshape(kh * kw * channels, filters) + b
    return np.maximum(out, 0.0).reshape(batch, height, width, filters)


def nature_cnn_q_values(weights: Sequence[np.ndarray], frames: np.ndarray) -> np.ndarray:
    """Action values of ``frames [B, k, H, W]`` (uint8, or float in [0, 255]) -> ``[B, A]``;
    ``weights``: the `nature_cnn` model's ``get_weights()`` (what the learner publishes)."""
    w = [np.asarray(v, np.float32) for v in weights]
    x = np.asarray(frames, np.float32).transpose(0, 2, 3, 1) / np.float32(255.0)
    for i, stride in enumerate(STRIDES):
        x = _conv_relu(x, w[2 * i], w[2 * i + 1], stride)
    x = x.reshape(x.shape[0], -1)
    hidden = np.maximum(x @ w[6] + w[7], 0.0)
    return hidden @ w[8] + w[9]


def greedy_cnn_policy(weights: Sequence[np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """``[B, k, H, W]`` uint8 stacks -> ``[B]`` int64 greedy actions of the Nature CNN."""
    w = [np.ascontiguousarray(v, np.float32) for v in weights]
    return lambda frames: nature_cnn_q_values(w, frames).argmax(axis=1).astype(np.int64)
