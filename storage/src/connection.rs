//! The connection layer: one Redis server, or a Redis Cluster, behind one
//! type ([`Conn`]), so the log, topic, group and tiering code never asks
//! which mode it runs in.
//!
//! - Single mode: a [`ConnectionManager`] (one multiplexed connection,
//!   re-made after a failure).
//! - Cluster mode: redis-rs's cluster connection (one multiplexed
//!   connection per node; it follows MOVED and ASK and refreshes its slot
//!   map). A pipeline whose commands name keys of several slots (a topic's
//!   partitions, or the group registry beside a group's offsets) is split
//!   into one command per key, run concurrently: Redis Cluster refuses a
//!   multi-slot pipeline on one node. Atomic pipelines (MULTI/EXEC) and
//!   scripts only ever touch one partition's keys, one hash tag, one slot.
//!
//! acks=all appends need more than routing: `WAIT` counts the writes of its
//! own connection, so they run on connections of their own, one pool per
//! master (`durable.rs`), found with [`Conn::master_of`].

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::{Result, StorageError, metrics};

/// Commands of a split pipeline in flight at once.
const SPLIT_CONCURRENCY: usize = 64;

/// How ketch reaches Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Single,
    Cluster,
}

/// A connection to Redis in either mode; cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(SingleConn),
    Cluster(std::sync::Arc<SlotMapWatch>),
}

/// A connection to one server (redis-rs's manager, which dials again after
/// an I/O error), and when it was last made to dial again after a READONLY.
#[derive(Clone)]
pub(crate) struct SingleConn {
    manager: ConnectionManager,
    redialled: std::sync::Arc<crate::AtMostEvery>,
}

impl SingleConn {
    pub(crate) fn new(manager: ConnectionManager) -> Self {
        Self {
            manager,
            redialled: Default::default(),
        }
    }

    /// Has the connection dial again (at most once every few seconds): a
    /// master demoted to replica keeps its clients' connections open, and
    /// redis-rs dials again only after an I/O error, so behind one address
    /// (a DNS name, a virtual IP) that now reaches the new master every
    /// write would be refused as READONLY until the gateway restarted. A
    /// QUIT has Redis close the connection; the manager then dials again.
    fn redial(&self) {
        if !self.redialled.ready(crate::wire::REDIAL_AFTER_READONLY) {
            return;
        }
        tracing::warn!("redis answered READONLY (a replica now); connecting again");
        let mut manager = self.manager.clone();
        tokio::spawn(async move {
            let _ = redis::cmd("QUIT").query_async::<()>(&mut manager).await;
        });
    }
}

/// Makes a cluster connection, starting from the seeds and the nodes given
/// (`host:port`).
type MakeCluster = Box<dyn Fn(&[String]) -> Result<ClusterConnection> + Send + Sync>;

/// What a cluster connection's clones share to notice a stale slot map.
///
/// redis-rs reads its slot map again only after a redirection. A master
/// that stops answering without closing its connections (frozen, or cut
/// off) gives none: once its replica has taken its slots, the connection
/// would keep sending their commands to it, each timing out, until it
/// answers again. So a command that times out makes the connection check
/// the map (at most once per second, in the background): it reads
/// `CLUSTER SLOTS` ([`Conn::slot_ranges_from`]) and, when the map differs
/// from the one the connection was made from and the masters that took
/// slots answer ([`SlotMapWatch::stale_map`]), replaces the cluster
/// connection with a new one, which reads the map afresh (at most once per
/// [`REPLACE_EVERY`]). Only then: a new connection is no help while such a
/// master still serves its slots (before its failover).
pub(crate) struct SlotMapWatch {
    /// The connection every clone of the [`Conn`] uses.
    conn: std::sync::Mutex<ClusterConnection>,
    /// Makes a new one, starting from the seeds and these nodes.
    make: MakeCluster,
    response_timeout: Duration,
    /// The seed nodes (`host:port`), asked for the slot map besides the
    /// masters a caller knows.
    seeds: Vec<String>,
    /// A seed node's URL: credentials and options for dialling nodes.
    template: Option<redis::ConnectionInfo>,
    tls: Tls,
    state: std::sync::Mutex<WatchState>,
}

