//! Kafka topic configs: every config Apache Kafka 4.x accepts on a topic,
//! validated by type and range as Kafka validates it (CreateTopics,
//! AlterConfigs, IncrementalAlterConfigs, the admin HTTP API), with what each
//! one does on ketch.
//!
//! Names, types, defaults, valid ranges and broker synonyms follow Kafka's
//! `LogConfig` and `ServerTopicConfigSynonyms`. A name not listed here is
//! rejected with INVALID_CONFIG rather than ignored. A config that has no
//! meaning when partitions live in Redis is [`Effect::Inert`]: stored,
//! described with its source, and documented with what replaces it.

use std::collections::BTreeMap;

/// The type of a topic config value (Kafka's `ConfigDef.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean,
    String,
    Int,
    Long,
    Double,
    /// Comma-separated values.
    List,
}

impl ConfigType {
    /// The code DescribeConfigs reports (KIP-569's `ConfigType`).
    pub fn code(self) -> i8 {
        match self {
            ConfigType::Boolean => 1,
            ConfigType::String => 2,
            ConfigType::Int => 3,
            ConfigType::Long => 5,
            ConfigType::Double => 6,
            ConfigType::List => 7,
        }
    }

    fn kafka_name(self) -> &'static str {
        match self {
            ConfigType::Boolean => "BOOLEAN",
            ConfigType::String => "STRING",
            ConfigType::Int => "INT",
            ConfigType::Long => "LONG",
            ConfigType::Double => "DOUBLE",
            ConfigType::List => "LIST",
        }
    }
}

/// The values a config accepts beyond its type (Kafka's validators).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Valid {
    Any,
    /// A number at least this.
    AtLeast(i64),
    /// A number in this closed range.
    Between(i64, i64),
    /// A number in this closed range, or exactly the first value (Kafka's
    /// compression level validators: gzip accepts -1 or 1–9).
    LevelOr(i64, i64, i64),
    /// A double in this closed range.
    Fraction(f64, f64),
    /// One of these strings (case-sensitive, as Kafka's `ValidString`).
    OneOf(&'static [&'static str]),
    /// A list whose every element is one of these (Kafka's `ValidList`).
    ListOf(&'static [&'static str]),
    /// `*`, or `partition:broker` pairs (Kafka's throttled replica lists).
    ThrottledReplicas,
}

/// What a config does on ketch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// ketch does what Kafka does with it.
    Honoured,
    /// Stored and described but changes nothing on ketch; why, and what
    /// takes its place.
    Inert(&'static str),
}

/// One topic config.
#[derive(Debug, Clone, Copy)]
pub struct ConfigDef {
    pub name: &'static str,
    pub kind: ConfigType,
    /// Kafka's default, as Kafka prints it.
    pub default: &'static str,
    pub valid: Valid,
    /// The broker config that supplies the default (Kafka's first synonym);
    /// `None` for configs with no broker default.
    pub broker_synonym: Option<&'static str>,
    pub effect: Effect,
    pub doc: &'static str,
}

const NO_REPLICAS: &str = "Partitions have one logical replica in Redis; Redis replication \
     (storage.acks_all_replicas for acks=all) takes the place of Kafka's.";
const NO_FILES: &str = "Partitions are Redis streams, not segment files with indexes; a fetch \
     finds an offset with one XRANGE.";
const NO_FLUSH: &str = "Durability is Redis's: its AOF fsync policy and, for acks=all, \
     storage.acks_all_replicas.";

const fn def(
    name: &'static str,
    kind: ConfigType,
    default: &'static str,
    valid: Valid,
    broker_synonym: Option<&'static str>,
    effect: Effect,
    doc: &'static str,
) -> ConfigDef {
    ConfigDef {
        name,
        kind,
        default,
        valid,
        broker_synonym,
        effect,
        doc,
    }
}

use ConfigType::{Boolean, Double, Int, List, Long, String as Str};
use Effect::{Honoured, Inert};

