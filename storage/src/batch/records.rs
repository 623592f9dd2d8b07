//! The records inside a batch body, read as a stream.
//!
//! Spec: the "Record" section of the Kafka protocol guide: a varint length,
//! then attributes, timestamp delta, offset delta, key, value and headers,
//! lengths as zig-zag varints. An uncompressed body is read in place and
//! records are slices of it; a compressed one is decompressed through a
//! fixed buffer as records are read, so memory never grows with the size a
//! batch decompresses to. [`Records::next_meta`] skips keys, values and
//! headers without copying them (validation, timestamp searches);
//! [`Records::next_record`] materializes them (the archive).

use std::io::{self, BufRead, BufReader, Read};

use bytes::{Buf, Bytes, BytesMut};

use super::snappy::SnappyReader;
use super::{BatchError, BatchHeader, Compression, MAX_DECOMPRESSED_BYTES};

/// The buffer a decompressed body is read through.
const STREAM_BUFFER: usize = 32 * 1024;
/// zstd frames asking for a window up to 8 MiB (window log 23) are decoded
/// freely: every level up to 19 asks for no more.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;
/// Frames asking for more, up to zstd's own default limit of 128 MiB
/// (window log 27), are decoded too: a Java producer at
/// `compression.zstd.level` 20–22 (KIP-390) streams frames of unknown size
/// whose windows are 32–128 MiB, and Kafka accepts them. The decoder takes
/// a buffer of the window's size, so produce validation decodes at most
/// [`LARGE_WINDOW_DECODES`] such batches at once ([`LargeWindow`]); a batch
/// that finds them all busy is refused as corrupt, which the producer
/// retries. Batches already stored (archiving, compaction, timestamp
/// searches: a few tasks at a time) are never refused for it.
const ZSTD_WINDOW_LOG_LIMIT: u32 = 27;
/// How many large-window zstd batches produce validation decodes at once.
pub(crate) const LARGE_WINDOW_DECODES: usize = 2;
static LARGE_WINDOWS_IN_USE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One of the [`LARGE_WINDOW_DECODES`], held while a produced batch is
/// validated.
pub(crate) struct LargeWindow;

impl LargeWindow {
    pub(crate) fn take() -> Option<Self> {
        use std::sync::atomic::Ordering::AcqRel;
        LARGE_WINDOWS_IN_USE
            .fetch_update(AcqRel, std::sync::atomic::Ordering::Acquire, |n| {
                (n < LARGE_WINDOW_DECODES).then_some(n + 1)
            })
            .ok()
            .map(|_| LargeWindow)
    }
}

impl Drop for LargeWindow {
    fn drop(&mut self) {
        LARGE_WINDOWS_IN_USE.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Whether a zstd body's frame asks for a window over
/// [`ZSTD_WINDOW_LOG_MAX`].
pub(crate) fn large_zstd_window(body: &[u8]) -> bool {
    zstd_window_log(body).is_some_and(|log| log > ZSTD_WINDOW_LOG_MAX)
}

/// The window log a zstd frame's header asks for (`None`: not a frame
/// header this can read; the decoder then says what is wrong). Spec: RFC
/// 8878, 3.1.1.1 (Frame_Header_Descriptor, Window_Descriptor).
pub(crate) fn zstd_window_log(frame: &[u8]) -> Option<u32> {
    if frame.get(..4)? != [0x28, 0xb5, 0x2f, 0xfd] {
        return None;
    }
    let descriptor = *frame.get(4)?;
    let window_size: u64 = if descriptor & 0x20 != 0 {
        // Single segment: the window is the content, whose size follows
        // the dictionary id.
        let id_bytes = [0, 1, 2, 4][usize::from(descriptor & 0x3)];
        let size_bytes = [1, 2, 4, 8][usize::from(descriptor >> 6)];
        let at = 5 + id_bytes;
        let field = frame.get(at..at + size_bytes)?;
        let mut size = [0u8; 8];
        size[..size_bytes].copy_from_slice(field);
        let size = u64::from_le_bytes(size);
        if size_bytes == 2 { size + 256 } else { size }
    } else {
        let window = *frame.get(5)?;
        let log = 10 + u32::from(window >> 3);
        let base = 1u64 << log;
        base + (base / 8) * u64::from(window & 0x7)
    };
    Some(64 - window_size.max(1).saturating_sub(1).leading_zeros())
}
/// The smallest possible record: length, attributes, timestamp delta, offset
/// delta, key length, value length and header count, one byte each.
pub(crate) const MIN_RECORD_LEN: usize = 7;

/// One record, as stored inside a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub offset_delta: i32,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(Bytes, Option<Bytes>)>,
}

/// What [`Records::next_meta`] reads of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordMeta {
    pub offset_delta: i32,
    pub timestamp: i64,
    pub has_key: bool,
}

