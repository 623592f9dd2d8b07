//! The gateway's metrics, recorded with the `metrics` crate and exported in
//! the Prometheus text format at `/metrics` (docs/observability.md lists
//! every one).
//!
//! The libraries record (ketch-storage: Redis commands; ketch-tiering: the
//! storage worker and remote reads; this crate: requests, records, groups),
//! the binary installs the recorder ([`install`]) before anything records:
//! a handle taken before that stays a no-op. A process without a recorder
//! (tests running a gateway in-process) records nothing and `/metrics`
//! says so.
//!
//! Hot-path metrics hold their handles ([`Requests`], [`TopicCounters`]):
//! recording is an atomic add, with no registry lookup. Gauges whose value
//! lives elsewhere (connections, in-flight requests, Redis memory) are set
//! by [`upkeep`] every few seconds and before each scrape; gauges no longer
//! set (a Redis server gone) are dropped after [`GAUGE_IDLE`]. Series that
//! must go as soon as what they describe goes (a deleted topic's counters,
//! the lag of a group this gateway stopped coordinating) are kept and
//! rendered here ([`TopicCounters`], [`GroupLags`]): the registry cannot
//! drop a series.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{ApiKey, ResponseKind};
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

use crate::Context;

/// Histogram buckets of every `_seconds` histogram: 50 µs to 30 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0,
];

/// A gauge not set for this long leaves the exposition.
const GAUGE_IDLE: Duration = Duration::from_secs(90);

/// How often [`upkeep`] runs; Redis health and group lag are refreshed on
/// every other run.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Redis memory use, as a share of `maxmemory`, from which the gateway
/// warns (log, `/ready`'s text, the admin API).
pub const MEMORY_WARN_RATIO: f64 = 0.9;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder for this process. Call it once, before
/// the gateway starts (handles taken before it record nothing).
pub fn install() -> anyhow::Result<()> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS_BUCKETS)?
        .idle_timeout(MetricKindMask::GAUGE, Some(GAUGE_IDLE))
        .install_recorder()?;
    let _ = HANDLE.set(handle);
    describe();
    ketch_storage::describe_metrics();
    ketch_tiering::describe_metrics();
    Ok(())
}

/// The Prometheus text exposition, or `None` without a recorder.
pub fn render(ctx: &Context) -> Option<String> {
    let mut text = HANDLE.get()?.render();
    ctx.topic_counters.render(&mut text);
    ctx.group_lags.render(&mut text);
    Some(text)
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!("ketch_requests_total", "Kafka requests answered, by API.");
    describe_histogram!(
        "ketch_request_duration_seconds",
        Unit::Seconds,
        "Time from a request's decoding to its response being ready, by API (a fetch's wait included)."
    );
    describe_counter!(
        "ketch_request_errors_total",
        "Error codes in responses, by API and Kafka error name (one per partition, group or resource that failed)."
    );
    describe_gauge!("ketch_connections", "Open Kafka client connections.");
    describe_gauge!("ketch_inflight_requests", "Requests read and not yet answered.");
    describe_histogram!(
        "ketch_fetch_wait_seconds",
        Unit::Seconds,
        "Time fetches waited for data (min_bytes, max_wait_ms); only fetches that waited."
    );
    describe_counter!(
        "ketch_fetch_partition_reads_total",
        "Partitions fetches read, by source: tail (the batches this gateway appended last, kept for the \
         fetches tailing them) and redis. A partition known to hold nothing new is not read."
    );
    describe_counter!(
        "ketch_group_rebalances_total",
        "Rebalances started in the groups this gateway coordinates."
    );
    describe_counter!(
        "ketch_transactions_total",
        "Transactions finished by this gateway, by outcome: commit and abort (EndTxn), fenced (aborted \
         by a new producer with the same transactional id), coordinator_abort (past its timeout, or an abort \
         left unfinished), coordinator_commit (a commit another gateway left unfinished)."
    );
    describe_gauge!(
        "ketch_group_members",
        "Members of the groups this gateway coordinates."
    );
    describe_gauge!("ketch_groups", "Groups in this gateway's memory, by state.");
    describe_gauge!(
        "ketch_shared_state_age_seconds",
        "Seconds since this gateway last confirmed it holds the current version of a set kept in Redis \
         (ACLs, client quotas, cluster-wide topic defaults), by set."
    );
    describe_counter!(
        "ketch_authentications_total",
        "Successful SASL and HTTP authentications."
    );
    describe_counter!(
        "ketch_authentication_failures_total",
        "Failed SASL and HTTP authentications."
    );
    describe_counter!(
        "ketch_quota_throttled_requests_total",
        "Requests over a client quota (produce or fetch byte rate) and connections over their address's \
         connection_creation_rate, by quota."
    );
    describe_counter!(
        "ketch_quota_throttle_milliseconds_total",
        "Throttle time given to clients over a quota, in milliseconds, by quota."
    );
    describe_gauge!("ketch_redis_used_memory_bytes", "Redis used_memory, by server.");
    describe_gauge!(
        "ketch_redis_maxmemory_bytes",
        "Redis maxmemory (0: no limit), by server."
    );
    describe_counter!(
        "ketch_redis_evicted_keys_total",
        "Keys Redis evicted (its evicted_keys), by server."
    );
    describe_counter!(
        "ketch_redis_rejected_writes_total",
        "Commands Redis refused for lack of memory (its errorstat_OOM), by server."
    );
}

/// Counts a request (or a new connection) a client quota throttled, and
/// its throttle time.
pub fn quota_throttled(kind: crate::quotas::Kind, throttle: Duration) {
    metrics::counter!("ketch_quota_throttled_requests_total", "quota" => kind.name()).increment(1);
    metrics::counter!("ketch_quota_throttle_milliseconds_total", "quota" => kind.name())
        .increment(throttle.as_millis() as u64);
}

