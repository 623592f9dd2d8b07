//! Metrics, the admin API and request logs, end to end: Prometheus metrics
//! move as records are produced and fetched, consumer lag is the high
//! watermark minus the committed offset, the admin API answers what
//! Kafka's own APIs answer (on any gateway), and bad input to it gets a
//! clear 4xx and changes nothing. Holds for one Redis and Redis Cluster.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ketch_tests::{Ketch, TestRedis, runtime, unique_topic};
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::admin::{AdminOptions, ResourceSpecifier};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};

const WRITES: &[&str] = &[
    "--set",
    "http.admin_writes=true",
    "--set",
    "topics.auto_create=false",
];

/// The value of the sample of `name` whose labels include `labels`.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (sample, rest) = match series.split_once('{') {
            Some((sample, rest)) => (sample, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if sample != name {
            return None;
        }
        let all = labels
            .iter()
            .all(|(k, v)| rest.split(',').any(|pair| pair == format!("{k}=\"{v}\"")));
        if all { value.parse().ok() } else { None }
    })
}

/// Scrapes `/metrics` until `name{labels}` satisfies `ok`.
fn await_metric(ketch: &Ketch, name: &str, labels: &[(&str, &str)], ok: impl Fn(f64) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (status, text) = ketch.http_get("/metrics");
        assert_eq!(status, 200);
        if metric(&text, name, labels).is_some_and(&ok) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{name}{labels:?} never as expected: {:?}\n{text}",
            metric(&text, name, labels)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn api(ketch: &Ketch, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let (status, body) = ketch.http(method, path, body);
    (status, json_of(&body))
}

fn create(ketch: &Ketch, topic: &str, partitions: i32) {
    let body = json!({"name": topic, "partitions": partitions}).to_string();
    let (status, created) = api(ketch, "POST", "/api/v1/topics", Some(&body));
    assert_eq!(status, 201, "{created}");
}

fn produce(producer: &FutureProducer, topic: &str, partition: i32, count: usize) {
    let rt = runtime();
    rt.block_on(async {
        let sends = (0..count).map(|i| {
            let payload = format!("record {i} of partition {partition}");
            async move {
                producer
                    .send(
                        FutureRecord::<(), _>::to(topic)
                            .partition(partition)
                            .payload(&payload),
                        Duration::from_secs(10),
                    )
                    .await
                    .map_err(|(e, _)| e)
            }
        });
        for sent in futures::future::join_all(sends).await {
            sent.expect("delivered");
        }
    });
}

fn commit(ketch: &Ketch, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    let consumer = ketch.consumer_with(&[("group.id", group)]);
    let mut list = TopicPartitionList::new();
    for (p, o) in offsets {
        list.add_partition_offset(topic, *p, Offset::Offset(*o))
            .expect("offset");
    }
    consumer.commit(&list, CommitMode::Sync).expect("commit");
}

/// The group's committed offsets as OffsetFetch reports them.
fn committed(ketch: &Ketch, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer = ketch.consumer_with(&[("group.id", group)]);
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(list, Duration::from_secs(10))
        .expect("OffsetFetch");
    (0..partitions)
        .map(
            |p| match committed.find_partition(topic, p).expect("listed").offset() {
                Offset::Offset(o) => o,
                other => panic!("no committed offset for {topic}-{p}: {other:?}"),
            },
        )
        .collect()
}

fn watermarks(consumer: &BaseConsumer, topic: &str, partition: i32) -> (i64, i64) {
    consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .expect("ListOffsets")
}

#[test]
fn metrics_count_requests_records_bytes_and_errors_as_traffic_flows() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[WRITES, &["--set", "log.level=info,ketch_gateway::server=debug"]].concat(),
    );
    let topic = unique_topic("metered");
    create(&ketch, &topic, 2);
    let producer = ketch.producer_with(&[("acks", "all")]);
    produce(&producer, &topic, 0, 120);
    produce(&producer, &topic, 1, 80);

    let consumer = ketch.consumer_at(&topic, &[0, 1], 0);
    let mut fetched = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while fetched < 200 {
        assert!(Instant::now() < deadline, "fetched only {fetched} of 200");
        if let Some(message) = consumer.poll(Duration::from_millis(500)) {
            message.expect("a record");
            fetched += 1;
        }
    }
    // An error: Metadata for a topic that does not exist (auto-create off).
    let _ = consumer.fetch_metadata(Some("no-such-topic-here"), Duration::from_secs(5));

    let text = await_metric(&ketch, "ketch_fetched_records_total", &[("topic", &topic)], |v| {
        v >= 200.0
    });
    let get = |name: &str, labels: &[(&str, &str)]| metric(&text, name, labels);
    assert_eq!(
        get("ketch_produced_records_total", &[("topic", &topic)]),
        Some(200.0)
    );
    assert_eq!(
        get("ketch_fetched_records_total", &[("topic", &topic)]),
        Some(200.0),
        "each record fetched once"
    );
    let produced_bytes = get("ketch_produced_bytes_total", &[("topic", &topic)]).expect("produced bytes");
    let fetched_bytes = get("ketch_fetched_bytes_total", &[("topic", &topic)]).expect("fetched bytes");
    assert!(
        produced_bytes >= 200.0 * 20.0,
        "{produced_bytes} bytes for 200 records"
    );
    assert_eq!(
        fetched_bytes, produced_bytes,
        "the stored batches go out as they came in"
    );
    let produces = get("ketch_requests_total", &[("api", "Produce")]).expect("Produce requests");
    assert!(produces >= 1.0);
    // A histogram with buckets (not a summary), one observation per request.
    assert_eq!(
        get("ketch_request_duration_seconds_count", &[("api", "Produce")]),
        Some(produces)
    );
    assert_eq!(
        get(
            "ketch_request_duration_seconds_bucket",
            &[("api", "Produce"), ("le", "+Inf")]
        ),
        Some(produces)
    );
    assert!(
        get(
            "ketch_request_duration_seconds_bucket",
            &[("api", "Fetch"), ("le", "0.001")]
        )
        .is_some()
    );
    assert!(
        get(
            "ketch_request_errors_total",
            &[("api", "Metadata"), ("error", "UNKNOWN_TOPIC_OR_PARTITION")]
        )
        .is_some_and(|v| v >= 1.0),
        "{text}"
    );
    assert!(
        get("ketch_connections", &[]).is_some_and(|v| v >= 1.0),
        "the consumer's connection"
    );
    assert!(get("ketch_inflight_requests", &[]).is_some());
    assert!(
        get(
            "ketch_redis_command_duration_seconds_count",
            &[("command", "EVALSHA")]
        )
        .is_some_and(|v| v >= 1.0)
    );
    assert!(
        text.contains("# TYPE ketch_archive_segments_total counter"),
        "tiering metrics in the same registry"
    );
    // Redis memory is read on every upkeep (and /ready).
    assert_eq!(ketch.http_get("/ready").0, 200);
    let text = await_metric(&ketch, "ketch_redis_used_memory_bytes", &[], |v| v > 0.0);
    assert!(metric(&text, "ketch_redis_maxmemory_bytes", &[]).is_some());
    // Per-request debug lines name the client, API, correlation id and time.
    ketch.await_log("api=Produce", Duration::from_secs(5));
    let log = ketch.output();
    let line = log
        .lines()
        .find(|l| l.contains("api=Produce") && l.contains("request"))
        .expect("a request line");
    for field in ["client_id=", "correlation_id=", "duration_us="] {
        assert!(line.contains(field), "{field} missing from {line}");
    }
    drop(consumer);
}

