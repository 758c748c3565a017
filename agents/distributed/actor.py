"""The one actor loop: envs, a numpy behaviour policy, a `ReplayClient`.

`run_actor` makes one batched numpy policy call per vector step and uses only `rg.ReplayClient`'s
public API. Actor ``i`` of ``N`` explores with ``eps_i = epsilon_base ** (1 + epsilon_alpha * i /
(N - 1))`` (Ape-X). Kinds of actor differ only in their `Experience` (`make_experience`: one
of the kinds in `experience`).

Config comes from the learner's ``Info`` (`ActorConfig.from_settings`). Episode returns
(unclipped, the whole game) ride on the next request (``report_episode``); the actor stops,
flushing, once the run is finished (``run_finished``). No TensorFlow: processes start fast.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import gymnasium as gym
import numpy as np

import replaygpu as rg
from replaygpu.errors import ReplayError
from replaygpu.fields import HostSpec
from replaygpu.service.actor.connection import OUTAGE_CODES
from replaygpu.service.config import ClientConfig
from replaygpu.service.wire.status import ServiceError, TLSError

from ..policies import batch_size_of, epsilon_greedy_actions, squashed_gaussian_policy
from ..r2d2.experience import RecurrentExperience
from ..rollouts import EpisodeStats, Policy
from .actor_config import ActorConfig
from .experience import FrameExperience, VectorExperience

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a stopped actor waits for its last acks before dropping them: short, so ``replaygpu
#: actor`` stops within 5 s of Ctrl-C (a live learner acks within milliseconds).
STOP_FLUSH_S = 3.0

#: ``report(kind, actor_index, payload)``: "episode" with (env_steps, return, length), "sent"
#: with (env_steps, env steps sent), or "done" with the actor's final stats dict.
Report = Callable[[str, int, object], None]


class Experience(Protocol):
    """What an actor collects: its envs, the network it acts with, the rows its steps become.

    `run_actor` calls `start`, per vector step `observation`, `step` and `send`, at the end
    ``send(client, final=True)`` and `close`. ``client_config``: the rows' request sizes, retries.
    """

    num_envs: int
    action_space: gym.Space
    client_config: ClientConfig

    def greedy(self, weights: list[np.ndarray]) -> Policy:
        """The greedy policy of a Q-network's pulled ``weights`` (dqn)."""

    def start(self, seed: int, spec: HostSpec) -> None:
        """Reset the envs with ``seed``; rows of the table's ``spec`` from now on."""

    def observation(self) -> Any:
        """``[num_envs, ...]``: what the policy acts on now."""

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Step every env, keeping the rows; ``[num_envs]`` raw rewards and episode ends."""

    def send(self, client: rg.ReplayClient, final: bool = False) -> int:
        """Send the rows that are ready (``final``: all); the env steps sent (0: none)."""

    def close(self) -> None: ...


def make_experience(config: ActorConfig) -> Experience:
    """Sequences with LSTM state if ``sequence_period``, frames if ``frame_stack``, else vectors.

    Raises:
        ConfigError: an env id gymnasium does not know (or not an ALE game, for frames).
    """
    if config.sequence_period:
        return RecurrentExperience(config)
    return FrameExperience(config) if config.frame_stack else VectorExperience(config)


def run_actor(
    config: ActorConfig,
    address: str,
    stop: threading.Event | None = None,
    report: Report | None = None,
) -> dict[str, float]:
    """Collect into the replay server at ``address`` until ``steps``, the run's end, or ``stop``.

    Returns:
        stats: ``acked_transitions`` the rows the server committed; ``unacked_*`` what was
        unacknowledged at the stop (after `STOP_FLUSH_S`); ``run_finished`` 1.0 when the
        learner ended the run.

    Raises:
        ReplayError: the server is unreachable or rejects the data.
    """
    experience = make_experience(config)
    try:
        rng = np.random.default_rng(config.env_seed)
        choose = _ActionChooser(config, experience, rng)
        client = connect(config, address, experience.client_config)
    except BaseException:
        experience.close()
        raise
    n, index = experience.num_envs, config.actor_index

    def stopped() -> bool:  # by the caller, or the learner's run is finished
        return (stop is not None and stop.is_set()) or client.run_finished

    stats = EpisodeStats(n)
    version, policy = 0, None
    env_steps, since_pull, updates, episodes = 0, config.weight_pull_interval, 0, 0
    progress = _Progress(index, config.progress_interval_s)

    def send(final: bool = False) -> int:
        sent = experience.send(client, final)
        if sent and report is not None:
            report("sent", index, (env_steps, sent))
        return sent

    start = time.perf_counter()
    try:
        experience.start(config.env_seed, client.spec)
        while not stopped() and not (config.steps and env_steps >= config.steps):
            if since_pull >= config.weight_pull_interval:
                since_pull = 0
                pull = functools.partial(client.get_weights, newer_than=version)
                got = _retrying(pull, config, stopped)
                if got is not None:
                    version, policy = got[0], choose.policy(list(got[1]))
                    updates += 1
            reward, done = experience.step(choose(policy, experience.observation()))
            env_steps += n
            since_pull += n
            for episodic_return, length in stats.step(reward, done):
                episodes += 1
                client.report_episode(episodic_return, length)
                if report is not None:
                    report("episode", index, (env_steps, episodic_return, length))
            if send() and config.insert_slack >= 0:
                room = functools.partial(client.wait_for_insert_room, config.insert_slack, stop)
                _retrying(room, config, stopped)
            progress(env_steps, episodes, stats, client)
        if client.run_finished:
            logger.info("actor %d: the learner's run is finished; stopping", index)
        else:
            send(final=True)
        # stopped or run over (the learner may exit): flush for STOP_FLUSH_S at most; one that
        # collected its steps waits for every ack
        if stopped():
            with contextlib.suppress(TimeoutError):  # counted in the result: unacked_*
                client.close(timeout=min(STOP_FLUSH_S, config.retry_deadline_s))
        else:
            client.close()
    except BaseException:
        client.close(flush=False)
        raise
    finally:
        experience.close()
    seconds, unacked = time.perf_counter() - start, client.unacked
    result = {
        "env_steps": float(env_steps),
        "episodes": float(episodes),
        "seconds": seconds,
        "env_steps_per_s": env_steps / max(seconds, 1e-9),
        "weight_updates": float(updates),
        "acked_transitions": float(client.acked_transitions),
        "unacked_transitions": float(unacked.transitions),
        "unacked_requests": float(unacked.requests),
        "unacked_bytes": float(unacked.nbytes),
        "run_finished": float(client.run_finished),
    }
    logger.info(
        "actor %d: %d env steps in %.1f s (%.0f/s), %d episodes, %d weight updates",
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


def connect(
    config: ActorConfig, address: str, client_config: ClientConfig | None = None
) -> rg.ReplayClient:
    """The actor's `rg.ReplayClient`, id ``PREFIX-INDEX``.

    Raises:
        ServiceError: the server cannot be reached within ``retry_deadline_s``, refuses the
            token or the TLS handshake, or has no such table.
    """
    return rg.ReplayClient(
        address,
        actor_id=f"{config.actor_id_prefix or default_prefix()}-{config.actor_index}",
        table=config.table,
        token=config.token or None,
        tls=config.tls,
        config=client_config or ClientConfig(retry_deadline_s=config.retry_deadline_s),
    )


class _ActionChooser:
    """Uniform actions until weights come, then dqn: epsilon-greedy at its epsilon, sac: sampled."""

    def __init__(self, config: ActorConfig, experience: Experience, rng: np.random.Generator):
        self.config, self.space, self.rng = config, experience.action_space, rng
        self.greedy = experience.greedy
        space = self.space
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

    def policy(self, weights: list[np.ndarray]) -> Policy:
        """The behaviour policy over newly pulled ``weights``."""
        if self.config.agent == "dqn":
            return self.greedy(weights)
        low, high = self.space.low.astype(np.float64), self.space.high.astype(np.float64)
        scale, bias = ((high - low) / 2).astype(np.float32), ((high + low) / 2).astype(np.float32)
        return squashed_gaussian_policy(weights, scale, bias, self.rng)

    def __call__(self, policy: Policy | None, obs: Any) -> np.ndarray:
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


def default_prefix() -> str:
    """``HOSTNAME-PID``: distinct per command (else the ledger drops one's batches as resent)."""
    return f"{socket.gethostname()}-{os.getpid()}"


class _Progress:
    """The actor's progress line, every ``interval_s`` seconds (0: never)."""

    def __init__(self, index: int, interval_s: float) -> None:
        self.index, self.interval_s = index, interval_s
        self.last_time, self.last_steps = time.monotonic(), 0

    def __call__(
        self, env_steps: int, episodes: int, stats: EpisodeStats, client: rg.ReplayClient
    ) -> None:
        now = time.monotonic()
        if not self.interval_s or now - self.last_time < self.interval_s:
            return
        rate = (env_steps - self.last_steps) / (now - self.last_time)
        self.last_time, self.last_steps = now, env_steps
        last = f"{stats.recent[-1]:.1f}" if stats.recent else "none yet"
        logger.info(
            "actor %d: %d env steps (%.0f/s), %d episodes, last return %s, %d transitions acked",
            self.index,
            env_steps,
            rate,
            episodes,
            last,
            client.acked_transitions,
        )


def _retrying(call: Callable[[], T], config: ActorConfig, stopped: Callable[[], bool]) -> T | None:
    """``call()``, retried while the server is unavailable (a learner restarting), backoff up to
    1 s, for ``retry_deadline_s`` at most; the client logs the outage, not each retry.

    Returns:
        what ``call`` returned, or None once ``stopped()`` after a failed call.

    Raises:
        ServiceUnavailableError: still unavailable after ``retry_deadline_s``.
    """
    deadline = time.monotonic() + config.retry_deadline_s
    wait = 0.05
    while True:
        try:
            return call()
        except ServiceError as err:
            # a learner going down cancels calls in flight; one that is down is UNAVAILABLE
            transient = err.code in OUTAGE_CODES and not isinstance(err, TLSError)
            if transient and stopped():
                return None
            if not transient or time.monotonic() + wait > deadline:
                raise
            end = time.monotonic() + wait
            while not stopped() and time.monotonic() < end:  # the stop comes within 50 ms
                time.sleep(0.05)
            wait = min(1.0, wait * 2)


def run_actor_process(config: ActorConfig, address: str, stop=None, reports=None) -> None:
    """A spawned actor process's `run_actor`; ``reports`` a bounded Queue or None (when full,
    all but the final report are dropped, so a slow reader never blocks the actor)."""
    import queue
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops actors through ``stop``
    if stop is not None:  # SIGTERM (to the process group) stops, flushing; `stop.set` in a
        # thread, as the handler may interrupt `stop.is_set` holding the event's lock
        def on_sigterm(*_: object) -> None:
            threading.Thread(target=stop.set, daemon=True).start()

        signal.signal(signal.SIGTERM, on_sigterm)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(processName)s %(name)s: %(message)s"
    )

    def report(kind: str, index: int, payload: object) -> None:
        try:
            reports.put_nowait((kind, index, payload))
        except queue.Full:
            if kind == "done":
                reports.put((kind, index, payload), timeout=10)

    try:
        run_actor(config, address, stop=stop, report=report if reports is not None else None)
    except ReplayError as err:  # the server's or the config's: one line, not a traceback
        logger.error("actor %d: %s: %s", config.actor_index, type(err).__name__, err)
        raise SystemExit(2) from None