/// The body of a batch: in place, or a decompressing stream.
enum Input {
    Slice(Bytes),
    Stream {
        reader: Box<dyn BufRead + Send>,
        /// Decompressed bytes still allowed ([`MAX_DECOMPRESSED_BYTES`] in all).
        left: usize,
    },
}

/// A batch body's record bytes, decompressed (at most
/// [`MAX_DECOMPRESSED_BYTES`]); an uncompressed body as it is.
pub(crate) fn decompressed(codec: Compression, body: Bytes) -> Result<Bytes, BatchError> {
    match Input::new(codec, body)? {
        Input::Slice(bytes) => Ok(bytes),
        Input::Stream { reader, left } => {
            let mut out = Vec::new();
            reader
                .take(left as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| BatchError::Decompress(e.to_string()))?;
            if out.len() > left {
                return Err(BatchError::Decompress(format!(
                    "batch decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes"
                )));
            }
            Ok(Bytes::from(out))
        }
    }
}

/// The LZ4 frame magic number (little-endian on the wire).
const LZ4_MAGIC: u32 = 0x184D_2204;

/// Refuses an LZ4 body Kafka's reader (`Lz4BlockInputStream`) cannot read,
/// though lz4_flex can: another magic (the legacy format), linked blocks,
/// a dictionary id or other reserved bits, a version other than 1, a block
/// size code outside 4–7. Such a batch, once stored, stops every Java
/// consumer of its partition.
pub(crate) fn check_lz4_frame(body: &[u8]) -> Result<(), BatchError> {
    let refuse = |what: &str| Err(malformed(format!("an LZ4 frame Kafka cannot read: {what}")));
    let Some(&[m0, m1, m2, m3, flg, bd, _checksum]) = body.get(..7) else {
        return refuse("its header is cut short");
    };
    if u32::from_le_bytes([m0, m1, m2, m3]) != LZ4_MAGIC {
        return refuse("not the LZ4 frame format's magic number");
    }
    if flg >> 6 != 1 {
        return refuse("a frame version other than 1");
    }
    if flg & 0x20 == 0 {
        return refuse("linked blocks (Kafka reads independent blocks only)");
    }
    if flg & 0x03 != 0 {
        return refuse("a dictionary id or reserved bits set");
    }
    if bd & 0x8f != 0 || !(4..=7).contains(&(bd >> 4)) {
        return refuse("a block size code outside 4–7 or reserved bits set");
    }
    Ok(())
}

/// Where the first LZ4 frame of `body` ends (after its end mark and
/// content checksum), from its block sizes; `None` when it is no frame
/// or is cut short (the decoder then says what is wrong).
fn lz4_frame_end(body: &[u8]) -> Option<usize> {
    let magic = u32::from_le_bytes(body.get(..4)?.try_into().ok()?);
    if magic != LZ4_MAGIC {
        return None;
    }
    let flg = *body.get(4)?;
    let (content_size, dictionary) = (flg & 0x08 != 0, flg & 0x01 != 0);
    let (block_checksums, content_checksum) = (flg & 0x10 != 0, flg & 0x04 != 0);
    // Magic, FLG, BD, the optional content size and dictionary id, HC.
    let mut pos: usize = 7 + if content_size { 8 } else { 0 } + if dictionary { 4 } else { 0 };
    loop {
        let size = u32::from_le_bytes(body.get(pos..pos.checked_add(4)?)?.try_into().ok()?);
        pos += 4;
        let len = (size & 0x7fff_ffff) as usize;
        if len == 0 {
            let end = pos + if content_checksum { 4 } else { 0 };
            return (end <= body.len()).then_some(end);
        }
        pos = pos
            .checked_add(len)?
            .checked_add(if block_checksums { 4 } else { 0 })?;
    }
}

