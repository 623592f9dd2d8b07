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
//! done again.

use std::sync::Arc;
use std::time::Duration;

use ketch_storage::{Decided, StorageError, TxnReply};

use crate::Context;

/// How long a decided transaction may stay unfinished before its
/// coordinator finishes it in place of the gateway that decided it.
pub const FINISH_GRACE: Duration = Duration::from_secs(2);

/// Transactional ids looked at per sweep round.
const SWEEP_BATCH: usize = 100;

/// `transactions.id_expiration` in ms, the TTL of an id's state.
pub fn id_ttl_ms(ctx: &Context) -> i64 {
    i64::try_from(ctx.settings.transactions.id_expiration.get().as_millis()).unwrap_or(i64::MAX)
}

/// Writes a decided transaction's markers and offsets, then marks it
/// complete. Partitions of topics deleted since are skipped.
pub async fn finish(ctx: &Context, id: &str, decided: &Decided) -> Result<(), StorageError> {
    let mut markers = Vec::with_capacity(decided.partitions.len());
    for (topic, partition) in &decided.partitions {
        markers.push(write_marker(ctx, topic, *partition, decided));
    }
    for result in crate::api::each(markers).await {
        result?;
    }
    for group in &decided.groups {
        ctx.storage.apply_txn_offsets(group, decided).await?;
    }
    ctx.storage
        .txn_complete(id, decided.number, id_ttl_ms(ctx))
        .await?;
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
    ctx: &Context,
    topic: &str,
    partition: i32,
    decided: &Decided,
) -> Result<(), StorageError> {
    match ctx.storage.topic(topic).await? {
        Some(t) => ctx.storage.write_marker(&t, partition, decided).await.map(|_| ()),
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
    }
}

async fn sweep_once(ctx: &Context) -> Result<(), StorageError> {
    let due = ctx.storage.txn_due(ketch_storage::now_ms(), SWEEP_BATCH).await?;
    for (id, seen) in due {
        if ctx.membership.transaction_coordinator(&id).id != ctx.membership.my_id() {
            continue;
        }
        // One id that cannot be finished yet (a shard whose replicas do
        // not confirm its markers) must not hold up the others: it stays
        // due and is tried again next round.
        if let Err(e) = look_at(ctx, &id, seen).await {
            tracing::warn!(transactional_id = %id, error = %e, "cannot finish a transaction yet; will retry");
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
            finish(ctx, id, &decided).await?;
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
