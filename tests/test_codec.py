"""The wire codec: numpy <-> Tensor messages, and the column checks."""

import numpy as np
import pytest

from replaygpu.errors import BatchError
from replaygpu.fields import DTYPE_NAMES, check_columns, numpy_dtype
from replaygpu.service.wire import codec
from replaygpu.service.wire.append_request import encode_append_request, parse_append_request
from replaygpu.v1 import replay_pb2


def _example(dtype_name: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = numpy_dtype(dtype_name)
    rng = np.random.default_rng(0)
    if dtype_name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_tensor_round_trip_is_exact_for_every_dtype(name):
    array = _example(name, (5, 3, 2))
    message = replay_pb2.Tensor()
    codec.encode_tensor(array, message)
    parsed = replay_pb2.Tensor.FromString(message.SerializeToString())
    back = codec.decode_tensor(parsed, "x")
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tobytes() == array.tobytes()


def test_decode_rejects_a_byte_length_that_does_not_fit_the_shape():
    message = replay_pb2.Tensor(dtype="float32", shape=[4, 2], data=b"\0" * 31)
    with pytest.raises(BatchError, match=r"field 'obs': 31 data bytes .*\(expected 32 bytes\)"):
        codec.decode_tensor(message, "obs")


def test_decode_rejects_unknown_dtype_names():
    with pytest.raises(BatchError, match="dtype: got 'string'"):
        codec.decode_tensor(replay_pb2.Tensor(dtype="string", shape=[1], data=b"x"), "s")


def test_check_columns_names_field_expected_and_received():
    spec = {"obs": ("float32", (4,)), "action": ("int64", ())}
    good = {"obs": np.zeros((3, 4), np.float32), "action": np.zeros(3, np.int64)}
    assert check_columns(spec, good) == 3
    bad_dtype = {**good, "obs": np.zeros((3, 4), np.float64)}
    with pytest.raises(
        BatchError, match=r"field 'obs': expected dtype float32 .* got dtype float64"
    ):
        check_columns(spec, bad_dtype)
    bad_shape = {**good, "obs": np.zeros((3, 5), np.float32)}
    with pytest.raises(BatchError, match=r"expected shape \[None, 4\].* got shape \[3, 5\]"):
        check_columns(spec, bad_shape)
    ragged = {**good, "action": np.zeros(2, np.int64)}
    with pytest.raises(BatchError, match="leading dimension 2 differs"):
        check_columns(spec, ragged)
    with pytest.raises(BatchError, match=r"missing \['action'\]"):
        check_columns(spec, {"obs": good["obs"]})


@pytest.mark.parametrize(
    ("dtype", "shape", "data", "message"),
    [
        # np.prod wraps these to 0 bytes in int64; Python ints do not
        ("float32", [2**62, 4], b"", r"would hold 73786976294838206464 bytes, more than any"),
        ("uint8", [2**61, 2], b"", r"0 data bytes .* \(expected 4611686018427387904 bytes\)"),
        ("uint8", [2**32, 2**32], b"", r"would hold 18446744073709551616 bytes"),
        ("uint8", [0, 2**40, 2**40, 2**40], b"", r"more than any array can"),
        ("float32", [-1, 4], b"\0" * 16, r"negative dimension -1; every dimension must be >= 0"),
        ("float32", [-2, -2], b"\0" * 16, r"negative dimension -2"),
        ("uint8", [1] * 65, b"\0", r"shape has 65 dimensions, expected at most 64"),
    ],
)
def test_decode_checks_sizes_with_python_ints_before_making_an_array(dtype, shape, data, message):
    tensor = replay_pb2.Tensor(dtype=dtype, shape=shape, data=data)
    with pytest.raises(BatchError, match=rf"^field 'obs': .*{message}") as info:
        codec.decode_tensor(tensor, "obs")
    assert info.value.field == "obs"


def test_decode_accepts_zero_sized_tensors_with_no_data():
    array = codec.decode_tensor(replay_pb2.Tensor(dtype="float32", shape=[0, 2**40]), "obs")
    assert array.shape == (0, 2**40) and array.nbytes == 0


@pytest.mark.parametrize("byte", [0x02, 0x7F, 0xFF])
def test_decode_rejects_bool_bytes_other_than_0_and_1(byte):
    data = bytes([1, 0, byte, 1])
    with pytest.raises(
        BatchError, match=rf"field 'done': bool data hold byte {byte:#04x} at element 2; expected"
    ) as info:
        codec.decode_tensor(replay_pb2.Tensor(dtype="bool", shape=[4], data=data), "done")
    assert info.value.field == "done"


def test_decode_reads_bool_bytes_0_and_1():
    tensor = replay_pb2.Tensor(dtype="bool", shape=[2, 2], data=bytes([0, 1, 1, 0]))
    np.testing.assert_array_equal(
        codec.decode_tensor(tensor, "done"), [[False, True], [True, False]]
    )


def test_decode_names_the_field_of_an_unknown_dtype():
    with pytest.raises(BatchError, match=r"^field 'obs': dtype: got 'float8'") as info:
        codec.decode_tensor(replay_pb2.Tensor(dtype="float8", shape=[1], data=b"x"), "obs")
    assert info.value.field == "obs"


def test_decode_reads_a_wire_view_without_a_copy():
    data = encode_append_request("t", "a", 1, {"obs": np.arange(6, dtype=np.int16)})
    ((name, view),) = parse_append_request(data).fields
    array = codec.decode_tensor(view, name)
    np.testing.assert_array_equal(array, np.arange(6))
    assert np.shares_memory(array, np.frombuffer(data, np.uint8))


@pytest.mark.parametrize(
    ("leading", "message"),
    [
        (-1, r"field 'obs': leading dimension -1 is negative \(shape \[-1, 4\]\)"),
        (-(2**63), r"field 'obs': leading dimension -9223372036854775808 is negative"),
        (2**62, r"field 'obs': leading dimension 4611686018427387904 would make .* 16 bytes"),
    ],
)
def test_check_columns_names_the_field_of_a_negative_or_absurd_leading_dimension(leading, message):
    spec = {"obs": ("float32", (4,)), "action": ("int64", ())}
    columns = {
        "obs": replay_pb2.Tensor(dtype="float32", shape=[leading, 4]),
        "action": replay_pb2.Tensor(dtype="int64", shape=[leading]),
    }
    with pytest.raises(BatchError, match=message) as info:
        check_columns(spec, columns)
    assert info.value.field == "obs"


def test_check_columns_names_the_field_of_an_unknown_shape():
    class Symbolic:
        dtype = "float32"
        shape = (None, 4)

    with pytest.raises(BatchError, match=r"field 'obs': got shape \(None, 4\), expected") as info:
        check_columns({"obs": ("float32", (4,))}, {"obs": Symbolic()})
    assert info.value.field == "obs"
