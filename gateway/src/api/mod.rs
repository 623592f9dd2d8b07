//! Kafka APIs, one module each: a function from (context, header, request)
//! to response. This module routes requests and holds what they share:
//! the supported versions table, error-code mapping and topic resolution.
//!
//! Spec: the Kafka protocol guide (<https://kafka.apache.org/protocol>) and
//! the message schemas `kafka-protocol` 0.18 is generated from (Kafka 4.1).

pub mod acls;
pub mod add_offsets_to_txn;
pub mod add_partitions_to_txn;
pub mod alter_client_quotas;
pub mod alter_configs;
pub mod alter_partition_reassignments;
pub mod alter_replica_log_dirs;
pub mod api_versions;
pub mod create_partitions;
pub mod create_topics;
pub mod delete_groups;
pub mod delete_records;
pub mod delete_topics;
pub mod describe_client_quotas;
pub mod describe_cluster;
pub mod describe_configs;
pub mod describe_groups;
pub mod describe_log_dirs;
pub mod describe_producers;
pub mod describe_topic_partitions;
pub mod describe_transactions;
pub mod elect_leaders;
pub mod end_txn;
pub mod fetch;
pub mod find_coordinator;
pub mod heartbeat;
pub mod init_producer_id;
pub mod join_group;
pub mod leave_group;
pub mod list_config_resources;
pub mod list_groups;
pub mod list_offsets;
pub mod list_partition_reassignments;
pub mod list_transactions;
pub mod metadata;
pub mod offset_commit;
pub mod offset_delete;
pub mod offset_fetch;
pub mod produce;
pub mod scram_credentials;
pub mod sync_group;
pub mod txn_offset_commit;

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use ketch_storage::{SequenceError, StorageError, Topic};

use crate::Context;
use crate::auth::acl::{Operation, ResourceType};

/// Every API ketch serves and the versions whose semantics it implements.
/// ApiVersions advertises exactly these; anything else closes the connection.
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 13),
    (ApiKey::Fetch, 4, 18),
    (ApiKey::ListOffsets, 1, 9),
    (ApiKey::Metadata, 0, 13),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::ListConfigResources, 0, 1),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeCluster, 0, 2),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::AlterReplicaLogDirs, 1, 2),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
];

/// The (min, max) versions ketch supports for `key`, if any.
pub fn supported_versions(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED_APIS
        .iter()
        .find(|(k, ..)| *k == key)
        .map(|(_, min, max)| (*min, *max))
}

/// The principal of a client that did not authenticate (Kafka's name).
pub const ANONYMOUS: &str = "User:ANONYMOUS";

/// Who sent a request: the client's address and principal, the listener
/// it came through, and whether another gateway forwarded it (forwarded
/// requests are never forwarded again).
#[derive(Debug, Clone)]
pub struct Client {
    pub peer: std::net::SocketAddr,
    pub principal: Arc<str>,
    pub forwarded: bool,
    /// The listener's name: Metadata and FindCoordinator answer with the
    /// gateways' addresses on it. Empty: the first listener.
    pub listener: Arc<str>,
}

impl Client {
    /// An unauthenticated client of the first listener.
    pub fn direct(peer: std::net::SocketAddr) -> Self {
        Self {
            peer,
            principal: Arc::from(ANONYMOUS),
            forwarded: false,
            listener: Arc::from(""),
        }
    }
}

/// The authorisation check of a request: whether `client` may perform
/// `op` on the resource. Free when ACLs are off.
pub fn authorized(
    ctx: &Context,
    client: &Client,
    op: Operation,
    resource_type: ResourceType,
    name: &str,
) -> bool {
    let acls = &ctx.security.acls;
    if !acls.enabled() {
        return true;
    }
    let allowed = acls.authorize(
        &client.principal,
        &client.peer.ip().to_string(),
        op,
        resource_type,
        name,
    );
    if !allowed {
        tracing::debug!(principal = %client.principal, ?op, ?resource_type, name, "not authorized");
    }
    allowed
}

/// The operations `client` may perform on a resource, as the bit set
/// Metadata and DescribeCluster report (bit = Kafka's operation code).
pub fn authorized_operations(ctx: &Context, client: &Client, resource_type: ResourceType, name: &str) -> i32 {
    resource_type
        .operations()
        .iter()
        .filter(|op| authorized(ctx, client, **op, resource_type, name))
        .fold(0, |bits, op| bits | 1 << op.code())
}

