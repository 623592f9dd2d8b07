//! A TCP proxy on a loopback port that holds back what the server sends by
//! a fixed delay: every Redis round trip through it takes at least that
//! long, so a test can tell requests sent one after another (a delay
//! each) from requests pipelined together (one delay for all). Bytes pass
//! unchanged and in order; the client's side is never delayed.
//!
//! It can also make the pub/sub connections open through it go silent
//! without closing them ([`DelayProxy::silence_subscribers`]), as a NAT or
//! load balancer that dropped an idle flow does, and hold one request back
//! until the test has done something between two of a client's requests
//! ([`DelayProxy::hold_requests`]).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

/// The proxy; it stops accepting and closes every connection on drop.
pub struct DelayProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    /// Each connection's flag: true once silenced (nothing passes either
    /// way), and whether it subscribed (sent `SSUBSCRIBE`).
    links: Arc<Mutex<Vec<Link>>>,
    /// Where new connections go.
    server: Arc<Mutex<SocketAddr>>,
    gate: Arc<Gate>,
    acceptor: Option<thread::JoinHandle<()>>,
}

/// Requests held back: a client's chunk that contains `pattern`, past the
/// first `pass` such chunks, waits until released.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    pattern: Option<Vec<u8>>,
    pass: usize,
    holding: bool,
    /// Chunks counted ([`DelayProxy::count_requests`]): the pattern, and
    /// how many had it.
    counting: Option<(Vec<u8>, usize)>,
}

impl Gate {
    /// Holds `chunk` back while the gate says so.
    fn pass(&self, chunk: &[u8]) {
        let mut state = self.state.lock().expect("proxy gate");
        if let Some((pattern, counted)) = &mut state.counting
            && chunk.windows(pattern.len()).any(|w| w == &pattern[..])
        {
            *counted += 1;
        }
        let Some(pattern) = &state.pattern else { return };
        if !chunk.windows(pattern.len()).any(|w| w == &pattern[..]) {
            return;
        }
        if state.pass > 0 {
            state.pass -= 1;
            return;
        }
        state.holding = true;
        self.changed.notify_all();
        while state.pattern.is_some() {
            state = self.changed.wait(state).expect("proxy gate");
        }
    }
}

#[derive(Clone, Default)]
struct Link {
    subscribed: Arc<AtomicBool>,
    silenced: Arc<AtomicBool>,
}

impl DelayProxy {
    /// Listens on an ephemeral loopback port, forwarding to `server`, and
    /// delaying each chunk the server sends by `delay`.
    pub fn start(server: SocketAddr, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let links = Arc::new(Mutex::new(Vec::new()));
        let server = Arc::new(Mutex::new(server));
        let gate = Arc::new(Gate::default());
        let acceptor = {
            let (stop, streams, links) = (Arc::clone(&stop), Arc::clone(&streams), Arc::clone(&links));
            let server = Arc::clone(&server);
            let gate = Arc::clone(&gate);
            thread::spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let to = *server.lock().expect("proxy server");
                    let Ok(upstream) = TcpStream::connect(to) else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = upstream.set_nodelay(true);
                    let mut held = streams.lock().expect("proxy streams");
                    for stream in [&client, &upstream] {
                        if let Ok(clone) = stream.try_clone() {
                            held.push(clone);
                        }
                    }
                    drop(held);
                    let link = Link::default();
                    links.lock().expect("proxy links").push(link.clone());
                    forward(&client, &upstream, Duration::ZERO, &link, Some(Arc::clone(&gate)));
                    forward(&upstream, &client, delay, &link, None);
                }
            })
        };
        Self {
            addr,
            stop,
            streams,
            links,
            server,
            gate,
            acceptor: Some(acceptor),
        }
    }

    /// From now on, a request (a chunk a client sends) that contains
    /// `pattern` is held back, after `pass` such requests went through,
    /// until [`DelayProxy::release`]; others pass.
    pub fn hold_requests(&self, pattern: &[u8], pass: usize) {
        let mut state = self.gate.state.lock().expect("proxy gate");
        state.pattern = Some(pattern.to_vec());
        state.pass = pass;
        state.holding = false;
    }

    /// From now on, counts the requests (chunks clients send; one request
    /// or a pipeline of several may take one chunk or more) that contain
    /// `pattern`.
    pub fn count_requests(&self, pattern: &[u8]) {
        self.gate.state.lock().expect("proxy gate").counting = Some((pattern.to_vec(), 0));
    }

    /// How many requests [`DelayProxy::count_requests`] counted so far.
    pub fn counted(&self) -> usize {
        self.gate
            .state
            .lock()
            .expect("proxy gate")
            .counting
            .as_ref()
            .map_or(0, |(_, counted)| *counted)
    }

    /// Waits (at most `timeout`) until a request is held back; whether one is.
    pub fn await_held(&self, timeout: Duration) -> bool {
        let state = self.gate.state.lock().expect("proxy gate");
        let (state, _) = self
            .gate
            .changed
            .wait_timeout_while(state, timeout, |state| !state.holding)
            .expect("proxy gate");
        state.holding
    }

    /// Lets the held request (and every later one) through.
    pub fn release(&self) {
        let mut state = self.gate.state.lock().expect("proxy gate");
        state.pattern = None;
        state.holding = false;
        self.gate.changed.notify_all();
    }

    /// Connections opened from now on go to `server` (one address that
    /// leads to another server after a failover); those open stay.
    pub fn set_server(&self, server: SocketAddr) {
        *self.server.lock().expect("proxy server") = server;
    }

    /// From now on, nothing passes either way on the connections open now
    /// that subscribed to a shard channel; they stay open. Connections
    /// opened later pass as before.
    pub fn silence_subscribers(&self) {
        for link in self.links.lock().expect("proxy links").iter() {
            if link.subscribed.load(Ordering::SeqCst) {
                link.silenced.store(true, Ordering::SeqCst);
            }
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:<port>`, for a Redis server behind the proxy.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read: a
/// reader thread stamps chunks, a writer thread releases them when due.
/// With a `gate`, the client's side: its `SSUBSCRIBE` marks the link, and
/// the gate may hold its chunks back.
fn forward(from: &TcpStream, to: &TcpStream, delay: Duration, link: &Link, gate: Option<Arc<Gate>>) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let link = link.clone();
    let (send, receive) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buf = vec![0; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) if link.silenced.load(Ordering::SeqCst) => {}
                Ok(n) => {
                    if let Some(gate) = &gate {
                        if buf[..n]
                            .windows(10)
                            .any(|w| w.eq_ignore_ascii_case(b"SSUBSCRIBE"))
                        {
                            link.subscribed.store(true, Ordering::SeqCst);
                        }
                        gate.pass(&buf[..n]);
                    }
                    if send.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    thread::spawn(move || {
        for (due, chunk) in receive {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.release();
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for stream in self.streams.lock().expect("proxy streams").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}
