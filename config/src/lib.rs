//! Typed ketch settings.
//!
//! Settings come from three layers, each overriding the one before: a TOML
//! file (`--config`), environment variables `KETCH_<SECTION>_<KEY>` and
//! command-line flags. The layers are merged as TOML tables and deserialized
//! once, so every layer gets the same validation: an unknown key is an error
//! that names it, and a duration is written like `500ms`, `5s` or `1m`.
//!
//! [`topic`] holds the Kafka topic configs ketch accepts and enforces.

pub mod duration;
mod lenient;
pub mod security;
pub mod topic;

use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

pub use duration::Duration;
pub use security::{AclSettings, Listener, SaslSettings, SecurityProtocol, TlsSettings};

/// The largest node id a gateway may be given or claim. Larger ids are
/// reserved for addresses several gateways advertise (a load balancer):
/// Metadata lists such an address once, under an id derived from it.
pub const MAX_NODE_ID: i32 = (1 << 30) - 1;

/// The levels `tiering.compression_level` may give a codec, and the level
/// used when it is unset.
pub type CodecLevels = (std::ops::RangeInclusive<i32>, i32);

/// The codecs `tiering.compression` takes, each with its levels (`None`:
/// the codec has none).
pub const ARCHIVE_CODECS: [(&str, Option<CodecLevels>); 5] = [
    ("zstd", Some((1..=22, 1))),
    ("lz4", None),
    ("snappy", None),
    ("gzip", Some((0..=9, 6))),
    ("uncompressed", None),
];

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("invalid settings ({origin}): {message}")]
    Invalid { origin: String, message: String },
    #[error("environment variable {name}: {message}")]
    Env { name: String, message: String },
    #[error("invalid setting {key}: {message}")]
    Value { key: String, message: String },
}

/// All of ketch's settings. Every field has a default; see `docs/configuration.md`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub broker: BrokerSettings,
    pub redis: RedisSettings,
    pub http: HttpSettings,
    pub topics: TopicsSettings,
    pub fetch: FetchSettings,
    pub groups: GroupsSettings,
    pub cluster: ClusterSettings,
    pub tiering: TieringSettings,
    pub storage: StorageSettings,
    pub producers: ProducersSettings,
    pub transactions: TransactionsSettings,
    pub quotas: QuotasSettings,
    pub log: LogSettings,
    pub tls: TlsSettings,
    pub sasl: SaslSettings,
    pub acl: AclSettings,
}

/// The Kafka listener and this gateway's identity.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerSettings {
    /// This gateway's node id, 0 to [`MAX_NODE_ID`]. Unset: the gateway
    /// claims the lowest id no live gateway holds, in Redis, at start.
    pub id: Option<i32>,
    /// Address the Kafka listener binds.
    pub listen: SocketAddr,
    /// Host clients are told to connect to; defaults to the listen host, or
    /// `127.0.0.1` when listening on an unspecified address.
    #[serde(deserialize_with = "lenient::optional_string")]
    pub advertised_host: Option<String>,
    /// Port clients are told to connect to; defaults to the listen port.
    pub advertised_port: Option<u16>,
    /// Largest request frame accepted; larger frames close the connection.
    pub max_request_bytes: u32,
    /// Requests processed concurrently on one connection (answered in order).
    pub max_inflight_requests: usize,
    /// Bytes of request frames processed concurrently on one connection:
    /// while the requests being processed hold this many, the connection is
    /// not read (one frame is always admitted, however large). Bounds the
    /// gateway's memory under pipelined produce requests.
    pub max_inflight_request_bytes: usize,
    /// Client connections open at once; further ones are closed at once.
    pub max_connections: usize,
    /// Client connections open at once from one address (Kafka's
    /// `max.connections.per.ip`); further ones from it are closed at once.
    pub max_connections_per_ip: usize,
    /// Kafka's `max.connections.per.ip.overrides`: `host-or-ip:count,…`,
    /// each a limit of its own for that address (a host name: for each
    /// address it resolves to at start).
    #[serde(deserialize_with = "lenient::string")]
    pub max_connections_per_ip_overrides: String,
    /// A connection that sends no request for this long is closed (Kafka's
    /// `connections.max.idle.ms`).
    pub connections_max_idle: Duration,
    /// How long shutdown waits for in-flight requests before exiting anyway.
    pub shutdown_timeout: Duration,
    /// On the first SIGTERM/SIGINT, how long the gateway goes on serving
    /// with `/ready` answering 503 before it leaves the cluster and closes
    /// its listeners: a load balancer's health check takes it out first.
    pub shutdown_delay: Duration,
    /// Cluster id reported in Metadata and DescribeCluster.
    #[serde(deserialize_with = "lenient::string")]
    pub cluster_id: String,
    /// The listener's protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    pub security_protocol: SecurityProtocol,
    /// Several listeners, as Kafka's `listeners`: `NAME://ip:port,…`. Set,
    /// it replaces `listen`, `advertised_*` and `security_protocol`.
    #[serde(deserialize_with = "lenient::optional_string")]
    pub listeners: Option<String>,
    /// Kafka's `advertised.listeners`: `NAME://host:port,…`; a listener not
    /// named here advertises its listen address.
    #[serde(deserialize_with = "lenient::optional_string")]
    pub advertised_listeners: Option<String>,
    /// Kafka's `listener.security.protocol.map`: `NAME:PROTOCOL,…`. A
    /// listener named like a protocol needs no entry.
    #[serde(deserialize_with = "lenient::string")]
    pub listener_security_protocol_map: String,
    /// Listeners whose every connection begins with a PROXY protocol header
    /// (v1 or v2, as HAProxy's `send-proxy` and `send-proxy-v2` write it):
    /// the client address it carries is the connection's, for ACL hosts,
    /// per-address limits and quotas, and logs. Listener names (as
    /// `listeners` names them; the single listener's is its protocol), or
    /// `*` for every one.
    #[serde(deserialize_with = "lenient::string_list")]
    pub proxy_protocol_listeners: Vec<String>,
    /// Threads that run connections, requests and the storage worker
    /// (Kafka's `num.network.threads` and `num.io.threads` in one); 0: one
    /// per CPU core the process may use.
    pub worker_threads: usize,
}

