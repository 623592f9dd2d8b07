//! Wake-ups for long-polling fetches.
//!
//! A fetch with nothing to return registers a [`Watch`] on the wake-up
//! channels of its partitions and sleeps until one fires or `max_wait_ms`
//! passes. Appends through this gateway wake it in-process; appends through
//! another gateway reach it through Redis sharded pub/sub (`SPUBLISH` in the
//! append script, `SSUBSCRIBE` here). The script leaves an append
//! unannounced when only the appending gateway listens, which Redis tells
//! from each gateway's presence channel ([`WakeHub::presence`]). A channel
//! is subscribed while someone waits on it and for `linger` after, so a
//! consumer long-polling in a loop does not subscribe and unsubscribe on
//! every fetch. Nothing here polls a partition; in cluster mode the
//! subscriber checks every 2 s that Redis still holds its subscriptions
//! ([`ClusterSubscriber`]).
//!
//! The hub does not care how subscriptions reach Redis; two transports feed
//! it. In single mode, redis-rs offers no `SSUBSCRIBE`, so [`Subscriber`]
//! speaks the few RESP2 frames of pub/sub itself over one dedicated socket.
//! In cluster mode, [`ClusterSubscriber`] uses redis-rs's cluster
//! connection over RESP3: each `SSUBSCRIBE` goes to the node that owns the
//! channel's slot, and messages arrive as push frames. When a slot moves,
//! its node drops the channel (a `sunsubscribe` push): the channel's
//! waiters re-check the log, and the channel is subscribed again where the
//! slot went. An append through another gateway before that is confirmed
//! is announced to no one here, so the waiters re-check once more then
//! (`Channel::lapsed`). A subscription Redis dropped without a push is
//! found by the subscriber's audit and treated the same way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::log::{PartitionOffsets, ReadPartition};
use crate::tail::{Order, TAIL_BATCH_BYTES, Tail};
use crate::wire::Stream;
use tokio::sync::{Notify, mpsc, watch};

/// Largest pub/sub payload accepted from Redis (ours are a few bytes).
const MAX_FRAME_BULK: usize = 64 * 1024;

/// Fans wake-ups out to waiting fetches; cheap to clone.
#[derive(Clone)]
pub struct WakeHub {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    commands: mpsc::UnboundedSender<Command>,
    /// Bumped whenever a subscription is confirmed or lost.
    confirmations: watch::Sender<u64>,
    /// Names this gateway's presence channels (see [`WakeHub::presence`]);
    /// `None` for a hub that subscribes to nothing.
    presence: Option<u64>,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    next_waiter: u64,
    /// The last subscription generation given out, to any channel: a
    /// channel removed and made again never repeats an earlier one.
    generations: u64,
    /// What the channels' tails may hold together (`fetch.tail_cache_bytes`).
    tail_budget: usize,
    /// What they hold.
    tail_bytes: usize,
    /// Every batch they hold, oldest first (see `tail.rs`).
    tail_order: Order,
}

impl State {
    /// Forgets what `channel` knew of its partition (see [`Channel::forget`])
    /// and gives it a new generation, so that what reads and writes begun
    /// before tell of it is ignored.
    fn forget(&mut self, channel: &str) -> Option<&mut Channel> {
        let c = self.channels.get_mut(channel)?;
        self.tail_bytes -= c.forget();
        self.generations += 1;
        c.generation = self.generations;
        Some(c)
    }

    /// Drops kept batches older than [`crate::tail::TAIL_AGE`] from every
    /// tail, and the oldest of the rest until the budget has room for
    /// `need` more bytes.
    fn make_tail_room(&mut self, need: usize, now: Instant) {
        loop {
            let short = self.tail_bytes.saturating_add(need) > self.tail_budget;
            let Some(oldest) = self.tail_order.pop_oldest(now, short) else {
                break;
            };
            if let Some(c) = self.channels.get_mut(&*oldest.channel) {
                self.tail_bytes -= c.tail.pop_front_if(oldest.seq);
            }
        }
    }
}

#[derive(Default)]
struct Channel {
    /// Its name, shared with the entries of its batches in the tails'
    /// [`Order`].
    name: Arc<str>,
    waiters: HashMap<u64, Arc<Waiter>>,
    subscribed: bool,
    idle_since: Option<Instant>,
    /// Moves on (to a number no channel had) at every confirmed or lost
    /// subscription, and when an append of this gateway's begun under an
    /// older one lands (`WakeHub::stored`): what was read or written under
    /// an older one may have missed appends.
    generation: u64,
    /// The partition's offsets as last seen while subscribed.
    known: Option<Known>,
    /// The batches this gateway appended last, while subscribed (`tail.rs`).
    tail: Tail,
    /// Appends through this gateway under way ([`WakeHub::appending`]).
    appending: u32,
    /// An announcement came while one was under way: its waiters are woken
    /// when it ends.
    deferred: bool,
    /// The subscription was lost and not yet confirmed again: an append
    /// through another gateway meanwhile woke no one, so the waiters read
    /// the partition again once it is.
    lapsed: bool,
    /// An append of this gateway's ended without its outcome (see
    /// [`Appending`]): until then, what is known is not trusted, since the
    /// append may still land in Redis, unannounced, after a read.
    doubted_until: Option<Instant>,
}

impl Channel {
    /// What it knows of its partition, unless an append's outcome is in
    /// doubt.
    fn trusted(&self) -> Option<Known> {
        if self.doubted_until.is_some_and(|until| Instant::now() < until) {
            return None;
        }
        self.known
    }

    /// Forgets what it knew of its partition, its offsets and tail; returns
    /// the bytes the tail held.
    fn forget(&mut self) -> usize {
        let held = self.tail.bytes();
        self.tail.clear();
        self.known = None;
        held
    }
}

/// What this gateway knows of a partition while subscribed to its channel.
/// Every append anywhere publishes its new next offset on the channel, so
/// the largest next offset seen since the subscription was confirmed never
/// runs ahead of the log; when it equals a fetch's offset the partition has
/// nothing for that fetch, and Redis need not be asked.
///
/// A read_committed fetch must also report the last stable offset, which
/// announcements do not carry: `stable_at` is the next offset at which a
/// read last saw every transaction decided (last stable offset = high
/// watermark). The last stable offset moves only with an append (a
/// transaction's data or its marker), so while the next offset is still
/// `stable_at` it is still the high watermark.
#[derive(Debug, Clone, Copy, Default)]
struct Known {
    next_offset: i64,
    log_start: Option<i64>,
    stable_at: Option<i64>,
}

impl Known {
    fn saw(&mut self, next_offset: i64, log_start: Option<i64>) {
        self.next_offset = self.next_offset.max(next_offset);
        if let Some(log_start) = log_start {
            self.log_start = Some(self.log_start.map_or(log_start, |l| l.max(log_start)));
        }
    }

    /// A read's last stable offset at its next offset; an older read than
    /// the one `stable_at` came from changes nothing.
    fn saw_stable(&mut self, next_offset: i64, last_stable: i64) {
        if self.stable_at.is_some_and(|at| at > next_offset) {
            return;
        }
        self.stable_at = (last_stable >= next_offset).then_some(next_offset);
    }
}

enum Command {
    Subscribe(String),
}

/// One watch's wake-up signal and what woke it.
#[derive(Default)]
struct Waiter {
    notify: Notify,
    fired: Mutex<Fired>,
}

/// The channels that fired since a watch last looked.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub enum Fired {
    #[default]
    Nothing,
    Channels(Vec<String>),
    /// A wake-up may have been missed (the subscription was lost): re-check all.
    All,
}

impl Fired {
    fn add(&mut self, channel: &str) {
        match self {
            Fired::Nothing => *self = Fired::Channels(vec![channel.to_owned()]),
            Fired::Channels(channels) if !channels.iter().any(|c| c == channel) => {
                channels.push(channel.to_owned())
            }
            _ => {}
        }
    }

    /// Whether `channel` is among those that fired.
    pub fn includes(&self, channel: &str) -> bool {
        match self {
            Fired::Nothing => false,
            Fired::Channels(channels) => channels.iter().any(|c| c == channel),
            Fired::All => true,
        }
    }
}

impl Waiter {
    fn wake(&self, channel: Option<&str>) {
        let mut fired = self.fired.lock().expect("fired lock");
        match channel {
            Some(channel) => fired.add(channel),
            None => *fired = Fired::All,
        }
        drop(fired);
        self.notify.notify_one();
    }
}

/// How long what reads see of a partition is not trusted after an append
/// of this gateway's ended without its outcome: longer than such an append
/// can wait in Redis but for a Redis that is stopped.
const UNTOLD_DOUBT: Duration = Duration::from_secs(30);

/// An append under way ([`WakeHub::appending`]); dropping it ends it.
///
/// An append dropped without [`Appending::stored`] (its reply lost to a
/// timeout or a broken connection, the request dropped at its deadline, or
/// the batch found stored already) may have left a batch in Redis this
/// gateway was never told of, and the script announces an append only to
/// other gateways: what the hub knew of the partition is forgotten and its
/// waiters read again, or a tailing fetch here would be told "nothing new"
/// until the next append.
pub struct Appending<'a> {
    hub: &'a WakeHub,
    name: &'a str,
    /// `None`: nothing deferred (the channel was not subscribed).
    channel: Option<&'a str>,
    keeps_tail: bool,
    /// The subscription's generation when the append began, if subscribed.
    since: Option<u64>,
    /// [`Appending::stored`] told the hub what the append stored.
    told: bool,
}

impl Appending<'_> {
    /// The append is known to have stored nothing (refused by the script):
    /// what was known stands.
    pub fn nothing_stored(mut self) {
        self.told = true;
    }

    /// The append stored its batch: [`WakeHub::stored`] under the
    /// subscription the append began with, and the end of the append.
    #[allow(clippy::too_many_arguments)]
    pub fn stored(
        mut self,
        base: i64,
        next_offset: i64,
        log_start: i64,
        transactional: bool,
        tail: Option<Bytes>,
    ) {
        self.hub.stored(
            self.name,
            self.since,
            base,
            next_offset,
            log_start,
            transactional,
            tail,
        );
        self.told = true;
    }

    /// The channel's subscription generation when the append began (if
    /// it was subscribed): pass it to [`WakeHub::stored`].
    pub fn since(&self) -> Option<u64> {
        self.since
    }

    /// Whether the append should bring its batch to [`WakeHub::stored`]:
    /// fetches were tailing the partition here when it began (its channel
    /// was subscribed), and tails may hold something.
    pub fn keeps_tail(&self) -> bool {
        self.keeps_tail
    }
}

impl Drop for Appending<'_> {
    fn drop(&mut self) {
        if self.told && self.channel.is_none() {
            // Nothing deferred, nothing to forget: the usual append to a
            // partition no fetch tails here takes no lock.
            return;
        }
        let mut state = self.hub.inner.state.lock().expect("wake state lock");
        // Subscribed or about to be (fetches watch it): a read under the
        // subscription could come before the append lands as well.
        let untold = !self.told && state.channels.contains_key(self.name);
        if untold {
            // The append may still land after a read that these waiters
            // make now (a connection replaced, or acks=all's own): what
            // reads see is not trusted for a while either.
            if let Some(c) = state.forget(self.name) {
                c.doubted_until = Some(Instant::now() + UNTOLD_DOUBT);
            }
        }
        let Some(entry) = state.channels.get_mut(self.name) else {
            return;
        };
        if self.channel.is_some() {
            entry.appending = entry.appending.saturating_sub(1);
        }
        let deferred = self.channel.is_some() && entry.appending == 0 && std::mem::take(&mut entry.deferred);
        if untold || deferred {
            let channel = self.name;
            for waiter in entry.waiters.values() {
                waiter.wake(Some(channel));
            }
        }
    }
}

