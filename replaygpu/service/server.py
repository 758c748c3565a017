"""The replay service in the learner process: `serve(learner)` -> `ReplayServer`.

Each ``Append`` stream gets a reader thread that parses every request from the received bytes
(`replaygpu.service.wire`: tensor data stay views of those bytes), validates it against the
table spec (dtype and shape per field, before decoding), decodes with ``np.frombuffer`` (no
copy), makes one aligned copy (in a reused buffer) that TensorFlow wraps without copying
again, and stages the
whole batch on the bounded staging queue; the handler thread streams back one ack per
request once its batch is committed (see `replaygpu.service.ingest`). ``GetWeights`` serves
the learner's latest published weights; ``Info`` describes the table. Standard health checking
and reflection run beside it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
from collections.abc import Iterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

import replaygpu
from replaygpu.batch_check import check_columns
from replaygpu.errors import BatchError, ConfigError
from replaygpu.learner import service_loop
from replaygpu.learner.learner import Learner
from replaygpu.learner.weights import WeightSnapshot, WeightStore
from replaygpu.service import codec, wire
from replaygpu.service.allocator import keep_freed_memory
from replaygpu.service.auth import TLSConfig, TokenInterceptor, warn_if_exposed
from replaygpu.service.config import ServerConfig
from replaygpu.service.ingest import Ingest
from replaygpu.service.ledger import SequenceLedger
from replaygpu.service.servicer import SERVICE_NAME, Servicer, StreamEnd, handlers
from replaygpu.service.staging import BufferPool, StagedBatch, StagingQueue
from replaygpu.service.status import (
    InvalidBatchError,
    ResourceExhaustedError,
    ServiceError,
    ServiceUnavailableError,
    TableNotFoundError,
)
from replaygpu.storage import ReplayTable
from replaygpu.v1 import replay_pb2

logger = logging.getLogger(__name__)


class ReplayServer:
    """A running replay service; made by `serve`.

    Attributes:
        address: ``host:port`` it listens on (the real port when 0 was asked for).
        ledger: the sequence ledger; checkpoint it with the table
            (``rg.Checkpointer(..., ledger=server.ledger)``).
        config: its `ServerConfig`.
    """

    def __init__(
        self,
        target: Learner | ReplayTable,
        address: str,
        token: str | None,
        tls: TLSConfig | None,
        config: ServerConfig,
        ledger: SequenceLedger | None,
    ) -> None:
        if isinstance(target, Learner):
            self.learner: Learner | None = target
            self.table = target.table
            self._weights = service_loop.weight_store(target)
        elif isinstance(target, ReplayTable):
            self.learner, self.table, self._weights = None, target, WeightStore()
        else:
            raise TypeError(
                f"serve: got {type(target).__name__}, expected an rg.Learner or rg.ReplayTable"
            )
        self.config = config
        self.ledger = ledger if ledger is not None else SequenceLedger()
        self.ledger.sync()  # restore checkpoints before serving, never while serving
        self._weights.sync()
        self.spec = {
            k: (v.dtype.name, tuple(v.shape.as_list())) for k, v in self.table.spec.items()
        }
        bad = {k: d for k, (d, _) in self.spec.items() if d not in codec.DTYPE_NAMES}
        if bad:
            raise ConfigError(
                f"serve: fields {bad} have dtypes the wire codec cannot carry; use one of "
                f"{list(codec.DTYPE_NAMES)}"
            )
        if config.keep_freed_memory:
            keep_freed_memory(config.staging_max_bytes)
        self._closing = False
        self._stopped = False
        self._weights_cache: tuple[WeightSnapshot | None, Any] = (None, None)
        self._queue = StagingQueue(
            config.staging_max_batches, config.staging_max_bytes, config.staging_timeout_s
        )
        self._buffers = BufferPool(config.staging_max_bytes // 2)
        self._ingest = Ingest(
            self.table, self.ledger, self._queue, config.background_commit, self._buffers
        )
        if self.learner is not None:  # refuses a learner served twice, before any thread starts
            service_loop.attach(self.learner, self._ingest)
        try:
            self._ingest.start()
            self._grpc, self.address = self._start_grpc(address, token, tls)
        except BaseException:
            self._ingest.close(commit_remaining=False)
            if self.learner is not None:
                service_loop.detach(self.learner, self._ingest)
            raise
        warn_if_exposed(address, tls, token)
        logger.info("serving table '%s' at %s", self.table.name, self.address)

    def _start_grpc(
        self, address: str, token: str | None, tls: TLSConfig | None
    ) -> tuple[grpc.Server, str]:
        from concurrent import futures

        interceptors = [TokenInterceptor(token)] if token is not None else []
        server = grpc.server(
            futures.ThreadPoolExecutor(self.config.max_workers, "replaygpu-grpc"),
            interceptors=interceptors,
            options=[
                # 2x so that our own check answers with the configured limit by name
                ("grpc.max_receive_message_length", 2 * self.config.max_message_bytes),
                ("grpc.max_send_message_length", self.config.max_message_bytes),
            ],
        )
        server.add_generic_rpc_handlers((handlers(Servicer(self)),))
        self._health = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        try:
            if tls is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, tls.server_credentials())
        except RuntimeError as err:
            raise ConfigError(f"serve: cannot bind {address!r}: {err}") from err
        server.start()
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return server, f"{address.rsplit(':', 1)[0]}:{port}"

    # -- Append ---------------------------------------------------------------------------------

    def read_stream(self, requests: Iterator[Any], sink: queue.SimpleQueue[Any]) -> None:
        count = 0
        try:
            for data in requests:
                count += 1
                self._admit(data, sink)
        except (ServiceError, BatchError) as err:
            sink.put(err)
        except grpc.RpcError:
            pass  # the client went away; staged batches still commit
        except Exception as err:
            logger.exception("append reader failed")
            sink.put(err)
        sink.put(StreamEnd(count))

    def _admit(self, data: bytes, sink: queue.SimpleQueue[Any]) -> None:
        size = len(data)
        try:
            request = wire.parse_append_request(data)
        except wire.WireFormatError as err:
            raise InvalidBatchError(
                f"AppendRequest of {size} bytes is not a valid message ({err}); send requests "
                "made by ReplayClient or replaygpu.service.codec.encode_append_request"
            ) from None
        seq = request.seq
        if self._closing:
            raise ServiceUnavailableError(f"server at {self.address} is shutting down", seq=seq)
        if request.table != self.table.name:
            raise TableNotFoundError(
                f"server at {self.address} has no table named {request.table!r}. "
                f"Found: {self.table.name}",
                seq=seq,
            )
        if size > self.config.max_message_bytes:
            raise ResourceExhaustedError(
                f"AppendRequest seq {seq} is {size} bytes, over max_message_bytes="
                f"{self.config.max_message_bytes}; send smaller batches (ReplayClient splits "
                "them at ClientConfig.max_batch_bytes)",
                seq=seq,
            )
        if not request.actor_id or seq < 1:
            raise InvalidBatchError(
                f"AppendRequest: actor_id={request.actor_id!r}, seq={seq}; expected a non-empty "
                "actor_id and seq >= 1",
                seq=seq,
            )
        fields = dict(request.fields)
        try:
            if len(fields) != len(request.fields):
                raise BatchError("the batch names a field twice")
            n = check_columns(self.spec, fields)
            columns = {name: codec.decode_tensor(t, name) for name, t in fields.items()}
        except BatchError as err:
            raise InvalidBatchError(f"table '{self.table.name}', seq {seq}: {err}", seq) from err
        actor = request.actor_id

        def done(ack: dict[str, Any]) -> None:
            sink.put(replay_pb2.AppendAck(**ack))

        last = self.ledger.last(actor, sync=False)  # a hint; the committer decides for sure
        if seq <= last:  # a replay of a committed batch: ack, insert nothing
            done(
                {
                    "seq": seq,
                    "committed_seq": last,
                    "duplicate": True,
                    "table_size": self.table.size,
                    "transitions": 0,
                }
            )
            return
        columns = {name: self._buffers.copy(array) for name, array in columns.items()}
        nbytes = sum(c.nbytes for c in columns.values())
        self._queue.put(StagedBatch(actor, seq, columns, n, nbytes, done, sink.put))

    # -- GetWeights / Info ----------------------------------------------------------------------

    def weights_message(self, newer_than: int) -> Any:
        """The latest weights, or only the current version when the caller has them. A caller
        ahead of the current version got its version from an earlier run of the learner: it
        gets the latest weights, with a lower version (see `WeightStore.latest`)."""
        snapshot: WeightSnapshot | None = self._weights.latest(newer_than)
        if snapshot is None:
            return replay_pb2.Weights(version=self._weights.version)
        cached, message = self._weights_cache
        if cached is not snapshot:
            message = replay_pb2.Weights(version=snapshot.version, named=snapshot.names is not None)
            names = snapshot.names or tuple(str(i) for i in range(len(snapshot.arrays)))
            for name, array in zip(names, snapshot.arrays, strict=True):
                entry = message.tensors.add()
                entry.name = name
                codec.encode_tensor(array, entry.tensor)
            self._weights_cache = (snapshot, message)
        return message

    def info_message(self, actor_id: str = "") -> Any:
        """The ``InfoResponse`` describing this server's table and counters."""
        table = replay_pb2.TableInfo(
            name=self.table.name,
            capacity=self.table.capacity,
            size=self.table.size,
            inserted=self.table.total_inserted,
            device=self.table.device,
        )
        for name, (dtype, shape) in self.spec.items():
            table.spec.add(name=name, dtype=dtype, shape=shape)
        steps = 0
        if self.learner is not None:
            steps = int(self.learner.steps.numpy())
            table.sampled = steps * self.learner.batch_size
            limiter = self.learner.rate_limiter
            if limiter is not None:
                table.rate_limiter.kind = type(limiter).__name__
                for key in ("samples_per_insert", "min_size_to_sample", "error_buffer"):
                    if hasattr(limiter, key):
                        setattr(table.rate_limiter, key, getattr(limiter, key))
                sampled = getattr(limiter, "sampled", None)
                if sampled is not None:
                    table.rate_limiter.sampled = int(sampled.numpy())
        stats = self._ingest.stats()
        return replay_pb2.InfoResponse(
            tables=[table],
            weights_version=self._weights.version,
            learner_steps=steps,
            max_message_bytes=self.config.max_message_bytes,
            server_version=replaygpu.__version__,
            actor_last_seq=self.ledger.last(actor_id) if actor_id else 0,
            **stats,
        )

    # -- control --------------------------------------------------------------------------------

    def commit_pending(self) -> int:
        """Commit staged batches now (for loops that call ``learner.train`` themselves with
        ``ServerConfig(background_commit=False)``); returns transitions inserted."""
        return self._ingest.commit_pending()

    def save(self, checkpointer: Any) -> str:
        """``checkpointer.save()`` while no commit runs, so table and ledger agree."""
        with self._ingest.exclusive():
            return checkpointer.save()

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """A ``with`` block during which no staged batch is written to the table.

        With the background committer on (the default), hold it around your own
        ``learner.train`` calls so that sampling (n-step and frame-stack validity depend on
        the cursor and size) never sees a half-written table::

            while training:
                with server.exclusive():
                    learner.train(100)

        ``learner.run`` needs none: it commits on its own thread between train calls.
        """
        return self._ingest.exclusive()

    def stop(self, grace: float | None = None) -> None:
        """Shut down: NOT_SERVING, refuse new appends (UNAVAILABLE, clients retry), commit what
        is staged, finish in-flight RPCs within ``grace`` seconds, and stop. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.config.shutdown_grace_s if grace is None else grace
        self._health.enter_graceful_shutdown()
        self._closing = True
        if self._ingest.owned:  # learner.run commits: give it the grace period to drain
            self._queue.wait_empty(grace)
        self._ingest.close(commit_remaining=not self._ingest.owned)
        self._grpc.stop(grace).wait()
        if self.learner is not None:
            service_loop.detach(self.learner, self._ingest)
        logger.info("stopped serving at %s", self.address)

    def __enter__(self) -> ReplayServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    target: Learner | ReplayTable,
    address: str = "127.0.0.1:0",
    token: str | None = None,
    tls: TLSConfig | None = None,
    *,
    config: ServerConfig | None = None,
    ledger: SequenceLedger | None = None,
) -> ReplayServer:
    """Start serving a learner's table (and its published weights) over gRPC.

    Args:
        target: an `rg.Learner` (weights from ``learner.publish_weights``; ``learner.run()``
            commits appends between train calls) or a bare `rg.ReplayTable`.
        address: ``host:port`` to bind; port 0 picks a free one (see ``server.address``).
            The default is loopback; a non-loopback address without TLS or token logs a warning.
        token: require ``authorization: Bearer <token>`` on every replay RPC.
        tls: serve TLS with these certificate files.
        config: limits and threading (`ServerConfig`).
        ledger: the sequence ledger to use, e.g. one just restored from a checkpoint.

    Returns:
        the running `ReplayServer`; call ``stop()`` (or use it as a context manager).
    """
    return ReplayServer(target, address, token, tls, config or ServerConfig(), ledger)