/// How ketch reaches Redis.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port[/db]` (`rediss://` for TLS,
    /// `unix:///path/to/redis.sock[?user=…&pass=…&db=…]` for a Redis on
    /// this host's Unix socket); in cluster mode one seed node or a
    /// comma-separated list of them (TCP or TLS).
    pub url: String,
    /// PEM file of the certificate authorities that sign Redis's TLS
    /// certificates (`rediss://`); unset: the system's trusted roots.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// `single` (one Redis server, with or without replicas) or `cluster`
    /// (Redis Cluster: partitions spread over its masters).
    pub mode: RedisMode,
    /// Prefix of every key ketch writes.
    #[serde(deserialize_with = "lenient::string")]
    pub namespace: String,
    /// Longest wait for one Redis command before the request fails with a
    /// retriable error.
    pub command_timeout: Duration,
    /// Longest wait to open a connection.
    pub connect_timeout: Duration,
}

/// The HTTP listener (`/health`, `/ready`, `/metrics`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    pub listen: SocketAddr,
    /// Serve HTTPS with `tls.cert_file` and `tls.key_file` (no client
    /// certificates are asked for).
    pub tls: bool,
    /// Require authentication on every path but `open_paths`: HTTP Basic
    /// checked against the SCRAM users, or a bearer JWT checked as
    /// OAUTHBEARER tokens are. Needs `http.tls`.
    pub auth: bool,
    /// Paths read (GET, HEAD) without authentication when `auth` is on.
    #[serde(deserialize_with = "lenient::string_list")]
    pub open_paths: Vec<String>,
    /// HTTP connections open at once at most; more wait to be accepted.
    pub max_connections: usize,
    /// HTTP connections open at once from one address; more are closed at
    /// once (one client cannot take every place, health probes' included).
    pub max_connections_per_ip: usize,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// Allow the admin API's writes (POST, PATCH, DELETE under `/api/v1`)
    /// without `auth`. With `auth` on they are allowed to authenticated
    /// principals (and ACLs decide, when on).
    pub admin_writes: bool,
    /// Host names a request from this machine may name in its `Host`
    /// header besides `localhost` and IP addresses (`*`: any): a web page
    /// that rebinds its own name to 127.0.0.1 (DNS rebinding) cannot reach
    /// the admin API and console of a gateway on the browser's machine.
    #[serde(deserialize_with = "lenient::string_list")]
    pub allowed_hosts: Vec<String>,
}

/// Topic creation defaults.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsSettings {
    /// Create a topic on first Metadata or Produce that names it.
    pub auto_create: bool,
    /// Partitions of an automatically created topic, and of CreateTopics
    /// with `num_partitions = -1`.
    pub default_partitions: i32,
    /// Largest partition count a topic may have.
    pub max_partitions: i32,
    /// Broker-level default of the `max.message.bytes` topic config.
    pub max_message_bytes: i32,
}

/// Fetch behaviour.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FetchSettings {
    /// Upper bound on a client's `max_wait_ms`.
    pub max_wait: Duration,
    /// How long a cross-gateway wake-up subscription outlives its last waiter.
    pub subscription_linger: Duration,
    /// Upper bound on the record bytes of one Fetch response (Kafka's
    /// broker-side `fetch.max.bytes`); bounds the memory a fetch holds.
    pub max_response_bytes: usize,
    /// What the copies of just-appended batches, kept for the fetches that
    /// tail their partitions, may hold together (0: keep none).
    pub tail_cache_bytes: usize,
}

/// Consumer groups.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GroupsSettings {
    /// How long the first rebalance of an empty group waits for more
    /// members (Kafka's `group.initial.rebalance.delay.ms`).
    pub initial_rebalance_delay: Duration,
    /// How long committed offsets outlive a group that became empty, and
    /// how long an offset no member consumes outlives its commit (Kafka's
    /// `offsets.retention.minutes`).
    pub offsets_retention: Duration,
    /// How often each gateway looks for such offsets among the groups it
    /// coordinates (Kafka's `offsets.retention.check.interval.ms`).
    pub offsets_retention_check_interval: Duration,
    /// Smallest session timeout a member may ask for (`group.min.session.timeout.ms`).
    pub min_session_timeout: Duration,
    /// Largest session timeout a member may ask for (`group.max.session.timeout.ms`).
    pub max_session_timeout: Duration,
    /// Largest metadata string stored with a committed offset
    /// (`offset.metadata.max.bytes`).
    pub max_metadata_bytes: usize,
}

/// Gateway membership.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSettings {
    /// How often a gateway refreshes its heartbeat in Redis.
    pub heartbeat_interval: Duration,
    /// A gateway whose heartbeat is older than this is dead: it leaves
    /// Metadata and its partitions and groups move to live gateways.
    pub node_timeout: Duration,
    /// Address the internal listener binds: other gateways forward group
    /// requests to this gateway's groups there. Unset: the Kafka listener's
    /// IP with a free port.
    pub internal_listen: Option<SocketAddr>,
    /// Host other gateways dial to reach the internal listener. Unset: the
    /// internal listen IP, or when that is unspecified (0.0.0.0, ::) the
    /// first address this machine's hostname resolves to.
    #[serde(deserialize_with = "lenient::optional_string")]
    pub internal_advertised_host: Option<String>,
    /// How long every live gateway must have served the newest Redis
    /// layout before one takes a step an older release cannot read
    /// (storage/src/layout.rs): an older gateway restarting meanwhile
    /// comes back before the step, not after it.
    pub layout_step_delay: Duration,
}