impl Input {
    fn new(codec: Compression, body: Bytes) -> Result<Self, BatchError> {
        let err = |e: io::Error| BatchError::Decompress(e.to_string());
        let buffered = |read: Box<dyn Read + Send>| -> Box<dyn BufRead + Send> {
            Box::new(BufReader::with_capacity(STREAM_BUFFER, read))
        };
        let reader: Box<dyn BufRead + Send> = match codec {
            Compression::None => return Ok(Input::Slice(body)),
            Compression::Gzip => buffered(Box::new(flate2::bufread::MultiGzDecoder::new(body.reader()))),
            // The frame decoder buffers a whole block itself. Only the
            // first frame is read, as Kafka's reader stops at its end mark
            // (lz4_flex would go on to the next).
            Compression::Lz4 => {
                let body = lz4_frame_end(&body).map_or(body.clone(), |end| body.slice(..end));
                Box::new(lz4_flex::frame::FrameDecoder::new(body.reader()))
            }
            Compression::Zstd => {
                let limit = if large_zstd_window(&body) {
                    ZSTD_WINDOW_LOG_LIMIT
                } else {
                    ZSTD_WINDOW_LOG_MAX
                };
                let mut decoder = zstd::stream::read::Decoder::with_buffer(body.reader()).map_err(err)?;
                decoder.window_log_max(limit).map_err(err)?;
                buffered(Box::new(decoder))
            }
            Compression::Snappy => buffered(Box::new(SnappyReader::new(body).map_err(err)?)),
        };
        Ok(Input::Stream {
            reader,
            left: MAX_DECOMPRESSED_BYTES,
        })
    }

    fn fill(&mut self) -> Result<&[u8], BatchError> {
        match self {
            Input::Slice(bytes) => Ok(&bytes[..]),
            Input::Stream { reader, .. } => reader
                .fill_buf()
                .map_err(|e| BatchError::Decompress(e.to_string())),
        }
    }

    fn consume(&mut self, n: usize) -> Result<(), BatchError> {
        match self {
            Input::Slice(bytes) => bytes.advance(n),
            Input::Stream { reader, left } => {
                *left = left.checked_sub(n).ok_or_else(|| {
                    BatchError::Decompress(format!(
                        "batch decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes"
                    ))
                })?;
                reader.consume(n);
            }
        }
        Ok(())
    }

    fn is_empty(&mut self) -> Result<bool, BatchError> {
        Ok(self.fill()?.is_empty())
    }

    /// A zig-zag varlong of at most `limit` bytes, decoded from the
    /// buffered bytes in one step when they hold it whole; with the number
    /// of bytes it took.
    fn varlong(&mut self, limit: usize) -> Result<(i64, usize), BatchError> {
        let chunk = self.fill()?;
        let mut value: u64 = 0;
        for (i, &byte) in chunk.iter().take(limit.min(10)).enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.consume(i + 1)?;
                return Ok((((value >> 1) as i64) ^ -((value & 1) as i64), i + 1));
            }
        }
        // Across a buffer boundary, or malformed: a byte at a time.
        let mut taken = 0;
        let decoded = read_varlong(|| {
            if taken == limit {
                return Err(malformed("record truncated"));
            }
            let byte = *self
                .fill()?
                .first()
                .ok_or_else(|| malformed("varint truncated"))?;
            self.consume(1)?;
            taken += 1;
            Ok(byte)
        })?;
        Ok((decoded, taken))
    }
}

/// Reads one record's fields, never past its declared length.
struct Cursor<'a> {
    input: &'a mut Input,
    left: usize,
    /// Varints of at most [`MAX_VARINT_LEN`] bytes (produce validation).
    strict: bool,
}

