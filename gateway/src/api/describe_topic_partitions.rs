//! DescribeTopicPartitions (API key 75, version 0): Metadata's answer about
//! topics and their partitions, in pages of at most
//! `response_partition_limit` partitions (KIP-966). Topics are answered in
//! name order; a page that stops inside the list ends with `next_cursor`,
//! the (topic, partition) the next request starts from.
//!
//! Each partition has one replica, its leader: the gateway Metadata reports
//! for it (the load balancer's one broker behind a shared address). ketch
//! keeps no eligible leader replicas, so both ELR lists are empty.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, RequestHeader, TopicName,
};
use ketch_storage::Topic;

use super::metadata::{leader_id, retriable_when_storage};
use super::{Client, authorized, authorized_operations, error_code, str_bytes};
use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

/// The most partitions one response holds, whatever the request asks
/// (Kafka's `max.request.partition.size.limit` default).
pub const MAX_PARTITIONS_PER_RESPONSE: i32 = 2000;

/// A topic asked about, by name, and what looking it up found (an error
/// code when nothing).
type Lookup = (String, Result<Arc<Topic>, i16>);

/// Kafka's "authorized operations unknown" marker.
const OPERATIONS_UNKNOWN: i32 = i32::MIN;

pub async fn handle(
    ctx: &Context,
    client: &Client,
    _header: &RequestHeader,
    req: DescribeTopicPartitionsRequest,
) -> Option<DescribeTopicPartitionsResponse> {
    let fetch_all = req.topics.is_empty();
    let cursor = req
        .cursor
        .as_ref()
        .map(|c| (c.topic_name.as_str().to_owned(), c.partition_index));
    let (cursor_topic, cursor_partition) = cursor.clone().unwrap_or_default();
    let requested: BTreeSet<String> = req.topics.iter().map(|t| t.name.as_str().to_owned()).collect();
    if let Some((topic, partition)) = &cursor {
        // As Kafka: the cursor's topic must be among those named, and its
        // partition a partition index.
        let problem = if *partition < 0 {
            Some(format!("The cursor's partition must be valid, not {partition}."))
        } else if !fetch_all && !requested.contains(topic) {
            Some(format!(
                "The topic list should contain the cursor topic: {topic}."
            ))
        } else {
            None
        };
        if let Some(message) = problem {
            tracing::debug!(message, "invalid DescribeTopicPartitions request");
            return Some(invalid_request(&req));
        }
    }
    let limit = req.response_partition_limit.clamp(1, MAX_PARTITIONS_PER_RESPONSE);
    let may_describe = |name: &str| authorized(ctx, client, Operation::Describe, ResourceType::Topic, name);

    // Every topic from the cursor's on, in name order: those the client may
    // not describe are left out of a listing of all, and refused at the end
    // of the response when named.
    let mut refused = Vec::new();
    let lookups: Vec<Lookup> = if fetch_all {
        match ctx.storage.all_topics().await {
            Ok(all) => {
                let mut all: Vec<Arc<Topic>> = all
                    .into_iter()
                    .filter(|t| t.name >= cursor_topic && may_describe(&t.name))
                    .collect();
                all.sort_by(|a, b| a.name.cmp(&b.name));
                all.into_iter().map(|t| (t.name.clone(), Ok(t))).collect()
            }
            // No list to answer with: an empty one would say every topic
            // is gone. The connection closes instead (as for Metadata).
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the topics for DescribeTopicPartitions: closing the connection");
                return None;
            }
        }
    } else {
        let mut named = Vec::new();
        for name in requested.into_iter().filter(|n| *n >= cursor_topic) {
            if may_describe(&name) {
                named.push(name);
            } else {
                refused.push(unauthorized(name));
            }
        }
        super::each(named.into_iter().map(|name| async move {
            let topic = match ctx.storage.topic(&name).await {
                Ok(Some(topic)) => Ok(topic),
                Ok(None) if ketch_storage::validate_topic_name(&name).is_err() => {
                    Err(ResponseError::InvalidTopicException.code())
                }
                Ok(None) => Err(ResponseError::UnknownTopicOrPartition.code()),
                Err(e) => Err(retriable_when_storage(error_code(&e))),
            };
            (name, topic)
        }))
        .await
    };

    let broker_ids = ctx.membership.broker_ids(&client.listener);
    let start = |name: &str| if name == cursor_topic { cursor_partition } else { 0 };
    let (mut topics, next_cursor) = page(lookups, limit, start, fetch_all, |topic, partitions| {
        describe(ctx, client, &broker_ids, topic, partitions)
    });
    for topic in &mut topics {
        if let Some(name) = &topic.name {
            topic.topic_authorized_operations = authorized_operations(ctx, client, ResourceType::Topic, name);
        }
    }
    topics.extend(refused);
    Some(
        DescribeTopicPartitionsResponse::default()
            .with_topics(topics)
            .with_next_cursor(next_cursor),
    )
}

