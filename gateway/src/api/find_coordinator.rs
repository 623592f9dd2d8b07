//! FindCoordinator (v0–v6; KIP-699 batches keys from v4): the live gateway
//! that coordinates each group, chosen by rendezvous hashing (see
//! `membership`), and of each transactional id (the same hashing: the
//! gateway that looks after the id's timeouts; any gateway serves its
//! requests, its state being in Redis). Share-group coordinators do not
//! exist in ketch: asking for one is INVALID_REQUEST.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, RequestHeader};
use kafka_protocol::protocol::StrBytes;

use super::{Client, authorized, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

/// `key_type` of a consumer group.
const GROUP_KEY: i8 = 0;
/// `key_type` of a transactional id.
const TRANSACTION_KEY: i8 = 1;

pub fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    if header.request_api_version >= 4 {
        let coordinators = request
            .coordinator_keys
            .into_iter()
            .map(|key| find(ctx, client, request.key_type, key))
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let found = find(ctx, client, request.key_type, request.key);
    let response = FindCoordinatorResponse::default()
        .with_error_code(found.error_code)
        .with_node_id(found.node_id)
        .with_host(found.host)
        .with_port(found.port);
    if header.request_api_version >= 1 {
        response.with_error_message(found.error_message)
    } else {
        response
    }
}

fn find(ctx: &Context, client: &Client, key_type: i8, key: StrBytes) -> Coordinator {
    let coordinator = Coordinator::default().with_key(key.clone());
    let (resource, refused) = match key_type {
        GROUP_KEY => (ResourceType::Group, ResponseError::GroupAuthorizationFailed),
        TRANSACTION_KEY => (
            ResourceType::TransactionalId,
            ResponseError::TransactionalIdAuthorizationFailed,
        ),
        _ => {
            return coordinator
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(str_bytes(format!(
                    "ketch has group and transaction coordinators, not key type {key_type}"
                ))))
                .with_node_id(BrokerId(-1))
                .with_port(-1);
        }
    };
    if !authorized(ctx, client, Operation::Describe, resource, &key) {
        return coordinator
            .with_error_code(refused.code())
            .with_node_id(BrokerId(-1))
            .with_port(-1);
    }
    if !ctx.membership.joined() {
        // Not registered yet (Redis unreachable since start): no coordinator
        // to name, not even a configured `broker.id`.
        return coordinator
            .with_error_code(ResponseError::CoordinatorNotAvailable.code())
            .with_node_id(BrokerId(-1))
            .with_port(-1);
    }
    let owner = if key_type == TRANSACTION_KEY {
        ctx.membership.transaction_coordinator(&key)
    } else {
        ctx.membership.group_coordinator(&key)
    };
    let node = ctx.membership.presented(&owner, &client.listener);
    coordinator
        .with_node_id(BrokerId(node.id))
        .with_host(str_bytes(node.host))
        .with_port(i32::from(node.port))
}
