//! CreateTopics (API key 19, versions 2–7): checks each topic as a Kafka
//! controller would, then creates it in the topic registry. New partitions
//! count against the client's controller mutation quota (KIP-599; v6+
//! refuse a topic with THROTTLING_QUOTA_EXCEEDED once it is spent).
//! Spec: KIP-4 (admin requests), KIP-464 (`-1` defaults), KIP-525 (configs in the response).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, CreateTopicsResponse, RequestHeader, TopicName,
};
use ketch_config::TopicsSettings;
use ketch_config::topic::Defaults;
use ketch_storage::StorageError;
use uuid::Uuid;

use super::describe_configs::topic_configs;
use super::{Client, authorized, cluster_authorized};
use super::{error_code, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};
use crate::quotas::MutationQuota;

/// A per-topic failure: the Kafka error code and the message sent with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub code: i16,
    pub message: Option<String>,
}

impl Failure {
    pub(crate) fn new(error: ResponseError, message: impl Into<String>) -> Self {
        Self {
            code: error.code(),
            message: Some(message.into()),
        }
    }

    /// A topic change (creation, growth, deletion) Redis did not answer
    /// is REQUEST_TIMED_OUT, as Kafka's controller answers a change it
    /// could not commit in time: Kafka Streams' and Kafka Connect's topic
    /// set-up retry it (a TimeoutException to the admin client), where
    /// KAFKA_STORAGE_ERROR stops their start. The change may have been made
    /// (the reply was lost): the retry then finds it (TOPIC_ALREADY_EXISTS).
    pub(crate) fn storage(e: &StorageError) -> Self {
        match e {
            StorageError::Unavailable(_) => Self::new(
                ResponseError::RequestTimedOut,
                format!("{e}; the change may have been made, a retry finds out"),
            ),
            e => Self {
                code: error_code(e),
                message: Some(e.to_string()),
            },
        }
    }

    pub(crate) fn duplicate(what: &str) -> Self {
        Self::new(ResponseError::InvalidRequest, format!("Duplicate topic {what}."))
    }

    /// The client's controller mutation quota is spent (KIP-599).
    pub(crate) fn throttled() -> Self {
        Self::new(
            ResponseError::ThrottlingQuotaExceeded,
            "The throttling quota has been exceeded.",
        )
    }
}

/// Records a topic's partition changes against the request's controller
/// mutation quota; refused (strict versions) once the quota is spent.
pub(crate) async fn count_mutation(quota: &MutationQuota<'_>, partitions: i32) -> Result<(), Failure> {
    quota.record(partitions).await.map_err(|_| Failure::throttled())
}

/// The request's items in order, one per key: a key given more than once
/// maps to `None`, which Kafka answers once with INVALID_REQUEST.
pub(crate) fn unique_by<T, K: Eq + Hash + Clone>(
    items: Vec<T>,
    key: impl Fn(&T) -> K,
) -> Vec<(K, Option<T>)> {
    let mut out: Vec<(K, Option<T>)> = Vec::with_capacity(items.len());
    let mut position: HashMap<K, usize> = HashMap::new();
    for item in items {
        let k = key(&item);
        match position.get(&k) {
            Some(&i) => out[i].1 = None,
            None => {
                position.insert(k.clone(), out.len());
                out.push((k, Some(item)));
            }
        }
    }
    out
}

/// The name of KRaft's metadata log, which Kafka never lets a client
/// create as a topic.
pub(crate) const CLUSTER_METADATA_TOPIC: &str = "__cluster_metadata";

/// A topic that passed every check.
struct Created {
    id: Uuid,
    partitions: i32,
    configs: BTreeMap<String, String>,
}

