"""`Sampler.as_dataset`: the tf.data bridge draws from the live table, as ``sample`` does.

The distribution tests use chi-square statistics with a fixed seed and a significance level of
1e-4, so a false failure is very unlikely; `test_chi_square_helpers_detect_a_skewed_stream`
shows the same helpers do fail on a stream that is off by a realistic amount.
"""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import replaygpu as rg
from replaygpu.keys import DISCOUNT, IMPORTANCE_WEIGHTS, MASK
from replaygpu.sharded import mirrored_strategy

ALPHA = 1e-4  # significance level: a fair test fails falsely about once in 10,000 runs
K = 40  # rows in the distribution tests, holding ids 0..K-1
BATCH = 64
BATCHES = 300  # 19,200 draws per path: 480 expected per row under uniform sampling

SPEC = {
    "obs": tf.TensorSpec([3], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "done": tf.TensorSpec([], tf.bool),
}


def rows(start: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + n)
    return {
        "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32),
        "action": ids.astype(np.int64),
        "done": ids % 2 == 0,
    }


def id_table(k: int = K, device: str | None = "/CPU:0") -> rg.ReplayTable:
    table = rg.ReplayTable({"id": tf.TensorSpec([], tf.int64)}, k, device=device)
    table.append({"id": np.arange(k, dtype=np.int64)})
    return table


def counts_from_dataset(dataset: tf.data.Dataset, batches: int, k: int) -> np.ndarray:
    ids = []
    for indices, batch in dataset.take(batches):
        np.testing.assert_array_equal(batch["id"].numpy(), indices.numpy())
        ids.append(batch["id"].numpy())
    return np.bincount(np.concatenate(ids), minlength=k)


def counts_from_sampler(sampler: rg.Sampler, batches: int, k: int) -> np.ndarray:
    ids = [sampler.sample(BATCH)[1]["id"].numpy() for _ in range(batches)]
    return np.bincount(np.concatenate(ids), minlength=k)


def goodness_of_fit_p(counts: np.ndarray, probabilities: np.ndarray) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against ``probabilities``."""
    expected = probabilities / probabilities.sum() * counts.sum()
    return float(stats.chisquare(counts, expected).pvalue)


def homogeneity_p(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of the chi-square test that two count vectors come from one distribution."""
    return float(stats.chi2_contingency(np.stack([a, b])).pvalue)


def test_dataset_yields_sample_structure_shapes_and_dtypes():
    table = rg.ReplayTable(SPEC, 50, device="/CPU:0")
    table.append(rows(0, 20))
    sampler = rg.Sampler(table, seed=0)
    dataset = sampler.as_dataset(8)
    indices_spec, batch_spec = dataset.element_spec
    assert indices_spec == tf.TensorSpec([8], tf.int64)
    assert batch_spec == {k: tf.TensorSpec([8, *v.shape], v.dtype) for k, v in SPEC.items()}
    for indices, batch in dataset.take(3):
        assert indices.dtype == tf.int64 and indices.shape == [8]
        assert batch["obs"].shape == [8, 3] and batch["obs"].dtype == tf.float32
        assert batch["done"].dtype == tf.bool
        ids = indices.numpy()
        assert ((ids >= 0) & (ids < 20)).all()
        np.testing.assert_array_equal(batch["action"].numpy(), ids)
        np.testing.assert_array_equal(batch["obs"].numpy()[:, 0], ids.astype(np.float32))


def test_prioritized_dataset_adds_importance_weights():
    table = rg.ReplayTable(SPEC, 50, device="/CPU:0")
    table.append(rows(0, 20))
    _, batch_spec = rg.Sampler(table, rg.Prioritized(), seed=0).as_dataset(8).element_spec
    assert batch_spec[IMPORTANCE_WEIGHTS] == tf.TensorSpec([8], tf.float32)
    assert set(batch_spec) == {*SPEC, IMPORTANCE_WEIGHTS}


def test_nstep_and_sequence_sampler_datasets_yield_their_own_fields():
    spec = {
        "obs": tf.TensorSpec([2], tf.float32),
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
        "next_obs": tf.TensorSpec([2], tf.float32),
        "terminated": tf.TensorSpec([], tf.bool),
        "truncated": tf.TensorSpec([], tf.bool),
    }
    table = rg.ReplayTable(spec, 30, device="/CPU:0")
    n = 20
    table.append(
        {
            "obs": np.zeros([n, 2], np.float32),
            "action": np.zeros([n], np.int64),
            "reward": np.ones([n], np.float32),
            "next_obs": np.zeros([n, 2], np.float32),
            "terminated": np.zeros([n], bool),
            "truncated": np.zeros([n], bool),
        }
    )
    sampler = rg.Sampler(table, rg.Uniform(), rg.NStep(3, gamma=0.5), seed=0)
    indices, batch = next(iter(sampler.as_dataset(4)))
    assert indices.shape == [4]
    assert batch[DISCOUNT].shape == [4]
    # three rewards of 1 with gamma 0.5 (no terminal among them unless at the table's end)
    assert (batch["reward"].numpy() <= 1.75 + 1e-6).all()
    sequencer = rg.Sampler(table, rg.Uniform(), rg.Sequence(3), seed=0)
    _, batch = next(iter(sequencer.as_dataset(4)))
    assert batch["obs"].shape == [4, 3, 2] and batch[MASK].shape == [4, 3]
    for each in (sampler, sequencer):  # the element is what sample() returns, field for field
        eager = tf.nest.map_structure(tf.TensorSpec.from_tensor, each.sample(4))
        assert each.as_dataset(4).element_spec == eager


def test_dataset_sees_rows_appended_after_it_was_built():
    table = rg.ReplayTable(SPEC, 100, device="/CPU:0")
    table.append(rows(0, 5))
    sampler = rg.Sampler(table, seed=1)
    iterator = iter(sampler.as_dataset(32))
    first = np.concatenate([next(iterator)[0].numpy() for _ in range(5)])
    assert first.max() < 5
    table.append(rows(5, 95))
    later = np.concatenate([next(iterator)[0].numpy() for _ in range(10)])
    assert later.max() >= 5, "the dataset kept drawing from the 5 rows it was built with"
    assert later.min() >= 0 and later.max() < 100
    assert (later >= 5).mean() > 0.8  # 95 of 100 rows are new


def test_dataset_made_on_an_empty_table_raises_a_clear_error_then_works_once_filled():
    table = rg.ReplayTable(SPEC, 10, device="/CPU:0", name="fresh")
    sampler = rg.Sampler(table, seed=0)
    dataset = sampler.as_dataset(4)  # making it is fine: rows may arrive later
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="table fresh is empty: append transitions"
    ):
        next(iter(dataset))
    table.append(rows(0, 3))
    indices, _ = next(iter(dataset))
    assert indices.numpy().max() < 3


