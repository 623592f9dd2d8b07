//! Produce (v3–v13): validate each partition's record batch and append it
//! verbatim.
//!
//! A batch is checked before anything reaches Redis (bounds, magic 2,
//! CRC-32C, record count; see `ketch_storage::batch`), so a rejected batch
//! leaves no trace. Partitions are appended concurrently. acks=0 gets no
//! response, and a failure closes the connection (as Kafka does, so the
//! producer notices and reads the metadata again); acks=1 is answered once the append script ran; acks=all also
//! waits for `storage.acks_all_replicas` Redis replicas (`WAIT`) and, with
//! `storage.acks_all_fsync`, the AOF (`WAITAOF`).
//!
//! Kafka appends one connection's produce requests in the order they were
//! sent, and clients with several requests in flight rely on it. Requests
//! are handled concurrently, so a [`Sequencer`] per connection hands each
//! partition of each request a [`Turn`]: its append starts once the same
//! partition's append from the previous request on the connection is done.
//! Different partitions never wait for each other.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_request::TopicProduceData;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, RequestHeader};
use ketch_config::topic::Configs;
use ketch_storage::Topic;
use ketch_storage::batch::{
    BatchError, BatchHeader, RecordFacts, ValidBatch, set_max_timestamp, stamp_log_append_time,
    validate_produce_batch,
};
use tokio::sync::oneshot;

use super::{
    Client, authorized, cluster_authorized, ensure_partition, error_code, resolve_topic, resolve_topic_id,
    str_bytes,
};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

/// A partition of a produce request, as the sequencer keys it: a hash of
/// the topic (name, or id from v13) and the partition. Hashing keeps
/// per-entry work and memory independent of the topic name's length (a
/// request may name a long topic once per partition); a collision costs
/// only a missed or unneeded wait between two partitions.
type PartitionKey = u64;

/// A topic's part of its partitions' keys: hashed once per topic entry, so
/// the work per partition entry is the same however long the name is.
fn topic_key(topic: &TopicProduceData) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    topic.name.0.as_bytes().hash(&mut hasher);
    topic.topic_id.hash(&mut hasher);
    hasher.finish()
}

fn partition_key(topic_key: u64, partition: i32) -> PartitionKey {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (topic_key, partition).hash(&mut hasher);
    hasher.finish()
}

/// Orders one connection's appends per partition.
#[derive(Default)]
pub struct Sequencer {
    previous: HashMap<PartitionKey, oneshot::Receiver<()>>,
}

/// One partition's place in its connection's order.
pub struct Turn {
    previous: Option<oneshot::Receiver<()>>,
    /// Dropped when this partition's append is done, letting the next one go.
    _done: oneshot::Sender<()>,
}

impl Turn {
    async fn wait(&mut self) {
        if let Some(previous) = self.previous.take() {
            let _ = previous.await;
        }
    }
}

/// The turns of every partition of one request.
#[derive(Default)]
pub struct Turns(HashMap<PartitionKey, Turn>);

