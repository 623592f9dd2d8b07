//! Gateway-to-gateway forwarding of group requests (architecture §6).
//!
//! A group is run by one gateway, its coordinator. When a client's group
//! request lands on another gateway — always possible behind a load
//! balancer, where every gateway advertises the same address — that gateway
//! forwards it to the coordinator's internal listener (`cluster.internal_*`)
//! and relays the answer. The request travels whole, with the client's
//! identity, in Kafka's own `Envelope` (API key 58, KIP-590: the request's
//! bytes, the principal and the client's address), so the coordinator
//! handles it exactly as if the client had sent it: a parked JoinGroup stays
//! parked there until its rebalance completes, whichever gateways the other
//! members came through.
//!
//! The internal listener accepts only Envelopes, and of those only group
//! requests; a forwarded request is never forwarded again (a gateway that
//! no longer coordinates the group answers NOT_COORDINATOR and the client
//! looks the coordinator up again). Each forwarded request has a connection
//! of its own for its duration (a JoinGroup may wait minutes), taken from a
//! small pool of idle connections per coordinator.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ApiKey, DeleteGroupsRequest, DescribeGroupsRequest, EnvelopeRequest, EnvelopeResponse, HeartbeatRequest,
    JoinGroupRequest, LeaveGroupRequest, ListGroupsRequest, OffsetCommitRequest, OffsetDeleteRequest,
    RequestHeader, RequestKind, ResponseHeader, ResponseKind, SyncGroupRequest, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::api::{self, Client};
use crate::{Context, server};

/// The internal listener's challenge, in bytes.
const NONCE_BYTES: usize = 32;

/// How long a gateway connecting to the internal listener has to prove it
/// knows the internal secret.
const PROOF_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle connections kept per coordinator.
const IDLE_PER_PEER: usize = 8;

/// What an Envelope adds to the request it carries, at most: its header,
/// the principal and the client's address.
const ENVELOPE_OVERHEAD: u32 = 64 * 1024;

/// Why a request could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cannot reach {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("i/o with {0}: {1}")]
    Io(String, std::io::Error),
    #[error("no answer from {0} within {1:?}")]
    Timeout(String, Duration),
    #[error("{0} refused the forwarded request: error {1}")]
    Refused(String, i16),
    #[error("invalid answer from {0}: {1}")]
    Protocol(String, String),
    #[error("shutting down")]
    ShuttingDown,
}

/// Forwards requests to other gateways' internal listeners.
pub struct Forwarder {
    idle: Mutex<HashMap<String, Vec<TcpStream>>>,
    connect_timeout: Duration,
    correlation: AtomicI32,
    shutdown: watch::Receiver<bool>,
}

impl Forwarder {
    pub fn new(connect_timeout: Duration, shutdown: watch::Receiver<bool>) -> Self {
        Self {
            idle: Mutex::new(HashMap::new()),
            connect_timeout,
            correlation: AtomicI32::new(0),
            shutdown,
        }
    }

