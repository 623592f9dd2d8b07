"""What the Python benchmarks share: a fresh redis-server and a ketch
gateway on free loopback ports, redis-cli, and stopping them all."""

import contextlib
import pathlib
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process, grace=30):
    """SIGTERM, then SIGKILL if the process has not exited after `grace` s."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def encode(*args):
    """A command in RESP, its arguments str or bytes."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    """A bare RESP connection to a Redis on loopback (no client library
    needed): `call` sends a command and returns its reply (bytes, lists,
    None; an error reply raises)."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")

    def call(self, *args):
        self.sock.sendall(encode(*args))
        return self.read()

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind in b"+:":
            return rest
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            return [self.read() for _ in range(int(rest))]
        raise RuntimeError(f"unexpected reply {line!r}")


def cpu_ticks(pid):
    """User + system CPU of process `pid`, in clock ticks."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@contextlib.contextmanager
def bare_redis():
    """A fresh redis-server on a free loopback port, without persistence, and
    a `Conn` to it, as (process, conn); stopped when the block ends."""
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        conn = None
        for _ in range(200):
            try:
                conn = Conn(port)
                conn.call("PING")
                break
            except OSError:
                time.sleep(0.05)
        if conn is None:
            raise RuntimeError("redis-server did not start")
        yield process, conn
    finally:
        process.terminate()
        process.wait()


def redis_cli(port, *args):
    """redis-cli's answer, stripped (replies may hold binary data)."""
    out = subprocess.run(["redis-cli", "-p", str(port), *map(str, args)], check=True, capture_output=True)
    return out.stdout.decode("utf-8", errors="replace").strip()


class Servers:
    """redis-server and ketch for one benchmark run, in `work`; a context
    manager that stops both (SIGTERM, then SIGKILL after 30 s) and keeps
    ketch's log as `out/ketch.log`."""

    def __init__(self, work, out, ketch_binary, settings=(), env=None):
        self.work, self.out = pathlib.Path(work), pathlib.Path(out)
        self.redis_port, kafka_port, http_port = free_port(), free_port(), free_port()
        self.bootstrap, self.http = f"127.0.0.1:{kafka_port}", f"127.0.0.1:{http_port}"
        self.log_path = self.work / "ketch.log"
        self.processes = []
        try:
            self._start(ketch_binary, settings, env)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _start(self, ketch_binary, settings, env):
        self.processes.append(subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--save", "", "--appendonly", "no",
             "--dir", str(self.work), "--slowlog-max-len", "100000"],
            stdout=subprocess.DEVNULL))
        while True:
            try:
                if redis_cli(self.redis_port, "PING") == "PONG":
                    break
            except subprocess.CalledProcessError:
                pass
            time.sleep(0.05)
        log = open(self.log_path, "w")
        argv = [ketch_binary, "serve", "--listen", self.bootstrap, "--http-listen", self.http,
                "--advertised-host", "127.0.0.1", "--redis-url", f"redis://127.0.0.1:{self.redis_port}",
                "--set", f"tiering.data_dir={self.work}/data"]
        for setting in settings:
            argv += ["--set", setting]
        self.ketch = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        self.processes.append(self.ketch)
        while "ketch serving" not in self.log_path.read_text():
            assert self.ketch.poll() is None, self.log_path.read_text()
            time.sleep(0.05)

    def redis(self, *args):
        return redis_cli(self.redis_port, *args)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in reversed(self.processes):
            stop(p)
        if self.log_path.exists():
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "ketch.log").write_text(self.log_path.read_text())
        return False


def produce_records(bootstrap, topic, records, config=None, stop=None):
    """Produces `records`, (key, value) pairs, to partition 0 of `topic`
    with acks=all and large batches (`config` adds to or overrides the
    producer's configuration), until they are all delivered or `stop` is
    set; returns (records produced, seconds). Raises on a failed delivery."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "batch.size": 1 << 20, "queue.buffering.max.kbytes": 1 << 20,
                         "queue.buffering.max.messages": 1_000_000, **(config or {})})
    failures = []

    def report(error, _message):
        if error is not None:
            failures.append(error)

    started = time.monotonic()
    produced = 0
    for key, value in records:
        if stop is not None and stop.is_set():
            break
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=0, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        produced += 1
        if produced % 1000 == 0:
            producer.poll(0)
    producer.flush(300)
    took = time.monotonic() - started
    assert not failures, failures[:3]
    return produced, took
