//! Fetch (v4–v18): read whole batches from each partition within the byte
//! limits (KIP-74), and long-poll for `min_bytes` up to `max_wait_ms`.
//!
//! Waiting never polls Redis: the fetch registers on its partitions' wake-up
//! channels (in-process for local appends, sharded pub/sub for appends made
//! by other gateways), re-reads once the registration is confirmed, then
//! sleeps until woken or the deadline. Fetch sessions (KIP-227) are not
//! kept: session id 0 tells clients to send full requests.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, ProducerId, RequestHeader};
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

/// A fetch's response with its record batches kept apart: the batches of a
/// partition are the stored ones (regions of what Redis sent), written to
/// the client as they are by [`encode`], not joined into one buffer first.
#[derive(Debug, Default)]
pub struct FetchAnswer {
    /// The response; a partition whose batches are in `records` has its
    /// `records` field `None` here.
    pub response: FetchResponse,
    /// Per topic, per partition: the batches of its records, or `None`
    /// where the response's own `records` field holds them.
    pub records: Vec<Vec<Option<Vec<Bytes>>>>,
    /// The records and bytes the response sends, per topic: added to the
    /// topic counters by [`Fetched::count`] once it is sent (a fetch a
    /// quota throttles sends none of them).
    pub fetched: Fetched,
}

/// The records and bytes a fetch response sends, per topic.
#[derive(Debug, Default)]
pub struct Fetched(Vec<(Arc<Topic>, u64, u64)>);

impl Fetched {
    /// Adds them to the topics' counters.
    pub fn count(&self, ctx: &Context) {
        for (topic, records, bytes) in &self.0 {
            ctx.topic_counters.fetched(&topic.name).add(*records, *bytes);
        }
    }
}

impl FetchAnswer {
    /// The answer to a fetch a quota throttles: no data, and how long the
    /// client is to wait (Kafka's throttled fetch response).
    pub fn throttled(throttle: Duration) -> Self {
        let ms = i32::try_from(throttle.as_millis()).unwrap_or(i32::MAX);
        Self {
            response: FetchResponse::default().with_throttle_time_ms(ms),
            ..Self::default()
        }
    }

    /// The response with every partition's batches joined into its
    /// `records` field (one copy; for paths that want a plain response).
    pub fn into_response(mut self) -> FetchResponse {
        for (topic, records) in self.response.responses.iter_mut().zip(self.records) {
            for (partition, batches) in topic.partitions.iter_mut().zip(records) {
                if let Some(batches) = batches {
                    partition.records = Some(join(batches));
                }
            }
        }
        self.response
    }
}

fn join(mut batches: Vec<Bytes>) -> Bytes {
    match batches.len() {
        0 => Bytes::new(),
        1 => batches.pop().expect("one batch"),
        _ => {
            let mut buf = BytesMut::with_capacity(batches.iter().map(Bytes::len).sum());
            for batch in batches {
                buf.extend_from_slice(&batch);
            }
            buf.freeze()
        }
    }
}