/// Every topic config Apache Kafka 4.x accepts, sorted by name.
pub const TOPIC_CONFIGS: &[ConfigDef] = &[
    def(
        "cleanup.policy",
        List,
        "delete",
        Valid::ListOf(&["compact", "delete"]),
        Some("log.cleanup.policy"),
        Honoured,
        "delete: retention.ms and retention.bytes remove old segments; compact: the storage worker \
         keeps only the latest record of each key; both: both; empty: nothing is removed.",
    ),
    def(
        "compression.gzip.level",
        Int,
        "-1",
        Valid::LevelOr(-1, 1, 9),
        Some("compression.gzip.level"),
        Honoured,
        "Level of gzip when compression.type=gzip recompresses a batch (-1: the codec's default, 6).",
    ),
    def(
        "compression.lz4.level",
        Int,
        "9",
        Valid::Between(1, 17),
        Some("compression.lz4.level"),
        Inert("ketch's lz4 encoder (lz4_flex) has one level, Kafka's fast default."),
        "Level of lz4 when the broker compresses.",
    ),
    def(
        "compression.type",
        Str,
        "producer",
        Valid::OneOf(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]),
        Some("compression.type"),
        Honoured,
        "producer: batches are stored as the producer compressed them. Another codec: the gateway \
         compresses each batch with it before storing it (a batch already in it is stored as it \
         came); uncompressed stores records plain.",
    ),
    def(
        "compression.zstd.level",
        Int,
        "3",
        Valid::Between(-131072, 22),
        Some("compression.zstd.level"),
        Honoured,
        "Level of zstd when compression.type=zstd recompresses a batch.",
    ),
    def(
        "delete.retention.ms",
        Long,
        "86400000",
        Valid::AtLeast(0),
        Some("log.cleaner.delete.retention.ms"),
        Honoured,
        "Compacted topics: how long a tombstone (null value), or a transaction marker, stays after the first compaction of its segment, as Kafka counts it.",
    ),
    def(
        "file.delete.delay.ms",
        Long,
        "60000",
        Valid::AtLeast(0),
        Some("log.segment.delete.delay.ms"),
        Inert("Deleted segments are freed by Redis at once (UNLINK frees large ones in the background)."),
        "Delay before a deleted segment's files are removed.",
    ),
    def(
        "flush.messages",
        Long,
        "9223372036854775807",
        Valid::AtLeast(1),
        Some("log.flush.interval.messages"),
        Inert(NO_FLUSH),
        "Messages between forced fsyncs.",
    ),
    def(
        "flush.ms",
        Long,
        "9223372036854775807",
        Valid::AtLeast(0),
        Some("log.flush.interval.ms"),
        Inert(NO_FLUSH),
        "Time between forced fsyncs.",
    ),
    def(
        "follower.replication.throttled.replicas",
        List,
        "",
        Valid::ThrottledReplicas,
        None,
        Inert(NO_REPLICAS),
        "Replicas whose follower replication is throttled.",
    ),
    def(
        "index.interval.bytes",
        Int,
        "4096",
        Valid::AtLeast(0),
        Some("log.index.interval.bytes"),
        Inert(NO_FILES),
        "Bytes between offset index entries.",
    ),
    def(
        "leader.replication.throttled.replicas",
        List,
        "",
        Valid::ThrottledReplicas,
        None,
        Inert(NO_REPLICAS),
        "Replicas whose leader replication is throttled.",
    ),
    def(
        "local.retention.bytes",
        Long,
        "-2",
        Valid::AtLeast(-2),
        Some("log.local.retention.bytes"),
        Honoured,
        "Bytes of archived segments kept in Redis (-2: as retention.bytes).",
    ),
    def(
        "local.retention.ms",
        Long,
        "-2",
        Valid::AtLeast(-2),
        Some("log.local.retention.ms"),
        Honoured,
        "Time archived segments are kept in Redis (-2: as retention.ms).",
    ),
    def(
        "max.compaction.lag.ms",
        Long,
        "9223372036854775807",
        Valid::AtLeast(1),
        Some("log.cleaner.max.compaction.lag.ms"),
        Honoured,
        "Compacted topics: the open segment is sealed this old at the latest, and a segment whose \
         records are this old is compacted whatever the dirty ratio.",
    ),
    def(
        "max.message.bytes",
        Int,
        "1048588",
        Valid::AtLeast(0),
        Some("message.max.bytes"),
        Honoured,
        "Largest record batch accepted; larger batches get MESSAGE_TOO_LARGE.",
    ),
    def(
        "message.downconversion.enable",
        Boolean,
        "true",
        Valid::Any,
        Some("log.message.downconversion.enable"),
        Inert("Deprecated no-op in Kafka 4.x too: old message formats are not served."),
        "Down-conversion for old consumers.",
    ),
    def(
        "message.timestamp.after.max.ms",
        Long,
        "3600000",
        Valid::AtLeast(0),
        Some("log.message.timestamp.after.max.ms"),
        Honoured,
        "With CreateTime, how far a record's timestamp may be ahead of the gateway's clock; \
         later ones get INVALID_TIMESTAMP.",
    ),
    def(
        "message.timestamp.before.max.ms",
        Long,
        "9223372036854775807",
        Valid::AtLeast(0),
        Some("log.message.timestamp.before.max.ms"),
        Honoured,
        "With CreateTime, how far a record's timestamp may be behind the gateway's clock; \
         earlier ones get INVALID_TIMESTAMP.",
    ),
    def(
        "message.timestamp.type",
        Str,
        "CreateTime",
        Valid::OneOf(&["CreateTime", "LogAppendTime"]),
        Some("log.message.timestamp.type"),
        Honoured,
        "CreateTime keeps the producer's timestamps; LogAppendTime stamps each batch with the \
         gateway's clock when it is appended.",
    ),
    def(
        "min.cleanable.dirty.ratio",
        Double,
        "0.5",
        Valid::Fraction(0.0, 1.0),
        Some("log.cleaner.min.cleanable.ratio"),
        Honoured,
        "Compacted topics: the share of a partition's bytes not yet compacted that starts a pass.",
    ),
    def(
        "min.compaction.lag.ms",
        Long,
        "0",
        Valid::AtLeast(0),
        Some("log.cleaner.min.compaction.lag.ms"),
        Honoured,
        "Compacted topics: a segment is compacted once its newest record is this old.",
    ),
    def(
        "min.insync.replicas",
        Int,
        "1",
        Valid::AtLeast(1),
        Some("min.insync.replicas"),
        Inert(NO_REPLICAS),
        "Replicas that must acknowledge an acks=all write.",
    ),
    def(
        "preallocate",
        Boolean,
        "false",
        Valid::Any,
        Some("log.preallocate"),
        Inert(NO_FILES),
        "Preallocate segment files.",
    ),
    def(
        "remote.log.copy.disable",
        Boolean,
        "false",
        Valid::Any,
        None,
        Honoured,
        "true: sealed segments are no longer archived; what is archived is still read, and \
         retention deletes segments without waiting for the archive.",
    ),
    def(
        "remote.log.delete.on.disable",
        Boolean,
        "false",
        Valid::Any,
        None,
        Honoured,
        "true: turning remote.storage.enable off deletes the topic's archive (its Iceberg table and \
         files) and moves the log start offset to the local start offset. Turning it off requires \
         true (Kafka's rule).",
    ),
    def(
        "remote.storage.enable",
        Boolean,
        "false",
        Valid::Any,
        None,
        Honoured,
        "Archive sealed segments to Iceberg and serve older offsets from there. May be turned on \
         for a running topic, and off only together with remote.log.delete.on.disable=true \
         (the archive is then deleted).",
    ),
    def(
        "retention.bytes",
        Long,
        "-1",
        Valid::Any,
        Some("log.retention.bytes"),
        Honoured,
        "Partition size limit (-1: none).",
    ),
    def(
        "retention.ms",
        Long,
        "604800000",
        Valid::AtLeast(-1),
        Some("log.retention.ms"),
        Honoured,
        "Age limit of records (-1: none).",
    ),
    def(
        "segment.bytes",
        Int,
        "1073741824",
        // Kafka 4.x's least is 1 MiB; ketch's segments are ranges of a
        // stream, cheap at any size (docs/architecture.md, decision (aa)).
        Valid::AtLeast(14),
        Some("log.segment.bytes"),
        Honoured,
        "Segment size for sealing, retention and archiving.",
    ),
    def(
        "segment.index.bytes",
        Int,
        "10485760",
        Valid::AtLeast(4),
        Some("log.index.size.max.bytes"),
        Inert(NO_FILES),
        "Size of a segment's offset index.",
    ),
    def(
        "segment.jitter.ms",
        Long,
        "0",
        Valid::AtLeast(0),
        Some("log.roll.jitter.ms"),
        Inert("Segments are sealed by one storage worker per partition, not rolled by every broker at once."),
        "Random jitter subtracted from segment.ms.",
    ),
    def(
        "segment.ms",
        Long,
        "604800000",
        Valid::AtLeast(1),
        Some("log.roll.ms"),
        Honoured,
        "Segment age for sealing, retention and archiving.",
    ),
    def(
        "unclean.leader.election.enable",
        Boolean,
        "false",
        Valid::Any,
        Some("unclean.leader.election.enable"),
        Inert(NO_REPLICAS),
        "Elect an out-of-sync replica as leader.",
    ),
];

