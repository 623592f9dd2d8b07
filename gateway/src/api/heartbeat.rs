//! Heartbeat (API key 12, versions 0–4): a member keeps its session alive
//! and learns of rebalances (REBALANCE_IN_PROGRESS). Spec: the Kafka protocol
//! guide; KIP-345 (v3 `group.instance.id`).

use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse, RequestHeader};

use crate::Context;

pub fn handle(ctx: &Context, _header: &RequestHeader, req: HeartbeatRequest) -> HeartbeatResponse {
    let code = super::check_coordinator(ctx, &req.group_id).unwrap_or_else(|| ctx.groups.heartbeat(&req));
    HeartbeatResponse::default().with_error_code(code)
}
