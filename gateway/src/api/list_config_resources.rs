//! ListConfigResources (API key 74, versions 0–1; KIP-1142, Kafka 4.1):
//! the resources that have configs. Version 0 (formerly
//! ListClientMetricsResources) lists client-metrics subscriptions; version 1
//! lists the types asked for, all of them when none is named: every topic,
//! every broker clients see (in load-balancer mode the one advertised),
//! and no groups, broker loggers or client-metrics subscriptions (ketch
//! keeps no group configs, no broker loggers and no client-metrics
//! subscriptions). Needs DESCRIBE_CONFIGS on
//! the cluster, as in Kafka.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_config_resources_response::ConfigResource;
use kafka_protocol::messages::{ListConfigResourcesRequest, ListConfigResourcesResponse, RequestHeader};

use super::{Client, cluster_authorized, error_code, str_bytes};
use crate::Context;
use crate::auth::acl::Operation;

const TOPIC: i8 = 2;
const BROKER: i8 = 4;
const BROKER_LOGGER: i8 = 8;
const CLIENT_METRICS: i8 = 16;
const GROUP: i8 = 32;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: ListConfigResourcesRequest,
) -> ListConfigResourcesResponse {
    let response = ListConfigResourcesResponse::default();
    if !cluster_authorized(ctx, client, Operation::DescribeConfigs) {
        return response.with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    let types = if header.request_api_version == 0 {
        vec![CLIENT_METRICS]
    } else if req.resource_types.is_empty() {
        vec![TOPIC, BROKER, GROUP, CLIENT_METRICS]
    } else {
        req.resource_types
    };
    // A type that has no configs (Kafka answers UNSUPPORTED_VERSION; the
    // response has no message field). Broker loggers are a type Kafka
    // lists, but ketch has none to describe: none are listed.
    if types
        .iter()
        .any(|t| ![TOPIC, BROKER, BROKER_LOGGER, GROUP, CLIENT_METRICS].contains(t))
    {
        return response.with_error_code(ResponseError::UnsupportedVersion.code());
    }
    let mut resources = Vec::new();
    if types.contains(&TOPIC) {
        match ctx.storage.all_topics().await {
            Ok(topics) => resources.extend(topics.iter().map(|t| resource(&t.name, TOPIC))),
            Err(e) => return response.with_error_code(error_code(&e)),
        }
    }
    if types.contains(&BROKER) {
        let brokers = ctx.membership.brokers(&client.listener);
        resources.extend(brokers.iter().map(|b| resource(&b.id.to_string(), BROKER)));
    }
    ListConfigResourcesResponse::default().with_config_resources(resources)
}

fn resource(name: &str, resource_type: i8) -> ConfigResource {
    ConfigResource::default()
        .with_resource_name(str_bytes(name))
        .with_resource_type(resource_type)
}
