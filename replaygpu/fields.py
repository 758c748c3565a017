"""Host-side field specs and the columnar batch check, without TensorFlow.

A `HostSpec` (``{field: FieldSpec}``, from `replaygpu.specs.host_spec`, carried by ``Info``)
is the spec of all that handles transitions outside TensorFlow. `check_columns` is the one
batch check: `ReplayTable.append`, the gRPC server per request, and the client before sending.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from replaygpu.errors import BatchError

#: Fields of `specs.specs_from_env`'s transition, importable without TensorFlow.
TRANSITION_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")

#: dtype names a table field may hold and the wire carries (bfloat16 needs ml_dtypes).
DTYPE_NAMES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)


def numpy_dtype(name: str) -> np.dtype:
    """The little-endian numpy dtype of a name (`BatchError` outside `DTYPE_NAMES`)."""
    if name not in DTYPE_NAMES:
        raise BatchError(f"dtype: got {name!r}, expected one of {list(DTYPE_NAMES)}")
    if name == "bfloat16":
        import ml_dtypes  # optional, only for bfloat16 fields

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name).newbyteorder("<")


class FieldSpec(NamedTuple):
    """One field on the host: ``dtype`` a name in `DTYPE_NAMES`, ``shape`` one transition's."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype (little-endian)."""
        return numpy_dtype(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of one transition's value."""
        return self.numpy_dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))


#: ``{field: FieldSpec}`` of one transition.
HostSpec = dict[str, FieldSpec]


def row_nbytes(spec: HostSpec) -> int:
    """Bytes of one transition under ``spec``."""
    return sum(field.nbytes for field in spec.values())


#: dtype -> wire name: numpy computes ``dtype.name`` on every access (~5 us), asked per field
#: of every batch
_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """The wire name of a numpy (or TensorFlow) dtype."""
    with contextlib.suppress(KeyError, TypeError):  # not seen yet, or unhashable
        return _NAMES[dtype]
    name = getattr(dtype, "name", None) or np.dtype(dtype).name
    name = "bool" if name == "bool_" else str(name)
    if len(_NAMES) < 256:
        with contextlib.suppress(TypeError):  # an unhashable dtype-like: not cached
            _NAMES[dtype] = name
    return name


#: The most bytes a numpy array can hold (its sizes are int64).
MAX_NBYTES = 2**63 - 1


