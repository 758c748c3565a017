"""Index distributions: which rows of a shard a sampler draws.

A distribution is a frozen config (`Uniform`, `Prioritized`) building one `Index` per shard (its
generator, sum tree, ...); what a row becomes is the view's part (`replaygpu.samplers.view`).
A new one (recency, say) is a config with ``build`` and an `Index` with ``draw``; sampler,
learner loop, sharding and checkpoints need no change.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

import tensorflow as tf

from replaygpu.errors import ConfigError

if TYPE_CHECKING:
    from replaygpu.samplers.view import View
    from replaygpu.table import ReplayTable


def make_generator(seed: int | None, device: str) -> tf.random.Generator:
    """A Philox `tf.random.Generator` on ``device``; nondeterministic when ``seed`` is None."""
    with tf.device(device):
        if seed is None:
            return tf.random.Generator.from_non_deterministic_state()
        return tf.random.Generator.from_seed(seed)


class Index(tf.Module):
    """One shard's drawing state: subclasses set ``table`` and ``generator`` and override
    ``draw`` (and the rest, to keep priorities). All methods are graph functions, usable in the
    learner's ``tf.while_loop`` and under XLA."""

    keeps_priorities: ClassVar[bool] = False
    table: ReplayTable
    generator: tf.random.Generator

    def draw(self, batch_size: int, stratified: bool = True) -> tuple[tf.Tensor, tf.Tensor | None]:
        """``(rows [B] int64 in [0, size), odds [B] float64 or None)``; `weigh` turns ``odds``
        into importance weights (None: uniform). ``stratified=False``: independent draws, for
        the sampler's spares (keeps the marginal exact over rows a view accepts)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement draw")

    def weigh(self, odds: tf.Tensor | None) -> tf.Tensor | None:
        """Importance weights ``[B]`` float32 of one minibatch's final draws, or None; counts
        the minibatch (a beta schedule reads the count)."""
        return None

    def across_shards(self, weights: tf.Tensor) -> tf.Tensor:
        """``weights`` renormalised over all shards (inside ``strategy.run``); as is here."""
        return weights

    def sync(self, view: View) -> None:
        """Take in the rows appended since the last call (nothing to do here)."""
        return None

    def write(self, indices: tf.Tensor, priorities: tf.Tensor) -> None:
        """Store new priorities of rows ``indices`` (here: `ConfigError`, none are kept)."""
        raise ConfigError(
            f"update_fn returned 'priorities', but {type(self).__name__} keeps no priorities; "
            "sample with rg.Prioritized() (rg.Sampler(table, rg.Prioritized())) or drop the "
            "'priorities' key"
        )


@dataclasses.dataclass(frozen=True)
class Distribution:
    """Base of the distribution configs: ``build`` makes the `Index` of one shard;
    ``keeps_priorities``: ``update_priorities`` stores them; ``xla``: as `Prioritized`'s."""

    keeps_priorities: ClassVar[bool] = False
    xla = False  # a plain class attribute: a subclass may make it a field

    def build(self, table: ReplayTable, seed: int | None, num_shards: int) -> Index:
        """The `Index` of shard ``table``, one of ``num_shards``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement build")
