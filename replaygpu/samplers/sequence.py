"""Windows of T consecutive rows for recurrent agents, never crossing an episode or a stream.

Episode starts: by default row ``r`` starts an episode when row ``r - 1`` ended one
(``terminated`` or ``truncated``), which is what the standard transition spec already stores.
A table may instead carry an explicit bool field (``start_field``, e.g. ``"episode_start"``)
set on the first row of each episode; use it when an actor can stop mid-episode without a
terminal flag. Several streams may share a table when each appends whole sequences or episodes
and the table has an integer stream field (``stream_field``, or a sharded table's ``shard_by``):
a window stops where the stream changes.

A sample belongs to its start row: with any distribution the start is drawn (in proportion to
priority with `Prioritized`), weighted and updated there.

Two modes:

- ``pad=False`` (default): every window lies inside one episode and inside the written rows.
  Invalid starts are replaced (exact over valid windows) by the sampler's spare draws
  (``spare_draws``); a window still invalid then (episodes shorter than T) is returned padded
  as below and counted in ``invalid_draws``. A start whose window crosses an episode or a
  stream never becomes valid: a prioritized index gives it priority 0.
- ``pad=True``: every row may start a window; steps after the episode ends (or past the newest
  row) are zero-filled and have ``mask`` 0.

Burn-in: ``burn_in`` rows *before* the start are prepended (``[B, burn_in + T]``), for a
recurrent network to warm up its state on; burn-in steps of another episode or stream, or older
than the oldest row, are zero-filled with ``mask`` 0. They never make a start invalid.

N-step: with ``n_step > 1`` every step of the window is an n-step transition (the `NStep`
view's fields, ``discount`` and ``nstep`` ``[B, L]`` beside them), computed by the same
`n_step_window`.

Recurrent state (R2D2): an actor stores its recurrent state (an LSTM's ``(h, c)``) in a field
(``state_field``, a leaf or a nest of leaves), the state it had *before* the row's step, at
every row or at every ``period``-th row of an episode. The batch holds that field once per
window, ``[B, ...]``: its value at the window's first real row (the first burn-in row, or the
episode's first row when the burn-in reaches before it), from where a recurrent network
unrolls the burn-in and then the T steps. With ``state_start_field`` (a bool field the actor
sets on the rows where it stored a state) a window is drawn only where its first real row holds
one; other starts are redrawn, and a prioritized index gives them priority 0.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from replaygpu.errors import ConfigError, check_int
from replaygpu.keys import DISCOUNT, MASK, NSTEP
from replaygpu.nest import leaves_under
from replaygpu.reductions import first_true
from replaygpu.samplers.nstep import NStep, check_n_step, check_transition_fields
from replaygpu.samplers.view import View
from replaygpu.storage import ReplayTable
from replaygpu.table import Table


@dataclasses.dataclass(frozen=True)
class Sequence(View):
    """``[B, burn_in + T]`` windows of consecutive rows that stay within one episode and stream.

    Args:
        length: window length T >= 1 (after the burn-in).
        burn_in: rows before the start to prepend, >= 0.
        pad: allow windows that run past the episode end, with a mask (see module doc).
        start_field: bool field marking the first row of each episode; None derives starts
            from ``terminated | truncated`` of the previous row.
        stream_field: integer field naming each row's stream; None uses the table's
            ``shard_by`` (None on a plain table: one stream).
        n_step: n-step transitions at every step (1: the rows as stored).
        gamma: discount factor of the n-step returns.
        state_field: field (or nest) holding the recurrent state before each row's step; the
            batch holds it at the window's first real row only, ``[B, ...]``.
        state_start_field: bool field marking the rows that hold a stored state; None: every
            row holds one.

    The batch holds every field as ``[B, L, ...]`` (``L = burn_in + T``) and ``mask`` ([B, L]
    float32, 1 where a step is real); padded steps hold zeros in every field.
    """

    length: int = 16
    burn_in: int = 0
    pad: bool = False
    start_field: str | None = None
    stream_field: str | None = None
    n_step: int = 1
    gamma: float = 0.99
    state_field: str | None = None
    state_start_field: str | None = None

    needs_stream_rows: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", check_int("length", self.length, 1))
        object.__setattr__(self, "burn_in", check_int("burn_in", self.burn_in, 0))
        check_n_step(self.n_step, self.gamma, "n_step")
        object.__setattr__(self, "n_step", int(self.n_step))
        object.__setattr__(self, "pad", bool(self.pad))
        object.__setattr__(self, "gamma", float(self.gamma))
        if self.state_start_field is not None and self.state_field is None:
            raise ConfigError(
                f"state_start_field: got {self.state_start_field!r} without a state_field; "
                "name the field that holds the recurrent state (state_field=...)"
            )

    @property
    def added_keys(self) -> tuple[str, ...]:
        return (MASK, DISCOUNT, NSTEP) if self.n_step > 1 else (MASK,)

    @property
    def checks_rows(self) -> bool:
        return not self.pad or self.state_start_field is not None

    @property
    def lookahead(self) -> int:
        return self.length - 1

    def for_table(self, table: Table) -> Sequence:
        if self.stream_field is None and table.shard_by is not None:
            return dataclasses.replace(self, stream_field=table.shard_by)
        return self

    def check(self, table: Table) -> None:
        capacity = table.shards[0].capacity
        if self.burn_in + self.length > capacity:
            raise ConfigError(
                f"length: got {self.length} (burn_in {self.burn_in}), expected burn_in + length "
                f"<= the capacity of a shard ({capacity})"
            )
        need = [self.start_field] if self.start_field is not None else ["terminated", "truncated"]
        if self.stream_field is not None:
            need.append(self.stream_field)
        missing = [f for f in need if f not in table.spec]
        if missing:
            raise ConfigError(
                f"table '{table.name}' lacks field(s) {missing} that mark episode and stream "
                f"boundaries; it has {sorted(table.spec)}"
            )
        if self.start_field is not None and table.spec[self.start_field].dtype != tf.bool:
            raise ConfigError(
                f"start_field '{self.start_field}': got dtype "
                f"{table.spec[self.start_field].dtype.name}, expected bool"
            )
        if self.n_step > 1:
            check_transition_fields(table, self.stream_field, "Sequence(n_step > 1)")
        if self.state_field is not None and not leaves_under(table.spec, self.state_field):
            raise ConfigError(
                f"state_field: table '{table.name}' has no field '{self.state_field}' for the "
                f"recurrent state; it has {sorted(table.spec)}. Store the state the actor had "
                "before each step in a field of that name (e.g. the LSTM's (h, c))"
            )
        marks = self.state_start_field
        if marks is not None and (marks not in table.spec or table.spec[marks].dtype != tf.bool):
            got = table.spec[marks].dtype.name if marks in table.spec else "no such field"
            raise ConfigError(
                f"state_start_field '{marks}': got {got} in table '{table.name}', expected a "
                "bool field set on the rows where the actor stored its state"
            )
        super().check(table)

    def _starts_episode(self, table: ReplayTable, rows: tf.Tensor) -> tf.Tensor:
        """Whether each of ``rows`` (any shape) is the first row of an episode."""
        if self.start_field is not None:
            return table.read(self.start_field, rows)
        before = (rows - 1) % table.capacity
        return table.read("terminated", before) | table.read("truncated", before)

    def _other_stream(self, table: ReplayTable, rows: tf.Tensor, starts: tf.Tensor) -> tf.Tensor:
        """``[B, L]`` bool: rows of another stream than their window's start row."""
        stream = self.stream_field
        return table.read(stream, rows) != table.read(stream, starts)[:, None]

    def _boundaries(self, table: ReplayTable, starts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``([B, T] bool: step t >= 1 starts another episode or stream, [B] rows ahead)``."""
        offsets = tf.range(self.length, dtype=tf.int64)
        rows = (starts[:, None] + offsets[None, :]) % table.capacity
        if self.start_field is not None:
            boundary = table.read(self.start_field, rows)
        else:  # step t starts an episode when step t - 1 ended one
            done = table.read("terminated", rows) | table.read("truncated", rows)
            boundary = tf.concat([tf.zeros_like(done[:, :1]), done[:, :-1]], axis=1)
        if self.stream_field is not None:
            boundary = boundary | self._other_stream(table, rows, starts)
        # Step 0 is always in the episode; a boundary at step t >= 1 ends the window before t.
        boundary = tf.concat([tf.zeros_like(boundary[:, :1]), boundary[:, 1:]], axis=1)
        ahead = (table.cursor.read_value() - 1 - starts) % table.capacity
        return boundary, ahead

    def window_mask(self, table: ReplayTable, starts: tf.Tensor) -> tf.Tensor:
        """``[B, T]`` bool: step t of the window at ``starts`` is in the start's episode."""
        offsets = tf.range(self.length, dtype=tf.int64)
        boundary, ahead = self._boundaries(table, starts)
        cut = boundary | (offsets[None, :] > ahead[:, None])
        return offsets[None, :] < first_true(cut)[:, None]

    def valid(self, table: ReplayTable, rows: tf.Tensor) -> tf.Tensor:
        ok = self._holds_state(table, rows)
        if self.pad:
            return ok
        return ok & tf.reduce_all(self.window_mask(table, rows), axis=1)

    def settled_invalid(self, table: ReplayTable, rows: tf.Tensor) -> tf.Tensor | None:
        """Starts whose window crosses an episode or stream within the written rows, or whose
        first real row holds no stored state."""
        dead = tf.logical_not(self._holds_state(table, rows))
        if self.pad:
            return dead if self.state_start_field is not None else None
        offsets = tf.range(self.length, dtype=tf.int64)
        boundary, ahead = self._boundaries(table, rows)
        return dead | tf.reduce_any(boundary & (offsets[None, :] <= ahead[:, None]), axis=1)

    def _first_rows(
        self, table: ReplayTable, starts: tf.Tensor, burn_in: tf.Tensor | None = None
    ) -> tf.Tensor:
        """``[B]`` the first real row of each window: the oldest burn-in row it keeps
        (``burn_in``: the `_burn_in_mask` of ``starts``, when computed already)."""
        if not self.burn_in:
            return starts
        if burn_in is None:
            burn_in = self._burn_in_mask(table, starts)
        kept = tf.reduce_sum(tf.cast(burn_in, tf.int64), axis=1)
        return (starts - kept) % table.capacity

    def _holds_state(self, table: ReplayTable, starts: tf.Tensor) -> tf.Tensor:
        """``[B]`` bool: the window's first real row holds a stored state."""
        if self.state_start_field is None:
            return tf.ones_like(starts, tf.bool)
        return table.read(self.state_start_field, self._first_rows(table, starts))

    def _burn_in_mask(self, table: ReplayTable, starts: tf.Tensor) -> tf.Tensor:
        """``[B, burn_in]`` bool, oldest first: burn-in row ``start - j`` is in the start's
        episode and stream and not older than the oldest row."""
        capacity = table.capacity
        back = tf.range(1, self.burn_in + 1, dtype=tf.int64)  # nearest first
        rows = (starts[:, None] - back[None, :]) % capacity
        # Row start - j is cut off when any of rows start - j + 1 .. start begins an episode.
        blocked = self._starts_episode(table, (rows + 1) % capacity)
        if self.stream_field is not None:
            blocked = blocked | self._other_stream(table, rows, starts)
        oldest = (table.cursor.read_value() - table.size_var.read_value()) % capacity
        age = (starts - oldest) % capacity
        blocked = blocked | (back[None, :] > age[:, None])
        kept = tf.equal(tf.cumsum(tf.cast(blocked, tf.int64), axis=1), 0)
        return tf.reverse(kept, axis=[1])

    def read(self, table: ReplayTable, rows: tf.Tensor) -> dict[str, tf.Tensor]:
        """The windows at start rows ``rows``: ``{field: [B, L, ...], "mask": [B, L]}``, and
        the state field's leaves at each window's first real row, ``[B, ...]``."""
        starts = rows
        batch_size = starts.shape[0]
        mask = self.window_mask(table, starts)
        burn_in = None
        if self.burn_in:
            burn_in = self._burn_in_mask(table, starts)
            mask = tf.concat([burn_in, mask], axis=1)
        first = self._first_rows(table, starts, burn_in)
        state = leaves_under(table.storage, self.state_field) if self.state_field else []
        steps = self.burn_in + self.length
        offsets = tf.range(-self.burn_in, self.length, dtype=tf.int64)
        window = (starts[:, None] + offsets[None, :]) % table.capacity  # [B, L]
        if self.n_step > 1:  # every step an n-step transition: the rows' windows, flattened
            view = NStep(self.n_step, self.gamma, self.stream_field)
            values = view.read(table, tf.reshape(window, [-1]))
            values = {
                k: tf.reshape(v, [batch_size, steps, *v.shape[1:]])
                for k, v in values.items()
                if k not in state
            }
        else:
            values = {name: table.read(name, window) for name in table.storage if name not in state}
        batch = {name: table.read(name, first) for name in state}
        for name, value in values.items():
            keep = tf.reshape(mask, [batch_size, steps] + [1] * (value.shape.rank - 2))
            batch[name] = tf.where(keep, value, tf.zeros_like(value))
        batch[MASK] = tf.cast(mask, tf.float32)
        return batch
