"""The checks of rows given to a `ReplayClient`: the container (flat by leaf path, or nested
like the spec) and, on the slow path of `ReplayClient.add`, each field. Imports no TensorFlow."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from replaygpu.errors import BatchError
from replaygpu.fields import HostSpec, as_field_array
from replaygpu.nest import SEP, flatten_batch


def is_nested(spec: HostSpec) -> bool:
    """Whether the fields are leaf paths of a nested structure (``obs/image``)."""
    return any(SEP in k for k in spec)


def flat_fields(spec: HostSpec, nested: bool, what: str, value: Any) -> Mapping[str, Any]:
    """A transition or columns as ``{leaf path: value}``; `BatchError` if not a dict (nor
    nested like the spec)."""
    if nested:
        value = flatten_batch(spec, value)
    if not isinstance(value, Mapping):
        like = " (or nested like the table's spec)" if nested else ""
        raise BatchError(
            f"{what}: got {type(value).__name__}, expected a dict with fields {sorted(spec)}{like}"
        )
    return value


def checked_row(spec: HostSpec, transition: Mapping[str, Any]) -> list[np.ndarray]:
    """The row's values in spec order, converted; raises `BatchError` naming the field."""
    row = []
    for name, (dtype, shape) in spec.items():
        if name not in transition:
            raise BatchError(
                f"transition fields do not match the table: missing {name!r}; expected "
                f"exactly {sorted(spec)}, got {sorted(transition)}",
                field=name,
            )
        value = as_field_array(transition[name], dtype, name, shape)
        if value.shape != shape:
            raise BatchError(
                f"field '{name}': expected shape {list(shape)}, got {list(value.shape)} "
                f"(dtype {dtype})",
                field=name,
            )
        row.append(value)
    if len(transition) != len(spec):
        extra = sorted(set(transition) - set(spec))
        raise BatchError(f"transition has unexpected fields {extra}", field=extra[0])
    return row
