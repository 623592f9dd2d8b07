//! The Kafka listener: one task per connection, size-prefixed frames
//! bounded by `broker.max_request_bytes`, requests processed concurrently
//! and answered in order (the Kafka protocol requires it).
//!
//! A frame that cannot be a Kafka request (too large, truncated, unknown API
//! key, undecodable, an unsupported version of anything but ApiVersions)
//! closes its connection, as a Kafka broker does; other connections are
//! untouched.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::Context;
use crate::api;
use crate::auth::sasl::{Outcome, SESSION_EXPIRED, Session};
use crate::quotas::Kind;

mod proxy_protocol;
mod responses;

use responses::{Drained, Place, Responses};

/// The most a frame's length field alone may make us allocate; a larger
/// frame's buffer grows to its full size only once this much has arrived.
const FIRST_ALLOCATION: usize = 1024 * 1024;

/// A bound Kafka listener and what it is configured as.
pub struct Endpoint {
    pub socket: TcpListener,
    pub listener: ketch_config::Listener,
}

/// The largest frame a client of a SASL listener may send before it has
/// authenticated (Kafka's `sasl.server.max.receive.size`): a stranger gets
/// no 100 MiB buffer.
const MAX_UNAUTHENTICATED_FRAME: u32 = 512 * 1024;

/// The read buffer under a TLS connection (32 KiB of memory each). rustls
/// asks the socket for 4 KiB at a time, at least 25 system calls per
/// 100 KiB produced; with this buffer 100 MB of produce took 3,694
/// `recvfrom` calls, Redis's replies included (benchmark/README.md, "TLS
/// and SASL").
const TLS_READ_BUFFER: usize = 32 * 1024;
/// The read buffer under a plaintext connection (8 KiB each): a request's
/// size prefix and body, and the requests a client pipelines, come in one
/// `recvfrom` instead of two or more (a frame larger than what is buffered
/// is read straight into its own buffer).
const PLAIN_READ_BUFFER: usize = 8 * 1024;

/// How long a TLS handshake may take before the connection is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection to a PROXY protocol listener may take to send its
/// header (a balancer writes it at once).
const PROXY_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves every listener until `shutdown`, then waits for their
/// connections' in-flight requests. `broker.max_connections` bounds the
/// connections of all listeners together, and `per_address` those from
/// one address.
pub async fn serve(
    endpoints: Vec<Endpoint>,
    ctx: Arc<Context>,
    per_address: PerAddress,
    shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(ctx.settings.broker.max_connections));
    let per_address = Arc::new(per_address);
    futures::future::join_all(endpoints.into_iter().map(|endpoint| {
        serve_one(
            endpoint,
            ctx.clone(),
            slots.clone(),
            per_address.clone(),
            shutdown.clone(),
        )
    }))
    .await;
}

/// The client connections open from each address, against
/// `broker.max_connections_per_ip` and its overrides (Kafka's
/// `max.connections.per.ip[.overrides]`), on every listener together.
pub struct PerAddress {
    limit: usize,
    overrides: HashMap<IpAddr, usize>,
    open: std::sync::Mutex<HashMap<IpAddr, usize>>,
}

impl PerAddress {
    /// The limits of `broker`, each host name of the overrides resolved
    /// (failing when one resolves to nothing, as Kafka's broker does).
    pub async fn new(broker: &ketch_config::BrokerSettings) -> anyhow::Result<Self> {
        let mut overrides = HashMap::new();
        for (host, count) in broker.connection_overrides()? {
            if let Ok(ip) = host.parse::<IpAddr>() {
                overrides.insert(ip.to_canonical(), count);
                continue;
            }
            let resolved = tokio::net::lookup_host((host.as_str(), 0)).await.map_err(|e| {
                anyhow::anyhow!("broker.max_connections_per_ip_overrides: cannot resolve {host}: {e}")
            })?;
            let mut any = false;
            for address in resolved {
                overrides.insert(address.ip().to_canonical(), count);
                any = true;
            }
            anyhow::ensure!(
                any,
                "broker.max_connections_per_ip_overrides: {host} resolves to no address"
            );
        }
        Ok(Self {
            limit: broker.max_connections_per_ip,
            overrides,
            open: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// `limit` connections from every address.
    pub fn uniform(limit: usize) -> Self {
        Self {
            limit,
            overrides: HashMap::new(),
            open: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// A place for one more connection from `ip`, held until dropped; `Err`
    /// with the address's limit when it has that many open.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<AddressSlot, usize> {
        // An IPv4 client of a dual-stack (`[::]`) listener arrives as
        // `::ffff:a.b.c.d`: it is that IPv4 address.
        let ip = ip.to_canonical();
        let limit = self.overrides.get(&ip).copied().unwrap_or(self.limit);
        let mut open = self.open.lock().expect("per-address counts");
        let count = open.entry(ip).or_default();
        if *count >= limit {
            if *count == 0 {
                open.remove(&ip);
            }
            return Err(limit);
        }
        *count += 1;
        Ok(AddressSlot {
            counts: self.clone(),
            ip,
        })
    }
}

/// One connection's place among its address's.
pub(crate) struct AddressSlot {
    counts: Arc<PerAddress>,
    ip: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().expect("per-address counts");
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Accepts connections on one listener until `shutdown`, then waits for
/// every connection to finish its in-flight requests (bounded by
/// `broker.shutdown_timeout`).
async fn serve_one(
    endpoint: Endpoint,
    ctx: Arc<Context>,
    slots: Arc<tokio::sync::Semaphore>,
    per_address: Arc<PerAddress>,
    mut shutdown: watch::Receiver<bool>,
) {
    let Endpoint {
        socket: listener,
        listener: config,
    } = endpoint;
    let config = Arc::new(config);
    let mut connections = JoinSet::new();
    let for_connections = shutdown.clone();
    let refused = Arc::new(std::sync::Mutex::new(Refusals::default()));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    if !config.proxy_protocol {
                        match admit(&ctx, &slots, &per_address, &refused, peer, None) {
                            Admission::Refused => drop(socket),
                            admission => {
                                let (ctx, config) = (ctx.clone(), config.clone());
                                let shutdown = for_connections.clone();
                                connections.spawn(serve_admitted(socket, peer, admission, ctx, config, shutdown));
                            }
                        }
                        continue;
                    }
                    // The client's address is in the header the balancer
                    // writes first: read it, then admit the connection by
                    // that address. Its place among `broker.max_connections`
                    // is taken before, so connections that send no header
                    // cannot pile up.
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        refused
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .refuse(peer, Refused::All(ctx.settings.broker.max_connections));
                        drop(socket);
                        continue;
                    };
                    let (ctx, config, shutdown) = (ctx.clone(), config.clone(), for_connections.clone());
                    let (slots, per_address, refused) = (slots.clone(), per_address.clone(), refused.clone());
                    connections.spawn(async move {
                        let mut socket = socket;
                        let header = tokio::time::timeout(
                            PROXY_HEADER_TIMEOUT,
                            proxy_protocol::read_header(&mut socket, peer),
                        )
                        .await
                        .unwrap_or_else(|_| Err("no PROXY protocol header in time".to_owned()));
                        let client = match header {
                            Ok(client) => client,
                            Err(e) => {
                                tracing::info!(%peer, listener = config.name, error = %e,
                                    "closing connection: this listener expects a PROXY protocol header");
                                return;
                            }
                        };
                        let admission = admit(&ctx, &slots, &per_address, &refused, client, Some(slot));
                        serve_admitted(socket, client, admission, ctx, config, shutdown).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
    }
    drop(listener);
    let grace = ctx.settings.broker.shutdown_timeout.get();
    tracing::info!(
        listener = config.name,
        connections = connections.len(),
        "shutting down; finishing in-flight requests"
    );
    if tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} })
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within broker.shutdown_timeout");
    }
}

/// What becomes of a connection just accepted.
enum Admission {
    /// Over its address's `connection_creation_rate`: held unread for the
    /// throttle time, then closed (Kafka's throttled connection).
    Throttled(Duration),
    /// Over `broker.max_connections`, or its address's share: closed.
    Refused,
    /// Served, holding its places.
    Admitted(tokio::sync::OwnedSemaphorePermit, AddressSlot),
}

/// Admits a connection from `peer` (the client's address: the PROXY
/// protocol header's, on listeners that read one), or not; `slot`: its
/// place among `broker.max_connections`, taken already.
fn admit(
    ctx: &Context,
    slots: &Arc<tokio::sync::Semaphore>,
    per_address: &Arc<PerAddress>,
    refused: &std::sync::Mutex<Refusals>,
    peer: std::net::SocketAddr,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Admission {
    let throttle = ctx.quotas.connection(peer.ip());
    if !throttle.is_zero() {
        crate::metrics::quota_throttled(Kind::Connection, throttle);
        tracing::debug!(%peer, throttle_ms = throttle.as_millis() as u64,
            "connection over its address's connection_creation_rate; closing it");
        return Admission::Throttled(throttle);
    }
    let refuse = |why| {
        refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .refuse(peer, why);
        Admission::Refused
    };
    let address_slot = match per_address.admit(peer.ip()) {
        Ok(slot) => slot,
        Err(limit) => return refuse(Refused::Address(limit)),
    };
    let Some(slot) = slot.or_else(|| slots.clone().try_acquire_owned().ok()) else {
        return refuse(Refused::All(ctx.settings.broker.max_connections));
    };
    Admission::Admitted(slot, address_slot)
}

/// Serves an admitted connection from `peer`; holds a throttled one
/// unread for its throttle time, then closes it.
async fn serve_admitted(
    socket: TcpStream,
    peer: std::net::SocketAddr,
    admission: Admission,
    ctx: Arc<Context>,
    config: Arc<ketch_config::Listener>,
    mut shutdown: watch::Receiver<bool>,
) {
    let places = match admission {
        Admission::Admitted(slot, address_slot) => (slot, address_slot),
        Admission::Throttled(throttle) => {
            tokio::select! {
                _ = tokio::time::sleep(throttle) => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
            return;
        }
        Admission::Refused => return,
    };
    let _places = places;
    let _ = socket.set_nodelay(true);
    if let Err(e) = accept(socket, peer, ctx, config, shutdown).await {
        tracing::info!(%peer, error = %e, "closing connection");
    }
}

/// Sets a new connection up (the TLS handshake, on TLS listeners) and
/// serves it.
async fn accept(
    socket: TcpStream,
    peer: std::net::SocketAddr,
    ctx: Arc<Context>,
    listener: Arc<ketch_config::Listener>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    if !listener.protocol.tls() {
        let session = Session::new(ctx.security.sasl.clone(), false, Arc::from(api::ANONYMOUS));
        let (read, write) = socket.into_split();
        let read = tokio::io::BufReader::with_capacity(PLAIN_READ_BUFFER, read);
        return connection(read, write, peer, ctx, listener, session, shutdown).await;
    }
    let Some(tls) = ctx.security.tls.clone() else {
        return Err(ConnectionError::Auth(
            "TLS listener without a TLS configuration".to_owned(),
        ));
    };
    let socket = tokio::io::BufReader::with_capacity(TLS_READ_BUFFER, socket);
    let stream = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.acceptor().accept(socket))
        .await
        .map_err(|_| ConnectionError::Auth("the TLS handshake took too long".to_owned()))?
        .map_err(|e| ConnectionError::Auth(format!("TLS handshake failed: {e}")))?;
    // On SSL the client certificate names the principal; on SASL_SSL, SASL
    // does (the certificate only has to be valid), and the mapping rules
    // are not applied, as in Kafka's principal builder.
    let certificate = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first());
    let principal = match certificate {
        Some(cert) if !listener.protocol.sasl() => tls.principal(cert).map_err(ConnectionError::Auth)?,
        _ => api::ANONYMOUS.to_owned(),
    };
    let session = Session::new(ctx.security.sasl.clone(), true, Arc::from(principal));
    let (read, write) = tokio::io::split(stream);
    connection(read, write, peer, ctx, listener, session, shutdown).await
}

/// Connections refused because `broker.max_connections` are open, or
/// their address's share, logged at most once a second so a flood of them
/// does not flood the log.
#[derive(Default)]
struct Refusals {
    since_logged: u64,
    logged_at: Option<std::time::Instant>,
}

/// Which limit refused a connection.
enum Refused {
    /// `broker.max_connections`, of every address.
    All(usize),
    /// The address's own (`broker.max_connections_per_ip` or an override).
    Address(usize),
}

impl Refusals {
    fn refuse(&mut self, peer: std::net::SocketAddr, why: Refused) {
        self.since_logged += 1;
        if self
            .logged_at
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
        {
            let refused = self.since_logged;
            match why {
                Refused::All(max) => tracing::warn!(%peer, refused,
                    "broker.max_connections ({max}) connections are open; closing new ones"),
                Refused::Address(max) => tracing::warn!(%peer, refused,
                    "the address has its maximum of {max} connections open (broker.max_connections_per_ip); closing new ones"),
            }
            self.since_logged = 0;
            self.logged_at = Some(std::time::Instant::now());
        }
    }
}

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes exceeds broker.max_request_bytes ({1})")]
    FrameTooLarge(i64, u32),
    #[error("frame truncated: connection closed after {got} of {expected} bytes")]
    Truncated { got: usize, expected: usize },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("idle for broker.connections_max_idle ({0:?})")]
    Idle(Duration),
    #[error("authentication: {0}")]
    Auth(String),
}