/// The storage worker (segments, retention) and the Iceberg archive.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TieringSettings {
    /// How often the storage worker visits the partitions this gateway leads.
    pub tick_interval: Duration,
    /// How long a partition's lease outlives its holder's last renewal.
    pub lease_ttl: Duration,
    /// Home of the embedded catalog (`catalog.db`) and the local warehouse.
    #[serde(deserialize_with = "lenient::string")]
    pub data_dir: String,
    /// `sql` (SQLite or PostgreSQL, by `catalog_uri`) or `rest`.
    #[serde(deserialize_with = "lenient::string")]
    pub catalog: String,
    /// `sqlite:/path/catalog.db`, `postgres://user:pass@host/db` or, for
    /// `rest`, the REST catalog's base URL. Empty: `sqlite:<data_dir>/catalog.db`.
    #[serde(deserialize_with = "lenient::string")]
    pub catalog_uri: String,
    /// The catalog name rows are stored under (engines reading the SQL
    /// catalog must use the same name).
    #[serde(deserialize_with = "lenient::string")]
    pub catalog_name: String,
    /// The Iceberg namespace of the topic tables.
    #[serde(deserialize_with = "lenient::string")]
    pub namespace: String,
    /// Where data files go: a local directory or `s3://bucket/prefix`.
    /// Empty: `<data_dir>/warehouse`.
    #[serde(deserialize_with = "lenient::string")]
    pub warehouse: String,
    /// S3 endpoint URL (empty: AWS).
    #[serde(deserialize_with = "lenient::string")]
    pub s3_endpoint: String,
    #[serde(deserialize_with = "lenient::string")]
    pub s3_region: String,
    #[serde(deserialize_with = "lenient::string")]
    pub s3_access_key_id: String,
    #[serde(deserialize_with = "lenient::string")]
    pub s3_secret_access_key: String,
    /// Path-style requests (`http://endpoint/bucket/key`), as most
    /// self-hosted S3 servers need.
    pub s3_path_style: bool,
    /// Rows per Parquet row group; a remote read decodes one row group.
    pub row_group_rows: usize,
    /// The codec of the data files' pages: `zstd`, `lz4` (Parquet's
    /// LZ4_RAW), `snappy`, `gzip` or `uncompressed` (zstd is about 40% of
    /// archiving's CPU; see [`ARCHIVE_CODECS`]).
    #[serde(deserialize_with = "lenient::string")]
    pub compression: String,
    /// The codec's level (zstd 1–22, gzip 0–9; the others have none).
    /// Unset: zstd 1, gzip 6.
    pub compression_level: Option<i32>,
    /// Decoded row groups kept in memory for sequential remote readers.
    pub read_cache_bytes: usize,
    /// How long a fetch waits for a read from the archive (Kafka's
    /// `remote.fetch.max.wait.ms`): past it the partition is answered with
    /// no records, and the read goes on to fill the cache for the next fetch.
    pub remote_fetch_max_wait: Duration,
    /// How long a ListOffsets request's lookups by timestamp (and -3) may
    /// take, all of them (Kafka's `remote.list.offsets.request.timeout.ms`):
    /// they may read the archive; past it the partitions not done are
    /// REQUEST_TIMED_OUT.
    pub remote_list_offsets_timeout: Duration,
    /// Snapshots of a topic's table younger than this are never expired:
    /// engines may time-travel to them or resume incremental reads from them.
    pub snapshot_retention: Duration,
    /// The newest snapshots of a topic's table kept however old they are. A
    /// commit Redis never heard of (a crash between the two) is found in
    /// their summaries at no cost; once its snapshot is expired, by reading
    /// the table's manifests.
    pub snapshots_kept: usize,
    /// A topic's table is maintained (old snapshots expired, small manifests
    /// merged) after every this many commits this gateway makes to it; each
    /// commit adds a snapshot and a manifest. 0 turns maintenance off.
    pub maintenance_commits: u32,
    /// Partitions of one topic a gateway archives at once (each reads on
    /// one task and encodes on another; the topic's commits go one at a
    /// time). Kafka's `remote.log.manager.copier.thread.pool.size` plays
    /// this part across all partitions.
    pub archive_partitions: usize,
    /// Distinct keys a compaction pass over one partition holds in memory
    /// (each costs its key's bytes and about 64 more): a pass over more
    /// stops at a segment boundary and the next pass goes on from there.
    pub compaction_max_keys: usize,
}

/// What acks=all waits for.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageSettings {
    /// Redis replicas that must have an acks=all batch before it is
    /// acknowledged (`WAIT`); 0 answers once the primary has it.
    pub acks_all_replicas: u32,
    /// Longest wait for them; past it the producer gets
    /// NOT_ENOUGH_REPLICAS_AFTER_APPEND (the batch is stored).
    pub acks_all_timeout: Duration,
    /// Also wait for the primary's append-only file to reach disk
    /// (`WAITAOF`, Redis 7.2+; ignored with a warning on older servers).
    pub acks_all_fsync: bool,
    /// Redis connections reserved for acks=all appends: each holds one for
    /// its write and its `WAIT`, so this many wait for replicas at once.
    pub acks_all_connections: usize,
}

/// Idempotent producers.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProducersSettings {
    /// A producer idle this long is forgotten by a partition (Kafka's
    /// `producer.id.expiration.ms`); checked on the storage worker's ticks.
    pub expiration: Duration,
}

