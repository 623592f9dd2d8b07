//! The cluster-wide defaults of the topic configs (`log.retention.ms`,
//! `log.cleanup.policy`, `message.max.bytes`…), set at run time with
//! IncrementalAlterConfigs or AlterConfigs on the default broker resource
//! (`kafka-configs.sh --entity-type brokers --entity-default`) and stored in
//! Redis (ketch_storage's cluster_configs module). Every gateway keeps a
//! copy, reloaded when any gateway announces a change; requests read the
//! copy, the storage worker reads Redis on each tick. docs/configuration.md,
//! "Cluster-wide topic defaults".

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use ketch_config::topic::Defaults;

use crate::Context;

/// This gateway's copy of the topic config defaults.
pub struct ClusterDefaults {
    /// Kafka's defaults with ketch's settings: what applies with no
    /// cluster-wide default set.
    base: Defaults,
    current: RwLock<(u64, Arc<Defaults>)>,
    /// Held across a reload's read and its replace: two reloads at once
    /// (an AlterConfigs's own and the announcement's) would otherwise let
    /// the one that read first replace last, leaving the older version in
    /// place until the next check.
    reloading: tokio::sync::Mutex<()>,
}

impl ClusterDefaults {
    pub fn new(settings: &ketch_config::TopicsSettings) -> Self {
        let base = Defaults::new(settings.max_message_bytes);
        let current = RwLock::new((0, Arc::new(base.clone())));
        Self {
            base,
            current,
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    /// The defaults with no cluster-wide one set.
    pub fn base(&self) -> &Defaults {
        &self.base
    }

    /// The defaults in effect.
    pub fn get(&self) -> Arc<Defaults> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).1.clone()
    }

    /// The version of the stored defaults this copy holds.
    pub fn version(&self) -> u64 {
        self.current.read().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Takes the stored defaults (broker config name → value) of `version`.
    pub fn replace(&self, version: u64, stored: &BTreeMap<String, String>) {
        let (defaults, skipped) = self.base.with_cluster(stored);
        for why in skipped {
            tracing::warn!(%why, "ignoring a stored cluster-wide topic default (written by a newer ketch?)");
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (version, Arc::new(defaults));
    }
}

/// Reads the defaults from storage into this gateway.
pub async fn reload(ctx: &Context) -> ketch_storage::Result<()> {
    let _one_at_a_time = ctx.topic_defaults.reloading.lock().await;
    let (version, stored) = ctx.storage.cluster_configs().await?;
    ctx.topic_defaults.replace(version, &stored);
    Ok(())
}

/// Keeps this gateway's defaults current (see [`crate::storage::keep_current`]).
/// Runs until shutdown.
pub async fn keep_current(ctx: Arc<Context>) {
    let kept = crate::storage::Kept {
        what: "cluster-wide topic defaults",
        channel: ctx.storage.cluster_config_channel(),
        stored: |ctx| ctx.storage.cluster_config_version(),
        held: |ctx| ctx.topic_defaults.version(),
        load: |ctx| {
            Box::pin(async move {
                reload(ctx).await?;
                let defaults = ctx.topic_defaults.get();
                let set: Vec<String> = defaults.cluster().map(|(k, v)| format!("{k}={v}")).collect();
                Ok(format!(
                    "version {}: {}",
                    ctx.topic_defaults.version(),
                    if set.is_empty() {
                        "none set".to_owned()
                    } else {
                        set.join(", ")
                    }
                ))
            })
        },
        tick: |_| {},
        // Within a second even when an announcement is missed (a gateway
        // still subscribing when the change was made).
        check_every: std::time::Duration::from_secs(1),
    };
    crate::storage::keep_current(ctx, kept).await
}
