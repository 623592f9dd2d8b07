//! One AWS credential for all of a gateway's S3 operations, when the
//! files' properties name none (`tiering.s3_access_key_id` is not set, and
//! a REST catalog vends no keys for the table) and the credential comes
//! from the environment: an instance role (IMDS), a container role (ECS),
//! web identity, SSO, a profile.
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
//! rotated credentials file is still read again. A renewal that gets
//! nothing keeps the old credential while it can still sign.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use iceberg::io::{Storage, StorageConfig, StorageFactory};
use iceberg_storage_opendal::CustomAwsCredentialLoader;
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;
use reqsign_aws_v4::{Credential, DefaultCredentialProvider};
use reqsign_core::{Context, ProvideCredential, SigningCredential};
use serde::{Deserialize, Serialize};

/// The storage factory of the archive's file IO (the reader's, and every
/// table's a catalog loads): see [`ArchiveStorageFactory`].
pub fn storage_factory() -> Arc<ArchiveStorageFactory> {
    static SHARED: OnceLock<CustomAwsCredentialLoader> = OnceLock::new();
    let shared = SHARED.get_or_init(|| CustomAwsCredentialLoader::new(SharedCredential::new()));
    Arc::new(ArchiveStorageFactory {
        shared: Some(OpenDalResolvingStorageFactory::new().with_s3_credential_loader(shared.clone())),
        own: OpenDalResolvingStorageFactory::new(),
    })
}

/// File properties that say how S3 operations authenticate: with them,
/// opendal's own handling (a custom credential chain would override them:
/// opendal then uses it instead of the keys).
const CREDENTIAL_PROPS: &[&str] = &[
    iceberg::io::S3_ACCESS_KEY_ID,
    iceberg::io::S3_SECRET_ACCESS_KEY,
    iceberg::io::S3_SESSION_TOKEN,
    iceberg::io::S3_ASSUME_ROLE_ARN,
    iceberg::io::S3_ALLOW_ANONYMOUS,
    iceberg::io::S3_DISABLE_EC2_METADATA,
    iceberg::io::S3_DISABLE_CONFIG_LOAD,
];

/// Builds each file IO's storage with the process-wide
/// [`SharedCredential`] when its properties name no credential of their
/// own ([`CREDENTIAL_PROPS`]): ketch's settings without
/// `tiering.s3_access_key_id`, and the tables of a REST catalog that vends
/// no keys (catalog properties and a table's config together); else with
/// opendal's handling of those properties (keys set, or vended by the
/// catalog).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArchiveStorageFactory {
    #[serde(skip)]
    shared: Option<OpenDalResolvingStorageFactory>,
    own: OpenDalResolvingStorageFactory,
}

impl ArchiveStorageFactory {
    /// Whether a file IO with these properties takes the shared credential.
    fn shares(&self, props: &std::collections::HashMap<String, String>) -> bool {
        self.shared.is_some() && !props.keys().any(|key| CREDENTIAL_PROPS.contains(&key.as_str()))
    }
}

#[typetag::serde]
impl StorageFactory for ArchiveStorageFactory {
    fn build(&self, config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        match &self.shared {
            Some(shared) if self.shares(config.props()) => shared.build(config),
            _ => self.own.build(config),
        }
    }
}

/// How long a credential without an expiry is used before the chain is
/// asked again.
pub const NO_EXPIRY_REUSE: Duration = Duration::from_secs(300);

/// After the chain gave nothing, how long operations are answered without
/// asking it again (each would wait for it in turn).
const FAILED_ASK_REUSE: Duration = Duration::from_secs(1);

/// The default AWS credential chain (or `P`), asked once for all
/// operations while its credential is valid; concurrent operations wait
/// for one answer. When a renewal gets nothing (the instance metadata
/// service or container agent briefly not answering), the credential it
/// was to replace is used while it is still valid for the request (10 s
/// more), as the AWS SDKs do, rather than failing every operation at once.
#[derive(Debug)]
pub struct SharedCredential<P = DefaultCredentialProvider> {
    chain: P,
    state: tokio::sync::Mutex<Cached>,
}

#[derive(Debug, Default)]
struct Cached {
    /// The last credential the chain gave, and when.
    credential: Option<(Credential, Instant)>,
    /// When the chain last gave nothing.
    failed: Option<Instant>,
}

impl SharedCredential {
    pub fn new() -> Self {
        Self::over(DefaultCredentialProvider::new())
    }
}

