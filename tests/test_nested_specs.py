"""Nested specs (dicts of dicts, tuples, namedtuples of tf.TensorSpec): stored one variable per
leaf path, appended nested or flat, sampled back in the same structure by every sampler, and
checkpointed per leaf; gymnasium Dict and Tuple spaces become such specs."""

import collections

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.errors import BatchError, CheckpointMismatchError
from replaygpu.fields import TRANSITION_FIELDS, FieldSpec
from replaygpu.keys import DATA, DISCOUNT, IMPORTANCE_WEIGHTS, MASK, NSTEP
from replaygpu.nest import flatten as flatten_nest
from replaygpu.sharded import mirrored_strategy
from replaygpu.specs import host_spec, specs_from_env

Pair = collections.namedtuple("Pair", ["pos", "vel"])


def dict_spec():
    """A transition whose obs / next_obs are a dict holding a tuple holding a namedtuple."""
    obs = {
        "image": tf.TensorSpec([2, 2], tf.uint8),
        "state": (
            tf.TensorSpec([3], tf.float32),
            Pair(tf.TensorSpec([], tf.float32), tf.TensorSpec([2], tf.float32)),
        ),
    }
    return {
        "obs": obs,
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
        "next_obs": obs,
        "terminated": tf.TensorSpec([], tf.bool),
        "truncated": tf.TensorSpec([], tf.bool),
    }


def dict_obs(ids):
    ids = np.asarray(ids, np.float32)
    n = len(ids)
    return {
        "image": np.repeat(ids.astype(np.uint8)[:, None, None], 4, axis=1).reshape(n, 2, 2),
        "state": (
            np.repeat(ids[:, None], 3, axis=1),
            Pair(ids.copy(), np.stack([ids, -ids], axis=1)),
        ),
    }


def dict_batch(ids, done=()):
    ids = np.asarray(ids, np.int64)
    return {
        "obs": dict_obs(ids),
        "action": ids,
        "reward": np.ones(len(ids), np.float32),
        "next_obs": dict_obs(ids + 1),
        "terminated": np.isin(ids, done),
        "truncated": np.zeros(len(ids), bool),
    }


Step = collections.namedtuple(
    "Step", ["obs", "action", "reward", "next_obs", "terminated", "truncated"]
)


def namedtuple_spec():
    spec = dict_spec()
    return Step(**spec)


def namedtuple_batch(ids, done=()):
    return Step(**dict_batch(ids, done))


def tuple_spec():
    return (
        tf.TensorSpec([], tf.int64),
        (tf.TensorSpec([2], tf.float32), tf.TensorSpec([], tf.uint8)),
    )


def tuple_batch(ids):
    ids = np.asarray(ids, np.int64)
    return (ids, (np.stack([ids, 2 * ids], 1).astype(np.float32), ids.astype(np.uint8)))


def row_ids(batch):
    """The row id every leaf of a sampled batch encodes (obs holds id, next_obs id + 1)."""
    if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
        return batch[0].numpy()
    return np.asarray(batch["action"] if isinstance(batch, dict) else batch.action)


def assert_dict_rows(batch, ids):
    """Every leaf of a dict / namedtuple transition batch holds the values of rows ``ids``."""
    get = batch.__getitem__ if isinstance(batch, dict) else lambda k: getattr(batch, k)
    ids = np.asarray(ids)
    for key, offset in (("obs", 0), ("next_obs", 1)):
        obs = get(key)
        assert isinstance(obs, dict) and sorted(obs) == ["image", "state"]
        vec, pair = obs["state"]
        assert isinstance(obs["state"], tuple) and isinstance(pair, Pair)
        want = (ids + offset).astype(np.float32)
        np.testing.assert_array_equal(obs["image"].numpy()[:, 0, 0], want.astype(np.uint8))
        np.testing.assert_array_equal(vec.numpy()[:, 2], want)
        np.testing.assert_array_equal(pair.pos.numpy(), want)
        np.testing.assert_array_equal(pair.vel.numpy()[:, 1], -want)
    np.testing.assert_array_equal(get("action").numpy(), ids)


def test_a_nested_spec_is_stored_one_variable_per_leaf_path():
    table = rg.ReplayTable(dict_spec(), 8)
    leaves = ["image", "state/0", "state/1/pos", "state/1/vel"]
    assert list(table.spec) == [
        *(f"obs/{p}" for p in leaves),
        "action",
        "reward",
        *(f"next_obs/{p}" for p in leaves),
        "terminated",
        "truncated",
    ]
    assert table.storage["obs/state/1/vel"].shape.as_list() == [8, 2]
    assert table.storage["obs/image"].dtype == tf.uint8
    assert host_spec(table.spec)["next_obs/state/0"] == FieldSpec("float32", (3,))


