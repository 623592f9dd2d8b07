//! DescribeLogDirs (API key 35, versions 1–4): where the partitions this
//! gateway leads are stored, as two "log directories":
//!
//! - the Redis (its URL, or a cluster's seed list, without credentials):
//!   each partition's size is the memory its log stream takes there
//!   (`MEMORY USAGE`); total and usable bytes are the servers' `maxmemory`
//!   and what `used_memory` leaves of it, -1 (unknown) without a limit;
//! - the Iceberg archive (the warehouse URI): the partitions of topics
//!   with `remote.storage.enable`, each sized by the data files of its
//!   archived segments still within retention (from the segment records in
//!   Redis; rows the archive keeps past retention are no longer part of the
//!   partition). Its volume's size is unknown (-1).
//!
//! A partition is listed by the gateway Metadata names its leader, so
//! summing over brokers, as tools do, counts each once (behind a load
//! balancer, the one broker clients see lists them all). Spec: KIP-113,
//! KIP-827 (total and usable bytes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse, RequestHeader, TopicName};
use ketch_config::{RedisSettings, TieringSettings};
use ketch_storage::{StorageError, Topic};

use super::metadata::leader_id;
use super::{Client, cluster_authorized, error_code, str_bytes};
use crate::Context;
use crate::auth::acl::Operation;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    req: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    let response = DescribeLogDirsResponse::default();
    if !cluster_authorized(ctx, client, Operation::Describe) {
        return response.with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    let redis = redis_log_dir(&ctx.settings.redis);
    let archive = archive_log_dir(&ctx.settings.tiering);
    let partitions = match led_here(ctx, client, req.topics).await {
        Ok(partitions) => partitions,
        Err(e) => {
            let code = error_code(&e);
            return response.with_results(vec![failed(redis, code), failed(archive, code)]);
        }
    };
    let archived: Vec<(Arc<Topic>, Vec<i32>)> = partitions
        .iter()
        .filter(|(topic, _)| topic.config("remote.storage.enable") == Some("true"))
        .cloned()
        .collect();
    let redis_dir = match sizes(ctx, Dir::Redis, &partitions).await {
        Ok(topics) => {
            let (total, usable) = redis_volume(ctx).await;
            DescribeLogDirsResult::default()
                .with_log_dir(str_bytes(redis))
                .with_topics(topics)
                .with_total_bytes(total)
                .with_usable_bytes(usable)
        }
        Err(e) => failed(redis, error_code(&e)),
    };
    let archive_dir = match sizes(ctx, Dir::Archive, &archived).await {
        Ok(topics) => DescribeLogDirsResult::default()
            .with_log_dir(str_bytes(archive))
            .with_topics(topics),
        Err(e) => failed(archive, error_code(&e)),
    };
    response.with_results(vec![redis_dir, archive_dir])
}

/// The Redis "log directory": its URL (a cluster's seeds, comma-separated)
/// without user, password or query.
pub(crate) fn redis_log_dir(settings: &RedisSettings) -> String {
    settings
        .url
        .split(',')
        .map(str::trim)
        .filter(|seed| !seed.is_empty())
        .map(without_credentials)
        .collect::<Vec<_>>()
        .join(",")
}

/// The archive's "log directory": the warehouse URI (`file:///…` or
/// `s3://bucket/prefix`), without credentials.
pub(crate) fn archive_log_dir(settings: &TieringSettings) -> String {
    without_credentials(&settings.warehouse())
}

/// `url` without what may hold a secret: the user information and the
/// query (redis-rs reads a password from either).
fn without_credentials(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    match scheme {
        Some(scheme) => format!("{scheme}://{host}{path}"),
        None => format!("{host}{path}"),
    }
}

/// The partitions asked about (`None`: all) that exist and that Metadata
/// shows this gateway leading, by topic in name order. Partitions that do
/// not exist are left out, as Kafka leaves out logs it does not have.
async fn led_here(
    ctx: &Context,
    client: &Client,
    requested: Option<Vec<DescribableLogDirTopic>>,
) -> Result<Vec<(Arc<Topic>, Vec<i32>)>, StorageError> {
    let topics: Vec<(Arc<Topic>, Option<BTreeSet<i32>>)> = match requested {
        None => ctx
            .storage
            .all_topics()
            .await?
            .into_iter()
            .map(|t| (t, None))
            .collect(),
        Some(requested) => {
            let mut wanted: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
            for t in requested {
                wanted
                    .entry(t.topic.as_str().to_owned())
                    .or_default()
                    .extend(t.partitions);
            }
            let found = super::each(wanted.into_iter().map(|(name, partitions)| async move {
                Ok::<_, StorageError>(
                    ctx.storage
                        .topic(&name)
                        .await?
                        .map(|topic| (topic, Some(partitions))),
                )
            }))
            .await;
            found
                .into_iter()
                .filter_map(Result::transpose)
                .collect::<Result<_, _>>()?
        }
    };
    let broker_ids = ctx.membership.broker_ids(&client.listener);
    let me = ctx.membership.my_broker_id(&client.listener);
    let mut led: Vec<(Arc<Topic>, Vec<i32>)> = topics
        .into_iter()
        .map(|(topic, wanted)| {
            let partitions = (0..topic.partitions())
                .filter(|p| wanted.as_ref().is_none_or(|w| w.contains(p)))
                .filter(|&p| leader_id(ctx, &client.listener, &broker_ids, &topic, p) == me)
                .collect();
            (topic, partitions)
        })
        .filter(|(_, partitions): &(_, Vec<i32>)| !partitions.is_empty())
        .collect();
    led.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    Ok(led)
}

