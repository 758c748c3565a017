"""Checkpoints survive a crash at every file operation of a save (`crash_points`): for a served
table and for a learner, with and without a journal, a restart restores the newest sealed
checkpoint (never skips one), loses nothing acknowledged beyond what the docs promise
(docs/service/exactly-once.md), removes the leftovers of the killed save in one log line, and
numbers its next save above everything in the folder. Real servers on 127.0.0.1, real
checkpoints in temporary folders; a last test kills a real ``replaygpu serve`` with SIGKILL
inside the seal."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from crash_points import crash_at
from service_helpers import SPEC, columns, free_port, stored_ids

import replaygpu as rg
from replaygpu import checkpoint_files
from replaygpu.service.config import ClientConfig, ServerConfig
from replaygpu.service.server.ledger import SequenceLedger
from replaygpu.service.wire.status import ServiceError
from replaygpu.specs import spec_to_json

KEEP = 2  # checkpoints kept: the third save prunes the first


def build(folder, learner):
    """A table and ledger (a served table's checkpoint), plus for a learner its sampler,
    learner, weights and optimizer; their checkpointer."""
    table = rg.ReplayTable(SPEC, capacity=4096, device="/CPU:0")
    ledger = SequenceLedger()
    objects = {"table": table, "ledger": ledger}
    if learner:
        sampler = rg.Sampler(table, seed=1)
        w = tf.Variable(tf.zeros([4]), name="w")
        opt = tf.keras.optimizers.Adam(0.1)
        opt.build([w])

        def update(batch):
            with tf.GradientTape() as tape:
                pred = tf.linalg.matvec(batch["obs"], w)
                loss = tf.reduce_mean(tf.square(pred - tf.cast(batch["id"], tf.float32)))
            opt.apply_gradients([(tape.gradient(loss, w), w)])
            return {"loss": loss}

        step = rg.Learner(table, sampler, update, batch_size=8)
        objects.update(sampler=sampler, learner=step, w=w, opt=opt)
    return objects, rg.Checkpointer(str(folder), max_to_keep=KEEP, **objects)


def state(objects):
    """What a checkpoint of ``objects`` holds that the test compares: ids, ledger, weights."""
    weights = objects["w"].numpy().tolist() if "w" in objects else None
    return stored_ids(objects["table"]).tolist(), objects["ledger"].last("a"), weights


def run_until_crash(folder, journal, learner, point):
    """Three saves of a served table with acknowledged appends before each; the third crashes
    at file operation ``point``. Returns the states each sealed save held and the operations
    the third made."""
    objects, ckpt = build(folder, learner)
    config = ServerConfig(journal_dir=journal)
    saved = {}
    server = rg.serve(objects["table"], config=config, ledger=objects["ledger"])
    with server, rg.ReplayClient(server.address, actor_id="a") as client:
        for first in (0, 100, 200):
            client.add_batch(columns(range(first, first + 100)))
            client.flush()
            if learner:
                with server.training_turn():
                    objects["learner"].train(5)
            if first < 200:
                saved[server.save(ckpt)] = state(objects)
                continue
            expected = state(objects)
            with crash_at(ckpt, point) as tracer:
                saved[server.save(ckpt)] = expected
    # the killed process's save wrote no more; what it sealed is what the folder says
    newest = os.path.join(str(folder), "ckpt-3")
    if checkpoint_files.has_manifest(newest) and newest not in saved:
        saved[newest] = expected
    return saved, tracer.ops


def files_in(folder):
    """Every file in ``folder``, its subfolders' too."""
    return sorted(
        os.path.relpath(os.path.join(top, n), folder)
        for top, _, names in os.walk(folder)
        for n in names
    )


def files_of(prefixes):
    """The files of sealed checkpoints ``prefixes`` and TensorFlow's state file naming them."""
    names = ["checkpoint"] if prefixes else []
    for prefix in prefixes:
        names += [*checkpoint_files.data_files(prefix), os.path.basename(prefix) + ".manifest.json"]
    return sorted(names)


def operations(tmp_path, learner):
    """The file operations of the third save, traced without a crash."""
    _, ops = run_until_crash(tmp_path / "trace", None, learner, None)
    return ops


@pytest.mark.parametrize("learner", [False, True], ids=["serve", "learner"])
def test_a_save_makes_the_traced_file_operations_in_a_crash_safe_order(tmp_path, learner):
    ops = operations(tmp_path, learner)
    names = [op.rsplit(" ", 1)[1] for op in ops]
    kinds = [op.rsplit(" ", 1)[0] for op in ops]
    seal = names.index("trace/ckpt-3.manifest.json")
    assert kinds[seal] == "rename" and names[seal - 1] == "trace/ckpt-3.manifest.json.tmp"
    # everything the manifest names is fsynced before it is written, the folder after it
    assert {"trace/ckpt-3.index", "trace/ckpt-3.data-00000-of-00001"} <= {
        n for k, n in zip(kinds[:seal], names[:seal], strict=True) if k == "fsync"
    }
    assert kinds[seal + 1] == "fsync" and names[seal + 1] == "trace"
    # then the prune of ckpt-1: its manifest goes first
    prune = [n for k, n in zip(kinds, names, strict=True) if k == "unlink"]
    assert prune[0] == "trace/ckpt-1.manifest.json"
    assert set(prune[1:]) == {"trace/ckpt-1.index", "trace/ckpt-1.data-00000-of-00001"}
    assert len(ops) >= 14


@pytest.mark.parametrize("journal", [False, True], ids=["no-journal", "journal"])
@pytest.mark.parametrize("learner", [False, True], ids=["serve", "learner"])
def test_a_crash_at_every_file_operation_of_a_save_loses_nothing_promised(
    tmp_path, caplog, journal, learner
):
    ops = operations(tmp_path, learner)
    for point in range(len(ops) + 1):
        folder, journal_dir = tmp_path / f"ckpt{point}", tmp_path / f"journal{point}"
        saved, crashed = run_until_crash(
            folder, str(journal_dir) if journal else None, learner, point
        )
        where = f"crash {point}: {crashed[-1] if point < len(ops) else 'none'}"
        caplog.clear()
        assert any(name.startswith("ckpt-3") for name in os.listdir(folder)), where
        objects, ckpt = build(folder, learner)
        # the killed save's leftovers are gone, in one line that counts them
        assert checkpoint_files.leftovers(str(folder), KEEP) == [], where
        removed = [
            r.getMessage() for r in caplog.records if "leftovers of interrupted" in r.getMessage()
        ]
        assert len(removed) <= 1, where
        sealed = checkpoint_files.sealed(str(folder))
        assert files_in(folder) == files_of(sealed), where
        # the newest sealed checkpoint is restored, never skipped, with what it held
        path = ckpt.restore()
        assert path == sealed[0] and "after skipping" not in caplog.text, where
        ids, seq, weights = state(objects)
        assert (ids, seq, weights) == saved[path], where
        if journal:  # the journal replays every acknowledged batch over it
            config = ServerConfig(journal_dir=str(journal_dir))
            with rg.serve(objects["table"], config=config, ledger=objects["ledger"]):
                assert stored_ids(objects["table"]).tolist() == list(range(300)), where
        else:  # the docs' promise: what came after the newest checkpoint may be lost
            assert ids == list(range(len(ids))) and len(ids) >= 200, where
        # the next save is numbered above everything the folder held, and restores
        newest = ckpt.save()
        number = int(newest.rsplit("-", 1)[1])
        assert number == 4, where  # ckpt-3 had files when it was killed: never reused
        again, _ = build(folder, learner)
        assert rg.Checkpointer(str(folder), **again).restore() == newest, where
        assert state(again)[0] == stored_ids(objects["table"]).tolist(), where


def test_repeated_crashes_keep_the_folder_bounded(tmp_path, caplog):
    """Twelve runs killed at a different point of a save each: the folder never holds more
    than the kept checkpoints, one more being sealed, and the killed save's files."""
    folder = tmp_path / "ckpt"
    points = len(operations(tmp_path, False))
    one = None
    for run in range(12):
        objects, ckpt = build(folder, learner=False)
        ckpt.restore()
        objects["table"].append(columns(range(run * 10, run * 10 + 10)))
        first = ckpt.save()
        one = one or sum(
            os.path.getsize(os.path.join(folder, n))
            for n in os.listdir(folder)
            if n.startswith(os.path.basename(first) + ".")
        )
        with crash_at(ckpt, (run * 5) % points) as tracer:
            ckpt.save()
        assert tracer.ops, run
        size = sum(
            os.path.getsize(os.path.join(top, n))
            for top, _, names in os.walk(folder)
            for n in names
        )
        assert size <= (KEEP + 2) * one * 1.1, (run, sorted(os.listdir(folder)))
    objects, ckpt = build(folder, learner=False)
    assert len(checkpoint_files.sealed(str(folder))) <= KEEP + 1
    assert ckpt.restore() is not None and checkpoint_files.leftovers(str(folder), KEEP) == []


#: seconds `SEAL_KILLER` sleeps before its first seal: a first save slow on a loaded machine
FIRST_SEAL_DELAY_ENV = "SEAL_KILLER_FIRST_SEAL_DELAY_S"

SEAL_KILLER = f"""
import os, signal, sys, time
from replaygpu import checkpoint_files
seal, trigger = checkpoint_files.seal, sys.argv.pop(1)
late = [float(os.environ.get("{FIRST_SEAL_DELAY_ENV}", "0"))]  # the first seal pops it
def killing_seal(prefix):  # once the trigger file exists: SIGKILL before the manifest's rename
    if late:
        time.sleep(late.pop())
    if os.path.exists(trigger):
        replace = os.replace
        def kill(src, dst):
            if dst.endswith(".manifest.json"):
                os.kill(os.getpid(), signal.SIGKILL)
            replace(src, dst)
        checkpoint_files.os = type(os)("os")
        checkpoint_files.os.__dict__.update(os.__dict__, replace=kill)
    return seal(prefix)
checkpoint_files.seal = killing_seal
from replaygpu.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("first_seal_delay_s", [0.0, 5.0], ids=["first-seal-on-time", "late"])
def test_serve_killed_inside_the_seal_restarts_from_its_last_sealed_checkpoint(
    tmp_path, first_seal_delay_s
):
    """The reported loss: ``serve`` without a journal, SIGKILLed between a manifest's write and
    its rename (at the first seal after a checkpoint holding acknowledged batches was sealed).
    The restarted server restores the checkpoint before it, and its own later
    checkpoints are sealed, restored after a second kill, and hold every batch acknowledged
    before the one they follow was sealed. ``late``: the first seal comes 5 s late, as on a
    loaded machine; the kill still waits for a sealed checkpoint."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(spec_to_json(SPEC)))
    folder = tmp_path / "ckpt"

    def serve(*python, env=None):
        address = f"127.0.0.1:{free_port()}"
        command = [*python, "serve", "--spec", str(spec), "--capacity", "4096"]
        command += ["--address", address, "--checkpoint-dir", str(folder)]
        command += ["--checkpoint-every-s", "0.5"]
        log = open(tmp_path / f"serve-{address.rsplit(':', 1)[1]}.log", "w")  # noqa: SIM115
        with log:  # a file, not a pipe: nobody reads the log while it runs
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            return proc, address

    def sealed_numbers():
        return [int(p.rsplit("-", 1)[1]) for p in checkpoint_files.sealed(str(folder))]

    def newest_sealed():
        return max(sealed_numbers(), default=0)

    trigger = tmp_path / "kill-at-the-next-seal"
    late = {**os.environ, FIRST_SEAL_DELAY_ENV: str(first_seal_delay_s)}
    proc, address = serve(sys.executable, "-c", SEAL_KILLER, str(trigger), env=late)
    try:
        patient = ClientConfig(retry_deadline_s=60)  # a server that never comes: fail, not hang
        client = rg.ReplayClient(address, actor_id="a", config=patient)
        seq, mark = 0, None  # mark: (transitions acked, the newest sealed checkpoint then)
        deadline = time.monotonic() + 120
        try:
            while proc.poll() is None:  # until the seal after the trigger kills it
                assert time.monotonic() < deadline, "serve was not killed at a seal in 120 s"
                if seq < 300:  # 3000 ids: within the capacity, below the restart's ids
                    client.add_batch(columns(range(seq * 10, seq * 10 + 10)))
                    seq += 1
                    with contextlib.suppress(TimeoutError, ServiceError):  # it died meanwhile
                        client.flush(timeout=5)
                if mark is None and client.acked_transitions:
                    mark = (client.acked_transitions, newest_sealed())
                elif mark and not trigger.exists() and newest_sealed() >= mark[1] + 2:
                    # checkpoint N+2 began after N+1 was sealed, after the acks were counted:
                    # a sealed checkpoint holds them; the next seal is killed
                    trigger.touch()
                time.sleep(0.02)
        finally:
            client.close(flush=False, timeout=1)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        unsealed = list(folder.glob("*.manifest.json.tmp"))
        assert len(unsealed) == 1, sorted(os.listdir(folder))
        killed = int(unsealed[0].name.split(".")[0].rsplit("-", 1)[1])
        assert sealed_numbers() and max(sealed_numbers()) < killed
        # what the restart restores (read from a copy: the restart must find the leftovers)
        shutil.copytree(folder, tmp_path / "copy")
        objects, ckpt = build(tmp_path / "copy", learner=False)
        assert ckpt.restore() == str(tmp_path / "copy" / f"ckpt-{max(sealed_numbers())}")
        assert set(range(mark[0])) <= set(stored_ids(objects["table"]).tolist())

        proc, address = serve(sys.executable, "-m", "replaygpu.cli")
        with rg.ReplayClient(address, actor_id="a", config=patient) as client:
            seq, first, acked = 1000, None, None
            deadline = time.monotonic() + 120
            while first is None or max(sealed_numbers()) < first + 2:
                assert time.monotonic() < deadline, f"sealed: {sealed_numbers()}, first {first}"
                client.add_batch(columns(range(seq * 10, seq * 10 + 10)))
                client.flush(timeout=60)
                if first is None and max(sealed_numbers()) > killed:
                    first, acked = max(sealed_numbers()), seq  # acked once it was sealed
                seq += 1
                time.sleep(0.02)
            deadline = time.monotonic() + 30  # a seal prunes after its rename: let that finish
            while min(sealed_numbers()) < killed and time.monotonic() < deadline:
                time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=30)
        assert not unsealed[0].exists() and min(sealed_numbers()) > killed  # never reused
        newest = checkpoint_files.sealed(str(folder))[0]
        number = int(newest.rsplit("-", 1)[1])
        objects, ckpt = build(folder, learner=False)
        assert ckpt.restore() == newest and checkpoint_files.verify(newest) is None
        ids = set(stored_ids(objects["table"]).tolist())
        # checkpoint N+2 was saved after N was sealed: it holds every batch acked by then
        assert number >= first + 2 and set(range(10_000, acked * 10 + 10)) <= ids
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