/// [`authorized`] for the cluster resource.
pub fn cluster_authorized(ctx: &Context, client: &Client, op: Operation) -> bool {
    authorized(
        ctx,
        client,
        op,
        ResourceType::Cluster,
        crate::auth::acl::CLUSTER_NAME,
    )
}

/// Runs one request. `None` means no response is sent (acks=0 produce).
/// `turns` orders a produce request's appends after its connection's
/// earlier ones (see [`produce::Sequencer`]).
///
/// Every request's task holds this future, so it holds only the produce
/// path's own; the other handlers run boxed ([`handle_other`]), one
/// allocation for requests rarer than produce. (Fetches come here only
/// from the fuzz target: the server answers them with [`fetch::handle`]
/// and its own encoding.) A request's task is copied whole as tokio starts
/// and ends it; with every handler's state in it, it was 8 KiB
/// (benchmark/README.md, issue #14, eleventh round).
pub async fn handle(
    ctx: &Context,
    client: Client,
    header: &RequestHeader,
    request: RequestKind,
    turns: produce::Turns,
) -> Option<ResponseKind> {
    match request {
        RequestKind::ApiVersions(r) => Some(ResponseKind::ApiVersions(api_versions::handle(ctx, header, r))),
        RequestKind::Produce(r) => Some(ResponseKind::Produce(
            produce::handle(ctx, &client, header, r, turns).await?,
        )),
        other => Box::pin(handle_other(ctx, client, header, other)).await,
    }
}

