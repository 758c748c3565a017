"""`ray_start.init_ray`: each of Ray's node start-up timeouts is retried, then explained.

Ray's timeouts cannot be made to happen on demand, so the retry tests stand a small object in
for the ``ray`` module that fails its first starts with the exceptions Ray raises (their types
and texts from Ray 2.x ``_private/node.py`` and ``_raylet``'s ``wait_for_persisted_port``); the
last test starts and stops a real local Ray."""

from __future__ import annotations

import logging

import pytest

import replaygpu as rg
from replaygpu.agents.distributed.ray_start import init_ray

#: what Ray 2.x raises when its node does not register within 30 s
RAY_TIMEOUT = (
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)
SESSION = "/tmp/ray/session_2025-01-01_00-00-00_000000_1"
#: each start-up timeout of Ray 2.x, as raised: the node's registration, the GCS's port file
#: (a loaded machine's usual one), the GCS's first answer
TIMEOUTS = {
    "node": Exception(RAY_TIMEOUT),
    "gcs-port-file": RuntimeError(
        f"Timed out waiting for file {SESSION}/gcs_server_port_{'5e' * 28}"
    ),
    "gcs-answer": RuntimeError(
        "Failed to start GCS.  Last 0 lines of error files:\n\n.Please check "
        f"{SESSION}/logs/gcs_server.out for details. Last connection error: Traceback "
        "(most recent call last):\n  ...\nray.exceptions.RpcError: failed to connect to all "
        "addresses\n"
    ),
}


class SlowRay:
    """Stands in for the ``ray`` module: its first ``failures`` starts time out as Ray's do."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures, self.error = failures, error or Exception(RAY_TIMEOUT)
        self.calls: list[str] = []

    def init(self, address=None, **kwargs) -> None:
        self.calls.append(f"init {address} {sorted(kwargs)}")
        if self.failures:
            self.failures -= 1
            raise self.error

    def shutdown(self) -> None:
        self.calls.append("shutdown")


@pytest.mark.parametrize("error", TIMEOUTS.values(), ids=TIMEOUTS.keys())
def test_a_start_that_times_out_is_shut_down_and_started_again(caplog, error):
    ray = SlowRay(failures=2, error=error)
    with caplog.at_level(logging.WARNING):
        assert init_ray(ray, None, include_dashboard=False) == 3
    start = "init None ['include_dashboard']"
    assert ray.calls == [start, "shutdown", start, "shutdown", start]
    assert "try 1 of 3" in caplog.text and "try 2 of 3" in caplog.text


@pytest.mark.parametrize("error", TIMEOUTS.values(), ids=TIMEOUTS.keys())
def test_every_try_timing_out_is_a_config_error_saying_how_to_start_ray_beforehand(error):
    ray = SlowRay(failures=3, error=error)
    with pytest.raises(rg.ConfigError, match=r"3 tries each timed out.*`ray start --head`") as e:
        init_ray(ray, None)
    assert ray.calls.count("shutdown") == 3  # no half-started node is left behind
    message = str(e.value)
    assert "\n" not in message and " ".join(str(error).split())[:40] in message  # Ray's, quoted


def test_the_gcs_port_file_timeout_of_the_installed_ray_is_retried(tmp_path):
    """The error itself, from the installed Ray's wait for the GCS's port file (given no time),
    is one `init_ray` retries: the text above is still Ray's."""
    raylet = pytest.importorskip("ray._raylet")
    node = raylet.NodeID.from_random().hex()
    with pytest.raises(RuntimeError, match="gcs_server_port") as timed_out:
        raylet.wait_for_persisted_port(str(tmp_path), node, raylet.GCS_SERVER_PORT_NAME, 0)
    ray = SlowRay(failures=1, error=timed_out.value)
    assert init_ray(ray, None) == 2 and ray.calls.count("shutdown") == 1


@pytest.mark.parametrize("error", [ConnectionError("no cluster"), RuntimeError("other")])
def test_other_errors_are_raised_at_once_without_a_retry(error):
    ray = SlowRay(failures=1, error=error)
    with pytest.raises(type(error)):
        init_ray(ray, "10.0.0.1:6379")
    assert ray.calls == ["init 10.0.0.1:6379 []"]


@pytest.mark.timeout(300)
def test_a_real_local_ray_starts_on_the_first_try():
    ray = pytest.importorskip("ray")
    try:
        assert init_ray(ray, None, include_dashboard=False, num_cpus=1) == 1
        assert ray.is_initialized()
    finally:
        ray.shutdown()
