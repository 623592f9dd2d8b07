//! ketch-gateway: the Kafka listener, the Kafka APIs and the HTTP endpoints.
//!
//! [`run`] starts both listeners and serves until the shutdown signal fires,
//! then lets in-flight requests finish. The `ketch` binary (`main.rs`) only
//! parses settings and calls it; tests may run it in-process.

pub mod admin;
pub mod api;
pub mod auth;
pub mod cluster_configs;
pub mod forward;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod group;
pub mod http;
pub mod membership;
pub mod memory;
pub mod metrics;
pub mod offset_expiry;
pub mod quotas;
pub mod server;
pub mod storage;
pub mod time;
pub mod transactions;

use std::sync::Arc;

use ketch_config::Settings;
use ketch_storage::{Store, StoreConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What every request handler can reach.
pub struct Context {
    pub settings: Settings,
    /// Topics, partitions and offsets: Redis and the archive, or memory.
    pub storage: Arc<dyn storage::Storage>,
    /// Turns true when the gateway shuts down; long waits end early.
    pub shutdown: watch::Receiver<bool>,
    /// This gateway's node id and addresses, the live gateways, partition
    /// leaders and group coordinators.
    pub membership: membership::Membership,
    /// Sends group requests to their coordinator's internal listener.
    pub forwarder: forward::Forwarder,
    /// The classic consumer groups this gateway coordinates.
    pub groups: group::Coordinator,
    /// The storage worker's and remote reader's counters (`/metrics`).
    pub tiering_metrics: Arc<ketch_tiering::Metrics>,
    /// TLS, SASL and ACLs.
    pub security: auth::Security,
    /// Request, connection and fetch-wait metrics.
    pub requests: Arc<metrics::Requests>,
    /// Produced and fetched records and bytes per topic.
    pub topic_counters: metrics::TopicCounters,
    /// The lag of the groups this gateway coordinates, as last computed.
    pub group_lags: metrics::GroupLags,
    /// Redis memory as last checked (`/ready`, the admin API).
    pub redis_health: std::sync::RwLock<metrics::RedisHealth>,
    /// Decided transactions this gateway is finishing in the background.
    pub finishing: transactions::Finishing,
    /// Transactional ids' producers, as produce requests were checked.
    pub verified_producers: transactions::VerifiedProducers,
    /// The client quotas and this gateway's measure of each client's rates.
    pub quotas: quotas::ClientQuotas,
    /// The topic config defaults: Kafka's, ketch's settings, and the
    /// cluster-wide ones set at run time.
    pub topic_defaults: cluster_configs::ClusterDefaults,
}

/// A gateway: its node id, the address clients are told, and where other
/// gateways forward requests to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: i32,
    pub host: String,
    pub port: u16,
    /// The internal listener (host, port), if the gateway has one.
    pub internal: Option<(String, u16)>,
    /// Clients see it under an id derived from its advertised address
    /// ([`membership::address_id`]) even when no other gateway advertises
    /// that address: its node id was claimed (no `broker.id`) and it
    /// advertises an address other than the one it listens on (a load
    /// balancer's, a NAT's), which other gateways may come to share.
    pub by_address: bool,
    /// Every Kafka listener's advertised address, the first being `host`
    /// and `port` (empty for a gateway from before named listeners).
    pub listeners: Vec<ListenerAddress>,
}

/// A gateway's advertised address on one named listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerAddress {
    pub name: String,
    pub host: String,
    pub port: u16,
    /// As [`Node::by_address`], for this listener.
    pub by_address: bool,
}

impl Node {
    /// This gateway as clients of `listener` see it: with that listener's
    /// address. The first listener for an empty name, and for a listener
    /// the gateway does not have (gateways are meant to share their
    /// listener names; one from before named listeners has only one).
    pub fn on(&self, listener: &str) -> Node {
        let (host, port, by_address) = self.address_on(listener);
        Node {
            host: host.to_owned(),
            port,
            by_address,
            ..self.clone()
        }
    }

    /// The advertised host and port on `listener` (as [`Node::on`] picks
    /// it) and whether it is presented by address, without a copy.
    pub fn address_on(&self, listener: &str) -> (&str, u16, bool) {
        match self
            .listeners
            .iter()
            .find(|l| !listener.is_empty() && l.name == listener)
        {
            Some(l) => (&l.host, l.port, l.by_address),
            None => (&self.host, self.port, self.by_address),
        }
    }

    /// `host:port` of the internal listener, for dialling.
    pub fn internal_address(&self) -> Option<String> {
        let (host, port) = self.internal.as_ref()?;
        Some(if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        })
    }
}