/// [`handle`] for every request but ApiVersions and Produce.
async fn handle_other(
    ctx: &Context,
    client: Client,
    header: &RequestHeader,
    request: RequestKind,
) -> Option<ResponseKind> {
    let response = match request {
        RequestKind::Fetch(r) => {
            let answer = fetch::handle(ctx, &client, header, r).await;
            answer.fetched.count(ctx);
            ResponseKind::Fetch(answer.into_response())
        }
        RequestKind::Metadata(r) => ResponseKind::Metadata(metadata::handle(ctx, &client, header, r).await?),
        RequestKind::ListOffsets(r) => {
            ResponseKind::ListOffsets(list_offsets::handle(ctx, &client, header, r).await)
        }
        RequestKind::CreateTopics(r) => {
            ResponseKind::CreateTopics(create_topics::handle(ctx, &client, header, r).await)
        }
        RequestKind::DeleteTopics(r) => {
            ResponseKind::DeleteTopics(delete_topics::handle(ctx, &client, header, r).await)
        }
        RequestKind::CreatePartitions(r) => {
            ResponseKind::CreatePartitions(create_partitions::handle(ctx, &client, header, r).await)
        }
        RequestKind::DescribeConfigs(r) => {
            ResponseKind::DescribeConfigs(describe_configs::handle(ctx, &client, header, r).await)
        }
        RequestKind::AlterConfigs(r) => {
            ResponseKind::AlterConfigs(alter_configs::handle_alter(ctx, &client, header, r).await)
        }
        RequestKind::IncrementalAlterConfigs(r) => ResponseKind::IncrementalAlterConfigs(
            alter_configs::handle_incremental(ctx, &client, header, r).await,
        ),
        RequestKind::ListConfigResources(r) => {
            ResponseKind::ListConfigResources(list_config_resources::handle(ctx, &client, header, r).await)
        }
        RequestKind::DescribeClientQuotas(r) => {
            ResponseKind::DescribeClientQuotas(describe_client_quotas::handle(ctx, &client, header, r).await)
        }
        RequestKind::AlterClientQuotas(r) => {
            ResponseKind::AlterClientQuotas(alter_client_quotas::handle(ctx, &client, header, r).await)
        }
        RequestKind::DescribeCluster(r) => {
            ResponseKind::DescribeCluster(describe_cluster::handle(ctx, &client, header, r))
        }
        RequestKind::DescribeTopicPartitions(r) => ResponseKind::DescribeTopicPartitions(
            describe_topic_partitions::handle(ctx, &client, header, r).await?,
        ),
        RequestKind::DescribeLogDirs(r) => {
            ResponseKind::DescribeLogDirs(describe_log_dirs::handle(ctx, &client, header, r).await)
        }
        RequestKind::AlterReplicaLogDirs(r) => {
            ResponseKind::AlterReplicaLogDirs(alter_replica_log_dirs::handle(ctx, &client, header, r).await)
        }
        RequestKind::ElectLeaders(r) => {
            ResponseKind::ElectLeaders(elect_leaders::handle(ctx, &client, header, r).await)
        }
        RequestKind::ListPartitionReassignments(r) => ResponseKind::ListPartitionReassignments(
            list_partition_reassignments::handle(ctx, &client, header, r),
        ),
        RequestKind::AlterPartitionReassignments(r) => ResponseKind::AlterPartitionReassignments(
            alter_partition_reassignments::handle(ctx, &client, header, r).await,
        ),
        RequestKind::DeleteRecords(r) => {
            ResponseKind::DeleteRecords(delete_records::handle(ctx, &client, header, r).await)
        }
        RequestKind::FindCoordinator(r) => {
            ResponseKind::FindCoordinator(find_coordinator::handle(ctx, &client, header, r))
        }
        RequestKind::OffsetFetch(r) => {
            ResponseKind::OffsetFetch(offset_fetch::handle(ctx, &client, header, r).await)
        }
        RequestKind::OffsetCommit(r) => {
            ResponseKind::OffsetCommit(offset_commit::handle(ctx, &client, header, r).await)
        }
        RequestKind::OffsetDelete(r) => {
            ResponseKind::OffsetDelete(offset_delete::handle(ctx, &client, header, r).await)
        }
        RequestKind::JoinGroup(r) => {
            ResponseKind::JoinGroup(join_group::handle(ctx, client, header, r).await)
        }
        RequestKind::SyncGroup(r) => {
            ResponseKind::SyncGroup(sync_group::handle(ctx, &client, header, r).await)
        }
        RequestKind::Heartbeat(r) => {
            ResponseKind::Heartbeat(heartbeat::handle(ctx, &client, header, r).await)
        }
        RequestKind::LeaveGroup(r) => {
            ResponseKind::LeaveGroup(leave_group::handle(ctx, &client, header, r).await)
        }
        RequestKind::ListGroups(r) => {
            ResponseKind::ListGroups(list_groups::handle(ctx, &client, header, r).await)
        }
        RequestKind::DescribeGroups(r) => {
            ResponseKind::DescribeGroups(describe_groups::handle(ctx, &client, header, r).await)
        }
        RequestKind::DeleteGroups(r) => {
            ResponseKind::DeleteGroups(delete_groups::handle(ctx, &client, header, r).await)
        }
        RequestKind::InitProducerId(r) => {
            ResponseKind::InitProducerId(init_producer_id::handle(ctx, &client, header, r).await)
        }
        RequestKind::AddPartitionsToTxn(r) => {
            ResponseKind::AddPartitionsToTxn(add_partitions_to_txn::handle(ctx, &client, header, r).await)
        }
        RequestKind::AddOffsetsToTxn(r) => {
            ResponseKind::AddOffsetsToTxn(add_offsets_to_txn::handle(ctx, &client, header, r).await)
        }
        RequestKind::EndTxn(r) => ResponseKind::EndTxn(end_txn::handle(ctx, &client, header, r).await),
        RequestKind::TxnOffsetCommit(r) => {
            ResponseKind::TxnOffsetCommit(txn_offset_commit::handle(ctx, &client, header, r).await)
        }
        RequestKind::DescribeProducers(r) => {
            ResponseKind::DescribeProducers(describe_producers::handle(ctx, &client, header, r).await)
        }
        RequestKind::DescribeTransactions(r) => {
            ResponseKind::DescribeTransactions(describe_transactions::handle(ctx, &client, header, r).await)
        }
        RequestKind::ListTransactions(r) => {
            ResponseKind::ListTransactions(list_transactions::handle(ctx, &client, header, r).await)
        }
        RequestKind::CreateAcls(r) => ResponseKind::CreateAcls(acls::create(ctx, &client, r).await),
        RequestKind::DescribeAcls(r) => ResponseKind::DescribeAcls(acls::describe(ctx, &client, r)),
        RequestKind::DeleteAcls(r) => ResponseKind::DeleteAcls(acls::delete(ctx, &client, r).await),
        RequestKind::DescribeUserScramCredentials(r) => {
            ResponseKind::DescribeUserScramCredentials(scram_credentials::describe(ctx, &client, r).await)
        }
        RequestKind::AlterUserScramCredentials(r) => {
            ResponseKind::AlterUserScramCredentials(scram_credentials::alter(ctx, &client, r).await)
        }
        // The connection answers these itself (auth::sasl), in its read
        // loop; one that reaches here (the fuzz target's way in) has none.
        RequestKind::SaslHandshake(_) | RequestKind::SaslAuthenticate(_) => return None,
        other => {
            // Unreachable: the server refuses unsupported API keys before decoding.
            tracing::error!(request = ?std::mem::discriminant(&other), "no handler for a supported API");
            return None;
        }
    };
    Some(response)
}

