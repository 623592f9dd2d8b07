//! The admin API (`/api/v1`, JSON) on the HTTP listener, and the console
//! page that reads it (`GET /`).
//!
//! Every answer about topics and groups is made by the Kafka API handlers
//! themselves, called in-process with the HTTP request's principal:
//! Metadata, CreateTopics, DeleteTopics, ListGroups, DescribeGroups,
//! ListOffsets and OffsetCommit. So the API agrees with what Kafka clients
//! are told, ACLs apply as they do to clients, and group requests reach the
//! group's coordinator wherever it runs (forwarded as clients' are). What
//! Kafka's APIs do not carry (Redis bytes, segments, archive lag, Redis
//! memory, lag) is read from storage.
//!
//! Writes (POST, PATCH, DELETE) are refused unless `http.admin_writes` is
//! on or HTTP authentication is: the HTTP port is often exposed for
//! Prometheus. Errors are JSON `{"error": …, "message": …}` with the status
//! a client expects (400 bad input, 403, 404, 409, 413, 503).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, DeleteTopicsRequest, DescribeGroupsRequest, GroupId, ListGroupsRequest,
    ListOffsetsRequest, MetadataRequest, MetadataResponse, OffsetCommitRequest, RequestHeader, RequestKind,
    ResponseKind, TopicName,
};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Context;
use crate::api::{self, Client};
use crate::auth::acl::{Operation, ResourceType};

/// Largest request body the admin API reads.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

const CONSOLE: &str = include_str!("console.html");
const OPENAPI: &str = include_str!("openapi.json");

/// Who sent an HTTP request, set by the authentication layer.
#[derive(Debug, Clone)]
pub struct Principal(pub Arc<str>);

/// The admin API's routes and the console.
pub fn routes(ctx: Arc<Context>) -> Router<Arc<Context>> {
    Router::new()
        .route("/", get(|| async { Html(CONSOLE) }))
        .route(
            "/api/v1/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI) }),
        )
        .route("/api/v1/brokers", get(brokers))
        .route("/api/v1/redis", get(redis))
        .route("/api/v1/topics", get(topics).post(create_topic))
        .route(
            "/api/v1/topics/{name}",
            get(topic).delete(delete_topic).patch(alter_topic),
        )
        .route("/api/v1/groups", get(groups))
        .route("/api/v1/groups/{id}", get(group))
        .route("/api/v1/groups/{id}/offsets", post(reset_offsets))
        .route(
            "/api/v1/{*rest}",
            axum::routing::any(|| async { not_found("no such API path") }),
        )
        .layer(middleware::from_fn_with_state(ctx, writes_allowed))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// An error answer.
#[derive(Debug)]
pub struct Failure {
    status: StatusCode,
    error: String,
    message: String,
}

impl Failure {
    pub(crate) fn new(status: StatusCode, error: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
    }

    /// A Kafka error code as the HTTP status a client expects.
    fn kafka(code: i16, message: Option<&str>) -> Self {
        let error = crate::metrics::error_name(code);
        let status = match ResponseError::try_from_code(code) {
            Some(
                ResponseError::UnknownTopicOrPartition
                | ResponseError::GroupIdNotFound
                | ResponseError::UnknownTopicId,
            ) => StatusCode::NOT_FOUND,
            Some(
                ResponseError::TopicAuthorizationFailed
                | ResponseError::GroupAuthorizationFailed
                | ResponseError::ClusterAuthorizationFailed,
            ) => StatusCode::FORBIDDEN,
            // A group whose members came back: the reset of an empty
            // group's offsets lost the race with a member's join.
            Some(
                ResponseError::TopicAlreadyExists
                | ResponseError::NonEmptyGroup
                | ResponseError::UnknownMemberId
                | ResponseError::RebalanceInProgress
                | ResponseError::IllegalGeneration,
            ) => StatusCode::CONFLICT,
            // Over the controller mutation quota: try again later.
            Some(ResponseError::ThrottlingQuotaExceeded) => StatusCode::TOO_MANY_REQUESTS,
            Some(
                ResponseError::InvalidTopicException
                | ResponseError::InvalidPartitions
                | ResponseError::InvalidReplicationFactor
                | ResponseError::InvalidConfig
                | ResponseError::InvalidRequest
                | ResponseError::PolicyViolation
                | ResponseError::InvalidReplicaAssignment,
            ) => StatusCode::BAD_REQUEST,
            Some(
                ResponseError::CoordinatorNotAvailable
                | ResponseError::NotCoordinator
                | ResponseError::CoordinatorLoadInProgress
                | ResponseError::KafkaStorageError
                | ResponseError::RequestTimedOut
                | ResponseError::NotController
                | ResponseError::NotLeaderOrFollower
                | ResponseError::LeaderNotAvailable,
            ) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = message
            .filter(|m| !m.is_empty())
            .map_or_else(|| error.to_lowercase().replace('_', " "), str::to_owned);
        Self::new(status, error, message)
    }

    fn storage(e: &ketch_storage::StorageError) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "STORAGE_ERROR", e.to_string())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": self.error, "message": self.message})),
        )
            .into_response()
    }
}

