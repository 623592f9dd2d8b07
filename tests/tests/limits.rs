//! One frame must not ask for gigabytes, and no client may pin unbounded
//! resources (issue #10): a small request naming a long topic once per
//! partition, array lengths claiming billions of elements under an
//! address-space limit (no overcommit to hide behind), connection counts,
//! idle connections, and a client that sends fetches but reads no answers;
//! what fetches read from Redis: about what they return, the partitions of
//! one fetch together (not one round trip after another), in request order.

use std::time::{Duration, Instant};

use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiVersionsRequest, FetchRequest, GroupId, OffsetFetchRequest, ProduceRequest,
};
use kafka_protocol::protocol::StrBytes;
use ketch_tests::batch::{self, Record};
use ketch_tests::proxy::DelayProxy;
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, unique_topic};

/// The bound on the gateway's peak resident memory under these frames.
const PEAK_LIMIT_KIB: u64 = 256 * 1024;
const PARTITIONS: i32 = 100_000;
const INVALID_TOPIC_EXCEPTION: i16 = 17;

/// A topic name no topic can have (Kafka allows 249 characters): as long
/// as a protocol string can be, 32 KiB less one byte.
fn long_name() -> StrBytes {
    StrBytes::from_string("t".repeat(i16::MAX as usize))
}

fn alive(ketch: &Ketch) {
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("ketch-tests"))
        .with_client_software_version(StrBytes::from_static_str("0"));
    assert_eq!(
        conn.request(3, &request).error_code,
        code::NONE,
        "the gateway still answers"
    );
}

/// Produce v3 naming one 32 KiB topic with 100,000 partitions: about
/// 0.8 MiB that a gateway copying the name per partition turned into
/// gigabytes.
fn amplifying_produce() -> ProduceRequest {
    let partitions = (0..PARTITIONS)
        .map(|index| {
            PartitionProduceData::default()
                .with_index(index)
                .with_records(None)
        })
        .collect();
    ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(kafka_protocol::messages::TopicName(long_name()))
                .with_partition_data(partitions),
        ])
}

fn amplifying_offset_fetch() -> OffsetFetchRequest {
    OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("g")))
        .with_topics(Some(vec![
            OffsetFetchRequestTopic::default()
                .with_name(kafka_protocol::messages::TopicName(long_name()))
                .with_partition_indexes((0..PARTITIONS).collect()),
        ]))
}

#[test]
fn small_frames_naming_a_long_topic_per_partition_stay_within_256_mib() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let produce = amplifying_produce();
    let frame = conn.frame(3, &produce);
    assert!(frame.len() < 900 * 1024, "the frame is {} bytes", frame.len());
    for _ in 0..3 {
        let response = conn.request(3, &produce);
        let partitions = &response.responses[0].partition_responses;
        assert_eq!(partitions.len(), PARTITIONS as usize);
        assert!(partitions.iter().all(|p| p.error_code == INVALID_TOPIC_EXCEPTION));
    }
    let offset_fetch = amplifying_offset_fetch();
    for _ in 0..3 {
        let response = conn.request(7, &offset_fetch);
        let partitions = &response.topics[0].partitions;
        assert_eq!(partitions.len(), PARTITIONS as usize);
        assert!(partitions.iter().all(|p| p.committed_offset == -1));
    }
    let peak = ketch.status_kib("VmHWM");
    eprintln!(
        "peak RSS after 3 amplifying Produce and 3 OffsetFetch frames: {} MiB",
        peak / 1024
    );
    assert!(peak <= PEAK_LIMIT_KIB, "peak RSS {peak} KiB");
    alive(&ketch);
}

#[test]
fn under_an_address_space_limit_frames_claiming_billions_of_elements_leave_the_gateway_serving() {
    let redis = RedisServer::start();
    // 2 GiB of address space: the gateway itself maps about 200 MiB, and no
    // allocator can hand out a claimed array of 2^31 elements within it.
    let ketch = Ketch::start_wrapped(&["prlimit", "--as=2147483648", "--"], &redis.url(), &[]);
    for (version, count) in [
        (3i16, i32::MAX.to_be_bytes().to_vec()),
        (9, vec![0xff, 0xff, 0xff, 0xff, 0x0f]),
    ] {
        let mut conn = KafkaConn::connect(ketch.kafka_addr());
        conn.send_raw(&raw::produce_claiming_topics(version, &count))
            .expect("send");
        assert!(
            conn.closed_within(Duration::from_secs(10)),
            "connection still open (v{version})"
        );
    }
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let response = conn.request(3, &amplifying_produce());
    assert_eq!(
        response.responses[0].partition_responses.len(),
        PARTITIONS as usize
    );
    alive(&ketch);
}

