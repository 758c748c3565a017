"""The staging buffer pool: aligned copies, reuse only of buffers nobody else holds."""

import numpy as np

from replaygpu.service.server.staging import BufferPool


def test_copies_are_aligned_equal_and_reuse_released_buffers():
    pool = BufferPool(max_bytes=2**20)
    array = np.arange(300, dtype=np.float32).reshape(100, 3)
    copy = pool.copy(array)
    assert copy.ctypes.data % 64 == 0 and copy.flags.c_contiguous
    np.testing.assert_array_equal(copy, array)
    address = copy.ctypes.data
    columns = {"obs": copy}
    del copy
    pool.release(columns)
    assert columns == {}
    again = pool.copy(array + 1)
    assert again.ctypes.data == address
    np.testing.assert_array_equal(again, array + 1)


def test_a_buffer_still_referenced_elsewhere_is_never_reused():
    pool = BufferPool(max_bytes=2**20)
    array = np.ones((10, 4), np.int64)
    held = pool.copy(array)  # e.g. a tensor that still wraps it
    pool.release({"x": held})
    fresh = pool.copy(array * 2)
    assert fresh.ctypes.data != held.ctypes.data
    np.testing.assert_array_equal(held, array)  # untouched


def test_free_buffers_are_kept_only_up_to_max_bytes():
    pool = BufferPool(max_bytes=5000)
    columns = {str(i): pool.copy(np.zeros(4000, np.uint8)) for i in range(3)}
    pool.release(columns)
    assert 0 < pool._free_bytes <= 5000
