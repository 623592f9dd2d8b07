//! Committed consumer-group offsets (DESIGN §3):
//! `ketch:group:{GROUP}:offsets`, a hash of `topic:partition` → JSON with
//! the offset, leader epoch, metadata and commit time; and `ketch:groups`,
//! the set of groups that have committed offsets (for ListGroups after a
//! coordinator restart).
//!
//! Group membership itself lives in the coordinating gateway's memory; what
//! must survive it is here: the offsets, and `ketch:group:{GROUP}:state`, a
//! hash {generation, snapshot} with what a new coordinator needs to take the
//! group over (the gateway encodes the snapshot; it is opaque here). Both of
//! a group that became empty expire after `groups.offsets_retention` (a
//! Redis TTL), or later when an offset's commit asked to be kept longer
//! (`ketch:group:{GROUP}:keep-until`, OffsetCommit v2–v4).

use std::time::Duration;

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::transactions::{APPLIED_FIELD, ORDER_FIELD};
use crate::{Result, StorageError, Store};

/// The latest expiry time an offset's own retention gets (2^53 ms, some
/// 285,000 years): exact as a Lua number in Redis's scripts.
pub const LATEST_EXPIRY_MS: i64 = 1 << 53;

/// One committed offset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommittedOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
    /// When it was committed (ms since the Unix epoch).
    pub commit_ms: i64,
    /// The id of the topic it was committed for: a commit a gateway
    /// accepted from its copy of a topic deleted meanwhile (after the
    /// deletion dropped the groups' offsets) is not the offset of a topic
    /// created again under that name. `None` from older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_id: Option<uuid::Uuid>,
    /// When it expires, if its commit said (OffsetCommit v2–v4's
    /// `retention_time_ms`, Kafka's per-offset `expireTimestamp`): then
    /// that, not `groups.offsets_retention`, decides its expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_ms: Option<i64>,
}

impl CommittedOffset {
    pub fn new(offset: i64, leader_epoch: i32, metadata: Option<String>) -> Self {
        let commit_ms = crate::now_ms();
        Self {
            offset,
            leader_epoch,
            metadata,
            commit_ms,
            topic_id: None,
            expire_ms: None,
        }
    }

    /// The offset, kept `retention_ms` from its commit whatever
    /// `groups.offsets_retention` says (an OffsetCommit v2–v4 that set its
    /// `retention_time_ms`); `None`: as the broker's retention says.
    pub fn retained_for(mut self, retention_ms: Option<i64>) -> Self {
        self.expire_ms = retention_ms.map(|ms| self.commit_ms.saturating_add(ms).min(LATEST_EXPIRY_MS));
        self
    }

    /// Whether it expired at `now_ms`: by its own expiry time when its
    /// commit set one, else if it was committed at or before `cutoff_ms`
    /// (`i64::MIN`: only those with their own expire), as Kafka's
    /// `OffsetExpirationConditionImpl` decides.
    pub fn expired(&self, now_ms: i64, cutoff_ms: i64) -> bool {
        match self.expire_ms {
            Some(expire_ms) => expire_ms <= now_ms,
            None => self.commit_ms <= cutoff_ms,
        }
    }

    /// The offset, committed for the topic whose id is `id` (`None`: not
    /// known).
    pub fn of_topic(mut self, id: Option<uuid::Uuid>) -> Self {
        self.topic_id = id;
        self
    }

    /// Whether it is an offset of the topic whose id is `id` (one an
    /// older release committed says nothing, and counts).
    pub fn is_of(&self, id: uuid::Uuid) -> bool {
        self.topic_id.is_none_or(|mine| mine == id)
    }
}

/// A topic partition as committed offsets name it.
pub type TopicPartition = (String, i32);

/// A retention as a TTL in ms: at least 1 (`PEXPIRE` with 0 deletes),
/// at most [`LATEST_EXPIRY_MS`] (the scripts hold it exactly, and Redis
/// can add it to its clock).
pub fn retention_ms(retention: Duration) -> i64 {
    i64::try_from(retention.as_millis())
        .unwrap_or(i64::MAX)
        .clamp(1, LATEST_EXPIRY_MS)
}

