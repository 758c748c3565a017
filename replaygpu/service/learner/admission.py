"""Admitting one Append request: the byte budget it is read under, then parse and check it.

Steps 1 to 3 of the Append path (`servicer`):

1. **budget**: every stream reserves room in one `RequestBudget`, shared by all streams, before
   it reads its next message, and holds it until that batch is committed or refused. While a
   stream waits, gRPC has no read pending on it, so HTTP/2 flow control stops its sender
   after one stream window (64 KiB: the server turns off gRPC's window growth);
2. **parse**: the received bytes are parsed without copying the tensor data;
3. **check**: the header (table, size, actor, seq), then every field's dtype and shape against
   the table's host spec, before anything is copied or staged. Each check raises the
   `ServiceError` the client gets, with the request's seq. Imports no TensorFlow.

The bound. A request is counted at twice its size, from its read until its batch is answered
(committed, acknowledged as a duplicate, or refused): while it is received it is in gRPC's
buffers and then in the bytes handed over, and while it is admitted in those bytes and then in
the aligned copy that is staged. A message's size is known only once it is read, and gRPC
receives a whole message once a read is pending (it opens the stream's window to the
message's length). So a read reserves an estimate and is settled to the real size after it:
twice the stream's previous message size, or ``min(2 * max_message_bytes, budget)`` for its
first. Hence, with ``B`` the budget:

- bytes reserved or held <= ``B`` + the growth of the messages being read at that moment
  (a message larger than its stream's previous one); streams that send steady sizes (full
  client batches, the benchmark's 64 MiB requests) never exceed ``B``, whatever their number;
- a request that takes more than ``B`` is still read, when nothing else is held (one stream
  alone can always proceed: the budget never deadlocks);
- the rest of the server's request memory is outside this count and bounded apart, by the
  staging limits: the staged copies' free pool (``staging_max_bytes / 2``), the commit's joined
  group (`ingest.GROUP_BYTES`), and freed buffers that the allocator keeps for reuse
  (``keep_freed_memory``, up to ``staging_max_bytes``).

The one cost: a stream that holds a reservation while its sender is idle keeps those bytes
from the others (streams are served in arrival order), so the budget should hold a good many
typical requests; the default holds 4 requests of the largest size, 16 of a default
client's (16 MiB).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import numpy as np

from replaygpu.errors import BatchError
from replaygpu.fields import HostSpec, check_columns
from replaygpu.service.config import actor_id_problem
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
    """The AppendRequest in ``data``, its tensor data left as views of ``data``.

    Raises:
        InvalidBatchError: ``data`` is not a valid AppendRequest message.
    """
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
    """Check the request's table, size (``size`` bytes), actor id and seq.

    Args:
        replay: a request read back from the journal, accepted under the size limit of its
            time: the size is not checked.

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
            "expected 1 to 128 printable ASCII characters",
            seq=seq,
        )
    if seq < 1:
        raise InvalidBatchError(
            f"AppendRequest field 'seq': got {seq}, expected >= 1 (seqs count from 1)", seq=seq
        )


def decode_columns(
    request: AppendView, spec: HostSpec, table: str
) -> tuple[dict[str, np.ndarray], int]:
    """The request's columns, checked against ``spec`` and decoded without a copy (read-only
    views of the received bytes), and their number of rows.

    Raises:
        InvalidBatchError: a field is repeated, missing, unexpected, or of the wrong dtype or
            shape (the message names it and what was expected).
    """
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
    """Bytes of Append requests in flight, over every stream: read (or being read) and not yet
    answered. Streams reserve in arrival order (`reserve`); use it on the event loop only.

    Args:
        max_bytes: the budget (``ServerConfig.inflight_max_bytes``).

    Attributes:
        used: bytes reserved or held now.
        peak: the most ``used`` ever was (a message larger than the budget, read alone, or the
            growth described in the module docstring, can take it over ``max_bytes``).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.used = 0
        self.peak = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def waiting(self) -> int:
        """Streams waiting for room now (none of them has a read pending)."""
        return len(self._waiters)

    async def reserve(self, nbytes: int) -> Hold:
        """Wait until ``nbytes`` fit (or nothing is held), after the streams that waited before.

        Returns:
            the `Hold` of those bytes; release it (or resize it) exactly as the request goes.
        """
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
        """Wake the waiters at the head that fit now, in order."""
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
        """Hold ``nbytes`` instead (the read message's real size; growing never waits: the
        bytes are here already)."""
        budget, delta = self._budget, nbytes - self.nbytes
        self.nbytes = nbytes
        if delta > 0:
            budget._take(delta)
        elif delta < 0:
            budget._give(-delta)

    def release(self) -> None:
        """Give the bytes back (once; later calls do nothing)."""
        nbytes, self.nbytes = self.nbytes, 0
        if nbytes:
            self._budget._give(nbytes)
