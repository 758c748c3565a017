"""A served learner's training loop (run_learner, learner_step): commits streamed appends
on the training thread, trains, publishes, checkpoints."""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.service.config import ClientConfig
from replaygpu.service.server.ledger import SequenceLedger
from replaygpu.service.server.loop import run as run_learner
from replaygpu.service.server.loop import step as learner_step

SPEC = {"id": tf.TensorSpec([], tf.int64), "x": tf.TensorSpec([2], tf.float32)}


def make_learner():
    table = rg.ReplayTable(SPEC, capacity=512, device="/CPU:0")
    w = tf.Variable(tf.zeros([2]))
    opt = tf.keras.optimizers.SGD(0.1)
    opt.build([w])

    def update_fn(batch):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(batch["x"] - w))
        opt.apply_gradients([(tape.gradient(loss, w), w)])
        return {"loss": loss}

    sampler = rg.Sampler(table, seed=0)
    return rg.Learner(table, sampler, update_fn, batch_size=8), w


def test_run_commits_streamed_appends_trains_and_publishes_weights(tmp_path):
    learner, w = make_learner()
    server = rg.serve(learner)
    ckpt = rg.Checkpointer(tmp_path, learner=learner, ledger=server.ledger)
    stop = threading.Event()
    out = {}
    loop = threading.Thread(
        target=lambda: out.update(
            run_learner(
                server, learner, 20, weights={"w": w}, stop=stop, checkpointer=ckpt, max_seconds=60
            )
        )
    )
    loop.start()
    try:
        with rg.ReplayClient(server.address, actor_id="a") as client:
            client.add_batch({"id": np.arange(100), "x": np.ones((100, 2), np.float32)})
            client.flush(timeout=30)
            got = None
            for _ in range(600):
                got = client.get_weights()
                if got is not None:
                    break
                stop.wait(0.05)
            assert got is not None
            version, weights = got
            assert version >= 1 and set(weights) == {"w"}
    finally:
        stop.set()
        loop.join(60)
        server.stop()
    assert out["inserted"] == 100 and out["steps"] >= 20
    assert learner.table.size == 100
    assert np.all(w.numpy() > 0)  # trained towards x = 1
    assert ckpt.latest is not None
    learner2, _ = make_learner()
    ledger2 = SequenceLedger()
    rg.Checkpointer(tmp_path, learner=learner2, ledger=ledger2).restore()
    assert ledger2.last("a") == 1 and learner2.table.size == 100


def test_run_without_a_stop_condition_is_refused():
    learner, _ = make_learner()
    with pytest.raises(rg.ConfigError, match="nothing would ever stop it"):
        run_learner(None, learner, 10)


def test_run_without_a_server_just_trains_for_max_steps():
    learner, _ = make_learner()
    learner.table.append({"id": np.arange(16), "x": np.ones((16, 2), np.float32)})
    result = run_learner(None, learner, 10, max_steps=30)
    assert result["steps"] == 30 and result["inserted"] == 0


class _SaveWatcher(rg.Checkpointer):
    """A real checkpointer that, on each save, checks whether another thread could commit."""

    def __init__(self, directory, server, **objects):
        super().__init__(directory, **objects)
        self.server = server
        self.commit_ran_during_save = []
        self.committers = []

    def save(self, step=None, **options):
        other = threading.Thread(target=self.server.commit_pending)
        other.start()
        other.join(0.5)  # finishes at once unless the commit lock is held by the saver
        self.commit_ran_during_save.append(not other.is_alive())
        self.committers.append(other)  # (joined after run: it waits for this save's lock)
        return super().save(step, **options)


def test_run_saves_checkpoints_holding_the_commit_lock(tmp_path):
    learner, _ = make_learner()
    learner.table.append({"id": np.arange(16), "x": np.ones((16, 2), np.float32)})
    with rg.serve(learner) as server:
        ckpt = _SaveWatcher(tmp_path, server, learner=learner, ledger=server.ledger)
        run_learner(server, learner, 5, max_steps=10, checkpointer=ckpt, checkpoint_every_s=0.0)
        for committer in ckpt.committers:
            committer.join(30)
    assert ckpt.commit_ran_during_save and not any(ckpt.commit_ran_during_save)


def test_run_reports_the_metrics_of_the_last_call_that_ran_steps():
    table = rg.ReplayTable(SPEC, capacity=64, device="/CPU:0")
    limiter = rg.SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=8)

    def update_fn(batch):
        return {"loss": tf.reduce_mean(batch["x"])}

    sampler = rg.Sampler(table, seed=0)
    learner = rg.Learner(table, sampler, update_fn, batch_size=8, rate_limiter=limiter)
    table.append({"id": np.arange(16), "x": np.ones((16, 2), np.float32)})
    assert learner.train(1)["steps"] == 1  # traced; the limiter allows one more step
    result = run_learner(None, learner, 10, max_seconds=0.5)  # one call runs it, then none
    assert result["steps"] == 1 and result["train_calls"] == 1
    assert result["loss"] == 1.0


def _threads(name):
    return [t for t in threading.enumerate() if t.name == name]


def test_serving_a_learner_twice_is_refused_and_starts_no_thread():
    learner, _ = make_learner()
    with rg.serve(learner):
        before = threading.enumerate()
        with pytest.raises(rg.ConfigError, match="already being served"):
            rg.serve(learner)
        with pytest.raises(rg.ConfigError, match="already being served"):
            rg.serve(learner.table)  # nor its table alone
        assert threading.enumerate() == before
    with rg.serve(learner):  # served again once the first server stopped
        pass


