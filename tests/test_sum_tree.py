"""SumTree: parents equal their children after any updates; prefix-sum descent finds the leaf."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import replaygpu as rg


def check_invariants(tree: rg.SumTree) -> None:
    sums = tree.sums.numpy()
    mins = tree.mins.numpy()
    p = tree.num_leaves
    for node in range(1, p):
        assert sums[node] == sums[2 * node] + sums[2 * node + 1], f"sum broken at node {node}"
        assert mins[node] == min(mins[2 * node], mins[2 * node + 1]), f"min broken at {node}"
    assert np.all(sums[p + tree.capacity :] == 0.0), "padding leaves must stay empty"


updates = st.lists(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 50)), min_size=1, max_size=24),
    min_size=1,
    max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(1, 37), batches=updates)
def test_tree_invariants_hold_after_random_updates_with_duplicates(capacity, batches):
    tree = rg.SumTree(capacity, "/CPU:0")
    expected = np.zeros(capacity)
    written = np.zeros(capacity, bool)
    for batch in batches:
        idx = np.array([i % capacity for i, _ in batch], np.int64)
        val = np.array([v for _, v in batch], np.float64)
        tree.set(tf.constant(idx), tf.constant(val))
        leaves = tree.leaves().numpy()
        for i in np.unique(idx):
            # With duplicates one of the written values wins; it must be one of them.
            assert leaves[i] in val[idx == i]
            expected[i] = leaves[i]
        written[idx] = True
        check_invariants(tree)
    np.testing.assert_array_equal(tree.leaves().numpy(), expected)
    assert float(tree.total()) == expected.sum()
    want_min = expected[written].min()
    assert float(tree.min_value()) == want_min


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.integers(0, 9), min_size=1, max_size=40), data=st.data())
def test_descent_finds_the_leaf_whose_prefix_interval_holds_the_target(values, data):
    values = np.array(values, np.float64)
    if values.sum() == 0:
        values[-1] = 1.0
    tree = rg.SumTree(len(values), "/CPU:0")
    tree.set(tf.range(len(values), dtype=tf.int64), tf.constant(values))
    total = values.sum()
    ks = data.draw(st.lists(st.integers(0, int(total) - 1), min_size=1, max_size=16))
    targets = np.array(ks, np.float64) + 0.5  # integer leaves: sums exact, no ties
    got = tree.find(tf.constant(targets)).numpy()
    want = np.searchsorted(np.cumsum(values), targets, side="right")
    np.testing.assert_array_equal(got, want)
    assert np.all(values[got] > 0)


def test_target_at_or_above_total_lands_on_last_positive_leaf():
    tree = rg.SumTree(6, "/CPU:0")
    tree.set(tf.constant([0, 2, 3], tf.int64), tf.constant([1.0, 2.0, 0.5], tf.float64))
    got = tree.find(tf.constant([3.5, 3.5 + 1e-12, 100.0], tf.float64)).numpy()
    np.testing.assert_array_equal(got, [3, 3, 3])


def test_layout_is_power_of_two_levels_of_one_variable():
    tree = rg.SumTree(1000, "/CPU:0")
    assert tree.num_leaves == 1024 and tree.depth == 10
    assert tree.sums.shape == [2048] and tree.sums.dtype == tf.float64


def test_rejects_bad_capacity():
    with pytest.raises(ValueError, match="capacity: got 0"):
        rg.SumTree(0)
