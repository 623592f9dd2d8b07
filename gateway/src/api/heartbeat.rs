//! Heartbeat (API key 12, versions 0–4): a member keeps its session alive
//! and learns of rebalances (REBALANCE_IN_PROGRESS). Spec: the Kafka protocol
//! guide; KIP-345 (v3 `group.instance.id`).

use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse, RequestHeader};

use super::Client;
use crate::Context;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: HeartbeatRequest,
) -> HeartbeatResponse {
    let code = match super::elsewhere(
        ctx,
        client,
        header,
        (crate::auth::acl::Operation::Read, &req.group_id),
        &req,
    )
    .await
    {
        None => ctx.groups.heartbeat(&req).await,
        Some(Ok(answer)) => return answer,
        Some(Err(code)) => code,
    };
    HeartbeatResponse::default().with_error_code(code)
}
