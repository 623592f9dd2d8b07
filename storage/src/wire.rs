//! The data path's own Redis connection: appends and partition reads.
//!
//! redis-rs copies every argument into its command, packs the command into
//! a buffer and copies that into its connection's write buffer: three
//! copies of every record batch on the produce path (a fifth of the
//! gateway's CPU time at full rate), and one more of every batch read, into
//! a `Vec` per bulk string. [`Wire`] speaks the little RESP2 these paths
//! need over a connection of its own:
//!
//! - a request is a list of chunks written with vectored writes, so a
//!   batch's bytes go from the client's produce request to the socket
//!   without a copy ([`Packed::bytes`]);
//! - replies are parsed in the read buffer, and each bulk string is split
//!   off it as soon as it is all there ([`Reply::Bulk`] is a `BytesMut`
//!   over the buffer, not a copy), so a stored batch goes from Redis's
//!   reply into the fetch response with its base offset patched in place,
//!   and the buffer never holds more than the one element still arriving
//!   (see [`Parser`]).
//!
//! Requests are pipelined: a writer task sends them in order, a reader task
//! answers them in order (Redis answers one connection's commands in the
//! order it got them). The connection is dialled on first use and again
//! after it fails; a request in flight when it fails gets
//! [`StorageError::Unavailable`], as with redis-rs.
//!
//! Everything else (scripts loaded, admin commands, groups, topics) stays
//! on redis-rs.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use redis::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::connection::Tls;
use crate::{Result, StorageError};

/// Arguments up to this size are copied into the command's own chunk:
/// below it, a copy costs less than an extra entry of the vectored write.
const COPY_BELOW: usize = 2048;
/// Requests queued for the writer at most (then senders wait).
const QUEUE: usize = 1024;
/// Requests written by one vectored write at most.
const WRITE_BATCH: usize = 64;
/// The reader reads at least this much at a time.
const READ_CHUNK: usize = 64 * 1024;
/// A bulk string or array longer than this is a protocol error, not a
/// reason to allocate.
const MAX_BULK: usize = 1 << 30;

/// A pipelined RESP2 connection to one Redis server; cheap to clone.
#[derive(Clone)]
pub(crate) struct Wire(Arc<Inner>);

/// How often a READONLY answer makes a connection dial again at most.
pub(crate) const REDIAL_AFTER_READONLY: Duration = Duration::from_secs(2);

struct Inner {
    info: redis::ConnectionInfo,
    tls: Tls,
    connect_timeout: Duration,
    response_timeout: Duration,
    live: tokio::sync::Mutex<Option<mpsc::Sender<Request>>>,
    /// When a READONLY answer last made it dial again (at most once every
    /// [`REDIAL_AFTER_READONLY`]: an address that still leads to the
    /// replica must not cost a new connection per request).
    redialled: crate::AtMostEvery,
    timers: crate::metrics::Timers,
}

/// One request: its chunks, how many replies it gets, where they go.
struct Request {
    chunks: Vec<Bytes>,
    replies: usize,
    /// About how many bytes its replies take ([`Packed::expect`]).
    expect: usize,
    answer: oneshot::Sender<Vec<Reply>>,
}

/// A request waiting for its replies.
struct Pending {
    replies: usize,
    got: Vec<Reply>,
    /// About how many bytes its replies take, and how many of them have
    /// been taken off the read buffer.
    expect: usize,
    taken: usize,
    answer: oneshot::Sender<Vec<Reply>>,
}

/// A RESP2 reply.
#[derive(Debug)]
pub(crate) enum Reply {
    Nil,
    Status(String),
    Error(String),
    Int(i64),
    /// A bulk string: its own region of the read buffer, mutable in place.
    Bulk(BytesMut),
    Array(Vec<Reply>),
}

impl Reply {
    /// As redis-rs's value, for the parsers written against it (copies
    /// bulk strings: for small replies).
    pub(crate) fn into_value(self) -> Value {
        match self {
            Reply::Nil => Value::Nil,
            Reply::Status(s) => Value::SimpleString(s),
            Reply::Error(e) => Value::SimpleString(format!("-{e}")),
            Reply::Int(i) => Value::Int(i),
            Reply::Bulk(b) => Value::BulkString(b.to_vec()),
            Reply::Array(items) => Value::Array(items.into_iter().map(Reply::into_value).collect()),
        }
    }

    /// The reply, or the error Redis answered with as
    /// [`StorageError::Unavailable`] (its text kept: `MOVED`, `NOSCRIPT`…).
    /// Whether this is Redis refusing a write as a replica (`READONLY`,
    /// for a command, a script with the write flag, or a command queued in
    /// a transaction: each a reply of its own, never inside an array, so a
    /// read's entries are not looked through).
    pub(crate) fn is_read_only(&self) -> bool {
        matches!(self, Reply::Error(e) if crate::connection::is_read_only_message(e))
    }

