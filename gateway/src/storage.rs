//! The one seam between the Kafka APIs and storage: handlers reach topics,
//! partitions, offsets and groups only through [`Storage`]. A gateway uses
//! Redis and the archive ([`Tiered`]); the fuzz target and tests can put
//! [`crate::memory::MemoryStorage`] in its place.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use ketch_storage::batch::BatchHeader;
use ketch_storage::{
    AppendOutcome, CommittedOffset, Decided, JoinReply, PartitionOffsets, QuotaChange, ReadPartition,
    ReadRequest, Result, ScramChange, StagingTxn, Store, StoredCredential, StoredQuota, Topic,
    TopicPartition, TxnItems, TxnReply, TxnState, WakeHub,
};
use ketch_tiering::Tiers;

/// What the Kafka APIs need of storage. Methods mean what the
/// [`ketch_storage::Store`] methods of the same name mean; reads span both
/// tiers.
#[async_trait]
pub trait Storage: Send + Sync {
    /// Checks that storage answers.
    async fn ping(&self) -> Result<()>;

    /// The fetch wake-up hub.
    fn wake(&self) -> &WakeHub;

    // ---- topics ----
    async fn topic(&self, name: &str) -> Result<Option<Arc<Topic>>>;
    async fn topic_fresh(&self, name: &str) -> Result<Option<Arc<Topic>>>;
    async fn topic_fresher_than(&self, name: &str, age: Duration) -> Result<Option<Arc<Topic>>>;
    async fn topic_by_id(&self, id: uuid::Uuid) -> Result<Option<Arc<Topic>>>;
    async fn all_topics(&self) -> Result<Vec<Arc<Topic>>>;
    /// When the last complete listing of the topics began and the names it
    /// found (and those read since), if one was made: see
    /// [`ketch_storage::Store::listed_topic_names`]. `None` when the
    /// storage keeps no listing.
    fn listed_topic_names(&self) -> Option<(std::time::Instant, std::collections::HashSet<String>)> {
        None
    }
    async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
    ) -> Result<Arc<Topic>>;
    /// Deletes the topic named `name`, only while it has the id `id` when
    /// given.
    async fn delete_topic(&self, name: &str, id: Option<uuid::Uuid>) -> Result<Arc<Topic>>;
    async fn add_partitions(&self, topic: &Topic, total: i32) -> Result<Arc<Topic>>;
    /// Replaces a topic's config overrides (validated by the caller).
    async fn set_topic_configs(&self, topic: &Topic, configs: BTreeMap<String, String>)
    -> Result<Arc<Topic>>;
    /// Bytes a partition's log takes in Redis (`None`: not stored there).
    async fn partition_memory(&self, topic: &Topic, partition: i32) -> Result<Option<i64>>;
    /// A partition's sealed segments, oldest first.
    async fn segments(&self, topic: &Topic, partition: i32) -> Result<Vec<ketch_storage::segments::Segment>>;
    /// `INFO memory stats errorstats` of each Redis server (every master
    /// of a cluster, each asked on its own): (address, text or why it
    /// gave none); empty without Redis.
    async fn server_info(&self) -> Result<Vec<(String, Result<String>)>>;

    // ---- partitions ----
    async fn append(
        &self,
        topic: &Topic,
        partition: i32,
        batch: &Bytes,
        header: &BatchHeader,
        acks_all: bool,
    ) -> Result<AppendOutcome>;
    async fn offsets(&self, topic: &Topic, partition: i32) -> Result<PartitionOffsets>;
    /// Readies a partition for remote storage: `false` when it was ever
    /// compacted; else gives up any compaction pass on it (unless `check`).
    async fn ready_for_archive(&self, topic: &Topic, partition: i32, _check: bool) -> Result<bool> {
        Ok(self.offsets(topic, partition).await?.clean_end == 0)
    }
    async fn read(&self, topic: &Topic, partition: i32, request: &ReadRequest) -> Result<ReadPartition>;
    /// About the bytes of the next `records` records of a partition, from
    /// the batch sizes this gateway's reads have seen (`None`: none seen).
    fn bytes_estimate(&self, topic: &Topic, partition: i32, records: i64) -> Option<usize>;
    async fn offset_for_timestamp(
        &self,
        topic: &Topic,
        partition: i32,
        timestamp: i64,
    ) -> Result<Option<(i64, i64)>>;
    async fn max_timestamp(&self, topic: &Topic, partition: i32) -> Result<Option<(i64, i64)>>;
    async fn delete_records(&self, topic: &Topic, partition: i32, offset: i64) -> Result<i64>;
    async fn new_producer_id(&self) -> Result<i64>;

    // ---- committed offsets ----
    async fn commit_offsets(&self, group: &str, offsets: &[(TopicPartition, CommittedOffset)]) -> Result<()>;
    async fn committed_offsets_of(
        &self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<Option<CommittedOffset>>>;
    async fn all_committed_offsets(&self, group: &str) -> Result<Vec<(TopicPartition, CommittedOffset)>>;
    async fn delete_offsets(&self, group: &str, partitions: &[TopicPartition]) -> Result<()>;
    /// Deletes the offsets of `partitions` that expired at `now_ms` (by
    /// their own expiry time, or committed at or before `cutoff_ms`:
    /// [`CommittedOffset::expired`]); how many went.
    async fn expire_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
        now_ms: i64,
        cutoff_ms: i64,
    ) -> Result<i64>;
    async fn delete_group_offsets(&self, group: &str) -> Result<bool>;
    async fn groups_with_offsets(&self) -> Result<Vec<String>>;
    /// Groups with a stored snapshot, offsets or not.
    async fn groups_with_snapshots(&self) -> Result<Vec<String>>;
    /// Whether `group` has committed offsets, or offsets an open
    /// transaction staged for it.
    async fn group_has_offsets(&self, group: &str) -> Result<bool> {
        Ok(self.groups_with_offsets().await?.iter().any(|g| g == group))
    }
    /// The group has no members left: its offsets expire after
    /// `retention` (or later: an offset's own retention); when they expire
    /// now, if that is known.
    async fn group_emptied(&self, group: &str, retention: Duration) -> Result<Option<i64>>;
    /// Waits until the replicas acks=all waits for have the group's
    /// keys' expiry, no earlier than `at` (after a commit to a group
    /// without members, whose offsets keep the retention
    /// [`Storage::group_emptied`] set). Nothing to wait for by default.
    async fn confirm_group_retention(&self, _group: &str, _at: Option<i64>) -> Result<()> {
        Ok(())
    }
    /// As [`Storage::group_emptied`], unless its keys expire already.
    async fn group_idle(&self, group: &str, retention: Duration) -> Result<()>;
    async fn group_active(&self, group: &str) -> Result<()>;
    /// Stores a group's snapshot unless a newer generation is stored (false).
    async fn store_group(&self, group: &str, generation: i32, snapshot: bytes::Bytes) -> Result<bool>;
    async fn load_group(&self, group: &str) -> Result<Option<bytes::Bytes>>;

    // ---- users and ACLs (ketch_storage's security module) ----
    async fn scram_credential(&self, mechanism: &str, user: &str) -> Result<Option<String>>;
    async fn set_scram_credential(&self, mechanism: &str, user: &str, credential: &str) -> Result<()>;
    /// Several credential changes in one atomic write.
    async fn alter_scram_credentials(&self, changes: &[ScramChange]) -> Result<()>;
    async fn scram_credentials(&self) -> Result<Vec<StoredCredential>>;
    async fn acls(&self) -> Result<(u64, Vec<String>)>;
    async fn acl_version(&self) -> Result<u64>;
    async fn add_acls(&self, bindings: &[String]) -> Result<usize>;
    async fn remove_acls(&self, bindings: &[String]) -> Result<usize>;
    /// The wake-up channel ACL changes are announced on.
    fn acl_channel(&self) -> String;
    /// The secret gateways prove to each other on the internal listener;
    /// `keep`, the one this gateway holds, is written back if the key is
    /// gone (else a fresh one is made).
    async fn internal_secret(&self, keep: Option<&[u8]>) -> Result<Vec<u8>>;

    // ---- client quotas (ketch_storage's quotas module) ----
    async fn client_quotas(&self) -> Result<(u64, Vec<StoredQuota>)>;
    async fn client_quota_version(&self) -> Result<u64>;
    async fn change_client_quotas(&self, changes: &[QuotaChange]) -> Result<u64>;
    /// Takes a client's controller mutation tokens from the bucket every
    /// gateway shares: whether taken, and the tokens left.
    async fn take_mutation_tokens(
        &self,
        client: &str,
        rate: f64,
        burst: f64,
        take: i32,
        strict: bool,
    ) -> Result<(bool, f64)>;
    /// The wake-up channel quota changes are announced on.
    fn quota_channel(&self) -> String;

    // ---- cluster-wide broker configs (ketch_storage's cluster_configs module) ----
    async fn cluster_configs(&self) -> Result<(u64, BTreeMap<String, String>)>;
    async fn cluster_config_version(&self) -> Result<u64>;
    /// Applies `changes` if the version is still `version`; the new
    /// version, or `None` when another change came first.
    async fn change_cluster_configs(
        &self,
        version: u64,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<Option<u64>>;
    /// The wake-up channel cluster config changes are announced on.
    fn cluster_config_channel(&self) -> String;

    // ---- transactions (ketch_storage::transactions; Redis only) ----
    async fn txn_init(
        &self,
        id: &str,
        timeout_ms: i64,
        fresh: i64,
        named: (i64, i16),
        ttl_ms: i64,
    ) -> Result<TxnReply> {
        let _ = (id, timeout_ms, fresh, named, ttl_ms);
        Err(no_transactions())
    }
    async fn txn_add(
        &self,
        id: &str,
        producer: (i64, i16),
        kind: TxnItems,
        items: &serde_json::Value,
        ttl_ms: i64,
    ) -> Result<TxnReply> {
        let _ = (id, producer, kind, items, ttl_ms);
        Err(no_transactions())
    }
    async fn txn_end(&self, id: &str, producer: (i64, i16), commit: bool, ttl_ms: i64) -> Result<TxnReply> {
        let _ = (id, producer, commit, ttl_ms);
        Err(no_transactions())
    }
    async fn txn_complete(&self, id: &str, number: i64, ttl_ms: i64) -> Result<bool> {
        let _ = (id, number, ttl_ms);
        Err(no_transactions())
    }
    async fn txn_expire(&self, id: &str, seen: f64, grace_ms: i64, ttl_ms: i64) -> Result<TxnReply> {
        let _ = (id, seen, grace_ms, ttl_ms);
        Err(no_transactions())
    }
    async fn txn_schedule(&self, id: &str, due_ms: i64) -> Result<()> {
        let _ = (id, due_ms);
        Err(no_transactions())
    }
    async fn txn_schedule_if_listed(&self, id: &str, due_ms: i64) -> Result<()> {
        let _ = (id, due_ms);
        Err(no_transactions())
    }
    async fn txn_schedule_deadline(&self, id: &str, deadline_ms: i64, opened: bool) -> Result<()> {
        let _ = (id, deadline_ms, opened);
        Err(no_transactions())
    }
    async fn txn_describe(&self, id: &str) -> Result<Option<TxnState>> {
        let _ = id;
        Err(no_transactions())
    }
    /// [`Storage::txn_describe`] of each of `ids`, in their order.
    async fn txn_describe_many(&self, ids: &[String]) -> Result<Vec<Option<TxnState>>> {
        let mut states = Vec::with_capacity(ids.len());
        for id in ids {
            states.push(self.txn_describe(id).await?);
        }
        Ok(states)
    }
    async fn txn_due(&self, now_ms: i64, offset: usize, limit: usize) -> Result<Vec<(String, f64)>> {
        let _ = (now_ms, offset, limit);
        Ok(Vec::new())
    }
    async fn txn_ids(&self) -> Result<Vec<(String, Option<i64>)>> {
        Ok(Vec::new())
    }
    async fn txn_forget(&self, id: &str) -> Result<()> {
        let _ = id;
        Ok(())
    }
    /// Idle transactional ids, `limit` of them from `offset`.
    async fn txn_idle_ids(&self, offset: usize, limit: usize) -> Result<Vec<String>> {
        let _ = (offset, limit);
        Ok(Vec::new())
    }
    async fn txn_join(
        &self,
        topic: &Topic,
        partition: i32,
        producer: (i64, i16),
        number: i64,
    ) -> Result<JoinReply> {
        let _ = (topic, partition, producer, number);
        Err(no_transactions())
    }
    async fn write_marker(&self, topic: &Topic, partition: i32, decided: &Decided) -> Result<bool> {
        let _ = (topic, partition, decided);
        Err(no_transactions())
    }
    async fn aborted_transactions(
        &self,
        topic: &Topic,
        partition: i32,
        (from, to): (i64, i64),
        span: i64,
    ) -> Result<Vec<(i64, i64)>> {
        let _ = (topic, partition, from, to, span);
        Ok(Vec::new())
    }
    async fn producer_states(
        &self,
        topic: &Topic,
        partition: i32,
    ) -> Result<Vec<(i64, ketch_storage::ProducerSummary)>> {
        let _ = (topic, partition);
        Ok(Vec::new())
    }
    async fn stage_txn_offsets(
        &self,
        group: &str,
        transaction: &StagingTxn<'_>,
        offsets: &[(TopicPartition, CommittedOffset)],
    ) -> Result<()> {
        let _ = (group, transaction, offsets);
        Err(no_transactions())
    }
    /// Applies (commit) or drops (abort) what `decided` staged for
    /// `group`; offsets applied to a group without members renew their
    /// `retention`, as a plain commit's do.
    async fn apply_txn_offsets(&self, group: &str, decided: &Decided, retention: Duration) -> Result<()> {
        let _ = (group, decided, retention);
        Err(no_transactions())
    }
    async fn unstable_partitions(&self, group: &str) -> Result<HashSet<TopicPartition>> {
        let _ = group;
        Ok(HashSet::new())
    }
}

