//! Upkeep of a topic's table: expiring old snapshots and merging small
//! manifests, so that an archive commit costs about the same after thousands
//! of segments as after ten.
//!
//! Every archive commit is a fast append: it adds a snapshot to the table
//! metadata (which every commit rewrites and every load reads) and a
//! one-file manifest to the new snapshot's manifest list, and its duplicate
//! check reads every manifest that list names. [`expire_snapshots`] bounds
//! the snapshots; [`rewrite_manifests`] merges the small manifests.
//!
//! iceberg-rust 0.10.1 has no rewrite-manifests action, and a commit can only
//! be made of its own actions (`TransactionAction` and the `TableCommit`
//! builder are crate-private). Its fast append, though, carries forward the
//! manifests the current snapshot's manifest list names. So the rewrite
//! writes the merged manifest and a manifest list naming it in place of its
//! inputs, and commits a fast append of no files on top of a view of the
//! table whose current snapshot has that list ([`Staged`]). The commit goes
//! to the real catalog with the fast append's requirements (the table's
//! uuid, its current snapshot), so a table that changed meanwhile refuses
//! it. The snapshot's operation is `append` (adding nothing), not Java's
//! `replace`: iceberg-rust computes summaries for append, overwrite and
//! delete only.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use iceberg::spec::{
    FormatVersion, ManifestContentType, ManifestFile, ManifestListWriter, ManifestWriterBuilder,
    TableMetadata,
};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{
    Catalog, ErrorKind, Namespace, NamespaceIdent, Runtime, TableCommit, TableCreation, TableIdent,
};

use crate::{Error, Result};

/// The table a catalog answered a commit with, read and written through
/// `before`'s file IO: iceberg-catalog-rest builds the table it answers a
/// commit with from the catalog's properties alone, without the config
/// its LoadTable answer carried, which is where a catalog vends keys for
/// the table's files; every write after the first commit would lack them.
pub(crate) fn keeping_file_io(committed: Table, before: &Table) -> Table {
    match rebuilt(&committed, committed.metadata_ref(), before.file_io()) {
        Ok(table) => table,
        Err(e) => {
            tracing::warn!(table = %committed.identifier(), error = %e,
                "cannot keep the table's file IO after a commit; using the catalog's");
            committed
        }
    }
}

/// Snapshot summary key of a manifest rewrite: how many manifests it merged.
pub const MANIFESTS_MERGED: &str = "ketch.manifests-merged";
/// Manifests this big or bigger are left alone (Iceberg's default
/// `commit.manifest.target-size-bytes`), and merged manifests stay about
/// this size: reading and rewriting a manifest costs in proportion to its
/// size, reading one costs a request whatever its size.
const TARGET_MANIFEST_BYTES: i64 = 8 * 1024 * 1024;
/// Previous metadata files kept besides the current one, for a reader that
/// resolved the table's location a few commits ago and reads it now.
const PREVIOUS_METADATA_KEPT: usize = 10;
/// Manifests read at once while merging.
const READS_AT_ONCE: usize = 8;
/// Commit attempts of a rewrite: a table that moved on by appends only is
/// merged again on top of them; past this, the next maintenance run tries.
const REWRITE_ATTEMPTS: usize = 3;

/// Expires the snapshots older than `retention`, except the newest `kept`
/// of the current snapshot's history, which always include the current
/// snapshot (Iceberg's `expire_snapshots` with `older_than` and
/// `retain_last`), and deletes their manifest lists. Data files and
/// manifests stay. Returns the table after the commit and how many
/// snapshots went, or `None` without committing when none is due.
pub async fn expire_snapshots(
    catalog: &dyn Catalog,
    table: &Table,
    retention: Duration,
    kept: usize,
) -> Result<Option<(Table, usize)>> {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let cutoff = ketch_storage::now_ms().saturating_sub(retention_ms);
    if !expirable(table.metadata(), cutoff, kept) {
        return Ok(None);
    }
    let transaction = Transaction::new(table);
    let transaction = transaction
        .expire_snapshots()
        .expire_older_than_ms(cutoff)
        .retain_last(kept)
        .apply(transaction)?;
    let after = keeping_file_io(transaction.commit(catalog).await?, table);
    let remaining: HashSet<i64> = after.metadata().snapshots().map(|s| s.snapshot_id()).collect();
    let lists: Vec<String> = table
        .metadata()
        .snapshots()
        .filter(|s| !remaining.contains(&s.snapshot_id()))
        .map(|s| s.manifest_list().to_owned())
        .collect();
    // No snapshot names them any more: only a reader still planning a scan
    // of an expired snapshot could want them (Iceberg's expiry deletes them
    // too).
    delete_all(&after, &lists).await;
    Ok(Some((after, lists.len())))
}

