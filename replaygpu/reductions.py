"""Integer reductions written with ops that have GPU kernels for int64.

TensorFlow 2.21 has no int64 GPU kernel of ``Min`` (``Max`` has one), so an int64 ``reduce_min``
runs on the CPU with copies out of device memory and back; these use ``reduce_max``.
``tests/test_gpu_placement.py`` fails on any op without a GPU kernel.
"""

from __future__ import annotations

import tensorflow as tf


def reduce_min_int(values: tf.Tensor) -> tf.Tensor:
    """``-reduce_max(-values)``: exact but for the dtype's minimum (callers' values are never
    negative)."""
    return -tf.reduce_max(-values)


def first_true(mask: tf.Tensor) -> tf.Tensor:
    """``[N]`` int64: the index of the first True of each row of ``mask`` ``[N, L]``, or ``L``
    where a row has none."""
    length = mask.shape[1]
    if length is None:
        raise ValueError(f"first_true: mask of shape {mask.shape}, expected a static length")
    countdown = tf.range(length, 0, -1, dtype=tf.int64)  # L - j at position j
    return length - tf.reduce_max(tf.where(mask, countdown[None, :], 0), axis=1)
