//! The Iceberg archive: writing sealed segments as Parquet data files and
//! committing them to the topic's table (DESIGN §7).
//!
//! Exactly once, whatever a crash interrupts:
//! - a segment's data file has a fixed name (`<topic id>-<partition>-<base
//!   offset>.parquet`), so writing it again after a crash before the commit
//!   replaces the orphan instead of adding a second file; before writing
//!   over an existing file, the worker reads the table afresh (its copy may
//!   predate another gateway's commit of the segment), and a file is never
//!   deleted once written: a worker that lost its lease (stalled, then
//!   taken over) may find its successor's committed file at that name;
//! - every commit's snapshot summary carries the topic id, partition, base
//!   and last offset and the file's path, so a crash between the commit and
//!   marking the segment archived in Redis is repaired from the table, not
//!   by archiving again; once maintenance expired that snapshot, the data
//!   file found at its fixed name and listed in the current manifests tells
//!   the same;
//! - the fast append checks that the file is not in the table yet, so even
//!   two workers racing on one segment (a lease taken over from a stalled
//!   holder) cannot add its rows twice.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_schema::SchemaRef;
use bytes::Bytes;
use futures::TryStreamExt;
use iceberg::arrow::ArrowFileReader;
use iceberg::io::{FileIO, FileMetadata};
use iceberg::spec::{Literal, PartitionKey, Struct};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultLocationGenerator, FileNameGenerator, LocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use ketch_config::TieringSettings;
use ketch_storage::segments::{Segment, Tier};
use ketch_storage::{Store, Topic};
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::basic::{Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use tokio::sync::Mutex;

use crate::maintenance::{self, Expired, Rewrite};
use crate::table::{self, Rows};
use crate::{Error, Result};

/// Snapshot summary keys of a ketch commit.
const TOPIC_ID: &str = "ketch.topic-id";
const PARTITION: &str = "ketch.partition";
const BASE_OFFSET: &str = "ketch.base-offset";
const LAST_OFFSET: &str = "ketch.last-offset";
const DATA_FILE: &str = "ketch.data-file";
const DATA_FILE_BYTES: &str = "ketch.data-file-bytes";
/// The offsets of the segment the data file has no rows for (JSON).
const HOLES: &str = "ketch.holes";

/// Where a segment went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archived {
    pub path: String,
    pub file_bytes: u64,
    pub records: u64,
    /// False when the table already had it (a crash after the commit).
    pub written: bool,
    /// The offsets the file has no rows for (transaction markers, aborted
    /// transactions); `None` when a file found in the table's manifests
    /// after a crash does not say (see [`Archiver::start`]).
    pub holes: Option<Vec<(i64, i64)>>,
}

/// A segment [`Archiver::start`] is done with.
pub enum Fed {
    /// The table has it already.
    Found(Archived),
    /// Its data file was written and uploaded by an earlier attempt whose
    /// commit failed, from the same records: [`Archiver::finish`] commits it
    /// as it is.
    Unlanded(Box<Closed>),
    /// Every row handed to its data file's writer, which is closing the
    /// file: [`Archiver::finish`] commits it, [`Fed::abandon`] gives it up.
    Closing(Closing),
}

/// A data file closing on its writer task. Dropped (archiving cancelled),
/// it stops the task, so no file is finished that nothing commits.
pub struct Closing {
    writing: Option<Writing>,
    records: u64,
    holes: Vec<(i64, i64)>,
    made_from: MadeFrom,
    /// When the segment's first read began, and how long after it every
    /// row group had been handed over.
    started: Instant,
    fed_in: Duration,
}

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(writing) = &self.writing {
            writing.abort();
        }
    }
}

/// A segment whose data file is closed, ready for [`Archiver::commit`].
pub enum Closed {
    /// The table has it already, or it has nothing to write (no committed
    /// records: an empty `path`).
    Found(Archived),
    Written {
        files: Vec<iceberg::spec::DataFile>,
        archived: Archived,
        made_from: MadeFrom,
        started: Instant,
        fed_in: Duration,
        written_in: Duration,
    },
}

/// What a segment's data file was made from: the segment's record as it
/// was (its last offset, bytes, timestamps and when it was sealed: a
/// segment sealed again after Redis lost the first seal, by a failover or
/// a restart from its AOF, holds other records under the same offsets),
/// the first offset read (the log start, if DeleteRecords moved it into
/// the segment), the records left out, and the table's partition spec and
/// schema. Two attempts that agree on these write the same rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeFrom {
    last: i64,
    bytes: i64,
    max_ts: i64,
    first_ts: Option<i64>,
    sealed_ms: i64,
    from: i64,
    aborted: Vec<(i64, i64, i64)>,
    spec_id: i32,
    schema_id: i32,
}

/// A data file written and uploaded whose commit failed (the catalog
/// refused it or could not be reached), kept for the segment's next
/// attempt.
struct Unlanded {
    files: Vec<iceberg::spec::DataFile>,
    archived: Archived,
    made_from: MadeFrom,
}

/// At most this many unlanded files are kept (their data files' metadata
/// and statistics, a few KiB each); past it one is forgotten for each new
/// one (its segment's next attempt writes it again).
const UNLANDED_KEPT: usize = 1024;

impl Fed {
    /// Waits for the segment's data file to be closed.
    pub async fn closed(self) -> Result<Closed> {
        let mut closing = match self {
            Fed::Found(archived) => return Ok(Closed::Found(archived)),
            Fed::Unlanded(closed) => return Ok(*closed),
            Fed::Closing(closing) => closing,
        };
        let (records, started, fed_in) = (closing.records, closing.started, closing.fed_in);
        let made_from = closing.made_from.clone();
        let Some(writing) = closing.writing.take() else {
            return Err(Error::Io("the data file writer was already awaited".to_owned()));
        };
        let files = writer_result(writing).await?;
        if files.is_empty() && records == 0 {
            // Nothing of the segment is committed data (transaction
            // markers, aborted transactions): there is no file to write,
            // and the segment is recorded archived as one hole with an
            // empty path: retention goes on past it, and reads step over
            // it without looking for a file.
            return Ok(Closed::Found(Archived {
                path: String::new(),
                file_bytes: 0,
                records: 0,
                written: false,
                holes: Some(std::mem::take(&mut closing.holes)),
            }));
        }
        let [file] = &files[..] else {
            return Err(Error::Data(format!(
                "expected one data file, the writer made {}",
                files.len()
            )));
        };
        let archived = Archived {
            path: file.file_path().to_owned(),
            file_bytes: file.file_size_in_bytes(),
            records,
            written: true,
            holes: Some(std::mem::take(&mut closing.holes)),
        };
        Ok(Closed::Written {
            files,
            archived,
            made_from,
            started,
            fed_in,
            written_in: started.elapsed(),
        })
    }

    /// Gives the segment up uncommitted, once its writer is done. A file it
    /// finished stays (deleting it could delete the file a worker that took
    /// the lease over committed under the same name): the segment's next
    /// attempt overwrites it, or finds that commit.
    pub async fn abandon(self) {
        let Fed::Closing(mut closing) = self else { return };
        if let Some(writing) = closing.writing.take() {
            let _ = writer_result(writing).await;
        }
    }
}

/// What archiving leaves out of a segment: every control batch
/// (transaction markers) and the batches of aborted transactions — each
/// aborted transaction's batches of its producer from its first offset up
/// to its abort marker. Consumers of the archive, Kafka clients and query
/// engines alike, then see committed data only (a read_committed view; a
/// read_uncommitted consumer reading the archive sees it too).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// (producer id, first offset, abort marker offset).
    aborted: Vec<(i64, i64, i64)>,
}

impl Filter {
    pub fn new(aborted: Vec<(i64, i64, i64)>) -> Self {
        Self { aborted }
    }

    /// Whether the batch at `base` is left out.
    pub fn skips(&self, header: &ketch_storage::batch::BatchHeader, base: i64) -> bool {
        header.is_control()
            || (header.is_transactional()
                && self.aborted.iter().any(|&(pid, first, marker)| {
                    pid == header.producer_id && (first..marker).contains(&base)
                }))
    }
}

/// Offset ranges left out, merged where they touch.
#[derive(Debug, Default)]
struct Holes {
    ranges: Vec<(i64, i64)>,
    offsets: i64,
}

impl Holes {
    fn add(&mut self, first: i64, last: i64) {
        self.offsets += last - first + 1;
        match self.ranges.last_mut() {
            Some((_, end)) if *end + 1 == first => *end = last,
            _ => self.ranges.push((first, last)),
        }
    }

    /// The segment's offsets before its first batch still stored (`batches`
    /// the first read), when DeleteRecords removed them: no rows.
    fn before(&mut self, segment: &Segment, batches: &[Bytes]) {
        if let Some(first) = batches.first().filter(|b| b.len() >= 8) {
            let base = i64::from_be_bytes(first[0..8].try_into().expect("8 bytes"));
            if base > segment.base {
                self.add(segment.base, base - 1);
            }
        }
    }

    /// Leaves `batch` out if `filter` says so; true when it did.
    fn skipped(&mut self, filter: &Filter, batch: &Bytes) -> Result<bool> {
        let header = ketch_storage::batch::header(batch)?;
        let base = i64::from_be_bytes(batch[0..8].try_into().expect("8 bytes"));
        if !filter.skips(&header, base) {
            return Ok(false);
        }
        self.add(base, base + i64::from(header.last_offset_delta));
        Ok(true)
    }
}

