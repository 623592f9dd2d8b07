//! Authentication and authorisation: TLS and mTLS on the listeners, SASL
//! (SCRAM-SHA-256/512, PLAIN, OAUTHBEARER) and ACLs. See docs/security.md.

pub mod acl;
pub mod jwt;
pub mod oauthbearer;
pub mod sasl;
pub mod scram;
pub mod tls;
pub mod x509;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ketch_config::Settings;

/// A gateway's security: what every connection and request is checked by.
pub struct Security {
    /// The listeners' TLS configuration, when a certificate is set.
    pub tls: Option<Arc<tls::Tls>>,
    pub sasl: Arc<sasl::Sasl>,
    pub acls: acl::Authorizer,
    /// The secret gateways prove to each other on their internal listeners
    /// when ACLs are on, and when it was read from Redis.
    internal_secret: std::sync::Mutex<Option<(Arc<[u8]>, Instant)>>,
}

/// How long a gateway uses the internal secret it read before reading it
/// again: a key lost from Redis and made anew by a gateway that started
/// since is taken up by the others within this long.
const SECRET_REREAD: Duration = Duration::from_secs(5);
/// After a connecting gateway's wrong proof, the listener reads the secret
/// again if its copy is older than this (about once a second, whatever a
/// stranger sends: proofs arriving together may each read it).
const SECRET_REREAD_AFTER_WRONG_PROOF: Duration = Duration::from_secs(1);

/// The label of the internal listener's proof (HMAC-SHA256 of it and the
/// listener's nonce, keyed with the internal secret).
const INTERNAL_PROOF_LABEL: &[u8] = b"ketch internal listener v1";

/// The proof of knowing `secret` for `nonce`.
pub fn internal_proof(secret: &[u8], nonce: &[u8]) -> Vec<u8> {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret);
    let mut context = aws_lc_rs::hmac::Context::with_key(&key);
    context.update(INTERNAL_PROOF_LABEL);
    context.update(nonce);
    context.sign().as_ref().to_vec()
}

/// Whether `proof` proves `secret` for `nonce` (constant time).
pub fn verify_internal_proof(secret: &[u8], nonce: &[u8], proof: &[u8]) -> bool {
    aws_lc_rs::constant_time::verify_slices_are_equal(&internal_proof(secret, nonce), proof).is_ok()
}

impl Security {
    /// Loads the certificates and keys the settings name.
    pub fn load(settings: &Settings) -> anyhow::Result<Self> {
        Ok(Self {
            tls: tls::Tls::load(&settings.tls)?,
            sasl: Arc::new(sasl::Sasl::new(settings)?),
            acls: acl::Authorizer::new(&settings.acl),
            internal_secret: Default::default(),
        })
    }

    /// The internal listener's secret when gateways must prove it (ACLs
    /// are on: a forwarded request carries the principal it is checked
    /// as, so only gateways may send one); `None` otherwise.
    pub async fn internal_secret(
        &self,
        storage: &dyn crate::storage::Storage,
    ) -> Result<Option<Arc<[u8]>>, ketch_storage::StorageError> {
        self.internal_secret_within(storage, SECRET_REREAD).await
    }

    /// [`Security::internal_secret`] read again unless this gateway's copy
    /// is quite fresh: for a listener whose copy a connecting gateway's
    /// proof did not match (the key was made anew since).
    pub async fn internal_secret_after_wrong_proof(
        &self,
        storage: &dyn crate::storage::Storage,
    ) -> Result<Option<Arc<[u8]>>, ketch_storage::StorageError> {
        self.internal_secret_within(storage, SECRET_REREAD_AFTER_WRONG_PROOF)
            .await
    }

    /// The secret, read from Redis again when this gateway's copy is older
    /// than `max_age` (the copy is written back if the key is gone). Redis
    /// failing, a copy of any age serves, and is not read again for
    /// `max_age`.
    async fn internal_secret_within(
        &self,
        storage: &dyn crate::storage::Storage,
        max_age: Duration,
    ) -> Result<Option<Arc<[u8]>>, ketch_storage::StorageError> {
        if !self.acls.enabled() {
            return Ok(None);
        }
        let held = self.internal_secret.lock().expect("secret lock").clone();
        if let Some((secret, read)) = &held
            && read.elapsed() < max_age
        {
            return Ok(Some(secret.clone()));
        }
        let kept = held.as_ref().map(|(secret, _)| &secret[..]);
        match storage.internal_secret(kept).await {
            Ok(read) => {
                if kept.is_some_and(|kept| kept != &read[..]) {
                    tracing::warn!(
                        "the internal secret in Redis changed (its key was lost and made anew): taking the new one up"
                    );
                }
                let secret: Arc<[u8]> = Arc::from(read);
                *self.internal_secret.lock().expect("secret lock") = Some((secret.clone(), Instant::now()));
                Ok(Some(secret))
            }
            // The copy serves until the next try, as long from now as
            // after a read: a Redis that hangs holds up one request per
            // period, not every one.
            Err(e) => match held {
                Some((secret, _)) => {
                    *self.internal_secret.lock().expect("secret lock") =
                        Some((secret.clone(), Instant::now()));
                    Ok(Some(secret))
                }
                None => Err(e),
            },
        }
    }

    /// Without TLS or OAUTHBEARER keys (nothing to load from files): for
    /// contexts made in tests and the fuzz target.
    pub fn without_files(settings: &Settings) -> Self {
        let mut plain = settings.clone();
        plain.sasl.mechanisms.retain(|m| m != "OAUTHBEARER");
        plain.sasl.oauth_jwks_file = None;
        plain.sasl.oauth_public_key_file = None;
        Self {
            tls: None,
            sasl: Arc::new(sasl::Sasl::new(&plain).expect("SASL without key files")),
            acls: acl::Authorizer::new(&settings.acl),
            internal_secret: Default::default(),
        }
    }
}
