//! Metadata: brokers, topics and partitions (auto-creating topics when
//! `topics.auto_create` is on and the client allows it, KIP-361).
//!
//! Brokers are the live gateways; each partition's leader is chosen by
//! rendezvous hashing over them (see `membership`). Storage is shared, so
//! any gateway still serves any partition: leadership only spreads clients.

use std::collections::HashMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, RequestHeader, TopicName};
use ketch_storage::Topic;

use super::{
    Client, authorized, authorized_operations, cluster_authorized, resolve_topic, resolve_topic_id, str_bytes,
};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: MetadataRequest,
) -> Option<MetadataResponse> {
    let version = header.request_api_version;
    let auto_create = version < 4 || request.allow_auto_topic_creation;
    let topic_operations = request.include_topic_authorized_operations;
    let wants_all = match &request.topics {
        None => true,
        Some(topics) => version == 0 && topics.is_empty(),
    };
    let broker_ids = ctx.membership.broker_ids(&client.listener);
    let broker_ids = &broker_ids;
    let topics = if wants_all {
        match ctx.storage.all_topics().await {
            // Topics the client may not describe are left out.
            Ok(all) => all
                .iter()
                .filter(|t| authorized(ctx, client, Operation::Describe, ResourceType::Topic, &t.name))
                .map(|t| describe(ctx, client, broker_ids, t, topic_operations))
                .collect(),
            // No list to answer with: an empty one would tell clients
            // every topic is gone (a pattern subscription would drop them
            // all). The connection closes instead, and the client asks
            // again, here or at another gateway (Kafka's brokers answer from
            // their own metadata and never fail this).
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the topics for a Metadata request: closing the connection");
                return None;
            }
        }
    } else {
        let requested = request.topics.unwrap_or_default();
        let lookups = requested.into_iter().map(|t| async move {
            // Topic ids name topics from v12; v10 and v11 carry the field
            // but Kafka refuses it set, or a topic without its name.
            let by_id_too_early = version < 12 && (t.name.is_none() || !t.topic_id.is_nil());
            let result = match &t.name {
                _ if by_id_too_early => Err(ResponseError::InvalidRequest.code()),
                Some(name) if !authorized(ctx, client, Operation::Describe, ResourceType::Topic, name) => {
                    Err(ResponseError::TopicAuthorizationFailed.code())
                }
                Some(name) => {
                    // Auto-creation takes CREATE on the cluster or the topic.
                    let creates = auto_create && ctx.settings.topics.auto_create;
                    let may_create = creates
                        && (cluster_authorized(ctx, client, Operation::Create)
                            || authorized(ctx, client, Operation::Create, ResourceType::Topic, name));
                    let unknown = ResponseError::UnknownTopicOrPartition.code();
                    match resolve_topic(ctx, name, may_create).await {
                        // As Kafka: a topic the client asked to have created
                        // but may not create is TOPIC_AUTHORIZATION_FAILED
                        // (a producer fails at once instead of waiting for
                        // it); an invalid name is INVALID_TOPIC_EXCEPTION.
                        Err(code) if code == unknown && creates && !may_create => {
                            Err(ResponseError::TopicAuthorizationFailed.code())
                        }
                        Err(code) if code == unknown && ketch_storage::validate_topic_name(name).is_err() => {
                            Err(ResponseError::InvalidTopicException.code())
                        }
                        other => other,
                    }
                }
                None => match resolve_topic_id(ctx, t.topic_id).await {
                    // Topic ids are not secret: one the client may not
                    // describe is TOPIC_AUTHORIZATION_FAILED, as Kafka answers
                    // (its name is not told).
                    Ok(topic)
                        if !authorized(
                            ctx,
                            client,
                            Operation::Describe,
                            ResourceType::Topic,
                            &topic.name,
                        ) =>
                    {
                        Err(ResponseError::TopicAuthorizationFailed.code())
                    }
                    other => other,
                },
            };
            match result {
                Ok(topic) => describe(ctx, client, broker_ids, &topic, topic_operations),
                Err(code) => MetadataResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_topic_id(t.topic_id)
                    .with_error_code(retriable_when_storage(code))
                    .with_topic_authorized_operations(i32::MIN),
            }
        });
        super::each(lookups).await
    };
    let nodes = ctx.membership.brokers(&client.listener);
    let controller = nodes.first().map_or(-1, |n| n.id);
    let response = MetadataResponse::default()
        .with_brokers(
            nodes
                .into_iter()
                .map(|n| {
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(n.id))
                        .with_host(str_bytes(n.host))
                        .with_port(i32::from(n.port))
                })
                .collect(),
        )
        .with_cluster_id(Some(str_bytes(ctx.settings.broker.cluster_id.clone())))
        .with_controller_id(BrokerId(controller))
        .with_topics(topics)
        .with_cluster_authorized_operations(super::describe_cluster::cluster_operations(
            ctx,
            client,
            request.include_cluster_authorized_operations,
        ));
    Some(response)
}

/// Metadata clients retry LEADER_NOT_AVAILABLE; use it while Redis is away.
pub(crate) fn retriable_when_storage(code: i16) -> i16 {
    if code == ResponseError::KafkaStorageError.code() {
        ResponseError::LeaderNotAvailable.code()
    } else {
        code
    }
}

/// `broker_ids`: each live gateway's broker id ([`Membership::broker_ids`]).
///
/// [`Membership::broker_ids`]: crate::membership::Membership::broker_ids
fn describe(
    ctx: &Context,
    client: &Client,
    broker_ids: &HashMap<i32, i32>,
    topic: &Topic,
    operations: bool,
) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(str_bytes(topic.name.clone()))))
        .with_topic_id(topic.id)
        .with_topic_authorized_operations(if operations {
            authorized_operations(ctx, client, ResourceType::Topic, &topic.name)
        } else {
            i32::MIN
        })
        .with_partitions(
            (0..topic.partitions())
                .map(|p| {
                    let node = BrokerId(leader_id(ctx, &client.listener, broker_ids, topic, p));
                    MetadataResponsePartition::default()
                        .with_partition_index(p)
                        .with_leader_id(node)
                        .with_leader_epoch(0)
                        .with_replica_nodes(vec![node])
                        .with_isr_nodes(vec![node])
                })
                .collect(),
        )
}

/// The broker id clients of `listener` see as the leader (and only
/// replica) of a partition; `broker_ids` as for [`describe`].
pub(crate) fn leader_id(
    ctx: &Context,
    listener: &str,
    broker_ids: &HashMap<i32, i32>,
    topic: &Topic,
    partition: i32,
) -> i32 {
    let leader = ctx.membership.partition_leader(&topic.id, partition);
    match broker_ids.get(&leader.id) {
        Some(id) => *id,
        // The live set changed since the ids were taken.
        None => ctx.membership.presented(&leader, listener).id,
    }
}
