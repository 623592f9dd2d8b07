//! Security end to end with the Rust client (librdkafka here is built
//! without OpenSSL, so SASL PLAIN over SASL_PLAINTEXT): `ketch users`, ACLs
//! made with CreateAcls, group requests forwarded between gateways behind a
//! load balancer with ACLs on (the internal listener's secret), and a
//! forged Envelope refused. TLS, SCRAM, OAUTHBEARER, mTLS and
//! re-authentication are tested with Python clients
//! (tests/python/test_security.py).

use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::alter_client_quotas_request;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, ApiKey, CreateAclsRequest, DescribeClientQuotasRequest, EnvelopeRequest,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, MetadataRequest, RequestHeader,
    SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use ketch_tests::raw::KafkaConn;
use ketch_tests::servers::Balanced;
use ketch_tests::{Ketch, TestRedis, free_port, ketch_command, unique_topic};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

const SASL_AUTHENTICATION_FAILED: i16 = 58;
const GROUP_AUTHORIZATION_FAILED: &str = "GroupAuthorizationFailed";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

/// Runs `ketch users <args>` against `redis_url` with `stdin`: success and
/// output.
fn users(redis_url: &str, args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = ketch_command()
        .arg("users")
        .args(args)
        .args(["--redis-url", redis_url])
        // A list of seed nodes is a Redis Cluster (TEST_REDIS_MODE=cluster).
        .args(if redis_url.contains(',') {
            &["--set", "redis.mode=cluster"][..]
        } else {
            &[][..]
        })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ketch users");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write the password");
    let output = child.wait_with_output().expect("ketch users");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The settings of a gateway with SASL PLAIN on a plaintext listener and
/// ACLs on, `admin` a super user.
const SECURE: &[&str] = &[
    "--set",
    "broker.security_protocol=SASL_PLAINTEXT",
    "--set",
    "sasl.mechanisms=PLAIN,SCRAM-SHA-512",
    "--set",
    "sasl.plain_without_tls=true",
    "--set",
    "acl.enabled=true",
    "--set",
    "acl.super_users=admin",
];

/// A raw connection authenticated with SASL PLAIN.
fn plain_conn(ketch: &Ketch, user: &str, password: &str) -> Result<KafkaConn, (i16, String)> {
    plain_conn_over(KafkaConn::connect(ketch.kafka_addr()), user, password)
}

/// `conn`, authenticated with SASL PLAIN.
fn plain_conn_over(mut conn: KafkaConn, user: &str, password: &str) -> Result<KafkaConn, (i16, String)> {
    let handshake = conn.request(1, &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")));
    assert_eq!(handshake.error_code, 0, "{handshake:?}");
    let token = format!("\0{user}\0{password}");
    let answer = conn.request(
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token.into_bytes())),
    );
    if answer.error_code != 0 {
        return Err((
            answer.error_code,
            answer.error_message.map(|m| m.to_string()).unwrap_or_default(),
        ));
    }
    Ok(conn)
}

fn acl(resource_type: i8, name: &str, principal: &str, operation: i8) -> AclCreation {
    AclCreation::default()
        .with_resource_type(resource_type)
        .with_resource_name(s(name))
        .with_resource_pattern_type(3)
        .with_principal(s(principal))
        .with_host(s("*"))
        .with_operation(operation)
        .with_permission_type(3)
}

const TOPIC: i8 = 2;
const GROUP: i8 = 3;
const READ: i8 = 3;
const WRITE: i8 = 4;
const CREATE: i8 = 5;

#[test]
fn users_are_set_listed_and_deleted_and_redis_never_holds_a_password() {
    let redis = TestRedis::start();
    let url = redis.url();
    let (ok, out) = users(&url, &["set", "alice"], "wonderland-7\n");
    assert!(ok, "{out}");
    assert!(
        out.contains("SCRAM-SHA-256") && out.contains("SCRAM-SHA-512"),
        "{out}"
    );
    let (ok, out) = users(
        &url,
        &[
            "set",
            "bob",
            "--mechanism",
            "SCRAM-SHA-512",
            "--iterations",
            "4096",
        ],
        "pw\n",
    );
    assert!(ok, "{out}");
    let (ok, listed) = users(&url, &["list"], "");
    assert!(ok, "{listed}");
    for line in [
        "alice\tSCRAM-SHA-256\t8192",
        "alice\tSCRAM-SHA-512\t8192",
        "bob\tSCRAM-SHA-512\t4096",
    ] {
        assert!(listed.contains(line), "{line:?} not in {listed}");
    }
    assert!(!listed.contains("bob\tSCRAM-SHA-256"), "{listed}");
    let stored: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg("ketch:{security}:users")
        .query(&mut redis.connection())
        .expect("users hash");
    assert_eq!(stored.len(), 3, "{stored:?}");
    assert!(
        stored
            .values()
            .all(|v| !v.contains("wonderland") && v.contains("stored_key")),
        "{stored:?}"
    );

    let (ok, out) = users(&url, &["delete", "alice", "--mechanism", "SCRAM-SHA-256"], "");
    assert!(ok, "{out}");
    let (_, listed) = users(&url, &["list"], "");
    assert!(
        !listed.contains("alice\tSCRAM-SHA-256") && listed.contains("alice\tSCRAM-SHA-512"),
        "{listed}"
    );

    // Bad input: a clear error, nothing written.
    let (ok, out) = users(&url, &["set", "carol", "--mechanism", "SCRAM-MD5"], "pw\n");
    assert!(!ok && out.contains("unknown mechanism"), "{out}");
    let (ok, out) = users(&url, &["set", "carol"], "\n");
    assert!(!ok && out.contains("password is empty"), "{out}");
    let (ok, out) = users(&url, &["set", "carol", "--iterations", "100"], "pw\n");
    assert!(!ok && out.contains("--iterations"), "{out}");
    let (ok, out) = users(&url, &["delete", "nobody"], "");
    assert!(!ok && out.contains("no such credentials"), "{out}");
    let (_, listed) = users(&url, &["list"], "");
    assert!(!listed.contains("carol"), "{listed}");

    // A change the replicas did not confirm is made, and said so (the
    // warning was not shown: the commands had no log output).
    let unconfirmed = [
        "set",
        "dave",
        "--set",
        "storage.acks_all_replicas=1",
        "--set",
        "storage.acks_all_timeout=100ms",
    ];
    let (ok, out) = users(&url, &unconfirmed, "pw\n");
    assert!(ok, "{out}");
    assert!(out.contains("not confirmed by Redis replicas"), "{out}");
    let (_, listed) = users(&url, &["list"], "");
    assert!(
        listed.contains("dave\tSCRAM-SHA-256") && listed.contains("dave\tSCRAM-SHA-512"),
        "{listed}"
    );
}

