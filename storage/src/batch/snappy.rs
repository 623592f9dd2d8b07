//! Snappy, decoded as a stream through a bounded window.
//!
//! Spec: snappy's `format_description.txt` (the raw format) and xerial's
//! `SnappyOutputStream` framing, which the Java client writes: the magic
//! `\x82SNAPPY\0`, two version ints, then blocks, each a big-endian length
//! and a raw snappy stream. librdkafka writes a raw stream.
//!
//! A raw stream declares its decompressed length up front, so a decoder that
//! allocates that much before decoding can be made to ask for gigabytes by a
//! few bytes. This one produces output as it is read and keeps only the last
//! 64 KiB: every snappy compressor works in blocks of at most 64 KiB and
//! never copies from further back, and a stream that does is refused.

use std::io::{self, Read};

use bytes::{Buf, Bytes};

/// Output kept for back-references.
const HISTORY: usize = 64 * 1024;
/// Output decoded ahead of the reader at a time.
const CHUNK: usize = 16 * 1024;
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_LEN: usize = 16;

fn corrupt(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("snappy: {}", message.into()))
}

/// Reads a snappy body (raw or xerial-framed) as decompressed bytes.
pub(crate) struct SnappyReader {
    /// The xerial blocks not started yet (empty for a raw stream).
    blocks: Bytes,
    current: Option<RawDecoder>,
}

impl SnappyReader {
    pub(crate) fn new(body: Bytes) -> io::Result<Self> {
        if body.len() >= XERIAL_HEADER_LEN && body.starts_with(XERIAL_MAGIC) {
            return Ok(Self {
                blocks: body.slice(XERIAL_HEADER_LEN..),
                current: None,
            });
        }
        Ok(Self {
            blocks: Bytes::new(),
            current: Some(RawDecoder::new(body)?),
        })
    }

    /// The next xerial block's decoder; `None` after the last.
    fn next_block(&mut self) -> io::Result<Option<RawDecoder>> {
        if self.blocks.is_empty() {
            return Ok(None);
        }
        if self.blocks.len() < 4 {
            return Err(corrupt("xerial block length truncated"));
        }
        let len = self.blocks.get_u32() as usize;
        if len > self.blocks.len() {
            return Err(corrupt(format!(
                "xerial block of {len} bytes, {} left",
                self.blocks.len()
            )));
        }
        RawDecoder::new(self.blocks.split_to(len)).map(Some)
    }
}

impl Read for SnappyReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(decoder) = &mut self.current {
                let n = decoder.read(out)?;
                if n > 0 || out.is_empty() {
                    return Ok(n);
                }
            }
            match self.next_block()? {
                Some(decoder) => self.current = Some(decoder),
                None => {
                    self.current = None;
                    return Ok(0);
                }
            }
        }
    }
}

/// One raw snappy stream.
struct RawDecoder {
    input: Bytes,
    /// The decompressed length the stream declares.
    declared: u64,
    /// Bytes of output decoded so far.
    produced: u64,
    /// Recent output: up to [`HISTORY`] bytes already read, then unread ones.
    window: Vec<u8>,
    /// Where the unread output starts in `window`.
    read_at: usize,
    /// Bytes of the current literal still to copy from `input`.
    literal: usize,
}

