"""``replaygpu serve`` and ``replaygpu info`` as real processes."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import replaygpu as rg
from replaygpu.service.config import ClientConfig
from replaygpu.service.server.ledger import SequenceLedger
from replaygpu.specs import specs_from_env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_accepts_appends_reports_info_and_checkpoints_on_sigterm(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    cli = [sys.executable, "-m", "replaygpu.cli"]
    serve = subprocess.Popen(
        [
            *cli,
            "serve",
            "--env",
            "CartPole-v1",
            "--capacity",
            "1000",
            "--address",
            address,
            "--checkpoint-dir",
            str(tmp_path),
            "--device",
            "/CPU:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = rg.ReplayClient(address, actor_id="cli", config=ClientConfig(retry_deadline_s=120))
        n = 10
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
        client.close()
        info = subprocess.run([*cli, "info", address], capture_output=True, text=True, timeout=60)
        assert info.returncode == 0, info.stderr
        assert "table replay: size 10/1000, inserted 10" in info.stdout
        assert "obs: float32[4]" in info.stdout
    finally:
        serve.send_signal(signal.SIGTERM)
        output, _ = serve.communicate(timeout=60)
    assert serve.returncode == 0, output
    assert list(tmp_path.glob("ckpt-*.index")), output
    table = rg.ReplayTable(specs_from_env(_cartpole()), 1000, device="/CPU:0")
    ledger = SequenceLedger()
    rg.Checkpointer(tmp_path, table=table, ledger=ledger).restore()
    assert table.size == 10 and ledger.last("cli") == 1


def test_info_on_a_server_that_is_not_there_fails_with_a_clear_message():
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "replaygpu.cli", "info", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "UNAVAILABLE" in result.stderr
    assert time.monotonic() - started < 30


def test_info_into_a_closed_pipe_ends_quietly_without_a_traceback():
    """``replaygpu info ADDR | head -3``: the reader is gone before info prints."""
    table = rg.ReplayTable(specs_from_env(_cartpole()), 10, "/CPU:0")
    with rg.serve(table, "127.0.0.1:0") as server:
        read_end, write_end = os.pipe()
        os.close(read_end)  # every write into the pipe now fails with EPIPE
        try:
            result = subprocess.run(
                [sys.executable, "-m", "replaygpu.cli", "info", server.address],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        finally:
            os.close(write_end)
    assert result.returncode == 141, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


def test_serving_on_a_port_in_use_says_address_already_in_use_and_leaves_the_table_unserved():
    table = rg.ReplayTable(specs_from_env(_cartpole()), 10, "/CPU:0")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(rg.ConfigError, match=r"address already in use: .*pick another"):
            rg.serve(table, address)
    assert table.served_at is None
    with rg.serve(table, "127.0.0.1:0") as server:  # the table is free to serve elsewhere
        assert server.address.startswith("127.0.0.1:")


def _cartpole():
    import gymnasium as gym

    return gym.make("CartPole-v1")


def test_serve_with_tls_ca_but_no_server_certificate_refuses_to_serve(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("not read: the flags are checked first\n")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "replaygpu.cli", "serve", "--env", "CartPole-v1"),
            *("--address", f"127.0.0.1:{free_port()}", "--tls-ca", str(ca)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ConfigError" in result.stderr
    assert "--tls-cert and --tls-key are missing" in result.stderr


def test_info_and_actor_take_the_same_token_and_tls_flags_with_the_token_from_the_environment(
    monkeypatch,
):
    from replaygpu.cli import build_parser

    monkeypatch.setenv("REPLAYGPU_TOKEN", "from-env")
    parser = build_parser()
    tls = ["--tls-ca", "ca.pem", "--tls-cert", "c.pem", "--tls-key", "k.pem"]
    tls += ["--server-name", "localhost"]
    info = parser.parse_args(["info", "host:1", *tls])
    actor = parser.parse_args(["actor", "host:1", *tls])
    names = ("token", "tls_ca", "tls_cert", "tls_key", "server_name")
    assert [getattr(info, n) for n in names] == [getattr(actor, n) for n in names]
    assert info.token == "from-env" and actor.tls_key == "k.pem"
    assert parser.parse_args(["actor", "host:1", "--token", "flag"]).token == "flag"


def test_info_json_prints_int64_counters_as_json_numbers():
    """Protobuf's JSON mapping writes int64 fields as strings; `info --json` writes numbers, in
    nested messages (a table's size, its spec's shape) as at the top."""
    table = rg.ReplayTable(specs_from_env(_cartpole()), 10, "/CPU:0")
    with rg.serve(table, "127.0.0.1:0") as server:
        client = rg.ReplayClient(server.address, actor_id="json")
        client.add_batch(
            {
                "obs": np.zeros((3, 4), np.float32),
                "action": np.zeros(3, np.int64),
                "reward": np.ones(3, np.float32),
                "next_obs": np.zeros((3, 4), np.float32),
                "terminated": np.zeros(3, bool),
                "truncated": np.zeros(3, bool),
            }
        )
        client.flush(timeout=60)
        client.close()
        result = subprocess.run(
            [sys.executable, "-m", "replaygpu.cli", "info", server.address, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    (info,) = reply["tables"]
    assert (info["size"], info["capacity"], info["inserted"]) == (3, 10, 3)
    obs = next(f for f in info["spec"] if f["name"] == "obs")
    assert obs["shape"] == [4]
    assert reply["learnerSteps"] == 0 and reply["actors"] >= 0
