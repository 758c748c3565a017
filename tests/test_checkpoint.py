"""Checkpointer: exact resume of sampling and learning; failed restores change nothing; saves
are sealed with a checksum manifest, failed saves leave nothing, corrupt ones are skipped."""

import hashlib
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from small_disk import small_filesystem

import replaygpu as rg
from replaygpu.errors import CheckpointCorruptError, CheckpointMismatchError, CheckpointSaveError
from replaygpu.service.server.ledger import SequenceLedger

SPEC = {"id": tf.TensorSpec([], tf.int64), "x": tf.TensorSpec([2], tf.float32)}


def build(capacity=32, spec=SPEC, seed=1):
    table = rg.ReplayTable(spec, capacity=capacity, device="CPU")
    sampler = rg.Sampler(table, seed=seed)
    w = tf.Variable([0.5, -0.5], name="w")
    opt = tf.keras.optimizers.Adam(1e-2)
    opt.build([w])

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
    with pytest.raises(CheckpointMismatchError, match=pattern):
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
    with pytest.raises(CheckpointMismatchError, match=r"'w': live \(\[3\], 'float32'\)"):
        ckpt.restore()
    np.testing.assert_array_equal(wrong_w.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(table2.storage["id"].numpy(), ids_before)
    assert table2.size == 3 and table2.total_inserted == 3
    np.testing.assert_array_equal(sampler2.index.generator.state.numpy(), state_before)
    assert int(learner2.steps.numpy()) == 0


def test_a_mismatched_restore_into_keras_models_names_the_layer_and_changes_no_weight(tmp_path):
    """Keras 3 variables are no `tf.Variable`s: the shape check and the rollback must see them."""
    import keras

    def net(outputs, seed):
        keras.utils.set_random_seed(seed)
        layers = [keras.Input((3,)), keras.layers.Dense(4, name="hidden")]
        return keras.Sequential([*layers, keras.layers.Dense(outputs, name="out")])

    rg.Checkpointer(tmp_path, q=net(2, 0), target=net(2, 1)).save()
    q, target = net(5, 2), net(2, 3)  # q's output layer differs; target would fit
    before = [w.copy() for w in q.get_weights() + target.get_weights()]
    with pytest.raises(CheckpointMismatchError, match=r"/out/kernel\): live \(\[4, 5\]"):
        rg.Checkpointer(tmp_path, q=q, target=target).restore()
    for old, now in zip(before, q.get_weights() + target.get_weights(), strict=True):
        np.testing.assert_array_equal(now, old)


def saved_ids(folder, capacity=32):
    """The ids in the checkpoint ``rg.Checkpointer`` restores from ``folder`` (newest intact)."""
    table = rg.ReplayTable(SPEC, capacity=capacity, device="CPU")
    path = rg.Checkpointer(str(folder), table=table).restore()
    return path, sorted(table.storage["id"].numpy()[: table.size].tolist())


def test_each_save_is_sealed_with_a_manifest_of_its_files_sizes_and_sha256(tmp_path):
    table = rg.ReplayTable(SPEC, capacity=32, device="CPU")
    fill(table, 0, 4)
    path = rg.Checkpointer(str(tmp_path), table=table).save()
    manifest = json.loads(Path(path + ".manifest.json").read_text())
    files = manifest["files"]
    assert sorted(files) == sorted(
        p.name for p in tmp_path.glob("ckpt-1.*") if "manifest" not in p.name
    )
    for name, entry in files.items():
        data = (tmp_path / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_failed_save_raises_in_one_message_and_leaves_nothing_behind(tmp_path):
    table = rg.ReplayTable(SPEC, capacity=32, device="CPU")
    fill(table, 0, 4)
    with small_filesystem(tmp_path / "disk", 1 << 20) as disk:
        ckpt = rg.Checkpointer(str(disk / "ckpt"), table=table)
        first = ckpt.save()
        before = sorted(os.listdir(disk / "ckpt"))
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        with pytest.raises(CheckpointSaveError) as failed:
            ckpt.save()
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        message = str(failed.value)
        assert f"checkpoint {disk / 'ckpt' / 'ckpt-2'}: cannot write it (" in message
        assert "Read-only file system" in message and "bytes free of" in message
        assert sorted(os.listdir(disk / "ckpt")) == before and ckpt.latest == first
        fill(table, 4, 4)
        assert ckpt.save().endswith("ckpt-2")  # the failed number is reused, none skipped
        assert saved_ids(disk / "ckpt")[1] == list(range(8))


def test_a_new_checkpointer_never_writes_over_a_checkpoint_in_its_folder(tmp_path):
    table = rg.ReplayTable(SPEC, capacity=32, device="CPU")
    fill(table, 0, 4)
    first = rg.Checkpointer(str(tmp_path), table=table).save()
    before = Path(first + ".data-00000-of-00001").read_bytes()
    fill(table, 4, 4)
    again = rg.Checkpointer(str(tmp_path), table=table)  # a new process, no restore()
    assert again.latest == first
    assert again.save().endswith("ckpt-2")
    with pytest.raises(rg.ConfigError, match=r"step=2, but .* held number 2"):
        again.save(step=2)
    assert Path(first + ".data-00000-of-00001").read_bytes() == before
    assert again.save(step=7).endswith("ckpt-7") and saved_ids(tmp_path)[1] == list(range(8))


def test_a_checkpoint_whose_save_did_not_finish_is_removed_at_start_and_never_restored(
    tmp_path, caplog
):
    table = rg.ReplayTable(SPEC, capacity=32, device="CPU")
    ckpt = rg.Checkpointer(str(tmp_path), table=table)
    fill(table, 0, 4)
    ckpt.save()
    fill(table, 4, 4)
    unfinished = ckpt.save(seal=False)  # as a kill before the seal leaves it
    assert os.path.exists(unfinished + ".index") and ckpt.latest.endswith("ckpt-1")
    path, ids = saved_ids(tmp_path)
    assert path.endswith("ckpt-1") and ids == list(range(4))
    assert "removed 2 leftovers of interrupted checkpoint saves" in caplog.text
    assert "ckpt-2.data-00000-of-00001, ckpt-2.index" in caplog.text
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["checkpoint", "ckpt-1.index", "ckpt-1.data-00000-of-00001", "ckpt-1.manifest.json"]
    )


def test_restoring_a_named_corrupt_checkpoint_raises_naming_the_file_and_restores_nothing(
    tmp_path,
):
    table = rg.ReplayTable(SPEC, capacity=32, device="CPU")
    fill(table, 0, 4)
    path = rg.Checkpointer(str(tmp_path), table=table).save()
    data = Path(path + ".data-00000-of-00001")
    flipped = bytearray(data.read_bytes())
    flipped[len(flipped) // 2] ^= 1
    data.write_bytes(bytes(flipped))
    other = rg.ReplayTable(SPEC, capacity=32, device="CPU")
    with pytest.raises(CheckpointCorruptError, match=f"{data}: its bytes changed"):
        rg.Checkpointer(str(tmp_path), table=other).restore(path)
    assert other.size == 0


def test_the_ledger_reads_the_map_older_checkpoints_hold(tmp_path):
    ledger = SequenceLedger()
    ledger.state.assign(json.dumps({"a": 3, "actors": 5}).encode())  # before journal marks
    assert ledger.snapshot() == {"a": 3, "actors": 5} and ledger.journal_segment == 0
    ledger.mark_journal(7)
    assert json.loads(ledger.state.numpy()) == {
        "actors": {"a": 3, "actors": 5},
        "journal_segment": 7,
    }
    restored = SequenceLedger()
    restored.state.assign(ledger.state.numpy())
    assert restored.last("actors") == 5 and restored.journal_segment == 7


@pytest.mark.parametrize("state", ["lost", "damaged"])
def test_a_lost_or_damaged_checkpoint_state_file_hides_no_checkpoint(tmp_path, state):
    table = rg.ReplayTable(SPEC, capacity=32, device="CPU")
    ckpt = rg.Checkpointer(str(tmp_path), table=table)
    for start in (0, 4):
        fill(table, start, 4)
        newest = ckpt.save()
    index = tmp_path / "checkpoint"  # TensorFlow's list of the checkpoints in the folder
    if state == "lost":
        index.unlink()
    else:
        index.write_text(index.read_text()[:20] + "garbage")
    assert saved_ids(tmp_path) == (newest, list(range(8)))


def test_a_checkpoint_lacking_an_object_is_refused_and_restores_nothing(tmp_path):
    table, sampler, learner, w, _ = build()
    fill(table, 0, 10)
    learner.train(4)
    rg.Checkpointer(tmp_path, table=table, sampler=sampler, learner=learner, w=w).save()

    table2, sampler2, learner2, w2, _ = build(seed=5)
    stats = tf.Variable(7, dtype=tf.int64)  # an object the saved run did not have
    objects = {"table": table2, "sampler": sampler2, "learner": learner2, "w": w2, "stats": stats}
    with pytest.raises(CheckpointMismatchError):
        rg.Checkpointer(tmp_path, **objects).restore()
    assert table2.size == 0 and int(learner2.steps.numpy()) == 0


def test_a_checkpoint_with_bool_storage_is_refused_by_name_and_restores_nothing(tmp_path):
    # Before bools were stored as uint8 (a GPU has no bool scatter with int64 indices) a table
    # saved them as bool: such a checkpoint is written here by swapping in a bool variable.
    spec = {**SPEC, "done": tf.TensorSpec([], tf.bool)}
    old = rg.ReplayTable(spec, capacity=8, device="CPU")
    old.storage["done"] = tf.Variable(tf.zeros([8], tf.bool), trainable=False, name="done")
    rg.Checkpointer(str(tmp_path), table=old).save()

    table = rg.ReplayTable(spec, capacity=8, device="CPU")
    done = np.array([False, True, False])
    table.append({"id": np.arange(3), "x": np.ones([3, 2], np.float32), "done": done})
    with pytest.raises(CheckpointMismatchError, match=r"stores bool fields \['done'\] as bool"):
        rg.Checkpointer(str(tmp_path), table=table).restore()
    assert table.size == 3
    np.testing.assert_array_equal(table.read("done", tf.range(3, dtype=tf.int64)).numpy(), done)
