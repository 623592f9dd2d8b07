//! The connections acks=all appends use.
//!
//! `WAIT` (and `WAITAOF`) count the writes of the connection they run on and
//! block it until the replicas confirm them, so an acks=all append must write
//! and wait on the same connection, and that connection is blocked for up to
//! `storage.acks_all_timeout`. A shared connection would make concurrent
//! acks=all appends queue behind each other's waits, so each takes a
//! connection of a pool for its write and its wait, and gives it back.
//!
//! In single mode there is one pool, to the one server. In cluster mode
//! there is one pool per master, made when an append first needs it: the
//! append's partition's slot is looked up in the slot map (`CLUSTER SLOTS`,
//! kept here and read again after a MOVED), and its write and `WAIT` go to
//! that master directly. A master that lost the slot answers MOVED (nothing
//! was written): the caller refreshes the map and tries again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::connection::{Conn, Tls};
use crate::wire::Wire;
use crate::{Result, StorageError};

/// How the pools dial the data path's own connections ([`Wire`]).
#[derive(Clone)]
pub(crate) struct WireSettings {
    pub(crate) tls: Tls,
    pub(crate) connect_timeout: std::time::Duration,
    pub(crate) response_timeout: std::time::Duration,
}

/// How long [`DurablePool::masters`] waits for the slot map.
const SIDE_READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The pools of acks=all connections: one, or one per cluster master.
pub(crate) struct DurablePool {
    config: ConnectionManagerConfig,
    wire: WireSettings,
    size: usize,
    target: Target,
}

enum Target {
    Single(Arc<NodePool>),
    Cluster(Box<Masters>),
}

/// The pools of a cluster, one per master, and the slot map that finds them.
struct Masters {
    /// The cluster connection, to read the slot map with.
    conn: Conn,
    /// The URL of a seed node: user, password and options for dialling
    /// masters by address.
    template: redis::ConnectionInfo,
    tls: Tls,
    slots: tokio::sync::RwLock<Vec<(u16, u16, String)>>,
    /// Requests that fail together share one read of the map.
    reading: SharedRead,
    pools: Mutex<HashMap<String, Arc<NodePool>>>,
}

/// `size` lazily opened connections to one node (appends that wait); the
/// node's data-path connection (appends that do not wait and partition
/// reads).
struct NodePool {
    connections: Vec<crate::connection::SingleConn>,
    wire: Wire,
    /// Indexes of the connections nobody holds.
    free: Mutex<Vec<usize>>,
    /// One permit per free connection.
    permits: Arc<Semaphore>,
}

/// A connection of a pool, held until dropped.
pub(crate) struct Durable {
    pool: Arc<NodePool>,
    index: usize,
    _permit: OwnedSemaphorePermit,
}

impl NodePool {
    fn new(
        client: &redis::Client,
        config: &ConnectionManagerConfig,
        wire: &WireSettings,
        size: usize,
    ) -> Result<Self> {
        let size = size.max(1);
        let connections = (0..size)
            .map(|_| {
                ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                    .map(crate::connection::SingleConn::new)
            })
            .collect::<redis::RedisResult<Vec<_>>>()?;
        Ok(Self {
            connections,
            wire: Wire::new(
                client,
                wire.tls.clone(),
                wire.connect_timeout,
                wire.response_timeout,
            ),
            free: Mutex::new((0..size).rev().collect()),
            permits: Arc::new(Semaphore::new(size)),
        })
    }

    async fn get(self: &Arc<Self>) -> Durable {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the pool's semaphore is never closed");
        let index = self
            .free
            .lock()
            .expect("durable pool")
            .pop()
            .expect("a permit means a free connection");
        Durable {
            pool: self.clone(),
            index,
            _permit: permit,
        }
    }
}

impl DurablePool {
    /// One pool of `size` connections to the server `client` names.
    pub(crate) fn single(
        client: &redis::Client,
        config: ConnectionManagerConfig,
        wire: WireSettings,
        size: usize,
    ) -> Result<Self> {
        let pool = NodePool::new(client, &config, &wire, size)?;
        Ok(Self {
            config,
            wire,
            size,
            target: Target::Single(Arc::new(pool)),
        })
    }

    /// Pools made per master of the cluster `conn` reaches; `seed` is a seed
    /// node's URL, whose credentials and options the masters share.
    pub(crate) fn cluster(
        conn: Conn,
        seed: &str,
        config: ConnectionManagerConfig,
        wire: WireSettings,
        size: usize,
    ) -> Result<Self> {
        let template = redis::IntoConnectionInfo::into_connection_info(seed)
            .map_err(|e| StorageError::Unavailable(format!("invalid redis url: {e}")))?;
        Ok(Self {
            config,
            size,
            target: Target::Cluster(Box::new(Masters {
                conn,
                template,
                tls: wire.tls.clone(),
                slots: tokio::sync::RwLock::new(Vec::new()),
                reading: SharedRead::default(),
                pools: Mutex::new(HashMap::new()),
            })),
            wire,
        })
    }