#[test]
fn lag_is_the_high_watermark_minus_the_committed_offset_in_metrics_and_the_api() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), WRITES);
    let topic = unique_topic("lagging");
    let group = unique_topic("laggards");
    create(&ketch, &topic, 2);
    let producer = ketch.producer();
    produce(&producer, &topic, 0, 100);
    produce(&producer, &topic, 1, 50);
    commit(&ketch, &group, &topic, &[(0, 30), (1, 50)]);

    await_metric(
        &ketch,
        "ketch_group_lag",
        &[("group", &group), ("topic", &topic)],
        |v| v == 70.0,
    );

    let (status, described) = api(&ketch, "GET", &format!("/api/v1/groups/{group}"), None);
    assert_eq!(status, 200, "{described}");
    assert_eq!(described["state"], "Empty");
    assert_eq!(described["lag"], 70);
    let consumer = ketch.consumer();
    let kafka_committed = committed(&ketch, &group, &topic, 2);
    for (p, offset) in described["offsets"]
        .as_array()
        .expect("offsets")
        .iter()
        .enumerate()
    {
        let p = p as i32;
        assert_eq!(offset["partition"], p);
        assert_eq!(
            offset["committed_offset"], kafka_committed[p as usize],
            "as OffsetFetch says"
        );
        let (_, high) = watermarks(&consumer, &topic, p);
        assert_eq!(offset["high_watermark"], high, "as ListOffsets says");
        assert_eq!(offset["lag"], high - kafka_committed[p as usize]);
    }
    let (_, groups) = api(&ketch, "GET", "/api/v1/groups", None);
    let listed = groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["group_id"] == group.as_str())
        .unwrap_or_else(|| panic!("{group} not listed: {groups}"));
    assert_eq!(listed["lag"], 70);

    // Resets of an empty group, as Kafka's reset tool does them.
    let reset = |body: Value| {
        api(
            &ketch,
            "POST",
            &format!("/api/v1/groups/{group}/offsets"),
            Some(&body.to_string()),
        )
    };
    let (status, after) = reset(json!({"to": "earliest"}));
    assert_eq!(status, 200, "{after}");
    assert_eq!(committed(&ketch, &group, &topic, 2), vec![0, 0]);
    assert_eq!(after["lag"], 150);
    let (status, _) = reset(json!({"to": "latest"}));
    assert_eq!(status, 200);
    assert_eq!(committed(&ketch, &group, &topic, 2), vec![100, 50]);
    let (status, _) = reset(json!({"to": "timestamp", "timestamp": 0, "topics": [topic]}));
    assert_eq!(status, 200);
    assert_eq!(
        committed(&ketch, &group, &topic, 2),
        vec![0, 0],
        "every record is after time 0"
    );

    // Bad resets change nothing.
    for bad in [
        json!({"to": "sideways"}),
        json!({"to": "timestamp"}),
        json!({"to": "earliest", "timestamp": 5}),
        json!({"to": "earliest", "surprise": true}),
        json!({"to": "earliest", "topics": ["no-such-topic"]}),
    ] {
        let (status, error) = reset(bad.clone());
        assert!(status == 400 || status == 404, "{bad} → {status} {error}");
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{error}"
        );
    }
    assert_eq!(committed(&ketch, &group, &topic, 2), vec![0, 0]);

    // A group with a member is not reset: the member would commit over it.
    let member = ketch.consumer_with(&[
        ("group.id", group.as_str()),
        ("auto.offset.reset", "earliest"),
        ("session.timeout.ms", "6000"),
    ]);
    member.subscribe(&[&topic]).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(30);
    while member.assignment().map_or(0, |a| a.count()) == 0 {
        assert!(Instant::now() < deadline, "the member never got partitions");
        let _ = member.poll(Duration::from_millis(200));
    }
    let (status, error) = reset(json!({"to": "latest"}));
    assert_eq!(status, 409, "{error}");
    assert_eq!(error["error"], "NON_EMPTY_GROUP");
    let (_, described) = api(&ketch, "GET", &format!("/api/v1/groups/{group}"), None);
    assert_eq!(described["state"], "Stable", "{described}");
    let members = described["members"].as_array().expect("members");
    assert_eq!(members.len(), 1);
    let assigned: BTreeSet<i64> = members[0]["assignment"][&topic]
        .as_array()
        .expect("the member's assignment")
        .iter()
        .map(|p| p.as_i64().expect("partition"))
        .collect();
    assert_eq!(assigned, BTreeSet::from([0, 1]));
    member.unsubscribe();
}

