"""Checking a columnar batch against a table spec, without TensorFlow.

One check serves every entry point: `ReplayTable.append` (through `specs.validate_batch`), the
gRPC server on each received request, and the client before it sends (which must not import
TensorFlow). A spec here is a `WireSpec`: ``{field: (dtype name, per-transition shape)}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from replaygpu.errors import BatchError

WireSpec = dict[str, tuple[str, tuple[int, ...]]]


def dtype_name(dtype: Any) -> str:
    """The wire name of a numpy (or TensorFlow) dtype."""
    name = getattr(dtype, "name", None) or np.dtype(dtype).name
    return "bool" if name == "bool_" else str(name)


def check_columns(spec: WireSpec, columns: Mapping[str, Any]) -> int:
    """Validate columnar metadata against a wire spec; returns n, the number of transitions.

    ``columns`` maps field -> anything with ``dtype`` and ``shape`` (arrays, or Tensor messages
    whose dtype is a name and shape a list).

    Raises:
        BatchError: naming the field, the expected and the received dtype/shape.
    """
    missing = sorted(set(spec) - set(columns))
    extra = sorted(set(columns) - set(spec))
    if missing or extra:
        raise BatchError(
            f"batch fields do not match the table: missing {missing}, unexpected {extra}; "
            f"expected exactly {sorted(spec)}",
            field=(missing or extra)[0],
        )
    n: int | None = None
    first = ""
    for name, (want_dtype, want_shape) in spec.items():
        value = columns[name]
        got_dtype = value.dtype if isinstance(value.dtype, str) else dtype_name(value.dtype)
        got_shape = tuple(int(d) for d in value.shape)
        want = [None, *want_shape]
        if got_dtype != want_dtype:
            raise BatchError(
                f"field '{name}': expected dtype {want_dtype} with shape {want}, got dtype "
                f"{got_dtype} with shape {list(got_shape)}; convert it, e.g. "
                f"np.asarray(x, np.{want_dtype})",
                field=name,
            )
        if len(got_shape) != len(want) or got_shape[1:] != tuple(want_shape):
            raise BatchError(
                f"field '{name}': expected shape {want} (n transitions first), got shape "
                f"{list(got_shape)} (dtype {got_dtype})",
                field=name,
            )
        if got_shape[0] == 0:
            raise BatchError(f"field '{name}': the batch is empty (n = 0); append n >= 1", name)
        if n is None:
            n, first = got_shape[0], name
        elif got_shape[0] != n:
            raise BatchError(
                f"field '{name}': leading dimension {got_shape[0]} differs from field '{first}' "
                f"with {n}; every field needs the same number of transitions",
                field=name,
            )
    return int(n or 0)
