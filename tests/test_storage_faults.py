"""Storage faults, for real: a full disk (a small tmpfs, filled) under the journal and the
checkpoints of a served table, and a truncated or bit-flipped newest checkpoint. Real servers
on 127.0.0.1, real clients, real checkpoints; every test counts the rows that come back.

What must hold: a full disk never stops the server or the learner (appends are refused
retryably with RESOURCE_EXHAUSTED naming the folder and the free bytes, health reports it on
the append path, appends resume by themselves once space is back, a failed checkpoint is
logged and retried); a corrupt newest checkpoint falls back to the previous one plus the
journal with nothing acknowledged lost, or the start is refused in one line naming the file.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from service_helpers import SPEC, columns, free_port, restored, stored_ids
from small_disk import fill, small_filesystem

import replaygpu as rg
from replaygpu.errors import CheckpointSaveError
from replaygpu.service.config import ClientConfig, ServerConfig
from replaygpu.service.server.loop import run as run_learner
from replaygpu.service.server.servicer import SERVICE_NAME
from replaygpu.service.wire.append_request import encode_append_request
from replaygpu.specs import spec_to_json
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def request(seq, ids, actor="raw"):
    data = encode_append_request("replay", actor, seq, columns(ids))
    return replay_pb2.AppendRequest.FromString(data)


def status(health, service):
    return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


FAST_RETRY = ClientConfig(retry_initial_s=0.05, retry_max_s=0.25)


def test_a_full_journal_disk_refuses_appends_retryably_and_they_resume_by_themselves(tmp_path):
    with small_filesystem(tmp_path / "disk", 4 << 20) as disk:
        journal = disk / "journal"
        config = ServerConfig(journal_dir=str(journal))
        table = rg.ReplayTable(SPEC, capacity=100_000, device="/CPU:0")
        with rg.serve(table, config=config) as server:
            channel = grpc.insecure_channel(server.address)
            stub = replay_pb2_grpc.ReplayServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            (ack,) = stub.Append(iter([request(1, range(0, 100))]))
            assert ack.committed_seq == 1
            filler = fill(disk)
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Append(iter([request(2, range(100, 200))])))
            err = refused.value
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"journal {journal}: its file system is full" in err.details()
            assert "bytes free of" in err.details() and "resume by themselves" in err.details()
            assert ("replaygpu-retryable", "1") in tuple(err.trailing_metadata())
            # health: the append path answers NOT_SERVING (readiness), the server SERVING
            wait_for(lambda: status(health, SERVICE_NAME) == NOT_SERVING, 5, "NOT_SERVING")
            assert status(health, "") == SERVING
            assert server.stats()["storage_full"] == 1.0
            # a real client keeps its batches through the refusals and resends them
            client = rg.ReplayClient(server.address, actor_id="client", config=FAST_RETRY)
            refusals = server.append_answers()["RESOURCE_EXHAUSTED"]
            client.add_batch(columns(range(200, 300)))
            wait_for(  # refused, retrying
                lambda: server.append_answers()["RESOURCE_EXHAUSTED"] >= refusals + 2,
                30,
                "the client's batch refused twice",
            )
            assert table.size == 100 and client.acked_transitions == 0
            filler.unlink()  # space is back: no restart, no append needed to notice it
            wait_for(lambda: status(health, SERVICE_NAME) == SERVING, 10, "SERVING again")
            client.flush(timeout=30)
            client.close()
            (ack,) = stub.Append(iter([request(2, range(100, 200))]))  # the refused one, resent
            assert ack.committed_seq == 2 and not ack.duplicate
            assert server.stats()["storage_full"] == 0.0
            channel.close()
        assert stored_ids(table).tolist() == list(range(300))
        # every acknowledged batch is on disk: the journal alone brings all of them back
        fresh = rg.ReplayTable(SPEC, capacity=100_000, device="/CPU:0")
        with rg.serve(fresh, config=config):
            pass
        assert stored_ids(fresh).tolist() == list(range(300))


def test_a_learner_trains_on_while_its_checkpoints_fail_on_a_full_disk(tmp_path, caplog):
    with small_filesystem(tmp_path / "disk", 4 << 20) as disk:
        table = rg.ReplayTable(SPEC, capacity=20_000, device="/CPU:0")  # 480 KB a checkpoint
        table.append(columns(range(1000)))
        learner = rg.Learner(table, rg.Sampler(table, seed=0), lambda b: {"x": tf.zeros([])})
        learner.train(10)  # traced and compiled before the disk fills
        ckpt = rg.Checkpointer(str(disk / "ckpt"), table=table, learner=learner)
        filler = fill(disk)
        stop = threading.Event()
        steps_when_freed = []
        with rg.serve(learner) as server:

            def free_after_two_failures() -> None:
                try:
                    wait_for(lambda: server.checkpoint_failures >= 2, 60, "two failures")
                    steps_when_freed.append(int(learner.steps.numpy()))
                    filler.unlink()
                    time.sleep(1.0)
                finally:
                    stop.set()

            freer = threading.Thread(target=free_after_two_failures)
            freer.start()
            result = run_learner(
                server, learner, 10, stop=stop, checkpointer=ckpt, checkpoint_every_s=0.2
            )
            freer.join()
        failed = [r.getMessage() for r in caplog.records if "cannot write it" in r.getMessage()]
        assert len(failed) >= 2 and all("training goes on, next try in 0 s" in m for m in failed)
        assert "No space left on device" in failed[0] and "bytes free of" in failed[0]
        assert steps_when_freed[0] > 10 and result["steps"] + 10 > steps_when_freed[0]
        assert ckpt.latest is not None and not any(disk.glob("ckpt/*_temp"))
        table2 = rg.ReplayTable(SPEC, capacity=20_000, device="/CPU:0")
        learner2 = rg.Learner(table2, rg.Sampler(table2, seed=0), lambda b: {"x": tf.zeros([])})
        rg.Checkpointer(str(disk / "ckpt"), table=table2, learner=learner2).restore()
        assert int(learner2.steps.numpy()) == int(learner.steps.numpy())
        assert stored_ids(table2).tolist() == list(range(1000))


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how.startswith("truncated"):
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))
    if how.endswith("without manifests"):  # as an older replaygpu wrote them
        for manifest in path.parent.glob("*.manifest.json"):
            manifest.unlink()


@pytest.mark.parametrize("how", ["truncated", "bit-flipped", "truncated, without manifests"])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one_plus_the_journal(
    tmp_path, caplog, how
):
    config = ServerConfig(journal_dir=str(tmp_path / "journal"))
    table, ledger, ckpt = restored(tmp_path / "ckpt")
    server = rg.serve(table, config=config, ledger=ledger)
    with server, rg.ReplayClient(server.address, actor_id="a") as client:
        for first in (0, 100, 200):
            client.add_batch(columns(range(first, first + 100)))
            client.flush()
            if first < 200:  # checkpoint 1 holds 0..99, checkpoint 2 0..199
                newest = server.save(ckpt)
    # 200..299 were acknowledged after checkpoint 2: in the journal only
    data = Path(newest + ".data-00000-of-00001")
    damage(data, how)
    table, ledger, ckpt = restored(tmp_path / "ckpt")
    assert table.size == 100  # checkpoint 1
    warning = next(r.getMessage() for r in caplog.records if "newest intact" in r.getMessage())
    assert newest in warning and (how.endswith("manifests") or str(data) in warning)
    with rg.serve(table, config=config, ledger=ledger) as server:
        # the journal still reaches back to checkpoint 1: nothing acknowledged is lost
        assert stored_ids(table).tolist() == list(range(300))
        assert server.ledger.last("a") == 3
        assert table.total_inserted == 300


def serve_command(tmp_path, address, *extra, capacity=100_000):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(spec_to_json(SPEC)))
    command = [sys.executable, "-m", "replaygpu.cli", "serve", "--spec", str(spec)]
    command += ["--capacity", str(capacity), "--address", address, *extra]
    return command


def test_serve_refuses_to_start_in_one_line_when_no_checkpoint_is_intact(tmp_path):
    config = ServerConfig(journal_dir=str(tmp_path / "journal"))
    table, ledger, ckpt = restored(tmp_path / "ckpt", capacity=100_000)
    server = rg.serve(table, config=config, ledger=ledger)
    with server, rg.ReplayClient(server.address, actor_id="a") as client:
        client.add_batch(columns(range(100)))
        client.flush()
        first = server.save(ckpt)
        client.add_batch(columns(range(100, 200)))
        client.flush()
        second = server.save(ckpt)
    damage(Path(first + ".data-00000-of-00001"), "bit-flipped")
    index_bytes = Path(second + ".index").stat().st_size
    damage(Path(second + ".index"), "truncated")
    before = sorted(os.listdir(tmp_path / "ckpt")) + sorted(os.listdir(tmp_path / "journal"))
    command = serve_command(tmp_path, f"127.0.0.1:{free_port()}")
    command += [
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--journal-dir",
        str(config.journal_dir),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line.lower()]
    assert len(errors) == 1, done.stderr
    line = errors[0]
    assert line.startswith("replaygpu serve: error: CheckpointCorruptError: checkpoint folder")
    truncated = f"{Path(second + '.index').stat().st_size} bytes, {index_bytes} written"
    assert f"{second}.index: {truncated} (truncated" in line
    assert f"{first}.data-00000-of-00001: its bytes changed" in line
    after = sorted(os.listdir(tmp_path / "ckpt")) + sorted(os.listdir(tmp_path / "journal"))
    assert after == before  # nothing was changed or deleted


@pytest.mark.timeout(300)
def test_serve_rides_out_a_full_disk_under_its_journal_and_checkpoints(tmp_path):
    with small_filesystem(tmp_path / "disk", 4 << 20) as disk:
        address = f"127.0.0.1:{free_port()}"
        # 480 KB a checkpoint: three fit on the 4 MiB disk, beside the journal
        command = serve_command(tmp_path, address, "--checkpoint-every-s", "0.5", capacity=20_000)
        command += ["--checkpoint-dir", str(disk / "ckpt"), "--journal-dir", str(disk / "jnl")]
        log_path = tmp_path / "serve.log"
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        try:
            channel = grpc.insecure_channel(address)
            health = health_pb2_grpc.HealthStub(channel)
            health.Check(health_pb2.HealthCheckRequest(), timeout=120, wait_for_ready=True)
            client = rg.ReplayClient(address, actor_id="a", config=FAST_RETRY)
            client.add_batch(columns(range(0, 1000)))
            client.flush(timeout=30)
            fillers = [fill(disk)]
            # A checkpoint being written while the disk fills fails and deletes its ~480 KB,
            # room enough for the next journal write: fill that room until a failure frees none.
            while True:
                failed = log_path.read_text().count("cannot write it")
                wait_for(
                    lambda n=failed: log_path.read_text().count("cannot write it") > n,
                    30,
                    "a failed checkpoint",
                )
                if os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize < 64 << 10:
                    break
                fillers.append(fill(disk, name=f"filler-{len(fillers)}"))
            client.add_batch(columns(range(1000, 2000)))
            wait_for(lambda: status(health, SERVICE_NAME) == NOT_SERVING, 10, "NOT_SERVING")
            failed = log_path.read_text().count("cannot write it")
            wait_for(  # several checkpoints fail meanwhile
                lambda: log_path.read_text().count("cannot write it") >= failed + 3,
                60,
                "3 more failed checkpoints",
            )
            assert process.poll() is None, "replaygpu serve exited on a full disk"
            assert status(health, "") == SERVING
            assert client.acked_transitions == 1000
            for filler in fillers:
                filler.unlink()
            wait_for(lambda: status(health, SERVICE_NAME) == SERVING, 10, "SERVING again")
            client.flush(timeout=30)
            client.close()
            channel.close()
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        log = log_path.read_text()
        assert "Traceback" not in log
        assert "its file system is full" in log and "health: replaygpu.v1" in log
        assert "cannot write it (No space left on device" in log
        assert "training goes on, next try in 0 s" in log
        table, _, _ = restored(disk / "ckpt", capacity=20_000)
        assert stored_ids(table).tolist() == list(range(2000))


def test_a_run_retries_a_failed_periodic_checkpoint_and_raises_a_failed_final_one(tmp_path, caplog):
    from replaygpu.agents.dqn.config import DQNConfig
    from replaygpu.agents.runs import RunControl

    with small_filesystem(tmp_path / "disk", 4 << 20) as disk:
        table = rg.ReplayTable(SPEC, capacity=20_000, device="/CPU:0")  # 480 KB a checkpoint
        table.append(columns(range(100)))
        run = RunControl(str(disk / "run"), 0.2, DQNConfig())
        run.attach(table=table)
        filler = fill(disk)
        time.sleep(0.25)
        assert run.due() and run.save() is None  # logged, not raised
        assert "cannot write it (No space left on device" in caplog.text
        assert "training goes on, next try in 0 s" in caplog.text
        assert not run.due() and run.checkpoints == 0
        with pytest.raises(CheckpointSaveError, match="No space left on device"):
            run.save(final=True)  # the run's last one: its caller must hear of it
        filler.unlink()
        time.sleep(0.25)
        assert run.due() and run.save() is not None and run.checkpoints == 1
        assert (disk / "run" / "run.json").exists()
