//! Kafka record batches (magic v2), read without trusting the wire.
//!
//! Spec: the "Record Batch" section of the Kafka protocol documentation
//! (KIP-98 format) and Kafka's `LogValidator`. Produce stores batches
//! verbatim, so [`validate_produce_batch`] checks everything a broker checks
//! before a batch is accepted — bounds, magic, CRC-32C, counts, and every
//! record's framing, offset delta and timestamp, decompressing compressed
//! bodies as a stream through a fixed buffer — so that a stored batch can
//! always be read back. Every length read from a batch is checked against
//! the bytes actually present before anything is allocated from it.

mod builder;
mod records;
mod snappy;

use bytes::{Buf, Bytes};

pub use builder::{BatchBuilder, marker_kind, rebuild, recompress, transaction_marker};
pub use records::{PlainRecords, Record, RecordMeta, RecordRef, Records};

/// Size of the fixed v2 batch header, up to and including the record count.
pub const HEADER_LEN: usize = 61;
/// Offset of the CRC-covered part (attributes onwards).
const CRC_START: usize = 21;
/// Upper bound on the decompressed size of one batch.
pub const MAX_DECOMPRESSED_BYTES: usize = 256 * 1024 * 1024;
/// Attribute bit: the batch's timestamps are the broker's append time.
const LOG_APPEND_TIME: i16 = 0x08;
/// Kafka's RecordBatch.NO_TIMESTAMP.
const NO_TIMESTAMP: i64 = -1;

/// Why a batch was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    #[error("record batch is {0} bytes, shorter than the {HEADER_LEN}-byte header")]
    TooShort(usize),
    #[error("batch length field says {declared} bytes but {actual} follow it")]
    LengthMismatch { declared: i64, actual: usize },
    #[error("unsupported record batch magic {0} (only v2 is accepted)")]
    Magic(i8),
    #[error("CRC-32C mismatch: batch says {stored:#010x}, bytes give {computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("record count {0} is not a positive number of records")]
    RecordCount(i32),
    #[error("last offset delta {last_offset_delta} does not match record count {count}")]
    OffsetDelta { last_offset_delta: i32, count: i32 },
    #[error("{count} records cannot fit in {bytes} bytes")]
    CountTooLarge { count: i32, bytes: usize },
    #[error("records are malformed: {0}")]
    Records(String),
    #[error("unknown compression codec {0}")]
    Codec(i16),
    #[error("decompression failed: {0}")]
    Decompress(String),
    #[error("only one record batch per partition is accepted, found more")]
    MultipleBatches,
    #[error("clients may not write control batches (transaction markers)")]
    Control,
    #[error("a transactional batch needs a producer id and epoch")]
    Transactional,
    #[error("invalid sequence number {base_sequence} in a batch of producer {producer_id}")]
    Sequence { producer_id: i64, base_sequence: i32 },
    #[error("the baseOffset of the record batch should be 0, but it is {0}")]
    BaseOffset(i64),
}

/// Compression codec, from the low three bits of the attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

/// The header fields of a validated batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// The header of `bytes`, if they are at least [`HEADER_LEN`] long
    /// (nothing else checked).
    pub(crate) fn read_checked(bytes: &[u8]) -> Result<Self, BatchError> {
        if bytes.len() < HEADER_LEN {
            return Err(BatchError::TooShort(bytes.len()));
        }
        Ok(Self::read(bytes))
    }

    /// Reads the header of a batch that is at least [`HEADER_LEN`] bytes.
    fn read(bytes: &[u8]) -> Self {
        let mut b = &bytes[CRC_START..HEADER_LEN];
        Self {
            attributes: b.get_i16(),
            last_offset_delta: b.get_i32(),
            base_timestamp: b.get_i64(),
            max_timestamp: b.get_i64(),
            producer_id: b.get_i64(),
            producer_epoch: b.get_i16(),
            base_sequence: b.get_i32(),
            record_count: b.get_i32(),
        }
    }

    pub fn compression(&self) -> Result<Compression, BatchError> {
        Ok(match self.attributes & 0x07 {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            other => return Err(BatchError::Codec(other)),
        })
    }

    /// Whether its records are compressed (an unknown codec counts: the
    /// records are not plain).
    pub fn is_compressed(&self) -> bool {
        self.attributes & 0x07 != 0
    }

    pub fn is_log_append_time(&self) -> bool {
        self.attributes & LOG_APPEND_TIME != 0
    }

    /// Its timestamp type made CreateTime (see [`set_max_timestamp`]).
    pub fn make_create_time(&mut self) {
        self.attributes &= !LOG_APPEND_TIME;
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & builder::TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & builder::CONTROL != 0
    }
}

