"""Device memory: how much a table needs, how much its device has free, and what capacity fits.

A table's bytes are ``capacity * row_bytes(spec, storage_dtypes)`` (dense variables). A
`Prioritized` sampler adds its sum tree, about 8 to 16 bytes per row; networks are not counted.

Free memory (`available_bytes`):

- GPU: the allocator limit minus bytes in use (``tf.config.experimental.get_memory_info``). The
  limit is one set with ``tf.config.set_logical_device_configuration`` (exact), else the NVML
  device total, an upper bound (TensorFlow keeps a few hundred MiB back; other processes may hold
  some). Neither known (no NVML, another accelerator): None, and a table does not check.
- CPU: available RAM (/proc/meminfo ``MemAvailable``, else psutil, else ``sysconf`` free pages),
  capped by the cgroup limit minus its working set (v2 ``memory.max - (memory.current -
  inactive_file)``, or v1's equivalents), since the learner runs in containers.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import tensorflow as tf

from replaygpu.device import resolve_device
from replaygpu.errors import ConfigError, OutOfDeviceMemoryError
from replaygpu.specs import Spec, normalize_spec

logger = logging.getLogger(__name__)

#: dtypes a float field may be stored as on the device (half the bytes of float32).
NARROW_DTYPES = (tf.float16, tf.bfloat16)

#: How a bool field is stored (uint8 0/1): TensorFlow's GPU bool scatter takes only int32
#: indices, the table's are int64. Appends cast on write and reads cast back.
BOOL_STORAGE = tf.uint8


def default_storage_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype a field of ``dtype`` is stored as unless narrowed (bool as `BOOL_STORAGE`)."""
    return BOOL_STORAGE if dtype == tf.bool else dtype


#: The share of a device's free memory one table may take when it checks before allocating;
#: the rest (5%) stays for networks, optimizer slots, sum trees, append and sample buffers.
TABLE_MEMORY_FRACTION = 0.95

#: A table above this share of the free memory gets the one line of `advise_layout`.
ADVICE_MEMORY_FRACTION = 0.25

#: cgroup file system root (v2 files at the top, v1 under ``memory/``).
CGROUP_ROOT = "/sys/fs/cgroup"

#: cgroup v1 writes "no limit" as a number near 2**63; anything above this is no limit.
_NO_LIMIT = 2**62


def resolve_storage_dtypes(
    spec: Mapping[str, tf.TensorSpec], storage_dtypes: Mapping[str, Any] | None = None
) -> dict[str, tf.DType]:
    """``{field: tf.DType}`` as stored: the spec dtype (bool as `BOOL_STORAGE`) unless
    ``storage_dtypes`` (``{field: tf.float16 / "bfloat16" / np.float16 ...}``) narrows it.
    `ConfigError` for a field the spec lacks, an unknown dtype, a target other than
    float16/bfloat16, or a field that is not a float wider than 16 bits."""
    spec = normalize_spec(spec)
    out = {name: default_storage_dtype(leaf.dtype) for name, leaf in spec.items()}
    if storage_dtypes is None:
        return out
    if not isinstance(storage_dtypes, Mapping):
        raise ConfigError(
            f"storage_dtypes: got {type(storage_dtypes).__name__}, expected a dict "
            "{field: tf.float16 or tf.bfloat16}, e.g. {'obs': tf.float16}"
        )
    allowed = [d.name for d in NARROW_DTYPES]
    for name, value in storage_dtypes.items():
        if name not in spec:
            raise ConfigError(
                f"storage_dtypes: got field {name!r}, which the spec lacks; expected some of "
                f"{sorted(spec)}"
            )
        try:
            dtype = tf.as_dtype(value)
        except TypeError:
            raise ConfigError(
                f"storage_dtypes['{name}']: got {value!r}, expected one of {allowed}"
            ) from None
        logical = spec[name].dtype
        if dtype in (logical, default_storage_dtype(logical)):
            continue  # stored as is
        if dtype not in NARROW_DTYPES:
            raise ConfigError(
                f"storage_dtypes['{name}']: got {dtype.name}, expected one of {allowed} (or the "
                f"spec dtype {logical.name}); only float fields can be narrowed"
            )
        if not logical.is_floating or logical.size <= dtype.size:
            raise ConfigError(
                f"storage_dtypes['{name}']: field '{name}' is {logical.name}, expected a float "
                f"wider than 16 bits (float32 or float64) to store as {dtype.name}; store "
                "integers, bools and uint8 pixels as they are"
            )
        out[name] = dtype
    return out


def row_bytes(
    spec: Mapping[str, tf.TensorSpec], storage_dtypes: Mapping[str, Any] | None = None
) -> int:
    """Bytes of one stored row (`ConfigError` as `resolve_storage_dtypes`)."""
    stored = resolve_storage_dtypes(spec, storage_dtypes)
    shapes = normalize_spec(spec)
    return sum(
        math.prod(shapes[name].shape.as_list()) * dtype.size for name, dtype in stored.items()
    )