def test_a_flat_dict_spec_is_its_own_structure():
    spec = {"a": tf.TensorSpec([], tf.int64), "b/c": tf.TensorSpec([2], tf.float32)}
    table = rg.ReplayTable(spec, 4)
    assert table.structure is table.spec and list(table.spec) == ["a", "b/c"]
    table.append({"a": [1, 2], "b/c": np.zeros([2, 2], np.float32)})
    _, batch = rg.Sampler(table, seed=0).sample(3)
    assert type(batch) is dict and sorted(batch) == ["a", "b/c"]


@pytest.mark.parametrize(
    ("spec", "batch"),
    [
        (dict_spec, dict_batch),
        (namedtuple_spec, namedtuple_batch),
    ],
    ids=["dict_of_dicts", "namedtuple"],
)
def test_uniform_samples_come_back_in_the_spec_structure(spec, batch):
    table = rg.ReplayTable(spec(), 16)
    assert table.append(batch(np.arange(10))) == 10
    _, sampled = rg.Sampler(table, seed=3).sample(32)
    assert type(sampled) is type(spec())
    assert_dict_rows(sampled if isinstance(sampled, dict) else sampled._asdict(), row_ids(sampled))
    assert set(row_ids(sampled)) <= set(range(10))


def test_a_tuple_spec_round_trips_and_sampler_keys_go_beside_it_under_data():
    table = rg.ReplayTable(tuple_spec(), 16)
    table.append(tuple_batch(np.arange(6)))
    _, sampled = rg.Sampler(table, seed=0).sample(8)
    ids = sampled[0].numpy()
    assert isinstance(sampled, tuple) and isinstance(sampled[1], tuple)
    np.testing.assert_array_equal(sampled[1][0].numpy()[:, 1], 2 * ids)
    np.testing.assert_array_equal(sampled[1][1].numpy(), ids.astype(np.uint8))
    _, weighted = rg.Sampler(table, rg.Prioritized(), seed=0).sample(8)
    assert sorted(weighted) == [DATA, IMPORTANCE_WEIGHTS]
    ids = weighted[DATA][0].numpy()
    np.testing.assert_array_equal(weighted[DATA][1][0].numpy()[:, 0], ids)
    assert weighted[IMPORTANCE_WEIGHTS].shape == [8]


def test_append_takes_a_batch_flat_by_leaf_path_too():
    table = rg.ReplayTable(dict_spec(), 16)
    flat = flatten_nest(dict_batch(np.arange(4)))
    assert "obs/state/1/pos" in flat
    table.append(flat)
    _, sampled = rg.Sampler(table, seed=0).sample(8)
    assert_dict_rows(sampled, row_ids(sampled))


def test_prioritized_weights_sit_beside_the_nested_fields():
    table = rg.ReplayTable(dict_spec(), 16)
    table.append(dict_batch(np.arange(10)))
    sampler = rg.Sampler(table, rg.Prioritized(), seed=1)
    indices, sampled = sampler.sample(8)
    assert IMPORTANCE_WEIGHTS in sampled and sampled[IMPORTANCE_WEIGHTS].shape == [8]
    assert_dict_rows(sampled, indices.numpy())
    sampler.update_priorities(indices, tf.ones([8]))


def test_nstep_replaces_a_nested_next_obs_leaf_by_leaf():
    table = rg.ReplayTable(dict_spec(), 32)
    table.append(dict_batch(np.arange(12), done=[5]))
    indices, sampled = rg.Sampler(table, rg.Uniform(), rg.NStep(3, gamma=0.5), seed=2).sample(64)
    ids = indices.numpy()
    # rows i..i+2, stopping at the terminated row 5 and at the newest row 11
    last = np.array([min(i + 2, 5 if i <= 5 else 11) for i in ids])
    for leaf, column in (("image", None), ("state", 0)):
        got = sampled["next_obs"][leaf]
        got = got.numpy()[:, 0, 0] if column is None else got[column].numpy()[:, 0]
        np.testing.assert_array_equal(got, (last + 1).astype(got.dtype))
    np.testing.assert_array_equal(sampled["next_obs"]["state"][1].pos.numpy(), last + 1)
    np.testing.assert_array_equal(sampled["obs"]["state"][1].pos.numpy(), ids)
    steps = last - ids + 1
    np.testing.assert_array_equal(sampled[NSTEP].numpy(), steps)
    np.testing.assert_allclose(
        sampled["reward"].numpy(), [sum(0.5**j for j in range(k)) for k in steps]
    )
    np.testing.assert_allclose(
        sampled[DISCOUNT].numpy(), np.where(last == 5, 0.0, 0.5**steps), rtol=1e-6
    )


