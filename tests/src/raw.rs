//! Raw Kafka protocol over a blocking TCP socket: requests encoded with the
//! `kafka-protocol` crate, sent as size-prefixed frames, and responses decoded
//! with the header version the API and version call for. Tests use it for
//! what rdkafka would never send (corrupt frames, hand-made batches) and for
//! exact error codes.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, FetchRequest, FetchResponse,
    ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

/// Produce version used by the raw tests.
pub const PRODUCE_VERSION: i16 = 9;
/// Fetch version used by the raw tests.
pub const FETCH_VERSION: i16 = 12;

/// Kafka error codes the tests look for.
pub mod code {
    pub const NONE: i16 = 0;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const CORRUPT_MESSAGE: i16 = 2;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const REQUEST_TIMED_OUT: i16 = 7;
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
    pub const INVALID_TIMESTAMP: i16 = 32;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_CONFIG: i16 = 40;
    pub const INVALID_REQUEST: i16 = 42;
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    pub const INVALID_RECORD: i16 = 87;
    /// Codes Kafka clients retry: what a gateway must answer while Redis is
    /// unreachable (DESIGN §9).
    pub const RETRIABLE: &[i16] = &[
        5,  // LEADER_NOT_AVAILABLE
        6,  // NOT_LEADER_OR_FOLLOWER
        7,  // REQUEST_TIMED_OUT
        19, // NOT_ENOUGH_REPLICAS
        20, // NOT_ENOUGH_REPLICAS_AFTER_APPEND
        56, // KAFKA_STORAGE_ERROR
    ];
}

pub fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_owned()))
}

/// One client connection speaking the Kafka protocol.
pub struct KafkaConn {
    stream: TcpStream,
    correlation_id: i32,
    client_id: String,
}

impl KafkaConn {
    pub fn connect(addr: SocketAddr) -> Self {
        Self::connect_as(addr, "ketch-tests")
    }

    /// A connection whose requests name `client_id` (what client quotas
    /// are set for).
    pub fn connect_as(addr: SocketAddr, client_id: &str) -> Self {
        Self::over(TcpStream::connect(addr).expect("connect to ketch"), client_id)
    }

    /// A connection from the local address `from` (any of 127.0.0.0/8 is
    /// this host's on Linux): a client at another address.
    pub fn connect_from(from: std::net::IpAddr, addr: SocketAddr) -> Self {
        Self::over(crate::tcp_connect_from(from, addr), "ketch-tests")
    }

    fn over(stream: TcpStream, client_id: &str) -> Self {
        stream.set_nodelay(true).expect("nodelay");
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .expect("read timeout");
        Self {
            stream,
            correlation_id: 0,
            client_id: client_id.to_owned(),
        }
    }

    /// The correlation id of the last frame built.
    pub fn last_correlation_id(&self) -> i32 {
        self.correlation_id
    }

    pub fn set_read_timeout(&self, timeout: Duration) {
        self.stream.set_read_timeout(Some(timeout)).expect("read timeout");
    }

    /// The whole frame (size prefix included) for `request` at `version`,
    /// with the next correlation id.
    pub fn frame<R: Request>(&mut self, version: i16, request: &R) -> Vec<u8> {
        self.correlation_id += 1;
        encode_frame_as(self.correlation_id, version, request, &self.client_id)
    }

