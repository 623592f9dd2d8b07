//! AddOffsetsToTxn (v0–v3): adds a consumer group to the producer's
//! transaction, so that offsets it commits there (TxnOffsetCommit) are
//! applied when the transaction commits.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, RequestHeader};
use ketch_storage::{TxnItems, TxnReply};

use super::{Client, authorized};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::transactions::coordinator_error;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let response = AddOffsetsToTxnResponse::default();
    let id = request.transactional_id.0.as_str();
    if !authorized(ctx, client, Operation::Write, ResourceType::TransactionalId, id) {
        return response.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    if !authorized(
        ctx,
        client,
        Operation::Read,
        ResourceType::Group,
        &request.group_id,
    ) {
        return response.with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
    // Kafka's coordinator refuses the empty transactional id.
    if id.is_empty() {
        return response.with_error_code(ResponseError::InvalidRequest.code());
    }
    if !crate::transactions::transactional_group(&request.group_id) {
        return response.with_error_code(ResponseError::InvalidGroupId.code());
    }
    let groups = serde_json::json!([request.group_id.0.as_str()]);
    let producer = (request.producer_id.0, request.producer_epoch);
    // The previous transaction, answered but still being finished by this
    // gateway: wait for it rather than answer CONCURRENT_TRANSACTIONS.
    ctx.finishing.wait(id).await;
    let ttl = crate::transactions::id_ttl_ms(ctx);
    let (added, ()) = tokio::join!(
        ctx.storage.txn_add(id, producer, TxnItems::Groups, &groups, ttl),
        crate::transactions::schedule_backstop(ctx, id)
    );
    match added {
        Ok(TxnReply::Added {
            deadline_ms, opened, ..
        }) => match ctx.storage.txn_schedule_deadline(id, deadline_ms, opened).await {
            Ok(()) => response,
            Err(e) => response.with_error_code(coordinator_error(&e)),
        },
        Ok(refused) => response
            .with_error_code(crate::transactions::refusal(&refused, header.request_api_version, 2).code()),
        Err(e) => response.with_error_code(coordinator_error(&e)),
    }
}
