//! DescribeConfigs (API key 32, versions 1–4): a topic's configs (override
//! or default, with their source) and this gateway's read-only broker configs.
//! Spec: KIP-133 (DescribeConfigs), KIP-226 (synonyms), KIP-569 (types, docs).

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse, RequestHeader};
use ketch_config::TopicsSettings;
use ketch_config::topic::{ConfigType, TOPIC_CONFIGS};

use super::{Client, authorized, cluster_authorized, resolve_topic, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

/// Kafka's `ConfigResource.Type` codes ketch answers for.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

/// Kafka's `ConfigSource` codes.
pub const DYNAMIC_TOPIC_CONFIG: i8 = 1;
pub const STATIC_BROKER_CONFIG: i8 = 4;
pub const DEFAULT_CONFIG: i8 = 5;

/// Kafka's `ConfigType` codes.
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
    pub doc: &'static str,
    /// The value in effect first, then the default it overrides, if any.
    pub synonyms: Vec<Synonym>,
}

impl ReportedConfig {
    /// The value in effect.
    pub fn current(&self) -> &Synonym {
        &self.synonyms[0]
    }
}

/// Every topic config ketch knows, as a topic with `overrides` sees it.
/// `max.message.bytes` defaults to the broker setting, as in Kafka.
pub fn topic_configs(settings: &TopicsSettings, overrides: &BTreeMap<String, String>) -> Vec<ReportedConfig> {
    TOPIC_CONFIGS
        .iter()
        .map(|def| {
            let default = if def.name == "max.message.bytes" {
                Synonym {
                    name: "message.max.bytes",
                    value: settings.max_message_bytes.to_string(),
                    source: STATIC_BROKER_CONFIG,
                }
            } else {
                Synonym {
                    name: def.name,
                    value: def.default.to_owned(),
                    source: DEFAULT_CONFIG,
                }
            };
            let synonyms = match overrides.get(def.name) {
                Some(value) => {
                    let value = value.clone();
                    vec![
                        Synonym {
                            name: def.name,
                            value,
                            source: DYNAMIC_TOPIC_CONFIG,
                        },
                        default,
                    ]
                }
                None => vec![default],
            };
            let config_type = match def.kind {
                ConfigType::Boolean => TYPE_BOOLEAN,
                ConfigType::Int => TYPE_INT,
                ConfigType::Long => TYPE_LONG,
                ConfigType::Choice(_) => TYPE_STRING,
            };
            ReportedConfig {
                name: def.name,
                read_only: false,
                config_type,
                doc: def.doc,
                synonyms,
            }
        })
        .collect()
}

/// This gateway's broker configs: fixed at startup, hence read-only.
fn broker_configs(ctx: &Context) -> Vec<ReportedConfig> {
    let topics = &ctx.settings.topics;
    let me = ctx.membership.me();
    let listener = format!("PLAINTEXT://{}:{}", me.host, me.port);
    [
        (
            "broker.id",
            ctx.membership.my_broker_id("").to_string(),
            TYPE_INT,
            "This gateway's node id (broker.id).",
        ),
        (
            "auto.create.topics.enable",
            topics.auto_create.to_string(),
            TYPE_BOOLEAN,
            "Whether a topic is created on first use (topics.auto_create).",
        ),
        (
            "num.partitions",
            topics.default_partitions.to_string(),
            TYPE_INT,
            "Partitions of a topic created without a count (topics.default_partitions).",
        ),
        (
            "message.max.bytes",
            topics.max_message_bytes.to_string(),
            TYPE_INT,
            "Default of the max.message.bytes topic config (topics.max_message_bytes).",
        ),
        (
            "default.replication.factor",
            "1".to_owned(),
            TYPE_INT,
            "Always 1: replication is Redis's concern.",
        ),
        (
            "advertised.listeners",
            listener,
            TYPE_STRING,
            "The address clients are told to use.",
        ),
    ]
    .into_iter()
    .map(|(name, value, config_type, doc)| ReportedConfig {
        name,
        read_only: true,
        config_type,
        doc,
        synonyms: vec![Synonym {
            name,
            value,
            source: STATIC_BROKER_CONFIG,
        }],
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
        RESOURCE_BROKER => cluster_authorized(ctx, client, Operation::DescribeConfigs),
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
    match configs_of(ctx, &resource).await {
        Ok(mut configs) => {
            if let Some(keys) = &resource.configuration_keys {
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
    resource: &DescribeConfigsResource,
) -> Result<Vec<ReportedConfig>, (i16, Option<String>)> {
    let name = resource.resource_name.as_str();
    match resource.resource_type {
        RESOURCE_TOPIC => {
            ketch_storage::validate_topic_name(name)
                .map_err(|m| (ResponseError::InvalidTopicException.code(), Some(m)))?;
            let topic = resolve_topic(ctx, name, false)
                .await
                .map_err(|code| (code, None))?;
            Ok(topic_configs(&ctx.settings.topics, &topic.configs))
        }
        RESOURCE_BROKER
            if name.is_empty()
                || name == ctx.membership.my_broker_id("").to_string()
                || name == ctx.membership.my_id().to_string() =>
        {
            Ok(broker_configs(ctx))
        }
        RESOURCE_BROKER => Err((
            ResponseError::InvalidRequest.code(),
            Some(format!(
                "Unexpected broker id, expected {} or empty string, but received {name}",
                ctx.membership.my_broker_id("")
            )),
        )),
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
        let configs = topic_configs(&TopicsSettings::default(), &BTreeMap::new());
        assert_eq!(configs.len(), TOPIC_CONFIGS.len());
        let retention = find(&configs, "retention.ms");
        assert_eq!(retention.synonyms.len(), 1);
        assert_eq!(retention.current().value, "604800000");
        assert_eq!(retention.current().source, DEFAULT_CONFIG);
        assert_eq!(retention.config_type, TYPE_LONG);
        assert_eq!(find(&configs, "cleanup.policy").config_type, TYPE_STRING);
        assert_eq!(find(&configs, "remote.storage.enable").config_type, TYPE_BOOLEAN);
    }

    #[test]
    fn an_override_comes_first_then_the_default_it_hides() {
        let overrides = BTreeMap::from([("retention.ms".to_owned(), "1000".to_owned())]);
        let configs = topic_configs(&TopicsSettings::default(), &overrides);
        let retention = find(&configs, "retention.ms");
        assert_eq!(retention.current().value, "1000");
        assert_eq!(retention.current().source, DYNAMIC_TOPIC_CONFIG);
        assert_eq!(retention.synonyms[1].value, "604800000");
        assert_eq!(retention.synonyms[1].source, DEFAULT_CONFIG);
    }

    #[test]
    fn max_message_bytes_defaults_to_the_broker_setting() {
        let settings = TopicsSettings {
            max_message_bytes: 2048,
            ..TopicsSettings::default()
        };
        let configs = topic_configs(&settings, &BTreeMap::new());
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
    fn results_carry_synonyms_and_docs_only_when_asked() {
        let config = find(
            &topic_configs(&TopicsSettings::default(), &BTreeMap::new()),
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
