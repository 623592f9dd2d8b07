//! `ketch segments`: the operator's view of segments the archive could not
//! write. A quarantined segment stays in Redis (its batches in the
//! partition's quarantine stream) until an operator either has the storage
//! worker try it again (`retry`, after fixing what made it fail) or gives up
//! on it (`skip`): its records are deleted and its offsets become a hole
//! that consumers read past, recorded in the segment's entry. `skip` also
//! gives up on an archived segment whose data file the object store lost.

use anyhow::{Context as _, bail};
use clap::Subcommand;
use ketch_config::Settings;
use ketch_storage::segments::{Lease, Segment, SegmentChange, SegmentChanged};
use ketch_storage::{Store, StoreConfig, Topic};

#[derive(Debug, Subcommand)]
pub enum Action {
    /// Quarantined and skipped segments (of one topic, or all).
    List {
        #[arg(long)]
        topic: Option<String>,
    },
    /// Have the storage worker of the partition archive a quarantined
    /// segment again, on its next tick.
    Retry {
        topic: String,
        partition: i32,
        /// The segment's base offset.
        base: i64,
    },
    /// Give up on a quarantined segment: its records are deleted from Redis
    /// and its offsets are a hole consumers read past. Recorded, with the
    /// reason, in the segment's entry (`ketch segments list` shows it).
    ///
    /// Or on an archived segment whose data file the object store lost
    /// (reads of its offsets fail with KAFKA_STORAGE_ERROR), once local
    /// retention trimmed it from Redis: its offsets become a hole too. The
    /// file must be missing (`--damaged` to give up on one that is there
    /// but cannot be read).
    Skip {
        topic: String,
        partition: i32,
        /// The segment's base offset.
        base: i64,
        /// Why (kept with the hole).
        #[arg(long)]
        reason: String,
        /// An archived segment's data file is there but cannot be read:
        /// give up on it anyway.
        #[arg(long)]
        damaged: bool,
    },
}

/// How long a skip holds the partition's archiving registration at most
/// (released when it is done; a skip killed meanwhile lets it expire).
const SKIP_LEASE: std::time::Duration = std::time::Duration::from_secs(60);

pub async fn run(settings: &Settings, action: Action) -> anyhow::Result<()> {
    let store = Store::new(&StoreConfig::from_settings(settings))?;
    match action {
        Action::List { topic } => list(&store, topic.as_deref()).await,
        Action::Retry {
            topic,
            partition,
            base,
        } => {
            let (topic, segment) = find(&store, &topic, partition, base).await?;
            match store
                .change_segment(&topic, partition, &segment, SegmentChange::Retry)
                .await?
            {
                SegmentChanged::Done => {
                    println!(
                        "retry requested: the storage worker of {} partition {partition} archives offsets {}..={} on its next tick",
                        topic.name, segment.base, segment.last
                    );
                    Ok(())
                }
                other => bail!("cannot retry: {}", refusal(other)),
            }
        }
        Action::Skip {
            topic,
            partition,
            base,
            reason,
            damaged,
        } => {
            let (topic, segment) = find(&store, &topic, partition, base).await?;
            if let Some(path) = segment.path.as_deref().filter(|p| !p.is_empty()) {
                return skip_archived(
                    settings, &store, &topic, partition, &segment, path, &reason, damaged,
                )
                .await;
            }
            // The partition's archiving registration, held while skipping:
            // no storage worker can be archiving the segment (from the
            // batches a skip deletes) meanwhile, even one whose retry was
            // requested.
            let holder = format!("ketch-segments-skip-{}", std::process::id());
            if !store
                .take_lease(Lease::Archiving, &topic, partition, &holder, SKIP_LEASE)
                .await?
            {
                bail!(
                    "cannot skip now: a storage worker is archiving {} partition {partition} (it holds the partition's archiving registration); try again once it is done",
                    topic.name
                );
            }
            let skipped = async {
                let change = SegmentChange::Skip {
                    reason: &reason,
                    held: true,
                };
                match store.change_segment(&topic, partition, &segment, change).await? {
                    SegmentChanged::Done => {
                        store.purge_quarantine(&topic, partition, &segment).await?;
                        println!(
                            "skipped: offsets {}..={} of {} partition {partition} are a hole; their quarantined copy is deleted (the log's copy goes with local retention)",
                            segment.base, segment.last, topic.name
                        );
                        Ok(())
                    }
                    other => bail!("cannot skip: {}", refusal(other)),
                }
            }
            .await;
            if let Err(e) = store
                .release_lease(Lease::Archiving, &topic, partition, &holder)
                .await
            {
                eprintln!(
                    "warning: the archiving registration is released when it expires ({SKIP_LEASE:?}): {e}"
                );
            }
            skipped
        }
    }
}

