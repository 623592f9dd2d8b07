//! SyncGroup (API key 14, versions 0–5): the leader hands in the assignment
//! of the generation and every member gets its part; followers wait for the
//! leader. Spec: the Kafka protocol guide; KIP-345 (v3 `group.instance.id`),
//! KIP-559 (v5 protocol type and name checks).

use kafka_protocol::messages::{RequestHeader, SyncGroupRequest, SyncGroupResponse};

use crate::Context;

pub async fn handle(ctx: &Context, _header: &RequestHeader, req: SyncGroupRequest) -> SyncGroupResponse {
    if let Some(code) = super::check_coordinator(ctx, &req.group_id) {
        return SyncGroupResponse::default().with_error_code(code);
    }
    ctx.groups.sync(req, &ctx.shutdown).await
}
