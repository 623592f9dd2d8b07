//! ketch-storage: the Redis tier.
//!
//! Every partition is a Redis Stream holding one entry per Kafka record
//! batch, with its metadata, time index and wake-up channel under one hash
//! tag (DESIGN §3). [`Store`] is the one seam the gateway talks to: topics,
//! append, read, offsets. It knows record-batch bytes but nothing else of the
//! Kafka wire protocol.

pub mod batch;
mod brokers;
mod cluster_configs;
pub mod compact;
mod connection;
mod durable;
pub mod error;
pub mod fuzzing;
pub mod groups;
pub mod keys;
mod layout;
mod log;
mod metrics;
mod placement;
mod producers;
mod quotas;
mod security;
pub mod segments;
mod tail;
mod topics;
pub mod transactions;
pub mod wake;
mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::Value;
use redis::aio::ConnectionManager;

use crate::connection::Conn;

pub use brokers::{BrokerRecord, ListenerRecord, Registration};
pub use connection::Mode;
pub use error::{Result, SequenceError, StorageError};
pub use groups::{CommittedOffset, TopicPartition};
pub use keys::Keys;
pub use layout::{LAYOUT_VERSION, LayoutCheck};
pub use log::{AppendOutcome, PartitionOffsets, ReadPartition, ReadRequest};
pub use metrics::describe_metrics;
pub use placement::Masters;
pub use producers::{ProducerSummary, decode_producer_state};
pub use quotas::{QuotaChange, StoredQuota};
pub use security::{ScramChange, StoredCredential};
pub use topics::{Topic, validate_topic_name};
pub use transactions::{Decided, JoinReply, StagingTxn, TxnItems, TxnReply, TxnState};
pub use wake::{Fired, WakeHub};

/// Connection settings of the storage layer.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// One server's URL; in cluster mode, seed nodes separated by commas.
    pub url: String,
    pub mode: Mode,
    /// PEM certificate authorities for `rediss://` (unset: system roots).
    pub tls_ca_file: Option<std::path::PathBuf>,
    pub namespace: String,
    pub command_timeout: std::time::Duration,
    pub connect_timeout: std::time::Duration,
    /// How long a wake-up subscription outlives its last waiter.
    pub subscription_linger: std::time::Duration,
    /// What the tails of partitions that fetches are tailing may hold
    /// together (`tail.rs`; 0: keep none).
    pub tail_cache_bytes: usize,
    /// What an acks=all append waits for.
    pub durability: Durability,
}

/// What an acks=all append waits for after the script ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durability {
    /// Replicas that must acknowledge (`WAIT`); 0 waits for nothing.
    pub replicas: u32,
    pub timeout: std::time::Duration,
    /// Also wait for the primary's AOF fsync (`WAITAOF`).
    pub fsync: bool,
    /// Connections reserved for acks=all appends and their `WAIT`s; that
    /// many can wait for replicas at once.
    pub connections: usize,
}

impl Durability {
    /// Whether an acks=all append waits for anything past the script.
    pub fn waits(&self) -> bool {
        self.replicas > 0 || self.fsync
    }
}

impl StoreConfig {
    pub fn from_settings(settings: &ketch_config::Settings) -> Self {
        Self {
            url: settings.redis.url.clone(),
            tls_ca_file: settings.redis.tls_ca_file.clone(),
            mode: match settings.redis.mode {
                ketch_config::RedisMode::Single => Mode::Single,
                ketch_config::RedisMode::Cluster => Mode::Cluster,
            },
            namespace: settings.redis.namespace.clone(),
            command_timeout: settings.redis.command_timeout.get(),
            connect_timeout: settings.redis.connect_timeout.get(),
            subscription_linger: settings.fetch.subscription_linger.get(),
            tail_cache_bytes: settings.fetch.tail_cache_bytes,
            durability: Durability {
                replicas: settings.storage.acks_all_replicas,
                timeout: settings.storage.acks_all_timeout.get(),
                fsync: settings.storage.acks_all_fsync,
                connections: settings.storage.acks_all_connections,
            },
        }
    }
}