    /// Sends `request` (with the client's `header`) to the gateway at `to`
    /// in an Envelope carrying `client`'s identity; its answer.
    pub async fn forward<R: Request>(
        &self,
        to: &str,
        header: &RequestHeader,
        request: &R,
        client: &Client,
        timeout: Duration,
        secret: Option<Arc<[u8]>>,
    ) -> Result<R::Response, ForwardError> {
        let version = header.request_api_version;
        let protocol = |m: String| ForwardError::Protocol(to.to_owned(), m);
        let inner = encode_request(header, request, false).map_err(|e| protocol(format!("encoding: {e}")))?;
        let envelope = EnvelopeRequest::default()
            .with_request_data(inner)
            .with_request_principal(Some(Bytes::from(client.principal.as_bytes().to_vec())))
            .with_client_host_address(match client.peer.ip() {
                IpAddr::V4(ip) => Bytes::copy_from_slice(&ip.octets()),
                IpAddr::V6(ip) => Bytes::copy_from_slice(&ip.octets()),
            });
        let correlation_id = self.correlation.fetch_add(1, Ordering::Relaxed);
        let envelope_header = RequestHeader::default()
            .with_request_api_key(ApiKey::Envelope as i16)
            .with_request_api_version(0)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("ketch-forwarder")));
        let frame = encode_request(&envelope_header, &envelope, true)
            .map_err(|e| protocol(format!("encoding: {e}")))?;

        let mut shutdown = self.shutdown.clone();
        let mut conn = self.checkout(to, secret.as_deref()).await?;
        let answer = tokio::select! {
            answer = tokio::time::timeout(timeout, self.exchange(&mut conn, &frame, to)) => answer,
            _ = shutdown.wait_for(|stop| *stop) => return Err(ForwardError::ShuttingDown),
        };
        // A request is sent once: after a failure the coordinator may or
        // may not have handled it, and the client decides whether to retry.
        let answer = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(ForwardError::Timeout(to.to_owned(), timeout)),
        };
        let mut answer = answer;
        let answer_header = ResponseHeader::decode(&mut answer, ApiKey::Envelope.response_header_version(0))
            .map_err(|e| protocol(format!("envelope header: {e}")))?;
        if answer_header.correlation_id != correlation_id {
            return Err(protocol(format!(
                "correlation id {} for {correlation_id}",
                answer_header.correlation_id
            )));
        }
        let envelope =
            EnvelopeResponse::decode(&mut answer, 0).map_err(|e| protocol(format!("envelope: {e}")))?;
        self.checkin(to, conn);
        if envelope.error_code != 0 {
            return Err(ForwardError::Refused(to.to_owned(), envelope.error_code));
        }
        let mut inner = envelope
            .response_data
            .ok_or_else(|| protocol("an envelope without a response".to_owned()))?;
        let api_key = ApiKey::try_from(R::KEY).map_err(|_| protocol(format!("API key {}", R::KEY)))?;
        ResponseHeader::decode(&mut inner, api_key.response_header_version(version))
            .map_err(|e| protocol(format!("response header: {e}")))?;
        R::Response::decode(&mut inner, version).map_err(|e| protocol(format!("{api_key:?} v{version}: {e}")))
    }

    /// Sends a frame and reads the answer's frame, whatever its size (as a
    /// Kafka client reads answers): `broker.max_request_bytes` bounds what
    /// clients send, and an answer may be far larger than its request (a
    /// JoinGroup leader's lists every member's metadata, a DescribeGroups
    /// every member's assignment); held to that bound, it failed with
    /// COORDINATOR_NOT_AVAILABLE through every gateway but the
    /// coordinator.
    async fn exchange(&self, conn: &mut TcpStream, frame: &[u8], to: &str) -> Result<Bytes, ForwardError> {
        conn.write_all(frame)
            .await
            .map_err(|e| ForwardError::Io(to.to_owned(), e))?;
        server::read_frame(conn, i32::MAX as u32)
            .await
            .map_err(|e| ForwardError::Protocol(to.to_owned(), e.to_string()))?
            .ok_or_else(|| ForwardError::Protocol(to.to_owned(), "connection closed".to_owned()))
    }

    /// An idle pooled connection the coordinator has not closed, or a new
    /// one. A pooled connection is checked before anything is sent on it
    /// (the coordinator closes connections idle for
    /// `broker.connections_max_idle`, and a restarted one closes them all),
    /// so a request never goes out twice.
    async fn checkout(&self, to: &str, secret: Option<&[u8]>) -> Result<TcpStream, ForwardError> {
        loop {
            let idle = self
                .idle
                .lock()
                .expect("forwarder lock")
                .get_mut(to)
                .and_then(Vec::pop);
            let Some(conn) = idle else {
                return self.connect(to, secret).await;
            };
            // Nothing is due on an idle connection: readable means closed
            // (or garbage); would-block means it is still open.
            match conn.try_read(&mut [0u8; 1]) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(conn),
                _ => continue,
            }
        }
    }

    /// Drops the idle connections to gateways not in `live` (internal
    /// addresses).
    pub fn keep_peers(&self, live: &[String]) {
        let mut idle = self.idle.lock().expect("forwarder lock");
        idle.retain(|address, _| live.contains(address));
    }

    async fn connect(&self, to: &str, secret: Option<&[u8]>) -> Result<TcpStream, ForwardError> {
        let connect = tokio::time::timeout(self.connect_timeout, TcpStream::connect(to)).await;
        let conn = match connect {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return Err(ForwardError::Connect(to.to_owned(), e)),
            Err(_) => {
                return Err(ForwardError::Connect(
                    to.to_owned(),
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
                ));
            }
        };
        let _ = conn.set_nodelay(true);
        let mut conn = conn;
        if let Some(secret) = secret {
            self.prove(&mut conn, to, secret).await?;
        }
        Ok(conn)
    }

    /// Answers the internal listener's challenge: its nonce, then our
    /// proof of the internal secret.
    async fn prove(&self, conn: &mut TcpStream, to: &str, secret: &[u8]) -> Result<(), ForwardError> {
        let protocol = |m: String| ForwardError::Protocol(to.to_owned(), m);
        let nonce = tokio::time::timeout(self.connect_timeout, server::read_frame(conn, NONCE_BYTES as u32))
            .await
            .map_err(|_| protocol("no challenge from the internal listener".to_owned()))?
            .map_err(|e| protocol(format!("challenge: {e}")))?
            .ok_or_else(|| protocol("closed before its challenge".to_owned()))?;
        let proof = crate::auth::internal_proof(secret, &nonce);
        let mut frame = BytesMut::with_capacity(4 + proof.len());
        frame.put_i32(proof.len() as i32);
        frame.put_slice(&proof);
        conn.write_all(&frame)
            .await
            .map_err(|e| ForwardError::Io(to.to_owned(), e))
    }

    fn checkin(&self, to: &str, conn: TcpStream) {
        let mut idle = self.idle.lock().expect("forwarder lock");
        let pool = idle.entry(to.to_owned()).or_default();
        if pool.len() < IDLE_PER_PEER {
            pool.push(conn);
        }
    }
}

