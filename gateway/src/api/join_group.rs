//! JoinGroup (API key 11, versions 0–9): a member joins a classic group and
//! waits for the join phase of the rebalance; the leader gets every member's
//! metadata. Spec: KIP-62 (v1 rebalance timeout), KIP-394 (v4 member id
//! required), KIP-345 (v5 `group.instance.id`), KIP-559 (v7 protocol type
//! and name), KIP-800 (v8 reason), KIP-814 (v9 skip assignment).

use kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse, RequestHeader};
use kafka_protocol::protocol::StrBytes;

use crate::Context;
use crate::group::Joiner;

pub async fn handle(
    ctx: &Context,
    client: super::Client,
    header: &RequestHeader,
    mut req: JoinGroupRequest,
) -> JoinGroupResponse {
    let version = header.request_api_version;
    let refused = |code: i16, req: &JoinGroupRequest| {
        JoinGroupResponse::default()
            .with_error_code(code)
            .with_member_id(req.member_id.clone())
            .with_protocol_name(None)
    };
    let response = match super::elsewhere(
        ctx,
        &client,
        header,
        (crate::auth::acl::Operation::Read, &req.group_id),
        &req,
    )
    .await
    {
        Some(Ok(answer)) => answer,
        Some(Err(code)) => refused(code, &req),
        None => {
            if version == 0 {
                // v0 has no rebalance timeout: Kafka uses the session timeout.
                req.rebalance_timeout_ms = req.session_timeout_ms;
            }
            let joiner = Joiner {
                client_id: header.client_id.clone().unwrap_or_default(),
                // Kafka shows a member's host as `/<ip>`.
                client_host: StrBytes::from_string(format!("/{}", client.peer.ip())),
                version,
            };
            ctx.groups.join(req, joiner, &ctx.shutdown).await
        }
    };
    for_version(response, version)
}

/// Before v7 the protocol name cannot be null: Kafka sends "".
fn for_version(response: JoinGroupResponse, version: i16) -> JoinGroupResponse {
    if version < 7 && response.protocol_name.is_none() {
        return response.with_protocol_name(Some(StrBytes::default()));
    }
    response
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use kafka_protocol::error::ResponseError;
    use kafka_protocol::protocol::Encodable;

    use super::*;

    #[test]
    fn errors_encode_in_every_supported_version() {
        for version in 0..=9 {
            let response = JoinGroupResponse::default()
                .with_error_code(ResponseError::MemberIdRequired.code())
                .with_protocol_name(None);
            let response = for_version(response, version);
            assert!(
                response.encode(&mut BytesMut::new(), version).is_ok(),
                "version {version}"
            );
        }
    }
}