fn not_found(message: &str) -> Failure {
    Failure::new(StatusCode::NOT_FOUND, "NOT_FOUND", message)
}

type Answer = Result<Json<Value>, Failure>;

/// Refuses writes unless they are allowed, and answers body-limit and
/// other rejections of axum in JSON.
async fn writes_allowed(State(ctx): State<Arc<Context>>, request: Request, next: Next) -> Response {
    let write = matches!(
        *request.method(),
        Method::POST | Method::PATCH | Method::DELETE | Method::PUT
    );
    let http = &ctx.settings.http;
    if write && !(http.admin_writes || http.auth) {
        return Failure::new(
            StatusCode::FORBIDDEN,
            "WRITES_DISABLED",
            "admin API writes are off: set http.admin_writes = true, or turn on http.auth",
        )
        .into_response();
    }
    let response = next.run(request).await;
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return Failure::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            format!("request bodies are at most {MAX_BODY_BYTES} bytes"),
        )
        .into_response();
    }
    response
}

/// A JSON body, or a 400 / 413 / 415 that says what is wrong with it.
fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, Failure> {
    match body {
        Ok(Json(body)) => Ok(body),
        Err(rejection) => {
            // JSON of the wrong shape (axum's 422) is bad input like any other.
            let (status, error) = match rejection.status() {
                StatusCode::PAYLOAD_TOO_LARGE => (StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE"),
                StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                    (StatusCode::UNSUPPORTED_MEDIA_TYPE, "UNSUPPORTED_MEDIA_TYPE")
                }
                _ => (StatusCode::BAD_REQUEST, "BAD_REQUEST"),
            };
            Err(Failure::new(status, error, rejection.body_text()))
        }
    }
}

/// The Kafka client an HTTP request acts as: its principal (set by the
/// authentication layer; anonymous without `http.auth`) and address.
pub struct Caller(Client);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<crate::http::Peer>>()
            .map_or_else(|| std::net::SocketAddr::from(([127, 0, 0, 1], 0)), |c| c.0.0);
        let mut client = Client::direct(peer);
        if let Some(Principal(principal)) = parts.extensions.get::<Principal>() {
            client.principal = principal.clone();
        }
        Ok(Caller(client))
    }
}

/// The header of an in-process request of `key`, at the newest version
/// ketch serves.
fn header(key: ApiKey) -> RequestHeader {
    let (_, version) = api::supported_versions(key).expect("the admin API uses served APIs");
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_client_id(Some(api::str_bytes("ketch-admin-api")))
}

/// Runs a Kafka request in-process, at the newest version ketch serves.
async fn kafka(
    ctx: &Context,
    client: &Client,
    key: ApiKey,
    request: RequestKind,
) -> Result<ResponseKind, Failure> {
    let header = header(key);
    api::handle(
        ctx,
        client.clone(),
        &header,
        request,
        api::produce::Turns::default(),
    )
    .await
    // No answer: a listing of every topic that could not read the list
    // (a Kafka client's connection is closed so that it asks again).
    .ok_or_else(|| {
        Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "STORAGE_ERROR",
            "the topic list could not be read from Redis: try again",
        )
    })
}

async fn metadata(
    ctx: &Context,
    client: &Client,
    topics: Option<Vec<String>>,
) -> Result<MetadataResponse, Failure> {
    let request = MetadataRequest::default()
        .with_allow_auto_topic_creation(false)
        .with_topics(topics.map(|names| {
            names
                .into_iter()
                .map(|n| MetadataRequestTopic::default().with_name(Some(TopicName(api::str_bytes(n)))))
                .collect()
        }));
    match kafka(ctx, client, ApiKey::Metadata, RequestKind::Metadata(request)).await? {
        ResponseKind::Metadata(r) => Ok(r),
        _ => unreachable!("Metadata answers Metadata"),
    }
}

