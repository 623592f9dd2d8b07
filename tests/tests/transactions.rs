//! Transactions (issue #16): librdkafka's transactional producer across
//! two gateways, read_committed and read_uncommitted consumers, the last
//! stable offset of an open transaction, its abort on timeout (fencing the
//! producer), and bad transactional input — through rdkafka and the raw
//! protocol. Runs against a single Redis and a Redis Cluster alike.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, EndTxnRequest, EndTxnResponse,
    InitProducerIdRequest, InitProducerIdResponse, ListOffsetsResponse, ListTransactionsRequest,
    ListTransactionsResponse, ProducerId, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, TestRedis, unique_topic};
use rdkafka::Message;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::{FutureRecord, Producer};

const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const INVALID_TXN_STATE: i16 = 48;
const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
const INVALID_RECORD: i16 = 87;
const PRODUCER_FENCED: i16 = 90;

/// Values of the records `consumer` reads from `partitions` of `topic`
/// until it has `want` of them or nothing more arrives for 2 s.
fn drain(consumer: &BaseConsumer, want: usize) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(message) => {
                let message = message.expect("consume");
                seen.push(String::from_utf8(message.payload().unwrap().to_vec()).unwrap());
                quiet_since = Instant::now();
            }
            None if seen.len() >= want && quiet_since.elapsed() > Duration::from_secs(2) => break,
            None => {}
        }
    }
    seen
}

/// Polls `get` until it returns `want` (10 s at most). EndTxn answers once
/// the decision is written, as Kafka does; what the commit or abort then
/// writes (markers, offsets, the finished count) shows up right after.
fn eventually<T: PartialEq + std::fmt::Debug>(what: &str, want: T, mut get: impl FnMut() -> T) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = get();
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {got:?}, want {want:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn reader(ketch: &Ketch, topic: &str, partitions: i32, isolation: &str) -> BaseConsumer {
    let consumer = ketch.consumer_with(&[("isolation.level", isolation)]);
    let mut assignment = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        assignment
            .add_partition_offset(topic, p, rdkafka::Offset::Offset(0))
            .unwrap();
    }
    rdkafka::consumer::Consumer::assign(&consumer, &assignment).unwrap();
    consumer
}

#[test]
fn rdkafka_commits_and_aborts_across_two_gateways() {
    let redis = TestRedis::start();
    let a = Ketch::start(&redis.url(), &["--node-id", "1"]);
    let b = Ketch::start(&redis.url(), &["--node-id", "2"]);
    let rt = ketch_tests::runtime();
    let topic = unique_topic("txn-rdkafka");
    a.create_topic(&rt, &topic, 4);
    let id = unique_topic("txn-id");
    let producer = a.producer_with(&[("transactional.id", &id)]);
    producer.init_transactions(Duration::from_secs(30)).expect("init");
    let send = |value: String, partition: i32| {
        producer
            .send_result(
                FutureRecord::<(), _>::to(&topic)
                    .payload(&value)
                    .partition(partition),
            )
            .map_err(|(e, _)| e)
            .expect("queued")
    };
    producer.begin_transaction().unwrap();
    let committed: Vec<_> = (0..100).map(|i| send(format!("c{i}"), i % 4)).collect();
    producer
        .commit_transaction(Duration::from_secs(30))
        .expect("commit");
    for delivery in committed {
        rt.block_on(delivery).unwrap().map_err(|(e, _)| e).unwrap();
    }
    producer.begin_transaction().unwrap();
    let aborted: Vec<_> = (0..50).map(|i| send(format!("a{i}"), i % 4)).collect();
    producer.flush(Duration::from_secs(30)).unwrap();
    producer
        .abort_transaction(Duration::from_secs(30))
        .expect("abort");
    for delivery in aborted {
        let _ = rt.block_on(delivery);
    }
    // The committed transaction through the other gateway.
    producer.begin_transaction().unwrap();
    let last = send("c-last".to_owned(), 0);
    producer
        .commit_transaction(Duration::from_secs(30))
        .expect("commit");
    rt.block_on(last).unwrap().map_err(|(e, _)| e).unwrap();

    let read_committed: BTreeSet<String> = drain(&reader(&b, &topic, 4, "read_committed"), 101)
        .into_iter()
        .collect();
    let mut want: BTreeSet<String> = (0..100).map(|i| format!("c{i}")).collect();
    want.insert("c-last".to_owned());
    assert_eq!(
        read_committed, want,
        "read_committed: every committed record, nothing aborted"
    );

    let uncommitted = drain(&reader(&b, &topic, 4, "read_uncommitted"), 151);
    assert_eq!(
        uncommitted.len(),
        151,
        "read_uncommitted sees aborted records too"
    );
    assert_eq!(uncommitted.iter().filter(|v| v.starts_with('a')).count(), 50);
    // Three markers per partition of the first two transactions, one more in 0.
    let offsets: i64 = (0..4).map(|p| redis.next_offset(&topic, p)).sum();
    assert_eq!(
        offsets,
        151 + 4 + 4 + 1,
        "records plus one marker per partition per transaction"
    );
    let finished = |outcome| transactions_metric(&a, outcome) + transactions_metric(&b, outcome);
    eventually("transactions finished", (2.0, 1.0), || {
        (finished("commit"), finished("abort"))
    });
    // Admin clients ask every broker for ListTransactions and put the
    // answers together: the id is listed by its coordinator only.
    let listed: Vec<String> = [&a, &b]
        .iter()
        .flat_map(|gateway| {
            let mut conn = KafkaConn::connect(gateway.kafka_addr());
            let response: ListTransactionsResponse = conn.request(0, &ListTransactionsRequest::default());
            assert_eq!(response.error_code, code::NONE);
            response
                .transaction_states
                .into_iter()
                .map(|t| t.transactional_id.0.to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(listed, vec![id], "listed once across the gateways");
}

fn init(conn: &mut KafkaConn, id: &str, timeout_ms: i32) -> InitProducerIdResponse {
    conn.request(
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.to_owned()))))
            .with_transaction_timeout_ms(timeout_ms)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    )
}

fn add_partition(conn: &mut KafkaConn, id: &str, pid: i64, epoch: i16, topic: &str, partition: i32) -> i16 {
    let response: AddPartitionsToTxnResponse = conn.request(
        3,
        &AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_string(id.to_owned())))
            .with_v3_and_below_producer_id(ProducerId(pid))
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(vec![
                AddPartitionsToTxnTopic::default()
                    .with_name(raw::topic_name(topic))
                    .with_partitions(vec![partition]),
            ]),
    );
    response.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
}

/// A new transactional id (named from `prefix`) whose transaction has
/// added partition 0 of `topic`: (id, producer id, epoch).
fn open_transaction(conn: &mut KafkaConn, prefix: &str, topic: &str) -> (String, i64, i16) {
    open_transaction_on(conn, prefix, topic, 0)
}

/// [`open_transaction`] with `partition` of `topic` added.
fn open_transaction_on(
    conn: &mut KafkaConn,
    prefix: &str,
    topic: &str,
    partition: i32,
) -> (String, i64, i16) {
    let id = unique_topic(prefix);
    let started = init(conn, &id, 60_000);
    assert_eq!(started.error_code, code::NONE);
    let (pid, epoch) = (started.producer_id.0, started.producer_epoch);
    assert_eq!(add_partition(conn, &id, pid, epoch, topic, partition), code::NONE);
    (id, pid, epoch)
}

/// A transactional batch of `records` from producer `pid`.
fn transactional(records: &[Record], pid: i64, epoch: i16, sequence: i32) -> Vec<u8> {
    let mut batch = batch::encode_idempotent(records, pid, epoch, sequence);
    batch[22] |= 0x10;
    batch::fix_crc(&mut batch);
    batch
}

/// EndTxn v3 for transactional id `id`: its error code.
fn end_txn(conn: &mut KafkaConn, id: &str, pid: i64, epoch: i16, committed: bool) -> i16 {
    let response: EndTxnResponse = conn.request(
        3,
        &EndTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(id.to_owned())))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_committed(committed),
    );
    response.error_code
}

fn produce_in(conn: &mut KafkaConn, id: Option<&str>, topic: &str, batch: Vec<u8>) -> (i16, i64) {
    let request = raw::produce_request(topic, 0, batch)
        .with_transactional_id(id.map(|id| TransactionalId(StrBytes::from_string(id.to_owned()))));
    raw::produce_result(&conn.request(9, &request))
}

/// (HW, LSO) of partition 0 as ListOffsets latest answers them.
fn watermarks(conn: &mut KafkaConn, topic: &str) -> (i64, i64) {
    let mut latest = |isolation: i8| {
        let request = raw::list_offsets_request(topic, 0, -1).with_isolation_level(isolation);
        let response: ListOffsetsResponse = conn.request(7, &request);
        raw::list_offsets_result(&response).1
    };
    (latest(0), latest(1))
}

/// A gateway sweeping every 100 ms, and a transaction of a 1.5 s timeout
/// open on a new one-partition topic (named from `prefix`) with one record
/// at offset 0: (Redis, gateway, connection, topic, transactional id,
/// producer id, epoch). An id expiration far below the transaction's
/// timeout: expiration counts only while nothing is open (as in Kafka), or
/// the open transaction's state would vanish and its partition stay
/// blocked.
struct OpenTransaction {
    redis: TestRedis,
    ketch: Ketch,
    conn: KafkaConn,
    topic: String,
    id: String,
    pid: i64,
    epoch: i16,
}

fn open_one(prefix: &str) -> OpenTransaction {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "transactions.abort_check_interval=100ms",
            "--set",
            "transactions.id_expiration=200ms",
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic(prefix);
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let id = unique_topic(&format!("{prefix}-id"));
    let started = init(&mut conn, &id, 1_500);
    assert_eq!(started.error_code, code::NONE);
    let (pid, epoch) = (started.producer_id.0, started.producer_epoch);
    assert_eq!(add_partition(&mut conn, &id, pid, epoch, &topic, 0), code::NONE);
    let open = transactional(&[Record::value(batch::at(1_000), b"open")], pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, open), (code::NONE, 0));
    OpenTransaction {
        redis,
        ketch,
        conn,
        topic,
        id,
        pid,
        epoch,
    }
}

