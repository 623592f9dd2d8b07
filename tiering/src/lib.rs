//! ketch-tiering: the storage worker and the archive tier (DESIGN §7).
//!
//! Every gateway runs one [`StorageWorker`]. Every `tiering.tick_interval`
//! it visits the partitions this gateway leads, takes or renews each one's
//! lease in Redis (so exactly one gateway works a partition at a time, even
//! while membership changes), seals the open segment when it reaches
//! `segment.bytes` or `segment.ms`, archives sealed segments of topics with
//! `remote.storage.enable` to the topic's Iceberg table ([`archive`]) and
//! keeps that table's metadata small ([`maintenance`]), applies
//! `retention.*` (what clients see) and `local.retention.*` (what Redis
//! keeps), and forgets idempotent producers idle past
//! `producers.expiration`. [`Tiers`] serves reads from both tiers.

pub mod archive;
mod bounded;
pub mod credentials;
pub mod maintenance;
pub mod metrics;
pub mod reader;
pub mod table;
#[cfg(test)]
mod testing;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ketch_config::TieringSettings;
use ketch_config::topic::{Configs, Defaults};
use ketch_storage::compact::CompactPolicy;
use ketch_storage::segments::{Lease, Segment, SegmentChange, SegmentPolicy, Tier};
use ketch_storage::wake::AbortOnDrop;
use ketch_storage::{PartitionOffsets, ReadPartition, ReadRequest, StorageError, Store, Topic};
use tokio::sync::watch;

pub use archive::Archiver;
use archive::Fence;
pub use metrics::{Metrics, describe_metrics};
pub use reader::RemoteReader;