/// The storage properties (S3 endpoint, keys, …) both catalogs and the
/// remote reader pass to their file IO.
pub fn storage_props(settings: &TieringSettings) -> HashMap<String, String> {
    let mut props = HashMap::new();
    let mut set = |key: &str, value: &str| {
        if !value.is_empty() {
            props.insert(key.to_owned(), value.to_owned());
        }
    };
    set("s3.endpoint", &settings.s3_endpoint);
    set("s3.region", &settings.s3_region);
    set("s3.access-key-id", &settings.s3_access_key_id);
    set("s3.secret-access-key", &settings.s3_secret_access_key);
    set(
        "s3.path-style-access",
        if settings.s3_path_style { "true" } else { "" },
    );
    props
}

/// Opens the configured catalog.
pub async fn open_catalog(settings: &TieringSettings) -> Result<Arc<dyn Catalog>> {
    let factory = crate::credentials::storage_factory();
    let mut props = storage_props(settings);
    match settings.catalog.as_str() {
        "rest" => {
            // A REST catalog names its own warehouse; pass ours only when set.
            if !settings.warehouse.is_empty() {
                props.insert("warehouse".to_owned(), settings.warehouse.clone());
            }
            props.insert("uri".to_owned(), settings.catalog_uri.clone());
            let catalog = iceberg_catalog_rest::RestCatalogBuilder::default()
                .with_storage_factory(factory)
                .load(&settings.catalog_name, props)
                .await?;
            Ok(Arc::new(crate::bounded::Bounded(Arc::new(catalog))))
        }
        _ => {
            let uri = settings.catalog_uri();
            if let Some(path) = uri.strip_prefix("sqlite:") {
                let file = path.split('?').next().unwrap_or(path);
                if let Some(dir) = std::path::Path::new(file).parent() {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| Error::Io(format!("cannot create {}: {e}", dir.display())))?;
                }
            }
            if let Some(dir) = settings.warehouse_dir() {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| Error::Io(format!("cannot create {}: {e}", dir.display())))?;
            }
            let bind_style = if uri.starts_with("sqlite:") {
                iceberg_catalog_sql::SqlBindStyle::QMark
            } else {
                iceberg_catalog_sql::SqlBindStyle::DollarNumeric
            };
            props.insert("uri".to_owned(), uri);
            props.insert("warehouse".to_owned(), settings.warehouse());
            let catalog = iceberg_catalog_sql::SqlCatalogBuilder::default()
                .sql_bind_style(bind_style)
                .with_storage_factory(factory)
                .load(&settings.catalog_name, props)
                .await?;
            Ok(Arc::new(crate::bounded::Bounded(Arc::new(catalog))))
        }
    }
}

/// Where a segment's batches come from.
pub trait Chunks: Send {
    /// Batches from offset `next` on, and the offset after them.
    fn chunk(&mut self, next: i64) -> impl Future<Output = ketch_storage::Result<(Vec<Bytes>, i64)>> + Send;

    /// Where the segment's batches start: its base, or the batch holding
    /// the log start when DeleteRecords moved that into the segment (what
    /// came before is gone from Redis, and the archive leaves it out).
    fn first_offset(&self, segment: &Segment) -> i64 {
        segment.base
    }
}

/// Asked once a segment's data file is written, right before its commit:
/// false stops the commit (the file is deleted) with [`Error::Fenced`].
pub trait Fence: Sync {
    fn holds(&self) -> impl Future<Output = ketch_storage::Result<bool>> + Send;
}

/// No fence: a table no one else may purge (tests, benchmarks).
pub struct Unfenced;

impl Fence for Unfenced {
    async fn holds(&self) -> ketch_storage::Result<bool> {
        Ok(true)
    }
}

/// A segment's batches in Redis, about [`CHUNK_BYTES`] at a time.
struct Redis<'a> {
    store: &'a Store,
    topic: &'a Topic,
    partition: i32,
    segment: &'a Segment,
    tier: Tier,
    /// The partition's log start when the segment was read.
    log_start: i64,
    /// Entries the next read asks for.
    entries: usize,
    /// The largest batch of the last read (unknown before the first).
    largest: Option<usize>,
}

impl Chunks for Redis<'_> {
    fn first_offset(&self, segment: &Segment) -> i64 {
        segment.base.max(self.log_start)
    }

    async fn chunk(&mut self, next: i64) -> ketch_storage::Result<(Vec<Bytes>, i64)> {
        let (batches, after) = self
            .store
            .segment_chunk(
                self.topic,
                self.partition,
                self.segment,
                self.tier,
                next,
                self.entries,
                self.largest,
            )
            .await?;
        self.entries = chunk_entries(&batches);
        self.largest = batches.iter().map(Bytes::len).max();
        Ok((batches, after))
    }
}

/// Entries the next read of a segment asks for, from the batches of the
/// last read: about [`CHUNK_BYTES`] of them (a segment's batches are
/// mostly alike), so a read neither holds a segment of large batches at
/// once nor crosses the network for every few small ones.
fn chunk_entries(last: &[Bytes]) -> usize {
    let bytes: usize = last.iter().map(Bytes::len).sum();
    let average = bytes.div_ceil(last.len().max(1)).max(1);
    (CHUNK_BYTES / average).clamp(1, MAX_CHUNK_ENTRIES)
}

/// How data files are written: `tiering.compression` (zstd level 1 unless
/// configured), row groups of `tiering.row_group_rows` rows, column
/// statistics (a reader prunes row groups by partition, offset and
/// timestamp) but none of values (min/max of payloads prune nothing, and
/// comparing every value cost a tenth of archiving's CPU) nor of keys:
/// Parquet cuts a binary column's min and max at 64 bytes and marks them
/// inexact, and iceberg then leaves that row group out of the file's
/// bounds, so a long key would fall outside the bounds other engines
/// prune the file by (a query for it would skip it). No dictionary
/// for the columns whose values rarely repeat (offsets, timestamps, values:
/// the dictionary is built for each row group until it outgrows its page,
/// then thrown away).
fn writer_properties(settings: &TieringSettings) -> Result<WriterProperties> {
    let value = ColumnPath::from("value");
    let header = |field: &str| {
        ColumnPath::from(vec![
            "headers".to_owned(),
            "list".to_owned(),
            "element".to_owned(),
            field.to_owned(),
        ])
    };
    Ok(WriterProperties::builder()
        .set_compression(compression(settings)?)
        .set_max_row_group_row_count(Some(settings.row_group_rows))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_column_statistics_enabled(value.clone(), EnabledStatistics::None)
        .set_column_statistics_enabled(header("value"), EnabledStatistics::None)
        .set_column_statistics_enabled(ColumnPath::from("key"), EnabledStatistics::None)
        .set_column_statistics_enabled(header("key"), EnabledStatistics::None)
        .set_column_dictionary_enabled(value, false)
        .set_column_dictionary_enabled(ColumnPath::from("offset"), false)
        .set_column_dictionary_enabled(ColumnPath::from("timestamp"), false)
        .build())
}

/// The Parquet codec `tiering.compression` and `tiering.compression_level`
/// name (the settings loader checked both; this refuses what it let by).
/// `lz4` is Parquet's LZ4_RAW: the older LZ4 codec's framing is deprecated
/// and read differently by different readers.
fn compression(settings: &TieringSettings) -> Result<Compression> {
    let codec = settings.compression.as_str();
    let level = settings.compression_level_or_default();
    let bad = |e: String| Error::Io(format!("tiering.compression {codec} at level {level:?}: {e}"));
    Ok(match (codec, level) {
        ("zstd", Some(level)) => {
            Compression::ZSTD(ZstdLevel::try_new(level).map_err(|e| bad(e.to_string()))?)
        }
        ("gzip", Some(level)) => Compression::GZIP(
            GzipLevel::try_new(u32::try_from(level).unwrap_or(u32::MAX)).map_err(|e| bad(e.to_string()))?,
        ),
        ("lz4", None) => Compression::LZ4_RAW,
        ("snappy", None) => Compression::SNAPPY,
        ("uncompressed", None) => Compression::UNCOMPRESSED,
        _ => return Err(bad("not a codec and level ketch writes".to_owned())),
    })
}

/// Runs `writer` on a task of its own: it writes each row group sent, and
/// closes the file on `None` (returning its data files). A segment given
/// up before that (an error; the sender dropped) is not closed: no data
/// file is finished for it, as when the writer was dropped in place.
fn spawn_writer<W>(
    mut writer: W,
) -> (
    tokio::sync::mpsc::Sender<Option<arrow_array::RecordBatch>>,
    Writing,
)
where
    W: IcebergWriter + Send + 'static,
{
    // One row group queued while one is written and the next decoded.
    let (sender, mut receiver) = tokio::sync::mpsc::channel(1);
    let task = tokio::spawn(async move {
        while let Some(row_group) = receiver.recv().await {
            match row_group {
                Some(batch) => writer.write(batch).await?,
                None => return Ok(writer.close().await?),
            }
        }
        Err(Error::Io(
            "archiving stopped before the data file was complete".to_owned(),
        ))
    });
    (sender, task)
}

type Writing = tokio::task::JoinHandle<Result<Vec<iceberg::spec::DataFile>>>;

/// What the writer task ended with: its data files or its error.
async fn writer_result(writing: Writing) -> Result<Vec<iceberg::spec::DataFile>> {
    writing
        .await
        .map_err(|e| Error::Io(format!("the data file writer stopped: {e}")))?
}

/// The error of a writer task that stopped taking row groups.
async fn writer_failure(writing: Writing) -> Error {
    match writer_result(writing).await {
        Err(e) => e,
        Ok(_) => Error::Io("the data file writer closed early".to_owned()),
    }
}

