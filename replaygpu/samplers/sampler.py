"""The sampler: an index distribution and a view, put together over a plain or a sharded table.

Every distribution (`Uniform`, `Prioritized`) works with every view (`Transition`, `NStep`,
`FrameStack`, `Sequence`), eagerly, in the learner's fused loop and under XLA: one class serves
every combination, e.g. ``rg.Sampler(table, rg.Prioritized(), rg.NStep(3))`` for Ape-X.

Sharding goes through `replaygpu.table.Table`: one index per shard, each with its own seed;
``sample`` inside ``strategy.run`` draws from the calling replica's shard. No row crosses
devices; prioritized weights are renormalised over all shards (`PrioritizedIndex.across_shards`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from replaygpu.errors import BatchError, ConfigError, EmptyTableError, check_int
from replaygpu.keys import IMPORTANCE_WEIGHTS
from replaygpu.samplers.dataset import make_dataset
from replaygpu.samplers.distribution import Distribution, Index
from replaygpu.samplers.uniform import Uniform
from replaygpu.samplers.view import Transition, View
from replaygpu.table import Table


class Sampler(tf.Module):
    """Draws minibatches in-graph: ``distribution`` picks rows, ``view`` makes them samples.

    Args:
        distribution: `Uniform()` (default) or `Prioritized(...)`.
        view: `Transition()` (default), `NStep(...)`, `FrameStack(...)` or `Sequence(...)`.
        seed: None for a nondeterministic stream; shards get distinct seeds derived from it.
        spare_draws: spare rows per minibatch row, replacing rows the view refuses; one left
            without is counted in ``invalid_draws``. 4 covers a view refusing up to about 3
            rows in 4 (more with larger batches); raise it for sparser tables.
        indexes: existing indexes (one per shard) to share random stream and priorities.

    ``sample`` stays a pure graph function of the table and the sampler's variables, so the
    learner can call it inside a `tf.while_loop`, under XLA, on CPU or GPU.

    Attributes:
        indexes: the `Index` of each shard (``indexes[0]`` is ``index`` on a plain table).

    Raises:
        ConfigError: a table lacking what the view reads, a stream view on a round-robin
            table, clashing keys, or a sampler made inside ``strategy.scope()``.
    """

    def __init__(
        self,
        table: Table,
        distribution: Distribution | None = None,
        view: View | None = None,
        seed: int | None = None,
        spare_draws: int = 4,
        *,
        indexes: Sequence[Index] | None = None,
        name: str = "sampler",
    ) -> None:
        super().__init__(name=name)
        distribution = Uniform() if distribution is None else distribution
        view = Transition() if view is None else view
        if not isinstance(distribution, Distribution):
            raise ConfigError(
                f"distribution: got {type(distribution).__name__}, expected rg.Uniform() or "
                "rg.Prioritized(...)"
            )
        if not isinstance(view, View):
            raise ConfigError(
                f"view: got {type(view).__name__}, expected rg.Transition(), rg.NStep(...), "
                "rg.FrameStack(...) or rg.Sequence(...)"
            )
        spare_draws = check_int("spare_draws", spare_draws, 1)
        if tf.distribute.has_strategy():
            raise ConfigError(
                "Sampler: made inside strategy.scope(), where its variables would be mirrored "
                "on all devices; make samplers (and tables) outside the scope"
            )
        if view.needs_stream_rows and not table.stream_contiguous:
            raise ConfigError(
                f"view: {type(view).__name__} reads consecutive rows of a stream, but table "
                f"'{table.name}' deals rows round-robin to its {table.num_shards} shards "
                "(shard_by=None); make it with shard_by='<integer stream field>' (e.g. the "
                "actor id) so each stream's rows stay in one shard"
            )
        view = view.for_table(table)
        view.check(table)
        if distribution.keeps_priorities and IMPORTANCE_WEIGHTS in table.spec:
            raise ConfigError(
                f"table '{table.name}' has a field '{IMPORTANCE_WEIGHTS}', the key a prioritized "
                "sampler adds to each batch; rename the field"
            )
        self.table = table
        self.distribution = distribution
        self.view = view
        self.spare_draws = spare_draws
        if indexes is None:
            seeds = shard_seeds(seed, table.num_shards)
            indexes = [
                distribution.build(shard, s, table.num_shards)
                for shard, s in zip(table.shards, seeds, strict=True)
            ]
        elif len(indexes) != table.num_shards:
            raise ConfigError(
                f"indexes: got {len(indexes)}, expected one per shard ({table.num_shards})"
            )
        self.indexes = list(indexes)
        self._invalid = []
        for shard in table.shards:
            with tf.device(shard.device):
                self._invalid.append(
                    tf.Variable(0, dtype=tf.int64, trainable=False, name="invalid_draws")
                )
        self._in_loop = False  # trace-time flag set by loop_scope
        # Retraced per batch size / shard; a dict of functions would be tracked by tf.Module
        # and break checkpointing. No autograph: errors stay ConfigErrors.
        self._sample_fn = tf.function(self.sample, autograph=False)
        self._draw_xla = tf.function(self._draw, jit_compile=True, autograph=False)
        self._write_xla = tf.function(
            self._write, jit_compile=True, reduce_retracing=True, autograph=False
        )
        self._update_fn = tf.function(self._guarded_update, reduce_retracing=True, autograph=False)
        self._sync_fn = tf.function(self._sync_all, autograph=False)

    @property
    def keeps_priorities(self) -> bool:
        """Whether ``update_priorities`` stores priorities (True with `Prioritized`)."""
        return self.distribution.keeps_priorities

    @property
    def index(self) -> Index:
        """A plain table's one shard's index; `ConfigError` on a sharded table (``indexes[i]``)."""
        if self.table.num_shards != 1:
            raise ConfigError(
                f"index: table '{self.table.name}' has {self.table.num_shards} shards, each "
                "with its own index; use sampler.indexes[i]"
            )
        return self.indexes[0]

    @property
    def invalid_draws(self) -> tf.Tensor:
        """Refused rows left without an accepted spare draw, over all shards (int64)."""
        return tf.add_n([v.read_value() for v in self._invalid])

    def sample(self, batch_size: int) -> tuple[tf.Tensor, Any]:
        """``(rows [B] int64, batch)``; the batch in the table's structure plus the view's keys
        (``"importance_weights"`` [B] float32 with `Prioritized`; see `replaygpu.nest.pack_batch`).
        `EmptyTableError` when called eagerly on an empty table."""
        if not tf.inside_function():
            self.table.local_index()  # a sharded table's shards are sampled in strategy.run
            check_not_empty(self.table)
            with tf.device(self.table.device):
                return self._sample_fn(batch_size)
        i = self.table.local_index()
        shard, index = self.table.shards[i], self.indexes[i]
        if not self._in_loop:
            index.sync(self.view)  # plain ops: a loop of data-dependent length, once per call
        draw = self._draw_xla if self.distribution.xla else self._draw
        rows, weights = draw(i, batch_size)
        batch = self.view.read(shard, rows)
        if weights is not None:
            batch[IMPORTANCE_WEIGHTS] = index.across_shards(weights)
        return rows, shard.pack(batch)

    def sample_indices(self, batch_size: int) -> tf.Tensor:
        """``[B]`` int64 rows drawn as ``sample`` draws them (eagerly: of a plain table)."""
        return self.sample(batch_size)[0]

    @contextlib.contextmanager
    def loop_scope(self) -> Iterator[None]:
        """Trace-time scope around the `Learner`'s fused loop: indexes take in new rows once per
        ``Learner.train`` call, not in every step."""
        self._sync_all()
        self._in_loop = True
        try:
            yield
        finally:
            self._in_loop = False

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Set priorities of rows ``indices`` ([B] int64, from ``sample``).

        In a graph, a non-finite priority gets the max priority and is counted. Eagerly, a bad
        update is refused whole with `BatchError` (negative or non-finite priorities, another
        length than ``indices``, or rows that cannot have been drawn). `ConfigError` when the
        sampler keeps no priorities.
        """
        if not self.keeps_priorities:
            raise ConfigError(
                f"update_fn returned 'priorities', but {self!r} keeps no priorities; sample "
                "with rg.Sampler(table, rg.Prioritized()) or drop the 'priorities' key"
            )
        if tf.inside_function():
            i = self.table.local_index()
            write = self._write_xla if self.distribution.xla else self._write
            write(i, indices, priorities)
            return
        self._checked_update(indices, priorities)

    def probabilities(self) -> np.ndarray:
        """Sampling probability of every row of a plain table, ``[capacity]`` float64; `ConfigError`
        for a sampler without priorities, or on a sharded table."""
        index = self.index
        if not self.keeps_priorities:
            raise ConfigError("probabilities: this sampler draws uniformly; every row is equal")
        self.sync()
        leaves = index.tree.leaves().numpy()
        total = leaves.sum()
        return leaves / total if total > 0 else leaves

    def sync(self) -> None:
        """Take in the rows appended since the last sample (eagerly; ``sample`` does it too)."""
        with tf.device(self.table.device):
            self._sync_fn()

    def with_view(self, view: View, spare_draws: int | None = None) -> Sampler:
        """A sampler of the same table and indexes (random stream, priorities) with ``view``."""
        return Sampler(
            self.table,
            self.distribution,
            view,
            spare_draws=self.spare_draws if spare_draws is None else spare_draws,
            indexes=self.indexes,
        )

    def as_dataset(self, batch_size: int) -> tf.data.Dataset:
        """An endless `tf.data.Dataset` of ``sample(batch_size)`` (see `samplers.dataset`);
        `ConfigError` for a batch size below 1, or a sampler of a sharded table."""
        return make_dataset(self.sample, self.table, batch_size, type(self).__name__)

    def _draw(self, shard_index: int, batch_size: int) -> tuple[tf.Tensor, tf.Tensor | None]:
        """Accepted rows of a shard and their importance weights.

        ``spare_draws * B`` unstratified spares are drawn too; the i-th refused row takes the
        i-th accepted spare, so the marginal over accepted rows stays exact. One fixed-shape
        step: a redraw loop would wait on the device (a GPU-to-host copy) every SGD step.
        """
        shard, index = self.table.shards[shard_index], self.indexes[shard_index]
        rows, odds = index.draw(batch_size)
        if self.view.checks_rows:
            spares = batch_size * self.spare_draws
            fresh, fresh_odds = index.draw(spares, stratified=False)
            accepted = self.view.valid(shard, tf.concat([rows, fresh], 0))
            refused = tf.logical_not(accepted[:batch_size])
            turn = tf.cumsum(tf.cast(refused, tf.int64)) - 1  # [B]: 0 for the first refused row
            good = accepted[batch_size:]
            rank = tf.cumsum(tf.cast(good, tf.int64)) - 1  # [S]: 0 for the first accepted spare
            # by_rank[r]: the r-th accepted spare; a scatter, O(S) (a search is O(B * S) under
            # XLA); slot B takes the rest
            slot = tf.where(good & (rank < batch_size), rank, batch_size)[:, None]
            by_rank = tf.tensor_scatter_nd_update(
                tf.zeros([batch_size + 1], tf.int64), slot, tf.range(spares, dtype=tf.int64)
            )
            replaced = refused & (turn <= rank[-1])
            pick = tf.gather(by_rank, tf.maximum(turn, 0))
            rows = tf.where(replaced, tf.gather(fresh, pick), rows)
            if odds is not None:
                odds = tf.where(replaced, tf.gather(fresh_odds, pick), odds)
            still = tf.reduce_sum(tf.cast(refused & tf.logical_not(replaced), tf.int64))
            self._invalid[shard_index].assign_add(still)
        return rows, index.weigh(odds)

    def _sync_all(self) -> None:
        for shard, index in zip(self.table.shards, self.indexes, strict=True):
            with tf.device(shard.device):
                index.sync(self.view)

    def _write(self, shard_index: int, indices: tf.Tensor, priorities: tf.Tensor) -> None:
        self.indexes[shard_index].write(indices, priorities)

    def _guarded_update(self, rows: tf.Tensor, values: tf.Tensor) -> tuple[tf.Tensor, ...]:
        """Sync, check, and write only if all is good, in one call (sync first, so new rows do
        not overwrite the update later); ``(ok, good rows, good values)``."""
        index = self.index
        index.sync(self.view)
        in_range = (rows >= 0) & (rows < self.table.size_var.read_value())
        drawable = in_range & (index.tree.get(tf.where(in_range, rows, 0)) > 0)
        finite = tf.math.is_finite(values) & (values >= 0)
        ok = tf.reduce_all(drawable) & tf.reduce_all(finite)

        def write() -> tf.Tensor:
            index.write(rows, values)
            return tf.constant(True)

        written = tf.cond(ok, write, lambda: tf.constant(False))
        return written, drawable, finite

    def _checked_update(self, indices: Any, priorities: Any) -> None:
        """An eager ``update_priorities``: written whole, or refused with a `BatchError`."""
        rows = tf.convert_to_tensor(indices)
        values = tf.convert_to_tensor(priorities)
        if rows.shape.rank != 1 or not rows.dtype.is_integer:
            raise BatchError(
                f"update_priorities: indices: got {rows.dtype.name} of shape {rows.shape}, "
                "expected [B] integers (the rows sample() returned)"
            )
        if values.shape != rows.shape or not (values.dtype.is_floating or values.dtype.is_integer):
            raise BatchError(
                f"update_priorities: priorities: got {values.dtype.name} of shape "
                f"{tuple(values.shape)}, expected [B={rows.shape[0]}] numbers, one per index"
            )
        with tf.device(self.table.device):
            written, drawable, finite = self._update_fn(
                tf.cast(rows, tf.int64), tf.cast(values, tf.float64)
            )
        if bool(written):
            return
        bad = ~finite.numpy()
        if bad.any():
            got = values.numpy()[bad][:4].tolist()
            raise BatchError(
                f"update_priorities: priorities: got {got} at positions "
                f"{np.flatnonzero(bad)[:4].tolist()}, expected finite numbers >= 0 (e.g. "
                "|TD error|); nothing was written"
            )
        wrong = ~drawable.numpy()
        raise BatchError(
            f"update_priorities: indices: rows {rows.numpy()[wrong][:4].tolist()} were never "
            f"drawn (expected rows the sampler returned: filled rows in [0, {self.table.size}) "
            f"that {type(self.view).__name__} can draw); nothing was written"
        )

    def __repr__(self) -> str:
        shards = self.table.num_shards
        return (
            f"{type(self).__name__}({type(self.distribution).__name__} x "
            f"{type(self.view).__name__}{f' on {shards} shards' if shards > 1 else ''})"
        )


def check_not_empty(table: Table) -> None:
    """Raise `EmptyTableError` when called eagerly on a table with an empty shard."""
    if tf.executing_eagerly() and any(shard.size == 0 for shard in table.shards):
        raise empty_table_error(table)


def empty_table_error(table: Table) -> EmptyTableError:
    """The `EmptyTableError` of sampling ``table`` while a shard of it holds no rows."""
    return EmptyTableError(
        f"table '{table.name}' is empty: append transitions before sampling "
        f"(capacity {table.capacity}, size {table.size})"
    )


def shard_seeds(seed: int | None, shards: int) -> list[int | None]:
    """``seed`` itself for one shard, distinct derived seeds for more; None stays None."""
    if seed is None or shards == 1:
        return [seed] * shards
    return [
        int(np.random.SeedSequence([int(seed), i]).generate_state(1, np.uint32)[0])
        for i in range(shards)
    ]
