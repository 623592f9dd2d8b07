//! Client quotas (docs/quotas.md): what AlterClientQuotas stores, how each
//! gateway finds the quota that applies to a client, and how it measures
//! the client's rate against it, as Kafka's brokers do (`ClientQuotaManager`).
//!
//! Quotas live in Redis (ketch_storage's quotas module), shared by every
//! gateway; each gateway keeps them in memory ([`ClientQuotas::replace`],
//! kept current by [`keep_current`]) and enforces them on its own traffic,
//! as each Kafka broker enforces them on its own: a client whose requests
//! go to two gateways may use the quota on each.
//!
//! Rates are measured over `quotas.window_num` samples of
//! `quotas.window_size` (Kafka's `quota.window.num`, 11, and
//! `quota.window.size.seconds`, 1): a rate is the bytes of the samples
//! divided by their span, at least `window_num - 1` windows, so a client
//! may burst up to that many seconds' worth before it is throttled. A
//! client over its quota is told how long to wait (`throttle_time_ms`,
//! Kafka's formula: the time at which the rate falls back to the quota)
//! and its connection is not read meanwhile (KIP-219).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ketch_storage::{QuotaChange, StoredQuota};

use crate::Context;
use crate::storage::Storage;

/// Entity types.
pub const USER: &str = "user";
pub const CLIENT_ID: &str = "client-id";
pub const IP: &str = "ip";

/// Quota keys.
pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
pub const CONTROLLER_MUTATION_RATE: &str = "controller_mutation_rate";
pub const CONNECTION_CREATION_RATE: &str = "connection_creation_rate";

/// How a quota key's value is checked (Kafka's `QuotaConfig` types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ValueType {
    Long,
    Int,
    Double,
}

/// The keys a user and/or client-id entity takes.
const CLIENT_KEYS: &[(&str, ValueType)] = &[
    (PRODUCER_BYTE_RATE, ValueType::Long),
    (CONSUMER_BYTE_RATE, ValueType::Long),
    (REQUEST_PERCENTAGE, ValueType::Double),
    (CONTROLLER_MUTATION_RATE, ValueType::Double),
];

/// The keys an ip entity takes.
const IP_KEYS: &[(&str, ValueType)] = &[(CONNECTION_CREATION_RATE, ValueType::Int)];

/// A quota entity: for each entity type it names, the name, `None` for the
/// type's default entity (Kafka's `<default>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Entity {
    pub user: Option<Option<String>>,
    pub client_id: Option<Option<String>>,
    pub ip: Option<Option<String>>,
}

impl Entity {
    /// A user and/or client-id entity.
    pub fn client(user: Option<Option<&str>>, client_id: Option<Option<&str>>) -> Self {
        let own = |part: Option<Option<&str>>| part.map(|name| name.map(str::to_owned));
        Self {
            user: own(user),
            client_id: own(client_id),
            ip: None,
        }
    }

    /// Builds an entity from a request's (type, name) pairs, checked as
    /// Kafka checks them; the message is Kafka's.
    pub fn from_parts<'a>(
        parts: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> Result<Self, String> {
        let mut entity = Self::default();
        let mut any = false;
        for (kind, name) in parts {
            any = true;
            let slot = match kind {
                USER => &mut entity.user,
                CLIENT_ID => &mut entity.client_id,
                IP => &mut entity.ip,
                other => return Err(format!("Unhandled client quota entity type: {other}")),
            };
            if slot.is_some() {
                return Err(format!(
                    "Invalid client quota entity, duplicate entity entry {kind}"
                ));
            }
            if name == Some("") {
                return Err(format!("Empty {kind} not supported"));
            }
            *slot = Some(name.map(str::to_owned));
        }
        if !any {
            return Err("Invalid empty client quota entity".to_owned());
        }
        if let Some(ip) = entity.ip.take() {
            if entity.user.is_some() || entity.client_id.is_some() {
                return Err(
                    "Invalid quota entity combination, IP entity should not be combined with User or ClientId"
                        .to_owned(),
                );
            }
            // Kept in one spelling, so that a connection's address finds it.
            let ip = match ip {
                Some(name) => match name.parse::<IpAddr>() {
                    Ok(address) => Some(address.to_canonical().to_string()),
                    Err(_) => return Err(format!("{name} is not a valid IP or resolvable host.")),
                },
                None => None,
            };
            entity.ip = Some(ip);
        }
        Ok(entity)
    }

    /// (type, name) of each part, in the order Kafka's tools print them.
    pub fn parts(&self) -> Vec<(&'static str, Option<&str>)> {
        [(USER, &self.user), (CLIENT_ID, &self.client_id), (IP, &self.ip)]
            .into_iter()
            .filter_map(|(kind, part)| part.as_ref().map(|name| (kind, name.as_deref())))
            .collect()
    }

