"""Transport security: bearer tokens checked by a server interceptor, TLS from certificate files.
The server checks ``authorization: Bearer <token>`` on every ``replaygpu.v1.ReplayService`` RPC;
health checking and reflection stay open for probes (which cannot send tokens): they reveal only
service names and a serving status. `connect_error` says why a connection failed in the user's
terms. Imports no TensorFlow."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from replaygpu.errors import ConfigError
from replaygpu.service.wire.status import (
    AuthenticationError,
    ServiceError,
    TLSError,
    abort,
    error_from_rpc,
    tls_failure,
)

logger = logging.getLogger(__name__)

AUTH_METADATA_KEY = "authorization"
#: services open without a token (probes, discovery)
OPEN_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)


@dataclass(frozen=True)
class TLSConfig:
    """Certificate files for TLS, on either side of the wire.

    Server: ``cert_file``/``key_file`` its chain and key; a ``ca_file`` requires client
    certificates signed by it (mTLS). Client: ``ca_file`` the root to trust (None: the system
    roots), ``cert_file``/``key_file`` its mTLS certificate, ``server_name`` the name checked
    against the server certificate (e.g. "localhost" when dialing an IP).

    Raises:
        ConfigError: a file missing or without a PEM certificate (key), an encrypted key, or a
            certificate and key that do not belong together.
    """

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        for name in ("cert_file", "key_file", "ca_file"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"`TLSConfig.{name}`: {path!r} is not a readable file")
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError(
                "TLSConfig: `cert_file` and `key_file` go together; got "
                f"cert_file={self.cert_file!r}, key_file={self.key_file!r}"
            )
        for name in ("ca_file", "cert_file"):
            if getattr(self, name) is not None:
                _check_certificates(name, getattr(self, name))
        if self.cert_file is not None and self.key_file is not None:
            _check_key_pair(self.cert_file, self.key_file)

    def _read(self, name: str) -> bytes | None:
        path = getattr(self, name)
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert_file is None:
            raise ConfigError("TLSConfig for a server needs `cert_file` and `key_file`")
        key, cert = self._read("key_file"), self._read("cert_file")
        ca = self._read("ca_file")
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self._read("ca_file"),
            private_key=self._read("key_file"),
            certificate_chain=self._read("cert_file"),
        )

    def describe(self) -> str:
        """For error messages."""
        names = ("cert_file", "key_file", "ca_file", "server_name")
        given = [f"{n}={getattr(self, n)!r}" for n in names if getattr(self, n) is not None]
        return f"TLSConfig({', '.join(given)})"


def _check_certificates(name: str, path: str) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except (ssl.SSLError, ValueError) as err:
        raise ConfigError(
            f"`TLSConfig.{name}`: {path!r} holds no PEM certificate ({err}); "
            "expected a file with '-----BEGIN CERTIFICATE-----' blocks"
        ) from None


def _check_key_pair(cert_file: str, key_file: str) -> None:
    """Checked before gRPC sees them: gRPC reports a bad pair only as "cannot bind" or a
    failed handshake."""
    try:  # the password callback keeps OpenSSL from prompting on a terminal
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(
            cert_file, key_file, password=lambda: b""
        )
    except (ssl.SSLError, ValueError) as err:
        if getattr(err, "reason", None) == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"TLSConfig: the certificate {cert_file!r} (`cert_file`) and the key "
                f"{key_file!r} (`key_file`) do not match: the key is not the private key of the "
                f"certificate ({err}); pass the key that was made with that certificate"
            ) from None
        with open(key_file, "rb") as f:
            encrypted = b"ENCRYPTED" in f.read()
        what = "an encrypted private key" if encrypted else "no PEM private key"
        raise ConfigError(
            f"`TLSConfig.key_file`: {key_file!r} holds {what} ({err}); expected the "
            "unencrypted PEM private key of the certificate "
            f"{cert_file!r} ('-----BEGIN PRIVATE KEY-----')"
        ) from None


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return ((AUTH_METADATA_KEY, f"Bearer {token}"),) if token else ()


def channel_options(tls: TLSConfig | None, max_message_bytes: int) -> list[tuple[str, Any]]:
    """Channel options shared by the client and tools. Reconnects: gRPC's backoff (1 s, x1.6
    up to 120 s) finds a server back minutes after a long outage; here 100 ms up to 1 s (plus
    20 % jitter). The minimum connect timeout keeps gRPC's 20 s, so a slow TCP and TLS handshake
    to a distant server is not cut short.

    Keepalive: a ping every 20 s, idle too, closing after 10 s without answer: a server that
    vanished (killed VM, partition) is noticed within 30 s, not at the TCP timeout.
    `replaygpu.serve` accepts pings every 10 s; gRPC's defaults (5 minutes) would answer GOAWAY
    "too_many_pings"."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return options


