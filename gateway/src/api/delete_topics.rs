//! DeleteTopics (API key 20, versions 1–6): removes topics from the registry
//! and drops their partitions. Versions 1–5 name topics; version 6 names them
//! or gives their ids (KIP-516). A topic's partitions count against the
//! client's controller mutation quota (KIP-599; v5+ may be refused with
//! THROTTLING_QUOTA_EXCEEDED). Spec: KIP-4 (admin requests), KIP-516.

use std::collections::HashSet;

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
    let named_twice = &named_by_name_and_id(ctx, &states).await;
    let responses = super::each(states.into_iter().map(|((name, id), state)| async move {
        let (shown, outcome) = match state {
            Some(state) => delete(ctx, client, state, quota, on_cluster, named_twice).await,
            None if name.is_some() => (None, Err(Failure::duplicate("name"))),
            None => (None, Err(Failure::duplicate("id"))),
        };
        result(name.or(shown), id, outcome)
    }))
    .await;
    DeleteTopicsResponse::default()
        .with_responses(responses)
        .with_throttle_time_ms(quota.throttle_time_ms())
}

/// A request's entry as [`unique_by`] leaves it: what names the topic, and
/// the entry unless another named the topic the same way.
type Entry = ((Option<TopicName>, Uuid), Option<DeleteTopicState>);

/// The names of the topics a request names both by name and by id
/// (version 6): neither entry deletes it, as Kafka's controller refuses
/// both once the client may delete the topic.
async fn named_by_name_and_id(ctx: &Context, states: &[Entry]) -> HashSet<String> {
    let names: HashSet<&str> = states
        .iter()
        .filter(|((_, id), state)| state.is_some() && id.is_nil())
        .filter_map(|((name, _), _)| name.as_ref().map(|name| name.as_str()))
        .collect();
    // Ids given twice count too (their entries are refused as duplicates;
    // Kafka refuses the name of such an id as well).
    let ids = states
        .iter()
        .filter(|((name, id), _)| name.is_none() && !id.is_nil())
        .map(|((_, id), _)| *id);
    let mut twice = HashSet::new();
    for id in ids {
        if let Ok(topic) = resolve_topic_id(ctx, id).await
            && names.contains(topic.name.as_str())
        {
            twice.insert(topic.name.clone());
        }
    }
    twice
}

/// Deletes one topic; returns its name and id. Apart from the outcome, the
/// name of a topic given by id that the client may describe, for an
/// error's result (Kafka names it there).
async fn delete(
    ctx: &Context,
    client: &Client,
    state: DeleteTopicState,
    quota: &MutationQuota<'_>,
    on_cluster: bool,
    named_twice: &HashSet<String>,
) -> (Option<TopicName>, Result<(TopicName, Uuid), Failure>) {
    let by_id = state.topic_id != Uuid::nil();
    let name = match (state.name, by_id) {
        (Some(name), false) => name.as_str().to_owned(),
        (None, true) => match resolve_topic_id(ctx, state.topic_id).await {
            Ok(topic) => topic.name.clone(),
            Err(code) => return (None, Err(Failure { code, message: None })),
        },
        (Some(_), true) => {
            return (
                None,
                Err(Failure::new(
                    ResponseError::InvalidRequest,
                    "You may not specify both topic name and topic id.",
                )),
            );
        }
        (None, false) => {
            return (
                None,
                Err(Failure::new(
                    ResponseError::InvalidRequest,
                    "Neither topic name nor id were specified.",
                )),
            );
        }
    };
    let shown = (by_id
        && (on_cluster || authorized(ctx, client, Operation::Describe, ResourceType::Topic, &name)))
    .then(|| TopicName(str_bytes(name.clone())));
    (
        shown,
        delete_named(
            ctx,
            client,
            name,
            by_id.then_some(state.topic_id),
            quota,
            on_cluster,
            named_twice,
        )
        .await,
    )
}

/// [`delete`] once the topic's name is known (`id`: it was given by id).
async fn delete_named(
    ctx: &Context,
    client: &Client,
    name: String,
    id: Option<Uuid>,
    quota: &MutationQuota<'_>,
    on_cluster: bool,
    named_twice: &HashSet<String>,
) -> Result<(TopicName, Uuid), Failure> {
    let by_id = id.is_some();
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
    // Only now, where the client may delete it, is it told that it named
    // one topic twice (before, that would tell it the topic's id).
    if named_twice.contains(&name) {
        return Err(Failure::new(
            ResponseError::InvalidRequest,
            "The provided topic name maps to an ID that was already supplied.",
        ));
    }
    // Its partitions count against the client's mutation quota (a topic
    // that does not exist counts nothing; deleting it fails below).
    if quota.applies()
        && let Ok(Some(topic)) = ctx.storage.topic(&name).await
    {
        count_mutation(quota, topic.partitions()).await?;
    }
    match ctx.storage.delete_topic(&name, id).await {
        Ok(topic) => {
            tracing::info!(topic = name, "deleted topic");
            ctx.topic_counters.forget(&name);
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
        // Its configs or partitions changed under every attempt: retriable,
        // as CreatePartitions answers it.
        Err(e @ StorageError::Conflict(_)) => Err(Failure {
            code: ResponseError::RequestTimedOut.code(),
            message: Some(e.to_string()),
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
