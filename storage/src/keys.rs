//! Redis key names (DESIGN §3). Every key of one partition shares the hash
//! tag `{TAG}`, so one Lua script may touch them all and Redis Cluster keeps
//! them on one shard.

/// Key names under one namespace.
#[derive(Debug, Clone)]
pub struct Keys {
    ns: String,
}

impl Keys {
    pub fn new(namespace: &str) -> Self {
        Self {
            ns: namespace.to_owned(),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// Hash: topic name → topic record (JSON).
    pub fn topics(&self) -> String {
        format!("{}:topics", self.ns)
    }

    /// Hash: topic id → a topic deletion begun and not yet known finished
    /// ([`crate::topics::UnfinishedDelete`]). Its hash tag is the name of
    /// [`Keys::topics`], so in a Redis Cluster both are in one slot and one
    /// script moves a record from one to the other.
    pub fn topics_deleting(&self) -> String {
        format!("{{{}:topics}}:deleting", self.ns)
    }

    pub fn partition(&self, tag: &str) -> PartitionKeys {
        let key = |name: &str| format!("{}:{{{tag}}}:{name}", self.ns);
        PartitionKeys {
            meta: key("meta"),
            log: key("log"),
            times: key("times"),
            staging: key("staging"),
            segments: key("segments"),
            quarantine: key("quarantine"),
            lease: key("lease"),
            archiving: key("archiving"),
            producers: key("producers"),
            txns: key("txns"),
            aborted: key("aborted"),
            clean: key("clean"),
            compacting: key("compacting"),
            wake: key("wake"),
        }
    }
}

/// The keys (and wake-up channel) of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionKeys {
    pub meta: String,
    pub log: String,
    pub times: String,
    /// The log's name while an append's XADD runs (see scripts/append.lua).
    pub staging: String,
    /// Sealed segments (see scripts/seal.lua).
    pub segments: String,
    /// Batches of quarantined segments: sealed segments the archive could
    /// not write, moved out of the log so local retention can pass them.
    pub quarantine: String,
    /// The storage worker's lease on this partition.
    pub lease: String,
    /// Held (the worker's id, with a TTL) while a storage worker may write
    /// the partition to the topic's Iceberg table (scripts/lease.lua).
    pub archiving: String,
    /// Idempotent producers' last batches (and their transactions here).
    pub producers: String,
    /// Open transactions with data in the partition: score = the first
    /// offset of the transaction's data here, member = producer id.
    pub txns: String,
    /// Aborted transactions: score = the offset of the abort marker,
    /// member = `<producer id>:<first offset>`.
    pub aborted: String,
    /// The compacted part of a compacted topic's log, below the meta field
    /// `clean_end` (see compact.rs).
    pub clean: String,
    /// The next `clean` stream while a compaction pass writes it.
    pub compacting: String,
    /// A pub/sub channel, not a key.
    pub wake: String,
}

impl PartitionKeys {
    /// Every key of the partition (the wake-up channel is not a key). Whatever
    /// acts on all of a partition's keys (deleting a topic, migrating the
    /// layout) iterates this list, so a new key cannot be forgotten.
    pub fn all(&self) -> [&str; 13] {
        // Destructured so that adding a field fails to compile until it is
        // listed here.
        let PartitionKeys {
            meta,
            log,
            times,
            staging,
            segments,
            quarantine,
            lease,
            archiving,
            producers,
            txns,
            aborted,
            clean,
            compacting,
            wake: _,
        } = self;
        [
            meta, log, times, staging, segments, quarantine, lease, archiving, producers, txns, aborted,
            clean, compacting,
        ]
    }
}

/// The default hash tag of a partition: `<topic-id>:<partition>`.
pub fn default_tag(topic_id: &uuid::Uuid, partition: i32) -> String {
    format!("{}:{partition}", topic_id.simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_share_one_hash_tag() {
        let k = Keys::new("ketch").partition("abc:3");
        assert_eq!(k.meta, "ketch:{abc:3}:meta");
        assert_eq!(k.log, "ketch:{abc:3}:log");
        assert_eq!(k.wake, "ketch:{abc:3}:wake");
        for key in k.all() {
            assert!(key.starts_with("ketch:{abc:3}:"), "{key}");
        }
    }

    #[test]
    fn all_lists_every_key_once_and_not_the_channel() {
        let k = Keys::new("ketch").partition("t:0");
        let all: std::collections::BTreeSet<&str> = k.all().into_iter().collect();
        assert_eq!(all.len(), k.all().len());
        assert!(!all.contains(k.wake.as_str()));
        assert!(all.contains(k.lease.as_str()) && all.contains(k.producers.as_str()));
        assert!(all.contains(k.segments.as_str()) && all.contains(k.quarantine.as_str()));
    }
}
