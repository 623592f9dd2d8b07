//! Kafka record batches (magic v2), read without trusting the wire.
//!
//! Spec: the "Record Batch" section of the Kafka protocol documentation
//! (KIP-98 format). Produce stores batches verbatim, so this module only
//! validates them (bounds, magic, CRC-32C, counts) and, where records must be
//! looked at (ListOffsets by timestamp), iterates them with bounded
//! decompression. Every length read from a batch is checked against the bytes
//! actually present before anything is allocated from it.

use std::io::Read;

use bytes::{Buf, Bytes};

/// Size of the fixed v2 batch header, up to and including the record count.
pub const HEADER_LEN: usize = 61;
/// Offset of the CRC-covered part (attributes onwards).
const CRC_START: usize = 21;
/// The smallest possible record: length, attributes, timestamp delta, offset
/// delta, key length, value length and header count, one byte each.
const MIN_RECORD_LEN: usize = 7;
/// Upper bound on the decompressed size of one batch.
pub const MAX_DECOMPRESSED_BYTES: usize = 256 * 1024 * 1024;

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
    #[error("transactional and control batches are not supported")]
    Transactional,
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

    pub fn is_transactional(&self) -> bool {
        self.attributes & 0x10 != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & 0x20 != 0
    }
}

/// Validates the records of one partition in a Produce request: exactly one
/// v2 batch whose length field, CRC-32C and record count are consistent, and
/// whose uncompressed records frame exactly. Returns its header.
pub fn validate_produce_batch(bytes: &Bytes) -> Result<BatchHeader, BatchError> {
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
    let magic = bytes[16] as i8;
    if magic != 2 {
        return Err(BatchError::Magic(magic));
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
    if header.is_transactional() || header.is_control() {
        return Err(BatchError::Transactional);
    }
    if header.compression()? == Compression::None {
        // Walk the record framing: cheap, and catches a count that lies.
        // Compressed records are checked when they are decoded.
        let mut records = Records::new(bytes.slice(HEADER_LEN..), &header);
        let mut n = 0;
        while let Some(record) = records.next_record()? {
            if record.offset_delta != n {
                return Err(BatchError::Records(format!(
                    "record {n} has offset delta {}",
                    record.offset_delta
                )));
            }
            n += 1;
        }
    }
    Ok(header)
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
    let mut stamped = batch.to_vec();
    let attributes = i16::from_be_bytes([stamped[21], stamped[22]]) | 0x08;
    stamped[21..23].copy_from_slice(&attributes.to_be_bytes());
    stamped[35..43].copy_from_slice(&now.to_be_bytes());
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

/// One record, as stored inside a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub offset_delta: i32,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

/// Iterates the records of a batch body (after decompression).
pub struct Records {
    buf: Bytes,
    remaining: i32,
    base_timestamp: i64,
}

impl Records {
    fn new(body: Bytes, header: &BatchHeader) -> Self {
        Self {
            buf: body,
            remaining: header.record_count,
            base_timestamp: header.base_timestamp,
        }
    }

    /// Decodes (decompressing if needed) the records of a whole stored batch.
    pub fn of_batch(batch: &[u8]) -> Result<Self, BatchError> {
        let header = header(batch)?;
        let body = decompress(header.compression()?, &batch[HEADER_LEN..])?;
        if header.record_count < 0 || (header.record_count as usize) > body.len() / MIN_RECORD_LEN {
            return Err(BatchError::CountTooLarge {
                count: header.record_count,
                bytes: body.len(),
            });
        }
        Ok(Self::new(body, &header))
    }

    /// The next record; `Ok(None)` once the declared count has been read and
    /// the body is exhausted; an error if the two disagree.
    pub fn next_record(&mut self) -> Result<Option<Record>, BatchError> {
        if self.remaining == 0 {
            if self.buf.has_remaining() {
                return Err(BatchError::Records(format!(
                    "{} bytes after the last record",
                    self.buf.len()
                )));
            }
            return Ok(None);
        }
        if self.buf.len() < MIN_RECORD_LEN {
            return Err(BatchError::Records(format!("{} records missing", self.remaining)));
        }
        let len = read_varint(&mut self.buf)?;
        if len < 0 || len as usize > self.buf.len() {
            return Err(BatchError::Records(format!(
                "record length {len} exceeds the batch"
            )));
        }
        let mut rec = self.buf.split_to(len as usize);
        let _attributes = take(&mut rec, 1)?;
        let timestamp_delta = read_varlong(&mut rec)?;
        let offset_delta = read_varint(&mut rec)?;
        let key = read_nullable(&mut rec)?;
        let value = read_nullable(&mut rec)?;
        let header_count = read_varint(&mut rec)?;
        if header_count < 0 || header_count as usize > rec.len() / 2 {
            return Err(BatchError::Records(format!(
                "header count {header_count} exceeds the record"
            )));
        }
        let mut headers = Vec::with_capacity(header_count as usize);
        for _ in 0..header_count {
            let key =
                read_nullable(&mut rec)?.ok_or_else(|| BatchError::Records("null header key".to_owned()))?;
            let value = read_nullable(&mut rec)?;
            headers.push((key, value));
        }
        if rec.has_remaining() {
            return Err(BatchError::Records("bytes left inside a record".to_owned()));
        }
        self.remaining -= 1;
        Ok(Some(Record {
            offset_delta,
            timestamp: self.base_timestamp.wrapping_add(timestamp_delta),
            key,
            value,
            headers,
        }))
    }
}

fn take(buf: &mut Bytes, n: usize) -> Result<Bytes, BatchError> {
    if buf.len() < n {
        return Err(BatchError::Records("record truncated".to_owned()));
    }
    Ok(buf.split_to(n))
}

fn read_nullable(buf: &mut Bytes) -> Result<Option<Bytes>, BatchError> {
    let len = read_varint(buf)?;
    if len < 0 {
        return Ok(None);
    }
    take(buf, len as usize).map(Some)
}

fn read_varlong(buf: &mut Bytes) -> Result<i64, BatchError> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        if !buf.has_remaining() {
            return Err(BatchError::Records("varint truncated".to_owned()));
        }
        let byte = buf.get_u8();
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    Err(BatchError::Records("varint too long".to_owned()))
}

fn read_varint(buf: &mut Bytes) -> Result<i32, BatchError> {
    let v = read_varlong(buf)?;
    i32::try_from(v).map_err(|_| BatchError::Records(format!("varint {v} out of range")))
}

/// Decompresses a batch body, refusing to grow past [`MAX_DECOMPRESSED_BYTES`].
pub fn decompress(codec: Compression, body: &[u8]) -> Result<Bytes, BatchError> {
    let err = |e: std::io::Error| BatchError::Decompress(e.to_string());
    let mut out = Vec::new();
    let limit = MAX_DECOMPRESSED_BYTES as u64 + 1;
    match codec {
        Compression::None => return Ok(Bytes::copy_from_slice(body)),
        Compression::Gzip => {
            flate2::read::GzDecoder::new(body)
                .take(limit)
                .read_to_end(&mut out)
                .map_err(err)?;
        }
        Compression::Lz4 => {
            lz4_flex::frame::FrameDecoder::new(body)
                .take(limit)
                .read_to_end(&mut out)
                .map_err(err)?;
        }
        Compression::Zstd => {
            zstd::stream::read::Decoder::new(body)
                .map_err(err)?
                .take(limit)
                .read_to_end(&mut out)
                .map_err(err)?;
        }
        Compression::Snappy => out = snappy(body)?,
    }
    if out.len() > MAX_DECOMPRESSED_BYTES {
        return Err(BatchError::Decompress(format!(
            "batch decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes"
        )));
    }
    Ok(Bytes::from(out))
}

/// The Java client writes snappy in xerial's framing; librdkafka writes raw
/// snappy. Both are accepted.
fn snappy(body: &[u8]) -> Result<Vec<u8>, BatchError> {
    const XERIAL: &[u8] = b"\x82SNAPPY\x00";
    let raw = |block: &[u8], out: &mut Vec<u8>| -> Result<(), BatchError> {
        let len = snap::raw::decompress_len(block).map_err(|e| BatchError::Decompress(e.to_string()))?;
        if out.len() + len > MAX_DECOMPRESSED_BYTES {
            return Err(BatchError::Decompress("snappy block too large".to_owned()));
        }
        let start = out.len();
        out.resize(start + len, 0);
        snap::raw::Decoder::new()
            .decompress(block, &mut out[start..])
            .map_err(|e| BatchError::Decompress(e.to_string()))?;
        Ok(())
    };
    let mut out = Vec::new();
    if body.starts_with(XERIAL) && body.len() >= 16 {
        let mut rest = &body[16..];
        while !rest.is_empty() {
            if rest.len() < 4 {
                return Err(BatchError::Decompress("xerial block header truncated".to_owned()));
            }
            let len = rest.get_u32() as usize;
            if len > rest.len() {
                return Err(BatchError::Decompress("xerial block truncated".to_owned()));
            }
            raw(&rest[..len], &mut out)?;
            rest = &rest[len..];
        }
    } else {
        raw(body, &mut out)?;
    }
    Ok(out)
}

/// Builds an uncompressed v2 record batch, record by record; the archive's
/// rows become batches again this way. Producer id, epoch and sequence are
/// unset (-1), as in a batch written by a non-idempotent producer.
pub struct BatchBuilder {
    base_offset: i64,
    base_timestamp: Option<i64>,
    max_timestamp: i64,
    count: i32,
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
            buf,
            record: Vec::with_capacity(256),
        }
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
        header[21..23].copy_from_slice(&0i16.to_be_bytes());
        header[23..27].copy_from_slice(&(self.count - 1).to_be_bytes());
        header[27..35].copy_from_slice(&self.base_timestamp.unwrap_or(-1).to_be_bytes());
        header[35..43].copy_from_slice(&self.max_timestamp.to_be_bytes());
        header[43..51].copy_from_slice(&(-1i64).to_be_bytes());
        header[51..53].copy_from_slice(&(-1i16).to_be_bytes());
        header[53..57].copy_from_slice(&(-1i32).to_be_bytes());
        header[57..61].copy_from_slice(&self.count.to_be_bytes());
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &self.buf[CRC_START..]) as u32;
        self.buf[17..21].copy_from_slice(&crc.to_be_bytes());
        Bytes::from(self.buf)
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
    type TestRecord<'a> = (i64, Option<&'a [u8]>, Option<&'a [u8]>);

    /// Builds an uncompressed v2 batch (test helper).
    pub(crate) fn build_batch(records: &[TestRecord]) -> Vec<u8> {
        let base_ts = records.first().map_or(0, |r| r.0);
        let max_ts = records.iter().map(|r| r.0).max().unwrap_or(0);
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
        let mut b = Vec::new();
        b.put_i64(0);
        b.put_i32((HEADER_LEN - 12 + body.len()) as i32);
        b.put_i32(0);
        b.put_i8(2);
        b.put_u32(0);
        b.put_i16(0);
        b.put_i32(records.len() as i32 - 1);
        b.put_i64(base_ts);
        b.put_i64(max_ts);
        b.put_i64(-1);
        b.put_i16(-1);
        b.put_i32(-1);
        b.put_i32(records.len() as i32);
        b.extend_from_slice(&body);
        fix_crc(&mut b);
        b
    }

    pub(crate) fn fix_crc(b: &mut [u8]) {
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &b[CRC_START..]) as u32;
        b[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    #[test]
    fn a_valid_batch_round_trips() {
        let b = build_batch(&[(10, Some(b"k"), Some(b"v1")), (12, None, None)]);
        let h = validate_produce_batch(&Bytes::from(b.clone())).unwrap();
        assert_eq!(h.record_count, 2);
        assert_eq!(h.max_timestamp, 12);
        let mut recs = Records::of_batch(&b).unwrap();
        let r0 = recs.next_record().unwrap().unwrap();
        assert_eq!(r0.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r0.headers.len(), 1);
        let r1 = recs.next_record().unwrap().unwrap();
        assert_eq!(
            (r1.timestamp, r1.offset_delta, r1.key, r1.value),
            (12, 1, None, None)
        );
        assert!(recs.next_record().unwrap().is_none());
    }

    #[test]
    fn log_append_time_stamping_keeps_the_batch_valid() {
        let b = Bytes::from(build_batch(&[(10, None, Some(b"x")), (12, None, Some(b"y"))]));
        let stamped = stamp_log_append_time(&b, 99_000);
        let h = validate_produce_batch(&stamped).unwrap();
        assert_eq!(h.max_timestamp, 99_000);
        assert_eq!(h.attributes & 0x08, 0x08);
        assert_eq!(&stamped[HEADER_LEN..], &b[HEADER_LEN..], "records untouched");
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
        assert!(validate_produce_batch(&Bytes::from(b.clone())).is_err());
        assert!(Records::of_batch(&b).is_err());
    }

    #[test]
    fn varint_garbage_is_an_error_not_a_panic() {
        let mut buf = Bytes::from_static(&[0xff; 12]);
        assert!(read_varlong(&mut buf).is_err());
    }

    #[test]
    fn every_codec_decompresses() {
        let data = b"hello hello hello hello".repeat(10);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &data).unwrap();
        assert_eq!(
            decompress(Compression::Gzip, &gz.finish().unwrap()).unwrap(),
            data
        );
        let mut lz = lz4_flex::frame::FrameEncoder::new(Vec::new());
        std::io::Write::write_all(&mut lz, &data).unwrap();
        assert_eq!(decompress(Compression::Lz4, &lz.finish().unwrap()).unwrap(), data);
        let z = zstd::encode_all(&data[..], 3).unwrap();
        assert_eq!(decompress(Compression::Zstd, &z).unwrap(), data);
        let s = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert_eq!(decompress(Compression::Snappy, &s).unwrap(), data);
        let mut x = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
        x.extend_from_slice(&(s.len() as u32).to_be_bytes());
        x.extend_from_slice(&s);
        assert_eq!(decompress(Compression::Snappy, &x).unwrap(), data);
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
        let header = validate_produce_batch(&batch).expect("a valid batch");
        assert_eq!((header.record_count, header.last_offset_delta), (3, 2));
        assert_eq!((header.base_timestamp, header.max_timestamp), (5_000, 7_000));
        assert_eq!(i64::from_be_bytes(batch[0..8].try_into().unwrap()), 1000);
        let mut records = Records::of_batch(&batch).unwrap();
        let first = records.next_record().unwrap().unwrap();
        assert_eq!((first.offset_delta, first.timestamp), (0, 5_000));
        assert_eq!(first.key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(
            first.headers,
            vec![
                (Bytes::from_static(b"h"), Some(Bytes::from_static(b"x"))),
                (Bytes::from_static(b"h"), None)
            ]
        );
        let second = records.next_record().unwrap().unwrap();
        assert_eq!(
            (second.offset_delta, second.timestamp, second.key, second.value),
            (1, 4_000, None, None)
        );
        let third = records.next_record().unwrap().unwrap();
        assert_eq!(
            (third.key.as_deref(), third.value.map(|v| v.len())),
            (Some(&b""[..]), Some(300))
        );
        assert!(records.next_record().unwrap().is_none());
    }
}
