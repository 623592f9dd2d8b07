#!/usr/bin/env python3
"""What forwarding a group request to its coordinator costs (issue #12).

Starts a fresh redis-server and two release gateways (their own addresses,
node ids claimed), forms a one-member group through its coordinator, then
sends sequential Heartbeats on one connection: to the coordinator (handled
there) and to the other gateway (forwarded over the internal listener in an
Envelope), alternating rounds so that drift on a shared machine hits both.
Prints and writes (OUT, JSON) each path's latency percentiles and their
ratio.

    benchmark/forward-latency.py        # ROUNDS (4), HEARTBEATS per round (5000), OUT

Needs redis-server and a release build (cargo build --release -p ketch-gateway;
KETCH_RELEASE_BIN overrides the path).
"""

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

ROUNDS = int(os.environ.get("ROUNDS", "4"))
HEARTBEATS = int(os.environ.get("HEARTBEATS", "5000"))
TARGET = os.environ.get("CARGO_TARGET_DIR", "target")
KETCH = os.environ.get("KETCH_RELEASE_BIN", os.path.join(TARGET, "release", "ketch"))
OUT = os.environ.get("OUT", time.strftime("benchmark/results/%Y-%m-%d-forwarding", time.gmtime()))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def string(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def byts(b):
    return struct.pack(">i", len(b)) + b


class Conn:
    """A Kafka connection speaking non-flexible request versions."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation = 0

    def request(self, api_key, version, body):
        self.correlation += 1
        header = struct.pack(">hhi", api_key, version, self.correlation) + string("forward-latency")
        frame = header + body
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", self.recv(4))[0]
        answer = self.recv(size)
        (correlation,) = struct.unpack(">i", answer[:4])
        assert correlation == self.correlation
        return answer[4:]

    def recv(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data


def read_string(b, at):
    (n,) = struct.unpack(">h", b[at : at + 2])
    return b[at + 2 : at + 2 + n].decode(), at + 2 + n


def find_coordinator(conn, group):
    answer = conn.request(10, 0, string(group))
    error, node_id = struct.unpack(">hi", answer[:6])
    assert error == 0, error
    return node_id


def join(conn, group):
    body = string(group) + struct.pack(">i", 30000) + string("") + string("consumer")
    body += struct.pack(">i", 1) + string("range") + byts(b"\x00\x00\x00\x00\x00\x00")
    answer = conn.request(11, 0, body)
    error, generation = struct.unpack(">hi", answer[:6])
    assert error == 0, f"JoinGroup error {error}"
    _, at = read_string(answer, 6)  # protocol
    _, at = read_string(answer, at)  # leader
    member, _ = read_string(answer, at)
    return member, generation


def sync(conn, group, member, generation):
    body = string(group) + struct.pack(">i", generation) + string(member)
    body += struct.pack(">i", 1) + string(member) + byts(b"assignment")
    answer = conn.request(14, 0, body)
    (error,) = struct.unpack(">h", answer[:2])
    assert error == 0, f"SyncGroup error {error}"


def heartbeats(conn, group, member, generation, count):
    body = string(group) + struct.pack(">i", generation) + string(member)
    latencies = []
    for _ in range(count):
        start = time.perf_counter_ns()
        answer = conn.request(12, 0, body)
        latencies.append(time.perf_counter_ns() - start)
        (error,) = struct.unpack(">h", answer[:2])
        assert error == 0, f"Heartbeat error {error}"
    return latencies


def percentiles(latencies):
    ordered = sorted(latencies)

    def at(q):
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    return {"p50_us": at(0.5), "p90_us": at(0.9), "p99_us": at(0.99), "mean_us": sum(ordered) / len(ordered) / 1000}


def main():
    workdir = tempfile.mkdtemp(prefix="forward-latency-")
    processes = []
    try:
        redis_port = free_port()
        processes.append(
            subprocess.Popen(
                ["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no", "--dir", workdir],
                stdout=subprocess.DEVNULL,
            )
        )
        ports = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("KETCH_")}
        for i in range(2):
            kafka, http = free_port(), free_port()
            log = open(os.path.join(workdir, f"ketch-{i}.log"), "w")
            processes.append(
                subprocess.Popen(
                    [KETCH, "serve", "--listen", f"127.0.0.1:{kafka}", "--http-listen", f"127.0.0.1:{http}",
                     "--redis-url", f"redis://127.0.0.1:{redis_port}",
                     "--set", "cluster.heartbeat_interval=100ms", "--set", "cluster.node_timeout=1s",
                     "--set", "groups.initial_rebalance_delay=0ms", "--set", "log.level=info"],
                    stdout=subprocess.DEVNULL, stderr=log, env=env,
                )
            )
            ports.append(kafka)
        # Each gateway's node id, from its registration line; then both must
        # see each other (heartbeats every 100 ms).
        node_ids = []
        deadline = time.time() + 30
        for i in range(2):
            path = os.path.join(workdir, f"ketch-{i}.log")
            while "registered in ketch:brokers" not in open(path).read():
                assert time.time() < deadline, open(path).read()
                time.sleep(0.05)
            line = next(l for l in open(path) if "registered in ketch:brokers" in l)
            node_ids.append(int(line.split("node_id=")[1].split()[0]))
        for i in range(2):
            while "nodes=[0, 1]" not in open(os.path.join(workdir, f"ketch-{i}.log")).read():
                assert time.time() < deadline, open(os.path.join(workdir, f"ketch-{i}.log")).read()
                time.sleep(0.05)
        group = "forward-latency"
        coordinator_id = find_coordinator(Conn(ports[0]), group)
        other = find_coordinator(Conn(ports[1]), group)
        assert coordinator_id == other, (coordinator_id, other, node_ids)
        direct_port = ports[node_ids.index(coordinator_id)]
        forwarding_port = ports[1 - node_ids.index(coordinator_id)]
        member, generation = join(Conn(direct_port), group)
        sync(Conn(direct_port), group, member, generation)
        conns = {"direct": Conn(direct_port), "forwarded": Conn(forwarding_port)}
        results = {"direct": [], "forwarded": []}
        for r in range(ROUNDS):
            order = ["direct", "forwarded"] if r % 2 == 0 else ["forwarded", "direct"]
            for name in order:
                results[name] += heartbeats(conns[name], group, member, generation, HEARTBEATS)
        summary = {name: percentiles(lat) for name, lat in results.items()}
        report = {
            "conditions": {
                "heartbeats_per_round": HEARTBEATS,
                "rounds": ROUNDS,
                "binary": KETCH,
                "coordinator_node_id": coordinator_id,
                "note": "sequential Heartbeat v0 on one connection per path, loopback, one redis-server, "
                "two release gateways; rounds alternate which path goes first",
            },
            "direct": summary["direct"],
            "forwarded": summary["forwarded"],
            "forwarded_over_direct_p50": summary["forwarded"]["p50_us"] / summary["direct"]["p50_us"],
            "added_p50_us": summary["forwarded"]["p50_us"] - summary["direct"]["p50_us"],
        }
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, "forward-latency.json"), "w") as f:
            json.dump(report, f, indent=2)
        print(json.dumps(report, indent=2))
    finally:
        for p in processes:
            p.terminate()
        for p in processes:
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
