"""The layers a `NumpyModel` runs, as data: each one a frozen dataclass called as ``layer(x,
weights) -> y`` in numpy, reading its weights from the flat weight list by index. No TensorFlow.

A plan is a tuple of them (`LayerPlan`); `replaygpu.numpy_model` reads one from a Keras model,
and code that knows its network can write one out (the agents' MLP and Nature CNN do, so their
actors act without Keras). The arithmetic is written for acting: a layer's products land in a
new array and its bias and activation are applied to that array in place, so no input is
written to; Dense is ``x = x @ kernel; x += bias; activation(x, out=x)``.

Shapes follow Keras: ``[B, ...]`` with channels last (``Conv2D``: ``[B, H, W, C]`` and kernels
``[kh, kw, C, F]``), ``LSTM`` on ``[B, T, D]`` with Keras's gate order ``i, f, c, o``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Weights = Sequence[np.ndarray]

# -- activations: f(x, out) -> y; those that can write y into ``out`` (x itself) when it is given --


def _linear(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return x


def _relu(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return np.maximum(x, 0.0, out=out)


def _relu6(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return np.clip(x, 0.0, 6.0, out=out)


def _leaky_relu(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return np.where(x > 0, x, x * 0.2)  # Keras's default negative_slope


def _elu(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))


def _selu(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    alpha, scale = 1.6732632423543772, 1.0507009873554805
    return scale * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0)))


def _sigmoid(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    y = np.multiply(x, 0.5, out=out)  # 1 / (1 + exp(-x)) without overflow
    np.tanh(y, out=y)
    y += 1.0
    y *= 0.5
    return y


def _tanh(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return np.tanh(x, out=out)


def _silu(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return x * _sigmoid(x, None)


def _softplus(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return np.logaddexp(x, 0.0)


def _softsign(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return x / (np.abs(x) + 1.0)


def _softmax(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz and Stegun 7.1.26 (absolute error <= 1.5e-7): numpy has no erf."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = 1.061405429
    for a in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly = a + t * poly
    poly = t * poly
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def _gelu(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x * (1.0 / math.sqrt(2.0))))  # Keras's exact (erf) form


#: Keras activation name -> its numpy form
ACTIVATIONS: dict[str, Callable[[np.ndarray, np.ndarray | None], np.ndarray]] = {
    "linear": _linear,
    "relu": _relu,
    "relu6": _relu6,
    "leaky_relu": _leaky_relu,
    "elu": _elu,
    "selu": _selu,
    "gelu": _gelu,
    "sigmoid": _sigmoid,
    "tanh": _tanh,
    "silu": _silu,
    "swish": _silu,
    "softplus": _softplus,
    "softsign": _softsign,
    "softmax": _softmax,
}


# -- layers ---------------------------------------------------------------------------------------


class Layer(Protocol):
    """One step of a plan: ``[B, ...] -> [B, ...]``, its weights read by index."""

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray: ...


@dataclass(frozen=True)
class Cast:
    """``keras.ops.cast(x, dtype)``; first in a plan read from Keras, the model's input converted
    to its dtype as Keras converts it (no copy when it has that dtype)."""

    dtype: str

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        return np.asarray(x, self.dtype)


@dataclass(frozen=True)
class Transpose:
    """``keras.ops.transpose(x, axes)``, or a ``Permute`` layer (axes with the batch's 0)."""

    axes: tuple[int, ...]

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        return x.transpose(self.axes)


#: the arithmetic of an `Arithmetic` step
OPERATORS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.true_divide,
}


@dataclass(frozen=True)
class Arithmetic:
    """``x op constant`` (``constant op x`` when ``constant_first``), e.g. ``x / 255.0`` or
    ``2.0 * x``; the result in ``dtype``, the Keras tensor's."""

    operator: str
    constant: float
    constant_first: bool
    dtype: str

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        a, b = (self.constant, x) if self.constant_first else (x, self.constant)
        return OPERATORS[self.operator](a, b).astype(self.dtype, copy=False)


@dataclass(frozen=True)
class Rescale:
    """A ``Rescaling`` layer: ``x * scale + offset`` in ``dtype``."""

    scale: float
    offset: float
    dtype: str

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        y = np.asarray(x, self.dtype) * np.asarray(self.scale, self.dtype)
        y += np.asarray(self.offset, self.dtype)
        return y


@dataclass(frozen=True)
class Activation:
    """An ``Activation`` layer (or ``ReLU``, ``Softmax`` with their defaults)."""

    activation: str

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        return ACTIVATIONS[self.activation](x, None)  # never in place: x may be the caller's


@dataclass(frozen=True)
class Identity:
    """A layer that does nothing when not training (``Dropout``)."""

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        return x


@dataclass(frozen=True)
class Flatten:
    """``[B, ...] -> [B, -1]`` in C order (channels last, as Keras's ``Flatten``)."""

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        return x.reshape(x.shape[0], -1)


@dataclass(frozen=True)
class Reshape:
    """A ``Reshape`` layer: ``[B, ...] -> [B, *shape]``."""

    shape: tuple[int, ...]

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        return x.reshape(x.shape[0], *self.shape)


@dataclass(frozen=True)
class Dense:
    """``activation(x @ weights[kernel] + weights[bias])`` over the last axis; ``bias`` None:
    none."""

    kernel: int
    bias: int | None
    activation: str

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        x = x @ weights[self.kernel]  # a new array: the in-place ops below never touch the input
        if self.bias is not None:
            x += weights[self.bias]
        return ACTIVATIONS[self.activation](x, x)


