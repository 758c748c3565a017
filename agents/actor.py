"""An actor: a gymnasium vector env, a numpy behaviour policy, a `ReplayClient`.

The policy is a dqn learner's epsilon-greedy Q-network (Ape-X) or a sac learner's sampled
squashed Gaussian; `actor_config` builds an actor's config from the `rg.ActorSettings` that a
learner announces in ``Info``, so ``replaygpu actor ADDRESS`` needs no other flags.

This module imports no TensorFlow, so actor processes start fast and stay small. An actor
steps ``num_envs`` envs with one batched numpy policy call per vector step, sends its
transitions in columnar batches with `ReplayClient.add_batch`, and pulls new weights with
``get_weights(newer_than=version)`` every ``weight_pull_interval`` env steps. Actor ``i`` of
``N`` explores with ``eps_i = epsilon_base ** (1 + epsilon_alpha * i / (N - 1))`` (Ape-X).

When the table has a ``stream`` field (`STREAM_FIELD`), the actor fills it with a global env
id (``actor_index * num_envs + env``) and sends each batch env-major, so each env's steps lie
in consecutive rows: ``rg.NStepSampler(..., stream_field="stream")`` then computes n-step
returns across interleaved actors.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

import grpc
import gymnasium as gym
import numpy as np

import replaygpu as rg
from replaygpu.agents.checks import require_positive_ints, require_unit_interval
from replaygpu.agents.envs import EpisodeStats, TransitionChunk, make_vector_env
from replaygpu.agents.flags import helptext
from replaygpu.agents.policies import (
    batch_size_of,
    epsilon_greedy_actions,
    greedy_q_policy,
    squashed_gaussian_policy,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: gRPC codes of a learner that is restarting: calls in flight are cancelled, then UNAVAILABLE
_TRANSIENT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}
)

#: Seconds a stopped actor waits for its last acks before it drops them and exits.
STOP_FLUSH_S = 20.0

#: The optional int64 table field naming the env (stream) that produced each row.
STREAM_FIELD = "stream"

#: ``report(kind, actor_index, payload)``: "episode" with (env_steps, return, length), or
#: "done" with the actor's final stats dict.
Report = Callable[[str, int, object], None]


@dataclass(frozen=True)
class ActorConfig:
    """How one actor collects experience."""

    env_id: str = field(default="CartPole-v1", metadata=helptext("gymnasium env id"))
    agent: Literal["dqn", "sac"] = field(
        default="dqn",
        metadata=helptext(
            "policy: dqn (epsilon-greedy Q-network, Discrete actions) or sac (squashed "
            "Gaussian, Box actions)"
        ),
    )
    actor_index: int = field(default=0, metadata=helptext("this actor's index i in [0, N)"))
    num_actors: int = field(default=1, metadata=helptext("N, actors in the whole run"))
    actor_id_prefix: str = field(
        default="",
        metadata=helptext(
            "actor ids are PREFIX-INDEX, unique per actor (the learner's exactly-once ledger "
            "keys on them); empty: HOSTNAME-PID, so actors on other hosts, in other "
            "containers or in other processes never share an id"
        ),
    )
    num_envs: int = field(default=8, metadata=helptext("envs stepped together per actor"))
    seed: int = field(default=1, metadata=helptext("base seed (offset by the actor index)"))
    steps: int = field(default=0, metadata=helptext("env steps to collect; 0: until stopped"))
    weight_pull_interval: int = field(
        default=400, metadata=helptext("env steps between get_weights(newer_than=version) calls")
    )
    send_interval: int = field(
        default=32, metadata=helptext("vector steps buffered before one add_batch call")
    )
    epsilon_base: float = field(default=0.4, metadata=helptext("Ape-X epsilon base"))
    epsilon_alpha: float = field(default=7.0, metadata=helptext("Ape-X epsilon exponent spread"))
    insert_slack: int = field(
        default=2048,
        metadata=helptext(
            "follow the server's samples-per-insert limit on the insert side: wait while the "
            "table is more than this many rows ahead of what the learner has sampled; "
            "-1: never wait"
        ),
    )
    retry_deadline_s: float = field(
        default=60.0, metadata=helptext("give up when the server is unreachable this long")
    )
    table: str = field(default="replay", metadata=helptext("table name on the server"))
    token: str | None = field(
        default=None, metadata=helptext("bearer token, if the server needs one")
    )
    tls_ca: str | None = field(
        default=None, metadata=helptext("CA certificate that signed the server's (enables TLS)")
    )
    tls_cert: str | None = field(
        default=None, metadata=helptext("client certificate, for a server that requires one")
    )
    tls_key: str | None = field(default=None, metadata=helptext("private key of tls_cert"))
    server_name: str | None = field(
        default=None, metadata=helptext("name to check the server certificate against")
    )

    def __post_init__(self) -> None:
        require_positive_ints(
            self, "num_actors", "num_envs", "weight_pull_interval", "send_interval"
        )
        if not 0 <= self.actor_index < self.num_actors:
            raise rg.ConfigError(
                f"actor_index: got {self.actor_index}, expected in [0, num_actors="
                f"{self.num_actors})"
            )
        if not self.retry_deadline_s > 0:
            raise rg.ConfigError(f"retry_deadline_s: got {self.retry_deadline_s}, expected > 0")
        if self.insert_slack < -1:
            raise rg.ConfigError(f"insert_slack: got {self.insert_slack}, expected >= -1")
        if self.steps < 0:
            raise rg.ConfigError(f"steps: got {self.steps}, expected >= 0 (0: until stopped)")
        require_unit_interval(self, "epsilon_base")
        _ = self.tls  # checks the TLS files now: missing, unreadable, a key of another cert

    @property
    def tls(self) -> rg.TLSConfig | None:
        """The client's TLS settings; None (plaintext) unless a TLS field is set.

        Raises:
            ConfigError: a file is missing or unreadable, or certificate and key do not match.
        """
        if not any((self.tls_ca, self.tls_cert, self.tls_key, self.server_name)):
            return None
        return rg.TLSConfig(
            cert_file=self.tls_cert,
            key_file=self.tls_key,
            ca_file=self.tls_ca,
            server_name=self.server_name,
        )

    @property
    def epsilon(self) -> float:
        """This actor's fixed exploration rate."""
        if self.num_actors == 1:
            return self.epsilon_base
        spread = self.epsilon_alpha * self.actor_index / (self.num_actors - 1)
        return self.epsilon_base ** (1.0 + spread)


