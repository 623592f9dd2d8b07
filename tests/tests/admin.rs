//! Admin APIs as Kafka clients use them: ApiVersions, CreateTopics (with
//! validate_only, replication factor, configs), DeleteTopics,
//! CreatePartitions, DescribeConfigs (rdkafka AdminClient) and DeleteRecords.

use std::time::Duration;

use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};
use kafka_protocol::protocol::StrBytes;
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, admin_options, runtime, unique_topic};
use rdkafka::admin::{ConfigSource, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::consumer::Consumer;
use rdkafka::error::RDKafkaErrorCode;

fn start() -> (TestRedis, Ketch) {
    let redis = TestRedis::start();
    // No auto-create: a topic exists only if an admin request made it.
    let ketch = Ketch::start(&redis.url(), &["--set", "topics.auto_create=false"]);
    (redis, ketch)
}

/// [`start`], with the storage worker ticking every 100 ms.
fn start_with_a_busy_storage_worker() -> (TestRedis, Ketch) {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "topics.auto_create=false",
            "--set",
            "tiering.tick_interval=100ms",
        ],
    );
    (redis, ketch)
}

fn partition_count(ketch: &Ketch, topic: &str) -> usize {
    let metadata = ketch
        .consumer()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    metadata.topics()[0].partitions().len()
}

#[test]
fn api_versions_advertises_the_implemented_apis_within_codec_range() {
    let (_redis, ketch) = start();
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("ketch-tests"))
        .with_client_software_version(StrBytes::from_static_str("0"));
    // A software name Kafka refuses (KIP-511's pattern) is INVALID_REQUEST.
    let badly_named = request
        .clone()
        .with_client_software_name(StrBytes::from_static_str("my client"));
    assert_eq!(conn.request(3, &badly_named).error_code, code::INVALID_REQUEST);
    let response = conn.request(3, &request);
    assert_eq!(response.error_code, code::NONE);
    for advertised in &response.api_keys {
        let key = ApiKey::try_from(advertised.api_key).expect("a known API key");
        let codec = key.valid_versions();
        assert!(
            codec.min <= advertised.min_version && advertised.max_version <= codec.max,
            "{key:?} advertised {}..{} outside kafka-protocol's {codec}",
            advertised.min_version,
            advertised.max_version
        );
    }
    let required = [
        (ApiKey::Produce, 3),
        (ApiKey::Fetch, 12),
        (ApiKey::ListOffsets, 1),
        (ApiKey::Metadata, 1),
        (ApiKey::ApiVersions, 3),
        (ApiKey::CreateTopics, 2),
        (ApiKey::DeleteTopics, 1),
        (ApiKey::DeleteRecords, 0),
        (ApiKey::DescribeConfigs, 1),
        (ApiKey::CreatePartitions, 0),
        (ApiKey::DescribeCluster, 0),
    ];
    for (key, at_least) in required {
        let advertised = response
            .api_keys
            .iter()
            .find(|k| k.api_key == key as i16)
            .unwrap_or_else(|| panic!("{key:?} not advertised"));
        assert!(
            advertised.max_version >= at_least,
            "{key:?} max {}",
            advertised.max_version
        );
    }
}

#[test]
fn create_topics_validate_only_creates_nothing() {
    let (redis, ketch) = start();
    let rt = runtime();
    let topic = unique_topic("validate");
    let new = NewTopic::new(&topic, 3, TopicReplication::Fixed(1));
    let results = rt
        .block_on(
            ketch
                .admin()
                .create_topics([&new], &admin_options().validate_only(true)),
        )
        .expect("CreateTopics");
    assert_eq!(results, vec![Ok(topic.clone())]);
    assert!(!redis.topic_exists(&topic));

    let results = rt
        .block_on(ketch.admin().create_topics([&new], &admin_options()))
        .expect("CreateTopics");
    assert_eq!(results, vec![Ok(topic.clone())]);
    assert!(redis.topic_exists(&topic));
    assert_eq!(partition_count(&ketch, &topic), 3);

    let results = rt
        .block_on(ketch.admin().create_topics([&new], &admin_options()))
        .expect("CreateTopics");
    assert_eq!(results, vec![Err((topic, RDKafkaErrorCode::TopicAlreadyExists))]);
}

