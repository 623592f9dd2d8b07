//! The transaction coordinator (KIP-98). Its state lives in Redis
//! (`ketch_storage::transactions`), changed atomically per transactional
//! id, so every gateway serves every id: behind a load balancer a
//! producer's requests may land anywhere. What needs one owner — looking
//! for transactions past their timeout, and finishing decisions a crashed
//! gateway left half done — is done by the id's coordinator, the gateway
//! FindCoordinator names (rendezvous hashing over the live gateways, as
//! for groups), in [`sweep`].
//!
//! A transaction is finished ([`finish`]) by writing its marker to each of
//! its partitions and applying (or dropping) its offsets in each of its
//! groups, then marking it complete. Every one of those writes can be
//! repeated without effect, so a finish interrupted anywhere is simply
//! done again. EndTxn answers once the decision is written, as Kafka's
//! coordinator does, and finishes in the background ([`Finishing`]): the
//! producer's next requests for the id on this gateway wait for it there
//! instead of meeting CONCURRENT_TRANSACTIONS and a client's retry backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ketch_storage::{Decided, StorageError, TxnReply};
use tokio::sync::watch;

use crate::Context;
use crate::storage::Storage;

/// How long a request waits for this gateway's finish of the same id
/// before it goes on (and meets CONCURRENT_TRANSACTIONS, retriable).
const FINISH_WAIT: Duration = Duration::from_secs(5);

/// The producer (id and epoch) each transactional id had when a produce
/// request naming that id was last checked against it: Kafka's partition
/// verification (KIP-890) refuses a transactional batch whose producer is
/// not its request's transactional id's, which would write into another
/// producer's transaction. A producer seen before is not read again (its
/// id and epoch change only through InitProducerId, and a fenced epoch is
/// refused by each partition).
#[derive(Default)]
pub struct VerifiedProducers {
    known: Mutex<HashMap<String, (i64, i16)>>,
}

/// Transactional ids [`VerifiedProducers`] remembers before it starts
/// again.
const VERIFIED_PRODUCERS: usize = 10_000;

impl VerifiedProducers {
    /// Whether `(producer_id, epoch)` is transactional id `id`'s producer:
    /// INVALID_PRODUCER_ID_MAPPING when `id` has another producer (or none),
    /// INVALID_PRODUCER_EPOCH when its epoch is another, NOT_ENOUGH_REPLICAS
    /// (retriable, as Kafka answers a verification that cannot reach the
    /// coordinator) when Redis cannot say.
    pub async fn check(
        &self,
        storage: &dyn Storage,
        id: &str,
        producer_id: i64,
        epoch: i16,
    ) -> Result<(), i16> {
        use kafka_protocol::error::ResponseError;
        if self.known.lock().expect("verified producers").get(id) == Some(&(producer_id, epoch)) {
            return Ok(());
        }
        let state = storage.txn_describe(id).await.map_err(|e| {
            tracing::debug!(transactional_id = id, error = %e, "cannot check a transactional producer");
            ResponseError::NotEnoughReplicas.code()
        })?;
        match state {
            Some(state) if state.producer_id == producer_id && state.epoch == epoch => {
                let mut known = self.known.lock().expect("verified producers");
                if known.len() >= VERIFIED_PRODUCERS {
                    known.clear();
                }
                known.insert(id.to_owned(), (producer_id, epoch));
                Ok(())
            }
            Some(state) if state.producer_id == producer_id => {
                Err(ResponseError::InvalidProducerEpoch.code())
            }
            _ => Err(ResponseError::InvalidProducerIdMapping.code()),
        }
    }
}

/// The transactions this gateway is finishing, by transactional id: each
/// a channel that turns true (or closes) when the finish is over.
#[derive(Clone, Default)]
pub struct Finishing {
    running: Arc<Mutex<HashMap<String, watch::Receiver<bool>>>>,
}

impl Finishing {
    /// Finishes `decided` in the background; the requests for `id` that
    /// call [`Finishing::wait`] meanwhile wait for it. The id is scheduled
    /// for its coordinator's look at `recheck` meanwhile, should the finish
    /// fail.
    pub fn start(&self, ctx: &Context, id: &str, decided: Decided, recheck: i64) {
        let storage = ctx.storage.clone();
        let kept = Kept::of(ctx);
        let (done, running) = watch::channel(false);
        self.running
            .lock()
            .expect("finishing lock")
            .insert(id.to_owned(), running.clone());
        let registry = self.clone();
        let id = id.to_owned();
        tokio::spawn(async move {
            let (scheduled, finished) = tokio::join!(
                storage.txn_schedule(&id, recheck),
                finish(storage.as_ref(), kept, &id, &decided)
            );
            if let Err(e) = scheduled {
                tracing::warn!(transactional_id = %id, error = %e, "cannot schedule a look at a decided transaction");
            }
            match finished {
                Ok(()) => count(if decided.commit { "commit" } else { "abort" }),
                Err(e) => tracing::warn!(transactional_id = %id, error = %e,
                    "a transaction is decided but not finished; its coordinator will finish it"),
            }
            let mut running_now = registry.running.lock().expect("finishing lock");
            if running_now.get(&id).is_some_and(|r| r.same_channel(&running)) {
                running_now.remove(&id);
            }
            let _ = done.send(true);
        });
    }

