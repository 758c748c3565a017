"""Windows of T consecutive rows for recurrent agents, never crossing an episode boundary.

Episode starts: by default row ``r`` starts an episode when row ``r - 1`` ended one
(``terminated`` or ``truncated``), which is what the standard transition spec already stores.
A table may instead carry an explicit bool field (``start_field``, e.g. ``"episode_start"``)
set on the first row of each episode; use it when an actor can stop mid-episode without a
terminal flag. Either way the table must hold one stream of transitions in time order (one
table per actor, or actors that append whole episodes).

Two modes:

- ``pad=False`` (default): every window lies inside one episode and inside the written rows.
  Start rows are drawn uniformly and the invalid ones redrawn (rejection sampling, exact
  uniform over valid windows) up to ``max_tries`` rounds; a window still invalid then (episodes
  shorter than T) is returned padded as below and counted in ``short_windows``.
- ``pad=True``: the start row is uniform over all rows; steps after the episode ends (or past
  the newest row) are zero-filled and have ``mask`` 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from replaygpu.errors import ConfigError
from replaygpu.keys import MASK
from replaygpu.samplers.base import Sampler, check_not_empty
from replaygpu.samplers.uniform import make_generator
from replaygpu.storage import ReplayTable


class SequenceSampler(Sampler):
    """Draws ``[B, T]`` windows of consecutive rows that stay within one episode.

    Args:
        table: the table, appended in time order.
        length: window length T >= 1.
        seed: seed of the random stream; None for a nondeterministic one.
        pad: allow windows that run past the episode end, with a mask (see module doc).
        start_field: bool field marking the first row of each episode; None derives starts
            from ``terminated | truncated`` of the previous row.
        max_tries: rejection rounds before a window is returned padded (``pad=False``).
    """

    def __init__(
        self,
        table: ReplayTable,
        length: int,
        seed: int | None = None,
        pad: bool = False,
        start_field: str | None = None,
        max_tries: int = 32,
    ) -> None:
        super().__init__(name="sequence_sampler")
        if not isinstance(length, (int, np.integer)) or not 1 <= length <= table.capacity:
            raise ConfigError(
                f"length: got {length!r}, expected an integer in [1, capacity={table.capacity}]"
            )
        if not isinstance(max_tries, (int, np.integer)) or max_tries < 1:
            raise ConfigError(f"max_tries: got {max_tries!r}, expected an integer >= 1")
        need = [start_field] if start_field is not None else ["terminated", "truncated"]
        missing = [f for f in need if f not in table.spec]
        if missing:
            raise ConfigError(
                f"table '{table.name}' lacks field(s) {missing} that mark episode boundaries; it "
                f"has {sorted(table.spec)}"
            )
        if start_field is not None and table.spec[start_field].dtype != tf.bool:
            raise ConfigError(
                f"start_field '{start_field}': got dtype {table.spec[start_field].dtype.name}, "
                "expected bool"
            )
        if MASK in table.spec:
            raise ConfigError(
                f"table '{table.name}' has a field '{MASK}', the key this sampler adds; rename it"
            )
        self.table = table
        self.length = int(length)
        self.pad = bool(pad)
        self.start_field = start_field
        self.max_tries = int(max_tries)
        self.generator = make_generator(seed, table.device)
        with tf.device(table.device):
            self.short_windows = tf.Variable(0, dtype=tf.int64, trainable=False, name="short")

    def window_mask(self, starts: tf.Tensor) -> tf.Tensor:
        """``[B, T]`` bool: step t of the window at ``starts`` is in the start's episode."""
        table = self.table
        capacity = table.capacity
        offsets = tf.range(self.length, dtype=tf.int64)
        rows = (starts[:, None] + offsets[None, :]) % capacity
        ahead = (table.cursor.read_value() - 1 - starts) % capacity
        if self.start_field is not None:
            boundary = tf.gather(table.storage[self.start_field], rows)
        else:
            done = tf.gather(table.storage["terminated"], rows) | tf.gather(
                table.storage["truncated"], rows
            )
            boundary = tf.concat([tf.zeros_like(done[:, :1]), done[:, :-1]], axis=1)
        # Step 0 is always in the episode; a start at step t >= 1 ends the window before t.
        boundary = tf.concat([tf.zeros_like(boundary[:, :1]), boundary[:, 1:]], axis=1)
        cut = boundary | (offsets[None, :] > ahead[:, None])
        first_cut = tf.reduce_min(tf.where(cut, offsets[None, :], self.length), axis=1)
        return offsets[None, :] < first_cut[:, None]

    def sample_indices(self, batch_size: int) -> tf.Tensor:
        """``[B]`` int64 start rows (valid windows when ``pad=False`` and possible)."""
        check_not_empty(self.table)
        size = tf.maximum(self.table.size_var.read_value(), 1)
        starts = self.generator.uniform([batch_size], 0, size, dtype=tf.int64)
        if self.pad:
            return starts

        def invalid(s: tf.Tensor) -> tf.Tensor:
            return tf.logical_not(tf.reduce_all(self.window_mask(s), axis=1))

        def body(tries: tf.Tensor, s: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            fresh = self.generator.uniform([batch_size], 0, size, dtype=tf.int64)
            return tries + 1, tf.where(invalid(s), fresh, s)

        _, starts = tf.while_loop(
            lambda tries, s: tf.logical_and(tries < self.max_tries, tf.reduce_any(invalid(s))),
            body,
            (tf.constant(0, tf.int64), starts),
            parallel_iterations=1,
        )
        self.short_windows.assign_add(tf.reduce_sum(tf.cast(invalid(starts), tf.int64)))
        return starts

    def sample(self, batch_size: int) -> tuple[tf.Tensor, Any]:
        """``(starts [B] int64, {field: [B, T, ...], "mask": [B, T] float32})``.

        With a nested spec the fields come in the table's structure, ``mask`` beside its
        top-level keys (see `replaygpu.nest.pack_batch`).

        Padded steps (mask 0) hold zeros in every field.
        """
        starts = self.sample_indices(batch_size)
        mask = self.window_mask(starts)
        rows = (starts[:, None] + tf.range(self.length, dtype=tf.int64)[None, :]) % (
            self.table.capacity
        )
        batch = {}
        for name in self.table.storage:
            values = self.table.read(name, rows)  # spec dtype if stored narrower
            keep = tf.reshape(mask, [batch_size, self.length] + [1] * (values.shape.rank - 2))
            batch[name] = tf.where(keep, values, tf.zeros_like(values))
        batch[MASK] = tf.cast(mask, tf.float32)
        return starts, self.table.pack(batch)
