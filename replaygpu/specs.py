"""Transition specs: what a table holds, built from gymnasium spaces, and batch validation.

A spec is any `tf.nest` structure of `tf.TensorSpec`, each leaf the shape of *one* transition's
field. Inside the library it is flat, ``{leaf path: tf.TensorSpec}`` (``obs/image``; see
`replaygpu.nest`); a batch has the same keys, values ``[n] + leaf.shape`` with one ``n >= 1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import tensorflow as tf

from replaygpu.errors import BatchError, ConfigError
from replaygpu.fields import FieldSpec, HostSpec, as_field_array, check_columns, dtype_name
from replaygpu.nest import flatten, is_flat, pack

#: A flat spec: ``{leaf path: tf.TensorSpec}``.
Spec = dict[str, tf.TensorSpec]

#: Any nest of `tf.TensorSpec` (a flat `Spec` is one).
NestedSpec = Any


def space_to_spec(space: gym.Space, name: str) -> Any:
    """The `tf.TensorSpec` (or nest of them) of one element of a gymnasium space.

    Box keeps dtype and shape; Discrete is scalar int64; MultiDiscrete int64 and MultiBinary
    int8 of their shape; Dict and Tuple nest (leaves named by path, ``obs/position``). Other
    spaces (Text, Graph, Sequence, OneOf, ...) raise `ConfigError`."""
    if isinstance(space, gym.spaces.Box):
        return tf.TensorSpec(space.shape, tf.as_dtype(space.dtype), name=name)
    if isinstance(space, gym.spaces.Discrete):
        return tf.TensorSpec([], tf.int64, name=name)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tf.TensorSpec(space.shape, tf.int64, name=name)
    if isinstance(space, gym.spaces.MultiBinary):
        return tf.TensorSpec(space.shape, tf.int8, name=name)
    if isinstance(space, gym.spaces.Dict):
        return {k: space_to_spec(sub, f"{name}/{k}") for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(space_to_spec(sub, f"{name}/{i}") for i, sub in enumerate(space.spaces))
    raise ConfigError(
        f"space for '{name}': got {type(space).__name__}, expected Box, Discrete, MultiDiscrete, "
        "MultiBinary, or a Dict or Tuple of them; flatten other spaces "
        "(gymnasium.wrappers.FlattenObservation) first"
    )


def _renamed(spec: Any, name: str) -> Any:
    """``spec`` (a leaf or a nest) with each leaf named by its path under ``name``."""
    if isinstance(spec, tf.TensorSpec):
        return tf.TensorSpec(spec.shape, spec.dtype, name=name)
    return pack(spec, {p: _renamed(v, f"{name}/{p}") for p, v in flatten(spec).items()})


def specs_from_env(env: gym.Env | Any) -> dict[str, Any]:
    """The transition spec of a gymnasium env (or vector env): ``{"obs", "action", "reward"
    (float32), "next_obs", "terminated" (bool), "truncated" (bool)}``; ``obs`` and ``next_obs``
    nest as the observation space does.

    Shapes are one transition's: ``reward``, the flags and a Discrete action are scalars, so a
    sampled batch holds them as ``[B]``, while a Keras model's one-unit output is ``[B, 1]``:
    squeeze it (``keras.ops.squeeze(q, -1)``) before it meets them, or ``reward + gamma * q``
    broadcasts to ``[B, B]`` without an error (the learner logs a warning when it sees one)."""
    obs_space = getattr(env, "single_observation_space", None) or env.observation_space
    act_space = getattr(env, "single_action_space", None) or env.action_space
    obs = space_to_spec(obs_space, "obs")
    return {
        "obs": obs,
        "action": space_to_spec(act_space, "action"),
        "reward": tf.TensorSpec([], tf.float32, name="reward"),
        "next_obs": _renamed(obs, "next_obs"),
        "terminated": tf.TensorSpec([], tf.bool, name="terminated"),
        "truncated": tf.TensorSpec([], tf.bool, name="truncated"),
    }


def normalize_spec(spec: NestedSpec) -> Spec:
    """The flat form ``{leaf path: tf.TensorSpec}`` of a user spec (see `normalize_structure`)."""
    return normalize_structure(spec)[0]


def normalize_structure(spec: NestedSpec) -> tuple[Spec, NestedSpec]:
    """``(flat spec, structure)`` of a non-empty nest of fully known `tf.TensorSpec`, leaves
    named by path; the structure is the nest batches come back in. `ConfigError` names the leaf
    path of a leaf that is not a fully known `tf.TensorSpec`; also for non-string keys, clashing
    paths or an empty spec."""
    if not isinstance(spec, (Mapping, tuple, list)) or not spec:
        raise ConfigError(
            f"spec: got {type(spec).__name__}, expected a non-empty dict (or tuple, namedtuple, "
            "any nest) of tf.TensorSpec; build one with replaygpu.specs_from_env(env)"
        )
    out: Spec = {}
    for name, leaf in flatten(spec).items():
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
    if not out:
        raise ConfigError("spec: got a nest without any tf.TensorSpec leaf, expected at least one")
    return out, (out if is_flat(spec) else pack(spec, out))


def validate_batch(spec: Spec, batch: Mapping[str, Any]) -> dict[str, np.ndarray | tf.Tensor]:
    """The batch checked, as ``{name: [n] + spec[name].shape}`` of the spec dtypes. A value of
    another dtype is converted where every element fits the field's (`fields.as_field_array`:
    one rule for every write). `BatchError` names the field, expected and received
    dtype/shape; also for missing or extra fields, an empty batch, or disagreeing leading
    dimensions."""
    if not isinstance(batch, Mapping):
        raise BatchError(
            f"batch: got {type(batch).__name__}, expected a dict with fields {sorted(spec)}"
        )
    out = {}
    for name, value in batch.items():
        if name in spec:
            want = spec[name].dtype.name
            got = getattr(value, "dtype", None)
            if got is None or dtype_name(got) != want:  # tensors of the dtype stay tensors
                value = as_field_array(value, want, name, None)
        out[name] = value
    check_columns(host_spec(spec), out)
    return out


def _flat(spec: NestedSpec) -> Spec:
    """``spec`` itself when flat, else its flat form by leaf path."""
    return spec if is_flat(spec) else normalize_spec(spec)


def host_spec(spec: NestedSpec) -> HostSpec:
    """``{leaf path: FieldSpec(dtype name, shape)}``, the host-side spec of server, clients and
    actors."""
    spec = _flat(spec)
    return {k: FieldSpec(v.dtype.name, tuple(v.shape.as_list())) for k, v in spec.items()}


def batch_signature(spec: Spec) -> dict[str, tf.TensorSpec]:
    """The `tf.function` input signature of a batch: each leaf with an unknown leading dim."""
    return {k: tf.TensorSpec([None, *v.shape], v.dtype, name=k) for k, v in spec.items()}


def spec_to_json(spec: NestedSpec) -> dict[str, dict[str, Any]]:
    """``{leaf path: {"dtype": str, "shape": [int]}}``, JSON-able."""
    spec = _flat(spec)
    return {k: {"dtype": v.dtype.name, "shape": v.shape.as_list()} for k, v in spec.items()}


def spec_from_json(data: Mapping[str, Mapping[str, Any]]) -> Spec:
    """Inverse of `spec_to_json`."""
    return {
        k: tf.TensorSpec(list(v["shape"]), tf.as_dtype(v["dtype"]), name=k) for k, v in data.items()
    }