/// A request (header and body) as a frame's bytes: size-prefixed (to
/// send), or not (an Envelope's payload).
fn encode_request<R: Request>(header: &RequestHeader, request: &R, sized: bool) -> anyhow::Result<Bytes> {
    let version = header.request_api_version;
    let api_key = ApiKey::try_from(R::KEY).map_err(|_| anyhow::anyhow!("unknown API key {}", R::KEY))?;
    let mut buf = BytesMut::new();
    if sized {
        buf.put_i32(0);
    }
    header.encode(&mut buf, api_key.request_header_version(version))?;
    request.encode(&mut buf, version)?;
    if sized {
        let size = i32::try_from(buf.len() - 4)?;
        buf[0..4].copy_from_slice(&size.to_be_bytes());
    }
    Ok(buf.freeze())
}

/// The group requests a gateway forwards and accepts forwarded.
fn forwardable(request: &RequestKind) -> bool {
    matches!(
        request,
        RequestKind::JoinGroup(_)
            | RequestKind::SyncGroup(_)
            | RequestKind::Heartbeat(_)
            | RequestKind::LeaveGroup(_)
            | RequestKind::OffsetCommit(_)
            | RequestKind::OffsetDelete(_)
            | RequestKind::DescribeGroups(_)
            | RequestKind::DeleteGroups(_)
            | RequestKind::ListGroups(_)
            | RequestKind::TxnOffsetCommit(_)
    )
}