/// A registration on some channels; dropping it unregisters.
pub struct Watch {
    hub: WakeHub,
    id: u64,
    channels: Vec<String>,
    /// Channels not yet subscribed when the watch was made: an append
    /// through another gateway before the subscription is confirmed wakes
    /// no one, so their partitions must be read again once it is.
    unconfirmed: Vec<String>,
    waiter: Arc<Waiter>,
}

impl Watch {
    /// Completes at the next wake-up on any of the channels (or at once if
    /// one fired since the watch was made).
    pub async fn notified(&self) {
        self.waiter.notify.notified().await;
    }

    /// The channels that fired since the last call, so a fetch re-reads only
    /// the partitions that changed.
    pub fn take_fired(&self) -> Fired {
        std::mem::take(&mut *self.waiter.fired.lock().expect("fired lock"))
    }

    /// What may have changed unseen up to now: the channels that fired, and
    /// those that were not subscribed when the watch was made. Call once,
    /// after [`Watch::subscribed`].
    pub fn take_fired_since_start(&self) -> Fired {
        let mut fired = self.take_fired();
        for channel in &self.unconfirmed {
            fired.add(channel);
        }
        fired
    }

    /// Waits until Redis confirmed the subscription of every channel, so an
    /// append on another gateway after this returns is sure to wake us.
    /// Returns false if that did not happen within `timeout` (Redis down):
    /// the caller then relies on in-process wake-ups and its deadline.
    pub async fn subscribed(&self, timeout: Duration) -> bool {
        let mut confirmations = self.hub.inner.confirmations.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.hub.all_subscribed(&self.channels) {
                return true;
            }
            match tokio::time::timeout_at(deadline, confirmations.changed()).await {
                Ok(Ok(())) => continue,
                _ => return self.hub.all_subscribed(&self.channels),
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut state = self.hub.inner.state.lock().expect("wake state lock");
        for name in &self.channels {
            if let Some(channel) = state.channels.get_mut(name) {
                channel.waiters.remove(&self.id);
                if channel.waiters.is_empty() {
                    channel.idle_since = Some(Instant::now());
                }
            }
        }
    }
}

impl WakeHub {
    /// Starts the hub and its subscriber task.
    pub(crate) fn start(
        client: redis::Client,
        tls: crate::connection::Tls,
        linger: Duration,
        connect_timeout: Duration,
    ) -> Self {
        let (hub, rx) = Self::detached(Some(rand::random()));
        let subscriber = Subscriber {
            hub: hub.clone(),
            client,
            tls,
            linger,
            connect_timeout,
        };
        tokio::spawn(subscriber.run(rx));
        hub
    }

    /// Starts the hub with a subscriber for the Redis Cluster `seeds` belong to.
    pub(crate) fn start_cluster(
        seeds: &[&str],
        tls: &crate::connection::Tls,
        linger: Duration,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> crate::Result<Self> {
        let (hub, commands) = Self::detached(Some(rand::random()));
        let (subscriber, pushes, outcomes) =
            ClusterSubscriber::new(hub.clone(), seeds, tls, linger, connect_timeout, response_timeout)?;
        tokio::spawn(subscriber.run(commands, pushes, outcomes));
        Ok(hub)
    }

    /// A hub that only hears of appends made in this process (no Redis
    /// subscription): for storage kept in memory.
    pub fn in_process() -> Self {
        Self::detached(None).0
    }

    /// A hub without its subscriber task, and the commands meant for it.
    fn detached(presence: Option<u64>) -> (Self, mpsc::UnboundedReceiver<Command>) {
        let (commands, rx) = mpsc::unbounded_channel();
        let hub = Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                commands,
                confirmations: watch::Sender::new(0),
                presence,
            }),
        };
        (hub, rx)
    }

    /// This gateway's presence channel for `channel`: its subscriber holds
    /// it exactly while it holds `channel` (subscribed after it, in the
    /// same command where it can be, and unsubscribed before it; the same
    /// slot, so the same node and connection). The append script counts
    /// both channels' subscribers in Redis and announces an append only
    /// when someone other than the appending gateway listens: that gateway
    /// wakes its own fetches itself ([`WakeHub::stored`]). Redis, not this
    /// gateway's belief, says whether its subscription is alive, so a
    /// subscription dropped unnoticed costs an announcement, never a
    /// missed one. `None` for a hub that subscribes to nothing.
    pub fn presence(&self, channel: &str) -> Option<String> {
        self.inner.presence.map(|id| presence_channel(channel, id))
    }

    /// Registers interest in `channels`.
    pub fn watch(&self, channels: Vec<String>) -> Watch {
        let waiter = Arc::new(Waiter::default());
        let mut state = self.inner.state.lock().expect("wake state lock");
        let id = state.next_waiter;
        state.next_waiter += 1;
        let mut unconfirmed = Vec::new();
        for name in &channels {
            let channel = state.channels.entry(name.clone()).or_insert_with(|| {
                let _ = self.inner.commands.send(Command::Subscribe(name.clone()));
                Channel {
                    name: Arc::from(name.as_str()),
                    ..Channel::default()
                }
            });
            channel.waiters.insert(id, waiter.clone());
            channel.idle_since = None;
            if !channel.subscribed {
                unconfirmed.push(name.clone());
            }
        }
        drop(state);
        Watch {
            hub: self.clone(),
            id,
            channels,
            unconfirmed,
            waiter,
        }
    }

    /// Redis announced on `channel` that an append made the partition's
    /// next offset `next_offset` (and its log start `log_start`, when
    /// known), or that the log start moved: remember it, wake the watches.
    pub fn appended(&self, channel: &str, next_offset: Option<i64>, log_start: Option<i64>) {
        self.learned(channel, None, next_offset, log_start)
    }

    /// This gateway's own write to the partition (a transaction marker,
    /// DeleteRecords), sent when the channel's subscription generation was
    /// `since` ([`WakeHub::generation`], taken before sending; `None`: not
    /// subscribed), made the next offset `next_offset` and the log start
    /// `log_start`: as [`WakeHub::appended`], but the offsets are kept only
    /// under that same subscription. A write that ran in Redis before the
    /// subscription was live, or while it lapsed, may have followed appends
    /// through other gateways that were announced to no one here: kept, its
    /// offsets would hide them ([`WakeHub::known_empty_at`]). (These writes
    /// are announced on the channel like any other gateway's, so what was
    /// known before them can stay; an append is not, see
    /// [`WakeHub::stored`].)
    pub fn wrote(&self, channel: &str, since: Option<u64>, next_offset: Option<i64>, log_start: Option<i64>) {
        self.learned(channel, Some(since), next_offset, log_start)
    }

    /// `since`: `None` for an announcement (it came through the
    /// subscription), `Some` for this gateway's own write.
    fn learned(
        &self,
        channel: &str,
        since: Option<Option<u64>>,
        next_offset: Option<i64>,
        log_start: Option<i64>,
    ) {
        let mut state = self.inner.state.lock().expect("wake state lock");
        if let Some(entry) = state.channels.get_mut(channel) {
            let current = entry.subscribed && since.is_none_or(|since| since == Some(entry.generation));
            match (next_offset, &mut entry.known) {
                _ if !current => {}
                (Some(next_offset), known) => known
                    .get_or_insert_with(Known::default)
                    .saw(next_offset, log_start),
                // The log start alone (this gateway's DeleteRecords): what
                // is known of the next offset stays.
                (None, Some(known)) => known.saw(known.next_offset, log_start),
                (None, None) => {}
            }
            if entry.appending > 0 {
                // Most likely this gateway's own append, announced back
                // before its reply came: its waiters wake when it ends,
                // and then find its batch in the tail.
                entry.deferred = true;
                return;
            }
            for waiter in entry.waiters.values() {
                waiter.wake(Some(channel));
            }
        }
    }

    /// An append through this gateway to `channel`'s partition begins; it
    /// ends when the guard drops. Meanwhile, announcements on the channel
    /// (the append's own among them) wake no one until it ends: a fetch
    /// woken by its own announcement would read Redis for the batch that
    /// [`WakeHub::stored`] is about to keep in the tail.
    pub fn appending<'a>(&'a self, channel: &'a str) -> Appending<'a> {
        let mut state = self.inner.state.lock().expect("wake state lock");
        let keeps_tail = state.tail_budget > 0;
        let Some(entry) = state.channels.get_mut(channel).filter(|c| c.subscribed) else {
            return Appending {
                hub: self,
                name: channel,
                channel: None,
                keeps_tail: false,
                since: None,
                told: false,
            };
        };
        entry.appending += 1;
        Appending {
            hub: self,
            name: channel,
            channel: Some(channel),
            keeps_tail,
            since: Some(entry.generation),
            told: false,
        }
    }

    /// Sets what the channels' tails may hold together (0: keep none).
    pub fn set_tail_budget(&self, bytes: usize) {
        self.inner.state.lock().expect("wake state lock").tail_budget = bytes;
    }

    /// This gateway stored a batch at `base` and the partition's next offset
    /// is now `next_offset`, by an append begun under the subscription
    /// generation `since` ([`Appending::since`]): as [`WakeHub::wrote`]
    /// (except that under another subscription what was known is forgotten
    /// too: an append is not announced back to the gateway that made it), and
    /// - a batch that is not transactional, stored where a read last saw
    ///   every transaction decided, leaves them all decided: the partition
    ///   is known stable at `next_offset`;
    /// - `tail`, the batch with its offsets patched in (see `tail.rs`),
    ///   joins the partition's tail. Pass it only for a batch that is not
    ///   transactional: a transactional one passes `None`, which starts the
    ///   tail's run again after it.
    #[allow(clippy::too_many_arguments)]
    pub fn stored(
        &self,
        channel: &str,
        since: Option<u64>,
        base: i64,
        next_offset: i64,
        log_start: i64,
        transactional: bool,
        tail: Option<Bytes>,
    ) {
        let now = Instant::now();
        let mut guard = self.inner.state.lock().expect("wake state lock");
        let state = &mut *guard;
        // What the append saw is kept only under the subscription it began
        // with (see `wrote`): an append through another gateway before that
        // subscription was live would hide behind its offsets.
        let current = |c: &Channel| c.subscribed && since == Some(c.generation);
        let subscribed = state.channels.get(channel).is_some_and(current);
        // A batch the tail keeps: room for it is made first, the oldest
        // batches anywhere giving way.
        let keep = tail.filter(|b| subscribed && b.len() <= TAIL_BATCH_BYTES.min(state.tail_budget));
        state.make_tail_room(keep.as_ref().map_or(0, Bytes::len), now);
        if !subscribed && state.channels.get(channel).is_some_and(|c| c.subscribed) {
            // Begun under another subscription: its own offsets may hide
            // an append through another gateway before this one was live,
            // and no one announced this append here (the script announces
            // an append only to other gateways), so what a read already
            // under way saw before it would hide it too. Forgotten, and
            // only a read started from now tells the offsets again.
            state.forget(channel);
        }
        let Some(entry) = state.channels.get_mut(channel) else {
            return;
        };
        if subscribed {
            let known = entry.known.get_or_insert_with(Known::default);
            known.saw(next_offset, Some(log_start));
            if !transactional && known.stable_at == Some(base) {
                known.stable_at = Some(next_offset);
            }
            let grew = match keep {
                Some(batch) => {
                    let seq = state.tail_order.keep(entry.name.clone(), now);
                    entry.tail.push(base, next_offset - 1, batch, seq)
                }
                None => {
                    let held = entry.tail.bytes() as isize;
                    entry.tail.clear();
                    -held
                }
            };
            state.tail_bytes = state.tail_bytes.saturating_add_signed(grew);
        }
        entry.deferred = false;
        for waiter in entry.waiters.values() {
            waiter.wake(Some(channel));
        }
    }

    /// What a read of `channel`'s partition from `offset` would return, from
    /// its tail (see `tail.rs`), up to `max_bytes` (the batch that crosses
    /// it included): `None` when the tail does not hold `offset`, when
    /// `offset` is below the log start, or, for a read_committed fetch
    /// (`decided`), when the batch there does not lie wholly below what is
    /// known to be stable. The offsets are what the hub knows: the high
    /// watermark never ahead of the log, possibly behind it.
    pub fn read_tail(
        &self,
        channel: &str,
        offset: i64,
        max_bytes: usize,
        decided: bool,
    ) -> Option<ReadPartition> {
        let state = self.inner.state.lock().expect("wake state lock");
        let entry = state.channels.get(channel).filter(|c| c.subscribed)?;
        let known = entry.trusted()?;
        let log_start = known.log_start.filter(|&start| offset >= start)?;
        let stable = known.stable_at.filter(|&at| at <= known.next_offset);
        let end = if decided { stable? } else { i64::MAX };
        let batches = entry.tail.read(offset, end, max_bytes)?;
        Some(ReadPartition {
            offsets: Some(PartitionOffsets {
                last_stable_offset: stable.unwrap_or(known.next_offset),
                ..PartitionOffsets::plain(log_start, log_start, known.next_offset)
            }),
            batches,
        })
    }

    /// The subscription generation of `channel`, if it is subscribed: pass
    /// it to [`WakeHub::observe`] with what a read started now returns.
    pub fn generation(&self, channel: &str) -> Option<u64> {
        let state = self.inner.state.lock().expect("wake state lock");
        state
            .channels
            .get(channel)
            .filter(|c| c.subscribed)
            .map(|c| c.generation)
    }

    /// Records offsets read from Redis by a read that started under
    /// `generation`; ignored if the generation moved on since (the
    /// subscription lapsed or was confirmed again, or an append begun under
    /// an older one landed).
    pub fn observe(
        &self,
        channel: &str,
        generation: u64,
        next_offset: i64,
        log_start: i64,
        last_stable: i64,
    ) {
        let mut state = self.inner.state.lock().expect("wake state lock");
        if let Some(entry) = state.channels.get_mut(channel)
            && entry.subscribed
            && entry.generation == generation
        {
            let known = entry.known.get_or_insert_with(Known::default);
            known.saw(next_offset, Some(log_start));
            known.saw_stable(next_offset, last_stable);
        }
    }

    /// The partition's next offset as far as this gateway knows (its own
    /// appends, others' announcements and its reads, while subscribed):
    /// never ahead of the log, possibly behind it.
    pub fn known_next(&self, channel: &str) -> Option<i64> {
        let state = self.inner.state.lock().expect("wake state lock");
        Some(
            state
                .channels
                .get(channel)
                .filter(|c| c.subscribed)?
                .trusted()?
                .next_offset,
        )
    }

    /// The partition's log start offset when it is known to hold nothing at
    /// or after `offset` (its next offset is `offset`) and, with
    /// `decided`, to have no undecided transaction either (its last stable
    /// offset is `offset` too).
    pub fn known_empty_at(&self, channel: &str, offset: i64, decided: bool) -> Option<i64> {
        let state = self.inner.state.lock().expect("wake state lock");
        let known = state.channels.get(channel).filter(|c| c.subscribed)?.trusted()?;
        (known.next_offset == offset && (!decided || known.stable_at == Some(offset)))
            .then_some(known.log_start)
            .flatten()
    }

    fn all_subscribed(&self, channels: &[String]) -> bool {
        let state = self.inner.state.lock().expect("wake state lock");
        channels
            .iter()
            .all(|c| state.channels.get(c).is_some_and(|c| c.subscribed))
    }

    /// Redis confirmed the subscription of `channel`. If it had been lost,
    /// its waiters read the partition again: they went back to sleep after
    /// the loss, and an append through another gateway before now was
    /// announced to no one here.
    ///
    /// A channel already subscribed may be confirmed again: in cluster mode
    /// by the command's answer and its push, but also when redis-rs
    /// subscribed again on its own after it replaced a node's connection,
    /// which it may do without a `Disconnection` push; the two cannot be
    /// told apart, so a repeated confirmation counts as a lapse too.
    fn confirmed(&self, channel: &str) {
        let mut state = self.inner.state.lock().expect("wake state lock");
        if let Some(c) = state.forget(channel) {
            let again = std::mem::replace(&mut c.subscribed, true);
            if std::mem::take(&mut c.lapsed) || again {
                for waiter in c.waiters.values() {
                    waiter.wake(Some(channel));
                }
            }
        }
        drop(state);
        self.inner.confirmations.send_modify(|n| *n += 1);
    }

    /// Redis dropped one channel's subscription (its slot moved): its
    /// waiters re-check the log in case they missed a wake-up.
    fn subscription_lost(&self, channel: &str) {
        let mut state = self.inner.state.lock().expect("wake state lock");
        if let Some(c) = state.forget(channel) {
            c.subscribed = false;
            c.lapsed = true;
            for waiter in c.waiters.values() {
                waiter.wake(None);
            }
        }
        drop(state);
        self.inner.confirmations.send_modify(|n| *n += 1);
    }

    /// After the subscriber lost its connection: nothing is subscribed, and
    /// every waiter re-checks the log in case it missed a wake-up.
    fn connection_lost(&self) {
        let mut state = self.inner.state.lock().expect("wake state lock");
        state.tail_bytes = 0;
        state.tail_order.clear();
        for channel in state.channels.values_mut() {
            channel.subscribed = false;
            channel.lapsed = true;
            channel.forget();
            for waiter in channel.waiters.values() {
                waiter.wake(None);
            }
        }
        drop(state);
        self.inner.confirmations.send_modify(|n| *n += 1);
    }

    /// Channels idle for longer than `linger`, removed from the state;
    /// kept batches past their age dropped.
    fn take_idle(&self, linger: Duration) -> Vec<String> {
        let mut state = self.inner.state.lock().expect("wake state lock");
        state.make_tail_room(0, Instant::now());
        let idle: Vec<String> = state
            .channels
            .iter()
            .filter(|(_, c)| c.waiters.is_empty() && c.idle_since.is_some_and(|t| t.elapsed() >= linger))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &idle {
            state.forget(name);
            state.channels.remove(name);
        }
        idle
    }

    /// The channels subscribed, with their generations.
    fn subscribed_channels(&self) -> Vec<(String, u64)> {
        let state = self.inner.state.lock().expect("wake state lock");
        state
            .channels
            .iter()
            .filter(|(_, c)| c.subscribed)
            .map(|(name, c)| (name.clone(), c.generation))
            .collect()
    }

    fn channel_names(&self) -> Vec<String> {
        self.inner
            .state
            .lock()
            .expect("wake state lock")
            .channels
            .keys()
            .cloned()
            .collect()
    }

    fn is_wanted(&self, channel: &str) -> bool {
        self.inner
            .state
            .lock()
            .expect("wake state lock")
            .channels
            .contains_key(channel)
    }
}

