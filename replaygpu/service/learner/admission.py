"""Admitting one Append request: parse it and check it against the served table.

Steps 2 and 3 of the Append path (`servicer`): the received bytes are parsed without copying
the tensor data, the header (table, size, actor, seq) is checked, then every field's dtype and
shape against the table's host spec, before anything is copied or staged. Each check raises
the `ServiceError` the client gets, with the request's seq. Imports no TensorFlow.
"""

from __future__ import annotations

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
