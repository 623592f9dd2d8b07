//! Uncompressed v2 batches built record by record: the archive's rows
//! become batches again this way (remote reads).

use bytes::Bytes;

use super::{CRC_START, HEADER_LEN};

/// Builds an uncompressed v2 record batch, record by record; the archive's
/// rows become batches again this way. Producer id, epoch and sequence are
/// unset (-1), as in a batch written by a non-idempotent producer.
pub struct BatchBuilder {
    base_offset: i64,
    base_timestamp: Option<i64>,
    max_timestamp: i64,
    count: i32,
    attributes: i16,
    producer: (i64, i16, i32),
    buf: Vec<u8>,
    record: Vec<u8>,
}

impl BatchBuilder {
    pub fn new(base_offset: i64) -> Self {
        let mut buf = Vec::with_capacity(16 * 1024);
        buf.resize(HEADER_LEN, 0);
        Self {
            base_offset,
            base_timestamp: None,
            max_timestamp: -1,
            count: 0,
            attributes: 0,
            producer: (-1, -1, -1),
            buf,
            record: Vec::with_capacity(256),
        }
    }

    /// A batch of producer `id` and `epoch` (sequence unset) with these
    /// attributes: the transaction markers' form.
    fn of_producer(mut self, attributes: i16, id: i64, epoch: i16) -> Self {
        self.attributes = attributes;
        self.producer = (id, epoch, -1);
        self
    }

    /// Records added so far.
    pub fn count(&self) -> i32 {
        self.count
    }

    /// The batch's size so far, in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends the record at offset `base_offset + count()`.
    pub fn push<'a>(
        &mut self,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) {
        let base_timestamp = *self.base_timestamp.get_or_insert(timestamp);
        self.max_timestamp = self.max_timestamp.max(timestamp);
        let record = &mut self.record;
        record.clear();
        record.push(0);
        put_varlong(record, timestamp.wrapping_sub(base_timestamp));
        put_varlong(record, i64::from(self.count));
        put_nullable(record, key);
        put_nullable(record, value);
        put_varlong(record, headers.len() as i64);
        for (key, value) in headers {
            put_nullable(record, Some(key));
            put_nullable(record, value);
        }
        put_varlong(&mut self.buf, record.len() as i64);
        self.buf.extend_from_slice(record);
        self.count += 1;
    }

    /// The finished batch (at least one record must have been pushed).
    pub fn finish(mut self) -> Bytes {
        debug_assert!(self.count > 0, "an empty batch");
        let batch_length = (self.buf.len() - 12) as i32;
        let header = &mut self.buf[..HEADER_LEN];
        header[0..8].copy_from_slice(&self.base_offset.to_be_bytes());
        header[8..12].copy_from_slice(&batch_length.to_be_bytes());
        header[12..16].copy_from_slice(&0i32.to_be_bytes());
        header[16] = 2;
        header[21..23].copy_from_slice(&self.attributes.to_be_bytes());
        header[23..27].copy_from_slice(&(self.count - 1).to_be_bytes());
        header[27..35].copy_from_slice(&self.base_timestamp.unwrap_or(-1).to_be_bytes());
        header[35..43].copy_from_slice(&self.max_timestamp.to_be_bytes());
        let (producer_id, epoch, sequence) = self.producer;
        header[43..51].copy_from_slice(&producer_id.to_be_bytes());
        header[51..53].copy_from_slice(&epoch.to_be_bytes());
        header[53..57].copy_from_slice(&sequence.to_be_bytes());
        header[57..61].copy_from_slice(&self.count.to_be_bytes());
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &self.buf[CRC_START..]) as u32;
        self.buf[17..21].copy_from_slice(&crc.to_be_bytes());
        Bytes::from(self.buf)
    }
}

/// A stored batch with only `records` of it kept (log compaction): the same
/// base offset, last offset delta, base timestamp, attributes (codec,
/// timestamp type, transactional), producer id, epoch and base sequence;
/// each record keeps its offset delta and timestamp, so offsets and
/// timestamps are unchanged and may have gaps. As Kafka's log cleaner, the
/// batch keeps its last offset (and so its last sequence) when its last
/// records are dropped: a consumer moves past the whole batch. The body is
/// compressed again with the batch's codec. `records` must be non-empty
/// and in offset order.
pub fn rebuild(original: &[u8], records: &[super::Record]) -> Result<Bytes, super::BatchError> {
    encode_like(original, records, None)
}

/// A batch's records compressed with `codec` (at `level`, or the codec's
/// default): a topic's `compression.type` other than `producer`, as Kafka's
/// LogValidator recompresses. Everything else of the batch is kept: base
/// offset, timestamps, producer id, epoch and sequence, transactional and
/// timestamp-type attributes, each record's offset delta.
pub fn recompress(
    batch: &Bytes,
    codec: super::Compression,
    level: Option<i32>,
) -> Result<Bytes, super::BatchError> {
    // The records' bytes are the same in every codec: only the body is
    // decompressed and compressed again, no record is decoded.
    let header = super::header(batch)?;
    let plain = super::records::decompressed(header.compression()?, batch.slice(HEADER_LEN..))?;
    let body = compress(codec, level, &plain)?;
    let bits = match codec {
        super::Compression::None => 0,
        super::Compression::Gzip => 1,
        super::Compression::Snappy => 2,
        super::Compression::Lz4 => 3,
        super::Compression::Zstd => 4,
    };
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&batch[..HEADER_LEN]);
    out.extend_from_slice(&body);
    let batch_length = (out.len() - 12) as i32;
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    out[21..23].copy_from_slice(&((header.attributes & !0x07) | bits).to_be_bytes());
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &out[CRC_START..]) as u32;
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(Bytes::from(out))
}

