"""Expected failures of every command end in one line on stderr and exit status 2; --debug
shows the traceback; --version and ``python -m replaygpu`` work.

Flag and value errors come before TensorFlow is imported: those tests run the CLI with
TensorFlow made unimportable (``sys.modules["tensorflow"] = None``), so a command that imported
it first would end in "tensorflow is not installed" instead of the value's error. The same
setting stands for ``pip install replaygpu`` without the ``cpu``/``gpu`` extra."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replaygpu._version import __version__

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def replaygpu(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "replaygpu", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


#: the CLI in a Python where ``import tensorflow`` fails as it does when it is not installed
WITHOUT_TENSORFLOW = (
    "import sys; sys.modules['tensorflow'] = None; from replaygpu.cli import main; sys.exit(main())"
)


def replaygpu_without_tensorflow(
    *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TENSORFLOW, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        cwd=cwd,
    )


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one stderr line of an expected failure (absl/TF start-up noise aside)."""
    lines = [
        line
        for line in proc.stderr.splitlines()
        if line.startswith("replaygpu ") or "Traceback" in line
    ]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


@pytest.fixture
def not_a_folder(tmp_path):
    """A path under a regular file: no user, root included, can make a folder there."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    return str(blocker / "ckpt")


def test_unknown_env_id_is_one_line(tmp_path):
    line = error_line(replaygpu("serve", "--env", "NoSuchEnv-v0", "--address", "127.0.0.1:0"))
    assert line.startswith("replaygpu serve: error: ") and "NoSuchEnv" in line


def test_bad_capacity_is_one_line():
    proc = replaygpu("serve", "--env", "CartPole-v1", "--capacity", "0", "--address", "127.0.0.1:0")
    assert "capacity" in error_line(proc)


def test_bad_spec_file_is_one_line(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text("{not json")
    line = error_line(replaygpu("serve", "--spec", str(spec), "--address", "127.0.0.1:0"))
    assert "JSONDecodeError" in line
    missing = error_line(replaygpu("serve", "--spec", str(tmp_path / "none.json")))
    assert "none.json" in missing


def test_missing_certificate_is_one_line(tmp_path):
    proc = replaygpu(
        "serve",
        "--env",
        "CartPole-v1",
        "--tls-cert",
        str(tmp_path / "server.pem"),
        "--tls-key",
        str(tmp_path / "server.key"),
    )
    assert "server.pem" in error_line(proc)


def test_a_checkpoint_folder_that_cannot_be_made_names_path_uid_and_the_fix(not_a_folder):
    proc = replaygpu("serve", "--env", "CartPole-v1", "--checkpoint-dir", not_a_folder)
    line = error_line(proc)
    assert f"{not_a_folder!r} cannot be made by uid {os.getuid()}" in line
    assert "Not a directory" in line and "make it first" in line  # not "chown" a missing folder
    assert "pass a --checkpoint-dir in a folder" in line  # the library's `directory`, as a flag


def test_library_errors_name_parameters_which_the_command_line_says_as_flags(not_a_folder):
    """The library names no flag: its errors name the parameter in backticks, and the command
    line says each as its flag (one rule: dashes, or `PARAMETER_FLAGS`)."""
    from replaygpu.service.ops.commands import with_flags
    from replaygpu.service.server.binding import require_free_ports

    with pytest.raises(Exception, match="the port of `address`") as raised:
        require_free_ports("127.0.0.1:50999", 50999)
    message = str(raised.value)
    assert "--" not in message and message.startswith("`metrics_port`: got 50999")
    assert with_flags(message).startswith("--metrics-port: got 50999, the port of --address")
    assert with_flags("`TLSConfig.key_file`: x; pass another `directory`") == (
        "--tls-key: x; pass another --checkpoint-dir"
    )


def test_unreachable_address_is_one_line():
    line = error_line(replaygpu("info", "127.0.0.1:1"))
    assert "127.0.0.1:1" in line


def test_health_of_an_address_without_a_port_exits_1_in_one_line():
    proc = replaygpu_without_tensorflow("health", "127.0.0.1")
    assert proc.returncode == 1  # never 2: Docker's healthcheck reserves it
    assert proc.stderr.count("\n") == 1 and "'127.0.0.1': no port" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "address", ["127.0.0.1:50051", "[::1]:50051", "learner:1", "dns:///learner:50051", "unix:/s"]
)
def test_a_client_takes_host_port_and_grpc_target_uris(address):
    from replaygpu.service.ops.auth import make_channel

    make_channel(address, None, 2**20).close()  # no ConfigError: the check lets them through


def test_learner_refuses_an_env_of_the_wrong_kind_before_serving(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = replaygpu("learner", "--agent", "sac", "--env", "CartPole-v1", "--checkpoint-dir", ckpt)
    assert "expected a bounded Box" in error_line(proc)
    assert not ckpt.exists()  # refused before the folder is made (no run.json, no checkpoint)


def test_demo_checks_env_before_making_its_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    proc = replaygpu("demo", "cartpole", "--env-id", "NoSuchEnv-v0", "--run-dir", str(run_dir))
    assert "NoSuchEnv" in error_line(proc)
    assert not run_dir.exists()


def test_debug_shows_the_traceback():
    proc = replaygpu("--debug", "serve", "--env", "NoSuchEnv-v0", "--address", "127.0.0.1:0")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr


def test_python_m_replaygpu_prints_the_version():
    proc = replaygpu("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"replaygpu {__version__}"


# (command line, what its one error line says); every subcommand, flag errors from argparse and
# value errors from the config dataclasses alike
BAD_FLAGS = [
    (
        ["learner", "--agent", "dqn", "--env", "CartPole-v1", "--batch-size", "-3"],
        "--batch-size: got -3",
    ),
    (["learner", "--agent", "sac", "--env", "Pendulum-v1", "--tau", "2"], "--tau: got 2.0"),
    (["learner", "--env", "ALE/Pong-v5", "--buffer-size", "3"], "--buffer-size: got 3"),
    (["learner", "--agent", "ppo"], "argument --agent: invalid choice: 'ppo'"),
    (["learner", "--max-actors", "0"], "argument --max-actors: got '0'"),
    (["learner", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["learner", "--journal-dir", "jnl"], "--journal-dir='jnl' needs --checkpoint-dir"),
    (["demo", "cartpole", "--batch-size", "abc"], "argument --batch-size: invalid int value"),
    (["demo", "pendulum", "--gamma", "2"], "--gamma: got 2.0"),
    (["demo", "breakout", "--n-step", "0"], "--n-step: got 0"),
    (["demo", "apex-cartpole", "--num-actors", "0"], "--num-actors: got 0"),
    (["demo", "apex-breakout", "--batch-size", "0"], "--batch-size: got 0"),
    (["demo", "no-such-demo"], "invalid choice: 'no-such-demo'"),
    (["eval", "/nonexistent"], "'/nonexistent': no run.json"),
    (["eval", "/nonexistent", "--episodes", "0"], "--episodes: got 0"),
    (["serve", "--env", "CartPole-v1", "--capacity", "0"], "argument --capacity: got '0'"),
    (["serve", "--capacity", "10"], "one of the arguments --env --spec is required"),
    (["serve", "--env", "CartPole-v1", "--journal-dir", "j"], "--journal-dir='j' needs --checkp"),
    (["learner", "--agent", "dqn", "--env", "NoSuch-v9"], "--env-id: got 'NoSuch-v9', which gy"),
    (["demo", "cartpole", "--env-id", "NoSuch-v0"], "--env-id: got 'NoSuch-v0', which gymnas"),
    (["serve", "--env", "NoSuch-v0"], "NoSuch"),
    (["learner", "--agent", "sac", "--env", "CartPole-v1"], "expected a bounded Box"),
    (["learner", "--env", "ALE/Breakou-v5"], "did you mean 'ALE/Breakout-v5'?"),
    (["demo", "cartpole", "--env-id", "CartPol-v1"], "did you mean 'CartPole-v1'?"),
    (["demo", "pendulum", "--env-id", "CartPole-v1"], "expected a bounded Box"),
    (["demo", "cartpole", "--env-id", "Pendulum-v1"], "expected Discrete"),
    (["learner", "--agent", "dqn", "--env", "Pendulum-v1"], "expected Discrete"),
    (["info"], "the following arguments are required: address"),
    (["health", "127.0.0.1:1", "--timeout", "soon"], "argument --timeout: invalid float value"),
    (["actor"], "the following arguments are required: address"),
    (["actor", "127.0.0.1:1", "--num-envs", "many"], "argument --num-envs: invalid int value"),
    (["no-such-command"], "invalid choice: 'no-such-command'"),
    # without a port gRPC would dial 443 and the user would read "connection refused"
    (["actor", "127.0.0.1"], "server address '127.0.0.1': no port; expected host:port"),
    (["info", "[::1]"], "server address '[::1]': no port"),
    (["info", "learner:http"], "port 'http' is not a number from 1 to 65535"),
    (["learner", "--address", "127.0.0.1:notaport"], "address '127.0.0.1:notaport': expected"),
    (["serve", "--env", "CartPole-v1", "--address", "0.0.0.0"], "address '0.0.0.0': expected"),
]


@pytest.mark.parametrize(
    "args, says",
    BAD_FLAGS,
    ids=["-".join(args[:2]) + f"-{i}" for i, (args, _) in enumerate(BAD_FLAGS)],
)
def test_a_bad_flag_or_value_is_one_line_before_tensorflow_is_imported(args, says):
    proc = replaygpu_without_tensorflow(*args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr[-2000:]
    prog = "replaygpu" if args[0] == "no-such-command" else f"replaygpu {args[0]}"
    assert proc.stderr.startswith(prog) and ": error: " in proc.stderr, proc.stderr
    assert "usage:" not in proc.stderr and proc.stdout == ""


# (actor flags, what the error says): every value the actor can check without the learner
ACTOR_BAD_VALUES = [
    (["--num-envs", "0"], "--num-envs: got 0, expected >= 1"),
    (["--num-actors", "0"], "--num-actors: got 0, expected >= 1"),
    (["--actor-index", "-1"], "--actor-index: got -1, expected in [0, num_actors)"),
    (["--num-actors", "2", "--actor-index", "2"], "--actor-index: got 2, expected in [0, num"),
    (["--steps", "-5"], "--steps: got -5, expected >= 0"),
    (["--send-interval", "0"], "--send-interval: got 0, expected >= 1"),
    (["--segment-steps", "0"], "--segment-steps: got 0, expected >= 1"),
    (["--progress-interval-s", "-1"], "--progress-interval-s: got -1.0, expected >= 0"),
    (["--retry-deadline-s", "0"], "--retry-deadline-s: got 0.0, expected > 0"),
    (["--epsilon-base", "2"], "--epsilon-base: got 2.0, expected in [0, 1]"),
    (["--processes", "0"], "argument --processes: got '0', expected an integer >= 1"),
    (["--ray", "--ray-num-cpus", "0"], "(--ray-num-cpus): got 0.0, expected > 0"),
    (["--ray", "--max-restarts", "-2"], "(--max-restarts): got -2, expected >= 0 (-1: no limit)"),
]


@pytest.mark.parametrize(
    "flags, says", ACTOR_BAD_VALUES, ids=[" ".join(f) for f, _ in ACTOR_BAD_VALUES]
)
def test_actor_refuses_a_bad_value_before_connecting_to_the_learner(flags, says):
    """The value's error, not the address's: the actor never connects to a server that would
    accept the connection, and the line comes in < 1.5 s without TensorFlow."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        began = time.monotonic()
        proc = replaygpu_without_tensorflow("actor", address, *flags)
        elapsed = time.monotonic() - began
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # no connection waits to be accepted
            server.accept()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith("replaygpu actor: error: ") and proc.stdout == ""
    assert elapsed < 1.5, f"{elapsed:.2f} s"