impl Sequencer {
    /// Takes the turns of `request`; call in the order requests arrive.
    /// A partition named twice in one request gets one turn (its earlier
    /// entries are dropped by [`handle`]).
    pub fn turns(&mut self, request: &ProduceRequest) -> Turns {
        // Appends that finished need not be remembered.
        self.previous.retain(|_, previous| {
            !matches!(
                previous.try_recv(),
                Err(oneshot::error::TryRecvError::Closed) | Ok(())
            )
        });
        let mut turns = Turns::default();
        for topic in &request.topic_data {
            let topic_key = topic_key(topic);
            for partition in &topic.partition_data {
                let key = partition_key(topic_key, partition.index);
                if turns.0.contains_key(&key) {
                    continue;
                }
                let (done, next) = oneshot::channel();
                let previous = self.previous.insert(key, next);
                turns.0.insert(
                    key,
                    Turn {
                        previous,
                        _done: done,
                    },
                );
            }
        }
        turns
    }
}

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: ProduceRequest,
    mut turns: Turns,
) -> Option<ProduceResponse> {
    let acks = request.acks;
    // A transactional producer names its transactional id; writing
    // transactional records for it takes WRITE on it (its batches are
    // checked against its transaction by each partition). Transactional
    // records without a transactional id fail the whole request, as in
    // Kafka (it looks at each partition's first batch); a request without
    // any is not checked against the id it names (`KafkaApis`).
    let transactional = match request.transactional_id.as_deref() {
        id if !has_transactional_records(&request) => Ok(id.is_some()),
        Some(id) if !authorized(ctx, client, Operation::Write, ResourceType::TransactionalId, id) => {
            Err(ResponseError::TransactionalIdAuthorizationFailed.code())
        }
        None => Err(ResponseError::TransactionalIdAuthorizationFailed.code()),
        Some(id) => transactional_producer(ctx, id, &request).await.map(|()| true),
    };
    // One deadline for the whole request (0: none), however many of its
    // partitions wait for their turn to start.
    let deadline = u64::try_from(request.timeout_ms)
        .ok()
        .filter(|&ms| ms > 0)
        .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
    let version = header.request_api_version;
    // Kafka keys a request's partitions by topic and partition: a partition
    // named twice is produced (and answered) once, with its last entry (a
    // later entry replaces an earlier one in `handleProduceRequest`'s map).
    // The name is hashed once per topic entry, not per partition.
    // Entries are counted only when the turns (one per partition) say a
    // partition is named twice: rare, and not worth a pass over every
    // request.
    let mut entries: HashMap<PartitionKey, usize> = HashMap::new();
    let named: usize = request.topic_data.iter().map(|t| t.partition_data.len()).sum();
    if named > turns.0.len() {
        for data in &request.topic_data {
            let topic_key = topic_key(data);
            for partition in &data.partition_data {
                *entries
                    .entry(partition_key(topic_key, partition.index))
                    .or_default() += 1;
            }
        }
    }
    let topics = request.topic_data.into_iter().filter_map(|mut data| {
        let named = !data.partition_data.is_empty();
        let mut kept = Vec::with_capacity(data.partition_data.len());
        let mut turns_of_topic = Vec::with_capacity(data.partition_data.len());
        let topic_key = topic_key(&data);
        for partition in std::mem::take(&mut data.partition_data) {
            let key = partition_key(topic_key, partition.index);
            let later = entries.get_mut(&key).map_or(0, |left| {
                *left -= 1;
                *left
            });
            if later == 0 {
                turns_of_topic.push(turns.0.remove(&key));
                kept.push(partition);
            }
        }
        if named && kept.is_empty() {
            // Every partition it named is answered in a later entry.
            return None;
        }
        data.partition_data = kept;
        Some(produce_topic(
            ctx,
            client,
            acks,
            transactional,
            deadline,
            version,
            data,
            turns_of_topic,
        ))
    });
    // acks=0 gets no response: the server sends none, and closes the
    // connection when a partition failed (`server::respond`).
    Some(ProduceResponse::default().with_responses(super::each(topics).await))
}

/// Checks the transactional batches of a request naming transactional id
/// `id` as Kafka verifies them (`ReplicaManager`, KIP-890): all of one
/// producer, `id`'s own (INVALID_PRODUCER_ID_MAPPING otherwise, for the
/// whole request). Each partition then checks the producer's transaction
/// includes it.
async fn transactional_producer(ctx: &Context, id: &str, request: &ProduceRequest) -> Result<(), i16> {
    let mut producers = request
        .topic_data
        .iter()
        .flat_map(|topic| topic.partition_data.iter())
        .filter_map(|p| p.records.as_deref())
        .filter(|batch| ketch_storage::batch::is_transactional_batch(batch))
        .filter_map(|batch| ketch_storage::batch::header(batch).ok())
        .map(|header| (header.producer_id, header.producer_epoch));
    let Some(first) = producers.next() else {
        return Ok(());
    };
    if producers.any(|other| other != first) {
        return Err(ResponseError::InvalidProducerIdMapping.code());
    }
    ctx.verified_producers
        .check(ctx.storage.as_ref(), id, first.0, first.1)
        .await
}