/// Transactions (KIP-98).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TransactionsSettings {
    /// The longest `transaction.timeout.ms` a producer may ask for (Kafka's
    /// `transaction.max.timeout.ms`); more is INVALID_TRANSACTION_TIMEOUT.
    pub max_timeout: Duration,
    /// How often each gateway looks for transactions past their timeout
    /// (aborted, fencing their producers) and for decisions a crashed
    /// gateway left unfinished (Kafka's
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`).
    pub abort_check_interval: Duration,
    /// A transactional id unused this long is forgotten (Kafka's
    /// `transactional.id.expiration.ms`).
    pub id_expiration: Duration,
}

/// Client quotas (docs/quotas.md): how each gateway measures a client's
/// byte rates against the quotas set with AlterClientQuotas.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QuotasSettings {
    /// Samples a rate is measured over (Kafka's `quota.window.num`).
    pub window_num: u32,
    /// The length of one sample, whole seconds (Kafka's
    /// `quota.window.size.seconds`).
    pub window_size: Duration,
}

/// Logging.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    /// `tracing` filter, e.g. `info` or `ketch_gateway=debug,info`.
    pub level: String,
    /// `text` or `json`.
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    #[default]
    Single,
    Cluster,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Kafka's default `max.connections.per.ip`: no limit.
pub const MAX_CONNECTIONS_PER_IP: usize = i32::MAX as usize;

impl BrokerSettings {
    /// `max_connections_per_ip_overrides` taken apart: (host or address,
    /// limit) pairs.
    pub fn connection_overrides(&self) -> Result<Vec<(String, usize)>, ConfigError> {
        let bad = |message: String| ConfigError::Value {
            key: "broker.max_connections_per_ip_overrides".to_owned(),
            message,
        };
        let mut overrides = Vec::new();
        for entry in self.max_connections_per_ip_overrides.split(',').map(str::trim) {
            if entry.is_empty() {
                continue;
            }
            // An IPv6 address has colons of its own: the count is after the last.
            let (host, count) = entry
                .rsplit_once(':')
                .ok_or_else(|| bad(format!("{entry:?} is not host:count")))?;
            let host = host.trim().trim_start_matches('[').trim_end_matches(']');
            let count: usize = count
                .trim()
                .parse()
                .map_err(|_| bad(format!("{entry:?}: the count must be a whole number ≥ 0")))?;
            if host.is_empty() {
                return Err(bad(format!("{entry:?} names no host")));
            }
            overrides.push((host.to_owned(), count));
        }
        Ok(overrides)
    }
}

impl Default for BrokerSettings {
    fn default() -> Self {
        Self {
            id: None,
            listen: "0.0.0.0:9092".parse().expect("valid default address"),
            advertised_host: None,
            advertised_port: None,
            max_request_bytes: 100 * 1024 * 1024,
            max_inflight_requests: 32,
            max_inflight_request_bytes: 4 * 1024 * 1024,
            max_connections: 10_000,
            max_connections_per_ip: MAX_CONNECTIONS_PER_IP,
            max_connections_per_ip_overrides: String::new(),
            connections_max_idle: Duration::from_secs(600),
            shutdown_timeout: Duration::from_secs(30),
            shutdown_delay: Duration::from_secs(5),
            cluster_id: "ketch".to_owned(),
            security_protocol: SecurityProtocol::Plaintext,
            listeners: None,
            advertised_listeners: None,
            listener_security_protocol_map: String::new(),
            proxy_protocol_listeners: Vec::new(),
            worker_threads: 0,
        }
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".to_owned(),
            mode: RedisMode::Single,
            tls_ca_file: None,
            namespace: "ketch".to_owned(),
            command_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9644".parse().expect("valid default address"),
            tls: false,
            auth: false,
            open_paths: vec!["/health".to_owned(), "/ready".to_owned(), "/metrics".to_owned()],
            max_connections: 256,
            max_connections_per_ip: 64,
            idle_timeout: Duration::from_secs(60),
            admin_writes: false,
            allowed_hosts: Vec::new(),
        }
    }
}

impl Default for TopicsSettings {
    fn default() -> Self {
        Self {
            auto_create: true,
            default_partitions: 1,
            max_partitions: 10_000,
            max_message_bytes: 1_048_588,
        }
    }
}

impl Default for FetchSettings {
    fn default() -> Self {
        Self {
            max_wait: Duration::from_secs(30),
            subscription_linger: Duration::from_secs(30),
            max_response_bytes: 8 * 1024 * 1024,
            tail_cache_bytes: 8 * 1024 * 1024,
        }
    }
}

impl Default for GroupsSettings {
    fn default() -> Self {
        Self {
            initial_rebalance_delay: Duration::from_secs(3),
            offsets_retention: Duration::from_secs(7 * 24 * 3600),
            offsets_retention_check_interval: Duration::from_secs(600),
            min_session_timeout: Duration::from_secs(6),
            max_session_timeout: Duration::from_secs(30 * 60),
            max_metadata_bytes: 4096,
        }
    }
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(1),
            node_timeout: Duration::from_secs(5),
            internal_listen: None,
            internal_advertised_host: None,
            layout_step_delay: Duration::from_secs(60),
        }
    }
}

impl Default for TieringSettings {
    fn default() -> Self {
        Self {
            tick_interval: Duration::from_secs(5),
            lease_ttl: Duration::from_secs(30),
            data_dir: "./data".to_owned(),
            catalog: "sql".to_owned(),
            catalog_uri: String::new(),
            catalog_name: "ketch".to_owned(),
            namespace: "ketch".to_owned(),
            warehouse: String::new(),
            s3_endpoint: String::new(),
            s3_region: "us-east-1".to_owned(),
            s3_access_key_id: String::new(),
            s3_secret_access_key: String::new(),
            s3_path_style: false,
            row_group_rows: 32 * 1024,
            compression: "zstd".to_owned(),
            compression_level: None,
            read_cache_bytes: 64 * 1024 * 1024,
            remote_fetch_max_wait: Duration::from_millis(500),
            remote_list_offsets_timeout: Duration::from_secs(30),
            snapshot_retention: Duration::from_secs(3600),
            snapshots_kept: 10,
            maintenance_commits: 20,
            archive_partitions: 2,
            compaction_max_keys: 1_000_000,
        }
    }
}

impl Default for StorageSettings {
    fn default() -> Self {
        Self {
            acks_all_replicas: 0,
            acks_all_timeout: Duration::from_secs(5),
            acks_all_fsync: false,
            acks_all_connections: 8,
        }
    }
}

impl Default for ProducersSettings {
    fn default() -> Self {
        Self {
            expiration: Duration::from_secs(24 * 3600),
        }
    }
}

impl Default for TransactionsSettings {
    fn default() -> Self {
        Self {
            max_timeout: Duration::from_secs(15 * 60),
            abort_check_interval: Duration::from_secs(1),
            id_expiration: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl Default for QuotasSettings {
    fn default() -> Self {
        Self {
            window_num: 11,
            window_size: Duration::from_secs(1),
        }
    }
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            level: "info".to_owned(),
            format: LogFormat::Text,
        }
    }
}

/// The environment variable prefix.
pub const ENV_PREFIX: &str = "KETCH_";

/// Builds [`Settings`] from the three layers.
#[derive(Debug, Default)]
pub struct Loader {
    table: toml::Table,
}

impl Loader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Layer a TOML file.
    pub fn file(mut self, path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Invalid {
            origin: path.display().to_string(),
            message: e.to_string(),
        })?;
        merge(&mut self.table, table);
        Ok(self)
    }

    /// Layer every `KETCH_<SECTION>_<KEY>` variable of `vars`. The section is
    /// the part before the first underscore, the key the rest, lower-cased.
    pub fn env(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Result<Self, ConfigError> {
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let rest = rest.to_ascii_lowercase();
            let Some((section, key)) = rest.split_once('_') else {
                return Err(ConfigError::Env {
                    name,
                    message: "expected KETCH_<SECTION>_<KEY>".to_owned(),
                });
            };
            if section.is_empty() || key.is_empty() {
                return Err(ConfigError::Env {
                    name,
                    message: "expected KETCH_<SECTION>_<KEY>".to_owned(),
                });
            }
            self = self.set(section, key, &value);
        }
        Ok(self)
    }

    /// Layer one value, typed as TOML when it parses as a TOML value
    /// (`true`, `42`) and as a string otherwise.
    pub fn set(mut self, section: &str, key: &str, value: &str) -> Self {
        let value = parse_scalar(value);
        let entry = self
            .table
            .entry(section.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(t) = entry {
            t.insert(key.to_owned(), value);
        } else {
            *entry = toml::Value::Table(toml::Table::from_iter([(key.to_owned(), value)]));
        }
        self
    }

    /// Layer `section.key=value` strings (the `--set` flag).
    pub fn assignments<'a>(mut self, items: impl IntoIterator<Item = &'a str>) -> Result<Self, ConfigError> {
        for item in items {
            let invalid = |message: &str| ConfigError::Value {
                key: item.to_owned(),
                message: message.to_owned(),
            };
            let (path, value) = item
                .split_once('=')
                .ok_or_else(|| invalid("expected section.key=value"))?;
            let (section, key) = path
                .split_once('.')
                .ok_or_else(|| invalid("expected section.key=value"))?;
            self = self.set(section.trim(), key.trim(), value.trim());
        }
        Ok(self)
    }

    /// Deserialize and validate the merged layers.
    pub fn load(self) -> Result<Settings, ConfigError> {
        let settings: Settings =
            Settings::deserialize(toml::Value::Table(self.table)).map_err(|e| ConfigError::Invalid {
                origin: "merged file, environment and flags".to_owned(),
                message: e.to_string(),
            })?;
        settings.validate()?;
        Ok(settings)
    }
}

impl TieringSettings {
    /// The level the archive's codec runs at: `compression_level`, or the
    /// codec's default from [`ARCHIVE_CODECS`]; `None` for a codec without
    /// levels (where the loader refuses a `compression_level`).
    pub fn compression_level_or_default(&self) -> Option<i32> {
        let default = ARCHIVE_CODECS
            .iter()
            .find(|(codec, _)| *codec == self.compression)
            .and_then(|(_, levels)| levels.as_ref())
            .map(|(_, default)| *default);
        self.compression_level.or(default)
    }

    /// The SQL catalog's URI, with the embedded SQLite default.
    pub fn catalog_uri(&self) -> String {
        if self.catalog_uri.is_empty() {
            format!(
                "sqlite:{}?mode=rwc",
                absolute(&self.data_dir).join("catalog.db").display()
            )
        } else {
            self.catalog_uri.clone()
        }
    }

    /// The warehouse location, with the `<data_dir>/warehouse` default: a
    /// URL (`s3://…`, or `file:///…` for a local directory, made absolute).
    pub fn warehouse(&self) -> String {
        match self.warehouse_dir() {
            Some(dir) => format!("file://{}", dir.display()),
            None => self.warehouse.trim_end_matches('/').to_owned(),
        }
    }

    /// The warehouse's local directory, when it is one.
    pub fn warehouse_dir(&self) -> Option<std::path::PathBuf> {
        if self.warehouse.is_empty() {
            Some(absolute(&self.data_dir).join("warehouse"))
        } else if let Some(path) = self.warehouse.strip_prefix("file://") {
            Some(absolute(path))
        } else if self.warehouse.contains("://") {
            None
        } else {
            Some(absolute(&self.warehouse))
        }
    }
}

