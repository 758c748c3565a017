"""Checkpointer: exact resume of sampling and learning; failed restores change nothing."""

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg

SPEC = {"id": tf.TensorSpec([], tf.int64), "x": tf.TensorSpec([2], tf.float32)}


def build(capacity=32, spec=SPEC, seed=1):
    table = rg.ReplayTable(spec, capacity=capacity, device="CPU")
    sampler = rg.UniformSampler(table, seed=seed)
    w = tf.Variable([0.5, -0.5], name="w")
    opt = tf.keras.optimizers.Adam(1e-2)

    def update(batch):
        with tf.GradientTape() as tape:
            pred = tf.linalg.matvec(batch["x"], w)
            loss = tf.reduce_mean(tf.square(pred - tf.cast(batch["id"], tf.float32)))
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return {"loss": loss, "id_sum": tf.reduce_sum(batch["id"])}

    limiter = rg.SampleToInsertRatio(samples_per_insert=64, min_size_to_sample=4, error_buffer=64)
    learner = rg.Learner(table, sampler, update, batch_size=8, rate_limiter=limiter)
    return table, sampler, learner, w, opt


def fill(table, start, n):
    ids = np.arange(start, start + n, dtype=np.int64)
    table.append({"id": ids, "x": np.stack([ids, ids * 0.5], 1).astype(np.float32)})


def test_restored_learner_draws_the_same_minibatches_and_reaches_the_same_weights(tmp_path):
    table, sampler, learner, w, opt = build()
    fill(table, 0, 40)  # wraps: capacity 32
    learner.train(5)
    rg.Checkpointer(tmp_path, table=table, sampler=sampler, learner=learner, w=w, opt=opt).save()
    expected = [learner.train(k) for k in (3, 6)]
    expected_w = w.numpy()
    expected_next = sampler.sample_indices(16).numpy()

    table2, sampler2, learner2, w2, opt2 = build(seed=99)  # another seed: the restore must win
    ckpt = rg.Checkpointer(
        tmp_path, table=table2, sampler=sampler2, learner=learner2, w=w2, opt=opt2
    )
    assert ckpt.restore() is not None
    assert table2.size == 32 and table2.total_inserted == 40
    assert int(table2.cursor.numpy()) == 8
    assert int(learner2.steps.numpy()) == 5
    assert int(learner2.rate_limiter.sampled.numpy()) == 40
    got = [learner2.train(k) for k in (3, 6)]
    assert got == expected
    np.testing.assert_array_equal(w2.numpy(), expected_w)
    np.testing.assert_array_equal(sampler2.sample_indices(16).numpy(), expected_next)


def test_restore_with_no_checkpoint_returns_none(tmp_path):
    table, sampler, *_ = build()
    assert rg.Checkpointer(tmp_path, table=table, sampler=sampler).restore() is None


@pytest.mark.parametrize(
    ("capacity", "spec", "pattern"),
    [
        (16, SPEC, r"'id': table has \(\[16\], 'int64'\), checkpoint has \(\[32\], 'int64'\)"),
        (32, {**SPEC, "x": tf.TensorSpec([3], tf.float32)}, r"'x': table has \(\[32, 3\]"),
        (
            32,
            {**SPEC, "y": tf.TensorSpec([], tf.float32)},
            r"'y': table has .* checkpoint has "
            "nothing",
        ),
    ],
    ids=["capacity", "shape", "extra-field"],
)
def test_restore_into_table_of_other_spec_fails_and_leaves_table_as_it_was(
    tmp_path, capacity, spec, pattern
):
    table, sampler, learner, *_ = build()
    fill(table, 0, 20)
    rg.Checkpointer(tmp_path, table=table, sampler=sampler, learner=learner).save()

    other, other_sampler, other_learner, *_ = build(capacity=capacity, spec=spec, seed=7)
    row = {k: np.zeros((3, *v.shape), v.dtype.as_numpy_dtype) for k, v in spec.items()}
    row["id"] = np.array([7, 8, 9])
    other.append(row)
    before = {k: v.numpy().copy() for k, v in other.storage.items()}
    state_before = other_sampler.index.generator.state.numpy().copy()
    ckpt = rg.Checkpointer(tmp_path, table=other, sampler=other_sampler, learner=other_learner)
    with pytest.raises(rg.CheckpointMismatchError, match=pattern):
        ckpt.restore()
    for k, v in other.storage.items():
        np.testing.assert_array_equal(v.numpy(), before[k])
    assert other.size == 3 and other.total_inserted == 3
    np.testing.assert_array_equal(other_sampler.index.generator.state.numpy(), state_before)


def test_restore_with_mismatched_network_rolls_back_every_variable(tmp_path):
    table, sampler, learner, w, _ = build()
    fill(table, 0, 10)
    learner.train(4)
    rg.Checkpointer(tmp_path, table=table, sampler=sampler, learner=learner, w=w).save()

    table2, sampler2, learner2, *_ = build(seed=5)
    fill(table2, 100, 3)
    ids_before = table2.storage["id"].numpy().copy()
    wrong_w = tf.Variable([1.0, 2.0, 3.0])  # saved w has shape [2]
    state_before = sampler2.index.generator.state.numpy().copy()
    ckpt = rg.Checkpointer(tmp_path, table=table2, sampler=sampler2, learner=learner2, w=wrong_w)
    with pytest.raises(rg.CheckpointMismatchError, match=r"'w': live \(\[3\], 'float32'\)"):
        ckpt.restore()
    np.testing.assert_array_equal(wrong_w.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(table2.storage["id"].numpy(), ids_before)
    assert table2.size == 3 and table2.total_inserted == 3
    np.testing.assert_array_equal(sampler2.index.generator.state.numpy(), state_before)
    assert int(learner2.steps.numpy()) == 0