#[test]
fn create_topics_rejects_each_bad_topic_on_its_own() {
    let (redis, ketch) = start();
    let rt = runtime();
    let replicated = unique_topic("replicated");
    let unknown_config = unique_topic("unknown-config");
    let bad_value = unique_topic("bad-value");
    let good = unique_topic("good");
    // Both wrong: the config is checked first, as Kafka's controller does.
    let both = unique_topic("both");
    let topics = [
        NewTopic::new(&replicated, 1, TopicReplication::Fixed(3)),
        NewTopic::new(&unknown_config, 1, TopicReplication::Fixed(1)).set("no.such.config", "1"),
        NewTopic::new(&bad_value, 1, TopicReplication::Fixed(1)).set("retention.ms", "soon"),
        NewTopic::new(&good, 1, TopicReplication::Fixed(1)).set("retention.ms", "3600000"),
        NewTopic::new(&both, 1, TopicReplication::Fixed(3)).set("retention.ms", "soon"),
    ];
    let results = rt
        .block_on(ketch.admin().create_topics(&topics, &admin_options()))
        .expect("CreateTopics");
    assert_eq!(
        results,
        vec![
            Err((replicated.clone(), RDKafkaErrorCode::InvalidReplicationFactor)),
            Err((unknown_config.clone(), RDKafkaErrorCode::InvalidConfig)),
            Err((bad_value.clone(), RDKafkaErrorCode::InvalidConfig)),
            Ok(good.clone()),
            Err((both.clone(), RDKafkaErrorCode::InvalidConfig)),
        ]
    );
    for rejected in [&replicated, &unknown_config, &bad_value, &both] {
        assert!(!redis.topic_exists(rejected), "{rejected} was created");
    }
    assert!(redis.topic_exists(&good));
}

#[test]
fn delete_topics_removes_the_topic() {
    let (redis, ketch) = start();
    let rt = runtime();
    let topic = unique_topic("doomed");
    ketch.create_topic(&rt, &topic, 2);
    let results = rt
        .block_on(ketch.admin().delete_topics(&[&topic], &admin_options()))
        .expect("DeleteTopics");
    assert_eq!(results, vec![Ok(topic.clone())]);
    assert!(!redis.topic_exists(&topic));

    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let batch = batch::encode(&[Record::value(batch::at(1), b"x")]);
    assert_eq!(
        raw::produce(&mut conn, &topic, 0, batch).0,
        code::UNKNOWN_TOPIC_OR_PARTITION
    );

    let results = rt
        .block_on(ketch.admin().delete_topics(&[&topic], &admin_options()))
        .expect("DeleteTopics");
    assert_eq!(
        results,
        vec![Err((topic, RDKafkaErrorCode::UnknownTopicOrPartition))]
    );
}

#[test]
fn create_partitions_grows_a_topic_and_refuses_to_shrink_it() {
    let (redis, ketch) = start();
    let rt = runtime();
    let topic = unique_topic("growing");
    ketch.create_topic(&rt, &topic, 1);
    let results = rt
        .block_on(
            ketch
                .admin()
                .create_partitions(&[NewPartitions::new(&topic, 4)], &admin_options()),
        )
        .expect("CreatePartitions");
    assert_eq!(results, vec![Ok(topic.clone())]);
    assert_eq!(redis.topic_tags(&topic).len(), 4);
    assert_eq!(partition_count(&ketch, &topic), 4);

    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let batch = batch::encode(&[Record::value(batch::at(1), b"new partition")]);
    assert_eq!(raw::produce(&mut conn, &topic, 3, batch), (code::NONE, 0));
    // At once, on the gateway that grew it (its cached topic record).
    let fetched = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 3, 0, 0));
    let (error, high_watermark, records) = raw::fetch_result(&fetched);
    assert_eq!(
        (error, high_watermark),
        (code::NONE, 1),
        "fetch of a new partition"
    );
    assert_eq!(raw::count_records(&records.expect("records")), 1);

    let results = rt
        .block_on(
            ketch
                .admin()
                .create_partitions(&[NewPartitions::new(&topic, 2)], &admin_options()),
        )
        .expect("CreatePartitions");
    assert_eq!(
        results,
        vec![Err((topic.clone(), RDKafkaErrorCode::InvalidPartitions))]
    );
    assert_eq!(redis.topic_tags(&topic).len(), 4);
}