pub async fn handle(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    req: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let version = header.request_api_version;
    let validate_only = req.validate_only;
    let topics = unique_by(req.topics, |t| t.name.clone());
    // CREATE on the cluster allows every topic; otherwise CREATE on each.
    let on_cluster = cluster_authorized(ctx, client, Operation::Create);
    let client_id = header.client_id.as_deref().unwrap_or("");
    let quota = &ctx.quotas.mutations(
        Some(ctx.storage.as_ref()),
        &client.principal,
        client_id,
        version >= 6,
    );
    let results = super::each(topics.into_iter().map(|(name, topic)| async move {
        let outcome = match topic {
            // Kafka's controller refuses its own log's name, before it
            // authorizes (`ControllerApis.createTopics`).
            Some(topic) if topic.name.as_str() == CLUSTER_METADATA_TOPIC => Err(Failure::new(
                ResponseError::InvalidRequest,
                format!("Creation of internal topic {CLUSTER_METADATA_TOPIC} is prohibited."),
            )),
            Some(topic)
                if !on_cluster
                    && !authorized(ctx, client, Operation::Create, ResourceType::Topic, &topic.name) =>
            {
                Err(Failure::new(
                    ResponseError::TopicAuthorizationFailed,
                    "Authorization failed.",
                ))
            }
            Some(topic) => create(ctx, client, topic, validate_only, quota).await,
            None => Err(Failure::duplicate("name")),
        };
        // The created topic's configs only for a client that may read them.
        let topic = name.to_string();
        let describable = move || {
            authorized(
                ctx,
                client,
                Operation::DescribeConfigs,
                ResourceType::Topic,
                &topic,
            )
        };
        topic_result(&ctx.topic_defaults.get(), version, name, outcome, describable)
    }))
    .await;
    CreateTopicsResponse::default()
        .with_topics(results)
        .with_throttle_time_ms(quota.throttle_time_ms())
}

async fn create(
    ctx: &Context,
    client: &Client,
    topic: CreatableTopic,
    validate_only: bool,
    quota: &MutationQuota<'_>,
) -> Result<Created, Failure> {
    let name = topic.name.as_str();
    ketch_storage::validate_topic_name(name)
        .map_err(|m| Failure::new(ResponseError::InvalidTopicException, m))?;
    // Read fresh, not cached: a topic another gateway just deleted may be re-created.
    // Existence is checked first, as Kafka does, so "create unless it exists"
    // callers get TOPIC_ALREADY_EXISTS whatever else their request says.
    match ctx.storage.topic_fresh(name).await {
        Ok(None) => {}
        Ok(Some(_)) => return Err(already_exists(name)),
        Err(e) => return Err(Failure::storage(&e)),
    }
    // The configs first, then the partitions and replicas, as Kafka's
    // controller checks them (`ReplicationControlManager.createTopics`).
    let configs = overrides(&topic.configs, &ctx.topic_defaults.get())?;
    let partitions = partition_count(
        &ctx.settings.topics,
        &assignable_brokers(ctx, &client.listener),
        &topic,
    )?;
    if validate_only {
        // The collision the creation would find (storage checks it
        // atomically then), reported whether or not it is only validated,
        // as Kafka does.
        if name.contains(['.', '_']) {
            let wanted = name.replace('.', "_");
            let topics = ctx.storage.all_topics().await.map_err(|e| Failure::storage(&e))?;
            if let Some(existing) = topics.iter().find(|t| t.name.replace('.', "_") == wanted) {
                return Err(collides(name, &existing.name));
            }
        }
        return Ok(Created {
            id: Uuid::nil(),
            partitions,
            configs,
        });
    }
    count_mutation(quota, partitions).await?;
    match ctx.storage.create_topic(name, partitions, configs).await {
        Ok(created) => {
            tracing::info!(topic = name, partitions, "created topic");
            Ok(Created {
                id: created.id,
                partitions,
                configs: created.configs.clone(),
            })
        }
        Err(StorageError::TopicExists) => Err(already_exists(name)),
        Err(StorageError::TopicCollides(existing)) => Err(collides(name, &existing)),
        Err(e) => Err(Failure::storage(&e)),
    }
}

/// Kafka's refusal of a name equal to `existing` once `.` and `_` are taken
/// for the same character.
fn collides(name: &str, existing: &str) -> Failure {
    Failure::new(
        ResponseError::InvalidTopicException,
        format!("Topic '{name}' collides with existing topic: {existing}"),
    )
}

fn already_exists(name: &str) -> Failure {
    Failure::new(
        ResponseError::TopicAlreadyExists,
        format!("Topic '{name}' already exists."),
    )
}

