//! TxnOffsetCommit (v0–v3): offsets a transactional producer commits for a
//! consumer group inside its transaction (`send_offsets_to_transaction`).
//! Handled by the group's coordinator (forwarded there like OffsetCommit),
//! which checks the member and generation a v3 request names (KIP-447),
//! and the transaction: open, of this producer and epoch, with the group
//! added (AddOffsetsToTxn). The offsets are staged and become the group's
//! committed offsets only when the transaction commits.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{RequestHeader, TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use ketch_storage::{CommittedOffset, Decided, StagingTxn, TopicPartition};

use super::{Client, authorized};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::transactions::coordinator_error;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let group = request.group_id.0.to_string();
    // The transactional id's ACL first, then the group's (Kafka's order).
    let refused = if !may_write(ctx, client, &request) {
        Some(ResponseError::TransactionalIdAuthorizationFailed.code())
    } else {
        match super::elsewhere(ctx, client, header, (Operation::Read, &group), &request).await {
            None => check(ctx, header, &request, &group).await.err(),
            Some(Ok(answer)) => return answer,
            Some(Err(code)) => Some(code),
        }
    };
    let mut codes: Vec<Vec<i16>> = Vec::with_capacity(request.topics.len());
    let mut accepted: Vec<(TopicPartition, CommittedOffset)> = Vec::new();
    let mut positions = Vec::new();
    for topic in &request.topics {
        let known = super::offset_commit::topic_partitions(ctx, client, refused, &topic.name).await;
        let mut topic_codes = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let refused = super::offset_commit::refusal(
                ctx,
                known.map(|(partitions, _)| partitions),
                p.partition_index,
                refused,
                p.committed_metadata.as_deref(),
            );
            let code = refused.unwrap_or_else(|| {
                positions.push((codes.len(), topic_codes.len()));
                accepted.push((
                    (topic.name.0.to_string(), p.partition_index),
                    CommittedOffset::new(
                        p.committed_offset,
                        p.committed_leader_epoch,
                        p.committed_metadata.as_ref().map(|m| m.to_string()),
                    )
                    .of_topic(known.ok().map(|(_, id)| id)),
                ));
                0
            });
            topic_codes.push(code);
        }
        codes.push(topic_codes);
    }
    if refused.is_none()
        && let Err(code) = stage(ctx, &request, &group, &accepted).await
    {
        for (t, p) in positions {
            codes[t][p] = code;
        }
    }
    TxnOffsetCommitResponse::default().with_topics(
        request
            .topics
            .iter()
            .zip(codes)
            .map(|(topic, codes)| {
                TxnOffsetCommitResponseTopic::default()
                    .with_name(topic.name.clone())
                    .with_partitions(
                        topic
                            .partitions
                            .iter()
                            .zip(codes)
                            .map(|(p, code)| {
                                TxnOffsetCommitResponsePartition::default()
                                    .with_partition_index(p.partition_index)
                                    .with_error_code(code)
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
}

/// WRITE on the request's transactional id.
fn may_write(ctx: &Context, client: &Client, request: &TxnOffsetCommitRequest) -> bool {
    authorized(
        ctx,
        client,
        Operation::Write,
        ResourceType::TransactionalId,
        &request.transactional_id,
    )
}

/// The checks before anything is staged, once the ACLs passed: the member
/// and generation (v3), and that the transaction takes offsets for this
/// group.
async fn check(
    ctx: &Context,
    header: &RequestHeader,
    request: &TxnOffsetCommitRequest,
    group: &str,
) -> Result<(), i16> {
    if !crate::transactions::transactional_group(group) {
        return Err(ResponseError::InvalidGroupId.code());
    }
    // A member is validated when the request names one by any of its
    // three fields (`ClassicGroup.validateOffsetCommit`): a static member
    // whose generation was reset still names its instance id (KIP-447).
    let names_a_member =
        request.generation_id >= 0 || !request.member_id.is_empty() || request.group_instance_id.is_some();
    if header.request_api_version >= 3 && names_a_member {
        ctx.groups
            .validate_offset_commit(
                group,
                &request.member_id,
                request.group_instance_id.as_ref(),
                request.generation_id,
                None,
            )
            .await?;
    }
    transaction_number(ctx, request, group).await.map(|_| ())
}

/// The number of the open transaction the request's offsets belong to.
async fn transaction_number(
    ctx: &Context,
    request: &TxnOffsetCommitRequest,
    group: &str,
) -> Result<i64, i16> {
    let state = ctx
        .storage
        .txn_describe(&request.transactional_id)
        .await
        .map_err(|e| coordinator_error(&e))?;
    number_of(state, request, group)
}

/// The number of the open transaction `state` says the request's offsets
/// belong to, or why they do not.
fn number_of(
    state: Option<ketch_storage::TxnState>,
    request: &TxnOffsetCommitRequest,
    group: &str,
) -> Result<i64, i16> {
    let Some(state) = state.filter(|s| s.producer_id == request.producer_id.0) else {
        return Err(ResponseError::InvalidProducerIdMapping.code());
    };
    // INVALID_PRODUCER_EPOCH, not PRODUCER_FENCED: Kafka's transaction
    // verification answers a TxnOffsetCommit so ("producers expect to
    // handle INVALID_PRODUCER_EPOCH in this scenario",
    // AddPartitionsToTxnManager), and librdkafka takes it as fatal (a
    // fenced producer) where PRODUCER_FENCED here is only abortable.
    if state.epoch != request.producer_epoch {
        return Err(ResponseError::InvalidProducerEpoch.code());
    }
    if state.state != "Ongoing" || !state.groups.iter().any(|g| g == group) {
        return Err(ResponseError::InvalidTxnState.code());
    }
    Ok(state.number)
}

/// Stages the offsets under the transaction's number. Should the
/// transaction have been decided meanwhile (its finish could not see
/// them), they are dropped again and the request refused.
async fn stage(
    ctx: &Context,
    request: &TxnOffsetCommitRequest,
    group: &str,
    offsets: &[(TopicPartition, CommittedOffset)],
) -> Result<(), i16> {
    let number = transaction_number(ctx, request, group).await?;
    let pid = request.producer_id.0;
    let transaction = StagingTxn {
        transactional_id: &request.transactional_id,
        producer_id: pid,
        number,
    };
    ctx.storage
        .stage_txn_offsets(group, &transaction, offsets)
        .await
        .map_err(|e| coordinator_error(&e))?;
    // The re-check could not read the transaction (Redis failing, its
    // master failing over): nothing says it was decided. Answered as Kafka
    // answers a write it could not make (retriable); the offsets stay
    // staged and the client's retry stages them again. INVALID_TXN_STATE
    // is fatal to the Java producer and to librdkafka.
    let state = ctx
        .storage
        .txn_describe(&request.transactional_id)
        .await
        .map_err(|e| coordinator_error(&e))?;
    match number_of(state, request, group) {
        Ok(n) if n == number => Ok(()),
        Ok(_) | Err(_) => {
            let dropped = Decided {
                producer_id: pid,
                epoch: request.producer_epoch,
                number,
                commit: false,
                partitions: Vec::new(),
                groups: Vec::new(),
            };
            if let Err(e) = ctx
                .storage
                .apply_txn_offsets(group, &dropped, ctx.settings.groups.offsets_retention.get())
                .await
            {
                tracing::warn!(group, error = %e, "cannot drop offsets staged for a transaction decided meanwhile");
            }
            Err(ResponseError::InvalidTxnState.code())
        }
    }
}