/// Whether a partition's first batch says it is transactional.
fn has_transactional_records(request: &ProduceRequest) -> bool {
    request.topic_data.iter().any(|topic| {
        topic.partition_data.iter().any(|p| {
            p.records
                .as_deref()
                .is_some_and(ketch_storage::batch::is_transactional_batch)
        })
    })
}

#[allow(clippy::too_many_arguments)]
async fn produce_topic(
    ctx: &Context,
    client: &Client,
    acks: i16,
    transactional: Result<bool, i16>,
    deadline: Option<tokio::time::Instant>,
    version: i16,
    data: TopicProduceData,
    turns: Vec<Option<Turn>>,
) -> TopicProduceResponse {
    let by_id = version >= 13;
    let valid_acks = matches!(acks, -1..=1);
    let topic = if let Err(code) = transactional {
        Err(code)
    } else if by_id {
        match resolve_topic_id(ctx, data.topic_id).await {
            Ok(topic) if !authorized(ctx, client, Operation::Write, ResourceType::Topic, &topic.name) => {
                Err(ResponseError::TopicAuthorizationFailed.code())
            }
            other => other,
        }
    } else if !authorized(ctx, client, Operation::Write, ResourceType::Topic, &data.name) {
        Err(ResponseError::TopicAuthorizationFailed.code())
    } else {
        let may_create = valid_acks
            && (cluster_authorized(ctx, client, Operation::Create)
                || authorized(ctx, client, Operation::Create, ResourceType::Topic, &data.name));
        resolve_topic(ctx, &data.name, may_create).await
    };
    let partitions = data.partition_data.into_iter().zip(turns).map(|(p, mut turn)| {
        let topic = topic.clone();
        async move {
            if let Some(turn) = &mut turn {
                turn.wait().await;
            }
            let response = PartitionProduceResponse::default()
                .with_index(p.index)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            let topic = match topic {
                Ok(topic) => topic,
                Err(code) => return response.with_error_code(code),
            };
            if !valid_acks {
                // Invalid acks fail what would be appended: as in Kafka, a
                // partition the client may not write, or that does not
                // exist, keeps its own error.
                let code = match ensure_partition(ctx, topic, p.index).await {
                    Ok(_) => ResponseError::InvalidRequiredAcks.code(),
                    Err(code) => code,
                };
                return response.with_error_code(code);
            }
            // A request never waits past its timeout (0: no limit); a batch
            // that times out may still be stored, as with Kafka, and an
            // idempotent producer's retry is then deduplicated.
            let produced = produce_partition(
                ctx,
                topic,
                p.index,
                p.records,
                acks,
                transactional == Ok(true),
                version,
            );
            let produced = match deadline {
                None => produced.await,
                // Its turn came after the timeout: nothing is started.
                Some(deadline) if deadline <= tokio::time::Instant::now() => Err(PartitionError::from((
                    ResponseError::RequestTimedOut.code(),
                    Some("the request's timeout_ms passed".to_owned()),
                ))),
                Some(deadline) => tokio::time::timeout_at(deadline, produced)
                    .await
                    .unwrap_or_else(|_| {
                        Err(PartitionError::from((
                            ResponseError::RequestTimedOut.code(),
                            Some("the request's timeout_ms passed".to_owned()),
                        )))
                    }),
            };
            match produced {
                Ok((base_offset, log_start, append_time)) => response
                    .with_base_offset(base_offset)
                    .with_log_start_offset(log_start)
                    .with_log_append_time_ms(append_time),
                Err(e) => response
                    .with_error_code(e.code)
                    .with_error_message(e.message.map(str_bytes))
                    .with_record_errors(e.record_errors),
            }
        }
    });
    TopicProduceResponse::default()
        .with_name(data.name)
        .with_topic_id(data.topic_id)
        .with_partition_responses(super::each(partitions).await)
}