/// Looks up a topic config by name.
/// (A binary search: the table is sorted by name, which a test checks, and
/// the produce path looks configs up for every batch.)
pub fn topic_config(name: &str) -> Option<&'static ConfigDef> {
    TOPIC_CONFIGS
        .binary_search_by(|def| def.name.cmp(name))
        .ok()
        .map(|i| &TOPIC_CONFIGS[i])
}

/// Kafka's message for a value that does not parse or is out of range.
fn invalid(name: &str, value: &str, why: impl std::fmt::Display) -> String {
    format!("Invalid value {value} for configuration {name}: {why}")
}

/// Checks one `name = value` pair as Kafka parses it; returns the value
/// normalized, or why it is invalid (a Kafka error message).
pub fn validate_topic_config(name: &str, value: &str) -> Result<String, String> {
    let def = topic_config(name).ok_or_else(|| format!("Unknown topic config name: {name}"))?;
    let value = value.trim();
    parse(def, name, value)
}

/// The topic config whose cluster-wide default the broker config `name`
/// is (`log.retention.ms` → `retention.ms`): the broker configs Kafka lets
/// IncrementalAlterConfigs change on the default broker resource
/// (`DynamicLogConfig.ReconfigurableConfigs`, Kafka's first synonyms).
pub fn defaulted_by(name: &str) -> Option<&'static ConfigDef> {
    TOPIC_CONFIGS.iter().find(|def| def.broker_synonym == Some(name))
}