/// The task that holds the pub/sub connection.
struct Subscriber {
    hub: WakeHub,
    client: redis::Client,
    tls: crate::connection::Tls,
    linger: Duration,
    connect_timeout: Duration,
}

/// A pub/sub frame from Redis.
#[derive(Debug)]
enum Frame {
    Confirm {
        kind: Vec<u8>,
        channel: String,
    },
    Message {
        channel: String,
        /// The partition's next offset and log start, where the message
        /// gives them (see [`announcement`]).
        announced: (Option<i64>, Option<i64>),
    },
    Error(String),
    Other,
}

/// How often the single-mode subscriber's connection is asked a PING.
const SUBSCRIBER_PING_EVERY: Duration = Duration::from_secs(5);
/// How long that connection may stay silent (PINGs unanswered) before it
/// is taken for lost and opened again.
const SUBSCRIBER_SILENCE: Duration = Duration::from_secs(12);

impl Subscriber {
    async fn run(self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let served = match self.connect().await {
                Ok(stream) => {
                    backoff = Duration::from_millis(50);
                    if let Err(e) = self.serve(stream, &mut commands).await {
                        tracing::warn!(error = %e, "wake-up subscription connection lost");
                    }
                    true
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot open wake-up subscription connection");
                    false
                }
            };
            if commands.is_closed() {
                return;
            }
            if served {
                lost("connection");
            }
            self.hub.connection_lost();
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    async fn connect(&self) -> std::io::Result<Box<dyn Stream>> {
        crate::wire::open(self.client.get_connection_info(), &self.tls, self.connect_timeout).await
    }

    async fn serve(
        &self,
        stream: Box<dyn Stream>,
        commands: &mut mpsc::UnboundedReceiver<Command>,
    ) -> std::io::Result<()> {
        let (read, mut write) = tokio::io::split(stream);
        let (frames_tx, mut frames) = mpsc::channel(1024);
        let reader = tokio::spawn(async move {
            let mut read = BufReader::new(read);
            loop {
                let frame = read_frame(&mut read).await;
                let failed = frame.is_err();
                if frames_tx.send(frame).await.is_err() || failed {
                    return;
                }
            }
        });
        let _abort_reader = AbortOnDrop(reader);
        // Queued commands are superseded by the full resubscription below.
        while commands.try_recv().is_ok() {}
        for channel in self.hub.channel_names() {
            write.write_all(&self.subscribe(&channel)).await?;
        }
        let mut sweep = tokio::time::interval((self.linger / 2).max(Duration::from_millis(100)));
        // A connection that went dead without a reset (a NAT or load
        // balancer dropping an idle flow) shows nothing to a reader, and a
        // quiet subscription writes nothing: a PING now and then, whose
        // answer must come, finds it out. Until then its channels would
        // count as subscribed, and fetches here would trust announcements
        // that no longer come.
        let mut ping = tokio::time::interval(SUBSCRIBER_PING_EVERY);
        let mut heard = tokio::time::Instant::now();
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Subscribe(channel)) => {
                        if self.hub.is_wanted(&channel) {
                            write.write_all(&self.subscribe(&channel)).await?;
                        }
                    }
                    None => return Ok(()),
                },
                frame = frames.recv() => match frame {
                    Some(Ok(frame)) => {
                        heard = tokio::time::Instant::now();
                        self.handle(frame);
                    }
                    Some(Err(e)) => return Err(e),
                    None => return Err(std::io::Error::other("reader stopped")),
                },
                _ = ping.tick() => {
                    if heard.elapsed() > SUBSCRIBER_SILENCE {
                        return Err(std::io::Error::other(format!(
                            "no answer for {:?} (a PING unanswered)",
                            heard.elapsed()
                        )));
                    }
                    write.write_all(&encode(&["PING"])).await?;
                }
                _ = sweep.tick() => {
                    for channel in self.hub.take_idle(self.linger) {
                        let mut unsubscribe = vec!["SUNSUBSCRIBE"];
                        let presence = self.hub.presence(&channel);
                        unsubscribe.extend(presence.as_deref());
                        unsubscribe.push(&channel);
                        write.write_all(&encode(&unsubscribe)).await?;
                    }
                }
            }
        }
    }

    /// `SSUBSCRIBE` of `channel` and then its presence channel, in one
    /// command (one slot: Redis takes both before serving anyone else).
    fn subscribe(&self, channel: &str) -> Vec<u8> {
        let presence = self.hub.presence(channel);
        let mut args = vec!["SSUBSCRIBE", channel];
        args.extend(presence.as_deref());
        encode(&args)
    }

    fn handle(&self, frame: Frame) {
        match frame {
            Frame::Message {
                channel,
                announced: (next_offset, log_start),
            } => self.hub.appended(&channel, next_offset, log_start),
            Frame::Confirm { kind, channel } => {
                if kind.eq_ignore_ascii_case(b"ssubscribe") {
                    self.hub.confirmed(&channel);
                }
            }
            Frame::Error(e) => tracing::warn!(error = %e, "redis refused a wake-up subscription"),
            Frame::Other => {}
        }
    }
}

