"""ReplayClient against a real server on 127.0.0.1: dtypes, buffering, backpressure, weights."""

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.errors import BatchError
from replaygpu.fields import DTYPE_NAMES, numpy_dtype
from replaygpu.learner.ratio import SampleToInsertRule
from replaygpu.service.config import ClientConfig, ServerConfig
from replaygpu.service.server.loop import step as learner_step
from replaygpu.service.wire.status import ServiceError

ALL_DTYPES = [d for d in DTYPE_NAMES]


def test_importing_the_client_does_not_import_tensorflow():
    code = (
        "import sys\n"
        "import replaygpu\n"
        "from replaygpu.service.actor.client import ReplayClient\n"
        "import replaygpu.errors, replaygpu.service.config, replaygpu.service.ops.auth\n"
        "replaygpu.ReplayClient, replaygpu.ConfigError, replaygpu.__version__\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow')\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _values(name, n):
    dtype = numpy_dtype(name)
    rng = np.random.default_rng(1)
    shape = (n, 2, 3)
    if name == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def test_every_dtype_a_spec_may_hold_round_trips_exactly_into_the_table():
    spec = {f"f_{name}": tf.TensorSpec([2, 3], tf.as_dtype(name)) for name in ALL_DTYPES}
    table = rg.ReplayTable(spec, capacity=64, device="/CPU:0")
    columns = {f"f_{name}": _values(name, 10) for name in ALL_DTYPES}
    with rg.serve(table) as server, rg.ReplayClient(server.address, actor_id="dt") as client:
        assert client.spec["f_uint16"] == ("uint16", (2, 3))
        client.add_batch(columns)
        client.flush(timeout=30)
    assert table.size == 10
    for name, want in columns.items():
        got = table.read(name, tf.range(10, dtype=tf.int64)).numpy()
        assert got.dtype == want.dtype, name
        assert got.tobytes() == want.tobytes(), name


SPEC = {"id": tf.TensorSpec([], tf.int64), "obs": tf.TensorSpec([4], tf.float32)}


@pytest.fixture(scope="module")
def table():
    table = rg.ReplayTable(SPEC, capacity=2048, device="/CPU:0")
    table.append({"id": np.zeros(1, np.int64), "obs": np.zeros((1, 4), np.float32)})
    return table


@pytest.fixture
def empty_table(table):
    for var in (table.cursor, table.size_var, table.inserted_var):
        var.assign(0)
    return table


def ids_of(table):
    return np.sort(table.storage["id"].numpy()[: table.size]).tolist()


def test_add_converts_values_that_fit_and_rejects_the_rest_without_adding(empty_table):
    with rg.serve(empty_table) as server, rg.ReplayClient(server.address) as client:
        client.add({"id": 1, "obs": [0.5, 1, 2, 3]})
        client.add({"id": np.int32(2), "obs": np.full(4, 0.25, np.float64)})  # both fit
        with pytest.raises(
            BatchError, match=r"field 'obs': expected dtype float32.* 1e\+39 at \[0\]"
        ):
            client.add({"id": 3, "obs": np.full(4, 1e39)})
        with pytest.raises(BatchError, match=r"field 'obs': expected shape \[4\], got \[3\]"):
            client.add({"id": 2, "obs": [1.0, 2.0, 3.0]})
        with pytest.raises(BatchError, match="missing 'obs'"):
            client.add({"id": 2})
        with pytest.raises(BatchError, match=r"field 'id': expected dtype int64.* 0.5 at \[0\]"):
            client.add_batch({"id": np.full(2, 0.5), "obs": np.zeros((2, 4), np.float32)})
        client.flush(timeout=30)
    assert ids_of(empty_table) == [1, 2]
    np.testing.assert_array_equal(empty_table.storage["obs"].numpy()[:2, 0], [0.5, 0.25])


def test_add_refuses_python_numbers_that_do_not_fit_the_field_exactly(empty_table):
    mixed = rg.ReplayTable(
        {
            "a": tf.TensorSpec([], tf.int32),
            "d": tf.TensorSpec([], tf.bool),
            "r": tf.TensorSpec([], tf.float32),
        },
        8,
        device="/CPU:0",
    )
    with rg.serve(mixed) as server, rg.ReplayClient(server.address) as client:
        for field, value in [("a", 1.7), ("a", True), ("a", 2**40), ("d", 2), ("r", 1e40)]:
            row = {"a": 1, "d": False, "r": 0.5, field: value}
            with pytest.raises(BatchError, match=rf"field '{field}': expected dtype"):
                client.add(row)
        client.add({"a": 2, "d": True, "r": 3})  # an int reward fits float32
        client.flush(timeout=30)
    assert mixed.size == 1
    assert mixed.storage["r"].numpy()[0] == 3.0 and mixed.storage["d"].numpy()[0]


def test_buffer_is_sealed_after_max_delay_without_flush(empty_table):
    config = ClientConfig(max_batch_transitions=1000, max_delay_s=0.05)
    with rg.serve(empty_table) as server, rg.ReplayClient(server.address, config=config) as client:
        client.add({"id": 7, "obs": np.ones(4, np.float32)})
        deadline = time.monotonic() + 10
        while empty_table.size == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ids_of(empty_table) == [7]


def learner_over(table):
    """A learner over ``table``: serving it, nothing commits until its training loop (the test,
    calling ``server.commit_pending()``) does."""
    return rg.Learner(table, rg.Sampler(table, seed=0), lambda batch: {}, batch_size=1)


def test_add_blocks_while_the_buffer_is_full_and_resumes_after_commits(empty_table):
    config = ClientConfig(max_batch_transitions=10, max_buffer_bytes=600)  # ~5 requests
    with rg.serve(learner_over(empty_table)) as server:
        client = rg.ReplayClient(server.address, config=config)
        done = threading.Event()

        def produce():
            for start in range(0, 200, 10):
                ids = np.arange(start, start + 10)
                client.add_batch({"id": ids, "obs": np.zeros((10, 4), np.float32)})
            done.set()

        producer = threading.Thread(target=produce)
        producer.start()
        time.sleep(0.5)
        assert not done.is_set()  # blocked: nothing is committed, the buffer is full
        while not done.wait(0.05):
            server.commit_pending()
        producer.join()
        while empty_table.size < 200:
            server.commit_pending()
            time.sleep(0.01)
        client.flush(timeout=30)
        client.close()
    assert ids_of(empty_table) == list(range(200))


def test_a_restarted_client_continues_after_its_last_committed_seq(empty_table):
    with rg.serve(empty_table) as server:
        with rg.ReplayClient(server.address, actor_id="same") as client:
            client.add_batch({"id": np.arange(3), "obs": np.zeros((3, 4), np.float32)})
        with rg.ReplayClient(server.address, actor_id="same") as client:
            client.add_batch({"id": np.arange(3, 5), "obs": np.zeros((2, 4), np.float32)})
        assert server.ledger.last("same") == 2
    assert ids_of(empty_table) == [0, 1, 2, 3, 4]


def test_close_joins_the_client_threads(empty_table):
    before = {t.name for t in threading.enumerate()}
    with rg.serve(empty_table) as server:
        client = rg.ReplayClient(server.address)
        client.close()
        client.close()  # idempotent
    left = {t.name for t in threading.enumerate()} - before
    assert not any(name.startswith("replaygpu-client") for name in left)


def test_get_weights_returns_none_until_published_then_the_published_structure(empty_table):
    def update_fn(batch):
        return {"loss": tf.reduce_mean(batch["obs"])}

    sampler = rg.Sampler(empty_table, seed=0)
    learner = rg.Learner(empty_table, sampler, update_fn, batch_size=4)
    with rg.serve(learner) as server, rg.ReplayClient(server.address) as client:
        assert client.get_weights() is None
        w = tf.Variable(tf.ones([2, 3]))
        assert learner.publish_weights({"w": w, "b": np.arange(3.0)}) == 1
        version, weights = client.get_weights(newer_than=0)
        assert version == 1 and list(weights) == ["w", "b"]
        np.testing.assert_array_equal(weights["w"], np.ones([2, 3], np.float32))
        assert client.get_weights(newer_than=1) is None
        assert learner.publish_weights([w]) == 2
        version, weights = client.get_weights(newer_than=1)
        assert version == 2 and isinstance(weights, list) and weights[0].shape == (2, 3)
        assert client.info().weights_version == 2


def _learner(table):
    def update_fn(batch):
        return {"loss": tf.reduce_mean(batch["obs"])}

    return rg.Learner(table, rg.Sampler(table, seed=0), update_fn, batch_size=4)


def test_weight_versions_continue_after_a_learner_restarts_from_its_checkpoint(
    empty_table, tmp_path
):
    learner = _learner(empty_table)
    for value in (1.0, 2.0, 3.0):
        learner.publish_weights([np.full(2, value, np.float32)])
    rg.Checkpointer(tmp_path, learner=learner).save()

    restarted = _learner(empty_table)  # a new learner process, restored
    assert rg.Checkpointer(tmp_path, learner=restarted).restore() is not None
    with rg.serve(restarted) as server, rg.ReplayClient(server.address) as client:
        assert client.info().weights_version == 3
        assert client.get_weights(newer_than=3) is None  # nothing published since the restart
        assert restarted.publish_weights([np.full(2, 4.0, np.float32)]) == 4
        version, weights = client.get_weights(newer_than=3)
        assert version == 4 and weights[0].tolist() == [4.0, 4.0]


def test_an_actor_ahead_of_a_restarted_learner_gets_its_weights_with_the_lower_version(
    empty_table,
):
    learner = _learner(empty_table)  # restarted without a checkpoint: versions start at 1
    with rg.serve(learner) as server, rg.ReplayClient(server.address) as client:
        assert client.get_weights(newer_than=7) is None  # nothing published yet
        learner.publish_weights([np.zeros(2, np.float32)])
        learner.publish_weights([np.ones(2, np.float32)])
        version, weights = client.get_weights(newer_than=7)  # held version 7 of the old run
        assert version == 2 and weights[0].tolist() == [1.0, 1.0]
        assert client.get_weights(newer_than=version) is None


def test_a_full_staging_queue_delays_batches_but_loses_none(empty_table):
    server_config = ServerConfig(staging_max_batches=1, staging_timeout_s=0.1)
    config = ClientConfig(max_batch_transitions=5, retry_initial_s=0.02, retry_max_s=0.1)
    with rg.serve(learner_over(empty_table), config=server_config) as server:
        with rg.ReplayClient(server.address, actor_id="slow", config=config) as client:
            client.add_batch({"id": np.arange(20), "obs": np.zeros((20, 4), np.float32)})
            deadline = time.monotonic() + 30  # nothing commits: later requests time out
            while server.append_answers()["RESOURCE_EXHAUSTED"] == 0:  # in staging
                assert time.monotonic() < deadline, "no request timed out in staging in 30 s"
                time.sleep(0.02)
            deadline = time.monotonic() + 30
            while empty_table.size < 20 and time.monotonic() < deadline:
                server.commit_pending()
                time.sleep(0.02)
            client.flush(timeout=30)
        assert server.ledger.last("slow") == 4
    assert ids_of(empty_table) == list(range(20))


def test_an_oversize_request_is_raised_to_the_caller_not_retried(empty_table):
    server_config = ServerConfig(max_message_bytes=2**12)
    config = ClientConfig(max_batch_transitions=1000, max_delay_s=10.0)
    with rg.serve(empty_table, config=server_config) as server:
        client = rg.ReplayClient(server.address, actor_id="big", config=config)
        client.add_batch({"id": np.arange(200), "obs": np.zeros((200, 4), np.float32)})
        with pytest.raises(ServiceError, match="over max_message_bytes=4096") as err:
            client.flush(timeout=30)
        assert err.value.code.name == "RESOURCE_EXHAUSTED" and not err.value.retryable
        client.close()
    assert empty_table.size == 0


def test_close_with_a_timeout_returns_in_time_when_the_server_is_gone(empty_table):
    server = rg.serve(empty_table)
    config = ClientConfig(retry_deadline_s=60.0)
    client = rg.ReplayClient(server.address, actor_id="gone", config=config)
    server.stop(grace=0)
    client.add_batch({"id": np.arange(3), "obs": np.zeros((3, 4), np.float32)})
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="still unacknowledged"):
        client.close(timeout=1.0)
    assert time.monotonic() - started < 3.0  # not retry_deadline_s
    alive = [t.name for t in threading.enumerate() if t.name.startswith("replaygpu-client")]
    assert not alive