/// Why a partition's batch was refused: the error code, its message, and
/// for errors of particular records (KIP-467) their indexes in the batch.
struct PartitionError {
    code: i16,
    message: Option<String>,
    record_errors: Vec<BatchIndexAndErrorMessage>,
}

impl From<(i16, Option<String>)> for PartitionError {
    fn from((code, message): (i16, Option<String>)) -> Self {
        Self {
            code,
            message,
            record_errors: Vec::new(),
        }
    }
}

async fn produce_partition(
    ctx: &Context,
    topic: Arc<Topic>,
    partition: i32,
    records: Option<Bytes>,
    acks: i16,
    transactional_request: bool,
    version: i16,
) -> Result<(i64, i64, i64), PartitionError> {
    let topic = ensure_partition(ctx, topic, partition)
        .await
        .map_err(|code| (code, None))?;
    let Some(batch) = records.filter(|r| !r.is_empty()) else {
        return Err(PartitionError::from((
            ResponseError::InvalidRecord.code(),
            Some("no record batch".to_owned()),
        )));
    };
    let defaults = ctx.topic_defaults.get();
    let configs = Configs::new(&topic.configs, &defaults);
    let max_bytes = usize::try_from(configs.number("max.message.bytes")).unwrap_or(0);
    if batch.len() > max_bytes {
        return Err(PartitionError::from((
            ResponseError::MessageTooLarge.code(),
            Some(format!(
                "batch of {} bytes exceeds max.message.bytes {max_bytes}",
                batch.len()
            )),
        )));
    }
    let valid = validate(&batch).await.map_err(|e| {
        tracing::debug!(topic = %topic.name, partition, error = %e, "rejected record batch");
        (batch_error_code(&e), Some(e.to_string()))
    })?;
    let mut header = valid.header;
    if version < 7 && matches!(header.compression(), Ok(ketch_storage::batch::Compression::Zstd)) {
        // zstd came with Produce v7 (KIP-110); Kafka refuses it before.
        return Err(PartitionError::from((
            ResponseError::UnsupportedCompressionType.code(),
            Some("zstd-compressed batches need Produce v7 or later".to_owned()),
        )));
    }
    if header.is_transactional() && !transactional_request {
        // Kafka: transactional records need the request's transactional id.
        return Err(PartitionError::from((
            ResponseError::TransactionalIdAuthorizationFailed.code(),
            Some("a transactional batch in a produce request without a transactional id".to_owned()),
        )));
    }
    let log_append_time = configs.get("message.timestamp.type") == "LogAppendTime";
    if log_append_time && header.is_log_append_time() {
        // Kafka's LogValidator: the broker, not the producer, stamps append times.
        return Err(PartitionError::from((
            ResponseError::InvalidTimestamp.code(),
            Some("Producer should not set timestamp type to LogAppendTime".to_owned()),
        )));
    }
    let timestamps = if log_append_time {
        Ok(())
    } else {
        check_timestamps(configs, &batch, &valid.timestamps, header.is_log_append_time())
    };
    if valid.timestamps.null_key && configs.cleans_up_by("compact") {
        let keys = null_keys(&topic, partition, &batch);
        return Err(match timestamps {
            Ok(()) => keys,
            Err(timestamps) => keys_and_timestamps(keys, timestamps),
        });
    }
    timestamps?;
    let batch = to_topic_codec(configs, batch, &mut header).await?;
    if batch.len() > max_bytes {
        return Err(PartitionError::from((
            ResponseError::MessageTooLarge.code(),
            Some(format!(
                "batch of {} bytes once compressed as the topic's compression.type says exceeds \
                 max.message.bytes {max_bytes}",
                batch.len()
            )),
        )));
    }
    let (batch, append_time) = if log_append_time {
        let now = ketch_storage::now_ms();
        header.max_timestamp = now;
        (stamp_log_append_time(&batch, now), now)
    } else if valid.max_timestamp_corrected || header.is_log_append_time() {
        // A producer's LogAppendTime batch on a CreateTime topic is stored
        // as CreateTime with its max timestamp (checked above), as Kafka's
        // LogValidator stores it.
        header.make_create_time();
        (set_max_timestamp(&batch, header.max_timestamp), -1)
    } else {
        (batch, -1)
    };
    let outcome = ctx
        .storage
        .append(&topic, partition, &batch, &header, acks == -1)
        .await
        .map_err(|e| (append_error_code(&e, version), Some(e.to_string())))?;
    if !outcome.duplicate {
        (ctx.topic_counters.produced(&topic.name)).add(
            u64::try_from(header.record_count).unwrap_or(0),
            batch.len() as u64,
        );
    }
    // A retry of a stored batch is answered with the time it was stored
    // at, as Kafka answers a duplicate (its batch is read back: rare).
    let append_time = match log_append_time && outcome.duplicate {
        true => stored_append_time(ctx, &topic, partition, outcome.base_offset)
            .await
            .unwrap_or(append_time),
        false => append_time,
    };
    Ok((outcome.base_offset, outcome.log_start_offset, append_time))
}