#[test]
fn connections_beyond_the_limit_are_closed_and_idle_ones_time_out() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "broker.max_connections=2",
            "--set",
            "broker.connections_max_idle=1s",
        ],
    );
    let request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("ketch-tests"))
        .with_client_software_version(StrBytes::from_static_str("0"));
    let mut first = KafkaConn::connect(ketch.kafka_addr());
    let mut second = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(first.request(3, &request).error_code, code::NONE);
    assert_eq!(second.request(3, &request).error_code, code::NONE);
    // A request on it: an admitted connection would answer it (and fail
    // `closed_within`), where its idle timeout alone would close it too.
    let mut third = KafkaConn::connect(ketch.kafka_addr());
    third.send(3, &request);
    assert!(
        third.closed_within(Duration::from_secs(5)),
        "a third connection stays open"
    );
    // Idle for broker.connections_max_idle: closed, which frees their slots.
    assert!(
        first.closed_within(Duration::from_secs(10)),
        "an idle connection stays open"
    );
    assert!(
        second.closed_within(Duration::from_secs(10)),
        "an idle connection stays open"
    );
    let mut again = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(again.request(3, &request).error_code, code::NONE);
    assert!(
        ketch
            .output()
            .contains("broker.max_connections (2) connections are open")
    );
}

/// `broker.max_connections_per_ip` (0 here: none but the addresses named)
/// and its overrides (a host name's addresses, an address): a connection
/// beyond its address's limit is closed unanswered, other addresses are
/// not held by it, and a closed connection gives its place back.
#[test]
fn connections_beyond_their_addresss_limit_are_closed() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "broker.max_connections_per_ip=0",
            "--set",
            "broker.max_connections_per_ip_overrides=localhost:2,127.0.0.2:1",
        ],
    );
    let request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("ketch-tests"))
        .with_client_software_version(StrBytes::from_static_str("0"));
    let from = |ip: &str| KafkaConn::connect_from(ip.parse().unwrap(), ketch.kafka_addr());
    // Refused: closed without an answer to the request sent on it.
    let refused = |mut conn: KafkaConn| {
        conn.send(3, &request);
        conn.answered_within(Duration::from_secs(5)) == Some(false)
    };
    let mut first = from("127.0.0.1");
    let mut second = from("127.0.0.1");
    assert_eq!(first.request(3, &request).error_code, code::NONE);
    assert_eq!(second.request(3, &request).error_code, code::NONE);
    assert!(
        refused(from("127.0.0.1")),
        "a third connection from localhost stays open"
    );
    let mut other = from("127.0.0.2");
    assert_eq!(
        other.request(3, &request).error_code,
        code::NONE,
        "another address's own limit"
    );
    assert!(
        refused(from("127.0.0.2")),
        "a second connection from 127.0.0.2 stays open"
    );
    assert!(refused(from("127.0.0.3")), "an address not named may not connect");
    // A connection closed gives its place back (once the gateway sees it go).
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut next = from("127.0.0.1");
        next.send(3, &request);
        if next.answered_within(Duration::from_secs(5)) == Some(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed connection's place is never given back"
        );
    }
    assert_eq!(second.request(3, &request).error_code, code::NONE);
    assert!(
        ketch
            .output()
            .contains("the address has its maximum of 2 connections open (broker.max_connections_per_ip)")
    );
}

