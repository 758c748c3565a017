"""The request budget: bytes of Append requests read and not yet answered stay within
``ServerConfig.inflight_max_bytes`` whatever the number of streams, checked on the server's own
gauges (not by timing), and every request is still acknowledged."""

import asyncio
import threading
import time

import grpc
import pytest
from service_helpers import SPEC, columns, stored_ids

import replaygpu as rg
from replaygpu.errors import ConfigError
from replaygpu.service.config import ServerConfig
from replaygpu.service.server.admission import RequestBudget
from replaygpu.service.wire.append_request import encode_append_request
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

ROWS = 4000  # 24 bytes a row: requests of about 94 KiB


def wait_for(condition, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def request(actor, seq, first_id):
    return encode_append_request("replay", actor, seq, columns(range(first_id, first_id + ROWS)))


class Stream:
    """One raw Append stream sending ``requests``; its acks are counted on a thread."""

    def __init__(self, channel, requests):
        append = channel.stream_stream(
            "/replaygpu.v1.ReplayService/Append", request_serializer=lambda b: b
        )
        self.call = append(iter(requests))
        self.acks, self.error = 0, None
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self):
        try:
            for _ in self.call:
                self.acks += 1
        except grpc.RpcError as err:
            self.error = err.code()


def test_streams_wait_for_the_budget_before_reading_and_every_request_lands():
    size = len(request("a0", 1, 0))
    streams_n, per_stream = 12, 2
    # a request takes twice its size; a stream's first read reserves twice max_message_bytes
    # (its size is not known yet): 4 fit, whatever the order the streams arrive in
    config = ServerConfig(max_message_bytes=size + 4096, inflight_max_bytes=8 * (size + 4096))
    table = rg.ReplayTable(SPEC, capacity=streams_n * per_stream * ROWS, device="/CPU:0")
    with rg.serve(table, config=config) as server, grpc.insecure_channel(server.address) as ch:
        info = replay_pb2_grpc.ReplayServiceStub(ch).Info

        def staged_seqs():  # each actor's highest staged seq
            return [
                info(replay_pb2.InfoRequest(actor_id=f"a{i}")).actor_last_seq
                for i in range(streams_n)
            ]

        with server.training_turn():  # the committer is held: nothing read is answered yet
            streams = [
                Stream(
                    ch,
                    [request(f"a{i}", s + 1, (i * per_stream + s) * ROWS) for s in range(2)],
                )
                for i in range(streams_n)
            ]
            # 4 requests read, and no read pending (a pending read holds room in the budget):
            # every stream waits for room before its next read, but a stream that arrived
            # early and read both of its requests may have found room to read its end already
            wait_for(lambda: sum(staged_seqs()) == 4, "4 requests read")
            wait_for(lambda: server.stats()["inflight_bytes"] == 4 * 2 * size, "settled")
            time.sleep(0.3)
            stats = server.stats()
            done_reading = staged_seqs().count(per_stream)
            waiting = stats["inflight_waiting_streams"]
            assert sum(staged_seqs()) == 4 and stats["staged_batches"] == 4
            assert stats["inflight_bytes"] == 4 * 2 * size <= config.inflight_max_bytes
            assert streams_n - done_reading <= waiting <= streams_n
            assert sum(s.acks for s in streams) == 0
            # three streams that read nothing go away while they wait
            unread = [i for i, seq in enumerate(staged_seqs()) if seq == 0]
            gone = unread[-3:]
            for i in gone:
                streams[i].call.cancel()
            wait_for(lambda: server.stats()["inflight_waiting_streams"] == waiting - 3, "ends")
        for stream in streams:
            stream.thread.join(timeout=60)
        stats = server.stats()
    kept = [i for i in range(streams_n) if i not in gone]
    assert [streams[i].acks for i in kept] == [per_stream] * len(kept)
    assert [streams[i].error for i in gone] == [grpc.StatusCode.CANCELLED] * 3
    assert stats["inflight_peak_bytes"] <= config.inflight_max_bytes
    assert stats["inflight_bytes"] == 0 and stats["inflight_waiting_streams"] == 0
    acked = {r for i in kept for r in range(i * per_stream * ROWS, (i + 1) * per_stream * ROWS)}
    assert set(stored_ids(table).tolist()) == acked  # the streams that left sent nothing


def test_a_request_larger_than_the_budget_is_still_served_alone():
    size = len(request("a0", 1, 0))
    config = ServerConfig(max_message_bytes=4 * size, inflight_max_bytes=size)
    table = rg.ReplayTable(SPEC, capacity=8 * ROWS, device="/CPU:0")
    with rg.serve(table, config=config) as server, grpc.insecure_channel(server.address) as ch:
        streams = [
            Stream(ch, [request(f"a{i}", s + 1, (2 * i + s) * ROWS) for s in range(2)])
            for i in range(4)
        ]
        for stream in streams:
            stream.thread.join(timeout=60)
        stats = server.stats()
    assert [s.acks for s in streams] == [2, 2, 2, 2]
    assert stats["inflight_peak_bytes"] == 2 * size  # one request at a time, never two
    assert stored_ids(table).tolist() == list(range(8 * ROWS))


def test_the_budget_grants_in_arrival_order_and_a_waiter_that_leaves_takes_nothing():
    async def scenario():
        budget = RequestBudget(100)
        first = await budget.reserve(60)
        big = asyncio.ensure_future(budget.reserve(50))  # waits: 110 > 100
        small = asyncio.ensure_future(budget.reserve(10))  # fits, but waits behind ``big``
        leaving = asyncio.ensure_future(budget.reserve(30))
        await asyncio.sleep(0)
        assert (budget.used, budget.waiting) == (60, 3)
        leaving.cancel()
        await asyncio.sleep(0)
        first.resize(40)  # the read was smaller than reserved: 90 fits, both are granted
        held = [await big, await small]
        assert (budget.used, budget.waiting) == (100, 0)
        for hold in (first, *held, first):  # a second release gives nothing back
            hold.release()
        alone = await budget.reserve(500)  # over the budget: served when nothing is held
        assert (budget.used, budget.peak) == (500, 500)
        alone.release()
        return budget.used

    assert asyncio.run(scenario()) == 0


@pytest.mark.parametrize("value", [0, -1])
def test_a_budget_below_one_byte_is_refused(value):
    with pytest.raises(ConfigError, match="inflight_max_bytes"):
        ServerConfig(inflight_max_bytes=value)