impl Context {
    /// A context over `storage`; `tiering_metrics` are the storage worker's
    /// and remote reader's (rendered at `/metrics`). The node id is
    /// `broker.id`, or [`membership::UNASSIGNED`] until one is claimed.
    pub fn new(
        settings: Settings,
        storage: Arc<dyn storage::Storage>,
        tiering_metrics: Arc<ketch_tiering::Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let security = auth::Security::without_files(&settings);
        Self::with_internal(settings, storage, tiering_metrics, shutdown, None, security)
    }

    /// [`Context::new`] for a gateway whose internal listener other
    /// gateways reach at `internal` (host, port).
    pub fn with_internal(
        settings: Settings,
        storage: Arc<dyn storage::Storage>,
        tiering_metrics: Arc<ketch_tiering::Metrics>,
        shutdown: watch::Receiver<bool>,
        internal: Option<(String, u16)>,
        security: auth::Security,
    ) -> Self {
        let claimed = settings.broker.id.is_none();
        let listeners: Vec<ListenerAddress> = settings
            .listeners()
            .unwrap_or_default()
            .into_iter()
            .map(|l| ListenerAddress {
                name: l.name,
                host: l.advertised_host,
                port: l.advertised_port,
                by_address: claimed && l.advertises_elsewhere,
            })
            .collect();
        let first = listeners.first();
        let node = Node {
            id: settings.broker.id.unwrap_or(membership::UNASSIGNED),
            host: first.map_or_else(|| settings.advertised_host(), |l| l.host.clone()),
            port: first.map_or_else(|| settings.advertised_port(), |l| l.port),
            internal,
            by_address: first.is_some_and(|l| l.by_address),
            listeners,
        };
        let membership = membership::Membership::new(node);
        let owns: group::Owns = Arc::new(membership.clone());
        let groups = group::Coordinator::with_storage(&settings.groups, storage.clone(), owns);
        let forwarder = forward::Forwarder::new(settings.redis.connect_timeout.get(), shutdown.clone());
        let quotas = quotas::ClientQuotas::new(&settings.quotas);
        let topic_defaults = cluster_configs::ClusterDefaults::new(&settings.topics);
        Self {
            settings,
            storage,
            shutdown,
            membership,
            forwarder,
            groups,
            tiering_metrics,
            security,
            requests: Arc::default(),
            topic_counters: metrics::TopicCounters::default(),
            group_lags: metrics::GroupLags::default(),
            redis_health: std::sync::RwLock::default(),
            finishing: transactions::Finishing::default(),
            verified_producers: transactions::VerifiedProducers::default(),
            quotas,
            topic_defaults,
        }
    }
}

/// Checks (and migrates) the Redis layout version, with a bounded wait.
async fn check_layout(store: &Store, me: &str) -> Result<(), ketch_storage::StorageError> {
    store.check_server_version().await?;
    let check = tokio::time::timeout(std::time::Duration::from_secs(90), store.ensure_layout(me));
    let outcome = check.await.map_err(|_| {
        ketch_storage::StorageError::Unavailable("checking the layout took over 90 s".to_owned())
    })??;
    match outcome {
        ketch_storage::LayoutCheck::Migrated { from, to } => {
            tracing::info!(from, to, "migrated the Redis layout")
        }
        other => tracing::debug!(?other, "Redis layout checked"),
    }
    if store.layout_final() {
        tracing::info!(
            version = ketch_storage::LAYOUT_VERSION,
            "the Redis layout is final: writing compact producer state"
        );
    }
    Ok(())
}

