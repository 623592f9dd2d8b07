//! What the servers spent during a run: CPU time and peak RSS of given
//! processes from /proc (proc(5): `stat` fields 14 and 15, `status` VmHWM),
//! and Redis memory from `INFO memory` (used_memory).

use std::process::Command;

use anyhow::{Context, bail};
use serde::Serialize;

/// CPU time of server processes (or of this client itself), sampled at the
/// start of a run.
pub struct ServerWatch {
    start_ticks: Vec<(u32, u64)>,
    ticks_per_second: f64,
}

#[derive(Serialize, Debug)]
pub struct ServerUsage {
    pub processes: Vec<ProcessUsage>,
    pub total_cpu_s: f64,
    pub cpu_us_per_record: Option<f64>,
}

#[derive(Serialize, Debug)]
pub struct ProcessUsage {
    pub pid: u32,
    pub name: String,
    pub cpu_s: f64,
    /// VmHWM: the peak since the process started, not only during this run.
    pub peak_rss_mib: f64,
}

impl ServerWatch {
    pub fn start(pids: &[u32]) -> anyhow::Result<Self> {
        let start_ticks = pids
            .iter()
            .map(|&pid| Ok((pid, cpu_ticks(pid)?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(ServerWatch {
            start_ticks,
            ticks_per_second: clock_ticks_per_second(),
        })
    }

    pub fn finish(&self, records: u64) -> anyhow::Result<ServerUsage> {
        let mut processes = Vec::new();
        for &(pid, start) in &self.start_ticks {
            let spent = cpu_ticks(pid)?.saturating_sub(start);
            processes.push(ProcessUsage {
                pid,
                name: process_name(pid)?,
                cpu_s: spent as f64 / self.ticks_per_second,
                peak_rss_mib: peak_rss_kib(pid)? as f64 / 1024.0,
            });
        }
        let total_cpu_s = processes.iter().map(|p| p.cpu_s).sum::<f64>();
        let cpu_us_per_record = (records > 0).then(|| total_cpu_s * 1e6 / records as f64);
        Ok(ServerUsage {
            processes,
            total_cpu_s,
            cpu_us_per_record,
        })
    }
}

fn clock_ticks_per_second() -> f64 {
    let output = Command::new("getconf").arg("CLK_TCK").output();
    output
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

fn read_proc(pid: u32, file: &str) -> anyhow::Result<String> {
    let path = format!("/proc/{pid}/{file}");
    std::fs::read_to_string(&path).with_context(|| format!("reading {path} (is process {pid} running?)"))
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    parse_cpu_ticks(&read_proc(pid, "stat")?).with_context(|| format!("parsing /proc/{pid}/stat"))
}

/// The name can hold spaces and parentheses, so fields are counted after its last `)`.
fn parse_cpu_ticks(stat: &str) -> anyhow::Result<u64> {
    let after_name = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .context("no `)` after the name")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Field 3 (state) is fields[0], so utime (14) and stime (15) are 11 and 12.
    let tick = |i: usize| -> anyhow::Result<u64> { Ok(fields.get(i).context("stat too short")?.parse()?) };
    Ok(tick(11)? + tick(12)?)
}

fn process_name(pid: u32) -> anyhow::Result<String> {
    Ok(read_proc(pid, "comm")?.trim().to_owned())
}

fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    parse_status_kib(&read_proc(pid, "status")?, "VmHWM:").with_context(|| format!("VmHWM of {pid}"))
}

fn parse_status_kib(status: &str, key: &str) -> anyhow::Result<u64> {
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .with_context(|| format!("no {key} line"))?;
    let value = line[key.len()..].trim().trim_end_matches("kB").trim();
    Ok(value.parse()?)
}

/// Redis `used_memory`, sampled at the start of a run.
pub struct RedisMemoryWatch {
    client: redis::Client,
    start_bytes: u64,
}

#[derive(Serialize, Debug)]
pub struct RedisMemoryUsage {
    pub used_memory_start: u64,
    pub used_memory_end: u64,
    pub delta_bytes: i64,
    pub bytes_per_record: Option<f64>,
}

impl RedisMemoryWatch {
    pub fn start(url: &str) -> anyhow::Result<Self> {
        let client = redis::Client::open(url).with_context(|| format!("redis URL {url}"))?;
        let start_bytes = used_memory(&client)?;
        Ok(RedisMemoryWatch { client, start_bytes })
    }

    pub fn finish(&self, records: u64) -> anyhow::Result<RedisMemoryUsage> {
        let end = used_memory(&self.client)?;
        let delta_bytes = end as i64 - self.start_bytes as i64;
        Ok(RedisMemoryUsage {
            used_memory_start: self.start_bytes,
            used_memory_end: end,
            delta_bytes,
            bytes_per_record: (records > 0).then(|| delta_bytes as f64 / records as f64),
        })
    }
}

fn used_memory(client: &redis::Client) -> anyhow::Result<u64> {
    let mut connection = client.get_connection().context("connecting for INFO memory")?;
    let info: String = redis::cmd("INFO").arg("memory").query(&mut connection)?;
    parse_used_memory(&info)
}

fn parse_used_memory(info: &str) -> anyhow::Result<u64> {
    for line in info.lines() {
        if let Some(value) = line.trim().strip_prefix("used_memory:") {
            return Ok(value.parse()?);
        }
    }
    bail!("INFO memory has no used_memory line")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_count_fields_after_a_name_with_spaces() {
        let stat = "42 (ketch (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 37 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_cpu_ticks(stat).unwrap(), 287);
    }

    #[test]
    fn vm_hwm_is_read_in_kib() {
        let status = "Name:\tketch\nVmPeak:\t  9000 kB\nVmHWM:\t   51200 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM:").unwrap(), 51200);
    }

    #[test]
    fn used_memory_is_not_confused_with_its_siblings() {
        let info = "# Memory\r\nused_memory_human:1.2M\r\nused_memory:1234567\r\nused_memory_rss:9\r\n";
        assert_eq!(parse_used_memory(info).unwrap(), 1_234_567);
    }

    #[test]
    fn our_own_process_can_be_watched() {
        let watch = ServerWatch::start(&[std::process::id()]).unwrap();
        let usage = watch.finish(10).unwrap();
        assert_eq!(usage.processes.len(), 1);
        assert!(usage.processes[0].peak_rss_mib > 0.0);
    }
}
