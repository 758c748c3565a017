"""A run's end and its figures over a real gRPC server on 127.0.0.1: `ReplayServer.finish_run`
(acks and Info carry ``run_finished``; later appends are acked, not inserted), the episodes
actors report (counted once per committed seq), ``learner_stats`` in Info."""

import glob
import math
import os
import threading
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents.distributed.experience import STREAM_FIELD
from replaygpu.agents.distributed.learner import LearnerService
from replaygpu.agents.distributed.learner_cli import LearnerReport, train_to_end
from replaygpu.agents.dqn.config import ApexConfig
from replaygpu.agents.runs import RunControl
from replaygpu.service.ops.commands import learner_line
from replaygpu.service.server.run_stats import RunStats
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


def test_a_server_stopped_for_good_answers_until_its_clients_closed_their_streams(table, stub_of):
    """`stop(finish=True)` tells each open stream and keeps its port until their clients
    closed them: a client's other calls never find it closed before its stream brought the
    notice. A client that keeps its stream open is ended after the grace."""
    server = rg.serve(table)
    stub = stub_of(server)
    holds = [threading.Event(), threading.Event()]

    def requests(seq, hold):
        yield request(seq, [seq], actor=f"actor-{seq}")  # two actors: no seq is a duplicate
        hold.wait(60)  # the client has read the notice, and closes a while later

    streams = [stub.Append(requests(seq, hold)) for seq, hold in enumerate(holds, 1)]
    assert [next(stream).seq for stream in streams] == [1, 2]
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 3.0, "finish": True})
    stopper.start()
    try:
        for stream in streams:
            notice = next(stream)
            assert notice.seq == 0 and notice.run_finished
        assert stub.Info(replay_pb2.InfoRequest(), timeout=5).run_finished  # still open
        holds[0].set()
        assert list(streams[0]) == []  # ended OK once its client closed it
        assert stub.Info(replay_pb2.InfoRequest(), timeout=5).run_finished  # one still open
        stopper.join(10)  # the second never closes: ended after the grace
        assert not stopper.is_alive()
        with pytest.raises(grpc.RpcError) as ended:
            list(streams[1])
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        for hold in holds:
            hold.set()
        stopper.join(30)
    assert table.total_inserted == 2


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
    learner = rg.Learner(table, rg.Sampler(table, seed=0), lambda b: {}, batch_size=1)
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
        deadline = time.monotonic() + 30
        while not acks:  # the learner's training loop commits
            assert time.monotonic() < deadline, "no ack in 30 s"
            server.wait_for_data(0.1)
            server.commit_pending()
        sender.join()
        server.run_stats.set_loss(0.25)
        server.run_stats.set_eval(120.5, 300)
        server.run_stats.target_steps = 1000
        info = stub.Info(replay_pb2.InfoRequest())
    stats = info.learner_stats
    assert (stats.loss, stats.mean_return, stats.mean_length) == (0.25, 7.0, 2.0)
    assert (stats.episodes, stats.recent_episodes) == (1, 1)
    assert (stats.eval_return, stats.eval_step, stats.target_steps) == (120.5, 300, 1000)
    line = learner_line(info)  # what `replaygpu info` prints
    assert "SGD step 0 of 1000, loss 0.25, return 7.0 and length 2 " in line
    assert "(mean of the last 1 of 1 episodes), eval return 120.5 at SGD step 300" in line


def test_finish_at_inserts_up_to_the_batch_that_reaches_it_and_acks_the_rest_uninserted(
    table, stub_of
):
    learner = rg.Learner(table, rg.Sampler(table, seed=0), lambda b: {}, batch_size=1)
    with rg.serve(learner) as server:  # nothing commits until the test's "training loop" does
        server.finish_at(250)
        stub = stub_of(server)
        acks = []
        requests = [request(seq, range(seq * 100, seq * 100 + 100)) for seq in range(1, 6)]
        sender = threading.Thread(target=lambda: acks.extend(stub.Append(iter(requests))))
        sender.start()
        deadline = time.monotonic() + 30
        while server.stats()["staged_batches"] < 5:  # a backlog staged before any commit
            assert time.monotonic() < deadline, f"{server.stats()['staged_batches']} staged"
            server.wait_for_data(0.1)
        assert not server.run_finished
        server.commit_pending()
        sender.join()
        assert server.run_finished and stub.Info(replay_pb2.InfoRequest()).run_finished
    got = [(a.seq, a.transitions, a.committed_seq, a.run_finished) for a in acks]
    # one round: batches 1-3 commit (the third reaches 250, inserted whole), 4 and 5 do not;
    # every ack of the round is sent after it, with the ledger's seq and the run's end
    assert got == [(seq, 100, 3, True) for seq in (1, 2, 3)] + [(4, 0, 3, True), (5, 0, 3, True)]
    assert table.total_inserted == 300


def test_info_of_a_bare_table_has_no_learner_stats(table, stub_of):
    with rg.serve(table) as server:
        info = stub_of(server).Info(replay_pb2.InfoRequest())
    assert not info.HasField("learner_stats")


# -- the learner service's run budget -----------------------------------------------------------