/// A response to send, with what it holds until it is written: its share
/// of the connection's response budget (a Fetch), or the turn of the
/// connection's next Read or Write request ([`Order`]).
struct Response {
    /// The frame, in one chunk or in several (a Fetch response's stored
    /// batches are chunks of their own, written vectored).
    chunks: Vec<Bytes>,
    _budget: Option<tokio::sync::OwnedSemaphorePermit>,
    _written: Option<Running>,
}

impl Response {
    /// A response that holds nothing.
    fn bare(chunks: Vec<Bytes>) -> Self {
        Self {
            chunks,
            _budget: None,
            _written: None,
        }
    }
}

/// The response memory one connection may hold, in KiB: two of the largest
/// fetch responses. A fetch reserves its share before reading and gives it
/// back once its response is written, so a client that sends fetches but
/// reads no answers stops being served instead of piling up responses.
fn response_budget_kib(ctx: &Context) -> usize {
    (2 * ctx.settings.fetch.max_response_bytes).div_ceil(1024)
}

/// The share of the response budget a request reserves, in KiB.
fn response_share_kib(ctx: &Context, request: &RequestKind) -> Option<u32> {
    let RequestKind::Fetch(fetch) = request else {
        return None;
    };
    let bytes = usize::try_from(fetch.max_bytes)
        .unwrap_or(0)
        .min(ctx.settings.fetch.max_response_bytes);
    Some(u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX))
}

/// Takes `kib` of a connection's budget, waiting while it is spent; `None`
/// once the gateway shuts down.
async fn reserve(
    budget: &Arc<tokio::sync::Semaphore>,
    kib: u32,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    tokio::select! {
        permit = budget.clone().acquire_many_owned(kib) => permit.ok(),
        _ = shutdown.wait_for(|stop| *stop) => None,
    }
}

/// A SASL token sent as a raw size-prefixed frame (after a v0 handshake).
fn raw_frame(token: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(4 + token.len());
    buf.put_i32(token.len() as i32);
    buf.put_slice(token);
    buf.freeze()
}