/// The partition count a topic asks for, from `num_partitions` or from a
/// manual assignment, which may name one of `brokers` per partition.
fn partition_count(
    settings: &TopicsSettings,
    brokers: &[i32],
    topic: &CreatableTopic,
) -> Result<i32, Failure> {
    let count = if topic.assignments.is_empty() {
        if topic.replication_factor != -1 && topic.replication_factor != 1 {
            return Err(Failure::new(
                ResponseError::InvalidReplicationFactor,
                "ketch stores data in Redis; replication factor must be 1 or -1",
            ));
        }
        match topic.num_partitions {
            -1 => settings.default_partitions,
            n if n < 1 => {
                return Err(Failure::new(
                    ResponseError::InvalidPartitions,
                    "Number of partitions was set to an invalid non-positive value.",
                ));
            }
            n => n,
        }
    } else {
        check_assignments(brokers, topic)?;
        topic.assignments.len() as i32
    };
    if count > settings.max_partitions {
        return Err(Failure::new(
            ResponseError::InvalidPartitions,
            format!(
                "Number of partitions {count} exceeds the limit of {} (topics.max_partitions).",
                settings.max_partitions
            ),
        ));
    }
    Ok(count)
}

fn check_assignments(brokers: &[i32], topic: &CreatableTopic) -> Result<(), Failure> {
    for (field, value) in [
        ("numPartitions", topic.num_partitions),
        ("replicationFactor", topic.replication_factor.into()),
    ] {
        if value != -1 {
            return Err(Failure::new(
                ResponseError::InvalidRequest,
                format!("A manual partition assignment was specified, but {field} was not set to -1."),
            ));
        }
    }
    let mut indexes: Vec<i32> = topic.assignments.iter().map(|a| a.partition_index).collect();
    indexes.sort_unstable();
    if indexes
        .iter()
        .zip(0..)
        .any(|(&index, expected)| index != expected)
    {
        return Err(Failure::new(
            ResponseError::InvalidReplicaAssignment,
            "partitions should be a consecutive 0-based integer sequence",
        ));
    }
    topic
        .assignments
        .iter()
        .try_for_each(|a| check_single_replica(brokers, a.partition_index, &a.broker_ids))
}

/// The broker ids a manual assignment may name: those clients of
/// `listener` see — every live gateway, or the one broker a load balancer
/// in front of them presents. Empty until this gateway has a node id.
pub(crate) fn assignable_brokers(ctx: &Context, listener: &str) -> Vec<i32> {
    ctx.membership.brokers(listener).iter().map(|b| b.id).collect()
}

/// Kafka's checks of a manual replica list: not empty, every broker one
/// of `brokers`, none twice.
pub(crate) fn check_replica_list(brokers: &[i32], replicas: &[BrokerId]) -> Result<(), Failure> {
    let invalid = |message: String| Err(Failure::new(ResponseError::InvalidReplicaAssignment, message));
    if replicas.is_empty() {
        return invalid("The manual partition assignment includes an empty replica list.".to_owned());
    }
    let mut sorted: Vec<i32> = replicas.iter().map(|b| **b).collect();
    sorted.sort_unstable();
    if let Some(unknown) = sorted.iter().find(|b| !brokers.contains(b)) {
        return invalid(format!(
            "The manual partition assignment includes broker {unknown}, but no such broker is registered \
             (live brokers: {brokers:?})."
        ));
    }
    match sorted.windows(2).find(|pair| pair[0] == pair[1]) {
        Some(pair) => invalid(format!(
            "The manual partition assignment includes the broker {} more than once.",
            pair[0]
        )),
        None => Ok(()),
    }
}

/// The replica list of a partition being created: Kafka's checks, and one
/// replica, since a ketch partition has one logical replica (its data is
/// in Redis). Where the partition's data goes is storage's choice either
/// way; the broker named leads it only as long as Metadata says so.
pub(crate) fn check_single_replica(
    brokers: &[i32],
    partition: i32,
    replicas: &[BrokerId],
) -> Result<(), Failure> {
    check_replica_list(brokers, replicas)?;
    if replicas.len() > 1 {
        return Err(Failure::new(
            ResponseError::InvalidReplicaAssignment,
            format!(
                "ketch keeps one replica of each partition (its data is in Redis); partition {partition} \
                 lists {} brokers {:?}",
                replicas.len(),
                replicas.iter().map(|b| **b).collect::<Vec<_>>()
            ),
        ));
    }
    Ok(())
}