/// Handle to the Redis tier; cheap to clone.
#[derive(Clone)]
pub struct Store {
    conn: Conn,
    /// acks=all appends and their WAIT: `WAIT` counts the writes of its own
    /// connection and blocks it, so each such append takes a connection of
    /// the pool for its write and its wait.
    durable: Arc<durable::DurablePool>,
    durability: Durability,
    keys: Keys,
    wake: WakeHub,
    topics: Arc<topics::TopicCache>,
    appenders: Arc<log::Appenders>,
    /// When [`Store::forget_deleted_partitions`] last pruned `appenders`.
    partitions_pruned: Arc<AtMostEvery>,
    scripts: Arc<Scripts>,
    /// The server's address in single mode (`host:port`), for reports.
    server: Arc<str>,
    /// `redis.command_timeout`.
    command_timeout: std::time::Duration,
    /// Whether scripts write producer state in the compact encoding
    /// (`scripts/producer_state.lua`): once the layout is 3 (layout.rs).
    compact_producers: Arc<AtomicBool>,
}

/// A script with a Lua prelude of shared functions prepended: the codec
/// of idempotent producers' state (`scripts/producer_state.lua`), or the
/// next version of a set every gateway keeps a copy of
/// (`scripts/next_version.lua`).
macro_rules! with_prelude {
    ($prelude:literal, $file:literal) => {
        concat!(include_str!($prelude), include_str!($file))
    };
}

/// A script that runs when Redis is at `maxmemory` under `noeviction`
/// (its `allow-oom` flag): one that frees memory (retention, DeleteRecords,
/// a segment's record as archived, after which local retention trims it:
/// Redis let that one through anyway, its first write being a ZREM) or
/// keeps a gateway's registration, leases, group listing, the
/// transaction index and the producer-id counter (each one key on a Redis
/// Cluster: on a full master they would stop every transaction and every
/// idempotent producer) and the gateways' internal secret, each growing
/// memory by little. Redis refuses a script without flags whose
/// first write may grow memory, so a full Redis would otherwise never be
/// emptied by ketch: retention's seal, DeleteRecords' new log start and
/// the archiver's lease would all be refused.
macro_rules! allow_oom {
    ($($file:literal),+) => {
        concat!("#!lua flags=allow-oom\n", $(include_str!($file)),+)
    };
}

/// The append script as loaded (log.rs loads it by hand where a master
/// lacks it).
const APPEND_SCRIPT: &str = with_prelude!("scripts/producer_state.lua", "scripts/append.lua");

struct Scripts {
    append: redis::Script,
    delete_records: redis::Script,
    replace_topic: redis::Script,
    create_topic: redis::Script,
    heartbeat: redis::Script,
    deregister: redis::Script,
    store_group: redis::Script,
    seal: redis::Script,
    lease: redis::Script,
    segment_state: redis::Script,
    archive_listing: redis::Script,
    change_acls: redis::Script,
    change_versioned_hash: redis::Script,
    txn: redis::Script,
    txn_join: redis::Script,
    txn_offsets: redis::Script,
    commit_offsets: redis::Script,
    txn_index: redis::Script,
    internal_secret: redis::Script,
    compact_add: redis::Script,
    compact_swap: redis::Script,
    archive_guard: redis::Script,
    hset_existing: redis::Script,
    oom_command: redis::Script,
    producer_id: redis::Script,
    delete_offsets: redis::Script,
    expire_offsets: redis::Script,
    keep_until: redis::Script,
    retain_group: redis::Script,
    reassert_expiry: redis::Script,
    mutation_tokens: redis::Script,
}