/// A varint of `taken` bytes, refused when `strict` and longer than Kafka
/// reads.
fn check_varint_len(strict: bool, taken: usize) -> Result<(), BatchError> {
    if strict && taken > MAX_VARINT_LEN {
        return Err(malformed(format!(
            "a varint of {taken} bytes (Kafka reads at most {MAX_VARINT_LEN})"
        )));
    }
    Ok(())
}

fn malformed(message: impl Into<String>) -> BatchError {
    BatchError::Records(message.into())
}

impl Cursor<'_> {
    fn byte(&mut self) -> Result<u8, BatchError> {
        if self.left == 0 {
            return Err(malformed("record truncated"));
        }
        let byte = *self
            .input
            .fill()?
            .first()
            .ok_or_else(|| malformed("record truncated"))?;
        self.input.consume(1)?;
        self.left -= 1;
        Ok(byte)
    }

    fn varlong(&mut self) -> Result<i64, BatchError> {
        let (value, taken) = self.input.varlong(self.left)?;
        self.left -= taken;
        Ok(value)
    }

    fn varint(&mut self) -> Result<i32, BatchError> {
        let (v, taken) = self.input.varlong(self.left)?;
        self.left -= taken;
        check_varint_len(self.strict, taken)?;
        i32::try_from(v).map_err(|_| malformed(format!("varint {v} out of range")))
    }

    /// A length field: -1 (null) or the length of what follows, which must
    /// fit in the record.
    fn length(&mut self) -> Result<Option<usize>, BatchError> {
        match self.varint()? {
            -1 => Ok(None),
            n if n >= 0 && n as usize <= self.left => Ok(Some(n as usize)),
            n => Err(malformed(format!(
                "length {n} with {} bytes of the record left",
                self.left
            ))),
        }
    }

    fn skip(&mut self, mut n: usize) -> Result<(), BatchError> {
        self.left -= n;
        while n > 0 {
            let available = self.input.fill()?.len().min(n);
            if available == 0 {
                return Err(malformed("record truncated"));
            }
            self.input.consume(available)?;
            n -= available;
        }
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<Bytes, BatchError> {
        self.left -= n;
        if let Input::Slice(bytes) = self.input {
            if bytes.len() < n {
                return Err(malformed("record truncated"));
            }
            return Ok(bytes.split_to(n));
        }
        let mut out = BytesMut::with_capacity(n);
        while out.len() < n {
            let chunk = self.input.fill()?;
            let available = chunk.len().min(n - out.len());
            if available == 0 {
                return Err(malformed("record truncated"));
            }
            out.extend_from_slice(&chunk[..available]);
            self.input.consume(available)?;
        }
        Ok(out.freeze())
    }

    fn nullable(&mut self, keep: bool) -> Result<Option<Bytes>, BatchError> {
        match self.length()? {
            None => Ok(None),
            Some(n) if keep => self.take(n).map(Some),
            Some(n) => self.skip(n).map(|()| Some(Bytes::new())),
        }
    }
}

/// Decodes a zig-zag varlong from bytes given one at a time.
pub(crate) fn read_varlong(mut next: impl FnMut() -> Result<u8, BatchError>) -> Result<i64, BatchError> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = next()?;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    Err(malformed("varint too long"))
}

/// The checks [`Records::next_meta`] and `validate_produce_batch` make of
/// an uncompressed body — framing, lengths within their record, dense
/// offset deltas, the count — done over the slice in one pass, for the
/// produce path: `Some(its timestamps)` when every check passes, `None`
/// when one fails (the general reader then says which).
pub(crate) fn walk_plain(body: &[u8], count: i32, base_timestamp: i64) -> Option<super::RecordFacts> {
    if count < 0 || count as usize > body.len() / MIN_RECORD_LEN {
        return None;
    }
    let mut timestamps = super::RecordFacts::default();
    let mut pos = 0;
    for expected in 0..i64::from(count) {
        let (len, n) = varint_at::<true>(body, pos)?;
        pos += n;
        let len = usize::try_from(len)
            .ok()
            .filter(|len| *len >= MIN_RECORD_LEN - 1)?;
        let record = body.get(pos..pos.checked_add(len)?)?;
        pos += len;
        // Attributes, then the timestamp and offset deltas.
        let mut at = 1;
        let (timestamp_delta, n) = varlong_at(record, at)?;
        at += n;
        let (offset_delta, n) = varint_at::<true>(record, at)?;
        at += n;
        if offset_delta != expected {
            return None;
        }
        let (has_key, after_key) = skip_nullable::<true>(record, at)?;
        at = after_key;
        timestamps.add(
            base_timestamp.wrapping_add(timestamp_delta),
            expected as i32,
            has_key,
        );
        at = skip_nullable::<true>(record, at)?.1; // value
        check_headers::<true>(record, at)?;
    }
    (pos == body.len()).then_some(timestamps)
}