fn absolute(path: &str) -> std::path::PathBuf {
    let path = Path::new(path);
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

impl Settings {
    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: &str| {
            Err(ConfigError::Value {
                key: key.to_owned(),
                message: message.to_owned(),
            })
        };
        if self.broker.id.is_some_and(|id| !(0..=MAX_NODE_ID).contains(&id)) {
            return bad(
                "broker.id",
                &format!("must be between 0 and {MAX_NODE_ID} (larger ids name load-balanced addresses)"),
            );
        }
        if self.broker.max_request_bytes < 1024 {
            return bad("broker.max_request_bytes", "must be at least 1024");
        }
        if self.broker.max_connections == 0 {
            return bad("broker.max_connections", "must be at least 1");
        }
        let overrides = self.broker.connection_overrides()?;
        if self.broker.max_connections_per_ip == 0 && overrides.is_empty() {
            return bad(
                "broker.max_connections_per_ip",
                "is 0, which refuses every client: name the addresses allowed in broker.max_connections_per_ip_overrides",
            );
        }
        if self.http.max_connections == 0 {
            return bad("http.max_connections", "must be at least 1");
        }
        if self.http.max_connections_per_ip == 0 {
            return bad("http.max_connections_per_ip", "must be at least 1");
        }
        if self.tiering.remote_fetch_max_wait.get().is_zero() {
            return bad("tiering.remote_fetch_max_wait", "must be more than 0");
        }
        if self.tiering.remote_list_offsets_timeout.get().is_zero() {
            return bad("tiering.remote_list_offsets_timeout", "must be more than 0");
        }
        // A fetch looks its batches' aborted transactions up as late as its
        // long poll's end; the aborted index keeps what lies below the
        // log and local starts ten minutes (scripts/seal.lua).
        if self.fetch.max_wait.get() >= std::time::Duration::from_secs(600) {
            return bad("fetch.max_wait", "must be under 10 minutes");
        }
        if self.http.idle_timeout.get().is_zero() {
            return bad("http.idle_timeout", "must be more than 0");
        }
        if self.broker.connections_max_idle.get().is_zero() {
            return bad("broker.connections_max_idle", "must be above zero");
        }
        // As Kafka's `offsets.retention.minutes` and
        // `offsets.retention.check.interval.ms` (at least 1).
        if self.groups.offsets_retention.get().is_zero() {
            return bad("groups.offsets_retention", "must be above zero");
        }
        if self.groups.offsets_retention_check_interval.get().is_zero() {
            return bad("groups.offsets_retention_check_interval", "must be above zero");
        }
        // As Kafka's `transaction.max.timeout.ms`,
        // `transaction.abort.timed.out.transaction.cleanup.interval.ms` and
        // `transactional.id.expiration.ms` (at least 1).
        for (key, value) in [
            ("transactions.max_timeout", self.transactions.max_timeout),
            (
                "transactions.abort_check_interval",
                self.transactions.abort_check_interval,
            ),
            ("transactions.id_expiration", self.transactions.id_expiration),
        ] {
            if value.get().is_zero() {
                return bad(key, "must be above zero");
            }
        }
        if self.broker.max_inflight_requests == 0 {
            return bad("broker.max_inflight_requests", "must be at least 1");
        }
        if self.broker.max_inflight_request_bytes < 1024 {
            return bad("broker.max_inflight_request_bytes", "must be at least 1024");
        }
        if self.topics.default_partitions < 1 || self.topics.default_partitions > self.topics.max_partitions {
            return bad(
                "topics.default_partitions",
                "must be between 1 and topics.max_partitions",
            );
        }
        if self.quotas.window_num == 0 {
            return bad("quotas.window_num", "must be at least 1");
        }
        let window = self.quotas.window_size.get();
        if window.is_zero() || window.subsec_nanos() != 0 {
            return bad(
                "quotas.window_size",
                "must be a whole number of seconds, at least 1s",
            );
        }
        if self.fetch.max_response_bytes < 1024 {
            return bad("fetch.max_response_bytes", "must be at least 1024");
        }
        if self.groups.min_session_timeout > self.groups.max_session_timeout {
            return bad(
                "groups.min_session_timeout",
                "must not exceed groups.max_session_timeout",
            );
        }
        if self.cluster.heartbeat_interval.get().is_zero()
            || self.cluster.node_timeout <= self.cluster.heartbeat_interval
        {
            return bad(
                "cluster.node_timeout",
                "must be longer than cluster.heartbeat_interval, which must be above zero",
            );
        }
        if self.tiering.tick_interval.get().is_zero() || self.tiering.lease_ttl <= self.tiering.tick_interval
        {
            return bad(
                "tiering.lease_ttl",
                "must be longer than tiering.tick_interval, which must be above zero",
            );
        }
        if self.tiering.catalog != "sql" && self.tiering.catalog != "rest" {
            return bad("tiering.catalog", "must be `sql` or `rest`");
        }
        if self.tiering.catalog == "rest" && self.tiering.catalog_uri.is_empty() {
            return bad("tiering.catalog_uri", "is required with tiering.catalog = rest");
        }
        if self.tiering.catalog == "sql"
            && !self.tiering.catalog_uri.is_empty()
            && !["sqlite:", "postgres:", "postgresql:"]
                .iter()
                .any(|scheme| self.tiering.catalog_uri.starts_with(scheme))
        {
            return bad(
                "tiering.catalog_uri",
                "a SQL catalog URI starts with sqlite:, postgres: or postgresql:",
            );
        }
        if self.tiering.namespace.is_empty() || self.tiering.catalog_name.is_empty() {
            return bad(
                "tiering.namespace",
                "the namespace and catalog name must not be empty",
            );
        }
        if self.tiering.row_group_rows == 0 {
            return bad("tiering.row_group_rows", "must be at least 1");
        }
        if self.tiering.archive_partitions == 0 {
            return bad("tiering.archive_partitions", "must be at least 1");
        }
        let Some((_, levels)) = ARCHIVE_CODECS
            .iter()
            .find(|(codec, _)| *codec == self.tiering.compression)
        else {
            return bad(
                "tiering.compression",
                "must be zstd, lz4, snappy, gzip or uncompressed",
            );
        };
        if let Some(level) = self.tiering.compression_level {
            match levels {
                Some((levels, _)) if levels.contains(&level) => {}
                Some((levels, _)) => {
                    return bad(
                        "tiering.compression_level",
                        &format!(
                            "must be {} to {} for {}",
                            levels.start(),
                            levels.end(),
                            self.tiering.compression
                        ),
                    );
                }
                None => {
                    return bad(
                        "tiering.compression_level",
                        &format!("{} has no levels: leave it unset", self.tiering.compression),
                    );
                }
            }
        }
        if self.tiering.snapshots_kept == 0 {
            return bad(
                "tiering.snapshots_kept",
                "must be at least 1 (the current snapshot)",
            );
        }
        if self.storage.acks_all_connections == 0 {
            return bad("storage.acks_all_connections", "must be at least 1");
        }
        if self.topics.max_message_bytes < 0 {
            return bad("topics.max_message_bytes", "must be >= 0");
        }
        if self.redis.namespace.is_empty() || self.redis.namespace.contains(['{', '}', ' ']) {
            return bad("redis.namespace", "must be non-empty, without braces or spaces");
        }
        let urls: Vec<&str> = self.redis.url.split(',').map(str::trim).collect();
        let unix = |url: &&str| url.starts_with("unix://") || url.starts_with("redis+unix://");
        if urls.iter().any(unix) {
            if self.redis.mode == RedisMode::Cluster {
                return bad(
                    "redis.url",
                    "names a Unix socket, but Redis Cluster nodes are reached over TCP: give redis:// or rediss:// seed nodes",
                );
            }
            if urls
                .iter()
                .any(|url| !url.starts_with("unix:///") && !url.starts_with("redis+unix:///"))
            {
                return bad(
                    "redis.url",
                    "a Unix socket URL takes an absolute path: unix:///path/to/redis.sock",
                );
            }
        } else if urls
            .iter()
            .any(|url| !url.starts_with("redis://") && !url.starts_with("rediss://"))
        {
            return bad(
                "redis.url",
                "must start with redis:// (rediss:// for TLS, unix:// for a Unix socket)",
            );
        }
        if urls.iter().any(|url| url.contains("#insecure")) {
            return bad(
                "redis.url",
                "#insecure (TLS without certificate checks) is not supported: set redis.tls_ca_file to the CA that signed Redis's certificate",
            );
        }
        let tls = urls.iter().filter(|url| url.starts_with("rediss://")).count();
        if tls != 0 && tls != urls.len() {
            return bad("redis.url", "mixes redis:// and rediss:// nodes");
        }
        if let Some(ca) = &self.redis.tls_ca_file {
            if tls == 0 {
                return bad(
                    "redis.tls_ca_file",
                    "is set, but redis.url is not rediss:// (TLS)",
                );
            }
            if !ca.is_file() {
                return bad(
                    "redis.tls_ca_file",
                    &format!("{} is not a readable file", ca.display()),
                );
            }
        }
        if urls.len() > 1 && self.redis.mode == RedisMode::Single {
            return bad(
                "redis.url",
                "names several nodes: set redis.mode = \"cluster\" for Redis Cluster seed nodes",
            );
        }
        self.validate_security()
    }

    /// The host clients are told to connect to.
    pub fn advertised_host(&self) -> String {
        match &self.broker.advertised_host {
            Some(host) => host.clone(),
            None if self.broker.listen.ip().is_unspecified() => "127.0.0.1".to_owned(),
            None => self.broker.listen.ip().to_string(),
        }
    }

    /// The port clients are told to connect to.
    pub fn advertised_port(&self) -> u16 {
        self.broker.advertised_port.unwrap_or(self.broker.listen.port())
    }
}

