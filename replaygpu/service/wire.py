"""The ``AppendRequest`` wire format, both ways, without TensorFlow.

`encode_append_request` (the client) writes a request with one copy of the array data;
`parse_append_request` (the server) reads one without copying the data.

The server receives each AppendRequest as the raw bytes gRPC read off the socket and parses
them here, in the stream's reader thread: the header fields and tensor metadata are decoded in
Python (a few dozen varints), while every tensor's data stays a ``memoryview`` slice of the
received bytes, so ``np.frombuffer`` turns it into an array without a copy. Protobuf's own
parser would copy each multi-megabyte data field twice (into its arena, then into a new
``bytes`` on attribute access), and as a gRPC request deserializer it would run in gRPC's one
polling thread, which every stream shares.

The reader follows protobuf's wire format and merge rules: fields in any order, the last value
of a repeated scalar wins, repeated sub-messages of a singular field merge, packed and unpacked
``shape``, unknown fields (and known ones with an unexpected wire type, as protobuf
does) skipped. Anything it does not handle (group wire types) is handed to
protobuf's parser instead, so every message protobuf accepts is accepted.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replaygpu.fields import dtype_name
from replaygpu.v1 import replay_pb2

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


class WireFormatError(ValueError):
    """The bytes are not a valid serialized message."""


@dataclass
class TensorView:
    """A Tensor message whose ``data`` is a view into the received bytes."""

    dtype: str = ""
    shape: list[int] = field(default_factory=list)
    data: memoryview = field(default_factory=lambda: memoryview(b""))


@dataclass
class AppendView:
    """A parsed AppendRequest: header fields and ``(name, TensorView)`` per batch field."""

    table: str = ""
    actor_id: str = ""
    seq: int = 0
    fields: list[tuple[str, TensorView]] = field(default_factory=list)


class _Fallback(Exception):
    """A valid encoding this reader leaves to protobuf (groups)."""


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireFormatError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(number, wire type, value)``; value is an int, or (start, stop) for LEN."""
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise WireFormatError("field number 0")
        if wire_type == _VARINT:
            value, pos = _varint(buf, pos, end)
            yield number, wire_type, value
        elif wire_type == _LEN:
            size, pos = _varint(buf, pos, end)
            if size > end - pos:
                raise WireFormatError("length-delimited field runs past the end")
            yield number, wire_type, (pos, pos + size)
            pos += size
        elif wire_type in (_FIXED64, _FIXED32):
            pos += 8 if wire_type == _FIXED64 else 4
            if pos > end:
                raise WireFormatError("truncated fixed-width field")
        elif wire_type in (3, 4):
            raise _Fallback
        else:
            raise WireFormatError(f"invalid wire type {wire_type}")


def _text(buf: memoryview, span: tuple[int, int]) -> str:
    try:
        return str(buf[span[0] : span[1]], "utf-8")
    except UnicodeDecodeError as err:
        raise WireFormatError("a string field is not valid UTF-8") from err


def _tensor(buf: memoryview, start: int, end: int, out: TensorView) -> None:
    for number, wire_type, value in _fields(buf, start, end):
        if number == 1 and wire_type == _LEN:
            out.dtype = _text(buf, value)
        elif number == 2 and wire_type == _LEN:  # packed
            pos, stop = value
            while pos < stop:
                dim, pos = _varint(buf, pos, stop)
                out.shape.append(_int64(dim))
        elif number == 2 and wire_type == _VARINT:
            out.shape.append(_int64(value))
        elif number == 3 and wire_type == _LEN:
            out.data = buf[value[0] : value[1]]


def _named(buf: memoryview, start: int, end: int) -> tuple[str, TensorView]:
    name, tensor = "", TensorView()
    for number, wire_type, value in _fields(buf, start, end):
        if number == 1 and wire_type == _LEN:
            name = _text(buf, value)
        elif number == 2 and wire_type == _LEN:
            _tensor(buf, value[0], value[1], tensor)  # repeated occurrences merge
    return name, tensor


def _parse(buf: memoryview) -> AppendView:
    out = AppendView()
    for number, wire_type, value in _fields(buf, 0, len(buf)):
        if number in (1, 2) and wire_type == _LEN:
            text = _text(buf, value)
            if number == 1:
                out.table = text
            else:
                out.actor_id = text
        elif number == 3 and wire_type == _VARINT:
            out.seq = _int64(value)
        elif number == 4 and wire_type == _LEN:  # Batch; repeated occurrences merge
            for inner, inner_type, span in _fields(buf, value[0], value[1]):
                if inner == 1 and inner_type == _LEN:
                    out.fields.append(_named(buf, span[0], span[1]))
    return out


def _from_protobuf(data: bytes) -> AppendView:
    try:
        message = replay_pb2.AppendRequest.FromString(data)
    except Exception as err:  # protobuf's DecodeError
        raise WireFormatError(str(err) or "not a valid AppendRequest") from err
    out = AppendView(table=message.table, actor_id=message.actor_id, seq=int(message.seq))
    for named in message.batch.fields:
        tensor = named.tensor
        view = TensorView(tensor.dtype, [int(d) for d in tensor.shape], memoryview(tensor.data))
        out.fields.append((named.name, view))
    return out


def parse_append_request(data: bytes) -> AppendView:
    """Parse serialized AppendRequest bytes; tensor data are views into ``data``.

    Raises:
        WireFormatError: the bytes are not a valid AppendRequest.
    """
    buf = memoryview(data)
    try:
        return _parse(buf)
    except _Fallback:
        return _from_protobuf(bytes(buf))


# -- encoding ----------------------------------------------------------------------------------


def _encode_varint(value: int) -> bytes:
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
    return _encode_varint(number << 3 | 2) + _encode_varint(size)


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
