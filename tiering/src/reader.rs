//! Reads below the local start offset, from the archive (DESIGN §7).
//!
//! The segment record in Redis names the data file; offsets are dense in a
//! segment, so the row group holding an offset follows from the row counts
//! in the file's footer. A row group is decoded in slices of about
//! [`SLICE_BYTES`] (their row count from the group's uncompressed size),
//! [`WINDOW_SLICES`] neighbouring slices by one read (a window), and only
//! the windows a read needs, so memory follows the bytes a fetch asks for,
//! not the size of a row group; the offset index lets a window skip the
//! pages before it (ranged reads on S3). Footers and decoded slices are
//! cached, so a sequential reader decodes each slice once. Rows become
//! uncompressed Kafka batches with the offsets, timestamps, keys, values and
//! headers that were produced.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use bytes::Bytes;
use futures::TryStreamExt;
use iceberg::arrow::ArrowFileReader;
use iceberg::io::{FileIO, FileIOBuilder, FileMetadata};
use ketch_config::TieringSettings;
use ketch_storage::segments::Segment;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::PageIndexPolicy;

use crate::metrics::Metrics;
use crate::table::{self, Columns};
use crate::{Error, Result};

/// Largest rebuilt batch; a fetch gets several up to its byte limit.
const BATCH_BYTES: usize = 32 * 1024;
/// Decoded bytes a slice of a row group holds (about; one row at least).
const SLICE_BYTES: usize = 1024 * 1024;
/// A slice of a row group: the data file's path, the group's index and the
/// slice's index in the group.
type SliceKey = (String, usize, usize);
/// A window of a row group: the data file's path, the group's index and the
/// window's index in the group.
type WindowKey = (String, usize, usize);

/// Slices decoded by one read of a data file: windows `0..WINDOW_SLICES`,
/// `WINDOW_SLICES..2 * WINDOW_SLICES`, … of a row group. Each read fetches
/// the pages its rows lie in and decompresses them, and skips (decodes and
/// drops) the rows of the first page before its first row: neighbouring
/// slices read one by one fetched and decompressed the pages they share
/// twice and skipped their way into the middle of a group, a fifth of the
/// gateway's CPU time while a consumer replayed the archive.
const WINDOW_SLICES: usize = 4;
/// Slices read ahead of a sequential reader (whole windows) at most; fewer
/// when a quarter of the read cache holds fewer, so four sequential
/// readers fit in it.
const READ_AHEAD: usize = 16;
/// Footers kept.
const FOOTERS: usize = 1024;

/// What [`RemoteReader::read`] read.
pub struct RemoteRead {
    pub batches: Vec<Bytes>,
    /// The read-ahead reached the segment's end.
    pub near_end: bool,
}

/// A window's slices, as read once and shared by its readers.
type Window = Arc<Vec<Arc<RecordBatch>>>;

/// How a window's load ended, as its readers share it.
type WindowLoad = std::result::Result<Window, Arc<Error>>;

/// The archive's files, read with the gateway's settings.
fn file_io(settings: &TieringSettings) -> FileIO {
    FileIOBuilder::new(crate::credentials::storage_factory())
        .with_props(crate::archive::storage_props(settings))
        .build()
}

/// Whether the archive's data file at `path` exists; an error when the
/// object store cannot tell (unreachable, access refused).
pub async fn data_file_exists(settings: &TieringSettings, path: &str) -> Result<bool> {
    Ok(file_io(settings).exists(path).await?)
}

/// Reads archived segments.
pub struct RemoteReader {
    file_io: FileIO,
    footers: Mutex<HashMap<String, ArrowReaderMetadata>>,
    slices: Mutex<SliceCache>,
    /// Windows being read ahead.
    ahead: Mutex<std::collections::HashSet<WindowKey>>,
    /// Windows being read, so concurrent readers share one read.
    /// A window's load, failed or not, is its waiters' outcome: a store
    /// that fails is asked once by them all, not once each in turn.
    loading: Mutex<HashMap<WindowKey, Arc<tokio::sync::OnceCell<WindowLoad>>>>,
    metrics: Arc<Metrics>,
    /// Slices read ahead of a sequential reader.
    read_ahead: usize,
    /// Windows read ahead at once, of every reader together: about a
    /// quarter of the cache, so that many readers of the archive at once
    /// decode no more ahead than the cache can keep (each used to start
    /// its own sixteen slices).
    max_ahead: usize,
}