#[allow(clippy::too_many_arguments)]
async fn connection<R, W>(
    mut read: R,
    write: W,
    peer: std::net::SocketAddr,
    ctx: Arc<Context>,
    listener: Arc<ketch_config::Listener>,
    mut session: Session,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError>
where
    R: tokio::io::AsyncRead + Unpin + Send,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let _open = ctx.requests.connection();
    let sasl_required = listener.protocol.sasl();
    let listener_name: Arc<str> = Arc::from(listener.name.as_str());
    let idle = ctx.settings.broker.connections_max_idle.get();
    let responses = Responses::new(ctx.settings.broker.max_inflight_requests, idle, write);
    let writer = tokio::spawn(write_responses(responses.clone()));
    let max = ctx.settings.broker.max_request_bytes;
    let budget = Arc::new(tokio::sync::Semaphore::new(response_budget_kib(&ctx)));
    let request_kib =
        u32::try_from(ctx.settings.broker.max_inflight_request_bytes.div_ceil(1024)).unwrap_or(u32::MAX);
    let requests = Arc::new(tokio::sync::Semaphore::new(request_kib as usize));
    let mut sequencer = api::produce::Sequencer::default();
    let mut order = Order::default();
    let mute = Arc::new(Mute::default());
    // How many requests were read (each one's place in that order).
    let mut read_count: u64 = 0;
    // An ApiVersions was answered before SASL authentication: Kafka answers
    // one there, then only the handshake (a client that never
    // authenticates cannot hold the connection with ApiVersions).
    let mut versions_before_sasl = false;
    // Set once the client is gone: its JoinGroup and SyncGroup requests
    // parked for their group's rebalance are given up (below).
    let (client_gone, gone) = watch::channel(false);
    let mut peer_gone = false;
    let result = loop {
        let limit = if sasl_required && !session.authenticated() {
            max.min(MAX_UNAUTHENTICATED_FRAME)
        } else {
            max
        };
        let frame = tokio::select! {
            frame = tokio::time::timeout(idle, read_frame(&mut read, limit)) => match frame {
                Ok(frame) => frame,
                Err(_) => break Err(ConnectionError::Idle(idle)),
            },
            _ = shutdown.wait_for(|stop| *stop) => break Ok(()),
        };
        let frame = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                peer_gone = true;
                break Ok(());
            }
            // Name the limit that applied.
            Err(ConnectionError::FrameTooLarge(size, _)) if size >= 0 && limit < max => {
                break Err(ConnectionError::Auth(format!(
                    "frame of {size} bytes before SASL authentication (at most {limit} bytes until then)"
                )));
            }
            Err(e) => {
                peer_gone = matches!(e, ConnectionError::Io(_) | ConnectionError::Truncated { .. });
                break Err(e);
            }
        };
        // A client a quota throttled is not served until its throttle time
        // has passed (Kafka mutes its channel; KIP-219). The frame may have
        // been read before the throttle was known: it waits here.
        // Kafka closes a connection idle for connections.max.idle.ms,
        // muted or not: a client gone while throttled (a throttle may last
        // far longer) does not keep its places under max_connections and
        // its address's limit until the throttle ends. The requests read
        // before are answered at once (into the closing connection).
        if let Some(until) = mute.until() {
            let idle_until = tokio::time::Instant::now() + idle;
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = tokio::time::sleep_until(idle_until), if idle_until < until => {
                    // Given up as a client gone: its parked group requests
                    // too, or they would hold the connection's places.
                    peer_gone = true;
                    break Err(ConnectionError::Idle(idle));
                }
                _ = shutdown.wait_for(|stop| *stop) => break Ok(()),
            }
        }
        if session.expects_raw_token() {
            match session.raw_token(ctx.storage.as_ref(), &frame).await {
                Outcome::Raw(token) => {
                    if !responses.answer(raw_frame(&token)).await {
                        break Ok(());
                    }
                    continue;
                }
                Outcome::Answer(_) => continue,
                Outcome::Close(_, why) => break Err(ConnectionError::Auth(why)),
            }
        }
        let received = std::time::Instant::now();
        let size = frame.len();
        let frame_kib = u32::try_from(size.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        let request = match decode(frame) {
            Ok(request) => request,
            Err(Rejected::Close(e)) => break Err(e),
            // An ApiVersions of a version this gateway lacks: answered
            // (UNSUPPORTED_VERSION) where an ApiVersions would be; past the
            // one a SASL listener takes before authentication, during the
            // exchange or once the session expired, Kafka's authenticator
            // closes the connection instead.
            Err(Rejected::Answer(_))
                if sasl_required
                    && ((!session.authenticated() && (versions_before_sasl || session.exchanging()))
                        || session.expired()) =>
            {
                break Err(ConnectionError::Auth(
                    "ApiVersions (of a version this gateway lacks) again before SASL authentication, during its exchange or after the session expired".to_owned(),
                ));
            }
            Err(Rejected::Answer(bytes)) => {
                if !responses.answer(bytes).await {
                    break Ok(());
                }
                continue;
            }
        };
        let (header, body) = &request;
        let outcome = match body {
            RequestKind::SaslHandshake(r) if sasl_required => {
                Some(session.handshake(header.request_api_version, r))
            }
            RequestKind::SaslAuthenticate(r) if sasl_required => Some(
                session
                    .authenticate(ctx.storage.as_ref(), header.request_api_version, r)
                    .await,
            ),
            // A listener without SASL answers them as Kafka does, with
            // ILLEGAL_SASL_STATE, and goes on.
            RequestKind::SaslHandshake(_) => Some(Outcome::Answer(ResponseKind::SaslHandshake(
                kafka_protocol::messages::SaslHandshakeResponse::default()
                    .with_error_code(kafka_protocol::error::ResponseError::IllegalSaslState.code()),
            ))),
            RequestKind::SaslAuthenticate(_) => Some(Outcome::Answer(ResponseKind::SaslAuthenticate(
                kafka_protocol::messages::SaslAuthenticateResponse::default()
                    .with_error_code(kafka_protocol::error::ResponseError::IllegalSaslState.code())
                    .with_error_message(Some(api::str_bytes(format!(
                        "listener {} ({}) does not use SASL",
                        listener.name,
                        listener.protocol.name()
                    )))),
            ))),
            // Before authentication; once a session expired, not even it
            // (Kafka closes the connection at any request but a
            // re-authenticating SaslHandshake).
            RequestKind::ApiVersions(_)
                if sasl_required
                    && !session.authenticated()
                    && (versions_before_sasl || session.exchanging()) =>
            {
                Some(Outcome::Close(
                    None,
                    "ApiVersions again before SASL authentication, or during its exchange".to_owned(),
                ))
            }
            RequestKind::ApiVersions(r) if !session.expired() => {
                // One answered without an error uses it up (Kafka moves on
                // to the handshake only then).
                versions_before_sasl |= sasl_required
                    && !session.authenticated()
                    && api::api_versions::valid(header.request_api_version, r);
                None
            }
            _ if sasl_required && !session.authenticated() => Some(Outcome::Close(
                None,
                format!(
                    "{:?} request before SASL authentication",
                    ApiKey::try_from(header.request_api_key)
                ),
            )),
            _ if session.expired() => Some(Outcome::Close(None, SESSION_EXPIRED.to_owned())),
            // Kafka serves no request of a listener before its authorizer
            // has loaded the ACLs; answering one would refuse it with an
            // authorization error, fatal to clients (or list no topics).
            // A closed connection is retried.
            _ if !ctx.security.acls.ready_for(&session.principal()) => Some(Outcome::Close(
                None,
                "the ACLs are not loaded yet (Redis unreachable since this gateway started?)".to_owned(),
            )),
            _ => None,
        };
        if let Some(outcome) = outcome {
            let api_key = ApiKey::try_from(header.request_api_key).expect("decoded requests have known keys");
            let encode = |kind: &ResponseKind| {
                encode_response(api_key, header.request_api_version, header.correlation_id, kind)
                    .map_err(|e| ConnectionError::Invalid(format!("cannot encode a SASL response: {e}")))
            };
            match outcome {
                Outcome::Answer(kind) => match encode(&kind) {
                    Ok(bytes) => {
                        if !responses.answer(bytes).await {
                            break Ok(());
                        }
                        continue;
                    }
                    Err(e) => break Err(e),
                },
                Outcome::Raw(_) => continue,
                Outcome::Close(kind, why) => {
                    if let Some(Ok(bytes)) = kind.as_ref().map(encode) {
                        responses.answer(bytes).await;
                    }
                    break Err(ConnectionError::Auth(why));
                }
            }
        }
        let client = api::Client {
            peer,
            principal: session.principal(),
            forwarded: false,
            listener: listener_name.clone(),
        };
        // The response budget is reserved here, in request order, before
        // the next frame is read: responses are written in that order, so
        // a request that reserved out of order could hold the budget an
        // earlier one needs to be answered, and the connection would stall
        // for good. While it is spent, the connection is not read (as Kafka
        // mutes a connection whose responses wait).
        let reserved = match response_share_kib(&ctx, &request.1) {
            Some(kib) => match reserve(&budget, kib, &mut shutdown).await {
                Some(permit) => Some(permit),
                None => break Ok(()),
            },
            None => None,
        };
        // The request's bytes count against the connection's request
        // budget until it has been processed: while pipelined requests hold
        // it all, the next frame is not read (Kafka reads a connection's
        // next request only once the last one is answered). One frame is
        // always admitted: its share is capped at the whole budget.
        let Some(held) = reserve(&requests, request_kib.min(frame_kib), &mut shutdown).await else {
            break Ok(());
        };
        let turns = match &request.1 {
            RequestKind::Produce(produce) => sequencer.turns(produce),
            _ => api::produce::Turns::default(),
        };
        read_count += 1;
        let seq = read_count;
        // A produce request counts against its client's quota as it is
        // read, in order: when it is over, the requests after it wait
        // (Kafka reads a connection's next request only once the last one
        // is answered, so its throttle mutes the connection before the next
        // one is read; pipelined ones would otherwise all pass).
        let throttle = match &request.1 {
            RequestKind::Produce(_) => {
                let client_id = request.0.client_id.as_deref().unwrap_or("");
                let throttle = ctx
                    .quotas
                    .record(Kind::Produce, &client.principal, client_id, size);
                mute.throttle(seq, throttle);
                throttle
            }
            _ => Duration::ZERO,
        };
        // Its place in the response order, once fewer than
        // `broker.max_inflight_requests` responses are waiting.
        let Some(place) = responses.place().await else {
            break Ok(());
        };
        let Admit { after, done, written } = order.admit(Effect::of(&request.1));
        let gone =
            matches!(request.1, RequestKind::JoinGroup(_) | RequestKind::SyncGroup(_)).then(|| gone.clone());
        let admitted = Admitted {
            ctx: ctx.clone(),
            client,
            request,
            turns,
            asked: Asked {
                received,
                seq,
                throttle,
            },
            after,
            done,
            written,
            mute: mute.clone(),
            held,
            reserved,
            place,
            gone,
            _inflight: ctx.requests.request(),
        };
        tokio::spawn(admitted.serve());
    };
    // A client that went away is not answered the JoinGroup and SyncGroup
    // requests it left parked: they wait for a rebalance (minutes), and
    // would hold the connection, its places under `broker.max_connections`
    // and the per-address limit, until then (Kafka releases them at close;
    // the member stays in the group until its session times out, as there).
    // Group requests hold nothing while parked, so giving them up changes
    // no group. Every other request is answered within its own bound.
    if peer_gone {
        let _ = client_gone.send(true);
    }
    // Nothing is read any more: the requests read wait for no throttle.
    mute.lift();
    // Answer everything already accepted, then close.
    responses.close();
    let _ = writer.await;
    result
}

