"""The client's outbox: sealed ``AppendRequest``s awaiting their ack, and the thread streaming them.

Requests are kept serialized, in seq order, until acknowledged (at most ``max_buffer_bytes``).
One ``Append`` stream sends them and reads one ack each. After a retryable error (UNAVAILABLE,
DEADLINE_EXCEEDED, a full staging queue) it backs off exponentially and resends everything
unacknowledged in order on a new stream; the server drops seqs it already committed, so nothing
is duplicated or lost. A non-retryable error drops the batch it names (or everything) and is
raised once by the client. Once the server said its run is finished, an ended stream is not
retried: nothing more would be inserted, and the server may be gone for good.

All state is guarded by ``cond``, which the client also uses for its own partial buffer."""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import grpc

from replaygpu.service.actor.connection import Outage
from replaygpu.service.config import ClientConfig
from replaygpu.service.wire.status import (
    ServiceError,
    ServiceUnavailableError,
    TLSError,
    error_from_rpc,
)

logger = logging.getLogger(__name__)

#: ``open_stream(request_iterator) -> call`` (iterable of acks)
OpenStream = Callable[[Iterator[bytes]], Any]


class Unacked(NamedTuple):
    """What a client sent or sealed that the server has not acknowledged."""

    transitions: int
    requests: int
    nbytes: int


