"""Float fields stored as float16/bfloat16: half the bytes, rounded values, spec dtypes out of
every sampler, the learner and the service, and checkpoints that keep the stored dtype."""

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.errors import BatchError, CheckpointMismatchError
from replaygpu.frames import frame_rows
from replaygpu.samplers import make_frame_spec
from replaygpu.specs import host_spec

SPEC = {
    "obs": tf.TensorSpec([3], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "reward": tf.TensorSpec([], tf.float32),
    "next_obs": tf.TensorSpec([3], tf.float32),
    "terminated": tf.TensorSpec([], tf.bool),
    "truncated": tf.TensorSpec([], tf.bool),
}
FLOATS = ("obs", "reward", "next_obs")
NUMPY = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def narrowed(dtype):
    return dict.fromkeys(FLOATS, dtype)


def episodes(n, seed=0, exact=True):
    """``n`` rows of episodes of 5 steps; with ``exact``, float values that float16 and
    bfloat16 both hold exactly (multiples of 1/4 below 64), so narrowing loses nothing."""
    rng = np.random.default_rng(seed)

    def floats(*shape):
        if exact:
            return (rng.integers(-255, 256, shape) / 4).astype(np.float32)
        return rng.normal(0, 100, shape).astype(np.float32)

    end = np.arange(n) % 5 == 4
    return {
        "obs": floats(n, 3),
        "action": rng.integers(0, 4, n),
        "reward": floats(n),
        "next_obs": floats(n, 3),
        "terminated": end & (np.arange(n) % 2 == 0),
        "truncated": end & (np.arange(n) % 2 == 1),
    }


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_narrow_storage_halves_the_bytes_and_keeps_the_spec(dtype):
    spec = {"obs": tf.TensorSpec([8], tf.float32), "next_obs": tf.TensorSpec([8], tf.float32)}
    wide = rg.ReplayTable(spec, 1000, "CPU")
    half = rg.ReplayTable(spec, 1000, "CPU", storage_dtypes={"obs": dtype, "next_obs": dtype})
    assert half.nbytes * 2 == wide.nbytes == 1000 * 16 * 4
    assert {v.dtype.name for v in half.storage.values()} == {dtype}
    assert half.spec == wide.spec
    assert host_spec(half.spec) == {"obs": ("float32", (8,)), "next_obs": ("float32", (8,))}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_values_come_back_in_the_spec_dtype_rounded_to_the_storage_precision(dtype):
    table = rg.ReplayTable(SPEC, 64, "CPU", storage_dtypes=narrowed(dtype))
    batch = episodes(64, exact=False)
    table.append(batch)
    rows = table.gather(tf.range(64, dtype=tf.int64))
    for name in FLOATS:
        got = rows[name].numpy()
        assert got.dtype == np.float32
        # the same round-to-nearest-even as numpy's (ml_dtypes') cast
        want = batch[name].astype(NUMPY[dtype]).astype(np.float32)
        np.testing.assert_array_equal(got, want)
        significand = 11 if dtype == "float16" else 8
        np.testing.assert_allclose(got, batch[name], rtol=2.0**-significand)
    np.testing.assert_array_equal(rows["action"].numpy(), batch["action"])


def test_float16_overflows_to_inf_and_bfloat16_keeps_the_float32_range():
    spec = {"x": tf.TensorSpec([4], tf.float32)}
    values = np.array([[65504.0, 70000.0, -1e6, 1e-9]], np.float32)
    half = rg.ReplayTable(spec, 4, "CPU", storage_dtypes={"x": tf.float16})
    brain = rg.ReplayTable(spec, 4, "CPU", storage_dtypes={"x": tf.bfloat16})
    for table in (half, brain):
        table.append({"x": values})
    np.testing.assert_array_equal(
        half.read("x", tf.constant([0], tf.int64)).numpy(), [[65504.0, np.inf, -np.inf, 0.0]]
    )
    got = brain.read("x", tf.constant([0], tf.int64)).numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, values, rtol=2.0**-8)


def test_appends_are_checked_against_the_spec_dtype_not_the_storage_dtype():
    """A float16 table field still holds the spec's float32 values: 1e5 fits float32 (and is
    stored as float16's inf, as float16 storage rounds), 1e39 does not and writes nothing."""
    table = rg.ReplayTable(SPEC, 16, "CPU", storage_dtypes=narrowed(tf.float16))
    batch = episodes(4)
    batch["reward"] = np.full(4, 1e39)
    with pytest.raises(BatchError, match=r"field 'reward': expected dtype float32.* 1e\+39"):
        table.append(batch)
    assert table.size == 0
    batch["reward"] = np.full(4, 1e5)  # a float64 that fits float32
    batch["obs"] = batch["obs"].astype(np.float16)  # float16 values fit float32 exactly
    table.append(batch)
    rows = table.gather(tf.range(4, dtype=tf.int64))
    np.testing.assert_array_equal(rows["obs"].numpy(), batch["obs"].astype(np.float32))
    np.testing.assert_array_equal(rows["reward"].numpy(), np.full(4, np.inf, np.float32))