/// A request read and admitted, with what it holds until it is answered.
/// Every request spawns a task of [`Admitted::serve`], which boxes
/// [`respond`], so the task tokio copies as it starts and ends it stays
/// small (1.2 KiB; it was 8 KiB).
struct Admitted {
    ctx: Arc<Context>,
    client: api::Client,
    request: (RequestHeader, RequestKind),
    turns: api::produce::Turns,
    asked: Asked,
    /// The requests it must wait for (request ordering, [`Order`]).
    after: Vec<Done>,
    /// Dropped when this request has taken effect, releasing the requests
    /// that wait for it.
    done: Running,
    /// A Read or Write request's: dropped once its answer is written.
    written: Option<Running>,
    mute: Arc<Mute>,
    /// Its share of the connection's request budget.
    held: tokio::sync::OwnedSemaphorePermit,
    /// Its share of the connection's response budget, until the response
    /// is written.
    reserved: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Where its response goes in the connection's response order.
    place: Place,
    /// A JoinGroup's or SyncGroup's: set once the client is gone, which
    /// gives the request up (its place closes the connection).
    gone: Option<watch::Receiver<bool>>,
    _inflight: crate::metrics::Open,
}

impl Admitted {
    async fn serve(self) {
        let Admitted {
            ctx,
            client,
            request: (header, body),
            turns,
            asked,
            after,
            done,
            written,
            mute,
            held,
            reserved,
            place,
            gone,
            _inflight,
        } = self;
        futures::future::join_all(after.into_iter().map(Done::wait)).await;
        // A request read before this one may have been throttled since
        // this one was read (the read waited only for the throttles known
        // then): this one waits too, as Kafka would have read it only once
        // that one was answered.
        // (Boxed, and only when muted: the wait would make every request's
        // task larger.)
        if mute.until_for(asked.seq).is_some() {
            Box::pin(mute.wait_for(asked.seq)).await;
        }
        // Boxed: the task holds a pointer, so tokio's copies of it as it
        // starts and finishes it stay small (see `a_request_task_stays_small`).
        let reply = Box::pin(respond(&ctx, client, header, body, turns, asked, &mute));
        let reply = match gone {
            None => reply.await,
            Some(mut gone) => tokio::select! {
                reply = reply => reply,
                _ = gone.wait_for(|gone| *gone) => {
                    // Nothing to answer: the connection closes once the
                    // answers before this one are written.
                    place.close();
                    return;
                }
            },
        };
        drop(held);
        // The request has taken effect: those that wait for it may go on
        // while its answer is written (by this task, see `responses.rs`).
        drop(done);
        match reply {
            Reply::Send(chunks) => {
                place
                    .fill(Some(Response {
                        chunks,
                        _budget: reserved,
                        _written: written,
                    }))
                    .await;
            }
            Reply::Nothing => place.fill(None).await,
            Reply::Close => place.close(),
        }
    }
}

/// Until when a connection is not read: a quota throttled its client.
/// Each throttle is kept with the request that earned it (its place in the
/// order the connection read requests): requests read after that one wait
/// for it, as Kafka reads them only once that one is answered; requests
/// read before do not (they would have been handled before it in Kafka).
#[derive(Debug)]
pub(crate) struct Mute {
    /// (request, until when) of the throttles not over yet.
    throttles: std::sync::Mutex<Vec<(u64, tokio::time::Instant)>>,
    /// Set when the connection closes: nothing waits any more.
    lifted: watch::Sender<bool>,
}

impl Default for Mute {
    fn default() -> Self {
        Self {
            throttles: std::sync::Mutex::default(),
            lifted: watch::channel(false).0,
        }
    }
}

impl Mute {
    /// When reading may go on, if not now: after every throttle.
    fn until(&self) -> Option<tokio::time::Instant> {
        self.until_for(u64::MAX)
    }

    /// When the request read `seq`-th may go on, if not now: after the
    /// throttles of the requests read before it.
    fn until_for(&self, seq: u64) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        let mut throttles = self.throttles.lock().expect("mute lock");
        throttles.retain(|(_, until)| *until > now);
        throttles
            .iter()
            .filter(|(by, _)| *by < seq)
            .map(|(_, until)| *until)
            .max()
    }

    /// Waits until the request read `seq`-th may go on, or the mute is
    /// lifted.
    async fn wait_for(&self, seq: u64) {
        let mut lifted = self.lifted.subscribe();
        while let Some(until) = self.until_for(seq) {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = lifted.wait_for(|lifted| *lifted) => return,
            }
        }
    }

    /// Ends every wait, for good: the connection is closing.
    fn lift(&self) {
        self.lifted.send_replace(true);
    }

    /// Mutes the connection for `throttle` from now, for the requests
    /// read after the `seq`-th.
    fn throttle(&self, seq: u64, throttle: Duration) {
        if throttle.is_zero() {
            return;
        }
        let until = tokio::time::Instant::now() + throttle;
        self.throttles.lock().expect("mute lock").push((seq, until));
    }
}

/// What a request was, besides its contents: when it was read, its place
/// in the order the connection read requests, and the throttle time a
/// produce quota gave it then.
#[derive(Debug, Clone, Copy)]
struct Asked {
    received: std::time::Instant,
    seq: u64,
    throttle: Duration,
}

/// Runs `work` and, with `measure`, adds up the time spent polling it: the
/// time a gateway thread was busy with it (Kafka's request handler thread
/// time), without the waits for Redis, other gateways or long polls in
/// between. (Without a `request_percentage` quota nothing is measured.)
async fn thread_time<F: std::future::Future>(
    measure: bool,
    mut work: std::pin::Pin<&mut F>,
) -> (F::Output, Duration) {
    // The handler's future is borrowed, not moved in: an `async fn` that
    // takes a future by value and pins it stores it twice (the argument and
    // the pinned local), and every request's task would carry both.
    let mut busy = Duration::ZERO;
    let output = std::future::poll_fn(|cx| {
        if !measure {
            return work.as_mut().poll(cx);
        }
        let started = std::time::Instant::now();
        let poll = work.as_mut().poll(cx);
        busy += started.elapsed();
        poll
    })
    .await;
    (output, busy)
}

/// Sets a response's `throttle_time_ms` (every response ketch sends has
/// one, KIP-219), keeping a longer one its handler set.
fn set_throttle_time(response: &mut ResponseKind, throttle: Duration) {
    let ms = i32::try_from(throttle.as_millis()).unwrap_or(i32::MAX);
    macro_rules! set {
        ($($kind:ident),* $(,)?) => {
            match response {
                $(ResponseKind::$kind(r) => r.throttle_time_ms = r.throttle_time_ms.max(ms),)*
                _ => {}
            }
        };
    }
    set!(
        AddOffsetsToTxn,
        AddPartitionsToTxn,
        AlterClientQuotas,
        AlterConfigs,
        AlterPartitionReassignments,
        AlterReplicaLogDirs,
        AlterUserScramCredentials,
        ApiVersions,
        CreateAcls,
        CreatePartitions,
        CreateTopics,
        DeleteAcls,
        DeleteGroups,
        DeleteRecords,
        DeleteTopics,
        DescribeAcls,
        DescribeClientQuotas,
        DescribeCluster,
        DescribeConfigs,
        DescribeGroups,
        DescribeLogDirs,
        DescribeProducers,
        DescribeTopicPartitions,
        DescribeTransactions,
        DescribeUserScramCredentials,
        ElectLeaders,
        EndTxn,
        Fetch,
        FindCoordinator,
        Heartbeat,
        IncrementalAlterConfigs,
        InitProducerId,
        JoinGroup,
        LeaveGroup,
        ListConfigResources,
        ListGroups,
        ListOffsets,
        ListPartitionReassignments,
        ListTransactions,
        Metadata,
        OffsetCommit,
        OffsetDelete,
        OffsetFetch,
        Produce,
        SyncGroup,
        TxnOffsetCommit,
    );
}

