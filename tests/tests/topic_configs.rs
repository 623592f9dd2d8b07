//! Topic configs as Kafka tools use them: every Kafka 4.x topic config
//! accepted with a valid value and refused with an invalid one (driven by
//! ketch's one table of them), IncrementalAlterConfigs and AlterConfigs
//! with their errors, a change seen by a second gateway, DescribeConfigs
//! synonyms and documentation, and the CreateTime timestamp bounds.
//!
//! Raw protocol where a test needs one request to reach a chosen gateway or
//! to read fields rdkafka does not expose (record_errors, synonyms).

use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_configs_request;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, ProduceResponse,
};
use kafka_protocol::protocol::StrBytes;
use ketch_config::topic::{TOPIC_CONFIGS, example_values};
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, admin_options, runtime, unique_topic};
use rdkafka::admin::{AlterConfig, ConfigSource, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::error::RDKafkaErrorCode;

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

const SET: i8 = 0;
const DELETE: i8 = 1;
const APPEND: i8 = 2;
const SUBTRACT: i8 = 3;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

fn op(name: &str, operation: i8, value: Option<&str>) -> AlterableConfig {
    AlterableConfig::default()
        .with_name(s(name))
        .with_config_operation(operation)
        .with_value(value.map(s))
}

fn resource(resource_type: i8, name: &str, configs: Vec<AlterableConfig>) -> AlterConfigsResource {
    AlterConfigsResource::default()
        .with_resource_type(resource_type)
        .with_resource_name(s(name))
        .with_configs(configs)
}

/// (error code, message) of each resource of one IncrementalAlterConfigs.
fn incremental(
    conn: &mut KafkaConn,
    resources: Vec<AlterConfigsResource>,
    validate_only: bool,
) -> Vec<(i16, String)> {
    let response: IncrementalAlterConfigsResponse = conn.request(
        1,
        &IncrementalAlterConfigsRequest::default()
            .with_resources(resources)
            .with_validate_only(validate_only),
    );
    response
        .responses
        .iter()
        .map(|r| {
            (
                r.error_code,
                r.error_message.as_deref().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// One topic's configs through DescribeConfigs v4 with synonyms and docs.
fn describe(conn: &mut KafkaConn, resource_type: i8, name: &str) -> DescribeConfigsResponse {
    conn.request(
        4,
        &DescribeConfigsRequest::default()
            .with_include_synonyms(true)
            .with_include_documentation(true)
            .with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(resource_type)
                    .with_resource_name(s(name))
                    .with_configuration_keys(None),
            ]),
    )
}

/// The value and source of one config of a DescribeConfigs answer.
fn value_of(response: &DescribeConfigsResponse, name: &str) -> (String, i8) {
    let result = &response.results[0];
    assert_eq!(result.error_code, code::NONE, "{:?}", result.error_message);
    let config = result
        .configs
        .iter()
        .find(|c| c.name.as_str() == name)
        .unwrap_or_else(|| panic!("{name} described"));
    (
        config.value.as_deref().unwrap_or_default().to_owned(),
        config.config_source,
    )
}

#[test]
fn every_kafka_topic_config_is_accepted_with_a_valid_value_and_refused_with_an_invalid_one() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "topics.auto_create=false"]);
    let rt = runtime();
    let valid_topic = unique_topic("every-config");
    let valid: Vec<(&str, String)> = TOPIC_CONFIGS
        .iter()
        .map(|def| (def.name, example_values(def).0))
        .collect();
    let mut all_valid = NewTopic::new(&valid_topic, 1, TopicReplication::Fixed(1));
    for (name, value) in &valid {
        all_valid = all_valid.set(name, value);
    }
    let invalid: Vec<(String, &str, String)> = TOPIC_CONFIGS
        .iter()
        .enumerate()
        .map(|(i, def)| (format!("{valid_topic}-bad-{i}"), def.name, example_values(def).1))
        .collect();
    let mut topics = vec![all_valid];
    for (topic, name, value) in &invalid {
        topics.push(NewTopic::new(topic, 1, TopicReplication::Fixed(1)).set(name, value));
    }
    let results = rt
        .block_on(ketch.admin().create_topics(&topics, &admin_options()))
        .expect("CreateTopics");
    assert_eq!(
        results[0],
        Ok(valid_topic.clone()),
        "every config with a valid value"
    );
    for ((topic, name, value), result) in invalid.iter().zip(&results[1..]) {
        assert_eq!(
            result,
            &Err((topic.clone(), RDKafkaErrorCode::InvalidConfig)),
            "{name}={value} must be refused"
        );
    }

    // Each is stored and described as a topic override.
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let described = describe(&mut conn, RESOURCE_TOPIC, &valid_topic);
    for (name, value) in &valid {
        assert_eq!(value_of(&described, name), (value.clone(), 1), "{name}");
    }
    assert_eq!(
        described.results[0].configs.len(),
        TOPIC_CONFIGS.len(),
        "every topic config is described"
    );
    // None of the refused topics exists.
    let names: Vec<String> = invalid.iter().map(|(t, ..)| t.clone()).collect();
    let metadata =
        rdkafka::consumer::Consumer::fetch_metadata(&ketch.consumer(), None, Duration::from_secs(10))
            .expect("metadata");
    assert!(
        !metadata
            .topics()
            .iter()
            .any(|t| names.contains(&t.name().to_owned())),
        "a refused topic was created"
    );
}