def run_actor(
    config: ActorConfig,
    address: str,
    stop: threading.Event | None = None,
    report: Report | None = None,
) -> dict[str, float]:
    """Collect experience into the replay server at ``address`` until done or stopped.

    Returns:
        ``{"env_steps", "episodes", "seconds", "env_steps_per_s", "weight_updates",
        "acked_transitions"}`` (transitions the server committed from this actor's batches).

    Raises:
        ReplayError: when the server is unreachable or rejects the data.
    """
    env = make_vector_env(config.env_id, config.num_envs, config.seed + 1000 * config.actor_index)
    rng = np.random.default_rng(config.seed + 1000 * config.actor_index)
    try:
        choose = _ActionChooser(config, env.single_action_space, rng)
    except rg.ConfigError:
        env.close()
        raise
    n = config.num_envs
    client = rg.ReplayClient(
        address,
        actor_id=f"{config.actor_id_prefix or _default_prefix()}-{config.actor_index}",
        table=config.table,
        token=config.token or None,
        tls=config.tls,
        config=rg.ClientConfig(retry_deadline_s=config.retry_deadline_s),
    )
    chunk = TransitionChunk(client.spec, config.send_interval * n)
    stats = EpisodeStats(n)
    version, policy = 0, None
    env_steps, since_pull, updates, episodes = 0, config.weight_pull_interval, 0, 0
    obs, _ = env.reset(seed=config.seed + 1000 * config.actor_index)
    start = time.perf_counter()
    try:
        while not (stop is not None and stop.is_set()):
            if config.steps and env_steps >= config.steps:
                break
            if since_pull >= config.weight_pull_interval:
                since_pull = 0
                pull = functools.partial(client.get_weights, newer_than=version)
                got = _retrying(pull, config, stop)
                if got is not None:
                    version, policy = got[0], choose.policy(list(got[1]))
                    updates += 1
            actions = choose(policy, obs)
            next_obs, reward, terminated, truncated, info = env.step(actions)
            done = terminated | truncated
            chunk.add_step(obs, actions, reward, next_obs, terminated, truncated, info)
            env_steps += n
            since_pull += n
            for episodic_return, length in stats.step(reward, done):
                episodes += 1
                if report is not None:
                    report("episode", config.actor_index, (env_steps, episodic_return, length))
            if chunk.count == chunk.size:
                client.add_batch(_streams(chunk.take(), config))
                if config.insert_slack >= 0:
                    _retrying(
                        lambda: client.wait_for_insert_room(config.insert_slack, stop),
                        config,
                        stop,
                    )
            obs = next_obs
        if chunk.count:
            client.add_batch(_streams(chunk.take(), config))
        close_client(client, stop, config.retry_deadline_s)
    except BaseException:
        client.close(flush=False)
        raise
    finally:
        env.close()
    return finish_run(
        "actor", config.actor_index, env_steps, episodes, updates, start, client, report
    )