/// What the produce path's walk learns of a batch's records: the earliest
/// and latest timestamps, with the offset deltas of the records carrying
/// them (for Kafka's per-record timestamp checks; records without a
/// timestamp, -1, count only toward the latest), and whether any record
/// has no key (refused on compacted topics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFacts {
    pub min: i64,
    pub min_delta: i32,
    pub max: i64,
    pub max_delta: i32,
    pub null_key: bool,
}

impl Default for RecordFacts {
    fn default() -> Self {
        Self {
            min: i64::MAX,
            min_delta: -1,
            max: NO_TIMESTAMP,
            max_delta: -1,
            null_key: false,
        }
    }
}

impl RecordFacts {
    #[inline]
    pub(crate) fn add(&mut self, timestamp: i64, offset_delta: i32, has_key: bool) {
        self.null_key |= !has_key;
        if timestamp > self.max {
            self.max = timestamp;
            self.max_delta = offset_delta;
        }
        if timestamp != NO_TIMESTAMP && timestamp < self.min {
            self.min = timestamp;
            self.min_delta = offset_delta;
        }
    }
}

/// A batch [`validate_produce_batch`] accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidBatch {
    /// Its header, with `max_timestamp` the records' largest timestamp.
    pub header: BatchHeader,
    /// The header's max timestamp disagreed with the records': the stored
    /// batch must carry the corrected one ([`set_max_timestamp`]), as Kafka
    /// rewrites it.
    pub max_timestamp_corrected: bool,
    /// Its records' timestamps.
    pub timestamps: RecordFacts,
}

/// Validates the records of one partition in a Produce request: exactly one
/// v2 batch whose length field, CRC-32C, counts and sequence are
/// consistent, and whose records — decompressed as a stream when the batch
/// is compressed — frame exactly, number exactly the declared count and
/// carry offset deltas 0, 1, 2, … (Kafka's `LogValidator`).
pub fn validate_produce_batch(bytes: &Bytes) -> Result<ValidBatch, BatchError> {
    let header = validate_header(bytes)?;
    // A client's batch starts at offset 0 (the broker assigns offsets);
    // Kafka refuses any other (`UnifiedLog.analyzeAndValidateRecords`).
    // The field is outside the CRC, so this is no corruption.
    let base_offset = (&bytes[0..8]).get_i64();
    if base_offset != 0 {
        return Err(BatchError::BaseOffset(base_offset));
    }
    let codec = header.compression()?;
    // A zstd frame with a window over 8 MiB takes a buffer of it to decode:
    // a few such batches at a time (records.rs, ZSTD_WINDOW_LOG_LIMIT). An
    // LZ4 frame must be one Kafka's reader takes.
    let _window = match codec {
        Compression::Zstd if records::large_zstd_window(&bytes[HEADER_LEN..]) => {
            Some(records::LargeWindow::take().ok_or_else(|| {
                BatchError::Decompress(format!(
                    "a zstd window over 8 MiB: {} such batches are being validated already; retry",
                    records::LARGE_WINDOW_DECODES
                ))
            })?)
        }
        Compression::Lz4 => {
            records::check_lz4_frame(&bytes[HEADER_LEN..])?;
            None
        }
        _ => None,
    };
    // Uncompressed records are walked over the slice first; only a batch
    // that walk refuses goes through the general reader, for its error.
    let plain = codec == Compression::None;
    let mut timestamps = match plain
        .then(|| records::walk_plain(&bytes[HEADER_LEN..], header.record_count, header.base_timestamp))
        .flatten()
    {
        Some(timestamps) => timestamps,
        None => walk_records(bytes, &header)?,
    };
    if header.is_log_append_time() {
        // Kafka reads every record of a LogAppendTime batch at the batch's
        // max timestamp (`DefaultRecordBatch`), and checks that against a
        // CreateTime topic's bounds: so is it checked here.
        let null_key = timestamps.null_key;
        timestamps = RecordFacts::default();
        timestamps.add(header.max_timestamp, 0, true);
        timestamps.null_key = null_key;
    }
    let max_timestamp = timestamps.max;
    let mut header = header;
    // A LogAppendTime batch's records all carry its max timestamp.
    let corrected = !header.is_log_append_time() && header.max_timestamp != max_timestamp;
    if corrected {
        header.max_timestamp = max_timestamp;
    }
    Ok(ValidBatch {
        header,
        max_timestamp_corrected: corrected,
        timestamps,
    })
}

/// Walks every record of the batch (decompressing as it goes): their
/// framing, dense offset deltas; their timestamps.
fn walk_records(bytes: &Bytes, header: &BatchHeader) -> Result<RecordFacts, BatchError> {
    let mut records = Records::new(bytes.slice(HEADER_LEN..), header)?.strict();
    let mut timestamps = RecordFacts::default();
    let mut expected = 0;
    while let Some(record) = records.next_meta()? {
        if record.offset_delta != expected {
            return Err(BatchError::Records(format!(
                "record {expected} has offset delta {}",
                record.offset_delta
            )));
        }
        timestamps.add(record.timestamp, expected, record.has_key);
        expected += 1;
    }
    Ok(timestamps)
}

