#!/usr/bin/env python3
"""Turn one run-baseline.sh result directory into a Markdown summary.

Usage: benchmark/summarize.py benchmark/results/<date>  > summary.md
       benchmark/summarize.py --cluster benchmark/results/<date> PARTITIONS ROUNDS  > cluster.md

Every figure comes from the JSON files ketch-bench wrote in that run; the
targets of issue #3 are checked as ratios of figures measured side by side.
"""

import json
import sys
from pathlib import Path

WORKLOADS = [
    "1-topic-1-partition-1kb",
    "1-topic-16-partitions-1kb",
    "1-topic-16-partitions-100b",
    "1-topic-3-partitions-100b-3producers",
    "1-topic-100-partitions-1kb",
]


def load(directory, name):
    path = directory / name
    return json.loads(path.read_text()) if path.exists() else None


def cpu_us(result, name=None):
    """Server CPU per record in microseconds, for one process or all."""
    server = result["server"]
    records = result_records(result)
    if not records:
        return None
    seconds = sum(p["cpu_s"] for p in server["processes"] if name is None or p["name"] == name)
    return seconds * 1e6 / records


def result_records(result):
    r = result["results"]
    if "throughput" in r:
        return r["throughput"]["records"]
    return r["acked"]


def peak_rss(result, name):
    # The gateway's process may run from a renamed binary (ketch-before).
    for p in result["server"]["processes"]:
        if p["name"].startswith(name):
            return p["peak_rss_mib"]
    return None


def rate(result):
    """Records per second of a throughput result (None without one)."""
    return result["results"]["throughput"]["records_per_s"] if result else None


def fmt(value, digits=0):
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def check(ok):
    return "met" if ok else "**missed**"


