"""Differential tests: `parse_append_request` accepts exactly the bytes protobuf's own parser
(``replay_pb2.AppendRequest.FromString``) accepts, and reads the same values from them.

Three sources of bytes: valid requests (protobuf's serializer and `encode_append_request`),
byte-level mutations of them, and structured hostile encodings (over-long varints, huge field
numbers, wrong wire types, groups, invalid UTF-8, repeated and merged fields). A fixed list of
hostile cases pins protobuf's rules down as plain parametrized tests.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaygpu.fields import DTYPE_NAMES
from replaygpu.service.wire.append_request import (
    WireFormatError,
    encode_append_request,
    parse_append_request,
)
from replaygpu.v1 import replay_pb2

_SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


def _protobuf(data: bytes) -> tuple | None:
    """The request's content as protobuf reads it, or None when protobuf rejects the bytes."""
    try:
        m = replay_pb2.AppendRequest.FromString(data)
    except Exception:  # protobuf's DecodeError
        return None
    fields = [(f.name, f.tensor.dtype, list(f.tensor.shape), f.tensor.data) for f in m.batch.fields]
    return m.table, m.actor_id, m.seq, fields


def _wire(data: bytes) -> tuple | None:
    """The request's content as `parse_append_request` reads it, or None on rejection."""
    try:
        view = parse_append_request(data)
    except WireFormatError as err:
        assert str(err).startswith("AppendRequest"), f"error does not name the field: {err}"
        return None
    fields = [(n, t.dtype, list(t.shape), bytes(t.data)) for n, t in view.fields]
    return view.table, view.actor_id, view.seq, fields


def _assert_same(data: bytes) -> tuple | None:
    want = _protobuf(data)
    got = _wire(data)
    verdict = {None: "rejects"}
    assert got == want, (
        f"bytes {data[:200].hex()}: protobuf {verdict.get(want, 'accepts')} "
        f"({want!r:.300}), wire {verdict.get(got, 'accepts')} ({got!r:.300})"
    )
    return want


# -- encoding helpers --------------------------------------------------------------------------


