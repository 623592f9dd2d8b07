//! The topic registry: `ketch:topics`, a hash of topic name → JSON record.
//!
//! A topic's partition keys are named by its id, not its name, so a deleted
//! and re-created topic never sees old data; and the append script refuses a
//! partition whose `meta` key is gone, so a gateway holding a stale cached
//! record cannot write into a deleted topic.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::{AsyncCommands, Value};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::keys::{Keys, PartitionKeys, default_tag};
use crate::{Result, StorageError, Store};

/// How long a cached topic record is trusted before it is read again: a
/// config change through one gateway takes effect on every other within
/// this (one HGET per topic in use per half second per gateway).
pub const CACHE_TTL: Duration = Duration::from_millis(500);

/// How long a topic's last record read serves while the registry cannot
/// be read (its master failing over, on a Redis Cluster): the partitions
/// on other masters go on being produced to and fetched from. Nothing
/// changes a topic while its record cannot be written either.
pub const STALE_TTL: Duration = Duration::from_secs(60);

/// After a failed read of the registry, how long the cached records serve
/// without trying it again (each try waits out `redis.command_timeout`).
const RETRY_AFTER: Duration = Duration::from_secs(1);

fn is_false(value: &bool) -> bool {
    !*value
}

/// A topic as stored in `ketch:topics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    #[serde(skip)]
    pub name: String,
    pub id: Uuid,
    /// Per-partition hash tags; the partition count is their number.
    pub tags: Vec<String>,
    /// Topic config overrides (defaults are not stored).
    pub configs: BTreeMap<String, String>,
    /// Remote storage was turned off (`remote.log.delete.on.disable`): the
    /// storage worker deletes the topic's archive, then clears this.
    #[serde(default, skip_serializing_if = "is_false")]
    pub drop_archive: bool,
    /// Each partition's key names, made once when the record is read (the
    /// hot paths would otherwise format them on every request).
    #[serde(skip)]
    keys: Vec<PartitionKeys>,
}

impl Topic {
    /// A topic record with its partitions' key names under `keys`; the
    /// registry below makes them, and so can other storage (in memory).
    pub fn new(
        name: &str,
        id: Uuid,
        tags: Vec<String>,
        configs: BTreeMap<String, String>,
        keys: &Keys,
    ) -> Self {
        Self {
            name: name.to_owned(),
            id,
            tags,
            configs,
            drop_archive: false,
            keys: Vec::new(),
        }
        .with_keys(keys)
    }

    /// The topic grown to `total` partitions, the new ones with default tags.
    pub fn grown(&self, total: i32, keys: &Keys) -> Self {
        let added = (self.partitions()..total)
            .map(|p| default_tag(&self.id, p))
            .collect();
        self.grown_with(added, keys)
    }

    /// The topic with partitions added under the tags `added`.
    pub(crate) fn grown_with(&self, added: Vec<String>, keys: &Keys) -> Self {
        let mut tags = self.tags.clone();
        tags.extend(added);
        Topic {
            drop_archive: self.drop_archive,
            ..Topic::new(&self.name, self.id, tags, self.configs.clone(), keys)
        }
    }

    /// The wake-up channel of a partition (see `wake.rs`).
    pub fn wake_channel(&self, partition: i32) -> Option<&str> {
        let keys = self.keys.get(usize::try_from(partition).ok()?)?;
        Some(&keys.wake)
    }

    pub fn partitions(&self) -> i32 {
        self.tags.len() as i32
    }

    pub fn has_partition(&self, partition: i32) -> bool {
        partition >= 0 && (partition as usize) < self.tags.len()
    }

    /// This topic with `configs` as its config overrides; turning
    /// `remote.storage.enable` off marks its archive to be dropped.
    pub fn with_configs(&self, configs: BTreeMap<String, String>) -> Self {
        let remote =
            |c: &BTreeMap<String, String>| c.get("remote.storage.enable").is_some_and(|v| v == "true");
        Self {
            drop_archive: self.drop_archive || (remote(&self.configs) && !remote(&configs)),
            configs,
            ..self.clone()
        }
    }

    pub fn config(&self, name: &str) -> Option<&str> {
        self.configs.get(name).map(String::as_str)
    }

    fn decode(name: &str, json: &str) -> Result<Self> {
        let mut topic: Topic = serde_json::from_str(json)
            .map_err(|e| StorageError::Data(format!("topic record of {name}: {e}")))?;
        topic.name = name.to_owned();
        Ok(topic)
    }