/// A fetch names its topic by id (v13 on): a known id is checked against
/// its name's record (one HGET), not by reading the whole topic registry,
/// and an unknown one is looked for by one listing for the fetches that
/// name it within half a second. Before, every fetch past the cache's half
/// second, and every fetch naming an unknown id, read and decoded every
/// topic's record.
#[test]
fn fetches_by_topic_id_do_not_read_the_whole_registry() {
    const UNKNOWN_TOPIC_ID: i16 = 100;
    let redis = RedisServer::start();
    // No storage worker tick during the test: it lists every topic.
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "tiering.tick_interval=1h",
            "--set",
            "tiering.lease_ttl=2h",
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("by-id");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let id = raw::topic_id(&mut conn, &topic).expect("the topic's id");
    // The registry's listings, as MONITOR shows them (other tasks read
    // other hashes whole).
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let marks = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let monitor = {
        use std::io::{BufRead, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", redis.port())).unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let (seen, marks) = (seen.clone(), marks.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream).lines() {
                let Ok(line) = line else { return };
                if line.contains("\"HGETALL\" \"ketch:topics\"") {
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                } else if line.contains("\"ECHO\" \"listings-mark\"") {
                    marks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    };
    let mut sent = 0;
    let mut listings = || -> u64 {
        // Once MONITOR has shown a mark sent now, it has shown what came
        // before it.
        let _: String = redis::cmd("ECHO")
            .arg("listings-mark")
            .query(&mut redis.connection())
            .unwrap();
        sent += 1;
        let deadline = Instant::now() + Duration::from_secs(10);
        while marks.load(std::sync::atomic::Ordering::SeqCst) < sent {
            assert!(Instant::now() < deadline, "MONITOR shows nothing");
            std::thread::sleep(Duration::from_millis(5));
        }
        seen.load(std::sync::atomic::Ordering::SeqCst)
    };
    let mut fetch_by = |id: uuid::Uuid| -> i16 {
        let mut request = raw::fetch_request(&topic, 0, 0, 0);
        request.topics[0].topic = Default::default();
        request.topics[0].topic_id = id;
        let response: kafka_protocol::messages::FetchResponse = conn.request(13, &request);
        response.responses[0].partitions[0].error_code
    };
    assert_eq!(fetch_by(id), code::NONE);
    let before = listings();
    for _ in 0..4 {
        // Past the topic cache's half second each time.
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(fetch_by(id), code::NONE);
    }
    assert!(
        listings() - before <= 1,
        "a known id was looked up by listing every topic"
    );
    let before = listings();
    let unknown = uuid::Uuid::new_v4();
    for _ in 0..20 {
        assert_eq!(fetch_by(unknown), UNKNOWN_TOPIC_ID);
    }
    let made = listings() - before;
    assert!(made <= 3, "{made} listings for 20 fetches of one unknown id");
    // Nor does one per unknown id, each its own.
    let before = listings();
    for _ in 0..20 {
        assert_eq!(fetch_by(uuid::Uuid::new_v4()), UNKNOWN_TOPIC_ID);
    }
    let made = listings() - before;
    assert!(made <= 5, "{made} listings for 20 fetches of 20 unknown ids");
    drop(redis);
    let _ = monitor.join();
}

/// A client that closes its connection while a request of its is parked
/// (a JoinGroup waiting out the group's initial rebalance delay) gives the
/// connection's place back at once, as Kafka releases it at close: it was
/// held until the JoinGroup was answered, a minute here. The JoinGroup is
/// given up (group requests hold nothing while parked).
#[test]
fn a_closed_connection_with_a_parked_join_gives_its_place_back() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::{GroupId, JoinGroupRequest};
    let redis = RedisServer::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "broker.max_connections=1",
            "--set",
            "groups.initial_rebalance_delay=60s",
        ],
    );
    let versions = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("ketch-tests"))
        .with_client_software_version(StrBytes::from_static_str("0"));
    let mut first = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(first.request(3, &versions).error_code, code::NONE);
    // JoinGroup v3 (no member id round): it parks for the delay.
    let join = JoinGroupRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(unique_topic("parked"))))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(60_000)
        .with_protocol_type(StrBytes::from_static_str("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(bytes::Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0])),
        ]);
    first.send(3, &join);
    ketch.await_inflight_requests(1);
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut next = KafkaConn::connect(ketch.kafka_addr());
        next.send(3, &versions);
        if next.answered_within(Duration::from_secs(2)) == Some(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed connection's place is held by its parked JoinGroup"
        );
    }
}

