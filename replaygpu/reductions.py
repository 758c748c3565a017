"""Integer reductions written with ops that have GPU kernels for int64.

TensorFlow 2.21 registers no GPU kernel of ``Min`` (`tf.reduce_min`) for int64 (``Max`` has
one), so a ``reduce_min`` over int64 rows, steps or sizes runs on the CPU with a copy out of
device memory and back. These helpers say the same with ``reduce_max``; the graph check in
``tests/test_gpu_placement.py`` fails on any op without a GPU kernel.
"""

from __future__ import annotations

import tensorflow as tf


def reduce_min_int(values: tf.Tensor) -> tf.Tensor:
    """``tf.reduce_min(values)`` for signed integers, as ``-reduce_max(-values)``.

    Exact for every value but the dtype's minimum (whose negation overflows); the callers
    reduce sizes, rows and step counts, which are never negative.
    """
    return -tf.reduce_max(-values)


def first_true(mask: tf.Tensor) -> tf.Tensor:
    """``[N]`` int64: the index of the first True of each row of ``mask`` ``[N, L]``, or ``L``
    where a row has none."""
    length = mask.shape[1]
    if length is None:
        raise ValueError(f"first_true: mask of shape {mask.shape}, expected a static length")
    countdown = tf.range(length, 0, -1, dtype=tf.int64)  # L - j at position j
    return length - tf.reduce_max(tf.where(mask, countdown[None, :], 0), axis=1)