#[test]
fn an_open_transaction_holds_the_lso_until_its_timeout_aborts_it_and_fences_the_producer() {
    let OpenTransaction {
        redis,
        ketch,
        mut conn,
        topic,
        id,
        pid,
        epoch,
    } = open_one("txn-timeout");
    assert_eq!(
        raw::produce(
            &mut conn,
            &topic,
            0,
            batch::encode(&[Record::value(batch::at(1_001), b"plain")])
        ),
        (code::NONE, 1)
    );
    assert_eq!(
        watermarks(&mut conn, &topic),
        (2, 0),
        "the open transaction holds the LSO at its first offset"
    );
    // By timestamp (and max timestamp, -3), read_committed finds nothing
    // at or past the LSO, as Kafka answers; read_uncommitted finds them.
    let mut by_timestamp = |timestamp: i64, isolation: i8| {
        let request = raw::list_offsets_request(&topic, 0, timestamp).with_isolation_level(isolation);
        let response: ListOffsetsResponse = conn.request(7, &request);
        raw::list_offsets_result(&response).1
    };
    assert_eq!(
        (
            by_timestamp(batch::at(1_001), 0),
            by_timestamp(batch::at(1_001), 1)
        ),
        (1, -1)
    );
    assert_eq!((by_timestamp(0, 0), by_timestamp(0, 1)), (0, -1));
    assert_eq!((by_timestamp(-3, 0), by_timestamp(-3, 1)), (1, -1));

    // The gateway aborts it past its 1.5 s timeout: the marker moves the LSO.
    let deadline = Instant::now() + Duration::from_secs(20);
    while watermarks(&mut conn, &topic) != (3, 3) {
        assert!(
            Instant::now() < deadline,
            "the timed-out transaction was never aborted: {:?}",
            watermarks(&mut conn, &topic)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // read_committed: both batches and the marker, with the aborted
    // transaction named so the client drops its record.
    let fetch = raw::fetch_request(&topic, 0, 0, 0).with_isolation_level(1);
    let response: kafka_protocol::messages::FetchResponse = conn.request(11, &fetch);
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.last_stable_offset, 3);
    let aborted = partition
        .aborted_transactions
        .as_ref()
        .expect("aborted transactions");
    assert_eq!(aborted.len(), 1);
    assert_eq!((aborted[0].producer_id.0, aborted[0].first_offset), (pid, 0));
    // The producer was fenced by the abort: its epoch is refused.
    let late = transactional(&[Record::value(batch::at(1_002), b"late")], pid, epoch, 1);
    assert_eq!(
        produce_in(&mut conn, Some(&id), &topic, late).0,
        INVALID_PRODUCER_EPOCH
    );
    assert_eq!(
        add_partition(&mut conn, &id, pid, epoch, &topic, 0),
        PRODUCER_FENCED
    );
    assert_eq!(redis.next_offset(&topic, 0), 3, "nothing stored after the abort");
    assert_eq!(transactions_metric(&ketch, "coordinator_abort"), 1.0);
}

/// An open transaction whose look was lost (a gateway killed between the
/// add that opened it and its schedule, racing the sweep that moved the id
/// to idle) is found by the sweep's pass over idle ids and aborted past its
/// timeout: before, it stayed open for ever and its partition's last stable
/// offset with it.
#[test]
fn an_open_transaction_that_lost_its_look_is_still_aborted() {
    let OpenTransaction {
        redis,
        ketch: _ketch,
        mut conn,
        topic,
        id,
        ..
    } = open_one("txn-lost-look");
    let () = redis::cmd("ZADD")
        .arg("ketch:transactions")
        .arg("XX")
        .arg(9e15)
        .arg(&id)
        .query(&mut redis.connection())
        .expect("ZADD");
    assert_eq!(watermarks(&mut conn, &topic), (1, 0));
    let deadline = Instant::now() + Duration::from_secs(20);
    while watermarks(&mut conn, &topic) != (2, 2) {
        assert!(
            Instant::now() < deadline,
            "the transaction was never aborted: {:?}",
            watermarks(&mut conn, &topic)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The sweeper reads the due ids a page (100) at a time and pages past
/// those it cannot finish: 150 ids that fail every look (their state is
/// not a hash), all due before it, do not keep a timed-out transaction
/// from being aborted.
#[test]
fn ids_that_cannot_be_finished_do_not_starve_a_timed_out_transaction() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &["--set", "transactions.abort_check_interval=100ms"],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-starved");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let mut redis_conn = redis.connection();
    for i in 0..150 {
        let broken = unique_topic(&format!("txn-broken-{i}"));
        let _: () = redis::cmd("SET")
            .arg(format!("ketch:txn:{{{broken}}}"))
            .arg("not a hash")
            .query(&mut redis_conn)
            .unwrap();
        let _: () = redis::cmd("ZADD")
            .arg("ketch:transactions")
            .arg(0)
            .arg(&broken)
            .query(&mut redis_conn)
            .unwrap();
    }
    let id = unique_topic("txn-starved-id");
    let started = init(&mut conn, &id, 1_000);
    let (pid, epoch) = (started.producer_id.0, started.producer_epoch);
    assert_eq!(add_partition(&mut conn, &id, pid, epoch, &topic, 0), code::NONE);
    let open = transactional(&[Record::value(batch::at(1_000), b"open")], pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, open), (code::NONE, 0));
    eventually("the timed-out transaction aborted", (2, 2), || {
        watermarks(&mut conn, &topic)
    });
}

/// An open transaction's data, which a read_committed fetch cannot send,
/// takes none of its bytes: the partitions after it in the request are
/// read and sent, as from Kafka.
#[test]
fn an_open_transactions_data_takes_no_room_from_the_other_partitions_of_a_read_committed_fetch() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    // The fetches go to another gateway: it holds none of the appends in
    // its tails, so it reads them from Redis.
    let reader = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-room");
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    // Partition 0: a transaction left open, its batch larger than the
    // fetch's 64 KiB (so a read of it would take all of them, KIP-74).
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-room-id", &topic);
    let open = transactional(&[Record::value(batch::at(1), &[b'x'; 100 * 1024])], pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, open), (code::NONE, 0));
    // Partition 1: a committed record.
    let plain = batch::encode(&[Record::value(batch::at(1), b"decided")]);
    assert_eq!(raw::produce(&mut conn, &topic, 1, plain), (code::NONE, 0));

    // A read_committed fetch of both, partition 0 first, in 64 KiB: the
    // undecided data cannot be sent, so partition 1's record is.
    let mut reading = KafkaConn::connect(reader.kafka_addr());
    for _ in 0..3 {
        let fetch =
            raw::fetch_partitions_request(&topic, &[(0, 0), (1, 0)], 64 * 1024).with_isolation_level(1);
        let response: kafka_protocol::messages::FetchResponse = reading.request(12, &fetch);
        let partitions = &response.responses[0].partitions;
        assert_eq!(partitions[0].last_stable_offset, 0);
        assert!(partitions[0].records.as_ref().is_none_or(|r| r.is_empty()));
        let records = partitions[1].records.clone().unwrap_or_default();
        assert_eq!(raw::count_records(&records), 1, "partition 1's record");
    }
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, false), code::NONE);
}

/// DeleteRecords into an open transaction's batch moves the last stable
/// offset into it (to the new log start, as Kafka does); a read_committed
/// fetch from there still gets none of that batch, through the gateway
/// that appended it (its tail) and another (Redis), until the transaction
/// is decided: then the abort's marker tells the client to drop it.
#[test]
fn a_read_committed_fetch_sends_no_undecided_batch_the_log_start_cut_into() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let other = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-cut");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-cut-id", &topic);
    let records: Vec<Record> = (0..10)
        .map(|_| Record::value(batch::at(1), b"undecided"))
        .collect();
    let open = transactional(&records, pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, open), (code::NONE, 0));
    assert_eq!(raw::delete_records(&mut conn, &topic, 0, 5), (code::NONE, 5));

    let mut through_other = KafkaConn::connect(other.kafka_addr());
    for reading in [&mut conn, &mut through_other] {
        let fetch = raw::fetch_request(&topic, 0, 5, 0).with_isolation_level(1);
        let response: kafka_protocol::messages::FetchResponse = reading.request(11, &fetch);
        let partition = &response.responses[0].partitions[0];
        assert_eq!(partition.error_code, code::NONE);
        assert_eq!(partition.last_stable_offset, 5);
        let sent = partition.records.clone().unwrap_or_default();
        assert_eq!(raw::count_records(&sent), 0, "the undecided batch was sent");
        // read_uncommitted still gets it.
        let fetch = raw::fetch_request(&topic, 0, 5, 0);
        let response: kafka_protocol::messages::FetchResponse = reading.request(11, &fetch);
        let sent = response.responses[0].partitions[0]
            .records
            .clone()
            .unwrap_or_default();
        assert_eq!(raw::count_records(&sent), 10);
    }
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, false), code::NONE);
    eventually("the abort's marker", (11, 11), || watermarks(&mut conn, &topic));
    let fetch = raw::fetch_request(&topic, 0, 5, 0).with_isolation_level(1);
    let response: kafka_protocol::messages::FetchResponse = through_other.request(11, &fetch);
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.last_stable_offset, 11);
    let aborted = partition.aborted_transactions.clone().unwrap_or_default();
    assert_eq!(aborted.len(), 1, "the aborted transaction is named");
    assert_eq!(aborted[0].producer_id.0, pid);
}

/// The aborted transactions the log start passed stay indexed ten minutes
/// more: a read_committed fetch reads its batches first and looks their
/// aborts up after (as late as its long poll's end), and retention or
/// DeleteRecords moving the log start past those batches meanwhile must
/// not take the aborts they need. After the ten minutes (here the bound's
/// time is set back) they go.
#[test]
fn aborts_below_the_log_start_stay_for_the_fetches_under_way() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "tiering.tick_interval=100ms"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-below-start");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-below-start-id", &topic);
    let records: Vec<Record> = (0..5).map(|_| Record::value(batch::at(1), b"aborted")).collect();
    let data = transactional(&records, pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, data), (code::NONE, 0));
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, false), code::NONE);
    eventually("the abort's marker", (6, 6), || watermarks(&mut conn, &topic));
    assert_eq!(redis.aborted_count(&topic, 0), 1);
    assert_eq!(raw::delete_records(&mut conn, &topic, 0, 6), (code::NONE, 6));
    // A bound proposed ten minutes ago (at offset 0): the tick trims below
    // it (nothing), keeps the entry the log start passed, and proposes the
    // new log start.
    redis.set_meta(&topic, 0, &[("abt_to", "0"), ("abt_at", "0")]);
    eventually("the log start proposed", Some("6".to_string()), || {
        redis.meta_field(&topic, 0, "abt_to")
    });
    assert_eq!(
        redis.aborted_count(&topic, 0),
        1,
        "kept for the fetches under way"
    );
    redis.set_meta(&topic, 0, &[("abt_at", "0")]);
    eventually("the aborted transactions' index emptied", 0, || {
        redis.aborted_count(&topic, 0)
    });
}

/// A transactional batch must be its request's transactional id's
/// producer, as Kafka verifies it (KIP-890): a request naming id A that
/// carries B's producer is INVALID_PRODUCER_ID_MAPPING, one of A's
/// producer at another epoch INVALID_PRODUCER_EPOCH, one mixing two
/// producers INVALID_PRODUCER_ID_MAPPING; nothing is stored, and B's own
/// batch is. (Before, WRITE on any transactional id let a client write into
/// another producer's open transaction.)
#[test]
fn a_transactional_batch_must_be_its_requests_transactional_ids_producer() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-verify");
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    let (a, b) = (unique_topic("txn-a"), unique_topic("txn-b"));
    let started = init(&mut conn, &a, 60_000);
    let (pid_a, epoch_a) = (started.producer_id.0, started.producer_epoch);
    let started = init(&mut conn, &b, 60_000);
    let (pid_b, epoch_b) = (started.producer_id.0, started.producer_epoch);
    for (id, pid, epoch) in [(&a, pid_a, epoch_a), (&b, pid_b, epoch_b)] {
        for partition in 0..2 {
            assert_eq!(
                add_partition(&mut conn, id, pid, epoch, &topic, partition),
                code::NONE
            );
        }
    }
    let records = [Record::value(batch::at(1), b"spoofed")];
    let spoofed = transactional(&records, pid_b, epoch_b, 0);
    assert_eq!(
        produce_in(&mut conn, Some(&a), &topic, spoofed).0,
        INVALID_PRODUCER_ID_MAPPING
    );
    let stale = transactional(&records, pid_a, epoch_a + 1, 0);
    assert_eq!(
        produce_in(&mut conn, Some(&a), &topic, stale).0,
        INVALID_PRODUCER_EPOCH
    );
    // Two producers in one request.
    let mut mixed = raw::produce_request(&topic, 0, transactional(&records, pid_a, epoch_a, 0))
        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(a.clone()))));
    let second = kafka_protocol::messages::produce_request::PartitionProduceData::default()
        .with_index(1)
        .with_records(Some(bytes::Bytes::from(transactional(
            &records, pid_b, epoch_b, 0,
        ))));
    mixed.topic_data[0].partition_data.push(second);
    let response = conn.request(9, &mixed);
    let codes: Vec<i16> = response.responses[0]
        .partition_responses
        .iter()
        .map(|p| p.error_code)
        .collect();
    assert_eq!(codes, [INVALID_PRODUCER_ID_MAPPING; 2]);
    assert_eq!(
        (redis.next_offset(&topic, 0), redis.next_offset(&topic, 1)),
        (0, 0)
    );

    let own = transactional(&records, pid_b, epoch_b, 0);
    assert_eq!(produce_in(&mut conn, Some(&b), &topic, own), (code::NONE, 0));
    let own = transactional(&records, pid_a, epoch_a, 0);
    assert_eq!(produce_in(&mut conn, Some(&a), &topic, own), (code::NONE, 1));
    for (id, pid, epoch) in [(&a, pid_a, epoch_a), (&b, pid_b, epoch_b)] {
        assert_eq!(end_txn(&mut conn, id, pid, epoch, false), code::NONE);
    }
}

