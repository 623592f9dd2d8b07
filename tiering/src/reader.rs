//! Reads below the local start offset, from the archive (DESIGN §7).
//!
//! The segment record in Redis names the data file; offsets are dense in a
//! segment, so the row group holding an offset follows from the row counts
//! in the file's footer, and only that row group is read (ranged reads on
//! S3). Footers and decoded row groups are cached, so a sequential reader
//! decodes each row group once. Rows become uncompressed Kafka batches with
//! the offsets, timestamps, keys, values and headers that were produced.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use bytes::Bytes;
use futures::TryStreamExt;
use iceberg::arrow::ArrowFileReader;
use iceberg::io::{FileIO, FileIOBuilder, FileMetadata};
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;
use ketch_config::TieringSettings;
use ketch_storage::segments::Segment;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};

use crate::metrics::Metrics;
use crate::table::{self, Columns};
use crate::{Error, Result};

/// Largest rebuilt batch; a fetch gets several up to its byte limit.
const BATCH_BYTES: usize = 32 * 1024;
/// A row group: the data file's path and the group's index.
type GroupKey = (String, usize);

/// Row groups read ahead of a sequential reader.
const READ_AHEAD: usize = 4;
/// Footers kept.
const FOOTERS: usize = 1024;

/// Reads archived segments.
pub struct RemoteReader {
    file_io: FileIO,
    footers: Mutex<HashMap<String, ArrowReaderMetadata>>,
    groups: Mutex<GroupCache>,
    /// Row groups being read ahead.
    ahead: Mutex<std::collections::HashSet<(String, usize)>>,
    /// Row groups being read, so concurrent readers share one read.
    loading: Mutex<HashMap<GroupKey, Arc<tokio::sync::OnceCell<Arc<RecordBatch>>>>>,
    metrics: Arc<Metrics>,
}