def test_publishing_reads_the_model_when_it_runs_and_refuses_an_empty_source(empty_table):
    learner = learner_over(empty_table)
    model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
    with pytest.raises(rg.ConfigError, match="holds no variables"):
        learner.publish_weights(model)  # not built yet: no variables
    with pytest.raises(rg.ConfigError, match="holds no variables"):
        learner.publish_weights(model.variables)  # the README's old snippet published nothing
    model(np.zeros((1, 3), np.float32))  # built on its first call
    with rg.serve(learner) as server, rg.ReplayClient(server.address) as client:
        assert learner.publish_weights(model) == 1
        version, weights = client.get_weights()
        assert version == 1 and [w.shape for w in weights] == [(3, 2), (2,)]
        model.layers[0].kernel.assign(tf.ones([3, 2]))
        assert learner.publish_weights(lambda: {"kernel": model.layers[0].kernel}) == 2
        version, weights = client.get_weights(newer_than=1)
        assert version == 2 and weights["kernel"].tolist() == [[1.0, 1.0]] * 3
    with pytest.raises(rg.ConfigError, match="expected a Keras model"):
        learner.publish_weights(42)


def test_wait_for_insert_room_follows_the_learners_rate_limit_from_the_servers_counters(
    empty_table,
):
    def update_fn(batch):
        return {"loss": tf.reduce_mean(batch["obs"])}

    # 1 sample per insert, sampling from 10 rows, 4 transitions of slack: with nothing sampled
    # the table may hold 10 + 4 rows before actors wait
    limiter = rg.SampleToInsertRatio(1.0, min_size_to_sample=10, error_buffer=4)
    sampler = rg.Sampler(empty_table, seed=0)
    learner = rg.Learner(empty_table, sampler, update_fn, batch_size=2, rate_limiter=limiter)
    learner.train(0)

    def commit(rows):  # the training loop's commits, without training
        deadline = time.monotonic() + 30
        while client.acked_transitions < rows:
            assert time.monotonic() < deadline
            learner_step(server, learner, 0)
            time.sleep(0.01)

    with rg.serve(learner) as server, rg.ReplayClient(server.address) as client:
        assert client.rate_limit == SampleToInsertRule(1.0, 10, 4.0)
        client.add_batch({"id": np.arange(14), "obs": np.zeros((14, 4), np.float32)})
        assert client.wait_for_insert_room() is False  # nothing committed yet
        commit(14)  # the table holds 14 rows, nothing sampled
        assert client.wait_for_insert_room() is False  # 14 <= 10 + 4: room for 0 more rows
        client.add_batch({"id": np.arange(14, 20), "obs": np.zeros((6, 4), np.float32)})
        commit(20)  # 6 rows over the ceiling
        stop = threading.Event()
        waited = []
        waiter = threading.Thread(target=lambda: waited.append(client.wait_for_insert_room()))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # the learner sampled nothing yet: the actor waits
        out = learner_step(server, learner, 100)  # the limiter allows (20-10+4)/2 = 7 steps
        assert out["steps"] == 7
        waiter.join(10)
        assert not waiter.is_alive() and waited == [True]
        stop.set()
        assert client.wait_for_insert_room(slack=-100, stop=stop) is False  # stopped: no wait