/// What storage without Redis answers to transactional requests.
fn no_transactions() -> ketch_storage::StorageError {
    ketch_storage::StorageError::Unavailable("transactions are kept in Redis only".to_owned())
}

/// Redis, with reads below the local start served from the archive.
pub struct Tiered {
    pub store: Store,
    pub tiers: Tiers,
}

#[async_trait]
impl Storage for Tiered {
    async fn ping(&self) -> Result<()> {
        self.store.ping().await
    }

    fn wake(&self) -> &WakeHub {
        self.store.wake()
    }

    async fn topic(&self, name: &str) -> Result<Option<Arc<Topic>>> {
        self.store.topic(name).await
    }

    async fn topic_fresh(&self, name: &str) -> Result<Option<Arc<Topic>>> {
        self.store.topic_fresh(name).await
    }

    async fn topic_fresher_than(&self, name: &str, age: Duration) -> Result<Option<Arc<Topic>>> {
        self.store.topic_fresher_than(name, age).await
    }

    async fn topic_by_id(&self, id: uuid::Uuid) -> Result<Option<Arc<Topic>>> {
        self.store.topic_by_id(id).await
    }

    async fn all_topics(&self) -> Result<Vec<Arc<Topic>>> {
        self.store.all_topics().await
    }

    fn listed_topic_names(&self) -> Option<(std::time::Instant, std::collections::HashSet<String>)> {
        self.store.listed_topic_names()
    }

