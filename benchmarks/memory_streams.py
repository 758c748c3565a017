"""Server memory against the number of Append streams sending large requests at once.

``python benchmarks/memory_streams.py [--streams 4 24 96 500] [--request-mb 64] [--requests 2]``

For each N: a fresh ``replaygpu serve`` process (a one-field uint8 table, default limits: a
64 MiB largest message, ``--inflight-mb`` 512, staging 512 MiB), then N Append streams, over 8
connections, each send ``--requests`` requests of about ``--request-mb`` MiB at once and wait
for every ack. Meanwhile this process samples the server's resident memory (``/proc/PID/status``
VmRSS every 20 ms, and VmHWM, the kernel's peak, at the end) and times a health check every
50 ms. Printed per N: peak RSS minus the idle server's RSS, next to the bound budget + staging.

The streams are sent by a small HTTP/2 client in a child process (``send`` below) rather than
by grpc: gRPC's client copies each request it sends and keeps it until the server took it all,
so N streams blocked by flow control hold N copies (500 x 64 MiB = 32 GB, more than this
machine has). Here every stream sends the same tensor bytes (one shared buffer), and only its
actor id and seq (encoded after the batch, as protobuf allows) are its own.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

MiB = 2**20
ROW_BYTES = 64 * 1024  # one uint8 row of the table
CONNECTIONS = 8


# -- the sender: Append streams over raw HTTP/2 -------------------------------------------------

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
BIG_WINDOW = 2**31 - 1


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing (names and values under 127 bytes)."""
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


