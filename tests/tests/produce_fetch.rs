//! Produce acks and Fetch limits at the wire level: acks=0 is never
//! answered, acks=all is; a fetch returns whole batches within max_bytes /
//! partition_max_bytes, and always at least one batch.

use kafka_protocol::messages::{ApiVersionsRequest, FetchRequest, ProduceRequest};
use kafka_protocol::protocol::StrBytes;
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, unique_topic};

fn start() -> (TestRedis, Ketch, KafkaConn, String) {
    start_with(&[])
}

fn start_with(args: &[&str]) -> (TestRedis, Ketch, KafkaConn, String) {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), args);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("wire");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    (redis, ketch, conn, topic)
}

#[test]
fn acks_zero_is_not_answered_and_acks_all_is() {
    let (_redis, _ketch, mut conn, topic) = start();
    let request = raw::produce_request(
        &topic,
        0,
        batch::encode(&[Record::value(batch::at(1), b"fire and forget")]),
    );
    conn.send(raw::PRODUCE_VERSION, &request.with_acks(0));
    // The next response on the connection must answer the next request:
    // `receive` checks the correlation id.
    let versions = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("ketch-tests"))
        .with_client_software_version(StrBytes::from_static_str("0"));
    assert_eq!(conn.request(3, &versions).error_code, code::NONE);

    // The acks=0 batch was stored all the same (the fetch waits for it).
    let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 0, 5_000));
    let (error, _, records) = raw::fetch_result(&response);
    assert_eq!(error, code::NONE);
    assert_eq!(records.as_deref().map_or(0, raw::count_records), 1);

    let request = raw::produce_request(
        &topic,
        0,
        batch::encode(&[Record::value(batch::at(2), b"durable")]),
    );
    let response = conn.request(raw::PRODUCE_VERSION, &request.with_acks(-1));
    assert_eq!(raw::produce_result(&response), (code::NONE, 1));
}

/// An acks=0 producer learns of a failure as from Kafka: the connection
/// closes (after the answers to the requests before it), and it reads the
/// metadata again.
#[test]
fn a_failed_acks_zero_produce_closes_the_connection() {
    let (_redis, ketch, mut conn, topic) = start();
    let versions = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("ketch-tests"))
        .with_client_software_version(StrBytes::from_static_str("0"));
    // Before it on the connection: an ApiVersions, answered.
    conn.send(3, &versions);
    let no_such_partition =
        raw::produce_request(&topic, 7, batch::encode(&[Record::value(batch::at(1), b"lost")]));
    conn.send(raw::PRODUCE_VERSION, &no_such_partition.with_acks(0));
    assert!(conn.read_frame().is_ok(), "the ApiVersions answer");
    conn.assert_closed();

    // A batch refused (a CRC that does not hold) closes it too.
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let mut corrupt = batch::encode(&[Record::value(batch::at(1), b"bad")]);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0x40;
    conn.send(
        raw::PRODUCE_VERSION,
        &raw::produce_request(&topic, 0, corrupt).with_acks(0),
    );
    conn.assert_closed();

    // A failure-free acks=0 produce leaves it open (the test above).
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let fine = raw::produce_request(&topic, 0, batch::encode(&[Record::value(batch::at(1), b"kept")]));
    conn.send(raw::PRODUCE_VERSION, &fine.with_acks(0));
    assert_eq!(conn.request(3, &versions).error_code, code::NONE);
}

#[test]
fn pipelined_produce_requests_are_appended_in_request_order() {
    // Kafka appends the requests of one connection in the order they were
    // sent; a producer without idempotence relies on it for ordering when it
    // has several requests in flight.
    appended_and_answered_in_request_order(&[]);
}

#[test]
fn one_answer_waiting_at_a_time_still_serves_a_pipeline() {
    // With room for one waiting answer, the gateway admits each request
    // only once the one before it has been answered: 200 pipelined
    // requests all the same, in order.
    appended_and_answered_in_request_order(&["--set", "broker.max_inflight_requests=1"]);
}

