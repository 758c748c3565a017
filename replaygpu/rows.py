"""Transitions one at a time, without TensorFlow: the checks of a row (flat by leaf path, or
nested like the spec) and `RowBuffer`, numpy columns filled row by row at about the cost of a
numpy write. `ReplayClient.add` and `TableWriter.add` write through it."""

from __future__ import annotations

import math
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


class _NotPlain(Exception):
    """A row `RowBuffer.write` checks field by field instead."""


def _plain(dtype: np.dtype) -> tuple[type | None, float]:
    """The Python type written into a column of ``dtype`` as it is, and the largest float
    magnitude that does not overflow it (bool, int and float fields)."""
    if dtype.kind == "f":
        return float, float(np.finfo(dtype).max)
    return {"b": bool, "i": int, "u": int}.get(dtype.kind), math.inf


class RowBuffer:
    """``rows`` transitions of ``spec`` as numpy ``columns``, written one row at a time.

    `write` checks a row as `fields.check_columns` checks a batch: at once for arrays of the
    field's dtype and shape and for plain numbers of its kind, else field by field
    (`checked_row`, converting only what fits exactly), raising the `BatchError` that names
    the field. A refused row may leave values in row ``i``, which the caller does not count.
    """

    def __init__(self, spec: HostSpec, rows: int) -> None:
        self.spec = spec
        self.columns = {k: np.empty((rows, *f.shape), f.numpy_dtype) for k, f in spec.items()}
        self._layout = [
            (k, self.columns[k], np.dtype(f.numpy_dtype.type), f.shape, *_plain(f.numpy_dtype))
            for k, f in spec.items()
        ]

    def write(self, i: int, transition: Mapping[str, Any]) -> None:
        """Write ``transition`` (flat, ``{field: value of the field's shape}``) into row ``i``."""
        try:
            if len(transition) != len(self._layout):
                raise _NotPlain
            for name, column, dtype, shape, plain, largest in self._layout:
                value = transition[name]
                kind = type(value)
                if kind is np.ndarray:
                    if value.shape != shape or (value.dtype is not dtype and value.dtype != dtype):
                        raise _NotPlain
                elif kind is plain:  # an int out of range raises OverflowError
                    if shape or (kind is float and abs(value) > largest):
                        raise _NotPlain
                elif shape or not isinstance(value, np.generic) or value.dtype != dtype:
                    raise _NotPlain
                column[i] = value
        except (_NotPlain, KeyError, ValueError, TypeError, OverflowError):
            for (_, column, *_), value in zip(
                self._layout, checked_row(self.spec, transition), strict=True
            ):
                column[i] = value