class Connection:
    """One HTTP/2 connection carrying Append streams; flow control kept by hand."""

    def __init__(self, address: str, streams: list[tuple[int, list[memoryview]]]) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setblocking(False)
        self.out: list[memoryview] = []
        self.window = 65535  # the connection's send window
        self.initial = 65535  # the server's initial stream window
        self.max_frame = 16384
        self.inbox = bytearray()
        # stream id -> [chunks, chunk index, offset, window, ack bytes buffer, acks, closed]
        self.streams: dict[int, list] = {}
        self.out.append(memoryview(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
        settings = struct.pack(">HI", 2, 0) + struct.pack(">HI", 4, BIG_WINDOW)
        self.out.append(memoryview(frame(SETTINGS, 0, 0, settings)))
        self.out.append(
            memoryview(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", BIG_WINDOW - 65535)))
        )
        headers = b"".join(
            literal(k, v)
            for k, v in (
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/replaygpu.v1.ReplayService/Append"),
                (":authority", address),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            )
        )
        for stream_id, chunks in streams:
            self.out.append(memoryview(frame(HEADERS, END_HEADERS, stream_id, headers)))
            self.streams[stream_id] = [chunks, 0, 0, self.initial, bytearray(), 0, False]

    def fill(self, limit: int = 4 * MiB) -> None:
        """Queue DATA frames the windows allow, round robin over the streams, up to ``limit``."""
        queued = sum(len(m) for m in self.out)
        progress = True
        while queued < limit and progress:
            progress = False
            for stream_id, state in self.streams.items():
                chunks, index, offset, window = state[0], state[1], state[2], state[3]
                if index > len(chunks):
                    continue
                if index == len(chunks):  # all sent: half-close
                    self.out.append(memoryview(frame(DATA, END_STREAM, stream_id)))
                    state[1] = index + 1
                    progress = True
                    continue
                size = min(self.max_frame, window, self.window, len(chunks[index]) - offset)
                if size <= 0:
                    continue
                self.out.append(
                    memoryview(
                        struct.pack(">I", size)[1:]
                        + bytes([DATA, 0])
                        + struct.pack(">I", stream_id)
                    )
                )
                self.out.append(chunks[index][offset : offset + size])
                offset += size
                if offset == len(chunks[index]):
                    index, offset = index + 1, 0
                state[1], state[2], state[3] = index, offset, window - size
                self.window -= size
                queued += 9 + size
                progress = True

    def flush(self) -> None:
        while self.out:
            try:
                sent = self.sock.sendmsg(self.out[:512])
            except BlockingIOError:
                return
            while sent:
                if sent >= len(self.out[0]):
                    sent -= len(self.out.pop(0))
                else:
                    self.out[0] = self.out[0][sent:]
                    sent = 0

    def receive(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        if not data:
            raise RuntimeError("the server closed the connection")
        self.inbox += data
        while len(self.inbox) >= 9:
            length = int.from_bytes(self.inbox[:3], "big")
            if len(self.inbox) < 9 + length:
                return
            kind, flags = self.inbox[3], self.inbox[4]
            stream_id = int.from_bytes(self.inbox[5:9], "big") & 0x7FFFFFFF
            payload = bytes(self.inbox[9 : 9 + length])
            del self.inbox[: 9 + length]
            self.on_frame(kind, flags, stream_id, payload)

    def on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        state = self.streams.get(stream_id)
        if kind == SETTINGS and not flags & ACK:
            for i in range(0, len(payload), 6):
                key, value = struct.unpack(">HI", payload[i : i + 6])
                if key == 4:  # INITIAL_WINDOW_SIZE: applies to open streams too
                    for s in self.streams.values():
                        s[3] += value - self.initial
                    self.initial = value
                elif key == 5:
                    self.max_frame = value
            self.out.append(memoryview(frame(SETTINGS, ACK, 0)))
        elif kind == PING and not flags & ACK:
            self.out.append(memoryview(frame(PING, ACK, 0, payload)))
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if stream_id == 0:
                self.window += increment
            elif state is not None:
                state[3] += increment
        elif kind == GOAWAY:
            raise RuntimeError(f"GOAWAY from the server: {payload[8:]!r}")
        elif kind == RST_STREAM and state is not None:
            raise RuntimeError(f"stream {stream_id} reset: code {int.from_bytes(payload, 'big')}")
        elif kind == DATA and state is not None:
            buffer = state[4]
            buffer += payload
            while len(buffer) >= 5 and len(buffer) >= 5 + int.from_bytes(buffer[1:5], "big"):
                del buffer[: 5 + int.from_bytes(buffer[1:5], "big")]
                state[5] += 1  # an AppendAck
        if state is not None and kind in (DATA, HEADERS) and flags & END_STREAM:
            state[6] = True

    @property
    def done(self) -> bool:
        return all(s[6] for s in self.streams.values())


def send(address: str, streams: int, request_mb: float, requests: int) -> int:
    """Send ``requests`` requests on each of ``streams`` streams; print acks; 0 if all came."""
    import numpy as np

    from replaygpu.service.wire.append_request import encode_append_request
    from replaygpu.v1 import replay_pb2

    rows = int(request_mb * MiB - 4096) // ROW_BYTES
    shared = memoryview(
        encode_append_request("replay", "", 0, {"obs": np.ones((rows, ROW_BYTES), np.uint8)})
    )
    plans: list[list[tuple[int, list[memoryview]]]] = [[] for _ in range(CONNECTIONS)]
    for i in range(streams):
        chunks = []
        for seq in range(1, requests + 1):
            own = replay_pb2.AppendRequest(actor_id=f"s{i}", seq=seq).SerializeToString()
            chunks += [
                memoryview(b"\x00" + struct.pack(">I", len(shared) + len(own))),
                shared,
                memoryview(own),
            ]
        plans[i % CONNECTIONS].append((2 * (i // CONNECTIONS) + 1, chunks))
    connections = [Connection(address, plan) for plan in plans if plan]
    selector = selectors.DefaultSelector()
    for c in connections:
        selector.register(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
    deadline = time.monotonic() + 900
    while not all(c.done for c in connections):
        if time.monotonic() > deadline:
            break
        for key, events in selector.select(timeout=1.0):
            c = key.data
            if events & selectors.EVENT_READ:
                c.receive()
            c.fill()
            c.flush()
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0)
            selector.modify(c.sock, want, c)
    acks = sum(s[5] for c in connections for s in c.streams.values())
    print(json.dumps({"acks": acks, "expected": streams * requests, "request_bytes": len(shared)}))
    return 0 if acks == streams * requests else 1


# -- the measurement ----------------------------------------------------------------------------


def status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sender(address: str, streams: int, args: argparse.Namespace) -> dict[str, int]:
    """Run `send` in a child process; what it printed."""
    sender = subprocess.run(
        [
            sys.executable,
            __file__,
            "send",
            address,
            str(streams),
            str(args.request_mb),
            str(args.requests),
        ],
        capture_output=True,
        text=True,
    )
    if sender.returncode != 0:
        raise RuntimeError(f"sender failed: {sender.stdout} {sender.stderr[-2000:]}")
    return json.loads(sender.stdout.strip().splitlines()[-1])


def measure(streams: int, args: argparse.Namespace, spec_file: str) -> dict[str, float]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    address = f"127.0.0.1:{free_port()}"
    capacity = 4 * int(args.request_mb * MiB) // ROW_BYTES
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "replaygpu",
            "serve",
            "--spec",
            spec_file,
            "--address",
            address,
            "--capacity",
            str(capacity),
            "--device",
            "/CPU:0",
            "--inflight-mb",
            str(args.inflight_mb),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    channel = grpc.insecure_channel(address)
    health = health_pb2_grpc.HealthStub(channel)
    try:
        grpc.channel_ready_future(channel).result(timeout=120)
        while health.Check(health_pb2.HealthCheckRequest(), timeout=5).status != 1:
            time.sleep(0.1)
        # warm up: the first commits trace the table's append (TensorFlow keeps what it built)
        run_sender(address, 8, args)
        time.sleep(1.0)
        with open(f"/proc/{server.pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM starts again from VmRSS
        base = status_kib(server.pid, "VmRSS")
        stop = threading.Event()
        latencies: list[float] = []
        rss_max = [base]

        def probe() -> None:
            while not stop.is_set():
                started = time.monotonic()
                health.Check(health_pb2.HealthCheckRequest(), timeout=30)
                latencies.append(time.monotonic() - started)
                rss_max[0] = max(rss_max[0], status_kib(server.pid, "VmRSS"))
                stop.wait(0.05)

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        started = time.monotonic()
        sent = run_sender(address, streams, args)
        seconds = time.monotonic() - started
        stop.set()
        prober.join()
        hwm = status_kib(server.pid, "VmHWM")
    finally:
        channel.close()
        server.terminate()
        server.wait(timeout=60)
    return {
        "streams": streams,
        "base_mib": base / 1024,
        "peak_over_base_mib": (hwm - base) / 1024,
        "sampled_peak_over_base_mib": (rss_max[0] - base) / 1024,
        "health_max_s": max(latencies),
        "health_median_s": sorted(latencies)[len(latencies) // 2],
        "checks": len(latencies),
        "seconds": seconds,
        "gib_per_s": streams * args.requests * sent["request_bytes"] / seconds / 2**30,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "send":
        address, streams, request_mb, requests = sys.argv[2:6]
        return send(address, int(streams), float(request_mb), int(requests))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[4, 24, 96, 500])
    parser.add_argument("--request-mb", type=float, default=64.0)
    parser.add_argument("--requests", type=int, default=2, help="requests per stream")
    parser.add_argument("--inflight-mb", type=int, default=512)
    args = parser.parse_args()
    import tensorflow as tf

    from replaygpu.service.config import ServerConfig
    from replaygpu.specs import spec_to_json

    staging_mib = ServerConfig().staging_max_bytes / MiB
    with tempfile.TemporaryDirectory() as folder:
        spec_file = os.path.join(folder, "spec.json")
        with open(spec_file, "w") as f:
            json.dump(spec_to_json({"obs": tf.TensorSpec([ROW_BYTES], tf.uint8)}), f)
        print(
            f"requests of {args.request_mb:g} MiB, {args.requests} per stream, over "
            f"{CONNECTIONS} connections; budget --inflight-mb {args.inflight_mb}, staging "
            f"{staging_mib:.0f} MiB: bound = base + {args.inflight_mb + staging_mib:.0f} MiB"
        )
        print(
            "| streams | data sent | base RSS | peak RSS - base | bound - base | health max "
            "| health median | time |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for n in args.streams:
            r = measure(n, args, spec_file)
            print(
                f"| {n} | {n * args.requests * args.request_mb / 1024:.1f} GiB "
                f"| {r['base_mib']:.0f} MiB | {r['peak_over_base_mib']:.0f} MiB "
                f"| {args.inflight_mb + staging_mib:.0f} MiB | {r['health_max_s']:.3f} s "
                f"| {r['health_median_s']:.3f} s "
                f"| {r['seconds']:.0f} s ({r['gib_per_s']:.2f} GiB/s) |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
