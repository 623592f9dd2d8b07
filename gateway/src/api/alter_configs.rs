//! AlterConfigs (API key 33, versions 0–2) and IncrementalAlterConfigs
//! (API key 44, versions 0–1): change a topic's config overrides, or the
//! cluster-wide defaults of the topic configs (the default broker resource).
//! Spec: KIP-133 (AlterConfigs), KIP-339 (IncrementalAlterConfigs: SET,
//! DELETE, APPEND, SUBTRACT). Semantics follow Kafka's ConfigAdminManager
//! and ConfigurationControlManager: the legacy API replaces every override
//! of a resource, the incremental one edits them; each resource succeeds or
//! fails whole; `validate_only` checks without storing.
//!
//! A topic's overrides live in its registry record (`ketch:topics`), changed
//! by compare-and-set, so two gateways altering one topic at once both land
//! or one retries. Every gateway reads a topic record again once its cached
//! copy is older than the topic cache's lifetime (half a second), so a change
//! takes effect everywhere within that: produce reads `max.message.bytes`
//! and `message.timestamp.*` from the record, the storage worker reads
//! retention, segment and remote storage settings on its next tick.
//!
//! The broker configs that default topic configs (`log.retention.ms`,
//! `log.cleanup.policy`, `message.max.bytes`…; Kafka's dynamic log configs)
//! are altered on the default broker resource (empty name, `kafka-configs.sh
//! --entity-default`): stored in Redis by compare-and-set on their version
//! and announced to every gateway (crate::cluster_configs). A change that
//! would make an existing topic's configs invalid together (a compacting
//! default under a remote storage topic…) is refused naming the topic.
//! Setting them for one broker id is refused: every gateway serves every
//! partition, so a per-gateway default would depend on which gateway's
//! storage worker holds the partition. ketch's other broker settings are read
//! from its configuration at start; altering them is refused naming them.

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse, RequestHeader, alter_configs_response,
    incremental_alter_configs_response,
};
use kafka_protocol::protocol::StrBytes;
use ketch_config::topic::{self, ConfigDef, ConfigType, Configs, Defaults};
use ketch_storage::StorageError;

use super::{Client, authorized, cluster_authorized, error_code, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const RESOURCE_BROKER_LOGGER: i8 = 8;

/// IncrementalAlterConfigs operation codes (`AlterConfigOp.OpType`).
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// Why a resource was not altered: a Kafka error code and message.
type Failure = (i16, String);

fn failure(error: ResponseError, message: impl Into<String>) -> Failure {
    (error.code(), message.into())
}

/// One requested change of a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Set(String),
    Delete,
    Append(String),
    Subtract(String),
}

/// How a resource's overrides change: all replaced (AlterConfigs), or
/// edited one config at a time (IncrementalAlterConfigs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Alteration {
    Replace(BTreeMap<String, String>),
    Edit(Vec<(String, Change)>),
}

impl Alteration {
    /// The names this alteration touches, for the audit line.
    fn describe(&self) -> String {
        match self {
            Alteration::Replace(all) => format!("replace all with {all:?}"),
            Alteration::Edit(changes) => format!("{changes:?}"),
        }
    }

    /// The values after this alteration of `current`, not yet validated:
    /// `known` finds the topic config a name sets (else it is refused with
    /// `unknown`'s message), `fallback` is the value a list config without
    /// an entry in `current` has (what APPEND and SUBTRACT start from).
    fn edited(
        &self,
        current: &BTreeMap<String, String>,
        known: impl Fn(&str) -> Option<&'static ConfigDef>,
        unknown: impl Fn(&str) -> Failure,
        fallback: impl Fn(&ConfigDef) -> String,
    ) -> Result<BTreeMap<String, String>, Failure> {
        let invalid = |m: String| failure(ResponseError::InvalidConfig, m);
        let mut next = match self {
            Alteration::Replace(all) => all.clone(),
            Alteration::Edit(_) => current.clone(),
        };
        if let Alteration::Edit(changes) = self {
            for (name, change) in changes {
                // Deleting a name that is not a config deletes nothing
                // (Kafka validates the configs left, not the names deleted).
                if *change == Change::Delete && known(name).is_none() {
                    next.remove(name);
                    continue;
                }
                let def = known(name).ok_or_else(|| unknown(name))?;
                let items = |next: &BTreeMap<String, String>| -> Vec<String> {
                    let value = next.get(name).cloned().unwrap_or_else(|| fallback(def));
                    topic::list_items(&value).into_iter().map(str::to_owned).collect()
                };
                match change {
                    Change::Set(value) => {
                        next.insert(name.clone(), value.clone());
                    }
                    Change::Delete => {
                        next.remove(name);
                    }
                    Change::Append(_) | Change::Subtract(_) if def.kind != ConfigType::List => {
                        let verb = if matches!(change, Change::Append(_)) {
                            "append"
                        } else {
                            "subtract"
                        };
                        return Err(invalid(format!(
                            "Config value {verb} is not allowed for config key: {name}"
                        )));
                    }
                    Change::Append(value) => {
                        let mut items = items(&next);
                        for item in topic::list_items(value) {
                            if !items.iter().any(|i| i == item) {
                                items.push(item.to_owned());
                            }
                        }
                        next.insert(name.clone(), items.join(","));
                    }
                    Change::Subtract(value) => {
                        let gone = topic::list_items(value);
                        let mut items = items(&next);
                        items.retain(|i| !gone.contains(&i.as_str()));
                        next.insert(name.clone(), items.join(","));
                    }
                }
            }
        }
        Ok(next)
    }

