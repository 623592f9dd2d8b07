//! LeaveGroup (API key 13, versions 0–5): members leave a classic group,
//! which rebalances. Versions 0–2 name one member; from v3 a batch, each by
//! member id or by `group.instance.id` alone, with an error each (KIP-345).
//! v5 adds a reason (KIP-800).

use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::{LeaveGroupRequest, LeaveGroupResponse, RequestHeader};

use super::Client;
use crate::Context;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: LeaveGroupRequest,
) -> LeaveGroupResponse {
    match super::elsewhere(
        ctx,
        client,
        header,
        (crate::auth::acl::Operation::Read, &req.group_id),
        &req,
    )
    .await
    {
        None => {}
        Some(Ok(answer)) => return answer,
        Some(Err(code)) => return LeaveGroupResponse::default().with_error_code(code),
    }
    let batched = header.request_api_version >= 3;
    let leaving = if batched {
        req.members
    } else {
        vec![MemberIdentity::default().with_member_id(req.member_id)]
    };
    match ctx.groups.leave(&req.group_id, leaving).await {
        Err(code) => LeaveGroupResponse::default().with_error_code(code),
        Ok(members) if batched => LeaveGroupResponse::default().with_members(members),
        // The one member's error is the response's.
        Ok(members) => {
            let code = members.first().map_or(0, |m| m.error_code);
            LeaveGroupResponse::default().with_error_code(code)
        }
    }
}
