//! DescribeConfigs (API key 32, versions 1–4): a topic's configs (override
//! or default, with their source), this gateway's broker configs, and the
//! cluster-wide defaults set at run time (the default broker resource).
//! Spec: KIP-133 (DescribeConfigs), KIP-226 (synonyms), KIP-569 (types, docs).

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse, RequestHeader};
use ketch_config::topic::{ConfigDef, DefaultSource, Defaults, Effect, TOPIC_CONFIGS};

use super::{Client, authorized, cluster_authorized, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

/// Kafka's `ConfigResource.Type` codes ketch answers for.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const RESOURCE_BROKER_LOGGER: i8 = 8;

/// Kafka's `ConfigSource` codes.
pub const DYNAMIC_TOPIC_CONFIG: i8 = 1;
pub const DYNAMIC_DEFAULT_BROKER_CONFIG: i8 = 3;
pub const STATIC_BROKER_CONFIG: i8 = 4;
pub const DEFAULT_CONFIG: i8 = 5;

/// Kafka's `ConfigType` codes of the broker configs below.
const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;

/// A value a config takes and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synonym {
    pub name: &'static str,
    pub value: String,
    pub source: i8,
}

/// One config as DescribeConfigs (and CreateTopics v5+) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedConfig {
    pub name: &'static str,
    pub read_only: bool,
    pub config_type: i8,
    pub doc: String,
    /// The value in effect first, then the defaults it overrides, as
    /// Kafka lists synonyms (KIP-226).
    pub synonyms: Vec<Synonym>,
}

impl ReportedConfig {
    /// The value in effect.
    pub fn current(&self) -> &Synonym {
        &self.synonyms[0]
    }
}

/// The broker-level defaults of a topic config, the one in effect first:
/// a cluster-wide default set at run time, a ketch setting
/// (`topics.max_message_bytes` for `max.message.bytes`), Kafka's default;
/// named by the broker config (Kafka's first synonym).
fn broker_defaults(defaults: &Defaults, def: &ConfigDef) -> Vec<Synonym> {
    defaults
        .synonyms(def.name)
        .into_iter()
        .map(|(source, value)| Synonym {
            name: def.broker_synonym.unwrap_or(def.name),
            value: value.to_owned(),
            source: match source {
                DefaultSource::Cluster => DYNAMIC_DEFAULT_BROKER_CONFIG,
                DefaultSource::Settings => STATIC_BROKER_CONFIG,
                DefaultSource::Kafka => DEFAULT_CONFIG,
            },
        })
        .collect()
}

/// What DescribeConfigs documents for a config: Kafka's meaning, and for
/// an inert one why it changes nothing on ketch.
fn documentation(def: &ConfigDef) -> String {
    match def.effect {
        Effect::Honoured => def.doc.to_owned(),
        Effect::Inert(why) => format!("{} Accepted but inert on ketch: {why}", def.doc),
    }
}

/// Every topic config, as a topic with `overrides` sees it.
pub fn topic_configs(defaults: &Defaults, overrides: &BTreeMap<String, String>) -> Vec<ReportedConfig> {
    TOPIC_CONFIGS
        .iter()
        .map(|def| {
            let mut synonyms = Vec::new();
            if let Some(value) = overrides.get(def.name) {
                synonyms.push(Synonym {
                    name: def.name,
                    value: value.clone(),
                    source: DYNAMIC_TOPIC_CONFIG,
                });
            }
            // Without an override, the first broker-level default is in effect.
            synonyms.extend(broker_defaults(defaults, def));
            ReportedConfig {
                name: def.name,
                read_only: false,
                config_type: def.kind.code(),
                doc: documentation(def),
                synonyms,
            }
        })
        .collect()
}