/// One page of `lookups` (in name order): whole topics while they fit in
/// `limit` partitions, the first one's partitions from `start(name)` on.
/// Topics that could not be looked up are answered with their error when
/// the request named them and skipped in a listing of all (`fetch_all`).
/// The page and, when it stops before the end, where the next one starts.
fn page(
    lookups: Vec<Lookup>,
    limit: i32,
    start: impl Fn(&str) -> i32,
    fetch_all: bool,
    describe: impl Fn(&Topic, std::ops::Range<i32>) -> DescribeTopicPartitionsResponseTopic,
) -> (Vec<DescribeTopicPartitionsResponseTopic>, Option<Cursor>) {
    let mut remaining = limit;
    let mut topics = Vec::new();
    for (name, lookup) in lookups {
        if remaining == 0 {
            // The next page starts at this topic, known or not.
            return (topics, Some(cursor(&name, 0)));
        }
        match lookup {
            Ok(topic) => {
                let first = start(&name);
                let end = topic.partitions().min(first.saturating_add(remaining));
                topics.push(describe(&topic, first..end));
                if end < topic.partitions() {
                    return (topics, Some(cursor(&name, end)));
                }
                remaining -= (end - first).max(0);
            }
            Err(_) if fetch_all => {}
            Err(code) => topics.push(
                DescribeTopicPartitionsResponseTopic::default()
                    .with_error_code(code)
                    .with_name(Some(topic_name(&name))),
            ),
        }
    }
    (topics, None)
}

fn describe(
    ctx: &Context,
    client: &Client,
    broker_ids: &HashMap<i32, i32>,
    topic: &Topic,
    partitions: std::ops::Range<i32>,
) -> DescribeTopicPartitionsResponseTopic {
    DescribeTopicPartitionsResponseTopic::default()
        .with_name(Some(topic_name(&topic.name)))
        .with_topic_id(topic.id)
        .with_is_internal(false)
        .with_partitions(
            partitions
                .map(|p| {
                    let leader = BrokerId(leader_id(ctx, &client.listener, broker_ids, topic, p));
                    DescribeTopicPartitionsResponsePartition::default()
                        .with_partition_index(p)
                        .with_leader_id(leader)
                        .with_leader_epoch(0)
                        .with_replica_nodes(vec![leader])
                        .with_isr_nodes(vec![leader])
                        .with_eligible_leader_replicas(Some(Vec::new()))
                        .with_last_known_elr(Some(Vec::new()))
                        .with_offline_replicas(Vec::new())
                })
                .collect(),
        )
}

/// A named topic the client may not describe: refused without saying
/// whether it exists (no id).
fn unauthorized(name: String) -> DescribeTopicPartitionsResponseTopic {
    DescribeTopicPartitionsResponseTopic::default()
        .with_error_code(ResponseError::TopicAuthorizationFailed.code())
        .with_name(Some(topic_name(&name)))
        .with_topic_authorized_operations(OPERATIONS_UNKNOWN)
}

/// Kafka's answer to a bad cursor: INVALID_REQUEST for every topic named.
fn invalid_request(req: &DescribeTopicPartitionsRequest) -> DescribeTopicPartitionsResponse {
    let topics = req
        .topics
        .iter()
        .map(|t| {
            DescribeTopicPartitionsResponseTopic::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_name(Some(t.name.clone()))
        })
        .collect();
    DescribeTopicPartitionsResponse::default().with_topics(topics)
}

fn cursor(topic: &str, partition: i32) -> Cursor {
    Cursor::default()
        .with_topic_name(topic_name(topic))
        .with_partition_index(partition)
}

