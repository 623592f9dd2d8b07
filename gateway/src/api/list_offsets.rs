//! ListOffsets (API key 2, versions 1–9): per partition, the earliest (-2)
//! or latest (-1) offset, the offset of the largest timestamp (-3, KIP-734),
//! the first offset still in Redis (-4, KIP-405), the last offset in the
//! archive (-5, KIP-1005), or the first offset at or after a timestamp.
//! Spec: KIP-79, KIP-734, KIP-405, KIP-1005.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse, RequestHeader};
use ketch_storage::Topic;

use super::{Client, authorized, ensure_partition, error_code, resolve_topic};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

const LATEST_TIMESTAMP: i64 = -1;
const EARLIEST_TIMESTAMP: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
/// KIP-405 (v8): the first offset still in the local tier (Redis).
const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
/// KIP-1005 (v9): the last offset the archive holds.
const LATEST_TIERED_TIMESTAMP: i64 = -5;

/// Every partition has leader epoch 0: this node leads it and never hands it over.
const LEADER_EPOCH: i32 = 0;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: ListOffsetsRequest,
) -> ListOffsetsResponse {
    let version = header.request_api_version;
    // read_committed: the latest offset is the last stable offset.
    let committed = req.isolation_level == 1;
    // Lookups that may read the archive share one bound per request
    // (`tiering.remote_list_offsets_timeout`), as Kafka's delayed remote
    // ListOffsets does: a request over many partitions of a store that
    // stopped answering is answered after the bound, not after the bound
    // once per wave of partitions.
    let deadline = tokio::time::Instant::now() + ctx.settings.tiering.remote_list_offsets_timeout.get();
    // A partition named twice is INVALID_REQUEST, each time (Kafka's
    // `duplicatePartitions`).
    let mut seen = std::collections::HashSet::new();
    let duplicated: std::collections::HashSet<(String, i32)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.name.0.to_string(), p.partition_index))
        })
        .filter(|key| !seen.insert(key.clone()))
        .collect();
    let topics = req
        .topics
        .into_iter()
        .map(|topic| list_topic(ctx, client, topic, version, committed, &duplicated, deadline));
    let topics = super::each(topics).await;
    ListOffsetsResponse::default().with_topics(topics)
}

async fn list_topic(
    ctx: &Context,
    client: &Client,
    request: ListOffsetsTopic,
    version: i16,
    committed: bool,
    duplicated: &std::collections::HashSet<(String, i32)>,
    deadline: tokio::time::Instant,
) -> ListOffsetsTopicResponse {
    let topic = if authorized(
        ctx,
        client,
        Operation::Describe,
        ResourceType::Topic,
        &request.name,
    ) {
        resolve_topic(ctx, &request.name, false).await
    } else {
        Err(ResponseError::TopicAuthorizationFailed.code())
    };
    let name = request.name.0.to_string();
    let partitions = request.partitions.into_iter().map(|p| {
        // Duplicates of a partition the client may describe, whether or
        // not it exists (Kafka checks them before it looks).
        let authorized =
            !matches!(&topic, Err(code) if *code == ResponseError::TopicAuthorizationFailed.code());
        let topic = if authorized && duplicated.contains(&(name.clone(), p.partition_index)) {
            Err(ResponseError::InvalidRequest.code())
        } else {
            topic.clone()
        };
        list_partition(ctx, topic, p, version, committed, deadline)
    });
    let partitions = super::each(partitions).await;
    ListOffsetsTopicResponse::default()
        .with_name(request.name)
        .with_partitions(partitions)
}

async fn list_partition(
    ctx: &Context,
    topic: Result<Arc<Topic>, i16>,
    request: ListOffsetsPartition,
    version: i16,
    committed: bool,
    deadline: tokio::time::Instant,
) -> ListOffsetsPartitionResponse {
    // Kafka's order: authorization, then a duplicate, then the timestamp's
    // version, then whether the partition exists.
    let refused_first = [
        ResponseError::TopicAuthorizationFailed.code(),
        ResponseError::InvalidRequest.code(),
    ];
    let found = match topic {
        Err(code) if refused_first.contains(&code) => Err(code),
        _ if !supported(request.timestamp, version) => Err(ResponseError::UnsupportedVersion.code()),
        topic => {
            lookup(
                ctx,
                topic,
                request.partition_index,
                request.timestamp,
                committed,
                deadline,
            )
            .await
        }
    };
    partition_response(request.partition_index, found, leader_epoch(version))
}

