"""``replaygpu serve`` (a standalone replay service), ``replaygpu info ADDRESS`` and
``replaygpu health ADDRESS`` (a container health check)."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import re
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replaygpu.service.config import ServerConfig
    from replaygpu.service.ops.auth import TLSConfig

logger = logging.getLogger(__name__)

#: the flag of each library parameter whose flag is not its name in dashes (see `with_flags`)
PARAMETER_FLAGS = {
    "cert_file": "--tls-cert",
    "key_file": "--tls-key",
    "ca_file": "--tls-ca",
    "directory": "--checkpoint-dir",  # `Checkpointer`'s
}
#: a parameter that a library message names: in backticks, maybe with its class before a dot
_PARAMETER = re.compile(r"`(?:[A-Z]\w*\.)?([a-z][a-z0-9_]*)`")


def with_flags(message: str) -> str:
    """A library message with each backticked parameter as its flag: ```checkpoint_dir``` ->
    ``--checkpoint-dir``, ```TLSConfig.cert_file``` -> ``--tls-cert`` (`PARAMETER_FLAGS`)."""

    def flag(match: re.Match[str]) -> str:
        name = match[1]
        return PARAMETER_FLAGS.get(name, "--" + name.replace("_", "-"))

    return _PARAMETER.sub(flag, message)


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run a standalone replay service (table + ledger, checkpointed)",
        description="Serve a replay table over gRPC for remote actors. The table's spec comes "
        "from a gymnasium env id or a JSON spec file ({field: {dtype, shape}}).",
    )
    spec = serve.add_mutually_exclusive_group(required=True)
    spec.add_argument("--env", help="gymnasium env id whose transition spec to use")
    spec.add_argument("--spec", help="JSON spec file, as written by replaygpu.spec_to_json")
    serve.add_argument("--capacity", type=positive_int, default=1_000_000, help="transitions kept")
    serve.add_argument("--table", default="replay", help="table name (default replay)")
    serve.add_argument("--device", default=None, help="device of the table (default: GPU if any)")
    serve.add_argument(
        "--address", default="127.0.0.1:50051", help="host:port to bind (default loopback)"
    )
    serve.add_argument(
        "--max-message-mb", type=positive_int, default=64, help="largest append (MiB)"
    )
    add_server_flags(serve)
    serve.set_defaults(func=run_serve)

    info = subparsers.add_parser("info", help="print a replay server's tables and counters")
    info.add_argument("address", help="host:port of the server")
    add_client_flags(info)
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=run_info)

    health = subparsers.add_parser(
        "health",
        help="check a replay server's gRPC health (exit 0 when SERVING, 1 otherwise)",
        description="Ask the server at ADDRESS for its status (grpc.health.v1, no token "
        "needed) and print it: SERVING exits 0; anything else, or no answer within --timeout, "
        "exits 1 with the reason on stderr. Fast (imports no TensorFlow): for container "
        "health checks.",
    )
    health.add_argument("address", help="host:port of the server")
    health.add_argument(
        "--service",
        default="",
        help="service to check (default '': the whole server; or replaygpu.v1.ReplayService)",
    )
    health.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)"
    )
    add_client_flags(health)
    health.set_defaults(func=run_health)


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """The flags every server command (``serve``, ``learner``) has: token and TLS, checkpoints,
    metrics and the `ServerConfig` ones (`server_config`)."""
    parser.add_argument(
        "--token",
        default=os.environ.get("REPLAYGPU_TOKEN"),
        help="require this bearer token (default: $REPLAYGPU_TOKEN)",
    )
    parser.add_argument("--tls-cert", help="server certificate chain (PEM)")
    parser.add_argument("--tls-key", help="server private key (PEM)")
    parser.add_argument(
        "--tls-ca", help="CA of client certificates: require mTLS (with --tls-cert/--tls-key)"
    )
    parser.add_argument("--checkpoint-dir", help="resume from and save checkpoints here")
    parser.add_argument(
        "--checkpoint-every-s", type=float, default=300.0, help="seconds between checkpoints"
    )
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        help="serve Prometheus metrics at http://HOST:PORT/metrics, HOST the host of --address "
        "(default: off)",
    )
    parser.add_argument(
        "--inflight-mb",
        type=positive_int,
        default=512,
        help="MiB of memory for append requests read and not yet committed (each counts "
        "twice its size), over all actors; beyond it actors wait, held back by HTTP/2 flow "
        "control (default 512)",
    )
    parser.add_argument(
        "--max-actors",
        type=positive_int,
        default=1024,
        help="concurrent actor streams at most; one more is refused at once (default 1024)",
    )
    parser.add_argument(
        "--journal-dir",
        help="durable acks: journal every acknowledged batch here (fsynced) and replay it over "
        "the checkpoint on restart, so a crash loses nothing acknowledged; needs "
        "--checkpoint-dir (each checkpoint cuts the journal)",
    )


def server_config(args: argparse.Namespace, **fields: Any) -> ServerConfig:
    """From `add_server_flags`' flags and ``fields``; `ConfigError` for ``--journal-dir``
    without ``--checkpoint-dir``."""
    from replaygpu.errors import ConfigError
    from replaygpu.service.config import ServerConfig

    if args.journal_dir and not args.checkpoint_dir:
        raise ConfigError(
            f"--journal-dir={args.journal_dir!r} needs --checkpoint-dir: the journal is "
            "replayed over the last checkpoint and cut at each one (without checkpoints it "
            "would grow without bound); pass --checkpoint-dir too"
        )
    return ServerConfig(
        max_actors=args.max_actors,
        inflight_max_bytes=args.inflight_mb * 2**20,
        journal_dir=args.journal_dir,
        **fields,
    )


def server_tls(args: argparse.Namespace) -> TLSConfig | None:
    """None for plaintext; `ConfigError` for flags that do not go together or bad files."""
    from replaygpu.errors import ConfigError
    from replaygpu.service.ops.auth import TLSConfig

    missing = [flag for flag in ("tls_cert", "tls_key") if not getattr(args, flag)]
    if args.tls_ca and missing:
        flags = " and ".join(f"--{flag.replace('_', '-')}" for flag in missing)
        raise ConfigError(
            f"--tls-ca={args.tls_ca!r} requires client certificates on a TLS server, "
            f"but {flags} {'is' if len(missing) == 1 else 'are'} missing; pass the server's "
            "--tls-cert and --tls-key too (or drop --tls-ca to serve without mTLS)"
        )
    if not (args.tls_cert or args.tls_key):
        return None
    return TLSConfig(cert_file=args.tls_cert, key_file=args.tls_key, ca_file=args.tls_ca)


def positive_int(text: str) -> int:
    """An argparse type, checked as the flags are parsed, before any import."""
    return _number_in(text, int, 1, math.inf, "an integer >= 1")


def port_number(text: str) -> int:
    return _number_in(text, int, 0, 65535, "a port number in 0..65535")


def seconds(text: str) -> float:
    """A number of seconds >= 0 (an argparse type, as `positive_int`)."""
    return _number_in(text, float, 0.0, math.inf, "seconds >= 0 (0: off)")


def _number_in(text: str, kind: type, low: float, high: float, expected: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        value = math.nan  # out of every range, as NaN itself is
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected {expected}")
    return value


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """Of ``info``, ``health``, ``actor``; any ``--tls-*`` or ``--server-name`` enables TLS."""
    parser.add_argument(
        "--token",
        default=os.environ.get("REPLAYGPU_TOKEN"),
        help="bearer token the server requires (default: $REPLAYGPU_TOKEN)",
    )
    parser.add_argument(
        "--tls-ca", help="CA certificate that signed the server's certificate (enables TLS)"
    )
    parser.add_argument(
        "--tls-cert", help="client certificate (PEM), for a server that requires one (mTLS)"
    )
    parser.add_argument("--tls-key", help="private key of --tls-cert (PEM)")
    parser.add_argument(
        "--server-name", help="name to check the server certificate against (e.g. localhost)"
    )


def client_tls(args: Any) -> TLSConfig | None:
    """From the flags (or an `ActorConfig`'s fields of those names); None: plaintext.
    `ConfigError` for a missing file or a certificate and key that do not match."""
    from replaygpu.service.ops.auth import TLSConfig

    if not any((args.tls_ca, args.tls_cert, args.tls_key, args.server_name)):
        return None
    return TLSConfig(
        cert_file=args.tls_cert,
        key_file=args.tls_key,
        ca_file=args.tls_ca,
        server_name=args.server_name,
    )


def _load_spec(args: argparse.Namespace, env: Any) -> Any:
    """``env``'s (closed here), or read from ``--spec``."""
    import replaygpu as rg
    from replaygpu.specs import spec_from_json, specs_from_env

    if env is not None:
        try:
            return specs_from_env(env)
        finally:
            env.close()
    try:
        with open(args.spec) as f:
            return spec_from_json(json.load(f))
    except (OSError, ValueError) as err:
        if isinstance(err, rg.ConfigError):
            raise
        raise rg.ConfigError(
            f"--spec {args.spec!r}: cannot read a spec from it ({type(err).__name__}: {err}); "
            "expected a JSON file as written by replaygpu.spec_to_json"
        ) from None


def run_serve(args: argparse.Namespace) -> int:
    """Serve, checkpointing periodically and on the way out. SIGINT stops for good (actors exit
    0), SIGTERM (an orchestrator's restart) not: see `ReplayServer.stop`'s ``finish``. Raises
    `ConfigError` for TLS flags that do not go together (nothing is served)."""
    from replaygpu.service.server.binding import require_free_ports

    tls = server_tls(args)
    config = server_config(args, max_message_bytes=args.max_message_mb * 2**20)
    require_free_ports(args.address, args.metrics_port)  # before TensorFlow: one line at once
    env = None
    if args.env:  # made before TensorFlow is imported: an unknown id is refused at once
        import gymnasium as gym

        env = gym.make(args.env)
    import replaygpu as rg
    from replaygpu.checkpoint import CheckpointSchedule
    from replaygpu.service.server.ledger import SequenceLedger

    spec = _load_spec(args, env)
    table = rg.ReplayTable(spec, args.capacity, device=args.device, name=args.table)
    ledger = SequenceLedger()
    ckpt = None
    if args.checkpoint_dir:
        ckpt = rg.Checkpointer(args.checkpoint_dir, table=table, ledger=ledger)
        if restored := ckpt.restore():
            logger.info("restored %s: %d transitions", restored, table.size)
    server = rg.serve(table, args.address, args.token, tls, config=config, ledger=ledger)
    metrics, signalled = None, False
    try:
        if args.metrics_port is not None:
            from replaygpu.service.ops.metrics import start_metrics_server

            host = server.address.rsplit(":", 1)[0]
            metrics = start_metrics_server(args.metrics_port, server, address=host)
        stop, received = threading.Event(), []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _: (received.append(signum), stop.set()))
        logger.info(
            "replay service at %s (table %s, capacity %d)",
            server.address,
            args.table,
            args.capacity,
        )
        # a failed checkpoint (a full disk) is logged and retried, never fatal
        schedule = CheckpointSchedule(args.checkpoint_every_s if ckpt else None)
        while not stop.wait(min(schedule.wait_s(), 3600)):
            if ckpt is not None and schedule.due():
                schedule.run(lambda: server.save(ckpt))
        signalled = received[0] == signal.SIGINT
    finally:
        server.stop(finish=signalled)  # SIGTERM or a failure: actors wait for a restarted one
        if metrics is not None:
            metrics.close()
    if ckpt is not None:
        ckpt.save()
    return 0