/// Gives up on an archived segment whose data file is lost (or, with
/// `damaged`, cannot be read): only below the local start (above it,
/// readers read Redis and the file is not needed yet), and only when the
/// object store says the file is missing.
#[allow(clippy::too_many_arguments)]
async fn skip_archived(
    settings: &Settings,
    store: &Store,
    topic: &Topic,
    partition: i32,
    segment: &Segment,
    path: &str,
    reason: &str,
    damaged: bool,
) -> anyhow::Result<()> {
    let offsets = store.offsets(topic, partition).await?;
    if segment.last >= offsets.local_start_offset {
        bail!(
            "cannot skip: offsets {}..={} of {} partition {partition} are still in Redis (local start {}), where fetches read them; its data file {path} is not read until local retention trims them",
            segment.base,
            segment.last,
            topic.name,
            offsets.local_start_offset
        );
    }
    let exists = ketch_tiering::reader::data_file_exists(&settings.tiering, path)
        .await
        .with_context(|| format!("cannot tell whether the data file {path} exists"))?;
    if exists && !damaged {
        bail!(
            "cannot skip: the segment is archived and its data file {path} is there (--damaged gives up on a file that cannot be read)"
        );
    }
    // A missing file is believed only once this command is seen to reach
    // the gateways' object store: settings that name another endpoint,
    // bucket or credentials, or a host without the warehouse's mount, find
    // every file missing (an S3 HEAD cannot tell a missing bucket from a
    // missing key). Another data file of the topic must be there.
    if !exists && !damaged {
        let others = other_data_files(store, topic, partition, path).await?;
        if others.is_empty() {
            bail!(
                "cannot skip: {} has no other data file to confirm that this command reaches the gateways' object store (--damaged gives up on the segment anyway)",
                topic.name
            );
        }
        let mut seen = false;
        for other in &others {
            if ketch_tiering::reader::data_file_exists(&settings.tiering, other)
                .await
                .with_context(|| format!("cannot tell whether the data file {other} exists"))?
            {
                seen = true;
                break;
            }
        }
        if !seen {
            bail!(
                "cannot skip: the data files of other segments are missing too ({}): this command may not reach the gateways' object store (its tiering.* settings, or the warehouse's mount here); --damaged gives up on the segment anyway",
                others.join(", ")
            );
        }
    }
    let change = SegmentChange::Lost { reason, path };
    match store.change_segment(topic, partition, segment, change).await? {
        SegmentChanged::Done => {
            println!(
                "skipped: offsets {}..={} of {} partition {partition} are a hole; the Iceberg table still names {path} (docs/tiered-storage.md says how to drop it there)",
                segment.base, segment.last, topic.name
            );
            Ok(())
        }
        other => bail!("cannot skip: {}", refusal(other)),
    }
}

