"""The replay server over a real gRPC connection on 127.0.0.1: validation, exactly-once,
limits, auth, TLS, health and reflection."""

import datetime
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc

import replaygpu as rg
from replaygpu.errors import BatchError
from replaygpu.service.config import ClientConfig, ServerConfig
from replaygpu.service.ops.auth import TLSConfig
from replaygpu.service.server.ledger import SequenceLedger
from replaygpu.service.wire.append_request import encode_append_request
from replaygpu.service.wire.status import AuthenticationError, TableNotFoundError, TLSError
from replaygpu.v1 import replay_pb2, replay_pb2_grpc

SPEC = {
    "id": tf.TensorSpec([], tf.int64),
    "obs": tf.TensorSpec([3], tf.float32),
    "done": tf.TensorSpec([], tf.bool),
}


def columns(ids):
    ids = np.asarray(ids, np.int64)
    return {
        "id": ids,
        "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32),
        "done": ids % 2 == 0,
    }


@pytest.fixture(scope="module")
def table():
    table = rg.ReplayTable(SPEC, capacity=4096, device="/CPU:0")
    table.append(columns([0]))  # trace the append graph once for the whole module
    return table


@pytest.fixture
def empty_table(table):
    for var in (table.cursor, table.size_var, table.inserted_var):
        var.assign(0)
    return table


def stored_ids(table):
    return np.sort(table.storage["id"].numpy()[: table.size])


def append_request(seq, cols, actor="raw", table="replay"):
    return replay_pb2.AppendRequest.FromString(encode_append_request(table, actor, seq, cols))


def learner_over(table):
    """A learner over ``table``: serving it, nothing commits until its training loop (the test,
    calling ``server.commit_pending()``) does."""
    return rg.Learner(table, rg.Sampler(table, seed=0), lambda batch: {}, batch_size=1)


def stub_for(server):
    channel = grpc.insecure_channel(server.address)
    return channel, replay_pb2_grpc.ReplayServiceStub(channel)


def test_a_batch_with_one_bad_field_is_rejected_naming_it_and_writes_nothing(empty_table):
    with rg.serve(empty_table) as server:
        channel, stub = stub_for(server)
        bad = columns([1, 2])
        bad["obs"] = bad["obs"].astype(np.float64)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Append(iter([append_request(1, bad)])))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "field 'obs': expected dtype float32" in err.value.details()
        assert "got dtype float64" in err.value.details()
        wrong_shape = columns([1, 2])
        wrong_shape["obs"] = wrong_shape["obs"][:, :2]
        with pytest.raises(grpc.RpcError, match=r"expected shape \[None, 3\]"):
            list(stub.Append(iter([append_request(1, wrong_shape)])))
        assert empty_table.size == 0 and empty_table.total_inserted == 0
        channel.close()


def test_bytes_that_are_not_an_append_request_are_invalid_and_write_nothing(empty_table):
    with rg.serve(empty_table) as server:
        channel = grpc.insecure_channel(server.address)
        append = channel.stream_stream(
            "/replaygpu.v1.ReplayService/Append", request_serializer=lambda b: b
        )
        good = encode_append_request("replay", "raw", 1, columns([1, 2]))
        with pytest.raises(grpc.RpcError) as err:
            list(append(iter([good[:-3]])))  # truncated inside the last tensor
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a valid message" in err.value.details()
        assert empty_table.size == 0 and empty_table.total_inserted == 0
        channel.close()


def test_a_replayed_seq_is_acknowledged_but_not_inserted(empty_table):
    with rg.serve(empty_table) as server:
        channel, stub = stub_for(server)
        acks = list(stub.Append(iter([append_request(1, columns([5, 6]))] * 2)))
        # One ack each; the replay's may come first (it is acked as soon as seq 1 is committed).
        got = sorted((a.seq, a.duplicate, a.transitions) for a in acks)
        assert got == [(1, False, 2), (1, True, 0)]
        assert empty_table.size == 2
        assert server.ledger.last("raw") == 1
        channel.close()


def test_an_unknown_table_is_not_found_and_the_message_lists_the_tables(empty_table):
    with rg.serve(empty_table) as server:
        channel, stub = stub_for(server)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Append(iter([append_request(1, columns([1]), table="nope")])))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no table named 'nope'. Found: replay" in err.value.details()
        with pytest.raises(TableNotFoundError, match="Found: replay"):
            rg.ReplayClient(server.address, table="nope")
        channel.close()


def test_an_oversize_message_is_resource_exhausted_naming_the_limit(empty_table):
    config = ServerConfig(max_message_bytes=2**16)
    with rg.serve(empty_table, config=config) as server:
        channel, stub = stub_for(server)
        big = columns(np.arange(4000))  # about 68 KB
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Append(iter([append_request(1, big)])))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over max_message_bytes=65536" in err.value.details()
        assert "replaygpu-retryable" not in dict(err.value.trailing_metadata())  # permanent
        assert empty_table.size == 0
        channel.close()


