"""The sampler: an index distribution and a view, put together over a plain or a sharded table.

``rg.Sampler(table, distribution, view)`` draws rows with ``distribution`` (`Uniform`,
`Prioritized`) and turns them into samples with ``view`` (`Transition`, `NStep`, `FrameStack`,
`Sequence`). Every distribution works with every view, eagerly, in the learner's fused loop and
under XLA: one class serves every combination, e.g. ``rg.Sampler(table, rg.Prioritized(),
rg.NStep(3))`` for Ape-X; `with_view` shares one sampler's indexes with another view.

Sharding is the table's business, through the table protocol (`replaygpu.table.Table`): the
sampler builds one index per shard (``table.shards``; a plain table is one shard) with a seed of
its own, and ``sample`` inside ``strategy.run`` draws from the calling replica's shard
(``table.local_index()``). No row crosses devices; with `Prioritized`, importance weights are
renormalised over all shards (see `PrioritizedIndex.across_shards`).
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
    """Draws minibatches from a table inside a graph: ``distribution`` picks rows, ``view``
    makes them samples.

    Args:
        table: a `ReplayTable` or a `ShardedReplayTable` (any `replaygpu.table.Table`).
        distribution: which rows are drawn: `Uniform()` (default) or `Prioritized(...)`.
        view: what a drawn row becomes: `Transition()` (default), `NStep(...)`,
            `FrameStack(...)` or `Sequence(...)`.
        seed: seed of the random stream; None for a nondeterministic one. A sharded table's
            shards get distinct seeds derived from it.
        spare_draws: spare rows drawn with each minibatch, per row: the rows the view refuses
            (final frame rows, windows crossing an episode, ...) take accepted spares in turn,
            and one left without is counted in ``invalid_draws``. 4 covers a view that refuses
            up to about 3 rows in 4 (more with larger batches); raise it for sparser tables.
        indexes: existing indexes (one per shard) to draw with instead of building new ones:
            samplers sharing them share their random stream and priorities (`with_view`).

    ``sample`` must stay a pure graph function of the table and the sampler's variables (its
    indexes' `tf.random.Generator` s above all), so the learner can call it inside a
    `tf.while_loop`, under XLA, on CPU or GPU.

    Attributes:
        indexes: the `Index` of each shard (``indexes[0]`` is ``index`` on a plain table).

    Raises:
        ConfigError: for a table that lacks what the view reads, a view that needs each
            stream's rows together on a table that deals rows round-robin, keys that clash, or
            a sampler made inside ``strategy.scope()``.
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
        # One tf.function each, retraced per batch size / shard (Python arguments); a dict of
        # functions keyed by int would be tracked by tf.Module and break checkpointing.
        # Graph code written with tf ops throughout: no autograph (errors stay ConfigErrors).
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
        """The index of a plain table's one shard.

        Raises:
            ConfigError: on a sharded table (use ``indexes[i]``).
        """
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
        """``(rows [B] int64, batch)``: the samples drawn at ``rows`` for ``update_fn``.

        The batch is in the table's structure, with the view's added keys (and
        ``"importance_weights"`` [B] float32 with `Prioritized`) beside its top-level keys (see
        `replaygpu.nest.pack_batch`). Inside ``strategy.run`` of a sharded table, ``batch_size``
        rows of the calling replica's shard.

        Raises:
            EmptyTableError: when called eagerly on an empty table.
        """
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
        """Trace-time scope the `Learner` wraps around its fused ``tf.while_loop``.

        Every shard's index takes in its new rows here, once per ``Learner.train`` call; inside,
        ``sample`` skips that, which would otherwise put a loop over new rows into every step.
        """
        self._sync_all()
        self._in_loop = True
        try:
            yield
        finally:
            self._in_loop = False

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Set the priorities of rows ``indices`` ([B] int64, as ``sample`` returned them).

        Inside a graph (the learner calls it in the same loop step as the SGD step, after
        ``sample``), a non-finite priority gets the max priority and is counted. Called eagerly
        (a plain table), the input is checked first and refused whole when it is bad.

        Raises:
            ConfigError: when the sampler keeps no priorities.
            BatchError: eagerly, for priorities that are negative, NaN or infinite, of another
                length than ``indices``, or for rows that cannot have been drawn (outside the
                filled rows, or rows the view never draws); nothing is written.
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
        """Sampling probability of every row of a plain table, ``[capacity]`` float64.

        Raises:
            ConfigError: for a sampler without priorities, or on a sharded table.
        """
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
        """An endless `tf.data.Dataset` of ``sample(batch_size)``, drawn in-graph from the live
        table: the bridge for loops built around ``tf.data`` (see `samplers.dataset`).

        Raises:
            ConfigError: for a batch size below 1, or a sampler of a sharded table.
        """
        return make_dataset(self.sample, self.table, batch_size, type(self).__name__)

    def _draw(self, shard_index: int, batch_size: int) -> tuple[tf.Tensor, tf.Tensor | None]:
        """Rows of shard ``shard_index`` that the view accepts, and their importance weights.

        With the minibatch, ``spare_draws * B`` independent (not stratified) spare rows are
        drawn, and the view checks all of them at once; the i-th row the view refuses takes the
        i-th spare row it accepts. The accepted spares are independent draws of the
        distribution over the accepted rows, so the marginal stays exact over those, for any
        distribution; a refused row left without a spare is counted in ``invalid_draws``. One
        fixed-shape step: a redraw loop would wait on the device at every SGD step for its
        predicate (on a GPU, a copy to the host).
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
            # by_rank[r]: the spare accepted r-th (a scatter, O(S); a search of the ranks
            # compiles to an O(B * S) comparison under XLA); slot B takes what is not needed
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
        """Sync, check and (only when every row and value is good) write an eager update, in one
        graph call: new rows are taken in first, so they do not overwrite it at the next sample.
        Plain ops: eager calls come in every size. Returns ``(ok, good rows, good values)``."""
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
        raise EmptyTableError(
            f"table '{table.name}' is empty: append transitions before sampling "
            f"(capacity {table.capacity}, size {table.size})"
        )


def shard_seeds(seed: int | None, shards: int) -> list[int | None]:
    """One seed per shard: ``seed`` itself for one shard (so a plain table's stream is the
    seed's), distinct derived seeds for more (None stays nondeterministic)."""
    if seed is None or shards == 1:
        return [seed] * shards
    return [
        int(np.random.SeedSequence([int(seed), i]).generate_state(1, np.uint32)[0])
        for i in range(shards)
    ]