/// Why archiving or a remote read failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("iceberg: {0}")]
    Iceberg(#[from] iceberg::Error),
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("redis tier: {0}")]
    Storage(#[from] StorageError),
    #[error("record batch: {0}")]
    Batch(#[from] ketch_storage::batch::BatchError),
    #[error("table schema: {0}")]
    Schema(String),
    #[error("archive data: {0}")]
    Data(String),
    /// A data file's rows are not where its segment's `holes` put them
    /// (holes recorded wrong: [`Tiers::read`] reads them off the file and
    /// records them again).
    #[error("archive data: {0}")]
    Misplaced(String),
    /// A segment's records do not add up (a count that lies).
    #[error("segment records: {0}")]
    Records(String),
    /// The table holds another segment's data file at this segment's name
    /// ([`archive::holds_the_segment`]).
    #[error("archive diverged: {0}")]
    Diverged(String),
    #[error("{0}")]
    Io(String),
    /// The partition's archiving registration was lost before a commit
    /// (remote storage is being turned off, or the worker stalled for
    /// `tiering.lease_ttl`): nothing was committed.
    #[error("the archiving registration was lost before the commit; nothing committed")]
    Fenced,
    /// The catalog failed to open a moment ago; not tried again yet.
    #[error("the catalog is unavailable ({0}); retrying shortly")]
    Waiting(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The segment's own bytes cannot be archived: trying again will not
    /// help, unlike an unreachable catalog or object store.
    pub fn is_bad_data(&self) -> bool {
        matches!(
            self,
            Error::Batch(_)
                | Error::Records(_)
                | Error::Diverged(_)
                | Error::Storage(StorageError::Corrupt(_))
        )
    }
}

impl From<Error> for StorageError {
    fn from(e: Error) -> Self {
        match e {
            Error::Storage(e) => e,
            // Retriable for clients (KAFKA_STORAGE_ERROR): the archive may
            // be briefly unreachable.
            other => StorageError::Unavailable(format!("archive: {other}")),
        }
    }
}

/// How old a topic deletion not known finished must be before a storage
/// worker finishes it: the gateway that began it has had time to.
const UNFINISHED_DELETE_AFTER: Duration = Duration::from_secs(30);

/// Which partitions this gateway leads.
pub type Leads = Arc<dyn Fn(&Topic, i32) -> bool + Send + Sync>;

/// The storage worker of one gateway.
///
/// Sealing, retention and local retention run on every tick, partition by
/// partition. Archiving runs beside them, one task per topic (its table) at a
/// time, so a slow or unreachable catalog or object store never delays
/// sealing, and the partitions of one table are committed one after another
/// instead of conflicting.
pub struct StorageWorker {
    inner: Arc<Worker>,
}

struct Worker {
    store: Store,
    tick_interval: Duration,
    lease_ttl: Duration,
    producer_expiration: Duration,
    archiver: Archiver,
    metrics: Arc<Metrics>,
    /// Topics whose archiving task is running.
    archiving: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Topics whose compaction task is running.
    compacting: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Topics whose last archiving failed (a catalog or object store down
    /// or throttling): not tried again before the instant, and the delay
    /// doubles with each failure in a row, from `tick_interval` to
    /// [`ARCHIVE_BACKOFF_MAX`] (or 64 ticks).
    archive_backoff: std::sync::Mutex<HashMap<String, (tokio::time::Instant, Duration)>>,
    /// When each topic's archiving last listed every segment of its
    /// partitions (once per [`FULL_LISTING_EVERY`]; the other runs list
    /// those from the local start on: [`Store::archive_listing`]).
    full_listings: std::sync::Mutex<HashMap<String, tokio::time::Instant>>,
    /// Distinct keys one compaction pass holds at most.
    compaction_max_keys: usize,
    /// `tiering.archive_partitions`: partitions of one topic archived at
    /// once; their commits go one at a time through the topic's table.
    archive_partitions: usize,
    /// The partitions whose lease this worker took on its last tick: the
    /// ones it stops leading are released on the next, and all of them
    /// when the gateway stops, so their new holder need not wait for
    /// `tiering.lease_ttl`.
    leased: std::sync::Mutex<HashMap<(String, i32), Arc<Topic>>>,
    /// The per-topic tasks (archiving, compaction, archive drops), waited
    /// for when the gateway stops.
    tasks: std::sync::Mutex<tokio::task::JoinSet<()>>,
    /// Set when the gateway stops: archiving ends after the segment at hand.
    stopping: std::sync::atomic::AtomicBool,

    /// When each topic's table is due for maintenance.
    commits: CommitCount,
    /// This worker's identity in lease keys.
    id: String,
}

impl StorageWorker {
    pub fn new(
        store: Store,
        settings: &TieringSettings,
        producer_expiration: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            inner: Arc::new(Worker {
                store,
                tick_interval: settings.tick_interval.get(),
                lease_ttl: settings.lease_ttl.get(),
                producer_expiration,
                archiver: Archiver::new(settings.clone()),
                metrics,
                archiving: std::sync::Mutex::new(std::collections::HashSet::new()),
                compacting: std::sync::Mutex::new(std::collections::HashSet::new()),
                archive_backoff: std::sync::Mutex::new(HashMap::new()),
                full_listings: std::sync::Mutex::new(HashMap::new()),
                compaction_max_keys: settings.compaction_max_keys,
                archive_partitions: settings.archive_partitions.max(1),
                leased: std::sync::Mutex::new(HashMap::new()),
                tasks: std::sync::Mutex::new(tokio::task::JoinSet::new()),
                stopping: std::sync::atomic::AtomicBool::new(false),
                commits: CommitCount::every(settings.maintenance_commits),
                id: uuid::Uuid::new_v4().to_string(),
            }),
        }
    }

    /// Works until `shutdown`, then stops its tasks (waiting for them at
    /// most `grace`) and releases its leases.
    pub async fn run(self, leads: Leads, mut shutdown: watch::Receiver<bool>, grace: Duration) {
        let mut ticks = tokio::time::interval(self.inner.tick_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
            self.inner.clone().tick(&leads).await;
        }
        self.inner.stop(grace).await;
    }
}

impl Worker {
    /// Stops working: releases every lease this worker holds, so the
    /// partitions' new leaders take them on their next tick rather than
    /// after `tiering.lease_ttl`, and waits at most `grace` for its tasks.
    /// Archiving ends after the segment at hand (the lease is renewed, not
    /// taken back, before each; the task then releases its archiving
    /// registration, which still keeps the new leader's archiving out until
    /// then); a compaction pass ends at its next lease check.
    async fn stop(&self, grace: Duration) {
        self.stopping.store(true, std::sync::atomic::Ordering::Relaxed);
        let leased = std::mem::take(&mut *self.leased.lock().expect("leased"));
        let released = self
            .release_leases(
                leased
                    .into_iter()
                    .map(|((_, partition), topic)| (topic, partition))
                    .collect(),
            )
            .await;
        let mut tasks = std::mem::take(&mut *self.tasks.lock().expect("tasks"));
        let running = tasks.len();
        if tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            // Their archiving registrations expire after tiering.lease_ttl.
            tracing::warn!(
                tasks = tasks.len(),
                "storage worker: tasks still running at shutdown; leaving them"
            );
        }
        tracing::info!(
            leases_released = released,
            tasks = running,
            "storage worker stopped"
        );
    }

    /// Releases the leases of `partitions`, TICK_CONCURRENCY at a time;
    /// how many were released (one not released expires after
    /// `tiering.lease_ttl`).
    async fn release_leases(&self, partitions: Vec<(Arc<Topic>, i32)>) -> usize {
        use futures::StreamExt;
        futures::stream::iter(partitions)
            .map(|(topic, partition)| async move {
                match self
                    .store
                    .release_lease(Lease::Worker, &topic, partition, &self.id)
                    .await
                {
                    Ok(()) => 1,
                    Err(e) => {
                        tracing::debug!(topic = %topic.name, partition, error = %e,
                            "cannot release a partition's lease; it expires after tiering.lease_ttl");
                        0
                    }
                }
            })
            .buffer_unordered(TICK_CONCURRENCY)
            .fold(0, |sum, released| async move { sum + released })
            .await
    }

    fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn tick(self: Arc<Self>, leads: &Leads) {
        let topics = match self.store.all_topics().await {
            Ok(topics) => topics,
            Err(e) => {
                tracing::debug!(error = %e, "storage worker: cannot list topics");
                return;
            }
        };
        // What the gateway keeps of deleted topics' partitions goes.
        self.store.forget_deleted_partitions(&topics);
        // The cluster-wide topic config defaults, read on every tick so that
        // a change applies on the next one (max.message.bytes, the one
        // default ketch's settings give, does not concern this worker).
        let defaults = match self.store.cluster_configs().await {
            Ok((_, stored)) => Defaults::default().with_cluster(&stored).0,
            Err(e) => {
                tracing::debug!(error = %e, "storage worker: cannot read the cluster-wide topic defaults");
                return;
            }
        };
        // Topic deletions cut short, by the gateway that leads the deleted
        // topic's first partition.
        if let Err(e) = self
            .store
            .finish_deletes(UNFINISHED_DELETE_AFTER, |topic| leads(topic, 0))
            .await
        {
            tracing::warn!(error = %e, "storage worker: cannot finish topic deletions cut short");
        }
        let previous = std::mem::take(&mut *self.leased.lock().expect("leased"));
        let mut leased = HashMap::new();
        // Every partition this gateway leads, TICK_CONCURRENCY at a time:
        // one after another, two round trips each, a tick over tens of
        // thousands of partitions took longer than the tick interval and
        // the leases' TTL, and a master that stopped answering held up the
        // others' retention for a command timeout per partition.
        //
        // A master that stops answering without a failover fails each of
        // its partitions' work only after a command timeout: once one of
        // them has, the tick leaves its other partitions alone (they keep
        // their leases, and are tried next tick), so the partitions of the
        // masters that answer are not held up a command timeout per
        // TICK_CONCURRENCY of the stalled master's.
        let masters = self.store.masters().await;
        let work: Vec<(Arc<Topic>, i32, SegmentPolicy, String)> = topics
            .iter()
            .flat_map(|topic| {
                let policy = policy(topic, &defaults, self.producer_expiration);
                let masters = &masters;
                (0..topic.partitions())
                    .filter(|p| leads(topic, *p))
                    .map(move |p| {
                        let master = masters.of(topic.tags.get(p as usize).map_or("", String::as_str));
                        (topic.clone(), p, policy, master)
                    })
            })
            .collect();
        let stalled: Arc<std::sync::Mutex<HashMap<String, usize>>> = Arc::default();
        let stall_after = self.store.command_timeout();
        let outcomes: Vec<(Arc<Topic>, i32, Option<ketch_storage::Result<bool>>)> = {
            use futures::StreamExt;
            futures::stream::iter(work)
                .map(|(topic, partition, policy, master)| {
                    let this = self.clone();
                    let stalled = stalled.clone();
                    async move {
                        if let Some(skipped) = stalled.lock().expect("stalled").get_mut(&master) {
                            *skipped += 1;
                            return (topic, partition, None);
                        }
                        let started = std::time::Instant::now();
                        let outcome = this.work(&topic, partition, policy).await;
                        if outcome.is_err() && started.elapsed() >= stall_after {
                            stalled.lock().expect("stalled").entry(master).or_insert(0);
                        }
                        (topic, partition, Some(outcome))
                    }
                })
                .buffer_unordered(TICK_CONCURRENCY)
                .collect()
                .await
        };
        for (master, skipped) in stalled.lock().expect("stalled").iter() {
            tracing::warn!(
                master,
                skipped,
                "storage worker: a Redis master did not answer within redis.command_timeout; its other partitions wait for the next tick"
            );
        }
        let mut held_of: HashMap<String, Vec<i32>> = HashMap::new();
        for (topic, partition, outcome) in outcomes {
            let key = (topic.name.clone(), partition);
            match outcome {
                Some(Ok(true)) => {
                    held_of.entry(topic.name.clone()).or_default().push(partition);
                    leased.insert(key, topic);
                }
                Some(Ok(false)) => {}
                failed => {
                    if let Some(Err(e)) = failed {
                        tracing::warn!(topic = %topic.name, partition, error = %e, "storage worker");
                    }
                    if let Some(topic) = previous.get(&key) {
                        leased.insert(key, topic.clone());
                    }
                }
            }
        }
        // Topics of which this worker holds partitions: the archive backoff
        // of the others is forgotten (leading one again, its first failure
        // waits one tick).
        let mut leading: std::collections::HashSet<String> = std::collections::HashSet::new();
        for topic in &topics {
            let policy = policy(topic, &defaults, self.producer_expiration);
            let mut held = held_of.remove(topic.name.as_str()).unwrap_or_default();
            held.sort_unstable();
            if !held.is_empty() {
                leading.insert(topic.name.clone());
            }
            if policy.remote && !held.is_empty() {
                self.clone().archive_topic(topic.clone(), held.clone());
            }
            if topic.drop_archive && policy.no_archive && held.contains(&0) {
                self.clone().drop_archive(topic.clone());
            }
            if let Some(compaction) = compaction_policy(topic, &defaults, self.compaction_max_keys)
                && !held.is_empty()
            {
                self.clone().compact_topic(topic.clone(), held, compaction);
            }
        }
        // Partitions this worker no longer leads (another gateway joined,
        // the topic went): their new leader need not wait for the lease to
        // expire. Its archiving (renew_lease before each segment) and
        // compaction (lease-checked scripts) stop with it.
        let released: Vec<(Arc<Topic>, i32)> = previous
            .into_iter()
            .filter(|(key, _)| !leased.contains_key(key))
            .map(|((_, partition), topic)| (topic, partition))
            .collect();
        self.release_leases(released).await;
        *self.leased.lock().expect("leased") = leased;
        // By name, once per tick: each entry kept is then one lookup, not a
        // walk over every topic.
        let by_name: HashMap<&str, &Arc<Topic>> = topics.iter().map(|t| (t.name.as_str(), t)).collect();
        self.commits.retain(|name| by_name.contains_key(name));
        (self.archive_backoff.lock().expect("archive backoff")).retain(|name, _| leading.contains(name));
        (self.full_listings.lock().expect("full listings")).retain(|name, _| leading.contains(name));
        // Lag is kept for the remote-storage partitions this gateway works.
        self.metrics.retain_lag(|name, partition| {
            by_name.get(name).is_some_and(|t| {
                partition < t.partitions()
                    && leads(t, partition)
                    && policy(t, &defaults, self.producer_expiration).remote
            })
        });
    }

    /// Takes or renews the lease, then seals and applies retention; false
    /// when another worker holds the partition.
    async fn work(
        &self,
        topic: &Topic,
        partition: i32,
        policy: SegmentPolicy,
    ) -> ketch_storage::Result<bool> {
        if !self
            .store
            .take_lease(Lease::Worker, topic, partition, &self.id, self.lease_ttl)
            .await?
        {
            return Ok(false);
        }
        self.seal_and_retain(topic, partition, policy).await?;
        Ok(true)
    }

    async fn seal_and_retain(
        &self,
        topic: &Topic,
        partition: i32,
        policy: SegmentPolicy,
    ) -> ketch_storage::Result<()> {
        let outcome = self.store.seal_and_retain(topic, partition, policy).await?;
        self.metrics
            .sealed(outcome.sealed.max(0) as u64, outcome.deleted.max(0) as u64);
        if outcome.sealed > 0 || outcome.deleted > 0 {
            tracing::debug!(topic = %topic.name, partition, sealed = outcome.sealed,
                deleted = outcome.deleted, log_start = outcome.log_start_offset,
                local_start = outcome.local_start_offset, "storage worker");
        }
        Ok(())
    }

    /// Runs `work` on `topic` in the background, unless the topic's task of
    /// that kind (the topics in `running`) is still going.
    fn spawn_per_topic<F, Fut>(
        self: Arc<Self>,
        running: fn(&Worker) -> &std::sync::Mutex<std::collections::HashSet<String>>,
        topic: Arc<Topic>,
        work: F,
    ) where
        F: FnOnce(Arc<Self>, Arc<Topic>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        if !running(&self)
            .lock()
            .expect("running topics")
            .insert(topic.name.clone())
        {
            return;
        }
        let worker = self.clone();
        let mut tasks = self.tasks.lock().expect("tasks");
        while let Some(ended) = tasks.try_join_next() {
            if let Err(e) = ended
                && e.is_panic()
            {
                tracing::error!(error = %e, "a storage worker task panicked; its topic's work starts again next tick");
            }
        }
        tasks.spawn(async move {
            // The topic leaves `running` however the work ends (a panic
            // included), or no tick would start it again while this
            // gateway kept the partitions' leases.
            let _running = Running {
                worker: worker.clone(),
                running,
                name: topic.name.clone(),
            };
            work(worker, topic).await;
        });
    }

    /// Starts a compaction pass over `partitions` of `topic` in the
    /// background, unless the topic's compaction task is still running.
    fn compact_topic(self: Arc<Self>, topic: Arc<Topic>, partitions: Vec<i32>, policy: CompactPolicy) {
        self.spawn_per_topic(
            |w| &w.compacting,
            topic,
            move |this, topic| async move {
                for partition in partitions {
                    let started = std::time::Instant::now();
                    match this.store.compact(&topic, partition, &this.id, &policy).await {
                        Ok(Some(outcome)) => {
                            this.metrics.compacted(
                                outcome.records_read,
                                outcome.records_kept,
                                started.elapsed(),
                            );
                            tracing::debug!(topic = %topic.name, partition, read = outcome.records_read,
                            kept = outcome.records_kept, bytes_before = outcome.bytes_before,
                            bytes_after = outcome.bytes_after, clean_end = outcome.clean_end,
                            took_ms = started.elapsed().as_millis() as u64, "compacted");
                        }
                        Ok(None) => {}
                        Err(e) => {
                            this.metrics.compaction_failed();
                            tracing::warn!(topic = %topic.name, partition, error = %e, "compaction");
                        }
                    }
                }
            },
        );
    }

    /// The segment policy of `topic` as its configs and the cluster-wide
    /// defaults are now; `None` once it is deleted (or re-created).
    async fn policy_now(&self, topic: &Topic) -> ketch_storage::Result<Option<SegmentPolicy>> {
        let Some(current) = self.store.topic_fresh(&topic.name).await? else {
            return Ok(None);
        };
        if current.id != topic.id {
            return Ok(None);
        }
        let (_, stored) = self.store.cluster_configs().await?;
        let defaults = Defaults::default().with_cluster(&stored).0;
        Ok(Some(policy(&current, &defaults, self.producer_expiration)))
    }

    /// Starts archiving `partitions` of `topic` in the background, unless
    /// the topic's archiving task is still running.
    fn archive_topic(self: Arc<Self>, topic: Arc<Topic>, partitions: Vec<i32>) {
        let backing_off = (self.archive_backoff.lock().expect("archive backoff"))
            .get(&topic.name)
            .is_some_and(|(until, _)| tokio::time::Instant::now() < *until);
        if backing_off {
            return;
        }
        self.spawn_per_topic(
            |w| &w.archiving,
            topic,
            move |this, topic| async move {
                use futures::StreamExt;
                // The topic's table, opened by the first partition that
                // archives and committed to by one partition at a time.
                let table = tokio::sync::Mutex::new(None);
                // Whether a partition failed, and whether one archived
                // anything: the topic backs off only when archiving failed
                // and got nowhere (one partition's trouble does not slow
                // the others).
                let failed = std::sync::atomic::AtomicBool::new(false);
                let progressed = std::sync::atomic::AtomicBool::new(false);
                let (this, topic, table) = (&this, &topic, &table);
                let (failed_ref, progressed_ref) = (&failed, &progressed);
                let all = this.full_listing_due(&topic.name);
                futures::stream::iter(partitions)
                    .for_each_concurrent(this.archive_partitions, |partition| async move {
                        let archived = this.archive_pending(topic, partition, table, all).await;
                        if let Ok(archived) = &archived {
                            if archived.failed {
                                failed_ref.store(true, std::sync::atomic::Ordering::Relaxed);
                            }
                            if archived.segments > 0 {
                                progressed_ref.store(true, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                        match archived.map(|archived| archived.segments) {
                            // Apply retention and local retention to what was
                            // just archived, as the topic's configs say now:
                            // archiving may have taken long, and a retention
                            // raised meanwhile holds for it (Kafka reads its
                            // config on each retention run).
                            Ok(archived) if archived > 0 => {
                                let retained = match this.policy_now(topic).await {
                                    Ok(Some(policy)) => this.seal_and_retain(topic, partition, policy).await,
                                    Ok(None) => Ok(()),
                                    Err(e) => Err(e),
                                };
                                if let Err(e) = retained {
                                    tracing::warn!(topic = %topic.name, partition, error = %e, "storage worker");
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                failed_ref.store(true, std::sync::atomic::Ordering::Relaxed);
                                tracing::warn!(topic = %topic.name, partition, error = %e, "archiving");
                            }
                        }
                    })
                    .await;
                this.archived_or_failed(&topic.name, failed.into_inner() && !progressed.into_inner());
            },
        );
    }

    /// Whether this run of the topic's archiving lists every segment of its
    /// partitions: once per [`FULL_LISTING_EVERY`], which finds what the
    /// other runs' listings would miss (a segment below the local start
    /// whose quarantined copy was deleted by a gateway killed before it
    /// could record so).
    fn full_listing_due(&self, topic: &str) -> bool {
        let now = tokio::time::Instant::now();
        let mut listed = self.full_listings.lock().expect("full listings");
        match listed.get(topic) {
            Some(at) if now.duration_since(*at) < FULL_LISTING_EVERY => false,
            _ => {
                listed.insert(topic.to_owned(), now);
                true
            }
        }
    }

    /// After a topic's archiving: its next attempt waits longer after each
    /// failure in a row, and is not held back after a success.
    fn archived_or_failed(&self, topic: &str, failed: bool) {
        let mut backoff = self.archive_backoff.lock().expect("archive backoff");
        if !failed {
            backoff.remove(topic);
            return;
        }
        let delay = next_backoff(backoff.get(topic).map(|(_, delay)| *delay), self.tick_interval);
        tracing::debug!(topic, ?delay, "archiving failed; tried again after the delay");
        backoff.insert(topic.to_owned(), (tokio::time::Instant::now() + delay, delay));
    }

    /// Deletes the archive of a topic whose remote storage was turned off
    /// (with `remote.log.delete.on.disable`), in the background: once every
    /// partition's log start has moved to its local start and no segment
    /// names an archive file (each partition's worker does that on its
    /// ticks, `seal.lua`), the table and its files are deleted and the
    /// topic's mark cleared. Run by the worker of partition 0, retried on
    /// later ticks until it succeeds.
    fn drop_archive(self: Arc<Self>, topic: Arc<Topic>) {
        // The archiving set: never beside an archiving task of the topic.
        self.spawn_per_topic(
            |w| &w.archiving,
            topic,
            |this, topic| async move {
                match this.try_drop_archive(&topic).await {
                    Ok(_) => {}
                    Err(e) => tracing::warn!(topic = %topic.name, error = %e, "deleting the archive"),
                }
            },
        );
    }

    /// One attempt of [`Worker::drop_archive`]; false while a partition
    /// still reaches into the archive, or a worker holds its archiving
    /// registration (see [`Worker::archive_pending`]).
    async fn try_drop_archive(&self, topic: &Topic) -> Result<bool, Error> {
        for partition in 0..topic.partitions() {
            let offsets = self.store.offsets(topic, partition).await?;
            let archived = self
                .store
                .segments(topic, partition)
                .await?
                .iter()
                .any(|s| s.path.is_some() || s.quarantine.is_some());
            if offsets.local_start_offset > offsets.log_start_offset || archived {
                tracing::debug!(topic = %topic.name, partition,
                    "archive drop waits: the partition still reaches into the archive");
                return Ok(false);
            }
            // A worker that may still write the table (another gateway's,
            // which read the topic before remote storage was turned off).
            if self.store.lease_held(Lease::Archiving, topic, partition).await? {
                tracing::debug!(topic = %topic.name, partition,
                    "archive drop waits: a storage worker may still write the partition to the table");
                return Ok(false);
            }
        }
        // The record read again just before: the purge goes by the table's
        // name, and a topic deleted and created again under it since must
        // keep the table its own partitions may be archiving into.
        let current = self.store.topic_fresh(&topic.name).await?;
        if !current.is_some_and(|t| t.id == topic.id && t.drop_archive) {
            tracing::debug!(topic = %topic.name,
                "archive drop given up: the topic was deleted, or created again, meanwhile");
            return Ok(false);
        }
        let purged = self.archiver.purge_table(topic).await?;
        match self.store.archive_dropped(topic).await {
            // Another gateway changed the topic meanwhile: done again next tick.
            Err(StorageError::Conflict(_)) => return Ok(false),
            other => other?,
        };
        tracing::info!(topic = %topic.name, table_deleted = purged,
            "remote storage turned off: deleted the topic's archive");
        Ok(true)
    }

    /// Deletes the quarantine stream's oldest copy when its segment is
    /// settled (archived or skipped) and neither quarantined nor marked for
    /// the copy's deletion: one left by a gateway killed between copying a
    /// segment and recording its quarantine, the segment archived from the
    /// log since. Nothing else deletes it (retention.ms -1 never trims the
    /// stream), and while the stream holds batches every tick lists all of
    /// the partition's segments ([`Store::archive_listing`]). One copy a
    /// tick; a copy behind a quarantined segment's waits for it.
    async fn drop_orphaned_quarantine_copy(&self, topic: &Topic, partition: i32, segments: &[Segment]) {
        let oldest = match self.store.oldest_quarantined_offset(topic, partition).await {
            Ok(Some(offset)) => offset,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(topic = %topic.name, partition, error = %e, "cannot read the quarantine stream");
                return;
            }
        };
        let Some(segment) = segments.iter().find(|s| s.base <= oldest && oldest <= s.last) else {
            return;
        };
        let settled = segment.path.is_some() || segment.skipped.is_some();
        if !settled || segment.quarantine.is_some() || segment.purge {
            return;
        }
        match self.store.purge_quarantine(topic, partition, segment).await {
            Ok(()) => tracing::info!(topic = %topic.name, partition, base = segment.base,
                "deleted a quarantined copy of a segment that was never quarantined (a gateway stopped between the two)"),
            Err(e) => tracing::debug!(topic = %topic.name, partition, error = %e,
                "cannot delete an orphaned quarantined copy yet"),
        }
    }

    /// Archives the partition's sealed segments that are not yet, oldest
    /// first, and quarantined segments an operator asked to retry. A segment
    /// whose records cannot be read is quarantined and archiving goes on
    /// with the next; any other failure (catalog, object store, Redis) stops
    /// here, to be retried next tick. Returns how many were archived.
    ///
    /// All of it runs under the partition's archiving registration
    /// ([`Lease::Archiving`]), taken before the topic is read again
    /// from Redis to check that it still wants an archive: a worker deleting
    /// the archive (remote storage turned off) waits until no partition has
    /// one, so whichever comes second of the two sees the other, and no
    /// table is made or written after it is purged.
    async fn archive_pending(
        &self,
        topic: &Topic,
        partition: i32,
        table: &SharedTable,
        all: bool,
    ) -> ketch_storage::Result<Archived> {
        let listing = self.store.archive_listing(topic, partition, all).await?;
        let segments = listing.segments;
        // A copy in the quarantine stream whose deletion was cut short (a
        // gateway killed after the segment was archived on retry, or
        // skipped): deleted now.
        // (Never a quarantined one's: its copy is what serves it.)
        for segment in segments.iter().filter(|s| s.purge && s.quarantine.is_none()) {
            match self.store.purge_quarantine(topic, partition, segment).await {
                Ok(()) => tracing::info!(topic = %topic.name, partition, base = segment.base,
                    "deleted the quarantined copy of a segment archived or skipped before"),
                Err(e) => tracing::debug!(topic = %topic.name, partition, error = %e,
                    "cannot delete a quarantined copy yet"),
            }
        }
        if listing.complete {
            self.drop_orphaned_quarantine_copy(topic, partition, &segments)
                .await;
        }
        let quarantined = segments.iter().filter(|s| s.quarantine.is_some()).count();
        self.metrics
            .set_quarantined(&topic.name, partition, quarantined as u64);
        let mut pending: Vec<Segment> = segments.into_iter().filter(Segment::wants_archiving).collect();
        // A segment wholly below the log start (DeleteRecords) is not
        // archived: its batches are gone, and retention lets it go.
        pending.retain(|s| s.last >= listing.log_start_offset);
        let lag = |segments: &[Segment]| {
            segments
                .first()
                .map_or(0, |s| ketch_storage::now_ms().saturating_sub(s.sealed_ms).max(1))
        };
        self.metrics.set_lag(&topic.name, partition, lag(&pending));
        if pending.is_empty() {
            return Ok(Archived::default());
        }
        if !self
            .store
            .take_lease(Lease::Archiving, topic, partition, &self.id, self.lease_ttl)
            .await?
        {
            tracing::debug!(topic = %topic.name, partition,
                "archiving waits for another worker's archiving of the partition to end");
            return Ok(Archived::default());
        }
        let registration = Archiving {
            worker: self,
            topic,
            partition,
        };
        // Renewed in the background, so a long segment keeps it; the commit
        // checks it once more (Fence).
        let renewing = registration.keep_renewed();
        let archived = self
            .archive_registered(topic, partition, &pending, &registration, lag, table)
            .await;
        drop(renewing);
        if let Err(e) = self
            .store
            .release_lease(Lease::Archiving, topic, partition, &self.id)
            .await
        {
            // It expires after tiering.lease_ttl.
            tracing::debug!(topic = %topic.name, partition, error = %e, "cannot release the archiving registration");
        }
        archived
    }

    /// [`Worker::archive_pending`] once the registration is held.
    async fn archive_registered(
        &self,
        topic: &Topic,
        partition: i32,
        pending: &[Segment],
        registration: &Archiving<'_>,
        lag: impl Fn(&[Segment]) -> i64,
        table: &SharedTable,
    ) -> ketch_storage::Result<Archived> {
        if !self.still_archives(topic).await? {
            return Ok(Archived::default());
        }
        // Opened under this partition's registration, after the check
        // above (so never made again after a purge); another partition
        // of the topic may have opened it first, under its own.
        {
            let mut slot = table.lock().await;
            if slot.is_none() {
                match self.archiver.table(topic).await {
                    Ok(opened) => *slot = Some(opened),
                    Err(Error::Waiting(e)) => {
                        tracing::debug!(topic = %topic.name, error = %e, "archiving waits for the catalog");
                        return Ok(Archived::failed(0));
                    }
                    Err(e) => {
                        self.metrics.archive_failed();
                        tracing::warn!(topic = %topic.name, error = %e, "cannot open the topic's Iceberg table");
                        return Ok(Archived::failed(0));
                    }
                }
            }
        }
        let current = || async { table.lock().await.clone().expect("the table, opened above") };
        // Archiving never passes the last stable offset: an undecided
        // transaction cannot be archived.
        let stable = self.store.offsets(topic, partition).await?.last_stable_offset;
        let mut archived_count = 0;
        // A segment whose rows are all handed to its data file's writer:
        // it is committed while the next segment is read and encoded, so
        // closing the file (the last row groups, the upload's completion)
        // and the commit overlap the next segment's work. Commits stay in
        // the partition's order.
        let mut closing: Option<Started> = None;
        for (done, segment) in pending.iter().enumerate() {
            if segment.last >= stable {
                tracing::debug!(topic = %topic.name, partition, base = segment.base,
                    "archiving waits for the segment's transactions to be decided");
                break;
            }

            // The lease must still be ours: archiving can take a while, and
            // a lease released (the partition led elsewhere now, the
            // gateway stopping) is not taken back. And remote storage may
            // have been turned off meanwhile.
            if self.stopping()
                || !self
                    .store
                    .renew_lease(Lease::Worker, topic, partition, &self.id, self.lease_ttl)
                    .await?
                || (done > 0 && !self.still_archives(topic).await?)
            {
                break;
            }
            let tier = if segment.quarantine.is_some() {
                Tier::Quarantine
            } else {
                Tier::Log
            };
            let started = std::time::Instant::now();
            // Read from a copy of the table, as commits (the previous
            // segment's, other partitions') move the table on meanwhile.
            let snapshot = current().await;
            let starting = self
                .archiver
                .start(&self.store, &snapshot, topic, partition, segment, tier);
            let (fed, previous) = match closing.take() {
                None => (starting.await, Step::Next),
                Some(previous) => {
                    let finishing =
                        self.finish_segment(table, topic, partition, pending, previous, registration, &lag);
                    tokio::join!(starting, finishing)
                }
            };
            match previous {
                Step::Next => {}
                Step::Archived => archived_count += 1,
                Step::Stop | Step::Retry => {
                    if let Ok(fed) = fed {
                        fed.abandon().await;
                    }
                    return Ok(Archived::after(archived_count, &previous));
                }
                Step::Failed(e) => {
                    if let Ok(fed) = fed {
                        fed.abandon().await;
                    }
                    return Err(e);
                }
            }
            let step = match fed {
                Ok(fed) => {
                    closing = Some(Started {
                        done,
                        tier,
                        started,
                        fed,
                    });
                    continue;
                }
                Err(e) => self.failed(topic, partition, pending, done, tier, e, &lag).await,
            };
            match step {
                Step::Next | Step::Archived => {}
                Step::Stop | Step::Retry => return Ok(Archived::after(archived_count, &step)),
                Step::Failed(e) => return Err(e),
            }
        }
        if let Some(previous) = closing {
            match self
                .finish_segment(table, topic, partition, pending, previous, registration, &lag)
                .await
            {
                Step::Next => {}
                Step::Archived => archived_count += 1,
                Step::Stop => {}
                Step::Retry => return Ok(Archived::failed(archived_count)),
                Step::Failed(e) => return Err(e),
            }
        }
        Ok(Archived {
            segments: archived_count,
            failed: false,
        })
    }

    /// Commits a segment [`Archiver::start`] is done with and records it
    /// archived (or quarantined: [`Worker::failed`]).
    #[allow(clippy::too_many_arguments)]
    async fn finish_segment(
        &self,
        table: &SharedTable,
        topic: &Topic,
        partition: i32,
        pending: &[Segment],
        started: Started,
        registration: &Archiving<'_>,
        lag: &impl Fn(&[Segment]) -> i64,
    ) -> Step {
        let Started {
            done,
            tier,
            started,
            fed,
        } = started;
        let segment = &pending[done];
        // The file closes without the table; the commit and what follows
        // it hold the table, one partition at a time.
        let closed = match fed.closed().await {
            Ok(closed) => closed,
            Err(e) => return self.failed(topic, partition, pending, done, tier, e, lag).await,
        };
        let mut held = table.lock().await;
        let table = held.as_mut().expect("the table, opened before any segment");
        let archived = match self
            .archiver
            .commit(table, topic, partition, segment, closed, registration)
            .await
        {
            Ok(archived) => archived,
            Err(e) => {
                drop(held);
                return self.failed(topic, partition, pending, done, tier, e, lag).await;
            }
        };
        let recorded = async {
            self.store
                .mark_archived(
                    topic,
                    partition,
                    segment,
                    &archived.path,
                    archived.file_bytes,
                    archived.holes.as_deref().unwrap_or_default(),
                )
                .await?;
            if tier == Tier::Quarantine {
                self.store.purge_quarantine(topic, partition, segment).await?;
                tracing::info!(topic = %topic.name, partition, base = segment.base, last = segment.last,
                    "quarantined segment archived on retry");
            }
            tracing::debug!(topic = %topic.name, partition, base = segment.base, last = segment.last,
                path = %archived.path, written = archived.written,
                ms = started.elapsed().as_millis() as u64, "segment archived");
            // The gauge follows the archive at once, not after the table
            // maintenance below, which can take a while.
            self.metrics
                .set_lag(&topic.name, partition, lag(&pending[done + 1..]));
            if archived.written {
                self.metrics
                    .archived(archived.records, archived.file_bytes, started.elapsed());
                if registration.holds().await? {
                    self.after_commit(topic, table).await;
                }
            }
            Ok::<_, StorageError>(())
        };
        match recorded.await {
            Ok(()) => Step::Archived,
            Err(e) => Step::Failed(e),
        }
    }

    /// What a segment's archiving failing with `e` leads to: a segment that
    /// cannot be read is quarantined and archiving goes on with the next;
    /// anything else stops archiving the partition until the next tick.
    #[allow(clippy::too_many_arguments)]
    async fn failed(
        &self,
        topic: &Topic,
        partition: i32,
        pending: &[Segment],
        done: usize,
        tier: Tier,
        e: Error,
        lag: &impl Fn(&[Segment]) -> i64,
    ) -> Step {
        let segment = &pending[done];
        match e {
            Error::Fenced => {
                tracing::info!(topic = %topic.name, partition, base = segment.base,
                    "archiving stopped before a commit: the partition's archiving registration was lost (expired, or taken over)");
                Step::Stop
            }
            e if e.is_bad_data() => {
                if let Err(e) = self.quarantine(topic, partition, segment, tier, &e).await {
                    return Step::Failed(e);
                }
                self.metrics
                    .set_lag(&topic.name, partition, lag(&pending[done + 1..]));
                Step::Next
            }
            e => {
                self.metrics.archive_failed();
                tracing::warn!(topic = %topic.name, partition, base = segment.base, error = %e,
                    "archiving a segment failed; retrying next tick");
                Step::Retry
            }
        }
    }

    /// Whether `topic`, read from Redis now, is the same topic and still
    /// writes its archive: remote storage on, not read-only, no archive
    /// drop pending.
    async fn still_archives(&self, topic: &Topic) -> ketch_storage::Result<bool> {
        let fresh = self.store.topic_fresh(&topic.name).await?;
        let archives = fresh.as_deref().is_some_and(|t| {
            t.id == topic.id
                && !t.drop_archive
                && t.config("remote.storage.enable") == Some("true")
                && t.config("remote.log.copy.disable") != Some("true")
        });
        if !archives {
            tracing::debug!(topic = %topic.name, "archiving stops: the topic no longer writes its archive");
        }
        Ok(archives)
    }

    /// Counts a commit to the topic's table, and maintains the table after
    /// every `tiering.maintenance_commits` of them: between segments of this
    /// task, so it never races this gateway's own commits, and counted in
    /// commits, so the snapshots and manifests a backlog of segments adds
    /// are trimmed as it is archived. A failure waits for as many commits
    /// again.
    async fn after_commit(&self, topic: &Topic, table: &mut iceberg::table::Table) {
        if !self.commits.count(&topic.name) {
            return;
        }
        let started = std::time::Instant::now();
        match self.archiver.expire_snapshots(table).await {
            Ok(expired) => {
                self.metrics
                    .snapshots_expired(expired.snapshots as u64, expired.files as u64);
                tracing::debug!(topic = %topic.name, expired = expired.snapshots, files_deleted = expired.files,
                    snapshots = table.metadata().snapshots().count(), ms = started.elapsed().as_millis() as u64,
                    "archive maintenance: snapshots expired");
            }
            Err(e) => {
                self.metrics.maintenance_failed();
                tracing::warn!(topic = %topic.name, error = %e, "archive maintenance: expiring snapshots failed");
            }
        }
        let started = std::time::Instant::now();
        match self.archiver.rewrite_manifests(table).await {
            Ok(Some(rewrite)) => {
                self.metrics.manifests_rewritten(rewrite.merged as u64);
                tracing::debug!(topic = %topic.name, merged = rewrite.merged, written = rewrite.written,
                    manifests = rewrite.manifests, ms = started.elapsed().as_millis() as u64,
                    "archive maintenance: manifests merged");
            }
            Ok(None) => {}
            Err(e) => {
                self.metrics.maintenance_failed();
                tracing::warn!(topic = %topic.name, error = %e, "archive maintenance: merging manifests failed");
            }
        }
    }

    /// Quarantines a segment the archive cannot write: its batches are
    /// copied out of the log (so local retention can trim past it) and it
    /// is marked, to wait for an operator (`ketch segments retry|skip`).
    async fn quarantine(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        tier: Tier,
        error: &Error,
    ) -> ketch_storage::Result<()> {
        self.metrics.archive_failed();
        if tier == Tier::Log {
            self.store.copy_to_quarantine(topic, partition, segment).await?;
        }
        let reason = error.to_string();
        let change = SegmentChange::Quarantine { reason: &reason };
        self.store
            .change_segment(topic, partition, segment, change)
            .await?;
        self.metrics.quarantined();
        tracing::error!(topic = %topic.name, partition, base = segment.base, last = segment.last,
            error = %reason, retried = tier == Tier::Quarantine,
            "segment quarantined: the archive cannot write it; it stays in Redis and archiving goes on \
             with later segments (`ketch segments list|retry|skip`)");
        Ok(())
    }
}

/// A topic's table for its partitions' archiving: opened once, committed
/// to by one partition at a time (so a gateway's commits never conflict).
type SharedTable = tokio::sync::Mutex<Option<iceberg::table::Table>>;

/// A segment of a partition's pending ones that [`Archiver::start`] is
/// done with, waiting for [`Worker::finish_segment`].
struct Started {
    /// Its index in the pending segments.
    done: usize,
    tier: Tier,
    started: std::time::Instant,
    fed: archive::Fed,
}

/// Where archiving a partition goes after a segment.
enum Step {
    /// On to the next segment (the last was quarantined, or none finished).
    Next,
    /// On to the next segment: the last was archived.
    Archived,
    /// No further this tick: the registration was lost.
    Stop,
    /// No further this tick: archiving failed (an error logged; the
    /// catalog or object store refused or did not answer).
    Retry,
    /// No further: Redis failed recording it.
    Failed(StorageError),
}

/// What one pass over a partition's pending segments did.
#[derive(Debug, Default)]
struct Archived {
    /// Segments archived.
    segments: usize,
    /// It stopped on a failure of the catalog or object store (retried
    /// later), not on the end of what was pending.
    failed: bool,
}

impl Archived {
    fn failed(segments: usize) -> Self {
        Self {
            segments,
            failed: true,
        }
    }

    /// After `segments` were archived, stopped by `step`.
    fn after(segments: usize, step: &Step) -> Self {
        Self {
            segments,
            failed: matches!(step, Step::Retry),
        }
    }
}

/// A partition's archiving registration, held by this worker
/// ([`Lease::Archiving`]): the fence of its commits.
struct Archiving<'a> {
    worker: &'a Worker,
    topic: &'a Topic,
    partition: i32,
}

impl Fence for Archiving<'_> {
    /// Renews it, if it is still held.
    async fn holds(&self) -> ketch_storage::Result<bool> {
        let w = self.worker;
        w.store
            .renew_lease(Lease::Archiving, self.topic, self.partition, &w.id, w.lease_ttl)
            .await
    }
}

impl Archiving<'_> {
    /// Renews it every third of `tiering.lease_ttl` in the background,
    /// until the returned guard drops (or it was lost).
    fn keep_renewed(&self) -> AbortOnDrop {
        let w = self.worker;
        let (store, topic, id, ttl) = (w.store.clone(), self.topic.clone(), w.id.clone(), w.lease_ttl);
        let partition = self.partition;
        AbortOnDrop(tokio::spawn(async move {
            let mut every = tokio::time::interval(ttl / 3);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every.tick().await;
            loop {
                every.tick().await;
                match store
                    .renew_lease(Lease::Archiving, &topic, partition, &id, ttl)
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => {
                        tracing::debug!(topic = %topic.name, partition, error = %e,
                            "cannot renew the archiving registration")
                    }
                }
            }
        }))
    }
}