def cartpole_batches(rows, per_request, seed=0):
    """``(columns, episodes)`` per request: ``rows`` CartPole-v1 transitions of a random policy
    (stream 0) and the episodes that ended in each request."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    ep_return, ep_length = 0.0, 0
    out = []
    for start in range(0, rows, per_request):
        cols = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
        episodes = []
        for _ in range(min(per_request, rows - start)):
            action = int(rng.integers(2))
            next_obs, reward, terminated, truncated, _ = env.step(action)
            values = (obs, action, reward, next_obs, terminated, truncated)
            for name, value in zip(cols, values, strict=True):
                cols[name].append(value)
            ep_return, ep_length = ep_return + float(reward), ep_length + 1
            obs = next_obs
            if terminated or truncated:
                episodes.append((ep_return, ep_length))
                ep_return, ep_length = 0.0, 0
                obs, _ = env.reset()
        dtypes = {"obs": np.float32, "action": np.int64, "reward": np.float32}
        dtypes.update(next_obs=np.float32, terminated=bool, truncated=bool)
        columns = {k: np.asarray(v, dtypes[k]) for k, v in cols.items()}
        columns[STREAM_FIELD] = np.zeros(len(columns["obs"]), np.int64)
        out.append((columns, episodes))
    env.close()
    return out


def scalars(folder):
    """``{tag: [(step, value), ...]}`` of the TensorBoard event files in ``folder``."""
    out = {}
    for path in glob.glob(os.path.join(folder, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                number = tf.make_ndarray(value.tensor).item()
                out.setdefault(value.tag, []).append((event.step, number))
    return out


def small_config(**kwargs):
    values = dict(
        steps=800,
        learning_starts=200,
        batch_size=32,
        buffer_size=4000,
        steps_per_call=16,
        samples_per_insert=4.0,
        hidden_sizes=(16, 16),
        eval_episodes=3,
        jit_compile=False,
    )
    return ApexConfig(**{**values, **kwargs})


def test_a_learner_with_a_budget_tells_the_actors_evaluates_and_writes_tensorboard(tmp_path):
    config = small_config(eval_every=200, periodic_eval_episodes=2)
    folder = str(tmp_path / "run")
    control = RunControl(folder, 300.0, config)
    batches = cartpole_batches(2000, 100)  # an actor that would send 2.5x the budget
    with control:
        service = LearnerService(config, control)
        # every value (summary_every_s 0), so the file holds each episode the actor reported
        report = LearnerReport(service, folder, log_every_s=0.2, summary_every_s=0.0)
        acks, info = [], []

        def actor():  # one request at a time, one more after it was told, then asks Info
            channel = grpc.insecure_channel(service.address)
            stub = replay_pb2_grpc.ReplayServiceStub(channel)
            for seq, (cols, episodes) in enumerate(batches, start=1):
                data = encode_append_request("replay", "actor-0", seq, cols, episodes)
                acks.extend(stub.Append(iter([replay_pb2.AppendRequest.FromString(data)])))
                if len(acks) > 1 and acks[-2].run_finished:
                    break
            info.append(stub.Info(replay_pb2.InfoRequest()))
            channel.close()

        sender = threading.Thread(target=actor)
        sender.start()
        try:
            assert train_to_end(service, report, grace_s=30.0)
        finally:
            sender.join()
            report.close()
            path = service.close()
    inserted = sum(a.transitions for a in acks)
    assert service.table.total_inserted == inserted
    assert config.steps <= inserted < config.steps + 100  # the budget ended it, not the actor
    told = [a.run_finished for a in acks].index(True)
    assert all(a.transitions for a in acks[:told])  # a batch staged before the end commits
    last = acks[-1]  # sent after it was told: acknowledged, not inserted
    assert (last.run_finished, last.transitions, last.duplicate) == (True, 0, False)
    assert last.committed_seq == last.seq - 1 == len(acks) - 1
    assert info[0].run_finished
    # trained out the replay budget, and no more (one call's error buffer)
    assert config.total_sgd_steps - config.steps_per_call <= service.sgd_steps
    assert service.sgd_steps <= config.total_sgd_steps + config.steps_per_call
    stats = service.server.run_stats.values()
    assert stats["eval_step"] == service.sgd_steps and stats["eval_return"] >= 8
    assert stats["episodes"] == sum(len(e) for _, e in batches[: len(acks) - 1]) > 0
    assert path is not None and tf.train.latest_checkpoint(folder) == path

    tags = scalars(folder)
    for tag in (
        "losses/td_loss",
        "losses/q_values",
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/SPS",
        "charts/SGD_steps_per_s",
        "charts/samples_per_insert",
        "eval/periodic_return",
        "eval/mean_return",
    ):
        assert tags.get(tag), f"no {tag} in {sorted(tags)}"
    assert len(tags["charts/episodic_return"]) == stats["episodes"]
    # evaluations while it trained (every 200 env steps crossed between train calls), then the
    # final one, which /metrics shows
    assert len(tags["eval/periodic_return"]) >= 2, tags["eval/periodic_return"]
    assert tags["eval/mean_return"][-1][1] == pytest.approx(stats["eval_return"])


def test_a_learner_never_trains_at_learning_rate_0():
    config = small_config()
    schedule = config.learning_rate_schedule
    for step in (0, config.total_sgd_steps, 10 * config.total_sgd_steps):
        assert float(schedule(tf.constant(step, tf.int64))) >= config.final_learning_rate > 0
    assert float(schedule(tf.constant(10**9, tf.int64))) == pytest.approx(2e-5)
    assert small_config(steps=0).learning_rate_schedule == config.learning_rate  # no end
    with pytest.raises(rg.ConfigError, match="never trains at rate 0"):
        small_config(final_learning_rate=0.0)