/// A read_committed fetch at the end of a partition (librdkafka's default
/// isolation, a tailing consumer) is answered without reading Redis once a
/// read saw every transaction there decided, and never while one is open:
/// then it reports that transaction's first offset as the LSO.
#[test]
fn read_committed_fetches_at_the_end_skip_redis_only_while_every_transaction_is_decided() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-at-end");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let plain = batch::encode(&[Record::value(batch::at(1_000), b"plain")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, plain), (code::NONE, 0));
    // (HW, LSO) of an empty read_committed fetch at `offset` (waiting 50 ms).
    let at_end = |conn: &mut KafkaConn, offset: i64| {
        let fetch = raw::fetch_request(&topic, 0, offset, 50).with_isolation_level(1);
        let response: kafka_protocol::messages::FetchResponse = conn.request(11, &fetch);
        let partition = &response.responses[0].partitions[0];
        assert_eq!(partition.error_code, code::NONE);
        assert!(partition.records.as_ref().is_none_or(|r| r.is_empty()));
        (partition.high_watermark, partition.last_stable_offset)
    };
    let answered_from_memory = |conn: &mut KafkaConn, offset: i64, want: (i64, i64)| {
        // The first fetches subscribe to the partition's wake-ups and read it.
        for _ in 0..3 {
            assert_eq!(at_end(conn, offset), want);
        }
        let reads = redis.command_calls("xrange");
        for _ in 0..5 {
            assert_eq!(at_end(conn, offset), want);
        }
        assert_eq!(redis.command_calls("xrange"), reads, "Redis was read");
    };
    answered_from_memory(&mut conn, 1, (1, 1));

    // A transaction opens at offset 1: the fetch at the end reads Redis and
    // reports the transaction's first offset.
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-at-end-id", &topic);
    let open = transactional(&[Record::value(batch::at(1_001), b"open")], pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, open), (code::NONE, 1));
    for _ in 0..5 {
        assert_eq!(at_end(&mut conn, 2), (2, 1), "the open transaction holds the LSO");
    }

    // Committed: the marker at 2 decides it (written just after EndTxn's answer).
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, true), code::NONE);
    eventually("the marker", (3, 3), || watermarks(&mut conn, &topic));
    answered_from_memory(&mut conn, 3, (3, 3));
}

#[test]
fn bad_transactional_input_is_refused_and_stores_nothing() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "transactions.max_timeout=1m"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-bad");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);

    assert_eq!(
        init(&mut conn, "too-long", 120_000).error_code,
        INVALID_TRANSACTION_TIMEOUT
    );
    let id = unique_topic("txn-bad-id");
    let started = init(&mut conn, &id, 30_000);
    let (pid, epoch) = (started.producer_id.0, started.producer_epoch);
    assert_eq!(started.error_code, code::NONE);

    // A transactional batch for a partition its transaction did not add:
    // INVALID_TXN_STATE, and from Produce v11 TRANSACTION_ABORTABLE
    // (KIP-890: the client aborts and goes on), as Kafka answers.
    let stray = transactional(&[Record::value(batch::at(1), b"stray")], pid, epoch, 0);
    assert_eq!(
        produce_in(&mut conn, Some(&id), &topic, stray.clone()).0,
        INVALID_TXN_STATE
    );
    let at_v11 = raw::produce_request(&topic, 0, stray.clone())
        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.clone()))));
    assert_eq!(
        raw::produce_result(&conn.request(11, &at_v11)).0,
        120,
        "TRANSACTION_ABORTABLE"
    );
    // … or without the request's transactional id (Kafka refuses the
    // request as unauthorised for transactions).
    assert_eq!(add_partition(&mut conn, &id, pid, epoch, &topic, 0), code::NONE);
    assert_eq!(
        produce_in(&mut conn, None, &topic, stray).0,
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    );
    // A control batch (a marker) from a client.
    let mut marker = transactional(&[Record::value(batch::at(1), b"x")], pid, epoch, 0);
    marker[22] |= 0x20;
    batch::fix_crc(&mut marker);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, marker).0, INVALID_RECORD);
    // The coordinator refuses a stale epoch and an unknown id.
    assert_eq!(
        add_partition(&mut conn, &id, pid, epoch - 1, &topic, 0),
        PRODUCER_FENCED
    );
    let end = |conn: &mut KafkaConn, id: &str, pid: i64| end_txn(conn, id, pid, epoch, true);
    assert_eq!(
        end(&mut conn, "no-such-transactional-id", pid),
        INVALID_PRODUCER_ID_MAPPING
    );
    let listed: Option<f64> = redis::cmd("ZSCORE")
        .arg("ketch:transactions")
        .arg("no-such-transactional-id")
        .query(&mut redis.connection())
        .unwrap();
    assert_eq!(listed, None, "an unknown id is not listed for the sweeper");
    assert_eq!(end(&mut conn, &id, pid + 1), INVALID_PRODUCER_ID_MAPPING);
    // The empty transactional id is INVALID_REQUEST for every coordinator
    // request, as Kafka's coordinator answers it.
    assert_eq!(end(&mut conn, "", pid), code::INVALID_REQUEST);
    assert_eq!(
        add_partition(&mut conn, "", pid, epoch, &topic, 0),
        code::INVALID_REQUEST
    );
    let added: kafka_protocol::messages::AddOffsetsToTxnResponse = conn.request(
        3,
        &kafka_protocol::messages::AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::default()))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_group_id(kafka_protocol::messages::GroupId(StrBytes::from_static_str("g"))),
    );
    assert_eq!(added.error_code, code::INVALID_REQUEST);
    let described = conn.request(
        0,
        &kafka_protocol::messages::DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(StrBytes::default())]),
    );
    assert_eq!(described.transaction_states[0].error_code, code::INVALID_REQUEST);
    assert_eq!(redis.next_offset(&topic, 0), 0, "nothing stored");
    // The transaction itself still commits (no data: no marker).
    assert_eq!(end(&mut conn, &id, pid), code::NONE);
    assert_eq!(
        end(&mut conn, &id, pid),
        code::NONE,
        "a retried commit is answered the same"
    );
    assert_eq!(redis.next_offset(&topic, 0), 0);
}

#[test]
fn a_decided_commit_left_unfinished_is_finished_by_the_coordinator_and_operators_see_it() {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    use kafka_protocol::messages::{
        DescribeProducersRequest, DescribeProducersResponse, DescribeTransactionsRequest,
        DescribeTransactionsResponse,
    };
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &["--set", "transactions.abort_check_interval=100ms"],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-recover");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-recover-id", &topic);
    let describe_producers = |conn: &mut KafkaConn| {
        let response: DescribeProducersResponse = conn.request(
            0,
            &DescribeProducersRequest::default().with_topics(vec![
                TopicRequest::default()
                    .with_name(raw::topic_name(&topic))
                    .with_partition_indexes(vec![0]),
            ]),
        );
        response.topics[0].partitions[0]
            .active_producers
            .iter()
            .map(|producer| (producer.producer_id.0, producer.current_txn_start_offset))
            .collect::<Vec<_>>()
    };
    // Added to the transaction, nothing written: not an active producer
    // (Kafka keeps the verification apart from the producers' state).
    assert_eq!(describe_producers(&mut conn), []);
    let data = transactional(&[Record::value(batch::at(1_000), b"decided")], pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, data), (code::NONE, 0));
    assert_eq!(
        describe_producers(&mut conn),
        [(pid, 0)],
        "the open transaction starts at 0"
    );
    let describe = |conn: &mut KafkaConn| {
        let response: DescribeTransactionsResponse = conn.request(
            0,
            &DescribeTransactionsRequest::default()
                .with_transactional_ids(vec![TransactionalId(StrBytes::from_string(id.clone()))]),
        );
        let state = &response.transaction_states[0];
        (
            state.error_code,
            state.transaction_state.to_string(),
            state.topics.len(),
            state.transaction_start_time_ms > 0,
        )
    };
    assert_eq!(describe(&mut conn), (code::NONE, "Ongoing".to_owned(), 1, true));
    let listed: ListTransactionsResponse = conn.request(
        1,
        &ListTransactionsRequest::default()
            .with_state_filters(vec![StrBytes::from_static_str("Ongoing")])
            .with_duration_filter(-1),
    );
    assert!(
        listed
            .transaction_states
            .iter()
            .any(|s| s.transactional_id.0.as_str() == id && s.producer_id.0 == pid),
        "ListTransactions lists the open transaction"
    );

    // As if the gateway deciding the commit died right after the decision:
    // the state says PrepareCommit, no marker is written.
    let key = format!("ketch:txn:{{{id}}}");
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("state")
        .arg("PrepareCommit")
        .arg("updated_ms")
        .arg(0)
        .query(&mut redis.connection())
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg("ketch:transactions")
        .arg(0)
        .arg(&id)
        .query(&mut redis.connection())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while watermarks(&mut conn, &topic) != (2, 2) {
        assert!(Instant::now() < deadline, "the decided commit was never finished");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A completed transaction keeps its start time, as Kafka reports it.
    assert_eq!(
        describe(&mut conn),
        (code::NONE, "CompleteCommit".to_owned(), 0, true)
    );
    assert_eq!(
        describe_producers(&mut conn),
        [(pid, -1)],
        "no open transaction left"
    );
    let fetch = raw::fetch_request(&topic, 0, 0, 0).with_isolation_level(1);
    let response: kafka_protocol::messages::FetchResponse = conn.request(11, &fetch);
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.aborted_transactions.as_ref().map(Vec::len), Some(0));
    assert_eq!(
        raw::count_records(partition.records.as_deref().unwrap()),
        2,
        "the record and its commit marker"
    );
    eventually("finished by the coordinator", 1.0, || {
        transactions_metric(&ketch, "coordinator_commit")
    });
}

/// InitProducerId naming a producer id and epoch (KIP-360).
fn init_named(conn: &mut KafkaConn, id: &str, pid: i64, epoch: i16) -> (i16, i64, i16) {
    let response: InitProducerIdResponse = conn.request(
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.to_owned()))))
            .with_transaction_timeout_ms(30_000)
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch),
    );
    (
        response.error_code,
        response.producer_id.0,
        response.producer_epoch,
    )
}

/// Runs `scripts/txn_join.lua` (with the producer state's codec, writing
/// it compact) as AddPartitionsToTxn would for
/// transaction `number` of `pid` on partition 0 of `topic`: what a
/// registration delayed past its transaction's end would meet.
fn late_join(redis: &TestRedis, topic: &str, pid: i64, epoch: i16, number: i64) -> String {
    let tag = &redis.topic_tags(topic)[0];
    redis::cmd("EVAL")
        .arg(concat!(
            include_str!("../../storage/src/scripts/producer_state.lua"),
            include_str!("../../storage/src/scripts/txn_join.lua")
        ))
        .arg(2)
        .arg(format!("ketch:{{{tag}}}:meta"))
        .arg(format!("ketch:{{{tag}}}:producers"))
        .arg(pid)
        .arg(epoch)
        .arg(number)
        .arg(1)
        .query(&mut redis.connection())
        .expect("EVAL txn_join")
}

