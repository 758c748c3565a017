"""The one place where library errors and gRPC status codes meet, in both directions.

Server side, `code_of` picks the status code of an exception raised while serving an RPC and
`abort` ends the RPC with it (the handlers and the token check both go through it);
client side, `error_from_rpc` turns a failed RPC back into a library exception that says
what happened and how to fix it. Imports no TensorFlow.
"""

from __future__ import annotations

import grpc

from replaygpu.errors import BatchError, ConfigError, ReplayError


class ServiceError(ReplayError, RuntimeError):
    """An RPC to the replay service failed. ``code`` is the gRPC status code."""

    code = grpc.StatusCode.INTERNAL
    #: whether a client resends the batch later (with backoff) instead of dropping it
    retryable = False

    def __init__(self, message: str, seq: int | None = None) -> None:
        super().__init__(message)
        self.seq = seq


class TableNotFoundError(ServiceError, KeyError):
    """The request named a table the server does not have (the message lists its tables)."""

    code = grpc.StatusCode.NOT_FOUND

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class ResourceExhaustedError(ServiceError):
    """A configured bound was hit: message size or staging queue (the message names it)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class StagingFullError(ResourceExhaustedError):
    """The staging queue stayed full for ``staging_timeout_s``: the learner is behind. Unlike an
    oversize message this is transient; clients keep the batch and resend it with backoff."""

    retryable = True


class AuthenticationError(ServiceError):
    """The call carried no valid bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED


class ServiceUnavailableError(ServiceError):
    """The server cannot be reached or is shutting down; retrying later may succeed."""

    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


class InvalidBatchError(ServiceError, BatchError):
    """The server rejected a batch that does not match the table spec; nothing was written."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str, seq: int | None = None) -> None:
        ServiceError.__init__(self, message, seq)
        self.field = None


#: Codes after which a client reconnects with backoff and resends unacknowledged batches.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

#: Trailing metadata key naming the seq of the AppendRequest an error is about.
SEQ_METADATA_KEY = "replaygpu-seq"

#: Trailing metadata key, value "1", marking an error whose batch may be resent later (a full
#: staging queue answers RESOURCE_EXHAUSTED, as an oversize message does, but is transient).
RETRYABLE_METADATA_KEY = "replaygpu-retryable"

_BY_CODE: dict[grpc.StatusCode, type[ServiceError]] = {
    cls.code: cls
    for cls in (
        TableNotFoundError,
        ResourceExhaustedError,
        AuthenticationError,
        ServiceUnavailableError,
        InvalidBatchError,
    )
}
_BY_CODE[grpc.StatusCode.DEADLINE_EXCEEDED] = ServiceUnavailableError


def code_of(err: BaseException) -> grpc.StatusCode:
    """The status code to answer an RPC with when ``err`` was raised serving it."""
    if isinstance(err, ServiceError):
        return err.code
    if isinstance(err, (BatchError, ConfigError, ValueError, TypeError)):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL


def trailing_metadata_of(err: BaseException) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that carries ``err``'s seq and retryability to the client."""
    out = []
    seq = getattr(err, "seq", None)
    if seq is not None:
        out.append((SEQ_METADATA_KEY, str(seq)))
    if getattr(err, "retryable", False):
        out.append((RETRYABLE_METADATA_KEY, "1"))
    return tuple(out)


def abort(context: grpc.ServicerContext, err: BaseException) -> None:
    """End the RPC served with ``context`` with ``err``'s status code, message and metadata.

    Raises:
        the exception gRPC uses to end the handler (``context.abort`` never returns).
    """
    context.set_trailing_metadata(trailing_metadata_of(err))
    context.abort(code_of(err), str(err))


def error_from_rpc(err: grpc.RpcError, address: str = "") -> ServiceError:
    """The library exception for a failed RPC, keeping the server's message."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    seq, retryable = None, False
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == SEQ_METADATA_KEY:
            seq = int(value)
        elif key == RETRYABLE_METADATA_KEY:
            retryable = value == "1"
    cls = _BY_CODE.get(code, ServiceError)
    if cls is ResourceExhaustedError and retryable:
        cls = StagingFullError
    where = f" (server {address})" if address else ""
    out = cls(f"{code.name}{where}: {details}", seq=seq)
    out.code = code
    return out
