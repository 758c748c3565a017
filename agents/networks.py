"""The agents' networks: Keras layers (MLPs, the Nature CNN) and Keras's Adam, each mirrored in
numpy for fast acting (R2D2's LSTM lives in `r2d2.network`).

Acting one environment step at a time must not pay a TensorFlow call per step, so agents keep a
numpy copy of their policy weights (``model.get_weights()``, refreshed after each training call)
and act with `policies.numpy_mlp`: the weights are a list of arrays in a fixed order,
``[kernel0, bias0, kernel1, ...]``. Weights start as PyTorch's (uniform in +-1/sqrt(fan_in)),
what rl-zoo3's values were tuned with, drawn from ``seed`` by a `tf.random.Generator`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

import replaygpu as rg


def mlp(sizes: Sequence[int], seed: int, name: str = "mlp") -> keras.Sequential:
    """A ReLU MLP of Keras ``Dense`` layers, linear output; ``sizes``: ``[in, hidden..., out]``."""
    if len(sizes) < 2 or any(int(s) < 1 for s in sizes):
        raise rg.ConfigError(f"sizes: got {list(sizes)}, expected >= 2 positive layer widths")
    dense = [
        keras.layers.Dense(int(width), activation="relu" if i < len(sizes) - 2 else None)
        for i, width in enumerate(sizes[1:])
    ]
    model = keras.Sequential([keras.Input((int(sizes[0]),)), *dense], name=name)
    pytorch_init(dense, tf.random.Generator.from_seed(seed))
    return model


def pytorch_init(layers: Sequence[keras.layers.Layer], rng: tf.random.Generator) -> None:
    """Each layer's kernel, then its bias, uniform in +-1/sqrt(fan_in) (PyTorch's default)."""
    for layer in layers:
        fan_in = int(np.prod(layer.kernel.shape[:-1]))
        bound = 1.0 / np.sqrt(fan_in)
        for variable in (layer.kernel, layer.bias):
            variable.assign(rng.uniform(variable.shape, -bound, bound))


#: ``f(step) -> step size``, called in the graph with the steps taken before this one
Schedule = Callable[[tf.Tensor], tf.Tensor]


class InGraphRate(keras.optimizers.schedules.LearningRateSchedule):
    """A `Schedule` as Keras's optimizers take it: called in the graph with the steps taken."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        return tf.cast(self.schedule(step), tf.float32)


class Adam(tf.Module):
    """Keras's Adam over a fixed list of variables, built at once so no trace builds it, with
    PyTorch's epsilon 1e-8 (rl-zoo3's values were tuned with it; Keras's default is 1e-7).

    Args:
        learning_rate: a float, or a `Schedule` evaluated in the graph at each step (a decay
            needs no host-side update between train calls).
        max_grad_norm: clip gradients to this global norm first (None: no clipping).
    """

    def __init__(
        self,
        variables: Sequence[tf.Variable],
        learning_rate: float | Schedule,
        max_grad_norm: float | None = None,
        name: str = "adam",
    ) -> None:
        super().__init__(name=name)
        self.params = list(variables)
        self.max_grad_norm = max_grad_norm
        rate = InGraphRate(learning_rate) if callable(learning_rate) else float(learning_rate)
        self.keras = keras.optimizers.Adam(rate, epsilon=1e-8, name=name)
        self.keras.build(self.params)

    def apply(self, grads: Sequence[tf.Tensor]) -> None:
        """One Adam step with ``grads`` (in the variables' order). With several replicas (a
        learner on an `rg.ShardedReplayTable`) every replica applies the mean gradient, clipped
        after averaging: with equal per-replica batches, that is the whole batch's gradient.
        Keras sums the replicas' gradients, so each hands it its share of the mean. With a
        clip that is a second all-reduce of the same gradients: Keras's sum can only be skipped
        from the cross-replica context, where its public ``apply`` cannot run."""
        grads = list(grads)
        ctx = tf.distribute.get_replica_context()
        replicas = ctx.num_replicas_in_sync if ctx is not None else 1
        if self.max_grad_norm is not None:
            if replicas > 1:  # the norm clipped is the mean gradient's
                grads = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, grads)
            grads, _ = tf.clip_by_global_norm(grads, self.max_grad_norm)
        if replicas > 1:
            grads = [g / replicas for g in grads]
        self.keras.apply(grads)


#: the Nature CNN's convolutions: (filters, kernel, stride), VALID padding
NATURE_CONVS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))


def nature_cnn(
    frame_shape: Sequence[int], num_outputs: int, seed: int, name: str = "cnn"
) -> keras.Model:
    """The DQN Nature network (Mnih et al. 2015): conv 32x8x8/4, 64x4x4/2, 64x3x3/1, dense 512.

    Takes uint8 frame stacks ``[B, k, H, W]`` (``frame_shape`` ``(k, H, W)``) as a frame table's
    sampler gives them and scales them to ``[0, 1]`` itself, so frames stay uint8 on the device
    until the update; ``-> [B, num_outputs]``.
    """
    height, width = (int(s) for s in frame_shape[1:])
    for _, kernel, stride in NATURE_CONVS:
        height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
    if height < 1 or width < 1:
        raise rg.ConfigError(
            f"frame_shape: got {tuple(frame_shape)}, too small for the Nature CNN; "
            "expected frames of at least 36x36 (84x84 is standard)"
        )
    frames = keras.Input(tuple(frame_shape), dtype="uint8")
    x = keras.ops.transpose(keras.ops.cast(frames, "float32") / 255.0, [0, 2, 3, 1])  # NHWC
    convs = [keras.layers.Conv2D(f, k, s, activation="relu") for f, k, s in NATURE_CONVS]
    for conv in convs:
        x = conv(x)
    head = mlp([height * width * NATURE_CONVS[-1][0], 512, num_outputs], seed + 1, f"{name}_head")
    model = keras.Model(frames, head(keras.layers.Flatten()(x)), name=name)
    pytorch_init(convs, tf.random.Generator.from_seed(seed))
    return model