    /// Sends `bytes` exactly as given.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    pub fn shutdown_write(&self) {
        self.stream.shutdown(Shutdown::Write).expect("shutdown write");
    }

    /// Sends `request` and waits for its response.
    pub fn request<R: Request>(&mut self, version: i16, request: &R) -> R::Response {
        self.send(version, request);
        self.receive::<R>(version)
    }

    /// Sends `request` without waiting; pair with [`KafkaConn::receive`].
    pub fn send<R: Request>(&mut self, version: i16, request: &R) {
        let frame = self.frame(version, request);
        self.send_raw(&frame).expect("send request");
    }

    /// Reads the response to the last request sent (of type `R`).
    pub fn receive<R: Request>(&mut self, version: i16) -> R::Response {
        let (correlation_id, response) = self.receive_next::<R>(version);
        assert_eq!(correlation_id, self.correlation_id, "correlation id");
        response
    }

    /// Reads the next response, assumed to be to an `R` request, with its
    /// correlation id (for pipelined requests).
    pub fn receive_next<R: Request>(&mut self, version: i16) -> (i32, R::Response) {
        let mut frame = Bytes::from(self.read_frame().expect("read response frame"));
        let header = ResponseHeader::decode(&mut frame, R::Response::header_version(version))
            .expect("response header");
        let response = R::Response::decode(&mut frame, version).expect("decode response");
        (header.correlation_id, response)
    }

    /// One size-prefixed frame, without its size.
    pub fn read_frame(&mut self) -> io::Result<Vec<u8>> {
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size)?;
        let size = i32::from_be_bytes(size);
        assert!((0..64 << 20).contains(&size), "response frame size {size}");
        let mut frame = vec![0u8; size as usize];
        self.stream.read_exact(&mut frame)?;
        Ok(frame)
    }

    /// Panics unless the server closes the connection within 10 s.
    pub fn assert_closed(&mut self) {
        assert!(
            self.closed_within(Duration::from_secs(10)),
            "connection still open"
        );
    }

    /// True when the server closes the connection (EOF or reset) within
    /// `timeout` without sending anything; panics if it answers instead.
    /// After a request was sent: whether the gateway answered (`true`: some
    /// bytes came back) or closed the connection (`false`) within
    /// `timeout` (`None`: neither).
    pub fn answered_within(&mut self, timeout: Duration) -> Option<bool> {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 1];
        let outcome = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break None;
            }
            self.stream.set_read_timeout(Some(left)).expect("read timeout");
            match self.stream.peek(&mut buf) {
                Ok(0) => break Some(false),
                Ok(_) => break Some(true),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    break None;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Some(false),
            }
        };
        self.stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .expect("read timeout");
        outcome
    }

    pub fn closed_within(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 1024];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.stream.set_read_timeout(Some(left)).expect("read timeout");
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(n) => panic!(
                    "expected the connection to be closed, got {n} bytes: {:?}",
                    &buf[..n]
                ),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return false;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }
}

/// A size-prefixed request frame.
pub fn encode_frame<R: Request>(correlation_id: i32, version: i16, request: &R) -> Vec<u8> {
    encode_frame_as(correlation_id, version, request, "ketch-tests")
}

/// A size-prefixed request frame naming `client_id`.
pub fn encode_frame_as<R: Request>(
    correlation_id: i32,
    version: i16,
    request: &R,
    client_id: &str,
) -> Vec<u8> {
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_owned())));
    let mut body = BytesMut::new();
    header
        .encode(&mut body, R::header_version(version))
        .expect("encode header");
    request.encode(&mut body, version).expect("encode request");
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as i32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// A Produce request (acks 1) carrying `batch` for one partition.
pub fn produce_request(topic: &str, partition: i32, batch: Vec<u8>) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(topic_name(topic))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(Bytes::from(batch))),
                ]),
        ])
}

/// (error code, base offset) of the single partition in a Produce response.
pub fn produce_result(response: &ProduceResponse) -> (i16, i64) {
    let partition = &response.responses[0].partition_responses[0];
    (partition.error_code, partition.base_offset)
}

/// Produces one batch and returns (error code, base offset).
pub fn produce(conn: &mut KafkaConn, topic: &str, partition: i32, batch: Vec<u8>) -> (i16, i64) {
    let response = conn.request(PRODUCE_VERSION, &produce_request(topic, partition, batch));
    produce_result(&response)
}

/// A Fetch v12 request for one partition.
pub fn fetch_request(topic: &str, partition: i32, offset: i64, max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id((-1).into())
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(topic_name(topic))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(partition)
                        .with_fetch_offset(offset)
                        .with_current_leader_epoch(-1)
                        .with_last_fetched_epoch(-1)
                        .with_log_start_offset(-1)
                        .with_partition_max_bytes(1 << 20),
                ]),
        ])
}

/// A Fetch v12 request for partitions `(partition, offset)` of one topic,
/// in that order, within `max_bytes` (each partition too).
pub fn fetch_partitions_request(topic: &str, partitions: &[(i32, i64)], max_bytes: i32) -> FetchRequest {
    let mut request = fetch_request(topic, partitions[0].0, partitions[0].1, 0).with_max_bytes(max_bytes);
    let template = request.topics[0].partitions[0].clone();
    request.topics[0].partitions = partitions
        .iter()
        .map(|&(partition, offset)| {
            template
                .clone()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(max_bytes)
        })
        .collect();
    request
}

