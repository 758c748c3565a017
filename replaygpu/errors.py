"""Library errors, each saying what was wrong, what was received, what was expected, and the fix.

Import them from here: `ReplayError` (the base of all), `ConfigError` (also ``rg.ConfigError``)
with `OutOfDeviceMemoryError`, `BatchError`, `EmptyTableError`, `StorageFullError`,
`CheckpointMismatchError`, `CheckpointSaveError`, `CheckpointCorruptError`.

The service's errors live in `replaygpu.service.wire.status`, the one place where errors and
gRPC status codes meet (no TensorFlow): `ServiceError` (the base of all), `InvalidBatchError`
(also a `BatchError`), `TableNotFoundError`, `ResourceExhaustedError` with `StagingFullError`
and `DiskFullError`, `AuthenticationError`, `ServiceUnavailableError`, `TLSError`.
"""

from __future__ import annotations

import numbers
from typing import Any


class ReplayError(Exception):
    """Base class of every error replaygpu raises on purpose."""


class BatchError(ReplayError, ValueError):
    """A batch does not match the table spec. Nothing of it was written.

    Attributes:
        field: the offending field, or None when the batch as a whole is wrong.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class EmptyTableError(ReplayError, RuntimeError):
    """Sampling was asked of a table that holds no transitions."""


class CheckpointMismatchError(ReplayError, ValueError):
    """A checkpoint does not fit the objects it is restored into. Nothing was restored."""


class CheckpointSaveError(ReplayError, RuntimeError):
    """A checkpoint could not be written (full disk, permission); nothing of it was kept."""


class CheckpointCorruptError(ReplayError, RuntimeError):
    """A checkpoint's files are unreadable or fail their checksums; nothing was restored."""


class StorageFullError(ReplayError, RuntimeError):
    """No room for a write (ENOSPC, EDQUOT). Transient: nothing acknowledged is lost, and the
    write succeeds once space is freed."""


class ConfigError(ReplayError, ValueError, TypeError):
    """An argument or configuration value is wrong; a `ValueError` and a `TypeError` both."""


def check_int(name: str, value: Any, least: int) -> int:
    """``value`` as an int; a `ConfigError` naming ``name`` unless it is an integer (not a bool)
    >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ConfigError(f"{name}: got {value!r}, expected an integer >= {least}")
    return int(value)


class BroadcastWarning(UserWarning):
    """``update_fn`` combines a ``[B]`` tensor with a ``[B, 1]`` one into ``[B, B]``: a batch field
    such as ``reward`` against a Keras model's ``[B, 1]`` output, the commonest way to train on
    wrong targets without an error. ``warnings.simplefilter("error", BroadcastWarning)`` or
    ``rg.Learner(..., strict=True)`` makes it fatal."""


class OutOfDeviceMemoryError(ConfigError):
    """A table would not fit in the free memory of its device. Nothing was allocated.

    Attributes:
        needed, available: bytes the table would take, and free when checked.
        device: the device.
        capacity_that_fits: the largest capacity the check would accept (0: not one row).
    """

    def __init__(
        self, message: str, *, needed: int, available: int, device: str, capacity_that_fits: int
    ) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available
        self.device = device
        self.capacity_that_fits = capacity_that_fits
