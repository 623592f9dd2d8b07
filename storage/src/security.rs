//! Users and ACLs (DESIGN §3, docs/security.md), under the hash tag
//! `{security}` so that one script changes them atomically in Redis
//! Cluster too:
//!
//! - `ketch:{security}:users`: hash `MECHANISM:user` → SCRAM credential
//!   (JSON made by the gateway: salt, iterations, stored and server keys;
//!   never a password);
//! - `ketch:{security}:acls`: hash ACL binding (JSON) → `1`;
//! - `ketch:{security}:internal-secret`: what gateways prove to each other
//!   on their internal listeners (random, made by the first gateway);
//! - `ketch:{security}:version`: bumped at every ACL change, and published
//!   on the sharded channel `ketch:{security}:changed`, so every gateway
//!   reloads its in-memory ACLs at once.

use redis::AsyncCommands;

use crate::{Result, Store};

/// One change of AlterUserScramCredentials ([`Store::alter_scram_credentials`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramChange {
    /// Sets (creates or replaces) `user`'s credential for `mechanism`.
    Set {
        mechanism: String,
        user: String,
        credential: String,
    },
    /// Deletes `user`'s credential for `mechanism`.
    Delete { mechanism: String, user: String },
}

/// One stored SCRAM credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCredential {
    pub user: String,
    pub mechanism: String,
    /// The credential as the gateway encoded it.
    pub credential: String,
}

impl Store {
    fn security_key(&self, name: &str) -> String {
        format!("{}:{{security}}:{name}", self.keys.namespace())
    }

    /// The sharded pub/sub channel ACL changes are announced on.
    pub fn acl_channel(&self) -> String {
        self.security_key("changed")
    }

    /// A user's credential for `mechanism`, if it has one.
    pub async fn scram_credential(&self, mechanism: &str, user: &str) -> Result<Option<String>> {
        let credential: Option<String> = self
            .conn()
            .hget(self.security_key("users"), format!("{mechanism}:{user}"))
            .await?;
        Ok(credential)
    }

    /// Sets (creates or replaces) a user's credential for `mechanism`.
    /// Like every change of security and quota settings, waited for by the
    /// replicas acks=all waits for, but not failed without them
    /// ([`Store::invoke_configured`]): a failover should not bring back a
    /// credential or an ACL an operator removed.
    pub async fn set_scram_credential(&self, mechanism: &str, user: &str, credential: &str) -> Result<()> {
        let key = self.security_key("users");
        let mut pipe = redis::pipe();
        pipe.hset(&key, format!("{mechanism}:{user}"), credential)
            .ignore();
        let () = self.query_configured(&key, &pipe).await?;
        Ok(())
    }

    /// Deletes a user's credential for `mechanism`; false if there was none.
    pub async fn delete_scram_credential(&self, mechanism: &str, user: &str) -> Result<bool> {
        let key = self.security_key("users");
        let mut pipe = redis::pipe();
        pipe.hdel(&key, format!("{mechanism}:{user}"));
        let (removed,): (i64,) = self.query_configured(&key, &pipe).await?;
        Ok(removed > 0)
    }

    /// Makes several credential changes in one atomic write
    /// (AlterUserScramCredentials: all of a request's accepted changes or
    /// none, as Kafka's controller appends them as one batch of records),
    /// waited for as [`Store::set_scram_credential`] is.
    pub async fn alter_scram_credentials(&self, changes: &[ScramChange]) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let key = self.security_key("users");
        let mut pipe = redis::pipe();
        pipe.atomic();
        for change in changes {
            match change {
                ScramChange::Set {
                    mechanism,
                    user,
                    credential,
                } => pipe
                    .hset(&key, format!("{mechanism}:{user}"), credential)
                    .ignore(),
                ScramChange::Delete { mechanism, user } => {
                    pipe.hdel(&key, format!("{mechanism}:{user}")).ignore()
                }
            };
        }
        let () = self.query_configured(&key, &pipe).await?;
        Ok(())
    }

    /// Every stored credential, sorted by user and mechanism.
    pub async fn scram_credentials(&self) -> Result<Vec<StoredCredential>> {
        let all: Vec<(String, String)> = self.conn().hgetall(self.security_key("users")).await?;
        let mut credentials: Vec<StoredCredential> = all
            .into_iter()
            .filter_map(|(field, credential)| {
                let (mechanism, user) = field.split_once(':')?;
                Some(StoredCredential {
                    user: user.to_owned(),
                    mechanism: mechanism.to_owned(),
                    credential,
                })
            })
            .collect();
        credentials.sort_by(|a, b| (&a.user, &a.mechanism).cmp(&(&b.user, &b.mechanism)));
        Ok(credentials)
    }

    /// The secret gateways prove to each other on the internal listener
    /// (made, at random, by the first gateway that asks). `keep`, the
    /// secret the caller holds, is written back when the key is gone (a
    /// failover before it was replicated, a restore, an operator's
    /// deletion), so the running gateways keep theirs rather than the next
    /// gateway to start making one they do not know. To replace the
    /// secret, an operator SETs a new one: the gateways take it up within
    /// seconds (a DEL is undone by the running gateways' copies).
    pub async fn internal_secret(&self, keep: Option<&[u8]>) -> Result<Vec<u8>> {
        let key = self.security_key("internal-secret");
        let fresh: [u8; 32] = rand::random();
        let secret: Vec<u8> = self
            .scripts
            .internal_secret
            .key(&key)
            .arg(keep.unwrap_or(&fresh[..]))
            .invoke_async(&mut self.conn())
            .await?;
        if secret.len() < 16 {
            return Err(crate::StorageError::Data(format!(
                "{key} holds {} bytes, fewer than 16",
                secret.len()
            )));
        }
        Ok(secret)
    }

    /// The ACL version and every binding.
    pub async fn acls(&self) -> Result<(u64, Vec<String>)> {
        let (version, bindings): (Option<u64>, Vec<String>) = redis::pipe()
            .get(self.security_key("version"))
            .hkeys(self.security_key("acls"))
            .query_async(&mut self.conn())
            .await?;
        Ok((version.unwrap_or(0), bindings))
    }

    /// Only the ACL version (cheap: what a gateway polls between wake-ups).
    pub async fn acl_version(&self) -> Result<u64> {
        let version: Option<u64> = self.conn().get(self.security_key("version")).await?;
        Ok(version.unwrap_or(0))
    }

    /// Adds bindings (those already present stay); how many were new.
    pub async fn add_acls(&self, bindings: &[String]) -> Result<usize> {
        self.change_acls("add", bindings).await
    }

    /// Removes bindings; how many were present.
    pub async fn remove_acls(&self, bindings: &[String]) -> Result<usize> {
        self.change_acls("remove", bindings).await
    }

    async fn change_acls(&self, op: &str, bindings: &[String]) -> Result<usize> {
        if bindings.is_empty() {
            return Ok(0);
        }
        let acls = self.security_key("acls");
        let mut script = self.scripts.change_acls.key(&acls);
        script
            .key(self.security_key("version"))
            .arg(op)
            .arg(self.acl_channel())
            .arg(bindings);
        let changed: i64 = self
            .invoke_configured(
                &acls,
                &script,
                |reply| matches!(reply, redis::Value::Int(n) if *n > 0),
            )
            .await?;
        Ok(changed.max(0) as usize)
    }
}