fn appended_and_answered_in_request_order(args: &[&str]) {
    const IN_FLIGHT: usize = 200;
    let (_redis, _ketch, mut conn, topic) = start_with(args);
    let mut frames = Vec::new();
    for n in 0..IN_FLIGHT {
        let records: Vec<Record> = (0..5)
            .map(|i| Record::value(batch::at(i), format!("{n}").as_bytes()))
            .collect();
        frames.extend(conn.frame(
            raw::PRODUCE_VERSION,
            &raw::produce_request(&topic, 0, batch::encode(&records)),
        ));
    }
    let first_correlation_id = conn.last_correlation_id() - IN_FLIGHT as i32 + 1;
    conn.send_raw(&frames).expect("send pipelined requests");
    let mut offsets = Vec::with_capacity(IN_FLIGHT);
    for n in 0..IN_FLIGHT {
        let (correlation_id, response) = conn.receive_next::<ProduceRequest>(raw::PRODUCE_VERSION);
        assert_eq!(
            correlation_id,
            first_correlation_id + n as i32,
            "responses in request order"
        );
        let (error, base_offset) = raw::produce_result(&response);
        assert_eq!(error, code::NONE);
        offsets.push(base_offset);
    }
    let misplaced: Vec<(usize, i64)> = offsets
        .iter()
        .enumerate()
        .filter(|&(n, &offset)| offset != n as i64 * 5)
        .map(|(n, &offset)| (n, offset))
        .collect();
    assert!(
        misplaced.is_empty(),
        "{} of {IN_FLIGHT} pipelined batches appended out of request order; first (request, base offset): {:?}",
        misplaced.len(),
        &misplaced[..misplaced.len().min(5)]
    );
}

/// Five batches of ten 1000-byte records (a little over 10 kB each).
fn five_batches(conn: &mut KafkaConn, topic: &str) -> usize {
    let mut size = 0;
    for n in 0..5 {
        let records: Vec<Record> = (0..10)
            .map(|i| Record::value(batch::at(i), &[b'x'; 1000]))
            .collect();
        let batch = batch::encode(&records);
        size = batch.len();
        assert_eq!(raw::produce(conn, topic, 0, batch), (code::NONE, n * 10));
    }
    size
}

fn fetched_records(conn: &mut KafkaConn, request: &FetchRequest) -> (i64, usize) {
    let response = conn.request(raw::FETCH_VERSION, request);
    let (error, high_watermark, records) = raw::fetch_result(&response);
    assert_eq!((error, high_watermark), (code::NONE, 50));
    let records = records.unwrap_or_default();
    (raw::count_records(&records), records.len())
}

#[test]
fn fetch_returns_whole_batches_within_the_byte_limits() {
    let (_redis, _ketch, mut conn, topic) = start();
    let batch_size = five_batches(&mut conn, &topic);

    // Everything fits.
    let (count, _) = fetched_records(&mut conn, &raw::fetch_request(&topic, 0, 0, 100));
    assert_eq!(count, 50);

    // A partition limit of one byte still returns the first whole batch.
    let mut request = raw::fetch_request(&topic, 0, 0, 100);
    request.topics[0].partitions[0].partition_max_bytes = 1;
    assert_eq!(fetched_records(&mut conn, &request), (10, batch_size));

    // Room for two and a half batches: two whole ones.
    let mut request = raw::fetch_request(&topic, 0, 0, 100);
    request.max_bytes = (batch_size * 5 / 2) as i32;
    assert_eq!(fetched_records(&mut conn, &request), (20, 2 * batch_size));

    // From the middle of a batch: that batch is returned from its start.
    let (count, _) = fetched_records(&mut conn, &raw::fetch_request(&topic, 0, 45, 100));
    assert_eq!(count, 10);

    // Limits of 0 still return the first batch, at once (KIP-74; a fetch
    // waited its max_wait for nothing): min_bytes counts up to max_bytes.
    for (max_bytes, partition_max_bytes) in [(0, 1 << 20), (1 << 20, 0), (0, 0)] {
        let mut request = raw::fetch_request(&topic, 0, 0, 10_000);
        request.max_bytes = max_bytes;
        request.min_bytes = if max_bytes == 0 { 1 << 20 } else { 1 };
        request.topics[0].partitions[0].partition_max_bytes = partition_max_bytes;
        let asked = std::time::Instant::now();
        assert_eq!(
            fetched_records(&mut conn, &request),
            (10, batch_size),
            "max_bytes {max_bytes}, partition_max_bytes {partition_max_bytes}"
        );
        if max_bytes == 0 {
            assert!(
                asked.elapsed() < std::time::Duration::from_secs(5),
                "waited {:?}",
                asked.elapsed()
            );
        }
    }

    // No fetch sessions: a full fetch naming a session (epoch 0 or -1) is
    // served, as Kafka closes the session it names; an incremental one
    // finds none.
    for (epoch, error) in [(-1, code::NONE), (0, code::NONE), (1, FETCH_SESSION_ID_NOT_FOUND)] {
        let request = raw::fetch_request(&topic, 0, 0, 0)
            .with_session_id(123)
            .with_session_epoch(epoch);
        let response = conn.request(raw::FETCH_VERSION, &request);
        assert_eq!(response.error_code, error, "session epoch {epoch}");
    }
}

