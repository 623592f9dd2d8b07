//! Kafka topic configs that ketch accepts (CreateTopics, DescribeConfigs).
//!
//! Names, types and defaults follow Apache Kafka's topic-level configs. A key
//! not listed here is rejected with INVALID_CONFIG rather than ignored, and a
//! value ketch cannot honour yet is rejected with a message saying so.

use std::collections::BTreeMap;

/// The type of a topic config value, for validation and DescribeConfigs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean,
    Int,
    Long,
    /// One of a fixed set of strings.
    Choice(&'static [&'static str]),
}

/// One topic config ketch knows.
#[derive(Debug, Clone, Copy)]
pub struct ConfigDef {
    pub name: &'static str,
    pub default: &'static str,
    pub kind: ConfigType,
    /// Smallest accepted value for numeric configs.
    pub min: i64,
    pub doc: &'static str,
}

/// Every topic config ketch accepts.
pub const TOPIC_CONFIGS: &[ConfigDef] = &[
    ConfigDef {
        name: "cleanup.policy",
        default: "delete",
        kind: ConfigType::Choice(&["delete"]),
        min: 0,
        doc: "Only `delete` is supported; `compact` is rejected until compaction exists.",
    },
    ConfigDef {
        name: "compression.type",
        default: "producer",
        kind: ConfigType::Choice(&["producer"]),
        min: 0,
        doc: "Batches are stored as the producer compressed them; recompression is not supported.",
    },
    ConfigDef {
        name: "local.retention.bytes",
        default: "-2",
        kind: ConfigType::Long,
        min: -2,
        doc: "Bytes kept in Redis once archived (-2: same as retention.bytes). Takes effect with tiered storage.",
    },
    ConfigDef {
        name: "local.retention.ms",
        default: "-2",
        kind: ConfigType::Long,
        min: -2,
        doc: "Time kept in Redis once archived (-2: same as retention.ms). Takes effect with tiered storage.",
    },
    ConfigDef {
        name: "max.message.bytes",
        default: "1048588",
        kind: ConfigType::Int,
        min: 0,
        doc: "Largest record batch accepted; larger batches get MESSAGE_TOO_LARGE.",
    },
    ConfigDef {
        name: "message.timestamp.type",
        default: "CreateTime",
        kind: ConfigType::Choice(&["CreateTime", "LogAppendTime"]),
        min: 0,
        doc: "CreateTime keeps the producer's timestamps; LogAppendTime stamps each batch with the gateway's clock when it is appended.",
    },
    ConfigDef {
        name: "remote.storage.enable",
        default: "false",
        kind: ConfigType::Boolean,
        min: 0,
        doc: "Archive sealed segments to Iceberg. Stored; archiving arrives with tiered storage.",
    },
    ConfigDef {
        name: "retention.bytes",
        default: "-1",
        kind: ConfigType::Long,
        min: -1,
        doc: "Partition size limit (-1: none). Stored; enforced with the storage worker.",
    },
    ConfigDef {
        name: "retention.ms",
        default: "604800000",
        kind: ConfigType::Long,
        min: -1,
        doc: "Age limit of records (-1: none). Stored; enforced with the storage worker.",
    },
    ConfigDef {
        name: "segment.bytes",
        default: "1073741824",
        kind: ConfigType::Int,
        min: 14,
        doc: "Segment size for sealing and archiving.",
    },
    ConfigDef {
        name: "segment.ms",
        default: "604800000",
        kind: ConfigType::Long,
        min: 1,
        doc: "Segment age for sealing and archiving.",
    },
];

/// Looks up a topic config by name.
pub fn topic_config(name: &str) -> Option<&'static ConfigDef> {
    TOPIC_CONFIGS.iter().find(|def| def.name == name)
}

/// Checks one `name = value` pair; returns the value normalized, or why it
/// is invalid (suitable for a Kafka error message).
pub fn validate_topic_config(name: &str, value: &str) -> Result<String, String> {
    let def = topic_config(name).ok_or_else(|| format!("Unknown topic config name: {name}"))?;
    let value = value.trim();
    match def.kind {
        ConfigType::Boolean => match value.to_ascii_lowercase().as_str() {
            v @ ("true" | "false") => Ok(v.to_owned()),
            _ => Err(format!(
                "Invalid value {value} for configuration {name}: expected true or false"
            )),
        },
        ConfigType::Int | ConfigType::Long => {
            let n: i64 = value
                .parse()
                .map_err(|_| format!("Invalid value {value} for configuration {name}: not a number"))?;
            if def.kind == ConfigType::Int && i32::try_from(n).is_err() {
                return Err(format!(
                    "Invalid value {value} for configuration {name}: out of range for int"
                ));
            }
            if n < def.min {
                return Err(format!(
                    "Invalid value {value} for configuration {name}: must be at least {}",
                    def.min
                ));
            }
            Ok(n.to_string())
        }
        ConfigType::Choice(choices) => choices
            .iter()
            .find(|c| c.eq_ignore_ascii_case(value))
            .map(|c| (*c).to_owned())
            .ok_or_else(|| {
                format!(
                    "Invalid value {value} for configuration {name}: ketch supports only {}",
                    choices.join(", ")
                )
            }),
    }
}

/// Validates a whole set of overrides, returning them normalized.
pub fn validate_topic_configs<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (name, value) in pairs {
        let value = validate_topic_config(name, value)?;
        if out.insert(name.to_owned(), value).is_some() {
            return Err(format!("Duplicate topic config: {name}"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_is_valid() {
        for def in TOPIC_CONFIGS {
            assert_eq!(
                validate_topic_config(def.name, def.default).as_deref(),
                Ok(def.default),
                "{}",
                def.name
            );
        }
    }

    #[test]
    fn unknown_and_invalid_values_are_rejected() {
        assert!(
            validate_topic_config("retention.msx", "1")
                .unwrap_err()
                .contains("retention.msx")
        );
        assert!(validate_topic_config("retention.ms", "soon").is_err());
        assert!(validate_topic_config("retention.ms", "-5").is_err());
        assert!(validate_topic_config("max.message.bytes", "99999999999").is_err());
        assert!(
            validate_topic_config("cleanup.policy", "compact")
                .unwrap_err()
                .contains("delete")
        );
        assert_eq!(
            validate_topic_config("remote.storage.enable", "TRUE").unwrap(),
            "true"
        );
        assert!(validate_topic_configs([("retention.ms", "1"), ("retention.ms", "2")]).is_err());
    }
}