/// The internal listener: answers Envelopes from other gateways until
/// `shutdown`. In-flight forwarded requests are answered by the group
/// coordinator's own shutdown handling.
pub async fn serve(listener: TcpListener, ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let for_connections = shutdown.clone();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        match accepted {
            Ok((socket, peer)) => {
                let _ = socket.set_nodelay(true);
                let ctx = ctx.clone();
                let shutdown = for_connections.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(socket, peer, ctx, shutdown).await {
                        tracing::debug!(%peer, error = %e, "closing internal connection");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "internal listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One internal connection: one Envelope at a time (the forwarding
/// gateway sends the next only once this one is answered).
async fn connection(
    mut socket: TcpStream,
    peer: SocketAddr,
    ctx: Arc<Context>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), server::ConnectionError> {
    // A client's largest request, in an Envelope with the client's identity.
    let max = ctx
        .settings
        .broker
        .max_request_bytes
        .saturating_add(ENVELOPE_OVERHEAD);
    let idle = ctx.settings.broker.connections_max_idle.get();
    challenge(&mut socket, &ctx).await?;
    loop {
        let frame = tokio::select! {
            frame = tokio::time::timeout(idle, server::read_frame(&mut socket, max)) => match frame {
                Ok(frame) => frame?,
                Err(_) => return Err(server::ConnectionError::Idle(idle)),
            },
            _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
        };
        let Some(mut frame) = frame else {
            return Ok(());
        };
        let invalid = |m: String| server::ConnectionError::Invalid(m);
        let header = RequestHeader::decode(&mut frame, ApiKey::Envelope.request_header_version(0))
            .map_err(|e| invalid(format!("internal listener: header: {e}")))?;
        if header.request_api_key != ApiKey::Envelope as i16 || header.request_api_version != 0 {
            return Err(invalid(format!(
                "internal listener: API key {} v{} (only Envelope v0 is accepted here)",
                header.request_api_key, header.request_api_version
            )));
        }
        let envelope = EnvelopeRequest::decode(&mut frame, 0)
            .map_err(|e| invalid(format!("internal listener: envelope: {e}")))?;
        let response = ResponseKind::Envelope(unwrap(&ctx, peer, envelope).await);
        let frame = server::encode_response(ApiKey::Envelope, 0, header.correlation_id, &response)
            .map_err(|e| invalid(e.to_string()))?;
        socket.write_all(&frame).await?;
    }
}

/// With ACLs on, a connecting gateway must prove it knows the internal
/// secret before its first Envelope: the principal an Envelope names is
/// what its request is authorised as, so nothing but a gateway may send
/// one. The listener sends a random nonce; the gateway answers
/// HMAC-SHA256(secret, label ‖ nonce).
async fn challenge(socket: &mut TcpStream, ctx: &Context) -> Result<(), server::ConnectionError> {
    let refuse = |m: String| server::ConnectionError::Auth(format!("internal listener: {m}"));
    let secret = match ctx.security.internal_secret(ctx.storage.as_ref()).await {
        Ok(None) => return Ok(()),
        Ok(Some(secret)) => secret,
        Err(e) => return Err(refuse(format!("cannot read the internal secret: {e}"))),
    };
    let nonce: [u8; NONCE_BYTES] = rand::random();
    let mut frame = BytesMut::with_capacity(4 + NONCE_BYTES);
    frame.put_i32(NONCE_BYTES as i32);
    frame.put_slice(&nonce);
    socket.write_all(&frame).await?;
    let proof = tokio::time::timeout(PROOF_TIMEOUT, server::read_frame(socket, 64))
        .await
        .map_err(|_| refuse("no proof of the internal secret in time".to_owned()))??
        .ok_or_else(|| refuse("closed before proving the internal secret".to_owned()))?;
    // A wrong proof may be the connecting gateway's knowing a secret made
    // anew since this one read it (the key was lost): read it again.
    let proven = crate::auth::verify_internal_proof(&secret, &nonce, &proof)
        || match ctx
            .security
            .internal_secret_after_wrong_proof(ctx.storage.as_ref())
            .await
        {
            Ok(Some(again)) => again != secret && crate::auth::verify_internal_proof(&again, &nonce, &proof),
            _ => false,
        };
    if !proven {
        tracing::warn!(peer = ?socket.peer_addr().ok(), "a connection to the internal listener did not prove the internal secret");
        return Err(refuse("wrong proof of the internal secret".to_owned()));
    }
    Ok(())
}

/// Handles the request inside an Envelope as its client's own.
async fn unwrap(ctx: &Context, forwarder: SocketAddr, envelope: EnvelopeRequest) -> EnvelopeResponse {
    let refuse = |error: ResponseError| EnvelopeResponse::default().with_error_code(error.code());
    let (header, body) = match server::decode(envelope.request_data) {
        Ok(request) => request,
        Err(_) => return refuse(ResponseError::InvalidRequest),
    };
    if !forwardable(&body) {
        tracing::warn!(%forwarder, api_key = header.request_api_key, "refusing a forwarded request that is not a group request");
        return refuse(ResponseError::InvalidRequest);
    }
    let ip: Option<IpAddr> = match envelope.client_host_address.len() {
        4 => <[u8; 4]>::try_from(&envelope.client_host_address[..])
            .ok()
            .map(IpAddr::from),
        16 => <[u8; 16]>::try_from(&envelope.client_host_address[..])
            .ok()
            .map(IpAddr::from),
        _ => None,
    };
    let Some(ip) = ip else {
        return refuse(ResponseError::InvalidRequest);
    };
    let principal = envelope
        .request_principal
        .as_deref()
        .and_then(|p| std::str::from_utf8(p).ok())
        .unwrap_or(api::ANONYMOUS);
    // As a client's own connection, no request before the ACLs are read
    // (the forwarder answers its client COORDINATOR_NOT_AVAILABLE, which
    // it retries, not an authorization error).
    if !ctx.security.acls.ready_for(principal) {
        return refuse(ResponseError::CoordinatorLoadInProgress);
    }
    let client = Client {
        peer: SocketAddr::new(ip, 0),
        principal: Arc::from(principal),
        forwarded: true,
        listener: Arc::from(""),
    };
    let Ok(api_key) = ApiKey::try_from(header.request_api_key) else {
        return refuse(ResponseError::InvalidRequest);
    };
    let (version, correlation_id) = (header.request_api_version, header.correlation_id);
    let Some(response) = api::handle(ctx, client, &header, body, Default::default()).await else {
        return refuse(ResponseError::UnknownServerError);
    };
    match server::encode_response(api_key, version, correlation_id, &response) {
        // Without the size prefix: the envelope's bytes field has its own.
        Ok(bytes) => EnvelopeResponse::default().with_response_data(Some(bytes.slice(4..))),
        Err(e) => {
            tracing::error!(?api_key, version, error = %e, "cannot encode a forwarded request's response");
            refuse(ResponseError::UnknownServerError)
        }
    }
}

/// The address other gateways reach this one's internal listener at:
/// `cluster.internal_advertised_host`, else the listen IP when it is a
/// specific one, else the first address this machine's hostname resolves
/// to (a container's or pod's own address), else 127.0.0.1.
pub fn advertised_internal_host(configured: Option<&str>, listen: &SocketAddr) -> String {
    if let Some(host) = configured {
        // `[::1]` and `::1` alike: the brackets are added when dialling.
        return host.trim_start_matches('[').trim_end_matches(']').to_owned();
    }
    if !listen.ip().is_unspecified() {
        return listen.ip().to_string();
    }
    let resolved = crate::membership::hostname().and_then(|name| {
        use std::net::ToSocketAddrs;
        let addrs: Vec<IpAddr> = (name.as_str(), 0)
            .to_socket_addrs()
            .ok()?
            .map(|a| a.ip())
            .collect();
        addrs
            .iter()
            .find(|ip| ip.is_ipv4() && !ip.is_loopback())
            .or_else(|| addrs.iter().find(|ip| !ip.is_loopback()))
            .or_else(|| addrs.first())
            .copied()
    });
    let host = resolved.map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string());
    if host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()) {
        tracing::warn!(
            internal_host = %host,
            "the internal listener is advertised at a loopback address (this machine's hostname resolves to no other): \
             gateways on other machines cannot forward group requests to this one; set cluster.internal_advertised_host"
        );
    }
    host
}

/// A request a gateway forwards, and how long its answer may take beyond
/// Redis's timeouts.
pub trait Forwardable: Request {
    /// How long the coordinator may rightly hold the request: a JoinGroup
    /// its rebalance timeout, a SyncGroup until the leader assigns.
    fn wait(&self) -> Duration {
        Duration::ZERO
    }
}

/// How long a JoinGroup or SyncGroup may be parked at least. The
/// coordinator holds one until the group's rebalance timeout, the largest
/// of its members' (a consumer's `max.poll.interval.ms`, often minutes),
/// which the forwarding gateway does not know: it waits this long, or the
/// request's own rebalance timeout if longer. The coordinator answers well
/// before (or its connection breaks); this bounds only a coordinator that
/// hangs without closing its connections.
const REBALANCE_WAIT: Duration = Duration::from_secs(60 * 60);

impl Forwardable for JoinGroupRequest {
    fn wait(&self) -> Duration {
        let asked = self.rebalance_timeout_ms.max(self.session_timeout_ms).max(0);
        Duration::from_millis(asked as u64).max(REBALANCE_WAIT)
    }
}

impl Forwardable for SyncGroupRequest {
    fn wait(&self) -> Duration {
        REBALANCE_WAIT
    }
}

impl Forwardable for HeartbeatRequest {}
impl Forwardable for LeaveGroupRequest {}
impl Forwardable for OffsetCommitRequest {}
impl Forwardable for OffsetDeleteRequest {}
impl Forwardable for DescribeGroupsRequest {}
impl Forwardable for DeleteGroupsRequest {}
impl Forwardable for ListGroupsRequest {}
impl Forwardable for TxnOffsetCommitRequest {}

/// How long a forwarded request may take: what the coordinator may hold it
/// for, plus Redis's timeouts and a margin.
pub fn deadline<R: Forwardable>(ctx: &Context, request: &R) -> Duration {
    request.wait() + ctx.settings.redis.command_timeout.get() * 2 + Duration::from_secs(30)
}