/// Encodes a size-prefixed Fetch response frame as chunks: the stored
/// batches are chunks of their own, between the encoded fields, so the
/// connection writes them (vectored) without copying them into a response
/// buffer. The bytes are those of the response kafka-protocol would encode
/// ([`FetchAnswer::into_response`]); a response with fields this encoder
/// does not write (tagged fields ketch never sets) is encoded by
/// kafka-protocol instead.
pub fn encode(answer: FetchAnswer, version: i16, correlation_id: i32) -> anyhow::Result<Vec<Bytes>> {
    use kafka_protocol::messages::ResponseHeader;
    use kafka_protocol::protocol::Encodable;
    let response = &answer.response;
    let plain = |p: &PartitionData| {
        p.diverging_epoch == Default::default()
            && p.current_leader == Default::default()
            && p.snapshot_id == Default::default()
            && p.unknown_tagged_fields.is_empty()
    };
    let simple = response.node_endpoints.is_empty()
        && response.unknown_tagged_fields.is_empty()
        && response.responses.len() == answer.records.len()
        && response
            .responses
            .iter()
            .zip(&answer.records)
            .all(|(t, records)| {
                t.unknown_tagged_fields.is_empty()
                    && t.partitions.len() == records.len()
                    && t.partitions.iter().all(plain)
            });
    if !simple || !(4..=18).contains(&version) {
        let kind = kafka_protocol::messages::ResponseKind::Fetch(answer.into_response());
        let frame = crate::server::encode_response(
            kafka_protocol::messages::ApiKey::Fetch,
            version,
            correlation_id,
            &kind,
        )?;
        return Ok(vec![frame]);
    }
    let flexible = version >= 12;
    let mut chunks = Vec::new();
    let mut buf = BytesMut::with_capacity(256);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, if flexible { 1 } else { 0 })?;
    buf.put_i32(response.throttle_time_ms);
    if version >= 7 {
        buf.put_i16(response.error_code);
        buf.put_i32(response.session_id);
    }
    put_array_len(&mut buf, response.responses.len(), flexible);
    for (topic, records) in response.responses.iter().zip(answer.records) {
        if version >= 13 {
            buf.put_slice(topic.topic_id.as_bytes());
        } else {
            let name = topic.topic.0.as_bytes();
            if flexible {
                put_uvarint(&mut buf, name.len() as u64 + 1);
            } else {
                buf.put_i16(i16::try_from(name.len())?);
            }
            buf.put_slice(name);
        }
        put_array_len(&mut buf, topic.partitions.len(), flexible);
        for (partition, batches) in topic.partitions.iter().zip(records) {
            partition.encode(&mut buf, version)?;
            let Some(batches) = batches else {
                continue;
            };
            // Encoded with null records: the null marker is the last field
            // (then, when flexible, the empty tagged fields byte).
            let tail = if flexible { 2 } else { 4 };
            buf.truncate(buf.len() - tail);
            let len: usize = batches.iter().map(Bytes::len).sum();
            if flexible {
                put_uvarint(&mut buf, len as u64 + 1);
            } else {
                buf.put_i32(i32::try_from(len)?);
            }
            chunks.push(buf.split().freeze());
            chunks.extend(batches.into_iter().filter(|b| !b.is_empty()));
            if flexible {
                buf.put_u8(0);
            }
        }
        if flexible {
            buf.put_u8(0);
        }
    }
    if flexible {
        buf.put_u8(0);
    }
    chunks.push(buf.freeze());
    let size: usize = chunks.iter().map(Bytes::len).sum();
    chunks.insert(0, Bytes::copy_from_slice(&i32::try_from(size)?.to_be_bytes()));
    Ok(chunks)
}

fn put_array_len(buf: &mut BytesMut, len: usize, flexible: bool) {
    if flexible {
        put_uvarint(buf, len as u64 + 1);
    } else {
        buf.put_i32(len as i32);
    }
}

fn put_uvarint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: FetchRequest,
) -> FetchAnswer {
    let version = header.request_api_version;
    // No fetch sessions (decision (e)): ketch answers session id 0, so only
    // an incremental fetch (epoch above 0) can name one, and none is found.
    // A full fetch (epoch 0 or -1) naming one is served, as Kafka closes the
    // session it names and serves it.
    if version >= 7 && request.session_id != 0 && request.session_epoch > 0 {
        return FetchAnswer {
            response: FetchResponse::default().with_error_code(ResponseError::FetchSessionIdNotFound.code()),
            ..FetchAnswer::default()
        };
    }
    let read_committed = request.isolation_level == 1;
    // At least one byte: the first batch is returned whatever the limit
    // (KIP-74), so a limit of 0 gets one batch, not a wait for nothing.
    let max_bytes = usize::try_from(request.max_bytes)
        .unwrap_or(0)
        .clamp(1, ctx.settings.fetch.max_response_bytes.max(1));
    // Kafka waits for no more than the response may hold.
    let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0).min(max_bytes);
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
    let mut reads = read_all(ctx, &topics, &Fired::All, Vec::new(), max_bytes, read_committed).await;
    let mut waited: Option<Instant> = None;
    loop {
        let (mut responses, mut records, bytes, any_error) =
            assemble(&request.topics, &topics, &reads, max_bytes, read_committed);
        // A fetch that read from the archive is answered at once, as Kafka
        // answers a fetch with a remote read when that read completes,
        // whatever `min_bytes`: an archived segment's end (or a read cut
        // off by `tiering.remote_fetch_max_wait`) is no reason to wait for
        // appends.
        let remote = read_the_archive(&topics, &reads);
        let Some(w) = watch.as_ref().filter(|_| {
            bytes < min_bytes && !any_error && !remote && Instant::now() < deadline && !*shutdown.borrow()
        }) else {
            if let Some(since) = waited {
                ctx.requests.fetch_waited(since.elapsed());
            }
            if read_committed {
                add_aborted_transactions(ctx, &topics, &reads, &mut responses, &mut records).await;
            }
            if version <= 5 {
                // Before v6 clients may not know KAFKA_STORAGE_ERROR and take
                // it as fatal; Kafka answers NOT_LEADER_OR_FOLLOWER, which
                // makes them refresh metadata and retry.
                for partition in responses.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
                    if partition.error_code == ResponseError::KafkaStorageError.code() {
                        partition.error_code = ResponseError::NotLeaderOrFollower.code();
                    }
                }
            }
            if version < 10 {
                refuse_zstd(ctx, &topics, &mut responses, &mut records);
            }
            let fetched = fetched(&topics, &records);
            return FetchAnswer {
                response: FetchResponse::default().with_responses(responses),
                records,
                fetched,
            };
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        waited.get_or_insert_with(Instant::now);
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
        reads = read_all(ctx, &topics, &fired, reads, max_bytes, read_committed).await;
    }
}

