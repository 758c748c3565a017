"""The service as its users and attackers meet it: many actors, an outage, hostile requests.

Each row of issue 11's table, measured against a real ``replaygpu serve`` process on loopback:

- streams: ``--streams`` concurrent `ReplayClient`s (in ``--procs`` actor processes) each
  append and keep their stream open; reports how many were acknowledged, the server's CPU and
  memory, and the latency of health checks and ``Info`` calls made meanwhile (p50 / max);
- outage: the server is killed (SIGKILL), stays down ``--outage-s`` seconds and is started
  again on the same port; reports how long after it came back the client's first ack came;
- hostile requests, sent with a bare gRPC stream: a 1 MiB ``actor_id`` (x50; RSS growth),
  leading dims ``[2**62, 4]`` with no data, a field named twice, bool bytes 0x02; reports the
  status code and message the server answered, and whether it logged a traceback;
- storage (root: a tmpfs of 8 MiB under ``--checkpoint-dir`` and ``--journal-dir``): the disk is
  filled while an actor appends; reports whether the server lives on, when the append path's
  health went NOT_SERVING, and after space is freed when it is SERVING again and the first ack
  came; then the newest checkpoint is truncated and the server restarted: how long until it
  serves, and how many rows it got back (from the previous checkpoint plus the journal).

Run::

    python benchmarks/service_faults.py                   # 512 streams, 60 s outage
    python benchmarks/service_faults.py --streams 64 --outage-s 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from typing import Any

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from replaygpu.service.actor.client import ReplayClient
from replaygpu.service.config import ClientConfig
from replaygpu.service.wire.append_request import _len_field, encode_append_request
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

SPEC = {
    "obs": {"dtype": "float32", "shape": [8]},
    "action": {"dtype": "int64", "shape": []},
    "done": {"dtype": "bool", "shape": []},
}
APPEND = "/replaygpu.v1.ReplayService/Append"


def columns(n: int, start: int = 0) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + n)
    return {
        "obs": np.repeat(ids[:, None], 8, axis=1).astype(np.float32),
        "action": ids.astype(np.int64),
        "done": ids % 2 == 0,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A ``replaygpu serve`` subprocess, its log in a file."""

    def __init__(self, address: str, folder: pathlib.Path, *extra: str) -> None:
        spec = folder / "spec.json"
        spec.write_text(json.dumps(SPEC))
        self.log = folder / f"serve-{time.time_ns()}.log"
        command = [sys.executable, "-m", "replaygpu.cli", "serve", "--spec", str(spec)]
        self.process = subprocess.Popen(
            [*command, "--capacity", "1000000", "--address", address, *extra],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        self.address = address
        wait_serving(address, 120)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
        return kb / 1024

    def cpu_s(self) -> float:
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def tracebacks(self) -> int:
        return self.log.read_text().count("Traceback")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.process.send_signal(sig)
        self.process.wait(60)


def wait_serving(address: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0, wait_for_ready=True)
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


# -- many streams ---------------------------------------------------------------------------------


def swarm_main(address: str, prefix: str, count: int, ready: Any, go: Any, out: Any) -> None:
    """``count`` clients: append 64 rows each, wait for the acks (streams stay open), then on
    ``go`` append 64 more each and flush; puts (acknowledged transitions, errors)."""
    clients, errors = [], []
    for i in range(count):
        try:
            client = ReplayClient(address, actor_id=f"{prefix}{i}")
            client.add_batch(columns(64))
            clients.append(client)
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}")
    for client in clients:
        try:
            client.flush(timeout=120)
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}")
    ready.put(len(clients))
    go.wait()
    for client in clients:
        try:
            client.add_batch(columns(64, 64))
            client.flush(timeout=120)
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}")
    acked = sum(c.acked_transitions for c in clients)
    for client in clients:
        client.close(flush=False)
    out.put((acked, errors[:3], len(errors)))