/// A producer cannot slip out of its transaction, nor take its
/// transactional id back once fenced: a non-transactional batch while its
/// transaction has data in the partition is refused (Kafka: "expected
/// transactional write"); a registration arriving after its transaction
/// ended there is refused; a producer fenced by a new instance cannot
/// bump its way back (Kafka's last-epoch bookkeeping), while the current
/// one may bump, and a retry of that bump gets the same epoch.
#[test]
fn a_producer_cannot_leave_its_transaction_nor_unfence_itself() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-escape");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let id = unique_topic("txn-escape-id");
    let first = init(&mut conn, &id, 30_000);
    let (pid, epoch) = (first.producer_id.0, first.producer_epoch);

    assert_eq!(add_partition(&mut conn, &id, pid, epoch, &topic, 0), code::NONE);
    let data = transactional(&[Record::value(batch::at(1), b"in")], pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, data), (code::NONE, 0));
    for (batch_epoch, sequence) in [(epoch, 1), (epoch + 1, 0)] {
        let plain =
            batch::encode_idempotent(&[Record::value(batch::at(2), b"out")], pid, batch_epoch, sequence);
        assert_eq!(
            produce_in(&mut conn, None, &topic, plain).0,
            INVALID_TXN_STATE,
            "a non-transactional batch of epoch {batch_epoch} inside the transaction"
        );
    }
    assert_eq!(
        redis.next_offset(&topic, 0),
        1,
        "nothing stored but the transaction's record"
    );
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, true), code::NONE);
    eventually("the record and its marker", 2, || redis.next_offset(&topic, 0));
    assert_eq!(
        watermarks(&mut conn, &topic),
        (2, 2),
        "nothing holds the last stable offset"
    );
    // Transaction 1 ended here: its registration, arriving late, is refused.
    assert_eq!(late_join(&redis, &topic, pid, epoch, 1), "ended");

    // A new instance (naming no producer) fences the first, which cannot
    // bump its way back by naming its old epoch.
    let second = init(&mut conn, &id, 30_000);
    assert_eq!((second.producer_id.0, second.producer_epoch), (pid, epoch + 1));
    assert_eq!(init_named(&mut conn, &id, pid, epoch).0, PRODUCER_FENCED);
    assert_eq!(
        init_named(&mut conn, &id, pid + 1, epoch + 1).0,
        PRODUCER_FENCED,
        "another producer id"
    );
    // The current producer bumps its epoch (after an abortable error); a
    // retry of that call is answered the same, without a second bump.
    assert_eq!(
        init_named(&mut conn, &id, pid, epoch + 1),
        (code::NONE, pid, epoch + 2)
    );
    assert_eq!(
        init_named(&mut conn, &id, pid, epoch + 1),
        (code::NONE, pid, epoch + 2)
    );
    assert_eq!(init_named(&mut conn, &id, pid, epoch).0, PRODUCER_FENCED);

    // A registration of an earlier transaction never replaces a later one.
    assert_eq!(
        add_partition(&mut conn, &id, pid, epoch + 2, &topic, 0),
        code::NONE
    );
    assert_eq!(late_join(&redis, &topic, pid, epoch + 2, 1), "ended");
    let data = transactional(&[Record::value(batch::at(3), b"second")], pid, epoch + 2, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, data), (code::NONE, 2));
    assert_eq!(
        watermarks(&mut conn, &topic),
        (3, 2),
        "transaction 2 holds the last stable offset"
    );
}

/// A transactional producer's new epoch starts its sequences at 0 in a
/// partition that knows the producer (Kafka: "Invalid sequence number for
/// new epoch"), while a producer the partition knows only by its
/// registration may start anywhere, as a producer without state may
/// (KIP-360). Sequences go on across transactions of one epoch.
#[test]
fn a_new_epoch_starts_its_sequences_at_zero_where_the_producer_is_known() {
    const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-new-epoch");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let id = unique_topic("txn-new-epoch-id");
    let first = init(&mut conn, &id, 30_000);
    let (pid, epoch) = (first.producer_id.0, first.producer_epoch);

    // Known only by its registration: it may start at sequence 7.
    assert_eq!(add_partition(&mut conn, &id, pid, epoch, &topic, 0), code::NONE);
    let data = transactional(&[Record::value(batch::at(1), b"a")], pid, epoch, 7);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, data), (code::NONE, 0));
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, true), code::NONE);
    eventually("the record and its marker", 2, || redis.next_offset(&topic, 0));
    // The next transaction of the same epoch goes on from sequence 8.
    assert_eq!(add_partition(&mut conn, &id, pid, epoch, &topic, 0), code::NONE);
    let gap = transactional(&[Record::value(batch::at(2), b"gap")], pid, epoch, 0);
    assert_eq!(
        produce_in(&mut conn, Some(&id), &topic, gap).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );
    let data = transactional(&[Record::value(batch::at(2), b"b")], pid, epoch, 8);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, data), (code::NONE, 2));
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, true), code::NONE);
    eventually("the second record and marker", 4, || redis.next_offset(&topic, 0));

    // A bumped epoch (KIP-360, after an abortable error) starts at 0 here.
    let (error, _, bumped) = init_named(&mut conn, &id, pid, epoch);
    assert_eq!((error, bumped), (code::NONE, epoch + 1));
    assert_eq!(add_partition(&mut conn, &id, pid, bumped, &topic, 0), code::NONE);
    let late = transactional(&[Record::value(batch::at(3), b"late")], pid, bumped, 9);
    assert_eq!(
        produce_in(&mut conn, Some(&id), &topic, late).0,
        OUT_OF_ORDER_SEQUENCE_NUMBER
    );
    assert_eq!(redis.next_offset(&topic, 0), 4, "nothing stored");
    let data = transactional(&[Record::value(batch::at(3), b"c")], pid, bumped, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, data), (code::NONE, 4));
}

/// `ketch_transactions_total{outcome}` of a gateway (0 when absent).
fn transactions_metric(ketch: &Ketch, outcome: &str) -> f64 {
    metric(
        ketch,
        &format!("ketch_transactions_total{{outcome=\"{outcome}\"}}"),
    )
}

