//! A segment the archive cannot write is quarantined, never retried
//! forever (issue #10): a batch whose header claims more records than it
//! holds — what releases before full validation stored — sits in a sealed
//! segment of a remote-storage topic. The storage worker quarantines that
//! segment (kept in Redis, reported in `/metrics` and `ketch segments
//! list`), archives and trims the segments after it so Redis does not grow,
//! serves the quarantined batches from Redis, and an operator can retry it
//! or skip it, leaving a recorded hole that consumers read past.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ketch_tests::batch::{self, Codec, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Frozen, Ketch, RedisServer, ketch_command, runtime, unique_topic};
use rdkafka::message::Message;

/// Records per produced batch; each batch is sealed into its own segment.
const PER_SEGMENT: i64 = 20;
/// The poison batch claims this many records and holds PER_SEGMENT.
const CLAIMED: i64 = 25;
/// How much later than the others the poison batch's records are stamped.
const LATE: i64 = 1_000_000;

fn value(offset: i64) -> Vec<u8> {
    format!("record {offset:06} {}", "x".repeat(90)).into_bytes()
}

fn records(first: i64, count: i64) -> Vec<Record> {
    (first..first + count)
        .map(|o| Record::value(batch::at(1_000 + o), &value(o)))
        .collect()
}

fn local_start(redis: &RedisServer, topic: &str) -> i64 {
    let tag = &redis.topic_tags(topic)[0];
    redis::cmd("HGET")
        .arg(format!("ketch:{{{tag}}}:meta"))
        .arg("local_start")
        .query(&mut redis.connection())
        .expect("HGET local_start")
}

fn quarantine_len(redis: &RedisServer, topic: &str) -> i64 {
    let tag = &redis.topic_tags(topic)[0];
    redis::cmd("XLEN")
        .arg(format!("ketch:{{{tag}}}:quarantine"))
        .query(&mut redis.connection())
        .expect("XLEN quarantine")
}

