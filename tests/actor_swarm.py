"""A process of many `ReplayClient`s, for load tests (run as a script, driven over stdin).

``python tests/actor_swarm.py ADDRESS PREFIX COUNT FIRST_ID``: opens COUNT clients named
PREFIX0.. and has each append two ids and wait for the ack (its stream stays open), prints
``ready``; on the line ``go`` on stdin each appends one more id and flushes, then ``done``; at
end of input it closes the clients. Ids: client i appends FIRST_ID + 2i, FIRST_ID + 2i + 1, then
FIRST_ID + 2 COUNT + i. Imports no TensorFlow.
"""

import os
import sys

import numpy as np

from replaygpu.service.client import ReplayClient


def columns(ids):
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32)}


def main():
    # 512 client threads share this machine's 2 cores with the server under test; in a
    # deployment actors run elsewhere. At a lower priority they cannot starve the server (and
    # the prober) of CPU, so the test measures the server rather than the scheduler.
    os.nice(10)
    address, prefix, count, first = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    clients = []
    for i in range(count):
        client = ReplayClient(address, actor_id=f"{prefix}{i}")
        client.add_batch(columns([first + 2 * i, first + 2 * i + 1]))
        clients.append(client)
    for client in clients:
        client.flush(timeout=120)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    for i, client in enumerate(clients):
        client.add_batch(columns([first + 2 * count + i]))
    for client in clients:
        client.flush(timeout=120)
    print("done", flush=True)
    sys.stdin.read()
    for client in clients:
        client.close()


if __name__ == "__main__":
    main()