#[derive(Default)]
struct WatchState {
    /// The map the connection was made from: read just after it was
    /// made, or the one a replacement started from.
    ranges: Vec<(u16, u16, String)>,
    /// When a check last began.
    checked: Option<std::time::Instant>,
    /// When a check last replaced the connection.
    replaced: Option<std::time::Instant>,
}

/// The least time between two replacements of a cluster connection.
const REPLACE_EVERY: Duration = Duration::from_secs(10);

/// TLS settings for `rediss://` URLs: the PEM certificate authorities to
/// trust, or the system's roots when `None`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tls {
    pub(crate) ca_pem: Option<Vec<u8>>,
}

impl Tls {
    fn certificates(&self) -> Option<redis::TlsCertificates> {
        self.ca_pem.as_ref().map(|ca| redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.clone()),
        })
    }

    /// The TLS client settings for `rediss://` on ketch's own connections
    /// (wake-ups, the data path): the configured certificate authorities,
    /// or the system's.
    pub(crate) fn client_config(&self) -> std::io::Result<std::sync::Arc<rustls::ClientConfig>> {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca_pem {
            Some(pem) => {
                for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| std::io::Error::other(format!("redis.tls_ca_file: {e}")))?;
                    roots
                        .add(cert)
                        .map_err(|e| std::io::Error::other(format!("redis.tls_ca_file: {e}")))?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
            }
        }
        Ok(std::sync::Arc::new(
            rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        ))
    }

    /// A client for one server, trusting the configured authorities when
    /// its address is TLS.
    pub(crate) fn client(&self, info: redis::ConnectionInfo) -> Result<redis::Client> {
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        let client = match self.certificates() {
            Some(certificates) if tls => redis::Client::build_with_tls(info, certificates),
            _ => redis::Client::open(info),
        };
        client.map_err(|e| StorageError::Unavailable(format!("invalid redis url: {e}")))
    }
}

/// The nodes named by `redis.url`: one URL, or in cluster mode a
/// comma-separated list of seed nodes.
pub(crate) fn seed_urls(url: &str) -> Vec<&str> {
    url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect()
}

impl Conn {
    /// A lazily connected cluster connection to the cluster `seeds` belong
    /// to (starting from them and the nodes `also`, `host:port`); `push`
    /// receives its pub/sub messages (RESP3).
    pub(crate) fn cluster(
        seeds: &[&str],
        tls: &Tls,
        connect_timeout: Duration,
        response_timeout: Duration,
        push: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>,
        also: &[String],
    ) -> Result<Conn> {
        let infos: Vec<redis::ConnectionInfo> = seeds
            .iter()
            .map(|seed| redis::IntoConnectionInfo::into_connection_info(*seed))
            .collect::<redis::RedisResult<_>>()
            .map_err(|e| StorageError::Unavailable(format!("invalid redis cluster url: {e}")))?;
        let template = infos.first().cloned();
        let seed_addresses = infos
            .iter()
            .filter_map(|info| match info.addr() {
                redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => {
                    Some(format!("{host}:{port}"))
                }
                _ => None,
            })
            .collect();
        let tls_for_make = tls.clone();
        let make = move |extra: &[String]| -> Result<ClusterConnection> {
            // The nodes a connection starts from: the seeds, and the
            // masters a check just read (a seed may be the node that
            // stopped answering).
            let mut nodes = infos.clone();
            if let Some(template) = &infos.first() {
                nodes.extend(extra.iter().filter_map(|a| node_info(template, a).ok()));
            }
            // Four retries of a command redirected or refused for now
            // (TRYAGAIN, CLUSTERDOWN, LOADING). redis-rs's minimum wait
            // (1280 ms) is above this maximum and wins: each wait is 1.28 s,
            // about 5 s in all, which rides out the CLUSTERDOWN of a
            // failover; the data path retries on its own (log.rs).
            let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
                .connection_timeout(connect_timeout)
                .response_timeout(response_timeout)
                .retries(4)
                .max_retry_wait(500);
            if let Some(certificates) = tls_for_make.certificates() {
                builder = builder.certs(certificates);
            }
            if let Some(push) = &push {
                builder = builder
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(push.clone());
            }
            let client = builder
                .build()
                .map_err(|e| StorageError::Unavailable(format!("invalid redis cluster url: {e}")))?;
            let config = redis::cluster::ClusterConfig::new()
                .set_connection_timeout(connect_timeout)
                .set_response_timeout(response_timeout);
            Ok(client.get_pending_async_connection_with_config(config))
        };
        let watch = std::sync::Arc::new(SlotMapWatch {
            conn: std::sync::Mutex::new(make(also)?),
            make: Box::new(make),
            response_timeout,
            seeds: seed_addresses,
            template,
            tls: tls.clone(),
            state: Default::default(),
        });
        // The map redis-rs starts from, for the checks to compare with.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(watch.clone().first_read());
        }
        Ok(Conn::Cluster(watch))
    }

    pub(crate) fn mode(&self) -> Mode {
        match self {
            Conn::Single(_) => Mode::Single,
            Conn::Cluster(..) => Mode::Cluster,
        }
    }

    /// The slot map as `CLUSTER SLOTS` reports it: each range's first and
    /// last slot and its master's address (`host:port`).
    pub(crate) async fn slot_ranges(&self) -> Result<Vec<(u16, u16, String)>> {
        let reply: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.clone())
            .await?;
        parse_cluster_slots(reply)
    }
}