/// Checks a record's headers, from `at` (their count) to the record's
/// end: a count that fits, a key for each, nothing after the last. Where
/// they start (after the count). `STRICT`: varints of at most 5 bytes.
#[inline(always)]
fn check_headers<const STRICT: bool>(record: &[u8], at: usize) -> Option<usize> {
    let (headers, n) = varint_at::<STRICT>(record, at)?;
    let start = at + n;
    if headers < 0 || headers as usize > (record.len() - start) / 2 {
        return None;
    }
    let mut at = start;
    for _ in 0..headers {
        let (present, next) = skip_nullable::<STRICT>(record, at)?;
        if !present {
            return None;
        }
        at = skip_nullable::<STRICT>(record, next)?.1;
    }
    (at == record.len()).then_some(start)
}

/// A record of an uncompressed batch, its fields borrowed from the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub offset_delta: i32,
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// The headers, as they are in the record (checked when it was read).
    headers: &'a [u8],
}

impl<'a> RecordRef<'a> {
    /// The headers' keys and values, in order.
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + use<'a> {
        let record = self.headers;
        let mut at = 0;
        std::iter::from_fn(move || {
            let (key, next) = nullable_at(record, at)?;
            let (value, next) = nullable_at(record, next)?;
            at = next;
            Some((key?, value))
        })
    }
}

/// The records of an uncompressed body read in place, in one pass, each
/// checked as [`Records::next_record`] checks it (framing, lengths within
/// the record, a key for every header, offset deltas 0, 1, 2, …, the
/// declared count exactly): the archive reads every record of a segment
/// this way, with no copy or reference count per field. A record that
/// fails a check ends the iteration with an error.
pub struct PlainRecords<'a> {
    body: &'a [u8],
    pos: usize,
    next_delta: i64,
    count: i64,
    base_timestamp: i64,
}

impl<'a> PlainRecords<'a> {
    /// The records of a stored batch, or `None` when its body is compressed
    /// (then [`Records`] reads it).
    pub fn of_batch(batch: &'a [u8]) -> Result<Option<Self>, BatchError> {
        let header = super::header(batch)?;
        if header.compression()? != Compression::None {
            return Ok(None);
        }
        let body = &batch[super::HEADER_LEN..];
        if header.record_count < 0 {
            return Err(BatchError::RecordCount(header.record_count));
        }
        if header.record_count as usize > body.len() / MIN_RECORD_LEN {
            return Err(BatchError::CountTooLarge {
                count: header.record_count,
                bytes: body.len(),
            });
        }
        Ok(Some(Self {
            body,
            pos: 0,
            next_delta: 0,
            count: i64::from(header.record_count),
            base_timestamp: header.base_timestamp,
        }))
    }

    fn record(&mut self) -> Option<RecordRef<'a>> {
        let (len, n) = varint_at::<false>(self.body, self.pos)?;
        let start = self.pos + n;
        let len = usize::try_from(len)
            .ok()
            .filter(|len| *len >= MIN_RECORD_LEN - 1)?;
        let record = self.body.get(start..start.checked_add(len)?)?;
        // Attributes, then the timestamp and offset deltas.
        let mut at = 1;
        let (timestamp_delta, n) = varlong_at(record, at)?;
        at += n;
        let (offset_delta, n) = varint_at::<false>(record, at)?;
        at += n;
        if offset_delta != self.next_delta {
            return None;
        }
        let (key, next) = nullable_at(record, at)?;
        let (value, next) = nullable_at(record, next)?;
        let headers_start = check_headers::<false>(record, next)?;
        self.pos = start + len;
        self.next_delta += 1;
        Some(RecordRef {
            offset_delta: offset_delta as i32,
            timestamp: self.base_timestamp.wrapping_add(timestamp_delta),
            key,
            value,
            headers: &record[headers_start..],
        })
    }
}