const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;

/// A partition the response has no room left for is still told its fetch
/// offset is out of range, as Kafka checks the offset before it reads.
#[test]
fn out_of_range_is_told_when_the_response_is_full() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("full-response");
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    let big = batch::encode(&[Record::value(batch::at(1), &[b'x'; 100 * 1024])]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, big), (code::NONE, 0));
    let small = batch::encode(&[Record::value(batch::at(1), b"one")]);
    assert_eq!(raw::produce(&mut conn, &topic, 1, small), (code::NONE, 0));
    // Partition 0's batch fills the 64 KiB (KIP-74 sends it whole);
    // partition 1 is asked for from offset 5, past its end.
    let fetch = raw::fetch_partitions_request(&topic, &[(0, 0), (1, 5)], 64 * 1024);
    let response: kafka_protocol::messages::FetchResponse = conn.request(12, &fetch);
    let partitions = &response.responses[0].partitions;
    assert_eq!(partitions[0].error_code, code::NONE);
    assert_eq!(
        raw::count_records(&partitions[0].records.clone().unwrap_or_default()),
        1
    );
    assert_eq!(partitions[1].error_code, code::OFFSET_OUT_OF_RANGE);
    assert_eq!(partitions[1].high_watermark, 1);
}

/// A negative fetch offset is below the log start: OFFSET_OUT_OF_RANGE
/// with the partition's offsets (the consumer's `auto.offset.reset` then
/// applies), as from Kafka, not a retriable storage error.
#[test]
fn a_negative_fetch_offset_is_out_of_range() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("negative-offset");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let one = batch::encode(&[Record::value(batch::at(1), b"one")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, one), (code::NONE, 0));
    for offset in [-1, -2, i64::MIN] {
        let response: kafka_protocol::messages::FetchResponse =
            conn.request(12, &raw::fetch_request(&topic, 0, offset, 0));
        let partition = &response.responses[0].partitions[0];
        assert_eq!(partition.error_code, code::OFFSET_OUT_OF_RANGE, "offset {offset}");
        assert_eq!((partition.log_start_offset, partition.high_watermark), (0, 1));
    }
}

/// A topic the fetch names wrongly ends no long poll: the other
/// partitions' wait goes on, as Kafka leaves such partitions out of the
/// read (a consumer still assigned a deleted topic does not spin).
#[test]
fn an_unknown_topic_in_a_fetch_does_not_cut_its_wait_short() {
    let (_redis, _ketch, mut conn, topic) = start();
    let mut fetch = raw::fetch_request(&topic, 0, 0, 1_500);
    let mut unknown = fetch.topics[0].clone();
    unknown.topic = raw::topic_name("no-such-topic");
    fetch.topics.push(unknown);
    let asked = std::time::Instant::now();
    let response: kafka_protocol::messages::FetchResponse = conn.request(raw::FETCH_VERSION, &fetch);
    let waited = asked.elapsed();
    assert_eq!(response.responses[0].partitions[0].error_code, code::NONE);
    assert_eq!(
        response.responses[1].partitions[0].error_code,
        code::UNKNOWN_TOPIC_OR_PARTITION
    );
    assert!(
        waited >= std::time::Duration::from_millis(1_400),
        "answered after {waited:?}"
    );
    // Alone, it is answered at once: there is nothing to wait for.
    let mut alone = fetch.clone();
    alone.topics.remove(0);
    let asked = std::time::Instant::now();
    let _: kafka_protocol::messages::FetchResponse = conn.request(raw::FETCH_VERSION, &alone);
    assert!(asked.elapsed() < std::time::Duration::from_millis(1_000));
}

