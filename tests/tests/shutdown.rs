//! Graceful shutdown: on SIGTERM the in-flight request still gets its answer
//! and the process exits 0. SIGHUP does not stop it.

use std::time::{Duration, Instant};

use kafka_protocol::messages::FetchRequest;
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, unique_topic};

#[test]
fn sigterm_answers_the_parked_fetch_then_exits_zero() {
    let redis = RedisServer::start();
    let mut ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("shutdown");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);

    // A long poll on an empty partition: it parks for up to 5 s.
    conn.send(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 0, 5_000));
    ketch.await_inflight_requests(1);
    let signalled = Instant::now();
    ketch.terminate();

    let response = conn.receive::<FetchRequest>(raw::FETCH_VERSION);
    let answered = signalled.elapsed();
    let (error, high_watermark, records) = raw::fetch_result(&response);
    assert_eq!(
        (error, high_watermark),
        (code::NONE, 0),
        "the parked fetch's answer"
    );
    assert_eq!(records.as_deref().map_or(0, raw::count_records), 0);
    assert!(
        answered < Duration::from_secs(3),
        "answered {answered:?} after SIGTERM: at its 5 s limit, not at the shutdown"
    );

    let status = ketch
        .wait_exit(Duration::from_secs(20))
        .expect("ketch still running 20 s after SIGTERM");
    assert!(status.success(), "exit status {status}");
    eprintln!(
        "fetch answered {answered:?} after SIGTERM; exited {:?} after",
        signalled.elapsed()
    );
}

#[test]
fn sigterm_when_idle_exits_zero() {
    let redis = RedisServer::start();
    let mut ketch = Ketch::start(&redis.url(), &[]);
    ketch.terminate();
    let status = ketch
        .wait_exit(Duration::from_secs(20))
        .expect("ketch still running 20 s after SIGTERM");
    assert!(status.success(), "exit status {status}");
}

/// SIGHUP reloads the TLS files (docs/security.md); a gateway without TLS
/// goes on serving too, where the signal's default action ended it on the
/// spot (no drain, its leases held until they expired).
#[test]
fn sighup_does_not_stop_a_gateway_without_tls() {
    let redis = RedisServer::start();
    let mut ketch = Ketch::start(&redis.url(), &[]);
    let status = std::process::Command::new("kill")
        .args(["-HUP", &ketch.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    // A signal is delivered before the process runs again: answered, it
    // survived it.
    assert_eq!(ketch.http_get("/ready").0, 200, "serving after SIGHUP");
    let topic = unique_topic("sighup");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    assert!(ketch.wait_exit(Duration::ZERO).is_none(), "still running");
}

/// On SIGTERM a gateway first drains for `broker.shutdown_delay`: `/ready`
/// answers 503, so a load balancer takes it out, while it still serves
/// (a new connection's request too); then it stops. Before, every listener
/// closed at the signal while the balancer still sent clients to it.
#[test]
fn sigterm_first_takes_the_gateway_out_of_the_load_balancer_then_stops() {
    let redis = RedisServer::start();
    let mut ketch = Ketch::start(&redis.url(), &["--set", "broker.shutdown_delay=3s"]);
    assert_eq!(ketch.http_get("/ready").0, 200);
    ketch.terminate();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, body) = ketch.http_get("/ready");
        if status == 503 {
            assert!(body.contains("shutting down"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "/ready still {status} after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    let topic = unique_topic("draining");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(
        raw::create_topic(&mut conn, &topic, 1),
        code::NONE,
        "served while draining"
    );
    let status = ketch
        .wait_exit(Duration::from_secs(20))
        .expect("ketch still running 20 s after SIGTERM");
    assert!(status.success(), "exit status {status}");
}
