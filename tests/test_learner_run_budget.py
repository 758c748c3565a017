"""A run's end and its figures over a real gRPC server on 127.0.0.1: `ReplayServer.finish_run`
(acks and Info carry ``run_finished``; later appends are acked, not inserted), the episodes
actors report (counted once per committed seq), ``learner_stats`` in Info."""

import math
import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.service.learner.run_stats import RunStats
from replaygpu.service.wire.append_request import encode_append_request
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

SPEC = {"id": tf.TensorSpec([], tf.int64), "obs": tf.TensorSpec([3], tf.float32)}


def request(seq, ids, episodes=(), actor="a"):
    ids = np.asarray(ids, np.int64)
    cols = {"id": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)}
    data = encode_append_request("replay", actor, seq, cols, episodes)
    return replay_pb2.AppendRequest.FromString(data)


@pytest.fixture
def table():
    return rg.ReplayTable(SPEC, capacity=256, device="/CPU:0")


@pytest.fixture
def stub_of():
    channels = []

    def make(server):
        channel = grpc.insecure_channel(server.address)
        channels.append(channel)
        return replay_pb2_grpc.ReplayServiceStub(channel)

    yield make
    for channel in channels:
        channel.close()


def test_finish_run_puts_run_finished_in_acks_and_info_and_inserts_nothing_later(table, stub_of):
    with rg.serve(table) as server:  # a bare table: its committer thread commits at once
        stub = stub_of(server)
        (ack,) = stub.Append(iter([request(1, [1, 2])]))
        assert (ack.transitions, ack.run_finished) == (2, False)
        assert not stub.Info(replay_pb2.InfoRequest()).run_finished

        server.finish_run()
        server.finish_run()  # idempotent
        acks = list(stub.Append(iter([request(1, [1, 2]), request(2, [3, 4, 5])])))
        info = stub.Info(replay_pb2.InfoRequest(actor_id="a"))

    got = sorted((a.seq, a.duplicate, a.transitions, a.committed_seq, a.run_finished) for a in acks)
    # the resent seq 1 is a duplicate; seq 2 is acknowledged honestly as not inserted
    assert got == [(1, True, 0, 1, True), (2, False, 0, 1, True)]
    assert info.run_finished and info.actor_last_seq == 1
    assert table.total_inserted == 2
    assert sorted(table.storage["id"].numpy()[: table.size]) == [1, 2]


def test_episodes_of_a_committed_seq_count_once_and_a_resent_seq_adds_none(table, stub_of):
    with rg.serve(table) as server:
        stub = stub_of(server)
        list(stub.Append(iter([request(1, [1], [(10.0, 10), (20.0, 20)])])))
        list(stub.Append(iter([request(1, [1], [(10.0, 10), (20.0, 20)])])))  # a resend
        list(stub.Append(iter([request(2, [2], [(90.0, 30)]), request(3, [3])])))
        values = server.run_stats.values()
    assert values["episodes"] == 3 and values["recent_episodes"] == 3
    assert values["mean_return"] == pytest.approx(40.0)
    assert values["mean_length"] == pytest.approx(20.0)


def test_the_recent_window_keeps_the_last_episodes_and_the_count_all():
    stats = RunStats(window=2)
    stats.add_episodes([(1.0, 1), (2.0, 2), (3.0, 3)])
    values = stats.values()
    assert (values["episodes"], values["recent_episodes"]) == (3, 2)
    assert values["mean_return"] == pytest.approx(2.5)
    with pytest.raises(ValueError, match="expected >= 1"):
        RunStats(window=0)


def test_info_of_a_served_learner_carries_learner_stats(table, stub_of):
    learner = rg.Learner(table, rg.UniformSampler(table, seed=0), lambda b: {}, batch_size=1)
    with rg.serve(learner) as server:
        stub = stub_of(server)
        empty = stub.Info(replay_pb2.InfoRequest()).learner_stats
        assert math.isnan(empty.loss) and math.isnan(empty.mean_return)
        assert empty.episodes == 0 and empty.eval_step == 0

        acks = []
        sender = threading.Thread(
            target=lambda: acks.extend(stub.Append(iter([request(1, [1, 2], [(7.0, 2)])])))
        )
        sender.start()
        while not acks:  # the learner's training loop commits
            server.wait_for_data(0.1)
            server.commit_pending()
        sender.join()
        server.run_stats.set_loss(0.25)
        server.run_stats.set_eval(120.5, 300)
        server.run_stats.target_steps = 1000
        stats = stub.Info(replay_pb2.InfoRequest()).learner_stats
    assert (stats.loss, stats.mean_return, stats.mean_length) == (0.25, 7.0, 2.0)
    assert (stats.episodes, stats.recent_episodes) == (1, 1)
    assert (stats.eval_return, stats.eval_step, stats.target_steps) == (120.5, 300, 1000)


def test_info_of_a_bare_table_has_no_learner_stats(table, stub_of):
    with rg.serve(table) as server:
        info = stub_of(server).Info(replay_pb2.InfoRequest())
    assert not info.HasField("learner_stats")
