//! OffsetFetch (v1–v9): a group's committed offsets, from Redis. From v8
//! several groups are asked at once (KIP-709); `topics` null means every
//! partition the group committed. A partition without a committed offset
//! answers offset -1, as Kafka does. Only the group's coordinator answers
//! (NOT_COORDINATOR elsewhere).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{GroupId, OffsetFetchRequest, OffsetFetchResponse, RequestHeader, TopicName};
use ketch_storage::{CommittedOffset, TopicPartition};

use super::{Client, Route, authorized, route, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::transactions::coordinator_error;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: OffsetFetchRequest,
) -> OffsetFetchResponse {
    if header.request_api_version >= 8 {
        let stable = request.require_stable;
        let groups = request.groups.into_iter().map(|group| async move {
            let wanted = group.topics.map(|topics| {
                topics
                    .into_iter()
                    .map(|t| (t.name, t.partition_indexes))
                    .collect()
            });
            let (error, topics) = fetch(ctx, client, &group.group_id, wanted, stable).await;
            OffsetFetchResponseGroup::default()
                .with_group_id(group.group_id)
                .with_error_code(error)
                .with_topics(topics.into_iter().map(v8_topic).collect())
        });
        return OffsetFetchResponse::default().with_groups(super::each(groups).await);
    }
    let wanted = request.topics.map(|topics| {
        topics
            .into_iter()
            .map(|t| (t.name, t.partition_indexes))
            .collect()
    });
    let stable = header.request_api_version >= 7 && request.require_stable;
    let version = header.request_api_version;
    // v1 has no group error: it goes on each partition asked for, as
    // Kafka's `OffsetFetchRequest.getErrorResponse` puts it (an answer
    // without partitions would read as no offsets committed).
    let asked = (version < 2).then(|| wanted.clone()).flatten();
    let (error, mut topics) = fetch(ctx, client, &request.group_id, wanted, stable).await;
    if error != 0
        && let Some(asked) = asked
    {
        topics = asked
            .into_iter()
            .map(|(name, partitions)| {
                let failed = partitions.into_iter().map(|p| (p, None, error)).collect();
                (name.0.to_string(), failed)
            })
            .collect();
    }
    let response = OffsetFetchResponse::default()
        .with_topics(topics.into_iter().map(|t| old_topic(version, t)).collect());
    if version >= 2 {
        response.with_error_code(error)
    } else {
        response
    }
}

/// A storage failure's error for OffsetFetch: NOT_COORDINATOR for one that
/// heals (Redis unreachable or timing out), as Kafka's coordinator answers
/// (`handleOffsetFetchException`, KAFKA-17267): the Java consumer before
/// 3.9 retries only it (and COORDINATOR_LOAD_IN_PROGRESS), and fails its
/// `poll()` on COORDINATOR_NOT_AVAILABLE.
fn storage_error(e: &ketch_storage::StorageError) -> i16 {
    match e {
        ketch_storage::StorageError::Unavailable(_)
        | ketch_storage::StorageError::NotEnoughReplicasAfterAppend { .. } => {
            ResponseError::NotCoordinator.code()
        }
        e => coordinator_error(e),
    }
}

/// One topic's answer: name, and (partition, committed offset or none,
/// error) for each partition.
type TopicOffsets = (String, Vec<(i32, Option<CommittedOffset>, i16)>);