/// `plain` record bytes compressed with `codec` at `level` (gzip 1–9,
/// zstd's levels; `None`: the codec's default).
fn compress(
    codec: super::Compression,
    level: Option<i32>,
    plain: &[u8],
) -> Result<Vec<u8>, super::BatchError> {
    use std::io::Write;
    let fail = |e: std::io::Error| super::BatchError::Decompress(format!("compressing: {e}"));
    Ok(match codec {
        super::Compression::None => plain.to_vec(),
        super::Compression::Gzip => {
            let level = level.map_or(flate2::Compression::default(), |l| {
                flate2::Compression::new(l.clamp(1, 9) as u32)
            });
            let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(plain.len() / 2), level);
            gz.write_all(plain).map_err(fail)?;
            gz.finish().map_err(fail)?
        }
        super::Compression::Snappy => snap::raw::Encoder::new()
            .compress_vec(plain)
            .map_err(|e| fail(std::io::Error::other(e)))?,
        super::Compression::Lz4 => {
            let mut lz = lz4_flex::frame::FrameEncoder::new(Vec::with_capacity(plain.len() / 2));
            lz.write_all(plain).map_err(fail)?;
            lz.finish().map_err(|e| fail(std::io::Error::other(e)))?
        }
        super::Compression::Zstd => zstd::encode_all(plain, level.unwrap_or(3)).map_err(fail)?,
    })
}

/// A batch like `original` (its header's fields and codec) holding
/// `records`, compressed at `level` (gzip 1–9, zstd's levels; `None`: the
/// codec's default).
fn encode_like(
    original: &[u8],
    records: &[super::Record],
    level: Option<i32>,
) -> Result<Bytes, super::BatchError> {
    let header = super::BatchHeader::read_checked(original)?;
    let base_offset = i64::from_be_bytes(original[0..8].try_into().expect("8 bytes"));
    let mut body = Vec::with_capacity(
        records
            .iter()
            .map(|r| r.value.as_ref().map_or(0, |v| v.len()) + 32)
            .sum(),
    );
    let mut record = Vec::with_capacity(256);
    let mut max_timestamp = -1;
    for r in records {
        record.clear();
        record.push(0);
        put_varlong(&mut record, r.timestamp.wrapping_sub(header.base_timestamp));
        put_varlong(&mut record, i64::from(r.offset_delta));
        put_nullable(&mut record, r.key.as_deref());
        put_nullable(&mut record, r.value.as_deref());
        put_varlong(&mut record, r.headers.len() as i64);
        for (key, value) in &r.headers {
            put_nullable(&mut record, Some(key));
            put_nullable(&mut record, value.as_deref());
        }
        put_varlong(&mut body, record.len() as i64);
        body.extend_from_slice(&record);
        max_timestamp = max_timestamp.max(r.timestamp);
    }
    let body = compress(header.compression()?, level, &body)?;
    if header.is_log_append_time() {
        max_timestamp = header.max_timestamp;
    }
    let last_delta = header.last_offset_delta;
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&original[..HEADER_LEN]);
    out.extend_from_slice(&body);
    let batch_length = (out.len() - 12) as i32;
    out[0..8].copy_from_slice(&base_offset.to_be_bytes());
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    out[23..27].copy_from_slice(&last_delta.to_be_bytes());
    out[35..43].copy_from_slice(&max_timestamp.to_be_bytes());
    out[57..61].copy_from_slice(&(records.len() as i32).to_be_bytes());
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &out[CRC_START..]) as u32;
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(Bytes::from(out))
}

/// The control batch that ends a transaction in a partition (Kafka's
/// EndTransactionMarker): transactional and control attributes, the
/// producer's id and epoch, one record whose key is (version 0, type: 0
/// abort, 1 commit) and whose value is (version 0, coordinator epoch).
pub fn transaction_marker(
    producer_id: i64,
    epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timestamp: i64,
) -> Bytes {
    let key = [0, 0, 0, u8::from(commit)];
    let mut value = vec![0, 0];
    value.extend_from_slice(&coordinator_epoch.to_be_bytes());
    let mut builder = BatchBuilder::new(0).of_producer(TRANSACTIONAL | CONTROL, producer_id, epoch);
    builder.push(timestamp, Some(&key), Some(&value), std::iter::empty());
    builder.finish()
}

/// Attribute bits.
pub(super) const TRANSACTIONAL: i16 = 0x10;
pub(super) const CONTROL: i16 = 0x20;

/// What a control record says, from its key: `Some(true)` commit,
/// `Some(false)` abort, `None` another kind of control record.
pub fn marker_kind(key: &[u8]) -> Option<bool> {
    match key {
        [0, 0, 0, 1] => Some(true),
        [0, 0, 0, 0] => Some(false),
        _ => None,
    }
}

fn put_varlong(buf: &mut Vec<u8>, value: i64) {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn put_nullable(buf: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varlong(buf, -1),
        Some(bytes) => {
            put_varlong(buf, bytes.len() as i64);
            buf.extend_from_slice(bytes);
        }
    }
}
