//! Storage kept in this process's memory, behind the same [`Storage`] seam
//! as Redis: for the request fuzz target and tests that exercise the Kafka
//! APIs without a Redis server. Partitions hold their batches verbatim,
//! offsets are dense, committed offsets are kept per group; idempotent
//! producer state, tiering and durability are not modelled. Everything it
//! holds is bounded ([`MEMORY_LIMIT_BYTES`], [`MAX_TOPICS`]), so a fuzzer
//! cannot make it grow without end.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use ketch_storage::batch::{self, BatchHeader, Records};
use ketch_storage::{
    AppendOutcome, CommittedOffset, Keys, PartitionOffsets, QuotaChange, ReadPartition, ReadRequest, Result,
    ScramChange, StorageError, StoredCredential, StoredQuota, Topic, TopicPartition, WakeHub,
};

use crate::storage::Storage;

/// Batch bytes stored at most, over all partitions.
pub const MEMORY_LIMIT_BYTES: usize = 64 * 1024 * 1024;
/// Topics at most.
pub const MAX_TOPICS: usize = 10_000;

/// Storage in memory.
pub struct MemoryStorage {
    keys: Keys,
    wake: WakeHub,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    topics: BTreeMap<String, Arc<Topic>>,
    partitions: HashMap<String, Partition>,
    groups: BTreeMap<String, BTreeMap<TopicPartition, CommittedOffset>>,
    /// Group snapshots: (generation, bytes).
    group_states: HashMap<String, (i32, bytes::Bytes)>,
    /// Groups whose offsets would expire (Redis's TTL, set when a group
    /// is emptied, removed when it is active), the last of each.
    expiring: HashMap<String, bool>,
    /// Group snapshots are refused, as by a Redis that cannot write.
    #[cfg(test)]
    refuse_group_stores: bool,
    /// Group snapshot reads fail (as Redis unavailable would).
    refuse_group_loads: bool,
    /// SCRAM credentials by (mechanism, user).
    credentials: BTreeMap<(String, String), String>,
    acls: std::collections::BTreeSet<String>,
    acl_version: u64,
    /// Client quotas: (entity, key) → value.
    quotas: BTreeMap<(String, String), String>,
    quota_version: u64,
    /// Cluster-wide broker configs: name → value.
    cluster_configs: BTreeMap<String, String>,
    cluster_config_version: u64,
    next_producer_id: i64,
    stored_bytes: usize,
}

#[derive(Default)]
struct Partition {
    log_start: i64,
    next_offset: i64,
    /// (base offset, batch with its base offset set), in offset order.
    batches: Vec<(i64, Bytes)>,
}

impl Default for MemoryStorage {
    fn default() -> Self {
        Self {
            keys: Keys::new("ketch"),
            wake: WakeHub::in_process(),
            state: Mutex::new(State {
                next_producer_id: 1000,
                ..State::default()
            }),
        }
    }
}

/// A partition's identity in the maps: its wake-up channel, unique per
/// topic id and partition.
fn partition_id(topic: &Topic, partition: i32) -> Result<String> {
    topic
        .wake_channel(partition)
        .map(str::to_owned)
        .ok_or(StorageError::UnknownTopicOrPartition)
}

impl MemoryStorage {
    /// Refuses group snapshots from now on (`true`), as a Redis that cannot
    /// write does, or takes them again.
    #[cfg(test)]
    pub(crate) fn refuse_group_stores(&self, refuse: bool) {
        self.state().refuse_group_stores = refuse;
    }

    /// Makes group snapshot reads fail until told otherwise.
    #[cfg(test)]
    pub(crate) fn refuse_group_loads(&self, refuse: bool) {
        self.state().refuse_group_loads = refuse;
    }

    /// Whether the group's offsets would expire now (`None`: never told).
    #[cfg(test)]
    pub(crate) fn expiring(&self, group: &str) -> Option<bool> {
        self.state().expiring.get(group).copied()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn with_partition<T>(
        &self,
        topic: &Topic,
        partition: i32,
        f: impl FnOnce(&mut Partition, &mut usize) -> Result<T>,
    ) -> Result<T> {
        let id = partition_id(topic, partition)?;
        let mut state = self.state();
        let state = &mut *state;
        let found = state
            .partitions
            .get_mut(&id)
            .ok_or(StorageError::UnknownTopicOrPartition)?;
        f(found, &mut state.stored_bytes)
    }

    /// The first record from `start` on whose timestamp satisfies `pred`.
    fn scan(
        &self,
        topic: &Topic,
        partition: i32,
        mut pred: impl FnMut(i64) -> bool,
    ) -> Result<Option<(i64, i64)>> {
        let batches = self.with_partition(topic, partition, |p, _| Ok(p.batches.clone()))?;
        for (base, bytes) in batches {
            let header = batch::header(&bytes)?;
            let mut records = Records::of_batch(&bytes)?;
            while let Some(record) = records.next_meta()? {
                let timestamp = if header.is_log_append_time() {
                    header.max_timestamp
                } else {
                    record.timestamp
                };
                if pred(timestamp) {
                    return Ok(Some((base + i64::from(record.offset_delta), timestamp)));
                }
            }
        }
        Ok(None)
    }
}

#[async_trait]
impl Storage for MemoryStorage {
    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    fn wake(&self) -> &WakeHub {
        &self.wake
    }

