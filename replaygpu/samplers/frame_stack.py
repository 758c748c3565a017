"""Frame-stacked pixel replay: each frame stored once, k-stacks rebuilt in the graph.

Layout (an ordinary `ReplayTable`, so the gRPC service and checkpoints work unchanged): one row
per environment step holds that step's newest observation frame and the step's small fields::

    frame [H, W] uint8 | action | reward | terminated | truncated | first | final

``first`` marks the reset frame of an episode. After the last step of an episode (terminated or
truncated) one extra row with ``final=True`` holds the episode's last next-observation frame
and no transition (its other fields are zero, and it is never drawn). So for every transition
row ``i`` the newest frame of ``next_obs`` is the frame of row ``i + 1``, and 1e6 transitions
need about 1e6 rows of ``H * W + 16`` bytes: 7.07 GB for 84x84 frames, plus one row per episode.

Stacks match gymnasium's ``FrameStackObservation(env, k)`` with its default
``padding_type="reset"``: ``[k, H, W]``, oldest frame first, and at an episode start the reset
frame repeated in the positions before it. Frames overwritten by the ring are never used: a row
whose stack would reach past the oldest row is not drawn, nor is the newest row while its next
frame is not written yet.

Writers use `frame_rows` (`replaygpu.frames`, no TensorFlow) to turn an actor's steps into rows.

One writer per frame table: the layout relies on row ``i + 1`` holding the frame after row
``i``, so rows of several actors must not interleave in one table. Give each actor (or each
gRPC ``actor_id``) its own frame table, or send whole episodes per append so that appends of
different actors never split one. (Vector transitions have no such limit; the n-step sampler
takes a ``stream_field`` for interleaved writers.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from replaygpu.errors import ConfigError
from replaygpu.keys import DISCOUNT, NSTEP
from replaygpu.samplers.base import Sampler, check_not_empty
from replaygpu.samplers.uniform import make_generator
from replaygpu.specs import Spec
from replaygpu.storage import ReplayTable

FRAME_FIELDS = ("frame", "action", "reward", "terminated", "truncated", "first", "final")


def make_frame_spec(
    frame_shape: Sequence[int] = (84, 84),
    action_spec: tf.TensorSpec | None = None,
    frame_dtype: tf.DType = tf.uint8,
) -> Spec:
    """The spec of a frame table: one ``frame`` per row plus the step's small fields.

    Args:
        frame_shape: shape of one frame, e.g. ``(84, 84)``.
        action_spec: spec of one action; default a scalar int64 (Discrete).
        frame_dtype: dtype of the frames (uint8 for pixels).
    """
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


class FrameStackSampler(Sampler):
    """Draws transition rows uniformly and rebuilds their ``[k, H, W]`` obs/next_obs stacks.

    Args:
        table: a table with `make_frame_spec` fields, appended with `frame_rows`.
        stack: frames per stack k >= 1.
        seed: seed of the random stream; None for a nondeterministic one.
        max_tries: redraw rounds for rows that cannot be drawn (final rows, the newest row,
            rows whose stack was overwritten); rows still invalid after them are counted in
            ``invalid_draws``.
        n_step: steps per transition n >= 1. With n > 1 the batch is an n-step transition
            as `NStepSampler` gives for vector rows: ``reward`` sums ``gamma**j`` times the
            rewards of steps ``j = 0 .. m-1`` from the drawn row, where m <= n stops at the
            episode's end, at the newest written row and before a row whose next frame is
            missing; ``next_obs`` is the stack m steps on, ``terminated``/``truncated`` are
            those of step m-1, ``discount`` is ``gamma**m`` (0 when step m-1 terminated) and
            ``nstep`` is m.
        gamma: discount factor of the n-step return, in ``[0, 1]``.

    The batch holds ``obs`` and ``next_obs`` ``[B, k, H, W]`` plus ``action``, ``reward``,
    ``terminated`` and ``truncated`` of the drawn rows (and ``discount``, ``nstep`` with n > 1).
    """

    def __init__(
        self,
        table: ReplayTable,
        stack: int = 4,
        seed: int | None = None,
        max_tries: int = 32,
        n_step: int = 1,
        gamma: float = 0.99,
    ) -> None:
        super().__init__(name="frame_stack_sampler")
        missing = [f for f in FRAME_FIELDS if f not in table.spec]
        if missing:
            raise ConfigError(
                f"table '{table.name}' lacks frame-table field(s) {missing}; make it with "
                "replaygpu.make_frame_table"
            )
        if not isinstance(stack, (int, np.integer)) or not 1 <= stack < table.capacity:
            raise ConfigError(f"stack: got {stack!r}, expected an integer in [1, capacity)")
        if not isinstance(max_tries, (int, np.integer)) or max_tries < 1:
            raise ConfigError(f"max_tries: got {max_tries!r}, expected an integer >= 1")
        if not isinstance(n_step, (int, np.integer)) or not 1 <= n_step < table.capacity:
            raise ConfigError(f"n_step: got {n_step!r}, expected an integer in [1, capacity)")
        if not (math.isfinite(gamma) and 0.0 <= gamma <= 1.0):
            raise ConfigError(f"gamma: got {gamma}, expected a number in [0, 1]")
        self.table = table
        self.stack = int(stack)
        self.max_tries = int(max_tries)
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.generator = make_generator(seed, table.device)
        with tf.device(table.device):
            self.invalid_draws = tf.Variable(0, dtype=tf.int64, trainable=False, name="invalid")

    def _history(self, rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Distance back to the episode start, capped at k-1, and validity of each row."""
        table, k, capacity = self.table, self.stack, self.table.capacity
        storage = table.storage
        back = tf.range(k, dtype=tf.int64)
        first = tf.gather(storage["first"], (rows[:, None] - back[None, :]) % capacity)
        first = tf.concat([first[:, :-1], tf.ones_like(first[:, :1])], axis=1)
        # First episode start looking back (int64 throughout: int32 stays in host memory on GPU).
        dist = tf.reduce_min(tf.where(first, back[None, :], k), axis=1)  # [B] <= k-1
        cursor = table.cursor.read_value()
        oldest = (cursor - table.size_var.read_value()) % capacity
        age = (rows - oldest) % capacity
        ahead = (cursor - 1 - rows) % capacity
        nxt = (rows + 1) % capacity
        valid = (
            tf.logical_not(tf.gather(storage["final"], rows))
            & (ahead >= 1)
            & tf.logical_not(tf.gather(storage["first"], nxt))
            & (dist <= age)
        )
        return dist, valid

    def sample_indices(self, batch_size: int) -> tuple[tf.Tensor, tf.Tensor]:
        """``(rows [B] int64, distance to episode start [B] int64 capped at k-1)``."""
        check_not_empty(self.table)
        size = tf.maximum(self.table.size_var.read_value(), 1)
        rows = self.generator.uniform([batch_size], 0, size, dtype=tf.int64)

        def body(tries: tf.Tensor, r: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            fresh = self.generator.uniform([batch_size], 0, size, dtype=tf.int64)
            return tries + 1, tf.where(self._history(r)[1], r, fresh)

        _, rows = tf.while_loop(
            lambda tries, r: tf.logical_and(
                tries < self.max_tries, tf.logical_not(tf.reduce_all(self._history(r)[1]))
            ),
            body,
            (tf.constant(0, tf.int64), rows),
            parallel_iterations=1,
        )
        dist, valid = self._history(rows)
        self.invalid_draws.assign_add(tf.reduce_sum(tf.cast(tf.logical_not(valid), tf.int64)))
        return rows, dist

    def sample(self, batch_size: int) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """``(rows [B] int64, {"obs", "next_obs": [B, k, H, W], "action", "reward", ...})``."""
        rows, dist = self.sample_indices(batch_size)
        if self.n_step > 1:
            return rows, self._n_step_batch(rows, dist)
        k, capacity = self.stack, self.table.capacity
        # Offsets back from the row, oldest first: k-1, ..., 0, then -1 (the next frame).
        offsets = tf.range(k - 1, -2, -1, dtype=tf.int64)
        source = tf.minimum(offsets[None, :], dist[:, None])
        frames = self.table.read("frame", (rows[:, None] - source) % capacity)  # [B, k+1, ...]
        batch = {
            "obs": frames[:, :k],
            "next_obs": frames[:, 1:],
        }
        for name in ("action", "reward", "terminated", "truncated"):
            batch[name] = self.table.read(name, rows)  # spec dtype if stored narrower
        return rows, batch

    def _n_step_batch(self, rows: tf.Tensor, dist: tf.Tensor) -> dict[str, tf.Tensor]:
        """The n-step transitions of drawable ``rows`` (distance ``dist`` to episode start)."""
        table, k, n, capacity = self.table, self.stack, self.n_step, self.table.capacity
        storage = table.storage
        steps = tf.range(n, dtype=tf.int64)
        step_rows = (rows[:, None] + steps[None, :]) % capacity  # [B, n]: step j's row
        terminated = tf.gather(storage["terminated"], step_rows)
        truncated = tf.gather(storage["truncated"], step_rows)
        # Step j + 1 is taken after step j unless step j ends the episode, it is the n-th, the
        # frame after step j + 1 is not written yet, or that frame starts another episode.
        ahead = (table.cursor.read_value() - 1 - rows) % capacity  # [B] rows written after
        next_first = tf.gather(storage["first"], (step_rows + 2) % capacity)
        stop = (
            terminated
            | truncated
            | (steps[None, :] >= n - 1)
            | (steps[None, :] + 2 > ahead[:, None])
            | next_first
        )
        last = tf.reduce_min(tf.where(stop, steps[None, :], n), axis=1)  # [B] step m - 1
        m = last + 1
        powers = tf.constant([self.gamma**j for j in range(n)], tf.float32)
        rewards = tf.cast(table.read("reward", step_rows), tf.float32)
        used = steps[None, :] <= last[:, None]
        ret = tf.reduce_sum(tf.where(used, rewards * powers, tf.zeros_like(rewards)), axis=1)
        last_terminated = tf.gather(terminated, last, batch_dims=1)
        # Both stacks in one read: k frames back from the row, then k back from row + m (the
        # episode start is m rows further back from there).
        back = tf.range(k - 1, -1, -1, dtype=tf.int64)  # oldest first
        obs_rows = rows[:, None] - tf.minimum(back[None, :], dist[:, None])
        next_rows = (rows + m)[:, None] - tf.minimum(back[None, :], (dist + m)[:, None])
        frames = table.read("frame", tf.concat([obs_rows, next_rows], axis=1) % capacity)
        gamma_m = tf.pow(tf.constant(self.gamma, tf.float32), tf.cast(m, tf.float32))
        return {
            "obs": frames[:, :k],
            "next_obs": frames[:, k:],
            "action": table.read("action", rows),
            "reward": tf.cast(ret, table.spec["reward"].dtype),
            "terminated": last_terminated,
            "truncated": tf.gather(truncated, last, batch_dims=1),
            DISCOUNT: gamma_m * (1.0 - tf.cast(last_terminated, tf.float32)),
            NSTEP: m,
        }
