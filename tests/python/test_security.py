"""Security end to end: TLS and mutual TLS listeners, SASL (SCRAM-SHA-256/512,
PLAIN, OAUTHBEARER, KIP-368 re-authentication), SCRAM users (`ketch users`
and AlterUserScramCredentials), ACLs (checked by every API, changed through
one gateway and seen by another), named listeners, certificate reload, and
malformed input on the SASL path.

Real clients (confluent-kafka / librdkafka, kafka-python) wherever a client
can show the behaviour; raw Kafka framing over a socket where only the
protocol can (session lifetimes, malformed SASL frames, the mechanisms a
listener offers). Certificates are made once per module with `openssl`, JWTs
with `cryptography` (ES256).
"""

import base64
import hashlib
import hmac
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import ssl
import struct
import tempfile
import threading
import time

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from conftest import FAST_GROUP_SETTINGS, Pki, ketch_users, start_ketch, stop_ketch

ADMIN_PASSWORD = "admin-secret"
ALICE_PASSWORD = "alice-secret"
ACLS = ("acl.enabled=true", "acl.super_users=admin")


@pytest.fixture(scope="module")
def pki():
    """A CA, a server certificate for localhost/127.0.0.1, client
    certificates for alice (OU=eng), bob (OU=ops) and admin signed by it,
    and a client certificate for alice signed by another CA."""
    with tempfile.TemporaryDirectory(prefix="ketch-pki-") as directory:
        p = Pki(directory)
        p.ca_cert, p.ca_key = p.ca("ca", "/O=Example/CN=Ketch Test CA")
        ca = (p.ca_cert, p.ca_key)
        p.server_cert, p.server_key, p.server_serial = p.issue("server", "/CN=localhost", ca, "server")
        p.alice = p.issue("alice", "/O=Example/OU=eng/CN=Alice", ca, "client")[:2]
        p.bob = p.issue("bob", "/O=Example/OU=ops/CN=bob", ca, "client")[:2]
        p.admin = p.issue("admin", "/O=Example/OU=eng/CN=admin", ca, "client")[:2]
        rogue_ca = p.ca("rogue-ca", "/O=Example/CN=Ketch Test CA")
        p.rogue_alice = p.issue("rogue-alice", "/O=Example/OU=eng/CN=Alice", rogue_ca, "client")[:2]
        yield p


def tls_settings(pki, *extra):
    return (f"tls.cert_file={pki.server_cert}", f"tls.key_file={pki.server_key}", *extra)


# --- gateways and users -----------------------------------------------------


@pytest.fixture
def gateways(redis_url):
    """A factory starting gateways on the test's Redis (start_ketch's
    arguments, FAST_GROUP_SETTINGS added to `settings`); each is stopped at
    teardown (SIGTERM, must exit 0) and its log printed."""
    started = []

    def start(settings=(), **kwargs):
        gateway = start_ketch(redis_url, settings=(*FAST_GROUP_SETTINGS, *settings), **kwargs)
        started.append(gateway)
        return gateway

    try:
        yield start
    finally:
        errors = [e for e in map(stop_ketch, started) if e is not None]
        assert not errors, errors


def log_of(gateway):
    return gateway.process.output()


def wait_for_log(gateway, text, count=1, timeout=5):
    """Waits until the gateway's log holds `text` at least `count` times
    (its output is read by a thread, a moment behind)."""
    wait_until(lambda: log_of(gateway).count(text) >= count, timeout,
               lambda: f"no {count} x {text!r} in the log:\n{log_of(gateway)}")


