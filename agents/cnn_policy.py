"""The Nature CNN's forward pass in numpy, so Atari actors act without TensorFlow.

Mirrors `networks.NatureCNN` exactly (same weight list, same NHWC layout and flattening
order): ``[B, k, H, W]`` uint8 stacks are scaled to ``[0, 1]``, moved to ``[B, H, W, k]`` and
go through three VALID ReLU convolutions and a ReLU dense layer to linear action values. Each
convolution gathers its patches with ``np.lib.stride_tricks.sliding_window_view`` and does one
matmul, about 10 M multiply-adds per 84x84x4 stack, a millisecond or two on one CPU core.

This module imports no TensorFlow (tests compare it with `NatureCNN` to 1e-4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

#: strides of the three convolutions, as in `NatureCNN.CONVS` (kernels come from the weights)
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
    """Action values of ``frames [B, k, H, W]`` (uint8, or float in [0, 255]) -> ``[B, A]``.

    Args:
        weights: `NatureCNN.weights` as numpy arrays: the three convolutions' ``[w, b]``, then
            the dense head's ``[w0, b0, w1, b1]`` (what the learner publishes).
    """
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