fn field(topic: &str, partition: i32) -> String {
    format!("{topic}:{partition}")
}

/// Splits `topic:partition` (topic names cannot contain ':').
fn parse_field(field: &str) -> Option<TopicPartition> {
    let (topic, partition) = field.rsplit_once(':')?;
    Some((topic.to_owned(), partition.parse().ok()?))
}

fn decode_offset(group: &str, json: &str) -> Result<CommittedOffset> {
    serde_json::from_str(json)
        .map_err(|e| StorageError::Data(format!("committed offset of group {group}: {e}")))
}

/// Whether a group's keys (`ketch:group:{<group>}:…`) share one hash
/// slot of a Redis Cluster, so that one script may take several of them:
/// not for an empty id, nor for one that starts with `}`, whose hash tag
/// is empty (Redis then hashes each whole key).
pub fn group_keys_share_a_slot(group: &str) -> bool {
    !group.is_empty() && !group.starts_with('}')
}

impl Store {
    pub(crate) fn group_offsets_key(&self, group: &str) -> String {
        format!("{}:group:{{{group}}}:offsets", self.keys.namespace())
    }

    pub(crate) fn group_state_key(&self, group: &str) -> String {
        format!("{}:group:{{{group}}}:state", self.keys.namespace())
    }

    /// Until when some offset of the group must be kept (its commit's own
    /// retention, OffsetCommit v2–v4): `scripts/keep_until.lua`.
    pub(crate) fn group_keep_until_key(&self, group: &str) -> String {
        format!("{}:group:{{{group}}}:keep-until", self.keys.namespace())
    }

    /// The keys that expire once the group has no members.
    fn group_retained_keys(&self, group: &str) -> [String; 3] {
        [
            self.group_offsets_key(group),
            self.group_state_key(group),
            self.group_txn_offsets_key(group),
        ]
    }

    /// Stores a group's snapshot unless Redis holds one of a newer
    /// generation (written by a coordinator that ran the group later);
    /// false when refused. Not waited for by replicas, even with acks=all
    /// waiting for them: one task writes every group's snapshots in turn,
    /// and replicas that do not answer would hold each up for
    /// `storage.acks_all_timeout`. A snapshot a failover loses costs its
    /// members a rebalance (docs/durability.md).
    ///
    /// The group is listed among those with a snapshot
    /// ([`Store::groups_with_snapshots`]): a new coordinator takes over
    /// such a group even if it never committed offsets (Kafka Connect's,
    /// Schema Registry's), so its dead members' sessions run out.
    pub async fn store_group(&self, group: &str, generation: i32, snapshot: &[u8]) -> Result<bool> {
        let stored: i64 = self
            .scripts
            .store_group
            .key(self.group_state_key(group))
            .arg(generation)
            .arg(snapshot)
            .invoke_async(&mut self.conn())
            .await?;
        // The listing is a hint for a take-over: a snapshot stored is not
        // refused for it (the group's next snapshot lists it again).
        if stored == 1
            && let Err(e) = self
                .conn()
                .sadd::<_, _, i64>(self.group_snapshots_key(), group)
                .await
        {
            tracing::debug!(group, error = %e, "cannot list a group among those with a snapshot");
        }
        Ok(stored == 1)
    }

    /// A group's snapshot, if one is stored.
    pub async fn load_group(&self, group: &str) -> Result<Option<Vec<u8>>> {
        let snapshot: Option<Vec<u8>> = self.conn().hget(self.group_state_key(group), "snapshot").await?;
        Ok(snapshot)
    }

    fn groups_key(&self) -> String {
        format!("{}:groups", self.keys.namespace())
    }

    fn group_snapshots_key(&self) -> String {
        format!("{}:groups:snapshots", self.keys.namespace())
    }

