"""`serve` -> `ReplayServer`: start, health, checkpoints and stop (RPCs in `servicer`, commits
in `ingest`, a served learner's training in `loop`).

Only one thread writes the table: for a served `Learner` its training loop, between train
calls (not even `stop` does); for a bare `ReplayTable` a background committer thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from replaygpu.errors import CheckpointSaveError, ConfigError
from replaygpu.fields import DTYPE_NAMES, row_nbytes
from replaygpu.learner.learner import Learner
from replaygpu.learner.weights import WeightStore
from replaygpu.service.config import AgentSettings, ServerConfig
from replaygpu.service.ops.allocator import freeze_long_lived_objects, keep_freed_memory
from replaygpu.service.ops.auth import TLSConfig, TokenInterceptor, warn_if_exposed
from replaygpu.service.server.binding import bind_failure
from replaygpu.service.server.durable import replay_journal, watch_storage
from replaygpu.service.server.eventloop import EventLoopThread
from replaygpu.service.server.ingest import Ingest
from replaygpu.service.server.journal import Journal
from replaygpu.service.server.journal_files import JournalError
from replaygpu.service.server.ledger import SequenceLedger
from replaygpu.service.server.run_stats import RunStats
from replaygpu.service.server.servicer import SERVICE_NAME, Servicer, handlers
from replaygpu.service.server.staging import BufferPool, StagingQueue
from replaygpu.specs import host_spec
from replaygpu.table import Table

logger = logging.getLogger(__name__)


class ReplayServer(contextlib.AbstractContextManager["ReplayServer"]):
    """A running replay service; made by `serve`.

    Attributes:
        address: ``host:port`` it listens on (the real port when 0 was asked for).
        ledger: checkpoint it with the table (``rg.Checkpointer(..., ledger=server.ledger)``).
        checkpoints: checkpoints taken through `save` so far.
        checkpoint_seconds: how long the last of them took (0.0 before the first).
    """

    def __init__(
        self,
        target: Learner | Table,
        address: str,
        token: str | None,
        tls: TLSConfig | None,
        config: ServerConfig,
        ledger: SequenceLedger | None,
    ) -> None:
        if isinstance(target, Learner):
            self.learner: Learner | None = target
            self.table = target.table
            weights = target.weight_store
        elif isinstance(target, Table):
            self.learner, self.table, weights = None, target, WeightStore()
        else:
            raise ConfigError(
                f"serve: got {type(target).__name__}, expected an rg.Learner, rg.ReplayTable "
                "or rg.ShardedReplayTable"
            )
        if self.table.served_at is not None:
            raise ConfigError(
                f"serve: table '{self.table.name}' is already being served at "
                f"{self.table.served_at}; stop that server first"
            )
        spec = host_spec(self.table.spec)
        bad = {k: f.dtype for k, f in spec.items() if f.dtype not in DTYPE_NAMES}
        if bad:
            raise ConfigError(
                f"serve: fields {bad} have dtypes the wire cannot carry; use one of "
                f"{list(DTYPE_NAMES)}"
            )
        self.config = config
        self.ledger = ledger if ledger is not None else SequenceLedger()
        self.ledger.sync()  # restore checkpoints before serving, never while serving
        weights.sync()
        if config.keep_freed_memory:
            keep_freed_memory(config.staging_max_bytes)
        if config.freeze_gc:
            logger.debug("gc: froze long-lived objects in %.2f s", freeze_long_lived_objects())
        self._stopped = False
        self.checkpoints = 0
        self.checkpoint_seconds = 0.0
        #: saves through `save` that failed (a full disk, a permission)
        self.checkpoint_failures = 0
        #: why appends are refused now (the journal's disk is full), or None (`watch_storage`)
        self.storage_problem: str | None = None
        self._watch: asyncio.Task[None] | None = None
        queue = StagingQueue(
            config.staging_max_batches, config.staging_max_bytes, config.staging_timeout_s
        )
        self.journal = Journal(config.journal_dir) if config.journal_dir else None
        self._ingest = Ingest(
            self.table,
            self.ledger,
            queue,
            BufferPool(config.staging_max_bytes // 2),
            background=self.learner is None,
            sampled=self._sampled,
            journal=self.journal,
        )
        self._servicer = Servicer(self._ingest, spec, self.learner, weights, config)
        if self.journal is not None:
            try:
                self.journal.resume_after(self.ledger.journal_segment)
                replay_journal(self.journal, self._servicer, self._ingest, self.table.name)
            except BaseException:
                self.journal.close()
                raise
        self.table.served_at = address
        self._loop = EventLoopThread("replaygpu-grpc")
        try:
            self._ingest.start()
            self._grpc, self.address = self._loop.run(self._start_grpc(address, token, tls))
        except BaseException:
            self._ingest.close(commit_remaining=False)
            self._release()
            raise
        self.table.served_at = self._servicer.address = self.address
        warn_if_exposed(address, tls, token)
        logger.info("serving table '%s' at %s", self.table.name, self.address)

    def _sampled(self) -> int:
        """As the learner's rate limiter counts them (for acks)."""
        learner = self.learner
        if learner is None:
            return 0
        if learner.rate_limiter is not None:
            return int(learner.rate_limiter.sampled.numpy())
        return int(learner.steps.numpy()) * learner.batch_size

    async def _start_grpc(
        self, address: str, token: str | None, tls: TLSConfig | None
    ) -> tuple[grpc.aio.Server, str]:
        interceptors = [TokenInterceptor(token)] if token is not None else []
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                # 2x so that our own check answers with the configured limit by name
                ("grpc.max_receive_message_length", 2 * self.config.max_message_bytes),
                # no window growth (4 MiB+ per connection): the 64 KiB window of `admission`
                ("grpc.http2.bdp_probe", 0),
                ("grpc.max_send_message_length", self.config.max_message_bytes),
                # actors' keepalive pings (every 20 s) are welcome, even on idle streams
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                # default SO_REUSEPORT: a 2nd server on a bound port would split the actors
                ("grpc.so_reuseport", 0),
                # ping idle connections so that a vanished actor frees its max_actors slot
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.keepalive_timeout_ms", 20_000),
            ],
        )
        server.add_generic_rpc_handlers((handlers(self._servicer),))
        self._health = health.aio.HealthServicer()
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
            raise ConfigError(
                f"serve: cannot bind {address!r}: {bind_failure(address, err)}"
            ) from err
        await server.start()
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.journal is not None:
            watch = watch_storage(self.journal, self._health, self._storage_changed)
            self._watch = asyncio.get_running_loop().create_task(watch)
        return server, f"{address.rsplit(':', 1)[0]}:{port}"

    def _storage_changed(self, problem: str | None) -> None:
        self.storage_problem = problem

    @property
    def actor_settings(self) -> AgentSettings | None:
        """What ``Info`` tells actors to run (`serve`'s ``actor_settings``)."""
        return self._servicer.actor_settings

    @actor_settings.setter
    def actor_settings(self, settings: AgentSettings | None) -> None:
        self._servicer.actor_settings = settings

    @property
    def open_streams(self) -> int:
        """At most ``config.max_actors``."""
        return self._servicer.streams

    @property
    def run_stats(self) -> RunStats:
        """Actors' episodes, the learner's loss and evals, for Info and /metrics."""
        return self._servicer.run_stats

    @property
    def run_finished(self) -> bool:
        """`finish_run` was called, or the `finish_at` budget reached."""
        return self._ingest.run_finished

    def finish_run(self) -> None:
        """Every ack and Info carries ``run_finished`` from now on; an uncommitted batch is
        acked with ``transitions`` 0, ``committed_seq`` below its seq (the client drops it; no
        ack claims an unstored row, so durable acks keep their meaning). Idempotent."""
        self._ingest.run_finished = True

    def finish_at(self, rows: int) -> None:
        """`finish_run` once the table inserted ``rows`` in all (restored ones too); the batch
        that reaches it commits whole (overshooting by less than one batch)."""
        self._ingest.row_limit = rows
        if self.table.total_inserted >= rows:
            self.finish_run()

    @property
    def finishing_rows(self) -> int:
        """Rows of the batch that reached `finish_at`'s budget (0: none yet)."""
        return self._ingest.finishing_rows

    # -- committing and checkpoints -------------------------------------------------------------

    def commit_pending(self) -> int:
        """On the calling thread (`loop.step`, between train calls); returns rows inserted."""
        return self._ingest.commit_pending()

    def wait_for_data(self, timeout: float) -> bool:
        """Block up to ``timeout`` s for a staged batch; returns whether one is."""
        return self._ingest.wait_for_data(timeout)

    def training_turn(self) -> contextlib.AbstractContextManager[None]:
        """One commit + train call: no other thread commits; a pending `save` goes first."""
        return self._ingest.training_turn()

    def save(self, checkpointer: Any) -> str:
        """Save while no commit runs (table and ledger agree), seal while commits go on; one
        at a time. Durable mode notes the journal mark in the ledger (`Journal.checkpointed`).

        Raises:
            CheckpointSaveError: counted in ``checkpoint_failures``; the journal is untouched,
                so log it and try again later: nothing is lost.
        """
        try:
            with self._ingest.exclusive():
                started = time.monotonic()
                mark = 0
                if self.journal is not None:
                    try:
                        mark = self.journal.rotate()
                    except JournalError as err:  # e.g. a full disk: the current segment, kept
                        mark = self.journal.segment
                        logger.info("checkpoint: the journal was not rotated (%s)", err)
                self.ledger.mark_journal(mark)
                path = checkpointer.save(seal=False)
            checkpointer.seal(path)  # commits and training go on while it syncs and hashes
        except CheckpointSaveError:
            self.checkpoint_failures += 1
            raise
        if self.journal is not None:  # the checkpoint is on disk: what it covers may go
            try:
                self.journal.checkpointed(mark)
            except JournalError as err:
                logger.warning("checkpoint %s saved, but %s", path, err)
        self.checkpoint_seconds = time.monotonic() - started
        self.checkpoints += 1
        return path

    # -- metrics --------------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """The counters and gauges of `replaygpu.service.ops.metrics.METRICS`, read now."""
        servicer, queue = self._servicer, self._ingest.queue
        ingested = servicer.ingested
        return {
            "ingested_transitions": ingested,
            "ingested_bytes": ingested * row_nbytes(servicer.spec),
            "staged_batches": len(queue),
            "staged_bytes": queue.nbytes,
            "table_size": self.table.size,
            "table_capacity": self.table.capacity,
            "table_inserted": self.table.total_inserted,
            "sampled": self._sampled(),
            "weights_version": servicer.weights.version,
            "open_streams": servicer.streams,
            "refused_streams": servicer.refused_streams,
            "actors": self.ledger.actors(),
            "checkpoints": self.checkpoints,
            "checkpoint_seconds": self.checkpoint_seconds,
            "checkpoint_failures": self.checkpoint_failures,
            "storage_full": float(self.storage_problem is not None),
            "inflight_bytes": servicer.budget.used,
            "inflight_peak_bytes": servicer.budget.peak,
            "inflight_waiting_streams": servicer.budget.waiting,
            **servicer.run_stats.values(),  # NaN where not known yet
        }

    def append_answers(self) -> dict[str, int]:
        """`Servicer.answered` (duplicates count as ``"OK"``)."""
        return dict(self._servicer.answered)

    # -- stopping -------------------------------------------------------------------------------

    def stop(self, grace: float | None = None, *, finish: bool = False) -> None:
        """NOT_SERVING, refuse new appends (UNAVAILABLE), settle what is staged, give in-flight
        RPCs ``grace`` s (default ``config.shutdown_grace_s``). Idempotent.

        A bare table commits what is staged (checkpoint after `stop`); a served learner answers
        it UNAVAILABLE: its loop took its final checkpoint already, so the client keeps the
        batch and resends it to the restarted learner.

        Args:
            finish: stopping for good: `finish_run`, and every open stream gets the notice
                (`Servicer.tell_streams`), so its actor exits instead of waiting; the port
                closes once they closed (or ``grace`` passed). Without it the streams end
                with UNAVAILABLE and the clients retry.
        """
        if self._stopped:
            return
        self._stopped = True
        grace = self.config.shutdown_grace_s if grace is None else grace
        if self._watch is not None:
            self._loop.loop.call_soon_threadsafe(self._watch.cancel)
        self._loop.run(self._health.enter_graceful_shutdown())
        self._servicer.finishing = finish
        self._servicer.closing = True
        try:
            self._ingest.close(commit_remaining=self.learner is None)
            if finish:
                self.finish_run()
        finally:
            try:
                if self._ingest.run_finished:
                    self._loop.loop.call_soon_threadsafe(self._servicer.tell_streams)
                    self._wait_for_streams_to_close(grace)
                self._loop.loop.call_soon_threadsafe(self._servicer.end_streams)
                self._loop.run(self._grpc.stop(grace))
            finally:
                self._release()
        logger.info("stopped serving at %s", self.address)

    def _release(self) -> None:
        """Close the event loop, the servicer's threads and the journal; the table is free."""
        self._loop.close()
        self._servicer.close()
        if self.journal is not None:
            self.journal.close()
        self.table.served_at = None

    def _wait_for_streams_to_close(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for notified clients to close their streams."""
        deadline = time.monotonic() + timeout
        while self._servicer.streams and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._servicer.streams:
            logger.info(
                "%d Append streams still open %.1f s after the notice that the run is "
                "finished; ending them",
                self._servicer.streams,
                timeout,
            )

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    target: Learner | Table,
    address: str = "127.0.0.1:0",
    token: str | None = None,
    tls: TLSConfig | None = None,
    *,
    config: ServerConfig | None = None,
    ledger: SequenceLedger | None = None,
    actor_settings: AgentSettings | None = None,
) -> ReplayServer:
    """Serve a learner's table (and its published weights) over gRPC; call ``stop()`` after.

    Args:
        target: an `rg.Learner` (its training loop, `loop.run` or `loop.step`, commits the
            appends; actors get ``learner.publish_weights``) or a bare `rg.ReplayTable` or
            `rg.ShardedReplayTable` (a background thread commits, split over the shards).
        address: port 0 picks a free one (``server.address``); a non-loopback address
            without TLS or token logs a warning.
        token: require ``authorization: Bearer <token>`` on every replay RPC.
        ledger: e.g. one just restored from a checkpoint.
        actor_settings: passed on unread by ``Info``, so an actor needs only the address.

    Raises:
        ConfigError: for a target of another type, a table served already, a field dtype the
            wire cannot carry, or an address that cannot be bound.
    """
    server = ReplayServer(target, address, token, tls, config or ServerConfig(), ledger)
    server.actor_settings = actor_settings
    return server
