//! Gateway membership (DESIGN §6): heartbeats into `ketch:brokers`, the
//! live gateways Metadata lists, and rendezvous hashing over them to choose
//! each partition's leader and each group's coordinator, so the load is
//! balanced and moves only when membership changes.
//!
//! Any gateway still serves produce and fetch for any partition (storage is
//! shared); leadership only spreads clients over gateways. Group
//! coordination does depend on it: a gateway runs only the groups it
//! coordinates, and forwards requests for the others to their coordinator
//! (`forward.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ketch_config::MAX_NODE_ID;
use ketch_storage::{BrokerRecord, Registration, Store};
use tokio::sync::watch;

use crate::Node;

/// This gateway's node id before it has one (claimed at start, in Redis).
pub const UNASSIGNED: i32 = -1;

/// The live gateways as this one last saw them.
#[derive(Clone)]
pub struct Membership {
    me: Arc<RwLock<Node>>,
    live: Arc<RwLock<Vec<Node>>>,
    /// A heartbeat of this gateway reached Redis.
    joined: Arc<AtomicBool>,
    /// The live set was read since this process started: until then this
    /// gateway knows only itself, and must not take itself for every
    /// group's coordinator and every partition's leader.
    live_known: Arc<AtomicBool>,
    /// See [`Membership::take_forget_all`].
    forget_all: Arc<AtomicBool>,
    /// Counts changes of the live set (and of this gateway's id).
    changes: watch::Sender<u64>,
    /// This process, in the registry.
    instance: Arc<str>,
    /// When a heartbeat last reached Redis, and after how long without one
    /// this gateway stops coordinating groups (the others take them over
    /// after `node_timeout`).
    beat: Arc<Mutex<Beat>>,
}

#[derive(Debug, Clone, Copy)]
struct Beat {
    /// When the last heartbeat that reached Redis was sent.
    last: Option<Instant>,
    /// `node_timeout - heartbeat_interval`: past this without a heartbeat,
    /// the others are about to take this gateway for dead.
    fence_after: Duration,
    /// Counts the lapses noticed: a change of a group queued before one
    /// must not be written after it (see [`Membership::epoch`]).
    epoch: u64,
    /// A lapse was noticed and has not ended yet.
    noticed: bool,
}

impl Beat {
    fn lapsed(&self) -> bool {
        self.last.is_none_or(|last| last.elapsed() >= self.fence_after)
    }
}

/// What a heartbeat's outcome changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lapse {
    None,
    /// Heartbeats have failed for `fence_after`.
    Began,
    /// A heartbeat reached Redis again after a lapse: noticed while it
    /// lasted, or only now (the process was paused).
    Ended {
        noticed: bool,
    },
}

/// How a gateway gets its node id.
#[derive(Debug, Clone)]
pub struct Registering {
    /// `broker.id`, if set; otherwise the lowest free id is claimed.
    pub configured: Option<i32>,
    pub heartbeat_interval: Duration,
    pub node_timeout: Duration,
    /// `cluster.layout_step_delay`.
    pub layout_step_delay: Duration,
}

impl Membership {
    /// Membership with only this gateway, until the first refresh. `me.id`
    /// is [`UNASSIGNED`] until [`Membership::register`] claims one.
    pub fn new(me: Node) -> Self {
        Self {
            live: Arc::new(RwLock::new(vec![me.clone()])),
            joined: Arc::new(AtomicBool::new(false)),
            live_known: Arc::new(AtomicBool::new(false)),
            forget_all: Arc::new(AtomicBool::new(false)),
            changes: watch::channel(0).0,
            instance: Arc::from(uuid::Uuid::new_v4().to_string()),
            me: Arc::new(RwLock::new(me)),
            beat: Arc::new(Mutex::new(Beat {
                last: None,
                fence_after: Duration::MAX,
                epoch: 0,
                noticed: false,
            })),
        }
    }

    /// Membership of a gateway registered as `me`, for tests.
    #[cfg(test)]
    fn registered(me: Node) -> Self {
        let membership = Self::new(me);
        membership.joined.store(true, Ordering::Relaxed);
        membership
    }

    /// Whether this gateway has registered in Redis and read the live
    /// set since (part of `/ready`).
    pub fn joined(&self) -> bool {
        self.is_registered() && self.live_known.load(Ordering::Relaxed)
    }

    /// Whether this gateway has registered in Redis (and not left).
    fn is_registered(&self) -> bool {
        self.joined.load(Ordering::Relaxed)
    }