/// A client that stops reading its answers is given up once its writes
/// have made no progress for `broker.connections_max_idle`, as Kafka closes
/// a connection idle that long with a send stuck: its slot (and what it
/// holds queued) is freed. Its connection used to stay for ever, and with
/// `broker.max_connections` such clients shut every other out.
#[test]
fn a_client_that_stops_reading_gives_its_connection_slot_back() {
    const BATCH: usize = 512 * 1024;
    let redis = RedisServer::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "broker.max_connections=1",
            "--set",
            "broker.connections_max_idle=1s",
        ],
    );
    let topic = unique_topic("stops-reading");
    let mut stuck = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut stuck, &topic, 1), code::NONE);
    for i in 0..16 {
        let value = vec![b'a'; BATCH - 100];
        let batch = batch::encode(&[Record::value(batch::at(i), &value)]);
        assert_eq!(raw::produce(&mut stuck, &topic, 0, batch).0, code::NONE);
    }
    // Answers of 8 MiB each, far more than the sockets hold; none is read.
    for _ in 0..4 {
        let mut request: FetchRequest = raw::fetch_request(&topic, 0, 0, 0).with_max_bytes(8 << 20);
        request.topics[0].partitions[0].partition_max_bytes = 8 << 20;
        stuck.send(raw::FETCH_VERSION, &request);
    }
    let request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("ketch-tests"))
        .with_client_software_version(StrBytes::from_static_str("0"));
    // Each try sends a request: a connection beyond the limit is closed
    // unanswered, an admitted one answers it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut next = KafkaConn::connect(ketch.kafka_addr());
        next.send(3, &request);
        if next.answered_within(Duration::from_secs(5)) == Some(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a client that reads nothing still holds the only connection slot"
        );
    }
    drop(stuck);
}

