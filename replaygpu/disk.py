"""Free space on a file system, for messages of writes that found none, and `fsync_path`.

No TensorFlow. A full disk is ridden out, not a bug: the journal refuses appends retryably and a
failed checkpoint is retried later.
"""

from __future__ import annotations

import errno
import os

#: errno values of a write that found no room: the file system is full, or the user's quota
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_full(err: BaseException) -> bool:
    """Whether ``err`` is a write that found no room (TensorFlow's errors carry only the OS's
    words, "No space left on device")."""
    if isinstance(err, OSError):
        return err.errno in FULL_ERRNOS
    text = str(err)
    return any(os.strerror(code) in text for code in FULL_ERRNOS)


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged write can still use at ``path``, or None."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def describe_space(path: str | os.PathLike[str]) -> str:
    """``"12288 bytes free of 4194304"`` on the file system of ``path``, or why it is unknown."""
    try:
        stat = os.statvfs(path)
    except OSError as err:
        return f"free space unknown ({err.strerror or err})"
    return f"{stat.f_bavail * stat.f_frsize} bytes free of {stat.f_blocks * stat.f_frsize}"


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Make a file's bytes durable, or for a folder the names created or deleted in it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
