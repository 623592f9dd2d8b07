//! Kafka transactions (KIP-98) on Redis.
//!
//! - The coordinator's state of each transactional id is one hash,
//!   `ketch:txn:{ID}`, changed only by `scripts/txn.lua`: any gateway can
//!   serve any id, and the decision to commit or abort (the state becoming
//!   PrepareCommit or PrepareAbort) is the commit point.
//! - `ketch:transactions` (sorted set) lists every transactional id, scored
//!   by when a gateway must look at it next: an open transaction's timeout,
//!   a decision not yet finished, or never (idle ids).
//! - Each partition of a transaction is told of it first (`txn_join.lua`:
//!   the producer may now write transactional batches there), and after the
//!   decision gets a marker through the append script, which moves the
//!   partition's last stable offset and indexes aborted transactions.
//! - Offsets committed in a transaction are staged under the group's hash
//!   tag (`txn_offsets.lua`) and applied after the decision.
//!
//! Nothing here needs two hash tags at once: on a Redis Cluster the
//! transaction's partitions and groups may live on any masters. Markers
//! and offsets are written after the decision, each idempotently, and
//! retried until done (by another gateway, should this one die).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use redis::{AsyncCommands, Value};

use crate::batch::transaction_marker;
use crate::groups::{TopicPartition, retention_ms};
use crate::log::append_keys;
use crate::{CommittedOffset, ProducerSummary, Result, StorageError, Store, Topic, decode_producer_state};

/// A decided transaction, to be finished: markers to its partitions,
/// offsets to its groups, then `complete`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub producer_id: i64,
    /// The epoch the markers carry (bumped when the abort fences the producer).
    pub epoch: i16,
    /// The transaction's number (per transactional id).
    pub number: i64,
    pub commit: bool,
    pub partitions: Vec<TopicPartition>,
    pub groups: Vec<String>,
}

/// The coordinator's state of a transactional id (`ketch:txn:{ID}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnState {
    pub producer_id: i64,
    pub epoch: i16,
    /// Kafka's name of the state: Empty, Ongoing, PrepareCommit, …
    pub state: String,
    pub timeout_ms: i64,
    /// When the open (or deciding) transaction began (Redis time, ms).
    pub started_ms: Option<i64>,
    /// The number of the id's latest transaction.
    pub number: i64,
    /// The open or deciding transaction's partitions and groups.
    pub partitions: Vec<TopicPartition>,
    pub groups: Vec<String>,
}

impl TxnState {
    /// A transaction is open or being decided.
    pub fn is_open(&self) -> bool {
        self.state == "Ongoing" || self.state.starts_with("Prepare")
    }

    fn parse(fields: &HashMap<String, String>) -> Self {
        let int = |name: &str| fields.get(name).and_then(|v| v.parse::<i64>().ok());
        let json = |name: &str| fields.get(name).map_or("[]", String::as_str).to_owned();
        Self {
            producer_id: int("pid").unwrap_or(-1),
            epoch: int("epoch").and_then(|e| i16::try_from(e).ok()).unwrap_or(-1),
            state: fields.get("state").cloned().unwrap_or_default(),
            timeout_ms: int("timeout_ms").unwrap_or(0),
            started_ms: int("started_ms"),
            number: int("n").unwrap_or(0),
            partitions: serde_json::from_str(&json("partitions")).unwrap_or_default(),
            groups: serde_json::from_str(&json("groups")).unwrap_or_default(),
        }
    }
}

/// What the coordinator's script answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnReply {
    /// InitProducerId: the producer's id and epoch.
    Producer { producer_id: i64, epoch: i16 },
    /// InitProducerId: call again with a fresh producer id.
    NeedProducerId,
    /// A decided transaction is being finished (CONCURRENT_TRANSACTIONS).
    Concurrent,
    /// The producer id is not the transactional id's (INVALID_PRODUCER_ID_MAPPING).
    Mapping,
    /// The producer's epoch is not the current one (PRODUCER_FENCED).
    Fenced,
    /// No transaction in the state the request needs (INVALID_TXN_STATE).
    InvalidState,
    /// EndTxn: the same decision was finished already.
    Done,
    /// A transaction to finish.
    Finish(Decided),
    /// Add: the open transaction's number and deadline (ms, Redis time);
    /// `opened` when this call began it.
    Added {
        number: i64,
        deadline_ms: i64,
        opened: bool,
    },
    /// Expire: still open, look again at this time.
    Open { deadline_ms: i64 },
    /// Expire: nothing to do.
    Idle,
}