def test_a_full_staging_queue_answers_resource_exhausted_naming_the_limit(empty_table):
    config = ServerConfig(staging_max_batches=1, staging_timeout_s=0.2)
    # a served learner's table is committed by its training loop only: here, by the test
    with rg.serve(learner_over(empty_table), config=config) as server:
        channel, stub = stub_for(server)
        requests = [append_request(s, columns([s])) for s in (1, 2)]
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Append(iter(requests)))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "staging_max_batches=1" in err.value.details()
        assert "staging_timeout_s=0.2" in err.value.details()
        assert ("replaygpu-retryable", "1") in err.value.trailing_metadata()  # transient
        assert server.commit_pending() == 1  # the first batch was staged and commits whole
        assert stored_ids(empty_table).tolist() == [1]
        channel.close()


@pytest.mark.parametrize("token", [None, "wrong"])
def test_each_rpc_without_the_right_token_is_unauthenticated(empty_table, token):
    with rg.serve(empty_table, token="s3cret") as server:
        channel = grpc.insecure_channel(server.address)
        stub = replay_pb2_grpc.ReplayServiceStub(channel)
        md = (("authorization", f"Bearer {token}"),) if token else ()
        calls = {
            "Append": lambda: list(
                stub.Append(iter([append_request(1, columns([1]))]), metadata=md)
            ),
            "GetWeights": lambda: stub.GetWeights(replay_pb2.GetWeightsRequest(), metadata=md),
            "Info": lambda: stub.Info(replay_pb2.InfoRequest(), metadata=md),
        }
        for name, call in calls.items():
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        with pytest.raises(AuthenticationError, match="UNAUTHENTICATED"):
            rg.ReplayClient(server.address, token=token)
        # health stays open for probes
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest()).status == 1
        with rg.ReplayClient(server.address, token="s3cret") as client:
            client.add_batch(columns([3, 4]))
            client.flush(timeout=30)
        assert stored_ids(empty_table).tolist() == [3, 4]
        assert empty_table.size == 2
        channel.close()


def test_health_is_serving_then_not_serving_through_shutdown(empty_table):
    server = rg.serve(empty_table)
    channel = grpc.insecure_channel(server.address)
    health = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service="replaygpu.v1.ReplayService")
    assert health.Check(request).status == health_pb2.HealthCheckResponse.SERVING
    seen = []
    watching = threading.Event()

    def watch():
        try:
            for reply in health.Watch(request):
                seen.append(reply.status)
                watching.set()
        except grpc.RpcError:
            pass

    watcher = threading.Thread(target=watch)
    watcher.start()
    assert watching.wait(10)
    server.stop(grace=1.0)
    watcher.join(10)
    assert seen[0] == health_pb2.HealthCheckResponse.SERVING
    assert health_pb2.HealthCheckResponse.NOT_SERVING in seen
    with pytest.raises(grpc.RpcError) as err:
        health.Check(request, timeout=2)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()


def test_reflection_lists_the_replay_and_health_services(empty_table):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with rg.serve(empty_table) as server:
        channel = grpc.insecure_channel(server.address)
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(iter(stub.ServerReflectionInfo(iter([request]))))
        names = {s.name for s in reply.list_services_response.service}
        assert {"replaygpu.v1.ReplayService", "grpc.health.v1.Health"} <= names
        channel.close()