/// How often the cluster subscriber asks Redis whether it still holds what
/// it believes it holds (see [`ClusterSubscriber`]).
const AUDIT_EVERY: Duration = Duration::from_secs(2);

/// The most presence channels one `PUBSUB SHARDNUMSUB` of an audit names.
const AUDIT_CHUNK: usize = 1000;

/// Of `checks` (channel, presence channel, generation), the channels whose
/// presence channel Redis does not hold, or whose master did not answer
/// within `limit`, with their generations. The slot map is read first
/// (`CLUSTER SLOTS`), and each master is asked about all of its channels
/// together (`PUBSUB SHARDNUMSUB` takes channels of any slots and answers
/// for the node asked: one a node does not serve is 0 there, and its
/// subscription is made again where it is served); when the map cannot be
/// read, each channel is asked of its own slot's master.
async fn audited(
    mut conn: redis::cluster_async::ClusterConnection,
    checks: Vec<(String, String, u64)>,
    limit: Duration,
) -> Vec<(String, u64)> {
    let slots = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
    let read = tokio::time::timeout(limit, slots.query_async::<redis::Value>(&mut conn)).await;
    let ranges = match read {
        Ok(Ok(reply)) => crate::connection::parse_cluster_slots(reply).unwrap_or_default(),
        _ => Vec::new(),
    };
    let master = |presence: &str| {
        let slot = crate::durable::slot_of(presence);
        ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, master)| master.clone())
    };
    let mut groups: Vec<Vec<(String, String, u64)>> = Vec::new();
    let mut by_master: HashMap<String, usize> = HashMap::new();
    for check in checks {
        match master(&check.1) {
            Some(master) => match by_master.get(&master) {
                Some(&at) if groups[at].len() < AUDIT_CHUNK => groups[at].push(check),
                _ => {
                    by_master.insert(master, groups.len());
                    groups.push(vec![check]);
                }
            },
            None => groups.push(vec![check]),
        }
    }
    let asks = groups.into_iter().map(|group| {
        let mut conn = conn.clone();
        async move {
            // Asked of the master the connection's map names for the first
            // channel's slot, made current first: a stale map (a failover it
            // has not seen) would ask the old master, now a replica, where
            // the subscriptions may be held and appends never announced.
            let first = group[0].1.clone();
            at_the_master(&mut conn, &first).await;
            let route = redis::cluster_routing::Route::new(
                crate::durable::slot_of(&first),
                redis::cluster_routing::SlotAddr::Master,
            );
            let mut cmd = redis::cmd("PUBSUB");
            cmd.arg("SHARDNUMSUB");
            for (_, presence, _) in &group {
                cmd.arg(presence);
            }
            let asked = conn.route_command(
                cmd,
                redis::cluster_routing::RoutingInfo::SingleNode(
                    redis::cluster_routing::SingleNodeRoutingInfo::SpecificNode(route),
                ),
            );
            let held = match tokio::time::timeout(limit, asked).await {
                Ok(Ok(value)) => subscriber_counts(value),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, channels = group.len(), "cannot check wake-up subscriptions");
                    HashMap::new()
                }
                Err(_) => {
                    tracing::debug!(channels = group.len(), "checking wake-up subscriptions timed out");
                    HashMap::new()
                }
            };
            group
                .into_iter()
                .filter(|(_, presence, _)| held.get(presence).is_none_or(|n| *n <= 0))
                .map(|(channel, _, generation)| (channel, generation))
                .collect::<Vec<_>>()
        }
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Makes the cluster subscriber's connection (starting from the seeds and
/// the nodes given), the receiver of its pushes and its slot map watch.
/// Makes `conn`'s slot map name the current master of `channel`'s slot: a
/// keyed command (`EXISTS` of the channel's name, which no key has) sent to
/// the master the map names is answered MOVED by a node that is not (an
/// old master that came back as a replica after a failover), and redis-rs
/// then reads the slot map again. Shard channels carry no such answer:
/// Redis serves `SSUBSCRIBE` and `PUBSUB SHARDNUMSUB` on replicas too. Its
/// outcome does not matter; the command that follows tells.
async fn at_the_master(conn: &mut redis::cluster_async::ClusterConnection, channel: &str) {
    let route = redis::cluster_routing::Route::new(
        crate::durable::slot_of(channel),
        redis::cluster_routing::SlotAddr::Master,
    );
    let mut cmd = redis::cmd("EXISTS");
    cmd.arg(channel);
    let _ = conn
        .route_command(
            cmd,
            redis::cluster_routing::RoutingInfo::SingleNode(
                redis::cluster_routing::SingleNodeRoutingInfo::SpecificNode(route),
            ),
        )
        .await;
}

type Connect = Box<
    dyn Fn(
            &[String],
        ) -> crate::Result<(
            redis::cluster_async::ClusterConnection,
            mpsc::UnboundedReceiver<redis::PushInfo>,
            Arc<crate::connection::SlotMapWatch>,
        )> + Send,
>;

/// How subscribing one channel went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    Subscribed,
    Failed,
    /// No answer within the response timeout: its node may have stopped
    /// answering, and the connection's slot map may be stale.
    TimedOut,
}

/// What a task the cluster subscriber started found; `epoch` names the
/// connection it used ([`ClusterSubscriber::epoch`]).
enum Outcome {
    /// Which channels it subscribed (both the channel and its presence
    /// channel) and which it could not.
    Subscribed {
        epoch: u64,
        results: Vec<(String, Attempt)>,
    },
    /// The channels, with the generation they had when the audit began,
    /// whose presence channel Redis does not hold (or whose node did not
    /// answer).
    Audited { epoch: u64, lost: Vec<(String, u64)> },
    /// It unsubscribed these channels (or gave up).
    Unsubscribed { epoch: u64, channels: Vec<String> },
    /// After a subscription timed out: the connection's slot map is stale,
    /// and these are the masters of the cluster's; `None` when it is not
    /// (or it cannot be told).
    Checked {
        epoch: u64,
        masters: Option<Vec<String>>,
    },
}

/// The task that subscribes through a Redis Cluster connection.
///
/// Every command to Redis runs in a task of its own, bounded by the
/// response timeout, and reports back as an [`Outcome`]: a node that stops
/// answering (frozen, or cut off without its connection closing) delays no
/// other node's messages.
///
/// Every [`AUDIT_EVERY`] it asks each subscribed channel's master how many
/// subscribers the channel's presence channel has (`PUBSUB SHARDNUMSUB`:
/// it reads the slot map, then asks each master about all of its channels
/// in one command, which takes channels of any slots and answers for the
/// node asked; [`audited`]). Only this gateway subscribes to its presence
/// channels, and only alongside the channel, so 0 means Redis no longer
/// holds the subscription, though no push said so. That happens when
/// redis-rs replaces a node's connection without a `Disconnection` push
/// (its own resubscription sends all of a node's shard channels in one
/// `SSUBSCRIBE`, which Redis refuses when they span slots), and when a
/// master stops answering without closing its connections and its replica
/// takes its slots. The lost channel's waiters re-check the log and it is
/// subscribed again.
///
/// A subscription that gets no answer within the timeout means its node
/// stopped answering. If the cluster has failed it over (its slot map
/// changed, and the masters that took slots answer), the connection's own
/// map is stale (redis-rs
/// reads it again only after a redirection, which such a node never
/// gives): the subscriber makes a new connection, which reads the map
/// afresh, and subscribes everything again through it, at most once per
/// [`RECONNECT_EVERY`] ([`ClusterSubscriber::check`]).
///
/// Commands for one channel never overlap: a channel wanted again while
/// its unsubscription is under way is subscribed when that ends, and one
/// Redis dropped while its subscription was under way is subscribed again
/// when that ends instead of being confirmed.
struct ClusterSubscriber {
    hub: WakeHub,
    conn: redis::cluster_async::ClusterConnection,
    /// Reads the slot map and asks the masters whether they answer.
    watch: Arc<crate::connection::SlotMapWatch>,
    /// A check after a timed-out subscription is under way.
    checking: bool,
    connect: Connect,
    /// Moves on with every new connection: what tasks of an older one
    /// report is ignored (its pushes go to a receiver dropped with it).
    epoch: u64,
    linger: Duration,
    response_timeout: Duration,
    outcomes: mpsc::UnboundedSender<Outcome>,
    /// Channels being subscribed by a task.
    pending: std::collections::HashSet<String>,
    /// Channels to subscribe again at the next sweep: after a failed
    /// `SSUBSCRIBE` (the node was down, the slot moving) or a lost
    /// connection.
    retry: Vec<String>,
    auditing: bool,
    /// Channels being unsubscribed by a task: one wanted again meanwhile
    /// is subscribed once that ends, so that Redis never sees the two
    /// tasks' commands interleaved (it could be left holding the presence
    /// channel without the channel, which no audit would see).
    unsubscribing: std::collections::HashSet<String>,
    /// Channels being subscribed whose subscription Redis dropped (or
    /// whose node connection was lost) meanwhile: subscribed again when
    /// the task ends, not confirmed.
    dropped: std::collections::HashSet<String>,
    /// When the connection was last made again: at most once per
    /// [`RECONNECT_EVERY`].
    reconnected: Option<Instant>,
}

/// The least time between two new connections of the cluster subscriber.
const RECONNECT_EVERY: Duration = Duration::from_secs(10);