def test_wait_for_insert_room_counts_only_the_rows_the_table_holds(empty_table):
    """Rows in flight (sent, not committed by the learner yet) do not hold an actor back: the
    rule reads the server's counters, as Ape-X measured best (benchmarks/README.md); the server's
    staging bounds what may be in flight."""
    limiter = rg.SampleToInsertRatio(1.0, min_size_to_sample=10, error_buffer=4)
    sampler = rg.Sampler(empty_table, seed=0)
    update = lambda b: {"x": tf.zeros([])}  # noqa: E731
    learner = rg.Learner(empty_table, sampler, update, batch_size=2, rate_limiter=limiter)
    learner.train(0)
    with rg.serve(learner) as server, rg.ReplayClient(server.address) as client:
        client.add_batch({"id": np.arange(20), "obs": np.zeros((20, 4), np.float32)})
        assert client.wait_for_insert_room() is False  # 20 in flight, 0 held <= 10 + 4
        deadline = time.monotonic() + 30
        while empty_table.size < 20:  # the training loop commits what arrived
            assert time.monotonic() < deadline
            learner_step(server, learner, 0)
            time.sleep(0.01)
        waited = []
        waiter = threading.Thread(target=lambda: waited.append(client.wait_for_insert_room()))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # 20 held > 10 + 4 and nothing sampled: it waits
        assert learner_step(server, learner, 100)["steps"] == 7
        waiter.join(10)
        assert not waiter.is_alive() and waited == [True]