#[test]
fn sasl_plain_checks_the_scram_credentials_and_nothing_is_served_before_authentication() {
    let redis = TestRedis::start();
    let (ok, out) = users(&redis.url(), &["set", "alice"], "right\n");
    assert!(ok, "{out}");
    let ketch = Ketch::start(&redis.url(), SECURE);
    assert!(plain_conn(&ketch, "alice", "right").is_ok());
    let (code, message) = plain_conn(&ketch, "alice", "wrong")
        .err()
        .expect("a wrong password is refused");
    assert_eq!(code, SASL_AUTHENTICATION_FAILED);
    assert_eq!(message, "Authentication failed: Invalid username or password");
    let (code, message) = plain_conn(&ketch, "alice", "")
        .err()
        .expect("an empty password is refused");
    assert_eq!(code, SASL_AUTHENTICATION_FAILED);
    assert_eq!(message, "Authentication failed: password not specified");
    let (code, _) = plain_conn(&ketch, "mallory", "x")
        .err()
        .expect("an unknown user is refused");
    assert_eq!(code, SASL_AUTHENTICATION_FAILED);

    // A request other than ApiVersions and SASL before authenticating
    // closes the connection, unanswered.
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    conn.send(12, &MetadataRequest::default());
    conn.assert_closed();
    // A mechanism that is not enabled is refused in the handshake.
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let handshake = conn.request(1, &SaslHandshakeRequest::default().with_mechanism(s("GSSAPI")));
    assert_eq!(handshake.error_code, 33, "UNSUPPORTED_SASL_MECHANISM");
    assert!(
        handshake.mechanisms.iter().any(|m| m.as_str() == "PLAIN"),
        "{handshake:?}"
    );
    conn.assert_closed();
    // A garbage SCRAM client-first message fails the authentication.
    let mut conn = KafkaConn::connect(ketch.kafka_addr());
    let handshake = conn.request(
        1,
        &SaslHandshakeRequest::default().with_mechanism(s("SCRAM-SHA-512")),
    );
    assert_eq!(handshake.error_code, 0);
    let answer = conn.request(
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"\xff\xfe garbage")),
    );
    assert_eq!(answer.error_code, SASL_AUTHENTICATION_FAILED, "{answer:?}");
    conn.assert_closed();
    // The gateway still serves authenticated clients.
    let mut conn = plain_conn(&ketch, "alice", "right").expect("authenticated");
    let metadata = conn.request(12, &MetadataRequest::default());
    assert!(!metadata.brokers.is_empty());
    ketch.await_log("failed", Duration::from_secs(5));
}

/// Two gateways behind HAProxy with ACLs on: a consumer group of alice's
/// works through either (group requests forwarded to the coordinator
/// prove the internal secret), a group alice may not use is refused, and
/// ACLs created through one gateway hold on the other.
#[test]
fn acls_hold_on_every_gateway_and_group_requests_are_forwarded_behind_a_load_balancer() {
    let Balanced { redis, gateways, lb } = Balanced::start(2, SECURE);
    for (user, password) in [("admin", "admin-pw"), ("alice", "alice-pw")] {
        let (ok, out) = users(&redis.url(), &["set", user], &format!("{password}\n"));
        assert!(ok, "{out}");
    }

    let topic = unique_topic("secure");
    let group = "alices-group";
    let mut admin = plain_conn(&gateways[0], "admin", "admin-pw").expect("admin authenticates");
    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![
            acl(TOPIC, &topic, "User:alice", READ),
            acl(TOPIC, &topic, "User:alice", WRITE),
            acl(TOPIC, &topic, "User:alice", CREATE),
            acl(GROUP, group, "User:alice", READ),
        ]),
    );
    assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    // Alice may not create ACLs.
    let mut alice = plain_conn(&gateways[1], "alice", "alice-pw").expect("alice authenticates");
    let refused = alice.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![acl(GROUP, "*", "User:alice", READ)]),
    );
    assert_eq!(
        refused.results[0].error_code, 31,
        "CLUSTER_AUTHORIZATION_FAILED: {refused:?}"
    );
    // Nor set or read client quotas (ALTER_CONFIGS, DESCRIBE_CONFIGS on the
    // cluster); the super user may.
    let quota = |user: &str| {
        AlterClientQuotasRequest::default().with_entries(vec![
            alter_client_quotas_request::EntryData::default()
                .with_entity(vec![
                    alter_client_quotas_request::EntityData::default()
                        .with_entity_type(s("user"))
                        .with_entity_name(Some(s(user))),
                ])
                .with_ops(vec![
                    alter_client_quotas_request::OpData::default()
                        .with_key(s("consumer_byte_rate"))
                        .with_value(1e9),
                ]),
        ])
    };
    assert_eq!(alice.request(1, &quota("alice")).entries[0].error_code, 31);
    assert_eq!(
        alice
            .request(1, &DescribeClientQuotasRequest::default())
            .error_code,
        31
    );
    assert_eq!(admin.request(1, &quota("alice")).entries[0].error_code, 0);
    let described = admin.request(1, &DescribeClientQuotasRequest::default());
    assert_eq!(
        (described.error_code, described.entries.map(|e| e.len())),
        (0, Some(1))
    );

    let client = |extra: &[(&str, &str)]| {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", lb.bootstrap())
            .set("broker.address.family", "v4")
            .set("security.protocol", "SASL_PLAINTEXT")
            .set("sasl.mechanism", "PLAIN")
            .set("sasl.username", "alice")
            .set("sasl.password", "alice-pw");
        for (k, v) in extra {
            config.set(*k, *v);
        }
        config
    };
    let producer: ThreadedProducer<DefaultProducerContext> = client(&[]).create().expect("producer");
    for i in 0..20 {
        producer
            .send(
                BaseRecord::to(&topic)
                    .key(&format!("k{i}"))
                    .payload(&format!("v{i}")),
            )
            .expect("enqueue");
    }
    producer.flush(Duration::from_secs(20)).expect("produced");
    // Altering the topic's configs takes ALTER_CONFIGS, which only the
    // super user has.
    let alter = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(TOPIC)
            .with_resource_name(s(&topic))
            .with_configs(vec![
                AlterableConfig::default()
                    .with_name(s("retention.ms"))
                    .with_config_operation(0)
                    .with_value(Some(s("3600000"))),
            ]),
    ]);
    let refused: IncrementalAlterConfigsResponse = alice.request(1, &alter);
    assert_eq!(refused.responses[0].error_code, 29, "TOPIC_AUTHORIZATION_FAILED");
    let altered: IncrementalAlterConfigsResponse = admin.request(1, &alter);
    assert_eq!(altered.responses[0].error_code, 0, "{altered:?}");

    let consumer = |group: &str| -> BaseConsumer {
        let c: BaseConsumer = client(&[
            ("group.id", group),
            ("enable.auto.commit", "false"),
            ("auto.offset.reset", "earliest"),
            ("session.timeout.ms", "6000"),
            ("heartbeat.interval.ms", "500"),
        ])
        .create()
        .expect("consumer");
        c.subscribe(&[&topic]).expect("subscribe");
        c
    };
    // Several consumers in turn, so their group requests land on both
    // gateways: each joins, reads, commits and leaves.
    let mut consumed = 0;
    for round in 0..3 {
        let c = consumer(group);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = None;
        while last.is_none() || (round == 0 && consumed < 20) {
            assert!(Instant::now() < deadline, "round {round}: consumed {consumed}");
            match c.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    if round == 0 {
                        consumed += 1;
                    }
                    last = Some(m.offset());
                }
                Some(Err(e)) => panic!("round {round}: {e}"),
                None if round > 0 && c.assignment().is_ok_and(|a| a.count() > 0) => break,
                None => {}
            }
        }
        if last.is_some() {
            c.commit_consumer_state(CommitMode::Sync).expect("commit");
        }
    }
    assert_eq!(consumed, 20);

    // A group without an ACL is refused, wherever its requests land.
    let stranger = consumer("someone-elses-group");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "the group was not refused");
        if let Some(Err(e)) = stranger.poll(Duration::from_millis(100))
            && format!("{e:?}").contains(GROUP_AUTHORIZATION_FAILED)
        {
            break;
        }
    }
    for g in &gateways {
        assert!(
            !g.output().contains("did not prove the internal secret"),
            "{}",
            g.output()
        );
    }
}

