//! ListPartitionReassignments (API key 46, version 0): the reassignments in
//! progress (KIP-455). ketch never moves a partition's one replica
//! (AlterPartitionReassignments starts none), so none ever is: the answer
//! is an empty list, and partitions named — known or not — are left out,
//! as Kafka leaves out those with no reassignment.
//!
//! Needs DESCRIBE on the cluster (CLUSTER_AUTHORIZATION_FAILED).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, RequestHeader,
};

use super::{Client, cluster_authorized, str_bytes};
use crate::Context;
use crate::auth::acl::Operation;

pub fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    req: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    let response = ListPartitionReassignmentsResponse::default().with_error_message(None);
    if cluster_authorized(ctx, client, Operation::Describe) {
        return response;
    }
    // Kafka's refusal echoes the partitions named, with no replicas.
    let topics = req
        .topics
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            OngoingTopicReassignment::default()
                .with_name(t.name)
                .with_partitions(
                    t.partition_indexes
                        .into_iter()
                        .map(|p| OngoingPartitionReassignment::default().with_partition_index(p))
                        .collect(),
                )
        })
        .collect();
    response
        .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
        .with_error_message(Some(str_bytes("Cluster authorization failed.")))
        .with_topics(topics)
}