/// Checks a cluster-wide default `name = value` (a broker config name,
/// [`defaulted_by`]) as the topic config it defaults is checked, with the
/// broker config's name in the message; the topic config and the value
/// normalized.
pub fn validate_broker_default(name: &str, value: &str) -> Result<(&'static ConfigDef, String), String> {
    let def = defaulted_by(name).ok_or_else(|| format!("Unknown dynamic broker config: {name}"))?;
    let value = value.trim();
    Ok((def, parse(def, name, value)?))
}

/// Parses `value` as `def` takes it; `name` is how the config was named
/// (the topic config, or its broker synonym), for the message.
fn parse(def: &ConfigDef, name: &str, value: &str) -> Result<String, String> {
    let not_a = || {
        invalid(
            name,
            value,
            format!("Not a number of type {}", def.kind.kafka_name()),
        )
    };
    match def.kind {
        ConfigType::Boolean => match value.to_ascii_lowercase().as_str() {
            v @ ("true" | "false") => Ok(v.to_owned()),
            _ => Err(invalid(name, value, "Expected value to be either true or false")),
        },
        ConfigType::Int | ConfigType::Long => {
            let n: i64 = value.parse().map_err(|_| not_a())?;
            if def.kind == ConfigType::Int && i32::try_from(n).is_err() {
                return Err(not_a());
            }
            check_range(def, name, value, n)?;
            Ok(n.to_string())
        }
        ConfigType::Double => {
            let x: f64 = value.parse().map_err(|_| not_a())?;
            if !x.is_finite() {
                return Err(not_a());
            }
            if let Valid::Fraction(min, max) = def.valid {
                if x < min {
                    return Err(invalid(name, value, format!("Value must be at least {min:?}")));
                }
                if x > max {
                    return Err(invalid(
                        name,
                        value,
                        format!("Value must be no more than {max:?}"),
                    ));
                }
            }
            Ok(value.to_owned())
        }
        ConfigType::String => match def.valid {
            Valid::OneOf(choices) if !choices.contains(&value) => Err(invalid(
                name,
                value,
                format!("String must be one of: {}", choices.join(", ")),
            )),
            _ => Ok(value.to_owned()),
        },
        ConfigType::List => {
            let items = list_items(value);
            match def.valid {
                Valid::ListOf(choices) => {
                    if let Some(bad) = items.iter().find(|i| !choices.contains(i)) {
                        return Err(invalid(
                            name,
                            bad,
                            format!("String must be one of: {}", choices.join(", ")),
                        ));
                    }
                }
                Valid::ThrottledReplicas => check_throttled(name, value, &items)?,
                _ => {}
            }
            Ok(items.join(","))
        }
    }
}

/// A list value's elements, trimmed (Kafka splits on commas and trims).
pub fn list_items(value: &str) -> Vec<&str> {
    let value = value.trim();
    if value.is_empty() {
        return Vec::new();
    }
    value.split(',').map(str::trim).collect()
}

fn check_range(def: &ConfigDef, name: &str, value: &str, n: i64) -> Result<(), String> {
    let (min, max) = match def.valid {
        Valid::AtLeast(min) => (Some(min), None),
        Valid::Between(min, max) => (Some(min), Some(max)),
        Valid::LevelOr(exact, _, _) if n == exact => return Ok(()),
        Valid::LevelOr(_, min, max) => (Some(min), Some(max)),
        _ => (None, None),
    };
    if let Some(min) = min.filter(|m| n < *m) {
        return Err(invalid(name, value, format!("Value must be at least {min}")));
    }
    if let Some(max) = max.filter(|m| n > *m) {
        return Err(invalid(name, value, format!("Value must be no more than {max}")));
    }
    Ok(())
}

fn check_throttled(name: &str, value: &str, items: &[&str]) -> Result<(), String> {
    if items == ["*"] {
        return Ok(());
    }
    let pair = |item: &str| {
        item.split_once(':').is_some_and(|(p, b)| {
            !p.is_empty()
                && !b.is_empty()
                && p.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        })
    };
    if items.iter().all(|i| pair(i)) {
        Ok(())
    } else {
        Err(invalid(
            name,
            value,
            "must be the literal '*' or a list of replicas in the following format: \
             [partitionId]:[brokerId],[partitionId]:[brokerId],...",
        ))
    }
}