@pytest.mark.parametrize(
    ("storage", "pattern"),
    [
        ({"action": tf.float16}, r"storage_dtypes\['action'\]: field 'action' is int64"),
        ({"terminated": "bfloat16"}, r"field 'terminated' is bool"),
        ({"obs": tf.int8}, r"storage_dtypes\['obs'\]: got int8, expected one of"),
        ({"obs": tf.float64}, r"got float64, expected one of \['float16', 'bfloat16'\]"),
        ({"obs": "half-ish"}, r"storage_dtypes\['obs'\]: got 'half-ish'"),
        ({"q": tf.float16}, r"got field 'q', which the spec lacks"),
        ([("obs", tf.float16)], r"storage_dtypes: got list, expected a dict"),
    ],
)
def test_bad_storage_dtypes_are_refused_before_anything_is_allocated(storage, pattern):
    with pytest.raises(rg.ConfigError, match=pattern):
        rg.ReplayTable(SPEC, 16, "CPU", storage_dtypes=storage)


def test_the_spec_dtype_itself_is_accepted_as_no_narrowing():
    table = rg.ReplayTable(SPEC, 16, "CPU", storage_dtypes={"obs": tf.float32})
    assert table.storage["obs"].dtype == tf.float32


def _samplers(table):
    return {
        "uniform": rg.Sampler(table, seed=3),
        "prioritized": rg.Sampler(table, rg.Prioritized(), seed=3),
        "nstep-uniform": rg.Sampler(table, rg.Uniform(), rg.NStep(3), seed=3),
        "nstep-prioritized": rg.Sampler(table, rg.Prioritized(), seed=3).with_view(rg.NStep(3)),
        "sequence": rg.Sampler(table, rg.Uniform(), rg.Sequence(4), seed=3),
        "sequence-padded": rg.Sampler(table, rg.Uniform(), rg.Sequence(4, pad=True), seed=3),
    }


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_sampler_returns_spec_dtypes_and_the_same_batches_as_float32_storage(dtype):
    # Values both dtypes hold exactly: narrow and wide tables must give identical batches.
    wide = rg.ReplayTable(SPEC, 100, "CPU")
    half = rg.ReplayTable(SPEC, 100, "CPU", storage_dtypes=narrowed(dtype))
    for table in (wide, half):
        table.append(episodes(130))  # wraps the ring
    wide_samplers, half_samplers = _samplers(wide), _samplers(half)
    for kind, sampler in half_samplers.items():
        indices, batch = sampler.sample(32)
        want_indices, want = wide_samplers[kind].sample(32)
        np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())
        assert set(batch) == set(want), kind
        for name, value in batch.items():
            assert value.dtype == want[name].dtype, (kind, name)
            if name in SPEC:
                assert value.dtype == SPEC[name].dtype, (kind, name)
            np.testing.assert_array_equal(value.numpy(), want[name].numpy(), err_msg=kind)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_frame_stacks_of_narrowed_float_frames_come_back_as_float32(dtype):
    spec = make_frame_spec((2, 2), frame_dtype=tf.float32)
    storage = {"frame": dtype, "reward": dtype}
    wide = rg.ReplayTable(spec, 64, "CPU")
    half = rg.ReplayTable(spec, 64, "CPU", storage_dtypes=storage)
    rng = np.random.default_rng(1)
    for start in range(0, 40, 8):
        frames = (rng.integers(0, 256, (9, 2, 2)) / 4).astype(np.float32)
        rows = frame_rows(
            frames,
            np.arange(8),
            np.full(8, 0.25),
            np.eye(8, dtype=bool)[7],
            np.zeros(8),
            start == 0,
        )
        rows["first"][0] = True  # every chunk is a new episode
        for table in (wide, half):
            table.append(rows)
    assert half.nbytes < wide.nbytes
    _, batch = rg.Sampler(half, rg.Uniform(), rg.FrameStack(3), seed=5).sample(16)
    _, want = rg.Sampler(wide, rg.Uniform(), rg.FrameStack(3), seed=5).sample(16)
    for name, value in batch.items():
        assert value.dtype == want[name].dtype, name
        np.testing.assert_array_equal(value.numpy(), want[name].numpy(), err_msg=name)
    assert batch["obs"].dtype == tf.float32 and batch["obs"].shape == (16, 3, 2, 2)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_the_learner_loop_sees_spec_dtypes_from_a_narrowed_table(jit_compile):
    table = rg.ReplayTable(SPEC, 64, "CPU", storage_dtypes=narrowed(tf.bfloat16))
    table.append(episodes(64))
    seen = {}

    def update(batch):
        seen.update({k: v.dtype for k, v in batch.items()})
        return {"obs_sum": tf.reduce_sum(batch["obs"]) + tf.reduce_sum(batch["reward"])}

    sampler = rg.Sampler(table, rg.Uniform(), rg.NStep(2), seed=0)
    learner = rg.Learner(table, sampler, update, batch_size=16, jit_compile=jit_compile)
    out = learner.train(5)
    assert out["steps"] == 5 and np.isfinite(out["obs_sum"])
    assert {k: seen[k] for k in SPEC} == {k: v.dtype for k, v in SPEC.items()}