def test_nstep_over_a_prioritized_base_keeps_the_structure():
    table = rg.ReplayTable(dict_spec(), 32)
    table.append(dict_batch(np.arange(12)))
    sampler = rg.Sampler(table, rg.Prioritized(), seed=0).with_view(rg.NStep(2))
    indices, sampled = sampler.sample(16)
    assert {IMPORTANCE_WEIGHTS, DISCOUNT, NSTEP} <= set(sampled)
    np.testing.assert_array_equal(sampled["obs"]["state"][1].pos.numpy(), indices.numpy())


def test_sequence_windows_of_a_nested_spec_keep_the_structure_and_mask():
    table = rg.ReplayTable(dict_spec(), 32)
    table.append(dict_batch(np.arange(12)))
    starts, sampled = rg.Sampler(table, rg.Uniform(), rg.Sequence(3), seed=0).sample(8)
    assert sampled[MASK].shape == [8, 3]
    pos = sampled["obs"]["state"][1].pos.numpy()
    assert pos.shape == (8, 3)
    np.testing.assert_array_equal(pos, starts.numpy()[:, None] + np.arange(3))
    assert sampled["next_obs"]["image"].shape == [8, 3, 2, 2]


def test_a_learner_trains_on_nested_batches():
    table = rg.ReplayTable(dict_spec(), 32)
    table.append(dict_batch(np.arange(12)))

    def update(batch):
        vel = batch["obs"]["state"][1].vel
        return {
            "vel": tf.reduce_mean(vel[:, 0]),
            "weights": tf.reduce_mean(batch[IMPORTANCE_WEIGHTS]),
        }

    learner = rg.Learner(table, rg.Sampler(table, rg.Prioritized(), seed=0), update, batch_size=4)
    out = learner.train(5)
    assert out["steps"] == 5 and 0.0 <= out["vel"] <= 11.0 and np.isfinite(out["weights"])


def test_a_bad_nested_batch_names_the_leaf_and_writes_nothing():
    table = rg.ReplayTable(dict_spec(), 16)
    table.append(dict_batch([0]))
    bad = dict_batch([1, 2])
    bad["obs"]["image"] = bad["obs"]["image"].astype(np.float32) + 0.5  # no uint8 values
    with pytest.raises(BatchError, match=r"field 'obs/image': expected dtype uint8.*float32"):
        table.append(bad)
    missing = dict_batch([1, 2])
    del missing["next_obs"]["state"]
    with pytest.raises(BatchError, match=r"missing \['next_obs/state/0', 'next_obs/state/1/pos'"):
        table.append(missing)
    extra = dict_batch([1, 2])
    extra["obs"]["depth"] = np.zeros([2, 2], np.float32)
    with pytest.raises(BatchError, match=r"unexpected \['obs/depth'\]"):
        table.append(extra)
    assert table.size == 1 and table.total_inserted == 1


def test_a_nested_table_checkpoints_per_leaf_and_restores(tmp_path):
    table = rg.ReplayTable(dict_spec(), 16)
    sampler = rg.Sampler(table, seed=5)
    table.append(dict_batch(np.arange(7)))
    path = rg.Checkpointer(tmp_path, table=table, sampler=sampler).save()
    keys = [k for k, _ in tf.train.list_variables(path) if "/storage/" in k]
    assert "table/storage/obs.Sstate.S1.Svel/.ATTRIBUTES/VARIABLE_VALUE" in keys
    expected = sampler.sample(4)[1]

    restored = rg.ReplayTable(dict_spec(), 16)
    again = rg.Sampler(restored, seed=99)
    assert rg.Checkpointer(tmp_path, table=restored, sampler=again).restore() == path
    assert restored.size == 7
    got = again.sample(4)[1]
    tf.nest.map_structure(np.testing.assert_array_equal, got, expected)