    /// This gateway; its id is [`UNASSIGNED`] until registered.
    pub fn me(&self) -> Node {
        self.me.read().expect("membership lock").clone()
    }

    /// This gateway's node id ([`UNASSIGNED`] until registered).
    pub fn my_id(&self) -> i32 {
        self.me.read().expect("membership lock").id
    }

    /// Ticks whenever the live set changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The live gateways, by node id; always includes this one.
    pub fn nodes(&self) -> Vec<Node> {
        self.live.read().expect("membership lock").clone()
    }

    /// The brokers clients of `listener` see: the live gateways, except
    /// that an address several of them advertise (a load balancer in front
    /// of them) is one broker, under [`address_id`]. Sorted by id; empty
    /// until this gateway has registered (a configured `broker.id` is known
    /// before: alone, this gateway would present itself as the whole
    /// cluster). An empty listener name is the first listener.
    pub fn brokers(&self, listener: &str) -> Vec<Node> {
        if !self.joined() {
            return Vec::new();
        }
        let live = self.live.read().expect("membership lock");
        let sharing = sharing(&live, listener);
        let mut brokers: Vec<Node> = Vec::with_capacity(live.len());
        for node in live.iter() {
            let presented = present(&node.on(listener), &sharing);
            if !brokers.iter().any(|b| b.id == presented.id) {
                brokers.push(presented);
            }
        }
        brokers.sort_by_key(|b| b.id);
        brokers
    }

    /// `node` as clients of `listener` see it: under its address id when
    /// other live gateways advertise the same address, or when it is
    /// [`Node::by_address`]; see [`present`].
    pub fn presented(&self, node: &Node, listener: &str) -> Node {
        let live = self.live.read().expect("membership lock");
        present(&node.on(listener), &sharing(&live, listener))
    }

    /// Each live gateway's broker id as clients of `listener` see it, by
    /// node id: for a request that presents many nodes (a Metadata
    /// response's partition leaders), computed once.
    pub fn broker_ids(&self, listener: &str) -> HashMap<i32, i32> {
        let live = self.live.read().expect("membership lock");
        let sharing = sharing(&live, listener);
        live.iter()
            .map(|n| (n.id, presented_id(n, listener, &sharing)))
            .collect()
    }

    /// This gateway's broker id as clients of `listener` see it (see
    /// [`Membership::brokers`]).
    pub fn my_broker_id(&self, listener: &str) -> i32 {
        let live = self.live.read().expect("membership lock");
        presented_id(&self.me(), listener, &sharing(&live, listener))
    }

    /// Whether clients of `listener` reach this gateway through an address
    /// other live gateways advertise too (so they cannot reach the others
    /// directly).
    pub fn behind_shared_address(&self, listener: &str) -> bool {
        !self.sharing_my_address(listener).is_empty()
    }

    /// The other live gateways that clients of `listener` reach through
    /// this gateway's address (it advertises theirs too); the rest, with
    /// addresses of their own there, those clients reach directly.
    pub fn sharing_my_address(&self, listener: &str) -> Vec<Node> {
        let me = self.me();
        let (host, port, _) = me.address_on(listener);
        let live = self.live.read().expect("membership lock");
        live.iter()
            .filter(|n| {
                let (h, p, _) = n.address_on(listener);
                n.id != me.id && h.eq_ignore_ascii_case(host) && p == port
            })
            .cloned()
            .collect()
    }

    /// The gateway that leads a partition.
    pub fn partition_leader(&self, topic_id: &uuid::Uuid, partition: i32) -> Node {
        let mut key = topic_id.as_bytes().to_vec();
        key.extend_from_slice(&partition.to_be_bytes());
        self.owner(&key)
    }

    /// Whether this gateway leads the partition (false until it has
    /// registered).
    pub fn leads(&self, topic_id: &uuid::Uuid, partition: i32) -> bool {
        self.joined() && self.partition_leader(topic_id, partition).id == self.my_id()
    }

    /// The gateway that coordinates a group.
    pub fn group_coordinator(&self, group: &str) -> Node {
        let mut key = b"group:".to_vec();
        key.extend_from_slice(group.as_bytes());
        self.owner(&key)
    }

    /// The gateway that coordinates a transactional id: the one that
    /// looks after its timeouts (`crate::transactions::sweep`).
    pub fn transaction_coordinator(&self, id: &str) -> Node {
        let mut key = b"txn:".to_vec();
        key.extend_from_slice(id.as_bytes());
        self.owner(&key)
    }

