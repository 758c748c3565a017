"""What an agent's envs yield: transitions in chunks (`ChunkCollector`, one `ReplayTable.append`
each; the true last observation of each ended episode included), episode statistics, greedy
evaluation; and the training jobs that overlap acting (`TrainingJobs`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import gymnasium as gym
import numpy as np

from replaygpu.fields import TRANSITION_FIELDS, HostSpec
from replaygpu.nest import flatten_batch

#: the most episodes `evaluate` plays side by side (the envs it holds at once)
EVAL_GROUP = 64

#: policy for evaluation and acting: ``[B, *obs_shape] observations -> [B, ...] actions``.
Policy = Callable[[np.ndarray], np.ndarray]


def true_next_obs(obs: Any, done: np.ndarray, info: Mapping) -> Any:
    """The next observation of each env's transition: ``info["final_obs"]`` where it ended;
    ``obs`` is ``[N, ...]``, or a nest of them (a Dict or Tuple space)."""
    if not done.any() or "final_obs" not in info:
        return obs
    ended = np.flatnonzero(info["_final_obs"])
    return _with_rows(obs, ended, [info["final_obs"][i] for i in ended])


def _with_rows(obs: Any, rows: np.ndarray, values: list[Any]) -> Any:
    """``obs`` (``[N, ...]`` or a nest) copied, row ``rows[j]`` = ``values[j]`` (nested alike)."""
    if isinstance(obs, Mapping):
        return {k: _with_rows(v, rows, [x[k] for x in values]) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_with_rows(v, rows, [x[j] for x in values]) for j, v in enumerate(obs))
    out = obs.copy()
    for i, value in zip(rows, values, strict=True):
        out[i] = value
    return out


class EpisodeStats:
    """Running return and length per env; remembers the last ``window`` finished episodes."""

    def __init__(self, num_envs: int, window: int = 20) -> None:
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)
        self.recent: deque[float] = deque(maxlen=window)

    def step(self, reward: np.ndarray, done: np.ndarray) -> list[tuple[float, int]]:
        """Add one vector step; returns ``(return, length)`` of each episode that just ended."""
        self.returns += reward
        self.lengths += 1
        if not done.any():
            return []
        finished = []
        for i in np.flatnonzero(done):
            finished.append((float(self.returns[i]), int(self.lengths[i])))
            self.recent.append(float(self.returns[i]))
            self.returns[i] = 0.0
            self.lengths[i] = 0
        return finished

    @property
    def recent_mean(self) -> float:
        """Mean return of the recent finished episodes (NaN before the first one)."""
        return float(np.mean(self.recent)) if self.recent else float("nan")


class TransitionChunk:
    """Preallocated numpy columns for up to ``size`` transitions of ``spec``
    (``host_spec(table.spec)``, or a client's ``spec``) between calls of `take`."""

    def __init__(self, spec: HostSpec, size: int) -> None:
        self.columns = {k: np.zeros((size, *f.shape), f.numpy_dtype) for k, f in spec.items()}
        self.size = size
        self.count = 0
        # one column per transition field (no nested observation): add_step writes straight in
        self._flat = set(self.columns) == set(TRANSITION_FIELDS)

    def add(self, **fields: Any) -> None:
        """Add ``n`` transitions as ``field=[n, ...]`` arrays, or nests of them (a Dict
        observation) when the spec's leaves are their paths."""
        fields = flatten_batch(self.columns, fields)
        n = len(next(iter(fields.values())))
        if self.count + n > self.size:
            raise ValueError(f"chunk overflow: holds {self.count} of {self.size}, adding {n}")
        for k, v in fields.items():
            self.columns[k][self.count : self.count + n] = v
        self.count += n

    def add_step(
        self,
        obs: Any,
        actions: np.ndarray,
        reward: np.ndarray,
        next_obs: Any,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: dict,
    ) -> None:
        """Add a vector-env step, with the true last obs (`true_next_obs`) where episodes ended."""
        done = terminated | truncated
        if self._flat:  # the acting loops' per-step path: assignment casts as astype does
            n, i = len(actions), self.count
            if i + n > self.size:
                raise ValueError(f"chunk overflow: holds {i} of {self.size}, adding {n}")
            rows = slice(i, i + n)
            columns = self.columns
            columns["obs"][rows] = obs
            columns["action"][rows] = actions
            columns["reward"][rows] = reward
            columns["next_obs"][rows] = true_next_obs(next_obs, done, info)
            columns["terminated"][rows] = terminated
            columns["truncated"][rows] = truncated
            self.count = i + n
            return
        self.add(
            obs=obs,
            action=actions.astype(self.columns["action"].dtype, copy=False),
            reward=reward.astype(np.float32, copy=False),
            next_obs=true_next_obs(next_obs, done, info),
            terminated=terminated,
            truncated=truncated,
        )

    def take(self) -> dict[str, np.ndarray]:
        """The filled rows as a batch (copies), and empty the chunk."""
        batch = {k: v[: self.count].copy() for k, v in self.columns.items()}
        self.count = 0
        return batch


#: acting policy of a training loop: ``(obs [N, ...], env steps taken so far) -> [N, ...]``
StepPolicy = Callable[[Any, int], np.ndarray]


class ChunkCollector:
    """The acting half of a single-process training loop (DQN's, SAC's): steps ``env``
    (`envs.make_vector_env`, closed by `close`) a chunk of at most ``size`` env steps at a time,
    calling ``on_episode(env_steps, episodic_return, length)`` as each episode ends.

    Env state is not checkpointed: the env is reset with seeds ``seed + env_steps`` (those a
    resumed run took before), so a resumed run does not replay its first episodes.
    """

    def __init__(
        self,
        env: gym.vector.VectorEnv,
        spec: HostSpec,
        size: int,
        on_episode: Callable[[int, float, int], None],
        seed: int,
        env_steps: int = 0,
    ) -> None:
        self.env = env
        self.chunk = TransitionChunk(spec, size)
        self.stats = EpisodeStats(env.num_envs)
        self.on_episode = on_episode
        self.env_steps = env_steps
        self.obs, _ = env.reset(seed=seed + env_steps)

    def collect(self, policy: StepPolicy, env_steps: int) -> dict[str, np.ndarray]:
        """``{field: [env_steps, ...]}`` transitions of ``env_steps`` steps with ``policy``."""
        env, chunk, stats, on_episode = self.env, self.chunk, self.stats, self.on_episode
        n, step, obs = env.num_envs, self.env_steps, self.obs
        for _ in range(env_steps // n):
            actions = policy(obs, step)
            next_obs, reward, terminated, truncated, info = env.step(actions)
            chunk.add_step(obs, actions, reward, next_obs, terminated, truncated, info)
            step += n
            for episodic_return, length in stats.step(reward, terminated | truncated):
                on_episode(step, episodic_return, length)
            obs = next_obs
        self.env_steps, self.obs = step, obs
        return chunk.take()

    @property
    def recent_return(self) -> float:
        """Mean return of the recent finished episodes (NaN before the first one)."""
        return self.stats.recent_mean

    def close(self) -> None:
        """Close the env."""
        self.env.close()


def evaluate(
    policy: Policy,
    env_id: str,
    episodes: int,
    seed: int,
    on_reset: Callable[[], None] | None = None,
) -> np.ndarray:
    """``[episodes]`` float64 undiscounted returns of ``policy``, episode i seeded ``seed + i``.

    The episodes run side by side (up to `EVAL_GROUP`), one policy call per step for those still
    running (20 CartPole episodes: 500 calls, not 10,000). With ``on_reset`` (a recurrent
    policy) they run one after the other, ``on_reset`` called as each starts.
    """
    if on_reset is None:
        seeds = [seed + ep for ep in range(episodes)]
        groups = [seeds[i : i + EVAL_GROUP] for i in range(0, episodes, EVAL_GROUP)]
        return np.concatenate([_play(policy, env_id, g) for g in groups] or [np.zeros(0)])
    returns = []
    for ep in range(episodes):
        on_reset()
        returns.append(_play(policy, env_id, [seed + ep]))
    return np.concatenate(returns) if returns else np.zeros(0, np.float64)


def _play(policy: Policy, env_id: str, seeds: list[int]) -> np.ndarray:
    """One episode per seed, in lock-step: the returns (``[len(seeds)]`` float64)."""
    envs = [gym.make(env_id) for _ in seeds]
    returns = np.zeros(len(seeds), np.float64)
    try:
        obs = [env.reset(seed=s)[0] for env, s in zip(envs, seeds, strict=True)]
        running = list(range(len(envs)))
        while running:
            actions = policy(_stack([obs[i] for i in running]))
            still = []
            for i, action in zip(running, actions, strict=True):
                obs[i], reward, terminated, truncated, _ = envs[i].step(action)
                returns[i] += float(reward)
                if not (terminated or truncated):
                    still.append(i)
            running = still
    finally:
        for env in envs:
            env.close()
    return returns


def _stack(rows: list[Any]) -> Any:
    """Observations as one batch (``[B, ...]``; nests leaf by leaf)."""
    first = rows[0]
    if isinstance(first, Mapping):
        return {k: _stack([r[k] for r in rows]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack([r[i] for r in rows]) for i in range(len(first)))
    return np.stack([np.asarray(r) for r in rows])


R = TypeVar("R")

#: how long the acting thread steps aside once a job's training call starts: the call's Python
#: prelude runs in well under a millisecond before the graph releases the GIL
HANDOFF_S = 0.001

#: a job: called with ``entering``, which it calls right before its training call
Job = Callable[[Callable[[], None]], R]


class TrainingJobs(Generic[R]):
    """Jobs run in order, on one background thread (``background``, named ``name``) or inline in
    `run`; each job's tag (e.g. the env step it was given at) comes back with its result."""

    def __init__(self, background: bool, name: str = "training") -> None:
        self._pool = ThreadPoolExecutor(1, name) if background else None
        self._pending: deque[tuple[Future[R], int]] = deque()

    @property
    def lag(self) -> int:
        """Jobs left unfinished while the caller acts: 1 on a background thread, 0 inline."""
        return 0 if self._pool is None else 1

    @property
    def pending(self) -> int:
        """Jobs given and not yet taken back with `finish_oldest`."""
        return len(self._pending)

    def run(self, job: Job[R], tag: int) -> None:
        """Give ``job``: it starts once the jobs before it are done. Returns once its training
        call is inside the graph, or it ended without one (inline: once it is done)."""
        if self._pool is None:
            done: Future[R] = Future()
            done.set_result(job(lambda: None))
            self._pending.append((done, tag))
            return
        entering = threading.Event()
        future = self._pool.submit(job, entering.set)
        self._pending.append((future, tag))
        while not entering.wait(0.1) and not future.done():
            pass  # the jobs before it still run
        time.sleep(HANDOFF_S)  # the job's thread holds the GIL through the call's prelude

    def finish_oldest(self) -> tuple[R, int]:
        """Wait for the oldest job; its result and tag (re-raises what the job raised)."""
        future, tag = self._pending.popleft()
        return future.result(), tag

    def close(self) -> None:
        """Wait for the jobs given, then stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
