"""Fixtures for the Python and kcat client tests.

Every test gets its own redis-server on a free port and its own ketch process
talking to it, and both are stopped at teardown. The ketch binary is
$KETCH_BIN, or target/debug/ketch of this checkout (`cargo build -p
ketch-gateway` makes it; scripts/test.sh does both).

Consumer-group tests use `ketch_cluster`, which starts any number of gateways
on the test's one Redis with distinct node ids and fast membership and group
settings (FAST_GROUP_SETTINGS).
"""

import collections
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


def free_ports(count):
    """`count` distinct free loopback ports. The sockets stay bound until all
    are chosen: one closed before the next bind may be handed out again (two
    listeners of one gateway on one port fail to start)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port():
    return free_ports(1)[0]


class PortTaken(RuntimeError):
    """A process could not bind a port chosen by free_ports: another process
    took it between the choice and the bind, the one race free ports leave."""


class Process:
    """A child process whose output is drained by a thread (so it never
    blocks on a full pipe) and kept for failure messages."""

    def __init__(self, name, argv, stream, ready_text, env=None):
        self.name = name
        self.lines = collections.deque(maxlen=200)
        self._ready = threading.Event()
        self._ready_text = ready_text
        pipes = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        pipes[stream] = subprocess.PIPE
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, **pipes)
        self._thread = threading.Thread(
            target=self._drain, args=(getattr(self.proc, stream),), daemon=True
        )
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT) or self.proc.poll() is not None:
            output = self.output()
            self.stop()
            error = PortTaken if "Address already in use" in output else RuntimeError
            raise error(f"{name} did not start ({argv}):\n{output}")

    def _drain(self, pipe):
        for raw in pipe:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            if self._ready_text in line:
                self._ready.set()
        # The process exited: wake a waiter rather than let it time out.
        self._ready.set()

    def output(self):
        return "\n".join(self.lines)

    def stop(self, sig=signal.SIGTERM, timeout=15.0):
        """Signals the process and waits; kills it if it does not exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._thread.join(5)
        return self.proc.returncode


def ketch_binary():
    path = pathlib.Path(os.environ.get("KETCH_BIN") or REPO / "target" / "debug" / "ketch")
    if not path.is_file():
        pytest.fail(f"no ketch binary at {path}: run `cargo build -p ketch-gateway` or set KETCH_BIN")
    return str(path)


@pytest.fixture
def redis_url():
    """A fresh redis-server on a free loopback port; yields its URL."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is not installed (scripts/test.sh installs it)")
    port = free_port()
    argv = [
        server,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--daemonize", "no",
    ]
    redis = Process("redis-server", argv, "stdout", "Ready to accept connections")
    try:
        yield f"redis://127.0.0.1:{port}"
    finally:
        redis.stop(signal.SIGKILL)


class Ketch:
    def __init__(self, process, bootstrap, http, node_id=0):
        self.process = process
        self.bootstrap = bootstrap
        self.http = http
        self.node_id = node_id
        self.killed = False

    def kill(self):
        """kill -9: no graceful shutdown, no deregistration from Redis."""
        self.killed = True
        self.process.stop(signal.SIGKILL)


# Settings that make consumer-group tests fast: gateways notice each other
# (and a dead one) within about 2 s, a new group's first rebalance waits
# 0.5 s for more members, and members may ask for session timeouts down to
# 1 s.
FAST_GROUP_SETTINGS = (
    "cluster.heartbeat_interval=200ms",
    "cluster.node_timeout=2s",
    "groups.initial_rebalance_delay=500ms",
    "groups.min_session_timeout=1s",
)


def ketch_env():
    """The environment to run ketch in: ketch reads every KETCH_* variable as
    a setting (KETCH_BIN would be an error), and "ketch serving" is logged at
    info."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KETCH_")}
    # Shut down at once on SIGTERM: no load balancer to take it out first.
    env["KETCH_BROKER_SHUTDOWN_DELAY"] = "0s"
    env["RUST_LOG"] = "info"
    env["NO_COLOR"] = "1"
    return env


