"""Frame-stacked pixel replay: each frame stored once, k-stacks rebuilt in the graph.

A plain `ReplayTable` (service and checkpoints unchanged), one row per step::

    frame [H, W] uint8 | action | reward | terminated | truncated | first | final

``first`` marks an episode's reset frame. After an episode's last step, a ``final=True`` row
holds its last next-observation frame and no transition (never drawn). So ``next_obs``'s newest
frame of row ``i`` is row ``i + 1``'s, and 1e6 transitions of 84x84 frames take 7.07 GB
(``H * W + 16`` bytes a row, plus a row per episode).

Stacks match gymnasium's ``FrameStackObservation(env, k)`` (``padding_type="reset"``):
``[k, H, W]``, oldest first, the reset frame repeated before an episode start. A row whose stack
reaches past the oldest row is not drawn, nor the newest row before its next frame is written.

Any distribution works (``rg.Sampler(table, rg.Prioritized(), rg.FrameStack(4, n_step=3))`` is
Ape-X on Atari); a sample belongs to ``obs``'s newest frame's row; final rows get priority 0.
Writers make rows with `replaygpu.frames.frame_rows` (no TensorFlow).

One writer per frame table: rows of several actors must not interleave, as row ``i + 1`` must
hold the frame after row ``i``. Give each actor (gRPC ``actor_id``) its own table, or append
whole episodes. (Vector transitions take a ``stream_field`` instead.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import tensorflow as tf

from replaygpu.errors import ConfigError, check_int
from replaygpu.keys import DISCOUNT, NSTEP
from replaygpu.reductions import first_true
from replaygpu.samplers.nstep import check_n_step, n_step_window
from replaygpu.samplers.view import View
from replaygpu.specs import Spec
from replaygpu.table import ReplayTable, Table

FRAME_FIELDS = ("frame", "action", "reward", "terminated", "truncated", "first", "final")


def make_frame_spec(
    frame_shape: Sequence[int] = (84, 84),
    action_spec: tf.TensorSpec | None = None,
    frame_dtype: tf.DType = tf.uint8,
) -> Spec:
    """A frame table's spec (module doc); ``action_spec`` defaults to scalar int64."""
    return {
        "frame": tf.TensorSpec(list(frame_shape), frame_dtype, name="frame"),
        "action": action_spec or tf.TensorSpec([], tf.int64, name="action"),
        "reward": tf.TensorSpec([], tf.float32, name="reward"),
        "terminated": tf.TensorSpec([], tf.bool, name="terminated"),
        "truncated": tf.TensorSpec([], tf.bool, name="truncated"),
        "first": tf.TensorSpec([], tf.bool, name="first"),
        "final": tf.TensorSpec([], tf.bool, name="final"),
    }


def make_frame_table(
    capacity: int,
    frame_shape: Sequence[int] = (84, 84),
    action_spec: tf.TensorSpec | None = None,
    device: str | None = None,
    name: str = "replay",
) -> ReplayTable:
    """A `ReplayTable` with `make_frame_spec` rows; ``capacity`` counts rows (see module doc)."""
    return ReplayTable(make_frame_spec(frame_shape, action_spec), capacity, device, name)


