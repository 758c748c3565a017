"""The sampler base class: how the learner loop asks for a minibatch inside its graph.

Every sampler subclasses `Sampler` and states its abilities there, so the learner never probes
for methods: ``keeps_priorities`` says whether ``update_priorities`` stores anything, and
``loop_scope`` is where once-per-call work (a prioritized sampler's sync of new rows) goes.
A sampler that wraps another (`NStepSampler`) forwards all three to the one it wraps.
"""

from __future__ import annotations

import contextlib
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