/// What AddPartitionsToTxn's registration with a partition answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinReply {
    Joined,
    NoPartition,
    /// The partition knows a newer epoch of the producer.
    StaleEpoch,
    /// An earlier transaction of the producer still waits for its marker there.
    Pending,
    /// The transaction (or a later one) was registered or ended there
    /// already: a late registration, refused.
    Ended,
}

/// The kind of item a transaction is extended by.
#[derive(Debug, Clone, Copy)]
pub enum TxnItems {
    Partitions,
    Groups,
}

/// The `ketch:transactions` score of an id nothing is due for.
const IDLE_SCORE: f64 = 9.0e15;

fn bad(what: &str, v: &Value) -> StorageError {
    StorageError::Data(format!("transaction script: {what}: {v:?}"))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        _ => text(v)?.parse().ok(),
    }
}

/// Whether a reply of `scripts/txn.lua` follows a write: refusals and
/// looks that found nothing to do change nothing.
fn changes_state(v: &Value) -> bool {
    match v {
        Value::Int(n) => *n == 1,
        Value::Array(items) => !matches!(
            items.first().and_then(text).as_deref(),
            Some("need_pid" | "concurrent" | "mapping" | "fenced" | "invalid_state" | "open" | "idle") | None
        ),
        _ => true,
    }
}

fn parse_reply(v: Value) -> Result<TxnReply> {
    let Value::Array(items) = &v else {
        return Err(bad("not an array", &v));
    };
    let tag = items.first().and_then(text).ok_or_else(|| bad("no tag", &v))?;
    let at = |i: usize| items.get(i).and_then(int).ok_or_else(|| bad("a number", &v));
    Ok(match tag.as_str() {
        "ok" => TxnReply::Producer {
            producer_id: at(1)?,
            epoch: i16::try_from(at(2)?).map_err(|_| bad("epoch", &v))?,
        },
        "need_pid" => TxnReply::NeedProducerId,
        "concurrent" => TxnReply::Concurrent,
        "mapping" => TxnReply::Mapping,
        "fenced" => TxnReply::Fenced,
        "invalid_state" => TxnReply::InvalidState,
        "done" => TxnReply::Done,
        "idle" => TxnReply::Idle,
        "open" => TxnReply::Open { deadline_ms: at(1)? },
        "added" => TxnReply::Added {
            number: at(1)?,
            deadline_ms: at(2)?,
            opened: at(3)? == 1,
        },
        "finish" => {
            let json = |i: usize| items.get(i).and_then(text).ok_or_else(|| bad("JSON", &v));
            let partitions: Vec<(String, i32)> = serde_json::from_str(&json(5)?)
                .map_err(|e| StorageError::Data(format!("txn partitions: {e}")))?;
            let groups: Vec<String> = serde_json::from_str(&json(6)?)
                .map_err(|e| StorageError::Data(format!("txn groups: {e}")))?;
            TxnReply::Finish(Decided {
                producer_id: at(1)?,
                epoch: i16::try_from(at(2)?).map_err(|_| bad("epoch", &v))?,
                number: at(3)?,
                commit: json(4)? == "commit",
                partitions,
                groups,
            })
        }
        _ => return Err(bad("unknown tag", &v)),
    })
}

impl Store {
    fn txn_key(&self, id: &str) -> String {
        format!("{}:txn:{{{id}}}", self.keys.namespace())
    }

    fn txn_index_key(&self) -> String {
        format!("{}:transactions", self.keys.namespace())
    }

    pub(crate) fn group_txn_offsets_key(&self, group: &str) -> String {
        format!("{}:group:{{{group}}}:txn-offsets", self.keys.namespace())
    }

    async fn txn_script(&self, id: &str, op: &str, expiration_ms: i64, args: &[String]) -> Result<Value> {
        let (reply, confirmed) = self.txn_script_unconfirmed(id, op, expiration_ms, args).await?;
        confirmed?;
        Ok(reply)
    }

    /// [`Store::txn_script`]'s reply, and apart from it whether the
    /// replicas acks=all waits for confirmed the write.
    async fn txn_script_unconfirmed(
        &self,
        id: &str,
        op: &str,
        expiration_ms: i64,
        args: &[String],
    ) -> Result<(Value, Result<()>)> {
        let key = self.txn_key(id);
        let mut invocation = self.scripts.txn.key(&key);
        invocation.arg(op).arg(expiration_ms);
        for arg in args {
            invocation.arg(arg);
        }
        self.invoke_unconfirmed(&key, &invocation, changes_state).await
    }