impl<'a> Iterator for PlainRecords<'a> {
    type Item = Result<RecordRef<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next_delta == self.count {
            if self.pos == self.body.len() {
                return None;
            }
            self.next_delta += 1; // reported once
            return Some(Err(malformed(format!(
                "{} bytes follow the batch's {} records",
                self.body.len() - self.pos,
                self.count
            ))));
        }
        if self.next_delta > self.count {
            return None;
        }
        let delta = self.next_delta;
        Some(self.record().ok_or_else(|| {
            self.next_delta = self.count + 1;
            malformed(format!("record {delta} of {} is malformed", self.count))
        }))
    }
}

/// A length-prefixed field that may be null, and where the record goes on.
#[inline]
fn nullable_at(record: &[u8], at: usize) -> Option<(Option<&[u8]>, usize)> {
    match skip_nullable::<false>(record, at)? {
        (false, next) => Some((None, next)),
        (true, next) => {
            let (len, _) = varlong_at(record, at)?;
            Some((Some(&record[next - len as usize..next]), next))
        }
    }
}

/// Skips a length-prefixed field that may be null: whether it was there,
/// and where the record goes on. `STRICT`: a length of at most 5 bytes.
#[inline(always)]
fn skip_nullable<const STRICT: bool>(record: &[u8], at: usize) -> Option<(bool, usize)> {
    let (len, n) = varint_at::<STRICT>(record, at)?;
    let at = at + n;
    match len {
        -1 => Some((false, at)),
        len if len >= 0 && len <= i64::from(i32::MAX) && len as usize <= record.len() - at => {
            Some((true, at + len as usize))
        }
        _ => None,
    }
}

/// A zig-zag varlong at `pos` (at most 10 bytes), with its length.
///
/// Validation walks six of these per record, each depending on where the
/// previous one ended, so the one- and two-byte forms (values up to
/// 8,191: a small record's lengths, and its deltas within a batch of up
/// to 8,192 records spanning 8 s) are decoded inline and the rest in a
/// call of its own.
#[inline(always)]
fn varlong_at(buf: &[u8], pos: usize) -> Option<(i64, usize)> {
    let first = *buf.get(pos)?;
    if first < 0x80 {
        return Some((zigzag(u64::from(first)), 1));
    }
    match buf.get(pos + 1) {
        Some(&second) if second < 0x80 => Some((zigzag(u64::from(first & 0x7f) | u64::from(second) << 7), 2)),
        _ => varlong_long(buf, pos),
    }
}

/// The longest varint (a 32-bit field) Kafka reads: 5 bytes
/// (`ByteUtils.readVarint`; a record refused so is an
/// `InvalidRecordException`). Timestamp deltas are varlongs (10).
pub(crate) const MAX_VARINT_LEN: usize = 5;

/// [`varlong_at`] for a varint field; `STRICT` (produce validation): one
/// of at most [`MAX_VARINT_LEN`] bytes, as Kafka's readers take. Stored
/// batches are read without the limit: one accepted before it was checked
/// stays readable.
#[inline(always)]
fn varint_at<const STRICT: bool>(buf: &[u8], pos: usize) -> Option<(i64, usize)> {
    let (value, n) = varlong_at(buf, pos)?;
    (!STRICT || n <= MAX_VARINT_LEN).then_some((value, n))
}

#[inline]
fn zigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// [`varlong_at`] for the longer forms and at the slice's last byte.
#[cold]
#[inline(never)]
fn varlong_long(buf: &[u8], pos: usize) -> Option<(i64, usize)> {
    let mut value = 0u64;
    for i in 0..10 {
        let byte = *buf.get(pos.checked_add(i)?)?;
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Some((zigzag(value), i + 1));
        }
    }
    None
}

/// Iterates the records of a batch body.
pub struct Records {
    input: Input,
    remaining: i32,
    base_timestamp: i64,
    /// Varints of at most [`MAX_VARINT_LEN`] bytes ([`Records::strict`]).
    strict: bool,
}

