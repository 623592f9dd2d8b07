//! ketch-tiering: the storage worker (DESIGN §7).
//!
//! Every gateway runs one. Every `tiering.tick_interval` it visits the
//! partitions this gateway leads, takes or renews each one's lease in Redis
//! (so exactly one gateway works a partition at a time, even while
//! membership changes), seals the open segment when it reaches
//! `segment.bytes` or `segment.ms`, and — for topics without
//! `remote.storage.enable` — deletes whole segments past `retention.ms` /
//! `retention.bytes`; it also forgets idempotent producers idle past
//! `producers.expiration`. Archiving sealed segments to Iceberg (and therefore
//! retention of remote-storage topics) is not built yet.

use std::sync::Arc;
use std::time::Duration;

use ketch_config::topic::topic_config;
use ketch_storage::segments::SegmentPolicy;
use ketch_storage::{Store, Topic};
use tokio::sync::watch;

/// Which partitions this gateway leads.
pub type Leads = Arc<dyn Fn(&Topic, i32) -> bool + Send + Sync>;

/// The storage worker of one gateway.
pub struct StorageWorker {
    store: Store,
    tick_interval: Duration,
    lease_ttl: Duration,
    producer_expiration: Duration,
    /// This worker's identity in lease keys.
    id: String,
}

impl StorageWorker {
    pub fn new(
        store: Store,
        tick_interval: Duration,
        lease_ttl: Duration,
        producer_expiration: Duration,
    ) -> Self {
        Self {
            store,
            tick_interval,
            lease_ttl,
            producer_expiration,
            id: uuid::Uuid::new_v4().to_string(),
        }
    }

    /// Works until `shutdown`.
    pub async fn run(self, leads: Leads, mut shutdown: watch::Receiver<bool>) {
        let mut ticks = tokio::time::interval(self.tick_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.wait_for(|stop| *stop) => return,
            }
            self.tick(&leads).await;
        }
    }

    async fn tick(&self, leads: &Leads) {
        let topics = match self.store.all_topics().await {
            Ok(topics) => topics,
            Err(e) => {
                tracing::debug!(error = %e, "storage worker: cannot list topics");
                return;
            }
        };
        for topic in &topics {
            let policy = policy(topic, self.producer_expiration);
            for partition in (0..topic.partitions()).filter(|p| leads(topic, *p)) {
                if let Err(e) = self.work(topic, partition, policy).await {
                    tracing::warn!(topic = %topic.name, partition, error = %e, "storage worker");
                }
            }
        }
    }

    async fn work(&self, topic: &Topic, partition: i32, policy: SegmentPolicy) -> ketch_storage::Result<()> {
        if !self
            .store
            .take_lease(topic, partition, &self.id, self.lease_ttl)
            .await?
        {
            return Ok(());
        }
        let outcome = self.store.seal_and_retain(topic, partition, policy).await?;
        if outcome.sealed > 0 || outcome.deleted > 0 {
            tracing::debug!(topic = %topic.name, partition, sealed = outcome.sealed,
                deleted = outcome.deleted, log_start = outcome.log_start_offset, "storage worker");
        }
        Ok(())
    }
}

/// A topic's segment and retention settings (its overrides, else Kafka's
/// defaults), and how long idle producers are remembered.
pub fn policy(topic: &Topic, producer_expiration: Duration) -> SegmentPolicy {
    let number = |name: &str| -> i64 {
        topic
            .config(name)
            .or_else(|| topic_config(name).map(|def| def.default))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1)
    };
    let remote = topic.config("remote.storage.enable") == Some("true");
    SegmentPolicy {
        segment_bytes: number("segment.bytes"),
        segment_ms: number("segment.ms"),
        retention_ms: number("retention.ms"),
        retention_bytes: number("retention.bytes"),
        apply_retention: !remote,
        producer_expiration_ms: i64::try_from(producer_expiration.as_millis()).unwrap_or(i64::MAX),
    }
}