/// (error code, high watermark, records) of the single partition in a Fetch
/// response.
pub fn fetch_result(response: &FetchResponse) -> (i16, i64, Option<Bytes>) {
    assert_eq!(response.error_code, code::NONE, "fetch top-level error");
    let partition = &response.responses[0].partitions[0];
    (
        partition.error_code,
        partition.high_watermark,
        partition.records.clone(),
    )
}

/// Creates a topic through a raw CreateTopics v5 request and returns the
/// topic's error code.
pub fn create_topic(conn: &mut KafkaConn, topic: &str, partitions: i32) -> i16 {
    let response: CreateTopicsResponse = conn.request(5, &create_topic_request(topic, partitions));
    response.topics[0].error_code
}

/// A CreateTopics request for one topic (replication factor 1).
pub fn create_topic_request(topic: &str, partitions: i32) -> CreateTopicsRequest {
    CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![
            CreatableTopic::default()
                .with_name(topic_name(topic))
                .with_num_partitions(partitions)
                .with_replication_factor(1),
        ])
}

/// Grows a topic to `count` partitions through a raw CreatePartitions v3
/// request and returns the topic's error code.
pub fn create_partitions(conn: &mut KafkaConn, topic: &str, count: i32) -> i16 {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    let request = kafka_protocol::messages::CreatePartitionsRequest::default()
        .with_topics(vec![
            CreatePartitionsTopic::default()
                .with_name(topic_name(topic))
                .with_count(count)
                .with_assignments(None),
        ])
        .with_timeout_ms(10_000);
    let response: kafka_protocol::messages::CreatePartitionsResponse = conn.request(3, &request);
    response.results[0].error_code
}

/// The topic id Metadata v12 gives for `topic` through `conn`, if any.
pub fn topic_id(conn: &mut KafkaConn, topic: &str) -> Option<uuid::Uuid> {
    let request = kafka_protocol::messages::MetadataRequest::default()
        .with_topics(Some(vec![
            kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                .with_name(Some(topic_name(topic))),
        ]))
        .with_allow_auto_topic_creation(false);
    let response: kafka_protocol::messages::MetadataResponse = conn.request(12, &request);
    let found = &response.topics[0];
    (found.error_code == code::NONE).then_some(found.topic_id)
}

/// A DeleteTopics v6 request naming each topic by name or by id.
pub fn delete_topics_request(topics: &[(Option<&str>, Option<uuid::Uuid>)]) -> DeleteTopicsRequest {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    DeleteTopicsRequest::default()
        .with_topics(
            topics
                .iter()
                .map(|(name, id)| {
                    DeleteTopicState::default()
                        .with_name(name.map(topic_name))
                        .with_topic_id(id.unwrap_or_default())
                })
                .collect(),
        )
        .with_timeout_ms(10_000)
}

/// Deletes a topic by name through a raw DeleteTopics v4 request and
/// returns the topic's error code.
pub fn delete_topic(conn: &mut KafkaConn, topic: &str) -> i16 {
    let request = DeleteTopicsRequest::default()
        .with_topic_names(vec![topic_name(topic)])
        .with_timeout_ms(10_000);
    let response: kafka_protocol::messages::DeleteTopicsResponse = conn.request(4, &request);
    response.responses[0].error_code
}

/// Record count of an uncompressed or compressed v2 batch sequence (sums the
/// recordsCount fields).
pub fn count_records(mut records: &[u8]) -> i64 {
    let mut total = 0;
    while records.len() >= 61 {
        let length = i32::from_be_bytes(records[8..12].try_into().expect("4 bytes")) as usize;
        if records.len() < 12 + length {
            break; // a partial batch at the end of a fetch response
        }
        total += i64::from(i32::from_be_bytes(records[57..61].try_into().expect("4 bytes")));
        records = &records[12 + length..];
    }
    total
}

/// The whole batches of a fetch's records, each its own `Bytes` (a partial
/// batch at the end is left out).
pub fn split_batches(mut records: Bytes) -> Vec<Bytes> {
    let mut batches = Vec::new();
    while records.len() >= 61 {
        let length = i32::from_be_bytes(records[8..12].try_into().expect("4 bytes")) as usize + 12;
        if records.len() < length {
            break;
        }
        batches.push(records.split_to(length));
    }
    batches
}

/// ListOffsets (v8) for one partition: (error code, offset, timestamp).
pub fn list_offsets(conn: &mut KafkaConn, topic: &str, partition: i32, timestamp: i64) -> (i16, i64, i64) {
    list_offsets_result(&conn.request(8, &list_offsets_request(topic, partition, timestamp)))
}