/// Deletes the previous metadata files the table's metadata log names,
/// except the newest [`PREVIOUS_METADATA_KEPT`], starting after `done` (the
/// last file an earlier call deleted, when still in the log). Every commit
/// writes a whole new metadata file, and iceberg-rust 0.10.1 does not delete
/// old ones (`write.metadata.delete-after-commit.enabled`). The log holds
/// the last 100 (`write.metadata.previous-versions-max`): a file that leaves
/// it before a call sees it stays. Returns how many were deleted and what to
/// pass as `done` next time.
pub async fn delete_old_metadata(table: &Table, done: Option<String>) -> (usize, Option<String>) {
    let log = table.metadata().metadata_log();
    let old = &log[..log.len().saturating_sub(PREVIOUS_METADATA_KEPT)];
    let start = done
        .as_ref()
        .and_then(|done| old.iter().position(|entry| &entry.metadata_file == done))
        .map_or(0, |at| at + 1);
    let files: Vec<String> = old[start..]
        .iter()
        .map(|entry| entry.metadata_file.clone())
        .collect();
    delete_all(table, &files).await;
    (files.len(), files.last().cloned().or(done))
}

/// Whether a snapshot older than `cutoff` is outside the newest `kept` of
/// the current snapshot's history: without one, an expiry would commit
/// nothing but a new metadata file.
fn expirable(metadata: &TableMetadata, cutoff: i64, kept: usize) -> bool {
    let mut newest = HashSet::new();
    let mut next = metadata.current_snapshot_id();
    while let Some(id) = next.filter(|_| newest.len() < kept) {
        newest.insert(id);
        next = metadata.snapshot_by_id(id).and_then(|s| s.parent_snapshot_id());
    }
    metadata
        .snapshots()
        .any(|s| s.timestamp_ms() < cutoff && !newest.contains(&s.snapshot_id()))
}

/// What an expiry did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    /// Snapshots expired.
    pub snapshots: usize,
    /// Their manifest lists and old metadata files, deleted.
    pub files: usize,
}

/// What a manifest rewrite did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    /// Manifests replaced.
    pub merged: usize,
    /// Manifests written in their place.
    pub written: usize,
    /// Manifests the new current snapshot lists.
    pub manifests: usize,
}

/// Merges the current snapshot's small data manifests (under 8 MiB) into
/// as few as hold them at about 8 MiB each, and commits a snapshot listing
/// the merged manifests in their place: the same live data files, none added
/// or removed. Delete manifests and manifests of another partition spec are
/// carried over as they are. Returns `None` without committing when there is
/// nothing to merge.
///
/// If the table moved on meanwhile, the catalog refuses the commit; when the
/// merged manifests are all still listed (other writers only appended), the
/// rewrite is committed again on top of the new snapshot, up to
/// [`REWRITE_ATTEMPTS`] times. Otherwise it fails and nothing changed.
pub async fn rewrite_manifests(catalog: Arc<dyn Catalog>, table: &Table) -> Result<Option<(Table, Rewrite)>> {
    let metadata = table.metadata();
    let Some(current) = metadata.current_snapshot() else {
        return Ok(None);
    };
    // ketch creates v2 tables; v3 manifests also carry row ids this does not.
    if metadata.format_version() != FormatVersion::V2 {
        return Ok(None);
    }
    let listed = manifests(table).await?;
    let spec_id = metadata.default_partition_spec_id();
    let small = listed.into_iter().filter(|m| {
        m.content == ManifestContentType::Data
            && m.partition_spec_id == spec_id
            && m.manifest_length < TARGET_MANIFEST_BYTES
    });
    let groups = groups(small);
    if groups.is_empty() {
        return Ok(None);
    }
    let commit = uuid::Uuid::now_v7();
    let mut written = Vec::new();
    let mut paths = Vec::new();
    for (n, group) in groups.iter().enumerate() {
        let path = format!("{}/metadata/{commit}-merged-m{n}.avro", metadata.location());
        let merged = merge(
            table,
            current.snapshot_id(),
            current.sequence_number(),
            group,
            &path,
        )
        .await;
        paths.push(path);
        match merged {
            Ok(manifest) => written.push(manifest),
            Err(e) => {
                delete_all(table, &paths).await;
                return Err(e);
            }
        }
    }
    let mut replaced = HashSet::new();
    for manifest in groups.into_iter().flatten() {
        replaced.insert(manifest.manifest_path);
    }
    let mut base = table.clone();
    for attempt in 1..=REWRITE_ATTEMPTS {
        let outcome = commit_rewrite(&catalog, &base, &replaced, &written, commit, attempt).await;
        let conflict = match outcome {
            Ok(Some((after, manifests))) => {
                let rewrite = Rewrite {
                    merged: replaced.len(),
                    written: written.len(),
                    manifests,
                };
                return Ok(Some((after, rewrite)));
            }
            // Another writer merged or removed manifests: start over later.
            Ok(None) => break,
            Err(Error::Iceberg(e)) if e.kind() == ErrorKind::CatalogCommitConflicts => e,
            // The commit may or may not have reached the catalog: the merged
            // manifests stay, in case it did.
            Err(e) => return Err(e),
        };
        if attempt == REWRITE_ATTEMPTS {
            delete_all(table, &paths).await;
            return Err(Error::Iceberg(conflict));
        }
        base = catalog.load_table(table.identifier()).await?;
    }
    delete_all(table, &paths).await;
    Ok(None)
}

