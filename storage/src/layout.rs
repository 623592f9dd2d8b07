//! The version of ketch's Redis layout: `ketch:layout`, a hash with the
//! `version` the data is in, and who last set it (`by`, `at`).
//!
//! Every gateway checks it before serving. A layout newer than the gateway
//! knows stops it with a clear message (it could misread or damage data it
//! does not understand). An older layout is migrated, step by step, under a
//! lock (`ketch:layout:lock`) so one gateway migrates while the others wait.
//! Gateways of the previous version may still be running during a rolling
//! upgrade, so each migration step must leave data the previous version
//! still reads and writes correctly: steps only add.
//!
//! Versions:
//! 1. Everything before the version key existed (no `ketch:layout`).
//! 2. `ketch:layout` itself, the quarantine of segments the archive
//!    cannot write (`ketch:{TAG}:quarantine`, the segment record's
//!    `quarantine` and `skipped` fields), and the batch size classes in a
//!    partition's meta (`sized_from`, `sized_to`, `sz<k>`; see
//!    `scripts/append.lua`). All are new keys and fields that version 1
//!    gateways never read, so the step only records the version; a batch a
//!    version 1 gateway appends leaves `sized_to` behind, and the next
//!    append restarts the range the classes describe.
//! 3. Idempotent producers' state (`ketch:{TAG}:producers`) may be stored
//!    in a compact binary encoding instead of JSON
//!    (`scripts/producer_state.lua`). A gateway of this version reads both;
//!    one of version 2 reads only JSON. So this step is not taken at start
//!    like the others: a gateway migrates to version 2 on its own, and
//!    takes the step to 3 ([`Store::finish_layout`]) only when every live
//!    gateway in the registry has served version 3 (its registry entry
//!    says so; a version 2 gateway's entry has no `layout`) for
//!    `cluster.layout_step_delay`. Until then every
//!    gateway writes JSON. Once the layout is 3 a version 2 gateway
//!    refuses to start, as it refuses any newer layout. JSON states stay
//!    readable and are rewritten compact at the producer's next append.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::AsyncCommands;

use crate::{Result, StorageError, Store};

/// The layout this build reads and writes.
pub const LAYOUT_VERSION: u32 = 3;
/// The newest layout a gateway migrates to at start, whoever else runs:
/// the steps up to it only add what older gateways never read.
const ADDITIVE_LAYOUT: u32 = 2;

/// How long a migrating gateway holds the lock before another may take it
/// (a gateway that died mid-migration); steps are idempotent.
const LOCK_TTL: Duration = Duration::from_secs(60);
/// How often a gateway waiting for another's migration looks again.
const LOCK_POLL: Duration = Duration::from_millis(200);

/// What [`Store::ensure_layout`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutCheck {
    /// The layout was already this version.
    Current,
    /// A new namespace: the version was recorded.
    Initialized,
    /// This gateway migrated the layout from `from` to `to` (2 while a
    /// gateway of an older release may still run: see
    /// [`Store::finish_layout`]).
    Migrated { from: u32, to: u32 },
    /// The layout is 2: the last step waits for every live gateway to
    /// serve version 3 ([`Store::finish_layout`]).
    Waiting,
    /// Another gateway migrated it while this one waited.
    MigratedByAnother,
}

impl Store {
    fn layout_key(&self) -> String {
        format!("{}:layout", self.keys.namespace())
    }

    /// The layout version stored in Redis: `None` for a namespace holding
    /// no ketch data, 1 for data written before versions were recorded.
    pub async fn layout_version(&self) -> Result<Option<u32>> {
        let mut conn = self.conn();
        let version: Option<String> = conn.hget(self.layout_key(), "version").await?;
        if let Some(version) = version {
            return version
                .parse()
                .map(Some)
                .map_err(|_| StorageError::Data(format!("{}: version {version:?}", self.layout_key())));
        }
        let ns = self.keys.namespace();
        let (topics, brokers, ids): (bool, bool, bool) = redis::pipe()
            .exists(self.keys.topics())
            .exists(format!("{ns}:brokers"))
            .exists(format!("{ns}:producer-ids"))
            .query_async(&mut conn)
            .await?;
        Ok((topics || brokers || ids).then_some(1))
    }

    /// Makes sure the layout is [`LAYOUT_VERSION`]: records it in a new
    /// namespace, migrates an older one, refuses a newer one with
    /// [`StorageError::LayoutTooNew`]. `me` names this gateway in the record.
    pub async fn ensure_layout(&self, me: &str) -> Result<LayoutCheck> {
        let mut waited = false;
        loop {
            let found = self.layout_version().await?;
            match found {
                Some(version) if version > LAYOUT_VERSION => {
                    return Err(StorageError::LayoutTooNew {
                        found: version,
                        supported: LAYOUT_VERSION,
                    });
                }
                Some(LAYOUT_VERSION) => {
                    self.compact_producers.store(true, Ordering::Relaxed);
                    return Ok(if waited {
                        LayoutCheck::MigratedByAnother
                    } else {
                        LayoutCheck::Current
                    });
                }
                Some(ADDITIVE_LAYOUT) if waited => return Ok(LayoutCheck::MigratedByAnother),
                Some(ADDITIVE_LAYOUT) => return Ok(LayoutCheck::Waiting),
                _ => {}
            }
            match self.with_lock(me, self.migrate(found, me)).await? {
                Some(outcome) => return Ok(outcome),
                None => {
                    waited = true;
                    tokio::time::sleep(LOCK_POLL).await;
                }
            }
        }
    }