impl ClusterSubscriber {
    /// A subscriber on `hub` for the cluster `seeds` belong to, its
    /// connection's pushes and what its tasks will report.
    fn new(
        hub: WakeHub,
        seeds: &[&str],
        tls: &crate::connection::Tls,
        linger: Duration,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> crate::Result<(
        Self,
        mpsc::UnboundedReceiver<redis::PushInfo>,
        mpsc::UnboundedReceiver<Outcome>,
    )> {
        let (seeds, tls): (Vec<String>, _) = (seeds.iter().map(|s| (*s).to_owned()).collect(), tls.clone());
        let connect: Connect = Box::new(move |also: &[String]| {
            let (pushes_tx, pushes) = mpsc::unbounded_channel();
            let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
            let conn = crate::connection::Conn::cluster(
                &seeds,
                &tls,
                connect_timeout,
                response_timeout,
                Some(pushes_tx),
                also,
            )?;
            let crate::connection::Conn::Cluster(watch) = conn else {
                unreachable!("Conn::cluster makes a cluster connection");
            };
            Ok((watch.current(), pushes, watch))
        });
        let (conn, pushes, watch) = connect(&[])?;
        let (outcomes_tx, outcomes) = mpsc::unbounded_channel();
        let subscriber = Self {
            hub,
            conn,
            watch,
            checking: false,
            connect,
            epoch: 0,
            linger,
            response_timeout,
            outcomes: outcomes_tx,
            pending: Default::default(),
            retry: Vec::new(),
            auditing: false,
            unsubscribing: Default::default(),
            dropped: Default::default(),
            reconnected: None,
        };
        Ok((subscriber, pushes, outcomes))
    }

    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
        mut outcomes: mpsc::UnboundedReceiver<Outcome>,
    ) {
        let mut sweep = tokio::time::interval(
            (self.linger / 2).clamp(Duration::from_millis(100), Duration::from_secs(1)),
        );
        let mut audit = tokio::time::interval(AUDIT_EVERY);
        audit.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Subscribe(channel)) => self.subscribe(vec![channel]),
                    None => return,
                },
                push = pushes.recv() => match push {
                    Some(push) => {
                        // Subscribe again at once where Redis dropped a
                        // subscription (its slot moved: the node that took
                        // it is up), after the pushes already here (Redis
                        // drops all of a slot's channels, presence channels
                        // among them, at once). What fails, and what a lost
                        // connection dropped, waits for the sweep.
                        let mut dropped: Vec<String> = self.handle(push).into_iter().collect();
                        while let Ok(push) = pushes.try_recv() {
                            dropped.extend(self.handle(push));
                        }
                        self.subscribe(dropped);
                    }
                    None => return,
                },
                Some(outcome) = outcomes.recv() => {
                    if let Some(fresh) = self.apply(outcome) {
                        pushes = fresh;
                    }
                }
                _ = sweep.tick() => {
                    let retry = std::mem::take(&mut self.retry);
                    self.subscribe(retry);
                    self.unsubscribe(self.hub.take_idle(self.linger));
                }
                _ = audit.tick() => self.audit(),
            }
        }
    }

    /// What a task of this subscriber needs: its connection, the time
    /// limit of each command, the connection's epoch and where to report.
    fn for_task(
        &self,
    ) -> (
        redis::cluster_async::ClusterConnection,
        Duration,
        u64,
        mpsc::UnboundedSender<Outcome>,
    ) {
        (
            self.conn.clone(),
            self.response_timeout,
            self.epoch,
            self.outcomes.clone(),
        )
    }

    /// Subscribes `channels` (each wanted, not already under way) in a task.
    fn subscribe(&mut self, channels: Vec<String>) {
        let channels: Vec<(String, Option<String>)> = channels
            .into_iter()
            .filter(|c| {
                self.hub.is_wanted(c)
                    && !self.retry.contains(c)
                    && !self.unsubscribing.contains(c)
                    && self.pending.insert(c.clone())
            })
            .map(|c| {
                let presence = self.hub.presence(&c);
                (c, presence)
            })
            .collect();
        if channels.is_empty() {
            return;
        }
        let (conn, limit, epoch, outcomes) = self.for_task();
        tokio::spawn(async move {
            let attempts = channels.into_iter().map(|(channel, presence)| {
                let mut conn = conn.clone();
                async move {
                    let subscribed = tokio::time::timeout(limit, async {
                        // Redis serves a shard channel on a replica too, where
                        // appends are never announced: make sure this
                        // connection's slot map names the master first.
                        at_the_master(&mut conn, &channel).await;
                        conn.ssubscribe(&channel).await?;
                        match &presence {
                            Some(presence) => conn.ssubscribe(presence).await,
                            None => Ok(()),
                        }
                    })
                    .await;
                    let attempt = match subscribed {
                        Ok(Ok(())) => Attempt::Subscribed,
                        Ok(Err(e)) if e.is_timeout() => {
                            tracing::debug!(error = %e, channel, "wake-up subscription timed out; will retry");
                            Attempt::TimedOut
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, channel, "wake-up subscription failed; will retry");
                            Attempt::Failed
                        }
                        Err(_) => {
                            tracing::debug!(channel, "wake-up subscription timed out; will retry");
                            Attempt::TimedOut
                        }
                    };
                    (channel, attempt)
                }
            });
            let results = futures::future::join_all(attempts).await;
            let _ = outcomes.send(Outcome::Subscribed { epoch, results });
        });
    }

    /// Unsubscribes `channels`, no longer wanted, in a task. One wanted
    /// again meanwhile is subscribed again when Redis tells it dropped it.
    fn unsubscribe(&mut self, channels: Vec<String>) {
        // One being subscribed is unsubscribed when that ends (it is not
        // wanted then).
        let channels: Vec<String> = channels
            .into_iter()
            .filter(|c| !self.pending.contains(c) && self.unsubscribing.insert(c.clone()))
            .collect();
        if channels.is_empty() {
            return;
        }
        let done = Outcome::Unsubscribed {
            epoch: self.epoch,
            channels: channels.clone(),
        };
        let outcomes = self.outcomes.clone();
        let idle: Vec<(String, Option<String>)> = channels
            .into_iter()
            .map(|c| {
                let presence = self.hub.presence(&c);
                (c, presence)
            })
            .collect();
        let (conn, limit) = (self.conn.clone(), self.response_timeout);
        tokio::spawn(async move {
            let each = idle.into_iter().map(|(channel, presence)| {
                let mut conn = conn.clone();
                async move {
                    let _ = tokio::time::timeout(limit, async {
                        // The presence channel first: Redis must never see
                        // it held without the channel. If that fails both
                        // stay: messages on a channel no one here waits for
                        // are ignored.
                        if let Some(presence) = &presence
                            && let Err(e) = conn.sunsubscribe(presence).await
                        {
                            tracing::debug!(error = %e, channel, "cannot unsubscribe an idle presence channel");
                            return;
                        }
                        if let Err(e) = conn.sunsubscribe(&channel).await {
                            tracing::debug!(error = %e, channel, "cannot unsubscribe an idle wake-up channel");
                        }
                    })
                    .await;
                }
            });
            futures::future::join_all(each).await;
            let _ = outcomes.send(done);
        });
    }

    /// Asks, in a task, whether Redis holds each subscribed channel's
    /// presence channel (one audit at a time).
    fn audit(&mut self) {
        if self.auditing {
            return;
        }
        let checks: Vec<(String, String, u64)> = self
            .hub
            .subscribed_channels()
            .into_iter()
            .filter(|(c, _)| !self.pending.contains(c))
            .filter_map(|(c, generation)| {
                let presence = self.hub.presence(&c)?;
                Some((c, presence, generation))
            })
            .collect();
        if checks.is_empty() {
            return;
        }
        self.auditing = true;
        let (conn, limit, epoch, outcomes) = self.for_task();
        tokio::spawn(async move {
            let lost = audited(conn, checks, limit).await;
            metrics::counter!("ketch_wake_subscription_audits_total").increment(1);
            let _ = outcomes.send(Outcome::Audited { epoch, lost });
        });
    }

    /// Takes in what a task found; returns the pushes of a new connection
    /// when it made one.
    fn apply(&mut self, outcome: Outcome) -> Option<mpsc::UnboundedReceiver<redis::PushInfo>> {
        match outcome {
            Outcome::Subscribed { epoch, results } => {
                if epoch != self.epoch {
                    return None;
                }
                let mut timed_out = false;
                let mut stray = Vec::new();
                let mut again = Vec::new();
                for (channel, attempt) in results {
                    self.pending.remove(&channel);
                    let dropped = self.dropped.remove(&channel);
                    let ok = attempt == Attempt::Subscribed;
                    if !self.hub.is_wanted(&channel) {
                        // Removed as idle while it was being subscribed.
                        if ok {
                            stray.push(channel);
                        }
                    } else if ok && dropped {
                        again.push(channel);
                    } else if ok {
                        self.hub.confirmed(&channel);
                    } else {
                        timed_out |= attempt == Attempt::TimedOut;
                        if !self.retry.contains(&channel) {
                            self.retry.push(channel);
                        }
                    }
                }
                self.unsubscribe(stray);
                self.subscribe(again);
                if timed_out {
                    self.check();
                }
            }
            Outcome::Audited { epoch, lost: gone } => {
                if epoch != self.epoch {
                    return None;
                }
                self.auditing = false;
                let mut again = Vec::new();
                for (channel, generation) in gone {
                    // Confirmed or lost since the audit began: that says more.
                    if self.hub.generation(&channel) != Some(generation) || self.pending.contains(&channel) {
                        continue;
                    }
                    tracing::warn!(
                        channel,
                        "redis no longer holds a wake-up subscription; subscribing again"
                    );
                    lost("audit");
                    self.hub.subscription_lost(&channel);
                    again.push(channel);
                }
                self.subscribe(again);
            }
            Outcome::Checked { epoch, masters } => {
                if epoch != self.epoch {
                    return None;
                }
                self.checking = false;
                if let Some(masters) = masters {
                    return self.reconnect(&masters);
                }
            }
            Outcome::Unsubscribed { epoch, channels } => {
                if epoch != self.epoch {
                    return None;
                }
                for channel in &channels {
                    self.unsubscribing.remove(channel);
                }
                // Those wanted again meanwhile.
                self.subscribe(channels);
            }
        }
        None
    }

    /// After a subscription timed out, asks in a task whether the
    /// connection's slot map is stale (the cluster's changed, and the
    /// masters that took slots answer: [`crate::connection::SlotMapWatch::stale_map`]): then a
    /// new connection is made; at most once per [`RECONNECT_EVERY`].
    fn check(&mut self) {
        if self.checking || self.reconnected.is_some_and(|t| t.elapsed() < RECONNECT_EVERY) {
            return;
        }
        self.checking = true;
        let (watch, epoch, outcomes) = (self.watch.clone(), self.epoch, self.outcomes.clone());
        tokio::spawn(async move {
            let masters = watch
                .stale_map()
                .await
                .map(|ranges| crate::connection::masters_of(&ranges));
            let _ = outcomes.send(Outcome::Checked { epoch, masters });
        });
    }

    /// Replaces the connection with a new one (which reads the slot map
    /// afresh) and subscribes every channel again through it; returns the
    /// new connection's pushes.
    fn reconnect(&mut self, masters: &[String]) -> Option<mpsc::UnboundedReceiver<redis::PushInfo>> {
        let (conn, pushes, watch) = match (self.connect)(masters) {
            Ok(made) => made,
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a new wake-up subscription connection");
                return None;
            }
        };
        tracing::warn!(
            "a wake-up subscription timed out on a stale slot map; subscribing again on a new connection"
        );
        self.conn = conn;
        self.watch = watch;
        self.epoch += 1;
        self.checking = false;
        self.reconnected = Some(Instant::now());
        self.pending.clear();
        self.unsubscribing.clear();
        self.dropped.clear();
        self.auditing = false;
        metrics::counter!("ketch_wake_subscription_reconnects_total").increment(1);
        self.hub.connection_lost();
        self.retry.clear();
        self.subscribe(self.hub.channel_names());
        Some(pushes)
    }

    /// Takes in one push; returns the channel whose subscription Redis
    /// dropped, if it did, for the caller to subscribe again.
    fn handle(&mut self, push: redis::PushInfo) -> Option<String> {
        let text = |value: Option<&redis::Value>| match value {
            Some(redis::Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Some(redis::Value::SimpleString(text)) => Some(text.clone()),
            _ => None,
        };
        match push.kind {
            redis::PushKind::SMessage => {
                if let Some(channel) = text(push.data.first()) {
                    let (next_offset, log_start) =
                        text(push.data.get(1)).map_or((None, None), |p| announcement(&p));
                    self.hub.appended(&channel, next_offset, log_start);
                }
            }
            redis::PushKind::SSubscribe => {
                if let Some(channel) = text(push.data.first()) {
                    self.hub.confirmed(&channel);
                }
            }
            redis::PushKind::SUnsubscribe => {
                if let Some(channel) = text(push.data.first())
                    && self.hub.is_wanted(&channel)
                {
                    tracing::debug!(channel, "redis dropped a wake-up subscription; subscribing again");
                    lost("push");
                    self.hub.subscription_lost(&channel);
                    if self.pending.contains(&channel) {
                        // What the task under way reports may be older.
                        self.dropped.insert(channel);
                        return None;
                    }
                    return Some(channel);
                }
            }
            redis::PushKind::Disconnection => {
                tracing::warn!("a wake-up subscription connection to a cluster node was lost");
                lost("connection");
                self.hub.connection_lost();
                self.dropped.extend(self.pending.iter().cloned());
                for channel in self.hub.channel_names() {
                    if !self.retry.contains(&channel) {
                        self.retry.push(channel);
                    }
                }
            }
            _ => {}
        }
        None
    }
}

