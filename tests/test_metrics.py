"""The Prometheus endpoint over real HTTP and gRPC on 127.0.0.1: what a scrape reports after
appends, refused batches and checkpoints, the learner's values, and ``replaygpu serve
--metrics-port`` as a real process."""

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_helpers import SPEC, columns, free_port

import replaygpu as rg
from replaygpu.service.ops.metrics import start_metrics_server
from replaygpu.service.wire.append_request import encode_append_request
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

ROW_BYTES = 8 + 4 * 4  # id int64 + obs float32[4]


def scrape(url):
    """``{(sample name, ((label, value), ...)): value}`` of one scrape of ``url``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def append_request(seq, cols, actor="raw"):
    return replay_pb2.AppendRequest.FromString(encode_append_request("replay", actor, seq, cols))


def answers(samples, code):
    return samples[("replaygpu_append_requests_total", (("code", code),))]


@pytest.fixture
def table():
    return rg.ReplayTable(SPEC, capacity=100, device="/CPU:0")


def test_a_scrape_reports_ingested_transitions_answers_by_code_table_and_checkpoints(
    table, tmp_path
):
    with (
        rg.serve(table, "127.0.0.1:0") as server,
        start_metrics_server(0, server, address="127.0.0.1") as metrics,
    ):
        before = scrape(metrics.url)
        assert before[("replaygpu_ingested_transitions_total", ())] == 0
        assert answers(before, "OK") == 0 and answers(before, "INVALID_ARGUMENT") == 0
        assert before[("replaygpu_checkpoints_total", ())] == 0

        client = rg.ReplayClient(server.address, actor_id="client")
        client.add_batch(columns(range(10)))
        client.flush(timeout=30)
        client.close()
        with grpc.insecure_channel(server.address) as channel:
            stub = replay_pb2_grpc.ReplayServiceStub(channel)
            # two new batches and a replay of the first (acknowledged, not inserted)
            first, second = columns([10, 11]), columns([12])
            requests = [append_request(1, first), append_request(2, second)]
            assert len(list(stub.Append(iter([*requests, append_request(1, first)])))) == 3
            bad = columns([13])
            bad["obs"] = bad["obs"].astype(np.float64)
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Append(iter([append_request(1, bad, actor="bad")])))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        ckpt = rg.Checkpointer(tmp_path, table=table, ledger=server.ledger)
        server.save(ckpt)

        after = scrape(metrics.url)
        assert after[("replaygpu_ingested_transitions_total", ())] == 13
        assert after[("replaygpu_ingested_bytes_total", ())] == 13 * ROW_BYTES
        assert answers(after, "OK") == 1 + 3  # the client's one request, then three raw ones
        assert answers(after, "INVALID_ARGUMENT") == 1
        assert answers(after, "RESOURCE_EXHAUSTED") == 0
        assert after[("replaygpu_table_size", ())] == 13
        assert after[("replaygpu_table_capacity", ())] == 100
        assert after[("replaygpu_table_inserted_total", ())] == 13
        assert after[("replaygpu_staged_batches", ())] == 0
        assert after[("replaygpu_staged_bytes", ())] == 0
        assert after[("replaygpu_known_actors", ())] == 2  # "client" and "raw"
        assert after[("replaygpu_open_streams", ())] == 0
        assert after[("replaygpu_weights_version", ())] == 0
        assert after[("replaygpu_samples_per_insert", ())] == 0
        assert after[("replaygpu_checkpoints_total", ())] == 1
        assert after[("replaygpu_last_checkpoint_duration_seconds", ())] > 0
        info = [key for key in after if key[0] == "replaygpu_server_info"]
        assert info and dict(info[0][1])["table"] == "replay"
        assert not any(key[0].startswith("replaygpu_sgd_steps") for key in after)


def test_learner_stats_are_read_at_each_scrape_and_override_the_servers_checkpoints(table):
    stats = {
        "sgd_steps": 5.0,
        "sgd_steps_per_s": 2.5,
        "checkpoints": 3.0,
        "checkpoint_seconds": 0.25,
    }
    with (
        rg.serve(table, "127.0.0.1:0") as server,
        start_metrics_server(0, server, lambda: stats, address="127.0.0.1") as metrics,
    ):
        first = scrape(metrics.url)
        stats["sgd_steps"] = 7.0
        second = scrape(metrics.url)
    assert first[("replaygpu_sgd_steps_total", ())] == 5
    assert second[("replaygpu_sgd_steps_total", ())] == 7
    assert second[("replaygpu_sgd_steps_per_second", ())] == 2.5
    assert second[("replaygpu_checkpoints_total", ())] == 3
    assert second[("replaygpu_last_checkpoint_duration_seconds", ())] == 0.25


def test_a_scrape_has_the_loss_recent_return_and_eval_gauges_once_they_are_known(table):
    with (
        rg.serve(table, "127.0.0.1:0") as server,
        start_metrics_server(0, server, address="127.0.0.1") as metrics,
    ):
        before = scrape(metrics.url)
        with grpc.insecure_channel(server.address) as channel:
            stub = replay_pb2_grpc.ReplayServiceStub(channel)
            data = encode_append_request("replay", "a", 1, columns([1]), [(10.0, 10), (30.0, 50)])
            list(stub.Append(iter([replay_pb2.AppendRequest.FromString(data)])))
        server.run_stats.set_loss(0.5)
        server.run_stats.set_eval(200.0, 64)
        after = scrape(metrics.url)
    for name in (
        "replaygpu_learner_loss",
        "replaygpu_recent_episode_return",
        "replaygpu_eval_return",
    ):
        assert (name, ()) not in before  # NaN: not known yet, left out
    assert before[("replaygpu_episodes_total", ())] == 0
    assert after[("replaygpu_learner_loss", ())] == 0.5
    assert after[("replaygpu_recent_episode_return", ())] == 20.0
    assert after[("replaygpu_recent_episode_length", ())] == 30.0
    assert after[("replaygpu_recent_episodes", ())] == 2
    assert after[("replaygpu_episodes_total", ())] == 2
    assert after[("replaygpu_eval_return", ())] == 200.0
    assert after[("replaygpu_eval_sgd_step", ())] == 64


def test_a_failing_learner_stats_leaves_the_servers_metrics_in_the_scrape(table, caplog):
    def broken():
        raise RuntimeError("learner gone")

    with (
        rg.serve(table, "127.0.0.1:0") as server,
        start_metrics_server(0, server, broken, address="127.0.0.1") as metrics,
    ):
        samples = scrape(metrics.url)
    assert samples[("replaygpu_table_capacity", ())] == 100
    assert "learner_stats() failed" in caplog.text


def test_two_endpoints_in_one_process_have_their_own_registries_and_close_cleanly():
    a = rg.ReplayTable(SPEC, capacity=10, device="/CPU:0", name="replay")
    b = rg.ReplayTable(SPEC, capacity=20, device="/CPU:0", name="replay")
    with rg.serve(a) as server_a, rg.serve(b) as server_b:
        metrics_a = start_metrics_server(0, server_a, address="127.0.0.1")
        metrics_b = start_metrics_server(0, server_b, address="127.0.0.1")
        try:
            assert scrape(metrics_a.url)[("replaygpu_table_capacity", ())] == 10
            assert scrape(metrics_b.url)[("replaygpu_table_capacity", ())] == 20
        finally:
            metrics_a.close()
            metrics_b.close()
        metrics_a.close()  # idempotent
        assert not [t for t in threading.enumerate() if "serve_forever" in t.name]
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(metrics_a.url, timeout=5)


def test_a_port_in_use_is_a_config_error_naming_it(table):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with rg.serve(table) as server, pytest.raises(rg.ConfigError, match=f"127.0.0.1:{port}"):
            start_metrics_server(port, server, address="127.0.0.1")


def wait_for_scrape(url, process, timeout=120.0):
    """The first scrape of ``url`` that answers, while ``process`` runs."""
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, process.communicate()[0]
        try:
            return scrape(url)
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_serve_with_metrics_port_reports_appends_and_stops_on_sigterm():
    port, metrics_port = free_port(), free_port()
    address, url = f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
    serve = subprocess.Popen(
        [
            *(sys.executable, "-m", "replaygpu.cli", "serve"),
            *("--env", "CartPole-v1", "--capacity", "1000", "--device", "/CPU:0"),
            *("--address", address, "--metrics-port", str(metrics_port)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert wait_for_scrape(url, serve)[("replaygpu_table_capacity", ())] == 1000
        n = 10
        with rg.ReplayClient(address, actor_id="cli") as client:
            client.add_batch(
                {
                    "obs": np.zeros((n, 4), np.float32),
                    "action": np.arange(n, dtype=np.int64),
                    "reward": np.ones(n, np.float32),
                    "next_obs": np.zeros((n, 4), np.float32),
                    "terminated": np.zeros(n, bool),
                    "truncated": np.zeros(n, bool),
                }
            )
            client.flush(timeout=60)
        samples = scrape(url)
        assert samples[("replaygpu_ingested_transitions_total", ())] == n
        assert samples[("replaygpu_table_size", ())] == n
        assert answers(samples, "OK") == 1
    finally:
        serve.send_signal(signal.SIGTERM)
        output, _ = serve.communicate(timeout=60)
    assert serve.returncode == 0, output
    for closed in (port, metrics_port):  # both listeners are gone with the process
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(("127.0.0.1", closed))


def test_wait_scraped_returns_once_a_scrape_read_values_of_then_or_times_out(table):
    with (
        rg.serve(table, "127.0.0.1:0") as server,
        start_metrics_server(0, server, address="127.0.0.1") as metrics,
    ):
        scrape(metrics.url)
        now = time.monotonic()
        started = time.monotonic()
        assert not metrics.wait_scraped(now, 0.3)  # the scrape before does not count
        assert 0.3 <= time.monotonic() - started < 5
        later = threading.Timer(0.2, scrape, [metrics.url])
        later.start()
        assert metrics.wait_scraped(now, 30)
        later.join()
        assert metrics.wait_scraped(now, 0)