    /// Whether this gateway coordinates `group`.
    pub fn coordinates(&self, group: &str) -> bool {
        self.can_coordinate() && self.group_coordinator(group).id == self.my_id()
    }

    /// Whether this gateway may coordinate groups at all: it has a node id
    /// and its heartbeats reach Redis. A gateway whose heartbeats have not
    /// for `node_timeout - heartbeat_interval` is about to be taken for
    /// dead, and its groups over by others: it stops first.
    ///
    /// Computed when asked, not at heartbeats: a gateway resumed after a
    /// pause longer than that stops coordinating at once, before its group
    /// timers (overdue, firing first) could write what its stale groups did.
    pub fn can_coordinate(&self) -> bool {
        self.joined() && !self.beat.lock().expect("membership lock").lapsed()
    }

    /// Changes whenever a lapse of this gateway's heartbeats is noticed. A
    /// group change queued in one epoch is not written to Redis in another:
    /// the group was handed over in between, and this gateway's copy of it
    /// is stale.
    pub fn epoch(&self) -> u64 {
        self.beat.lock().expect("membership lock").epoch
    }

    /// A heartbeat sent at `sent` reached Redis (`Some`), or failed (`None`).
    fn beat(&self, reached: Option<Instant>) -> Lapse {
        let mut beat = self.beat.lock().expect("membership lock");
        let lapsed = beat.lapsed();
        match reached {
            Some(sent) => {
                let lapse = if lapsed || beat.noticed {
                    // The epoch moves before the lapse ends: changes queued
                    // during it are never written.
                    beat.epoch += 1;
                    Lapse::Ended {
                        noticed: beat.noticed,
                    }
                } else {
                    Lapse::None
                };
                beat.last = Some(sent);
                beat.noticed = false;
                lapse
            }
            None if lapsed && !beat.noticed => {
                beat.noticed = true;
                beat.epoch += 1;
                Lapse::Began
            }
            None => Lapse::None,
        }
    }

    /// Set when this gateway's groups must all be forgotten (a lapse ended
    /// that was not noticed while it lasted); taken by the hand-over task.
    pub fn take_forget_all(&self) -> bool {
        self.forget_all.swap(false, Ordering::SeqCst)
    }

    /// Rendezvous (highest random weight) hashing: every gateway computes
    /// the same owner from the same live set.
    fn owner(&self, key: &[u8]) -> Node {
        let live = self.live.read().expect("membership lock");
        live.iter()
            .max_by_key(|node| (weight(node.id, key), node.id))
            .cloned()
            .unwrap_or_else(|| self.me())
    }

    fn set_live(&self, mut nodes: Vec<Node>) {
        let me = self.me();
        match nodes.iter_mut().find(|n| n.id == me.id) {
            Some(registered) => *registered = me,
            None => {
                nodes.push(me);
                nodes.sort_by_key(|n| n.id);
            }
        }
        self.live_known.store(true, Ordering::Relaxed);
        let mut live = self.live.write().expect("membership lock");
        if *live != nodes {
            tracing::info!(nodes = ?nodes.iter().map(|n| n.id).collect::<Vec<_>>(), "live gateways changed");
            *live = nodes;
            drop(live);
            self.changes.send_modify(|n| *n += 1);
        }
    }

    fn record(&self) -> BrokerRecord {
        let me = self.me();
        let (internal_host, internal_port) = match &me.internal {
            Some((host, port)) => (Some(host.clone()), Some(*port)),
            None => (None, None),
        };
        BrokerRecord {
            node_id: me.id,
            host: me.host,
            port: me.port,
            rack: None,
            internal_host,
            internal_port,
            hostname: hostname(),
            by_address: me.by_address,
            listeners: me
                .listeners
                .iter()
                .map(|l| ketch_storage::ListenerRecord {
                    name: l.name.clone(),
                    host: l.host.clone(),
                    port: l.port,
                    by_address: l.by_address,
                })
                .collect(),
            layout: ketch_storage::LAYOUT_VERSION,
            instance: String::new(),
            heartbeat_ms: 0,
        }
    }

