//! End-to-end test support: a real `redis-server` on a loopback port, the real
//! `ketch` binary, and Kafka clients pointed at it (rdkafka, and raw
//! kafka-protocol frames in [`raw`] for what a well-behaved client never sends).
//!
//! Every test starts its own Redis and its own gateway; nothing is shared.

pub mod batch;
pub mod proxy;
pub mod raw;
pub mod replica;
pub mod servers;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;

/// How long a process may take to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct ports on 127.0.0.1 that were free a moment ago. Every
/// listener stays bound until all are chosen: a port released before the
/// next bind may be handed out again, and one process's two listeners on
/// one port fail to start.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port"))
        .collect();
    std::array::from_fn(|i| {
        listeners[i]
            .local_addr()
            .expect("a bound listener's address")
            .port()
    })
}

/// A blocking TCP connection to `to` from the local address `from` (any
/// of 127.0.0.0/8 is this host's on Linux): a client at another address.
pub fn tcp_connect_from(from: std::net::IpAddr, to: std::net::SocketAddr) -> std::net::TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime to connect in");
    let stream = runtime
        .block_on(async {
            let socket = if from.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            socket.bind(std::net::SocketAddr::new(from, 0))?;
            socket.connect(to).await?.into_std()
        })
        .unwrap_or_else(|e| panic!("connect to {to} from {from}: {e}"));
    stream.set_nonblocking(false).expect("blocking");
    stream
}

/// A topic name no other test uses: `prefix-<random hex>`.
pub fn unique_topic(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// Options for the tests' admin requests: a 10 s operation timeout.
pub fn admin_options() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))
}

/// A tokio runtime for the async parts of a test (rdkafka futures, admin).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Lines a child process wrote, kept so a failing test can show them (and
/// wait for one).
#[derive(Clone, Default)]
struct LogBuffer(Arc<(Mutex<String>, std::sync::Condvar)>);

impl LogBuffer {
    fn push(&self, line: &str) {
        let mut buf = self.0.0.lock().expect("log buffer");
        buf.push_str(line);
        buf.push('\n');
        self.0.1.notify_all();
    }

    fn contents(&self) -> String {
        self.0.0.lock().expect("log buffer").clone()
    }

    /// Whether `text` was written, or is within `timeout`.
    fn wait_for(&self, text: &str, timeout: Duration) -> bool {
        let buf = self.0.0.lock().expect("log buffer");
        let (buf, _) = self
            .0
            .1
            .wait_timeout_while(buf, timeout, |buf| !buf.contains(text))
            .expect("log buffer");
        buf.contains(text)
    }
}

/// Reads `pipe` line by line into `log` until it closes, and sends the first
/// line containing `marker` on `ready`. Draining continues after the marker so
/// the child never blocks on a full pipe.
fn drain<R: Read + Send + 'static>(
    pipe: R,
    log: LogBuffer,
    marker: Option<&'static str>,
) -> mpsc::Receiver<()> {
    let (ready, ready_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = false;
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            log.push(&line);
            if !seen && marker.is_some_and(|m| line.contains(m)) {
                seen = true;
                let _ = ready.send(());
            }
        }
    });
    ready_rx
}

/// Waits for the marker line. Fails early if the process exits first; the
/// error is its output.
fn await_ready(
    child: &mut Child,
    ready: &mpsc::Receiver<()>,
    log: &LogBuffer,
    what: &str,
) -> Result<(), String> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match ready.recv_timeout(Duration::from_millis(100)) {
            Ok(()) => return Ok(()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().ok();
                return Err(format!(
                    "{what} exited before it was ready ({status:?}); output:\n{}",
                    log.contents()
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "{what} exited before it was ready ({status}); output:\n{}",
                log.contents()
            ));
        }
        if Instant::now() >= deadline {
            // Not left running past the test: a `Child` is not killed when
            // dropped.
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} not ready after {START_TIMEOUT:?}; output:\n{}",
                log.contents()
            );
        }
    }
}

/// Runs `start` until it succeeds, on fresh ports, when it failed because
/// another test took a port between `free_port` and the bind (the only race
/// free ports leave open). Other failures panic at once.
fn retry_port_race<T>(mut start: impl FnMut() -> Result<T, String>) -> T {
    for attempt in 1.. {
        match start() {
            Ok(started) => return started,
            Err(e) if attempt < 5 && e.contains("Address already in use") => continue,
            Err(e) => panic!("{e}"),
        }
    }
    unreachable!("the loop returns or panics")
}

/// A `redis-server` on a loopback port, without persistence; killed on drop.
pub struct RedisServer {
    port: u16,
    /// The server's working directory (`--dir`): where a replica's RDB
    /// and a cluster node's node file go, removed on drop.
    dir: PathBuf,
    /// A TLS port beside the plain one (which tests use to inspect).
    tls_port: Option<u16>,
    /// Extra `redis-server` arguments (e.g. `--replicaof`).
    args: Vec<String>,
    child: Option<Child>,
    log: LogBuffer,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it accepts connections.
    pub fn start() -> Self {
        retry_port_race(|| {
            let mut server = Self::reserve();
            server.try_start().map(|()| server)
        })
    }