impl RawDecoder {
    fn new(mut input: Bytes) -> io::Result<Self> {
        let declared = read_uvarint(&mut input)?;
        Ok(Self {
            input,
            declared,
            produced: 0,
            window: Vec::new(),
            read_at: 0,
            literal: 0,
        })
    }

    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.read_at == self.window.len() {
            if self.input.is_empty() && self.literal == 0 {
                if self.produced != self.declared {
                    return Err(corrupt(format!(
                        "stream ends after {} of the {} bytes it declares",
                        self.produced, self.declared
                    )));
                }
                return Ok(0);
            }
            if self.window.len() > HISTORY {
                self.window.drain(..self.window.len() - HISTORY);
                self.read_at = self.window.len();
            }
            self.decode_chunk()?;
        }
        let n = out.len().min(self.window.len() - self.read_at);
        out[..n].copy_from_slice(&self.window[self.read_at..self.read_at + n]);
        self.read_at += n;
        Ok(n)
    }

    /// Decodes elements until about [`CHUNK`] bytes were added or the input ends.
    fn decode_chunk(&mut self) -> io::Result<()> {
        let target = self.window.len() + CHUNK;
        while self.window.len() < target && !(self.input.is_empty() && self.literal == 0) {
            if self.literal > 0 {
                let n = self.literal.min(self.input.len()).min(target - self.window.len());
                if n == 0 {
                    return Err(corrupt("literal runs past the end of the input"));
                }
                self.emit(n as u64)?;
                self.window.extend_from_slice(&self.input[..n]);
                self.input.advance(n);
                self.literal -= n;
                continue;
            }
            let tag = self.input.get_u8();
            match tag & 0x03 {
                0 => {
                    let short = usize::from(tag >> 2);
                    self.literal = if short < 60 {
                        short + 1
                    } else {
                        let bytes = short - 59;
                        self.need(bytes)?;
                        let mut len = 0usize;
                        for i in 0..bytes {
                            len |= usize::from(self.input.get_u8()) << (8 * i);
                        }
                        len + 1
                    };
                }
                1 => {
                    self.need(1)?;
                    let len = 4 + usize::from((tag >> 2) & 0x07);
                    let offset = (usize::from(tag >> 5) << 8) | usize::from(self.input.get_u8());
                    self.copy(offset, len)?;
                }
                2 => {
                    self.need(2)?;
                    let offset = usize::from(self.input.get_u16_le());
                    self.copy(offset, usize::from(tag >> 2) + 1)?;
                }
                _ => {
                    self.need(4)?;
                    let offset = self.input.get_u32_le() as usize;
                    self.copy(offset, usize::from(tag >> 2) + 1)?;
                }
            }
        }
        Ok(())
    }

    fn need(&self, bytes: usize) -> io::Result<()> {
        if self.input.len() < bytes {
            return Err(corrupt("element truncated"));
        }
        Ok(())
    }

    /// Counts `n` more bytes of output against the declared length.
    fn emit(&mut self, n: u64) -> io::Result<()> {
        self.produced += n;
        if self.produced > self.declared {
            return Err(corrupt(format!(
                "more output than the {} bytes the stream declares",
                self.declared
            )));
        }
        Ok(())
    }

    fn copy(&mut self, offset: usize, len: usize) -> io::Result<()> {
        if offset == 0 || offset as u64 > self.produced {
            return Err(corrupt(format!("copy from offset {offset} before the start")));
        }
        if offset > self.window.len() {
            return Err(corrupt(format!(
                "copy from {offset} bytes back, further than the {HISTORY} bytes any compressor uses"
            )));
        }
        self.emit(len as u64)?;
        let start = self.window.len() - offset;
        if offset >= len {
            self.window.extend_from_within(start..start + len);
        } else {
            // Overlapping: the copy repeats its own output.
            for i in 0..len {
                let byte = self.window[start + i];
                self.window.push(byte);
            }
        }
        Ok(())
    }
}

fn read_uvarint(input: &mut Bytes) -> io::Result<u64> {
    let mut value = 0u64;
    for shift in (0..35).step_by(7) {
        if input.is_empty() {
            return Err(corrupt("length truncated"));
        }
        let byte = input.get_u8();
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(corrupt("length longer than 32 bits"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(body: Vec<u8>) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        SnappyReader::new(Bytes::from(body))?.read_to_end(&mut out)?;
        Ok(out)
    }

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ (i / 1000) as u8).collect()
    }

    #[test]
    fn raw_streams_decode_like_the_reference_decoder() {
        for len in [0, 1, 100, 65_535, 65_536, 200_000, 1_000_000] {
            let data = sample(len);
            let compressed = snap::raw::Encoder::new().compress_vec(&data).unwrap();
            assert_eq!(decode(compressed).unwrap(), data, "{len} bytes");
        }
        let zeros = vec![0u8; 3_000_000];
        let compressed = snap::raw::Encoder::new().compress_vec(&zeros).unwrap();
        assert_eq!(decode(compressed).unwrap(), zeros);
    }

    #[test]
    fn xerial_blocks_decode_in_order() {
        let parts = [sample(40_000), vec![7u8; 33_000], sample(10)];
        let mut body = XERIAL_MAGIC.to_vec();
        body.extend_from_slice(&1i32.to_be_bytes());
        body.extend_from_slice(&1i32.to_be_bytes());
        for part in &parts {
            let block = snap::raw::Encoder::new().compress_vec(part).unwrap();
            body.extend_from_slice(&(block.len() as u32).to_be_bytes());
            body.extend_from_slice(&block);
        }
        assert_eq!(decode(body).unwrap(), parts.concat());
    }

    #[test]
    fn a_huge_declared_length_allocates_nothing_up_front() {
        // Declares 4 GiB - 1 and holds one literal byte.
        let body = vec![0xff, 0xff, 0xff, 0xff, 0x0f, 0x00, b'x'];
        let mut reader = SnappyReader::new(Bytes::from(body)).unwrap();
        let mut out = [0u8; 8];
        assert_eq!(reader.read(&mut out).unwrap(), 1);
        assert!(reader.read(&mut out).is_err(), "the stream ends early");
    }

    #[test]
    fn malformed_streams_are_errors() {
        // Copy before the start of the output.
        assert!(decode(vec![4, 0x01, 1]).is_err());
        // More output than declared.
        assert!(decode(vec![1, 0x04, b'a', b'b']).is_err());
        // A literal past the end of the input.
        assert!(decode(vec![5, 0x10, b'a']).is_err());
        // A length varint that never ends.
        assert!(decode(vec![0xff; 6]).is_err());
        // A xerial block longer than what follows.
        let mut body = XERIAL_MAGIC.to_vec();
        body.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0, 5]);
        assert!(decode(body).is_err());
    }
}