/// Bytes of batches read from Redis at a time while archiving (about).
const CHUNK_BYTES: usize = 4 * 1024 * 1024;
/// Stream entries read from Redis at a time while archiving: at most this
/// many, and at first [`FIRST_CHUNK_ENTRIES`] (batches of up to
/// `max.message.bytes`, 1 MiB by default).
const MAX_CHUNK_ENTRIES: usize = 4096;
const FIRST_CHUNK_ENTRIES: usize = 4;
/// How long opening the catalog may take.
const CATALOG_OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// After a failed open, the catalog is not tried again for this long (the
/// worker keeps sealing and trimming meanwhile).
const CATALOG_RETRY: Duration = Duration::from_secs(5);

/// Writes segments to the topic tables of one catalog.
pub struct Archiver {
    settings: TieringSettings,
    catalog: Mutex<CatalogSlot>,
    namespace: NamespaceIdent,
    /// Per table, the last old metadata file deleted.
    metadata_deleted: std::sync::Mutex<HashMap<String, String>>,
    /// By path, data files whose commit failed (see [`Fed::Unlanded`]).
    unlanded: std::sync::Mutex<HashMap<String, Unlanded>>,
}

#[derive(Default)]
struct CatalogSlot {
    open: Option<Arc<dyn Catalog>>,
    /// The last failure to open it, and when to try again.
    failed: Option<(String, Instant)>,
}