    /// Takes this gateway's node id in the registry: the configured one,
    /// or the lowest no live gateway holds. A configured id still held by
    /// another process is waited for while that process's entry may be a
    /// crashed gateway's (it expires after `node_timeout`); it is an error
    /// once the holder refreshes its entry, as a live gateway does.
    /// `Err(Unavailable)` on the first Redis error: the caller retries
    /// later, in the background.
    pub async fn register(&self, store: &Store, how: &Registering) -> Result<i32, RegisterError> {
        let mut waiting_for: Option<BrokerRecord> = None;
        loop {
            let registered = store
                .register(
                    how.configured,
                    &self.record(),
                    &self.instance,
                    how.node_timeout,
                    MAX_NODE_ID,
                )
                .await
                .map_err(|e| RegisterError::Unavailable(e.to_string()))?;
            match registered {
                Registration::Registered { node_id } => {
                    {
                        let mut beat = self.beat.lock().expect("membership lock");
                        beat.fence_after = how.node_timeout.saturating_sub(how.heartbeat_interval);
                        beat.last = Some(Instant::now());
                    }
                    self.me.write().expect("membership lock").id = node_id;
                    self.joined.store(true, Ordering::Relaxed);
                    // Unread, the live set stays unknown (this gateway
                    // coordinates nothing) until the next heartbeat's read.
                    match store.live_brokers(how.node_timeout).await {
                        Ok(brokers) => self.set_live(brokers.into_iter().map(node).collect()),
                        Err(e) => tracing::debug!(error = %e, "cannot read live gateways yet"),
                    }
                    self.changes.send_modify(|n| *n += 1);
                    tracing::info!(
                        node_id,
                        claimed = how.configured.is_none(),
                        "registered in ketch:brokers"
                    );
                    return Ok(node_id);
                }
                Registration::NoFreeId => return Err(RegisterError::NoFreeId),
                Registration::Held {
                    holder,
                    heartbeat_age,
                } => {
                    let refreshed = waiting_for.as_ref().is_some_and(|before| {
                        before.instance == holder.instance && holder.heartbeat_ms > before.heartbeat_ms
                    });
                    if refreshed {
                        return Err(RegisterError::Held(describe_holder(&holder)));
                    }
                    if waiting_for
                        .as_ref()
                        .is_none_or(|before| before.instance != holder.instance)
                    {
                        tracing::warn!(
                            node_id = holder.node_id,
                            holder = %describe_holder(&holder),
                            last_heartbeat_ms = heartbeat_age.as_millis() as u64,
                            expires_in_ms = how.node_timeout.saturating_sub(heartbeat_age).as_millis() as u64,
                            "node id is registered by another process: waiting for its entry to expire \
                             (a gateway restarted right after a crash) or to be refreshed (a live gateway: an error)"
                        );
                    }
                    waiting_for = Some(holder);
                    tokio::time::sleep(how.heartbeat_interval.min(how.node_timeout / 4)).await;
                }
            }
        }
    }

