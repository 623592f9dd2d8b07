//! Cluster-wide broker configs set at run time (IncrementalAlterConfigs and
//! AlterConfigs on the default broker resource): the defaults of the topic
//! configs (`log.retention.ms`…) every gateway and storage worker apply to
//! topics without an override. Under the hash tag `{configs}` so one
//! script changes them atomically in Redis Cluster too:
//!
//! - `ketch:{configs}:cluster`: hash broker config name → value, as the
//!   gateway validated it.
//! - `ketch:{configs}:version`: bumped at every change, and published on
//!   the sharded channel `ketch:{configs}:changed`, so every gateway
//!   reloads them at once.

use std::collections::BTreeMap;

use redis::AsyncCommands;

use crate::{Result, Store};

impl Store {
    fn cluster_config_key(&self, name: &str) -> String {
        format!("{}:{{configs}}:{name}", self.keys.namespace())
    }

    /// The sharded pub/sub channel changes are announced on.
    pub fn cluster_config_channel(&self) -> String {
        self.cluster_config_key("changed")
    }

    /// The version and every cluster-wide config.
    pub async fn cluster_configs(&self) -> Result<(u64, BTreeMap<String, String>)> {
        let (version, configs): (Option<u64>, BTreeMap<String, String>) = redis::pipe()
            .get(self.cluster_config_key("version"))
            .hgetall(self.cluster_config_key("cluster"))
            .query_async(&mut self.conn())
            .await?;
        Ok((version.unwrap_or(0), configs))
    }

    /// Only the version (what a gateway polls between wake-ups).
    pub async fn cluster_config_version(&self) -> Result<u64> {
        let version: Option<u64> = self.conn().get(self.cluster_config_key("version")).await?;
        Ok(version.unwrap_or(0))
    }

    /// Sets (`Some`) and removes (`None`) cluster-wide configs at once, if
    /// their version is still `version` (what the change was computed
    /// from), and announces them: the new version, or `None` when another
    /// change came first (nothing changed). Names must not be empty; a
    /// value may be (`log.cleanup.policy` set to an empty list).
    pub async fn change_cluster_configs(
        &self,
        version: u64,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<Option<u64>> {
        let mut script = self
            .scripts
            .change_versioned_hash
            .key(self.cluster_config_key("cluster"));
        script
            .key(self.cluster_config_key("version"))
            .arg(self.cluster_config_channel())
            .arg(version);
        for (name, value) in changes {
            debug_assert!(!name.is_empty());
            script.arg(name).arg(crate::quotas::hash_change(value.as_deref()));
        }
        // Waited for by acks=all's replicas, not failed without them.
        let key = self.cluster_config_key("cluster");
        let version: i64 = self
            .invoke_configured(
                &key,
                &script,
                |reply| matches!(reply, redis::Value::Int(n) if *n >= 0),
            )
            .await?;
        Ok(u64::try_from(version).ok())
    }
}
