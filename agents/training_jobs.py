"""Training jobs run in order on one background thread while the acting loop goes on.

An acting loop (DQN's) hands each chunk of transitions to a job (append, training call, target
sync, weight read). On a background thread the jobs run one after the other with nothing in
between, and the training call releases the GIL inside its graph, so acting (Python, one core)
and training share the cores. Inline (no background thread) each job runs when it is given.

The one delicate part is the GIL. A thread waiting for it gets it only after a switch interval
(5 ms) of the holder's Python, and not at all while the holder keeps releasing and retaking it
(numpy calls do); ``Learner.train`` asks for it several times before its graph runs. So after
handing over a job the acting thread steps aside until the job's training call is inside the
graph. In `demo cartpole`, before it did, each of the 193 training calls waited 7-14 ms behind
the acting and ran as much longer: 2-3 s of the run.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

R = TypeVar("R")

#: how long the acting thread steps aside once a job's training call starts: the call's Python
#: prelude (a size check, a tensor, the function dispatch) runs in well under a millisecond
#: before the graph releases the GIL
HANDOFF_S = 0.001

#: a job: called with ``entering``, which it calls right before its training call
Job = Callable[[Callable[[], None]], R]


class TrainingJobs(Generic[R]):
    """Jobs run in the order given, on one background thread or inline; each job has a tag
    (e.g. the env step it was given at) that comes back with its result.

    Args:
        background: run the jobs on a background thread (else inline, in `run`).
        name: the thread's name.
    """

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
