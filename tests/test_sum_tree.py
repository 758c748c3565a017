"""SumTree: parents equal their children after any updates; prefix-sum descent finds the leaf."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from replaygpu.samplers.sum_tree import SumTree


def check_invariants(tree: SumTree) -> None:
    sums = [v.numpy() for v in tree.sums]
    mins = [v.numpy() for v in tree.mins]
    leaves = sums[-1]
    leaf_mins = np.where(leaves > 0, leaves, np.inf)
    for level in range(tree.depth - 1, 0, -1):  # level d is sums[d - 1], its children sums[d]
        below_mins = leaf_mins if level + 1 == tree.depth else mins[level]
        nodes = len(sums[level])  # each row of the level below is one node of this level
        parent_sums = sums[level - 1].reshape(-1)
        parent_mins = mins[level - 1].reshape(-1)
        # Integer-valued leaves: every sum is exact, whatever the summation order.
        np.testing.assert_array_equal(parent_sums[:nodes], sums[level].sum(axis=1))
        np.testing.assert_array_equal(parent_mins[:nodes], below_mins.min(axis=1))
        assert np.all(parent_sums[nodes:] == 0.0) and np.all(parent_mins[nodes:] == np.inf)
    assert np.all(leaves.reshape(-1)[tree.capacity :] == 0.0), "padding leaves must stay empty"


updates = st.lists(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 50)), min_size=1, max_size=24),
    min_size=1,
    max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 37),
    fanout=st.sampled_from([2, 3, 4, 16]),
    dense_children=st.sampled_from([0, 9, 4096]),  # node by node, mixed, and whole top levels
    batches=updates,
)
def test_tree_invariants_hold_after_random_updates_with_duplicates(
    capacity, fanout, dense_children, batches
):
    tree = SumTree(capacity, "/CPU:0", fanout=fanout, dense_children=dense_children)
    expected = np.zeros(capacity)
    for batch in batches:
        idx = np.array([i % capacity for i, _ in batch], np.int64)
        val = np.array([v for _, v in batch], np.float64)
        tree.set(tf.constant(idx), tf.constant(val))
        leaves = tree.leaves().numpy()
        for i in np.unique(idx):
            # With duplicates one of the written values wins; it must be one of them.
            assert leaves[i] in val[idx == i]
            expected[i] = leaves[i]
        check_invariants(tree)
    np.testing.assert_array_equal(tree.leaves().numpy(), expected)
    np.testing.assert_array_equal(tree.get(tf.range(capacity, dtype=tf.int64)).numpy(), expected)
    assert float(tree.total()) == expected.sum()
    # A zero leaf is empty: the min is over positive leaves (+inf when there are none).
    want_min = expected[expected > 0].min() if np.any(expected > 0) else np.inf
    assert float(tree.min_value()) == want_min


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.integers(0, 9), min_size=1, max_size=40),
    fanout=st.sampled_from([2, 3, 4, 16]),
    data=st.data(),
)
def test_descent_finds_the_leaf_whose_prefix_interval_holds_the_target(values, fanout, data):
    values = np.array(values, np.float64)
    if values.sum() == 0:
        values[-1] = 1.0
    tree = SumTree(len(values), "/CPU:0", fanout=fanout)
    tree.set(tf.range(len(values), dtype=tf.int64), tf.constant(values))
    total = values.sum()
    ks = data.draw(st.lists(st.integers(0, int(total) - 1), min_size=1, max_size=16))
    targets = np.array(ks, np.float64) + 0.5  # integer leaves: sums exact, no ties
    got, got_values = tree.find(tf.constant(targets))
    got = got.numpy()
    np.testing.assert_array_equal(got_values.numpy(), values[got])
    want = np.searchsorted(np.cumsum(values), targets, side="right")
    np.testing.assert_array_equal(got, want)
    assert np.all(values[got] > 0)


def test_target_at_or_above_total_lands_on_last_positive_leaf():
    tree = SumTree(6, "/CPU:0")
    tree.set(tf.constant([0, 2, 3], tf.int64), tf.constant([1.0, 2.0, 0.5], tf.float64))
    got = tree.find(tf.constant([3.5, 3.5 + 1e-12, 100.0], tf.float64))[0].numpy()
    np.testing.assert_array_equal(got, [3, 3, 3])


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.just(0.0), st.floats(1e-6, 1e3, allow_nan=False)), min_size=2, max_size=60
    ),
    fanout=st.sampled_from([2, 3, 8]),
)
def test_descent_never_returns_a_zero_leaf_even_at_prefix_boundaries(values, fanout):
    values = np.array(values, np.float64)
    values[len(values) // 2] = 0.5  # at least one positive leaf
    tree = SumTree(len(values), "/CPU:0", fanout=fanout)
    tree.set(tf.range(len(values), dtype=tf.int64), tf.constant(values))
    # Every prefix sum (where a run of zero leaves has an empty interval), its neighbours one
    # ulp away, zero and the total: none may land on a zero leaf.
    prefix = np.concatenate([[0.0], np.cumsum(values), np.cumsum(tree.sums[0].numpy()[0])])
    targets = np.concatenate([prefix, np.nextafter(prefix, np.inf), np.nextafter(prefix, -np.inf)])
    targets = targets[targets >= 0.0]
    got, got_values = tree.find(tf.constant(targets))
    assert np.all(values[got.numpy()] > 0), values[got.numpy()]
    np.testing.assert_array_equal(got_values.numpy(), values[got.numpy()])


@pytest.mark.parametrize("compiled", [False, True], ids=["graph-ops", "xla"])
def test_descent_never_returns_a_zero_leaf_when_prefix_sums_round(compiled):
    # The root row is [1, e, e, e, e, e, e, 1] with e = 2**-53: its running sum rounds every e
    # away, other summation orders do not. A target at that prefix (1.0) must reach leaf 57,
    # not the empty leaf 56 before it.
    e = 2.0**-53
    leaves = np.zeros(64)
    leaves[[0, 8, 16, 24, 32, 40, 48]] = [1.0, e, e, e, e, e, e]
    leaves[57] = 1.0
    tree = SumTree(64, "/CPU:0", fanout=8)
    tree.set(tf.range(64, dtype=tf.int64), tf.constant(leaves))
    find = tf.function(tree.find, jit_compile=True) if compiled else tree.find
    got, got_values = find(tf.constant([1.0, np.nextafter(1.0, 0.0), np.nextafter(1.0, 2.0)]))
    assert np.all(leaves[got.numpy()] > 0), got.numpy()
    np.testing.assert_array_equal(got_values.numpy(), leaves[got.numpy()])


@pytest.mark.parametrize("compiled", [False, True], ids=["graph-ops", "xla"])
def test_descent_handles_a_tiny_or_an_infinite_total(compiled):
    tiny = np.finfo(np.float64).tiny
    for leaves, targets in (
        ([0.0, tiny, 0.0, 0.0], [0.0, tiny / 2, tiny, 1.0]),
        ([1.0, np.inf, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.5, 2.0, 1e308, np.inf]),
    ):
        leaves = np.array(leaves)
        tree = SumTree(len(leaves), "/CPU:0", fanout=4)
        tree.set(tf.range(len(leaves), dtype=tf.int64), tf.constant(leaves))
        find = tf.function(tree.find, jit_compile=True) if compiled else tree.find
        got = find(tf.constant(targets, tf.float64))[0].numpy()
        assert np.all(leaves[got] > 0), (leaves, got)


def test_descent_over_an_empty_tree_lands_on_leaf_zero():
    tree = SumTree(100, "/CPU:0")
    got, got_values = tree.find(tf.constant([0.0, 1.0, 5.0], tf.float64))
    np.testing.assert_array_equal(got.numpy(), [0, 0, 0])
    np.testing.assert_array_equal(got_values.numpy(), [0.0, 0.0, 0.0])


def test_layout_is_one_row_shaped_variable_per_level():
    tree = SumTree(1_000_000, "/CPU:0")
    assert tree.fanout == 8 and tree.depth == 7  # 8**7 >= 1e6 > 8**6
    # Row j of a level holds the 8 children of node j above; no level is padded beyond a row.
    rows = [1, 4, 31, 245, 1954, 15625, 125_000]
    assert [v.shape.as_list() for v in tree.sums] == [[r, 8] for r in rows]
    assert [v.shape.as_list() for v in tree.mins] == [[r, 8] for r in rows[:-1]]
    assert all(v.dtype == tf.float64 for v in tree.sums + tree.mins)
    assert tree.dense_top == 3  # levels 1-3 (<= 4096 children) are recomputed whole
    assert SumTree(10_000, "/CPU:0").depth == 5
    assert SumTree(10_000, "/CPU:0", fanout=2).depth == 14
    assert SumTree(1, "/CPU:0").depth == 1


def test_sums_stay_consistent_with_non_integer_values():
    rng = np.random.default_rng(0)
    tree = SumTree(300, "/CPU:0", fanout=4)
    for _ in range(20):
        idx = rng.integers(0, 300, 64)
        tree.set(tf.constant(idx), tf.constant(rng.exponential(size=64) ** 0.6))
    leaves = tree.leaves().numpy()
    assert float(tree.total()) == pytest.approx(leaves.sum(), rel=1e-12)
    assert float(tree.min_value()) == leaves[leaves > 0].min()


def test_rejects_bad_capacity():
    with pytest.raises(ValueError, match="capacity: got 0"):
        SumTree(0)
    with pytest.raises(ValueError, match="fanout: got 1"):
        SumTree(4, fanout=1)
    with pytest.raises(ValueError, match="dense_children: got -1"):
        SumTree(4, dense_children=-1)