/// Entries of one request (topics, partitions, groups…) worked on at once.
/// A request may name a hundred thousand partitions in under a megabyte;
/// each one's work is a future that may hold kilobytes, so they are
/// started as others finish, not all at once.
const PER_REQUEST_CONCURRENCY: usize = 32;

/// Runs one future per entry of a request, at most
/// [`PER_REQUEST_CONCURRENCY`] at a time; the outputs in entry order.
pub async fn each<T, F: std::future::Future<Output = T>>(futures: impl IntoIterator<Item = F>) -> Vec<T> {
    use futures::StreamExt;
    Quiet::new(
        futures::stream::iter(futures)
            .buffered(PER_REQUEST_CONCURRENCY)
            .collect::<Vec<T>>(),
    )
    .await
}

/// Polls a future that wakes its own task while it is polled, and keeps
/// those wake-ups from the runtime: it is polled again at once instead.
///
/// [`each`] keeps its futures in a `FuturesOrdered`, which wakes its own
/// task whenever it has polled all its futures and all were pending (so
/// as not to starve other tasks). Tokio takes a task woken while it runs
/// for a yield: it queues the task behind the others and wakes a parked
/// worker thread to take it, which finds nothing to do and parks again. At
/// 10,000 records/s with `linger.ms=1`, where a produce request carries a
/// batch or two, that was a quarter of the gateway's futex wake-ups
/// (benchmark/README.md, issue #14, eighteenth round). Polled again, such a
/// `FuturesOrdered` finds none of its futures woken and returns at once. A
/// future that keeps waking itself is still yielded to the runtime, after
/// [`Quiet::REPOLLS`] polls. Wake-ups from elsewhere (the futures' I/O,
/// other tasks) reach the task as they come.
struct Quiet<F> {
    inner: F,
    shared: std::sync::Arc<QuietWaker>,
    /// The waker the inner future is polled with, over `shared`.
    waker: std::task::Waker,
}

#[derive(Default)]
struct QuietWaker {
    /// While the inner future is being polled.
    polling: std::sync::atomic::AtomicBool,
    /// Woken since its poll began.
    woken: std::sync::atomic::AtomicBool,
    /// The task's own waker, from its last poll.
    task: std::sync::Mutex<Option<std::task::Waker>>,
}

impl std::task::Wake for QuietWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        use std::sync::atomic::Ordering::SeqCst;
        // `woken` before `polling`, as `poll` stores them the other way
        // round: a wake-up racing the end of a poll is seen by one side at
        // least.
        self.woken.store(true, SeqCst);
        if !self.polling.load(SeqCst)
            && let Some(task) = self.task.lock().expect("quiet waker lock").as_ref()
        {
            task.wake_by_ref();
        }
    }
}

impl<F> Quiet<F> {
    /// Polls of the inner future in one poll of the task.
    const REPOLLS: usize = 4;

    fn new(inner: F) -> Self {
        let shared = std::sync::Arc::<QuietWaker>::default();
        Self {
            inner,
            waker: std::task::Waker::from(shared.clone()),
            shared,
        }
    }
}

