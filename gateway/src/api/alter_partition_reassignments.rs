//! AlterPartitionReassignments (API key 45, versions 0–1): moves partition
//! replicas between brokers (KIP-455; KIP-860 adds
//! `allow_replication_factor_change`). A ketch partition has one logical
//! replica in Redis, led by the gateway Metadata reports for it, chosen
//! among the live gateways; nothing can be moved, so each partition is
//! answered, after Kafka's own checks, with:
//!
//! - replicas null (cancel): NO_REASSIGNMENT_IN_PROGRESS — none ever is;
//! - exactly its current leader: NONE, as Kafka answers a reassignment to
//!   the replicas a partition has (nothing to do);
//! - more or fewer than one broker: INVALID_REPLICATION_FACTOR, as
//!   CreateTopics answers a replication factor other than 1;
//! - one other live broker: INVALID_REPLICA_ASSIGNMENT, with a message
//!   saying why ketch does not move partitions;
//! - an unknown topic or partition: UNKNOWN_TOPIC_OR_PARTITION; a broker
//!   that is not live, or named twice: INVALID_REPLICA_ASSIGNMENT.
//!
//! Needs ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED, for the
//! request and each partition).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_partition_reassignments_request::ReassignablePartition;
use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, RequestHeader,
};

use super::create_topics::{Failure, assignable_brokers, check_replica_list};
use super::metadata::leader_id;
use super::{Client, cluster_authorized, ensure_partition, resolve_topic, str_bytes};
use crate::Context;
use crate::auth::acl::Operation;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let response = AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(req.allow_replication_factor_change)
        .with_error_message(None);
    if !cluster_authorized(ctx, client, Operation::Alter) {
        let failure = Failure::new(
            ResponseError::ClusterAuthorizationFailed,
            "Cluster authorization failed.",
        );
        let responses = req
            .topics
            .into_iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| answer(p.partition_index, Err(failure.clone())));
                ReassignableTopicResponse::default()
                    .with_name(t.name)
                    .with_partitions(partitions.collect())
            })
            .collect();
        return response
            .with_error_code(failure.code)
            .with_error_message(failure.message.map(str_bytes))
            .with_responses(responses);
    }
    let brokers = assignable_brokers(ctx, &client.listener);
    let broker_ids = ctx.membership.broker_ids(&client.listener);
    let (brokers, broker_ids) = (&brokers, &broker_ids);
    let allow_factor_change = req.allow_replication_factor_change;
    let responses = super::each(req.topics.into_iter().map(|t| async move {
        let name = t.name.as_str();
        let topic = resolve_topic(ctx, name, false).await;
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for target in &t.partitions {
            let p = target.partition_index;
            let outcome = match &topic {
                Err(code) if *code == ResponseError::UnknownTopicOrPartition.code() => Err(Failure::new(
                    ResponseError::UnknownTopicOrPartition,
                    format!("Unable to find a topic named {name}."),
                )),
                Err(code) => Err(Failure {
                    code: *code,
                    message: Some("Cannot read the topic from Redis.".to_owned()),
                }),
                Ok(topic) => match ensure_partition(ctx, topic.clone(), p).await {
                    Ok(topic) => {
                        let leader = leader_id(ctx, &client.listener, broker_ids, &topic, p);
                        reassign(
                            brokers,
                            allow_factor_change,
                            &format!("{name}-{p}"),
                            leader,
                            target,
                        )
                    }
                    Err(code) if code == ResponseError::UnknownTopicOrPartition.code() => Err(Failure::new(
                        ResponseError::UnknownTopicOrPartition,
                        format!("Unable to find partition {name}:{p}."),
                    )),
                    Err(code) => Err(Failure {
                        code,
                        message: Some("Cannot read the topic from Redis.".to_owned()),
                    }),
                },
            };
            partitions.push(answer(p, outcome));
        }
        ReassignableTopicResponse::default()
            .with_name(t.name)
            .with_partitions(partitions)
    }))
    .await;
    response.with_responses(responses)
}

/// The answer for an existing partition led by `leader` (the broker id
/// clients see), which `target` asks to move.
fn reassign(
    brokers: &[i32],
    allow_factor_change: bool,
    partition: &str,
    leader: i32,
    target: &ReassignablePartition,
) -> Result<(), Failure> {
    let Some(replicas) = &target.replicas else {
        return Err(Failure::new(
            ResponseError::NoReassignmentInProgress,
            "No partition reassignment is in progress.",
        ));
    };
    check_replica_list(brokers, replicas)?;
    if replicas.len() != 1 {
        let message = if allow_factor_change {
            format!(
                "ketch keeps one replica of each partition (its data is in Redis); \
                 {partition} cannot have {}.",
                replicas.len()
            )
        } else {
            format!(
                "The replication factor is changed from 1 to {} but allowReplicationFactorChange is false.",
                replicas.len()
            )
        };
        return Err(Failure::new(ResponseError::InvalidReplicationFactor, message));
    }
    if *replicas[0] == leader {
        return Ok(());
    }
    Err(Failure::new(
        ResponseError::InvalidReplicaAssignment,
        format!(
            "ketch does not move partitions: {partition} is stored in Redis, and its one replica is led \
             by broker {leader}, chosen among the live gateways (not by assignment)."
        ),
    ))
}

fn answer(partition: i32, outcome: Result<(), Failure>) -> ReassignablePartitionResponse {
    let response = ReassignablePartitionResponse::default().with_partition_index(partition);
    match outcome {
        Ok(()) => response.with_error_message(None),
        Err(failure) => response
            .with_error_code(failure.code)
            .with_error_message(failure.message.map(str_bytes)),
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::BrokerId;

    use super::*;

    fn target(replicas: Option<&[i32]>) -> ReassignablePartition {
        ReassignablePartition::default()
            .with_partition_index(0)
            .with_replicas(replicas.map(|r| r.iter().map(|&b| BrokerId(b)).collect()))
    }

    fn code(outcome: Result<(), Failure>) -> i16 {
        outcome.map_or_else(|f| f.code, |()| 0)
    }

    #[test]
    fn only_a_reassignment_to_the_current_leader_is_accepted() {
        let live = [1, 2];
        let reassign = |allow, replicas| code(reassign(&live, allow, "t-0", 1, &target(replicas)));
        assert_eq!(reassign(true, Some(&[1])), 0, "nothing to move");
        assert_eq!(
            reassign(true, Some(&[2])),
            ResponseError::InvalidReplicaAssignment.code()
        );
        assert_eq!(
            reassign(true, None),
            ResponseError::NoReassignmentInProgress.code()
        );
        assert_eq!(
            reassign(true, Some(&[1, 2])),
            ResponseError::InvalidReplicationFactor.code()
        );
        assert_eq!(
            reassign(false, Some(&[1, 2])),
            ResponseError::InvalidReplicationFactor.code()
        );
        for bad in [&[][..], &[3], &[1, 1]] {
            assert_eq!(
                reassign(true, Some(bad)),
                ResponseError::InvalidReplicaAssignment.code(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn responses_encode_in_every_supported_version() {
        use bytes::BytesMut;
        use kafka_protocol::protocol::Encodable;

        for version in 0..=1 {
            let response = AlterPartitionReassignmentsResponse::default()
                .with_allow_replication_factor_change(false)
                .with_error_message(None)
                .with_responses(vec![ReassignableTopicResponse::default().with_partitions(vec![
                    answer(0, Ok(())),
                    answer(1, reassign(&[1], true, "t-1", 1, &target(None))),
                ])]);
            assert!(
                response.encode(&mut BytesMut::new(), version).is_ok(),
                "version {version}"
            );
        }
    }
}