/// Redis was unreachable at start: checks the layout once it answers. A
/// layout newer than this gateway stops the process — it must not serve
/// data it does not understand — as does a server older than 7.0.
async fn check_layout_until_done(store: Store, me: String, checked: watch::Sender<bool>) {
    loop {
        match check_layout(&store, &me).await {
            Ok(()) => {
                checked.send_replace(true);
                return;
            }
            Err(
                e @ (ketch_storage::StorageError::LayoutTooNew { .. }
                | ketch_storage::StorageError::ServerTooOld { .. }),
            ) => {
                tracing::error!("{e}; stopping");
                eprintln!("ketch: {e}");
                std::process::exit(1);
            }
            Err(e) => tracing::debug!(error = %e, "Redis layout not checked yet"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Set on the first shutdown signal while the gateway still serves for
/// `broker.shutdown_delay`: `/ready` answers 503 meanwhile.
pub static DRAINING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Binds both listeners, serves until `shutdown` turns true, then waits for
/// in-flight requests (at most `broker.shutdown_timeout`).
pub async fn run(settings: Settings, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let store = Store::new(&StoreConfig::from_settings(&settings))?;
    let me = format!(
        "node {} pid {} on {}",
        settings
            .broker
            .id
            .map_or_else(|| "(unclaimed)".to_owned(), |id| id.to_string()),
        std::process::id(),
        settings.broker.listen
    );
    // This gateway registers (writes `ketch:brokers`) only once the layout is
    // checked: a namespace whose only key is a registry entry would look
    // like data from before layouts were recorded to a gateway checking it.
    let (layout_tx, layout_checked) = watch::channel(false);
    match check_layout(&store, &me).await {
        Ok(()) => {
            layout_tx.send_replace(true);
        }
        Err(
            e @ (ketch_storage::StorageError::LayoutTooNew { .. }
            | ketch_storage::StorageError::ServerTooOld { .. }),
        ) => {
            anyhow::bail!(e)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot check the Redis layout version yet; checking again until Redis answers");
            tokio::spawn(check_layout_until_done(store.clone(), me, layout_tx));
        }
    }
    let security = auth::Security::load(&settings)?;
    let per_address = server::PerAddress::new(&settings.broker).await?;
    let mut endpoints = Vec::new();
    for listener in settings.listeners()? {
        let socket = TcpListener::bind(listener.listen).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {} (listener {}): {e}",
                listener.listen,
                listener.name
            )
        })?;
        endpoints.push(server::Endpoint { socket, listener });
    }
    let first_listen = endpoints[0].listener.listen;
    let http = TcpListener::bind(settings.http.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (http.listen): {e}", settings.http.listen))?;
    let internal_listen = settings
        .cluster
        .internal_listen
        .unwrap_or_else(|| std::net::SocketAddr::new(first_listen.ip(), 0));
    let internal = TcpListener::bind(internal_listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {internal_listen} (cluster.internal_listen): {e}"))?;
    let internal_port = internal.local_addr()?.port();
    let internal_host = forward::advertised_internal_host(
        settings.cluster.internal_advertised_host.as_deref(),
        &internal_listen,
    );
    let tiering_metrics = Arc::new(ketch_tiering::Metrics::default());
    let tiers = ketch_tiering::Tiers::new(store.clone(), &settings.tiering, tiering_metrics.clone());
    let storage = Arc::new(storage::Tiered {
        store: store.clone(),
        tiers,
    });
    let ctx = Arc::new(Context::with_internal(
        settings,
        storage,
        tiering_metrics,
        shutdown.clone(),
        Some((internal_host, internal_port)),
        security,
    ));
    let registering = membership::Registering {
        configured: ctx.settings.broker.id,
        heartbeat_interval: ctx.settings.cluster.heartbeat_interval.get(),
        node_timeout: ctx.settings.cluster.node_timeout.get(),
        layout_step_delay: ctx.settings.cluster.layout_step_delay.get(),
    };
    // Take the node id before serving when Redis answers (a configured id
    // still held by a crashed incarnation is waited for here); otherwise the
    // membership task registers once Redis is up, and until then the gateway
    // serves retriable errors.
    if *layout_checked.borrow() {
        match ctx.membership.register(&store, &registering).await {
            Ok(_) => {}
            Err(membership::RegisterError::Unavailable(e)) => {
                tracing::warn!(error = %e, "cannot register in Redis yet; registering once it answers");
            }
            Err(e) => anyhow::bail!(e),
        }
    }
    let node = ctx.membership.me();
    let listeners: Vec<String> = endpoints
        .iter()
        .map(|e| {
            format!(
                "{}://{} ({})",
                e.listener.name,
                e.listener.listen,
                e.listener.protocol.name()
            )
        })
        .collect();
    tracing::info!(
        kafka = %listeners.join(", "),
        http = %ctx.settings.http.listen,
        internal = %internal.local_addr()?,
        advertised = %format!("{}:{}", node.host, node.port),
        internal_advertised = %node.internal_address().unwrap_or_default(),
        node_id = node.id,
        // Never the password: the URL's user information and query are left out.
        redis = %api::describe_log_dirs::redis_log_dir(&ctx.settings.redis),
        "ketch serving"
    );
    if let Err(e) = store.ping().await {
        tracing::warn!(error = %e, "redis is not reachable yet; serving retriable errors until it is");
    } else {
        if let Err(e) = cluster_configs::reload(&ctx).await {
            // keep_current below retries; until then Kafka's defaults apply.
            tracing::warn!(error = %e, "cannot read the cluster-wide topic defaults yet");
        }
        // Kafka's listeners serve once the authorizer has loaded the ACLs;
        // until then (Redis away) client connections are closed.
        if ctx.security.acls.enabled()
            && let Err(e) = ctx.security.acls.load(ctx.storage.acls()).await
        {
            tracing::warn!(error = %e, "cannot read the ACLs yet");
        }
    }
    let http_task = tokio::spawn(http::serve(http, ctx.clone(), shutdown.clone()));
    let internal_task = tokio::spawn(forward::serve(internal, ctx.clone(), shutdown.clone()));
    let membership_task = tokio::spawn(ctx.membership.clone().run(
        store.clone(),
        registering,
        layout_checked,
        shutdown.clone(),
    ));
    let handover_task = tokio::spawn(hand_over_groups(ctx.clone()));
    let metrics_task = tokio::spawn(metrics::upkeep(ctx.clone()));
    let transactions_task = tokio::spawn(transactions::sweep(ctx.clone()));
    let offset_expiry_task = tokio::spawn(offset_expiry::run(ctx.clone()));
    let quotas_task = tokio::spawn(quotas::keep_current(ctx.clone()));
    let defaults_task = tokio::spawn(cluster_configs::keep_current(ctx.clone()));
    let acl_task = ctx
        .security
        .acls
        .enabled()
        .then(|| tokio::spawn(api::acls::keep_current(ctx.clone())));
    let tls_task = ctx
        .security
        .tls
        .clone()
        .map(|tls| tokio::spawn(tls.watch(shutdown.clone())));
    let membership = ctx.membership.clone();
    let leads: ketch_tiering::Leads =
        Arc::new(move |topic, partition| membership.leads(&topic.id, partition));
    let worker = ketch_tiering::StorageWorker::new(
        store,
        &ctx.settings.tiering,
        ctx.settings.producers.expiration.get(),
        ctx.tiering_metrics.clone(),
    );
    let grace = ctx.settings.broker.shutdown_timeout.get();
    let worker_task = tokio::spawn(worker.run(leads, shutdown.clone(), grace));
    let finishing = ctx.finishing.clone();
    server::serve(endpoints, ctx, per_address, shutdown).await;
    // Transactions decided and answered still get their markers written
    // (else the id's coordinator would finish them after FINISH_GRACE).
    finishing.wait_all(std::time::Duration::from_secs(10)).await;
    // The storage worker releases its leases at once and stops its tasks
    // within `grace`; its partitions' new leaders need not wait for the
    // leases to expire.
    let _ = tokio::time::timeout(grace, worker_task).await;
    for task in [acl_task, tls_task].into_iter().flatten() {
        task.abort();
    }
    http_task.abort();
    internal_task.abort();
    handover_task.abort();
    metrics_task.abort();
    transactions_task.abort();
    offset_expiry_task.abort();
    quotas_task.abort();
    defaults_task.abort();
    // Deregisters this gateway so the others take over its partitions and groups at once.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), membership_task).await;
    Ok(())
}

/// Loads the groups with committed offsets or a snapshot that this gateway
/// coordinates now and does not hold, as Kafka's new coordinator loads
/// every group of its offsets partition: a group whose members went away
/// with its old coordinator then has its members' sessions run out here,
/// empties, and its offsets and snapshot start their retention (nothing
/// else would load it: offsets are read from Redis without the group, and
/// no member will ask; a group that never committed would otherwise keep
/// its snapshot, and come back with its dead members, for ever).
async fn adopt_groups(ctx: Arc<Context>) {
    // Each listing that can be read (one failing takes the other's groups
    // over all the same).
    let (with_offsets, with_snapshots) = tokio::join!(
        ctx.storage.groups_with_offsets(),
        ctx.storage.groups_with_snapshots()
    );
    let mut groups = std::collections::BTreeSet::new();
    for listed in [with_offsets, with_snapshots] {
        match listed {
            Ok(listed) => groups.extend(listed),
            Err(e) => tracing::warn!(error = %e, "cannot list the groups to take over"),
        }
    }
    let mut adopted = 0;
    for group in groups {
        if !ctx.membership.coordinates(&group) || ctx.groups.in_memory(&group) {
            continue;
        }
        match ctx.groups.adopt(&group).await {
            Ok(true) => adopted += 1,
            Ok(false) => {}
            Err(error) => tracing::debug!(%group, ?error, "group not taken over"),
        }
    }
    if adopted > 0 {
        tracing::info!(
            groups = adopted,
            "took over the groups this gateway coordinates now"
        );
    }
}

/// When the live gateways change, forgets the groups another gateway
/// coordinates now: their members reach the new coordinator, which loads
/// what it needs from Redis (Kafka's coordinator unloads a group when it
/// loses its offsets partition). Parked requests of a forgotten group are
/// answered with a retriable error.
async fn hand_over_groups(ctx: Arc<Context>) {
    let mut changes = ctx.membership.subscribe();
    while changes.changed().await.is_ok() {
        let membership = ctx.membership.clone();
        let handed = if membership.take_forget_all() {
            ctx.groups.retain(|_| false)
        } else {
            ctx.groups.retain(|group| membership.coordinates(group))
        };
        if handed > 0 {
            tracing::info!(groups = handed, "handed groups over to their new coordinators");
        }
        tokio::spawn(adopt_groups(ctx.clone()));
        let peers: Vec<String> = membership
            .nodes()
            .iter()
            .filter_map(Node::internal_address)
            .collect();
        ctx.forwarder.keep_peers(&peers);
    }
}