/// Validates a whole set of overrides, returning them normalized. A name
/// given twice takes its last value, as Kafka's controller takes a
/// CreateTopics' configs (each value is validated all the same).
pub fn validate_topic_configs<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    defaults: &Defaults,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (name, value) in pairs {
        let value = validate_topic_config(name, value)?;
        out.insert(name.to_owned(), value);
    }
    check_together(
        Configs::new(&BTreeMap::new(), defaults),
        Configs::new(&out, defaults),
    )?;
    Ok(out)
}

/// Where the default of a topic config comes from, in Kafka's order of
/// precedence (its `ConfigSource`s below a topic override).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultSource {
    /// Set at run time for every gateway (IncrementalAlterConfigs on the
    /// default broker resource): Kafka's `DYNAMIC_DEFAULT_BROKER_CONFIG`.
    Cluster,
    /// One of ketch's settings (`topics.max_message_bytes`): Kafka's
    /// `STATIC_BROKER_CONFIG`.
    Settings,
    /// Kafka's default: `DEFAULT_CONFIG`.
    Kafka,
}

/// The broker-level defaults of the topic configs: what a topic without an
/// override of a config gets. Cluster-wide defaults set at run time come
/// first, then ketch's settings, then Kafka's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defaults {
    /// Topic config name → value, from ketch's settings.
    settings: BTreeMap<&'static str, String>,
    /// Topic config name → value, set cluster-wide at run time.
    cluster: BTreeMap<&'static str, String>,
}

impl Defaults {
    /// Kafka's defaults, with `max_message_bytes` (`topics.max_message_bytes`,
    /// Kafka's `message.max.bytes`) as the default of `max.message.bytes`.
    pub fn new(max_message_bytes: i32) -> Self {
        Self {
            settings: BTreeMap::from([("max.message.bytes", max_message_bytes.to_string())]),
            cluster: BTreeMap::new(),
        }
    }

    /// These defaults with `stored` as the cluster-wide ones, by broker
    /// config name (as stored in Redis), and why any stored one was
    /// skipped: a name or value this version does not take (stored by a
    /// newer one) leaves the next default down in effect.
    pub fn with_cluster<K: AsRef<str>, V: AsRef<str>>(
        &self,
        stored: impl IntoIterator<Item = (K, V)>,
    ) -> (Self, Vec<String>) {
        let mut cluster = BTreeMap::new();
        let mut skipped = Vec::new();
        for (name, value) in stored {
            match validate_broker_default(name.as_ref(), value.as_ref()) {
                Ok((def, value)) => {
                    cluster.insert(def.name, value);
                }
                Err(why) => skipped.push(why),
            }
        }
        let defaults = Self {
            settings: self.settings.clone(),
            cluster,
        };
        (defaults, skipped)
    }

    /// The cluster-wide defaults, by broker config name.
    pub fn cluster(&self) -> impl Iterator<Item = (&'static str, &str)> + '_ {
        self.cluster.iter().filter_map(|(name, value)| {
            let broker = topic_config(name)?.broker_synonym?;
            Some((broker, value.as_str()))
        })
    }

    /// The default of the topic config `name` in effect ("" for a name
    /// that is not a topic config): the first of [`Defaults::synonyms`],
    /// looked up without building them (the produce path asks for several
    /// per batch).
    pub fn value(&self, name: &str) -> &str {
        self.cluster
            .get(name)
            .or_else(|| self.settings.get(name))
            .map(String::as_str)
            .or_else(|| topic_config(name).map(|def| def.default))
            .unwrap_or("")
    }

    /// Every default of the topic config `name`, the one in effect first:
    /// its source and value.
    pub fn synonyms(&self, name: &str) -> Vec<(DefaultSource, &str)> {
        let mut out = Vec::new();
        if let Some(value) = self.cluster.get(name) {
            out.push((DefaultSource::Cluster, value.as_str()));
        }
        if let Some(value) = self.settings.get(name) {
            out.push((DefaultSource::Settings, value.as_str()));
        }
        if let Some(def) = topic_config(name) {
            out.push((DefaultSource::Kafka, def.default));
        }
        out
    }
}

/// A topic's configs: its overrides over the broker-level defaults.
#[derive(Debug, Clone, Copy)]
pub struct Configs<'a> {
    pub overrides: &'a BTreeMap<String, String>,
    pub defaults: &'a Defaults,
}

impl<'a> Configs<'a> {
    pub fn new(overrides: &'a BTreeMap<String, String>, defaults: &'a Defaults) -> Self {
        Self { overrides, defaults }
    }