impl Store {
    /// `command` on `key` as a script Redis runs even at maxmemory
    /// (`scripts/oom_command.lua`); the caller adds the command's
    /// arguments after the key.
    pub(crate) fn oom_command(&self, key: &str, command: &str) -> redis::ScriptInvocation<'_> {
        let mut invocation = self.scripts.oom_command.key(key);
        invocation.arg(command);
        invocation
    }

    /// Creates the store. Never fails because Redis is down: connections are
    /// made on first use and re-made after a failure, so a gateway started
    /// before Redis serves as soon as Redis is up.
    pub fn new(config: &StoreConfig) -> Result<Self> {
        let seeds = connection::seed_urls(&config.url);
        let Some(first) = seeds.first().copied() else {
            return Err(StorageError::Unavailable("no redis url".to_owned()));
        };
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.command_timeout))
            .set_number_of_retries(2)
            .set_max_delay(std::time::Duration::from_millis(500));
        // A WAIT may block for the whole acks_all timeout before it answers:
        // its connection's response timeout must not cut it short.
        let durable_config = manager_config
            .clone()
            .set_response_timeout(Some(config.command_timeout + config.durability.timeout));
        let size = config.durability.connections;
        let tls = connection::Tls {
            ca_pem: match &config.tls_ca_file {
                Some(path) => Some(std::fs::read(path).map_err(|e| {
                    StorageError::Unavailable(format!(
                        "cannot read redis.tls_ca_file {}: {e}",
                        path.display()
                    ))
                })?),
                None => None,
            },
        };
        let wire = durable::WireSettings {
            tls: tls.clone(),
            connect_timeout: config.connect_timeout,
            response_timeout: config.command_timeout,
        };
        let mut server = String::new();
        let (conn, durable, wake) = match config.mode {
            Mode::Single => {
                if seeds.len() > 1 {
                    return Err(StorageError::Unavailable(
                        "several redis urls: set redis.mode = cluster for Redis Cluster seed nodes"
                            .to_owned(),
                    ));
                }
                let info = redis::IntoConnectionInfo::into_connection_info(first)
                    .map_err(|e| StorageError::Unavailable(format!("invalid redis url: {e}")))?;
                server = info.addr().to_string();
                let client = tls.client(info)?;
                let conn = ConnectionManager::new_lazy_with_config(client.clone(), manager_config)?;
                let durable = durable::DurablePool::single(&client, durable_config, wire, size)?;
                let wake = WakeHub::start(client, tls, config.subscription_linger, config.connect_timeout);
                (Conn::Single(connection::SingleConn::new(conn)), durable, wake)
            }
            Mode::Cluster => {
                let conn = Conn::cluster(
                    &seeds,
                    &tls,
                    config.connect_timeout,
                    config.command_timeout,
                    None,
                    &[],
                )?;
                let durable = durable::DurablePool::cluster(conn.clone(), first, durable_config, wire, size)?;
                let wake = WakeHub::start_cluster(
                    &seeds,
                    &tls,
                    config.subscription_linger,
                    config.connect_timeout,
                    config.command_timeout,
                )?;
                (conn, durable, wake)
            }
        };
        wake.set_tail_budget(config.tail_cache_bytes);
        Ok(Self {
            conn,
            durable: Arc::new(durable),
            durability: config.durability,
            keys: Keys::new(&config.namespace),
            wake,
            topics: Arc::new(topics::TopicCache::default()),
            appenders: Arc::new(log::Appenders::default()),
            partitions_pruned: Arc::default(),
            command_timeout: config.command_timeout,
            scripts: Arc::new(Scripts {
                append: redis::Script::new(APPEND_SCRIPT),
                delete_records: redis::Script::new(allow_oom!("scripts/delete_records.lua")),
                replace_topic: redis::Script::new(include_str!("scripts/add_partitions.lua")),
                create_topic: redis::Script::new(include_str!("scripts/create_topic.lua")),
                heartbeat: redis::Script::new(allow_oom!("scripts/heartbeat.lua")),
                deregister: redis::Script::new(include_str!("scripts/deregister.lua")),
                store_group: redis::Script::new(include_str!("scripts/store_group.lua")),
                seal: redis::Script::new(allow_oom!("scripts/producer_state.lua", "scripts/seal.lua")),
                lease: redis::Script::new(allow_oom!("scripts/lease.lua")),
                segment_state: redis::Script::new(allow_oom!("scripts/segment_state.lua")),
                archive_listing: redis::Script::new(include_str!("scripts/archive_listing.lua")),
                change_acls: redis::Script::new(with_prelude!(
                    "scripts/next_version.lua",
                    "scripts/change_acls.lua"
                )),
                change_versioned_hash: redis::Script::new(with_prelude!(
                    "scripts/next_version.lua",
                    "scripts/change_versioned_hash.lua"
                )),
                txn: redis::Script::new(include_str!("scripts/txn.lua")),
                txn_join: redis::Script::new(with_prelude!(
                    "scripts/producer_state.lua",
                    "scripts/txn_join.lua"
                )),
                txn_offsets: redis::Script::new(with_prelude!(
                    "scripts/offset_order.lua",
                    "scripts/txn_offsets.lua"
                )),
                commit_offsets: redis::Script::new(with_prelude!(
                    "scripts/offset_order.lua",
                    "scripts/commit_offsets.lua"
                )),
                txn_index: redis::Script::new(allow_oom!("scripts/txn_index.lua")),
                internal_secret: redis::Script::new(allow_oom!("scripts/internal_secret.lua")),
                compact_add: redis::Script::new(include_str!("scripts/compact_add.lua")),
                compact_swap: redis::Script::new(include_str!("scripts/compact_swap.lua")),
                archive_guard: redis::Script::new(include_str!("scripts/archive_guard.lua")),
                hset_existing: redis::Script::new(include_str!("scripts/hset_existing.lua")),
                oom_command: redis::Script::new(allow_oom!("scripts/oom_command.lua")),
                producer_id: redis::Script::new(allow_oom!("scripts/producer_id.lua")),
                delete_offsets: redis::Script::new(include_str!("scripts/delete_offsets.lua")),
                expire_offsets: redis::Script::new(include_str!("scripts/expire_offsets.lua")),
                keep_until: redis::Script::new(include_str!("scripts/keep_until.lua")),
                retain_group: redis::Script::new(allow_oom!("scripts/retain_group.lua")),
                reassert_expiry: redis::Script::new(allow_oom!("scripts/reassert_expiry.lua")),
                mutation_tokens: redis::Script::new(include_str!("scripts/mutation_tokens.lua")),
            }),
            server: Arc::from(server),
            compact_producers: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The scripts' argument saying whether to write producer state in the
    /// compact encoding ('1') or as JSON ('0').
    fn compact_producers_arg(&self) -> &'static str {
        if self.compact_producers.load(Ordering::Relaxed) {
            "1"
        } else {
            "0"
        }
    }

    /// Checks that Redis answers: the server, or in a Redis Cluster the
    /// masters of the topic and broker registries, which every gateway
    /// needs. A `PING` there goes to every master and fails with any one of
    /// them, though the partitions, groups and transactions on the others
    /// go on being served. A failed command makes the connection manager
    /// reconnect, so one failure is followed by one more try: the first
    /// probe after Redis comes back already succeeds.
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        let commands = match self.mode() {
            Mode::Single => vec![redis::cmd("PING")],
            // One command per key: they are in different slots.
            Mode::Cluster => [self.keys.topics(), self.brokers_key()]
                .into_iter()
                .map(|key| redis::cmd("EXISTS").arg(key).clone())
                .collect(),
        };
        for command in &commands {
            let first: redis::RedisResult<Value> = command.query_async(&mut conn).await;
            if first.is_err() {
                let _: Value = command.query_async(&mut conn).await?;
            }
        }
        Ok(())
    }

    /// The wake-up hub fetches wait on.
    pub fn wake(&self) -> &WakeHub {
        &self.wake
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub(crate) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Refuses a Redis server older than 7.0 ([`StorageError::ServerTooOld`]):
    /// without the check a 6.x server ran none of ketch's flagged scripts,
    /// the gateway never registered and said so only in a Lua syntax
    /// error. `INFO server` alone (before 7.0 INFO takes one section), on
    /// the server in single mode and on every master in a cluster (redis-rs
    /// asks them all). A server that does not say, or an INFO not answered
    /// (a server or master down, a Redis user without INFO), is let through
    /// with a warning: the check must not keep a gateway from starting.
    pub async fn check_server_version(&self) -> Result<()> {
        let reply: redis::RedisResult<Value> = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut self.conn())
            .await;
        let texts: Vec<(String, String)> = match reply {
            // A cluster connection asks every master: each one's text.
            Ok(Value::Map(nodes)) => nodes
                .into_iter()
                .filter_map(|(node, v)| {
                    let node = text_of(node).unwrap_or_else(|| self.server.to_string());
                    Some((node, text_of(v)?))
                })
                .collect(),
            Ok(reply) => text_of(reply)
                .map(|text| (self.server.to_string(), text))
                .into_iter()
                .collect(),
            // Not answered (a server or a master down, a user without
            // INFO): let through; what needs Redis fails on its own.
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the Redis server's version (INFO server); ketch needs 7.0 or newer");
                return Ok(());
            }
        };
        for (server, text) in texts {
            if let Some(version) = too_old(&text) {
                return Err(StorageError::ServerTooOld {
                    server,
                    version: version.to_owned(),
                });
            }
        }
        Ok(())
    }

    /// `INFO memory stats errorstats server` of the Redis server, or of each
    /// master of a Redis Cluster asked on its own: (address, its text or
    /// why it gave none), sorted by address. A master that does not answer
    /// fails only its own entry (one INFO through the cluster connection
    /// would fail for all); an error here is the server's, or the slot
    /// map's when the masters cannot be found.
    pub async fn server_info(&self) -> Result<Vec<(String, Result<String>)>> {
        if self.mode() == Mode::Single {
            let reply: Value = redis::cmd("INFO")
                .arg("memory")
                .arg("stats")
                .arg("errorstats")
                .arg("server")
                .query_async(&mut self.conn())
                .await?;
            let Some(text) = text_of(reply) else {
                return Err(StorageError::Data("unexpected INFO reply".to_owned()));
            };
            return Ok(vec![(self.server.to_string(), Ok(text))]);
        }
        let asks = self
            .durable
            .masters()
            .await?
            .into_iter()
            .map(|(address, wire)| async move {
                let mut packed = wire::Packed::default();
                packed
                    .command(5)
                    .arg("INFO")
                    .arg("memory")
                    .arg("stats")
                    .arg("errorstats")
                    .arg("server");
                let text = match wire.request(packed).await.map(|mut replies| replies.pop()) {
                    Ok(Some(wire::Reply::Bulk(text))) => Ok(String::from_utf8_lossy(&text).into_owned()),
                    Ok(Some(wire::Reply::Error(e))) => Err(StorageError::Unavailable(format!("INFO: {e}"))),
                    Ok(other) => Err(StorageError::Data(format!("unexpected INFO reply {other:?}"))),
                    Err(e) => Err(e),
                };
                (address, text)
            });
        let mut servers = futures::future::join_all(asks).await;
        servers.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(servers)
    }

    /// Whether this store talks to one Redis server or a Redis Cluster.
    pub fn mode(&self) -> Mode {
        self.conn.mode()
    }

    /// How long a command waits for its reply (`redis.command_timeout`).
    pub fn command_timeout(&self) -> std::time::Duration {
        self.command_timeout
    }
}

