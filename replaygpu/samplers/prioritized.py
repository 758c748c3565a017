"""Proportional prioritized replay (Schaul et al., 2016) over a `ReplayTable`, in the graph.

Row ``i`` is drawn with probability ``P(i) = p_i / sum_j p_j`` where ``p_i = (|d_i| + eps)**alpha``
and ``d_i`` is the last priority that ``update_fn`` returned for it (new rows get the largest
``p`` seen so far). The minibatch is stratified: the total is cut into B equal segments and one
target is drawn uniformly in each, then located by a descent of the `SumTree`.

Importance weights are ``w_i = (N * P(i))**-beta / max_j (N * P(j))**-beta`` with the max over
*all filled rows* (the standard normalisation), which reduces to ``(p_i / p_min)**-beta``;
``p_min`` is the root of the min tree kept beside the sum tree, so weights lie in ``(0, 1]``.

New rows are found without any hook in the table: the sampler keeps ``synced``, the table's
``inserted`` counter when it last looked. At each sample it gives the rows appended since (the
last ``min(inserted - synced, capacity)`` ring positions before the cursor) the max priority, in
fixed-size chunks so the graph keeps static shapes under XLA. The learner syncs once per
``Learner.train`` call, before its loop (`PrioritizedSampler.loop_scope`): the loop's steps then
skip it. A row appended while a call runs is synced at the next call; until then its slot keeps
its old priority (0, never drawn, for a slot not filled before).

The draw (descent, weights) and the priority write are XLA clusters by default (``xla=True``):
in a loop that is not compiled they run as two fused launches instead of about 200 small ops,
which on CPU is where the time went (each TensorFlow op costs about a microsecond whatever its
size). Eager ``update_priorities`` calls, which come in every size, use plain ops, so they do not
compile a cluster per size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from replaygpu.errors import ConfigError
from replaygpu.keys import IMPORTANCE_WEIGHTS
from replaygpu.samplers.base import Sampler, check_not_empty
from replaygpu.samplers.sum_tree import SumTree
from replaygpu.samplers.uniform import make_generator
from replaygpu.storage import ReplayTable

logger = logging.getLogger(__name__)


BetaSchedule = Callable[[tf.Tensor], tf.Tensor]

_TINY = np.finfo(np.float64).tiny


@dataclasses.dataclass(frozen=True)
class LinearSchedule:
    """``start`` -> ``end`` linearly over ``steps`` sampler steps, then ``end``.

    Called with the sampler's step count (int64 tensor), it returns a float64 scalar tensor.
    """

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


class PrioritizedSampler(Sampler):
    """Draws rows in proportion to their priority; ``update_priorities`` sets new ones.

    Args:
        table: the table to sample from.
        alpha: priority exponent (0 is uniform).
        beta: importance-weight exponent: a float, or a schedule ``f(step) -> float tensor``
            called with the number of minibatches this sampler drew so far (e.g.
            `LinearSchedule`); the count is a variable, so checkpoints restore it.
        seed: seed of the random stream; None for a nondeterministic one.
        epsilon: added to ``|priority|`` so no row gets probability zero.
        sync_chunk: rows given the max priority per chunk when new rows are found.
        tree_fanout: children per node of the `SumTree` (8: 7 levels for 1e6 rows, the least
            work per sample on CPU; see `SumTree`).
        xla: compile the draw (descent and weights) and the priority write as XLA clusters even
            when the surrounding loop is not compiled: about 200 small ops a step become two
            fused launches (measured 2.4x faster per step at 1e4 rows and 1.5x at 1e6 on CPU,
            `benchmarks/README.md`). Inside a loop compiled with ``jit_compile=True`` they are
            simply part of it. False keeps plain TensorFlow ops (for a device without an XLA
            backend). Fixed at construction (graphs read it when traced). The two paths draw
            different, equally valid, numbers from the same seed: resume a checkpoint with the
            setting it was saved with to repeat its minibatches.

    The batch from ``sample`` holds the table's fields plus ``"importance_weights"`` ([B]
    float32). Non-finite priorities passed to ``update_priorities`` are replaced by the max
    priority seen so far, this batch included, and counted in ``nonfinite_priorities``, so that
    one NaN loss cannot poison the tree.
    """

    def __init__(
        self,
        table: ReplayTable,
        alpha: float = 0.6,
        beta: float | BetaSchedule = 0.4,
        seed: int | None = None,
        epsilon: float = 1e-6,
        sync_chunk: int = 4096,
        tree_fanout: int = 8,
        xla: bool = True,
    ) -> None:
        super().__init__(name="prioritized_sampler")
        if not (math.isfinite(alpha) and alpha >= 0):
            raise ConfigError(f"alpha: got {alpha}, expected a finite number >= 0 (0.6 is usual)")
        if not callable(beta) and not (isinstance(beta, (int, float)) and math.isfinite(beta)):
            raise ConfigError(f"beta: got {beta!r}, expected a float or a schedule f(step)")
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ConfigError(f"epsilon: got {epsilon}, expected > 0")
        if not isinstance(sync_chunk, (int, np.integer)) or sync_chunk < 1:
            raise ConfigError(f"sync_chunk: got {sync_chunk!r}, expected an integer >= 1")
        if IMPORTANCE_WEIGHTS in table.spec:
            raise ConfigError(
                f"table '{table.name}' has a field '{IMPORTANCE_WEIGHTS}', the key this sampler "
                "adds to each batch; rename the field"
            )
        self.table = table
        self.alpha = float(alpha)
        self.beta = beta
        self.epsilon = float(epsilon)
        self.sync_chunk = int(min(sync_chunk, table.capacity))
        self.tree = SumTree(table.capacity, table.device, fanout=tree_fanout)
        self.generator = make_generator(seed, table.device)
        with tf.device(table.device):
            self.max_leaf = tf.Variable(1.0, dtype=tf.float64, trainable=False, name="max_leaf")
            self.synced = tf.Variable(0, dtype=tf.int64, trainable=False, name="synced")
            self.sample_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="samples")
            self.nonfinite_priorities = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="nonfinite_priorities"
            )
        self._in_loop = False  # trace-time flag set by loop_scope
        self.xla = bool(xla)
        self._draw_xla = tf.function(self._draw, jit_compile=True)
        self._write_xla = tf.function(self._write, jit_compile=True, reduce_retracing=True)
        # One tf.function, retraced per batch size (a Python argument); a dict of functions
        # keyed by int would be tracked by tf.Module and break checkpointing.
        self._sample_fn = tf.function(self._sample_indices)
        self._sync_fn = tf.function(self.sync)
        self._update_fn = tf.function(self._synced_update, reduce_retracing=True)

    @property
    def keeps_priorities(self) -> bool:
        """True: ``update_priorities`` stores the priorities that ``update_fn`` returns."""
        return True

    def current_beta(self) -> tf.Tensor:
        """Beta for the next minibatch (float64 scalar)."""
        if callable(self.beta):
            return tf.cast(self.beta(self.sample_count.read_value()), tf.float64)
        return tf.constant(float(self.beta), tf.float64)

    def sync(self) -> None:
        """Give the rows appended since the last call the max priority seen so far."""
        capacity = self.table.capacity
        inserted = self.table.inserted_var.read_value()
        start = tf.maximum(self.synced.read_value(), inserted - capacity)
        chunk = self.sync_chunk

        def body(pos: tf.Tensor) -> tf.Tensor:
            positions = pos + tf.range(chunk, dtype=tf.int64)
            positions = tf.where(positions < inserted, positions, pos)  # pad with a valid row
            leaf = tf.fill([chunk], self.max_leaf.read_value())
            self.tree.set(positions % capacity, leaf)
            return pos + chunk

        tf.while_loop(lambda pos: pos < inserted, body, [start], parallel_iterations=1)
        self.synced.assign(inserted)

    @contextlib.contextmanager
    def loop_scope(self) -> Iterator[None]:
        """Trace-time scope for a fused loop: sync new rows once here, not in every step.

        `Learner` wraps its ``tf.while_loop`` in it. Inside, ``sample`` skips its own sync, which
        would otherwise put a (nested) loop over new rows into every step.
        """
        self.sync()
        self._in_loop = True
        try:
            yield
        finally:
            self._in_loop = False

    def sample_indices(self, batch_size: int) -> tuple[tf.Tensor, tf.Tensor]:
        """``(indices [B] int64, importance_weights [B] float32)``, usable inside graphs."""
        if tf.inside_function():
            return self._sample_indices(batch_size)
        check_not_empty(self.table)
        with tf.device(self.table.device):
            return self._sample_fn(batch_size)

    def _sample_indices(self, batch_size: int) -> tuple[tf.Tensor, tf.Tensor]:
        if not self._in_loop:
            self.sync()  # plain ops: a loop of data-dependent length, once per call
        return self._draw_xla(batch_size) if self.xla else self._draw(batch_size)

    def _draw(self, batch_size: int) -> tuple[tf.Tensor, tf.Tensor]:
        beta = self.current_beta()
        root = self.tree.root()  # one read of (total, min), ordered before later updates
        total, min_leaf = root[0], root[1]
        strata = tf.range(batch_size, dtype=tf.float64)
        u = self.generator.uniform([batch_size], dtype=tf.float64)
        targets = (strata + u) * (total / batch_size)
        indices, leaf = self.tree.find(targets)
        weights = tf.pow(leaf / min_leaf, -beta)
        self.sample_count.assign_add(1)
        return indices, tf.cast(weights, tf.float32)

    def sample(self, batch_size: int) -> tuple[tf.Tensor, Any]:
        """``(indices [B] int64, {field: [B, ...], "importance_weights": [B] float32})``.

        With a nested spec the fields come in the table's structure, ``importance_weights``
        beside its top-level keys (see `replaygpu.nest.pack_batch`).

        Raises:
            EmptyTableError: when called eagerly on an empty table.
        """
        indices, weights = self.sample_indices(batch_size)
        batch = self.table.gather(indices)
        batch[IMPORTANCE_WEIGHTS] = weights
        return indices, self.table.pack(batch)

    def update_priorities(self, indices: tf.Tensor, priorities: tf.Tensor) -> None:
        """Set the priorities of rows ``indices`` ([B] int64) to ``priorities`` ([B] float).

        The stored value is ``(|priority| + epsilon) ** alpha``. Usable inside graphs (the
        learner calls it in the same loop step as the SGD step, after ``sample``). Called
        eagerly it first gives new rows the max priority, so they do not overwrite this update
        at the next sample; inside a graph it does not (a second sync in the loop step makes
        XLA copy the tree), so there call it after ``sample``, as the learner does.
        """
        if not tf.inside_function():
            with tf.device(self.table.device):
                self._update_fn(indices, priorities)
            return
        if self.xla:
            self._write_xla(indices, priorities)
        else:
            self._write(indices, priorities)

    def _synced_update(self, indices: tf.Tensor, priorities: tf.Tensor) -> None:
        # Eager calls come in all sizes (an XLA cluster would compile once per size): plain ops.
        self.sync()
        self._write(indices, priorities)

    def _write(self, indices: tf.Tensor, priorities: tf.Tensor) -> None:
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

    def probabilities(self) -> np.ndarray:
        """Sampling probability of every row, ``[capacity]`` float64 (eager helper)."""
        with tf.device(self.table.device):
            self._sync_fn()
        leaves = self.tree.leaves().numpy()
        total = leaves.sum()
        return leaves / total if total > 0 else leaves