/// Every record's offset delta, timestamp and key presence (decompressing
/// as needed), for the rare path that reports which records of a batch
/// failed a check.
pub fn record_metas(bytes: &Bytes) -> Result<Vec<RecordMeta>, BatchError> {
    let header = header(bytes)?;
    let mut records = Records::new(bytes.slice(HEADER_LEN..), &header)?.strict();
    let mut out = Vec::with_capacity(usize::try_from(header.record_count).unwrap_or(0).min(4096));
    while let Some(record) = records.next_meta()? {
        out.push(record);
    }
    Ok(out)
}

/// The checks of the fixed header: length, magic, CRC, counts, attributes.
fn validate_header(bytes: &Bytes) -> Result<BatchHeader, BatchError> {
    // The magic byte first, once there (Kafka's `ProduceRequest`
    // validation): an old-format message set, whose messages are shorter
    // than a v2 header, is refused for its format, not its length.
    if let Some(&magic) = bytes.get(16)
        && magic != 2
    {
        return Err(BatchError::Magic(magic as i8));
    }
    if bytes.len() < HEADER_LEN {
        return Err(BatchError::TooShort(bytes.len()));
    }
    let declared = i64::from((&bytes[8..12]).get_i32());
    let actual = bytes.len() - 12;
    if declared < (HEADER_LEN - 12) as i64 {
        return Err(BatchError::LengthMismatch { declared, actual });
    }
    if declared as usize != actual {
        // Room for a whole second batch after the first: a client sent two.
        // Anything else means the length field lies.
        if actual.saturating_sub(declared as usize) >= HEADER_LEN {
            return Err(BatchError::MultipleBatches);
        }
        return Err(BatchError::LengthMismatch { declared, actual });
    }
    let stored = (&bytes[17..21]).get_u32();
    let computed = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &bytes[CRC_START..]) as u32;
    if stored != computed {
        return Err(BatchError::Crc { stored, computed });
    }
    let header = BatchHeader::read(bytes);
    if header.record_count <= 0 {
        return Err(BatchError::RecordCount(header.record_count));
    }
    if header.last_offset_delta != header.record_count - 1 {
        return Err(BatchError::OffsetDelta {
            last_offset_delta: header.last_offset_delta,
            count: header.record_count,
        });
    }
    if header.is_control() {
        return Err(BatchError::Control);
    }
    if header.is_transactional() && (header.producer_id < 0 || header.producer_epoch < 0) {
        return Err(BatchError::Transactional);
    }
    if header.producer_id >= 0 && header.base_sequence < 0 {
        return Err(BatchError::Sequence {
            producer_id: header.producer_id,
            base_sequence: header.base_sequence,
        });
    }
    header.compression()?;
    Ok(header)
}

/// Whether `bytes` begin with a v2 batch that says it is transactional,
/// read off its attributes alone (nothing validated: a request-level
/// check before each batch's own validation).
pub fn is_transactional_batch(bytes: &[u8]) -> bool {
    bytes.len() >= HEADER_LEN
        && bytes[16] == 2
        && i16::from_be_bytes([bytes[CRC_START], bytes[CRC_START + 1]]) & builder::TRANSACTIONAL != 0
}

/// Reads the header of a stored (already validated) batch.
pub fn header(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    if bytes.len() < HEADER_LEN {
        return Err(BatchError::TooShort(bytes.len()));
    }
    Ok(BatchHeader::read(bytes))
}

/// A copy of a validated batch stamped with LogAppendTime: the timestamp
/// type attribute set and the max timestamp overwritten with `now`, CRC
/// recomputed (Kafka's LogValidator does the same; consumers then read every
/// record's timestamp as `now`).
pub fn stamp_log_append_time(batch: &[u8], now: i64) -> Bytes {
    restamp(batch, true, now)
}

/// A copy of a validated batch whose max timestamp is `max_timestamp`, CRC
/// recomputed; its timestamp type CreateTime (a producer's LogAppendTime
/// batch on a CreateTime topic is stored so, its max timestamp kept, as
/// Kafka's LogValidator stores it).
pub fn set_max_timestamp(batch: &[u8], max_timestamp: i64) -> Bytes {
    restamp(batch, false, max_timestamp)
}

fn restamp(batch: &[u8], log_append_time: bool, max_timestamp: i64) -> Bytes {
    let mut stamped = batch.to_vec();
    let attributes = i16::from_be_bytes([stamped[21], stamped[22]]);
    let attributes = if log_append_time {
        attributes | LOG_APPEND_TIME
    } else {
        attributes & !LOG_APPEND_TIME
    };
    stamped[21..23].copy_from_slice(&attributes.to_be_bytes());
    stamped[35..43].copy_from_slice(&max_timestamp.to_be_bytes());
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &stamped[CRC_START..]) as u32;
    stamped[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(stamped)
}