impl<F: std::future::Future + Unpin> std::future::Future for Quiet<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        use std::sync::atomic::Ordering::SeqCst;
        let this = &mut *self;
        {
            let mut task = this.shared.task.lock().expect("quiet waker lock");
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let mut inner_cx = std::task::Context::from_waker(&this.waker);
        for _ in 0..Self::REPOLLS {
            this.shared.woken.store(false, SeqCst);
            this.shared.polling.store(true, SeqCst);
            let polled = std::pin::Pin::new(&mut this.inner).poll(&mut inner_cx);
            this.shared.polling.store(false, SeqCst);
            if polled.is_ready() {
                return polled;
            }
            if !this.shared.woken.load(SeqCst) {
                return std::task::Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// The Kafka error code for a storage failure.
pub fn error_code(e: &StorageError) -> i16 {
    let error = match e {
        StorageError::Unavailable(_) => ResponseError::KafkaStorageError,
        StorageError::UnknownTopicOrPartition => ResponseError::UnknownTopicOrPartition,
        StorageError::TopicExists => ResponseError::TopicAlreadyExists,
        StorageError::TopicCollides(_) => ResponseError::InvalidTopicException,
        StorageError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        StorageError::Corrupt(_) => ResponseError::CorruptMessage,
        // A change that kept losing to others' (an append to a partition
        // other gateways kept appending to, a topic record changed
        // meanwhile): nothing was written. NOT_ENOUGH_REPLICAS is what Kafka
        // answers for a transient "nothing stored", and every client
        // retries it (REASSIGNMENT_IN_PROGRESS, answered before, is not
        // retriable).
        StorageError::Conflict(_) => ResponseError::NotEnoughReplicas,
        StorageError::Busy(_) => ResponseError::RequestTimedOut,
        StorageError::NotEnoughReplicasAfterAppend { .. } => ResponseError::NotEnoughReplicasAfterAppend,
        StorageError::Sequence(SequenceError::OutOfOrder) => ResponseError::OutOfOrderSequenceNumber,
        StorageError::Sequence(SequenceError::StaleEpoch) => ResponseError::InvalidProducerEpoch,
        StorageError::Sequence(SequenceError::NotInTransaction) => ResponseError::InvalidTxnState,
        StorageError::Data(_) => ResponseError::UnknownServerError,
        // Only the Redis tier alone says this; ketch-tiering reads the archive.
        StorageError::NotLocal { .. } => ResponseError::KafkaStorageError,
        _ => ResponseError::UnknownServerError,
    };
    if matches!(e, StorageError::Unavailable(_) | StorageError::Data(_)) {
        tracing::warn!(error = %e, "storage error");
    }
    error.code()
}

/// Looks a topic up by name, creating it when `auto_create` allows.
/// Errors are Kafka error codes.
pub async fn resolve_topic(ctx: &Context, name: &str, auto_create: bool) -> Result<Arc<Topic>, i16> {
    if let Some(topic) = ctx.storage.topic(name).await.map_err(|e| error_code(&e))? {
        return Ok(topic);
    }
    if !auto_create || !ctx.settings.topics.auto_create {
        return Err(ResponseError::UnknownTopicOrPartition.code());
    }
    if ketch_storage::validate_topic_name(name).is_err() {
        return Err(ResponseError::InvalidTopicException.code());
    }
    if name == create_topics::CLUSTER_METADATA_TOPIC {
        // CreateTopics refuses it (INVALID_REQUEST); it stays unknown.
        return Err(ResponseError::UnknownTopicOrPartition.code());
    }
    let partitions = ctx.settings.topics.default_partitions;
    match ctx
        .storage
        .create_topic(name, partitions, Default::default())
        .await
    {
        Ok(topic) => {
            tracing::info!(topic = name, partitions, "auto-created topic");
            Ok(topic)
        }
        // Another gateway created it meanwhile.
        Err(StorageError::TopicExists) => match ctx.storage.topic_fresh(name).await {
            Ok(Some(topic)) => Ok(topic),
            Ok(None) => Err(ResponseError::UnknownTopicOrPartition.code()),
            Err(e) => Err(error_code(&e)),
        },
        Err(e) => Err(error_code(&e)),
    }
}

/// Looks a topic up by id (the request versions that address topics by id).
pub async fn resolve_topic_id(ctx: &Context, id: uuid::Uuid) -> Result<Arc<Topic>, i16> {
    match ctx.storage.topic_by_id(id).await {
        Ok(Some(topic)) => Ok(topic),
        Ok(None) => Err(ResponseError::UnknownTopicId.code()),
        Err(e) => Err(error_code(&e)),
    }
}

/// The largest batch a topic accepts: its `max.message.bytes`, else the
/// cluster-wide default, else the gateway's setting.
pub fn max_message_bytes(ctx: &Context, topic: &Topic) -> usize {
    let defaults = ctx.topic_defaults.get();
    let configs = ketch_config::topic::Configs::new(&topic.configs, &defaults);
    usize::try_from(configs.number("max.message.bytes")).unwrap_or(0)
}

/// How recent a topic record must be for a partition beyond it to be
/// unknown without asking Redis again.
const PARTITION_REFRESH: std::time::Duration = std::time::Duration::from_millis(100);

/// A topic's partition as a partition of a freshly read record, refreshing
/// the cached record when the partition is beyond it (another gateway may
/// have added partitions) — at most once per [`PARTITION_REFRESH`] once a
/// read has finished, so a request naming thousands of partitions that do
/// not exist costs a few reads (those its concurrent entries start before
/// the first returns), not one per partition.
pub async fn ensure_partition(ctx: &Context, topic: Arc<Topic>, partition: i32) -> Result<Arc<Topic>, i16> {
    if topic.has_partition(partition) {
        return Ok(topic);
    }
    match ctx
        .storage
        .topic_fresher_than(&topic.name, PARTITION_REFRESH)
        .await
    {
        Ok(Some(fresh)) if fresh.id == topic.id && fresh.has_partition(partition) => Ok(fresh),
        Ok(_) => Err(ResponseError::UnknownTopicOrPartition.code()),
        Err(e) => Err(error_code(&e)),
    }
}

/// Where a group request is handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This gateway coordinates the group.
    Here,
    /// Forward it to the coordinator's internal listener at this address.
    Forward(String),
    /// NOT_COORDINATOR: the client looks the coordinator up again. For a
    /// request another gateway forwarded (it is never forwarded twice), or
    /// when the coordinator has no internal listener.
    NotCoordinator,
    /// COORDINATOR_NOT_AVAILABLE: this gateway has no node id yet, or its
    /// heartbeats do not reach Redis, so it can neither run the group nor
    /// trust its view of who does.
    Unavailable,
}

/// Where a request about `group` from `client` is handled.
pub fn route(ctx: &Context, client: &Client, group: &str) -> Route {
    if !ctx.membership.can_coordinate() {
        return Route::Unavailable;
    }
    let coordinator = ctx.membership.group_coordinator(group);
    if coordinator.id == ctx.membership.my_id() {
        return Route::Here;
    }
    match coordinator.internal_address() {
        Some(address) if !client.forwarded => Route::Forward(address),
        _ => Route::NotCoordinator,
    }
}

/// Forwards a request to the group coordinator at `to`; a failure is
/// COORDINATOR_NOT_AVAILABLE (the client looks the coordinator up again
/// and retries).
pub async fn forward<R: crate::forward::Forwardable>(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    request: &R,
    to: &str,
) -> Result<R::Response, i16> {
    let deadline = crate::forward::deadline(ctx, request);
    // A coordinator that hangs (paused, or cut off) holds its requests
    // until it is taken for dead; then they are answered so that clients
    // look the new coordinator up.
    // The live set is looked at once subscribed, then at each change: a
    // coordinator that left between `route` and the subscription is seen
    // at once.
    let mut changes = ctx.membership.subscribe();
    let gone = async {
        loop {
            let live = ctx.membership.nodes();
            if !live.iter().any(|n| n.internal_address().as_deref() == Some(to)) {
                return;
            }
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    let secret = match ctx.security.internal_secret(ctx.storage.as_ref()).await {
        Ok(secret) => secret,
        Err(e) => {
            tracing::info!(error = %e, "cannot read the internal secret to forward a group request");
            return Err(ResponseError::CoordinatorNotAvailable.code());
        }
    };
    tokio::select! {
        answer = ctx.forwarder.forward(to, header, request, client, deadline, secret) => answer.map_err(|e| {
            tracing::info!(coordinator = to, api_key = header.request_api_key, error = %e, "cannot forward a group request");
            ResponseError::CoordinatorNotAvailable.code()
        }),
        () = gone => {
            tracing::info!(coordinator = to, api_key = header.request_api_key,
                "the coordinator left the live gateways before answering a forwarded request");
            Err(ResponseError::CoordinatorNotAvailable.code())
        }
    }
}

/// For a request about one group that takes `op` on it: `None` when this
/// gateway coordinates it (handle it here); otherwise the coordinator's
/// answer, or the error code to answer with (GROUP_AUTHORIZATION_FAILED
/// when the client may not, checked before anything is forwarded; the
/// coordinator checks the forwarded principal again).
pub async fn elsewhere<R: crate::forward::Forwardable>(
    ctx: &Context,
    client: &Client,
    header: &RequestHeader,
    (op, group): (Operation, &str),
    request: &R,
) -> Option<Result<R::Response, i16>> {
    if !authorized(ctx, client, op, ResourceType::Group, group) {
        return Some(Err(ResponseError::GroupAuthorizationFailed.code()));
    }
    match route(ctx, client, group) {
        Route::Here => None,
        Route::Forward(to) => Some(forward(ctx, client, header, request, &to).await),
        Route::NotCoordinator => Some(Err(ResponseError::NotCoordinator.code())),
        Route::Unavailable => Some(Err(ResponseError::CoordinatorNotAvailable.code())),
    }
}

/// Checks a config request's broker resource name: empty, or this
/// gateway's node id (as clients of `listener` see it, or its own);
/// otherwise Kafka's INVALID_REQUEST message.
pub(crate) fn this_broker(ctx: &Context, listener: &str, name: &str) -> Result<(), String> {
    let me = ctx.membership.my_broker_id(listener).to_string();
    if name.is_empty() || name == me || name == ctx.membership.my_id().to_string() {
        return Ok(());
    }
    Err(format!(
        "Unexpected broker id, expected {me} or empty string, but received {name}"
    ))
}

pub fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};

    use super::{PER_REQUEST_CONCURRENCY, each, error_code};

    /// A storage failure the client should retry gets a code every Kafka
    /// client retries: an append that kept losing races to other gateways
    /// (Conflict) was REASSIGNMENT_IN_PROGRESS, which Java and librdkafka
    /// treat as permanent, and the batch was lost.
    #[test]
    fn retriable_storage_errors_get_retriable_codes() {
        use kafka_protocol::ResponseError;
        use ketch_storage::StorageError;
        for e in [
            StorageError::Conflict("kept moving".to_owned()),
            StorageError::NotEnoughReplicasAfterAppend { acked: 0, wanted: 1 },
        ] {
            assert!(e.is_retriable(), "{e}");
            let code = error_code(&e);
            let kafka = ResponseError::try_from_code(code).expect("a Kafka error");
            assert!(kafka.is_retriable(), "{e} answered {kafka:?}");
        }
    }

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Waiting entries do not wake the request's task: only what they wait
    /// for does (tokio hands a task that woke itself to another worker
    /// thread). The answers come in entry order.
    #[test]
    fn waiting_entries_leave_the_task_asleep() {
        for n in [1, 2, PER_REQUEST_CONCURRENCY, 100] {
            let (senders, receivers): (Vec<_>, Vec<_>) =
                (0..n).map(|_| tokio::sync::oneshot::channel::<usize>()).unzip();
            let mut all = pin!(each(receivers));
            let count = Arc::new(Count::default());
            let waker = Waker::from(count.clone());
            let mut cx = Context::from_waker(&waker);
            assert!(all.as_mut().poll(&mut cx).is_pending());
            assert!(all.as_mut().poll(&mut cx).is_pending());
            assert_eq!(
                count.0.load(Ordering::SeqCst),
                0,
                "{n} entries woke their own task"
            );
            for (i, sender) in senders.into_iter().enumerate().rev() {
                sender.send(i).unwrap();
            }
            assert!(
                count.0.load(Ordering::SeqCst) > 0,
                "{n} entries answered, the task not woken"
            );
            let out = (0..n)
                .find_map(|_| match all.as_mut().poll(&mut cx) {
                    Poll::Ready(out) => Some(out),
                    Poll::Pending => None,
                })
                .expect("all answered");
            let got: Vec<usize> = out.into_iter().map(Result::unwrap).collect();
            assert_eq!(got, (0..n).collect::<Vec<_>>());
        }
    }

    /// A future that keeps waking itself is still yielded to the runtime.
    #[test]
    fn an_entry_that_keeps_waking_itself_yields() {
        let polls = AtomicUsize::new(0);
        let mut all = pin!(each([std::future::poll_fn(|cx| {
            polls.fetch_add(1, Ordering::SeqCst);
            cx.waker().wake_by_ref();
            Poll::<()>::Pending
        })]));
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        assert!(all.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(polls.load(Ordering::SeqCst) > 1);
    }

    /// Many entries: in order, at most PER_REQUEST_CONCURRENCY at once.
    #[tokio::test]
    async fn many_entries_run_a_few_at_a_time_in_order() {
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let out = each((0..200usize).map(|i| {
            let (running, most) = (running.clone(), most.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                running.fetch_sub(1, Ordering::SeqCst);
                i
            }
        }))
        .await;
        assert_eq!(out, (0..200).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), PER_REQUEST_CONCURRENCY);
    }
}