    fn with_keys(mut self, keys: &Keys) -> Self {
        self.keys = self.tags.iter().map(|tag| keys.partition(tag)).collect();
        self
    }

    fn encode(&self) -> String {
        serde_json::to_string(self).expect("topic record serializes")
    }
}

/// A topic deletion begun (the record moved from `ketch:topics` to
/// [`Keys::topics_deleting`]) and not yet known finished.
#[derive(Debug, Serialize, Deserialize)]
struct UnfinishedDelete {
    name: String,
    /// The topic's record as it was stored.
    record: String,
    /// When the deletion began (Unix ms).
    since_ms: i64,
}

/// Kafka's rules for topic names: 1–249 characters of `[a-zA-Z0-9._-]`, not
/// `.` or `..`.
pub fn validate_topic_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("Topic name is empty".to_owned());
    }
    if name == "." || name == ".." {
        return Err(format!("Topic name cannot be \"{name}\""));
    }
    if name.len() > 249 {
        return Err(format!(
            "Topic name is {} characters long, the limit is 249",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "Topic name {name:?} contains {c:?}; legal characters are [a-zA-Z0-9._-]"
        ));
    }
    Ok(())
}

/// Deletes of a topic whose record changed between its read and its
/// removal (a config change through another gateway) before one gives up.
const MAX_DELETE_ATTEMPTS: usize = 3;
/// How long a partition growth's lock outlives a gateway that died holding it.
const GROWTH_LOCK: Duration = Duration::from_secs(30);
/// How long a growth waits for another's lock before it gives up (a
/// retriable error).
const GROWTH_LOCK_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(crate) struct TopicCache {
    by_name: RwLock<HashMap<String, (Arc<Topic>, Instant)>>,
    by_id: RwLock<HashMap<Uuid, Arc<Topic>>>,
    /// When a read of the registry last failed.
    failed: RwLock<Option<Instant>>,
    /// Held while the registry is listed to find an id not cached.
    listing: tokio::sync::Mutex<()>,
    /// Ids such a listing did not find, and when.
    unknown: RwLock<HashMap<Uuid, Instant>>,
    /// When the last complete listing ([`Store::all_topics`]) began.
    listed: RwLock<Option<Instant>>,
}

impl TopicCache {
    /// The cached topic, if it was read less than `age` ago.
    fn get(&self, name: &str, age: Duration) -> Option<Arc<Topic>> {
        let map = self.by_name.read().expect("topic cache lock");
        map.get(name)
            .filter(|(_, at)| at.elapsed() < age)
            .map(|(t, _)| t.clone())
    }

    /// Whether a read of the registry failed under [`RETRY_AFTER`] ago.
    fn failing(&self) -> bool {
        self.failed
            .read()
            .expect("topic cache lock")
            .is_some_and(|at| at.elapsed() < RETRY_AFTER)
    }

    /// Whether a complete listing began at or after `at` (and ended).
    fn listed_since(&self, at: Instant) -> bool {
        self.listed
            .read()
            .expect("topic cache lock")
            .is_some_and(|listed| listed >= at)
    }

    /// Whether a listing found no topic of id `id` under [`CACHE_TTL`] ago.
    fn recently_unknown(&self, id: Uuid) -> bool {
        (self.unknown.read().expect("topic cache lock").get(&id)).is_some_and(|at| at.elapsed() < CACHE_TTL)
    }

    fn unknown_now(&self, id: Uuid) {
        let mut unknown = self.unknown.write().expect("topic cache lock");
        // Made-up ids do not pile up.
        unknown.retain(|_, at| at.elapsed() < CACHE_TTL);
        unknown.insert(id, Instant::now());
    }

    fn failed_now(&self) {
        *self.failed.write().expect("topic cache lock") = Some(Instant::now());
    }

    fn put(&self, topic: Arc<Topic>) {
        // One lock at a time ([`TopicCache::forget`] holds `by_name` while
        // it takes `by_id`).
        let old = (self.by_name.write().expect("topic cache lock"))
            .insert(topic.name.clone(), (topic.clone(), Instant::now()));
        let mut by_id = self.by_id.write().expect("topic cache lock");
        // A name re-created under a new id: the old id names nothing now.
        if let Some((old, _)) = old
            && old.id != topic.id
        {
            by_id.remove(&old.id);
        }
        by_id.insert(topic.id, topic);
    }

