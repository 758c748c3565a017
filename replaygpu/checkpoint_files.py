"""A checkpoint folder on disk (no TensorFlow): sealing, verifying, pruning, removing leftovers.

Checkpoint ``ckpt-7`` is ``ckpt-7.index`` and ``ckpt-7.data-*-of-*``, written by TensorFlow
through ``ckpt-7_temp``. `seal` fsyncs them, then durably writes ``ckpt-7.manifest.json`` (each
file's size and SHA-256), whose presence says the save finished. Only sealed checkpoints count
(`restorable`); `verify` checks one against its manifest; anything else with a checkpoint's name
is a leftover (`leftovers`).

Crash safety, one rule per function: a manifest only after its files are durable (`seal`); the
``checkpoint`` state file names only sealed ones and is written before pruning (`record_state`);
pruning deletes the manifest before the files (`prune`); new numbers exceed every number in the
folder (`next_number`). A kill at any instant leaves sealed checkpoints intact and leftovers
that `remove_leftovers` recognises by name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil

from replaygpu.disk import fsync_path

MANIFEST_SUFFIX = ".manifest.json"
#: TensorFlow's list of the checkpoints in a folder (`record_state`)
STATE_FILE = "checkpoint"
_FORMAT = "replaygpu-checkpoint-manifest-1"
_CHUNK = 8 << 20
#: the checkpoint files TensorFlow writes for prefix ``ckpt-N``: nothing else is one of them
_DATA = re.compile(r"\.index|\.data-\d{5}-of-\d{5}")
#: every name a checkpoint's save makes, and the number in it
_NAME = re.compile(r"ckpt-(\d+)(\.index|\.data-\d{5}-of-\d{5}|\.manifest\.json(\.tmp)?|_temp)")
#: temporary files of writes into the folder: the ``checkpoint`` state file's (`record_state`;
#: TensorFlow's own writer adds a hex suffix) and `check_writable`'s probe
_TEMPORARY = re.compile(r"checkpoint\.tmp[0-9a-f]*|\.write-check-.*")


def manifest_path(prefix: str) -> str:
    """The manifest of checkpoint ``prefix`` (``ckpt-7`` -> ``ckpt-7.manifest.json``)."""
    return prefix + MANIFEST_SUFFIX


def data_files(prefix: str) -> list[str]:
    """Names of TensorFlow's files for ``prefix`` (index and data shards)."""
    folder, base = os.path.split(prefix)
    return sorted(
        name
        for name in os.listdir(folder or ".")
        if name.startswith(base) and _DATA.fullmatch(name[len(base) :])
    )


def sealed(folder: str) -> list[str]:
    """The prefixes of the sealed checkpoints in ``folder``, newest (highest number) first."""
    return _newest_first(folder, MANIFEST_SUFFIX)


def restorable(folder: str, unsealed: int) -> list[str]:
    """Checkpoints a restore may read, newest first: the sealed ones, or with none sealed the
    newest ``unsealed`` with an index file (first saves killed before sealing)."""
    return sealed(folder) or _newest_first(folder, ".index")[:unsealed]


def _newest_first(folder: str, suffix: str) -> list[str]:
    found = [int(m[1]) for n in os.listdir(folder) if (m := _NAME.fullmatch(n)) and m[2] == suffix]
    return [os.path.join(folder, f"ckpt-{n}") for n in sorted(found, reverse=True)]


def next_number(folder: str) -> int:
    """One above every checkpoint number any name in ``folder`` carries, leftovers included."""
    numbers = [int(m[1]) for name in os.listdir(folder) if (m := _NAME.fullmatch(name))]
    return max(numbers, default=0) + 1