    pub(crate) fn ok(self) -> Result<Reply> {
        match self {
            Reply::Error(e) => Err(StorageError::Unavailable(e)),
            other => Ok(other),
        }
    }
}

/// Commands packed for one request.
#[derive(Default)]
pub(crate) struct Packed {
    chunks: Vec<Bytes>,
    current: BytesMut,
    replies: usize,
    /// About how many bytes the replies will take (0: unknown).
    expect: usize,
    /// The first command's name, as a metrics label.
    name: Option<&'static str>,
}

impl Packed {
    /// Starts a command of `args` arguments (its name included).
    pub(crate) fn command(&mut self, args: usize) -> &mut Self {
        self.replies += 1;
        self.header(b'*', args);
        self
    }

    /// An argument, copied.
    pub(crate) fn arg(&mut self, arg: impl AsRef<[u8]>) -> &mut Self {
        let arg = arg.as_ref();
        if self.name.is_none() {
            self.name = Some(crate::metrics::command_label(arg));
        }
        self.header(b'$', arg.len());
        self.current.extend_from_slice(arg);
        self.current.extend_from_slice(b"\r\n");
        self
    }

    /// An integer argument.
    pub(crate) fn int(&mut self, n: i64) -> &mut Self {
        let mut digits = itoa_buf();
        let text = format_int(n, &mut digits);
        self.arg(text)
    }

    /// An argument written from `bytes` itself when it is large (no copy).
    pub(crate) fn bytes(&mut self, bytes: &Bytes) -> &mut Self {
        if bytes.len() < COPY_BELOW {
            return self.arg(bytes);
        }
        self.header(b'$', bytes.len());
        self.flush();
        self.chunks.push(bytes.clone());
        self.current.extend_from_slice(b"\r\n");
        self
    }

    /// About how many bytes the replies will take, when the caller knows
    /// (a read sized from the batches it expects): the connection then
    /// makes room for all of them when the first arrives, so a long reply
    /// is read in place instead of being moved each time the read buffer
    /// grows. An estimate: replies longer than it are read all the same.
    pub(crate) fn expect(&mut self, bytes: usize) -> &mut Self {
        self.expect = bytes;
        self
    }

    /// Commands packed by redis-rs (small ones: their arguments are copied).
    pub(crate) fn pipeline(&mut self, pipe: &redis::Pipeline) -> &mut Self {
        self.current.extend_from_slice(&pipe.get_packed_pipeline());
        self.replies += pipe.cmd_iter().count() + if pipe.is_transaction() { 2 } else { 0 };
        self
    }

    fn header(&mut self, kind: u8, len: usize) {
        let mut digits = itoa_buf();
        self.current.reserve(32);
        self.current.put_u8(kind);
        self.current
            .extend_from_slice(format_int(len as i64, &mut digits).as_bytes());
        self.current.extend_from_slice(b"\r\n");
    }

    fn flush(&mut self) {
        if !self.current.is_empty() {
            self.chunks.push(self.current.split().freeze());
        }
    }

    fn finish(mut self) -> (Vec<Bytes>, usize) {
        self.flush();
        (self.chunks, self.replies)
    }
}

fn itoa_buf() -> [u8; 20] {
    [0; 20]
}

/// `n` in decimal, written into `buf`.
fn format_int(n: i64, buf: &mut [u8; 20]) -> &str {
    let mut i = buf.len();
    let negative = n < 0;
    let mut rest = n.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if negative {
        i -= 1;
        buf[i] = b'-';
    }
    std::str::from_utf8(&buf[i..]).expect("ASCII digits")
}