impl Default for SharedCredential {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> SharedCredential<P> {
    /// Caches what `chain` gives.
    pub fn over(chain: P) -> Self {
        Self {
            chain,
            state: tokio::sync::Mutex::new(Cached::default()),
        }
    }
}

impl Cached {
    /// The last credential, if it can still sign a request (reqsign's
    /// signer wants 10 s left).
    fn kept(&self) -> Option<Credential> {
        let soon = reqsign_core::time::Timestamp::now() + Duration::from_secs(10);
        (self.credential.as_ref())
            .map(|(credential, _)| credential)
            .filter(|credential| credential.is_valid_at(soon))
            .cloned()
    }
}

/// Whether a credential the chain gave at `at` may still be used without
/// asking for a new one.
fn reusable(credential: &Credential, at: Instant) -> bool {
    credential.is_valid() && (credential.expires_in.is_some() || at.elapsed() < NO_EXPIRY_REUSE)
}

impl<P: ProvideCredential<Credential = Credential>> ProvideCredential for SharedCredential<P> {
    type Credential = Credential;

    async fn provide_credential(&self, ctx: &Context) -> reqsign_core::Result<Option<Credential>> {
        let mut state = self.state.lock().await;
        if let Some((credential, at)) = state.credential.as_ref()
            && reusable(credential, *at)
        {
            return Ok(Some(credential.clone()));
        }
        if state.failed.is_some_and(|at| at.elapsed() < FAILED_ASK_REUSE) {
            return Ok(state.kept());
        }
        // reqsign's chain logs a source's error and answers None.
        let fresh = self.chain.provide_credential(ctx).await;
        match fresh {
            Ok(Some(credential)) => {
                *state = Cached {
                    credential: Some((credential.clone(), Instant::now())),
                    failed: None,
                };
                Ok(Some(credential))
            }
            Ok(None) | Err(_) if state.kept().is_some() => {
                state.failed = Some(Instant::now());
                Ok(state.kept())
            }
            other => {
                state.failed = Some(Instant::now());
                other
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

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
    fn file_ios_naming_a_credential_of_their_own_keep_it() {
        let factory = storage_factory();
        let props = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<std::collections::HashMap<_, _>>()
        };
        assert!(factory.shares(&props(&[
            ("s3.endpoint", "http://s3"),
            ("s3.region", "eu-west-1")
        ])));
        for own in [
            "s3.access-key-id",
            "s3.session-token",
            "client.assume-role.arn",
            "s3.allow-anonymous",
        ] {
            assert!(
                !factory.shares(&props(&[("s3.endpoint", "http://s3"), (own, "x")])),
                "{own}"
            );
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

    /// Answers its queue's credentials in turn, counting the asks.
    #[derive(Debug, Default)]
    struct Queue(Mutex<(Vec<Option<Credential>>, usize)>);

    impl ProvideCredential for Queue {
        type Credential = Credential;

        async fn provide_credential(&self, _: &Context) -> reqsign_core::Result<Option<Credential>> {
            let mut queue = self.0.lock().unwrap();
            queue.1 += 1;
            Ok(if queue.0.is_empty() {
                None
            } else {
                queue.0.remove(0)
            })
        }
    }

    #[tokio::test]
    async fn a_renewal_that_gets_nothing_keeps_the_credential_while_it_still_signs() {
        let ctx = Context::new();
        let asks = |shared: &SharedCredential<Queue>| shared.chain.0.lock().unwrap().1;
        // Due for renewal (a minute left), and the renewal gets nothing.
        let expiring = credential(Some(Duration::from_secs(60)));
        let shared = SharedCredential::over(Queue(Mutex::new((vec![Some(expiring.clone()), None], 0))));
        let first = shared.provide_credential(&ctx).await.unwrap();
        assert_eq!(first.map(|c| c.expires_in), Some(expiring.expires_in));
        let second = shared.provide_credential(&ctx).await.unwrap();
        assert_eq!(second.map(|c| c.expires_in), Some(expiring.expires_in), "kept");
        assert_eq!(asks(&shared), 2);
        // Asked again only after a second.
        shared.provide_credential(&ctx).await.unwrap().expect("kept");
        assert_eq!(asks(&shared), 2);

        // One that no longer signs is not kept: nothing, as the chain said.
        let spent = credential(Some(Duration::from_secs(5)));
        let shared = SharedCredential::over(Queue(Mutex::new((vec![Some(spent), None], 0))));
        shared.provide_credential(&ctx).await.unwrap().expect("given");
        assert!(shared.provide_credential(&ctx).await.unwrap().is_none());

        // A long-lived credential is asked for once.
        let lasting = credential(Some(Duration::from_secs(3600)));
        let shared = SharedCredential::over(Queue(Mutex::new((vec![Some(lasting)], 0))));
        for _ in 0..5 {
            shared.provide_credential(&ctx).await.unwrap().expect("given");
        }
        assert_eq!(asks(&shared), 1);
    }
}
