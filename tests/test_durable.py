"""Durable acknowledgements (``ServerConfig(journal_dir=...)``): an ack means "on disk".

Acknowledged batches are journalled before they are written and replayed over the restored
checkpoint when a server starts, so a crash (here: kill -9 of ``replaygpu serve``) loses no
acknowledged transition and duplicates none. Real servers on 127.0.0.1, real checkpoints and
journals in temporary folders.
"""

import json
import re
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from service_helpers import SPEC, columns, free_port, restored, stored_ids

import replaygpu as rg
from replaygpu.checkpoint_files import sealed
from replaygpu.service.config import ClientConfig, ServerConfig
from replaygpu.specs import spec_to_json


def test_a_restarted_server_replays_the_journal_over_its_checkpoint(tmp_path):
    config = ServerConfig(journal_dir=str(tmp_path / "journal"))
    table, ledger, ckpt = restored(tmp_path / "ckpt")
    server = rg.serve(table, config=config, ledger=ledger)
    with server, rg.ReplayClient(server.address, actor_id="a") as client:
        client.add_batch(columns(range(0, 10)))
        client.flush()
        server.save(ckpt)  # ids 0..9 in the checkpoint; their segment kept, for no
        # checkpoint came before it: were this one corrupt, the journal alone restores them
        assert server.journal.segments == 2 and server.journal.nbytes > 0
        assert server.ledger.journal_segment == 2
        client.add_batch(columns(range(10, 25)))
        client.flush()
        client.add_batch(columns(range(25, 30)))
    # "crash": nothing after the checkpoint was saved, but all of it was acknowledged
    table, ledger, _ = restored(tmp_path / "ckpt")
    assert stored_ids(table).tolist() == list(range(10))
    with rg.serve(table, config=config, ledger=ledger) as server:
        assert stored_ids(table).tolist() == list(range(30))
        assert server.ledger.last("a") == 3
        with rg.ReplayClient(server.address, actor_id="a") as client:  # continues at seq 4
            client.add_batch(columns([30]))
    assert table.total_inserted == 31 and stored_ids(table).tolist() == list(range(31))


def test_replaying_the_journal_twice_duplicates_nothing(tmp_path):
    config = ServerConfig(journal_dir=str(tmp_path / "journal"))
    table = rg.ReplayTable(SPEC, capacity=4096, device="/CPU:0")
    with rg.serve(table, config=config) as server:
        with rg.ReplayClient(server.address, actor_id="a") as client:
            client.add_batch(columns(range(5)))
        ledger = server.ledger
    # the same table and ledger served again: every journal record is a duplicate now
    with rg.serve(table, config=config, ledger=ledger):
        pass
    assert table.total_inserted == 5 and stored_ids(table).tolist() == list(range(5))


def test_a_journal_directory_serves_one_server_at_a_time(tmp_path):
    config = ServerConfig(journal_dir=str(tmp_path / "journal"))
    first = rg.ReplayTable(SPEC, capacity=64, device="/CPU:0", name="one")
    second = rg.ReplayTable(SPEC, capacity=64, device="/CPU:0", name="two")
    with rg.serve(first, config=config), pytest.raises(rg.ConfigError, match="journal"):
        rg.serve(second, config=config)
    assert second.served_at is None


def start_serve(address, tmp_path, log):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(spec_to_json(SPEC)))
    command = [sys.executable, "-m", "replaygpu.cli", "serve", "--spec", str(spec)]
    command += ["--capacity", "100000", "--address", address]
    command += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every-s", "1"]
    command += ["--journal-dir", str(tmp_path / "journal")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 120
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                health.Check(health_pb2.HealthCheckRequest(), timeout=1, wait_for_ready=True)
                return process
            except grpc.RpcError:
                assert process.poll() is None, "replaygpu serve exited"
                assert time.monotonic() < deadline, "replaygpu serve did not start"


@pytest.mark.timeout(300)
def test_kill_9_of_a_durable_server_loses_no_acknowledged_transition(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    with open(tmp_path / "serve.log", "w") as log:
        server = start_serve(address, tmp_path, log)
        config = ClientConfig(max_batch_transitions=50, max_delay_s=0.01)
        client = rg.ReplayClient(address, actor_id="durable", config=config)
        sent = 0
        try:
            started = time.monotonic()
            deadline = started + 120
            # 4 s or more, spanning two sealed periodic checkpoints (1 s; on a loaded machine
            # they come later)
            while time.monotonic() - started < 4.0 or len(sealed(str(tmp_path / "ckpt"))) < 2:
                assert time.monotonic() < deadline, "no two checkpoints sealed in 120 s"
                if sent < 90_000:  # within the capacity, with room for the batches below
                    client.add_batch(columns(range(sent, sent + 25)))
                    sent += 25
                time.sleep(0.002)  # ~1e4 transitions/s: many commit rounds
            # Kill right after a fresh acknowledgement, with more batches in flight: an ack
            # that lands after the last periodic checkpoint must come back from the journal
            # (on a loaded machine acks can stall for longer than a checkpoint period).
            acked = client.acked_transitions
            client.add_batch(columns(range(sent, sent + 25)))
            sent += 25
            deadline = time.monotonic() + 30
            while client.acked_transitions == acked and time.monotonic() < deadline:
                time.sleep(0.001)
            client.add_batch(columns(range(sent, sent + 25)))
            sent += 25
            acked_at_kill = client.acked_transitions
            server.send_signal(signal.SIGKILL)
            server.wait()
            # what the server acknowledged must be in the restarted server, nothing twice
            server = start_serve(address, tmp_path, log)
            with rg.ReplayClient(address, actor_id="probe") as probe:
                after_restart = probe.info().tables[0].inserted
            assert after_restart >= acked_at_kill > 0
            client.flush(timeout=120)  # the client resends what was not acknowledged
            info = client.info().tables[0]
            assert info.inserted == sent, f"{info.inserted} stored, {sent} sent"
            assert info.size == sent
            client.close()
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=60) == 0
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    # the table's content: every id exactly once
    table, _, _ = restored(tmp_path / "ckpt", capacity=100_000)
    assert stored_ids(table).tolist() == list(range(sent))
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log
    # the restart took acknowledged transitions from the journal, not only the checkpoint
    replayed = [int(n) for n in re.findall(r"records read, (\d+) transitions not in the", log)]
    assert len(replayed) == 2 and replayed[1] > 0, replayed