def test_sampling_and_inserting_share_one_rule():
    rule = SampleToInsertRule(samples_per_insert=4.0, min_size_to_sample=100, error_buffer=64)
    limiter = rg.SampleToInsertRatio(4.0, min_size_to_sample=100, error_buffer=64)
    for inserted, sampled in [(100, 0), (150, 200), (150, 263), (300, 900), (120, 0)]:
        limiter.sampled.assign(sampled)
        steps = limiter.allowed_steps(tf.constant(inserted, tf.int64), inserted, 8).numpy()
        assert steps == max(0, int(np.floor(rule.sample_room(inserted, sampled) / 8)))
        # the insert side: the band's ceiling is 64 transitions above the floor at 100 rows
        room = rule.insert_room(inserted, sampled)
        assert room == pytest.approx(100 + (64 + sampled) / 4.0 - inserted)
    with pytest.raises(rg.ConfigError, match="samples_per_insert"):
        SampleToInsertRule(0.0, 1, 0.0)


def test_the_client_reads_the_actor_settings_a_learner_announces_unread(empty_table):
    from replaygpu.service.config import AgentSettings

    table = rg.ReplayTable(SPEC, capacity=16, device="/CPU:0")
    with rg.serve(table) as bare, rg.ReplayClient(bare.address, actor_id="s0") as client:
        assert client.actor_settings is None  # a bare serve asks nothing of its actors
    # the library passes the agent's document on as it is: any agent, version and text
    settings = AgentSettings("an-agent", 7, '{"not": ["read", 1.5]}')
    with (
        rg.serve(empty_table, actor_settings=settings) as server,
        rg.ReplayClient(server.address, actor_id="s1") as client,
    ):
        assert client.actor_settings == settings