impl RemoteReader {
    pub fn new(settings: &TieringSettings, metrics: Arc<Metrics>) -> Self {
        Self {
            file_io: file_io(settings),
            footers: Mutex::new(HashMap::new()),
            slices: Mutex::new(SliceCache::new(settings.read_cache_bytes)),
            ahead: Mutex::new(std::collections::HashSet::new()),
            loading: Mutex::new(HashMap::new()),
            metrics,
            read_ahead: (settings.read_cache_bytes / (4 * SLICE_BYTES)).clamp(1, READ_AHEAD),
            max_ahead: (settings.read_cache_bytes / (4 * WINDOW_SLICES * SLICE_BYTES)).max(1),
        }
    }

    /// Record batches from `offset` (inside `segment`, which is archived)
    /// up to about `max_bytes`, never past the segment's end. The windows
    /// of the next slices (up to [`READ_AHEAD`]) are read in the background,
    /// so a sequential reader finds them decoded; when they reach past the
    /// segment's end, [`RemoteRead::near_end`] says so, for the caller to
    /// start on the next segment ([`RemoteReader::read_ahead_segment`]).
    pub async fn read(
        self: &Arc<Self>,
        segment: &Segment,
        offset: i64,
        max_bytes: usize,
    ) -> Result<RemoteRead> {
        let mut next = kept(segment, offset);
        if next > segment.last {
            // Left out to its end (a segment of no committed records has
            // no data file at all).
            return Ok(RemoteRead {
                batches: Vec::new(),
                near_end: false,
            });
        }
        let path = segment_path(segment)?;
        let footer = self.footer(segment, path).await?;
        let mut out = Vec::new();
        let mut total = 0usize;
        let mut near_end = false;
        while next <= segment.last && (out.is_empty() || total < max_bytes) {
            let at = Position::of(&footer, segment, next)?;
            let rows = self.slice(segment, path, &footer, at).await?;
            for ahead in 1..=self.read_ahead {
                match at.after(&footer, ahead) {
                    Some(later) => self.read_ahead(segment, path, &footer, later),
                    None => {
                        near_end = true;
                        break;
                    }
                }
            }
            let columns = Columns::of(&rows)?;
            let from = usize::try_from(row_of(segment, next) - at.first_row)
                .map_err(|_| Error::Data("row index".to_owned()))?;
            if from >= columns.len() || columns.offset(from) != next {
                return Err(Error::Misplaced(format!(
                    "{path}: row group {} slice {} does not hold offset {next} where expected",
                    at.group, at.slice
                )));
            }
            let budget = max_bytes.saturating_sub(total);
            let (batches, end) = table::encode(&columns, from, BATCH_BYTES, budget, out.is_empty());
            if batches.is_empty() {
                break;
            }
            total += batches.iter().map(Bytes::len).sum::<usize>();
            out.extend(batches);
            next = kept(segment, columns.offset(end - 1) + 1);
        }
        self.metrics.remote_read(total as u64);
        Ok(RemoteRead {
            batches: out,
            near_end,
        })
    }