#: prefixes of the gRPC target URIs a client may name instead of ``host:port``
_TARGET_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")


def require_server_address(address: str) -> None:
    """Accept ``host:port`` (``[v6]:port``, port 1-65535) or a gRPC target URI. Without a port
    gRPC would dial 443 and the user would read "connection refused". `ConfigError` names the
    address, what is wrong with it, and an example."""
    if address.startswith(_TARGET_SCHEMES):
        return
    host, _, port = address.rpartition(":")
    ipv6_without_port = address.endswith("]") or (":" in host and not host.endswith("]"))
    if ":" not in address or ipv6_without_port:
        problem = "no port"
    elif host.strip("[]") and port.isdigit() and 0 < int(port) < 65536:
        return
    elif not host.strip("[]"):
        problem = "no host"
    else:
        problem = f"port {port!r} is not a number from 1 to 65535"
    raise ConfigError(
        f"server address {address!r}: {problem}; expected host:port, e.g. 127.0.0.1:50051 "
        "([::1]:50051 for IPv6), or a gRPC target URI such as dns:///learner:50051"
    )


def make_channel(address: str, tls: TLSConfig | None, max_message_bytes: int) -> grpc.Channel:
    """Raises `ConfigError` from `require_server_address`."""
    require_server_address(address)
    options = channel_options(tls, max_message_bytes)
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.channel_credentials(), options=options)


#: gRPC details of a connection the server closed or reset (no reason given)
_CLOSED = ("socket closed", "connection reset", "broken pipe", "end of tcp stream")

#: the HTTP/2 client preface and an empty SETTINGS frame: what a gRPC client sends first
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")


def connect_error(err: grpc.RpcError, address: str, tls: TLSConfig | None) -> ServiceError:
    """The library error of an RPC that failed to reach ``address``, naming TLS problems.

    `error_from_rpc` knows the handshake failures gRPC names; when gRPC says only "socket
    closed", `probe_handshake` may find a TLS mismatch (a `TLSError` too); anything else (a
    server down or restarting) stays retryable."""
    error = error_from_rpc(err, address)
    if error.code != grpc.StatusCode.UNAVAILABLE:
        return error
    details = str((err.details() if hasattr(err, "details") else None) or err)
    hint = tls_failure(details) if isinstance(error, TLSError) else None
    if hint is None and any(closed in details.lower() for closed in _CLOSED):
        hint = probe_handshake(address, tls)
    if hint is None:
        return error
    client = tls.describe() if tls is not None else "plaintext (no TLS)"
    return TLSError(
        f"UNAVAILABLE (server {address}): {hint}. This client: {client}. gRPC said: {details}",
        seq=error.seq,
    )