#[test]
fn describe_configs_reports_overrides_and_defaults_with_their_source() {
    let (_redis, ketch) = start();
    let rt = runtime();
    let topic = unique_topic("described");
    let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(1)).set("retention.ms", "3600000");
    let results = rt
        .block_on(ketch.admin().create_topics([&new], &admin_options()))
        .expect("CreateTopics");
    assert_eq!(results, vec![Ok(topic.clone())]);

    let results = rt
        .block_on(
            ketch
                .admin()
                .describe_configs([&ResourceSpecifier::Topic(&topic)], &admin_options()),
        )
        .expect("DescribeConfigs");
    let resource = results
        .into_iter()
        .next()
        .expect("one resource")
        .expect("described");
    let retention = resource.get("retention.ms").expect("retention.ms listed");
    assert_eq!(retention.value.as_deref(), Some("3600000"));
    assert_eq!(retention.source, ConfigSource::DynamicTopic);
    assert!(!retention.is_default);
    let cleanup = resource.get("cleanup.policy").expect("cleanup.policy listed");
    assert_eq!(cleanup.value.as_deref(), Some("delete"));
    assert!(cleanup.is_default, "{cleanup:?}");
    assert_ne!(cleanup.source, ConfigSource::DynamicTopic);
}

#[test]
fn delete_records_moves_the_log_start_offset() {
    let (_redis, ketch) = start();
    let topic = unique_topic("trimmed");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    for n in 0..3 {
        let records: Vec<Record> = (0..10).map(|i| Record::value(batch::at(i), b"r")).collect();
        assert_eq!(
            raw::produce(&mut conn, &topic, 0, batch::encode(&records)),
            (code::NONE, n * 10)
        );
    }

    // One partition named twice, in two topic entries: the last entry
    // stands (Kafka reads the request into a map), answered once; before,
    // both ran and the larger offset won.
    let mut twice = raw::delete_records_request(&topic, 0, 20);
    let mut second = twice.topics[0].clone();
    second.partitions[0].offset = 12;
    twice.topics[0].partitions.push(second.partitions[0].clone());
    second.partitions[0].offset = 15;
    twice.topics.push(second);
    let response = conn.request(2, &twice);
    let answers: Vec<(i32, i16, i64)> = response
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.partition_index, p.error_code, p.low_watermark))
        })
        .collect();
    assert_eq!(answers, [(0, code::NONE, 15)]);

    let (error, offset, _) = raw::list_offsets(&mut conn, &topic, 0, -2);
    assert_eq!((error, offset), (code::NONE, 15));

    let watermarks = ketch
        .consumer()
        .fetch_watermarks(&topic, 0, Duration::from_secs(10))
        .expect("watermarks");
    assert_eq!(watermarks, (15, 30));

    let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 0, 100));
    assert_eq!(
        raw::fetch_result(&response).0,
        code::OFFSET_OUT_OF_RANGE,
        "fetch below the log start"
    );
    let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 15, 100));
    let (error, high_watermark, records) = raw::fetch_result(&response);
    assert_eq!((error, high_watermark), (code::NONE, 30));
    assert!(
        records.as_deref().map_or(0, raw::count_records) >= 15,
        "records from 15 on"
    );
}

/// As from Kafka: DeleteRecords on a topic whose cleanup.policy does not
/// delete (compact, or none) is POLICY_VIOLATION, and nothing goes.
#[test]
fn delete_records_refuses_a_topic_that_keeps_its_records() {
    let (redis, ketch) = start();
    let rt = runtime();
    const POLICY_VIOLATION: i16 = 44;
    for policy in ["compact", ""] {
        let topic = unique_topic("kept-records");
        ketch.create_topic_with(&rt, &topic, 1, &[("cleanup.policy", policy)]);
        let mut conn = KafkaConn::connect(ketch.kafka_addr());
        let record = Record {
            key: Some(b"k".to_vec()),
            ..Record::value(batch::at(1), b"r")
        };
        assert_eq!(
            raw::produce(&mut conn, &topic, 0, batch::encode(&[record])),
            (code::NONE, 0)
        );
        assert_eq!(
            raw::delete_records(&mut conn, &topic, 0, 1).0,
            POLICY_VIOLATION,
            "{policy:?}"
        );
        assert_eq!(
            raw::list_offsets(&mut conn, &topic, 0, -2).1,
            0,
            "{policy:?}: nothing deleted"
        );
        assert_eq!(redis.stream_len(&topic, 0), 1);
    }
}