    /// Starts reading the footer and first slices (up to [`READ_AHEAD`]) of
    /// `segment` (archived) in the background: a sequential reader about to
    /// finish the segment before it then finds them decoded, instead of
    /// waiting for a footer and a window at every segment's start.
    pub fn read_ahead_segment(self: &Arc<Self>, segment: Segment) {
        let reader = self.clone();
        tokio::spawn(async move {
            let started = async {
                if kept(&segment, segment.base) > segment.last {
                    return Ok(()); // no row to read
                }
                let path = segment_path(&segment)?;
                let footer = reader.footer(&segment, path).await?;
                let first = Position::of(&footer, &segment, segment.base)?;
                for ahead in 0..reader.read_ahead {
                    match first.after(&footer, ahead) {
                        Some(at) => reader.read_ahead(&segment, path, &footer, at),
                        None => break,
                    }
                }
                Ok::<_, Error>(())
            };
            if let Err(e) = started.await {
                tracing::debug!(base = segment.base, error = %e, "reading a segment ahead failed");
            }
        });
    }

    /// The first archived record in `segment` from `from` on whose
    /// timestamp satisfies `pred`, as (offset, timestamp).
    pub async fn find(
        &self,
        segment: &Segment,
        from: i64,
        mut pred: impl FnMut(i64) -> bool,
    ) -> Result<Option<(i64, i64)>> {
        let mut next = kept(segment, from.max(segment.base));
        if next > segment.last {
            return Ok(None);
        }
        let path = segment_path(segment)?;
        let footer = self.footer(segment, path).await?;
        while next <= segment.last {
            let at = Position::of(&footer, segment, next)?;
            let rows = self.slice(segment, path, &footer, at).await?;
            let columns = Columns::of(&rows)?;
            let start = usize::try_from(row_of(segment, next) - at.first_row)
                .map_err(|_| Error::Data("row index".to_owned()))?;
            for i in start..columns.len() {
                let ts = columns.timestamp_ms(i);
                if pred(ts) {
                    return Ok(Some((columns.offset(i), ts)));
                }
            }
            if columns.is_empty() {
                break;
            }
            next = kept(segment, columns.offset(columns.len() - 1) + 1);
        }
        Ok(None)
    }

    /// Starts reading a slice's window into the cache, unless the slice is
    /// there or its window is being read ahead.
    fn read_ahead(
        self: &Arc<Self>,
        segment: &Segment,
        path: &str,
        footer: &ArrowReaderMetadata,
        at: Position,
    ) {
        let key = at.window_key(path);
        if self.slices.lock().expect("slices").contains(&at.key(path)) || !self.claim_ahead(&key) {
            return;
        }
        let (reader, segment, footer, path) =
            (self.clone(), segment.clone(), footer.clone(), path.to_owned());
        tokio::spawn(async move {
            if let Err(e) = reader.slice(&segment, &path, &footer, at).await {
                tracing::debug!(path = %path, group = at.group, slice = at.slice, error = %e, "reading ahead failed");
            }
            reader.ahead.lock().expect("read ahead").remove(&key);
        });
    }

    /// Whether `key`'s window may be read ahead now: not being read ahead
    /// already, and fewer than `max_ahead` windows are.
    fn claim_ahead(&self, key: &WindowKey) -> bool {
        let mut ahead = self.ahead.lock().expect("read ahead");
        ahead.len() < self.max_ahead && ahead.insert(key.clone())
    }

    async fn footer(&self, segment: &Segment, path: &str) -> Result<ArrowReaderMetadata> {
        if let Some(footer) = self.footers.lock().expect("footers").get(path) {
            return Ok(footer.clone());
        }
        let mut reader = self.open(segment, path).await?;
        // The offset index lets a slice skip the pages before it.
        let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
        let footer = ArrowReaderMetadata::load_async(&mut reader, options).await?;
        let mut footers = self.footers.lock().expect("footers");
        if footers.len() >= FOOTERS {
            footers.clear();
        }
        footers.insert(path.to_owned(), footer.clone());
        Ok(footer)
    }

    /// The offsets of `segment` its data file at `path` has no rows for,
    /// read off the file's `offset` column.
    pub async fn holes_in_file(&self, segment: &Segment, path: &str) -> Result<Vec<(i64, i64)>> {
        crate::archive::holes_in_file(&self.file_io, segment, path).await
    }

