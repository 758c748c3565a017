"""Specs from gymnasium spaces, and batch validation at the boundary."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from replaygpu.errors import BatchError
from replaygpu.fields import TRANSITION_FIELDS
from replaygpu.specs import specs_from_env, validate_batch
from replaygpu.table import ReplayTable


class _SpaceEnv(gym.Env):
    def __init__(self, observation_space, action_space):
        self.observation_space = observation_space
        self.action_space = action_space


@pytest.mark.parametrize(
    ("space", "dtype", "shape"),
    [
        (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), tf.float32, [3]),
        (gym.spaces.Box(0, 255, (84, 84), np.uint8), tf.uint8, [84, 84]),
        (gym.spaces.Discrete(4), tf.int64, []),
        (gym.spaces.MultiDiscrete([3, 5]), tf.int64, [2]),
        (gym.spaces.MultiBinary(6), tf.int8, [6]),
    ],
)
def test_specs_from_env_maps_each_space_kind(space, dtype, shape):
    spec = specs_from_env(_SpaceEnv(space, space))
    assert list(spec) == list(TRANSITION_FIELDS)
    for field in ("obs", "next_obs", "action"):
        assert spec[field].dtype == dtype
        assert spec[field].shape.as_list() == shape
    assert spec["reward"].dtype == tf.float32
    assert spec["terminated"].dtype == tf.bool and spec["truncated"].dtype == tf.bool


def test_specs_from_env_reads_single_spaces_of_vector_envs():
    envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    spec = specs_from_env(envs)
    envs.close()
    assert spec["obs"].shape.as_list() == [4]
    assert spec["action"].shape.as_list() == []


def test_specs_from_env_rejects_unsupported_space_with_advice():
    # Dict and Tuple are nested specs now (tests/test_nested_specs.py); Text has no tensor form
    env = _SpaceEnv(gym.spaces.Dict({"a": gym.spaces.Text(5)}), gym.spaces.Discrete(2))
    with pytest.raises(TypeError, match=r"space for 'obs/a'.*FlattenObservation"):
        specs_from_env(env)


def test_validate_batch_converts_python_lists_to_spec_dtype():
    spec = {"r": tf.TensorSpec([], tf.float32)}
    out = validate_batch(spec, {"r": [1.0, 2.0]})
    assert out["r"].dtype == np.float32 and out["r"].shape == (2,)


@pytest.mark.parametrize(
    ("field", "value", "got", "why"),
    [
        ("action", [1.7], "float64", r"1.7 at \[0\] is no integer in int32's"),  # no rounding
        ("action", np.array([2.5]), "float64", "2.5 at"),  # arrays follow the same rule
        ("action", [True], "bool", "a bool goes only in a bool field"),  # not an action
        ("action", [2**40], "int64", "1099511627776 at"),  # out of int32's range
        ("done", [2], "int64", "2 at \\[0\\] is no bool"),  # no truthiness
        ("done", [0.0], "float64", "a float64 does not go in a bool field"),
        ("reward", [1e40], "float64", "beyond float32's range"),  # would overflow to inf
        ("reward", np.float64([0.5, -1e40]), "float64", "-1e\\+40 at \\[1\\]"),
    ],
)
def test_table_refuses_values_that_do_not_fit_the_dtype_naming_the_value(field, value, got, why):
    spec = {
        "action": tf.TensorSpec([], tf.int32),
        "done": tf.TensorSpec([], tf.bool),
        "reward": tf.TensorSpec([], tf.float32),
    }
    table = ReplayTable(spec, 8, device="/CPU:0")
    batch = {"action": [1], "done": [False], "reward": [0.5], field: value}
    if len(value) == 2:
        batch = {k: v * 2 if k != field else v for k, v in batch.items()}
    want = spec[field].dtype.name
    with pytest.raises(
        BatchError, match=rf"field '{field}': expected dtype {want}, got dtype {got}.*{why}"
    ):
        table.append(batch)
    assert table.size == 0 and table.total_inserted == 0


def test_table_converts_what_gymnasium_returns_where_it_fits():
    """numpy float64 scalars and arrays, Python ints and 0/1 for bools, integral floats for
    integers: rounded or converted, never refused (issue 49's one conversion rule)."""
    spec = {
        "action": tf.TensorSpec([], tf.int32),
        "done": tf.TensorSpec([], tf.bool),
        "reward": tf.TensorSpec([], tf.float32),
    }
    table = ReplayTable(spec, 8, device="/CPU:0")
    table.append(
        {"action": np.float64([2.0, 3.0]), "done": [0, 1], "reward": np.float64([0.1, 1e5])}
    )
    table.append({"action": np.int64([1]), "done": np.int8([1]), "reward": np.int32([7])})
    np.testing.assert_array_equal(table.storage["action"].numpy()[:3], [2, 3, 1])
    np.testing.assert_array_equal(table.storage["done"].numpy()[:3], [False, True, True])
    np.testing.assert_array_equal(table.storage["reward"].numpy()[:3], np.float32([0.1, 1e5, 7]))
    table = ReplayTable(spec, 8, device="/CPU:0")
    table.append({"action": [1, -3], "done": [True, False], "reward": [0.1, float("inf")]})
    np.testing.assert_array_equal(table.storage["action"].numpy()[:2], [1, -3])
    np.testing.assert_array_equal(table.storage["reward"].numpy()[:2], np.float32([0.1, np.inf]))
