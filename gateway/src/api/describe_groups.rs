//! DescribeGroups (API key 15, versions 0–6): state, protocol and members
//! (with metadata and assignment once Stable) of classic groups. A group
//! known only by its committed offsets is Empty; an unknown one is Dead, and
//! from v6 GROUP_ID_NOT_FOUND (KIP-1043). v3 adds authorized operations
//! (KIP-430), v4 `group.instance.id` (KIP-345).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::{DescribeGroupsRequest, DescribeGroupsResponse, RequestHeader};
use kafka_protocol::protocol::StrBytes;

use super::{Client, Route, route, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::group::State;

/// Kafka's "authorized operations were not requested" marker.
const OPERATIONS_NOT_REQUESTED: i32 = i32::MIN;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let include_operations = req.include_authorized_operations;
    let described = super::each(req.groups.into_iter().map(|group_id| async move {
        if !super::authorized(ctx, client, Operation::Describe, ResourceType::Group, &group_id) {
            return DescribedGroup::default()
                .with_group_id(group_id)
                .with_error_code(ResponseError::GroupAuthorizationFailed.code())
                .with_authorized_operations(OPERATIONS_NOT_REQUESTED);
        }
        // Without an authorizer every operation is allowed, as in Kafka.
        let operations = if include_operations {
            super::authorized_operations(ctx, client, ResourceType::Group, &group_id)
        } else {
            OPERATIONS_NOT_REQUESTED
        };
        let described = match route(ctx, client, &group_id) {
            Route::Here => describe(ctx, header.request_api_version, &group_id).await,
            Route::Forward(to) => {
                // The coordinator answers for its groups only: one request each.
                let one = DescribeGroupsRequest::default()
                    .with_groups(vec![group_id.clone()])
                    .with_include_authorized_operations(include_operations);
                match super::forward(ctx, client, header, &one, &to).await {
                    Ok(response) => match response.groups.into_iter().next() {
                        Some(group) => return group,
                        None => DescribedGroup::default()
                            .with_error_code(ResponseError::CoordinatorNotAvailable.code()),
                    },
                    Err(code) => DescribedGroup::default().with_error_code(code),
                }
            }
            Route::NotCoordinator => {
                DescribedGroup::default().with_error_code(ResponseError::NotCoordinator.code())
            }
            Route::Unavailable => {
                DescribedGroup::default().with_error_code(ResponseError::CoordinatorNotAvailable.code())
            }
        };
        // Reported with a group described, not with an error (as Kafka).
        let operations = if described.error_code == 0 {
            operations
        } else {
            OPERATIONS_NOT_REQUESTED
        };
        described
            .with_group_id(group_id)
            .with_authorized_operations(operations)
    }))
    .await;
    DescribeGroupsResponse::default().with_groups(described)
}

async fn describe(ctx: &Context, version: i16, group_id: &str) -> DescribedGroup {
    match ctx.groups.describe(group_id).await {
        Ok(Some(described)) => return described,
        Ok(None) => {}
        // Not a view without its members: Kafka answers nothing while it
        // loads a group.
        Err(e) => return DescribedGroup::default().with_error_code(e.code()),
    }
    match ctx.storage.all_committed_offsets(group_id).await {
        Ok(offsets) if !offsets.is_empty() => state_only(State::Empty),
        Ok(_) if version >= 6 => state_only(State::Dead)
            .with_error_code(ResponseError::GroupIdNotFound.code())
            .with_error_message(Some(str_bytes(format!("Group {group_id} not found.")))),
        Ok(_) => state_only(State::Dead),
        Err(e) => {
            tracing::warn!(group = group_id, error = %e, "cannot read committed offsets");
            DescribedGroup::default().with_error_code(ResponseError::CoordinatorLoadInProgress.code())
        }
    }
}

fn state_only(state: State) -> DescribedGroup {
    DescribedGroup::default().with_group_state(StrBytes::from_static_str(state.name()))
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use kafka_protocol::messages::GroupId;
    use kafka_protocol::protocol::Encodable;

    use super::*;

    #[test]
    fn dead_group_encodes_in_every_supported_version() {
        for version in 0..=6 {
            let group = state_only(State::Dead).with_group_id(GroupId(str_bytes("g")));
            let response = DescribeGroupsResponse::default().with_groups(vec![group]);
            assert!(
                response.encode(&mut BytesMut::new(), version).is_ok(),
                "version {version}"
            );
        }
    }
}