    async fn open(&self, segment: &Segment, path: &str) -> Result<ArrowFileReader> {
        let input = self.file_io.new_input(path)?;
        let size = match segment.file_bytes {
            Some(size) if size > 0 => size as u64,
            _ => input.metadata().await?.size,
        };
        Ok(ArrowFileReader::new(FileMetadata { size }, input.reader().await?))
    }

    /// A decoded slice: from the cache, else read with its window, once
    /// however many readers (and the read-ahead) ask for the window at the
    /// same time.
    async fn slice(
        &self,
        segment: &Segment,
        path: &str,
        footer: &ArrowReaderMetadata,
        at: Position,
    ) -> Result<Arc<RecordBatch>> {
        let key = at.key(path);
        if let Some(rows) = self.slices.lock().expect("slices").get(&key) {
            self.metrics.cache_hit();
            return Ok(rows);
        }
        let window = at.window_key(path);
        let cell = self
            .loading
            .lock()
            .expect("loading")
            .entry(window.clone())
            .or_default()
            .clone();
        let loaded = cell
            .get_or_init(|| async {
                let slices = self
                    .load_window(segment, path, footer, at)
                    .await
                    .map_err(Arc::new)?;
                let first = at.window_first_slice();
                let mut cache = self.slices.lock().expect("slices");
                for (i, rows) in slices.iter().enumerate() {
                    self.metrics.cache_miss();
                    cache.put((path.to_owned(), at.group, first + i), rows.clone());
                }
                Ok(Arc::new(slices))
            })
            .await
            .clone();
        // The next reader after this load, failed or not, loads afresh
        // (unless a newer load of the window has begun: it is left alone).
        let mut loading = self.loading.lock().expect("loading");
        if loading
            .get(&window)
            .is_some_and(|current| Arc::ptr_eq(current, &cell))
        {
            loading.remove(&window);
        }
        drop(loading);
        let slices = loaded.map_err(|e| match &*e {
            Error::Misplaced(why) => Error::Misplaced(why.clone()),
            other => Error::Io(other.to_string()),
        })?;
        slices
            .get(at.slice - at.window_first_slice())
            .cloned()
            .ok_or_else(|| {
                Error::Data(format!(
                    "{path}: row group {} has no slice {}",
                    at.group, at.slice
                ))
            })
    }

    /// The slices of `at`'s window, in order, each of `at.slice_rows` rows
    /// (the group's last one may be shorter).
    async fn load_window(
        &self,
        segment: &Segment,
        path: &str,
        footer: &ArrowReaderMetadata,
        at: Position,
    ) -> Result<Vec<Arc<RecordBatch>>> {
        let reader = self.open(segment, path).await?;
        let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, footer.clone())
            .with_row_groups(vec![at.group])
            .with_offset(at.window_first_slice() * at.slice_rows)
            .with_limit(WINDOW_SLICES * at.slice_rows)
            .with_batch_size(at.slice_rows)
            .build()?;
        let batches: Vec<RecordBatch> = stream.try_collect().await?;
        into_slices(batches, at.slice_rows)
    }
}

/// Record batches cut into slices of `rows` rows (the last may be
/// shorter): as the reader made them when that is their size, else slices
/// of their concatenation (which share its buffers: the cache counts each
/// slice at the size of the whole, so it holds less than it counts, never
/// more).
fn into_slices(batches: Vec<RecordBatch>, rows: usize) -> Result<Vec<Arc<RecordBatch>>> {
    let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
    let (last, full) = match batches.split_last() {
        Some((last, full)) => (last, full),
        None => return Ok(Vec::new()),
    };
    if full.iter().all(|b| b.num_rows() == rows) && last.num_rows() <= rows {
        return Ok(batches.into_iter().map(Arc::new).collect());
    }
    let all = arrow_select_concat(&batches)?;
    let mut slices = Vec::with_capacity(all.num_rows().div_ceil(rows));
    let mut from = 0;
    while from < all.num_rows() {
        let len = rows.min(all.num_rows() - from);
        slices.push(Arc::new(all.slice(from, len)));
        from += len;
    }
    Ok(slices)
}

