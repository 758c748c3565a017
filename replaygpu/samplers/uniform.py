"""Uniform sampling over the filled rows of a table."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from replaygpu.samplers.base import Sampler, check_not_empty
from replaygpu.storage import ReplayTable


def make_generator(seed: int | None, device: str) -> tf.random.Generator:
    """A Philox `tf.random.Generator` on ``device``; nondeterministic when ``seed`` is None."""
    with tf.device(device):
        if seed is None:
            return tf.random.Generator.from_non_deterministic_state()
        return tf.random.Generator.from_seed(seed)


class UniformSampler(Sampler):
    """Draws rows uniformly from ``[0, table.size)``.

    The random stream comes from a `tf.random.Generator` this sampler owns, so checkpointing the
    sampler checkpoints the stream: a restored learner draws the minibatches the original would
    have drawn.

    Args:
        table: the table to sample from.
        seed: seed of the random stream; None for a nondeterministic one.
    """

    def __init__(self, table: ReplayTable, seed: int | None = None) -> None:
        super().__init__(name="uniform_sampler")
        self.table = table
        self.generator = make_generator(seed, table.device)

    def sample_indices(self, batch_size: int) -> tf.Tensor:
        """``[B]`` int64 row indices, uniform over the filled rows."""
        check_not_empty(self.table)
        size = tf.maximum(self.table.size_var.read_value(), 1)
        return self.generator.uniform([batch_size], 0, size, dtype=tf.int64)

    def sample(self, batch_size: int) -> tuple[tf.Tensor, Any]:
        """``(indices [B] int64, {field: [B, ...]})``, the batch in the table's structure;
        `EmptyTableError` eagerly when empty."""
        indices = self.sample_indices(batch_size)
        return indices, self.table.pack(self.table.gather(indices))