/// With ACLs on, the internal listener answers nothing to a connection that
/// does not prove the internal secret: an Envelope naming `User:admin` as
/// its principal cannot be slipped in.
#[test]
fn the_internal_listener_refuses_a_forged_envelope() {
    let redis = TestRedis::start();
    let internal_port = free_port();
    let internal = format!("cluster.internal_listen=127.0.0.1:{internal_port}");
    let mut args = vec!["--set", &internal];
    args.extend_from_slice(SECURE);
    let ketch = Ketch::start(&redis.url(), &args);

    let envelope = |principal: &str| {
        let inner = {
            let mut buf = bytes::BytesMut::new();
            RequestHeader::default()
                .with_request_api_key(ApiKey::DeleteGroups as i16)
                .with_request_api_version(2)
                .encode(&mut buf, ApiKey::DeleteGroups.request_header_version(2))
                .expect("header");
            kafka_protocol::messages::DeleteGroupsRequest::default()
                .with_groups_names(vec![kafka_protocol::messages::GroupId(s("g"))])
                .encode(&mut buf, 2)
                .expect("body");
            buf.freeze()
        };
        let request = EnvelopeRequest::default()
            .with_request_data(inner)
            .with_request_principal(Some(Bytes::from(principal.as_bytes().to_vec())))
            .with_client_host_address(Bytes::from_static(&[127, 0, 0, 1]));
        ketch_tests::raw::encode_frame(1, 0, &request)
    };
    let connect = || {
        let mut socket = std::net::TcpStream::connect(("127.0.0.1", internal_port)).expect("connect");
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        // The listener's challenge comes first: a 32-byte nonce.
        let mut size = [0u8; 4];
        socket.read_exact(&mut size).expect("challenge size");
        assert_eq!(i32::from_be_bytes(size), 32);
        let mut nonce = [0u8; 32];
        socket.read_exact(&mut nonce).expect("challenge");
        socket
    };
    let closed = |socket: &mut std::net::TcpStream| {
        let mut buf = [0u8; 64];
        matches!(socket.read(&mut buf), Ok(0) | Err(_))
    };

    // An Envelope instead of the proof.
    let mut socket = connect();
    socket.write_all(&envelope("User:admin")).expect("send");
    assert!(closed(&mut socket), "a forged Envelope was answered");
    // A wrong proof.
    let mut socket = connect();
    let mut proof = vec![0, 0, 0, 32];
    proof.extend_from_slice(&[7u8; 32]);
    socket.write_all(&proof).expect("send");
    socket.write_all(&envelope("User:admin")).expect("send");
    assert!(closed(&mut socket), "a wrong proof was accepted");
    ketch.await_log("did not prove the internal secret", Duration::from_secs(5));
}

const DESCRIBE: i8 = 8;

/// A gateway with ACLs on, users admin (a super user) and alice, and
/// admin's authenticated connection.
fn admin_and_alice() -> (TestRedis, Ketch, KafkaConn) {
    let redis = TestRedis::start();
    for (user, password) in [("admin", "admin-pw"), ("alice", "alice-pw")] {
        let (ok, out) = users(&redis.url(), &["set", user], &format!("{password}\n"));
        assert!(ok, "{out}");
    }
    let ketch = Ketch::start(&redis.url(), SECURE);
    let admin = plain_conn(&ketch, "admin", "admin-pw").expect("admin authenticates");
    (redis, ketch, admin)
}

/// DescribeTransactions shows only the topics the client may describe, as
/// Kafka leaves the others out of a transaction's partitions.
#[test]
fn describe_transactions_hides_the_topics_a_client_may_not_describe() {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
    use kafka_protocol::messages::{
        AddPartitionsToTxnRequest, DescribeTransactionsRequest, InitProducerIdRequest, ProducerId,
        TransactionalId,
    };
    const TRANSACTIONAL_ID: i8 = 5;
    let (_redis, ketch, mut admin) = admin_and_alice();
    let (visible, secret, id) = (
        unique_topic("visible"),
        unique_topic("secret"),
        unique_topic("txn"),
    );
    for topic in [&visible, &secret] {
        assert_eq!(ketch_tests::raw::create_topic(&mut admin, topic, 1), 0);
    }
    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![
            acl(TRANSACTIONAL_ID, &id, "User:alice", DESCRIBE),
            acl(TOPIC, &visible, "User:alice", DESCRIBE),
        ]),
    );
    assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    let started = admin.request(
        4,
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(s(&id))))
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    );
    assert_eq!(started.error_code, 0);
    let added = admin.request(
        3,
        &AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s(&id)))
            .with_v3_and_below_producer_id(started.producer_id)
            .with_v3_and_below_producer_epoch(started.producer_epoch)
            .with_v3_and_below_topics(
                [&visible, &secret]
                    .iter()
                    .map(|t| {
                        AddPartitionsToTxnTopic::default()
                            .with_name(ketch_tests::raw::topic_name(t))
                            .with_partitions(vec![0])
                    })
                    .collect(),
            ),
    );
    assert!(
        added
            .results_by_topic_v3_and_below
            .iter()
            .all(|t| t.results_by_partition[0].partition_error_code == 0),
        "{added:?}"
    );
    let topics = |conn: &mut KafkaConn| -> Vec<String> {
        let described = conn.request(
            0,
            &DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(s(&id))]),
        );
        let state = &described.transaction_states[0];
        assert_eq!(state.error_code, 0);
        state.topics.iter().map(|t| t.topic.to_string()).collect()
    };
    let mut both = vec![visible.clone(), secret.clone()];
    both.sort();
    assert_eq!(topics(&mut admin), both);
    let mut alice = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    assert_eq!(topics(&mut alice), vec![visible.clone()]);
}

/// Metadata answers as Kafka does where ACLs decide: a missing topic the
/// client asked to have created but may not create is
/// TOPIC_AUTHORIZATION_FAILED (a producer fails at once instead of waiting
/// for it), and so is a topic id the client may not describe; a name that
/// cannot be a topic's is INVALID_TOPIC_EXCEPTION.
#[test]
fn metadata_tells_a_client_what_it_may_not_do() {
    use kafka_protocol::messages::MetadataResponse;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    const INVALID_TOPIC_EXCEPTION: i16 = 17;
    let (_redis, ketch, mut admin) = admin_and_alice();
    let (missing, hidden) = (unique_topic("missing"), unique_topic("hidden"));
    assert_eq!(ketch_tests::raw::create_topic(&mut admin, &hidden, 1), 0);
    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![acl(TOPIC, &missing, "User:alice", DESCRIBE)]),
    );
    assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    let metadata =
        |conn: &mut KafkaConn, topic: MetadataRequestTopic, create: bool| -> (i16, Option<String>) {
            let request = MetadataRequest::default()
                .with_topics(Some(vec![topic]))
                .with_allow_auto_topic_creation(create);
            let response: MetadataResponse = conn.request(12, &request);
            let topic = &response.topics[0];
            (topic.error_code, topic.name.as_ref().map(|n| n.to_string()))
        };
    let named =
        |name: &str| MetadataRequestTopic::default().with_name(Some(ketch_tests::raw::topic_name(name)));
    let mut alice = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    assert_eq!(
        metadata(&mut alice, named(&missing), true).0,
        TOPIC_AUTHORIZATION_FAILED
    );
    assert_eq!(
        metadata(&mut alice, named(&missing), false).0,
        3,
        "UNKNOWN_TOPIC_OR_PARTITION"
    );
    let hidden_id = {
        let response: MetadataResponse = admin.request(
            12,
            &MetadataRequest::default()
                .with_topics(Some(vec![named(&hidden)]))
                .with_allow_auto_topic_creation(false),
        );
        response.topics[0].topic_id
    };
    let by_id = MetadataRequestTopic::default().with_topic_id(hidden_id);
    let (error, name) = metadata(&mut alice, by_id, false);
    assert_eq!(error, TOPIC_AUTHORIZATION_FAILED);
    assert!(
        name.as_deref().is_none_or(str::is_empty),
        "the name is not told: {name:?}"
    );
    assert_eq!(
        metadata(&mut admin, named("no such/topic"), false).0,
        INVALID_TOPIC_EXCEPTION
    );
    // Before v12 a topic is named, not given by id: INVALID_REQUEST.
    let early: MetadataResponse = admin.request(
        11,
        &MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_topic_id(hidden_id),
            ]))
            .with_allow_auto_topic_creation(false),
    );
    assert_eq!(early.topics[0].error_code, 42, "INVALID_REQUEST");
}

