//! A replica the test plays itself: it takes a real Redis primary's
//! replication stream (`PSYNC`) and acknowledges it (`REPLCONF ACK`) as the
//! test decides. `WAIT` on the primary counts it like any replica, so a test
//! can let every write through but one, and see whether the gateway waited
//! for that one: a frozen real replica holds back every write at once, and
//! cannot tell two writes of one request apart.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Which replicated command to stop acknowledging at: its arguments, the
/// command's name first.
type Hold = Box<dyn Fn(&[Vec<u8>]) -> bool + Send>;

/// A replica of one primary that acknowledges every command it is sent,
/// unless told to [`ScriptedReplica::hold_at`] one: then nothing from that
/// command on, until [`ScriptedReplica::release`]. Stopped (its connection
/// closed) on drop.
pub struct ScriptedReplica {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    hold: Option<Hold>,
    /// Holding since a command `hold` named: its offset is not acknowledged.
    holding: bool,
    /// Commands held back (from the one `hold` named on).
    held: usize,
    release: bool,
}

impl ScriptedReplica {
    /// Connects to the primary on `port` (with `password`, if it needs one)
    /// and returns once the primary counts it as an online replica.
    pub fn start(port: u16, password: Option<&str>) -> Self {
        // The primary's RDB comes as a plain bulk (not streamed to a
        // socket, which waits `repl-diskless-sync-delay` for others).
        let mut admin = admin(port, password);
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-diskless-sync")
            .arg("no")
            .query(&mut admin)
            .expect("CONFIG SET repl-diskless-sync no");
        let before = connected_replicas(&mut admin);
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the primary");
        stream.set_nodelay(true).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        if let Some(password) = password {
            send(&mut stream, &[b"AUTH", password.as_bytes()]);
            expect_ok(&mut reader);
        }
        send(&mut stream, &[b"REPLCONF", b"listening-port", b"1"]);
        expect_ok(&mut reader);
        send(&mut stream, &[b"PSYNC", b"?", b"-1"]);
        let line = read_line(&mut reader);
        let offset: u64 = line
            .strip_prefix("+FULLRESYNC ")
            .and_then(|rest| rest.split(' ').nth(1))
            .and_then(|offset| offset.parse().ok())
            .unwrap_or_else(|| panic!("PSYNC answered {line:?}"));
        // Newlines keep the link alive while the primary saves its RDB.
        let mut length = read_line(&mut reader);
        while length.is_empty() {
            length = read_line(&mut reader);
        }
        let length: usize = length
            .strip_prefix('$')
            .and_then(|l| l.parse().ok())
            .unwrap_or_else(|| panic!("expected the RDB's length, got {length:?}"));
        let mut rdb = vec![0; length];
        reader.read_exact(&mut rdb).expect("the primary's RDB");
        ack(&mut stream, offset);
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = shared.clone();
            std::thread::spawn(move || follow(stream, reader, offset, &shared))
        };
        // Online once the primary streams to one more replica.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while connected_replicas(&mut admin) <= before {
            assert!(
                std::time::Instant::now() < deadline,
                "the primary never took the replica"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            shared,
            thread: Some(thread),
        }
    }

    /// From the first command `hold` names on, acknowledges nothing more.
    pub fn hold_at(&self, hold: impl Fn(&[Vec<u8>]) -> bool + Send + 'static) {
        let mut state = self.shared.state.lock().unwrap();
        state.hold = Some(Box::new(hold));
        state.holding = false;
        state.held = 0;
    }

    /// How many commands were held back, from the first `hold` named.
    pub fn held(&self) -> usize {
        self.shared.state.lock().unwrap().held
    }

    /// Acknowledges everything again, what was held back too.
    pub fn release(&self) {
        let mut state = self.shared.state.lock().unwrap();
        state.hold = None;
        state.holding = false;
        state.release = true;
    }
}