#[test]
fn incremental_alter_configs_through_one_gateway_is_seen_by_another() {
    let redis = TestRedis::start();
    let a = Ketch::start(&redis.url(), &["--node-id", "1"]);
    let b = Ketch::start(&redis.url(), &["--node-id", "2"]);
    let topic = unique_topic("altered");
    let mut on_a = KafkaConn::connect(a.kafka_addr());
    let mut on_b = KafkaConn::connect(b.kafka_addr());
    assert_eq!(raw::create_topic(&mut on_a, &topic, 1), code::NONE);
    let big = || batch::encode(&[Record::value(ketch_now(), &[7u8; 3000])]);
    // B has the topic cached with the default limit.
    assert_eq!(raw::produce(&mut on_b, &topic, 0, big()).0, code::NONE);

    let limit = || {
        resource(
            RESOURCE_TOPIC,
            &topic,
            vec![op("max.message.bytes", SET, Some("2000"))],
        )
    };
    assert_eq!(incremental(&mut on_a, vec![limit()], true), [(0, String::new())]);
    assert_eq!(
        value_of(&describe(&mut on_a, RESOURCE_TOPIC, &topic), "max.message.bytes").1,
        4,
        "validate_only changed nothing (the broker default is still in effect)"
    );
    assert_eq!(raw::produce(&mut on_b, &topic, 0, big()).0, code::NONE);

    assert_eq!(incremental(&mut on_a, vec![limit()], false), [(0, String::new())]);
    let altered = Instant::now();
    loop {
        let (error, _) = raw::produce(&mut on_b, &topic, 0, big());
        if error == code::MESSAGE_TOO_LARGE {
            break;
        }
        assert_eq!(error, code::NONE);
        assert!(
            altered.elapsed() < Duration::from_secs(5),
            "gateway B never applied the new max.message.bytes"
        );
    }
    println!("gateway B applied the change after {:?}", altered.elapsed());
    assert_eq!(
        value_of(&describe(&mut on_b, RESOURCE_TOPIC, &topic), "max.message.bytes"),
        ("2000".to_owned(), 1)
    );
    assert!(a.logs("topic configs changed"), "no audit line:\n{}", a.output());

    // APPEND and SUBTRACT edit a list; DELETE brings the default back.
    let edits = vec![
        op("leader.replication.throttled.replicas", APPEND, Some("0:1,0:2")),
        op("retention.ms", SET, Some("3600000")),
    ];
    assert_eq!(
        incremental(&mut on_b, vec![resource(RESOURCE_TOPIC, &topic, edits)], false),
        [(0, String::new())]
    );
    let edits = vec![
        op("leader.replication.throttled.replicas", SUBTRACT, Some("0:1")),
        op("max.message.bytes", DELETE, None),
    ];
    assert_eq!(
        incremental(&mut on_a, vec![resource(RESOURCE_TOPIC, &topic, edits)], false),
        [(0, String::new())]
    );
    let described = describe(&mut on_a, RESOURCE_TOPIC, &topic);
    assert_eq!(
        value_of(&described, "leader.replication.throttled.replicas"),
        ("0:2".to_owned(), 1)
    );
    assert_eq!(value_of(&described, "retention.ms"), ("3600000".to_owned(), 1));
    assert_eq!(value_of(&described, "max.message.bytes").1, 4);
    let restored = Instant::now();
    while raw::produce(&mut on_b, &topic, 0, big()).0 == code::MESSAGE_TOO_LARGE {
        assert!(
            restored.elapsed() < Duration::from_secs(5),
            "gateway B kept the deleted override"
        );
    }
}