def test_prioritized_dataset_on_an_empty_table_raises_instead_of_hanging():
    table = rg.ReplayTable(SPEC, 10, device="/CPU:0", name="fresh")
    dataset = rg.Sampler(table, rg.Prioritized(), seed=0).as_dataset(4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="append transitions"):
        next(iter(dataset))


def test_dataset_works_when_the_table_is_on_another_device_than_tf_data():
    # conftest splits the CPU into /CPU:0 and /CPU:1; tf.data runs its functions on /CPU:0.
    for distribution in (rg.Uniform(), rg.Prioritized()):
        table = rg.ReplayTable(SPEC, 20, device="/CPU:1")
        assert table.device.endswith("CPU:1")
        table.append(rows(0, 10))
        sampler = rg.Sampler(table, distribution, seed=0)
        iterator = iter(sampler.as_dataset(16))
        indices, batch = next(iterator)
        np.testing.assert_array_equal(batch["action"].numpy(), indices.numpy())
        table.append(rows(10, 10))
        seen = np.concatenate([next(iterator)[0].numpy() for _ in range(10)])
        assert seen.max() >= 10
        if sampler.keeps_priorities:
            sampler.update_priorities(indices, tf.ones([16]))


def test_as_dataset_rejects_bad_batch_size_and_sharded_tables():
    table = id_table(4)
    with pytest.raises(rg.ConfigError, match="batch_size"):
        rg.Sampler(table).as_dataset(0)
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    sharded = rg.ShardedReplayTable({"id": tf.TensorSpec([], tf.int64)}, 8, strategy)
    with pytest.raises(rg.ConfigError, match=r"rg\.Learner"):
        rg.Sampler(sharded, seed=0).as_dataset(4)