def leftovers(folder: str, unsealed: int, keep: str | None = None) -> list[str]:
    """Paths interrupted saves left: ``_temp`` folders, temporary files, and files of
    checkpoints not `restorable`, except ``keep``'s (a save still to be sealed)."""
    kept = {os.path.basename(p) for p in [*restorable(folder, unsealed), keep] if p}
    found = []
    for name in os.listdir(folder):
        if match := _NAME.fullmatch(name):
            if f"ckpt-{match[1]}" not in kept or match[3] or match[2] == "_temp":
                found.append(os.path.join(folder, name))
        elif _TEMPORARY.fullmatch(name):
            found.append(os.path.join(folder, name))
    return sorted(found)


def remove_leftovers(folder: str, unsealed: int, keep: str | None = None) -> tuple[list[str], int]:
    """Remove `leftovers` (a folder's whole tree); the names removed and their bytes."""
    removed, nbytes = [], 0
    for path in leftovers(folder, unsealed, keep):
        size = _tree_bytes(path)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            continue  # gone already, or found and tried again at the next save
        removed.append(os.path.basename(path))
        nbytes += size
    return removed, nbytes


def _tree_bytes(path: str) -> int:
    if not os.path.isdir(path) or os.path.islink(path):
        with contextlib.suppress(OSError):
            return os.lstat(path).st_size
        return 0
    return sum(
        os.lstat(os.path.join(top, name)).st_size
        for top, _, names in os.walk(path)
        for name in names
    )


def _write_durably(path: str, text: str) -> None:
    """Write ``text`` to ``path.tmp``, fsync it and rename it to ``path``."""
    with open(path + ".tmp", "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(path + ".tmp", path)


def _digest(path: str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb", buffering=0) as file:
        while chunk := file.read(_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def seal(prefix: str) -> None:
    """Fsync ``prefix``'s files and folder, then durably write its manifest; `OSError` if a file
    could not be read, written or synced (it stays an unsealed leftover)."""
    folder = os.path.dirname(prefix) or "."
    files = {}
    for name in data_files(prefix):
        path = os.path.join(folder, name)
        fsync_path(path)
        files[name] = {"bytes": os.path.getsize(path), "sha256": _digest(path)}
    if not any(name.endswith(".index") for name in files):
        raise FileNotFoundError(2, "no index file was written", prefix + ".index")
    fsync_path(folder)  # the files' names are durable before the manifest that names them
    _write_durably(manifest_path(prefix), json.dumps({"format": _FORMAT, "files": files}, indent=1))
    fsync_path(folder)


def prune(folder: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` sealed checkpoints, manifest first (a kill leaves a
    leftover, never a sealed checkpoint missing files); the prefixes deleted. Raises `OSError`."""
    old = sealed(folder)[keep:]
    for prefix in old:
        os.unlink(manifest_path(prefix))
        fsync_path(folder)
        for name in data_files(prefix):
            os.unlink(os.path.join(folder, name))
    return old


def record_state(folder: str) -> None:
    """Durably write TensorFlow's ``checkpoint`` state file naming the sealed checkpoints (for
    ``tf.train.latest_checkpoint``; replaygpu reads manifests). Raises `OSError`."""
    names = [os.path.basename(p) for p in reversed(sealed(folder))]
    lines = [f'model_checkpoint_path: "{names[-1]}"' if names else ""]
    lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
    _write_durably(os.path.join(folder, STATE_FILE), "\n".join(lines) + "\n")


def has_manifest(prefix: str) -> bool:
    """Whether checkpoint ``prefix`` was sealed (`seal`)."""
    return os.path.exists(manifest_path(prefix))


def verify(prefix: str) -> str | None:
    """What is wrong with ``prefix``'s files against its manifest, naming the file; or None."""
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


def discard(prefix: str) -> None:
    """Remove all a failed save of ``prefix`` left (``_temp`` folder, manifest, files)."""
    shutil.rmtree(prefix + "_temp", ignore_errors=True)
    folder = os.path.dirname(prefix) or "."
    names = [os.path.join(folder, n) for n in data_files(prefix)]
    for path in [manifest_path(prefix), manifest_path(prefix) + ".tmp", *names]:
        with contextlib.suppress(OSError):
            os.unlink(path)
