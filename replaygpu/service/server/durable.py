"""Durable mode (``ServerConfig(journal_dir=...)``): replaying the journal over the restored
checkpoint (after `Journal.resume_after`), and health that follows the journal's disk."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from grpc_health.v1 import health, health_pb2

from replaygpu.errors import ReplayError
from replaygpu.service.server.ingest import Ingest
from replaygpu.service.server.journal import Journal
from replaygpu.service.server.servicer import SERVICE_NAME
from replaygpu.service.server.staging import StagedBatch
from replaygpu.service.wire.status import InvalidBatchError

if TYPE_CHECKING:
    from replaygpu.service.server.servicer import Servicer

logger = logging.getLogger(__name__)

#: seconds between the checks of a failed journal (`watch_storage`)
STORAGE_CHECK_S = 1.0

#: journalled bytes committed to the table at a time during replay
_REPLAY_GROUP_BYTES = 256 * 2**20


def replay_journal(journal: Journal, servicer: Servicer, ingest: Ingest, table: str) -> None:
    """Commit what the restored checkpoint lacks, skipping records the table refused (never acked).

    Raises:
        ReplayError: a record cannot be read or committed (the server does not start: it
            would delete the journal at its next checkpoint).
    """
    records = inserted = 0
    pending: list[StagedBatch] = []
    pending_bytes = 0
    failures: list[BaseException] = []

    def commit() -> int:
        n = ingest.replay(pending)
        pending.clear()
        if failures:
            raise ReplayError(
                f"journal {journal.directory}: replaying record {records} failed "
                f"({failures[0]}); the server does not start, so that the journal is kept. "
                "Start it with the spec and table it was written for"
            ) from failures[0]
        return n

    def failed(err: BaseException) -> None:
        if isinstance(err, InvalidBatchError):  # refused when it came in, never acked
            logger.warning("journal replay: skipped a batch the table refuses: %s", err)
        else:
            failures.append(err)

    for data in journal.replay():
        records += 1
        try:
            item = servicer.prepare(data, lambda _: None, replay=True)
        except Exception as err:
            raise ReplayError(
                f"journal {journal.directory}: record {records} does not fit table "
                f"'{table}' ({err}); the server does not start, so that the "
                "journal is kept. Start it with the spec and table it was written for"
            ) from err
        if item is None:  # in the checkpoint already
            continue
        item.fail = failed
        pending.append(item)
        pending_bytes += item.nbytes
        if pending_bytes > _REPLAY_GROUP_BYTES:
            inserted += commit()
            pending_bytes = 0
    inserted += commit()
    logger.info(
        "journal %s: %d records read, %d transitions not in the checkpoint replayed",
        journal.directory,
        records,
        inserted,
    )


async def watch_storage(
    journal: Journal,
    servicer: health.aio.HealthServicer,
    report: Callable[[str | None], None],
) -> None:
    """Every `STORAGE_CHECK_S` s, `Journal.check` and ``report`` what keeps appends out. While
    they are refused ``replaygpu.v1.ReplayService`` (readiness) answers NOT_SERVING; ``""``
    (liveness) stays SERVING: a restart would not free the disk. Recovery needs no append, so
    a server out of rotation comes back by itself. Runs until cancelled."""
    codes = health_pb2.HealthCheckResponse
    problem: str | None = None
    while True:
        await asyncio.sleep(STORAGE_CHECK_S)
        now = await asyncio.to_thread(journal.check)
        if (now is None) != (problem is None):
            status = codes.SERVING if now is None else codes.NOT_SERVING
            await servicer.set(SERVICE_NAME, status)
            logger.warning(
                "health: %s is %s: %s",
                SERVICE_NAME,
                codes.ServingStatus.Name(status),
                now or "the journal takes appends again",
            )
        problem = now
        report(problem)