/// The group's error code and its offsets, grouped by topic in the order
/// asked (or by name when all were asked for). A topic named twice, or a
/// partition named twice within a topic, is answered once. A name no topic
/// can have is answered without asking Redis: no offset.
///
/// Committed offsets are in Redis, so any gateway answers for any group
/// (behind a load balancer the client cannot pick the coordinator), but
/// for a coordinator without an internal listener (a gateway from before
/// forwarding), whose commits it cannot vouch for.
async fn fetch(
    ctx: &Context,
    client: &Client,
    group: &GroupId,
    wanted: Option<Vec<(TopicName, Vec<i32>)>>,
    require_stable: bool,
) -> (i16, Vec<TopicOffsets>) {
    if !authorized(ctx, client, Operation::Describe, ResourceType::Group, group) {
        return (ResponseError::GroupAuthorizationFailed.code(), Vec::new());
    }
    if route(ctx, client, group) == Route::NotCoordinator {
        return (ResponseError::NotCoordinator.code(), Vec::new());
    }
    let describable = |topic: &str| authorized(ctx, client, Operation::Describe, ResourceType::Topic, topic);
    // KIP-447: a consumer that asks for stable offsets waits while a
    // transaction's offsets for a partition are undecided.
    let unstable = if require_stable {
        match ctx.storage.unstable_partitions(group).await {
            Ok(unstable) => unstable,
            Err(e) => return (storage_error(&e), Vec::new()),
        }
    } else {
        std::collections::HashSet::new()
    };
    let unstable = &unstable;
    let Some(wanted) = wanted else {
        // All of them: those of topics the client may not see are left out.
        return match ctx.storage.all_committed_offsets(group).await {
            Ok(all) => (
                0,
                by_topic(
                    all.into_iter().filter(|((t, _), _)| describable(t)).collect(),
                    unstable,
                ),
            ),
            Err(e) => (storage_error(&e), Vec::new()),
        };
    };
    let mut topics_seen = std::collections::HashSet::new();
    let mut unique = Vec::with_capacity(wanted.len());
    for (name, partitions) in wanted {
        if !topics_seen.insert(name.0.clone()) {
            continue;
        }
        let mut seen = std::collections::HashSet::with_capacity(partitions.len());
        let partitions: Vec<i32> = partitions.into_iter().filter(|p| seen.insert(*p)).collect();
        unique.push((name, partitions));
    }
    // The topics' reads overlap (as many at once as `each` allows), so a
    // group of many topics does not pay a round trip per topic in turn.
    let reads = super::each(unique.into_iter().map(|(name, partitions)| async move {
        if !describable(&name) {
            let refused = ResponseError::TopicAuthorizationFailed.code();
            let none = partitions.into_iter().map(|p| (p, None, refused)).collect();
            return Ok((name.0.to_string(), none));
        }
        if ketch_storage::validate_topic_name(&name).is_err() {
            let none = partitions.into_iter().map(|p| (p, None, 0)).collect();
            return Ok((name.0.to_string(), none));
        }
        let offsets = ctx
            .storage
            .committed_offsets_of(group, &name, &partitions)
            .await?;
        let answers = partitions
            .into_iter()
            .zip(offsets)
            .map(|(p, committed)| answer(&name, p, committed, unstable))
            .collect();
        Ok::<_, ketch_storage::StorageError>((name.0.to_string(), answers))
    }))
    .await;
    match reads.into_iter().collect() {
        Ok(topics) => (0, topics),
        Err(e) => (storage_error(&e), Vec::new()),
    }
}

/// One partition's answer: UNSTABLE_OFFSET_COMMIT (retriable, KIP-447)
/// while a transaction's offsets for it are undecided.
fn answer(
    topic: &str,
    partition: i32,
    committed: Option<CommittedOffset>,
    unstable: &std::collections::HashSet<TopicPartition>,
) -> (i32, Option<CommittedOffset>, i16) {
    if unstable.contains(&(topic.to_owned(), partition)) {
        (partition, None, ResponseError::UnstableOffsetCommit.code())
    } else {
        (partition, committed, 0)
    }
}

/// Offsets grouped by topic (they come sorted by topic and partition).
fn by_topic(
    all: Vec<(TopicPartition, CommittedOffset)>,
    unstable: &std::collections::HashSet<TopicPartition>,
) -> Vec<TopicOffsets> {
    let mut topics: Vec<TopicOffsets> = Vec::new();
    for ((topic, partition), committed) in all {
        let answer = answer(&topic, partition, Some(committed), unstable);
        match topics.last_mut() {
            Some((name, partitions)) if *name == topic => partitions.push(answer),
            _ => topics.push((topic, vec![answer])),
        }
    }
    topics
}

/// v1–v7 answer; the leader epoch exists from v5.
fn old_topic(version: i16, (name, partitions): TopicOffsets) -> OffsetFetchResponseTopic {
    OffsetFetchResponseTopic::default()
        .with_name(TopicName(str_bytes(name)))
        .with_partitions(
            partitions
                .into_iter()
                .map(|(index, committed, error)| {
                    let (offset, epoch, metadata) = fields(committed);
                    OffsetFetchResponsePartition::default()
                        .with_partition_index(index)
                        .with_committed_offset(offset)
                        .with_committed_leader_epoch(if version >= 5 { epoch } else { -1 })
                        .with_metadata(Some(str_bytes(metadata)))
                        .with_error_code(error)
                })
                .collect(),
        )
}

fn v8_topic((name, partitions): TopicOffsets) -> OffsetFetchResponseTopics {
    OffsetFetchResponseTopics::default()
        .with_name(TopicName(str_bytes(name)))
        .with_partitions(
            partitions
                .into_iter()
                .map(|(index, committed, error)| {
                    let (offset, epoch, metadata) = fields(committed);
                    OffsetFetchResponsePartitions::default()
                        .with_partition_index(index)
                        .with_committed_offset(offset)
                        .with_committed_leader_epoch(epoch)
                        .with_metadata(Some(str_bytes(metadata)))
                        .with_error_code(error)
                })
                .collect(),
        )
}

/// Offset, leader epoch and metadata to report; -1, -1, "" when nothing
/// was committed.
fn fields(committed: Option<CommittedOffset>) -> (i64, i32, String) {
    match committed {
        Some(c) => (c.offset, c.leader_epoch, c.metadata.unwrap_or_default()),
        None => (-1, -1, String::new()),
    }
}