/// The append time a LogAppendTime batch stored at `base_offset` carries
/// (its max timestamp), when it can still be read.
async fn stored_append_time(ctx: &Context, topic: &Topic, partition: i32, base_offset: i64) -> Option<i64> {
    let request = ketch_storage::ReadRequest {
        offset: base_offset,
        max_bytes: 1,
        max_batch_bytes: super::max_message_bytes(ctx, topic),
        read_cap: 1,
    };
    let read = ctx.storage.read(topic, partition, &request).await.ok()?;
    let stored = read.batches.first()?;
    let stored_base = i64::from_be_bytes(stored.get(..8)?.try_into().ok()?);
    let header = ketch_storage::batch::header(stored).ok()?;
    (stored_base == base_offset).then_some(header.max_timestamp)
}

/// Kafka's answer to records without a key on a compacted topic
/// (LogValidator): INVALID_RECORD, each keyless record named in
/// `record_errors` (KIP-467), and a message showing the first three.
fn null_keys(topic: &Topic, partition: i32, batch: &Bytes) -> PartitionError {
    let message = format!(
        "Compacted topic cannot accept message without key in topic partition {}-{partition}.",
        topic.name
    );
    let indexes: Vec<usize> = ketch_storage::batch::record_metas(batch)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter(|(_, record)| !record.has_key)
        .map(|(index, _)| index)
        .collect();
    let shown: Vec<String> = indexes
        .iter()
        .take(3)
        .map(|index| format!("ApiRecordError(error=INVALID_RECORD, recordIndex={index}, message={message})"))
        .collect();
    PartitionError {
        code: ResponseError::InvalidRecord.code(),
        message: Some(format!(
            "One or more records have been rejected due to {} record errors in total, and only showing \
             the first three errors at most: [{}]",
            indexes.len(),
            shown.join(", ")
        )),
        record_errors: indexes
            .into_iter()
            .map(|index| {
                BatchIndexAndErrorMessage::default()
                    .with_batch_index(index as i32)
                    .with_batch_index_error_message(Some(str_bytes(message.clone())))
            })
            .collect(),
    }
}

/// A batch with records without a key (for a compacted topic) and records
/// out of the timestamp bounds: as Kafka's LogValidator answers, each record
/// names its key error if it has one, else its timestamp error, and the
/// batch is INVALID_TIMESTAMP since one record's error is.
fn keys_and_timestamps(keys: PartitionError, timestamps: PartitionError) -> PartitionError {
    let keyless: std::collections::HashSet<i32> = keys.record_errors.iter().map(|e| e.batch_index).collect();
    let late: Vec<_> = timestamps
        .record_errors
        .into_iter()
        .filter(|e| !keyless.contains(&e.batch_index))
        .collect();
    if late.is_empty() {
        // Every record out of bounds has no key either: key errors only.
        return keys;
    }
    let mut record_errors = keys.record_errors;
    record_errors.extend(late);
    record_errors.sort_by_key(|e| e.batch_index);
    PartitionError {
        record_errors,
        code: timestamps.code,
        message: timestamps.message,
    }
}

