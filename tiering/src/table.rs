//! The Iceberg table of a topic (DESIGN §7) and its rows as Arrow arrays.
//!
//! One table per topic, `<namespace>.<topic>`, partitioned by identity on
//! `partition`, rows in offset order:
//! `partition int, offset long, timestamp timestamptz, key binary,
//! value binary, headers list<struct<key string, value binary>>`.
//! [`Rows`] turns Kafka record batches into Arrow record batches of that
//! schema; [`encode`] turns such rows back into Kafka record batches.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Int32Builder, Int64Builder, LargeBinaryBuilder, ListBuilder, StringBuilder, StructBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use bytes::Bytes;
use iceberg::spec::{
    ListType, NestedField, PrimitiveType, Schema, SortDirection, SortField, SortOrder, StructType, Transform,
    Type, UnboundPartitionSpec,
};
use ketch_storage::batch::{BatchBuilder, PlainRecords, Records};

use crate::{Error, Result};

/// The field ids of the table schema (stable: readers may depend on them).
pub const PARTITION_ID: i32 = 1;
pub const OFFSET_ID: i32 = 2;

/// The table schema.
pub fn schema() -> Schema {
    let header = StructType::new(vec![
        NestedField::required(8, "key", Type::Primitive(PrimitiveType::String)).into(),
        NestedField::optional(9, "value", Type::Primitive(PrimitiveType::Binary)).into(),
    ]);
    Schema::builder()
        .with_schema_id(0)
        .with_fields(vec![
            NestedField::required(PARTITION_ID, "partition", Type::Primitive(PrimitiveType::Int)).into(),
            NestedField::required(OFFSET_ID, "offset", Type::Primitive(PrimitiveType::Long)).into(),
            NestedField::required(3, "timestamp", Type::Primitive(PrimitiveType::Timestamptz)).into(),
            NestedField::optional(4, "key", Type::Primitive(PrimitiveType::Binary)).into(),
            NestedField::optional(5, "value", Type::Primitive(PrimitiveType::Binary)).into(),
            NestedField::optional(
                6,
                "headers",
                Type::List(ListType::new(
                    NestedField::list_element(7, Type::Struct(header), true).into(),
                )),
            )
            .into(),
        ])
        .build()
        .expect("the table schema is valid")
}

/// Identity partitioning on `partition`.
pub fn partition_spec() -> UnboundPartitionSpec {
    UnboundPartitionSpec::builder()
        .add_partition_field(PARTITION_ID, "partition", Transform::Identity)
        .expect("the partition spec is valid")
        .build()
}

/// Rows sorted by offset.
pub fn sort_order(schema: &Schema) -> SortOrder {
    SortOrder::builder()
        .with_order_id(1)
        .with_sort_field(
            SortField::builder()
                .source_id(OFFSET_ID)
                .direction(SortDirection::Ascending)
                .null_order(iceberg::spec::NullOrder::First)
                .transform(Transform::Identity)
                .build(),
        )
        .build(schema)
        .expect("the sort order is valid")
}

/// Accumulates records as Arrow columns of the table schema.
pub struct Rows {
    schema: SchemaRef,
    partition: i32,
    partitions: Int32Builder,
    offsets: Int64Builder,
    timestamps: TimestampMicrosecondBuilder,
    /// The timestamp column's time zone.
    time_zone: Option<Arc<str>>,
    keys: BinaryColumn,
    values: BinaryColumn,
    headers: ListBuilder<StructBuilder>,
    count: usize,
}

/// Iceberg `binary` maps to Arrow `LargeBinary`; accept `Binary` too.
enum BinaryColumn {
    Large(LargeBinaryBuilder),
    Small(BinaryBuilder),
}

impl BinaryColumn {
    fn new(data_type: &DataType) -> Self {
        match data_type {
            DataType::Binary => BinaryColumn::Small(BinaryBuilder::new()),
            _ => BinaryColumn::Large(LargeBinaryBuilder::new()),
        }
    }

