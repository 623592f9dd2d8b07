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

    pub fn partition(&self, tag: &str) -> PartitionKeys {
        PartitionKeys {
            meta: format!("{}:{{{tag}}}:meta", self.ns),
            log: format!("{}:{{{tag}}}:log", self.ns),
            times: format!("{}:{{{tag}}}:times", self.ns),
            staging: format!("{}:{{{tag}}}:staging", self.ns),
            segments: format!("{}:{{{tag}}}:segments", self.ns),
            lease: format!("{}:{{{tag}}}:lease", self.ns),
            producers: format!("{}:{{{tag}}}:producers", self.ns),
            wake: format!("{}:{{{tag}}}:wake", self.ns),
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
    /// The storage worker's lease on this partition.
    pub lease: String,
    /// Idempotent producers' last batches.
    pub producers: String,
    pub wake: String,
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
    }
}
