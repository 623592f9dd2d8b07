//! Fetch (v4–v18): read whole batches from each partition within the byte
//! limits (KIP-74), and long-poll for `min_bytes` up to `max_wait_ms`.
//!
//! Waiting never polls Redis: the fetch registers on its partitions' wake-up
//! channels (in-process for local appends, sharded pub/sub for appends made
//! by other gateways), re-reads once the registration is confirmed, then
//! sleeps until woken or the deadline. Fetch sessions (KIP-227) are not
//! kept: session id 0 tells clients to send full requests.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, RequestHeader};
use ketch_storage::{Fired, PartitionOffsets, ReadPartition, ReadRequest, StorageError, Topic};
use tokio::time::Instant;

use super::{Client, authorized, ensure_partition, error_code, resolve_topic, resolve_topic_id};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

/// One partition of the request, resolved.
struct Target {
    topic: Result<Arc<Topic>, i16>,
    partition: i32,
    offset: i64,
    max_bytes: usize,
}

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: FetchRequest,
) -> FetchResponse {
    let version = header.request_api_version;
    if version >= 7 && request.session_id != 0 {
        return FetchResponse::default().with_error_code(ResponseError::FetchSessionIdNotFound.code());
    }
    let read_committed = request.isolation_level == 1;
    let max_bytes = usize::try_from(request.max_bytes)
        .unwrap_or(0)
        .min(ctx.settings.fetch.max_response_bytes);
    let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0);
    let max_wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0))
        .min(ctx.settings.fetch.max_wait.get());
    let deadline = Instant::now() + max_wait;

    let mut topics = Vec::with_capacity(request.topics.len());
    for fetch_topic in &request.topics {
        topics.push(resolve(ctx, client, version, fetch_topic).await);
    }

    // Register for wake-ups before the first read, so an append between the
    // read and the wait is not missed; a fetch that cannot wait needs none.
    let channels = wake_channels(&topics);
    let may_wait = min_bytes > 0 && !max_wait.is_zero() && !channels.is_empty();
    let watch = may_wait.then(|| ctx.storage.wake().watch(channels));
    let mut confirmed = false;
    let mut shutdown = ctx.shutdown.clone();
    let mut reads = read_all(ctx, &topics, &Fired::All, Vec::new(), max_bytes).await;
    loop {
        let (responses, bytes, any_error) =
            assemble(&request.topics, &topics, &reads, max_bytes, read_committed);
        let Some(w) = watch
            .as_ref()
            .filter(|_| bytes < min_bytes && !any_error && Instant::now() < deadline && !*shutdown.borrow())
        else {
            return FetchResponse::default().with_responses(responses);
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let fired = if confirmed {
            tokio::select! {
                _ = w.notified() => {}
                _ = tokio::time::sleep(remaining) => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
            w.take_fired()
        } else {
            confirmed = true;
            w.subscribed(remaining).await;
            w.take_fired_since_start()
        };
        reads = read_all(ctx, &topics, &fired, reads, max_bytes).await;
    }
}

async fn resolve(ctx: &Context, client: &Client, version: i16, fetch_topic: &FetchTopic) -> Vec<Target> {
    let readable = |name: &str| authorized(ctx, client, Operation::Read, ResourceType::Topic, name);
    let topic = if version >= 13 {
        match resolve_topic_id(ctx, fetch_topic.topic_id).await {
            Ok(topic) if !readable(&topic.name) => Err(ResponseError::TopicAuthorizationFailed.code()),
            other => other,
        }
    } else if !readable(&fetch_topic.topic) {
        Err(ResponseError::TopicAuthorizationFailed.code())
    } else {
        resolve_topic(ctx, &fetch_topic.topic, false).await
    };
    let mut targets = Vec::with_capacity(fetch_topic.partitions.len());
    for p in &fetch_topic.partitions {
        let topic = match &topic {
            Ok(t) => ensure_partition(ctx, t.clone(), p.partition).await,
            Err(code) => Err(*code),
        };
        targets.push(Target {
            topic,
            partition: p.partition,
            offset: p.fetch_offset,
            max_bytes: usize::try_from(p.partition_max_bytes).unwrap_or(0),
        });
    }
    targets
}

fn wake_channels(topics: &[Vec<Target>]) -> Vec<String> {
    topics
        .iter()
        .flatten()
        .filter_map(|t| {
            t.topic
                .as_ref()
                .ok()
                .and_then(|topic| topic.wake_channel(t.partition))
                .map(str::to_owned)
        })
        .collect()
}

type ReadResult = Result<ReadPartition, StorageError>;

/// Reads the partitions whose wake-up channel fired; the others keep their
/// `previous` result (they had nothing to return, and nothing changed).
/// Partitions are read in request order against the response's byte
/// budget, as a Kafka broker does, so a fetch never pulls from Redis what it
/// cannot send; partitions past the budget get only their offsets.
async fn read_all(
    ctx: &Context,
    topics: &[Vec<Target>],
    fired: &Fired,
    previous: Vec<Vec<Option<ReadResult>>>,
    max_bytes: usize,
) -> Vec<Vec<Option<ReadResult>>> {
    let mut previous = previous.into_iter();
    let mut budget = max_bytes;
    let mut reads = Vec::with_capacity(topics.len());
    for targets in topics {
        let mut kept = previous.next().unwrap_or_default().into_iter();
        let mut results = Vec::with_capacity(targets.len());
        for target in targets {
            let kept = kept.next().flatten();
            let Ok(topic) = target.topic.as_ref() else {
                results.push(None);
                continue;
            };
            let Some(wake) = topic.wake_channel(target.partition) else {
                results.push(Some(Err(StorageError::UnknownTopicOrPartition)));
                continue;
            };
            let result = match kept {
                Some(kept) if !fired.includes(wake) => kept,
                _ => read_partition(ctx, topic, target, wake, budget).await,
            };
            if let Ok(read) = &result {
                budget = budget.saturating_sub(read.batches.iter().map(Bytes::len).sum());
            }
            results.push(Some(result));
        }
        reads.push(results);
    }
    reads
}

/// Reads one partition, unless this gateway knows it holds nothing at the
/// fetch offset (see `ketch_storage::wake`); feeds what it reads back.
async fn read_partition(
    ctx: &Context,
    topic: &Topic,
    target: &Target,
    wake: &str,
    budget: usize,
) -> ReadResult {
    let hub = ctx.storage.wake();
    if let Some(log_start_offset) = hub.known_empty_at(wake, target.offset) {
        return Ok(ReadPartition {
            offsets: Some(PartitionOffsets {
                log_start_offset,
                local_start_offset: log_start_offset,
                high_watermark: target.offset,
            }),
            batches: Vec::new(),
        });
    }
    if budget == 0 {
        let offsets = ctx.storage.offsets(topic, target.partition).await?;
        return Ok(ReadPartition {
            offsets: Some(offsets),
            batches: Vec::new(),
        });
    }
    let generation = hub.generation(wake);
    let max_batch_bytes = super::max_message_bytes(ctx, topic);
    let request = ReadRequest {
        offset: target.offset,
        max_bytes: target.max_bytes.min(budget),
        max_batch_bytes,
        read_cap: budget,
    };
    let read = ctx.storage.read(topic, target.partition, &request).await;
    if let (Some(generation), Ok(ReadPartition { offsets: Some(o), .. })) = (generation, &read) {
        hub.observe(wake, generation, o.high_watermark, o.log_start_offset);
    }
    read
}

/// Builds the response within the byte limits; returns it with the bytes it
/// carries and whether any partition failed.
fn assemble(
    requested: &[FetchTopic],
    topics: &[Vec<Target>],
    reads: &[Vec<Option<ReadResult>>],
    max_bytes: usize,
    read_committed: bool,
) -> (Vec<FetchableTopicResponse>, usize, bool) {
    let mut total = 0usize;
    let mut any_error = false;
    let mut responses = Vec::with_capacity(requested.len());
    for ((fetch_topic, targets), reads) in requested.iter().zip(topics).zip(reads) {
        let mut partitions = Vec::with_capacity(targets.len());
        for (target, read) in targets.iter().zip(reads) {
            let data = PartitionData::default()
                .with_partition_index(target.partition)
                .with_high_watermark(-1)
                .with_last_stable_offset(-1)
                .with_log_start_offset(-1)
                .with_preferred_read_replica(BrokerId(-1));
            let data = match (&target.topic, read) {
                (Err(code), _) => {
                    any_error = true;
                    data.with_error_code(*code)
                }
                (Ok(_), Some(Ok(read))) => {
                    let offsets = read.offsets.expect("a successful read has offsets");
                    let records = take_batches(&read.batches, target.max_bytes, max_bytes, &mut total);
                    data.with_high_watermark(offsets.high_watermark)
                        .with_last_stable_offset(offsets.high_watermark)
                        .with_log_start_offset(offsets.log_start_offset)
                        .with_aborted_transactions(read_committed.then(Vec::new))
                        .with_records(Some(records))
                }
                (Ok(_), Some(Err(e))) => {
                    any_error = true;
                    let data = data.with_error_code(error_code(e));
                    match e {
                        StorageError::OffsetOutOfRange {
                            log_start,
                            high_watermark,
                        } => data
                            .with_high_watermark(*high_watermark)
                            .with_last_stable_offset(*high_watermark)
                            .with_log_start_offset(*log_start),
                        _ => data,
                    }
                }
                (Ok(_), None) => data.with_error_code(ResponseError::UnknownServerError.code()),
            };
            partitions.push(data);
        }
        responses.push(
            FetchableTopicResponse::default()
                .with_topic(fetch_topic.topic.clone())
                .with_topic_id(fetch_topic.topic_id)
                .with_partitions(partitions),
        );
    }
    (responses, total, any_error)
}

/// Takes whole batches while they fit the partition and response limits;
/// the first batch of the response is taken whatever its size (KIP-74).
fn take_batches(batches: &[Bytes], partition_max: usize, response_max: usize, total: &mut usize) -> Bytes {
    let mut taken: Vec<Bytes> = Vec::new();
    let mut size = 0usize;
    for batch in batches {
        let fits = size + batch.len() <= partition_max && *total + batch.len() <= response_max;
        if !(fits || *total == 0) {
            break;
        }
        size += batch.len();
        *total += batch.len();
        taken.push(batch.clone());
    }
    match taken.len() {
        0 => Bytes::new(),
        1 => taken.pop().expect("one batch"),
        _ => {
            let mut buf = BytesMut::with_capacity(size);
            for batch in taken {
                buf.extend_from_slice(&batch);
            }
            buf.freeze()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batches(sizes: &[usize]) -> Vec<Bytes> {
        sizes.iter().map(|&n| Bytes::from(vec![0u8; n])).collect()
    }

    #[test]
    fn the_first_batch_of_a_response_is_taken_even_when_too_large() {
        let mut total = 0;
        assert_eq!(
            take_batches(&batches(&[500, 10]), 100, 100, &mut total).len(),
            500
        );
        assert_eq!(total, 500);
    }

    #[test]
    fn batches_stop_at_the_partition_and_response_limits() {
        let mut total = 0;
        assert_eq!(
            take_batches(&batches(&[40, 40, 40]), 100, 1000, &mut total).len(),
            80
        );
        assert_eq!(take_batches(&batches(&[40, 40]), 100, 150, &mut total).len(), 40);
        assert_eq!(total, 120);
        assert_eq!(take_batches(&batches(&[40]), 100, 150, &mut total).len(), 0);
    }
}
