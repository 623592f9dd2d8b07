//! Hand-built Kafka record batches (magic 2), so tests can send exactly the
//! bytes they mean — including broken ones.
//!
//! Layout (Kafka protocol guide, "Record Batch"): baseOffset i64, batchLength
//! i32, partitionLeaderEpoch i32, magic i8, crc u32 (CRC-32C of everything
//! from attributes to the end), attributes i16, lastOffsetDelta i32,
//! baseTimestamp i64, maxTimestamp i64, producerId i64, producerEpoch i16,
//! baseSequence i32, recordsCount i32, records.

/// Byte offset of the batchLength field.
pub const LENGTH_AT: usize = 8;
/// Byte offset of the crc field.
pub const CRC_AT: usize = 17;
/// Byte offset of the attributes field (start of the CRC-covered bytes).
pub const ATTRIBUTES_AT: usize = 21;
/// Byte offset of the recordsCount field.
pub const COUNT_AT: usize = 57;

/// A recent timestamp for a hand-built record: `at(n)` is `n` ms after an
/// hour before this test process first asked (an hour back, so a broker
/// that stamped its own time is told apart). Records stamped near 1970 are
/// past every topic's `retention.ms`, and the storage worker deletes them
/// (their segment, open or sealed) within a tick, as Kafka would: a test
/// that is not about old records stamps them with this.
pub fn at(n: i64) -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970");
        // Whole seconds, so `at(1_000)` reads as one second in.
        (since.as_secs() as i64 - 3600) * 1000
    });
    base + n
}

/// One record to put in a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Record {
    /// A record with a value and nothing else.
    pub fn value(timestamp: i64, value: &[u8]) -> Self {
        Self {
            timestamp,
            key: None,
            value: Some(value.to_vec()),
            headers: Vec::new(),
        }
    }
}

/// An uncompressed batch of `records` (at least one) with a correct CRC.
pub fn encode(records: &[Record]) -> Vec<u8> {
    assert!(!records.is_empty(), "a batch holds at least one record");
    let base_ts = records.iter().map(|r| r.timestamp).min().expect("records");
    let max_ts = records.iter().map(|r| r.timestamp).max().expect("records");
    let mut body = Vec::new();
    for (delta, record) in records.iter().enumerate() {
        encode_record(&mut body, record, record.timestamp - base_ts, delta as i32);
    }

    let mut out = Vec::with_capacity(61 + body.len());
    out.extend_from_slice(&0i64.to_be_bytes()); // baseOffset
    out.extend_from_slice(&0i32.to_be_bytes()); // batchLength, patched below
    out.extend_from_slice(&(-1i32).to_be_bytes()); // partitionLeaderEpoch
    out.push(2); // magic
    out.extend_from_slice(&0u32.to_be_bytes()); // crc, patched below
    out.extend_from_slice(&0i16.to_be_bytes()); // attributes: no compression, CreateTime
    out.extend_from_slice(&(records.len() as i32 - 1).to_be_bytes()); // lastOffsetDelta
    out.extend_from_slice(&base_ts.to_be_bytes());
    out.extend_from_slice(&max_ts.to_be_bytes());
    out.extend_from_slice(&(-1i64).to_be_bytes()); // producerId
    out.extend_from_slice(&(-1i16).to_be_bytes()); // producerEpoch
    out.extend_from_slice(&(-1i32).to_be_bytes()); // baseSequence
    out.extend_from_slice(&(records.len() as i32).to_be_bytes());
    out.extend_from_slice(&body);
    let length = (out.len() - LENGTH_AT - 4) as i32;
    out[LENGTH_AT..LENGTH_AT + 4].copy_from_slice(&length.to_be_bytes());
    fix_crc(&mut out);
    out
}

/// A compression codec, with its attribute bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Gzip = 1,
    Snappy = 2,
    Lz4 = 3,
    Zstd = 4,
}

pub const CODECS: [Codec; 4] = [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd];

/// A batch of `records` compressed with `codec` whose header claims
/// `claimed` records (its last offset delta agreeing), CRC correct: with
/// `claimed` above `records.len()`, a batch that lies about its count in a
/// way only decompressing it shows.
pub fn encode_compressed(records: &[Record], codec: Codec, claimed: i32) -> Vec<u8> {
    use std::io::Write;
    let plain = encode(records);
    let body = &plain[61..];
    let compressed = match codec {
        Codec::Gzip => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(body).expect("gzip");
            gz.finish().expect("gzip")
        }
        Codec::Snappy => snap::raw::Encoder::new().compress_vec(body).expect("snappy"),
        Codec::Lz4 => {
            let mut lz = lz4_flex::frame::FrameEncoder::new(Vec::new());
            lz.write_all(body).expect("lz4");
            lz.finish().expect("lz4")
        }
        Codec::Zstd => zstd::encode_all(body, 3).expect("zstd"),
    };
    let mut batch = plain[..61].to_vec();
    batch.extend_from_slice(&compressed);
    batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&(codec as i16).to_be_bytes());
    batch[23..27].copy_from_slice(&(claimed - 1).to_be_bytes());
    batch[COUNT_AT..COUNT_AT + 4].copy_from_slice(&claimed.to_be_bytes());
    let length = (batch.len() - LENGTH_AT - 4) as i32;
    batch[LENGTH_AT..LENGTH_AT + 4].copy_from_slice(&length.to_be_bytes());
    fix_crc(&mut batch);
    batch
}

/// `encode`, stamped as an idempotent producer's batch.
pub fn encode_idempotent(records: &[Record], producer_id: i64, epoch: i16, base_sequence: i32) -> Vec<u8> {
    let mut batch = encode(records);
    batch[43..51].copy_from_slice(&producer_id.to_be_bytes());
    batch[51..53].copy_from_slice(&epoch.to_be_bytes());
    batch[53..57].copy_from_slice(&base_sequence.to_be_bytes());
    fix_crc(&mut batch);
    batch
}

/// Recomputes the CRC after a deliberate edit of CRC-covered bytes.
pub fn fix_crc(batch: &mut [u8]) {
    let crc = crc32c(&batch[ATTRIBUTES_AT..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

fn encode_record(out: &mut Vec<u8>, record: &Record, timestamp_delta: i64, offset_delta: i32) {
    let mut r = Vec::new();
    r.push(0); // attributes
    put_varlong(&mut r, timestamp_delta);
    put_varlong(&mut r, i64::from(offset_delta));
    put_bytes(&mut r, record.key.as_deref());
    put_bytes(&mut r, record.value.as_deref());
    put_varlong(&mut r, record.headers.len() as i64);
    for (key, value) in &record.headers {
        put_bytes(&mut r, Some(key.as_bytes()));
        put_bytes(&mut r, value.as_deref());
    }
    put_varlong(out, r.len() as i64);
    out.extend_from_slice(&r);
}

fn put_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varlong(out, -1),
        Some(b) => {
            put_varlong(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

/// Zig-zag varint, as record fields use.
fn put_varlong(out: &mut Vec<u8>, value: i64) {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: test
/// batches are small, and an implementation independent of the gateway's is
/// the point.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0x82F6_3B78 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn batch_length_counts_bytes_after_the_length_field() {
        let batch = encode(&[Record::value(5, b"hello")]);
        let length = i32::from_be_bytes(batch[LENGTH_AT..LENGTH_AT + 4].try_into().unwrap());
        assert_eq!(length as usize, batch.len() - 12);
        assert_eq!(
            i32::from_be_bytes(batch[COUNT_AT..COUNT_AT + 4].try_into().unwrap()),
            1
        );
    }
}
