"""Device memory planning: row bytes, free memory (RAM, cgroups), plan_capacity, and tables that
refuse to allocate past their device's free memory."""

import logging
import math
import os
import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu import memory
from replaygpu.errors import OutOfDeviceMemoryError
from replaygpu.memory import advise_layout, plan_capacity

SPEC = {
    "obs": tf.TensorSpec([4], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "done": tf.TensorSpec([], tf.bool),
    "frame": tf.TensorSpec([2, 3], tf.uint8),
}
ROW = 4 * 4 + 8 + 1 + 6  # 31 bytes
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc and sets RLIMIT_AS"
)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_row_bytes_counts_stored_dtypes():
    assert memory.row_bytes(SPEC) == ROW
    assert memory.row_bytes(SPEC, {"obs": tf.float16}) == ROW - 8
    assert memory.row_bytes(SPEC, {"obs": "bfloat16"}) == ROW - 8
    table = rg.ReplayTable(SPEC, 10, "CPU", storage_dtypes={"obs": tf.float16})
    assert table.nbytes == 10 * (ROW - 8)


@pytest.mark.parametrize("available", [0, 30, 31, 1000, 123_456_789, 80 * 2**30 + 17])
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.95, 1.0])
def test_plan_capacity_is_the_largest_capacity_that_fits_the_fraction(available, fraction):
    capacity = plan_capacity(SPEC, "CPU", fraction, available=available)
    budget = Fraction(fraction) * available
    assert capacity * ROW <= budget < (capacity + 1) * ROW
    halved = plan_capacity(
        SPEC, "CPU", fraction, storage_dtypes={"obs": tf.float16}, available=available
    )
    assert halved * (ROW - 8) <= budget < (halved + 1) * (ROW - 8)


def test_plan_capacity_on_this_host_fits_the_available_ram():
    before = memory.available_bytes("CPU")
    capacity = plan_capacity(SPEC, "CPU", 0.5)
    after = memory.available_bytes("CPU")
    low, high = sorted([before, after])
    # the machine is shared: free memory moves between the calls, so bracket it
    assert math.floor(0.5 * low) // ROW - 1 <= capacity <= math.floor(0.5 * high) // ROW + 1
    assert capacity * ROW <= 0.5 * high


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"fraction": 0.0}, r"fraction: got 0.0, expected a number in \(0, 1\]"),
        ({"fraction": 1.5}, r"fraction: got 1.5"),
        ({"available": -1}, r"available: got -1, expected bytes >= 0"),
        ({"storage_dtypes": {"action": tf.float16}}, r"field 'action' is int64"),
    ],
)
def test_plan_capacity_rejects_bad_arguments(kwargs, pattern):
    kwargs = {"available": 10**6, **kwargs}
    with pytest.raises(rg.ConfigError, match=pattern):
        plan_capacity(SPEC, "CPU", **kwargs)


@linux_only
def test_available_ram_is_positive_and_below_the_machine_total():
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    available = memory.available_bytes("/CPU:0")
    assert 0 < available <= total