    /// The data-path connection ([`Wire`]) to the server, or in cluster
    /// mode to the master that holds `key`: appends that do not wait and
    /// partition reads go to their master directly rather than through the
    /// cluster connection, which copies every command (the batch with it)
    /// into its routing task.
    pub(crate) async fn wire(&self, key: &str) -> Result<Wire> {
        Ok(self.node(key).await?.wire.clone())
    }

    /// Waits for a free connection to the node that holds `key`.
    pub(crate) async fn get(&self, key: &str) -> Result<Durable> {
        match &self.target {
            Target::Single(pool) => Ok(pool.get().await),
            Target::Cluster(_) => Ok(self.node(key).await?.get().await),
        }
    }

    /// The indexes of `keys` grouped by the node that holds each (one group
    /// in single mode), for writes that must be WAITed on every master
    /// they touch: one connection and one `WAIT` per master, not per key.
    pub(crate) async fn by_node(&self, keys: &[String]) -> Result<Vec<Vec<usize>>> {
        let mut groups: Vec<(Arc<NodePool>, Vec<usize>)> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let node = self.node(key).await?;
            match groups.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &node)) {
                Some((_, group)) => group.push(i),
                None => groups.push((node, vec![i])),
            }
        }
        Ok(groups.into_iter().map(|(_, group)| group).collect())
    }

    /// The pool of the master that holds `key` (cluster mode).
    async fn node(&self, key: &str) -> Result<Arc<NodePool>> {
        let masters = match &self.target {
            Target::Single(pool) => return Ok(pool.clone()),
            Target::Cluster(masters) => &**masters,
        };
        let slots = &masters.slots;
        let slot = slot_of(key);
        let mut master = master_of(&slots.read().await, slot);
        if master.is_none() {
            self.refresh().await?;
            master = master_of(&slots.read().await, slot);
        }
        let Some(master) = master else {
            return Err(StorageError::Unavailable(format!(
                "no redis cluster master serves slot {slot}"
            )));
        };
        self.pool_of(masters, master)
    }

    /// The pool of `master`, made when first needed.
    fn pool_of(&self, masters: &Masters, master: String) -> Result<Arc<NodePool>> {
        let mut pools = masters.pools.lock().expect("durable pools");
        if let Some(pool) = pools.get(&master) {
            return Ok(pool.clone());
        }
        let pool = Arc::new(node_pool(
            &masters.template,
            &masters.tls,
            &master,
            &self.config,
            &self.wire,
            self.size,
        )?);
        pools.insert(master, pool.clone());
        Ok(pool)
    }

    /// The slot map as the data path last read it (empty in single mode,
    /// or before it was first read): no round trip.
    pub(crate) async fn slot_map(&self) -> Vec<(u16, u16, String)> {
        match &self.target {
            Target::Single(_) => Vec::new(),
            Target::Cluster(masters) => masters.slots.read().await.clone(),
        }
    }

    /// Every master's data-path connection with its address; the server's,
    /// with an empty address, in single mode. For commands each master must
    /// answer on its own (`INFO`): one that does not answer fails only its
    /// own. The masters come from the slot map read afresh on the side
    /// (a failed-over master's replica, a master a resharding added), each
    /// time, from the masters last known and the seeds at once, within
    /// [`SIDE_READ_LIMIT`]; or the map as last read when none answers. Not
    /// through [`DurablePool::refresh`]: a read held up by a master that
    /// stopped answering would hold up the data path's reads of the map,
    /// which wait for each other, in the middle of a failover.
    pub(crate) async fn masters(&self) -> Result<Vec<(String, Wire)>> {
        let masters = match &self.target {
            Target::Single(pool) => return Ok(vec![(String::new(), pool.wire.clone())]),
            Target::Cluster(masters) => &**masters,
        };
        let stored = masters.slots.read().await.clone();
        let known = crate::connection::masters_of(&stored);
        let ranges = match masters.conn.slot_ranges_from(&known, SIDE_READ_LIMIT).await {
            Ok(ranges) => ranges,
            Err(e) if !stored.is_empty() => {
                tracing::debug!(error = %e, "cannot read the slot map; the masters last known are asked");
                stored
            }
            Err(e) => return Err(e),
        };
        crate::connection::masters_of(&ranges)
            .into_iter()
            .map(|address| Ok((address.clone(), self.pool_of(masters, address)?.wire.clone())))
            .collect()
    }

    /// Reads the slot map again (after a MOVED: a slot changed masters; or
    /// a failure: its master may have been failed over), asking the masters
    /// it knows at once (see [`Conn::slot_ranges_from`]).
    pub(crate) async fn refresh(&self) -> Result<()> {
        if let Target::Cluster(masters) = &self.target {
            masters
                .reading
                .read(|| async {
                    let known: Vec<String> = masters.slots.read().await.iter().map(|r| r.2.clone()).collect();
                    let ranges = masters
                        .conn
                        .slot_ranges_from(&known, self.wire.response_timeout)
                        .await?;
                    let mut slots = masters.slots.write().await;
                    if *slots != ranges {
                        tracing::debug!(?ranges, "the slot map changed");
                        // The pools of nodes that serve no slot now go (a
                        // failed-over master, one a resharding emptied, a
                        // pod that came back under another address): a
                        // connection taken from one stays usable until
                        // dropped, and one of them serving again gets a
                        // new pool when first needed.
                        let serving = crate::connection::masters_of(&ranges);
                        (masters.pools.lock().expect("durable pools"))
                            .retain(|address, _| serving.contains(address));
                    }
                    *slots = ranges;
                    Ok(())
                })
                .await?;
        }
        Ok(())
    }
}