    /// Lists `group` among the groups with committed offsets (even when
    /// Redis is at maxmemory: the commit that lists it is stored already).
    pub(crate) async fn note_group(&self, group: &str) -> Result<()> {
        let _: i64 = self
            .oom_command(&self.groups_key(), "SADD")
            .arg(group)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    /// Stores committed offsets (atomically per group). With
    /// acks=all waiting for replicas (or fsync) they are as durable as an
    /// acks=all batch before this returns, as Kafka appends offset commits
    /// to its offsets topic with acks=all: a failover does not take back a
    /// commit the consumer was told of (it would consume again from an
    /// older offset). Each is ordered after the offsets transactions
    /// staged before it (`scripts/offset_order.lua`): their commit does not
    /// overwrite it, as in Kafka, where the later record stands.
    pub async fn commit_offsets(
        &self,
        group: &str,
        offsets: &[(TopicPartition, CommittedOffset)],
    ) -> Result<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        // Noted before the offsets are written, so the group's keys never
        // expire before an offset kept longer than the broker's retention
        // (a commit that fails after this keeps them longer, no worse).
        // In the offsets' slot (but for the empty group id and ids that
        // start with `}`): a replica that has them has this too (the
        // offsets' WAIT counts every earlier write of their master). Those
        // others are waited for on their own, as durable as the offsets.
        // One that expired already needs nothing kept.
        let until = offsets.iter().filter_map(|(_, o)| o.expire_ms).max();
        if let Some(until) = until.filter(|until| *until > crate::now_ms()) {
            let key = self.group_keep_until_key(group);
            let mut invocation = self.scripts.keep_until.key(&key);
            invocation.arg(until);
            if group_keys_share_a_slot(group) {
                let _: i64 = invocation.invoke_async(&mut self.conn()).await?;
            } else {
                let _: i64 = self.invoke_durably(&key, &invocation, |_| true).await?;
            }
        }
        let items: Vec<(String, String)> = offsets
            .iter()
            .map(|((topic, partition), committed)| {
                let json = serde_json::to_string(committed).expect("offset serializes");
                (field(topic, *partition), json)
            })
            .collect();
        let key = self.group_offsets_key(group);
        if group_keys_share_a_slot(group) {
            // Ordered after the transactions' stages (`commit_offsets.lua`).
            let mut invocation = self.scripts.commit_offsets.key(&key);
            invocation.key(self.group_txn_offsets_key(group));
            for (field, json) in &items {
                invocation.arg(field).arg(json);
            }
            let written = self.invoke_durably::<i64>(&key, &invocation, |_| true).await;
            // Listed whether or not the replicas confirmed: the offsets
            // may be there either way.
            self.note_group(group).await?;
            return written.map(|_| ());
        }
        let mut pipe = redis::pipe();
        pipe.hset_multiple(&key, &items).ignore();
        if !self.durability.waits() {
            // One round trip (split per slot in a cluster).
            pipe.sadd(self.groups_key(), group).ignore();
            return Ok(pipe.query_async(&mut self.conn()).await?);
        }
        // The durable write is of the offsets' key alone (its master's
        // WAIT): the group is listed after, on its own (listed once its
        // offsets exist, the sweep in groups_with_offsets keeps it).
        let written = self.query_durably(&key, &pipe).await;
        // Listed whether or not the replicas confirmed: the offsets may be
        // there either way.
        self.note_group(group).await?;
        written
    }