def close_client(
    client: rg.ReplayClient, stop: threading.Event | None, retry_deadline_s: float
) -> None:
    """Flush and close an actor's client: a stopped actor (SIGTERM) flushes for at most
    `STOP_FLUSH_S`, within a container's grace period; a finished one waits for every ack."""
    stopped = stop is not None and stop.is_set()
    client.close(timeout=min(STOP_FLUSH_S, retry_deadline_s) if stopped else None)


def finish_run(
    kind: str,
    index: int,
    env_steps: int,
    episodes: int,
    updates: int,
    start: float,
    client: rg.ReplayClient,
    report: Report | None,
) -> dict[str, float]:
    """An actor run's result (what `run_actor` returns), logged in one line and reported
    (``"done"``) to the parent process when there is one."""
    seconds = time.perf_counter() - start
    result = {
        "env_steps": float(env_steps),
        "episodes": float(episodes),
        "seconds": seconds,
        "env_steps_per_s": env_steps / max(seconds, 1e-9),
        "weight_updates": float(updates),
        "acked_transitions": float(client.acked_transitions),
    }
    logger.info(
        "%s %d: %d env steps in %.1f s (%.0f/s), %d episodes, %d weight updates",
        kind,
        index,
        env_steps,
        seconds,
        result["env_steps_per_s"],
        episodes,
        updates,
    )
    if report is not None:
        report("done", index, result)
    return result