/// The manifests the table's current snapshot lists.
pub async fn manifests(table: &Table) -> Result<Vec<ManifestFile>> {
    let Some(current) = table.metadata().current_snapshot() else {
        return Ok(Vec::new());
    };
    let list = table.manifest_list_reader(current).load().await?;
    Ok(list.consume_entries().into_iter().collect())
}

/// Packs manifests, in list order, into groups of about
/// [`TARGET_MANIFEST_BYTES`]; a group of one has nothing to merge and is
/// dropped.
fn groups(small: impl Iterator<Item = ManifestFile>) -> Vec<Vec<ManifestFile>> {
    let mut groups: Vec<(i64, Vec<ManifestFile>)> = Vec::new();
    for manifest in small {
        match groups.last_mut() {
            Some((bytes, group)) if *bytes + manifest.manifest_length <= TARGET_MANIFEST_BYTES => {
                *bytes += manifest.manifest_length;
                group.push(manifest);
            }
            _ => groups.push((manifest.manifest_length, vec![manifest])),
        }
    }
    groups
        .into_iter()
        .map(|(_, group)| group)
        .filter(|group| group.len() > 1)
        .collect()
}

/// Writes the live entries of `group` to one manifest at `path`, as
/// existing entries that keep their snapshot id and sequence numbers. The
/// manifest is recorded as added by the snapshot it was merged from
/// (`snapshot_id`, `sequence_number`): the rewrite's own snapshot id is
/// chosen by the fast append, later.
async fn merge(
    table: &Table,
    snapshot_id: i64,
    sequence_number: i64,
    group: &[ManifestFile],
    path: &str,
) -> Result<ManifestFile> {
    let file_io = table.file_io();
    let mut loaded = Vec::with_capacity(group.len());
    for some in group.chunks(READS_AT_ONCE) {
        let reads: Vec<_> = some
            .iter()
            .map(|manifest| manifest.load_manifest(file_io))
            .collect();
        loaded.extend(futures::future::try_join_all(reads).await?);
    }
    let metadata = table.metadata();
    let mut writer = ManifestWriterBuilder::new(
        file_io.new_output(path)?,
        Some(snapshot_id),
        metadata.current_schema().clone(),
        metadata.default_partition_spec().as_ref().clone(),
    )
    .build_v2_data();
    for entry in loaded.iter().flat_map(|m| m.entries()).filter(|e| e.is_alive()) {
        let (Some(snapshot), Some(sequence)) = (entry.snapshot_id(), entry.sequence_number()) else {
            return Err(Error::Data(format!(
                "the manifest entry of {} has no snapshot id or sequence number",
                entry.file_path()
            )));
        };
        writer.add_existing_file(
            entry.data_file().clone(),
            snapshot,
            sequence,
            entry.file_sequence_number,
        )?;
    }
    let mut manifest = writer.write_manifest_file().await?;
    manifest.sequence_number = sequence_number;
    Ok(manifest)
}

