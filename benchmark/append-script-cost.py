#!/usr/bin/env python3
"""What one inline append costs inside Redis, the append script alone.

    benchmark/append-script-cost.py [--script PATH] [--calls N] [--bytes B]
                                    [--idempotent] [--state json|compact]
                                    [--depth D]

Starts a fresh redis-server on a free loopback port, loads the append
script (storage/src/scripts/append.lua by default), creates one partition's
meta and sends N inline appends of a B-byte batch, pipelined D deep, each
with a timestamp one millisecond after the last (as a steady producer's
batches have). With --idempotent, every append comes from one idempotent
producer with consecutive sequences, so the script reads and writes its
state each time, in the compact encoding of layout 3 (--state compact, the
default) or as JSON (--state json, as before layout 3; see
storage/src/scripts/producer_state.lua, which is prepended to the script
as the gateway does). Prints Redis's own count of microseconds per call (INFO
commandstats: the script and the commands it runs, without reading the
request or writing the reply) and the redis-server's CPU per call (user +
system, from /proc, everything included). The batch is random bytes: the
script stores it without looking inside.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from servers import bare_redis, cpu_ticks, encode  # noqa: E402

KEYS = [f"k:{{p}}:{name}" for name in ("meta", "times", "log", "staging", "producers", "txns", "aborted")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--script", default=os.path.join(HERE, "..", "storage", "src", "scripts", "append.lua"))
    ap.add_argument("--calls", type=int, default=50000)
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--idempotent", action="store_true")
    ap.add_argument("--state", choices=("json", "compact"), default="compact")
    args = ap.parse_args()

    with bare_redis() as (redis, conn):
        codec = open(os.path.join(HERE, "..", "storage", "src", "scripts", "producer_state.lua")).read()
        sha = conn.call("SCRIPT", "LOAD", codec + open(args.script).read()).decode()
        conn.call("HSET", KEYS[0], "next_offset", "0", "log_start", "0")
        batch = os.urandom(args.bytes)
        producer = "7" if args.idempotent else "-1"
        conn.call("CONFIG", "RESETSTAT")
        ticks = cpu_ticks(redis.pid)
        ts = 1_700_000_000_000
        sent = 0
        while sent < args.calls:
            n = min(args.depth, args.calls - sent)
            requests = []
            for i in range(n):
                ts += 1
                requests.append(
                    encode("EVALSHA", sha, "7", *KEYS, "inline", "-1", "1", str(ts), "k:{p}:wake",
                           "4096", str(args.bytes), producer, "0", str(sent + i), "0",
                           "1" if args.state == "compact" else "0", batch)
                )
            conn.sock.sendall(b"".join(requests))
            for _ in range(n):
                reply = conn.read()
                if not isinstance(reply, list) or reply[0] != b"stored":
                    sys.exit(f"the append was refused: {reply!r}")
            sent += n
        cpu_s = (cpu_ticks(redis.pid) - ticks) / os.sysconf("SC_CLK_TCK")
        stats = conn.call("INFO", "commandstats").decode()
        per_call = next(
            line.split("usec_per_call=")[1].split(",")[0]
            for line in stats.splitlines()
            if line.startswith("cmdstat_evalsha:")
        )
        print(f"calls {args.calls}  batch {args.bytes} B  idempotent {args.idempotent} ({args.state})  "
              f"script µs/call {per_call}  redis-server CPU µs/call {cpu_s * 1e6 / args.calls:.1f}")


if __name__ == "__main__":
    main()