    /// Registers (retrying while Redis is unreachable) unless already
    /// registered, then heartbeats and refreshes the live set until
    /// `shutdown`, then deregisters this gateway. A lost node id (another
    /// process took it while this one could not refresh its entry for
    /// `node_timeout`) stops the process: two gateways must never serve
    /// under one id.
    /// Registration waits for `layout_checked` to turn true.
    pub async fn run(
        self,
        store: Store,
        how: Registering,
        mut layout_checked: watch::Receiver<bool>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let stopped = tokio::select! {
            _ = layout_checked.wait_for(|checked| *checked) => false,
            _ = shutdown.wait_for(|stop| *stop) => true,
        };
        if stopped {
            // Registered already (at start, before this task): a signal
            // during the start must not leave the entry for node_timeout.
            return self.leave(&store).await;
        }
        while !self.is_registered() {
            match self.register(&store, &how).await {
                Ok(_) => {}
                Err(RegisterError::Unavailable(e)) => {
                    tracing::debug!(error = %e, "cannot register yet");
                    let stopped = tokio::select! {
                        () = tokio::time::sleep(how.heartbeat_interval) => false,
                        _ = shutdown.wait_for(|stop| *stop) => true,
                    };
                    if stopped {
                        return self.leave(&store).await;
                    }
                }
                Err(e) => fatal(&e),
            }
        }
        let mut layout = LayoutWatch::default();
        let mut ticks = tokio::time::interval(how.heartbeat_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A gateway that joins or leaves says so (heartbeat.lua,
        // deregister.lua): the live set is read at once rather than at the
        // next heartbeat, so the gateways' Metadata agree within
        // milliseconds, not a heartbeat interval. Crashed gateways are
        // still found by their heartbeats' age.
        let changes = store.wake().watch(vec![store.brokers_channel()]);
        loop {
            let announced = tokio::select! {
                _ = ticks.tick() => false,
                _ = changes.notified() => true,
                _ = shutdown.wait_for(|stop| *stop) => break,
            };
            if announced {
                changes.take_fired();
            } else {
                let id = self.my_id();
                let started = Instant::now();
                let registered = store
                    .register(
                        Some(id),
                        &self.record(),
                        &self.instance,
                        how.node_timeout,
                        MAX_NODE_ID,
                    )
                    .await;
                let reached = match registered {
                    Ok(Registration::Registered { .. }) => Some(started),
                    Ok(Registration::Held { holder, .. }) => {
                        fatal(&RegisterError::Lost(describe_holder(&holder)))
                    }
                    Ok(Registration::NoFreeId) => None,
                    Err(e) => {
                        tracing::debug!(error = %e, "heartbeat failed");
                        None
                    }
                };
                match self.beat(reached) {
                    Lapse::None => {}
                    Lapse::Began => {
                        tracing::warn!(
                            "heartbeats have not reached Redis for cluster.node_timeout - cluster.heartbeat_interval: \
                             forgetting this gateway's groups before the others take it for dead"
                        );
                        self.forget_all.store(true, Ordering::SeqCst);
                        self.changes.send_modify(|n| *n += 1);
                    }
                    Lapse::Ended { noticed } => {
                        if !noticed {
                            tracing::warn!(
                                "no heartbeat reached Redis for cluster.node_timeout - cluster.heartbeat_interval \
                                 (was this process paused?): forgetting its groups, their new coordinators have them"
                            );
                        } else {
                            tracing::info!("heartbeats reach Redis again: coordinating groups again");
                        }
                        self.forget_all.store(true, Ordering::SeqCst);
                        self.changes.send_modify(|n| *n += 1);
                    }
                }
                if reached.is_none() {
                    continue;
                }
            }
            match store.live_brokers(how.node_timeout).await {
                Ok(brokers) => {
                    layout.beat(&store, &brokers, how.layout_step_delay).await;
                    self.set_live(brokers.into_iter().map(node).collect());
                }
                Err(e) => tracing::debug!(error = %e, "cannot read live gateways"),
            }
        }
        self.leave(&store).await;
    }

    /// Leaves the cluster at shutdown: stops coordinating first (this
    /// gateway's groups forgotten, their parked requests answered
    /// NOT_COORDINATOR and their queued writes dropped, as Kafka unloads a
    /// group), so nothing here acts as a coordinator once the others have
    /// taken its groups over, then deregisters, which tells the others at
    /// once.
    async fn leave(&self, store: &Store) {
        if !self.is_registered() {
            return;
        }
        self.joined.store(false, Ordering::SeqCst);
        self.forget_all.store(true, Ordering::SeqCst);
        self.changes.send_modify(|n| *n += 1);
        if let Err(e) = store.deregister(self.my_id(), &self.instance).await {
            tracing::debug!(error = %e, "cannot deregister");
        }
    }
}

/// Whether the Redis layout's last step is due: every live gateway has
/// served it (`all_serve`) for `delay`, counted from the first heartbeat
/// that found so (`ready`, reset by any that did not).
fn layout_step_due(ready: &mut Option<Instant>, all_serve: bool, now: Instant, delay: Duration) -> bool {
    if !all_serve {
        *ready = None;
        return false;
    }
    now.duration_since(*ready.get_or_insert(now)) >= delay
}

/// What a gateway keeps between heartbeats about the Redis layout's last
/// step.
#[derive(Default)]
struct LayoutWatch {
    /// Since when every live gateway has served the layout.
    ready: Option<Instant>,
    /// The gateways of an older release it last said it saw.
    said: Vec<i32>,
}

impl LayoutWatch {
    /// Takes the last step of the Redis layout once it is due
    /// (`Store::finish_layout`), or notices another gateway took it. Says
    /// which gateways of an older release it waits for, and warns of any
    /// that join after the step (they cannot read compact producer state).
    async fn beat(&mut self, store: &Store, live: &[BrokerRecord], delay: Duration) {
        let older: Vec<i32> = live
            .iter()
            .filter(|b| b.layout < ketch_storage::LAYOUT_VERSION)
            .map(|b| b.node_id)
            .collect();
        // Also once final: the layout is recorded again should something
        // have set it back (one HGET a heartbeat).
        let may_step = layout_step_due(&mut self.ready, older.is_empty(), Instant::now(), delay);
        let me = format!("pid {}", std::process::id());
        if let Err(e) = store.finish_layout(live, may_step, &me).await {
            tracing::debug!(error = %e, "cannot finish the Redis layout yet");
        }
        if older.is_empty() || self.said == older {
            self.said = older;
            return;
        }
        if store.layout_final() {
            tracing::warn!(
                gateways = ?older,
                "gateways of an older release serve beside Redis layout 3: their scripts cannot read the compact \
                 producer state, so their idempotent appends fail; upgrade or stop them"
            );
        } else {
            tracing::info!(
                gateways = ?older,
                "the Redis layout stays at version 2 while these gateways of an older release run \
                 (idempotent producers' state stays JSON)"
            );
        }
        self.said = older;
    }
}

/// Why a gateway cannot have its node id.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("cannot reach Redis to register: {0}")]
    Unavailable(String),
    #[error(
        "node id is held by a live gateway ({0}); give each gateway its own broker.id, or leave it unset to claim a free one"
    )]
    Held(String),
    #[error(
        "another gateway took this gateway's node id ({0}) while its heartbeats did not reach Redis; stopping"
    )]
    Lost(String),
    #[error("every node id up to {MAX_NODE_ID} is held by a live gateway")]
    NoFreeId,
}