def test_agent_settings_need_an_agent_and_a_version_of_1_or_more():
    from replaygpu.service.config import AgentSettings

    with pytest.raises(rg.ConfigError, match=r"AgentSettings\.agent: got an empty string"):
        AgentSettings("", 1, "{}")
    with pytest.raises(rg.ConfigError, match=r"AgentSettings\.version: got 0, expected >= 1"):
        AgentSettings("dqn", 0, "{}")


def test_a_call_the_server_cancels_is_an_outage_the_client_retries():
    """A learner stopping (SIGTERM, a restart) cancels the append in flight: the client keeps
    its rows and resends them to the restarted server, as for UNAVAILABLE."""
    from concurrent import futures

    import grpc

    from replaygpu.service.wire.status import ServiceUnavailableError, error_from_rpc

    def cancel(request, context):
        context.abort(grpc.StatusCode.CANCELLED, "Cancelled")

    handler = grpc.method_handlers_generic_handler(
        "probe.Probe", {"Call": grpc.unary_unary_rpc_method_handler(cancel)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(1))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/probe.Probe/Call")
            with pytest.raises(grpc.RpcError) as raised:
                call(b"", timeout=10)
    finally:
        server.stop(None)
    assert raised.value.code() == grpc.StatusCode.CANCELLED
    error = error_from_rpc(raised.value, "127.0.0.1:1")
    assert isinstance(error, ServiceUnavailableError) and error.retryable
    assert str(error).startswith("CANCELLED (server 127.0.0.1:1)")
