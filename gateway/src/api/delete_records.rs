//! DeleteRecords (API key 21, versions 0–2): moves each partition's log
//! start offset forward (`-1`: to the high watermark) and drops the batches
//! wholly below it. Spec: KIP-107 (DeleteRecords).

use std::sync::Arc;

use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse, RequestHeader};
use ketch_storage::Topic;

use super::{Client, authorized, ensure_partition, error_code, resolve_topic};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

/// Kafka's `DeleteRecordsResponse.INVALID_LOW_WATERMARK`, sent with every error.
const INVALID_LOW_WATERMARK: i64 = -1;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    req: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let topics = super::each(
        merged(req.topics)
            .into_iter()
            .map(|topic| delete_in_topic(ctx, client, topic)),
    )
    .await;
    DeleteRecordsResponse::default().with_topics(topics)
}

/// One entry per topic and partition, the last one named, as Kafka reads
/// the request into a map (`KafkaApis.handleDeleteRecordsRequest`): two
/// offsets for one partition deleted up to the later-named one, not the
/// larger, and answered once.
fn merged(topics: Vec<DeleteRecordsTopic>) -> Vec<DeleteRecordsTopic> {
    let mut out: Vec<DeleteRecordsTopic> = Vec::with_capacity(topics.len());
    for topic in topics {
        match out.iter_mut().find(|t| t.name == topic.name) {
            Some(seen) => seen.partitions.extend(topic.partitions),
            None => out.push(topic),
        }
    }
    for topic in &mut out {
        let mut partitions: Vec<DeleteRecordsPartition> = Vec::with_capacity(topic.partitions.len());
        for p in topic.partitions.drain(..) {
            match partitions
                .iter_mut()
                .find(|q| q.partition_index == p.partition_index)
            {
                Some(seen) => *seen = p,
                None => partitions.push(p),
            }
        }
        topic.partitions = partitions;
    }
    out
}

async fn delete_in_topic(
    ctx: &Context,
    client: &Client,
    request: DeleteRecordsTopic,
) -> DeleteRecordsTopicResult {
    let topic = if authorized(ctx, client, Operation::Delete, ResourceType::Topic, &request.name) {
        resolve_topic(ctx, &request.name, false).await
    } else {
        Err(kafka_protocol::error::ResponseError::TopicAuthorizationFailed.code())
    };
    let partitions = request
        .partitions
        .into_iter()
        .map(|p| delete_in_partition(ctx, topic.clone(), p));
    let partitions = super::each(partitions).await;
    DeleteRecordsTopicResult::default()
        .with_name(request.name)
        .with_partitions(partitions)
}

async fn delete_in_partition(
    ctx: &Context,
    topic: Result<Arc<Topic>, i16>,
    request: DeleteRecordsPartition,
) -> DeleteRecordsPartitionResult {
    let result = DeleteRecordsPartitionResult::default().with_partition_index(request.partition_index);
    match truncate(ctx, topic, &request).await {
        Ok(low_watermark) => result.with_low_watermark(low_watermark),
        Err(code) => result
            .with_low_watermark(INVALID_LOW_WATERMARK)
            .with_error_code(code),
    }
}

/// The partition's new low watermark.
async fn truncate(
    ctx: &Context,
    topic: Result<Arc<Topic>, i16>,
    request: &DeleteRecordsPartition,
) -> Result<i64, i16> {
    let partition = request.partition_index;
    let topic = ensure_partition(ctx, topic?, partition).await?;
    // As Kafka: records go only from a topic whose cleanup.policy deletes
    // (a compacted topic keeps every key's latest record).
    let defaults = ctx.topic_defaults.get();
    if !ketch_config::topic::Configs::new(&topic.configs, &defaults).cleans_up_by("delete") {
        return Err(kafka_protocol::error::ResponseError::PolicyViolation.code());
    }
    ctx.storage
        .delete_records(&topic, partition, request.offset)
        .await
        .map_err(|e| match e {
            // The replicas did not confirm the new log start in time: Kafka's
            // DelayedDeleteRecords expires with REQUEST_TIMED_OUT (the
            // deletion stands on the leader).
            ketch_storage::StorageError::NotEnoughReplicasAfterAppend { .. } => {
                kafka_protocol::error::ResponseError::RequestTimedOut.code()
            }
            e => error_code(&e),
        })
}