/// The requested config overrides, validated and normalized.
fn overrides(
    configs: &[CreatableTopicConfig],
    defaults: &Defaults,
) -> Result<BTreeMap<String, String>, Failure> {
    let pairs = configs
        .iter()
        .map(|c| match &c.value {
            Some(value) => Ok((c.name.as_str(), value.as_str())),
            None => Err(Failure::new(
                ResponseError::InvalidConfig,
                format!("Null value not supported for topic configs: {}", c.name.as_str()),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    ketch_config::topic::validate_topic_configs(pairs, defaults)
        .map_err(|m| Failure::new(ResponseError::InvalidConfig, m))
}

fn topic_result(
    defaults: &Defaults,
    version: i16,
    name: TopicName,
    outcome: Result<Created, Failure>,
    describable: impl FnOnce() -> bool,
) -> CreatableTopicResult {
    let result = CreatableTopicResult::default().with_name(name);
    let created = match outcome {
        Ok(created) => created,
        Err(failure) => {
            return result
                .with_error_code(failure.code)
                .with_error_message(failure.message.map(str_bytes));
        }
    };
    let result = result.with_topic_id(created.id).with_error_message(None);
    if version < 5 {
        return result;
    }
    if !describable() {
        // As Kafka: created, but its configs, partition count and
        // replication factor withheld.
        return result.with_topic_config_error_code(ResponseError::TopicAuthorizationFailed.code());
    }
    let configs = topic_configs(defaults, &created.configs)
        .into_iter()
        .map(|config| {
            let current = config.current();
            CreatableTopicConfigs::default()
                .with_name(str_bytes(config.name))
                .with_value(Some(str_bytes(current.value.clone())))
                .with_read_only(config.read_only)
                .with_config_source(current.source)
                .with_is_sensitive(false)
        });
    result
        .with_num_partitions(created.partitions)
        .with_replication_factor(1)
        .with_configs(Some(configs.collect()))
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::create_topics_request::CreatableReplicaAssignment;

    use super::*;

    fn topic(num_partitions: i32, replication_factor: i16) -> CreatableTopic {
        CreatableTopic::default()
            .with_name(TopicName(str_bytes("t")))
            .with_num_partitions(num_partitions)
            .with_replication_factor(replication_factor)
    }

    fn assigned(index: i32, brokers: &[i32]) -> CreatableReplicaAssignment {
        CreatableReplicaAssignment::default()
            .with_partition_index(index)
            .with_broker_ids(brokers.iter().map(|&b| BrokerId(b)).collect())
    }

    fn code(result: Result<i32, Failure>) -> i16 {
        result.expect_err("should fail").code
    }

    #[test]
    fn minus_one_means_the_default_partition_count() {
        let settings = TopicsSettings {
            default_partitions: 3,
            ..TopicsSettings::default()
        };
        assert_eq!(partition_count(&settings, &[0], &topic(-1, -1)), Ok(3));
        assert_eq!(partition_count(&settings, &[0], &topic(5, 1)), Ok(5));
    }

    #[test]
    fn partition_count_must_be_positive_and_within_the_limit() {
        let settings = TopicsSettings {
            max_partitions: 10,
            ..TopicsSettings::default()
        };
        let invalid = ResponseError::InvalidPartitions.code();
        assert_eq!(code(partition_count(&settings, &[0], &topic(0, 1))), invalid);
        assert_eq!(code(partition_count(&settings, &[0], &topic(-2, 1))), invalid);
        assert_eq!(code(partition_count(&settings, &[0], &topic(11, 1))), invalid);
        assert_eq!(partition_count(&settings, &[0], &topic(10, 1)), Ok(10));
    }

    #[test]
    fn replication_factor_must_be_one_or_default() {
        let settings = TopicsSettings::default();
        let failure = partition_count(&settings, &[0], &topic(1, 3)).unwrap_err();
        assert_eq!(failure.code, ResponseError::InvalidReplicationFactor.code());
        assert!(failure.message.unwrap().contains("Redis"));
        assert_eq!(code(partition_count(&settings, &[0], &topic(1, 0))), failure.code);
    }

    #[test]
    fn manual_assignments_set_the_count_and_name_one_live_broker_each() {
        let settings = TopicsSettings::default();
        let live = [7, 8];
        let good = topic(-1, -1).with_assignments(vec![assigned(1, &[8]), assigned(0, &[7])]);
        assert_eq!(partition_count(&settings, &live, &good), Ok(2));
        let invalid = ResponseError::InvalidReplicaAssignment.code();
        let unknown_broker = topic(-1, -1).with_assignments(vec![assigned(0, &[9])]);
        let failure = partition_count(&settings, &live, &unknown_broker).unwrap_err();
        assert_eq!(failure.code, invalid);
        assert!(
            failure.message.as_deref().unwrap().contains("broker 9,"),
            "{failure:?}"
        );
        for replicas in [&[7, 7][..], &[7, 8], &[]] {
            let t = topic(-1, -1).with_assignments(vec![assigned(0, replicas)]);
            assert_eq!(
                code(partition_count(&settings, &live, &t)),
                invalid,
                "{replicas:?}"
            );
        }
        let gap = topic(-1, -1).with_assignments(vec![assigned(0, &[7]), assigned(2, &[7])]);
        assert_eq!(code(partition_count(&settings, &live, &gap)), invalid);
        let twice = topic(-1, -1).with_assignments(vec![assigned(0, &[7]), assigned(0, &[7])]);
        assert_eq!(code(partition_count(&settings, &live, &twice)), invalid);
    }

    #[test]
    fn manual_assignments_require_minus_one_counts() {
        let settings = TopicsSettings::default();
        for (partitions, factor) in [(1, -1), (-1, 1)] {
            let t = topic(partitions, factor).with_assignments(vec![assigned(0, &[0])]);
            assert_eq!(
                code(partition_count(&settings, &[0], &t)),
                ResponseError::InvalidRequest.code()
            );
        }
    }

    #[test]
    fn configs_are_validated_and_null_values_refused() {
        let config = |name: &'static str, value: Option<&'static str>| {
            CreatableTopicConfig::default()
                .with_name(str_bytes(name))
                .with_value(value.map(str_bytes))
        };
        let defaults = Defaults::default();
        let ok = overrides(&[config("retention.ms", Some("1000"))], &defaults).unwrap();
        assert_eq!(ok.get("retention.ms").map(String::as_str), Some("1000"));
        for bad in [config("retention.ms", None), config("no.such.config", Some("1"))] {
            assert_eq!(
                overrides(&[bad], &defaults).unwrap_err().code,
                ResponseError::InvalidConfig.code()
            );
        }
    }

    #[test]
    fn results_encode_in_every_supported_version() {
        use bytes::BytesMut;
        use kafka_protocol::protocol::Encodable;

        let defaults = Defaults::default();
        for version in 2..=7 {
            let created = Created {
                id: Uuid::new_v4(),
                partitions: 3,
                configs: BTreeMap::new(),
            };
            let results = vec![
                topic_result(&defaults, version, TopicName(str_bytes("a")), Ok(created), || {
                    true
                }),
                topic_result(
                    &defaults,
                    version,
                    TopicName(str_bytes("b")),
                    Err(Failure::duplicate("name")),
                    || true,
                ),
            ];
            let response = CreateTopicsResponse::default().with_topics(results);
            assert!(
                response.encode(&mut BytesMut::new(), version).is_ok(),
                "version {version}"
            );
        }
    }

    #[test]
    fn a_client_that_may_not_describe_configs_is_not_shown_them() {
        let created = Created {
            id: Uuid::new_v4(),
            partitions: 3,
            configs: BTreeMap::new(),
        };
        let result = topic_result(
            &Defaults::default(),
            5,
            TopicName(str_bytes("a")),
            Ok(created),
            || false,
        );
        assert_eq!(result.error_code, 0, "the topic was created");
        assert_eq!(
            result.topic_config_error_code,
            ResponseError::TopicAuthorizationFailed.code()
        );
        assert_eq!((result.num_partitions, result.replication_factor), (-1, -1));
        assert!(result.configs.unwrap_or_default().is_empty());
    }

    #[test]
    fn v5_results_describe_the_created_topic() {
        let overrides = BTreeMap::from([("retention.ms".to_owned(), "1000".to_owned())]);
        let created = Created {
            id: Uuid::new_v4(),
            partitions: 3,
            configs: overrides,
        };
        let result = topic_result(
            &Defaults::default(),
            5,
            TopicName(str_bytes("a")),
            Ok(created),
            || true,
        );
        assert_eq!(
            (
                result.error_code,
                result.num_partitions,
                result.replication_factor
            ),
            (0, 3, 1)
        );
        let configs = result.configs.unwrap();
        assert_eq!(configs.len(), ketch_config::topic::TOPIC_CONFIGS.len());
        let retention = configs
            .iter()
            .find(|c| c.name.as_str() == "retention.ms")
            .unwrap();
        assert_eq!(
            (retention.value.as_deref(), retention.config_source),
            (Some("1000"), 1)
        );
    }

    #[test]
    fn a_name_given_twice_is_answered_once_without_its_topic() {
        let unique = unique_by(vec![("a", 1), ("b", 2), ("a", 3)], |(name, _)| *name);
        assert_eq!(unique, vec![("a", None), ("b", Some(("b", 2)))]);
    }
}
