//! OffsetDelete (v0, KIP-496): remove a group's committed offsets for some
//! partitions. While the group has members, the offsets of topics they are
//! subscribed to stay (GROUP_SUBSCRIBED_TO_TOPIC), during a rebalance too;
//! when their subscriptions are not known (before the group's first
//! generation, or metadata that does not decode), every topic counts as
//! subscribed; a group whose members do not use the consumer protocol
//! (Kafka Connect's, say) keeps all its offsets (NON_EMPTY_GROUP); a group
//! known neither by its offsets nor as a group is GROUP_ID_NOT_FOUND — Kafka's
//! `validateOffsetDelete` and `isSubscribedToTopic`. A missing topic or
//! partition is UNKNOWN_TOPIC_OR_PARTITION, as from Kafka's KafkaApis.

use bytes::Buf;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{
    ConsumerProtocolSubscription, OffsetDeleteRequest, OffsetDeleteResponse, RequestHeader,
};
use kafka_protocol::protocol::Decodable;
use ketch_storage::TopicPartition;

use super::Client;
use crate::Context;
use crate::group::CONSUMER_PROTOCOL;
use crate::transactions::coordinator_error;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    let group = request.group_id.0.to_string();
    if group.is_empty() {
        // Kafka's coordinator refuses it, once the group's DELETE is
        // authorized.
        let code = if super::authorized(
            ctx,
            client,
            crate::auth::acl::Operation::Delete,
            crate::auth::acl::ResourceType::Group,
            &group,
        ) {
            ResponseError::InvalidGroupId
        } else {
            ResponseError::GroupAuthorizationFailed
        };
        return OffsetDeleteResponse::default().with_error_code(code.code());
    }
    match super::elsewhere(
        ctx,
        client,
        header,
        (crate::auth::acl::Operation::Delete, &group),
        &request,
    )
    .await
    {
        None => {}
        Some(Ok(answer)) => return answer,
        Some(Err(code)) => return OffsetDeleteResponse::default().with_error_code(code),
    }
    // A group whose snapshot cannot be read now is not taken for one
    // without members (which would let every offset go).
    let members = match ctx.groups.subscriptions(&group).await {
        Ok(members) => members,
        Err(e) => return OffsetDeleteResponse::default().with_error_code(e.code()),
    };
    // Offsets committed, or staged by an open transaction (Kafka's
    // TxnOffsetCommit creates the group).
    let has_offsets = match ctx.storage.group_has_offsets(&group).await {
        Ok(has) => has,
        Err(e) => return OffsetDeleteResponse::default().with_error_code(coordinator_error(&e)),
    };
    // A group in memory exists, members or not (its snapshot was loaded
    // above): Kafka answers such a group's OffsetDelete, with nothing to
    // delete.
    if members.is_none() && !has_offsets && !ctx.groups.in_memory(&group) {
        return OffsetDeleteResponse::default().with_error_code(ResponseError::GroupIdNotFound.code());
    }
    let subscribed = match members {
        None => Subscribed::Topics(Vec::new()),
        Some((protocol_type, _)) if protocol_type.as_str() != CONSUMER_PROTOCOL => {
            return OffsetDeleteResponse::default().with_error_code(ResponseError::NonEmptyGroup.code());
        }
        Some((_, None)) => Subscribed::All,
        Some((_, Some(metadata))) => subscribed_topics(&metadata).map_or(Subscribed::All, Subscribed::Topics),
    };

    let mut deletable: Vec<TopicPartition> = Vec::new();
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.0.to_string();
        let readable = super::authorized(
            ctx,
            client,
            crate::auth::acl::Operation::Read,
            crate::auth::acl::ResourceType::Topic,
            &name,
        );
        // Kafka's order: authorization, then the partition's existence,
        // then the group's subscription.
        let found = if readable {
            Some(super::resolve_topic(ctx, &name, false).await)
        } else {
            None
        };
        let mut codes = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let code = match &found {
                None => ResponseError::TopicAuthorizationFailed.code(),
                Some(Err(code)) => *code,
                Some(Ok(t)) => match super::ensure_partition(ctx, t.clone(), p.partition_index).await {
                    Err(code) => code,
                    Ok(_) if subscribed.covers(&name) => ResponseError::GroupSubscribedToTopic.code(),
                    Ok(_) => {
                        deletable.push((name.clone(), p.partition_index));
                        0
                    }
                },
            };
            codes.push(code);
        }
        topics.push((topic, codes));
    }
    let deleted = ctx
        .storage
        .delete_offsets(&group, &deletable)
        .await
        .map_err(|e| coordinator_error(&e));
    OffsetDeleteResponse::default()
        .with_error_code(deleted.err().unwrap_or(0))
        .with_topics(
            topics
                .into_iter()
                .map(|(topic, codes)| {
                    OffsetDeleteResponseTopic::default()
                        .with_name(topic.name)
                        .with_partitions(
                            topic
                                .partitions
                                .iter()
                                .zip(codes)
                                .map(|(p, code)| {
                                    OffsetDeleteResponsePartition::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(code)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
}

/// The topics a group's members are subscribed to.
enum Subscribed {
    Topics(Vec<String>),
    /// Not known: every topic counts.
    All,
}

impl Subscribed {
    fn covers(&self, topic: &String) -> bool {
        match self {
            Subscribed::Topics(topics) => topics.contains(topic),
            Subscribed::All => true,
        }
    }
}

/// The topics a consumer group's members subscribe to, from their
/// metadata; `None` if a member's does not decode (the group's
/// subscriptions are then unknown: Kafka takes every topic for subscribed).
pub(crate) fn subscribed_topics(metadata: &[bytes::Bytes]) -> Option<Vec<String>> {
    let topics = metadata
        .iter()
        .map(subscription)
        .collect::<Option<Vec<Vec<String>>>>()?;
    Some(topics.concat())
}

/// The topics of a consumer member's subscription metadata (a version,
/// then ConsumerProtocolSubscription); `None` if it does not decode.
fn subscription(metadata: &bytes::Bytes) -> Option<Vec<String>> {
    let mut buf = metadata.clone();
    if buf.remaining() < 2 {
        return None;
    }
    let version = buf.get_i16().clamp(0, 3);
    ConsumerProtocolSubscription::decode(&mut buf, version)
        .ok()
        .map(|s| s.topics.into_iter().map(|t| t.to_string()).collect())
}
