"""A K-ary sum tree (with a min tree beside it) over row priorities, in row-shaped variables.

Depth ``D`` is the smallest ``D >= 1`` with ``K**D >= capacity``; level ``D`` holds the leaves
(row ``i`` of the table is leaf ``i``; 0 means empty), level ``d < D`` the ``n_d = ceil(n_{d+1} /
K)`` nodes above (``n_0 = 1``). Level ``d`` is a float64 ``[n_{d-1}, K]`` variable whose row ``j``
holds node ``j``'s children (last row padded), so one row gather fetches a node's children.
``mins[d-1]`` (levels ``1 .. D-1``) holds the smallest positive leaf under each node (``+inf``
when none); leaves are their own minima, stored once.

Sampling descends ``D`` levels, each a ``[B, K]`` row gather, prefix sum and count: O(B K log_K
N) vectorized ops, all with GPU kernels, XLA-compilable. On CPU a level costs its elements, not
its ops: ``B`` contiguous rows are far cheaper than ``B * K`` scattered elements, and ``K = 8``
(7 levels for 1e6 rows) did less work per sample than 16 or 32 (``benchmarks/README.md``).

Updates scatter the leaves, then recompute each touched parent from its written children (a row
gather and a scatter per level); top levels with at most ``dense_children`` children are
recomputed whole, cheaper than a gather and a scatter.

No drift, no rebuild: no delta is ever added; each parent is the deterministically ordered
float64 sum of its children, so duplicate indices in an update are harmless too. A variable per
level: no scatter writes the buffer it gathered from, so XLA scatters in place instead of
copying the tree every step.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from replaygpu.errors import check_int


class SumTree(tf.Module):
    """Sums and positive minima of ``capacity`` non-negative float64 leaves, in device variables.

    Args:
        capacity: number of leaves (rows of the table).
        fanout: children per node K >= 2.
        dense_children: levels with at most this many children are recomputed whole (0: none).

    Attributes:
        sums: ``sums[d-1]``: level ``d``'s node sums; the last holds the leaves.
        mins: ``mins[d-1]``: level ``d``'s smallest positive leaf per node, ``d < depth``.
        depth: levels below the root (D >= 1).
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
        """Set leaves ``indices`` ([B] int64) to ``values`` ([B], >= 0); among duplicates one
        value wins and the tree stays consistent."""
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
        """``(leaves [B] int64, values [B] float64)`` whose prefix-sum interval holds each of
        ``targets`` (``[B]`` float64 in ``[0, total)``).

        Leaf ``i`` owns ``[sum of leaves < i, sum of leaves <= i)``, so a zero leaf is never
        returned while the total is positive; a target at or past the total (rounding, an
        infinite total) lands on the last positive leaf, a negative one on the first. A zero
        total gives leaf 0.
        """
        t = tf.maximum(tf.reshape(tf.cast(targets, tf.float64), [-1, 1]), 0.0)
        node = tf.zeros_like(t[:, 0], dtype=tf.int64)
        child = tf.range(self.fanout, dtype=tf.int64)
        for depth, level in enumerate(self.sums):
            sums = tf.gather(level, node)  # [B, K]: the children of each sample's node
            ends = tf.cumsum(sums, axis=1)
            # Keep 0 <= t < the row's sum (largest float below it), so the count stops at the
            # last positive child (the ones after it end at the same sum).
            total = ends[:, -1:]
            below = tf.math.nextafter(total, tf.zeros_like(total))
            if depth == 0:  # a zero total: -1 walks the first child of every node
                below = tf.where(total > 0.0, below, -1.0)
            t = tf.minimum(t, below)
            pos = tf.reduce_sum(tf.cast(ends[:, :-1] <= t, tf.int64), axis=1, keepdims=True)
            # Subtract the very prefix compared (ends[pos - 1]): t stays >= 0 despite rounding.
            t = t - tf.reduce_max(tf.where(child < pos, ends, 0.0), axis=1, keepdims=True)
            node = node * self.fanout + pos[:, 0]
        value = tf.reduce_sum(tf.where(child == pos, sums, 0.0), axis=1)
        return tf.minimum(node, self.capacity - 1), value

    def _split(self, index: tf.Tensor) -> tf.Tensor:
        """Node index ``[B]`` -> ``[B, 2]`` (row, column) in its level's ``[rows, K]`` variable."""
        return tf.stack([index // self.fanout, index % self.fanout], axis=1)


def _positive_or_inf(x: tf.Tensor) -> tf.Tensor:
    return tf.where(x > 0.0, x, tf.constant(np.inf, tf.float64))
