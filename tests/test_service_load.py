"""The service under load and outages, over real gRPC on 127.0.0.1: hundreds of concurrent actor
streams with health and Info answering throughout, the max_actors limit, reconnecting after an
outage, small requests packed together."""

import pathlib
import statistics
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from service_helpers import SPEC, columns, free_port, stored_ids

import replaygpu as rg
from replaygpu.errors import BatchError
from replaygpu.service.config import ClientConfig, ServerConfig
from replaygpu.service.wire.status import ResourceExhaustedError
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

SWARM = pathlib.Path(__file__).with_name("actor_swarm.py")


def probe_latencies(address, stop, out):
    """Health checks and Info calls in a loop until ``stop``; ``(health s, Info s)`` to ``out``."""
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        replay = replay_pb2_grpc.ReplayServiceStub(channel)
        while not stop.is_set():
            started = time.monotonic()
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=10.0).status
            assert status == health_pb2.HealthCheckResponse.SERVING
            checked = time.monotonic()
            replay.Info(replay_pb2.InfoRequest(), timeout=10.0)
            out.append((checked - started, time.monotonic() - checked))
            stop.wait(0.05)


def expect_line(process, want):
    line = process.stdout.readline().strip()
    assert line == want, f"actor process said {line!r}, expected {want!r}"


