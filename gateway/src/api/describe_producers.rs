//! DescribeProducers (v0, KIP-664): the producers each partition keeps
//! state for (the append script's producer state): id, epoch, last
//! sequence, last activity, and the first offset of the producer's open
//! transaction there. Needs READ on the topic.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{
    DescribeProducersRequest, DescribeProducersResponse, ProducerId, RequestHeader,
};

use super::{Client, authorized, ensure_partition, error_code, resolve_topic};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    request: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        // An invalid name first, then the ACL (Kafka's order).
        let found = if ketch_storage::validate_topic_name(&topic.name).is_err() {
            Err(ResponseError::InvalidTopicException.code())
        } else if authorized(ctx, client, Operation::Read, ResourceType::Topic, &topic.name) {
            resolve_topic(ctx, &topic.name, false).await
        } else {
            Err(ResponseError::TopicAuthorizationFailed.code())
        };
        let mut partitions = Vec::with_capacity(topic.partition_indexes.len());
        for &index in &topic.partition_indexes {
            let answer = PartitionResponse::default().with_partition_index(index);
            let t = match &found {
                Ok(t) => ensure_partition(ctx, t.clone(), index).await,
                Err(code) => Err(*code),
            };
            let t = match t {
                Ok(t) => t,
                Err(code) => {
                    partitions.push(answer.with_error_code(code));
                    continue;
                }
            };
            match ctx.storage.producer_states(&t, index).await {
                Ok(states) => {
                    // A producer only added to a transaction here, with no
                    // batch yet (its epoch unknown, -1), is not active: Kafka
                    // keeps that verification apart from producers' state.
                    let mut producers: Vec<ProducerState> = states
                        .iter()
                        .filter(|(_, state)| state.epoch >= 0)
                        .map(|(pid, state)| producer(*pid, state))
                        .collect();
                    producers.sort_by_key(|p| p.producer_id.0);
                    partitions.push(answer.with_active_producers(producers));
                }
                Err(e) => partitions.push(answer.with_error_code(error_code(&e))),
            }
        }
        topics.push(
            TopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions),
        );
    }
    DescribeProducersResponse::default().with_topics(topics)
}

/// One producer's state as DescribeProducers reports it (decoded from
/// either encoding by `ketch_storage::decode_producer_state`).
fn producer(pid: i64, state: &ketch_storage::ProducerSummary) -> ProducerState {
    ProducerState::default()
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(state.epoch)
        .with_last_sequence(state.last_sequence)
        .with_last_timestamp(state.last_timestamp)
        .with_coordinator_epoch(-1)
        .with_current_txn_start_offset(state.txn_start)
}
