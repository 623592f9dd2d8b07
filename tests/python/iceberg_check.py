"""Reads a ketch topic table with pyiceberg and checks it against what the
Rust test produced (tests/tests/tiering.rs runs this).

Usage: python3 iceberg_check.py SPEC.json, where SPEC is
  {"catalog_uri": SQLAlchemy URI, "catalog_name": str, "namespace": str,
   "table": str, "warehouse": str, "s3": {endpoint, access_key, secret_key,
   region} or null,
   "partitions": {"<p>": [first_offset, end_offset_exclusive]},
   "samples": [{"partition": p, "offset": o, "key": hex|null, "value": hex|null}],
   "codec": {"table": write.parquet.compression-codec, "files": [names
   pyarrow may give the codec in a column chunk]} or absent}
It also checks that each partition's segments were committed in order.
Prints one JSON line with what it found; exits 1 on any mismatch.
"""

import json
import sys

import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog


def main() -> int:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    props = {"uri": spec["catalog_uri"], "warehouse": spec["warehouse"]}
    if spec.get("s3"):
        s3 = spec["s3"]
        props.update({
            "s3.endpoint": s3["endpoint"],
            "s3.access-key-id": s3["access_key"],
            "s3.secret-access-key": s3["secret_key"],
            "s3.region": s3["region"],
            "s3.force-virtual-addressing": "false",
        })
    catalog = SqlCatalog(spec["catalog_name"], **props)
    table = catalog.load_table((spec["namespace"], spec["table"]))
    errors = []
    fields = {f.name: str(f.field_type) for f in table.schema().fields}
    want = {"partition": "int", "offset": "long", "timestamp": "timestamptz",
            "key": "binary", "value": "binary"}
    for name, kind in want.items():
        if fields.get(name) != kind:
            errors.append(f"column {name} is {fields.get(name)}, expected {kind}")
    if "headers" not in fields:
        errors.append("no headers column")
    spec_fields = [f.name for f in table.spec().fields]
    if spec_fields != ["partition"]:
        errors.append(f"partition spec is {spec_fields}, expected identity on partition")

    rows = table.scan(selected_fields=("partition", "offset")).to_arrow()
    found = {}
    for p, (first, end) in spec["partitions"].items():
        offsets = rows.filter(pc.equal(rows["partition"], int(p)))["offset"]
        count = len(offsets)
        distinct = len(pc.unique(offsets)) if count else 0
        lo = pc.min(offsets).as_py() if count else None
        hi = pc.max(offsets).as_py() if count else None
        found[p] = {"count": count, "distinct": distinct, "min": lo, "max": hi}
        expected = end - first
        if count != expected or distinct != expected:
            errors.append(f"partition {p}: {count} rows, {distinct} distinct offsets; expected {expected}")
        if expected and (lo != first or hi != end - 1):
            errors.append(f"partition {p}: offsets {lo}..{hi}, expected {first}..{end - 1}")
    total = sum(end - first for first, end in spec["partitions"].values())
    if len(rows) != total:
        errors.append(f"the table has {len(rows)} rows, expected {total}")

    for sample in spec["samples"]:
        expr = f"partition == {sample['partition']} and offset == {sample['offset']}"
        got = table.scan(row_filter=expr, selected_fields=("key", "value")).to_arrow().to_pylist()
        if len(got) != 1:
            errors.append(f"{expr}: {len(got)} rows")
            continue
        key = got[0]["key"].hex() if got[0]["key"] is not None else None
        value = got[0]["value"].hex() if got[0]["value"] is not None else None
        if key != sample["key"] or value != sample["value"]:
            errors.append(f"{expr}: key/value differ (key {key} vs {sample['key']})")

    # ketch commits a partition's segments in order, each one after the
    # last: the snapshots that record a segment (maintenance's do not) name
    # ascending, adjoining offset ranges per partition.
    commits = 0
    last_of = {}
    for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0):
        summary = snapshot.summary
        props = dict(getattr(summary, "additional_properties", None) or {}) if summary else {}
        if "ketch.base-offset" not in props:
            continue
        commits += 1
        p = props["ketch.partition"]
        base, last = int(props["ketch.base-offset"]), int(props["ketch.last-offset"])
        if p in last_of and base != last_of[p] + 1:
            errors.append(f"partition {p}: segment {base}..{last} committed after one ending at {last_of[p]}")
        last_of[p] = last
    if not commits:
        errors.append("no snapshot records a segment")

    codec = spec.get("codec")
    files = 0
    if codec:
        recorded = table.properties.get("write.parquet.compression-codec")
        if recorded != codec["table"]:
            errors.append(f"the table records codec {recorded}, expected {codec['table']}")
        for path in table.inspect.files()["file_path"].to_pylist():
            files += 1
            with table.io.new_input(path).open() as stream:
                metadata = pq.ParquetFile(stream).metadata
                for g in range(metadata.num_row_groups):
                    group = metadata.row_group(g)
                    for c in range(group.num_columns):
                        column = group.column(c)
                        if column.compression not in codec["files"]:
                            errors.append(f"{path}: column {column.path_in_schema} is {column.compression}")
        if not files:
            errors.append("no data files")

    print(json.dumps({"rows": len(rows), "segment_commits": commits, "codec_checked_files": files, "partitions": found,
                      "samples": len(spec["samples"]), "errors": errors}))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