fn fatal(e: &RegisterError) -> ! {
    tracing::error!("{e}");
    eprintln!("ketch: {e}");
    std::process::exit(1)
}

fn describe_holder(holder: &BrokerRecord) -> String {
    format!(
        "node {} advertising {}:{}, instance {}{}",
        holder.node_id,
        holder.host,
        holder.port,
        holder.instance,
        holder
            .hostname
            .as_deref()
            .map(|h| format!(" on host {h}"))
            .unwrap_or_default()
    )
}

/// This machine's host name, if it has one.
pub fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

fn node(record: BrokerRecord) -> Node {
    let internal = match (record.internal_host, record.internal_port) {
        (Some(host), Some(port)) => Some((host, port)),
        _ => None,
    };
    Node {
        id: record.node_id,
        host: record.host,
        port: record.port,
        internal,
        by_address: record.by_address,
        listeners: record
            .listeners
            .into_iter()
            .map(|l| crate::ListenerAddress {
                name: l.name,
                host: l.host,
                port: l.port,
                by_address: l.by_address,
            })
            .collect(),
    }
}

/// The addresses advertised on `listener` (host names compared without
/// regard to case, as DNS does) and how many live gateways advertise each.
fn sharing(live: &[Node], listener: &str) -> HashMap<(String, u16), usize> {
    let mut counts = HashMap::new();
    for node in live {
        let (host, port, _) = node.address_on(listener);
        *counts.entry((host.to_ascii_lowercase(), port)).or_insert(0) += 1;
    }
    counts
}

/// Whether an advertised address is shared by two or more live gateways.
fn shared(sharing: &HashMap<(String, u16), usize>, host: &str, port: u16) -> bool {
    sharing
        .get(&(host.to_ascii_lowercase(), port))
        .is_some_and(|n| *n >= 2)
}

/// The broker id of `node` on `listener` as [`present`] gives it, without
/// a copy of the node.
fn presented_id(node: &Node, listener: &str, sharing: &HashMap<(String, u16), usize>) -> i32 {
    let (host, port, by_address) = node.address_on(listener);
    if shared(sharing, host, port) || by_address {
        address_id(host, port)
    } else {
        node.id
    }
}

/// A gateway as clients see it: under the address's id when other live
/// gateways advertise its address, or when it is [`Node::by_address`] (a
/// claimed id — arbitrary, the lowest free one — behind an address it does
/// not listen on): the same after a restart, and the same from the first
/// gateway behind a load balancer as from the third. Otherwise under its
/// own node id.
fn present(node: &Node, sharing: &HashMap<(String, u16), usize>) -> Node {
    if !shared(sharing, &node.host, node.port) && !node.by_address {
        return node.clone();
    }
    Node {
        id: address_id(&node.host, node.port),
        host: node.host.clone(),
        port: node.port,
        internal: None,
        by_address: node.by_address,
        listeners: Vec::new(),
    }
}

/// The broker id of an advertised address (that several gateways share, or
/// of a gateway whose node id was claimed): above [`MAX_NODE_ID`], so it
/// never collides with a configured id, and the same on every gateway and
/// after restarts (a hash of the address).
pub fn address_id(host: &str, port: u16) -> i32 {
    let key = format!("{}:{port}", host.to_ascii_lowercase());
    let hash = weight(0, key.as_bytes());
    (MAX_NODE_ID + 1) + (hash % (MAX_NODE_ID as u64 + 1)) as i32
}

