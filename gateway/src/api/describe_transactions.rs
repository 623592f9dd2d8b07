//! DescribeTransactions (v0, KIP-664): the coordinator's state of each
//! transactional id asked for — state, timeout, start of the latest
//! transaction, producer id and epoch, and its partitions (of the topics
//! the client may describe).

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, ProducerId, RequestHeader, TopicName,
};

use super::{Client, authorized, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut states = Vec::with_capacity(request.transactional_ids.len());
    for id in request.transactional_ids {
        let state = TransactionState::default()
            .with_transactional_id(id.clone())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
            .with_transaction_start_time_ms(-1);
        if !authorized(
            ctx,
            client,
            Operation::Describe,
            ResourceType::TransactionalId,
            &id,
        ) {
            states.push(state.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code()));
            continue;
        }
        // Kafka's coordinator refuses the empty transactional id.
        if id.is_empty() {
            states.push(state.with_error_code(ResponseError::InvalidRequest.code()));
            continue;
        }
        let txn = match ctx.storage.txn_describe(&id).await {
            Ok(None) => {
                states.push(state.with_error_code(ResponseError::TransactionalIdNotFound.code()));
                continue;
            }
            Ok(Some(txn)) => txn,
            // Retried by the admin client (a Redis failover), as Kafka's
            // coordinator answers while its log cannot be read.
            Err(e) => {
                states.push(state.with_error_code(crate::transactions::coordinator_error(&e)));
                continue;
            }
        };
        // Kept once the transaction is decided (Kafka's
        // `txnStartTimestamp`); none in Empty.
        let started = if txn.state == "Empty" {
            -1
        } else {
            txn.started_ms.unwrap_or(-1)
        };
        let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (topic, partition) in txn.partitions {
            topics.entry(topic).or_default().push(partition);
        }
        // As Kafka: the topics the client may not describe are left out.
        topics.retain(|topic, _| authorized(ctx, client, Operation::Describe, ResourceType::Topic, topic));
        states.push(
            state
                .with_transaction_state(str_bytes(txn.state))
                .with_transaction_timeout_ms(i32::try_from(txn.timeout_ms).unwrap_or(i32::MAX))
                .with_transaction_start_time_ms(started)
                .with_producer_id(ProducerId(txn.producer_id))
                .with_producer_epoch(txn.epoch)
                .with_topics(
                    topics
                        .into_iter()
                        .map(|(topic, partitions)| {
                            TopicData::default()
                                .with_topic(TopicName(str_bytes(topic)))
                                .with_partitions(partitions)
                        })
                        .collect(),
                ),
        );
    }
    DescribeTransactionsResponse::default().with_transaction_states(states)
}
