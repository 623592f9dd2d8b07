//! The connections acks=all appends use.
//!
//! `WAIT` (and `WAITAOF`) count the writes of the connection they run on and
//! block it until the replicas confirm them, so an acks=all append must write
//! and wait on the same connection, and that connection is blocked for up to
//! `storage.acks_all_timeout`. A shared connection would make concurrent
//! acks=all appends queue behind each other's waits, so each takes a
//! connection of this pool for its write and its wait, and gives it back.

use std::sync::Mutex;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::Semaphore;

use crate::Result;

pub(crate) struct DurablePool {
    connections: Vec<ConnectionManager>,
    /// Indexes of the connections nobody holds.
    free: Mutex<Vec<usize>>,
    /// One permit per free connection.
    permits: Semaphore,
}

/// A connection of the pool, held until dropped.
pub(crate) struct Durable<'a> {
    pool: &'a DurablePool,
    index: usize,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl DurablePool {
    /// `size` lazily opened connections (at least one).
    pub(crate) fn new(client: &redis::Client, config: ConnectionManagerConfig, size: usize) -> Result<Self> {
        let size = size.max(1);
        let connections = (0..size)
            .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), config.clone()))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        Ok(Self {
            connections,
            free: Mutex::new((0..size).rev().collect()),
            permits: Semaphore::new(size),
        })
    }

    /// Waits for a free connection.
    pub(crate) async fn get(&self) -> Durable<'_> {
        let permit = self
            .permits
            .acquire()
            .await
            .expect("the pool's semaphore is never closed");
        let index = self
            .free
            .lock()
            .expect("durable pool")
            .pop()
            .expect("a permit means a free connection");
        Durable {
            pool: self,
            index,
            _permit: permit,
        }
    }
}

impl Durable<'_> {
    pub(crate) fn conn(&self) -> ConnectionManager {
        self.pool.connections[self.index].clone()
    }
}

impl Drop for Durable<'_> {
    fn drop(&mut self) {
        // Give the connection back before the permit (dropped after this).
        self.pool.free.lock().expect("durable pool").push(self.index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(size: usize) -> DurablePool {
        // Lazy connections: nothing is dialled by these tests.
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        DurablePool::new(&client, ConnectionManagerConfig::new(), size).unwrap()
    }

    #[tokio::test]
    async fn holders_get_distinct_connections_and_the_next_waits_for_one() {
        let pool = pool(2);
        let a = pool.get().await;
        let b = pool.get().await;
        assert_ne!(a.index, b.index);
        let third = tokio::time::timeout(std::time::Duration::from_millis(50), pool.get()).await;
        assert!(third.is_err(), "a third holder must wait");
        let a_index = a.index;
        drop(a);
        let c = pool.get().await;
        assert_eq!(c.index, a_index);
    }
}