/// Kafka's CreateTime bounds (KIP-937): every record's timestamp within
/// `message.timestamp.before.max.ms` behind and
/// `message.timestamp.after.max.ms` ahead of the gateway's clock, else the
/// batch is refused with INVALID_TIMESTAMP and each offending record named
/// in `record_errors`, as Kafka's LogValidator answers.
/// `log_append_time`: the batch says LogAppendTime, so each of its records
/// is at the batch's max timestamp (`span` holds only that).
fn check_timestamps(
    configs: Configs<'_>,
    batch: &Bytes,
    span: &RecordFacts,
    log_append_time: bool,
) -> Result<(), PartitionError> {
    let bound = |name: &str| configs.number(name);
    let (before, after) = (
        bound("message.timestamp.before.max.ms"),
        bound("message.timestamp.after.max.ms"),
    );
    let now = ketch_storage::now_ms();
    let bad = |timestamp: i64| {
        timestamp != -1 && (now.saturating_sub(timestamp) > before || timestamp.saturating_sub(now) > after)
    };
    if (span.min == i64::MAX || !bad(span.min)) && !bad(span.max) {
        return Ok(());
    }
    let (low, high) = (now.saturating_sub(before), now.saturating_add(after));
    let mut records = ketch_storage::batch::record_metas(batch).unwrap_or_default();
    if log_append_time {
        for record in &mut records {
            record.timestamp = span.max;
        }
    }
    let record_errors = records
        .into_iter()
        .enumerate()
        .filter(|(_, record)| bad(record.timestamp))
        .map(|(index, record)| {
            let (delta, timestamp) = (record.offset_delta, record.timestamp);
            BatchIndexAndErrorMessage::default()
                .with_batch_index(index as i32)
                .with_batch_index_error_message(Some(str_bytes(format!(
                    // The offset as the producer numbered it (from 0).
                    "Timestamp {timestamp} of message with offset {delta} is out of range. The \
                     timestamp should be within [{low}, {high}]"
                ))))
        })
        .collect();
    Err(PartitionError {
        code: ResponseError::InvalidTimestamp.code(),
        message: Some("One or more records have been rejected due to invalid timestamp".to_owned()),
        record_errors,
    })
}

/// A topic's `compression.type` other than `producer`: the batch's records
/// compressed with that codec (at the topic's `compression.gzip.level` or
/// `compression.zstd.level`), as Kafka's LogValidator recompresses; a batch
/// already in that codec is stored as it came. Large batches are
/// recompressed on the blocking pool.
async fn to_topic_codec(
    configs: Configs<'_>,
    batch: Bytes,
    header: &mut BatchHeader,
) -> Result<Bytes, PartitionError> {
    use ketch_storage::batch::Compression;
    let (codec, bits, level) = match configs.get("compression.type") {
        "uncompressed" => (Compression::None, 0, None),
        "gzip" => (Compression::Gzip, 1, Some("compression.gzip.level")),
        "snappy" => (Compression::Snappy, 2, None),
        "lz4" => (Compression::Lz4, 3, None),
        "zstd" => (Compression::Zstd, 4, Some("compression.zstd.level")),
        _ => return Ok(batch),
    };
    if header.compression().ok() == Some(codec) {
        return Ok(batch);
    }
    let level = level
        .and_then(|name| configs.get(name).parse::<i32>().ok())
        .filter(|level| *level != -1);
    let recompressed = if batch.len() <= VALIDATE_INLINE_BYTES {
        ketch_storage::batch::recompress(&batch, codec, level)
    } else {
        on_blocking_pool(move || ketch_storage::batch::recompress(&batch, codec, level))
            .await
            .unwrap_or_else(|e| Err(BatchError::Decompress(format!("recompression task failed: {e}"))))
    };
    let recompressed = recompressed.map_err(|e| (batch_error_code(&e), Some(e.to_string())))?;
    header.attributes = (header.attributes & !0x07) | bits;
    Ok(recompressed)
}

