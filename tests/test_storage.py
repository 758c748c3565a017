"""ReplayTable: ring order, oversize appends, and bad input that writes nothing."""

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.errors import BatchError

SPEC = {
    "id": tf.TensorSpec([], tf.int64),
    "obs": tf.TensorSpec([3], tf.float32),
    "frame": tf.TensorSpec([2, 2], tf.uint8),
    "done": tf.TensorSpec([], tf.bool),
}


def make_batch(start, n):
    ids = np.arange(start, start + n, dtype=np.int64)
    return {
        "id": ids,
        "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32),
        "frame": np.full((n, 2, 2), 7, np.uint8),
        "done": ids % 2 == 0,
    }


def snapshot(table):
    return {k: v.numpy().copy() for k, v in table.storage.items()} | {
        "cursor": table.cursor.numpy(),
        "size": table.size,
        "inserted": table.total_inserted,
    }


def test_append_wraps_around_and_overwrites_oldest_first():
    table = rg.ReplayTable(SPEC, capacity=5, device="CPU")
    table.append(make_batch(0, 3))
    assert table.size == 3 and int(table.cursor.numpy()) == 3
    table.append(make_batch(3, 4))  # ids 3..6: 5, 6 wrap to rows 0, 1
    np.testing.assert_array_equal(table.storage["id"].numpy(), [5, 6, 2, 3, 4])
    assert table.size == 5 and int(table.cursor.numpy()) == 2
    assert table.total_inserted == 7
    np.testing.assert_array_equal(table.storage["obs"].numpy()[:, 0], [5, 6, 2, 3, 4])


def test_append_larger_than_capacity_keeps_newest_rows_in_ring_order():
    table = rg.ReplayTable(SPEC, capacity=4, device="CPU")
    table.append(make_batch(0, 1))  # cursor at 1
    table.append(make_batch(1, 11))  # ids 1..11; newest four are 8..11
    ids = table.storage["id"].numpy()
    assert sorted(ids.tolist()) == [8, 9, 10, 11]
    # cursor = (1 + 11) % 4 = 0, so the row before it (3) holds the newest id
    assert int(table.cursor.numpy()) == 0
    np.testing.assert_array_equal(ids, [8, 9, 10, 11])
    assert table.size == 4 and table.total_inserted == 12


def test_append_traces_once_for_any_batch_size():
    table = rg.ReplayTable(SPEC, capacity=16, device="CPU")
    for n in (1, 3, 40, 7):
        table.append(make_batch(0, n))
    assert table._append_fn.experimental_get_tracing_count() == 1


def test_gather_returns_rows_at_indices():
    table = rg.ReplayTable(SPEC, capacity=8, device="CPU")
    table.append(make_batch(10, 8))
    rows = table.gather(tf.constant([7, 0, 3], tf.int64))
    np.testing.assert_array_equal(rows["id"].numpy(), [17, 10, 13])
    assert rows["frame"].shape == (3, 2, 2) and rows["frame"].dtype == tf.uint8


@pytest.mark.parametrize(
    ("mutate", "field", "pattern"),
    [
        (lambda b: b.pop("obs"), "obs", r"missing \['obs'\]"),
        (lambda b: b.update(extra=np.zeros(4)), "extra", r"unexpected \['extra'\]"),
        (
            lambda b: b.update(obs=np.full(b["obs"].shape, 1e39)),
            "obs",
            r"field 'obs': expected dtype float32, got dtype float64 .* 1e\+39 at \[0, 0\]",
        ),
        (
            lambda b: b.update(frame=np.zeros((4, 3, 2), np.uint8)),
            "frame",
            r"field 'frame': expected shape \[None, 2, 2\].* got shape \[4, 3, 2\]",
        ),
        (
            lambda b: b.update(done=np.zeros(3, bool)),
            "done",
            r"field 'done': leading dimension 3 differs from field 'id' with 4",
        ),
        (
            lambda b: b.update({k: v[:0] for k, v in b.items()}),
            "id",
            r"field 'id': the batch is empty",
        ),
    ],
    ids=["missing", "extra", "dtype", "shape", "leading-dim", "empty"],
)
def test_append_rejects_bad_batch_naming_the_field_and_writes_nothing(mutate, field, pattern):
    table = rg.ReplayTable(SPEC, capacity=6, device="CPU")
    table.append(make_batch(0, 4))
    before = snapshot(table)
    bad = make_batch(100, 4)
    mutate(bad)
    with pytest.raises(BatchError, match=pattern) as info:
        table.append(bad)
    assert info.value.field == field
    after = snapshot(table)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def test_table_rejects_bad_capacity_and_unknown_device():
    with pytest.raises(ValueError, match="capacity"):
        rg.ReplayTable(SPEC, capacity=0)
    with pytest.raises(ValueError, match="device"):
        rg.ReplayTable(SPEC, capacity=4, device="/TPU:3")


def test_table_defaults_to_cpu_without_gpu():
    table = rg.ReplayTable(SPEC, capacity=2)
    expected = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    assert table.device.endswith(f"{expected}:0")
    assert table.storage["obs"].device.endswith(f"{expected}:0")
