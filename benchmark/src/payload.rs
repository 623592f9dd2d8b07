//! Record values: all zeros, slices at pseudo-random offsets of a seeded
//! random pool (compression sees data that does not shrink), or of a seeded
//! pool of text-like words (compressible about as log lines and JSON are,
//! 3-4x with lz4 or zstd). Two runs with one seed send the same bytes.

use clap::ValueEnum;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;

/// The default `--seed`.
pub const DEFAULT_SEED: u64 = 0x6b65_7463_685f_6231;

/// Size of the random pool record values are sliced from.
const POOL_LEN: usize = 4 << 20;

#[derive(ValueEnum, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PayloadKind {
    Zeros,
    Random,
    Text,
}

/// Words in the text pool's vocabulary.
const VOCABULARY: usize = 512;

/// The bytes record values are taken from.
pub struct PayloadPool {
    bytes: Vec<u8>,
    record_size: usize,
    seed: u64,
}

impl PayloadPool {
    pub fn new(kind: PayloadKind, record_size: usize, seed: u64) -> Self {
        let bytes = match kind {
            PayloadKind::Zeros => vec![0; record_size],
            PayloadKind::Random => {
                let mut bytes = vec![0; POOL_LEN.max(2 * record_size)];
                StdRng::seed_from_u64(seed).fill_bytes(&mut bytes);
                bytes
            }
            PayloadKind::Text => text_pool(POOL_LEN.max(2 * record_size), seed),
        };
        PayloadPool {
            bytes,
            record_size,
            seed,
        }
    }

    /// A deterministic sequence of values for one client; `stream` tells clients apart.
    pub fn picker(&self, stream: u64) -> PayloadPicker<'_> {
        let rng = StdRng::seed_from_u64(self.seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        PayloadPicker { pool: self, rng }
    }
}

/// `len` bytes of words from a seeded vocabulary of lower-case words of 2 to
/// 9 letters, separated by spaces, with a number now and then.
fn text_pool(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let words: Vec<Vec<u8>> = (0..VOCABULARY)
        .map(|_| {
            let letters = rng.random_range(2..10);
            (0..letters).map(|_| rng.random_range(b'a'..=b'z')).collect()
        })
        .collect();
    let mut bytes = Vec::with_capacity(len + 16);
    while bytes.len() < len {
        if rng.random_range(0..8) == 0 {
            bytes.extend_from_slice(rng.random_range(0..100_000u32).to_string().as_bytes());
        } else {
            bytes.extend_from_slice(&words[rng.random_range(0..VOCABULARY)]);
        }
        bytes.push(b' ');
    }
    bytes.truncate(len);
    bytes
}

/// Hands out record values from a [`PayloadPool`].
pub struct PayloadPicker<'a> {
    pool: &'a PayloadPool,
    rng: StdRng,
}

impl<'a> PayloadPicker<'a> {
    pub fn next_value(&mut self) -> &'a [u8] {
        let last_offset = self.pool.bytes.len() - self.pool.record_size;
        let offset = if last_offset == 0 {
            0
        } else {
            self.rng.random_range(0..=last_offset)
        };
        &self.pool.bytes[offset..offset + self.pool.record_size]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pool: &PayloadPool, stream: u64, count: usize) -> Vec<Vec<u8>> {
        let mut picker = pool.picker(stream);
        (0..count).map(|_| picker.next_value().to_vec()).collect()
    }

    #[test]
    fn one_seed_gives_the_same_values() {
        let a = PayloadPool::new(PayloadKind::Random, 1024, 7);
        let b = PayloadPool::new(PayloadKind::Random, 1024, 7);
        assert_eq!(values(&a, 3, 10), values(&b, 3, 10));
    }

    #[test]
    fn other_seeds_and_streams_give_other_values() {
        let a = PayloadPool::new(PayloadKind::Random, 1024, 7);
        let b = PayloadPool::new(PayloadKind::Random, 1024, 8);
        assert_ne!(values(&a, 0, 4), values(&b, 0, 4));
        assert_ne!(values(&a, 0, 4), values(&a, 1, 4));
    }

    #[test]
    fn values_have_the_record_size() {
        let pool = PayloadPool::new(PayloadKind::Random, 100, 1);
        assert!(values(&pool, 0, 50).iter().all(|v| v.len() == 100));
    }

    #[test]
    fn text_compresses_but_not_to_nothing() {
        let pool = PayloadPool::new(PayloadKind::Text, 1024, 3);
        let sample: Vec<u8> = values(&pool, 0, 64).concat();
        assert!(
            sample
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b' ')
        );
        let distinct: std::collections::HashSet<&[u8]> = sample.split(|b| *b == b' ').collect();
        assert!(distinct.len() > 100 && distinct.len() < sample.len() / 4);
    }

    #[test]
    fn zeros_are_zero() {
        let pool = PayloadPool::new(PayloadKind::Zeros, 64, 1);
        assert_eq!(values(&pool, 0, 2), vec![vec![0u8; 64]; 2]);
    }
}