/// Waits until `done` holds of the partition's segments.
fn wait_segments(
    redis: &RedisServer,
    ketch: &Ketch,
    topic: &str,
    what: &str,
    done: impl Fn(&[serde_json::Value]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = redis.segments(topic, 0);
        if done(&now) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: segments {now:?}\nmetrics:\n{}",
            ketch.http_get("/metrics").1
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `batch` as the next batch of partition 0 through the storage
/// layer directly, as an earlier release's gateway would have stored it.
fn store_unvalidated(redis: &RedisServer, topic: &str, batch: Vec<u8>) {
    use ketch_storage::Store;
    let config = ketch_tests::store_config(&redis.url());
    runtime().block_on(async {
        let store = Store::new(&config).expect("store");
        let topic = store.topic(topic).await.expect("topic").expect("exists");
        let header = ketch_storage::batch::header(&batch).expect("header");
        store
            .append(&topic, 0, &Bytes::from(batch), &header, false)
            .await
            .expect("stored");
    });
}

/// Runs `ketch segments <args>`: whether it succeeded, and its output.
fn run_segments(redis: &RedisServer, args: &[&str]) -> (bool, String) {
    let output = ketch_command()
        .arg("segments")
        .args(args)
        .args(["--redis-url", &redis.url()])
        .output()
        .expect("run ketch segments");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn ketch_segments(redis: &RedisServer, args: &[&str]) -> String {
    let (ok, text) = run_segments(redis, args);
    assert!(ok, "ketch segments {args:?}: {text}");
    text
}

fn metric(ketch: &Ketch, name: &str) -> f64 {
    let body = ketch.http_get("/metrics").1;
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no metric {name} in:\n{body}"))
}

fn tiered_gateway(redis: &RedisServer, data_dir: &Path) -> Ketch {
    let data = format!("tiering.data_dir={}", data_dir.display());
    Ketch::start(
        &redis.url(),
        &["--set", "tiering.tick_interval=100ms", "--set", &data],
    )
}

/// A new one-partition remote topic (name from `prefix`) kept for ever,
/// each batch sealed into a segment of its own, trimmed from Redis once
/// archived (`local.retention.bytes` 0).
fn remote_topic(ketch: &Ketch, prefix: &str) -> String {
    let topic = unique_topic(prefix);
    ketch.create_topic_with(
        &runtime(),
        &topic,
        1,
        &[
            ("remote.storage.enable", "true"),
            ("retention.ms", "-1"),
            ("segment.bytes", "100"),
            ("local.retention.bytes", "0"),
        ],
    );
    topic
}

/// A [`remote_topic`] with three sealed segments of PER_SEGMENT records;
/// its name and the connection that produced them.
fn three_segments(redis: &RedisServer, ketch: &Ketch, prefix: &str) -> (String, KafkaConn) {
    let topic = remote_topic(ketch, prefix);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    for segment in 0..3 {
        let first = segment * PER_SEGMENT;
        let (error, base) = raw::produce(&mut conn, &topic, 0, batch::encode(&records(first, PER_SEGMENT)));
        assert_eq!((error, base), (code::NONE, first));
        wait_segments(redis, ketch, &topic, "sealing", |s| s.len() > segment as usize);
    }
    (topic, conn)
}

#[test]
fn a_segment_the_archive_cannot_write_is_quarantined_served_from_redis_and_skipped_by_an_operator() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisServer::start();
    let ketch = tiered_gateway(&redis, dir.path());
    let topic = remote_topic(&ketch, "quarantine");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    // Segment 0: good; segment 1: the poison batch; segments 2-4: good.
    let mut next = 0;
    for segment in 0..5 {
        if segment == 1 {
            // Its records are the partition's latest by timestamp.
            let late: Vec<Record> = (next..next + PER_SEGMENT)
                .map(|o| Record::value(batch::at(LATE + o), &value(o)))
                .collect();
            store_unvalidated(
                &redis,
                &topic,
                batch::encode_compressed(&late, Codec::Lz4, CLAIMED as i32),
            );
            next += CLAIMED;
        } else {
            let (error, base) =
                raw::produce(&mut conn, &topic, 0, batch::encode(&records(next, PER_SEGMENT)));
            assert_eq!((error, base), (code::NONE, next));
            next += PER_SEGMENT;
        }
        wait_segments(&redis, &ketch, &topic, "sealing", |s| s.len() > segment);
    }
    let poison_base = PER_SEGMENT;
    let end = next;

    // Archiving goes on past the poison segment, and Redis is trimmed past it.
    wait_segments(
        &redis,
        &ketch,
        &topic,
        "archiving around the poison segment",
        |s| {
            s.len() == 5
                && s.iter().enumerate().all(|(i, s)| {
                    if i == 1 {
                        s.get("quarantine").is_some()
                    } else {
                        s.get("path").is_some()
                    }
                })
        },
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while local_start(&redis, &topic) < end {
        assert!(
            Instant::now() < deadline,
            "local retention stopped at {}",
            local_start(&redis, &topic)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        quarantine_len(&redis, &topic),
        1,
        "the poison batch stays in Redis"
    );
    assert_eq!(metric(&ketch, "ketch_archive_quarantined_segments"), 1.0);
    assert!(metric(&ketch, "ketch_archive_quarantines_total") >= 1.0);
    let segment = &redis.segments(&topic, 0)[1];
    let reason = segment["quarantine"]["reason"]
        .as_str()
        .expect("reason")
        .to_owned();
    assert!(reason.contains("records missing"), "{reason}");
    let listed = ketch_segments(&redis, &["list"]);
    assert!(
        listed.contains(&topic) && listed.contains("quarantined"),
        "{listed}"
    );

    // The quarantined batch is served, from Redis, as it was stored.
    let fetched = conn.request(
        raw::FETCH_VERSION,
        &raw::fetch_request(&topic, 0, poison_base + 3, 0),
    );
    let (error, _, records) = raw::fetch_result(&fetched);
    assert_eq!(error, code::NONE);
    let records = records.expect("records");
    assert_eq!(i64::from_be_bytes(records[0..8].try_into().unwrap()), poison_base);
    assert_eq!(raw::count_records(&records), CLAIMED);
    // Lookups by time search it where Fetch reads it, below the local
    // start: the first record at or after a timestamp inside it, and the
    // largest timestamp (ListOffsets -3), are its records'.
    let late = |offset: i64| batch::at(LATE + offset);
    assert_eq!(
        raw::list_offsets(&mut conn, &topic, 0, late(poison_base + 5)),
        (code::NONE, poison_base + 5, late(poison_base + 5))
    );
    let last = poison_base + PER_SEGMENT - 1;
    assert_eq!(
        raw::list_offsets(&mut conn, &topic, 0, -3),
        (code::NONE, last, late(last))
    );
    // Archived segments on both sides of it read as produced.
    for offset in [0, poison_base + CLAIMED] {
        let consumer = ketch.consumer_at(&topic, &[0], offset);
        let message = consumer
            .poll(Duration::from_secs(20))
            .expect("a record")
            .expect("consume");
        assert_eq!(message.offset(), offset);
        assert_eq!(message.payload(), Some(&value(offset)[..]));
    }

    // A retry fails the same way: the segment stays quarantined.
    let retried = ketch_segments(&redis, &["retry", &topic, "0", &poison_base.to_string()]);
    assert!(retried.contains("retry requested"), "{retried}");
    wait_segments(&redis, &ketch, &topic, "the retry", |s| {
        s[1]["quarantine"]["retry"] == serde_json::Value::Bool(false)
            && s[1]["quarantine"]["at"] != segment["quarantine"]["at"]
    });
    assert_eq!(quarantine_len(&redis, &topic), 1);

    // While a storage worker holds the partition's archiving registration
    // (it may be archiving the batches a skip deletes), a skip is refused
    // and changes nothing.
    let archiving = format!("ketch:{{{}}}:archiving", redis.topic_tags(&topic)[0]);
    let () = redis::cmd("SET")
        .arg(&archiving)
        .arg("another-worker")
        .arg("PX")
        .arg(60_000)
        .query(&mut redis.connection())
        .expect("SET");
    let (ok, refused) = run_segments(
        &redis,
        &[
            "skip",
            &topic,
            "0",
            &poison_base.to_string(),
            "--reason",
            "too soon",
        ],
    );
    assert!(!ok && refused.contains("archiving registration"), "{refused}");
    assert_eq!(
        quarantine_len(&redis, &topic),
        1,
        "the refused skip deleted nothing"
    );
    assert!(redis.segments(&topic, 0)[1]["skipped"].is_null());
    let () = redis::cmd("DEL")
        .arg(&archiving)
        .query(&mut redis.connection())
        .expect("DEL");

    // Skipping it deletes its batches and records the hole, even with a
    // retry requested that no worker gets to (the gateway frozen): the skip
    // holds the registration itself meanwhile.
    let frozen = Frozen::freeze(ketch.pid());
    ketch_segments(&redis, &["retry", &topic, "0", &poison_base.to_string()]);
    let skipped = ketch_segments(
        &redis,
        &[
            "skip",
            &topic,
            "0",
            &poison_base.to_string(),
            "--reason",
            "written by a broken release",
        ],
    );
    drop(frozen);
    assert!(skipped.contains("hole"), "{skipped}");
    assert_eq!(quarantine_len(&redis, &topic), 0);
    let hole = &redis.segments(&topic, 0)[1]["skipped"];
    assert_eq!(hole["reason"], "written by a broken release");
    assert!(
        hole["error"]
            .as_str()
            .unwrap_or_default()
            .contains("records missing"),
        "{hole}"
    );
    assert!(ketch_segments(&redis, &["list", "--topic", &topic]).contains("skipped (hole)"));
    assert_eq!(redis.segments(&topic, 0)[1]["purge"], serde_json::Value::Null);

    // A deletion of the copy cut short (the command killed between the
    // skip and the deletion: the segment still says `purge`, a batch still
    // in the quarantine stream) is finished by the storage worker.
    let tag = &redis.topic_tags(&topic)[0];
    let (segments_key, quarantine_key) = (
        format!("ketch:{{{tag}}}:segments"),
        format!("ketch:{{{tag}}}:quarantine"),
    );
    let mut conn = redis.connection();
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(&segments_key)
        .arg(poison_base)
        .arg(poison_base)
        .arg("BYSCORE")
        .query(&mut conn)
        .expect("ZRANGE");
    let mut skipped: serde_json::Value = serde_json::from_str(&members[0]).expect("segment JSON");
    skipped["purge"] = serde_json::Value::Bool(true);
    let () = redis::pipe()
        .atomic()
        .cmd("ZREM")
        .arg(&segments_key)
        .arg(&members[0])
        .ignore()
        .cmd("ZADD")
        .arg(&segments_key)
        .arg(poison_base)
        .arg(skipped.to_string())
        .ignore()
        .cmd("DEL")
        .arg(&quarantine_key)
        .ignore()
        .cmd("XADD")
        .arg(&quarantine_key)
        .arg(format!("{poison_base}-1"))
        .arg("b")
        .arg("left behind")
        .ignore()
        .query(&mut conn)
        .expect("emulate a cut-short deletion");
    assert_eq!(quarantine_len(&redis, &topic), 1);
    wait_segments(&redis, &ketch, &topic, "the copy's deletion", |s| {
        s[1]["purge"] == serde_json::Value::Null
    });
    assert_eq!(quarantine_len(&redis, &topic), 0);
    let (ok, refused) = run_segments(&redis, &["retry", &topic, "0", &poison_base.to_string()]);
    assert!(!ok && refused.contains("not quarantined"), "{refused}");

    // A consumer from the start reads past the hole.
    let consumer = ketch.consumer_at(&topic, &[0], 0);
    let mut offsets = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while offsets.last().is_none_or(|last| *last < end - 1) {
        assert!(Instant::now() < deadline, "read only {offsets:?}");
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.expect("consume");
        assert_eq!(message.payload(), Some(&value(message.offset())[..]));
        offsets.push(message.offset());
    }
    let expected: Vec<i64> = (0..poison_base).chain(poison_base + CLAIMED..end).collect();
    assert_eq!(offsets, expected);
}

/// A data file the object store lost leaves its offsets failing
/// (KAFKA_STORAGE_ERROR, counted in `ketch_remote_read_failures_total`)
/// until an operator gives up on the segment with `ketch segments skip`:
/// refused while the file is there, done once it is missing; its offsets
/// are then a hole consumers read past, as a skipped quarantined segment's.
#[test]
fn an_archived_segment_whose_data_file_was_lost_can_be_skipped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisServer::start();
    let ketch = tiered_gateway(&redis, dir.path());
    let (topic, mut conn) = three_segments(&redis, &ketch, "lost-file");
    let end = 3 * PER_SEGMENT;
    wait_segments(&redis, &ketch, &topic, "archiving", |s| {
        s.len() == 3 && s.iter().all(|s| s.get("path").is_some())
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while local_start(&redis, &topic) < end {
        assert!(Instant::now() < deadline, "local retention stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
    let lost = PER_SEGMENT.to_string();
    let skip = ["skip", &topic, "0", &lost, "--reason", "lost by the store"];

    // While its file is there, the segment is not given up on.
    let (ok, refused) = run_segments(&redis, &skip);
    assert!(!ok && refused.contains("is there"), "{refused}");
    assert!(redis.segments(&topic, 0)[1]["skipped"].is_null());

    // Run where the warehouse is not to be seen (not mounted here, other
    // settings), every file looks missing: refused.
    let path = redis.segments(&topic, 0)[1]["path"]
        .as_str()
        .expect("a data file")
        .to_owned();
    let file = std::path::PathBuf::from(path.strip_prefix("file://").expect("a local file"));
    let warehouse = dir.path().join("warehouse");
    let away = dir.path().join("warehouse-away");
    assert!(file.starts_with(&warehouse), "{path}");
    std::fs::rename(&warehouse, &away).expect("move the warehouse away");
    let (ok, refused) = run_segments(&redis, &skip);
    std::fs::rename(&away, &warehouse).expect("move the warehouse back");
    assert!(!ok && refused.contains("missing too"), "{refused}");
    assert!(redis.segments(&topic, 0)[1]["skipped"].is_null());

    // The object store loses it: fetches of its offsets fail.
    std::fs::remove_file(&file).expect("remove the data file");
    let fetch_at = |conn: &mut KafkaConn, offset: i64| {
        let (error, _, records) =
            raw::fetch_result(&conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, offset, 0)));
        let first = records
            .filter(|r| !r.is_empty())
            .map(|r| i64::from_be_bytes(r[0..8].try_into().unwrap()));
        (error, first)
    };
    assert_eq!(
        fetch_at(&mut conn, PER_SEGMENT + 3),
        (code::KAFKA_STORAGE_ERROR, None)
    );
    assert!(metric(&ketch, "ketch_remote_read_failures_total") >= 1.0);

    // Given up on: a hole, recorded with the reason and the lost file.
    let skipped = ketch_segments(&redis, &skip);
    assert!(skipped.contains("hole"), "{skipped}");
    let segment = &redis.segments(&topic, 0)[1];
    assert_eq!(segment["skipped"]["reason"], "lost by the store");
    assert!(
        segment["skipped"]["error"]
            .as_str()
            .unwrap_or_default()
            .contains(&path),
        "{segment}"
    );
    assert!(segment["path"].is_null(), "{segment}");
    assert_eq!(segment["lost"], true, "{segment}");
    assert!(ketch_segments(&redis, &["list", "--topic", &topic]).contains("skipped (hole)"));
    // Its offsets read past the hole; the segments around it as produced.
    assert_eq!(
        fetch_at(&mut conn, PER_SEGMENT + 3),
        (code::NONE, Some(2 * PER_SEGMENT))
    );
    let consumer = ketch.consumer_at(&topic, &[0], 0);
    let mut offsets = Vec::new();
    while offsets.len() < 2 * PER_SEGMENT as usize {
        let message = consumer
            .poll(Duration::from_secs(20))
            .expect("a record")
            .expect("consume");
        assert_eq!(message.payload(), Some(&value(message.offset())[..]));
        offsets.push(message.offset());
    }
    let expected: Vec<i64> = (0..PER_SEGMENT).chain(2 * PER_SEGMENT..end).collect();
    assert_eq!(offsets, expected);
}

/// A quarantined copy whose segment was never quarantined (a gateway
/// stopped between copying the segment to the quarantine stream and
/// recording its quarantine, the segment archived from the log since) is
/// deleted by the storage worker: nothing else would, with retention.ms -1,
/// and while the stream holds batches every tick lists all of the
/// partition's segments.
#[test]
fn a_quarantined_copy_of_a_segment_never_quarantined_is_deleted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisServer::start();
    let ketch = tiered_gateway(&redis, dir.path());
    let (topic, _conn) = three_segments(&redis, &ketch, "orphan-copy");
    wait_segments(&redis, &ketch, &topic, "archiving", |s| {
        s.len() == 3 && s.iter().all(|s| s.get("path").is_some())
    });
    // The second segment's copy, left behind; the segment is archived.
    let tag = &redis.topic_tags(&topic)[0];
    let _: String = redis::cmd("XADD")
        .arg(format!("ketch:{{{tag}}}:quarantine"))
        .arg(format!("{}-{PER_SEGMENT}", 2 * PER_SEGMENT - 1))
        .arg("b")
        .arg("left behind")
        .query(&mut redis.connection())
        .expect("XADD");
    assert_eq!(quarantine_len(&redis, &topic), 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while quarantine_len(&redis, &topic) > 0 {
        assert!(Instant::now() < deadline, "the orphaned copy stays");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        redis
            .segments(&topic, 0)
            .iter()
            .all(|s| s.get("purge").is_none() && s.get("path").is_some()),
        "{:?}",
        redis.segments(&topic, 0)
    );
}