    /// Runs a script that changes transaction state. With acks=all waiting
    /// for replicas (or fsync), the change is made as durable as an acks=all
    /// batch before the caller answers: written on a connection of the
    /// durable pool, then WAITed there — as Kafka writes its transaction
    /// and offsets logs with acks=all. A decision a failover lost could
    /// otherwise be answered as committed and then aborted.
    /// A refusal, which changed nothing, is answered without waiting
    /// (`wrote` tells them apart).
    pub(crate) async fn invoke_durably<T: redis::FromRedisValue>(
        &self,
        key: &str,
        invocation: &redis::ScriptInvocation<'_>,
        wrote: fn(&Value) -> bool,
    ) -> Result<T> {
        let (reply, confirmed) = self.invoke_unconfirmed(key, invocation, wrote).await?;
        confirmed?;
        redis::from_redis_value(reply).map_err(|e| StorageError::Data(format!("script reply: {e}")))
    }

    /// [`Store::invoke_durably`]'s reply, and apart from it the WAIT's
    /// outcome. In cluster mode a master that lost the slot refuses the
    /// script unrun (MOVED): it goes to the new master, as appends do
    /// ([`Store::retry_after`]).
    pub(crate) async fn invoke_unconfirmed(
        &self,
        key: &str,
        invocation: &redis::ScriptInvocation<'_>,
        wrote: fn(&Value) -> bool,
    ) -> Result<(Value, Result<()>)> {
        if !self.durability.waits() {
            return Ok((invocation.invoke_async(&mut self.conn()).await?, Ok(())));
        }
        let mut attempt = 0;
        loop {
            let durable = self.durable.get(key).await?;
            let mut conn = durable.conn();
            match invocation.invoke_async::<Value>(&mut conn).await {
                Ok(reply) => {
                    let confirmed = if wrote(&reply) {
                        self.confirm(durable).await
                    } else {
                        Ok(())
                    };
                    return Ok((reply, confirmed));
                }
                Err(e) => {
                    drop(durable);
                    let e = StorageError::from(e);
                    if !self.retry_after(&e, &mut attempt).await? {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Waits until the replicas (or the AOF) confirmed what `durable`
    /// wrote; the slot map is read again when they did not answer (a
    /// failover may be under way).
    async fn confirm(&self, durable: crate::durable::Durable) -> Result<()> {
        let confirmed = self.wait_durable_on(durable).await;
        if let Err(StorageError::Unavailable(_)) = &confirmed {
            self.refresh_slot_map().await;
        }
        confirmed
    }

    /// Runs `pipe` (commands on `key`'s slot only) as durably as an
    /// acks=all batch when acks=all waits for replicas (or fsync): on a
    /// connection of the durable pool, then WAITed there, following a moved
    /// slot as appends do. Otherwise on the shared connection.
    pub(crate) async fn query_durably<T: redis::FromRedisValue>(
        &self,
        key: &str,
        pipe: &redis::Pipeline,
    ) -> Result<T> {
        let (reply, confirmed) = self.query_unconfirmed(key, pipe).await?;
        confirmed.map(|()| reply)
    }

    /// [`Store::query_durably`]'s reply, and apart from it the WAIT's
    /// outcome. The loop of [`Store::invoke_unconfirmed`] for a pipeline
    /// (one generic over an async closure makes the callers' futures lose
    /// `Send`).
    pub(crate) async fn query_unconfirmed<T: redis::FromRedisValue>(
        &self,
        key: &str,
        pipe: &redis::Pipeline,
    ) -> Result<(T, Result<()>)> {
        if !self.durability.waits() {
            return Ok((pipe.query_async(&mut self.conn()).await?, Ok(())));
        }
        let mut attempt = 0;
        loop {
            let durable = self.durable.get(key).await?;
            let mut conn = durable.conn();
            match pipe.query_async::<T>(&mut conn).await {
                Ok(reply) => return Ok((reply, self.confirm(durable).await)),
                Err(e) => {
                    drop(durable);
                    let e = StorageError::from(e);
                    if !self.retry_after(&e, &mut attempt).await? {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// A change of what operators configure (credentials, ACLs, quotas,
    /// cluster-wide configs),
    /// made as [`Store::invoke_durably`] makes it but not failed when the
    /// replicas do not confirm it: as Kafka's controller quorum is apart
    /// from its data replicas, these stay available while replicas are
    /// down (the change stands, unconfirmed, and is logged).
    pub(crate) async fn invoke_configured<T: redis::FromRedisValue>(
        &self,
        key: &str,
        invocation: &redis::ScriptInvocation<'_>,
        wrote: fn(&Value) -> bool,
    ) -> Result<T> {
        let (reply, confirmed) = self.invoke_unconfirmed(key, invocation, wrote).await?;
        if let Err(e) = confirmed {
            tracing::warn!(%key, error = %e, "a configuration change is not confirmed by Redis replicas");
        }
        redis::from_redis_value(reply).map_err(|e| StorageError::Data(format!("script reply: {e}")))
    }

    /// [`Store::invoke_configured`] for a pipeline.
    pub(crate) async fn query_configured<T: redis::FromRedisValue>(
        &self,
        key: &str,
        pipe: &redis::Pipeline,
    ) -> Result<T> {
        let (reply, confirmed) = self.query_unconfirmed(key, pipe).await?;
        if let Err(e) = confirmed {
            tracing::warn!(%key, error = %e, "a configuration change is not confirmed by Redis replicas");
        }
        Ok(reply)
    }

    /// InitProducerId for a transactional id (see `scripts/txn.lua`):
    /// `fresh` is a new producer id for the script to use when it needs one
    /// (-1: none yet); `named` the id and epoch the request names (KIP-360).
    pub async fn txn_init(
        &self,
        id: &str,
        timeout_ms: i64,
        fresh: i64,
        named: (i64, i16),
        expiration_ms: i64,
    ) -> Result<TxnReply> {
        let args = [
            timeout_ms.to_string(),
            fresh.to_string(),
            named.0.to_string(),
            named.1.to_string(),
        ];
        let (reply, confirmed) = self
            .txn_script_unconfirmed(id, "init", expiration_ms, &args)
            .await?;
        let reply = parse_reply(reply)?;
        match reply {
            TxnReply::Producer { .. } => self.txn_list(id).await?,
            // The open transaction is aborted (its producer fenced): due
            // at once, should this gateway not finish it — even when the
            // decision is written but not confirmed, or the client's
            // retries would wait (CONCURRENT_TRANSACTIONS) for the old
            // transaction's deadline.
            TxnReply::Finish(_) => self.txn_schedule(id, crate::now_ms()).await?,
            _ => {}
        }
        confirmed?;
        Ok(reply)
    }

    /// Adds partitions or groups to the producer's transaction, opening
    /// one if none is. The caller schedules the transaction's deadline
    /// ([`Store::txn_schedule_deadline`]) before answering, while it tells
    /// the partitions.
    pub async fn txn_add(
        &self,
        id: &str,
        producer: (i64, i16),
        kind: TxnItems,
        items: &serde_json::Value,
        expiration_ms: i64,
    ) -> Result<TxnReply> {
        let kind = match kind {
            TxnItems::Partitions => "partitions",
            TxnItems::Groups => "groups",
        };
        let args = [
            producer.0.to_string(),
            producer.1.to_string(),
            kind.to_owned(),
            items.to_string(),
        ];
        let (reply, confirmed) = self
            .txn_script_unconfirmed(id, "add", expiration_ms, &args)
            .await?;
        let reply = parse_reply(reply)?;
        if confirmed.is_err()
            && let TxnReply::Added {
                deadline_ms, opened, ..
            } = reply
        {
            // Written but not confirmed: the transaction may be open all the
            // same (the client will likely retry, but need not), so its
            // deadline is scheduled, or nothing would ever time it out.
            if let Err(e) = self.txn_schedule_deadline(id, deadline_ms, opened).await {
                tracing::debug!(transactional_id = id, error = %e, "cannot schedule a transaction's deadline");
            }
        }
        confirmed?;
        Ok(reply)
    }

    /// EndTxn: decides the producer's transaction. The caller schedules a
    /// look at it (should the decision be left unfinished) while it
    /// finishes it.
    pub async fn txn_end(
        &self,
        id: &str,
        producer: (i64, i16),
        commit: bool,
        expiration_ms: i64,
    ) -> Result<TxnReply> {
        let args = [
            producer.0.to_string(),
            producer.1.to_string(),
            if commit { "commit" } else { "abort" }.to_owned(),
        ];
        parse_reply(self.txn_script(id, "end", expiration_ms, &args).await?)
    }

    /// Marks a decided transaction finished (its markers and offsets are
    /// written): the producer may begin the next one.
    pub async fn txn_complete(&self, id: &str, number: i64, expiration_ms: i64) -> Result<bool> {
        let value = self
            .txn_script(id, "complete", expiration_ms, &[number.to_string()])
            .await?;
        // The id stays due: the sweeper finds it finished and marks it idle.
        Ok(matches!(value, Value::Int(1)))
    }

    /// The sweeper's look at one id it found due with score `seen`: aborts
    /// an open transaction past its timeout (fencing its producer), or
    /// hands back a decision left unfinished for `grace_ms`; otherwise
    /// moves the id's score to when it is due next (unless a request moved
    /// it meanwhile).
    pub async fn txn_expire(
        &self,
        id: &str,
        seen: f64,
        grace_ms: i64,
        expiration_ms: i64,
    ) -> Result<TxnReply> {
        let value = self
            .txn_script(id, "expire", expiration_ms, &[grace_ms.to_string()])
            .await?;
        let reply = match &value {
            // The id expired (transactional.id.expiration.ms): forget it.
            Value::Array(items) if items.is_empty() => TxnReply::Idle,
            _ => parse_reply(value)?,
        };
        let next = match &reply {
            TxnReply::Open { deadline_ms } => Some(*deadline_ms as f64),
            TxnReply::Idle => Some(IDLE_SCORE),
            _ => None,
        };
        if let Some(next) = next {
            let _: i64 = self
                .scripts
                .txn_index
                .key(self.txn_index_key())
                .arg(id)
                .arg(seen)
                .arg(next)
                .invoke_async(&mut self.conn())
                .await?;
        }
        Ok(reply)
    }

    /// The coordinator's state of a transactional id (`None`: unknown).
    pub async fn txn_describe(&self, id: &str) -> Result<Option<TxnState>> {
        let fields: HashMap<String, String> = self.conn().hgetall(self.txn_key(id)).await?;
        Ok((!fields.is_empty()).then(|| TxnState::parse(&fields)))
    }

    /// [`Store::txn_describe`] of each of `ids`, in their order, read a few
    /// hundred per round trip (ListTransactions names every id, and a
    /// workload that takes a new id per checkpoint keeps a great many).
    pub async fn txn_describe_many(&self, ids: &[String]) -> Result<Vec<Option<TxnState>>> {
        const PER_ROUND_TRIP: usize = 500;
        let mut states = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(PER_ROUND_TRIP) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.hgetall(self.txn_key(id));
            }
            let replies: Vec<HashMap<String, String>> = pipe.query_async(&mut self.conn()).await?;
            states.extend(
                replies
                    .into_iter()
                    .map(|fields| (!fields.is_empty()).then(|| TxnState::parse(&fields))),
            );
        }
        Ok(states)
    }

    /// Has a gateway look at `id` at `due_ms` at the latest (an earlier
    /// time already scheduled stays: ZADD LT only lowers a score). For an
    /// id a script just answered for (it has state).
    pub async fn txn_schedule(&self, id: &str, due_ms: i64) -> Result<()> {
        self.zadd_index(id, due_ms as f64, &["LT"]).await
    }

    /// [`Store::txn_schedule`] for an id that is listed already: a request
    /// naming an id that has no state adds nothing (EndTxn schedules its
    /// look beside the decision, before it knows).
    pub async fn txn_schedule_if_listed(&self, id: &str, due_ms: i64) -> Result<()> {
        self.zadd_index(id, due_ms as f64, &["XX", "LT"]).await
    }

    /// ZADD of `id` to `ketch:transactions` with `flags` (NX, XX, LT). As
    /// durable as an acks=all batch when acks=all waits: the sweeper finds
    /// what to abort or finish only through this index, and in a cluster
    /// its master is not the transaction state's, so a failover could take
    /// an open transaction's deadline back and leave it open for ever.
    /// Written even when that master is full (`oom_command.lua`).
    async fn zadd_index(&self, id: &str, score: f64, flags: &[&str]) -> Result<()> {
        let key = self.txn_index_key();
        let mut invocation = self.oom_command(&key, "ZADD");
        invocation.arg(flags).arg(score).arg(id);
        let _: i64 = self.invoke_durably(&key, &invocation, |_| true).await?;
        Ok(())
    }

    /// Schedules the open transaction's deadline after an add
    /// ([`TxnReply::Added`]). The add that opened the transaction sets the
    /// score outright: whatever was due before belonged to the previous,
    /// finished transaction, and a sweeper that saw that score then
    /// (raising it to idle by compare-and-set) must find it changed. Later
    /// adds only lower it.
    pub async fn txn_schedule_deadline(&self, id: &str, deadline_ms: i64, opened: bool) -> Result<()> {
        let flags: &[&str] = if opened { &[] } else { &["LT"] };
        self.zadd_index(id, deadline_ms as f64, flags).await
    }

    /// Lists `id` in the index (idle) unless it is there already.
    async fn txn_list(&self, id: &str) -> Result<()> {
        self.zadd_index(id, IDLE_SCORE, &["NX"]).await
    }

    /// Transactional ids due for a look at `now_ms` with their scores, at
    /// most `limit`.
    pub async fn txn_due(&self, now_ms: i64, offset: usize, limit: usize) -> Result<Vec<(String, f64)>> {
        self.index_range("-inf", now_ms, offset, limit).await
    }

    /// `limit` ids of `ketch:transactions` with scores in `min..=max`, from
    /// `offset`, with their scores.
    async fn index_range(
        &self,
        min: impl redis::ToRedisArgs,
        max: impl redis::ToRedisArgs,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<(String, f64)>> {
        Ok(redis::cmd("ZRANGEBYSCORE")
            .arg(self.txn_index_key())
            .arg(min)
            .arg(max)
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(offset)
            .arg(limit)
            .query_async(&mut self.conn())
            .await?)
    }

    /// Every transactional id listed, with the time it is due (`None`: idle).
    pub async fn txn_ids(&self) -> Result<Vec<(String, Option<i64>)>> {
        let ids: Vec<(String, f64)> = self.conn().zrange_withscores(self.txn_index_key(), 0, -1).await?;
        Ok(ids
            .into_iter()
            .map(|(id, score)| (id, (score < IDLE_SCORE).then_some(score as i64)))
            .collect())
    }

    /// Idle transactional ids (nothing open or deciding), `limit` of them
    /// from `offset`.
    pub async fn txn_idle_ids(&self, offset: usize, limit: usize) -> Result<Vec<String>> {
        let ids = self.index_range(IDLE_SCORE, "+inf", offset, limit).await?;
        Ok(ids.into_iter().map(|(id, _)| id).collect())
    }

    /// Forgets a transactional id whose state expired, unless its score
    /// moved from idle meanwhile (a new producer of the id opened a
    /// transaction and scheduled its deadline).
    pub async fn txn_forget(&self, id: &str) -> Result<()> {
        let _: i64 = self
            .scripts
            .txn_index
            .key(self.txn_index_key())
            .arg(id)
            .arg(IDLE_SCORE)
            .arg("forget")
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    /// Tells a partition of the producer's transaction `number`: from now
    /// on it takes the producer's transactional batches of `epoch`.
    pub async fn txn_join(
        &self,
        topic: &Topic,
        partition: i32,
        producer: (i64, i16),
        number: i64,
    ) -> Result<JoinReply> {
        if !topic.has_partition(partition) {
            return Ok(JoinReply::NoPartition);
        }
        let keys = self.partition_keys(topic, partition);
        let reply: String = self
            .scripts
            .txn_join
            .key(&keys.meta)
            .key(&keys.producers)
            .arg(producer.0)
            .arg(producer.1)
            .arg(number)
            .arg(self.compact_producers_arg())
            .invoke_async(&mut self.conn())
            .await?;
        Ok(match reply.as_str() {
            "ok" => JoinReply::Joined,
            "no_partition" => JoinReply::NoPartition,
            "stale_epoch" => JoinReply::StaleEpoch,
            "pending" => JoinReply::Pending,
            "ended" => JoinReply::Ended,
            other => return Err(StorageError::Data(format!("txn_join replied {other}"))),
        })
    }

    /// Writes the marker of a decided transaction to one of its
    /// partitions (nothing when the transaction stored nothing there, or a
    /// marker was written already); true when one was written. Wakes the
    /// partition's fetches: its last stable offset moved.
    pub async fn write_marker(&self, topic: &Topic, partition: i32, decided: &Decided) -> Result<bool> {
        if !topic.has_partition(partition) {
            return Ok(false);
        }
        let keys = self.partition_keys(topic, partition);
        let now = crate::now_ms();
        let marker = transaction_marker(decided.producer_id, decided.epoch, decided.commit, 0, now);
        let since = self.wake.generation(&keys.wake);
        let mut invocation = self.scripts.append.prepare_invoke();
        for key in append_keys(keys) {
            invocation.key(key);
        }
        invocation
            .arg("marker")
            .arg(-1)
            .arg(1)
            .arg(now)
            .arg(&keys.wake)
            .arg(crate::log::TIME_INDEX_INTERVAL_BYTES)
            .arg(marker.len())
            .arg(decided.producer_id)
            .arg(decided.epoch)
            .arg(decided.number)
            .arg(if decided.commit { "commit" } else { "abort" })
            .arg(self.compact_producers_arg())
            .arg(&marker[..]);
        // With acks=all waiting for replicas (or fsync), a marker is made as
        // durable as the data it decides, before the transaction completes
        // (a marker an earlier try wrote is found ended, and the producer's
        // state written again, so the WAIT covers that write too).
        let reply: Value = self.invoke_durably(&keys.meta, &invocation, |_| true).await?;
        let Value::Array(items) = &reply else {
            return Err(bad("marker reply", &reply));
        };
        match items.first().and_then(text).as_deref() {
            Some("stored") => {
                let base = items
                    .get(1)
                    .and_then(int)
                    .ok_or_else(|| bad("marker offset", &reply))?;
                let log_start = items.get(2).and_then(int);
                self.appenders.written_at(&keys.meta, base).await;
                self.wake.wrote(&keys.wake, since, Some(base + 1), log_start);
                Ok(true)
            }
            Some("skipped") => Ok(false),
            Some("no_partition") => Ok(false),
            _ => Err(bad("marker reply", &reply)),
        }
    }

    /// The aborted transactions whose data may lie in `[from, to]` of a
    /// partition: (producer id, first offset), oldest first — what a
    /// read_committed Fetch returns so clients drop those records.
    /// `span` is the partition's [`crate::PartitionOffsets::aborted_span`]:
    /// only markers up to `to + span` are read.
    pub async fn aborted_transactions(
        &self,
        topic: &Topic,
        partition: i32,
        (from, to): (i64, i64),
        span: i64,
    ) -> Result<Vec<(i64, i64)>> {
        let mut aborted: Vec<(i64, i64)> = self
            .aborted_ranges(topic, partition, from, to, Some(span))
            .await?
            .into_iter()
            .map(|(pid, first, _)| (pid, first))
            .collect();
        aborted.sort_by_key(|&(_, first)| first);
        Ok(aborted)
    }

    /// The aborted transactions whose data may lie in `[from, to]`, as
    /// (producer id, first offset, abort marker offset): what archiving
    /// filters out. With the partition's `span` (see
    /// [`Store::aborted_transactions`]) only the markers that can belong
    /// to such transactions are read; without, every one from `from` on.
    pub async fn aborted_ranges(
        &self,
        topic: &Topic,
        partition: i32,
        from: i64,
        to: i64,
        span: Option<i64>,
    ) -> Result<Vec<(i64, i64, i64)>> {
        if !topic.has_partition(partition) {
            return Err(StorageError::UnknownTopicOrPartition);
        }
        let keys = self.partition_keys(topic, partition);
        let until = span.map_or_else(|| "+inf".to_owned(), |span| to.saturating_add(span).to_string());
        let members: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
            .arg(&keys.aborted)
            .arg(from)
            .arg(until)
            .arg("WITHSCORES")
            .query_async(&mut self.conn())
            .await?;
        Ok(members
            .iter()
            .filter_map(|(m, marker)| {
                let (pid, first) = m.split_once(':')?;
                Some((pid.parse().ok()?, first.parse().ok()?, *marker as i64))
            })
            .filter(|&(_, first, _)| first <= to)
            .collect())
    }

    /// Every producer a partition keeps state for, by producer id, for
    /// DescribeProducers; a state that decodes as neither encoding of
    /// `scripts/producer_state.lua` is left out.
    pub async fn producer_states(
        &self,
        topic: &Topic,
        partition: i32,
    ) -> Result<Vec<(i64, ProducerSummary)>> {
        if !topic.has_partition(partition) {
            return Err(StorageError::UnknownTopicOrPartition);
        }
        let keys = self.partition_keys(topic, partition);
        let states: HashMap<String, Vec<u8>> = self.conn().hgetall(&keys.producers).await?;
        Ok(states
            .into_iter()
            .filter_map(|(pid, raw)| Some((pid.parse().ok()?, decode_producer_state(&raw)?)))
            .collect())
    }

    /// Stages offsets committed in a transaction (TxnOffsetCommit).
    pub async fn stage_txn_offsets(
        &self,
        group: &str,
        transaction: &StagingTxn<'_>,
        offsets: &[(TopicPartition, CommittedOffset)],
    ) -> Result<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        let mut invocation = self.scripts.txn_offsets.key(self.group_offsets_key(group));
        invocation
            .key(self.group_txn_offsets_key(group))
            .arg("stage")
            .arg(transaction.producer_id)
            .arg(transaction.number)
            .arg(transaction.transactional_id);
        for ((topic, partition), committed) in offsets {
            let json = serde_json::to_string(committed).expect("offset serializes");
            invocation.arg(format!("{topic}:{partition}")).arg(json);
        }
        let _: i64 = self
            .invoke_durably(&self.group_txn_offsets_key(group), &invocation, |_| true)
            .await?;
        // Listed, so that deleting a topic drops the offsets staged for it
        // too (`drop_topic_offsets` walks the listed groups), as Kafka drops
        // a deleted partition's pending transactional offsets.
        self.note_group(group).await?;
        Ok(())
    }

    /// Applies (commit) or drops (abort) the offsets a decided transaction
    /// staged for `group`; applying twice changes nothing. Offsets applied
    /// to a group without members renew their `retention`, as a plain
    /// commit's do.
    pub async fn apply_txn_offsets(&self, group: &str, decided: &Decided, retention: Duration) -> Result<()> {
        let key = self.group_offsets_key(group);
        let mut invocation = self.scripts.txn_offsets.key(&key);
        invocation
            .key(self.group_txn_offsets_key(group))
            .key(self.group_state_key(group))
            .key(self.group_keep_until_key(group))
            .arg("apply")
            .arg(decided.producer_id)
            .arg(decided.number)
            .arg(if decided.commit { "commit" } else { "abort" })
            .arg(retention_ms(retention));
        let applied: i64 = self.invoke_durably(&key, &invocation, |_| true).await?;
        if applied > 0 {
            self.note_group(group).await?;
        }
        Ok(())
    }

    /// The partitions of `group` with offsets staged by a transaction not
    /// yet finished (OffsetFetch's require_stable, KIP-447). Offsets left
    /// staged by a transaction that ended without them (a gateway that
    /// died between staging and its re-check) are removed on the way.
    pub async fn unstable_partitions(&self, group: &str) -> Result<HashSet<TopicPartition>> {
        let staged: HashMap<String, String> = self.conn().hgetall(self.group_txn_offsets_key(group)).await?;
        let mut unstable = HashSet::new();
        let mut states: HashMap<String, Option<TxnState>> = HashMap::new();
        let mut stale = Vec::new();
        for (field, value) in staged {
            if field == APPLIED_FIELD || field == ORDER_FIELD {
                continue;
            }
            let Some(entry) = StagedEntry::parse(&field, &value) else {
                stale.push((field, value));
                continue;
            };
            if !states.contains_key(entry.transactional_id) {
                let state = self.txn_describe(entry.transactional_id).await?;
                states.insert(entry.transactional_id.to_owned(), state);
            }
            // Only the producer's transaction of that number, still open
            // or being decided, keeps them; anything else left them behind.
            let pending = states[entry.transactional_id].as_ref().is_some_and(|state| {
                state.producer_id == entry.producer_id && state.number == entry.number && state.is_open()
            });
            if pending {
                unstable.insert((entry.topic.to_owned(), entry.partition));
            } else {
                stale.push((field, value));
            }
        }
        if !stale.is_empty() {
            let mut invocation = self.scripts.txn_offsets.key(self.group_offsets_key(group));
            invocation.key(self.group_txn_offsets_key(group)).arg("purge");
            for (field, value) in &stale {
                invocation.arg(field).arg(value);
            }
            let _: i64 = invocation.invoke_async(&mut self.conn()).await?;
        }
        Ok(unstable)
    }
}

/// The field of `ketch:group:{GROUP}:txn-offsets` that every apply writes
/// (`scripts/txn_offsets.lua`), not a staged offset.
pub(crate) const APPLIED_FIELD: &str = "applied";

/// The field of `ketch:group:{GROUP}:txn-offsets` that counts the stages
/// (`scripts/offset_order.lua`), not a staged offset.
pub(crate) const ORDER_FIELD: &str = "order";

/// A transaction staging offsets: its id, producer and number.
#[derive(Debug, Clone, Copy)]
pub struct StagingTxn<'a> {
    pub transactional_id: &'a str,
    pub producer_id: i64,
    pub number: i64,
}

/// One offset staged by a transaction (see `scripts/txn_offsets.lua`).
struct StagedEntry<'a> {
    topic: &'a str,
    partition: i32,
    producer_id: i64,
    number: i64,
    transactional_id: &'a str,
}

/// A staged offset's field, `<topic>:<partition>:<producer id>`, taken
/// apart (topic names hold no ':').
pub(crate) fn staged_field(field: &str) -> Option<(&str, &str, &str)> {
    let (rest, producer_id) = field.rsplit_once(':')?;
    let (topic, partition) = rest.rsplit_once(':')?;
    Some((topic, partition, producer_id))
}

impl<'a> StagedEntry<'a> {
    /// Field [`staged_field`], value `<number>:<id length>:<transactional
    /// id><offset JSON>`.
    fn parse(field: &'a str, value: &'a str) -> Option<Self> {
        let (topic, partition, producer_id) = staged_field(field)?;
        let (number, rest) = value.split_once(':')?;
        let (length, rest) = rest.split_once(':')?;
        let length: usize = length.parse().ok()?;
        Some(Self {
            topic,
            partition: partition.parse().ok()?,
            producer_id: producer_id.parse().ok()?,
            number: number.parse().ok()?,
            transactional_id: rest.get(..length)?,
        })
    }
}
