#!/usr/bin/env python3
"""What the storage worker's per-tick reads of a partition's segment records
cost Redis as a remote topic's archived segments pile up.

    benchmark/segment-list-cost.py [--segments N] [--calls C]
                                   [--seal PATH] [--listing PATH] [--zrange-first]

A remote topic keeps a record per archived segment in `ketch:{TAG}:segments`
(with retention.ms -1, one more per segment for ever). Each tick, for each
partition it leads, the storage worker calls the seal script and, for a
remote topic, lists the segments archiving may want. This starts a fresh
redis-server on a free loopback port, sets up one partition whose N
archived segments (1 MiB each, with a data file path as long as an S3
one's) all lie below the local start, and times C calls of:

- the seal script (PATH, the tree's `storage/src/scripts/seal.lua` by
  default; give an older one with
  `git show REV:storage/src/scripts/seal.lua > /tmp/seal-REV.lua`): the
  usual call, and the call every ten minutes that works out the aborted
  index's trim bound (its proposal deleted before each call), with the
  quarantine stream empty and holding a batch (then the records below the
  local start are read: from the segment holding the stream's oldest batch
  on, here the last); and the usual call with retention.bytes set (more
  than the segments hold), after one call (which sums every record);
- the seal script over the same records kept in Redis by a topic without
  remote storage, as every such topic's call was made before (letting go
  of an archive's state, which reads every kept record) and as it is made
  now;
- the listing: `ZRANGE key 0 -1` (every segment: what archiving read each
  tick before `archive_listing.lua`, and still reads once per five minutes;
  before this tree's `archive_listing.lua` also while a segment was
  quarantined), and `archive_listing.lua` as a tick calls it, also with a
  quarantined batch in the last segment (with the ZRANGE its reply asks
  for: from that segment on; `--listing` takes an older script).

Prints Redis's own microseconds per call (INFO commandstats) and the reply
bytes (the gateway parses what the reply holds), and the Redis memory the
segment records take.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from servers import bare_redis  # noqa: E402

SCRIPTS = os.path.join(HERE, "..", "storage", "src", "scripts")
NAMES = ("meta", "segments", "log", "producers", "quarantine", "aborted", "clean", "times")
KEYS = {name: f"k:{{p}}:{name}" for name in NAMES}
SEGMENT_RECORDS = 10


def per_call(conn, command):
    stats = conn.call("INFO", "commandstats").decode()
    for line in stats.splitlines():
        if line.startswith(f"cmdstat_{command}:"):
            return float(line.split("usec_per_call=")[1].split(",")[0])
    return 0.0


def timed(conn, calls, command, *args, before=None):
    """Redis's µs per call of `command` and the last reply's bytes."""
    conn.call("CONFIG", "RESETSTAT")
    reply = None
    for _ in range(calls):
        if before:
            conn.call(*before)
        reply = conn.call(command, *args)
    size = sum(len(m) for m in reply) if isinstance(reply, list) else 0
    return per_call(conn, command.lower()), size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=50_000)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--seal", default=os.path.join(SCRIPTS, "seal.lua"))
    ap.add_argument("--listing", default=os.path.join(SCRIPTS, "archive_listing.lua"))
    ap.add_argument("--zrange-first", action="store_true",
                    help="time ZRANGE 0 -1 before any script call (the scripts' calls warm the caches)")
    args = ap.parse_args()

    with bare_redis() as (_, conn):
        prelude = open(os.path.join(SCRIPTS, "producer_state.lua")).read()
        seal = conn.call("SCRIPT", "LOAD", "#!lua flags=allow-oom\n" + prelude + open(args.seal).read()).decode()
        listing = conn.call("SCRIPT", "LOAD", open(args.listing).read()).decode()

        now = int(time.time() * 1000)
        end = args.segments * SEGMENT_RECORDS
        for first in range(0, args.segments, 1000):
            zadd = ["ZADD", KEYS["segments"]]
            for i in range(first, min(first + 1000, args.segments)):
                base = i * SEGMENT_RECORDS
                path = (f"s3://warehouse/ketch/events/data/partition=0/"
                        f"{base:020d}-0f3c9a1e-5b7d-4e2a-9c1f-7a6b5c4d3e2f.parquet")
                zadd += [str(base),
                         f'{{"base":{base},"last":{base + SEGMENT_RECORDS - 1},"bytes":1048576,'
                         f'"max_ts":{now},"sealed_ms":{now},"first_ts":{now},'
                         f'"path":"{path}","file_bytes":262144}}']
            conn.call(*zadd)
        conn.call("HSET", KEYS["meta"], "next_offset", str(end), "log_start", "0", "local_start", str(end),
                  "seg_base", str(end), "seg_bytes", "0", "abt_to", "0", "abt_at", str(now))

        # segment.bytes, segment.ms, retention.ms -1, retention.bytes -1,
        # remote, producers.expiration, local.retention.ms 1 h,
        # local.retention.bytes -1, archive kept, wake-up channel.
        seal_args = ["EVALSHA", seal, str(len(NAMES)), *KEYS.values(), "1073741824", "604800000", "-1", "-1",
                     "0", "604800000", "3600000", "-1", "0", "k:{p}:wake"]
        if args.zrange_first:
            zrange, zrange_bytes = timed(conn, args.calls, "ZRANGE", KEYS["segments"], "0", "-1")
        usual, _ = timed(conn, args.calls, *seal_args)
        by_bytes_args = list(seal_args)
        by_bytes_args[-7] = str(1 << 62)  # retention.bytes
        conn.call(*by_bytes_args)
        by_bytes, _ = timed(conn, args.calls, *by_bytes_args)
        bound, _ = timed(conn, args.calls, *seal_args, before=("HDEL", KEYS["meta"], "abt_at"))
        conn.call("XADD", KEYS["quarantine"], f"{end - 1}-1", "b", "a quarantined batch")
        bound_read, _ = timed(conn, args.calls, *seal_args, before=("HDEL", KEYS["meta"], "abt_at"))
        # Archiving's listing while the partition has a quarantined batch:
        # the script, then the ZRANGE its reply asks for.
        listing_keys = ["3", KEYS["meta"], KEYS["segments"], KEYS["quarantine"]]
        reply = conn.call("EVALSHA", listing, *listing_keys, "from_local")
        quarantined_tick, _ = timed(conn, args.calls, "EVALSHA", listing, *listing_keys, "from_local")
        if len(reply) == 3:
            quarantined_zrange, quarantined_bytes = timed(conn, args.calls, "ZRANGE", KEYS["segments"],
                                                          reply[2].decode(), "+inf", "BYSCORE")
        else:  # an older archive_listing.lua: every segment
            quarantined_zrange, quarantined_bytes = timed(conn, args.calls, "ZRANGE", KEYS["segments"], "0", "-1")
        conn.call("DEL", KEYS["quarantine"])
        if not args.zrange_first:
            zrange, zrange_bytes = timed(conn, args.calls, "ZRANGE", KEYS["segments"], "0", "-1")
        tick, tick_bytes = timed(conn, args.calls, "EVALSHA", listing, *listing_keys, "from_local")
        memory = int(conn.call("MEMORY", "USAGE", KEYS["segments"], "SAMPLES", "0"))
        # The same records as a topic without remote storage keeps them in
        # Redis (local start = log start): the seal script's call letting go
        # of an archive's state (ARGV[9] 1, how every such topic's call was
        # made until the storage worker passed it only while an archive is
        # being deleted), after one call that let go of it, and as it is
        # called now (0).
        conn.call("HSET", KEYS["meta"], "local_start", "0")
        local_args = list(seal_args)
        local_args[-6] = "1"  # no remote storage
        local_args[-2] = "1"
        conn.call(*local_args)
        letting_go, _ = timed(conn, args.calls, *local_args)
        local_args[-2] = "0"
        without, _ = timed(conn, args.calls, *local_args)
        left = int(conn.call("ZCARD", KEYS["segments"]))
        if left != args.segments:
            sys.exit(f"the seal script deleted segments: {left} of {args.segments} left")
        print(f"segments {args.segments}  calls {args.calls}  seal script {os.path.relpath(args.seal)}  "
              f"segment records {memory} B in Redis")
        print(f"  seal, usual call:             {usual:10.1f} µs")
        print(f"  seal, retention.bytes set:    {by_bytes:10.1f} µs")
        print(f"  seal, trim bound due:         {bound:10.1f} µs")
        print(f"    ... a quarantined batch:    {bound_read:10.1f} µs")
        print(f"  seal, no remote storage, letting go of an archive (before): {letting_go:10.1f} µs")
        print(f"  seal, no remote storage, as called now:                      {without:10.1f} µs")
        print(f"  ZRANGE 0 -1:                  {zrange:10.1f} µs  {zrange_bytes:>10} B")
        print(f"  archive_listing, tick:        {tick:10.1f} µs  {tick_bytes:>10} B")
        print(f"  archive_listing, tick, a quarantined batch: {quarantined_tick:10.1f} µs "
              f"+ ZRANGE {quarantined_zrange:10.1f} µs  {quarantined_bytes:>10} B")


if __name__ == "__main__":
    main()
