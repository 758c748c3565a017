"""Starting Ray for the actors: importing it (an optional extra), ``ray.init`` retried when a
loaded machine outlasts one of its node start-up timeouts, and the CPUs a local instance has.
"""

from __future__ import annotations

import logging
from typing import Any

import replaygpu as rg

logger = logging.getLogger(__name__)


def import_ray() -> Any:
    """The ray module; ConfigError, saying how to install it, where it is missing."""
    try:
        import ray
    except ImportError as err:
        raise rg.ConfigError(
            f"Ray actors need the ray package, which this Python cannot import ({err}); "
            'install it with: pip install "replaygpu[ray]"'
        ) from None
    return ray


def check_cpus(ray: Any, needed: float, local: bool) -> None:
    """A local instance cannot grow: refuse actors it cannot place (they would wait forever).
    A cluster may autoscale: only log when it has fewer CPUs now."""
    have = float(ray.cluster_resources().get("CPU", 0.0))
    if needed <= have + 1e-9:
        return
    message = (
        f"the actors reserve {needed:g} CPUs (actors x num_cpus_per_actor), the Ray cluster "
        f"has {have:g}"
    )
    if local:
        raise rg.ConfigError(
            f"{message}; ask less per actor (--ray-num-cpus 0.5), start fewer actors, or join "
            "a larger cluster (--ray-address)"
        )
    logger.warning("%s; the rest start when the cluster has room", message)


#: what Ray's errors say when a local node's start-up timed out (Ray 2.x ``ray/_private/node.py``,
#: ``Node.__init__`` and the GCS start of ``start_head_processes``), each a wait a loaded machine
#: can outlast:
NODE_START_TIMEOUTS = (
    # Exception: the raylet did not register with the GCS within Ray's fixed 30 s
    "timed out during startup",
    # RuntimeError: the GCS did not write its port file (``SESSION/gcs_server_port_NODE``) in
    # ``RAY_gcs_server_port_wait_time_s`` (30 s), from ``ray._raylet.wait_for_persisted_port``
    "Timed out waiting for file",
    # RuntimeError: the GCS did not answer within ``RAY_NUM_REDIS_GET_RETRIES`` tries a second
    # apart (20; also said when the GCS exited: the last try's ConfigError quotes Ray)
    "Failed to start GCS",
)
#: tries of ``ray.init`` when the local node's start-up times out
START_ATTEMPTS = 3


def init_ray(ray: Any, address: str | None, **kwargs: Any) -> int:
    """``ray.init``, retried (after ``ray.shutdown()``) when Ray's node start-up times out (any
    of `NODE_START_TIMEOUTS`), `START_ATTEMPTS` tries in all. Returns the try that started Ray
    (1: the first).

    Raises:
        ConfigError: every try timed out; the message says how to start Ray beforehand.
        ConnectionError: and any other error of ``ray.init``, as raised.
    """
    attempts = START_ATTEMPTS
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=address, **kwargs)
            return attempt
        except ConnectionError:
            raise
        except Exception as err:
            said = " ".join(str(err).split())
            if not any(fragment in said for fragment in NODE_START_TIMEOUTS):
                raise
            ray.shutdown()  # the processes of the half-started node
            if attempt == attempts:
                raise rg.ConfigError(
                    f"Ray's node did not start: {attempts} tries each timed out (a loaded "
                    f"machine; the last: {said[:160]}); start Ray beforehand with `ray start "
                    "--head` and join it (--ray-address auto; ray_address='auto'), or retry "
                    "when the machine is less busy"
                ) from err
            logger.warning(
                "Ray's node start-up timed out (try %d of %d; a loaded machine): %s; starting "
                "it again",
                attempt,
                attempts,
                said[:160],
            )
    raise AssertionError("unreachable")  # the loop returns or raises
