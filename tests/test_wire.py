"""The AppendRequest wire format: the zero-copy reader agrees with protobuf's parser on every
encoding, and the one-copy encoder writes what protobuf would."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaygpu.service.wire import codec
from replaygpu.service.wire.append_request import (
    AppendView,
    WireFormatError,
    _encode_varint,
    _len_field,
    encode_append_request,
    parse_append_request,
)
from replaygpu.v1 import replay_pb2


def _as_tuple(view: AppendView) -> tuple:
    fields = [(n, t.dtype, list(t.shape), bytes(t.data)) for n, t in view.fields]
    return view.table, view.actor_id, view.seq, fields


def _protobuf_tuple(data: bytes) -> tuple:
    m = replay_pb2.AppendRequest.FromString(data)
    fields = [(f.name, f.tensor.dtype, list(f.tensor.shape), f.tensor.data) for f in m.batch.fields]
    return m.table, m.actor_id, m.seq, fields


def _tag(number: int, wire_type: int) -> bytes:
    return _encode_varint(number << 3 | wire_type)


def _len(number: int, payload: bytes) -> bytes:
    return _len_field(number, len(payload)) + payload


_text = st.text(max_size=8)
_int64 = st.integers(-(2**63), 2**63 - 1)
_tensors = st.builds(
    replay_pb2.Tensor,
    dtype=_text,
    shape=st.lists(_int64, max_size=4),
    data=st.binary(max_size=64),
)
_requests = st.builds(
    replay_pb2.AppendRequest,
    table=_text,
    actor_id=_text,
    seq=_int64,
    batch=st.builds(
        replay_pb2.Batch,
        fields=st.lists(st.builds(replay_pb2.NamedTensor, name=_text, tensor=_tensors), max_size=4),
    ),
)


@settings(max_examples=200, deadline=None)
@given(_requests)
def test_every_protobuf_serialized_request_parses_to_the_same_values(message):
    data = message.SerializeToString()
    assert _as_tuple(parse_append_request(data)) == _protobuf_tuple(data)


def test_tensor_data_are_views_of_the_received_bytes_without_a_copy():
    columns = {"obs": np.arange(2 * 84 * 84, dtype=np.uint8).reshape(2, 84, 84)}
    data = encode_append_request("replay", "actor-1", 7, columns)
    view = parse_append_request(data)
    ((name, tensor),) = view.fields
    assert (view.table, view.actor_id, view.seq, name) == ("replay", "actor-1", 7, "obs")
    assert tensor.data.obj is data
    array = codec.decode_tensor(tensor, name)
    np.testing.assert_array_equal(array, columns["obs"])
    assert not array.flags.writeable


def test_unusual_but_valid_encodings_follow_protobuf_merge_rules():
    tensor_a = _len(1, b"uint8") + _tag(2, 0) + _encode_varint(2)  # unpacked shape
    tensor_b = _len(2, _encode_varint(3)) + _len(3, b"abcdef")  # packed; merges into tensor_a
    named = _len(1, b"obs") + _len(2, tensor_a) + _len(2, tensor_b)
    unknown = _tag(9, 0) + _encode_varint(5) + _tag(10, 1) + b"\0" * 8 + _tag(11, 5) + b"\0" * 4
    data = b"".join(
        [
            _len(4, _len(1, named)),  # batch before the header, sent in two parts
            _tag(3, 0) + _encode_varint(1),
            _len(1, b"first"),
            unknown,
            _len(1, b"replay"),  # the last value of a scalar wins
            _tag(3, 0) + _encode_varint(5),
            _tag(2, 5) + b"\0" * 4,  # a known field with another wire type: unknown
            _len(2, b"actor"),
            _len(4, _len(1, _len(1, b"done") + _len(2, _len(1, b"bool")))),
        ]
    )
    assert _as_tuple(parse_append_request(data)) == _protobuf_tuple(data)
    assert _protobuf_tuple(data)[3][0] == ("obs", "uint8", [2, 3], b"abcdef")


def test_unknown_groups_are_skipped_like_protobuf_skips_them():
    inner = _tag(13, 3) + _tag(0, 0) + _encode_varint(1) + _tag(13, 4)  # field 0 allowed
    group = _tag(12, 3) + _tag(1, 0) + _encode_varint(4) + inner + _tag(12, 4)
    data = _len(1, b"replay") + group + _tag(3, 0) + _encode_varint(9)
    assert _as_tuple(parse_append_request(data)) == _protobuf_tuple(data)
    assert _protobuf_tuple(data)[:3] == ("replay", "", 9)


@pytest.mark.parametrize(
    "data",
    [
        _len(1, b"replay")[:-2],  # truncated string
        _tag(3, 0) + b"\xff",  # truncated varint
        _tag(3, 0) + b"\xff" * 11,  # overlong varint
        _len(1, b"\xff\xfe"),  # invalid UTF-8
        _tag(1, 7),  # invalid wire type
        _tag(0, 0) + b"\0",  # field number 0
        _len(4, _len(1, _len(2, _len(3, b"xy")[:-1]))),  # truncated inside a tensor
    ],
)
def test_malformed_bytes_are_rejected_like_protobuf_rejects_them(data):
    with pytest.raises(Exception):  # noqa: B017 (protobuf's DecodeError)
        replay_pb2.AppendRequest.FromString(data)
    with pytest.raises(WireFormatError):
        parse_append_request(data)


def _in_field(index: int, tensor: bytes) -> bytes:
    """A request whose batch has ``index`` empty fields, then one holding ``tensor``."""
    fields = [_len(1, b"")] * index + [_len(1, _len(1, b"obs") + _len(2, tensor))]
    return _len(4, b"".join(fields))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            _in_field(2, _len(2, b"\x80" * 10 + b"\x01")),
            r"^AppendRequest\.batch\.fields\[2\]\.tensor\.shape: varint longer than 10 bytes",
        ),
        (
            _in_field(0, _len(1, b"\xff")),
            r"^AppendRequest\.batch\.fields\[0\]\.tensor\.dtype: string is not valid UTF-8",
        ),
        (
            _len(4, _len(1, _len(1, b"ob\xc0\x80"))),
            r"^AppendRequest\.batch\.fields\[0\]\.name: string is not valid UTF-8 .* \(at byte 8\)",
        ),
        (_len(2, b"\xed\xa0\x80"), r"^AppendRequest\.actor_id: string is not valid UTF-8"),
        (_tag(3, 0) + b"\x80" * 11, r"^AppendRequest\.seq: varint longer than 10 bytes"),
        (b"\x98\x80\x80\x80\x80\x00", r"^AppendRequest: tag varint longer than 5 bytes"),
        (_tag(2**29 - 1, 0)[:-1] + b"\x1f" + b"\x00", r"^AppendRequest: tag 8589934584 does not"),
        (_tag(1, 2) + b"\x83\x80\x80\x80\x80\x00abc", r"^AppendRequest\.table: length varint"),
        (_len(4, _tag(1, 2) + b"\x05ab"), r"^AppendRequest\.batch\.fields: length 5 runs past"),
        (
            _in_field(1, _tag(3, 2) + b"\x01"),
            r"^AppendRequest\.batch\.fields\[1\]\.tensor\.data: len",
        ),
        (_len(4, _tag(0, 0) + b"\x00"), r"^AppendRequest\.batch: field number 0 is invalid"),
        (
            _in_field(0, _tag(9, 7)),
            r"^AppendRequest.*tensor \(unknown field 9\): invalid wire type 7",
        ),
        (
            _tag(9, 3) + _tag(10, 4),
            r"^AppendRequest \(unknown field 9\): end-group tag of field 10",
        ),
        (_tag(9, 3) * 101 + _tag(9, 4) * 101, r"groups nested deeper than 100 levels"),
        (_in_field(0, _tag(5, 4)), r"tensor \(unknown field 5\): end-group tag without a start"),
    ],
)
def test_malformed_bytes_are_reported_with_the_field_and_the_problem(data, message):
    with pytest.raises(Exception):  # noqa: B017 (protobuf's DecodeError)
        replay_pb2.AppendRequest.FromString(data)
    with pytest.raises(WireFormatError, match=message):
        parse_append_request(data)


def test_append_request_encoding_matches_protobuf_byte_for_byte():
    columns = {
        "obs": np.arange(7 * 84 * 84).astype(np.uint8).reshape(7, 84, 84),
        "strided": np.arange(42, dtype=np.float32).reshape(7, 6)[:, ::2],  # not C-contiguous
        "big_endian": np.arange(7, dtype=">i8"),
        "done": np.ones(7, bool),
    }
    fast = encode_append_request("replay", "actor-1", 42, columns)
    message = replay_pb2.AppendRequest(table="replay", actor_id="actor-1", seq=42)
    little = {k: v.astype(v.dtype.newbyteorder("<")) for k, v in columns.items()}
    for name, array in little.items():
        field = message.batch.fields.add()
        field.name = name
        codec.encode_tensor(array, field.tensor)
    assert fast == message.SerializeToString()
    parsed = replay_pb2.AppendRequest.FromString(fast)
    decoded = codec.decode_named(parsed.batch.fields)
    for name, array in columns.items():
        np.testing.assert_array_equal(decoded[name], array)
