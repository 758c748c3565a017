"""The wire codec: numpy <-> Tensor messages, and the column checks."""

import numpy as np
import pytest

from replaygpu.errors import BatchError
from replaygpu.fields import DTYPE_NAMES, check_columns, numpy_dtype
from replaygpu.service import codec
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
    wire = replay_pb2.Tensor.FromString(message.SerializeToString())
    back = codec.decode_tensor(wire, "x")
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
