"""Actors as Ray actors: `run_actor` loops that Ray places and restarts when their process dies.

Each reserves ``num_cpus_per_actor`` and is restarted up to ``max_restarts`` times; nothing here
schedules. Each runs `run_actor` on a thread: env, policy and batching are ``replaygpu actor``'s.

Exactly-once across a restart rests on three things:

- an actor's id is ``PREFIX-INDEX`` with a prefix the driver picks once (its ``HOSTNAME-PID``
  and ``ray``), never the worker's pid, so a restarted actor's `ReplayClient` continues after
  the server's last committed seq for that id;
- the server's ``Info`` counts accepted but uncommitted batches in an actor's last seq, so a
  restarted actor never reuses the seqs its dead predecessor left staged (they still commit);
- the ledger keeps one entry per actor, not one per incarnation.

A restarted actor draws a new env seed (logged), so it does not replay its predecessor's
episodes. Ray is an optional extra (``pip install "replaygpu[ray]"``), imported when a fleet
starts; on a cluster, install replaygpu on every node or ship it in a ``runtime_env``.

Example::

    with start_ray_actors("learner:50051", ActorConfig(env_id="CartPole-v1"), 4) as fleet:
        fleet.wait(timeout=600)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import replaygpu as rg
from replaygpu.errors import ReplayError

from .actor import STOP_FLUSH_S, _retrying, connect, default_prefix, run_actor
from .actor_config import ActorConfig
from .fleet import ACTOR_THREAD_ENV
from .ray_start import check_cpus, import_ray, init_ray

logger = logging.getLogger(__name__)

#: Calls a Ray actor serves at once (the loop runs on its own thread besides them).
_MAX_CONCURRENCY = 4


@dataclass(frozen=True)
class RayActorStatus:
    """One Ray actor's current incarnation (only ``actor_id`` is shared by all incarnations).

    Attributes:
        resumed_after_seq: the server's last seq for ``actor_id`` at this start (0: new actor).
        env_steps: as of its last report (an episode's end, a send) or its end.
        result: `run_actor`'s result once the loop ended, else None.
        error: ``Type: message`` of the error that ended the loop, else None.
    """

    index: int
    actor_id: str
    pid: int
    restarted: bool
    resumed_after_seq: int
    seed: int
    env_steps: int
    running: bool
    result: dict[str, float] | None
    error: str | None


class RayActor:
    """`run_actor` in a Ray actor, started in ``__init__`` so a restart resumes by itself."""

    def __init__(self, config: ActorConfig, address: str) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        self.restarted = _was_restarted()
        if self.restarted:  # a new seed: do not replay the dead incarnation's episodes
            config = dataclasses.replace(config, seed=secrets.randbelow(2**31))
        self.config, self.address = config, address
        self.actor_id = f"{config.actor_id_prefix}-{config.actor_index}"
        self.resumed_after_seq = 0
        self.env_steps = 0
        self.result: dict[str, float] | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replaygpu-ray-actor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        config = self.config
        try:
            self.resumed_after_seq = _last_seq(config, self.address, self._stop)
            if self.restarted:
                logger.info(
                    "actor %d (%s) restarted by Ray: continues after seq %d, env seed %d",
                    config.actor_index,
                    self.actor_id,
                    self.resumed_after_seq,
                    config.seed,
                )
            self.result = run_actor(config, self.address, stop=self._stop, report=self._report)
            self.env_steps = int(self.result["env_steps"])
        except Exception as err:  # reported through status(); the driver raises it
            self.error = f"{type(err).__name__}: {' '.join(str(err).split())}"
            logger.error("actor %d (%s): %s", config.actor_index, self.actor_id, self.error)

    def _report(self, kind: str, index: int, payload: object) -> None:
        if kind != "done":  # (env_steps, ...)
            self.env_steps = int(payload[0])

    def status(self) -> RayActorStatus:
        """This incarnation's status."""
        return RayActorStatus(
            index=self.config.actor_index,
            actor_id=self.actor_id,
            pid=os.getpid(),
            restarted=self.restarted,
            resumed_after_seq=self.resumed_after_seq,
            seed=self.config.seed,
            env_steps=self.env_steps,
            running=self._thread.is_alive(),
            result=self.result,
            error=self.error,
        )

    def wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds for the loop to end; whether it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float) -> RayActorStatus:
        """Stop the loop (it flushes what it collected within `STOP_FLUSH_S`); the status."""
        self._stop.set()
        self._thread.join(timeout)
        return self.status()


