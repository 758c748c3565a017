"""Nested specs flattened at the boundary: leaf paths, ``flatten`` and ``pack``.

Users give any nest of `tf.TensorSpec`, as in TF-Agents and Reverb; inside replaygpu (storage,
samplers, checkpoints, the wire) all is flat, ``{leaf path: tf.TensorSpec}``. A path joins keys
with ``'/'``: dict keys, tuple/list indexes, namedtuple field names (``obs/image``, ``obs/0``).
Batches are flattened on the way in and packed back on the way out (`pack_batch`); a flat dict
spec is its own structure.

No TensorFlow import, so the actor side can flatten nested transitions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from replaygpu.errors import ConfigError
from replaygpu.keys import DATA

#: Separator of leaf paths.
SEP = "/"


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _children(node: Any) -> list[tuple[str, Any]] | None:
    """``[(key, child)]`` of a container (dict, tuple, namedtuple, list); None for a leaf."""
    if isinstance(node, Mapping):
        return [(k, v) for k, v in node.items()]
    if _is_namedtuple(node):
        return list(zip(type(node)._fields, node, strict=True))
    if isinstance(node, (tuple, list)):
        return [(str(i), v) for i, v in enumerate(node)]
    return None


class Structure:
    """A nest kept out of `tf.Module` tracking, whose wrappers batches would come back in."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.flat = is_flat(value)


def is_flat(structure: Any) -> bool:
    """Whether ``structure`` is a flat dict (every value a leaf): its own flat spec."""
    return isinstance(structure, Mapping) and all(_children(v) is None for v in structure.values())


def flatten(structure: Any) -> dict[str, Any]:
    """``{leaf path: leaf}`` of a nest, in the nest's order (dict insertion order); `ConfigError`
    for a dict key that is not a non-empty string, or two leaves with the same path (e.g.
    ``{"a/b": x, "a": {"b": y}}``)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        children = _children(node)
        if children is None:
            if prefix in out:
                raise ConfigError(
                    f"spec: two leaves have the path '{prefix}'; rename one of them (paths "
                    f"join keys with '{SEP}')"
                )
            out[prefix] = node
            return
        for key, child in children:
            if not isinstance(key, str) or not key:
                raise ConfigError(
                    f"spec keys must be non-empty strings, got {key!r}"
                    + (f" under '{prefix}'" if prefix else "")
                )
            walk(f"{prefix}{SEP}{key}" if prefix else key, child)

    if _children(structure) is None:
        raise ConfigError(
            f"spec: got a single {type(structure).__name__}, expected a dict, tuple or "
            "namedtuple of tf.TensorSpec (any nesting); wrap it, e.g. {'obs': spec}"
        )
    walk("", structure)
    return out


def pack(structure: Any, flat: Mapping[str, Any]) -> Any:
    """``structure``'s nest with each leaf from ``flat``; containers keep their type (a dict
    type not buildable from pairs becomes a dict)."""

    def build(prefix: str, node: Any) -> Any:
        children = _children(node)
        if children is None:
            return flat[prefix]
        values = [(k, build(f"{prefix}{SEP}{k}" if prefix else k, v)) for k, v in children]
        if isinstance(node, Mapping):
            try:
                return type(node)(values)
            except TypeError:
                return dict(values)
        if _is_namedtuple(node):
            return type(node)(*(v for _, v in values))
        return type(node)(v for _, v in values)

    return build("", structure)


def flatten_batch(paths: Collection[str], batch: Any) -> Any:
    """A batch, nested or flat, as ``{leaf path: value}``. A value at a known path is a leaf
    (even a list of numbers); containers elsewhere are descended. Unmatched values keep their own
    path, and a non-container comes back as is, for the batch check to name."""
    if _children(batch) is None:
        return batch
    if isinstance(batch, Mapping) and all(key in paths for key in batch):
        return dict(batch)  # flat already (the per-step case of flat specs): no walk
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        children = None if prefix in paths else _children(node)
        if children is None or (prefix and not children):
            out[prefix] = node
            return
        for key, child in children:
            walk(f"{prefix}{SEP}{key}" if prefix else str(key), child)

    walk("", batch)
    return out


def pack_batch(structure: Any, flat: Mapping[str, Any]) -> Any:
    """A sampled flat batch in the table's structure, with the keys samplers add.

    Extra keys (``importance_weights``, ``discount``, ``nstep``, ``mask``) go beside a top-level
    dict's keys (`ConfigError` if one clashes); a top-level tuple or namedtuple with extras becomes
    ``{"data": structure, **extras}`` (`replaygpu.DATA`). A flat structure gets ``flat`` back."""
    if is_flat(structure):
        return flat
    leaves = flatten(structure)
    extras = {k: v for k, v in flat.items() if k not in leaves}
    packed = pack(structure, flat)
    if isinstance(structure, Mapping):
        clash = sorted(set(extras) & set(structure))
        if clash:
            raise ConfigError(
                f"the table's spec has top-level key(s) {clash}, key(s) its sampler adds to "
                "each batch; rename them"
            )
        return {**packed, **extras}
    return {DATA: packed, **extras} if extras else packed


def leaves_under(paths: Collection[str], name: str) -> list[str]:
    """The leaf paths at or below ``name`` (e.g. ``next_obs/position``), in ``paths`` order."""
    return [p for p in paths if p == name or p.startswith(name + SEP)]
