"""The ReplayService RPCs: Append's admission path, GetWeights and Info.

An ``Append`` stream reads top to bottom here:

1. gRPC hands each request over as the received bytes (no deserializer: gRPC runs those in
   its one polling thread, shared by every stream); a reader thread per stream takes them;
2. **parse** (`wire.parse_append_request`: tensor data stay views of the received bytes);
3. **validate** the header (table, actor, seq, size) and every field's dtype and shape against
   the table's host spec before decoding anything;
4. a replay of an already committed seq is acknowledged at once and dropped; otherwise
5. **stage**: each array is copied once into an aligned pooled buffer and the whole batch put
   on the bounded staging queue (`staging`);
6. **ack**: the committer (`ingest`) writes the batch and hands the ack back to the stream's
   handler, which streams the acks out; an error ends the stream with its status code and
   the failing seq in the trailing metadata (`status.abort`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from replaygpu._version import __version__
from replaygpu.errors import BatchError
from replaygpu.fields import HostSpec, check_columns
from replaygpu.learner.weights import WeightSnapshot, WeightStore
from replaygpu.service import codec, wire
from replaygpu.service.config import ServerConfig
from replaygpu.service.ingest import Ingest
from replaygpu.service.staging import BufferPool, StagedBatch, StagingQueue
from replaygpu.service.status import (
    InvalidBatchError,
    ResourceExhaustedError,
    ServiceError,
    ServiceUnavailableError,
    TableNotFoundError,
    abort,
)
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

if TYPE_CHECKING:
    from replaygpu.learner.learner import Learner
    from replaygpu.storage import ReplayTable

logger = logging.getLogger(__name__)

SERVICE_NAME = replay_pb2.DESCRIPTOR.services_by_name["ReplayService"].full_name


class StreamEnd:
    """End of an Append stream's requests: ``count`` requests were read."""

    def __init__(self, count: int) -> None:
        self.count = count


class Servicer(replay_pb2_grpc.ReplayServiceServicer):
    """The RPC methods over one table, its ingest and (when serving a learner) the learner.

    Args:
        table: the served table.
        spec: its host spec (what each request is validated against).
        learner: the learner that owns the table, or None for a bare table.
        ingest: commits what this servicer stages.
        buffers: aligned buffers that staged arrays are copied into.
        weights: the published weights handed to ``GetWeights``.
        config: the server's limits.

    Attributes:
        address: where the server listens (for messages; set once bound).
        closing: set when the server begins to stop: new appends get UNAVAILABLE.
    """

    def __init__(
        self,
        table: ReplayTable,
        spec: HostSpec,
        learner: Learner | None,
        ingest: Ingest,
        buffers: BufferPool,
        weights: WeightStore,
        config: ServerConfig,
    ) -> None:
        self.table = table
        self.spec = spec
        self.learner = learner
        self.ingest = ingest
        self.buffers = buffers
        self.weights = weights
        self.config = config
        self.address = ""
        self.closing = False
        self._weights_cache: tuple[WeightSnapshot | None, Any] = (None, None)

    @property
    def _queue(self) -> StagingQueue:
        return self.ingest.queue

    # -- Append ---------------------------------------------------------------------------------

    def Append(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
        reader = threading.Thread(
            target=self._read_stream,
            args=(request_iterator, sink),
            name="replaygpu-append-reader",
            daemon=True,
        )
        reader.start()
        acked, expected = 0, None
        while expected is None or acked < expected:
            try:
                item = sink.get(timeout=0.5)
            except queue.Empty:
                if not context.is_active():
                    return
                continue
            if isinstance(item, StreamEnd):
                expected = item.count
            elif isinstance(item, BaseException):
                abort(context, item)
            else:
                acked += 1
                yield item

    def _read_stream(self, requests: Iterator[bytes], sink: queue.SimpleQueue[Any]) -> None:
        """The stream's reader thread: admit each request; errors and the end go to ``sink``."""
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
        """Parse, validate and stage one request (or ack a replay at once)."""
        size = len(data)
        try:
            request = wire.parse_append_request(data)
        except wire.WireFormatError as err:
            raise InvalidBatchError(
                f"AppendRequest of {size} bytes is not a valid message ({err}); send requests "
                "made by ReplayClient or replaygpu.service.wire.encode_append_request"
            ) from None
        seq = request.seq
        if self.closing:
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

        last = self.ingest.ledger.last(actor, sync=False)  # a hint; the committer decides
        if seq <= last:  # a replay of a committed batch: ack, insert nothing
            done(
                {
                    "seq": seq,
                    "committed_seq": last,
                    "duplicate": True,
                    "transitions": 0,
                    **self.ingest.counters(),
                }
            )
            return
        columns = {name: self.buffers.copy(array) for name, array in columns.items()}
        nbytes = sum(c.nbytes for c in columns.values())
        self._queue.put(StagedBatch(actor, seq, columns, n, nbytes, done, sink.put))

    # -- GetWeights / Info ----------------------------------------------------------------------

    def GetWeights(self, request: Any, context: grpc.ServicerContext) -> Any:
        """The latest weights, or only the current version when the caller holds them. A
        caller ahead of the current version got it from an earlier run of the learner: it gets
        the latest weights, with a lower version (see `WeightStore.latest`)."""
        snapshot = self.weights.latest(request.newer_than)
        if snapshot is None:
            return replay_pb2.Weights(version=self.weights.version)
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

    def Info(self, request: Any, context: grpc.ServicerContext) -> Any:
        """The table's spec and counters, the rate limiter, and the caller's last seq."""
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
        learner = self.learner
        if learner is not None:
            steps = int(learner.steps.numpy())
            table.sampled = steps * learner.batch_size
            limiter = learner.rate_limiter
            if limiter is not None:
                table.rate_limiter.kind = type(limiter).__name__
                table.rate_limiter.samples_per_insert = limiter.samples_per_insert
                table.rate_limiter.min_size_to_sample = limiter.min_size_to_sample
                table.rate_limiter.error_buffer = limiter.error_buffer
                table.rate_limiter.sampled = int(limiter.sampled.numpy())
        ledger = self.ingest.ledger
        return replay_pb2.InfoResponse(
            tables=[table],
            weights_version=self.weights.version,
            learner_steps=steps,
            max_message_bytes=self.config.max_message_bytes,
            server_version=__version__,
            actor_last_seq=ledger.last(request.actor_id) if request.actor_id else 0,
            staged_batches=len(self._queue),
            staged_bytes=self._queue.nbytes,
            actors=len(ledger.snapshot()),
        )


def _received_bytes(data: bytes) -> bytes:
    """Append's request deserializer: none. gRPC's single polling thread calls deserializers
    for every stream, so requests are parsed later, in each stream's reader thread."""
    return data


def handlers(servicer: Servicer) -> grpc.GenericRpcHandler:
    """The generated service's handlers, but Append's requests arrive as their bytes."""
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Append": grpc.stream_stream_rpc_method_handler(
                servicer.Append, _received_bytes, replay_pb2.AppendAck.SerializeToString
            ),
            "GetWeights": grpc.unary_unary_rpc_method_handler(
                servicer.GetWeights,
                replay_pb2.GetWeightsRequest.FromString,
                replay_pb2.Weights.SerializeToString,
            ),
            "Info": grpc.unary_unary_rpc_method_handler(
                servicer.Info,
                replay_pb2.InfoRequest.FromString,
                replay_pb2.InfoResponse.SerializeToString,
            ),
        },
    )