/// Counts a lost wake-up subscription (`how`: `push`, Redis said it dropped
/// it; `connection`, a subscriber connection was lost, all its
/// subscriptions with it; `audit`, found gone by the cluster subscriber's
/// audit).
fn lost(how: &'static str) {
    metrics::counter!("ketch_wake_subscription_losses_total", "how" => how).increment(1);
}

/// The subscriber count in a `PUBSUB SHARDNUMSUB` answer for one channel:
/// a map in RESP3, a flat array in RESP2.
fn subscriber_counts(value: redis::Value) -> HashMap<String, i64> {
    let pairs: Vec<(redis::Value, redis::Value)> = match value {
        redis::Value::Map(pairs) => pairs,
        redis::Value::Array(items) => {
            let mut items = items.into_iter();
            std::iter::from_fn(|| Some((items.next()?, items.next()?))).collect()
        }
        _ => Vec::new(),
    };
    pairs
        .into_iter()
        .filter_map(|(name, count)| {
            let name = match name {
                redis::Value::BulkString(bytes) => String::from_utf8(bytes).ok()?,
                redis::Value::SimpleString(name) => name,
                _ => return None,
            };
            let redis::Value::Int(count) = count else {
                return None;
            };
            Some((name, count))
        })
        .collect()
}

/// Aborts its task when dropped: a helper task that must not outlive
/// the work it serves, however that work ends.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The presence channel of the hub `id` for `channel`: the same hash tag,
/// so the same slot.
fn presence_channel(channel: &str, id: u64) -> String {
    format!("{channel}:{id:016x}")
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// What a message on a partition's channel announces: its next offset
/// (an append), or its next offset and log start, separated by a space (a
/// DeleteRecords or retention step that moved the log start). A gateway of
/// an earlier release reads the second form as no offset at all, which only
/// wakes its fetches.
fn announcement(payload: &str) -> (Option<i64>, Option<i64>) {
    let mut parts = payload.split(' ');
    let next_offset = parts.next().and_then(|p| p.parse().ok());
    let log_start = parts.next().and_then(|p| p.parse().ok());
    (next_offset, log_start)
}

/// Reads one RESP2 pub/sub frame: an array of bulk strings and integers, or
/// an error line.
async fn read_frame<R: tokio::io::AsyncRead + Unpin>(r: &mut BufReader<R>) -> std::io::Result<Frame> {
    let line = read_line(r).await?;
    match line.as_bytes().first() {
        Some(b'*') => {
            let n: usize = parse_len(&line[1..])?;
            let mut items = Vec::with_capacity(n.min(8));
            for _ in 0..n {
                items.push(read_item(r).await?);
            }
            Ok(match items.as_slice() {
                [Some(kind), Some(channel), payload] if kind.eq_ignore_ascii_case(b"smessage") => {
                    Frame::Message {
                        channel: String::from_utf8_lossy(channel).into_owned(),
                        announced: payload
                            .as_deref()
                            .and_then(|p| std::str::from_utf8(p).ok())
                            .map_or((None, None), announcement),
                    }
                }
                [Some(kind), Some(channel), _] => Frame::Confirm {
                    kind: kind.clone(),
                    channel: String::from_utf8_lossy(channel).into_owned(),
                },
                _ => Frame::Other,
            })
        }
        Some(b'-') => Ok(Frame::Error(line[1..].to_owned())),
        Some(b'+' | b':') => Ok(Frame::Other),
        _ => Err(std::io::Error::other(format!("unexpected RESP line {line:?}"))),
    }
}

async fn read_item<R: tokio::io::AsyncRead + Unpin>(
    r: &mut BufReader<R>,
) -> std::io::Result<Option<Vec<u8>>> {
    let line = read_line(r).await?;
    match line.as_bytes().first() {
        Some(b'$') => {
            if &line[1..] == "-1" {
                return Ok(None);
            }
            let len = parse_len(&line[1..])?;
            if len > MAX_FRAME_BULK {
                return Err(std::io::Error::other("pub/sub payload too large"));
            }
            let mut buf = vec![0; len + 2];
            r.read_exact(&mut buf).await?;
            buf.truncate(len);
            Ok(Some(buf))
        }
        Some(b':') => Ok(Some(line.as_bytes()[1..].to_vec())),
        _ => Err(std::io::Error::other(format!("unexpected RESP item {line:?}"))),
    }
}

async fn read_line<R: tokio::io::AsyncRead + Unpin>(r: &mut BufReader<R>) -> std::io::Result<String> {
    let mut line = String::new();
    let n = (&mut *r).take(MAX_FRAME_BULK as u64).read_line(&mut line).await?;
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "redis closed the connection",
        ));
    }
    Ok(line.trim_end().to_owned())
}