/// Data files of `topic` other than `path`, to tell whether this command
/// reaches the gateways' object store: the newest of `partition` and of
/// up to [`WITNESS_PARTITIONS`] other partitions (a lifecycle rule or a
/// migration that lost files lost the oldest first).
async fn other_data_files(
    store: &Store,
    topic: &Topic,
    partition: i32,
    path: &str,
) -> anyhow::Result<Vec<String>> {
    let partitions = std::iter::once(partition).chain((0..topic.partitions()).filter(|p| *p != partition));
    let mut found = Vec::new();
    for p in partitions.take(1 + WITNESS_PARTITIONS) {
        let newest = store
            .segments(topic, p)
            .await?
            .into_iter()
            .rev()
            .filter_map(|s| s.path)
            .find(|other| !other.is_empty() && other != path);
        found.extend(newest);
    }
    Ok(found)
}

/// Other partitions whose newest data file may confirm that the object
/// store is reached.
const WITNESS_PARTITIONS: usize = 3;

fn refusal(changed: SegmentChanged) -> &'static str {
    match changed {
        SegmentChanged::Gone => "the segment no longer exists",
        SegmentChanged::Archived => "the segment is archived",
        SegmentChanged::NotQuarantined => "the segment is not quarantined",
        SegmentChanged::RetryPending => "a retry of the segment is requested and not over",
        SegmentChanged::NotArchived => "the segment is no longer archived in that data file",
        SegmentChanged::Done => "done",
    }
}

async fn find(
    store: &Store,
    name: &str,
    partition: i32,
    base: i64,
) -> anyhow::Result<(std::sync::Arc<Topic>, Segment)> {
    let topic = store
        .topic_fresh(name)
        .await?
        .with_context(|| format!("no topic {name}"))?;
    if !topic.has_partition(partition) {
        bail!("topic {name} has no partition {partition}");
    }
    let segment = store
        .segments(&topic, partition)
        .await?
        .into_iter()
        .find(|s| s.base == base)
        .with_context(|| {
            format!("{name} partition {partition} has no sealed segment at base offset {base}")
        })?;
    Ok((topic, segment))
}

async fn list(store: &Store, only: Option<&str>) -> anyhow::Result<()> {
    let topics = match only {
        Some(name) => vec![
            store
                .topic_fresh(name)
                .await?
                .with_context(|| format!("no topic {name}"))?,
        ],
        None => store.all_topics().await?,
    };
    println!(
        "{:<24} {:>9} {:>12} {:>12} {:>10}  {:<16} {:<24} reason",
        "topic", "partition", "base", "last", "bytes", "state", "since"
    );
    let mut listed = 0;
    // A partition that cannot be read (its master not answering) is said
    // on stderr and the others are listed; the command then fails.
    let mut unread = 0;
    for topic in &topics {
        for partition in 0..topic.partitions() {
            let segments = match store.segments(topic, partition).await {
                Ok(segments) => segments,
                Err(e) => {
                    eprintln!(
                        "{} partition {partition}: cannot read its segments: {e}",
                        topic.name
                    );
                    unread += 1;
                    continue;
                }
            };
            for segment in segments {
                let (state, since, reason) = match (&segment.quarantine, &segment.skipped) {
                    (Some(q), _) if q.retry => ("retry requested", q.at, q.reason.clone()),
                    (Some(q), _) => ("quarantined", q.at, q.reason.clone()),
                    (None, Some(s)) => ("skipped (hole)", s.at, format!("{} (was: {})", s.reason, s.error)),
                    (None, None) => continue,
                };
                listed += 1;
                println!(
                    "{:<24} {:>9} {:>12} {:>12} {:>10}  {:<16} {:<24} {reason}",
                    topic.name,
                    partition,
                    segment.base,
                    segment.last,
                    segment.bytes,
                    state,
                    ketch_gateway::time::utc_timestamp(since),
                );
            }
        }
    }
    if unread > 0 {
        bail!("{unread} partition(s) could not be read: the list above leaves them out");
    }
    if listed == 0 {
        println!("(no quarantined or skipped segments)");
    }
    Ok(())
}