/// Counts the commits made to each topic's table, to maintain it after
/// every so many.
struct CommitCount {
    /// 0: never.
    every: u32,
    since_maintained: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

impl CommitCount {
    fn every(commits: u32) -> Self {
        Self {
            every: commits,
            since_maintained: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Counts a commit to `topic`'s table; true when the table is due for
    /// maintenance (and the count starts over).
    fn count(&self, topic: &str) -> bool {
        if self.every == 0 {
            return false;
        }
        let mut counts = self.since_maintained.lock().expect("commit counts");
        let count = counts.entry(topic.to_owned()).or_default();
        *count += 1;
        if *count < self.every {
            return false;
        }
        *count = 0;
        true
    }

    /// Forgets the topics `keep` does not name (deleted ones).
    fn retain(&self, keep: impl Fn(&str) -> bool) {
        (self.since_maintained.lock().expect("commit counts")).retain(|topic, _| keep(topic));
    }
}

/// Times a lookup by timestamp over both tiers is made while local
/// retention keeps trimming under it ([`Tiers::offset_for_timestamp`]).
const LOOKUP_ATTEMPTS: usize = 3;

/// How often a failed archive read is a warning at most.
const READ_FAILURE_WARNING_EVERY: Duration = Duration::from_secs(10);

/// Reads from both tiers: Redis from the local start offset on, the
/// archive below it.
pub struct Tiers {
    store: Store,
    reader: Arc<RemoteReader>,
    /// `tiering.remote_fetch_max_wait`.
    remote_wait: Duration,
    metrics: Arc<Metrics>,
    /// A failed archive read is a warning at most every
    /// [`READ_FAILURE_WARNING_EVERY`] (a consumer retries a failed fetch
    /// every few hundred milliseconds), a debug line otherwise.
    read_failure_warned: ketch_storage::AtMostEvery,
    /// Per partition (its meta key): what its last archive read learnt.
    hints: std::sync::Mutex<std::collections::HashMap<String, Hint>>,
}

/// A topic's place among the running tasks of one kind, given up when
/// dropped.
struct Running {
    worker: Arc<Worker>,
    running: fn(&Worker) -> &std::sync::Mutex<std::collections::HashSet<String>>,
    name: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        (self.running)(&self.worker)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.name);
    }
}

/// How long a topic's archiving waits after a failure: a tick after the
/// first, twice the last delay after the next ones, at most
/// [`ARCHIVE_BACKOFF_MAX`] and 64 ticks.
fn next_backoff(last: Option<Duration>, tick: Duration) -> Duration {
    last.map_or(tick, |delay| delay * 2)
        .min(ARCHIVE_BACKOFF_MAX.min(tick * ARCHIVE_BACKOFF_MAX_TICKS))
        .max(tick)
}

/// The longest a topic's archiving waits after failures in a row: five
/// minutes, and no more than 64 ticks.
const ARCHIVE_BACKOFF_MAX: Duration = Duration::from_secs(300);
const ARCHIVE_BACKOFF_MAX_TICKS: u32 = 64;

/// Partitions a storage worker's tick seals and applies retention to at
/// once.
const TICK_CONCURRENCY: usize = 32;

/// How often a topic's archiving lists every segment of its partitions
/// (see [`Worker::full_listing_due`]).
const FULL_LISTING_EVERY: Duration = Duration::from_secs(300);

/// Partitions whose [`Hint`] [`Tiers`] keeps at most.
const MAX_HINTS: usize = 65_536;

/// What the last archive read of a partition learnt.
#[derive(Clone)]
struct Hint {
    /// The local start offset. It only grows, so an offset below it is read
    /// from the archive without first asking Redis for batches it no
    /// longer has.
    local_start: i64,
    /// The archived segment read.
    segment: Segment,
    /// The first offset after `segment` was looked up to be read ahead.
    next_started: bool,
}

impl Tiers {
    /// The offsets an archived segment's data file has no rows for, read
    /// off the file and recorded in the segment's record, when the record
    /// says otherwise (an older release could record them wrong, and every
    /// read of the segment then failed); `None` when it says the same.
    async fn repair_holes(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
    ) -> ketch_storage::Result<Option<Vec<(i64, i64)>>> {
        let path = segment.path.as_deref().unwrap_or_default();
        let holes = self.reader.holes_in_file(segment, path).await?;
        if holes == segment.holes {
            return Ok(None);
        }
        tracing::warn!(topic = %topic.name, partition, base = segment.base, recorded = ?segment.holes, file = ?holes,
            "an archived segment's recorded holes do not match its data file: recording the file's");
        let change = SegmentChange::Holes { path, holes: &holes };
        self.store
            .change_segment(topic, partition, segment, change)
            .await?;
        Ok(Some(holes))
    }

