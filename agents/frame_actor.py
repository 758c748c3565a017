"""An Atari actor for a frame-table learner: one preprocessed ALE env, a numpy Nature CNN,
whole episode segments per gRPC request.

A frame table (`rg.make_frame_table`) needs each episode's rows contiguous: row ``i + 1`` must
hold the frame after row ``i``. Rows of several actors interleave in the learner's table at
request granularity (the server commits each request whole and contiguously), so this actor
never splits a table episode over two requests: `SegmentWriter` turns the steps of each table
episode (a life when a lost life is terminal) into rows with `rg.frame_rows` once it ends, and
once they hold ``send_steps`` env steps `send_segments` sends the finished segments, in groups
of whole segments, each group one ``add_batch`` sealed into one request at once
(`segment_client_config` makes a request big enough).

An episode longer than ``segment_steps`` is cut there: its last step is marked truncated (the
learner bootstraps from its ``next_obs``, as at a time limit) and the next segment starts with
``first=True`` at the current frame. So the first k-1 stacks after a cut are padded with that
frame instead of the true history; the actor acts on those same padded stacks, so what it saw
is what the learner samples. With the default 1000-step cap this touches 3 of 1000 stacks of
long episodes only.

Actor ``i`` of ``N`` explores with ``eps_i = 0.4 ** (1 + 7 i / (N - 1))`` (Ape-X, through
`ActorConfig.epsilon`) and pulls the learner's Nature CNN weights every
``weight_pull_interval`` env steps (`cnn_policy.greedy_cnn_policy`). Actor processes import
no TensorFlow (`rg.frame_rows` lives in `replaygpu.frames`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

import replaygpu as rg
from replaygpu.agents.actor import ActorConfig, Report, close_client, finish_run
from replaygpu.agents.cnn_policy import greedy_cnn_policy
from replaygpu.agents.envs import EpisodeStats, make_atari_env
from replaygpu.agents.policies import epsilon_greedy_actions

logger = logging.getLogger(__name__)

#: bytes of one frame-table row of an 84x84 frame, with room to spare for the small fields
ROW_BYTES = 84 * 84 + 64


@dataclass(frozen=True)
class FrameActorConfig:
    """One Atari actor: the shared actor settings plus the frame-table specifics."""

    actor: ActorConfig = field(default_factory=lambda: ActorConfig(env_id="ALE/Breakout-v5"))
    segment_steps: int = 1000
    send_steps: int = 256
    frame_stack: int = 4
    repeat_action_probability: float = 0.25
    terminal_on_life_loss: bool = True
    clip_rewards: bool = True

    def __post_init__(self) -> None:
        if min(self.segment_steps, self.send_steps, self.frame_stack) < 1:
            raise rg.ConfigError(
                f"segment_steps={self.segment_steps}, send_steps={self.send_steps}, "
                f"frame_stack={self.frame_stack}: expected all >= 1"
            )


def segment_client_config(segment_steps: int, retry_deadline_s: float = 60.0) -> rg.ClientConfig:
    """A `rg.ClientConfig` for `send_segments`: requests of up to ``3 * segment_steps + 2``
    rows (a segment has at most ``segment_steps + 1``), a buffer of a few of them."""
    rows = 3 * segment_steps + 2
    batch = rows * ROW_BYTES
    return rg.ClientConfig(
        max_batch_transitions=rows,
        max_batch_bytes=batch,
        max_message_bytes=max(batch + (1 << 20), 64 << 20),
        max_buffer_bytes=max(3 * batch, 64 << 20),
        retry_deadline_s=retry_deadline_s,
    )


class SegmentWriter:
    """Collects one env's steps into whole table episodes of at most ``segment_steps`` steps.

    ``stack`` is the current ``[k, 84, 84]`` observation, padded with the segment's first frame
    as the `rg.FrameStackSampler` rebuilds it. Finished segments (rows of `rg.frame_rows`, each
    starting with ``first=True`` and ending with its ``final`` row) collect in ``segments``.
    """

    def __init__(self, stack: int, segment_steps: int) -> None:
        self.k, self.cap = stack, segment_steps
        self.segments: list[dict[str, np.ndarray]] = []
        self.steps_ready = 0  # env steps in ``segments``

    def start(self, frame: np.ndarray) -> None:
        """Begin a table episode at ``frame``."""
        self.frames = [frame]
        self.steps: list[tuple[int, float, bool, bool]] = []
        self.stack = np.repeat(frame[None], self.k, axis=0)

    def step(
        self, action: int, reward: float, terminated: bool, truncated: bool, frame: np.ndarray
    ) -> None:
        """Record one step ending at ``frame``. An episode end finishes the segment (call
        `start` for the next one); so does the cap, which starts the next one itself."""
        capped = len(self.steps) + 1 >= self.cap and not (terminated or truncated)
        self.steps.append((action, reward, terminated, truncated or capped))
        self.frames.append(frame)
        self.stack = np.concatenate([self.stack[1:], frame[None]])
        if terminated or truncated or capped:
            self._finish()
            if capped:
                self.start(frame)

    def end(self) -> None:
        """End the segment being written (if it has steps) as a truncation; call `start`
        before writing more."""
        if self.steps:
            action, reward, terminated, _ = self.steps[-1]
            self.steps[-1] = (action, reward, terminated, True)
            self._finish()
            self.steps = []

    def _finish(self) -> None:
        actions, rewards, terms, truncs = (np.array(c) for c in zip(*self.steps, strict=True))
        self.segments.append(
            rg.frame_rows(np.stack(self.frames), actions, rewards, terms, truncs, True)
        )
        self.steps_ready += len(actions)

    def take(self) -> list[dict[str, np.ndarray]]:
        """The finished segments, oldest first; empties the list."""
        segments, self.segments, self.steps_ready = self.segments, [], 0
        return segments


def send_segments(client: rg.ReplayClient, segments: Sequence[dict[str, np.ndarray]]) -> None:
    """Send whole segments so that none is split between requests: one ``add_batch`` per group
    of segments that fits one request, sealed at once with ``flush(timeout=0)`` (it seals the
    request being filled, then would wait for acks; it does not), so the next call never tops
    it up. The server commits each request contiguously, so another actor's rows never land
    inside a segment.

    Raises:
        ConfigError: a segment is bigger than one request of ``client``.
    """
    row = sum(
        int(np.prod(f.shape)) * np.dtype(f.numpy_dtype).itemsize for f in client.spec.values()
    )
    limit = min(client.config.max_batch_transitions, client.config.max_batch_bytes // row)
    group: list[dict[str, np.ndarray]] = []
    rows = 0
    for seg in [*segments, None]:
        n = 0 if seg is None else len(seg["frame"])
        if seg is not None and n > limit:
            raise rg.ConfigError(
                f"a segment of {n} rows is over the {limit} rows of the client's requests "
                "(max_batch_transitions, max_batch_bytes); make the client with "
                "segment_client_config(segment_steps)"
            )
        if group and (seg is None or rows + n > limit):
            client.add_batch({k: np.concatenate([s[k] for s in group]) for k in group[0]})
            with contextlib.suppress(TimeoutError):  # seal the request now, not waiting for acks
                client.flush(timeout=0)
            group, rows = [], 0
        if seg is not None:
            group.append(seg)
            rows += n


def run_frame_actor(
    config: FrameActorConfig, address: str, stop=None, report: Report | None = None
) -> dict[str, float]:
    """Play ``config.actor.env_id`` into the frame-table learner at ``address``.

    Returns:
        ``{"env_steps", "episodes", "seconds", "env_steps_per_s", "weight_updates",
        "acked_transitions"}`` (acked rows, final rows included).

    Raises:
        ReplayError: when the server is unreachable or rejects the data.
    """
    base = config.actor
    seed = base.seed + 1000 * base.actor_index
    env = make_atari_env(base.env_id, seed, config.repeat_action_probability)
    num_actions = int(env.action_space.n)
    rng = np.random.default_rng(seed)
    client = rg.ReplayClient(
        address,
        actor_id=f"{base.actor_id_prefix or _host_pid()}-{base.actor_index}",
        table=base.table,
        token=base.token or None,
        tls=base.tls,
        config=segment_client_config(config.segment_steps, base.retry_deadline_s),
    )
    writer, stats = SegmentWriter(config.frame_stack, config.segment_steps), EpisodeStats(1)
    version, policy, updates, episodes = 0, None, 0, 0
    env_steps, since_pull = 0, base.weight_pull_interval
    frame, info = env.reset(seed=seed)
    writer.start(frame)
    lives = info.get("lives", 0)
    start = time.perf_counter()
    try:
        while not (stop is not None and stop.is_set()):
            if base.steps and env_steps >= base.steps:
                break
            if since_pull >= base.weight_pull_interval:
                since_pull = 0
                got = client.get_weights(newer_than=version)
                if got is not None:
                    version, policy = got[0], greedy_cnn_policy(list(got[1]))
                    updates += 1
            if policy is None:
                action = int(rng.integers(num_actions))
            else:
                stack = writer.stack[None]
                action = int(
                    epsilon_greedy_actions(policy, stack, base.epsilon, num_actions, rng)[0]
                )
            frame, reward, terminated, truncated, info = env.step(action)
            env_steps += 1
            since_pull += 1
            life_lost = config.terminal_on_life_loss and info.get("lives", 0) < lives
            lives = info.get("lives", 0)
            clipped = float(np.sign(reward)) if config.clip_rewards else float(reward)
            writer.step(action, clipped, terminated or life_lost, truncated, frame)
            done = terminated or truncated
            for episodic_return, length in stats.step(np.array([reward]), np.array([done])):
                episodes += 1
                if report is not None:
                    report("episode", base.actor_index, (env_steps, episodic_return, length))
            if done:
                frame, info = env.reset()
                lives = info.get("lives", 0)
                writer.start(frame)
            elif life_lost:
                writer.start(frame)  # a new table episode; the game plays on
            if writer.steps_ready >= min(config.send_steps, config.segment_steps):
                _send(client, writer, env_steps, base, stop, report)
        writer.end()  # the unfinished segment, as a truncation
        _send(client, writer, env_steps, base, None, report)
        close_client(client, stop, base.retry_deadline_s)
    except BaseException:
        client.close(flush=False)
        raise
    finally:
        env.close()
    return finish_run(
        "frame actor", base.actor_index, env_steps, episodes, updates, start, client, report
    )


def _send(client, writer: SegmentWriter, env_steps: int, base: ActorConfig, stop, report) -> None:
    """Send the finished segments, report the env steps sent, then follow the learner's
    samples-per-insert limit (wait while the table runs ahead of its sampling)."""
    sent = writer.steps_ready
    segments = writer.take()
    if not segments:
        return
    send_segments(client, segments)
    if report is not None:
        report("sent", base.actor_index, (env_steps, sent))
    if stop is not None and base.insert_slack >= 0:
        client.wait_for_insert_room(base.insert_slack, stop)


def _host_pid() -> str:
    """``HOSTNAME-PID``: a default actor-id prefix no other actor process shares."""
    return f"{socket.gethostname()}-{os.getpid()}"


def run_frame_actor_process(config: FrameActorConfig, address: str, stop, reports) -> None:
    """Entry point of a spawned frame actor (``reports``: a bounded multiprocessing Queue;
    episode reports are dropped when it is full, so a slow reader never blocks the actor)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops actors through ``stop``
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    def report(kind: str, index: int, payload: object) -> None:
        try:
            reports.put_nowait((kind, index, payload))
        except queue.Full:
            if kind != "episode":
                reports.put((kind, index, payload), timeout=10)

    try:
        run_frame_actor(config, address, stop=stop, report=report)
    except rg.ReplayError as err:  # the server's or the config's: one line, not a traceback
        logger.error("frame actor %d: %s: %s", config.actor.actor_index, type(err).__name__, err)
        raise SystemExit(2) from None
