//! Heartbeat (API key 12, versions 0–4): a member keeps its session alive
//! and learns of rebalances (REBALANCE_IN_PROGRESS). Spec: the Kafka protocol
//! guide; KIP-345 (v3 `group.instance.id`).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse, RequestHeader, RequestKind};

use super::{Client, Route, route};
use crate::{Context, forward};

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: HeartbeatRequest,
) -> HeartbeatResponse {
    let code = match route(ctx, client, &req.group_id) {
        Route::Here => ctx.groups.heartbeat(&req).await,
        Route::Forward(to) => {
            let deadline = forward::deadline(ctx, &RequestKind::Heartbeat(Default::default()));
            match super::forward(ctx, client, header, &req, deadline, &to).await {
                Ok(response) => return response,
                Err(code) => code,
            }
        }
        Route::NotCoordinator => ResponseError::NotCoordinator.code(),
    };
    HeartbeatResponse::default().with_error_code(code)
}
