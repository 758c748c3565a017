"""Why a server could not bind its address, in the OS's words: gRPC says only "Failed to
bind", so `bind_failure` probes the port itself."""

from __future__ import annotations

import errno
import socket


def bind_failure(address: str, err: Exception) -> str:
    """Why ``address`` could not be bound, in the OS's words where gRPC gives only "Failed to
    bind" (e.g. "address already in use: another process listens on port 50051; stop it or pick
    another --address")."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        number = int(port)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, number))
    except (ValueError, OSError) as cause:
        if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
            return (
                f"address already in use: another process listens on port {port}; stop it or "
                "pick another --address (port 0 picks a free one)"
            )
        if isinstance(cause, OSError) and cause.strerror:
            return f"{cause.strerror.lower()} ({err})"
    return str(err)
