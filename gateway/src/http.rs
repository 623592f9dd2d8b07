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
        .layer(middleware::from_fn_with_state(ctx.clone(), browser_guard))
        .with_state(ctx.clone());
    let stop = {
        let mut shutdown = shutdown.clone();
        async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        }
    };
    let limits = Limits::new(&ctx.settings.http);
    let served = match ctx.security.tls.clone().filter(|_| ctx.settings.http.tls) {
        Some(tls) => {
            let (tx, rx) = mpsc::channel(64);
            let local = listener.local_addr();
            let acceptor = tokio::spawn(accept_tls(listener, tls, limits, tx, shutdown.clone()));
            let served = axum::serve(
                TlsListener { rx, local },
                app.into_make_service_with_connect_info::<Peer>(),
            )
            .with_graceful_shutdown(stop)
            .await;
            acceptor.abort();
            served
        }
        None => {
            axum::serve(
                Bounded {
                    inner: listener,
                    limits,
                },
                app.into_make_service_with_connect_info::<Peer>(),
            )
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

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Bounded>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Bounded>) -> Self {
        Peer(*stream.remote_addr())
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// What bounds the HTTP listener's connections, so slow, idle or many
/// clients cannot take the file descriptors the Kafka listeners need, nor
/// every place (health probes' included): at most `http.max_connections`
/// (more wait to be accepted, in the kernel's backlog, before any TLS
/// handshake), at most `http.max_connections_per_ip` from one address
/// (more are closed at once), and each closed once a request has taken
/// `http.idle_timeout` from its first byte without an answer, or once it
/// moved no byte for that long (hyper's own header timeout is off under
/// axum).
#[derive(Clone)]
struct Limits {
    permits: Arc<tokio::sync::Semaphore>,
    per_address: Arc<crate::server::PerAddress>,
    idle: Duration,
}

impl Limits {
    fn new(settings: &ketch_config::HttpSettings) -> Self {
        Self {
            permits: Arc::new(tokio::sync::Semaphore::new(settings.max_connections)),
            per_address: Arc::new(crate::server::PerAddress::uniform(
                settings.max_connections_per_ip,
            )),
            idle: settings.idle_timeout.get(),
        }
    }

    /// A place among `http.max_connections`, once one is free.
    async fn place(&self) -> tokio::sync::OwnedSemaphorePermit {
        match self.permits.clone().acquire_owned().await {
            Ok(permit) => permit,
            // Never closed.
            Err(_) => std::future::pending().await,
        }
    }

    /// The connection from `peer` holding `permit`, bounded; `None` (and
    /// logged) when its address has its share open already.
    fn admit<S>(
        &self,
        io: S,
        peer: SocketAddr,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Option<Guarded<S>> {
        match self.per_address.admit(peer.ip()) {
            Ok(slot) => Some(Guarded::new(io, (permit, slot), self.idle)),
            Err(limit) => {
                tracing::debug!(%peer, limit, "http listener: the address has http.max_connections_per_ip open; closing the connection");
                None
            }
        }
    }
}

/// The plain HTTP listener, bounded by [`Limits`].
struct Bounded {
    inner: TcpListener,
    limits: Limits,
}

impl axum::serve::Listener for Bounded {
    type Io = Guarded<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let permit = self.limits.place().await;
            let (io, addr) = axum::serve::Listener::accept(&mut self.inner).await;
            if let Some(io) = self.limits.admit(io, addr, permit) {
                return (io, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection holding its places (among `http.max_connections` and its
/// address's), failing its reads once it moved no byte for
/// `http.idle_timeout`, or once a request has taken that long from its
/// first byte without a byte of answer (a client trickling a request byte
/// by byte holds no place for ever).
struct Guarded<S> {
    inner: S,
    _places: (tokio::sync::OwnedSemaphorePermit, crate::server::AddressSlot),
    timeout: Duration,
    idle: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// Whether the connection wrote since it last read: its next read
    /// starts a request, and the request's time.
    answered: bool,
}

impl<S> Guarded<S> {
    fn new(
        inner: S,
        places: (tokio::sync::OwnedSemaphorePermit, crate::server::AddressSlot),
        timeout: Duration,
    ) -> Self {
        Self {
            inner,
            _places: places,
            timeout,
            idle: Box::pin(tokio::time::sleep(timeout)),
            answered: true,
        }
    }

    /// The connection's time starts again.
    fn restart(&mut self) {
        let deadline = tokio::time::Instant::now() + self.timeout;
        self.idle.as_mut().reset(deadline);
    }

    /// The client sent bytes: the first of a request starts its time; the
    /// rest of it does not.
    fn read_some(&mut self) {
        if self.answered {
            self.answered = false;
            self.restart();
        }
    }

    /// The gateway answered: the connection's time starts again.
    fn wrote_some(&mut self) {
        self.answered = true;
        self.restart();
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::future::Future as _;
        use std::task::Poll;
        let this = &mut *self;
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(read) => {
                if buf.filled().len() > before {
                    this.read_some();
                }
                Poll::Ready(read)
            }
            Poll::Pending => match this.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the HTTP client sent nothing, or no whole request, for too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let written = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(written, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.wrote_some();
        }
        written
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let written = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(written, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.wrote_some();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// TLS connections whose handshake completed, each already holding its
/// places ([`accept_tls`]), for axum.
struct TlsListener {
    rx: mpsc::Receiver<(Guarded<TlsStream<TcpStream>>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
}

impl axum::serve::Listener for TlsListener {
    type Io = Guarded<TlsStream<TcpStream>>;
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
/// own task, bounded in time, so a slow client holds up no other). A
/// connection takes its places ([`Limits`]) before its handshake: one that
/// never finishes it holds one of `http.max_connections` for the
/// handshake's 10 s at most, and no more are accepted while none is free.
async fn accept_tls(
    listener: TcpListener,
    tls: Arc<crate::auth::tls::Tls>,
    limits: Limits,
    ready: mpsc::Sender<(Guarded<TlsStream<TcpStream>>, SocketAddr)>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let permit = tokio::select! {
            permit = limits.place() => permit,
            _ = shutdown.wait_for(|s| *s) => return,
        };
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
        let Some(socket) = limits.admit(socket, peer, permit) else {
            continue;
        };
        let acceptor = tls.http_acceptor();
        let ready = ready.clone();
        let idle = limits.idle;
        tokio::spawn(async move {
            let Guarded {
                inner,
                _places: places,
                ..
            } = socket;
            match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(inner)).await {
                Ok(Ok(stream)) => {
                    // The idle time starts once the handshake is done; a
                    // connection axum does not take at once keeps its places.
                    let _ = ready.send((Guarded::new(stream, places, idle), peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "http listener: TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "http listener: TLS handshake timed out"),
            }
        });
    }
}

/// What protects the console and the admin API from web pages a browser on
/// an operator's machine opens, before anything else runs:
/// - a request from this machine must name `localhost`, an IP address or
///   one of `http.allowed_hosts` in its `Host` header: a page that rebinds
///   its own name to 127.0.0.1 (DNS rebinding) names itself, and is refused
///   (the default listener, 127.0.0.1:9644, is otherwise open to it);
/// - a write whose `Origin` is not the host it is sent to is refused (a
///   cross-site form post; cross-site JSON and DELETE need a CORS
///   preflight, which is never answered);
/// - every answer says not to be framed or sniffed, and sends no referrer.
async fn browser_guard(State(ctx): State<Arc<Context>>, request: Request, next: Next) -> Response {
    let local = request
        .extensions()
        .get::<axum::extract::ConnectInfo<Peer>>()
        .is_some_and(|info| info.0.0.ip().to_canonical().is_loopback());
    let host = header_text(&request, header::HOST);
    if local
        && let Some(host) = host.as_deref()
        && !allowed_host(host, &ctx.settings.http.allowed_hosts)
    {
        tracing::info!(
            host,
            path = request.uri().path(),
            "HTTP request for a host this gateway does not answer to"
        );
        return crate::admin::Failure::new(
            StatusCode::FORBIDDEN,
            "HOST_NOT_ALLOWED",
            format!(
                "a request from this machine for host {host:?}: name localhost or an IP address, \
                 or add the name to http.allowed_hosts"
            ),
        )
        .into_response();
    }
    let reading = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    );
    let origin = header_text(&request, header::ORIGIN);
    if !reading
        && let Some(origin) = origin.as_deref()
        && !same_origin(origin, host.as_deref(), &ctx.settings.http.allowed_hosts)
    {
        tracing::info!(
            origin,
            path = request.uri().path(),
            "cross-origin HTTP write refused"
        );
        return crate::admin::Failure::new(
            StatusCode::FORBIDDEN,
            "CROSS_ORIGIN",
            "a write from a page of another origin",
        )
        .into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("content-security-policy", "frame-ancestors 'none'"),
        ("referrer-policy", "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A request header's value, when it is text.
fn header_text(request: &Request, name: header::HeaderName) -> Option<String> {
    let value = request.headers().get(name)?;
    value.to_str().ok().map(str::to_owned)
}

/// Whether `host` (a `Host` header, port and all) is `localhost` (or a name
/// under it), an IP address, or one of `allowed` (`*`: any).
fn allowed_host(host: &str, allowed: &[String]) -> bool {
    let name = host_name(host);
    name.eq_ignore_ascii_case("localhost")
        || name.to_ascii_lowercase().ends_with(".localhost")
        || name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok()
        || allowed.iter().any(|a| a == "*" || a.eq_ignore_ascii_case(name))
}

/// A `Host` header without its port.
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        // [v6]:port
        return host
            .split_once(']')
            .map_or(host, |(name, _)| &host[..name.len() + 1]);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// Whether an `Origin` (scheme://host[:port]) is the `Host` a request is
/// sent to, or one of `allowed` (a reverse proxy may send the gateway's
/// own address as `Host`, the browser the public name as `Origin`).
fn same_origin(origin: &str, host: Option<&str>, allowed: &[String]) -> bool {
    let authority = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    if allowed
        .iter()
        .any(|a| a != "*" && a.eq_ignore_ascii_case(host_name(authority)))
    {
        return true;
    }
    let Some(host) = host else {
        return false;
    };
    let default_port = |a: &str| {
        a.strip_suffix(":80")
            .or_else(|| a.strip_suffix(":443"))
            .unwrap_or(a)
            .to_ascii_lowercase()
    };
    default_port(authority) == default_port(host)
}

/// `http.auth`: Basic or Bearer credentials on every path but the open ones.
async fn authenticate(State(ctx): State<Arc<Context>>, mut request: Request, next: Next) -> Response {
    let http = &ctx.settings.http;
    // Open paths are open to reading: a write on one (an operator who
    // opened `/api/v1/topics` for listing) still needs credentials.
    let reading = matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    if !http.auth || reading && http.open_paths.iter().any(|p| p == request.uri().path()) {
        return next.run(request).await;
    }
    let credentials = header_text(&request, header::AUTHORIZATION);
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
                None => Err(ctx
                    .security
                    .sasl
                    .fail("malformed Basic credentials".to_owned())
                    .await),
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
            // Why is logged, not told (a token's expected issuer, a
            // storage error), as a refused SASL authentication.
            // JSON, as every admin API error (`{"error", "message"}`).
            let told = if credentials.is_none() {
                "authentication required"
            } else {
                "authentication failed"
            };
            let mut response =
                crate::admin::Failure::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", told).into_response();
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
        return crate::admin::Failure::new(
            StatusCode::FORBIDDEN,
            "CLUSTER_AUTHORIZATION_FAILED",
            format!("{principal} may not DESCRIBE the cluster"),
        )
        .into_response();
    }
    request
        .extensions_mut()
        .insert(crate::admin::Principal(Arc::from(principal.as_str())));
    next.run(request).await
}

/// How long `/ready` may take: under a load balancer's check timeout
/// (HAProxy's example configuration gives 3 s). A Redis that does not
/// answer in it is not ready.
const READY_PROBE_LIMIT: std::time::Duration = std::time::Duration::from_millis(2500);

/// Whether this gateway can serve: Redis answers (in a Redis Cluster, the
/// masters of the registries every gateway needs), it is registered, and
/// Redis takes writes. In a Redis Cluster a master that is down or full
/// only takes its own partitions, groups and transactions away, as a Kafka
/// broker that fails takes its own: the other masters' go on, so it is a
/// warning, not 503 (which would take every gateway out of a load
/// balancer at once).
async fn ready(State(ctx): State<Arc<Context>>) -> (StatusCode, String) {
    if crate::DRAINING.load(std::sync::atomic::Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: shutting down (broker.shutdown_delay)\n".to_owned(),
        );
    }
    let cluster = ctx.settings.redis.mode == ketch_config::RedisMode::Cluster;
    let deadline = tokio::time::Instant::now() + READY_PROBE_LIMIT;
    match tokio::time::timeout_at(deadline, ctx.storage.ping()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")),
        Err(_) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: Redis did not answer in {READY_PROBE_LIMIT:?}\n"),
            );
        }
    }
    // Every server's memory; one that does not answer in time (a master
    // down or frozen) is a warning, with what was last read of the others.
    let health = match tokio::time::timeout_at(deadline, crate::metrics::check_redis(&ctx)).await {
        Ok(health) => health,
        Err(_) => crate::metrics::last_read(&ctx, format!("INFO did not answer in {READY_PROBE_LIMIT:?}")),
    };
    if !ctx.membership.joined() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: not yet registered in ketch:brokers\n".to_owned(),
        );
    }
    let mut warnings: String = health
        .warnings()
        .iter()
        .map(|w| format!("warning: {w}\n"))
        .collect();
    if let Some(error) = &health.error {
        warnings.push_str(&format!(
            "warning: cannot read every Redis server's memory: {error}\n"
        ));
    }
    if health.refuses_writes() && !cluster {
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
    let text = crate::metrics::render(&ctx).unwrap_or_else(|| {
        "# no metrics recorder in this process (ketch_gateway::metrics::install)\n".to_owned()
    });
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}