/// CreateTopics shows a created topic's configs only to a client that may
/// describe them; otherwise it says so in the topic's config error, as
/// Kafka does (the topic is created either way).
#[test]
fn created_topics_configs_are_shown_only_to_who_may_describe_them() {
    use kafka_protocol::messages::CreateTopicsResponse;
    const DESCRIBE_CONFIGS: i8 = 10;
    const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    let (_redis, ketch, mut admin) = admin_and_alice();
    let (blind, seeing) = (unique_topic("blind"), unique_topic("seeing"));
    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![
            acl(TOPIC, &blind, "User:alice", CREATE),
            acl(TOPIC, &seeing, "User:alice", CREATE),
            acl(TOPIC, &seeing, "User:alice", DESCRIBE_CONFIGS),
        ]),
    );
    assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    let mut alice = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    let create = |conn: &mut KafkaConn, topic: &str| {
        let response: CreateTopicsResponse =
            conn.request(7, &ketch_tests::raw::create_topic_request(topic, 2));
        response.topics[0].clone()
    };
    let result = create(&mut alice, &blind);
    assert_eq!(result.error_code, 0, "{result:?}");
    assert_eq!(result.topic_config_error_code, TOPIC_AUTHORIZATION_FAILED);
    assert!(result.configs.unwrap_or_default().is_empty());
    assert_eq!(result.num_partitions, -1);
    let result = create(&mut alice, &seeing);
    assert_eq!((result.error_code, result.topic_config_error_code), (0, 0));
    assert_eq!(result.num_partitions, 2);
    assert!(
        result
            .configs
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c.name.as_str() == "retention.ms")),
        "{result:?}"
    );
}

/// DeleteTopics takes DELETE on the cluster as DELETE on every topic, and
/// tells a client that may describe a missing topic that it is missing;
/// Metadata reports the cluster's authorised operations only to a client
/// with DESCRIBE on the cluster (as DescribeCluster does, and Kafka).
#[test]
fn delete_topics_takes_the_clusters_delete_and_metadata_hides_cluster_operations() {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse, MetadataResponse};
    const CLUSTER: i8 = 4;
    const DELETE: i8 = 6;
    const IDEMPOTENT_WRITE: i8 = 12;
    let (_redis, ketch, mut admin) = admin_and_alice();
    let (topic, missing, hidden) = (
        unique_topic("doomed"),
        unique_topic("missing"),
        unique_topic("hidden"),
    );
    assert_eq!(ketch_tests::raw::create_topic(&mut admin, &topic, 1), 0);
    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![
            acl(TOPIC, &missing, "User:alice", DESCRIBE),
            acl(CLUSTER, "kafka-cluster", "User:alice", IDEMPOTENT_WRITE),
        ]),
    );
    assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    let mut alice = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    let delete = |conn: &mut KafkaConn, name: &str| -> i16 {
        let response: DeleteTopicsResponse = conn.request(
            6,
            &DeleteTopicsRequest::default()
                .with_topics(vec![
                    DeleteTopicState::default().with_name(Some(ketch_tests::raw::topic_name(name))),
                ])
                .with_timeout_ms(10_000),
        );
        response.responses[0].error_code
    };
    assert_eq!(delete(&mut alice, &missing), 3, "UNKNOWN_TOPIC_OR_PARTITION");
    assert_eq!(delete(&mut alice, &hidden), 29, "TOPIC_AUTHORIZATION_FAILED");
    assert_eq!(delete(&mut alice, &topic), 29, "TOPIC_AUTHORIZATION_FAILED");
    let operations = |conn: &mut KafkaConn| -> i32 {
        let response: MetadataResponse = conn.request(
            10,
            &MetadataRequest::default()
                .with_topics(Some(vec![]))
                .with_include_cluster_authorized_operations(true),
        );
        response.cluster_authorized_operations
    };
    assert_eq!(operations(&mut alice), 0, "no DESCRIBE on the cluster");

    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![
            acl(CLUSTER, "kafka-cluster", "User:alice", DELETE),
            acl(CLUSTER, "kafka-cluster", "User:alice", DESCRIBE),
        ]),
    );
    assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while operations(&mut alice) == 0 {
        assert!(
            Instant::now() < deadline,
            "the new ACLs never reached the gateway"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // DELETE is no cluster operation Kafka reports (its supported ones).
    assert_eq!(operations(&mut alice), 1 << DESCRIBE | 1 << IDEMPOTENT_WRITE);
    assert_eq!(
        delete(&mut alice, &topic),
        0,
        "DELETE on the cluster deletes any topic"
    );
}

/// InitProducerId is authorized before the request is checked, as in
/// Kafka: a client without the ACLs is told so, whatever else is wrong.
#[test]
fn init_producer_id_is_authorized_before_it_is_checked() {
    use kafka_protocol::messages::{
        InitProducerIdRequest, InitProducerIdResponse, ProducerId, TransactionalId,
    };
    let (_redis, ketch, _admin) = admin_and_alice();
    let mut alice = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    // A producer id without an epoch (INVALID_REQUEST once authorized).
    let bad = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_producer_id(ProducerId(5))
        .with_producer_epoch(-1)
        .with_transaction_timeout_ms(60_000);
    let idempotent: InitProducerIdResponse = alice.request(4, &bad);
    assert_eq!(idempotent.error_code, 31, "CLUSTER_AUTHORIZATION_FAILED");
    let transactional: InitProducerIdResponse =
        alice.request(4, &bad.with_transactional_id(Some(TransactionalId(s("")))));
    assert_eq!(
        transactional.error_code, 53,
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    );
}

/// A DeleteTopics by name needs DESCRIBE on the topic as well as DELETE: a
/// DENY of DESCRIBE keeps the topic, as Kafka's controller checks it first.
#[test]
fn delete_topics_by_name_is_refused_without_describe() {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse};
    const DELETE: i8 = 6;
    let (redis, ketch, mut admin) = admin_and_alice();
    let topic = unique_topic("undescribed");
    assert_eq!(ketch_tests::raw::create_topic(&mut admin, &topic, 1), 0);
    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![
            acl(TOPIC, &topic, "User:alice", DELETE),
            acl(TOPIC, &topic, "User:alice", DESCRIBE).with_permission_type(2),
        ]),
    );
    assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    let mut alice = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    let response: DeleteTopicsResponse = alice.request(
        6,
        &DeleteTopicsRequest::default()
            .with_topics(vec![
                DeleteTopicState::default().with_name(Some(ketch_tests::raw::topic_name(&topic))),
            ])
            .with_timeout_ms(10_000),
    );
    assert_eq!(response.responses[0].error_code, 29, "TOPIC_AUTHORIZATION_FAILED");
    assert!(redis.topic_exists(&topic), "the topic was deleted");
}