/// The row of `offset` in its segment's data file: the offsets of the
/// segment less those left out before it (`Segment::holes`); an offset
/// left out has the row of the next one kept.
fn row_of(segment: &Segment, offset: i64) -> i64 {
    let left_out: i64 = segment
        .holes
        .iter()
        .map(|&(first, last)| {
            if last < offset {
                last - first + 1
            } else if first <= offset {
                offset - first
            } else {
                0
            }
        })
        .sum();
    offset - segment.base - left_out
}

/// `offset`, or the first offset after it that the data file has a row
/// for when the archive left it out.
fn kept(segment: &Segment, offset: i64) -> i64 {
    segment
        .holes
        .iter()
        .find(|&&(first, last)| (first..=last).contains(&offset))
        .map_or(offset, |&(_, last)| last + 1)
}

/// Where an offset lies in a data file: its row group, the slice of the
/// group, and the index of the slice's first row in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    group: usize,
    slice: usize,
    /// Rows per slice of this group.
    slice_rows: usize,
    first_row: i64,
}

impl Position {
    /// The slice holding `offset` (its row: [`row_of`]).
    fn of(footer: &ArrowReaderMetadata, segment: &Segment, offset: i64) -> Result<Self> {
        let row = row_of(segment, offset);
        let mut first = 0;
        for (group, metadata) in footer.metadata().row_groups().iter().enumerate() {
            let rows = metadata.num_rows();
            if row < first + rows {
                let slice_rows = slice_rows(metadata.total_byte_size(), rows);
                let slice = ((row - first) as usize) / slice_rows;
                return Ok(Self {
                    group,
                    slice,
                    slice_rows,
                    first_row: first + (slice * slice_rows) as i64,
                });
            }
            first += rows;
        }
        Err(Error::Misplaced(format!(
            "the archived segment {}..={} has no row for offset {offset}",
            segment.base, segment.last
        )))
    }

    /// The slice `n` slices after this one, within the file.
    fn after(&self, footer: &ArrowReaderMetadata, n: usize) -> Option<Self> {
        let groups = footer.metadata().row_groups();
        let mut at = *self;
        for _ in 0..n {
            let rows = groups.get(at.group)?.num_rows();
            let next_first = at.first_row + at.slice_rows as i64;
            let group_first = at.first_row - (at.slice * at.slice_rows) as i64;
            if next_first < group_first + rows {
                at = Self {
                    slice: at.slice + 1,
                    first_row: next_first,
                    ..at
                };
            } else {
                let group = at.group + 1;
                let metadata = groups.get(group)?;
                at = Self {
                    group,
                    slice: 0,
                    slice_rows: slice_rows(metadata.total_byte_size(), metadata.num_rows()),
                    first_row: group_first + rows,
                };
            }
        }
        Some(at)
    }

    fn key(&self, path: &str) -> SliceKey {
        (path.to_owned(), self.group, self.slice)
    }

    /// The first slice of this slice's window.
    fn window_first_slice(&self) -> usize {
        self.slice - self.slice % WINDOW_SLICES
    }

    fn window_key(&self, path: &str) -> WindowKey {
        (path.to_owned(), self.group, self.slice / WINDOW_SLICES)
    }
}

/// Rows per slice of a row group of `rows` rows and `bytes` uncompressed bytes.
fn slice_rows(bytes: i64, rows: i64) -> usize {
    let rows = rows.max(1) as usize;
    let per_row = (bytes.max(1) as usize).div_ceil(rows).max(1);
    (SLICE_BYTES / per_row).clamp(1, rows)
}

fn segment_path(segment: &Segment) -> Result<&str> {
    segment.path.as_deref().ok_or_else(|| {
        Error::Data(format!(
            "segment {}..={} is not archived",
            segment.base, segment.last
        ))
    })
}