/// One commit attempt of a rewrite on top of `base`: `None` when `base` no
/// longer lists every manifest in `replaced`, else the table after the
/// commit and how many manifests it lists.
async fn commit_rewrite(
    catalog: &Arc<dyn Catalog>,
    base: &Table,
    replaced: &HashSet<String>,
    merged: &[ManifestFile],
    commit: uuid::Uuid,
    attempt: usize,
) -> Result<Option<(Table, usize)>> {
    let Some(current) = base.metadata().current_snapshot() else {
        return Ok(None);
    };
    let (still_listed, others): (Vec<ManifestFile>, Vec<ManifestFile>) = manifests(base)
        .await?
        .into_iter()
        .partition(|m| replaced.contains(&m.manifest_path));
    if still_listed.len() != replaced.len() {
        return Ok(None);
    }
    let list: Vec<ManifestFile> = merged.iter().cloned().chain(others).collect();
    let manifests = list.len();
    let list_path = format!(
        "{}/metadata/{commit}-merged-list-{attempt}.avro",
        base.metadata().location()
    );
    let mut writer = ManifestListWriter::v2(
        base.file_io().new_output(&list_path)?.writer().await?,
        current.snapshot_id(),
        current.parent_snapshot_id(),
        current.sequence_number(),
    );
    writer.add_manifests(list.into_iter())?;
    writer.close().await?;

    let committed = async {
        let staged = Staged {
            catalog: catalog.clone(),
            view: view(base, &list_path)?,
        };
        let transaction = Transaction::new(&staged.view);
        let transaction = transaction
            .fast_append()
            // It adds no file to check.
            .with_check_duplicate(false)
            .set_snapshot_properties(HashMap::from([(
                MANIFESTS_MERGED.to_owned(),
                replaced.len().to_string(),
            )]))
            .apply(transaction)?;
        Ok::<_, Error>(transaction.commit(&staged).await?)
    }
    .await;
    // The fast append copied the list's entries into its own list, so the
    // staging list is never referenced, committed or not.
    delete_all(base, &[list_path]).await;
    Ok(Some((keeping_file_io(committed?, base), manifests)))
}

/// `table` with its current snapshot's manifest list replaced by `list`.
fn view(table: &Table, list: &str) -> Result<Table> {
    let bad = |e: serde_json::Error| Error::Data(format!("table metadata: {e}"));
    let current = table.metadata().current_snapshot_id();
    let mut json = serde_json::to_value(table.metadata()).map_err(bad)?;
    let snapshots = json
        .get_mut("snapshots")
        .and_then(serde_json::Value::as_array_mut)
        .ok_or_else(|| Error::Data("table metadata without snapshots".to_owned()))?;
    for snapshot in snapshots {
        if snapshot.get("snapshot-id").and_then(serde_json::Value::as_i64) == current {
            snapshot["manifest-list"] = list.into();
        }
    }
    let metadata: TableMetadata = serde_json::from_value(json).map_err(bad)?;
    rebuilt(table, metadata, table.file_io())
}

/// `table` (its identifier and metadata location) with `metadata`, read
/// and written through `file_io`.
fn rebuilt(
    table: &Table,
    metadata: impl Into<iceberg::spec::TableMetadataRef>,
    file_io: &iceberg::io::FileIO,
) -> Result<Table> {
    let mut builder = Table::builder()
        .metadata(metadata)
        .identifier(table.identifier().clone())
        .file_io(file_io.clone())
        .runtime(Runtime::try_current()?);
    if let Some(location) = table.metadata_location() {
        builder = builder.metadata_location(location);
    }
    Ok(builder.build()?)
}

/// Deletes files nothing references any more; a failure only leaves an
/// orphan behind.
async fn delete_all(table: &Table, paths: &[String]) {
    for path in paths {
        if let Err(e) = table.file_io().delete(path).await {
            tracing::debug!(path, error = %e, "cannot delete an unreferenced metadata file");
        }
    }
}

/// The catalog as a commit on top of a view sees it: loading the viewed
/// table returns the view; everything else, and the commit itself, goes to
/// the real catalog, which checks the commit's requirements against the
/// real table.
#[derive(Debug)]
struct Staged {
    catalog: Arc<dyn Catalog>,
    view: Table,
}