def available_bytes(device: str | None = None) -> int | None:
    """Free bytes on ``device`` (None: first GPU, else CPU), or None if unknown (see module)."""
    spec = tf.DeviceSpec.from_string(resolve_device(device))
    kind, index = spec.device_type, spec.device_index or 0
    if kind == "CPU":
        return host_available_bytes()
    try:
        info = tf.config.experimental.get_memory_info(f"{kind}:{index}")
    except ValueError:  # the device's allocator keeps no statistics
        return None
    limit = info.get("limit") or (_gpu_limit(index) if kind == "GPU" else None)
    return None if limit is None else max(0, int(limit) - int(info.get("current", 0)))


def plan_capacity(
    spec: Mapping[str, tf.TensorSpec],
    device: str | None = None,
    fraction: float = 0.9,
    storage_dtypes: Mapping[str, Any] | None = None,
    *,
    available: int | None = None,
) -> int:
    """The largest capacity whose table fits in ``fraction`` of ``device``'s free memory:
    ``floor(fraction * available / row_bytes)``, 0 when not even one row fits.

    Args:
        device: as `ReplayTable`'s.
        storage_dtypes: as `ReplayTable`'s.
        fraction: in (0, 1]; leave room for the networks and the rest of the learner.
        available: free bytes to plan against instead of asking the device (another machine,
            or one replica's share).

    Raises:
        ConfigError: a fraction outside (0, 1], bad storage dtypes, or unknown free memory
            (then pass ``available``).

    Example::

        capacity = plan_capacity(spec, "/GPU:0", 0.5, storage_dtypes={"obs": tf.float16})
        table = rg.ReplayTable(spec, capacity, "/GPU:0", storage_dtypes={"obs": tf.float16})
    """
    if isinstance(fraction, bool) or not (
        isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0
    ):
        raise ConfigError(f"fraction: got {fraction!r}, expected a number in (0, 1]")
    row = row_bytes(spec, storage_dtypes)
    if available is None:
        available = available_bytes(device)
        if available is None:
            raise ConfigError(
                f"plan_capacity: the free memory of {resolve_device(device)} is unknown "
                "(TensorFlow reports no memory limit and the NVIDIA driver library is not "
                "found); pass available=BYTES, or set a limit with "
                "tf.config.set_logical_device_configuration"
            )
    if available < 0:
        raise ConfigError(f"available: got {available}, expected bytes >= 0")
    return math.floor(Fraction(fraction) * int(available)) // max(row, 1)


def check_table_fits(
    name: str, spec: Spec, capacity: int, device: str, storage: Mapping[str, tf.DType]
) -> None:
    """Before allocating: `OutOfDeviceMemoryError` (with the capacity that fits and the fixes)
    above `TABLE_MEMORY_FRACTION` of the free memory; only a log line when that is unknown."""
    available = available_bytes(device)
    row = row_bytes(spec, storage)
    needed = capacity * row
    advise_layout(name, spec, needed, available)
    if available is None:
        logger.info(
            "table %s: the free memory of %s is unknown; %s not checked before allocating",
            name,
            device,
            human_bytes(needed),
        )
        return
    budget = math.floor(Fraction(TABLE_MEMORY_FRACTION) * available)
    if needed <= budget:
        return
    fits = budget // max(row, 1)
    narrowable = [k for k, leaf in spec.items() if leaf.dtype.is_floating and storage[k].size > 2]
    fixes = [
        "a smaller capacity (replaygpu.memory.plan_capacity(spec, device) plans one)"
        if fits
        else "fewer or smaller fields",
        "another device (device=...)",
        "check_memory=False to allocate anyway",
    ]
    if narrowable:
        example = ", ".join(f"'{k}': tf.float16" for k in narrowable[:2])
        fixes.insert(1, f"float16/bfloat16 storage of float fields (storage_dtypes={{{example}}})")
    raise OutOfDeviceMemoryError(
        f"table '{name}' needs {human_bytes(needed)} ({needed:,} bytes: capacity {capacity:,} x "
        f"{row:,} bytes per row) but {device} has {human_bytes(available)} free "
        f"({available:,} bytes), and a table may take {TABLE_MEMORY_FRACTION:.0%} of it; "
        f"{f'capacity {fits:,} would fit' if fits else 'not even one row fits'}. Nothing was "
        "allocated. Fixes: "
        f"{'; '.join(fixes[:-1])}; or {fixes[-1]}",
        needed=needed,
        available=available,
        device=device,
        capacity_that_fits=fits,
    )


