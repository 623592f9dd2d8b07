//! Errors of the Redis tier.

use crate::batch::BatchError;

/// Why a storage operation failed. The gateway maps each to a Kafka error code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// Redis could not be reached, timed out or refused the command for a
    /// reason that can heal (LOADING, READONLY, OOM, …). Retriable.
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// The topic or partition does not exist.
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    /// The topic already exists.
    #[error("topic already exists")]
    TopicExists,
    /// The name equals the existing topic's once '.' and '_' are taken for
    /// the same character (Kafka refuses it: their metric names clash).
    #[error("collides with existing topic: {0}")]
    TopicCollides(String),
    /// The offset is outside the partition's log.
    #[error("offset out of range (log start {log_start}, high watermark {high_watermark})")]
    OffsetOutOfRange { log_start: i64, high_watermark: i64 },
    /// The offset is in the log but no longer in Redis: its segment was
    /// archived and trimmed (tiered storage), so the archive must serve it.
    #[error("offset {offset} is below the local start {}", offsets.local_start_offset)]
    NotLocal {
        offset: i64,
        offsets: crate::log::PartitionOffsets,
    },
    /// The batch was refused; nothing was stored.
    #[error("corrupt record batch: {0}")]
    Corrupt(#[from] BatchError),
    /// An acks=all batch was stored but too few replicas confirmed it in
    /// time (retriable; an idempotent retry is deduplicated).
    #[error("stored, but {acked} of {wanted} replicas confirmed in time")]
    NotEnoughReplicasAfterAppend { acked: i64, wanted: u32 },
    /// An idempotent producer's batch was refused.
    #[error("producer sequence refused: {0:?}")]
    Sequence(SequenceError),
    /// A concurrent change won a race (e.g. two CreatePartitions at once).
    #[error("concurrent modification: {0}")]
    Conflict(String),
    /// Another change (another gateway's) held what this one needs for
    /// longer than it waits; nothing was written. Kafka's REQUEST_TIMED_OUT.
    #[error("{0}")]
    Busy(String),
    /// Stored data that ketch cannot read (a bug or a foreign writer).
    #[error("unreadable stored data: {0}")]
    Data(String),
    /// The Redis layout was written by a newer ketch than this one.
    #[error(
        "the Redis layout is version {found}, newer than the {supported} this ketch understands: \
         upgrade this gateway, or point it at another redis.namespace"
    )]
    LayoutTooNew { found: u32, supported: u32 },
    /// A Redis server older than ketch needs (7.0: sharded pub/sub,
    /// script flags).
    #[error("redis {server} is version {version}; ketch needs Redis 7.0 or newer")]
    ServerTooOld { server: String, version: String },
}

/// Why an idempotent producer's batch was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceError {
    /// The batch does not follow the producer's last one.
    OutOfOrder,
    /// The producer's epoch is older than the partition has seen.
    StaleEpoch,
    /// A transactional batch of a producer whose transaction does not
    /// include the partition (AddPartitionsToTxn), at the batch's epoch.
    NotInTransaction,
}

impl From<redis::RedisError> for StorageError {
    fn from(e: redis::RedisError) -> Self {
        StorageError::Unavailable(e.to_string())
    }
}

impl StorageError {
    /// Whether the client should retry.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            StorageError::Unavailable(_)
                | StorageError::Conflict(_)
                | StorageError::NotEnoughReplicasAfterAppend { .. }
        )
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;
