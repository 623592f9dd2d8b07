//! OffsetDelete (v0, KIP-496): remove a group's committed offsets for some
//! partitions. While the group has members, the offsets of topics they are
//! subscribed to stay (GROUP_SUBSCRIBED_TO_TOPIC); a group with neither
//! members nor offsets is GROUP_ID_NOT_FOUND.

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

use super::{Client, error_code};
use crate::Context;

/// The protocol type of groups whose members' metadata is a consumer
/// subscription.
const CONSUMER_PROTOCOL: &str = "consumer";

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    let group = request.group_id.0.to_string();
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
    let described = ctx.groups.describe(&group).await;
    let has_offsets = match ctx.storage.groups_with_offsets().await {
        Ok(groups) => groups.contains(&group),
        Err(e) => return OffsetDeleteResponse::default().with_error_code(error_code(&e)),
    };
    let has_members = described.as_ref().is_some_and(|g| !g.members.is_empty());
    if !has_members && !has_offsets {
        return OffsetDeleteResponse::default().with_error_code(ResponseError::GroupIdNotFound.code());
    }
    let subscribed: Vec<String> = described
        .filter(|g| g.protocol_type.as_str() == CONSUMER_PROTOCOL)
        .map(|g| {
            g.members
                .iter()
                .flat_map(|m| subscription(&m.member_metadata))
                .collect()
        })
        .unwrap_or_default();

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
        let code = if !readable {
            ResponseError::TopicAuthorizationFailed.code()
        } else if subscribed.contains(&name) {
            ResponseError::GroupSubscribedToTopic.code()
        } else {
            deletable.extend(topic.partitions.iter().map(|p| (name.clone(), p.partition_index)));
            0
        };
        topics.push((topic, code));
    }
    let deleted = ctx
        .storage
        .delete_offsets(&group, &deletable)
        .await
        .map_err(|e| error_code(&e));
    OffsetDeleteResponse::default()
        .with_error_code(deleted.err().unwrap_or(0))
        .with_topics(
            topics
                .into_iter()
                .map(|(topic, code)| {
                    OffsetDeleteResponseTopic::default()
                        .with_name(topic.name)
                        .with_partitions(
                            topic
                                .partitions
                                .iter()
                                .map(|p| {
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

/// The topics of a consumer member's subscription metadata (a version,
/// then ConsumerProtocolSubscription); none if it does not decode.
fn subscription(metadata: &bytes::Bytes) -> Vec<String> {
    let mut buf = metadata.clone();
    if buf.remaining() < 2 {
        return Vec::new();
    }
    let version = buf.get_i16().clamp(0, 3);
    ConsumerProtocolSubscription::decode(&mut buf, version)
        .map(|s| s.topics.into_iter().map(|t| t.to_string()).collect())
        .unwrap_or_default()
}
