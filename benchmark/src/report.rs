//! Turning a run into figures: latency summaries from HDR histograms,
//! throughput, the live progress line, and the final result as a table, one
//! JSON object, or JSON lines, optionally written atomically to a file.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Value, json};

use crate::args::{CommonArgs, OutputFormat};
use crate::sysstat::{RedisMemoryWatch, ServerWatch};

/// How often the progress line and JSONL interval records appear.
const TICK: Duration = Duration::from_secs(1);

/// A histogram of microseconds, from 1 µs to one hour, 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Microseconds from `earlier` to `later` nanosecond stamps, at least 1.
pub fn micros_between(earlier_ns: u64, later_ns: u64) -> u64 {
    (later_ns.saturating_sub(earlier_ns) / 1000).max(1)
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p99_9_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl LatencySummary {
    pub fn of(micros: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        LatencySummary {
            count: micros.len(),
            p50_ms: ms(micros.value_at_quantile(0.50)),
            p95_ms: ms(micros.value_at_quantile(0.95)),
            p99_ms: ms(micros.value_at_quantile(0.99)),
            p99_9_ms: ms(micros.value_at_quantile(0.999)),
            max_ms: ms(micros.max()),
            mean_ms: micros.mean() / 1000.0,
        }
    }
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Throughput {
    pub records: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub records_per_s: f64,
    pub mib_per_s: f64,
}

impl Throughput {
    pub fn new(records: u64, bytes: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        let per_second = |n: f64| if seconds > 0.0 { n / seconds } else { 0.0 };
        Throughput {
            records,
            bytes,
            seconds,
            records_per_s: per_second(records as f64),
            mib_per_s: per_second(bytes as f64 / (1 << 20) as f64),
        }
    }
}

/// Counts so far, for the progress line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub records: u64,
    pub bytes: u64,
    pub p99_us: Option<u64>,
}

/// Prints a progress line on stderr and JSONL interval records on stdout once a second.
pub struct Progress {
    start: Instant,
    last_tick: Instant,
    last: Sample,
    quiet: bool,
    jsonl: bool,
    terminal: bool,
}

impl Progress {
    fn new(common: &CommonArgs, start: Instant) -> Self {
        Progress {
            start,
            last_tick: start,
            last: Sample::default(),
            quiet: common.quiet,
            jsonl: common.output == OutputFormat::Jsonl,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// Waits until `finished` says so, ticking once a second with a fresh `sample`.
    pub fn watch(&mut self, mut finished: impl FnMut() -> bool, mut sample: impl FnMut() -> Sample) {
        while !finished() {
            std::thread::sleep(Duration::from_millis(50));
            if self.last_tick.elapsed() >= TICK {
                self.tick(sample());
            }
        }
        if self.terminal && !self.quiet {
            eprintln!();
        }
    }

    fn tick(&mut self, now: Sample) {
        let interval = self.last_tick.elapsed();
        let rate = Throughput::new(
            now.records - self.last.records,
            now.bytes - self.last.bytes,
            interval,
        );
        let elapsed = self.start.elapsed().as_secs_f64();
        let p99_ms = now.p99_us.map(|us| us as f64 / 1000.0);
        if self.jsonl {
            let record = json!({
                "type": "interval", "elapsed_s": elapsed, "records": now.records,
                "records_per_s": rate.records_per_s, "mib_per_s": rate.mib_per_s, "p99_ms": p99_ms,
            });
            println!("{record}");
        }
        if !self.quiet {
            let p99 = p99_ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.2} ms"));
            let line = format!(
                "{elapsed:7.1}s  {:>12} records  {:>11.0} rec/s  {:>8.2} MiB/s  p99 {p99}",
                now.records, rate.records_per_s, rate.mib_per_s
            );
            if self.terminal {
                eprint!("\r{line:<90}");
            } else {
                eprintln!("{line}");
            }
        }
        self.last = now;
        self.last_tick = Instant::now();
    }
}

/// One run from the moment load starts: its clock, progress and server watches.
pub struct Session {
    command: &'static str,
    common: CommonArgs,
    started_at: SystemTime,
    start: Instant,
    servers: Option<ServerWatch>,
    redis_memory: Option<RedisMemoryWatch>,
    /// This process (all its threads, librdkafka's too), so a run shows
    /// when the load generator, not the server, took the cores.
    client: ServerWatch,
    pub progress: Progress,
}

impl Session {
    pub fn begin(command: &'static str, common: &CommonArgs) -> anyhow::Result<Self> {
        let servers = (!common.server_pids.is_empty()).then(|| ServerWatch::start(&common.server_pids));
        let redis_memory = common.redis_info.as_deref().map(RedisMemoryWatch::start);
        let start = Instant::now();
        Ok(Session {
            command,
            common: common.clone(),
            started_at: SystemTime::now(),
            start,
            servers: servers.transpose()?,
            redis_memory: redis_memory.transpose()?,
            client: ServerWatch::start(&[std::process::id()])?,
            progress: Progress::new(common, start),
        })
    }

    pub fn start(&self) -> Instant {
        self.start
    }

    /// Nanoseconds since the UNIX epoch at [`Session::start`].
    pub fn start_epoch_ns(&self) -> u64 {
        epoch_ns(self.started_at)
    }

    /// Assembles the result object and prints and writes it as asked.
    pub fn finish(self, params: impl Serialize, figures: impl Serialize, records: u64) -> anyhow::Result<()> {
        let result = json!({
            "type": "result",
            "tool": "ketch-bench",
            "version": env!("CARGO_PKG_VERSION"),
            "command": self.command,
            "start_time": rfc3339(self.started_at),
            "duration_s": self.start.elapsed().as_secs_f64(),
            "host": host(),
            "params": params,
            "results": figures,
            "server": self.servers.map(|s| s.finish(records)).transpose()?,
            "redis_memory": self.redis_memory.map(|r| r.finish(records)).transpose()?,
            "client": { "cpu_s": self.client.finish(records)?.total_cpu_s },
        });
        emit(&self.common, &result)
    }
}

fn emit(common: &CommonArgs, result: &Value) -> anyhow::Result<()> {
    match common.output {
        OutputFormat::Table => print!("{}", render_table(result)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(result)?),
        OutputFormat::Jsonl => println!("{result}"),
    }
    std::io::stdout().flush()?;
    if let Some(path) = &common.result_file {
        write_atomically(path, &serde_json::to_vec_pretty(result)?)?;
    }
    Ok(())
}

/// Writes `PATH.tmp` and renames it over `PATH`, so readers never see half a file.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", Path::new(&tmp).display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))
}

/// Top-level scalars as rows; each object as a section of `dotted.key  value` rows.
fn render_table(result: &Value) -> String {
    let mut sections: Vec<(String, Vec<(String, String)>)> = vec![("run".to_owned(), Vec::new())];
    for (key, value) in result.as_object().into_iter().flatten() {
        match value {
            Value::Object(_) => {
                let mut rows = Vec::new();
                flatten(value, "", &mut rows);
                sections.push((key.clone(), rows));
            }
            Value::Null => {}
            scalar => sections[0].1.push((key.clone(), scalar_text(scalar))),
        }
    }
    let width = sections
        .iter()
        .flat_map(|(_, rows)| rows)
        .map(|(k, _)| k.len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (title, rows) in sections {
        let _ = writeln!(out, "{title}");
        for (key, value) in rows {
            let _ = writeln!(out, "  {key:<width$}  {value}");
        }
    }
    out
}

fn flatten(value: &Value, prefix: &str, rows: &mut Vec<(String, String)>) {
    let join = |key: &str| {
        if prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{prefix}.{key}")
        }
    };
    match value {
        Value::Object(map) => map.iter().for_each(|(key, v)| flatten(v, &join(key), rows)),
        Value::Array(items) => {
            items
                .iter()
                .enumerate()
                .for_each(|(i, v)| flatten(v, &join(&i.to_string()), rows));
        }
        scalar => rows.push((prefix.to_owned(), scalar_text(scalar))),
    }
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Number(n) if n.is_f64() => format!("{:.3}", n.as_f64().unwrap_or_default()),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

fn host() -> Value {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    json!({ "hostname": hostname.trim(), "nproc": nproc })
}

/// Nanoseconds since the UNIX epoch.
pub fn epoch_ns(at: SystemTime) -> u64 {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

/// `YYYY-MM-DDTHH:MM:SSZ`, by the civil-from-days algorithm of Howard Hinnant.
fn rfc3339(at: SystemTime) -> String {
    let seconds = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let (days, secs_of_day) = ((seconds / 86_400) as i64, seconds % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_histogram_in_ms() {
        let mut micros = latency_histogram();
        for us in 1..=1000 {
            micros.record(us * 10).unwrap();
        }
        let summary = LatencySummary::of(&micros);
        assert_eq!(summary.count, 1000);
        assert!((summary.p50_ms - 5.0).abs() < 0.01, "{summary:?}");
        assert!((summary.p99_ms - 9.9).abs() < 0.01, "{summary:?}");
        assert!((summary.max_ms - 10.0).abs() < 0.01, "{summary:?}");
    }

    #[test]
    fn throughput_is_per_second_and_in_mib() {
        let t = Throughput::new(2048, 2 << 20, Duration::from_secs(2));
        assert_eq!((t.records_per_s, t.mib_per_s), (1024.0, 1.0));
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let leap_day = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3661);
        assert_eq!(rfc3339(leap_day), "2000-02-29T01:01:01Z");
    }

    #[test]
    fn table_lists_sections_with_dotted_keys() {
        let table = render_table(&json!({"command": "producer", "results": {"latency": {"p99_ms": 1.5}}}));
        assert_eq!(
            table,
            "run\n  command         producer\nresults\n  latency.p99_ms  1.500\n"
        );
    }

    #[test]
    fn result_files_are_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("ketch-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("result.json");
        write_atomically(&path, b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        assert!(!dir.join("result.json.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