/// One read shared by the requests that ask for it together: a request
/// that finds a read began after it asked, and ended, takes that read's
/// outcome (its error too: the same read now would fail the same way)
/// instead of reading again.
#[derive(Default)]
struct SharedRead {
    /// Held while a read runs; when the last read began and how it ended.
    last: tokio::sync::Mutex<Option<(std::time::Instant, std::result::Result<(), String>)>>,
}

impl SharedRead {
    async fn read<F, Fut>(&self, read: F) -> Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let asked = std::time::Instant::now();
        let mut last = self.last.lock().await;
        if let Some((began, outcome)) = &*last
            && *began >= asked
        {
            return outcome.clone().map_err(StorageError::Unavailable);
        }
        let began = std::time::Instant::now();
        let outcome = read().await;
        let shared = match &outcome {
            Ok(()) => Ok(()),
            Err(StorageError::Unavailable(message)) => Err(message.clone()),
            Err(e) => Err(e.to_string()),
        };
        *last = Some((began, shared));
        outcome
    }
}

fn node_pool(
    template: &redis::ConnectionInfo,
    tls: &Tls,
    master: &str,
    config: &ConnectionManagerConfig,
    wire: &WireSettings,
    size: usize,
) -> Result<NodePool> {
    let client = crate::connection::node_client(template, tls, master)?;
    NodePool::new(&client, config, wire, size)
}

/// The master serving `slot` in `ranges` (first slot, last slot, address).
fn master_of(ranges: &[(u16, u16, String)], slot: u16) -> Option<String> {
    ranges
        .iter()
        .find(|(first, last, _)| (*first..=*last).contains(&slot))
        .map(|(_, _, master)| master.clone())
}