fn topic_name(name: &str) -> TopicName {
    TopicName(str_bytes(name))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn topic(name: &str, partitions: i32) -> Lookup {
        let keys = ketch_storage::Keys::new("ketch");
        let tags = (0..partitions).map(|p| format!("{name}-{p}")).collect();
        let topic = Topic::new(name, uuid::Uuid::new_v4(), tags, BTreeMap::new(), &keys);
        (name.to_owned(), Ok(Arc::new(topic)))
    }

    fn unknown(name: &str) -> Lookup {
        (
            name.to_owned(),
            Err(ResponseError::UnknownTopicOrPartition.code()),
        )
    }

    fn partitions_of(topic: &Topic, range: std::ops::Range<i32>) -> DescribeTopicPartitionsResponseTopic {
        DescribeTopicPartitionsResponseTopic::default()
            .with_name(Some(topic_name(&topic.name)))
            .with_partitions(
                range
                    .map(|p| DescribeTopicPartitionsResponsePartition::default().with_partition_index(p))
                    .collect(),
            )
    }

    /// (topic, partitions, error code) of each topic of a page.
    type Listed = Vec<(String, Vec<i32>, i16)>;

    /// What a page lists, and its cursor.
    fn summary(
        page: (Vec<DescribeTopicPartitionsResponseTopic>, Option<Cursor>),
    ) -> (Listed, Option<(String, i32)>) {
        let (topics, cursor) = page;
        let topics = topics
            .into_iter()
            .map(|t| {
                (
                    t.name.unwrap().to_string(),
                    t.partitions.iter().map(|p| p.partition_index).collect(),
                    t.error_code,
                )
            })
            .collect();
        (
            topics,
            cursor.map(|c| (c.topic_name.to_string(), c.partition_index)),
        )
    }

    #[test]
    fn a_page_stops_inside_a_topic_and_the_cursor_points_at_the_next_partition() {
        let lookups = vec![topic("a", 2), topic("b", 3), topic("c", 1)];
        let (topics, cursor) = summary(page(lookups, 4, |_| 0, true, partitions_of));
        assert_eq!(
            topics,
            vec![("a".into(), vec![0, 1], 0), ("b".into(), vec![0, 1], 0)]
        );
        assert_eq!(cursor, Some(("b".into(), 2)));
    }

    #[test]
    fn a_page_that_ends_with_a_topic_points_at_the_next_topic() {
        let lookups = vec![topic("a", 2), unknown("b")];
        let (topics, cursor) = summary(page(lookups, 2, |_| 0, false, partitions_of));
        assert_eq!(topics, vec![("a".into(), vec![0, 1], 0)]);
        assert_eq!(cursor, Some(("b".into(), 0)));
        let (_, last) = summary(page(vec![topic("a", 2)], 2, |_| 0, false, partitions_of));
        assert_eq!(last, None, "nothing after the last topic");
    }

    #[test]
    fn the_first_topic_starts_at_the_cursor() {
        let lookups = vec![topic("b", 3), topic("c", 2)];
        let start = |name: &str| if name == "b" { 2 } else { 0 };
        let (topics, cursor) = summary(page(lookups, 10, start, true, partitions_of));
        assert_eq!(
            topics,
            vec![("b".into(), vec![2], 0), ("c".into(), vec![0, 1], 0)]
        );
        assert_eq!(cursor, None);
    }

    #[test]
    fn unknown_topics_are_answered_when_named_and_skipped_in_a_listing() {
        let named = vec![topic("a", 1), unknown("b"), topic("c", 1)];
        let (topics, _) = summary(page(named, 10, |_| 0, false, partitions_of));
        let unknown_code = ResponseError::UnknownTopicOrPartition.code();
        assert_eq!(
            topics,
            vec![
                ("a".into(), vec![0], 0),
                ("b".into(), vec![], unknown_code),
                ("c".into(), vec![0], 0)
            ]
        );
        let listing = vec![topic("a", 1), unknown("b")];
        let (topics, _) = summary(page(listing, 10, |_| 0, true, partitions_of));
        assert_eq!(topics, vec![("a".into(), vec![0], 0)]);
    }

    #[test]
    fn responses_encode() {
        use bytes::BytesMut;
        use kafka_protocol::protocol::Encodable;

        let (_, t) = topic("a", 1);
        let described = partitions_of(&t.unwrap(), 0..1);
        let response = DescribeTopicPartitionsResponse::default()
            .with_topics(vec![described, unauthorized("b".into())])
            .with_next_cursor(Some(cursor("a", 1)));
        assert!(response.encode(&mut BytesMut::new(), 0).is_ok());
    }
}
