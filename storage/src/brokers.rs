//! The broker registry (DESIGN §6): `ketch:brokers`, a hash of node id →
//! JSON {instance, host, port, rack, heartbeat_ms}. Each gateway refreshes
//! its entry every `cluster.heartbeat_interval`, stamped with Redis's clock;
//! an entry older than `cluster.node_timeout` is a dead gateway.

use std::time::Duration;

use serde::Deserialize;

use crate::{Result, Store};

/// A gateway as registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRecord {
    pub node_id: i32,
    pub host: String,
    pub port: u16,
    pub rack: Option<String>,
}

#[derive(Deserialize)]
struct StoredBroker {
    host: String,
    port: u16,
    rack: Option<String>,
    heartbeat_ms: i64,
}

/// What a heartbeat found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// Another process registered this node id and was alive: two gateways
    /// share a node id.
    pub conflicting_instance: Option<String>,
}

impl Store {
    fn brokers_key(&self) -> String {
        format!("{}:brokers", self.keys.namespace())
    }

    /// Registers or refreshes this gateway.
    pub async fn heartbeat(
        &self,
        me: &BrokerRecord,
        instance: &str,
        node_timeout: Duration,
    ) -> Result<Heartbeat> {
        let (now, previous_instance, previous_heartbeat): (i64, String, i64) = self
            .scripts
            .heartbeat
            .key(self.brokers_key())
            .arg(me.node_id)
            .arg(instance)
            .arg(&me.host)
            .arg(me.port)
            .arg(me.rack.as_deref().unwrap_or(""))
            .invoke_async(&mut self.conn())
            .await?;
        let alive = previous_heartbeat >= 0 && now - previous_heartbeat < node_timeout.as_millis() as i64;
        let conflicting_instance = (alive && !previous_instance.is_empty() && previous_instance != instance)
            .then_some(previous_instance);
        Ok(Heartbeat { conflicting_instance })
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
            .filter_map(|(node_id, json)| {
                let stored: StoredBroker = serde_json::from_str(&json).ok()?;
                (now - stored.heartbeat_ms < timeout).then_some(BrokerRecord {
                    node_id,
                    host: stored.host,
                    port: stored.port,
                    rack: stored.rack,
                })
            })
            .collect();
        live.sort_by_key(|b| b.node_id);
        Ok(live)
    }

    /// Removes this gateway's entry (clean shutdown), so the others stop
    /// routing to it at once instead of after `node_timeout`.
    pub async fn deregister(&self, node_id: i32) -> Result<()> {
        let _: i64 = redis::cmd("HDEL")
            .arg(self.brokers_key())
            .arg(node_id)
            .query_async(&mut self.conn())
            .await?;
        Ok(())
    }
}