    /// The value of `name` in effect: the override, else the default.
    pub fn get(&self, name: &str) -> &'a str {
        match self.overrides.get(name) {
            Some(value) => value,
            None => self.defaults.value(name),
        }
    }

    /// A numeric config's value (-1 if it is not a number: never for a
    /// stored override or a default, both validated).
    pub fn number(&self, name: &str) -> i64 {
        self.get(name).parse().unwrap_or(-1)
    }

    /// Whether `policy` (`compact` or `delete`) is in `cleanup.policy`.
    pub fn cleans_up_by(&self, policy: &str) -> bool {
        list_items(self.get("cleanup.policy")).contains(&policy)
    }

    /// Whether the topic's sealed segments are copied to its archive:
    /// remote storage on, and not read-only (`remote.log.copy.disable`,
    /// Kafka's read-only remote log).
    pub fn copies_to_archive(&self) -> bool {
        self.get("remote.storage.enable") == "true" && self.get("remote.log.copy.disable") != "true"
    }
}

/// Kafka's checks across configs (`LogConfig.validateValues` and the
/// remote storage rules), on the overrides a topic would have after a
/// change; `before` are its overrides now (empty for a new topic).
pub fn check_together(before: Configs<'_>, after: Configs<'_>) -> Result<(), String> {
    let min_lag = after.number("min.compaction.lag.ms");
    let max_lag = after.number("max.compaction.lag.ms");
    if min_lag > max_lag {
        return Err(format!(
            "conflict topic config setting min.compaction.lag.ms ({min_lag}) > max.compaction.lag.ms ({max_lag})"
        ));
    }
    let remote = after.get("remote.storage.enable") == "true";
    if !remote {
        if before.get("remote.storage.enable") == "true"
            && after.get("remote.log.delete.on.disable") != "true"
        {
            return Err(
                "It is invalid to disable remote storage without deleting remote data. \
                 If you want to keep the remote data and turn to read only, please set \
                 `remote.storage.enable=true,remote.log.copy.disable=true`. If you want to disable \
                 remote storage and delete all remote data, please set \
                 `remote.storage.enable=false,remote.log.delete.on.disable=true`."
                    .to_owned(),
            );
        }
        return Ok(());
    }
    if after.cleans_up_by("compact") {
        return Err("Remote log storage is unsupported for the compacted topics".to_owned());
    }
    if after.get("remote.log.copy.disable") == "true" {
        for what in ["bytes", "ms"] {
            let local = after.number(&format!("local.retention.{what}"));
            if local != -2 && local != after.number(&format!("retention.{what}")) {
                return Err(format!(
                    "When `remote.log.copy.disable` is set to true, the `local.retention.{what}` and \
                     `retention.{what}` must be set to the identical value because there will be no \
                     more logs copied to the remote storage."
                ));
            }
        }
    }
    for what in ["bytes", "ms"] {
        let retention = after.number(&format!("retention.{what}"));
        let local_name = format!("local.retention.{what}");
        let local = after.number(&local_name);
        if retention > -1 && local != -2 {
            if local == -1 {
                return Err(invalid(
                    &local_name,
                    "-1",
                    format!("Value must not be -1 as retention.{what} value is set as {retention}."),
                ));
            }
            if local > retention {
                return Err(invalid(
                    &local_name,
                    &local.to_string(),
                    format!("Value must not be more than retention.{what} property value: {retention}"),
                ));
            }
        }
    }
    Ok(())
}

/// Checks cluster-wide defaults (`defaults`: the topic configs they give a
/// topic without overrides) as Kafka's dynamic broker config validation
/// does whatever the topics (`DynamicLogConfig.validateReconfiguration`):
/// `log.local.retention.*` within `log.retention.*`, so that turning remote
/// storage on for a topic cannot fail on a default nobody set on it.
pub fn check_local_retention_defaults(defaults: Configs<'_>) -> Result<(), String> {
    for what in ["bytes", "ms"] {
        let retention = defaults.number(&format!("retention.{what}"));
        let local = defaults.number(&format!("local.retention.{what}"));
        let (local_name, retention_name) = if what == "ms" {
            ("log.local.retention.ms", "log.retention.ms")
        } else {
            ("log.local.retention.bytes", "log.retention.bytes")
        };
        if retention > -1 && local != -2 {
            if local == -1 {
                return Err(invalid(
                    local_name,
                    "-1",
                    format!("Value must not be -1 as {retention_name} value is set as {retention}."),
                ));
            }
            if local > retention {
                return Err(invalid(
                    local_name,
                    &local.to_string(),
                    format!("Value must not be more than {retention_name} property value: {retention}"),
                ));
            }
        }
    }
    Ok(())
}