impl Wire {
    /// A connection to the server `client` names (TCP, TLS or a Unix
    /// socket), dialled on first use.
    pub(crate) fn new(
        client: &redis::Client,
        tls: Tls,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Wire {
        let info = client.get_connection_info().clone();
        Wire(Arc::new(Inner {
            info,
            tls,
            connect_timeout,
            response_timeout,
            live: tokio::sync::Mutex::new(None),
            redialled: crate::AtMostEvery::default(),
            timers: crate::metrics::Timers::default(),
        }))
    }

    /// Sends the commands and waits for their replies, one per command (an
    /// error reply among them is a [`Reply::Error`]).
    pub(crate) async fn request(&self, packed: Packed) -> Result<Vec<Reply>> {
        let started = std::time::Instant::now();
        let command = packed.name.unwrap_or("OTHER");
        let replies = self.exchange(packed).await;
        self.0.timers.record(command, started);
        match &replies {
            Ok(replies) => {
                for reply in replies {
                    if let Reply::Error(e) = reply {
                        crate::metrics::failed(if e.starts_with("OOM") { "oom" } else { "reply" });
                    }
                }
            }
            Err(_) => self.0.timers.failed(),
        }
        replies
    }

    async fn exchange(&self, packed: Packed) -> Result<Vec<Reply>> {
        let expect = packed.expect;
        let (chunks, replies) = packed.finish();
        let (answer, answered) = oneshot::channel();
        let request = Request {
            chunks,
            replies,
            expect,
            answer,
        };
        // One bound for the whole exchange: the dial (others' before this
        // one's, queued on the lock), room in the connection's queue (a
        // master that stopped reading fills it), and the answer.
        let deadline = tokio::time::Instant::now() + self.0.response_timeout;
        let late = || {
            StorageError::Unavailable(format!(
                "redis did not answer within {:?}",
                self.0.response_timeout
            ))
        };
        let sender = tokio::time::timeout_at(deadline, self.sender())
            .await
            .map_err(|_| late())??;
        match tokio::time::timeout_at(deadline, sender.send(request)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(StorageError::Unavailable("redis connection lost".to_owned())),
            Err(_) => return Err(late()),
        }
        match tokio::time::timeout_at(deadline, answered).await {
            Ok(Ok(replies)) => {
                if replies.iter().any(Reply::is_read_only) && self.0.redialled.ready(REDIAL_AFTER_READONLY) {
                    // A master demoted to replica keeps its connections
                    // open (a failover behind one address: a DNS name, a
                    // virtual IP): the next request dials again, reaching
                    // whatever serves the address now.
                    tracing::warn!("redis answered READONLY (a replica now); connecting again");
                    let mut live = self.0.live.lock().await;
                    if live.as_ref().is_some_and(|live| live.same_channel(&sender)) {
                        *live = None;
                    }
                }
                Ok(replies)
            }
            Ok(Err(_)) => Err(StorageError::Unavailable("redis connection lost".to_owned())),
            Err(_) => {
                // A server that does not answer in time is dropped: the
                // next request dials again, as redis-rs's manager does.
                let mut live = self.0.live.lock().await;
                if live.as_ref().is_some_and(|live| live.same_channel(&sender)) {
                    *live = None;
                }
                Err(StorageError::Unavailable(format!(
                    "redis did not answer within {:?}",
                    self.0.response_timeout
                )))
            }
        }
    }

    /// The live connection's queue, dialled when there is none.
    async fn sender(&self) -> Result<mpsc::Sender<Request>> {
        let mut live = self.0.live.lock().await;
        if let Some(sender) = live.as_ref().filter(|s| !s.is_closed()) {
            return Ok(sender.clone());
        }
        *live = None;
        let stream = open(&self.0.info, &self.0.tls, self.0.connect_timeout)
            .await
            .map_err(|e| StorageError::Unavailable(format!("cannot connect to redis: {e}")))?;
        let (sender, requests) = mpsc::channel(QUEUE);
        tokio::spawn(serve(stream, requests, self.0.response_timeout));
        *live = Some(sender.clone());
        Ok(sender)
    }
}

/// A connection to Redis: TCP, TLS over it, or a Unix socket.
pub(crate) trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

/// Dials the server `info` names (TCP, TLS or a Unix socket),
/// authenticates and selects its database.
pub(crate) async fn open(
    info: &redis::ConnectionInfo,
    tls: &Tls,
    timeout: Duration,
) -> std::io::Result<Box<dyn Stream>> {
    let connect = async {
        let (host, port, secure) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => (host, *port, false),
            redis::ConnectionAddr::TcpTls { host, port, .. } => (host, *port, true),
            #[cfg(unix)]
            redis::ConnectionAddr::Unix(path) => {
                let unix = tokio::net::UnixStream::connect(path).await?;
                return Ok::<Box<dyn Stream>, std::io::Error>(Box::new(unix));
            }
            #[allow(unreachable_patterns)]
            other => {
                return Err(std::io::Error::other(format!("no direct connection to {other}")));
            }
        };
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        tcp.set_nodelay(true)?;
        if !secure {
            return Ok::<Box<dyn Stream>, std::io::Error>(Box::new(tcp));
        }
        let config = tls.client_config()?;
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| std::io::Error::other(format!("redis host {host:?}: {e}")))?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await?;
        Ok(Box::new(stream))
    };
    let mut stream = tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let settings = info.redis_settings();
    let mut setup = Packed::default();
    if let Some(password) = settings.password() {
        match settings.username() {
            Some(user) => setup.command(3).arg("AUTH").arg(user).arg(password),
            None => setup.command(2).arg("AUTH").arg(password),
        };
    }
    if settings.db() != 0 {
        setup.command(2).arg("SELECT").int(settings.db());
    }
    let (chunks, replies) = setup.finish();
    if replies > 0 {
        let handshake = async {
            for chunk in &chunks {
                stream.write_all(chunk).await?;
            }
            let mut buf = BytesMut::with_capacity(1024);
            let mut parser = Parser::default();
            let mut got = 0;
            while got < replies {
                if stream.read_buf(&mut buf).await? == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "redis closed the connection",
                    ));
                }
                while let Some(reply) = parser.next(&mut buf)? {
                    got += 1;
                    if let Reply::Error(e) = reply {
                        return Err(std::io::Error::other(format!(
                            "redis refused the connection setup: {e}"
                        )));
                    }
                }
            }
            Ok(())
        };
        tokio::time::timeout(timeout, handshake)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "redis handshake timed out"))??;
    }
    Ok(stream)
}

