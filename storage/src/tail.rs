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
//! [`TAIL_PARTITION_BYTES`] per partition, and at most the hub's budget
//! (`fetch.tail_cache_bytes`) over all partitions. The hub's [`Order`]
//! numbers every batch kept, in every tail, in the order they were kept:
//! when the budget is short the oldest batches go first, whichever
//! partitions they are in, and a batch older than [`TAIL_AGE`] goes at the
//! next batch kept anywhere (or the hub's next sweep). So a partition whose
//! appends stopped, or whose consumers left (its channel stays subscribed
//! for `fetch.subscription_linger`), does not hold the budget that the
//! partitions being tailed now need.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Largest batch a tail keeps: larger batches cost Redis little per byte
/// to read back, and a tailing consumer is rarely fed them.
pub const TAIL_BATCH_BYTES: usize = 256 * 1024;

/// Most bytes one partition's tail keeps.
pub const TAIL_PARTITION_BYTES: usize = 1024 * 1024;

/// Batches kept longer than this go: a tailing consumer fetches within
/// milliseconds of an append.
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
    /// Its number in the hub's [`Order`].
    seq: u64,
}

impl Tail {
    /// The bytes the tail holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adds the batch at `base..=last` (its offsets patched in), numbered
    /// `seq` in the hub's [`Order`], if it follows the run (else the run
    /// starts again with it) and is at most [`TAIL_BATCH_BYTES`]; the
    /// tail's oldest batches make room within [`TAIL_PARTITION_BYTES`].
    /// Returns how far the tail's bytes changed.
    pub(crate) fn push(&mut self, base: i64, last: i64, batch: Bytes, seq: u64) -> isize {
        let before = self.bytes as isize;
        if self.batches.back().is_some_and(|b| b.last + 1 != base) {
            self.clear();
        }
        if batch.len() > TAIL_BATCH_BYTES {
            // Not kept: the run cannot go on past it.
            self.clear();
            return self.bytes as isize - before;
        }
        while self.bytes + batch.len() > TAIL_PARTITION_BYTES {
            let Some(front) = self.batches.pop_front() else {
                break;
            };
            self.bytes -= front.batch.len();
        }
        self.bytes += batch.len();
        self.batches.push_back(Cached {
            base,
            last,
            batch,
            seq,
        });
        self.bytes as isize - before
    }

