//! Servers the tiering tests need besides Redis: an S3-compatible object
//! store (`ketch-s3`, built with ketch-bench) and PostgreSQL (Debian's
//! `postgresql` package), each on a loopback port over a temporary
//! directory, killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::{LogBuffer, await_ready, drain, free_port, ketch_bin, retry_port_race};

pub const S3_ACCESS_KEY: &str = "ketch-test";
pub const S3_SECRET_KEY: &str = "ketch-test-secret";

/// Spawns `command` with piped output and waits for a stdout line
/// containing `marker`; the child and everything it printed.
fn spawn_ready(
    command: &mut Command,
    marker: &'static str,
    what: &str,
) -> Result<(Child, LogBuffer), String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let log = LogBuffer::default();
    let ready = drain(child.stdout.take().expect("stdout"), log.clone(), Some(marker));
    drain(child.stderr.take().expect("stderr"), log.clone(), None);
    await_ready(&mut child, &ready, &log, what)?;
    Ok((child, log))
}

/// `ketch-s3` serving a directory, with one bucket.
pub struct S3Server {
    child: Child,
    port: u16,
    bucket: String,
    root: PathBuf,
    log: LogBuffer,
}

impl S3Server {
    /// Starts a server over `root` with bucket `bucket`, taking requests
    /// signed with [`S3_ACCESS_KEY`] and [`S3_SECRET_KEY`].
    pub fn start(root: &Path, bucket: &str) -> Self {
        Self::start_with(root, bucket, true)
    }

    /// Starts a server over `root` with bucket `bucket` that takes
    /// unsigned requests (and no signed ones).
    pub fn start_unsigned(root: &Path, bucket: &str) -> Self {
        Self::start_with(root, bucket, false)
    }

    fn start_with(root: &Path, bucket: &str, signed: bool) -> Self {
        let keys = ["--access-key", S3_ACCESS_KEY, "--secret-key", S3_SECRET_KEY];
        let keys = if signed { &keys[..] } else { &[] };
        retry_port_race(|| {
            let port = free_port();
            let path = ketch_bin().with_file_name("ketch-s3");
            assert!(
                path.exists(),
                "{} does not exist: cargo build -p ketch-bench",
                path.display()
            );
            let (child, log) = spawn_ready(
                Command::new(path)
                    .args(["--root", &root.display().to_string(), "--bucket", bucket])
                    .args(["--listen", &format!("127.0.0.1:{port}")])
                    .args(keys),
                "listening on",
                "ketch-s3",
            )?;
            Ok(Self {
                child,
                port,
                bucket: bucket.to_owned(),
                root: root.to_owned(),
                log,
            })
        })
    }

    /// The server's process id (for SIGSTOP/SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's own directory (buckets, and s3s-fs's bookkeeping files).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The bucket's directory on disk.
    pub fn bucket_dir(&self) -> PathBuf {
        self.root.join(&self.bucket)
    }

    /// Settings (for `--set`) pointing ketch's warehouse at `s3://<bucket>/<prefix>`.
    pub fn ketch_settings(&self, prefix: &str) -> Vec<String> {
        [
            format!("tiering.warehouse=s3://{}/{prefix}", self.bucket),
            format!("tiering.s3_endpoint={}", self.endpoint()),
            "tiering.s3_region=us-east-1".to_owned(),
            format!("tiering.s3_access_key_id={S3_ACCESS_KEY}"),
            format!("tiering.s3_secret_access_key={S3_SECRET_KEY}"),
            "tiering.s3_path_style=true".to_owned(),
        ]
        .into()
    }

