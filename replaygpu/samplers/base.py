"""The sampler protocol: how the learner loop asks for a minibatch inside its graph."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import tensorflow as tf

from replaygpu.errors import EmptyTableError
from replaygpu.storage import ReplayTable


@runtime_checkable
class Sampler(Protocol):
    """Draws minibatches from a table inside a graph.

    ``sample`` must be a pure graph function of the table and the sampler's own variables (its
    `tf.random.Generator` above all), so the learner can call it inside a `tf.while_loop`,
    under XLA, on CPU or GPU. A sampler that also defines ``update_priorities(indices,
    priorities)`` gets the ``"priorities"`` that ``update_fn`` returns, in the same loop step.
    """

    table: ReplayTable

    def sample(self, batch_size: int) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """Returns ``(indices [B] int64, batch {field: [B, ...]})`` for ``update_fn``."""
        ...


def check_not_empty(table: ReplayTable) -> None:
    """Raise `EmptyTableError` when called eagerly on a table with no rows."""
    if tf.executing_eagerly() and table.size == 0:
        raise EmptyTableError(
            f"table '{table.name}' is empty: append transitions before sampling "
            f"(capacity {table.capacity}, size 0)"
        )
