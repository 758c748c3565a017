"""Admitting one Append request: the byte budget it is read under, then parse and check it.

Steps 1 to 3 of the Append path (`servicer`). While a stream waits for the one shared
`RequestBudget`, gRPC has no read pending on it, so HTTP/2 flow control stops its sender after
one 64 KiB window (the server turns off window growth). Each check raises the `ServiceError`
the client gets, with the request's seq. Imports no TensorFlow.

The bound. A request counts twice its size (gRPC's buffers then the bytes handed over; those
bytes then the staged aligned copy) from its read until answered. Its size is known only after
the read, and a pending read receives the whole message, so a read reserves an estimate, then
is settled: twice the stream's previous message, or ``min(2 * max_message_bytes, budget)``
first. With ``B`` the budget:

- bytes held <= ``B`` + the growth of messages being read (larger than their stream's
  previous one): steady sizes never exceed ``B``, whatever the number of streams;
- a request over ``B`` is still read when nothing else is held: no deadlock;
- the rest of the request memory is bounded apart: the staged copies' free pool
  (``staging_max_bytes / 2``), the commit's joined group (`ingest.GROUP_BYTES`), and freed
  buffers kept for reuse (``keep_freed_memory``, up to ``staging_max_bytes``).

The cost: a stream holding a reservation while its sender is idle keeps the bytes from the
others (served in arrival order), so the budget should hold many typical requests."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import numpy as np

from replaygpu.errors import BatchError
from replaygpu.fields import HostSpec, check_columns
from replaygpu.service.config import MAX_ACTOR_ID_BYTES, actor_id_problem
from replaygpu.service.wire import codec
from replaygpu.service.wire.append_request import (
    AppendView,
    WireFormatError,
    parse_append_request,
)
from replaygpu.service.wire.status import (
    InvalidBatchError,
    ResourceExhaustedError,
    TableNotFoundError,
)


def parse_request(data: bytes) -> AppendView:
    """Tensor data left as views of ``data``; `InvalidBatchError` if it is no valid message."""
    try:
        return parse_append_request(data)
    except WireFormatError as err:
        raise InvalidBatchError(
            f"AppendRequest of {len(data)} bytes is not a valid message ({err}); send requests "
            "made by ReplayClient or replaygpu.service.wire.append_request.encode_append_request"
        ) from None


def check_header(
    request: AppendView,
    size: int,
    table: str,
    max_message_bytes: int,
    address: str,
    replay: bool = False,
) -> None:
    """Check table, size, actor id and seq (``replay``: from the journal, size unchecked).

    Raises:
        TableNotFoundError: the request names another table than ``table``.
        ResourceExhaustedError: it is over ``max_message_bytes``.
        InvalidBatchError: its actor id or seq is out of range.
    """
    seq = request.seq
    if request.table != table:
        raise TableNotFoundError(
            f"server at {address} has no table named {request.table[:200]!r}. Found: {table}",
            seq=seq,
        )
    if size > max_message_bytes and not replay:  # a limit of the time
        raise ResourceExhaustedError(
            f"AppendRequest seq {seq} is {size} bytes, over max_message_bytes="
            f"{max_message_bytes}; send smaller batches (ReplayClient splits them at "
            "ClientConfig.max_batch_bytes)",
            seq=seq,
        )
    problem = actor_id_problem(request.actor_id)
    if problem is not None:
        raise InvalidBatchError(
            f"AppendRequest field 'actor_id' ({request.actor_id[:40]!r}...): {problem}; "
            f"expected 1 to {MAX_ACTOR_ID_BYTES} printable ASCII characters",
            seq=seq,
        )
    if seq < 1:
        raise InvalidBatchError(
            f"AppendRequest field 'seq': got {seq}, expected >= 1 (seqs count from 1)", seq=seq
        )


def decode_columns(
    request: AppendView, spec: HostSpec, table: str
) -> tuple[dict[str, np.ndarray], int]:
    """Checked columns as read-only views of the received bytes, and their number of rows;
    `InvalidBatchError` for a field repeated, missing, unexpected, or of a wrong dtype or shape."""
    fields: dict[str, Any] = {}
    try:
        for name, tensor in request.fields:
            if name in fields:
                raise BatchError(
                    f"field {name[:200]!r} appears twice in the batch; send each field once",
                    field=name,
                )
            fields[name] = tensor
        n = check_columns(spec, fields)
        columns = {name: codec.decode_tensor(t, name) for name, t in fields.items()}
    except BatchError as err:
        raise InvalidBatchError(f"table '{table}', seq {request.seq}: {err}", request.seq) from err
    return columns, n


class RequestBudget:
    """Bytes of Append requests read or being read and not answered, over every stream, up to
    ``ServerConfig.inflight_max_bytes``. Reserved in arrival order; on the event loop only.
    ``peak``: the most ``used`` ever was (a lone oversize message or a growth can pass
    ``max_bytes``)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.used = 0
        self.peak = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Streams waiting for room (none has a read pending)."""
        return len(self._waiters)

    async def reserve(self, nbytes: int) -> Hold:
        """Wait until ``nbytes`` fit (or nothing is held), after earlier waiters; release or
        resize the `Hold` exactly as the request goes."""
        if not self._waiters and self._fits(nbytes):
            self._take(nbytes)
            return Hold(self, nbytes)
        entry = (nbytes, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            await entry[1]
        except asyncio.CancelledError:  # the stream ended while it waited
            if entry[1].done() and not entry[1].cancelled():
                self._give(nbytes)  # granted just before: give it back
            else:
                self._waiters.remove(entry)
                self._grant()  # it may have been the head that did not fit
            raise
        return Hold(self, nbytes)

    def _fits(self, nbytes: int) -> bool:
        return self.used == 0 or self.used + nbytes <= self.max_bytes

    def _take(self, nbytes: int) -> None:
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def _give(self, nbytes: int) -> None:
        self.used -= nbytes
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            nbytes, future = self._waiters.popleft()
            if not future.done():  # else cancelled: its stream ended
                self._take(nbytes)
                future.set_result(None)


class Hold:
    """Bytes held in a `RequestBudget` for one request (on the event loop only)."""

    def __init__(self, budget: RequestBudget, nbytes: int) -> None:
        self._budget = budget
        self.nbytes = nbytes

    def resize(self, nbytes: int) -> None:
        """The read message's real size; growing never waits: the bytes are here already."""
        budget, delta = self._budget, nbytes - self.nbytes
        self.nbytes = nbytes
        if delta > 0:
            budget._take(delta)
        elif delta < 0:
            budget._give(-delta)

    def release(self) -> None:
        """Idempotent."""
        nbytes, self.nbytes = self.nbytes, 0
        if nbytes:
            self._budget._give(nbytes)
