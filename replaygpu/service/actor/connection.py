"""The client's connection to a replay server: the channel, connecting with retries, the RPCs.

Each `ReplayClient` owns one; its `Connection.append` feeds the client's `Outbox`, and its
`Outage` logs when the server stops and starts answering. Imports no TensorFlow."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from replaygpu.fields import HostSpec
from replaygpu.learner.ratio import SampleToInsertRule
from replaygpu.service.config import AgentSettings, ClientConfig
from replaygpu.service.ops.auth import TLSConfig, connect_error, make_channel, token_metadata
from replaygpu.service.wire import codec
from replaygpu.service.wire.status import (
    ServiceError,
    ServiceUnavailableError,
    TableNotFoundError,
    TLSError,
    error_from_rpc,
)
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

logger = logging.getLogger(__name__)

APPEND_METHOD = "/replaygpu.v1.ReplayService/Append"

#: ``(what an error's message says, lower case; the reason shown)``, first match wins
_REASONS = (
    ("connection refused", "connection refused"),
    ("stopped; reconnect", "it stopped"),
    ("server stopped", "it stopped"),
    ("shutting down", "it is shutting down"),
    ("address lookup failed", "unknown host"),
    ("dns resolution failed", "unknown host"),
    ("deadline exceeded", "no answer in time"),
    ("socket closed", "connection closed"),
    ("connection reset", "connection reset"),
)


#: codes of a server that is down or restarting: its calls in flight are cancelled, then the
#: channel says UNAVAILABLE; DEADLINE_EXCEEDED is one that does not answer
OUTAGE_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED}
)


def reason(error: BaseException) -> str:
    """Why a call failed in a few words (``unknown host``); else gRPC's text up to its ``;``
    for an outage, the whole message otherwise (a full staging queue says why)."""
    text = str(error)
    found = next((shown for needle, shown in _REASONS if needle in text.lower()), None)
    if found is not None:
        return found
    code = getattr(error, "code", None)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "no answer in time"
    if code in OUTAGE_CODES:  # "UNAVAILABLE (server ADDRESS): what gRPC said; ..."
        said = text.split("): ", 1)[-1].split(";", 1)[0].strip()
        return f"{code.name}: {said}" if said and said != code.name else code.name
    return text


class Outage:
    """Whether the server answers, as the client's calls find it, logged once per change.

    Every retried call (the append stream, ``Info``, ``GetWeights``) reports `failed`, every
    success `recovered`: one line per start and end, not per retry. Only a call made after the
    outage began can end it: a server shutting down still acks on a stream opened before, and
    still answers the odd call in flight, after it refuses new connections. An outage the append
    stream began ends only with an ack: such a server still answers the odd ``GetWeights``.
    After `finish` a silent server stopped for good: nothing is logged.
    ``retry_deadline_s``: how long the client retries (None: forever), for the first line."""

    def __init__(self, address: str, retry_deadline_s: float | None) -> None:
        self.address = address
        self.retry_deadline_s = retry_deadline_s
        #: when the outage began (`time.monotonic`), or None while the server answers
        self.since: float | None = None
        self._by_stream = False  # the append stream began the outage
        self._finished = False
        self._lock = threading.Lock()

    def finish(self) -> None:
        """The server said the run is finished: from now on failures are not logged."""
        self._finished = True

    def failed(self, error: BaseException, stream: bool = False) -> None:
        """A call (``stream``: the append stream) failed and will be retried."""
        if self.since is not None or self._finished:
            return
        with self._lock:
            if self.since is not None:
                return
            self.since, self._by_stream = time.monotonic(), stream
        limit = self.retry_deadline_s
        logger.warning(
            "server %s unavailable (%s); retrying %s",
            self.address,
            reason(error),
            "until it answers" if limit is None else f"for up to {limit:g} s",
        )

    def recovered(self, started: float, stream: bool = False) -> None:
        """A call made at ``started`` (`time.monotonic`; ``stream``: an ack on a stream opened
        then) succeeded."""
        since = self.since
        if since is None or started < since or (self._by_stream and not stream):
            return
        with self._lock:
            if self.since is None or started < self.since:
                return
            since, self.since = self.since, None
        logger.warning(
            "server %s available again after %.1f s", self.address, time.monotonic() - since
        )


@dataclass(frozen=True)
class ConnectReply:
    """What a connecting client learns from the server's ``Info`` about its table; ``last_seq``:
    the last seq the server committed or staged for this actor (0: none); ``actor_settings``:
    as `ReplayClient.actor_settings`."""

    spec: HostSpec
    last_seq: int
    rate_limit: SampleToInsertRule | None
    actor_settings: AgentSettings | None


class Connection:
    """A gRPC channel to one replay server, and the calls a `ReplayClient` makes on it;
    ``outage``: the `Outage` its calls (and the client's append stream) report to;
    ``run_finished``: an ``Info`` reply said the learner has finished its run."""

    def __init__(
        self,
        address: str,
        actor_id: str,
        token: str | None,
        tls: TLSConfig | None,
        config: ClientConfig,
    ) -> None:
        self.address = address
        self.actor_id = actor_id
        self.config = config
        self.outage = Outage(address, config.retry_deadline_s)
        self.run_finished = False
        self._tls = tls
        self._metadata = token_metadata(token)
        self._channel = make_channel(address, tls, config.max_message_bytes)
        self._stub = replay_pb2_grpc.ReplayServiceStub(self._channel)
        self._append = self._channel.stream_stream(
            APPEND_METHOD,
            request_serializer=lambda b: b,  # requests are serialized once, resent as bytes
            response_deserializer=replay_pb2.AppendAck.FromString,
        )

    def append(self, requests: Iterator[bytes]) -> Any:
        """Open an Append stream of serialized requests; the call returned yields the acks."""
        return self._append(requests, metadata=self._metadata)

    def classify(self, err: grpc.RpcError) -> ServiceError:
        """The library error of a failed RPC (`replaygpu.service.ops.auth.connect_error`)."""
        return connect_error(err, self.address, self._tls)

    def connect(self, table: str) -> ConnectReply:
        """``Info`` for ``table``: waits with backoff, up to ``retry_deadline_s``, for a server
        that is down; the channel's reconnect backoff is capped at 1 s
        (`replaygpu.service.ops.auth.channel_options`), so the client is in within about 2 s of
        the server coming up. A TLS handshake that can never succeed raises `TLSError` at once.

        Raises:
            TableNotFoundError: the server has no such table (the message lists its tables).
            ServiceError: a permanent error (token, TLS), or UNAVAILABLE past the deadline.
        """
        started = time.monotonic()
        limit = self.config.retry_deadline_s
        deadline = started + limit if limit is not None else float("inf")
        delay = self.config.retry_initial_s
        while True:
            try:
                # no wait_for_ready: a failed connection attempt comes back at once with its
                # reason (wait_for_ready would hide it behind DEADLINE_EXCEEDED)
                info = self._stub.Info(
                    replay_pb2.InfoRequest(actor_id=self.actor_id),
                    metadata=self._metadata,
                    timeout=max(0.05, min(self.config.rpc_timeout_s, deadline - time.monotonic())),
                )
                break
            except grpc.RpcError as err:
                error = self.classify(err)
                if not error.retryable:
                    raise error from None
                if time.monotonic() + delay > deadline:
                    gave_up = ServiceUnavailableError(
                        f"{error}; no answer from the server for {time.monotonic() - started:.1f} "
                        f"s (ClientConfig.retry_deadline_s={limit}): start it, check the "
                        "address, or raise the deadline"
                    )
                    gave_up.code = error.code
                    raise gave_up from None
                logger.debug("connecting to %s: %s; retrying in %.2f s", self.address, error, delay)
                time.sleep(delay)
                delay = min(2 * delay, self.config.retry_max_s)
        tables = {t.name: t for t in info.tables}
        if table not in tables:
            raise TableNotFoundError(
                f"server at {self.address} has no table named {table!r}. "
                f"Found: {', '.join(sorted(tables))}"
            )
        found = tables[table]
        self._note_finished(info.run_finished)
        return ConnectReply(
            spec=codec.host_spec_from_proto(found.spec),
            last_seq=int(info.actor_last_seq),
            rate_limit=_rate_limit(found),
            actor_settings=_agent_settings(info),
        )

    def get_weights(self, newer_than: int) -> Any:
        """Raises `ServiceError` if the call failed."""
        request = replay_pb2.GetWeightsRequest(newer_than=newer_than)
        return self._call(self._stub.GetWeights, request)

    def info(self) -> Any:
        """Notes ``run_finished``. Raises `ServiceError` if the call failed."""
        reply = self._call(self._stub.Info, replay_pb2.InfoRequest(actor_id=self.actor_id))
        self._note_finished(reply.run_finished)
        return reply

    def _note_finished(self, run_finished: bool) -> None:
        if run_finished:
            self.run_finished = True
            self.outage.finish()

    def _call(self, method: Any, request: Any) -> Any:
        """``method(request)`` with the token and timeout, reporting to `outage`."""
        started = time.monotonic()
        try:
            reply = method(request, metadata=self._metadata, timeout=self.config.rpc_timeout_s)
        except grpc.RpcError as err:
            error = error_from_rpc(err, self.address)
            if error.code in OUTAGE_CODES and not isinstance(error, TLSError):
                self.outage.failed(error)
            raise error from None
        self.outage.recovered(started)
        return reply

    def close(self) -> None:
        """Also closes any stream still open on the channel."""
        self._channel.close()


def _agent_settings(info: Any) -> AgentSettings | None:
    """The ``actor_settings`` of an ``InfoResponse``, unread."""
    if not info.HasField("actor_settings"):
        return None
    message = info.actor_settings
    return AgentSettings(message.agent, int(message.version), message.json)


def _rate_limit(table: Any) -> SampleToInsertRule | None:
    limiter = table.rate_limiter
    if limiter.kind != "SampleToInsertRatio" or limiter.samples_per_insert <= 0:
        return None
    return SampleToInsertRule(
        limiter.samples_per_insert, int(limiter.min_size_to_sample), limiter.error_buffer
    )