#[test]
fn bad_alterations_fail_whole_and_change_nothing() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "topics.auto_create=false"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("bad-alter");
    let other = unique_topic("bad-alter-other");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    assert_eq!(raw::create_topic(&mut conn, &other, 1), code::NONE);

    let answers = incremental(
        &mut conn,
        vec![
            // A good change beside a bad one: neither is applied.
            resource(
                RESOURCE_TOPIC,
                &topic,
                vec![
                    op("segment.ms", SET, Some("10000")),
                    op("retention.ms", SET, Some("-5")),
                ],
            ),
            resource(
                RESOURCE_TOPIC,
                &other,
                vec![op("retention.ms", APPEND, Some("5"))],
            ),
            resource(
                RESOURCE_TOPIC,
                "no-such-topic",
                vec![op("retention.ms", SET, Some("1"))],
            ),
            // A bad value for a topic that does not exist: Kafka checks
            // the value first.
            resource(
                RESOURCE_TOPIC,
                "no-such-topic-either",
                vec![op("retention.ms", SET, Some("-5"))],
            ),
            resource(
                RESOURCE_BROKER,
                "",
                vec![op("auto.create.topics.enable", SET, Some("true"))],
            ),
            resource(9, "x", vec![]),
            // The default topic resource does not exist.
            resource(RESOURCE_TOPIC, "", vec![op("retention.ms", SET, Some("1"))]),
        ],
        false,
    );
    assert_eq!(answers[0].0, code::INVALID_CONFIG);
    assert_eq!(
        answers[0].1,
        "Invalid value -5 for configuration retention.ms: Value must be at least -1"
    );
    assert_eq!(
        answers[1],
        (
            code::INVALID_CONFIG,
            "Config value append is not allowed for config key: retention.ms".to_owned()
        )
    );
    assert_eq!(answers[2].0, code::UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(answers[3].0, code::INVALID_CONFIG, "{answers:?}");
    assert_eq!(answers[4].0, code::INVALID_REQUEST);
    assert!(
        answers[4]
            .1
            .contains("Cannot update these configs dynamically: auto.create.topics.enable")
    );
    assert_eq!(answers[5].0, code::INVALID_REQUEST);
    assert_eq!(
        answers[6],
        (
            code::INVALID_REQUEST,
            "Default topic resources are not allowed.".to_owned()
        )
    );
    let described = describe(&mut conn, RESOURCE_TOPIC, &topic);
    assert_eq!(value_of(&described, "segment.ms"), ("604800000".to_owned(), 5));

    // Duplicate keys, a resource named twice, and unknown names.
    let duplicate_keys = resource(
        RESOURCE_TOPIC,
        &topic,
        vec![
            op("retention.ms", SET, Some("1")),
            op("retention.ms", DELETE, None),
        ],
    );
    assert_eq!(
        incremental(&mut conn, vec![duplicate_keys], false),
        [(
            code::INVALID_REQUEST,
            "Error due to duplicate config keys".to_owned()
        )]
    );
    let twice = || resource(RESOURCE_TOPIC, &other, vec![op("retention.ms", SET, Some("1"))]);
    let answers = incremental(&mut conn, vec![twice(), twice()], false);
    assert!(
        answers.iter().all(|(code, _)| *code == code::INVALID_REQUEST),
        "{answers:?}"
    );
    let answers = incremental(
        &mut conn,
        vec![resource(
            RESOURCE_TOPIC,
            &topic,
            vec![op("retention.msx", SET, Some("1"))],
        )],
        false,
    );
    assert_eq!(
        answers[0],
        (
            code::INVALID_CONFIG,
            "Unknown topic config name: retention.msx".to_owned()
        )
    );
    let described = describe(&mut conn, RESOURCE_TOPIC, &other);
    assert_eq!(value_of(&described, "retention.ms").1, 5, "nothing was stored");
    // Deleting a name that is no config changes nothing and is no error
    // (Kafka validates the configs left); set beside it, a change holds.
    let answers = incremental(
        &mut conn,
        vec![resource(
            RESOURCE_TOPIC,
            &other,
            vec![
                op("retention.msx", DELETE, None),
                op("retention.ms", SET, Some("70000")),
            ],
        )],
        false,
    );
    assert_eq!(answers, [(code::NONE, String::new())]);
    let described = describe(&mut conn, RESOURCE_TOPIC, &other);
    assert_eq!(value_of(&described, "retention.ms"), ("70000".to_owned(), 1));

    // Remote storage may be turned on for a running topic, and off again
    // only with its archive deleted (tiering.rs turns it off).
    let remote = |value: &str| {
        incremental(
            &mut KafkaConn::connect(ketch.kafka_addr()),
            vec![resource(
                RESOURCE_TOPIC,
                &topic,
                vec![op("remote.storage.enable", SET, Some(value))],
            )],
            false,
        )
    };
    // Kafka's rule: no remote storage for a compacted topic.
    let both = incremental(
        &mut conn,
        vec![resource(
            RESOURCE_TOPIC,
            &topic,
            vec![
                op("cleanup.policy", SET, Some("compact")),
                op("remote.storage.enable", SET, Some("true")),
            ],
        )],
        false,
    );
    assert_eq!(
        both,
        [(
            code::INVALID_CONFIG,
            "Remote log storage is unsupported for the compacted topics".to_owned()
        )]
    );
    assert_eq!(remote("true"), [(0, String::new())]);
    let refused = remote("false");
    assert_eq!(refused[0].0, code::INVALID_CONFIG);
    assert!(
        refused[0].1.contains("invalid to disable remote storage"),
        "{refused:?}"
    );
}

