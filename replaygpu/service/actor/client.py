"""The actor side: `ReplayClient` buffers transitions and streams them to the learner.

Transitions collect in a columnar buffer, sealed into one ``AppendRequest`` at
``max_batch_transitions`` rows, ``max_batch_bytes`` or ``max_delay_s`` (a background flusher),
then kept until acknowledged and resent after a reconnect by the `outbox` (`add` blocks while
it is full). `Connection` holds the channel and the unary RPCs. Imports no TensorFlow: an
actor process starts fast and stays small."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from replaygpu.errors import BatchError, ConfigError
from replaygpu.fields import HostSpec, as_field_array, check_columns, row_nbytes
from replaygpu.learner.ratio import SampleToInsertRule
from replaygpu.rows import RowBuffer, flat_fields, is_nested
from replaygpu.service.actor.connection import Connection
from replaygpu.service.actor.outbox import Outbox, Unacked
from replaygpu.service.config import (
    MAX_ACTOR_ID_BYTES,
    AgentSettings,
    ClientConfig,
    actor_id_problem,
)
from replaygpu.service.ops.allocator import keep_freed_memory
from replaygpu.service.ops.auth import TLSConfig
from replaygpu.service.wire import codec
from replaygpu.service.wire.append_request import encode_append_request
from replaygpu.service.wire.status import TableNotFoundError


class ReplayClient(contextlib.AbstractContextManager["ReplayClient"]):
    """Streams transitions to a replay server and pulls the learner's weights.

    Args:
        address: ``host:port`` of the server (or a gRPC target URI).
        actor_id: exactly-once is tracked per actor_id: one per concurrent client. A client
            restarted under the same id continues after the server's last committed seq for it.
        tls: the CA (and for mTLS the client certificate).

    Raises:
        ConfigError: a bad ``address`` or actor_id.
        TableNotFoundError: the server has no such table (the message lists its tables).
        AuthenticationError: the server refused the token.
        ServiceUnavailableError: the server could not be reached within ``retry_deadline_s``.

    Example::

        with rg.ReplayClient("learner:50051", actor_id="actor-3") as client:
            client.add({"obs": o, "action": a, "reward": r, "next_obs": o2,
                        "terminated": term, "truncated": trunc})
            got = client.get_weights(newer_than=version)
            if got is not None:
                version, weights = got
            client.report_episode(episode_return, episode_length)
            if client.run_finished:
                break
    """

    def __init__(
        self,
        address: str,
        actor_id: str = "actor-0",
        table: str = "replay",
        token: str | None = None,
        tls: TLSConfig | None = None,
        config: ClientConfig | None = None,
    ) -> None:
        problem = actor_id_problem(actor_id)
        if problem is not None:
            raise ConfigError(
                f"actor_id {actor_id[:40]!r}: {problem}; expected 1 to {MAX_ACTOR_ID_BYTES} "
                "printable ASCII characters, unique per actor"
            )
        self.address = address
        self.actor_id = actor_id
        self.table = table
        self.config = config or ClientConfig()
        if self.config.keep_freed_memory:
            keep_freed_memory(self.config.max_buffer_bytes)
        self._connection = Connection(address, actor_id, token, tls, self.config)
        try:
            reply = self._connection.connect(table)
        except BaseException:
            self._connection.close()
            raise
        #: ``{field: FieldSpec}`` of the server's table
        self.spec: HostSpec = reply.spec
        #: the rule of the learner's rate limiter (None without one), see `wait_for_insert_room`
        self.rate_limit: SampleToInsertRule | None = reply.rate_limit
        #: the learner's `AgentSettings`, for the caller; None from ``replaygpu serve`` and the like
        self.actor_settings: AgentSettings | None = reply.actor_settings
        self._next_seq = reply.last_seq + 1
        row = row_nbytes(self.spec)
        self._rows = max(
            1, min(self.config.max_batch_transitions, self.config.max_batch_bytes // row)
        )
        self._partial: dict[str, np.ndarray] = {}
        self._partial_n = 0
        self._bool_fields = [k for k, f in self.spec.items() if f.dtype == "bool"]
        # a nested spec travels as leaf paths: nested transitions are flattened on the way in
        self._nested = is_nested(self.spec)
        self._rows_buffer: RowBuffer | None = None  # the request being filled, row by row
        self._partial_since = 0.0
        self._episodes: list[tuple[float, int]] = []  # reported, for the next request
        self._outbox = Outbox(
            self._connection.append,
            address,
            self.config,
            classify=self._connection.classify,
            outage=self._connection.outage,
        )
        self._cond = self._outbox.cond  # one lock for the partial buffer and the outbox
        self._filling = threading.Event()  # set while a request is being filled
        self._flusher = threading.Thread(
            target=self._flush_loop, name="replaygpu-client-flush", daemon=True
        )
        self._flusher.start()

    @property
    def acked_transitions(self) -> int:
        """Transitions the server acknowledged (committed to its table) so far."""
        return self._outbox.acked_transitions

    @property
    def unacked(self) -> Unacked:
        """Transitions, requests and bytes not acknowledged (after a timed-out `close`: dropped)."""
        with self._cond:
            return self._outbox.unacked

    @property
    def last_table_size(self) -> int:
        """The table's size in the latest ack."""
        return self._outbox.last_table_size

    @property
    def run_finished(self) -> bool:
        """The learner has finished its run, as an ack or ``Info`` reply said: stop collecting."""
        return self._outbox.run_finished or self._connection.run_finished

    def report_episode(self, episode_return: float, length: int) -> None:
        """Report a finished episode: its unclipped whole-game return and its length in env steps.

        It rides on the next request and its resends; the server counts it once and logs it.

        Raises:
            ConfigError: ``length`` is negative.
        """
        if length < 0:
            raise ConfigError(f"episode length: got {length}, expected >= 0 env steps")
        with self._cond:
            self._episodes.append((float(episode_return), int(length)))

    # -- adding ---------------------------------------------------------------------------------

    def add(self, transition: Mapping[str, Any]) -> None:
        """Buffer one transition ``{field: value of the field's shape}``; blocks while full.

        With a nested spec it may be nested like the spec (dicts, tuples, namedtuples) or flat
        by leaf path (``{"obs/image": ...}``). A value of another dtype is converted where every
        element fits the field's (`replaygpu.fields.as_field_array`, the rule of every write).
        `add` and `add_batch` calls fill the same request.

        Raises:
            BatchError: naming the field, expected and received dtype/shape (nothing is added).
            ServiceError: an earlier batch failed for good (raised once).
        """
        transition = flat_fields(self.spec, self._nested, "transition", transition)
        with self._cond:
            self._outbox.raise_pending_error()
            if self._partial_n == 0:
                self._new_partial()
            self._rows_buffer.write(self._partial_n, transition)  # a refused row: not counted
            self._partial_n += 1
            if self._partial_n >= self._rows:
                self._seal_partial()

    def add_batch(self, columns: Mapping[str, Any]) -> None:
        """Buffer columns ``{field: [n, ...] array}`` (nested or flat, as in `add`); blocks while
        full. Small batches share a request with other calls, large ones split at the
        `ClientConfig` bounds.

        Raises:
            BatchError: naming the field, expected and received dtype/shape (nothing is added).
        """
        columns = flat_fields(self.spec, self._nested, "batch", columns)
        cols = {
            k: as_field_array(v, self.spec[k][0], k, None) if k in self.spec else v
            for k, v in columns.items()
        }
        n = check_columns(self.spec, cols)
        for name in self._bool_fields:  # the server refuses other bytes (and the whole request)
            if cols[name].size and cols[name].view(np.uint8).max() > 1:
                raise BatchError(
                    f"field '{name}': bool data hold bytes other than 0 and 1 (an array viewed "
                    "as bool?); convert it with np.asarray(x, bool) or x != 0",
                    field=name,
                )
        with self._cond:
            self._outbox.raise_pending_error()
            start = 0
            if self._partial_n:  # top up the request being filled, keeping the call order
                start = self._fill_partial(cols, 0, n)
            while n - start >= self._rows:  # whole requests straight from the caller's arrays
                self._seal({k: v[start : start + self._rows] for k, v in cols.items()})
                start += self._rows
            if start < n:
                self._new_partial()
                self._fill_partial(cols, start, n)

    def _new_partial(self) -> None:
        """Start filling a new request buffer (room for it reserved in the outbox)."""
        self._outbox.wait_for_room(self._rows * row_nbytes(self.spec))
        self._rows_buffer = RowBuffer(self.spec, self._rows)
        self._partial = self._rows_buffer.columns
        self._partial_since = time.monotonic()
        self._filling.set()

    def _fill_partial(self, cols: Mapping[str, np.ndarray], start: int, n: int) -> int:
        """Copy rows ``start:`` into the request being filled; returns the first row not copied."""
        take = min(n - start, self._rows - self._partial_n)
        i = self._partial_n
        for name, column in self._partial.items():
            column[i : i + take] = cols[name][start : start + take]
        self._partial_n = i + take
        if self._partial_n >= self._rows:
            self._seal_partial()
        return start + take

    def _seal_partial(self) -> None:
        if self._partial_n:
            n = self._partial_n
            self._partial_n = 0
            self._seal({k: v[:n] for k, v in self._partial.items()}, reserved=True)
            self._partial = {}

    def _seal(self, columns: Mapping[str, np.ndarray], reserved: bool = False) -> None:
        seq = self._next_seq
        episodes, self._episodes = self._episodes, []
        data = encode_append_request(self.table, self.actor_id, seq, columns, episodes)
        if not reserved:
            self._outbox.wait_for_room(len(data))
        self._next_seq += 1
        self._outbox.put(seq, data, len(next(iter(columns.values()))))

    # -- flushing -------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send what is buffered and wait until the server acknowledged all of it.

        Raises:
            TimeoutError: not all acks came within ``timeout`` seconds.
            ServiceError: a batch failed for good (rejected, or no server for ``retry_deadline_s``).
        """
        with self._cond:
            self._seal_partial()
            self._outbox.wait_until_acked(timeout)

    def _flush_loop(self) -> None:
        """Seal after ``max_delay_s``; sleeps while nothing is filled (idle clients: no wakeups)."""
        delay = self.config.max_delay_s
        while True:
            self._filling.wait()
            with self._cond:
                if self._outbox.closing:
                    return
                if not self._partial_n:  # sealed meanwhile (full, or flushed)
                    self._filling.clear()  # under the lock: `_new_partial` sets it under it
                    continue
                left = self._partial_since + delay - time.monotonic()
                if left <= 0:
                    self._seal_partial()
                else:
                    self._cond.wait(left)

    # -- the server's rate limit ----------------------------------------------------------------

    def wait_for_insert_room(self, slack: float = 0.0, stop: threading.Event | None = None) -> bool:
        """Wait while the table is ahead of the learner's sampling (as Reverb blocks inserters).

        `SampleToInsertRatio` only holds back sampling; an actor that could outrun the learner
        calls this after each batch, so the learner trains on recent policies, not a backlog.
        The rule is `SampleToInsertRule.insert_room` on the server's counters from a fresh
        ``Info`` (the rows its table holds: this client's rows in flight are not counted),
        asked again while it says wait, backing off up to 50 ms. ``slack``: rows the table may
        run ahead beyond the limiter's ``error_buffer``.

        Measured on Ape-X CartPole (benchmarks/README.md, 20 seeds each): this rule learned in
        15-16 of 20 runs; the same rule on the latest ack's counters with the rows in flight
        counted as inserted (11-23 to 11-27) held actors back sooner and learned in 10 of 20.

        Returns:
            whether it waited (False without a rate limiter); stops at `run_finished`.

        Raises:
            ServiceError: an ``Info`` call failed.
        """
        rule = self.rate_limit
        if rule is None:
            return False
        stop = stop or threading.Event()  # never set: plain sleeps
        delay, waited = 0.002, False
        while not stop.is_set():
            info = self.info()
            if info.run_finished:
                break
            table = next((t for t in info.tables if t.name == self.table), None)
            if table is None:
                raise TableNotFoundError(
                    f"server at {self.address} no longer has table {self.table!r}"
                )
            if rule.insert_room(table.inserted, table.rate_limiter.sampled) + slack >= 0:
                break
            waited = True
            stop.wait(delay)
            delay = min(2 * delay, 0.05)
        return waited

    # -- weights and info -----------------------------------------------------------------------

    def get_weights(
        self, newer_than: int = 0
    ) -> tuple[int, dict[str, np.ndarray] | list[np.ndarray]] | None:
        """``(version, weights)`` as published (dict or list of read-only arrays), or None when
        nothing is published or its version is ``newer_than`` (the one held).

        A restarted learner publishes lower versions: they come back too; keep the lower one."""
        reply = self._connection.get_weights(newer_than)
        if not reply.tensors or reply.version == newer_than:
            return None
        arrays = codec.decode_named(reply.tensors)
        return reply.version, arrays if reply.named else list(arrays.values())

    def info(self) -> Any:
        """The server's ``InfoResponse`` (tables, counters, weights version, run finished)."""
        return self._connection.info()

    # -- closing --------------------------------------------------------------------------------

    def close(self, flush: bool = True, timeout: float | None = None) -> None:
        """Flush, stop the threads and close the channel. Idempotent; returns within about
        ``timeout`` s: if the flush fails, what is unacknowledged is dropped, not retried.

        Raises:
            ServiceError: whatever `flush` raises; the client is closed either way.
        """
        flushed = False
        try:
            if flush and not self._outbox.closing:
                self.flush(timeout)
            flushed = True
        finally:
            self._outbox.close(drop=not (flush and flushed))
            self._filling.set()  # wake the flusher to see the outbox closing
            self._flusher.join()
            self._connection.close()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(flush=exc_type is None)
