//! DeleteTopics (API key 20, versions 1–6): removes topics from the registry
//! and drops their partitions. Versions 1–5 name topics; version 6 names them
//! or gives their ids (KIP-516). A topic's partitions count against the
//! client's controller mutation quota (KIP-599; v5+ may be refused with
//! THROTTLING_QUOTA_EXCEEDED). Spec: KIP-4 (admin requests), KIP-516.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse, RequestHeader, TopicName};
use ketch_storage::StorageError;
use uuid::Uuid;

use super::create_topics::{Failure, count_mutation, unique_by};
use super::{Client, authorized, cluster_authorized, resolve_topic_id, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::quotas::MutationQuota;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let states = if header.request_api_version >= 6 {
        req.topics
    } else {
        let by_name = |name| {
            DeleteTopicState::default()
                .with_name(Some(name))
                .with_topic_id(Uuid::nil())
        };
        req.topic_names.into_iter().map(by_name).collect()
    };
    let states = unique_by(states, |s| (s.name.clone(), s.topic_id));
    let client_id = header.client_id.as_deref().unwrap_or("");
    let quota = &ctx.quotas.mutations(
        Some(ctx.storage.as_ref()),
        &client.principal,
        client_id,
        header.request_api_version >= 5,
    );
    // DELETE on the cluster allows every topic; otherwise DELETE on each.
    let on_cluster = cluster_authorized(ctx, client, Operation::Delete);
    let responses = super::each(states.into_iter().map(|((name, id), state)| async move {
        let outcome = match state {
            Some(state) => delete(ctx, client, state, quota, on_cluster).await,
            None if name.is_some() => Err(Failure::duplicate("name")),
            None => Err(Failure::duplicate("id")),
        };
        result(name, id, outcome)
    }))
    .await;
    DeleteTopicsResponse::default()
        .with_responses(responses)
        .with_throttle_time_ms(quota.throttle_time_ms())
}

/// Deletes one topic; returns its name and id.
async fn delete(
    ctx: &Context,
    client: &Client,
    state: DeleteTopicState,
    quota: &MutationQuota<'_>,
    on_cluster: bool,
) -> Result<(TopicName, Uuid), Failure> {
    let by_id = state.topic_id != Uuid::nil();
    let name = match (state.name, by_id) {
        (Some(name), false) => name.as_str().to_owned(),
        (None, true) => resolve_topic_id(ctx, state.topic_id)
            .await
            .map_err(|code| Failure { code, message: None })?
            .name
            .clone(),
        (Some(_), true) => {
            return Err(Failure::new(
                ResponseError::InvalidRequest,
                "You may not specify both topic name and topic id.",
            ));
        }
        (None, false) => {
            return Err(Failure::new(
                ResponseError::InvalidRequest,
                "Neither topic name nor id were specified.",
            ));
        }
    };
    // By name, a topic the client may not describe is refused whatever
    // else it may do (Kafka's controller checks DESCRIBE first; DELETE
    // implies it, but a DENY of DESCRIBE wins).
    if !on_cluster && !by_id && !authorized(ctx, client, Operation::Describe, ResourceType::Topic, &name) {
        return Err(Failure::new(
            ResponseError::TopicAuthorizationFailed,
            "Authorization failed.",
        ));
    }
    if !on_cluster && !authorized(ctx, client, Operation::Delete, ResourceType::Topic, &name) {
        // A client that may describe the topic is told it does not exist,
        // as Kafka tells it.
        if !by_id
            && authorized(ctx, client, Operation::Describe, ResourceType::Topic, &name)
            && matches!(ctx.storage.topic_fresh(&name).await, Ok(None))
        {
            return Err(Failure {
                code: ResponseError::UnknownTopicOrPartition.code(),
                message: None,
            });
        }
        return Err(Failure::new(
            ResponseError::TopicAuthorizationFailed,
            "Authorization failed.",
        ));
    }
    // Its partitions count against the client's mutation quota (a topic
    // that does not exist counts nothing; deleting it fails below).
    if quota.applies()
        && let Ok(Some(topic)) = ctx.storage.topic(&name).await
    {
        count_mutation(quota, topic.partitions()).await?;
    }
    match ctx
        .storage
        .delete_topic(&name, by_id.then_some(state.topic_id))
        .await
    {
        Ok(topic) => {
            tracing::info!(topic = name, "deleted topic");
            Ok((TopicName(str_bytes(name)), topic.id))
        }
        Err(StorageError::UnknownTopicOrPartition) if by_id => Err(Failure {
            code: ResponseError::UnknownTopicId.code(),
            message: None,
        }),
        Err(StorageError::UnknownTopicOrPartition) => Err(Failure {
            code: ResponseError::UnknownTopicOrPartition.code(),
            message: None,
        }),
        Err(e) => Err(Failure::storage(&e)),
    }
}

fn result(
    name: Option<TopicName>,
    id: Uuid,
    outcome: Result<(TopicName, Uuid), Failure>,
) -> DeletableTopicResult {
    match outcome {
        Ok((name, id)) => DeletableTopicResult::default()
            .with_name(Some(name))
            .with_topic_id(id),
        Err(failure) => DeletableTopicResult::default()
            .with_name(name)
            .with_topic_id(id)
            .with_error_code(failure.code)
            .with_error_message(failure.message.map(str_bytes)),
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use kafka_protocol::protocol::Encodable;

    use super::*;

    #[test]
    fn results_encode_in_every_supported_version() {
        for version in 1..=6 {
            let name = TopicName(str_bytes("t"));
            let responses = vec![
                result(
                    Some(name.clone()),
                    Uuid::nil(),
                    Ok((name.clone(), Uuid::new_v4())),
                ),
                result(Some(name), Uuid::nil(), Err(Failure::duplicate("name"))),
            ];
            let response = DeleteTopicsResponse::default().with_responses(responses);
            assert!(
                response.encode(&mut BytesMut::new(), version).is_ok(),
                "version {version}"
            );
        }
    }
}
