"""N-step returns computed at sample time from consecutive rows of a table, in the graph.

For a drawn row ``i`` the sampler reads rows ``i, i+1, ..., i+n-1`` (mod capacity) and stops at
the first row ``i+k`` that ends the episode (``terminated`` or ``truncated``), that is the newest
row of the table, or that is the last of the ``n``. The batch it returns is the drawn row's
``obs`` and ``action`` (and every other field of row ``i``) with:

- ``reward``: ``sum_{j<=k} gamma**j * r_{i+j}``;
- ``next_obs``, ``terminated``, ``truncated``: those of row ``i+k``;
- ``discount`` ([B] float32): ``gamma**(k+1) * (1 - terminated_{i+k})``, the multiplier of the
  bootstrap value ``Q(next_obs)``: a terminated episode does not bootstrap, a truncated one
  (and a window cut short by the newest row) does;
- ``nstep`` ([B] int64): ``k + 1``, the number of rewards summed.

Layout assumption: each environment's transitions are appended in time order into consecutive
rows, i.e. one table per actor stream, or one actor appending whole episode chunks. When
several actors append interleaved batches into one table, row ``i+1`` may belong to another
environment; give the table an integer stream-id field (e.g. the actor id) and pass its name as
``stream_field``: accumulation then also stops before the first row of another stream and
bootstraps from the last row of the same stream (a shorter, still correct, return).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np
import tensorflow as tf

from replaygpu.errors import ConfigError
from replaygpu.keys import DISCOUNT, NSTEP
from replaygpu.nest import leaves_under
from replaygpu.samplers.base import Sampler
from replaygpu.samplers.uniform import UniformSampler
from replaygpu.storage import ReplayTable

_REQUIRED = ("reward", "next_obs", "terminated", "truncated")


class NStepSampler(Sampler):
    """Wraps a sampler (uniform or prioritized) and turns its rows into n-step transitions.

    Args:
        base: the sampler that draws the first rows, or a table (then a `UniformSampler`
            with ``seed`` is made).
        n: number of steps, >= 1 (1 gives the ordinary transitions plus ``discount``).
        gamma: discount factor in ``[0, 1]``.
        seed: seed of the `UniformSampler` made when ``base`` is a table.
        stream_field: optional integer field naming the stream (actor) of each row.

    The base sampler's abilities are the wrapper's: ``keeps_priorities``, ``update_priorities``
    and ``loop_scope`` are forwarded to it, so prioritized n-step replay gets its priorities
    in the learner loop and syncs new rows once per ``Learner.train`` call, not in every step.
    """

    def __init__(
        self,
        base: Sampler | ReplayTable,
        n: int = 3,
        gamma: float = 0.99,
        seed: int | None = None,
        stream_field: str | None = None,
    ) -> None:
        super().__init__(name="nstep_sampler")
        if isinstance(base, ReplayTable):
            base = UniformSampler(base, seed=seed)
        if not isinstance(base, Sampler):
            raise ConfigError(
                f"base: got {type(base).__name__}, expected a ReplayTable or an rg.Sampler "
                "(UniformSampler, PrioritizedSampler); pass the table or a sampler made on it"
            )
        table = base.table
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ConfigError(f"n: got {n!r}, expected an integer >= 1")
        if not (math.isfinite(gamma) and 0.0 <= gamma <= 1.0):
            raise ConfigError(f"gamma: got {gamma}, expected a number in [0, 1]")
        # next_obs may be a nest (a Dict observation); the others are scalar leaves
        missing = [f for f in _REQUIRED if f not in table.spec]
        if "next_obs" in missing and leaves_under(table.spec, "next_obs"):
            missing.remove("next_obs")
        if stream_field is not None and stream_field not in table.spec:
            missing.append(stream_field)
        if missing:
            raise ConfigError(
                f"table '{table.name}' lacks field(s) {missing} that n-step returns need; it has "
                f"{sorted(table.spec)} (build the spec with replaygpu.specs_from_env)"
            )
        clash = sorted({DISCOUNT, NSTEP} & set(table.spec))
        if clash:
            raise ConfigError(
                f"table '{table.name}' has field(s) {clash}, keys this sampler adds to each "
                "batch; rename them"
            )
        self.base = base
        self.table = table
        self.n = int(n)
        self.gamma = float(gamma)
        self.stream_field = stream_field

    def sample(self, batch_size: int) -> tuple[tf.Tensor, Any]:
        """``(indices [B] int64, batch)`` with n-step ``reward``/``next_obs``/``discount``.

        With a nested spec the batch is in the table's structure (a nested ``next_obs`` is
        replaced leaf by leaf), ``discount`` and ``nstep`` beside its top-level keys (see
        `replaygpu.nest.pack_batch`).
        """
        indices, batch = self.base.sample(batch_size)
        return indices, self.table.pack(self.accumulate(indices, self.table.unpack(batch)))

    def accumulate(self, indices: tf.Tensor, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Replace the one-step fields of the flat ``batch`` (rows ``indices``, keyed by leaf
        path) by n-step ones."""
        table = self.table
        storage = table.storage
        capacity = table.capacity
        offsets = tf.range(self.n, dtype=tf.int64)
        rows = (indices[:, None] + offsets[None, :]) % capacity  # [B, n]
        # Rows after i that exist: the newest row is cursor - 1.
        ahead = (table.cursor.read_value() - 1 - indices) % capacity  # [B]
        terminated = tf.gather(storage["terminated"], rows)
        truncated = tf.gather(storage["truncated"], rows)
        stop = terminated | truncated | (offsets[None, :] >= ahead[:, None])
        stop = stop | (offsets[None, :] == self.n - 1)
        if self.stream_field is not None:
            stream = tf.gather(storage[self.stream_field], rows)
            other_next = tf.concat(
                [stream[:, 1:] != stream[:, :1], tf.zeros_like(stream[:, :1], tf.bool)], axis=1
            )
            stop = stop | other_next
        # k = first stop offset; rows after it are masked out.
        last = tf.reduce_min(tf.where(stop, offsets[None, :], self.n), axis=1)  # [B] int64
        used = offsets[None, :] <= last[:, None]
        powers = tf.constant([self.gamma**j for j in range(self.n)], tf.float32)
        rewards = tf.cast(table.read("reward", rows), tf.float32)
        ret = tf.reduce_sum(tf.where(used, rewards * powers, tf.zeros_like(rewards)), axis=1)
        last_row = tf.gather(rows, last, batch_dims=1)
        last_terminated = tf.gather(terminated, last, batch_dims=1)
        out = dict(batch)
        out["reward"] = tf.cast(ret, table.spec["reward"].dtype)
        for path in leaves_under(table.spec, "next_obs"):  # one leaf, or a nested obs' leaves
            out[path] = table.read(path, last_row)  # spec dtype if stored narrower
        out["terminated"] = last_terminated
        out["truncated"] = tf.gather(truncated, last, batch_dims=1)
        gamma_k = tf.pow(tf.constant(self.gamma, tf.float32), tf.cast(last + 1, tf.float32))
        out[DISCOUNT] = gamma_k * (1.0 - tf.cast(last_terminated, tf.float32))
        out[NSTEP] = last + 1
        return out

    @property
    def keeps_priorities(self) -> bool:
        """The base sampler's: True when it is a `PrioritizedSampler`."""
        return self.base.keeps_priorities

    def loop_scope(self) -> contextlib.AbstractContextManager[None]:
        """The base sampler's scope (a prioritized one syncs new rows there, once per call)."""
        return self.base.loop_scope()

    def update_priorities(self, indices: tf.Tensor, priorities: tf.Tensor) -> None:
        """Forward to the base sampler (rows ``indices`` are the base's draws).

        Raises:
            ConfigError: when the base sampler keeps no priorities.
        """
        self.base.update_priorities(indices, priorities)