    /// The committed offsets of `partitions` of one topic, in their order.
    /// Read in chunks, so the fields asked for at a time stay bounded
    /// whatever a request names.
    pub async fn committed_offsets_of(
        &self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<Option<CommittedOffset>>> {
        const FIELDS_PER_READ: usize = 1000;
        let key = self.group_offsets_key(group);
        let mut offsets = Vec::with_capacity(partitions.len());
        for chunk in partitions.chunks(FIELDS_PER_READ) {
            let fields: Vec<String> = chunk.iter().map(|p| field(topic, *p)).collect();
            let values: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(&key)
                .arg(&fields)
                .query_async(&mut self.conn())
                .await?;
            for json in values {
                offsets.push(
                    json.as_deref()
                        .map(|json| decode_offset(group, json))
                        .transpose()?,
                );
            }
        }
        if let Some(current) = self.current_topic_id(topic).await {
            for offset in &mut offsets {
                if offset.as_ref().is_some_and(|o| !o.is_of(current)) {
                    *offset = None;
                }
            }
        }
        Ok(offsets)
    }

    /// The id of the topic named `topic` now, to tell its offsets from a
    /// deleted incarnation's; `None` when there is none or the registry
    /// cannot say (then every offset counts).
    async fn current_topic_id(&self, topic: &str) -> Option<uuid::Uuid> {
        self.topic(topic).await.ok().flatten().map(|t| t.id)
    }

    /// Every committed offset of the group, sorted by topic and partition.
    pub async fn all_committed_offsets(&self, group: &str) -> Result<Vec<(TopicPartition, CommittedOffset)>> {
        let all: Vec<(String, String)> = self.conn().hgetall(self.group_offsets_key(group)).await?;
        let mut offsets = Vec::with_capacity(all.len());
        for (name, json) in all {
            if let Some(tp) = parse_field(&name) {
                offsets.push((tp, decode_offset(group, &json)?));
            }
        }
        offsets.sort_by(|a, b| a.0.cmp(&b.0));
        // Those of a deleted incarnation of their topic are not offsets.
        let mut current: Option<(String, Option<uuid::Uuid>)> = None;
        let mut kept = Vec::with_capacity(offsets.len());
        for (tp, offset) in offsets {
            if current.as_ref().is_none_or(|(topic, _)| *topic != tp.0) {
                current = Some((tp.0.clone(), self.current_topic_id(&tp.0).await));
            }
            let id = current.as_ref().and_then(|(_, id)| *id);
            if id.is_none_or(|id| offset.is_of(id)) {
                kept.push((tp, offset));
            }
        }
        Ok(kept)
    }

    /// Deletes the committed offsets of `partitions` (OffsetDelete), and
    /// those open transactions staged for them, which their commit would
    /// otherwise bring back (Kafka's tombstone removes a partition's
    /// pending transactional offsets too), in one step
    /// (`delete_offsets.lua`). A group whose keys are in different slots
    /// of a Redis Cluster ([`group_keys_share_a_slot`]) has its staged
    /// offsets deleted in a second step.
    pub async fn delete_offsets(&self, group: &str, partitions: &[TopicPartition]) -> Result<()> {
        if partitions.is_empty() {
            return Ok(());
        }
        let fields: Vec<String> = partitions.iter().map(|(t, p)| field(t, *p)).collect();
        let txn_key = self.group_txn_offsets_key(group);
        if group_keys_share_a_slot(group) {
            let _: i64 = self
                .scripts
                .delete_offsets
                .key(self.group_offsets_key(group))
                .key(&txn_key)
                .arg(&fields)
                .invoke_async(&mut self.conn())
                .await?;
            return Ok(());
        }
        let _: i64 = self.conn().hdel(self.group_offsets_key(group), &fields).await?;
        let staged: Vec<String> = self.conn().hkeys(&txn_key).await?;
        let gone: Vec<&String> = staged
            .iter()
            .filter(|f| {
                f.rsplit_once(':')
                    .is_some_and(|(partition, _)| fields.iter().any(|w| w == partition))
            })
            .collect();
        if !gone.is_empty() {
            let _: i64 = self.conn().hdel(&txn_key, gone).await?;
        }
        Ok(())
    }

    /// Deletes the group's committed offsets of `partitions` that expired
    /// at `now_ms` ([`CommittedOffset::expired`]: by their own expiry
    /// time, or committed at or before `cutoff_ms`). Each is read again in
    /// the script (`expire_offsets.lua`), so an offset committed again
    /// since the caller read it stays, and so does one an open
    /// transaction staged a new offset for. How many were deleted.
    pub async fn expire_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
        now_ms: i64,
        cutoff_ms: i64,
    ) -> Result<i64> {
        if partitions.is_empty() {
            return Ok(0);
        }
        let fields: Vec<String> = partitions.iter().map(|(t, p)| field(t, *p)).collect();
        let mut invocation = self.scripts.expire_offsets.key(self.group_offsets_key(group));
        // The empty group id, and one starting with `}`, have their two
        // keys in different slots of a Redis Cluster; no transaction
        // commits their offsets (`transactional_group`), so they have none
        // staged.
        if group_keys_share_a_slot(group) {
            invocation.key(self.group_txn_offsets_key(group));
        }
        invocation.arg(cutoff_ms).arg(now_ms).arg(&fields);
        Ok(invocation.invoke_async(&mut self.conn()).await?)
    }