    /// Drops the tail's oldest batch if it is the one numbered `seq`;
    /// returns the bytes freed.
    pub(crate) fn pop_front_if(&mut self, seq: u64) -> usize {
        if self.batches.front().is_none_or(|b| b.seq != seq) {
            return 0;
        }
        let front = self.batches.pop_front().expect("checked above");
        self.bytes -= front.batch.len();
        front.batch.len()
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

/// Every batch the hub's tails keep, numbered in the order kept. An entry
/// outlives its batch when the tail dropped it on its own (a new run, its
/// partition's limit, a lapsed subscription); it is passed over when it
/// comes first. Since every batch numbered lower than the first entry is
/// gone, a batch still kept is the front of its tail when its entry comes
/// first, which is what [`Tail::pop_front_if`] checks.
#[derive(Debug, Default)]
pub(crate) struct Order {
    kept: VecDeque<Kept>,
    next_seq: u64,
}

/// One batch kept in the tail of `channel`'s partition.
#[derive(Debug)]
pub(crate) struct Kept {
    pub(crate) channel: Arc<str>,
    pub(crate) seq: u64,
    at: Instant,
}

impl Order {
    /// Numbers a batch kept in `channel`'s tail at `now`.
    pub(crate) fn keep(&mut self, channel: Arc<str>, now: Instant) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.kept.push_back(Kept {
            channel,
            seq,
            at: now,
        });
        seq
    }

    /// Takes the oldest entry if it is older than [`TAIL_AGE`] at `now`, or
    /// whatever its age when the budget is `short`.
    pub(crate) fn pop_oldest(&mut self, now: Instant, short: bool) -> Option<Kept> {
        let front = self.kept.front()?;
        if short || now.saturating_duration_since(front.at) > TAIL_AGE {
            self.kept.pop_front()
        } else {
            None
        }
    }

    /// Forgets every entry (every tail was emptied).
    pub(crate) fn clear(&mut self) {
        self.kept.clear();
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
        let mut tail = Tail::default();
        assert_eq!(tail.push(0, 4, batch(10), 0), 10);
        assert_eq!(tail.push(5, 5, batch(20), 1), 20);
        assert_eq!(tail.read(0, i64::MAX, usize::MAX).map(|b| b.len()), Some(2));
        assert_eq!(tail.read(3, i64::MAX, usize::MAX).map(|b| b.len()), Some(2));
        assert_eq!(tail.read(5, i64::MAX, usize::MAX).map(|b| b.len()), Some(1));
        assert_eq!(tail.read(6, i64::MAX, usize::MAX), None);
        // Offsets 6–7 went elsewhere (another gateway, a marker).
        assert_eq!(tail.push(8, 9, batch(5), 2), -25);
        assert_eq!(tail.read(0, i64::MAX, usize::MAX), None);
        assert_eq!(tail.read(8, i64::MAX, usize::MAX).map(|b| b.len()), Some(1));
        assert_eq!(tail.bytes(), 5);
    }

    #[test]
    fn a_read_stops_at_its_bytes_and_below_its_end() {
        let mut tail = Tail::default();
        for i in 0..4 {
            tail.push(i * 10, i * 10 + 9, batch(100), i as u64);
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
        let mut tail = Tail::default();
        // Too large for any tail: not kept, and the run starts again.
        tail.push(0, 0, batch(100), 0);
        assert_eq!(tail.push(1, 1, batch(TAIL_BATCH_BYTES + 1), 1), -100);
        assert_eq!(tail.read(0, i64::MAX, usize::MAX), None);
        // The partition's share: the oldest batches make room.
        let size = TAIL_PARTITION_BYTES / 4;
        for i in 0..6 {
            tail.push(2 + i, 2 + i, batch(size), 2 + i as u64);
        }
        assert_eq!(tail.bytes(), TAIL_PARTITION_BYTES);
        assert_eq!(tail.read(3, i64::MAX, usize::MAX), None);
        assert_eq!(tail.read(4, i64::MAX, usize::MAX).map(|b| b.len()), Some(4));
    }

    #[test]
    fn only_the_oldest_batch_of_a_tail_is_dropped_by_its_number() {
        let mut tail = Tail::default();
        tail.push(0, 0, batch(10), 4);
        tail.push(1, 1, batch(20), 9);
        assert_eq!(tail.pop_front_if(9), 0, "not the oldest");
        assert_eq!(tail.pop_front_if(3), 0, "gone already");
        assert_eq!(tail.pop_front_if(4), 10);
        assert_eq!(tail.read(0, i64::MAX, usize::MAX), None);
        assert_eq!(tail.read(1, i64::MAX, usize::MAX).map(|b| b.len()), Some(1));
        assert_eq!(tail.pop_front_if(9), 20);
        assert_eq!(tail.bytes(), 0);
        assert_eq!(tail.pop_front_if(9), 0);
    }

    #[test]
    fn the_order_gives_up_its_oldest_when_short_or_old() {
        let now = Instant::now();
        let mut order = Order::default();
        let a: Arc<str> = Arc::from("a");
        assert_eq!(order.keep(a.clone(), now), 0);
        assert_eq!(order.keep(Arc::from("b"), now + TAIL_AGE / 2), 1);
        assert!(
            order.pop_oldest(now + TAIL_AGE, false).is_none(),
            "young, room enough"
        );
        let oldest = order.pop_oldest(now + TAIL_AGE, true).expect("short of room");
        assert_eq!((&*oldest.channel, oldest.seq), ("a", 0));
        let later = now + TAIL_AGE / 2 + TAIL_AGE + Duration::from_millis(1);
        let old = order.pop_oldest(later, false).expect("older than TAIL_AGE");
        assert_eq!((&*old.channel, old.seq), ("b", 1));
        assert!(order.pop_oldest(later, true).is_none(), "empty");
    }
}