    fn keys(&self) -> &'static [(&'static str, ValueType)] {
        if self.ip.is_some() { IP_KEYS } else { CLIENT_KEYS }
    }

    /// Whether a quota of this entity can have the key.
    pub fn holds(&self, key: &str) -> bool {
        self.keys().iter().any(|(name, _)| *name == key)
    }

    /// The entity as stored in Redis: a JSON array of [type, name or null].
    pub fn to_stored(&self) -> String {
        serde_json::to_string(&self.parts()).expect("strings encode")
    }

    /// Parses [`Entity::to_stored`]'s text.
    pub fn from_stored(text: &str) -> Option<Self> {
        let parts: Vec<(String, Option<String>)> = serde_json::from_str(text).ok()?;
        Self::from_parts(parts.iter().map(|(kind, name)| (kind.as_str(), name.as_deref()))).ok()
    }

    /// Kafka's text of the entity (`user=alice, client-id=<default>`), for
    /// messages and the audit log.
    pub fn describe(&self) -> String {
        self.parts()
            .iter()
            .map(|(kind, name)| format!("{kind}={}", name.unwrap_or("<default>")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Checks a value for `key` on `entity` as Kafka's controller does; the
/// message is Kafka's.
pub fn check_value(entity: &Entity, key: &str, value: f64) -> Result<(), String> {
    let Some((_, kind)) = entity.keys().iter().find(|(name, _)| *name == key) else {
        return Err(format!("Invalid configuration key {key}"));
    };
    // NaN is not above 0 either.
    if value.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
        return Err(format!("Quota {key} must be greater than 0"));
    }
    let max = match kind {
        ValueType::Double => return Ok(()),
        ValueType::Int => f64::from(i32::MAX),
        ValueType::Long => i64::MAX as f64,
    };
    if value > max {
        let kind = if *kind == ValueType::Int {
            "an INT"
        } else {
            "a LONG"
        };
        return Err(format!("Proposed value for {key} is too large for {kind}."));
    }
    if (value % 1.0).abs() > 1e-6 {
        return Err(format!("{key} cannot be a fractional value."));
    }
    Ok(())
}

/// The stored change for one quota alteration.
pub fn change(entity: &Entity, key: &str, value: Option<f64>) -> QuotaChange {
    QuotaChange {
        entity: entity.to_stored(),
        key: key.to_owned(),
        // Rust prints the shortest text that parses back to the same f64.
        value: value.map(|v| v.to_string()),
    }
}

/// What a quota limits on this gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Produce request bytes per second (`producer_byte_rate`).
    Produce,
    /// Fetch response bytes per second (`consumer_byte_rate`).
    Fetch,
    /// New connections per second from one address
    /// (`connection_creation_rate`).
    Connection,
    /// Partitions created or deleted per second (`controller_mutation_rate`).
    Mutation,
    /// The share of one thread a client's requests keep busy, in percent
    /// (`request_percentage`).
    Request,
}

impl Kind {
    fn key(self) -> &'static str {
        match self {
            Kind::Produce => PRODUCER_BYTE_RATE,
            Kind::Fetch => CONSUMER_BYTE_RATE,
            Kind::Connection => CONNECTION_CREATION_RATE,
            Kind::Mutation => CONTROLLER_MUTATION_RATE,
            Kind::Request => REQUEST_PERCENTAGE,
        }
    }

    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Produce => "produce",
            Kind::Fetch => "fetch",
            Kind::Connection => "connection",
            Kind::Mutation => "controller_mutation",
            Kind::Request => "request",
        }
    }
}

/// The stored quotas, as a gateway looks them up.
#[derive(Debug, Default)]
pub struct Table {
    pub version: u64,
    pub entities: HashMap<Entity, HashMap<String, f64>>,
}

impl Table {
    /// The table of stored quotas (entries that do not parse are skipped
    /// with a warning: another version of ketch may have written them).
    pub fn from_stored(version: u64, stored: Vec<StoredQuota>) -> Self {
        let mut entities: HashMap<Entity, HashMap<String, f64>> = HashMap::new();
        for quota in stored {
            match (Entity::from_stored(&quota.entity), quota.value.parse::<f64>()) {
                (Some(entity), Ok(value)) => {
                    entities.entry(entity).or_default().insert(quota.key, value);
                }
                _ => tracing::warn!(
                    entity = quota.entity,
                    key = quota.key,
                    "skipping an unreadable stored quota"
                ),
            }
        }
        Self { version, entities }
    }

    fn has(&self, key: &str) -> bool {
        self.entities.values().any(|values| values.contains_key(key))
    }

    /// The quota of `key` that applies to a client and the sensor it is
    /// measured by: the first of Kafka's eight levels that sets it
    /// (user and client-id, user and default client-id, user, default
    /// user and client-id, default user and default client-id, default
    /// user, client-id, default client-id). A quota set for a user alone
    /// is shared by all that user's clients; one set for the default user
    /// applies to each user on its own. An empty client id matches no
    /// client-id entity.
    fn lookup(&self, key: &str, user: &str, client_id: &str) -> Option<(f64, SensorTags)> {
        let with_client = !client_id.is_empty();
        let levels: [(Part<'_>, Part<'_>); 8] = [
            (Some(Some(user)), Some(Some(client_id))),
            (Some(Some(user)), Some(None)),
            (Some(Some(user)), None),
            (Some(None), Some(Some(client_id))),
            (Some(None), Some(None)),
            (Some(None), None),
            (None, Some(Some(client_id))),
            (None, Some(None)),
        ];
        levels
            .into_iter()
            .filter(|(_, client)| with_client || client.is_none())
            .find_map(|(u, c)| {
                let value = self.entities.get(&Entity::client(u, c))?.get(key)?;
                // The sensor tells apart what the entity names.
                let tag = |part: Part<'_>, name: &str| part.map_or_else(String::new, |_| name.to_owned());
                let tags = SensorTags {
                    user: tag(u, user),
                    client_id: tag(c, client_id),
                };
                Some((*value, tags))
            })
    }
}