def wait_until(condition, timeout, message):
    """Polls `condition` until it returns a true value (returned) or
    `timeout` seconds pass (AssertionError with `message`, a string or a
    callable making one)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message() if callable(message) else message)
        time.sleep(0.05)


# --- client configurations --------------------------------------------------


def sasl_config(address, user, password, mechanism="SCRAM-SHA-512", protocol="SASL_SSL", pki=None):
    config = {
        "bootstrap.servers": address,
        "security.protocol": protocol,
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }
    if protocol == "SASL_SSL":
        config["ssl.ca.location"] = str(pki.ca_cert)
    return config


def ssl_config(address, pki, cert=None):
    config = {"bootstrap.servers": address, "security.protocol": "SSL", "ssl.ca.location": str(pki.ca_cert)}
    if cert is not None:
        config["ssl.certificate.location"] = str(cert[0])
        config["ssl.key.location"] = str(cert[1])
    return config


def first_error(config, timeout=15):
    """Connects a client with `config` and asks for Metadata until it either
    succeeds (returns None) or the client reports an error (returned, a
    KafkaError)."""
    errors = []
    admin = AdminClient({**config, "error_cb": errors.append, "reconnect.backoff.max.ms": 200})
    deadline = time.monotonic() + timeout
    while not errors:
        try:
            admin.list_topics(timeout=1)
            return None
        except KafkaException:
            admin.poll(0.1)  # serves error_cb
        assert time.monotonic() < deadline, "the client neither connected nor reported an error"
    return errors[0]


def produce(config, topic, values, timeout=20):
    """Produces `values` to partition 0 of `topic`; returns each delivery's
    error (None when delivered)."""
    results = []
    producer = Producer({**config, "linger.ms": 0, "message.timeout.ms": 10000})
    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=lambda err, msg: results.append(err))
    assert producer.flush(timeout) == 0, "deliveries still outstanding"
    return results


def consume(config, topic, group, count, timeout=20):
    """Subscribes to `topic` in `group` and reads until `count` values
    arrived (committing them) or an error is reported; returns (values,
    error code or None)."""
    consumer = Consumer(
        {
            **config,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    values = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(values) < count:
            assert time.monotonic() < deadline, f"consumed {len(values)} of {count} from {topic}"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                return values, msg.error().code()
            values.append(msg.value())
        if values:
            consumer.commit(asynchronous=False)
        return values, None
    finally:
        consumer.close()


def fetch_error(config, topic, group, timeout=15):
    """Assigns partition 0 of `topic` (no subscription) and polls until the
    consumer reports an error; returns its code."""
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error():
                return msg.error().code()
            assert msg is None, f"read {msg.value()!r} from {topic}"
        raise AssertionError(f"no error reading {topic}")
    finally:
        consumer.close()


def visible_topics(config):
    return set(AdminClient(config).list_topics(timeout=10).topics)


def acl(resource_type, name, principal, operation, permission=AclPermissionType.ALLOW,
        pattern=ResourcePatternType.LITERAL):
    return AclBinding(resource_type, name, pattern, principal, "*", operation, permission)


def create_acls(admin, bindings):
    for future in admin.create_acls(bindings).values():
        future.result(15)


def create_topics(admin, names, partitions=1):
    for future in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).values():
        future.result(15)


def error_code(future):
    with pytest.raises(KafkaException) as raised:
        future.result(15)
    return raised.value.args[0].code()


# --- Kafka framing over a raw socket ----------------------------------------


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def kstring(s):
    b = s.encode()
    return i16(len(b)) + b


def kbytes(b):
    return i32(len(b)) + b


def uvarint(n):
    out = b""
    while True:
        if n < 0x80:
            return out + bytes([n])
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        assert self.pos + n <= len(self.data), "response too short"
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def i16(self):
        return struct.unpack(">h", self.take(2))[0]

    def i32(self):
        return struct.unpack(">i", self.take(4))[0]

    def i64(self):
        return struct.unpack(">q", self.take(8))[0]

    def uvarint(self):
        shift = value = 0
        while True:
            b = self.take(1)[0]
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7

    def string(self):
        n = self.i16()
        return None if n < 0 else self.take(n).decode()

    def bytes(self):
        n = self.i32()
        return None if n < 0 else self.take(n)

    def compact_bytes(self):
        n = self.uvarint() - 1
        return None if n < 0 else self.take(n)

    def tagged(self):
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


API_VERSIONS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 3, 17, 36
SASL_AUTHENTICATION_FAILED, ILLEGAL_SASL_STATE, UNSUPPORTED_SASL_MECHANISM = 58, 34, 33


class KafkaConnection:
    """One Kafka connection spoken by hand (optionally over TLS)."""

    def __init__(self, address, tls=None):
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock = tls.wrap_socket(sock, server_hostname="localhost") if tls else sock
        self.correlation = 0

    def close(self):
        self.sock.close()

    def send_frame(self, payload):
        self.sock.sendall(i32(len(payload)) + payload)

    def send(self, api_key, version, body, flexible=False):
        """Sends a request with header v1, or v2 when `flexible`."""
        self.correlation += 1
        header = i16(api_key) + i16(version) + i32(self.correlation) + kstring("raw-test")
        if flexible:
            header += uvarint(0)
        self.send_frame(header + body)
        return self.correlation

    def _exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the server")
            data += chunk
        return data

    def recv(self, flexible=False):
        """One response's body (after checking its correlation id)."""
        size = struct.unpack(">i", self._exact(4))[0]
        reader = Reader(self._exact(size))
        assert reader.i32() == self.correlation
        if flexible:
            reader.tagged()
        return reader

    def request(self, api_key, version, body, flexible_request=False, flexible_response=False):
        self.send(api_key, version, body, flexible_request)
        return self.recv(flexible_response)

    def closed_by_server(self, timeout=5):
        """Whether the server closes the connection within `timeout`
        seconds without sending anything more."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
            return True
        except (TimeoutError, socket.timeout):
            return False
        assert data == b"", f"the server answered {data[:64]!r} instead of closing"
        return True

    # Requests.

    def api_versions(self):
        reader = self.request(API_VERSIONS, 0, b"")
        return reader.i16()

    def metadata(self):
        """Metadata v1 for every topic: (broker ports, topic names)."""
        reader = self.request(METADATA, 1, i32(-1))
        ports = []
        for _ in range(reader.i32()):
            reader.i32()
            reader.string()
            ports.append(reader.i32())
            reader.string()
        reader.i32()  # controller
        topics = []
        for _ in range(reader.i32()):
            reader.i16()
            topics.append(reader.string())
            reader.take(1)
            for _ in range(reader.i32()):
                reader.i16()
                reader.i32()
                reader.i32()
                for _ in range(2):
                    reader.take(4 * reader.i32())
        return ports, topics

    def handshake(self, mechanism, version=1):
        """SaslHandshake: (error code, offered mechanisms)."""
        reader = self.request(SASL_HANDSHAKE, version, kstring(mechanism))
        code = reader.i16()
        return code, [reader.string() for _ in range(reader.i32())]

    def authenticate(self, token, version=1):
        """SaslAuthenticate v1 or v2: (error code, message, bytes, session
        lifetime ms)."""
        if version >= 2:
            reader = self.request(
                SASL_AUTHENTICATE, version, uvarint(len(token) + 1) + token + uvarint(0),
                flexible_request=True, flexible_response=True,
            )
            code = reader.i16()
            n = reader.uvarint() - 1
            message = None if n < 0 else reader.take(n).decode()
            auth = reader.compact_bytes()
            lifetime = reader.i64()
            reader.tagged()
            return code, message, auth, lifetime
        reader = self.request(SASL_AUTHENTICATE, version, kbytes(token))
        code, message, auth = reader.i16(), reader.string(), reader.bytes()
        lifetime = reader.i64() if version >= 1 else None
        return code, message, auth, lifetime

    def scram(self, user, password, mechanism="SCRAM-SHA-256", version=1):
        """A full SCRAM exchange (handshake included); returns the final
        SaslAuthenticate's (code, message, bytes, lifetime)."""
        code, offered = self.handshake(mechanism)
        assert code == 0, (code, offered)
        digest = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}[mechanism]
        nonce = base64.b64encode(secrets.token_bytes(18)).decode()
        first_bare = f"n={user},r={nonce}"
        code, message, server_first, _ = self.authenticate(f"n,,{first_bare}".encode(), version)
        if code != 0:
            return code, message, server_first, None
        fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
        assert fields["r"].startswith(nonce)
        salted = hashlib.pbkdf2_hmac(digest().name, password.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        without_proof = f"c=biws,r={fields['r']}"
        auth_message = f"{first_bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.new(digest(client_key).digest(), auth_message, digest).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
        return self.authenticate(final, version)


def tls_client(pki, cert=None):
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


# --- JWTs -------------------------------------------------------------------


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def es256_jwt(key, claims, kid="k1"):
    header = {"alg": "ES256", "typ": "JWT", "kid": kid}
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return f"{signing_input}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


@pytest.fixture(scope="module")
def jwt_keys():
    """The issuer's EC P-256 key (in a JWKS file as kid k1) and another key
    nobody trusts: (key, other key, JWKS path)."""
    key = ec.generate_private_key(ec.SECP256R1())
    numbers = key.public_key().public_numbers()
    jwk = {
        "kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256", "use": "sig",
        "x": b64url(numbers.x.to_bytes(32, "big")), "y": b64url(numbers.y.to_bytes(32, "big")),
    }
    with tempfile.TemporaryDirectory(prefix="ketch-jwks-") as directory:
        path = pathlib.Path(directory) / "jwks.json"
        path.write_text(json.dumps({"keys": [jwk]}))
        yield key, ec.generate_private_key(ec.SECP256R1()), path


# --- 1. SCRAM, users, ACLs --------------------------------------------------


def test_scram_users_and_acls_over_sasl_ssl(gateways, redis_url, pki):
    ketch_users(redis_url, "set", "admin", "--mechanism", "SCRAM-SHA-512", password=ADMIN_PASSWORD)
    assert "admin" in ketch_users(redis_url, "list")
    gateway = gateways(
        protocol="SASL_SSL",
        settings=(*tls_settings(pki), *ACLS, "sasl.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256"),
    )
    as_admin = sasl_config(gateway.bootstrap, "admin", ADMIN_PASSWORD, pki=pki)
    as_alice = sasl_config(gateway.bootstrap, "alice", ALICE_PASSWORD, pki=pki)
    admin = AdminClient(as_admin)

    # The super user adds alice, and sees her credential described.
    upsert = UserScramCredentialUpsertion(
        "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), ALICE_PASSWORD.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(15)
    description = admin.describe_user_scram_credentials(["alice"])["alice"].result(15)
    assert [(i.mechanism, i.iterations) for i in description.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_512, 4096)
    ]
    assert "alice" in ketch_users(redis_url, "list")
    # One alteration per user and request (Kafka's controller): a user
    # named twice is DUPLICATE_RESOURCE and gets neither change.
    twice = [
        UserScramCredentialUpsertion(
            "bob", ScramCredentialInfo(mechanism, 4096), b"bob-password"
        )
        for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
    ]
    futures = admin.alter_user_scram_credentials(twice)
    assert list(futures) == ["bob"], futures
    with pytest.raises(KafkaException) as refused:
        futures["bob"].result(15)
    assert refused.value.args[0].code() == KafkaError.DUPLICATE_RESOURCE, refused.value
    with pytest.raises(KafkaException):
        admin.describe_user_scram_credentials(["bob"])["bob"].result(15)

    create_topics(admin, ["orders", "other"])
    create_acls(
        admin,
        [
            acl(ResourceType.TOPIC, "orders", "User:alice", AclOperation.READ),
            acl(ResourceType.TOPIC, "orders", "User:alice", AclOperation.WRITE),
            acl(ResourceType.GROUP, "g1", "User:alice", AclOperation.READ),
        ],
    )
    described = admin.describe_acls(
        AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice", None,
                         AclOperation.ANY, AclPermissionType.ANY)
    ).result(15)
    assert {(b.restype, b.name, b.operation) for b in described} == {
        (ResourceType.TOPIC, "orders", AclOperation.READ),
        (ResourceType.TOPIC, "orders", AclOperation.WRITE),
        (ResourceType.GROUP, "g1", AclOperation.READ),
    }

    # Alice produces and consumes `orders` in g1; her commits are seen by admin.
    values = [f"order-{i}".encode() for i in range(10)]
    assert produce(as_alice, "orders", values) == [None] * 10
    assert consume(as_alice, "orders", "g1", 10) == (values, None)
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("g1")])["g1"].result(15)
    assert [(tp.topic, tp.partition, tp.offset) for tp in offsets.topic_partitions] == [("orders", 0, 10)]

    # She sees only `orders`, and may neither write nor read `other`, nor join g2.
    assert visible_topics(as_alice) == {"orders"}
    assert visible_topics(as_admin) >= {"orders", "other"}
    assert produce(as_alice, "other", [b"x"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert consume(as_alice, "other", "g1", 1) == ([], KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert consume(as_alice, "orders", "g2", 1) == ([], KafkaError.GROUP_AUTHORIZATION_FAILED)

    # With DESCRIBE on `other` she sees it, and Produce and Fetch themselves refuse her.
    create_acls(admin, [acl(ResourceType.TOPIC, "other", "User:alice", AclOperation.DESCRIBE)])
    wait_until(lambda: visible_topics(as_alice) == {"orders", "other"}, 5, "DESCRIBE on other is not seen")
    assert produce(as_alice, "other", [b"x"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert fetch_error(as_alice, "other", "g1") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consume(as_alice, "other", "g1", 1) == ([], KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert produce(as_admin, "other", [b"by-admin"]) == [None]

    # Alice is no super user: cluster operations are refused.
    alice_admin = AdminClient(as_alice)
    assert error_code(alice_admin.create_topics([NewTopic("alices", 1, 1)])["alices"]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    grant = acl(ResourceType.TOPIC, "other", "User:alice", AclOperation.WRITE)
    assert error_code(alice_admin.create_acls([grant])[grant]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # A DENY wins over her ALLOW, a PREFIXED pattern included.
    create_acls(admin, [acl(ResourceType.TOPIC, "ord", "User:alice", AclOperation.WRITE, AclPermissionType.DENY,
                            ResourcePatternType.PREFIXED)])
    assert produce(as_alice, "orders", [b"denied"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert "orders" in visible_topics(as_alice), "READ still implies DESCRIBE"

    # librdkafka describes the cluster with Metadata: no operations for her, all for admin.
    assert not alice_admin.describe_cluster(include_authorized_operations=True).result(15).authorized_operations
    operations = admin.describe_cluster(include_authorized_operations=True).result(15).authorized_operations
    assert {AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.CREATE} <= set(operations)


def test_transactions_over_sasl_ssl_with_acls_on_two_gateways(gateways, redis_url, pki):
    """A SCRAM user over SASL_SSL with WRITE on transactional ids prefixed
    `alice-` commits and aborts transactions through one gateway and reads
    the committed records only (read_committed) through another; a
    transactional id she has no ACL for fails init_transactions with
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
    ketch_users(redis_url, "set", "admin", "--mechanism", "SCRAM-SHA-512", password=ADMIN_PASSWORD)
    ketch_users(redis_url, "set", "alice", "--mechanism", "SCRAM-SHA-512", password=ALICE_PASSWORD)
    settings = (*tls_settings(pki), *ACLS, "sasl.mechanisms=SCRAM-SHA-512")
    one, two = (gateways(protocol="SASL_SSL", settings=settings) for _ in range(2))
    admin = AdminClient(sasl_config(one.bootstrap, "admin", ADMIN_PASSWORD, pki=pki))
    create_topics(admin, ["payments"])
    create_acls(
        admin,
        [
            acl(ResourceType.TOPIC, "payments", "User:alice", AclOperation.WRITE),
            acl(ResourceType.TOPIC, "payments", "User:alice", AclOperation.READ),
            acl(ResourceType.GROUP, "readers", "User:alice", AclOperation.READ),
            acl(ResourceType.TRANSACTIONAL_ID, "alice-", "User:alice", AclOperation.WRITE,
                pattern=ResourcePatternType.PREFIXED),
        ],
    )

    def transactional(txn_id):
        return Producer({**sasl_config(one.bootstrap, "alice", ALICE_PASSWORD, pki=pki),
                         "transactional.id": txn_id, "linger.ms": 5})

    producer = transactional("alice-payments")
    producer.init_transactions(15)
    for prefix, commit in (("committed", True), ("aborted", False)):
        producer.begin_transaction()
        for i in range(5):
            producer.produce("payments", f"{prefix}-{i}".encode(), partition=0)
        assert producer.flush(15) == 0
        (producer.commit_transaction if commit else producer.abort_transaction)(15)
    producer.close()

    refused = transactional("bob-payments")
    with pytest.raises(KafkaException) as raised:
        refused.init_transactions(15)
    assert raised.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, raised.value.args[0]

    reader = Consumer({**sasl_config(two.bootstrap, "alice", ALICE_PASSWORD, pki=pki), "group.id": "readers",
                       "isolation.level": "read_committed", "enable.auto.commit": False,
                       "enable.partition.eof": True})
    reader.assign([TopicPartition("payments", 0, 0)])
    values, deadline = [], time.monotonic() + 20
    try:
        while True:  # until the end of the partition: both markers passed
            assert time.monotonic() < deadline, f"read {values}"
            message = reader.poll(0.5)
            if message is None:
                continue
            if message.error() and message.error().code() == KafkaError._PARTITION_EOF:
                if message.offset() >= 12:  # 10 records and 2 markers
                    break
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
    finally:
        reader.close()
    assert values == [f"committed-{i}".encode() for i in range(5)]


# --- 2. failed authentication -----------------------------------------------

INVALID_CREDENTIALS = "Authentication failed during authentication due to invalid credentials with SASL mechanism "


def test_a_wrong_password_and_a_deleted_user_are_refused(gateways, redis_url):
    ketch_users(redis_url, "set", "alice", password=ALICE_PASSWORD)
    gateway = gateways(protocol="SASL_PLAINTEXT")
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        good = sasl_config(gateway.bootstrap, "alice", ALICE_PASSWORD, mechanism, "SASL_PLAINTEXT")
        assert first_error(good) is None
        error = first_error({**good, "sasl.password": "not-her-password"})
        assert error is not None and error.code() == KafkaError._AUTHENTICATION, error
        assert INVALID_CREDENTIALS + mechanism in error.str()
    wait_for_log(gateway, "SCRAM authentication failed")

    # On the wire: SASL_AUTHENTICATION_FAILED after the failure delay, then the connection closes.
    conn = KafkaConnection(gateway.bootstrap)
    started = time.monotonic()
    code, message, _, _ = conn.scram("alice", "not-her-password")
    assert (code, message) == (SASL_AUTHENTICATION_FAILED, INVALID_CREDENTIALS + "SCRAM-SHA-256")
    assert time.monotonic() - started >= 0.09, "answered before sasl.failed_authentication_delay"
    assert conn.closed_by_server()
    conn.close()

    ketch_users(redis_url, "delete", "alice")
    assert "alice" not in ketch_users(redis_url, "list")
    error = first_error(sasl_config(gateway.bootstrap, "alice", ALICE_PASSWORD, "SCRAM-SHA-256", "SASL_PLAINTEXT"))
    assert error is not None and error.code() == KafkaError._AUTHENTICATION, error
    assert INVALID_CREDENTIALS + "SCRAM-SHA-256" in error.str()
    wait_for_log(gateway, "SCRAM authentication of an unknown user")


# --- 3. PLAIN -----------------------------------------------------------------


def test_plain_works_over_tls_and_is_not_offered_without_it(gateways, redis_url, pki, topic_name):
    from kafka import KafkaConsumer, KafkaProducer

    ketch_users(redis_url, "set", "alice", password=ALICE_PASSWORD)
    gateway = gateways(listeners=[("SECURE", "SASL_SSL"), ("CLEAR", "SASL_PLAINTEXT")], settings=tls_settings(pki))
    secure, clear = gateway.listeners["SECURE"], gateway.listeners["CLEAR"]

    plain = sasl_config(secure, "alice", ALICE_PASSWORD, "PLAIN", pki=pki)
    assert produce(plain, topic_name, [b"by-librdkafka"]) == [None]
    error = first_error({**plain, "sasl.password": "not-her-password"})
    assert error is not None and error.code() == KafkaError._AUTHENTICATION, error
    # Kafka's PlainSaslServer's message.
    assert "Authentication failed: Invalid username or password" in error.str()

    # kafka-python's PLAIN, with the same credentials.
    python_config = dict(
        bootstrap_servers=secure, security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
        sasl_plain_username="alice", sasl_plain_password=ALICE_PASSWORD, ssl_cafile=str(pki.ca_cert),
    )
    producer = KafkaProducer(**python_config)
    try:
        producer.send(topic_name, b"by-kafka-python", partition=0).get(15)
    finally:
        producer.close()
    consumer = KafkaConsumer(topic_name, auto_offset_reset="earliest", consumer_timeout_ms=10000, **python_config)
    try:
        values = [record.value for _, record in zip(range(2), consumer)]
    finally:
        consumer.close()
    assert values == [b"by-librdkafka", b"by-kafka-python"]

    # ACLs are off on this gateway: CreateAcls answers SECURITY_DISABLED.
    grant = acl(ResourceType.TOPIC, topic_name, "User:alice", AclOperation.READ)
    plain_admin = AdminClient(plain)
    assert error_code(plain_admin.create_acls([grant])[grant]) == KafkaError.SECURITY_DISABLED

    # Without TLS the handshake does not offer PLAIN (and refuses it); SCRAM works there.
    tls_conn = KafkaConnection(secure, tls=tls_client(pki))
    assert tls_conn.handshake("PLAIN") == (0, ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
    tls_conn.close()
    conn = KafkaConnection(clear)
    assert conn.handshake("PLAIN") == (UNSUPPORTED_SASL_MECHANISM, ["SCRAM-SHA-256", "SCRAM-SHA-512"])
    assert conn.closed_by_server()
    conn.close()
    error = first_error(sasl_config(clear, "alice", ALICE_PASSWORD, "PLAIN", "SASL_PLAINTEXT"))
    assert error is not None and "PLAIN" in error.str(), error
    assert first_error(sasl_config(clear, "alice", ALICE_PASSWORD, "SCRAM-SHA-512", "SASL_PLAINTEXT")) is None


# --- 4. OAUTHBEARER -----------------------------------------------------------

ISSUER, AUDIENCE = "https://issuer.example", "ketch"


def oauth_config(address, pki, token, principal):
    return {
        "bootstrap.servers": address,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca_cert),
        "sasl.mechanisms": "OAUTHBEARER",
        # librdkafka checks only that the lifetime it is told lies ahead.
        "oauth_cb": lambda _config: (token, time.time() + 300, principal),
    }


def test_oauthbearer_tokens_name_the_principal_and_bad_tokens_are_refused(gateways, pki, jwt_keys):
    key, other_key, jwks = jwt_keys
    gateway = gateways(
        protocol="SASL_SSL",
        settings=(
            *tls_settings(pki),
            "sasl.mechanisms=OAUTHBEARER",
            f"sasl.oauth_jwks_file={jwks}",
            f"sasl.oauth_issuer={ISSUER}",
            f"sasl.oauth_audience={AUDIENCE}",
            "acl.enabled=true",
            "acl.super_users=ops",
        ),
    )

    def token(sub, lifetime=300, signer=key, audience=AUDIENCE):
        now = int(time.time())
        claims = {"sub": sub, "iss": ISSUER, "aud": audience, "iat": now, "exp": now + lifetime}
        return es256_jwt(signer, claims)

    ops = oauth_config(gateway.bootstrap, pki, token("ops"), "ops")
    admin = AdminClient(ops)
    create_topics(admin, ["reports", "payroll"])
    create_acls(
        admin,
        [
            acl(ResourceType.TOPIC, "reports", "User:svc-reporter", AclOperation.WRITE),
            # A PREFIXED ACL for another principal: not hers.
            acl(ResourceType.TOPIC, "pay", "User:svc-other", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
        ],
    )

    reporter = oauth_config(gateway.bootstrap, pki, token("svc-reporter"), "svc-reporter")
    assert produce(reporter, "reports", [b"r1"]) == [None]
    assert produce(reporter, "payroll", [b"p1"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert visible_topics(reporter) == {"reports"}
    other = oauth_config(gateway.bootstrap, pki, token("svc-other"), "svc-other")
    assert produce(other, "payroll", [b"p1"]) == [None]

    # A librdkafka client with an expired token fails to authenticate...
    expired = token("svc-reporter", lifetime=-3600)
    error = first_error(oauth_config(gateway.bootstrap, pki, expired, "svc-reporter"))
    assert error is not None and error.code() == KafkaError._AUTHENTICATION, error
    # ... and on the wire each bad token gets RFC 7628's error challenge; the
    # client's acknowledgement (%x01) is answered SASL_AUTHENTICATION_FAILED
    # with the same JSON (the reason is logged, never told: it would name
    # the expected issuer or audience), and the connection closed, as
    # Kafka's OAuthBearerSaslServer does.
    bad = {
        "expired": expired,
        "signed by another key": token("svc-reporter", signer=other_key),
        "for another audience": token("svc-reporter", audience="someone-else"),
        "not a JWT": "not.a.jwt",
    }
    for why, bad_token in bad.items():
        conn = KafkaConnection(gateway.bootstrap, tls=tls_client(pki))
        code, message, challenge, _ = oauth_authenticate(conn, bad_token)
        assert code == 0 and json.loads(challenge) == {"status": "invalid_token"}, (why, code, challenge)
        code, message, _, _ = conn.authenticate(b"\x01")
        assert code == SASL_AUTHENTICATION_FAILED and json.loads(message) == {"status": "invalid_token"}, (
            why, code, message)
        assert conn.closed_by_server(), why
        conn.close()
    wait_for_log(gateway, "invalid OAUTHBEARER token", count=len(bad) + 1)
    # A good one succeeds there too; its session lasts until the token
    # expires (no sasl.connections_max_reauth here, as Kafka bounds it).
    conn = KafkaConnection(gateway.bootstrap, tls=tls_client(pki))
    code, _, _, lifetime = oauth_authenticate(conn, token("svc-reporter"))
    assert code == 0 and 295_000 <= lifetime <= 300_000, (code, lifetime)
    assert conn.metadata()[0] == [int(gateway.bootstrap.rsplit(":", 1)[1])]
    conn.close()


def oauth_authenticate(conn, token):
    code, offered = conn.handshake("OAUTHBEARER")
    assert code == 0, (code, offered)
    return conn.authenticate(f"n,,\x01auth=Bearer {token}\x01\x01".encode())


# --- 5. TLS and mutual TLS ------------------------------------------------------


def refused_by_tls(address, context=None):
    """Whether a connection (plaintext when `context` is None) that sends
    ApiVersions gets no Kafka answer: the TLS handshake fails or the
    connection is closed."""
    try:
        conn = KafkaConnection(address, tls=context)
    except (ssl.SSLError, ConnectionError):
        return True
    try:
        conn.send(API_VERSIONS, 0, b"")
        conn.sock.settimeout(5)
        data = conn.sock.recv(65536)
    except (ssl.SSLError, ConnectionError):
        return True
    finally:
        conn.close()
    # Nothing, or a TLS alert record (0x15) for a plaintext client.
    return data == b"" or data[:1] == b"\x15"


MAPPING_RULES = "RULE:^CN=([^,]+),OU=eng,.*$/$1/L,DEFAULT"


def test_tls_refuses_plaintext_and_mutual_tls_names_the_principal(gateways, pki):
    gateway = gateways(
        protocol="SSL",
        settings=(
            *tls_settings(pki),
            f"tls.client_ca_file={pki.ca_cert}",
            f"tls.principal_mapping_rules={MAPPING_RULES}",
            *ACLS,
        ),
    )
    address = gateway.bootstrap

    # Plaintext on the TLS port: no Kafka answer, the client fails.
    assert refused_by_tls(address)
    error = first_error({"bootstrap.servers": address})
    assert error is not None, "a plaintext client worked on a TLS listener"
    # Without a client certificate, or with one from another CA: refused.
    assert refused_by_tls(address, tls_client(pki))
    assert refused_by_tls(address, tls_client(pki, pki.rogue_alice))
    assert first_error(ssl_config(address, pki)) is not None
    assert first_error(ssl_config(address, pki, pki.rogue_alice)) is not None
    wait_for_log(gateway, "TLS handshake failed")
    # With one from the CA: served.
    conn = KafkaConnection(address, tls=tls_client(pki, pki.alice))
    assert conn.api_versions() == 0
    conn.close()

    # CN=admin,OU=eng,... maps to admin, a super user.
    admin = AdminClient(ssl_config(address, pki, pki.admin))
    create_topics(admin, ["eng-topic", "ops-topic"])
    create_acls(
        admin,
        [
            # CN=Alice,OU=eng,O=Example: the rule, lower-cased.
            acl(ResourceType.TOPIC, "eng-topic", "User:alice", AclOperation.WRITE),
            # CN=bob,OU=ops,O=Example: no rule matches, DEFAULT keeps the RFC 2253 subject.
            acl(ResourceType.TOPIC, "ops-topic", "User:CN=bob,OU=ops,O=Example", AclOperation.WRITE),
        ],
    )
    alice = ssl_config(address, pki, pki.alice)
    bob = ssl_config(address, pki, pki.bob)
    assert produce(alice, "eng-topic", [b"a"]) == [None]
    assert produce(alice, "ops-topic", [b"a"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert visible_topics(alice) == {"eng-topic"}
    assert produce(bob, "ops-topic", [b"b"]) == [None]
    assert produce(bob, "eng-topic", [b"b"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert visible_topics(bob) == {"ops-topic"}


def test_on_sasl_ssl_the_certificate_need_not_match_a_mapping_rule(gateways, redis_url, pki):
    # Rules without DEFAULT: bob's certificate (OU=ops) matches none. On
    # SASL_SSL SASL names the principal and the rules are not applied, as in
    # Kafka's principal builder; the certificate only has to be valid.
    ketch_users(redis_url, "set", "alice", "--mechanism", "SCRAM-SHA-512", password=ALICE_PASSWORD)
    gateway = gateways(
        protocol="SASL_SSL",
        settings=(
            *tls_settings(pki),
            f"tls.client_ca_file={pki.ca_cert}",
            "tls.principal_mapping_rules=RULE:^CN=([^,]+),OU=eng,.*$/$1/L",
            "sasl.mechanisms=SCRAM-SHA-512",
        ),
    )
    config = sasl_config(gateway.bootstrap, "alice", ALICE_PASSWORD, pki=pki)
    config["ssl.certificate.location"] = str(pki.bob[0])
    config["ssl.key.location"] = str(pki.bob[1])
    assert first_error(config) is None
    # A certificate from another authority still fails the handshake.
    assert refused_by_tls(gateway.bootstrap, tls_client(pki, pki.rogue_alice))


# --- 6. KIP-368 re-authentication ---------------------------------------------------


def test_clients_reauthenticate_and_a_connection_that_does_not_is_closed(gateways, redis_url, topic_name):
    ketch_users(redis_url, "set", "alice", password=ALICE_PASSWORD)
    gateway = gateways(protocol="SASL_PLAINTEXT", settings=("sasl.connections_max_reauth=2s",))
    config = sasl_config(gateway.bootstrap, "alice", ALICE_PASSWORD, "SCRAM-SHA-512", "SASL_PLAINTEXT")

    # librdkafka produces and consumes for 3.5 session lifetimes.
    errors, delivered, consumed = [], [], []
    stop, produced_all = threading.Event(), threading.Event()

    def produce_steadily():
        producer = Producer({**config, "linger.ms": 0, "error_cb": errors.append})
        i = 0
        try:
            while not stop.is_set():
                producer.produce(topic_name, f"m{i}".encode(), partition=0,
                                 on_delivery=lambda err, msg: (errors if err else delivered).append(err or msg.value()))
                producer.poll(0.05)
                i += 1
            if producer.flush(15) != 0:
                errors.append("deliveries outstanding")
        finally:
            produced_all.set()

    def consume_steadily():
        consumer = Consumer({**config, "group.id": "reauth", "auto.offset.reset": "earliest",
                             "session.timeout.ms": 6000, "error_cb": errors.append})
        consumer.subscribe([topic_name])
        deadline = None
        try:
            while not (produced_all.is_set() and len(consumed) >= len(delivered)):
                if produced_all.is_set():
                    deadline = deadline or time.monotonic() + 10
                    if time.monotonic() > deadline:
                        break
                msg = consumer.poll(0.1)
                if msg is not None:
                    (errors.append(msg.error()) if msg.error() else consumed.append(msg.value()))
        finally:
            consumer.close()

    admin = AdminClient(config)
    create_topics(admin, [topic_name])
    threads = [threading.Thread(target=produce_steadily), threading.Thread(target=consume_steadily)]
    for t in threads:
        t.start()
    started = time.monotonic()
    try:
        # Meanwhile, by hand: the session lifetime is reported, re-authenticating extends it ...
        conn = KafkaConnection(gateway.bootstrap)
        raw_port = conn.sock.getsockname()[1]
        code, _, _, lifetime = conn.scram("alice", ALICE_PASSWORD, "SCRAM-SHA-512")
        first_auth = time.monotonic()
        assert code == 0 and 1500 <= lifetime <= 2000, (code, lifetime)
        assert conn.metadata()[0]
        time.sleep(1.0)
        code, _, _, lifetime = conn.scram("alice", ALICE_PASSWORD, "SCRAM-SHA-512")
        second_auth = time.monotonic()
        assert code == 0 and 1500 <= lifetime <= 2000, (code, lifetime)
        time.sleep(max(0.0, first_auth + 2.4 - time.monotonic()))
        assert conn.metadata()[0], "the re-authenticated session ended with the first one"
        # ... and a connection that lets its session lapse is closed at its next request.
        time.sleep(max(0.0, second_auth + 2.4 - time.monotonic()))
        conn.send(METADATA, 1, i32(-1))
        assert conn.closed_by_server(), "a request after the session expired was answered"
        conn.close()
        # Not even ApiVersions is answered then (Kafka closes at any request
        # but a re-authenticating SaslHandshake).
        lapsed = KafkaConnection(gateway.bootstrap)
        lapsed_port = lapsed.sock.getsockname()[1]
        assert lapsed.scram("alice", ALICE_PASSWORD, "SCRAM-SHA-512")[0] == 0
        time.sleep(2.2)
        lapsed.send(API_VERSIONS, 0, b"")
        assert lapsed.closed_by_server(), "ApiVersions after the session expired was answered"
        lapsed.close()
        time.sleep(max(0.0, started + 7.0 - time.monotonic()))
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert errors == []
    assert len(delivered) > 50
    assert consumed == delivered
    # Only the two raw connections let their sessions lapse; librdkafka's
    # re-authenticated in time.
    expired = [line for line in log_of(gateway).splitlines() if "session expired" in line]
    assert len(expired) == 2, expired
    assert {port for port in (raw_port, lapsed_port) if any(f":{port}" in line for line in expired)} == {
        raw_port, lapsed_port}, expired


# --- 7. ACL changes reach every gateway ---------------------------------------------


def test_acl_changes_made_through_one_gateway_apply_on_another(ketch_cluster, redis_url, topic_name):
    ketch_users(redis_url, "set", "admin", password=ADMIN_PASSWORD)
    ketch_users(redis_url, "set", "alice", password=ALICE_PASSWORD)
    admin_login = {k: v for k, v in sasl_config("", "admin", ADMIN_PASSWORD, "SCRAM-SHA-256", "SASL_PLAINTEXT").items()
                   if k != "bootstrap.servers"}
    a, b = ketch_cluster(2, settings=(*FAST_GROUP_SETTINGS, *ACLS), protocol="SASL_PLAINTEXT",
                         client_config=admin_login)
    admin_a = AdminClient({"bootstrap.servers": a.bootstrap, **admin_login})
    create_topics(admin_a, [topic_name])
    alice_b = sasl_config(b.bootstrap, "alice", ALICE_PASSWORD, "SCRAM-SHA-256", "SASL_PLAINTEXT")
    alice_b_admin = AdminClient(alice_b)

    def alice_sees_it():
        return topic_name in alice_b_admin.list_topics(timeout=5).topics

    assert not alice_sees_it()
    assert produce(alice_b, topic_name, [b"early"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

    grant = acl(ResourceType.TOPIC, topic_name, "User:alice", AclOperation.WRITE)
    create_acls(admin_a, [grant])
    created = time.monotonic()
    wait_until(alice_sees_it, 3, "gateway B did not apply an ACL created through gateway A")
    print(f"ACL creation seen through B after {time.monotonic() - created:.2f}s")
    assert produce(alice_b, topic_name, [b"allowed"]) == [None]

    deleted = admin_a.delete_acls([AclBindingFilter(ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL,
                                                    "User:alice", None, AclOperation.ANY,
                                                    AclPermissionType.ANY)])
    assert [list(f.result(15)) for f in deleted.values()] == [[grant]]
    removed = time.monotonic()
    wait_until(lambda: not alice_sees_it(), 3, "gateway B still applies an ACL deleted through gateway A")
    print(f"ACL deletion seen through B after {time.monotonic() - removed:.2f}s")
    assert produce(alice_b, topic_name, [b"late"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


# --- 8. named listeners -------------------------------------------------------------


def test_named_listeners_answer_with_their_own_address_and_security(gateways, redis_url, pki, topic_name):
    ketch_users(redis_url, "set", "admin", password=ADMIN_PASSWORD)
    gateway = gateways(listeners=[("EXTERNAL", "SASL_SSL"), ("INTERNAL", "PLAINTEXT")],
                       settings=(*tls_settings(pki), *ACLS))
    external, internal = gateway.listeners["EXTERNAL"], gateway.listeners["INTERNAL"]
    port = {name: int(address.rsplit(":", 1)[1]) for name, address in gateway.listeners.items()}
    as_admin = sasl_config(external, "admin", ADMIN_PASSWORD, pki=pki)
    anonymous = {"bootstrap.servers": internal}

    admin = AdminClient(as_admin)
    assert [b.port for b in admin.list_topics(timeout=10).brokers.values()] == [port["EXTERNAL"]]
    assert [b.port for b in AdminClient(anonymous).list_topics(timeout=10).brokers.values()] == [port["INTERNAL"]]
    conn = KafkaConnection(internal)
    assert conn.metadata()[0] == [port["INTERNAL"]]
    conn.close()

    # The PLAINTEXT listener's clients are User:ANONYMOUS: refused until an ACL names them.
    create_topics(admin, [topic_name])
    assert topic_name not in visible_topics(anonymous)
    assert produce(anonymous, topic_name, [b"x"]) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    create_acls(
        admin,
        [
            acl(ResourceType.TOPIC, topic_name, "User:ANONYMOUS", AclOperation.WRITE),
            acl(ResourceType.TOPIC, topic_name, "User:ANONYMOUS", AclOperation.READ),
            acl(ResourceType.GROUP, "internal-readers", "User:ANONYMOUS", AclOperation.READ),
        ],
    )
    assert produce(anonymous, topic_name, [b"from-inside"]) == [None]
    # The group's coordinator is found at its INTERNAL address too.
    assert consume(anonymous, topic_name, "internal-readers", 1) == ([b"from-inside"], None)
    assert produce(as_admin, topic_name, [b"from-outside"]) == [None]
    # SASL authenticates on EXTERNAL only: a plaintext client there gets no answer.
    assert refused_by_tls(external)


# --- 9. certificate reload ------------------------------------------------------------


def peer_serial(address, pki):
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        with tls_client(pki).wrap_socket(sock, server_hostname="localhost") as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def test_certificates_are_reloaded_without_dropping_connections(gateways, pki, tmp_path, topic_name):
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    gateway = gateways(protocol="SSL", settings=(f"tls.cert_file={cert}", f"tls.key_file={key}",
                                                 "tls.reload_interval=200ms"))
    address = gateway.bootstrap
    ca = (pki.ca_cert, pki.ca_key)

    def install(name, keep_mtime):
        """Replaces the certificate and key (each file atomically) with a
        new pair for localhost; returns its serial."""
        new_cert, new_key, serial = pki.issue(name, "/O=Example/CN=localhost", ca, "server")
        stamps = [(p.stat().st_atime_ns, p.stat().st_mtime_ns) for p in (cert, key)]
        for source, target, stamp in zip((new_cert, new_key), (cert, key), stamps):
            shutil.copy(source, tmp_path / "incoming")
            if keep_mtime:
                os.utime(tmp_path / "incoming", ns=stamp)
            os.replace(tmp_path / "incoming", target)
        return serial

    assert peer_serial(address, pki) == pki.server_serial
    conn = KafkaConnection(address, tls=tls_client(pki))
    assert conn.api_versions() == 0
    producer = Producer({**ssl_config(address, pki), "linger.ms": 0})
    results = []
    producer.produce(topic_name, b"before", on_delivery=lambda err, msg: results.append(err))
    producer.flush(15)

    # Same modification times: only SIGHUP can make ketch notice.
    second = install("server-2", keep_mtime=True)
    time.sleep(0.5)  # several reload checks: none may see a change
    assert peer_serial(address, pki) == pki.server_serial, "reloaded with no SIGHUP and no changed file"
    gateway.process.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: peer_serial(address, pki) == second, 5, "SIGHUP did not reload the certificate")

    # A changed file is noticed by itself.
    third = install("server-3", keep_mtime=False)
    wait_until(lambda: peer_serial(address, pki) == third, 5, "a changed certificate file was not reloaded")

    # A broken file is refused; the previous certificate stays.
    cert.write_text("not a certificate\n")
    wait_for_log(gateway, "cannot reload TLS files")
    assert peer_serial(address, pki) == third

    # Connections made before the reloads still work.
    assert conn.api_versions() == 0
    conn.close()
    producer.produce(topic_name, b"after", on_delivery=lambda err, msg: results.append(err))
    assert producer.flush(15) == 0
    assert results == [None, None]
    wait_for_log(gateway, 'client CAs reason="SIGHUP"')
    wait_for_log(gateway, 'client CAs reason="a file changed"')


# --- 10. malformed input on the SASL path ------------------------------------------------


def test_malformed_sasl_input_closes_only_that_connection(gateways, redis_url, topic_name):
    ketch_users(redis_url, "set", "alice", password=ALICE_PASSWORD)
    ketch_users(redis_url, "set", "bob", password="bob-secret")
    # With a session lifetime: only then may a client re-authenticate (Kafka's KIP-368).
    gateway = gateways(protocol="SASL_PLAINTEXT",
                       settings=("sasl.failed_authentication_delay=10ms", "sasl.connections_max_reauth=1h"))
    address = gateway.bootstrap
    config = sasl_config(address, "alice", ALICE_PASSWORD, "SCRAM-SHA-256", "SASL_PLAINTEXT")
    assert produce(config, topic_name, [b"before"]) == [None]
    good = KafkaConnection(address)
    assert good.scram("alice", ALICE_PASSWORD, version=2)[0] == 0
    assert good.metadata()

    def fresh(mechanism=None):
        conn = KafkaConnection(address)
        if mechanism:
            assert conn.handshake(mechanism) == (0, ["SCRAM-SHA-256", "SCRAM-SHA-512"])
        return conn

    def header(api_key, version, correlation=1, flexible=False):
        return i16(api_key) + i16(version) + i32(correlation) + kstring("raw") + (uvarint(0) if flexible else b"")

    cases = {}

    # A request other than SASL before authenticating: closed, unanswered.
    conn = fresh()
    conn.send(METADATA, 1, i32(-1))
    cases["metadata before authentication"] = conn

    # SaslAuthenticate without a handshake.
    conn = fresh()
    assert conn.authenticate(b"n,,n=alice,r=abc")[0] == ILLEGAL_SASL_STATE
    cases["authenticate without a handshake"] = conn

    # Truncated SaslAuthenticate: v1, its bytes field claims more than the frame holds.
    conn = fresh("SCRAM-SHA-256")
    conn.send_frame(header(SASL_AUTHENTICATE, 1, 2) + i32(100) + b"n,,n=")
    cases["truncated SaslAuthenticate v1"] = conn
    # ... v2 (request header v2, compact bytes).
    conn = fresh("SCRAM-SHA-256")
    conn.send_frame(header(SASL_AUTHENTICATE, 2, 2, flexible=True) + uvarint(200) + b"n,,")
    cases["truncated SaslAuthenticate v2"] = conn
    # ... and a frame cut short by the client closing its side.
    conn = fresh("SCRAM-SHA-256")
    conn.sock.sendall(i32(64) + header(SASL_AUTHENTICATE, 1, 2))
    conn.sock.shutdown(socket.SHUT_WR)
    cases["frame cut short"] = conn

    # Garbage SCRAM messages: refused as failed authentication.
    conn = fresh("SCRAM-SHA-256")
    code, message, _, _ = conn.authenticate(b"\xff\xfe garbage \x00 not scram")
    # Kafka's generic answer, not the parse detail (which the log has).
    assert (code, message) == (SASL_AUTHENTICATION_FAILED, INVALID_CREDENTIALS + "SCRAM-SHA-256")
    cases["garbage client-first"] = conn
    conn = fresh("SCRAM-SHA-256")
    code, _, server_first, _ = conn.authenticate(b"n,,n=alice,r=abcdefgh")
    assert code == 0 and server_first.startswith(b"r=abcdefgh")
    code, _, _, _ = conn.authenticate(b"c=biws,r=forged,p=AAAA")
    assert code == SASL_AUTHENTICATION_FAILED
    cases["garbage client-final"] = conn

    # A v0 handshake (raw tokens follow) and a garbage raw token.
    conn = KafkaConnection(address)
    assert conn.handshake("SCRAM-SHA-256", version=0)[0] == 0
    conn.send_frame(b"\x00\x01garbage")
    cases["garbage raw token"] = conn

    # Re-authenticating as someone else, and with another mechanism.
    conn = fresh()
    assert conn.scram("alice", ALICE_PASSWORD)[0] == 0
    assert conn.scram("bob", "bob-secret")[0] == SASL_AUTHENTICATION_FAILED
    cases["re-authentication as another user"] = conn
    conn = fresh()
    assert conn.scram("alice", ALICE_PASSWORD)[0] == 0
    assert conn.handshake("SCRAM-SHA-512")[0] == ILLEGAL_SASL_STATE
    cases["re-authentication with another mechanism"] = conn

    # Frames too large for any request, and a negative size.
    for why, size in (("oversized frame", 2**31 - 1), ("negative frame size", -5)):
        conn = fresh("SCRAM-SHA-256")
        conn.sock.sendall(i32(size) + header(SASL_AUTHENTICATE, 1, 2))
        cases[why] = conn

    for why, conn in cases.items():
        assert conn.closed_by_server(), f"{why}: the connection stayed open"
        conn.close()

    for expected in ("request before SASL authentication", "invalid SCRAM client-first message",
                     "bytes before SASL authentication (at most 524288 bytes until then)"):
        wait_for_log(gateway, expected)
    # The authenticated connection, and new clients, are served as before.
    assert good.metadata()
    good.close()
    assert produce(config, topic_name, [b"after"]) == [None]
    assert consume(config, topic_name, "after-abuse", 2) == ([b"before", b"after"], None)


# --- where ketch once differed from Kafka ----------------------------------------------------


def test_a_large_frame_before_authentication_is_refused_at_once(gateways):
    gateway = gateways(protocol="SASL_PLAINTEXT")
    conn = KafkaConnection(gateway.bootstrap)
    assert conn.handshake("SCRAM-SHA-256")[0] == 0
    conn.sock.sendall(i32(1024 * 1024) + i16(SASL_AUTHENTICATE) + i16(1) + i32(2))
    try:
        assert conn.closed_by_server(timeout=3), "ketch waits for the rest of a 1 MiB unauthenticated frame"
    finally:
        conn.close()


def test_describe_cluster_answers_any_authenticated_principal(gateways, redis_url):
    ketch_users(redis_url, "set", "alice", password=ALICE_PASSWORD)
    gateway = gateways(protocol="SASL_PLAINTEXT", settings=ACLS)
    conn = KafkaConnection(gateway.bootstrap)
    try:
        assert conn.scram("alice", ALICE_PASSWORD)[0] == 0
        reader = conn.request(60, 0, b"\x01" + uvarint(0), flexible_request=True, flexible_response=True)
        reader.i32()  # throttle
        assert reader.i16() == 0, "DescribeCluster refused"
    finally:
        conn.close()


def test_sasl_handshake_on_a_plaintext_listener_is_answered(gateways):
    gateway = gateways()
    conn = KafkaConnection(gateway.bootstrap)
    try:
        assert conn.handshake("PLAIN")[0] == ILLEGAL_SASL_STATE
        assert conn.api_versions() == 0
    finally:
        conn.close()
