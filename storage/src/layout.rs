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

use std::time::Duration;

use redis::AsyncCommands;

use crate::{Result, StorageError, Store};

/// The layout this build reads and writes.
pub const LAYOUT_VERSION: u32 = 2;

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
    /// This gateway migrated the layout from `from`.
    Migrated { from: u32 },
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
                Some(LAYOUT_VERSION) if waited => return Ok(LayoutCheck::MigratedByAnother),
                Some(LAYOUT_VERSION) => return Ok(LayoutCheck::Current),
                _ => {}
            }
            let lock = format!("{}:lock", self.layout_key());
            let taken: bool = redis::cmd("SET")
                .arg(&lock)
                .arg(me)
                .arg("NX")
                .arg("PX")
                .arg(LOCK_TTL.as_millis() as u64)
                .query_async::<Option<String>>(&mut self.conn())
                .await?
                .is_some();
            if !taken {
                waited = true;
                tokio::time::sleep(LOCK_POLL).await;
                continue;
            }
            let outcome = self.migrate(found, me).await;
            let _: i64 = self.conn().del(&lock).await?;
            return outcome;
        }
    }

    /// Runs the steps from `found` to [`LAYOUT_VERSION`], holding the lock.
    async fn migrate(&self, found: Option<u32>, me: &str) -> Result<LayoutCheck> {
        // Read again under the lock: another gateway may have finished.
        let Some(mut version) = self.layout_version().await?.or(found) else {
            self.set_layout_version(LAYOUT_VERSION, me).await?;
            tracing::info!(
                version = LAYOUT_VERSION,
                "recorded the Redis layout version of a new namespace"
            );
            return Ok(LayoutCheck::Initialized);
        };
        let from = version;
        while version < LAYOUT_VERSION {
            // Step `version` → `version + 1`. The only step so far (1 → 2)
            // adds nothing existing data needs; see the module docs.
            version += 1;
            self.set_layout_version(version, me).await?;
            tracing::info!(from = version - 1, to = version, "migrated the Redis layout");
        }
        Ok(if from == LAYOUT_VERSION {
            LayoutCheck::MigratedByAnother
        } else {
            LayoutCheck::Migrated { from }
        })
    }

    async fn set_layout_version(&self, version: u32, me: &str) -> Result<()> {
        let _: () = self
            .conn()
            .hset_multiple(
                self.layout_key(),
                &[
                    ("version", version.to_string()),
                    ("by", me.to_owned()),
                    ("at", crate::now_ms().to_string()),
                ],
            )
            .await?;
        Ok(())
    }
}
