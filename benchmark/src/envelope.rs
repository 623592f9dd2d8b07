//! The envelope at the start of every value ketch-bench produces, so a
//! consumer can tell whose record it is, where it belongs in its producer's
//! sequence, when it was sent, and whether its bytes survived (CRC-32C).
//!
//! Layout, big-endian: magic u16 (0x4B42), run id u64, producer id u32,
//! sequence u64, send time u64 (ns since the UNIX epoch), payload length u32
//! (bytes after the envelope), checksum u32 over the fields before it and the
//! payload.

use crc_fast::{CrcAlgorithm, Digest};

pub const MAGIC: u16 = 0x4B42;

/// Bytes the envelope takes at the start of a value.
pub const ENVELOPE_LEN: usize = 38;

/// Where the checksum sits; everything before it is covered.
const CHECKSUM_AT: usize = ENVELOPE_LEN - 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    pub run_id: u64,
    pub producer: u32,
    pub sequence: u64,
    pub send_time_ns: u64,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    #[error("value of {0} bytes is shorter than the {ENVELOPE_LEN}-byte envelope")]
    TooShort(usize),
    #[error("magic {0:#06x} is not {MAGIC:#06x}")]
    BadMagic(u16),
    #[error("envelope declares {declared} payload bytes but {actual} follow")]
    LengthMismatch { declared: u32, actual: usize },
    #[error("checksum {stored:#010x} does not match the computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
}

impl Envelope {
    /// Writes the envelope over the start of `value`, whose tail is the
    /// payload, and seals both with the checksum.
    ///
    /// # Panics
    /// When `value` is shorter than [`ENVELOPE_LEN`]; callers check record sizes up front.
    pub fn stamp(&self, value: &mut [u8]) {
        let payload_len = u32::try_from(value.len() - ENVELOPE_LEN).expect("record size fits u32");
        let head = &mut value[..CHECKSUM_AT];
        head[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        head[2..10].copy_from_slice(&self.run_id.to_be_bytes());
        head[10..14].copy_from_slice(&self.producer.to_be_bytes());
        head[14..22].copy_from_slice(&self.sequence.to_be_bytes());
        head[22..30].copy_from_slice(&self.send_time_ns.to_be_bytes());
        head[30..34].copy_from_slice(&payload_len.to_be_bytes());
        let checksum = checksum(value);
        value[CHECKSUM_AT..ENVELOPE_LEN].copy_from_slice(&checksum.to_be_bytes());
    }

    /// Reads and verifies the envelope at the start of `value`.
    pub fn open(value: &[u8]) -> Result<Envelope, EnvelopeError> {
        if value.len() < ENVELOPE_LEN {
            return Err(EnvelopeError::TooShort(value.len()));
        }
        let magic = u16::from_be_bytes(field(value, 0));
        if magic != MAGIC {
            return Err(EnvelopeError::BadMagic(magic));
        }
        let declared = u32::from_be_bytes(field(value, 30));
        let actual = value.len() - ENVELOPE_LEN;
        if usize::try_from(declared).ok() != Some(actual) {
            return Err(EnvelopeError::LengthMismatch { declared, actual });
        }
        let stored = u32::from_be_bytes(field(value, CHECKSUM_AT));
        let computed = checksum(value);
        if stored != computed {
            return Err(EnvelopeError::Checksum { stored, computed });
        }
        Ok(Envelope {
            run_id: u64::from_be_bytes(field(value, 2)),
            producer: u32::from_be_bytes(field(value, 10)),
            sequence: u64::from_be_bytes(field(value, 14)),
            send_time_ns: u64::from_be_bytes(field(value, 22)),
        })
    }
}

fn field<const N: usize>(value: &[u8], at: usize) -> [u8; N] {
    value[at..at + N].try_into().expect("callers checked the length")
}

fn checksum(value: &[u8]) -> u32 {
    let mut digest = Digest::new(CrcAlgorithm::Crc32Iscsi);
    digest.update(&value[..CHECKSUM_AT]);
    digest.update(&value[ENVELOPE_LEN..]);
    u32::try_from(digest.finalize()).expect("a CRC-32 fits u32")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: Envelope = Envelope {
        run_id: 0x0123_4567_89ab_cdef,
        producer: 3,
        sequence: 42,
        send_time_ns: 1_700_000_000,
    };

    fn stamped(size: usize) -> Vec<u8> {
        let mut value: Vec<u8> = (0..size).map(|i| i as u8).collect();
        SAMPLE.stamp(&mut value);
        value
    }

    #[test]
    fn stamped_values_open_to_the_same_envelope() {
        assert_eq!(Envelope::open(&stamped(1024)), Ok(SAMPLE));
        assert_eq!(Envelope::open(&stamped(ENVELOPE_LEN)), Ok(SAMPLE));
    }

    #[test]
    fn a_flipped_payload_bit_fails_the_checksum() {
        let mut value = stamped(100);
        value[77] ^= 0x10;
        assert!(matches!(
            Envelope::open(&value),
            Err(EnvelopeError::Checksum { .. })
        ));
    }

    #[test]
    fn a_changed_sequence_fails_the_checksum() {
        let mut value = stamped(100);
        value[21] ^= 1;
        assert!(matches!(
            Envelope::open(&value),
            Err(EnvelopeError::Checksum { .. })
        ));
    }

    #[test]
    fn truncated_and_foreign_values_are_rejected() {
        let value = stamped(100);
        assert_eq!(Envelope::open(&value[..10]), Err(EnvelopeError::TooShort(10)));
        assert_eq!(
            Envelope::open(&value[..99]),
            Err(EnvelopeError::LengthMismatch {
                declared: 62,
                actual: 61
            })
        );
        assert_eq!(Envelope::open(&[0u8; 64]), Err(EnvelopeError::BadMagic(0)));
    }
}
