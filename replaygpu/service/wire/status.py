"""The one place where library errors and gRPC status codes meet, in both directions: server side
`code_of` and `abort` (the handlers and the token check); client side `error_from_rpc`, a library
exception that says what happened and how to fix it. Imports no TensorFlow."""

from __future__ import annotations

import grpc

from replaygpu.errors import BatchError, ConfigError, ReplayError, StorageFullError


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
    """The staging queue stayed full for ``staging_timeout_s``: the learner is behind.
    Transient: clients keep the batch and resend it. Clients get this class for every
    transient RESOURCE_EXHAUSTED, `DiskFullError` too (the message says which)."""

    retryable = True


class DiskFullError(ResourceExhaustedError):
    """The journal's file system is full (`learner.journal_files.JournalFullError`): the batch was
    not acknowledged. Transient: clients keep the batch and resend it."""

    retryable = True


class AuthenticationError(ServiceError):
    """The call carried no valid bearer token."""

    code = grpc.StatusCode.UNAUTHENTICATED


class ServiceUnavailableError(ServiceError):
    """The server cannot be reached or is shutting down; retrying later may succeed."""

    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


class TLSError(ServiceError):
    """A TLS handshake failed for good (untrusted or misnamed certificate, TLS on one side
    only, mTLS without an accepted client certificate); the message says which (`TLS_FAILURES`).
    gRPC says UNAVAILABLE, as for a server that is down; a client raises this at once instead of
    waiting ``retry_deadline_s`` for a server that will never accept it."""

    code = grpc.StatusCode.UNAVAILABLE
    retryable = False


class InvalidBatchError(ServiceError, BatchError):
    """The server rejected a batch that does not match the table spec; nothing was written."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str, seq: int | None = None) -> None:
        ServiceError.__init__(self, message, seq)
        self.field = None


#: trailing metadata: the seq of the AppendRequest an error is about
SEQ_METADATA_KEY = "replaygpu-seq"

#: trailing metadata, "1": the batch may be resent (a full staging queue's RESOURCE_EXHAUSTED)
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
# a server that stops cancels the calls in flight: their rows were not acknowledged, and a resend
# to the restarted server is deduplicated by its seq (`actor.connection.OUTAGE_CODES`)
_BY_CODE[grpc.StatusCode.CANCELLED] = ServiceUnavailableError

#: ``(what gRPC's details say, lower case; what is wrong and how to fix it)``, first match
#: wins. gRPC 1.85 says UNAVAILABLE, "... Tls handshake failed (TSI_PROTOCOL_FAILURE):
#: SSL_ERROR_SSL: ...: CERTIFICATE_VERIFY_FAILED: ...". Where it says only "Socket closed",
#: `replaygpu.service.ops.auth.connect_error` probes the server.
TLS_FAILURES: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("hostname verification check failed",),
        "the server's certificate does not carry the host name this client checks; pass a name "
        "it carries as `TLSConfig.server_name`, e.g. 'localhost' when "
        "dialing 127.0.0.1",
    ),
    (
        ("certificate_verify_failed",),
        "this client does not trust the server's certificate: it is not signed by the CA this "
        "client was given (its `TLSConfig.ca_file`; without one, the system's roots), or it "
        "expired; pass the CA certificate that signed the server's certificate",
    ),
    (
        ("wrong_version_number",),
        "the server does not speak TLS (a plaintext server); connect without TLS, or serve "
        "with a `cert_file` and a `key_file`",
    ),
    (
        ("certificate_required", "certificate required", "peer_did_not_return_a_certificate"),
        "the server requires a client certificate (mTLS: it was given a `ca_file`) and this "
        "client sent none; pass a certificate signed by that CA and its key as "
        "`TLSConfig.cert_file` and `TLSConfig.key_file`",
    ),
    (
        ("unknown_ca", "unknown ca", "bad_certificate", "bad certificate", "certificate_unknown"),
        "the server refused this client's certificate: it is not signed by the CA the server "
        "trusts (its `ca_file`), or it expired; pass a certificate signed by that CA as "
        "`TLSConfig.cert_file` and `TLSConfig.key_file`",
    ),
    (
        ("ssl_error_ssl",),
        "the TLS handshake failed; check that both sides use TLS and certificates of the same CA",
    ),
)


def tls_failure(details: str) -> str | None:
    """The `TLS_FAILURES` hint for an UNAVAILABLE error's ``details``; None for what may pass
    (a server down or restarting, a connection cut)."""
    text = details.lower()
    for needles, hint in TLS_FAILURES:
        if any(needle in text for needle in needles):
            return hint
    return None


def commit_failure(err: BaseException, message: str, seq: int) -> ServiceError:
    """A retryable answer: `DiskFullError` for a full file system, else UNAVAILABLE."""
    if isinstance(err, StorageFullError):
        return DiskFullError(message, seq=seq)
    return ServiceUnavailableError(message, seq=seq)


def code_of(err: BaseException) -> grpc.StatusCode:
    if isinstance(err, ServiceError):
        return err.code
    if isinstance(err, (BatchError, ConfigError, ValueError, TypeError)):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL


def trailing_metadata_of(err: BaseException) -> tuple[tuple[str, str], ...]:
    out = []
    seq = getattr(err, "seq", None)
    if seq is not None:
        out.append((SEQ_METADATA_KEY, str(seq)))
    if getattr(err, "retryable", False):
        out.append((RETRYABLE_METADATA_KEY, "1"))
    return tuple(out)


async def abort(context: grpc.aio.ServicerContext, err: BaseException) -> None:
    """End the RPC with ``err``'s code, message and trailing metadata; never returns."""
    await context.abort(code_of(err), str(err), trailing_metadata_of(err))


def error_from_rpc(err: grpc.RpcError, address: str = "") -> ServiceError:
    """Keeps the server's message; a lasting TLS failure (`tls_failure`) becomes `TLSError`."""
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
    message = f"{code.name}{where}: {details}"
    hint = tls_failure(details) if code == grpc.StatusCode.UNAVAILABLE else None
    if hint is not None:
        cls = TLSError
        message = f"{code.name}{where}: TLS handshake failed: {hint}. gRPC said: {details}"
    out = cls(message, seq=seq)
    out.code = code
    return out