/// Runs one connection until it fails or every sender is gone; requests in
/// flight then see their answer dropped.
/// Serves one connection until it fails; a write that makes no progress
/// for `stall` (a server that stopped reading: frozen, or cut off) fails
/// it, so its queued requests fail rather than wait, holding their bytes,
/// for a server that may never read them.
async fn serve(stream: Box<dyn Stream>, requests: mpsc::Receiver<Request>, stall: Duration) {
    let (read, write) = tokio::io::split(stream);
    let (pending_tx, pending_rx) = mpsc::unbounded_channel();
    let outcome = tokio::select! {
        outcome = write_requests(write, requests, pending_tx, stall) => outcome,
        outcome = read_replies(read, pending_rx) => outcome,
    };
    if let Err(e) = outcome {
        tracing::debug!(error = %e, "redis data connection closed");
    }
}

async fn write_requests<W: tokio::io::AsyncWrite + Unpin>(
    mut write: W,
    mut requests: mpsc::Receiver<Request>,
    pending: mpsc::UnboundedSender<Pending>,
    stall: Duration,
) -> std::io::Result<()> {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    loop {
        if requests.recv_many(&mut batch, WRITE_BATCH).await == 0 {
            return Ok(());
        }
        let mut chunks: Vec<Bytes> = Vec::new();
        for request in batch.drain(..) {
            chunks.extend(request.chunks);
            let waiting = Pending {
                replies: request.replies,
                got: Vec::with_capacity(request.replies),
                expect: request.expect,
                taken: 0,
                answer: request.answer,
            };
            if pending.send(waiting).is_err() {
                return Ok(());
            }
        }
        write_all_vectored(&mut write, &chunks, stall).await?;
        tokio::time::timeout(stall, write.flush())
            .await
            .map_err(|_| stalled(stall))??;
    }
}

fn stalled(stall: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("redis read nothing of a write for {stall:?}"),
    )
}

async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    write: &mut W,
    chunks: &[Bytes],
    stall: Duration,
) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = chunks.iter().map(|c| IoSlice::new(c)).collect();
    let mut slices = &mut slices[..];
    // IOV_MAX is 1024 on Linux: larger lists are written in parts.
    while !slices.is_empty() {
        let upto = slices.len().min(1024);
        let written = tokio::time::timeout(stall, write.write_vectored(&slices[..upto]))
            .await
            .map_err(|_| stalled(stall))??;
        if written == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "redis connection closed while writing",
            ));
        }
        IoSlice::advance_slices(&mut slices, written);
    }
    Ok(())
}

async fn read_replies<R: tokio::io::AsyncRead + Unpin>(
    mut read: R,
    mut waiting: mpsc::UnboundedReceiver<Pending>,
) -> std::io::Result<()> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut queue: VecDeque<Pending> = VecDeque::new();
    let mut parser = Parser::default();
    loop {
        loop {
            // A request is queued before it is written, so the reply
            // arriving is the front request's.
            if queue.is_empty() {
                while let Ok(p) = waiting.try_recv() {
                    queue.push_back(p);
                }
            }
            let held = buf.len();
            let reply = parser.next(&mut buf)?;
            if let Some(front) = queue.front_mut() {
                front.taken += held - buf.len();
            }
            let Some(reply) = reply else {
                break;
            };
            let Some(front) = queue.front_mut() else {
                return Err(std::io::Error::other("redis sent a reply nobody asked for"));
            };
            front.got.push(reply);
            if front.got.len() >= front.replies {
                let done = queue.pop_front().expect("front exists");
                let _ = done.answer.send(done.got);
            }
        }
        while let Ok(p) = waiting.try_recv() {
            queue.push_back(p);
        }
        // Room for the rest of the replies of the request in front, when
        // it said how long they are; past that (or without it), for as much
        // again as they have taken so far, so a long reply makes the buffer
        // grow a few times, not once per read; in any case for the element
        // still arriving. The buffer holds no whole element (the parser
        // takes each off as it completes), so a new allocation takes a part
        // of one at most. (Room for the requests behind it too, so that
        // pipelined replies share an allocation, held 14–20 MiB more at the
        // peak of a 1 KiB consume and saved no CPU.)
        let room = queue.front().map_or(0, |front| {
            if front.expect > front.taken {
                front.expect - front.taken
            } else {
                front.taken
            }
        });
        let need = parser.need.saturating_sub(buf.len());
        let additional = need.max(READ_CHUNK).max(room.saturating_sub(buf.len()));
        make_room(&mut buf, additional);
        if read.read_buf(&mut buf).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "redis closed the connection",
            ));
        }
    }
}

