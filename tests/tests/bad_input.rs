//! Malformed input (DESIGN §9): a bad frame closes its connection, a bad
//! batch is refused with CORRUPT_MESSAGE and leaves nothing in Redis, an
//! unsupported version gets the standard answer — and the server keeps
//! serving everyone else.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse, ResponseHeader};
use kafka_protocol::protocol::{Decodable, StrBytes};
use ketch_tests::batch::{self, Record};
use ketch_tests::raw::{self, KafkaConn, code};
use ketch_tests::{Ketch, RedisServer, unique_topic};
use rdkafka::consumer::Consumer;

const MAX_REQUEST_BYTES: i32 = 100 * 1024 * 1024;

struct Setup {
    redis: RedisServer,
    ketch: Ketch,
    topic: String,
}

fn setup() -> Setup {
    let redis = RedisServer::start();
    let ketch = Ketch::start(&redis.url(), &[]);
    let topic = unique_topic("bad-input");
    assert_eq!(
        raw::create_topic(&mut KafkaConn::connect(ketch.kafka_addr()), &topic, 1),
        code::NONE
    );
    Setup { redis, ketch, topic }
}

impl Setup {
    fn conn(&self) -> KafkaConn {
        KafkaConn::connect(self.ketch.kafka_addr())
    }

    /// The server still serves a well-behaved client, and the partition is
    /// untouched: nothing stored, the next append gets offset 0.
    fn assert_unharmed(&self) {
        let metadata = self
            .ketch
            .consumer()
            .fetch_metadata(Some(&self.topic), Duration::from_secs(10))
            .expect("a fresh rdkafka client gets metadata");
        assert_eq!(metadata.topics()[0].partitions().len(), 1);
        assert_eq!(
            self.redis.stream_len(&self.topic, 0),
            0,
            "XLEN of the partition stream"
        );
        assert_eq!(self.redis.next_offset(&self.topic, 0), 0, "meta next_offset");
        let (error, offset) = raw::produce(&mut self.conn(), &self.topic, 0, valid_batch());
        assert_eq!(
            (error, offset),
            (code::NONE, 0),
            "a valid batch after the bad input"
        );
    }

    /// Produces `batch` (acks 1) and returns the partition's error code.
    fn produce_error(&self, batch: Vec<u8>) -> i16 {
        raw::produce(&mut self.conn(), &self.topic, 0, batch).0
    }
}

fn valid_batch() -> Vec<u8> {
    batch::encode(&[
        Record::value(batch::at(1_000), b"one"),
        Record {
            timestamp: batch::at(1_001),
            key: Some(b"k".to_vec()),
            value: Some(b"two".to_vec()),
            headers: vec![("h".to_owned(), Some(b"v".to_vec()))],
        },
    ])
}

fn api_versions_frame(conn: &mut KafkaConn) -> Vec<u8> {
    let request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("ketch-tests"))
        .with_client_software_version(StrBytes::from_static_str("0"));
    conn.frame(3, &request)
}

fn set_i16(frame: &mut [u8], at: usize, value: i16) {
    frame[at..at + 2].copy_from_slice(&value.to_be_bytes());
}

/// Frame layout: size i32, then the header: api key i16 at 4, version i16 at 6.
const API_KEY_AT: usize = 4;
const API_VERSION_AT: usize = 6;

#[test]
fn oversized_frame_closes_the_connection() {
    let s = setup();
    let mut conn = s.conn();
    let mut frame = (MAX_REQUEST_BYTES + 1).to_be_bytes().to_vec();
    frame.extend_from_slice(&[0u8; 64]);
    conn.send_raw(&frame).expect("send");
    conn.assert_closed();
    s.assert_unharmed();
}

#[test]
fn negative_frame_size_closes_the_connection() {
    let s = setup();
    let mut conn = s.conn();
    conn.send_raw(&i32::MIN.to_be_bytes()).expect("send");
    conn.assert_closed();
    s.assert_unharmed();
}

#[test]
fn truncated_frame_closes_the_connection() {
    let s = setup();
    let mut conn = s.conn();
    let mut frame = conn.frame(
        raw::PRODUCE_VERSION,
        &raw::produce_request(&s.topic, 0, valid_batch()),
    );
    let declared = frame.len() as i32 - 4 + 100;
    frame[..4].copy_from_slice(&declared.to_be_bytes());
    conn.send_raw(&frame).expect("send");
    conn.shutdown_write();
    conn.assert_closed();
    s.assert_unharmed();
}