    /// A free port where no server runs yet; [`RedisServer::start_again`]
    /// starts one there. The port is below the ephemeral range (and below
    /// the range the gateways' internal listeners take, 20000–31999): until
    /// the server starts, nothing else is handed it, as an ephemeral port
    /// released here could be (a connection's local port, another test's
    /// [`free_port`]), which made the late start fail.
    pub fn reserve() -> Self {
        loop {
            let port = 10_000 + rand::random::<u16>() % 10_000;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Self::reserve_on(port);
            }
        }
    }

    fn reserve_on(port: u16) -> Self {
        let dir = std::env::temp_dir().join(format!("ketch-test-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the redis-server directory");
        Self {
            port,
            dir,
            tls_port: None,
            args: Vec::new(),
            child: None,
            log: LogBuffer::default(),
        }
    }

    /// A server started with extra `redis-server` arguments (they override
    /// the defaults, e.g. `--appendonly yes`).
    pub fn start_with(args: &[&str]) -> Self {
        retry_port_race(|| {
            let mut server = Self::reserve();
            server.args = args.iter().map(|a| (*a).to_owned()).collect();
            server.try_start().map(|()| server)
        })
    }

    /// The server's process id (for SIGSTOP/SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("redis-server is running").id()
    }

    /// Polls `INFO replication` until it contains `line` (e.g.
    /// `master_link_status:up`): the replication link has no other
    /// observable event.
    pub fn wait_for_replication(&self, line: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut self.connection())
                .unwrap();
            if info.lines().any(|l| l.trim() == line) {
                return;
            }
            assert!(Instant::now() < deadline, "no `{line}` in:\n{info}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A replica of `primary`, started (see
    /// [`RedisServer::wait_for_replication`] for its link).
    pub fn start_replica_of(primary: &RedisServer) -> Self {
        retry_port_race(|| {
            let mut server = Self::reserve();
            server.args = vec!["--replicaof".into(), "127.0.0.1".into(), primary.port.to_string()];
            server.try_start().map(|()| server)
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A server that also takes TLS connections, with a certificate of
    /// `ca` for 127.0.0.1; `args` as for [`RedisServer::start_with`].
    pub fn start_tls(ca: &TestCa, args: &[&str]) -> Self {
        retry_port_race(|| {
            let [port, tls_port] = free_ports();
            let mut server = Self::reserve_on(port);
            server.tls_port = Some(tls_port);
            server.args = ca.redis_args(tls_port);
            server.args.extend(args.iter().map(|a| (*a).to_owned()));
            server.try_start().map(|()| server)
        })
    }

    /// A node of a Redis Cluster (`--cluster-enabled`), its client, cluster
    /// bus and (with `tls`) TLS ports chosen together and afresh on each
    /// try; with `tls` it speaks TLS on the bus and to its replicas too,
    /// with `password` it requires it (and authenticates to its master).
    fn start_cluster_node(tls: Option<&TestCa>, password: Option<&str>) -> Self {
        retry_port_race(|| {
            let [port, bus, tls_port] = free_ports();
            let mut server = Self::reserve_on(port);
            if let Some(ca) = tls {
                server.tls_port = Some(tls_port);
                server.args = ca.redis_args(tls_port);
                server
                    .args
                    .extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
            }
            let bus = bus.to_string();
            let cluster = [
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus,
                "--cluster-node-timeout",
                "2000",
            ];
            server.args.extend(cluster.map(String::from));
            if let Some(password) = password {
                server
                    .args
                    .extend(["--requirepass", password, "--masterauth", password].map(String::from));
            }
            server.try_start().map(|()| server)
        })
    }

    /// A server that also listens on a Unix socket in its directory;
    /// `args` as for [`RedisServer::start_with`].
    pub fn start_unix(args: &[&str]) -> Self {
        retry_port_race(|| {
            let mut server = Self::reserve_unix(args);
            server.try_start().map(|()| server)
        })
    }

    /// As [`RedisServer::reserve`], for a server that also listens on a
    /// Unix socket ([`RedisServer::start_unix`]).
    pub fn reserve_unix(args: &[&str]) -> Self {
        let mut server = Self::reserve();
        let socket = server.dir.join("redis.sock").display().to_string();
        server.args = vec![
            "--unixsocket".into(),
            socket,
            "--unixsocketperm".into(),
            "700".into(),
        ];
        server.args.extend(args.iter().map(|a| (*a).to_owned()));
        server
    }

    /// The `unix://` URL of a server started with
    /// [`RedisServer::start_unix`] (its password as `pass`).
    pub fn unix_url(&self) -> String {
        let at = self
            .args
            .iter()
            .position(|a| a == "--unixsocket")
            .expect("a Unix socket");
        let password = self.password().map_or_else(String::new, |p| format!("?pass={p}"));
        format!("unix://{}{password}", self.args[at + 1])
    }

    /// The `rediss://` URL of a server started with [`RedisServer::start_tls`].
    pub fn tls_url(&self) -> String {
        format!(
            "rediss://{}127.0.0.1:{}",
            self.credentials(),
            self.tls_port.expect("a TLS server")
        )
    }

    /// The password the server was started with (`--requirepass`).
    pub fn password(&self) -> Option<&str> {
        let at = self.args.iter().position(|a| a == "--requirepass")?;
        self.args.get(at + 1).map(String::as_str)
    }

    /// `:password@` for a URL, when the server has one.
    fn credentials(&self) -> String {
        self.password().map_or_else(String::new, |p| format!(":{p}@"))
    }

    pub fn url(&self) -> String {
        format!("redis://{}127.0.0.1:{}", self.credentials(), self.port)
    }

    /// Starts (again) on the same port.
    pub fn start_again(&mut self) {
        self.try_start().unwrap_or_else(|e| panic!("{e}"));
    }

    fn try_start(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "redis-server is already running");
        let port = self.port.to_string();
        let mut child = Command::new(redis_server_path())
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn redis-server (apt-get install redis-server)");
        let ready = drain(
            child.stdout.take().expect("stdout"),
            self.log.clone(),
            Some("Ready to accept connections"),
        );
        drain(child.stderr.take().expect("stderr"), self.log.clone(), None);
        await_ready(&mut child, &ready, &self.log, "redis-server")?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether it answers a PING within a second (it is not frozen).
    pub fn answers(&self) -> bool {
        let second = Duration::from_secs(1);
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(second))
            .and_then(|mut c| {
                c.set_read_timeout(Some(second))?;
                redis::cmd("PING").query::<String>(&mut c)
            })
            .is_ok()
    }

    /// A synchronous connection for inspecting what ketch stored.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to redis-server")
    }

    /// How many times `command` (as `INFO commandstats` names it: `xrange`)
    /// ran on this server since it started.
    pub fn command_calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.connection())
            .expect("INFO commandstats");
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Bytes the server has sent its clients since it started
    /// (`total_net_output_bytes`).
    pub fn sent_bytes(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut self.connection())
            .expect("INFO stats");
        info.lines()
            .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("total_net_output_bytes")
    }

    /// The hash tags of a topic's partitions, from its `ketch:topics` record.
    pub fn topic_tags(&self, topic: &str) -> Vec<String> {
        topic_tags(&mut self.connection(), topic)
    }

    /// Number of entries (batches) in a partition's stream.
    pub fn stream_len(&self, topic: &str, partition: usize) -> i64 {
        stream_len(&mut self.connection(), topic, partition)
    }

    /// A partition's segment records (`ketch:{TAG}:segments`), oldest first.
    pub fn segments(&self, topic: &str, partition: usize) -> Vec<serde_json::Value> {
        segments(&mut self.connection(), topic, partition)
    }

    /// `next_offset` from a partition's meta hash (absent counts as 0).
    pub fn next_offset(&self, topic: &str, partition: usize) -> i64 {
        next_offset(&mut self.connection(), topic, partition)
    }

    /// Output so far, for failure messages.
    pub fn output(&self) -> String {
        self.log.contents()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Freezes a process with SIGSTOP (still connected, answering nothing);
/// SIGCONT when dropped, so a failing test leaves nothing stopped behind.
pub struct Frozen(u32);

impl Frozen {
    pub fn freeze(pid: u32) -> Self {
        signal(pid, "-STOP");
        Self(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // No assertion in a drop: one failing while a test unwinds would
        // abort it, and the other servers' drops would not stop them. The
        // process may be gone already.
        let _ = Command::new("kill").args(["-CONT", &self.0.to_string()]).status();
    }
}

fn signal(pid: u32, which: &str) {
    let status = Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pid}");
}

/// Every record `0..count` (value `r<i>`, produced in order to partition
/// `i % partitions`) is in its partition, once, in order, read through
/// `ketch`.
pub fn check_round_robin_records(ketch: &Ketch, topic: &str, partitions: i32, count: usize) {
    let consumer = ketch.consumer_at(topic, &(0..partitions).collect::<Vec<_>>(), 0);
    let mut next = vec![0usize; partitions as usize];
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen < count {
        assert!(Instant::now() < deadline, "read {seen} of {count} records");
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.expect("consume");
        let p = message.partition() as usize;
        assert_eq!(message.offset(), next[p] as i64, "partition {p}: dense offsets");
        let i = next[p] * partitions as usize + p;
        assert_eq!(
            message.payload(),
            Some(format!("r{i}").as_bytes()),
            "partition {p} offset {}",
            next[p]
        );
        next[p] += 1;
        seen += 1;
    }
}

/// Creates a topic of `partitions` through `a`, appends a record to each
/// partition through `a`, reads it through `b`, then checks that a fetch
/// parked on `b` at the end of each partition wakes (well before its 20 s
/// limit) for an append through `a`: wake-ups cross gateways.
pub fn assert_fetch_wakes_across(a: &Ketch, b: &Ketch, partitions: i32) {
    let topic = unique_topic("tls");
    let mut conn_a = crate::raw::KafkaConn::connect(a.kafka_addr());
    let mut conn_b = crate::raw::KafkaConn::connect(b.kafka_addr());
    assert_eq!(
        crate::raw::create_topic(&mut conn_a, &topic, partitions),
        crate::raw::code::NONE
    );
    for partition in 0..partitions {
        let first = crate::batch::encode(&[crate::batch::Record::value(crate::batch::at(1), b"first")]);
        assert_eq!(
            crate::raw::produce(&mut conn_a, &topic, partition, first),
            (crate::raw::code::NONE, 0)
        );
        let response = conn_b.request(12, &crate::raw::fetch_request(&topic, partition, 0, 0));
        let (error, high_watermark, records) = crate::raw::fetch_result(&response);
        assert_eq!((error, high_watermark), (crate::raw::code::NONE, 1));
        assert_eq!(crate::raw::count_records(&records.expect("records")), 1);

        let (elapsed, response) = std::thread::scope(|s| {
            let fetch = s.spawn(|| {
                let started = Instant::now();
                let response = conn_b.request(12, &crate::raw::fetch_request(&topic, partition, 1, 20_000));
                (started.elapsed(), response)
            });
            // The fetch has reached b (it parks at once, on an end it
            // knows).
            b.await_inflight_requests(1);
            let second = crate::batch::encode(&[crate::batch::Record::value(crate::batch::at(2), b"second")]);
            assert_eq!(
                crate::raw::produce(&mut conn_a, &topic, partition, second),
                (crate::raw::code::NONE, 1)
            );
            fetch.join().expect("fetch thread")
        });
        let (error, high_watermark, records) = crate::raw::fetch_result(&response);
        assert_eq!((error, high_watermark), (crate::raw::code::NONE, 2));
        assert_eq!(crate::raw::count_records(&records.expect("records")), 1);
        assert!(
            elapsed < Duration::from_secs(10),
            "partition {partition}: the fetch waited {elapsed:?} instead of waking"
        );
    }
}

/// The Redis an end-to-end suite runs against: one `redis-server`, or a
/// 3-master Redis Cluster when `TEST_REDIS_MODE=cluster` (scripts/test.sh
/// runs the suites that matter in both modes). Its URL makes [`Ketch`]
/// run in the matching `redis.mode`, and its inspection helpers read
/// through a connection that follows the cluster's slots.
pub enum TestRedis {
    Single(RedisServer),
    Cluster(RedisCluster),
}

/// What a test needs to reach Redis through ketch's storage layer, as a
/// gateway would: `url` is [`TestRedis::url`] (seed nodes separated by
/// commas for a Redis Cluster).
pub fn store_config(url: &str) -> ketch_storage::StoreConfig {
    ketch_storage::StoreConfig {
        url: url.to_owned(),
        mode: if url.contains(',') {
            ketch_storage::Mode::Cluster
        } else {
            ketch_storage::Mode::Single
        },
        tls_ca_file: None,
        namespace: "ketch".to_owned(),
        command_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        subscription_linger: Duration::from_secs(1),
        tail_cache_bytes: 8 * 1024 * 1024,
        durability: ketch_storage::Durability {
            replicas: 0,
            timeout: Duration::from_secs(1),
            fsync: false,
            connections: 1,
        },
    }
}

/// A connection to a [`TestRedis`], either mode.
pub enum TestConnection {
    Single(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl redis::ConnectionLike for TestConnection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        match self {
            TestConnection::Single(c) => c.req_packed_command(cmd),
            TestConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        match self {
            TestConnection::Single(c) => c.req_packed_commands(cmd, offset, count),
            TestConnection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn req_command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        match self {
            TestConnection::Single(c) => c.req_command(cmd),
            TestConnection::Cluster(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }

    fn check_connection(&mut self) -> bool {
        match self {
            TestConnection::Single(c) => c.check_connection(),
            TestConnection::Cluster(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            TestConnection::Single(c) => c.is_open(),
            TestConnection::Cluster(c) => c.is_open(),
        }
    }
}

impl TestRedis {
    /// Starts the Redis of the mode `TEST_REDIS_MODE` names (`single`,
    /// the default, or `cluster`).
    pub fn start() -> Self {
        match std::env::var("TEST_REDIS_MODE").as_deref() {
            Ok("cluster") => TestRedis::Cluster(RedisCluster::start(3, 0)),
            Ok("single") | Err(_) => TestRedis::Single(RedisServer::start()),
            Ok(other) => panic!("TEST_REDIS_MODE={other}: expected single or cluster"),
        }
    }

    /// The URL to give ketch (a cluster's seed list).
    pub fn url(&self) -> String {
        match self {
            TestRedis::Single(server) => server.url(),
            TestRedis::Cluster(cluster) => cluster.url(),
        }
    }

    pub fn connection(&self) -> TestConnection {
        match self {
            TestRedis::Single(server) => TestConnection::Single(server.connection()),
            TestRedis::Cluster(cluster) => TestConnection::Cluster(Box::new(cluster.connection())),
        }
    }

    /// How many times `command` ran on every server (each node of a
    /// cluster) since they started.
    pub fn command_calls(&self, command: &str) -> u64 {
        match self {
            TestRedis::Single(server) => server.command_calls(command),
            TestRedis::Cluster(cluster) => cluster.nodes.iter().map(|n| n.command_calls(command)).sum(),
        }
    }

    /// Bytes every server (each node of a cluster) has sent its clients
    /// since it started.
    pub fn sent_bytes(&self) -> u64 {
        match self {
            TestRedis::Single(server) => server.sent_bytes(),
            TestRedis::Cluster(cluster) => cluster.nodes.iter().map(RedisServer::sent_bytes).sum(),
        }
    }

    /// `CONFIG SET name value` on every server (each node of a cluster).
    pub fn config_set(&self, name: &str, value: &str) {
        let servers: Vec<&RedisServer> = match self {
            TestRedis::Single(server) => vec![server],
            TestRedis::Cluster(cluster) => cluster.nodes.iter().collect(),
        };
        for server in servers {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query(&mut server.connection())
                .expect("CONFIG SET");
        }
    }

    /// Sharded pub/sub channels matching `pattern` and how many clients
    /// hold each, over every server (each node of a cluster).
    pub fn shard_channels(&self, pattern: &str) -> BTreeMap<String, u64> {
        let on = |server: &RedisServer| -> Vec<(String, u64)> {
            let mut conn = server.connection();
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("SHARDCHANNELS")
                .arg(pattern)
                .query(&mut conn)
                .expect("PUBSUB SHARDCHANNELS");
            if channels.is_empty() {
                return Vec::new();
            }
            redis::cmd("PUBSUB")
                .arg("SHARDNUMSUB")
                .arg(&channels)
                .query(&mut conn)
                .expect("PUBSUB SHARDNUMSUB")
        };
        let mut out = BTreeMap::new();
        let servers: Vec<&RedisServer> = match self {
            TestRedis::Single(server) => vec![server],
            TestRedis::Cluster(cluster) => cluster.nodes.iter().collect(),
        };
        for server in servers {
            for (channel, count) in on(server) {
                *out.entry(channel).or_insert(0) += count;
            }
        }
        out
    }

    /// The hash tags of a topic's partitions, from its `ketch:topics` record.
    pub fn topic_tags(&self, topic: &str) -> Vec<String> {
        topic_tags(&mut self.connection(), topic)
    }

    /// Whether the topic registry holds `topic`.
    pub fn topic_exists(&self, topic: &str) -> bool {
        redis::cmd("HEXISTS")
            .arg("ketch:topics")
            .arg(topic)
            .query(&mut self.connection())
            .expect("HEXISTS")
    }

    /// Number of entries (batches) in a partition's stream.
    pub fn stream_len(&self, topic: &str, partition: usize) -> i64 {
        stream_len(&mut self.connection(), topic, partition)
    }

    /// A partition's segment records (`ketch:{TAG}:segments`), oldest first.
    pub fn segments(&self, topic: &str, partition: usize) -> Vec<serde_json::Value> {
        segments(&mut self.connection(), topic, partition)
    }

    /// `next_offset` from a partition's meta hash (absent counts as 0).
    pub fn next_offset(&self, topic: &str, partition: usize) -> i64 {
        next_offset(&mut self.connection(), topic, partition)
    }

    /// The name of one of a partition's keys (`ketch:{TAG}:<key>`).
    pub fn partition_key(&self, topic: &str, partition: usize, key: &str) -> String {
        partition_key(&mut self.connection(), topic, partition, key)
    }

    /// Sets fields of a partition's meta hash (`ketch:{TAG}:meta`), as a
    /// test that stands in for time passing does.
    pub fn set_meta(&self, topic: &str, partition: usize, fields: &[(&str, &str)]) {
        let mut conn = self.connection();
        let key = partition_key(&mut conn, topic, partition, "meta");
        let mut cmd = redis::cmd("HSET");
        cmd.arg(key);
        for (field, value) in fields {
            cmd.arg(*field).arg(*value);
        }
        let _: i64 = cmd.query(&mut conn).expect("HSET meta");
    }

    /// A field of a partition's meta hash (`ketch:{TAG}:meta`), if set.
    pub fn meta_field(&self, topic: &str, partition: usize, field: &str) -> Option<String> {
        let mut conn = self.connection();
        let key = partition_key(&mut conn, topic, partition, "meta");
        redis::cmd("HGET")
            .arg(key)
            .arg(field)
            .query(&mut conn)
            .expect("HGET meta")
    }

    /// How many aborted transactions a partition's index lists
    /// (`ketch:{TAG}:aborted`).
    pub fn aborted_count(&self, topic: &str, partition: usize) -> i64 {
        let mut conn = self.connection();
        let key = partition_key(&mut conn, topic, partition, "aborted");
        redis::cmd("ZCARD")
            .arg(key)
            .query(&mut conn)
            .expect("ZCARD aborted")
    }

    /// The state a partition keeps for an idempotent producer, as stored
    /// (`ketch:{TAG}:producers`).
    pub fn producer_state(&self, topic: &str, partition: usize, producer_id: i64) -> Option<Vec<u8>> {
        let mut conn = self.connection();
        let key = partition_key(&mut conn, topic, partition, "producers");
        redis::cmd("HGET")
            .arg(key)
            .arg(producer_id)
            .query(&mut conn)
            .expect("HGET producers")
    }
}

fn partition_key(conn: &mut dyn redis::ConnectionLike, topic: &str, partition: usize, key: &str) -> String {
    let tag = &topic_tags(conn, topic)[partition];
    format!("ketch:{{{tag}}}:{key}")
}

fn stream_len(conn: &mut dyn redis::ConnectionLike, topic: &str, partition: usize) -> i64 {
    let key = partition_key(conn, topic, partition, "log");
    redis::cmd("XLEN").arg(key).query(conn).expect("XLEN")
}

fn segments(conn: &mut dyn redis::ConnectionLike, topic: &str, partition: usize) -> Vec<serde_json::Value> {
    let key = partition_key(conn, topic, partition, "segments");
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(conn)
        .expect("ZRANGE segments");
    members
        .iter()
        .map(|m| serde_json::from_str(m).expect("segment JSON"))
        .collect()
}

fn next_offset(conn: &mut dyn redis::ConnectionLike, topic: &str, partition: usize) -> i64 {
    let key = partition_key(conn, topic, partition, "meta");
    let next: Option<i64> = redis::cmd("HGET")
        .arg(key)
        .arg("next_offset")
        .query(conn)
        .expect("HGET meta next_offset");
    next.unwrap_or(0)
}

fn topic_tags(conn: &mut dyn redis::ConnectionLike, topic: &str) -> Vec<String> {
    let json: Option<String> = redis::cmd("HGET")
        .arg("ketch:topics")
        .arg(topic)
        .query(conn)
        .expect("HGET ketch:topics");
    let json = json.unwrap_or_else(|| panic!("topic {topic} is not in ketch:topics"));
    let record: serde_json::Value = serde_json::from_str(&json).expect("topic record is JSON");
    record["tags"]
        .as_array()
        .unwrap_or_else(|| panic!("topic record has no tags: {json}"))
        .iter()
        .map(|t| t.as_str().expect("tag is a string").to_owned())
        .collect()
}

/// A test certificate authority and a server certificate it signed for
/// 127.0.0.1, made with `openssl` in a directory removed on drop.
pub struct TestCa {
    dir: tempfile::TempDir,
}

impl TestCa {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let run = |args: &[&str]| {
            let output = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("run openssl (apt-get install openssl)");
            assert!(output.status.success(), "openssl {args:?}: {output:?}");
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=ketch test CA",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        std::fs::write(
            dir.path().join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("write");
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        Self { dir }
    }

    /// The CA certificate (PEM), for `redis.tls_ca_file`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    fn redis_args(&self, tls_port: u16) -> Vec<String> {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            path("server.crt"),
            "--tls-key-file".into(),
            path("server.key"),
            "--tls-ca-cert-file".into(),
            path("ca.crt"),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

/// A Redis Cluster of real `redis-server` processes on loopback ports
/// (`--cluster-enabled yes`, joined by `redis-cli --cluster create`); every
/// node is killed on drop and its node file removed.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` masters with `replicas` replicas each, all slots assigned,
    /// ready (`cluster_state:ok` on every node).
    pub fn start(masters: usize, replicas: usize) -> Self {
        Self::start_nodes(masters, replicas, None, None)
    }

    /// As [`RedisCluster::start`], every node requiring `password` (its
    /// replicas authenticating with it too); the URLs carry it.
    pub fn start_with_password(masters: usize, replicas: usize, password: &str) -> Self {
        Self::start_nodes(masters, replicas, None, Some(password))
    }

    /// As [`RedisCluster::start`], every node also taking TLS connections
    /// (certificates of `ca`) and speaking TLS on the cluster bus and to
    /// its replicas; CLUSTER SLOTS reports TLS ports to TLS clients.
    pub fn start_tls(ca: &TestCa, masters: usize, replicas: usize) -> Self {
        Self::start_nodes(masters, replicas, Some(ca), None)
    }

    fn start_nodes(masters: usize, replicas: usize, tls: Option<&TestCa>, password: Option<&str>) -> Self {
        for attempt in 1.. {
            match Self::try_start_nodes(masters, replicas, tls, password) {
                Ok(cluster) => return cluster,
                // redis-cli once failed to join fresh nodes ("Failed to send
                // CLUSTER MEET command", its reply unprinted): new nodes.
                Err(output) if attempt < 3 => {
                    eprintln!("redis-cli --cluster create failed; starting new nodes:\n{output}");
                }
                Err(output) => panic!("redis-cli --cluster create failed:\n{output}"),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// One try of [`RedisCluster::start_nodes`]; what `redis-cli --cluster
    /// create` printed when it failed (the nodes are killed).
    fn try_start_nodes(
        masters: usize,
        replicas: usize,
        tls: Option<&TestCa>,
        password: Option<&str>,
    ) -> Result<Self, String> {
        let nodes = (0..masters * (1 + replicas))
            .map(|_| RedisServer::start_cluster_node(tls, password))
            .collect();
        let cluster = Self { nodes };
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        // Its output goes to a file, read once it exits, and it gets a
        // minute: a CI run once hung for good reading its pipes.
        let output_path = cluster.nodes[0].dir.join("cluster-create.out");
        let output_file = std::fs::File::create(&output_path).expect("create the redis-cli output file");
        let mut create = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .args(cluster.cli_auth())
            .stdin(Stdio::null())
            .stdout(output_file.try_clone().expect("the output file"))
            .stderr(output_file)
            .spawn()
            .expect("run redis-cli --cluster create (apt-get install redis-tools)");
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = create.try_wait().expect("wait for redis-cli") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = create.kill();
                let _ = create.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let output = std::fs::read_to_string(&output_path).unwrap_or_default();
        match status {
            Some(status) if status.success() => {}
            Some(status) => return Err(format!("{output}({status})")),
            None => return Err(format!("{output}(still running after a minute: killed)")),
        }
        cluster.await_ok(Duration::from_secs(30));
        // Replicas answer WAIT only once their link to the master is up.
        let deadline = Instant::now() + Duration::from_secs(30);
        while cluster
            .nodes
            .iter()
            .filter(|n| {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut n.connection())
                    .unwrap_or_default();
                info.contains("master_link_status:up")
            })
            .count()
            < masters * replicas
        {
            assert!(Instant::now() < deadline, "the replicas did not sync");
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(cluster)
    }

    /// Waits until every running node reports `cluster_state:ok` and knows
    /// every node (the gossip that follows `--cluster create` or a change).
    pub fn await_ok(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let total = self.nodes.iter().filter(|n| n.child.is_some()).count();
        loop {
            let ready = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut n.connection())
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
                    && total > 0
            });
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not become ready");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A node that is running and answers (to ask about the cluster): not
    /// one stopped or frozen.
    pub fn running(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.child.is_some() && n.answers())
            .expect("a node of the cluster is running")
    }

    /// The node on `port`, to stop or freeze it.
    pub fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .expect("a node of the cluster")
    }

    /// Waits until the slot of `key` is served by a master other than the
    /// one on `port` and every other running node reports
    /// `cluster_state:ok`: a failover completed. The node on `port` may be
    /// stopped or frozen.
    pub fn await_failover(&self, key: &str, port: u16, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let moved = self.master_of(key) != port;
            let mut others = self
                .nodes
                .iter()
                .filter(|n| n.child.is_some() && n.port() != port);
            let ok = others.all(|n| {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut n.connection())
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
            });
            if moved && ok {
                return;
            }
            assert!(Instant::now() < deadline, "no failover of {key} from port {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Seed URLs of every node, comma-separated (`redis.url` in cluster mode).
    pub fn url(&self) -> String {
        self.nodes.iter().map(|n| n.url()).collect::<Vec<_>>().join(",")
    }

    /// `-a PASSWORD` for redis-cli, when the nodes have one.
    fn cli_auth(&self) -> Vec<String> {
        match self.nodes[0].password() {
            Some(password) => vec!["-a".into(), password.into(), "--no-auth-warning".into()],
            None => Vec::new(),
        }
    }

    /// `rediss://` seed URLs of every node (a cluster started with TLS).
    pub fn tls_url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.tls_url())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A connection that follows the cluster's redirections.
    pub fn connection(&self) -> redis::cluster::ClusterConnection {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.url()).collect();
        redis::cluster::ClusterClient::new(urls)
            .expect("cluster client")
            .get_connection()
            .expect("connect to the cluster")
    }

    /// The master serving each slot range: (first, last, port).
    pub fn slot_ranges(&self) -> Vec<(u16, u16, u16)> {
        let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut self.running().connection())
            .expect("CLUSTER SLOTS");
        slots
            .into_iter()
            .filter_map(|range| {
                let redis::Value::Array(range) = range else {
                    return None;
                };
                let (redis::Value::Int(first), redis::Value::Int(last), redis::Value::Array(master)) =
                    (&range[0], &range[1], &range[2])
                else {
                    return None;
                };
                let redis::Value::Int(port) = master[1] else {
                    return None;
                };
                Some((*first as u16, *last as u16, port as u16))
            })
            .collect()
    }

    /// The cluster node id of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        let nodes = self.cluster_nodes();
        nodes
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| {
                f[1].split('@')
                    .next()
                    .is_some_and(|a| a.ends_with(&format!(":{port}")))
            })
            .map(|f| f[0].to_owned())
            .expect("a node of the cluster")
    }

    /// Moves the one slot of `key` to the master on `to`, keys and all, as
    /// `redis-cli --cluster reshard` moves each slot (IMPORTING, MIGRATING,
    /// MIGRATE, SETSLOT NODE on the target, the source, then the rest), but
    /// in milliseconds rather than the seconds all of a master's take.
    pub fn move_slot_of(&self, key: &str, to: u16) {
        let mut migration = self.begin_slot_move(key, to);
        migration.migrate_the_rest();
        migration.finish();
    }

    /// Begins moving the slot of `key` to the master on `to`, as
    /// `redis-cli --cluster reshard` does (`CLUSTER SETSLOT … IMPORTING` on
    /// the target, `MIGRATING` on the source); no key is moved yet.
    pub fn begin_slot_move(&self, key: &str, to: u16) -> SlotMove<'_> {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.running().connection())
            .expect("CLUSTER KEYSLOT");
        let from = self.master_of(key);
        assert_ne!(from, to, "{key} is already on {to}");
        let migration = SlotMove {
            cluster: self,
            slot,
            from,
            to,
            from_id: self.node_id(from),
            to_id: self.node_id(to),
        };
        migration.setslot(to, "IMPORTING", &migration.from_id);
        migration.setslot(from, "MIGRATING", &migration.to_id);
        migration
    }

    /// Moves every slot of the master on `from` to the master on `to` with
    /// `redis-cli --cluster reshard`, keys and all.
    pub fn reshard_all(&self, from: u16, to: u16) {
        let output = Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{to}")])
            .args(["--cluster-from", &self.node_id(from)])
            .args(["--cluster-to", &self.node_id(to)])
            .args(["--cluster-slots", "16384", "--cluster-yes"])
            .args(self.cli_auth())
            .output()
            .expect("run redis-cli --cluster reshard");
        assert!(
            output.status.success(),
            "redis-cli --cluster reshard failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The replica of the master on `port` (the cluster must have one).
    pub fn replica_of(&self, port: u16) -> &RedisServer {
        let nodes = self.cluster_nodes();
        let lines: Vec<Vec<&str>> = nodes.lines().map(|l| l.split(' ').collect()).collect();
        let port_of = |fields: &[&str]| -> u16 {
            let address = fields[1].split('@').next().expect("address");
            address
                .rsplit(':')
                .next()
                .expect("port")
                .parse()
                .expect("port number")
        };
        let master_id = lines
            .iter()
            .find(|f| port_of(f) == port)
            .map(|f| f[0])
            .expect("the master is a node");
        let replica_port = lines
            .iter()
            .find(|f| f[3] == master_id)
            .map(|f| port_of(f))
            .expect("the master has a replica");
        self.nodes
            .iter()
            .find(|n| n.port() == replica_port)
            .expect("the replica is one of ours")
    }

    /// `CLUSTER NODES` as a running node answers it.
    fn cluster_nodes(&self) -> String {
        redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut self.running().connection())
            .expect("CLUSTER NODES")
    }

    /// How many of the nodes are replicas.
    pub fn replicas(&self) -> usize {
        let nodes = self.cluster_nodes();
        nodes
            .lines()
            .filter(|line| {
                line.split(' ')
                    .nth(2)
                    .is_some_and(|flags| flags.contains("slave"))
            })
            .count()
    }

    /// The port of the master serving `key`.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.running().connection())
            .expect("CLUSTER KEYSLOT");
        self.slot_ranges()
            .into_iter()
            .find(|(first, last, _)| (i64::from(*first)..=i64::from(*last)).contains(&slot))
            .map(|(_, _, port)| port)
            .expect("every slot is served")
    }
}

/// A slot's move under way ([`RedisCluster::begin_slot_move`]).
pub struct SlotMove<'a> {
    cluster: &'a RedisCluster,
    slot: i64,
    from: u16,
    to: u16,
    from_id: String,
    to_id: String,
}

