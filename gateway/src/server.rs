//! The Kafka listener: one task per connection, size-prefixed frames
//! bounded by `broker.max_request_bytes`, requests processed concurrently
//! and answered in order (the Kafka protocol requires it).
//!
//! A frame that cannot be a Kafka request (too large, truncated, unknown API
//! key, undecodable, an unsupported version of anything but ApiVersions)
//! closes its connection, as a Kafka broker does; other connections are
//! untouched.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::Context;
use crate::api;

/// The most a frame's length field alone may make us allocate; a larger
/// frame's buffer grows to its full size only once this much has arrived.
const FIRST_ALLOCATION: usize = 1024 * 1024;

/// Accepts connections until `shutdown`, then waits for every connection to
/// finish its in-flight requests (bounded by `broker.shutdown_timeout`).
pub async fn serve(listener: TcpListener, ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    let for_connections = shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let _ = socket.set_nodelay(true);
                    let ctx = ctx.clone();
                    let shutdown = for_connections.clone();
                    connections.spawn(async move {
                        if let Err(e) = connection(socket, peer, ctx, shutdown).await {
                            tracing::info!(%peer, error = %e, "closing connection");
                        }
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
}

/// A response to send, in request order; `None` for acks=0 produce.
type Pending = tokio::task::JoinHandle<Option<Bytes>>;

async fn connection(
    socket: TcpStream,
    peer: std::net::SocketAddr,
    ctx: Arc<Context>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let (mut read, write) = socket.into_split();
    let (pending_tx, pending_rx) = mpsc::channel::<Pending>(ctx.settings.broker.max_inflight_requests);
    let writer = tokio::spawn(write_responses(write, pending_rx));
    let max = ctx.settings.broker.max_request_bytes;
    let mut sequencer = api::produce::Sequencer::default();
    let result = loop {
        let frame = tokio::select! {
            frame = read_frame(&mut read, max) => frame,
            _ = shutdown.wait_for(|stop| *stop) => break Ok(()),
        };
        let frame = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let request = match decode(frame) {
            Ok(request) => request,
            Err(Rejected::Close(e)) => break Err(e),
            Err(Rejected::Answer(bytes)) => {
                let answer = tokio::spawn(async move { Some(bytes) });
                if pending_tx.send(answer).await.is_err() {
                    break Ok(());
                }
                continue;
            }
        };
        let turns = match &request.1 {
            RequestKind::Produce(produce) => sequencer.turns(produce),
            _ => api::produce::Turns::default(),
        };
        let ctx = ctx.clone();
        let handle = tokio::spawn(async move {
            let (header, body) = request;
            let version = header.request_api_version;
            let correlation_id = header.correlation_id;
            let api_key = ApiKey::try_from(header.request_api_key).ok()?;
            let response = api::handle(&ctx, api::Client { peer }, &header, body, turns).await?;
            match encode_response(api_key, version, correlation_id, &response) {
                Ok(bytes) => Some(bytes),
                Err(e) => {
                    tracing::error!(?api_key, version, error = %e, "cannot encode response");
                    None
                }
            }
        });
        if pending_tx.send(handle).await.is_err() {
            break Ok(());
        }
    };
    // Answer everything already accepted, then close.
    drop(pending_tx);
    let _ = writer.await;
    result
}

async fn write_responses(write: tokio::net::tcp::OwnedWriteHalf, mut pending: mpsc::Receiver<Pending>) {
    let mut write = BufWriter::new(write);
    while let Some(handle) = pending.recv().await {
        let response = match handle.await {
            Ok(response) => response,
            Err(e) => {
                tracing::error!(error = %e, "request handler panicked; closing connection");
                return;
            }
        };
        if let Some(bytes) = response
            && write.write_all(&bytes).await.is_err()
        {
            return;
        }
        // Flush when nothing else is ready, so pipelined responses share a write.
        if pending.is_empty() && write.flush().await.is_err() {
            return;
        }
    }
    let _ = write.flush().await;
}

/// Reads one size-prefixed frame; `None` at a clean end of stream.
async fn read_frame<R: AsyncReadExt + Unpin>(
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

enum Rejected {
    /// Close the connection.
    Close(ConnectionError),
    /// Send these bytes (an error response) and go on.
    Answer(Bytes),
}

/// Decodes the header and body of a request frame.
fn decode(mut frame: Bytes) -> Result<(RequestHeader, RequestKind), Rejected> {
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

    #[test]
    fn unknown_api_key_closes() {
        let frame = Bytes::from_static(&[0x7f, 0x00, 0, 0, 0, 0, 0, 1, 0, 0]);
        assert!(matches!(decode(frame), Err(Rejected::Close(_))));
    }
}
