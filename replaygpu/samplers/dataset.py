"""The `tf.data` bridge behind `Sampler.as_dataset`; it knows only a ``sample`` function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from replaygpu.errors import ConfigError, check_int
from replaygpu.table import Table


def make_dataset(
    sample: Callable[[int], Any], table: Table, batch_size: int, owner: str
) -> tf.data.Dataset:
    """An endless `tf.data.Dataset` of ``sample(batch_size)``, drawn in-graph from the live table.

    Each element runs the sampler's graph on the live variables when produced (later appends
    and priorities show; the sampler's random stream advances), and arrives on the host. No
    prefetch is injected; ``.prefetch(n)`` overlaps sampling with training, with batches up to
    ``n`` steps stale. The slow path: one call per SGD step, where `rg.Learner` runs many
    (`benchmarks/dataset_bridge.py` compares them).

    ``sample(B) -> (indices [B] int64, batch)``; ``owner``: the sampler's name, for messages.
    `ConfigError` for a batch size below 1, or a sharded table (sampled in ``strategy.run``);
    the iterator raises `tf.errors.InvalidArgumentError` on an empty table.
    """
    batch_size = check_int("batch_size", batch_size, 1)
    if table.strategy is not None:
        raise ConfigError(
            f"as_dataset: {owner} samples the shards of sharded table "
            f"'{table.name}' inside strategy.run, which a tf.data pipeline cannot call; "
            "train with rg.Learner, or make the dataset of a sampler on one ReplayTable"
        )
    message = (
        f"table {table.name} is empty: append transitions before sampling "
        f"(capacity {table.capacity}, size 0; {owner}.as_dataset)"
    )

    def draw(_: tf.Tensor) -> tuple[tf.Tensor, Any]:
        with tf.device(table.device):
            size = table.size_var.read_value()
            with tf.control_dependencies([tf.debugging.Assert(size > 0, [message])]):
                return sample(batch_size)

    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # draw on demand: live state
    return tf.data.Dataset.from_tensors(0).repeat().map(draw).with_options(options)
