//! The broker registry (DESIGN §6): `ketch:brokers`, a hash of node id →
//! JSON {instance, host, port, rack, internal_host, internal_port, hostname,
//! by_address, listeners, layout, heartbeat_ms}. An entry is a lease on its node id: each gateway refreshes
//! its own every `cluster.heartbeat_interval`, stamped with Redis's clock,
//! and an entry older than `cluster.node_timeout` is a dead gateway whose id
//! is free again. A gateway without a configured id claims the lowest free
//! one (`scripts/heartbeat.lua`), so two gateways never hold one id.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Result, Store};

/// A gateway as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRecord {
    #[serde(skip)]
    pub node_id: i32,
    /// The address clients are told to connect to.
    pub host: String,
    pub port: u16,
    #[serde(default)]
    pub rack: Option<String>,
    /// Where other gateways forward requests to this one (absent for
    /// gateways from before forwarding).
    #[serde(default)]
    pub internal_host: Option<String>,
    #[serde(default)]
    pub internal_port: Option<u16>,
    /// The machine's host name, for messages about who holds an id.
    #[serde(default)]
    pub hostname: Option<String>,
    /// Clients see the gateway under an id derived from its advertised
    /// address (a claimed node id behind an address it does not listen on).
    #[serde(default)]
    pub by_address: bool,
    /// Every Kafka listener's advertised address (absent for gateways from
    /// before named listeners: `host` and `port` are then their only one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<ListenerRecord>,
    /// The newest Redis layout the gateway serves (layout.rs); absent (0)
    /// for gateways from before layout 3.
    #[serde(default)]
    pub layout: u32,
    /// The process (a UUID per start).
    #[serde(default, skip_serializing)]
    pub instance: String,
    #[serde(default, skip_serializing)]
    pub heartbeat_ms: i64,
}

/// One Kafka listener of a gateway, as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerRecord {
    pub name: String,
    pub host: String,
    pub port: u16,
    /// As [`BrokerRecord::by_address`], for this listener.
    #[serde(default)]
    pub by_address: bool,
}

/// What registering under a node id found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// The entry is this process's; the node id is held until the entry
    /// is not refreshed for `node_timeout`.
    Registered { node_id: i32 },
    /// Another live process holds the node id; nothing was written.
    Held {
        holder: BrokerRecord,
        /// How long ago (Redis's clock) the holder last refreshed its entry.
        heartbeat_age: Duration,
    },
    /// Every id up to the largest claimable one is held.
    NoFreeId,
}

impl Store {
    pub(crate) fn brokers_key(&self) -> String {
        format!("{}:brokers", self.keys.namespace())
    }

    /// The channel a gateway's joining or leaving the registry is announced
    /// on: its hash tag is the registry key's whole name, so the two share a
    /// slot in Redis Cluster (the scripts publish it).
    pub fn brokers_channel(&self) -> String {
        format!("{{{}}}:changed", self.brokers_key())
    }

    /// Registers or refreshes this gateway's entry under `node_id`, or
    /// under the lowest id no live gateway holds when `node_id` is `None`
    /// (at most `max_node_id`). Never takes an id another live process
    /// holds.
    pub async fn register(
        &self,
        node_id: Option<i32>,
        me: &BrokerRecord,
        instance: &str,
        node_timeout: Duration,
        max_node_id: i32,
    ) -> Result<Registration> {
        let entry = serde_json::to_string(me).expect("a broker record serializes");
        let (status, id, now, holder): (i64, i32, i64, String) = self
            .scripts
            .heartbeat
            .key(self.brokers_key())
            .arg(node_id.unwrap_or(-1))
            .arg(instance)
            .arg(entry)
            .arg(node_timeout.as_millis() as u64)
            .arg(max_node_id)
            .arg(self.brokers_channel())
            .invoke_async(&mut self.conn())
            .await?;
        Ok(match status {
            1 => Registration::Registered { node_id: id },
            0 => {
                let holder = decode_record(id, &holder).unwrap_or_else(|| BrokerRecord {
                    node_id: id,
                    host: String::new(),
                    port: 0,
                    rack: None,
                    internal_host: None,
                    internal_port: None,
                    hostname: None,
                    by_address: false,
                    listeners: Vec::new(),
                    layout: 0,
                    instance: String::new(),
                    heartbeat_ms: now,
                });
                let age = u64::try_from(now - holder.heartbeat_ms).unwrap_or(0);
                Registration::Held {
                    holder,
                    heartbeat_age: Duration::from_millis(age),
                }
            }
            _ => Registration::NoFreeId,
        })
    }

    /// Gateways whose heartbeat is younger than `node_timeout`, by node id.
    pub async fn live_brokers(&self, node_timeout: Duration) -> Result<Vec<BrokerRecord>> {
        let ((seconds, micros), all): ((i64, i64), Vec<(i32, String)>) = redis::pipe()
            .cmd("TIME")
            .cmd("HGETALL")
            .arg(self.brokers_key())
            .query_async(&mut self.conn())
            .await?;
        let now = seconds * 1000 + micros / 1000;
        let timeout = node_timeout.as_millis() as i64;
        let mut live: Vec<BrokerRecord> = all
            .into_iter()
            .filter_map(|(node_id, json)| decode_record(node_id, &json))
            .filter(|record| now - record.heartbeat_ms < timeout)
            .collect();
        live.sort_by_key(|b| b.node_id);
        Ok(live)
    }

    /// Removes this gateway's entry (clean shutdown), so the others stop
    /// routing to it at once instead of after `node_timeout` — unless another
    /// process holds the id by now.
    pub async fn deregister(&self, node_id: i32, instance: &str) -> Result<()> {
        let _: i64 = self
            .scripts
            .deregister
            .key(self.brokers_key())
            .arg(node_id)
            .arg(instance)
            .arg(self.brokers_channel())
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }
}

fn decode_record(node_id: i32, json: &str) -> Option<BrokerRecord> {
    let mut record: BrokerRecord = serde_json::from_str(json).ok()?;
    record.node_id = node_id;
    Some(record)
}