    async fn topic(&self, name: &str) -> Result<Option<Arc<Topic>>> {
        Ok(self.state().topics.get(name).cloned())
    }

    async fn topic_fresh(&self, name: &str) -> Result<Option<Arc<Topic>>> {
        self.topic(name).await
    }

    async fn topic_fresher_than(&self, name: &str, _age: Duration) -> Result<Option<Arc<Topic>>> {
        self.topic(name).await
    }

    async fn topic_by_id(&self, id: uuid::Uuid) -> Result<Option<Arc<Topic>>> {
        Ok(self.state().topics.values().find(|t| t.id == id).cloned())
    }

    async fn all_topics(&self) -> Result<Vec<Arc<Topic>>> {
        Ok(self.state().topics.values().cloned().collect())
    }

    async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
    ) -> Result<Arc<Topic>> {
        let mut state = self.state();
        if state.topics.contains_key(name) {
            return Err(StorageError::TopicExists);
        }
        if state.topics.len() >= MAX_TOPICS {
            return Err(StorageError::Unavailable(format!(
                "memory storage holds {MAX_TOPICS} topics"
            )));
        }
        let id = uuid::Uuid::new_v4();
        let tags = (0..partitions)
            .map(|p| ketch_storage::keys::default_tag(&id, p))
            .collect();
        let topic = Arc::new(Topic::new(name, id, tags, configs, &self.keys));
        for p in 0..partitions {
            state
                .partitions
                .insert(partition_id(&topic, p)?, Partition::default());
        }
        state.topics.insert(name.to_owned(), topic.clone());
        Ok(topic)
    }

    async fn delete_topic(&self, name: &str, id: Option<uuid::Uuid>) -> Result<Arc<Topic>> {
        let mut state = self.state();
        if state
            .topics
            .get(name)
            .is_none_or(|t| id.is_some_and(|id| t.id != id))
        {
            return Err(StorageError::UnknownTopicOrPartition);
        }
        let topic = state
            .topics
            .remove(name)
            .ok_or(StorageError::UnknownTopicOrPartition)?;
        for p in 0..topic.partitions() {
            if let Some(gone) = state.partitions.remove(&partition_id(&topic, p)?) {
                state.stored_bytes -= gone.batches.iter().map(|(_, b)| b.len()).sum::<usize>();
            }
        }
        Ok(topic)
    }

    async fn set_topic_configs(
        &self,
        topic: &Topic,
        configs: BTreeMap<String, String>,
    ) -> Result<Arc<Topic>> {
        let mut state = self.state();
        let current = state
            .topics
            .get(&topic.name)
            .filter(|t| t.id == topic.id)
            .ok_or(StorageError::UnknownTopicOrPartition)?;
        if current.configs != topic.configs {
            return Err(StorageError::Conflict(format!(
                "topic {} changed meanwhile",
                topic.name
            )));
        }
        let changed = Arc::new(current.with_configs(configs));
        state.topics.insert(topic.name.clone(), changed.clone());
        Ok(changed)
    }

    async fn partition_memory(&self, _topic: &Topic, _partition: i32) -> Result<Option<i64>> {
        Ok(None)
    }

    async fn segments(
        &self,
        _topic: &Topic,
        _partition: i32,
    ) -> Result<Vec<ketch_storage::segments::Segment>> {
        Ok(Vec::new())
    }

    async fn server_info(&self) -> Result<Vec<(String, Result<String>)>> {
        Ok(Vec::new())
    }