impl SlotMove<'_> {
    fn node(&self, port: u16) -> redis::Connection {
        self.cluster
            .nodes
            .iter()
            .find(|n| n.port() == port && n.child.is_some())
            .expect("a running node of the cluster")
            .connection()
    }

    fn setslot(&self, port: u16, state: &str, id: &str) {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(self.slot)
            .arg(state)
            .arg(id)
            .query::<()>(&mut self.node(port))
            .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {} {state}: {e}", self.slot));
    }

    /// Moves `keys` (of the slot) to the target.
    pub fn migrate(&mut self, keys: &[String]) {
        let mut migrate = redis::cmd("MIGRATE");
        migrate.arg("127.0.0.1").arg(self.to).arg("").arg(0).arg(5000);
        if let Some(password) = self.cluster.nodes[0].password() {
            migrate.arg("AUTH").arg(password);
        }
        migrate
            .arg("KEYS")
            .arg(keys)
            .query::<()>(&mut self.node(self.from))
            .expect("MIGRATE");
    }

    /// Moves the keys of the slot still on the source.
    pub fn migrate_the_rest(&mut self) {
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(self.slot)
                .arg(100)
                .query(&mut self.node(self.from))
                .expect("CLUSTER GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            self.migrate(&keys);
        }
    }

    /// Ends the move: the target owns the slot, as every master is told.
    pub fn finish(self) {
        self.setslot(self.to, "NODE", &self.to_id);
        self.setslot(self.from, "NODE", &self.to_id);
        let others: std::collections::BTreeSet<u16> =
            self.cluster.slot_ranges().into_iter().map(|r| r.2).collect();
        for port in others.into_iter().filter(|p| ![self.from, self.to].contains(p)) {
            self.setslot(port, "NODE", &self.to_id);
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
    }
}