    /// Waits (at most [`FINISH_WAIT`]) until this gateway's finish of `id`,
    /// if one runs, is over.
    pub async fn wait(&self, id: &str) {
        let running = self.running.lock().expect("finishing lock").get(id).cloned();
        if let Some(mut running) = running {
            let _ = tokio::time::timeout(FINISH_WAIT, running.wait_for(|done| *done)).await;
        }
    }

    /// Waits (at most `limit`) for every finish running (at shutdown).
    pub async fn wait_all(&self, limit: Duration) {
        let running: Vec<_> = self
            .running
            .lock()
            .expect("finishing lock")
            .values()
            .cloned()
            .collect();
        let all = futures::future::join_all(running.into_iter().map(|mut r| async move {
            let _ = r.wait_for(|done| *done).await;
        }));
        let _ = tokio::time::timeout(limit, all).await;
    }
}

/// How long a decided transaction may stay unfinished before its
/// coordinator finishes it in place of the gateway that decided it.
pub const FINISH_GRACE: Duration = Duration::from_secs(2);

/// Transactional ids read at a time by a sweep.
const SWEEP_BATCH: usize = 100;
/// Pages of [`SWEEP_BATCH`] one sweep reads at most (those beyond wait for
/// the next).
const SWEEP_PAGES: usize = 100;

/// `transactions.id_expiration` in ms, the TTL of an id's state.
/// Schedules a look at `id` no later than the longest transaction timeout
/// from now (lowering its score only), sent beside an add that may open
/// its transaction: the add's exact deadline is scheduled only after its
/// reply, and a gateway killed in between would otherwise leave the
/// transaction open with no look scheduled (the score of the transaction
/// before it being idle), never aborted. An early look is harmless: the
/// sweep finds the transaction open and reschedules it.
pub async fn schedule_backstop(ctx: &Context, id: &str) {
    let longest = i64::try_from(ctx.settings.transactions.max_timeout.get().as_millis()).unwrap_or(i64::MAX);
    let at = ketch_storage::now_ms().saturating_add(longest);
    if let Err(e) = ctx.storage.txn_schedule_if_listed(id, at).await {
        tracing::debug!(transactional_id = id, error = %e, "cannot schedule a transaction's backstop look");
    }
}

/// `transactions.id_expiration` as a TTL Redis takes (at most 2^53 ms: a
/// longer one would not add to its clock, and every write of a finished
/// transaction's state would fail).
pub fn id_ttl_ms(ctx: &Context) -> i64 {
    ketch_storage::groups::retention_ms(ctx.settings.transactions.id_expiration.get())
}

/// How long what a transaction finishes is kept: the id's state
/// (`transactions.id_expiration`, in ms), and the offsets it commits for a
/// group without members (`groups.offsets_retention`).
#[derive(Debug, Clone, Copy)]
pub struct Kept {
    pub id_ttl_ms: i64,
    pub offsets_retention: Duration,
}

impl Kept {
    pub fn of(ctx: &Context) -> Self {
        Self {
            id_ttl_ms: id_ttl_ms(ctx),
            offsets_retention: ctx.settings.groups.offsets_retention.get(),
        }
    }
}

/// Writes a decided transaction's markers and offsets, then marks it
/// complete. Partitions of topics deleted since are skipped.
pub async fn finish(
    storage: &dyn Storage,
    kept: Kept,
    id: &str,
    decided: &Decided,
) -> Result<(), StorageError> {
    let mut markers = Vec::with_capacity(decided.partitions.len());
    for (topic, partition) in &decided.partitions {
        markers.push(write_marker(storage, topic, *partition, decided));
    }
    for result in crate::api::each(markers).await {
        result?;
    }
    for group in &decided.groups {
        storage
            .apply_txn_offsets(group, decided, kept.offsets_retention)
            .await?;
    }
    storage.txn_complete(id, decided.number, kept.id_ttl_ms).await?;
    tracing::debug!(
        transactional_id = id,
        producer_id = decided.producer_id,
        transaction = decided.number,
        commit = decided.commit,
        partitions = decided.partitions.len(),
        groups = decided.groups.len(),
        "transaction finished"
    );
    Ok(())
}

