//! Validating a compressed batch takes a small fixed amount of memory, not
//! what the batch decompresses to (issue #10): each codec's batch here
//! decompresses to 64 MiB, and validating it may allocate at most 16 MiB
//! (an LZ4 block is at most 4 MiB, snappy keeps 64 KiB, gzip 32 KiB, the
//! records are read through a 32 KiB buffer). zstd's window is allocated by
//! the C library, which this allocator does not see; ketch caps it at
//! 8 MiB (`window_log_max`). One test in this binary, so nothing else
//! allocates meanwhile.

use std::io::Write;

use bytes::Bytes;
use ketch_storage::batch::validate_produce_batch;
use peak_alloc::PeakAlloc;

#[global_allocator]
static ALLOCATOR: PeakAlloc = PeakAlloc;

const RECORDS: usize = 64;
const VALUE: usize = 1024 * 1024;
const LIMIT: usize = 16 * 1024 * 1024;

fn varlong(out: &mut Vec<u8>, value: i64) {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Writes the records (each a 1 MiB value of text) to `w` without ever
/// holding more than one value.
fn write_records(w: &mut impl Write) {
    let line = b"ketch stores every partition in a redis stream and archives it as parquet\n";
    let value: Vec<u8> = line.iter().copied().cycle().take(VALUE).collect();
    for i in 0..RECORDS {
        let mut head = vec![0u8];
        varlong(&mut head, i as i64); // timestamp delta
        varlong(&mut head, i as i64); // offset delta
        varlong(&mut head, -1); // null key
        varlong(&mut head, VALUE as i64);
        let mut framed = Vec::new();
        varlong(&mut framed, (head.len() + VALUE + 1) as i64);
        framed.extend_from_slice(&head);
        w.write_all(&framed).unwrap();
        w.write_all(&value).unwrap();
        w.write_all(&[0]).unwrap(); // no headers
    }
}

fn batch(codec: i16, body: Vec<u8>) -> Bytes {
    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&((49 + body.len()) as i32).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&codec.to_be_bytes());
    b.extend_from_slice(&(RECORDS as i32 - 1).to_be_bytes());
    b.extend_from_slice(&1_000i64.to_be_bytes());
    b.extend_from_slice(&(1_000 + RECORDS as i64 - 1).to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&(RECORDS as i32).to_be_bytes());
    b.extend_from_slice(&body);
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &b[21..]) as u32;
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

/// Snappy as the Java client writes it: xerial framing, 32 KiB blocks.
struct Xerial {
    out: Vec<u8>,
    block: Vec<u8>,
}

impl Write for Xerial {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        for &byte in bytes {
            self.block.push(byte);
            if self.block.len() == 32 * 1024 {
                self.flush()?;
            }
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.block.is_empty() {
            let compressed = snap::raw::Encoder::new().compress_vec(&self.block).unwrap();
            self.out
                .extend_from_slice(&(compressed.len() as u32).to_be_bytes());
            self.out.extend_from_slice(&compressed);
            self.block.clear();
        }
        Ok(())
    }
}

#[test]
fn validating_a_batch_that_decompresses_to_64_mib_allocates_a_small_fixed_amount() {
    let gzip = {
        let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        write_records(&mut w);
        batch(1, w.finish().unwrap())
    };
    let snappy = {
        let mut header = b"\x82SNAPPY\x00".to_vec();
        header.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1]);
        let mut w = Xerial {
            out: header,
            block: Vec::new(),
        };
        write_records(&mut w);
        w.flush().unwrap();
        batch(2, w.out)
    };
    let lz4 = {
        let mut w = lz4_flex::frame::FrameEncoder::new(Vec::new());
        write_records(&mut w);
        batch(3, w.finish().unwrap())
    };
    let zstd = {
        let mut w = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        write_records(&mut w);
        batch(4, w.finish().unwrap())
    };
    for (codec, batch) in [("gzip", gzip), ("snappy", snappy), ("lz4", lz4), ("zstd", zstd)] {
        let before = ALLOCATOR.current_usage();
        ALLOCATOR.reset_peak_usage();
        let valid = validate_produce_batch(&batch).unwrap_or_else(|e| panic!("{codec}: {e}"));
        let extra = ALLOCATOR.peak_usage() - before;
        eprintln!(
            "{codec}: a {} KiB batch of {} MiB of records: {} KiB allocated at most while validating",
            batch.len() / 1024,
            RECORDS * VALUE / (1024 * 1024),
            extra / 1024
        );
        assert_eq!(valid.header.record_count as usize, RECORDS);
        assert!(extra < LIMIT, "{codec}: validation allocated {extra} bytes");
    }
}