    pub fn output(&self) -> String {
        self.log.contents()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A PostgreSQL server made with `initdb` in a temporary directory (trust
/// authentication, user `postgres`). As root it runs as the `postgres`
/// system user, since PostgreSQL refuses to run as root.
pub struct Postgres {
    child: Option<Child>,
    port: u16,
    _dir: tempfile::TempDir,
    log: LogBuffer,
}

fn postgres_bin(name: &str) -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed (apt-get install postgresql)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin").join(name)))
        .filter(|p| p.exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .unwrap_or_else(|| panic!("no {name} under /usr/lib/postgresql"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program`, run as the `postgres` user when we are root. `setpriv` execs
/// the program itself, so killing the child kills the server.
fn as_postgres_user(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid=postgres", "--regid=postgres", "--clear-groups", "--"])
            .arg(program);
        command
    } else {
        Command::new(program)
    }
}

impl Postgres {
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ketch-pg")
            .tempdir()
            .expect("temp dir");
        let data = dir.path().join("data");
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres", &dir.path().display().to_string()])
                .status()
                .expect("chown");
            assert!(status.success(), "chown the PostgreSQL directory");
        }
        let output = as_postgres_user(&postgres_bin("initdb"))
            .args([
                "-D",
                &data.display().to_string(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
            ])
            .output()
            .expect("run initdb");
        assert!(
            output.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let (child, port, log) = retry_port_race(|| {
            let port = free_port();
            let mut child = as_postgres_user(&postgres_bin("postgres"))
                .args(["-D", &data.display().to_string(), "-p", &port.to_string()])
                .args(["-h", "127.0.0.1", "-k", &dir.path().display().to_string()])
                .args(["-c", "fsync=off", "-c", "logging_collector=off"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn postgres");
            let log = LogBuffer::default();
            drain(child.stdout.take().expect("stdout"), log.clone(), None);
            let ready = drain(
                child.stderr.take().expect("stderr"),
                log.clone(),
                Some("ready to accept connections"),
            );
            await_ready(&mut child, &ready, &log, "postgres")?;
            Ok((child, port, log))
        });
        Self {
            child: Some(child),
            port,
            _dir: dir,
            log,
        }
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn output(&self) -> String {
        self.log.contents()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The Iceberg REST catalog fixture (`tests/python/rest_catalog.py`, over
/// pyiceberg's SqlCatalog on a SQLite file), on a loopback port.
pub struct RestCatalog {
    child: Child,
    url: String,
    log: LogBuffer,
}

impl RestCatalog {
    /// Serves tables from `sqlite_file` (catalog name `ketch`) with new
    /// tables under `warehouse` (a `file://` URL).
    pub fn start(sqlite_file: &Path, warehouse: &str) -> Self {
        Self::start_with(sqlite_file, warehouse, &[])
    }

    /// [`RestCatalog::start`] with more of the fixture's options
    /// (`--prop KEY=VALUE`: its own file IO's; `--vend KEY=VALUE`: every
    /// table response's config).
    pub fn start_with(sqlite_file: &Path, warehouse: &str, options: &[String]) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/rest_catalog.py");
        let (child, log) = spawn_ready(
            Command::new("python3")
                .arg(script)
                .args(["--uri", &format!("sqlite:///{}", sqlite_file.display())])
                .args(["--warehouse", warehouse, "--catalog-name", "ketch", "--port", "0"])
                .args(options),
            "listening on",
            "rest catalog",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let url = log
            .contents()
            .lines()
            .find_map(|l| l.split("listening on ").nth(1).map(str::to_owned))
            .expect("the listening line names the URL");
        Self { child, url, log }
    }

    /// The catalog's base URL, for `tiering.catalog_uri`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn output(&self) -> String {
        self.log.contents()
    }
}

impl Drop for RestCatalog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// HAProxy (Debian's `haproxy` package) in TCP mode on a loopback port in
/// front of some backends, balancing connections round-robin: the load
/// balancer of the "behind a load balancer" tests. Killed on drop.
pub struct Haproxy {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// Starts it on `port` (so gateways can advertise the port before it
    /// listens) in front of `backends`, and waits until it accepts.
    pub fn start(port: u16, backends: &[std::net::SocketAddr]) -> Self {
        Self::start_with(port, backends, "")
    }

    /// As [`Haproxy::start`], writing a PROXY protocol v2 header first on
    /// every connection to a backend, its health checks' included
    /// (`send-proxy-v2 check-send-proxy`).
    pub fn start_sending_proxy_headers(port: u16, backends: &[std::net::SocketAddr]) -> Self {
        Self::start_with(port, backends, " send-proxy-v2 check-send-proxy")
    }

    fn start_with(port: u16, backends: &[std::net::SocketAddr], server_options: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = format!(
            "global\n    maxconn 4096\n\ndefaults\n    mode tcp\n    timeout connect 2s\n    \
             timeout client 10m\n    timeout server 10m\n\nfrontend kafka\n    bind 127.0.0.1:{port}\n    \
             default_backend gateways\n\nbackend gateways\n    balance roundrobin\n"
        );
        for (i, backend) in backends.iter().enumerate() {
            // A dead gateway is skipped once its check fails (2 × 200 ms).
            config.push_str(&format!(
                "    server g{i} {backend} check inter 200ms fall 2 rise 1{server_options}\n"
            ));
        }
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, config).expect("write haproxy.cfg");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn haproxy (apt-get install haproxy)");
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "haproxy does not accept on port {port}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Self {
            child,
            port,
            _dir: dir,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Redis, gateways behind HAProxy, each without a node id and advertising
/// the load balancer's address, with fast membership (heartbeats every
/// 100 ms, dead after 1.5 s) and no initial rebalance delay.
pub struct Balanced {
    pub redis: crate::TestRedis,
    pub gateways: Vec<crate::Ketch>,
    pub lb: Haproxy,
}

impl Balanced {
    /// `n` gateways (with `extra` arguments each) and the load balancer,
    /// once every gateway sees all the others.
    pub fn start(n: usize, extra: &[&str]) -> Self {
        let redis = crate::TestRedis::start();
        // The load balancer's port stays bound until HAProxy takes it: the
        // gateways bind free ports (their internal listeners) meanwhile, and
        // must not be given this one.
        let reserved = std::net::TcpListener::bind("127.0.0.1:0").expect("reserve a port");
        let lb_port = reserved.local_addr().expect("reserved port").port();
        let gateways: Vec<crate::Ketch> = (0..n)
            .map(|_| Self::gateway(&redis.url(), lb_port, extra))
            .collect();
        let backends: Vec<_> = gateways.iter().map(crate::Ketch::kafka_addr).collect();
        drop(reserved);
        let lb = Haproxy::start(lb_port, &backends);
        let all: Vec<String> = (0..n).map(|i| i.to_string()).collect();
        let live = format!("nodes=[{}]", all.join(", "));
        for g in &gateways {
            g.await_log(&live, std::time::Duration::from_secs(20));
        }
        Self { redis, gateways, lb }
    }

    /// One gateway behind the load balancer on `lb_port`.
    pub fn gateway(redis_url: &str, lb_port: u16, extra: &[&str]) -> crate::Ketch {
        let port = lb_port.to_string();
        let mut args = vec![
            "--advertised-port",
            &port,
            "--set",
            "cluster.heartbeat_interval=100ms",
            "--set",
            "cluster.node_timeout=1500ms",
            "--set",
            "groups.initial_rebalance_delay=0ms",
        ];
        args.extend_from_slice(extra);
        crate::Ketch::start(redis_url, &args)
    }
}
