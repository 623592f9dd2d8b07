//! ElectLeaders (API key 43, versions 0–2): preferred or unclean leader
//! election (KIP-183, KIP-460). A ketch partition's only replica is its
//! leader, the gateway Metadata reports for it, so there is never anything
//! to elect: every existing partition is ELECTION_NOT_NEEDED — its leader
//! is the preferred replica, and it has one, so neither election type
//! applies — and an unknown one UNKNOWN_TOPIC_OR_PARTITION. Asked about all
//! partitions (`topic_partitions` null), Kafka leaves out those that need
//! no election: every topic is answered with no partitions.
//!
//! Needs ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED, for the
//! request and for each partition named).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, RequestHeader, TopicName};

use super::{Client, cluster_authorized, ensure_partition, error_code, resolve_topic, str_bytes};
use crate::Context;
use crate::auth::acl::Operation;

/// Kafka's election types (v1+; v0 elects the preferred replica).
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: ElectLeadersRequest,
) -> ElectLeadersResponse {
    let version = header.request_api_version;
    let refusal = if !cluster_authorized(ctx, client, Operation::Alter) {
        Some((
            ResponseError::ClusterAuthorizationFailed,
            "Cluster authorization failed.".to_owned(),
        ))
    } else if version >= 1 && req.election_type != PREFERRED && req.election_type != UNCLEAN {
        Some((
            ResponseError::InvalidRequest,
            format!("Unknown election type {}", req.election_type),
        ))
    } else {
        None
    };
    if let Some((error, message)) = refusal {
        return refused(version, req.topic_partitions.as_deref(), error, &message);
    }
    let results = match req.topic_partitions {
        Some(topics) => super::each(topics.into_iter().map(|t| elect(ctx, t))).await,
        None => match ctx.storage.all_topics().await {
            Ok(all) => all
                .iter()
                .map(|t| ReplicaElectionResult::default().with_topic(TopicName(str_bytes(t.name.clone()))))
                .collect(),
            Err(e) => {
                let code = error_code(&e);
                return ElectLeadersResponse::default().with_error_code(if version >= 1 { code } else { 0 });
            }
        },
    };
    ElectLeadersResponse::default().with_replica_election_results(results)
}

/// The answer for each partition of one topic named.
async fn elect(ctx: &Context, request: TopicPartitions) -> ReplicaElectionResult {
    let name = request.topic.as_str();
    let topic = resolve_topic(ctx, name, false).await;
    let mut results = Vec::with_capacity(request.partitions.len());
    for &p in &request.partitions {
        let found = match &topic {
            Ok(topic) => ensure_partition(ctx, topic.clone(), p).await.map(|_| ()),
            Err(code) => Err(*code),
        };
        let (code, message) = match found {
            Ok(()) => (
                ResponseError::ElectionNotNeeded.code(),
                "Leader election not needed for topic partition: its leader is its only replica \
                 (ketch keeps partitions in Redis)."
                    .to_owned(),
            ),
            Err(code) if code == ResponseError::UnknownTopicOrPartition.code() => match &topic {
                Ok(_) => (code, format!("No such partition as {name}-{p}")),
                Err(_) => (code, format!("No such topic as {name}")),
            },
            Err(code) => (code, "Cannot read the topic from Redis.".to_owned()),
        };
        results.push(
            PartitionResult::default()
                .with_partition_id(p)
                .with_error_code(code)
                .with_error_message(Some(str_bytes(message))),
        );
    }
    ReplicaElectionResult::default()
        .with_topic(request.topic)
        .with_partition_result(results)
}

/// Kafka's answer to a request refused as a whole: the error at the top
/// (v1+) and for every partition named.
fn refused(
    version: i16,
    topics: Option<&[TopicPartitions]>,
    error: ResponseError,
    message: &str,
) -> ElectLeadersResponse {
    let results = topics
        .unwrap_or_default()
        .iter()
        .map(|t| {
            ReplicaElectionResult::default()
                .with_topic(t.topic.clone())
                .with_partition_result(
                    t.partitions
                        .iter()
                        .map(|&p| {
                            PartitionResult::default()
                                .with_partition_id(p)
                                .with_error_code(error.code())
                                .with_error_message(Some(str_bytes(message)))
                        })
                        .collect(),
                )
        })
        .collect();
    ElectLeadersResponse::default()
        .with_error_code(if version >= 1 { error.code() } else { 0 })
        .with_replica_election_results(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_encode_in_every_supported_version() {
        use bytes::BytesMut;
        use kafka_protocol::protocol::Encodable;

        let topics = [TopicPartitions::default()
            .with_topic(TopicName(str_bytes("t")))
            .with_partitions(vec![0, 1])];
        for version in 0..=2 {
            let response = refused(
                version,
                Some(&topics),
                ResponseError::ClusterAuthorizationFailed,
                "no",
            );
            assert_eq!(response.replica_election_results[0].partition_result.len(), 2);
            assert!(
                response.encode(&mut BytesMut::new(), version).is_ok(),
                "version {version}"
            );
        }
    }
}
