"""Actor processes: start them, read their reports, stop them.

Used by the served demos (`learner.train`) and ``replaygpu actor``: spawned processes (no
TensorFlow, nothing shared with the learner) running `actor.run_actor_process`, reporting through
one bounded queue that `ActorFleet.drain` reads without blocking the learner. An actor exits 0
when it collected its steps, is stopped, or the run is finished (`ReplayServer.finish_run`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from replaygpu.service.config import AgentSettings

from ..registry import name_of
from .actor import run_actor_process
from .actor_config import ActorConfig

if TYPE_CHECKING:  # the fleet's own imports stay TensorFlow-free (`replaygpu actor --ray`)
    from ..progress import Recorder

#: reports an actor queues before the rest are dropped (all but its final one)
_QUEUE_SIZE = 10_000
#: seconds stopped actors get to flush their last rows before they are terminated
_STOP_S = 30.0


def actor_configs(
    config: Any, settings: AgentSettings, steps: int, seed_offset: int = 0
) -> list[ActorConfig]:
    """A served run's actor configs: the learner's ``settings`` plus each one's index, id prefix
    and share of ``steps``, split as evenly as possible (a share of 0: that actor is not
    needed). With ``config.steps`` 0 every actor runs until stopped."""
    n = config.num_actors
    shares = [steps // n + (i < steps % n) if config.steps else 0 for i in range(n)]
    return [
        ActorConfig.from_settings(
            settings,
            actor_index=i,
            actor_id_prefix=name_of(config),
            steps=share,
            seed=config.seed + seed_offset,
        )
        for i, share in enumerate(shares)
        if share or not config.steps
    ]


class ActorFleet:
    """Actor processes collecting into the learner at ``address``, one per config.

    Args:
        recorder: gets each finished episode, at the fleet's env steps.
        base_steps: env steps collected before these actors (a resumed run's).
        name: process names are ``NAME-INDEX``.
        quiet: no progress lines of the actors' own (the recorder shows progress).

    Attributes:
        returns: the return of each finished episode, in the order reported.
        stats: each finished actor's result (`actor.run_actor`'s), by actor index.
    """

    def __init__(
        self,
        configs: Sequence[ActorConfig],
        address: str,
        recorder: Recorder | None = None,
        base_steps: int = 0,
        name: str = "actor",
        quiet: bool = True,
    ) -> None:
        ctx = mp.get_context("spawn")  # actors import no TensorFlow and share nothing with us
        self._stop, self._reports = ctx.Event(), ctx.Queue(maxsize=_QUEUE_SIZE)
        if quiet:
            configs = [dataclasses.replace(c, progress_interval_s=0.0) for c in configs]
        self.processes = [
            ctx.Process(
                target=run_actor_process,
                args=(config, address, self._stop, self._reports),
                name=f"{name}-{config.actor_index}",
                daemon=True,
            )
            for config in configs
        ]
        self.recorder, self.base_steps = recorder, base_steps
        self._steps = dict.fromkeys((c.actor_index for c in configs), 0)
        self.returns: list[float] = []
        self.stats: dict[int, dict[str, float]] = {}

    def start(self) -> None:
        """Start the actor processes under `actor_threads`."""
        with actor_threads():
            for proc in self.processes:
                proc.start()

    @property
    def env_steps(self) -> int:
        """Env steps as far as the reports tell, ``base_steps`` included."""
        return self.base_steps + sum(self._steps.values())

    @property
    def running(self) -> bool:
        """Whether any actor process is alive."""
        return any(proc.is_alive() for proc in self.processes)

    @property
    def finished(self) -> bool:
        """Whether every actor exited cleanly (what it sent may still be staged)."""
        return all(proc.exitcode == 0 for proc in self.processes)

    @property
    def recent_return(self) -> float:
        """Mean return of the last 20 finished episodes (NaN before the first)."""
        return float(np.mean(self.returns[-20:])) if self.returns else float("nan")

    @property
    def env_steps_per_s(self) -> float:
        """The finished actors' env steps per second, summed (NaN before any finished)."""
        rates = [s["env_steps_per_s"] for s in self.stats.values()]
        return float(np.sum(rates)) if rates else float("nan")

    @property
    def acked(self) -> int:
        """Rows the learner acknowledged to the finished actors."""
        return int(sum(s["acked_transitions"] for s in self.stats.values()))

    def raise_failed(self) -> None:
        """Raises RuntimeError naming the actor processes that failed."""
        failed = [p.name for p in self.processes if p.exitcode not in (0, None)]
        if failed:
            raise RuntimeError(f"actor processes {failed} failed; see their log above")

    def drain(self) -> None:
        """Move up to 1000 queued reports to the recorder and counts, never blocking (a flood of
        short episodes never keeps the learner from committing and training)."""
        for _ in range(1000):
            try:
                kind, index, payload = self._reports.get_nowait()
            except queue.Empty:
                return
            if kind == "done":
                self.stats[index] = dict(payload)
                self._steps[index] = max(self._steps[index], int(payload["env_steps"]))
                continue
            self._steps[index] = max(self._steps[index], payload[0])  # (env_steps, ...)
            if kind == "episode":
                _, episodic_return, length = payload
                self.returns.append(episodic_return)
                if self.recorder is not None:
                    self.recorder.episode(self.env_steps, episodic_return, length)

    def stop(
        self, commit: Callable[[], object] = lambda: None, timeout_s: float = _STOP_S
    ) -> list[str]:
        """Stop the actors: they flush while ``commit`` (an in-process learner's, every 50 ms)
        commits, so their acks come; those still running after ``timeout_s`` are killed. Then
        read the last reports. Returns the names of the processes killed."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        while self.running and time.monotonic() < deadline:
            commit()
            self.drain()
            time.sleep(0.05)
        killed = []
        for proc in (p for p in self.processes if p.pid is not None):
            if proc.is_alive():
                killed.append(proc.name)
                proc.kill()  # SIGTERM only asks it to stop; one blocked on a silent learner
            proc.join()
        self.drain()
        self._reports.close()
        return killed


#: environment variables of every actor process
ACTOR_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def actor_threads() -> Iterator[None]:
    """`ACTOR_THREAD_ENV` set within the block, for the processes started in it to inherit."""
    saved = {name: os.environ.get(name) for name in ACTOR_THREAD_ENV}
    os.environ.update(ACTOR_THREAD_ENV)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