def _itemsize(name: str) -> int:
    """Bytes per element of a dtype name, without importing ml_dtypes for bfloat16."""
    return 2 if name == "bfloat16" else np.dtype(name).itemsize


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of ints, else a BatchError naming the field."""
    with contextlib.suppress(TypeError):  # an unknown rank, or not a sequence at all
        dims = list(shape)
        if all(isinstance(d, int | np.integer) for d in dims):
            return tuple(int(d) for d in dims)
    raise BatchError(
        f"field '{name}': got shape {shape!r}, expected a sequence of integer dimensions "
        "(a fully known shape)",
        field=name,
    )


def as_field_array(value: Any, dtype: str, name: str, shape: tuple[int, ...] | None) -> np.ndarray:
    """``value`` (a Python number or list, a numpy scalar or array, an eager tensor) as an array
    of ``dtype`` (a name), by the one conversion rule of every write (``append``,
    ``writer.add``, ``ReplayClient.add``/``add_batch``): a value of another dtype is converted
    when every element fits the field's dtype, else refused with the first that does not.

    Fits: into a float field, an integer or float whose conversion stays finite (a float64 is
    rounded; a NaN or inf stays one); into an integer field, an integer or integral float in
    its range; into a bool field, a bool or the integers 0 and 1; a bool only into a bool
    field. So gymnasium's numpy float64 rewards and ``terminated=0`` go in, and an overflow to
    inf, ``2`` for a bool, ``1.5`` or ``True`` for an action are refused."""
    got = getattr(value, "dtype", None)
    if got is not None and dtype_name(got) == dtype:
        return np.asarray(value)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as err:  # ragged lists, objects
        message = f"field '{name}': cannot convert {value!r} to {dtype}: {err}"
        raise BatchError(message, name) from err
    if dtype_name(array.dtype) == dtype:
        return array
    target = numpy_dtype(dtype)
    converted, why = _convert(array, target)
    if converted is not None:
        return converted
    want = f"dtype {dtype}" if shape is None else f"dtype {dtype} with shape {list(shape)}"
    raise BatchError(
        f"field '{name}': expected {want}, got dtype {dtype_name(array.dtype)} with shape "
        f"{list(array.shape)} (from {type(value).__name__}): {why}; pass values that fit {dtype}",
        field=name,
    )


def _convert(values: np.ndarray, want: np.dtype) -> tuple[np.ndarray | None, str]:
    """``(values as want, "")`` when every value fits, else ``(None, why not)``."""
    kind, name = values.dtype.kind, want.name
    if kind == "b":  # True as an action or a reward is a mix-up, not a number
        return None, "a bool goes only in a bool field"
    with np.errstate(over="ignore", invalid="ignore"):
        if want.kind == "b" and kind in "iu":
            return _checked(values, values.astype(want), (values == 0) | (values == 1), "no bool")
        if want.kind in "iu" and kind in "iuf":
            limits = np.iinfo(want)
            ok = (limits.min <= values) & (values <= limits.max)
            if kind == "f":
                ok &= np.isfinite(values) & (values == np.trunc(values))
            why = f"no integer in {name}'s [{limits.min}, {limits.max}]"
            return _checked(values, values.astype(want) if ok.all() else None, ok, why)
        if (want.kind == "f" or name == "bfloat16") and kind in "iuf":
            converted = values.astype(want)
            ok = np.isfinite(converted.astype(np.float64)) | ~np.isfinite(values)
            return _checked(values, converted, ok, f"beyond {name}'s range (it would be inf)")
    return None, f"a {values.dtype.name} does not go in a {name} field"


def _checked(
    values: np.ndarray, converted: np.ndarray | None, ok: np.ndarray, why: str
) -> tuple[np.ndarray | None, str]:
    """``converted`` where ``ok`` holds everywhere, else the first value where it does not."""
    if bool(np.all(ok)):
        return converted, ""
    first = int(np.flatnonzero(~np.asarray(ok).reshape(-1))[0])
    at = f" at {list(map(int, np.unravel_index(first, values.shape)))}" if values.ndim else ""
    return None, f"{values.reshape(-1)[first].item()!r}{at} is {why}"


def check_columns(spec: HostSpec, columns: Mapping[str, Any]) -> int:
    """Check ``columns`` (field -> arrays, or Tensor messages with a dtype name and a shape
    list) against ``spec``; n, the number of transitions. `BatchError` names the field, the
    expected and the received dtype/shape."""
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
        got_shape = _shape(name, value.shape)
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
        if got_shape[0] < 0:
            raise BatchError(
                f"field '{name}': leading dimension {got_shape[0]} is negative (shape "
                f"{list(got_shape)}); expected n >= 1 transitions first",
                field=name,
            )
        row_bytes = _itemsize(want_dtype) * math.prod(d for d in want_shape if d)
        if got_shape[0] * row_bytes > MAX_NBYTES:
            raise BatchError(
                f"field '{name}': leading dimension {got_shape[0]} would make {got_shape[0]} "
                f"transitions of {row_bytes} bytes, more than any array can hold "
                f"({MAX_NBYTES} bytes); expected the number of transitions in the batch",
                field=name,
            )
        if n is None:
            n, first = got_shape[0], name
        elif got_shape[0] != n:
            raise BatchError(
                f"field '{name}': leading dimension {got_shape[0]} differs from field '{first}' "
                f"with {n}; every field needs the same number of transitions",
                field=name,
            )
    return int(n or 0)