impl Conn {
    /// The slot map: through the cluster connection's routing (a node it
    /// picks), and when that gives no answer within `limit`, asked of the
    /// nodes `known` (`host:port`) and the seed nodes at once, each on a
    /// connection of its own, the first answer taken. A master that stops
    /// answering without closing its connections leaves redis-rs's map
    /// stale (it reads it again only after a redirection), so its routing
    /// may pick that one. (Not redis-rs's routing by address: it answers a
    /// node it has no connection to with a reconnection to the seed nodes,
    /// which holds up every command.)
    pub(crate) async fn slot_ranges_from(
        &self,
        known: &[String],
        limit: Duration,
    ) -> Result<Vec<(u16, u16, String)>> {
        let routed = tokio::time::timeout(limit, self.slot_ranges()).await;
        let Conn::Cluster(watch) = self else {
            return routed.map_err(|_| StorageError::Unavailable("CLUSTER SLOTS timed out".to_owned()))?;
        };
        let routed_error = match routed {
            Ok(Ok(ranges)) => return Ok(ranges),
            Ok(Err(e)) => e,
            Err(_) => StorageError::Unavailable("CLUSTER SLOTS timed out".to_owned()),
        };
        let mut nodes: Vec<&String> = known.iter().chain(&watch.seeds).collect();
        nodes.sort();
        nodes.dedup();
        let asks: Vec<_> = nodes
            .into_iter()
            .filter_map(|address| node_client(watch.template.as_ref()?, &watch.tls, address).ok())
            .map(|client| {
                Box::pin(async move {
                    let reply: Value = tokio::time::timeout(limit, async {
                        let mut conn = client.get_multiplexed_async_connection().await?;
                        redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn).await
                    })
                    .await
                    .map_err(|_| StorageError::Unavailable("CLUSTER SLOTS timed out".to_owned()))??;
                    parse_cluster_slots(reply)
                })
            })
            .collect();
        if asks.is_empty() {
            return Err(routed_error);
        }
        futures::future::select_ok(asks).await.map(|(ranges, _)| ranges)
    }
}

/// The masters of a slot map, each once.
pub(crate) fn masters_of(ranges: &[(u16, u16, String)]) -> Vec<String> {
    let mut masters: Vec<String> = ranges.iter().map(|r| r.2.clone()).collect();
    masters.sort();
    masters.dedup();
    masters
}

/// A client of the cluster node at `address` (`host:port`), with the
/// credentials and TLS settings of `template` (a seed node's).
pub(crate) fn node_client(
    template: &redis::ConnectionInfo,
    tls: &Tls,
    address: &str,
) -> Result<redis::Client> {
    tls.client(node_info(template, address)?)
}