/// The value of one of the gateway's metric series (0 when absent).
fn metric(ketch: &Ketch, series: &str) -> f64 {
    let (status, body) = ketch.http_get("/metrics");
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}
/// Archiving a partition with transactions leaves out the markers and the
/// aborted transactions' records (recorded as the segment's holes), so a
/// consumer reading the archive from offset 0 — read_committed or not —
/// gets exactly the committed records, in order, across the holes.
#[test]
fn the_archive_keeps_committed_records_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = TestRedis::start();
    let data_dir = format!("tiering.data_dir={}", dir.path().join("data").display());
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "tiering.tick_interval=100ms",
            "--set",
            &data_dir,
            "--set",
            "transactions.abort_check_interval=100ms",
        ],
    );
    let rt = ketch_tests::runtime();
    let topic = unique_topic("txn-archive");
    ketch.create_topic_with(
        &rt,
        &topic,
        1,
        &[
            ("remote.storage.enable", "true"),
            ("retention.ms", "-1"),
            ("segment.bytes", "8192"),
            ("segment.ms", "1000"),
            ("local.retention.bytes", "0"),
        ],
    );
    let producer = ketch.producer_with(&[("transactional.id", &unique_topic("txn-archive-id"))]);
    producer.init_transactions(Duration::from_secs(30)).expect("init");
    let plain = ketch.producer();
    let mut committed = Vec::new();
    for round in 0..8 {
        for (kind, count) in [("c", 40), ("a", 25)] {
            producer.begin_transaction().unwrap();
            let sent: Vec<_> = (0..count)
                .map(|i| {
                    let value = format!("{kind}{round}-{i}-{}", "x".repeat(100));
                    if kind == "c" {
                        committed.push(value.clone());
                    }
                    producer
                        .send_result(FutureRecord::<(), _>::to(&topic).payload(&value).partition(0))
                        .map_err(|(e, _)| e)
                        .expect("queued")
                })
                .collect();
            producer.flush(Duration::from_secs(30)).unwrap();
            if kind == "c" {
                producer
                    .commit_transaction(Duration::from_secs(30))
                    .expect("commit");
            } else {
                producer
                    .abort_transaction(Duration::from_secs(30))
                    .expect("abort");
            }
            for delivery in sent {
                let _ = rt.block_on(delivery);
            }
        }
        // A non-transactional record between transactions.
        let value = format!("p{round}");
        rt.block_on(plain.send(
            FutureRecord::<(), _>::to(&topic).payload(&value).partition(0),
            Duration::from_secs(30),
        ))
        .map_err(|(e, _)| e)
        .expect("plain record");
        committed.push(value);
    }
    // Everything archived and trimmed from Redis.
    let all_archived = || {
        let end = redis.next_offset(&topic, 0);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let segments = redis.segments(&topic, 0);
            let archived_to = segments
                .iter()
                .filter(|s| s.get("path").is_some())
                .map(|s| s["last"].as_i64().unwrap() + 1)
                .max()
                .unwrap_or(0);
            if archived_to == end && segments.iter().all(|s| s.get("path").is_some()) {
                return;
            }
            assert!(Instant::now() < deadline, "not all archived: {segments:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    all_archived();
    // Then a segment of no committed record: an aborted transaction alone
    // (its records and marker), sealed by segment.ms. It has no data file
    // to write, and archiving (and so retention) goes on past it.
    producer.begin_transaction().unwrap();
    for i in 0..5 {
        producer
            .send_result(
                FutureRecord::<(), _>::to(&topic)
                    .payload(&format!("alone-{i}"))
                    .partition(0),
            )
            .map_err(|(e, _)| e)
            .expect("queued");
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    producer
        .abort_transaction(Duration::from_secs(30))
        .expect("abort");
    all_archived();
    let last = redis.segments(&topic, 0).pop().expect("segments");
    assert_eq!(
        (
            last["path"].as_str(),
            last.get("file_bytes").and_then(|b| b.as_i64())
        ),
        (Some(""), Some(0)),
        "archived without a data file: {last:?}"
    );
    let holes: usize = redis
        .segments(&topic, 0)
        .iter()
        .filter_map(|s| s.get("holes").and_then(|h| h.as_array()).map(Vec::len))
        .sum();
    assert!(
        holes >= 8,
        "aborted transactions and markers left out as holes ({holes} ranges)"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while redis.stream_len(&topic, 0) > 0 {
        assert!(Instant::now() < deadline, "Redis still holds archived batches");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every aborted transaction ended below the local start, in archived
    // segments: the index keeps them ten minutes more (a fetch that read
    // batches above the old local start may still look for their aborts),
    // then none of them, though the log start never moves (retention.ms
    // -1). The ten minutes pass here by setting the bound's time back.
    assert!(
        redis.aborted_count(&topic, 0) >= 9,
        "kept for the fetches under way"
    );
    redis.set_meta(&topic, 0, &[("abt_to", "999999999999"), ("abt_at", "0")]);
    eventually("the aborted transactions' index emptied", 0, || {
        redis.aborted_count(&topic, 0)
    });
    for isolation in ["read_committed", "read_uncommitted"] {
        let read = drain(&reader(&ketch, &topic, 1, isolation), committed.len());
        assert_eq!(
            read, committed,
            "{isolation}: the committed records, in order, from the archive"
        );
    }
}

/// With `storage.acks_all_replicas`, the decision and the markers are
/// WAITed like the data they decide: EndTxn answers once the replica has
/// the decision, and a commit is complete only once the replica has its
/// markers; while the replica answers nothing the decision stands
/// unconfirmed (COORDINATOR_NOT_AVAILABLE) and unfinished (the last stable
/// offset stays), and the client's retry finds it once the replica is
/// back.
#[test]
fn markers_wait_for_the_replicas_acks_all_waits_for() {
    use ketch_tests::Frozen;
    let (primary, replica, ketch) = Ketch::start_with_replica(&[
        "--set",
        "storage.acks_all_timeout=300ms",
        "--set",
        "transactions.abort_check_interval=100ms",
    ]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-acks-all");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let id = unique_topic("txn-acks-all-id");
    let started = init(&mut conn, &id, 60_000);
    let (pid, epoch) = (started.producer_id.0, started.producer_epoch);
    let end = |conn: &mut KafkaConn| end_txn(conn, &id, pid, epoch, true);
    let replica_next = |topic: &str| -> Option<i64> {
        let tag = &primary.topic_tags(topic)[0];
        redis::cmd("HGET")
            .arg(format!("ketch:{{{tag}}}:meta"))
            .arg("next_offset")
            .query(&mut replica.connection())
            .unwrap()
    };
    assert_eq!(add_partition(&mut conn, &id, pid, epoch, &topic, 0), code::NONE);
    let first = transactional(&[Record::value(batch::at(1_000), b"one")], pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, first), (code::NONE, 0));
    let replica_state = || -> Option<String> {
        redis::cmd("HGET")
            .arg(format!("ketch:txn:{{{id}}}"))
            .arg("state")
            .query(&mut replica.connection())
            .unwrap()
    };
    assert_eq!(end(&mut conn), code::NONE);
    assert!(
        matches!(
            replica_state().as_deref(),
            Some("PrepareCommit" | "CompleteCommit")
        ),
        "the replica has the decision once the commit is answered: {:?}",
        replica_state()
    );
    // The next transaction begins once the marker is written, and its
    // marker confirmed by the replica.
    assert_eq!(add_partition(&mut conn, &id, pid, epoch, &topic, 0), code::NONE);
    assert_eq!(replica_next(&topic), Some(2), "the replica has the marker");

    // The replica stops answering: the next commit is decided but not
    // confirmed: EndTxn answers COORDINATOR_NOT_AVAILABLE (retriable), and
    // the decision, written, stands unfinished.
    let second = transactional(&[Record::value(batch::at(1_001), b"two")], pid, epoch, 1);
    let frozen = Frozen::freeze(replica.pid());
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, second).0, code::NONE);
    assert_eq!(
        end(&mut conn),
        COORDINATOR_NOT_AVAILABLE,
        "the decision is not confirmed"
    );
    assert_eq!(
        add_partition(&mut conn, &id, pid, epoch, &topic, 0),
        51,
        "CONCURRENT_TRANSACTIONS while the commit is unfinished"
    );
    drop(frozen);
    // Back: the client's retry of EndTxn finds the commit made, it is
    // finished, and the next transaction may begin.
    let deadline = Instant::now() + Duration::from_secs(30);
    while end(&mut conn) != code::NONE {
        assert!(Instant::now() < deadline, "the retried commit never succeeded");
        std::thread::sleep(Duration::from_millis(100));
    }
    while add_partition(&mut conn, &id, pid, epoch, &topic, 0) != code::NONE {
        assert!(
            Instant::now() < deadline,
            "the unfinished commit was never finished"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(watermarks(&mut conn, &topic), (4, 4));
}

/// Markers and acks=all appends share the durable connections: with one
/// connection, commits whose markers go to a partition that an acks=all
/// producer keeps appending to (large batches, which hold the partition's
/// append slot) all complete — a marker never holds the slot while it
/// waits for the connection an append holding it waits with.
#[test]
fn markers_and_acks_all_appends_to_one_partition_never_wait_for_each_other() {
    let (_primary, _replica, ketch) = Ketch::start_with_replica(&["--set", "storage.acks_all_connections=1"]);
    let rt = ketch_tests::runtime();
    let topic = unique_topic("txn-shared-slot");
    ketch.create_topic(&rt, &topic, 1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let appended = std::thread::scope(|scope| {
        // Several appends at once: one holds the connection while the
        // others wait for it, then for the slot.
        let appenders: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let producer = ketch.producer_with(&[("acks", "all"), ("linger.ms", "0")]);
                    let value = "p".repeat(8_000);
                    let mut sent = 0;
                    // Bounded, should a commit fail and never stop them.
                    let deadline = Instant::now() + Duration::from_secs(90);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                        let delivery = producer.send(
                            FutureRecord::<(), _>::to(&topic).payload(&value).partition(0),
                            Duration::from_secs(30),
                        );
                        rt.block_on(delivery)
                            .map_err(|(e, _)| e)
                            .expect("an acks=all append");
                        sent += 1;
                    }
                    sent
                })
            })
            .collect();
        let producer = ketch.producer_with(&[("transactional.id", &unique_topic("txn-shared-slot-id"))]);
        producer.init_transactions(Duration::from_secs(30)).expect("init");
        let value = "t".repeat(8_000);
        for _ in 0..30 {
            producer.begin_transaction().unwrap();
            for _ in 0..3 {
                let delivery = producer
                    .send_result(FutureRecord::<(), _>::to(&topic).payload(&value).partition(0))
                    .map_err(|(e, _)| e)
                    .expect("queued");
                drop(delivery);
            }
            producer
                .commit_transaction(Duration::from_secs(30))
                .expect("a commit while appends run");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        appenders
            .into_iter()
            .map(|a| a.join().expect("an appender"))
            .sum::<usize>()
    });
    assert!(appended > 0);
    // Every marker written: nothing holds the last stable offset.
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    eventually("nothing open", true, || {
        let (high, stable) = watermarks(&mut conn, &topic);
        high == stable
    });
}

/// TxnOffsetCommit stages a group's offsets: OffsetFetch with
/// require_stable answers UNSTABLE_OFFSET_COMMIT until the transaction
/// commits (KIP-447), in the named form and the all-partitions form, a
/// plain one the old offset; after the commit both see the new one, and an
/// aborted transaction's offsets never apply. Two producers' transactions
/// staging offsets of one partition keep theirs apart, and offsets left
/// staged by a transaction that ended without them (a gateway that died
/// between staging and its check) no longer hold require_stable readers.
#[test]
fn offsets_committed_in_a_transaction_apply_on_commit_only() {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::{
        AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, GroupId, OffsetFetchRequest, OffsetFetchResponse,
    };
    const UNSTABLE_OFFSET_COMMIT: i16 = 88;
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-offsets");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let group = unique_topic("txn-offsets-group");
    let group_id = || GroupId(StrBytes::from_string(group.clone()));
    // Two transactional producers: (id, producer id, epoch).
    let producers: Vec<(String, i64, i16)> = (0..2)
        .map(|_| {
            let id = unique_topic("txn-offsets-id");
            let started = init(&mut conn, &id, 60_000);
            (id, started.producer_id.0, started.producer_epoch)
        })
        .collect();
    let txn_id = |id: &str| TransactionalId(StrBytes::from_string(id.to_owned()));
    // An empty group id is INVALID_GROUP_ID, as in Kafka; so is one that
    // starts with '}' (its keys' hash tag would be empty, and a Redis
    // Cluster would put them in different slots).
    const INVALID_GROUP_ID: i16 = 24;
    for bad in ["", "}braced"] {
        let (id, pid, epoch) = &producers[0];
        let added: AddOffsetsToTxnResponse = conn.request(
            3,
            &AddOffsetsToTxnRequest::default()
                .with_transactional_id(txn_id(id))
                .with_producer_id(ProducerId(*pid))
                .with_producer_epoch(*epoch)
                .with_group_id(GroupId(StrBytes::from_static_str(bad))),
        );
        assert_eq!(added.error_code, INVALID_GROUP_ID, "{bad:?}");
    }
    // (error, offset) of partition 0, asked by name or (all) with every
    // partition the group has.
    let fetch = |conn: &mut KafkaConn, stable: bool, all: bool| {
        let named = vec![
            OffsetFetchRequestTopic::default()
                .with_name(raw::topic_name(&topic))
                .with_partition_indexes(vec![0]),
        ];
        let response: OffsetFetchResponse = conn.request(
            7,
            &OffsetFetchRequest::default()
                .with_group_id(group_id())
                .with_require_stable(stable)
                .with_topics((!all).then_some(named)),
        );
        response
            .topics
            .iter()
            .find(|t| t.name.0.as_str() == topic)
            .map_or((code::NONE, -1), |t| {
                (t.partitions[0].error_code, t.partitions[0].committed_offset)
            })
    };
    let stage = |conn: &mut KafkaConn, producer: &(String, i64, i16), offset: i64| {
        stage_offset(conn, &group, producer, &topic, offset);
    };
    let end = |conn: &mut KafkaConn, (id, pid, epoch): &(String, i64, i16), commit: bool| {
        assert_eq!(end_txn(conn, id, *pid, *epoch, commit), code::NONE);
    };
    let (a, b) = (&producers[0], &producers[1]);

    stage(&mut conn, a, 42);
    assert_eq!(
        fetch(&mut conn, true, false).0,
        UNSTABLE_OFFSET_COMMIT,
        "staged, not decided"
    );
    assert_eq!(
        fetch(&mut conn, false, false),
        (code::NONE, -1),
        "nothing committed before"
    );
    end(&mut conn, a, true);
    eventually("committed", (code::NONE, 42), || fetch(&mut conn, true, false));
    assert_eq!(fetch(&mut conn, true, true), (code::NONE, 42));
    // The group never had members (no snapshot): its offsets expire after
    // the retention from this commit, as a standalone group's do.
    let mut redis_conn = redis.connection();
    let pttl = |redis_conn: &mut ketch_tests::TestConnection, key: &str| -> i64 {
        redis::cmd("PTTL").arg(key).query(redis_conn).expect("PTTL")
    };
    let offsets_key = format!("ketch:group:{{{group}}}:offsets");
    let staged_key = format!("ketch:group:{{{group}}}:txn-offsets");
    assert!(
        pttl(&mut redis_conn, &offsets_key) > 0,
        "a standalone group's offsets expire"
    );
    stage(&mut conn, a, 99);
    assert_eq!(pttl(&mut redis_conn, &staged_key), -1, "staged offsets stay");
    end(&mut conn, a, false);
    eventually(
        "an aborted transaction's offsets never apply",
        (code::NONE, 42),
        || fetch(&mut conn, true, false),
    );
    assert_eq!(fetch(&mut conn, false, false), (code::NONE, 42));
    // Nothing staged is left: the staged offsets' key expires with the
    // offsets rather than outliving them.
    eventually("the staged offsets' key expires", true, || {
        pttl(&mut redis_conn, &staged_key) > 0
    });

    // Both producers stage the partition's offset; each commit applies its own.
    stage(&mut conn, a, 100);
    stage(&mut conn, b, 200);
    // The all-partitions form lists committed partitions, as Kafka does,
    // each unstable while a transaction's offsets for it are undecided.
    assert_eq!(fetch(&mut conn, true, true).0, UNSTABLE_OFFSET_COMMIT);
    assert_eq!(fetch(&mut conn, false, true), (code::NONE, 42));
    end(&mut conn, a, true);
    eventually("a's commit applied", (code::NONE, 100), || {
        fetch(&mut conn, false, false)
    });
    assert_eq!(
        fetch(&mut conn, true, false).0,
        UNSTABLE_OFFSET_COMMIT,
        "b's are still undecided"
    );
    end(&mut conn, b, true);
    eventually("b's commit applied b's offset", (code::NONE, 200), || {
        fetch(&mut conn, true, false)
    });

    // Offsets a finished transaction left staged are removed by the next
    // reader that asks for stable offsets.
    let field = format!("{topic}:0:{}", a.1);
    let json = r#"{"offset":7,"leader_epoch":-1,"metadata":null,"commit_ms":0}"#;
    let left = format!("2:{}:{}{json}", a.0.len(), a.0);
    let _: i64 = redis::cmd("HSET")
        .arg(&staged_key)
        .arg(&field)
        .arg(&left)
        .query(&mut redis_conn)
        .expect("HSET");
    assert_eq!(
        fetch(&mut conn, true, false),
        (code::NONE, 200),
        "a finished transaction's leftovers are stable"
    );
    let still: bool = redis::cmd("HEXISTS")
        .arg(&staged_key)
        .arg(&field)
        .query(&mut redis_conn)
        .expect("HEXISTS");
    assert!(!still, "the leftover was removed");

    // OffsetDelete removes the partition's offsets staged by an open
    // transaction too: its commit does not bring the offset back, and
    // require_stable readers are not held (Kafka's tombstone).
    stage(&mut conn, a, 300);
    let delete: kafka_protocol::messages::OffsetDeleteResponse = conn.request(
        0,
        &kafka_protocol::messages::OffsetDeleteRequest::default()
            .with_group_id(group_id())
            .with_topics(vec![
                kafka_protocol::messages::offset_delete_request::OffsetDeleteRequestTopic::default()
                    .with_name(raw::topic_name(&topic))
                    .with_partitions(vec![
                        kafka_protocol::messages::offset_delete_request::OffsetDeleteRequestPartition::default()
                            .with_partition_index(0),
                    ]),
            ]),
    );
    assert_eq!(delete.error_code, code::NONE);
    assert_eq!(delete.topics[0].partitions[0].error_code, code::NONE);
    assert_eq!(
        fetch(&mut conn, true, false),
        (code::NONE, -1),
        "deleted, and stable"
    );
    let staged: bool = redis::cmd("HEXISTS")
        .arg(&staged_key)
        .arg(&field)
        .query(&mut redis_conn)
        .expect("HEXISTS");
    assert!(!staged, "the staged offset was deleted");
    end(&mut conn, a, true);
    assert_eq!(
        fetch(&mut conn, true, false),
        (code::NONE, -1),
        "the transaction's commit did not bring the offset back"
    );

    // The group has no members: a plain commit leaves its offsets, and what
    // it keeps beside them, to expire after the retention (a TTL).
    let plain: kafka_protocol::messages::OffsetCommitResponse =
        conn.request(8, &raw::offset_commit_request(&group, "", -1, &topic, 0, 500));
    assert_eq!(plain.topics[0].partitions[0].error_code, code::NONE);
    assert!(pttl(&mut redis_conn, &offsets_key) > 0);
    // (Gone already: nothing was staged, and the group had no offsets
    // when the last transaction ended.)
    let staged = pttl(&mut redis_conn, &staged_key);
    assert!(
        staged > 0 || staged == -2,
        "the staged offsets' key expires with the group ({staged})"
    );
    // Its last plain commit long ago (5 s of retention left): a
    // transaction's commit renews it, as a commit; what it stages stays
    // until the transaction ends.
    for key in [&offsets_key, &staged_key] {
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(key)
            .arg(5_000)
            .query(&mut redis_conn)
            .expect("PEXPIRE");
    }
    stage(&mut conn, a, 600);
    assert_eq!(pttl(&mut redis_conn, &staged_key), -1, "staged offsets stay");
    end(&mut conn, a, true);
    eventually("the transaction's offset", (code::NONE, 600), || {
        fetch(&mut conn, true, false)
    });
    for key in [&offsets_key, &staged_key] {
        let left = pttl(&mut redis_conn, key);
        assert!(
            left > 60_000,
            "{key} expires in {left} ms, not the retention from the transaction's commit"
        );
    }
}

/// Of a partition's committed offset and a transaction's offset for it,
/// the later stands, as Kafka keeps the later record of its offsets log: a
/// plain commit made after a transaction staged its offset is not
/// overwritten when the transaction commits; an offset staged after a
/// plain commit applies; of two transactions' offsets, the one staged
/// later stands whichever commits first.
#[test]
fn the_later_of_a_plain_commit_and_a_transactions_offset_stands() {
    use kafka_protocol::messages::{OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse};
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-order");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let group = unique_topic("txn-order-group");
    let producers: Vec<(String, i64, i16)> = (0..2)
        .map(|_| {
            let id = unique_topic("txn-order-id");
            let started = init(&mut conn, &id, 60_000);
            (id, started.producer_id.0, started.producer_epoch)
        })
        .collect();
    let (a, b) = (&producers[0], &producers[1]);
    let stage = |conn: &mut KafkaConn, producer: &(String, i64, i16), offset: i64| {
        stage_offset(conn, &group, producer, &topic, offset);
    };
    // Commits the producer's transaction and awaits its offsets' apply
    // (their staged field removed), whether or not they stand.
    let staged_key = format!("ketch:group:{{{group}}}:txn-offsets");
    let commit = |conn: &mut KafkaConn, (id, pid, epoch): &(String, i64, i16)| {
        assert_eq!(end_txn(conn, id, *pid, *epoch, true), code::NONE);
        let field = format!("{topic}:0:{pid}");
        eventually("the transaction's offsets applied", false, || {
            redis::cmd("HEXISTS")
                .arg(&staged_key)
                .arg(&field)
                .query::<bool>(&mut redis.connection())
                .expect("HEXISTS")
        });
    };
    let plain = |conn: &mut KafkaConn, offset: i64| {
        let response: OffsetCommitResponse =
            conn.request(8, &raw::offset_commit_request(&group, "", -1, &topic, 0, offset));
        assert_eq!(response.topics[0].partitions[0].error_code, code::NONE);
    };
    let committed = |conn: &mut KafkaConn| {
        let response: OffsetFetchResponse = conn.request(
            7,
            &OffsetFetchRequest::default()
                .with_group_id(StrBytes::from_string(group.clone()).into())
                .with_topics(None),
        );
        let partition = &response.topics[0].partitions[0];
        assert_eq!(partition.error_code, code::NONE);
        partition.committed_offset
    };

    stage(&mut conn, a, 100);
    plain(&mut conn, 150);
    commit(&mut conn, a);
    assert_eq!(
        committed(&mut conn),
        150,
        "the plain commit after the stage stands"
    );

    stage(&mut conn, a, 200);
    commit(&mut conn, a);
    assert_eq!(
        committed(&mut conn),
        200,
        "staged after the plain commit, it applies"
    );

    stage(&mut conn, a, 300);
    stage(&mut conn, b, 400);
    commit(&mut conn, b);
    assert_eq!(committed(&mut conn), 400);
    commit(&mut conn, a);
    assert_eq!(committed(&mut conn), 400, "a staged before b: b's offset stands");

    plain(&mut conn, 500);
    assert_eq!(committed(&mut conn), 500, "a plain commit always stands");

    // The stages' counter gone (an older release's sweep of staged offsets
    // removes the fields it cannot read): rebuilt from the offsets staged,
    // so a plain commit made after a stage still stands.
    stage(&mut conn, a, 600);
    let _: i64 = redis::cmd("HDEL")
        .arg(&staged_key)
        .arg("order")
        .query(&mut redis.connection())
        .expect("HDEL");
    plain(&mut conn, 650);
    commit(&mut conn, a);
    assert_eq!(
        committed(&mut conn),
        650,
        "the plain commit after the stage stands"
    );
}

/// A transaction in a partition added through another gateway, ended
/// through a gateway whose copy of the topic predates the partition (it
/// read it under half a second before): the partition gets its marker, and
/// its last stable offset moves past the transaction.
#[test]
fn a_partition_added_through_another_gateway_gets_its_marker() {
    let redis = TestRedis::start();
    let (a, b) = (Ketch::start(&redis.url(), &[]), Ketch::start(&redis.url(), &[]));
    let (mut via_a, mut via_b) = (
        KafkaConn::connect(a.kafka_addr()),
        KafkaConn::connect(b.kafka_addr()),
    );
    // The case needs gateway a's copy of the topic under half a second old
    // at EndTxn (older, a reads the registry again anyway): a try that
    // took longer is made again, with a new topic.
    for _ in 0..5 {
        let topic = unique_topic("txn-grown");
        assert_eq!(raw::create_topic(&mut via_a, &topic, 1), code::NONE);
        // Gateway a reads the topic: one partition.
        let read = Instant::now();
        let plain = batch::encode(&[Record::value(batch::at(0), b"plain")]);
        assert_eq!(raw::produce(&mut via_a, &topic, 0, plain).0, code::NONE);
        assert_eq!(raw::create_partitions(&mut via_b, &topic, 2), code::NONE);
        let (id, pid, epoch) = open_transaction_on(&mut via_b, "txn-grown-id", &topic, 1);
        let records = transactional(&[Record::value(batch::at(0), b"in")], pid, epoch, 0);
        let request = raw::produce_request(&topic, 1, records)
            .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.clone()))));
        assert_eq!(raw::produce_result(&via_b.request(9, &request)).0, code::NONE);
        let in_time = read.elapsed() < Duration::from_millis(400);
        assert_eq!(end_txn(&mut via_a, &id, pid, epoch, true), code::NONE);
        let latest = |conn: &mut KafkaConn, isolation: i8| {
            let request = raw::list_offsets_request(&topic, 1, -1).with_isolation_level(isolation);
            let response: ListOffsetsResponse = conn.request(7, &request);
            raw::list_offsets_result(&response).1
        };
        eventually("the last stable offset past the marker", (2, 2), || {
            (latest(&mut via_b, 0), latest(&mut via_b, 1))
        });
        if in_time {
            return;
        }
    }
    panic!("no try ended its transaction within half a second of gateway a reading the topic");
}

