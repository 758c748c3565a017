"""N-step returns at sample time from consecutive rows (`NStep`, `FrameStack`, `Sequence`).

From row ``i`` the window reads rows ``i .. i+n-1`` (mod capacity) and stops at the first step
``k`` that ends the episode, is the n-th, is followed by an unwritten row, or that the view cuts
(next row of another stream or episode). It gives:

- ``reward``: ``sum_{j<=k} gamma**j * r_{i+j}``;
- ``terminated``, ``truncated``: those of row ``i+k``;
- ``discount`` ([B] float32): ``gamma**(k+1) * (1 - terminated_{i+k})``, the bootstrap
  multiplier (a truncated or cut window still bootstraps);
- ``nstep`` ([B] int64): ``k + 1``, the number of rewards summed.

Each stream's rows are consecutive in time order: one table per actor, or a ``stream_field``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import ClassVar

import tensorflow as tf

from replaygpu.errors import ConfigError, check_int
from replaygpu.keys import DISCOUNT, NSTEP
from replaygpu.nest import leaves_under
from replaygpu.reductions import first_true
from replaygpu.samplers.view import View
from replaygpu.table import ReplayTable, Table

_REQUIRED = ("reward", "next_obs", "terminated", "truncated")

Cut = Callable[[tf.Tensor], tf.Tensor]


def check_n_step(view: View, name: str = "n") -> None:
    """Store a frozen view's steps ``name`` as an int and its ``gamma`` as a float; `ConfigError`
    unless the steps are an integer >= 1 and ``gamma`` lies in [0, 1]."""
    n, gamma = check_int(name, getattr(view, name), 1), view.gamma
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and 0.0 <= gamma <= 1.0):
        raise ConfigError(f"gamma: got {gamma}, expected a number in [0, 1]")
    object.__setattr__(view, name, n)
    object.__setattr__(view, "gamma", float(gamma))


def n_step_window(
    table: ReplayTable,
    rows: tf.Tensor,
    n: int,
    gamma: float,
    next_written: int = 1,
    cut: Cut | None = None,
) -> tuple[dict[str, tf.Tensor], tf.Tensor, tf.Tensor]:
    """The n-step fields of the samples at first rows ``rows`` ([N] int64): ``({"reward",
    "terminated", "truncated", DISCOUNT, NSTEP}: [N]``, ``step_rows [N, n]``, ``last [N]`` the
    index of the last step taken).

    Args:
        table: the shard, with ``reward``, ``terminated`` and ``truncated`` fields.
        n: steps at most.
        next_written: step ``j + 1`` needs row ``i + j + next_written`` written (1 for vector
            transitions; 2 for frame tables, whose next frame is the row after the step's row).
        cut: ``cut(step_rows [N, n]) -> [N, n] bool``: also stop after step j where True.
    """
    capacity = table.capacity
    steps = tf.range(n, dtype=tf.int64)
    step_rows = (rows[:, None] + steps[None, :]) % capacity  # [N, n]: step j's row
    terminated = table.read("terminated", step_rows)
    truncated = table.read("truncated", step_rows)
    ahead = (table.cursor.read_value() - 1 - rows) % capacity  # [N] rows written after
    stop = (
        terminated
        | truncated
        | (steps[None, :] >= n - 1)
        | (steps[None, :] + next_written > ahead[:, None])
    )
    if cut is not None:
        stop = stop | cut(step_rows)
    last = first_true(stop)  # [N] int64; the last step always stops
    used = steps[None, :] <= last[:, None]
    powers = tf.constant([gamma**j for j in range(n)], tf.float32)
    rewards = tf.cast(table.read("reward", step_rows), tf.float32)
    ret = tf.reduce_sum(tf.where(used, rewards * powers, tf.zeros_like(rewards)), axis=1)
    last_terminated = tf.gather(terminated, last, batch_dims=1)
    gamma_k = tf.pow(tf.constant(gamma, tf.float32), tf.cast(last + 1, tf.float32))
    fields = {
        "reward": tf.cast(ret, table.spec["reward"].dtype),
        "terminated": last_terminated,
        "truncated": tf.gather(truncated, last, batch_dims=1),
        DISCOUNT: gamma_k * (1.0 - tf.cast(last_terminated, tf.float32)),
        NSTEP: last + 1,
    }
    return fields, step_rows, last


def check_transition_fields(table: Table, stream_field: str | None, what: str) -> None:
    """Raise `ConfigError` when ``table`` lacks the fields n-step returns read."""
    # next_obs may be a nest (a Dict observation); the others are scalar leaves
    missing = [f for f in _REQUIRED if f not in table.spec]
    if "next_obs" in missing and leaves_under(table.spec, "next_obs"):
        missing.remove("next_obs")
    if stream_field is not None and stream_field not in table.spec:
        missing.append(stream_field)
    if missing:
        raise ConfigError(
            f"table '{table.name}' lacks field(s) {missing} that {what} needs; it has "
            f"{sorted(table.spec)} (build the spec with replaygpu.specs_from_env)"
        )


def stream_cut(table: ReplayTable, stream_field: str | None) -> Cut | None:
    """Cut after step j when row j + 1 of the window is of another stream than row 0."""
    if stream_field is None:
        return None

    def cut(step_rows: tf.Tensor) -> tf.Tensor:
        stream = table.read(stream_field, step_rows)
        other_next = stream[:, 1:] != stream[:, :1]
        return tf.concat([other_next, tf.zeros_like(stream[:, :1], tf.bool)], axis=1)

    return cut


@dataclasses.dataclass(frozen=True)
class NStep(View):
    """N-step transitions of vector rows (module doc), with n-step ``next_obs`` too.

    Args:
        n: steps at most (1 gives the ordinary transitions plus ``discount``).
        gamma: discount factor in ``[0, 1]``.
        stream_field: integer field naming each row's stream; None: the table's ``shard_by``.
    """

    n: int = 3
    gamma: float = 0.99
    stream_field: str | None = None

    needs_stream_rows: ClassVar[bool] = True
    added_keys: ClassVar[tuple[str, ...]] = (DISCOUNT, NSTEP)

    def __post_init__(self) -> None:
        check_n_step(self)

    @property
    def lookahead(self) -> int:
        return self.n - 1

    def check(self, table: Table) -> None:
        check_transition_fields(table, self.stream_field, "n-step returns")
        super().check(table)

    def read(self, table: ReplayTable, rows: tf.Tensor) -> dict[str, tf.Tensor]:
        return self.accumulate(table, rows, table.gather(rows))

    def accumulate(
        self, table: ReplayTable, rows: tf.Tensor, batch: dict[str, tf.Tensor]
    ) -> dict[str, tf.Tensor]:
        """Replace the one-step fields of the flat ``batch`` (rows ``rows``) by n-step ones."""
        fields, step_rows, last = n_step_window(
            table, rows, self.n, self.gamma, cut=stream_cut(table, self.stream_field)
        )
        out = {**batch, **fields}
        last_row = tf.gather(step_rows, last, batch_dims=1)
        for path in leaves_under(table.spec, "next_obs"):  # one leaf, or a nested obs' leaves
            out[path] = table.read(path, last_row)  # spec dtype if stored narrower
        return out
