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

from replaygpu.errors import BatchError, ConfigError
from replaygpu.fields import FieldSpec, HostSpec, check_columns

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
    raise ConfigError(
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
        raise ConfigError(
            f"spec: got {type(spec).__name__}, expected a non-empty dict of tf.TensorSpec; "
            "build one with replaygpu.specs_from_env(env)"
        )
    out: Spec = {}
    for name, leaf in spec.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"spec keys must be non-empty strings, got {name!r}")
        if not isinstance(leaf, tf.TensorSpec):
            raise ConfigError(
                f"spec field '{name}': got {type(leaf).__name__}, expected tf.TensorSpec"
            )
        if not leaf.shape.is_fully_defined():
            raise ConfigError(
                f"spec field '{name}': shape {leaf.shape} has unknown dimensions; a table needs "
                "the full per-transition shape"
            )
        out[name] = tf.TensorSpec(leaf.shape, leaf.dtype, name=name)
    return out


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
    out = {
        name: value
        if hasattr(value, "dtype") or name not in spec
        else np.asarray(value, dtype=spec[name].dtype.as_numpy_dtype)
        for name, value in batch.items()
    }
    check_columns(host_spec(spec), out)
    return out


def host_spec(spec: Spec) -> HostSpec:
    """The host-side twin of a table spec: ``{field: FieldSpec(dtype name, shape)}``, what the
    server, the client, actors and chunk buffers use."""
    return {k: FieldSpec(v.dtype.name, tuple(v.shape.as_list())) for k, v in spec.items()}


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