/// Lets something happen at most once per interval (a redial after a
/// READONLY, a prune of what deleted topics left, a warning).
#[derive(Debug, Default)]
pub struct AtMostEvery(std::sync::Mutex<Option<std::time::Instant>>);

impl AtMostEvery {
    /// True, and the interval starts again, when it was last true at least
    /// `every` ago (or never).
    pub fn ready(&self, every: std::time::Duration) -> bool {
        let mut last = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_some_and(|at| at.elapsed() < every) {
            return false;
        }
        *last = Some(std::time::Instant::now());
        true
    }
}

/// The text of a string reply (INFO's), in either protocol's form.
fn text_of(reply: Value) -> Option<String> {
    match reply {
        Value::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Value::VerbatimString { text, .. } => Some(text),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// The `redis_version` of an `INFO server` text when it is below 7.0
/// (Valkey, a fork of 7.2, gives 7.2.4 there).
fn too_old(info: &str) -> Option<&str> {
    let version = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("redis_version:"))?;
    let major: u32 = version.split('.').next()?.parse().ok()?;
    (major < 7).then_some(version)
}

/// Wall-clock time in milliseconds since the Unix epoch (0 if the clock is
/// before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn servers_before_7_0_are_too_old() {
        let info =
            |version: &str| format!("# Server\r\nredis_version:{version}\r\nredis_mode:standalone\r\n");
        assert_eq!(super::too_old(&info("6.2.14")), Some("6.2.14"));
        assert_eq!(super::too_old(&info("7.0.15")), None);
        assert_eq!(super::too_old(&info("7.2.4")), None, "Valkey 8 says 7.2.4");
        assert_eq!(
            super::too_old("# Memory\r\nused_memory:1\r\n"),
            None,
            "no version: not refused"
        );
    }
}
