//! EndTxn (v0–v3): commits or aborts the producer's transaction. The
//! decision is the commit point: as Kafka's coordinator does, EndTxn
//! answers once it is written (and, with acks=all waiting for replicas, as
//! durable as an acks=all batch), and the markers and offsets are written
//! afterwards, in the background (`crate::transactions::Finishing`). The
//! producer's next request for the id on this gateway waits for them; on
//! another gateway it meets CONCURRENT_TRANSACTIONS (retriable) until they
//! are written. Should this gateway fail to finish, the decision stands
//! and the id's coordinator finishes it (`crate::transactions::sweep`).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{EndTxnRequest, EndTxnResponse, RequestHeader};
use ketch_storage::TxnReply;

use super::{Client, authorized};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::transactions::{FINISH_GRACE, coordinator_error, id_ttl_ms, refusal};

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: EndTxnRequest,
) -> EndTxnResponse {
    let response = EndTxnResponse::default();
    let id = request.transactional_id.0.as_str();
    if !authorized(ctx, client, Operation::Write, ResourceType::TransactionalId, id) {
        return response.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    // Kafka's coordinator refuses the empty transactional id.
    if id.is_empty() {
        return response.with_error_code(ResponseError::InvalidRequest.code());
    }
    // A retry while this gateway still finishes the decision: answered
    // once it is finished.
    ctx.finishing.wait(id).await;
    let producer = (request.producer_id.0, request.producer_epoch);
    // Should the decision be left unfinished, the id's coordinator looks
    // at it after the grace: scheduled beside the decision, for an id
    // listed already (a look at an id with nothing decided only
    // reschedules it), and again by the finish.
    let recheck = ketch_storage::now_ms() + FINISH_GRACE.as_millis() as i64;
    let (reply, scheduled) = tokio::join!(
        ctx.storage
            .txn_end(id, producer, request.committed, id_ttl_ms(ctx)),
        ctx.storage.txn_schedule_if_listed(id, recheck)
    );
    match reply {
        Ok(TxnReply::Finish(decided)) => {
            if let Err(e) = scheduled {
                tracing::warn!(transactional_id = id, error = %e, "cannot schedule a look at a decided transaction");
            }
            ctx.finishing.start(ctx, id, decided, recheck);
            response
        }
        Ok(TxnReply::Done) => response,
        Ok(refused) => response.with_error_code(refusal(&refused, header.request_api_version, 2).code()),
        Err(e) => response.with_error_code(coordinator_error(&e)),
    }
}