/// A browser on this machine: a page that rebinds its own name to
/// 127.0.0.1 (DNS rebinding) names itself in `Host` and is refused, as is
/// a write a page of another origin sends; `localhost`, IP addresses and
/// `http.allowed_hosts` are served; every answer forbids framing and
/// sniffing.
#[test]
fn pages_of_other_sites_cannot_use_the_admin_api() {
    let redis = TestRedis::start();
    let mut args = WRITES.to_vec();
    args.extend(["--set", "http.allowed_hosts=ketch.internal"]);
    let ketch = Ketch::start(&redis.url(), &args);
    let port = ketch.http_port();
    let get = |host: &str| ketch.http_with("GET", "/api/v1/topics", &[("Host", host)], None);
    let (status, _, body) = get(&format!("rebound.example:{port}"));
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"],
        "HOST_NOT_ALLOWED"
    );
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        format!("ketch.internal:{port}"),
        "KETCH.INTERNAL".to_owned(),
    ] {
        let (status, headers, body) = get(&host);
        assert_eq!(status, 200, "{host}: {body}");
        let headers = headers.to_ascii_lowercase();
        for header in [
            "x-frame-options: deny",
            "x-content-type-options: nosniff",
            "content-security-policy: frame-ancestors 'none'",
        ] {
            assert!(headers.contains(header), "{host}: {header} missing in {headers}");
        }
    }
    // A write from a page of another origin; the same from the console's own.
    let topic = unique_topic("origin");
    let body = json!({"name": topic, "partitions": 1}).to_string();
    let host = format!("127.0.0.1:{port}");
    let post = |origin: &str| {
        let headers = [("Host", host.as_str()), ("Origin", origin)];
        ketch.http_with("POST", "/api/v1/topics", &headers, Some(&body))
    };
    let (status, _, answer) = post("http://evil.example");
    assert_eq!(status, 403, "{answer}");
    assert_eq!(
        serde_json::from_str::<Value>(&answer).unwrap()["error"],
        "CROSS_ORIGIN"
    );
    assert_eq!(
        api(&ketch, "GET", &format!("/api/v1/topics/{topic}"), None).0,
        404,
        "not created"
    );
    let (status, _, answer) = post(&format!("http://{host}"));
    assert_eq!(status, 201, "{answer}");
}