impl Records {
    pub(crate) fn new(body: Bytes, header: &BatchHeader) -> Result<Self, BatchError> {
        if header.record_count < 0 {
            return Err(BatchError::RecordCount(header.record_count));
        }
        let codec = header.compression()?;
        if codec == Compression::None && header.record_count as usize > body.len() / MIN_RECORD_LEN {
            return Err(BatchError::CountTooLarge {
                count: header.record_count,
                bytes: body.len(),
            });
        }
        Ok(Self {
            input: Input::new(codec, body)?,
            remaining: header.record_count,
            base_timestamp: header.base_timestamp,
            strict: false,
        })
    }

    /// These records read as a produce request's are validated: a varint
    /// field longer than Kafka reads ([`MAX_VARINT_LEN`]) is refused.
    pub(crate) fn strict(mut self) -> Self {
        self.strict = true;
        self
    }

    /// The records of a whole stored batch.
    pub fn of_batch(batch: &Bytes) -> Result<Self, BatchError> {
        let header = super::header(batch)?;
        Self::new(batch.slice(super::HEADER_LEN..), &header)
    }

    /// The next record; `Ok(None)` once the declared count has been read and
    /// the body is exhausted; an error if the two disagree.
    pub fn next_record(&mut self) -> Result<Option<Record>, BatchError> {
        let base_timestamp = self.base_timestamp;
        let Some(mut cursor) = self.start()? else {
            return Ok(None);
        };
        let (offset_delta, timestamp) = Self::prefix(&mut cursor, base_timestamp)?;
        let key = cursor.nullable(true)?;
        let value = cursor.nullable(true)?;
        let count = Self::header_count(&mut cursor)?;
        let mut headers = Vec::with_capacity(count);
        for _ in 0..count {
            let key = cursor
                .nullable(true)?
                .ok_or_else(|| malformed("null header key"))?;
            headers.push((key, cursor.nullable(true)?));
        }
        Self::finish(&cursor)?;
        Ok(Some(Record {
            offset_delta,
            timestamp,
            key,
            value,
            headers,
        }))
    }

    /// The next record's offset delta and timestamp, checking its framing
    /// but skipping its key, value and headers.
    pub fn next_meta(&mut self) -> Result<Option<RecordMeta>, BatchError> {
        let base_timestamp = self.base_timestamp;
        let Some(mut cursor) = self.start()? else {
            return Ok(None);
        };
        let (offset_delta, timestamp) = Self::prefix(&mut cursor, base_timestamp)?;
        let has_key = cursor.nullable(false)?.is_some();
        cursor.nullable(false)?;
        for _ in 0..Self::header_count(&mut cursor)? {
            cursor
                .nullable(false)?
                .ok_or_else(|| malformed("null header key"))?;
            cursor.nullable(false)?;
        }
        Self::finish(&cursor)?;
        Ok(Some(RecordMeta {
            offset_delta,
            timestamp,
            has_key,
        }))
    }