def _write(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_cgroup_v2_room_is_the_limit_minus_the_working_set(tmp_path):
    stat = "anon 100\nfile 700\nactive_file 400\ninactive_file 300\n"
    _write(tmp_path, {"memory.max": "2000\n", "memory.current": "1500\n", "memory.stat": stat})
    # working set = 1500 - 300 inactive file pages (reclaimable) = 1200
    assert memory.cgroup_available_bytes(str(tmp_path)) == 800
    assert memory.host_available_bytes(str(tmp_path)) == 800  # far below the host's RAM


def test_cgroup_v2_without_a_limit_leaves_the_host_figure(tmp_path):
    _write(tmp_path, {"memory.max": "max\n", "memory.current": "1500\n"})
    assert memory.cgroup_available_bytes(str(tmp_path)) is None
    assert memory.host_available_bytes(str(tmp_path)) > 800


def test_cgroup_v1_room_uses_the_hierarchical_inactive_file_count(tmp_path):
    v1 = tmp_path / "memory"
    stat = "inactive_file 5\ntotal_inactive_file 250\n"
    files = {"memory.limit_in_bytes": "4096\n", "memory.usage_in_bytes": "3000\n"}
    _write(v1, {**files, "memory.stat": stat})
    assert memory.cgroup_available_bytes(str(tmp_path)) == 4096 - (3000 - 250)
    _write(v1, {"memory.limit_in_bytes": "9223372036854771712\n"})  # v1's "no limit"
    assert memory.cgroup_available_bytes(str(tmp_path)) is None


def test_a_cgroup_that_is_full_leaves_no_room(tmp_path):
    _write(tmp_path, {"memory.max": "1000\n", "memory.current": "1200\n"})
    assert memory.cgroup_available_bytes(str(tmp_path)) == 0


@linux_only
def test_a_table_far_too_large_raises_naming_a_capacity_that_fits_and_allocates_nothing():
    spec = {"obs": tf.TensorSpec([4], tf.float32)}
    rss = rss_bytes()
    with pytest.raises(OutOfDeviceMemoryError) as caught:
        rg.ReplayTable(spec, 10**12, device="CPU", name="huge")
    err = caught.value
    assert isinstance(err, rg.ConfigError)
    assert rss_bytes() - rss < 64 * 2**20  # 16 TB were not touched, not even a slice
    assert err.needed == 16 * 10**12 and err.device.endswith("CPU:0")
    fits = err.capacity_that_fits
    budget = Fraction(memory.TABLE_MEMORY_FRACTION) * err.available
    assert 0 < fits * 16 <= budget < (fits + 1) * 16
    message = str(err)
    for part in (
        "table 'huge' needs 14.6 TiB (16,000,000,000,000 bytes: capacity 1,000,000,000,000 x 16",
        f"has {memory.human_bytes(err.available)} free ({err.available:,} bytes)",
        f"capacity {fits:,} would fit. Nothing was allocated.",
        "replaygpu.memory.plan_capacity(spec, device)",
        "storage_dtypes={'obs': tf.float16}",
        "another device",
        "check_memory=False",
    ):
        assert part in message, (part, message)


def test_the_error_drops_the_storage_hint_when_nothing_can_be_narrowed():
    spec = {"frame": tf.TensorSpec([84, 84], tf.uint8)}
    with pytest.raises(OutOfDeviceMemoryError) as caught:
        rg.ReplayTable(spec, 10**10, device="CPU")
    assert "storage_dtypes" not in str(caught.value)
    # narrowing a float32 field halves the bytes needed and doubles the capacity named
    spec32 = {"obs": tf.TensorSpec([8], tf.float32)}
    with pytest.raises(OutOfDeviceMemoryError) as wide:
        rg.ReplayTable(spec32, 10**12, device="CPU")
    with pytest.raises(OutOfDeviceMemoryError) as narrow:
        rg.ReplayTable(spec32, 10**12, device="CPU", storage_dtypes={"obs": tf.float16})
    assert narrow.value.needed * 2 == wide.value.needed
    ratio = narrow.value.capacity_that_fits / wide.value.capacity_that_fits
    assert 1.9 < ratio < 2.1  # free memory moved a little between the two checks


def test_a_table_that_fits_is_allocated_and_check_memory_false_is_accepted():
    table = rg.ReplayTable(SPEC, 1000, device="CPU")
    assert table.nbytes == 1000 * ROW
    unchecked = rg.ReplayTable(SPEC, 1000, device="CPU", check_memory=False)
    unchecked.append({k: np.zeros((2, *v.shape), v.dtype.as_numpy_dtype) for k, v in SPEC.items()})
    assert unchecked.size == 2


@linux_only
def test_check_memory_false_skips_the_check_and_leaves_allocation_to_tensorflow():
    # In a child process whose address space is capped, so the attempted 16 TB allocation fails
    # at once inside TensorFlow (whatever the host's overcommit policy) and touches nothing.
    code = textwrap.dedent(
        """
        import resource
        import tensorflow as tf
        import replaygpu as rg
        from replaygpu.errors import OutOfDeviceMemoryError

        spec = {"obs": tf.TensorSpec([4], tf.float32)}
        tf.zeros([1])
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + 2**31, resource.RLIM_INFINITY))
        try:
            rg.ReplayTable(spec, 10**12, device="CPU")
        except OutOfDeviceMemoryError:
            print("checked")
        try:
            rg.ReplayTable(spec, 10**12, device="CPU", check_memory=False)
        except tf.errors.ResourceExhaustedError:
            print("tensorflow refused")
        """
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.stdout.split() == ["checked", "tensorflow", "refused"], out.stderr[-2000:]


def test_a_table_of_stacked_frames_logs_one_line_naming_the_frame_table(caplog):
    frames = tf.TensorSpec([84, 84, 4], tf.uint8)
    with caplog.at_level(logging.WARNING, logger="replaygpu.memory"):
        rg.ReplayTable({"obs": tf.TensorSpec([4], tf.float32)}, 100, device="/CPU:0")
        sequence = tf.TensorSpec([40, 2], tf.float32)  # 40 steps of 2 features: not an image
        rg.ReplayTable({"obs": sequence, "next_obs": sequence}, 100, device="/CPU:0")
        assert not caplog.records
        rg.ReplayTable({"obs": frames, "next_obs": frames}, 100, device="/CPU:0")
    [record] = caplog.records
    assert "make_frame_table" in record.message and "plan_capacity" in record.message
    assert "['obs', 'next_obs']" in record.message


def test_a_table_above_a_quarter_of_the_free_memory_logs_plan_capacity(caplog):
    with caplog.at_level(logging.WARNING, logger="replaygpu.memory"):
        advise_layout("t", {"obs": tf.TensorSpec([4], tf.float32)}, 300, available=1000)
        advise_layout("t", {"obs": tf.TensorSpec([4], tf.float32)}, 200, available=1000)
    [record] = caplog.records
    assert "plan_capacity" in record.message and "frame table" not in record.message