/// Kafka's name of an error code (`NOT_LEADER_OR_FOLLOWER`).
pub fn error_name(code: i16) -> String {
    let camel = match ResponseError::try_from_code(code) {
        Some(error) => format!("{error:?}"),
        None => String::new(),
    };
    // Codes kafka-protocol does not know (its `Unknown(n)`).
    if camel.is_empty() || camel.contains('(') {
        return format!("UNKNOWN_CODE_{code}");
    }
    let mut name = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// One API's handles.
struct Api {
    name: String,
    requests: Counter,
    duration: Histogram,
}

/// The request metrics, with a handle per API served.
pub struct Requests {
    apis: Vec<Option<Api>>,
    errors: Mutex<HashMap<(i16, i16), Counter>>,
    connections: AtomicI64,
    inflight: AtomicI64,
    fetch_wait: Histogram,
    /// Partition reads of fetches: from the tail, from Redis.
    fetch_reads: [Counter; 2],
}

impl Default for Requests {
    fn default() -> Self {
        let top = crate::api::SUPPORTED_APIS
            .iter()
            .map(|(key, ..)| *key as usize)
            .max()
            .unwrap_or(0);
        let mut apis: Vec<Option<Api>> = (0..=top).map(|_| None).collect();
        for (key, ..) in crate::api::SUPPORTED_APIS {
            let name = format!("{key:?}");
            apis[*key as usize] = Some(Api {
                requests: metrics::counter!("ketch_requests_total", "api" => name.clone()),
                duration: metrics::histogram!("ketch_request_duration_seconds", "api" => name.clone()),
                name,
            });
        }
        Self {
            apis,
            errors: Mutex::default(),
            connections: AtomicI64::new(0),
            inflight: AtomicI64::new(0),
            fetch_wait: metrics::histogram!("ketch_fetch_wait_seconds"),
            fetch_reads: ["tail", "redis"]
                .map(|source| metrics::counter!("ketch_fetch_partition_reads_total", "source" => source)),
        }
    }
}

impl Requests {
    /// A request of `api` answered after `elapsed`.
    pub fn answered(&self, api: ApiKey, elapsed: Duration) {
        if let Some(Some(handles)) = self.apis.get(api as usize) {
            handles.requests.increment(1);
            handles.duration.record(elapsed.as_secs_f64());
        }
    }

    /// Counts the error codes of a response.
    pub fn errors(&self, api: ApiKey, response: &ResponseKind) {
        error_codes(response, &mut |code| self.error(api, code));
    }

    /// Counts one error code (`NONE` is not an error).
    pub fn error(&self, api: ApiKey, code: i16) {
        if code == 0 {
            return;
        }
        let key = (api as i16, code);
        let mut errors = self.errors.lock().expect("error counters");
        let counter = errors.entry(key).or_insert_with(|| {
            let api = self
                .apis
                .get(api as usize)
                .and_then(Option::as_ref)
                .map_or_else(|| format!("{api:?}"), |a| a.name.clone());
            metrics::counter!("ketch_request_errors_total", "api" => api, "error" => error_name(code))
        });
        counter.increment(1);
    }

    /// A fetch waited `waited` for data.
    pub fn fetch_waited(&self, waited: Duration) {
        self.fetch_wait.record(waited.as_secs_f64());
    }

    /// A fetch read a partition: from the tail this gateway keeps of it, or
    /// from Redis.
    pub fn fetch_read(&self, from_tail: bool) {
        self.fetch_reads[usize::from(!from_tail)].increment(1);
    }

    /// A connection opened; closed when the guard drops.
    pub fn connection(self: &Arc<Self>) -> Open {
        self.connections.fetch_add(1, Ordering::Relaxed);
        Open {
            requests: self.clone(),
            inflight: false,
        }
    }

    /// A request read; answered when the guard drops.
    pub fn request(self: &Arc<Self>) -> Open {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        Open {
            requests: self.clone(),
            inflight: true,
        }
    }

    pub fn open_connections(&self) -> i64 {
        self.connections.load(Ordering::Relaxed)
    }

    fn set_gauges(&self) {
        metrics::gauge!("ketch_connections").set(self.connections.load(Ordering::Relaxed) as f64);
        metrics::gauge!("ketch_inflight_requests").set(self.inflight.load(Ordering::Relaxed) as f64);
    }
}

/// An open connection or request, counted until dropped.
pub struct Open {
    requests: Arc<Requests>,
    inflight: bool,
}

impl Drop for Open {
    fn drop(&mut self) {
        let gauge = if self.inflight {
            &self.requests.inflight
        } else {
            &self.requests.connections
        };
        gauge.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One topic's record and byte counters of one direction: an atomic add
/// each, as a `metrics` counter handle is.
#[derive(Clone, Default)]
pub struct Flow(Arc<FlowCells>);

#[derive(Default)]
struct FlowCells {
    records: AtomicU64,
    bytes: AtomicU64,
}

impl Flow {
    pub fn add(&self, records: u64, bytes: u64) {
        self.0.records.fetch_add(records, Ordering::Relaxed);
        self.0.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// A topic's counters and when they were made.
struct Counted {
    flow: Flow,
    since: Instant,
}

/// Per-topic produced and fetched counters, made once per topic name and
/// rendered by this module (not the `metrics` registry, which cannot drop a
/// series): a deleted topic's series leave the exposition, as Kafka drops a
/// deleted topic's metrics, at once on the gateway that deleted it (bar
/// requests under way then, whose counts make the series again) and within
/// about [`UPKEEP_EVERY`] × 2 plus a storage worker tick on every gateway
/// ([`upkeep`]).
#[derive(Default)]
pub struct TopicCounters {
    produced: RwLock<HashMap<String, Counted>>,
    fetched: RwLock<HashMap<String, Counted>>,
}

/// The names, help texts of the per-topic counters: records then bytes,
/// produced then fetched.
const TOPIC_SERIES: [(&str, &str); 4] = [
    ("ketch_produced_records_total", "Records appended, by topic."),
    (
        "ketch_produced_bytes_total",
        "Record batch bytes appended, by topic.",
    ),
    (
        "ketch_fetched_records_total",
        "Records sent to fetching clients, by topic.",
    ),
    (
        "ketch_fetched_bytes_total",
        "Record batch bytes sent to fetching clients, by topic.",
    ),
];

impl TopicCounters {
    pub fn produced(&self, topic: &str) -> Flow {
        flow(&self.produced, topic)
    }

    pub fn fetched(&self, topic: &str) -> Flow {
        flow(&self.fetched, topic)
    }

    /// Drops the series of `topic` (this gateway deleted it).
    pub fn forget(&self, topic: &str) {
        for map in [&self.produced, &self.fetched] {
            map.write().expect("topic counters").remove(topic);
        }
    }

    /// Drops the series of every topic `exists` denies, of a complete
    /// listing of the topics begun at `listed_at`; series made since stay
    /// (their topic may have been created after the listing).
    pub fn retain_listed(&self, listed_at: Instant, exists: impl Fn(&str) -> bool) {
        for map in [&self.produced, &self.fetched] {
            map.write()
                .expect("topic counters")
                .retain(|topic, counted| counted.since > listed_at || exists(topic));
        }
    }

    pub fn is_empty(&self) -> bool {
        [&self.produced, &self.fetched]
            .iter()
            .all(|map| map.read().expect("topic counters").is_empty())
    }

    /// Appends the four families in the Prometheus text format.
    fn render(&self, out: &mut String) {
        for (map, series) in [
            (&self.produced, &TOPIC_SERIES[..2]),
            (&self.fetched, &TOPIC_SERIES[2..]),
        ] {
            let map = map.read().expect("topic counters");
            if map.is_empty() {
                continue;
            }
            let mut topics: Vec<(&String, &Counted)> = map.iter().collect();
            topics.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (i, (name, help)) in series.iter().enumerate() {
                family(out, name, help, "counter");
                for (topic, counted) in &topics {
                    let cell = if i == 0 {
                        &counted.flow.0.records
                    } else {
                        &counted.flow.0.bytes
                    };
                    sample(
                        out,
                        name,
                        &[("topic", topic)],
                        cell.load(Ordering::Relaxed) as f64,
                    );
                }
                out.push('\n');
            }
        }
    }
}

fn flow(map: &RwLock<HashMap<String, Counted>>, topic: &str) -> Flow {
    if let Some(counted) = map.read().expect("topic counters").get(topic) {
        return counted.flow.clone();
    }
    map.write()
        .expect("topic counters")
        .entry(topic.to_owned())
        .or_insert_with(|| Counted {
            flow: Flow::default(),
            since: Instant::now(),
        })
        .flow
        .clone()
}

/// Writes a family's HELP and TYPE lines.
fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    use std::fmt::Write;
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Writes one sample, its label values escaped as the text format wants
/// (a group id may hold any character).
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    use std::fmt::Write;
    out.push_str(name);
    out.push('{');
    for (i, (label, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(label);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    let _ = writeln!(out, "}} {value}");
}

/// The lag of the groups this gateway coordinates, per topic, as the last
/// [`upkeep`] computed it; rendered by this module so that a group this
/// gateway stops coordinating, and a topic a group no longer has offsets
/// of, leave the exposition at the next computation.
#[derive(Default)]
pub struct GroupLags(Mutex<HashMap<String, (Instant, TopicLags)>>);

/// One group's lag per topic.
type TopicLags = BTreeMap<String, i64>;

impl GroupLags {
    fn render(&self, out: &mut String) {
        let lags = self.0.lock().expect("group lags");
        if lags.values().all(|(_, topics)| topics.is_empty()) {
            return;
        }
        let name = "ketch_group_lag";
        family(
            out,
            name,
            "Records between the high watermark and the committed offset, summed over a topic's partitions, \
             by group and topic (groups this gateway coordinates).",
            "gauge",
        );
        let mut groups: Vec<_> = lags.iter().collect();
        groups.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (group, (_, topics)) in groups {
            for (topic, lag) in topics {
                sample(out, name, &[("group", group), ("topic", topic)], *lag as f64);
            }
        }
        out.push('\n');
    }
}

/// Record count and bytes of the record batches in `data` (batches laid
/// end to end, as stored and as sent).
pub fn batch_totals(data: &[u8]) -> (u64, u64) {
    let mut records = 0u64;
    let mut at = 0usize;
    // base offset (8), batch length (4) … record count at byte 57 (v2).
    while let Some(header) = data.get(at..at + 61) {
        let length = i32::from_be_bytes(header[8..12].try_into().expect("4 bytes"));
        let Ok(length) = usize::try_from(length) else {
            break;
        };
        records += u64::from(u32::from_be_bytes(header[57..61].try_into().expect("4 bytes")));
        at += 12 + length;
    }
    (records, data.len() as u64)
}

/// One Redis server's memory, from INFO.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RedisMemory {
    pub server: String,
    pub used_memory: u64,
    /// 0: no limit.
    pub maxmemory: u64,
    pub maxmemory_policy: String,
    /// `mem_not_counted_for_evict`: replication and AOF buffers, which
    /// Redis leaves out when it compares its memory with `maxmemory`.
    pub mem_not_counted_for_evict: u64,
    pub evicted_keys: u64,
    /// `errorstat_OOM`: commands refused for lack of memory.
    pub rejected_writes: u64,
    /// `run_id`: changes when the server restarts.
    #[serde(skip)]
    pub run_id: String,
    /// Why the server could not be read now: the figures above are those
    /// last read (0 when it never was).
    pub error: Option<String>,
}

impl RedisMemory {
    /// The memory Redis holds against `maxmemory`: `used_memory` less
    /// what it does not count (as its `getMaxmemoryState` does, so a
    /// replica's or AOF's buffers do not make it look full).
    pub fn counted(&self) -> u64 {
        self.used_memory.saturating_sub(self.mem_not_counted_for_evict)
    }

    /// counted / maxmemory, when there is a limit.
    pub fn ratio(&self) -> Option<f64> {
        (self.maxmemory > 0).then(|| self.counted() as f64 / self.maxmemory as f64)
    }

    /// What an operator should know, if anything.
    pub fn warning(&self) -> Option<String> {
        let ratio = self.ratio()?;
        let what = if self.full() {
            if self.maxmemory_policy == "noeviction" {
                "is full and refuses writes (maxmemory-policy noeviction): appends, offset commits and heartbeats fail"
            } else {
                "is full and evicts keys: partitions lose data"
            }
        } else if ratio >= MEMORY_WARN_RATIO {
            "is nearly full"
        } else if !self.maxmemory_policy.is_empty() && self.maxmemory_policy != "noeviction" {
            // Said before it is full: by then keys are going. Those with a
            // TTL go first under volatile-* (an empty group's offsets,
            // transaction state, leases), any under allkeys-*.
            return Some(format!(
                "Redis {} evicts keys when full (maxmemory-policy {}): ketch's data is lost then; \
                 set maxmemory-policy noeviction",
                self.server, self.maxmemory_policy
            ));
        } else {
            return None;
        };
        Some(format!(
            "Redis {} {what} (memory counted {} of maxmemory {}, {:.0}%)",
            self.server,
            self.counted(),
            self.maxmemory,
            ratio * 100.0
        ))
    }

    /// Past `maxmemory`, where Redis refuses writes (or evicts): above it,
    /// not at it (`getMaxmemoryState`).
    fn full(&self) -> bool {
        self.maxmemory > 0 && self.counted() > self.maxmemory
    }

    /// 0: room, 1: nearly full, 2: full.
    fn level(&self) -> u8 {
        match self.ratio() {
            _ if self.full() => 2,
            Some(r) if r >= MEMORY_WARN_RATIO => 1,
            _ => 0,
        }
    }

    /// Whether this server refuses writes now.
    pub fn refuses_writes(&self) -> bool {
        self.full() && self.maxmemory_policy == "noeviction"
    }
}

/// Parses one server's `INFO memory stats errorstats` text.
pub fn parse_info(server: &str, info: &str) -> RedisMemory {
    let mut memory = RedisMemory {
        server: server.to_owned(),
        ..RedisMemory::default()
    };
    for line in info.lines() {
        let Some((key, value)) = line.trim().split_once(':') else {
            continue;
        };
        let number = || value.parse::<u64>().unwrap_or(0);
        match key {
            "used_memory" => memory.used_memory = number(),
            "maxmemory" => memory.maxmemory = number(),
            "maxmemory_policy" => memory.maxmemory_policy = value.to_owned(),
            "mem_not_counted_for_evict" => memory.mem_not_counted_for_evict = number(),
            "evicted_keys" => memory.evicted_keys = number(),
            "run_id" => memory.run_id = value.to_owned(),
            "errorstat_OOM" => {
                memory.rejected_writes = value
                    .split(',')
                    .find_map(|field| field.strip_prefix("count="))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
            _ => {}
        }
    }
    memory
}

/// The last Redis health check.
#[derive(Debug, Clone, Default)]
pub struct RedisHealth {
    pub servers: Vec<RedisMemory>,
    pub checked: Option<Instant>,
    pub error: Option<String>,
}

impl RedisHealth {
    pub fn warnings(&self) -> Vec<String> {
        self.servers.iter().filter_map(RedisMemory::warning).collect()
    }

    pub fn refuses_writes(&self) -> bool {
        self.servers.iter().any(RedisMemory::refuses_writes)
    }

    /// Whether no server could be read now.
    pub fn unread(&self) -> bool {
        self.error.is_some() && self.servers.iter().all(|s| s.error.is_some())
    }
}

/// Reads every Redis server's memory now and records it.
pub async fn check_redis(ctx: &Context) -> RedisHealth {
    // When the readings were asked for: checks run at once (the readiness
    // probe, the upkeep, the admin API) and may end in any order.
    let asked = Instant::now();
    let health = match ctx.storage.server_info().await {
        Ok(servers) => {
            let before = ctx.redis_health.read().expect("redis health").servers.clone();
            let mut errors = Vec::new();
            let servers: Vec<RedisMemory> = servers
                .into_iter()
                .map(|(server, info)| match info {
                    Ok(info) => parse_info(&server, &info),
                    Err(e) => {
                        errors.push(format!("{server}: {e}"));
                        let mut last = before
                            .iter()
                            .find(|s| s.server == server)
                            .cloned()
                            .unwrap_or_else(|| RedisMemory {
                                server,
                                ..RedisMemory::default()
                            });
                        last.error = Some(e.to_string());
                        last
                    }
                })
                .collect();
            let read: Vec<RedisMemory> = servers.iter().filter(|s| s.error.is_none()).cloned().collect();
            for s in &read {
                let label = || s.server.clone();
                metrics::gauge!("ketch_redis_used_memory_bytes", "server" => label())
                    .set(s.used_memory as f64);
                metrics::gauge!("ketch_redis_maxmemory_bytes", "server" => label()).set(s.maxmemory as f64);
            }
            count_redis_totals(&read, asked);
            RedisHealth {
                servers,
                checked: Some(Instant::now()),
                error: (!errors.is_empty()).then(|| errors.join("; ")),
            }
        }
        Err(e) => last_read(ctx, e.to_string()),
    };
    // Warn when a server becomes nearly full or full, not on every check.
    let before: Vec<(String, u8)> = (ctx.redis_health.read().expect("redis health").servers.iter())
        .map(|s| (s.server.clone(), s.level()))
        .collect();
    for server in &health.servers {
        let was = before
            .iter()
            .find(|(s, _)| *s == server.server)
            .map_or(0, |(_, l)| *l);
        let first_seen = !before.iter().any(|(s, _)| *s == server.server);
        if server.level() > was
            && let Some(warning) = server.warning()
        {
            tracing::warn!("{warning}; size maxmemory against local.retention.* (docs/observability.md)");
        } else if first_seen
            && server.level() == 0
            && let Some(warning) = server.warning()
        {
            // An evicting maxmemory-policy, said once per server.
            tracing::warn!("{warning}");
        }
    }
    *ctx.redis_health.write().expect("redis health") = health.clone();
    health
}

/// What was last read of each server, with the `error` that kept them
/// from being read now (the slot map unreadable, or the check timed out):
/// their warnings must not vanish with it.
pub fn last_read(ctx: &Context, error: String) -> RedisHealth {
    let mut servers = ctx.redis_health.read().expect("redis health").servers.clone();
    for s in &mut servers {
        s.error = Some(error.clone());
    }
    RedisHealth {
        servers,
        checked: Some(Instant::now()),
        error: Some(error),
    }
}

/// Each server's `evicted_keys` and `errorstat_OOM` when last read.
static REDIS_TOTALS: std::sync::LazyLock<Mutex<RedisTotals>> = std::sync::LazyLock::new(Mutex::default);

/// Adds what each server's totals grew by since they were last read to
/// the `_total` counters. Redis's own go back to 0 when it restarts (or at
/// `CONFIG RESETSTAT`): then all of the new value is new. (Setting the
/// counters to Redis's values, as before, kept them at their old peak
/// until Redis passed it, and the rate showed nothing meanwhile.)
fn count_redis_totals(servers: &[RedisMemory], asked: Instant) {
    let mut totals = REDIS_TOTALS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    totals.forget_unseen(Instant::now());
    for s in servers {
        let (evicted, rejected) = totals.grown(s, asked);
        let label = || s.server.clone();
        metrics::counter!("ketch_redis_evicted_keys_total", "server" => label()).increment(evicted);
        metrics::counter!("ketch_redis_rejected_writes_total", "server" => label()).increment(rejected);
    }
}

/// What was last read of each server's totals, by address.
#[derive(Debug, Default)]
struct RedisTotals(HashMap<String, TotalsRead>);

#[derive(Debug)]
struct TotalsRead {
    /// The server's `run_id`: another one is a restarted server, whose
    /// totals started again from 0.
    run_id: String,
    evicted: u64,
    rejected: u64,
    at: Instant,
}

/// How long the totals of a server no longer read are kept: a master that
/// a failover demoted and a failback promotes again keeps its totals (its
/// counts are not taken for new), and addresses gone for good are
/// forgotten.
const TOTALS_KEPT: Duration = Duration::from_secs(24 * 3600);

impl RedisTotals {
    /// What `server`'s totals, asked for at `asked`, grew by since last
    /// read (all of them when it was never read, restarted, or reset its
    /// statistics; nothing when a reading asked for later was counted
    /// already: it is older than what is known).
    fn grown(&mut self, server: &RedisMemory, asked: Instant) -> (u64, u64) {
        if self.0.get(&server.server).is_some_and(|known| known.at > asked) {
            return (0, 0);
        }
        let read = TotalsRead {
            run_id: server.run_id.clone(),
            evicted: server.evicted_keys,
            rejected: server.rejected_writes,
            at: asked,
        };
        let before = self
            .0
            .insert(server.server.clone(), read)
            .filter(|before| before.run_id == server.run_id);
        let grown = |now: u64, before: Option<u64>| match before {
            Some(before) if now >= before => now - before,
            _ => now,
        };
        (
            grown(server.evicted_keys, before.as_ref().map(|b| b.evicted)),
            grown(server.rejected_writes, before.as_ref().map(|b| b.rejected)),
        )
    }

    fn forget_unseen(&mut self, now: Instant) {
        self.0.retain(|_, read| now.duration_since(read.at) < TOTALS_KEPT);
    }
}

/// A group's committed offsets and their lag, per partition.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PartitionLag {
    pub topic: String,
    pub partition: i32,
    pub committed_offset: i64,
    pub high_watermark: Option<i64>,
    pub lag: Option<i64>,
}

/// The committed offsets of `group` with the high watermark and lag of
/// each partition (lag: high watermark minus committed offset, at least 0;
/// `None` where the topic or partition is gone).
pub async fn group_lag(ctx: &Context, group: &str) -> ketch_storage::Result<Vec<PartitionLag>> {
    use futures::StreamExt;
    let committed = ctx.storage.all_committed_offsets(group).await?;
    // Its topics, LAG_READS at a time (a topic the gateway has not cached
    // is a round trip).
    let names: std::collections::BTreeSet<String> =
        committed.iter().map(|((name, _), _)| name.clone()).collect();
    let topics: HashMap<String, Option<Arc<ketch_storage::Topic>>> = futures::stream::iter(names)
        .map(|name: String| {
            let storage = ctx.storage.clone();
            async move {
                let topic = storage.topic(&name).await?;
                Ok::<_, ketch_storage::StorageError>((name, topic))
            }
        })
        .buffer_unordered(LAG_READS)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<ketch_storage::Result<_>>()?;
    // The partitions' high watermarks, LAG_READS at a time (one round trip
    // each: one after another, a pass over thousands of groups outlasted
    // the gauges' idle time).
    let asks: Vec<(Option<Arc<ketch_storage::Topic>>, i32)> = committed
        .iter()
        .map(|((name, partition), _)| {
            (
                topics[name].clone().filter(|t| t.has_partition(*partition)),
                *partition,
            )
        })
        .collect();
    let high_watermarks: Vec<ketch_storage::Result<Option<i64>>> = futures::stream::iter(asks)
        .map(|(topic, partition)| {
            let storage = ctx.storage.clone();
            async move {
                match topic {
                    Some(topic) => Ok(Some(storage.offsets(&topic, partition).await?.high_watermark)),
                    None => Ok(None),
                }
            }
        })
        .buffered(LAG_READS)
        .collect()
        .await;
    let mut out = Vec::with_capacity(committed.len());
    for (((name, partition), offset), high_watermark) in committed.into_iter().zip(high_watermarks) {
        let high_watermark = high_watermark?;
        out.push(PartitionLag {
            // Any i64 may be committed (as in Kafka): a negative one says
            // nothing of the lag.
            lag: high_watermark
                .filter(|_| offset.offset >= 0)
                .map(|hw| hw.saturating_sub(offset.offset).max(0)),
            topic: name,
            partition,
            committed_offset: offset.offset,
            high_watermark,
        });
    }
    out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(out)
}

/// Sets `ketch_group_lag` for every group with committed offsets that this
/// gateway coordinates (each group is reported by one gateway, so sums over
/// gateways count it once).
async fn record_group_lag(ctx: &Context) -> ketch_storage::Result<()> {
    use futures::StreamExt;
    // A group whose lag could not be computed for this long goes.
    ctx.group_lags
        .0
        .lock()
        .expect("group lags")
        .retain(|_, (at, _)| at.elapsed() < GAUGE_IDLE);
    let groups: HashSet<String> = (ctx.storage.groups_with_offsets().await?)
        .into_iter()
        .filter(|group| ctx.membership.coordinates(group))
        .collect();
    // A few groups at a time; one that cannot be read now keeps its last
    // lags and holds up no other.
    let computed: Vec<(String, TopicLags)> = futures::stream::iter(groups.iter().cloned())
        .map(|group| async move {
            let lags = match group_lag(ctx, &group).await {
                Ok(lags) => lags,
                Err(e) => {
                    tracing::debug!(%group, error = %e, "group lag not computed");
                    return None;
                }
            };
            let mut per_topic = TopicLags::new();
            for p in lags {
                if let Some(lag) = p.lag {
                    let sum = per_topic.entry(p.topic).or_default();
                    *sum = sum.saturating_add(lag);
                }
            }
            Some((group, per_topic))
        })
        .buffer_unordered(LAG_GROUPS)
        .filter_map(std::future::ready)
        .collect()
        .await;
    let now = Instant::now();
    let mut lags = ctx.group_lags.0.lock().expect("group lags");
    // Groups this gateway no longer coordinates, or that have no offsets.
    lags.retain(|group, _| groups.contains(group));
    for (group, per_topic) in computed {
        lags.insert(group, (now, per_topic));
    }
    Ok(())
}

/// Partitions' high watermarks one group's lag reads at once.
const LAG_READS: usize = 16;
/// Groups whose lag is computed at once.
pub(crate) const LAG_GROUPS: usize = 8;

fn record_groups(ctx: &Context) {
    let mut states: HashMap<&'static str, usize> = HashMap::new();
    let mut members = 0;
    for (state, count) in ctx.groups.census() {
        *states.entry(state.name()).or_default() += 1;
        members += count;
    }
    metrics::gauge!("ketch_group_members").set(members as f64);
    for state in crate::group::State::ALL {
        let groups = states.get(state.name()).copied().unwrap_or(0);
        metrics::gauge!("ketch_groups", "state" => state.name()).set(groups as f64);
    }
}

/// Sets the gauges whose values live elsewhere (before a scrape).
pub fn refresh(ctx: &Context) {
    ctx.requests.set_gauges();
    ctx.tiering_metrics.refresh_gauges();
    record_groups(ctx);
}

/// Keeps the exposition current until shutdown: the recorder's upkeep,
/// the gauges, Redis memory (with a warning when it nears maxmemory) and
/// group lag.
pub async fn upkeep(ctx: Arc<Context>) {
    let mut shutdown = ctx.shutdown.clone();
    let mut tick = tokio::time::interval(UPKEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        if let Some(handle) = HANDLE.get() {
            handle.run_upkeep();
        }
        refresh(&ctx);
        if n.is_multiple_of(2) {
            forget_deleted_topics(&ctx).await;
            check_redis(&ctx).await;
            if let Err(e) = record_group_lag(&ctx).await {
                tracing::debug!(error = %e, "group lag not computed");
            }
        }
        n += 1;
    }
}

/// Drops the per-topic series of topics deleted (by any gateway), as the
/// storage worker's last listing of the topics (every tick) found them, or
/// a listing of its own when that one is older than [`LISTING_REUSE`].
async fn forget_deleted_topics(ctx: &Context) {
    if ctx.topic_counters.is_empty() {
        return;
    }
    let (listed_at, names) = match ctx
        .storage
        .listed_topic_names()
        .filter(|(at, _)| at.elapsed() < LISTING_REUSE)
    {
        Some(listing) => listing,
        None => {
            let listed_at = Instant::now();
            match ctx.storage.all_topics().await {
                Ok(topics) => (listed_at, topics.iter().map(|t| t.name.clone()).collect()),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot list the topics; deleted topics' metrics stay for now");
                    return;
                }
            }
        }
    };
    ctx.topic_counters
        .retain_listed(listed_at, |topic| names.contains(topic));
}

/// How old a listing of the topics [`forget_deleted_topics`] takes.
const LISTING_REUSE: Duration = Duration::from_secs(30);

/// Calls `f` with a Fetch response's error codes (the connection counts
/// them before the response is encoded as chunks).
pub fn fetch_error_codes(r: &kafka_protocol::messages::FetchResponse, f: &mut dyn FnMut(i16)) {
    f(r.error_code);
    for t in &r.responses {
        t.partitions.iter().for_each(|p| f(p.error_code));
    }
}

/// Calls `f` with every error code in a response: the top-level one and
/// those of each topic, partition, group or resource.
pub fn error_codes(response: &ResponseKind, f: &mut dyn FnMut(i16)) {
    match response {
        ResponseKind::Produce(r) => {
            for t in &r.responses {
                t.partition_responses.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::Fetch(r) => fetch_error_codes(r, f),
        ResponseKind::ListOffsets(r) => {
            for t in &r.topics {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::Metadata(r) => {
            for t in &r.topics {
                f(t.error_code);
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::ApiVersions(r) => f(r.error_code),
        ResponseKind::CreateTopics(r) => r.topics.iter().for_each(|t| f(t.error_code)),
        ResponseKind::DeleteTopics(r) => r.responses.iter().for_each(|t| f(t.error_code)),
        ResponseKind::DeleteRecords(r) => {
            for t in &r.topics {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::DescribeConfigs(r) => r.results.iter().for_each(|x| f(x.error_code)),
        ResponseKind::AlterConfigs(r) => r.responses.iter().for_each(|x| f(x.error_code)),
        ResponseKind::IncrementalAlterConfigs(r) => r.responses.iter().for_each(|x| f(x.error_code)),
        ResponseKind::ListConfigResources(r) => f(r.error_code),
        ResponseKind::DescribeClientQuotas(r) => f(r.error_code),
        ResponseKind::AlterClientQuotas(r) => r.entries.iter().for_each(|x| f(x.error_code)),
        ResponseKind::CreatePartitions(r) => r.results.iter().for_each(|x| f(x.error_code)),
        ResponseKind::DescribeCluster(r) => f(r.error_code),
        ResponseKind::DescribeTopicPartitions(r) => {
            for t in &r.topics {
                f(t.error_code);
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::DescribeLogDirs(r) => {
            f(r.error_code);
            r.results.iter().for_each(|d| f(d.error_code));
        }
        ResponseKind::AlterReplicaLogDirs(r) => {
            for t in &r.results {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::ElectLeaders(r) => {
            f(r.error_code);
            for t in &r.replica_election_results {
                t.partition_result.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::ListPartitionReassignments(r) => f(r.error_code),
        ResponseKind::AlterPartitionReassignments(r) => {
            f(r.error_code);
            for t in &r.responses {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::FindCoordinator(r) => {
            f(r.error_code);
            r.coordinators.iter().for_each(|c| f(c.error_code));
        }
        ResponseKind::OffsetFetch(r) => {
            f(r.error_code);
            for t in &r.topics {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
            for g in &r.groups {
                f(g.error_code);
                for t in &g.topics {
                    t.partitions.iter().for_each(|p| f(p.error_code));
                }
            }
        }
        ResponseKind::OffsetCommit(r) => {
            for t in &r.topics {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::OffsetDelete(r) => {
            f(r.error_code);
            for t in &r.topics {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::InitProducerId(r) => f(r.error_code),
        ResponseKind::JoinGroup(r) => f(r.error_code),
        ResponseKind::SyncGroup(r) => f(r.error_code),
        ResponseKind::Heartbeat(r) => f(r.error_code),
        ResponseKind::LeaveGroup(r) => {
            f(r.error_code);
            r.members.iter().for_each(|m| f(m.error_code));
        }
        ResponseKind::ListGroups(r) => f(r.error_code),
        ResponseKind::DescribeGroups(r) => r.groups.iter().for_each(|g| f(g.error_code)),
        ResponseKind::DeleteGroups(r) => r.results.iter().for_each(|g| f(g.error_code)),
        ResponseKind::SaslHandshake(r) => f(r.error_code),
        ResponseKind::SaslAuthenticate(r) => f(r.error_code),
        ResponseKind::DescribeAcls(r) => f(r.error_code),
        ResponseKind::CreateAcls(r) => r.results.iter().for_each(|x| f(x.error_code)),
        ResponseKind::DeleteAcls(r) => r.filter_results.iter().for_each(|x| f(x.error_code)),
        ResponseKind::DescribeUserScramCredentials(r) => {
            f(r.error_code);
            r.results.iter().for_each(|x| f(x.error_code));
        }
        ResponseKind::AlterUserScramCredentials(r) => r.results.iter().for_each(|x| f(x.error_code)),
        ResponseKind::EndTxn(r) => f(r.error_code),
        ResponseKind::AddOffsetsToTxn(r) => f(r.error_code),
        ResponseKind::AddPartitionsToTxn(r) => {
            f(r.error_code);
            let topics = (r.results_by_transaction.iter())
                .flat_map(|x| x.topic_results.iter())
                .chain(&r.results_by_topic_v3_and_below);
            for t in topics {
                t.results_by_partition
                    .iter()
                    .for_each(|p| f(p.partition_error_code));
            }
        }
        ResponseKind::TxnOffsetCommit(r) => {
            for t in &r.topics {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::DescribeProducers(r) => {
            for t in &r.topics {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::DescribeTransactions(r) => r.transaction_states.iter().for_each(|x| f(x.error_code)),
        ResponseKind::ListTransactions(r) => f(r.error_code),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleted_topics_and_moved_groups_leave_the_exposition() {
        let counters = TopicCounters::default();
        counters.produced("kept").add(3, 300);
        counters.fetched("kept").add(2, 200);
        counters.produced("deleted").add(1, 10);
        counters.produced("gone-here").add(1, 10);
        let listed_at = Instant::now();
        counters.produced("made-after-the-listing").add(1, 10);
        counters.forget("gone-here");
        counters.retain_listed(listed_at, |topic| topic == "kept");
        let mut text = String::new();
        counters.render(&mut text);
        assert!(
            text.contains("ketch_produced_records_total{topic=\"kept\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("ketch_produced_bytes_total{topic=\"kept\"} 300\n"),
            "{text}"
        );
        assert!(
            text.contains("ketch_fetched_bytes_total{topic=\"kept\"} 200\n"),
            "{text}"
        );
        assert!(text.contains("{topic=\"made-after-the-listing\"} 1\n"), "{text}");
        assert!(!text.contains("deleted") && !text.contains("gone-here"), "{text}");
        assert_eq!(
            text.matches("# TYPE ketch_produced_records_total counter")
                .count(),
            1
        );

        let lags = GroupLags::default();
        let topics = BTreeMap::from([("t".to_owned(), 7)]);
        lags.0
            .lock()
            .unwrap()
            .insert("a \"quoted\\ group\n".to_owned(), (Instant::now(), topics));
        let mut text = String::new();
        lags.render(&mut text);
        assert!(
            text.contains("ketch_group_lag{group=\"a \\\"quoted\\\\ group\\n\",topic=\"t\"} 7\n"),
            "{text}"
        );
        lags.0.lock().unwrap().clear();
        let mut text = String::new();
        lags.render(&mut text);
        assert!(text.is_empty(), "no family without a series");
    }

    #[test]
    fn redis_totals_count_what_grew_across_restarts_and_failbacks() {
        let read = |server: &str, run_id: &str, evicted: u64, rejected: u64| RedisMemory {
            server: server.to_owned(),
            run_id: run_id.to_owned(),
            evicted_keys: evicted,
            rejected_writes: rejected,
            ..RedisMemory::default()
        };
        let mut totals = RedisTotals::default();
        let start = Instant::now();
        assert_eq!(
            totals.grown(&read("a", "1", 5, 2), start),
            (5, 2),
            "first read: all new"
        );
        assert_eq!(totals.grown(&read("a", "1", 8, 2), start), (3, 0));
        // Not read for a while (demoted by a failover), then again with the
        // same run: nothing counted twice.
        totals.forget_unseen(start + Duration::from_secs(3600));
        assert_eq!(totals.grown(&read("a", "1", 8, 3), start), (0, 1));
        // Restarted: its totals started from 0.
        assert_eq!(totals.grown(&read("a", "2", 4, 0), start), (4, 0));
        // CONFIG RESETSTAT: below the last reading.
        assert_eq!(totals.grown(&read("a", "2", 1, 0), start), (1, 0));
        // A reading asked for before the one counted last (two checks at
        // once, ending out of order): older, nothing counted, nothing kept.
        let later = start + Duration::from_secs(10);
        assert_eq!(totals.grown(&read("a", "2", 3, 0), later), (2, 0));
        assert_eq!(
            totals.grown(&read("a", "2", 2, 0), later - Duration::from_secs(1)),
            (0, 0)
        );
        assert_eq!(
            totals.grown(&read("a", "2", 3, 0), later + Duration::from_secs(1)),
            (0, 0)
        );
        // Gone for longer than a day: forgotten.
        totals.forget_unseen(later + TOTALS_KEPT + Duration::from_secs(1));
        assert!(totals.0.is_empty());
    }

    /// The transaction APIs' errors are counted too (they were left out:
    /// no PRODUCER_FENCED or INVALID_TXN_STATE ever showed).
    #[test]
    fn the_transaction_apis_error_codes_are_found() {
        use kafka_protocol::messages::add_partitions_to_txn_response::{
            AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
        };
        use kafka_protocol::messages::describe_transactions_response::TransactionState;
        use kafka_protocol::messages::{
            AddPartitionsToTxnResponse, DescribeTransactionsResponse, EndTxnResponse,
        };
        let codes = |response: ResponseKind| {
            let mut codes = Vec::new();
            error_codes(&response, &mut |c| codes.push(c));
            codes.retain(|c| *c != 0);
            codes
        };
        assert_eq!(
            codes(ResponseKind::EndTxn(
                EndTxnResponse::default().with_error_code(90)
            )),
            [90]
        );
        let partition = |code| AddPartitionsToTxnPartitionResult::default().with_partition_error_code(code);
        let topic =
            |code| AddPartitionsToTxnTopicResult::default().with_results_by_partition(vec![partition(code)]);
        let added = AddPartitionsToTxnResponse::default()
            .with_results_by_topic_v3_and_below(vec![topic(48)])
            .with_results_by_transaction(vec![
                AddPartitionsToTxnResult::default().with_topic_results(vec![topic(51)]),
            ]);
        assert_eq!(codes(ResponseKind::AddPartitionsToTxn(added)), [51, 48]);
        let described = DescribeTransactionsResponse::default()
            .with_transaction_states(vec![TransactionState::default().with_error_code(15)]);
        assert_eq!(codes(ResponseKind::DescribeTransactions(described)), [15]);
    }

    #[test]
    fn error_names_are_kafkas() {
        assert_eq!(error_name(6), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(error_name(3), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(12345), "UNKNOWN_CODE_12345");
    }

    #[test]
    fn batch_totals_count_the_records_of_each_batch_and_stop_at_a_partial_one() {
        let batch = |records: u32, len: usize| {
            let mut b = vec![0u8; 61 + len];
            b[8..12].copy_from_slice(&((49 + len) as i32).to_be_bytes());
            b[57..61].copy_from_slice(&records.to_be_bytes());
            b
        };
        let mut data = batch(3, 10);
        data.extend(batch(5, 0));
        assert_eq!(batch_totals(&data), (8, data.len() as u64));
        data.extend_from_slice(&[0u8; 30]);
        assert_eq!(batch_totals(&data).0, 8, "a partial batch adds nothing");
        assert_eq!(batch_totals(&[]), (0, 0));
    }

    #[test]
    fn info_gives_memory_evictions_and_refused_writes() {
        let info = "# Memory\r\nused_memory:1048576\r\nmaxmemory:2097152\r\nmaxmemory_policy:noeviction\r\n\
                    # Stats\r\nevicted_keys:7\r\n# Errorstats\r\nerrorstat_OOM:count=42\r\nerrorstat_ERR:count=1\r\n";
        let m = parse_info("127.0.0.1:6379", info);
        assert_eq!(
            (m.used_memory, m.maxmemory, m.evicted_keys, m.rejected_writes),
            (1048576, 2097152, 7, 42)
        );
        assert_eq!(m.maxmemory_policy, "noeviction");
        assert!(m.warning().is_none(), "50% warns of nothing");
        let at_the_limit = RedisMemory {
            used_memory: 2097152,
            ..m.clone()
        };
        assert!(
            !at_the_limit.refuses_writes(),
            "Redis refuses above the limit only"
        );
        let full = RedisMemory {
            used_memory: 2097153,
            ..m.clone()
        };
        assert!(full.refuses_writes());
        assert!(full.warning().unwrap().contains("refuses writes"));
        let near = RedisMemory {
            used_memory: 1_950_000,
            ..m.clone()
        };
        assert!(near.warning().unwrap().contains("nearly full"));
        assert!(!near.refuses_writes());
        let unlimited = RedisMemory {
            maxmemory: 0,
            ..m.clone()
        };
        assert!(unlimited.warning().is_none() && !unlimited.refuses_writes());
        // An evicting policy is said before Redis is full (by then keys go),
        // and not without a limit (nothing is ever evicted).
        let evicting = RedisMemory {
            maxmemory_policy: "volatile-lru".to_owned(),
            ..m.clone()
        };
        assert!(evicting.warning().unwrap().contains("evicts keys when full"));
        assert!(
            RedisMemory {
                maxmemory: 0,
                ..evicting
            }
            .warning()
            .is_none()
        );
    }

    /// Redis leaves its replication and AOF buffers out of what it holds
    /// against `maxmemory`: a primary whose replica's output buffer takes
    /// it past the limit still takes writes, and is not reported full.
    #[test]
    fn buffers_redis_does_not_count_do_not_make_it_full() {
        let info = "# Memory\r\nused_memory:2200000\r\nmaxmemory:2097152\r\n\
                    maxmemory_policy:noeviction\r\nmem_not_counted_for_evict:300000\r\n";
        let m = parse_info("127.0.0.1:6379", info);
        assert_eq!((m.mem_not_counted_for_evict, m.counted()), (300000, 1900000));
        assert!(!m.refuses_writes());
        assert!(
            m.warning()
                .unwrap()
                .contains("nearly full (memory counted 1900000 of")
        );
        let full = RedisMemory {
            mem_not_counted_for_evict: 100000,
            ..m
        };
        assert!(full.refuses_writes());
    }
}