@dataclasses.dataclass(frozen=True)
class FrameStack(View):
    """Transitions of a frame table with their ``[k, H, W]`` obs/next_obs stacks rebuilt.

    Args:
        stack: frames per stack k >= 1.
        n_step: steps per transition n; n > 1 gives `NStep`'s transitions (same
            `n_step_window`), m <= n also stopping before a row whose next frame is missing;
            ``next_obs`` is then the stack m steps on.
        gamma: discount factor of the n-step return, in ``[0, 1]``.

    Batch: ``obs``, ``next_obs`` ``[B, k, H, W]``, ``action``, ``reward``, ``terminated``,
    ``truncated`` (and ``discount``, ``nstep`` with n > 1).
    """

    stack: int = 4
    n_step: int = 1
    gamma: float = 0.99

    needs_stream_rows: ClassVar[bool] = True
    checks_rows: ClassVar[bool] = True  # final rows, and the newest before its next frame
    lookahead: ClassVar[int] = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "stack", check_int("stack", self.stack, 1))
        check_n_step(self, "n_step")

    @property
    def added_keys(self) -> tuple[str, ...]:
        return (DISCOUNT, NSTEP) if self.n_step > 1 else ()

    def check(self, table: Table) -> None:
        missing = [f for f in FRAME_FIELDS if f not in table.spec]
        if missing:
            raise ConfigError(
                f"table '{table.name}' lacks frame-table field(s) {missing}; make it with "
                "replaygpu.make_frame_table"
            )
        capacity = table.shards[0].capacity
        for name, value in (("stack", self.stack), ("n_step", self.n_step)):
            if value >= capacity:
                raise ConfigError(
                    f"{name}: got {value}, expected an integer in [1, capacity={capacity})"
                )
        super().check(table)

    def history(self, table: ReplayTable, rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Distance back to the episode start, capped at k-1, and validity of each row."""
        k, capacity = self.stack, table.capacity
        back = tf.range(k, dtype=tf.int64)
        first = table.read("first", (rows[:, None] - back[None, :]) % capacity)
        first = tf.concat([first[:, :-1], tf.ones_like(first[:, :1])], axis=1)
        # First episode start looking back (int64 throughout: int32 stays in host memory on GPU).
        dist = first_true(first)  # [B] <= k-1
        cursor = table.cursor.read_value()
        oldest = (cursor - table.size_var.read_value()) % capacity
        age = (rows - oldest) % capacity
        ahead = (cursor - 1 - rows) % capacity
        nxt = (rows + 1) % capacity
        valid = (
            tf.logical_not(table.read("final", rows))
            & (ahead >= 1)
            & tf.logical_not(table.read("first", nxt))
            & (dist <= age)
        )
        return dist, valid

    def valid(self, table: ReplayTable, rows: tf.Tensor) -> tf.Tensor:
        return self.history(table, rows)[1]

    def settled_invalid(self, table: ReplayTable, rows: tf.Tensor) -> tf.Tensor:
        """Final rows, and rows whose next row (written) starts another episode."""
        capacity = table.capacity
        ahead = (table.cursor.read_value() - 1 - rows) % capacity
        next_first = table.read("first", (rows + 1) % capacity) & (ahead >= 1)
        return table.read("final", rows) | next_first

    def read(self, table: ReplayTable, rows: tf.Tensor) -> dict[str, tf.Tensor]:
        """``{"obs", "next_obs": [B, k, H, W], "action", "reward", ...}`` of ``rows``."""
        dist = self.history(table, rows)[0]
        if self.n_step > 1:
            return self._n_step_batch(table, rows, dist)
        k, capacity = self.stack, table.capacity
        # Offsets back from the row, oldest first: k-1, ..., 0, then -1 (the next frame).
        offsets = tf.range(k - 1, -2, -1, dtype=tf.int64)
        source = tf.minimum(offsets[None, :], dist[:, None])
        frames = table.read("frame", (rows[:, None] - source) % capacity)  # [B, k+1, ...]
        batch = {"obs": frames[:, :k], "next_obs": frames[:, 1:]}
        for name in ("action", "reward", "terminated", "truncated"):
            batch[name] = table.read(name, rows)  # spec dtype if stored narrower
        return batch

    def _n_step_batch(
        self, table: ReplayTable, rows: tf.Tensor, dist: tf.Tensor
    ) -> dict[str, tf.Tensor]:
        """The n-step transitions of drawable ``rows`` (distance ``dist`` to episode start)."""
        k, capacity = self.stack, table.capacity

        def cut(step_rows: tf.Tensor) -> tf.Tensor:  # step j + 1's next frame is a reset
            return table.read("first", (step_rows + 2) % capacity)

        fields, _, last = n_step_window(table, rows, self.n_step, self.gamma, 2, cut)
        m = last + 1
        # Both stacks in one read: k frames back from the row, then from row + m.
        back = tf.range(k - 1, -1, -1, dtype=tf.int64)  # oldest first
        obs_rows = rows[:, None] - tf.minimum(back[None, :], dist[:, None])
        next_rows = (rows + m)[:, None] - tf.minimum(back[None, :], (dist + m)[:, None])
        frames = table.read("frame", tf.concat([obs_rows, next_rows], axis=1) % capacity)
        return {
            "obs": frames[:, :k],
            "next_obs": frames[:, k:],
            "action": table.read("action", rows),
            **fields,
        }
