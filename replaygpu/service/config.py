"""Configuration of the service: `ClientConfig` (actor side), `ServerConfig` (learner side) and
`AgentSettings` (what a learner asks its actors to run, carried by ``Info``, opaque here).

Frozen dataclasses validated on construction; this module imports no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

from replaygpu.errors import ConfigError

MiB = 2**20

#: longest actor_id accepted, in bytes (it is kept per actor in the ledger and every checkpoint)
MAX_ACTOR_ID_BYTES = 128


def actor_id_problem(actor_id: str) -> str | None:
    """What is wrong with ``actor_id`` (None when it is fine): 1..128 printable ASCII bytes."""
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
        max_batch_transitions: seal a request at this many transitions (N).
        max_batch_bytes: ... or at this many bytes (B); keep it under the server's
            max_message_bytes.
        max_delay_s: ... or when the oldest buffered transition waited this long (T).
        max_buffer_bytes: bytes buffered or sent-but-unacknowledged, at most; `add` and
            `add_batch` block while it is full. A few requests in flight keep the stream
            busy; more only grows the actor's memory (and, measured with 7 MB frame requests,
            made ingest slower: 256 MiB -> 64 MiB gave 1.1 -> 1.3 GB/s with 2 actors).
        max_message_bytes: largest message sent or received (weights included).
        retry_initial_s: first backoff after UNAVAILABLE / DEADLINE_EXCEEDED / a full staging
            queue on the server; doubles up to ``retry_max_s``.
        retry_max_s: longest backoff (with the channel's own reconnect backoff capped at 1 s,
            a client is back within about 2.5 s of its server, however long it was away).
        retry_deadline_s: give up after this long without an ack (None: never). Then the next
            call raises, saying how many transitions were not acknowledged. The default (10
            minutes) outlasts a learner restart from its checkpoint.
        rpc_timeout_s: deadline of unary calls (Info, GetWeights).
        keep_freed_memory: tune glibc so freed request buffers are reused rather than
            unmapped (no page faults per request; process-wide, keeps up to
            ``max_buffer_bytes`` of freed heap; see
            `replaygpu.service.ops.allocator.keep_freed_memory`).
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
        staging_timeout_s: how long an append waits for room in a full staging queue before
            RESOURCE_EXHAUSTED.
        inflight_max_bytes: memory of the Append requests read and not yet committed or
            refused, over all streams, at most (staged ones included; a request takes twice its
            size: received, then copied): a stream waits for room before it reads its next
            message, so HTTP/2 flow control holds its sender back, and the server's request
            memory stays bounded whatever the number of streams (see
            `replaygpu.service.learner.admission` for the exact bound). A request larger than
            this is still served, alone. The default holds 4 requests of the default largest
            size (16 of a default client's), which keeps the admit threads and the committer
            busy.
        max_actors: concurrent Append streams (one per connected actor) at most; one more is
            answered RESOURCE_EXHAUSTED at once, naming this limit. Streams are coroutines
            on the server's event loop, not threads, so this bounds memory, not threads.
        journal_dir: durable acknowledgements (off when None): every committed batch is
            appended to a journal in this folder and fsynced, once per commit round, before
            it is acknowledged, and the journal is replayed over the restored checkpoint when
            the server starts; so an ack means "on disk", and a kill -9 loses nothing that was
            acknowledged and duplicates nothing. Segments older than the previous checkpoint
            saved with `ReplayServer.save` are deleted (so that one plus the journal still
            restores everything should the newest be corrupt); checkpoint regularly. A full
            disk refuses appends retryably (RESOURCE_EXHAUSTED) until space is freed.
        admit_threads: threads that parse and copy large requests (1 MiB and over) off the
            event loop, so health checks and Info never wait behind them.
        shutdown_grace_s: on `stop`, how long in-flight RPCs get to finish.
        keep_freed_memory: tune glibc so freed batch buffers are reused rather than unmapped
            (3x faster commits of large batches; process-wide; see
            `replaygpu.service.ops.allocator.keep_freed_memory`).
        freeze_gc: at start, collect once and move every Python object alive to the garbage
            collector's permanent generation (`gc.freeze`), so full collections during ingest
            do not walk TensorFlow's long-lived objects and stall health checks (process-wide;
            see `replaygpu.service.ops.allocator.freeze_long_lived_objects`).
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
    """What a learner asks its actors to run, sent to them in ``Info`` (``actor_settings``): a
    document that the agent owns and the service passes on unread.

    Attributes:
        agent: the name of the agent whose actors read the document.
        version: the document's format version, >= 1, so that an actor can refuse one newer
            than it reads.
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