def _varint(value: int, size: int = 0) -> bytes:
    """``value`` as a varint, padded with continuation bytes to ``size`` bytes when larger."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value or len(out) + 1 < size:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, wire_type: int, size: int = 0) -> bytes:
    return _varint(number << 3 | wire_type, size)


def _len(number: int, payload: bytes, size: int = 0) -> bytes:
    return _tag(number, 2) + _varint(len(payload), size) + payload


def _group(number: int, body: bytes = b"") -> bytes:
    return _tag(number, 3) + body + _tag(number, 4)


def _nested(depth: int, number: int = 9) -> bytes:
    return _tag(number, 3) * depth + _tag(number, 4) * depth


def _in_tensor(body: bytes) -> bytes:
    return _len(4, _len(1, _len(1, b"obs") + _len(2, body)))


def _in_named(body: bytes) -> bytes:
    return _len(4, _len(1, body))


def _in_batch(body: bytes) -> bytes:
    return _len(4, body)


_WRAPS = {"request": lambda b: b, "batch": _in_batch, "named": _in_named, "tensor": _in_tensor}
_DEPTH = {"request": 0, "batch": 1, "named": 2, "tensor": 3}

# -- (a) valid requests ------------------------------------------------------------------------

_text = st.text(max_size=8)
_int64 = st.integers(-(2**63), 2**63 - 1)
_tensors = st.builds(
    replay_pb2.Tensor,
    dtype=st.one_of(st.sampled_from(DTYPE_NAMES), _text),
    shape=st.lists(_int64 | st.integers(0, 300), max_size=4),
    data=st.binary(max_size=64),
)
_requests = st.builds(
    replay_pb2.AppendRequest,
    table=_text,
    actor_id=_text,
    seq=_int64,
    batch=st.builds(
        replay_pb2.Batch,
        fields=st.lists(st.builds(replay_pb2.NamedTensor, name=_text, tensor=_tensors), max_size=3),
    ),
)


@st.composite
def _encoded_requests(draw: st.DrawFn) -> bytes:
    """A request written by `encode_append_request` from random arrays."""
    n = draw(st.integers(1, 4))
    columns = {}
    for name in draw(st.lists(st.text(min_size=1, max_size=6), max_size=3, unique=True)):
        dtype = draw(st.sampled_from(["uint8", "int64", "float32", "bool", ">i4"]))
        extra = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
        count = n * int(np.prod(extra))
        raw = draw(st.binary(min_size=count, max_size=count))
        columns[name] = np.frombuffer(raw, np.uint8).astype(dtype).reshape((n, *extra))
    return encode_append_request(draw(_text), draw(_text), draw(_int64), columns)


_valid = st.one_of(_requests.map(lambda m: m.SerializeToString()), _encoded_requests())


@settings(max_examples=300, **_SETTINGS)
@given(_valid)
def test_valid_requests_parse_like_protobuf(data):
    assert _assert_same(data) is not None


# -- (b) byte-level mutations ------------------------------------------------------------------


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(_valid))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "copy"]))
        pos = draw(st.integers(0, len(data)))
        if kind == "flip" and pos < len(data):
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and pos < len(data):
            data[pos] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]) | st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4) | st.just(b"\x80" * 5))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 4))]
        elif kind == "truncate":
            del data[pos:]
        elif kind == "copy":  # repeats a stretch: duplicated fields, merges, misframing
            stop = draw(st.integers(pos, len(data)))
            data[stop:stop] = data[pos:stop]
    return bytes(data)


@settings(max_examples=700, **_SETTINGS)
@given(_mutated())
def test_mutated_requests_are_accepted_and_read_like_protobuf(data):
    _assert_same(data)


# -- (c) structured hostile encodings ----------------------------------------------------------

_SCHEMA = {
    "request": {1: "string", 2: "string", 3: "int64", 4: "batch"},
    "batch": {1: "named"},
    "named": {1: "string", 2: "tensor"},
    "tensor": {1: "string", 2: "shape", 3: "bytes"},
}
_NUMBERS = [1, 2, 3, 4, 5, 9, 15, 16, 2**29 - 1] * 6 + [0, 2**29, 2**32 // 8 + 1, 2**32, 2**61]
_BAD_UTF8 = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"a\x80"]
_values = st.one_of(
    st.integers(0, 300), st.integers(0, 2**64 - 1), st.integers(2**64, 2**70), st.just(2**63)
)


def _mostly(usual: object, *unusual: object, weight: int = 9) -> st.SearchStrategy:
    """``usual`` about ``weight`` times as often as each of ``unusual``."""
    return st.sampled_from([usual] * weight + list(unusual))


# minimal, padded within protobuf's limits, or over them (tags and lengths: 5 bytes)
_varint_size = _mostly(0, 2, 5, 6, 10, 11, weight=100)


@st.composite
def _string(draw: st.DrawFn) -> bytes:
    text = draw(st.text(max_size=6)).encode()
    if draw(_mostly(True, False, weight=15)):
        return text
    return text + draw(st.sampled_from(_BAD_UTF8)) + draw(st.binary(max_size=2))


@st.composite
def _group_body(draw: st.DrawFn, depth: int) -> bytes:
    """The inside of an unknown group: any framing, field 0 included, maybe nested groups."""
    parts = []
    for _ in range(draw(st.integers(0, 3))):
        number = draw(st.sampled_from([0, 1, 4, 9, 2**29 - 1]))
        wire_type = draw(st.sampled_from([0, 1, 2, 3, 5] * 8 + [4, 6]))
        if wire_type == 3 and depth < 3:
            parts.append(_tag(number, 3) + draw(_group_body(depth + 1)) + _tag(number, 4))
        elif wire_type in (3, 4, 6):
            parts.append(_tag(number, wire_type))
        else:
            parts.append(draw(_value(number, wire_type, "unknown", depth)))
    return b"".join(parts)


@st.composite
def _value(draw: st.DrawFn, number: int, wire_type: int, kind: str, depth: int) -> bytes:
    """A tag and value of field ``number``, read as ``kind``; tags and lengths maybe padded."""
    tag = _tag(number, wire_type, draw(_varint_size))
    if wire_type == 0:
        return tag + _varint(draw(_values), draw(_varint_size))
    if wire_type in (1, 5):
        width = 8 if wire_type == 1 else 4
        return tag + draw(st.binary(min_size=width, max_size=width) | st.binary(max_size=width))
    if wire_type == 3:
        end = draw(_mostly(number, number + 1, 0, weight=15))
        return tag + draw(_group_body(0)) + draw(_mostly(_tag(end, 4), b"", weight=15))
    if wire_type != 2:
        return tag + draw(st.binary(max_size=2))
    if kind == "string":
        payload = draw(_string())
    elif kind == "shape":
        dims = draw(st.lists(_values, max_size=3))
        payload = b"".join(_varint(v, draw(_varint_size)) for v in dims)
    elif kind in _SCHEMA and depth < 4:
        payload = draw(_message(kind, depth + 1))
    else:
        payload = draw(st.binary(max_size=8))
    size = draw(
        _mostly(len(payload), len(payload) - 1, len(payload) + 1, 2**31 - 1, 2**31, weight=30)
    )
    size = max(size, 0)
    return tag + _varint(size, draw(_varint_size)) + payload


_RIGHT_WIRE_TYPE = {"string": 2, "int64": 0, "shape": 2, "bytes": 2}


@st.composite
def _message(draw: st.DrawFn, level: str, depth: int = 0) -> bytes:
    """A message at ``level`` mixing right and hostile encodings of its fields."""
    schema = _SCHEMA[level]
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 3)):  # a known field, mostly with its wire type
            number = draw(st.sampled_from(sorted(schema)))
            kind = schema[number]
            right = 0 if kind == "shape" and draw(st.booleans()) else _RIGHT_WIRE_TYPE.get(kind, 2)
            wire_type = draw(st.sampled_from([right] * 40 + list(range(8))))
        else:
            number = draw(st.sampled_from(_NUMBERS))
            kind = schema.get(number, "unknown")
            wire_type = draw(st.sampled_from([0, 1, 2, 3, 5] * 8 + [4, 6, 7]))
        parts.append(draw(_value(number, wire_type, kind, depth)))
    return b"".join(parts)


@settings(max_examples=500, **_SETTINGS)
@given(_message("request"))
def test_hostile_encodings_are_accepted_and_read_like_protobuf(data):
    _assert_same(data)


@settings(max_examples=300, **_SETTINGS)
@given(st.binary(max_size=40))
def test_random_bytes_are_accepted_and_read_like_protobuf(data):
    _assert_same(data)


# -- fixed regression cases --------------------------------------------------------------------

_BIG = _len(1, b"x" * 10)  # a field to pad around
_CASES = {
    # tags: at most 5 bytes, value within 32 bits
    "tag padded to 5 bytes": (_tag(3, 0, 5) + b"\x05", True),
    "tag padded to 6 bytes": (_tag(3, 0, 6) + b"\x05", False),
    "tag padded to 11 bytes": (_tag(3, 0, 11) + b"\x05", False),
    "tag above 32 bits in 5 bytes": (b"\x98\x80\x80\x80\x10\x05", False),
    "field number 2**29-1": (_tag(2**29 - 1, 0) + b"\x05", True),
    "field number 2**29": (_tag(2**29, 0) + b"\x05", False),
    "field number 2**32": (_tag(2**32, 0) + b"\x05", False),
    "tag truncated": (b"\x98\x80", False),
    "field number 0 varint": (b"\x00\x05", False),
    "field number 0 group": (b"\x03\x04", False),
    "wire type 6": (_tag(9, 6) + b"\0" * 8, False),
    "wire type 7": (_tag(9, 7) + b"\0" * 8, False),
    # lengths: at most 5 bytes, at most 2**31 - 1, within the message
    "length padded to 5 bytes": (_len(1, b"abc", 5), True),
    "length padded to 6 bytes": (_len(1, b"abc", 6), False),
    "length 2**31-1 past the end": (_tag(9, 2) + _varint(2**31 - 1) + b"abc", False),
    "length 2**31": (_tag(9, 2) + _varint(2**31) + b"abc", False),
    "length one past the end": (_tag(1, 2) + b"\x04abc", False),
    # values: at most 10 bytes; bits above 64 dropped
    "value padded to 10 bytes": (_tag(3, 0) + _varint(5, 10), True),
    "value padded to 11 bytes": (_tag(3, 0) + _varint(5, 11), False),
    "value 10th byte 0x7f": (_tag(3, 0) + b"\xff" * 9 + b"\x7f", True),
    "value 10th byte 0x02": (_tag(3, 0) + b"\xff" * 9 + b"\x02", True),
    "value truncated": (_tag(3, 0) + b"\xff", False),
    "fixed64 truncated": (_tag(9, 1) + b"\0" * 7, False),
    "fixed32 truncated": (_tag(9, 5) + b"\0" * 3, False),
    # known fields with another wire type are unknown fields
    "table as varint": (_tag(1, 0) + b"\x05" + _BIG, True),
    "seq as length-delimited": (_len(3, b"\x05"), True),
    "batch as varint": (_tag(4, 0) + b"\x05", True),
    "batch as group": (_group(4, _len(1, b"")), True),
    "tensor as fixed64": (_in_named(_tag(2, 1) + b"\0" * 8), True),
    "shape as fixed32": (_in_tensor(_tag(2, 5) + b"\0" * 4), True),
    "data as varint": (_in_tensor(_tag(3, 0) + b"\x01"), True),
    # shape: packed, unpacked, both
    "shape packed and unpacked": (
        _in_tensor(_tag(2, 0) + b"\x02" + _len(2, b"\x03\x7f") + _tag(2, 0) + b"\x04"),
        True,
    ),
    "shape packed 10-byte dim": (_in_tensor(_len(2, b"\xff" * 9 + b"\x01")), True),
    "shape packed 11-byte dim": (_in_tensor(_len(2, _varint(1, 11))), False),
    "shape packed dim crossing its end": (_in_tensor(_len(2, b"\x80") + b"\x01"), False),
    "shape packed length padded to 6": (_in_tensor(_len(2, b"\x01", 6)), False),
    # merging: last scalar wins, sub-messages merge
    "repeated singular fields": (_len(1, b"a") + _tag(3, 0) + b"\x01" + _len(1, b"b"), True),
    "batch in two parts": (_in_batch(_len(1, b"")) + _in_batch(_len(1, _len(1, b"x"))), True),
    "tensor in two parts": (
        _in_named(
            _len(1, b"obs")
            + _len(2, _len(1, b"uint8") + _tag(2, 0) + b"\x02" + _len(3, b"ab"))
            + _len(2, _len(2, b"\x03") + _len(3, b"abcdef") + _len(1, b"int8"))
        ),
        True,
    ),
    # UTF-8 in every string field, also when a later occurrence overrides it
    "table bad UTF-8": (_len(1, b"\xff"), False),
    "actor_id surrogate": (_len(2, b"\xed\xa0\x80"), False),
    "name overlong": (_in_named(_len(1, b"\xc0\x80")), False),
    "dtype above U+10FFFF": (_in_tensor(_len(1, b"\xf4\x90\x80\x80")), False),
    "table bad UTF-8 then good": (_len(1, b"\xe2\x82") + _len(1, b"ok"), False),
    "NUL in a string": (_len(1, b"a\x00b"), True),
    "bad UTF-8 in an unknown field": (_len(9, b"\xff"), True),
    "bad UTF-8 in data": (_in_tensor(_len(3, b"\xff")), True),
    "bad UTF-8 in a group": (_group(9, _len(1, b"\xff")), True),
    # groups
    "group": (_group(9, _tag(1, 0) + b"\x04") + _tag(3, 0) + b"\x09", True),
    "group end number differs": (_tag(9, 3) + _tag(10, 4), False),
    "group unterminated": (_tag(9, 3), False),
    "groups misnested": (_tag(9, 3) + _tag(10, 3) + _tag(9, 4) + _tag(10, 4), False),
    "end-group alone": (_tag(9, 4), False),
    "end-group alone in tensor": (_in_tensor(_tag(9, 4)), False),
    "group crossing a message's end": (_in_batch(_tag(9, 3)) + _tag(9, 4), False),
    "group number 2**29-1": (_group(2**29 - 1), True),
    "group end tag padded to 5 bytes": (_tag(9, 3) + _tag(9, 4, 5), True),
    "group end tag padded to 6 bytes": (_tag(9, 3) + _tag(9, 4, 6), False),
    "field 0 inside a group": (_group(9, b"\x00\x00\x02\x00\x03\x04"), True),
    "wire type 7 inside a group": (_group(9, _tag(1, 7)), False),
    "length past the end inside a group": (_group(9, _tag(1, 2) + b"\x05x"), False),
    "end-group tag as a length-delimited value's data": (_group(9, _len(1, _tag(9, 4))), True),
    "group in tensor": (_in_tensor(_group(9, b"\x00\x00") + _len(1, b"uint8")), True),
}
for _level, _depth in _DEPTH.items():
    _limit = 100 - _depth
    _CASES[f"groups {_limit} deep in {_level}"] = (_WRAPS[_level](_nested(_limit)), True)
    _CASES[f"groups {_limit + 1} deep in {_level}"] = (_WRAPS[_level](_nested(_limit + 1)), False)
    _CASES[f"field number 0 in {_level}"] = (_WRAPS[_level](b"\x00\x00"), False)
    _CASES[f"wire type 6 in {_level}"] = (_WRAPS[_level](_tag(9, 6)), False)
    _CASES[f"tag padded to 6 bytes in {_level}"] = (_WRAPS[_level](_tag(9, 0, 6) + b"\x00"), False)


@pytest.mark.parametrize(("data", "accepted"), list(_CASES.values()), ids=list(_CASES))
def test_hostile_case_is_judged_like_protobuf(data, accepted):
    content = _assert_same(data)
    assert (content is not None) == accepted, "protobuf's rule changed; update append_request.py"