#[test]
fn legacy_alter_configs_replaces_every_override() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let rt = runtime();
    let topic = unique_topic("legacy-alter");
    ketch.create_topic_with(
        &rt,
        &topic,
        1,
        &[("retention.ms", "1000"), ("segment.ms", "5000")],
    );
    let alter = AlterConfig::new(ResourceSpecifier::Topic(&topic)).set("max.message.bytes", "4096");
    rt.block_on(ketch.admin().alter_configs([&alter], &admin_options()))
        .expect("AlterConfigs");
    let described = rt
        .block_on(
            ketch
                .admin()
                .describe_configs([&ResourceSpecifier::Topic(&topic)], &admin_options()),
        )
        .expect("DescribeConfigs")
        .remove(0)
        .expect("described");
    let max = described.get("max.message.bytes").expect("max.message.bytes");
    assert_eq!(max.value.as_deref(), Some("4096"));
    assert_eq!(max.source, ConfigSource::DynamicTopic);
    for gone in ["retention.ms", "segment.ms"] {
        let entry = described.get(gone).expect(gone);
        assert_eq!(entry.value.as_deref(), Some("604800000"), "{gone}");
        assert_eq!(entry.source, ConfigSource::Default, "{gone}");
    }

    // A bad value anywhere refuses the whole replacement (raw: rdkafka
    // 0.39 reports every AlterConfigs resource as a success).
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let config = |name: &str, value: &str| {
        alter_configs_request::AlterableConfig::default()
            .with_name(s(name))
            .with_value(Some(s(value)))
    };
    let response: AlterConfigsResponse = conn.request(
        2,
        &AlterConfigsRequest::default().with_resources(vec![
            alter_configs_request::AlterConfigsResource::default()
                .with_resource_type(RESOURCE_TOPIC)
                .with_resource_name(s(&topic))
                .with_configs(vec![config("retention.ms", "1"), config("segment.bytes", "1")]),
        ]),
    );
    assert_eq!(response.responses[0].error_code, code::INVALID_CONFIG);
    assert_eq!(
        response.responses[0].error_message.as_deref(),
        Some("Invalid value 1 for configuration segment.bytes: Value must be at least 14")
    );
    let described = describe(&mut conn, RESOURCE_TOPIC, &topic);
    assert_eq!(value_of(&described, "max.message.bytes"), ("4096".to_owned(), 1));
    assert_eq!(value_of(&described, "retention.ms").1, 5);
}