/// This gateway's broker configs: ketch's settings under Kafka's names
/// (fixed at startup, hence read-only), then the broker-level defaults of
/// the topic configs (`log.retention.ms`…), which tools read to show what
/// a topic without overrides gets, and which can be set cluster-wide at run
/// time.
pub fn broker_configs(ctx: &Context, client_listener: &str) -> Vec<ReportedConfig> {
    let settings = &ctx.settings;
    let topics = &settings.topics;
    let defaults = ctx.topic_defaults.get();
    let me = ctx.membership.me();
    let listener = format!("PLAINTEXT://{}:{}", me.host, me.port);
    // The node id the client was given, on its listener.
    let id = ctx.membership.my_broker_id(client_listener).to_string();
    let ms = |d: ketch_config::Duration| d.get().as_millis().to_string();
    let own = [
        ("broker.id", id.clone(), TYPE_INT, "This gateway's node id."),
        ("node.id", id, TYPE_INT, "This gateway's node id."),
        (
            "auto.create.topics.enable",
            topics.auto_create.to_string(),
            TYPE_BOOLEAN,
            "Whether a topic is created on first use (topics.auto_create).",
        ),
        (
            "delete.topic.enable",
            "true".to_owned(),
            TYPE_BOOLEAN,
            "Topics can be deleted.",
        ),
        (
            "num.partitions",
            topics.default_partitions.to_string(),
            TYPE_INT,
            "Partitions of a topic created without a count (topics.default_partitions).",
        ),
        (
            "default.replication.factor",
            "1".to_owned(),
            TYPE_INT,
            "Always 1: replication is Redis's concern.",
        ),
        (
            "offsets.topic.replication.factor",
            "1".to_owned(),
            TYPE_INT,
            "Always 1: group offsets live in Redis.",
        ),
        (
            "transaction.state.log.replication.factor",
            "1".to_owned(),
            TYPE_INT,
            "Always 1: transaction state lives in Redis.",
        ),
        (
            "advertised.listeners",
            listener,
            TYPE_STRING,
            "The address clients are told to use.",
        ),
        (
            "socket.request.max.bytes",
            settings.broker.max_request_bytes.to_string(),
            TYPE_INT,
            "Largest request accepted (broker.max_request_bytes).",
        ),
        (
            "max.connections",
            settings.broker.max_connections.to_string(),
            TYPE_INT,
            "Client connections open at once (broker.max_connections).",
        ),
        (
            "max.connections.per.ip",
            settings.broker.max_connections_per_ip.to_string(),
            TYPE_INT,
            "Client connections open at once from one address (broker.max_connections_per_ip).",
        ),
        (
            "max.connections.per.ip.overrides",
            settings.broker.max_connections_per_ip_overrides.clone(),
            TYPE_STRING,
            "Per-address limits in place of max.connections.per.ip (broker.max_connections_per_ip_overrides).",
        ),
        (
            "connections.max.idle.ms",
            ms(settings.broker.connections_max_idle),
            TYPE_LONG,
            "Idle connections are closed after this (broker.connections_max_idle).",
        ),
        (
            "group.initial.rebalance.delay.ms",
            ms(settings.groups.initial_rebalance_delay),
            TYPE_INT,
            "Wait for more members before a new group's first rebalance (groups.initial_rebalance_delay).",
        ),
        (
            "group.min.session.timeout.ms",
            ms(settings.groups.min_session_timeout),
            TYPE_INT,
            "Shortest session timeout a member may ask for (groups.min_session_timeout).",
        ),
        (
            "group.max.session.timeout.ms",
            ms(settings.groups.max_session_timeout),
            TYPE_INT,
            "Longest session timeout a member may ask for (groups.max_session_timeout).",
        ),
        (
            "offsets.retention.minutes",
            (settings.groups.offsets_retention.get().as_secs() / 60).to_string(),
            TYPE_INT,
            "How long an empty group's offsets are kept (groups.offsets_retention).",
        ),
        (
            "offsets.retention.check.interval.ms",
            ms(settings.groups.offsets_retention_check_interval),
            TYPE_LONG,
            "How often offsets no member consumes are looked for to expire (groups.offsets_retention_check_interval).",
        ),
        (
            "quota.window.num",
            settings.quotas.window_num.to_string(),
            TYPE_INT,
            "Samples a client's rate is measured over for its quotas (quotas.window_num).",
        ),
        (
            "quota.window.size.seconds",
            settings.quotas.window_size.get().as_secs().to_string(),
            TYPE_INT,
            "The length of one quota sample (quotas.window_size).",
        ),
    ]
    .into_iter()
    .map(|(name, value, config_type, doc)| ReportedConfig {
        name,
        read_only: true,
        config_type,
        doc: doc.to_owned(),
        synonyms: vec![Synonym {
            name,
            value,
            source: STATIC_BROKER_CONFIG,
        }],
    });
    let mut configs: Vec<ReportedConfig> = own.collect();
    for def in TOPIC_CONFIGS {
        let Some(name) = def.broker_synonym else {
            continue;
        };
        if configs.iter().any(|c| c.name == name) {
            continue;
        }
        configs.push(ReportedConfig {
            name,
            read_only: false,
            config_type: def.kind.code(),
            doc: format!("Default of the topic config {}. {}", def.name, documentation(def)),
            synonyms: broker_defaults(&defaults, def),
        });
    }
    configs
}