/// (error code, offset, timestamp) of a one-partition ListOffsets response.
pub fn list_offsets_result(response: &kafka_protocol::messages::ListOffsetsResponse) -> (i16, i64, i64) {
    let p = &response.topics[0].partitions[0];
    (p.error_code, p.offset, p.timestamp)
}

/// A ListOffsets request for one partition.
pub fn list_offsets_request(
    topic: &str,
    partition: i32,
    timestamp: i64,
) -> kafka_protocol::messages::ListOffsetsRequest {
    use kafka_protocol::messages::ListOffsetsRequest;
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    ListOffsetsRequest::default()
        .with_replica_id((-1).into())
        .with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(partition)
                        .with_current_leader_epoch(-1)
                        .with_timestamp(timestamp),
                ]),
        ])
}

/// Sets one topic config with IncrementalAlterConfigs (SET), as an
/// operator's tool would; the resource's error code.
pub fn set_topic_config(conn: &mut KafkaConn, topic: &str, name: &str, value: &str) -> i16 {
    use kafka_protocol::messages::IncrementalAlterConfigsResponse;
    let request = set_topic_config_request(topic, name, value);
    let response: IncrementalAlterConfigsResponse = conn.request(1, &request);
    response.responses[0].error_code
}

/// The IncrementalAlterConfigs request [`set_topic_config`] sends.
pub fn set_topic_config_request(
    topic: &str,
    name: &str,
    value: &str,
) -> kafka_protocol::messages::IncrementalAlterConfigsRequest {
    use kafka_protocol::messages::IncrementalAlterConfigsRequest;
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    let text = |v: &str| StrBytes::from_string(v.to_owned());
    IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(text(topic))
            .with_configs(vec![
                AlterableConfig::default()
                    .with_name(text(name))
                    .with_config_operation(0)
                    .with_value(Some(text(value))),
            ]),
    ])
}

/// DeleteRecords (v2) for one partition: (error code, low watermark).
pub fn delete_records(conn: &mut KafkaConn, topic: &str, partition: i32, offset: i64) -> (i16, i64) {
    let response = conn.request(2, &delete_records_request(topic, partition, offset));
    let p = &response.topics[0].partitions[0];
    (p.error_code, p.low_watermark)
}

/// A DeleteRecords request for one partition.
pub fn delete_records_request(
    topic: &str,
    partition: i32,
    offset: i64,
) -> kafka_protocol::messages::DeleteRecordsRequest {
    use kafka_protocol::messages::DeleteRecordsRequest;
    use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
    DeleteRecordsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![
            DeleteRecordsTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![
                    DeleteRecordsPartition::default()
                        .with_partition_index(partition)
                        .with_offset(offset),
                ]),
        ])
}

/// A Produce frame (v3 or flexible v9) whose topic array claims the
/// element count encoded in `count` and holds nothing after it.
pub fn produce_claiming_topics(version: i16, count: &[u8]) -> Vec<u8> {
    let mut request = Vec::new();
    request.extend_from_slice(&0i16.to_be_bytes()); // Produce
    request.extend_from_slice(&version.to_be_bytes());
    request.extend_from_slice(&7i32.to_be_bytes()); // correlation id
    request.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
    if version >= 9 {
        request.push(0); // header tagged fields
        request.push(0); // null transactional id (compact)
    } else {
        request.extend_from_slice(&(-1i16).to_be_bytes()); // null transactional id
    }
    request.extend_from_slice(&1i16.to_be_bytes()); // acks
    request.extend_from_slice(&1000i32.to_be_bytes()); // timeout
    request.extend_from_slice(count); // topic_data length, then nothing
    let mut frame = (request.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&request);
    frame
}

/// An OffsetCommit of one partition's offset, by `member` of `generation`
/// (`""` and -1 for a commit outside the group's generations).
pub fn offset_commit_request(
    group: &str,
    member: &str,
    generation: i32,
    topic: &str,
    partition: i32,
    offset: i64,
) -> kafka_protocol::messages::OffsetCommitRequest {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    kafka_protocol::messages::OffsetCommitRequest::default()
        .with_group_id(kafka_protocol::messages::GroupId(StrBytes::from_string(
            group.to_owned(),
        )))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(StrBytes::from_string(member.to_owned()))
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(partition)
                        .with_committed_offset(offset),
                ]),
        ])
}