#[test]
fn unknown_api_key_closes_the_connection() {
    let s = setup();
    let mut conn = s.conn();
    let mut frame = api_versions_frame(&mut conn);
    set_i16(&mut frame, API_KEY_AT, 9999);
    conn.send_raw(&frame).expect("send");
    conn.assert_closed();
    s.assert_unharmed();
}

#[test]
fn unsupported_produce_version_closes_the_connection() {
    let s = setup();
    let mut conn = s.conn();
    let mut frame = conn.frame(
        raw::PRODUCE_VERSION,
        &raw::produce_request(&s.topic, 0, valid_batch()),
    );
    set_i16(&mut frame, API_VERSION_AT, 99);
    conn.send_raw(&frame).expect("send");
    conn.assert_closed();
    s.assert_unharmed();
}

#[test]
fn unsupported_api_versions_version_gets_a_v0_unsupported_version_answer() {
    let s = setup();
    let mut conn = s.conn();
    let mut frame = api_versions_frame(&mut conn);
    let correlation_id = i32::from_be_bytes(frame[8..12].try_into().unwrap());
    set_i16(&mut frame, API_VERSION_AT, 99);
    conn.send_raw(&frame).expect("send");
    let mut response = Bytes::from(conn.read_frame().expect("an answer, not a closed connection"));
    // Kafka answers an ApiVersions it cannot parse with header v0 and body v0.
    let header = ResponseHeader::decode(&mut response, 0).expect("header v0");
    assert_eq!(header.correlation_id, correlation_id);
    let body = ApiVersionsResponse::decode(&mut response, 0).expect("ApiVersions v0 body");
    assert_eq!(body.error_code, code::UNSUPPORTED_VERSION);
    assert_eq!(
        body.api_keys.iter().map(|k| k.api_key).collect::<Vec<_>>(),
        [18],
        "the answer lists ApiVersions' own versions alone, as Kafka's, so the client can retry: {body:?}"
    );
    // The connection stays usable for a supported version.
    let response: ApiVersionsResponse = conn.request(
        3,
        &ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("ketch-tests"))
            .with_client_software_version(StrBytes::from_static_str("0")),
    );
    assert_eq!(response.error_code, code::NONE);
    s.assert_unharmed();
}

#[test]
fn batch_with_wrong_crc_is_corrupt_message() {
    let s = setup();
    let mut bad = valid_batch();
    bad[batch::CRC_AT] ^= 0x01;
    assert_eq!(s.produce_error(bad), code::CORRUPT_MESSAGE);
    s.assert_unharmed();
}

#[test]
fn batch_with_a_flipped_payload_bit_is_corrupt_message() {
    let s = setup();
    let mut bad = valid_batch();
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    assert_eq!(s.produce_error(bad), code::CORRUPT_MESSAGE);
    s.assert_unharmed();
}

#[test]
fn batch_length_longer_than_the_bytes_sent_is_corrupt_message() {
    let s = setup();
    let mut bad = valid_batch();
    let lie = bad.len() as i32 - 12 + 100;
    bad[batch::LENGTH_AT..batch::LENGTH_AT + 4].copy_from_slice(&lie.to_be_bytes());
    assert_eq!(s.produce_error(bad), code::CORRUPT_MESSAGE);
    s.assert_unharmed();
}

#[test]
fn batch_length_shorter_than_the_bytes_sent_is_corrupt_message() {
    let s = setup();
    let mut bad = valid_batch();
    let lie = bad.len() as i32 - 12 - 5;
    bad[batch::LENGTH_AT..batch::LENGTH_AT + 4].copy_from_slice(&lie.to_be_bytes());
    assert_eq!(s.produce_error(bad), code::CORRUPT_MESSAGE);
    s.assert_unharmed();
}

#[test]
fn batch_length_of_i32_max_is_corrupt_message() {
    let s = setup();
    let mut bad = valid_batch();
    bad[batch::LENGTH_AT..batch::LENGTH_AT + 4].copy_from_slice(&i32::MAX.to_be_bytes());
    assert_eq!(s.produce_error(bad), code::CORRUPT_MESSAGE);
    s.assert_unharmed();
}

#[test]
fn record_count_of_two_to_the_31_is_invalid_record() {
    let s = setup();
    let mut bad = valid_batch();
    bad[batch::COUNT_AT..batch::COUNT_AT + 4].copy_from_slice(&0x8000_0000u32.to_be_bytes());
    batch::fix_crc(&mut bad); // only the count is wrong
    // Intact bytes that break a rule: INVALID_RECORD, which clients do not
    // retry (CORRUPT_MESSAGE they would, until their delivery timeout).
    assert_eq!(s.produce_error(bad), code::INVALID_RECORD);
    s.assert_unharmed();
}