/// Whether this version takes the timestamp: a negative one names an
/// offset (-1 latest, -2 earliest, -3 max timestamp from v7, -4 earliest
/// local from v8, -5 latest tiered from v9) or is refused with UNSUPPORTED_VERSION, as Kafka's
/// `isListOffsetsTimestampUnsupported` refuses it.
fn supported(timestamp: i64, version: i16) -> bool {
    match timestamp {
        LATEST_TIMESTAMP | EARLIEST_TIMESTAMP => true,
        MAX_TIMESTAMP => version >= 7,
        EARLIEST_LOCAL_TIMESTAMP => version >= 8,
        LATEST_TIERED_TIMESTAMP => version >= 9,
        t => t >= 0,
    }
}

/// The leader epoch to report: versions before 4 have no such field, and
/// the encoder refuses one set there.
fn leader_epoch(version: i16) -> i32 {
    if version >= 4 { LEADER_EPOCH } else { -1 }
}

fn partition_response(
    partition: i32,
    found: Result<Option<(i64, i64)>, i16>,
    leader_epoch: i32,
) -> ListOffsetsPartitionResponse {
    let response = ListOffsetsPartitionResponse::default().with_partition_index(partition);
    match found {
        // Nothing archived (-5): no epoch either, as Kafka answers.
        Ok(Some((offset, timestamp))) if offset < 0 => response.with_offset(offset).with_timestamp(timestamp),
        Ok(Some((offset, timestamp))) => response
            .with_offset(offset)
            .with_timestamp(timestamp)
            .with_leader_epoch(leader_epoch),
        // No record that late: offset and timestamp stay -1, as in Kafka.
        Ok(None) => response,
        Err(code) => response.with_error_code(code),
    }
}

/// The (offset, timestamp) that answers `timestamp`, if any.
async fn lookup(
    ctx: &Context,
    topic: Result<Arc<Topic>, i16>,
    partition: i32,
    timestamp: i64,
    committed: bool,
    deadline: tokio::time::Instant,
) -> Result<Option<(i64, i64)>, i16> {
    let topic = ensure_partition(ctx, topic?, partition).await?;
    let found = match timestamp {
        EARLIEST_TIMESTAMP => ctx
            .storage
            .offsets(&topic, partition)
            .await
            .map(|o| Some((o.log_start_offset, -1))),
        LATEST_TIMESTAMP => ctx.storage.offsets(&topic, partition).await.map(|o| {
            Some((
                if committed {
                    o.last_stable_offset
                } else {
                    o.high_watermark
                },
                -1,
            ))
        }),
        EARLIEST_LOCAL_TIMESTAMP => ctx
            .storage
            .offsets(&topic, partition)
            .await
            .map(|o| Some((o.local_start_offset, -1))),
        LATEST_TIERED_TIMESTAMP => latest_tiered(ctx, &topic, partition).await,
        // These may read the archive (a segment's footer, its rows): as
        // Kafka bounds them (`remote.list.offsets.request.timeout.ms`), a
        // store that stopped answering gets REQUEST_TIMED_OUT, not a wait
        // of minutes of I/O timeouts and retries for each segment.
        MAX_TIMESTAMP => bounded_lookup(deadline, ctx.storage.max_timestamp(&topic, partition)).await?,
        t if t >= 0 => {
            bounded_lookup(deadline, ctx.storage.offset_for_timestamp(&topic, partition, t)).await?
        }
        _ => return Err(ResponseError::UnsupportedVersion.code()),
    };
    let found = found.map_err(|e| error_code(&e))?;
    // As in Kafka, a read_committed lookup by timestamp finds nothing at or
    // past the last stable offset (records an open transaction may abort).
    match found {
        Some((offset, _)) if committed && (timestamp == MAX_TIMESTAMP || timestamp >= 0) => {
            let stable = ctx
                .storage
                .offsets(&topic, partition)
                .await
                .map_err(|e| error_code(&e))?
                .last_stable_offset;
            Ok(found.filter(|_| offset < stable))
        }
        found => Ok(found),
    }
}

async fn bounded_lookup<T>(
    deadline: tokio::time::Instant,
    lookup: impl std::future::Future<Output = ketch_storage::Result<T>>,
) -> Result<ketch_storage::Result<T>, i16> {
    tokio::time::timeout_at(deadline, lookup)
        .await
        .map_err(|_| ResponseError::RequestTimedOut.code())
}

