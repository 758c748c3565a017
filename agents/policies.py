"""Numpy policies over mirrored network weights; this module imports no TensorFlow.

Actors and the DQN and SAC acting loops act with these: a few small matrix products per vector
step instead of a TensorFlow call (why: `networks`). The MLP and the Nature CNN run as
`replaygpu.numpy_layers` plans, the library's one way of acting without TensorFlow
(`replaygpu.numpy_model`): `mlp_plan` and `NATURE_CNN` are written out here, so that an actor
needs no Keras to read them, and are the plans read from `networks.mlp` and
`networks.nature_cnn` (tests compare them), so Atari actors act without TensorFlow too.
R2D2's LSTM is not a Keras layer: `r2d2.acting` mirrors it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replaygpu.nest import flatten as flatten_nest
from replaygpu.numpy_layers import Arithmetic, Cast, Conv2D, Dense, Flatten, LayerPlan, Transpose

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


@functools.cache
def mlp_plan(layers: int) -> LayerPlan:
    """`networks.mlp` of ``layers`` Dense layers: ReLU between them, a linear output; weights
    ``[kernel0, bias0, kernel1, ...]``."""
    relu = ["relu"] * (layers - 1)
    return LayerPlan(tuple(Dense(2 * i, 2 * i + 1, a) for i, a in enumerate([*relu, "linear"])))


def numpy_mlp(weights: Weights, x: np.ndarray) -> np.ndarray:
    """A ReLU MLP with a linear output layer: ``[B, in] -> [B, out]`` (`mlp_plan`)."""
    return mlp_plan(len(weights) // 2)(weights, x)


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


#: strides of the three convolutions, as in `networks.NATURE_CONVS` (kernels come from the weights)
STRIDES = (4, 2, 1)

#: `networks.nature_cnn` after its uint8 input: frames ``[B, k, H, W]`` scaled to [0, 1] and
#: turned NHWC, three VALID ReLU convolutions, flattened, a 512 ReLU layer and a linear head
NATURE_CNN = LayerPlan(
    (
        Cast("float32"),
        Arithmetic("divide", 255.0, False, "float32"),
        Transpose((0, 2, 3, 1)),
        *(Conv2D(2 * i, 2 * i + 1, (s, s), "valid", "relu") for i, s in enumerate(STRIDES)),
        Flatten(),
        Dense(6, 7, "relu"),
        Dense(8, 9, "linear"),
    )
)


def nature_cnn_q_values(weights: Sequence[np.ndarray], frames: np.ndarray) -> np.ndarray:
    """Action values of ``frames [B, k, H, W]`` (uint8, or float in [0, 255]) -> ``[B, A]``;
    ``weights``: the `nature_cnn` model's ``get_weights()`` (what the learner publishes)."""
    return NATURE_CNN([np.asarray(v, np.float32) for v in weights], frames)


def greedy_cnn_policy(weights: Sequence[np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """``[B, k, H, W]`` uint8 stacks -> ``[B]`` int64 greedy actions of the Nature CNN."""
    w = [np.ascontiguousarray(v, np.float32) for v in weights]
    return lambda frames: nature_cnn_q_values(w, frames).argmax(axis=1).astype(np.int64)