impl Archiver {
    pub fn new(settings: TieringSettings) -> Self {
        let namespace = NamespaceIdent::new(settings.namespace.clone());
        Self {
            settings,
            catalog: Mutex::new(CatalogSlot::default()),
            namespace,
            metadata_deleted: std::sync::Mutex::new(HashMap::new()),
            unlanded: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The catalog, opened on first use and again after a failure (at most
    /// every [`CATALOG_RETRY`]; in between, [`Error::Waiting`]).
    pub(crate) async fn catalog(&self) -> Result<Arc<dyn Catalog>> {
        let mut slot = self.catalog.lock().await;
        if let Some(catalog) = slot.open.as_ref() {
            return Ok(catalog.clone());
        }
        if let Some((error, retry_at)) = &slot.failed
            && Instant::now() < *retry_at
        {
            return Err(Error::Waiting(error.clone()));
        }
        let opened = match tokio::time::timeout(CATALOG_OPEN_TIMEOUT, open_catalog(&self.settings)).await {
            Ok(opened) => opened,
            Err(_) => Err(Error::Io(format!(
                "opening the catalog took longer than {CATALOG_OPEN_TIMEOUT:?}"
            ))),
        };
        match opened {
            Ok(catalog) => {
                *slot = CatalogSlot {
                    open: Some(catalog.clone()),
                    failed: None,
                };
                Ok(catalog)
            }
            Err(e) => {
                slot.failed = Some((e.to_string(), Instant::now() + CATALOG_RETRY));
                Err(e)
            }
        }
    }

    /// What a new topic table records besides its schema: the topic, and
    /// the codec ketch writes (Iceberg's `write.parquet.compression-*`, so
    /// that other engines writing to the table, a compaction say, use it
    /// too). ketch itself writes with `tiering.compression` whatever a
    /// table says, so changing it applies to every table at once.
    fn table_properties(&self, topic: &Topic) -> HashMap<String, String> {
        let mut properties = HashMap::from([
            (
                "write.parquet.compression-codec".to_owned(),
                iceberg_codec(&self.settings.compression).to_owned(),
            ),
            ("ketch.topic".to_owned(), topic.name.clone()),
        ]);
        if let Some(level) = self.settings.compression_level_or_default() {
            properties.insert("write.parquet.compression-level".to_owned(), level.to_string());
        }
        properties
    }

    /// The topic's table, created (with its namespace) if missing.
    pub async fn table(&self, topic: &Topic) -> Result<Table> {
        let catalog = self.catalog().await?;
        let ident = TableIdent::new(self.namespace.clone(), topic.name.clone());
        if catalog.table_exists(&ident).await? {
            return Ok(catalog.load_table(&ident).await?);
        }
        if !catalog.namespace_exists(&self.namespace).await? {
            match catalog.create_namespace(&self.namespace, HashMap::new()).await {
                Ok(_) => {}
                // Another gateway made it first.
                Err(_) if catalog.namespace_exists(&self.namespace).await? => {}
                Err(e) => return Err(e.into()),
            }
        }
        let schema = table::schema();
        let creation = TableCreation::builder()
            .name(topic.name.clone())
            .sort_order(table::sort_order(&schema))
            .partition_spec(table::partition_spec())
            .schema(schema)
            .properties(self.table_properties(topic))
            .build();
        match catalog.create_table(&self.namespace, creation).await {
            Ok(table) => Ok(table),
            Err(_) if catalog.table_exists(&ident).await? => Ok(catalog.load_table(&ident).await?),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the topic's table and its files (data, manifests, metadata):
    /// remote storage was turned off with `remote.log.delete.on.disable`.
    /// The catalog's purge deletes the files the table's metadata names;
    /// then everything else under the table's location goes too: files no
    /// metadata names (those of a commit or a creation the catalog refused
    /// because another gateway's came first, manifests merged away). False
    /// when there was no table.
    ///
    /// The data files go first: the catalog's purge drops the table before
    /// it deletes files, so one cut short there (a gateway killed, the
    /// object store failing) would leave every data file with no table to
    /// find them by, and the next attempt would find nothing to purge.
    /// Cut short after the data, it leaves at most the table's small
    /// metadata files.
    pub async fn purge_table(&self, topic: &Topic) -> Result<bool> {
        let catalog = self.catalog().await?;
        let ident = TableIdent::new(self.namespace.clone(), topic.name.clone());
        if !catalog.table_exists(&ident).await? {
            return Ok(false);
        }
        let table = catalog.load_table(&ident).await?;
        let location = table.metadata().location().trim_end_matches('/');
        // Only a directory of the table's own (the catalogs' default,
        // `<warehouse>/<namespace>/<table>`), never one it might share.
        let own = location
            .rsplit('/')
            .next()
            .is_some_and(|last| last.starts_with(topic.name.as_str()));
        if own {
            // ketch's data files (`<location>/data/…`, the location
            // generator's default); the manifests naming them stay for
            // the catalog's purge to read.
            table.file_io().delete_prefix(&format!("{location}/data")).await?;
        }
        catalog.purge_table(&ident).await?;
        if own {
            table.file_io().delete_prefix(location).await?;
        } else {
            tracing::warn!(topic = %topic.name, location,
                "the table's location is not a directory of its own: files its metadata did not name stay");
        }
        self.metadata_deleted
            .lock()
            .expect("deleted")
            .remove(&ident.to_string());
        Ok(true)
    }

    /// Starts archiving one sealed segment: reads it from `tier` in Redis a
    /// chunk at a time (so memory stays bounded whatever `segment.bytes`
    /// is) and hands all its rows to its data file's writer, which goes on
    /// closing the file (its last row groups encoded, its upload
    /// completed) on a task of its own; or finds it in `table` already.
    /// Records that cannot be read fail it with an error for which
    /// [`Error::is_bad_data`] holds. `table` is only read: other segments
    /// may be committed to the table meanwhile. [`Fed::closed`] then
    /// [`Archiver::commit`] (committed only while a fence holds) finish it.
    pub async fn start(
        &self,
        store: &Store,
        table: &Table,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        tier: Tier,
    ) -> Result<Fed> {
        // Batches below the log start (DeleteRecords) are trimmed from
        // Redis: a segment the log start has moved into is archived from
        // there, as Kafka never copies deleted records to remote storage.
        let log_start = store.offsets(topic, partition).await?.log_start_offset;
        let chunks = |segment| Redis {
            store,
            topic,
            partition,
            segment,
            tier,
            log_start,
            entries: FIRST_CHUNK_ENTRIES,
            largest: None,
        };
        let aborted = store
            .aborted_ranges(topic, partition, segment.base, segment.last, None)
            .await?;
        let filter = Filter::new(aborted);
        self.feed(table, topic, partition, segment, chunks(segment), &filter)
            .await
    }

    /// Archives one segment whose batches come from `chunks`
    /// ([`Archiver::feed`], then [`Archiver::finish`]); committed only
    /// while `fence` holds.
    #[allow(clippy::too_many_arguments)]
    pub async fn archive_from(
        &self,
        table: &mut Table,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        chunks: impl Chunks,
        filter: &Filter,
        fence: &impl Fence,
    ) -> Result<Archived> {
        let fed = self
            .feed(table, topic, partition, segment, chunks, filter)
            .await?;
        self.finish(table, topic, partition, segment, fed, fence).await
    }

    /// [`Archiver::start`] with the segment's batches from `chunks`.
    pub(crate) async fn feed(
        &self,
        table: &Table,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        mut chunks: impl Chunks,
        filter: &Filter,
    ) -> Result<Fed> {
        let schema = table.metadata().current_schema().clone();
        let spec = table.metadata().default_partition_spec().as_ref().clone();
        let key = PartitionKey::new(
            spec,
            schema.clone(),
            Struct::from_iter([Some(Literal::int(partition))]),
        );
        let name = format!("{}-{:05}-{:020}.parquet", topic.id, partition, segment.base);
        let locations = DefaultLocationGenerator::new(table.metadata())?;
        let path = locations.generate_location(Some(&key), &name);
        if let Some((done, read_off_file)) = self
            .already_archived(table, topic, partition, segment, &path)
            .await?
        {
            if read_off_file {
                let holes = done.holes.as_deref().unwrap_or_default();
                holds_the_segment(&mut chunks, segment, filter, holes, &path).await?;
            }
            return Ok(Fed::Found(done));
        }
        let made_from = MadeFrom {
            last: segment.last,
            bytes: segment.bytes,
            max_ts: segment.max_ts,
            first_ts: segment.first_ts,
            sealed_ms: segment.sealed_ms,
            from: chunks.first_offset(segment),
            aborted: filter.aborted.clone(),
            spec_id: table.metadata().default_partition_spec_id(),
            schema_id: table.metadata().current_schema_id(),
        };
        if let Some(unlanded) = self.unlanded(table, &path, &made_from).await {
            return Ok(Fed::Unlanded(Box::new(unlanded)));
        }
        let arrow_schema: SchemaRef = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema)?);

        let properties = writer_properties(&self.settings)?;
        let rolling = RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(properties, schema),
            usize::MAX,
            table.file_io().clone(),
            locations,
            FixedName(name),
        );
        let writer = DataFileWriterBuilder::new(rolling).build(Some(key)).await?;
        // Row groups are encoded and compressed (most of archiving's CPU)
        // by a task of their own while this one decodes the next from the
        // segment's batches: on a gateway with two cores, archiving uses
        // both.
        let (row_groups, writing) = spawn_writer(writer);
        let started = Instant::now();
        let mut records = 0u64;
        let mut holes = Holes::default();
        // Ok(false): the writer task failed; its error is the one to
        // return, not a short count of records.
        let fed = async {
            let mut rows = Rows::new(arrow_schema, partition)?;
            let mut next = chunks.first_offset(segment);
            let mut chunk = chunks.chunk(next).await?;
            holes.before(segment, &chunk.0);
            loop {
                let (batches, after) = chunk;
                // The next chunk is read while this one is decoded.
                let work = async {
                    for batch in &batches {
                        if holes.skipped(filter, batch)? {
                            continue;
                        }
                        rows.add_batch(batch)?;
                        if rows.len() >= self.settings.row_group_rows {
                            records += rows.len() as u64;
                            if row_groups.send(Some(rows.finish()?)).await.is_err() {
                                return Ok(false);
                            }
                        }
                    }
                    Ok::<_, Error>(true)
                };
                next = after;
                if next > segment.last {
                    if !work.await? {
                        return Ok(false);
                    }
                    break;
                }
                let (read, worked) = tokio::join!(chunks.chunk(next), work);
                if !worked? {
                    return Ok(false);
                }
                chunk = read?;
            }
            if !rows.is_empty() {
                records += rows.len() as u64;
                if row_groups.send(Some(rows.finish()?)).await.is_err() {
                    return Ok(false);
                }
            }
            let expected = segment.last - segment.base + 1;
            if records as i64 + holes.offsets != expected {
                return Err(Error::Records(format!(
                    "segment {}..={} holds {records} records and {} offsets left out, expected {expected}",
                    segment.base, segment.last, holes.offsets
                )));
            }
            // `None`: every row group is sent, close the file.
            Ok(row_groups.send(None).await.is_ok())
        }
        .await;
        let fed_in = started.elapsed();
        match fed {
            Ok(true) => Ok(Fed::Closing(Closing {
                writing: Some(writing),
                records,
                holes: holes.ranges,
                made_from,
                started,
                fed_in,
            })),
            Ok(false) => Err(writer_failure(writing).await),
            Err(e) => {
                // The writer task drops the file unfinished; it must be gone
                // before the segment is tried again under the same name.
                drop(row_groups);
                let _ = writing.await;
                Err(e)
            }
        }
    }

    /// Commits a segment [`Archiver::start`] fed to its writer once the
    /// file is closed, if `fence` still holds (else deletes the file).
    pub async fn finish(
        &self,
        table: &mut Table,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        fed: Fed,
        fence: &impl Fence,
    ) -> Result<Archived> {
        let closed = fed.closed().await?;
        self.commit(table, topic, partition, segment, closed, fence).await
    }

    /// Commits a closed data file to `table` (the table's current state:
    /// the commit is checked against it), if `fence` still holds (else
    /// deletes the file).
    pub async fn commit(
        &self,
        table: &mut Table,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        closed: Closed,
        fence: &impl Fence,
    ) -> Result<Archived> {
        let (files, archived, made_from, started, fed_in, written_in) = match closed {
            Closed::Found(archived) => return Ok(archived),
            Closed::Written {
                files,
                archived,
                made_from,
                started,
                fed_in,
                written_in,
            } => (files, archived, made_from, started, fed_in, written_in),
        };
        let records = archived.records;
        let summary = HashMap::from([
            (TOPIC_ID.to_owned(), topic.id.to_string()),
            (PARTITION.to_owned(), partition.to_string()),
            (BASE_OFFSET.to_owned(), segment.base.to_string()),
            (LAST_OFFSET.to_owned(), segment.last.to_string()),
            (DATA_FILE.to_owned(), archived.path.clone()),
            (DATA_FILE_BYTES.to_owned(), archived.file_bytes.to_string()),
            (
                HOLES.to_owned(),
                serde_json::to_string(archived.holes.as_deref().unwrap_or_default())
                    .expect("holes serialize"),
            ),
        ]);
        if !fence.holds().await? {
            // Not committed. The file stays: a worker that took the lease
            // over may have committed the segment under this name (the next
            // attempt finds that commit, or overwrites an orphan).
            return Err(Error::Fenced);
        }
        let transaction = Transaction::new(table);
        let append = transaction
            .fast_append()
            .set_snapshot_properties(summary)
            .add_data_files(files.clone());
        let transaction = append.apply(transaction)?;
        let catalog = self.catalog().await?;
        match transaction.commit(catalog.as_ref()).await {
            Ok(updated) => {
                *table = crate::maintenance::keeping_file_io(updated, table);
                // The phases, in ms since the segment's first read: every
                // row group decoded and handed to the writer task; the file
                // closed (its last row groups encoded, its upload complete);
                // the commit made.
                tracing::debug!(
                    topic = %topic.name, partition, base = segment.base, records,
                    file_bytes = archived.file_bytes,
                    read_ms = fed_in.as_millis(), written_ms = written_in.as_millis(),
                    committed_ms = started.elapsed().as_millis(),
                    "data file written and committed"
                );
                Ok(archived)
            }
            Err(e) => {
                // Someone may have committed it meanwhile (a worker that
                // held the lease before): then it is archived.
                let error = match catalog.load_table(table.identifier()).await {
                    Ok(fresh) => {
                        *table = fresh;
                        if let Some(done) = committed(table, topic, partition, segment) {
                            return Ok(done);
                        }
                        Error::Iceberg(e)
                    }
                    Err(reload) => Error::Iceberg(reload),
                };
                // Not committed (or not known: the next attempt looks at the
                // table before anything else): it commits this file rather
                // than write and upload it again.
                let mut unlanded = self.unlanded.lock().expect("unlanded");
                if unlanded.len() >= UNLANDED_KEPT {
                    // Make room: one another worker archived since, say.
                    if let Some(path) = unlanded.keys().next().cloned() {
                        unlanded.remove(&path);
                    }
                }
                let path = archived.path.clone();
                unlanded.insert(
                    path,
                    Unlanded {
                        files,
                        archived,
                        made_from,
                    },
                );
                Err(error)
            }
        }
    }

    /// Expires the table's snapshots older than `tiering.snapshot_retention`
    /// beyond the newest `tiering.snapshots_kept` (see
    /// [`maintenance::expire_snapshots`]), then deletes old metadata files
    /// ([`maintenance::delete_old_metadata`]); `table` is left at the
    /// commit.
    pub async fn expire_snapshots(&self, table: &mut Table) -> Result<Expired> {
        let catalog = self.catalog().await?;
        let retention = self.settings.snapshot_retention.get();
        let mut expired = Expired::default();
        let kept = self.settings.snapshots_kept;
        if let Some((after, snapshots)) =
            maintenance::expire_snapshots(catalog.as_ref(), table, retention, kept).await?
        {
            *table = after;
            expired.snapshots = snapshots;
            expired.files = snapshots;
        }
        let key = table.identifier().to_string();
        let done = self.metadata_deleted.lock().expect("deleted").get(&key).cloned();
        let (files, done) = maintenance::delete_old_metadata(table, done).await;
        if let Some(done) = done {
            self.metadata_deleted.lock().expect("deleted").insert(key, done);
        }
        expired.files += files;
        Ok(expired)
    }

    /// Merges the small manifests of the table's current snapshot (see
    /// [`maintenance::rewrite_manifests`]); `table` is left at the commit.
    pub async fn rewrite_manifests(&self, table: &mut Table) -> Result<Option<Rewrite>> {
        let catalog = self.catalog().await?;
        Ok(maintenance::rewrite_manifests(catalog, table)
            .await?
            .map(|(after, rewrite)| {
                *table = after;
                rewrite
            }))
    }
}

/// Iceberg's name (`write.parquet.compression-codec`) of the codec
/// `tiering.compression` names: ketch's `lz4` is Parquet's LZ4_RAW, which
/// Iceberg calls `lz4_raw` (its `lz4` is the Hadoop-framed codec readers
/// disagree on).
fn iceberg_codec(compression: &str) -> &str {
    match compression {
        "lz4" => "lz4_raw",
        other => other,
    }
}

impl Archiver {
    /// The data file an earlier attempt at the segment wrote to `path` and
    /// failed to commit, made from what this attempt would read: still
    /// there as written (its size, and its footer's row count and row
    /// groups: another worker that held the segment's lease meanwhile may
    /// have written its own there), it is committed as it is. Taken off
    /// the list either way.
    async fn unlanded(&self, table: &Table, path: &str, made_from: &MadeFrom) -> Option<Closed> {
        let kept = self.unlanded.lock().expect("unlanded").remove(path)?;
        if kept.made_from != *made_from {
            return None;
        }
        match as_written(table.file_io(), path, &kept).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(path, "an unlanded data file changed; writing it again");
                return None;
            }
            Err(e) => {
                tracing::debug!(path, error = %e, "an unlanded data file cannot be looked at; writing it again");
                return None;
            }
        }
        tracing::debug!(path, "committing the data file a failed commit left");
        Some(Closed::Written {
            files: kept.files,
            archived: kept.archived,
            made_from: kept.made_from,
            started: Instant::now(),
            fed_in: Duration::ZERO,
            written_in: Duration::ZERO,
        })
    }