def test_the_service_keeps_the_spec_dtype_on_the_wire_and_narrows_on_write():
    table = rg.ReplayTable(SPEC, 64, "/CPU:0", storage_dtypes=narrowed(tf.float16))
    batch = episodes(10, exact=False)
    with rg.serve(table) as server, rg.ReplayClient(server.address, actor_id="a") as client:
        assert client.spec["obs"] == ("float32", (3,))
        client.add_batch(batch)
        client.flush(timeout=30)
    assert table.size == 10
    got = table.gather(tf.range(10, dtype=tf.int64))["obs"].numpy()
    np.testing.assert_array_equal(got, batch["obs"].astype(np.float16).astype(np.float32))


def _saved_dtypes(path):
    reader = tf.train.load_checkpoint(path)
    return {
        key.split("/")[2]: dtype.name
        for key, dtype in reader.get_variable_to_dtype_map().items()
        if key.startswith("table/storage/")
    }


def test_a_checkpoint_stores_the_narrow_dtype_and_restores_into_a_like_table(tmp_path):
    table = rg.ReplayTable(SPEC, 32, "CPU", storage_dtypes=narrowed(tf.float16))
    table.append(episodes(40, exact=False))
    path = rg.Checkpointer(tmp_path, table=table).save()
    saved = _saved_dtypes(path)
    assert saved["obs"] == saved["reward"] == "float16" and saved["action"] == "int64"

    again = rg.ReplayTable(SPEC, 32, "CPU", storage_dtypes=narrowed(tf.float16))
    assert rg.Checkpointer(tmp_path, table=again).restore() == path
    assert again.size == 32 and again.total_inserted == 40
    for name, var in table.storage.items():
        np.testing.assert_array_equal(again.storage[name].numpy(), var.numpy(), err_msg=name)


@pytest.mark.parametrize(
    ("saved", "restored", "pattern"),
    [
        (
            "float16",
            None,
            r"'obs': table has \(\[32, 3\], 'float32'\), checkpoint has "
            r"\(\[32, 3\], 'float16'\)",
        ),
        (
            None,
            "bfloat16",
            r"'obs': table has \(\[32, 3\], 'bfloat16'\), checkpoint has "
            r"\(\[32, 3\], 'float32'\)",
        ),
        ("float16", "bfloat16", r"'reward': table has \(\[32\], 'bfloat16'\)"),
    ],
    ids=["float16-into-float32", "float32-into-bfloat16", "float16-into-bfloat16"],
)
def test_restoring_into_another_storage_dtype_fails_and_changes_nothing(
    tmp_path, saved, restored, pattern
):
    source = rg.ReplayTable(SPEC, 32, "CPU", storage_dtypes=saved and narrowed(saved))
    source.append(episodes(20))
    rg.Checkpointer(tmp_path, table=source).save()

    target = rg.ReplayTable(SPEC, 32, "CPU", storage_dtypes=restored and narrowed(restored))
    target.append(episodes(3, seed=9))
    before = {k: v.numpy().copy() for k, v in target.storage.items()}
    with pytest.raises(CheckpointMismatchError, match=pattern) as caught:
        rg.Checkpointer(tmp_path, table=target).restore()
    assert "storage_dtypes" in str(caught.value) and "Nothing was restored" in str(caught.value)
    for name, var in target.storage.items():
        np.testing.assert_array_equal(var.numpy(), before[name], err_msg=name)
    assert target.size == 3 and target.total_inserted == 3
