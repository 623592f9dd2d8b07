#!/usr/bin/env python3
"""Produce into a broker that fills from empty, and into one in service
(issue #14, fifteenth round), side by side with a peer.

The presets of run-baseline.sh start every run on an empty Redis, which
grows for the whole run: every byte Redis stores lands on memory it has
never touched, and the kernel faults in and zeroes each page first. A
gateway in service has retention (or archiving, local.retention.*)
trimming its partitions, and Redis stores new batches in the memory the
trimmed ones freed. This script measures both, with ketch-bench's
producer (a preset, --workload: 1-topic-16-partitions-1kb by default,
16 partitions of 1 KiB records; acks=all, no compression), for ketch and
optionally a peer broker:

  fill    a fresh server, a topic without retention, --records records
          produced and measured;
  steady  a fresh server, a topic with retention.bytes=--retention-bytes
          and segment.bytes=--segment-bytes per partition, --records
          records produced first (unmeasured: retention starts trimming),
          then --records more measured.

For each run: records/s, CPU µs per record of each server process (ketch
and redis-server, or the peer), their minor page faults per record, and
their peak RSS. The sides and modes alternate each round (ABBA), and a
summary gives each mode's medians and ketch ÷ peer.

ketch's storage worker applies retention every tiering.tick_interval;
this script sets 1 s (--tick-interval; the gateway's default is 5 s), so
at this machine's 700 MB/s Redis overshoots the retention by about a
second of data, not five.

    benchmark/steady-state.py --ketch target/release/ketch
    benchmark/steady-state.py --ketch BIN --peer-name nisshi \\
        --peer-cmd '/path/nisshi broker --listener-url=tcp://127.0.0.1:{port} ...' \\
        --rounds 3 --out benchmark/results/DATE-steady-state
"""

import argparse
import json
import os
import pathlib
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servers import Servers, free_port, stop  # noqa: E402

# ketch-bench's presets and their partitions.
PRESETS = {
    "1-topic-1-partition-1kb": 1,
    "1-topic-16-partitions-1kb": 16,
    "1-topic-16-partitions-100b": 16,
    "1-topic-3-partitions-100b-3producers": 3,
    "1-topic-100-partitions-1kb": 100,
}
TOPIC = "steady"