    /// The segment's commit, if the table has it. The snapshot summaries
    /// tell at no cost while the commit's snapshot is kept
    /// (`tiering.snapshots_kept`, `tiering.snapshot_retention`). When the
    /// segment's data file exists at `path` (its fixed name) the table is
    /// read afresh (`table`, a worker's copy, may predate another gateway's
    /// commit of it) and its summaries and current manifests looked at: a
    /// commit whose snapshot was expired is found there. A file that exists
    /// but is not listed is an orphan of a crash before the commit, to be
    /// overwritten. True with a commit found in the manifests alone: its
    /// holes were read off the file, which the caller checks against the
    /// segment ([`holds_the_segment`]).
    async fn already_archived(
        &self,
        table: &Table,
        topic: &Topic,
        partition: i32,
        segment: &Segment,
        path: &str,
    ) -> Result<Option<(Archived, bool)>> {
        if let Some(done) = committed(table, topic, partition, segment) {
            return Ok(Some((done, false)));
        }
        if !table.file_io().exists(path).await? {
            return Ok(None);
        }
        let fresh = self.catalog().await?.load_table(table.identifier()).await?;
        if let Some(done) = committed(&fresh, topic, partition, segment) {
            return Ok(Some((done, false)));
        }
        Ok(listed(&fresh, segment, path).await?.map(|done| (done, true)))
    }
}

/// Whether the data file the table lists at the segment's name holds this
/// segment: every batch of it Redis holds that the archive keeps (not left
/// out by `filter`, with records) has rows in the file. One that falls
/// wholly in the file's holes means the file is another segment's of the
/// same base: Redis went back in time after it was archived (a failover to
/// a replica that had not seen the seal, a crash under `appendfsync
/// everysec`) and the offsets after it were written again. Recording the
/// file would lose those records once local retention trims them, so this
/// is [`Error::Diverged`]: the segment is quarantined and served from
/// Redis until an operator removes the file from the table
/// (docs/tiered-storage.md).
async fn holds_the_segment(
    chunks: &mut impl Chunks,
    segment: &Segment,
    filter: &Filter,
    holes: &[(i64, i64)],
    path: &str,
) -> Result<()> {
    if holes.is_empty() {
        return Ok(());
    }
    let mut next = chunks.first_offset(segment);
    while next <= segment.last {
        let (batches, after) = chunks.chunk(next).await?;
        for batch in &batches {
            let header = ketch_storage::batch::header(batch)?;
            let base = i64::from_be_bytes(batch[0..8].try_into().expect("8 bytes"));
            let last = base + i64::from(header.last_offset_delta);
            if header.record_count == 0 || filter.skips(&header, base) {
                continue;
            }
            if holes.iter().any(|(first, end)| *first <= base && last <= *end) {
                return Err(Error::Diverged(format!(
                    "the data file at this segment's name ({path}) has no rows for offsets {base}..={last}, which Redis holds: \
                     it is another segment's of the same base offset (Redis lost writes after it was archived); \
                     remove that file from the table, then retry the segment"
                )));
            }
        }
        if batches.is_empty() || after <= next {
            break;
        }
        next = after;
    }
    Ok(())
}

/// The segment's data file at `path`, if the table's current manifests list
/// it live, with the offsets it has no rows for read off its `offset`
/// column: the commit that said so is gone, and what Redis holds now may
/// differ from what was written (DeleteRecords may have moved the log start
/// into the segment since).
async fn listed(table: &Table, segment: &Segment, path: &str) -> Result<Option<Archived>> {
    for manifest in maintenance::manifests(table).await? {
        let manifest = manifest.load_manifest(table.file_io()).await?;
        if let Some(entry) = manifest
            .entries()
            .iter()
            .find(|e| e.is_alive() && e.file_path() == path)
        {
            return Ok(Some(Archived {
                path: path.to_owned(),
                file_bytes: entry.file_size_in_bytes(),
                records: (segment.last - segment.base + 1) as u64,
                written: false,
                holes: Some(holes_in_file(table.file_io(), segment, path).await?),
            }));
        }
    }
    Ok(None)
}

/// The Parquet file at `path`: its size, and a reader of it with its
/// footer read.
async fn open_parquet(
    file_io: &FileIO,
    path: &str,
) -> Result<(u64, ParquetRecordBatchStreamBuilder<ArrowFileReader>)> {
    let input = file_io.new_input(path)?;
    let size = input.metadata().await?.size;
    let reader = ArrowFileReader::new(FileMetadata { size }, input.reader().await?);
    Ok((size, ParquetRecordBatchStreamBuilder::new(reader).await?))
}

/// Whether the file at `path` is the one `kept` describes: its size, row
/// count and row groups' offsets as written (only its footer is read).
async fn as_written(file_io: &FileIO, path: &str, kept: &Unlanded) -> Result<bool> {
    let [file] = &kept.files[..] else {
        return Ok(false);
    };
    let (size, builder) = open_parquet(file_io, path).await?;
    if size != kept.archived.file_bytes {
        return Ok(false);
    }
    let footer = builder.metadata();
    let row_groups: Vec<i64> = footer
        .row_groups()
        .iter()
        .filter_map(|g| g.file_offset())
        .collect();
    Ok(
        u64::try_from(footer.file_metadata().num_rows()).ok() == Some(file.record_count())
            && file.split_offsets() == Some(&row_groups[..]),
    )
}

/// The offsets of `segment` the data file at `path` has no row for.
pub(crate) async fn holes_in_file(
    file_io: &FileIO,
    segment: &Segment,
    path: &str,
) -> Result<Vec<(i64, i64)>> {
    let (_, builder) = open_parquet(file_io, path).await?;
    let offsets = ProjectionMask::columns(builder.parquet_schema(), ["offset"]);
    let mut rows = builder.with_projection(offsets).build()?;
    let mut holes = Holes::default();
    let mut next = segment.base;
    while let Some(batch) = rows.try_next().await? {
        let column = batch
            .column_by_name("offset")
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
            .ok_or_else(|| Error::Data(format!("{path}: no offset column")))?;
        for offset in column.values().iter().copied() {
            if offset > segment.last {
                return Err(Error::Diverged(format!(
                    "the data file at this segment's name ({path}) has a row at offset {offset}, past the segment's {}..={}: \
                     it is another segment's of the same base offset (Redis lost writes after it was archived); \
                     remove that file from the table, then retry the segment",
                    segment.base, segment.last
                )));
            }
            if offset < next {
                return Err(Error::Data(format!(
                    "{path}: offset {offset} out of order in segment {}..={}",
                    segment.base, segment.last
                )));
            }
            if offset > next {
                holes.add(next, offset - 1);
            }
            next = offset + 1;
        }
    }
    if next <= segment.last {
        holes.add(next, segment.last);
    }
    Ok(holes.ranges)
}

/// The commit of this segment in the table's history, if any.
fn committed(table: &Table, topic: &Topic, partition: i32, segment: &Segment) -> Option<Archived> {
    let topic_id = topic.id.to_string();
    let partition = partition.to_string();
    let base = segment.base.to_string();
    let last = segment.last.to_string();
    table.metadata().snapshots().find_map(|snapshot| {
        let props = &snapshot.summary().additional_properties;
        let is = |key: &str, value: &str| props.get(key).map(String::as_str) == Some(value);
        if is(TOPIC_ID, &topic_id)
            && is(PARTITION, &partition)
            && is(BASE_OFFSET, &base)
            && is(LAST_OFFSET, &last)
        {
            Some(Archived {
                path: props.get(DATA_FILE)?.clone(),
                file_bytes: props.get(DATA_FILE_BYTES)?.parse().ok()?,
                records: (segment.last - segment.base + 1) as u64,
                written: false,
                // Commits from before transactions say nothing: no holes.
                holes: Some(match props.get(HOLES) {
                    Some(json) => serde_json::from_str(json).ok()?,
                    None => Vec::new(),
                }),
            })
        } else {
            None
        }
    })
}

/// Names every file of a writer the same: one segment, one file.
#[derive(Clone)]
struct FixedName(String);

