//! EndTxn (v0–v3): commits or aborts the producer's transaction. The
//! decision is written first (the commit point); then the markers and
//! offsets, and the answer once they are written. Should that fail, the
//! decision stands and the transaction's coordinator finishes it
//! (`crate::transactions::sweep`); the producer's next transaction waits
//! for it (CONCURRENT_TRANSACTIONS, retriable).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{EndTxnRequest, EndTxnResponse, RequestHeader};
use ketch_storage::TxnReply;

use super::{Client, authorized, error_code};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::transactions::{FINISH_GRACE, finish, id_ttl_ms, refusal};

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
    let producer = (request.producer_id.0, request.producer_epoch);
    let reply = ctx
        .storage
        .txn_end(id, producer, request.committed, id_ttl_ms(ctx))
        .await;
    match reply {
        Ok(TxnReply::Finish(decided)) => {
            // Should this gateway not finish it, the id's coordinator
            // will: the look is scheduled while the markers are written.
            let recheck = ketch_storage::now_ms() + FINISH_GRACE.as_millis() as i64;
            let (scheduled, finished) =
                tokio::join!(ctx.storage.txn_schedule(id, recheck), finish(ctx, id, &decided));
            if let Err(e) = scheduled {
                tracing::warn!(transactional_id = id, error = %e, "cannot schedule a look at a decided transaction");
            }
            match finished {
                Ok(()) => crate::transactions::count(if decided.commit { "commit" } else { "abort" }),
                Err(e) => tracing::warn!(transactional_id = id, error = %e,
                    "a transaction is decided but not finished; its coordinator will finish it"),
            }
            response
        }
        Ok(TxnReply::Done) => response,
        Ok(refused) => response.with_error_code(refusal(&refused, header.request_api_version, 2).code()),
        Err(e) => response.with_error_code(error_code(&e)),
    }
}