impl RemoteReader {
    pub fn new(settings: &TieringSettings, metrics: Arc<Metrics>) -> Self {
        let file_io = FileIOBuilder::new(Arc::new(OpenDalResolvingStorageFactory::new()))
            .with_props(crate::archive::storage_props(settings))
            .build();
        Self {
            file_io,
            footers: Mutex::new(HashMap::new()),
            groups: Mutex::new(GroupCache::new(settings.read_cache_bytes)),
            ahead: Mutex::new(std::collections::HashSet::new()),
            loading: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Record batches from `offset` (inside `segment`, which is archived)
    /// up to about `max_bytes`, never past the segment's end. The next
    /// [`READ_AHEAD`] row groups are read in the background, so a sequential
    /// reader finds them decoded.
    pub async fn read(
        self: &Arc<Self>,
        segment: &Segment,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Vec<Bytes>> {
        let path = segment_path(segment)?;
        let footer = self.footer(segment, path).await?;
        let mut out = Vec::new();
        let mut total = 0usize;
        let mut next = offset;
        while next <= segment.last && (out.is_empty() || total < max_bytes) {
            let (group, first) = row_group_of(&footer, segment, next)?;
            let rows = self.row_group(segment, path, &footer, group).await?;
            for ahead in 1..=READ_AHEAD {
                self.read_ahead(segment, path, &footer, group + ahead);
            }
            let columns = Columns::of(&rows)?;
            let from = usize::try_from(next - first).map_err(|_| Error::Data("row index".to_owned()))?;
            if from >= columns.len() || columns.offset(from) != next {
                return Err(Error::Data(format!(
                    "{path}: row group {group} does not hold offset {next} where expected"
                )));
            }
            let budget = max_bytes.saturating_sub(total);
            let (batches, end) = table::encode(&columns, from, BATCH_BYTES, budget, out.is_empty());
            if batches.is_empty() {
                break;
            }
            total += batches.iter().map(Bytes::len).sum::<usize>();
            out.extend(batches);
            next = columns.offset(end - 1) + 1;
        }
        self.metrics.remote_read(total as u64);
        Ok(out)
    }

    /// The first archived record in `segment` from `from` on whose
    /// timestamp satisfies `pred`, as (offset, timestamp).
    pub async fn find(
        &self,
        segment: &Segment,
        from: i64,
        mut pred: impl FnMut(i64) -> bool,
    ) -> Result<Option<(i64, i64)>> {
        let path = segment_path(segment)?;
        let footer = self.footer(segment, path).await?;
        let mut next = from.max(segment.base);
        while next <= segment.last {
            let (group, first) = row_group_of(&footer, segment, next)?;
            let rows = self.row_group(segment, path, &footer, group).await?;
            let columns = Columns::of(&rows)?;
            let start = usize::try_from(next - first).map_err(|_| Error::Data("row index".to_owned()))?;
            for i in start..columns.len() {
                let ts = columns.timestamp_ms(i);
                if pred(ts) {
                    return Ok(Some((columns.offset(i), ts)));
                }
            }
            next = first + columns.len() as i64;
        }
        Ok(None)
    }

    /// Starts reading row group `group` of the file into the cache, unless
    /// it is there, being read, or past the file's end.
    fn read_ahead(
        self: &Arc<Self>,
        segment: &Segment,
        path: &str,
        footer: &ArrowReaderMetadata,
        group: usize,
    ) {
        if group >= footer.metadata().num_row_groups() {
            return;
        }
        let key = (path.to_owned(), group);
        if self.groups.lock().expect("row groups").contains(&key)
            || !self.ahead.lock().expect("read ahead").insert(key.clone())
        {
            return;
        }
        let (reader, segment, footer) = (self.clone(), segment.clone(), footer.clone());
        tokio::spawn(async move {
            if let Err(e) = reader.row_group(&segment, &key.0, &footer, key.1).await {
                tracing::debug!(path = %key.0, group = key.1, error = %e, "reading ahead failed");
            }
            reader.ahead.lock().expect("read ahead").remove(&key);
        });
    }

    async fn footer(&self, segment: &Segment, path: &str) -> Result<ArrowReaderMetadata> {
        if let Some(footer) = self.footers.lock().expect("footers").get(path) {
            return Ok(footer.clone());
        }
        let mut reader = self.open(segment, path).await?;
        let footer = ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new()).await?;
        let mut footers = self.footers.lock().expect("footers");
        if footers.len() >= FOOTERS {
            footers.clear();
        }
        footers.insert(path.to_owned(), footer.clone());
        Ok(footer)
    }

    async fn open(&self, segment: &Segment, path: &str) -> Result<ArrowFileReader> {
        let input = self.file_io.new_input(path)?;
        let size = match segment.file_bytes {
            Some(size) if size > 0 => size as u64,
            _ => input.metadata().await?.size,
        };
        Ok(ArrowFileReader::new(FileMetadata { size }, input.reader().await?))
    }

    /// A decoded row group: from the cache, else read once however many
    /// readers (and the read-ahead) ask for it at the same time.
    async fn row_group(
        &self,
        segment: &Segment,
        path: &str,
        footer: &ArrowReaderMetadata,
        group: usize,
    ) -> Result<Arc<RecordBatch>> {
        let key = (path.to_owned(), group);
        if let Some(rows) = self.groups.lock().expect("row groups").get(&key) {
            self.metrics.cache_hit();
            return Ok(rows);
        }
        let cell = self
            .loading
            .lock()
            .expect("loading")
            .entry(key.clone())
            .or_default()
            .clone();
        let loaded = cell
            .get_or_try_init(|| async {
                self.metrics.cache_miss();
                let rows = Arc::new(self.load(segment, path, footer, group).await?);
                self.groups
                    .lock()
                    .expect("row groups")
                    .put(key.clone(), rows.clone());
                Ok::<_, Error>(rows)
            })
            .await
            .cloned();
        self.loading.lock().expect("loading").remove(&key);
        loaded
    }

    async fn load(
        &self,
        segment: &Segment,
        path: &str,
        footer: &ArrowReaderMetadata,
        group: usize,
    ) -> Result<RecordBatch> {
        let reader = self.open(segment, path).await?;
        let rows_in_group = footer.metadata().row_group(group).num_rows().max(1) as usize;
        let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, footer.clone())
            .with_row_groups(vec![group])
            .with_batch_size(rows_in_group)
            .build()?;
        let batches: Vec<RecordBatch> = stream.try_collect().await?;
        match batches.len() {
            1 => Ok(batches.into_iter().next().expect("one batch")),
            _ => arrow_select_concat(&batches),
        }
    }
}

fn segment_path(segment: &Segment) -> Result<&str> {
    segment.path.as_deref().ok_or_else(|| {
        Error::Data(format!(
            "segment {}..={} is not archived",
            segment.base, segment.last
        ))
    })
}

/// The row group holding `offset` and the offset of its first row.
fn row_group_of(footer: &ArrowReaderMetadata, segment: &Segment, offset: i64) -> Result<(usize, i64)> {
    let mut first = segment.base;
    for (i, group) in footer.metadata().row_groups().iter().enumerate() {
        let rows = group.num_rows();
        if offset < first + rows {
            return Ok((i, first));
        }
        first += rows;
    }
    Err(Error::Data(format!(
        "the archived segment {}..={} has no row for offset {offset}",
        segment.base, segment.last
    )))
}

fn arrow_select_concat(batches: &[RecordBatch]) -> Result<RecordBatch> {
    let Some(first) = batches.first() else {
        return Err(Error::Data("an empty row group".to_owned()));
    };
    arrow_select::concat::concat_batches(&first.schema(), batches).map_err(|e| Error::Data(e.to_string()))
}

/// Decoded row groups, least recently used out first, bounded in bytes.
struct GroupCache {
    capacity: usize,
    used: usize,
    entries: HashMap<(String, usize), (Arc<RecordBatch>, usize)>,
    order: VecDeque<(String, usize)>,
}

impl GroupCache {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            used: 0,
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn contains(&self, key: &(String, usize)) -> bool {
        self.entries.contains_key(key)
    }

    fn get(&mut self, key: &(String, usize)) -> Option<Arc<RecordBatch>> {
        let rows = self.entries.get(key)?.0.clone();
        if let Some(at) = self.order.iter().position(|k| k == key) {
            let key = self.order.remove(at).expect("present");
            self.order.push_back(key);
        }
        Some(rows)
    }

    fn put(&mut self, key: (String, usize), rows: Arc<RecordBatch>) {
        let size = rows.get_array_memory_size();
        if size > self.capacity || self.entries.contains_key(&key) {
            return;
        }
        while self.used + size > self.capacity {
            let Some(old) = self.order.pop_front() else { break };
            if let Some((_, old_size)) = self.entries.remove(&old) {
                self.used -= old_size;
            }
        }
        self.used += size;
        self.entries.insert(key.clone(), (rows, size));
        self.order.push_back(key);
    }
}
