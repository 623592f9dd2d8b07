//! ketch-gateway: the Kafka listener, the Kafka APIs and the HTTP endpoints.
//!
//! [`run`] starts both listeners and serves until the shutdown signal fires,
//! then lets in-flight requests finish. The `ketch` binary (`main.rs`) only
//! parses settings and calls it; tests may run it in-process.

pub mod api;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod group;
pub mod http;
pub mod membership;
pub mod memory;
pub mod server;
pub mod storage;

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
    /// This gateway's node id and advertised address.
    pub node: Node,
    /// Turns true when the gateway shuts down; long waits end early.
    pub shutdown: watch::Receiver<bool>,
    /// The live gateways; partition leaders and group coordinators.
    pub membership: membership::Membership,
    /// The classic consumer groups this gateway coordinates.
    pub groups: group::Coordinator,
    /// The storage worker's and remote reader's counters (`/metrics`).
    pub tiering_metrics: Arc<ketch_tiering::Metrics>,
}

/// A gateway as clients see it in Metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub id: i32,
    pub host: String,
    pub port: u16,
}

impl Context {
    /// A context over `storage`; `tiering_metrics` are the storage worker's
    /// and remote reader's (rendered at `/metrics`).
    pub fn new(
        settings: Settings,
        storage: Arc<dyn storage::Storage>,
        tiering_metrics: Arc<ketch_tiering::Metrics>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let node = Node {
            id: settings.broker.id,
            host: settings.advertised_host(),
            port: settings.advertised_port(),
        };
        let membership = membership::Membership::new(node.clone());
        let groups = group::Coordinator::with_storage(&settings.groups, storage.clone());
        Self {
            settings,
            storage,
            node,
            shutdown,
            membership,
            groups,
            tiering_metrics,
        }
    }
}

/// Checks (and migrates) the Redis layout version, with a bounded wait.
async fn check_layout(store: &Store, me: &str) -> Result<(), ketch_storage::StorageError> {
    let check = tokio::time::timeout(std::time::Duration::from_secs(90), store.ensure_layout(me));
    let outcome = check.await.map_err(|_| {
        ketch_storage::StorageError::Unavailable("checking the layout took over 90 s".to_owned())
    })??;
    match outcome {
        ketch_storage::LayoutCheck::Migrated { from } => {
            tracing::info!(
                from,
                to = ketch_storage::LAYOUT_VERSION,
                "migrated the Redis layout"
            )
        }
        other => tracing::debug!(?other, "Redis layout checked"),
    }
    Ok(())
}

/// Redis was unreachable at start: checks the layout once it answers. A
/// layout newer than this gateway stops the process — it must not serve
/// data it does not understand.
async fn check_layout_until_done(store: Store, me: String) {
    loop {
        match check_layout(&store, &me).await {
            Ok(()) => return,
            Err(e @ ketch_storage::StorageError::LayoutTooNew { .. }) => {
                tracing::error!("{e}; stopping");
                eprintln!("ketch: {e}");
                std::process::exit(1);
            }
            Err(e) => tracing::debug!(error = %e, "Redis layout not checked yet"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Binds both listeners, serves until `shutdown` turns true, then waits for
/// in-flight requests (at most `broker.shutdown_timeout`).
pub async fn run(settings: Settings, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let store = Store::new(&StoreConfig::from_settings(&settings))?;
    let me = format!(
        "node {} pid {} on {}",
        settings.broker.id,
        std::process::id(),
        settings.broker.listen
    );
    match check_layout(&store, &me).await {
        Ok(()) => {}
        Err(ketch_storage::StorageError::LayoutTooNew { found, supported }) => {
            anyhow::bail!(ketch_storage::StorageError::LayoutTooNew { found, supported })
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot check the Redis layout version yet; checking again until Redis answers");
            tokio::spawn(check_layout_until_done(store.clone(), me));
        }
    }
    let kafka = TcpListener::bind(settings.broker.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (broker.listen): {e}", settings.broker.listen))?;
    let http = TcpListener::bind(settings.http.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (http.listen): {e}", settings.http.listen))?;
    let tiering_metrics = Arc::new(ketch_tiering::Metrics::default());
    let tiers = ketch_tiering::Tiers::new(store.clone(), &settings.tiering, tiering_metrics.clone());
    let storage = Arc::new(storage::Tiered {
        store: store.clone(),
        tiers,
    });
    let ctx = Arc::new(Context::new(settings, storage, tiering_metrics, shutdown.clone()));
    tracing::info!(
        kafka = %ctx.settings.broker.listen,
        http = %ctx.settings.http.listen,
        advertised = %format!("{}:{}", ctx.node.host, ctx.node.port),
        node_id = ctx.node.id,
        redis = %ctx.settings.redis.url,
        "ketch serving"
    );
    if let Err(e) = store.ping().await {
        tracing::warn!(error = %e, "redis is not reachable yet; serving retriable errors until it is");
    }
    let http_task = tokio::spawn(http::serve(http, ctx.clone(), shutdown.clone()));
    let membership_task = tokio::spawn(ctx.membership.clone().run(
        store.clone(),
        ctx.settings.cluster.heartbeat_interval.get(),
        ctx.settings.cluster.node_timeout.get(),
        shutdown.clone(),
    ));
    let membership = ctx.membership.clone();
    let me = ctx.node.id;
    let leads: ketch_tiering::Leads =
        Arc::new(move |topic, partition| membership.partition_leader(&topic.id, partition).id == me);
    let worker = ketch_tiering::StorageWorker::new(
        store,
        &ctx.settings.tiering,
        ctx.settings.producers.expiration.get(),
        ctx.tiering_metrics.clone(),
    );
    let worker_task = tokio::spawn(worker.run(leads, shutdown.clone()));
    server::serve(kafka, ctx, shutdown).await;
    worker_task.abort();
    http_task.abort();
    // Deregisters this gateway so the others take over its partitions and groups at once.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), membership_task).await;
    Ok(())
}
