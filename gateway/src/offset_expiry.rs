//! Committed offsets that expire one by one, as Kafka's group coordinator
//! expires them every `offsets.retention.check.interval.ms`
//! (`GroupMetadata.removeExpiredOffsets`): each offset no member consumes
//! goes `groups.offsets_retention` after its commit. That is every offset
//! of a group no member ever joined (consumers that assign their own
//! partitions), and those of the topics a stable consumer group's members
//! do not subscribe to. An offset whose commit set its own expiry time
//! (OffsetCommit v2–v4's `retention_time_ms`, Kafka's per-offset
//! `expireTimestamp`) expires then instead, in a group that emptied too;
//! the other offsets of such a group expire together, a Redis TTL from
//! when it emptied (docs/architecture.md §5). An offset an open
//! transaction has staged a new offset for stays. Each gateway looks at the groups it coordinates,
//! and writes again the retention of those it holds (kept while they have
//! members, expiring once Empty), should a failover have lost one, and
//! drops the offsets a finished transaction left staged.

use std::collections::HashSet;
use std::sync::Arc;

use ketch_storage::StorageError;
use ketch_storage::groups::TopicPartition;

use crate::Context;
use crate::api::offset_delete::subscribed_topics;
use crate::group::Expiring;

/// Until shutdown, every `groups.offsets_retention_check_interval`.
pub async fn run(ctx: Arc<Context>) {
    let mut shutdown = ctx.shutdown.clone();
    let mut tick = tokio::time::interval(ctx.settings.groups.offsets_retention_check_interval.get());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: wait one interval.
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        if !ctx.membership.can_coordinate() {
            continue;
        }
        match expire_once(&ctx).await {
            Ok(0) => {}
            Ok(expired) => tracing::info!(offsets = expired, "expired committed offsets no member consumes"),
            Err(e) => tracing::debug!(error = %e, "cannot look for expired offsets now"),
        }
        // The list of groups with a snapshot forgets those whose snapshot
        // expired (listing it prunes it): it was pruned only when the
        // gateways' membership changed, and kept a name per group ever
        // made meanwhile (a console consumer makes one per run).
        if let Err(e) = ctx.storage.groups_with_snapshots().await {
            tracing::debug!(error = %e, "cannot prune the list of groups with a snapshot now");
        }
    }
}

/// One look at every group with committed offsets that this gateway
/// coordinates; how many offsets expired. A group that cannot be looked at
/// now (its snapshot or offsets unreadable) is left for the next look.
pub async fn expire_once(ctx: &Context) -> Result<i64, StorageError> {
    let retention =
        i64::try_from(ctx.settings.groups.offsets_retention.get().as_millis()).unwrap_or(i64::MAX);
    let mut expired = 0;
    for group in ctx.storage.groups_with_offsets().await? {
        if !ctx.membership.coordinates(&group) {
            continue;
        }
        ctx.groups.keep_retention(&group);
        // Offsets left staged by a transaction that ended without them (a
        // gateway that died between a stage and its re-check) go, so that
        // they hold no offset here and the staged offsets' key can expire
        // with the group (scripts/txn_offsets.lua).
        if let Err(e) = ctx.storage.unstable_partitions(&group).await {
            tracing::debug!(%group, error = %e, "cannot look for offsets left staged");
        }
        // The topics whose offsets stay whatever their age; `None`: none.
        // Without their own expiry time, offsets expire by their age, or
        // (an emptied group) not here.
        let mut by_age = true;
        let subscribed: Option<HashSet<String>> = match ctx.groups.expiring(&group).await {
            Ok(Expiring::All) => None,
            Ok(Expiring::OwnTimeOnly) => {
                by_age = false;
                None
            }
            Ok(Expiring::Unsubscribed(metadata)) => {
                // A member's subscription that does not decode: as Kafka,
                // whose group then has no known subscribed topics, nothing
                // expires.
                let Some(topics) = subscribed_topics(&metadata) else {
                    continue;
                };
                Some(topics.into_iter().collect())
            }
            Ok(Expiring::Nothing) => continue,
            Err(error) => {
                tracing::debug!(%group, ?error, "group not looked at for expired offsets");
                continue;
            }
        };
        let now = ketch_storage::now_ms();
        let cutoff = if by_age {
            now.saturating_sub(retention)
        } else {
            i64::MIN
        };
        let offsets = match ctx.storage.all_committed_offsets(&group).await {
            Ok(offsets) => offsets,
            Err(e) => {
                tracing::debug!(%group, error = %e, "cannot read the group's offsets to expire");
                continue;
            }
        };
        let due: Vec<TopicPartition> = offsets
            .into_iter()
            .filter(|((topic, _), offset)| {
                offset.expired(now, cutoff) && subscribed.as_ref().is_none_or(|s| !s.contains(topic))
            })
            .map(|(partition, _)| partition)
            .collect();
        if due.is_empty() {
            continue;
        }
        match ctx.storage.expire_offsets(&group, &due, now, cutoff).await {
            Ok(gone) => {
                tracing::debug!(%group, offsets = gone, "expired committed offsets");
                expired += gone;
            }
            Err(e) => tracing::debug!(%group, error = %e, "cannot expire the group's offsets now"),
        }
    }
    Ok(expired)
}
