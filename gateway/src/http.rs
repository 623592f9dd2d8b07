//! The HTTP listener: `/health` (the process is alive), `/ready` (Redis
//! answers, has memory for writes, and this gateway has registered in it),
//! `/metrics` (Prometheus text), the admin API under `/api/v1` and the
//! console at `/` ([`crate::admin`]).
//!
//! With `http.tls` it serves HTTPS (the Kafka listeners' certificate, no
//! client certificates). With `http.auth` every path but `http.open_paths`
//! needs HTTP Basic credentials of a SCRAM user or a bearer JWT (checked as
//! OAUTHBEARER tokens are), and with ACLs on, DESCRIBE on the cluster.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;

use crate::Context;
use crate::auth::acl::{CLUSTER_NAME, Operation, ResourceType};

pub async fn serve(listener: TcpListener, ctx: Arc<Context>, shutdown: watch::Receiver<bool>) {
    let app = Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .merge(crate::admin::routes(ctx.clone()))
        .layer(middleware::from_fn_with_state(ctx.clone(), authenticate))
        .with_state(ctx.clone());
    let stop = {
        let mut shutdown = shutdown.clone();
        async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        }
    };
    let served = match ctx.security.tls.clone().filter(|_| ctx.settings.http.tls) {
        Some(tls) => {
            let (tx, rx) = mpsc::channel(64);
            let local = listener.local_addr();
            let acceptor = tokio::spawn(accept_tls(listener, tls, tx, shutdown.clone()));
            let listener = TlsListener { rx, local };
            let served = axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
                .with_graceful_shutdown(stop)
                .await;
            acceptor.abort();
            served
        }
        None => {
            axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
                .with_graceful_shutdown(stop)
                .await
        }
    };
    if let Err(e) = served {
        tracing::error!(error = %e, "http listener failed");
    }
}

/// A request's client address (for ACL host checks), over TCP or TLS.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TcpListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// TLS connections whose handshake completed, for axum.
struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(accepted) => accepted,
            // The acceptor stopped (shutdown): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        match &self.local {
            Ok(addr) => Ok(*addr),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}

/// Accepts TCP connections and completes their TLS handshakes (each on its
/// own task, bounded in time, so a slow client holds up no other).
async fn accept_tls(
    listener: TcpListener,
    tls: Arc<crate::auth::tls::Tls>,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let (socket, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "http listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = tls.http_acceptor();
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(socket)).await {
                Ok(Ok(stream)) => {
                    let _ = ready.send((stream, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "http listener: TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "http listener: TLS handshake timed out"),
            }
        });
    }
}

/// `http.auth`: Basic or Bearer credentials on every path but the open ones.
async fn authenticate(State(ctx): State<Arc<Context>>, mut request: Request, next: Next) -> Response {
    let http = &ctx.settings.http;
    if !http.auth || http.open_paths.iter().any(|p| p == request.uri().path()) {
        return next.run(request).await;
    }
    let credentials = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let principal = match credentials.as_deref().and_then(|c| c.split_once(' ')) {
        Some((scheme, basic)) if scheme.eq_ignore_ascii_case("basic") => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(basic.trim())
                .ok()
                .and_then(|d| String::from_utf8(d).ok());
            match decoded.as_deref().and_then(|d| d.split_once(':')) {
                Some((user, password)) => {
                    ctx.security
                        .sasl
                        .basic(ctx.storage.as_ref(), user, password)
                        .await
                }
                None => Err("malformed Basic credentials".to_owned()),
            }
        }
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => {
            ctx.security.sasl.bearer(token.trim()).await
        }
        _ => Err("authentication required".to_owned()),
    };
    let principal = match principal {
        Ok(principal) => principal,
        Err(message) => {
            tracing::info!(
                path = request.uri().path(),
                reason = message,
                "HTTP request not authenticated"
            );
            let mut response = (StatusCode::UNAUTHORIZED, format!("{message}\n")).into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"ketch\", Bearer realm=\"ketch\""),
            );
            return response;
        }
    };
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<Peer>>()
        .map_or_else(|| "*".to_owned(), |c| c.0.0.ip().to_string());
    if !ctx.security.acls.authorize(
        &principal,
        &peer,
        Operation::Describe,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return (
            StatusCode::FORBIDDEN,
            format!("{principal} may not DESCRIBE the cluster\n"),
        )
            .into_response();
    }
    request
        .extensions_mut()
        .insert(crate::admin::Principal(Arc::from(principal.as_str())));
    next.run(request).await
}

async fn ready(State(ctx): State<Arc<Context>>) -> (StatusCode, String) {
    if let Err(e) = ctx.storage.ping().await {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n"));
    }
    if !ctx.membership.joined() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: not yet registered in ketch:brokers\n".to_owned(),
        );
    }
    let health = crate::metrics::check_redis(&ctx).await;
    let warnings: String = health
        .warnings()
        .iter()
        .map(|w| format!("warning: {w}\n"))
        .collect();
    if health.refuses_writes() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: Redis refuses writes\n{warnings}"),
        );
    }
    (StatusCode::OK, format!("ready\n{warnings}"))
}

async fn metrics(State(ctx): State<Arc<Context>>) -> ([(header::HeaderName, &'static str); 1], String) {
    crate::metrics::refresh(&ctx);
    let sasl = &ctx.security.sasl;
    metrics::counter!("ketch_authentications_total")
        .absolute(sasl.successes.load(std::sync::atomic::Ordering::Relaxed));
    metrics::counter!("ketch_authentication_failures_total")
        .absolute(sasl.failures.load(std::sync::atomic::Ordering::Relaxed));
    let text = crate::metrics::render().unwrap_or_else(|| {
        "# no metrics recorder in this process (ketch_gateway::metrics::install)\n".to_owned()
    });
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
