"""The thread settings of every actor process: one BLAS / OpenMP thread each.

An actor's matrix products are small (a batch of ``num_envs`` observations through an MLP or
the Nature CNN), so a BLAS thread pool only adds contention: on a busy 2-core machine it made a
Nature CNN forward pass 140 ms instead of 10, and ``replaygpu actor`` ran Atari actors at 19-26
env steps/s where the demo's ran at 236-266 (issue 33). numpy's BLAS reads these variables
once, when it loads, so they must be in an actor process's environment when it starts: every
launcher starts its actor processes under `ACTOR_THREAD_ENV`.

- ``demo apex-cartpole`` / ``demo apex-breakout`` (`fleet.ActorFleet.start`) and ``replaygpu
  actor`` (`actor_cli`; also the container image's actor entry, which runs that command):
  spawned processes, started inside `actor_threads`;
- Ray (`ray_actors.start_ray_actors`): the Ray actors' ``runtime_env`` env vars.

Actors import no TensorFlow, so TensorFlow's intra- and inter-op pools need no setting.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

#: environment variables of every actor process
ACTOR_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def actor_threads() -> Iterator[None]:
    """This process's environment set to `ACTOR_THREAD_ENV` within the block, so that the
    processes started in it inherit it; restored after."""
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