@dataclass(frozen=True)
class Conv2D:
    """A 2-D convolution, ``[B, H, W, C]`` and kernel ``[kh, kw, C, F]`` -> ``[B, H', W', F]``:
    ``padding`` "valid" or "same" (TensorFlow's: ``H' = ceil(H / stride)``, the odd pixel after)."""

    kernel: int
    bias: int | None
    strides: tuple[int, int]
    padding: str
    activation: str

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        w = weights[self.kernel]
        kh, kw, channels, filters = w.shape
        if self.padding == "same":
            rows = _same(x.shape[1], kh, self.strides[0])
            cols = _same(x.shape[2], kw, self.strides[1])
            x = np.pad(x, ((0, 0), rows, cols, (0, 0)))
        windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
        windows = windows[:, :: self.strides[0], :: self.strides[1]]  # [B, H', W', C, kh, kw]
        batch, height, width = windows.shape[:3]
        patches = windows.transpose(0, 1, 2, 4, 5, 3).reshape(batch * height * width, -1)
        out = patches @ w.reshape(kh * kw * channels, filters)
        if self.bias is not None:
            out += weights[self.bias]
        return ACTIVATIONS[self.activation](out, out).reshape(batch, height, width, filters)


def _same(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's SAME padding of one axis: (before, after)."""
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


@dataclass(frozen=True)
class LayerNorm:
    """``LayerNormalization`` over ``axes``: ``(x - mean) / sqrt(var + eps) * gamma + beta``."""

    axes: tuple[int, ...]
    epsilon: float
    gamma: int | None
    beta: int | None

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        axes = tuple(sorted(a % x.ndim for a in self.axes))
        shape = [x.shape[a] if a in axes else 1 for a in range(x.ndim)]
        gamma = None if self.gamma is None else weights[self.gamma].reshape(shape)
        beta = None if self.beta is None else weights[self.beta].reshape(shape)
        variance = x.var(axis=axes, keepdims=True)
        inv = 1.0 / np.sqrt(variance + np.asarray(self.epsilon, x.dtype))
        y = x - x.mean(axis=axes, keepdims=True)
        y *= inv
        if gamma is not None:
            y *= gamma
        if beta is not None:
            y += beta
        return y


@dataclass(frozen=True)
class BatchNorm:
    """``BatchNormalization`` when not training: ``(x - mean) / sqrt(variance + eps) * gamma +
    beta`` over ``axis``, with the moving mean and variance."""

    axis: int
    epsilon: float
    mean: int
    variance: int
    gamma: int | None
    beta: int | None

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        shape = [1] * x.ndim
        shape[self.axis] = -1
        inv = 1.0 / np.sqrt(weights[self.variance] + np.asarray(self.epsilon, x.dtype))
        if self.gamma is not None:
            inv = inv * weights[self.gamma]
        y = x - weights[self.mean].reshape(shape)
        y *= inv.reshape(shape)
        if self.beta is not None:
            y += weights[self.beta].reshape(shape)
        return y


@dataclass(frozen=True)
class LSTM:
    """A Keras ``LSTM`` from the zero state over ``[B, T, D]``: ``[B, T, U]`` with
    ``return_sequences``, else the last ``[B, U]``; kernels ``[D, 4U]`` and ``[U, 4U]``, gates
    in Keras's order ``i, f, c, o``."""

    kernel: int
    recurrent_kernel: int
    bias: int | None
    activation: str = "tanh"
    recurrent_activation: str = "sigmoid"
    return_sequences: bool = False

    def __call__(self, x: np.ndarray, weights: Weights) -> np.ndarray:
        recurrent = weights[self.recurrent_kernel]
        act, gate = ACTIVATIONS[self.activation], ACTIVATIONS[self.recurrent_activation]
        inputs = x @ weights[self.kernel]  # [B, T, 4U]: every step's input half at once
        if self.bias is not None:
            inputs += weights[self.bias]
        h = np.zeros((x.shape[0], recurrent.shape[0]), inputs.dtype)
        c, outputs = h, []
        for t in range(x.shape[1]):
            i, f, g, o = np.split(inputs[:, t] + h @ recurrent, 4, axis=1)
            c = gate(f, None) * c + gate(i, None) * act(g, None)
            h = gate(o, None) * act(c, None)
            outputs.append(h)
        return np.stack(outputs, axis=1) if self.return_sequences else h


@dataclass(frozen=True)
class LayerPlan:
    """A forward pass as data: ``layers`` in order and, where known, the shapes of the weights
    they read (``model.get_weights()`` order), so that weights of another model are refused.
    Called as ``plan(weights, x) -> y``; pure numpy, picklable."""

    layers: tuple[Layer, ...]
    weight_shapes: tuple[tuple[int, ...], ...] | None = None

    def __call__(self, weights: Weights, x: np.ndarray) -> np.ndarray:
        for layer in self.layers:
            x = layer(x, weights)
        return x

    def weights_read(self) -> int:
        """How many weights the layers read: one past the highest index."""
        indices = [getattr(layer, f, None) for layer in self.layers for f in WEIGHT_FIELDS]
        return max((i for i in indices if i is not None), default=-1) + 1


#: the fields of a layer that hold indices into the weight list
WEIGHT_FIELDS = ("kernel", "recurrent_kernel", "bias", "gamma", "beta", "mean", "variance")