    async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
    ) -> Result<Arc<Topic>> {
        self.store.create_topic(name, partitions, configs).await
    }

    async fn delete_topic(&self, name: &str, id: Option<uuid::Uuid>) -> Result<Arc<Topic>> {
        self.store.delete_topic(name, id).await
    }

    async fn set_topic_configs(
        &self,
        topic: &Topic,
        configs: BTreeMap<String, String>,
    ) -> Result<Arc<Topic>> {
        self.store.set_topic_configs(topic, configs).await
    }

    async fn partition_memory(&self, topic: &Topic, partition: i32) -> Result<Option<i64>> {
        self.store.partition_memory(topic, partition).await.map(Some)
    }

    async fn segments(&self, topic: &Topic, partition: i32) -> Result<Vec<ketch_storage::segments::Segment>> {
        self.store.segments(topic, partition).await
    }

    async fn server_info(&self) -> Result<Vec<(String, Result<String>)>> {
        self.store.server_info().await
    }

    async fn add_partitions(&self, topic: &Topic, total: i32) -> Result<Arc<Topic>> {
        self.store.add_partitions(topic, total).await
    }

    async fn append(
        &self,
        topic: &Topic,
        partition: i32,
        batch: &Bytes,
        header: &BatchHeader,
        acks_all: bool,
    ) -> Result<AppendOutcome> {
        self.store.append(topic, partition, batch, header, acks_all).await
    }

    async fn offsets(&self, topic: &Topic, partition: i32) -> Result<PartitionOffsets> {
        self.store.offsets(topic, partition).await
    }

    async fn ready_for_archive(&self, topic: &Topic, partition: i32, check: bool) -> Result<bool> {
        self.store.ready_for_archive(topic, partition, check).await
    }

    async fn read(&self, topic: &Topic, partition: i32, request: &ReadRequest) -> Result<ReadPartition> {
        self.tiers.read(topic, partition, request).await
    }

    fn bytes_estimate(&self, topic: &Topic, partition: i32, records: i64) -> Option<usize> {
        self.store.bytes_estimate(topic, partition, records)
    }

    async fn offset_for_timestamp(
        &self,
        topic: &Topic,
        partition: i32,
        timestamp: i64,
    ) -> Result<Option<(i64, i64)>> {
        self.tiers.offset_for_timestamp(topic, partition, timestamp).await
    }

    async fn max_timestamp(&self, topic: &Topic, partition: i32) -> Result<Option<(i64, i64)>> {
        self.tiers.max_timestamp(topic, partition).await
    }

    async fn delete_records(&self, topic: &Topic, partition: i32, offset: i64) -> Result<i64> {
        self.store.delete_records(topic, partition, offset).await
    }

    async fn new_producer_id(&self) -> Result<i64> {
        self.store.new_producer_id().await
    }

    async fn commit_offsets(&self, group: &str, offsets: &[(TopicPartition, CommittedOffset)]) -> Result<()> {
        self.store.commit_offsets(group, offsets).await
    }

    async fn committed_offsets_of(
        &self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<Option<CommittedOffset>>> {
        self.store.committed_offsets_of(group, topic, partitions).await
    }

    async fn all_committed_offsets(&self, group: &str) -> Result<Vec<(TopicPartition, CommittedOffset)>> {
        self.store.all_committed_offsets(group).await
    }

    async fn delete_offsets(&self, group: &str, partitions: &[TopicPartition]) -> Result<()> {
        self.store.delete_offsets(group, partitions).await
    }

    async fn expire_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
        now_ms: i64,
        cutoff_ms: i64,
    ) -> Result<i64> {
        self.store
            .expire_offsets(group, partitions, now_ms, cutoff_ms)
            .await
    }

    async fn delete_group_offsets(&self, group: &str) -> Result<bool> {
        self.store.delete_group_offsets(group).await
    }

    async fn group_has_offsets(&self, group: &str) -> Result<bool> {
        self.store.group_has_offsets(group).await
    }

    async fn groups_with_offsets(&self) -> Result<Vec<String>> {
        self.store.groups_with_offsets().await
    }

    async fn groups_with_snapshots(&self) -> Result<Vec<String>> {
        self.store.groups_with_snapshots().await
    }

    async fn group_emptied(&self, group: &str, retention: Duration) -> Result<Option<i64>> {
        self.store.group_emptied(group, retention).await
    }

    async fn confirm_group_retention(&self, group: &str, at: Option<i64>) -> Result<()> {
        self.store.confirm_group_retention(group, at).await
    }

    async fn group_idle(&self, group: &str, retention: Duration) -> Result<()> {
        self.store.group_idle(group, retention).await
    }

    async fn group_active(&self, group: &str) -> Result<()> {
        self.store.group_active(group).await
    }

    async fn store_group(&self, group: &str, generation: i32, snapshot: bytes::Bytes) -> Result<bool> {
        self.store.store_group(group, generation, &snapshot).await
    }

    async fn load_group(&self, group: &str) -> Result<Option<bytes::Bytes>> {
        Ok(self.store.load_group(group).await?.map(bytes::Bytes::from))
    }

    async fn scram_credential(&self, mechanism: &str, user: &str) -> Result<Option<String>> {
        self.store.scram_credential(mechanism, user).await
    }

    async fn set_scram_credential(&self, mechanism: &str, user: &str, credential: &str) -> Result<()> {
        self.store.set_scram_credential(mechanism, user, credential).await
    }

    async fn alter_scram_credentials(&self, changes: &[ScramChange]) -> Result<()> {
        self.store.alter_scram_credentials(changes).await
    }

    async fn scram_credentials(&self) -> Result<Vec<StoredCredential>> {
        self.store.scram_credentials().await
    }

    async fn acls(&self) -> Result<(u64, Vec<String>)> {
        self.store.acls().await
    }

    async fn acl_version(&self) -> Result<u64> {
        self.store.acl_version().await
    }

    async fn add_acls(&self, bindings: &[String]) -> Result<usize> {
        self.store.add_acls(bindings).await
    }

    async fn remove_acls(&self, bindings: &[String]) -> Result<usize> {
        self.store.remove_acls(bindings).await
    }

    fn acl_channel(&self) -> String {
        self.store.acl_channel()
    }

    async fn internal_secret(&self, keep: Option<&[u8]>) -> Result<Vec<u8>> {
        self.store.internal_secret(keep).await
    }

    async fn client_quotas(&self) -> Result<(u64, Vec<StoredQuota>)> {
        self.store.client_quotas().await
    }

    async fn client_quota_version(&self) -> Result<u64> {
        self.store.client_quota_version().await
    }

    async fn change_client_quotas(&self, changes: &[QuotaChange]) -> Result<u64> {
        self.store.change_client_quotas(changes).await
    }

    async fn take_mutation_tokens(
        &self,
        client: &str,
        rate: f64,
        burst: f64,
        take: i32,
        strict: bool,
    ) -> Result<(bool, f64)> {
        self.store
            .take_mutation_tokens(client, rate, burst, take, strict)
            .await
    }

    fn quota_channel(&self) -> String {
        self.store.quota_channel()
    }

    async fn cluster_configs(&self) -> Result<(u64, BTreeMap<String, String>)> {
        self.store.cluster_configs().await
    }

    async fn cluster_config_version(&self) -> Result<u64> {
        self.store.cluster_config_version().await
    }

    async fn change_cluster_configs(
        &self,
        version: u64,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<Option<u64>> {
        self.store.change_cluster_configs(version, changes).await
    }

    fn cluster_config_channel(&self) -> String {
        self.store.cluster_config_channel()
    }

    async fn txn_init(
        &self,
        id: &str,
        timeout_ms: i64,
        fresh: i64,
        named: (i64, i16),
        ttl_ms: i64,
    ) -> Result<TxnReply> {
        self.store.txn_init(id, timeout_ms, fresh, named, ttl_ms).await
    }
    async fn txn_add(
        &self,
        id: &str,
        producer: (i64, i16),
        kind: TxnItems,
        items: &serde_json::Value,
        ttl_ms: i64,
    ) -> Result<TxnReply> {
        self.store.txn_add(id, producer, kind, items, ttl_ms).await
    }
    async fn txn_end(&self, id: &str, producer: (i64, i16), commit: bool, ttl_ms: i64) -> Result<TxnReply> {
        self.store.txn_end(id, producer, commit, ttl_ms).await
    }
    async fn txn_complete(&self, id: &str, number: i64, ttl_ms: i64) -> Result<bool> {
        self.store.txn_complete(id, number, ttl_ms).await
    }
    async fn txn_expire(&self, id: &str, seen: f64, grace_ms: i64, ttl_ms: i64) -> Result<TxnReply> {
        self.store.txn_expire(id, seen, grace_ms, ttl_ms).await
    }
    async fn txn_schedule(&self, id: &str, due_ms: i64) -> Result<()> {
        self.store.txn_schedule(id, due_ms).await
    }
    async fn txn_schedule_if_listed(&self, id: &str, due_ms: i64) -> Result<()> {
        self.store.txn_schedule_if_listed(id, due_ms).await
    }
    async fn txn_schedule_deadline(&self, id: &str, deadline_ms: i64, opened: bool) -> Result<()> {
        self.store.txn_schedule_deadline(id, deadline_ms, opened).await
    }
    async fn txn_describe(&self, id: &str) -> Result<Option<TxnState>> {
        self.store.txn_describe(id).await
    }
    async fn txn_describe_many(&self, ids: &[String]) -> Result<Vec<Option<TxnState>>> {
        self.store.txn_describe_many(ids).await
    }
    async fn txn_due(&self, now_ms: i64, offset: usize, limit: usize) -> Result<Vec<(String, f64)>> {
        self.store.txn_due(now_ms, offset, limit).await
    }
    async fn txn_ids(&self) -> Result<Vec<(String, Option<i64>)>> {
        self.store.txn_ids().await
    }
    async fn txn_forget(&self, id: &str) -> Result<()> {
        self.store.txn_forget(id).await
    }
    async fn txn_idle_ids(&self, offset: usize, limit: usize) -> Result<Vec<String>> {
        self.store.txn_idle_ids(offset, limit).await
    }
    async fn txn_join(
        &self,
        topic: &Topic,
        partition: i32,
        producer: (i64, i16),
        number: i64,
    ) -> Result<JoinReply> {
        self.store.txn_join(topic, partition, producer, number).await
    }
    async fn write_marker(&self, topic: &Topic, partition: i32, decided: &Decided) -> Result<bool> {
        self.store.write_marker(topic, partition, decided).await
    }
    async fn aborted_transactions(
        &self,
        topic: &Topic,
        partition: i32,
        range: (i64, i64),
        span: i64,
    ) -> Result<Vec<(i64, i64)>> {
        self.store
            .aborted_transactions(topic, partition, range, span)
            .await
    }
    async fn producer_states(
        &self,
        topic: &Topic,
        partition: i32,
    ) -> Result<Vec<(i64, ketch_storage::ProducerSummary)>> {
        self.store.producer_states(topic, partition).await
    }
    async fn stage_txn_offsets(
        &self,
        group: &str,
        transaction: &StagingTxn<'_>,
        offsets: &[(TopicPartition, CommittedOffset)],
    ) -> Result<()> {
        self.store.stage_txn_offsets(group, transaction, offsets).await
    }
    async fn apply_txn_offsets(&self, group: &str, decided: &Decided, retention: Duration) -> Result<()> {
        self.store.apply_txn_offsets(group, decided, retention).await
    }
    async fn unstable_partitions(&self, group: &str) -> Result<HashSet<TopicPartition>> {
        self.store.unstable_partitions(group).await
    }
}

