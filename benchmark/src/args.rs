//! Command-line option groups shared by the subcommands, and the parsers for
//! their values: sizes (`1KB`), durations (`30s`), rates (`unlimited`) and
//! Java-properties files (`--command-config`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{ArgAction, Args, ValueEnum};

use crate::payload::{DEFAULT_SEED, PayloadKind};
use crate::workload::Workload;

/// Options every subcommand takes: output, result file, server observation.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Format of the result on stdout.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Also write the final JSON result here (atomically: PATH.tmp, then rename).
    #[arg(long)]
    pub result_file: Option<PathBuf>,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// A server process whose CPU time and peak RSS (from /proc) are reported; repeatable.
    #[arg(long = "server-pid")]
    pub server_pids: Vec<u32>,
    /// A Redis URL whose `INFO memory` used_memory is read at start and end.
    #[arg(long)]
    pub redis_info: Option<String>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// A readable aligned table.
    Table,
    /// One final JSON object.
    Json,
    /// One JSON interval record a second, then the final one.
    Jsonl,
}

/// Where the Kafka-compatible broker is and which topic to use.
#[derive(Args, Debug, Clone)]
pub struct KafkaArgs {
    /// Any Kafka-compatible broker: ketch, Apache Kafka, Redpanda.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap_server: String,
    /// Topic [default: bench-<workload>, or bench without a workload].
    #[arg(long)]
    pub topic: Option<String>,
    /// An OpenMessaging Benchmark preset; it fills partitions, record size and
    /// producer count unless given explicitly. OMB runs these at 50,000 msg/s;
    /// here the rate stays unlimited unless --rate is given.
    #[arg(long, value_enum)]
    pub workload: Option<Workload>,
    /// Create the topic first (replication factor 1; an existing topic is fine).
    #[arg(long)]
    pub create_topic: bool,
    /// Partitions for --create-topic [default: the workload's, else 1].
    #[arg(long)]
    pub partitions: Option<i32>,
    /// A Java-properties file of client settings, applied after all others.
    #[arg(long, value_parser = read_properties)]
    pub command_config: Option<Properties>,
}

/// How records are produced.
#[derive(Args, Debug, Clone)]
pub struct ProduceArgs {
    /// Independent producer instances, each on its own thread [default: the workload's, else 1].
    #[arg(long)]
    pub clients: Option<usize>,
    /// Records to send in total, split among clients.
    #[arg(long, conflicts_with = "duration")]
    pub records: Option<u64>,
    /// How long to send (e.g. 30s, 500ms, 2m) [default: 30s when --records is absent].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Bytes per record value: 100B, 1KB (=1024), 1MB [default: the workload's, else 1KB].
    #[arg(long, value_parser = parse_size)]
    pub record_size: Option<usize>,
    /// Value bytes: zeros, slices of a seeded random pool (so compression is
    /// honest), or of seeded text-like words (compressible, 3-4x).
    /// Values of 38 bytes or more start with an envelope (see `consumer --validate`).
    #[arg(long, value_enum, default_value_t = PayloadKind::Random)]
    pub payload: PayloadKind,
    /// Seed of the random payload pool.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Total records per second across clients, or `unlimited`.
    #[arg(long, value_parser = parse_rate, default_value = "unlimited")]
    pub rate: Rate,
    /// acks: 0, 1 or all.
    #[arg(long, value_enum, default_value_t = Acks::All)]
    pub acks: Acks,
    /// compression.type.
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub compression: Compression,
    /// linger.ms [default: the client's].
    #[arg(long)]
    pub linger_ms: Option<u32>,
    /// batch.size in bytes, e.g. 1MB [default: the client's].
    #[arg(long, value_parser = parse_size)]
    pub batch_size: Option<usize>,
    /// enable.idempotence.
    #[arg(long, action = ArgAction::Set, default_value_t = false)]
    pub idempotence: bool,
}

/// Records per second, `None` for as fast as the broker takes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate(pub Option<f64>);

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acks {
    #[value(name = "0")]
    None,
    #[value(name = "1")]
    Leader,
    All,
}

