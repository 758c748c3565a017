"""gRPC ingest throughput: actor processes -> learner process over loopback.

For vector transitions (obs dim 8, float32) and 84x84 uint8 frame transitions, with 1, 2 and 4
actor processes, measures:

- ingest: ``ReplayClient.add_batch`` -> server (validate, np.frombuffer, staging) -> committed
  to a `ReplayTable` by the server's committer (``--target table``, the default) or by a served
  learner's training loop between its train calls (``--target learner``); transitions/s and
  MB/s until the last ack;
- raw: the same serialized AppendRequest bytes streamed with a bare gRPC client-streaming call
  to a server that only counts bytes (no decode, no table); the gRPC ceiling on this machine.

Each configuration is repeated (medians reported) with ingest and raw runs interleaved, so the
ratio ingest/raw compares runs under the same machine load. Run::

    python benchmarks/ingest_throughput.py            # full table (a few minutes)
    python benchmarks/ingest_throughput.py --quick    # 1 repeat, short runs
    python benchmarks/ingest_throughput.py --target learner   # commits on the training thread
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from datetime import date
from typing import Any

import grpc
import numpy as np

from replaygpu.service.actor.client import ClientConfig, ReplayClient
from replaygpu.v1 import replay_pb2

MB = 1e6
RAW_METHOD = "/bench.Raw/Stream"
KINDS = {
    # name: (obs shape, obs dtype, transitions per request)
    "vector": ((8,), np.float32, 16384),
    "frames": ((84, 84), np.uint8, 512),
}


def make_columns(kind: str, n: int, seed: int) -> dict[str, np.ndarray]:
    shape, dtype, _ = KINDS[kind]
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        obs = rng.integers(0, 255, (n, *shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((n, *shape)).astype(dtype)
    return {
        "obs": obs,
        "action": rng.integers(0, 4, n).astype(np.int64),
        "reward": rng.standard_normal(n).astype(np.float32),
        "next_obs": obs.copy(),
        "terminated": np.zeros(n, bool),
        "truncated": np.zeros(n, bool),
    }


# -- the learner process --------------------------------------------------------------------------


def learner_main(
    kind: str, capacity: int, target: str, address_q: Any, stop: Any, durable: bool = False
) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import replaygpu as rg
    from replaygpu.service.server.loop import run as run_learner

    shape, dtype, batch = KINDS[kind]
    spec = {
        "obs": tf.TensorSpec(shape, tf.as_dtype(dtype)),
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
        "next_obs": tf.TensorSpec(shape, tf.as_dtype(dtype)),
        "terminated": tf.TensorSpec([], tf.bool),
        "truncated": tf.TensorSpec([], tf.bool),
    }
    table = rg.ReplayTable(spec, capacity, device="/CPU:0")
    table.append(make_columns(kind, batch, 0))  # trace the append graph before timing
    if target == "table":  # the server's background committer writes the table
        server = rg.serve(table, "127.0.0.1:0", config=server_config(durable))
        address_q.put(server.address)
        stop.wait()
    else:  # a served learner: its training loop commits, between cheap train calls
        sampler = rg.Sampler(table, seed=0)
        learner = rg.Learner(
            table, sampler, lambda b: {"r": tf.reduce_mean(b["reward"])}, batch_size=32
        )
        learner.train(1)
        server = rg.serve(learner, "127.0.0.1:0", config=server_config(durable))
        address_q.put(server.address)
        run_learner(server, learner, 10, stop=stop, idle_wait_s=0.01)
    server.stop(grace=1.0)


def server_config(durable: bool) -> Any:
    """Default limits; ``durable``: acks mean "on disk" (a journal in a temporary folder)."""
    from replaygpu.service.config import ServerConfig

    if not durable:
        return ServerConfig()
    return ServerConfig(journal_dir=tempfile.mkdtemp(prefix="replaygpu-journal-"))


class _RawCounter:
    def __init__(self) -> None:
        self.count = 0

    def stream(self, requests: Any, context: Any) -> bytes:
        n = 0
        for request in requests:
            n += len(request)
        return n.to_bytes(8, "little")


def raw_server_main(address_q: Any, stop: Any) -> None:
    counter = _RawCounter()
    server = grpc.server(
        futures.ThreadPoolExecutor(16),
        options=[("grpc.max_receive_message_length", 128 * 2**20)],
    )
    handler = grpc.method_handlers_generic_handler(
        "bench.Raw",
        {"Stream": grpc.stream_unary_rpc_method_handler(counter.stream)},  # bytes in, bytes out
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    address_q.put(f"127.0.0.1:{port}")
    stop.wait()
    server.stop(0)


# -- actor processes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """What each actor process of a trial sends.

    Attributes:
        mode: ``"ingest"``: through `ReplayClient` s to the learner; ``"raw"``: the same
            request, serialized once, streamed to the raw gRPC server.
        kind: a key of `KINDS`.
        call: ingest: ``"add_batch"`` with ``rows`` rows a call, or ``"add"``, one transition
            at a time.
        rows: rows of each request (0: the kind's request size).
        streams: clients (one thread each) of each process.
    """

    mode: str
    kind: str
    call: str = "add_batch"
    rows: int = 0
    streams: int = 1


def actor_main(load: Load, address: str, actor: str, seconds: float, go: Any, out: Any):
    """One actor process sending ``load`` for ``seconds`` once ``go`` is set; puts
    ``(transitions, bytes, start, end)`` on ``out``."""
    kind, call, streams = load.kind, load.call, load.streams
    batch = load.rows or KINDS[kind][2]
    cols = make_columns(kind, batch, hash(actor) % 1000)
    request = replay_pb2.AppendRequest(table="replay", actor_id=actor, seq=1)
    for name, array in cols.items():
        field = request.batch.fields.add(name=name)
        field.tensor.dtype, field.tensor.data = array.dtype.name, array.tobytes()
        field.tensor.shape[:] = array.shape
    payload = request.SerializeToString()
    if load.mode == "ingest":
        config = ClientConfig(max_batch_transitions=KINDS[kind][2], max_batch_bytes=32 * 2**20)
        clients = [
            ReplayClient(address, actor_id=f"{actor}-{i}", config=config) for i in range(streams)
        ]
        rows_of = [{k: v[i] for k, v in cols.items()} for i in range(min(batch, 1024))]
        sent = [0] * streams
        go.wait()
        start = time.perf_counter()

        def feed(i: int) -> None:
            client = clients[i]
            while time.perf_counter() - start < seconds:
                if call == "add":
                    for row in rows_of:
                        client.add(row)
                    sent[i] += len(rows_of)
                else:
                    client.add_batch(cols)
                    sent[i] += batch
            client.flush()

        threads = [threading.Thread(target=feed, args=(i,)) for i in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        end = time.perf_counter()
        for client in clients:
            client.close()
        total = sum(sent)
        out.put((total, total * len(payload) / batch, start, end))
        return
    channel = grpc.insecure_channel(
        address, options=[("grpc.max_send_message_length", 128 * 2**20)]
    )
    call_raw = channel.stream_unary(RAW_METHOD, request_serializer=lambda b: b)
    go.wait()
    start = time.perf_counter()
    sent = 0

    def requests() -> Any:
        nonlocal sent
        while time.perf_counter() - start < seconds:
            sent += batch
            yield payload

    received = int.from_bytes(call_raw(requests()), "little")
    end = time.perf_counter()
    channel.close()
    out.put((sent, received, start, end))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def trial(
    ctx: Any,
    load: Load,
    address: str,
    actors: int,
    seconds: float,
    server_pid: int | None = None,
) -> tuple:
    """One timed run of ``actors`` processes sending ``load``; returns (transitions/s, MB/s,
    server CPU s per 1e6 transitions)."""
    go, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=actor_main,
            args=(load, address, f"{load.mode}-{i}-{time.time_ns()}", seconds, go, out),
        )
        for i in range(actors)
    ]
    for p in procs:
        p.start()
    time.sleep(1.5 + 0.05 * actors * load.streams)  # let actors import and connect
    cpu_before = cpu_seconds(server_pid) if server_pid else 0.0
    go.set()
    results = [out.get(timeout=seconds + 300) for _ in procs]
    cpu = cpu_seconds(server_pid) - cpu_before if server_pid else float("nan")
    for p in procs:
        p.join()
    wall = max(r[3] for r in results) - min(r[2] for r in results)
    total = sum(r[0] for r in results)
    return total / wall, sum(r[1] for r in results) / wall / MB, cpu / total * 1e6


#: the small-request cases of issue 11: (label, processes, streams each, call, rows per call)
SMALL_CASES = [
    ("add() x 1 actor", 1, 1, "add", 1),
    ("add_batch(256) x 8 procs", 8, 1, "add_batch", 256),
    ("add_batch(256) x 64 streams", 8, 8, "add_batch", 256),
]


def run_small(ctx: Any, args: argparse.Namespace) -> None:
    """Small requests: vector transitions from many streams, to the last ack."""
    stop, q = ctx.Event(), ctx.Queue()
    server = ctx.Process(
        target=learner_main, args=("vector", 2**20, args.target, q, stop, args.durable)
    )
    server.start()
    address = q.get(timeout=300)
    print(f"{'case':30} {'ingest tr/s':>12} {'server CPU s/1e6 tr':>20}")
    try:
        for label, procs, streams, call, rows in SMALL_CASES:
            if args.small_cases and not any(word in label for word in args.small_cases):
                continue
            load = Load("ingest", "vector", call, rows, streams)
            runs = [
                trial(ctx, load, address, procs, args.seconds, server.pid)
                for _ in range(args.repeats)
            ]
            tps = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[2] for r in runs)
            print(f"{label:30} {tps:12.3g} {cpu:20.2f}", flush=True)
    finally:
        stop.set()
        server.join(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--seconds", type=float, default=3.0, help="per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repeat of 1.5 s")
    parser.add_argument(
        "--target",
        choices=("table", "learner"),
        default="table",
        help="serve a bare table (background committer) or a learner whose training loop "
        "(run_learner, 10 cheap SGD steps per call) commits",
    )
    parser.add_argument(
        "--cases",
        choices=("large", "small", "all"),
        default="all",
        help="large requests (vs raw gRPC), small requests from many streams, or both",
    )
    parser.add_argument(
        "--small-cases",
        nargs="*",
        default=[],
        help="run only the small-request cases whose label contains one of these words",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="serve with durable acks (ServerConfig.journal_dir: journal + fsync per commit)",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.seconds = 1, 1.5
    ctx = mp.get_context("spawn")
    print(f"# {date.today()} {platform.node()} {os.cpu_count()} CPUs, load {os.getloadavg()}")
    print(
        f"# medians of {args.repeats} runs of {args.seconds} s; ingest = ReplayClient -> "
        f"{args.target}{', durable acks (journal)' if args.durable else ''}"
    )
    if args.cases in ("small", "all"):
        run_small(ctx, args)
    if args.cases == "small":
        print(f"# load after: {os.getloadavg()}")
        return
    print(
        f"{'kind':7} {'actors':>6} {'ingest tr/s':>12} {'ingest MB/s':>12} {'raw MB/s':>9} "
        f"{'ingest/raw':>10}"
    )
    for kind in args.kinds:
        stop, q = ctx.Event(), ctx.Queue()
        capacity = 2**20 if kind == "vector" else 20_000
        servers = [
            ctx.Process(
                target=learner_main, args=(kind, capacity, args.target, q, stop, args.durable)
            )
        ]
        servers[0].start()
        address = q.get(timeout=300)
        servers.append(ctx.Process(target=raw_server_main, args=(q, stop)))
        servers[1].start()
        raw_address = q.get(timeout=60)
        try:
            for actors in args.actors:
                ours, raw = [], []
                for _ in range(args.repeats):
                    ours.append(trial(ctx, Load("ingest", kind), address, actors, args.seconds))
                    raw.append(trial(ctx, Load("raw", kind), raw_address, actors, args.seconds))
                tps = statistics.median(r[0] for r in ours)
                mbs = statistics.median(r[1] for r in ours)
                raw_mbs = statistics.median(r[1] for r in raw)
                ratio = statistics.median(o[1] / r[1] for o, r in zip(ours, raw, strict=True))
                print(
                    f"{kind:7} {actors:6d} {tps:12.3g} {mbs:12.1f} {raw_mbs:9.1f} {ratio:10.2f}",
                    flush=True,
                )
        finally:
            stop.set()
            for p in servers:
                p.join(timeout=30)
    print(f"# load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