def probe_handshake(address: str, tls: TLSConfig | None, timeout: float = 1.0) -> str | None:
    """Why TLS stops this client talking to ``address``, from a handshake with Python's
    ``ssl``, or None when nothing is certain: a plaintext client whose handshake succeeds; a
    TLS client (server certificate unchecked: gRPC did that) whose HTTP/2 preface gets a close
    or an alert, as from an mTLS server refusing its certificate. A second probe must agree, so
    a restarting server is not taken for one. Each probe: one TCP and TLS handshake, each
    bounded by ``timeout``."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return None  # a gRPC target URI (dns:///, unix:, ...): nothing to probe
    found = _probe(host, int(port), tls, timeout)
    if not (found in ("tls-closed", "tls-alert") or (found == "tls" and tls is None)):
        return None
    time.sleep(0.05)
    if _probe(host, int(port), tls, timeout) != found:
        return None
    if tls is None:
        hint = (
            "the server speaks TLS and this client connects in plaintext; pass the CA that "
            "signed the server's certificate as the client's `TLSConfig.ca_file`"
        )
        if found != "tls":
            hint += (
                ", and a client certificate signed by the CA the server trusts and its key as "
                "`TLSConfig.cert_file` and `TLSConfig.key_file`: the "
                "server also closed a TLS connection without one (mTLS)"
            )
        return hint
    if tls.cert_file is None:
        return (
            "the server closed the connection right after the TLS handshake, as a server that "
            "requires client certificates (mTLS: given a `ca_file`) does when it gets none; "
            "pass a certificate signed by the CA it trusts and its key as "
            "`TLSConfig.cert_file` and `TLSConfig.key_file`"
        )
    return (
        f"the server closed the connection right after the TLS handshake, as a server that "
        f"requires client certificates (mTLS) does when it does not trust the one it got: "
        f"{tls.cert_file!r} is not signed by the CA the server was given (its `ca_file`), or "
        "it expired; pass a certificate signed by that CA (`cert_file` and `key_file`)"
    )


def _probe(host: str, port: int, tls: TLSConfig | None, timeout: float) -> str:
    """One handshake: "tls" (then answered HTTP/2), "tls-closed", "tls-alert", "not-tls"
    (answered the handshake otherwise) or "unknown" (unreachable, timed out, cut)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only the server's manner is probed, not its identity
    context.set_alpn_protocols(["h2"])
    if tls is not None and tls.cert_file is not None:
        context.load_cert_chain(tls.cert_file, tls.key_file, password=lambda: b"")
    name = (tls.server_name if tls is not None else None) or host
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            try:
                conn = context.wrap_socket(raw, server_hostname=name)
            except ssl.SSLError as err:
                if "ALERT" in str(getattr(err, "reason", "")):
                    return "tls-alert"
                return "unknown" if isinstance(err, ssl.SSLEOFError) else "not-tls"
            with conn:
                conn.sendall(_H2_PREFACE)
                try:
                    first = conn.recv(9)
                except ssl.SSLError as err:
                    return "tls-alert" if "ALERT" in str(getattr(err, "reason", "")) else "unknown"
                except ConnectionResetError:
                    return "tls-closed"
                return "tls" if first else "tls-closed"
    except (OSError, ValueError):
        return "unknown"


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for calls without the token, except to `OPEN_SERVICES` (asyncio server)."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ConfigError("token: got an empty string; pass None to disable tokens")
        self._expected = f"Bearer {token}".encode()
        self._open = tuple(f"/{s}/" for s in OPEN_SERVICES)

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        handler = await continuation(handler_call_details)
        if method.startswith(self._open):
            return handler
        got = dict(handler_call_details.invocation_metadata or ()).get(AUTH_METADATA_KEY)
        if got is not None and hmac.compare_digest(str(got).encode(), self._expected):
            return handler
        reason = "no 'authorization' metadata" if got is None else "a wrong token"
        return _deny(handler, f"{method}: the call carried {reason}; pass the server's `token`")


def _deny(handler: grpc.RpcMethodHandler | None, message: str) -> grpc.RpcMethodHandler:
    error = AuthenticationError(message)

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await abort(context, error)

    if handler is None:
        return grpc.unary_unary_rpc_method_handler(refuse)
    kind = {
        (True, True): grpc.stream_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (False, False): grpc.unary_unary_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return kind(refuse, handler.request_deserializer, handler.response_serializer)


def is_loopback(address: str) -> bool:
    """Whether a ``host:port`` bind address listens only on the local machine."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(address: str, tls: TLSConfig | None, token: str | None) -> None:
    if is_loopback(address):
        return
    missing = [name for name, value in (("TLS", tls), ("a token", token)) if value is None]
    if missing:
        logger.warning(
            "serving on non-loopback address %s without %s: anyone who can reach it can "
            "write to the replay table and read the weights; pass tls= and token=",
            address,
            " or ".join(missing),
        )
