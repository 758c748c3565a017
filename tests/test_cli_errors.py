"""Expected failures of every command end in one line on stderr and exit status 2; --debug
shows the traceback; --version and ``python -m replaygpu`` work."""

from __future__ import annotations

import os
import subprocess
import sys

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


def test_unwritable_checkpoint_folder_names_path_and_uid(not_a_folder):
    proc = replaygpu("serve", "--env", "CartPole-v1", "--checkpoint-dir", not_a_folder)
    line = error_line(proc)
    assert not_a_folder in line and f"uid {os.getuid()}" in line


def test_unreachable_address_is_one_line():
    line = error_line(replaygpu("info", "127.0.0.1:1"))
    assert "127.0.0.1:1" in line


def test_learner_refuses_an_env_of_the_wrong_kind_before_serving(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = replaygpu("learner", "--agent", "sac", "--env", "CartPole-v1", "--checkpoint-dir", ckpt)
    assert "expected a bounded Box" in error_line(proc)
    assert list(ckpt.iterdir()) == []  # a failed start leaves no run.json and no checkpoint


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
