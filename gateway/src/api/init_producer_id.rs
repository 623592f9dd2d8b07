//! InitProducerId (v0–v5) for idempotent and transactional producers
//! (KIP-98; KIP-360 lets a producer recover after an error). Ids come from
//! a Redis counter shared by all gateways; each partition checks a
//! producer's epoch and sequences in the append script. An idempotent
//! producer always gets a new id. With a transactional id, the
//! coordinator's state in Redis decides (`crate::transactions`): a new
//! instance bumps the id's epoch (a transaction still open is aborted
//! first, fencing the producer that opened it), and a producer naming its
//! current epoch bumps it too, as Kafka's TransactionMetadata does.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId, RequestHeader};

use ketch_storage::TxnReply;

use super::{Client, cluster_authorized};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::transactions::coordinator_error;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let response = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    // Authorization first, then the request's checks, as Kafka orders them.
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
    if !producer_named_whole(&request) {
        return response.with_error_code(ResponseError::InvalidRequest.code());
    }
    // As in Kafka, an idempotent producer always gets a new id, also when
    // it names its old one (KIP-360, after an error): an id is never
    // handed to a client that merely names it, so no client can take over
    // another producer's sequences or transactions by naming its id.
    // A failure is COORDINATOR_LOAD_IN_PROGRESS, as Kafka's producer id
    // manager answers one (retried as it is): the Java producer answered
    // COORDINATOR_NOT_AVAILABLE looks up a transaction coordinator, for a
    // transactional id an idempotent producer does not have.
    match ctx.storage.new_producer_id().await {
        Ok(id) => response.with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Err(e) => response.with_error_code(match coordinator_error(&e) {
            code if code == ResponseError::CoordinatorNotAvailable.code() => {
                ResponseError::CoordinatorLoadInProgress.code()
            }
            code => code,
        }),
    }
}

/// KIP-360: a producer id and epoch come together or not at all.
fn producer_named_whole(request: &InitProducerIdRequest) -> bool {
    (request.producer_id.0 < 0) == (request.producer_epoch < 0)
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
    if !super::authorized(ctx, client, Operation::Write, ResourceType::TransactionalId, id) {
        return response.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    if id.is_empty() || !producer_named_whole(request) {
        return response.with_error_code(ResponseError::InvalidRequest.code());
    }
    let max = ctx.settings.transactions.max_timeout.get().as_millis();
    let timeout = request.transaction_timeout_ms;
    if timeout <= 0 || timeout as u128 > max {
        return response.with_error_code(ResponseError::InvalidTransactionTimeout.code());
    }
    let ttl = crate::transactions::id_ttl_ms(ctx);
    ctx.finishing.wait(id).await;
    let named = (request.producer_id.0, request.producer_epoch);
    let mut fresh = -1;
    for _ in 0..INIT_ATTEMPTS {
        let reply = match ctx
            .storage
            .txn_init(id, i64::from(timeout), fresh, named, ttl)
            .await
        {
            Ok(reply) => reply,
            Err(e) => return response.with_error_code(coordinator_error(&e)),
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
                Err(e) => return response.with_error_code(coordinator_error(&e)),
            },
            TxnReply::Finish(decided) => {
                tracing::info!(
                    transactional_id = id,
                    producer_id = decided.producer_id,
                    "a new producer instance aborts the open transaction of the previous one and fences it"
                );
                if let Err(e) = crate::transactions::finish(
                    ctx.storage.as_ref(),
                    crate::transactions::Kept::of(ctx),
                    id,
                    &decided,
                )
                .await
                {
                    tracing::info!(transactional_id = id, error = %e, "cannot finish the fenced transaction yet");
                    return response.with_error_code(ResponseError::ConcurrentTransactions.code());
                }
                crate::transactions::count("fenced");
                continue;
            }
            TxnReply::Concurrent => ResponseError::ConcurrentTransactions,
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