#[test]
fn deleting_a_topic_removes_every_key_of_its_partitions() {
    let (redis, ketch) = start_with_a_busy_storage_worker();
    let rt = runtime();
    let topic = unique_topic("delete-keys");
    ketch.create_topic_with(&rt, &topic, 2, &[("segment.bytes", "100")]);
    let tags = redis.topic_tags(&topic);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    // Recent timestamps: retention.ms would delete a segment of records from 1970.
    let now = batch::at(0);
    for partition in 0..2 {
        let batch = batch::encode_idempotent(
            &[Record::value(now, &[b'v'; 200])],
            1_000 + partition as i64,
            0,
            0,
        );
        assert_eq!(raw::produce(&mut conn, &topic, partition, batch).0, code::NONE);
    }
    let keys_of = |tag: &str| -> Vec<String> {
        redis::cmd("KEYS")
            .arg(format!("ketch:{{{tag}}}:*"))
            .query(&mut redis.connection())
            .expect("KEYS")
    };
    // The storage worker seals a segment and holds a lease on each.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for tag in &tags {
        loop {
            let keys = keys_of(tag);
            let has = |name: &str| keys.iter().any(|k| k.ends_with(name));
            if has(":segments") && has(":lease") && has(":producers") && has(":log") && has(":meta") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "keys of {tag}: {keys:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let deleted = rt
        .block_on(ketch.admin().delete_topics(&[&topic], &admin_options()))
        .expect("delete topics");
    assert!(deleted[0].is_ok(), "{deleted:?}");
    for tag in &tags {
        assert_eq!(keys_of(tag), Vec::<String>::new(), "keys left behind for {tag}");
    }
}

/// A DeleteTopics cut short after the topic's record was removed (Redis
/// failed, the gateway died) is finished by the storage worker: the
/// partitions' keys and the groups' offsets of the topic go, and so does
/// the deletion's entry. The cut is made by hand here, as the first step
/// of a deletion leaves it (`add_partitions.lua`'s removal).
#[test]
fn a_topic_deletion_cut_short_is_finished_by_the_storage_worker() {
    let (redis, ketch) = start_with_a_busy_storage_worker();
    let rt = runtime();
    let topic = unique_topic("cut-short");
    let group = unique_topic("cut-short-group");
    ketch.create_topic(&rt, &topic, 2);
    let tags = redis.topic_tags(&topic);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    for partition in 0..2 {
        let batch = batch::encode(&[Record::value(batch::at(0), b"v")]);
        assert_eq!(raw::produce(&mut conn, &topic, partition, batch).0, code::NONE);
        let commit = raw::offset_commit_request(&group, "", -1, &topic, partition, 1);
        let response = conn.request(8, &commit);
        assert_eq!(response.topics[0].partitions[0].error_code, code::NONE);
    }
    let offsets_key = format!("ketch:group:{{{group}}}:offsets");
    let offsets = |redis: &TestRedis| -> i64 {
        redis::cmd("HLEN")
            .arg(&offsets_key)
            .query(&mut redis.connection())
            .expect("HLEN")
    };
    assert_eq!(offsets(&redis), 2);

    // What the first step of a deletion leaves, begun a minute ago.
    let mut r = redis.connection();
    let record: String = redis::cmd("HGET")
        .arg("ketch:topics")
        .arg(&topic)
        .query(&mut r)
        .unwrap();
    let id = serde_json::from_str::<serde_json::Value>(&record).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let entry = serde_json::json!({
        "name": topic,
        "record": record,
        "since_ms": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
            - 60_000,
    });
    let () = redis::cmd("HDEL")
        .arg("ketch:topics")
        .arg(&topic)
        .query(&mut r)
        .unwrap();
    let () = redis::cmd("HSET")
        .arg("{ketch:topics}:deleting")
        .arg(&id)
        .arg(entry.to_string())
        .query(&mut r)
        .unwrap();

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left: i64 = redis::cmd("HLEN")
            .arg("{ketch:topics}:deleting")
            .query(&mut r)
            .unwrap();
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the deletion was never finished"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (partition, tag) in tags.iter().enumerate() {
        for name in ["log", "meta", "producers"] {
            let exists: bool = redis::cmd("EXISTS")
                .arg(format!("ketch:{{{tag}}}:{name}"))
                .query(&mut r)
                .unwrap();
            assert!(!exists, "partition {partition}'s {name} key was left behind");
        }
    }
    assert_eq!(
        offsets(&redis),
        0,
        "the group's offsets of the deleted topic were kept"
    );
}

/// A DeleteTopics that is not cut short leaves no unfinished entry.
#[test]
fn a_finished_topic_deletion_leaves_no_entry() {
    let (redis, ketch) = start();
    let rt = runtime();
    let topic = unique_topic("finished");
    ketch.create_topic(&rt, &topic, 3);
    let results = rt
        .block_on(ketch.admin().delete_topics(&[&topic], &admin_options()))
        .expect("DeleteTopics");
    assert_eq!(results, vec![Ok(topic.clone())]);
    let left: i64 = redis::cmd("HLEN")
        .arg("{ketch:topics}:deleting")
        .query(&mut redis.connection())
        .unwrap();
    assert_eq!(left, 0);
}