class RayActorFleet(contextlib.AbstractContextManager["RayActorFleet"]):
    """Ray actors running `run_actor` against one server (`start_ray_actors`); a context manager.

    Attributes:
        actor_ids: the server-side id of each actor, by position.
        owns_ray: whether the fleet called ``ray.init`` (then `stop` calls ``ray.shutdown``,
            which stops a local instance and leaves a joined cluster running).
    """

    def __init__(self, ray: Any, handles: list[Any], actor_ids: list[str], owns_ray: bool):
        self._ray = ray
        self._handles = handles
        self.actor_ids = actor_ids
        self.owns_ray = owns_ray
        self._results: list[dict[str, float]] | None = None

    def statuses(self, timeout: float = 60.0) -> list[RayActorStatus]:
        """Each actor's `RayActorStatus` (a restarting actor answers once it is back).

        Raises:
            ReplayError: an actor is dead for good (restarted ``max_restarts`` times already).
            TimeoutError: not every actor answered within ``timeout`` seconds.
        """
        return self._get([h.status.remote() for h in self._handles], timeout, "status")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit) for every actor's loop to end (each
        ends after ``ActorConfig.steps`` env steps, or on an error); whether all ended."""
        started = time.monotonic()
        for handle in self._handles:
            left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
            try:
                ended = self._get([handle.wait.remote(left)], None if left is None else left + 5)
            except TimeoutError:
                return False
            if not ended[0]:
                return False
        return True

    def kill(self, index: int, restart: bool = True) -> None:
        """Kill actor ``index``'s process at once, as a crash would (for tests and drills);
        Ray restarts it while it has restarts left, unless ``restart=False``."""
        self._ray.kill(self._handles[index], no_restart=not restart)

    def stop(self, timeout: float = STOP_FLUSH_S + 10.0) -> list[dict[str, float]]:
        """Stop (each flushes) and kill every actor, and Ray if the fleet started it; idempotent.

        Returns:
            each actor's `run_actor` result (of its last incarnation), by position.

        Raises:
            ReplayError: naming the actors whose loop failed or that did not stop in time.
        """
        if self._results is not None:
            return self._results
        problems: list[str] = []
        results: list[dict[str, float]] = []
        try:
            pending = [h.stop.remote(timeout) for h in self._handles]
            for i, ref in enumerate(pending):
                try:
                    status = self._get([ref], timeout + 30, "stop")[0]
                except (ReplayError, TimeoutError) as err:
                    problems.append(f"actor {i} ({self.actor_ids[i]}): {err}")
                    results.append({})
                    continue
                if status.error is not None:
                    problems.append(f"actor {i} ({self.actor_ids[i]}): {status.error}")
                elif status.running:
                    problems.append(f"actor {i} ({self.actor_ids[i]}) did not stop in {timeout} s")
                results.append(status.result or {})
        finally:
            for handle in self._handles:
                self._ray.kill(handle, no_restart=True)
            if self.owns_ray:
                self._ray.shutdown()
            self._results = results
        if problems:
            raise ReplayError(f"Ray actors failed: {'; '.join(problems)}")
        return results

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _get(self, refs: list[Any], timeout: float | None, what: str = "wait") -> list[Any]:
        """``ray.get`` with Ray's errors turned into ours."""
        ray = self._ray
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"Ray actors did not answer {what} within {timeout:.0f} s (a node lost, or the "
                "cluster out of CPUs for a restarted actor?)"
            ) from None
        except ray.exceptions.RayActorError as err:
            raise ReplayError(
                f"a Ray actor is dead for good ({type(err).__name__}: "
                f"{str(err).splitlines()[0]}); it was restarted max_restarts times already or "
                "killed without restart: see the Ray logs for why it died"
            ) from None


def check_ray_options(num_cpus_per_actor: float, max_restarts: int) -> None:
    """`start_ray_actors`' option checks (``actor --ray`` runs them before asking the learner)."""
    if not num_cpus_per_actor > 0:
        raise rg.ConfigError(
            f"num_cpus_per_actor (--ray-num-cpus): got {num_cpus_per_actor}, expected > 0"
        )
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
        raise rg.ConfigError(
            f"max_restarts (--max-restarts): got {max_restarts!r}, expected >= 0 (-1: no limit)"
        )


