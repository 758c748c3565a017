"""(temporary home) The bearer-token check of the asyncio server."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from replaygpu.errors import ConfigError
from replaygpu.service.status import AuthenticationError, code_of

AUTH_METADATA_KEY = "authorization"
OPEN_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)


class AsyncTokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>`` with UNAUTHENTICATED; health
    checking and reflection stay open (probes cannot send tokens)."""

    def __init__(self, token: str, open_services: tuple[str, ...] = OPEN_SERVICES) -> None:
        if not token:
            raise ConfigError("token: got an empty string; pass None to disable tokens")
        self._expected = f"Bearer {token}".encode()
        self._open = tuple(f"/{s}/" for s in open_services)

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
        return _deny(
            handler,
            f"{method}: the call carried {reason}; pass the server's token (replaygpu "
            "--token or $REPLAYGPU_TOKEN; ReplayClient(token=...))",
        )


def _deny(handler: grpc.RpcMethodHandler | None, message: str) -> grpc.RpcMethodHandler:
    error = AuthenticationError(message)

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code_of(error), str(error))

    if handler is None:
        return grpc.unary_unary_rpc_method_handler(refuse)
    kind = {
        (True, True): grpc.stream_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (False, False): grpc.unary_unary_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return kind(refuse, handler.request_deserializer, handler.response_serializer)