/// Writes the base offset (bytes 0–7) and partition leader epoch (12–15) of
/// a stored batch; both lie outside the CRC.
pub fn patch_header(batch: &mut [u8], base_offset: i64, leader_epoch: i32) {
    batch[0..8].copy_from_slice(&base_offset.to_be_bytes());
    batch[12..16].copy_from_slice(&leader_epoch.to_be_bytes());
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::BufMut;

    fn put_varlong(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            if z < 0x80 {
                out.push(z as u8);
                return;
            }
            out.push((z as u8 & 0x7f) | 0x80);
            z >>= 7;
        }
    }

    fn put_nullable(out: &mut Vec<u8>, v: Option<&[u8]>) {
        match v {
            None => put_varlong(out, -1),
            Some(b) => {
                put_varlong(out, b.len() as i64);
                out.extend_from_slice(b);
            }
        }
    }

    /// (timestamp, key, value) of a test record.
    pub(crate) type TestRecord<'a> = (i64, Option<&'a [u8]>, Option<&'a [u8]>);

    /// The records of a batch body (uncompressed).
    fn records_body(records: &[TestRecord]) -> Vec<u8> {
        let base_ts = records.first().map_or(0, |r| r.0);
        let mut body = Vec::new();
        for (i, (ts, key, value)) in records.iter().enumerate() {
            let mut rec = vec![0u8];
            put_varlong(&mut rec, ts - base_ts);
            put_varlong(&mut rec, i as i64);
            put_nullable(&mut rec, *key);
            put_nullable(&mut rec, *value);
            put_varlong(&mut rec, 1);
            put_nullable(&mut rec, Some(b"h"));
            put_nullable(&mut rec, Some(b"v"));
            put_varlong(&mut body, rec.len() as i64);
            body.extend_from_slice(&rec);
        }
        body
    }

    #[test]
    fn the_slice_walk_agrees_with_the_record_reader_on_damaged_bodies() {
        let long = vec![b'x'; 300];
        let records: Vec<TestRecord> = (0..6)
            .map(|i| {
                let value = if i % 2 == 0 {
                    Some(&long[..])
                } else {
                    Some(&b"v"[..])
                };
                (
                    1_700_000_000_000 + i * 37 - (i % 3) * 100,
                    (i % 3 != 0).then_some(&b"key"[..]),
                    value,
                )
            })
            .collect();
        let body = records_body(&records);
        let header = |count: i32| BatchHeader {
            record_count: count,
            base_timestamp: 1_700_000_000_000,
            ..BatchHeader::read(&wrap(&body, 0, count, 1_700_000_000_000, 0))
        };
        let slow = |body: &[u8], count: i32| -> Option<RecordFacts> {
            let mut records = Records::new(Bytes::copy_from_slice(body), &header(count)).ok()?;
            let (mut span, mut expected) = (RecordFacts::default(), 0);
            while let Some(meta) = records.next_meta().ok()? {
                if meta.offset_delta != expected {
                    return None;
                }
                span.add(meta.timestamp, expected, meta.has_key);
                expected += 1;
            }
            Some(span)
        };
        let fast = |body: &[u8], count: i32| records::walk_plain(body, count, 1_700_000_000_000);
        assert_eq!(fast(&body, 6), slow(&body, 6));
        assert!(fast(&body, 6).is_some());
        for count in [0, 5, 7, -1] {
            assert_eq!(fast(&body, count), None, "count {count}");
            assert_eq!(slow(&body, count), None, "count {count}");
        }
        // Every single-byte change, truncation and extension: both accept
        // or both refuse, with the same timestamps.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for at in 0..body.len() {
            for _ in 0..8 {
                let mut damaged = body.clone();
                damaged[at] = xorshift(&mut state);
                assert_eq!(
                    fast(&damaged, 6),
                    slow(&damaged, 6),
                    "byte {at} = {}",
                    damaged[at]
                );
            }
            assert_eq!(fast(&body[..at], 6), slow(&body[..at], 6), "cut at {at}");
        }
        let mut longer = body.clone();
        longer.push(0);
        assert_eq!(fast(&longer, 6), None);
        assert_eq!(slow(&longer, 6), None);
    }

    #[test]
    fn plain_records_read_what_the_record_reader_reads_and_refuse_what_it_refuses() {
        let long = [b'y'; 200];
        let records: Vec<TestRecord> = (0..5)
            .map(|i| {
                let key = (i % 2 == 0).then_some(&b"k"[..]);
                let value = match i % 3 {
                    0 => None,
                    1 => Some(&long[..]),
                    _ => Some(&b""[..]),
                };
                (1_700_000_000_000 + i * 11 - (i % 2) * 50, key, value)
            })
            .collect();
        let body = records_body(&records);
        type Read = (
            i32,
            i64,
            Option<Vec<u8>>,
            Option<Vec<u8>>,
            Vec<(Vec<u8>, Option<Vec<u8>>)>,
        );
        let streamed = |batch: &[u8]| -> Option<Vec<Read>> {
            let mut reader = Records::of_batch(&Bytes::copy_from_slice(batch)).ok()?;
            let mut out = Vec::new();
            while let Some(r) = reader.next_record().ok()? {
                // The offset deltas must be dense (validation checks them
                // apart from the reader).
                if r.offset_delta as usize != out.len() {
                    return None;
                }
                out.push((
                    r.offset_delta,
                    r.timestamp,
                    r.key.map(|k| k.to_vec()),
                    r.value.map(|v| v.to_vec()),
                    r.headers
                        .iter()
                        .map(|(k, v)| (k.to_vec(), v.as_ref().map(|v| v.to_vec())))
                        .collect(),
                ));
            }
            Some(out)
        };
        let plain = |batch: &[u8]| -> Option<Vec<Read>> {
            PlainRecords::of_batch(batch)
                .ok()?
                .expect("uncompressed")
                .map(|r| {
                    r.map(|r| {
                        (
                            r.offset_delta,
                            r.timestamp,
                            r.key.map(<[u8]>::to_vec),
                            r.value.map(<[u8]>::to_vec),
                            r.headers()
                                .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
                                .collect(),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .ok()
        };
        let batch = |body: &[u8], count: i32| wrap(body, 0, count, 1_700_000_000_000, 0);
        let whole = plain(&batch(&body, 5)).expect("a valid batch");
        assert_eq!(Some(whole.clone()), streamed(&batch(&body, 5)));
        assert_eq!(whole[1].3.as_deref(), Some(&long[..]));
        assert_eq!(whole[0].4, vec![(b"h".to_vec(), Some(b"v".to_vec()))]);
        for count in [0, 4, 6, -1] {
            assert_eq!(plain(&batch(&body, count)), None, "count {count}");
            assert_eq!(streamed(&batch(&body, count)), None, "count {count}");
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for at in 0..body.len() {
            for _ in 0..8 {
                let mut damaged = body.clone();
                damaged[at] = xorshift(&mut state);
                let byte = damaged[at];
                let damaged = batch(&damaged, 5);
                assert_eq!(plain(&damaged), streamed(&damaged), "byte {at} = {byte}");
            }
            let cut = batch(&body[..at], 5);
            assert_eq!(plain(&cut), streamed(&cut), "cut at {at}");
        }
        let compressed = wrap(&body, 1, 5, 1_700_000_000_000, 0);
        assert!(PlainRecords::of_batch(&compressed).unwrap().is_none());
    }

    /// The next byte of a xorshift64 sequence (damage for the tests that
    /// compare two readers of one body).
    fn xorshift(state: &mut u64) -> u8 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state as u8
    }

    /// A batch around `body` claiming `count` records, CRC correct.
    fn wrap(body: &[u8], codec: i16, count: i32, base_ts: i64, max_ts: i64) -> Vec<u8> {
        let mut b = Vec::new();
        b.put_i64(0);
        b.put_i32((HEADER_LEN - 12 + body.len()) as i32);
        b.put_i32(0);
        b.put_i8(2);
        b.put_u32(0);
        b.put_i16(codec);
        b.put_i32(count - 1);
        b.put_i64(base_ts);
        b.put_i64(max_ts);
        b.put_i64(-1);
        b.put_i16(-1);
        b.put_i32(-1);
        b.put_i32(count);
        b.extend_from_slice(body);
        fix_crc(&mut b);
        b
    }

    /// Builds an uncompressed v2 batch (test helper).
    pub(crate) fn build_batch(records: &[TestRecord]) -> Vec<u8> {
        let base_ts = records.first().map_or(0, |r| r.0);
        let max_ts = records.iter().map(|r| r.0).max().unwrap_or(0);
        wrap(&records_body(records), 0, records.len() as i32, base_ts, max_ts)
    }

    pub(crate) fn compress(codec: Compression, data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        match codec {
            Compression::None => data.to_vec(),
            Compression::Gzip => {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                gz.write_all(data).unwrap();
                gz.finish().unwrap()
            }
            Compression::Lz4 => {
                let mut lz = lz4_flex::frame::FrameEncoder::new(Vec::new());
                lz.write_all(data).unwrap();
                lz.finish().unwrap()
            }
            Compression::Zstd => zstd::encode_all(data, 3).unwrap(),
            Compression::Snappy => snap::raw::Encoder::new().compress_vec(data).unwrap(),
        }
    }

    fn code(codec: Compression) -> i16 {
        match codec {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    pub(crate) const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    /// A batch of `records` compressed with `codec`, claiming `count` records.
    pub(crate) fn compressed_batch_with(codec: Compression, records: &[TestRecord], count: i32) -> Bytes {
        compressed_batch(codec, records, count)
    }

    /// A snappy batch in the Java client's xerial framing.
    pub(crate) fn xerial_batch(records: &[TestRecord]) -> Bytes {
        let base_ts = records.first().map_or(0, |r| r.0);
        let max_ts = records.iter().map(|r| r.0).max().unwrap_or(0);
        let block = snap::raw::Encoder::new()
            .compress_vec(&records_body(records))
            .expect("snappy");
        let mut body = b"\x82SNAPPY\x00".to_vec();
        body.extend_from_slice(&1i32.to_be_bytes());
        body.extend_from_slice(&1i32.to_be_bytes());
        body.extend_from_slice(&(block.len() as u32).to_be_bytes());
        body.extend_from_slice(&block);
        Bytes::from(wrap(&body, 2, records.len() as i32, base_ts, max_ts))
    }

    /// An uncompressed batch stamped with LogAppendTime.
    pub(crate) fn stamped(records: &[TestRecord]) -> Bytes {
        stamp_log_append_time(&build_batch(records), 1_800_000_000_000)
    }

    /// A batch of `records` compressed with `codec`, claiming `count` records.
    fn compressed_batch(codec: Compression, records: &[TestRecord], count: i32) -> Bytes {
        let base_ts = records.first().map_or(0, |r| r.0);
        let max_ts = records.iter().map(|r| r.0).max().unwrap_or(0);
        let body = compress(codec, &records_body(records));
        Bytes::from(wrap(&body, code(codec), count, base_ts, max_ts))
    }

    pub(crate) fn fix_crc(b: &mut [u8]) {
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &b[CRC_START..]) as u32;
        b[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    fn all_records(batch: &Bytes) -> Result<Vec<Record>, BatchError> {
        let mut records = Records::of_batch(batch)?;
        let mut out = Vec::new();
        while let Some(record) = records.next_record()? {
            out.push(record);
        }
        Ok(out)
    }

    #[test]
    fn a_valid_batch_round_trips() {
        let b = Bytes::from(build_batch(&[(10, Some(b"k"), Some(b"v1")), (12, None, None)]));
        let valid = validate_produce_batch(&b).unwrap();
        assert_eq!(valid.header.record_count, 2);
        assert_eq!(valid.header.max_timestamp, 12);
        assert!(!valid.max_timestamp_corrected);
        let records = all_records(&b).unwrap();
        assert_eq!(records[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(records[0].headers.len(), 1);
        assert_eq!(
            (
                records[1].timestamp,
                records[1].offset_delta,
                records[1].key.clone(),
                records[1].value.clone()
            ),
            (12, 1, None, None)
        );
        assert_eq!(records.len(), 2);
    }

    #[test]
    fn every_codec_validates_and_reads_back() {
        let value = b"hello hello hello hello".repeat(40);
        let records: Vec<TestRecord> = (0..50)
            .map(|i| (1_000 + i, Some(&b"key"[..]), Some(&value[..])))
            .collect();
        for codec in CODECS {
            let batch = compressed_batch(codec, &records, 50);
            let valid = validate_produce_batch(&batch).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            assert_eq!(valid.header.compression().unwrap(), codec);
            let read = all_records(&batch).unwrap();
            assert_eq!(read.len(), 50, "{codec:?}");
            assert!(read.iter().all(|r| r.value.as_deref() == Some(&value[..])));
            assert_eq!(read[49].timestamp, 1_049);
        }
    }

    #[test]
    fn a_compressed_batch_claiming_more_records_than_it_holds_is_refused() {
        let records: Vec<TestRecord> = (0..3).map(|i| (i, None, Some(&b"x"[..]))).collect();
        for codec in CODECS {
            let lying = compressed_batch(codec, &records, 5);
            assert!(
                matches!(validate_produce_batch(&lying), Err(BatchError::Records(_))),
                "{codec:?}: {:?}",
                validate_produce_batch(&lying)
            );
            let short = compressed_batch(codec, &records, 2);
            assert!(
                validate_produce_batch(&short).is_err(),
                "{codec:?} with a record too many"
            );
        }
    }

    #[test]
    fn wrong_offset_deltas_and_truncated_streams_are_refused() {
        let mut body = records_body(&[(1, None, Some(b"a")), (2, None, Some(b"b"))]);
        // The second record's offset delta (after its length, attributes and
        // timestamp delta) becomes 5.
        let second = 1 + usize::from(body[0] >> 1);
        body[second + 3] = 10;
        for codec in CODECS {
            let batch = Bytes::from(wrap(&compress(codec, &body), code(codec), 2, 1, 2));
            assert!(validate_produce_batch(&batch).is_err(), "{codec:?}");
        }
        let good = compress(Compression::Zstd, &records_body(&[(1, None, Some(b"a"))]));
        let truncated = Bytes::from(wrap(&good[..good.len() - 3], 4, 1, 1, 1));
        assert!(matches!(
            validate_produce_batch(&truncated),
            Err(BatchError::Decompress(_) | BatchError::Records(_))
        ));
    }

    #[test]
    fn a_lying_max_timestamp_is_corrected_as_kafka_does() {
        let mut b = build_batch(&[(10, None, Some(b"x")), (30, None, Some(b"y"))]);
        b[35..43].copy_from_slice(&9_999_999i64.to_be_bytes());
        fix_crc(&mut b);
        let b = Bytes::from(b);
        let valid = validate_produce_batch(&b).unwrap();
        assert!(valid.max_timestamp_corrected);
        assert_eq!(valid.header.max_timestamp, 30);
        let fixed = set_max_timestamp(&b, valid.header.max_timestamp);
        let again = validate_produce_batch(&fixed).unwrap();
        assert!(!again.max_timestamp_corrected);
        assert_eq!(&fixed[HEADER_LEN..], &b[HEADER_LEN..], "records untouched");
    }

    #[test]
    fn an_idempotent_batch_needs_a_sequence() {
        let mut b = build_batch(&[(1, None, Some(b"x"))]);
        b[43..51].copy_from_slice(&7i64.to_be_bytes());
        b[53..57].copy_from_slice(&(-1i32).to_be_bytes());
        fix_crc(&mut b);
        assert!(matches!(
            validate_produce_batch(&Bytes::from(b)),
            Err(BatchError::Sequence { producer_id: 7, .. })
        ));
    }

    #[test]
    fn a_decompression_bomb_is_refused_at_the_limit() {
        // One record whose value is MAX_DECOMPRESSED_BYTES of zeros: a few
        // KiB of zstd, written without holding the zeros.
        use std::io::Write;
        let value_len = MAX_DECOMPRESSED_BYTES;
        let mut record = vec![0u8, 0, 0, 1];
        put_varlong(&mut record, value_len as i64);
        let mut framed = Vec::new();
        put_varlong(&mut framed, (record.len() + value_len + 1) as i64);
        framed.extend_from_slice(&record);
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        encoder.write_all(&framed).unwrap();
        let zeros = vec![0u8; 1024 * 1024];
        for _ in 0..value_len / zeros.len() {
            encoder.write_all(&zeros).unwrap();
        }
        encoder.write_all(&[0]).unwrap();
        let batch = Bytes::from(wrap(&encoder.finish().unwrap(), 4, 1, 0, 0));
        assert!(batch.len() < 64 * 1024);
        assert!(matches!(
            validate_produce_batch(&batch),
            Err(BatchError::Decompress(_))
        ));
    }

    #[test]
    fn log_append_time_stamping_keeps_the_batch_valid() {
        let b = Bytes::from(build_batch(&[(10, None, Some(b"x")), (12, None, Some(b"y"))]));
        let stamped = stamp_log_append_time(&b, 99_000);
        let valid = validate_produce_batch(&stamped).unwrap();
        assert_eq!(valid.header.max_timestamp, 99_000);
        assert!(valid.header.is_log_append_time());
        assert!(!valid.max_timestamp_corrected);
        assert_eq!(&stamped[HEADER_LEN..], &b[HEADER_LEN..], "records untouched");
    }

    #[test]
    fn a_transactional_batch_is_told_by_its_attributes() {
        let marker = transaction_marker(7, 0, true, 0, 1_000);
        assert!(is_transactional_batch(&marker));
        let plain = build_batch(&[(1_000, None, Some(b"v"))]);
        assert!(!is_transactional_batch(&plain));
        let mut old_magic = marker.to_vec();
        old_magic[16] = 1;
        assert!(!is_transactional_batch(&old_magic));
        assert!(!is_transactional_batch(&marker[..HEADER_LEN - 1]));
    }

    #[test]
    fn wrong_crc_is_refused() {
        let mut b = build_batch(&[(1, None, Some(b"x"))]);
        let last = b.len() - 1;
        b[last] ^= 1;
        assert!(matches!(
            validate_produce_batch(&Bytes::from(b.clone())),
            Err(BatchError::Crc { .. })
        ));
    }

    #[test]
    fn lying_length_is_refused() {
        let mut b = build_batch(&[(1, None, Some(b"x"))]);
        b[8..12].copy_from_slice(&1_000_000i32.to_be_bytes());
        assert!(matches!(
            validate_produce_batch(&Bytes::from(b.clone())),
            Err(BatchError::LengthMismatch { .. })
        ));
        b[8..12].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(
            validate_produce_batch(&Bytes::from(b.clone())),
            Err(BatchError::LengthMismatch { .. })
        ));
        b[8..12].copy_from_slice(&(-5i32).to_be_bytes());
        assert!(matches!(
            validate_produce_batch(&Bytes::from(b.clone())),
            Err(BatchError::LengthMismatch { .. })
        ));
        assert!(matches!(
            validate_produce_batch(&Bytes::copy_from_slice(&b[..30])),
            Err(BatchError::TooShort(30))
        ));
    }

    #[test]
    fn blowup_record_count_is_refused() {
        let mut b = build_batch(&[(1, None, Some(b"x"))]);
        b[57..61].copy_from_slice(&i32::MIN.to_be_bytes());
        b[23..27].copy_from_slice(&i32::MAX.to_be_bytes());
        fix_crc(&mut b);
        assert!(matches!(
            validate_produce_batch(&Bytes::from(b.clone())),
            Err(BatchError::RecordCount(_))
        ));
        b[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        b[23..27].copy_from_slice(&(i32::MAX - 1).to_be_bytes());
        fix_crc(&mut b);
        let b = Bytes::from(b);
        assert!(validate_produce_batch(&b).is_err());
        assert!(Records::of_batch(&b).is_err());
    }

    #[test]
    fn produce_validation_decodes_a_few_large_zstd_windows_at_a_time() {
        use std::io::Write;
        let records: Vec<TestRecord> = (0..50)
            .map(|i| (1_000 + i, Some(&b"k"[..]), Some(&b"value"[..])))
            .collect();
        // As a Java producer at compression.zstd.level 20 streams it: a
        // 32 MiB window.
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 20).unwrap();
        encoder.write_all(&records_body(&records)).unwrap();
        let body = encoder.finish().unwrap();
        let batch = Bytes::from(wrap(&body, 4, 50, 1_000, 1_049));
        assert!(validate_produce_batch(&batch).is_ok());
        // Every slot busy: refused as corrupt (the producer retries), while
        // a stored batch's records are still read.
        let held: Vec<_> = (0..records::LARGE_WINDOW_DECODES)
            .map_while(|_| records::LargeWindow::take())
            .collect();
        assert_eq!(held.len(), records::LARGE_WINDOW_DECODES);
        assert!(matches!(
            validate_produce_batch(&batch),
            Err(BatchError::Decompress(_))
        ));
        assert_eq!(all_records(&batch).unwrap().len(), 50);
        drop(held);
        assert!(validate_produce_batch(&batch).is_ok());
    }

    #[test]
    fn varint_garbage_is_an_error_not_a_panic() {
        let mut bytes = [0xffu8; 12].into_iter();
        assert!(records::read_varlong(|| bytes.next().ok_or(BatchError::Records("end".into()))).is_err());
    }

    #[test]
    fn built_batches_validate_and_decode_to_what_was_pushed() {
        let mut builder = BatchBuilder::new(1000);
        builder.push(
            5_000,
            Some(b"k1"),
            Some(b"v1"),
            [(&b"h"[..], Some(&b"x"[..])), (&b"h"[..], None)].into_iter(),
        );
        builder.push(4_000, None, None, std::iter::empty());
        builder.push(7_000, Some(b""), Some(&[0u8; 300]), std::iter::empty());
        let batch = builder.finish();
        // A client's batch starts at offset 0 (the field is outside the CRC).
        assert!(matches!(
            validate_produce_batch(&batch),
            Err(BatchError::BaseOffset(1000))
        ));
        let mut as_sent = batch.to_vec();
        as_sent[0..8].fill(0);
        let header = validate_produce_batch(&Bytes::from(as_sent))
            .expect("a valid batch")
            .header;
        assert_eq!((header.record_count, header.last_offset_delta), (3, 2));
        assert_eq!((header.base_timestamp, header.max_timestamp), (5_000, 7_000));
        assert_eq!(i64::from_be_bytes(batch[0..8].try_into().unwrap()), 1000);
        let records = all_records(&batch).unwrap();
        let first = &records[0];
        assert_eq!((first.offset_delta, first.timestamp), (0, 5_000));
        assert_eq!(first.key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(
            first.headers,
            vec![
                (Bytes::from_static(b"h"), Some(Bytes::from_static(b"x"))),
                (Bytes::from_static(b"h"), None)
            ]
        );
        let second = &records[1];
        assert_eq!(
            (
                second.offset_delta,
                second.timestamp,
                second.key.clone(),
                second.value.clone()
            ),
            (1, 4_000, None, None)
        );
        let third = &records[2];
        assert_eq!(
            (third.key.as_deref(), third.value.as_ref().map(|v| v.len())),
            (Some(&b""[..]), Some(300))
        );
        assert_eq!(records.len(), 3);
    }
}
