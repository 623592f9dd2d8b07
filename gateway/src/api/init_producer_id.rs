//! InitProducerId (v0–v5) for idempotent and transactional producers
//! (KIP-98; KIP-360 lets a producer bump its epoch after an error). Ids come
//! from a Redis counter shared by all gateways; each partition checks a
//! producer's epoch and sequences in the append script. With a
//! transactional id, the coordinator's state in Redis decides
//! (`crate::transactions`): each call bumps the id's epoch, and a
//! transaction still open is aborted first, fencing the producer that
//! opened it.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId, RequestHeader};

use ketch_storage::TxnReply;

use super::{Client, cluster_authorized, error_code};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let response = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    if let Some(id) = request.transactional_id.as_deref() {
        return transactional(ctx, client, header, id, &request, response).await;
    }
    // An idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE
    // on some topic (KIP-679).
    let acls = &ctx.security.acls;
    if acls.enabled()
        && !cluster_authorized(ctx, client, Operation::IdempotentWrite)
        && !acls.authorize_any(
            &client.principal,
            &client.peer.ip().to_string(),
            Operation::Write,
            ResourceType::Topic,
        )
    {
        return response.with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    // KIP-360: an idempotent producer that hit an error bumps its epoch,
    // keeping its id while the epoch has room.
    if request.producer_id.0 >= 0 && request.producer_epoch >= 0 && request.producer_epoch < i16::MAX - 1 {
        return response
            .with_producer_id(request.producer_id)
            .with_producer_epoch(request.producer_epoch + 1);
    }
    match ctx.storage.new_producer_id().await {
        Ok(id) => response.with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Err(e) => response.with_error_code(error_code(&e)),
    }
}

/// Attempts at InitProducerId's script: a fresh producer id, then the
/// abort of an open transaction, may each need one more.
const INIT_ATTEMPTS: usize = 4;

async fn transactional(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    id: &str,
    request: &InitProducerIdRequest,
    response: InitProducerIdResponse,
) -> InitProducerIdResponse {
    if id.is_empty() {
        return response.with_error_code(ResponseError::InvalidRequest.code());
    }
    if !super::authorized(ctx, client, Operation::Write, ResourceType::TransactionalId, id) {
        return response.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    let max = ctx.settings.transactions.max_timeout.get().as_millis();
    let timeout = request.transaction_timeout_ms;
    if timeout <= 0 || timeout as u128 > max {
        return response.with_error_code(ResponseError::InvalidTransactionTimeout.code());
    }
    let ttl = crate::transactions::id_ttl_ms(ctx);
    let named = (request.producer_id.0, request.producer_epoch);
    let mut fresh = -1;
    for _ in 0..INIT_ATTEMPTS {
        let reply = match ctx
            .storage
            .txn_init(id, i64::from(timeout), fresh, named, ttl)
            .await
        {
            Ok(reply) => reply,
            Err(e) => return response.with_error_code(error_code(&e)),
        };
        let refused = match reply {
            TxnReply::Producer { producer_id, epoch } => {
                tracing::debug!(
                    transactional_id = id,
                    producer_id,
                    epoch,
                    "transactional producer initialised"
                );
                return response
                    .with_producer_id(ProducerId(producer_id))
                    .with_producer_epoch(epoch);
            }
            TxnReply::NeedProducerId => match ctx.storage.new_producer_id().await {
                Ok(pid) => {
                    fresh = pid;
                    continue;
                }
                Err(e) => return response.with_error_code(error_code(&e)),
            },
            TxnReply::Finish(decided) => {
                tracing::info!(
                    transactional_id = id,
                    producer_id = decided.producer_id,
                    "a new producer instance aborts the open transaction of the previous one and fences it"
                );
                if let Err(e) = crate::transactions::finish(ctx, id, &decided).await {
                    tracing::info!(transactional_id = id, error = %e, "cannot finish the fenced transaction yet");
                    return response.with_error_code(ResponseError::ConcurrentTransactions.code());
                }
                crate::transactions::count("fenced");
                continue;
            }
            TxnReply::Concurrent => ResponseError::ConcurrentTransactions,
            TxnReply::Mapping => ResponseError::InvalidProducerIdMapping,
            TxnReply::Fenced => fenced(header.request_api_version),
            _ => ResponseError::UnknownServerError,
        };
        return response.with_error_code(refused.code());
    }
    response.with_error_code(ResponseError::ConcurrentTransactions.code())
}

/// The error of a fenced producer: PRODUCER_FENCED from InitProducerId v4
/// (KIP-588), INVALID_PRODUCER_EPOCH before.
fn fenced(version: i16) -> ResponseError {
    if version >= 4 {
        ResponseError::ProducerFenced
    } else {
        ResponseError::InvalidProducerEpoch
    }
}
