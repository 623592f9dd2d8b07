//! Producer ids for idempotent producers (InitProducerId): a counter,
//! `ketch:producer-ids`, shared by every gateway. The state each partition
//! keeps per producer is checked by the append script; what
//! DescribeProducers reports of it is decoded here, from either of its
//! encodings (`scripts/producer_state.lua`).

use crate::{Result, Store};

impl Store {
    /// A producer id no other producer of this Redis has had: the later of
    /// the counter's next value and Redis's clock in ms
    /// (`scripts/producer_id.lua`), so a counter taken back by a failover
    /// or a crash does not hand a live id out again. With acks=all waiting
    /// for replicas (or fsync), the step is as durable as an acks=all
    /// batch before the id is handed out: in a cluster the counter's master
    /// is not the partitions', so no append's `WAIT` covers it. Handed out
    /// even when the counter's master is full (allow-oom).
    pub async fn new_producer_id(&self) -> Result<i64> {
        let key = format!("{}:producer-ids", self.keys.namespace());
        let invocation = self.scripts.producer_id.key(&key);
        let id: i64 = self.invoke_durably(&key, &invocation, |_| true).await?;
        // Ids start at 1000, clear of the small ids tests like to hard-code
        // (a counter older releases started from 1).
        Ok(id + 999)
    }
}

/// What DescribeProducers reports of a producer's state in a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerSummary {
    pub epoch: i32,
    /// The last sequence of the producer's last batch here (-1: none).
    pub last_sequence: i32,
    /// Its last append here, ms (-1: unknown).
    pub last_timestamp: i64,
    /// The first offset of its open transaction's data here (-1: none).
    pub txn_start: i64,
}

/// Decodes a stored producer state, JSON or compact; `None` when it is
/// neither.
pub fn decode_producer_state(raw: &[u8]) -> Option<ProducerSummary> {
    if raw.first() == Some(&b'{') {
        return decode_json(raw);
    }
    let mut r = Reader(raw);
    if r.u8()? != 1 {
        return None;
    }
    let flags = r.u8()?;
    let epoch = r.i32()?;
    let last_timestamp = r.i64()?;
    let mut txn_start = -1;
    if flags & 1 != 0 {
        let (_number, _epoch) = (r.i64()?, r.i32()?);
        if flags & 2 != 0 {
            txn_start = r.i64()?;
        }
    }
    if flags & 4 != 0 {
        r.i64()?;
    }
    let mut last_sequence = -1;
    for _ in 0..r.u8()? {
        let (_first, last, _base) = (r.i32()?, r.i32()?, r.i64()?);
        last_sequence = last;
    }
    r.0.is_empty().then_some(ProducerSummary {
        epoch,
        last_sequence,
        last_timestamp,
        txn_start,
    })
}

fn decode_json(raw: &[u8]) -> Option<ProducerSummary> {
    let state: serde_json::Value = serde_json::from_slice(raw).ok()?;
    let int = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_i64);
    Some(ProducerSummary {
        epoch: i32::try_from(int(state.get("e"))?).ok()?,
        last_sequence: int(state
            .get("b")
            .and_then(|b| b.as_array())
            .and_then(|b| b.last())
            .and_then(|last| last.get(1)))
        .and_then(|s| i32::try_from(s).ok())
        .unwrap_or(-1),
        last_timestamp: int(state.get("t")).unwrap_or(-1),
        txn_start: int(state.get("x").and_then(|x| x.get("f"))).unwrap_or(-1),
    })
}

/// Big-endian fields off the front of a slice.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[b]| b)
    }
    fn i32(&mut self) -> Option<i32> {
        self.take().map(i32::from_be_bytes)
    }
    fn i64(&mut self) -> Option<i64> {
        self.take().map(i64::from_be_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compact_state_decodes_as_its_json_does() {
        let json = br#"{"e":3,"t":1700000000123,"b":[[0,4,10],[5,9,15]],"x":{"n":7,"e":3,"f":12},"l":6}"#;
        let mut compact = vec![1u8, 1 | 2 | 4];
        compact.extend_from_slice(&3i32.to_be_bytes());
        compact.extend_from_slice(&1_700_000_000_123i64.to_be_bytes());
        compact.extend_from_slice(&7i64.to_be_bytes());
        compact.extend_from_slice(&3i32.to_be_bytes());
        compact.extend_from_slice(&12i64.to_be_bytes());
        compact.extend_from_slice(&6i64.to_be_bytes());
        compact.push(2);
        for (first, last, base) in [(0i32, 4i32, 10i64), (5, 9, 15)] {
            compact.extend_from_slice(&first.to_be_bytes());
            compact.extend_from_slice(&last.to_be_bytes());
            compact.extend_from_slice(&base.to_be_bytes());
        }
        let expected = ProducerSummary {
            epoch: 3,
            last_sequence: 9,
            last_timestamp: 1_700_000_000_123,
            txn_start: 12,
        };
        assert_eq!(decode_producer_state(json), Some(expected));
        assert_eq!(decode_producer_state(&compact), Some(expected));
        // Truncated, trailing bytes, or an unknown encoding: not a state.
        assert_eq!(decode_producer_state(&compact[..compact.len() - 1]), None);
        compact.push(0);
        assert_eq!(decode_producer_state(&compact), None);
        compact.pop();
        compact[0] = 2;
        assert_eq!(decode_producer_state(&compact), None);
    }
}
