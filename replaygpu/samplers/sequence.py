"""Windows of T consecutive rows for recurrent agents, never crossing an episode or a stream.

Row ``r`` starts an episode when row ``r - 1`` was ``terminated`` or ``truncated``, or, with
``start_field``, where that bool field is set (for actors that stop mid-episode without a
terminal flag). Streams sharing a table (each appending whole sequences) are told apart by an
integer ``stream_field`` (default: a sharded table's ``shard_by``); a window stops where it
changes. A sample belongs to its start row: drawn, weighted and updated there.

- ``pad=False`` (default): windows lie inside one episode and the written rows. Invalid starts
  take the sampler's spare draws (exact over valid windows); one still invalid (episodes
  shorter than T) comes back padded and counted in ``invalid_draws``. A start crossing an
  episode or stream never becomes valid: prioritized, it gets priority 0.
- ``pad=True``: any row may start; steps past the episode end or newest row are zeros, mask 0.

``burn_in`` rows before the start are prepended (``[B, burn_in + T]``) to warm up a recurrent
state; those of another episode or stream, or older than the oldest row, are zeros with mask 0,
and never make a start invalid. ``n_step > 1`` makes every step an `NStep` transition (with
``discount`` and ``nstep`` ``[B, L]``, from the same `n_step_window`).

Recurrent state (R2D2): ``state_field`` (a leaf or nest) holds the state an actor had *before*
each row's step, at every row or every ``period``-th. The batch holds it once, ``[B, ...]``, at
the window's first real row (first kept burn-in row), from where the network unrolls. With
``state_start_field`` (bool, set where a state was stored) only windows whose first real row
holds one are drawn; others are redrawn, and get priority 0.
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
from replaygpu.table import ReplayTable, Table


@dataclasses.dataclass(frozen=True)
class Sequence(View):
    """``[B, burn_in + T]`` windows of consecutive rows that stay within one episode and stream.

    Args:
        length: window length T (after the burn-in).
        burn_in: steps before the window's start, fed to a recurrent state (module doc).
        pad: zero-pad a window past its episode's end instead of refusing the start.
        start_field: a bool field marking episode starts (None: derived from the previous
            row's ``terminated | truncated``).
        stream_field: an integer field a window may not change within (None: no streams).
        state_field: a stored recurrent state, returned once per window from its first
            real row.
        state_start_field: a bool field marking the rows where ``state_field`` is stored;
            windows start only there.
        n_step: n-step transitions at every step (1: the rows as stored).
        gamma: discount factor of the n-step returns.

    Every field comes as ``[B, L, ...]`` (``L = burn_in + T``), padded steps zero, with
    ``mask`` ([B, L] float32, 1 where a step is real).
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
        check_n_step(self, "n_step")
        object.__setattr__(self, "pad", bool(self.pad))
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
        """Starts crossing an episode or stream in the written rows, or without a stored state."""
        dead = tf.logical_not(self._holds_state(table, rows))
        if self.pad:
            return dead if self.state_start_field is not None else None
        offsets = tf.range(self.length, dtype=tf.int64)
        boundary, ahead = self._boundaries(table, rows)
        return dead | tf.reduce_any(boundary & (offsets[None, :] <= ahead[:, None]), axis=1)

    def _first_rows(
        self, table: ReplayTable, starts: tf.Tensor, burn_in: tf.Tensor | None = None
    ) -> tf.Tensor:
        """``[B]`` the oldest kept row of each window (``burn_in``: `_burn_in_mask`, if known)."""
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
        """``{field: [B, L, ...], "mask": [B, L]}``; state leaves ``[B, ...]``."""
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