fn millis(ms: i32) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// What a request's task does once the request is handled.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Write this response.
    Send(Vec<Bytes>),
    /// Write nothing: an acks=0 produce.
    Nothing,
    /// Close the connection after the responses before this request: an
    /// acks=0 produce a partition of which failed, as Kafka closes it (the
    /// producer then reads the metadata again), or a request that cannot be
    /// answered (the client asks again), its response not encodable
    /// included ([`encoded_reply`]).
    Close,
}

/// Runs a decoded request and encodes its response ([`Reply`]). Counts
/// it, its errors and its time since it was received (`ketch_request_*`).
/// Produce and fetch bytes count against the client's quotas: over one,
/// the response carries the throttle time (a fetch's no data) and
/// `mute` keeps the connection from being read meanwhile; so do topic
/// and partition changes over the controller mutation quota.
async fn respond(
    ctx: &Context,
    client: api::Client,
    header: RequestHeader,
    body: RequestKind,
    turns: api::produce::Turns,
    asked: Asked,
    mute: &Mute,
) -> Reply {
    let version = header.request_api_version;
    let correlation_id = header.correlation_id;
    let Ok(api_key) = ApiKey::try_from(header.request_api_key) else {
        return Reply::Nothing;
    };
    let silent = matches!(&body, RequestKind::Produce(produce) if produce.acks == 0);
    let principal = client.principal.clone();
    let peer = client.peer;
    let client_id = header.client_id.as_deref().unwrap_or("");
    let mut throttle = Duration::ZERO;
    // The request_percentage quota's throttle, from the thread time the
    // handling took.
    let mut request_throttle = Duration::ZERO;
    let measure = ctx.quotas.enabled(Kind::Request);
    let encoded = match body {
        RequestKind::Fetch(mut fetch) => {
            // One response never takes more than the quota allows over its
            // window (as Kafka caps max_bytes).
            let window = ctx.quotas.max_in_window(Kind::Fetch, &principal, client_id);
            if let Some(max) = window {
                fetch.max_bytes = fetch.max_bytes.min(i32::try_from(max).unwrap_or(i32::MAX));
                fetch.min_bytes = fetch.min_bytes.min(fetch.max_bytes);
            }
            // The stored batches go out as they came from Redis (see
            // api::fetch::encode).
            let (mut answer, busy) = thread_time(
                measure,
                std::pin::pin!(api::fetch::handle(ctx, &client, &header, fetch)),
            )
            .await;
            request_throttle = ctx.quotas.record_request_time(&principal, client_id, busy);
            crate::metrics::fetch_error_codes(&answer.response, &mut |code| {
                ctx.requests.error(api_key, code)
            });
            let fetched = std::mem::take(&mut answer.fetched);
            // Larger than the quota allows over its whole window: the first
            // batch alone, which a fetch always returns (KIP-74). Taken
            // back, as Kafka takes a response over the quota back, the same
            // fetch would find the same batch next time, and the consumer
            // would never move past it: it is sent, counted, and the
            // client throttled for it.
            let records = || -> usize {
                (answer.records.iter().flatten().flatten().flatten())
                    .map(Bytes::len)
                    .sum()
            };
            let records = window.map_or(0, |_| records());
            let oversized = window.is_some_and(|max| records > max);
            if oversized {
                throttle = ctx.quotas.record(Kind::Fetch, &principal, client_id, records);
                let throttle = throttle.max(request_throttle);
                answer.response.throttle_time_ms = i32::try_from(throttle.as_millis()).unwrap_or(i32::MAX);
                fetched.count(ctx);
            }
            match api::fetch::encode(answer, version, correlation_id) {
                Ok(chunks) if oversized => Ok(Some(chunks)),
                Ok(chunks) => {
                    let bytes = chunks.iter().map(Bytes::len).sum();
                    throttle = ctx.quotas.record(Kind::Fetch, &principal, client_id, bytes);
                    if throttle.is_zero() && request_throttle.is_zero() {
                        fetched.count(ctx);
                        Ok(Some(chunks))
                    } else {
                        // The client gets none of it (Kafka answers a fetch
                        // over either quota empty): uncounted.
                        ctx.quotas.unrecord(Kind::Fetch, &principal, client_id, bytes);
                        let empty = api::fetch::FetchAnswer::throttled(throttle.max(request_throttle));
                        api::fetch::encode(empty, version, correlation_id).map(Some)
                    }
                }
                Err(e) => Err(e),
            }
        }
        body => {
            throttle = asked.throttle;
            let (response, busy) = thread_time(
                measure,
                std::pin::pin!(api::handle(ctx, client, &header, body, turns)),
            )
            .await;
            match response {
                // acks=0 produce: no response, exempt (as in Kafka); a
                // failure closes the connection.
                Some(ResponseKind::Produce(produce)) if silent => {
                    let failed = (produce.responses.iter())
                        .flat_map(|topic| &topic.partition_responses)
                        .find(|partition| partition.error_code != 0);
                    if let Some(partition) = failed {
                        tracing::info!(client_id, %peer, error_code = partition.error_code,
                            "an acks=0 produce failed: closing the connection");
                        ctx.requests.errors(api_key, &ResponseKind::Produce(produce));
                        ctx.requests.answered(api_key, asked.received.elapsed());
                        return Reply::Close;
                    }
                    Ok(None)
                }
                Some(mut response) => {
                    request_throttle = ctx.quotas.record_request_time(&principal, client_id, busy);
                    match &mut response {
                        // Their handlers measure the controller mutation quota.
                        ResponseKind::CreateTopics(r) => throttle = millis(r.throttle_time_ms),
                        ResponseKind::CreatePartitions(r) => throttle = millis(r.throttle_time_ms),
                        ResponseKind::DeleteTopics(r) => throttle = millis(r.throttle_time_ms),
                        _ => {}
                    }
                    // The longer of the throttles is the one the client is told (and waits).
                    set_throttle_time(&mut response, throttle.max(request_throttle));
                    ctx.requests.errors(api_key, &response);
                    encode_response(api_key, version, correlation_id, &response)
                        .map(|bytes| Some(vec![bytes]))
                }
                // A request but a produce without acks that gets no
                // answer closes the connection (Metadata that cannot list
                // the topics): its client would wait for one until its
                // request timeout, then ask again.
                None if !silent => {
                    ctx.requests.answered(api_key, asked.received.elapsed());
                    return Reply::Close;
                }
                None => Ok(None),
            }
        }
    };
    let by_request = request_throttle > throttle;
    let throttle = throttle.max(request_throttle);
    if !throttle.is_zero() {
        let kind = match api_key {
            _ if by_request => Kind::Request,
            ApiKey::Fetch => Kind::Fetch,
            ApiKey::Produce => Kind::Produce,
            _ => Kind::Mutation,
        };
        crate::metrics::quota_throttled(kind, throttle);
        tracing::debug!(principal = %principal, client_id, quota = kind.name(),
            throttle_ms = throttle.as_millis() as u64, "client throttled");
        // Answered at once whatever the version, the connection muted
        // (Kafka since KIP-219): a response held back could time out at a
        // client whose request was already done.
        mute.throttle(asked.seq, throttle);
    }
    let elapsed = asked.received.elapsed();
    ctx.requests.answered(api_key, elapsed);
    tracing::debug!(
        client_id,
        api = ?api_key,
        version,
        correlation_id,
        duration_us = elapsed.as_micros() as u64,
        "request"
    );
    encoded_reply(encoded, api_key, version)
}

/// The reply of an encoded response. One that could not be encoded
/// (logged: a defect) closes the connection: skipping its place would pair
/// each later answer with the request before its own (Java clients fail
/// with a correlation id mismatch, librdkafka waits out its timeout), where
/// the client reconnects and asks again after a close.
fn encoded_reply<E: std::fmt::Display>(
    encoded: Result<Option<Vec<Bytes>>, E>,
    api_key: ApiKey,
    version: i16,
) -> Reply {
    match encoded {
        Ok(Some(chunks)) => Reply::Send(chunks),
        Ok(None) => Reply::Nothing,
        Err(e) => {
            tracing::error!(?api_key, version, error = %e, "cannot encode response: closing the connection");
            Reply::Close
        }
    }
}

/// Answers one request frame (without its size prefix) as a connection
/// would, on its own: the request fuzz target's way in. `Err` is what makes
/// a connection close.
pub async fn answer_frame(ctx: &Context, frame: Bytes) -> Result<Option<Bytes>, ConnectionError> {
    let (header, body) = match decode(frame) {
        Ok(request) => request,
        Err(Rejected::Close(e)) => return Err(e),
        Err(Rejected::Answer(bytes)) => return Ok(Some(bytes)),
    };
    let turns = match &body {
        RequestKind::Produce(produce) => api::produce::Sequencer::default().turns(produce),
        _ => api::produce::Turns::default(),
    };
    let peer = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let asked = Asked {
        received: std::time::Instant::now(),
        seq: 0,
        throttle: Duration::ZERO,
    };
    let reply = respond(
        ctx,
        api::Client::direct(peer),
        header,
        body,
        turns,
        asked,
        &Mute::default(),
    )
    .await;
    match reply {
        Reply::Send(chunks) => Ok(Some(Bytes::from(chunks.concat()))),
        Reply::Nothing => Ok(None),
        Reply::Close => Err(ConnectionError::Invalid(
            "an acks=0 produce failed, or the request could not be answered".to_owned(),
        )),
    }
}

