//! DescribeTransactions (v0, KIP-664): the coordinator's state of each
//! transactional id asked for — state, timeout, start of the open
//! transaction, producer id and epoch, and its partitions.

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, ProducerId, RequestHeader, TopicName,
};

use super::{Client, authorized, error_code, str_bytes};
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
        let fields = match ctx.storage.txn_describe(&id).await {
            Ok(fields) if fields.is_empty() => {
                states.push(state.with_error_code(ResponseError::TransactionalIdNotFound.code()));
                continue;
            }
            Ok(fields) => fields,
            Err(e) => {
                states.push(state.with_error_code(error_code(&e)));
                continue;
            }
        };
        let int = |name: &str| fields.get(name).and_then(|v| v.parse::<i64>().ok());
        let name = fields.get("state").cloned().unwrap_or_default();
        let open = name == "Ongoing" || name.starts_with("Prepare");
        let partitions: Vec<(String, i32)> = fields
            .get("partitions")
            .and_then(|p| serde_json::from_str(p).ok())
            .unwrap_or_default();
        let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (topic, partition) in partitions {
            topics.entry(topic).or_default().push(partition);
        }
        states.push(
            state
                .with_transaction_state(str_bytes(name))
                .with_transaction_timeout_ms(int("timeout_ms").unwrap_or(0) as i32)
                .with_transaction_start_time_ms(if open { int("started_ms").unwrap_or(-1) } else { -1 })
                .with_producer_id(ProducerId(int("pid").unwrap_or(-1)))
                .with_producer_epoch(int("epoch").unwrap_or(-1) as i16)
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
