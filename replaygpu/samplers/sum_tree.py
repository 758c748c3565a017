"""A sum tree (and min tree) over row priorities, held in `tf.Variable`s, updated per level.

Layout: ``P`` is the next power of two >= capacity. Node 1 is the root, node ``n`` has children
``2n`` and ``2n + 1``, and leaf ``i`` (row ``i``) is node ``P + i``; node 0 is unused. Level ``d``
of the tree is the contiguous slice ``[2**d, 2**(d+1))`` of one 1-D float64 variable of ``2P``
entries, so both sampling and updates are ``log2(P)`` vectorized gathers/scatters of ``[B]``
int64 indices: O(B log N) work, no Python loop over items, and every op has a GPU kernel.

Why there is no drift and no periodic rebuild: an update never adds a delta to the ancestors.
It writes the leaves, then for each level recomputes every touched parent as ``left + right``
from the children already written below. Every stored parent therefore equals the float64 sum
of its two stored children exactly, whatever the history of updates; duplicate indices in one
update are harmless for the same reason (each duplicate parent writes the same value).

The min tree keeps ``min(left, right)`` the same way, with ``+inf`` on empty leaves; the
prioritized sampler uses its root, the smallest priority over the filled rows, to normalise
importance weights exactly as in Schaul et al. (2016).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


class SumTree(tf.Module):
    """Sums and minima of ``capacity`` non-negative float64 leaves, in device variables.

    Args:
        capacity: number of leaves (rows of the table), >= 1.
        device: where the variables live (the table's device).
        track_min: also keep a min tree (for ``min_value``).

    Attributes:
        sums: float64 variable ``[2P]``: node ``n`` holds the sum of its leaves.
        mins: float64 variable ``[2P]`` with the minimum of the leaves (``+inf`` when empty),
            or None without ``track_min``.
    """

    def __init__(
        self, capacity: int, device: str = "/CPU:0", track_min: bool = True, name: str = "sum_tree"
    ) -> None:
        super().__init__(name=name)
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ValueError(f"capacity: got {capacity!r}, expected an integer >= 1")
        self.capacity = int(capacity)
        self.num_leaves = 1 << (self.capacity - 1).bit_length()
        self.depth = self.num_leaves.bit_length() - 1
        with tf.device(device):
            self.sums = tf.Variable(
                tf.zeros([2 * self.num_leaves], tf.float64), trainable=False, name="sums"
            )
            self.mins = (
                tf.Variable(
                    tf.fill([2 * self.num_leaves], tf.constant(np.inf, tf.float64)),
                    trainable=False,
                    name="mins",
                )
                if track_min
                else None
            )

    def total(self) -> tf.Tensor:
        """The sum of all leaves (float64 scalar)."""
        return self.sums[1]

    def min_value(self) -> tf.Tensor:
        """The smallest leaf set so far (``+inf`` when none); needs ``track_min``."""
        if self.mins is None:
            raise ValueError("min_value: this SumTree was made with track_min=False")
        return self.mins[1]

    def get(self, indices: tf.Tensor) -> tf.Tensor:
        """Leaf values at ``indices`` ([B] int64) as ``[B]`` float64."""
        return tf.gather(self.sums, tf.cast(indices, tf.int64) + self.num_leaves)

    def leaves(self) -> tf.Tensor:
        """All ``capacity`` leaf values, ``[capacity]`` float64."""
        return self.sums[self.num_leaves : self.num_leaves + self.capacity]

    def set(self, indices: tf.Tensor, values: tf.Tensor) -> None:
        """Set leaves ``indices`` ([B] int64 in ``[0, capacity)``) to ``values`` ([B], >= 0).

        Parents are recomputed level by level from their children: ``log2(P)`` gathers and
        scatters of ``[B]`` nodes. With duplicate indices one of the values wins and the tree
        stays consistent.
        """
        nodes = tf.reshape(tf.cast(indices, tf.int64), [-1]) + self.num_leaves
        values = tf.reshape(tf.cast(values, tf.float64), [-1])
        self.sums.scatter_update(tf.IndexedSlices(values, nodes))
        if self.mins is not None:
            self.mins.scatter_update(tf.IndexedSlices(values, nodes))
        for _ in range(self.depth):
            nodes = nodes // 2
            left = 2 * nodes
            self.sums.scatter_update(
                tf.IndexedSlices(tf.gather(self.sums, left) + tf.gather(self.sums, left + 1), nodes)
            )
            if self.mins is not None:
                self.mins.scatter_update(
                    tf.IndexedSlices(
                        tf.minimum(tf.gather(self.mins, left), tf.gather(self.mins, left + 1)),
                        nodes,
                    )
                )

    def find(self, targets: tf.Tensor) -> tf.Tensor:
        """Leaves whose prefix-sum interval holds each target: ``[B]`` float64 -> ``[B]`` int64.

        Leaf ``i`` owns ``[sum of leaves < i, sum of leaves <= i)``; a target at or above the
        total lands on the last positive leaf. The descent never enters a subtree whose sum is
        zero, so with a positive total it always returns a leaf with a positive value.
        """
        targets = tf.cast(targets, tf.float64)
        node = tf.ones_like(targets, dtype=tf.int64)
        for _ in range(self.depth):
            left_node = 2 * node
            left = tf.gather(self.sums, left_node)
            right = tf.gather(self.sums, left_node + 1)
            go_right = tf.logical_and(targets >= left, right > 0.0)
            targets = tf.where(go_right, targets - left, targets)
            node = left_node + tf.cast(go_right, tf.int64)
        return tf.clip_by_value(node - self.num_leaves, 0, self.capacity - 1)