def message_json(message: Any) -> str:
    """Indented JSON, all fields, int64 as numbers, not protobuf's strings (which ``jq`` would
    compare as strings); the counters stay far below 2**53."""
    from google.protobuf import json_format

    value = json_format.MessageToDict(message, always_print_fields_with_no_presence=True)
    return json.dumps(_int64_as_numbers(message.DESCRIPTOR, value), indent=2)


def _int64_as_numbers(descriptor: Any, value: dict[str, Any]) -> dict[str, Any]:
    from google.protobuf.descriptor import FieldDescriptor

    for field in descriptor.fields:
        if (item := value.get(field.json_name)) is None:
            continue
        if field.cpp_type in (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64):
            convert: Any = int
        elif field.message_type is not None:
            convert = functools.partial(_int64_as_numbers, field.message_type)
        else:
            continue
        value[field.json_name] = [*map(convert, item)] if isinstance(item, list) else convert(item)
    return value


def _call(args: argparse.Namespace, stub: Any, method: str, request: Any, timeout: float) -> Any:
    """Raises `ServiceError` (`connect_error`) if the call failed."""
    import grpc

    from replaygpu.service.ops.auth import connect_error, make_channel, token_metadata

    tls = client_tls(args)
    channel = make_channel(args.address, tls, 2**20)
    try:
        call = getattr(stub(channel), method)
        return call(request, metadata=token_metadata(args.token), timeout=timeout)
    except grpc.RpcError as err:
        raise connect_error(err, args.address, tls) from None
    finally:
        channel.close()