def test_chi_square_helpers_detect_a_skewed_stream():
    # The statistics below can fail: a stream where one row in K is drawn at twice the rate
    # of the others, with as many draws as the tests take, is rejected by both helpers.
    rng = np.random.default_rng(0)
    n = BATCH * BATCHES
    uniform = np.ones(K)
    skewed = uniform.copy()
    skewed[7] = 2.0
    skewed_counts = np.bincount(rng.choice(K, n, p=skewed / skewed.sum()), minlength=K)
    fair_counts = np.bincount(rng.integers(0, K, n), minlength=K)
    assert goodness_of_fit_p(fair_counts, uniform) > ALPHA
    assert goodness_of_fit_p(skewed_counts, uniform) < ALPHA
    assert homogeneity_p(fair_counts, skewed_counts) < ALPHA


def test_dataset_draws_the_same_uniform_distribution_as_sample():
    table = id_table()
    from_dataset = counts_from_dataset(rg.Sampler(table, seed=11).as_dataset(BATCH), BATCHES, K)
    from_sample = counts_from_sampler(rg.Sampler(table, seed=12), BATCHES, K)
    assert from_dataset.sum() == from_sample.sum() == BATCH * BATCHES
    uniform = np.ones(K)
    assert goodness_of_fit_p(from_dataset, uniform) > ALPHA
    assert goodness_of_fit_p(from_sample, uniform) > ALPHA
    assert homogeneity_p(from_dataset, from_sample) > ALPHA


def test_prioritized_dataset_follows_priorities_set_with_its_indices():
    table = id_table()
    sampler = rg.Sampler(table, rg.Prioritized(alpha=1.0, beta=1.0, epsilon=1e-6), seed=3)
    target = np.arange(1, K + 1, dtype=np.float64)  # row i drawn with probability (i+1) / sum
    iterator = iter(sampler.as_dataset(BATCH))
    # New rows all start at the max priority, so each stratified batch of 64 covers all 40.
    indices, batch = next(iterator)
    assert set(batch["id"].numpy()) == set(range(K))
    sampler.update_priorities(indices, tf.constant(target[indices.numpy()], tf.float32))
    np.testing.assert_allclose(sampler.probabilities(), target / target.sum(), rtol=1e-5)
    ids = []
    for _ in range(BATCHES):
        indices, batch = next(iterator)
        weights = batch[IMPORTANCE_WEIGHTS].numpy()
        np.testing.assert_allclose(weights, 1.0 / (indices.numpy() + 1), rtol=1e-4)
        ids.append(batch["id"].numpy())
    counts = np.bincount(np.concatenate(ids), minlength=K)
    assert goodness_of_fit_p(counts, target) > ALPHA
    assert goodness_of_fit_p(counts, np.ones(K)) < ALPHA  # and it is not uniform


def test_dataset_feeds_a_tf_function_step_that_updates_priorities_in_graph():
    table = id_table(8)
    sampler = rg.Sampler(table, rg.Prioritized(alpha=1.0), seed=0)

    @tf.function
    def step(indices: tf.Tensor, batch: dict) -> None:
        # priority 0 (plus epsilon) for every row drawn but row 0, which keeps a large one
        priorities = tf.where(batch["id"] == 0, 100.0, 0.0)
        sampler.update_priorities(indices, priorities)

    for indices, batch in sampler.as_dataset(16).take(3):
        step(indices, batch)
    probabilities = sampler.probabilities()
    assert probabilities[0] > 0.99
    ids = np.concatenate([b["id"].numpy() for _, b in sampler.as_dataset(16).take(5)])
    assert (ids == 0).mean() > 0.9
