"""Transport security: bearer tokens checked by a server interceptor, TLS from certificate files.

The token travels in the ``authorization`` metadata as ``Bearer <token>`` on every call. The
server checks it on every ``replaygpu.v1.ReplayService`` RPC (Append, GetWeights, Info).
Health checking and reflection stay open so that load balancers and orchestrator probes
(which cannot send tokens) work; they reveal only service names and a serving status.
Imports no TensorFlow.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from replaygpu.errors import ConfigError
from replaygpu.service.status import AuthenticationError, abort

logger = logging.getLogger(__name__)

AUTH_METADATA_KEY = "authorization"
#: Services any caller may use without a token (probes, discovery).
OPEN_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)


@dataclass(frozen=True)
class TLSConfig:
    """Certificate files for TLS, on either side of the wire.

    Server: ``cert_file`` and ``key_file`` are its certificate chain and private key;
    ``ca_file``, when given, makes the server require client certificates signed by it (mTLS).
    Client: ``ca_file`` is the root certificate to trust (None: the system roots);
    ``cert_file``/``key_file`` are its own certificate for mTLS; ``server_name`` overrides the
    name checked against the server certificate (e.g. "localhost" when dialing an IP).
    """

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        for name in ("cert_file", "key_file", "ca_file"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"TLSConfig.{name}: {path!r} is not a readable file")
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError(
                "TLSConfig: cert_file and key_file go together; got "
                f"cert_file={self.cert_file!r}, key_file={self.key_file!r}"
            )

    def _read(self, name: str) -> bytes | None:
        path = getattr(self, name)
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials for ``server.add_secure_port``."""
        if self.cert_file is None:
            raise ConfigError("TLSConfig for a server needs cert_file and key_file")
        key, cert = self._read("key_file"), self._read("cert_file")
        ca = self._read("ca_file")
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials for ``grpc.secure_channel``."""
        return grpc.ssl_channel_credentials(
            root_certificates=self._read("ca_file"),
            private_key=self._read("key_file"),
            certificate_chain=self._read("cert_file"),
        )


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``token`` (empty without one)."""
    return ((AUTH_METADATA_KEY, f"Bearer {token}"),) if token else ()


def channel_options(tls: TLSConfig | None, max_message_bytes: int) -> list[tuple[str, Any]]:
    """Channel options shared by the client and tools."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return options


def make_channel(address: str, tls: TLSConfig | None, max_message_bytes: int) -> grpc.Channel:
    """An insecure or TLS channel to ``address``."""
    options = channel_options(tls, max_message_bytes)
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.channel_credentials(), options=options)


class TokenInterceptor(grpc.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>`` with UNAUTHENTICATED."""

    def __init__(self, token: str, open_services: tuple[str, ...] = OPEN_SERVICES) -> None:
        if not token:
            raise ConfigError("token: got an empty string; pass None to disable tokens")
        self._expected = f"Bearer {token}".encode()
        self._open = tuple(f"/{s}/" for s in open_services)

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: Any
    ) -> Any:
        method = handler_call_details.method
        if method.startswith(self._open):
            return continuation(handler_call_details)
        got = dict(handler_call_details.invocation_metadata or ()).get(AUTH_METADATA_KEY)
        if got is not None and hmac.compare_digest(str(got).encode(), self._expected):
            return continuation(handler_call_details)
        reason = "no 'authorization' metadata" if got is None else "a wrong token"
        handler = continuation(handler_call_details)
        return _deny(
            handler,
            f"{method}: the call carried {reason}; pass token= to the client "
            "(it sends 'authorization: Bearer <token>')",
        )


def _deny(handler: Any, message: str) -> grpc.RpcMethodHandler:
    error = AuthenticationError(message)

    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        abort(context, error)

    if handler is None:
        return grpc.unary_unary_rpc_method_handler(refuse)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            refuse, handler.request_deserializer, handler.response_serializer
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            refuse, handler.request_deserializer, handler.response_serializer
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            refuse, handler.request_deserializer, handler.response_serializer
        )
    return grpc.unary_unary_rpc_method_handler(
        refuse, handler.request_deserializer, handler.response_serializer
    )


def is_loopback(address: str) -> bool:
    """Whether a ``host:port`` bind address only listens on the local machine."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(address: str, tls: TLSConfig | None, token: str | None) -> None:
    """Log a warning when a non-loopback address is served without TLS or without a token."""
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