def start_ketch(redis_url, node_id=None, settings=(), advertised_port=None, protocol=None, listeners=None):
    """Starts a ketch gateway on free ports (see _start_ketch); tries new
    ports when another process took one of them before ketch bound it."""
    for attempt in range(1, 6):
        try:
            return _start_ketch(redis_url, node_id, settings, advertised_port, protocol, listeners)
        except PortTaken:
            if attempt == 5:
                raise


def _start_ketch(redis_url, node_id, settings, advertised_port, protocol, listeners):
    """Starts a ketch gateway on free ports against `redis_url`; returns a
    Ketch once it logged "ketch serving". `settings` are `section.key=value`
    strings passed with --set; `advertised_port` is the port it tells clients
    (a load balancer's), by default its own. `protocol` is the single
    listener's broker.security_protocol (default PLAINTEXT); `listeners`, a
    list of (NAME, PROTOCOL), gives it named listeners on free ports instead
    (broker.listeners, advertised_listeners and listener_security_protocol_map;
    the first is `bootstrap`). Ketch.listeners maps each listener's name to
    its address."""
    kafka_port, http_port, *listener_ports = free_ports(2 + len(listeners or ()))
    argv = [
        ketch_binary(),
        "serve",
        "--listen", f"127.0.0.1:{kafka_port}",
        "--advertised-host", "127.0.0.1",
        "--http-listen", f"127.0.0.1:{http_port}",
        "--redis-url", redis_url,
    ]
    if advertised_port is not None:
        argv += ["--advertised-port", str(advertised_port)]
    if node_id is not None:
        argv += ["--node-id", str(node_id)]
    if protocol is not None:
        argv += ["--set", f"broker.security_protocol={protocol}"]
    addresses = {(protocol or "PLAINTEXT"): f"127.0.0.1:{kafka_port}"}
    if listeners:
        addresses = {name: f"127.0.0.1:{port}" for (name, _), port in zip(listeners, listener_ports)}
        endpoints = ",".join(f"{name}://{address}" for name, address in addresses.items())
        argv += [
            "--set", f"broker.listeners={endpoints}",
            "--set", f"broker.advertised_listeners={endpoints}",
            "--set", "broker.listener_security_protocol_map=" + ",".join(f"{n}:{p}" for n, p in listeners),
        ]
    for setting in settings:
        argv += ["--set", setting]
    name = "ketch" if node_id is None else f"ketch node {node_id}"
    process = Process(name, argv, "stderr", "ketch serving", env=ketch_env())
    gateway = Ketch(process, next(iter(addresses.values())), f"127.0.0.1:{http_port}", node_id or 0)
    gateway.listeners = addresses
    return gateway


def stop_ketch(gateway):
    """SIGTERM (unless the test killed it), prints its log (pytest shows
    captured output only for failed tests); returns an error message if a
    graceful shutdown did not exit 0, else None."""
    code = gateway.process.stop()
    print(f"--- {gateway.process.name} log ---\n{gateway.process.output()}")
    # SIGTERM is a graceful shutdown: in-flight requests finish, exit 0.
    if not gateway.killed and code != 0:
        return f"{gateway.process.name} exited with {code} on SIGTERM"
    return None


@pytest.fixture
def ketch(redis_url):
    """A ketch gateway on free ports against the test's own Redis; yields a
    Ketch with `bootstrap` ("127.0.0.1:PORT") and `http` addresses."""
    gateway = start_ketch(redis_url)
    try:
        yield gateway
    finally:
        error = stop_ketch(gateway)
        assert error is None, error