/// AddOffsetsToTxn of `group`, then TxnOffsetCommit of `offset` for
/// partition 0 of `topic` (outside the group's generations), by the
/// transaction of `(id, pid, epoch)`; both answered NONE.
fn stage_offset(
    conn: &mut KafkaConn,
    group: &str,
    (id, pid, epoch): &(String, i64, i16),
    topic: &str,
    offset: i64,
) {
    use kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, GroupId};
    let added: AddOffsetsToTxnResponse = conn.request(
        3,
        &AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(id.clone())))
            .with_producer_id(ProducerId(*pid))
            .with_producer_epoch(*epoch)
            .with_group_id(GroupId(StrBytes::from_string(group.to_owned()))),
    );
    assert_eq!(added.error_code, code::NONE);
    let staged = txn_offset_commit(conn, group, &(id.clone(), *pid, *epoch), topic, offset);
    assert_eq!(staged, code::NONE);
}

/// TxnOffsetCommit v3 of `offset` for partition 0 of `topic` by `(id, pid,
/// epoch)`, outside the group's generations: the partition's error code.
fn txn_offset_commit(
    conn: &mut KafkaConn,
    group: &str,
    (id, pid, epoch): &(String, i64, i16),
    topic: &str,
    offset: i64,
) -> i16 {
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{GroupId, TxnOffsetCommitRequest, TxnOffsetCommitResponse};
    let staged: TxnOffsetCommitResponse = conn.request(
        3,
        &TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(id.clone())))
            .with_group_id(GroupId(StrBytes::from_string(group.to_owned())))
            .with_producer_id(ProducerId(*pid))
            .with_producer_epoch(*epoch)
            .with_generation_id(-1)
            .with_topics(vec![
                TxnOffsetCommitRequestTopic::default()
                    .with_name(raw::topic_name(topic))
                    .with_partitions(vec![
                        TxnOffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(offset)
                            .with_committed_leader_epoch(-1),
                    ]),
            ]),
    );
    staged.topics[0].partitions[0].error_code
}

/// A TxnOffsetCommit of a fenced producer (an older epoch) is
/// INVALID_PRODUCER_EPOCH, as Kafka's transaction verification answers it:
/// librdkafka takes that as fatal, and PRODUCER_FENCED, answered before, as
/// an error to abort the transaction over (a zombie went on).
#[test]
fn a_fenced_producers_txn_offset_commit_is_invalid_producer_epoch() {
    const INVALID_PRODUCER_EPOCH: i16 = 47;
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-offsets-fenced");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-offsets-fenced-id", &topic);
    let group = unique_topic("txn-offsets-fenced-group");
    stage_offset(&mut conn, &group, &(id.clone(), pid, epoch), &topic, 1);
    // A newer incarnation of the producer fences this one.
    let fencing = init(&mut conn, &id, 60_000);
    assert_eq!(fencing.error_code, code::NONE);
    assert!(fencing.producer_epoch > epoch);
    assert_eq!(
        txn_offset_commit(&mut conn, &group, &(id, pid, epoch), &topic, 2),
        INVALID_PRODUCER_EPOCH
    );
}