/// One entity type's part of a lookup: absent, the default entity, or a
/// name.
type Part<'a> = Option<Option<&'a str>>;

/// Whose traffic one sensor measures (Kafka's quota metric tags): a user,
/// a client id, or both; empty where the quota does not tell them apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SensorTags {
    user: String,
    client_id: String,
}

/// One window of a rate (Kafka's `SampledStat.Sample`).
#[derive(Debug, Clone, Copy)]
struct Sample {
    start_ms: u64,
    last_event_ms: u64,
    value: f64,
}

impl Sample {
    fn new(now: u64) -> Self {
        Self {
            start_ms: now,
            last_event_ms: now,
            value: 0.0,
        }
    }
}

/// A rate over `samples` windows of `window_ms` (Kafka's `Rate` over a
/// `SampledStat`, with its extra overlapping sample).
#[derive(Debug)]
struct Rate {
    samples: Vec<Sample>,
    current: usize,
    last_used: Instant,
}

impl Rate {
    fn new(now: u64) -> Self {
        Self {
            samples: vec![Sample::new(now)],
            current: 0,
            last_used: Instant::now(),
        }
    }

    fn record(&mut self, config: WindowConfig, value: f64, now: u64) {
        self.last_used = Instant::now();
        if now.saturating_sub(self.samples[self.current].start_ms) >= config.window_ms {
            let slots = config.samples as usize + 1;
            self.current = (self.current + 1) % slots;
            if self.current >= self.samples.len() {
                self.samples.push(Sample::new(now));
            } else {
                self.samples[self.current] = Sample::new(now);
            }
        }
        let sample = &mut self.samples[self.current];
        sample.value += value;
        sample.last_event_ms = now;
    }

    /// (rate per second, the span it was measured over in ms).
    fn measure(&mut self, config: WindowConfig, now: u64) -> (f64, u64) {
        let expire = u64::from(config.samples) * config.window_ms;
        for sample in &mut self.samples {
            if now.saturating_sub(sample.last_event_ms) >= expire {
                *sample = Sample::new(now);
            }
        }
        let total: f64 = self.samples.iter().map(|s| s.value).sum();
        let oldest = self.samples.iter().map(|s| s.start_ms).min().unwrap_or(now);
        let mut span = now.saturating_sub(oldest);
        let full = span / config.window_ms;
        let min_full = u64::from(config.samples.saturating_sub(1));
        if full < min_full {
            span += (min_full - full) * config.window_ms;
        }
        let span = span.max(1);
        (total / (span as f64 / 1000.0), span)
    }
}

#[derive(Debug, Clone, Copy)]
struct WindowConfig {
    samples: u32,
    window_ms: u64,
}

/// Sensors unused this long are dropped (Kafka: an hour).
const SENSOR_EXPIRY: Duration = Duration::from_secs(3600);

/// This gateway's copy of the quotas and its sensors.
pub struct ClientQuotas {
    table: RwLock<Arc<Table>>,
    /// Whether any quota of each [`Kind`] is set: without one, requests
    /// and connections skip quota work.
    enabled: [AtomicBool; 5],
    sensors: Mutex<HashMap<(Kind, SensorTags), Rate>>,
    /// New connections per address, for `connection_creation_rate`.
    connections: Mutex<HashMap<IpAddr, Rate>>,
    /// Partition mutation tokens, for `controller_mutation_rate`.
    buckets: Mutex<HashMap<SensorTags, TokenBucket>>,
    config: WindowConfig,
    started: Instant,
}

impl ClientQuotas {
    pub fn new(settings: &ketch_config::QuotasSettings) -> Self {
        Self {
            table: RwLock::default(),
            enabled: Default::default(),
            sensors: Mutex::default(),
            connections: Mutex::default(),
            buckets: Mutex::default(),
            config: WindowConfig {
                samples: settings.window_num.max(1),
                window_ms: (settings.window_size.get().as_millis() as u64).max(1),
            },
            started: Instant::now(),
        }
    }

    /// The quotas as last loaded.
    pub fn table(&self) -> Arc<Table> {
        self.table.read().expect("quota table lock").clone()
    }