def run_info(args: argparse.Namespace) -> int:
    from replaygpu.v1 import replay_pb2, replay_pb2_grpc

    reply = _call(args, replay_pb2_grpc.ReplayServiceStub, "Info", replay_pb2.InfoRequest(), 10)
    if args.json:
        print(message_json(reply))
        return 0
    print(
        f"server {args.address}: replaygpu {reply.server_version}, weights version "
        f"{reply.weights_version}, learner steps {reply.learner_steps}, actors {reply.actors}, "
        f"staged {reply.staged_batches} batches / {reply.staged_bytes} bytes"
    )
    if reply.HasField("learner_stats"):
        print(learner_line(reply))
    for t in reply.tables:
        print(
            f"table {t.name}: size {t.size}/{t.capacity}, inserted {t.inserted}, "
            f"sampled {t.sampled}, device {t.device}"
        )
        for f in t.spec:
            print(f"  {f.name}: {f.dtype}{list(f.shape)}")
        if t.HasField("rate_limiter"):
            r = t.rate_limiter
            print(
                f"  rate limiter {r.kind}: samples_per_insert {r.samples_per_insert:g}, "
                f"min_size_to_sample {r.min_size_to_sample}, error_buffer {r.error_buffer:g}, "
                f"sampled {r.sampled}"
            )
    return 0