/// What a request does, for ordering it after the earlier requests of its
/// connection (Kafka processes a connection's requests one after another,
/// and clients rely on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// Produce: pipelined; its appends are ordered per partition by the
    /// produce sequencer.
    Produce,
    /// Fetch: pipelined.
    Fetch,
    /// Reads nothing but what earlier requests wrote (Metadata, ListOffsets,
    /// OffsetFetch, …).
    Read,
    /// Changes what later requests see (DeleteRecords, topic and partition
    /// changes, offset commits, group requests, producer ids, …).
    Write,
}

impl Effect {
    fn of(request: &RequestKind) -> Self {
        match request {
            RequestKind::Produce(_) => Effect::Produce,
            RequestKind::Fetch(_) => Effect::Fetch,
            RequestKind::ApiVersions(_)
            | RequestKind::Metadata(_)
            | RequestKind::ListOffsets(_)
            | RequestKind::DescribeConfigs(_)
            | RequestKind::DescribeClientQuotas(_)
            | RequestKind::DescribeCluster(_)
            | RequestKind::DescribeTopicPartitions(_)
            | RequestKind::DescribeLogDirs(_)
            | RequestKind::ListPartitionReassignments(_)
            | RequestKind::FindCoordinator(_)
            | RequestKind::OffsetFetch(_)
            | RequestKind::ListGroups(_)
            | RequestKind::DescribeGroups(_) => Effect::Read,
            _ => Effect::Write,
        }
    }
}

/// A request's completion, as later requests wait for it.
#[derive(Clone)]
struct Done(Arc<tokio::sync::Semaphore>);

impl Done {
    fn taken_effect(&self) -> bool {
        self.0.is_closed()
    }

    async fn wait(self) {
        // The semaphore has no permits: acquiring returns once it is closed.
        let _ = self.0.acquire().await;
    }
}

/// Held by a request while it runs (or by its answer until it is written);
/// dropping it marks the request done.
struct Running(Arc<tokio::sync::Semaphore>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// One connection's ordering: every request other than Produce and Fetch
/// starts once every earlier request of the connection has taken effect;
/// Produce and Fetch start once the last earlier write has. So pipelined
/// produce and fetch requests still overlap, and a request never runs
/// before a DeleteRecords, topic change or offset commit sent before it.
///
/// A Read or Write request also starts only once the answer of the Read or
/// Write before it is written. Their answers' sizes follow the cluster, not
/// the request (a Metadata of every topic, a group's members, its offsets),
/// and take no share of the response budget as a Fetch's does: a client
/// that pipelines them and reads nothing now holds one such answer, not
/// `broker.max_inflight_requests` of them. Kafka answers one request of a
/// connection at a time. Their answers go out in request order anyway, so
/// a client that reads sees no later answer for it.
#[derive(Default)]
struct Order {
    /// The last Read or Write request and every Produce and Fetch after it:
    /// what the next Read or Write waits for.
    since_barrier: Vec<Done>,
    /// The last Write request: what Produce and Fetch wait for.
    last_write: Option<Done>,
    /// The last Read or Write request's answer, until written.
    last_answer: Option<Done>,
}

/// What [`Order::admit`] gives a request.
struct Admit {
    /// What it must wait for.
    after: Vec<Done>,
    /// To drop once it has taken effect.
    done: Running,
    /// A Read or Write request's: to drop once its answer is written.
    written: Option<Running>,
}

impl Order {
    /// What a new request must wait for, and the guards to drop once it
    /// has taken effect and once its answer is written.
    fn admit(&mut self, effect: Effect) -> Admit {
        let semaphore = Arc::new(tokio::sync::Semaphore::new(0));
        let done = Done(semaphore.clone());
        let running = Running(semaphore);
        // Requests that already took effect need no waiting for.
        self.since_barrier.retain(|d| !d.taken_effect());
        if self.last_write.as_ref().is_some_and(Done::taken_effect) {
            self.last_write = None;
        }
        match effect {
            Effect::Produce | Effect::Fetch => {
                self.since_barrier.push(done);
                Admit {
                    after: self.last_write.iter().cloned().collect(),
                    done: running,
                    written: None,
                }
            }
            Effect::Read | Effect::Write => {
                let mut after = std::mem::replace(&mut self.since_barrier, vec![done.clone()]);
                if effect == Effect::Write {
                    self.last_write = Some(done);
                }
                let answer = Arc::new(tokio::sync::Semaphore::new(0));
                let previous = self.last_answer.replace(Done(answer.clone()));
                after.extend(previous.filter(|d| !d.taken_effect()));
                Admit {
                    after,
                    done: running,
                    written: Some(Running(answer)),
                }
            }
        }
    }
}

/// How long closing a connection's write side may wait for a client that
/// reads nothing.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Writes the connection's responses in request order as they become ready,
/// those the requests' own tasks did not write (see `responses.rs`), until
/// the reader is done and everything admitted is written (or the client's
/// socket fails, or a request's task ended without an answer).
async fn write_responses(responses: Arc<Responses>) {
    loop {
        let drained = {
            let mut out = responses.out.lock().await;
            responses.drain(&mut out).await
        };
        match drained {
            Drained::Waiting => responses.changed().await,
            Drained::Abandoned => {
                tracing::error!("request handler panicked; closing connection");
                break;
            }
            Drained::Closed | Drained::End | Drained::Failed => break,
        }
    }
    responses.stop();
    // Closes the connection's write side (the client sees it end, over TLS
    // too: its close_notify, then the socket's), even while requests'
    // tasks still hold the responses.
    let out = responses.out.lock().await.take();
    if let Some(mut out) = out {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, out.shutdown()).await;
    }
}

/// Writes a response's chunks: one write of the whole list (`writev`), so a
/// Fetch response's batches are not copied into a buffer first.
async fn write_chunks<W: tokio::io::AsyncWrite + Unpin>(
    write: &mut W,
    chunks: &[Bytes],
) -> std::io::Result<()> {
    if let [one] = chunks {
        return write.write_all(one).await;
    }
    let mut slices: Vec<std::io::IoSlice<'_>> = chunks.iter().map(|c| std::io::IoSlice::new(c)).collect();
    let mut slices = &mut slices[..];
    while !slices.is_empty() {
        // IOV_MAX is 1024 on Linux.
        let upto = slices.len().min(1024);
        let written = write.write_vectored(&slices[..upto]).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        std::io::IoSlice::advance_slices(&mut slices, written);
    }
    Ok(())
}

/// Reads one size-prefixed frame; `None` at a clean end of stream.
pub(crate) async fn read_frame<R: AsyncReadExt + Unpin>(
    read: &mut R,
    max: u32,
) -> Result<Option<Bytes>, ConnectionError> {
    let mut size = [0u8; 4];
    match read.read_exact(&mut size).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let size = i32::from_be_bytes(size);
    if size < 0 || size as u32 > max {
        return Err(ConnectionError::FrameTooLarge(i64::from(size), max));
    }
    let size = size as usize;
    // Trust the length up to FIRST_ALLOCATION; past that, only once that
    // much has actually arrived (one reallocation at most).
    let mut buf = BytesMut::with_capacity(size.min(FIRST_ALLOCATION));
    while buf.len() < size {
        if buf.len() == buf.capacity() {
            buf.reserve(size - buf.len());
        }
        let wanted = size - buf.len();
        let n = read.read_buf(&mut (&mut buf).limit(wanted)).await?;
        if n == 0 {
            return Err(ConnectionError::Truncated {
                got: buf.len(),
                expected: size,
            });
        }
    }
    Ok(Some(buf.freeze()))
}

pub(crate) enum Rejected {
    /// Close the connection.
    Close(ConnectionError),
    /// Send these bytes (an error response) and go on.
    Answer(Bytes),
}

