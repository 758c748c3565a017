"""Prioritized sampling: frequencies follow priorities, weights follow the formula, new rows get
the max priority, it runs in the XLA-compiled learner loop, and checkpoints resume exactly."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import replaygpu as rg
from replaygpu.errors import BatchError, EmptyTableError
from replaygpu.samplers import LinearSchedule

SPEC = {"id": tf.TensorSpec([], tf.int64), "reward": tf.TensorSpec([], tf.float32)}


def make_table(rows: int, capacity: int | None = None) -> rg.ReplayTable:
    table = rg.ReplayTable(SPEC, capacity=capacity or rows, device="CPU")
    table.append({"id": np.arange(rows, dtype=np.int64), "reward": np.zeros(rows, np.float32)})
    return table


def draw_counts(sampler: rg.Sampler, rows: int, calls: int = 40) -> np.ndarray:
    draws = np.concatenate([sampler.sample_indices(1000).numpy() for _ in range(calls)])
    return np.bincount(draws, minlength=rows)


@pytest.mark.parametrize("xla", [True, False], ids=["xla-clusters", "plain-ops"])
def test_frequencies_match_priorities_before_and_after_updates(xla):
    rows, alpha = 40, 0.7
    table = make_table(rows, capacity=64)
    sampler = rg.Sampler(table, rg.Prioritized(alpha=alpha, beta=0.5, xla=xla), seed=1)
    counts = draw_counts(sampler, 64)
    assert counts[rows:].sum() == 0, "unfilled rows were drawn"
    _, p_before = stats.chisquare(counts[:rows])  # all new rows share the max priority
    assert p_before > 1e-3, f"not uniform before updates: p={p_before:.2e}"

    priorities = np.random.default_rng(0).uniform(0.1, 5.0, rows)
    sampler.update_priorities(tf.range(rows, dtype=tf.int64), tf.constant(priorities))
    leaf = (priorities + sampler.distribution.epsilon) ** alpha
    want = leaf / leaf.sum()
    np.testing.assert_allclose(sampler.probabilities()[:rows], want, rtol=1e-12)
    counts = draw_counts(sampler, 64)
    assert counts[rows:].sum() == 0
    _, p_after = stats.chisquare(counts[:rows], want * counts.sum())
    assert p_after > 1e-3, f"counts do not follow priorities: p={p_after:.2e}"
    _, p_uniform = stats.chisquare(counts[:rows])
    assert p_uniform < 1e-6, "after updates the draws should no longer be uniform"


@pytest.mark.parametrize("xla", [True, False], ids=["xla-clusters", "plain-ops"])
def test_importance_weights_equal_the_formula_with_annealed_beta(xla):
    rows = 30
    table = make_table(rows)
    schedule = LinearSchedule(start=0.4, end=1.0, steps=10)
    sampler = rg.Sampler(table, rg.Prioritized(alpha=0.6, beta=schedule, xla=xla), seed=2)
    priorities = np.linspace(0.5, 8.0, rows)
    sampler.update_priorities(tf.range(rows, dtype=tf.int64), tf.constant(priorities))
    probs = sampler.probabilities()
    for step in range(13):
        beta = 0.4 + 0.6 * min(step / 10, 1.0)
        assert float(sampler.index.current_beta()) == pytest.approx(beta)
        indices, batch = sampler.sample(16)
        idx = indices.numpy()
        n = rows
        w_all = (n * probs) ** -beta
        want = w_all[idx] / w_all.max()  # max over all filled rows, not the batch
        np.testing.assert_allclose(batch["importance_weights"].numpy(), want, rtol=1e-5)
        np.testing.assert_array_equal(batch["id"].numpy(), idx)
    assert int(sampler.index.sample_count.numpy()) == 13


def test_new_rows_get_the_largest_priority_seen_so_far():
    table = make_table(8, capacity=10)
    sampler = rg.Sampler(table, rg.Prioritized(alpha=1.0, epsilon=1e-6), seed=3)
    sampler.update_priorities(tf.constant([0, 1, 2], tf.int64), tf.constant([4.0, 0.5, 9.0]))
    sampler.update_priorities(tf.constant([2], tf.int64), tf.constant([0.1]))  # max stays 9
    table.append({"id": np.arange(100, 104), "reward": np.zeros(4, np.float32)})  # rows 8,9,0,1
    probs = sampler.probabilities()
    leaves = sampler.index.tree.leaves().numpy()
    big = 9.0 + 1e-6
    np.testing.assert_allclose(leaves[[8, 9, 0, 1]], big)
    np.testing.assert_allclose(leaves[2], 0.1 + 1e-6)
    np.testing.assert_allclose(leaves[3:8], 1.0)  # the initial max for never-updated rows
    np.testing.assert_allclose(probs.sum(), 1.0)


def test_nonfinite_priorities_in_the_graph_get_the_max_and_are_counted():
    table = make_table(4)
    sampler = rg.Sampler(table, rg.Prioritized(alpha=1.0), seed=0)
    sampler.sync()
    # Inside a graph (the learner loop), as update_fn's output: one NaN loss must not poison
    # the tree nor stop the run.
    tf.function(sampler.update_priorities)(
        tf.constant([0, 1], tf.int64), tf.constant([3.0, np.nan])
    )
    leaves = sampler.index.tree.leaves().numpy()
    assert np.all(np.isfinite(leaves)) and leaves[1] == pytest.approx(3.0)
    assert int(sampler.index.nonfinite_priorities.numpy()) == 1


@pytest.mark.parametrize(
    ("indices", "priorities", "named"),
    [
        ([0, 1], [3.0, np.nan], "priorities: got \\[nan\\]"),
        ([0, 1], [3.0, np.inf], "priorities: got \\[inf\\]"),
        ([0, 1], [-1.0, 2.0], "priorities: got \\[-1.0\\]"),
        ([0, 9], [1.0, 2.0], "indices: rows \\[9\\] were never drawn"),
        ([0, -1], [1.0, 2.0], "indices: rows \\[-1\\] were never drawn"),
        ([0, 1], [1.0], "priorities: got float64 of shape \\(1,\\)"),
    ],
    ids=["nan", "inf", "negative", "unfilled-row", "negative-row", "length"],
)
def test_eager_update_refuses_bad_priorities_and_rows_and_writes_nothing(
    indices, priorities, named
):
    table = make_table(4, capacity=16)
    sampler = rg.Sampler(table, rg.Prioritized(alpha=1.0), seed=0)
    sampler.update_priorities(np.array([2]), np.array([5.0]))
    before = sampler.index.tree.leaves().numpy().copy()
    with pytest.raises(BatchError, match=named):
        sampler.update_priorities(np.array(indices), np.array(priorities))
    np.testing.assert_array_equal(sampler.index.tree.leaves().numpy(), before)
    assert float(sampler.index.max_leaf.numpy()) == pytest.approx(5.0)


def test_huge_priorities_keep_the_total_finite_and_draws_in_filled_rows():
    table = make_table(50, capacity=1000)
    sampler = rg.Sampler(table, rg.Prioritized(alpha=1.0), seed=0)
    huge = tf.constant([1e308, 1e308], tf.float64)  # finite, but their sum overflows
    sampler.update_priorities(tf.constant([3, 4], tf.int64), huge)
    assert np.isfinite(float(sampler.index.tree.total()))
    assert int(sampler.index.nonfinite_priorities.numpy()) == 0
    indices = sampler.sample_indices(64).numpy()
    assert indices.max() < 50 and set(indices) <= {3, 4}


def td_update(batch):
    """A stand-in for a TD update: priority = id + 1, metric = the mean id drawn."""
    ids = tf.cast(batch["id"], tf.float32)
    return {
        "mean_id": tf.reduce_mean(ids),
        "mean_weight": tf.reduce_mean(batch["importance_weights"]),
        "priorities": ids + 1.0,
    }


@pytest.mark.parametrize(
    ("jit_compile", "sampler_xla"),
    [(True, True), (False, True), (False, False)],
    ids=["xla-loop", "plain-loop-xla-clusters", "plain-loop-plain-ops"],
)
def test_runs_inside_the_learner_loop_and_writes_priorities(jit_compile, sampler_xla):
    rows = 50
    table = make_table(rows)
    sampler = rg.Sampler(table, rg.Prioritized(alpha=1.0, beta=1.0, xla=sampler_xla), seed=4)
    learner = rg.Learner(table, sampler, td_update, batch_size=32, jit_compile=jit_compile)
    out = learner.train(200)
    assert out["steps"] == 200
    leaves = sampler.index.tree.leaves().numpy()
    touched = leaves != 1.0
    assert touched.sum() > 40
    ids = np.arange(rows)
    np.testing.assert_allclose(leaves[touched], ids[touched] + 1.0 + sampler.distribution.epsilon)
    assert int(sampler.index.sample_count.numpy()) == 200
    # Once every row has priority id + 1, high ids dominate the draws.
    out = learner.train(100)
    assert out["mean_id"] > 30


@pytest.mark.parametrize("xla", [False, True])
def test_learner_gives_rows_appended_between_calls_the_max_priority(xla):
    table = make_table(10, capacity=20)
    sampler = rg.Sampler(table, rg.Prioritized(alpha=1.0), seed=5)
    learner = rg.Learner(table, sampler, td_update, batch_size=8, jit_compile=xla)
    learner.train(30)  # priorities id + 1: the max becomes 10 (+ epsilon)
    biggest = float(sampler.index.max_leaf.numpy())
    assert biggest == pytest.approx(10.0 + sampler.distribution.epsilon)
    table.append({"id": np.arange(100, 105), "reward": np.zeros(5, np.float32)})  # rows 10-14
    assert learner.train(0)["steps"] == 0  # the once-per-call sync runs outside the loop
    leaves = sampler.index.tree.leaves().numpy()
    np.testing.assert_array_equal(leaves[10:15], biggest)
    np.testing.assert_array_equal(leaves[15:], 0.0)
    out = learner.train(40)  # the new rows are drawn and get their own priorities
    assert out["mean_id"] > 20
    leaves = sampler.index.tree.leaves().numpy()
    assert np.any(leaves[10:15] > 100.0)


def test_checkpoint_restores_tree_rng_and_schedule_for_exact_resume(tmp_path):
    rows = 64
    table = make_table(rows)
    beta = LinearSchedule(0.4, 1.0, 500)
    sampler = rg.Sampler(table, rg.Prioritized(alpha=0.6, beta=beta), seed=5)
    learner = rg.Learner(table, sampler, td_update, batch_size=16, jit_compile=True)
    ckpt = rg.Checkpointer(tmp_path, table=table, sampler=sampler, learner=learner)
    learner.train(30)
    ckpt.save()
    first = [learner.train(20) for _ in range(3)]
    leaves_first = sampler.index.tree.leaves().numpy().copy()
    count_first = int(sampler.index.sample_count.numpy())

    learner.train(7)  # wander off, then come back
    ckpt.restore()
    assert int(sampler.index.sample_count.numpy()) == 30
    second = [learner.train(20) for _ in range(3)]
    assert first == second
    np.testing.assert_array_equal(sampler.index.tree.leaves().numpy(), leaves_first)
    assert int(sampler.index.sample_count.numpy()) == count_first


def test_checkpoint_saves_after_eager_sampling_of_several_batch_sizes(tmp_path):
    table = make_table(32)
    sampler = rg.Sampler(table, rg.Prioritized(), seed=2)
    sampler.sample(4)
    sampler.sample(8)
    rg.Checkpointer(tmp_path, table=table, sampler=sampler).save()
    expected = sampler.sample_indices(8).numpy()
    restored = rg.Sampler(table, rg.Prioritized(), seed=99)
    rg.Checkpointer(tmp_path, table=table, sampler=restored).restore()
    np.testing.assert_array_equal(restored.sample_indices(8).numpy(), expected)


def test_rejects_bad_configuration_with_clear_errors():
    table = make_table(4)
    with pytest.raises(rg.ConfigError, match="alpha: got -1"):
        rg.Sampler(table, rg.Prioritized(alpha=-1))
    with pytest.raises(rg.ConfigError, match="beta: got 'x'"):
        rg.Sampler(table, rg.Prioritized(beta="x"))
    with pytest.raises(rg.ConfigError, match=r"LinearSchedule\.steps"):
        LinearSchedule(0.4, 1.0, 0)
    clash = rg.ReplayTable({"importance_weights": tf.TensorSpec([], tf.float32)}, 4, "CPU")
    with pytest.raises(rg.ConfigError, match="rename the field"):
        rg.Sampler(clash, rg.Prioritized())


def test_sampling_an_empty_table_raises_clear_error():
    table = rg.ReplayTable(SPEC, capacity=8, device="CPU")
    sampler = rg.Sampler(table, rg.Prioritized(), seed=0)
    with pytest.raises(EmptyTableError, match="empty"):
        sampler.sample(4)
