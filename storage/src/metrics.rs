//! Redis command metrics: how long commands take and how many fail, by
//! command (the first command of a pipeline names it). Recorded with the
//! `metrics` crate; the gateway binary installs the recorder.

use std::time::Instant;

use metrics::{Counter, Histogram, Unit, describe_counter, describe_histogram};

/// The commands ketch sends, as labels; anything else is `OTHER`.
const COMMANDS: &[&str] = &[
    "EVALSHA",
    "EVAL",
    "XRANGE",
    "XREVRANGE",
    "XADD",
    "XLEN",
    "XTRIM",
    "XINFO",
    "HGET",
    "HSET",
    "HSETNX",
    "HDEL",
    "HGETALL",
    "HMGET",
    "HINCRBY",
    "GET",
    "SET",
    "DEL",
    "UNLINK",
    "EXISTS",
    "EXPIRE",
    "PEXPIRE",
    "PERSIST",
    "INCR",
    "INCRBY",
    "SADD",
    "SREM",
    "SMEMBERS",
    "ZADD",
    "ZRANGE",
    "ZRANGEBYSCORE",
    "ZREM",
    "ZCARD",
    "MULTI",
    "WAIT",
    "PING",
    "TIME",
    "INFO",
    "SCRIPT",
    "CLUSTER",
    "PUBLISH",
    "SPUBLISH",
    "SUBSCRIBE",
    "SSUBSCRIBE",
    "SCAN",
    "MEMORY",
    "RENAME",
    "TYPE",
    "CLIENT",
    "AUTH",
    "SELECT",
    "HELLO",
];

/// Describes this crate's metrics to the installed recorder.
pub fn describe_metrics() {
    describe_histogram!(
        "ketch_redis_command_duration_seconds",
        Unit::Seconds,
        "Redis round trips, by command (a pipeline's first command), from sending to the reply."
    );
    describe_counter!(
        "ketch_redis_cluster_reconnects_total",
        "Times the cluster connection was replaced: commands timed out, the slot map had changed and the masters that took slots answered (its own map was stale)."
    );
    describe_counter!(
        "ketch_wake_subscription_losses_total",
        "Wake-up subscriptions lost, by how: push (Redis dropped one: its slot moved), connection (a subscriber connection that was up was lost, with all it held: counted once), audit (found gone by the cluster subscriber's audit, with no push)."
    );
    describe_counter!(
        "ketch_wake_subscription_audits_total",
        "Audits of the cluster subscriber's wake-up subscriptions (PUBSUB SHARDNUMSUB of its presence channels) that completed."
    );
    describe_counter!(
        "ketch_wake_subscription_reconnects_total",
        "Times the cluster subscriber replaced its connection: a subscription timed out, the slot map had changed and the masters that took slots answered (its own map was stale)."
    );
    describe_counter!(
        "ketch_redis_errors_total",
        "Redis commands that failed, by kind: oom (maxmemory reached), io (connection), timeout, reply (any other error reply)."
    );
}

/// Counts a cluster connection replaced because its slot map went stale.
pub(crate) fn replaced_connection() {
    metrics::counter!("ketch_redis_cluster_reconnects_total").increment(1);
}

/// The label of a command named `name` (any case).
pub(crate) fn command_label(name: &[u8]) -> &'static str {
    COMMANDS
        .iter()
        .find(|c| c.as_bytes().eq_ignore_ascii_case(name))
        .copied()
        .unwrap_or("OTHER")
}

/// The kind label of a failure.
pub(crate) fn error_kind(e: &redis::RedisError) -> &'static str {
    if e.code() == Some("OOM") {
        "oom"
    } else if e.is_timeout() {
        "timeout"
    } else if e.is_io_error() {
        "io"
    } else {
        "reply"
    }
}

/// Records one command's time and its failure, if any.
pub(crate) fn observe(command: &'static str, started: Instant, error: Option<&'static str>) {
    metrics::histogram!("ketch_redis_command_duration_seconds", "command" => command)
        .record(started.elapsed().as_secs_f64());
    if let Some(kind) = error {
        failed(kind);
    }
}

pub(crate) fn failed(kind: &'static str) {
    metrics::counter!("ketch_redis_errors_total", "kind" => kind).increment(1);
}

/// Handles for the data path's commands, taken once per connection (the
/// data path records without a registry lookup).
pub(crate) struct Timers {
    timers: Vec<(&'static str, Histogram)>,
    errors: Counter,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            timers: ["EVALSHA", "XRANGE", "OTHER"]
                .into_iter()
                .map(|c| {
                    (
                        c,
                        metrics::histogram!("ketch_redis_command_duration_seconds", "command" => c),
                    )
                })
                .collect(),
            errors: metrics::counter!("ketch_redis_errors_total", "kind" => "io"),
        }
    }
}

impl Timers {
    pub(crate) fn record(&self, command: &'static str, started: Instant) {
        let elapsed = started.elapsed().as_secs_f64();
        match self.timers.iter().find(|(c, _)| *c == command) {
            Some((_, h)) => h.record(elapsed),
            None => observe(command, started, None),
        }
    }

    /// A request the connection could not complete.
    pub(crate) fn failed(&self) {
        self.errors.increment(1);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn commands_are_labelled_in_capitals_and_unknown_ones_as_other() {
        assert_eq!(super::command_label(b"evalsha"), "EVALSHA");
        assert_eq!(super::command_label(b"XRANGE"), "XRANGE");
        assert_eq!(super::command_label(b"FLUSHALL"), "OTHER");
    }
}
