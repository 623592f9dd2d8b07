//! One AWS credential for all of a gateway's S3 operations, when
//! `tiering.s3_access_key_id` is not set and the credential comes from the
//! environment: an instance role (IMDS), a container role (ECS), web
//! identity, SSO, a profile.
//!
//! iceberg-storage-opendal builds an opendal operator, and with it a new
//! credential chain and signer, for every file operation; the signer's own
//! cache of the credential then lives for one operation, and every read,
//! write and listing of the archive asked the instance metadata service
//! (or STS, or the container agent) again: a round trip before each, and
//! a rate IMDS throttles. [`SharedCredential`] is handed to every operator
//! instead of the default chain, and keeps what the chain gave until two
//! minutes before it expires (reqsign's own margin); one without an expiry
//! (environment variables, a profile's keys) for [`NO_EXPIRY_REUSE`], so a
//! rotated credentials file is still read again.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use iceberg_storage_opendal::CustomAwsCredentialLoader;
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;
use ketch_config::TieringSettings;
use reqsign_aws_v4::{Credential, DefaultCredentialProvider};
use reqsign_core::{Context, ProvideCredential, SigningCredential};

/// The storage factory of the archive's file IO: with
/// [`SharedCredential`] when S3 keys are not set and the files' properties
/// come from ketch's settings alone. A REST catalog may vend keys for a
/// table's files in its properties, which a custom credential chain would
/// override (opendal uses it instead of the keys): its tables keep
/// opendal's own chain.
pub fn storage_factory(
    settings: &TieringSettings,
    from_settings: bool,
) -> Arc<OpenDalResolvingStorageFactory> {
    static SHARED: OnceLock<CustomAwsCredentialLoader> = OnceLock::new();
    let factory = OpenDalResolvingStorageFactory::new();
    if !from_settings || !settings.s3_access_key_id.is_empty() {
        return Arc::new(factory);
    }
    let shared = SHARED.get_or_init(|| CustomAwsCredentialLoader::new(SharedCredential::new()));
    Arc::new(factory.with_s3_credential_loader(shared.clone()))
}

/// How long a credential without an expiry is used before the chain is
/// asked again.
pub const NO_EXPIRY_REUSE: Duration = Duration::from_secs(300);

/// The default AWS credential chain, asked once for all operations while
/// its credential is valid; concurrent operations wait for one answer.
#[derive(Debug)]
pub struct SharedCredential {
    chain: DefaultCredentialProvider,
    cached: tokio::sync::Mutex<Option<(Credential, Instant)>>,
}

impl SharedCredential {
    pub fn new() -> Self {
        Self {
            chain: DefaultCredentialProvider::new(),
            cached: tokio::sync::Mutex::new(None),
        }
    }
}

impl Default for SharedCredential {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether a credential the chain gave at `at` may still be used.
fn reusable(credential: &Credential, at: Instant) -> bool {
    credential.is_valid() && (credential.expires_in.is_some() || at.elapsed() < NO_EXPIRY_REUSE)
}

impl ProvideCredential for SharedCredential {
    type Credential = Credential;

    async fn provide_credential(&self, ctx: &Context) -> reqsign_core::Result<Option<Credential>> {
        let mut cached = self.cached.lock().await;
        if let Some((credential, at)) = cached.as_ref()
            && reusable(credential, *at)
        {
            return Ok(Some(credential.clone()));
        }
        let fresh = self.chain.provide_credential(ctx).await?;
        *cached = fresh.clone().map(|credential| (credential, Instant::now()));
        Ok(fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential(expires_in: Option<Duration>) -> Credential {
        Credential {
            access_key_id: "AKIA".to_owned(),
            secret_access_key: "secret".to_owned(),
            session_token: None,
            expires_in: expires_in.map(|d| reqsign_core::time::Timestamp::now() + d),
        }
    }

    #[test]
    fn a_credential_is_reused_until_near_its_expiry_or_for_a_while_without_one() {
        let now = Instant::now();
        assert!(reusable(&credential(Some(Duration::from_secs(3600))), now));
        // reqsign's margin: two minutes before the expiry it is renewed.
        assert!(!reusable(&credential(Some(Duration::from_secs(60))), now));
        assert!(reusable(&credential(None), now));
        let Some(long_ago) = now.checked_sub(NO_EXPIRY_REUSE + Duration::from_secs(1)) else {
            return;
        };
        assert!(!reusable(&credential(None), long_ago));
        assert!(reusable(&credential(Some(Duration::from_secs(3600))), long_ago));
    }
}
