//! DeleteGroups (API key 42, versions 0–2): deletes Empty groups and their
//! committed offsets. A group with members is NON_EMPTY_GROUP; one neither in
//! memory nor with offsets is GROUP_ID_NOT_FOUND. Spec: KIP-229.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse, RequestHeader};

use super::{Client, Route, route};
use crate::Context;
use crate::group::NotDeleted;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(req.groups_names.len());
    // One at a time, each name once (as Kafka answers a name given twice).
    let mut seen = std::collections::HashSet::new();
    for group_id in req.groups_names {
        if !seen.insert(group_id.clone()) {
            continue;
        }
        let may_delete = super::authorized(
            ctx,
            client,
            crate::auth::acl::Operation::Delete,
            crate::auth::acl::ResourceType::Group,
            &group_id,
        );
        let code = match route(ctx, client, &group_id) {
            _ if !may_delete => ResponseError::GroupAuthorizationFailed.code(),
            Route::Here => delete(ctx, &group_id).await,
            Route::Forward(to) => {
                let one = DeleteGroupsRequest::default().with_groups_names(vec![group_id.clone()]);
                match super::forward(ctx, client, header, &one, &to).await {
                    Ok(response) => response
                        .results
                        .first()
                        .map_or(ResponseError::CoordinatorNotAvailable.code(), |r| r.error_code),
                    Err(code) => code,
                }
            }
            Route::NotCoordinator => ResponseError::NotCoordinator.code(),
            Route::Unavailable => ResponseError::CoordinatorNotAvailable.code(),
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(group_id)
                .with_error_code(code),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

async fn delete(ctx: &Context, group_id: &str) -> i16 {
    let in_memory = match ctx.groups.delete(group_id).await {
        Ok(()) => true,
        Err(NotDeleted::NonEmpty) => return ResponseError::NonEmptyGroup.code(),
        Err(NotDeleted::Unknown) => false,
        Err(NotDeleted::Refused(code)) => return code,
    };
    match ctx.storage.delete_group_offsets(group_id).await {
        Ok(had_offsets) if in_memory || had_offsets => {
            tracing::info!(group = group_id, "deleted group");
            0
        }
        Ok(_) => ResponseError::GroupIdNotFound.code(),
        Err(e) => {
            tracing::warn!(group = group_id, error = %e, "cannot delete committed offsets");
            ResponseError::CoordinatorLoadInProgress.code()
        }
    }
}
