//! ListTransactions (v0–v1, KIP-664): the transactional ids this gateway
//! coordinates (every id in `ketch:transactions` when clients see the
//! gateways as one broker), with their producer id and state, filtered by
//! state, producer id and (v1) how long the open transaction has run. Ids
//! the client may not DESCRIBE are left out, as Kafka does.

use kafka_protocol::messages::list_transactions_response::TransactionState;
use kafka_protocol::messages::{
    ListTransactionsRequest, ListTransactionsResponse, ProducerId, RequestHeader, TransactionalId,
};

use super::{Client, authorized, error_code, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use ketch_storage::StorageError;

/// The states of Kafka's TransactionState.
pub const STATES: &[&str] = &[
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
];

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let response = ListTransactionsResponse::default();
    let unknown: Vec<_> = request
        .state_filters
        .iter()
        .filter(|s| !STATES.contains(&s.as_str()))
        .cloned()
        .collect();
    let ids = match ctx.storage.txn_ids().await {
        Ok(ids) => ids,
        Err(e) => return response.with_error_code(listing_error(&e)),
    };
    let longer_than =
        (header.request_api_version >= 1 && request.duration_filter >= 0).then_some(request.duration_filter);
    let now = ketch_storage::now_ms();
    // Admin clients ask every broker and put the answers together: each
    // gateway lists the ids it coordinates. Behind a load balancer the
    // client sees one broker, which lists those of every gateway behind
    // that address (the state is in Redis), not those of gateways the
    // listener advertises at addresses of their own: the client asks them.
    let mut listed: std::collections::HashSet<i32> = ctx
        .membership
        .sharing_my_address(&client.listener)
        .iter()
        .map(|n| n.id)
        .collect();
    listed.insert(ctx.membership.my_id());
    let ids: Vec<String> = ids
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| {
            listed.contains(&ctx.membership.transaction_coordinator(id).id)
                && authorized(
                    ctx,
                    client,
                    Operation::Describe,
                    ResourceType::TransactionalId,
                    id,
                )
        })
        .collect();
    let described = match ctx.storage.txn_describe_many(&ids).await {
        Ok(described) => described,
        Err(e) => return response.with_error_code(listing_error(&e)),
    };
    let mut states = Vec::new();
    for (id, txn) in ids.into_iter().zip(described) {
        let Some(txn) = txn else { continue };
        let pid = txn.producer_id;
        if !request.state_filters.is_empty() && !request.state_filters.iter().any(|s| s.as_str() == txn.state)
        {
            continue;
        }
        if !request.producer_id_filters.is_empty() && !request.producer_id_filters.iter().any(|p| p.0 == pid)
        {
            continue;
        }
        // Longer than the filter, as Kafka lists them (not one that has
        // run exactly that long); only open transactions have run at all
        // (Kafka also lists other states then, from their last start).
        if let Some(min) = longer_than
            && (!txn.is_open() || txn.started_ms.is_none_or(|s| now - s <= min))
        {
            continue;
        }
        states.push(
            TransactionState::default()
                .with_transactional_id(TransactionalId(str_bytes(id)))
                .with_producer_id(ProducerId(pid))
                .with_transaction_state(str_bytes(txn.state)),
        );
    }
    response
        .with_unknown_state_filters(unknown)
        .with_transaction_states(states)
}

/// A listing Redis cannot answer now: COORDINATOR_LOAD_IN_PROGRESS, the
/// one error Kafka's admin client retries a ListTransactions for
/// (`ListTransactionsHandler`); other storage errors as everywhere.
fn listing_error(e: &StorageError) -> i16 {
    match e {
        StorageError::Unavailable(_) => {
            kafka_protocol::error::ResponseError::CoordinatorLoadInProgress.code()
        }
        _ => error_code(e),
    }
}