def wait_for_brokers(gateways, timeout=15.0, client_config=None):
    """Waits until Metadata from each gateway lists exactly the node ids of
    `gateways`; `client_config` is added to the AdminClient's configuration
    (security settings)."""
    from confluent_kafka.admin import AdminClient

    want = {g.node_id for g in gateways}
    deadline = time.monotonic() + timeout
    for gateway in gateways:
        admin = AdminClient({"bootstrap.servers": gateway.bootstrap, **(client_config or {})})
        while True:
            seen = set(admin.list_topics(timeout=5).brokers)
            if seen == want:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{gateway.process.name} lists brokers {seen}, want {want}")
            time.sleep(0.1)


@pytest.fixture
def ketch_cluster(redis_url):
    """A factory starting gateways on the test's one Redis with distinct node
    ids (1, 2, ...) and FAST_GROUP_SETTINGS (or `settings`):
    `ketch_cluster(3)` returns a list of Ketch once every gateway's Metadata
    lists all of them (asked with `client_config` added to the client's
    configuration; other keyword arguments go to start_ketch). Every gateway is stopped at teardown (SIGTERM, must
    exit 0, unless the test killed it) and its log printed."""
    started = []

    def start(count, settings=FAST_GROUP_SETTINGS, client_config=None, **kwargs):
        gateways = []
        for _ in range(count):
            gateway = start_ketch(redis_url, node_id=len(started) + 1, settings=settings, **kwargs)
            started.append(gateway)
            gateways.append(gateway)
        wait_for_brokers([g for g in started if not g.killed], client_config=client_config)
        return gateways

    try:
        yield start
    finally:
        errors = [e for e in map(stop_ketch, started) if e is not None]
        assert not errors, errors


@pytest.fixture
def group_ketch(ketch_cluster):
    """One gateway (node 1) with FAST_GROUP_SETTINGS, for consumer-group
    tests."""
    return ketch_cluster(1)[0]


@pytest.fixture
def topic_name(request):
    """A topic name unique to this test."""
    return f"{request.node.name.replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:8]}"


def ketch_users(redis_url, *args, password=None):
    """Runs `ketch users ARGS` against `redis_url`; returns its stdout."""
    done = subprocess.run(
        [ketch_binary(), "users", *args, "--redis-url", redis_url],
        input=None if password is None else password + "\n",
        capture_output=True,
        text=True,
        env=ketch_env(),
        timeout=30,
    )
    assert done.returncode == 0, f"ketch users {args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


# --- certificates -----------------------------------------------------------

OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


class Pki:
    """EC P-256 keys and certificates made with openssl in one directory."""

    def __init__(self, directory):
        self.dir = pathlib.Path(directory)
        self.config = self.dir / "openssl.cnf"
        self.config.write_text(OPENSSL_CONFIG)

    def _openssl(self, *args):
        done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True)
        assert done.returncode == 0, f"openssl {args}: {done.stderr}"

    def _key(self, name):
        key = self.dir / f"{name}.key"
        self._openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key)
        return key

    def ca(self, name, subject):
        """A self-signed CA: (certificate, key) paths."""
        key = self._key(name)
        cert = self.dir / f"{name}.pem"
        self._openssl(
            "req", "-new", "-x509", "-key", key, "-subj", subject, "-days", "2",
            "-config", self.config, "-extensions", "ca", "-out", cert,
        )
        return cert, key

    def issue(self, name, subject, ca, kind):
        """A certificate for `subject` signed by `ca` ((cert, key)), of
        `kind` "server" (localhost, 127.0.0.1) or "client": (certificate,
        key, serial)."""
        key = self._key(name)
        csr, cert = self.dir / f"{name}.csr", self.dir / f"{name}.pem"
        serial = secrets.randbits(62) + 1
        self._openssl("req", "-new", "-key", key, "-subj", subject, "-config", self.config, "-out", csr)
        self._openssl(
            "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-set_serial", serial,
            "-days", "2", "-extfile", self.config, "-extensions", kind, "-out", cert,
        )
        return cert, key, serial