fn parse_len(text: &str) -> std::io::Result<usize> {
    text.parse()
        .map_err(|_| std::io::Error::other(format!("bad RESP length {text:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster subscriber on a hub, its connection never reaching a
    /// server: what its tasks report is not read, so `apply` and `handle`
    /// are driven by hand.
    fn cluster_subscriber() -> (ClusterSubscriber, mpsc::UnboundedReceiver<Outcome>) {
        let (hub, _commands) = WakeHub::detached(Some(7));
        let (subscriber, _pushes, outcomes) = ClusterSubscriber::new(
            hub,
            &["redis://127.0.0.1:1"],
            &crate::connection::Tls::default(),
            Duration::from_secs(30),
            Duration::from_millis(100),
            Duration::from_millis(100),
        )
        .expect("a lazy connection");
        (subscriber, outcomes)
    }

    fn push(kind: redis::PushKind, channel: &str) -> redis::PushInfo {
        redis::PushInfo {
            kind,
            data: vec![redis::Value::BulkString(channel.as_bytes().to_vec())],
        }
    }

    #[tokio::test]
    async fn the_cluster_subscribers_commands_for_one_channel_never_overlap() {
        let (mut s, _outcomes) = cluster_subscriber();
        let _watch = s.hub.watch(vec!["x".into()]);

        // Wanted again while it is being unsubscribed: subscribed after.
        s.unsubscribing.insert("x".into());
        s.subscribe(vec!["x".into()]);
        assert!(!s.pending.contains("x"), "subscribed while being unsubscribed");
        s.apply(Outcome::Unsubscribed {
            epoch: 0,
            channels: vec!["x".into()],
        });
        assert!(s.pending.contains("x") && s.unsubscribing.is_empty());

        // Dropped by Redis while being subscribed: not confirmed by the
        // task's answer, subscribed again.
        assert_eq!(s.handle(push(redis::PushKind::SUnsubscribe, "x")), None);
        s.apply(Outcome::Subscribed {
            epoch: 0,
            results: vec![("x".into(), Attempt::Subscribed)],
        });
        assert!(
            !s.hub.all_subscribed(&["x".into()]),
            "confirmed after Redis dropped it"
        );
        assert!(s.pending.contains("x"), "not subscribed again");
        s.apply(Outcome::Subscribed {
            epoch: 0,
            results: vec![("x".into(), Attempt::Subscribed)],
        });
        assert!(s.hub.all_subscribed(&["x".into()]));

        // What tasks of an older connection report is ignored.
        s.pending.insert("x".into());
        s.epoch = 1;
        s.apply(Outcome::Subscribed {
            epoch: 0,
            results: vec![("x".into(), Attempt::Failed)],
        });
        assert!(s.pending.contains("x") && s.retry.is_empty());
    }

    #[tokio::test]
    async fn an_audit_that_finds_a_subscription_gone_subscribes_it_again() {
        let (mut s, _outcomes) = cluster_subscriber();
        let _watch = s.hub.watch(vec!["x".into(), "y".into()]);
        s.hub.confirmed("x");
        s.hub.confirmed("y");
        s.hub.appended("x", Some(5), Some(0));
        assert_eq!(s.hub.known_next("x"), Some(5));
        let x = s.hub.generation("x").expect("subscribed");
        let y = s.hub.generation("y").expect("subscribed");
        // y was confirmed again after the audit began: its answer is old.
        s.hub.confirmed("y");
        s.auditing = true;
        s.apply(Outcome::Audited {
            epoch: 0,
            lost: vec![("x".into(), x), ("y".into(), y)],
        });
        assert!(!s.auditing);
        assert!(
            !s.hub.all_subscribed(&["x".into()]),
            "x still believed subscribed"
        );
        assert_eq!(s.hub.known_next("x"), None, "what x knew is kept");
        assert!(s.pending.contains("x"), "x not subscribed again");
        assert!(s.hub.all_subscribed(&["y".into()]) && !s.pending.contains("y"));

        // A subscription that times out has the cluster checked; a new
        // connection is made only if the map is stale, and not twice
        // within RECONNECT_EVERY.
        s.pending.clear();
        let pushes = s.apply(Outcome::Subscribed {
            epoch: 0,
            results: vec![("x".into(), Attempt::TimedOut)],
        });
        assert!(pushes.is_none() && s.checking, "no check of the cluster");
        let pushes = s.apply(Outcome::Checked {
            epoch: 0,
            masters: None,
        });
        assert!(
            pushes.is_none() && s.epoch == 0,
            "a new connection while a master does not answer"
        );
        s.check();
        let pushes = s.apply(Outcome::Checked {
            epoch: 0,
            masters: Some(Vec::new()),
        });
        assert!(pushes.is_some() && s.epoch == 1, "no new connection");
        assert!(
            !s.hub.all_subscribed(&["y".into()]),
            "y kept across the new connection"
        );
        assert!(s.pending.contains("x") && s.pending.contains("y"));
        s.pending.clear();
        s.apply(Outcome::Subscribed {
            epoch: 1,
            results: vec![("x".into(), Attempt::TimedOut)],
        });
        assert!(!s.checking, "a second new connection at once");
        assert!(s.retry.contains(&"x".to_owned()));
    }

    #[test]
    fn reads_shardnumsub_answers() {
        let name = |n: &str| redis::Value::BulkString(n.as_bytes().to_vec());
        let counts = |pairs: &[(&str, i64)]| {
            pairs
                .iter()
                .map(|(n, c)| ((*n).to_owned(), *c))
                .collect::<HashMap<_, _>>()
        };
        // RESP2: a flat array; RESP3: a map.
        assert_eq!(
            subscriber_counts(redis::Value::Array(vec![
                name("a"),
                redis::Value::Int(2),
                name("b"),
                redis::Value::Int(0),
            ])),
            counts(&[("a", 2), ("b", 0)])
        );
        assert_eq!(
            subscriber_counts(redis::Value::Map(vec![
                (name("a"), redis::Value::Int(1)),
                (name("b"), redis::Value::Int(0)),
            ])),
            counts(&[("a", 1), ("b", 0)])
        );
        assert!(subscriber_counts(redis::Value::Nil).is_empty());
    }

    #[tokio::test]
    async fn parses_pubsub_frames() {
        let wire = b"*3\r\n$10\r\nssubscribe\r\n$5\r\nk:{a}\r\n:1\r\n*3\r\n$8\r\nsmessage\r\n$5\r\nk:{a}\r\n$1\r\n7\r\n-ERR nope\r\n";
        let mut r = BufReader::new(&wire[..]);
        assert!(
            matches!(read_frame(&mut r).await.unwrap(), Frame::Confirm { channel, .. } if channel == "k:{a}")
        );
        assert!(
            matches!(read_frame(&mut r).await.unwrap(), Frame::Message { channel, announced: (Some(7), None) } if channel == "k:{a}")
        );
        assert!(matches!(read_frame(&mut r).await.unwrap(), Frame::Error(e) if e == "ERR nope"));
        assert!(read_frame(&mut r).await.is_err());
    }

    #[tokio::test]
    async fn a_local_notify_wakes_a_watch_made_before_it() {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let hub = WakeHub::start(
            client,
            crate::connection::Tls::default(),
            Duration::from_secs(1),
            Duration::from_millis(10),
        );
        let watch = hub.watch(vec!["c".into()]);
        hub.appended("c", None, None);
        tokio::time::timeout(Duration::from_secs(1), watch.notified())
            .await
            .unwrap();
        assert!(!watch.subscribed(Duration::from_millis(20)).await);
    }

    #[tokio::test]
    async fn a_watch_learns_which_channels_fired() {
        let (hub, _commands) = WakeHub::detached(None);
        let watch = hub.watch(vec!["c".into(), "d".into()]);
        hub.appended("c", Some(5), None);
        let fired = watch.take_fired();
        assert!(fired.includes("c") && !fired.includes("d"), "{fired:?}");
        assert_eq!(watch.take_fired(), Fired::Nothing);
        // Not yet subscribed when the watch was made: both may have missed appends.
        let since_start = watch.take_fired_since_start();
        assert!(since_start.includes("c") && since_start.includes("d"));
    }

    #[tokio::test]
    async fn known_offsets_need_a_confirmed_subscription_and_never_go_back() {
        let (hub, _commands) = WakeHub::detached(None);
        let _watch = hub.watch(vec!["c".into()]);
        hub.appended("c", Some(5), Some(0));
        assert_eq!(hub.known_empty_at("c", 5, false), None, "not subscribed yet");
        hub.confirmed("c");
        let generation = hub.generation("c").unwrap();
        hub.observe("c", generation, 5, 0, 5);
        assert_eq!(hub.known_empty_at("c", 5, false), Some(0));
        hub.appended("c", Some(7), None);
        assert_eq!(hub.known_empty_at("c", 5, false), None);
        hub.observe("c", generation, 6, 0, 6);
        assert_eq!(
            hub.known_empty_at("c", 7, false),
            Some(0),
            "an older read does not move it back"
        );
        hub.connection_lost();
        assert_eq!(hub.known_empty_at("c", 7, false), None);
        hub.confirmed("c");
        hub.observe("c", generation, 7, 0, 7);
        assert_eq!(
            hub.known_empty_at("c", 7, false),
            None,
            "a read from an older subscription is ignored"
        );
    }

    /// A fetch woken by a lost subscription reads, finds nothing and sleeps
    /// again; an append through another gateway before the subscription is
    /// back is announced to no one here, so its confirmation wakes the
    /// fetch to read once more (as a fetch's loop does: once confirmed, it
    /// only waits for `notified`).
    #[tokio::test]
    async fn a_subscription_confirmed_again_wakes_its_waiters_to_read() {
        for lose in [
            (|hub: &WakeHub| hub.subscription_lost("c")) as fn(&WakeHub),
            |hub| hub.connection_lost(),
        ] {
            let (hub, _commands) = WakeHub::detached(None);
            let watch = hub.watch(vec!["c".into(), "d".into()]);
            hub.confirmed("c");
            hub.confirmed("d");
            assert!(watch.subscribed(Duration::ZERO).await);
            let _ = watch.take_fired_since_start();
            let woken = |watch: &Watch| {
                let notified = watch.notified();
                tokio::pin!(notified);
                std::future::Future::poll(
                    notified.as_mut(),
                    &mut std::task::Context::from_waker(std::task::Waker::noop()),
                )
                .is_ready()
            };
            assert!(!woken(&watch));

            lose(&hub);
            assert!(woken(&watch), "the loss wakes the fetch to read");
            assert_eq!(watch.take_fired(), Fired::All);
            // The fetch read, found nothing, and sleeps: confirming "d" (not
            // lost by subscription_lost) wakes no one, confirming "c" does.
            if !hub.all_subscribed(&["d".into()]) {
                hub.confirmed("d");
                assert!(woken(&watch));
                assert!(watch.take_fired().includes("d"));
            }
            assert!(!woken(&watch));
            hub.confirmed("c");
            assert!(woken(&watch), "the confirmation wakes the fetch to read again");
            assert!(watch.take_fired().includes("c"));
            assert!(!woken(&watch));
            // Confirmed again while subscribed (the command's answer and its
            // push, or redis-rs subscribing again on its own after replacing
            // a connection it did not report lost): counted as a lapse, since
            // the two cannot be told apart. What was known goes, the fetch
            // reads again, and a read begun before does not count.
            let generation = hub.generation("c").unwrap();
            hub.observe("c", generation, 3, 0, 3);
            assert_eq!(hub.known_empty_at("c", 3, false), Some(0));
            hub.confirmed("c");
            assert!(woken(&watch));
            assert!(watch.take_fired().includes("c"));
            assert_eq!(hub.known_empty_at("c", 3, false), None);
            hub.observe("c", generation, 3, 0, 3);
            assert_eq!(hub.known_empty_at("c", 3, false), None);
        }
    }

    /// A read_committed fetch skips a partition only while the next offset
    /// is the one at which a read saw every transaction decided.
    #[tokio::test]
    async fn known_empty_for_read_committed_needs_a_read_that_saw_it_decided() {
        let (hub, _commands) = WakeHub::detached(None);
        let _watch = hub.watch(vec!["c".into()]);
        hub.confirmed("c");
        let generation = hub.generation("c").unwrap();
        // A transaction open from offset 3: last stable offset 3 < 5.
        hub.observe("c", generation, 5, 0, 3);
        assert_eq!(hub.known_empty_at("c", 5, false), Some(0));
        assert_eq!(hub.known_empty_at("c", 5, true), None, "undecided");
        // Its marker: offsets 5..6, every transaction decided.
        hub.appended("c", Some(6), None);
        assert_eq!(hub.known_empty_at("c", 6, true), None, "no read saw it yet");
        hub.observe("c", generation, 6, 0, 6);
        assert_eq!(hub.known_empty_at("c", 6, true), Some(0));
        assert_eq!(hub.known_empty_at("c", 5, true), None, "only at the next offset");
        // An older read (started before the marker) changes nothing.
        hub.observe("c", generation, 5, 0, 3);
        assert_eq!(hub.known_empty_at("c", 6, true), Some(0));
        // A transactional append elsewhere: known only by its next offset.
        hub.appended("c", Some(9), None);
        assert_eq!(hub.known_empty_at("c", 9, false), Some(0));
        assert_eq!(hub.known_empty_at("c", 9, true), None);
        hub.observe("c", generation, 9, 0, 6);
        assert_eq!(hub.known_empty_at("c", 9, true), None, "open since 6");
        hub.connection_lost();
        hub.confirmed("c");
        assert_eq!(
            hub.known_empty_at("c", 9, true),
            None,
            "forgotten with the subscription"
        );
    }

    fn batch(len: usize) -> Bytes {
        Bytes::from(vec![1u8; len])
    }

    fn tail_of(hub: &WakeHub, offset: i64, decided: bool) -> Option<(usize, i64, i64, i64)> {
        hub.read_tail("c", offset, usize::MAX, decided).map(|read| {
            let o = read.offsets.unwrap();
            (
                read.batches.len(),
                o.log_start_offset,
                o.high_watermark,
                o.last_stable_offset,
            )
        })
    }

    /// What this gateway's own write saw of the partition is kept only under
    /// the subscription it began with: one that ran in Redis before the
    /// subscription was live, or while it lapsed, may follow appends through
    /// other gateways announced to no one here, and would hide them.
    #[tokio::test]
    async fn a_write_begun_under_another_subscription_leaves_nothing_known() {
        let (hub, _commands) = WakeHub::detached(None);
        hub.set_tail_budget(1 << 20);
        let _watch = hub.watch(vec!["c".into()]);
        let read = |next| hub.observe("c", hub.generation("c").unwrap(), next, 0, next);
        // Begun before the subscription was live; a read under it saw the
        // partition empty at 0 before the append ran; the reply comes after.
        let appending = hub.appending("c");
        assert_eq!(appending.since(), None);
        hub.confirmed("c");
        read(0);
        assert_eq!(hub.known_empty_at("c", 0, false), Some(0));
        // Another read started before the append ran, answered after its reply.
        let late = hub.generation("c").unwrap();
        appending.stored(0, 2, 0, false, Some(batch(10)));
        hub.observe("c", late, 0, 0, 0);
        // Its own offsets would hide an append through another gateway at
        // 2; what the read saw would hide this one (never announced here).
        assert_eq!(
            hub.known_empty_at("c", 2, false),
            None,
            "another append may be at 2"
        );
        assert_eq!(hub.known_empty_at("c", 0, false), None, "the append made it 2");
        assert_eq!(tail_of(&hub, 0, false), None);
        // Begun under the subscription: kept.
        read(2);
        let appending = hub.appending("c");
        appending.stored(2, 4, 0, false, Some(batch(10)));
        assert_eq!(hub.known_empty_at("c", 4, false), Some(0));
        assert_eq!(tail_of(&hub, 2, false), Some((1, 0, 4, 4)));
        // Begun, then the subscription lapsed and came back before its reply.
        let appending = hub.appending("c");
        hub.subscription_lost("c");
        hub.confirmed("c");
        read(4);
        appending.stored(4, 6, 0, false, Some(batch(10)));
        assert_eq!(hub.known_empty_at("c", 4, false), None);
        assert_eq!(hub.known_empty_at("c", 6, false), None);
        assert_eq!(tail_of(&hub, 4, false), None);
        assert_eq!(hub.inner.state.lock().unwrap().tail_bytes, 0);
        // A transaction marker or DeleteRecords of its own: its offsets count
        // only under the subscription it began with, too. Those writes are
        // announced like any other gateway's (if they ran once the
        // subscription was live; if before, a read under it saw them), so
        // what was known stays.
        let since = hub.generation("c");
        hub.connection_lost();
        hub.confirmed("c");
        read(6);
        hub.wrote("c", since, Some(7), Some(0));
        assert_eq!(
            hub.known_empty_at("c", 7, false),
            None,
            "its own offsets are not taken"
        );
        assert_eq!(hub.known_empty_at("c", 6, false), Some(0));
        hub.appended("c", Some(7), None);
        assert_eq!(hub.known_empty_at("c", 7, false), Some(0));
        hub.wrote("c", hub.generation("c"), Some(8), Some(0));
        assert_eq!(hub.known_empty_at("c", 8, false), Some(0));
        // Announcements come through the subscription: always kept.
        hub.appended("c", Some(9), None);
        assert_eq!(hub.known_empty_at("c", 9, false), Some(0));
    }

    /// Whether an append to `channel` now would bring its batch to the
    /// tail (the append then refused: nothing stored, nothing forgotten).
    fn keeps_tail(hub: &WakeHub, channel: &str) -> bool {
        let appending = hub.appending(channel);
        let keeps = appending.keeps_tail();
        appending.nothing_stored();
        keeps
    }

    /// A tail serves what this gateway stored while subscribed, from the
    /// log start on, and is forgotten with the subscription.
    #[tokio::test]
    async fn a_tail_serves_from_the_log_start_while_subscribed() {
        let (hub, _commands) = WakeHub::detached(None);
        hub.set_tail_budget(1 << 20);
        let _watch = hub.watch(vec!["c".into()]);
        assert!(!keeps_tail(&hub, "c"), "not subscribed yet");
        hub.stored("c", hub.generation("c"), 0, 2, 0, false, Some(batch(10)));
        assert_eq!(tail_of(&hub, 0, false), None);
        hub.confirmed("c");
        assert!(keeps_tail(&hub, "c"));
        hub.stored("c", hub.generation("c"), 2, 4, 0, false, Some(batch(10)));
        hub.stored("c", hub.generation("c"), 4, 5, 0, false, Some(batch(10)));
        assert_eq!(tail_of(&hub, 3, false), Some((2, 0, 5, 5)));
        // Another gateway appended: the high watermark is what was announced.
        hub.appended("c", Some(8), None);
        assert_eq!(tail_of(&hub, 4, false), Some((1, 0, 8, 8)));
        assert_eq!(tail_of(&hub, 5, false), None, "not stored here");
        // DeleteRecords or retention moved the log start (announced).
        hub.appended("c", Some(8), Some(4));
        assert_eq!(tail_of(&hub, 3, false), None, "below the log start");
        assert_eq!(tail_of(&hub, 4, false), Some((1, 4, 8, 8)));
        // This gateway's own DeleteRecords: the log start alone.
        hub.appended("c", None, Some(5));
        assert_eq!(tail_of(&hub, 4, false), None);
        hub.stored("c", hub.generation("c"), 8, 9, 5, false, Some(batch(10)));
        assert_eq!(tail_of(&hub, 8, false), Some((1, 5, 9, 9)));
        hub.subscription_lost("c");
        hub.confirmed("c");
        assert_eq!(tail_of(&hub, 8, false), None, "forgotten with the subscription");
        assert_eq!(hub.inner.state.lock().unwrap().tail_bytes, 0);
        // No budget, no tail.
        hub.set_tail_budget(0);
        assert!(!keeps_tail(&hub, "c"));
    }

    /// The tails' budget goes to the newest batches, whichever partitions
    /// they are in: a partition no longer appended to, or no longer tailed
    /// (its channel still subscribed), gives way to one being tailed now.
    #[tokio::test]
    async fn the_oldest_batches_anywhere_give_way() {
        let (hub, _commands) = WakeHub::detached(None);
        hub.set_tail_budget(1000);
        let _watch = hub.watch(vec!["a".into(), "b".into()]);
        hub.confirmed("a");
        hub.confirmed("b");
        let held = |channel: &str, offset| {
            hub.read_tail(channel, offset, usize::MAX, false)
                .map(|r| r.batches.len())
        };
        for i in 0..3 {
            hub.stored("a", hub.generation("a"), i, i + 1, 0, false, Some(batch(300)));
        }
        assert_eq!(held("a", 0), Some(3));
        // "b" needs room: "a"'s oldest batch gives it.
        hub.stored("b", hub.generation("b"), 0, 1, 0, false, Some(batch(300)));
        assert_eq!(held("a", 0), None);
        assert_eq!(held("a", 1), Some(2));
        assert_eq!(held("b", 0), Some(1));
        // A batch too large for the whole budget is not kept, and takes
        // nothing from the others.
        hub.stored("b", hub.generation("b"), 1, 2, 0, false, Some(batch(1001)));
        assert_eq!(held("b", 0), None);
        assert_eq!(held("a", 1), Some(2));
        hub.stored("b", hub.generation("b"), 2, 3, 0, false, Some(batch(10)));
        assert_eq!(hub.inner.state.lock().unwrap().tail_bytes, 610);
        // The sweep, or the next batch kept anywhere, finds nothing old yet…
        assert!(hub.take_idle(Duration::from_secs(3600)).is_empty());
        assert_eq!(held("a", 1), Some(2));
        // …and past their age, every partition's batches go.
        let later = Instant::now() + crate::tail::TAIL_AGE + Duration::from_millis(1);
        hub.inner.state.lock().unwrap().make_tail_room(0, later);
        assert_eq!(held("a", 1), None);
        assert_eq!(held("b", 2), None);
        assert_eq!(hub.inner.state.lock().unwrap().tail_bytes, 0);
    }

    /// read_committed: a tail serves batches below what is known stable;
    /// a batch that is not transactional, stored where every transaction
    /// was decided, keeps them decided.
    #[tokio::test]
    async fn a_tail_serves_read_committed_below_what_is_known_stable() {
        let (hub, _commands) = WakeHub::detached(None);
        hub.set_tail_budget(1 << 20);
        let _watch = hub.watch(vec!["c".into()]);
        hub.confirmed("c");
        let generation = hub.generation("c").unwrap();
        hub.stored("c", hub.generation("c"), 0, 2, 0, false, Some(batch(10)));
        assert_eq!(tail_of(&hub, 0, true), None, "no read saw it decided");
        assert_eq!(tail_of(&hub, 0, false), Some((1, 0, 2, 2)));
        hub.observe("c", generation, 2, 0, 2);
        hub.stored("c", hub.generation("c"), 2, 4, 0, false, Some(batch(10)));
        assert_eq!(hub.known_empty_at("c", 4, true), Some(0), "still decided");
        assert_eq!(tail_of(&hub, 2, true), Some((1, 0, 4, 4)));
        // A transactional batch of this gateway: undecided from 4 on, and
        // the run starts again after it.
        hub.stored("c", hub.generation("c"), 4, 5, 0, true, None);
        assert_eq!(hub.known_empty_at("c", 5, true), None);
        hub.stored("c", hub.generation("c"), 5, 6, 0, false, Some(batch(10)));
        assert_eq!(tail_of(&hub, 2, false), None, "the run starts again");
        assert_eq!(tail_of(&hub, 5, true), None, "above an open transaction");
        assert_eq!(tail_of(&hub, 5, false), Some((1, 0, 6, 4)));
        // Another gateway's transactional batch, then this one's: known
        // stable only as far as before it.
        hub.observe("c", generation, 6, 0, 6);
        hub.appended("c", Some(7), None);
        hub.stored("c", hub.generation("c"), 7, 8, 0, false, Some(batch(10)));
        assert_eq!(tail_of(&hub, 7, true), None);
        assert_eq!(hub.known_empty_at("c", 8, true), None);
    }

    /// An announcement during this gateway's append to the partition (its
    /// own, most likely) wakes the watches when the append ends, stored or
    /// not.
    #[tokio::test]
    async fn an_announcement_during_an_append_wakes_when_it_ends() {
        let (hub, _commands) = WakeHub::detached(None);
        hub.set_tail_budget(1 << 20);
        let watch = hub.watch(vec!["c".into()]);
        hub.confirmed("c");
        let appending = hub.appending("c");
        hub.appended("c", Some(3), None);
        assert_eq!(watch.take_fired(), Fired::Nothing);
        appending.stored(0, 3, 0, false, Some(batch(10)));
        assert_eq!(
            watch.take_fired(),
            Fired::Channels(vec!["c".into()]),
            "woken once"
        );
        // An append that failed: woken as it ends.
        let appending = hub.appending("c");
        hub.appended("c", Some(6), None);
        assert_eq!(watch.take_fired(), Fired::Nothing);
        drop(appending);
        assert_eq!(watch.take_fired(), Fired::Channels(vec!["c".into()]));
    }

    /// An append whose reply never came (a timeout, a broken connection,
    /// the request dropped at its deadline) or that found its batch stored
    /// already may have left a batch no one announced here (the script
    /// announces an append only to other gateways): what was known of the
    /// partition, its tail included, is forgotten and its watches read
    /// again. A fetch here was told "nothing new" until the next append.
    #[tokio::test]
    async fn an_append_that_was_not_told_forgets_what_was_known() {
        let (hub, _commands) = WakeHub::detached(None);
        hub.set_tail_budget(1 << 20);
        let watch = hub.watch(vec!["c".into()]);
        hub.confirmed("c");
        hub.appending("c").stored(0, 2, 0, false, Some(batch(10)));
        assert_eq!(hub.known_empty_at("c", 2, false), Some(0));
        assert_eq!(tail_of(&hub, 0, false), Some((1, 0, 2, 2)));
        // Refused by the script: nothing stored, what was known stands.
        hub.appending("c").nothing_stored();
        assert_eq!(hub.known_empty_at("c", 2, false), Some(0));
        let _ = watch.take_fired();
        // Sent; Redis stored it at 2 and the reply was lost.
        drop(hub.appending("c"));
        assert_eq!(hub.known_empty_at("c", 2, false), None, "a read finds offset 2");
        assert_eq!(tail_of(&hub, 0, false), None);
        assert_eq!(hub.inner.state.lock().unwrap().tail_bytes, 0);
        assert_eq!(watch.take_fired(), Fired::Channels(vec!["c".into()]));
        // A read made now may come before the append lands (it may still
        // wait in Redis): what it sees is not trusted for a while.
        hub.observe("c", hub.generation("c").unwrap(), 2, 0, 2);
        assert_eq!(hub.known_empty_at("c", 2, false), None, "in doubt");
    }
}