async fn brokers(State(ctx): State<Arc<Context>>, Caller(client): Caller) -> Answer {
    let meta = metadata(&ctx, &client, Some(Vec::new())).await?;
    let me = ctx.membership.my_id();
    let nodes = ctx.membership.nodes();
    let brokers: Vec<Value> = meta
        .brokers
        .iter()
        .map(|b| {
            let node = nodes.iter().find(|n| {
                n.id == *b.node_id || i32::from(n.on("").port) == b.port && n.on("").host == b.host.as_str()
            });
            json!({
                "node_id": *b.node_id,
                "host": b.host.as_str(),
                "port": b.port,
                "rack": b.rack.as_ref().map(|r| r.as_str()),
                "this_gateway": node.is_some_and(|n| n.id == me),
                "internal": node.and_then(|n| n.internal_address()),
            })
        })
        .collect();
    // Every live gateway: behind a load balancer (one advertised address)
    // Metadata shows them as one broker.
    let presented = ctx.membership.broker_ids(&client.listener);
    let gateways: Vec<Value> = nodes
        .iter()
        .map(|n| {
            let advertised = n.on(&client.listener);
            json!({
                "node_id": n.id,
                "broker_id": presented.get(&n.id).copied().unwrap_or(n.id),
                "host": advertised.host,
                "port": advertised.port,
                "internal": n.internal_address(),
                "this_gateway": n.id == me,
            })
        })
        .collect();
    Ok(Json(json!({
        "cluster_id": meta.cluster_id.as_ref().map(|c| c.as_str()),
        "controller_id": *meta.controller_id,
        "brokers": brokers,
        "gateways": gateways,
    })))
}

/// Redis memory of every server, with warnings: 503 with the same body
/// (what was last read) when no server could be read now; a server that
/// could not be read carries its `error`.
async fn redis(State(ctx): State<Arc<Context>>) -> (StatusCode, Json<Value>) {
    let health = crate::metrics::check_redis(&ctx).await;
    let status = if health.unread() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let body = json!({
        "servers": health.servers,
        "warnings": health.warnings(),
        "refuses_writes": health.refuses_writes(),
        "error": health.error,
    });
    (status, Json(body))
}

async fn topics(State(ctx): State<Arc<Context>>, Caller(client): Caller) -> Answer {
    let meta = metadata(&ctx, &client, None).await?;
    let mut topics: Vec<Value> = Vec::with_capacity(meta.topics.len());
    for t in &meta.topics {
        let Some(name) = t.name.as_ref() else { continue };
        // Sums of every partition, or null with the first error when one
        // could not be read (a master down): never a partial sum.
        let sums = async {
            let Some(topic) = ctx.storage.topic(name).await? else {
                return Ok((0i64, 0i64));
            };
            let (mut high_watermark, mut records) = (0i64, 0i64);
            for p in 0..topic.partitions() {
                let o = ctx.storage.offsets(&topic, p).await?;
                high_watermark += o.high_watermark;
                records += o.high_watermark - o.log_start_offset;
            }
            Ok::<_, ketch_storage::StorageError>((high_watermark, records))
        };
        let (high_watermark, records, error) = match sums.await {
            Ok((h, r)) => (Some(h), Some(r), None),
            Err(e) => (None, None, Some(e.to_string())),
        };
        topics.push(json!({
            "name": name.as_str(),
            "topic_id": t.topic_id.to_string(),
            "partitions": t.partitions.len(),
            "high_watermark_sum": high_watermark,
            "records": records,
            "error": error,
        }));
    }
    topics.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Ok(Json(json!({ "topics": topics })))
}

async fn topic(State(ctx): State<Arc<Context>>, Path(name): Path<String>, Caller(client): Caller) -> Answer {
    describe_topic(&ctx, &client, &name).await.map(Json)
}