/// Decodes the header and body of a request frame.
pub(crate) fn decode(mut frame: Bytes) -> Result<(RequestHeader, RequestKind), Rejected> {
    let invalid = |m: String| Rejected::Close(ConnectionError::Invalid(m));
    if frame.len() < 8 {
        return Err(invalid(format!("request of {} bytes has no header", frame.len())));
    }
    let key = (&frame[0..2]).get_i16();
    let version = (&frame[2..4]).get_i16();
    let correlation_id = (&frame[4..8]).get_i32();
    let api_key = ApiKey::try_from(key).map_err(|_| invalid(format!("unknown API key {key}")))?;
    let Some(range) = api::supported_versions(api_key) else {
        return Err(invalid(format!("API {api_key:?} is not supported")));
    };
    if version < range.0 || version > range.1 {
        if api_key == ApiKey::ApiVersions {
            // KIP-511: answer with v0 and the versions we support.
            return Err(Rejected::Answer(api::api_versions::unsupported_version_response(
                correlation_id,
            )));
        }
        return Err(invalid(format!(
            "{api_key:?} v{version} is not supported (supported: v{}-v{})",
            range.0, range.1
        )));
    }
    let header = RequestHeader::decode(&mut frame, api_key.request_header_version(version))
        .map_err(|e| invalid(format!("{api_key:?} v{version} header: {e}")))?;
    let body = RequestKind::decode(api_key, &mut frame, version)
        .map_err(|e| invalid(format!("{api_key:?} v{version} body: {e}")))?;
    Ok((header, body))
}