def test_help_still_prints_the_full_usage():
    proc = replaygpu_without_tensorflow("learner", "--agent", "dqn", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: replaygpu learner") and "--batch-size" in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["learner", "--agent", "dqn", "--env", "CartPole-v1"],
        ["demo", "cartpole"],
    ],
    ids=["learner", "demo"],
)
def test_without_tensorflow_learner_and_demo_name_the_extra_to_install(args, tmp_path):
    proc = replaygpu_without_tensorflow(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"replaygpu {args[0]}: error: tensorflow is not installed")
    assert 'pip install "replaygpu[cpu]"' in proc.stderr and '"replaygpu[gpu]"' in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no run folder made


@pytest.mark.parametrize("command", [["serve", "--env", "CartPole-v1"], ["learner"]])
@pytest.mark.parametrize("flag", ["--address", "--metrics-port"])
def test_a_port_in_use_is_refused_before_tensorflow_is_imported(command, flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = (
            ["--address", f"127.0.0.1:{port}"]
            if flag == "--address"
            else ["--address", "127.0.0.1:0", "--metrics-port", str(port)]
        )
        proc = replaygpu_without_tensorflow(*command, *ports)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert f"address already in use: another process listens on port {port}" in proc.stderr
    assert f"pick another {flag}" in proc.stderr


def test_a_metrics_port_equal_to_the_grpc_port_is_refused_before_tensorflow():
    proc = replaygpu_without_tensorflow(
        "learner", "--address", "127.0.0.1:50999", "--metrics-port", "50999"
    )
    assert proc.returncode == 2 and "the port of --address" in proc.stderr, proc.stderr[-2000:]


def test_a_port_a_stopped_server_left_in_time_wait_is_not_refused():
    # a listener with SO_REUSEADDR, as gRPC's, whose side closes a connection first: the port
    # stays in TIME_WAIT after it stopped
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()
        client.close()
    with socket.socket() as plain, pytest.raises(OSError) as in_time_wait:
        plain.bind(("127.0.0.1", port))  # without SO_REUSEADDR
    assert in_time_wait.value.errno == errno.EADDRINUSE
    from replaygpu.service.server.binding import require_free_address

    require_free_address(f"127.0.0.1:{port}")  # a server may bind it: not refused
    require_free_address("127.0.0.1:0")


def test_serving_on_a_port_in_use_says_address_already_in_use_in_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = replaygpu("serve", "--env", "CartPole-v1", "--address", f"127.0.0.1:{port}")
    assert "address already in use" in error_line(proc)