#[async_trait]
impl Catalog for Staged {
    async fn list_namespaces(&self, parent: Option<&NamespaceIdent>) -> iceberg::Result<Vec<NamespaceIdent>> {
        self.catalog.list_namespaces(parent).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        self.catalog.create_namespace(namespace, properties).await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
        self.catalog.get_namespace(namespace).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
        self.catalog.namespace_exists(namespace).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        self.catalog.update_namespace(namespace, properties).await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<()> {
        self.catalog.drop_namespace(namespace).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        self.catalog.list_tables(namespace).await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> iceberg::Result<Table> {
        self.catalog.create_table(namespace, creation).await
    }

    async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
        if table == self.view.identifier() {
            Ok(self.view.clone())
        } else {
            self.catalog.load_table(table).await
        }
    }

    async fn drop_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.catalog.drop_table(table).await
    }

    async fn purge_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.catalog.purge_table(table).await
    }

    async fn table_exists(&self, table: &TableIdent) -> iceberg::Result<bool> {
        self.catalog.table_exists(table).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
        self.catalog.rename_table(src, dest).await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> iceberg::Result<Table> {
        self.catalog.register_table(table, metadata_location).await
    }

    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        // The transaction would retry on the same view, and fail the same
        // way: the rewrite rebases itself instead.
        self.catalog
            .update_table(commit)
            .await
            .map_err(|e| e.with_retryable(false))
    }
}

#[cfg(test)]
mod tests {
    use iceberg::spec::Operation;

    use super::*;
    use crate::testing::{Lake, live_files, rows};

    /// A table with `segments` segments of 10 records archived, alternating
    /// between partitions 0 and 1: as many commits, snapshots and manifests.
    async fn archived(lake: &Lake, segments: i64) -> Table {
        let mut table = lake.table().await;
        for n in 0..segments {
            lake.archive(&mut table, (n % 2) as i32, n * 10, 10).await;
        }
        table
    }

    fn expected_rows(segments: i64) -> std::collections::BTreeSet<(i32, i64)> {
        (0..segments * 10)
            .map(|offset| (((offset / 10) % 2) as i32, offset))
            .collect()
    }

    /// The base offsets in the summaries of the table's archive commits.
    fn committed_bases(table: &Table) -> Vec<i64> {
        let mut bases: Vec<i64> = table
            .metadata()
            .snapshots()
            .filter_map(|s| {
                s.summary()
                    .additional_properties
                    .get("ketch.base-offset")?
                    .parse()
                    .ok()
            })
            .collect();
        bases.sort_unstable();
        bases
    }

    #[tokio::test]
    async fn expiry_removes_old_snapshots_but_keeps_the_newest() {
        let lake = Lake::new(|s| {
            s.snapshot_retention = ketch_config::Duration::from_millis(0);
            s.snapshots_kept = 10;
        });
        let mut table = archived(&lake, 30).await;
        assert_eq!(table.metadata().snapshots().count(), 30);
        let current = table.metadata().current_snapshot_id();
        tokio::time::sleep(Duration::from_millis(5)).await;

        let expired = lake.archiver.expire_snapshots(&mut table).await.unwrap();

        // 31 metadata files before the expiry's: all but the newest 10 go.
        let expected = Expired {
            snapshots: 20,
            files: 20 + 21,
        };
        assert_eq!(expired, expected);
        let mut table = lake.table().await;
        assert_eq!(table.metadata().current_snapshot_id(), current);
        let newest: Vec<i64> = (20..30).map(|n| n * 10).collect();
        assert_eq!(committed_bases(&table), newest);
        assert_eq!(rows(&table).await, expected_rows(30), "every row is still read");
        assert_eq!(
            metadata_files(&table, "snap-"),
            10,
            "the manifest lists of the kept snapshots"
        );
        assert_eq!(metadata_files(&table, ".metadata.json"), 11);

        // The next expiry deletes only what was written since.
        lake.archive(&mut table, 0, 300, 10).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let again = lake.archiver.expire_snapshots(&mut table).await.unwrap();
        assert_eq!(
            again,
            Expired {
                snapshots: 1,
                files: 1 + 2
            }
        );
        assert_eq!(metadata_files(&table, ".metadata.json"), 11);
    }