    /// Deletes every committed offset of the group, and those open
    /// transactions staged for it (as Kafka's DeleteGroups writes their
    /// tombstones too); true if it had any of either.
    pub async fn delete_group_offsets(&self, group: &str) -> Result<bool> {
        let txn_key = self.group_txn_offsets_key(group);
        let (staged, order, applied, _, deleted, _): (i64, i64, i64, i64, i64, i64) = redis::pipe()
            .hlen(&txn_key)
            .hexists(&txn_key, ORDER_FIELD)
            .hexists(&txn_key, APPLIED_FIELD)
            .del(self.group_state_key(group))
            .del(self.group_offsets_key(group))
            .srem(self.groups_key(), group)
            .del(&txn_key)
            .ignore()
            .del(self.group_keep_until_key(group))
            .ignore()
            .query_async(&mut self.conn())
            .await?;
        Ok(deleted > 0 || staged - order - applied > 0)
    }

    /// Removes a deleted topic's offsets, committed and staged by open
    /// transactions, from every group that has committed offsets (Kafka's
    /// coordinator writes their tombstones when a topic is deleted): a
    /// topic created again under the name starts each group at its reset
    /// policy, not at the old topic's offsets.
    pub(crate) async fn drop_topic_offsets(&self, topic: &str, partitions: i32) -> Result<()> {
        let groups: Vec<String> = self.conn().smembers(self.groups_key()).await?;
        if groups.is_empty() || partitions <= 0 {
            return Ok(());
        }
        let fields: Vec<String> = (0..partitions).map(|p| field(topic, p)).collect();
        let mut pipe = redis::pipe();
        for group in &groups {
            pipe.hdel(self.group_offsets_key(group), &fields).ignore();
            pipe.hkeys(self.group_txn_offsets_key(group));
        }
        let staged: Vec<Vec<String>> = pipe.query_async(&mut self.conn()).await?;
        let mut pipe = redis::pipe();
        let mut any = false;
        for (group, fields) in groups.iter().zip(staged) {
            let ours: Vec<&String> = fields
                .iter()
                .filter(|f| crate::transactions::staged_field(f).is_some_and(|(t, _, _)| t == topic))
                .collect();
            if !ours.is_empty() {
                pipe.hdel(self.group_txn_offsets_key(group), ours).ignore();
                any = true;
            }
        }
        if any {
            let () = pipe.query_async(&mut self.conn()).await?;
        }
        Ok(())
    }

    /// The group has no members left: its offsets (and what it keeps
    /// beside them: its snapshot, the offsets transactions staged) expire
    /// after `retention`, or when the longest retention one of their
    /// commits asked for ends, whichever is later. The time (ms since the
    /// Unix epoch) the offsets expire at now, if they exist (for
    /// [`Store::confirm_group_retention`]).
    pub async fn group_emptied(&self, group: &str, retention: Duration) -> Result<Option<i64>> {
        let at = self.retain_group(group, retention, false).await?;
        Ok((at > 0).then_some(at))
    }