/// Whether a partition of the fetch was read at an offset below its local
/// start: from the archive.
fn read_the_archive(topics: &[Vec<Target>], reads: &[Vec<Option<ReadResult>>]) -> bool {
    topics.iter().zip(reads).any(|(targets, reads)| {
        targets.iter().zip(reads).any(|(target, read)| {
            matches!(read, Some(Ok(ReadPartition { offsets: Some(o), .. })) if target.offset < o.local_start_offset)
        })
    })
}

/// The records and bytes a response sends, per topic.
fn fetched(topics: &[Vec<Target>], records: &[Vec<Option<Vec<Bytes>>>]) -> Fetched {
    let mut fetched = Fetched::default();
    for (targets, partitions) in topics.iter().zip(records) {
        let Some(topic) = targets.iter().find_map(|t| t.topic.as_ref().ok()) else {
            continue;
        };
        let (mut count, mut bytes) = (0, 0);
        for batch in partitions.iter().flatten().flatten() {
            let (c, b) = crate::metrics::batch_totals(batch);
            count += c;
            bytes += b;
        }
        if bytes > 0 {
            fetched.0.push((topic.clone(), count, bytes));
        }
    }
    fetched
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
///
/// The response's byte budget is shared out in request order, as a Kafka
/// broker fills a response, so a fetch never pulls from Redis much more
/// than it can send: each partition to read takes its
/// `partition_max_bytes` of what is left, or about what it holds where
/// this gateway knows that (its next offset and batch sizes), and the
/// partitions that got a share are read together (their reads pipelined
/// on the data path's connection, not one round trip after another).
/// Those left without one are read in a next round with what the first
/// did not use; once the budget is spent, partitions get only their
/// offsets. A read may exceed its share by one batch (the caller drops
/// what does not fit). A partition this gateway knows to be empty at the
/// fetch offset is not read and takes no share; nor is one a
/// read_committed fetch found held at the fetch offset by an undecided
/// transaction, while its offsets say it still is ([`still_held`]).
///
/// A partition woken after batches were read from it (a fetch gathering
/// its `min_bytes` while another gateway appends) keeps them and has only
/// what follows them read, within what its `partition_max_bytes` has
/// left: each wake reads what the appends added, not again everything
/// gathered since the fetch offset. Kafka's delayed fetch reads the log
/// once, when it completes; this reads each batch once.
async fn read_all(
    ctx: &Context,
    topics: &[Vec<Target>],
    fired: &Fired,
    previous: Vec<Vec<Option<ReadResult>>>,
    max_bytes: usize,
    read_committed: bool,
) -> Vec<Vec<Option<ReadResult>>> {
    let mut held = if read_committed {
        still_held(ctx, topics, fired, &previous).await
    } else {
        HashMap::new()
    };
    let mut previous = previous.into_iter();
    let mut budget = max_bytes;
    let mut reads = Vec::with_capacity(topics.len());
    // The partitions to read, in request order, with their wake channels.
    let mut pending = Vec::new();
    for (t, targets) in topics.iter().enumerate() {
        let mut kept = previous.next().unwrap_or_default().into_iter();
        let mut results = Vec::with_capacity(targets.len());
        for (p, target) in targets.iter().enumerate() {
            let kept = kept.next().flatten();
            let Ok(topic) = target.topic.as_ref() else {
                results.push(None);
                continue;
            };
            let Some(wake) = topic.wake_channel(target.partition) else {
                results.push(Some(Err(StorageError::UnknownTopicOrPartition)));
                continue;
            };
            match kept {
                Some(kept) if !fired.includes(wake) => {
                    if let Ok(read) = &kept {
                        budget = budget.saturating_sub(read_bytes(read));
                    }
                    results.push(Some(kept));
                }
                Some(Ok(gathered)) if !gathered.batches.is_empty() => {
                    budget = budget.saturating_sub(read_bytes(&gathered));
                    results.push(None);
                    pending.push((t, p, topic, wake, Some(gathered)));
                }
                _ if let Some(offsets) = held.remove(&(t, p)) => {
                    results.push(Some(Ok(ReadPartition {
                        offsets: Some(offsets),
                        batches: Vec::new(),
                    })));
                }
                _ => match known_empty(ctx, target, wake, read_committed) {
                    Some(empty) => results.push(Some(Ok(empty))),
                    None => {
                        results.push(None);
                        pending.push((t, p, topic, wake, None));
                    }
                },
            }
        }
        reads.push(results);
    }
    while !pending.is_empty() {
        let mut left = budget;
        let mut round = Vec::with_capacity(pending.len());
        let mut later = Vec::new();
        for (i, (t, p, topic, wake, gathered)) in pending.into_iter().enumerate() {
            let target = &topics[t][p];
            // Where the read starts, what the partition may still take
            // and what the read may: after what was gathered, or from the
            // fetch offset, where a partition_max_bytes of 0 still reads
            // one batch (KIP-74).
            let (offset, room, limit) = match &gathered {
                Some(gathered) => {
                    let room = target.max_bytes.saturating_sub(read_bytes(gathered));
                    let after = gathered
                        .batches
                        .last()
                        .map_or(target.offset, |b| last_offset(b) + 1);
                    (after, room, budget.min(room))
                }
                None => (
                    target.offset,
                    target.max_bytes,
                    budget.min(target.max_bytes.max(1)),
                ),
            };
            let gathered = match gathered {
                // Full, or the response is: what was gathered is sent.
                Some(gathered) if limit == 0 => {
                    reads[t][p] = Some(Ok(gathered));
                    continue;
                }
                gathered => gathered,
            };
            // What this gateway appended last and still holds (a tailing
            // consumer's partition): no read of Redis.
            if let Some(read) = ctx.storage.wake().read_tail(wake, offset, limit, read_committed) {
                ctx.requests.fetch_read(true);
                // What was gathered has taken its bytes of the budget.
                let had = gathered.as_ref().map_or(0, read_bytes);
                let Ok(mut read) = add_gathered(gathered, Ok(read)) else {
                    unreachable!("a read from the tail is no error");
                };
                keep_sendable(&mut read, read_committed);
                let bytes = read_bytes(&read).saturating_sub(had);
                budget = budget.saturating_sub(bytes);
                left = left.saturating_sub(bytes);
                reads[t][p] = Some(Ok(read));
                continue;
            }
            // What the read takes of the budget: about what the partition
            // holds when this gateway knows (a tailing consumer's
            // partitions hold a few batches), else all it may read.
            let (read_limit, takes) = match expected_bytes(ctx, topic, target.partition, offset, wake) {
                Some(expected) => (limit, expected.min(limit)),
                None => (limit.min(left), limit.min(left)),
            };
            // With budget left, every round reads at least its first
            // partition; once it is spent, every partition gets its offsets.
            if (read_limit > 0 && takes <= left) || i == 0 || budget == 0 {
                left -= takes.min(left);
                let read = read_partition(ctx, topic, target, offset, room, wake, read_limit);
                round.push((t, p, gathered, read));
            } else {
                later.push((t, p, topic, wake, gathered));
            }
        }
        let (places, round): (Vec<_>, Vec<_>) = round
            .into_iter()
            .map(|(t, p, gathered, read)| ((t, p, gathered), read))
            .unzip();
        for ((t, p, gathered), result) in places.into_iter().zip(futures::future::join_all(round).await) {
            let had = gathered.as_ref().map_or(0, read_bytes);
            if had > 0 && matches!(result, Err(StorageError::OffsetOutOfRange { .. })) {
                // The log no longer reaches what was gathered (a failover
                // lost appends never replicated): the partition is read
                // again from the fetch offset, which may still be in range.
                budget += had;
                let target = &topics[t][p];
                if let Ok(topic) = target.topic.as_ref()
                    && let Some(wake) = topic.wake_channel(target.partition)
                {
                    later.push((t, p, topic, wake, None));
                    continue;
                }
            }
            let mut result = add_gathered(gathered, result);
            if let Ok(read) = &mut result {
                keep_sendable(read, read_committed);
                budget = budget.saturating_sub(read_bytes(read).saturating_sub(had));
            }
            reads[t][p] = Some(result);
        }
        pending = later;
    }
    reads
}

/// The partitions of a read_committed fetch whose last read found an
/// undecided transaction at the fetch offset (its last stable offset at
/// or below it: nothing to send) and whose wake-up channel fired, with
/// their offsets read afresh, where those say it still is. Each append of
/// that transaction wakes the fetch; a read of the partition would fetch
/// up to its `partition_max_bytes` from the fetch offset and send none of
/// it, so only its offsets are read (one command each, all at once), as
/// Kafka's delayed fetch compares offsets and reads nothing until the
/// last stable offset moves on.
async fn still_held(
    ctx: &Context,
    topics: &[Vec<Target>],
    fired: &Fired,
    previous: &[Vec<Option<ReadResult>>],
) -> HashMap<(usize, usize), PartitionOffsets> {
    let mut checks = Vec::new();
    for (t, targets) in topics.iter().enumerate() {
        for (p, target) in targets.iter().enumerate() {
            let Some(Some(Ok(read))) = previous.get(t).and_then(|reads| reads.get(p)) else {
                continue;
            };
            let (Ok(topic), Some(offsets)) = (target.topic.as_ref(), read.offsets) else {
                continue;
            };
            let woken = topic
                .wake_channel(target.partition)
                .is_some_and(|wake| fired.includes(wake));
            // An undecided transaction's batches are there: a caught-up
            // partition (its last stable offset at the high watermark) is
            // read as before, from this gateway's own appends if it can.
            let undecided = offsets.last_stable_offset < offsets.high_watermark;
            if woken && undecided && read.batches.is_empty() && offsets.last_stable_offset <= target.offset {
                checks.push(async move {
                    let offsets = ctx.storage.offsets(topic, target.partition).await;
                    ((t, p), offsets, target.offset)
                });
            }
        }
    }
    futures::future::join_all(checks)
        .await
        .into_iter()
        .filter_map(|(place, offsets, offset)| {
            // Anything else (the transaction decided, the offset out of
            // range or below the local start) is read as usual.
            let offsets = offsets.ok()?;
            (offsets.last_stable_offset <= offset
                && offsets.log_start_offset <= offset
                && offsets.local_start_offset <= offset
                && offset <= offsets.high_watermark)
                .then_some((place, offsets))
        })
        .collect()
}

/// About the bytes a partition holds from `offset`, when this gateway
/// knows its next offset (see `ketch_storage::wake`) and the size of its
/// batches.
fn expected_bytes(ctx: &Context, topic: &Topic, partition: i32, offset: i64, wake: &str) -> Option<usize> {
    let next = ctx.storage.wake().known_next(wake)?;
    let records = next.checked_sub(offset).filter(|&r| r > 0)?;
    ctx.storage.bytes_estimate(topic, partition, records)
}

/// A read after batches already gathered from the partition: those
/// batches with the read's after them, and the read's offsets (the
/// partition as it is now), but the aborted transactions as far back as
/// either read knew them: a read from this gateway's tail knows none,
/// and the gathered batches may hold an aborted transaction's, which a
/// read_committed client must be told of. A read that fails is the
/// partition's answer, as a read from the fetch offset would have been.
fn add_gathered(gathered: Option<ReadPartition>, read: ReadResult) -> ReadResult {
    let Some(mut gathered) = gathered else {
        return read;
    };
    let read = read?;
    gathered.batches.extend(read.batches);
    gathered.offsets = match (gathered.offsets, read.offsets) {
        (Some(before), Some(now)) => Some(PartitionOffsets {
            last_abort: now.last_abort.max(before.last_abort),
            aborted_span: now.aborted_span.max(before.aborted_span),
            ..now
        }),
        (before, now) => now.or(before),
    };
    Ok(gathered)
}

/// Whether a topic's error says the request named it wrongly (Kafka's
/// "erroneous" partitions, answered without a read).
fn named_wrongly(code: i16) -> bool {
    [
        ResponseError::UnknownTopicOrPartition.code(),
        ResponseError::UnknownTopicId.code(),
        ResponseError::TopicAuthorizationFailed.code(),
        ResponseError::InvalidTopicException.code(),
    ]
    .contains(&code)
}

/// Drops what a read_committed fetch may not send (batches from the last
/// stable offset on: an undecided transaction's, and all after it), so
/// they take none of the response's bytes: Kafka's read stops there, and
/// the partitions after this one get the budget.
fn keep_sendable(read: &mut ReadPartition, read_committed: bool) {
    if let (true, Some(offsets)) = (read_committed, read.offsets) {
        let sendable = below(&read.batches, offsets.last_stable_offset).len();
        read.batches.truncate(sendable);
    }
}

fn read_bytes(read: &ReadPartition) -> usize {
    read.batches.iter().map(Bytes::len).sum()
}

/// What a read of a partition this gateway knows to hold nothing at the
/// fetch offset would find (see `ketch_storage::wake`), without reading
/// it. For a read_committed fetch the partition must also be known to
/// have every transaction decided there (a read saw its last stable
/// offset at the fetch offset): the last stable offset it reports is then
/// the fetch offset. librdkafka's consumers are read_committed by default.
fn known_empty(ctx: &Context, target: &Target, wake: &str, read_committed: bool) -> Option<ReadPartition> {
    let log_start_offset = ctx
        .storage
        .wake()
        .known_empty_at(wake, target.offset, read_committed)?;
    Some(ReadPartition {
        offsets: Some(PartitionOffsets::plain(
            log_start_offset,
            log_start_offset,
            target.offset,
        )),
        batches: Vec::new(),
    })
}

/// Reads one partition from `offset`, up to `max_bytes` of it and
/// `budget` bytes of the response (its offsets only when that is 0);
/// feeds what it reads back to the wake-up hub.
async fn read_partition(
    ctx: &Context,
    topic: &Topic,
    target: &Target,
    offset: i64,
    max_bytes: usize,
    wake: &str,
    budget: usize,
) -> ReadResult {
    ctx.requests.fetch_read(false);
    if budget == 0 {
        let offsets = ctx.storage.offsets(topic, target.partition).await?;
        // Out of range is told whatever the response's room, as Kafka
        // checks the offset before it reads.
        if target.offset < offsets.log_start_offset || target.offset > offsets.high_watermark {
            return Err(StorageError::OffsetOutOfRange {
                log_start: offsets.log_start_offset,
                high_watermark: offsets.high_watermark,
            });
        }
        return Ok(ReadPartition {
            offsets: Some(offsets),
            batches: Vec::new(),
        });
    }
    let hub = ctx.storage.wake();
    let generation = hub.generation(wake);
    let max_batch_bytes = super::max_message_bytes(ctx, topic);
    let request = ReadRequest {
        offset,
        max_bytes: max_bytes.min(budget),
        max_batch_bytes,
        read_cap: budget,
    };
    let read = ctx.storage.read(topic, target.partition, &request).await;
    if let (Some(generation), Ok(ReadPartition { offsets: Some(o), .. })) = (generation, &read) {
        hub.observe(
            wake,
            generation,
            o.high_watermark,
            o.log_start_offset,
            o.last_stable_offset,
        );
    }
    read
}

/// zstd came with Fetch v10 (KIP-110): a partition of a topic whose
/// `compression.type` is zstd is UNSUPPORTED_COMPRESSION_TYPE, without
/// records, to an older fetch, as Kafka answers it
/// (`KafkaApis.maybeConvertFetchedData`). A topic under `producer` serves
/// the zstd batches producers wrote as they are, as Kafka does: clients on
/// older fetch versions that read zstd (Sarama's default version) read
/// them, where refusing the partition stopped them at the first one.
fn refuse_zstd(
    ctx: &Context,
    topics: &[Vec<Target>],
    responses: &mut [FetchableTopicResponse],
    records: &mut [Vec<Option<Vec<Bytes>>>],
) {
    let defaults = ctx.topic_defaults.get();
    for ((topic, records), targets) in responses.iter_mut().zip(records.iter_mut()).zip(topics) {
        // The topic of any partition named rightly (one named wrongly,
        // first or not, keeps its own error).
        let configured = targets
            .iter()
            .find_map(|t| t.topic.as_ref().ok())
            .is_some_and(|t| {
                ketch_config::topic::Configs::new(&t.configs, &defaults).get("compression.type") == "zstd"
            });
        if !configured {
            continue;
        }
        for ((partition, batches), target) in topic.partitions.iter_mut().zip(records.iter_mut()).zip(targets)
        {
            if target.topic.is_err() {
                continue;
            }
            partition.error_code = ResponseError::UnsupportedCompressionType.code();
            partition.records = Some(Bytes::new());
            *batches = None;
        }
    }
}

/// Builds the response within the byte limits; returns it with its
/// partitions' batches (see [`FetchAnswer`]), the bytes it carries and
/// whether reading any partition failed.
#[allow(clippy::type_complexity)]
fn assemble(
    requested: &[FetchTopic],
    topics: &[Vec<Target>],
    reads: &[Vec<Option<ReadResult>>],
    max_bytes: usize,
    read_committed: bool,
) -> (
    Vec<FetchableTopicResponse>,
    Vec<Vec<Option<Vec<Bytes>>>>,
    usize,
    bool,
) {
    let mut total = 0usize;
    let mut any_error = false;
    let mut responses = Vec::with_capacity(requested.len());
    let mut records_of_topics = Vec::with_capacity(requested.len());
    for ((fetch_topic, targets), reads) in requested.iter().zip(topics).zip(reads) {
        let mut partitions = Vec::with_capacity(targets.len());
        let mut records_of_partitions = Vec::with_capacity(targets.len());
        for (target, read) in targets.iter().zip(reads) {
            let mut batches = None;
            let data = PartitionData::default()
                .with_partition_index(target.partition)
                .with_high_watermark(-1)
                .with_last_stable_offset(-1)
                .with_log_start_offset(-1)
                .with_preferred_read_replica(BrokerId(-1));
            let data = match (&target.topic, read) {
                // A topic the request names wrongly (unknown, unauthorized)
                // ends no wait for the others, as Kafka leaves such
                // partitions out of the read; any other error (Redis
                // failing) does, as an error reading one does.
                (Err(code), _) => {
                    any_error |= !named_wrongly(*code);
                    data.with_error_code(*code)
                }
                (Ok(_), Some(Ok(read))) => {
                    let offsets = read.offsets.expect("a successful read has offsets");
                    // read_committed stops at the last stable offset: no
                    // batch of an undecided transaction, nor after one.
                    let readable = if read_committed {
                        below(&read.batches, offsets.last_stable_offset)
                    } else {
                        &read.batches[..]
                    };
                    batches = Some(take_batches(readable, target.max_bytes, max_bytes, &mut total));
                    data.with_high_watermark(offsets.high_watermark)
                        .with_last_stable_offset(offsets.last_stable_offset)
                        .with_log_start_offset(offsets.log_start_offset)
                        .with_aborted_transactions(read_committed.then(Vec::new))
                        .with_records(None)
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
            records_of_partitions.push(batches);
        }
        records_of_topics.push(records_of_partitions);
        responses.push(
            FetchableTopicResponse::default()
                .with_topic(fetch_topic.topic.clone())
                .with_topic_id(fetch_topic.topic_id)
                .with_partitions(partitions),
        );
    }
    (responses, records_of_topics, total, any_error)
}

/// The batches wholly below `offset` (they are in offset order). A batch
/// the offset falls inside is left out: the last stable offset is a
/// batch's first offset, except where DeleteRecords moved the log start,
/// and with it the last stable offset, into an undecided transaction's
/// batch (Kafka's read stops at that batch too).
fn below(batches: &[Bytes], offset: i64) -> &[Bytes] {
    let end = batches.partition_point(|b| last_offset(b) < offset);
    &batches[..end]
}

/// A stored batch's base offset (patched in when it was read).
fn base_offset(batch: &[u8]) -> i64 {
    batch
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(i64::MAX, i64::from_be_bytes)
}

/// The last offset of a batch (base offset + last offset delta).
fn last_offset(batch: &[u8]) -> i64 {
    let delta = batch
        .get(23..27)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, i32::from_be_bytes);
    base_offset(batch).saturating_add(i64::from(delta))
}

/// Fills in the aborted transactions of every read_committed partition
/// that returns records an aborted transaction may have written: those
/// of its aborted transactions that overlap what it returns, so the
/// client drops their records (Kafka's FetchResponse.AbortedTransactions).
async fn add_aborted_transactions(
    ctx: &Context,
    topics: &[Vec<Target>],
    reads: &[Vec<Option<ReadResult>>],
    responses: &mut [FetchableTopicResponse],
    records: &mut [Vec<Option<Vec<Bytes>>>],
) {
    for t in 0..topics
        .len()
        .min(reads.len())
        .min(responses.len())
        .min(records.len())
    {
        for p in 0..topics[t].len().min(reads[t].len()).min(records[t].len()) {
            let target = &topics[t][p];
            let (Ok(topic), Some(Ok(read)), Some(batches)) = (&target.topic, &reads[t][p], &records[t][p])
            else {
                continue;
            };
            let (Some(offsets), Some(first), Some(last)) = (read.offsets, batches.first(), batches.last())
            else {
                continue;
            };
            // From the first offset sent, as Kafka collects them from the
            // first batch it reads: a read that stepped over a hole of the
            // archive (an aborted transaction and its marker, not archived)
            // must not list a transaction whose marker it does not send, or
            // a read_committed client would skip the producer's next,
            // committed, transaction too (only an abort marker ends an
            // aborted producer's skipping).
            let from = target.offset.max(base_offset(first));
            if offsets.last_abort < from {
                continue;
            }
            let to = last_offset(last);
            let found = ctx
                .storage
                .aborted_transactions(topic, target.partition, (from, to), offsets.aborted_span)
                .await;
            let Some(data) = responses[t].partitions.get_mut(p) else {
                continue;
            };
            match found {
                Ok(aborted) => {
                    data.aborted_transactions = Some(
                        aborted
                            .into_iter()
                            .map(|(pid, first)| {
                                AbortedTransaction::default()
                                    .with_producer_id(ProducerId(pid))
                                    .with_first_offset(first)
                            })
                            .collect(),
                    );
                }
                Err(e) => {
                    // Without them the client would keep aborted records:
                    // send none rather than those.
                    data.error_code = error_code(&e);
                    data.aborted_transactions = Some(Vec::new());
                    records[t][p] = Some(Vec::new());
                }
            }
        }
    }
}

/// Takes whole batches while they fit the partition and response limits;
/// the first batch of the response is taken whatever its size (KIP-74).
fn take_batches(
    batches: &[Bytes],
    partition_max: usize,
    response_max: usize,
    total: &mut usize,
) -> Vec<Bytes> {
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
    taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::messages::fetch_response::{AbortedTransaction, EpochEndOffset};
    use uuid::Uuid;

    fn answer(with_tagged: bool) -> FetchAnswer {
        let partition = |index: i32| {
            PartitionData::default()
                .with_partition_index(index)
                .with_high_watermark(1000 + i64::from(index))
                .with_last_stable_offset(999)
                .with_log_start_offset(3)
                .with_preferred_read_replica(BrokerId(-1))
        };
        let topic = |name: &str, id: u128, partitions: Vec<PartitionData>| {
            FetchableTopicResponse::default()
                .with_topic(TopicName(kafka_protocol::protocol::StrBytes::from_string(
                    name.to_owned(),
                )))
                .with_topic_id(Uuid::from_u128(id))
                .with_partitions(partitions)
        };
        let mut first = partition(0).with_records(None);
        if with_tagged {
            first = first.with_diverging_epoch(EpochEndOffset::default().with_epoch(3).with_end_offset(9));
        }
        let response = FetchResponse::default()
            .with_throttle_time_ms(0)
            .with_responses(vec![
                topic(
                    "orders",
                    7,
                    vec![
                        first,
                        partition(1).with_error_code(1),
                        partition(2)
                            .with_records(None)
                            .with_aborted_transactions(Some(vec![
                                AbortedTransaction::default()
                                    .with_producer_id(kafka_protocol::messages::ProducerId(5)),
                            ])),
                        partition(3)
                            .with_records(None)
                            .with_aborted_transactions(Some(Vec::new())),
                    ],
                ),
                topic("empty", 8, Vec::new()),
                topic(
                    "one",
                    9,
                    vec![partition(0).with_records(Some(Bytes::from_static(b"inline")))],
                ),
            ]);
        let records = vec![
            vec![
                Some(vec![Bytes::from(vec![1u8; 300]), Bytes::from(vec![2u8; 5000])]),
                None,
                Some(vec![Bytes::from(vec![3u8; 70])]),
                Some(Vec::new()),
            ],
            Vec::new(),
            vec![None],
        ];
        FetchAnswer {
            response,
            records,
            fetched: Fetched::default(),
        }
    }

    #[test]
    fn the_chunked_encoding_is_kafka_protocols_for_every_version() {
        for with_tagged in [false, true] {
            for version in 4..=18 {
                let expected = crate::server::encode_response(
                    kafka_protocol::messages::ApiKey::Fetch,
                    version,
                    42,
                    &kafka_protocol::messages::ResponseKind::Fetch(answer(with_tagged).into_response()),
                )
                .unwrap();
                let chunks = encode(answer(with_tagged), version, 42).unwrap();
                assert_eq!(
                    chunks.concat(),
                    expected.to_vec(),
                    "v{version}, tagged fields {with_tagged}"
                );
                if !with_tagged {
                    assert!(
                        chunks.iter().any(|c| c.len() == 5000 && c[0] == 2),
                        "v{version}: a stored batch is a chunk of its own"
                    );
                }
            }
        }
    }

    fn batches(sizes: &[usize]) -> Vec<Bytes> {
        sizes.iter().map(|&n| Bytes::from(vec![0u8; n])).collect()
    }

    #[test]
    fn the_first_batch_of_a_response_is_taken_even_when_too_large() {
        let mut total = 0;
        assert_eq!(
            join(take_batches(&batches(&[500, 10]), 100, 100, &mut total)).len(),
            500
        );
        assert_eq!(total, 500);
    }

    #[test]
    fn batches_stop_at_the_partition_and_response_limits() {
        let mut total = 0;
        assert_eq!(
            join(take_batches(&batches(&[40, 40, 40]), 100, 1000, &mut total)).len(),
            80
        );
        assert_eq!(
            join(take_batches(&batches(&[40, 40]), 100, 150, &mut total)).len(),
            40
        );
        assert_eq!(total, 120);
        assert_eq!(join(take_batches(&batches(&[40]), 100, 150, &mut total)).len(), 0);
    }
}