    /// Forgets every topic not put since `listed_at`, the start of a
    /// complete listing that put every topic it found: those deleted since
    /// they were cached (through another gateway, where no lookup of the
    /// name here would forget them), each holding its partitions' keys.
    fn forget_unlisted(&self, listed_at: Instant) {
        // `by_name` held while `by_id` is taken, as in `forget`.
        let mut by_name = self.by_name.write().expect("topic cache lock");
        by_name.retain(|_, (_, at)| *at >= listed_at);
        let ids: std::collections::HashSet<Uuid> = by_name.values().map(|(t, _)| t.id).collect();
        self.by_id
            .write()
            .expect("topic cache lock")
            .retain(|id, _| ids.contains(id));
    }

    fn forget(&self, name: &str) {
        if let Some((topic, _)) = self.by_name.write().expect("topic cache lock").remove(name) {
            self.by_id.write().expect("topic cache lock").remove(&topic.id);
        }
    }
}

impl Store {
    /// The topic named `name`, from a short-lived cache.
    pub async fn topic(&self, name: &str) -> Result<Option<Arc<Topic>>> {
        self.topic_fresher_than(name, CACHE_TTL).await
    }

    /// The topic named `name`, read from Redis unless it was read less than
    /// `age` ago: callers that refresh on a miss (a partition beyond the
    /// cached count) go to Redis at most once per `age` however many
    /// partitions a request names.
    ///
    /// While the registry cannot be read, a record read under
    /// [`STALE_TTL`] ago serves (and for [`RETRY_AFTER`] after a failed
    /// read, without trying again).
    pub async fn topic_fresher_than(&self, name: &str, age: Duration) -> Result<Option<Arc<Topic>>> {
        if let Some(topic) = self.topics.get(name, age) {
            return Ok(Some(topic));
        }
        let stale = || self.topics.get(name, STALE_TTL);
        if self.topics.failing()
            && let Some(topic) = stale()
        {
            return Ok(Some(topic));
        }
        match self.topic_fresh(name).await {
            Err(StorageError::Unavailable(e)) => {
                self.topics.failed_now();
                match stale() {
                    Some(topic) => {
                        tracing::debug!(topic = name, error = %e,
                            "the topic registry cannot be read; serving the topic's last record");
                        Ok(Some(topic))
                    }
                    None => Err(StorageError::Unavailable(e)),
                }
            }
            other => other,
        }
    }

    /// The topic named `name`, read from Redis now.
    pub async fn topic_fresh(&self, name: &str) -> Result<Option<Arc<Topic>>> {
        let json: Option<String> = self.conn().hget(self.keys.topics(), name).await?;
        match json {
            None => {
                self.topics.forget(name);
                Ok(None)
            }
            Some(json) => {
                let topic = Arc::new(Topic::decode(name, &json)?.with_keys(&self.keys));
                self.topics.put(topic.clone());
                Ok(Some(topic))
            }
        }
    }

    /// Every topic, read from Redis now, sorted by name. A record this
    /// release cannot read is left out (and logged), not the listing failed.
    pub async fn all_topics(&self) -> Result<Vec<Arc<Topic>>> {
        let listed_at = Instant::now();
        let all: Vec<(String, String)> = self.conn().hgetall(self.keys.topics()).await?;
        let mut topics = Vec::with_capacity(all.len());
        for (name, json) in all {
            let topic = match Topic::decode(&name, &json) {
                Ok(topic) => Arc::new(topic.with_keys(&self.keys)),
                Err(e) => {
                    tracing::warn!(topic = %name, error = %e, "leaving out a topic record this gateway cannot read");
                    continue;
                }
            };
            self.topics.put(topic.clone());
            topics.push(topic);
        }
        self.topics.forget_unlisted(listed_at);
        // A listing that began before the last one recorded, and ended
        // after it, does not move the time back.
        let mut listed = self.topics.listed.write().expect("topic cache lock");
        *listed = Some(listed.map_or(listed_at, |last| last.max(listed_at)));
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(topics)
    }

    /// When the last complete listing ([`Store::all_topics`]) began, and,
    /// from memory, the names it found with those read since, less those
    /// found deleted since: every topic that existed when the listing read
    /// the registry and was not deleted through this gateway since, and
    /// perhaps a name another gateway deleted meanwhile (until the next
    /// listing); `None` before any listing. The storage worker lists the
    /// topics on every tick, so what needs the names now and then need
    /// not read them again.
    pub fn listed_topic_names(&self) -> Option<(Instant, std::collections::HashSet<String>)> {
        let listed = (*self.topics.listed.read().expect("topic cache lock"))?;
        let names = (self.topics.by_name.read().expect("topic cache lock"))
            .keys()
            .cloned()
            .collect();
        Some((listed, names))
    }

