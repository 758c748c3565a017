"""The `tf.data` bridge: a sampler's draws as an endless `tf.data.Dataset`.

`Sampler.as_dataset` is the entry; this module knows only a ``sample`` function and its table,
so it needs nothing of the sampler's classes.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from replaygpu.errors import ConfigError
from replaygpu.table import Table


def make_dataset(
    sample: Callable[[int], Any], table: Table, batch_size: int, owner: str
) -> tf.data.Dataset:
    """An endless `tf.data.Dataset` of ``sample(batch_size)``, drawn in-graph from the live table.

    For training loops built around ``tf.data`` (TF-Agents and Reverb style ``for indices,
    batch in dataset``). Every element runs the sampler's graph on the table's variables
    (captured, not copied) when it is produced, so it sees rows appended after the dataset was
    made and priorities set since; draws advance the sampler's own random stream. Elements
    arrive on the host. No prefetch is added (tf.data's automatic injection is off), so an
    element is drawn when asked for; ``.prefetch(n)`` overlaps sampling with training, at the
    cost of batches up to ``n`` steps older than the latest appends and priorities.

    This is the slow path: one element and one training-step call per SGD step; `rg.Learner`
    runs many steps per call with no host traffic per step (`benchmarks/dataset_bridge.py`
    measures the two side by side).

    Args:
        sample: the sampler's ``sample``, ``sample(B) -> (indices [B] int64, batch)``.
        table: the table it draws from.
        batch_size: rows per element, B >= 1.
        owner: the sampler's name, for messages.

    Raises:
        ConfigError: for a batch size below 1, or a sampler of a sharded table (its
            replicas sample inside `rg.Learner`'s ``strategy.run``).
        tf.errors.InvalidArgumentError: from the iterator, when an element is asked of an
            empty table ("table NAME is empty: append transitions before sampling").
    """
    if (
        not isinstance(batch_size, numbers.Integral)
        or isinstance(batch_size, bool)
        or batch_size < 1
    ):
        raise ConfigError(f"batch_size: got {batch_size!r}, expected an integer >= 1")
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
                return sample(int(batch_size))

    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # draw on demand: live state
    return tf.data.Dataset.from_tensors(0).repeat().map(draw).with_options(options)
