"""Fixtures for the Python and kcat client tests.

Every test gets its own redis-server on a free port and its own ketch process
talking to it, and both are stopped at teardown. The ketch binary is
$KETCH_BIN, or target/debug/ketch of this checkout (`cargo build -p
ketch-gateway` makes it; scripts/test.sh does both).
"""

import collections
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import threading
import uuid

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
            raise RuntimeError(f"{name} did not start ({argv}):\n{output}")

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
    def __init__(self, process, bootstrap, http):
        self.process = process
        self.bootstrap = bootstrap
        self.http = http


@pytest.fixture
def ketch(redis_url):
    """A ketch gateway on free ports against the test's own Redis; yields a
    Ketch with `bootstrap` ("127.0.0.1:PORT") and `http` addresses."""
    kafka_port, http_port = free_port(), free_port()
    argv = [
        ketch_binary(),
        "serve",
        "--listen", f"127.0.0.1:{kafka_port}",
        "--advertised-host", "127.0.0.1",
        "--http-listen", f"127.0.0.1:{http_port}",
        "--redis-url", redis_url,
    ]
    # ketch reads every KETCH_* variable as a setting (KETCH_BIN would be an
    # error), and "ketch serving" is logged at info.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KETCH_")}
    env["RUST_LOG"] = "info"
    env["NO_COLOR"] = "1"
    process = Process("ketch", argv, "stderr", "ketch serving", env=env)
    gateway = Ketch(process, f"127.0.0.1:{kafka_port}", f"127.0.0.1:{http_port}")
    try:
        yield gateway
    finally:
        code = process.stop()
        # pytest shows captured output only for failed tests.
        print(f"--- ketch log ---\n{process.output()}")
        # SIGTERM is a graceful shutdown: in-flight requests finish, exit 0.
        assert code == 0, f"ketch exited with {code} on SIGTERM"


@pytest.fixture
def topic_name(request):
    """A topic name unique to this test."""
    return f"{request.node.name.replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:8]}"