/// What a gateway keeps in memory of a versioned set stored in Redis (the
/// ACLs, the client quotas, the cluster-wide topic defaults), for
/// [`keep_current`].
pub struct Kept {
    /// What it is, for the log.
    pub what: &'static str,
    /// The wake-up channel its changes are announced on.
    pub channel: String,
    /// The version stored in Redis.
    pub stored: for<'a> fn(&'a crate::Context) -> futures::future::BoxFuture<'a, Result<u64>>,
    /// The version this gateway holds.
    pub held: fn(&crate::Context) -> u64,
    /// Loads it from Redis into this gateway; a summary for the log.
    pub load: for<'a> fn(&'a crate::Context) -> futures::future::BoxFuture<'a, Result<String>>,
    /// Work to do on every check (expiring what is unused).
    pub tick: fn(&crate::Context),
    /// How often the version is checked besides the announcements.
    pub check_every: Duration,
}

/// Keeps `kept` current in this gateway: reloads it when any gateway
/// announces a change (sharded pub/sub), and checks the version every
/// `kept.check_every` in case an announcement was missed (Redis restarted,
/// the subscription was being established). Runs until shutdown.
///
/// How long ago this gateway last confirmed it holds the current version
/// is `ketch_shared_state_age_seconds`; past `STALE_AFTER` checks without
/// one (Redis, or the master holding the set, out of reach), a warning
/// says so, once, and another when it is confirmed again: a DENY added
/// through another gateway is not applied here meanwhile.
pub async fn keep_current(ctx: Arc<crate::Context>, kept: Kept) {
    const STALE_AFTER: u32 = 3;
    let watch = ctx.storage.wake().watch(vec![kept.channel.clone()]);
    let mut shutdown = ctx.shutdown.clone();
    let mut loaded = false;
    let mut confirmed = std::time::Instant::now();
    let mut warned = false;
    let age = metrics::gauge!("ketch_shared_state_age_seconds", "state" => kept.what);
    loop {
        let current = match (kept.stored)(&ctx).await {
            Ok(version) if loaded && version == (kept.held)(&ctx) => true,
            Ok(_) => match (kept.load)(&ctx).await {
                Ok(summary) => {
                    if !loaded {
                        tracing::info!(summary, "loaded the {}", kept.what);
                    }
                    loaded = true;
                    true
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the {}; retrying", kept.what);
                    false
                }
            },
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the version of the {}; retrying", kept.what);
                false
            }
        };
        if current {
            confirmed = std::time::Instant::now();
            if std::mem::take(&mut warned) {
                tracing::warn!("the {} held here are current again", kept.what);
            }
        } else if loaded && !warned && confirmed.elapsed() >= kept.check_every * STALE_AFTER {
            warned = true;
            tracing::warn!(
                unconfirmed_s = confirmed.elapsed().as_secs(),
                "the {} held here may be stale: Redis has not answered for their version; changes made \
                 through other gateways are not applied here until it does",
                kept.what
            );
        }
        age.set(confirmed.elapsed().as_secs_f64());
        (kept.tick)(&ctx);
        let wait = if loaded {
            kept.check_every
        } else {
            Duration::from_millis(500)
        };
        tokio::select! {
            _ = watch.notified() => { watch.take_fired(); }
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}
