"""rg.Sampler(table, rg.Uniform()): only filled rows, uniform over them, clear error when empty."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import replaygpu as rg
from replaygpu.errors import EmptyTableError

SPEC = {"id": tf.TensorSpec([], tf.int64)}


def test_sampling_never_returns_an_unfilled_row():
    table = rg.ReplayTable(SPEC, capacity=1000, device="CPU")
    table.append({"id": np.arange(1, 38, dtype=np.int64)})  # rows 0..36 filled, ids >= 1
    sampler = rg.Sampler(table, seed=3)
    indices, batch = sampler.sample(4096)
    assert int(tf.reduce_max(indices)) < 37 and int(tf.reduce_min(indices)) >= 0
    assert int(tf.reduce_min(batch["id"])) >= 1  # unfilled rows hold id 0


def test_uniform_sampling_passes_chi_square_over_rows():
    rows = 50
    table = rg.ReplayTable(SPEC, capacity=rows, device="CPU")
    table.append({"id": np.arange(rows, dtype=np.int64)})
    sampler = rg.Sampler(table, seed=11)
    draws = np.concatenate([sampler.sample_indices(1000).numpy() for _ in range(50)])
    counts = np.bincount(draws, minlength=rows)
    _, p_value = stats.chisquare(counts)
    assert p_value > 1e-3, f"counts not uniform: p={p_value:.2e} counts={counts}"
    assert counts.min() > 0


def test_sampling_an_empty_table_raises_clear_error():
    table = rg.ReplayTable(SPEC, capacity=8, device="CPU")
    sampler = rg.Sampler(table, seed=0)
    with pytest.raises(EmptyTableError, match="empty: append transitions before sampling"):
        sampler.sample(4)


def test_same_seed_draws_same_indices_and_other_seed_differs():
    table = rg.ReplayTable(SPEC, capacity=100, device="CPU")
    table.append({"id": np.arange(100, dtype=np.int64)})
    a = rg.Sampler(table, seed=5).sample_indices(64).numpy()
    b = rg.Sampler(table, seed=5).sample_indices(64).numpy()
    c = rg.Sampler(table, seed=6).sample_indices(64).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