    fn append(&mut self, value: Option<&[u8]>) {
        match self {
            BinaryColumn::Large(b) => b.append_option(value),
            BinaryColumn::Small(b) => b.append_option(value),
        }
    }

    /// Bytes of values so far.
    fn bytes(&self) -> usize {
        match self {
            BinaryColumn::Large(b) => b.values_slice().len(),
            BinaryColumn::Small(b) => b.values_slice().len(),
        }
    }

    /// The column so far; the builder starts over with room for `rows`
    /// values of `bytes` bytes.
    fn finish(&mut self, rows: usize, bytes: usize) -> ArrayRef {
        match self {
            BinaryColumn::Large(b) => {
                Arc::new(std::mem::replace(b, LargeBinaryBuilder::with_capacity(rows, bytes)).finish())
            }
            BinaryColumn::Small(b) => {
                Arc::new(std::mem::replace(b, BinaryBuilder::with_capacity(rows, bytes)).finish())
            }
        }
    }
}

impl Rows {
    /// `schema` is the Arrow form of [`schema`] (with field ids).
    pub fn new(schema: SchemaRef, partition: i32) -> Result<Self> {
        let field = |name: &str| {
            schema
                .field_with_name(name)
                .cloned()
                .map_err(|e| Error::Schema(e.to_string()))
        };
        let timestamp = field("timestamp")?;
        let DataType::List(element) = field("headers")?.data_type().clone() else {
            return Err(Error::Schema("headers is not a list".to_owned()));
        };
        let DataType::Struct(header_fields) = element.data_type().clone() else {
            return Err(Error::Schema("a header is not a struct".to_owned()));
        };
        let header = StructBuilder::from_fields(header_fields, 0);
        let tz = match timestamp.data_type() {
            DataType::Timestamp(_, tz) => tz.clone(),
            other => return Err(Error::Schema(format!("timestamp is {other}"))),
        };
        Ok(Self {
            partition,
            partitions: Int32Builder::new(),
            offsets: Int64Builder::new(),
            timestamps: TimestampMicrosecondBuilder::new().with_timezone_opt(tz.clone()),
            time_zone: tz,
            keys: BinaryColumn::new(field("key")?.data_type()),
            values: BinaryColumn::new(field("value")?.data_type()),
            headers: ListBuilder::new(header).with_field(element),
            count: 0,
            schema,
        })
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Adds every record of a stored batch (base offset already set):
    /// read in place when the batch is uncompressed, else decompressed as a
    /// stream.
    pub fn add_batch(&mut self, batch: &Bytes) -> Result<()> {
        let header = ketch_storage::batch::header(batch)?;
        let base_offset = i64::from_be_bytes(batch[0..8].try_into().expect("8 bytes"));
        // LogAppendTime: every record's timestamp is the batch's max timestamp.
        let log_append_time = header.attributes & 0x08 != 0;
        let timestamp = |record_timestamp: i64| {
            if log_append_time {
                header.max_timestamp
            } else {
                record_timestamp
            }
        };
        if let Some(records) = PlainRecords::of_batch(batch)? {
            for record in records {
                let record = record?;
                self.push(
                    base_offset + i64::from(record.offset_delta),
                    timestamp(record.timestamp),
                    record.key,
                    record.value,
                    record.headers(),
                )?;
            }
            return Ok(());
        }
        let mut records = Records::of_batch(batch)?;
        while let Some(record) = records.next_record()? {
            self.push(
                base_offset + i64::from(record.offset_delta),
                timestamp(record.timestamp),
                record.key.as_deref(),
                record.value.as_deref(),
                record.headers.iter().map(|(k, v)| (&k[..], v.as_deref())),
            )?;
        }
        Ok(())
    }

    fn push<'a>(
        &mut self,
        offset: i64,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<()> {
        self.partitions.append_value(self.partition);
        self.offsets.append_value(offset);
        self.timestamps.append_value(timestamp_ms.saturating_mul(1000));
        self.keys.append(key);
        self.values.append(value);
        let header_builder = self.headers.values();
        for (key, value) in headers {
            header_builder
                .field_builder::<StringBuilder>(0)
                .ok_or_else(|| Error::Schema("header key is not a string".to_owned()))?
                .append_value(String::from_utf8_lossy(key));
            match header_builder.field_builder::<BinaryBuilder>(1) {
                Some(b) => b.append_option(value),
                None => header_builder
                    .field_builder::<LargeBinaryBuilder>(1)
                    .ok_or_else(|| Error::Schema("header value is not binary".to_owned()))?
                    .append_option(value),
            }
            header_builder.append(true);
        }
        self.headers.append(true);
        self.count += 1;
        Ok(())
    }

    /// The rows so far as one Arrow batch; the builders start over, with
    /// room for as many rows and bytes again (a segment's row groups are
    /// alike: growing the buffers anew for each, copying them and faulting
    /// in fresh pages at every doubling, was a tenth of archiving's CPU).
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let (rows, key_bytes, value_bytes) = (self.count, self.keys.bytes(), self.values.bytes());
        let columns: Vec<ArrayRef> = vec![
            Arc::new(std::mem::replace(&mut self.partitions, Int32Builder::with_capacity(rows)).finish()),
            Arc::new(std::mem::replace(&mut self.offsets, Int64Builder::with_capacity(rows)).finish()),
            Arc::new(
                std::mem::replace(
                    &mut self.timestamps,
                    TimestampMicrosecondBuilder::with_capacity(rows)
                        .with_timezone_opt(self.time_zone.clone()),
                )
                .finish(),
            ),
            self.keys.finish(rows, key_bytes),
            self.values.finish(rows, value_bytes),
            Arc::new(self.headers.finish()),
        ];
        self.count = 0;
        RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| Error::Schema(e.to_string()))
    }
}

