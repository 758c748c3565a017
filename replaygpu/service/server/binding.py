"""Why a server could not bind, in the OS's words (gRPC says only "Failed to bind"); asked
before a command imports TensorFlow too, so a port in use is refused at once."""

from __future__ import annotations

import errno
import socket

from replaygpu.errors import ConfigError


def _in_use(port: str, parameter: str = "address") -> str:
    return (
        f"address already in use: another process listens on port {port}; stop it or "
        f"pick another `{parameter}` (port 0 picks a free one)"
    )


def _host_port(address: str) -> tuple[int, str, str]:
    """``(socket family, host, port)``; an empty host: all."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return (socket.AF_INET6 if ":" in host else socket.AF_INET), host, port


def require_free_ports(address: str, metrics_port: int | None) -> None:
    """`require_free_address` for ``address`` and the ``/metrics`` port on its host, which
    would otherwise fail only after serving started.

    Raises:
        ConfigError: an address is malformed or in use, or both ask for the same port.
    """
    require_free_address(address)
    if metrics_port is None:
        return
    host, _, port = address.rpartition(":")
    if metrics_port and str(metrics_port) == port:
        raise ConfigError(
            f"`metrics_port`: got {metrics_port}, the port of `address` {address}; pick another"
        )
    require_free_address(f"{host}:{metrics_port}", parameter="metrics_port")


def require_free_address(address: str, parameter: str = "address") -> None:
    """Binds a probe with ``SO_REUSEADDR``, as gRPC does, so a port left in TIME_WAIT passes;
    other failures (a host this machine lacks) are left to the server (`bind_failure`). Errors
    name ``parameter``.

    Raises:
        ConfigError: not ``host:port`` with a port in 0-65535, or the port is in use.
    """
    family, host, port = _host_port(address)
    if not (":" in address and port.isdigit() and int(port) < 65536):
        raise ConfigError(
            f"`{parameter}` {address!r}: expected host:port with a port from 0 to 65535 (0: a free "
            "one), e.g. 0.0.0.0:50051, [::]:50051 or 127.0.0.1:0"
        )
    try:
        number = int(port)
        if number == 0:
            return
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, number))
    except OSError as cause:
        if cause.errno == errno.EADDRINUSE:
            raise ConfigError(_in_use(port, parameter)) from None


def bind_failure(address: str, err: Exception) -> str:
    """E.g. "address already in use: another process listens on port 50051; ..."."""
    family, host, port = _host_port(address)
    try:
        number = int(port)
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, number))
    except (ValueError, OSError) as cause:
        if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
            return _in_use(port)
        if isinstance(cause, OSError) and cause.strerror:
            return f"{cause.strerror.lower()} ({err})"
    return str(err)