/// The connection settings of the cluster node at `address` (`host:port`):
/// those of `template` (a seed node's) with its address.
fn node_info(template: &redis::ConnectionInfo, address: &str) -> Result<redis::ConnectionInfo> {
    let (host, port) = address
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host.to_owned(), port.parse::<u16>().ok()?)))
        .ok_or_else(|| StorageError::Data(format!("cluster node address {address:?}")))?;
    let addr = match template.addr() {
        redis::ConnectionAddr::TcpTls { insecure, .. } => redis::ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: None,
        },
        _ => redis::ConnectionAddr::Tcp(host, port),
    };
    Ok(template.clone().set_addr(addr))
}

impl Conn {
    fn watch(&self) -> Option<std::sync::Arc<SlotMapWatch>> {
        match self {
            Conn::Cluster(watch) => Some(watch.clone()),
            Conn::Single(_) => None,
        }
    }
}

/// `reply`, a timeout in it making the cluster connection check its slot
/// map ([`SlotMapWatch`]).
fn watched<'a, T: Send + 'a>(
    watch: Option<std::sync::Arc<SlotMapWatch>>,
    command: &'static str,
    reply: RedisFuture<'a, T>,
) -> RedisFuture<'a, T> {
    let Some(watch) = watch else {
        return reply;
    };
    Box::pin(async move {
        let reply = reply.await;
        if let Err(e) = &reply
            && e.is_timeout()
        {
            tracing::debug!(command, error = %e, "a redis cluster command timed out; checking the slot map");
            watch.check();
        }
        reply
    })
}

impl SlotMapWatch {
    /// The cluster connection to use now.
    pub(crate) fn current(&self) -> ClusterConnection {
        self.conn.lock().expect("cluster connection").clone()
    }

