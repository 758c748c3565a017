"""TLS and mTLS over real gRPC servers on 127.0.0.1: each handshake failure raises `TLSError` at
once, saying what to change, instead of retrying until the deadline; a server that refuses
connections is still waited for; certificate files are checked when `TLSConfig` is built; the
`replaygpu info` and `replaygpu actor` commands take the same TLS and token flags."""

import datetime
import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.service.config import ClientConfig
from replaygpu.service.ops.auth import TLSConfig
from replaygpu.service.wire.status import AuthenticationError, ServiceUnavailableError, TLSError
from replaygpu.specs import specs_from_env

pytest.importorskip("cryptography", reason="the cryptography package makes the test certificates")

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SPEC = {"id": tf.TensorSpec([], tf.int64)}
CLI = [sys.executable, "-m", "replaygpu.cli"]
#: what "at once" means here: the issue's bar is 2 s, the slack is for a loaded test machine;
#: before the fix these cases waited out retry_deadline_s (60 s below)
FAST_S = 5.0
PATIENT = ClientConfig(retry_deadline_s=60)


# -- certificates -------------------------------------------------------------------------------


def _write_key(path, key):
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(path)


def _certificate(subject, issuer, public_key, signing_key, ca, extensions=()):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=False)
    return builder.sign(signing_key, hashes.SHA256())


class Authority:
    """A CA that issues server and client certificates into ``folder``."""

    def __init__(self, folder, name):
        self.folder, self.name = folder, name
        self.key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(name, name, self.key.public_key(), self.key, ca=True)
        self.cert_file = str(folder / f"{name}.pem")
        (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name, server):
        key = ec.generate_private_key(ec.SECP256R1())
        if server:
            extensions = [
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
            ]
        else:
            extensions = [x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])]
        cert = _certificate(name, self.name, key.public_key(), self.key, False, extensions)
        cert_path = self.folder / f"{name}.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return str(cert_path), _write_key(self.folder / f"{name}-key.pem", key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Certificate files: ``ca`` signs ``server`` and ``client``; ``other_ca`` signs ``rogue``."""
    folder = tmp_path_factory.mktemp("pki")
    ca, other = Authority(folder, "ca"), Authority(folder, "other-ca")
    files = {"ca": ca.cert_file, "other_ca": other.cert_file}
    files["server_cert"], files["server_key"] = ca.issue("server", server=True)
    files["client_cert"], files["client_key"] = ca.issue("client", server=False)
    files["rogue_cert"], files["rogue_key"] = other.issue("rogue", server=False)
    files["stray_key"] = _write_key(
        folder / "stray-key.pem", ec.generate_private_key(ec.SECP256R1())
    )
    return files


# -- servers ------------------------------------------------------------------------------------


def _table(spec=SPEC, capacity=64):
    return rg.ReplayTable(spec, capacity, device="/CPU:0")


@pytest.fixture(scope="module")
def plain_server():
    with rg.serve(_table()) as server:
        yield server


@pytest.fixture(scope="module")
def tls_server(pki):
    with rg.serve(_table(), tls=TLSConfig(pki["server_cert"], pki["server_key"])) as server:
        yield server


@pytest.fixture(scope="module")
def mtls_server(pki):
    """Requires client certificates signed by ``ca`` and the token ``s3cret``."""
    tls = TLSConfig(pki["server_cert"], pki["server_key"], ca_file=pki["ca"])
    with rg.serve(_table(), token="s3cret", tls=tls) as server:
        yield server


def client_tls(pki, ca="ca", cert=None, server_name="localhost"):
    return TLSConfig(
        cert_file=pki[f"{cert}_cert"] if cert else None,
        key_file=pki[f"{cert}_key"] if cert else None,
        ca_file=pki[ca],
        server_name=server_name,
    )


def connect_fails(address, tls, token=None):
    """Connect with a 60 s retry deadline; the TLSError raised and the seconds it took."""
    started = time.monotonic()
    with pytest.raises(TLSError) as raised:
        rg.ReplayClient(address, token=token, tls=tls, config=PATIENT)
    elapsed = time.monotonic() - started
    assert elapsed < FAST_S, f"took {elapsed:.1f} s: {raised.value}"
    assert raised.value.retryable is False
    return str(raised.value)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- failing fast -------------------------------------------------------------------------------