/// Read access to the columns of archived rows, whatever binary width a
/// reader produced. Every array is downcast once, here, not per row.
pub struct Columns<'a> {
    offsets: &'a arrow_array::PrimitiveArray<Int64Type>,
    timestamps: &'a arrow_array::PrimitiveArray<TimestampMicrosecondType>,
    keys: BinaryRef<'a>,
    values: BinaryRef<'a>,
    headers: Option<Headers<'a>>,
}

/// A binary column of either width.
#[derive(Clone, Copy)]
enum BinaryRef<'a> {
    Large(&'a arrow_array::LargeBinaryArray),
    Small(&'a arrow_array::BinaryArray),
}

impl<'a> BinaryRef<'a> {
    fn of(array: &'a dyn Array, what: &str) -> Result<Self> {
        match array.data_type() {
            DataType::LargeBinary => Ok(BinaryRef::Large(array.as_binary::<i64>())),
            DataType::Binary => Ok(BinaryRef::Small(array.as_binary::<i32>())),
            other => Err(Error::Schema(format!("{what} is {other}, not binary"))),
        }
    }

    fn get(self, i: usize) -> Option<&'a [u8]> {
        match self {
            BinaryRef::Large(a) => (!a.is_null(i)).then(|| a.value(i)),
            BinaryRef::Small(a) => (!a.is_null(i)).then(|| a.value(i)),
        }
    }
}

/// The headers list: its offsets into the flattened header keys and values.
struct Headers<'a> {
    list: &'a arrow_array::ListArray,
    keys: &'a arrow_array::StringArray,
    values: BinaryRef<'a>,
}

