"""`ray_actors.init_ray`: Ray's fixed 30 s node start-up timeout is retried, then explained.

Ray's timeout cannot be made to happen on demand, so the retry tests stand a small object in
for the ``ray`` module that fails its first starts with the exception Ray raises (the text of
Ray 2.x ``_private/node.py``); the last test starts and stops a real local Ray."""

from __future__ import annotations

import logging

import pytest

import replaygpu as rg
from replaygpu.agents.distributed.ray_actors import init_ray

#: what Ray 2.x raises when its node does not register within 30 s
RAY_TIMEOUT = (
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


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


def test_a_start_that_times_out_is_shut_down_and_started_again(caplog):
    ray = SlowRay(failures=2)
    with caplog.at_level(logging.WARNING):
        assert init_ray(ray, None, include_dashboard=False) == 3
    start = "init None ['include_dashboard']"
    assert ray.calls == [start, "shutdown", start, "shutdown", start]
    assert "try 1 of 3" in caplog.text and "try 2 of 3" in caplog.text


def test_every_try_timing_out_is_a_config_error_saying_how_to_start_ray_beforehand():
    ray = SlowRay(failures=3)
    with pytest.raises(rg.ConfigError, match=r"3 tries each timed out.*`ray start --head`"):
        init_ray(ray, None)
    assert ray.calls.count("shutdown") == 3  # no half-started node is left behind


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
