"""TableWriter: transitions staged one env step at a time, appended a chunk at a time, checked
as `append` checks a batch, and never missed by sampling."""

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.errors import BatchError

SPEC = {
    "obs": tf.TensorSpec([3], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "reward": tf.TensorSpec([], tf.float32),
    "done": tf.TensorSpec([], tf.bool),
}


def row(i):
    return {"obs": np.full(3, i, np.float32), "action": i, "reward": 0.5 * i, "done": i % 2 == 0}


def test_rows_reach_the_table_a_chunk_at_a_time_in_order():
    table = rg.ReplayTable(SPEC, 16, device="/CPU:0")
    writer = table.writer(chunk=4)
    for i in range(3):
        writer.add(row(i))
    assert table.size == 0 and len(writer) == 3  # staged in host memory only
    writer.add(row(3))
    assert table.size == 4 and len(writer) == 0
    with writer:
        writer.add(row(4))
    assert table.size == 5
    np.testing.assert_array_equal(table.storage["action"].numpy()[:5], np.arange(5))
    np.testing.assert_array_equal(table.storage["reward"].numpy()[:5], 0.5 * np.arange(5))
    np.testing.assert_array_equal(table.storage["obs"].numpy()[:5, 0], np.arange(5))
    np.testing.assert_array_equal(table.storage["done"].numpy()[:5], np.arange(5) % 2 == 0)


def test_a_refused_row_stages_nothing_and_names_the_field():
    table = rg.ReplayTable(SPEC, 16, device="/CPU:0")
    writer = table.writer(chunk=4)
    writer.add(row(0))
    bad = [
        ({**row(1), "action": 1.7}, "field 'action': expected dtype int64"),
        ({**row(1), "obs": np.zeros(3, np.float64)}, "field 'obs': expected dtype float32"),
        ({**row(1), "obs": np.zeros(4, np.float32)}, r"field 'obs': expected shape \[3\]"),
        ({k: v for k, v in row(1).items() if k != "done"}, "missing 'done'"),
        ([1, 2, 3, 4], "transition: got list, expected a dict"),
    ]
    for transition, message in bad:
        with pytest.raises(BatchError, match=message):
            writer.add(transition)
        assert len(writer) == 1
    writer.add(row(1))
    assert writer.flush() == 2 and table.size == 2
    np.testing.assert_array_equal(table.storage["action"].numpy()[:2], [0, 1])


def test_learner_train_appends_staged_rows_before_it_samples():
    table = rg.ReplayTable(SPEC, 64, device="/CPU:0")
    writer = table.writer(chunk=32)
    seen = tf.Variable(0.0)

    def update(batch):
        seen.assign(tf.reduce_max(batch["reward"]))
        return {}

    learner = rg.Learner(table, rg.Sampler(table, seed=0), update, batch_size=64)
    writer.add(row(7))  # one staged row: without the flush the table would be empty
    assert learner.train(1) == {"steps": 1.0}
    assert table.size == 1 and len(writer) == 0 and seen.numpy() == 3.5


def test_nested_specs_take_nested_or_flat_rows():
    spec = {"obs": {"x": tf.TensorSpec([2], tf.float32)}, "reward": tf.TensorSpec([], tf.float32)}
    table = rg.ReplayTable(spec, 8, device="/CPU:0")
    writer = table.writer(chunk=8)
    writer.add({"obs": {"x": np.ones(2, np.float32)}, "reward": 1.0})
    writer.add({"obs/x": np.zeros(2, np.float32), "reward": 2.0})
    writer.flush()
    np.testing.assert_array_equal(table.storage["obs/x"].numpy()[:2], [[1, 1], [0, 0]])


def test_chunk_must_be_a_positive_int():
    table = rg.ReplayTable(SPEC, 8, device="/CPU:0")
    with pytest.raises(rg.ConfigError, match="chunk"):
        table.writer(chunk=0)
