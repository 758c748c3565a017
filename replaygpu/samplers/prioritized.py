"""Proportional prioritized replay (Schaul et al., 2016): the `Prioritized` distribution.

``P(i) = p_i / sum_j p_j`` with ``p_i = (|d_i| + eps)**alpha``, ``d_i`` the last priority
``update_fn`` returned (new rows get the largest ``p`` so far). Stratified: one uniform target in
each of B equal segments of the total, located by a `SumTree` descent.

Importance weights ``(N * P(i))**-beta / max_j (N * P(j))**-beta``, max over all rows holding a
priority, reduce to ``(p_i / p_min)**-beta`` (``p_min``: the min tree's root), in ``(0, 1]``.

Rows a view can never draw (``view.settled_invalid``) get priority 0; rows it cannot draw *yet*
are redrawn by the sampler.

New rows need no hook in the table: ``synced`` is the table's ``inserted`` at the last look, and
rows appended since get the max priority, in fixed-size chunks (static shapes under XLA); the
``view.lookahead`` rows before them are looked at again, as new rows may settle them. The learner
syncs once per ``Learner.train`` call (`Sampler.loop_scope`); a row appended during a call keeps
its slot's old priority (0 if never filled) until the next.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from replaygpu.errors import ConfigError, check_int
from replaygpu.samplers.distribution import Distribution, Index, make_generator
from replaygpu.samplers.sum_tree import SumTree
from replaygpu.table import ReplayTable

if TYPE_CHECKING:
    from replaygpu.samplers.view import View

logger = logging.getLogger(__name__)

BetaSchedule = Callable[[tf.Tensor], tf.Tensor]

_TINY = np.finfo(np.float64).tiny

#: the name of the loop taking in new rows, once per `Learner.train` call: its length is the
#: rows appended since the last call, known only at run time
SYNC_LOOP = "priority_sync"


@dataclasses.dataclass(frozen=True)
class LinearSchedule:
    """``start`` -> ``end`` linearly over ``steps`` sampler steps (int64), then flat (float64)."""

    start: float = 0.4
    end: float = 1.0
    steps: int = 100_000

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start) and math.isfinite(self.end)):
            raise ConfigError(
                f"LinearSchedule: got start={self.start}, end={self.end}; expected finite numbers"
            )
        if not isinstance(self.steps, (int, np.integer)) or self.steps < 1:
            raise ConfigError(f"LinearSchedule.steps: got {self.steps!r}, expected an int >= 1")

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        frac = tf.minimum(tf.cast(step, tf.float64) / float(self.steps), 1.0)
        return self.start + frac * (self.end - self.start)


@dataclasses.dataclass(frozen=True)
class Prioritized(Distribution):
    """Rows drawn in proportion to their priority; ``update_priorities`` sets new ones.

    Args:
        alpha: priority exponent (0 is uniform).
        beta: importance-weight exponent: a float, or ``f(minibatches drawn) -> float tensor``
            (e.g. `LinearSchedule`); the count is checkpointed.
        epsilon: added to ``|priority|`` so no row gets probability zero.
        sync_chunk: rows taken in per chunk when new rows are found.
        tree_fanout: `SumTree` children per node (8: 7 levels for 1e6 rows, least CPU work).
        xla: compile the draw and the priority write as XLA clusters even in an uncompiled
            loop: about 200 small ops a step become two launches (measured 2.4x faster per
            step at 1e4 rows, 1.5x at 1e6 on CPU, `benchmarks/README.md`). False: plain ops
            (a device without XLA). The two draw different numbers from one seed: resume a
            checkpoint with its setting to repeat its minibatches.

    Batches hold ``"importance_weights"`` ([B] float32). Non-finite priorities from the learner
    loop become the max priority so far (this batch included) and are counted in
    ``nonfinite_priorities``, so one NaN loss cannot poison the tree; eagerly they are refused.
    """

    alpha: float = 0.6
    beta: float | BetaSchedule = 0.4
    epsilon: float = 1e-6
    sync_chunk: int = 4096
    tree_fanout: int = 8
    xla: bool = True

    keeps_priorities = True

    def __post_init__(self) -> None:
        alpha, beta, epsilon = self.alpha, self.beta, self.epsilon
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
            raise ConfigError(f"alpha: got {alpha}, expected a finite number >= 0 (0.6 is usual)")
        if not callable(beta) and not (isinstance(beta, (int, float)) and math.isfinite(beta)):
            raise ConfigError(f"beta: got {beta!r}, expected a float or a schedule f(step)")
        if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
            raise ConfigError(f"epsilon: got {epsilon}, expected > 0")
        check_int("sync_chunk", self.sync_chunk, 1)
        object.__setattr__(self, "alpha", float(alpha))
        object.__setattr__(self, "epsilon", float(epsilon))
        object.__setattr__(self, "xla", bool(self.xla))

    def build(self, table: ReplayTable, seed: int | None, num_shards: int) -> PrioritizedIndex:
        return PrioritizedIndex(table, self, seed, num_shards)


class PrioritizedIndex(Index):
    """One shard's sum tree, random stream and priority counters (see the module doc).

    Attributes:
        tree: the `SumTree` of the shard's rows.
        max_leaf: the largest stored priority so far (float64), given to new rows.
        synced: the shard's ``inserted`` counter at the last sync.
        sample_count: minibatches drawn (the beta schedule's step).
        nonfinite_priorities: non-finite priorities replaced inside the learner loop.
    """

    keeps_priorities = True

    def __init__(
        self, table: ReplayTable, config: Prioritized, seed: int | None, num_shards: int
    ) -> None:
        super().__init__(name="prioritized_index")
        self.table = table
        self.alpha = config.alpha
        self.beta = config.beta
        self.epsilon = config.epsilon
        self.sync_chunk = int(min(config.sync_chunk, table.capacity))
        self.num_shards = int(num_shards)
        self.tree = SumTree(table.capacity, table.device, fanout=config.tree_fanout)
        self.generator = make_generator(seed, table.device)
        with tf.device(table.device):
            self.max_leaf = tf.Variable(1.0, dtype=tf.float64, trainable=False, name="max_leaf")
            self.synced = tf.Variable(0, dtype=tf.int64, trainable=False, name="synced")
            self.sample_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="samples")
            self.nonfinite_priorities = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="nonfinite_priorities"
            )

    def current_beta(self) -> tf.Tensor:
        """Beta for the next minibatch (float64 scalar)."""
        if callable(self.beta):
            return tf.cast(self.beta(self.sample_count.read_value()), tf.float64)
        return tf.constant(float(self.beta), tf.float64)

    def draw(self, batch_size: int, stratified: bool = True) -> tuple[tf.Tensor, tf.Tensor]:
        """``(rows [B] int64, p_i / p_min [B] float64)``, rows in proportion to priority."""
        root = self.tree.root()  # one read of (total, min), ordered before later updates
        total, min_leaf = root[0], root[1]
        u = self.generator.uniform([batch_size], dtype=tf.float64)
        if stratified:
            targets = (tf.range(batch_size, dtype=tf.float64) + u) * (total / batch_size)
        else:
            targets = u * total
        indices, leaf = self.tree.find(targets)
        return indices, leaf / min_leaf

    def weigh(self, odds: tf.Tensor | None) -> tf.Tensor:
        """``(p_i / p_min)**-beta`` as [B] float32; counts the minibatch."""
        weights = tf.pow(odds, -self.current_beta())
        self.sample_count.assign_add(1)
        return tf.cast(weights, tf.float32)

    def across_shards(self, weights: tf.Tensor) -> tf.Tensor:
        """Renormalise ``(p_i / p_min_s)**-beta`` over all shards: row ``i`` of shard ``s`` is
        drawn with ``p_i / (R * T_s)``, so the weight is ``((p_i / T_s) / m)**-beta`` with
        ``m = min_s (p_min_s / T_s)`` (one all-reduce of a ``[shards]`` vector)."""
        if self.num_shards == 1:
            return weights
        beta = self.current_beta()
        root = self.tree.root()
        local_min = root[1] / tf.maximum(root[0], _TINY)
        ctx = tf.distribute.get_replica_context()
        # a fixed-shape all-gather as a sum (all_gather reads the shapes on the host first)
        mine = tf.one_hot(ctx.replica_id_in_sync_group, self.num_shards, dtype=tf.float64)
        all_min = ctx.all_reduce(tf.distribute.ReduceOp.SUM, mine * local_min)
        factor = tf.pow(local_min / tf.reduce_min(all_min), -beta)
        return weights * tf.cast(factor, weights.dtype)

    def sync(self, view: View) -> None:
        """Take in new rows at the max priority (0 if ``view`` never draws them), and zero
        earlier rows the new ones settle as undrawable."""
        capacity = self.table.capacity
        inserted = self.table.inserted_var.read_value()
        start = tf.maximum(self.synced.read_value(), inserted - capacity)
        lookahead = min(int(view.lookahead), capacity - 1)
        first = tf.maximum(start - lookahead, tf.maximum(inserted - capacity, 0))
        chunk = self.sync_chunk

        def body(pos: tf.Tensor) -> tf.Tensor:
            positions = pos + tf.range(chunk, dtype=tf.int64)
            positions = tf.where(positions < inserted, positions, pos)  # pad with a valid row
            rows = positions % capacity
            leaf = tf.fill([chunk], self.max_leaf.read_value())
            if lookahead:
                leaf = tf.where(positions >= start, leaf, self.tree.get(rows))
            dead = view.settled_invalid(self.table, rows)
            if dead is not None:
                leaf = tf.where(dead, tf.zeros_like(leaf), leaf)
            self.tree.set(rows, leaf)
            return pos + chunk

        tf.while_loop(
            lambda pos: pos < inserted, body, [first], parallel_iterations=1, name=SYNC_LOOP
        )
        self.synced.assign(inserted)

    def write(self, indices: tf.Tensor, priorities: tf.Tensor) -> None:
        """Store ``(|priority| + epsilon)**alpha`` for rows ``indices``; a non-finite priority
        gets the max priority and is counted in ``nonfinite_priorities``."""
        priorities = tf.reshape(tf.cast(priorities, tf.float64), [-1])
        indices = tf.reshape(tf.cast(indices, tf.int64), [-1])
        finite = tf.math.is_finite(priorities)
        self.nonfinite_priorities.assign_add(
            tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int64))
        )
        leaf = tf.pow(tf.abs(tf.where(finite, priorities, 0.0)) + self.epsilon, self.alpha)
        # A filled row never reads as empty, and the total of all rows stays finite.
        leaf = tf.clip_by_value(leaf, _TINY, np.finfo(np.float64).max / self.table.capacity)
        max_leaf = tf.maximum(self.max_leaf.read_value(), tf.reduce_max(leaf))
        self.max_leaf.assign(max_leaf)
        self.tree.set(indices, tf.where(finite, leaf, max_leaf))