    async fn add_partitions(&self, topic: &Topic, total: i32) -> Result<Arc<Topic>> {
        let mut state = self.state();
        let current = state
            .topics
            .get(&topic.name)
            .filter(|t| t.id == topic.id)
            .cloned()
            .ok_or(StorageError::UnknownTopicOrPartition)?;
        if current.partitions() != topic.partitions() {
            return Err(StorageError::Conflict(format!(
                "topic {} changed meanwhile",
                topic.name
            )));
        }
        let grown = Arc::new(current.grown(total, &self.keys));
        for p in current.partitions()..total {
            state
                .partitions
                .insert(partition_id(&grown, p)?, Partition::default());
        }
        state.topics.insert(grown.name.clone(), grown.clone());
        Ok(grown)
    }

    async fn append(
        &self,
        topic: &Topic,
        partition: i32,
        batch: &Bytes,
        header: &BatchHeader,
        _acks_all: bool,
    ) -> Result<AppendOutcome> {
        let (outcome, next_offset) = self.with_partition(topic, partition, |p, stored| {
            if *stored + batch.len() > MEMORY_LIMIT_BYTES {
                return Err(StorageError::Unavailable(format!(
                    "memory storage holds {MEMORY_LIMIT_BYTES} bytes"
                )));
            }
            let base = p.next_offset;
            let mut bytes = batch.to_vec();
            batch::patch_header(&mut bytes, base, 0);
            p.batches.push((base, Bytes::from(bytes)));
            p.next_offset += i64::from(header.record_count);
            *stored += batch.len();
            let outcome = AppendOutcome {
                base_offset: base,
                log_start_offset: p.log_start,
                duplicate: false,
            };
            Ok((outcome, p.next_offset))
        })?;
        if let Some(channel) = topic.wake_channel(partition) {
            self.wake
                .appended(channel, Some(next_offset), Some(outcome.log_start_offset));
        }
        Ok(outcome)
    }

    async fn offsets(&self, topic: &Topic, partition: i32) -> Result<PartitionOffsets> {
        self.with_partition(topic, partition, |p, _| {
            Ok(PartitionOffsets::plain(p.log_start, p.log_start, p.next_offset))
        })
    }

    fn bytes_estimate(&self, _topic: &Topic, _partition: i32, _records: i64) -> Option<usize> {
        // Reads cost nothing here: no partition needs reading ahead of
        // its turn.
        None
    }

    async fn read(&self, topic: &Topic, partition: i32, request: &ReadRequest) -> Result<ReadPartition> {
        self.with_partition(topic, partition, |p, _| {
            if request.offset < p.log_start || request.offset > p.next_offset {
                return Err(StorageError::OffsetOutOfRange {
                    log_start: p.log_start,
                    high_watermark: p.next_offset,
                });
            }
            let first = p.batches.partition_point(|(base, bytes)| {
                let count = batch::header(bytes).map_or(1, |h| i64::from(h.record_count));
                base + count <= request.offset
            });
            let mut batches = Vec::new();
            let mut bytes = 0;
            for (_, batch) in &p.batches[first..] {
                if bytes >= request.max_bytes && !batches.is_empty() {
                    break;
                }
                bytes += batch.len();
                batches.push(batch.clone());
            }
            Ok(ReadPartition {
                offsets: Some(PartitionOffsets::plain(p.log_start, p.log_start, p.next_offset)),
                batches,
            })
        })
    }

    async fn offset_for_timestamp(
        &self,
        topic: &Topic,
        partition: i32,
        timestamp: i64,
    ) -> Result<Option<(i64, i64)>> {
        self.scan(topic, partition, |ts| ts >= timestamp)
    }

    async fn max_timestamp(&self, topic: &Topic, partition: i32) -> Result<Option<(i64, i64)>> {
        let mut largest = None;
        self.scan(topic, partition, |ts| {
            largest = Some(largest.map_or(ts, |l: i64| l.max(ts)));
            false
        })?;
        let Some(largest) = largest else { return Ok(None) };
        self.scan(topic, partition, |ts| ts == largest)
    }

    async fn delete_records(&self, topic: &Topic, partition: i32, offset: i64) -> Result<i64> {
        self.with_partition(topic, partition, |p, stored| {
            let target = if offset == -1 { p.next_offset } else { offset };
            if target < 0 || target > p.next_offset {
                return Err(StorageError::OffsetOutOfRange {
                    log_start: 0,
                    high_watermark: p.next_offset,
                });
            }
            if target > p.log_start {
                p.log_start = target;
                p.batches.retain(|(base, bytes)| {
                    let count = batch::header(bytes).map_or(1, |h| i64::from(h.record_count));
                    let keep = base + count > target;
                    if !keep {
                        *stored -= bytes.len();
                    }
                    keep
                });
            }
            Ok(p.log_start)
        })
    }

    async fn new_producer_id(&self) -> Result<i64> {
        let mut state = self.state();
        state.next_producer_id += 1;
        Ok(state.next_producer_id)
    }