/// Offsets a transaction staged for a group that has committed none yet go
/// when their topic is deleted, as Kafka drops a deleted partition's
/// pending transactional offsets: the transaction's commit does not bring
/// them back for a topic created again under the name.
#[test]
fn a_deleted_topics_staged_offsets_go_with_it() {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse};
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-staged-deleted");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-staged-deleted-id", &topic);
    let group = unique_topic("txn-staged-deleted-group");
    stage_offset(&mut conn, &group, &(id.clone(), pid, epoch), &topic, 42);
    let staged_key = format!("ketch:group:{{{group}}}:txn-offsets");
    // The staged offsets' fields (not the stages' counter, `order`).
    let staged_fields = || -> Vec<String> {
        let fields: Vec<String> = redis::cmd("HKEYS")
            .arg(&staged_key)
            .query(&mut redis.connection())
            .expect("HKEYS");
        fields.into_iter().filter(|f| f != "order").collect()
    };
    assert_eq!(staged_fields(), [format!("{topic}:0:{pid}")]);
    let deleted: DeleteTopicsResponse = conn.request(
        6,
        &DeleteTopicsRequest::default()
            .with_topics(vec![
                DeleteTopicState::default().with_name(Some(raw::topic_name(&topic))),
            ])
            .with_timeout_ms(10_000),
    );
    assert_eq!(deleted.responses[0].error_code, code::NONE);
    assert_eq!(staged_fields(), Vec::<String>::new(), "dropped with the topic");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, true), code::NONE);
    // The commit applied without the offset; with nothing staged left and
    // no committed offsets, the staged offsets' key goes too (it does not
    // outlive the group).
    eventually("the commit applied", false, || {
        redis::cmd("EXISTS")
            .arg(&staged_key)
            .query::<bool>(&mut redis.connection())
            .expect("EXISTS")
    });
    let offsets: Vec<String> = redis::cmd("HKEYS")
        .arg(format!("ketch:group:{{{group}}}:offsets"))
        .query(&mut redis.connection())
        .expect("HKEYS");
    assert_eq!(offsets, Vec::<String>::new());
}

/// A group that only a transaction's TxnOffsetCommit named exists, as
/// Kafka's coordinator creates it then: DeleteGroups deletes it with the
/// offsets staged for it (the transaction's commit does not bring them
/// back), and OffsetDelete answers it rather than GROUP_ID_NOT_FOUND.
#[test]
fn a_group_only_a_transaction_named_can_be_deleted() {
    use kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse, GroupId};
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-staged-group");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-staged-group-id", &topic);
    let (group, other) = (unique_topic("staged-only"), unique_topic("staged-only-other"));
    for g in [&group, &other] {
        stage_offset(&mut conn, g, &(id.clone(), pid, epoch), &topic, 42);
    }
    let delete: kafka_protocol::messages::OffsetDeleteResponse = conn.request(
        0,
        &kafka_protocol::messages::OffsetDeleteRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(other.clone())))
            .with_topics(vec![
                kafka_protocol::messages::offset_delete_request::OffsetDeleteRequestTopic::default()
                    .with_name(raw::topic_name(&topic))
                    .with_partitions(vec![
                        kafka_protocol::messages::offset_delete_request::OffsetDeleteRequestPartition::default()
                            .with_partition_index(0),
                    ]),
            ]),
    );
    assert_eq!(delete.error_code, code::NONE, "the group exists");
    assert_eq!(delete.topics[0].partitions[0].error_code, code::NONE);
    let deleted: DeleteGroupsResponse = conn.request(
        2,
        &DeleteGroupsRequest::default()
            .with_groups_names(vec![GroupId(StrBytes::from_string(group.clone()))]),
    );
    assert_eq!(deleted.results[0].error_code, code::NONE, "the group exists");
    let exists = |key: String| -> bool {
        redis::cmd("EXISTS")
            .arg(key)
            .query(&mut redis.connection())
            .expect("EXISTS")
    };
    assert!(!exists(format!("ketch:group:{{{group}}}:txn-offsets")));
    // Now it is gone.
    let again: DeleteGroupsResponse = conn.request(
        2,
        &DeleteGroupsRequest::default()
            .with_groups_names(vec![GroupId(StrBytes::from_string(group.clone()))]),
    );
    const GROUP_ID_NOT_FOUND: i16 = 69;
    assert_eq!(again.results[0].error_code, GROUP_ID_NOT_FOUND);
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, true), code::NONE);
    eventually("the commit is finished", false, || {
        [&group, &other]
            .iter()
            .any(|g| exists(format!("ketch:group:{{{g}}}:txn-offsets")))
    });
    for g in [&group, &other] {
        assert!(
            !exists(format!("ketch:group:{{{g}}}:offsets")),
            "{g}: nothing applied"
        );
    }
}

/// An offset a finished transaction left staged (its gateway died between
/// the stage and its re-check) goes at the offset expiry's next look, not
/// only when a reader asks for stable offsets: else it would hold the
/// partition's committed offset from expiring and keep the staged
/// offsets' key for ever.
#[test]
fn an_offset_left_staged_goes_at_the_next_expiry_look() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &["--set", "groups.offsets_retention_check_interval=200ms"],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("left-staged");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let group = unique_topic("left-staged-group");
    let plain: kafka_protocol::messages::OffsetCommitResponse =
        conn.request(8, &raw::offset_commit_request(&group, "", -1, &topic, 0, 5));
    assert_eq!(plain.topics[0].partitions[0].error_code, code::NONE);
    // Staged by a transactional id that has no state (long finished).
    let staged_key = format!("ketch:group:{{{group}}}:txn-offsets");
    let field = format!("{topic}:0:424242");
    let id = "long-gone-id";
    let json = r#"{"offset":7,"leader_epoch":-1,"metadata":null,"commit_ms":0}"#;
    let _: i64 = redis::cmd("HSET")
        .arg(&staged_key)
        .arg(&field)
        .arg(format!("3:{}:{id}{json}", id.len()))
        .query(&mut redis.connection())
        .expect("HSET");
    eventually("the leftover is swept", false, || {
        redis::cmd("HEXISTS")
            .arg(&staged_key)
            .arg(&field)
            .query::<bool>(&mut redis.connection())
            .expect("HEXISTS")
    });
}

/// A transactional id unused for `transactions.id_expiration` is forgotten
/// whole: its state expires, and the sweeper drops it from the index too
/// (which ListTransactions reads), though it is never due again.
#[test]
fn an_expired_transactional_id_leaves_the_index() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "transactions.id_expiration=1s",
            "--set",
            "transactions.abort_check_interval=100ms",
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let id = unique_topic("expiring-id");
    assert_eq!(init(&mut conn, &id, 60_000).error_code, code::NONE);
    let listed = |redis: &TestRedis| -> Option<f64> {
        redis::cmd("ZSCORE")
            .arg("ketch:transactions")
            .arg(&id)
            .query(&mut redis.connection())
            .unwrap()
    };
    assert!(listed(&redis).is_some(), "listed once it has a producer");
    let deadline = Instant::now() + Duration::from_secs(30);
    while listed(&redis).is_some() {
        assert!(Instant::now() < deadline, "still listed 30 s on");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An expired id is dropped from the index however many live idle ids
/// sort before it: a pass reads 10,000 at most, and the next one goes on
/// from where it stopped (a workload with a new transactional id per
/// checkpoint keeps hundreds of thousands live; before, every pass began
/// at the first and never reached the rest).
#[test]
fn an_expired_id_behind_ten_thousand_live_ones_leaves_the_index() {
    const LIVE: usize = 10_050;
    const IDLE_SCORE: f64 = 9.0e15;
    let redis = TestRedis::start();
    let mut seed = redis.connection();
    // Each id's state (one key each: in a Redis Cluster, slots of their
    // own), then the index in one command, with `zz-gone` listed though its
    // state expired.
    let mut index = redis::cmd("ZADD");
    index.arg("ketch:transactions");
    for i in 0..LIVE {
        let id = format!("a-live-{i:05}");
        let _: i64 = redis::cmd("HSET")
            .arg(format!("ketch:txn:{{{id}}}"))
            .arg("state")
            .arg("CompleteCommit")
            .arg("pid")
            .arg(1000 + i)
            .arg("epoch")
            .arg(0)
            .query(&mut seed)
            .expect("seed a state");
        index.arg(IDLE_SCORE).arg(id);
    }
    index.arg(IDLE_SCORE).arg("zz-gone");
    let _: i64 = index.query(&mut seed).expect("seed the index");
    let _ketch = Ketch::start(
        &redis.url(),
        &[
            "--set",
            "transactions.id_expiration=1s",
            "--set",
            "transactions.abort_check_interval=100ms",
        ],
    );
    let listed = |id: &str| -> bool {
        redis::cmd("ZSCORE")
            .arg("ketch:transactions")
            .arg(id)
            .query::<Option<f64>>(&mut redis.connection())
            .unwrap()
            .is_some()
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while listed("zz-gone") {
        assert!(Instant::now() < deadline, "still listed 90 s on");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(listed("a-live-00000") && listed("a-live-10049"), "live ids stay");
}

/// A transactional offset commit (v3) that names a static member only by
/// its instance id, its generation reset (-1, no member id: what the Java
/// producer sends for a consumer that lost its generation), is validated
/// against the group as Kafka validates it: FENCED_INSTANCE_ID when the
/// instance's member is another, nothing staged (KIP-447's zombie fence).
#[test]
fn a_transactional_commit_naming_only_an_instance_id_is_fenced_by_the_group() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::txn_offset_commit_request::{
        TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{
        AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, GroupId, JoinGroupRequest, JoinGroupResponse,
        SyncGroupRequest, SyncGroupResponse, TxnOffsetCommitRequest, TxnOffsetCommitResponse,
    };
    const FENCED_INSTANCE_ID: i16 = 82;
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "groups.initial_rebalance_delay=0s"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-static");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let group = GroupId(StrBytes::from_string(unique_topic("txn-static-group")));
    let instance = StrBytes::from_static_str("instance-1");
    let joined: JoinGroupResponse = conn.request(
        5,
        &JoinGroupRequest::default()
            .with_group_id(group.clone())
            .with_group_instance_id(Some(instance.clone()))
            .with_session_timeout_ms(30_000)
            .with_rebalance_timeout_ms(30_000)
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![
                JoinGroupRequestProtocol::default()
                    .with_name(StrBytes::from_static_str("range"))
                    .with_metadata(bytes::Bytes::from_static(b"m")),
            ]),
    );
    assert_eq!(joined.error_code, code::NONE);
    let synced: SyncGroupResponse = conn.request(
        3,
        &SyncGroupRequest::default()
            .with_group_id(group.clone())
            .with_member_id(joined.member_id.clone())
            .with_group_instance_id(Some(instance.clone()))
            .with_generation_id(joined.generation_id),
    );
    assert_eq!(synced.error_code, code::NONE);

    let id = unique_topic("txn-static-id");
    let started = init(&mut conn, &id, 60_000);
    let (pid, epoch) = (started.producer_id.0, started.producer_epoch);
    let txn_id = TransactionalId(StrBytes::from_string(id.clone()));
    let added: AddOffsetsToTxnResponse = conn.request(
        3,
        &AddOffsetsToTxnRequest::default()
            .with_transactional_id(txn_id.clone())
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_group_id(group.clone()),
    );
    assert_eq!(added.error_code, code::NONE);
    let commit = |member_id: StrBytes, generation: i32| {
        TxnOffsetCommitRequest::default()
            .with_transactional_id(txn_id.clone())
            .with_group_id(group.clone())
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_generation_id(generation)
            .with_member_id(member_id)
            .with_group_instance_id(Some(instance.clone()))
            .with_topics(vec![
                TxnOffsetCommitRequestTopic::default()
                    .with_name(raw::topic_name(&topic))
                    .with_partitions(vec![
                        TxnOffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(5)
                            .with_committed_leader_epoch(-1),
                    ]),
            ])
    };
    let zombie: TxnOffsetCommitResponse = conn.request(3, &commit(StrBytes::default(), -1));
    assert_eq!(zombie.topics[0].partitions[0].error_code, FENCED_INSTANCE_ID);
    let member: TxnOffsetCommitResponse =
        conn.request(3, &commit(joined.member_id.clone(), joined.generation_id));
    assert_eq!(member.topics[0].partitions[0].error_code, code::NONE);
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, false), code::NONE);
}