class _ActionChooser:
    """Actions for a vector step: explore uniformly until weights arrive, then the agent's
    behaviour policy (dqn: epsilon-greedy at the actor's epsilon; sac: a sampled action)."""

    def __init__(self, config: ActorConfig, space: gym.Space, rng: np.random.Generator) -> None:
        self.config, self.space, self.rng = config, space, rng
        if config.agent == "dqn" and not isinstance(space, gym.spaces.Discrete):
            raise rg.ConfigError(
                f"env {config.env_id}: got action space {space}, expected Discrete for a dqn "
                "actor (a learner with --agent sac runs Box-action envs)"
            )
        if config.agent == "sac" and not (isinstance(space, gym.spaces.Box) and space.is_bounded()):
            raise rg.ConfigError(
                f"env {config.env_id}: got action space {space}, expected a bounded Box for a "
                "sac actor (a learner with --agent dqn runs Discrete-action envs)"
            )

    def policy(self, weights: list[np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
        """The behaviour policy over newly pulled ``weights``."""
        if self.config.agent == "dqn":
            return greedy_q_policy(weights)
        low, high = self.space.low.astype(np.float64), self.space.high.astype(np.float64)
        scale, bias = ((high - low) / 2).astype(np.float32), ((high + low) / 2).astype(np.float32)
        return squashed_gaussian_policy(weights, scale, bias, self.rng)

    def __call__(self, policy: Callable | None, obs: np.ndarray) -> np.ndarray:
        n, space = batch_size_of(obs), self.space
        if self.config.agent == "sac":
            if policy is None:
                return self.rng.uniform(space.low, space.high, (n, *space.shape)).astype(
                    space.dtype
                )
            return policy(obs).astype(space.dtype)
        num_actions = int(space.n)
        if policy is None:
            return self.rng.integers(num_actions, size=n).astype(np.int64)
        return epsilon_greedy_actions(policy, obs, self.config.epsilon, num_actions, self.rng)


def actor_config(
    settings: rg.ActorSettings, index: int, num_actors: int, **overrides: object
) -> ActorConfig:
    """The config of actor ``index`` of ``num_actors`` under a learner's `rg.ActorSettings`
    (its env, agent, exploration, weight-pull interval, envs per actor and seed); ``overrides``
    replace any field (e.g. ``steps=``, ``token=``)."""
    base = ActorConfig(
        env_id=settings.env_id,
        agent=settings.agent,
        actor_index=index,
        num_actors=num_actors,
        num_envs=settings.num_envs,
        seed=settings.seed,
        weight_pull_interval=settings.weight_pull_interval,
        epsilon_base=settings.epsilon_base,
        epsilon_alpha=settings.epsilon_alpha,
    )
    return replace(base, **overrides) if overrides else base


def _default_prefix() -> str:
    """``HOSTNAME-PID``: two `replaygpu actor` commands on one host with the same indices still
    get distinct ids (a shared id would make the ledger drop one actor's batches as resent)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _retrying(call: Callable[[], T], config: ActorConfig, stop: threading.Event | None) -> T:
    """``call()``, retried while the server is unavailable (a learner restarting), with
    backoff up to 1 s, for ``retry_deadline_s`` at most, like the client's append stream.

    Raises:
        ServiceUnavailableError: still unavailable after ``retry_deadline_s``, or stopped.
    """
    deadline = time.monotonic() + config.retry_deadline_s
    wait = 0.05
    while True:
        try:
            return call()
        except rg.ServiceError as err:
            # a learner going down cancels calls in flight; one that is down is UNAVAILABLE
            transient = getattr(err, "code", None) in _TRANSIENT and not isinstance(
                err, rg.TLSError
            )
            late = time.monotonic() + wait > deadline
            if not transient or late or (stop is not None and stop.is_set()):
                raise
            if wait == 0.05:
                logger.info(
                    "server unavailable (%s); retrying for %.0f s", err, config.retry_deadline_s
                )
            time.sleep(wait)
            wait = min(1.0, wait * 2)


def _streams(batch: dict[str, np.ndarray], config: ActorConfig) -> dict[str, np.ndarray]:
    """With a `STREAM_FIELD` in the table: fill it and reorder the rows env-major.

    The chunk holds whole vector steps (row ``r`` is env ``r % num_envs``); env-major order puts
    each env's steps in consecutive rows, in time order.
    """
    if STREAM_FIELD not in batch:
        return batch
    n = config.num_envs
    rows = len(batch[STREAM_FIELD])
    env = np.arange(rows) % n
    batch[STREAM_FIELD] = (config.actor_index * n + env).astype(batch[STREAM_FIELD].dtype)
    if n == 1:
        return batch
    order = np.arange(rows).reshape(-1, n).T.ravel()
    return {k: v[order] for k, v in batch.items()}


def run_actor_process(config: ActorConfig, address: str, stop=None, reports=None) -> None:
    """Entry point of a spawned actor process.

    Args:
        config: the actor's config.
        address: the replay server's ``host:port``.
        stop: a multiprocessing Event that ends the actor.
        reports: a bounded multiprocessing Queue for episode and final reports (dropped when
            full, so a slow reader never blocks the actor), or None.
    """
    import queue
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops actors through ``stop``
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    def report(kind: str, index: int, payload: object) -> None:
        try:
            reports.put_nowait((kind, index, payload))
        except queue.Full:
            if kind == "done":
                reports.put((kind, index, payload), timeout=10)

    try:
        run_actor(config, address, stop=stop, report=report if reports is not None else None)
    except rg.ReplayError as err:  # the server's or the config's: one line, not a traceback
        logger.error("actor %d: %s: %s", config.actor_index, type(err).__name__, err)
        raise SystemExit(2) from None