fn redis_server_path() -> PathBuf {
    std::env::var_os("REDIS_SERVER").map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
}

/// Path of the `ketch` binary: `$KETCH_BIN`, else the workspace's debug build.
pub fn ketch_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("KETCH_BIN") {
        return PathBuf::from(path);
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/ketch");
    assert!(
        path.exists(),
        "{} does not exist: build it first: cargo build -p ketch-gateway",
        path.display()
    );
    path
}

/// A command running the `ketch` binary without the test runner's
/// `KETCH_*` variables: ketch reads every one as a setting (`KETCH_BIN`,
/// `KETCH_UPGRADE_BASE_BIN`, a developer's `KETCH_REDIS_URL`).
pub fn ketch_command() -> Command {
    let mut command = Command::new(ketch_bin());
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("KETCH_")) {
        command.env_remove(name);
    }
    command
}

/// The `ketch-bench` binary built beside `ketch`.
pub fn ketch_bench_bin() -> PathBuf {
    let path = ketch_bin().with_file_name("ketch-bench");
    assert!(
        path.exists(),
        "{} does not exist: build it first: cargo build -p ketch-bench",
        path.display()
    );
    path
}

/// A running `ketch serve`; killed on drop (its log is printed if the test
/// is failing).
pub struct Ketch {
    binary: PathBuf,
    /// A command the binary runs under (e.g. `prlimit --as=…`), if any.
    wrapper: Vec<String>,
    child: Option<Child>,
    kafka_port: u16,
    http_port: u16,
    log: LogBuffer,
    exit: Option<ExitStatus>,
    redis_url: String,
    extra_args: Vec<String>,
}

