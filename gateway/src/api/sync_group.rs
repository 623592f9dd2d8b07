//! SyncGroup (API key 14, versions 0–5): the leader hands in the assignment
//! of the generation and every member gets its part; followers wait for the
//! leader. Spec: the Kafka protocol guide; KIP-345 (v3 `group.instance.id`),
//! KIP-559 (v5 protocol type and name checks).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{RequestHeader, RequestKind, SyncGroupRequest, SyncGroupResponse};

use super::{Client, Route, route};
use crate::{Context, forward};

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: SyncGroupRequest,
) -> SyncGroupResponse {
    let code = match route(ctx, client, &req.group_id) {
        Route::Here => return ctx.groups.sync(req, &ctx.shutdown).await,
        Route::Forward(to) => {
            let deadline = forward::deadline(ctx, &RequestKind::SyncGroup(Default::default()));
            match super::forward(ctx, client, header, &req, deadline, &to).await {
                Ok(response) => return response,
                Err(code) => code,
            }
        }
        Route::NotCoordinator => ResponseError::NotCoordinator.code(),
    };
    SyncGroupResponse::default().with_error_code(code)
}