/// The protocol decoder sizes arrays from their length fields: a 30-byte
/// Produce claiming 2^31-1 topics must not take the process down.
#[test]
fn array_length_of_i32_max_closes_the_connection_and_the_server_survives() {
    let s = setup();
    for (version, count) in [
        (3i16, i32::MAX.to_be_bytes().to_vec()),
        (9, vec![0xff, 0xff, 0xff, 0xff, 0x0f]),
    ] {
        let mut conn = s.conn();
        conn.send_raw(&raw::produce_claiming_topics(version, &count))
            .expect("send");
        assert!(
            conn.closed_within(Duration::from_secs(10)),
            "connection still open (v{version})"
        );
    }
    s.assert_unharmed();
}

#[test]
fn a_compressed_batch_claiming_more_records_than_it_holds_is_refused_with_nothing_stored() {
    let s = setup();
    let records: Vec<Record> = (0..3)
        .map(|i| Record::value(batch::at(1_000 + i), b"payload"))
        .collect();
    for codec in batch::CODECS {
        let lying = batch::encode_compressed(&records, codec, 5);
        assert_eq!(s.produce_error(lying), code::INVALID_RECORD, "{codec:?}");
        let short = batch::encode_compressed(&records, codec, 2);
        assert_eq!(
            s.produce_error(short),
            code::INVALID_RECORD,
            "{codec:?}: a record too many"
        );
    }
    // The same records, honestly counted, are accepted in every codec.
    s.assert_unharmed();
    for codec in batch::CODECS {
        let honest = batch::encode_compressed(&records, codec, 3);
        assert_eq!(s.produce_error(honest), code::NONE, "{codec:?}");
    }
}

/// A partition named twice in one Produce (in two entries of its topic) is
/// produced and answered once, with the last entry's batch, as Kafka keys a
/// request's partitions by topic and partition (a later entry replacing an
/// earlier one).
#[test]
fn a_partition_named_twice_in_one_produce_is_stored_once() {
    let s = setup();
    let mut request = raw::produce_request(
        &s.topic,
        0,
        batch::encode(&[Record::value(batch::at(1), b"first")]),
    );
    let mut second = request.topic_data[0].clone();
    second.partition_data[0].records = Some(Bytes::from(batch::encode(&[Record::value(
        batch::at(2),
        b"second",
    )])));
    request.topic_data.push(second);
    let response = s.conn().request(raw::PRODUCE_VERSION, &request);
    let answered: usize = response
        .responses
        .iter()
        .map(|t| t.partition_responses.len())
        .sum();
    assert_eq!(answered, 1, "one answer for the partition");
    assert_eq!(raw::produce_result(&response), (code::NONE, 0));
    assert_eq!(s.redis.stream_len(&s.topic, 0), 1, "one batch stored");
    let fetched = s
        .conn()
        .request(raw::FETCH_VERSION, &raw::fetch_request(&s.topic, 0, 0, 0));
    let records = raw::fetch_result(&fetched).2.expect("records");
    assert!(
        records.windows(6).any(|w| w == b"second"),
        "the last entry's batch"
    );
}

/// A batch whose base offset is not 0 is INVALID_RECORD, as from Kafka
/// (the broker assigns offsets; the field is outside the CRC, so this is
/// not corruption), and nothing is stored.
#[test]
fn a_batch_with_a_base_offset_is_invalid_record() {
    let s = setup();
    let mut bad = valid_batch();
    bad[0..8].copy_from_slice(&42i64.to_be_bytes());
    assert_eq!(s.produce_error(bad), code::INVALID_RECORD);
    s.assert_unharmed();
}