impl Ketch {
    /// Starts the gateway against `redis_url` on free ports and waits for its
    /// "ketch serving" line. `extra_args` go after the generated flags, e.g.
    /// `["--node-id", "2", "--set", "topics.auto_create=false"]`.
    pub fn start(redis_url: &str, extra_args: &[&str]) -> Self {
        retry_port_race(|| Self::try_start(redis_url, extra_args))
    }

    fn try_start(redis_url: &str, extra_args: &[&str]) -> Result<Self, String> {
        let [kafka, http] = free_ports();
        Self::spawn(&ketch_bin(), &[], redis_url, extra_args, kafka, http)
    }

    /// Starts the gateway under `wrapper` (a command that runs the rest of
    /// its arguments, such as `prlimit --as=BYTES --`).
    pub fn start_wrapped(wrapper: &[&str], redis_url: &str, extra_args: &[&str]) -> Self {
        let wrapper: Vec<String> = wrapper.iter().map(|a| (*a).to_owned()).collect();
        retry_port_race(|| {
            let [kafka, http] = free_ports();
            Self::spawn(&ketch_bin(), &wrapper, redis_url, extra_args, kafka, http)
        })
    }

    /// A gateway whose acks=all waits for one replica
    /// (`storage.acks_all_replicas=1`): a Redis primary, a replica linked to
    /// it, and the gateway on the primary with `extra_args` too.
    pub fn start_with_replica(extra_args: &[&str]) -> (RedisServer, RedisServer, Self) {
        let primary = RedisServer::start();
        let replica = RedisServer::start_replica_of(&primary);
        replica.wait_for_replication("master_link_status:up");
        let mut args = vec!["--set", "storage.acks_all_replicas=1"];
        args.extend_from_slice(extra_args);
        let ketch = Self::start(&primary.url(), &args);
        (primary, replica, ketch)
    }