/// The default broker resource (an empty name): only the cluster-wide
/// defaults set at run time, as Kafka describes it.
fn cluster_default_configs(ctx: &Context) -> Vec<ReportedConfig> {
    broker_configs(ctx, "")
        .into_iter()
        .filter_map(|mut config| {
            config
                .synonyms
                .retain(|s| s.source == DYNAMIC_DEFAULT_BROKER_CONFIG);
            (!config.synonyms.is_empty()).then_some(config)
        })
        .collect()
}

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    req: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let options = Options {
        include_synonyms: req.include_synonyms,
        include_documentation: req.include_documentation,
    };
    let results = super::each(
        req.resources
            .into_iter()
            .map(|r| describe(ctx, client, r, options)),
    )
    .await;
    DescribeConfigsResponse::default().with_results(results)
}

#[derive(Debug, Clone, Copy)]
struct Options {
    include_synonyms: bool,
    include_documentation: bool,
}

async fn describe(
    ctx: &Context,
    client: &Client,
    resource: DescribeConfigsResource,
    options: Options,
) -> DescribeConfigsResult {
    let result = DescribeConfigsResult::default()
        .with_resource_type(resource.resource_type)
        .with_resource_name(resource.resource_name.clone())
        .with_error_message(None);
    // DESCRIBE_CONFIGS on the topic, or on the cluster for a broker.
    let permitted = match resource.resource_type {
        RESOURCE_TOPIC => authorized(
            ctx,
            client,
            Operation::DescribeConfigs,
            ResourceType::Topic,
            resource.resource_name.as_str(),
        ),
        RESOURCE_BROKER | RESOURCE_BROKER_LOGGER => {
            cluster_authorized(ctx, client, Operation::DescribeConfigs)
        }
        _ => true,
    };
    if !permitted {
        let error = if resource.resource_type == RESOURCE_TOPIC {
            ResponseError::TopicAuthorizationFailed
        } else {
            ResponseError::ClusterAuthorizationFailed
        };
        return result
            .with_error_code(error.code())
            .with_error_message(Some(str_bytes("Authorization failed.")));
    }
    match configs_of(ctx, &client.listener, &resource).await {
        Ok(mut configs) => {
            // No key list, or an empty one, asks for every config (Kafka's
            // ConfigHelper treats both alike).
            if let Some(keys) = resource.configuration_keys.as_ref().filter(|k| !k.is_empty()) {
                configs.retain(|c| keys.iter().any(|k| k.as_str() == c.name));
            }
            result.with_configs(configs.into_iter().map(|c| to_result(c, options)).collect())
        }
        Err((code, message)) => result
            .with_error_code(code)
            .with_error_message(message.map(str_bytes)),
    }
}

async fn configs_of(
    ctx: &Context,
    listener: &str,
    resource: &DescribeConfigsResource,
) -> Result<Vec<ReportedConfig>, (i16, Option<String>)> {
    let name = resource.resource_name.as_str();
    match resource.resource_type {
        RESOURCE_TOPIC => {
            ketch_storage::validate_topic_name(name)
                .map_err(|m| (ResponseError::InvalidTopicException.code(), Some(m)))?;
            // Read now, not from the topic cache: tools read configs back
            // to change them (kafka-python's AlterConfigs sends every
            // override it read), so a stale answer would undo a change just
            // made through another gateway. While the registry cannot be
            // read (its master failing over), the topic's last record read
            // in the past minute, as for produce and fetch: Kafka answers
            // from its metadata cache, and Kafka Connect's start, which
            // checks its topics' `cleanup.policy`, fails on an error.
            let topic = ctx
                .storage
                .topic_fresher_than(name, std::time::Duration::ZERO)
                .await
                .map_err(|e| (super::error_code(&e), None))?
                .ok_or((ResponseError::UnknownTopicOrPartition.code(), None))?;
            Ok(topic_configs(&ctx.topic_defaults.get(), &topic.configs))
        }
        RESOURCE_BROKER if name.is_empty() => {
            // Read now, as for a topic: a tool reads them back to change them.
            crate::cluster_configs::reload(ctx)
                .await
                .map_err(|e| (super::error_code(&e), None))?;
            Ok(cluster_default_configs(ctx))
        }
        RESOURCE_BROKER => super::this_broker(ctx, listener, name)
            .map(|()| broker_configs(ctx, listener))
            .map_err(|m| (ResponseError::InvalidRequest.code(), Some(m))),
        other => Err((
            ResponseError::InvalidRequest.code(),
            Some(format!(
                "ketch describes only topic (2) and broker (4) configs, not resource type {other}"
            )),
        )),
    }
}