impl Drop for ScriptedReplica {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A command that writes `key` with a command whose name starts with
/// `name` (case aside): `PEXPIRE` also matches the `PEXPIREAT` a primary
/// sends for it.
pub fn writes(name: &str, key: &str) -> impl Fn(&[Vec<u8>]) -> bool + Send + 'static {
    let name = name.to_ascii_uppercase().into_bytes();
    let key = key.as_bytes().to_vec();
    move |command| {
        command.len() > 1 && command[0].to_ascii_uppercase().starts_with(&name) && command[1] == key
    }
}

/// Reads the stream, acknowledging as told, until stopped or closed.
fn follow(mut stream: TcpStream, mut reader: BufReader<TcpStream>, mut offset: u64, shared: &Shared) {
    stream.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut acked = offset;
    let mut sent = offset;
    let mut pending = Vec::new();
    let mut last_ack = std::time::Instant::now();
    let mut buffer = [0u8; 64 * 1024];
    while !shared.stop.load(Ordering::SeqCst) {
        match reader.read(&mut buffer) {
            Ok(0) => return,
            Ok(n) => pending.extend_from_slice(&buffer[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
        let mut state = shared.state.lock().unwrap();
        while let Some((command, used)) = parse(&pending) {
            pending.drain(..used);
            offset += used as u64;
            if !state.holding && state.hold.as_ref().is_some_and(|hold| hold(&command)) {
                state.holding = true;
            }
            if state.holding {
                state.held += 1;
            } else {
                acked = offset;
            }
        }
        if state.release {
            state.release = false;
            acked = offset;
        }
        drop(state);
        // Every new acknowledgement at once; otherwise once a second, as a
        // replica does.
        if acked != sent || last_ack.elapsed() >= Duration::from_secs(1) {
            ack(&mut stream, acked);
            sent = acked;
            last_ack = std::time::Instant::now();
        }
    }
}

/// One command of the stream (an array of bulk strings) and its length in
/// bytes, or `None` until it has all come.
fn parse(bytes: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
    let (count, mut at) = number(bytes, 0, b'*')?;
    let mut command = Vec::with_capacity(count);
    for _ in 0..count {
        let (length, start) = number(bytes, at, b'$')?;
        let end = start + length;
        if bytes.len() < end + 2 {
            return None;
        }
        command.push(bytes[start..end].to_vec());
        at = end + 2;
    }
    Some((command, at))
}

/// `<prefix><n>\r\n` at `at`: n and where what follows starts.
fn number(bytes: &[u8], at: usize, prefix: u8) -> Option<(usize, usize)> {
    let rest = bytes.get(at..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    assert_eq!(
        rest[0],
        prefix,
        "unexpected replication stream: {:?}",
        String::from_utf8_lossy(rest)
    );
    let n = std::str::from_utf8(&rest[1..end]).ok()?.parse().ok()?;
    Some((n, at + end + 2))
}

fn ack(stream: &mut TcpStream, offset: u64) {
    send(stream, &[b"REPLCONF", b"ACK", offset.to_string().as_bytes()]);
}

fn send(stream: &mut TcpStream, args: &[&[u8]]) {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    // A primary gone (the test ending) is no failure of the replica's.
    let _ = stream.write_all(&out);
}

fn read_line(reader: &mut BufReader<TcpStream>) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).expect("a line from the primary");
    line.trim_end_matches(['\r', '\n']).to_owned()
}

fn expect_ok(reader: &mut BufReader<TcpStream>) {
    let line = read_line(reader);
    assert_eq!(line, "+OK", "the primary refused the replica");
}

fn admin(port: u16, password: Option<&str>) -> redis::Connection {
    let url = match password {
        Some(password) => format!("redis://:{password}@127.0.0.1:{port}"),
        None => format!("redis://127.0.0.1:{port}"),
    };
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

/// The replicas the primary streams commands to (`state=online`).
fn connected_replicas(admin: &mut redis::Connection) -> usize {
    let info: String = redis::cmd("INFO").arg("replication").query(admin).unwrap();
    info.lines()
        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
        .count()
}