    /// Replaces the quotas with a newly loaded table.
    pub fn replace(&self, table: Table) {
        let enabled = [
            Kind::Produce,
            Kind::Fetch,
            Kind::Connection,
            Kind::Mutation,
            Kind::Request,
        ]
        .map(|kind| table.has(kind.key()));
        *self.table.write().expect("quota table lock") = Arc::new(table);
        for (flag, on) in self.enabled.iter().zip(enabled) {
            flag.store(on, Ordering::Relaxed);
        }
    }

    /// Whether any quota of `kind` is set.
    pub fn enabled(&self, kind: Kind) -> bool {
        self.enabled[kind as usize].load(Ordering::Relaxed)
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Records `bytes` of a client's `kind` traffic; how long it must wait
    /// for its rate to fall back to its quota (0: within it).
    pub fn record(&self, kind: Kind, principal: &str, client_id: &str, bytes: usize) -> Duration {
        self.record_at(kind, principal, client_id, bytes as f64, self.now_ms())
    }

    fn record_at(&self, kind: Kind, principal: &str, client_id: &str, bytes: f64, now: u64) -> Duration {
        if !self.enabled(kind) {
            return Duration::ZERO;
        }
        let Some((bound, tags)) = self.table().lookup(kind.key(), user_of(principal), client_id) else {
            return Duration::ZERO;
        };
        let mut sensors = self.sensors.lock().expect("quota sensors lock");
        let rate = sensors.entry((kind, tags)).or_insert_with(|| Rate::new(now));
        rate.record(self.config, bytes, now);
        let (observed, span) = rate.measure(self.config, now);
        if observed <= bound {
            return Duration::ZERO;
        }
        // Kafka's QuotaUtils.throttleTime: the delay X that brings the
        // observed rate O over the span W down to the quota T, O·W/(W+X) = T.
        let ms = ((observed - bound) / bound * span as f64).round();
        Duration::from_millis(ms as u64)
    }

    /// Records the time a gateway thread spent handling one of a client's
    /// requests (Kafka's request handler thread time), as a percentage of
    /// one thread per second; how long the client must wait for its
    /// `request_percentage` (0: within it). As Kafka's, the wait is at
    /// most one quota window.
    pub fn record_request_time(&self, principal: &str, client_id: &str, busy: Duration) -> Duration {
        self.record_request_time_at(principal, client_id, busy, self.now_ms())
    }

    fn record_request_time_at(&self, principal: &str, client_id: &str, busy: Duration, now: u64) -> Duration {
        // Kafka's NanosToPercentagePerSecond: 100 % per second of one thread.
        let percent_seconds = busy.as_nanos() as f64 * 1e-7;
        self.record_at(Kind::Request, principal, client_id, percent_seconds, now)
            .min(Duration::from_millis(self.config.window_ms))
    }

    /// Takes back bytes recorded by [`ClientQuotas::record`] (a throttled
    /// fetch sends none of them).
    pub fn unrecord(&self, kind: Kind, principal: &str, client_id: &str, bytes: usize) {
        if !self.enabled(kind) {
            return;
        }
        let Some((_, tags)) = self.table().lookup(kind.key(), user_of(principal), client_id) else {
            return;
        };
        let now = self.now_ms();
        if let Some(rate) = self
            .sensors
            .lock()
            .expect("quota sensors lock")
            .get_mut(&(kind, tags))
        {
            rate.record(self.config, -(bytes as f64), now);
        }
    }

    /// The most bytes one request may take without being throttled however
    /// idle the client was (Kafka caps a fetch's `max_bytes` to it):
    /// `None` without a quota.
    pub fn max_in_window(&self, kind: Kind, principal: &str, client_id: &str) -> Option<usize> {
        if !self.enabled(kind) {
            return None;
        }
        let (bound, _) = self.table().lookup(kind.key(), user_of(principal), client_id)?;
        let seconds =
            f64::from(self.config.samples.saturating_sub(1)) * self.config.window_ms as f64 / 1000.0;
        Some((bound * seconds).min(i32::MAX as f64) as usize)
    }

    /// Records a new connection from `ip`; how long to hold it unread
    /// before closing it when that is over the address's
    /// `connection_creation_rate` (Kafka throttles such a connection, then
    /// closes it, and does not count it), zero to accept it.
    pub fn connection(&self, ip: IpAddr) -> Duration {
        self.connection_at(ip, self.now_ms())
    }

    fn connection_at(&self, ip: IpAddr, now: u64) -> Duration {
        if !self.enabled(Kind::Connection) {
            return Duration::ZERO;
        }
        let ip = ip.to_canonical();
        let table = self.table();
        let quota = |name: Option<String>| {
            let entity = Entity {
                ip: Some(name),
                ..Entity::default()
            };
            table
                .entities
                .get(&entity)?
                .get(CONNECTION_CREATION_RATE)
                .copied()
        };
        let Some(bound) = quota(Some(ip.to_string())).or_else(|| quota(None)) else {
            return Duration::ZERO;
        };
        let mut connections = self.connections.lock().expect("connection sensors lock");
        let rate = connections.entry(ip).or_insert_with(|| Rate::new(now));
        rate.record(self.config, 1.0, now);
        let (observed, span) = rate.measure(self.config, now);
        if observed <= bound {
            return Duration::ZERO;
        }
        rate.record(self.config, -1.0, now);
        // At most one quota window, as Kafka bounds it (a quota just
        // lowered would otherwise hold new connections for minutes).
        Duration::from_millis(((observed - bound) / bound * span as f64).round() as u64)
            .min(Duration::from_millis(self.config.window_ms))
    }

    /// The controller mutation quota of one CreateTopics, CreatePartitions
    /// or DeleteTopics request (KIP-599): `strict` for the versions that
    /// may answer THROTTLING_QUOTA_EXCEEDED (CreateTopics v6+,
    /// CreatePartitions v3+, DeleteTopics v5+), which refuse a topic once
    /// the client's tokens are spent; older ones only throttle.
    ///
    /// The tokens are kept in `shared` (Redis), one bucket for every
    /// gateway, as Kafka's one active controller keeps them for the
    /// cluster; without it, or while it does not answer, by this gateway.
    pub fn mutations<'a>(
        &'a self,
        shared: Option<&'a dyn Storage>,
        principal: &str,
        client_id: &str,
        strict: bool,
    ) -> MutationQuota<'a> {
        let target = if self.enabled(Kind::Mutation) {
            self.table()
                .lookup(CONTROLLER_MUTATION_RATE, user_of(principal), client_id)
        } else {
            None
        };
        MutationQuota {
            quotas: self,
            shared,
            target,
            strict,
            throttle: Mutex::new(None),
        }
    }

    /// Drops the sensors of clients and addresses not seen for an hour.
    pub fn expire_sensors(&self) {
        self.sensors
            .lock()
            .expect("quota sensors lock")
            .retain(|_, rate| rate.last_used.elapsed() < SENSOR_EXPIRY);
        self.connections
            .lock()
            .expect("connection sensors lock")
            .retain(|_, rate| rate.last_used.elapsed() < SENSOR_EXPIRY);
        self.buckets
            .lock()
            .expect("mutation buckets lock")
            .retain(|_, bucket| bucket.last_used.elapsed() < SENSOR_EXPIRY);
    }
}