/// Which log directory a partition is measured in.
#[derive(Debug, Clone, Copy)]
enum Dir {
    Redis,
    Archive,
}

/// Each partition's size in `dir`, as the topics of that log directory.
async fn sizes(
    ctx: &Context,
    dir: Dir,
    partitions: &[(Arc<Topic>, Vec<i32>)],
) -> Result<Vec<DescribeLogDirsTopic>, StorageError> {
    let flat: Vec<(Arc<Topic>, i32)> = partitions
        .iter()
        .flat_map(|(topic, ps)| ps.iter().map(|&p| (topic.clone(), p)))
        .collect();
    let measured = super::each(flat.into_iter().map(|(topic, p)| async move {
        match dir {
            Dir::Redis => redis_bytes(ctx, topic, p).await,
            Dir::Archive => archived_bytes(ctx, topic, p).await,
        }
    }))
    .await;
    let mut measured = measured.into_iter();
    let mut topics = Vec::with_capacity(partitions.len());
    for (topic, ps) in partitions {
        let mut described = Vec::with_capacity(ps.len());
        for &p in ps {
            let size = measured.next().expect("one size per partition")?;
            described.push(
                DescribeLogDirsPartition::default()
                    .with_partition_index(p)
                    .with_partition_size(size)
                    // The log end is the high watermark: no lag to report.
                    .with_offset_lag(0)
                    .with_is_future_key(false),
            );
        }
        topics.push(
            DescribeLogDirsTopic::default()
                .with_name(TopicName(str_bytes(topic.name.clone())))
                .with_partitions(described),
        );
    }
    Ok(topics)
}

async fn redis_bytes(ctx: &Context, topic: Arc<Topic>, partition: i32) -> Result<i64, StorageError> {
    Ok(ctx
        .storage
        .partition_memory(&topic, partition)
        .await?
        .unwrap_or(0))
}

/// Bytes of the archive's data files for a partition's archived segments
/// (a segment recorded before file sizes were: its log bytes).
async fn archived_bytes(ctx: &Context, topic: Arc<Topic>, partition: i32) -> Result<i64, StorageError> {
    let segments = ctx.storage.segments(&topic, partition).await?;
    Ok(segments
        .iter()
        .filter(|s| s.path.is_some() && s.skipped.is_none())
        .map(|s| s.file_bytes.unwrap_or(s.bytes))
        .sum())
}

/// (total, usable) bytes of the Redis servers: their `maxmemory` and what
/// `used_memory` leaves of it; -1 each when a server has no limit or
/// cannot be asked.
async fn redis_volume(ctx: &Context) -> (i64, i64) {
    let servers = match ctx.storage.server_info().await {
        Ok(info) if !info.is_empty() => info,
        _ => return (-1, -1),
    };
    let mut total: i64 = 0;
    let mut usable: i64 = 0;
    for (server, info) in &servers {
        let Ok(info) = info else {
            return (-1, -1);
        };
        let memory = crate::metrics::parse_info(server, info);
        if memory.maxmemory == 0 {
            return (-1, -1);
        }
        let limit = i64::try_from(memory.maxmemory).unwrap_or(i64::MAX);
        let used = i64::try_from(memory.counted()).unwrap_or(i64::MAX);
        total = total.saturating_add(limit);
        usable = usable.saturating_add((limit - used).max(0));
    }
    (total, usable)
}

/// A log directory that could not be described.
fn failed(log_dir: String, code: i16) -> DescribeLogDirsResult {
    DescribeLogDirsResult::default()
        .with_log_dir(str_bytes(log_dir))
        .with_error_code(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_dirs_never_show_credentials() {
        assert_eq!(
            without_credentials("redis://user:secret@10.0.0.1:6379/2?password=x"),
            "redis://10.0.0.1:6379/2"
        );
        assert_eq!(
            without_credentials("rediss://:p%40ss@redis.example:6380"),
            "rediss://redis.example:6380"
        );
        assert_eq!(
            without_credentials("file:///var/lib/ketch/warehouse"),
            "file:///var/lib/ketch/warehouse"
        );
        assert_eq!(without_credentials("s3://bucket/prefix"), "s3://bucket/prefix");
        let cluster = RedisSettings {
            url: "redis://:pw@a:7000, redis://:pw@b:7001".to_owned(),
            ..RedisSettings::default()
        };
        assert_eq!(redis_log_dir(&cluster), "redis://a:7000,redis://b:7001");
    }

    #[test]
    fn responses_encode_in_every_supported_version() {
        use bytes::BytesMut;
        use kafka_protocol::protocol::Encodable;

        let dir = DescribeLogDirsResult::default()
            .with_log_dir(str_bytes("redis://127.0.0.1:6379"))
            .with_topics(vec![
                DescribeLogDirsTopic::default()
                    .with_name(TopicName(str_bytes("t")))
                    .with_partitions(vec![DescribeLogDirsPartition::default().with_partition_size(10)]),
            ]);
        for version in 1..=4 {
            let response = DescribeLogDirsResponse::default()
                .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
                .with_results(vec![dir.clone(), failed("s3://b".into(), 56)]);
            assert!(
                response.encode(&mut BytesMut::new(), version).is_ok(),
                "version {version}"
            );
        }
    }
}