/// An environment variable's or `--set` value: a boolean or an integer
/// when it reads as one exactly as written, else the text itself. So a
/// text setting keeps what was written (`1.10`, `1_000`, `0x1F` and `1e3`
/// are not turned into `1.1`, `1000`, `31` and `1000.0`: no setting is a
/// float, and an integer setting takes the plain digits).
fn parse_scalar(text: &str) -> toml::Value {
    match format!("v = {text}").parse::<toml::Table>() {
        Ok(mut t) => match t.remove("v") {
            Some(v @ toml::Value::Boolean(_)) => v,
            Some(toml::Value::Integer(n)) if n.to_string() == text.trim() => toml::Value::Integer(n),
            _ => toml::Value::String(text.to_owned()),
        },
        Err(_) => toml::Value::String(text.to_owned()),
    }
}

fn merge(into: &mut toml::Table, from: toml::Table) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(incoming)) => merge(existing, incoming),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config file in the temp directory, removed on drop.
    struct TempFile(std::path::PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn file(text: &str) -> TempFile {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("ketch-config-{}-{n}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let s = Loader::new().load().unwrap();
        assert_eq!(s.broker.listen.to_string(), "0.0.0.0:9092");
        assert_eq!(s.redis.url, "redis://127.0.0.1:6379");
        assert_eq!(s.redis.mode, RedisMode::Single);
        assert_eq!(s.http.listen.to_string(), "127.0.0.1:9644");
        assert_eq!(s.broker.max_request_bytes, 100 * 1024 * 1024);
        assert!(s.topics.auto_create);
        assert_eq!(s.advertised_host(), "127.0.0.1");
        assert_eq!(s.advertised_port(), 9092);
    }

    #[test]
    fn file_env_and_flags_override_in_order() {
        let f = file("[broker]\nid = 3\nlisten = \"127.0.0.1:1000\"\n[fetch]\nmax_wait = \"2s\"\n");
        let s = Loader::new()
            .file(&f.0)
            .unwrap()
            .env([
                ("KETCH_BROKER_LISTEN".to_owned(), "127.0.0.1:2000".to_owned()),
                ("KETCH_TOPICS_AUTO_CREATE".to_owned(), "false".to_owned()),
                ("KETCH_TIERING_TICK_INTERVAL".to_owned(), "1s".to_owned()),
                ("PATH".to_owned(), "/bin".to_owned()),
            ])
            .unwrap()
            .set("broker", "advertised_port", "3000")
            .load()
            .unwrap();
        assert_eq!(s.broker.id, Some(3));
        assert_eq!(s.broker.listen.port(), 2000);
        assert!(!s.topics.auto_create);
        assert_eq!(s.fetch.max_wait, Duration::from_secs(2));
        assert_eq!(s.tiering.tick_interval, Duration::from_secs(1));
        assert_eq!(s.advertised_port(), 3000);
    }

    /// A text setting keeps what was written, whatever number it looks
    /// like (`1.10` was `1.1`, `0x1F` was `31`), and a list of one numeric
    /// name is that name (it was refused).
    #[test]
    fn text_settings_from_env_keep_what_was_written() {
        for text in ["1.10", "1_000", "0x1F", "1e3", "007", "42"] {
            let s = Loader::new()
                .env([("KETCH_REDIS_NAMESPACE".to_owned(), text.to_owned())])
                .unwrap()
                .load()
                .unwrap();
            assert_eq!(s.redis.namespace, text);
        }
        let s = Loader::new()
            .env([("KETCH_ACL_SUPER_USERS".to_owned(), "12345".to_owned())])
            .unwrap()
            .set("broker", "advertised_port", "3000")
            .load()
            .unwrap();
        assert_eq!(s.acl.super_users, ["12345"]);
        assert_eq!(s.advertised_port(), 3000, "an integer setting takes plain digits");
        let s = Loader::new()
            .env([("KETCH_BROKER_MAX_CONNECTIONS".to_owned(), "1000 ".to_owned())])
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(s.broker.max_connections, 1000, "spaces around the digits");
        let err = Loader::new()
            .set("broker", "advertised_port", "3_000")
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("advertised_port"), "{err}");
    }

    #[test]
    fn tiering_defaults_derive_from_data_dir_and_env_sets_s3_keys() {
        let s = Loader::new()
            .env([
                ("KETCH_TIERING_DATA_DIR".to_owned(), "/var/lib/ketch".to_owned()),
                ("KETCH_TIERING_S3_ACCESS_KEY_ID".to_owned(), "AKIA".to_owned()),
                ("KETCH_TIERING_S3_PATH_STYLE".to_owned(), "true".to_owned()),
            ])
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(
            s.tiering.catalog_uri(),
            "sqlite:/var/lib/ketch/catalog.db?mode=rwc"
        );
        assert_eq!(s.tiering.warehouse(), "file:///var/lib/ketch/warehouse");
        assert_eq!(s.tiering.snapshot_retention, Duration::from_secs(3600));
        assert_eq!(
            (s.tiering.snapshots_kept, s.tiering.maintenance_commits),
            (10, 20)
        );
        assert_eq!(s.tiering.archive_partitions, 2);
        assert_eq!(s.tiering.s3_access_key_id, "AKIA");
        assert!(s.tiering.s3_path_style);
        let s = Loader::new()
            .set("tiering", "warehouse", "s3://lake/prefix/")
            .set("tiering", "catalog_uri", "postgres://u@h/db")
            .load()
            .unwrap();
        assert_eq!(s.tiering.warehouse(), "s3://lake/prefix");
        assert_eq!(s.tiering.warehouse_dir(), None);
        assert_eq!(s.tiering.catalog_uri(), "postgres://u@h/db");
    }

    #[test]
    fn a_fetch_wait_of_ten_minutes_or_more_is_refused() {
        let err = Loader::new()
            .set("fetch", "max_wait", "10m")
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("fetch.max_wait"), "{err}");
        assert!(Loader::new().set("fetch", "max_wait", "9m").load().is_ok());
    }

    #[test]
    fn bad_catalog_settings_are_refused_with_their_key() {
        for (key, value, named) in [
            ("catalog", "hive", "tiering.catalog"),
            ("catalog_uri", "mysql://x", "tiering.catalog_uri"),
            ("row_group_rows", "0", "tiering.row_group_rows"),
            ("archive_partitions", "0", "tiering.archive_partitions"),
            ("snapshots_kept", "0", "tiering.snapshots_kept"),
            ("compression", "lzo", "tiering.compression"),
            ("compression", "ZSTD", "tiering.compression"),
        ] {
            let err = Loader::new()
                .set("tiering", key, value)
                .load()
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{key}={value}: {err}");
        }
        let err = Loader::new()
            .set("tiering", "catalog", "rest")
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("tiering.catalog_uri"), "{err}");
        for (codec, level, message) in [
            ("zstd", "0", "must be 1 to 22 for zstd"),
            ("zstd", "23", "must be 1 to 22 for zstd"),
            ("gzip", "10", "must be 0 to 9 for gzip"),
            ("lz4", "1", "lz4 has no levels"),
            ("uncompressed", "3", "uncompressed has no levels"),
        ] {
            let err = Loader::new()
                .set("tiering", "compression", codec)
                .set("tiering", "compression_level", level)
                .load()
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("tiering.compression_level") && err.contains(message),
                "{codec} {level}: {err}"
            );
        }
    }

    #[test]
    fn archive_compression_defaults_to_zstd_and_takes_each_codec() {
        let s = Loader::new().load().unwrap();
        assert_eq!(
            (s.tiering.compression.as_str(), s.tiering.compression_level),
            ("zstd", None)
        );
        assert_eq!(s.tiering.compression_level_or_default(), Some(1));
        for (codec, levels) in ARCHIVE_CODECS {
            let s = Loader::new()
                .env([("KETCH_TIERING_COMPRESSION".to_owned(), codec.to_owned())])
                .unwrap()
                .load()
                .unwrap();
            assert_eq!(s.tiering.compression, codec);
            if let Some((levels, _)) = levels {
                let s = Loader::new()
                    .set("tiering", "compression", codec)
                    .set("tiering", "compression_level", &levels.end().to_string())
                    .load()
                    .unwrap();
                assert_eq!(s.tiering.compression_level, Some(*levels.end()));
            }
        }
    }

    #[test]
    fn unknown_key_in_file_is_named() {
        let f = file("[broker]\nlisten_adress = \"127.0.0.1:1\"\n");
        let err = Loader::new().file(&f.0).unwrap().load().unwrap_err().to_string();
        assert!(err.contains("listen_adress"), "{err}");
        let f = file("[brokers]\nid = 1\n");
        let err = Loader::new().file(&f.0).unwrap().load().unwrap_err().to_string();
        assert!(err.contains("brokers"), "{err}");
    }

    #[test]
    fn a_numeric_looking_env_value_still_sets_a_string_key() {
        let s = Loader::new()
            .env([
                ("KETCH_BROKER_CLUSTER_ID".to_owned(), "123".to_owned()),
                ("KETCH_REDIS_NAMESPACE".to_owned(), "7".to_owned()),
                ("KETCH_BROKER_ADVERTISED_HOST".to_owned(), "10".to_owned()),
            ])
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(s.broker.cluster_id, "123");
        assert_eq!(s.redis.namespace, "7");
        assert_eq!(s.broker.advertised_host.as_deref(), Some("10"));
    }

    #[test]
    fn cluster_mode_takes_a_list_of_seed_nodes_and_single_mode_refuses_one() {
        let s = Loader::new()
            .env([
                ("KETCH_REDIS_MODE".to_owned(), "cluster".to_owned()),
                (
                    "KETCH_REDIS_URL".to_owned(),
                    "redis://a:7000, redis://b:7000".to_owned(),
                ),
            ])
            .unwrap()
            .load()
            .unwrap();
        assert_eq!(s.redis.mode, RedisMode::Cluster);
        let err = Loader::new()
            .set("redis", "url", "redis://a:7000,redis://b:7000")
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("redis.mode"), "{err}");
        let err = Loader::new()
            .set("redis", "mode", "sentinel")
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("sentinel") || err.contains("mode"), "{err}");
    }

    #[test]
    fn a_unix_socket_is_taken_in_single_mode_only() {
        for url in [
            "unix:///run/redis/redis.sock",
            "redis+unix:///tmp/r.sock?pass=x&db=2",
        ] {
            let s = Loader::new().set("redis", "url", url).load().unwrap();
            assert_eq!(s.redis.url, url);
        }
        let refused = |loader: Loader| loader.load().unwrap_err().to_string();
        let err = refused(
            Loader::new()
                .set("redis", "url", "unix:///tmp/r.sock")
                .set("redis", "mode", "cluster"),
        );
        assert!(err.contains("redis.url") && err.contains("TCP"), "{err}");
        let err = refused(Loader::new().set("redis", "url", "unix://tmp/r.sock"));
        assert!(err.contains("absolute path"), "{err}");
        let err = refused(Loader::new().set("redis", "url", "http://127.0.0.1:6379"));
        assert!(err.contains("must start with redis://"), "{err}");
        let err = refused(Loader::new().set("redis", "url", "unix:///tmp/r.sock").set(
            "redis",
            "tls_ca_file",
            "/etc/hostname",
        ));
        assert!(err.contains("redis.tls_ca_file"), "{err}");
    }

    #[test]
    fn unknown_env_key_is_named() {
        let err = Loader::new()
            .env([("KETCH_REDIS_URLL".to_owned(), "redis://x".to_owned())])
            .unwrap()
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("urll"), "{err}");
    }

    #[test]
    fn per_address_connection_limits_are_read_and_checked() {
        let settings = Loader::new()
            .set("broker", "max_connections_per_ip", "5")
            .set(
                "broker",
                "max_connections_per_ip_overrides",
                "127.0.0.1:200, gateway.internal:0,[::1]:3",
            )
            .load()
            .unwrap();
        assert_eq!(settings.broker.max_connections_per_ip, 5);
        assert_eq!(
            settings.broker.connection_overrides().unwrap(),
            [
                ("127.0.0.1".to_owned(), 200),
                ("gateway.internal".to_owned(), 0),
                ("::1".to_owned(), 3)
            ]
        );
        assert_eq!(
            Loader::new().load().unwrap().broker.max_connections_per_ip,
            MAX_CONNECTIONS_PER_IP,
            "no limit by default, as Kafka"
        );
        for (limit, overrides, said) in [
            ("5", "127.0.0.1", "is not host:count"),
            ("5", "127.0.0.1:many", "whole number"),
            ("5", "127.0.0.1:-1", "whole number"),
            ("5", ":3", "names no host"),
            ("0", "", "refuses every client"),
        ] {
            let err = Loader::new()
                .set("broker", "max_connections_per_ip", limit)
                .set("broker", "max_connections_per_ip_overrides", overrides)
                .load()
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("broker.max_connections_per_ip") && err.contains(said),
                "{overrides:?}: {err}"
            );
        }
        // 0 with overrides: only the addresses named may connect.
        assert!(
            Loader::new()
                .set("broker", "max_connections_per_ip", "0")
                .set("broker", "max_connections_per_ip_overrides", "10.0.0.1:10")
                .load()
                .is_ok()
        );
    }

    #[test]
    fn bad_values_are_rejected_with_the_key() {
        let err = Loader::new()
            .set("fetch", "max_wait", "5 parsecs")
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_wait") || err.contains("parsecs"), "{err}");
        let err = Loader::new()
            .set("topics", "default_partitions", "0")
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("topics.default_partitions"), "{err}");
        let err = Loader::new()
            .set("broker", "max_inflight_request_bytes", "100")
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("broker.max_inflight_request_bytes"), "{err}");
        for key in ["offsets_retention", "offsets_retention_check_interval"] {
            let err = Loader::new()
                .set("groups", key, "0s")
                .load()
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("groups.{key}")), "{err}");
        }
        // The transaction sweep's interval panicked a task nobody watched.
        for key in ["max_timeout", "abort_check_interval", "id_expiration"] {
            let err = Loader::new()
                .set("transactions", key, "0s")
                .load()
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("transactions.{key}")), "{err}");
        }
        let err = Loader::new().assignments(["nodot=1"]).unwrap_err().to_string();
        assert!(err.contains("nodot"), "{err}");
    }
}