def test_a_served_learner_has_no_committer_thread_and_a_bare_table_has_one():
    learner, _ = make_learner()
    with rg.serve(learner):
        assert _threads("replaygpu-committer") == []
    with rg.serve(learner.table):
        assert len(_threads("replaygpu-committer")) == 1
    assert _threads("replaygpu-committer") == []


def test_a_served_learners_appends_land_only_when_its_training_loop_steps():
    learner, _ = make_learner()
    with rg.serve(learner) as server, rg.ReplayClient(server.address, actor_id="a") as client:
        client.add_batch({"id": np.arange(40), "x": np.ones((40, 2), np.float32)})
        deadline = time.monotonic() + 30
        while client.info().staged_batches == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)  # staged and acknowledged by nobody: no thread writes the table
        assert learner.table.size == 0 and client.acked_transitions == 0
        out = learner_step(server, learner, 5)  # commits on this thread, then trains
        assert out["inserted"] == 40 and out["steps"] == 5 and learner.table.size == 40
        client.flush(timeout=30)
        assert client.acked_transitions == 40


def test_step_refuses_a_server_that_serves_something_else():
    learner, _ = make_learner()
    other, _ = make_learner()
    with rg.serve(other) as server:
        with pytest.raises(rg.ConfigError, match="serves another learner"):
            learner_step(server, learner, 1)
        with pytest.raises(rg.ConfigError, match="serves another learner"):
            run_learner(server, learner, 1, max_steps=1)


def test_a_save_from_another_thread_gets_its_turn_while_the_loop_trains(tmp_path):
    learner, _ = make_learner()
    learner.table.append({"id": np.arange(16), "x": np.ones((16, 2), np.float32)})
    stop = threading.Event()
    with rg.serve(learner) as server:
        loop = threading.Thread(
            target=run_learner, args=(server, learner, 1), kwargs={"stop": stop}
        )
        loop.start()  # back-to-back one-step train calls, each holding the commit lock
        try:
            deadline = time.monotonic() + 60
            while int(learner.steps.numpy()) < 3:  # training: traced, and calls back to back
                assert time.monotonic() < deadline, "the loop trained no 3 steps in 60 s"
                time.sleep(0.01)
            ckpt = rg.Checkpointer(tmp_path, learner=learner, ledger=server.ledger)
            began = time.monotonic()
            saver = threading.Thread(target=server.save, args=(ckpt,))
            saver.start()
            saver.join(20)
            assert not saver.is_alive() and ckpt.latest is not None
            assert time.monotonic() - began < 20
        finally:
            stop.set()
            loop.join(30)


def test_stopping_a_served_learner_leaves_late_batches_to_be_resent_not_acked_unsaved(tmp_path):
    learner, _ = make_learner()
    config = ClientConfig(retry_initial_s=0.05, retry_max_s=0.2)
    server = rg.serve(learner, "127.0.0.1:0")
    ckpt = rg.Checkpointer(tmp_path, learner=learner, ledger=server.ledger)
    client = rg.ReplayClient(server.address, actor_id="late", config=config)
    run_learner(server, learner, 5, max_steps=0, checkpointer=ckpt)  # final checkpoint
    client.add_batch({"id": np.arange(8), "x": np.ones((8, 2), np.float32)})
    deadline = time.monotonic() + 30
    while client.info().staged_batches == 0:  # staged after the final checkpoint
        assert time.monotonic() < deadline
        time.sleep(0.01)
    address = server.address
    server.stop()
    assert learner.table.size == 0 and client.acked_transitions == 0  # not acked, not written
    # the learner restarts from its checkpoint on the same address; the client resends
    learner2, _ = make_learner()
    ledger2 = SequenceLedger()
    rg.Checkpointer(tmp_path, learner=learner2, ledger=ledger2).restore()
    with rg.serve(learner2, address, ledger=ledger2) as server2:
        stop = threading.Event()
        loop = threading.Thread(
            target=run_learner, args=(server2, learner2, 5), kwargs={"stop": stop}
        )
        loop.start()
        try:
            client.flush(timeout=30)
        finally:
            stop.set()
            loop.join(30)
            client.close()
    assert client.acked_transitions == 8 and learner2.table.size == 8


def test_a_client_restarted_under_its_id_continues_after_its_batches_still_staged():
    # A dead actor's last batches can sit in the staging queue when its successor (same id)
    # asks Info where to continue; reusing those seqs would get the new batches dropped as
    # replays although acknowledged. Info counts staged seqs, so the successor starts past them.
    learner, _ = make_learner()
    with rg.serve(learner) as server:
        config = ClientConfig(max_batch_transitions=4)  # one request (seq) per add_batch
        first = rg.ReplayClient(server.address, actor_id="actor-0", config=config)
        for start in (0, 4, 8):
            first.add_batch({"id": np.arange(start, start + 4), "x": np.zeros((4, 2), np.float32)})
        deadline = time.monotonic() + 10
        while server.stats()["staged_batches"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.stats()["staged_batches"] == 3 and server.ledger.last("actor-0") == 0
        first.close(flush=False)  # the process dies; its 3 batches are staged, not committed

        with rg.ReplayClient(server.address, actor_id="actor-0") as second:
            assert second.info().actor_last_seq == 3
            second.add_batch({"id": np.arange(12, 16), "x": np.zeros((4, 2), np.float32)})
            flushed = threading.Thread(target=second.flush, kwargs={"timeout": 30})
            flushed.start()
            while flushed.is_alive():
                learner_step(server, learner, 0, idle_wait_s=0.05)
            flushed.join()
        assert server.ledger.last("actor-0") == 4
    ids = np.sort(learner.table.storage["id"].numpy()[: learner.table.size])
    assert ids.tolist() == list(range(16))  # nothing dropped, nothing twice