def test_a_client_trusting_another_ca_fails_at_once_saying_it_does_not_trust_the_server(
    pki, tls_server
):
    message = connect_fails(tls_server.address, client_tls(pki, ca="other_ca"))
    assert "does not trust the server's certificate" in message
    assert "`TLSConfig.ca_file`" in message and pki["other_ca"] in message
    assert "CERTIFICATE_VERIFY_FAILED" in message  # gRPC's own words are kept


def test_a_wrong_server_name_fails_at_once_naming_server_name(pki, tls_server):
    message = connect_fails(tls_server.address, client_tls(pki, server_name="elsewhere.example"))
    assert "does not carry the host name" in message and "`TLSConfig.server_name`" in message


def test_a_plaintext_client_at_a_tls_server_fails_at_once_saying_the_server_speaks_tls(
    tls_server,
):
    message = connect_fails(tls_server.address, None)
    assert "the server speaks TLS and this client connects in plaintext" in message
    assert "`TLSConfig.ca_file`" in message
    assert "Socket closed" in message  # all gRPC itself says


def test_a_tls_client_at_a_plaintext_server_fails_at_once_saying_it_does_not_speak_tls(
    pki, plain_server
):
    message = connect_fails(plain_server.address, client_tls(pki))
    assert "the server does not speak TLS" in message
    assert "WRONG_VERSION_NUMBER" in message


def test_a_client_without_a_certificate_at_an_mtls_server_fails_at_once_asking_for_one(
    pki, mtls_server
):
    message = connect_fails(mtls_server.address, client_tls(pki), token="s3cret")
    assert "requires client certificates (mTLS" in message
    assert "`TLSConfig.cert_file` and `TLSConfig.key_file`" in message


def test_a_client_certificate_of_another_ca_at_an_mtls_server_fails_at_once_naming_it(
    pki, mtls_server
):
    message = connect_fails(mtls_server.address, client_tls(pki, cert="rogue"), token="s3cret")
    assert "does not trust the one it got" in message
    assert pki["rogue_cert"] in message


def test_a_plaintext_client_at_an_mtls_server_is_told_about_both_tls_and_the_certificate(
    mtls_server,
):
    message = connect_fails(mtls_server.address, None, token="s3cret")
    assert "the server speaks TLS" in message and "client certificate" in message


def test_mtls_with_a_certificate_of_the_servers_ca_appends(pki, mtls_server):
    with rg.ReplayClient(
        mtls_server.address, token="s3cret", tls=client_tls(pki, cert="client")
    ) as client:
        client.add_batch({"id": np.arange(3, dtype=np.int64)})
        client.flush(timeout=30)
        assert client.acked_transitions == 3


def test_a_wrong_token_names_the_token_parameter(pki, mtls_server):
    with pytest.raises(AuthenticationError, match=r"pass the server's `token`"):
        rg.ReplayClient(mtls_server.address, token="wrong", tls=client_tls(pki, cert="client"))


# -- waiting for a server that is not there yet -------------------------------------------------


def test_a_client_waits_for_a_server_that_refuses_connections_and_is_in_soon_after_it_starts():
    address = f"127.0.0.1:{free_port()}"
    table = _table()
    started = {}

    def serve_later():
        time.sleep(1.5)
        started["server"] = rg.serve(table, address)
        started["at"] = time.monotonic()

    thread = threading.Thread(target=serve_later)
    begin = time.monotonic()
    thread.start()
    try:
        client = rg.ReplayClient(address, config=ClientConfig(retry_deadline_s=30))
        connected = time.monotonic()
        client.close()
    finally:
        thread.join(30)
        if "server" in started:
            started["server"].stop()
    assert connected - begin >= 1.0  # it waited through "connection refused"
    assert connected - started["at"] < 3.0, f"in {connected - started['at']:.1f} s after start"


def test_a_client_gives_up_on_a_server_that_never_comes_at_its_deadline():
    started = time.monotonic()
    with pytest.raises(ServiceUnavailableError, match="Connection refused") as raised:
        rg.ReplayClient(f"127.0.0.1:{free_port()}", config=ClientConfig(retry_deadline_s=1))
    assert 0.5 < time.monotonic() - started < FAST_S
    assert raised.value.retryable and "retry_deadline_s=1" in str(raised.value)


