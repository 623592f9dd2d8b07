//! The persisted form of a [`Snapshot`]: a version byte, then the fields
//! in order, strings and byte strings as a u32 length (u32::MAX for none)
//! and their bytes, integers big-endian. Only this module reads or writes
//! it; a snapshot it cannot read is ignored (the group starts afresh).

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::StrBytes;

use super::state::{Snapshot, SnapshotMember};

const VERSION: u8 = 1;
const NONE: u32 = u32::MAX;

pub fn encode(snapshot: &Snapshot) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_u8(VERSION);
    buf.put_i32(snapshot.generation);
    put_str(&mut buf, snapshot.protocol_type.as_deref());
    put_str(&mut buf, snapshot.protocol_name.as_deref());
    put_str(&mut buf, snapshot.leader.as_deref());
    buf.put_u32(snapshot.members.len() as u32);
    for m in &snapshot.members {
        put_str(&mut buf, Some(&m.id));
        put_str(&mut buf, m.instance_id.as_deref());
        put_str(&mut buf, Some(&m.client_id));
        put_str(&mut buf, Some(&m.client_host));
        buf.put_u64(m.session_timeout.as_millis() as u64);
        buf.put_u64(m.rebalance_timeout.as_millis() as u64);
        buf.put_u32(m.protocols.len() as u32);
        for (name, metadata) in &m.protocols {
            put_str(&mut buf, Some(name));
            put_bytes(&mut buf, Some(metadata));
        }
        put_bytes(&mut buf, Some(&m.assignment));
    }
    buf.freeze()
}

pub fn decode(mut buf: Bytes) -> Option<Snapshot> {
    let buf = &mut buf;
    if get_u8(buf)? != VERSION {
        return None;
    }
    let generation = get_i32(buf)?;
    let protocol_type = get_str(buf)?;
    let protocol_name = get_str(buf)?;
    let leader = get_str(buf)?;
    let count = get_u32(buf)?;
    let mut members = Vec::new();
    for _ in 0..count {
        let id = get_str(buf)??;
        let instance_id = get_str(buf)?;
        let client_id = get_str(buf)??;
        let client_host = get_str(buf)??;
        let session_timeout = get_timeout(buf)?;
        let rebalance_timeout = get_timeout(buf)?;
        let protocol_count = get_u32(buf)?;
        let mut protocols = Vec::new();
        for _ in 0..protocol_count {
            let name = get_str(buf)??;
            let metadata = get_bytes(buf)??;
            protocols.push((name, metadata));
        }
        let assignment = get_bytes(buf)??;
        members.push(SnapshotMember {
            id,
            instance_id,
            client_id,
            client_host,
            session_timeout,
            rebalance_timeout,
            protocols,
            assignment,
        });
    }
    buf.is_empty().then_some(Snapshot {
        generation,
        protocol_type,
        protocol_name,
        leader,
        members,
    })
}

fn put_str(buf: &mut BytesMut, s: Option<&str>) {
    put_bytes(buf, s.map(str::as_bytes));
}

fn put_bytes(buf: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            buf.put_u32(b.len() as u32);
            buf.put_slice(b);
        }
        None => buf.put_u32(NONE),
    }
}

/// A timeout in ms; a protocol's timeouts are i32 ms, so anything longer
/// is not a snapshot this module wrote.
fn get_timeout(buf: &mut Bytes) -> Option<Duration> {
    let ms = get_u64(buf)?;
    (ms <= i32::MAX as u64).then(|| Duration::from_millis(ms))
}

fn get_u8(buf: &mut Bytes) -> Option<u8> {
    (buf.remaining() >= 1).then(|| buf.get_u8())
}

fn get_i32(buf: &mut Bytes) -> Option<i32> {
    (buf.remaining() >= 4).then(|| buf.get_i32())
}

fn get_u32(buf: &mut Bytes) -> Option<u32> {
    (buf.remaining() >= 4).then(|| buf.get_u32())
}

fn get_u64(buf: &mut Bytes) -> Option<u64> {
    (buf.remaining() >= 8).then(|| buf.get_u64())
}

/// `None` when truncated; `Some(None)` for an absent value.
fn get_bytes(buf: &mut Bytes) -> Option<Option<Bytes>> {
    let len = get_u32(buf)?;
    if len == NONE {
        return Some(None);
    }
    let len = len as usize;
    (buf.remaining() >= len).then(|| Some(buf.split_to(len)))
}

fn get_str(buf: &mut Bytes) -> Option<Option<StrBytes>> {
    match get_bytes(buf)? {
        None => Some(None),
        Some(bytes) => {
            let s = String::from_utf8(bytes.to_vec()).ok()?;
            Some(Some(StrBytes::from_string(s)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> Snapshot {
        Snapshot {
            generation: 7,
            protocol_type: Some(StrBytes::from_static_str("consumer")),
            protocol_name: Some(StrBytes::from_static_str("range")),
            leader: Some(StrBytes::from_static_str("m-1")),
            members: vec![SnapshotMember {
                id: StrBytes::from_static_str("m-1"),
                instance_id: None,
                client_id: StrBytes::from_static_str("client"),
                client_host: StrBytes::from_static_str("/127.0.0.1"),
                session_timeout: Duration::from_secs(10),
                rebalance_timeout: Duration::from_secs(60),
                protocols: vec![(
                    StrBytes::from_static_str("range"),
                    Bytes::from_static(b"\x00\x01sub"),
                )],
                assignment: Bytes::from_static(b"\x00\x01assigned"),
            }],
        }
    }

    #[test]
    fn a_snapshot_reads_back_as_written() {
        let s = snapshot();
        assert_eq!(decode(encode(&s)), Some(s));
    }

    #[test]
    fn truncated_or_padded_or_unknown_versions_are_refused() {
        let bytes = encode(&snapshot());
        for len in 0..bytes.len() {
            assert_eq!(decode(bytes.slice(..len)), None, "truncated to {len}");
        }
        let mut padded = bytes.to_vec();
        padded.push(0);
        assert_eq!(decode(Bytes::from(padded)), None);
        let mut other = bytes.to_vec();
        other[0] = 2;
        assert_eq!(decode(Bytes::from(other)), None);
    }
}
