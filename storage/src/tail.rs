//! The batches this gateway appended last to a partition that fetches here
//! are tailing, kept so the next fetch is answered without reading Redis.
//!
//! A tailing consumer's fetch asks for the batch the producer's append just
//! stored, usually through the same gateway: the partition's leader. Reading
//! it back costs a round trip to Redis, an `XRANGE` and an `HMGET` there,
//! and a wake-up of the connection's task; at one record per produce request
//! that is about a third of what Redis spends per record. Instead, the
//! append keeps a copy of the batch (its offsets patched in, as a read from
//! Redis patches them) in its partition's [`Tail`], and the fetch finds it
//! there.
//!
//! A tail lives in the wake-up hub's channel of its partition (`wake.rs`),
//! and only while that channel is subscribed: what the hub knows of the
//! partition's offsets (every append anywhere announces its next offset,
//! every DeleteRecords and retention step its log start) is what makes a
//! cached batch safe to serve, and a lapsed subscription forgets both.
//!
//! A tail holds one run of contiguous offsets, all batches appended through
//! this gateway and none transactional: a batch that does not follow the
//! last one (another gateway appended between, a transaction marker, a
//! transactional batch) starts the run again. So a fetch served from the
//! tail gets exactly the batches a read from Redis would return, only
//! perhaps fewer of them (the read stops where the run does).
//!
//! Memory: batches of at most [`TAIL_BATCH_BYTES`], at most
//! [`TAIL_PARTITION_BYTES`] per partition, none older than [`TAIL_AGE`]
//! once the partition's next batch arrives, and at most the hub's budget
//! (`fetch.tail_cache_bytes`) over all partitions.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Largest batch a tail keeps: larger batches cost Redis little per byte
/// to read back, and a tailing consumer is rarely fed them.
pub const TAIL_BATCH_BYTES: usize = 256 * 1024;

/// Most bytes one partition's tail keeps.
pub const TAIL_PARTITION_BYTES: usize = 1024 * 1024;

/// A tail's batches older than this go when the next one comes: a tailing
/// consumer fetches within milliseconds of an append.
pub const TAIL_AGE: Duration = Duration::from_secs(1);

/// One partition's run of cached batches.
#[derive(Debug, Default)]
pub(crate) struct Tail {
    batches: VecDeque<Cached>,
    bytes: usize,
}

#[derive(Debug)]
struct Cached {
    base: i64,
    /// Last offset, inclusive.
    last: i64,
    batch: Bytes,
    at: Instant,
}

impl Tail {
    /// The bytes the tail holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adds the batch at `base..=last` (its offsets patched in) appended at
    /// `now`, if it follows the run (else the run starts again with it) and
    /// fits: `spare` is what the hub's budget has left, and the tail's own
    /// bytes count toward it. Returns how far the tail's bytes changed.
    pub(crate) fn push(&mut self, base: i64, last: i64, batch: Bytes, now: Instant, spare: usize) -> isize {
        let before = self.bytes as isize;
        if self.batches.back().is_some_and(|b| b.last + 1 != base) {
            self.clear();
        }
        let room = spare.saturating_add(self.bytes).min(TAIL_PARTITION_BYTES);
        if batch.len() > TAIL_BATCH_BYTES || batch.len() > room {
            // Not kept: the run cannot go on past it.
            self.clear();
            return self.bytes as isize - before;
        }
        while let Some(front) = self.batches.front() {
            let old = now.saturating_duration_since(front.at) > TAIL_AGE;
            if !old && self.bytes + batch.len() <= room {
                break;
            }
            self.bytes -= front.batch.len();
            self.batches.pop_front();
        }
        self.bytes += batch.len();
        self.batches.push_back(Cached {
            base,
            last,
            batch,
            at: now,
        });
        self.bytes as isize - before
    }

    /// Empties the tail.
    pub(crate) fn clear(&mut self) {
        self.batches.clear();
        self.bytes = 0;
    }