/// Redis Cluster's slot of `key`: CRC16 (XMODEM) of its hash tag (the part
/// between the first `{` and the next `}`, when not empty) or of the whole
/// key, modulo 16384.
pub(crate) fn slot_of(key: &str) -> u16 {
    let key = key.as_bytes();
    let hashed = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for byte in hashed {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

impl Durable {
    pub(crate) fn conn(&self) -> Conn {
        Conn::Single(self.pool.connections[self.index].clone())
    }
}

impl Drop for Durable {
    fn drop(&mut self) {
        // Give the connection back before the permit (dropped after this).
        self.pool.free.lock().expect("durable pool").push(self.index);
    }
}

/// A durable connection held while a command that blocks it in Redis
/// (`WAIT`, `WAITAOF`) is under way. Dropped before [`Blocking::answered`]
/// (the append that waits was cancelled: its produce timed out), it goes
/// back to the pool only once it answers a `PING` queued behind the
/// blocking command, or after `limit`: Redis runs nothing else of a
/// blocked client, and the next append handed the connection would wait
/// there, holding its partition's append slot, for the rest of the wait.
pub(crate) struct Blocking {
    durable: Option<Durable>,
    limit: std::time::Duration,
}

impl Blocking {
    pub(crate) fn new(durable: Durable, limit: std::time::Duration) -> Self {
        Self {
            durable: Some(durable),
            limit,
        }
    }

    /// The blocking command answered: the connection is free again.
    pub(crate) fn answered(mut self) {
        self.durable.take();
    }
}

impl Drop for Blocking {
    fn drop(&mut self) {
        let Some(durable) = self.durable.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let limit = self.limit;
        runtime.spawn(async move {
            let mut conn = durable.conn();
            let ping = redis::cmd("PING");
            let _ = tokio::time::timeout(limit, ping.query_async::<()>(&mut conn)).await;
            drop(durable);
        });
    }
}

/// Whether a failed durable write should be tried again after reading the
/// slot map: the node no longer (or not yet) serves the partition's slot.
/// Nothing was written when Redis answers so.
pub(crate) fn is_moved(error: &str) -> bool {
    // Redis answers `MOVED …`; redis-rs shows it as `Moved: …`.
    let error = error.to_ascii_uppercase();
    ["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"]
        .iter()
        .any(|code| error.contains(code))
}

/// Whether the error is an ASK: the slot is being migrated and the key
/// already went to its new master.
pub(crate) fn is_ask(error: &str) -> bool {
    error.to_ascii_uppercase().contains("ASK")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(size: usize) -> DurablePool {
        // Lazy connections: nothing is dialled by these tests.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let wire = WireSettings {
            tls: Tls::default(),
            connect_timeout: std::time::Duration::from_secs(1),
            response_timeout: std::time::Duration::from_secs(1),
        };
        DurablePool::single(&client, ConnectionManagerConfig::new(), wire, size).unwrap()
    }

    #[tokio::test]
    async fn holders_get_distinct_connections_and_the_next_waits_for_one() {
        let pool = pool(2);
        let a = pool.get("k").await.unwrap();
        let b = pool.get("k").await.unwrap();
        assert_ne!(a.index, b.index);
        let third = tokio::time::timeout(std::time::Duration::from_millis(50), pool.get("k")).await;
        assert!(third.is_err(), "a third holder must wait");
        let a_index = a.index;
        drop(a);
        let c = pool.get("k").await.unwrap();
        assert_eq!(c.index, a_index);
    }

    #[tokio::test]
    async fn requests_that_ask_together_share_one_read_and_its_failure() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let shared = Arc::new(SharedRead::default());
        let reads = Arc::new(AtomicUsize::new(0));
        // Every read after the first fails, naming itself.
        let read = |reads: Arc<AtomicUsize>| async move {
            let n = reads.fetch_add(1, SeqCst) + 1;
            Err(StorageError::Unavailable(format!("read {n}: no master answered")))
        };
        // A read is under way ...
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let first = tokio::spawn({
            let (shared, reads) = (shared.clone(), reads.clone());
            async move {
                shared
                    .read(|| async {
                        reads.fetch_add(1, SeqCst);
                        released.await.unwrap();
                        Ok(())
                    })
                    .await
            }
        });
        while reads.load(SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // ... when three requests ask: it may have begun before what they
        // saw, so one of them reads again, and the others take its outcome.
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let (shared, reads) = (shared.clone(), reads.clone());
                tokio::spawn(async move { shared.read(|| read(reads)).await })
            })
            .collect();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        for waiter in waiters {
            let outcome = waiter.await.unwrap();
            assert!(
                matches!(&outcome, Err(StorageError::Unavailable(m)) if m == "read 2: no master answered"),
                "{outcome:?}"
            );
        }
        assert_eq!(reads.load(SeqCst), 2);
        // One that asks afterwards reads again.
        assert!(shared.read(|| read(reads.clone())).await.is_err());
        assert_eq!(reads.load(SeqCst), 3);
    }

    #[test]
    fn slots_are_redis_clusters() {
        // CLUSTER KEYSLOT answers, and the CRC's check value.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("123456789"), 0x31C3);
        assert_eq!(slot_of("ketch:{foo}:meta"), 12182);
        assert_eq!(slot_of("{}foo"), slot_of("{}foo"));
        assert_ne!(slot_of("{}foo"), slot_of("foo"));
    }

    #[test]
    fn redirections_are_recognised_as_redis_and_redis_rs_spell_them() {
        assert!(is_moved("MOVED 3283 127.0.0.1:7001"));
        assert!(is_moved("redis unavailable: Moved: 3283 127.0.0.1:45287"));
        assert!(is_moved("Ask: 3283 127.0.0.1:45287") && is_ask("Ask: 3283 127.0.0.1:45287"));
        assert!(is_moved(
            "TryAgain: Multiple keys request during rehashing of slot"
        ));
        assert!(!is_moved("Connection refused (os error 111)"));
        assert!(!is_ask("MOVED 3283 127.0.0.1:7001"));
    }

    #[test]
    fn a_slot_is_served_by_the_master_of_its_range() {
        let ranges = vec![(0, 5460, "a:1".to_owned()), (5461, 16383, "b:2".to_owned())];
        assert_eq!(master_of(&ranges, 0).as_deref(), Some("a:1"));
        assert_eq!(master_of(&ranges, 5461).as_deref(), Some("b:2"));
        assert_eq!(master_of(&[], 5), None);
    }
}