    /// With acks=all waiting for replicas (or fsync), waits until they
    /// have the expiry of the group's keys as it is now: after a commit to
    /// a group without members, whose offsets keep the retention the
    /// commit set ([`Store::group_emptied`]); a failover that lost it would
    /// bring back an older, shorter expiry, and the offsets would go before
    /// their time. That expiry is written on the shared connection (in
    /// order with the group's other changes), which WAIT cannot be used on:
    /// each key's expiry is written again, as it is, on a connection of the
    /// durable pool (`scripts/reassert_expiry.lua`), and WAITed there; the
    /// master's replication stream is in order, so that covers the first
    /// write too. One connection at a time, so a small pool is never held
    /// by this while it waits for another of its own. An expiry earlier
    /// than `at`, the one that write set (see [`Store::group_emptied`]),
    /// is one a failover brought back from before it: `at` is set again,
    /// then confirmed. One that no longer expires (the group has members
    /// again) or a key gone needs nothing.
    pub async fn confirm_group_retention(&self, group: &str, at: Option<i64>) -> Result<()> {
        if !self.durability.waits() {
            return Ok(());
        }
        let keys = self.group_retained_keys(group);
        let slots: Vec<&[String]> = if group_keys_share_a_slot(group) {
            vec![&keys[..]]
        } else {
            keys.chunks(1).collect()
        };
        for keys in slots {
            let mut invocation = self.scripts.reassert_expiry.key(&keys[0]);
            for key in &keys[1..] {
                invocation.key(key);
            }
            invocation.arg(at.unwrap_or(0));
            let _: i64 = self.invoke_durably(&keys[0], &invocation, |_| true).await?;
        }
        Ok(())
    }

    /// The group was found Empty (brought in from its snapshot): its keys
    /// expire after `retention` unless they expire already. A coordinator
    /// that kept them while the group had members may have gone before it
    /// emptied, and nothing else would let them go.
    pub async fn group_idle(&self, group: &str, retention: Duration) -> Result<()> {
        self.retain_group(group, retention, true).await.map(drop)
    }

    /// The group's keys expire after `retention` or when its keep-until
    /// key does, whichever is later (`scripts/retain_group.lua`); with
    /// `unless_expiring`, only those that do not expire already. The time
    /// the offsets expire at then: -1 when they do not, -2 when there are
    /// none.
    async fn retain_group(&self, group: &str, retention: Duration, unless_expiring: bool) -> Result<i64> {
        let ms = retention_ms(retention);
        let keep_until = self.group_keep_until_key(group);
        let keys = self.group_retained_keys(group);
        if group_keys_share_a_slot(group) {
            let mut invocation = self.scripts.retain_group.key(&keep_until);
            for key in &keys {
                invocation.key(key);
            }
            invocation.arg(ms).arg(if unless_expiring { "1" } else { "0" });
            return Ok(invocation.invoke_async(&mut self.conn()).await?);
        }
        // The keys are in different slots of a Redis Cluster: read, then
        // set (a commit with a longer retention of its own in between sets
        // them again after).
        let kept: i64 = redis::cmd("PTTL")
            .arg(&keep_until)
            .query_async(&mut self.conn())
            .await?;
        let ms = ms.max(kept);
        let mut pipe = redis::pipe();
        let offsets = keys[0].clone();
        for key in keys {
            if !unless_expiring {
                pipe.cmd("PEXPIRE").arg(&key).arg(ms).ignore();
                continue;
            }
            pipe.cmd("PEXPIRE").arg(&key).arg(ms).arg("NX").ignore();
            // As retain_group.lua: one that expires before keep-until
            // expires with it.
            if kept > 0 {
                pipe.cmd("PEXPIRE").arg(&key).arg(kept).arg("GT").ignore();
            }
        }
        pipe.cmd("PEXPIRETIME").arg(&offsets);
        let (at,): (i64,) = pipe.query_async(&mut self.conn()).await?;
        Ok(at)
    }

    /// The group has members again: its offsets are kept.
    pub async fn group_active(&self, group: &str) -> Result<()> {
        let _: (i64, i64, i64) = redis::pipe()
            .persist(self.group_offsets_key(group))
            .persist(self.group_state_key(group))
            .persist(self.group_txn_offsets_key(group))
            .query_async(&mut self.conn())
            .await?;
        Ok(())
    }

    /// Whether `group` has committed offsets, or offsets an open
    /// transaction staged for it (a group without members whose consumers
    /// assign their own partitions, or that only a producer's
    /// TxnOffsetCommit named: Kafka's coordinator creates the group then).
    pub async fn group_has_offsets(&self, group: &str) -> Result<bool> {
        let txn_key = self.group_txn_offsets_key(group);
        let (committed, staged, order, applied): (bool, i64, i64, i64) = redis::pipe()
            .exists(self.group_offsets_key(group))
            .hlen(&txn_key)
            .hexists(&txn_key, ORDER_FIELD)
            .hexists(&txn_key, APPLIED_FIELD)
            .query_async(&mut self.conn())
            .await?;
        Ok(committed || staged - order - applied > 0)
    }