impl<'a> Columns<'a> {
    pub fn of(batch: &'a RecordBatch) -> Result<Self> {
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| Error::Schema(format!("archived rows have no `{name}` column")))
        };
        let offsets = column("offset")?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| Error::Schema("offset is not a long".to_owned()))?;
        let timestamps = column("timestamp")?
            .as_primitive_opt::<TimestampMicrosecondType>()
            .ok_or_else(|| Error::Schema("timestamp is not in microseconds".to_owned()))?;
        let headers = match column("headers")?.as_list_opt::<i32>() {
            None => None,
            Some(list) => {
                let bad = || Error::Schema("headers are not a list of {key string, value binary}".to_owned());
                let entries = list.values().as_struct_opt().ok_or_else(bad)?;
                if entries.num_columns() != 2 {
                    return Err(bad());
                }
                Some(Headers {
                    list,
                    keys: entries.column(0).as_string_opt::<i32>().ok_or_else(bad)?,
                    values: BinaryRef::of(entries.column(1).as_ref(), "a header value")?,
                })
            }
        };
        Ok(Self {
            offsets,
            timestamps,
            keys: BinaryRef::of(column("key")?.as_ref(), "key")?,
            values: BinaryRef::of(column("value")?.as_ref(), "value")?,
            headers,
        })
    }

    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    pub fn offset(&self, i: usize) -> i64 {
        self.offsets.value(i)
    }

    /// The record's timestamp in milliseconds.
    pub fn timestamp_ms(&self, i: usize) -> i64 {
        self.timestamps.value(i).div_euclid(1000)
    }

    /// An upper bound of row `i`'s size in a batch.
    pub fn size_hint(&self, i: usize) -> usize {
        let headers: usize = self
            .headers
            .as_ref()
            .filter(|h| !h.list.is_null(i))
            .map_or(0, |h| {
                let offsets = h.list.value_offsets();
                (offsets[i] as usize..offsets[i + 1] as usize)
                    .map(|j| h.keys.value(j).len() + h.values.get(j).map_or(0, <[u8]>::len) + 10)
                    .sum()
            });
        // Length, attributes, timestamp and offset deltas, key and value
        // lengths, header count: at most 1 + 5 + 10 + 5 + 5 + 5 + 5 bytes.
        36 + self.keys.get(i).map_or(0, <[u8]>::len) + self.values.get(i).map_or(0, <[u8]>::len) + headers
    }

    /// Appends row `i` to a Kafka batch.
    pub fn push_to(&self, i: usize, batch: &mut BatchBuilder) {
        let key = self.keys.get(i);
        let value = self.values.get(i);
        let headers = self
            .headers
            .as_ref()
            .filter(|h| !h.list.is_null(i))
            .map_or(0..0, |h| {
                let offsets = h.list.value_offsets();
                offsets[i] as usize..offsets[i + 1] as usize
            });
        let pairs = headers.map(|j| {
            let h = self.headers.as_ref().expect("headers present");
            (h.keys.value(j).as_bytes(), h.values.get(j))
        });
        batch.push(self.timestamp_ms(i), key, value, pairs);
    }
}