    /// A topic's overrides after this alteration of `current`, validated
    /// alone and together (over `defaults`) as Kafka validates them.
    pub fn apply(
        &self,
        current: &BTreeMap<String, String>,
        defaults: &Defaults,
    ) -> Result<BTreeMap<String, String>, Failure> {
        let invalid = |m: String| failure(ResponseError::InvalidConfig, m);
        let next = self.edited(
            current,
            topic::topic_config,
            |name| invalid(format!("Unknown topic config name: {name}")),
            |def| defaults.value(def.name).to_owned(),
        )?;
        let mut validated = BTreeMap::new();
        for (name, value) in &next {
            validated.insert(
                name.clone(),
                topic::validate_topic_config(name, value).map_err(invalid)?,
            );
        }
        topic::check_together(
            Configs::new(current, defaults),
            Configs::new(&validated, defaults),
        )
        .map_err(invalid)?;
        Ok(validated)
    }
}

/// Alters the overrides of topic `name` (or checks that it could, with
/// `validate_only`), retrying when another gateway changed the topic
/// meanwhile; logs an audit line per change.
pub async fn alter_topic(
    ctx: &Context,
    client: &Client,
    api: &str,
    name: &str,
    alteration: &Alteration,
    validate_only: bool,
) -> Result<(), Failure> {
    if name.is_empty() {
        // As Kafka's controller (`ControllerConfigurationValidator`).
        return Err(failure(
            ResponseError::InvalidRequest,
            "Default topic resources are not allowed.".to_owned(),
        ));
    }
    ketch_storage::validate_topic_name(name).map_err(|m| failure(ResponseError::InvalidTopicException, m))?;
    for _attempt in 0..5 {
        let Some(topic) = ctx
            .storage
            .topic_fresh(name)
            .await
            .map_err(|e| (error_code(&e), e.to_string()))?
        else {
            // Kafka checks the change before the topic's existence: an
            // invalid value is INVALID_CONFIG whether or not it exists.
            alteration.apply(&BTreeMap::new(), &ctx.topic_defaults.get())?;
            return Err(failure(
                ResponseError::UnknownTopicOrPartition,
                format!("Topic {name} does not exist."),
            ));
        };
        let next = alteration.apply(&topic.configs, &ctx.topic_defaults.get())?;
        if turns_remote_storage_on(&topic.configs, &next) {
            if topic.drop_archive {
                return Err(failure(
                    ResponseError::InvalidConfig,
                    format!(
                        "The archive of topic {name} is still being deleted (remote storage was turned \
                         off with remote.log.delete.on.disable=true); turn remote storage on again once \
                         it is gone."
                    ),
                ));
            }
            refuse_if_compacted(ctx, &topic, validate_only).await?;
        }
        if validate_only {
            return Ok(());
        }
        match ctx.storage.set_topic_configs(&topic, next.clone()).await {
            Ok(_) => {
                tracing::info!(target: "ketch::audit", principal = %client.principal, client = %client.peer,
                    api, topic = name, change = alteration.describe(), before = ?topic.configs,
                    after = ?next, "topic configs changed");
                return Ok(());
            }
            Err(StorageError::Conflict(_)) => continue,
            Err(e) => return Err((error_code(&e), e.to_string())),
        }
    }
    Err(failure(
        ResponseError::RequestTimedOut,
        format!("Topic {name} kept changing while its configs were altered; try again."),
    ))
}