def test_a_checkpoint_of_another_nested_spec_names_the_leaf(tmp_path):
    table = rg.ReplayTable(dict_spec(), 16)
    rg.Checkpointer(tmp_path, table=table).save()
    other = dict_spec()
    other["obs"] = {**other["obs"], "image": tf.TensorSpec([3, 3], tf.uint8)}
    with pytest.raises(CheckpointMismatchError, match=r"'obs/image': table has \(\[16, 3, 3\]"):
        rg.Checkpointer(tmp_path, table=rg.ReplayTable(other, 16)).restore()


def test_bad_nested_specs_are_refused_naming_the_path():
    with pytest.raises(
        rg.ConfigError, match=r"spec field 'obs/x': got int, expected tf.TensorSpec"
    ):
        rg.ReplayTable({"obs": {"x": 3}}, 4)
    with pytest.raises(rg.ConfigError, match=r"two leaves have the path 'a/b'"):
        rg.ReplayTable(
            {"a/b": tf.TensorSpec([], tf.int64), "a": {"b": tf.TensorSpec([], tf.int64)}}, 4
        )
    with pytest.raises(rg.ConfigError, match=r"keys must be non-empty strings, got 1 under 'obs'"):
        rg.ReplayTable({"obs": {1: tf.TensorSpec([], tf.int64)}}, 4)


class _SpaceEnv(gym.Env):
    def __init__(self, observation_space):
        self.observation_space = observation_space
        self.action_space = gym.spaces.Discrete(2)


def test_specs_from_env_nests_dict_tuple_multidiscrete_and_multibinary_spaces():
    space = gym.spaces.Dict(
        {
            "camera": gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
            "joints": gym.spaces.Tuple(
                (gym.spaces.MultiDiscrete([3, 4]), gym.spaces.MultiBinary(5))
            ),
            "mode": gym.spaces.Discrete(3),
        }
    )
    spec = specs_from_env(_SpaceEnv(space))
    assert list(spec) == list(TRANSITION_FIELDS)
    for key in ("obs", "next_obs"):
        obs = spec[key]
        assert sorted(obs) == ["camera", "joints", "mode"] and isinstance(obs["joints"], tuple)
        assert obs["camera"].dtype == tf.uint8 and obs["camera"].shape == [4, 4, 3]
        assert obs["joints"][0].dtype == tf.int64 and obs["joints"][0].shape == [2]
        assert obs["joints"][1].dtype == tf.int8 and obs["joints"][1].shape == [5]
        assert obs["mode"].dtype == tf.int64 and obs["mode"].shape == []
        assert obs["joints"][1].name == f"{key}/joints/1"
    table = rg.ReplayTable(spec, 8)
    assert "next_obs/joints/0" in table.spec and "obs/mode" in table.spec
    sample = space.sample()
    table.append(
        {
            "obs": tf.nest.map_structure(lambda x: np.asarray(x)[None], sample),
            "action": [1],
            "reward": [0.5],
            "next_obs": tf.nest.map_structure(lambda x: np.asarray(x)[None], sample),
            "terminated": [False],
            "truncated": [True],
        }
    )
    got = table.gather(tf.constant([0], tf.int64))
    np.testing.assert_array_equal(got["obs/joints/1"].numpy()[0], sample["joints"][1])


def test_a_sharded_table_takes_nested_batches_and_each_replica_samples_them_nested():
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])  # the process's (see conftest)
    table = rg.ShardedReplayTable(dict_spec(), 16, strategy)
    assert list(table.spec) == list(rg.ReplayTable(dict_spec(), 4).spec)
    table.append(dict_batch(np.arange(8)))
    assert table.shard_sizes == [4, 4]
    bad = dict_batch([1])
    bad["obs"]["image"] = bad["obs"]["image"].astype(np.int32) + 256  # beyond uint8
    with pytest.raises(BatchError, match=r"field 'obs/image'"):
        table.append(bad)
    sampler = rg.Sampler(table, rg.Prioritized(), seed=0)

    @tf.function
    def draw():
        def replica():
            _, batch = sampler.sample(4)
            return batch["obs"]["state"][1].pos, batch["action"], batch[IMPORTANCE_WEIGHTS]

        return strategy.run(replica)

    pos, action, weights = draw()
    for i, (p, a, w) in enumerate(
        zip(*(strategy.experimental_local_results(x) for x in (pos, action, weights)), strict=True)
    ):
        np.testing.assert_array_equal(p.numpy(), a.numpy().astype(np.float32))
        assert set(a.numpy() % 2) == {i} and w.shape == [4]  # rows dealt round-robin
    assert table.size == 8