/// A DeleteTopics by id that the client may not delete names the topic in
/// its TOPIC_AUTHORIZATION_FAILED only when the client may describe it, as
/// Kafka's controller answers (the id alone tells nothing more).
#[test]
fn delete_topics_by_id_names_the_refused_topic_to_who_may_describe_it() {
    use kafka_protocol::messages::DeleteTopicsResponse;
    let (redis, ketch, mut admin) = admin_and_alice();
    let (seen, hidden) = (unique_topic("seen"), unique_topic("hidden"));
    for topic in [&seen, &hidden] {
        assert_eq!(ketch_tests::raw::create_topic(&mut admin, topic, 1), 0);
    }
    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![acl(TOPIC, &seen, "User:alice", DESCRIBE)]),
    );
    assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    let ids = [&seen, &hidden].map(|topic| ketch_tests::raw::topic_id(&mut admin, topic).expect("an id"));
    let mut alice = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    let response: DeleteTopicsResponse = alice.request(
        6,
        &ketch_tests::raw::delete_topics_request(&[(None, Some(ids[0])), (None, Some(ids[1]))]),
    );
    let results: Vec<(i16, Option<String>)> = response
        .responses
        .iter()
        .map(|r| (r.error_code, r.name.as_ref().map(|n| n.to_string())))
        .collect();
    assert_eq!(
        results,
        [(29, Some(seen.clone())), (29, None)],
        "TOPIC_AUTHORIZATION_FAILED"
    );
    assert!(redis.topic_exists(&seen) && redis.topic_exists(&hidden));
}

/// AlterUserScramCredentials answers each user once, as Kafka's
/// controller does: a user whose first alteration is refused keeps that
/// error (not DUPLICATE_RESOURCE), a user named again after an accepted
/// one gets DUPLICATE_RESOURCE and no change, and the alterations accepted
/// are made (together, in one write).
#[test]
fn scram_alterations_keep_a_users_first_error_and_make_the_accepted_ones() {
    use kafka_protocol::messages::alter_user_scram_credentials_request::{
        ScramCredentialDeletion, ScramCredentialUpsertion,
    };
    use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
    use kafka_protocol::messages::{AlterUserScramCredentialsRequest, DescribeUserScramCredentialsRequest};
    const SCRAM_SHA_256: i8 = 1;
    let (_redis, _ketch, mut admin) = admin_and_alice();
    let upsert = |name: &str, iterations: i32| {
        ScramCredentialUpsertion::default()
            .with_name(s(name))
            .with_mechanism(SCRAM_SHA_256)
            .with_iterations(iterations)
            .with_salt(Bytes::from_static(b"some salt"))
            .with_salted_password(Bytes::from(vec![7u8; 32]))
    };
    let request = AlterUserScramCredentialsRequest::default()
        .with_deletions(vec![
            ScramCredentialDeletion::default()
                .with_name(s("carol"))
                .with_mechanism(SCRAM_SHA_256),
        ])
        .with_upsertions(vec![
            upsert("carol", 4096),
            upsert("dave", 4096),
            upsert("erin", 1),
            upsert("frank", 4096),
            upsert("frank", 8192),
        ]);
    let response = admin.request(0, &request);
    let mut results: Vec<(String, i16)> = response
        .results
        .iter()
        .map(|r| (r.user.to_string(), r.error_code))
        .collect();
    results.sort();
    let expected = [
        ("carol", 91), // RESOURCE_NOT_FOUND: its first alteration's error
        ("dave", 0),
        ("erin", 93),  // UNACCEPTABLE_CREDENTIAL
        ("frank", 92), // DUPLICATE_RESOURCE
    ]
    .map(|(user, code)| (user.to_owned(), code));
    assert_eq!(results, expected);
    let described = admin.request(
        0,
        &DescribeUserScramCredentialsRequest::default().with_users(Some(
            ["carol", "dave", "erin", "frank"]
                .into_iter()
                .map(|name| UserName::default().with_name(s(name)))
                .collect(),
        )),
    );
    let mut stored: Vec<(String, i16)> = described
        .results
        .iter()
        .map(|r| (r.user.to_string(), r.error_code))
        .collect();
    stored.sort();
    assert_eq!(
        stored,
        [("carol", 91), ("dave", 0), ("erin", 91), ("frank", 91)].map(|(user, code)| (user.to_owned(), code)),
        "only dave's credential was stored"
    );
}

/// An ACL change after a failover that lost the last one (the promoted
/// replica's ACL version is behind) reaches every gateway: a gateway that
/// held the lost change's version must not take the new change's version
/// for its own (with a plain counter the two were equal, and that gateway
/// enforced the lost ACL and not the new one until the next change).
#[test]
fn an_acl_change_after_a_failover_that_lost_one_reaches_every_gateway() {
    let (redis, a, mut admin) = admin_and_alice();
    let b = Ketch::start(&redis.url(), SECURE);
    let (lost, kept) = (unique_topic("lost"), unique_topic("kept"));
    for topic in [&lost, &kept] {
        assert_eq!(ketch_tests::raw::create_topic(&mut admin, topic, 1), 0);
    }
    // What a replica has before the change a failover loses.
    let mut conn = redis.connection();
    let version: Option<String> = redis::cmd("GET")
        .arg("ketch:{security}:version")
        .query(&mut conn)
        .unwrap();
    let acls: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg("ketch:{security}:acls")
        .query(&mut conn)
        .unwrap();
    let described = |ketch: &Ketch, topic: &str| -> i16 {
        let mut alice = plain_conn(ketch, "alice", "alice-pw").expect("alice authenticates");
        let request = MetadataRequest::default().with_topics(Some(vec![
            kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                .with_name(Some(ketch_tests::raw::topic_name(topic))),
        ]));
        alice.request(12, &request).topics[0].error_code
    };
    let await_described = |ketch: &Ketch, topic: &str, code: i16| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while described(ketch, topic) != code {
            assert!(Instant::now() < deadline, "{topic} never answered {code}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let create = |admin: &mut KafkaConn, topic: &str| {
        let created = admin.request(
            3,
            &CreateAclsRequest::default().with_creations(vec![acl(TOPIC, topic, "User:alice", DESCRIBE)]),
        );
        assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    };
    create(&mut admin, &lost);
    await_described(&b, &lost, 0);
    // The failover: Redis goes back to what the replica had.
    let mut restore = redis::pipe();
    restore.atomic().del("ketch:{security}:acls").ignore();
    match &version {
        Some(version) => restore.set("ketch:{security}:version", version).ignore(),
        None => restore.del("ketch:{security}:version").ignore(),
    };
    if !acls.is_empty() {
        restore.hset_multiple("ketch:{security}:acls", &acls).ignore();
    }
    let () = restore.query(&mut conn).unwrap();
    // The next change, through the other gateway: b loads it.
    create(&mut admin, &kept);
    await_described(&b, &kept, 0);
    assert_eq!(described(&b, &lost), 29, "the lost ACL is not enforced");
    drop(a);
}

const ILLEGAL_SASL_STATE: i16 = 34;

/// SaslHandshake on an authenticated connection, as a re-authenticating
/// client sends it: the error code and the offered mechanisms.
fn rehandshake(conn: &mut KafkaConn, version: i16) -> (i16, Vec<String>) {
    let handshake = conn.request(
        version,
        &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")),
    );
    (
        handshake.error_code,
        handshake.mechanisms.iter().map(|m| m.to_string()).collect(),
    )
}

/// Whether the connection still answers a Metadata request.
fn still_served(conn: &mut KafkaConn) -> bool {
    !conn.request(12, &MetadataRequest::default()).brokers.is_empty()
}

/// After authentication SASL requests are answered as Kafka answers them,
/// and the connection goes on: without a session lifetime
/// (`sasl.connections_max_reauth` unset) there is no re-authentication
/// (KIP-368), so a SaslHandshake is ILLEGAL_SASL_STATE, without mechanisms;
/// a SaslAuthenticate is ILLEGAL_SASL_STATE with Kafka's message.
#[test]
fn sasl_requests_after_authentication_are_refused_and_the_connection_kept() {
    use kafka_protocol::messages::ApiVersionsRequest;
    let redis = TestRedis::start();
    let (ok, out) = users(&redis.url(), &["set", "alice"], "alice-pw\n");
    assert!(ok, "{out}");
    let ketch = Ketch::start(&redis.url(), SECURE);
    let mut conn = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    for version in [1, 0] {
        assert_eq!(
            rehandshake(&mut conn, version),
            (ILLEGAL_SASL_STATE, vec![]),
            "SaslHandshake v{version}"
        );
        assert!(still_served(&mut conn), "SaslHandshake v{version}");
    }
    for version in [0, 1, 2] {
        let answer = conn.request(
            version,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"\0alice\0alice-pw")),
        );
        assert_eq!(answer.error_code, ILLEGAL_SASL_STATE, "{answer:?}");
        assert_eq!(
            answer.error_message.map(|m| m.to_string()).as_deref(),
            Some("SaslAuthenticate request received after successful authentication")
        );
        assert_eq!(
            conn.request(0, &ApiVersionsRequest::default()).error_code,
            0,
            "SaslAuthenticate v{version}"
        );
        assert!(still_served(&mut conn), "SaslAuthenticate v{version}");
    }
}

