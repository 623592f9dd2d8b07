//! AlterReplicaLogDirs (API key 34, versions 1–2): moves replicas between
//! a broker's log directories (KIP-113). A ketch partition has one replica
//! and the directories DescribeLogDirs reports are not places it can be
//! moved to — the Redis holds every partition's log, and the archive holds
//! what a topic's `remote.storage.enable` sends there — so nothing moves:
//!
//! - a partition this gateway leads, asked into the Redis directory where
//!   it already is: NONE, as Kafka answers a move to the current directory;
//! - any other directory, the archive's included: LOG_DIR_NOT_FOUND, the
//!   code Kafka gives for a directory it cannot place replicas in. Not
//!   KAFKA_STORAGE_ERROR: clients take that for a failing disk and retry;
//! - a partition that does not exist or that another gateway leads:
//!   REPLICA_NOT_AVAILABLE, Kafka's code for a replica the broker lacks.
//!
//! Needs ALTER on the cluster (CLUSTER_AUTHORIZATION_FAILED per partition).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_replica_log_dirs_request::AlterReplicaLogDirTopic;
use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::{AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, RequestHeader};

use super::describe_log_dirs::redis_log_dir;
use super::metadata::leader_id;
use super::{Client, cluster_authorized, error_code};
use crate::Context;
use crate::auth::acl::Operation;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    req: AlterReplicaLogDirsRequest,
) -> AlterReplicaLogDirsResponse {
    let allowed = cluster_authorized(ctx, client, Operation::Alter);
    let redis = redis_log_dir(&ctx.settings.redis);
    let mut results: Vec<AlterReplicaLogDirTopicResult> = Vec::new();
    for dir in req.dirs {
        let into_redis = dir.path.as_str() == redis;
        for topic in dir.topics {
            let codes = if !allowed {
                vec![ResponseError::ClusterAuthorizationFailed.code(); topic.partitions.len()]
            } else if !into_redis {
                vec![ResponseError::LogDirNotFound.code(); topic.partitions.len()]
            } else {
                already_there(ctx, client, &topic).await
            };
            let partitions = topic.partitions.iter().zip(codes).map(|(&p, code)| {
                AlterReplicaLogDirPartitionResult::default()
                    .with_partition_index(p)
                    .with_error_code(code)
            });
            // One result per topic, as Kafka groups them.
            match results.iter_mut().find(|r| r.topic_name == topic.name) {
                Some(result) => result.partitions.extend(partitions),
                None => results.push(
                    AlterReplicaLogDirTopicResult::default()
                        .with_topic_name(topic.name.clone())
                        .with_partitions(partitions.collect()),
                ),
            }
        }
    }
    AlterReplicaLogDirsResponse::default().with_results(results)
}

/// For each partition of `topic` asked into the Redis directory: NONE when
/// this gateway leads it (it is there already), REPLICA_NOT_AVAILABLE when
/// it does not exist or another gateway leads it.
async fn already_there(ctx: &Context, client: &Client, topic: &AlterReplicaLogDirTopic) -> Vec<i16> {
    let found = match ctx.storage.topic(topic.name.as_str()).await {
        Ok(found) => found,
        Err(e) => return vec![error_code(&e); topic.partitions.len()],
    };
    let broker_ids = ctx.membership.broker_ids(&client.listener);
    let me = ctx.membership.my_broker_id(&client.listener);
    topic
        .partitions
        .iter()
        .map(|&p| match &found {
            Some(t) if t.has_partition(p) && leader_id(ctx, &client.listener, &broker_ids, t, p) == me => 0,
            _ => ResponseError::ReplicaNotAvailable.code(),
        })
        .collect()
}