/// Makes room in the read buffer for `additional` more bytes: in place
/// when its allocation has the room (or regains it, nothing split off it
/// being held any more), else in a new allocation that takes only the bytes
/// not yet parsed. (`BytesMut::reserve` would instead grow the allocation
/// it can reclaim, moving the bytes already taken off it too.)
fn make_room(buf: &mut BytesMut, additional: usize) {
    if buf.capacity() - buf.len() >= additional || buf.try_reclaim(additional) {
        return;
    }
    let mut fresh = BytesMut::with_capacity(buf.len() + additional);
    fresh.extend_from_slice(buf);
    *buf = fresh;
}

/// A reply being read: its elements are taken off the read buffer as each
/// one completes, so the buffer only ever holds what is not yet a whole
/// element (a bulk string still arriving, at most). When the buffer must
/// grow, that is all it moves: a long reply is never moved whole, however
/// wrong its request's estimate ([`Packed::expect`]) was.
#[derive(Debug)]
struct Parser {
    /// The arrays still open, outermost first: their elements so far and
    /// how many are still to come.
    open: Vec<(Vec<Reply>, usize)>,
    /// The buffer must hold this many bytes before parsing can go on.
    need: usize,
}

impl Default for Parser {
    fn default() -> Self {
        Parser {
            open: Vec::new(),
            need: 1,
        }
    }
}

/// Arrays nested deeper than this are a protocol error (ketch's replies
/// nest three deep).
const MAX_DEPTH: usize = 8;

impl Parser {
    /// Parses on from where the last call stopped: the next reply once it is
    /// all in, else `None` (`need` then says how much `buf` must hold
    /// before there is more to parse). Every element completed is taken off
    /// `buf`, whether or not its reply is.
    fn next(&mut self, buf: &mut BytesMut) -> std::io::Result<Option<Reply>> {
        while buf.len() >= self.need {
            let Some(line_end) = find_crlf(buf, 0) else {
                self.need = buf.len() + 1;
                return Ok(None);
            };
            let after = line_end + 2;
            let kind = buf[0];
            let mut element = match kind {
                b'+' | b'-' | b':' => {
                    let line = buf.split_to(line_end);
                    buf.advance(2);
                    let text = || String::from_utf8_lossy(&line[1..]).into_owned();
                    match kind {
                        b'+' => Reply::Status(text()),
                        b'-' => Reply::Error(text()),
                        _ => Reply::Int(
                            std::str::from_utf8(&line[1..])
                                .ok()
                                .and_then(|t| t.parse().ok())
                                .ok_or_else(|| std::io::Error::other("bad integer reply"))?,
                        ),
                    }
                }
                b'$' => match length(&buf[1..line_end])? {
                    None => {
                        buf.advance(after);
                        Reply::Nil
                    }
                    Some(len) => {
                        let end = after + len + 2;
                        if end > buf.len() {
                            self.need = end;
                            return Ok(None);
                        }
                        buf.advance(after);
                        let bulk = buf.split_to(len);
                        buf.advance(2);
                        Reply::Bulk(bulk)
                    }
                },
                b'*' => {
                    let items = length(&buf[1..line_end])?;
                    buf.advance(after);
                    match items {
                        None => Reply::Nil,
                        Some(0) => Reply::Array(Vec::new()),
                        Some(n) => {
                            if self.open.len() >= MAX_DEPTH {
                                return Err(std::io::Error::other("redis reply nested too deep"));
                            }
                            self.open.push((Vec::with_capacity(n.min(1024)), n));
                            self.need = 1;
                            continue;
                        }
                    }
                }
                other => {
                    return Err(std::io::Error::other(format!(
                        "unexpected redis reply type {:?}",
                        other as char
                    )));
                }
            };
            self.need = 1;
            // An element is complete: so is every array it was the last of.
            loop {
                let Some((items, left)) = self.open.last_mut() else {
                    return Ok(Some(element));
                };
                items.push(element);
                *left -= 1;
                if *left > 0 {
                    break;
                }
                let (items, _) = self.open.pop().expect("an open array");
                element = Reply::Array(items);
            }
        }
        Ok(None)
    }
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    loop {
        let nl = at + buf.get(at..)?.iter().position(|b| *b == b'\n')?;
        if nl > from && buf[nl - 1] == b'\r' {
            return Some(nl - 1);
        }
        at = nl + 1;
    }
}

