"""A checkpoint's files on disk: the checksum manifest written with each, checking it before a
restore, making the files durable, and cleaning up after a failed save. No TensorFlow.

A TensorFlow checkpoint ``ckpt-7`` is ``ckpt-7.index`` and ``ckpt-7.data-00000-of-00001``
(more data shards for some saves). `seal`, run by `replaygpu.Checkpointer.save` once TensorFlow
wrote them, fsyncs them and writes ``ckpt-7.manifest.json``: each file's size and SHA-256,
fsynced too, so its presence says the save finished. `verify` reads them back against it:
a truncated file, a flipped bit or a missing file is reported naming the file. A checkpoint
without a manifest is trusted (written by a replaygpu before manifests) unless an older one in
the folder has one: then its save did not finish (`unfinished`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil

MANIFEST_SUFFIX = ".manifest.json"
_FORMAT = "replaygpu-checkpoint-manifest-1"
_CHUNK = 8 << 20


def manifest_path(prefix: str) -> str:
    """The manifest of checkpoint ``prefix`` (``ckpt-7`` -> ``ckpt-7.manifest.json``)."""
    return prefix + MANIFEST_SUFFIX


def data_files(prefix: str) -> list[str]:
    """The names of the files TensorFlow wrote for ``prefix`` (index and data shards)."""
    folder, base = os.path.split(prefix)
    return sorted(
        name
        for name in os.listdir(folder or ".")
        if name.startswith(base + ".") and not name.endswith(MANIFEST_SUFFIX)
    )


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _digest(path: str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb", buffering=0) as file:
        while chunk := file.read(_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def seal(prefix: str) -> None:
    """Fsync checkpoint ``prefix``'s files and the folder's ``checkpoint`` index, then write
    and fsync its manifest; manifests of checkpoints deleted since are removed.

    Raises:
        OSError: a file could not be read, written or synced (no manifest is left behind).
    """
    folder = os.path.dirname(prefix) or "."
    files = {}
    for name in data_files(prefix):
        path = os.path.join(folder, name)
        _fsync(path)
        files[name] = {"bytes": os.path.getsize(path), "sha256": _digest(path)}
    with contextlib.suppress(FileNotFoundError):
        _fsync(os.path.join(folder, "checkpoint"))
    manifest = manifest_path(prefix)
    temporary = manifest + ".tmp"
    try:
        with open(temporary, "w") as file:
            json.dump({"format": _FORMAT, "files": files}, file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, manifest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    for name in os.listdir(folder):
        stale = name.endswith(MANIFEST_SUFFIX)
        index = os.path.join(folder, name[: -len(MANIFEST_SUFFIX)] + ".index")
        if stale and not os.path.exists(index):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
    _fsync(folder)


def has_manifest(prefix: str) -> bool:
    """Whether checkpoint ``prefix`` was sealed (`seal`)."""
    return os.path.exists(manifest_path(prefix))


def verify(prefix: str) -> str | None:
    """Check checkpoint ``prefix``'s files against its manifest (which must exist).

    Returns:
        What is wrong, naming the file; None when every file matches.
    """
    folder = os.path.dirname(prefix) or "."
    manifest = manifest_path(prefix)
    try:
        with open(manifest) as file:
            saved = json.load(file)
        files = saved["files"]
        if saved.get("format") != _FORMAT or not isinstance(files, dict) or not files:
            raise ValueError(f"not a {_FORMAT}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{manifest}: unreadable ({err})"
    for name, want in sorted(files.items()):
        path = os.path.join(folder, name)
        try:
            size = os.path.getsize(path)
            if size != want["bytes"]:
                return f"{path}: {size} bytes, {want['bytes']} written (truncated or overwritten)"
            if _digest(path) != want["sha256"]:
                return f"{path}: its bytes changed since it was written (SHA-256 mismatch)"
        except FileNotFoundError:
            return f"{path}: missing"
        except OSError as err:
            return f"{path}: unreadable ({err.strerror or err})"
    return None


def unfinished(prefix: str) -> str:
    """Why checkpoint ``prefix``, without a manifest while an older one has one, is skipped."""
    return (
        f"{prefix}.index: no {os.path.basename(manifest_path(prefix))} beside it, though an "
        "older checkpoint has one: its save did not finish"
    )


def discard(prefix: str, files_too: bool) -> None:
    """Remove what a failed save of ``prefix`` left: TensorFlow's ``prefix_temp`` folder, the
    manifest and, when ``files_too``, the checkpoint's files themselves."""
    shutil.rmtree(prefix + "_temp", ignore_errors=True)
    names = data_files(prefix) if files_too else []
    folder = os.path.dirname(prefix) or "."
    for path in [manifest_path(prefix), *(os.path.join(folder, n) for n in names)]:
        with contextlib.suppress(OSError):
            os.unlink(path)
