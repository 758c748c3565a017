"""The ``AppendRequest`` wire format, both ways, without TensorFlow. `encode_append_request`
(client) copies the array data once; `parse_append_request` (server) decodes header and tensor
metadata in Python (a few dozen varints) and leaves each tensor's data a ``memoryview`` of the
received bytes, for ``np.frombuffer`` without a copy. Protobuf's parser would copy each
multi-megabyte data field twice (into its arena, then into a new ``bytes``).
The reader accepts exactly what protobuf's parser (upb, the Python default) accepts, with the
same values (``tests/test_wire_fuzz.py`` checks it). Protobuf's rules, as measured there:

- a tag is a varint of at most 5 bytes whose value fits 32 bits (so field numbers are below
  2**29); field number 0 is invalid in a message, wire types 6 and 7 everywhere;
- a length is a varint of at most 5 bytes, at most 2**31 - 1, and must fit in what is left of
  the enclosing message;
- any other varint has at most 10 bytes (bits above 64 are dropped); fixed-width values must fit;
- fields come in any order; the last value of a singular scalar wins; repeated occurrences of a
  singular sub-message merge; ``shape`` may be packed, unpacked or both;
- ``string`` fields (``table``, ``actor_id``, ``NamedTensor.name``, ``Tensor.dtype``) must be
  valid UTF-8, at every occurrence;
- unknown fields, and known ones with an unexpected wire type, are skipped: their contents are
  not checked, except that groups (wire types 3 and 4) must nest properly, with matching field
  numbers, and inside a group field number 0 is allowed;
- sub-messages and groups nest at most 100 deep (the top-level message is depth 0).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from replaygpu.fields import dtype_name
from replaygpu.v1 import replay_pb2

_VARINT, _FIXED64, _LEN, _START_GROUP, _END_GROUP, _FIXED32 = 0, 1, 2, 3, 4, 5
_MAX_DEPTH = 100  # protobuf's recursion limit; each sub-message and group is one level
_MAX_SIZE = 2**31 - 1  # the largest length protobuf accepts
_UINT64 = (1 << 64) - 1


class WireFormatError(ValueError):
    """The bytes are not a valid serialized message; the message names where."""


@dataclass
class TensorView:
    """A Tensor message whose ``data`` is a view into the received bytes."""

    dtype: str = ""
    shape: list[int] = field(default_factory=list)
    data: memoryview = field(default_factory=lambda: memoryview(b""))


@dataclass
class AppendView:
    """A parsed AppendRequest; ``episodes``: ``(episode_return, length)`` pairs."""

    table: str = ""
    actor_id: str = ""
    seq: int = 0
    fields: list[tuple[str, TensorView]] = field(default_factory=list)
    episodes: list[tuple[float, int]] = field(default_factory=list)


_TENSOR = {1: "dtype", 2: "shape", 3: "data"}
_NAMED = {1: "name", 2: "tensor"}
_BATCH = {1: "fields"}
_REQUEST = {1: "table", 2: "actor_id", 3: "seq", 4: "batch", 5: "episodes"}


def _error(path: str, problem: str, pos: int) -> WireFormatError:
    return WireFormatError(f"{path}: {problem} (at byte {pos})")


def _varint(
    buf: memoryview, pos: int, end: int, path: str, max_bytes: int = 10, what: str = "varint"
) -> tuple[int, int]:
    """The value modulo 2**64."""
    byte = buf[pos] if pos < end else 0x80
    if byte < 0x80:
        return byte, pos + 1
    start, result, shift = pos, 0, 0
    stop = min(end, pos + max_bytes)
    while pos < stop:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _UINT64, pos
        shift += 7
    if pos >= end and pos - start < max_bytes:
        raise _error(path, f"truncated {what}", start)
    raise _error(path, f"{what} longer than {max_bytes} bytes", start)


def _tag(buf: memoryview, pos: int, end: int, path: str) -> tuple[int, int, int]:
    value, after = _varint(buf, pos, end, path, 5, "tag varint")
    if value > 0xFFFFFFFF:
        raise _error(path, f"tag {value} does not fit 32 bits (field number >= 2**29)", pos)
    return value >> 3, value & 7, after


def _skip_value(buf: memoryview, pos: int, end: int, wire_type: int, path: str) -> int:
    if wire_type == _VARINT:
        return _varint(buf, pos, end, path)[1]
    if wire_type == _LEN:
        return _span(buf, pos, end, path)[1]
    if wire_type in (_FIXED64, _FIXED32):
        width = 8 if wire_type == _FIXED64 else 4
        if pos + width > end:
            raise _error(path, f"{width}-byte fixed-width value runs past the end", pos)
        return pos + width
    raise _error(path, f"invalid wire type {wire_type}", pos)


def _span(buf: memoryview, pos: int, end: int, path: str) -> tuple[int, int]:
    size, start = _varint(buf, pos, end, path, 5, "length varint")
    if size > _MAX_SIZE:
        raise _error(path, f"length {size} is over protobuf's limit of {_MAX_SIZE}", pos)
    if size > end - start:
        raise _error(path, f"length {size} runs past the end ({end - start} bytes left)", pos)
    return start, start + size


def _skip_group(buf: memoryview, pos: int, end: int, number: int, depth: int, path: str) -> int:
    """Inside a group protobuf checks only the framing (tags, lengths, wire types, matching
    end-group numbers, depth); field number 0 is allowed."""
    open_groups = [number]
    while open_groups:
        if pos >= end:
            raise _error(path, f"group {open_groups[-1]} has no end-group tag", pos)
        inner, wire_type, after = _tag(buf, pos, end, path)
        if wire_type == _END_GROUP:
            if inner != open_groups[-1]:
                problem = f"end-group tag of field {inner} inside group {open_groups[-1]}"
                raise _error(path, problem, pos)
            open_groups.pop()
        elif wire_type == _START_GROUP:
            if depth + len(open_groups) > _MAX_DEPTH:
                raise _error(path, f"groups nested deeper than {_MAX_DEPTH} levels", pos)
            open_groups.append(inner)
        else:
            after = _skip_value(buf, after, end, wire_type, f"{path} (group {inner})")
        pos = after
    return pos


def _fields(
    buf: memoryview, pos: int, end: int, path: str, names: dict[int, str], depth: int
) -> Iterator[tuple[int, int, Any, str]]:
    """``(number, wire type, value, path)`` of VARINT (an int) and LEN (``(start, stop)``)
    fields; others are checked and skipped (these messages have none)."""
    while pos < end:
        byte = buf[pos]
        if byte < 0x80:  # a one-byte tag, the common case
            number, wire_type, after = byte >> 3, byte & 7, pos + 1
        else:
            number, wire_type, after = _tag(buf, pos, end, path)
        name = names.get(number)
        where = path + "." + name if name else f"{path} (unknown field {number})"
        if number == 0:
            raise _error(path, "field number 0 is invalid", pos)
        if wire_type == _LEN:
            value = _span(buf, after, end, where)
            pos = value[1]
            yield number, wire_type, value, where
        elif wire_type == _VARINT:
            value, pos = _varint(buf, after, end, where)
            yield number, wire_type, value, where
        elif wire_type == _START_GROUP:
            if depth + 1 > _MAX_DEPTH:
                raise _error(where, f"groups nested deeper than {_MAX_DEPTH} levels", pos)
            pos = _skip_group(buf, after, end, number, depth + 1, where)
        elif wire_type == _END_GROUP:
            raise _error(where, "end-group tag without a start-group tag", pos)
        else:
            pos = _skip_value(buf, after, end, wire_type, where)


def _text(buf: memoryview, span: tuple[int, int], path: str) -> str:
    try:
        return str(buf[span[0] : span[1]], "utf-8")
    except UnicodeDecodeError as err:
        problem = f"string is not valid UTF-8 ({err.reason} at its byte {err.start})"
        raise _error(path, problem, span[0] + err.start) from None


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _tensor(buf: memoryview, span: tuple[int, int], path: str, out: TensorView) -> None:
    for number, wire_type, value, where in _fields(buf, *span, path, _TENSOR, 3):
        if number == 1 and wire_type == _LEN:
            out.dtype = _text(buf, value, where)
        elif number == 2 and wire_type == _LEN:  # packed
            pos, stop = value
            while pos < stop:
                dim, pos = _varint(buf, pos, stop, where)
                out.shape.append(_int64(dim))
        elif number == 2 and wire_type == _VARINT:
            out.shape.append(_int64(value))
        elif number == 3 and wire_type == _LEN:
            out.data = buf[value[0] : value[1]]


def _named(buf: memoryview, span: tuple[int, int], path: str) -> tuple[str, TensorView]:
    name, tensor = "", TensorView()
    for number, wire_type, value, where in _fields(buf, *span, path, _NAMED, 2):
        if number == 1 and wire_type == _LEN:
            name = _text(buf, value, where)
        elif number == 2 and wire_type == _LEN:
            _tensor(buf, value, where, tensor)  # repeated occurrences merge
    return name, tensor


def parse_append_request(data: bytes) -> AppendView:
    """Tensor data are views into ``data``; `WireFormatError` for an invalid AppendRequest names
    the field (e.g. ``AppendRequest.batch.fields[2].tensor.shape``) and the byte offset."""
    buf = memoryview(data)
    out = AppendView()
    for number, wire_type, value, where in _fields(buf, 0, len(buf), "AppendRequest", _REQUEST, 0):
        if number == 1 and wire_type == _LEN:
            out.table = _text(buf, value, where)
        elif number == 2 and wire_type == _LEN:
            out.actor_id = _text(buf, value, where)
        elif number == 3 and wire_type == _VARINT:
            out.seq = _int64(value)
        elif number == 4 and wire_type == _LEN:  # Batch; repeated occurrences merge
            for inner, inner_type, span, _ in _fields(buf, *value, where, _BATCH, 1):
                if inner == 1 and inner_type == _LEN:
                    index = f"{where}.fields[{len(out.fields)}]"
                    out.fields.append(_named(buf, span, index))
        elif number == 5 and wire_type == _LEN:  # a few bytes: protobuf's own parser
            try:
                episode = replay_pb2.Episode.FromString(bytes(buf[value[0] : value[1]]))
            except DecodeError as err:
                raise _error(f"{where}[{len(out.episodes)}]", str(err), value[0]) from None
            out.episodes.append((episode.episode_return, episode.length))
    return out


# -- encoding ----------------------------------------------------------------------------------


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(number: int, size: int) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(size)


def encode_append_request(
    table: str,
    actor_id: str,
    seq: int,
    columns: Mapping[str, np.ndarray],
    episodes: Sequence[tuple[float, int]] = (),
) -> bytes:
    """As ``SerializeToString()`` (a test checks it), with one copy of the array data:
    protobuf's serializer copies nested large bytes fields several times (10 ms for a 7 MB
    frame batch). ``episodes``: finished since the actor's last request."""
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
        data = memoryview(arr.reshape(-1).view(np.uint8))
        parts += [field_head, named_head, meta, data_head, data]
        batch_size += len(field_head) + named_size
    head = replay_pb2.AppendRequest(table=table, actor_id=actor_id, seq=seq).SerializeToString()
    tail = replay_pb2.AppendRequest(
        episodes=[replay_pb2.Episode(episode_return=r, length=n) for r, n in episodes]
    ).SerializeToString()  # field 5 after the batch (field 4), as protobuf orders them
    return b"".join([head, _len_field(4, batch_size), *parts, tail])
