"""Numpy arrays <-> ``replaygpu.v1.Tensor`` messages, without TensorFlow: raw little-endian C-order
bytes with a numpy dtype name and a shape, one ``tobytes`` per field to encode, one
``np.frombuffer`` to decode, so 16k transitions cost a handful of memcpys. The AppendRequest format
is in `append_request`, field specs and the batch check in `replaygpu.fields`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from replaygpu.errors import BatchError
from replaygpu.fields import MAX_NBYTES, FieldSpec, HostSpec, dtype_name, numpy_dtype
from replaygpu.v1 import replay_pb2


def encode_tensor(array: np.ndarray, out: replay_pb2.Tensor) -> int:
    """Returns the number of data bytes."""
    arr = np.asarray(array)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    out.dtype = dtype_name(arr.dtype)
    out.shape[:] = arr.shape
    out.data = arr.tobytes(order="C")
    return arr.nbytes


#: numpy's limits: at most 64 dimensions, sizes (zero dimensions left out) within its intp
_MAX_NDIM = 64


def decode_tensor(tensor: Any, field: str = "tensor") -> np.ndarray:
    """A read-only array view of a Tensor message's bytes (or an `append_request.TensorView`'s).

    Sizes are computed with Python integers (no wrap-around) before the array is made. Bool
    bytes must be 0 or 1 (numpy would read any other as an invalid bool).

    Raises:
        BatchError: naming ``field``, for an unknown dtype, a negative or oversized shape, a
            byte length that does not match the shape, or a bool byte other than 0 and 1.
    """
    try:
        dtype = numpy_dtype(tensor.dtype)
    except BatchError as err:
        raise BatchError(f"field '{field}': {err}", field=field) from None
    shape = [int(d) for d in tensor.shape]
    data = tensor.data
    if len(shape) > _MAX_NDIM:
        raise BatchError(
            f"field '{field}': shape has {len(shape)} dimensions, expected at most {_MAX_NDIM}",
            field=field,
        )
    negative = [d for d in shape if d < 0]
    if negative:
        raise BatchError(
            f"field '{field}': shape {shape} has a negative dimension {negative[0]}; every "
            "dimension must be >= 0",
            field=field,
        )
    nonzero = math.prod(d for d in shape if d) * dtype.itemsize
    if nonzero > MAX_NBYTES:
        raise BatchError(
            f"field '{field}': shape {shape} of dtype {tensor.dtype} would hold {nonzero} bytes, "
            f"more than any array can ({MAX_NBYTES}); send a real shape",
            field=field,
        )
    want = math.prod(shape) * dtype.itemsize
    if len(data) != want:
        raise BatchError(
            f"field '{field}': {len(data)} data bytes do not fit dtype {tensor.dtype} with shape "
            f"{shape} (expected {want} bytes); encode arrays with replaygpu's codec",
            field=field,
        )
    if dtype.kind == "b" and want:
        raw = np.frombuffer(data, np.uint8)
        if raw.max() > 1:
            index = int(np.argmax(raw > 1))
            raise BatchError(
                f"field '{field}': bool data hold byte {raw[index]:#04x} at element {index}; "
                "expected only bytes 0 (False) and 1 (True); send np.asarray(x, bool)",
                field=field,
            )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def decode_named(tensors: Sequence[replay_pb2.NamedTensor]) -> dict[str, np.ndarray]:
    """Of repeated NamedTensor messages (a Batch's fields, weights)."""
    out: dict[str, np.ndarray] = {}
    for field in tensors:
        if field.name in out:
            raise BatchError(f"field '{field.name}' appears twice in the batch", field=field.name)
        out[field.name] = decode_tensor(field.tensor, field.name)
    return out


def host_spec_from_proto(fields: Sequence[replay_pb2.FieldSpec]) -> HostSpec:
    return {f.name: FieldSpec(f.dtype, tuple(int(d) for d in f.shape)) for f in fields}
