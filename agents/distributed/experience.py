"""The kinds of actor, each an `Experience` that `actor.run_actor` takes: `VectorExperience`
(transitions of vector envs; R2D2's `r2d2.experience.RecurrentExperience` builds on it) and
`FrameExperience`: ALE games preprocessed to 84x84 grey frames, a numpy Nature CNN, whole
episode segments per request.

A frame table (`make_frame_table`) needs each episode's rows contiguous (row ``i + 1`` holds
the frame after row ``i``), and actors' rows interleave per request (the server commits each
whole), so a frame actor never splits a table episode over two requests: `SegmentWriter` turns
each ended table episode (a life, when a lost life is terminal) into rows with `frame_rows`, and
`send_segments` sends them in groups of whole segments, one sealed request each
(`segment_client_config` makes a request big enough).

An episode longer than ``segment_steps`` is cut: its last step is marked truncated (the learner
bootstraps from its ``next_obs``) and the next segment starts (``first=True``) at that frame,
which pads the first k-1 stacks after the cut, for the actor as for the learner; the default
1000-step cap touches 3 of 1000 stacks of long episodes only.

A frame actor's policy is the learner's Nature CNN (`policies.greedy_cnn_policy`). No TensorFlow
import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

import replaygpu as rg
from replaygpu.fields import HostSpec
from replaygpu.frames import frame_rows
from replaygpu.service.config import ClientConfig

from ..envs import make_atari_env, make_vector_env
from ..policies import greedy_cnn_policy, greedy_q_policy
from ..rollouts import Policy, TransitionChunk
from .actor_config import ActorConfig

#: bytes of one frame-table row: an 84x84 frame plus room for the small fields
ROW_BYTES = 84 * 84 + 64
#: Optional int64 table field: the env (stream) that produced each row.
STREAM_FIELD = "stream"


def segment_client_config(segment_steps: int, retry_deadline_s: float = 60.0) -> ClientConfig:
    """`send_segments`'s `ClientConfig`: requests of 3 segments (each <= segment_steps + 1 rows)."""
    rows = 3 * segment_steps + 2
    batch = rows * ROW_BYTES
    return ClientConfig(
        max_batch_transitions=rows,
        max_batch_bytes=batch,
        max_message_bytes=max(batch + (1 << 20), 64 << 20),
        max_buffer_bytes=max(3 * batch, 64 << 20),
        retry_deadline_s=retry_deadline_s,
    )


class SegmentWriter:
    """One env's steps as whole table episodes of at most ``segment_steps`` steps (0: no cap).
    ``stack`` is the current ``[k, 84, 84]`` observation, padded as `FrameStack` rebuilds it.
    Finished segments (`frame_rows`) collect in ``segments``; `take_rows` also flushes the
    unfinished one, continued in the next rows (for a writer of one table, in order)."""

    def __init__(self, stack: int, segment_steps: int = 0) -> None:
        self.k, self.cap = stack, segment_steps
        self.segments: list[dict[str, np.ndarray]] = []
        self.steps_ready = 0  # env steps in ``segments``

    def start(self, frame: np.ndarray) -> None:
        """Begin a table episode at ``frame``."""
        self.frames, self.first = [frame], True
        self.steps: list[tuple[int, float, bool, bool]] = []
        self.stack = np.repeat(frame[None], self.k, axis=0)

    def step(
        self, action: int, reward: float, terminated: bool, truncated: bool, frame: np.ndarray
    ) -> None:
        """Record a step ending at ``frame``. An episode end finishes the segment (then call
        `start`); so does the cap, which starts the next itself."""
        capped = 0 < self.cap <= len(self.steps) + 1 and not (terminated or truncated)
        self.steps.append((action, reward, terminated, truncated or capped))
        self.frames.append(frame)
        self.stack = np.concatenate([self.stack[1:], frame[None]])
        if terminated or truncated or capped:
            self._finish()
            if capped:
                self.start(frame)

    def end(self) -> None:
        """End the current segment (if it has steps) as a truncation; `start` before more."""
        if self.steps:
            action, reward, terminated, _ = self.steps[-1]
            self.steps[-1] = (action, reward, terminated, True)
            self._finish()

    def _finish(self) -> None:
        actions, rewards, terms, truncs = (np.array(c) for c in zip(*self.steps, strict=True))
        self.segments.append(
            frame_rows(np.stack(self.frames), actions, rewards, terms, truncs, self.first)
        )
        self.steps_ready += len(actions)
        self.frames, self.steps, self.first = self.frames[-1:], [], False

    def take(self) -> list[dict[str, np.ndarray]]:
        """The finished segments, oldest first; empties the list."""
        segments, self.segments, self.steps_ready = self.segments, [], 0
        return segments

    def take_rows(self) -> dict[str, np.ndarray] | None:
        """The rows of every step so far, in order, for one ``table.append``; None if none."""
        if self.steps:
            self._finish()
        segments = self.take()
        return (
            {k: np.concatenate([s[k] for s in segments]) for k in segments[0]} if segments else None
        )