/// A valid value of a config that ketch accepts (other than its default
/// where it can) and an invalid one, both derived from its definition: the
/// table the tests of every config are driven by.
pub fn example_values(def: &ConfigDef) -> (String, String) {
    let valid = match (def.kind, def.valid) {
        (ConfigType::Boolean, _) => if def.default == "true" { "false" } else { "true" }.to_owned(),
        (_, Valid::AtLeast(min)) => min.to_string(),
        (_, Valid::Between(_, max)) => max.to_string(),
        (_, Valid::LevelOr(_, min, _)) => min.to_string(),
        (_, Valid::Fraction(..)) => "0.25".to_owned(),
        // The empty list: valid beside every other example (compact would
        // not be, beside remote.storage.enable=true).
        (_, Valid::ListOf(_)) => String::new(),
        (_, Valid::OneOf(choices)) => choices
            .iter()
            .find(|c| **c != def.default)
            .unwrap_or(&def.default)
            .to_string(),
        (_, Valid::ThrottledReplicas) => "0:1,1:2".to_owned(),
        (_, Valid::Any) => "0".to_owned(),
    };
    let invalid = match def.valid {
        Valid::AtLeast(min) => (min - 1).to_string(),
        Valid::Between(_, max) | Valid::LevelOr(_, _, max) => (max + 1).to_string(),
        Valid::Fraction(..) => "1.5".to_owned(),
        Valid::ThrottledReplicas => "0-1".to_owned(),
        _ => "nonsense".to_owned(),
    };
    (valid, invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_is_valid_and_the_list_is_sorted() {
        for def in TOPIC_CONFIGS {
            assert_eq!(
                parse(def, def.name, def.default).as_deref(),
                Ok(def.default),
                "{}",
                def.name
            );
        }
        let names: Vec<_> = TOPIC_CONFIGS.iter().map(|d| d.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
    }

    #[test]
    fn unknown_and_invalid_values_are_rejected_with_kafkas_messages() {
        assert_eq!(
            validate_topic_config("retention.msx", "1").unwrap_err(),
            "Unknown topic config name: retention.msx"
        );
        assert_eq!(
            validate_topic_config("retention.ms", "soon").unwrap_err(),
            "Invalid value soon for configuration retention.ms: Not a number of type LONG"
        );
        assert_eq!(
            validate_topic_config("retention.ms", "-5").unwrap_err(),
            "Invalid value -5 for configuration retention.ms: Value must be at least -1"
        );
        assert!(validate_topic_config("max.message.bytes", "99999999999").is_err());
        assert_eq!(
            validate_topic_config("cleanup.policy", "delete,forever").unwrap_err(),
            "Invalid value forever for configuration cleanup.policy: String must be one of: compact, delete"
        );
        assert_eq!(
            validate_topic_config("cleanup.policy", "compact, delete").unwrap(),
            "compact,delete"
        );
        assert_eq!(
            validate_topic_config("remote.storage.enable", "TRUE").unwrap(),
            "true"
        );
        assert!(validate_topic_config("message.timestamp.type", "createtime").is_err());
        assert_eq!(
            validate_topic_configs(
                [("retention.ms", "1"), ("retention.ms", "2")],
                &Defaults::default()
            )
            .unwrap()["retention.ms"],
            "2"
        );
    }

    #[test]
    fn lists_levels_ratios_and_replica_lists_are_checked_as_kafka_checks_them() {
        assert_eq!(
            validate_topic_config("cleanup.policy", " delete ").unwrap(),
            "delete"
        );
        assert_eq!(validate_topic_config("cleanup.policy", "").unwrap(), "");
        assert_eq!(
            validate_topic_config("compression.gzip.level", "-1").unwrap(),
            "-1"
        );
        assert!(validate_topic_config("compression.gzip.level", "0").is_err());
        assert!(validate_topic_config("compression.gzip.level", "10").is_err());
        assert_eq!(
            validate_topic_config("min.cleanable.dirty.ratio", "0.9").unwrap(),
            "0.9"
        );
        assert!(validate_topic_config("min.cleanable.dirty.ratio", "1.5").is_err());
        assert!(validate_topic_config("min.cleanable.dirty.ratio", "NaN").is_err());
        assert_eq!(
            validate_topic_config("leader.replication.throttled.replicas", "0:1, 1:2").unwrap(),
            "0:1,1:2"
        );
        assert_eq!(
            validate_topic_config("follower.replication.throttled.replicas", "*").unwrap(),
            "*"
        );
        assert!(validate_topic_config("follower.replication.throttled.replicas", "0:x").is_err());
        assert!(validate_topic_config("follower.replication.throttled.replicas", "*,0:1").is_err());
    }

    #[test]
    fn every_config_has_a_valid_and_an_invalid_example_that_pass_together() {
        let mut all = Vec::new();
        for def in TOPIC_CONFIGS {
            let (valid, invalid) = example_values(def);
            assert_eq!(
                validate_topic_config(def.name, &valid),
                Ok(valid.clone()),
                "{}",
                def.name
            );
            assert!(
                validate_topic_config(def.name, &invalid).is_err(),
                "{} {invalid}",
                def.name
            );
            all.push((def.name, valid));
        }
        validate_topic_configs(all.iter().map(|(k, v)| (*k, v.as_str())), &Defaults::default()).unwrap();
    }

    #[test]
    fn the_configuration_guide_lists_every_config() {
        let guide = include_str!("../../docs/configuration.md");
        for def in TOPIC_CONFIGS {
            assert!(
                guide.contains(&format!("| `{}` |", def.name)),
                "docs/configuration.md does not list {}",
                def.name
            );
        }
    }

    #[test]
    fn configs_are_also_checked_together() {
        let set = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let defaults = Defaults::default();
        let none = BTreeMap::new();
        let check = |before: &BTreeMap<String, String>, after: &BTreeMap<String, String>| {
            check_together(Configs::new(before, &defaults), Configs::new(after, &defaults))
        };
        let lag = set(&[("min.compaction.lag.ms", "10"), ("max.compaction.lag.ms", "5")]);
        assert!(check(&none, &lag).unwrap_err().contains("conflict"));
        let local = set(&[
            ("remote.storage.enable", "true"),
            ("retention.bytes", "100"),
            ("local.retention.bytes", "200"),
        ]);
        assert_eq!(
            check(&none, &local).unwrap_err(),
            "Invalid value 200 for configuration local.retention.bytes: Value must not be more than retention.bytes property value: 100"
        );
        let remote = set(&[("remote.storage.enable", "true")]);
        assert!(check(&none, &remote).is_ok());
        let read_only = set(&[
            ("remote.storage.enable", "true"),
            ("remote.log.copy.disable", "true"),
            ("local.retention.bytes", "0"),
        ]);
        assert!(
            check(&remote, &read_only)
                .unwrap_err()
                .contains("must be set to the identical value")
        );
        let read_only = set(&[
            ("remote.storage.enable", "true"),
            ("remote.log.copy.disable", "true"),
        ]);
        assert!(check(&remote, &read_only).is_ok());
        assert!(
            check(&remote, &none)
                .unwrap_err()
                .contains("invalid to disable remote storage")
        );
        let dropped = set(&[("remote.log.delete.on.disable", "true")]);
        assert!(
            check(&remote, &dropped).is_ok(),
            "turned off with the archive deleted"
        );
    }

    #[test]
    fn cluster_defaults_sit_between_overrides_and_the_settings_and_kafkas_defaults() {
        let base = Defaults::new(2_000_000);
        assert_eq!(base.value("max.message.bytes"), "2000000");
        assert_eq!(base.value("retention.ms"), "604800000");
        let (defaults, skipped) = base.with_cluster([
            ("log.retention.ms", "1000"),
            ("message.max.bytes", "3000000"),
            ("log.cleanup.policy", "compact, delete"),
            ("log.retention.hours", "1"),
            ("log.segment.bytes", "soon"),
        ]);
        assert_eq!(
            skipped,
            [
                "Unknown dynamic broker config: log.retention.hours",
                "Invalid value soon for configuration log.segment.bytes: Not a number of type INT",
            ]
        );
        assert_eq!(defaults.value("retention.ms"), "1000");
        assert_eq!(defaults.value("cleanup.policy"), "compact,delete");
        assert_eq!(
            defaults.synonyms("max.message.bytes"),
            [
                (DefaultSource::Cluster, "3000000"),
                (DefaultSource::Settings, "2000000"),
                (DefaultSource::Kafka, "1048588"),
            ]
        );
        assert_eq!(
            defaults.cluster().collect::<Vec<_>>(),
            [
                ("log.cleanup.policy", "compact,delete"),
                ("message.max.bytes", "3000000"),
                ("log.retention.ms", "1000"),
            ]
        );
        let overrides = BTreeMap::from([("retention.ms".to_owned(), "5".to_owned())]);
        let configs = Configs::new(&overrides, &defaults);
        assert_eq!(configs.number("retention.ms"), 5);
        assert_eq!(configs.number("segment.bytes"), 1073741824);
        assert!(configs.cleans_up_by("compact"));
        // A compacting default makes a remote storage topic invalid.
        let remote = BTreeMap::from([("remote.storage.enable".to_owned(), "true".to_owned())]);
        assert_eq!(
            check_together(Configs::new(&remote, &base), Configs::new(&remote, &defaults)).unwrap_err(),
            "Remote log storage is unsupported for the compacted topics"
        );
        assert_eq!(
            validate_broker_default("log.segment.bytes", "13").unwrap_err(),
            "Invalid value 13 for configuration log.segment.bytes: Value must be at least 14"
        );
        assert_eq!(defaulted_by("log.roll.ms").map(|d| d.name), Some("segment.ms"));
        assert!(defaulted_by("remote.storage.enable").is_none());
    }
}