    pub fn new(store: Store, settings: &TieringSettings, metrics: Arc<Metrics>) -> Self {
        Self {
            reader: Arc::new(RemoteReader::new(settings, metrics.clone())),
            remote_wait: settings.remote_fetch_max_wait.get(),
            metrics,
            read_failure_warned: ketch_storage::AtMostEvery::default(),
            store,
            hints: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// [`Store::read`], with offsets below the local start read from the
    /// archive, or from the quarantine stream for a quarantined segment. A
    /// skipped segment is a hole: the read goes on after it (a consumer gets
    /// the next offsets, as over the gaps of a compacted topic).
    pub async fn read(
        &self,
        topic: &Topic,
        partition: i32,
        request: &ReadRequest,
    ) -> ketch_storage::Result<ReadPartition> {
        let key = &self.store.partition_keys(topic, partition).meta;
        let hint = self.hints.lock().expect("hints").get(key).cloned();
        let offsets = match &hint {
            Some(hint) if request.offset < hint.local_start => {
                let offsets = self.store.offsets(topic, partition).await?;
                if request.offset < offsets.log_start_offset {
                    return Err(StorageError::OffsetOutOfRange {
                        log_start: offsets.log_start_offset,
                        high_watermark: offsets.high_watermark,
                    });
                }
                offsets
            }
            _ => match self.store.read(topic, partition, request).await {
                Err(StorageError::NotLocal { offsets, .. }) => offsets,
                other => return other,
            },
        };
        let mut cached = hint.as_ref().map(|hint| hint.segment.clone());
        let mut offset = request.offset;
        // A segment's holes were read off its data file and recorded again.
        let mut repaired = false;
        loop {
            let segment = match cached.take().filter(|s| (s.base..=s.last).contains(&offset)) {
                Some(segment) => segment,
                None => match self.store.segment_at(topic, partition, offset).await? {
                    Some(segment) => segment,
                    // Retention removed it meanwhile.
                    None => {
                        let offsets = self.store.offsets(topic, partition).await?;
                        return Err(StorageError::OffsetOutOfRange {
                            log_start: offsets.log_start_offset,
                            high_watermark: offsets.high_watermark,
                        });
                    }
                },
            };
            let batches = if segment.path.is_some() {
                // At most `remote_fetch_max_wait`, as Kafka's delayed remote
                // fetch: a slow or unreachable object store holds up neither
                // the fetch's other partitions nor the client past its
                // request timeout. The read goes on, filling the cache.
                let (reader, archived, max_bytes) = (self.reader.clone(), segment.clone(), request.max_bytes);
                let mut reading =
                    tokio::spawn(async move { reader.read(&archived, offset, max_bytes).await });
                match tokio::time::timeout(self.remote_wait, &mut reading).await {
                    Ok(Ok(read)) => read.map(|read| (read.batches, read.near_end)),
                    Ok(Err(e)) => Err(Error::Data(format!("archive read: {e}"))),
                    Err(_) => {
                        self.metrics.remote_read_timed_out();
                        tracing::debug!(topic = %topic.name, partition, offset,
                            "an archive read outlasted tiering.remote_fetch_max_wait; answering no records");
                        return Ok(ReadPartition {
                            offsets: Some(offsets),
                            batches: Vec::new(),
                        });
                    }
                }
            } else if segment.quarantine.is_some() {
                self.store
                    .read_quarantined(topic, partition, &segment, offset, request.max_bytes)
                    .await
                    .map(|batches| (batches, false))
                    .map_err(Error::from)
            } else if segment.skipped.is_some() {
                offset = segment.last + 1;
                if offset >= offsets.local_start_offset {
                    let rest = ReadRequest { offset, ..*request };
                    return self.store.read(topic, partition, &rest).await;
                }
                continue;
            } else {
                Err(Error::Data(format!(
                    "segment {}..={} is below the local start but neither archived nor quarantined",
                    segment.base, segment.last
                )))
            };
            let (batches, near_end) = match batches {
                Ok(read) => read,
                Err(Error::Misplaced(why)) if !repaired => {
                    repaired = true;
                    self.hints.lock().expect("hints").remove(key);
                    let Some(holes) = self.repair_holes(topic, partition, &segment).await? else {
                        return Err(Error::Misplaced(why).into());
                    };
                    cached = Some(Segment { holes, ..segment });
                    continue;
                }
                Err(e) => {
                    // The segment may have changed state (archived on retry,
                    // skipped by an operator once its data file was lost).
                    self.hints.lock().expect("hints").remove(key);
                    if segment.path.is_some() {
                        self.metrics.remote_read_failed();
                        let why = "an archive read failed (KAFKA_STORAGE_ERROR); a data file the object store lost is given up on with `ketch segments skip`";
                        if self.read_failure_warned.ready(READ_FAILURE_WARNING_EVERY) {
                            tracing::warn!(topic = %topic.name, partition, offset, path = ?segment.path, error = %e, "{why}");
                        } else {
                            tracing::debug!(topic = %topic.name, partition, offset, path = ?segment.path, error = %e, "{why}");
                        }
                    }
                    return Err(e.into());
                }
            };
            if batches.is_empty() && segment.path.is_some() && offset <= segment.last {
                // The rest of the segment was left out of the archive
                // (transaction markers, aborted data): go on after it.
                offset = segment.last + 1;
                if offset >= offsets.local_start_offset {
                    let rest = ReadRequest { offset, ..*request };
                    return self.store.read(topic, partition, &rest).await;
                }
                continue;
            }
            let same = hint.as_ref().filter(|h| h.segment.base == segment.base);
            let mut next_started = same.is_some_and(|h| h.next_started);
            if near_end && !next_started {
                next_started = true;
                self.read_next_segment_ahead(topic, partition, &segment, offsets.local_start_offset)
                    .await;
            }
            let mut hints = self.hints.lock().expect("hints");
            // Hints of partitions no longer read (a deleted topic's among
            // them) are not kept for ever: past the bound they all go,
            // and each partition's next archive read learns its own again.
            if hints.len() >= MAX_HINTS && !hints.contains_key(key) {
                hints.clear();
            }
            hints.insert(
                key.clone(),
                Hint {
                    local_start: offsets.local_start_offset,
                    segment,
                    next_started,
                },
            );
            drop(hints);
            return Ok(ReadPartition {
                offsets: Some(offsets),
                batches,
            });
        }
    }

    /// Starts reading the archived segment after `segment` ahead, once a
    /// sequential reader's read-ahead reached `segment`'s end (a segment
    /// that is still in Redis needs none).
    async fn read_next_segment_ahead(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        local_start: i64,
    ) {
        let next = segment.last + 1;
        if next >= local_start {
            return;
        }
        match self.store.segment_at(topic, partition, next).await {
            Ok(Some(after)) if after.path.is_some() && after.base == next => {
                self.reader.read_ahead_segment(after);
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(topic = %topic.name, partition, error = %e,
                "cannot look up the next archived segment to read ahead"),
        }
    }

    /// The segments below the local start clients can still see, oldest
    /// first: archived ones, and quarantined ones (Fetch serves those from
    /// the quarantine stream, so lookups by time search them too).
    async fn archived(
        &self,
        topic: &Topic,
        partition: i32,
        offsets: &PartitionOffsets,
    ) -> ketch_storage::Result<Vec<Segment>> {
        if offsets.local_start_offset <= offsets.log_start_offset {
            return Ok(Vec::new());
        }
        Ok(self
            .store
            .segments(topic, partition)
            .await?
            .into_iter()
            .filter(|s| {
                (s.path.is_some() || s.quarantine.is_some())
                    && s.last >= offsets.log_start_offset
                    && s.base < offsets.local_start_offset
            })
            .collect())
    }

    /// The first record of a segment below the local start (archived, or
    /// quarantined) from `from` on whose timestamp satisfies `pred`, as
    /// (offset, timestamp); read where Fetch reads it.
    async fn find(
        &self,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        from: i64,
        pred: impl FnMut(i64) -> bool,
    ) -> ketch_storage::Result<Option<(i64, i64)>> {
        if segment.path.is_none() && segment.quarantine.is_some() {
            return self
                .store
                .find_quarantined(topic, partition, segment, from, pred)
                .await;
        }
        Ok(self.reader.find(segment, from, pred).await?)
    }

    /// [`Store::offset_for_timestamp`] over both tiers.
    ///
    /// The archive is searched below the local start the lookup began
    /// with, Redis from the local start when it is asked: when local
    /// retention trims a segment in between (archive reads can take a
    /// while), that segment is in neither search, and the lookup is made
    /// again (Kafka searches every remote segment, local or not).
    pub async fn offset_for_timestamp(
        &self,
        topic: &Topic,
        partition: i32,
        timestamp: i64,
    ) -> ketch_storage::Result<Option<(i64, i64)>> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let offsets = self.store.offsets(topic, partition).await?;
            if let Some(found) = self
                .archived_offset_for_timestamp(topic, partition, &offsets, timestamp)
                .await?
            {
                return Ok(Some(found));
            }
            let found = self
                .store
                .offset_for_timestamp(topic, partition, timestamp)
                .await?;
            if attempts >= LOOKUP_ATTEMPTS || !self.trimmed_since(topic, partition, &offsets).await? {
                return Ok(found);
            }
        }
    }

    /// The first record at or after `timestamp` in the archived segments
    /// below the local start of `offsets`.
    async fn archived_offset_for_timestamp(
        &self,
        topic: &Topic,
        partition: i32,
        offsets: &PartitionOffsets,
        timestamp: i64,
    ) -> ketch_storage::Result<Option<(i64, i64)>> {
        for segment in self.archived(topic, partition, offsets).await? {
            if segment.max_ts < timestamp {
                continue;
            }
            let from = segment.base.max(offsets.log_start_offset);
            if let Some(found) = self
                .find(topic, partition, &segment, from, |ts| ts >= timestamp)
                .await?
            {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Whether local retention moved the local start past what `offsets`
    /// said.
    async fn trimmed_since(
        &self,
        topic: &Topic,
        partition: i32,
        offsets: &PartitionOffsets,
    ) -> ketch_storage::Result<bool> {
        let now = self.store.offsets(topic, partition).await?;
        Ok(now.local_start_offset > offsets.local_start_offset)
    }

    /// [`Store::max_timestamp`] over both tiers; made again, as
    /// [`Tiers::offset_for_timestamp`] is, when local retention trimmed
    /// meanwhile.
    pub async fn max_timestamp(
        &self,
        topic: &Topic,
        partition: i32,
    ) -> ketch_storage::Result<Option<(i64, i64)>> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let offsets = self.store.offsets(topic, partition).await?;
            let found = self.max_timestamp_from(topic, partition, &offsets).await?;
            if attempts >= LOOKUP_ATTEMPTS || !self.trimmed_since(topic, partition, &offsets).await? {
                return Ok(found);
            }
        }
    }

    async fn max_timestamp_from(
        &self,
        topic: &Topic,
        partition: i32,
        offsets: &PartitionOffsets,
    ) -> ketch_storage::Result<Option<(i64, i64)>> {
        let local = self.store.max_timestamp(topic, partition).await?;
        let archived = self.archived(topic, partition, offsets).await?;
        let Some(largest) = archived.iter().map(|s| s.max_ts).max() else {
            return Ok(local);
        };
        if local.is_some_and(|(_, ts)| ts > largest) {
            return Ok(local);
        }
        // The segments by their largest timestamp, down: the first whose
        // record with it is still there answers, unless Redis holds a
        // later one. A segment's may be gone (below the log start, or an
        // aborted transaction's data or a marker, which are not archived):
        // then the largest of what it holds is a candidate, and the next
        // segments are looked at while theirs could be larger.
        let mut candidates: Vec<_> = archived.iter().collect();
        candidates.sort_by_key(|s| std::cmp::Reverse(s.max_ts));
        let mut best = local;
        for segment in candidates {
            // A segment's `max_ts` bounds what it holds; on a tie the
            // earlier offset (the archive's) answers, as Kafka's first.
            if best.is_some_and(|(_, ts)| ts > segment.max_ts) {
                break;
            }
            let from = segment.base.max(offsets.log_start_offset);
            let wanted = segment.max_ts;
            // One pass looks for `wanted` and, should it be gone, learns the
            // largest timestamp the segment still holds.
            let mut largest = None;
            let exact = self
                .find(topic, partition, segment, from, |ts| {
                    largest = Some(largest.map_or(ts, |l: i64| l.max(ts)));
                    ts == wanted
                })
                .await?;
            if let Some(found) = exact {
                // None later can be larger; one found before with the same
                // timestamp at an earlier offset answers instead.
                let earlier = best.filter(|(offset, ts)| *ts == found.1 && *offset < found.0);
                return Ok(earlier.or(Some(found)));
            }
            let Some(largest) = largest else { continue };
            let Some(found) = self
                .find(topic, partition, segment, from, move |ts| ts == largest)
                .await?
            else {
                continue;
            };
            let earlier = |(offset, ts): (i64, i64)| found.1 > ts || (found.1 == ts && found.0 < offset);
            if best.is_none_or(earlier) {
                best = Some(found);
            }
        }
        Ok(best)
    }
}

/// A topic's segment, retention and local retention settings (its
/// overrides, else the `defaults`), and how long idle producers are
/// remembered.
pub fn policy(topic: &Topic, defaults: &Defaults, producer_expiration: Duration) -> SegmentPolicy {
    let configs = Configs::new(&topic.configs, defaults);
    let number = |name: &str| configs.number(name);
    // remote.log.copy.disable: the archive is read but no longer written,
    // and retention no longer waits for it (Kafka's read-only remote log).
    let archive = configs.get("remote.storage.enable") == "true";
    let remote = configs.copies_to_archive();
    // Kafka: retention removes segments only under cleanup.policy=delete
    // (an empty policy keeps everything).
    let deletes = configs.cleans_up_by("delete");
    let retention = |name: &str| if deletes { number(name) } else { -1 };
    let retention_ms = retention("retention.ms");
    let retention_bytes = retention("retention.bytes");
    // Kafka: -2 means "as retention.*".
    let local = |value: i64, retention: i64| if value == -2 { retention } else { value };
    // A compacted topic's open segment is sealed by max.compaction.lag.ms
    // too: the open segment is never compacted (Kafka rolls it likewise).
    let compacts = configs.cleans_up_by("compact");
    let segment_ms = if compacts {
        number("segment.ms").min(number("max.compaction.lag.ms"))
    } else {
        number("segment.ms")
    };
    SegmentPolicy {
        segment_bytes: number("segment.bytes"),
        segment_ms,
        retention_ms,
        retention_bytes,
        remote,
        // Only while the archive is being deleted (turning remote storage
        // off sets `drop_archive`, cleared once it is gone and no segment
        // names a file): seal.lua then reads every kept segment's record
        // to clear its archive state, which a topic that never had an
        // archive, or whose archive is gone, need not pay on every tick.
        no_archive: !archive && topic.drop_archive,
        local_retention_ms: local(number("local.retention.ms"), retention_ms),
        local_retention_bytes: local(number("local.retention.bytes"), retention_bytes),
        producer_expiration_ms: i64::try_from(producer_expiration.as_millis()).unwrap_or(i64::MAX),
    }
}

/// A compacted topic's compaction settings; `None` for a topic that does
/// not compact.
pub fn compaction_policy(topic: &Topic, defaults: &Defaults, max_keys: usize) -> Option<CompactPolicy> {
    let configs = Configs::new(&topic.configs, defaults);
    if !configs.cleans_up_by("compact") {
        return None;
    }
    if configs.get("remote.storage.enable") == "true" {
        // Refused when configs change (Kafka refuses the pair), but a topic
        // change and a cluster-wide default change through two gateways at
        // once can still make it: compacting would trim records the
        // archive has not read, so the archive wins.
        tracing::warn!(topic = %topic.name,
            "the topic has remote storage and a compacting cleanup.policy; it is not compacted");
        return None;
    }
    let number = |name: &str| configs.number(name);
    Some(CompactPolicy {
        min_dirty_ratio: configs.get("min.cleanable.dirty.ratio").parse().unwrap_or(0.5),
        min_lag_ms: number("min.compaction.lag.ms"),
        max_lag_ms: number("max.compaction.lag.ms"),
        delete_retention_ms: number("delete.retention.ms"),
        max_keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archiving_backs_off_doubling_to_five_minutes_or_64_ticks() {
        let tick = Duration::from_secs(5);
        let mut delays = Vec::new();
        let mut last = None;
        for _ in 0..9 {
            let delay = next_backoff(last, tick);
            delays.push(delay.as_secs());
            last = Some(delay);
        }
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        let tick = Duration::from_millis(100);
        assert_eq!(
            next_backoff(Some(Duration::from_secs(6)), tick),
            Duration::from_millis(6_400)
        );
    }

    #[test]
    fn retention_applies_only_under_the_delete_cleanup_policy() {
        let keys = ketch_storage::Keys::new("ketch");
        let topic = |configs: &[(&str, &str)]| {
            let configs = configs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Topic::new("t", uuid::Uuid::nil(), Vec::new(), configs, &keys)
        };
        let expiration = Duration::from_secs(1);
        let defaults = Defaults::default();
        let deleting = policy(&topic(&[("retention.bytes", "10")]), &defaults, expiration);
        assert_eq!(
            (deleting.retention_ms, deleting.retention_bytes),
            (604_800_000, 10)
        );
        let keeping = policy(
            &topic(&[("retention.bytes", "10"), ("cleanup.policy", "")]),
            &defaults,
            expiration,
        );
        assert_eq!((keeping.retention_ms, keeping.retention_bytes), (-1, -1));
        assert_eq!(keeping.segment_ms, 604_800_000);
        // A cluster-wide default applies where the topic has no override.
        let (defaults, _) =
            defaults.with_cluster([("log.retention.ms", "5000"), ("log.cleanup.policy", "compact")]);
        let compacting = policy(&topic(&[("retention.bytes", "10")]), &defaults, expiration);
        assert_eq!((compacting.retention_ms, compacting.retention_bytes), (-1, -1));
        let deleting = policy(&topic(&[("cleanup.policy", "delete")]), &defaults, expiration);
        assert_eq!(deleting.retention_ms, 5000);
        assert!(compaction_policy(&topic(&[]), &defaults, 10).is_some());
    }

    #[test]
    fn a_topic_with_remote_storage_is_never_compacted() {
        let keys = ketch_storage::Keys::new("ketch");
        let configs = [("cleanup.policy", "compact"), ("remote.storage.enable", "true")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let topic = Topic::new("t", uuid::Uuid::nil(), Vec::new(), configs, &keys);
        assert!(compaction_policy(&topic, &Defaults::default(), 10).is_none());
    }

    #[test]
    fn a_table_is_due_for_maintenance_every_so_many_commits_to_it() {
        let commits = CommitCount::every(3);
        let due: Vec<bool> = (0..7).map(|_| commits.count("a")).collect();
        assert_eq!(due, [false, false, true, false, false, true, false]);
        assert!(!commits.count("b"), "each topic counts its own commits");
        commits.retain(|topic| topic != "a");
        assert!(!commits.count("a") && !commits.count("a") && commits.count("a"));
        let never = CommitCount::every(0);
        assert!((0..100).all(|_| !never.count("a")));
    }
}