fn arrow_select_concat(batches: &[RecordBatch]) -> Result<RecordBatch> {
    let Some(first) = batches.first() else {
        return Err(Error::Data("an empty row group".to_owned()));
    };
    arrow_select::concat::concat_batches(&first.schema(), batches).map_err(|e| Error::Data(e.to_string()))
}

/// Decoded slices, least recently used out first, bounded in bytes.
struct SliceCache {
    capacity: usize,
    used: usize,
    entries: HashMap<SliceKey, (Arc<RecordBatch>, usize)>,
    order: VecDeque<SliceKey>,
}

impl SliceCache {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            used: 0,
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn contains(&self, key: &SliceKey) -> bool {
        self.entries.contains_key(key)
    }

    fn get(&mut self, key: &SliceKey) -> Option<Arc<RecordBatch>> {
        let rows = self.entries.get(key)?.0.clone();
        if let Some(at) = self.order.iter().position(|k| k == key) {
            let key = self.order.remove(at).expect("present");
            self.order.push_back(key);
        }
        Some(rows)
    }

    fn put(&mut self, key: SliceKey, rows: Arc<RecordBatch>) {
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

#[cfg(test)]
mod tests {
    use arrow_array::{ArrayRef, BinaryArray, Int64Array};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;

    fn segment(base: i64, rows: i64) -> Segment {
        Segment {
            base,
            last: base + rows - 1,
            bytes: 0,
            max_ts: 0,
            sealed_ms: 0,
            first_ts: None,
            path: Some("file.parquet".to_owned()),
            file_bytes: None,
            quarantine: None,
            skipped: None,
            lost: false,
            purge: false,
            holes: Vec::new(),
            log_bytes: None,
            compacted_ms: None,
        }
    }

    /// The footer of a file of `groups` row groups of `rows` rows, each row
    /// an offset and a `value_bytes` value.
    fn footer(groups: usize, rows: usize, value_bytes: usize) -> ArrowReaderMetadata {
        let offsets: ArrayRef = Arc::new(Int64Array::from_iter_values(0..(groups * rows) as i64));
        // Distinct values that do not compress, so the group's size is
        // about rows × value_bytes.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let values: Vec<Vec<u8>> = (0..groups * rows)
            .map(|_| {
                (0..value_bytes)
                    .map(|_| {
                        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        (state >> 56) as u8
                    })
                    .collect()
            })
            .collect();
        let values: ArrayRef = Arc::new(BinaryArray::from_iter_values(values.iter()));
        let batch = RecordBatch::try_from_iter([("offset", offsets), ("value", values)]).unwrap();
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(rows))
            .build();
        let mut file = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut file, batch.schema(), Some(properties)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        ArrowReaderMetadata::load(&Bytes::from(file), ArrowReaderOptions::new()).unwrap()
    }

    #[test]
    fn windows_read_ahead_at_once_are_a_quarter_of_the_cache_whatever_the_readers() {
        let settings = TieringSettings {
            read_cache_bytes: 64 << 20,
            ..TieringSettings::default()
        };
        let reader = RemoteReader::new(&settings, Arc::new(Metrics::default()));
        // Windows of 4 MiB: four at once in 64 MiB.
        let keys: Vec<WindowKey> = (0..10)
            .map(|i| {
                let at = Position::of(&footer(1, 1_000, 64), &segment(0, 1_000), 0).unwrap();
                at.window_key(&format!("file-{i}.parquet"))
            })
            .collect();
        let claimed: Vec<bool> = keys.iter().map(|k| reader.claim_ahead(k)).collect();
        assert_eq!(claimed.iter().filter(|c| **c).count(), 4, "{claimed:?}");
        assert!(!reader.claim_ahead(&keys[0]), "one being read ahead");
        reader.ahead.lock().unwrap().remove(&keys[0]);
        assert!(reader.claim_ahead(&keys[9]), "a place freed");
    }

    #[test]
    fn a_slice_holds_about_a_mebibyte_of_decoded_rows() {
        assert_eq!(slice_rows(64 << 20, 65_536), 1_024);
        assert_eq!(slice_rows(100, 10), 10, "a small group is one slice");
        assert_eq!(slice_rows(10 << 30, 4), 1, "at least one row");
        assert_eq!(slice_rows(0, 0), 1);
    }

    #[test]
    fn offsets_left_out_of_the_archive_shift_the_rows_after_them() {
        let segment = Segment {
            holes: vec![(105, 107), (110, 110)],
            ..segment(100, 20)
        };
        assert_eq!(row_of(&segment, 100), 0);
        assert_eq!(row_of(&segment, 104), 4);
        // A left-out offset has the row of the next kept one.
        assert_eq!(row_of(&segment, 106), 5);
        assert_eq!(row_of(&segment, 108), 5);
        assert_eq!(row_of(&segment, 111), 7);
        assert_eq!(kept(&segment, 105), 108);
        assert_eq!(kept(&segment, 110), 111);
        assert_eq!(kept(&segment, 104), 104);
    }

    #[test]
    fn positions_find_the_slice_of_an_offset_and_walk_across_row_groups() {
        // Three groups of 1,000 rows of about 4 KiB: slices of ~256 rows.
        let footer = footer(3, 1_000, 4_096);
        let segment = segment(500, 3_000);
        let first = Position::of(&footer, &segment, 500).unwrap();
        let rows = first.slice_rows;
        assert!((200..=300).contains(&rows), "{rows} rows per slice");
        assert_eq!((first.group, first.slice, first.first_row), (0, 0, 0));
        let later = Position::of(&footer, &segment, 500 + 1_000 + rows as i64 + 3).unwrap();
        assert_eq!((later.group, later.slice), (1, 1));
        assert_eq!(later.first_row, 1_000 + rows as i64);
        // Walking forward visits every slice of every group, in order.
        let mut at = first;
        let mut slices = 1;
        while let Some(next) = at.after(&footer, 1) {
            if next.group == at.group {
                assert_eq!(next.first_row, at.first_row + at.slice_rows as i64);
                assert_eq!(next.slice, at.slice + 1);
            } else {
                // A group's last slice may be short: the next group starts
                // where the group ends.
                assert_eq!((next.group, next.slice), (at.group + 1, 0));
                assert_eq!(next.first_row, 1_000 * next.group as i64);
            }
            slices += 1;
            at = next;
        }
        assert_eq!(at.group, 2);
        assert_eq!(slices, 3 * 1_000usize.div_ceil(rows));
        assert!(Position::of(&footer, &segment, 3_500).is_err(), "past the file");
    }

    /// A data file of `groups` row groups of `rows` records, each record's
    /// value `value_bytes` bytes that tell its offset, and its segment.
    fn data_file(dir: &std::path::Path, groups: usize, rows: usize, value_bytes: usize) -> Segment {
        let schema = Arc::new(iceberg::arrow::schema_to_arrow_schema(&table::schema()).unwrap());
        let records = groups * rows;
        let mut table = crate::table::Rows::new(schema.clone(), 0).unwrap();
        for offset in 0..records {
            let mut batch = ketch_storage::batch::BatchBuilder::new(offset as i64);
            batch.push(
                1_000 + offset as i64,
                Some(b"k"),
                Some(&value(offset, value_bytes)),
                std::iter::empty(),
            );
            table.add_batch(&batch.finish()).unwrap();
        }
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(rows))
            .build();
        let path = dir.join("segment.parquet");
        let file = std::fs::File::create(&path).unwrap();
        let mut writer = ArrowWriter::try_new(file, schema, Some(properties)).unwrap();
        writer.write(&table.finish().unwrap()).unwrap();
        writer.close().unwrap();
        Segment {
            path: Some(format!("file://{}", path.display())),
            ..segment(0, records as i64)
        }
    }