def play(
    env: gym.Env, writer: SegmentWriter, action: int, lives: int, config: Any
) -> tuple[float, bool, int]:
    """One step of an ALE game into ``writer`` (a new game after the last); see `FrameExperience`.

    Returns ``(reward, done, lives)``: the raw reward, whether the game ended, its lives now.
    """
    frame, reward, terminated, truncated, info = env.step(action)
    life_lost = config.terminal_on_life_loss and info.get("lives", 0) < lives
    lives = info.get("lives", 0)
    clipped = float(np.sign(reward)) if config.clip_rewards else float(reward)
    writer.step(action, clipped, terminated or life_lost, truncated, frame)
    if terminated or truncated:
        frame, info = env.reset()
        lives = info.get("lives", 0)
        writer.start(frame)
    elif life_lost:
        writer.start(frame)  # a new table episode; the game plays on
    return reward, terminated or truncated, lives


def send_segments(client: rg.ReplayClient, segments: Sequence[dict[str, np.ndarray]]) -> None:
    """Send whole segments, none split between requests: one ``add_batch`` per group that fits
    a request, sealed at once by ``flush(timeout=0)`` (seals, does not wait for acks), so the
    next call never tops it up and another actor's rows never land inside a segment. Columns
    are cast to the table's dtypes.

    Raises:
        ConfigError: a segment is bigger than one request of ``client``.
    """
    dtypes = {name: np.dtype(f.numpy_dtype) for name, f in client.spec.items()}
    row = sum(int(np.prod(f.shape)) * dtypes[name].itemsize for name, f in client.spec.items())
    limit = min(client.config.max_batch_transitions, client.config.max_batch_bytes // row)
    group: list[dict[str, np.ndarray]] = []
    rows = 0
    for seg in [*segments, None]:
        n = 0 if seg is None else len(next(iter(seg.values())))
        if seg is not None and n > limit:
            raise rg.ConfigError(
                f"a segment of {n} rows is over the {limit} rows of the client's requests "
                "(max_batch_transitions, max_batch_bytes); make the client with "
                "segment_client_config(segment_steps)"
            )
        if group and (seg is None or rows + n > limit):
            batch = {k: np.concatenate([s[k] for s in group]) for k in group[0]}
            client.add_batch({k: np.asarray(v, dtypes.get(k)) for k, v in batch.items()})
            with contextlib.suppress(TimeoutError):  # seal the request now, not waiting for acks
                client.flush(timeout=0)
            group, rows = [], 0
        if seg is not None:
            group.append(seg)
            rows += n


def send_ready(client: rg.ReplayClient, writers: Sequence[Any], batch: int, final: bool) -> int:
    """`send_segments` of the writers' finished blocks (`SegmentWriter`, `StepBlockWriter`) once
    ``batch`` env steps are ready, or when ``final`` (the open ones ended first); returns the
    env steps sent."""
    if final:
        for writer in writers:
            writer.end()
    ready = sum(writer.steps_ready for writer in writers)
    if not ready or (ready < batch and not final):
        return 0
    send_segments(client, [block for writer in writers for block in writer.take()])
    return ready


class VectorExperience:
    """Vector transitions of ``num_envs`` envs (`make_vector_env`), ``send_interval`` vector
    steps per ``add_batch``. A `STREAM_FIELD` gets a global env id (``actor_index * num_envs +
    env``) and the batch goes env-major, so ``rg.NStep(..., stream_field="stream")`` computes
    n-step returns across interleaved actors."""

    def __init__(self, config: ActorConfig) -> None:
        self.config, self.num_envs = config, config.num_envs
        self.env = make_vector_env(config.env_id, config.num_envs, config.env_seed)
        self.action_space = self.env.single_action_space
        self.client_config = ClientConfig(retry_deadline_s=config.retry_deadline_s)

    def greedy(self, weights: list[np.ndarray]) -> Policy:
        return greedy_q_policy(weights)

    def start(self, seed: int, spec: HostSpec) -> None:
        self.obs, _ = self.env.reset(seed=seed)
        self.chunk = TransitionChunk(spec, self.config.send_interval * self.num_envs)

    def observation(self) -> Any:
        return self.obs

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        next_obs, reward, terminated, truncated, info = self.env.step(actions)
        self.chunk.add_step(self.obs, actions, reward, next_obs, terminated, truncated, info)
        self.obs = next_obs
        return reward, terminated | truncated

    def send(self, client: rg.ReplayClient, final: bool = False) -> int:
        rows = self.chunk.count
        if not rows or (rows < self.chunk.size and not final):
            return 0
        client.add_batch(self._streams(self.chunk.take()))
        return rows

    def _streams(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Fill a `STREAM_FIELD`; rows env-major (chunk row ``r`` is env ``r % num_envs``)."""
        if STREAM_FIELD not in batch:
            return batch
        n = self.num_envs
        rows = len(batch[STREAM_FIELD])
        env = np.arange(rows) % n
        batch[STREAM_FIELD] = (self.config.actor_index * n + env).astype(batch[STREAM_FIELD].dtype)
        if n == 1:
            return batch
        order = np.arange(rows).reshape(-1, n).T.ravel()
        return {k: v[order] for k, v in batch.items()}

    def close(self) -> None:
        self.env.close()


class FrameExperience:
    """Frames of ``num_envs`` ALE games (`envs.make_atari_env`) as whole table episodes
    (`SegmentWriter`); the CNN acts on the writers' stacks. Rewards clipped to their sign
    (``clip_rewards``); a lost life ends a table episode as terminal while the game plays on
    (``terminal_on_life_loss``).

    Raises:
        ConfigError: ale-py missing, or ``env_id`` not an ALE game.
    """

    def __init__(self, config: ActorConfig) -> None:
        self.config, self.num_envs = config, config.num_envs
        self.envs: list[gym.Env] = []
        try:
            for i in range(config.num_envs):
                env = make_atari_env(
                    config.env_id, config.env_seed + i, config.repeat_action_probability
                )
                self.envs.append(env)
        except BaseException:
            self.close()
            raise
        self.action_space = self.envs[0].action_space
        self.client_config = segment_client_config(config.segment_steps, config.retry_deadline_s)
        self.writers = [SegmentWriter(config.frame_stack, config.segment_steps) for _ in self.envs]
        self.lives = [0] * config.num_envs

    def greedy(self, weights: list[np.ndarray]) -> Policy:
        return greedy_cnn_policy(weights)

    def start(self, seed: int, spec: HostSpec) -> None:
        frame = spec.get("frame")
        if frame is None or tuple(frame.shape) != (84, 84):
            raise rg.ConfigError(
                f"table {self.config.table!r} has fields {dict(spec)}; a frame actor "
                f"(frame_stack {self.config.frame_stack}) writes a frame table of 84x84 frames "
                "(make_frame_table): serve one, or set frame_stack 0"
            )
        for i, (env, writer) in enumerate(zip(self.envs, self.writers, strict=True)):
            frame, info = env.reset(seed=seed + i)
            writer.start(frame)
            self.lives[i] = info.get("lives", 0)

    def observation(self) -> np.ndarray:
        return np.stack([writer.stack for writer in self.writers])

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rewards, ended = np.zeros(self.num_envs), np.zeros(self.num_envs, bool)
        for i, (env, writer) in enumerate(zip(self.envs, self.writers, strict=True)):
            rewards[i], ended[i], self.lives[i] = play(
                env, writer, int(actions[i]), self.lives[i], self.config
            )
        return rewards, ended

    def send(self, client: rg.ReplayClient, final: bool = False) -> int:
        batch = min(self.config.send_interval * self.num_envs, self.config.segment_steps)
        return send_ready(client, self.writers, batch, final)

    def close(self) -> None:
        for env in self.envs:
            env.close()