async fn write_marker(
    storage: &dyn Storage,
    topic: &str,
    partition: i32,
    decided: &Decided,
) -> Result<(), StorageError> {
    let known = match storage.topic(topic).await? {
        Some(t) if t.has_partition(partition) => Some(t),
        // Created, or grown, through another gateway since this one's
        // copy was read: the registry says whether the partition is gone
        // (deleted: no marker) before it is skipped, which would leave its
        // transaction open for good.
        _ => storage.topic_fresh(topic).await?,
    };
    match known {
        Some(t) => storage.write_marker(&t, partition, decided).await.map(|_| ()),
        None => Ok(()),
    }
}

/// Counts a finished transaction (`ketch_transactions_total{outcome}`).
pub fn count(outcome: &'static str) {
    metrics::counter!("ketch_transactions_total", "outcome" => outcome).increment(1);
}

/// Until shutdown, every `transactions.abort_check_interval`: the ids due
/// for a look that this gateway coordinates — open transactions past
/// their timeout are aborted (their producers fenced), decisions left
/// unfinished are finished.
pub async fn sweep(ctx: Arc<Context>) {
    let mut shutdown = ctx.shutdown.clone();
    let every = ctx.settings.transactions.abort_check_interval.get();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Idle ids whose state expired are dropped from the index a tenth of
    // `transactions.id_expiration` after, at most an hour.
    // (Not `clamp`: it panics when `every` is above the hour.)
    let clean_every = (ctx.settings.transactions.id_expiration.get() / 10)
        .min(Duration::from_secs(3600))
        .max(every);
    let mut cleaned = tokio::time::Instant::now();
    // Where the last pass over the idle ids stopped.
    let mut idle_cursor = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        if !ctx.membership.can_coordinate() {
            continue;
        }
        if let Err(e) = sweep_once(&ctx).await {
            tracing::debug!(error = %e, "transaction sweep failed");
        }
        if cleaned.elapsed() >= clean_every {
            cleaned = tokio::time::Instant::now();
            if let Err(e) = forget_expired(&ctx, &mut idle_cursor).await {
                tracing::debug!(error = %e, "cannot drop expired transactional ids");
            }
        }
    }
}

/// Drops from the index the idle ids this gateway coordinates whose state
/// expired (`transactions.id_expiration`), a page at a time: an id that
/// never opens a transaction again is never due again, so the sweep alone
/// would keep it listed for ever (and ListTransactions would read it).
/// An idle id whose transaction is open or being decided lost its look (a
/// gateway killed between the add that opened it and its schedule, racing
/// the sweep's move of the id to idle): it is looked at now, or it would
/// never be aborted and its partitions' last stable offset stay pinned.
///
/// A pass reads at most [`SWEEP_PAGES`] pages and starts where the last
/// one stopped (`cursor`, its position among the idle ids), going back to
/// the first only once a pass reached the end: however many live ids sort
/// before an expired one (a workload that uses a new transactional id per
/// checkpoint keeps hundreds of thousands live), passes come round to it.
async fn forget_expired(ctx: &Context, cursor: &mut usize) -> Result<(), StorageError> {
    let mut kept = *cursor;
    let reached = forget_expired_from(ctx, &mut kept).await;
    // The next pass goes on from where this one stopped, or past the id
    // it failed at (one id whose state cannot be read must neither send
    // every pass back to the start nor stop them all there), or from the
    // first id once this one reached the end.
    *cursor = match &reached {
        Ok(true) => 0,
        Ok(false) => kept,
        Err(_) => kept + 1,
    };
    reached.map(|_| ())
}