fn turns_remote_storage_on(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> bool {
    // remote.storage.enable has no broker-level default.
    let on = |overrides: &BTreeMap<String, String>| {
        overrides.get("remote.storage.enable").map(String::as_str) == Some("true")
    };
    !on(before) && on(after)
}

/// The archiver reads sealed segments from the log stream, and a topic
/// compacted before keeps part of its records in its compacted stream
/// (docs/architecture.md §7a): remote storage is refused for it. Else any
/// compaction pass on its partitions is given up (unless `validate_only`),
/// so none swaps in after and trims the log the archiver reads; a pass
/// begun after this, before the config is written, gives itself up once
/// it sees remote storage on.
async fn refuse_if_compacted(
    ctx: &Context,
    topic: &ketch_storage::Topic,
    validate_only: bool,
) -> Result<(), Failure> {
    // Every partition checked before any pass is given up: a refused
    // request changes nothing.
    let modes: &[bool] = if validate_only { &[true] } else { &[true, false] };
    for &check in modes {
        for partition in 0..topic.partitions() {
            let ready = ctx
                .storage
                .ready_for_archive(topic, partition, check)
                .await
                .map_err(|e| (error_code(&e), e.to_string()))?;
            if !ready {
                return Err(failure(
                    ResponseError::InvalidConfig,
                    format!(
                        "Topic {} was compacted (partition {partition}); ketch cannot archive a \
                         compacted log, so remote storage cannot be turned on for it",
                        topic.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Alters the cluster-wide topic config defaults (or checks that it could,
/// with `validate_only`), retrying when another gateway changed them
/// meanwhile; logs an audit line per change.
async fn alter_cluster_defaults(
    ctx: &Context,
    client: &Client,
    api: &str,
    alteration: &Alteration,
    validate_only: bool,
) -> Result<(), Failure> {
    let invalid = |m: String| failure(ResponseError::InvalidConfig, m);
    // A value the broker configs refuse: as Kafka wraps its dynamic broker
    // config validation's ConfigException (`ConfigAdminManager.
    // validateBrokerConfigChange`, KAFKA-13609), INVALID_REQUEST.
    let refused = |m: String| failure(ResponseError::InvalidRequest, m);
    let storage_failure = |e: StorageError| (error_code(&e), e.to_string());
    let base = ctx.topic_defaults.base();
    for _attempt in 0..5 {
        let (version, current) = ctx.storage.cluster_configs().await.map_err(storage_failure)?;
        let next = alteration.edited(
            &current,
            topic::defaulted_by,
            |name| invalid(format!("Unknown dynamic broker config: {name}")),
            |def| base.value(def.name).to_owned(),
        )?;
        let mut validated = BTreeMap::new();
        for (name, value) in &next {
            let (_, value) = topic::validate_broker_default(name, value).map_err(refused)?;
            validated.insert(name.clone(), value);
        }
        let (before, after) = (base.with_cluster(&current).0, base.with_cluster(&validated).0);
        let none = BTreeMap::new();
        topic::check_together(Configs::new(&none, &before), Configs::new(&none, &after)).map_err(refused)?;
        topic::check_local_retention_defaults(Configs::new(&none, &after)).map_err(refused)?;
        for topic in ctx.storage.all_topics().await.map_err(storage_failure)? {
            topic::check_together(
                Configs::new(&topic.configs, &before),
                Configs::new(&topic.configs, &after),
            )
            .map_err(|m| refused(format!("Topic {} would be invalid: {m}", topic.name)))?;
        }
        if validate_only {
            return Ok(());
        }
        let changes: BTreeMap<String, Option<String>> = current
            .keys()
            .filter(|k| !validated.contains_key(*k))
            .map(|k| (k.clone(), None))
            .chain(
                validated
                    .iter()
                    .filter(|(k, v)| current.get(*k) != Some(*v))
                    .map(|(k, v)| (k.clone(), Some(v.clone()))),
            )
            .collect();
        if changes.is_empty() {
            return Ok(());
        }
        match ctx.storage.change_cluster_configs(version, &changes).await {
            Ok(Some(_)) => {
                tracing::info!(target: "ketch::audit", principal = %client.principal, client = %client.peer,
                    api, resource = "cluster-wide topic defaults", change = alteration.describe(),
                    before = ?current, after = ?validated, "broker configs changed");
                // This gateway applies it at once; the others on the announcement.
                if let Err(e) = crate::cluster_configs::reload(ctx).await {
                    tracing::warn!(error = %e, "cannot reload the cluster-wide topic defaults");
                }
                return Ok(());
            }
            Ok(None) => continue,
            Err(e) => return Err(storage_failure(e)),
        }
    }
    Err(failure(
        ResponseError::RequestTimedOut,
        "The cluster-wide configs kept changing while they were altered; try again.",
    ))
}

/// A resource of either API, reduced to what both need.
struct Resource {
    resource_type: i8,
    name: StrBytes,
    /// The alteration, or why the request for this resource is malformed.
    alteration: Result<Alteration, Failure>,
}

/// Kafka's per-resource preprocessing: duplicate resources and keys are
/// INVALID_REQUEST.
fn check_keys<'a>(names: impl Iterator<Item = &'a str>) -> Result<(), Failure> {
    let mut seen = HashSet::new();
    for name in names {
        if !seen.insert(name) {
            return Err(failure(
                ResponseError::InvalidRequest,
                "Error due to duplicate config keys",
            ));
        }
    }
    Ok(())
}

fn null_value(name: &str) -> Failure {
    failure(
        ResponseError::InvalidRequest,
        format!("Null value not supported for : {name}"),
    )
}

/// Alters every resource of a request, in request order.
async fn alter_all(
    ctx: &Context,
    client: &Client,
    api: &str,
    resources: Vec<Resource>,
    validate_only: bool,
) -> Vec<(i8, StrBytes, Result<(), Failure>)> {
    let mut counts: BTreeMap<(i8, StrBytes), usize> = BTreeMap::new();
    for r in &resources {
        *counts.entry((r.resource_type, r.name.clone())).or_default() += 1;
    }
    super::each(resources.into_iter().map(|r| {
        let duplicate = counts[&(r.resource_type, r.name.clone())] > 1;
        async move {
            let outcome = if duplicate {
                Err(failure(
                    ResponseError::InvalidRequest,
                    "Each resource must appear at most once.",
                ))
            } else {
                alter_one(
                    ctx,
                    client,
                    api,
                    r.resource_type,
                    r.name.as_str(),
                    r.alteration,
                    validate_only,
                )
                .await
            };
            (r.resource_type, r.name, outcome)
        }
    }))
    .await
}

async fn alter_one(
    ctx: &Context,
    client: &Client,
    api: &str,
    resource_type: i8,
    name: &str,
    alteration: Result<Alteration, Failure>,
    validate_only: bool,
) -> Result<(), Failure> {
    // Kafka's order (`ConfigAdminManager.preprocess`, then `KafkaApis`):
    // the request's own faults — duplicate keys, null values, another
    // broker's id, a broker config that cannot change — come before
    // authorization; a broker logger is authorized, then refused.
    let refused = |error: ResponseError| Err(failure(error, "Authorization failed."));
    match resource_type {
        RESOURCE_TOPIC => {
            let alteration = alteration?;
            if !authorized(ctx, client, Operation::AlterConfigs, ResourceType::Topic, name) {
                return refused(ResponseError::TopicAuthorizationFailed);
            }
            alter_topic(ctx, client, api, name, &alteration, validate_only).await
        }
        RESOURCE_BROKER_LOGGER if api == "IncrementalAlterConfigs" => {
            alteration?;
            if !cluster_authorized(ctx, client, Operation::AlterConfigs) {
                return refused(ResponseError::ClusterAuthorizationFailed);
            }
            Err(failure(
                ResponseError::InvalidRequest,
                "ketch has no broker loggers to alter (its log filter is `log.level`, read at start)",
            ))
        }
        RESOURCE_BROKER => {
            super::this_broker(ctx, &client.listener, name)
                .map_err(|m| failure(ResponseError::InvalidRequest, m))?;
            let alteration = alteration?;
            let names: Vec<&str> = match &alteration {
                Alteration::Replace(all) => all.keys().map(String::as_str).collect(),
                Alteration::Edit(changes) => changes.iter().map(|(n, _)| n.as_str()).collect(),
            };
            let fixed: Vec<&str> = names
                .iter()
                .copied()
                .filter(|n| topic::defaulted_by(n).is_none())
                .collect();
            if !fixed.is_empty() {
                return Err(failure(
                    ResponseError::InvalidRequest,
                    format!(
                        "Cannot update these configs dynamically: {}. ketch's broker settings are \
                         read from its configuration at start (docs/configuration.md); the topic \
                         defaults (log.retention.ms, log.cleanup.policy, message.max.bytes…) can be \
                         set cluster-wide on the default broker resource.",
                        fixed.join(", ")
                    ),
                ));
            }
            if !name.is_empty() && !names.is_empty() {
                return Err(failure(
                    ResponseError::InvalidRequest,
                    format!(
                        "Cannot set {} for broker {name} alone: every ketch gateway serves every \
                         partition, so topic defaults are cluster-wide. Set them on the default \
                         broker resource (an empty name; kafka-configs.sh --entity-type brokers \
                         --entity-default).",
                        names.join(", ")
                    ),
                ));
            }
            if !cluster_authorized(ctx, client, Operation::AlterConfigs) {
                return refused(ResponseError::ClusterAuthorizationFailed);
            }
            if name.is_empty() {
                alter_cluster_defaults(ctx, client, api, &alteration, validate_only).await
            } else {
                Ok(())
            }
        }
        other => Err(failure(
            ResponseError::InvalidRequest,
            format!("ketch alters topic (2) and broker (4) configs, not resource type {other}"),
        )),
    }
}

/// AlterConfigs: each resource's overrides become exactly those given.
pub async fn handle_alter(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    req: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let resources = req
        .resources
        .into_iter()
        .map(|r| {
            let alteration = check_keys(r.configs.iter().map(|c| c.name.as_str())).and_then(|()| {
                r.configs
                    .iter()
                    .map(|c| match &c.value {
                        Some(v) => Ok((c.name.to_string(), v.to_string())),
                        None => Err(null_value(&c.name)),
                    })
                    .collect::<Result<BTreeMap<_, _>, _>>()
                    .map(Alteration::Replace)
            });
            Resource {
                resource_type: r.resource_type,
                name: r.resource_name,
                alteration,
            }
        })
        .collect();
    let results = alter_all(ctx, client, "AlterConfigs", resources, req.validate_only).await;
    AlterConfigsResponse::default().with_responses(
        results
            .into_iter()
            .map(|(resource_type, name, outcome)| {
                let (code, message) = split(outcome);
                alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_error_code(code)
                    .with_error_message(message)
                    .with_resource_type(resource_type)
                    .with_resource_name(name)
            })
            .collect(),
    )
}

/// IncrementalAlterConfigs: each resource's overrides edited by SET,
/// DELETE, APPEND and SUBTRACT.
pub async fn handle_incremental(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let resources = req
        .resources
        .into_iter()
        .map(|r| {
            let alteration = check_keys(r.configs.iter().map(|c| c.name.as_str())).and_then(|()| {
                r.configs
                    .iter()
                    .map(|c| {
                        let name = c.name.to_string();
                        let value = || {
                            c.value
                                .as_ref()
                                .map(|v| v.to_string())
                                .ok_or_else(|| null_value(&name))
                        };
                        let change = match c.config_operation {
                            OP_SET => Change::Set(value()?),
                            OP_DELETE => Change::Delete,
                            OP_APPEND => Change::Append(value()?),
                            OP_SUBTRACT => Change::Subtract(value()?),
                            other => {
                                return Err(failure(
                                    ResponseError::InvalidRequest,
                                    format!("Unknown operations type {other}"),
                                ));
                            }
                        };
                        Ok((name, change))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Alteration::Edit)
            });
            Resource {
                resource_type: r.resource_type,
                name: r.resource_name,
                alteration,
            }
        })
        .collect();
    let results = alter_all(
        ctx,
        client,
        "IncrementalAlterConfigs",
        resources,
        req.validate_only,
    )
    .await;
    IncrementalAlterConfigsResponse::default().with_responses(
        results
            .into_iter()
            .map(|(resource_type, name, outcome)| {
                let (code, message) = split(outcome);
                incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_error_code(code)
                    .with_error_message(message)
                    .with_resource_type(resource_type)
                    .with_resource_name(name)
            })
            .collect(),
    )
}

fn split(outcome: Result<(), Failure>) -> (i16, Option<StrBytes>) {
    match outcome {
        Ok(()) => (0, None),
        Err((code, message)) => (code, Some(str_bytes(message))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn edit(changes: &[(&str, Change)]) -> Alteration {
        Alteration::Edit(changes.iter().map(|(n, c)| (n.to_string(), c.clone())).collect())
    }

    #[test]
    fn replace_sets_exactly_the_given_overrides() {
        let current = map(&[("retention.ms", "1000"), ("segment.ms", "50")]);
        let next = Alteration::Replace(map(&[("retention.bytes", "10")]))
            .apply(&current, &Defaults::default())
            .unwrap();
        assert_eq!(next, map(&[("retention.bytes", "10")]));
    }

    #[test]
    fn edits_set_delete_append_and_subtract() {
        let current = map(&[("retention.ms", "1000"), ("segment.ms", "50")]);
        let next = edit(&[
            ("retention.ms", Change::Delete),
            ("max.message.bytes", Change::Set("2048".into())),
            (
                "leader.replication.throttled.replicas",
                Change::Append("0:1,1:1".into()),
            ),
        ])
        .apply(&current, &Defaults::default())
        .unwrap();
        assert_eq!(
            next,
            map(&[
                ("leader.replication.throttled.replicas", "0:1,1:1"),
                ("max.message.bytes", "2048"),
                ("segment.ms", "50")
            ])
        );
        let next = edit(&[
            (
                "leader.replication.throttled.replicas",
                Change::Append("1:1,2:1".into()),
            ),
            (
                "leader.replication.throttled.replicas",
                Change::Subtract("0:1".into()),
            ),
        ])
        .apply(&next, &Defaults::default())
        .unwrap();
        assert_eq!(next["leader.replication.throttled.replicas"], "1:1,2:1");
        // APPEND to the default ("delete") of a list config.
        let policy = edit(&[("cleanup.policy", Change::Subtract("delete".into()))])
            .apply(&BTreeMap::new(), &Defaults::default())
            .unwrap();
        assert_eq!(policy["cleanup.policy"], "");
        // ... or to the cluster-wide default.
        let (defaults, _) = Defaults::default().with_cluster([("log.cleanup.policy", "compact")]);
        let policy = edit(&[("cleanup.policy", Change::Append("delete".into()))])
            .apply(&BTreeMap::new(), &defaults)
            .unwrap();
        assert_eq!(policy["cleanup.policy"], "compact,delete");
    }

    #[test]
    fn bad_edits_fail_whole_with_kafkas_messages() {
        let current = map(&[("retention.ms", "1000")]);
        let (code, message) = edit(&[("retention.ms", Change::Append("5".into()))])
            .apply(&current, &Defaults::default())
            .unwrap_err();
        assert_eq!(code, ResponseError::InvalidConfig.code());
        assert_eq!(
            message,
            "Config value append is not allowed for config key: retention.ms"
        );
        let (_, message) = edit(&[
            ("segment.ms", Change::Set("10".into())),
            ("retention.ms", Change::Set("-7".into())),
        ])
        .apply(&current, &Defaults::default())
        .unwrap_err();
        assert!(message.contains("retention.ms"), "{message}");
        let (_, message) = edit(&[("no.such", Change::Set("1".into()))])
            .apply(&current, &Defaults::default())
            .unwrap_err();
        assert_eq!(message, "Unknown topic config name: no.such");
        // Deleting a name that is no config is no change (as in Kafka).
        let unchanged = edit(&[("no.such", Change::Delete)])
            .apply(&current, &Defaults::default())
            .unwrap();
        assert_eq!(unchanged, current);
        // Remote storage is turned off only with its archive deleted.
        let remote = map(&[("remote.storage.enable", "true")]);
        let (_, message) = edit(&[("remote.storage.enable", Change::Delete)])
            .apply(&remote, &Defaults::default())
            .unwrap_err();
        assert!(message.contains("invalid to disable remote storage"), "{message}");
        let off = edit(&[
            ("remote.storage.enable", Change::Set("false".into())),
            ("remote.log.delete.on.disable", Change::Set("true".into())),
        ])
        .apply(&remote, &Defaults::default())
        .unwrap();
        assert_eq!(off["remote.storage.enable"], "false");
    }

    #[test]
    fn duplicate_keys_are_an_invalid_request() {
        assert!(check_keys(["a", "b"].into_iter()).is_ok());
        let (code, message) = check_keys(["a", "b", "a"].into_iter()).unwrap_err();
        assert_eq!(code, ResponseError::InvalidRequest.code());
        assert_eq!(message, "Error due to duplicate config keys");
    }
}