async fn describe_topic(ctx: &Context, client: &Client, name: &str) -> Result<Value, Failure> {
    let meta = metadata(ctx, client, Some(vec![name.to_owned()])).await?;
    let Some(t) = meta.topics.first() else {
        return Err(Failure::kafka(
            ResponseError::UnknownTopicOrPartition.code(),
            None,
        ));
    };
    if t.error_code != 0 {
        return Err(Failure::kafka(t.error_code, None));
    }
    let topic = ctx
        .storage
        .topic_fresh(name)
        .await
        .map_err(|e| Failure::storage(&e))?
        .ok_or_else(|| Failure::kafka(ResponseError::UnknownTopicOrPartition.code(), None))?;
    let now = ketch_storage::now_ms();
    // Archive lag only where the storage worker archives (remote storage
    // on and copying): every topic's sealed segments wait for retention.
    let archives =
        ketch_config::topic::Configs::new(&topic.configs, &ctx.topic_defaults.get()).copies_to_archive();
    let mut partitions = Vec::with_capacity(t.partitions.len());
    let mut sorted = t.partitions.clone();
    sorted.sort_by_key(|p| p.partition_index);
    for p in &sorted {
        let i = p.partition_index;
        let offsets = ctx
            .storage
            .offsets(&topic, i)
            .await
            .map_err(|e| Failure::storage(&e))?;
        let memory = ctx
            .storage
            .partition_memory(&topic, i)
            .await
            .map_err(|e| Failure::storage(&e))?;
        let segments = ctx
            .storage
            .segments(&topic, i)
            .await
            .map_err(|e| Failure::storage(&e))?;
        let archived = segments.iter().filter(|s| s.path.is_some()).count();
        let quarantined = segments.iter().filter(|s| s.quarantine.is_some()).count();
        // Those the worker will archive (not wholly below the log start).
        let waiting = segments
            .iter()
            .filter(|s| archives && s.wants_archiving() && s.last >= offsets.log_start_offset)
            .map(|s| s.sealed_ms)
            .min();
        partitions.push(json!({
            "partition": i,
            "leader": *p.leader_id,
            "log_start_offset": offsets.log_start_offset,
            "local_start_offset": offsets.local_start_offset,
            "high_watermark": offsets.high_watermark,
            "redis_bytes": memory,
            "segments_sealed": segments.len(),
            "segments_archived": archived,
            "segments_quarantined": quarantined,
            "archive_lag_ms": waiting.map_or(0, |sealed| (now - sealed).max(0)),
        }));
    }
    // The configs only to who may describe them (DescribeConfigs: READ or
    // WRITE does not imply DESCRIBE_CONFIGS).
    if !api::authorized(ctx, client, Operation::DescribeConfigs, ResourceType::Topic, name) {
        return Ok(json!({
            "name": name,
            "topic_id": topic.id.to_string(),
            "partitions": partitions,
        }));
    }
    let configs: BTreeMap<&str, Value> =
        api::describe_configs::topic_configs(&ctx.topic_defaults.get(), &topic.configs)
            .iter()
            .map(|c| {
                let current = c.current();
                let source = match current.source {
                    api::describe_configs::DYNAMIC_TOPIC_CONFIG => "topic",
                    api::describe_configs::DEFAULT_CONFIG => "default",
                    api::describe_configs::DYNAMIC_DEFAULT_BROKER_CONFIG => "cluster",
                    _ => "broker",
                };
                (c.name, json!({"value": current.value, "source": source}))
            })
            .collect();
    Ok(json!({
        "name": name,
        "topic_id": topic.id.to_string(),
        "partitions": partitions,
        "configs": configs,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTopic {
    name: String,
    #[serde(default)]
    partitions: Option<i32>,
    #[serde(default)]
    configs: BTreeMap<String, String>,
}

async fn create_topic(
    State(ctx): State<Arc<Context>>,
    Caller(client): Caller,
    new: Result<Json<NewTopic>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), Failure> {
    let new = body(new)?;
    let topic = CreatableTopic::default()
        .with_name(TopicName(api::str_bytes(new.name.clone())))
        .with_num_partitions(new.partitions.unwrap_or(-1))
        .with_replication_factor(-1)
        .with_configs(
            new.configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(api::str_bytes(k.clone()))
                        .with_value(Some(api::str_bytes(v.clone())))
                })
                .collect(),
        );
    let request = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(30_000);
    let ResponseKind::CreateTopics(r) = kafka(
        &ctx,
        &client,
        ApiKey::CreateTopics,
        RequestKind::CreateTopics(request),
    )
    .await?
    else {
        unreachable!("CreateTopics answers CreateTopics");
    };
    let result = r.topics.first().ok_or_else(|| Failure::bad("no result"))?;
    if result.error_code != 0 {
        return Err(Failure::kafka(result.error_code, result.error_message.as_deref()));
    }
    tracing::info!(principal = %client.principal, topic = new.name, "admin API: topic created");
    Ok((
        StatusCode::CREATED,
        Json(described_after_change(&ctx, &client, &new.name).await?),
    ))
}

/// A topic just changed, as [`describe_topic`] describes it; only its name
/// for a caller that may change it but not describe it (CREATE or
/// ALTER_CONFIGS without DESCRIBE): the change is made, and a 403 would say
/// it was refused.
async fn described_after_change(ctx: &Context, client: &Client, name: &str) -> Result<Value, Failure> {
    if api::authorized(ctx, client, Operation::Describe, ResourceType::Topic, name) {
        describe_topic(ctx, client, name).await
    } else {
        Ok(json!({ "name": name }))
    }
}

async fn delete_topic(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
    Caller(client): Caller,
) -> Answer {
    let request = DeleteTopicsRequest::default()
        .with_topics(vec![
            DeleteTopicState::default().with_name(Some(TopicName(api::str_bytes(name.clone())))),
        ])
        .with_timeout_ms(30_000);
    let ResponseKind::DeleteTopics(r) = kafka(
        &ctx,
        &client,
        ApiKey::DeleteTopics,
        RequestKind::DeleteTopics(request),
    )
    .await?
    else {
        unreachable!("DeleteTopics answers DeleteTopics");
    };
    let result = r.responses.first().ok_or_else(|| Failure::bad("no result"))?;
    if result.error_code != 0 {
        return Err(Failure::kafka(result.error_code, result.error_message.as_deref()));
    }
    tracing::info!(principal = %client.principal, topic = name, "admin API: topic deleted");
    Ok(Json(json!({ "deleted": name })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigChanges {
    /// Name → new value, or `null` to remove the override.
    configs: BTreeMap<String, Option<String>>,
}

async fn alter_topic(
    State(ctx): State<Arc<Context>>,
    Path(name): Path<String>,
    Caller(client): Caller,
    changes: Result<Json<ConfigChanges>, JsonRejection>,
) -> Answer {
    let changes = body(changes)?;
    if !api::authorized(&ctx, &client, Operation::AlterConfigs, ResourceType::Topic, &name) {
        return Err(Failure::kafka(
            ResponseError::TopicAuthorizationFailed.code(),
            None,
        ));
    }
    if changes.configs.is_empty() {
        return Err(Failure::bad("no configs to change"));
    }
    let alteration = api::alter_configs::Alteration::Edit(
        changes
            .configs
            .into_iter()
            .map(|(name, value)| {
                let change = match value {
                    Some(v) => api::alter_configs::Change::Set(v),
                    None => api::alter_configs::Change::Delete,
                };
                (name, change)
            })
            .collect(),
    );
    api::alter_configs::alter_topic(&ctx, &client, "admin API", &name, &alteration, false)
        .await
        .map_err(|(code, message)| Failure::kafka(code, Some(message.as_str())))?;
    described_after_change(&ctx, &client, &name).await.map(Json)
}

/// Every gateway's ListGroups, merged (each lists the groups it
/// coordinates), and the gateways that did not answer (their groups are
/// left out).
async fn list_all_groups(
    ctx: &Context,
    client: &Client,
) -> Result<(BTreeMap<String, (String, String)>, Vec<Value>), Failure> {
    let header = header(ApiKey::ListGroups);
    let request = ListGroupsRequest::default();
    // This gateway's own groups only (as a forwarded request asks): the
    // others are asked below, each on its own, so one that does not answer
    // leaves its groups out rather than failing the list.
    let own = Client {
        forwarded: true,
        ..client.clone()
    };
    let mut answers = vec![api::list_groups::handle(ctx, &own, &header, request.clone()).await];
    let me = ctx.membership.my_id();
    let mut unanswered = Vec::new();
    // Every other gateway at once: one that is slow to answer (up to the
    // forward's timeout) holds up the list once, not once per gateway.
    let asked = futures::future::join_all(
        ctx.membership
            .nodes()
            .into_iter()
            .filter(|node| node.id != me)
            .map(|node| {
                let (header, request) = (&header, &request);
                async move {
                    let answer = match node.internal_address() {
                        Some(to) => Some(api::forward(ctx, client, header, request, &to).await),
                        None => None,
                    };
                    (node, answer)
                }
            }),
    )
    .await;
    for (node, answer) in asked {
        let Some(answer) = answer else {
            unanswered.push(json!({"node_id": node.id, "error": "no internal listener"}));
            continue;
        };
        match answer {
            // Its error is its own (this gateway's answer, first, has
            // already passed the caller's authorization).
            Ok(answer) if answer.error_code == 0 => answers.push(answer),
            Ok(answer) => unanswered
                .push(json!({"node_id": node.id, "error": crate::metrics::error_name(answer.error_code)})),
            Err(code) => {
                tracing::debug!(
                    gateway = node.id,
                    code,
                    "admin API: a gateway did not list its groups"
                );
                unanswered.push(json!({"node_id": node.id, "error": crate::metrics::error_name(code)}));
            }
        }
    }
    let mut groups = BTreeMap::new();
    for answer in answers {
        if answer.error_code != 0 {
            return Err(Failure::kafka(answer.error_code, None));
        }
        for g in answer.groups {
            groups.insert(
                g.group_id.to_string(),
                (g.group_state.to_string(), g.protocol_type.to_string()),
            );
        }
    }
    Ok((groups, unanswered))
}

async fn groups(State(ctx): State<Arc<Context>>, Caller(client): Caller) -> Answer {
    use futures::StreamExt;
    let (listed, unanswered) = list_all_groups(&ctx, &client).await?;
    // The groups' lags LAG_GROUPS at a time, in the list's order.
    let (ctx, client) = (&ctx, &client);
    let groups: Vec<Value> = futures::stream::iter(listed)
        .map(|(id, (state, protocol_type))| async move {
            // ListGroups lists every group to whoever may describe the
            // cluster; a group's offsets (its lag) only to whoever may
            // describe it, as OffsetFetch answers.
            let lag = if api::authorized(
                ctx.as_ref(),
                client,
                Operation::Describe,
                ResourceType::Group,
                &id,
            ) {
                visible_lag(ctx, client, &id)
                    .await
                    .map(|p| p.iter().filter_map(|p| p.lag).fold(0i64, i64::saturating_add))
                    .ok()
            } else {
                None
            };
            json!({"group_id": id, "state": state, "protocol_type": protocol_type, "lag": lag})
        })
        .buffered(crate::metrics::LAG_GROUPS)
        .collect()
        .await;
    Ok(Json(
        json!({ "groups": groups, "unanswered_gateways": unanswered }),
    ))
}

async fn group(State(ctx): State<Arc<Context>>, Path(id): Path<String>, Caller(client): Caller) -> Answer {
    describe_group(&ctx, &client, &id).await.map(Json)
}

/// The group's committed offsets and lag of the topics the caller may
/// describe (as OffsetFetch leaves the others out).
async fn visible_lag(
    ctx: &Context,
    client: &Client,
    group: &str,
) -> ketch_storage::Result<Vec<crate::metrics::PartitionLag>> {
    let mut lag = crate::metrics::group_lag(ctx, group).await?;
    lag.retain(|p| api::authorized(ctx, client, Operation::Describe, ResourceType::Topic, &p.topic));
    Ok(lag)
}

async fn describe_group(ctx: &Context, client: &Client, id: &str) -> Result<Value, Failure> {
    let request = DescribeGroupsRequest::default().with_groups(vec![GroupId(api::str_bytes(id.to_owned()))]);
    let ResponseKind::DescribeGroups(r) = kafka(
        ctx,
        client,
        ApiKey::DescribeGroups,
        RequestKind::DescribeGroups(request),
    )
    .await?
    else {
        unreachable!("DescribeGroups answers DescribeGroups");
    };
    let g = r.groups.first().ok_or_else(|| Failure::bad("no result"))?;
    if g.error_code != 0 {
        return Err(Failure::kafka(g.error_code, g.error_message.as_deref()));
    }
    let offsets = visible_lag(ctx, client, id)
        .await
        .map_err(|e| Failure::storage(&e))?;
    if g.group_state.as_str() == "Dead" && offsets.is_empty() {
        return Err(Failure::kafka(
            ResponseError::GroupIdNotFound.code(),
            Some(&format!("group {id} does not exist")),
        ));
    }
    let members: Vec<Value> = g
        .members
        .iter()
        .map(|m| {
            json!({
                "member_id": m.member_id.as_str(),
                "group_instance_id": m.group_instance_id.as_ref().map(|i| i.as_str()),
                "client_id": m.client_id.as_str(),
                "client_host": m.client_host.as_str(),
                "assignment": consumer_assignment(&m.member_assignment),
            })
        })
        .collect();
    let total: i64 = offsets.iter().filter_map(|p| p.lag).sum();
    Ok(json!({
        "group_id": id,
        "state": g.group_state.as_str(),
        "protocol_type": g.protocol_type.as_str(),
        "protocol": g.protocol_data.as_str(),
        "coordinator": ctx.membership.group_coordinator(id).id,
        "members": members,
        "offsets": offsets,
        "lag": total,
    }))
}

/// A consumer-protocol assignment as {topic: [partitions]}; `null` for
/// other protocols or bytes that do not parse.
fn consumer_assignment(bytes: &[u8]) -> Value {
    fn parse(mut b: &[u8]) -> Option<BTreeMap<String, Vec<i32>>> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            let (head, rest) = (b.get(..n)?, b.get(n..)?);
            *b = rest;
            Some(head)
        }
        let i16_ = |b: &mut &[u8]| take(b, 2).map(|x| i16::from_be_bytes([x[0], x[1]]));
        let i32_ = |b: &mut &[u8]| take(b, 4).map(|x| i32::from_be_bytes([x[0], x[1], x[2], x[3]]));
        let _version = i16_(&mut b)?;
        let topics = i32_(&mut b)?;
        let mut out = BTreeMap::new();
        for _ in 0..topics.clamp(0, 100_000) {
            let len = usize::try_from(i16_(&mut b)?).ok()?;
            let name = std::str::from_utf8(take(&mut b, len)?).ok()?.to_owned();
            let count = i32_(&mut b)?;
            let mut partitions = Vec::new();
            for _ in 0..count.clamp(0, 1_000_000) {
                partitions.push(i32_(&mut b)?);
            }
            out.insert(name, partitions);
        }
        Some(out)
    }
    if bytes.is_empty() {
        return Value::Null;
    }
    parse(bytes).map_or(Value::Null, |a| json!(a))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reset {
    /// `earliest`, `latest` or `timestamp`.
    to: String,
    /// With `to = timestamp`: ms since the Unix epoch.
    #[serde(default)]
    timestamp: Option<i64>,
    /// Topics to reset (all their partitions); default: the partitions
    /// the group has committed offsets for.
    #[serde(default)]
    topics: Option<Vec<String>>,
}

async fn reset_offsets(
    State(ctx): State<Arc<Context>>,
    Path(id): Path<String>,
    Caller(client): Caller,
    reset: Result<Json<Reset>, JsonRejection>,
) -> Answer {
    let reset = body(reset)?;
    let timestamp = match (reset.to.as_str(), reset.timestamp) {
        ("earliest", None) => -2,
        ("latest", None) => -1,
        ("timestamp", Some(ts)) if ts >= 0 => ts,
        ("timestamp", _) => {
            return Err(Failure::bad(
                "to = timestamp needs a timestamp (ms since the epoch, ≥ 0)",
            ));
        }
        ("earliest" | "latest", Some(_)) => {
            return Err(Failure::bad("timestamp goes only with to = timestamp"));
        }
        (other, _) => {
            return Err(Failure::bad(format!(
                "to must be earliest, latest or timestamp, not {other:?}"
            )));
        }
    };
    // Kafka's reset tool refuses a group with members: they would commit over it.
    let described = describe_group(&ctx, &client, &id).await;
    let state = match &described {
        Ok(g) => g["state"].as_str().unwrap_or("").to_owned(),
        Err(f) if f.status == StatusCode::NOT_FOUND => "Dead".to_owned(),
        Err(_) => return described.map(Json),
    };
    if state != "Empty" && state != "Dead" {
        return Err(Failure::new(
            StatusCode::CONFLICT,
            "NON_EMPTY_GROUP",
            format!("group {id} is {state}: offsets can be reset only while it has no members"),
        ));
    }
    let mut partitions: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    match &reset.topics {
        Some(topics) => {
            for name in topics {
                // Before looking it up: whether a topic exists is no answer
                // for who may not describe it (ListOffsets refuses it so).
                if !api::authorized(
                    ctx.as_ref(),
                    &client,
                    Operation::Describe,
                    ResourceType::Topic,
                    name,
                ) {
                    return Err(Failure::kafka(
                        ResponseError::TopicAuthorizationFailed.code(),
                        Some(&format!("not authorized to describe topic {name}")),
                    ));
                }
                let topic = ctx
                    .storage
                    .topic(name)
                    .await
                    .map_err(|e| Failure::storage(&e))?
                    .ok_or_else(|| {
                        Failure::kafka(
                            ResponseError::UnknownTopicOrPartition.code(),
                            Some(&format!("no topic {name}")),
                        )
                    })?;
                partitions.insert(name.to_string(), (0..topic.partitions()).collect());
            }
        }
        None => {
            // The topics the caller may describe, as Kafka's tool resets
            // those its offset listing shows.
            for p in visible_lag(&ctx, &client, &id)
                .await
                .map_err(|e| Failure::storage(&e))?
            {
                if p.high_watermark.is_some() {
                    partitions.entry(p.topic).or_default().push(p.partition);
                }
            }
        }
    }
    if partitions.is_empty() {
        return Err(Failure::bad(format!(
            "group {id} has no committed offsets: name the topics to reset"
        )));
    }
    // The commit needs READ on each topic (OffsetCommit commits the topics
    // it may and refuses the others): checked for all of them first, so a
    // refused reset changes nothing.
    if let Some(name) = partitions
        .keys()
        .find(|name| !api::authorized(ctx.as_ref(), &client, Operation::Read, ResourceType::Topic, name))
    {
        return Err(Failure::kafka(
            ResponseError::TopicAuthorizationFailed.code(),
            Some(&format!(
                "not authorized to read topic {name}: no offset was reset"
            )),
        ));
    }
    let request = ListOffsetsRequest::default()
        .with_replica_id((-1).into())
        .with_topics(
            partitions
                .iter()
                .map(|(name, ps)| {
                    ListOffsetsTopic::default()
                        .with_name(TopicName(api::str_bytes(name.clone())))
                        .with_partitions(
                            ps.iter()
                                .map(|p| {
                                    ListOffsetsPartition::default()
                                        .with_partition_index(*p)
                                        .with_timestamp(timestamp)
                                        .with_current_leader_epoch(-1)
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
    let ResponseKind::ListOffsets(listed) = kafka(
        &ctx,
        &client,
        ApiKey::ListOffsets,
        RequestKind::ListOffsets(request),
    )
    .await?
    else {
        unreachable!("ListOffsets answers ListOffsets");
    };
    let mut targets: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
    for t in &listed.topics {
        for p in &t.partitions {
            if p.error_code != 0 {
                return Err(Failure::kafka(p.error_code, None));
            }
            let mut offset = p.offset;
            if offset < 0 {
                // No record at or after the timestamp: the end, as Kafka's tool does.
                let topic = ctx
                    .storage
                    .topic(&t.name)
                    .await
                    .map_err(|e| Failure::storage(&e))?;
                if let Some(topic) = topic {
                    offset = ctx
                        .storage
                        .offsets(&topic, p.partition_index)
                        .await
                        .map_err(|e| Failure::storage(&e))?
                        .high_watermark;
                }
            }
            targets
                .entry(t.name.to_string())
                .or_default()
                .push((p.partition_index, offset));
        }
    }
    let commit = OffsetCommitRequest::default()
        .with_group_id(GroupId(api::str_bytes(id.clone())))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(
            targets
                .iter()
                .map(|(name, ps)| {
                    OffsetCommitRequestTopic::default()
                        .with_name(TopicName(api::str_bytes(name.clone())))
                        .with_partitions(
                            ps.iter()
                                .map(|(p, o)| {
                                    OffsetCommitRequestPartition::default()
                                        .with_partition_index(*p)
                                        .with_committed_offset(*o)
                                        .with_committed_leader_epoch(-1)
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
    let ResponseKind::OffsetCommit(committed) = kafka(
        &ctx,
        &client,
        ApiKey::OffsetCommit,
        RequestKind::OffsetCommit(commit),
    )
    .await?
    else {
        unreachable!("OffsetCommit answers OffsetCommit");
    };
    for t in &committed.topics {
        for p in &t.partitions {
            match ResponseError::try_from_code(p.error_code) {
                None => {}
                // A member joined since the group was seen empty: nothing
                // was committed (the coordinator refuses every partition).
                Some(
                    ResponseError::UnknownMemberId
                    | ResponseError::RebalanceInProgress
                    | ResponseError::IllegalGeneration,
                ) => {
                    return Err(Failure::new(
                        StatusCode::CONFLICT,
                        "NON_EMPTY_GROUP",
                        format!("group {id} has members again: offsets can be reset only while it has none"),
                    ));
                }
                Some(_) => return Err(Failure::kafka(p.error_code, None)),
            }
        }
    }
    tracing::info!(principal = %client.principal, group = id, to = reset.to, "admin API: group offsets reset");
    describe_group(&ctx, &client, &id).await.map(Json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_assignments_parse_and_garbage_is_null() {
        let mut b = vec![0, 0, 0, 0, 0, 1, 0, 1, b't'];
        b.extend_from_slice(&2i32.to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes());
        b.extend_from_slice(&3i32.to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(consumer_assignment(&b), json!({"t": [0, 3]}));
        assert_eq!(consumer_assignment(&b[..7]), Value::Null);
        assert_eq!(consumer_assignment(&[]), Value::Null);
    }

    #[test]
    fn kafka_errors_become_the_statuses_clients_expect() {
        let status = |e: ResponseError| Failure::kafka(e.code(), None).status;
        assert_eq!(
            status(ResponseError::UnknownTopicOrPartition),
            StatusCode::NOT_FOUND
        );
        assert_eq!(status(ResponseError::TopicAlreadyExists), StatusCode::CONFLICT);
        assert_eq!(status(ResponseError::InvalidConfig), StatusCode::BAD_REQUEST);
        assert_eq!(
            status(ResponseError::TopicAuthorizationFailed),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status(ResponseError::KafkaStorageError),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            status(ResponseError::ThrottlingQuotaExceeded),
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}
