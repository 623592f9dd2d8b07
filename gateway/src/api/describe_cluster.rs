//! DescribeCluster (API key 60, versions 0–2): the cluster id and the
//! brokers clients may bootstrap from: every live gateway, the lowest node
//! id acting as controller. Spec: KIP-700, KIP-919 (endpoint types).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{BrokerId, DescribeClusterRequest, DescribeClusterResponse, RequestHeader};

use super::{Client, cluster_authorized, str_bytes};
use crate::Context;
use crate::auth::acl::{CLUSTER_NAME, Operation, ResourceType};

/// Kafka's `EndpointType.BROKER`; ketch serves no controller endpoint.
const BROKER_ENDPOINT: i8 = 1;
/// Kafka's `EndpointType.CONTROLLER`.
const CONTROLLER_ENDPOINT: i8 = 2;

/// Kafka's "authorized operations were not requested" marker.
const OPERATIONS_NOT_REQUESTED: i32 = i32::MIN;

pub fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: DescribeClusterRequest,
) -> DescribeClusterResponse {
    let response = DescribeClusterResponse::default().with_endpoint_type(req.endpoint_type);
    if req.endpoint_type != BROKER_ENDPOINT {
        // As Kafka answers: a controller endpoint asked of a broker is a
        // mismatch, any other type unsupported (both INVALID_REQUEST at v0).
        let (error, message) = if req.endpoint_type == CONTROLLER_ENDPOINT {
            (
                ResponseError::MismatchedEndpointType,
                "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type \
                 CONTROLLER (ketch serves only broker endpoints)"
                    .to_owned(),
            )
        } else {
            (
                ResponseError::UnsupportedEndpointType,
                format!("Unsupported endpoint type {}", req.endpoint_type),
            )
        };
        let error = if header.request_api_version == 0 {
            ResponseError::InvalidRequest
        } else {
            error
        };
        return response
            .with_error_code(error.code())
            .with_error_message(Some(str_bytes(message)));
    }
    let nodes = ctx.membership.brokers(&client.listener);
    let controller = nodes.first().map_or(-1, |n| n.id);
    let brokers = nodes
        .into_iter()
        .map(|n| {
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(n.id))
                .with_host(str_bytes(n.host))
                .with_port(i32::from(n.port))
        })
        .collect();
    let operations = cluster_operations(ctx, client, req.include_cluster_authorized_operations);
    response
        .with_cluster_id(str_bytes(ctx.settings.broker.cluster_id.clone()))
        .with_controller_id(BrokerId(controller))
        .with_brokers(brokers)
        .with_cluster_authorized_operations(operations)
}

/// The cluster's authorised operations as DescribeCluster and Metadata
/// report them when asked: to a principal with DESCRIBE on the cluster (0
/// to others), as in Kafka. Without an authorizer every operation is
/// allowed.
pub fn cluster_operations(ctx: &Context, client: &Client, requested: bool) -> i32 {
    if !requested {
        OPERATIONS_NOT_REQUESTED
    } else if cluster_authorized(ctx, client, Operation::Describe) {
        super::authorized_operations(ctx, client, ResourceType::Cluster, CLUSTER_NAME)
    } else {
        0
    }
}