impl Acks {
    pub fn as_config(self) -> &'static str {
        match self {
            Acks::None => "0",
            Acks::Leader => "1",
            Acks::All => "all",
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    pub fn as_config(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

/// `key=value` pairs from a properties file, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Properties(pub Vec<(String, String)>);

/// Parses a byte size: a number with an optional B, KB, MB or GB suffix (powers of 1024).
pub fn parse_size(text: &str) -> anyhow::Result<usize> {
    let upper = text.trim().to_ascii_uppercase();
    let digits_end = upper.find(|c: char| !c.is_ascii_digit()).unwrap_or(upper.len());
    let (number, unit) = upper.split_at(digits_end);
    let number: usize = number
        .parse()
        .with_context(|| format!("`{text}` is not a size like 1KB"))?;
    let scale: usize = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        other => bail!("unknown size unit `{other}` in `{text}` (use B, KB, MB or GB)"),
    };
    number
        .checked_mul(scale)
        .with_context(|| format!("size `{text}` is too large"))
}

/// Parses a duration: a number with an ms, s or m suffix; a bare number is seconds.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: f64 = number
        .parse()
        .with_context(|| format!("`{text}` is not a duration like 30s"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        other => bail!("unknown duration unit `{other}` in `{text}` (use ms, s or m)"),
    };
    Duration::try_from_secs_f64(seconds).with_context(|| format!("duration `{text}` is out of range"))
}

/// Parses `unlimited` or a positive number of records per second.
pub fn parse_rate(text: &str) -> anyhow::Result<Rate> {
    if text.eq_ignore_ascii_case("unlimited") {
        return Ok(Rate(None));
    }
    let rate: f64 = text
        .parse()
        .with_context(|| format!("`{text}` is not a rate (N or unlimited)"))?;
    if !(rate.is_finite() && rate > 0.0) {
        bail!("rate must be positive, got `{text}`");
    }
    Ok(Rate(Some(rate)))
}

/// Parses Java-properties text: `key=value` (or `key: value`) lines, `#`/`!` comments.
pub fn parse_properties(text: &str) -> anyhow::Result<Properties> {
    let mut pairs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let Some((key, value)) = line.split_once(['=', ':']) else {
            bail!("line {}: `{line}` is not key=value", number + 1);
        };
        pairs.push((key.trim().to_owned(), value.trim().to_owned()));
    }
    Ok(Properties(pairs))
}

fn read_properties(path: &str) -> anyhow::Result<Properties> {
    let text = std::fs::read_to_string(Path::new(path)).with_context(|| format!("reading {path}"))?;
    parse_properties(&text).with_context(|| format!("in {path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(parse_size("1KB").unwrap(), 1024);
        assert_eq!(parse_size("100B").unwrap(), 100);
        assert_eq!(parse_size("1MB").unwrap(), 1 << 20);
        assert_eq!(parse_size("2gb").unwrap(), 2 << 30);
        assert_eq!(parse_size("512").unwrap(), 512);
    }

    #[test]
    fn sizes_reject_unknown_units_and_garbage() {
        assert!(parse_size("1TB").is_err());
        assert!(parse_size("KB").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn durations_accept_ms_s_and_m() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("5").unwrap(), Duration::from_secs(5));
        assert!(parse_duration("3h").is_err());
    }

    #[test]
    fn rates_are_positive_or_unlimited() {
        assert_eq!(parse_rate("unlimited").unwrap(), Rate(None));
        assert_eq!(parse_rate("2000").unwrap(), Rate(Some(2000.0)));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
    }

    #[test]
    fn properties_skip_comments_and_keep_order() {
        let text = "# settings\nfetch.max.bytes = 1048576\n\n! old style\nclient.id:bench\nsasl=a=b\n";
        let Properties(pairs) = parse_properties(text).unwrap();
        assert_eq!(
            pairs,
            [
                ("fetch.max.bytes", "1048576"),
                ("client.id", "bench"),
                ("sasl", "a=b")
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn properties_reject_lines_without_a_separator() {
        assert!(parse_properties("just-a-key\n").is_err());
    }
}