def proc_stat(pid):
    """(CPU seconds, minor faults) of a process so far."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    # Fields after the command: state is [0]; minflt [7], utime [11], stime [12].
    return (int(fields[11]) + int(fields[12])) / ticks, int(fields[7])


def peak_rss_mib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def create_topic(bootstrap, partitions, retention):
    from confluent_kafka.admin import AdminClient, NewTopic

    config = {}
    if retention:
        config = {"retention.bytes": str(retention[0]), "segment.bytes": str(retention[1])}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, partitions, 1, config=config)]).values():
        future.result()


def produce(bench, bootstrap, workload, records, result_file=None):
    argv = [bench, "producer", "--bootstrap-server", bootstrap, "--workload", workload,
            "--topic", TOPIC, "--records", str(records), "--acks", "all", "--compression", "none",
            "--output", "json", "--quiet"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    if result["results"]["records_failed"]:
        raise SystemExit(f"records were not acknowledged: {result['results']['first_error']}")
    if result_file:
        result_file.write_text(json.dumps(result, indent=1))
    return result


def measure(args, bootstrap, processes, mode, out_file):
    """Creates the topic, prefills it (steady), then produces and measures;
    processes: {name: pid}."""
    retention = (args.retention_bytes, args.segment_bytes) if mode == "steady" else None
    create_topic(bootstrap, PRESETS[args.workload], retention)
    records = args.records
    if mode == "steady":
        produce(args.bench, bootstrap, args.workload, records)
    before = {name: proc_stat(pid) for name, pid in processes.items()}
    result = produce(args.bench, bootstrap, args.workload, records, out_file)
    after = {name: proc_stat(pid) for name, pid in processes.items()}
    figures = {
        "records_per_s": result["results"]["throughput"]["records_per_s"],
        "client_cpu_s": result["client"]["cpu_s"],
        "processes": {},
    }
    for name, pid in processes.items():
        cpu = after[name][0] - before[name][0]
        faults = after[name][1] - before[name][1]
        figures["processes"][name] = {
            "cpu_us_per_record": cpu * 1e6 / records,
            "faults_per_record": faults / records,
            "peak_rss_mib": peak_rss_mib(pid),
        }
    figures["server_cpu_us_per_record"] = sum(
        p["cpu_us_per_record"] for p in figures["processes"].values())
    return figures


def run_ketch(args, mode, work, out):
    with Servers(work, out, args.ketch, settings=[f"tiering.tick_interval={args.tick_interval}"]) as servers:
        redis_pid = servers.processes[0].pid
        return measure(args, servers.bootstrap, {"ketch": servers.ketch.pid, "redis": redis_pid},
                       mode, out / "produce.json")


def run_peer(args, mode, work, out):
    port = free_port()
    log = open(work / "peer.log", "w")
    peer = subprocess.Popen(shlex.split(args.peer_cmd.replace("{port}", str(port))),
                            stdout=log, stderr=log, cwd=work)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if peer.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the peer did not start: {(work / 'peer.log').read_text()}")
                time.sleep(0.1)
        return measure(args, f"127.0.0.1:{port}", {args.peer_name: peer.pid}, mode,
                       out / "produce.json")
    finally:
        stop(peer)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ketch", required=True, help="the ketch binary")
    parser.add_argument("--bench", default=None, help="ketch-bench (default: next to --ketch)")
    parser.add_argument("--peer-name", default="peer")
    parser.add_argument("--peer-cmd", help="the peer's command line; {port} is its listener port")
    parser.add_argument("--workload", choices=sorted(PRESETS), default="1-topic-16-partitions-1kb")
    parser.add_argument("--records", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--retention-bytes", type=int, default=32 << 20)
    parser.add_argument("--segment-bytes", type=int, default=8 << 20)
    parser.add_argument("--tick-interval", default="1s",
                        help="ketch's tiering.tick_interval (how often retention is applied)")
    parser.add_argument("--modes", type=lambda v: v.split(","), default=["fill", "steady"],
                        help="fill, steady or both (comma-separated)")
    parser.add_argument("--out", default=None, help="results directory")
    args = parser.parse_args()
    # Stopped with SIGTERM, still stop the servers it started (the `with`
    # blocks and `finally` clauses run on SystemExit, not on a signal).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.ketch = os.path.abspath(args.ketch)
    args.bench = args.bench or os.path.join(os.path.dirname(args.ketch), "ketch-bench")
    out = pathlib.Path(args.out or f"benchmark/results/{time.strftime('%Y-%m-%d')}-steady-state")
    out.mkdir(parents=True, exist_ok=True)

    sides = [("ketch", run_ketch)] + ([(args.peer_name, run_peer)] if args.peer_cmd else [])
    runs = []
    for round_ in range(1, args.rounds + 1):
        order = [(m, s) for m in args.modes for s in sides]
        if round_ % 2 == 0:
            order.reverse()
        for mode, (side, run) in order:
            with tempfile.TemporaryDirectory() as work:
                run_out = out / f"{side}-{mode}-{round_}"
                run_out.mkdir(parents=True, exist_ok=True)
                figures = run(args, mode, pathlib.Path(work), run_out)
            figures.update(side=side, mode=mode, round=round_)
            runs.append(figures)
            procs = "  ".join(
                f"{n} {p['cpu_us_per_record']:.3f} µs, {p['faults_per_record']:.3f} faults, "
                f"{p['peak_rss_mib']:.0f} MiB" for n, p in figures["processes"].items())
            print(f"round {round_} {side:>8} {mode:>6}: {figures['records_per_s']:>9,.0f} records/s  {procs}",
                  flush=True)

    lines = [f"# Produce from empty (fill) and in service (steady): {args.records:,} records of "
             f"{args.workload}, retention.bytes={args.retention_bytes}, segment.bytes={args.segment_bytes}, "
             f"{args.rounds} rounds", "",
             "| side | mode | records/s (median) | server CPU µs/record (median) | per process: CPU µs/record, "
             "faults/record (medians) | peak RSS MiB (max) |", "|---|---|---:|---:|---|---:|"]
    medians = {}
    for mode in args.modes:
        for side, _ in sides:
            mine = [r for r in runs if r["side"] == side and r["mode"] == mode]
            rate = statistics.median(r["records_per_s"] for r in mine)
            cpu = statistics.median(r["server_cpu_us_per_record"] for r in mine)
            medians[(side, mode)] = (rate, cpu)
            per = ", ".join(
                f"{n} {statistics.median(r['processes'][n]['cpu_us_per_record'] for r in mine):.3f} / "
                f"{statistics.median(r['processes'][n]['faults_per_record'] for r in mine):.3f}"
                for n in mine[0]["processes"])
            rss = max(p["peak_rss_mib"] for r in mine for p in r["processes"].values())
            lines.append(f"| {side} | {mode} | {rate:,.0f} | {cpu:.3f} | {per} | {rss:,.0f} |")
    if len(sides) > 1:
        lines.append("")
        for mode in args.modes:
            (k_rate, k_cpu), (p_rate, p_cpu) = medians[("ketch", mode)], medians[(args.peer_name, mode)]
            lines.append(f"- {mode}: ketch ÷ {args.peer_name}: produce {k_rate / p_rate:.2f}, "
                         f"server CPU per record {k_cpu / p_cpu:.2f}")
    summary = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(summary)
    (out / "runs.json").write_text(json.dumps(runs, indent=1))
    print("\n" + summary)


if __name__ == "__main__":
    main()
