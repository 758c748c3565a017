"""`ClientConfig` (actor), `ServerConfig` (learner), `AgentSettings`: frozen, validated on
construction. Imports no TensorFlow."""

from __future__ import annotations

from dataclasses import dataclass

from replaygpu.errors import ConfigError

MiB = 2**20

#: longest actor_id accepted, in bytes (it is kept per actor in the ledger and every checkpoint)
MAX_ACTOR_ID_BYTES = 128


def actor_id_problem(actor_id: str) -> str | None:
    """What is wrong with ``actor_id``, or None: 1..128 printable ASCII bytes."""
    if not actor_id:
        return "it is empty"
    if len(actor_id) > MAX_ACTOR_ID_BYTES:
        return f"it is {len(actor_id)} characters long, over {MAX_ACTOR_ID_BYTES}"
    if not (actor_id.isascii() and actor_id.isprintable()):
        return "it has characters other than printable ASCII"
    return None


@dataclass(frozen=True)
class ClientConfig:
    """Buffering, limits and retries of a `ReplayClient`.

    Attributes:
        max_batch_transitions: seal a request at this many transitions...
        max_batch_bytes: ... or bytes (at most the server's max_message_bytes)...
        max_delay_s: ... or when the oldest buffered transition waited this long.
        max_buffer_bytes: bytes buffered or unacknowledged, at most; `add` blocks when full.
            More than a few requests in flight only grows memory (with 7 MB frame requests,
            256 MiB -> 64 MiB made ingest 1.1 -> 1.3 GB/s with 2 actors).
        max_message_bytes: largest message sent or received (weights included).
        retry_initial_s: first backoff after a retryable error; doubles up to ``retry_max_s``.
        retry_max_s: longest backoff (with the channel's reconnect backoff capped at 1 s, a
            client is back within about 2.5 s of its server, however long it was away).
        retry_deadline_s: give up after this long without an ack (None: never); the next call
            raises, with the count dropped. 10 minutes outlasts a learner restart.
        rpc_timeout_s: deadline of unary calls (Info, GetWeights).
        keep_freed_memory: reuse freed request buffers, no page faults per request (process-wide,
            up to ``max_buffer_bytes``; `replaygpu.service.ops.allocator.keep_freed_memory`).
    """

    max_batch_transitions: int = 8192
    max_batch_bytes: int = 16 * MiB
    max_delay_s: float = 0.1
    max_buffer_bytes: int = 64 * MiB
    max_message_bytes: int = 64 * MiB
    retry_initial_s: float = 0.05
    retry_max_s: float = 1.0
    retry_deadline_s: float | None = 600.0
    rpc_timeout_s: float = 30.0
    keep_freed_memory: bool = True

    def __post_init__(self) -> None:
        for name in ("max_batch_transitions", "max_batch_bytes", "max_buffer_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ClientConfig.{name}: got {getattr(self, name)}, expected >= 1")
        if self.max_batch_bytes > self.max_message_bytes:
            raise ConfigError(
                f"ClientConfig.max_batch_bytes={self.max_batch_bytes} is over "
                f"max_message_bytes={self.max_message_bytes}; lower it"
            )
        for name in ("max_delay_s", "retry_initial_s", "retry_max_s", "retry_deadline_s"):
            if name == "retry_deadline_s" and self.retry_deadline_s is None:
                continue
            if not getattr(self, name) > 0:
                raise ConfigError(f"ClientConfig.{name}: got {getattr(self, name)}, expected > 0")


@dataclass(frozen=True)
class ServerConfig:
    """Limits and threading of a `ReplayServer`.

    Attributes:
        max_message_bytes: largest AppendRequest accepted (RESOURCE_EXHAUSTED above it) and
            largest message sent (weights).
        staging_max_batches: staged batches waiting for the committer, at most.
        staging_max_bytes: staged bytes, at most (one batch is always admitted).
        staging_timeout_s: wait for room in a full staging queue before RESOURCE_EXHAUSTED.
        inflight_max_bytes: memory of Append requests read and not yet answered, over all
            streams, bounded as `replaygpu.service.server.admission` says; a larger request is
            still served, alone. The default holds 4 of the largest requests (16 of a default
            client's), enough to keep the admit threads and the committer busy.
        max_actors: concurrent Append streams at most; one more is refused RESOURCE_EXHAUSTED
            at once. Streams are event-loop coroutines: this bounds memory, not threads.
        journal_dir: durable acknowledgements (off when None; `learner.journal`): an ack means
            "on disk", a kill -9 loses and duplicates nothing acknowledged. Segments older than
            the previous `ReplayServer.save` are deleted: checkpoint regularly. A full disk
            refuses appends retryably (RESOURCE_EXHAUSTED) until space is freed.
        admit_threads: threads that parse and copy requests of 1 MiB and over off the event
            loop, so health checks and Info never wait behind them.
        shutdown_grace_s: on `stop`, how long in-flight RPCs get to finish.
        keep_freed_memory: reuse freed batch buffers: 3x faster commits of large batches
            (process-wide; `replaygpu.service.ops.allocator.keep_freed_memory`).
        freeze_gc: `gc.freeze` at start: full collections during ingest skip TensorFlow's objects
            and do not stall health checks (`ops.allocator.freeze_long_lived_objects`).
    """

    max_message_bytes: int = 64 * MiB
    staging_max_batches: int = 64
    staging_max_bytes: int = 512 * MiB
    staging_timeout_s: float = 30.0
    inflight_max_bytes: int = 512 * MiB
    max_actors: int = 1024
    journal_dir: str | None = None
    admit_threads: int = 2
    shutdown_grace_s: float = 5.0
    keep_freed_memory: bool = True
    freeze_gc: bool = True

    def __post_init__(self) -> None:
        sizes = ("max_message_bytes", "staging_max_batches", "staging_max_bytes")
        for name in (*sizes, "inflight_max_bytes", "max_actors", "admit_threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ServerConfig.{name}: got {getattr(self, name)}, expected >= 1")
        if self.staging_timeout_s <= 0 or self.shutdown_grace_s < 0:
            raise ConfigError(
                f"ServerConfig: staging_timeout_s={self.staging_timeout_s} must be > 0 and "
                f"shutdown_grace_s={self.shutdown_grace_s} >= 0"
            )


@dataclass(frozen=True)
class AgentSettings:
    """What a learner asks its actors to run, sent in ``Info``: the agent's document, unread here.

    Attributes:
        agent: the agent whose actors read the document.
        version: the document's format, >= 1, so that an actor can refuse one newer than it reads.
        json: the document, JSON text.
    """

    agent: str
    version: int
    json: str

    def __post_init__(self) -> None:
        if not self.agent:
            raise ConfigError("AgentSettings.agent: got an empty string, expected an agent name")
        if self.version < 1:
            raise ConfigError(f"AgentSettings.version: got {self.version}, expected >= 1")
