//! acks=all with `storage.acks_all_replicas` (issues #6 and #10): the
//! acknowledgement waits for a real Redis replica; without it the producer
//! gets NOT_ENOUGH_REPLICAS_AFTER_APPEND, and an idempotent retry succeeds,
//! stored once, when the replica is back. A frozen replica (SIGSTOP: still
//! connected, acknowledging nothing) is the hard case: every acks=all
//! batch, small or large, new or a retried duplicate, must wait for it and
//! fail retriably, and concurrent waits must not queue behind each other.

use std::time::{Duration, Instant};

use kafka_protocol::messages::{InitProducerIdRequest, ProducerId};
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::replica::{self, ScriptedReplica};
use ketch_tests::{Frozen, Ketch, RedisServer, unique_topic};

const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;

fn produce_acks_all(conn: &mut KafkaConn, topic: &str, batch: Vec<u8>) -> (i16, i64) {
    let request = raw::produce_request(topic, 0, batch).with_acks(-1);
    raw::produce_result(&conn.request(raw::PRODUCE_VERSION, &request))
}

/// A new idempotent producer id (InitProducerId without a transactional id).
fn new_producer_id(conn: &mut KafkaConn) -> i64 {
    let init = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    conn.request(4, &init).producer_id.0
}

#[test]
fn acks_all_waits_for_the_replica_and_fails_retriably_without_it() {
    let (primary, mut replica, ketch) =
        Ketch::start_with_replica(&["--set", "storage.acks_all_timeout=300ms"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("acks-all");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let producer_id = new_producer_id(&mut conn);
    let batch = |n: i32| {
        batch::encode_idempotent(
            &[Record::value(batch::at(1), format!("r{n}").as_bytes())],
            producer_id,
            0,
            n,
        )
    };

    assert_eq!(produce_acks_all(&mut conn, &topic, batch(0)), (code::NONE, 0));
    // What was acknowledged is on the replica.
    let on_replica: i64 = redis::cmd("XLEN")
        .arg(format!("ketch:{{{}}}:log", primary.topic_tags(&topic)[0]))
        .query(&mut replica.connection())
        .unwrap();
    assert_eq!(on_replica, 1);

    replica.stop();
    primary.wait_for_replication("connected_slaves:0");
    let (error, _) = produce_acks_all(&mut conn, &topic, batch(1));
    assert_eq!(error, NOT_ENOUGH_REPLICAS_AFTER_APPEND);
    // acks=1 does not wait.
    let plain = raw::produce(
        &mut conn,
        &topic,
        0,
        batch::encode(&[Record::value(batch::at(2), b"plain")]),
    );
    assert_eq!(plain.0, code::NONE);

    replica.start_again();
    replica.wait_for_replication("master_link_status:up");
    // The client's retry of the refused batch: stored once, at its first offset.
    assert_eq!(produce_acks_all(&mut conn, &topic, batch(1)), (code::NONE, 1));
    assert_eq!(primary.next_offset(&topic, 0), 3);
}

#[test]
fn acks_all_with_a_frozen_replica_fails_retriably_for_small_large_and_duplicate_batches() {
    // The acks=all timeout equals the command timeout: a WAIT that runs to
    // its limit must still answer NOT_ENOUGH_REPLICAS_AFTER_APPEND, not a
    // storage error from the connection's timeout.
    let (primary, replica, ketch) = Ketch::start_with_replica(&[
        "--set",
        "storage.acks_all_timeout=1s",
        "--set",
        "redis.command_timeout=1s",
    ]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("frozen");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let producer_id = new_producer_id(&mut conn);
    let small =
        |n: i32| batch::encode_idempotent(&[Record::value(batch::at(1), &[b'x'; 100])], producer_id, 0, n);
    assert_eq!(produce_acks_all(&mut conn, &topic, small(0)), (code::NONE, 0));

    let frozen = Frozen::freeze(replica.pid());
    // A 100-byte batch goes through the append script inline.
    let started = Instant::now();
    let (error, _) = produce_acks_all(&mut conn, &topic, small(1));
    assert_eq!(error, NOT_ENOUGH_REPLICAS_AFTER_APPEND);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "answered after {:?}, before the acks_all timeout",
        started.elapsed()
    );
    // The client's retry is a duplicate: it stores nothing, but must not be
    // acknowledged while the original is not replicated either.
    let (error, _) = produce_acks_all(&mut conn, &topic, small(1));
    assert_eq!(error, NOT_ENOUGH_REPLICAS_AFTER_APPEND);
    // A large batch (staged around a plain XADD).
    let large = batch::encode(&[Record::value(batch::at(2), &[b'y'; 64 * 1024])]);
    let (error, _) = produce_acks_all(&mut conn, &topic, large);
    assert_eq!(error, NOT_ENOUGH_REPLICAS_AFTER_APPEND);
    drop(frozen);

    replica.wait_for_replication("master_link_status:up");
    // Once the replica answers again the retry is acknowledged, stored once.
    assert_eq!(produce_acks_all(&mut conn, &topic, small(1)), (code::NONE, 1));
    assert_eq!(primary.next_offset(&topic, 0), 3);
}

/// With acks=all waiting for a replica, an offset commit waits for it too
/// (Kafka appends commits to its offsets topic with acks=all): a frozen
/// replica makes the commit COORDINATOR_NOT_AVAILABLE, which consumers
/// retry, rather than acknowledged and then lost to a failover. So does a
/// producer id (a second producer must never get it): in a Redis Cluster
/// its counter's master is not the partitions', so no append's WAIT covers
/// it; an idempotent producer's is COORDINATOR_LOAD_IN_PROGRESS, as Kafka's
/// producer id manager answers (retried without a coordinator lookup).
#[test]
fn offset_commits_and_producer_ids_wait_for_the_replica_too() {
    const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    let (_primary, replica, ketch) = Ketch::start_with_replica(&["--set", "storage.acks_all_timeout=300ms"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("durable-commits");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let commit = |conn: &mut KafkaConn, offset: i64| {
        let request = raw::offset_commit_request("durable", "", -1, &topic, 0, offset);
        let response = conn.request(8, &request);
        response.topics[0].partitions[0].error_code
    };
    assert_eq!(commit(&mut conn, 5), code::NONE);
    // Acknowledged: on the replica.
    let key = "ketch:group:{durable}:offsets";
    let on_replica: bool = redis::cmd("HEXISTS")
        .arg(key)
        .arg(format!("{topic}:0"))
        .query(&mut replica.connection())
        .unwrap();
    assert!(on_replica, "the acknowledged commit is on the replica");

    let frozen = Frozen::freeze(replica.pid());
    let started = Instant::now();
    assert_eq!(commit(&mut conn, 6), COORDINATOR_NOT_AVAILABLE);
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "answered after {:?}, before the acks_all timeout",
        started.elapsed()
    );
    let init = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    assert_eq!(conn.request(4, &init).error_code, COORDINATOR_LOAD_IN_PROGRESS);
    drop(frozen);
    replica.wait_for_replication("master_link_status:up");
    assert_eq!(commit(&mut conn, 7), code::NONE);
    assert_eq!(conn.request(4, &init).error_code, code::NONE);
}

/// A commit to a group without members also sets when its offsets expire
/// (Kafka keeps a standalone group's offsets the retention from its latest
/// commit). With acks=all that write is waited for as the offsets are: a
/// failover that lost it would bring back an older, shorter expiry, and the
/// offsets would go before their time. A replica the test plays lets the
/// offsets through and holds back the expiry alone: the commit fails
/// retriably, and stands once the replica has it. The empty group id takes
/// the other path, whose keys lie in different slots of a cluster. One
/// acks=all connection is enough: none is held while another is awaited.
#[test]
fn a_standalone_commits_expiry_waits_for_the_replica_as_its_offsets_do() {
    const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    let primary = RedisServer::start();
    let replica = ScriptedReplica::start(primary.port(), None);
    let ketch = Ketch::start(
        &primary.url(),
        &[
            "--set",
            "storage.acks_all_replicas=1",
            "--set",
            "storage.acks_all_timeout=300ms",
            "--set",
            "storage.acks_all_connections=1",
        ],
    );
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("standalone-expiry");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    for group in ["standalone", ""] {
        let commit = |conn: &mut KafkaConn, offset: i64| {
            let request = raw::offset_commit_request(group, "", -1, &topic, 0, offset);
            conn.request(8, &request).topics[0].partitions[0].error_code
        };
        // The replica acknowledges everything: the commit stands.
        assert_eq!(commit(&mut conn, 5), code::NONE, "group {group:?}");
        let key = format!("ketch:group:{{{group}}}:offsets");
        replica.hold_at(replica::writes("PEXPIRE", &key));
        let started = Instant::now();
        assert_eq!(
            commit(&mut conn, 6),
            COORDINATOR_NOT_AVAILABLE,
            "group {group:?}: answered although the replica holds back the offsets' expiry"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "answered after {:?}, before the acks_all timeout",
            started.elapsed()
        );
        assert!(replica.held() > 0, "the expiry was written");
        replica.release();
        assert_eq!(commit(&mut conn, 7), code::NONE, "group {group:?}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query(&mut primary.connection())
            .unwrap();
        assert!(ttl > 0, "group {group:?}: the offsets expire ({ttl})");
    }
}

/// The expiry a commit to a group without members set is confirmed no
/// earlier than it was written: a failover that lost the write brings back
/// the expiry the commit before it set, which may be hours away, and
/// confirming that one would let the offsets go before their time. Here
/// that older expiry is put back by hand between the write and its
/// confirmation, as the promoted replica would hold it; for the empty
/// group id too, whose keys lie in different slots of a cluster.
#[test]
fn an_expiry_a_failover_took_back_is_written_again_before_it_is_confirmed() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    replica.wait_for_replication("master_link_status:up");
    let mut config = ketch_tests::store_config(&primary.url());
    config.durability.replicas = 1;
    config.durability.timeout = Duration::from_secs(5);
    let rt = ketch_tests::runtime();
    let _entered = rt.enter();
    let store = ketch_storage::Store::new(&config).expect("store");
    for group in ["standalone-failover", ""] {
        let key = format!("ketch:group:{{{group}}}:offsets");
        let _: i64 = redis::cmd("HSET")
            .arg(&key)
            .arg("topic:0")
            .arg("{}")
            .query(&mut primary.connection())
            .expect("HSET");
        let at = rt
            .block_on(store.group_emptied(group, Duration::from_secs(3600)))
            .expect("retained")
            .expect("the offsets expire");
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(60_000)
            .query(&mut primary.connection())
            .expect("PEXPIRE");
        rt.block_on(store.confirm_group_retention(group, Some(at)))
            .expect("confirmed");
        for (server, which) in [(&primary, "primary"), (&replica, "replica")] {
            let now: i64 = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query(&mut server.connection())
                .expect("PEXPIRETIME");
            assert_eq!(now, at, "group {group:?}: the {which}'s expiry");
        }
    }
}

/// DeleteRecords is answered once the replica has the new log start, as
/// Kafka answers once every replica's moved: without it a failover brought
/// the deleted records back after the deletion was acknowledged. When the
/// replica does not confirm in time the answer is REQUEST_TIMED_OUT, as
/// Kafka's delayed deletion expires (the deletion stands).
#[test]
fn delete_records_waits_for_the_replica_too() {
    const REQUEST_TIMED_OUT: i16 = 7;
    let (primary, replica, ketch) = Ketch::start_with_replica(&["--set", "storage.acks_all_timeout=300ms"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("durable-deletion");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    for i in 0..10 {
        let batch = batch::encode(&[Record::value(batch::at(i), b"v")]);
        assert_eq!(raw::produce(&mut conn, &topic, 0, batch).0, code::NONE);
    }
    assert_eq!(raw::delete_records(&mut conn, &topic, 0, 3), (code::NONE, 3));
    // Acknowledged: on the replica.
    let meta = format!("ketch:{{{}}}:meta", primary.topic_tags(&topic)[0]);
    let on_replica: i64 = redis::cmd("HGET")
        .arg(&meta)
        .arg("log_start")
        .query(&mut replica.connection())
        .unwrap();
    assert_eq!(on_replica, 3, "the acknowledged log start is on the replica");

    let frozen = Frozen::freeze(replica.pid());
    let started = Instant::now();
    assert_eq!(
        raw::delete_records(&mut conn, &topic, 0, 5),
        (REQUEST_TIMED_OUT, -1)
    );
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "answered after {:?}, before the acks_all timeout",
        started.elapsed()
    );
    assert_eq!(
        raw::list_offsets(&mut conn, &topic, 0, -2).1,
        5,
        "the deletion stands"
    );
    drop(frozen);
    replica.wait_for_replication("master_link_status:up");
    assert_eq!(raw::delete_records(&mut conn, &topic, 0, 6), (code::NONE, 6));
}

#[test]
fn concurrent_acks_all_waits_on_a_frozen_replica_do_not_queue_behind_each_other() {
    const CLIENTS: usize = 4;
    let (_primary, replica, ketch) = Ketch::start_with_replica(&["--set", "storage.acks_all_timeout=2s"]);
    let topic = unique_topic("frozen-many");
    {
        let mut conn = KafkaConn::connect(ketch.kafka_addr());
        assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    }
    let mut conns: Vec<KafkaConn> = (0..CLIENTS)
        .map(|_| KafkaConn::connect(ketch.kafka_addr()))
        .collect();
    let _frozen = Frozen::freeze(replica.pid());
    let started = Instant::now();
    for (i, conn) in conns.iter_mut().enumerate() {
        // Larger than the inline limit: the append and its WAIT both run on a
        // connection reserved for acks=all.
        let value = vec![b'v'; 8 * 1024];
        let request = raw::produce_request(
            &topic,
            0,
            batch::encode(&[Record::value(batch::at(i as i64), &value)]),
        )
        .with_acks(-1);
        conn.send(raw::PRODUCE_VERSION, &request);
    }
    for conn in &mut conns {
        let response = conn.receive::<kafka_protocol::messages::ProduceRequest>(raw::PRODUCE_VERSION);
        assert_eq!(raw::produce_result(&response).0, NOT_ENOUGH_REPLICAS_AFTER_APPEND);
    }
    // Each waits its 2 s; queued behind each other they would take 8 s.
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(2 * CLIENTS as u64 - 2),
        "{CLIENTS} concurrent acks=all waits took {elapsed:?}"
    );
}

/// With acks=all waiting for a replica, a topic's creation, growth,
/// config change and deletion wait for it too, as offset commits do: a
/// failover that lost the topic record would leave acks=all records under
/// keys no topic names (or bring a deleted topic back without its
/// partitions). They are not failed when the replica does not confirm
/// them (the change stands, logged), as Kafka's controller quorum is
/// apart from its data replicas.
#[test]
fn topic_changes_wait_for_the_replica_and_stand_without_it() {
    let (_primary, replica, ketch) = Ketch::start_with_replica(&["--set", "storage.acks_all_timeout=1s"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("durable-topic");
    assert_eq!(raw::create_topic(&mut conn, &topic, 2), code::NONE);
    let on_replica = |key: &str, field: &str| -> bool {
        redis::cmd("HEXISTS")
            .arg(key)
            .arg(field)
            .query(&mut replica.connection())
            .unwrap()
    };
    assert!(
        on_replica("ketch:topics", &topic),
        "the created topic is on the replica"
    );

    let frozen = Frozen::freeze(replica.pid());
    let waited = |what: &str, started: Instant| {
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "{what} answered after {:?}, before the acks_all timeout",
            started.elapsed()
        );
    };
    let started = Instant::now();
    assert_eq!(raw::create_partitions(&mut conn, &topic, 3), code::NONE);
    waited("CreatePartitions", started);
    let started = Instant::now();
    assert_eq!(
        raw::set_topic_config(&mut conn, &topic, "retention.ms", "60000"),
        code::NONE
    );
    waited("AlterConfigs", started);
    let other = unique_topic("durable-topic-unconfirmed");
    let started = Instant::now();
    assert_eq!(raw::create_topic(&mut conn, &other, 1), code::NONE);
    waited("CreateTopics", started);
    let started = Instant::now();
    assert_eq!(raw::delete_topic(&mut conn, &topic), code::NONE);
    waited("DeleteTopics", started);
    drop(frozen);

    // Each change stood, confirmed or not.
    replica.wait_for_replication("master_link_status:up");
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(
        raw::create_topic(&mut conn, &other, 1),
        code::TOPIC_ALREADY_EXISTS
    );
    assert_eq!(
        raw::create_topic(&mut conn, &topic, 1),
        code::NONE,
        "the deleted name is free"
    );
}

/// A transactional id's InitProducerId that fences an open transaction
/// (its producer died) while a frozen replica confirms nothing fails
/// retriably — and the abort it decided is finished once the replica is
/// back, so the retry succeeds at once instead of getting
/// CONCURRENT_TRANSACTIONS until the old transaction's deadline.
#[test]
fn a_fence_written_but_not_confirmed_is_finished_promptly() {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
    use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, TransactionalId};
    use kafka_protocol::protocol::StrBytes;
    let (_primary, replica, ketch) = Ketch::start_with_replica(&["--set", "storage.acks_all_timeout=500ms"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("fence-unconfirmed");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let id = unique_topic("fence-id");
    let init = |conn: &mut KafkaConn| {
        let request = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.clone()))))
            .with_transaction_timeout_ms(300_000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        conn.request(4, &request)
    };
    // A transaction opens, and its producer goes silent for good.
    let started = init(&mut conn);
    assert_eq!(started.error_code, code::NONE);
    let added: AddPartitionsToTxnResponse = conn.request(
        3,
        &AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_string(id.clone())))
            .with_v3_and_below_producer_id(started.producer_id)
            .with_v3_and_below_producer_epoch(started.producer_epoch)
            .with_v3_and_below_topics(vec![
                AddPartitionsToTxnTopic::default()
                    .with_name(raw::topic_name(&topic))
                    .with_partitions(vec![0]),
            ]),
    );
    assert_eq!(
        added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code,
        0
    );
    // A new instance fences it while the replica confirms nothing.
    {
        let _frozen = Frozen::freeze(replica.pid());
        let fenced = init(&mut conn);
        assert_ne!(fenced.error_code, code::NONE, "unconfirmed");
    }
    // Replica back: the abort is finished within seconds, not at the old
    // transaction's deadline five minutes on.
    let asked = Instant::now();
    loop {
        let retry = init(&mut conn);
        if retry.error_code == code::NONE {
            assert!(retry.producer_epoch > started.producer_epoch);
            break;
        }
        assert_eq!(
            retry.error_code, 51,
            "CONCURRENT_TRANSACTIONS while it is finished"
        );
        assert!(asked.elapsed() < Duration::from_secs(20), "still not finished");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An acks=all produce that times out during its WAIT (the replica frozen)
/// does not hand its connection to the next acks=all append while Redis
/// still blocks it in the WAIT: that append would send its script there
/// and wait, holding the partition's append slot, and every other append to
/// the partition through this gateway, acks=1 too, would wait behind the
/// frozen replica for the rest of the first WAIT.
#[test]
fn a_timed_out_wait_does_not_hold_up_the_partitions_next_appends() {
    const REQUEST_TIMED_OUT: i16 = 7;
    let (_primary, replica, ketch) = Ketch::start_with_replica(&[
        "--set",
        "storage.acks_all_timeout=3s",
        "--set",
        "storage.acks_all_connections=1",
    ]);
    let topic = unique_topic("frozen-cancelled");
    let mut conns: Vec<KafkaConn> = (0..3).map(|_| KafkaConn::connect(ketch.kafka_addr())).collect();
    assert_eq!(raw::create_topic(&mut conns[0], &topic, 1), code::NONE);
    let _frozen = Frozen::freeze(replica.pid());
    let small = |n: i64| batch::encode(&[Record::value(batch::at(n), b"v")]);
    let first = raw::produce_request(&topic, 0, small(0))
        .with_acks(-1)
        .with_timeout_ms(300);
    let answered = raw::produce_result(&conns[0].request(raw::PRODUCE_VERSION, &first));
    assert_eq!(answered.0, REQUEST_TIMED_OUT);
    // A second acks=all append, then (once it is under way) an acks=1 one.
    let second = raw::produce_request(&topic, 0, small(1))
        .with_acks(-1)
        .with_timeout_ms(30_000);
    conns[1].send(raw::PRODUCE_VERSION, &second);
    // Not a synchronisation: the acks=1 append must come after the second
    // has started for the old fault to show; the assertion holds either way.
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let third = raw::produce_request(&topic, 0, small(2)).with_acks(1);
    let (error, _) = raw::produce_result(&conns[2].request(raw::PRODUCE_VERSION, &third));
    let took = started.elapsed();
    assert_eq!(error, code::NONE);
    assert!(
        took < Duration::from_millis(1500),
        "an acks=1 append waited {took:?} behind a cancelled WAIT"
    );
    let response = conns[1].receive::<kafka_protocol::messages::ProduceRequest>(raw::PRODUCE_VERSION);
    assert_eq!(raw::produce_result(&response).0, NOT_ENOUGH_REPLICAS_AFTER_APPEND);
}