    /// Forgets what this gateway keeps per partition (append slots, the
    /// batch sizes reads saw) of every partition not in `topics`, a
    /// complete listing ([`Store::all_topics`]): those of deleted topics,
    /// which would otherwise stay until the gateway restarts. At most once
    /// a minute; the storage worker calls it with each tick's listing.
    pub fn forget_deleted_partitions(&self, topics: &[Arc<Topic>]) {
        if !self.partitions_pruned.ready(Duration::from_secs(60)) {
            return;
        }
        let live: std::collections::HashSet<&str> = topics
            .iter()
            .flat_map(|t| t.keys.iter().map(|k| k.meta.as_str()))
            .collect();
        self.appenders.retain(&live);
    }

    /// The topic whose id is `id`.
    pub async fn topic_by_id(&self, id: Uuid) -> Result<Option<Arc<Topic>>> {
        let cached = self
            .topics
            .by_id
            .read()
            .expect("topic cache lock")
            .get(&id)
            .cloned();
        let current = |age: Duration| {
            cached
                .as_ref()
                .filter(|topic| {
                    self.topics
                        .get(&topic.name, age)
                        .is_some_and(|current| current.id == id)
                })
                .cloned()
        };
        if let Some(topic) = current(CACHE_TTL) {
            return Ok(Some(topic));
        }
        // As `topic_fresher_than`, while the registry cannot be read.
        if self.topics.failing()
            && let Some(topic) = current(STALE_TTL)
        {
            return Ok(Some(topic));
        }
        let unavailable = |e: String| {
            self.topics.failed_now();
            current(STALE_TTL).map(Some).ok_or(StorageError::Unavailable(e))
        };
        // Known by id: its name's record (one HGET) says whether it is
        // still this topic. A topic keeps its name for life, so another
        // id there, or none, means this one was deleted.
        if let Some(known) = &cached {
            return match self.topic_fresh(&known.name).await {
                Ok(found) => Ok(found.filter(|t| t.id == id)),
                Err(StorageError::Unavailable(e)) => unavailable(e),
                Err(e) => Err(e),
            };
        }
        // Not known here: the whole registry is read, by one request at a
        // time (those waiting find what it put in the cache), and an id it
        // does not find stays unknown for CACHE_TTL. Before, every fetch
        // naming an unknown id (a deleted topic's consumers, any client's
        // made-up id) read and decoded the whole registry.
        let asked = Instant::now();
        let _listing = self.topics.listing.lock().await;
        // (Cloned out: `by_id` is never held while `by_name` is taken, the
        // order `forget` takes them in.)
        let found = (self.topics.by_id.read().expect("topic cache lock"))
            .get(&id)
            .cloned();
        // A listing that began after this request asked, or under
        // CACHE_TTL before (as fresh as any cached record), answers it,
        // found or not: requests naming different unknown ids do not each
        // list the registry in turn.
        let answered = self
            .topics
            .listed_since(asked.checked_sub(CACHE_TTL).unwrap_or(asked));
        if let Some(found) = found
            && (answered
                || self
                    .topics
                    .get(&found.name, CACHE_TTL)
                    .is_some_and(|t| t.id == id))
        {
            return Ok(Some(found));
        }
        if answered || self.topics.recently_unknown(id) {
            return Ok(None);
        }
        // One failed a moment ago: the registry is not read again now.
        if self.topics.failing() {
            return Err(StorageError::Unavailable(
                "the topic registry could not be read a moment ago".to_owned(),
            ));
        }
        match self.all_topics().await {
            Ok(all) => {
                let found = all.into_iter().find(|t| t.id == id);
                if found.is_none() {
                    self.topics.unknown_now(id);
                }
                Ok(found)
            }
            Err(StorageError::Unavailable(e)) => unavailable(e),
            Err(e) => Err(e),
        }
    }

