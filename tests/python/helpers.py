"""Test records shared by the client round-trip tests."""

import dataclasses
import random

# 2023-11-14T22:13:20Z; explicit, far from "now", so a broker that stamped its
# own time instead of keeping the producer's would be caught.
BASE_TIMESTAMP_MS = 1_700_000_000_000


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
