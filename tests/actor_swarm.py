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

from replaygpu.service.actor.client import ReplayClient


def leave_the_cpu_to_the_server():
    """Put this process's threads (and those they start) in the idle scheduling class.

    The swarm's hundreds of threads share this machine's 2 cores with the server under test; in
    a deployment actors run elsewhere. Nice alone does not keep them off the server: CFS weighs
    each thread, so 512 runnable threads at nice 10 outweighed the server's few at nice 0 (its
    event loop was measured waiting 2.9 s of a 5 s burst for a CPU while running 0.3 s). At
    SCHED_IDLE they run when the server does not, so the test measures the server rather than
    the scheduler. Only while the test measures: from ``ready`` to ``done``. At SCHED_IDLE from
    the start, the connecting main thread starved beside a CPU hog (no ``ready`` in 300 s), and
    at the end the closing one (no exit in 60 s); one thread's appends and closes, one client at
    a time, weigh little beside the server.
    """
    schedule_threads(os.SCHED_IDLE)


def schedule_threads(policy):
    """Put every thread of this process in the scheduling class ``policy``."""
    for tid in map(int, os.listdir("/proc/self/task")):
        os.sched_setscheduler(tid, policy, os.sched_param(0))


def columns(ids):
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32)}


def main():
    address, prefix, count, first = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    clients = []
    for i in range(count):
        client = ReplayClient(address, actor_id=f"{prefix}{i}")
        client.add_batch(columns([first + 2 * i, first + 2 * i + 1]))
        clients.append(client)
    for client in clients:
        client.flush(timeout=120)
    leave_the_cpu_to_the_server()  # every thread grpc started; threads inherit it from here
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    for i, client in enumerate(clients):
        client.add_batch(columns([first + 2 * count + i]))
    for client in clients:
        client.flush(timeout=120)
    print("done", flush=True)
    schedule_threads(os.SCHED_OTHER)  # the measured burst is over: close at a fair share
    sys.stdin.read()
    for client in clients:
        client.close()


if __name__ == "__main__":
    main()
