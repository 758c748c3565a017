"""The sampler base class: how the learner loop asks for a minibatch inside its graph.

Every sampler subclasses `Sampler` and states its abilities there, so the learner never probes
for methods: ``keeps_priorities`` says whether ``update_priorities`` stores anything, and
``loop_scope`` is where once-per-call work (a prioritized sampler's sync of new rows) goes.
A sampler that wraps another (`NStepSampler`) forwards all three to the one it wraps.
``as_dataset`` is the same ``sample`` as a `tf.data.Dataset`, for loops built around tf.data.
"""

from __future__ import annotations

import contextlib
import numbers
from typing import Any

import tensorflow as tf

from replaygpu.errors import ConfigError, EmptyTableError
from replaygpu.storage import ReplayTable


class Sampler(tf.Module):
    """Draws minibatches from a table inside a graph.

    ``sample`` must be a pure graph function of the table and the sampler's own variables (its
    `tf.random.Generator` above all), so the learner can call it inside a `tf.while_loop`,
    under XLA, on CPU or GPU. A sampler whose ``keeps_priorities`` is True gets the
    ``"priorities"`` that ``update_fn`` returns through ``update_priorities``, in the same loop
    step; the others raise `ConfigError` there.

    Subclasses set ``table`` in ``__init__`` and override ``sample``; the defaults of the other
    methods suit a sampler without priorities or per-call work. A subclass made on a
    `ShardedReplayTable` (its first argument) is a `ShardedSampler` of it instead.
    """

    table: ReplayTable

    def __new__(cls, *args: Any, **kwargs: Any) -> Sampler:
        # Any sampler made on a ShardedReplayTable (or wrapping a sampler of one) is a
        # ShardedSampler holding one such sampler per shard (see samplers/sharded.py).
        from replaygpu.samplers.sharded import ShardedSampler, source_argument

        if cls is not ShardedSampler and source_argument(cls, args, kwargs) is not None:
            return ShardedSampler(cls, args, kwargs)
        return super().__new__(cls)

    @property
    def keeps_priorities(self) -> bool:
        """Whether ``update_priorities`` stores priorities (True for `PrioritizedSampler`)."""
        return False

    def sample(self, batch_size: int) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """Returns ``(indices [B] int64, batch {field: [B, ...]})`` for ``update_fn``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement sample")

    def as_dataset(self, batch_size: int) -> tf.data.Dataset:
        """An endless `tf.data.Dataset` of minibatches drawn in-graph from the live table.

        A bridge for training loops built around ``tf.data`` (TF-Agents and Reverb style
        ``for indices, batch in dataset``). Each element is exactly what
        ``self.sample(batch_size)`` returns: ``(indices [B] int64, batch {field: [B, ...]})``,
        with ``"importance_weights"`` in the batch of a prioritized sampler. The pipeline is
        ``from_tensors(0).repeat().map(sample)``: every element runs this sampler's graph on
        the table's variables (captured, not copied) when it is produced, so it sees rows
        appended after the dataset was made and priorities set by ``update_priorities(indices,
        priorities)`` with indices the dataset yielded. Draws advance this sampler's own random
        stream, the one `rg.Learner` and ``sample`` use.

        The table may be on any device: the map function runs the sampler on the table's device
        (tf.data makes it a multi-device function) and the elements arrive on the host, as
        every ``tf.data`` element does; a training step on a GPU copies them back. No prefetch
        is added (tf.data's automatic prefetch injection is turned off), so an element is drawn
        when it is asked for; add ``.prefetch(n)`` to overlap sampling with training, at the
        cost of batches drawn up to ``n`` steps before the latest appends and priorities.

        This is the slow path: one dataset element and one training-step call per SGD step,
        with a device-to-host-to-device round trip on a GPU. `rg.Learner` runs many SGD steps
        per ``tf.function`` call inside one ``tf.while_loop`` (optionally one XLA program) with
        no host traffic per step; use it where speed matters (`benchmarks/dataset_bridge.py`
        measures the two side by side).

        Args:
            batch_size: rows per element, B >= 1.

        Returns:
            the dataset; iterate it, or ``dataset.take(n)``, ``dataset.prefetch(n)``, ...

        Raises:
            ConfigError: for a batch size below 1, or a sampler of a `ShardedReplayTable` (its
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
        table = self.table
        if hasattr(table, "shards"):
            raise ConfigError(
                f"as_dataset: {type(self).__name__} samples the shards of sharded table "
                f"'{table.name}' inside strategy.run, which a tf.data pipeline cannot call; "
                "train with rg.Learner, or make the dataset of a sampler on one ReplayTable"
            )
        message = (
            f"table {table.name} is empty: append transitions before sampling "
            f"(capacity {table.capacity}, size 0; {type(self).__name__}.as_dataset)"
        )

        def draw(_: tf.Tensor) -> tuple[tf.Tensor, Any]:
            with tf.device(table.device):
                size = table.size_var.read_value()
                with tf.control_dependencies([tf.debugging.Assert(size > 0, [message])]):
                    return self.sample(int(batch_size))

        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False  # draw on demand: live state
        return tf.data.Dataset.from_tensors(0).repeat().map(draw).with_options(options)

    def loop_scope(self) -> contextlib.AbstractContextManager[None]:
        """Trace-time scope the `Learner` wraps around its fused ``tf.while_loop``.

        Work put in it runs once per ``Learner.train`` call instead of once per step. The
        default does nothing.
        """
        return contextlib.nullcontext()

    def update_priorities(self, indices: tf.Tensor, priorities: tf.Tensor) -> None:
        """Set the priorities of rows ``indices`` ([B] int64); only where ``keeps_priorities``.

        Raises:
            ConfigError: always, in this default: the sampler keeps no priorities.
        """
        raise ConfigError(
            f"update_fn returned 'priorities', but {type(self).__name__} keeps no priorities "
            "(expected a sampler with keeps_priorities=True); sample with a "
            "PrioritizedSampler (or an NStepSampler wrapping one) or drop the 'priorities' key"
        )


def check_not_empty(table: ReplayTable) -> None:
    """Raise `EmptyTableError` when called eagerly on a table with no rows."""
    if tf.executing_eagerly() and table.size == 0:
        raise EmptyTableError(
            f"table '{table.name}' is empty: append transitions before sampling "
            f"(capacity {table.capacity}, size 0)"
        )
