//! The HTTP listener: `/health` (the process is alive), `/ready` (Redis
//! answers and this gateway has registered in it) and `/metrics`
//! (Prometheus text).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::Context;

pub async fn serve(listener: TcpListener, ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let app = Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(ctx);
    let stop = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
        tracing::error!(error = %e, "http listener failed");
    }
}

async fn ready(State(ctx): State<Arc<Context>>) -> (StatusCode, String) {
    match ctx.storage.ping().await {
        Ok(()) if ctx.membership.joined() => (StatusCode::OK, "ready\n".to_owned()),
        Ok(()) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: not yet registered in ketch:brokers\n".to_owned(),
        ),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
    }
}

async fn metrics(
    State(ctx): State<Arc<Context>>,
) -> ([(axum::http::header::HeaderName, &'static str); 1], String) {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        ctx.tiering_metrics.render(),
    )
}
