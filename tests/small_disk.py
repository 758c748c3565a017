"""A small real file system to fill up, for the storage-fault tests.

`small_filesystem` mounts a tmpfs of a few MiB (root only); where that is not permitted it
loop-mounts a small ext4 image; where neither works the test is skipped, saying why. `fill`
writes a filler file until the file system answers ENOSPC; deleting it gives the room back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _run(*command: str) -> str | None:
    """Run ``command``; None when it worked, else why not (one line)."""
    if shutil.which(command[0]) is None:
        return f"{command[0]} not found"
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return None
    return " ".join((done.stderr or done.stdout or f"exit {done.returncode}").split())


@contextlib.contextmanager
def small_filesystem(directory: Path, size_bytes: int) -> Iterator[Path]:
    """``directory`` with a fresh file system of ``size_bytes`` mounted on it; unmounted after.

    Skips the test when no file system can be mounted (not root, no mount permission).
    """
    directory.mkdir(parents=True, exist_ok=True)
    why_tmpfs = _run("mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(directory))
    why_loop = None
    if why_tmpfs is not None:
        image = directory.parent / f"{directory.name}.img"
        with open(image, "wb") as file:
            file.truncate(max(size_bytes, 2 << 20))
        why_loop = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image)) or _run(
            "mount", "-o", "loop", str(image), str(directory)
        )
        if why_loop is not None:
            pytest.skip(
                f"cannot mount a small file system to fill (tmpfs: {why_tmpfs}; loop-mounted "
                f"ext4 image: {why_loop}); run as root, or where mount is permitted"
            )
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], capture_output=True, check=False)


def fill(directory: Path, leave: int = 0, name: str = "filler") -> Path:
    """Write a filler file ``name`` into ``directory`` until its file system is full (or has only
    about ``leave`` bytes left); returns the filler's path."""
    path = directory / name
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
    with open(path, "wb", buffering=0) as file:
        try:
            if free > leave:
                file.write(b"\0" * (free - leave))
            if not leave:
                while True:
                    file.write(b"\0" * 4096)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
    return path