def learner_line(reply: Any) -> str:
    """``replaygpu info``'s line of an ``InfoResponse``'s ``learner_stats`` (nan: not known)."""
    stats = reply.learner_stats
    evaluated = "no eval yet"
    if not math.isnan(stats.eval_return):
        evaluated = f"eval return {stats.eval_return:.1f} at SGD step {stats.eval_step}"
    budget = f"of {stats.target_steps}" if stats.target_steps else "(no end)"
    return (
        f"learner: {'run finished, ' if reply.run_finished else ''}SGD step "
        f"{reply.learner_steps} {budget}, loss {stats.loss:.4g}, return {stats.mean_return:.1f} "
        f"and length {stats.mean_length:.0f} "
        f"(mean of the last {stats.recent_episodes} of {stats.episodes} episodes), {evaluated}"
    )


def run_health(args: argparse.Namespace) -> int:
    """0 when SERVING, else 1 and the reason on stderr (never 2: Docker reserves it). Imports
    no TensorFlow."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from replaygpu.errors import ReplayError

    where = f"replaygpu health: {args.address} (service {args.service!r})"
    request = health_pb2.HealthCheckRequest(service=args.service)
    try:
        reply = _call(args, health_pb2_grpc.HealthStub, "Check", request, args.timeout)
    except ReplayError as err:
        print(f"{where}: {type(err).__name__}: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"{where}: answered {status}", file=sys.stderr)
        return 1
    return 0