fn to_result(config: ReportedConfig, options: Options) -> DescribeConfigsResourceResult {
    let current = config.current();
    let result = DescribeConfigsResourceResult::default()
        .with_name(str_bytes(config.name))
        .with_value(Some(str_bytes(current.value.clone())))
        .with_read_only(config.read_only)
        .with_config_source(current.source)
        .with_is_sensitive(false)
        .with_config_type(config.config_type)
        .with_documentation(options.include_documentation.then(|| str_bytes(config.doc)));
    if !options.include_synonyms {
        return result;
    }
    let synonyms = config.synonyms.into_iter().map(|s| {
        DescribeConfigsSynonym::default()
            .with_name(str_bytes(s.name))
            .with_value(Some(str_bytes(s.value)))
            .with_source(s.source)
    });
    result.with_synonyms(synonyms.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(configs: &'a [ReportedConfig], name: &str) -> &'a ReportedConfig {
        configs.iter().find(|c| c.name == name).expect(name)
    }

    #[test]
    fn every_topic_config_is_listed_with_its_default() {
        let configs = topic_configs(&Defaults::default(), &BTreeMap::new());
        assert_eq!(configs.len(), TOPIC_CONFIGS.len());
        let retention = find(&configs, "retention.ms");
        assert_eq!(retention.synonyms.len(), 1);
        assert_eq!(retention.current().value, "604800000");
        assert_eq!(retention.current().source, DEFAULT_CONFIG);
        assert_eq!(retention.current().name, "log.retention.ms", "the broker synonym");
        assert_eq!(retention.config_type, TYPE_LONG);
        assert_eq!(find(&configs, "cleanup.policy").config_type, 7, "LIST");
        assert_eq!(find(&configs, "compression.type").config_type, TYPE_STRING);
        assert_eq!(find(&configs, "remote.storage.enable").config_type, TYPE_BOOLEAN);
        let inert = find(&configs, "min.insync.replicas");
        assert!(inert.doc.contains("inert on ketch"), "{}", inert.doc);
        assert!(!find(&configs, "retention.ms").doc.contains("inert"));
    }

    #[test]
    fn an_override_comes_first_then_the_default_it_hides() {
        let overrides = BTreeMap::from([("retention.ms".to_owned(), "1000".to_owned())]);
        let configs = topic_configs(&Defaults::default(), &overrides);
        let retention = find(&configs, "retention.ms");
        assert_eq!(retention.current().value, "1000");
        assert_eq!(retention.current().source, DYNAMIC_TOPIC_CONFIG);
        assert_eq!(retention.synonyms[1].value, "604800000");
        assert_eq!(retention.synonyms[1].source, DEFAULT_CONFIG);
    }

    #[test]
    fn max_message_bytes_defaults_to_the_broker_setting() {
        let configs = topic_configs(&Defaults::new(2048), &BTreeMap::new());
        let current = find(&configs, "max.message.bytes").current();
        assert_eq!(
            current,
            &Synonym {
                name: "message.max.bytes",
                value: "2048".to_owned(),
                source: STATIC_BROKER_CONFIG
            }
        );
    }

    #[test]
    fn a_cluster_wide_default_comes_between_an_override_and_the_settings() {
        let (defaults, _) = Defaults::new(2048).with_cluster([("message.max.bytes", "4096")]);
        let overrides = BTreeMap::from([("max.message.bytes".to_owned(), "100".to_owned())]);
        let configs = topic_configs(&defaults, &overrides);
        let sources: Vec<_> = find(&configs, "max.message.bytes")
            .synonyms
            .iter()
            .map(|s| (s.name, s.value.as_str(), s.source))
            .collect();
        assert_eq!(
            sources,
            [
                ("max.message.bytes", "100", DYNAMIC_TOPIC_CONFIG),
                ("message.max.bytes", "4096", DYNAMIC_DEFAULT_BROKER_CONFIG),
                ("message.max.bytes", "2048", STATIC_BROKER_CONFIG),
                ("message.max.bytes", "1048588", DEFAULT_CONFIG),
            ]
        );
    }

    #[test]
    fn results_carry_synonyms_and_docs_only_when_asked() {
        let config = find(
            &topic_configs(&Defaults::default(), &BTreeMap::new()),
            "segment.ms",
        )
        .clone();
        let bare = to_result(
            config.clone(),
            Options {
                include_synonyms: false,
                include_documentation: false,
            },
        );
        assert!(bare.synonyms.is_empty());
        assert_eq!(bare.documentation, None);
        assert_eq!(bare.value.as_deref(), Some("604800000"));
        let full = to_result(
            config,
            Options {
                include_synonyms: true,
                include_documentation: true,
            },
        );
        assert_eq!(full.synonyms.len(), 1);
        assert!(full.documentation.is_some());
    }
}