# -- certificate files --------------------------------------------------------------------------


def test_a_certificate_and_a_key_that_do_not_match_are_refused_naming_both(pki):
    with pytest.raises(rg.ConfigError, match="do not match") as raised:
        TLSConfig(pki["server_cert"], pki["stray_key"])
    assert pki["server_cert"] in str(raised.value) and pki["stray_key"] in str(raised.value)
    with pytest.raises(rg.ConfigError, match="do not match"):  # a client's pair too
        TLSConfig(cert_file=pki["client_cert"], key_file=pki["rogue_key"], ca_file=pki["ca"])


@pytest.mark.parametrize(
    ("field", "expected"),
    [("cert_file", "holds no PEM certificate"), ("key_file", "holds no PEM private key")],
)
def test_a_file_that_is_not_pem_is_refused_naming_it(pki, tmp_path, field, expected):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    files = {"cert_file": pki["server_cert"], "key_file": pki["server_key"], field: str(junk)}
    with pytest.raises(rg.ConfigError, match=expected) as raised:
        TLSConfig(**files)
    assert str(junk) in str(raised.value)
    with pytest.raises(rg.ConfigError, match=r"`TLSConfig\.ca_file`: .* holds no PEM certificate"):
        TLSConfig(ca_file=str(junk))


def test_serve_with_a_certificate_and_a_key_that_do_not_match_says_so(pki):
    result = subprocess.run(
        [
            *(*CLI, "serve", "--env", "CartPole-v1", "--device", "/CPU:0"),
            *("--address", f"127.0.0.1:{free_port()}"),
            *("--tls-cert", pki["server_cert"], "--tls-key", pki["stray_key"]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "do not match" in result.stderr and pki["stray_key"] in result.stderr
    assert "cannot bind" not in result.stderr


# -- the command line ---------------------------------------------------------------------------


def _env(**extra):
    return {**os.environ, "REPLAYGPU_TOKEN": "", **extra}


def test_info_with_mtls_flags_and_the_token_from_the_environment_reads_the_server(pki, mtls_server):
    result = subprocess.run(
        [
            *(*CLI, "info", mtls_server.address, "--tls-ca", pki["ca"]),
            *("--tls-cert", pki["client_cert"], "--tls-key", pki["client_key"]),
            *("--server-name", "localhost"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(REPLAYGPU_TOKEN="s3cret"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "table replay: size" in result.stdout


def test_info_without_a_client_certificate_at_an_mtls_server_says_to_pass_one(pki, mtls_server):
    started = time.monotonic()
    result = subprocess.run(
        [*CLI, "info", mtls_server.address, "--tls-ca", pki["ca"], "--server-name", "localhost"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(REPLAYGPU_TOKEN="s3cret"),
    )
    assert result.returncode != 0
    assert "TLSError" in result.stderr and "--tls-cert and --tls-key" in result.stderr
    assert time.monotonic() - started < 30  # interpreter start included


def test_actor_command_with_mtls_flags_fills_the_table(pki):
    table = rg.ReplayTable(specs_from_env(gym.make("CartPole-v1")), 1000, device="/CPU:0")
    tls = TLSConfig(pki["server_cert"], pki["server_key"], ca_file=pki["ca"])
    with rg.serve(table, token="s3cret", tls=tls) as server:
        result = subprocess.run(
            [
                *(*CLI, "actor", server.address, "--env", "CartPole-v1"),
                *("--steps", "64", "--num-envs", "2", "--send-interval", "16"),
                *("--tls-ca", pki["ca"], "--server-name", "localhost"),
                *("--tls-cert", pki["client_cert"], "--tls-key", pki["client_key"]),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(REPLAYGPU_TOKEN="s3cret"),
        )
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
        deadline = time.monotonic() + 30
        while table.total_inserted < 64 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert table.total_inserted == 64


def test_actor_command_with_a_key_of_another_certificate_stops_before_connecting(pki):
    result = subprocess.run(
        [
            *(*CLI, "actor", "127.0.0.1:1", "--tls-ca", pki["ca"]),
            *("--tls-cert", pki["client_cert"], "--tls-key", pki["stray_key"]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2  # one line on stderr (issue 12), before any connection
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("replaygpu actor: error:")]
    assert "do not match" in line and pki["client_cert"] in line
    assert "Traceback" not in result.stderr