#[test]
fn describe_configs_reports_broker_synonyms_and_what_is_inert() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &["--node-id", "3", "--set", "topics.max_message_bytes=500000"],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("synonyms");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let answers = incremental(
        &mut conn,
        vec![resource(
            RESOURCE_TOPIC,
            &topic,
            vec![op("retention.ms", SET, Some("60000"))],
        )],
        false,
    );
    assert_eq!(answers, [(0, String::new())]);
    let described = describe(&mut conn, RESOURCE_TOPIC, &topic);
    let config = |name: &str| {
        described.results[0]
            .configs
            .iter()
            .find(|c| c.name.as_str() == name)
            .unwrap_or_else(|| panic!("{name}"))
            .clone()
    };
    let synonyms = |name: &str| -> Vec<(String, String, i8)> {
        config(name)
            .synonyms
            .iter()
            .map(|s| {
                (
                    s.name.to_string(),
                    s.value.as_deref().unwrap_or_default().to_owned(),
                    s.source,
                )
            })
            .collect()
    };
    assert_eq!(
        synonyms("retention.ms"),
        [
            ("retention.ms".to_owned(), "60000".to_owned(), 1),
            ("log.retention.ms".to_owned(), "604800000".to_owned(), 5),
        ]
    );
    assert_eq!(
        synonyms("max.message.bytes"),
        [
            ("message.max.bytes".to_owned(), "500000".to_owned(), 4),
            ("message.max.bytes".to_owned(), "1048588".to_owned(), 5),
        ]
    );
    assert_eq!(config("max.message.bytes").config_source, 4);
    let min_isr = config("min.insync.replicas");
    assert_eq!(min_isr.value.as_deref(), Some("1"));
    assert!(
        min_isr
            .documentation
            .as_deref()
            .unwrap_or_default()
            .contains("inert"),
        "{min_isr:?}"
    );
    assert!(
        min_isr
            .documentation
            .as_deref()
            .unwrap_or_default()
            .contains("storage.acks_all_replicas")
    );
    assert_eq!(config("min.cleanable.dirty.ratio").config_type, 6, "DOUBLE");
    assert_eq!(config("cleanup.policy").config_type, 7, "LIST");

    // The broker lists the defaults tools read.
    let broker = describe(&mut conn, RESOURCE_BROKER, "3");
    assert_eq!(value_of(&broker, "log.retention.ms"), ("604800000".to_owned(), 5));
    assert_eq!(value_of(&broker, "message.max.bytes"), ("500000".to_owned(), 4));
    assert_eq!(value_of(&broker, "min.insync.replicas"), ("1".to_owned(), 5));
    assert_eq!(
        value_of(&broker, "default.replication.factor"),
        ("1".to_owned(), 4)
    );

    // Keys named pick configs; an empty key list, like none, asks for all.
    let mut keyed = |keys: &[&str]| -> Vec<String> {
        let response: DescribeConfigsResponse = conn.request(
            4,
            &DescribeConfigsRequest::default().with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(RESOURCE_TOPIC)
                    .with_resource_name(s(&topic))
                    .with_configuration_keys(Some(keys.iter().map(|k| s(k)).collect())),
            ]),
        );
        assert_eq!(response.results[0].error_code, code::NONE);
        response.results[0]
            .configs
            .iter()
            .map(|c| c.name.to_string())
            .collect()
    };
    assert_eq!(keyed(&["retention.ms"]), ["retention.ms"]);
    assert_eq!(keyed(&[]).len(), described.results[0].configs.len());
}

/// The gateway's clock as the tests see it (same machine).
fn ketch_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

#[test]
fn timestamps_outside_the_topics_bounds_are_refused_per_record() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("timestamps");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let hour = 3_600_000;
    let now = ketch_now();
    let records = [
        Record::value(now, b"fine"),
        Record::value(now + 2 * hour, b"two hours ahead"),
        Record::value(now - 1000, b"fine too"),
        Record::value(now + 3 * hour, b"three hours ahead"),
    ];
    let produce = |conn: &mut KafkaConn| -> ProduceResponse {
        conn.request(
            raw::PRODUCE_VERSION,
            &raw::produce_request(&topic, 0, batch::encode(&records)),
        )
    };
    // Kafka 4.x's default: at most an hour ahead.
    let response = produce(&mut conn);
    let partition = &response.responses[0].partition_responses[0];
    assert_eq!(partition.error_code, code::INVALID_TIMESTAMP);
    assert_eq!(
        partition.error_message.as_deref(),
        Some("One or more records have been rejected due to invalid timestamp")
    );
    let indexes: Vec<i32> = partition.record_errors.iter().map(|e| e.batch_index).collect();
    assert_eq!(indexes, [1, 3]);
    let message = partition.record_errors[0]
        .batch_index_error_message
        .as_deref()
        .unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "Timestamp {} of message with offset 1 is out of range",
            now + 2 * hour
        )),
        "{message}"
    );
    assert_eq!(raw::list_offsets(&mut conn, &topic, 0, -1).1, 0, "nothing stored");

    // Four hours ahead allowed, a minute behind not.
    let answers = incremental(
        &mut conn,
        vec![resource(
            RESOURCE_TOPIC,
            &topic,
            vec![
                op(
                    "message.timestamp.after.max.ms",
                    SET,
                    Some(&(4 * hour).to_string()),
                ),
                op("message.timestamp.before.max.ms", SET, Some("60000")),
            ],
        )],
        false,
    );
    assert_eq!(answers, [(0, String::new())]);
    let response = produce(&mut conn);
    assert_eq!(raw::produce_result(&response), (code::NONE, 0));
    let old = batch::encode(&[Record::value(now - hour, b"an hour old")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, old).0, code::INVALID_TIMESTAMP);

    // LogAppendTime replaces the producer's timestamps: no bounds apply.
    let answers = incremental(
        &mut conn,
        vec![resource(
            RESOURCE_TOPIC,
            &topic,
            vec![op("message.timestamp.type", SET, Some("LogAppendTime"))],
        )],
        false,
    );
    assert_eq!(answers, [(0, String::new())]);
    let old = batch::encode(&[Record::value(now - hour, b"an hour old")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, old).0, code::NONE);
}

