//! Client quotas (DescribeClientQuotas, AlterClientQuotas; docs/quotas.md),
//! under the hash tag `{quotas}` so that one script changes them
//! atomically in Redis Cluster too:
//!
//! - `ketch:{quotas}:entities`: hash `<entity>\n<key>` → value, one field
//!   per quota of an entity (`producer_byte_rate`…), so concurrent changes
//!   to different quotas of one entity never overwrite each other. The
//!   entity is the gateway's canonical text of it; storage does not read it.
//! - `ketch:{quotas}:version`: bumped at every change, and published on the
//!   sharded channel `ketch:{quotas}:changed`, so every gateway reloads its
//!   quota table at once.
//! - `ketch:{quotas}:mutations:<client>`: a client's controller mutation
//!   tokens (hash: tokens, at), shared by every gateway; it expires once
//!   full again.

use redis::AsyncCommands;

use crate::{Result, Store};

/// One stored quota: an entity's value for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredQuota {
    pub entity: String,
    pub key: String,
    /// The value as the gateway wrote it (a decimal number).
    pub value: String,
}

/// A change to one quota: `None` removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaChange {
    pub entity: String,
    pub key: String,
    pub value: Option<String>,
}

impl Store {
    fn quota_key(&self, name: &str) -> String {
        format!("{}:{{quotas}}:{name}", self.keys.namespace())
    }

    /// Takes `take` of `client`'s controller mutation tokens, from one
    /// bucket every gateway shares (`mutation_tokens.lua`, Redis's clock):
    /// whether they were taken (strict: not when already below zero), and
    /// the tokens left.
    pub async fn take_mutation_tokens(
        &self,
        client: &str,
        rate: f64,
        burst: f64,
        take: i32,
        strict: bool,
    ) -> Result<(bool, f64)> {
        let (taken, tokens): (i64, String) = self
            .scripts
            .mutation_tokens
            .key(self.quota_key(&format!("mutations:{client}")))
            .arg(rate)
            .arg(burst)
            .arg(take.max(0))
            .arg(if strict { "1" } else { "0" })
            .invoke_async(&mut self.conn())
            .await?;
        let tokens = tokens
            .parse()
            .map_err(|e| crate::StorageError::Data(format!("mutation tokens {tokens:?}: {e}")))?;
        Ok((taken == 1, tokens))
    }

    /// The sharded pub/sub channel quota changes are announced on.
    pub fn quota_channel(&self) -> String {
        self.quota_key("changed")
    }

    /// The quota version and every stored quota.
    pub async fn client_quotas(&self) -> Result<(u64, Vec<StoredQuota>)> {
        let (version, fields): (Option<u64>, Vec<(String, String)>) = redis::pipe()
            .get(self.quota_key("version"))
            .hgetall(self.quota_key("entities"))
            .query_async(&mut self.conn())
            .await?;
        let quotas = fields
            .into_iter()
            .filter_map(|(field, value)| {
                let (entity, key) = field.rsplit_once('\n')?;
                Some(StoredQuota {
                    entity: entity.to_owned(),
                    key: key.to_owned(),
                    value,
                })
            })
            .collect();
        Ok((version.unwrap_or(0), quotas))
    }

    /// Only the quota version (what a gateway polls between wake-ups).
    pub async fn client_quota_version(&self) -> Result<u64> {
        let version: Option<u64> = self.conn().get(self.quota_key("version")).await?;
        Ok(version.unwrap_or(0))
    }

    /// Applies `changes` at once (all or none) and announces them; the new
    /// version. Entities and keys must not hold a newline, nor values be
    /// empty (the gateway validates them first).
    pub async fn change_client_quotas(&self, changes: &[QuotaChange]) -> Result<u64> {
        let mut script = self.scripts.change_versioned_hash.key(self.quota_key("entities"));
        script
            .key(self.quota_key("version"))
            .arg(self.quota_channel())
            .arg("");
        for change in changes {
            debug_assert!(!change.key.contains('\n') && change.value.as_deref() != Some(""));
            script
                .arg(format!("{}\n{}", change.entity, change.key))
                .arg(hash_change(change.value.as_deref()));
        }
        // Waited for by acks=all's replicas, not failed without them.
        let key = self.quota_key("entities");
        let version: i64 = self.invoke_configured(&key, &script, |_| true).await?;
        Ok(u64::try_from(version).unwrap_or_default())
    }
}

/// A field's change for `change_versioned_hash.lua`: `=value` sets it (an
/// empty value too), `-` removes it.
pub(crate) fn hash_change(value: Option<&str>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("={value}"))
}
