//! The record-batch fuzz target's body (`fuzz/fuzz_targets/batch.rs`),
//! also run over the committed corpus by this crate's tests.
//!
//! The input is a record batch. Its length field and CRC are set to match
//! the input, so the fuzzer's mutations reach the record framing and the
//! decompressors instead of dying at the CRC check. The property: a batch
//! [`validate_produce_batch`] accepts reads back completely — exactly its
//! declared records, offset deltas 0, 1, 2, …, the max timestamp the
//! validator reports — and nothing panics either way.

use bytes::Bytes;

use crate::batch::{self, HEADER_LEN, Records, validate_produce_batch};

/// Runs one input; panics if the property fails.
pub fn batch(data: &[u8]) {
    let mut bytes = data.to_vec();
    if bytes.len() >= HEADER_LEN {
        let length = (bytes.len() - 12) as i32;
        bytes[8..12].copy_from_slice(&length.to_be_bytes());
        let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &bytes[21..]) as u32;
        bytes[17..21].copy_from_slice(&crc.to_be_bytes());
    }
    let bytes = Bytes::from(bytes);
    let Ok(valid) = validate_produce_batch(&bytes) else {
        // Refused input must still be safe to read as a stored batch.
        if let Ok(mut records) = Records::of_batch(&bytes) {
            while let Ok(Some(_)) = records.next_record() {}
        }
        return;
    };
    let header = batch::header(&bytes).expect("an accepted batch has a header");
    let mut records = Records::of_batch(&bytes).expect("an accepted batch reads");
    let mut count = 0;
    let mut max_timestamp = -1;
    while let Some(record) = records.next_record().expect("an accepted batch's records read") {
        assert_eq!(record.offset_delta, count, "offset deltas are dense");
        max_timestamp = max_timestamp.max(record.timestamp);
        count += 1;
    }
    assert_eq!(
        count, header.record_count,
        "the declared records, no more, no fewer"
    );
    if !header.is_log_append_time() {
        assert_eq!(
            max_timestamp, valid.header.max_timestamp,
            "the max timestamp reported"
        );
    }
}

#[cfg(test)]
mod tests {
    /// Every committed seed of the batch fuzz target still holds.
    #[test]
    fn the_fuzz_corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/batch");
        let mut replayed = 0;
        for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/batch") {
            let path = entry.expect("corpus entry").path();
            super::batch(&std::fs::read(&path).expect("read seed"));
            replayed += 1;
        }
        assert!(replayed > 0, "no seeds in {}", dir.display());
    }

    /// Writes the seeds of `fuzz/corpus/batch`: a valid batch in every
    /// codec (snappy raw and xerial-framed), stamped and idempotent ones,
    /// and a few broken ones. Run with `--ignored` to regenerate.
    #[test]
    #[ignore = "writes fuzz/corpus/batch"]
    fn write_seeds() {
        use crate::batch::Compression;
        use crate::batch::tests::{CODECS, TestRecord, compressed_batch_with, stamped, xerial_batch};
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/batch");
        std::fs::create_dir_all(&dir).expect("create the corpus directory");
        let value = b"a value that compresses, a value that compresses".to_vec();
        let records: Vec<TestRecord> = (0..5)
            .map(|i| (1_700_000_000_000 + i, Some(&b"key"[..]), Some(&value[..])))
            .collect();
        let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();
        for codec in CODECS {
            seeds.push((
                format!("{codec:?}"),
                compressed_batch_with(codec, &records, 5).to_vec(),
            ));
            seeds.push((
                format!("{codec:?}-lying-count"),
                compressed_batch_with(codec, &records, 7).to_vec(),
            ));
        }
        seeds.push(("snappy-xerial".to_owned(), xerial_batch(&records).to_vec()));
        seeds.push(("log-append-time".to_owned(), stamped(&records).to_vec()));
        let mut idempotent = compressed_batch_with(Compression::None, &records, 5).to_vec();
        idempotent[43..51].copy_from_slice(&7i64.to_be_bytes());
        idempotent[51..53].copy_from_slice(&1i16.to_be_bytes());
        idempotent[53..57].copy_from_slice(&0i32.to_be_bytes());
        seeds.push(("idempotent".to_owned(), idempotent));
        for (name, seed) in seeds {
            std::fs::write(dir.join(format!("seed-{}", name.to_lowercase())), seed).expect("write seed");
        }
    }
}