    /// Runs the steps from `found` to [`ADDITIVE_LAYOUT`], holding the
    /// lock; a new namespace starts at [`LAYOUT_VERSION`].
    async fn migrate(&self, found: Option<u32>, me: &str) -> Result<LayoutCheck> {
        // Read again under the lock: another gateway may have finished.
        let Some(mut version) = self.layout_version().await?.or(found) else {
            self.set_layout_version(LAYOUT_VERSION, me).await?;
            self.compact_producers.store(true, Ordering::Relaxed);
            tracing::info!(
                version = LAYOUT_VERSION,
                "recorded the Redis layout version of a new namespace"
            );
            return Ok(LayoutCheck::Initialized);
        };
        if version > LAYOUT_VERSION {
            // A newer release recorded it between this gateway's first look
            // and its lock.
            return Err(StorageError::LayoutTooNew {
                found: version,
                supported: LAYOUT_VERSION,
            });
        }
        if version == LAYOUT_VERSION {
            self.compact_producers.store(true, Ordering::Relaxed);
            return Ok(LayoutCheck::MigratedByAnother);
        }
        let from = version;
        while version < ADDITIVE_LAYOUT {
            // Step `version` → `version + 1`. The only such step (1 → 2)
            // adds nothing existing data needs; see the module docs.
            version += 1;
            self.set_layout_version(version, me).await?;
            tracing::info!(from = version - 1, to = version, "migrated the Redis layout");
        }
        Ok(if from == version {
            LayoutCheck::MigratedByAnother
        } else {
            LayoutCheck::Migrated { from, to: version }
        })
    }

    /// Whether this gateway writes producer state in the compact encoding:
    /// the layout is 3.
    pub fn layout_final(&self) -> bool {
        self.compact_producers.load(Ordering::Relaxed)
    }

    /// Takes the step from layout 2 to 3 when `may_step` (every gateway
    /// has served layout 3 for `cluster.layout_step_delay`) and every
    /// gateway in `live` (the live registry, this gateway included) serves
    /// it, or notices that another gateway took it; from then on this
    /// gateway writes the compact producer state. Returns whether the
    /// layout is 3. A no-op once it is.
    pub async fn finish_layout(
        &self,
        live: &[crate::BrokerRecord],
        may_step: bool,
        me: &str,
    ) -> Result<bool> {
        if self.layout_final() {
            // Compact states exist: the layout must say 3, whatever set it
            // back (a failover that lost the step's write); a gateway that
            // can only read JSON must not start.
            if let Some(version) = self.layout_version().await?
                && version < LAYOUT_VERSION
            {
                tracing::warn!(
                    found = version,
                    "the Redis layout went back below {LAYOUT_VERSION} under compact producer state; recording {LAYOUT_VERSION} again"
                );
                self.set_layout_version(LAYOUT_VERSION, me).await?;
            }
            return Ok(true);
        }
        match self.layout_version().await? {
            Some(version) if version >= LAYOUT_VERSION => {
                self.compact_producers.store(true, Ordering::Relaxed);
                tracing::info!(
                    version,
                    "the Redis layout is final: writing compact producer state"
                );
                return Ok(true);
            }
            Some(ADDITIVE_LAYOUT) => {}
            // Not checked yet (Redis was down at start): ensure_layout runs first.
            _ => return Ok(false),
        }
        if !may_step || live.is_empty() || live.iter().any(|b| b.layout < LAYOUT_VERSION) {
            return Ok(false);
        }
        let step = async {
            if self.layout_version().await? == Some(ADDITIVE_LAYOUT) {
                self.set_layout_version(LAYOUT_VERSION, me).await?;
                self.compact_producers.store(true, Ordering::Relaxed);
                tracing::info!(
                    from = ADDITIVE_LAYOUT,
                    to = LAYOUT_VERSION,
                    gateways = live.len(),
                    "migrated the Redis layout: every live gateway serves it; writing compact producer state"
                );
            }
            Ok(())
        };
        if self.with_lock(me, step).await?.is_none() {
            // Another gateway migrates; the next check sees its result.
            return Ok(false);
        }
        self.compact_producers.store(true, Ordering::Relaxed);
        Ok(true)
    }

    /// Runs `work` holding `ketch:layout:lock`; `None` (and `work` not
    /// run) when another gateway holds it.
    async fn with_lock<T>(
        &self,
        me: &str,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<Option<T>> {
        let lock = format!("{}:lock", self.layout_key());
        let taken = redis::cmd("SET")
            .arg(&lock)
            .arg(me)
            .arg("NX")
            .arg("PX")
            .arg(LOCK_TTL.as_millis() as u64)
            .query_async::<Option<String>>(&mut self.conn())
            .await?
            .is_some();
        if !taken {
            return Ok(None);
        }
        let outcome = work.await;
        // Released only if still this gateway's: one that stalled past
        // the lock's time must not release another's.
        let _: i64 = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        )
        .key(&lock)
        .arg(me)
        .invoke_async(&mut self.conn())
        .await?;
        outcome.map(Some)
    }

    /// Records `version`, unless the layout is already at it or newer: a
    /// gateway that stalled in a step must not set it back.
    async fn set_layout_version(&self, version: u32, me: &str) -> Result<()> {
        let _: i64 = redis::Script::new(
            "local v = tonumber(redis.call('HGET', KEYS[1], 'version') or '0') \
             if v and v >= tonumber(ARGV[1]) then return 0 end \
             redis.call('HSET', KEYS[1], 'version', ARGV[1], 'by', ARGV[2], 'at', ARGV[3]) return 1",
        )
        .key(self.layout_key())
        .arg(version)
        .arg(me)
        .arg(crate::now_ms())
        .invoke_async(&mut self.conn())
        .await?;
        Ok(())
    }
}