    /// How many files of the table's metadata directory have `part` in their name.
    fn metadata_files(table: &Table, part: &str) -> usize {
        let metadata = table
            .metadata()
            .location()
            .trim_start_matches("file://")
            .to_owned()
            + "/metadata";
        std::fs::read_dir(metadata)
            .unwrap()
            .filter(|f| f.as_ref().unwrap().file_name().to_string_lossy().contains(part))
            .count()
    }

    #[tokio::test]
    async fn snapshots_younger_than_the_retention_are_not_expired() {
        let lake = Lake::new(|s| s.snapshots_kept = 1);
        let mut table = archived(&lake, 12).await;
        let location = table.metadata_location().map(str::to_owned);

        assert_eq!(
            lake.archiver
                .expire_snapshots(&mut table)
                .await
                .unwrap()
                .snapshots,
            0
        );

        let table = lake.table().await;
        assert_eq!(table.metadata().snapshots().count(), 12);
        assert_eq!(
            table.metadata_location().map(str::to_owned),
            location,
            "nothing due, nothing committed"
        );
    }

    #[tokio::test]
    async fn a_commit_whose_snapshot_expired_is_still_found_and_an_orphan_is_replaced() {
        let lake = Lake::new(|s| {
            s.snapshot_retention = ketch_config::Duration::from_millis(0);
            s.snapshots_kept = 1;
        });
        let mut table = lake.table().await;
        let first = lake.archive(&mut table, 0, 0, 10).await;
        for n in 1..4 {
            lake.archive(&mut table, 0, n * 10, 10).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(
            lake.archiver
                .expire_snapshots(&mut table)
                .await
                .unwrap()
                .snapshots,
            3
        );
        assert_eq!(committed_bases(&table), [30]);

        // A crash after the first commit, before Redis heard of it.
        let again = lake.archive(&mut table, 0, 0, 10).await;
        assert_eq!(
            (again.written, &again.path, again.file_bytes),
            (false, &first.path, first.file_bytes)
        );
        assert_eq!(table.metadata().snapshots().count(), 1, "not committed twice");

        // A crash after writing the next segment's file, before its commit.
        let orphan = first
            .path
            .replace("00000000000000000000.parquet", "00000000000000000040.parquet");
        assert_ne!(orphan, first.path);
        table
            .file_io()
            .new_output(&orphan)
            .unwrap()
            .write("torn".into())
            .await
            .unwrap();
        let next = lake.archive(&mut table, 0, 40, 10).await;
        assert_eq!((next.written, &next.path), (true, &orphan));
        assert_eq!(rows(&lake.table().await).await.len(), 50);
    }

    #[tokio::test]
    async fn rewrite_merges_the_manifests_and_keeps_every_data_file() {
        let lake = Lake::new(|_| {});
        let mut table = archived(&lake, 25).await;
        assert_eq!(manifests(&table).await.unwrap().len(), 25);
        let files = live_files(&table).await;
        let totals = table
            .metadata()
            .current_snapshot()
            .unwrap()
            .summary()
            .additional_properties
            .clone();

        let rewrite = lake.archiver.rewrite_manifests(&mut table).await.unwrap();

        let expected = Rewrite {
            merged: 25,
            written: 1,
            manifests: 1,
        };
        assert_eq!(rewrite, Some(expected));
        let mut table = lake.table().await;
        assert_eq!(manifests(&table).await.unwrap().len(), 1);
        assert_eq!(live_files(&table).await, files, "no data file added or removed");
        assert_eq!(rows(&table).await, expected_rows(25));
        let snapshot = table.metadata().current_snapshot().unwrap();
        let summary = snapshot.summary();
        assert_eq!(summary.operation, Operation::Append);
        assert_eq!(summary.additional_properties.get(MANIFESTS_MERGED).unwrap(), "25");
        for total in ["total-data-files", "total-records", "total-files-size"] {
            assert_eq!(
                summary.additional_properties.get(total),
                totals.get(total),
                "{total}"
            );
        }
        assert!(!summary.additional_properties.contains_key("added-data-files"));
        assert!(
            lake.archiver
                .rewrite_manifests(&mut table)
                .await
                .unwrap()
                .is_none(),
            "nothing left to merge"
        );

        // Later commits add manifests; the next rewrite merges them with the merged one.
        for n in 25..28 {
            lake.archive(&mut table, (n % 2) as i32, n * 10, 10).await;
        }
        assert_eq!(manifests(&table).await.unwrap().len(), 4);
        let rewrite = lake
            .archiver
            .rewrite_manifests(&mut table)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((rewrite.merged, rewrite.manifests), (4, 1));
        assert_eq!(rows(&lake.table().await).await, expected_rows(28));
    }

    #[tokio::test]
    async fn the_duplicate_check_still_sees_merged_files() {
        let lake = Lake::new(|_| {});
        let mut table = archived(&lake, 3).await;
        lake.archiver
            .rewrite_manifests(&mut table)
            .await
            .unwrap()
            .unwrap();
        let merged = manifests(&table).await.unwrap().remove(0);
        let manifest = merged.load_manifest(table.file_io()).await.unwrap();
        let file = manifest.entries()[0].data_file().clone();

        let transaction = Transaction::new(&table);
        let transaction = transaction
            .fast_append()
            .add_data_files([file])
            .apply(transaction)
            .unwrap();
        let catalog = lake.archiver.catalog().await.unwrap();
        let refused = transaction.commit(catalog.as_ref()).await.unwrap_err();

        assert!(refused.to_string().contains("already referenced"), "{refused}");
        assert_eq!(rows(&lake.table().await).await, expected_rows(3));
    }

    #[tokio::test]
    async fn a_rewrite_commit_on_a_table_that_changed_is_refused_without_damage() {
        let lake = Lake::new(|_| {});
        let stale = archived(&lake, 4).await;
        let current = stale.metadata().current_snapshot().unwrap().clone();
        let listed = manifests(&stale).await.unwrap();
        let path = format!("{}/metadata/test-merged-m0.avro", stale.metadata().location());
        let merged = merge(
            &stale,
            current.snapshot_id(),
            current.sequence_number(),
            &listed,
            &path,
        )
        .await
        .unwrap();
        // Another gateway commits meanwhile.
        let mut other = lake.table().await;
        lake.archive(&mut other, 0, 40, 10).await;

        let catalog = lake.archiver.catalog().await.unwrap();
        let replaced: HashSet<String> = listed.iter().map(|m| m.manifest_path.clone()).collect();
        let refused = commit_rewrite(&catalog, &stale, &replaced, &[merged], uuid::Uuid::now_v7(), 1)
            .await
            .unwrap_err();

        assert!(
            matches!(&refused, Error::Iceberg(e) if e.kind() == ErrorKind::CatalogCommitConflicts),
            "{refused}"
        );
        let table = lake.table().await;
        assert_eq!(table.metadata_location(), other.metadata_location());
        assert_eq!(manifests(&table).await.unwrap().len(), 5);
        assert_eq!(rows(&table).await, expected_rows(5));
    }

    #[tokio::test]
    async fn a_rewrite_is_redone_on_top_of_commits_made_meanwhile() {
        let lake = Lake::new(|_| {});
        let stale = archived(&lake, 5).await;
        let mut other = lake.table().await;
        lake.archive(&mut other, 1, 50, 10).await;

        let catalog = lake.archiver.catalog().await.unwrap();
        let (after, rewrite) = rewrite_manifests(catalog, &stale).await.unwrap().unwrap();

        assert_eq!((rewrite.merged, rewrite.manifests), (5, 2));
        let table = lake.table().await;
        assert_eq!(table.metadata_location(), after.metadata_location());
        let parent = table.metadata().current_snapshot().unwrap().parent_snapshot_id();
        assert_eq!(parent, other.metadata().current_snapshot_id());
        assert_eq!(live_files(&table).await, live_files(&other).await);
        assert_eq!(rows(&table).await, expected_rows(6));
    }

    #[tokio::test]
    async fn a_rewrite_after_another_rewrite_gives_up_and_cleans_up() {
        let lake = Lake::new(|_| {});
        let stale = archived(&lake, 6).await;
        let mut other = lake.table().await;
        lake.archiver
            .rewrite_manifests(&mut other)
            .await
            .unwrap()
            .unwrap();

        let catalog = lake.archiver.catalog().await.unwrap();
        assert!(rewrite_manifests(catalog, &stale).await.unwrap().is_none());

        let table = lake.table().await;
        assert_eq!(table.metadata_location(), other.metadata_location());
        assert_eq!(manifests(&table).await.unwrap().len(), 1);
        assert_eq!(rows(&table).await, expected_rows(6));
        assert_eq!(
            metadata_files(&table, "-merged-"),
            1,
            "only the committed merged manifest is left"
        );
    }
}