/// With a session lifetime, a client re-authenticates on its connection
/// (the first time right after authenticating), but a re-authentication
/// that begins less than a second after the last one began is refused as
/// Kafka refuses it: ILLEGAL_SASL_STATE, and the connection goes on.
#[test]
fn a_re_authentication_within_a_second_of_the_last_is_refused_and_the_connection_kept() {
    let redis = TestRedis::start();
    let (ok, out) = users(&redis.url(), &["set", "alice"], "alice-pw\n");
    assert!(ok, "{out}");
    let mut args = SECURE.to_vec();
    args.extend_from_slice(&["--set", "sasl.connections_max_reauth=1h"]);
    let ketch = Ketch::start(&redis.url(), &args);
    let mut conn = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    let reauthenticate = |conn: &mut KafkaConn| {
        let (code, mechanisms) = rehandshake(conn, 1);
        assert_eq!(code, 0, "{mechanisms:?}");
        assert!(mechanisms.iter().any(|m| m == "PLAIN"), "{mechanisms:?}");
        let answer = conn.request(
            2,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"\0alice\0alice-pw")),
        );
        assert_eq!(answer.error_code, 0, "{answer:?}");
        assert!(
            (3_500_000..=3_600_000).contains(&answer.session_lifetime_ms),
            "{answer:?}"
        );
    };
    reauthenticate(&mut conn);
    let began = Instant::now();
    assert!(still_served(&mut conn));
    assert_eq!(rehandshake(&mut conn, 1), (ILLEGAL_SASL_STATE, vec![]));
    assert!(
        still_served(&mut conn),
        "a refused re-authentication closed the connection"
    );
    std::thread::sleep(Duration::from_millis(1100).saturating_sub(began.elapsed()));
    reauthenticate(&mut conn);
    assert!(still_served(&mut conn));
}

/// Malformed SASL messages fail as with Kafka: SCRAM's with its generic
/// message, which tells nothing of what was wrong with the message (that
/// is logged), PLAIN's with PlainSaslServer's.
#[test]
fn malformed_sasl_messages_are_told_kafkas_generic_failure() {
    let redis = TestRedis::start();
    let (ok, out) = users(&redis.url(), &["set", "alice"], "alice-pw\n");
    assert!(ok, "{out}");
    let ketch = Ketch::start(&redis.url(), SECURE);
    let fail = |mechanism: &str, token: &'static [u8]| -> String {
        let mut conn = KafkaConn::connect(ketch.kafka_addr());
        let handshake = conn.request(1, &SaslHandshakeRequest::default().with_mechanism(s(mechanism)));
        assert_eq!(handshake.error_code, 0);
        let answer = conn.request(
            2,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(token)),
        );
        assert_eq!(answer.error_code, SASL_AUTHENTICATION_FAILED, "{answer:?}");
        conn.assert_closed();
        answer.error_message.map(|m| m.to_string()).unwrap_or_default()
    };
    for token in [
        &b"\xff\xfe garbage"[..],
        b"n,,r=no-user-name",
        b"p=tls-unique,,n=alice,r=abc",
        b"n,,n=al=ice,r=abc",
    ] {
        assert_eq!(
            fail("SCRAM-SHA-512", token),
            "Authentication failed during authentication due to invalid credentials with SASL mechanism \
             SCRAM-SHA-512",
            "{token:?}"
        );
    }
    assert_eq!(
        fail("PLAIN", b"alice"),
        "Invalid SASL/PLAIN response: expected 3 tokens, got 1"
    );
    // Why is logged.
    ketch.await_log("invalid SCRAM client-first message", Duration::from_secs(5));
}

/// ACLs on a user's delegation tokens (`kafka-acls.sh --user-principal …
/// --operation CreateTokens`: resource type USER, operations CREATE_TOKENS
/// and DESCRIBE_TOKENS) and on DELEGATION_TOKEN resources are taken,
/// listed and deleted, as Kafka takes any operation on any resource type
/// (a tool copying a Kafka cluster's ACLs got INVALID_REQUEST); ketch has
/// no delegation tokens, so nothing checks them.
#[test]
fn acls_on_delegation_tokens_are_kept_listed_and_deleted() {
    use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
    use kafka_protocol::messages::{DeleteAclsRequest, DescribeAclsRequest};
    const USER: i8 = 7;
    const DELEGATION_TOKEN: i8 = 6;
    const CREATE_TOKENS: i8 = 13;
    const DESCRIBE_TOKENS: i8 = 14;
    let (_redis, _ketch, mut admin) = admin_and_alice();
    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![
            acl(USER, "User:bob", "User:alice", CREATE_TOKENS),
            acl(DELEGATION_TOKEN, "token-1", "User:alice", DESCRIBE),
        ]),
    );
    let codes: Vec<i16> = created.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [0, 0], "{created:?}");
    let described = |admin: &mut KafkaConn, resource_type: i8, operation: i8| {
        let filter = DescribeAclsRequest::default()
            .with_resource_type_filter(resource_type)
            .with_resource_name_filter(None)
            .with_pattern_type_filter(1)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_operation(operation)
            .with_permission_type(1);
        let response = admin.request(3, &filter);
        assert_eq!(response.error_code, 0, "{response:?}");
        response
            .resources
            .iter()
            .map(|r| (r.resource_type, r.resource_name.to_string(), r.acls.len()))
            .collect::<Vec<_>>()
    };
    // The gateway holds them once DescribeAcls answers from them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while described(&mut admin, USER, 1).is_empty() {
        assert!(Instant::now() < deadline, "the ACLs never reached the gateway");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        described(&mut admin, USER, CREATE_TOKENS),
        [(USER, "User:bob".to_owned(), 1)]
    );
    assert_eq!(described(&mut admin, 1, DESCRIBE_TOKENS), []);
    assert_eq!(
        described(&mut admin, DELEGATION_TOKEN, 1),
        [(DELEGATION_TOKEN, "token-1".to_owned(), 1)]
    );
    let delete = |admin: &mut KafkaConn, resource_type: i8, operation: i8| {
        let filter = DeleteAclsFilter::default()
            .with_resource_type_filter(resource_type)
            .with_resource_name_filter(None)
            .with_pattern_type_filter(1)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_operation(operation)
            .with_permission_type(1);
        let response = admin.request(3, &DeleteAclsRequest::default().with_filters(vec![filter]));
        let result = &response.filter_results[0];
        assert_eq!(result.error_code, 0, "{response:?}");
        result.matching_acls.len()
    };
    assert_eq!(delete(&mut admin, 1, DESCRIBE_TOKENS), 0);
    assert_eq!(delete(&mut admin, USER, 1), 1);
    assert_eq!(delete(&mut admin, DELEGATION_TOKEN, 1), 1);
}

