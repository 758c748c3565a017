"""Uniform sampling over the filled rows of a shard."""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from replaygpu.samplers.distribution import Distribution, Index, make_generator
from replaygpu.table import ReplayTable


class UniformIndex(Index):
    """Draws rows uniformly from ``[0, table.size)`` with its own generator, checkpointed with
    the sampler: a restored learner draws the minibatches the original would have."""

    def __init__(self, table: ReplayTable, seed: int | None) -> None:
        super().__init__(name="uniform_index")
        self.table = table
        self.generator = make_generator(seed, table.device)

    def draw(self, batch_size: int, stratified: bool = True) -> tuple[tf.Tensor, None]:
        """``([B] int64 rows, None)``: full-range draws modulo the size (bias below ``size /
        2**64``), since a bounded draw takes its bound in host memory on a GPU (a copy per step)."""
        size = tf.maximum(self.table.size_var.read_value(), 1)
        bits = self.generator.uniform_full_int([batch_size], dtype=tf.int64)
        return tf.math.floormod(bits, size), None


@dataclasses.dataclass(frozen=True)
class Uniform(Distribution):
    """Every filled row equally likely (the `UniformIndex` of each shard)."""

    def build(self, table: ReplayTable, seed: int | None, num_shards: int) -> UniformIndex:
        return UniformIndex(table, seed)