impl FileNameGenerator for FixedName {
    fn generate_file_name(&self) -> String {
        self.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use arrow_array::{Int64Array, RecordBatch};

    use super::*;

    /// A data file writer that fails its second row group, and says whether
    /// it was closed.
    struct Flaky {
        written: usize,
        closed: Arc<AtomicBool>,
    }

    #[async_trait::async_trait]
    impl IcebergWriter for Flaky {
        async fn write(&mut self, _: RecordBatch) -> iceberg::Result<()> {
            self.written += 1;
            if self.written == 2 {
                return Err(iceberg::Error::new(
                    iceberg::ErrorKind::Unexpected,
                    "object store gone",
                ));
            }
            Ok(())
        }

        async fn close(&mut self) -> iceberg::Result<Vec<iceberg::spec::DataFile>> {
            self.closed.store(true, Ordering::SeqCst);
            Ok(Vec::new())
        }
    }

    fn row_group() -> RecordBatch {
        RecordBatch::try_from_iter([("offset", Arc::new(Int64Array::from(vec![1, 2])) as _)])
            .expect("a batch")
    }

    fn flaky() -> (Flaky, Arc<AtomicBool>) {
        let closed = Arc::new(AtomicBool::new(false));
        let writer = Flaky {
            written: 0,
            closed: Arc::clone(&closed),
        };
        (writer, closed)
    }

    #[tokio::test]
    async fn a_failing_writer_task_reports_its_own_error_and_takes_no_more_row_groups() {
        let (writer, closed) = flaky();
        let (row_groups, writing) = spawn_writer(writer);
        row_groups
            .send(Some(row_group()))
            .await
            .expect("first row group taken");
        row_groups
            .send(Some(row_group()))
            .await
            .expect("second row group queued");
        // The writer stops at the second: later sends fail, and what the
        // archiver returns is the writer's error, not a short record count.
        let mut refused = false;
        for _ in 0..3 {
            refused |= row_groups.send(Some(row_group())).await.is_err();
        }
        assert!(refused, "a failed writer still takes row groups");
        let error = writer_failure(writing).await;
        assert!(error.to_string().contains("object store gone"), "{error}");
        assert!(
            !error.is_bad_data(),
            "a writer failure is not the segment's fault"
        );
        assert!(!closed.load(Ordering::SeqCst));
    }

    /// A segment's batches in chunks of `per` records, one batch per
    /// chunk; Redis "fails" for chunks at or after `fail_at`.
    struct Chunked {
        per: i64,
        last: i64,
        fail_at: Option<i64>,
    }

    impl Chunks for Chunked {
        fn chunk(
            &mut self,
            next: i64,
        ) -> impl Future<Output = ketch_storage::Result<(Vec<Bytes>, i64)>> + Send {
            let result = if self.fail_at.is_some_and(|at| next >= at) {
                Err(ketch_storage::StorageError::Unavailable(
                    "connection reset".to_owned(),
                ))
            } else {
                let end = (next + self.per).min(self.last + 1);
                let mut batch = ketch_storage::batch::BatchBuilder::new(next);
                for offset in next..end {
                    let value = format!("record {offset}");
                    batch.push(offset, None, Some(value.as_bytes()), std::iter::empty());
                }
                Ok((vec![batch.finish()], end))
            };
            std::future::ready(result)
        }
    }

    /// A data file's bounds hold every key in it. Parquet cuts a long
    /// key's statistics to 64 bytes and marks them inexact, and iceberg
    /// leaves such a row group out of the file's bounds: bounds of the other
    /// row groups would miss the key (another engine's query for it would
    /// skip the file), so keys get none. Offsets and timestamps bound it.
    #[tokio::test]
    async fn a_data_files_key_bounds_never_miss_a_long_key() {
        /// The key of `offset`: short ones, and in each row group of 100
        /// a long one that is its largest (first group) or smallest.
        fn key(offset: i64) -> Vec<u8> {
            match offset {
                50 => vec![b'z'; 100],
                150 => vec![b'a'; 100],
                _ => format!("k{offset}").into_bytes(),
            }
        }
        struct Keyed;
        impl Chunks for Keyed {
            fn chunk(
                &mut self,
                next: i64,
            ) -> impl Future<Output = ketch_storage::Result<(Vec<Bytes>, i64)>> + Send {
                let mut batch = ketch_storage::batch::BatchBuilder::new(next);
                for offset in next..200 {
                    batch.push(offset, Some(&key(offset)), Some(b"v"), std::iter::empty());
                }
                std::future::ready(Ok((vec![batch.finish()], 200)))
            }
        }
        let lake = crate::testing::Lake::new(|s| s.row_group_rows = 100);
        let mut table = lake.table().await;
        let segment = crate::testing::segment(0, 200);
        lake.archiver
            .archive_from(
                &mut table,
                &lake.topic,
                0,
                &segment,
                Keyed,
                &Filter::default(),
                &Unfenced,
            )
            .await
            .expect("archived");
        let schema = table.metadata().current_schema().clone();
        let id = |name: &str| schema.field_by_name(name).expect("a field").id;
        let manifests = crate::maintenance::manifests(&table).await.expect("manifests");
        let manifest = manifests[0]
            .load_manifest(table.file_io())
            .await
            .expect("a manifest");
        let file = manifest.entries()[0].data_file();
        assert!(file.upper_bounds().contains_key(&id("offset")));
        assert!(file.upper_bounds().contains_key(&id("timestamp")));
        for offset in 0..200 {
            let key = iceberg::spec::Datum::binary(key(offset));
            if let Some(upper) = file.upper_bounds().get(&id("key")) {
                assert!(*upper >= key, "upper bound {upper:?} misses the key at {offset}");
            }
            if let Some(lower) = file.lower_bounds().get(&id("key")) {
                assert!(*lower <= key, "lower bound {lower:?} misses the key at {offset}");
            }
        }
    }

    /// Redis failing in the middle of a segment, after row groups went to
    /// the writer task: the attempt fails with Redis's error, and the next
    /// attempt writes the segment's data file (same name) whole.
    #[tokio::test]
    async fn a_segment_failing_midway_is_archived_whole_by_the_next_attempt() {
        let lake = crate::testing::Lake::new(|s| s.row_group_rows = 100);
        let mut table = lake.table().await;
        let segment = crate::testing::segment(0, 1000);
        let filter = Filter::default();
        let failing = Chunked {
            per: 150,
            last: 999,
            fail_at: Some(600),
        };
        let error = lake
            .archiver
            .archive_from(&mut table, &lake.topic, 0, &segment, failing, &filter, &Unfenced)
            .await
            .expect_err("Redis failed");
        assert!(error.to_string().contains("connection reset"), "{error}");
        assert!(!error.is_bad_data());

        let whole = Chunked {
            per: 150,
            last: 999,
            fail_at: None,
        };
        let archived = lake
            .archiver
            .archive_from(&mut table, &lake.topic, 0, &segment, whole, &filter, &Unfenced)
            .await
            .expect("archived");
        assert_eq!(archived.records, 1000);
        let rows = crate::testing::rows(&table).await;
        assert_eq!(rows, (0..1000).map(|offset| (0, offset)).collect());
    }

    /// A fence that no longer holds.
    struct Lost;

    impl Fence for Lost {
        async fn holds(&self) -> ketch_storage::Result<bool> {
            Ok(false)
        }
    }

    /// Archives segment 0..300 of partition 0 in chunks of 150 under `fence`.
    async fn archive_300(
        lake: &crate::testing::Lake,
        table: &mut Table,
        fence: &impl Fence,
    ) -> Result<Archived> {
        let segment = crate::testing::segment(0, 300);
        let chunks = Chunked {
            per: 150,
            last: 299,
            fail_at: None,
        };
        lake.archiver
            .archive_from(table, &lake.topic, 0, &segment, chunks, &Filter::default(), fence)
            .await
    }

    /// A fence lost while the segment was written (its archiving
    /// registration expired: the table may have been purged, or another
    /// worker took the partition over): nothing is committed and the data
    /// file stays (it may be the file the other worker committed); a later
    /// attempt under a fence that holds writes over it and commits.
    #[tokio::test]
    async fn a_segment_whose_fence_is_lost_is_not_committed_and_archived_by_the_next_attempt() {
        let lake = crate::testing::Lake::new(|s| s.row_group_rows = 100);
        let mut table = lake.table().await;
        let error = archive_300(&lake, &mut table, &Lost).await.expect_err("fenced");
        assert!(matches!(error, Error::Fenced), "{error}");
        assert!(!error.is_bad_data());
        assert_eq!(lake.files(".parquet").len(), 1, "its file stays");
        let reloaded = lake.table().await;
        assert!(
            reloaded.metadata().current_snapshot().is_none(),
            "nothing committed"
        );

        let archived = archive_300(&lake, &mut table, &Unfenced).await.expect("archived");
        assert_eq!(archived.records, 300);
        assert_eq!(lake.files(".parquet").len(), 1);
        let rows = crate::testing::rows(&lake.table().await).await;
        assert_eq!(rows, (0..300).map(|offset| (0, offset)).collect());
    }

    /// A stalled worker whose lease was taken over, by a worker that
    /// archived the segment meanwhile, finds that commit though its copy of
    /// the table predates it (the segment's file exists: the table is read
    /// afresh) and neither writes over nor deletes the committed file.
    /// (Before, a worker fenced out deleted the file at the segment's name:
    /// its successor's committed one.)
    #[tokio::test]
    async fn a_stalled_worker_finds_its_successors_commit_and_leaves_its_file() {
        let lake = crate::testing::Lake::new(|s| s.row_group_rows = 100);
        // The stalled worker's copy of the table, from before the commit.
        let mut stale = lake.table().await;
        let mut table = lake.table().await;
        let committed = archive_300(&lake, &mut table, &Unfenced)
            .await
            .expect("archived by the successor");
        let found = archive_300(&lake, &mut stale, &Lost)
            .await
            .expect("found committed");
        assert_eq!(
            (found.written, &found.path, found.file_bytes),
            (false, &committed.path, committed.file_bytes)
        );
        assert_eq!(lake.files(".parquet").len(), 1);
        let table = lake.table().await;
        assert_eq!(table.metadata().snapshots().count(), 1, "committed once");
        let rows = crate::testing::rows(&table).await;
        assert_eq!(rows, (0..300).map(|offset| (0, offset)).collect());
    }

    /// A segment's batches from `.0` on (DeleteRecords moved the log start
    /// there), in `.1`'s chunks.
    struct From(i64, Chunked);

    impl Chunks for From {
        fn chunk(
            &mut self,
            next: i64,
        ) -> impl Future<Output = ketch_storage::Result<(Vec<Bytes>, i64)>> + Send {
            self.1.chunk(next)
        }

        fn first_offset(&self, _: &Segment) -> i64 {
            self.0
        }
    }

    /// A catalog that refuses commits with the error kind `refusing` holds,
    /// every other call to the catalog it wraps.
    #[derive(Debug)]
    struct Refusing {
        inner: Arc<dyn Catalog>,
        refusing: std::sync::Mutex<Option<iceberg::ErrorKind>>,
    }

    #[async_trait::async_trait]
    impl Catalog for Refusing {
        async fn list_namespaces(
            &self,
            parent: Option<&NamespaceIdent>,
        ) -> iceberg::Result<Vec<NamespaceIdent>> {
            self.inner.list_namespaces(parent).await
        }
        async fn create_namespace(
            &self,
            namespace: &NamespaceIdent,
            properties: HashMap<String, String>,
        ) -> iceberg::Result<iceberg::Namespace> {
            self.inner.create_namespace(namespace, properties).await
        }
        async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<iceberg::Namespace> {
            self.inner.get_namespace(namespace).await
        }
        async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
            self.inner.namespace_exists(namespace).await
        }
        async fn update_namespace(
            &self,
            namespace: &NamespaceIdent,
            properties: HashMap<String, String>,
        ) -> iceberg::Result<()> {
            self.inner.update_namespace(namespace, properties).await
        }
        async fn drop_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<()> {
            self.inner.drop_namespace(namespace).await
        }
        async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
            self.inner.list_tables(namespace).await
        }
        async fn create_table(
            &self,
            namespace: &NamespaceIdent,
            creation: TableCreation,
        ) -> iceberg::Result<Table> {
            self.inner.create_table(namespace, creation).await
        }
        async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
            self.inner.load_table(table).await
        }
        async fn drop_table(&self, table: &TableIdent) -> iceberg::Result<()> {
            self.inner.drop_table(table).await
        }
        async fn purge_table(&self, table: &TableIdent) -> iceberg::Result<()> {
            self.inner.purge_table(table).await
        }
        async fn table_exists(&self, table: &TableIdent) -> iceberg::Result<bool> {
            self.inner.table_exists(table).await
        }
        async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
            self.inner.rename_table(src, dest).await
        }
        async fn register_table(&self, table: &TableIdent, location: String) -> iceberg::Result<Table> {
            self.inner.register_table(table, location).await
        }
        async fn update_table(&self, commit: iceberg::TableCommit) -> iceberg::Result<Table> {
            if let Some(kind) = *self.refusing.lock().unwrap() {
                return Err(iceberg::Error::new(kind, "the catalog's database is unreachable"));
            }
            self.inner.update_table(commit).await
        }
    }

    impl Refusing {
        fn refuse(&self, kind: Option<iceberg::ErrorKind>) {
            *self.refusing.lock().unwrap() = kind;
        }
    }

    /// Chunks that note they were read.
    struct Noting(Chunked, Arc<std::sync::atomic::AtomicBool>);

    impl Chunks for Noting {
        fn chunk(
            &mut self,
            next: i64,
        ) -> impl Future<Output = ketch_storage::Result<(Vec<Bytes>, i64)>> + Send {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
            self.0.chunk(next)
        }
    }

    /// Chunks that must not be read: the attempt has nothing to write.
    struct Unread;

    impl Chunks for Unread {
        fn chunk(
            &mut self,
            next: i64,
        ) -> impl Future<Output = ketch_storage::Result<(Vec<Bytes>, i64)>> + Send {
            panic!("chunk from {next} read: the data file is written again");
            #[allow(unreachable_code)]
            std::future::ready(Ok((Vec::new(), next)))
        }
    }

    /// Archives `segment` of partition 0 from `chunks`, unfenced.
    async fn archive(
        lake: &crate::testing::Lake,
        table: &mut Table,
        segment: &Segment,
        chunks: impl Chunks,
    ) -> Result<Archived> {
        lake.archiver
            .archive_from(
                table,
                &lake.topic,
                0,
                segment,
                chunks,
                &Filter::default(),
                &Unfenced,
            )
            .await
    }

    /// A data file whose commit failed (the catalog unreachable) is
    /// committed as it is by the segment's next attempt, which neither reads
    /// the segment again nor uploads it anew, while what the file was made
    /// from is what that attempt would read. One whose log start moved
    /// meanwhile (DeleteRecords), that was sealed again, that changed in
    /// the store, or that was written for another partition spec is written
    /// again.
    #[tokio::test]
    async fn a_data_file_whose_commit_failed_is_committed_by_the_next_attempt_without_writing_it_again() {
        let lake = crate::testing::Lake::new(|s| s.row_group_rows = 100);
        let mut table = lake.table().await;
        let refusing = Arc::new(Refusing {
            inner: lake.archiver.catalog().await.expect("the catalog"),
            refusing: Some(iceberg::ErrorKind::Unexpected).into(),
        });
        lake.archiver.catalog.lock().await.open = Some(refusing.clone());
        let refused = archive_300(&lake, &mut table, &Unfenced)
            .await
            .expect_err("refused");
        assert!(refused.to_string().contains("unreachable"), "{refused}");
        let [file] = &lake.files(".parquet")[..] else {
            panic!("one data file")
        };
        let written = std::fs::metadata(file).unwrap().modified().unwrap();
        refusing.refuse(None);
        let segment = crate::testing::segment(0, 300);
        let archived = lake
            .archiver
            .archive_from(
                &mut table,
                &lake.topic,
                0,
                &segment,
                Unread,
                &Filter::default(),
                &Unfenced,
            )
            .await
            .expect("committed");
        assert_eq!((archived.records, archived.written), (300, true));
        assert_eq!(
            std::fs::metadata(file).unwrap().modified().unwrap(),
            written,
            "not written again"
        );
        let rows = crate::testing::rows(&lake.table().await).await;
        assert_eq!(rows, (0..300).map(|offset| (0, offset)).collect());

        // The next segment's commit fails too; DeleteRecords then moves the
        // log start into it: its next attempt reads from there.
        refusing.refuse(Some(iceberg::ErrorKind::Unexpected));
        let segment = crate::testing::segment(300, 300);
        let chunks = |from| {
            From(
                from,
                Chunked {
                    per: 150,
                    last: 599,
                    fail_at: None,
                },
            )
        };
        archive(&lake, &mut table, &segment, chunks(300))
            .await
            .expect_err("refused");
        refusing.refuse(None);
        let archived = archive(&lake, &mut table, &segment, chunks(350))
            .await
            .expect("archived");
        assert_eq!(archived.records, 250, "written again from the log start");
        // A file whose commit failed and that then changed in the store
        // (another worker wrote its own there) is written again too.
        refusing.refuse(Some(iceberg::ErrorKind::Unexpected));
        let segment = crate::testing::segment(600, 300);
        let full = || Chunked {
            per: 150,
            last: 899,
            fail_at: None,
        };
        archive(&lake, &mut table, &segment, full())
            .await
            .expect_err("refused");
        refusing.refuse(None);
        let file = lake
            .files(".parquet")
            .into_iter()
            .find(|f| f.to_string_lossy().ends_with("00000000000000000600.parquet"))
            .expect("the third segment's file");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap()
            .set_len(10)
            .unwrap();
        let archived = archive(&lake, &mut table, &segment, full())
            .await
            .expect("archived");
        assert_eq!(archived.records, 300);

        // A segment sealed again under the same offsets (Redis lost the
        // first seal and its last records to a failover, and producers
        // wrote those offsets again): its file is written again, from the
        // records Redis holds now.
        let read = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let chunks = |last| {
            Noting(
                Chunked {
                    per: 150,
                    last,
                    fail_at: None,
                },
                read.clone(),
            )
        };
        let mut segment = crate::testing::segment(900, 300);
        refusing.refuse(Some(iceberg::ErrorKind::Unexpected));
        archive(&lake, &mut table, &segment, chunks(1199))
            .await
            .expect_err("refused");
        refusing.refuse(None);
        segment.sealed_ms += 1;
        read.store(false, std::sync::atomic::Ordering::SeqCst);
        archive(&lake, &mut table, &segment, chunks(1199))
            .await
            .expect("archived");
        assert!(read.load(std::sync::atomic::Ordering::SeqCst), "written again");
        // A file written for another partition spec than the table's now
        // (another engine changed it; the failed commit read the table
        // afresh): written again, not committed as it is again and again.
        let segment = crate::testing::segment(1200, 300);
        refusing.refuse(Some(iceberg::ErrorKind::Unexpected));
        archive(&lake, &mut table, &segment, chunks(1499))
            .await
            .expect_err("refused");
        refusing.refuse(None);
        for kept in lake.archiver.unlanded.lock().unwrap().values_mut() {
            kept.made_from.spec_id += 1;
        }
        read.store(false, std::sync::atomic::Ordering::SeqCst);
        archive(&lake, &mut table, &segment, chunks(1499))
            .await
            .expect("archived");
        assert!(read.load(std::sync::atomic::Ordering::SeqCst), "written again");

        let rows = crate::testing::rows(&lake.table().await).await;
        let expected: std::collections::BTreeSet<_> =
            (0..300).chain(350..1500).map(|offset| (0, offset)).collect();
        assert_eq!(rows, expected);
    }

    /// A commit Redis never heard of (a crash right after it), whose
    /// snapshot maintenance expired before the segment was tried again, is
    /// found by its data file, with the offsets that file has no rows for
    /// read off the file: DeleteRecords moved the log start further into
    /// the segment meanwhile, and holes recomputed from Redis (0..119 here,
    /// as before) described rows the file has, so reads of it failed.
    #[tokio::test]
    async fn a_commit_whose_snapshot_expired_is_found_with_the_holes_its_file_has() {
        let lake = crate::testing::Lake::new(|s| {
            s.row_group_rows = 100;
            s.snapshot_retention = ketch_config::Duration::from_millis(0);
            s.snapshots_kept = 1;
        });
        let mut table = lake.table().await;
        let segment = crate::testing::segment(0, 300);
        let chunks = |from| {
            From(
                from,
                Chunked {
                    per: 100,
                    last: 299,
                    fail_at: None,
                },
            )
        };
        let filter = Filter::default();
        let archived = lake
            .archiver
            .archive_from(
                &mut table,
                &lake.topic,
                0,
                &segment,
                chunks(50),
                &filter,
                &Unfenced,
            )
            .await
            .expect("archived");
        assert_eq!(archived.holes, Some(vec![(0, 49)]));
        lake.archive(&mut table, 0, 300, 100).await;
        lake.archiver.expire_snapshots(&mut table).await.expect("expired");
        assert!(
            committed(&table, &lake.topic, 0, &segment).is_none(),
            "the commit's snapshot is gone"
        );

        let found = lake
            .archiver
            .feed(&table, &lake.topic, 0, &segment, chunks(120), &filter)
            .await
            .expect("found");
        let Fed::Found(found) = found else {
            panic!("written again");
        };
        assert_eq!(
            (found.written, &found.path, found.holes),
            (false, &archived.path, Some(vec![(0, 49)]))
        );
        assert_eq!(lake.files(".parquet").len(), 2, "nothing written again");
    }

    /// A purge deletes the table's whole directory: also files no metadata
    /// names (here, what a commit the catalog refused leaves), and nothing
    /// beside it (a table whose name starts alike).
    #[tokio::test]
    async fn a_purge_leaves_nothing_of_the_table_and_touches_no_other() {
        let lake = crate::testing::Lake::new(|s| s.row_group_rows = 100);
        let mut table = lake.table().await;
        lake.archive(&mut table, 0, 0, 10).await;
        let location = table.metadata().location().trim_end_matches('/').to_owned();
        let local = |path: &str| std::path::PathBuf::from(path.trim_start_matches("file://"));
        let orphan = local(&format!("{location}/metadata/snap-refused.avro"));
        std::fs::write(&orphan, b"a manifest list no metadata names").expect("written");
        let beside = local(&format!("{location}-2/metadata/00000-beside.metadata.json"));
        std::fs::create_dir_all(beside.parent().expect("a parent")).expect("a directory");
        std::fs::write(&beside, b"{}").expect("written");

        assert!(lake.archiver.purge_table(&lake.topic).await.expect("purged"));
        let left: Vec<_> = lake
            .files("")
            .into_iter()
            .filter(|p| p.starts_with(local(&location)))
            .collect();
        assert!(left.is_empty(), "left of the table: {left:?}");
        assert!(beside.exists(), "the other table's file was deleted");
        assert!(!lake.archiver.purge_table(&lake.topic).await.expect("no table"));
    }

    /// The worker reads and encodes a partition's next segment while the
    /// one before closes its file and commits: commits stay in the
    /// partition's order; a segment given up then leaves its file
    /// uncommitted, which its next attempt writes over and commits.
    #[tokio::test]
    async fn a_segment_fed_while_the_one_before_closes_commits_after_it_and_one_given_up_is_archived_again() {
        let lake = crate::testing::Lake::new(|_| {});
        let mut table = lake.table().await;
        let first = lake.start(&table, 0, 0, 10).await;
        let second = lake.start(&table.clone(), 0, 10, 10).await;
        lake.finish(&mut table, 0, 0, 10, first).await;
        lake.finish(&mut table, 0, 10, 10, second).await;
        let mut snapshots: Vec<_> = table.metadata().snapshots().collect();
        snapshots.sort_by_key(|s| s.sequence_number());
        let bases: Vec<_> = snapshots
            .iter()
            .filter_map(|s| s.summary().additional_properties.get(BASE_OFFSET).cloned())
            .collect();
        assert_eq!(bases, ["0", "10"]);
        let all: std::collections::BTreeSet<_> = (0..20).map(|offset| (0, offset)).collect();
        assert_eq!(crate::testing::rows(&table).await, all);

        let given_up = lake.start(&table, 0, 20, 10).await;
        assert!(matches!(given_up, Fed::Closing(_)));
        given_up.abandon().await;
        assert_eq!(lake.files(".parquet").len(), 3, "the given-up file stays");
        let mut table = lake.table().await;
        assert_eq!(table.metadata().snapshots().count(), 2);
        assert_eq!(crate::testing::rows(&table).await, all);
        let again = lake.start(&table, 0, 20, 10).await;
        lake.finish(&mut table, 0, 20, 10, again).await;
        assert_eq!(lake.files(".parquet").len(), 3, "written over, not beside");
        let all: std::collections::BTreeSet<_> = (0..30).map(|offset| (0, offset)).collect();
        assert_eq!(crate::testing::rows(&lake.table().await).await, all);
    }

    #[tokio::test]
    async fn a_segment_given_up_leaves_its_file_unclosed_and_one_finished_is_closed() {
        let (writer, closed) = flaky();
        let (row_groups, writing) = spawn_writer(writer);
        row_groups.send(Some(row_group())).await.expect("row group taken");
        drop(row_groups);
        assert!(writing.await.expect("the task ends").is_err());
        assert!(
            !closed.load(Ordering::SeqCst),
            "a segment given up must not finish a data file"
        );

        let (writer, closed) = flaky();
        let (row_groups, writing) = spawn_writer(writer);
        row_groups.send(Some(row_group())).await.expect("row group taken");
        row_groups.send(None).await.expect("close taken");
        assert!(writing.await.expect("the task ends").is_ok());
        assert!(closed.load(Ordering::SeqCst));
    }

    /// Every codec `tiering.compression` takes writes data files in that
    /// codec (read off the file's own metadata), whose rows and values read
    /// back, and a new table records it for other engines' writers.
    #[tokio::test]
    async fn each_archive_codec_writes_files_in_it_that_read_back() {
        use arrow_array::cast::AsArray;
        use parquet::file::reader::{FileReader, SerializedFileReader};

        for (codec, level, expected) in [
            (
                "zstd",
                None,
                Compression::ZSTD(ZstdLevel::try_new(1).expect("a level")),
            ),
            (
                "zstd",
                Some(9),
                Compression::ZSTD(ZstdLevel::try_new(9).expect("a level")),
            ),
            ("lz4", None, Compression::LZ4_RAW),
            ("snappy", None, Compression::SNAPPY),
            (
                "gzip",
                Some(1),
                Compression::GZIP(GzipLevel::try_new(1).expect("a level")),
            ),
            ("uncompressed", None, Compression::UNCOMPRESSED),
        ] {
            let lake = crate::testing::Lake::new(|s| {
                s.row_group_rows = 100;
                s.compression = codec.to_owned();
                s.compression_level = level;
            });
            let mut table = lake.table().await;
            let properties = table.metadata().properties();
            assert_eq!(
                properties
                    .get("write.parquet.compression-codec")
                    .map(String::as_str),
                Some(iceberg_codec(codec))
            );
            let recorded_level = properties.get("write.parquet.compression-level").cloned();
            assert_eq!(
                recorded_level,
                match codec {
                    "zstd" => Some(level.unwrap_or(1).to_string()),
                    "gzip" => Some(level.unwrap_or(6).to_string()),
                    _ => None,
                },
                "{codec}"
            );
            let archived = lake.archive(&mut table, 0, 0, 250).await;
            assert_eq!(archived.records, 250);

            let files = lake.files(".parquet");
            assert_eq!(files.len(), 1, "{codec}: {files:?}");
            let reader = SerializedFileReader::new(std::fs::File::open(&files[0]).expect("the file"))
                .expect("a Parquet file");
            let metadata = reader.metadata();
            assert_eq!(metadata.num_row_groups(), 3, "{codec}");
            for group in metadata.row_groups() {
                for column in group.columns() {
                    // The codec's level is not in the file; the codec is.
                    assert_eq!(
                        std::mem::discriminant(&column.compression()),
                        std::mem::discriminant(&expected),
                        "{codec}: {}",
                        column.column_path()
                    );
                }
            }

            let table = lake.table().await;
            let batches = crate::testing::scan(&table, &["offset", "value"]).await;
            let mut read = Vec::new();
            for batch in &batches {
                let offsets = batch.column(0).as_primitive::<arrow_array::types::Int64Type>();
                let values = batch.column(1).as_binary::<i64>();
                for i in 0..batch.num_rows() {
                    read.push((offsets.value(i), values.value(i).to_vec()));
                }
            }
            read.sort();
            let written: Vec<_> = (0..250)
                .map(|offset| (offset, format!("record {offset}").into_bytes()))
                .collect();
            assert_eq!(read, written, "{codec}");
        }
    }
}