/// A stable 64-bit hash of (node, key): FNV-1a, then a murmur3 finalizer
/// for avalanche. Stable across builds and platforms, so gateways of
/// different versions agree.
fn weight(node_id: i32, key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node_id.to_be_bytes().iter().chain(key) {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: i32) -> Node {
        Node {
            id,
            host: "h".into(),
            port: 9092 + id as u16,
            internal: None,
            by_address: false,
            listeners: Vec::new(),
        }
    }

    #[test]
    fn the_layout_step_waits_for_every_gateway_to_serve_it_for_the_whole_delay() {
        let delay = Duration::from_secs(60);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut ready = None;
        assert!(!layout_step_due(&mut ready, false, at(0), delay));
        assert!(
            !layout_step_due(&mut ready, true, at(1), delay),
            "the delay starts now"
        );
        assert!(!layout_step_due(&mut ready, true, at(60), delay));
        // An older gateway back (it restarted): the count starts again.
        assert!(!layout_step_due(&mut ready, false, at(61), delay));
        assert!(!layout_step_due(&mut ready, true, at(70), delay));
        assert!(!layout_step_due(&mut ready, true, at(129), delay));
        assert!(layout_step_due(&mut ready, true, at(130), delay));
        let mut ready = None;
        assert!(
            layout_step_due(&mut ready, true, at(0), Duration::ZERO),
            "0s: at once"
        );
    }

    fn membership(ids: &[i32]) -> Membership {
        let m = Membership::registered(node(ids[0]));
        m.set_live(ids.iter().map(|&id| node(id)).collect());
        m
    }

    #[test]
    fn every_gateway_computes_the_same_owner() {
        let a = membership(&[1, 2, 3]);
        let b = membership(&[3, 1, 2]);
        for g in 0..100 {
            let group = format!("g{g}");
            assert_eq!(a.group_coordinator(&group).id, b.group_coordinator(&group).id);
        }
    }

    #[test]
    fn ownership_is_balanced_and_moves_only_from_a_dead_node() {
        let three = membership(&[1, 2, 3]);
        let topic = uuid::Uuid::from_u128(42);
        let mut counts = [0usize; 4];
        for p in 0..300 {
            counts[three.partition_leader(&topic, p).id as usize] += 1;
        }
        for (id, count) in counts.iter().enumerate().skip(1) {
            assert!((60..=140).contains(count), "node {id} leads {count} of 300");
        }
        let two = membership(&[1, 3]);
        for p in 0..300 {
            let before = three.partition_leader(&topic, p).id;
            let after = two.partition_leader(&topic, p).id;
            if before != 2 {
                assert_eq!(before, after, "partition {p} moved though its leader lives");
            }
        }
    }

    /// Registered, but with the live set not read yet (Redis failed right
    /// after the registration): this gateway coordinates nothing and leads
    /// nothing, rather than take itself for the only gateway.
    #[test]
    fn a_gateway_that_has_not_read_the_live_set_coordinates_nothing() {
        let m = Membership::new(node(1));
        m.joined.store(true, Ordering::Relaxed);
        m.beat.lock().expect("membership lock").last = Some(Instant::now());
        assert!(!m.can_coordinate());
        assert!(!m.coordinates("g"));
        assert!(m.brokers("").is_empty());
        m.set_live(vec![node(1)]);
        assert!(m.can_coordinate());
        assert!(m.coordinates("g"));
    }

    #[test]
    fn this_gateway_is_always_live() {
        let m = Membership::registered(node(7));
        m.set_live(vec![node(1)]);
        assert_eq!(m.nodes().iter().map(|n| n.id).collect::<Vec<_>>(), vec![1, 7]);
    }
}

#[cfg(test)]
mod shared_address_tests {
    use super::*;

    fn behind_lb(id: i32) -> Node {
        Node {
            id,
            host: "lb".into(),
            port: 9092,
            internal: Some(("10.0.0.1".into(), 7000 + id as u16)),
            by_address: false,
            listeners: Vec::new(),
        }
    }

