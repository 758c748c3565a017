"""`Learner.run` and `Learner.publish_weights`: the learner as a service's main loop.

``run`` alternates between committing the appends that the gRPC server staged (so every table
write happens on the learner thread, between train calls), a fused ``train(k)`` call, and
publishing weights for actors. The server attaches its ingest here (`attach`); without a
server, ``run`` just trains. This module knows the ingest only through the `Ingest` protocol,
so the learner layer does not import the service layer.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from replaygpu.errors import ConfigError
from replaygpu.learner.weights import WeightStore

if TYPE_CHECKING:
    from replaygpu.checkpoint import Checkpointer
    from replaygpu.learner.learner import Learner

logger = logging.getLogger(__name__)


class Ingest(Protocol):
    """What ``run`` needs from the server side: staged appends to commit."""

    def commit_pending(self) -> int:
        """Commit every staged batch to the table; returns transitions inserted."""

    def wait_for_data(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until a batch is staged."""

    def owned_by_caller(self) -> contextlib.AbstractContextManager[Any]:
        """While held, only the caller commits (a background committer pauses)."""

    def exclusive(self) -> contextlib.AbstractContextManager[Any]:
        """While held, no commit runs in any thread (checkpoints see table and ledger agree)."""


_INGESTS: weakref.WeakKeyDictionary[Any, Ingest] = weakref.WeakKeyDictionary()
_WEIGHTS: weakref.WeakKeyDictionary[Any, WeightStore] = weakref.WeakKeyDictionary()


def attach(owner: Any, ingest: Ingest) -> None:
    """Route ``owner``'s (a learner's) ``run`` loop to commit from ``ingest``."""
    if owner in _INGESTS:
        raise ConfigError("serve: this learner is already being served; stop that server first")
    _INGESTS[owner] = ingest


def detach(owner: Any, ingest: Ingest) -> None:
    """Undo `attach` (a no-op when another ingest took over)."""
    if _INGESTS.get(owner) is ingest:
        del _INGESTS[owner]


def weight_store(owner: Any) -> WeightStore:
    """The weight store of a learner (made on first use)."""
    store = _WEIGHTS.get(owner)
    if store is None:
        counter = getattr(owner, "weights_version", None)  # checkpointed with the learner
        store = _WEIGHTS.setdefault(owner, WeightStore(counter))
    return store


def publish_weights(learner: Learner, variables: Any) -> int:
    """Snapshot ``variables`` for actors; returns the new version (see `WeightStore.publish`)."""
    version = weight_store(learner).publish(variables)
    logger.debug("published weights version %d", version)
    return version


def _exclusive(ingest: Ingest | None) -> contextlib.AbstractContextManager[Any]:
    """Hold the commit lock (saves then never see a table write without its ledger entry)."""
    return ingest.exclusive() if ingest is not None else contextlib.nullcontext()


@contextlib.contextmanager
def _sigterm_sets(stop: threading.Event, enabled: bool) -> Any:
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(
    learner: Learner,
    steps_per_call: int = 100,
    *,
    weights: Any = None,
    publish_every: int = 1,
    max_steps: int | None = None,
    max_seconds: float | None = None,
    stop: threading.Event | None = None,
    checkpointer: Checkpointer | None = None,
    checkpoint_every_s: float | None = None,
    handle_sigterm: bool = False,
    idle_wait_s: float = 0.05,
) -> dict[str, float]:
    """Commit staged appends, train, publish weights; repeat until told to stop.

    Args:
        learner: the learner (its table receives the appends of the server serving it).
        steps_per_call: ``k`` of each ``train(k)`` call.
        weights: what to publish for actors (a dict/list of variables, a tf.Module or Keras
            model), or None to publish nothing.
        publish_every: publish after every this many train calls that ran steps.
        max_steps: stop after this many SGD steps (None: no limit).
        max_seconds: stop after this long (None: no limit).
        stop: stop when this event is set.
        checkpointer: saved every ``checkpoint_every_s`` and once at the end; give it the
            server's ledger (``rg.Checkpointer(..., ledger=server.ledger)``) for exactly-once
            appends across restarts.
        checkpoint_every_s: seconds between checkpoints (None: only at the end).
        handle_sigterm: on SIGTERM, stop cleanly (main thread only).
        idle_wait_s: how long to wait for data when there was nothing to train on.

    Returns:
        ``{"steps", "train_calls", "inserted", "seconds", "weights_version"}`` and the metric
        means of the last call that ran steps (none when no step ran).

    Raises:
        ConfigError: for out-of-range arguments.
    """
    if steps_per_call < 1 or publish_every < 1:
        raise ConfigError(
            f"run: steps_per_call={steps_per_call}, publish_every={publish_every}; both must "
            "be >= 1"
        )
    if max_steps is None and max_seconds is None and stop is None and not handle_sigterm:
        raise ConfigError(
            "run: nothing would ever stop it; pass max_steps, max_seconds, stop or "
            "handle_sigterm=True"
        )
    stop = stop or threading.Event()
    ingest = _INGESTS.get(learner)
    owned = ingest.owned_by_caller() if ingest is not None else contextlib.nullcontext()
    start = last_ckpt = time.monotonic()
    steps = calls = inserted = unpublished = 0
    last: dict[str, float] = {}
    with owned, _sigterm_sets(stop, handle_sigterm):
        while not stop.is_set():
            now = time.monotonic()
            if max_seconds is not None and now - start >= max_seconds:
                break
            if max_steps is not None and steps >= max_steps:
                break
            committed = ingest.commit_pending() if ingest is not None else 0
            inserted += committed
            ran = 0
            if learner.rate_limiter is not None or learner.table.size > 0:
                k = steps_per_call if max_steps is None else min(steps_per_call, max_steps - steps)
                metrics = learner.train(k)
                ran = int(metrics["steps"])
                if ran:  # a call that ran no step has NaN means: keep the last real ones
                    last = metrics
            if ran:
                steps += ran
                calls += 1
                unpublished += 1
                if weights is not None and unpublished >= publish_every:
                    publish_weights(learner, weights)
                    unpublished = 0
            elif not committed:
                if ingest is not None:
                    ingest.wait_for_data(idle_wait_s)
                else:
                    stop.wait(idle_wait_s)
            due = checkpoint_every_s is not None and now - last_ckpt >= checkpoint_every_s
            if checkpointer is not None and due:
                with _exclusive(ingest):  # a commit in flight elsewhere finishes first
                    checkpointer.save()
                last_ckpt = time.monotonic()
        if weights is not None and unpublished:
            publish_weights(learner, weights)
        with _exclusive(ingest):
            if ingest is not None:  # what was acknowledged is in the final checkpoint
                inserted += ingest.commit_pending()
            if checkpointer is not None:
                checkpointer.save()
    seconds = time.monotonic() - start
    logger.info("run: %d steps in %d calls, %d inserted, %.1f s", steps, calls, inserted, seconds)
    out = {k: v for k, v in last.items() if k != "steps"}
    out.update(
        steps=float(steps),
        train_calls=float(calls),
        inserted=float(inserted),
        seconds=seconds,
        weights_version=float(weight_store(learner).version),
    )
    return out