/// The first batch of a new partition over 4 KiB is stored, one record or
/// ten, idempotent or not, and so is the small one after it. Such a batch
/// goes through the staging key, which needs an empty log stream first;
/// the first way of making one (XADD, XDEL, then XSETID back to 0-0) fails
/// on Redis 7.2 and later (Valkey 8 in CI), which check XSETID against the
/// largest id deleted: the first attempt failed, and its retry was
/// answered as stored at offset 0 with nothing there (the staged XADD's
/// refusal went unseen).
#[test]
fn the_first_large_batch_of_a_new_partition_is_stored() {
    use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse};
    let (_redis, _ketch, mut conn, _) = start();
    let topic = unique_topic("first-large");
    assert_eq!(raw::create_topic(&mut conn, &topic, 3), code::NONE);
    let init: InitProducerIdResponse = conn.request(
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id((-1).into())
            .with_producer_epoch(-1),
    );
    assert_eq!(init.error_code, code::NONE);
    let (pid, epoch) = (init.producer_id.0, init.producer_epoch);
    let records = |n: usize, size: usize| -> Vec<Record> {
        (0..n)
            .map(|i| Record::value(batch::at(i as i64), &vec![b'a' + i as u8; size]))
            .collect()
    };
    // (partition, first batch, its record count, a small batch after it)
    let cases = [
        (
            0,
            batch::encode(&records(1, 8 << 10)),
            1,
            batch::encode(&records(1, 10)),
        ),
        (
            1,
            batch::encode_idempotent(&records(10, 1 << 10), pid, epoch, 0),
            10,
            batch::encode_idempotent(&records(1, 10), pid, epoch, 10),
        ),
        (
            2,
            batch::encode_idempotent(&records(1, 8 << 10), pid, epoch, 0),
            1,
            batch::encode_idempotent(&records(1, 10), pid, epoch, 1),
        ),
    ];
    for (partition, first, count, small) in cases {
        assert!(first.len() > 4096);
        assert_eq!(
            raw::produce(&mut conn, &topic, partition, first.clone()),
            (code::NONE, 0),
            "partition {partition}'s first batch"
        );
        assert_eq!(
            raw::produce(&mut conn, &topic, partition, small),
            (code::NONE, count),
            "partition {partition}'s second batch"
        );
        let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, partition, 0, 0));
        let (error, high_watermark, fetched) = raw::fetch_result(&response);
        assert_eq!(
            (error, high_watermark),
            (code::NONE, count + 1),
            "partition {partition}"
        );
        let fetched = fetched.unwrap_or_default();
        assert_eq!(raw::count_records(&fetched), count + 1, "partition {partition}");
        let batches = raw::split_batches(fetched);
        assert_eq!(
            batches[0].len(),
            first.len(),
            "partition {partition}: the first batch, whole"
        );
    }
}

/// A partition whose first staged batch an older release tried on Redis
/// 7.2 or later was left with an empty log stream whose last id is 0-1
/// (its entry added and deleted, the XSETID back to 0-0 refused), which
/// refused a one-record batch at offset 0 for good: the first append now
/// makes the stream again.
#[test]
fn a_log_stream_left_empty_at_0_1_takes_the_first_record() {
    let (redis, _ketch, mut conn, topic) = start();
    let log = redis.partition_key(&topic, 0, "log");
    let mut seed = redis.connection();
    let _: String = redis::cmd("XADD")
        .arg(&log)
        .arg("0-1")
        .arg("x")
        .arg("")
        .query(&mut seed)
        .unwrap();
    let _: i64 = redis::cmd("XDEL").arg(&log).arg("0-1").query(&mut seed).unwrap();
    let small = batch::encode(&[Record::value(batch::at(1), b"first")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, small), (code::NONE, 0));
    let large = batch::encode(&[Record::value(batch::at(2), &[b'x'; 8 << 10])]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, large), (code::NONE, 1));
    let response = conn.request(raw::FETCH_VERSION, &raw::fetch_request(&topic, 0, 0, 0));
    let (error, high_watermark, records) = raw::fetch_result(&response);
    assert_eq!((error, high_watermark), (code::NONE, 2));
    assert_eq!(raw::count_records(&records.unwrap_or_default()), 2);
}
