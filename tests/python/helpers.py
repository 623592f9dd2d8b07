"""Test records shared by the client round-trip tests."""

import dataclasses
import random
import socket
import struct
import time

# An hour before the tests started, in whole seconds: explicit and away from
# "now", so a broker that stamped its own time instead of keeping the
# producer's would be caught, yet recent, so no topic's retention.ms (7 days by
# default) deletes the records while a test reads them.
BASE_TIMESTAMP_MS = (int(time.time()) - 3600) * 1000


@dataclasses.dataclass(frozen=True)
class Record:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple  # ((str, bytes | None), ...) in order, keys may repeat
    timestamp_ms: int


def make_records(count, partitions, seed=7):
    """`count` records spread round-robin over `partitions`, covering null
    keys, null values, empty values, headers with a repeated key and a null
    header value, and explicit timestamps (not monotonic)."""
    rng = random.Random(seed)
    records = []
    for i in range(count):
        key = None if i % 10 == 0 else f"key-{i}".encode()
        # Never null key and null value at once (kafka-python refuses that).
        if i % 15 == 7:
            value = None
        elif i % 15 == 8:
            value = b""
        else:
            value = rng.randbytes(rng.randint(1, 300))
        if i % 4 == 0:
            headers = ()
        elif i % 4 == 1:
            headers = (("trace", f"t-{i}".encode()),)
        elif i % 4 == 2:
            # A repeated key: both values must come back, in order.
            headers = (("h", b"first"), ("h", b"second"), ("bin", bytes([0, 255, i % 256])))
        else:
            headers = (("h", b"only"), ("nullable", None))
        timestamp = BASE_TIMESTAMP_MS + i * 10 - (5 if i % 7 == 0 else 0)
        records.append(Record(i % partitions, key, value, headers, timestamp))
    return records


def by_partition(records, partitions):
    out = {p: [] for p in range(partitions)}
    for r in records:
        out[r.partition].append(r)
    return out


# FindCoordinator v4 (KIP-699, batched keys), by hand, so a test can ask one
# particular gateway (clients ask whichever broker they like).
def find_coordinators(address, keys, key_type=0, timeout=10.0):
    """{key: (error_code, node_id)} as gateway `address` answers
    FindCoordinator v4 for all `keys` of `key_type` (0 group, 1
    transactional id) in one request."""

    def uvarint(n):
        out = bytearray()
        while True:
            byte = n & 0x7F
            n >>= 7
            if n:
                out.append(byte | 0x80)
            else:
                out.append(byte)
                return bytes(out)

    def compact_string(s):
        raw = s.encode()
        return uvarint(len(raw) + 1) + raw

    client_id = b"ketch-tests"
    # Request header v2: api key 10, version 4, correlation id, client id
    # (a non-compact nullable string), no tagged fields.
    header = struct.pack(">hhih", 10, 4, 42, len(client_id)) + client_id + b"\x00"
    body = struct.pack(">b", key_type) + uvarint(len(keys) + 1)
    body += b"".join(compact_string(k) for k in keys) + b"\x00"
    frame = header + body
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        data = b""
        while len(data) < 4:
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            data += chunk
        (size,) = struct.unpack(">i", data[:4])
        while len(data) < 4 + size:
            chunk = sock.recv(65536)
            assert chunk, "connection closed"
            data += chunk
    buf = memoryview(data[4 : 4 + size])
    pos = 0

    def read_uvarint():
        nonlocal pos
        shift = value = 0
        while True:
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def read_compact_string():
        nonlocal pos
        n = read_uvarint() - 1
        if n < 0:
            return None
        s = bytes(buf[pos : pos + n]).decode()
        pos += n
        return s

    def skip_tags():
        nonlocal pos
        for _ in range(read_uvarint()):
            read_uvarint()
            pos += read_uvarint()

    def unpack(fmt):
        nonlocal pos
        values = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return values

    (correlation,) = unpack(">i")
    assert correlation == 42
    skip_tags()  # response header v1
    unpack(">i")  # throttle_time_ms
    result = {}
    for _ in range(read_uvarint() - 1):
        key = read_compact_string()
        (node_id,) = unpack(">i")
        read_compact_string()  # host
        unpack(">i")  # port
        (error_code,) = unpack(">h")
        read_compact_string()  # error message
        skip_tags()
        result[key] = (error_code, node_id)
    assert set(result) == set(keys), f"answer for {sorted(result)}, asked for {sorted(keys)}"
    return result


def eventually(get, want, what, timeout=10.0):
    """Calls get() until it returns `want` (at most `timeout` seconds).
    EndTxn is answered once the decision is written, as Kafka's coordinator
    answers it; the markers and offsets it decides follow at once, so
    whatever depends on them (watermarks, committed offsets) is asked
    until it shows."""
    deadline = time.monotonic() + timeout
    while True:
        got = get()
        if got == want:
            return
        assert time.monotonic() < deadline, f"{what}: {got}, want {want}"
        time.sleep(0.02)