    fn value(offset: usize, bytes: usize) -> Vec<u8> {
        let mut value = vec![(offset % 251) as u8; bytes];
        value[..8].copy_from_slice(&(offset as u64).to_be_bytes());
        value
    }

    /// The offsets and values of the records in rebuilt batches.
    fn records_of(batches: &[Bytes]) -> Vec<(i64, Vec<u8>)> {
        let mut records = Vec::new();
        for batch in batches {
            let base = i64::from_be_bytes(batch[0..8].try_into().unwrap());
            let mut reader = ketch_storage::batch::Records::of_batch(batch).unwrap();
            while let Some(record) = reader.next_record().unwrap() {
                records.push((
                    base + i64::from(record.offset_delta),
                    record.value.unwrap().to_vec(),
                ));
            }
        }
        records
    }

    #[tokio::test]
    async fn reads_from_any_offset_return_the_records_from_there_on_across_windows_and_row_groups() {
        // Two groups of 1,200 records of 8 KiB: slices of about 128 rows, ten
        // a group, in windows of four, the last window of a group short.
        let dir = tempfile::tempdir().unwrap();
        let (groups, rows, value_bytes) = (2, 1_200, 8 * 1024);
        let segment = data_file(dir.path(), groups, rows, value_bytes);
        let metrics = Arc::new(Metrics::default());
        let reader = Arc::new(RemoteReader::new(&TieringSettings::default(), metrics.clone()));
        let footer = reader
            .footer(&segment, segment_path(&segment).unwrap())
            .await
            .unwrap();
        let slice_rows = Position::of(&footer, &segment, 0).unwrap().slice_rows;
        assert!((100..=140).contains(&slice_rows), "{slice_rows} rows a slice");
        let slices = 2 * rows.div_ceil(slice_rows);

        for start in [
            0,
            1,
            slice_rows as i64 * 4 - 1,
            slice_rows as i64 * 4,
            1_199,
            1_200,
            2_000,
        ] {
            let mut offset = start;
            let mut read = Vec::new();
            while offset <= segment.last {
                let got = reader.read(&segment, offset, 300 * 1024).await.unwrap();
                let records = records_of(&got.batches);
                assert!(!records.is_empty(), "a read from {offset} returned nothing");
                offset = records.last().unwrap().0 + 1;
                read.extend(records);
            }
            let expected: Vec<(i64, Vec<u8>)> = (start as usize..groups * rows)
                .map(|offset| (offset as i64, value(offset, value_bytes)))
                .collect();
            assert!(read == expected, "reading from {start}: offsets or values differ");
        }
        // Read from the start first, every slice was read once (a window a
        // read, the read-ahead included); the cache held them for the rest.
        let (hits, misses) = metrics.remote_cache();
        assert_eq!(misses, slices as u64, "slices read from the file");
        assert!(hits > 0);
    }

    #[test]
    fn batches_of_the_slice_size_are_the_slices_and_others_are_cut_into_them() {
        let batch = |from: i64, rows: i64| {
            let offsets: ArrayRef = Arc::new(Int64Array::from_iter_values(from..from + rows));
            RecordBatch::try_from_iter([("offset", offsets)]).unwrap()
        };
        let firsts = |slices: &[Arc<RecordBatch>]| -> Vec<(i64, usize)> {
            slices
                .iter()
                .map(|s| {
                    let offsets = s.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                    (offsets.value(0), s.num_rows())
                })
                .collect()
        };
        let aligned = into_slices(vec![batch(0, 10), batch(10, 10), batch(20, 3)], 10).unwrap();
        assert_eq!(firsts(&aligned), [(0, 10), (10, 10), (20, 3)]);
        let uneven = into_slices(vec![batch(0, 7), batch(7, 9), batch(16, 0), batch(16, 8)], 10).unwrap();
        assert_eq!(firsts(&uneven), [(0, 10), (10, 10), (20, 4)]);
        assert!(into_slices(Vec::new(), 10).unwrap().is_empty());
    }
}
