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
        ({**row(1), "obs": np.full(3, 1e39)}, "field 'obs': expected dtype float32"),
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


def test_what_gymnasium_returns_goes_in_as_it_is_under_the_one_conversion_rule():
    """Pendulum's own values (float64 obs and reward, a float64 action array, ``terminated=0``)
    go into a float32 / bool table through `writer.add`, `append` and a `ReplayClient` alike;
    a value that does not fit is refused by each the same way, naming it, writing nothing."""
    import gymnasium as gym

    from replaygpu.specs import specs_from_env

    env = gym.make("Pendulum-v1")
    spec = specs_from_env(env)
    obs, _ = env.reset(seed=0)
    action = np.array([0.88])  # float64, as a user writes it
    next_obs, reward, _, truncated, _ = env.step(action)
    env.close()
    assert isinstance(reward, np.floating | float) and spec["reward"].dtype == tf.float32
    step = {
        "obs": obs.astype(np.float64),
        "action": action,
        "reward": np.float64(reward),
        "next_obs": next_obs,
        "terminated": 0,
        "truncated": int(truncated),
    }
    overflow = {**step, "reward": np.float64(1e39)}
    table = rg.ReplayTable(spec, 16, device="/CPU:0")
    with table.writer(chunk=4) as writer:
        writer.add(step)
        with pytest.raises(BatchError, match=r"field 'reward'.* 1e\+39 is beyond float32"):
            writer.add(overflow)
    batch = {k: [v] for k, v in step.items()}
    table.append(batch)
    with pytest.raises(BatchError, match=r"field 'reward'.* 1e\+39 at \[0\] is beyond float32"):
        table.append({k: [v] for k, v in overflow.items()})
    with rg.serve(table) as server, rg.ReplayClient(server.address) as client:
        client.add(step)
        with pytest.raises(BatchError, match=r"field 'terminated'.* 2 is no bool"):
            client.add({**step, "terminated": 2})
        client.flush(timeout=30)
    assert table.size == 3
    rows = table.gather(tf.range(3, dtype=tf.int64))
    for got in rows["reward"].numpy():
        assert got == np.float32(reward)
    np.testing.assert_array_equal(rows["action"].numpy(), np.float32([[0.88]] * 3))
    assert not rows["terminated"].numpy().any()
