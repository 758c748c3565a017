"""Starting or joining Ray for the actors (`ray_actors.start_ray_actors`), through a slow start.

Ray waits a fixed 30 s for a local node's raylet to register and then raises a bare
``Exception("The current node timed out during startup...")``; neither ``ray.init`` nor an
environment variable raises that limit (Ray 2.x ``_private/node.py``). On a loaded machine
(load 5 on 2 cores) the README's Ray example met it once; a second start, with Ray's files
cached, came up. `init_ray` shuts the half-started instance down and starts again, up to
``attempts`` times, then says what to do. Imports no Ray itself: the caller passes the module.
"""

from __future__ import annotations

import logging
from typing import Any

import replaygpu as rg

logger = logging.getLogger(__name__)

#: what Ray's error says when its local node did not register in its fixed 30 s
NODE_START_TIMEOUT = "timed out during startup"
#: tries of ``ray.init`` when the local node's start-up times out
START_ATTEMPTS = 3


def init_ray(ray: Any, address: str | None, attempts: int = START_ATTEMPTS, **kwargs: Any) -> int:
    """``ray.init(address=address, **kwargs)``, started again (after ``ray.shutdown()``) when
    Ray's node start-up times out, ``attempts`` tries in all.

    Args:
        ray: the ``ray`` module.
        address: the cluster to join; None: a local instance (or ``$RAY_ADDRESS``).
        attempts: tries in all, >= 1.
        **kwargs: more arguments of ``ray.init``.

    Returns:
        the try that started Ray (1: the first).

    Raises:
        ConfigError: every try timed out; the message says how to start Ray beforehand.
        ValueError: ``attempts`` < 1.
        ConnectionError: and any other error of ``ray.init``, as it raised it.
    """
    if attempts < 1:
        raise ValueError(f"init_ray: attempts: got {attempts}, expected >= 1")
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=address, **kwargs)
            return attempt
        except ConnectionError:
            raise
        except Exception as err:
            if NODE_START_TIMEOUT not in str(err):
                raise
            ray.shutdown()  # the processes of the half-started node
            if attempt == attempts:
                raise rg.ConfigError(
                    f"Ray's node did not start: {attempts} tries each timed out after Ray's "
                    "fixed 30 s (a loaded machine); start Ray beforehand with `ray start "
                    "--head` and join it (--ray-address auto; ray_address='auto'), or retry "
                    "when the machine is less busy"
                ) from err
            logger.warning(
                "Ray's node start-up timed out after Ray's fixed 30 s (try %d of %d; a loaded "
                "machine): starting it again",
                attempt,
                attempts,
            )
    raise AssertionError("unreachable")  # the loop returns or raises