/// Kafka batches of the rows from index `from` on, each at most
/// `batch_bytes` (or one row), together at most `max_bytes` (a fetch's
/// limit: a batch past it would be dropped from the response). With
/// `take_first`, the first row is returned whatever its size. Returns the
/// batches and the index of the first row not returned.
pub fn encode(
    columns: &Columns<'_>,
    from: usize,
    batch_bytes: usize,
    max_bytes: usize,
    take_first: bool,
) -> (Vec<Bytes>, usize) {
    let mut out = Vec::new();
    let mut total = 0usize;
    let mut i = from;
    while i < columns.len() {
        let remaining = max_bytes.saturating_sub(total);
        let mut batch = BatchBuilder::new(columns.offset(i));
        while i < columns.len() {
            // A batch's offsets are consecutive: a gap the archive left
            // (Segment::holes) starts another.
            if !batch.is_empty() && columns.offset(i) != columns.offset(i - 1) + 1 {
                break;
            }
            let hint = columns.size_hint(i);
            let fits = if batch.is_empty() {
                batch.len() + hint <= remaining || (take_first && out.is_empty())
            } else {
                batch.len() + hint <= batch_bytes.min(remaining)
            };
            if !fits {
                break;
            }
            columns.push_to(i, &mut batch);
            i += 1;
        }
        if batch.is_empty() {
            break;
        }
        let batch = batch.finish();
        total += batch.len();
        out.push(batch);
    }
    (out, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrow_schema() -> SchemaRef {
        Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema()).expect("arrow schema"))
    }

    #[test]
    fn records_survive_rows_and_back() {
        let mut produced = BatchBuilder::new(40);
        produced.push(
            1_000,
            Some(b"a"),
            Some(b"1"),
            [(&b"h"[..], Some(&b"x"[..])), (&b"h"[..], None)].into_iter(),
        );
        produced.push(999, None, None, std::iter::empty());
        produced.push(
            1_002,
            Some(b""),
            Some(&[7u8; 50][..]),
            [(&b"k"[..], Some(&b""[..]))].into_iter(),
        );
        let produced = produced.finish();

        let mut rows = Rows::new(arrow_schema(), 3).unwrap();
        rows.add_batch(&produced).unwrap();
        assert_eq!(rows.len(), 3);
        let rows = rows.finish().unwrap();
        let columns = Columns::of(&rows).unwrap();
        assert_eq!((columns.offset(0), columns.offset(2)), (40, 42));
        assert_eq!(columns.timestamp_ms(1), 999);

        // From the middle, one record per batch.
        let (batches, end) = encode(&columns, 1, 1, usize::MAX, true);
        assert_eq!((batches.len(), end), (2, 3));
        let mut again = Vec::new();
        for batch in &batches {
            let base = i64::from_be_bytes(batch[0..8].try_into().unwrap());
            let mut records = Records::of_batch(batch).unwrap();
            while let Some(r) = records.next_record().unwrap() {
                again.push((base + i64::from(r.offset_delta), r));
            }
        }
        let mut original = Records::of_batch(&produced).unwrap();
        original.next_record().unwrap();
        for (offset, rebuilt) in again {
            let r = original.next_record().unwrap().unwrap();
            assert_eq!(offset, 40 + i64::from(r.offset_delta));
            assert_eq!(
                (rebuilt.timestamp, rebuilt.key, rebuilt.value, rebuilt.headers),
                (r.timestamp, r.key, r.value, r.headers)
            );
        }
    }

    #[test]
    fn encoded_batches_stay_within_the_fetch_limit() {
        let mut produced = BatchBuilder::new(0);
        for _ in 0..100 {
            produced.push(1, Some(b"key"), Some(&[1u8; 100][..]), std::iter::empty());
        }
        let mut rows = Rows::new(arrow_schema(), 0).unwrap();
        rows.add_batch(&produced.finish()).unwrap();
        let rows = rows.finish().unwrap();
        let columns = Columns::of(&rows).unwrap();
        for limit in [500, 1_000, 3_000, 20_000] {
            let (batches, end) = encode(&columns, 0, 1_024, limit, false);
            let total: usize = batches.iter().map(Bytes::len).sum();
            assert!(total <= limit, "{total} bytes for a limit of {limit}");
            assert!(batches.iter().all(|b| b.len() <= 1_024));
            let records: i32 = batches
                .iter()
                .map(|b| i32::from_be_bytes(b[57..61].try_into().unwrap()))
                .sum();
            assert_eq!(records as usize, end, "batches hold rows 0..end");
            assert!(
                end == 100 || total + 200 > limit,
                "stopped early at {end} rows, {total} bytes"
            );
        }
        // The first row goes out even when it alone is over the limit.
        let (batches, end) = encode(&columns, 0, 1_024, 10, true);
        assert_eq!((batches.len(), end), (1, 1));
        assert!(encode(&columns, 0, 1_024, 10, false).0.is_empty());
    }

    #[test]
    fn log_append_time_batches_archive_the_append_time() {
        let mut produced = BatchBuilder::new(0);
        produced.push(5, Some(b"a"), None, std::iter::empty());
        let stamped = ketch_storage::batch::stamp_log_append_time(&produced.finish(), 77_000);
        let mut rows = Rows::new(arrow_schema(), 0).unwrap();
        rows.add_batch(&stamped).unwrap();
        let rows = rows.finish().unwrap();
        assert_eq!(Columns::of(&rows).unwrap().timestamp_ms(0), 77_000);
    }
}
