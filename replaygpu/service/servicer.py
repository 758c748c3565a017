"""The ReplayService RPC surface: `Servicer` and its handlers, over a running `ReplayServer`.

``Append`` starts a reader thread per stream (`ReplayServer.read_stream` parses, validates and
stages each request) and streams back the acks it is handed, in order; an error aborts the
stream with its status code and the failing seq in the trailing metadata. Append's requests
reach the reader as raw bytes (no deserializer), so parsing happens off gRPC's polling thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from replaygpu.service.status import code_of, trailing_metadata_of
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

if TYPE_CHECKING:
    from replaygpu.service.server import ReplayServer

SERVICE_NAME = replay_pb2.DESCRIPTOR.services_by_name["ReplayService"].full_name


class StreamEnd:
    """End of an Append stream's requests: ``count`` requests were read."""

    def __init__(self, count: int) -> None:
        self.count = count


class Servicer(replay_pb2_grpc.ReplayServiceServicer):
    """The RPC methods, over a `ReplayServer` (which holds the table, queue and weights)."""

    def __init__(self, server: ReplayServer) -> None:
        self._s = server

    def Append(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
        reader = threading.Thread(
            target=self._s.read_stream,
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
                context.set_trailing_metadata(trailing_metadata_of(item))
                context.abort(code_of(item), str(item))
            else:
                acked += 1
                yield item

    def GetWeights(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._s.weights_message(request.newer_than)

    def Info(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._s.info_message(request.actor_id)


def _received_bytes(data: bytes) -> bytes:
    """Append's request deserializer: none. gRPC's single polling thread calls deserializers
    for every stream, so requests are parsed later, in each stream's reader thread."""
    return data


def handlers(servicer: Servicer) -> grpc.GenericRpcHandler:
    """The generated service's handlers, but Append's requests carry their wire size."""
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