/// Partition mutation tokens (Kafka's `TokenBucket`): they refill at the
/// quota's rate up to a burst of `window_num × window_size` seconds' worth;
/// mutations take them, and may take them below zero.
#[derive(Debug)]
struct TokenBucket {
    tokens: f64,
    last_ms: u64,
    last_used: Instant,
}

impl TokenBucket {
    fn refill(&mut self, rate: f64, burst: f64, now: u64) {
        let elapsed = now.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.tokens = (self.tokens + rate * elapsed).min(burst);
        self.last_ms = now;
        self.last_used = Instant::now();
    }
}

/// The controller mutation quota of one request (see
/// [`ClientQuotas::mutations`]).
pub struct MutationQuota<'a> {
    quotas: &'a ClientQuotas,
    shared: Option<&'a dyn Storage>,
    target: Option<(f64, SensorTags)>,
    strict: bool,
    /// The throttle time the request earned, and when.
    throttle: Mutex<Option<(Duration, Instant)>>,
}

/// A topic refused because its client's mutation quota is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaExceeded;

impl MutationQuota<'_> {
    /// Whether a quota applies to the request's client.
    pub fn applies(&self) -> bool {
        self.target.is_some()
    }

    /// Records `partitions` created or deleted. Strict: refused when the
    /// tokens were already below zero (a request may overdraw them once).
    pub async fn record(&self, partitions: i32) -> Result<(), QuotaExceeded> {
        let (Some(shared), Some((rate, tags))) = (self.shared, &self.target) else {
            return self.record_at(partitions, self.quotas.now_ms());
        };
        let client = serde_json::json!([tags.user, tags.client_id]).to_string();
        match shared
            .take_mutation_tokens(&client, *rate, self.burst(*rate), partitions, self.strict)
            .await
        {
            Ok((taken, tokens)) => self.settle(*rate, taken, tokens),
            Err(e) => {
                tracing::debug!(error = %e, "controller mutation tokens kept by this gateway: Redis did not answer");
                self.record_at(partitions, self.quotas.now_ms())
            }
        }
    }

    fn burst(&self, rate: f64) -> f64 {
        let config = self.quotas.config;
        rate * f64::from(config.samples) * config.window_ms as f64 / 1000.0
    }

    /// This gateway's own bucket.
    fn record_at(&self, partitions: i32, now: u64) -> Result<(), QuotaExceeded> {
        let Some((rate, tags)) = &self.target else {
            return Ok(());
        };
        let burst = self.burst(*rate);
        let mut buckets = self.quotas.buckets.lock().expect("mutation buckets lock");
        let bucket = buckets.entry(tags.clone()).or_insert_with(|| TokenBucket {
            tokens: burst,
            last_ms: now,
            last_used: Instant::now(),
        });
        bucket.refill(*rate, burst, now);
        let taken = !(self.strict && bucket.tokens < 0.0);
        if taken {
            bucket.tokens = (bucket.tokens - f64::from(partitions.max(0))).min(burst);
        }
        let tokens = bucket.tokens;
        drop(buckets);
        self.settle(*rate, taken, tokens)
    }

    /// The outcome of a take that left `tokens`: a refusal (strict) or an
    /// overdraft (not strict) earns the time until they are back.
    fn settle(&self, rate: f64, taken: bool, tokens: f64) -> Result<(), QuotaExceeded> {
        let owed = Duration::from_millis((-tokens / rate * 1000.0).round() as u64);
        if !taken {
            *self.throttle.lock().expect("throttle lock") = Some((owed, Instant::now()));
            return Err(QuotaExceeded);
        }
        if !self.strict && tokens < 0.0 {
            *self.throttle.lock().expect("throttle lock") = Some((owed, Instant::now()));
        }
        Ok(())
    }

    /// The throttle time to answer with: what a refusal (strict) or an
    /// overdraft (not strict) left, less the time since.
    pub fn throttle_time_ms(&self) -> i32 {
        let throttle = *self.throttle.lock().expect("throttle lock");
        throttle.map_or(0, |(throttle, at)| {
            i32::try_from(throttle.saturating_sub(at.elapsed()).as_millis()).unwrap_or(i32::MAX)
        })
    }
}