    /// Whether every node of `nodes` (`host:port`) answers a PING within
    /// the response timeout, each on a connection of its own.
    pub(crate) async fn all_answer(&self, nodes: &[String]) -> bool {
        let Some(template) = &self.template else {
            return false;
        };
        let limit = self.response_timeout;
        let pings = nodes.iter().map(|address| async move {
            let Ok(client) = node_client(template, &self.tls, address) else {
                return false;
            };
            let ping = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("PING").query_async::<String>(&mut conn).await
            };
            matches!(tokio::time::timeout(limit, ping).await, Ok(Ok(_)))
        });
        futures::future::join_all(pings).await.into_iter().all(|ok| ok)
    }

    /// The slot map, when it shows this connection's map stale: it differs
    /// from the one the connection started from (or the last check read;
    /// any map when none was read) and the masters of the ranges that
    /// changed all answer (see [`SlotMapWatch::all_answer`]). Then a
    /// connection whose commands time out follows a stale map, and a new one
    /// starting from these masters would not. Not while a master that
    /// stopped answering still serves slots (before its failover), when a
    /// new connection would not help.
    pub(crate) async fn stale_map(self: &std::sync::Arc<Self>) -> Option<Vec<(u16, u16, String)>> {
        let last = self.state.lock().expect("slot map watch").ranges.clone();
        let conn = Conn::Cluster(self.clone());
        let ranges = match conn
            .slot_ranges_from(&masters_of(&last), self.response_timeout)
            .await
        {
            Ok(ranges) => ranges,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the slot map");
                return None;
            }
        };
        if ranges.is_empty() || ranges == last {
            return None;
        }
        let changed: Vec<(u16, u16, String)> = ranges.iter().filter(|r| !last.contains(r)).cloned().collect();
        self.all_answer(&masters_of(&changed)).await.then_some(ranges)
    }

    /// Reads the map when the connection is made.
    async fn first_read(self: std::sync::Arc<Self>) {
        let conn = Conn::Cluster(self.clone());
        if let Ok(ranges) = conn.slot_ranges_from(&[], self.response_timeout).await {
            let mut state = self.state.lock().expect("slot map watch");
            if state.ranges.is_empty() {
                state.ranges = ranges;
            }
        }
    }

    /// Checks the slot map in the background, unless a check began less
    /// than a second ago.
    fn check(self: std::sync::Arc<Self>) {
        {
            let mut state = self.state.lock().expect("slot map watch");
            let recent = |t: Option<std::time::Instant>, within| t.is_some_and(|t| t.elapsed() < within);
            if recent(state.checked, Duration::from_secs(1)) || recent(state.replaced, REPLACE_EVERY) {
                return;
            }
            state.checked = Some(std::time::Instant::now());
        }
        tokio::spawn(async move {
            let Some(ranges) = self.stale_map().await else {
                return;
            };
            let masters = masters_of(&ranges);
            let conn = {
                let mut state = self.state.lock().expect("slot map watch");
                // Another check replaced it meanwhile, or did lately.
                if state.replaced.is_some_and(|t| t.elapsed() < REPLACE_EVERY) {
                    return;
                }
                let conn = match (self.make)(&masters) {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot make a new redis cluster connection");
                        return;
                    }
                };
                state.replaced = Some(std::time::Instant::now());
                // What the new connection starts from.
                state.ranges = ranges;
                conn
            };
            tracing::warn!(
                "a redis cluster master changed while commands timed out; reconnecting to the cluster"
            );
            metrics::replaced_connection();
            *self.conn.lock().expect("cluster connection") = conn;
        });
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let command = first_command(cmd);
        let watch = self.watch();
        let reply: RedisFuture<'a, Value> = match self {
            Conn::Single(c) => Box::pin(async move {
                let reply = c.manager.req_packed_command(cmd).await;
                if reply.as_ref().is_err_and(is_read_only) {
                    c.redial();
                }
                reply
            }),
            Conn::Cluster(watch) => {
                let mut c = watch.current();
                Box::pin(async move { c.req_packed_command(cmd).await })
            }
        };
        watched(watch, command, timed(command, reply))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let whole = pipeline.is_transaction() || one_slot(pipeline);
        let command = if pipeline.is_transaction() {
            "MULTI"
        } else {
            pipeline.cmd_iter().next().map_or("OTHER", first_command)
        };
        let watch = self.watch();
        let replies: RedisFuture<'a, Vec<Value>> = match self {
            Conn::Single(c) => Box::pin(async move {
                let replies = c.manager.req_packed_commands(pipeline, offset, count).await;
                let read_only = match &replies {
                    Err(e) => is_read_only(e),
                    Ok(values) => values.iter().any(|v| match v {
                        Value::ServerError(e) => is_read_only_message(&e.to_string()),
                        _ => false,
                    }),
                };
                if read_only {
                    c.redial();
                }
                replies
            }),
            Conn::Cluster(watch) => {
                let mut c = watch.current();
                if pipeline.is_transaction() {
                    Box::pin(async move { c.req_packed_commands(pipeline, offset, count).await })
                } else if whole {
                    // A slot being migrated answers ASK for the keys moved
                    // already, and redis-rs follows an ASK only for a
                    // pipeline's first command: then each command goes on
                    // its own, in order, to wherever its key is now (a
                    // pipeline is not atomic anyway; redis-rs resends the
                    // whole pipeline on a redirection itself).
                    Box::pin(async move {
                        match c.req_packed_commands(pipeline, offset, count).await {
                            Err(e) if redirected(&e) => one_by_one(c, pipeline, offset, count).await,
                            other => other,
                        }
                    })
                } else {
                    split(c, pipeline, offset, count)
                }
            }
        };
        watched(watch, command, timed(command, replies))
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Whether Redis refused a write as a replica (`READONLY`, for a command or
/// a script with the write flag).
pub(crate) fn is_read_only_message(message: &str) -> bool {
    message.to_ascii_uppercase().contains("READONLY")
}

fn is_read_only(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || is_read_only_message(&e.to_string())
}

/// The metrics label of a command.
fn first_command(cmd: &Cmd) -> &'static str {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(name)) => metrics::command_label(name),
        _ => "OTHER",
    }
}

/// `reply`, timed and its failure counted (`ketch_redis_*` metrics).
fn timed<'a, T: Send + 'a>(command: &'static str, reply: RedisFuture<'a, T>) -> RedisFuture<'a, T> {
    Box::pin(async move {
        let started = std::time::Instant::now();
        let reply = reply.await;
        metrics::observe(command, started, reply.as_ref().err().map(metrics::error_kind));
        reply
    })
}

