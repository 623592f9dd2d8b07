//! OffsetCommit (v2–v9): store a group's consumed positions in Redis.
//!
//! As in Kafka, a partition the client may not read is
//! TOPIC_AUTHORIZATION_FAILED and one that does not exist
//! UNKNOWN_TOPIC_OR_PARTITION, whatever the group says; the rest go to the
//! coordinator, which checks the member and generation (Kafka's
//! `validateOffsetCommit`: a commit without a generation is accepted only
//! for an empty or unknown group), then every partition's offset is written
//! in one HSET. Metadata longer than `groups.max_metadata_bytes` is
//! OFFSET_METADATA_TOO_LARGE; the rest of the request is still committed.
//! A v2–v4 request's `retention_time_ms` (other than -1) is each offset's
//! own retention, as in Kafka: it expires that long after the commit,
//! whatever `groups.offsets_retention` says (`crate::offset_expiry`).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse, RequestHeader};
use ketch_storage::{CommittedOffset, TopicPartition};

use super::{Client, resolve_topic};
use crate::Context;
use crate::transactions::coordinator_error;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let group = request.group_id.0.to_string();
    let refused = match super::elsewhere(
        ctx,
        client,
        header,
        (crate::auth::acl::Operation::Read, &group),
        &request,
    )
    .await
    {
        None => ctx
            .groups
            .validate_offset_commit(
                &group,
                &request.member_id,
                request.group_instance_id.as_ref(),
                request.generation_id_or_member_epoch,
                Some(header.request_api_version),
            )
            .await
            .err(),
        Some(Ok(answer)) => return answer,
        Some(Err(code)) => Some(code),
    };
    // A group not in memory that has offsets (consumers that assign their
    // own partitions commit to it) exists for Kafka, as an Empty group: a
    // member it does not know is UNKNOWN_MEMBER_ID there, not
    // GROUP_ID_NOT_FOUND.
    let not_in_memory = [
        ResponseError::GroupIdNotFound.code(),
        ResponseError::IllegalGeneration.code(),
    ];
    let refused = match refused {
        Some(code) if not_in_memory.contains(&code) && !ctx.groups.in_memory(&group) => {
            match ctx.storage.group_has_offsets(&group).await {
                Ok(true) => Some(ResponseError::UnknownMemberId.code()),
                Ok(false) => Some(code),
                Err(e) => Some(coordinator_error(&e)),
            }
        }
        other => other,
    };
    // Versions 2–4 may ask for a retention of their own (Kafka's
    // per-offset `expireTimestamp`, KIP-211 dropped it from v5); -1: the
    // broker's.
    let own_retention = (header.request_api_version <= 4 && request.retention_time_ms != -1)
        .then_some(request.retention_time_ms);
    let mut codes: Vec<Vec<i16>> = Vec::with_capacity(request.topics.len());
    let mut accepted: Vec<(TopicPartition, CommittedOffset)> = Vec::new();
    let mut positions: Vec<Vec<(usize, usize)>> = Vec::new();
    for topic in &request.topics {
        let known = topic_partitions(ctx, client, refused, &topic.name).await;
        let mut topic_codes = Vec::with_capacity(topic.partitions.len());
        let mut topic_positions = Vec::new();
        for partition in &topic.partitions {
            let refused = refusal(
                ctx,
                known.map(|(partitions, _)| partitions),
                partition.partition_index,
                refused,
                partition.committed_metadata.as_deref(),
            );
            let code = refused.unwrap_or_else(|| {
                topic_positions.push((codes.len(), topic_codes.len()));
                accepted.push((
                    (topic.name.0.to_string(), partition.partition_index),
                    CommittedOffset::new(
                        partition.committed_offset,
                        partition.committed_leader_epoch,
                        partition.committed_metadata.as_ref().map(|m| m.to_string()),
                    )
                    .of_topic(known.ok().map(|(_, id)| id))
                    .retained_for(own_retention),
                ));
                0
            });
            topic_codes.push(code);
        }
        codes.push(topic_codes);
        positions.push(topic_positions);
    }
    if let Err(e) = commit(ctx, &group, &accepted).await {
        let code = coordinator_error(&e);
        for (t, p) in positions.into_iter().flatten() {
            codes[t][p] = code;
        }
    }
    OffsetCommitResponse::default().with_topics(
        request
            .topics
            .into_iter()
            .zip(codes)
            .map(|(topic, codes)| {
                OffsetCommitResponseTopic::default()
                    .with_name(topic.name)
                    .with_partitions(
                        topic
                            .partitions
                            .iter()
                            .zip(codes)
                            .map(|(p, code)| {
                                OffsetCommitResponsePartition::default()
                                    .with_partition_index(p.partition_index)
                                    .with_error_code(code)
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}

/// Stores the offsets. A group without members (consumers that assign
/// their own partitions) keeps them `groups.offsets_retention` from this
/// commit, as Kafka keeps a standalone group's offsets: the coordinator
/// orders that with the group's own changes (one gaining members must keep
/// its offsets).
async fn commit(
    ctx: &Context,
    group: &str,
    offsets: &[(TopicPartition, CommittedOffset)],
) -> ketch_storage::Result<()> {
    if offsets.is_empty() {
        return Ok(());
    }
    ctx.storage.commit_offsets(group, offsets).await?;
    if let Some(retained) = ctx.groups.retain_committed(group).await {
        return retained;
    }
    let has_members = match ctx.groups.describe(group).await {
        Ok(group) => group.is_some_and(|g| !g.members.is_empty()),
        // Not known now: its offsets are not left to expire.
        Err(_) => true,
    };
    if !has_members {
        ctx.storage
            .group_emptied(group, ctx.settings.groups.offsets_retention.get())
            .await?;
    }
    Ok(())
}

/// A topic's partition count for an offset commit, or the code all its
/// partitions get: the request's own authorization failing (the group's,
/// or the transactional id's), no READ on the topic (which committing for
/// it takes), or an unknown topic. Kafka checks these before the request
/// reaches the group's coordinator, so they come before the group's own
/// refusal (an unknown member, a stale generation: [`refusal`]).
pub(super) async fn topic_partitions(
    ctx: &Context,
    client: &Client,
    refused: Option<i16>,
    topic: &str,
) -> Result<(i32, uuid::Uuid), i16> {
    let whole_request = [
        ResponseError::GroupAuthorizationFailed.code(),
        ResponseError::TransactionalIdAuthorizationFailed.code(),
    ];
    if let Some(code) = refused.filter(|code| whole_request.contains(code)) {
        return Err(code);
    }
    if !super::authorized(
        ctx,
        client,
        crate::auth::acl::Operation::Read,
        crate::auth::acl::ResourceType::Topic,
        topic,
    ) {
        return Err(ResponseError::TopicAuthorizationFailed.code());
    }
    resolve_topic(ctx, topic, false)
        .await
        .map(|t| (t.partitions(), t.id))
        .map_err(|code| {
            // Redis unreachable: as for the offsets' own write.
            if code == ResponseError::KafkaStorageError.code() {
                ResponseError::CoordinatorNotAvailable.code()
            } else {
                code
            }
        })
}

/// Why one partition's offset is not committed (`None`: it is): its topic's
/// refusal, a partition the topic does not have, then the group's refusal
/// (`refused`, from the coordinator), then metadata over the limit.
pub(super) fn refusal(
    ctx: &Context,
    known: Result<i32, i16>,
    partition: i32,
    refused: Option<i16>,
    metadata: Option<&str>,
) -> Option<i16> {
    match known {
        Err(code) => Some(code),
        Ok(count) if partition < 0 || partition >= count => {
            Some(ResponseError::UnknownTopicOrPartition.code())
        }
        Ok(_) if refused.is_some() => refused,
        Ok(_) if too_long(ctx, metadata) => Some(ResponseError::OffsetMetadataTooLarge.code()),
        Ok(_) => None,
    }
}

/// Kafka counts the metadata's length in Java characters (UTF-16 code
/// units), whatever the setting's name says: non-ASCII metadata within
/// the limit there is within it here.
fn too_long(ctx: &Context, metadata: Option<&str>) -> bool {
    let limit = ctx.settings.groups.max_metadata_bytes;
    metadata.is_some_and(|m| m.len() > limit && m.encode_utf16().count() > limit)
}