def compressed_section(directory, out):
    """Compressed produce/consume, and validation's cost when compared."""
    rows = []
    for codec in ("lz4", "zstd"):
        p = load(directory, f"produce-compressed-{codec}.json")
        c = load(directory, f"consume-compressed-{codec}.json")
        if p is None:
            continue
        t = p["results"]["throughput"]
        rows.append(
            f"| {codec} | {fmt(t['records'])} | {fmt(t['records_per_s'])} | {fmt(t['mib_per_s'], 1)} "
            f"| {fmt(c['results']['throughput']['records_per_s']) if c else '–'} "
            f"| {fmt(cpu_us(p), 2)} | {fmt(peak_rss(p, 'ketch'), 1)} |"
        )
    if rows:
        out.append("\n## Compressed batches (1 KiB text-like records, 16 partitions, acks=all)\n")
        out.append("| codec | records | produce rec/s | produce MiB/s | consume rec/s | server CPU µs/rec | ketch peak RSS MiB |")
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        out.extend(rows)
    rounds = sorted({f.name.split("-")[2] for f in directory.glob("validation-this-*-lz4.json")})
    if not rounds:
        return
    out.append("\n## Validation's cost: this build against COMPARE_KETCH_BIN, alternated\n")
    out.append("| codec | round | before rec/s | this rec/s | this / before | before CPU µs/rec | this CPU µs/rec |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for codec in ("lz4", "zstd"):
        for r in rounds:
            before = load(directory, f"validation-compare-{r}-{codec}.json")
            this = load(directory, f"validation-this-{r}-{codec}.json")
            if before is None or this is None:
                continue
            b = before["results"]["throughput"]["records_per_s"]
            t = this["results"]["throughput"]["records_per_s"]
            out.append(
                f"| {codec} | {r} | {fmt(b)} | {fmt(t)} | {t / b:.3f} | {fmt(cpu_us(before), 2)} | {fmt(cpu_us(this), 2)} |"
            )


def cluster_section(directory, partitions, rounds):
    """Step 6: single Redis against a Redis Cluster, same workload, one run,
    the order of the two alternating by round."""
    out = [f"## Redis Cluster beside single Redis: 1 KiB records, {partitions} partitions, acks=all\n"]
    out.append(
        "| round (first) | mode | produce rec/s | consume rec/s | produce CPU µs/rec (ketch+redis) "
        "| of which ketch | consume CPU µs/rec | busiest master / mean (produce) |"
    )
    out.append("|---|---|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for r in range(1, int(rounds) + 1):
        first = "single" if r % 2 == 1 else "cluster"
        runs = {}
        for mode in ("single", "cluster"):
            p = load(directory, f"produce-{mode}-{partitions}p-1kb-{r}.json")
            c = load(directory, f"consume-{mode}-{partitions}p-1kb-{r}.json")
            if p is not None:
                runs[mode] = (p, c)
        for mode, (p, c) in runs.items():
            busiest = "–"
            if mode == "cluster":
                masters = [x["cpu_s"] for x in p["server"]["processes"] if x["name"] != "ketch"]
                busiest = f"{max(masters) / (sum(masters) / len(masters)):.3f}"
            out.append(
                f"| {r} ({first}) | {mode} | {fmt(p['results']['throughput']['records_per_s'])} "
                f"| {fmt(c['results']['throughput']['records_per_s']) if c else '–'} "
                f"| {fmt(cpu_us(p), 2)} | {fmt(cpu_us(p, 'ketch'), 2)} | {fmt(cpu_us(c), 2) if c else '–'} | {busiest} |"
            )
        if "single" in runs and "cluster" in runs:
            ratios.append((r, cpu_us(runs["cluster"][0]) / cpu_us(runs["single"][0]),
                           cpu_us(runs["cluster"][1]) / cpu_us(runs["single"][1])))
    out.append("")
    for r, produce, consume in ratios:
        out.append(f"- round {r}: cluster / single ketch+Redis CPU per record: produce {produce:.3f}, "
                   f"consume {consume:.3f} (target ≤ 1.10)")
    for r in range(1, int(rounds) + 1):
        for name, title in ((f"cluster-masters-{r}.tsv", "what each master received during produce and holds"),
                            (f"cluster-placement-{r}.tsv", "`ketch placement`")):
            path = directory / name
            if path.exists():
                out.append(f"\nRound {r}, {title}:\n\n```\n" + path.read_text().strip() + "\n```")
    return "\n".join(out)


def main():
    if sys.argv[1] == "--cluster":
        print(cluster_section(Path(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else 1))
        return
    directory = Path(sys.argv[1])
    out = []
    env = directory / "environment.txt"
    if env.exists():
        out.append("```\n" + env.read_text().strip() + "\n```\n")

    out.append("## Through ketch (acks=all, no compression, random payload, unlimited rate)\n")
    out.append(
        "| workload | records | produce rec/s | produce MiB/s | send→ack p99 ms | consume rec/s "
        "| server CPU µs/rec (ketch+redis) | ketch peak RSS MiB | Redis B/rec |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for w in WORKLOADS:
        p = load(directory, f"produce-{w}.json")
        c = load(directory, f"consume-{w}.json")
        if p is None:
            continue
        rows[w] = (p, c)
        t = p["results"]["throughput"]
        out.append(
            f"| {w} | {fmt(t['records'])} | {fmt(t['records_per_s'])} | {fmt(t['mib_per_s'], 1)} "
            f"| {fmt(p['results']['latency']['p99_ms'], 1)} "
            f"| {fmt(c['results']['throughput']['records_per_s']) if c else '–'} "
            f"| {fmt(cpu_us(p), 2)} | {fmt(peak_rss(p, 'ketch'), 1)} "
            f"| {fmt(p['redis_memory']['bytes_per_record'])} |"
        )

    out.append("\n## Direct Redis: one XADD per record, pipelined 1000 deep\n")
    out.append("| record size | connections | records | rec/s | MiB/s | redis CPU µs/rec | Redis B/rec |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    direct = {}
    for size in ["1KB", "100B"]:
        for clients in [1, 4]:
            x = load(directory, f"xadd-{size}-{clients}.json")
            if x is None:
                continue
            direct[(size, clients)] = x
            t = x["results"]["throughput"]
            out.append(
                f"| {size} | {clients} | {fmt(t['records'])} | {fmt(t['records_per_s'])} "
                f"| {fmt(t['mib_per_s'], 1)} | {fmt(cpu_us(x, 'redis-server'), 2)} "
                f"| {fmt(x['redis_memory']['bytes_per_record'])} |"
            )

    latency = {}
    for linger in [0, 1]:
        rt = load(directory, f"roundtrip-10k-1kb-linger{linger}.json")
        if rt:
            latency[linger] = rt["results"] | {"client_cpu_s": rt.get("client", {}).get("cpu_s")}
    if latency:
        out.append("\n## Fixed rate: 10,000 records/s of 1 KiB, 16 partitions, acks=all\n")
        out.append(
            "| producer linger.ms | acked | matched | missing | duplicates "
            "| produce p50 / p99 / max ms | end-to-end p50 / p99 / max ms | client CPU s |"
        )
        out.append("|---:|---:|---:|---:|---:|---|---|---:|")
        for linger, r in latency.items():
            pl, el = r["produce"]["latency"], r["end_to_end_latency"]
            out.append(
                f"| {linger} | {fmt(r['acked'])} | {fmt(r['matched'])} | {fmt(r['missing'])} "
                f"| {fmt(r['duplicates'])} | {pl['p50_ms']:.2f} / {pl['p99_ms']:.2f} / {pl['max_ms']:.2f} "
                f"| {el['p50_ms']:.2f} / {el['p99_ms']:.2f} / {el['max_ms']:.2f} "
                f"| {fmt(r['client_cpu_s'], 1)} |"
            )

    out.append("\n## Targets (issue #3), each a ratio measured in this run\n")
    out.append("| target | measured | |")
    out.append("|---|---|---|")
    key = "1-topic-16-partitions-1kb"
    direct_1k = [direct[k] for k in direct if k[0] == "1KB"]
    if key in rows and direct_1k:
        p, c = rows[key]
        ours = p["results"]["throughput"]["records_per_s"]
        for x in sorted(direct_1k, key=lambda x: -x["params"]["clients"]):
            ratio = ours / x["results"]["throughput"]["records_per_s"]
            out.append(
                f"| 1 KiB × 16 partitions, acks=all: ketch produce ≥ 1.5× direct XADD with "
                f"{x['params']['clients']} connection(s) (stretch 2×) | {ratio:.2f}× | {check(ratio >= 1.5)} |"
            )
        cheapest = min(cpu_us(x, "redis-server") for x in direct_1k)
        cpu_ratio = cpu_us(p) / cheapest
        out.append(
            f"| server CPU per record (ketch + redis) ≤ ¼ of redis CPU per record direct "
            f"| {cpu_us(p):.2f} / {cheapest:.2f} µs = {cpu_ratio:.2f} | {check(cpu_ratio <= 0.25)} |"
        )
        if c:
            cr = c["results"]["throughput"]["records_per_s"] / p["results"]["throughput"]["records_per_s"]
            out.append(f"| consume ≥ produce (same data) | {cr:.2f}× | {check(cr >= 1.0)} |")
        peak = max(peak_rss(r[0], "ketch") or 0 for r in rows.values())
        out.append(
            f"| ketch peak RSS ≤ 100 MiB (VmHWM since start, whole run) | {peak:.1f} MiB | {check(peak <= 100)} |"
        )
        for size, wl in [("1KB", key), ("100B", "1-topic-16-partitions-100b")]:
            xs = [direct[k] for k in direct if k[0] == size]
            if wl in rows and xs:
                ours = rows[wl][0]["redis_memory"]["bytes_per_record"]
                theirs = min(x["redis_memory"]["bytes_per_record"] for x in xs)
                out.append(
                    f"| Redis memory per {size} record below direct | {ours:,.0f} vs {theirs:,.0f} B "
                    f"({ours / theirs:.2f}×) | {check(ours < theirs)} |"
                )
    for linger, r in latency.items():
        pl, el = r["produce"]["latency"], r["end_to_end_latency"]
        out.append(
            f"| 10k rec/s, linger.ms={linger}: produce p99 ≤ 5 ms | {pl['p99_ms']:.2f} ms | {check(pl['p99_ms'] <= 5)} |"
        )
        out.append(
            f"| 10k rec/s, linger.ms={linger}: end-to-end p99 ≤ 10 ms | {el['p99_ms']:.2f} ms "
            f"| {check(el['p99_ms'] <= 10)} |"
        )
    peer_section(directory, rows, out)
    compressed_section(directory, out)
    print("\n".join(out))


def peer_section(directory, rows, out):
    """The peer broker (--peer-bootstrap / --peer-cmd) beside ketch, same
    presets, alternated in one run."""
    peer = {}
    for w in WORKLOADS:
        p = load(directory, f"peer-produce-{w}.json")
        if p is not None:
            peer[w] = (p, load(directory, f"peer-consume-{w}.json"))
    if not peer:
        return
    out.append("\n## ketch beside the peer (same presets, alternated in this run)\n")
    out.append(
        "| workload | ketch produce rec/s | peer produce rec/s | ketch / peer | ketch consume rec/s "
        "| peer consume rec/s | ketch / peer | server CPU µs/rec produce: ketch+redis / peer | peer peak RSS MiB |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "–"

    for w, (pp, pc) in peer.items():
        if w not in rows:
            continue
        kp, kc = rows[w]
        peer_cpu = cpu_us(pp) if pp["server"]["processes"] else None
        peer_rss = max((x["peak_rss_mib"] or 0 for x in pp["server"]["processes"]), default=None)
        out.append(
            f"| {w} | {fmt(rate(kp))} | {fmt(rate(pp))} | {ratio(rate(kp), rate(pp))} "
            f"| {fmt(rate(kc))} | {fmt(rate(pc))} | {ratio(rate(kc), rate(pc))} "
            f"| {fmt(cpu_us(kp), 2)} / {fmt(peer_cpu, 2)} | {fmt(peer_rss, 1)} |"
        )
    peer_rounds_section(directory, peer, out)
    for linger in (0, 1):
        k = load(directory, f"roundtrip-10k-1kb-linger{linger}.json")
        q = load(directory, f"peer-roundtrip-10k-1kb-linger{linger}.json")
        if k and q:
            kl, ql = k["results"], q["results"]
            out.append(
                f"- 10k rec/s, linger.ms={linger}: produce p99 ketch {kl['produce']['latency']['p99_ms']:.2f} ms, "
                f"peer {ql['produce']['latency']['p99_ms']:.2f} ms; end-to-end p99 ketch "
                f"{kl['end_to_end_latency']['p99_ms']:.2f} ms, peer {ql['end_to_end_latency']['p99_ms']:.2f} ms"
            )


def peer_rounds_section(directory, peer, out):
    """Every round's ratios, ketch ÷ peer, and their median, where
    run-baseline.sh ran the presets PEER_ROUNDS times (…-round<N>.json)."""
    def ratio(a, b):
        return a / b if a and b else None

    table = []
    for w in peer:
        rounds = []
        for n in range(1, 100):
            suffix = "" if n == 1 else f"-round{n}"
            kp = load(directory, f"produce-{w}{suffix}.json")
            pp = load(directory, f"peer-produce-{w}{suffix}.json")
            if kp is None or pp is None:
                break
            kc = load(directory, f"consume-{w}{suffix}.json")
            pc = load(directory, f"peer-consume-{w}{suffix}.json")
            peer_cpu = cpu_us(pp) if pp["server"]["processes"] else None
            rounds.append((
                ratio(rate(kp), rate(pp)),
                ratio(rate(kc), rate(pc)),
                ratio(cpu_us(kp), peer_cpu),
            ))
        if len(rounds) > 1:
            table.append((w, rounds))
    if not table:
        return
    out.append(
        f"\n### Every round, ketch ÷ peer ({len(table[0][1])} rounds, who went first alternating)\n"
    )
    out.append(
        "| workload | produce rate | median | consume rate | median "
        "| produce CPU per record | median |"
    )
    out.append("|---|---|---:|---|---:|---|---:|")

    def column(values):
        shown = ", ".join(fmt(v, 2) for v in values)
        present = sorted(v for v in values if v is not None)
        if not present:
            return f"{shown} | –"
        mid = len(present) // 2
        median = present[mid] if len(present) % 2 else (present[mid - 1] + present[mid]) / 2
        return f"{shown} | {median:.2f}"

    for w, rounds in table:
        produce, consume, cpu = zip(*rounds)
        out.append(f"| {w} | {column(produce)} | {column(consume)} | {column(cpu)} |")


if __name__ == "__main__":
    main()
