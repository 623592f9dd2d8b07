//! A connection's requests take effect in the order they were sent (issue
//! #10): Kafka processes one connection's requests one after another, and
//! clients rely on it. Each test sends two requests back to back on one
//! connection, without waiting for the first answer, and checks that the
//! second saw the first's effect; repeated, since on a gateway that ran them
//! concurrently the second would usually win the race.

use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{
    CreateTopicsRequest, DeleteRecordsRequest, GroupId, ListOffsetsRequest, OffsetCommitRequest,
    OffsetFetchRequest, ProduceRequest,
};
use kafka_protocol::protocol::StrBytes;
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, unique_topic};

const ROUNDS: i64 = 25;
const EARLIEST: i64 = -2;

#[test]
fn list_offsets_after_delete_records_sees_the_new_log_start() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("order-delete");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    for round in 0..ROUNDS {
        let records: Vec<Record> = (0..3).map(|i| Record::value(batch::at(i), b"r")).collect();
        assert_eq!(
            raw::produce(&mut conn, &topic, 0, batch::encode(&records)).0,
            code::NONE
        );
        let delete_to = round * 3 + 2;
        conn.send(2, &raw::delete_records_request(&topic, 0, delete_to));
        conn.send(7, &raw::list_offsets_request(&topic, 0, EARLIEST));
        let deleted = conn.receive_next::<DeleteRecordsRequest>(2).1;
        assert_eq!(deleted.topics[0].partitions[0].low_watermark, delete_to);
        let listed = raw::list_offsets_result(&conn.receive_next::<ListOffsetsRequest>(7).1);
        assert_eq!(
            listed,
            (code::NONE, delete_to, -1),
            "round {round}: ListOffsets ran before the DeleteRecords sent ahead of it took effect"
        );
    }
}

#[test]
fn produce_after_create_topics_finds_the_topic() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &["--set", "topics.auto_create=false"]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    for round in 0..ROUNDS {
        let topic = unique_topic("order-create");
        conn.send(5, &raw::create_topic_request(&topic, 1));
        let records = batch::encode(&[Record::value(batch::at(round), b"first")]);
        conn.send(raw::PRODUCE_VERSION, &raw::produce_request(&topic, 0, records));
        let created = conn.receive_next::<CreateTopicsRequest>(5).1;
        assert_eq!(created.topics[0].error_code, code::NONE);
        let produced = conn.receive_next::<ProduceRequest>(raw::PRODUCE_VERSION).1;
        assert_eq!(
            raw::produce_result(&produced),
            (code::NONE, 0),
            "round {round}: Produce ran before the CreateTopics sent ahead of it"
        );
    }
}

#[test]
fn offset_fetch_after_offset_commit_sees_the_commit() {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let topic = unique_topic("order-commit");
    assert_eq!(raw::create_topic(&mut conn, &topic, 1), code::NONE);
    let group = GroupId(StrBytes::from_string(unique_topic("group")));
    for round in 0..ROUNDS {
        let commit = raw::offset_commit_request(&group.0, "", -1, &topic, 0, round * 10);
        let fetch = OffsetFetchRequest::default()
            .with_group_id(group.clone())
            .with_topics(Some(vec![
                OffsetFetchRequestTopic::default()
                    .with_name(raw::topic_name(&topic))
                    .with_partition_indexes(vec![0]),
            ]));
        conn.send(8, &commit);
        conn.send(7, &fetch);
        let committed = conn.receive_next::<OffsetCommitRequest>(8).1;
        assert_eq!(committed.topics[0].partitions[0].error_code, code::NONE);
        let fetched = conn.receive_next::<OffsetFetchRequest>(7).1;
        assert_eq!(
            fetched.topics[0].partitions[0].committed_offset,
            round * 10,
            "round {round}: OffsetFetch ran before the OffsetCommit sent ahead of it"
        );
    }
}