/// acks other than -1, 0 and 1 are INVALID_REQUIRED_ACKS for what would be
/// appended; a partition of a topic that does not exist keeps its own
/// error (Kafka checks acks when it appends), and nothing is stored or
/// created.
#[test]
fn invalid_acks_fail_what_would_be_appended() {
    const INVALID_REQUIRED_ACKS: i16 = 21;
    let s = setup();
    for acks in [2, -2] {
        let request = raw::produce_request(&s.topic, 0, valid_batch()).with_acks(acks);
        let response = s.conn().request(raw::PRODUCE_VERSION, &request);
        assert_eq!(
            raw::produce_result(&response).0,
            INVALID_REQUIRED_ACKS,
            "acks {acks}"
        );
        let missing = unique_topic("no-such-topic");
        let request = raw::produce_request(&missing, 0, valid_batch()).with_acks(acks);
        let response = s.conn().request(raw::PRODUCE_VERSION, &request);
        assert_eq!(
            raw::produce_result(&response).0,
            code::UNKNOWN_TOPIC_OR_PARTITION,
            "acks {acks}"
        );
        let created: bool = redis::cmd("HEXISTS")
            .arg("ketch:topics")
            .arg(&missing)
            .query(&mut s.redis.connection())
            .expect("HEXISTS");
        assert!(!created, "not created");
    }
    s.assert_unharmed();
}

/// A batch of `count` records whose body is `body` (compressed with
/// `codec`, if given), its length and CRC set.
fn batch_of_body(body: &[u8], codec: Option<batch::Codec>, count: i32) -> Vec<u8> {
    let mut out = batch::encode(&[Record::value(batch::at(1), b"x")])[..61].to_vec();
    let attributes = codec.map_or(0i16, |codec| codec as i16);
    out[batch::ATTRIBUTES_AT..batch::ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    out[23..27].copy_from_slice(&(count - 1).to_be_bytes());
    out[batch::COUNT_AT..batch::COUNT_AT + 4].copy_from_slice(&count.to_be_bytes());
    out.extend_from_slice(body);
    let length = (out.len() - batch::LENGTH_AT - 4) as i32;
    out[batch::LENGTH_AT..batch::LENGTH_AT + 4].copy_from_slice(&length.to_be_bytes());
    batch::fix_crc(&mut out);
    out
}

fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(body).expect("gzip");
    gz.finish().expect("gzip")
}

/// Varint fields (lengths, offset deltas, header counts) of more than
/// 5 bytes are INVALID_RECORD, as Kafka's record reader refuses them
/// (`ByteUtils.readVarint`): such a batch, stored, would stop every Java
/// consumer of the partition. Five bytes, the longest form Kafka reads,
/// are accepted; compressed or not.
#[test]
fn a_varint_longer_than_kafka_reads_is_invalid_record() {
    let s = setup();
    // attributes, timestamp delta 0, offset delta 0, the key's length (-1,
    // null) in `key_length`, the value "x", no headers.
    let record = |key_length: &[u8]| {
        let mut fields = vec![0, 0, 0];
        fields.extend_from_slice(key_length);
        fields.extend_from_slice(&[2, b'x', 0]);
        let mut record = vec![(fields.len() as u8) << 1];
        record.extend_from_slice(&fields);
        record
    };
    let six = record(&[0x81, 0x80, 0x80, 0x80, 0x80, 0x00]);
    let five = record(&[0x81, 0x80, 0x80, 0x80, 0x00]);
    let gzipped = |body: &[u8]| batch_of_body(&gzip(body), Some(batch::Codec::Gzip), 1);
    assert_eq!(
        s.produce_error(batch_of_body(&six, None, 1)),
        code::INVALID_RECORD
    );
    assert_eq!(s.produce_error(gzipped(&six)), code::INVALID_RECORD, "gzip");
    s.assert_unharmed();
    // After the two records of the check above.
    let mut conn = s.conn();
    assert_eq!(
        raw::produce(&mut conn, &s.topic, 0, batch_of_body(&five, None, 1)),
        (code::NONE, 2)
    );
    assert_eq!(
        raw::produce(&mut conn, &s.topic, 0, gzipped(&five)),
        (code::NONE, 3),
        "gzip"
    );
}

