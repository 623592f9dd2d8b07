#!/usr/bin/env python3
"""Reads ketch's Iceberg archive with pyiceberg (the query service of
docker-compose.yml).

  query.py                       the namespace's tables, with their row counts
  query.py TOPIC                 a topic's table: rows and offsets per partition,
                                 then its first rows (--limit N, default 10;
                                 --partition P and --offset O choose where)
  query.py TOPIC --wait-rows N   first wait (--timeout S, default 120) until the
                                 table holds at least N rows; exit 1 if it
                                 does not in time
  --json                         print one JSON object instead of text

The catalog comes from the environment: CATALOG_NAME (ketch's
tiering.catalog_name, default ketch), CATALOG_URI (a SQLAlchemy URL:
postgresql+psycopg2://user:password@host/db or sqlite:////path), NAMESPACE
(tiering.namespace, default ketch), WAREHOUSE, and for an S3 warehouse
S3_ENDPOINT, S3_REGION, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY.
"""

import argparse
import json
import os
import sys
import time

import pyarrow.compute as pc
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from sqlalchemy.exc import OperationalError, ProgrammingError

# Before ketch's first archive the catalog's tables do not exist; this
# script never creates them (ketch does, with its own column types).
MISSING = (NoSuchTableError, NoSuchNamespaceError, OperationalError, ProgrammingError)


def catalog() -> SqlCatalog:
    props = {"uri": os.environ["CATALOG_URI"], "init_catalog_tables": "false"}
    if os.environ.get("WAREHOUSE"):
        props["warehouse"] = os.environ["WAREHOUSE"]
    if os.environ.get("S3_ENDPOINT"):
        props.update({
            "s3.endpoint": os.environ["S3_ENDPOINT"],
            "s3.region": os.environ.get("S3_REGION", "us-east-1"),
            "s3.access-key-id": os.environ.get("S3_ACCESS_KEY_ID", ""),
            "s3.secret-access-key": os.environ.get("S3_SECRET_ACCESS_KEY", ""),
            # Path-style requests, as ketch's tiering.s3_path_style.
            "s3.force-virtual-addressing": "false",
        })
    return SqlCatalog(os.environ.get("CATALOG_NAME", "ketch"), **props)


def partitions(table) -> dict:
    """Rows, first and last offset per partition (reads two columns)."""
    rows = table.scan(selected_fields=("partition", "offset")).to_arrow()
    found = {}
    for p in sorted(pc.unique(rows["partition"]).to_pylist()):
        offsets = rows.filter(pc.equal(rows["partition"], p))["offset"]
        found[p] = {
            "rows": len(offsets),
            "distinct": len(pc.unique(offsets)),
            "first": pc.min(offsets).as_py(),
            "last": pc.max(offsets).as_py(),
        }
    return found


def show(value, width=60):
    if value is None:
        return "null"
    text = value.decode("utf-8", errors="replace")
    return text if len(text) <= width else text[: width - 1] + "…"


def list_tables(cat, namespace, as_json) -> int:
    try:
        idents = sorted(cat.list_tables(namespace))
    except MISSING:
        idents = []
    tables = {}
    for ident in idents:
        name = ident[-1]
        tables[name] = sum(p["rows"] for p in partitions(cat.load_table(ident)).values())
    if as_json:
        print(json.dumps({"namespace": namespace, "tables": tables}))
    elif not tables:
        print(f"no tables in namespace {namespace!r} yet (a topic's table appears with its first archived segment)")
    else:
        for name, rows in tables.items():
            print(f"{namespace}.{name}\t{rows} rows")
    return 0


def table_rows(cat, namespace, topic):
    try:
        table = cat.load_table((namespace, topic))
    except MISSING:
        return None, {}
    return table, partitions(table)


def describe(cat, namespace, args) -> int:
    deadline = time.monotonic() + args.timeout
    while True:
        table, parts = table_rows(cat, namespace, args.topic)
        total = sum(p["rows"] for p in parts.values())
        if args.wait_rows is None or total >= args.wait_rows or time.monotonic() >= deadline:
            break
        time.sleep(2)

    rows = []
    if table is not None and args.limit > 0:
        conditions = [f"offset >= {args.offset}"]
        if args.partition is not None:
            conditions.append(f"partition == {args.partition}")
        scan = table.scan(row_filter=" and ".join(conditions),
                          selected_fields=("partition", "offset", "timestamp", "key", "value", "headers"))
        got = scan.to_arrow().sort_by([("partition", "ascending"), ("offset", "ascending")])
        rows = got.slice(0, args.limit).to_pylist()

    short = args.wait_rows is not None and total < args.wait_rows
    if args.json:
        print(json.dumps({
            "table": f"{namespace}.{args.topic}",
            "exists": table is not None,
            "rows": total,
            "partitions": {str(p): v for p, v in parts.items()},
            "sample": [{
                "partition": r["partition"], "offset": r["offset"],
                "timestamp": r["timestamp"].isoformat(),
                "key": None if r["key"] is None else r["key"].decode("utf-8", errors="replace"),
                "value": None if r["value"] is None else r["value"].decode("utf-8", errors="replace"),
                "headers": len(r["headers"] or []),
            } for r in rows],
        }))
    elif table is None:
        print(f"no table {namespace}.{args.topic} (yet: it appears with the topic's first archived segment)")
    else:
        print(f"{namespace}.{args.topic}: {total} rows")
        for p, v in parts.items():
            print(f"  partition {p}: {v['rows']} rows, offsets {v['first']}..{v['last']}")
        if rows:
            print("partition\toffset\ttimestamp\tkey\tvalue")
            for r in rows:
                print(f"{r['partition']}\t{r['offset']}\t{r['timestamp'].isoformat()}\t"
                      f"{show(r['key'])}\t{show(r['value'])}")
    if short:
        print(f"query: {namespace}.{args.topic} has {total} rows after {args.timeout}s, "
              f"expected at least {args.wait_rows}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="Read ketch's Iceberg archive.")
    parser.add_argument("topic", nargs="?", help="a topic (its table); none: list the tables")
    parser.add_argument("--limit", type=int, default=10, help="rows to print (default 10)")
    parser.add_argument("--partition", type=int, help="only this partition's rows")
    parser.add_argument("--offset", type=int, default=0, help="rows from this offset on")
    parser.add_argument("--wait-rows", type=int, help="wait until the table has this many rows")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds --wait-rows waits")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    namespace = os.environ.get("NAMESPACE", "ketch")
    cat = catalog()
    if args.topic is None:
        return list_tables(cat, namespace, args.json)
    return describe(cat, namespace, args)


if __name__ == "__main__":
    sys.exit(main())
