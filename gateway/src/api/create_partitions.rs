//! CreatePartitions (API key 37, versions 0–3): grows topics to a larger
//! partition count. A manual assignment names one live broker per new
//! partition (a ketch partition has one logical replica, in Redis). Added
//! partitions count against the client's controller mutation quota
//! (KIP-599; v3+ may be refused with THROTTLING_QUOTA_EXCEEDED).
//! Spec: KIP-195 (CreatePartitions).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse, RequestHeader};
use ketch_config::TopicsSettings;
use ketch_storage::StorageError;

use super::create_topics::{Failure, assignable_brokers, check_single_replica, count_mutation, unique_by};
use super::{Client, authorized, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::quotas::MutationQuota;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let validate_only = req.validate_only;
    let client_id = header.client_id.as_deref().unwrap_or("");
    let quota = &ctx.quotas.mutations(
        Some(ctx.storage.as_ref()),
        &client.principal,
        client_id,
        header.request_api_version >= 3,
    );
    let topics = unique_by(req.topics, |t| t.name.clone());
    let results = super::each(topics.into_iter().map(|(name, topic)| async move {
        let outcome = match topic {
            Some(topic) if !authorized(ctx, client, Operation::Alter, ResourceType::Topic, &topic.name) => {
                Err(Failure::new(
                    ResponseError::TopicAuthorizationFailed,
                    "Authorization failed.",
                ))
            }
            Some(topic) => grow(ctx, client, &topic, validate_only, quota).await,
            None => Err(Failure::duplicate("name")),
        };
        let result = CreatePartitionsTopicResult::default().with_name(name);
        match outcome {
            Ok(()) => result,
            Err(failure) => result
                .with_error_code(failure.code)
                .with_error_message(failure.message.map(str_bytes)),
        }
    }))
    .await;
    CreatePartitionsResponse::default()
        .with_results(results)
        .with_throttle_time_ms(quota.throttle_time_ms())
}

async fn grow(
    ctx: &Context,
    client: &Client,
    request: &CreatePartitionsTopic,
    validate_only: bool,
    quota: &MutationQuota<'_>,
) -> Result<(), Failure> {
    let name = request.name.as_str();
    let mut counted = false;
    let mut attempt = 0;
    loop {
        attempt += 1;
        // Read fresh, not cached: storage replaces the record only if it is
        // unchanged.
        let topic = match ctx.storage.topic_fresh(name).await {
            Ok(Some(topic)) => topic,
            Ok(None) => {
                return Err(Failure::new(
                    ResponseError::UnknownTopicOrPartition,
                    format!("The topic '{name}' does not exist."),
                ));
            }
            Err(e) => return Err(Failure::storage(&e)),
        };
        check(
            &ctx.settings.topics,
            &assignable_brokers(ctx, &client.listener),
            topic.partitions(),
            request,
        )?;
        if validate_only {
            return Ok(());
        }
        if !counted {
            count_mutation(quota, request.count - topic.partitions()).await?;
            counted = true;
        }
        match ctx.storage.add_partitions(&topic, request.count).await {
            Ok(_) => break,
            // The record changed meanwhile (a config change, or another
            // CreatePartitions, through another gateway): read it again and
            // check again, as Kafka's controller takes them one at a time
            // (the second of two to the same count is INVALID_PARTITIONS).
            Err(StorageError::Conflict(_)) if attempt < MAX_ATTEMPTS => {
                tokio::time::sleep(std::time::Duration::from_millis(5 * attempt as u64)).await;
            }
            // Still changing: a timeout, as Kafka's controller answers a
            // request it could not finish in time (not the storage's code,
            // which would read as missing replicas). So is another
            // gateway's growth that held the lock too long (`Busy`).
            Err(StorageError::Conflict(why)) => {
                return Err(Failure::new(
                    ResponseError::RequestTimedOut,
                    format!("Topic {name} could not grow: {why}; try again."),
                ));
            }
            Err(e) => return Err(Failure::storage(&e)),
        }
    }
    tracing::info!(topic = name, partitions = request.count, "added partitions");
    Ok(())
}

