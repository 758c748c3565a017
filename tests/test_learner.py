"""Learner: the fused multi-step loop, its single trace, in-graph metrics, XLA, rate limiting."""

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.errors import EmptyTableError

SPEC = {"id": tf.TensorSpec([], tf.int64), "x": tf.TensorSpec([2], tf.float32)}


def filled_table(n=64, capacity=64):
    table = rg.ReplayTable(SPEC, capacity=capacity, device="CPU")
    ids = np.arange(n, dtype=np.int64)
    table.append({"id": ids, "x": np.stack([ids, -ids], 1).astype(np.float32)})
    return table


def make_regression(table, seed=0, **kwargs):
    """A learner fitting w . x = id with SGD; returns (learner, w)."""
    w = tf.Variable([0.0, 0.0])

    def update(batch):
        with tf.GradientTape() as tape:
            pred = tf.linalg.matvec(batch["x"], w)
            loss = tf.reduce_mean(tf.square(pred - tf.cast(batch["id"], tf.float32)))
        w.assign_sub(1e-4 * tape.gradient(loss, w))
        return {"loss": loss, "id_mean": tf.reduce_mean(tf.cast(batch["id"], tf.float32))}

    sampler = rg.Sampler(table, seed=seed)
    return rg.Learner(table, sampler, update, **kwargs), w


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_train_runs_requested_steps_and_traces_once_for_any_step_count(jit_compile):
    learner, w = make_regression(filled_table(), batch_size=8, jit_compile=jit_compile)
    out = [learner.train(k) for k in (1, 10, 37, 3)]
    assert [o["steps"] for o in out] == [1, 10, 37, 3]
    assert learner.trace_count == 1
    assert int(learner.steps.numpy()) == 51
    assert set(out[0]) == {"steps", "loss", "id_mean"}
    assert all(np.isfinite(o["loss"]) for o in out)
    assert float(tf.norm(w)) > 0  # the update ran


def test_without_autograph_a_plain_update_trains_and_python_control_flow_on_tensors_fails():
    learner, w = make_regression(filled_table(), batch_size=8, autograph=False)
    assert learner.train(5)["steps"] == 5
    assert float(tf.norm(w)) > 0

    def branching(batch):  # a Python `if` on a tensor: only autograph turns it into tf.cond
        x = tf.reduce_mean(batch["x"])
        if x > 0:
            x = -x
        return {"x": x}

    table = filled_table()
    sampler = rg.Sampler(table)
    with pytest.raises((TypeError, tf.errors.OperatorNotAllowedInGraphError)):
        rg.Learner(table, sampler, branching, batch_size=8, autograph=False).train(1)
    assert rg.Learner(table, sampler, branching, batch_size=8).train(1)["steps"] == 1


def test_train_metrics_are_means_over_the_steps_of_the_call():
    table = filled_table()
    # every row has id 5: the mean of per-step means is exactly 5
    table.append({"id": np.full(64, 5, np.int64), "x": np.ones((64, 2), np.float32)})
    learner, _ = make_regression(table, batch_size=4)
    assert learner.train(20)["id_mean"] == pytest.approx(5.0)


def test_train_on_empty_table_raises_and_zero_steps_returns_nan_metrics():
    table = rg.ReplayTable(SPEC, capacity=8, device="CPU")
    learner, _ = make_regression(table, batch_size=4)
    with pytest.raises(EmptyTableError):
        learner.train(3)
    table.append({"id": np.arange(2), "x": np.zeros((2, 2), np.float32)})
    out = learner.train(0)
    assert out["steps"] == 0 and np.isnan(out["loss"])


def test_a_table_emptied_after_training_raises_from_a_call_that_changed_nothing(tmp_path):
    """Past the first call the graph tells emptiness (no device read before each call): on a
    table restored to an empty checkpoint, train runs no step, raises, and leaves the steps
    counter, the network and the sampler (priorities, random stream) as they were."""
    table = rg.ReplayTable(SPEC, capacity=64, device="CPU")
    sampler = rg.Sampler(table, rg.Prioritized(), seed=0)
    w = tf.Variable([0.0, 0.0])

    def update(batch):
        w.assign_add(tf.reduce_mean(batch["x"], axis=0))
        return {"x": tf.reduce_mean(batch["x"]), "priorities": tf.ones([4], tf.float64)}

    learner = rg.Learner(table, sampler, update, batch_size=4, jit_compile=True)
    rg.Checkpointer(tmp_path, table=table, sampler=sampler).save()  # empty
    table.append({"id": np.arange(64), "x": np.ones((64, 2), np.float32)})
    assert learner.train(5)["steps"] == 5
    rg.Checkpointer(tmp_path, table=table, sampler=sampler).restore()
    assert table.size == 0
    state = [v.numpy().copy() for v in (*sampler.variables, learner.steps, w)]
    with pytest.raises(EmptyTableError, match="table 'replay' is empty: append transitions"):
        learner.train(3)
    after = [v.numpy() for v in (*sampler.variables, learner.steps, w)]
    assert all(np.array_equal(a, b) for a, b in zip(state, after, strict=True))
    assert int(learner.steps.numpy()) == 5 and learner.trace_count == 1


def test_update_fn_returning_non_scalar_metric_gets_clear_error():
    table = filled_table()
    sampler = rg.Sampler(table, seed=0)
    learner = rg.Learner(table, sampler, lambda b: {"ids": b["id"]}, batch_size=4)
    with pytest.raises(rg.ConfigError, match="expected a scalar metric"):
        learner.train(1)


def test_rate_limiter_follows_hand_worked_schedule():
    # spi 4, min size 8, error buffer 16, batch 4:
    # allowed = floor((4 * (inserted - 8) + 16 - sampled) / 4) once size >= 8
    table = rg.ReplayTable(SPEC, capacity=100, device="CPU")
    limiter = rg.SampleToInsertRatio(samples_per_insert=4, min_size_to_sample=8, error_buffer=16)
    learner, _ = make_regression(table, batch_size=4, rate_limiter=limiter)

    def insert(n):
        table.append({"id": np.arange(n), "x": np.ones((n, 2), np.float32)})

    schedule = [
        (4, 10, 0),  # size 4 < 8: nothing
        (4, 10, 4),  # inserted 8: (0 + 16 - 0) / 4 = 4
        (0, 10, 0),  # (16 - 16) / 4 = 0
        (2, 1, 1),  # inserted 10: (8 + 16 - 16) / 4 = 2, asked 1
        (0, 5, 1),  # (8 + 16 - 20) / 4 = 1
        (5, 100, 5),  # inserted 15: (28 + 16 - 24) / 4 = 5
        (1, 100, 1),  # inserted 16: (32 + 16 - 44) / 4 = 1
    ]
    for inserted, asked, expected in schedule:
        if inserted:
            insert(inserted)
        assert learner.train(asked)["steps"] == expected, (inserted, asked)
    assert int(limiter.sampled.numpy()) == 48


@pytest.mark.parametrize(
    "kwargs",
    [
        {"samples_per_insert": 0, "min_size_to_sample": 1, "error_buffer": 1},
        {"samples_per_insert": 1, "min_size_to_sample": 0, "error_buffer": 1},
        {"samples_per_insert": 1, "min_size_to_sample": 1, "error_buffer": -1},
    ],
)
def test_rate_limiter_rejects_out_of_range_config(kwargs):
    with pytest.raises(rg.ConfigError):
        rg.SampleToInsertRatio(**kwargs)
