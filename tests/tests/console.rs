//! The web console in a real headless Chromium (Debian's `chromium`), and
//! Redis running out of memory as `/ready`, the admin API and the metrics
//! report it. One Redis server (the memory limit is set on it).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use ketch_tests::{Ketch, RedisServer, runtime, unique_topic};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Value, json};

fn chromium() -> PathBuf {
    for candidate in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("sh")
            .args(["-c", &format!("command -v {candidate}")])
            .output()
            && out.status.success()
        {
            return PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        }
    }
    panic!("no headless Chromium: apt-get install chromium (scripts/test.sh installs it)");
}

/// Runs headless Chromium on `url` with `args`; its stdout.
fn run_chromium(url: &str, args: &[&str]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--window-size=1280,1000",
            // Let the page's fetches and first refresh finish before the dump.
            "--virtual-time-budget=8000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_console_renders_the_topics_and_groups_in_a_real_browser() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "http.admin_writes=true"]);
    let topic = unique_topic("console");
    let group = unique_topic("console-group");
    let (status, body) = ketch.http(
        "POST",
        "/api/v1/topics",
        Some(&json!({"name": topic, "partitions": 2}).to_string()),
    );
    assert_eq!(status, 201, "{body}");
    let producer = ketch.producer();
    runtime().block_on(async {
        for i in 0..5 {
            producer
                .send(
                    FutureRecord::<(), _>::to(&topic)
                        .partition(0)
                        .payload(&format!("r{i}")),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
                .expect("delivered");
        }
    });
    let consumer = ketch.consumer_with(&[("group.id", group.as_str())]);
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset(&topic, 0, Offset::Offset(2))
        .expect("offset");
    consumer.commit(&offsets, CommitMode::Sync).expect("commit");

    let url = format!("http://127.0.0.1:{}/", ketch.http_port());
    let dom = run_chromium(&url, &["--dump-dom"]);
    assert!(
        dom.contains(r#"data-loaded="true""#),
        "the page never loaded its data:\n{dom}"
    );
    assert!(
        dom.contains(&format!(r#"data-topic="{topic}""#)),
        "topic {topic} not shown:\n{dom}"
    );
    assert!(
        dom.contains(&format!(r#"data-group="{group}""#)),
        "group {group} not shown:\n{dom}"
    );
    assert!(dom.contains("lag 3"), "the group's lag (5 − 2) not shown:\n{dom}");
    assert!(
        dom.contains("this gateway") && dom.contains("1 gateway(s)"),
        "the gateways not shown:\n{dom}"
    );

    let artifacts = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifact dir");
    let shot = artifacts.join("console.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(&url, &[&format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "not a screenshot: {} bytes",
        png.len()
    );
    eprintln!("console screenshot: {}", shot.display());
}

fn json_get(ketch: &Ketch, path: &str) -> Value {
    let (status, body) = ketch.http_get(path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

#[test]
fn redis_out_of_memory_fails_ready_and_shows_in_the_api_and_metrics() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("crowded");
    let producer = ketch.producer_with(&[("message.timeout.ms", "3000"), ("retries", "0")]);
    let send = || {
        runtime().block_on(async {
            producer
                .send(
                    FutureRecord::<(), _>::to(&topic).payload("x"),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
        })
    };
    send().expect("room for the first record");
    let (status, body) = ketch.http_get("/ready");
    assert_eq!((status, body.as_str()), (200, "ready\n"));

    let mut conn = redis.connection();
    let set = |conn: &mut redis::Connection, bytes: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(bytes)
            .query(conn)
            .expect("CONFIG SET maxmemory");
    };
    set(&mut conn, "1");
    assert!(send().is_err(), "an append with Redis out of memory");
    let (status, body) = ketch.http_get("/ready");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("refuses writes") && body.contains("noeviction"),
        "{body}"
    );
    let health = json_get(&ketch, "/api/v1/redis");
    assert_eq!(health["refuses_writes"], true, "{health}");
    assert!(
        health["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("maxmemory")),
        "{health}"
    );
    assert!(
        health["servers"][0]["rejected_writes"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{health}"
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, text) = ketch.http_get("/metrics");
        let oom = text
            .lines()
            .any(|l| l.starts_with("ketch_redis_errors_total{kind=\"oom\"}") && !l.ends_with(" 0"));
        let rejected = text
            .lines()
            .any(|l| l.starts_with("ketch_redis_rejected_writes_total{") && !l.ends_with(" 0"));
        if oom && rejected {
            break;
        }
        assert!(Instant::now() < deadline, "OOM never in the metrics:\n{text}");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        ketch.logs("refuses writes"),
        "a warning in the log:\n{}",
        ketch.output()
    );

    set(&mut conn, "0");
    let (status, body) = ketch.http_get("/ready");
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    send().expect("appends again once Redis has room");
}