/// A principal's user name as quotas name it (`User:alice` → `alice`).
pub fn user_of(principal: &str) -> &str {
    principal.strip_prefix("User:").unwrap_or(principal)
}

/// Reads the quotas from storage into this gateway.
pub async fn reload(ctx: &Context) -> ketch_storage::Result<()> {
    let (version, stored) = ctx.storage.client_quotas().await?;
    ctx.quotas.replace(Table::from_stored(version, stored));
    Ok(())
}

/// Keeps this gateway's quotas current (see [`crate::storage::keep_current`])
/// and drops the sensors of clients gone for an hour. Runs until shutdown.
pub async fn keep_current(ctx: Arc<Context>) {
    let channel = ctx.storage.quota_channel();
    let kept = crate::storage::Kept {
        what: "client quotas",
        channel,
        stored: |ctx| ctx.storage.client_quota_version(),
        held: |ctx| ctx.quotas.table().version,
        load: |ctx| {
            Box::pin(async move {
                reload(ctx).await?;
                let table = ctx.quotas.table();
                Ok(format!(
                    "{} entities, version {}",
                    table.entities.len(),
                    table.version
                ))
            })
        },
        tick: |ctx| ctx.quotas.expire_sensors(),
        check_every: std::time::Duration::from_secs(5),
    };
    crate::storage::keep_current(ctx, kept).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(samples: u32, entries: &[(Entity, &str, f64)]) -> ClientQuotas {
        let quotas = ClientQuotas::new(&ketch_config::QuotasSettings {
            window_num: samples,
            window_size: ketch_config::Duration::from_secs(1),
        });
        let mut table = Table::default();
        for (entity, key, value) in entries {
            table
                .entities
                .entry(entity.clone())
                .or_default()
                .insert((*key).to_owned(), *value);
        }
        quotas.replace(table);
        quotas
    }

    #[test]
    fn entities_are_checked_as_kafka_checks_them() {
        assert!(Entity::from_parts([]).unwrap_err().contains("empty"));
        assert!(
            Entity::from_parts([("user", Some("a")), ("user", Some("b"))])
                .unwrap_err()
                .contains("duplicate")
        );
        assert!(
            Entity::from_parts([("group", Some("a"))])
                .unwrap_err()
                .contains("Unhandled")
        );
        assert!(
            Entity::from_parts([("user", Some(""))])
                .unwrap_err()
                .contains("Empty user")
        );
        assert!(
            Entity::from_parts([("ip", Some("1.2.3.4")), ("user", None)])
                .unwrap_err()
                .contains("IP entity")
        );
        assert!(
            Entity::from_parts([("ip", Some("not an ip"))])
                .unwrap_err()
                .contains("not a valid IP")
        );
        let entity = Entity::from_parts([("client-id", None), ("user", Some("alice"))]).unwrap();
        assert_eq!(entity.describe(), "user=alice, client-id=<default>");
        assert_eq!(Entity::from_stored(&entity.to_stored()), Some(entity));
    }

    #[test]
    fn values_are_checked_by_their_key_type() {
        let user = Entity::client(Some(Some("u")), None);
        let ip = Entity::from_parts([("ip", None)]).unwrap();
        assert!(check_value(&user, PRODUCER_BYTE_RATE, 1024.0).is_ok());
        assert!(check_value(&user, REQUEST_PERCENTAGE, 12.5).is_ok());
        assert!(
            check_value(&user, PRODUCER_BYTE_RATE, 0.0)
                .unwrap_err()
                .contains("greater than 0")
        );
        assert!(check_value(&user, PRODUCER_BYTE_RATE, f64::NAN).is_err());
        assert!(
            check_value(&user, PRODUCER_BYTE_RATE, 10.5)
                .unwrap_err()
                .contains("fractional")
        );
        assert!(
            check_value(&user, PRODUCER_BYTE_RATE, 1e30)
                .unwrap_err()
                .contains("LONG")
        );
        assert!(
            check_value(&user, CONNECTION_CREATION_RATE, 5.0)
                .unwrap_err()
                .contains("Invalid configuration key")
        );
        assert!(check_value(&ip, CONNECTION_CREATION_RATE, 5.0).is_ok());
        assert!(
            check_value(&ip, CONNECTION_CREATION_RATE, 3e9)
                .unwrap_err()
                .contains("INT")
        );
        assert!(check_value(&ip, PRODUCER_BYTE_RATE, 5.0).is_err());
    }

    #[test]
    fn the_most_specific_of_kafkas_eight_levels_applies() {
        let e = |u: Option<Option<&str>>, c: Option<Option<&str>>| Entity::client(u, c);
        let table = quotas(
            11,
            &[
                (e(None, Some(None)), PRODUCER_BYTE_RATE, 8.0),
                (e(None, Some(Some("c"))), PRODUCER_BYTE_RATE, 7.0),
                (e(Some(None), None), PRODUCER_BYTE_RATE, 6.0),
                (e(Some(Some("u")), None), PRODUCER_BYTE_RATE, 3.0),
                (e(Some(Some("u")), Some(Some("c"))), PRODUCER_BYTE_RATE, 1.0),
                (e(Some(Some("v")), Some(None)), CONSUMER_BYTE_RATE, 2.0),
            ],
        )
        .table();
        let quota = |u: &str, c: &str| {
            table
                .lookup(PRODUCER_BYTE_RATE, u, c)
                .map(|(v, t)| (v, t.user, t.client_id))
        };
        assert_eq!(quota("u", "c"), Some((1.0, "u".into(), "c".into())));
        // A user's own quota is shared by all its clients.
        assert_eq!(quota("u", "d"), Some((3.0, "u".into(), "".into())));
        // The default user's quota is each user's own.
        assert_eq!(quota("v", "c"), Some((6.0, "v".into(), "".into())));
        // Keys do not mix: v's default client-id quota is for fetches.
        assert_eq!(
            table.lookup(CONSUMER_BYTE_RATE, "v", "x").map(|(v, _)| v),
            Some(2.0)
        );
        assert_eq!(table.lookup(CONSUMER_BYTE_RATE, "u", "x"), None);
        let only_clients = quotas(
            11,
            &[
                (e(None, Some(None)), PRODUCER_BYTE_RATE, 8.0),
                (e(None, Some(Some("c"))), PRODUCER_BYTE_RATE, 7.0),
            ],
        )
        .table();
        let quota = |u: &str, c: &str| {
            only_clients
                .lookup(PRODUCER_BYTE_RATE, u, c)
                .map(|(v, t)| (v, t.user, t.client_id))
        };
        assert_eq!(quota("u", "c"), Some((7.0, "".into(), "c".into())));
        assert_eq!(quota("u", "z"), Some((8.0, "".into(), "z".into())));
        assert_eq!(
            quota("u", ""),
            None,
            "an empty client id matches no client-id entity"
        );
    }

    #[test]
    fn throttle_time_is_kafkas_formula_over_the_measured_span() {
        // 1000 B/s over 11 one-second samples: 10 s of burst (10 000 B)
        // before any throttling.
        let q = quotas(
            11,
            &[(Entity::client(None, Some(None)), PRODUCER_BYTE_RATE, 1000.0)],
        );
        assert_eq!(
            q.record_at(Kind::Produce, "User:ANONYMOUS", "c", 10_000.0, 0),
            Duration::ZERO
        );
        // 15 000 B over a span of 10 s: 1500 B/s, (1500-1000)/1000 × 10 s.
        assert_eq!(
            q.record_at(Kind::Produce, "User:ANONYMOUS", "c", 5_000.0, 0),
            Duration::from_secs(5)
        );
        // Another client id has its own sensor.
        assert_eq!(
            q.record_at(Kind::Produce, "User:ANONYMOUS", "d", 5_000.0, 0),
            Duration::ZERO
        );
        // 15 s later the first samples have expired (11 s): under quota.
        assert_eq!(
            q.record_at(Kind::Produce, "User:ANONYMOUS", "c", 100.0, 15_000),
            Duration::ZERO
        );
        // Fetch is measured apart and has no quota here.
        assert_eq!(
            q.record_at(Kind::Fetch, "User:ANONYMOUS", "c", 1e9, 15_000),
            Duration::ZERO
        );
        assert_eq!(q.max_in_window(Kind::Produce, "User:x", "c"), Some(10_000));
        assert_eq!(q.max_in_window(Kind::Fetch, "User:x", "c"), None);
    }

    #[test]
    fn request_time_is_a_percentage_of_one_thread_with_a_wait_of_at_most_a_window() {
        // 10 % of a thread over 11 one-second samples: 1 s of thread time
        // fits in the 10 s span.
        let q = quotas(
            11,
            &[(Entity::client(None, Some(None)), REQUEST_PERCENTAGE, 10.0)],
        );
        let busy = |ms| Duration::from_millis(ms);
        assert_eq!(
            q.record_request_time_at("User:u", "c", busy(1_000), 0),
            Duration::ZERO
        );
        // 1.5 s over 10 s: 15 %, (15-10)/10 × 10 s = 5 s, bounded to 1 s.
        assert_eq!(
            q.record_request_time_at("User:u", "c", busy(500), 0),
            Duration::from_secs(1)
        );
        // Produce bytes are measured apart.
        assert_eq!(q.record_at(Kind::Produce, "User:u", "c", 1e9, 0), Duration::ZERO);
        let unset = quotas(11, &[]);
        assert_eq!(
            unset.record_request_time_at("User:u", "c", busy(60_000), 0),
            Duration::ZERO
        );
    }

    #[test]
    fn connections_over_an_addresss_rate_are_refused_and_not_counted() {
        let ip = |name: Option<&str>| Entity::from_parts([("ip", name)]).unwrap();
        let q = quotas(
            2,
            &[
                (ip(None), CONNECTION_CREATION_RATE, 2.0),
                (ip(Some("10.0.0.1")), CONNECTION_CREATION_RATE, 1.0),
            ],
        );
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let named: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        // The default: 2 a second over a span of at least 1 s.
        assert_eq!(q.connection_at(local, 0), Duration::ZERO);
        assert_eq!(q.connection_at(local, 0), Duration::ZERO);
        // 3 over 1 s: (3 - 2) / 2 × 1 s.
        assert_eq!(q.connection_at(local, 0), Duration::from_millis(500));
        // The refused one was not counted: still refused by the same margin.
        assert_eq!(q.connection_at(local, 0), Duration::from_millis(500));
        // 10.0.0.1 (an IPv4-mapped address is the same) has its own, 1 a second.
        assert_eq!(q.connection_at(named, 0), Duration::ZERO);
        assert!(!q.connection_at(named, 0).is_zero());
        // Two seconds on, the samples have expired.
        assert_eq!(q.connection_at(local, 2_100), Duration::ZERO);
        // Far over a rate, the hold is one window at most.
        // (1 - 0.01) / 0.01 × 1 s = 99 s, held one window (1 s).
        let slow = quotas(2, &[(ip(None), CONNECTION_CREATION_RATE, 0.01)]);
        assert_eq!(slow.connection_at(local, 0), Duration::from_secs(1));
    }

    #[test]
    fn strict_mutation_quotas_refuse_once_the_tokens_are_spent() {
        // 2 partitions a second, 2 samples of 1 s: a burst of 4.
        let q = quotas(
            2,
            &[(Entity::client(Some(None), None), CONTROLLER_MUTATION_RATE, 2.0)],
        );
        let strict = q.mutations(None, "User:alice", "admin", true);
        assert_eq!(strict.record_at(3, 0), Ok(()));
        // One token left: this takes it below zero, but is accepted.
        assert_eq!(strict.record_at(5, 0), Ok(()));
        assert_eq!(strict.throttle_time_ms(), 0);
        // -4 tokens: refused, 2 s to get back to zero.
        assert_eq!(strict.record_at(1, 0), Err(QuotaExceeded));
        assert!((1_900..=2_000).contains(&strict.throttle_time_ms()));
        // Another user has tokens of its own; 2 s on, alice has them back.
        assert_eq!(
            q.mutations(None, "User:bob", "admin", true).record_at(4, 0),
            Ok(())
        );
        assert_eq!(
            q.mutations(None, "User:alice", "admin", true).record_at(1, 2_000),
            Ok(())
        );
        // Not strict: never refused, throttled by the overdraft.
        let permissive = q.mutations(None, "User:carol", "admin", false);
        assert_eq!(permissive.record_at(10, 0), Ok(()));
        assert!((2_900..=3_000).contains(&permissive.throttle_time_ms()));
        // No quota for that key: nothing recorded.
        let none = quotas(2, &[(Entity::client(Some(None), None), PRODUCER_BYTE_RATE, 2.0)]);
        assert_eq!(
            none.mutations(None, "User:alice", "admin", true)
                .record_at(1_000, 0),
            Ok(())
        );
    }

    #[test]
    fn a_rate_spans_the_samples_it_keeps() {
        let config = WindowConfig {
            samples: 3,
            window_ms: 1000,
        };
        let mut rate = Rate::new(0);
        rate.record(config, 1000.0, 0);
        // The missing full windows are added: 1000 B / 2.5 s.
        assert_eq!(rate.measure(config, 500), (400.0, 2500));
        rate.record(config, 1000.0, 1500);
        rate.record(config, 1000.0, 2500);
        // Samples at 0, 1500 and 2500: at 2900, 3000 B over 2.9 s.
        assert_eq!(rate.measure(config, 2900), (3000.0 / 2.9, 2900));
        // At 3000 the first has had no event for 3 samples: purged, 2000 B
        // over the 1.5 s since 1500, made up to 2 windows.
        assert_eq!(rate.measure(config, 3000), (800.0, 2500));
        // Taken back (a throttled fetch).
        rate.record(config, -1000.0, 3000);
        assert_eq!(rate.measure(config, 3000).0, 400.0);
    }
}
