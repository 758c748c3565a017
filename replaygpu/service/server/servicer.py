"""The ReplayService RPCs: Append's admission path, GetWeights and Info, on an event loop.

Every handler is a coroutine on the server's one asyncio loop (`eventloop.EventLoopThread`):
an open stream costs a coroutine, not a thread, and health checks and Info never wait for a
free worker. An ``Append`` stream, top to bottom:

1. **budget**: wait for room in `admission.RequestBudget` before reading the next request
   (received as bytes, no deserializer), counted until the batch is answered;
2. **parse** (`admission.parse_request`: tensor data stay views of the received bytes);
3. **validate** header and every field's dtype and shape before decoding anything;
4. a replay of a committed seq is acknowledged at once and dropped; otherwise
5. **stage**: each array copied once into an aligned pooled buffer, the batch put on the
   bounded queue (`staging`); steps 2-5 run on the loop for small requests, on an admit
   thread from 1 MiB, and a full queue is waited for without blocking the loop;
6. **ack**: the committer (`ingest`) posts the ack back to the stream's coroutine; an error
   ends the stream with its status code and the failing seq in the trailing metadata.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc

from replaygpu._version import __version__
from replaygpu.errors import BatchError
from replaygpu.fields import HostSpec
from replaygpu.learner.weights import WeightSnapshot, WeightStore
from replaygpu.service.config import AgentSettings, ServerConfig
from replaygpu.service.server.admission import (
    Hold,
    RequestBudget,
    check_header,
    decode_columns,
    parse_request,
)
from replaygpu.service.server.info import table_info, weights_message
from replaygpu.service.server.ingest import Ingest
from replaygpu.service.server.run_stats import RunStats
from replaygpu.service.server.staging import StagedBatch
from replaygpu.service.wire.status import (
    ResourceExhaustedError,
    ServiceError,
    ServiceUnavailableError,
    abort,
    code_of,
)
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

if TYPE_CHECKING:
    from replaygpu.learner.learner import Learner

logger = logging.getLogger(__name__)

SERVICE_NAME = replay_pb2.DESCRIPTOR.services_by_name["ReplayService"].full_name

#: requests this large are parsed and copied on an admit thread, smaller ones on the loop
OFF_LOOP_BYTES = 2**20

#: small requests admitted per loop turn: health checks, Info and acks are answered between
#: the turns of a burst from hundreds of streams, not after it
ADMIT_PER_TURN = 16

#: the codes Append answers with, counted from 0 in `Servicer.answered` (others when first seen)
ANSWER_CODES = ("OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNAVAILABLE")


class StreamEnd:
    """End of an Append stream: ``count`` requests were read."""

    def __init__(self, count: int) -> None:
        self.count = count


class Servicer(replay_pb2_grpc.ReplayServiceServicer):
    """The RPC methods over one table, its ingest and (when serving a learner) the learner.

    Attributes:
        address: where the server listens (for messages; set once bound).
        closing: the server is stopping: new appends get UNAVAILABLE.
        run_stats: Info's ``learner_stats``, with the episodes of each committed seq.
        refused_streams: Append streams refused for ``max_actors`` so far.
        ingested: transitions committed so far (not duplicates, not journal replays); the
            committing thread counts them.
        answered: Append answers by status code name: ``"OK"`` per acknowledged request, an
            error code per stream ended with it (counted on the event loop).
    """

    def __init__(
        self,
        ingest: Ingest,
        spec: HostSpec,
        learner: Learner | None,
        weights: WeightStore,
        config: ServerConfig,
    ) -> None:
        self.ingest = ingest
        self.table = ingest.table
        self.buffers = ingest.buffers  # staged arrays are copied into these; ingest frees them
        self.spec = spec
        self.learner = learner
        self.weights = weights
        self.config = config
        self.actor_settings: AgentSettings | None = None
        self.address = ""
        self.closing = False
        #: stopping for good (`ReplayServer.stop`'s ``finish``): late appends get the notice
        #: (`tell_streams`), not an ack ("stored"): they would be in no checkpoint
        self.finishing = False
        self.run_stats = RunStats()
        self.streams = 0
        self.refused_streams = 0
        self.ingested = 0
        self.answered = dict.fromkeys(ANSWER_CODES, 0)
        self._outboxes: set[asyncio.Queue[Any]] = set()  # of the open Append streams
        #: bytes of the requests read and not answered yet, over all streams (on the loop)
        self.budget = RequestBudget(config.inflight_max_bytes)
        #: actor -> highest seq staged, least recent first, for Info
        self._staged_seqs: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._admit_pool = ThreadPoolExecutor(config.admit_threads, "replaygpu-admit")
        self._info_pool = ThreadPoolExecutor(1, "replaygpu-info")
        self._waiting: collections.deque[tuple[bytes, Callable[[Any], None], asyncio.Future[Any]]]
        self._waiting = collections.deque()
        self._admitter: asyncio.Task[None] | None = None  # runs while any wait
        self._weights_cache: tuple[WeightSnapshot | None, Any] = (None, None)

    def tell_streams(self) -> None:
        """Send every open stream the run-finished notice (an ack of seq 0; on the loop, after
        the last commit): its client closes it. `ReplayServer.stop` waits for that, so that a
        closed port is then no outage to any client."""
        for outbox in self._outboxes:
            outbox.put_nowait(replay_pb2.AppendAck(seq=0, run_finished=True))

    def end_streams(self) -> None:
        """End every open stream with UNAVAILABLE after its posted acks (on the loop, after the
        last commit): idle streams skip the grace; their clients reconnect to the next server."""
        for outbox in self._outboxes:
            outbox.put_nowait(
                ServiceUnavailableError(f"server at {self.address} stopped; reconnect")
            )

    def close(self) -> None:
        """Stop the admit and Info threads, after the server stopped."""
        self._admit_pool.shutdown(wait=True, cancel_futures=True)
        self._info_pool.shutdown(wait=True, cancel_futures=True)

    # -- Append ---------------------------------------------------------------------------------

    async def Append(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        if self.streams >= self.config.max_actors:
            self.refused_streams += 1
            if self.refused_streams in (1, 10, 100) or self.refused_streams % 1000 == 0:
                logger.warning(
                    "refused an Append stream from %s: max_actors=%d streams are open "
                    "(%d refused so far)",
                    context.peer(),
                    self.config.max_actors,
                    self.refused_streams,
                )
            refused = ResourceExhaustedError(
                f"server at {self.address} has max_actors={self.config.max_actors} Append "
                "streams open already; run fewer actors or raise the server's `max_actors`"
            )
            self._answer(code_of(refused))
            await abort(context, refused)
        self.streams += 1
        loop = asyncio.get_running_loop()
        outbox: asyncio.Queue[Any] = asyncio.Queue()
        self._outboxes.add(outbox)

        def post(item: Any) -> None:  # from the committer thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped
                loop.call_soon_threadsafe(outbox.put_nowait, item)

        reader = asyncio.ensure_future(self._read_stream(context, outbox, post))
        try:
            acked, expected = 0, None
            # a finishing server answers late requests with notices, not acks
            while expected is None or (acked < expected and not self.finishing):
                item = await outbox.get()
                if isinstance(item, StreamEnd):
                    expected = item.count
                elif isinstance(item, BaseException):
                    self._answer(code_of(item))
                    await abort(context, item)
                else:
                    if item.seq:  # not a notice (`tell_streams`)
                        acked += 1
                        self._answer(grpc.StatusCode.OK)
                    yield item
        finally:
            reader.cancel()
            self._outboxes.discard(outbox)
            self.streams -= 1

    def _answer(self, code: grpc.StatusCode) -> None:
        self.answered[code.name] = self.answered.get(code.name, 0) + 1

    async def _read_stream(
        self,
        context: grpc.aio.ServicerContext,
        outbox: asyncio.Queue[Any],
        post: Callable[[Any], None],
    ) -> None:
        """Admit one stream's requests, each reserved in the budget before its read; errors
        and the end go to ``outbox``. ``context.read()``, as the request iterator keeps its
        last request until the next read: outside the budget (+45 MiB per stream measured
        with 64 MiB requests)."""
        count = 0
        budget = self.budget
        expect = min(2 * self.config.max_message_bytes, budget.max_bytes)
        try:
            while True:
                hold = await budget.reserve(expect)  # no read pending while this waits
                try:
                    data = await context.read()
                except BaseException:  # the client went away
                    hold.release()
                    raise
                if data is grpc.aio.EOF:
                    hold.release()
                    break
                expect = max(1, 2 * len(data))
                hold.resize(expect)
                count += 1
                await self._admit(data, hold, post)
                del data  # not kept while the next request is read
        except (ServiceError, BatchError) as err:
            outbox.put_nowait(err)
        except (asyncio.CancelledError, grpc.aio.AbortError, grpc.RpcError):
            return  # the stream ended (aborted, or the client went away)
        except Exception as err:  # a bug: one line, not a traceback per hostile request
            logger.error("append stream failed: %s: %s", type(err).__name__, err)
            logger.debug("append stream failure", exc_info=True)
            outbox.put_nowait(err)
        outbox.put_nowait(StreamEnd(count))

    async def _admit(self, data: bytes, hold: Hold, post: Callable[[Any], None]) -> None:
        """``hold`` is released when the request is answered, or here when it fails."""
        loop = asyncio.get_running_loop()

        def answer(item: Any) -> None:  # its ack or error, maybe from the committer thread
            with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped
                loop.call_soon_threadsafe(hold.release)
            post(item)

        try:
            if len(data) >= OFF_LOOP_BYTES:
                item = await loop.run_in_executor(self._admit_pool, self.prepare, data, answer)
            else:
                prepared = loop.create_future()
                self._waiting.append((data, answer, prepared))
                if self._admitter is None:
                    self._admitter = loop.create_task(self._admit_in_turns())
                item = await prepared
            if item is None:  # a replay, acknowledged already
                return
            queue = self.ingest.queue
            deadline = loop.time() + queue.put_timeout_s
            delay = 0.001
            while not queue.try_put(item):
                if loop.time() > deadline:
                    self.buffers.release(item.columns)
                    raise queue.full_error(item.seq)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 0.02)
        except BaseException:
            hold.release()
            raise
        self._note_staged(item.actor_id, item.seq)

    async def _admit_in_turns(self) -> None:
        """`ADMIT_PER_TURN` waiting small requests per turn, in order (one task, while any wait)."""
        try:
            while self._waiting:
                for _ in range(min(ADMIT_PER_TURN, len(self._waiting))):
                    data, post, prepared = self._waiting.popleft()
                    if prepared.done():  # its stream ended meanwhile
                        continue
                    try:
                        prepared.set_result(self.prepare(data, post))
                    except Exception as err:
                        prepared.set_exception(err)
                await asyncio.sleep(0)
        finally:
            self._admitter = None

    def _note_staged(self, actor: str, seq: int) -> None:
        """On the loop; bounded like the ledger."""
        staged = self._staged_seqs
        staged[actor] = max(seq, staged.pop(actor, 0))
        while len(staged) > self.ingest.ledger.max_actors:
            staged.popitem(last=False)

    def prepare(
        self, data: bytes, post: Callable[[Any], None], replay: bool = False
    ) -> StagedBatch | None:
        """Parse, validate and copy one request; a committed seq is acked and gives None.
        ``replay``: from the journal (accepted under the limits of its time)."""
        request = parse_request(data)
        seq = request.seq
        finished = self.ingest.run_finished  # acknowledged below, not inserted
        if self.closing and self.finishing and not finished:
            post(replay_pb2.AppendAck(seq=0, run_finished=True))  # a notice: it stops for good,
            return None  # and this batch is neither inserted nor acknowledged
        if self.closing and not finished:
            raise ServiceUnavailableError(f"server at {self.address} is shutting down", seq=seq)
        check_header(
            request, len(data), self.table.name, self.config.max_message_bytes, self.address, replay
        )
        columns, n = decode_columns(request, self.spec, self.table.name)
        actor, episodes = request.actor_id, request.episodes  # not ``request``: it holds ``data``

        def done(ack: dict[str, Any]) -> None:
            if ack["transitions"]:  # a commit: under the commit lock
                if not replay:
                    self.ingested += ack["transitions"]
                self.run_stats.add_episodes(episodes)  # replayed: not in the checkpoint's
            post(replay_pb2.AppendAck(**ack, run_finished=self.ingest.run_finished))

        last = self.ingest.ledger.last(actor, sync=False)  # a hint; the committer decides
        if seq <= last or finished:  # committed, or the run is over: ack, insert nothing
            counters = self.ingest.counters()
            done(
                dict(seq=seq, committed_seq=last, duplicate=seq <= last, transitions=0, **counters)
            )
            return None
        columns = {name: self.buffers.copy(array) for name, array in columns.items()}
        nbytes = sum(c.nbytes for c in columns.values())
        raw = None
        if self.ingest.journal is not None:  # durable mode keeps the request to journal it
            raw = bytes(data)
            nbytes += len(raw)
        return StagedBatch(actor, seq, columns, n, nbytes, done, post, raw)

    # -- GetWeights / Info ----------------------------------------------------------------------

    async def GetWeights(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Only the version when the caller holds it; see `WeightStore.latest`."""
        snapshot = self.weights.latest(request.newer_than)
        if snapshot is None:
            return replay_pb2.Weights(version=self.weights.version)
        cached, message = self._weights_cache
        if cached is not snapshot:  # a new version: encoded once, off the loop (megabytes)
            loop = asyncio.get_running_loop()
            message = await loop.run_in_executor(self._info_pool, weights_message, snapshot)
            self._weights_cache = (snapshot, message)
        return message

    async def Info(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """On the Info thread: the loop never waits on TensorFlow (a train call) or the ledger."""
        staged_seq = self._staged_seqs.get(request.actor_id, 0)  # the loop's own map
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._info_pool, self._info, request, staged_seq)

    def _info(self, request: Any, staged_seq: int) -> Any:
        ledger = self.ingest.ledger
        reply = replay_pb2.InfoResponse(
            tables=[table_info(self.table, self.spec, self.learner)],
            weights_version=self.weights.version,
            learner_steps=0 if self.learner is None else int(self.learner.steps.numpy()),
            max_message_bytes=self.config.max_message_bytes,
            server_version=__version__,
            # committed or staged: a restarted client must not reuse a seq still in flight
            actor_last_seq=max(ledger.last(request.actor_id), staged_seq)
            if request.actor_id
            else 0,
            staged_batches=len(self.ingest.queue),
            staged_bytes=self.ingest.queue.nbytes,
            actors=ledger.actors(),
            run_finished=self.ingest.run_finished,
        )
        if self.learner is not None:
            self.run_stats.to_proto(reply.learner_stats)
        if (settings := self.actor_settings) is not None:  # passed on unread
            reply.actor_settings.CopyFrom(replay_pb2.AgentSettings(**dataclasses.asdict(settings)))
        return reply


def handlers(servicer: Servicer) -> grpc.GenericRpcHandler:
    """The generated handlers, but Append's requests arrive as bytes (zero-copy parsing)."""
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Append": grpc.stream_stream_rpc_method_handler(
                servicer.Append, None, replay_pb2.AppendAck.SerializeToString
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