    /// A cursor over the next record, or `None` at a consistent end.
    fn start(&mut self) -> Result<Option<Cursor<'_>>, BatchError> {
        if self.remaining == 0 {
            if !self.input.is_empty()? {
                return Err(malformed("bytes after the last record"));
            }
            return Ok(None);
        }
        if self.input.is_empty()? {
            return Err(malformed(format!("{} records missing", self.remaining)));
        }
        self.remaining -= 1;
        let input = &mut self.input;
        let (len, taken) = input.varlong(10)?;
        check_varint_len(self.strict, taken)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|len| *len >= MIN_RECORD_LEN - 1)
            .ok_or_else(|| malformed(format!("record length {len}")))?;
        Ok(Some(Cursor {
            input,
            left: len,
            strict: self.strict,
        }))
    }

    fn prefix(cursor: &mut Cursor<'_>, base_timestamp: i64) -> Result<(i32, i64), BatchError> {
        let _attributes = cursor.byte()?;
        let timestamp_delta = cursor.varlong()?;
        let offset_delta = cursor.varint()?;
        Ok((offset_delta, base_timestamp.wrapping_add(timestamp_delta)))
    }

    fn header_count(cursor: &mut Cursor<'_>) -> Result<usize, BatchError> {
        let count = cursor.varint()?;
        // Each header takes at least two bytes (two lengths).
        if count < 0 || count as usize > cursor.left / 2 {
            return Err(malformed(format!("header count {count} exceeds the record")));
        }
        Ok(count as usize)
    }

    fn finish(cursor: &Cursor<'_>) -> Result<(), BatchError> {
        if cursor.left > 0 {
            return Err(malformed(format!("{} bytes left inside a record", cursor.left)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(value: i64) -> Vec<u8> {
        let mut v = ((value << 1) ^ (value >> 63)) as u64;
        let mut out = Vec::new();
        while v >= 0x80 {
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    /// A zstd frame as a Java producer streams it (no pledged size) at
    /// `level`.
    fn streamed_zstd(body: &[u8], level: i32) -> Vec<u8> {
        use std::io::Write;
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), level).unwrap();
        encoder.write_all(body).unwrap();
        encoder.finish().unwrap()
    }

    /// Frames at levels 20–22 ask for windows of 32–128 MiB (Java
    /// producers at `compression.zstd.level` 20+, KIP-390): decoded, as
    /// Kafka decodes them, a bounded number at a time.
    #[test]
    fn large_window_zstd_frames_decode_a_few_at_a_time() {
        let body: Vec<u8> = (0..50_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        for (level, log) in [(3, 21), (19, 23), (20, 25), (22, 27)] {
            let frame = streamed_zstd(&body, level);
            assert_eq!(zstd_window_log(&frame), Some(log), "level {level}");
            let out = decompressed(Compression::Zstd, Bytes::from(frame)).expect("decoded");
            assert_eq!(&out[..], &body[..], "level {level}");
        }
        // A frame of known size asks for no more than it holds.
        let sized = zstd::bulk::compress(&body, 22).unwrap();
        assert!(zstd_window_log(&sized).is_some_and(|log| log <= ZSTD_WINDOW_LOG_MAX));
    }

    /// What the streaming decoder makes of `bytes` from `pos`.
    fn streamed(bytes: &[u8], pos: usize) -> Option<(i64, usize)> {
        let mut at = pos;
        let value = read_varlong(|| {
            let byte = bytes.get(at).copied().ok_or_else(|| malformed("truncated"));
            at += 1;
            byte
        })
        .ok()?;
        Some((value, at - pos))
    }

    #[test]
    fn the_inline_varlong_forms_agree_with_the_streaming_decoder() {
        // Every one- and two-byte string, alone and followed by a byte.
        for first in 0..=255u8 {
            for bytes in [vec![first], vec![first, 0x01]] {
                assert_eq!(varlong_at(&bytes, 0), streamed(&bytes, 0), "{bytes:?}");
            }
            for second in 0..=255u8 {
                let bytes = [first, second];
                assert_eq!(varlong_at(&bytes, 0), streamed(&bytes, 0), "{bytes:?}");
                assert_eq!(varlong_at(&bytes, 1), streamed(&bytes, 1), "{bytes:?} at 1");
            }
        }
        // Values of every length, whole, cut short, past the slice and
        // after a prefix.
        for value in [0, -1, 63, -64, 64, 8191, -8192, 8192, 1 << 40, i64::MAX, i64::MIN] {
            let bytes = encode(value);
            assert_eq!(varlong_at(&bytes, 0), Some((value, bytes.len())), "{value}");
            assert_eq!(varlong_at(&bytes[..bytes.len() - 1], 0), None, "{value} cut");
            assert_eq!(varlong_at(&bytes, bytes.len()), None);
            let mut prefixed = vec![0x81, 0x01];
            prefixed.extend(&bytes);
            assert_eq!(varlong_at(&prefixed, 2), Some((value, bytes.len())));
        }
        // More than ten bytes of continuation is refused, as the stream does.
        assert_eq!(varlong_at(&[0xff; 12], 0), None);
        assert_eq!(streamed(&[0xff; 12], 0), None);
        assert_eq!(varlong_at(&[1, 2], usize::MAX), None);
    }
}