/// Encodes a size-prefixed response frame.
pub fn encode_response(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &ResponseKind,
) -> anyhow::Result<Bytes> {
    // Fetch responses carry the record bytes: size the buffer once.
    let body_size = match body {
        ResponseKind::Fetch(fetch) => fetch.compute_size(version).unwrap_or(0),
        _ => 0,
    };
    let mut buf = BytesMut::with_capacity(64 + body_size);
    buf.put_i32(0);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, api_key.response_header_version(version))?;
    body.encode(&mut buf, version)?;
    let size = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A response that cannot be encoded at its version (a field its
    /// version lacks, set: a defect) closes the connection; it used to be
    /// skipped, and the client paired each later answer with the request
    /// before its own.
    #[test]
    fn a_response_that_cannot_be_encoded_closes_the_connection() {
        use kafka_protocol::messages::DescribeGroupsResponse;
        use kafka_protocol::messages::describe_groups_response::DescribedGroup;
        let response = ResponseKind::DescribeGroups(
            DescribeGroupsResponse::default()
                .with_groups(vec![DescribedGroup::default().with_authorized_operations(8)]),
        );
        let encoded = encode_response(ApiKey::DescribeGroups, 2, 7, &response).map(|b| Some(vec![b]));
        assert!(encoded.is_err(), "authorized operations before v3");
        assert!(matches!(
            encoded_reply(encoded, ApiKey::DescribeGroups, 2),
            Reply::Close
        ));
        let fine = encode_response(ApiKey::DescribeGroups, 3, 7, &response).map(|b| Some(vec![b]));
        assert!(matches!(
            encoded_reply(fine, ApiKey::DescribeGroups, 3),
            Reply::Send(_)
        ));
    }

    #[tokio::test]
    async fn an_addresss_connections_are_counted_against_its_own_limit() {
        let broker = ketch_config::BrokerSettings {
            max_connections_per_ip: 2,
            max_connections_per_ip_overrides: "10.0.0.9:0, 10.0.0.8:1".to_owned(),
            ..Default::default()
        };
        let limits = Arc::new(PerAddress::new(&broker).await.expect("limits"));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let first = limits.admit(ip("10.0.0.1")).expect("first");
        let _second = limits.admit(ip("10.0.0.1")).expect("second");
        assert_eq!(limits.admit(ip("10.0.0.1")).err(), Some(2));
        assert!(limits.admit(ip("10.0.0.2")).is_ok(), "another address");
        drop(first);
        assert!(limits.admit(ip("10.0.0.1")).is_ok(), "a place given back");
        assert_eq!(limits.admit(ip("10.0.0.9")).err(), Some(0));
        let only = limits.admit(ip("10.0.0.8")).expect("its one");
        assert_eq!(limits.admit(ip("10.0.0.8")).err(), Some(1));
        // An IPv4 client of a dual-stack listener is its IPv4 address.
        let mapped = ip("::ffff:10.0.0.8");
        assert_eq!(limits.admit(mapped).err(), Some(1), "counted with 10.0.0.8's");
        // Addresses without connections are not kept.
        drop(only);
        assert!(!limits.open.lock().unwrap().contains_key(&ip("10.0.0.8")));
        assert!(!limits.open.lock().unwrap().contains_key(&ip("10.0.0.9")));
    }

    /// A request's task that ends without an answer (a panic) ends the
    /// connection's writing once the answers before it are written: the
    /// client sees them, then the end of the stream.
    #[tokio::test]
    async fn an_abandoned_request_closes_the_connection_after_the_answers_before_it() {
        let (write, mut read) = tokio::io::duplex(1 << 16);
        let responses = Responses::new(8, Duration::from_secs(60), write);
        let writer = tokio::spawn(write_responses(responses.clone()));
        let first = responses.place().await.expect("room");
        let second = responses.place().await.expect("room");
        drop(second);
        first
            .fill(Some(Response::bare(vec![Bytes::from_static(b"answer")])))
            .await;
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), read.read_to_end(&mut got))
            .await
            .expect("the stream ends")
            .expect("read");
        assert_eq!(got, b"answer");
        writer.await.expect("the writer ends");
        assert!(responses.place().await.is_none());
    }

    /// A client that reads none of its answers: the write fails once it
    /// has made no progress for the stall limit (`connections_max_idle`),
    /// and the writer ends, so the connection closes and its slot and
    /// queued answers are freed; one that reads, however slowly, is
    /// written to to the end.
    #[tokio::test]
    async fn a_client_that_reads_nothing_is_given_up_after_the_stall_limit() {
        const ANSWER: usize = 256 * 1024;
        let (write, mut read) = tokio::io::duplex(1024);
        let responses = Responses::new(8, Duration::from_millis(200), write);
        let writer = tokio::spawn(write_responses(responses.clone()));
        let answer = |responses: Arc<Responses>| async move {
            let place = responses.place().await.expect("room");
            place
                .fill(Some(Response::bare(vec![Bytes::from(vec![7u8; ANSWER])])))
                .await;
        };
        // Read slowly: 1 KiB every 10 ms is progress, however slow (the
        // answer takes 2.5 s, far past the limit).
        let reading = tokio::spawn(async move {
            let mut got = vec![0u8; ANSWER];
            for chunk in got.chunks_mut(1024) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                read.read_exact(chunk).await.expect("read");
            }
            (read, got)
        });
        answer(responses.clone()).await;
        let (read, got) = reading.await.expect("the reader");
        assert!(got.iter().all(|b| *b == 7));
        // Then read nothing more.
        let stalled = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(10), answer(responses.clone()))
            .await
            .expect("the write gives up");
        tokio::time::timeout(Duration::from_secs(10), writer)
            .await
            .expect("the writer ends")
            .expect("no panic");
        assert!(stalled.elapsed() >= Duration::from_millis(200));
        assert!(responses.place().await.is_none());
        drop(read);
    }

    /// A request admitted on a connection with `order` and `responses`, as
    /// the reader admits it.
    async fn admitted(
        ctx: &Arc<Context>,
        order: &mut Order,
        responses: &Arc<Responses>,
        header: RequestHeader,
        request: RequestKind,
    ) -> Admitted {
        let budget = Arc::new(tokio::sync::Semaphore::new(1));
        let Admit { after, done, written } = order.admit(Effect::of(&request));
        Admitted {
            ctx: ctx.clone(),
            client: api::Client {
                peer: "127.0.0.1:9092".parse().expect("an address"),
                principal: Arc::from("User:ANONYMOUS"),
                forwarded: false,
                listener: Arc::from(""),
            },
            request: (header, request),
            turns: Default::default(),
            asked: Asked {
                received: std::time::Instant::now(),
                seq: 0,
                throttle: Duration::ZERO,
            },
            after,
            done,
            written,
            mute: Arc::default(),
            held: budget.try_acquire_owned().expect("a permit"),
            reserved: None,
            place: responses.place().await.expect("room"),
            gone: None,
            _inflight: ctx.requests.request(),
        }
    }

    /// A throttle holds the requests read after the one that earned it,
    /// not those read before (Kafka handles those first): a Metadata read
    /// before a throttled request is answered at once, one read after it
    /// waits the throttle out. Before, every request waited for every
    /// throttle, and an answer held back held the throttled request's own
    /// behind it: its client then waited twice.
    #[tokio::test(start_paused = true)]
    async fn a_throttle_holds_only_the_requests_read_after_the_one_that_earned_it() {
        let ctx = memory_context();
        let responses = Responses::new(8, Duration::from_secs(3600), tokio::io::sink());
        let mut order = Order::default();
        let mute = Arc::new(Mute::default());
        let mut metadata = async |seq: u64| {
            let header = RequestHeader::default()
                .with_request_api_key(ApiKey::Metadata as i16)
                .with_request_api_version(12)
                .with_correlation_id(i32::try_from(seq).expect("small"));
            let body = RequestKind::Metadata(Default::default());
            let mut request = admitted(&ctx, &mut order, &responses, header, body).await;
            request.asked.seq = seq;
            request.mute = mute.clone();
            request
        };
        let (before, after) = (metadata(1).await, metadata(3).await);
        // The request read second is throttled for a minute.
        mute.throttle(2, Duration::from_secs(60));
        let (before, after) = (tokio::spawn(before.serve()), tokio::spawn(after.serve()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            before.is_finished(),
            "a request read before waited for the throttle"
        );
        assert!(!after.is_finished(), "a request read after did not wait");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(after.is_finished());
        // Lifted (the connection closing), nothing waits.
        mute.throttle(4, Duration::from_secs(60));
        let waiting = tokio::spawn({
            let mute = mute.clone();
            async move { mute.wait_for(5).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished());
        mute.lift();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(waiting.is_finished());
    }

    fn memory_context() -> Arc<Context> {
        let (_stop, shutdown) = watch::channel(false);
        Arc::new(Context::new(
            ketch_config::Settings::default(),
            Arc::new(crate::memory::MemoryStorage::default()),
            Arc::default(),
            shutdown,
        ))
    }

    /// A client that pipelines Metadata requests and reads no answer holds
    /// one answer in the gateway, not one per request: the next Read starts
    /// once the answer before it is written. A Fetch or Produce does not
    /// wait for it.
    #[tokio::test(start_paused = true)]
    async fn a_read_starts_once_the_answer_of_the_read_before_it_is_written() {
        let ctx = memory_context();
        // A pipe that takes 8 bytes: the first answer cannot be written
        // until the client reads.
        let (write, mut read) = tokio::io::duplex(8);
        let responses = Responses::new(8, Duration::from_secs(3600), write);
        let writer = tokio::spawn(write_responses(responses.clone()));
        let mut order = Order::default();
        let metadata = |correlation_id| {
            let header = RequestHeader::default()
                .with_request_api_key(ApiKey::Metadata as i16)
                .with_request_api_version(12)
                .with_correlation_id(correlation_id);
            (header, RequestKind::Metadata(Default::default()))
        };
        let mut tasks = Vec::new();
        for id in 1..=3 {
            let (header, body) = metadata(id);
            let request = admitted(&ctx, &mut order, &responses, header, body).await;
            tasks.push(tokio::spawn(request.serve()));
        }
        let fetch = RequestKind::Fetch(Default::default());
        let header = RequestHeader::default()
            .with_request_api_key(ApiKey::Fetch as i16)
            .with_request_api_version(12)
            .with_correlation_id(4);
        let fetch = tokio::spawn(
            admitted(&ctx, &mut order, &responses, header, fetch)
                .await
                .serve(),
        );
        // Until nothing runs (the clock is paused: it moves only then).
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!tasks[0].is_finished(), "the first answer is being written");
        assert!(
            !tasks[1].is_finished() && !tasks[2].is_finished(),
            "the next Metadata requests wait for it to be written"
        );
        assert!(fetch.is_finished(), "a Fetch does not wait for it");

        // The client reads: every answer comes, in order.
        responses.close();
        let mut got = Vec::new();
        read.read_to_end(&mut got).await.expect("read");
        for task in tasks {
            task.await.expect("served");
        }
        writer.await.expect("the writer ends");
        let mut ids = Vec::new();
        let mut frames = &got[..];
        while frames.len() >= 8 {
            let size = i32::from_be_bytes(frames[..4].try_into().unwrap()) as usize;
            ids.push(i32::from_be_bytes(frames[4..8].try_into().unwrap()));
            frames = &frames[4 + size..];
        }
        assert_eq!(ids, [1, 2, 3, 4]);
    }

    /// Every request spawns a task of [`Admitted::serve`], which tokio
    /// copies whole as it starts and finishes it; the task boxes
    /// [`respond`]. Together they were one 8 KiB future: `thread_time`
    /// stored the handler's future twice, and every handler's state was in
    /// it.
    /// Every request spawns a task of [`Admitted::serve`], which tokio
    /// copies whole as it starts and finishes it; the task boxes
    /// [`respond`]. Together they were one 8 KiB future: `thread_time`
    /// stored the handler's future twice, and every handler's state was in
    /// it.
    #[tokio::test]
    async fn a_request_task_stays_small() {
        let ctx = memory_context();
        let responses = Responses::new(1, Duration::from_secs(60), tokio::io::sink());
        let request = RequestKind::Produce(Default::default());
        let admitted = admitted(
            &ctx,
            &mut Order::default(),
            &responses,
            RequestHeader::default(),
            request,
        )
        .await;
        let response = respond(
            &ctx,
            admitted.client.clone(),
            admitted.request.0.clone(),
            RequestKind::Produce(Default::default()),
            Default::default(),
            admitted.asked,
            &admitted.mute,
        );
        let respond_size = std::mem::size_of_val(&response);
        assert!(
            respond_size <= 3072,
            "respond's future is {respond_size} bytes (at most 3072)"
        );
        drop(response);
        let task = admitted.serve();
        let size = std::mem::size_of_val(&task);
        let limit = 1536;
        assert!(
            size <= limit,
            "a request's task future is {size} bytes (at most {limit})"
        );
    }

    #[tokio::test]
    async fn oversized_and_negative_frames_are_refused_before_allocation() {
        let mut wire: &[u8] = &i32::MAX.to_be_bytes();
        assert!(matches!(
            read_frame(&mut wire, 1024).await,
            Err(ConnectionError::FrameTooLarge(..))
        ));
        let mut wire: &[u8] = &(-1i32).to_be_bytes();
        assert!(matches!(
            read_frame(&mut wire, 1024).await,
            Err(ConnectionError::FrameTooLarge(..))
        ));
    }

    #[tokio::test]
    async fn truncated_frame_is_an_error_and_clean_eof_is_not() {
        let mut wire: &[u8] = &[0, 0, 0, 10, 1, 2, 3];
        assert!(matches!(
            read_frame(&mut wire, 1024).await,
            Err(ConnectionError::Truncated { got: 3, .. })
        ));
        let mut wire: &[u8] = &[];
        assert!(read_frame(&mut wire, 1024).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn reads_and_writes_wait_for_everything_before_them_produce_and_fetch_only_for_writes() {
        let mut order = Order::default();
        // Each Read's and Write's answer counts as written at once here
        // (see the end, and the test above).
        let mut order = move |effect| {
            let Admit { after, done, .. } = order.admit(effect);
            (after, done)
        };
        let (after, produce) = order(Effect::Produce);
        assert!(after.is_empty());
        let (after, fetch) = order(Effect::Fetch);
        assert!(after.is_empty());
        let (write_after, write) = order(Effect::Write);
        assert_eq!(
            write_after.len(),
            2,
            "a write waits for the produce and the fetch"
        );
        let (produce_after, late_produce) = order(Effect::Produce);
        assert_eq!(produce_after.len(), 1, "a produce waits for the write only");
        let (read_after, read) = order(Effect::Read);
        assert_eq!(
            read_after.len(),
            2,
            "a read waits for the write and the produce after it"
        );
        let (fetch_after, late_fetch) = order(Effect::Fetch);
        assert_eq!(fetch_after.len(), 1, "a fetch does not wait for a read");

        let all = futures::future::join_all(write_after.into_iter().map(Done::wait));
        tokio::pin!(all);
        assert!(futures::poll!(&mut all).is_pending());
        drop(produce);
        assert!(futures::poll!(&mut all).is_pending());
        drop(fetch);
        all.await;
        drop(write);
        futures::future::join_all(produce_after.into_iter().map(Done::wait)).await;
        drop((late_produce, read));
        let (after, _) = order(Effect::Write);
        assert_eq!(after.len(), 1, "what has taken effect is not waited for");
        drop(late_fetch);
        futures::future::join_all(after.into_iter().map(Done::wait)).await;

        // A Read or Write waits for the answer of the one before it too.
        let mut order = Order::default();
        let first = order.admit(Effect::Read);
        drop(first.done);
        let second = order.admit(Effect::Read);
        assert_eq!(second.after.len(), 1, "the first Read's answer, not yet written");
        let fetch = order.admit(Effect::Fetch);
        assert!(fetch.after.is_empty(), "a Fetch waits for no answer");
        let waiting = futures::future::join_all(second.after.into_iter().map(Done::wait));
        tokio::pin!(waiting);
        assert!(futures::poll!(&mut waiting).is_pending());
        drop(first.written);
        waiting.await;
    }

    #[test]
    fn unknown_api_key_closes() {
        let frame = Bytes::from_static(&[0x7f, 0x00, 0, 0, 0, 0, 0, 1, 0, 0]);
        assert!(matches!(decode(frame), Err(Rejected::Close(_))));
    }
}