/// Before SASL authentication Kafka answers one ApiVersions, then only the
/// handshake: a second ApiVersions, or one between the handshake and the
/// authentication, closes the connection (a client that never
/// authenticates held its connection open with one every few minutes).
/// After authentication ApiVersions is answered any number of times. The
/// same for one of a version the gateway lacks, as Kafka's authenticator
/// checks its state before the version.
#[test]
fn api_versions_is_answered_once_before_sasl_authentication() {
    use kafka_protocol::messages::ApiVersionsRequest;
    let redis = TestRedis::start();
    let (ok, out) = users(&redis.url(), &["set", "alice"], "alice-pw\n");
    assert!(ok, "{out}");
    let ketch = Ketch::start(&redis.url(), SECURE);

    let mut twice = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(twice.request(0, &ApiVersionsRequest::default()).error_code, 0);
    twice.send(0, &ApiVersionsRequest::default());
    twice.assert_closed();

    let mut mid_exchange = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(
        mid_exchange.request(0, &ApiVersionsRequest::default()).error_code,
        0
    );
    let handshake = mid_exchange.request(1, &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")));
    assert_eq!(handshake.error_code, 0);
    mid_exchange.send(0, &ApiVersionsRequest::default());
    mid_exchange.assert_closed();

    // One refused (v3 without the client's software name) does not count.
    let mut refused_first = KafkaConn::connect(ketch.kafka_addr());
    assert_eq!(
        refused_first
            .request(3, &ApiVersionsRequest::default())
            .error_code,
        42
    );
    assert_eq!(
        refused_first
            .request(0, &ApiVersionsRequest::default())
            .error_code,
        0
    );
    let handshake = refused_first.request(1, &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")));
    assert_eq!(handshake.error_code, 0);

    // One of a version the gateway lacks is answered UNSUPPORTED_VERSION
    // where an ApiVersions would be, and closes the connection where one
    // would (it used to be answered then too).
    let newer = |conn: &mut KafkaConn| {
        let mut frame = conn.frame(0, &ApiVersionsRequest::default());
        frame[6..8].copy_from_slice(&99i16.to_be_bytes());
        conn.send_raw(&frame).expect("send");
    };
    let mut first = KafkaConn::connect(ketch.kafka_addr());
    newer(&mut first);
    let (_, answer) = first.receive_next::<ApiVersionsRequest>(0);
    assert_eq!(answer.error_code, 35, "UNSUPPORTED_VERSION");
    assert_eq!(first.request(0, &ApiVersionsRequest::default()).error_code, 0);
    newer(&mut first);
    first.assert_closed();
    let mut mid_exchange = KafkaConn::connect(ketch.kafka_addr());
    let handshake = mid_exchange.request(1, &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")));
    assert_eq!(handshake.error_code, 0);
    newer(&mut mid_exchange);
    mid_exchange.assert_closed();

    let mut authenticated = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    newer(&mut authenticated);
    let (_, answer) = authenticated.receive_next::<ApiVersionsRequest>(0);
    assert_eq!(answer.error_code, 35, "answered once authenticated");
    for _ in 0..3 {
        assert_eq!(
            authenticated
                .request(0, &ApiVersionsRequest::default())
                .error_code,
            0
        );
    }
}

/// The internal secret gateways prove to each other, lost from Redis (a
/// failover before it was replicated, a restore, an operator's deletion)
/// and made anew by a gateway that starts then: the running gateways take
/// the new one up, so group requests forwarded between them and the new
/// gateway go through again, both ways. Each gateway used to read the
/// secret once, and forwarding between the old gateways and the new one
/// failed (COORDINATOR_NOT_AVAILABLE) until every gateway restarted.
#[test]
fn a_lost_internal_secret_made_anew_is_taken_up_by_the_running_gateways() {
    use kafka_protocol::messages::{FindCoordinatorRequest, GroupId, HeartbeatRequest};

    let redis = TestRedis::start();
    let (ok, out) = users(&redis.url(), &["set", "admin"], "admin-pw\n");
    assert!(ok, "{out}");
    let args: Vec<&str> = SECURE
        .iter()
        .copied()
        .chain([
            "--set",
            "cluster.heartbeat_interval=100ms",
            "--set",
            "cluster.node_timeout=1500ms",
        ])
        .collect();
    let first = Ketch::start(&redis.url(), &args);
    let second = Ketch::start(&redis.url(), &args);
    for gateway in [&first, &second] {
        gateway.await_log("nodes=[0, 1]", Duration::from_secs(20));
    }
    // A group `by` coordinates, and the error of a heartbeat for it sent to
    // `via`: UNKNOWN_MEMBER_ID once forwarded to the coordinator.
    let coordinated_by = |via: &Ketch, by: &Ketch| {
        let mut conn = plain_conn(via, "admin", "admin-pw").expect("admin authenticates");
        (0..10_000)
            .map(|n| format!("secret-{n}"))
            .find(|group| {
                let found = conn.request(3, &FindCoordinatorRequest::default().with_key(s(group)));
                found.port == i32::from(by.kafka_addr().port())
            })
            .expect("a group it coordinates")
    };
    let heartbeat = |via: &Ketch, group: &str| {
        let mut conn = plain_conn(via, "admin", "admin-pw").expect("admin authenticates");
        let request = HeartbeatRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_generation_id(1)
            .with_member_id(s("nobody"));
        conn.request(4, &request).error_code
    };
    const UNKNOWN_MEMBER_ID: i16 = 25;
    let forwarded = |via: &Ketch, group: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let error = heartbeat(via, group);
            if error == UNKNOWN_MEMBER_ID {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "still {error} through {}",
                via.kafka_addr()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let group = coordinated_by(&first, &second);
    assert_eq!(heartbeat(&first, &group), UNKNOWN_MEMBER_ID, "forwarded");

    let _: i64 = redis::cmd("DEL")
        .arg("ketch:{security}:internal-secret")
        .query(&mut redis.connection())
        .expect("DEL");
    let third = Ketch::start(&redis.url(), &args);
    for gateway in [&first, &second, &third] {
        gateway.await_log("nodes=[0, 1, 2]", Duration::from_secs(20));
    }
    forwarded(&first, &coordinated_by(&first, &third));
    forwarded(&third, &coordinated_by(&third, &second));

    // An operator replaces the secret (SET, as security.md says): the
    // gateways take the new one up.
    let _: () = redis::cmd("SET")
        .arg("ketch:{security}:internal-secret")
        .arg(&[7u8; 32][..])
        .query(&mut redis.connection())
        .expect("SET");
    forwarded(&second, &coordinated_by(&second, &first));
    forwarded(&first, &coordinated_by(&first, &third));
    let held: Vec<u8> = redis::cmd("GET")
        .arg("ketch:{security}:internal-secret")
        .query(&mut redis.connection())
        .expect("GET");
    assert_eq!(held, [7u8; 32], "the operator's secret stays");
}

/// A Produce naming a transactional id but carrying no transactional
/// records is not checked against that id, as Kafka checks it only for
/// transactional records: WRITE on the topic is enough.
#[test]
fn a_produce_without_transactional_records_needs_no_acl_on_the_id_it_names() {
    use kafka_protocol::messages::TransactionalId;
    use ketch_tests::batch::{self, Record};
    let (_redis, ketch, mut admin) = admin_and_alice();
    let topic = unique_topic("plain-with-id");
    assert_eq!(ketch_tests::raw::create_topic(&mut admin, &topic, 1), 0);
    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![acl(TOPIC, &topic, "User:alice", WRITE)]),
    );
    assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    let mut alice = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    let request =
        ketch_tests::raw::produce_request(&topic, 0, batch::encode(&[Record::value(batch::at(0), b"plain")]))
            .with_transactional_id(Some(TransactionalId(s("not-alices"))));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (error, offset) = ketch_tests::raw::produce_result(&alice.request(9, &request));
        if error == 0 {
            assert_eq!(offset, 0);
            break;
        }
        // TOPIC_AUTHORIZATION_FAILED until the ACL reaches the gateway.
        assert_eq!(error, 29, "the request is refused");
        assert!(Instant::now() < deadline, "the ACL never reached the gateway");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Behind a TCP load balancer that writes a PROXY protocol header first
/// (HAProxy's `send-proxy-v2`, `broker.proxy_protocol_listeners`), ACL
/// hosts are the clients' own addresses: a DENY for one client's address
/// refuses that client and not another. Without the header every client
/// came from the balancer's address, and the DENY matched no one. A
/// connection that bypasses the balancer (no header) is closed.
#[test]
fn behind_a_proxy_protocol_balancer_acl_hosts_are_the_clients_addresses() {
    use kafka_protocol::messages::MetadataResponse;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    const DESCRIBE: i8 = 8;
    let redis = TestRedis::start();
    for (user, password) in [("admin", "admin-pw"), ("alice", "alice-pw")] {
        let (ok, out) = users(&redis.url(), &["set", user], &format!("{password}\n"));
        assert!(ok, "{out}");
    }
    let mut args = SECURE.to_vec();
    args.extend(["--set", "broker.proxy_protocol_listeners=*"]);
    let ketch = Ketch::start(&redis.url(), &args);
    let lb = ketch_tests::servers::Haproxy::start_sending_proxy_headers(free_port(), &[ketch.kafka_addr()]);
    let through = |from: [u8; 4], user: &str, password: &str| {
        let conn = KafkaConn::connect_from(std::net::IpAddr::from(from), lb.addr());
        plain_conn_over(conn, user, password).expect("authenticated")
    };
    let topic = unique_topic("proxied");
    let mut admin = through([127, 0, 0, 1], "admin", "admin-pw");
    assert_eq!(ketch_tests::raw::create_topic(&mut admin, &topic, 1), 0);
    let created = admin.request(
        3,
        &CreateAclsRequest::default().with_creations(vec![
            acl(TOPIC, &topic, "User:alice", DESCRIBE),
            acl(TOPIC, &topic, "User:alice", DESCRIBE)
                .with_host(s("127.0.0.2"))
                .with_permission_type(2),
        ]),
    );
    assert!(created.results.iter().all(|r| r.error_code == 0), "{created:?}");
    let described = |conn: &mut KafkaConn| -> i16 {
        let request = MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(ketch_tests::raw::topic_name(&topic))),
        ]));
        let response: MetadataResponse = conn.request(12, &request);
        response.topics[0].error_code
    };
    let mut elsewhere = through([127, 0, 0, 3], "alice", "alice-pw");
    let deadline = Instant::now() + Duration::from_secs(10);
    while described(&mut elsewhere) != 0 {
        assert!(Instant::now() < deadline, "the ACLs never reached the gateway");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut denied = through([127, 0, 0, 2], "alice", "alice-pw");
    assert_eq!(
        described(&mut denied),
        29,
        "TOPIC_AUTHORIZATION_FAILED from the denied host"
    );

    // Around the balancer, without a header: closed before any answer.
    let mut direct = std::net::TcpStream::connect(ketch.kafka_addr()).expect("connect");
    direct
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("read timeout");
    let frame = [0u8, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 255, 255];
    let _ = direct.write_all(&frame);
    let mut answer = Vec::new();
    let read = direct.read_to_end(&mut answer);
    assert!(
        read.is_err() || answer.is_empty(),
        "a connection without a PROXY header was answered: {answer:?}"
    );
    ketch.await_log("expects a PROXY protocol header", Duration::from_secs(10));
}