/// Whether Redis redirected the command (`MOVED`, `ASK`).
fn redirected(e: &redis::RedisError) -> bool {
    e.redirect_node().is_some()
}

/// Runs a pipeline one command at a time, in order, each followed to its
/// key's node.
async fn one_by_one(
    mut c: ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> redis::RedisResult<Vec<Value>> {
    let mut values = Vec::with_capacity(pipeline.len());
    for cmd in pipeline.cmd_iter() {
        values.push(c.req_packed_command(cmd).await?);
    }
    Ok(values.into_iter().skip(offset).take(count).collect())
}

/// Runs a pipeline over several slots as one command per key, concurrently,
/// the replies in the pipeline's order.
fn split<'a>(
    c: ClusterConnection,
    pipeline: &Pipeline,
    offset: usize,
    count: usize,
) -> RedisFuture<'a, Vec<Value>> {
    let commands: Vec<Cmd> = pipeline.cmd_iter().cloned().collect();
    Box::pin(async move {
        let values: Vec<Value> = futures::stream::iter(commands)
            .map(move |cmd| {
                let mut c = c.clone();
                async move { c.req_packed_command(&cmd).await }
            })
            .buffered(SPLIT_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(values.into_iter().skip(offset).take(count).collect())
    })
}

/// The slot of the key a command names, if it names one.
fn key_slot(cmd: &Cmd) -> Option<Slot> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => bytes,
        _ => &b""[..],
    });
    let name = args.next()?.to_ascii_uppercase();
    let key = match &name[..] {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            let _script = args.next()?;
            let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
            if keys == 0 {
                return None;
            }
            args.next()?
        }
        b"MULTI" | b"EXEC" | b"DISCARD" | b"TIME" | b"PING" | b"INFO" | b"SCRIPT" | b"CLUSTER" | b"WAIT"
        | b"WAITAOF" | b"CONFIG" | b"CLIENT" | b"DBSIZE" => return None,
        _ => args.next()?,
    };
    Some(Slot::for_key(key))
}

/// Whether every key the pipeline names is in one slot.
fn one_slot(pipeline: &Pipeline) -> bool {
    let mut slots = pipeline.cmd_iter().filter_map(key_slot);
    match slots.next() {
        Some(first) => slots.all(|slot| slot == first),
        None => true,
    }
}

pub(crate) fn parse_cluster_slots(reply: Value) -> Result<Vec<(u16, u16, String)>> {
    let bad = || StorageError::Data("unexpected CLUSTER SLOTS reply".to_owned());
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(range) = range else {
            return Err(bad());
        };
        let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
            (range.first(), range.get(1), range.get(2))
        else {
            return Err(bad());
        };
        let host = match master.first() {
            Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
            Some(Value::SimpleString(host)) => host.clone(),
            _ => return Err(bad()),
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return Err(bad());
        };
        out.push((*first as u16, *last as u16, format!("{host}:{port}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipelines_over_one_hash_tag_stay_whole_and_others_split() {
        let mut one = redis::pipe();
        one.cmd("XRANGE").arg("ketch:{a:0}:log").arg(0).arg("+");
        one.cmd("HMGET").arg("ketch:{a:0}:meta").arg("next_offset");
        one.cmd("EVALSHA").arg("sha").arg(1).arg("ketch:{a:0}:meta");
        one.cmd("TIME");
        assert!(one_slot(&one));
        let mut many = redis::pipe();
        many.cmd("HSET").arg("ketch:{a:0}:meta").arg("x").arg(1);
        many.cmd("HSET").arg("ketch:{a:1}:meta").arg("x").arg(1);
        assert!(!one_slot(&many));
        let mut globals = redis::pipe();
        globals.cmd("EXISTS").arg("ketch:topics");
        globals.cmd("EXISTS").arg("ketch:brokers");
        assert!(!one_slot(&globals));
    }

    #[test]
    fn seeds_are_a_comma_separated_list() {
        assert_eq!(
            seed_urls("redis://a:1, redis://b:2,"),
            vec!["redis://a:1", "redis://b:2"]
        );
        assert_eq!(seed_urls("redis://a:1"), vec!["redis://a:1"]);
    }
}