def advise_layout(name: str, spec: Spec, needed: int, available: int | None) -> None:
    """Log one line naming the frame table and `plan_capacity` for a table of image rows (a
    field of rank 3 or more, such as stacked frames, or two uint8 ones of rank 2 such as ``obs``
    and ``next_obs`` frames; float ``[steps, features]`` sequences are not images) or one above
    `ADVICE_MEMORY_FRACTION` of the free memory."""
    images = [
        k
        for k, leaf in spec.items()
        if (leaf.shape.rank or 0) >= 3 or (leaf.shape.rank == 2 and leaf.dtype == tf.uint8)
    ]
    stacked = any(spec[k].shape.rank >= 3 for k in images) or len(images) >= 2
    large = available is not None and needed > ADVICE_MEMORY_FRACTION * available
    if not (stacked or large):
        return
    logger.warning(
        "table %s: %s%s; %splan_capacity(spec, device, fraction) in replaygpu.memory sizes a "
        "capacity to the free memory",
        name,
        human_bytes(needed),
        f" of {human_bytes(available)} free" if available is not None else "",
        f"image fields {images} store every frame of every stack twice: a frame table "
        "(replaygpu.samplers.make_frame_table) stores each frame once and stacks them in the "
        "graph, about 8x smaller for 4-frame obs and next_obs; "
        if stacked
        else "",
    )


def human_bytes(n: int) -> str:
    """``n`` bytes in binary units: ``'14.6 TiB'``, ``'512 B'``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable


def host_available_bytes(cgroup_root: str = CGROUP_ROOT) -> int | None:
    """Available host RAM, capped by the room in the cgroup (mounted at ``cgroup_root``)."""
    figures = [b for b in (_ram_available(), cgroup_available_bytes(cgroup_root)) if b is not None]
    return min(figures) if figures else None


def cgroup_available_bytes(root: str = CGROUP_ROOT) -> int | None:
    """The cgroup limit minus the working set (usage less ``inactive_file``, which the kernel
    reclaims before killing: the figure ``docker stats`` uses), or None without a limit."""
    limit = _read_int(os.path.join(root, "memory.max"))
    if limit is not None:  # v2
        usage = _read_int(os.path.join(root, "memory.current"))
        cache = _read_stat(os.path.join(root, "memory.stat")).get("inactive_file", 0)
    else:
        v1 = os.path.join(root, "memory")
        limit = _read_int(os.path.join(v1, "memory.limit_in_bytes"))
        usage = _read_int(os.path.join(v1, "memory.usage_in_bytes"))
        stat = _read_stat(os.path.join(v1, "memory.stat"))
        cache = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    if limit is None or limit >= _NO_LIMIT or usage is None:
        return None
    return max(0, limit - max(0, usage - cache))


def _ram_available() -> int | None:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(ImportError):  # macOS, Windows, old kernels: psutil when installed
        import psutil  # type: ignore[import-untyped]

        return int(psutil.virtual_memory().available)
    try:  # free pages only (no reclaimable cache): a lower bound
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _read_int(path: str) -> int | None:
    """An integer file such as ``memory.max``; ``max`` reads as no limit; None if absent."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return _NO_LIMIT
    try:
        return int(text)
    except ValueError:
        return None


def _read_stat(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[key] = int(value)
    return out


def _gpu_limit(index: int) -> int | None:
    """The memory limit of logical GPU ``index``: a configured one, else the device total."""
    logical = 0
    for physical in tf.config.get_visible_devices("GPU"):
        configs = tf.config.get_logical_device_configuration(physical) or [None]
        for config in configs:
            if logical == index:
                if config is not None and config.memory_limit:
                    return int(config.memory_limit) * 2**20  # configured in MiB
                ordinal = int(physical.name.rsplit(":", 1)[-1])
                return _nvml_total(ordinal)
            logical += 1
    return None


class _NvmlMemory(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in ("total", "free", "used")]


def _nvml_total(ordinal: int) -> int | None:
    """Total memory of CUDA device ``ordinal`` from NVML, or None. NVML counts in PCI order,
    CUDA fastest first (unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``): with mixed GPUs, name them by
    UUID in ``CUDA_VISIBLE_DEVICES`` to be sure of the figure."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    key: str | int = ordinal
    if "CUDA_VISIBLE_DEVICES" in os.environ and ordinal < len(visible):
        key = int(visible[ordinal]) if visible[ordinal].isdigit() else visible[ordinal]
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if lib.nvmlInit_v2() != 0:
        return None
    try:
        handle = ctypes.c_void_p()
        if isinstance(key, int):
            found = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(key), ctypes.byref(handle))
        else:
            found = lib.nvmlDeviceGetHandleByUUID(key.encode(), ctypes.byref(handle))
        memory = _NvmlMemory()
        if found != 0 or lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
            return None
        return int(memory.total)
    finally:
        lib.nvmlShutdown()


def describe(spec: Spec, storage: Mapping[str, tf.DType]) -> str:
    """Fields narrowed from their spec dtype, as ``obs float32->float16``; or ''."""
    return ", ".join(
        f"{name} {spec[name].dtype.name}->{dtype.name}"
        for name, dtype in storage.items()
        if dtype != default_storage_dtype(spec[name].dtype)
    )