    async fn commit_offsets(&self, group: &str, offsets: &[(TopicPartition, CommittedOffset)]) -> Result<()> {
        let mut state = self.state();
        let committed = state.groups.entry(group.to_owned()).or_default();
        for (tp, offset) in offsets {
            committed.insert(tp.clone(), offset.clone());
        }
        Ok(())
    }

    async fn committed_offsets_of(
        &self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<Option<CommittedOffset>>> {
        let state = self.state();
        let committed = state.groups.get(group);
        Ok(partitions
            .iter()
            .map(|p| committed.and_then(|c| c.get(&(topic.to_owned(), *p)).cloned()))
            .collect())
    }

    async fn all_committed_offsets(&self, group: &str) -> Result<Vec<(TopicPartition, CommittedOffset)>> {
        let state = self.state();
        Ok(state
            .groups
            .get(group)
            .map(|c| c.iter().map(|(tp, o)| (tp.clone(), o.clone())).collect())
            .unwrap_or_default())
    }

    async fn delete_offsets(&self, group: &str, partitions: &[TopicPartition]) -> Result<()> {
        if let Some(committed) = self.state().groups.get_mut(group) {
            for tp in partitions {
                committed.remove(tp);
            }
        }
        Ok(())
    }

    async fn expire_offsets(
        &self,
        group: &str,
        partitions: &[TopicPartition],
        now_ms: i64,
        cutoff_ms: i64,
    ) -> Result<i64> {
        let mut expired = 0;
        if let Some(committed) = self.state().groups.get_mut(group) {
            for tp in partitions {
                if committed.get(tp).is_some_and(|o| o.expired(now_ms, cutoff_ms)) {
                    committed.remove(tp);
                    expired += 1;
                }
            }
        }
        Ok(expired)
    }

    async fn delete_group_offsets(&self, group: &str) -> Result<bool> {
        let mut state = self.state();
        state.group_states.remove(group);
        Ok(state.groups.remove(group).is_some_and(|c| !c.is_empty()))
    }

    async fn groups_with_offsets(&self) -> Result<Vec<String>> {
        let state = self.state();
        Ok(state
            .groups
            .iter()
            .filter(|(_, c)| !c.is_empty())
            .map(|(g, _)| g.clone())
            .collect())
    }

    async fn groups_with_snapshots(&self) -> Result<Vec<String>> {
        let mut groups: Vec<String> = self.state().group_states.keys().cloned().collect();
        groups.sort();
        Ok(groups)
    }

    async fn group_emptied(&self, group: &str, _retention: Duration) -> Result<Option<i64>> {
        self.state().expiring.insert(group.to_owned(), true);
        // This store keeps no times.
        Ok(None)
    }

    async fn group_idle(&self, group: &str, _retention: Duration) -> Result<()> {
        // Kept (false) or not yet expiring: expiring now; one expiring already
        // keeps its expiry (this store keeps no times).
        self.state().expiring.insert(group.to_owned(), true);
        Ok(())
    }

    async fn group_active(&self, group: &str) -> Result<()> {
        self.state().expiring.insert(group.to_owned(), false);
        Ok(())
    }

    async fn store_group(&self, group: &str, generation: i32, snapshot: bytes::Bytes) -> Result<bool> {
        let mut state = self.state();
        #[cfg(test)]
        if state.refuse_group_stores {
            return Err(StorageError::Unavailable("refused (a test's storage)".to_owned()));
        }
        if state
            .group_states
            .get(group)
            .is_some_and(|(stored, _)| *stored > generation)
        {
            return Ok(false);
        }
        state
            .group_states
            .insert(group.to_owned(), (generation, snapshot));
        Ok(true)
    }

    async fn load_group(&self, group: &str) -> Result<Option<bytes::Bytes>> {
        let state = self.state();
        if state.refuse_group_loads {
            return Err(StorageError::Unavailable("refused (a test's storage)".to_owned()));
        }
        Ok(state.group_states.get(group).map(|(_, b)| b.clone()))
    }

    async fn scram_credential(&self, mechanism: &str, user: &str) -> Result<Option<String>> {
        Ok(self
            .state()
            .credentials
            .get(&(mechanism.to_owned(), user.to_owned()))
            .cloned())
    }

    async fn set_scram_credential(&self, mechanism: &str, user: &str, credential: &str) -> Result<()> {
        self.state()
            .credentials
            .insert((mechanism.to_owned(), user.to_owned()), credential.to_owned());
        Ok(())
    }

    async fn alter_scram_credentials(&self, changes: &[ScramChange]) -> Result<()> {
        let mut state = self.state();
        for change in changes {
            match change {
                ScramChange::Set {
                    mechanism,
                    user,
                    credential,
                } => {
                    state
                        .credentials
                        .insert((mechanism.clone(), user.clone()), credential.clone());
                }
                ScramChange::Delete { mechanism, user } => {
                    state.credentials.remove(&(mechanism.clone(), user.clone()));
                }
            }
        }
        Ok(())
    }

    async fn scram_credentials(&self) -> Result<Vec<StoredCredential>> {
        let mut all: Vec<StoredCredential> = self
            .state()
            .credentials
            .iter()
            .map(|((mechanism, user), credential)| StoredCredential {
                user: user.clone(),
                mechanism: mechanism.clone(),
                credential: credential.clone(),
            })
            .collect();
        all.sort_by(|a, b| (&a.user, &a.mechanism).cmp(&(&b.user, &b.mechanism)));
        Ok(all)
    }

    async fn acls(&self) -> Result<(u64, Vec<String>)> {
        let state = self.state();
        Ok((state.acl_version, state.acls.iter().cloned().collect()))
    }

    async fn acl_version(&self) -> Result<u64> {
        Ok(self.state().acl_version)
    }

    async fn add_acls(&self, bindings: &[String]) -> Result<usize> {
        let mut state = self.state();
        let added = bindings
            .iter()
            .filter(|b| state.acls.insert((*b).clone()))
            .count();
        state.acl_version += 1;
        drop(state);
        self.wake.appended(&self.acl_channel(), None, None);
        Ok(added)
    }

    async fn remove_acls(&self, bindings: &[String]) -> Result<usize> {
        let mut state = self.state();
        let removed = bindings.iter().filter(|b| state.acls.remove(*b)).count();
        state.acl_version += 1;
        drop(state);
        self.wake.appended(&self.acl_channel(), None, None);
        Ok(removed)
    }

    fn acl_channel(&self) -> String {
        format!("{}:{{security}}:changed", self.keys.namespace())
    }

    async fn internal_secret(&self, _: Option<&[u8]>) -> Result<Vec<u8>> {
        Ok(b"the in-memory gateway's internal secret".to_vec())
    }

    async fn client_quotas(&self) -> Result<(u64, Vec<StoredQuota>)> {
        let state = self.state();
        let quotas = state
            .quotas
            .iter()
            .map(|((entity, key), value)| StoredQuota {
                entity: entity.clone(),
                key: key.clone(),
                value: value.clone(),
            })
            .collect();
        Ok((state.quota_version, quotas))
    }

    async fn client_quota_version(&self) -> Result<u64> {
        Ok(self.state().quota_version)
    }

    async fn take_mutation_tokens(&self, _: &str, _: f64, _: f64, _: i32, _: bool) -> Result<(bool, f64)> {
        // One gateway: its own buckets serve.
        Err(StorageError::Unavailable(
            "no shared mutation tokens in memory".to_owned(),
        ))
    }

    async fn change_client_quotas(&self, changes: &[QuotaChange]) -> Result<u64> {
        let mut state = self.state();
        for change in changes {
            let field = (change.entity.clone(), change.key.clone());
            match &change.value {
                Some(value) => state.quotas.insert(field, value.clone()),
                None => state.quotas.remove(&field),
            };
        }
        state.quota_version += 1;
        let version = state.quota_version;
        drop(state);
        self.wake.appended(&self.quota_channel(), None, None);
        Ok(version)
    }

    fn quota_channel(&self) -> String {
        format!("{}:{{quotas}}:changed", self.keys.namespace())
    }

    async fn cluster_configs(&self) -> Result<(u64, BTreeMap<String, String>)> {
        let state = self.state();
        Ok((state.cluster_config_version, state.cluster_configs.clone()))
    }

    async fn cluster_config_version(&self) -> Result<u64> {
        Ok(self.state().cluster_config_version)
    }

    async fn change_cluster_configs(
        &self,
        version: u64,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<Option<u64>> {
        let mut state = self.state();
        if state.cluster_config_version != version {
            return Ok(None);
        }
        for (name, value) in changes {
            match value {
                Some(value) => state.cluster_configs.insert(name.clone(), value.clone()),
                None => state.cluster_configs.remove(name),
            };
        }
        state.cluster_config_version += 1;
        let version = state.cluster_config_version;
        drop(state);
        self.wake.appended(&self.cluster_config_channel(), None, None);
        Ok(Some(version))
    }

    fn cluster_config_channel(&self) -> String {
        format!("{}:{{configs}}:changed", self.keys.namespace())
    }
}