def probe(address: str, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        replay = replay_pb2_grpc.ReplayServiceStub(channel)
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                health.Check(health_pb2.HealthCheckRequest(), timeout=30)
                t1 = time.monotonic()
                replay.Info(replay_pb2.InfoRequest(), timeout=30)
                out.append((t1 - t0, time.monotonic() - t1))
            except grpc.RpcError as err:
                out.append((float("inf"), float("inf")))
                print(f"#   probe failed: {err.code().name}", flush=True)
            stop.wait(0.05)


def many_streams(folder: pathlib.Path, streams: int, procs: int) -> None:
    server = Server(f"127.0.0.1:{free_port()}", folder)
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    per = [streams // procs + (i < streams % procs) for i in range(procs)]
    latencies: list[tuple[float, float]] = []
    stop = threading.Event()
    prober = threading.Thread(target=probe, args=(server.address, stop, latencies))
    prober.start()
    rss0, cpu0 = server.rss_mb(), server.cpu_s()
    started = time.monotonic()
    workers = [
        ctx.Process(target=swarm_main, args=(server.address, f"p{i}-", n, ready, go, out))
        for i, n in enumerate(per)
    ]
    for w in workers:
        w.start()
    opened = sum(ready.get(timeout=600) for _ in workers)
    rss_open = server.rss_mb()
    go.set()
    results = [out.get(timeout=600) for _ in workers]
    wall = time.monotonic() - started
    for w in workers:
        w.join()
    stop.set()
    prober.join()
    cpu = server.cpu_s() - cpu0
    acked = sum(r[0] for r in results)
    errors = sum(r[2] for r in results)
    health = [h for h, _ in latencies]
    info = [i for _, i in latencies]
    print(
        f"streams {streams:4d} ({procs} procs): {opened} clients open, acked {acked} of "
        f"{streams * 128} transitions, {errors} errors, {wall:.1f} s; server RSS "
        f"{rss0:.0f} -> {rss_open:.0f} MB with all open, CPU {cpu:.1f} s; health p50 "
        f"{1e3 * statistics.median(health):.1f} ms max {1e3 * max(health):.0f} ms, Info p50 "
        f"{1e3 * statistics.median(info):.1f} ms max {1e3 * max(info):.0f} ms "
        f"({len(latencies)} probes); server tracebacks {server.tracebacks()}",
        flush=True,
    )
    for r in results:
        for e in r[1]:
            print(f"#   {e[:300]}")
    server.stop()


# -- outage ---------------------------------------------------------------------------------------


def outage(folder: pathlib.Path, outage_s: float) -> None:
    address = f"127.0.0.1:{free_port()}"
    ckpt = folder / f"ckpt-{time.time_ns()}"
    server = Server(address, folder, "--checkpoint-dir", str(ckpt))
    client = ReplayClient(address, actor_id="patient")
    client.add_batch(columns(100))
    client.flush(timeout=60)
    server.stop(signal.SIGKILL)
    client.add_batch(columns(100, 100))  # buffered while the server is down
    time.sleep(outage_s)
    server = Server(address, folder, "--checkpoint-dir", str(ckpt))
    back = time.monotonic()
    try:
        client.flush(timeout=max(60.0, outage_s))
        result = f"first ack {time.monotonic() - back:.2f} s after the server came back"
    except Exception as err:
        result = f"{type(err).__name__} after {time.monotonic() - back:.1f} s: {err}"
    print(f"outage {outage_s:g} s (kill -9, restart): {result}", flush=True)
    client.close(flush=False)
    server.stop()


# -- storage faults -------------------------------------------------------------------------------


def append_status(address: str) -> int:
    """The health status of the replay service (the append path) at ``address``."""
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service="replaygpu.v1.ReplayService")
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


def seconds_until(condition: Any, since: float, timeout: float = 60.0) -> float:
    while not condition():
        if time.monotonic() - since > timeout:
            return float("inf")
        time.sleep(0.02)
    return time.monotonic() - since


def storage(folder: pathlib.Path) -> None:
    disk = folder / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)]
    if subprocess.run(mount, capture_output=True, check=False).returncode != 0:
        print("storage: skipped (cannot mount a tmpfs: run as root)", flush=True)
        return
    serving = health_pb2.HealthCheckResponse.SERVING
    try:
        address = f"127.0.0.1:{free_port()}"
        flags = ("--capacity", "20000", "--checkpoint-every-s", "1")
        flags += ("--checkpoint-dir", str(disk / "ckpt"), "--journal-dir", str(disk / "jnl"))
        server = Server(address, folder, *flags)
        client = ReplayClient(address, actor_id="disk", config=ClientConfig(retry_max_s=0.25))
        client.add_batch(columns(1000))
        client.flush(timeout=60)
        with open(disk / "filler", "wb", buffering=0) as filler:
            for chunk in (1 << 16, 1 << 12):  # full to the last page
                try:
                    while True:
                        filler.write(bytes(chunk))
                except OSError:
                    pass
        full = time.monotonic()
        client.add_batch(columns(1000, 1000))
        refused = seconds_until(lambda: append_status(address) != serving, full)
        time.sleep(3.0)
        alive = server.process.poll() is None
        before = "NOT_SERVING" if append_status(address) != serving else "SERVING"
        (disk / "filler").unlink()
        freed = time.monotonic()
        back = seconds_until(lambda: append_status(address) == serving, freed)
        client.flush(timeout=60)
        acked = time.monotonic() - freed
        client.close()
        print(
            f"storage: full disk: server {'alive' if alive else 'EXITED'}, append path "
            f"NOT_SERVING {refused:.2f} s after it filled ({before} just before space was "
            f"freed); space freed: SERVING after "
            f"{back:.2f} s, the refused batch acknowledged after {acked:.2f} s; tracebacks "
            f"{server.tracebacks()}",
            flush=True,
        )
        server.stop()
        newest = max((disk / "ckpt").glob("ckpt-*.index"), key=lambda p: int(p.stem[5:]))
        data = newest.with_name(newest.stem + ".data-00000-of-00001")
        os.truncate(data, data.stat().st_size // 2)
        started = time.monotonic()
        server = Server(address, folder, *flags)
        up = time.monotonic() - started
        with ReplayClient(address, actor_id="probe") as probe:
            rows = probe.info().tables[0].size
        print(
            f"storage: {data.name} truncated: serving again {up:.1f} s after the start "
            f"(process start and TensorFlow import included), {rows} of 2000 acknowledged "
            f"rows back; tracebacks {server.tracebacks()}",
            flush=True,
        )
        server.stop()
        started = time.monotonic()
        server = Server(address, folder, *flags)
        print(f"storage: an intact restart, for comparison: {time.monotonic() - started:.1f} s")
        server.stop()
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, check=False)


