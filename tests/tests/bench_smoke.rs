//! ketch-bench against a real ketch and Redis: the benchmark client works
//! end to end, and its roundtrip accounts for every acknowledged record.

use std::process::Command;

use ketch_tests::{Ketch, RedisServer, ketch_bench_bin, unique_topic};

/// Runs ketch-bench with `args` and `--output json`; returns its exit
/// success and the result object.
fn bench(args: &[&str]) -> (bool, serde_json::Value) {
    let output = Command::new(ketch_bench_bin())
        .args(args)
        .args(["--output", "json", "--quiet"])
        .output()
        .expect("run ketch-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let result = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "ketch-bench printed no JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.success(), result)
}

#[test]
fn producer_consumer_and_roundtrip_account_for_every_record() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let bootstrap = ketch.bootstrap();
    let topic = unique_topic("bench");

    let (ok, produced) = bench(&[
        "producer",
        "--bootstrap-server",
        &bootstrap,
        "--topic",
        &topic,
        "--create-topic",
        "--partitions",
        "4",
        "--records",
        "5000",
        "--record-size",
        "200B",
    ]);
    assert!(ok, "{produced}");
    assert_eq!(produced["results"]["throughput"]["records"], 5000);
    assert_eq!(produced["results"]["records_failed"], 0);

    let (ok, consumed) = bench(&[
        "consumer",
        "--bootstrap-server",
        &bootstrap,
        "--topic",
        &topic,
        "--from",
        "beginning",
        "--records",
        "5000",
        "--validate",
        "checksum",
    ]);
    assert!(ok, "{consumed}");
    assert_eq!(consumed["results"]["throughput"]["records"], 5000);
    assert_eq!(consumed["results"]["invalid"], 0, "{consumed}");

    let roundtrip_topic = unique_topic("bench-rt");
    let (ok, roundtrip) = bench(&[
        "roundtrip",
        "--bootstrap-server",
        &bootstrap,
        "--topic",
        &roundtrip_topic,
        "--create-topic",
        "--partitions",
        "4",
        "--rate",
        "2000",
        "--duration",
        "2s",
        "--record-size",
        "100B",
    ]);
    assert!(ok, "{roundtrip}");
    let r = &roundtrip["results"];
    assert!(r["acked"].as_u64().unwrap() >= 3000, "{r}");
    assert_eq!(r["matched"], r["acked"], "{r}");
    for count in ["missing", "duplicates", "invalid"] {
        assert_eq!(r[count], 0, "{count}: {r}");
    }
    // At 2,000 records/s the sender waits 0.5 ms between records. A loop
    // that polled librdkafka for those waits (it counts whole milliseconds,
    // so each poll returned at once) spun a core: about 2 s of CPU in this
    // 2 s run. Waiting properly, the client needs a small part of that.
    let client_cpu_s = roundtrip["client"]["cpu_s"]
        .as_f64()
        .expect("client CPU reported");
    assert!(
        client_cpu_s < 1.0,
        "the client used {client_cpu_s} s of CPU in a 2 s run at 2,000 records/s"
    );
}

#[test]
fn redis_xadd_writes_one_stream_entry_per_record() {
    let redis = RedisServer::start();
    let (ok, result) = bench(&[
        "redis-xadd",
        "--redis-url",
        &redis.url(),
        "--stream",
        "bench:baseline",
        "--records",
        "3000",
        "--record-size",
        "1KB",
        "--pipeline",
        "500",
    ]);
    assert!(ok, "{result}");
    let len: i64 = redis::cmd("XLEN")
        .arg("bench:baseline")
        .query(&mut redis.connection())
        .unwrap();
    assert_eq!(len, 3000);
}

/// A run's time ends with its last reply. Runs used to be timed to when
/// the bench's main thread, checking every 50 ms, saw the producers'
/// flush return, and rdkafka's flush polls 100 ms at a time: a full-rate
/// preset of half a second was timed up to 150 ms long, in steps.
/// One record each way: the time between the start and the one reply is
/// setting up a client (about 1.5 ms here), under 40 ms even on a loaded
/// machine, where the old timing counted at least 50.
#[test]
fn runs_end_with_their_last_reply() {
    let redis = RedisServer::start();
    let (ok, xadd) = bench(&[
        "redis-xadd",
        "--redis-url",
        &redis.url(),
        "--stream",
        "bench:one",
        "--records",
        "1",
        "--pipeline",
        "1",
    ]);
    assert!(ok, "{xadd}");
    assert_timed_to_its_reply(&xadd, "pipeline_latency");

    let ketch = Ketch::start(&redis.url(), &[]);
    let (ok, produced) = bench(&[
        "producer",
        "--bootstrap-server",
        &ketch.bootstrap(),
        "--topic",
        &unique_topic("bench-one"),
        "--create-topic",
        "--records",
        "1",
    ]);
    assert!(ok, "{produced}");
    assert_timed_to_its_reply(&produced, "latency");
}

/// A one-record run's time exceeds its one reply's latency (the
/// `latency` figures of its result) by less than 40 ms.
fn assert_timed_to_its_reply(result: &serde_json::Value, latency: &str) {
    let seconds = result["results"]["throughput"]["seconds"].as_f64().unwrap();
    let reply_s = result["results"][latency]["max_ms"].as_f64().unwrap() / 1000.0;
    assert!(
        seconds - reply_s < 0.04,
        "its one reply came in {reply_s} s, the run was timed at {seconds} s: {result}"
    );
}