class Outbox:
    """Unacknowledged requests in seq order, and the thread that streams them to the server.
    ``classify``: the library error of a failed stream (`auth.connect_error`: a TLS mismatch is
    never retried); ``run_finished``: an ack said the learner has finished its run."""

    def __init__(
        self,
        open_stream: OpenStream,
        address: str,
        config: ClientConfig,
        classify: Callable[[grpc.RpcError], ServiceError],
        outage: Outage,
    ) -> None:
        self.cond = threading.Condition()
        self.run_finished = False
        self.acked_transitions = 0
        self.last_table_size = 0
        self.closing = False
        self._open_stream = open_stream
        self._classify = classify
        self._address = address
        self._config = config
        self._outage = outage
        self._unacked: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._unacked_bytes = 0
        self._transitions: dict[int, int] = {}  # seq -> transitions in it
        self._error: BaseException | None = None
        self._drop = False
        self._stream_id = 0
        self._call: Any = None
        self._thread = threading.Thread(
            target=self._stream_loop, name="replaygpu-client-stream", daemon=True
        )
        self._thread.start()

    # -- used by the client, holding ``cond`` -----------------------------------------------------

    def put(self, seq: int, data: bytes, transitions: int) -> None:
        """Queue request ``seq`` (after `wait_for_room`, unless its room was reserved)."""
        self._unacked[seq] = data
        self._unacked_bytes += len(data)
        self._transitions[seq] = transitions
        self.cond.notify_all()

    @property
    def unacked_transitions(self) -> int:
        return sum(self._transitions.values())

    @property
    def unacked(self) -> Unacked:
        return Unacked(self.unacked_transitions, len(self._unacked), self._unacked_bytes)

    def _pop(self, seq: int) -> bytes | None:
        data = self._unacked.pop(seq, None)
        if data is not None:
            self._unacked_bytes -= len(data)
            self._transitions.pop(seq, None)
        return data

    def _drop_all(self) -> str:
        """Forget every unacknowledged request; returns what, for the error."""
        seqs = list(self._unacked)
        what = (
            f"{self.unacked_transitions} transitions in {len(seqs)} requests (seqs {seqs[0]}.."
            f"{seqs[-1]}) were not acknowledged and are dropped"
            if seqs
            else "nothing was left unacknowledged"
        )
        self._unacked.clear()
        self._transitions.clear()
        self._unacked_bytes = 0
        return what

    def wait_for_room(self, nbytes: int) -> None:
        """Block until ``nbytes`` more fit (or nothing is queued, or nothing more is sent)."""
        while (
            self._unacked
            and self._unacked_bytes + nbytes > self._config.max_buffer_bytes
            and not self._drop
        ):
            self.raise_pending_error()
            self.cond.wait(0.5)

    def wait_until_acked(self, timeout: float | None) -> None:
        """Block until all is acknowledged or nothing more is sent (run finished, stream ended).

        Raises:
            TimeoutError: requests are still unacknowledged after ``timeout`` seconds.
            ServiceError: a batch failed for good.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._unacked and not self._drop:
            self.raise_pending_error()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"flush: {len(self._unacked)} requests ({self._unacked_bytes} bytes) "
                    f"still unacknowledged by {self._address} after {timeout} s"
                )
            self.cond.wait(0.5 if left is None else min(left, 0.5))
        self.raise_pending_error()

    def raise_pending_error(self) -> None:
        """Raise (once) the error that ended a batch for good, if any."""
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    # -- closing ----------------------------------------------------------------------------------

    def close(self, drop: bool) -> None:
        """Stop the stream thread after the last ack, or at once (``drop``, an error pending)."""
        with self.cond:
            self.closing = True
            self._drop = self._drop or drop or self._error is not None
            self.cond.notify_all()
        call = self._call
        if self._drop and call is not None:
            call.cancel()
        self._thread.join()

    # -- the stream thread ------------------------------------------------------------------------

    def _requests(self, stream_id: int) -> Iterator[bytes]:
        next_seq = 0
        while True:
            with self.cond:
                while True:
                    if stream_id != self._stream_id or self._drop or self.run_finished:
                        return  # (finished: nothing more is inserted; the server waits)
                    pending = [s for s in self._unacked if s >= next_seq]
                    if pending:
                        seq = pending[0]
                        data = self._unacked[seq]
                        break
                    if self.closing and not self._unacked:
                        return
                    self.cond.wait(0.2)
            next_seq = seq + 1
            yield data

    def _on_ack(self, ack: Any, opened: float) -> None:
        """Take one ack of the stream opened at ``opened`` (`time.monotonic`)."""
        if not ack.seq:  # a notice: the server stops for good
            self._outage.finish()  # first: the stream closes on ``run_finished``
            with self.cond:
                self.run_finished = True
                self.cond.notify_all()
            return
        if ack.run_finished:
            self._outage.finish()
        with self.cond:
            if self._pop(ack.seq) is not None:
                self.acked_transitions += ack.transitions
            self.last_table_size = ack.table_size
            self.run_finished = self.run_finished or ack.run_finished
            self.cond.notify_all()
        self._outage.recovered(opened, stream=True)

    def _stream_loop(self) -> None:
        config = self._config
        delay = config.retry_initial_s
        failing_since: float | None = None  # first failure since the last ack
        acked_once = False
        while True:
            with self.cond:
                while not self._unacked and not self.closing:
                    self.cond.wait(0.5)
                if self._drop or (self.closing and not self._unacked) or self._run_ended():
                    return
                self._stream_id += 1
                stream_id = self._stream_id
            try:
                opened = time.monotonic()
                self._call = self._open_stream(self._requests(stream_id))
                for ack in self._call:
                    self._on_ack(ack, opened)
                    delay, failing_since, acked_once = config.retry_initial_s, None, True
            except grpc.RpcError as err:
                if self._drop or self._run_ended():
                    return
                error = self._error_of(err)
                if isinstance(error, TLSError) and acked_once:
                    # this server answered before: a proxy whose backend is down, or a
                    # restart; keep the data and retry like any outage
                    logger.warning("append stream to %s: %s; retrying", self._address, error)
                    error.retryable = True
                if error.retryable:
                    now = time.monotonic()
                    failing_since = now if failing_since is None else failing_since
                    deadline = config.retry_deadline_s
                    if deadline is not None and now - failing_since > deadline:
                        self._fail(
                            f"no ack from {self._address} for {deadline} s "
                            f"(ClientConfig.retry_deadline_s; None retries forever); last "
                            f"error: {error}"
                        )
                        return
                    self._outage.failed(error, stream=True)
                    logger.debug(
                        "append stream to %s: %s; retrying in %.2f s",
                        self._address,
                        type(error).__name__,
                        delay,
                    )
                    with self.cond:  # a backoff that `close` can cut short
                        self.cond.wait_for(lambda: self._drop, delay * (0.5 + random.random()))
                    delay = min(2 * delay, config.retry_max_s)
                else:
                    self._reject(error)
            finally:
                with self.cond:
                    self._stream_id += 1  # ends this stream's request generator
                    self.cond.notify_all()

    def _run_ended(self) -> bool:
        """Whether the server said the run finished: nothing more is inserted and the server
        may be gone, so the stream stops and drops what is left."""
        with self.cond:
            if self.run_finished:
                self._drop = True
                self.cond.notify_all()
            return self.run_finished

    def _error_of(self, err: grpc.RpcError) -> ServiceError:
        """A failing classifier (a TLS probe whose files are gone) never kills the thread."""
        try:
            return self._classify(err)
        except Exception:
            logger.warning("classifying an append stream error failed", exc_info=True)
            return error_from_rpc(err, self._address)

    def _reject(self, error: ServiceError) -> None:
        with self.cond:
            if error.seq is not None and error.seq in self._unacked:
                n = self._transitions.get(error.seq, 0)
                self._pop(error.seq)
                error = _with_note(error, f"its {n} transitions were dropped")
            else:
                error = _with_note(error, self._drop_all())
            logger.warning("append to %s rejected: %s", self._address, error)
            self._error = self._error or error
            self.cond.notify_all()

    def _fail(self, message: str) -> None:
        with self.cond:
            what = self._drop_all()
            error = ServiceUnavailableError(f"{message}; {what}")
            logger.error("append stream: %s", error)
            self._error = self._error or error
            self._drop = True
            self.cond.notify_all()


def _with_note(error: ServiceError, note: str) -> ServiceError:
    out = type(error)(f"{error}; {note}", seq=error.seq)
    out.code = error.code
    return out