@pytest.mark.timeout(300)
def test_512_concurrent_actor_streams_all_land_and_health_answers_throughout():
    # 4 actor processes of 128 clients each; the server and the prober in this process
    processes, per_process = 4, 128
    table = rg.ReplayTable(SPEC, capacity=8192, device="/CPU:0")
    latencies = []
    stop = threading.Event()
    swarm = []
    with rg.serve(table) as server:
        prober = threading.Thread(target=probe_latencies, args=(server.address, stop, latencies))
        prober.start()
        try:
            for p in range(processes):
                args = [server.address, f"p{p}-", str(per_process), str(p * 3 * per_process)]
                swarm.append(
                    subprocess.Popen(
                        [sys.executable, str(SWARM), *args],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            for process in swarm:
                expect_line(process, "ready")
            assert server.open_streams == processes * per_process  # all open, idle
            before = len(latencies)
            time.sleep(1.0)
            assert len(latencies) > before  # health and Info answer with all streams open
            for process in swarm:  # all 512 streams busy at once
                process.stdin.write("go\n")
                process.stdin.flush()
            for process in swarm:
                expect_line(process, "done")
        finally:
            stop.set()
            prober.join()
            for process in swarm:
                process.stdin.close()
            for process in swarm:
                assert process.wait(timeout=60) == 0
        ledger = server.ledger.snapshot()
    n = processes * per_process
    assert ledger == {f"p{p}-{i}": 2 for p in range(processes) for i in range(per_process)}
    assert table.total_inserted == 3 * n
    assert stored_ids(table).tolist() == list(range(3 * n))
    health_s = [h for h, _ in latencies]
    info_s = [i for _, i in latencies]
    assert max(health_s) < 2.0, f"slowest health check {max(health_s):.2f} s"
    assert max(info_s) < 2.0, f"slowest Info {max(info_s):.2f} s"
    assert statistics.median(health_s) < 0.2 and statistics.median(info_s) < 0.2


def test_a_stream_past_max_actors_is_refused_at_once_naming_the_limit():
    table = rg.ReplayTable(SPEC, capacity=64, device="/CPU:0")
    config = ServerConfig(max_actors=2)
    with rg.serve(table, config=config) as server:
        held = [rg.ReplayClient(server.address, actor_id=f"held{i}") for i in range(2)]
        for i, client in enumerate(held):
            client.add_batch(columns([i]))
            client.flush(timeout=30)
        extra = rg.ReplayClient(server.address, actor_id="extra")
        extra.add_batch(columns([7, 8]))
        started = time.monotonic()
        with pytest.raises(ResourceExhaustedError, match="max_actors=2") as caught:
            extra.flush(timeout=30)
        assert time.monotonic() - started < 5.0
        assert "2 transitions in 1 requests" in str(caught.value)  # what was not acknowledged
        extra.close()
        held[0].close()  # a slot frees up: a new actor gets in
        deadline = time.monotonic() + 10
        while server.open_streams > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        with rg.ReplayClient(server.address, actor_id="late") as late:
            late.add_batch(columns([9]))
        held[1].close()
    assert stored_ids(table).tolist() == [0, 1, 9]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("outage_s", [5.0, 60.0])
def test_a_client_reconnects_within_3_s_of_the_server_coming_back(outage_s):
    address = f"127.0.0.1:{free_port()}"
    first = rg.ReplayTable(SPEC, capacity=64, device="/CPU:0")
    second = rg.ReplayTable(SPEC, capacity=64, device="/CPU:0")
    with rg.serve(first, address) as server:
        client = rg.ReplayClient(address, actor_id="patient")
        client.add_batch(columns([1]))
        client.flush(timeout=30)
        ledger = server.ledger
    client.add_batch(columns([2, 3]))  # buffered while the server is down
    time.sleep(outage_s)
    with rg.serve(second, address, ledger=ledger) as server:
        back = time.monotonic()
        client.flush(timeout=60)
        reconnect_s = time.monotonic() - back
        client.close()
    assert stored_ids(second).tolist() == [2, 3]
    assert reconnect_s < 3.0, f"first ack {reconnect_s:.1f} s after the server came back"


def test_small_add_batch_calls_are_packed_into_few_requests():
    table = rg.ReplayTable(SPEC, capacity=4096, device="/CPU:0")
    config = ClientConfig(max_batch_transitions=1000, max_delay_s=10.0)
    with rg.serve(table) as server:
        with rg.ReplayClient(server.address, actor_id="packer", config=config) as client:
            for start in range(0, 2500, 10):
                client.add_batch(columns(range(start, start + 10)))
            for i in range(2500, 2600):
                client.add({"id": i, "obs": np.full(4, i, np.float32)})
        assert server.ledger.last("packer") == 3  # 1000 + 1000 + 600 rows
    assert stored_ids(table).tolist() == list(range(2600))


def test_add_rejects_a_bad_row_naming_the_field_and_adds_nothing():
    table = rg.ReplayTable(SPEC, capacity=64, device="/CPU:0")
    with rg.serve(table) as server, rg.ReplayClient(server.address, "strict") as client:
        client.add({"id": 1, "obs": np.zeros(4, np.float32)})
        bad_rows = [
            ({"id": 2, "obs": np.zeros(3, np.float32)}, "field 'obs': expected shape"),
            ({"id": 2, "obs": np.full(4, -1e39)}, "field 'obs': expected dtype"),
            ({"id": 2.5j, "obs": np.zeros(4, np.float32)}, "field 'id'"),
            ({"id": 2}, "missing 'obs'"),
            ({"id": 2, "obs": np.zeros(4, np.float32), "x": 1}, "unexpected fields"),
            ({"id": np.float32(2.5), "obs": np.zeros(4, np.float32)}, "field 'id'"),
            ({"id": 2, "obs": 0.0}, "field 'obs'"),
        ]
        for row, message in bad_rows:
            with pytest.raises(BatchError, match=message):
                client.add(row)
        client.add({"id": 3, "obs": [3, 3, 3, 3]})  # plain lists are converted
    assert stored_ids(table).tolist() == [1, 3]


@pytest.mark.parametrize(
    "actor_id, problem",
    [("x" * 129, "129 characters long"), ("tab\there", "printable ASCII"), ("é", "ASCII")],
)
def test_actor_ids_are_bounded_on_both_sides(actor_id, problem):
    table = rg.ReplayTable(SPEC, capacity=64, device="/CPU:0")
    with rg.serve(table) as server:
        with pytest.raises(rg.ConfigError, match=problem):
            rg.ReplayClient(server.address, actor_id=actor_id)
        from replaygpu.service.wire.append_request import encode_append_request

        data = encode_append_request("replay", actor_id, 1, columns([1]))
        with grpc.insecure_channel(server.address) as channel:
            call = channel.stream_stream(
                "/replaygpu.v1.ReplayService/Append",
                request_serializer=lambda b: b,
                response_deserializer=replay_pb2.AppendAck.FromString,
            )
            with pytest.raises(grpc.RpcError) as caught:
                list(call(iter([data]), timeout=10))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'actor_id'" in caught.value.details() and problem in caught.value.details()
    assert table.total_inserted == 0


def test_the_retry_deadline_counts_from_the_first_failure_not_the_last_ack():
    # an actor idle for longer than retry_deadline_s keeps working across a server restart
    address = f"127.0.0.1:{free_port()}"
    config = ClientConfig(retry_deadline_s=1.0)
    first = rg.ReplayTable(SPEC, capacity=64, device="/CPU:0")
    second = rg.ReplayTable(SPEC, capacity=64, device="/CPU:0")
    with rg.serve(first, address) as server:
        client = rg.ReplayClient(address, actor_id="idle", config=config)
        client.add_batch(columns([1]))
        client.flush(timeout=30)
        ledger = server.ledger
        time.sleep(1.5)  # idle, longer than the deadline
    with rg.serve(second, address, ledger=ledger):
        client.add_batch(columns([2]))
        client.flush(timeout=30)
        client.close()
    assert stored_ids(second).tolist() == [2]