/// Offsets a transaction commits to a group without members renew the
/// group's retention, and never to less than an offset's own retention
/// asked the group be kept (OffsetCommit v2–v4's `retention_time_ms`):
/// the transaction's commit does not cut that short.
#[test]
fn a_transactions_offsets_keep_a_groups_longer_own_retention() {
    use kafka_protocol::messages::OffsetCommitRequest;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "groups.offsets_retention=1h"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-own-retention");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let group = unique_topic("txn-own-retention-group");
    let day = 86_400_000;
    let committed = conn.request(
        2,
        &OffsetCommitRequest::default()
            .with_group_id(StrBytes::from_string(group.clone()).into())
            .with_generation_id_or_member_epoch(-1)
            .with_retention_time_ms(day)
            .with_topics(vec![
                OffsetCommitRequestTopic::default()
                    .with_name(raw::topic_name(&topic))
                    .with_partitions(vec![
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(0)
                            .with_committed_offset(3),
                    ]),
            ]),
    );
    assert_eq!(committed.topics[0].partitions[0].error_code, code::NONE);
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-own-retention-id", &topic);
    stage_offset(&mut conn, &group, &(id.clone(), pid, epoch), &topic, 5);
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, true), code::NONE);
    let key = format!("ketch:group:{{{group}}}:offsets");
    let field = format!("{topic}:0");
    eventually("the transaction's offset applied", true, || {
        let json: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg(&field)
            .query(&mut redis.connection())
            .unwrap();
        json.is_some_and(|j| j.contains("\"offset\":5"))
    });
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query(&mut redis.connection())
        .unwrap();
    assert!(
        ttl > day - 600_000,
        "the group's keys expire after {ttl} ms, before the day asked for"
    );
}

/// A `transactions.id_expiration` longer than Redis counts ("for ever")
/// keeps a finished transaction's id as long as Redis can say: every write
/// of its state took a TTL Redis refused before.
#[test]
fn an_id_expiration_longer_than_redis_counts_keeps_the_id() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(
        &redis.url(),
        &["--set", "transactions.id_expiration=200000000000d"],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-forever");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-forever-id", &topic);
    let records = transactional(&[Record::value(batch::at(0), b"in")], pid, epoch, 0);
    let request = raw::produce_request(&topic, 0, records)
        .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.clone()))));
    assert_eq!(raw::produce_result(&conn.request(9, &request)).0, code::NONE);
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, true), code::NONE);
    let key = format!("ketch:txn:{{{id}}}");
    eventually("the id's state kept for ever", true, || {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query(&mut redis.connection())
            .unwrap();
        ttl > 1 << 52
    });
}

/// ListTransactions reads the states of the ids it lists a few hundred per
/// Redis round trip, not one id per round trip: a workload that takes a
/// new transactional id per checkpoint keeps a great many, and admin
/// clients gave up waiting (30 s) while the gateway read them one by one.
#[test]
fn list_transactions_reads_many_ids_a_few_hundred_per_round_trip() {
    const IDS: usize = 1200;
    let redis = ketch_tests::RedisServer::start();
    let proxy = ketch_tests::proxy::DelayProxy::start(([127, 0, 0, 1], redis.port()).into(), Duration::ZERO);
    let ketch = Ketch::start(&proxy.redis_url(), &[]);
    let mut conn = redis.connection();
    let mut pipe = redis::pipe();
    let far = 4_000_000_000_000i64;
    for n in 0..IDS {
        let id = format!("checkpoint-{n:05}");
        pipe.cmd("ZADD")
            .arg("ketch:transactions")
            .arg(far)
            .arg(&id)
            .ignore();
        pipe.cmd("HSET")
            .arg(format!("ketch:txn:{{{id}}}"))
            .arg("pid")
            .arg(1000 + n)
            .arg("epoch")
            .arg(0)
            .arg("state")
            .arg("Empty")
            .ignore();
    }
    let () = pipe.query(&mut conn).expect("seed the ids");
    let mut client = KafkaConn::connect(ketch.kafka_addr());
    proxy.count_requests(b"HGETALL");
    let response: ListTransactionsResponse = client.request(0, &ListTransactionsRequest::default());
    assert_eq!(response.error_code, code::NONE);
    assert_eq!(response.transaction_states.len(), IDS, "every id listed");
    assert!(
        response
            .transaction_states
            .iter()
            .all(|t| t.transaction_state.as_str() == "Empty" && t.producer_id.0 >= 1000),
        "listed with their states"
    );
    let requests = proxy.counted();
    assert!(
        (1..=IDS / 100).contains(&requests),
        "{requests} requests read the states of {IDS} ids"
    );
}

/// A read_committed fetch waiting at an undecided transaction's first
/// offset is woken by each of that transaction's appends. It then reads
/// the partition's offsets alone, not the log from the fetch offset (up to
/// its partition_max_bytes, none of which it may send), until the commit
/// moves the last stable offset on, as Kafka's delayed fetch compares
/// offsets and reads nothing meanwhile. Before, each append cost a read of
/// everything the transaction had written so far.
#[test]
fn a_read_committed_fetch_held_by_an_open_transaction_reads_only_offsets_when_woken() {
    const APPENDS: i32 = 40;
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("txn-held-fetch");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (id, pid, epoch) = open_transaction(&mut conn, "txn-held-fetch-id", &topic);
    let value = vec![b'x'; 4096];
    let first = transactional(&[Record::value(batch::at(1_000), &value)], pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, first), (code::NONE, 0));
    let before = redis.command_calls("xrange");
    let fetcher = {
        let (addr, topic) = (ketch.kafka_addr(), topic.clone());
        std::thread::spawn(move || {
            let mut conn = KafkaConn::connect(addr);
            let fetch = raw::fetch_request(&topic, 0, 0, 20_000).with_isolation_level(1);
            let response: kafka_protocol::messages::FetchResponse = conn.request(11, &fetch);
            response
        })
    };
    // The fetch read the partition and waits.
    eventually("the fetch's first read", true, || {
        redis.command_calls("xrange") > before
    });
    for sequence in 1..=APPENDS {
        let batch = transactional(&[Record::value(batch::at(1_000), &value)], pid, epoch, sequence);
        assert_eq!(
            produce_in(&mut conn, Some(&id), &topic, batch),
            (code::NONE, i64::from(sequence))
        );
    }
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, true), code::NONE);
    let response = fetcher.join().expect("the fetch");
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, code::NONE);
    assert!(
        partition.records.as_ref().is_some_and(|r| !r.is_empty()),
        "the committed records are sent"
    );
    let reads = redis.command_calls("xrange") - before;
    assert!(
        reads <= 8,
        "{reads} reads of the log for a fetch woken by {APPENDS} appends of an open transaction"
    );
}

/// A read_committed fetch waiting on partitions with no transaction open
/// is woken by each append through its gateway and reads them as before:
/// none is taken for one held by an undecided transaction, whose offsets
/// alone are read at a wake (one more Redis command per partition woken
/// and fetch waiting).
#[test]
fn a_caught_up_read_committed_fetch_woken_by_plain_appends_reads_no_offsets() {
    const PARTITIONS: i32 = 16;
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("plain-tail");
    assert_eq!(raw::create_topic(&mut conn, &topic, PARTITIONS), code::NONE);
    let plain = |n: i64| batch::encode(&[Record::value(batch::at(n), b"plain")]);
    // What appends alone read of the offsets (HMGET), with no fetch waiting.
    let appends_alone = redis.command_calls("hmget");
    for partition in 0..PARTITIONS {
        assert_eq!(
            raw::produce(&mut conn, &topic, partition, plain(0)),
            (code::NONE, 0)
        );
    }
    let appends_alone = redis.command_calls("hmget") - appends_alone;
    // Waits for far more than the appends bring.
    let fetcher = {
        let (addr, topic) = (ketch.kafka_addr(), topic.clone());
        std::thread::spawn(move || {
            let mut conn = KafkaConn::connect(addr);
            let at_end: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, 1)).collect();
            let fetch = raw::fetch_partitions_request(&topic, &at_end, 1 << 20)
                .with_isolation_level(1)
                .with_min_bytes(1 << 20)
                .with_max_wait_ms(3_000);
            let response: kafka_protocol::messages::FetchResponse = conn.request(11, &fetch);
            response
        })
    };
    // It waits: subscribed to every partition's wake-ups.
    let channels: Vec<String> = (0..PARTITIONS as usize)
        .map(|p| redis.partition_key(&topic, p, "wake"))
        .collect();
    eventually("the fetch's subscriptions", true, || {
        let held = redis.shard_channels("*wake*");
        channels.iter().all(|c| held.get(c).is_some_and(|n| *n > 0))
    });
    // A read of the log is an XRANGE and an HMGET of the offsets; a read
    // of the offsets alone an HMGET.
    let (offsets_reads, log_reads) = (redis.command_calls("hmget"), redis.command_calls("xrange"));
    for partition in 0..PARTITIONS {
        assert_eq!(
            raw::produce(&mut conn, &topic, partition, plain(1)),
            (code::NONE, 1)
        );
    }
    let response = fetcher.join().expect("the fetch");
    assert_eq!(response.responses[0].partitions[0].error_code, code::NONE);
    let log_reads = redis.command_calls("xrange") - log_reads;
    let alone = (redis.command_calls("hmget") - offsets_reads).saturating_sub(log_reads + appends_alone);
    assert!(
        alone <= 2,
        "{alone} reads of the offsets alone (and {log_reads} of the log) for {PARTITIONS} partitions woken"
    );
}

/// A read_committed fetch that gathered an aborted transaction's batches
/// (waiting for more than it found) and then took its gateway's own next
/// append from the tail it keeps still names that aborted transaction: the
/// tail knows no aborts, and the merged read took its offsets for the
/// whole answer, so the client was handed the aborted records as
/// committed.
#[test]
fn a_fetch_topped_up_from_the_tail_still_names_the_aborted_transactions_it_gathered() {
    let redis = TestRedis::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("tail-after-abort");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let (id, pid, epoch) = open_transaction(&mut conn, "tail-after-abort-id", &topic);
    let aborted = transactional(&[Record::value(batch::at(0), b"aborted")], pid, epoch, 0);
    assert_eq!(produce_in(&mut conn, Some(&id), &topic, aborted), (code::NONE, 0));
    assert_eq!(end_txn(&mut conn, &id, pid, epoch, false), code::NONE);
    eventually("the abort's marker", (2, 2), || watermarks(&mut conn, &topic));
    // Waits for far more than there is, a few seconds at most.
    let before = redis.command_calls("xrange");
    let mut reading = KafkaConn::connect(ketch.kafka_addr());
    let fetch = raw::fetch_request(&topic, 0, 0, 3_000)
        .with_isolation_level(1)
        .with_min_bytes(1 << 20);
    reading.send(11, &fetch);
    // Its first read, from Redis, has the aborted batch and the marker.
    eventually("the fetch's first read", true, || {
        redis.command_calls("xrange") > before
    });
    // An append through the same gateway wakes it: read from the tail.
    let plain = batch::encode(&[Record::value(batch::at(1), b"committed")]);
    assert_eq!(raw::produce(&mut conn, &topic, 0, plain), (code::NONE, 2));
    let response: kafka_protocol::messages::FetchResponse =
        reading.receive::<kafka_protocol::messages::FetchRequest>(11);
    let partition = &response.responses[0].partitions[0];
    assert_eq!(partition.error_code, code::NONE);
    let sent = partition.records.clone().unwrap_or_default();
    assert_eq!(
        raw::count_records(&sent),
        3,
        "the aborted record, its marker and the plain one"
    );
    let named = partition.aborted_transactions.clone().unwrap_or_default();
    assert_eq!(
        named
            .iter()
            .map(|a| (a.producer_id.0, a.first_offset))
            .collect::<Vec<_>>(),
        vec![(pid, 0)],
        "the aborted transaction is named"
    );
}