/// A DeleteTopics v6 that names one topic both by name and by id deletes
/// nothing: both entries are INVALID_REQUEST, as from Kafka's controller
/// (before, one entry deleted the topic and the other found it gone).
#[test]
fn a_topic_named_by_name_and_by_id_in_one_deletion_is_refused() {
    let (redis, ketch) = start();
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("named-twice");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let id = raw::topic_id(&mut conn, &topic).expect("the topic's id");
    let response: kafka_protocol::messages::DeleteTopicsResponse = conn.request(
        6,
        &raw::delete_topics_request(&[(Some(&topic), None), (None, Some(id))]),
    );
    let codes: Vec<i16> = response.responses.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [code::INVALID_REQUEST; 2], "{response:?}");
    assert!(redis.topic_exists(&topic), "the topic was deleted");
    // So does an id given twice beside the name.
    let response: kafka_protocol::messages::DeleteTopicsResponse = conn.request(
        6,
        &raw::delete_topics_request(&[(Some(&topic), None), (None, Some(id)), (None, Some(id))]),
    );
    let codes: Vec<i16> = response.responses.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [code::INVALID_REQUEST; 2], "{response:?}");
    assert!(redis.topic_exists(&topic), "the topic was deleted");
    // Either alone deletes it.
    let response: kafka_protocol::messages::DeleteTopicsResponse =
        conn.request(6, &raw::delete_topics_request(&[(None, Some(id))]));
    assert_eq!(response.responses[0].error_code, code::NONE);
    assert!(!redis.topic_exists(&topic));
}

/// The topic registry's scripts answer a call sent again as they answered
/// it the first time. The cluster connection re-sends a command whose
/// connection dropped before its reply came, and Redis may have run the
/// first: a creation or growth answered "the topic changed meanwhile"
/// would have the gateway remove the partitions the first run made
/// reachable (and a deletion answer UNKNOWN_TOPIC_OR_PARTITION).
#[test]
fn the_topic_registrys_scripts_answer_a_call_sent_again_as_the_first() {
    let (redis, ketch) = start();
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut db = redis.connection();
    let topic = unique_topic("sent-again");
    let record = |db: &mut ketch_tests::TestConnection| -> String {
        redis::cmd("HGET")
            .arg("ketch:topics")
            .arg(&topic)
            .query(db)
            .expect("HGET")
    };
    let create = redis::Script::new(include_str!("../../storage/src/scripts/create_topic.lua"));
    let replace = redis::Script::new(include_str!("../../storage/src/scripts/add_partitions.lua"));

    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let created = record(&mut db);
    let again: Vec<String> = create
        .key("ketch:topics")
        .arg(&topic)
        .arg(&created)
        .invoke(&mut db)
        .expect("create_topic.lua");
    assert_eq!(again, ["created"], "the creation's own record");
    let other: Vec<String> = create
        .key("ketch:topics")
        .arg(&topic)
        .arg(format!("{created} "))
        .invoke(&mut db)
        .expect("create_topic.lua");
    assert_eq!(other, ["exists"], "another creation of the name");

    assert_eq!(raw::create_partitions(&mut conn, &topic, 2), code::NONE);
    let grown = record(&mut db);
    let again: i32 = replace
        .key("ketch:topics")
        .arg(&topic)
        .arg(&created)
        .arg(&grown)
        .invoke(&mut db)
        .expect("add_partitions.lua");
    assert_eq!(again, 1, "the growth's own record");
    let stale: i32 = replace
        .key("ketch:topics")
        .arg(&topic)
        .arg(&created)
        .arg(format!("{created} "))
        .invoke(&mut db)
        .expect("add_partitions.lua");
    assert_eq!(stale, 0, "a change from a record read before the growth");
    assert_eq!(record(&mut db), grown);

    let remove = |db: &mut ketch_tests::TestConnection, entry: &str| -> i32 {
        replace
            .key("ketch:topics")
            .key("{ketch:topics}:deleting")
            .arg(&topic)
            .arg(&grown)
            .arg("")
            .arg("the-id")
            .arg(entry)
            .invoke(db)
            .expect("add_partitions.lua")
    };
    assert_eq!(remove(&mut db, "this removal"), 1);
    assert!(!redis.topic_exists(&topic));
    assert_eq!(remove(&mut db, "this removal"), 1, "the removal sent again");
    assert_eq!(remove(&mut db, "another removal"), 0);
}
