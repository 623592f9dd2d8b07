//! SyncGroup (API key 14, versions 0–5): the leader hands in the assignment
//! of the generation and every member gets its part; followers wait for the
//! leader. Spec: the Kafka protocol guide; KIP-345 (v3 `group.instance.id`),
//! KIP-559 (v5 protocol type and name checks).

use kafka_protocol::messages::{RequestHeader, SyncGroupRequest, SyncGroupResponse};

use super::Client;
use crate::Context;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: SyncGroupRequest,
) -> SyncGroupResponse {
    // From v5 the protocol type and name are mandatory (Kafka answers their
    // absence before any other check).
    if header.request_api_version >= 5 && (req.protocol_type.is_none() || req.protocol_name.is_none()) {
        return SyncGroupResponse::default()
            .with_error_code(kafka_protocol::error::ResponseError::InconsistentGroupProtocol.code());
    }
    match super::elsewhere(
        ctx,
        client,
        header,
        (crate::auth::acl::Operation::Read, &req.group_id),
        &req,
    )
    .await
    {
        None => ctx.groups.sync(req, &ctx.shutdown).await,
        Some(Ok(answer)) => answer,
        Some(Err(code)) => SyncGroupResponse::default().with_error_code(code),
    }
}
