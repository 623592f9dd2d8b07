//! ketch-bench: a benchmark client for any Kafka-compatible broker (ketch,
//! Apache Kafka, Redpanda), built on rdkafka, plus the direct-Redis XADD
//! baseline ketch is measured against. See `ketch-bench --help`.

mod args;
mod consumer;
mod envelope;
mod kafka;
mod payload;
mod producer;
mod redis_baseline;
mod report;
mod roundtrip;
mod sysstat;
mod workload;

use std::process::ExitCode;
use std::sync::{Mutex, MutexGuard};

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "ketch-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Produce records and report throughput and send-to-ack latency.
    Producer(producer::ProducerCmd),
    /// Consume records and report throughput.
    Consumer(consumer::ConsumerCmd),
    /// Produce and consume together; check every acknowledged record arrives intact.
    Roundtrip(roundtrip::RoundtripCmd),
    /// The direct-Redis baseline: one pipelined XADD per record into a stream.
    RedisXadd(redis_baseline::RedisXaddCmd),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match &cli.command {
        Command::Producer(cmd) => producer::run(cmd),
        Command::Consumer(cmd) => consumer::run(cmd),
        Command::Roundtrip(cmd) => roundtrip::run(cmd),
        Command::RedisXadd(cmd) => redis_baseline::run(cmd),
    };
    match outcome {
        Ok(failures) if failures.is_empty() => ExitCode::SUCCESS,
        Ok(failures) => {
            failures.iter().for_each(|failure| eprintln!("FAILED: {failure}"));
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Locks a mutex shared with a worker thread; a panicked worker is reported
/// when it is joined, so its poisoned figures are still readable here.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
