"""Numpy arrays <-> ``replaygpu.v1.Tensor`` messages, without TensorFlow.

Arrays travel as raw little-endian, C-order bytes with a numpy dtype name and a shape. Encoding
is one ``tobytes`` per field and decoding one ``np.frombuffer`` (no copy, no per-element
Python), so a batch of 16k transitions costs a handful of memcpys.

A *wire spec* is ``{field: (dtype name, per-transition shape)}``, the TensorFlow-free twin of
a table spec (`replaygpu.batch_check` validates a columnar batch against it on either side of
the wire).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from replaygpu.batch_check import WireSpec, dtype_name
from replaygpu.errors import BatchError
from replaygpu.v1 import replay_pb2

#: dtype names a table field may hold and the codec carries (bfloat16 needs ml_dtypes).
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
    """The little-endian numpy dtype of a wire dtype name.

    Raises:
        BatchError: for a name outside `DTYPE_NAMES`.
    """
    if name not in DTYPE_NAMES:
        raise BatchError(f"dtype: got {name!r}, expected one of {list(DTYPE_NAMES)}")
    if name == "bfloat16":
        import ml_dtypes  # optional, only for bfloat16 fields

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name).newbyteorder("<")


def encode_tensor(array: np.ndarray, out: replay_pb2.Tensor) -> int:
    """Fill ``out`` with ``array``; returns the number of data bytes."""
    arr = np.asarray(array)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    out.dtype = dtype_name(arr.dtype)
    out.shape[:] = arr.shape
    out.data = arr.tobytes(order="C")
    return arr.nbytes


def decode_tensor(tensor: replay_pb2.Tensor, field: str = "tensor") -> np.ndarray:
    """A read-only array view of a Tensor message's bytes.

    Raises:
        BatchError: naming ``field`` for an unknown dtype or a byte length that does not match
            the shape.
    """
    dtype = numpy_dtype(tensor.dtype)
    shape = tuple(int(d) for d in tensor.shape)
    data = tensor.data
    want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != want or any(d < 0 for d in shape):
        raise BatchError(
            f"field '{field}': {len(data)} data bytes do not fit dtype {tensor.dtype} with shape "
            f"{list(shape)} (expected {want} bytes); encode arrays with replaygpu's codec",
            field=field,
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def encode_batch(columns: Mapping[str, np.ndarray], out: replay_pb2.Batch | None = None) -> Any:
    """A ``Batch`` message of columnar arrays ``{field: [n, ...]}``."""
    batch = out if out is not None else replay_pb2.Batch()
    for name, array in columns.items():
        field = batch.fields.add()
        field.name = name
        encode_tensor(array, field.tensor)
    return batch


def decode_named(tensors: Sequence[replay_pb2.NamedTensor]) -> dict[str, np.ndarray]:
    """``{name: array}`` of repeated NamedTensor messages (a Batch's fields, weights)."""
    out: dict[str, np.ndarray] = {}
    for field in tensors:
        if field.name in out:
            raise BatchError(f"field '{field.name}' appears twice in the batch", field=field.name)
        out[field.name] = decode_tensor(field.tensor, field.name)
    return out


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, size: int) -> bytes:
    """Tag and length prefix of a length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(size)


def encode_append_request(
    table: str, actor_id: str, seq: int, columns: Mapping[str, np.ndarray]
) -> bytes:
    """A serialized ``AppendRequest``, built with one copy of the array data.

    Equivalent to filling the message and calling ``SerializeToString()`` (a test checks it),
    but the data bytes go straight from the arrays into the output: protobuf's serializer
    copies nested multi-megabyte bytes fields several times (10 ms for a 7 MB frame batch).
    """
    parts: list[Any] = []
    batch_size = 0
    for name, array in columns.items():
        arr = np.ascontiguousarray(array)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        meta = replay_pb2.Tensor(dtype=dtype_name(arr.dtype), shape=arr.shape).SerializeToString()
        data_head = _len_field(3, arr.nbytes)
        tensor_size = len(meta) + len(data_head) + arr.nbytes
        name_bytes = name.encode()
        named_head = _len_field(1, len(name_bytes)) + name_bytes + _len_field(2, tensor_size)
        named_size = len(named_head) + tensor_size
        field_head = _len_field(1, named_size)
        parts += [
            field_head,
            named_head,
            meta,
            data_head,
            memoryview(arr.reshape(-1).view(np.uint8)),
        ]
        batch_size += len(field_head) + named_size
    head = replay_pb2.AppendRequest(table=table, actor_id=actor_id, seq=seq).SerializeToString()
    return b"".join([head, _len_field(4, batch_size), *parts])


def as_field_array(value: Any, dtype: str, name: str, shape: tuple[int, ...] | None) -> np.ndarray:
    """``value`` as an array of ``dtype``: plain Python is converted, arrays must match."""
    if hasattr(value, "dtype"):
        got = dtype_name(value.dtype)
        if got != dtype:
            want = f"dtype {dtype}" if shape is None else f"dtype {dtype} with shape {list(shape)}"
            raise BatchError(
                f"field '{name}': expected {want}, got dtype {got} with shape "
                f"{list(np.shape(value))}; convert it, e.g. np.asarray(x, np.{dtype})",
                field=name,
            )
        return np.asarray(value)
    try:
        return np.asarray(value, dtype=numpy_dtype(dtype))
    except (TypeError, ValueError) as err:
        raise BatchError(
            f"field '{name}': cannot convert {value!r} to {dtype}: {err}", name
        ) from err


def wire_spec_from_proto(fields: Sequence[replay_pb2.FieldSpec]) -> WireSpec:
    """The wire spec of a table described by ``Info``."""
    return {f.name: (f.dtype, tuple(int(d) for d in f.shape)) for f in fields}


def row_nbytes(spec: WireSpec) -> int:
    """Bytes of one transition under ``spec``."""
    return sum(numpy_dtype(d).itemsize * int(np.prod(s, dtype=np.int64)) for d, s in spec.values())