/// [`forget_expired`]'s pass from position `kept`, which it moves along;
/// whether it reached the end of the idle ids.
async fn forget_expired_from(ctx: &Context, kept: &mut usize) -> Result<bool, StorageError> {
    for _ in 0..SWEEP_PAGES {
        let ids = ctx.storage.txn_idle_ids(*kept, SWEEP_BATCH).await?;
        let page = ids.len();
        for id in ids {
            let mine = ctx.membership.transaction_coordinator(&id).id == ctx.membership.my_id();
            if !mine {
                *kept += 1;
                continue;
            }
            match ctx.storage.txn_describe(&id).await? {
                None => ctx.storage.txn_forget(&id).await?,
                Some(state) if state.is_open() => {
                    tracing::warn!(transactional_id = %id, state = %state.state,
                        "an open transaction had no look scheduled; looking at it now");
                    ctx.storage.txn_schedule(&id, ketch_storage::now_ms()).await?;
                }
                Some(_) => *kept += 1,
            }
        }
        if page < SWEEP_BATCH {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Looks at every due id this gateway coordinates, a page at a time: the
/// ids it looked at leave the due ones (their scores move on), those it
/// skips (another gateway's) or cannot finish stay, and the next page
/// starts after them — so neither ids that keep failing nor other
/// gateways' ids, however many, keep this one's from being looked at.
async fn sweep_once(ctx: &Context) -> Result<(), StorageError> {
    let now = ketch_storage::now_ms();
    let mut stayed = 0;
    // Ids looked at in this sweep: one still due after its look (a clock
    // ahead of Redis's) counts as staying when it comes round again.
    let mut looked = std::collections::HashSet::new();
    for _ in 0..SWEEP_PAGES {
        let due = ctx.storage.txn_due(now, stayed, SWEEP_BATCH).await?;
        let page = due.len();
        for (id, seen) in due {
            if ctx.membership.transaction_coordinator(&id).id != ctx.membership.my_id()
                || !looked.insert(id.clone())
            {
                stayed += 1;
                continue;
            }
            // One id that cannot be finished yet (a shard whose replicas
            // do not confirm its markers) must not hold up the others: it
            // stays due and is tried again next round.
            if let Err(e) = look_at(ctx, &id, seen).await {
                stayed += 1;
                tracing::warn!(transactional_id = %id, error = %e, "cannot finish a transaction yet; will retry");
            }
        }
        if page < SWEEP_BATCH {
            break;
        }
    }
    Ok(())
}

/// The sweeper's look at one due id.
async fn look_at(ctx: &Context, id: &str, seen: f64) -> Result<(), StorageError> {
    let grace = FINISH_GRACE.as_millis() as i64;
    match ctx.storage.txn_expire(id, seen, grace, id_ttl_ms(ctx)).await? {
        TxnReply::Finish(decided) => {
            if decided.commit {
                tracing::info!(transactional_id = %id, "finishing a commit another gateway left unfinished");
            } else {
                tracing::info!(transactional_id = %id, producer_id = decided.producer_id,
                    "aborting a transaction (past its timeout, or left unfinished)");
            }
            finish(ctx.storage.as_ref(), Kept::of(ctx), id, &decided).await?;
            count(if decided.commit {
                "coordinator_commit"
            } else {
                "coordinator_abort"
            });
        }
        TxnReply::Idle if ctx.storage.txn_describe(id).await?.is_none() => {
            ctx.storage.txn_forget(id).await?;
        }
        _ => {}
    }
    Ok(())
}

/// Whether offsets of group `group` may be committed in a transaction. An
/// empty id (Kafka: INVALID_GROUP_ID), or one that starts with `}`: its
/// keys' hash tag (`{<group>}`) would be empty, their slots in a Redis
/// Cluster would differ, and the script that applies a transaction's
/// offsets, which takes both, would fail at every finish of it.
pub fn transactional_group(group: &str) -> bool {
    ketch_storage::groups::group_keys_share_a_slot(group)
}

/// The Kafka error for a storage failure in a coordinator API (the
/// transaction APIs, and the group APIs' offsets). As Kafka's coordinators
/// answer when their log write fails (`CoordinatorOperationExceptionHelper`),
/// a write that is not confirmed by the replicas acks=all waits for, or a
/// Redis that cannot be reached, is COORDINATOR_NOT_AVAILABLE: the client
/// looks the coordinator up again and retries (a decision written but
/// unconfirmed stands, and the retry finds it). KAFKA_STORAGE_ERROR, which
/// other APIs answer, is fatal to the Java consumer's commits and fetches
/// of offsets.
pub fn coordinator_error(e: &StorageError) -> i16 {
    match e {
        StorageError::NotEnoughReplicasAfterAppend { .. } | StorageError::Unavailable(_) => {
            tracing::debug!(error = %e, "transaction state not written");
            kafka_protocol::error::ResponseError::CoordinatorNotAvailable.code()
        }
        _ => crate::api::error_code(e),
    }
}

/// The Kafka error for a refusal of the coordinator's script; `fenced_from`
/// is the first version of the API that knows PRODUCER_FENCED (KIP-588),
/// older ones get INVALID_PRODUCER_EPOCH.
pub fn refusal(reply: &TxnReply, version: i16, fenced_from: i16) -> kafka_protocol::error::ResponseError {
    use kafka_protocol::error::ResponseError;
    match reply {
        TxnReply::Concurrent => ResponseError::ConcurrentTransactions,
        TxnReply::Mapping => ResponseError::InvalidProducerIdMapping,
        TxnReply::Fenced if version >= fenced_from => ResponseError::ProducerFenced,
        TxnReply::Fenced => ResponseError::InvalidProducerEpoch,
        TxnReply::InvalidState => ResponseError::InvalidTxnState,
        _ => ResponseError::UnknownServerError,
    }
}