#[test]
fn a_client_that_reads_no_answers_cannot_pin_unbounded_response_memory() {
    const BATCH: usize = 512 * 1024;
    const BATCHES: i64 = 48;
    const FETCHES: i64 = 24;
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("slow-reader");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    for i in 0..BATCHES {
        let value = vec![b'a' + (i % 26) as u8; BATCH - 100];
        assert_eq!(
            raw::produce(
                &mut conn,
                &topic,
                0,
                batch::encode(&[Record::value(batch::at(i), &value)])
            )
            .0,
            code::NONE
        );
    }
    let before = ketch.status_kib("VmHWM");
    // Each fetch asks for 8 MiB (fetch.max_response_bytes) from a
    // different offset; none of the answers is read yet.
    let mut slow = KafkaConn::connect(ketch.kafka_addr());
    for i in 0..FETCHES {
        let request: FetchRequest = raw::fetch_request(&topic, 0, i % (BATCHES - 16), 0)
            .with_max_bytes(64 << 20)
            .with_topics({
                let mut topics = raw::fetch_request(&topic, 0, i % (BATCHES - 16), 0).topics;
                topics[0].partitions[0].partition_max_bytes = 64 << 20;
                topics
            });
        slow.send(raw::FETCH_VERSION, &request);
    }
    // Nothing signals that the gateway holds back; watch its memory while
    // it would otherwise be reading all of them.
    let mut peak = before;
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(3) {
        peak = peak.max(ketch.status_kib("VmRSS"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let grown = peak.saturating_sub(before) / 1024;
    eprintln!("{FETCHES} unread 8 MiB fetches grew the gateway by {grown} MiB");
    assert!(
        grown < 96,
        "{FETCHES} unread fetches grew the gateway by {grown} MiB"
    );
    // Every answer is still complete once the client reads.
    for i in 0..FETCHES {
        let response = slow.receive_next::<FetchRequest>(raw::FETCH_VERSION).1;
        let (error, _, records) = raw::fetch_result(&response);
        assert_eq!(error, code::NONE);
        let records = records.expect("records");
        assert_eq!(
            i64::from_be_bytes(records[0..8].try_into().unwrap()),
            i % (BATCHES - 16)
        );
        assert!(
            records.len() >= (8 << 20) - BATCH,
            "fetch {i}: {} bytes",
            records.len()
        );
    }
    alive(&ketch);
}

/// A partition whose first batch is small and whose others are large: the
/// fetches of a gateway that has not read it before each read from Redis
/// about what they return (before: the first read sized the next from the
/// small batch and asked for every large one the budget held; and reads
/// took one or two large batches more than the partition's limit let the
/// fetch send).
#[test]
fn fetches_read_from_redis_about_what_they_return() {
    const LARGE: usize = 900_000;
    const BATCHES: usize = 40;
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("read-sizing");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let small = batch::encode(&[Record::value(batch::at(1), b"small")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, small), (code::NONE, 0));
    for n in 1..=BATCHES {
        let large = batch::encode(&[Record::value(batch::at(1), &vec![b'x'; LARGE])]);
        assert_eq!(raw::produce(&mut conn, &topic, 0, large), (code::NONE, n as i64));
    }

    let mut offset = 0;
    for fetch in 0..10 {
        // 8 MiB for the response, 1 MiB for the partition: one large batch
        // (with the small one first) is all a fetch can send.
        let request = raw::fetch_request(&topic, 0, offset, 0).with_max_bytes(8 << 20);
        let before = redis.sent_bytes();
        let response = conn.request(12, &request);
        let sent_by_redis = redis.sent_bytes() - before;
        let (error, high_watermark, records) = raw::fetch_result(&response);
        assert_eq!((error, high_watermark), (code::NONE, BATCHES as i64 + 1));
        let records = records.expect("records");
        let returned = raw::count_records(&records);
        assert_eq!(
            returned,
            if fetch == 0 { 2 } else { 1 },
            "fetch {fetch} at {offset}"
        );
        assert!(
            sent_by_redis < (records.len() + LARGE / 2) as u64,
            "fetch {fetch} at {offset}: Redis sent {sent_by_redis} bytes for a {}-byte response",
            records.len()
        );
        offset += returned;
    }
}

/// A partition read for a while in small batches whose producer switches
/// to large ones: every fetch still reads from Redis within its byte limit
/// (before: the reads, sized from the small batches seen, asked for a
/// thousand entries and got every large batch there was), and once the
/// partition's size classes show the large batches, about what it returns.
#[test]
fn a_producer_switching_to_large_batches_cannot_make_a_fetch_read_past_its_limit() {
    const SMALL: usize = 64;
    const LARGE: usize = 900_000;
    const BATCHES: usize = 40;
    const FETCH_MAX: usize = 8 << 20;
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("read-switch");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    for n in 0..SMALL {
        let small = batch::encode(&[Record::value(batch::at(1), b"small")]);
        assert_eq!(raw::produce(&mut conn, &topic, 0, small), (code::NONE, n as i64));
    }
    // Read every small batch, so the gateway has learnt their sizes.
    let mut offset = 0;
    while offset < SMALL as i64 {
        let response = conn.request(12, &raw::fetch_request(&topic, 0, offset, 0));
        let (error, _, records) = raw::fetch_result(&response);
        assert_eq!(error, code::NONE);
        offset += raw::count_records(&records.expect("records"));
    }
    for n in 0..BATCHES {
        let large = batch::encode(&[Record::value(batch::at(1), &vec![b'x'; LARGE])]);
        let expected = (SMALL + n) as i64;
        assert_eq!(raw::produce(&mut conn, &topic, 0, large), (code::NONE, expected));
    }

    for fetch in 0..10 {
        let request = raw::fetch_request(&topic, 0, offset, 0).with_max_bytes(FETCH_MAX as i32);
        let before = redis.sent_bytes();
        let response = conn.request(12, &request);
        let sent_by_redis = redis.sent_bytes() - before;
        let (error, high_watermark, records) = raw::fetch_result(&response);
        assert_eq!((error, high_watermark), (code::NONE, (SMALL + BATCHES) as i64));
        let records = records.expect("records");
        assert_eq!(raw::count_records(&records), 1, "fetch {fetch} at {offset}");
        // Within the fetch's limit (a read may take one batch past it).
        assert!(
            sent_by_redis < (FETCH_MAX + LARGE) as u64,
            "fetch {fetch} at {offset}: Redis sent {sent_by_redis} bytes"
        );
        // The first fetch meets batches no read has seen; the classes it
        // reads back bound the next fetches to about what they return.
        if fetch > 0 {
            assert!(
                sent_by_redis < (records.len() + LARGE + (16 << 10)) as u64,
                "fetch {fetch} at {offset}: Redis sent {sent_by_redis} bytes for a {}-byte response",
                records.len()
            );
        }
        offset += 1;
    }
}

/// Pipelined requests hold their frames' bytes against the connection's
/// request budget (`broker.max_inflight_request_bytes`) until processed:
/// with room for two 900 KiB produce requests, a third one pipelined behind
/// them is read only once one of them is answered. Each acks=all produce
/// here waits `storage.acks_all_timeout` for a replica that does not exist.
#[test]
fn pipelined_requests_beyond_the_request_budget_are_read_once_earlier_ones_finish() {
    const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
    let redis = RedisServer::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "storage.acks_all_replicas=1",
            "--set",
            "storage.acks_all_timeout=1s",
            "--set",
            "broker.max_inflight_request_bytes=2097152",
        ],
    );
    let topic = unique_topic("request-budget");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(raw::create_topic(&mut conn, &topic, 3), code::NONE);
    let value = vec![b'v'; 900 * 1024];
    let started = Instant::now();
    for partition in 0..3 {
        let request = raw::produce_request(
            &topic,
            partition,
            batch::encode(&[Record::value(batch::at(0), &value)]),
        )
        .with_acks(-1);
        conn.send(raw::PRODUCE_VERSION, &request);
    }
    let mut answered = Vec::new();
    for _ in 0..3 {
        let response = conn.receive_next::<ProduceRequest>(raw::PRODUCE_VERSION).1;
        assert_eq!(raw::produce_result(&response).0, NOT_ENOUGH_REPLICAS_AFTER_APPEND);
        answered.push(started.elapsed());
    }
    eprintln!("answered after {answered:?}");
    // The first two were processed together; the third only after one of
    // them ended, so it waited for the replica a second time.
    assert!(answered[1] < Duration::from_millis(1900), "{answered:?}");
    assert!(answered[2] >= Duration::from_millis(1900), "{answered:?}");
    // Nothing was lost: every batch is stored.
    for partition in 0..3 {
        assert_eq!(redis.next_offset(&topic, partition), 1);
    }
    alive(&ketch);
}

/// A fetch of sixteen partitions, each with one batch: every partition's
/// batch, in the request's order.
fn sixteen_partition_fetch(topic: &str, max_bytes: i32) -> FetchRequest {
    let mut request = raw::fetch_request(topic, 0, 0, 0).with_max_bytes(max_bytes);
    let template = request.topics[0].partitions[0].clone();
    request.topics[0].partitions = (0..16).map(|p| template.clone().with_partition(p)).collect();
    request
}

/// A gateway whose Redis replies come through a proxy that holds each
/// back `delay`, and a connection to it with a 16-partition topic.
fn behind_a_reply_delay(
    delay: Duration,
    prefix: &str,
) -> (RedisServer, DelayProxy, Ketch, KafkaConn, String) {
    let redis = RedisServer::start();
    let proxy = DelayProxy::start(([127, 0, 0, 1], redis.port()).into(), delay);
    let ketch = Ketch::start(&proxy.redis_url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic(prefix);
    assert_eq!(raw::create_topic(&mut conn, &topic, 16), code::NONE);
    (redis, proxy, ketch, conn, topic)
}

/// One batch of one 100-byte record to each of the 16 partitions, stored
/// at `offset`.
fn produce_to_each_partition(conn: &mut KafkaConn, topic: &str, offset: i64) {
    for p in 0..16 {
        let batch = batch::encode(&[Record::value(batch::at(1), &[b'x'; 100])]);
        assert_eq!(raw::produce(conn, topic, p, batch), (code::NONE, offset));
    }
}

/// Sends `request` and checks that it returns one record of every
/// partition within ten reply delays (sixteen reads one after another
/// take sixteen).
fn assert_one_record_each_within_ten_delays(conn: &mut KafkaConn, request: &FetchRequest, delay: Duration) {
    let started = Instant::now();
    let response = conn.request(12, request);
    let took = started.elapsed();
    eprintln!("the fetch took {took:?}");
    let expected: Vec<(i32, i64)> = (0..16).map(|p| (p, 1)).collect();
    assert_eq!(records_per_partition(&response), expected);
    assert!(
        took < delay * 10,
        "a 16-partition fetch took {took:?} behind a {delay:?} reply delay: its reads were not pipelined"
    );
}

/// Records returned per partition, in response order.
fn records_per_partition(response: &kafka_protocol::messages::FetchResponse) -> Vec<(i32, i64)> {
    response.responses[0]
        .partitions
        .iter()
        .map(|p| {
            assert_eq!(p.error_code, code::NONE, "partition {}", p.partition_index);
            let records = p.records.clone().unwrap_or_default();
            (p.partition_index, raw::count_records(&records))
        })
        .collect()
}

/// A fetch reads its partitions together, not one Redis round trip after
/// another: behind a proxy that holds each Redis reply back 25 ms, a fetch
/// of sixteen partitions takes a few delays, not sixteen (before: about
/// 16 × 25 ms, each partition's XRANGE sent once the previous one was
/// answered). With 8 MiB for the response and 1 MiB per partition, eight
/// partitions are read at a time until reads show what they hold: two
/// rounds; the bound leaves room for a loaded machine, below sixteen.
#[test]
fn a_fetch_reads_its_partitions_in_one_round_trip_not_one_each() {
    const DELAY: Duration = Duration::from_millis(25);
    let (_redis, _proxy, _ketch, mut conn, topic) = behind_a_reply_delay(DELAY, "fetch-together");
    produce_to_each_partition(&mut conn, &topic, 0);
    // A Java consumer's limits: fetch.max.bytes 50 MiB (the gateway caps
    // it at fetch.max_response_bytes, 8 MiB), max.partition.fetch.bytes
    // 1 MiB.
    let request = sixteen_partition_fetch(&topic, 50 << 20);
    // The first fetch also loads what the gateway caches of the topic.
    let _: kafka_protocol::messages::FetchResponse = conn.request(12, &request);
    assert_one_record_each_within_ten_delays(&mut conn, &request, DELAY);
}

/// A tailing consumer's fetch reads every partition that has a little new
/// data together even when its budget is one partition's limit: the
/// gateway knows each partition's next offset (its own appends, while a
/// fetch has subscribed it) and its batch sizes, so a partition that
/// holds one small batch takes that much of the budget, not 1 MiB
/// (without that: sixteen rounds of one read, 16 × 25 ms).
#[test]
fn a_tailing_fetch_reads_partitions_that_hold_little_together() {
    const DELAY: Duration = Duration::from_millis(25);
    let (_redis, _proxy, _ketch, mut conn, topic) = behind_a_reply_delay(DELAY, "fetch-tailing");
    produce_to_each_partition(&mut conn, &topic, 0);
    // The consumer reads the first batches (the gateway learns their
    // size), then waits at offset 1 until its deadline: that subscribes
    // the partitions' wake-up channels, which stay subscribed after.
    let mut request = sixteen_partition_fetch(&topic, 1 << 20);
    let _: kafka_protocol::messages::FetchResponse = conn.request(12, &request);
    for partition in &mut request.topics[0].partitions {
        partition.fetch_offset = 1;
    }
    request.max_wait_ms = 300;
    let response = conn.request(12, &request);
    let nothing: Vec<(i32, i64)> = (0..16).map(|p| (p, 0)).collect();
    assert_eq!(records_per_partition(&response), nothing);

    produce_to_each_partition(&mut conn, &topic, 1);
    assert_one_record_each_within_ten_delays(&mut conn, &request, DELAY);
}

/// The response's byte budget is still filled in request order when the
/// reads go together: room for three 100 kB batches returns partitions 0,
/// 1 and 2 and nothing of the others, and Redis sends about that much
/// (not the sixteen batches a read of every partition at once would
/// fetch).
#[test]
fn partitions_fill_the_fetch_budget_in_request_order() {
    const SIZE: usize = 100_000;
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("fetch-order");
    assert_eq!(raw::create_topic(&mut conn, &topic, 16), code::NONE);
    let mut batch_size = 0;
    for p in 0..16 {
        let batch = batch::encode(&[Record::value(batch::at(1), &vec![b'x'; SIZE])]);
        batch_size = batch.len();
        assert_eq!(raw::produce(&mut conn, &topic, p, batch), (code::NONE, 0));
    }
    let request = sixteen_partition_fetch(&topic, (batch_size * 7 / 2) as i32);
    let before = redis.sent_bytes();
    let response = conn.request(12, &request);
    let sent_by_redis = redis.sent_bytes() - before;
    let expected: Vec<(i32, i64)> = (0..16).map(|p| (p, i64::from(p < 3))).collect();
    assert_eq!(records_per_partition(&response), expected);
    // Three batches sent; the fourth partition's batch is read to find it
    // does not fit (as a broker reads it), no more.
    assert!(
        sent_by_redis < (batch_size * 4 + SIZE / 2) as u64,
        "Redis sent {sent_by_redis} bytes for a fetch that returns {} bytes",
        batch_size * 3
    );
}
