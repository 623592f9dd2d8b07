"""Security seen by clients other than the Kafka libraries under test
elsewhere: the HTTP listener with http.tls and http.auth (HTTPS with the
listeners' certificate, HTTP Basic checked against the SCRAM users, open
paths served without credentials, DESCRIBE on the cluster for the rest),
and Debian's kcat authenticating with SCRAM and PLAIN over TLS."""

import base64
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import Pki, ketch_binary, ketch_env, ketch_users, start_ketch, stop_ketch


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA and a server certificate for localhost/127.0.0.1 signed by it:
    the directory, with `ca.pem`, `server.pem` and `server.key`."""
    pki = Pki(tmp_path_factory.mktemp("http-certs"))
    pki.ca("ca", "/CN=ketch http test CA")
    pki.issue("server", "/CN=localhost", (pki.dir / "ca.pem", pki.dir / "ca.key"), "server")
    return pki.dir


def set_user(redis_url, name, password):
    ketch_users(redis_url, "set", name, password=password)


def get(url, context, user=None, password=None, method="GET", body=None):
    request = urllib.request.Request(url, method=method, data=body)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_https_with_basic_authentication_and_open_paths(redis_url, certs):
    set_user(redis_url, "admin", "admin-pw")
    set_user(redis_url, "viewer", "viewer-pw")
    gateway = start_ketch(redis_url, node_id=0, settings=[
        f"tls.cert_file={certs / 'server.pem'}",
        f"tls.key_file={certs / 'server.key'}",
        "http.tls=true",
        "http.auth=true",
        # /api/v1/topics open to reading: a write there still needs credentials.
        "http.open_paths=/health,/api/v1/topics",
        "acl.enabled=true",
        "acl.super_users=admin",
    ])
    try:
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        base = f"https://{gateway.http}"
        assert get(f"{base}/health", context) == (200, "ok\n")
        status, body = get(f"{base}/metrics", context)
        assert status == 401 and json.loads(body) == {
            "error": "UNAUTHENTICATED", "message": "authentication required"}, body
        assert get(f"{base}/metrics", context, "admin", "wrong")[0] == 401
        status, body = get(f"{base}/metrics", context, "admin", "admin-pw")
        assert status == 200 and "ketch_authentication_failures_total" in body, body
        failures = next(float(l.split()[1]) for l in body.splitlines()
                        if l.startswith("ketch_authentication_failures_total"))
        assert failures >= 1
        # With http.auth the admin API's writes are on, as the principal.
        new_topic = b'{"name": "made-over-https", "partitions": 2}'
        assert get(f"{base}/api/v1/topics", context, method="POST", body=new_topic)[0] == 401
        assert get(f"{base}/api/v1/topics", context)[0] == 200, "open to reading"
        status, body = get(f"{base}/api/v1/topics", context, "admin", "admin-pw", "POST", new_topic)
        assert status == 201 and '"made-over-https"' in body, body
        status, body = get(f"{base}/api/v1/topics/made-over-https", context, "admin", "admin-pw")
        assert status == 200 and body.count('"partition":') == 2, body
        # Authenticated, but without DESCRIBE on the cluster.
        status, body = get(f"{base}/ready", context, "viewer", "viewer-pw")
        assert status == 403 and "DESCRIBE" in body, body
        # Plain HTTP on the HTTPS port gets nowhere.
        with pytest.raises(Exception):
            urllib.request.urlopen(f"http://{gateway.http}/health", timeout=5).read()
    finally:
        error = stop_ketch(gateway)
    assert error is None, error


def test_https_connections_take_their_place_before_the_handshake(redis_url, certs):
    """Connections that never start their TLS handshake hold places among
    http.max_connections: no more are accepted meanwhile (they wait in the
    kernel's backlog, holding no file descriptor of the gateway's), and each
    gives its place back when its handshake ends."""
    gateway = start_ketch(redis_url, node_id=0, settings=[
        f"tls.cert_file={certs / 'server.pem'}",
        f"tls.key_file={certs / 'server.key'}",
        "http.tls=true",
        "http.max_connections=2",
    ])
    try:
        pid = gateway.process.proc.pid
        host, port = gateway.http.split(":")

        def descriptors():
            return len(os.listdir(f"/proc/{pid}/fd"))

        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        assert get(f"https://{gateway.http}/health", context) == (200, "ok\n")
        before = descriptors()
        silent = [socket.create_connection((host, int(port))) for _ in range(50)]
        # Every one was queued or accepted; the gateway holds at most two.
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            assert descriptors() <= before + 2, (before, descriptors())
            time.sleep(0.1)
        # Closed, they give their places back (their handshakes fail), and
        # the backlog drains.
        for s in silent:
            s.close()
        assert get(f"https://{gateway.http}/health", context) == (200, "ok\n")
    finally:
        error = stop_ketch(gateway)
    assert error is None, error


def test_http_auth_without_tls_is_refused_at_start(redis_url):
    result = subprocess.run(
        [ketch_binary(), "serve", "--redis-url", redis_url, "--set", "http.auth=true"],
        capture_output=True, text=True, env=ketch_env(), timeout=30)
    assert result.returncode == 2, result
    assert "http.auth" in result.stderr and "http.tls" in result.stderr, result.stderr


def test_kcat_authenticates_with_scram_over_tls(redis_url, certs, topic_name):
    """Debian's kcat is librdkafka 2.0.2, whose SCRAM client repeats its
    nonce in the final message (Kafka accepts it; so must ketch)."""
    import shutil

    kcat = shutil.which("kcat")
    assert kcat, "kcat is not installed (scripts/test.sh installs it)"
    set_user(redis_url, "kc", "kc-secret")
    gateway = start_ketch(redis_url, node_id=0, protocol="SASL_SSL", settings=[
        f"tls.cert_file={certs / 'server.pem'}",
        f"tls.key_file={certs / 'server.key'}",
    ])
    try:
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
            auth = ["-b", gateway.bootstrap, "-X", "security.protocol=SASL_SSL",
                    "-X", f"sasl.mechanisms={mechanism}", "-X", "sasl.username=kc",
                    "-X", "sasl.password=kc-secret", "-X", f"ssl.ca.location={certs / 'ca.pem'}"]
            subprocess.run([kcat, *auth, "-P", "-t", topic_name, "-p", "0"], input=f"{mechanism}\n",
                           text=True, check=True, capture_output=True, timeout=30)
        out = subprocess.run([kcat, *auth, "-C", "-t", topic_name, "-p", "0", "-o", "beginning", "-e"],
                             text=True, check=True, capture_output=True, timeout=30).stdout
        assert out.splitlines() == ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
        wrong = subprocess.run([kcat, *auth[:-4], "-X", "sasl.password=nope", "-X",
                                f"ssl.ca.location={certs / 'ca.pem'}", "-L"],
                               text=True, capture_output=True, timeout=30)
        assert wrong.returncode != 0 and "Authentication failed" in wrong.stderr, wrong.stderr
    finally:
        error = stop_ketch(gateway)
    assert error is None, error
