"""A K-ary sum tree (with a min tree beside it) over row priorities, in row-shaped variables.

Layout: with fanout ``K`` and depth ``D`` (the smallest ``D >= 1`` with ``K**D >= capacity``),
level ``D`` holds the ``capacity`` leaves and level ``d < D`` the ``n_d = ceil(n_{d+1} / K)``
nodes above them (``n_0 = 1``, the root). Level ``d`` is a float64 variable of shape
``[n_{d-1}, K]``: row ``j`` holds the ``K`` children of node ``j`` of level ``d - 1`` (the last
row padded with empty nodes), so one row gather fetches all the children of a node as one
contiguous slice and no level is larger than it needs to be. ``sums[d-1]`` holds the
sums; the leaves (level ``D``, row ``i`` of the table is leaf ``i``) are ``sums[D-1]``, where 0
means empty. ``mins[d-1]`` (levels ``1 .. D-1``) holds the smallest positive leaf under each node
(``+inf`` when none); a leaf's own minimum is itself when positive, so leaves are stored once.

Sampling descends ``D`` levels, each one ``[B, K]`` row gather, a prefix sum and a count: O(B K
log_K N) work in vectorized ops, every one with a GPU kernel, XLA-compilable. Why rows and a
small fanout (8): on CPU the cost of a level is its elements, not its op count; gathering ``B``
contiguous rows is far cheaper than ``B * K`` scattered elements, and ``K = 8`` (7 levels for
1e6 rows) did less work per sample than 16 or 32 (measured in ``benchmarks/README.md``).

Updates write the leaves with one element scatter, then recompute every touched parent from
its children as already written below (one row gather and one element scatter per level). The
top levels, whose children number at most ``dense_children``, are recomputed whole instead:
one dense reduction of a few thousand values is cheaper than a gather and a scatter.

Why there is no drift and no periodic rebuild: an update never adds a delta to the ancestors.
Every stored parent equals the (deterministically ordered) float64 sum of its stored children,
whatever the history of updates; duplicate indices in one update are harmless for the same
reason (each duplicate parent writes the same value). Why a variable per level: a scatter
never writes the buffer its own update was gathered from, so XLA keeps scatters in place
instead of copying the tree every step.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from replaygpu.errors import check_int


class SumTree(tf.Module):
    """Sums and positive minima of ``capacity`` non-negative float64 leaves, in device variables.

    Args:
        capacity: number of leaves (rows of the table), >= 1.
        device: where the variables live (the table's device).
        fanout: children per node K >= 2.
        dense_children: levels whose children number at most this are recomputed whole on
            every update (0: always node by node).

    Attributes:
        sums: ``sums[d-1]`` is level ``d``'s ``[n_{d-1}, K]`` float64 node sums; the last one
            holds the leaves (0 = empty).
        mins: ``mins[d-1]`` is level ``d``'s smallest positive leaf per node (``+inf`` when
            none), for ``d < depth``.
        depth: number of levels below the root (D >= 1).
    """

    def __init__(
        self,
        capacity: int,
        device: str = "/CPU:0",
        fanout: int = 8,
        dense_children: int = 4096,
        name: str = "sum_tree",
    ) -> None:
        super().__init__(name=name)
        self.capacity = check_int("capacity", capacity, 1)
        self.fanout = k = check_int("fanout", fanout, 2)
        dense_children = check_int("dense_children", dense_children, 0)
        depth = 1
        while k**depth < self.capacity:
            depth += 1
        self.depth = depth
        nodes = [self.capacity]  # nodes of level D, D - 1, ..., 0 (the root)
        while len(nodes) <= depth:
            nodes.append(-(-nodes[-1] // k))
        # rows[d - 1]: rows of level d's variable, one per node of level d - 1.
        self.rows = tuple(nodes[:0:-1])
        # Levels 1 .. dense_top (whose children number <= dense_children) are recomputed whole.
        self.dense_top = max(
            (d for d in range(1, depth) if nodes[depth - d - 1] <= dense_children), default=0
        )
        with tf.device(device):
            self.sums = [
                tf.Variable(tf.zeros([rows, k], tf.float64), trainable=False, name=f"sums_{d}")
                for d, rows in enumerate(self.rows, start=1)
            ]
            self.mins = [
                tf.Variable(
                    tf.fill([rows, k], tf.constant(np.inf, tf.float64)),
                    trainable=False,
                    name=f"mins_{d}",
                )
                for d, rows in enumerate(self.rows[:-1], start=1)
            ]

    @property
    def leaf_rows(self) -> tf.Variable:
        """The leaves, ``[ceil(capacity / K), K]`` float64 (leaf ``i`` is ``[i // K, i % K]``)."""
        return self.sums[-1]

    def root(self) -> tf.Tensor:
        """``[2]`` float64: (sum of all leaves, smallest positive leaf or ``+inf`` when none)."""
        top = self.sums[0].read_value()[0]
        if self.depth == 1:
            low = tf.reduce_min(_positive_or_inf(top))
        else:
            low = tf.reduce_min(self.mins[0].read_value()[0])
        return tf.stack([tf.reduce_sum(top), low])

    def total(self) -> tf.Tensor:
        """The sum of all leaves (float64 scalar)."""
        return self.root()[0]

    def min_value(self) -> tf.Tensor:
        """The smallest positive leaf (``+inf`` when none)."""
        return self.root()[1]

    def get(self, indices: tf.Tensor) -> tf.Tensor:
        """Leaf values at ``indices`` ([B] int64) as ``[B]`` float64."""
        indices = tf.cast(indices, tf.int64)
        # a row gather, then the column: XLA has no gather_nd of a resource variable
        rows = tf.gather(self.leaf_rows, indices // self.fanout)
        return tf.gather(rows, indices % self.fanout, batch_dims=1)

    def leaves(self) -> tf.Tensor:
        """All ``capacity`` leaf values, ``[capacity]`` float64."""
        return tf.reshape(self.leaf_rows.read_value(), [-1])[: self.capacity]

    def set(self, indices: tf.Tensor, values: tf.Tensor) -> None:
        """Set leaves ``indices`` ([B] int64 in ``[0, capacity)``) to ``values`` ([B], >= 0).

        With duplicate indices one of the values wins and the tree stays consistent.
        """
        k = self.fanout
        node = tf.reshape(tf.cast(indices, tf.int64), [-1])
        values = tf.reshape(tf.cast(values, tf.float64), [-1])
        self.leaf_rows.scatter_nd_update(self._split(node), values)
        node = node // k  # the touched nodes of level D - 1 = rows of the leaf level
        for d in range(self.depth - 1, self.dense_top, -1):
            below = self.sums[d]  # level d + 1
            children = tf.gather(below, node)  # [B, K]
            if d + 1 == self.depth:
                low = tf.reduce_min(_positive_or_inf(children), axis=1)
            else:
                low = tf.reduce_min(tf.gather(self.mins[d], node), axis=1)
            at = self._split(node)
            self.sums[d - 1].scatter_nd_update(at, tf.reduce_sum(children, axis=1))
            self.mins[d - 1].scatter_nd_update(at, low)
            node = node // k
        for d in range(self.dense_top, 0, -1):
            below = self.sums[d].read_value()
            if d + 1 == self.depth:
                low = tf.reduce_min(_positive_or_inf(below), axis=1)
            else:
                low = tf.reduce_min(self.mins[d].read_value(), axis=1)
            pad = [[0, self.rows[d - 1] * k - self.rows[d]]]
            self.sums[d - 1].assign(tf.reshape(tf.pad(tf.reduce_sum(below, axis=1), pad), [-1, k]))
            self.mins[d - 1].assign(tf.reshape(tf.pad(low, pad, constant_values=np.inf), [-1, k]))

    def find(self, targets: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Leaves whose prefix-sum interval holds each target, and their values.

        Args:
            targets: ``[B]`` float64 in ``[0, total)``.

        Returns:
            ``(leaves [B] int64, values [B] float64)``.

        Leaf ``i`` owns ``[sum of leaves < i, sum of leaves <= i)``, so a leaf with value 0 is
        never returned while the total is positive; a target at or above the total (or past a
        node's sum by rounding, or an infinite total) lands on the last positive leaf, a
        negative one on the first positive leaf. With a zero total every target lands on leaf 0.
        """
        t = tf.maximum(tf.reshape(tf.cast(targets, tf.float64), [-1, 1]), 0.0)
        node = tf.zeros_like(t[:, 0], dtype=tf.int64)
        child = tf.range(self.fanout, dtype=tf.int64)
        for depth, level in enumerate(self.sums):
            sums = tf.gather(level, node)  # [B, K]: the children of each sample's node
            ends = tf.cumsum(sums, axis=1)
            # Keep 0 <= t < the row's sum (the largest float below it; below an infinite sum,
            # the largest finite one), so that the count stops at the last positive child: the
            # children after it end at the same sum.
            total = ends[:, -1:]
            below = tf.math.nextafter(total, tf.zeros_like(total))
            if depth == 0:  # a zero total: -1 walks the first child of every node
                below = tf.where(total > 0.0, below, -1.0)
            t = tf.minimum(t, below)
            pos = tf.reduce_sum(tf.cast(ends[:, :-1] <= t, tf.int64), axis=1, keepdims=True)
            # Subtract the very prefix the count compared (ends[pos - 1] <= t), not a sum of the
            # children in another order: t stays >= 0 whatever the rounding.
            t = t - tf.reduce_max(tf.where(child < pos, ends, 0.0), axis=1, keepdims=True)
            node = node * self.fanout + pos[:, 0]
        value = tf.reduce_sum(tf.where(child == pos, sums, 0.0), axis=1)
        return tf.minimum(node, self.capacity - 1), value

    def _split(self, index: tf.Tensor) -> tf.Tensor:
        """Node index ``[B]`` -> ``[B, 2]`` (row, column) in its level's ``[rows, K]`` variable."""
        return tf.stack([index // self.fanout, index % self.fanout], axis=1)


def _positive_or_inf(x: tf.Tensor) -> tf.Tensor:
    return tf.where(x > 0.0, x, tf.constant(np.inf, tf.float64))