def test_four_concurrent_actors_land_every_transition_exactly_once(empty_table):
    per_actor, errors = 600, []
    with rg.serve(empty_table) as server:
        config = ClientConfig(max_batch_transitions=64, max_delay_s=0.01)

        def actor(k):
            try:
                with rg.ReplayClient(server.address, actor_id=f"a{k}", config=config) as client:
                    ids = np.arange(per_actor) + k * per_actor
                    client.add_batch(columns(ids[:300]))
                    for i in ids[300:]:
                        client.add({"id": i, "obs": [i, i, i], "done": bool(i % 2 == 0)})
            except Exception as err:
                errors.append(err)

        threads = [threading.Thread(target=actor, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert empty_table.total_inserted == 4 * per_actor
        assert stored_ids(empty_table).tolist() == list(range(4 * per_actor))
        obs = empty_table.storage["obs"].numpy()[: empty_table.size]
        ids = empty_table.storage["id"].numpy()[: empty_table.size]
        np.testing.assert_array_equal(obs[:, 0], ids.astype(np.float32))
        assert server.ledger.snapshot() == {f"a{k}": server.ledger.last(f"a{k}") for k in range(4)}


def test_restart_from_checkpoint_mid_stream_keeps_every_transition_exactly_once(tmp_path):
    total = 3000
    table = rg.ReplayTable(SPEC, capacity=4096, device="/CPU:0")
    ledger = SequenceLedger()
    server = rg.serve(table, ledger=ledger)
    address = server.address
    config = ClientConfig(max_batch_transitions=50, retry_initial_s=0.02, retry_max_s=0.2)
    client = rg.ReplayClient(address, actor_id="actor-7", config=config)
    client.add_batch(columns(np.arange(1000)))
    client.flush(timeout=30)  # acknowledged
    client.add_batch(columns(np.arange(1000, total)))  # in flight while the server stops
    server.stop(grace=0.5)  # staged batches commit, later ones are refused with UNAVAILABLE
    rg.Checkpointer(tmp_path, table=table, ledger=ledger).save()
    before = table.size
    assert 1000 <= before <= total

    table2 = rg.ReplayTable(SPEC, capacity=4096, device="/CPU:0")
    ledger2 = SequenceLedger()
    assert rg.Checkpointer(tmp_path, table=table2, ledger=ledger2).restore() is not None
    assert table2.size == before
    server2 = rg.serve(table2, address=address, ledger=ledger2)  # same port: clients retry
    try:
        client.flush(timeout=60)  # resends what was not acknowledged; the ledger drops replays
        client.close()
        assert stored_ids(table2).tolist() == list(range(total))
        assert table2.total_inserted == total
    finally:
        server2.stop()


def test_tls_with_certificate_files_on_both_sides(empty_table, tmp_path):
    pytest.importorskip("cryptography", reason="the cryptography package makes the test cert")
    cert, key = _self_signed(tmp_path)
    server_tls = TLSConfig(cert_file=cert, key_file=key)
    with rg.serve(empty_table, address="127.0.0.1:0", tls=server_tls) as server:
        client_tls = TLSConfig(ca_file=cert, server_name="localhost")
        with rg.ReplayClient(server.address, tls=client_tls) as client:
            client.add_batch(columns([11, 12]))
            client.flush(timeout=30)
        assert stored_ids(empty_table).tolist() == [11, 12]
        with pytest.raises(TLSError):  # plaintext to a TLS port
            rg.ReplayClient(server.address, config=ClientConfig(retry_deadline_s=0.5))


def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


class _CheckedTable(rg.ReplayTable):
    """A table that refuses negative ids (a content check of the user's own) and whose first
    ``failing_writes`` writes fail as a broken device write would."""

    def __init__(self, failing_writes=0):
        super().__init__(SPEC, capacity=256, device="/CPU:0")
        self.failing_writes = failing_writes

    def append(self, batch):
        if np.any(np.asarray(batch["id"]) < 0):
            raise BatchError("field 'id': negative ids are refused", field="id")
        if self.failing_writes:
            self.failing_writes -= 1
            raise tf.errors.InternalError(None, None, "device write failed")
        return super().append(batch)


def test_a_request_the_table_refuses_is_raised_once_and_later_requests_still_land():
    # consecutive add_batch calls are packed into requests of max_batch_transitions rows; a
    # request is what the server accepts or refuses, so both rows of seq 2 are dropped
    table = _CheckedTable()
    config = ClientConfig(
        max_batch_transitions=2, max_delay_s=10.0, retry_initial_s=0.02, retry_deadline_s=5.0
    )
    with rg.serve(table) as server:
        client = rg.ReplayClient(server.address, actor_id="c", config=config)
        client.add_batch(columns([1, 2]))  # seq 1
        client.add_batch(columns([-3]))  # seq 2, refused by the table ...
        client.add_batch(columns([4]))  # ... with this row packed into it
        client.add_batch(columns([5, 6]))  # seq 3
        with pytest.raises(
            BatchError,
            match="seq 2: field 'id': negative ids are refused; its 2 transitions were dropped",
        ):
            client.flush(timeout=30)
        client.flush(timeout=30)  # seq 3 is not held back behind the refused seq 2
        client.add_batch(columns([7]))
        client.close()
        assert server.ledger.last("c") == 4
    assert stored_ids(table).tolist() == [1, 2, 5, 6, 7]


def test_a_failed_table_write_is_resent_by_the_client_and_lands_once():
    table = _CheckedTable(failing_writes=2)
    config = ClientConfig(
        max_batch_transitions=2, max_delay_s=10.0, retry_initial_s=0.02, retry_deadline_s=10.0
    )
    with rg.serve(table) as server:
        with rg.ReplayClient(server.address, actor_id="f", config=config) as client:
            client.add_batch(columns([1, 2]))
            client.add_batch(columns([3]))
            client.flush(timeout=30)
        assert server.ledger.last("f") == 2 and table.failing_writes == 0
    assert stored_ids(table).tolist() == [1, 2, 3]
    assert table.total_inserted == 3


class _FlakyLedger(SequenceLedger):
    """A ledger whose first ``failing_writes`` checkpoint-variable writes fail."""

    def __init__(self, failing_writes):
        super().__init__()
        self.failing_writes = failing_writes

    def write(self):
        if self.failing_writes:
            self.failing_writes -= 1
            raise tf.errors.InternalError(None, None, "ledger variable write failed")
        super().write()


def test_a_failed_ledger_write_answers_unavailable_and_the_resent_batch_lands_once(empty_table):
    ledger = _FlakyLedger(failing_writes=1)
    config = ClientConfig(max_delay_s=10.0, retry_initial_s=0.02, retry_deadline_s=10.0)
    with rg.serve(empty_table, ledger=ledger) as server:
        with rg.ReplayClient(server.address, actor_id="l", config=config) as client:
            client.add_batch(columns([1, 2]))
            client.flush(timeout=30)  # hangs without an answer to the failed commit round
            client.add_batch(columns([3]))
            client.flush(timeout=30)
        assert ledger.failing_writes == 0 and server.ledger.last("l") == 2
    assert stored_ids(empty_table).tolist() == [1, 2, 3]


class _SaveWatcher(rg.Checkpointer):
    """A real checkpointer that, inside each save, says it is in it (``saving``), waits until
    ``staged()`` and a while after, and records the table size before and after the wait (a
    commit in between would change it)."""

    def __init__(self, directory, table, staged, **objects):
        super().__init__(directory, table=table, **objects)
        self.sizes = []
        self.saving = threading.Event()
        self._staged = staged

    def save(self, step=None, **options):
        before = self.table.size
        self.saving.set()
        deadline = time.monotonic() + 30
        while not self._staged():
            assert time.monotonic() < deadline, "nothing was staged in 30 s"
            time.sleep(0.01)
        time.sleep(0.5)  # the time a background commit of it would take
        self.sizes.append((before, self.table.size))
        return super().save(step, **options)


def test_save_holds_back_background_commits_until_the_checkpoint_is_written(empty_table, tmp_path):
    config = ClientConfig(max_delay_s=0.01)
    with rg.serve(empty_table) as server, rg.ReplayClient(server.address, config=config) as client:
        staged = lambda: server.stats()["staged_batches"] > 0  # noqa: E731
        ckpt = _SaveWatcher(tmp_path, empty_table, staged, ledger=server.ledger)
        saver = threading.Thread(target=server.save, args=(ckpt,))
        saver.start()
        assert ckpt.saving.wait(30)  # the save holds the commit lock now
        client.add_batch(columns([1, 2, 3]))
        saver.join(60)
        assert ckpt.sizes == [(0, 0)]  # the batch was staged, but not committed mid-save
        client.flush(timeout=30)
        assert stored_ids(empty_table).tolist() == [1, 2, 3]


def test_the_ledger_forgets_the_actor_idle_longest_past_max_actors(empty_table, tmp_path, caplog):
    ledger = SequenceLedger(max_actors=2)
    with rg.serve(empty_table, ledger=ledger) as server:
        channel, stub = stub_for(server)
        for k, actor in enumerate(["a", "b", "a", "c"]):
            list(stub.Append(iter([append_request(k + 1, columns([k]), actor=actor)])))
        channel.close()
    assert ledger.snapshot() == {"a": 3, "c": 4}  # b committed least recently
    assert "forgot actor 'b' (last seq 2)" in caplog.text
    assert stored_ids(empty_table).tolist() == [0, 1, 2, 3]
    rg.Checkpointer(tmp_path, ledger=ledger).save()
    restored = SequenceLedger(max_actors=2)
    rg.Checkpointer(tmp_path, ledger=restored).restore()
    restored.sync()  # (as serve does)
    restored.advance("d", 1)  # the saved order is kept: a is now the one idle longest
    assert restored.snapshot() == {"c": 4, "d": 1}
    with pytest.raises(rg.ConfigError, match="max_actors: got 0"):
        SequenceLedger(max_actors=0)


def test_a_second_server_on_a_bound_port_fails_instead_of_sharing_it():
    spec = {"x": tf.TensorSpec([], tf.float32)}
    first = rg.serve(rg.ReplayTable(spec, 10, name="a"), "127.0.0.1:0")
    try:
        # gRPC's default SO_REUSEPORT would let both listen and split the actors between them
        with pytest.raises(rg.ConfigError, match=first.address.rsplit(":", 1)[1]):
            rg.serve(rg.ReplayTable(spec, 10, name="b"), first.address)
    finally:
        first.stop()


def test_serving_freezes_the_long_lived_objects_unless_told_not_to(empty_table):
    import gc

    gc.unfreeze()
    with rg.serve(empty_table, config=ServerConfig(freeze_gc=False)):
        assert gc.get_freeze_count() == 0
    with rg.serve(empty_table):  # full collections during ingest skip what exists now
        assert gc.get_freeze_count() > 10_000