/// (Incremental)AlterConfigs checks the request's own faults before
/// authorization, as Kafka's `ConfigAdminManager.preprocess` does: a client
/// without ALTER_CONFIGS sending duplicate keys or a null value is told
/// INVALID_REQUEST, not TOPIC_AUTHORIZATION_FAILED. Broker loggers are
/// authorized on the cluster (CLUSTER_AUTHORIZATION_FAILED), then refused.
#[test]
fn config_requests_are_checked_before_they_are_authorized() {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
    const BROKER_LOGGER: i8 = 8;
    let (_redis, ketch, mut admin) = admin_and_alice();
    let topic = unique_topic("config-order");
    assert_eq!(ketch_tests::raw::create_topic(&mut admin, &topic, 1), 0);
    let mut alice = plain_conn(&ketch, "alice", "alice-pw").expect("alice authenticates");
    let alter = |resource_type: i8, name: &str, configs: Vec<AlterableConfig>| {
        IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(resource_type)
                .with_resource_name(s(name))
                .with_configs(configs),
        ])
    };
    let set = |name: &str, value: Option<&str>| {
        AlterableConfig::default()
            .with_name(s(name))
            .with_config_operation(0)
            .with_value(value.map(s))
    };
    let answer = |conn: &mut KafkaConn, request: &IncrementalAlterConfigsRequest| -> i16 {
        let response: IncrementalAlterConfigsResponse = conn.request(1, request);
        response.responses[0].error_code
    };
    let duplicated = alter(
        TOPIC,
        &topic,
        vec![set("retention.ms", Some("1")), set("retention.ms", Some("2"))],
    );
    assert_eq!(answer(&mut alice, &duplicated), 42, "INVALID_REQUEST");
    let null = alter(TOPIC, &topic, vec![set("retention.ms", None)]);
    assert_eq!(answer(&mut alice, &null), 42, "INVALID_REQUEST");
    let valid = alter(TOPIC, &topic, vec![set("retention.ms", Some("3600000"))]);
    assert_eq!(answer(&mut alice, &valid), 29, "TOPIC_AUTHORIZATION_FAILED");
    let logger = alter(BROKER_LOGGER, "0", vec![set("kafka", Some("DEBUG"))]);
    assert_eq!(answer(&mut alice, &logger), 31, "CLUSTER_AUTHORIZATION_FAILED");
    assert_eq!(answer(&mut admin, &logger), 42, "INVALID_REQUEST once authorized");
    let describe = DescribeConfigsRequest::default().with_resources(vec![
        DescribeConfigsResource::default()
            .with_resource_type(BROKER_LOGGER)
            .with_resource_name(s("0")),
    ]);
    let described: DescribeConfigsResponse = alice.request(4, &describe);
    assert_eq!(
        described.results[0].error_code, 31,
        "CLUSTER_AUTHORIZATION_FAILED"
    );
}