    /// The keys of one partition (every topic is built with its
    /// partitions' keys: [`Topic::new`]).
    pub fn partition_keys<'a>(&self, topic: &'a Topic, partition: i32) -> &'a PartitionKeys {
        &topic.keys[partition as usize]
    }

    /// Creates a topic. The partitions' metadata is written first and the
    /// topic record last (`create_topic.lua`: only if the name is free and
    /// collides with no other through `.` and `_`), so a crash in between
    /// leaves only unreachable keys, and of two gateways creating one topic
    /// exactly one wins; the loser gets [`StorageError::TopicExists`].
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        configs: BTreeMap<String, String>,
    ) -> Result<Arc<Topic>> {
        let id = Uuid::new_v4();
        let tags = self.place(&id, &[], partitions).await?;
        let topic = Topic::new(name, id, tags, configs, &self.keys);
        if self.topic_fresh(name).await?.is_some() {
            return Err(StorageError::TopicExists);
        }
        self.init_partitions(&topic, 0).await?;
        let mut invocation = self.scripts.create_topic.key(self.keys.topics());
        invocation.arg(name).arg(topic.encode());
        let created: Vec<String> = match self
            .invoke_configured(&self.keys.topics(), &invocation, |reply| {
                matches!(reply, Value::Array(items)
                    if matches!(items.first(), Some(Value::BulkString(tag)) if tag == b"created"))
            })
            .await
        {
            Ok(created) => created,
            Err(e) => {
                // Refused (the registry's master at maxmemory) or not
                // answered: the partitions' metadata goes, unless the topic
                // was created after all (when the registry cannot say, it
                // stays: a leak, not a topic without its metadata).
                if let Ok(found) = self.topic_fresh(name).await
                    && found.is_none_or(|t| t.id != id)
                    && let Err(e) = self.drop_partitions(&topic, 0).await
                {
                    tracing::debug!(topic = name, error = %e, "cannot drop a refused topic's partitions");
                }
                return Err(e);
            }
        };
        if created.first().map(String::as_str) != Some("created") {
            self.drop_partitions(&topic, 0).await?;
            return Err(match created.get(1) {
                Some(existing) => StorageError::TopicCollides(existing.clone()),
                None => StorageError::TopicExists,
            });
        }
        let topic = Arc::new(topic);
        self.topics.put(topic.clone());
        Ok(topic)
    }

    /// Deletes the topic named `name` — only while it has the id `id`,
    /// when given (a DeleteTopics by id must not delete a topic re-created
    /// under the same name since): the record first (clients stop seeing
    /// it), only if it is still the one read, then every partition's keys,
    /// then the groups' offsets of its partitions.
    /// Its Iceberg table, if any, is kept: the archive outlives the topic
    /// (docs/tiered-storage.md).
    pub async fn delete_topic(&self, name: &str, id: Option<Uuid>) -> Result<Arc<Topic>> {
        for _ in 0..MAX_DELETE_ATTEMPTS {
            // The record as stored (compared byte for byte below: a newer
            // release's record may hold fields this one does not encode).
            let stored: Option<String> = self.conn().hget(self.keys.topics(), name).await?;
            let Some(stored) = stored else {
                self.topics.forget(name);
                return Err(StorageError::UnknownTopicOrPartition);
            };
            let topic = Topic::decode(name, &stored)?.with_keys(&self.keys);
            if id.is_some_and(|id| topic.id != id) {
                return Err(StorageError::UnknownTopicOrPartition);
            }
            let entry = UnfinishedDelete {
                name: name.to_owned(),
                record: stored.clone(),
                since_ms: crate::now_ms(),
            };
            let mut invocation = self.scripts.replace_topic.key(self.keys.topics());
            invocation
                .key(self.keys.topics_deleting())
                .arg(name)
                .arg(&stored)
                .arg("")
                .arg(topic.id.to_string())
                .arg(serde_json::to_string(&entry).expect("a deletion entry serializes"));
            let removed: i32 = self
                .invoke_configured(&self.keys.topics(), &invocation, replaced)
                .await?;
            self.topics.forget(name);
            if removed == 1 {
                // The topic is deleted once its record is gone, as Kafka's
                // is with its metadata record: what is left (its partitions'
                // keys, the groups' offsets) the storage worker finishes
                // should this fail (`finish_deletes`).
                if let Err(e) = self.finish_delete(&topic, true).await {
                    tracing::warn!(topic = name, error = %e,
                        "topic deleted; removing its data failed, and is finished later");
                }
                return Ok(Arc::new(topic));
            }
        }
        Err(StorageError::Conflict(format!(
            "topic {name} kept changing under {MAX_DELETE_ATTEMPTS} deletes"
        )))
    }

    /// Removes a deleted topic's partitions' keys, then (with `offsets`)
    /// the groups' offsets of its partitions, then its entry among the
    /// unfinished deletions. Each step may be done again: a deletion cut
    /// short (Redis failed, the gateway died) is finished by
    /// [`Store::finish_deletes`].
    async fn finish_delete(&self, topic: &Topic, offsets: bool) -> Result<()> {
        self.drop_partitions(topic, 0).await?;
        if offsets {
            self.drop_topic_offsets(&topic.name, topic.partitions()).await?;
        }
        let _: i64 = self
            .conn()
            .hdel(self.keys.topics_deleting(), topic.id.to_string())
            .await?;
        Ok(())
    }

    /// Finishes the topic deletions begun at least `after` ago and not
    /// known finished (the gateway deleting it failed between removing the
    /// record and removing the rest), of the topics `mine` picks (the
    /// storage worker takes those whose first partition it leads, so one
    /// gateway does each). A topic re-created under the name meanwhile
    /// keeps the groups' offsets: they may be its own by now. Returns how
    /// many it finished.
    pub async fn finish_deletes(&self, after: Duration, mine: impl Fn(&Topic) -> bool) -> Result<usize> {
        let entries: HashMap<String, String> = self.conn().hgetall(self.keys.topics_deleting()).await?;
        let mut finished = 0;
        for (id, json) in entries {
            let topic = serde_json::from_str::<UnfinishedDelete>(&json)
                .map_err(|e| StorageError::Data(e.to_string()))
                .and_then(|entry| Ok((entry.since_ms, Topic::decode(&entry.name, &entry.record)?)));
            let (since_ms, topic) = match topic {
                Ok((since_ms, topic)) => (since_ms, topic.with_keys(&self.keys)),
                Err(e) => {
                    tracing::warn!(id, error = %e, "an unfinished topic deletion cannot be read; left as it is");
                    continue;
                }
            };
            let age = u64::try_from(crate::now_ms().saturating_sub(since_ms)).unwrap_or(0);
            if Duration::from_millis(age) < after || !mine(&topic) {
                continue;
            }
            let recreated = self.topic_fresh(&topic.name).await?.is_some();
            self.finish_delete(&topic, !recreated).await?;
            tracing::info!(topic = %topic.name, %id, "finished a topic deletion cut short");
            finished += 1;
        }
        Ok(finished)
    }

    /// Grows a topic to `total` partitions.
    ///
    /// One growth of a topic at a time, across gateways (a lock in Redis,
    /// as Kafka's controller takes CreatePartitions one at a time): the new
    /// partitions' keys are named from the topic id and partition number,
    /// and placed alike by every gateway, so two growths at once would
    /// share them, and the one that lost the record's compare-and-set
    /// would remove (or reset) the partitions the other just added. A
    /// growth that finds the lock held waits for it, then finds the record
    /// changed (a conflict): the caller reads the topic again and finds it
    /// grown.
    pub async fn add_partitions(&self, topic: &Topic, total: i32) -> Result<Arc<Topic>> {
        let lock = format!("{}:lock:partitions:{}", self.keys.namespace(), topic.id);
        let token = uuid::Uuid::new_v4().to_string();
        let waiting = tokio::time::Instant::now();
        // The lease script of the storage workers' leases, held by a token
        // of this growth's own.
        while !self.lease_op(&lock, &token, GROWTH_LOCK, "take").await? {
            // Another growth holds it (placing many partitions can take a
            // while): wait for it, then read the topic it changed.
            if waiting.elapsed() >= GROWTH_LOCK_WAIT {
                return Err(StorageError::Busy(format!(
                    "another gateway has been adding partitions to topic {} for over {}s",
                    topic.name,
                    GROWTH_LOCK_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let grown = self.add_partitions_locked(topic, total).await;
        if let Err(e) = self.lease_op(&lock, &token, Duration::ZERO, "release").await {
            // It expires after GROWTH_LOCK.
            tracing::debug!(topic = %topic.name, error = %e, "cannot release the partition growth lock");
        }
        grown
    }

    async fn add_partitions_locked(&self, topic: &Topic, total: i32) -> Result<Arc<Topic>> {
        // A growth that held the lock before may have changed the record
        // since the caller read it: its new partitions' keys are the ones
        // this growth would make (and reset, then remove).
        let stored: Option<String> = self.conn().hget(self.keys.topics(), &topic.name).await?;
        if stored.as_deref() != Some(topic.encode().as_str()) {
            self.topics.forget(&topic.name);
            return Err(StorageError::Conflict(format!(
                "topic {} changed meanwhile",
                topic.name
            )));
        }
        let added = self.place(&topic.id, &topic.tags, total).await?;
        let grown = topic.grown_with(added, &self.keys);
        self.init_partitions(&grown, topic.partitions()).await?;
        match self.replace_topic(topic, grown.clone()).await? {
            Some(grown) => Ok(grown),
            None => {
                // A config change came first: growths take the lock, so
                // the partitions made here are this growth's alone.
                self.drop_partitions(&grown, topic.partitions()).await?;
                Err(StorageError::Conflict(format!(
                    "topic {} changed meanwhile",
                    topic.name
                )))
            }
        }
    }

    /// Replaces a topic's config overrides (`configs`, validated by the
    /// caller), if the topic is still as `topic` was read; other gateways
    /// see the change when their cached record expires ([`CACHE_TTL`]).
    /// Turning `remote.storage.enable` off marks the archive to be dropped
    /// ([`Topic::drop_archive`]; the caller checked that
    /// `remote.log.delete.on.disable` allows it) in the same write.
    pub async fn set_topic_configs(
        &self,
        topic: &Topic,
        configs: BTreeMap<String, String>,
    ) -> Result<Arc<Topic>> {
        self.replace_or_conflict(topic, topic.with_configs(configs)).await
    }

    /// Clears [`Topic::drop_archive`] once the archive is gone, if the topic
    /// is still as `topic` was read.
    pub async fn archive_dropped(&self, topic: &Topic) -> Result<Arc<Topic>> {
        let new = Topic {
            drop_archive: false,
            ..topic.clone()
        };
        self.replace_or_conflict(topic, new).await
    }

    /// [`Store::replace_topic`], a change made meanwhile being a conflict.
    async fn replace_or_conflict(&self, old: &Topic, new: Topic) -> Result<Arc<Topic>> {
        (self.replace_topic(old, new).await?)
            .ok_or_else(|| StorageError::Conflict(format!("topic {} changed meanwhile", old.name)))
    }

    /// Replaces the record of `old` with `new` if it is still `old` (and
    /// caches it); `None` when it changed or vanished meanwhile.
    async fn replace_topic(&self, old: &Topic, new: Topic) -> Result<Option<Arc<Topic>>> {
        let mut invocation = self.scripts.replace_topic.key(self.keys.topics());
        invocation.arg(&old.name).arg(old.encode()).arg(new.encode());
        let replaced: i32 = self
            .invoke_configured(&self.keys.topics(), &invocation, replaced)
            .await?;
        if replaced == 0 {
            self.topics.forget(&old.name);
            return Ok(None);
        }
        let new = Arc::new(new);
        self.topics.put(new.clone());
        Ok(Some(new))
    }

    /// Bytes Redis uses for a partition's log and compacted streams (`MEMORY USAGE`,
    /// sampled), 0 when it has none.
    pub async fn partition_memory(&self, topic: &Topic, partition: i32) -> Result<i64> {
        let keys = self.partition_keys(topic, partition);
        // A compacted topic's records are in its compacted stream too.
        let (log, clean): (Option<i64>, Option<i64>) = redis::pipe()
            .cmd("MEMORY")
            .arg("USAGE")
            .arg(&keys.log)
            .cmd("MEMORY")
            .arg("USAGE")
            .arg(&keys.clean)
            .query_async(&mut self.conn())
            .await?;
        Ok(log.unwrap_or(0) + clean.unwrap_or(0))
    }

    async fn init_partitions(&self, topic: &Topic, from: i32) -> Result<()> {
        let fields = [("next_offset", 0), ("log_start", 0), ("local_start", 0)];
        let metas: Vec<String> = (from..topic.partitions())
            .map(|p| self.partition_keys(topic, p).meta.clone())
            .collect();
        if !self.durability.waits() {
            let mut pipe = redis::pipe();
            for meta in &metas {
                pipe.hset_multiple(meta, &fields).ignore();
            }
            pipe.query_async::<()>(&mut self.conn()).await?;
            return Ok(());
        }
        // With acks=all waiting for replicas, the partitions' metadata is
        // waited for as the topic record is (a failover that lost it would
        // leave a partition refusing appends): written per master on a
        // connection of its durable pool and WAITed there, the masters at
        // once, so a master without replicas costs one acks=all timeout,
        // not one per partition. The record's own master needs no WAIT of
        // its own: the record is written there next, and its WAIT covers
        // what came before it in the master's one replication stream (in
        // single mode, all of it).
        let keys: Vec<String> = metas.iter().cloned().chain([self.keys.topics()]).collect();
        let groups = self.durable.by_node(&keys).await?;
        let metas = &metas;
        let writes = groups
            .into_iter()
            .filter(|group| group[0] < metas.len())
            .map(|group| {
                let with_record = group.contains(&metas.len());
                let mut pipe = redis::pipe();
                for &i in group.iter().filter(|&&i| i < metas.len()) {
                    pipe.hset_multiple(&metas[i], &fields).ignore();
                }
                async move {
                    if with_record {
                        pipe.query_async::<()>(&mut self.conn()).await?;
                        Ok(())
                    } else {
                        self.query_configured::<()>(&metas[group[0]], &pipe).await
                    }
                }
            });
        futures::future::try_join_all(writes).await?;
        Ok(())
    }

    /// Removes every key of the partitions from `from` on. UNLINK frees a
    /// large log in the background instead of blocking Redis; one command
    /// per partition, since in a cluster each partition is its own slot.
    async fn drop_partitions(&self, topic: &Topic, from: i32) -> Result<()> {
        let mut pipe = redis::pipe();
        for p in from..topic.partitions() {
            let keys = self.partition_keys(topic, p);
            pipe.cmd("UNLINK").arg(&keys.all()[..]).ignore();
        }
        pipe.query_async::<()>(&mut self.conn()).await?;
        Ok(())
    }
}

/// Whether `add_partitions.lua` (the record's compare-and-set) replaced
/// or removed the record.
fn replaced(reply: &Value) -> bool {
    matches!(reply, Value::Int(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_x-2").is_ok());
        for bad in ["", ".", "..", "a b", "ü", "a/b"] {
            assert!(validate_topic_name(bad).is_err(), "{bad}");
        }
        assert!(validate_topic_name(&"a".repeat(249)).is_ok());
        assert!(validate_topic_name(&"a".repeat(250)).is_err());
    }

    #[test]
    fn a_listing_forgets_the_topics_it_did_not_find() {
        let keys = Keys::new("ketch");
        let topic = |name: &str| {
            let t = Topic {
                name: name.into(),
                id: Uuid::new_v4(),
                tags: vec![format!("{name}:0")],
                configs: BTreeMap::new(),
                drop_archive: false,
                keys: Vec::new(),
            };
            Arc::new(t.with_keys(&keys))
        };
        let cache = TopicCache::default();
        let (gone, kept) = (topic("gone"), topic("kept"));
        cache.put(gone.clone());
        let listed_at = Instant::now();
        // The listing puts what it finds; one created meanwhile is put too.
        cache.put(kept.clone());
        let created = topic("created");
        cache.put(created.clone());
        cache.forget_unlisted(listed_at);
        let names: Vec<String> = cache.by_name.read().unwrap().keys().cloned().collect();
        assert!(!names.contains(&"gone".to_owned()), "{names:?}");
        assert_eq!(names.len(), 2, "{names:?}");
        let ids = cache.by_id.read().unwrap();
        assert!(!ids.contains_key(&gone.id));
        assert!(ids.contains_key(&kept.id) && ids.contains_key(&created.id));
    }

    #[test]
    fn record_round_trips_without_the_name() {
        let t = Topic {
            name: "t".into(),
            id: Uuid::new_v4(),
            tags: vec!["x:0".into()],
            configs: BTreeMap::from([("retention.ms".into(), "1".into())]),
            drop_archive: false,
            keys: Vec::new(),
        };
        let back = Topic::decode("t", &t.encode()).unwrap();
        assert_eq!(back, t);
        assert!(!t.encode().contains("\"name\""));
        assert!(!t.encode().contains("drop_archive"), "records stay as before");
    }

    #[test]
    fn turning_remote_storage_off_marks_the_archive_to_be_dropped() {
        let keys = Keys::new("ketch");
        let configs =
            |remote: &str| BTreeMap::from([("remote.storage.enable".to_owned(), remote.to_owned())]);
        let t = Topic::new("t", Uuid::new_v4(), vec!["x:0".into()], configs("true"), &keys);
        assert!(!t.with_configs(configs("true")).drop_archive);
        let off = t.with_configs(BTreeMap::new());
        assert!(off.drop_archive);
        assert!(Topic::decode("t", &off.encode()).unwrap().drop_archive);
        assert!(
            off.with_configs(configs("false")).drop_archive,
            "stays until the worker clears it"
        );
        assert!(off.grown(2, &keys).drop_archive);
        let never = Topic::new("u", Uuid::new_v4(), vec!["x:1".into()], configs("false"), &keys);
        assert!(!never.with_configs(BTreeMap::new()).drop_archive);
    }
}