/// The names, values and sources DescribeConfigs of the default broker
/// resource lists: the cluster-wide defaults set at run time.
fn cluster_defaults(conn: &mut KafkaConn) -> Vec<(String, String, i8)> {
    let described = describe(conn, RESOURCE_BROKER, "");
    assert_eq!(described.results[0].error_code, code::NONE);
    described.results[0]
        .configs
        .iter()
        .map(|c| {
            (
                c.name.to_string(),
                c.value.as_deref().unwrap_or_default().to_owned(),
                c.config_source,
            )
        })
        .collect()
}

#[test]
fn cluster_wide_topic_defaults_apply_to_every_topic_and_gateway() {
    let redis = TestRedis::start();
    let worker = ["--set", "tiering.tick_interval=100ms"];
    let a = Ketch::start(&redis.url(), &[&["--node-id", "1"][..], &worker].concat());
    let b = Ketch::start(&redis.url(), &[&["--node-id", "2"][..], &worker].concat());
    let mut on_a = KafkaConn::connect(a.kafka_addr());
    let mut on_b = KafkaConn::connect(b.kafka_addr());
    let plain = unique_topic("defaulted");
    let own = unique_topic("overridden");
    assert_eq!(raw::create_topic(&mut on_a, &plain, 1), code::NONE);
    // Overrides from the start: a gateway may use a topic record up to half
    // a second old, and this test is faster than that.
    a.create_topic_with(
        &runtime(),
        &own,
        1,
        &[
            ("max.message.bytes", "100000"),
            ("min.compaction.lag.ms", "100000"),
        ],
    );
    let big = || batch::encode(&[Record::value(ketch_now(), &[7u8; 3000])]);
    assert_eq!(raw::produce(&mut on_b, &plain, 0, big()).0, code::NONE);
    assert!(cluster_defaults(&mut on_b).is_empty());

    let limit = || {
        resource(
            RESOURCE_BROKER,
            "",
            vec![op("message.max.bytes", SET, Some("2000"))],
        )
    };
    assert_eq!(incremental(&mut on_a, vec![limit()], true), [(0, String::new())]);
    assert!(
        cluster_defaults(&mut on_b).is_empty(),
        "validate_only stores nothing"
    );
    assert_eq!(raw::produce(&mut on_b, &plain, 0, big()).0, code::NONE);

    // Set through A, applied by B without a request to it in between.
    assert_eq!(incremental(&mut on_a, vec![limit()], false), [(0, String::new())]);
    let set = Instant::now();
    loop {
        let (error, _) = raw::produce(&mut on_b, &plain, 0, big());
        if error == code::MESSAGE_TOO_LARGE {
            break;
        }
        assert_eq!(error, code::NONE);
        assert!(
            set.elapsed() < Duration::from_secs(3),
            "gateway B never applied the cluster-wide message.max.bytes"
        );
    }
    println!(
        "gateway B applied the cluster-wide default after {:?}",
        set.elapsed()
    );
    assert_eq!(
        raw::produce(&mut on_b, &own, 0, big()).0,
        code::NONE,
        "a topic's override wins over the cluster-wide default"
    );
    assert!(a.logs("broker configs changed"), "no audit line");
    assert_eq!(
        cluster_defaults(&mut on_b),
        [("message.max.bytes".to_owned(), "2000".to_owned(), 3)]
    );
    let topic = describe(&mut on_b, RESOURCE_TOPIC, &plain);
    assert_eq!(value_of(&topic, "max.message.bytes"), ("2000".to_owned(), 3));
    let synonyms: Vec<i8> = topic.results[0]
        .configs
        .iter()
        .find(|c| c.name.as_str() == "max.message.bytes")
        .unwrap()
        .synonyms
        .iter()
        .map(|s| s.source)
        .collect();
    assert_eq!(
        synonyms,
        [3, 4, 5],
        "cluster default, ketch setting, Kafka default"
    );
    let broker = describe(&mut on_b, RESOURCE_BROKER, "2");
    assert_eq!(value_of(&broker, "message.max.bytes"), ("2000".to_owned(), 3));

    // Refused: one broker alone, a config that is not dynamic, a bad
    // value, and a default that would make a topic's configs invalid.
    let answers = incremental(
        &mut on_a,
        vec![
            resource(
                RESOURCE_BROKER,
                "1",
                vec![op("log.retention.ms", SET, Some("1000"))],
            ),
            resource(
                RESOURCE_BROKER,
                "",
                vec![op("log.retention.hours", SET, Some("1"))],
            ),
        ],
        false,
    );
    assert_eq!(answers[0].0, code::INVALID_REQUEST);
    assert!(
        answers[0].1.contains("topic defaults are cluster-wide"),
        "{}",
        answers[0].1
    );
    assert_eq!(answers[1].0, code::INVALID_REQUEST);
    assert!(
        answers[1]
            .1
            .contains("Cannot update these configs dynamically: log.retention.hours"),
        "{}",
        answers[1].1
    );
    let bad = |name: &str, value: &str| {
        incremental(
            &mut KafkaConn::connect(a.kafka_addr()),
            vec![resource(
                RESOURCE_BROKER,
                "",
                vec![
                    op("log.retention.ms", SET, Some("1000")),
                    op(name, SET, Some(value)),
                ],
            )],
            false,
        )
        .remove(0)
    };
    // A value refused is INVALID_REQUEST, as Kafka answers for broker
    // configs (KAFKA-13609), where a topic's is INVALID_CONFIG.
    assert_eq!(
        bad("log.segment.bytes", "13"),
        (
            code::INVALID_REQUEST,
            "Invalid value 13 for configuration log.segment.bytes: Value must be at least 14".to_owned()
        )
    );
    assert_eq!(
        bad("log.cleaner.max.compaction.lag.ms", "1000"),
        (
            code::INVALID_REQUEST,
            format!(
                "Topic {own} would be invalid: conflict topic config setting min.compaction.lag.ms \
                 (100000) > max.compaction.lag.ms (1000)"
            )
        )
    );
    assert_eq!(
        cluster_defaults(&mut on_a),
        [("message.max.bytes".to_owned(), "2000".to_owned(), 3)],
        "a refused change stores nothing"
    );

    // The storage worker applies cluster-wide retention and segment
    // defaults to a topic without overrides.
    let edits = vec![
        op("log.roll.ms", SET, Some("100")),
        op("log.retention.ms", SET, Some("1")),
        op("log.cleanup.policy", APPEND, Some("delete")),
    ];
    assert_eq!(
        incremental(&mut on_b, vec![resource(RESOURCE_BROKER, "", edits)], false),
        [(0, String::new())]
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (error, earliest, _) = raw::list_offsets(&mut on_a, &plain, 0, -2);
        assert_eq!(error, code::NONE);
        if earliest > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cluster-wide retention never removed a segment"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The legacy AlterConfigs replaces every cluster-wide default; an empty
    // set removes them all, and the settings apply again.
    let response: AlterConfigsResponse = on_a.request(
        2,
        &AlterConfigsRequest::default().with_resources(vec![
            alter_configs_request::AlterConfigsResource::default()
                .with_resource_type(RESOURCE_BROKER)
                .with_resource_name(s(""))
                .with_configs(Vec::new()),
        ]),
    );
    assert_eq!(response.responses[0].error_code, code::NONE);
    assert!(cluster_defaults(&mut on_a).is_empty());
    let cleared = Instant::now();
    while raw::produce(&mut on_b, &plain, 0, big()).0 == code::MESSAGE_TOO_LARGE {
        assert!(
            cleared.elapsed() < Duration::from_secs(3),
            "gateway B kept the removed default"
        );
    }
    assert_eq!(
        value_of(&describe(&mut on_b, RESOURCE_TOPIC, &plain), "max.message.bytes").1,
        4
    );
}

#[test]
fn list_config_resources_lists_topics_and_the_brokers_clients_see() {
    use kafka_protocol::messages::{ListConfigResourcesRequest, ListConfigResourcesResponse};

    let redis = TestRedis::start();
    let a = Ketch::start(&redis.url(), &["--node-id", "1"]);
    let b = Ketch::start(&redis.url(), &["--node-id", "2"]);
    let mut conn = KafkaConn::connect(a.kafka_addr());
    let topic = unique_topic("listed");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let list = |conn: &mut KafkaConn, version: i16, types: Vec<i8>| -> (i16, Vec<(i8, String)>) {
        let response: ListConfigResourcesResponse = conn.request(
            version,
            &ListConfigResourcesRequest::default().with_resource_types(types),
        );
        let mut resources: Vec<(i8, String)> = response
            .config_resources
            .iter()
            .map(|r| (r.resource_type, r.resource_name.to_string()))
            .collect();
        resources.sort();
        (response.error_code, resources)
    };
    // Both gateways are live: wait until A lists B.
    let deadline = Instant::now() + Duration::from_secs(10);
    let all = loop {
        let (error, all) = list(&mut conn, 1, vec![]);
        assert_eq!(error, code::NONE);
        if all.contains(&(RESOURCE_BROKER, "2".to_owned())) {
            break all;
        }
        assert!(Instant::now() < deadline, "{all:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(all.contains(&(RESOURCE_TOPIC, topic.clone())), "{all:?}");
    assert!(all.contains(&(RESOURCE_BROKER, "1".to_owned())), "{all:?}");
    let (_, topics) = list(&mut KafkaConn::connect(b.kafka_addr()), 1, vec![RESOURCE_TOPIC]);
    assert!(topics.iter().all(|(t, _)| *t == RESOURCE_TOPIC) && topics.contains(&(RESOURCE_TOPIC, topic)));
    assert_eq!(list(&mut conn, 1, vec![9]).0, code::UNSUPPORTED_VERSION);
    // Broker loggers are a type Kafka lists; ketch has none.
    assert_eq!(list(&mut conn, 1, vec![8]), (code::NONE, vec![]));
    assert_eq!(
        list(&mut conn, 0, vec![]),
        (code::NONE, vec![]),
        "no client-metrics subscriptions"
    );
}

/// A cluster-wide `log.local.retention.*` is checked against
/// `log.retention.*` whatever the topics, as Kafka's dynamic broker config
/// validation does: it was accepted when no topic had remote storage, and
/// turning remote storage on for a topic then failed on a config nobody set
/// on it.
#[test]
fn cluster_wide_local_retention_is_checked_against_retention() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let set = |conn: &mut KafkaConn, name: &str, value: &str| {
        incremental(
            conn,
            vec![resource(RESOURCE_BROKER, "", vec![op(name, SET, Some(value))])],
            false,
        )
    };
    let refused = set(&mut conn, "log.local.retention.ms", "-1");
    assert_eq!(refused[0].0, code::INVALID_REQUEST, "{refused:?}");
    assert!(refused[0].1.contains("log.retention.ms"), "{refused:?}");
    assert_eq!(set(&mut conn, "log.local.retention.ms", "5000")[0].0, code::NONE);
    let refused = set(&mut conn, "log.retention.ms", "1000");
    assert_eq!(refused[0].0, code::INVALID_REQUEST, "{refused:?}");
    assert!(
        refused[0]
            .1
            .contains("Value must not be more than log.retention.ms"),
        "{refused:?}"
    );
}

/// An empty cluster-wide `log.cleanup.policy` (clean nothing up) is set,
/// not taken for "back to the default" (`delete`): topics without an
/// override keep their records, and say so.
#[test]
fn an_empty_cluster_wide_cleanup_policy_is_kept_as_empty() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("no-cleanup");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let set = incremental(
        &mut conn,
        vec![resource(
            RESOURCE_BROKER,
            "",
            vec![op("log.cleanup.policy", SET, Some(""))],
        )],
        false,
    );
    assert_eq!(set, vec![(code::NONE, String::new())]);
    let defaults = cluster_defaults(&mut conn);
    assert!(
        defaults
            .iter()
            .any(|(name, value, _)| name == "log.cleanup.policy" && value.is_empty()),
        "{defaults:?}"
    );
    assert_eq!(
        value_of(&describe(&mut conn, RESOURCE_TOPIC, &topic), "cleanup.policy").0,
        ""
    );
    // Nothing is deleted from such a topic (DeleteRecords: POLICY_VIOLATION).
    let record = batch::encode(&[Record::value(batch::at(1), b"kept")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, record), (code::NONE, 0));
    assert_eq!(raw::delete_records(&mut conn, &topic, 0, 1).0, 44);
    // Removed again, the default is back.
    let unset = incremental(
        &mut conn,
        vec![resource(
            RESOURCE_BROKER,
            "",
            vec![op("log.cleanup.policy", DELETE, None)],
        )],
        false,
    );
    assert_eq!(unset[0].0, code::NONE);
    assert_eq!(
        value_of(&describe(&mut conn, RESOURCE_TOPIC, &topic), "cleanup.policy").0,
        "delete"
    );
}
