"""Crashes injected at each file operation of a checkpoint save.

`crash_at(checkpointer, point)` traces every file operation a save makes in the checkpoint
folder and crashes at the ``point``-th: the file operations of `replaygpu.checkpoint_files`
(fsync, the manifest's write, rename, unlink, rmtree) run for real up to it; TensorFlow's own
write (C++, out of Python's reach) is traced as the three states its MergeV2Checkpoints step
passes through (shards in ``ckpt-N_temp``; data files renamed into place, no index yet; index
written, ``ckpt-N_temp`` not yet deleted), each made on disk from a real write before the crash.

By default the crash raises `Killed`, a BaseException no handler of the library catches, so no
cleanup runs, as after kill -9 (the page cache survives a kill, so an fsync skipped changes
nothing a restart sees). ``kill=True`` sends the process SIGKILL instead (for a served process).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import types
from collections.abc import Callable, Iterator
from typing import Any

from replaygpu import checkpoint_files, disk


class Killed(BaseException):
    """The process died here: nothing after it runs."""


class Tracer:
    """The file operations seen so far (``ops``) and the one to crash at."""

    def __init__(self, folder: str, point: int | None, kill: bool) -> None:
        self.folder = os.path.realpath(folder)
        self.point = point
        self.kill = kill
        self.ops: list[str] = []

    def hit(self, op: str, path: str) -> None:
        """Count ``op`` on ``path`` (when in the folder); crash if it is the chosen one."""
        path = os.path.realpath(path)
        if os.path.dirname(path) != self.folder and path != self.folder:
            return
        name = os.path.relpath(path, os.path.dirname(self.folder))
        if len(self.ops) == self.point:
            self.ops.append(f"CRASH before {op} {name}")
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise Killed(self.ops[-1])
        self.ops.append(f"{op} {name}")


@contextlib.contextmanager
def crash_at(checkpointer: Any, point: int | None, kill: bool = False) -> Iterator[Tracer]:
    """Trace the file operations in ``checkpointer``'s folder; crash at the ``point``-th
    (None: trace only, to list them). The block ends at the crash: what follows it in the
    block does not run, as in a killed process."""
    tracer = Tracer(checkpointer.directory, point, kill)
    fake_os = types.ModuleType("os")
    fake_os.__dict__.update(os.__dict__)
    fake_os.fsync = _traced(
        os.fsync, tracer, "fsync", lambda fd: os.readlink(f"/proc/self/fd/{fd}")
    )
    fake_os.replace = _traced(os.replace, tracer, "rename", lambda src, dst: dst)
    fake_os.unlink = _traced(os.unlink, tracer, "unlink", lambda path: path)
    fake_shutil = types.ModuleType("shutil")
    fake_shutil.__dict__.update(shutil.__dict__)
    fake_shutil.rmtree = _traced(shutil.rmtree, tracer, "rmtree", lambda path, *a, **k: path)

    def write_open(path, mode="r", *args, **kwargs):
        file = open(path, mode, *args, **kwargs)  # noqa: SIM115 - returned to the caller
        if "w" in mode:
            tracer.hit("write", path)  # a crash here leaves the file created, empty
        return file

    checkpoint = checkpointer._checkpoint
    real_write = checkpoint.write

    def tf_write(prefix, *args, **kwargs):
        stage = None if tracer.point is None else tracer.point - len(tracer.ops)
        if stage is None or not 0 <= stage < len(_TF_STAGES):
            for op in _TF_STAGES:
                tracer.hit(op, prefix + "_temp")
            return real_write(prefix, *args, **kwargs)
        _leave_tensorflow_write_at(real_write(prefix, *args, **kwargs), stage)
        for op in _TF_STAGES:
            tracer.hit(op, prefix + "_temp")
        raise AssertionError("unreachable: the crash comes at stage {stage}")

    patches = [  # `checkpoint_files` fsyncs through `disk.fsync_path`
        (checkpoint_files, {"os": fake_os, "shutil": fake_shutil, "open": write_open}),
        (disk, {"os": fake_os}),
    ]
    saved = [(m, {name: m.__dict__.get(name) for name in p}) for m, p in patches]
    for module, patch in patches:
        module.__dict__.update(patch)
    checkpoint.write = tf_write
    try:
        yield tracer
    except Killed:
        pass
    finally:
        for module, values in saved:
            for name, value in values.items():
                if value is None:
                    del module.__dict__[name]
                else:
                    module.__dict__[name] = value
        del checkpoint.write


#: TensorFlow's write of ``ckpt-N``, as MergeV2Checkpoints makes it: a crash at each leaves the
#: files of the one before it
_TF_STAGES = (
    "tensorflow: write shards into",
    "tensorflow: rename data files out of",
    "tensorflow: write the index beside",
    "tensorflow: delete",
)


def _leave_tensorflow_write_at(prefix: str, stage: int) -> None:
    """Turn checkpoint ``prefix``, written, back into the files a kill at `_TF_STAGES`
    ``[stage]`` leaves."""
    folder, base = os.path.split(prefix)
    temp = prefix + "_temp"
    os.makedirs(temp)
    for name in checkpoint_files.data_files(prefix):
        final = os.path.join(folder, name)
        part = os.path.join(temp, "part-00000-of-00001" + name[len(base) :])
        is_index = name.endswith(".index")
        if stage <= 1 and not is_index:  # shards still in the temp folder, half written at 0
            with open(final, "rb") as file:
                data = file.read()
            with open(part, "wb") as file:
                file.write(data[: len(data) // 2] if stage == 0 else data)
            os.unlink(final)
        elif is_index and stage >= 1:  # the shard's own index, merged into place at stage 3
            shutil.copyfile(final, part)
        if is_index and stage < 3:
            os.unlink(final)


def _traced(func: Callable, tracer: Tracer, op: str, path_of: Callable) -> Callable:
    def traced(*args, **kwargs):
        tracer.hit(op, path_of(*args, **kwargs))
        return func(*args, **kwargs)

    return traced