/// The last offset the archive holds with every segment before it
/// archived too (Kafka's `highestOffsetInRemoteStorage`: it copies
/// segments in order), -1 when it holds none (or no longer does: retention
/// deleted every archived segment) or the topic has no archive
/// (`remote.storage.enable` off), as Kafka answers without a remote log.
async fn latest_tiered(
    ctx: &Context,
    topic: &Topic,
    partition: i32,
) -> ketch_storage::Result<Option<(i64, i64)>> {
    if topic.configs.get("remote.storage.enable").map(String::as_str) != Some("true") {
        return Ok(Some((-1, -1)));
    }
    let segments = ctx.storage.segments(topic, partition).await?;
    Ok(Some((archived_through(&segments), -1)))
}

/// The last offset of the archived segments before the first that is not
/// (quarantined, or not archived yet: a later one archived meanwhile is
/// not counted, as Kafka's copies never pass an uncopied segment); a
/// skipped segment is stepped over (its records are gone for good), and
/// counted when it was archived before its data file was lost (the offset
/// only grows, as Kafka's). -1: none.
fn archived_through(segments: &[ketch_storage::segments::Segment]) -> i64 {
    segments
        .iter()
        .take_while(|s| s.path.is_some() || s.skipped.is_some())
        .filter(|s| s.path.is_some() || s.lost)
        .map(|s| s.last)
        .last()
        .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use kafka_protocol::protocol::Encodable;

    use super::*;

    #[test]
    fn the_latest_tiered_offset_stops_at_the_first_segment_not_archived() {
        let segment = |base: i64, state: serde_json::Value| {
            let mut json = serde_json::json!({
                "base": base, "last": base + 9, "bytes": 0, "max_ts": 0, "sealed_ms": 0,
            });
            json.as_object_mut()
                .unwrap()
                .extend(state.as_object().unwrap().clone());
            serde_json::from_value::<ketch_storage::segments::Segment>(json).unwrap()
        };
        let archived = serde_json::json!({"path": "file:///a.parquet", "file_bytes": 1});
        let quarantined = serde_json::json!({"quarantine": {"reason": "bad", "at": 0}});
        let skipped = serde_json::json!({"skipped": {"reason": "gave up", "at": 0, "error": "bad"}});
        let lost = serde_json::json!({"skipped": {"reason": "lost", "at": 0, "error": "lost"}, "lost": true});
        let none = serde_json::json!({});
        assert_eq!(
            archived_through(&[
                segment(0, archived.clone()),
                segment(10, lost),
                segment(20, none.clone())
            ]),
            19,
            "a segment archived, then lost"
        );
        assert_eq!(archived_through(&[]), -1);
        assert_eq!(archived_through(&[segment(0, none.clone())]), -1);
        assert_eq!(
            archived_through(&[segment(0, archived.clone()), segment(10, archived.clone())]),
            19
        );
        assert_eq!(
            archived_through(&[
                segment(0, archived.clone()),
                segment(10, quarantined),
                segment(20, archived.clone()),
            ]),
            9,
            "not past a quarantined segment"
        );
        assert_eq!(
            archived_through(&[
                segment(0, skipped),
                segment(10, archived.clone()),
                segment(20, none)
            ]),
            19,
            "past a skipped one"
        );
    }

    #[test]
    fn answers_encode_in_every_supported_version() {
        for version in 1..=9 {
            let partitions = vec![
                partition_response(0, Ok(Some((42, -1))), leader_epoch(version)),
                partition_response(1, Ok(None), leader_epoch(version)),
                partition_response(
                    2,
                    Err(ResponseError::UnknownTopicOrPartition.code()),
                    leader_epoch(version),
                ),
            ];
            let topic = ListOffsetsTopicResponse::default().with_partitions(partitions);
            let response = ListOffsetsResponse::default().with_topics(vec![topic]);
            assert!(
                response.encode(&mut BytesMut::new(), version).is_ok(),
                "version {version}"
            );
        }
    }

    #[test]
    fn an_unanswerable_timestamp_leaves_offset_and_timestamp_unset() {
        let none = partition_response(3, Ok(None), 0);
        assert_eq!(
            (none.offset, none.timestamp, none.leader_epoch, none.error_code),
            (-1, -1, -1, 0)
        );
        let found = partition_response(3, Ok(Some((7, 1_000))), 0);
        assert_eq!((found.offset, found.timestamp, found.leader_epoch), (7, 1_000, 0));
    }
}