/// LZ4 bodies Kafka's reader (`Lz4BlockInputStream`) cannot read are
/// INVALID_RECORD, nothing stored: linked blocks, the legacy frame format,
/// a frame with reserved bits; and only the first frame is read, so
/// records in a second frame after its end mark do not count.
#[test]
fn lz4_frames_kafka_cannot_read_are_invalid_record() {
    use lz4_flex::frame::{BlockMode, FrameEncoder, FrameInfo};
    use std::io::Write;
    let s = setup();
    let body = |n: i64| {
        let plain = batch::encode(&[Record::value(batch::at(n), b"value")]);
        plain[61..].to_vec()
    };
    let frame = |info: FrameInfo, data: &[u8]| {
        let mut lz = FrameEncoder::with_frame_info(info, Vec::new());
        lz.write_all(data).expect("lz4");
        lz.finish().expect("lz4")
    };
    let raw_lz4 =
        |compressed: Vec<u8>, count: i32| batch_of_body(&compressed, Some(batch::Codec::Lz4), count);
    let linked = frame(FrameInfo::new().block_mode(BlockMode::Linked), &body(1));
    assert_eq!(
        s.produce_error(raw_lz4(linked, 1)),
        code::INVALID_RECORD,
        "linked blocks"
    );
    let mut legacy = frame(FrameInfo::new(), &body(1));
    legacy[..4].copy_from_slice(&0x184C_2102u32.to_le_bytes());
    assert_eq!(
        s.produce_error(raw_lz4(legacy, 1)),
        code::INVALID_RECORD,
        "legacy magic"
    );
    let mut reserved = frame(FrameInfo::new(), &body(1));
    reserved[4] |= 0x02;
    assert_eq!(
        s.produce_error(raw_lz4(reserved, 1)),
        code::INVALID_RECORD,
        "reserved bit"
    );
    // Two records, one per frame: Kafka reads one of the two claimed.
    let mut two = frame(FrameInfo::new(), &body(1));
    let mut second = body(2);
    second[3] = 2; // offset delta 1
    two.extend_from_slice(&frame(FrameInfo::new(), &second));
    assert_eq!(
        s.produce_error(raw_lz4(two, 2)),
        code::INVALID_RECORD,
        "a second frame"
    );
    s.assert_unharmed();
    // The same records in one frame are stored (after the two of the
    // check above).
    let mut both = body(1);
    both.extend_from_slice(&second);
    assert_eq!(
        raw::produce(
            &mut s.conn(),
            &s.topic,
            0,
            raw_lz4(frame(FrameInfo::new(), &both), 2)
        ),
        (code::NONE, 2)
    );
}

/// Old-format messages (magic 0 or 1) in a Produce request are
/// INVALID_RECORD, which clients do not retry, whatever their length, as
/// Kafka checks the magic first; a magic Kafka does not know is
/// CORRUPT_MESSAGE.
#[test]
fn an_old_format_message_is_invalid_record_whatever_its_length() {
    let s = setup();
    // A v1 message set: offset, size, CRC, magic 1, attributes, timestamp,
    // key (null), value "v": 35 bytes, shorter than a v2 batch's header.
    let mut v1 = Vec::new();
    v1.extend_from_slice(&0i64.to_be_bytes());
    v1.extend_from_slice(&23i32.to_be_bytes());
    v1.extend_from_slice(&0u32.to_be_bytes());
    v1.push(1);
    v1.push(0);
    v1.extend_from_slice(&batch::at(1).to_be_bytes());
    v1.extend_from_slice(&(-1i32).to_be_bytes());
    v1.extend_from_slice(&1i32.to_be_bytes());
    v1.push(b'v');
    assert_eq!(v1.len(), 35);
    assert_eq!(s.produce_error(v1.clone()), code::INVALID_RECORD, "magic 1");
    v1[16] = 0;
    assert_eq!(s.produce_error(v1.clone()), code::INVALID_RECORD, "magic 0");
    let mut future = valid_batch();
    future[16] = 3;
    assert_eq!(s.produce_error(future), code::CORRUPT_MESSAGE, "magic 3");
    s.assert_unharmed();
}

/// A string that is not valid UTF-8 (here the header's client id, as a C
/// client may send from a Latin-1 host name) is decoded with U+FFFD in
/// its place, as Kafka's `Readable.readString` decodes it: the request is
/// answered. The connection used to be closed, for every request of such
/// a client.
#[test]
fn a_client_id_that_is_not_utf8_is_answered() {
    let s = setup();
    let mut conn = KafkaConn::connect_as(s.ketch.kafka_addr(), "ab");
    let mut frame = api_versions_frame(&mut conn);
    // size, api key, version, correlation id, then the client id's length
    // (i16) and its two bytes.
    const CLIENT_ID_AT: usize = 4 + 2 + 2 + 4 + 2;
    assert_eq!(&frame[CLIENT_ID_AT..CLIENT_ID_AT + 2], b"ab");
    frame[CLIENT_ID_AT + 1] = 0xff;
    conn.send_raw(&frame).expect("send");
    let (correlation, response) = conn.receive_next::<ApiVersionsRequest>(3);
    assert_eq!(
        (correlation, response.error_code),
        (conn.last_correlation_id(), code::NONE)
    );
    assert!(!response.api_keys.is_empty());
    s.assert_unharmed();
}