# -- hostile requests -----------------------------------------------------------------------------


def send_raw(channel: grpc.Channel, data: bytes) -> str:
    call = channel.stream_stream(
        APPEND, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    try:
        acks = list(call(iter([data]), timeout=30))
        return f"OK ({len(acks)} ack)"
    except grpc.RpcError as err:
        return f"{err.code().name}: {err.details()[:160]}"


def tensor(name: str, dtype: str, shape: list[int], data: bytes) -> bytes:
    message = replay_pb2.NamedTensor(name=name)
    message.tensor.dtype, message.tensor.data = dtype, data
    message.tensor.shape[:] = shape
    return message.SerializeToString()


def request_with(fields: list[bytes], actor: str = "hostile", seq: int = 1) -> bytes:
    head = replay_pb2.AppendRequest(table="replay", actor_id=actor, seq=seq).SerializeToString()
    batch = b"".join(_len_field(1, len(f)) + f for f in fields)
    return head + _len_field(4, len(batch)) + batch


def hostile(folder: pathlib.Path) -> None:
    server = Server(f"127.0.0.1:{free_port()}", folder)
    good = columns(2)
    obs = tensor("obs", "float32", [2, 8], good["obs"].tobytes())
    action = tensor("action", "int64", [2], good["action"].tobytes())
    done = tensor("done", "bool", [2], good["done"].tobytes())
    with grpc.insecure_channel(
        server.address, options=[("grpc.max_send_message_length", 2**27)]
    ) as channel:
        rss0 = server.rss_mb()
        long_id = "a" * 2**20
        answers = [
            send_raw(channel, encode_append_request("replay", long_id + str(i), 1, good))
            for i in range(50)
        ]
        refused = sum(a.startswith("INVALID_ARGUMENT") for a in answers)
        print(
            f"hostile: 50 appends with a 1 MiB actor_id: {refused} refused, e.g. {answers[0]}; "
            f"server RSS {rss0:.0f} -> {server.rss_mb():.0f} MB",
            flush=True,
        )
        cases = {
            "leading dims [2**62, 8], no data": request_with(
                [
                    tensor("obs", "float32", [2**62, 8], b""),
                    tensor("action", "int64", [2**62], b""),
                    tensor("done", "bool", [2**62], b""),
                ]
            ),
            "leading dim -1": request_with(
                [
                    tensor("obs", "float32", [-1, 8], b""),
                    tensor("action", "int64", [-1], b""),
                    tensor("done", "bool", [-1], b""),
                ]
            ),
            "a field named twice": request_with([obs, obs, action, done]),
            "bool bytes 0x02": request_with(
                [obs, action, tensor("done", "bool", [2], b"\x02\x00")]
            ),
            "bool bytes 0xFF": request_with(
                [obs, action, tensor("done", "bool", [2], b"\xff\x01")]
            ),
            "tag varint of 6 bytes": b"\x8a\x80\x80\x80\x80\x00" + b"\x06replay",
        }
        for label, data in cases.items():
            print(f"hostile: {label}: {send_raw(channel, data)}", flush=True)
    print(f"hostile: server tracebacks in its log: {server.tracebacks()}", flush=True)
    server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[40, 512])
    parser.add_argument("--procs", type=int, default=8, help="actor processes for the streams")
    parser.add_argument("--outage-s", type=float, nargs="+", default=[50.0])
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=("streams", "outage", "hostile", "storage")
    )
    args = parser.parse_args()
    print(f"# {date.today()} {os.cpu_count()} CPUs, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        if "streams" not in args.skip:
            for n in args.streams:
                many_streams(folder, n, min(args.procs, n))
        if "outage" not in args.skip:
            for seconds in args.outage_s:
                outage(folder, seconds)
        if "hostile" not in args.skip:
            hostile(folder)
        if "storage" not in args.skip:
            storage(folder)


if __name__ == "__main__":
    main()
