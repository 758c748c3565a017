"""Transition specs: what a table holds, built from gymnasium spaces, and batch validation.

A spec is a flat ``dict[str, tf.TensorSpec]``; each leaf's shape is the shape of *one*
transition's field (no batch dimension). A batch for a spec is a dict with the same keys whose
values have shape ``[n] + leaf.shape`` for one shared ``n >= 1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import tensorflow as tf

from replaygpu.errors import BatchError

Spec = dict[str, tf.TensorSpec]

#: Field names of the standard transition that `specs_from_env` builds.
TRANSITION_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def space_to_spec(space: gym.Space, name: str) -> tf.TensorSpec:
    """The `tf.TensorSpec` of one element of a gymnasium space.

    Box keeps its dtype and shape (uint8 pixels stay uint8); Discrete is a scalar int64;
    MultiDiscrete is int64 of its shape; MultiBinary is int8 of its shape.

    Raises:
        TypeError: for spaces other than Box, Discrete, MultiDiscrete and MultiBinary.
    """
    if isinstance(space, gym.spaces.Box):
        return tf.TensorSpec(space.shape, tf.as_dtype(space.dtype), name=name)
    if isinstance(space, gym.spaces.Discrete):
        return tf.TensorSpec([], tf.int64, name=name)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tf.TensorSpec(space.shape, tf.int64, name=name)
    if isinstance(space, gym.spaces.MultiBinary):
        return tf.TensorSpec(space.shape, tf.int8, name=name)
    raise TypeError(
        f"space for '{name}': got {type(space).__name__}, expected Box, Discrete, MultiDiscrete "
        "or MultiBinary; flatten other spaces (gymnasium.wrappers.FlattenObservation) first"
    )


def specs_from_env(env: gym.Env | Any) -> Spec:
    """The transition spec of a gymnasium env (or vector env).

    Returns:
        ``{"obs", "action", "reward" (float32), "next_obs", "terminated" (bool),
        "truncated" (bool)}`` as `tf.TensorSpec`s of single transitions.
    """
    obs_space = getattr(env, "single_observation_space", None) or env.observation_space
    act_space = getattr(env, "single_action_space", None) or env.action_space
    obs = space_to_spec(obs_space, "obs")
    return {
        "obs": obs,
        "action": space_to_spec(act_space, "action"),
        "reward": tf.TensorSpec([], tf.float32, name="reward"),
        "next_obs": tf.TensorSpec(obs.shape, obs.dtype, name="next_obs"),
        "terminated": tf.TensorSpec([], tf.bool, name="terminated"),
        "truncated": tf.TensorSpec([], tf.bool, name="truncated"),
    }


def normalize_spec(spec: Mapping[str, Any]) -> Spec:
    """Check and copy a user spec: string keys, `tf.TensorSpec` leaves with fully known shapes."""
    if not isinstance(spec, Mapping) or not spec:
        raise TypeError(
            f"spec: got {type(spec).__name__}, expected a non-empty dict of tf.TensorSpec; "
            "build one with replaygpu.specs_from_env(env)"
        )
    out: Spec = {}
    for name, leaf in spec.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"spec keys must be non-empty strings, got {name!r}")
        if not isinstance(leaf, tf.TensorSpec):
            raise TypeError(
                f"spec field '{name}': got {type(leaf).__name__}, expected tf.TensorSpec"
            )
        if not leaf.shape.is_fully_defined():
            raise ValueError(
                f"spec field '{name}': shape {leaf.shape} has unknown dimensions; a table needs "
                "the full per-transition shape"
            )
        out[name] = tf.TensorSpec(leaf.shape, leaf.dtype, name=name)
    return out


def _describe(value: Any) -> tuple[str, tuple[int, ...]]:
    dtype = getattr(value, "dtype", None)
    name = tf.as_dtype(dtype).name if dtype is not None else type(value).__name__
    return name, tuple(int(d) for d in np.shape(value))


def validate_batch(spec: Spec, batch: Mapping[str, Any]) -> dict[str, np.ndarray | tf.Tensor]:
    """Check a batch against a spec and return it with every leaf as an array of the spec dtype.

    Values that carry a dtype (numpy arrays, tensors) must match the spec dtype exactly; plain
    Python lists and scalars are converted to it.

    Returns:
        the batch as ``{name: [n] + spec[name].shape}`` arrays or tensors.

    Raises:
        BatchError: naming the field, the expected and the received dtype/shape; for missing or
            extra fields, an empty batch, or leading dimensions that disagree.
    """
    if not isinstance(batch, Mapping):
        raise BatchError(
            f"batch: got {type(batch).__name__}, expected a dict with fields {sorted(spec)}"
        )
    missing = sorted(set(spec) - set(batch))
    extra = sorted(set(batch) - set(spec))
    if missing or extra:
        field = (missing or extra)[0]
        raise BatchError(
            f"batch fields do not match the table: missing {missing}, unexpected {extra}; "
            f"expected exactly {sorted(spec)}",
            field=field,
        )
    out: dict[str, np.ndarray | tf.Tensor] = {}
    n: int | None = None
    first = None
    for name, leaf in spec.items():
        value = batch[name]
        if not hasattr(value, "dtype"):
            value = np.asarray(value, dtype=leaf.dtype.as_numpy_dtype)
        got_dtype, got_shape = _describe(value)
        want_shape = [None, *leaf.shape.as_list()]
        if got_dtype != leaf.dtype.name:
            raise BatchError(
                f"field '{name}': expected dtype {leaf.dtype.name} with shape {want_shape}, "
                f"got dtype {got_dtype} with shape {list(got_shape)}; convert it, e.g. "
                f"np.asarray(x, np.{leaf.dtype.name})",
                field=name,
            )
        if len(got_shape) != len(want_shape) or list(got_shape[1:]) != want_shape[1:]:
            raise BatchError(
                f"field '{name}': expected shape {want_shape} (n transitions first), "
                f"got shape {list(got_shape)} (dtype {got_dtype})",
                field=name,
            )
        if got_shape[0] == 0:
            raise BatchError(f"field '{name}': the batch is empty (n = 0); append n >= 1", name)
        if n is None:
            n, first = got_shape[0], name
        elif got_shape[0] != n:
            raise BatchError(
                f"field '{name}': leading dimension {got_shape[0]} differs from field "
                f"'{first}' with {n}; every field needs the same number of transitions",
                field=name,
            )
        out[name] = value
    return out


def batch_signature(spec: Spec) -> dict[str, tf.TensorSpec]:
    """The `tf.function` input signature of a batch: each leaf with an unknown leading dim."""
    return {k: tf.TensorSpec([None, *v.shape], v.dtype, name=k) for k, v in spec.items()}


def spec_to_json(spec: Spec) -> dict[str, dict[str, Any]]:
    """A JSON-able description of a spec: ``{name: {"dtype": str, "shape": [int]}}``."""
    return {k: {"dtype": v.dtype.name, "shape": v.shape.as_list()} for k, v in spec.items()}


def spec_from_json(data: Mapping[str, Mapping[str, Any]]) -> Spec:
    """Inverse of `spec_to_json`."""
    return {
        k: tf.TensorSpec(list(v["shape"]), tf.as_dtype(v["dtype"]), name=k) for k, v in data.items()
    }