    #[test]
    fn an_address_several_gateways_advertise_is_one_broker_with_an_id_no_gateway_can_hold() {
        let m = Membership::registered(behind_lb(0));
        m.set_live(vec![behind_lb(0), behind_lb(1), behind_lb(2)]);
        let brokers = m.brokers("");
        assert_eq!(brokers.len(), 1, "{brokers:?}");
        assert_eq!(brokers[0].id, address_id("lb", 9092));
        assert!(brokers[0].id > MAX_NODE_ID);
        assert_eq!(address_id("lb", 9092), address_id("lb", 9092));
        assert_ne!(address_id("lb", 9092), address_id("lb", 9093));
        assert_eq!(
            address_id("LB", 9092),
            address_id("lb", 9092),
            "host names ignore case"
        );
        assert!(m.behind_shared_address(""));
        assert_eq!(m.presented(&behind_lb(2), "").id, brokers[0].id);
    }

    #[test]
    fn gateways_with_their_own_addresses_are_listed_each() {
        let own = |id: i32| Node {
            host: format!("g{id}"),
            ..behind_lb(id)
        };
        let m = Membership::registered(own(0));
        m.set_live(vec![own(0), own(1), behind_lb(2), behind_lb(3)]);
        let ids: Vec<i32> = m.brokers("").iter().map(|b| b.id).collect();
        assert_eq!(ids, vec![0, 1, address_id("lb", 9092)]);
        assert!(!m.behind_shared_address(""));
    }

    #[test]
    fn a_gateway_with_a_claimed_id_behind_another_address_is_listed_under_its_address_id_even_alone() {
        let claimed = |id: i32, port: u16| Node {
            port,
            by_address: true,
            ..behind_lb(id)
        };
        let m = Membership::registered(claimed(3, 9092));
        m.set_live(vec![claimed(3, 9092), claimed(4, 9093)]);
        let ids: Vec<i32> = m.brokers("").iter().map(|b| b.id).collect();
        let mut want = vec![address_id("lb", 9092), address_id("lb", 9093)];
        want.sort_unstable();
        assert_eq!(ids, want, "each under its address, whatever id it claimed");
        assert_eq!(m.my_broker_id(""), address_id("lb", 9092));
    }

    #[test]
    fn no_broker_is_listed_before_this_gateway_has_registered() {
        for id in [UNASSIGNED, 3] {
            let m = Membership::new(Node { id, ..behind_lb(0) });
            assert!(m.brokers("").is_empty(), "{id}");
            assert!(!m.leads(&uuid::Uuid::from_u128(1), 0), "{id}");
        }
    }
}

impl crate::group::Ownership for Membership {
    fn owns(&self, group: &str) -> bool {
        self.coordinates(group)
    }

    fn epoch(&self) -> u64 {
        Membership::epoch(self)
    }
}

#[cfg(test)]
mod listener_tests {
    use super::*;
    use crate::ListenerAddress;

    /// A gateway with an EXTERNAL listener behind a load balancer and an
    /// INTERNAL one of its own.
    fn two_listeners(id: i32) -> Node {
        let listener = |name: &str, host: String, port: u16| ListenerAddress {
            name: name.to_owned(),
            host,
            port,
            by_address: false,
        };
        Node {
            id,
            host: "lb.example.com".into(),
            port: 9093,
            internal: None,
            by_address: false,
            listeners: vec![
                listener("EXTERNAL", "lb.example.com".into(), 9093),
                listener("INTERNAL", format!("10.0.0.{id}"), 9092),
            ],
        }
    }

    #[test]
    fn each_listener_presents_the_gateways_by_its_own_addresses() {
        let m = Membership::registered(two_listeners(1));
        m.set_live(vec![two_listeners(1), two_listeners(2)]);
        let external = m.brokers("EXTERNAL");
        assert_eq!(external.len(), 1, "{external:?}");
        assert_eq!(external[0].id, address_id("lb.example.com", 9093));
        assert!(m.behind_shared_address("EXTERNAL"));
        let internal = m.brokers("INTERNAL");
        let addresses: Vec<(i32, String, u16)> =
            internal.iter().map(|n| (n.id, n.host.clone(), n.port)).collect();
        assert_eq!(
            addresses,
            vec![(1, "10.0.0.1".into(), 9092), (2, "10.0.0.2".into(), 9092)]
        );
        assert!(!m.behind_shared_address("INTERNAL"));
        assert_eq!(m.my_broker_id("INTERNAL"), 1);
        assert_eq!(m.my_broker_id("EXTERNAL"), address_id("lb.example.com", 9093));
        // The first listener for an unnamed or unknown one.
        assert_eq!(m.brokers("").len(), 1);
        assert_eq!(m.brokers("NO_SUCH").len(), 1);
    }
}