    /// The batches from the one holding `offset` on, while they end below
    /// `end` (exclusive), until `max_bytes` are gathered (the batch that
    /// crosses it included, as a read from Redis includes it; none when
    /// `max_bytes` is 0). `None` when no batch holds `offset` or that one
    /// does not end below `end`.
    pub(crate) fn read(&self, offset: i64, end: i64, max_bytes: usize) -> Option<Vec<Bytes>> {
        let first = self.batches.partition_point(|b| b.last < offset);
        let holder = self.batches.get(first)?;
        if holder.base > offset || holder.last >= end {
            return None;
        }
        let mut out = Vec::new();
        let mut bytes = 0;
        for cached in self.batches.range(first..) {
            if bytes >= max_bytes || cached.last >= end {
                break;
            }
            bytes += cached.batch.len();
            out.push(cached.batch.clone());
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(len: usize) -> Bytes {
        Bytes::from(vec![7u8; len])
    }

    #[test]
    fn a_run_is_contiguous_and_starts_again_at_a_gap() {
        let now = Instant::now();
        let mut tail = Tail::default();
        assert_eq!(tail.push(0, 4, batch(10), now, usize::MAX), 10);
        assert_eq!(tail.push(5, 5, batch(20), now, usize::MAX), 20);
        assert_eq!(tail.read(0, i64::MAX, usize::MAX).map(|b| b.len()), Some(2));
        assert_eq!(tail.read(3, i64::MAX, usize::MAX).map(|b| b.len()), Some(2));
        assert_eq!(tail.read(5, i64::MAX, usize::MAX).map(|b| b.len()), Some(1));
        assert_eq!(tail.read(6, i64::MAX, usize::MAX), None);
        // Offsets 6–7 went elsewhere (another gateway, a marker).
        assert_eq!(tail.push(8, 9, batch(5), now, usize::MAX), -25);
        assert_eq!(tail.read(0, i64::MAX, usize::MAX), None);
        assert_eq!(tail.read(8, i64::MAX, usize::MAX).map(|b| b.len()), Some(1));
        assert_eq!(tail.bytes(), 5);
    }

    #[test]
    fn a_read_stops_at_its_bytes_and_below_its_end() {
        let now = Instant::now();
        let mut tail = Tail::default();
        for i in 0..4 {
            tail.push(i * 10, i * 10 + 9, batch(100), now, usize::MAX);
        }
        // The batch that crosses the limit is included, as from Redis.
        assert_eq!(tail.read(0, i64::MAX, 150).map(|b| b.len()), Some(2));
        assert_eq!(tail.read(0, i64::MAX, 0).map(|b| b.len()), Some(0));
        // read_committed: only batches wholly below the last stable offset.
        assert_eq!(tail.read(0, 30, usize::MAX).map(|b| b.len()), Some(3));
        assert_eq!(tail.read(0, 29, usize::MAX).map(|b| b.len()), Some(2));
        assert_eq!(tail.read(20, 29, usize::MAX), None);
    }

    #[test]
    fn a_tail_keeps_within_its_limits() {
        let now = Instant::now();
        let mut tail = Tail::default();
        // Too large for any tail: not kept, and the run starts again.
        tail.push(0, 0, batch(100), now, usize::MAX);
        assert_eq!(
            tail.push(1, 1, batch(TAIL_BATCH_BYTES + 1), now, usize::MAX),
            -100
        );
        assert_eq!(tail.read(0, i64::MAX, usize::MAX), None);
        // The partition's share: the oldest batches make room.
        let size = TAIL_PARTITION_BYTES / 4;
        for i in 0..6 {
            tail.push(2 + i, 2 + i, batch(size), now, usize::MAX);
        }
        assert_eq!(tail.bytes(), TAIL_PARTITION_BYTES);
        assert_eq!(tail.read(3, i64::MAX, usize::MAX), None);
        assert_eq!(tail.read(4, i64::MAX, usize::MAX).map(|b| b.len()), Some(4));
        // The hub's budget: what is spare plus what the tail holds.
        let mut tail = Tail::default();
        tail.push(0, 0, batch(300), now, 1000);
        tail.push(1, 1, batch(300), now, 700);
        assert_eq!(tail.push(2, 2, batch(300), now, 100), 0);
        assert_eq!(tail.read(1, i64::MAX, usize::MAX).map(|b| b.len()), Some(2));
        // Nothing spare, nothing held: not kept.
        assert_eq!(Tail::default().push(0, 0, batch(1), now, 0), 0);
        // Batches older than TAIL_AGE go when the next comes.
        let mut tail = Tail::default();
        tail.push(0, 0, batch(10), now, usize::MAX);
        tail.push(1, 1, batch(10), now + TAIL_AGE / 2, usize::MAX);
        tail.push(
            2,
            2,
            batch(10),
            now + TAIL_AGE + Duration::from_millis(1),
            usize::MAX,
        );
        assert_eq!(tail.read(0, i64::MAX, usize::MAX), None);
        assert_eq!(tail.read(1, i64::MAX, usize::MAX).map(|b| b.len()), Some(2));
    }
}