#[test]
fn the_admin_api_manages_topics_as_kafkas_apis_see_them_and_refuses_bad_input() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), WRITES);
    let rt = runtime();
    let topic = unique_topic("administered");
    let body = json!({"name": topic, "partitions": 3, "configs": {"retention.ms": "3600000"}}).to_string();
    let (status, created) = api(&ketch, "POST", "/api/v1/topics", Some(&body));
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["partitions"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        created["configs"]["retention.ms"],
        json!({"value": "3600000", "source": "topic"})
    );
    let consumer = ketch.consumer();
    let metadata = consumer
        .fetch_metadata(Some(&topic), Duration::from_secs(10))
        .expect("metadata");
    assert_eq!(metadata.topics()[0].partitions().len(), 3);

    produce(&ketch.producer(), &topic, 1, 10);
    let (status, described) = api(&ketch, "GET", &format!("/api/v1/topics/{topic}"), None);
    assert_eq!(status, 200);
    for partition in described["partitions"].as_array().expect("partitions") {
        let p = partition["partition"].as_i64().expect("index") as i32;
        let (low, high) = watermarks(&consumer, &topic, p);
        assert_eq!(partition["log_start_offset"], low);
        assert_eq!(partition["high_watermark"], high);
        assert_eq!(
            partition["leader"],
            metadata.topics()[0].partitions()[p as usize].leader()
        );
    }
    assert_eq!(described["partitions"][1]["high_watermark"], 10);
    assert!(
        described["partitions"][1]["redis_bytes"]
            .as_i64()
            .is_some_and(|b| b > 0),
        "{described}"
    );
    let (_, listed) = api(&ketch, "GET", "/api/v1/topics", None);
    let summary = listed["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .find(|t| t["name"] == topic.as_str())
        .expect("listed");
    assert_eq!(
        (summary["partitions"].clone(), summary["records"].clone()),
        (json!(3), json!(10))
    );
    let (_, brokers) = api(&ketch, "GET", "/api/v1/brokers", None);
    let ids: BTreeSet<i64> = brokers["brokers"]
        .as_array()
        .expect("brokers")
        .iter()
        .map(|b| b["node_id"].as_i64().expect("id"))
        .collect();
    let kafka_ids: BTreeSet<i64> = metadata.brokers().iter().map(|b| i64::from(b.id())).collect();
    assert_eq!(ids, kafka_ids);

    // Config changes, seen through DescribeConfigs.
    let described_retention = || {
        let resource = rt
            .block_on(ketch.admin().describe_configs(
                [&ResourceSpecifier::Topic(&topic)],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            ))
            .expect("DescribeConfigs")
            .remove(0)
            .expect("described");
        resource.get("retention.ms").and_then(|c| c.value.clone())
    };
    let path = format!("/api/v1/topics/{topic}");
    let (status, changed) = api(
        &ketch,
        "PATCH",
        &path,
        Some(r#"{"configs": {"retention.ms": "60000"}}"#),
    );
    assert_eq!(status, 200, "{changed}");
    assert_eq!(described_retention().as_deref(), Some("60000"));
    for bad in [
        r#"{"configs": {"retention.ms": "soon"}}"#,
        r#"{"configs": {"no.such.config": "1"}}"#,
        r#"{"configs": {}}"#,
        r#"{"configs": {"retention.ms": "1"}, "extra": 1}"#,
        r#"{"configs": "#,
    ] {
        let (status, error) = api(&ketch, "PATCH", &path, Some(bad));
        assert_eq!(status, 400, "{bad} → {error}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    assert_eq!(
        described_retention().as_deref(),
        Some("60000"),
        "bad changes change nothing"
    );
    let (status, reverted) = api(
        &ketch,
        "PATCH",
        &path,
        Some(r#"{"configs": {"retention.ms": null}}"#),
    );
    assert_eq!(status, 200);
    assert_ne!(reverted["configs"]["retention.ms"]["source"], "topic");

    // Creation refused: it exists, bad names, counts, configs, JSON, size.
    let (status, error) = api(&ketch, "POST", "/api/v1/topics", Some(&body));
    assert_eq!(
        (status, error["error"].clone()),
        (409, json!("TOPIC_ALREADY_EXISTS"))
    );
    let refused = unique_topic("refused");
    let huge = json!({"name": refused, "configs": {"x": "y".repeat(100_000)}}).to_string();
    for (bad, want) in [
        (json!({"name": "bad/name"}).to_string(), 400),
        (json!({"name": refused, "partitions": 0}).to_string(), 400),
        (
            json!({"name": refused, "configs": {"no.such.config": "1"}}).to_string(),
            400,
        ),
        (
            json!({"name": refused, "configs": {"retention.ms": "soon"}}).to_string(),
            400,
        ),
        (json!({"name": refused, "colour": "red"}).to_string(), 400),
        ("{\"name\": ".to_owned(), 400),
        (huge, 413),
    ] {
        let (status, error) = ketch.http("POST", "/api/v1/topics", Some(&bad));
        assert_eq!(status, want, "{} → {error}", &bad[..bad.len().min(80)]);
        let error = json_of(&error);
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{error}"
        );
    }
    let (status, _) = api(&ketch, "GET", &format!("/api/v1/topics/{refused}"), None);
    assert_eq!(status, 404, "nothing was created");
    let (status, error) = api(&ketch, "GET", "/api/v1/topics/no-such-topic", None);
    assert_eq!(
        (status, error["error"].clone()),
        (404, json!("UNKNOWN_TOPIC_OR_PARTITION"))
    );
    assert_eq!(api(&ketch, "GET", "/api/v1/no-such-thing", None).0, 404);

    let (status, deleted) = api(&ketch, "DELETE", &path, None);
    assert_eq!(status, 200, "{deleted}");
    let metadata = consumer
        .fetch_metadata(Some(&topic), Duration::from_secs(10))
        .expect("metadata");
    assert!(
        metadata.topics()[0].error().is_some(),
        "deleted for Kafka clients too"
    );
    assert_eq!(api(&ketch, "DELETE", &path, None).0, 404);
}

#[test]
fn admin_writes_are_refused_unless_turned_on() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "topics.auto_create=false"]);
    let topic = unique_topic("guarded");
    let body = json!({"name": topic}).to_string();
    let (status, error) = api(&ketch, "POST", "/api/v1/topics", Some(&body));
    assert_eq!((status, error["error"].clone()), (403, json!("WRITES_DISABLED")));
    assert!(
        error["message"]
            .as_str()
            .unwrap_or("")
            .contains("http.admin_writes")
    );
    assert_eq!(
        api(&ketch, "GET", &format!("/api/v1/topics/{topic}"), None).0,
        404
    );
    let rt = runtime();
    let new = rdkafka::admin::NewTopic::new(&topic, 1, rdkafka::admin::TopicReplication::Fixed(1));
    rt.block_on(ketch.admin().create_topics([&new], &AdminOptions::new()))
        .expect("CreateTopics");
    for (method, body) in [
        ("DELETE", None),
        ("PATCH", Some(r#"{"configs": {"retention.ms": "1"}}"#)),
    ] {
        let (status, _) = api(&ketch, method, &format!("/api/v1/topics/{topic}"), body);
        assert_eq!(status, 403, "{method}");
    }
    let (status, described) = api(&ketch, "GET", &format!("/api/v1/topics/{topic}"), None);
    assert_eq!(status, 200, "reads stay open and the topic is untouched");
    assert_ne!(described["configs"]["retention.ms"]["source"], "topic");
}

#[test]
fn every_gateway_lists_and_describes_the_groups_of_all() {
    let redis = TestRedis::start();
    let a = Ketch::start_node(&redis.url(), 1, "3s", WRITES);
    let b = Ketch::start_node(&redis.url(), 2, "3s", WRITES);
    let topic = unique_topic("shared");
    create(&a, &topic, 1);
    produce(&a.producer(), &topic, 0, 5);
    // Groups until each gateway coordinates one.
    let mut groups = Vec::new();
    let mut coordinators = BTreeSet::new();
    while coordinators.len() < 2 {
        assert!(
            groups.len() < 40,
            "40 groups and all on one gateway: {coordinators:?}"
        );
        let group = unique_topic("everywhere");
        commit(&a, &group, &topic, &[(0, 2)]);
        let (status, described) = api(&a, "GET", &format!("/api/v1/groups/{group}"), None);
        assert_eq!(status, 200, "{described}");
        coordinators.insert(described["coordinator"].as_i64().expect("coordinator"));
        groups.push(group);
    }
    for ketch in [&a, &b] {
        let (_, listed) = api(ketch, "GET", "/api/v1/groups", None);
        let ids: BTreeSet<&str> = listed["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .filter_map(|g| g["group_id"].as_str())
            .collect();
        for group in &groups {
            assert!(ids.contains(group.as_str()), "{group} missing from {listed}");
        }
        for group in &groups {
            let (status, described) = api(ketch, "GET", &format!("/api/v1/groups/{group}"), None);
            assert_eq!(status, 200);
            assert_eq!(described["lag"], 3, "{described}");
        }
    }
    let (status, error) = api(&b, "GET", "/api/v1/groups/no-such-group", None);
    assert_eq!(status, 404, "{error}");
}

/// The values `label` takes in the samples of `name`.
fn label_values(text: &str, name: &str, label: &str) -> BTreeSet<String> {
    let prefix = format!("{name}{{");
    let key = format!("{label}=\"");
    text.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|labels| {
            let at = labels.find(&key)? + key.len();
            let end = labels[at..].find('"')?;
            Some(labels[at..at + end].to_owned())
        })
        .collect()
}

/// Scrapes both gateways until `done` holds for their samples' values of
/// `label` in `name`; panics with both after 40 s.
fn await_on_both(
    a: &Ketch,
    b: &Ketch,
    name: &str,
    label: &str,
    what: &str,
    done: impl Fn(&BTreeSet<String>, &BTreeSet<String>) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let on_a = label_values(&a.http_get("/metrics").1, name, label);
        let on_b = label_values(&b.http_get("/metrics").1, name, label);
        if done(&on_a, &on_b) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: never so; {name} {label}s on the first gateway {on_a:?}, on the second {on_b:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn a_deleted_topics_series_leave_every_gateway() {
    let redis = TestRedis::start();
    let a = Ketch::start_node(&redis.url(), 1, "3s", WRITES);
    let b = Ketch::start_node(&redis.url(), 2, "3s", WRITES);
    let deleted = unique_topic("metered-then-deleted");
    let kept = unique_topic("metered-and-kept");
    for topic in [&deleted, &kept] {
        create(&a, topic, 2);
        produce(&a.producer(), topic, 0, 10);
        produce(&b.producer(), topic, 1, 10);
        let consumer = b.consumer_at(topic, &[0, 1], 0);
        let mut fetched = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while fetched < 20 {
            assert!(Instant::now() < deadline, "fetched only {fetched} of 20");
            if let Some(message) = consumer.poll(Duration::from_millis(500)) {
                message.expect("a record");
                fetched += 1;
            }
        }
    }
    let both = |on_a: &BTreeSet<String>, on_b: &BTreeSet<String>, topic: &str| {
        on_a.contains(topic) || on_b.contains(topic)
    };
    for name in ["ketch_produced_records_total", "ketch_fetched_records_total"] {
        await_on_both(&a, &b, name, "topic", "both topics counted", |on_a, on_b| {
            both(on_a, on_b, &deleted) && both(on_a, on_b, &kept)
        });
    }

    let rt = runtime();
    let deletion = rt.block_on(a.admin().delete_topics(&[&deleted], &AdminOptions::new()));
    assert!(matches!(deletion.as_deref(), Ok([Ok(_)])), "{deletion:?}");
    for name in [
        "ketch_produced_records_total",
        "ketch_produced_bytes_total",
        "ketch_fetched_records_total",
        "ketch_fetched_bytes_total",
    ] {
        await_on_both(
            &a,
            &b,
            name,
            "topic",
            "the deleted topic's series gone",
            |on_a, on_b| !both(on_a, on_b, &deleted) && both(on_a, on_b, &kept),
        );
    }
}

#[test]
fn a_groups_lag_leaves_the_gateway_that_no_longer_coordinates_it() {
    let redis = TestRedis::start();
    let a = Ketch::start_node(&redis.url(), 1, "3s", WRITES);
    let topic = unique_topic("lag-handed-over");
    create(&a, &topic, 1);
    produce(&a.producer(), &topic, 0, 5);
    let groups: BTreeSet<String> = (0..12).map(|_| unique_topic("handed-over")).collect();
    for group in &groups {
        commit(&a, group, &topic, &[(0, 2)]);
    }
    let text = await_metric(
        &a,
        "ketch_group_lag",
        &[("group", groups.last().expect("a group")), ("topic", &topic)],
        |v| v == 3.0,
    );
    let on_a = label_values(&text, "ketch_group_lag", "group");
    assert!(groups.is_subset(&on_a), "{on_a:?}");

    // A second gateway joins and takes some of the groups over: each is
    // reported by its coordinator alone (within the 10 s refresh), not
    // also by the first for the gauges' idle time.
    let b = Ketch::start_node(&redis.url(), 2, "3s", WRITES);
    await_on_both(
        &a,
        &b,
        "ketch_group_lag",
        "group",
        "each group on one gateway",
        |on_a, on_b| {
            let on_a: BTreeSet<_> = on_a.intersection(&groups).collect();
            let on_b: BTreeSet<_> = on_b.intersection(&groups).collect();
            !on_b.is_empty() && on_a.is_disjoint(&on_b) && on_a.len() + on_b.len() == groups.len()
        },
    );
}

/// A gateway with ACLs on (everyone allowed what no ACL names) and admin
/// writes over HTTP.
fn acl_gateway(redis: &TestRedis) -> Ketch {
    Ketch::start(
        &redis.url(),
        &[
            "--set",
            "acl.enabled=true",
            "--set",
            "acl.allow_everyone_if_no_acl_found=true",
            "--set",
            "http.admin_writes=true",
        ],
    )
}

/// Creates `topics` (one partition each) over HTTP once the gateway has
/// read the (empty) ACLs: until then it refuses everyone.
fn create_once_acls_are_read(ketch: &Ketch, topics: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for topic in topics {
        let body = json!({"name": topic, "partitions": 1}).to_string();
        loop {
            let (status, created) = api(ketch, "POST", "/api/v1/topics", Some(&body));
            if status == 201 {
                break;
            }
            assert!(Instant::now() < deadline, "{created}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A group's offsets over HTTP leave out the topics the caller may not
/// describe, as OffsetFetch leaves them out (they showed every committed
/// topic's name, offset and high watermark).
#[test]
fn a_groups_offsets_over_http_leave_out_topics_the_caller_may_not_describe() {
    let redis = TestRedis::start();
    let ketch = acl_gateway(&redis);
    let (open, secret) = (unique_topic("open"), unique_topic("secret"));
    create_once_acls_are_read(&ketch, &[&open, &secret]);
    let group = unique_topic("watched");
    commit(&ketch, &group, &open, &[(0, 0)]);
    commit(&ketch, &group, &secret, &[(0, 0)]);
    // An ACL names the secret topic, for alice only: the caller
    // (User:ANONYMOUS) may no longer describe it.
    allow_on_topic(&ketch, &secret, "User:alice", 8);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, described) = api(&ketch, "GET", &format!("/api/v1/groups/{group}"), None);
        assert_eq!(status, 200, "{described}");
        let topics: Vec<&str> = described["offsets"]
            .as_array()
            .expect("offsets")
            .iter()
            .filter_map(|o| o["topic"].as_str())
            .collect();
        if topics == [open.as_str()] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the secret topic is still shown: {topics:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A reset of every topic the group committed resets those the caller
    // may describe, as Kafka's tool resets what its offset listing shows.
    let (status, reset) = api(
        &ketch,
        "POST",
        &format!("/api/v1/groups/{group}/offsets"),
        Some(r#"{"to": "latest"}"#),
    );
    assert_eq!(status, 200, "{reset}");
    let (_, described) = api(&ketch, "GET", &format!("/api/v1/groups/{group}"), None);
    assert_eq!(described["offsets"][0]["topic"], json!(open), "{described}");
    // The listing shows a group the caller may not describe, without its
    // offsets (its lag).
    assert_eq!(group_lag_listed(&ketch, &group), Some(json!(0)));
    allow_on(&ketch, 3, &group, "User:alice", 8);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while group_lag_listed(&ketch, &group) != Some(Value::Null) {
        assert!(
            std::time::Instant::now() < deadline,
            "the group's lag is still listed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A caller that may create a topic but not describe it is told it was
    // created (201 and its name), not refused after the fact.
    let blind = unique_topic("blind");
    allow_on_topic(&ketch, &blind, "User:ANONYMOUS", 5);
    let body = json!({"name": blind, "partitions": 1}).to_string();
    let (status, answer) = api(&ketch, "POST", "/api/v1/topics", Some(&body));
    assert_eq!((status, answer), (201, json!({"name": blind})));
}

/// A topic without remote storage has no archive lag: its sealed segments
/// wait for retention, not for the archive. The lag grew with them (up to
/// `retention.ms`, a week by default) in the API and the console.
#[test]
fn a_topic_that_does_not_archive_has_no_archive_lag() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "tiering.tick_interval=100ms"]);
    let topic = unique_topic("never-archived");
    ketch.create_topic_with(&runtime(), &topic, 1, &[("segment.ms", "50")]);
    produce(&ketch.producer(), &topic, 0, 10);
    let describe = || {
        let (status, described) = api(&ketch, "GET", &format!("/api/v1/topics/{topic}"), None);
        assert_eq!(status, 200, "{described}");
        described["partitions"][0].clone()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while describe()["segments_sealed"].as_i64() < Some(1) {
        assert!(Instant::now() < deadline, "no segment sealed");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A sealed segment's lag would be counted from its sealing on: it
    // stays 0 while time passes.
    let sealed = Instant::now();
    while sealed.elapsed() < Duration::from_millis(300) {
        let partition = describe();
        assert_eq!(partition["archive_lag_ms"], json!(0), "{partition}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A reset of a group's offsets that the caller may not make for every
/// topic (it may describe one but not read it, as OffsetCommit needs) is
/// refused whole: no offset moves. It reset the others, then answered 403.
#[test]
fn an_offset_reset_refused_for_one_topic_changes_no_offset() {
    let redis = TestRedis::start();
    let ketch = acl_gateway(&redis);
    let (open, read_only) = (unique_topic("reset-open"), unique_topic("reset-described"));
    create_once_acls_are_read(&ketch, &[&open, &read_only]);
    let group = unique_topic("reset-refused");
    commit(&ketch, &group, &open, &[(0, 5)]);
    commit(&ketch, &group, &read_only, &[(0, 5)]);
    // The caller may describe the second topic, no more.
    allow_on_topic(&ketch, &read_only, "User:ANONYMOUS", 8);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, refused) = api(
            &ketch,
            "POST",
            &format!("/api/v1/groups/{group}/offsets"),
            Some(r#"{"to": "earliest"}"#),
        );
        if status == 403 {
            assert_eq!(refused["error"], json!("TOPIC_AUTHORIZATION_FAILED"), "{refused}");
            break;
        }
        // Until the gateway has the new ACL, the reset is allowed: undo it.
        assert_eq!(status, 200, "{refused}");
        assert!(Instant::now() < deadline, "the reset is still allowed");
        commit(&ketch, &group, &open, &[(0, 5)]);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        committed(&ketch, &group, &open, 1),
        [5],
        "the open topic's offset did not move"
    );
}

/// The `lag` `GET /api/v1/groups` lists for `group` (`None`: not listed).
fn group_lag_listed(ketch: &Ketch, group: &str) -> Option<Value> {
    let (status, listed) = api(ketch, "GET", "/api/v1/groups", None);
    assert_eq!(status, 200, "{listed}");
    listed["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["group_id"] == json!(group))
        .map(|g| g["lag"].clone())
}

/// Creates an ALLOW ACL on the literal topic `topic` for `principal`
/// (`operation`: Kafka's code) and waits until the gateway holds it.
fn allow_on_topic(ketch: &Ketch, topic: &str, principal: &str, operation: i8) {
    allow_on(ketch, 2, topic, principal, operation);
}

/// [`allow_on_topic`] for a resource of any type (Kafka's code: 2 topic,
/// 3 group).
fn allow_on(ketch: &Ketch, resource_type: i8, topic: &str, principal: &str, operation: i8) {
    use kafka_protocol::messages::create_acls_request::AclCreation;
    use kafka_protocol::messages::{CreateAclsRequest, DescribeAclsRequest};
    use kafka_protocol::protocol::StrBytes;
    let mut conn = ketch_tests::raw::KafkaConn::connect(ketch.kafka_addr());
    let created = conn.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![
            AclCreation::default()
                .with_resource_type(resource_type)
                .with_resource_name(StrBytes::from_string(topic.to_owned()))
                .with_resource_pattern_type(3)
                .with_principal(StrBytes::from_string(principal.to_owned()))
                .with_host(StrBytes::from_static_str("*"))
                .with_operation(operation)
                .with_permission_type(3),
        ]),
    );
    assert_eq!(created.results[0].error_code, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let described = conn.request(
            3,
            &DescribeAclsRequest::default()
                .with_resource_type_filter(resource_type)
                .with_resource_name_filter(Some(StrBytes::from_string(topic.to_owned())))
                .with_pattern_type_filter(3)
                .with_principal_filter(None)
                .with_host_filter(None)
                .with_operation(1)
                .with_permission_type(1),
        );
        if !described.resources.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "the ACL never reached the gateway");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The admin API shows a topic's configs only to a caller with
/// DESCRIBE_CONFIGS on it (READ implies DESCRIBE, not that), as
/// DescribeConfigs does; and an offset reset tells a caller that may not
/// describe a topic nothing of whether it exists (403 for a missing topic
/// as for an existing one), as ListOffsets does.
#[test]
fn the_admin_api_shows_configs_and_topics_only_to_who_may_describe_them() {
    let redis = TestRedis::start();
    let ketch = acl_gateway(&redis);
    let (readable, open) = (unique_topic("readable"), unique_topic("open"));
    create_once_acls_are_read(&ketch, &[&readable, &open]);
    // The caller (User:ANONYMOUS) may read `readable`, nothing more; a
    // topic that does not exist is for alice alone.
    allow_on_topic(&ketch, &readable, "User:ANONYMOUS", 3);
    let ghost = unique_topic("ghost");
    allow_on_topic(&ketch, &ghost, "User:alice", 8);

    let (status, described) = api(&ketch, "GET", &format!("/api/v1/topics/{readable}"), None);
    assert_eq!(status, 200, "{described}");
    assert_eq!(described["partitions"].as_array().map(Vec::len), Some(1));
    assert!(described.get("configs").is_none(), "configs shown: {described}");
    let (status, described) = api(&ketch, "GET", &format!("/api/v1/topics/{open}"), None);
    assert_eq!(status, 200, "{described}");
    assert!(described["configs"]["retention.ms"].is_object(), "{described}");

    let group = unique_topic("reset");
    commit(&ketch, &group, &open, &[(0, 0)]);
    let reset = |topic: &str| {
        let body = json!({"to": "earliest", "topics": [topic]}).to_string();
        api(
            &ketch,
            "POST",
            &format!("/api/v1/groups/{group}/offsets"),
            Some(&body),
        )
        .0
    };
    assert_eq!(reset(&ghost), 403, "a topic the caller may not describe");
    assert_eq!(
        reset(&unique_topic("nowhere")),
        404,
        "a topic anyone may describe"
    );
}

/// The HTTP listener closes a connection that stalls half-way through a
/// request after `http.idle_timeout`, and holds at most
/// `http.max_connections`: a request beyond them is served once a stalled
/// one is closed, never before.
/// A client trickling a request byte by byte is cut off once the request
/// has taken `http.idle_timeout` from its first byte (each byte used to
/// start the idle time again, so it held its place for ever); and one
/// address holds at most `http.max_connections_per_ip` connections, so
/// other clients (health probes) are still served beside it.
#[test]
fn one_http_client_cannot_hold_the_listener() {
    use std::io::{Read, Write};
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "http.idle_timeout=1s",
            "--set",
            "http.max_connections_per_ip=1",
        ],
    );
    let address: std::net::SocketAddr = format!("127.0.0.1:{}", ketch.http_port()).parse().unwrap();
    let from = |ip: &str| ketch_tests::tcp_connect_from(ip.parse().unwrap(), address);
    let health = |mut conn: std::net::TcpStream| {
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = conn.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer);
        answer
    };
    let mut trickling = from("127.0.0.1");
    // Its address's only place is taken: another connection from it is
    // closed unanswered; one from another address is served.
    assert_eq!(
        health(from("127.0.0.1")),
        "",
        "a second connection from 127.0.0.1 was served"
    );
    assert!(health(from("127.0.0.2")).starts_with("HTTP/1.1 200"));
    let started = std::time::Instant::now();
    let request = b"GET /health HTTP/1.1\r\nHost: localhost\r\n";
    let mut cut = false;
    for byte in request.iter().cycle().take(200) {
        if trickling.write_all(&[*byte]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if started.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    assert!(
        cut,
        "a request trickled for {:?} is still open",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cut after {:?}",
        started.elapsed()
    );
    // Its place is given back.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !health(from("127.0.0.1")).starts_with("HTTP/1.1 200") {
        assert!(
            std::time::Instant::now() < deadline,
            "the trickler's place is never given back"
        );
    }
}

#[test]
fn stalled_http_connections_are_closed_and_bounded() {
    use std::io::{Read, Write};
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &["--set", "http.idle_timeout=1s", "--set", "http.max_connections=1"],
    );
    let address = format!("127.0.0.1:{}", ketch.http_port());
    let mut stalled = std::net::TcpStream::connect(&address).expect("connect");
    stalled
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        .expect("half a request");
    let sent = std::time::Instant::now();
    // The second connection waits in the backlog behind the stalled one.
    let mut waiting = std::net::TcpStream::connect(&address).expect("connect");
    waiting
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("a whole request");
    waiting.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = String::new();
    waiting.read_to_string(&mut answer).expect("answered");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        sent.elapsed() >= Duration::from_millis(900),
        "served beside the stalled connection after {:?}",
        sent.elapsed()
    );
    stalled.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    let _ = stalled.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the stalled request was answered: {rest:?}");
}

/// Any i64 may be committed as an offset (as to Kafka): the lag of one
/// below 0 is unknown (null), not an overflow (which panicked the handler
/// in debug builds and wrapped the sum in release ones).
#[test]
fn a_hostile_committed_offset_has_no_lag() {
    use ketch_tests::raw::{self, KafkaConn, code};
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), WRITES);
    let topic = unique_topic("hostile-offset");
    let group = unique_topic("hostile-offset-group");
    create(&ketch, &topic, 2);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    for (partition, offset) in [(0, i64::MIN), (1, -(1i64 << 62))] {
        let commit = raw::offset_commit_request(&group, "", -1, &topic, partition, offset);
        let response = conn.request(8, &commit);
        assert_eq!(response.topics[0].partitions[0].error_code, code::NONE);
    }
    let (status, described) = api(&ketch, "GET", &format!("/api/v1/groups/{group}"), None);
    assert_eq!(status, 200, "{described}");
    for offset in described["offsets"].as_array().expect("offsets") {
        assert_eq!(offset["lag"], Value::Null, "{described}");
    }
}

/// A gateway that cannot read the version of a set every gateway keeps
/// from Redis (here the cluster-wide topic defaults, checked every second)
/// says so: `ketch_shared_state_age_seconds` grows, and a warning is
/// logged after three checks' time; once Redis answers, another line says
/// the set is current again. Before, the failed reads were logged at debug
/// only, and a DENY added through another gateway went unapplied here
/// without a word.
#[test]
fn a_gateway_cut_off_from_a_shared_set_says_it_may_be_stale() {
    let redis = ketch_tests::RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "redis.command_timeout=1s"]);
    let defaults = [("state", "cluster-wide topic defaults")];
    let age = || {
        let (_, text) = ketch.http_get("/metrics");
        metric(&text, "ketch_shared_state_age_seconds", &defaults)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let fresh = loop {
        if let Some(age) = age() {
            break age;
        }
        assert!(Instant::now() < deadline, "no ketch_shared_state_age_seconds");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(fresh < 3.0, "age {fresh} s before Redis was frozen");
    let frozen = ketch_tests::Frozen::freeze(redis.pid());
    ketch.await_log(
        "cluster-wide topic defaults held here may be stale",
        Duration::from_secs(30),
    );
    let stale = age().expect("the gauge");
    assert!(stale >= 3.0, "age {stale} s with Redis frozen");
    drop(frozen);
    ketch.await_log(
        "cluster-wide topic defaults held here are current again",
        Duration::from_secs(30),
    );
}
