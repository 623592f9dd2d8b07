#!/usr/bin/env python3
"""Where a transaction's time goes, from a gateway's request log.

Run ketch with RUST_LOG=info,ketch_gateway::server=debug (one line per
request: api, duration_us, the time it was answered), drive it with
benchmark/txn-throughput.py, then:

    benchmark/txn-timeline.py ketch.log

Splits the requests into transactions at each EndTxn (the first third is
skipped as warm-up) and prints, per API, the requests per transaction and
their server time (p50, mean); the span of a transaction on the server
(first request's arrival to EndTxn's answer); two sample timelines (ms from
the transaction's first request: arrival, answer, API); and the time from
an EndTxn's answer to the next AddPartitionsToTxn's arrival, which the
client spends on its own (the application's next produce() calls, and
librdkafka's partition-registration timer).
"""

import bisect
import datetime
import re
import statistics
import sys

LINE = re.compile(
    r"^(\S+)\s+DEBUG .*?request client_id=\"?([^\" ]*)\"? api=(\w+) version=(\d+) "
    r"correlation_id=(\d+) duration_us=(\d+)"
)


def requests(path):
    """(arrival, answer, api) of every request line, by arrival (seconds)."""
    rows = []
    with open(path) as log:
        for line in log:
            m = LINE.search(line)
            if not m:
                continue
            answered = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            rows.append((answered - int(m.group(6)) / 1e6, answered, m.group(3)))
    rows.sort()
    return rows


def ms(seconds):
    return round(seconds * 1e3, 3)


def main(path):
    rows = requests(path)
    transactions, current = [], []
    for row in rows:
        current.append(row)
        if row[2] == "EndTxn":
            transactions.append(current)
            current = []
    transactions = transactions[len(transactions) // 3 :]
    if not transactions:
        sys.exit(f"{path}: no EndTxn request lines (RUST_LOG=info,ketch_gateway::server=debug?)")
    per_api = {}
    for txn in transactions:
        for arrival, answer, api in txn:
            per_api.setdefault(api, []).append(answer - arrival)
    spans = [txn[-1][1] - txn[0][0] for txn in transactions]
    print(f"transactions {len(transactions)}, server span p50 {ms(statistics.median(spans))} ms")
    for api, durations in per_api.items():
        print(
            f"{api}: {len(durations) / len(transactions):.1f} per transaction, "
            f"p50 {ms(statistics.median(durations))} ms, mean {ms(statistics.mean(durations))} ms"
        )
    for txn in transactions[5:7]:
        print("---")
        base = txn[0][0]
        for arrival, answer, api in txn:
            print(f"{ms(arrival - base):8.3f} {ms(answer - base):8.3f} {api}")
    ends = [answer for _, answer, api in rows if api == "EndTxn"]
    starts = [arrival for arrival, _, api in rows if api == "AddPartitionsToTxn"]
    gaps = []
    for end in ends:
        i = bisect.bisect_left(starts, end)
        if i < len(starts):
            gaps.append(starts[i] - end)
    gaps = gaps[len(gaps) // 3 :]
    if gaps:
        print(
            f"EndTxn answered -> next AddPartitionsToTxn: p50 {ms(statistics.median(gaps))} ms, "
            f"p90 {ms(sorted(gaps)[int(len(gaps) * 0.9)])} ms"
        )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
