"""``replaygpu health ADDRESS`` as a real process: the container health check. SERVING exits 0;
anything else exits 1 with one line on stderr, within ``--timeout``, without TensorFlow."""

import socket
import subprocess
import sys
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from service_helpers import SPEC, free_port

import replaygpu as rg

#: runs ``replaygpu health ARGS...`` and fails if that imported TensorFlow
HEALTH = (
    "import sys\n"
    "from replaygpu.cli import main\n"
    "code = main(['health', *sys.argv[1:]])\n"
    "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow')\n"
    "assert not loaded, loaded\n"
    "sys.exit(code)\n"
)


def health_command(*args, timeout=60):
    """``(exit code, stdout, stderr, seconds)`` of ``replaygpu health ARGS...``."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", HEALTH, *args], capture_output=True, text=True, timeout=timeout
    )
    return result.returncode, result.stdout, result.stderr, time.monotonic() - started


@pytest.fixture(scope="module")
def server():
    with rg.serve(rg.ReplayTable(SPEC, capacity=10, device="/CPU:0")) as server:
        yield server


@pytest.mark.parametrize("service", ["", "replaygpu.v1.ReplayService"])
def test_a_serving_server_prints_serving_and_exits_0_without_importing_tensorflow(server, service):
    code, out, err, _ = health_command(server.address, "--service", service)
    assert (code, out) == (0, "SERVING\n"), err
    assert err == ""


def test_a_port_with_nothing_listening_exits_1_with_one_line_naming_the_address():
    address = f"127.0.0.1:{free_port()}"
    code, out, err, seconds = health_command(address, "--timeout", "5")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert address in err and "UNAVAILABLE" in err
    assert seconds < 30


def test_a_server_that_never_answers_exits_1_once_the_timeout_passes():
    with socket.socket() as silent:  # accepts connections (backlog), never speaks HTTP/2
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        code, out, err, seconds = health_command(address, "--timeout", "1")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert address in err and "DEADLINE_EXCEEDED" in err
    assert 1 <= seconds < 30


def test_an_unknown_service_exits_1_naming_it(server):
    code, out, err, _ = health_command(server.address, "--service", "no.such.Service")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "'no.such.Service'" in err and "NOT_FOUND" in err


def test_a_server_not_serving_prints_its_status_and_exits_1():
    grpc_server = grpc.server(futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        code, out, err, _ = health_command(f"127.0.0.1:{port}")
    finally:
        grpc_server.stop(None)
    assert (code, out) == (1, "NOT_SERVING\n")
    assert err.count("\n") == 1 and f"127.0.0.1:{port}" in err and "NOT_SERVING" in err