/// Reads and changes of a topic that keeps changing under a CreatePartitions
/// before it gives up.
const MAX_ATTEMPTS: usize = 10;

/// Whether a topic with `current` partitions may grow as `request` asks;
/// a manual assignment may name `brokers`.
fn check(
    settings: &TopicsSettings,
    brokers: &[i32],
    current: i32,
    request: &CreatePartitionsTopic,
) -> Result<(), Failure> {
    let count = request.count;
    let invalid = |message: String| Err(Failure::new(ResponseError::InvalidPartitions, message));
    if count < current {
        return invalid(format!(
            "Topic currently has {current} partitions, which is higher than the requested {count}."
        ));
    }
    if count == current {
        return invalid(format!("Topic already has {current} partitions."));
    }
    if count > settings.max_partitions {
        return invalid(format!(
            "Number of partitions {count} exceeds the limit of {} (topics.max_partitions).",
            settings.max_partitions
        ));
    }
    let Some(assignments) = &request.assignments else {
        return Ok(());
    };
    let added = count - current;
    let invalid_assignment =
        |message: String| Err(Failure::new(ResponseError::InvalidReplicaAssignment, message));
    if assignments.len() != added as usize {
        return invalid_assignment(format!(
            "Attempted to add {added} additional partition(s), but only {} assignment(s) were specified.",
            assignments.len()
        ));
    }
    assignments
        .iter()
        .zip(current..)
        .try_for_each(|(a, partition)| check_single_replica(brokers, partition, &a.broker_ids))
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsAssignment;
    use kafka_protocol::messages::{BrokerId, TopicName};

    use super::*;

    fn request(count: i32, assignments: Option<Vec<&[i32]>>) -> CreatePartitionsTopic {
        let assignment = |brokers: &[i32]| {
            CreatePartitionsAssignment::default()
                .with_broker_ids(brokers.iter().map(|&b| BrokerId(b)).collect())
        };
        CreatePartitionsTopic::default()
            .with_name(TopicName(str_bytes("t")))
            .with_count(count)
            .with_assignments(assignments.map(|a| a.into_iter().map(assignment).collect()))
    }

    fn code(result: Result<(), Failure>) -> i16 {
        result.expect_err("should fail").code
    }

    #[test]
    fn the_count_must_grow_within_the_limit() {
        let settings = TopicsSettings {
            max_partitions: 8,
            ..TopicsSettings::default()
        };
        let shrink = check(&settings, &[0], 3, &request(2, None)).unwrap_err();
        assert_eq!(shrink.code, ResponseError::InvalidPartitions.code());
        assert_eq!(
            shrink.message.as_deref(),
            Some("Topic currently has 3 partitions, which is higher than the requested 2.")
        );
        assert_eq!(
            code(check(&settings, &[0], 3, &request(3, None))),
            ResponseError::InvalidPartitions.code()
        );
        assert_eq!(
            code(check(&settings, &[0], 3, &request(9, None))),
            ResponseError::InvalidPartitions.code()
        );
        assert_eq!(check(&settings, &[0], 3, &request(8, None)), Ok(()));
    }

    #[test]
    fn assignments_cover_each_new_partition_and_name_one_live_broker() {
        let settings = TopicsSettings::default();
        let live = [4, 5];
        assert_eq!(
            check(&settings, &live, 1, &request(3, Some(vec![&[4], &[5]]))),
            Ok(())
        );
        let invalid = ResponseError::InvalidReplicaAssignment.code();
        assert_eq!(
            code(check(&settings, &live, 1, &request(3, Some(vec![&[4]])))),
            invalid
        );
        let unknown = check(&settings, &live, 1, &request(3, Some(vec![&[4], &[6]]))).unwrap_err();
        assert_eq!(unknown.code, invalid);
        assert!(
            unknown.message.as_deref().unwrap().contains("broker 6,"),
            "{unknown:?}"
        );
        assert_eq!(
            code(check(&settings, &live, 1, &request(3, Some(vec![&[4], &[4, 5]])))),
            invalid
        );
    }
}
