//! AddPartitionsToTxn (v0–v3, the client's form; v4+ is the brokers'
//! verification form, which ketch does not need): adds partitions to the
//! producer's transaction, opening one if none is, then tells each
//! partition, so that it takes the producer's transactional batches
//! (KIP-890's server-side check: a transactional batch for a partition not
//! added is INVALID_TXN_STATE).
//!
//! As in Kafka, when any partition is refused (unknown, not authorised) the
//! others are OPERATION_NOT_ATTEMPTED and nothing is added.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, RequestHeader};
use ketch_storage::{JoinReply, TxnItems, TxnReply};

use super::{Client, authorized, ensure_partition, resolve_topic};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::transactions::coordinator_error;

/// The first version whose clients know PRODUCER_FENCED.
const FENCED_FROM: i16 = 2;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let version = header.request_api_version;
    let id = request.v3_and_below_transactional_id.0.to_string();
    let producer = (
        request.v3_and_below_producer_id.0,
        request.v3_and_below_producer_epoch,
    );
    let topics = &request.v3_and_below_topics;
    let answer = |codes: Vec<Vec<i16>>| {
        AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(
            topics
                .iter()
                .zip(codes)
                .map(|(topic, codes)| {
                    AddPartitionsToTxnTopicResult::default()
                        .with_name(topic.name.clone())
                        .with_results_by_partition(
                            topic
                                .partitions
                                .iter()
                                .zip(codes)
                                .map(|(p, code)| {
                                    AddPartitionsToTxnPartitionResult::default()
                                        .with_partition_index(*p)
                                        .with_partition_error_code(code)
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    };
    let all = |code: i16| {
        topics
            .iter()
            .map(|t| vec![code; t.partitions.len()])
            .collect::<Vec<_>>()
    };
    if !authorized(ctx, client, Operation::Write, ResourceType::TransactionalId, &id) {
        return answer(all(ResponseError::TransactionalIdAuthorizationFailed.code()));
    }
    // Each partition: its topic, or why it is refused.
    let mut resolved = Vec::with_capacity(topics.len());
    let mut any_refused = false;
    for topic in topics {
        let found = if !authorized(ctx, client, Operation::Write, ResourceType::Topic, &topic.name) {
            Err(ResponseError::TopicAuthorizationFailed.code())
        } else {
            resolve_topic(ctx, &topic.name, false).await
        };
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for &p in &topic.partitions {
            let t = match &found {
                Ok(t) => ensure_partition(ctx, t.clone(), p).await,
                Err(code) => Err(*code),
            };
            any_refused |= t.is_err();
            partitions.push(t);
        }
        resolved.push(partitions);
    }
    if any_refused {
        let codes = resolved
            .iter()
            .map(|ps| {
                ps.iter()
                    .map(|t| {
                        t.as_ref()
                            .err()
                            .copied()
                            .unwrap_or(ResponseError::OperationNotAttempted.code())
                    })
                    .collect()
            })
            .collect();
        return answer(codes);
    }
    // Kafka's coordinator refuses the empty id (after the checks above).
    if id.is_empty() {
        return answer(all(ResponseError::InvalidRequest.code()));
    }
    let items: Vec<(String, i32)> = topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.0.to_string(), *p)))
        .collect();
    let items = serde_json::to_value(&items).expect("partitions serialize");
    // The previous transaction, answered but still being finished by this
    // gateway: wait for it rather than answer CONCURRENT_TRANSACTIONS.
    ctx.finishing.wait(&id).await;
    let ttl = crate::transactions::id_ttl_ms(ctx);
    let (added, ()) = tokio::join!(
        ctx.storage
            .txn_add(&id, producer, TxnItems::Partitions, &items, ttl),
        crate::transactions::schedule_backstop(ctx, &id)
    );
    let (number, deadline, opened) = match added {
        Ok(TxnReply::Added {
            number,
            deadline_ms,
            opened,
        }) => (number, deadline_ms, opened),
        Ok(refused) => {
            let code = crate::transactions::refusal(&refused, version, FENCED_FROM).code();
            return answer(all(code));
        }
        Err(e) => return answer(all(coordinator_error(&e))),
    };
    let mut joins = Vec::with_capacity(items.as_array().map_or(0, Vec::len));
    for (ps, topic) in resolved.into_iter().zip(topics) {
        for (t, &p) in ps.into_iter().zip(&topic.partitions) {
            let t = t.expect("every partition resolved");
            joins.push(join(ctx, t, p, producer, number, version));
        }
    }
    // The transaction's timeout is scheduled while the partitions are told.
    let (scheduled, codes) = tokio::join!(
        ctx.storage.txn_schedule_deadline(&id, deadline, opened),
        super::each(joins)
    );
    if let Err(e) = scheduled {
        return answer(all(coordinator_error(&e)));
    }
    let mut codes = codes.into_iter();
    answer(
        topics
            .iter()
            .map(|t| codes.by_ref().take(t.partitions.len()).collect())
            .collect(),
    )
}

/// Tells one partition of the transaction; its error code.
async fn join(
    ctx: &Context,
    topic: std::sync::Arc<ketch_storage::Topic>,
    partition: i32,
    producer: (i64, i16),
    number: i64,
    version: i16,
) -> i16 {
    match ctx.storage.txn_join(&topic, partition, producer, number).await {
        Ok(JoinReply::Joined) => 0,
        Ok(JoinReply::NoPartition) => ResponseError::UnknownTopicOrPartition.code(),
        Ok(JoinReply::StaleEpoch) if version >= FENCED_FROM => ResponseError::ProducerFenced.code(),
        Ok(JoinReply::StaleEpoch) => ResponseError::InvalidProducerEpoch.code(),
        Ok(JoinReply::Pending) => ResponseError::ConcurrentTransactions.code(),
        Ok(JoinReply::Ended) => ResponseError::InvalidTxnState.code(),
        Err(e) => coordinator_error(&e),
    }
}
