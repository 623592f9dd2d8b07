//! Gateway membership (DESIGN §6): heartbeats into `ketch:brokers`, the
//! live gateways Metadata lists, and rendezvous hashing over them to choose
//! each partition's leader and each group's coordinator, so the load is
//! balanced and moves only when membership changes.
//!
//! Any gateway still serves produce and fetch for any partition (storage is
//! shared); leadership only spreads clients over gateways. Group
//! coordination does depend on it: a gateway answers group requests only
//! for the groups it coordinates (NOT_COORDINATOR otherwise).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ketch_storage::{BrokerRecord, Store};
use tokio::sync::watch;

use crate::Node;

/// The live gateways as this one last saw them.
#[derive(Clone)]
pub struct Membership {
    me: Node,
    live: Arc<RwLock<Vec<Node>>>,
    /// A heartbeat of this gateway reached Redis.
    joined: Arc<AtomicBool>,
}

impl Membership {
    /// Membership with only this gateway, until the first refresh.
    pub fn new(me: Node) -> Self {
        Self {
            live: Arc::new(RwLock::new(vec![me.clone()])),
            joined: Arc::new(AtomicBool::new(false)),
            me,
        }
    }

    /// Whether this gateway has registered in Redis (part of `/ready`).
    pub fn joined(&self) -> bool {
        self.joined.load(Ordering::Relaxed)
    }

    /// The live gateways, by node id; always includes this one.
    pub fn nodes(&self) -> Vec<Node> {
        self.live.read().expect("membership lock").clone()
    }

    /// The gateway that leads a partition.
    pub fn partition_leader(&self, topic_id: &uuid::Uuid, partition: i32) -> Node {
        let mut key = topic_id.as_bytes().to_vec();
        key.extend_from_slice(&partition.to_be_bytes());
        self.owner(&key)
    }

    /// The gateway that coordinates a group.
    pub fn group_coordinator(&self, group: &str) -> Node {
        let mut key = b"group:".to_vec();
        key.extend_from_slice(group.as_bytes());
        self.owner(&key)
    }

    /// Whether this gateway coordinates `group`.
    pub fn coordinates(&self, group: &str) -> bool {
        self.group_coordinator(group).id == self.me.id
    }

    /// Rendezvous (highest random weight) hashing: every gateway computes
    /// the same owner from the same live set.
    fn owner(&self, key: &[u8]) -> Node {
        let live = self.live.read().expect("membership lock");
        live.iter()
            .max_by_key(|node| (weight(node.id, key), node.id))
            .cloned()
            .unwrap_or_else(|| self.me.clone())
    }

    fn set_live(&self, mut nodes: Vec<Node>) {
        if !nodes.iter().any(|n| n.id == self.me.id) {
            nodes.push(self.me.clone());
            nodes.sort_by_key(|n| n.id);
        }
        let mut live = self.live.write().expect("membership lock");
        if *live != nodes {
            tracing::info!(nodes = ?nodes.iter().map(|n| n.id).collect::<Vec<_>>(), "live gateways changed");
            *live = nodes;
        }
    }

    /// Heartbeats and refreshes the live set until `shutdown`, then
    /// deregisters this gateway.
    pub async fn run(
        self,
        store: Store,
        heartbeat_interval: Duration,
        node_timeout: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let instance = uuid::Uuid::new_v4().to_string();
        let record = BrokerRecord {
            node_id: self.me.id,
            host: self.me.host.clone(),
            port: self.me.port,
            rack: None,
        };
        let mut ticks = tokio::time::interval(heartbeat_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
            match store.heartbeat(&record, &instance, node_timeout).await {
                Ok(beat) => {
                    self.joined.store(true, Ordering::Relaxed);
                    if let Some(other) = beat.conflicting_instance {
                        tracing::error!(node_id = self.me.id, other_instance = %other,
                            "another live gateway uses this node id; give each gateway its own broker.id");
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "heartbeat failed");
                    continue;
                }
            }
            match store.live_brokers(node_timeout).await {
                Ok(brokers) => self.set_live(brokers.into_iter().map(node).collect()),
                Err(e) => tracing::debug!(error = %e, "cannot read live gateways"),
            }
        }
        if let Err(e) = store.deregister(self.me.id).await {
            tracing::debug!(error = %e, "cannot deregister");
        }
    }
}

fn node(record: BrokerRecord) -> Node {
    Node {
        id: record.node_id,
        host: record.host,
        port: record.port,
    }
}

/// A stable 64-bit hash of (node, key): FNV-1a, then a murmur3 finalizer
/// for avalanche. Stable across builds and platforms, so gateways of
/// different versions agree.
fn weight(node_id: i32, key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node_id.to_be_bytes().iter().chain(key) {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: i32) -> Node {
        Node {
            id,
            host: "h".into(),
            port: 9092,
        }
    }

    fn membership(ids: &[i32]) -> Membership {
        let m = Membership::new(node(ids[0]));
        m.set_live(ids.iter().map(|&id| node(id)).collect());
        m
    }

    #[test]
    fn every_gateway_computes_the_same_owner() {
        let a = membership(&[1, 2, 3]);
        let b = membership(&[3, 1, 2]);
        for g in 0..100 {
            let group = format!("g{g}");
            assert_eq!(a.group_coordinator(&group).id, b.group_coordinator(&group).id);
        }
    }

    #[test]
    fn ownership_is_balanced_and_moves_only_from_a_dead_node() {
        let three = membership(&[1, 2, 3]);
        let topic = uuid::Uuid::from_u128(42);
        let mut counts = [0usize; 4];
        for p in 0..300 {
            counts[three.partition_leader(&topic, p).id as usize] += 1;
        }
        for (id, count) in counts.iter().enumerate().skip(1) {
            assert!((60..=140).contains(count), "node {id} leads {count} of 300");
        }
        let two = membership(&[1, 3]);
        for p in 0..300 {
            let before = three.partition_leader(&topic, p).id;
            let after = two.partition_leader(&topic, p).id;
            if before != 2 {
                assert_eq!(before, after, "partition {p} moved though its leader lives");
            }
        }
    }

    #[test]
    fn this_gateway_is_always_live() {
        let m = Membership::new(node(7));
        m.set_live(vec![node(1)]);
        assert_eq!(m.nodes().iter().map(|n| n.id).collect::<Vec<_>>(), vec![1, 7]);
    }
}