/// A RESP length: `None` for -1 (nil).
fn length(text: &[u8]) -> std::io::Result<Option<usize>> {
    if text == b"-1" {
        return Ok(None);
    }
    let n: usize = std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad length in redis reply"))?;
    if n > MAX_BULK {
        return Err(std::io::Error::other("redis reply too large"));
    }
    Ok(Some(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replies(wire: &[u8]) -> Vec<Reply> {
        let mut buf = BytesMut::from(wire);
        let mut parser = Parser::default();
        let mut out = Vec::new();
        while let Some(reply) = parser.next(&mut buf).unwrap() {
            out.push(reply);
        }
        assert!(buf.is_empty(), "left over: {buf:?}");
        out
    }

    #[test]
    fn parses_every_reply_type() {
        let got = replies(b"+OK\r\n-ERR no\r\n:42\r\n$-1\r\n$3\r\nab\n\r\n*2\r\n$0\r\n\r\n*-1\r\n*0\r\n*2\r\n*1\r\n*0\r\n:1\r\n");
        assert!(matches!(&got[0], Reply::Status(s) if s == "OK"));
        assert!(matches!(&got[1], Reply::Error(e) if e == "ERR no"));
        assert!(matches!(got[2], Reply::Int(42)));
        assert!(matches!(got[3], Reply::Nil));
        assert!(
            matches!(&got[4], Reply::Bulk(b) if &b[..] == b"ab\n"),
            "a bulk may hold CR and LF"
        );
        assert!(
            matches!(&got[5], Reply::Array(items) if matches!(&items[..], [Reply::Bulk(b), Reply::Nil] if b.is_empty()))
        );
        assert!(matches!(&got[6], Reply::Array(items) if items.is_empty()));
        assert!(
            matches!(&got[7], Reply::Array(items) if matches!(&items[..], [Reply::Array(inner), Reply::Int(1)] if matches!(&inner[..], [Reply::Array(e)] if e.is_empty())))
        );
        assert_eq!(got.len(), 8);
    }

    #[test]
    fn a_reply_arriving_in_pieces_is_taken_apart_as_its_elements_complete() {
        let whole: &[u8] =
            b"*3\r\n*2\r\n$5\r\n1-1\r\n\r\n*2\r\n$1\r\nb\r\n$4\r\nabcd\r\n$3\r\nxyz\r\n:7\r\n+OK\r\n";
        for step in 1..whole.len() {
            let mut buf = BytesMut::new();
            let mut parser = Parser::default();
            let mut got = Vec::new();
            for piece in whole.chunks(step) {
                buf.extend_from_slice(piece);
                while let Some(reply) = parser.next(&mut buf).unwrap() {
                    got.push(reply);
                }
                // What is left is less than one element: the parser waits
                // for more before it can take the next one off.
                assert!(
                    buf.is_empty() || parser.need > buf.len(),
                    "step {step}: waits for more ({parser:?}, {buf:?})"
                );
            }
            assert_eq!(got.len(), 2, "step {step}");
            let Reply::Array(items) = &got[0] else {
                panic!("an array")
            };
            let [Reply::Array(entry), Reply::Bulk(xyz), Reply::Int(7)] = &items[..] else {
                panic!("step {step}: {items:?}");
            };
            assert_eq!(&xyz[..], b"xyz");
            let [Reply::Bulk(id), Reply::Array(fields)] = &entry[..] else {
                panic!("step {step}: {entry:?}");
            };
            assert_eq!(&id[..], b"1-1\r\n", "a bulk is taken by its length");
            assert!(
                matches!(&fields[..], [Reply::Bulk(b), Reply::Bulk(abcd)] if &b[..] == b"b" && &abcd[..] == b"abcd")
            );
            assert!(matches!(&got[1], Reply::Status(s) if s == "OK"));
            assert!(buf.is_empty());
        }
        // Bulks are taken off the buffer as they complete, before their
        // reply does: growing the buffer then moves only the one arriving.
        let mut buf = BytesMut::from(&b"*3\r\n$3\r\nabc\r\n$100000\r\nde"[..]);
        let mut parser = Parser::default();
        assert!(parser.next(&mut buf).unwrap().is_none());
        assert_eq!(&buf[..], b"$100000\r\nde");
        assert_eq!(parser.need, 9 + 100_000 + 2, "a long bulk says how long at once");
        buf.extend_from_slice(&vec![b'e'; 99_998]);
        buf.extend_from_slice(b"\r\n:5");
        assert!(parser.next(&mut buf).unwrap().is_none());
        assert_eq!(&buf[..], b":5", "an integer waits for its line's end");
        buf.extend_from_slice(b"\r\n");
        let Some(Reply::Array(items)) = parser.next(&mut buf).unwrap() else {
            panic!("the reply");
        };
        assert!(
            matches!(&items[..], [Reply::Bulk(abc), Reply::Bulk(long), Reply::Int(5)] if &abc[..] == b"abc" && long.len() == 100_000)
        );
        assert!(buf.is_empty());
    }

    /// Growing the read buffer moves only the bytes not yet parsed: in
    /// place when nothing split off the allocation is held any more, else
    /// into a new one, sized for what is asked.
    #[test]
    fn making_room_moves_only_the_bytes_not_yet_parsed() {
        let fill = |buf: &mut BytesMut| {
            for i in 0..80u8 {
                buf.put_u8(i);
            }
        };
        // A batch split off the buffer is still held: a new allocation.
        let mut buf = BytesMut::with_capacity(100);
        fill(&mut buf);
        let held = buf.split_to(70);
        make_room(&mut buf, 50);
        assert_eq!(&buf[..], &(70..80).collect::<Vec<u8>>()[..]);
        assert!(buf.capacity() >= 60);
        assert!(buf.capacity() < 200, "sized for what is asked, not doubled");
        assert_eq!(
            &held[..],
            &(0..70).collect::<Vec<u8>>()[..],
            "the held batch is untouched"
        );
        // Nothing held: the allocation is used again, the unparsed bytes
        // moved to its start.
        let mut buf = BytesMut::with_capacity(100);
        let start = buf.as_ptr();
        fill(&mut buf);
        drop(buf.split_to(70));
        make_room(&mut buf, 50);
        assert_eq!(buf.as_ptr(), start, "the same allocation");
        assert_eq!(&buf[..], &(70..80).collect::<Vec<u8>>()[..]);
        // Room there already: nothing moves.
        let before = buf.as_ptr();
        make_room(&mut buf, 20);
        assert_eq!(buf.as_ptr(), before);
        // Nothing held but more asked than the allocation has: a new one
        // takes the 10 bytes, where BytesMut::reserve would grow the old
        // allocation and carry the 70 bytes taken off it along.
        let mut buf = BytesMut::with_capacity(100);
        fill(&mut buf);
        drop(buf.split_to(70));
        make_room(&mut buf, 500);
        assert_eq!(&buf[..], &(70..80).collect::<Vec<u8>>()[..]);
        assert!(buf.capacity() >= 510 && buf.capacity() < 1000);
        assert_eq!(
            buf.as_ptr() as usize % 16,
            0,
            "the bytes start a new allocation (malloc aligns to 16), not 70 bytes into a grown one"
        );
    }

    #[test]
    fn bulk_strings_are_regions_of_the_read_buffer() {
        let mut buf = BytesMut::from(&b"$4\r\nabcd\r\n"[..]);
        let start = buf.as_ptr() as usize;
        let Some(Reply::Bulk(mut bulk)) = Parser::default().next(&mut buf).unwrap() else {
            panic!("a bulk string");
        };
        assert_eq!(bulk.as_ptr() as usize, start + 4, "not copied");
        bulk[0] = b'x';
        assert_eq!(&bulk[..], b"xbcd");
    }

    #[test]
    fn bad_replies_are_errors() {
        for wire in [&b"?x\r\n"[..], b"$abc\r\n", b":12x\r\n", b"$99999999999\r\n"] {
            let mut buf = BytesMut::from(wire);
            assert!(Parser::default().next(&mut buf).is_err(), "{wire:?}");
        }
    }

    #[test]
    fn commands_are_packed_as_resp_with_large_arguments_by_reference() {
        let big = Bytes::from(vec![7u8; COPY_BELOW]);
        let mut packed = Packed::default();
        packed.command(3).arg("XADD").int(-12).bytes(&big);
        let (chunks, replies) = packed.finish();
        assert_eq!(replies, 1);
        assert_eq!(chunks.len(), 3);
        assert_eq!(
            &chunks[0][..],
            format!("*3\r\n$4\r\nXADD\r\n$3\r\n-12\r\n${}\r\n", COPY_BELOW).as_bytes()
        );
        assert_eq!(chunks[1].as_ptr(), big.as_ptr(), "the batch is not copied");
        assert_eq!(&chunks[2][..], b"\r\n");
        let mut pipe = redis::pipe();
        pipe.cmd("PING").cmd("ECHO").arg("x");
        let mut packed = Packed::default();
        packed.pipeline(&pipe);
        let (chunks, replies) = packed.finish();
        assert_eq!(replies, 2);
        assert_eq!(
            &chunks[0][..],
            b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n"
        );
    }

    /// Requests pipelined on one connection, each expecting its replies to
    /// take some bytes (exactly, far too few, far too many, unknown), get
    /// their own replies whole, arriving in pieces of any size.
    #[tokio::test]
    async fn replies_are_read_whole_whatever_their_requests_expected() {
        let bulk = |byte: u8, len: usize| {
            let mut wire = format!("${len}\r\n").into_bytes();
            wire.extend(std::iter::repeat_n(byte, len));
            wire.extend(b"\r\n");
            wire
        };
        // Each request: an array of two long bulks, then an integer.
        let mut wire = Vec::new();
        let mut sizes = Vec::new();
        for (i, len) in [(0u8, 300_000), (1, 70_000), (2, 200_000), (3, 5)].map(|(i, n)| (i, n as usize)) {
            let start = wire.len();
            wire.extend(b"*2\r\n");
            wire.extend(bulk(b'a' + i, len));
            wire.extend(bulk(b'A' + i, len / 2));
            wire.extend(format!(":{i}\r\n").into_bytes());
            sizes.push(wire.len() - start);
        }
        let expects = [sizes[0], 10, sizes[2] * 8, 0];
        for piece in [1 << 10, 16 << 10, 100_000, wire.len()] {
            let (mut server, client) = tokio::io::duplex(piece);
            let (pending, waiting) = mpsc::unbounded_channel();
            let mut answers = Vec::new();
            for expect in expects {
                let (answer, answered) = oneshot::channel();
                pending
                    .send(Pending {
                        replies: 2,
                        got: Vec::new(),
                        expect,
                        taken: 0,
                        answer,
                    })
                    .unwrap();
                answers.push(answered);
            }
            let reader = tokio::spawn(read_replies(client, waiting));
            let sent = wire.clone();
            let writer = tokio::spawn(async move {
                for chunk in sent.chunks(piece) {
                    server.write_all(chunk).await.unwrap();
                }
                server
            });
            for (i, answered) in answers.into_iter().enumerate() {
                let got = answered.await.expect("answered");
                let [Reply::Array(items), Reply::Int(n)] = &got[..] else {
                    panic!("request {i}: {got:?}");
                };
                assert_eq!(*n, i as i64);
                let [Reply::Bulk(first), Reply::Bulk(second)] = &items[..] else {
                    panic!("request {i}: two bulks");
                };
                let len = [300_000, 70_000, 200_000, 5][i];
                assert_eq!(first.len(), len);
                assert_eq!(second.len(), len / 2);
                assert!(
                    first.iter().all(|b| *b == b'a' + i as u8),
                    "request {i}, pieces of {piece}"
                );
                assert!(second.iter().all(|b| *b == b'A' + i as u8));
            }
            drop(writer.await.unwrap());
            assert!(reader.await.unwrap().is_err(), "the connection closed");
        }
    }

    /// A server that accepts the connection and never reads (frozen, or
    /// cut off): every request fails within the response timeout — those
    /// beyond what the connection's queue holds too, which used to wait for
    /// room for ever — and the connection's writer gives up.
    #[tokio::test]
    async fn a_server_that_reads_nothing_fails_every_request_in_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let held = tokio::spawn(async move {
            let mut sockets = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                sockets.push(socket);
            }
        });
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("client");
        let limit = Duration::from_millis(500);
        let wire = Wire::new(
            &client,
            crate::connection::Tls::default(),
            Duration::from_secs(1),
            limit,
        );
        let payload = Bytes::from(vec![b'x'; 16 * 1024]);
        let started = tokio::time::Instant::now();
        let requests = (0..QUEUE + 500).map(|_| {
            let (wire, payload) = (wire.clone(), payload.clone());
            tokio::spawn(async move {
                let mut packed = Packed::default();
                packed.command(3).arg("SET").arg("k").bytes(&payload);
                wire.request(packed).await
            })
        });
        let outcomes = futures::future::join_all(requests.collect::<Vec<_>>()).await;
        assert!(
            started.elapsed() < limit * 4,
            "the requests took {:?}",
            started.elapsed()
        );
        for outcome in outcomes {
            assert!(outcome.expect("no panic").is_err());
        }
        held.abort();
    }

    #[test]
    fn integers_format_like_display() {
        for n in [0, 7, -1, 10, i64::MAX, i64::MIN, 1234567890] {
            let mut buf = itoa_buf();
            assert_eq!(format_int(n, &mut buf), n.to_string());
        }
    }
}