def start_ray_actors(
    address: str,
    config: ActorConfig,
    num_actors: int | None = None,
    *,
    num_cpus_per_actor: float = 1.0,
    max_restarts: int = 3,
    ray_address: str | None = None,
) -> RayActorFleet:
    """Start actors ``config.actor_index .. num_actors - 1`` as Ray actors, into ``address``.

    Ray: the one this process is connected to, else ``ray_address`` (``"auto"``: this machine's
    ``ray start``; or the head's ``HOST:6379``), else a local instance (or ``$RAY_ADDRESS``).
    Actor ids are ``PREFIX-INDEX``, PREFIX ``config.actor_id_prefix`` or the driver's
    ``HOSTNAME-PID-ray``: the same in every incarnation.

    Args:
        address: the replay server's ``host:port``, as the Ray workers reach it.
        config: every actor's config; its ``actor_index`` is the first index to start.
        num_actors: actors in the whole run (default: ``config.num_actors``).
        num_cpus_per_actor: CPUs Ray reserves for each actor (fractions share a CPU).
        max_restarts: times Ray restarts an actor whose process died.
        ray_address: the Ray cluster to join when not connected yet; None: a local instance.

    Raises:
        ConfigError: ray is not installed, an argument is out of range, the Ray cluster
            cannot be joined, or a local Ray instance has fewer CPUs than the actors reserve.
    """
    check_ray_options(num_cpus_per_actor, max_restarts)
    ray = import_ray()
    if num_actors is not None:
        config = dataclasses.replace(config, num_actors=num_actors)
    prefix = config.actor_id_prefix or f"{default_prefix()}-ray"
    configs = [
        dataclasses.replace(config, actor_index=i, actor_id_prefix=prefix)
        for i in range(config.actor_index, config.num_actors)
    ]
    owns_ray = not ray.is_initialized()
    if owns_ray:
        began = time.monotonic()
        try:
            init_ray(ray, ray_address, include_dashboard=False, logging_level=logging.WARNING)
        except ConnectionError as err:
            raise rg.ConfigError(
                f"could not join the Ray cluster at {ray_address or os.environ.get('RAY_ADDRESS')}"
                f" ({err}); start one (`ray start --head`), give its HOST:6379, or leave out "
                "the address to start a local Ray instance"
            ) from None
        logger.info(
            "Ray %s in %.1f s: %s CPUs",
            "started" if ray_address is None else f"joined at {ray_address}",
            time.monotonic() - began,
            ray.cluster_resources().get("CPU", 0),
        )
    try:
        local = owns_ray and not (ray_address or os.environ.get("RAY_ADDRESS"))
        check_cpus(ray, len(configs) * num_cpus_per_actor, local=local)
        remote = ray.remote(
            num_cpus=num_cpus_per_actor,
            max_restarts=max_restarts,
            max_task_retries=-1,  # calls in flight when an actor dies go to its next incarnation
            max_concurrency=_MAX_CONCURRENCY,
            # thread caps (`actor_threads`); Ray's default sets only OMP_NUM_THREADS
            runtime_env={"env_vars": ACTOR_THREAD_ENV},
        )(RayActor)
        handles = [remote.remote(c, address) for c in configs]
    except BaseException:
        if owns_ray:
            ray.shutdown()
        raise
    ids = [f"{c.actor_id_prefix}-{c.actor_index}" for c in configs]
    logger.info("started %d Ray actors (%s) against %s", len(handles), ", ".join(ids), address)
    return RayActorFleet(ray, handles, ids, owns_ray)


def _was_restarted() -> bool:
    """Whether Ray restarted the current actor (Ray's call warns about its own internals)."""
    import ray

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def _last_seq(config: ActorConfig, address: str, stop: threading.Event) -> int:
    """The server's last seq of the actor's id, committed or staged (where its client resumes)."""
    client = connect(config, address)
    try:
        reply = _retrying(client.info, config, stop.is_set)
        return 0 if reply is None else int(reply.actor_last_seq)  # None: stopped
    finally:
        client.close(flush=False)