/// Compressed batches larger than this are validated on the blocking pool:
/// decompressing them may take a while, and runtime threads must not stall.
const VALIDATE_INLINE_BYTES: usize = 64 * 1024;

async fn validate(batch: &Bytes) -> Result<ValidBatch, BatchError> {
    let compressed = ketch_storage::batch::header(batch).is_ok_and(|h| h.is_compressed());
    if !compressed || batch.len() <= VALIDATE_INLINE_BYTES {
        return validate_produce_batch(batch);
    }
    let batch = batch.clone();
    on_blocking_pool(move || validate_produce_batch(&batch))
        .await
        .unwrap_or_else(|e| Err(BatchError::Decompress(format!("validation task failed: {e}"))))
}

/// Runs `work` (a large batch's validation or recompression) on the
/// blocking pool, holding one of a gateway-wide few permits until it ends.
/// Blocking work is never cancelled: a produce whose timeout passes is
/// answered while its job goes on, holding its batch (and the request
/// frame it is a slice of) with its permit. Without the bound, a client
/// sending large compressed batches with a tiny `timeout_ms` got each
/// answered at once, its connection's in-flight budget back, and had as
/// many decompressions running as the blocking pool has threads (512).
/// A request that waits for a permit past its timeout starts nothing.
async fn on_blocking_pool<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    static PERMITS: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> = std::sync::LazyLock::new(|| {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Arc::new(tokio::sync::Semaphore::new(2 * cores))
    });
    let permit = PERMITS
        .clone()
        .acquire_owned()
        .await
        .expect("the semaphore is never closed");
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
}

/// An append's error code. A transactional batch for a partition its
/// transaction does not hold is TRANSACTION_ABORTABLE from Produce v11
/// (KIP-890: the client aborts the transaction and goes on), as Kafka's
/// transaction verification answers it, and INVALID_TXN_STATE, which older
/// clients know, before.
fn append_error_code(e: &ketch_storage::StorageError, version: i16) -> i16 {
    match e {
        ketch_storage::StorageError::Sequence(ketch_storage::SequenceError::NotInTransaction)
            if version >= 11 =>
        {
            ResponseError::TransactionAbortable.code()
        }
        e => error_code(e),
    }
}

/// Kafka's codes: bytes that are not what the producer meant (a CRC or
/// length that does not hold, data that does not decompress) are
/// CORRUPT_MESSAGE, which clients retry; a well-formed batch whose
/// content breaks a rule (its count, offset deltas, record framing, magic)
/// is INVALID_RECORD, which they do not: sending it again cannot help
/// (Kafka's `InvalidRecordException`).
fn batch_error_code(e: &BatchError) -> i16 {
    match e {
        BatchError::TooShort(_)
        | BatchError::LengthMismatch { .. }
        | BatchError::Crc { .. }
        | BatchError::Codec(_)
        | BatchError::Decompress(_) => ResponseError::CorruptMessage.code(),
        // Kafka's batch reader takes a magic above 2 (or negative) for
        // corruption; 0 and 1 are refused in a Produce request's checks.
        BatchError::Magic(magic) if !(0..=1).contains(magic) => ResponseError::CorruptMessage.code(),
        BatchError::Magic(_)
        | BatchError::RecordCount(_)
        | BatchError::OffsetDelta { .. }
        | BatchError::CountTooLarge { .. }
        | BatchError::Records(_)
        | BatchError::MultipleBatches
        | BatchError::Control
        | BatchError::Transactional
        | BatchError::Sequence { .. }
        | BatchError::BaseOffset(_) => ResponseError::InvalidRecord.code(),
        _ => ResponseError::CorruptMessage.code(),
    }
}