    /// Groups that have committed offsets still stored; those listed
    /// whose offsets expired are forgotten.
    pub async fn groups_with_offsets(&self) -> Result<Vec<String>> {
        self.listed_groups(&self.groups_key(), |group| self.group_offsets_key(group))
            .await
    }

    /// Groups whose snapshot is still stored (a group with members, or
    /// emptied within the retention), whether or not they committed
    /// offsets; those listed whose snapshot expired are forgotten.
    pub async fn groups_with_snapshots(&self) -> Result<Vec<String>> {
        self.listed_groups(&self.group_snapshots_key(), |group| self.group_state_key(group))
            .await
    }

    /// The groups listed in the set `index` whose key `key_of(group)` still
    /// exists, sorted; those whose key is gone are taken off the list.
    async fn listed_groups(&self, index: &str, key_of: impl Fn(&str) -> String) -> Result<Vec<String>> {
        let groups: Vec<String> = self.conn().smembers(index).await?;
        if groups.is_empty() {
            return Ok(groups);
        }
        let mut pipe = redis::pipe();
        for group in &groups {
            pipe.exists(key_of(group));
        }
        let exists: Vec<bool> = pipe.query_async(&mut self.conn()).await?;
        let (live, gone): (Vec<_>, Vec<_>) = groups.into_iter().zip(exists).partition(|(_, e)| *e);
        if !gone.is_empty() {
            // Expired with their retention: forget them. A group's first
            // commit writes its offsets, then lists it: one that did so
            // since they were looked at is listed again.
            let gone: Vec<String> = gone.into_iter().map(|(g, _)| g).collect();
            let _: i64 = self.conn().srem(index, &gone).await?;
            let mut pipe = redis::pipe();
            for group in &gone {
                pipe.exists(key_of(group));
            }
            let back: Vec<bool> = pipe.query_async(&mut self.conn()).await?;
            let back: Vec<&String> = gone
                .iter()
                .zip(back)
                .filter(|(_, e)| *e)
                .map(|(g, _)| g)
                .collect();
            if !back.is_empty() {
                let _: i64 = self.conn().sadd(index, back).await?;
            }
        }
        let mut live: Vec<String> = live.into_iter().map(|(g, _)| g).collect();
        live.sort();
        Ok(live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_topic_names_with_dots_and_dashes() {
        assert_eq!(
            parse_field(&field("a.b-c_d", 12)),
            Some(("a.b-c_d".to_owned(), 12))
        );
        assert_eq!(parse_field("nocolon"), None);
        assert_eq!(parse_field("t:x"), None);
    }

    #[test]
    fn an_offsets_own_expiry_time_decides_and_is_read_back() {
        let plain = CommittedOffset::new(5, 0, None);
        let now = plain.commit_ms;
        assert!(!serde_json::to_string(&plain).unwrap().contains("expire_ms"));
        assert!(plain.expired(now, now) && !plain.expired(now, now - 1));
        let own = plain.clone().retained_for(Some(1000));
        assert_eq!(own.expire_ms, Some(now + 1000));
        // Its own time, not its age.
        assert!(!own.expired(now + 999, i64::MAX) && own.expired(now + 1000, i64::MIN));
        let json = serde_json::to_string(&own).unwrap();
        assert_eq!(serde_json::from_str::<CommittedOffset>(&json).unwrap(), own);
        // As `commit_offsets.lua` leaves it, with an order number.
        let ordered = format!("{},\"order\":3}}", &json[..json.len() - 1]);
        assert_eq!(serde_json::from_str::<CommittedOffset>(&ordered).unwrap(), own);
        // A retention no clock can add stays one Redis's scripts hold exactly.
        assert_eq!(
            plain.retained_for(Some(i64::MAX)).expire_ms,
            Some(LATEST_EXPIRY_MS)
        );
    }
}