    /// Starts another `ketch` binary (an older release, for upgrades).
    pub fn start_binary(binary: &Path, redis_url: &str, extra_args: &[&str]) -> Self {
        retry_port_race(|| {
            let [kafka, http] = free_ports();
            Self::spawn(binary, &[], redis_url, extra_args, kafka, http)
        })
    }

    /// Starts the gateway expecting it to exit before it serves; its output.
    pub fn start_expecting_failure(redis_url: &str, extra_args: &[&str]) -> String {
        match Self::try_start(redis_url, extra_args) {
            Ok(mut started) => {
                started.kill9();
                panic!("ketch started:\n{}", started.output())
            }
            Err(output) => output,
        }
    }

    /// Stops the gateway gracefully and starts `binary` in its place, with
    /// the same settings and ports: a rolling upgrade of one gateway.
    pub fn replace_with(&mut self, binary: &Path) {
        self.replace_with_more(binary, &[]);
    }

    /// As [`Ketch::replace_with`], with `more` arguments (settings only
    /// the new binary knows).
    pub fn replace_with_more(&mut self, binary: &Path, more: &[&str]) {
        self.extra_args.extend(more.iter().map(|a| a.to_string()));
        self.terminate();
        let status = self.wait_exit(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "ketch did not stop cleanly: {status:?}"
        );
        let args: Vec<&str> = self.extra_args.iter().map(String::as_str).collect();
        *self = Self::spawn(
            binary,
            &[],
            &self.redis_url,
            &args,
            self.kafka_port,
            self.http_port,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// A gateway with node id `id` among several on one Redis, with fast
    /// membership (heartbeats every 100 ms, dead after `node_timeout`).
    pub fn start_node(redis_url: &str, id: i32, node_timeout: &str, extra_args: &[&str]) -> Self {
        let id = id.to_string();
        let timeout = format!("cluster.node_timeout={node_timeout}");
        let mut args = vec![
            "--node-id",
            &id,
            "--set",
            "cluster.heartbeat_interval=100ms",
            "--set",
            &timeout,
        ];
        args.extend_from_slice(extra_args);
        Self::start(redis_url, &args)
    }

    /// Starts a killed gateway again with the same settings and ports, so
    /// clients that knew its address reach it again.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "ketch is still running");
        let args: Vec<&str> = self.extra_args.iter().map(String::as_str).collect();
        let started = Self::spawn(
            &self.binary,
            &self.wrapper,
            &self.redis_url,
            &args,
            self.kafka_port,
            self.http_port,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        *self = started;
    }

    fn spawn(
        binary: &Path,
        wrapper: &[String],
        redis_url: &str,
        extra_args: &[&str],
        kafka_port: u16,
        http_port: u16,
    ) -> Result<Self, String> {
        let listen = format!("127.0.0.1:{kafka_port}");
        let http = format!("127.0.0.1:{http_port}");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        // ketch reads every KETCH_* variable as a setting: keep the test
        // runner's (KETCH_BIN, a developer's KETCH_REDIS_URL) out of it.
        for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("KETCH_")) {
            command.env_remove(name);
        }
        let mut child = command
            .arg("serve")
            .args(["--listen", &listen, "--advertised-host", "127.0.0.1"])
            // Unless the test advertises another port (a load balancer's).
            .args(if extra_args.contains(&"--advertised-port") {
                Vec::new()
            } else {
                vec!["--advertised-port".to_owned(), kafka_port.to_string()]
            })
            // The internal listener on a port below the ephemeral range, so
            // it can never take a port a test reserved with `free_port` and
            // binds later (a load balancer's, a Redis started late); a clash
            // between two tests fails the start and is retried.
            // Only for this tree's binary: an older release (an upgrade
            // test's) has no such setting.
            .args(
                if binary != ketch_bin()
                    || extra_args
                        .iter()
                        .any(|a| a.starts_with("cluster.internal_listen"))
                {
                    Vec::new()
                } else {
                    let port = 20_000 + rand::random::<u16>() % 12_000;
                    vec![
                        "--set".to_owned(),
                        format!("cluster.internal_listen=127.0.0.1:{port}"),
                    ]
                },
            )
            // Shut down at once on SIGTERM (no load balancer to take it
            // out first), unless the test says otherwise.
            .args(
                if binary != ketch_bin() || extra_args.iter().any(|a| a.starts_with("broker.shutdown_delay"))
                {
                    Vec::new()
                } else {
                    vec!["--set".to_owned(), "broker.shutdown_delay=0s".to_owned()]
                },
            )
            .args(["--redis-url", redis_url, "--http-listen", &http])
            // A list of seed nodes is a Redis Cluster ([`RedisCluster::url`]);
            // extra arguments may still set the mode themselves.
            .args(if redis_url.contains(',') {
                &["--set", "redis.mode=cluster"][..]
            } else {
                &[][..]
            })
            .args(extra_args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ketch");
        let log = LogBuffer::default();
        let ready = drain(
            child.stderr.take().expect("stderr"),
            log.clone(),
            Some("ketch serving"),
        );
        await_ready(&mut child, &ready, &log, "ketch")?;
        Ok(Self {
            binary: binary.to_owned(),
            wrapper: wrapper.to_vec(),
            child: Some(child),
            kafka_port,
            http_port,
            log,
            exit: None,
            redis_url: redis_url.to_owned(),
            extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
        })
    }

    /// `127.0.0.1:<kafka port>`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.kafka_port)
    }

    pub fn kafka_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.kafka_port))
    }

    /// `method` `path` on the HTTP listener with a JSON `body`: (status,
    /// body).
    pub fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let (status, _, body) = self.http_with(method, path, &[("Host", "127.0.0.1")], body);
        (status, body)
    }

    /// [`Ketch::http`] with the request's `headers` (no `Host` but one
    /// given): (status, the response's header lines, body).
    pub fn http_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> (u16, String, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.http_port)).expect("connect to http listener");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        let body = body.unwrap_or("");
        let headers: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
        write!(
            stream,
            "{method} {path} HTTP/1.0\r\n{headers}Connection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send request");
        let mut response = String::new();
        // A server may answer before reading a body it refuses, and close.
        let _ = stream.read_to_string(&mut response);
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        (status, head.to_owned(), body.to_owned())
    }

    /// The HTTP listener's port.
    pub fn http_port(&self) -> u16 {
        self.http_port
    }

    /// GET `path` on the HTTP listener: (status, body).
    pub fn http_get(&self, path: &str) -> (u16, String) {
        self.http("GET", path, None)
    }

    /// Waits until the gateway holds at least `n` Kafka requests read and
    /// not yet answered (`ketch_inflight_requests`): a long poll sent
    /// before has arrived, rather than a fixed sleep making it likely.
    pub fn await_inflight_requests(&self, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, metrics) = self.http_get("/metrics");
            assert_eq!(status, 200);
            let inflight = metrics
                .lines()
                .find_map(|l| l.strip_prefix("ketch_inflight_requests "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0);
            if inflight >= n as f64 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{inflight} requests in flight, not {n}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("ketch is running").id()
    }

    /// A line of `/proc/<pid>/status` in KiB, e.g. `VmHWM` (peak resident
    /// memory) or `VmRSS`.
    pub fn status_kib(&self, field: &str) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("read /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc status"))
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// SIGKILL, then reap.
    /// Waits until the gateway's log has a line containing `needle`.
    pub fn await_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.output().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?} within {timeout:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            self.exit = child.wait().ok();
        }
    }

    /// Sends SIGTERM (graceful shutdown); see [`Ketch::wait_exit`].
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits up to `timeout` for the process to exit and returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                self.exit = Some(status);
                break;
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.exit
    }

    /// The gateway's log so far.
    pub fn output(&self) -> String {
        self.log.contents()
    }

    /// Whether the gateway logs `text`, waiting up to 10 s for it: a line
    /// logged as a request is answered reaches the test through a pipe
    /// and a reader thread, so it may come a moment after the response.
    pub fn logs(&self, text: &str) -> bool {
        self.log.wait_for(text, Duration::from_secs(10))
    }

    /// rdkafka client settings pointed at this gateway.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", self.bootstrap())
            .set("broker.address.family", "v4")
            .set("socket.timeout.ms", "15000");
        config
    }

    /// A producer that batches (linger 5 ms, 1 MiB batches) and fails a
    /// message after 30 s.
    pub fn producer(&self) -> FutureProducer {
        self.producer_with(&[])
    }

    pub fn producer_with(&self, settings: &[(&str, &str)]) -> FutureProducer {
        let mut config = self.client_config();
        config
            .set("linger.ms", "5")
            .set("batch.size", "1048576")
            .set("queue.buffering.max.messages", "1000000")
            .set("queue.buffering.max.kbytes", "1048576")
            .set("message.timeout.ms", "30000");
        for (k, v) in settings {
            config.set(*k, *v);
        }
        config.create().expect("create producer")
    }

    /// A consumer for `assign()` only: no group membership, no commits.
    pub fn consumer(&self) -> BaseConsumer {
        self.consumer_with(&[])
    }

    pub fn consumer_with(&self, settings: &[(&str, &str)]) -> BaseConsumer {
        let mut config = self.client_config();
        config
            .set("group.id", unique_topic("ketch-tests"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "error");
        for (k, v) in settings {
            config.set(*k, *v);
        }
        config.create().expect("create consumer")
    }

    /// A consumer assigned to `partitions` of `topic`, each from `offset`.
    pub fn consumer_at(&self, topic: &str, partitions: &[i32], offset: i64) -> BaseConsumer {
        let consumer = self.consumer();
        let mut assignment = rdkafka::TopicPartitionList::new();
        for &partition in partitions {
            assignment
                .add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
                .expect("assign");
        }
        rdkafka::consumer::Consumer::assign(&consumer, &assignment).expect("assign");
        consumer
    }

    pub fn admin(&self) -> AdminClient<DefaultClientContext> {
        self.client_config().create().expect("create admin client")
    }

    /// Creates `topic` with `partitions` partitions through CreateTopics.
    pub fn create_topic(&self, rt: &tokio::runtime::Runtime, topic: &str, partitions: i32) {
        self.create_topic_with(rt, topic, partitions, &[]);
    }

    /// Creates `topic` with topic configs `configs`.
    pub fn create_topic_with(
        &self,
        rt: &tokio::runtime::Runtime,
        topic: &str,
        partitions: i32,
        configs: &[(&str, &str)],
    ) {
        let admin = self.admin();
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        for (name, value) in configs {
            new = new.set(name, value);
        }
        let opts = admin_options();
        let results = rt
            .block_on(admin.create_topics([&new], &opts))
            .expect("CreateTopics request");
        for result in results {
            result.unwrap_or_else(|(name, code)| panic!("create topic {name}: {code:?}"));
        }
    }
}

impl Drop for Ketch {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "---- ketch (port {}) log ----\n{}",
                self.kafka_port,
                self.output()
            );
        }
    }
}

/// The `q` quantile (0..=1) of `samples`, which it sorts.
pub fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    assert!(!samples.is_empty(), "no samples");
    samples.sort();
    let rank = ((samples.len() as f64) * q).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}
