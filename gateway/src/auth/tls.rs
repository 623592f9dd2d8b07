//! TLS on the Kafka listeners (rustls): the certificate and key, mutual TLS
//! with `tls.client_ca_file`, and reloading all three without dropping a
//! connection. A new configuration applies to connections accepted after
//! it; open connections keep the one they were made with. A file that
//! fails to load (half-written, mismatched key) leaves the previous
//! configuration in place and is logged; it is tried again on the next
//! change.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use anyhow::Context as _;
use ketch_config::TlsSettings;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::x509::{self, PrincipalMapper};

/// The listeners' TLS configuration, reloadable.
pub struct Tls {
    settings: TlsSettings,
    acceptor: RwLock<TlsAcceptor>,
    /// The HTTP listener's (`http.tls`): the same certificate, no client
    /// certificates asked for.
    http_acceptor: RwLock<TlsAcceptor>,
    /// The files and their modification times when last loaded.
    loaded: RwLock<Vec<(PathBuf, Option<SystemTime>)>>,
    mapper: PrincipalMapper,
}

fn modified(path: &PathBuf) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Tls {
    /// The configuration of `settings`; `None` when no certificate is set.
    pub fn load(settings: &TlsSettings) -> anyhow::Result<Option<Arc<Self>>> {
        let (Some(_), Some(_)) = (&settings.cert_file, &settings.key_file) else {
            return Ok(None);
        };
        let mapper = PrincipalMapper::parse(&settings.principal_mapping_rules)
            .map_err(|e| anyhow::anyhow!("tls.principal_mapping_rules: {e}"))?;
        let files = Self::files(settings);
        let stamps = files.iter().map(|f| (f.clone(), modified(f))).collect();
        let config = server_config(settings, true)?;
        let http = server_config(settings, false)?;
        Ok(Some(Arc::new(Self {
            settings: settings.clone(),
            acceptor: RwLock::new(TlsAcceptor::from(config)),
            http_acceptor: RwLock::new(TlsAcceptor::from(http)),
            loaded: RwLock::new(stamps),
            mapper,
        })))
    }

    fn files(settings: &TlsSettings) -> Vec<PathBuf> {
        [&settings.cert_file, &settings.key_file, &settings.client_ca_file]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.settings.client_ca_file.is_some()
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.read().expect("tls lock").clone()
    }

    /// The HTTP listener's acceptor for a new connection.
    pub fn http_acceptor(&self) -> TlsAcceptor {
        self.http_acceptor.read().expect("tls lock").clone()
    }

    /// Loads the files again; on failure the previous configuration stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let files = Self::files(&self.settings);
        let stamps: Vec<_> = files.iter().map(|f| (f.clone(), modified(f))).collect();
        let config = server_config(&self.settings, true)?;
        let http = server_config(&self.settings, false)?;
        *self.acceptor.write().expect("tls lock") = TlsAcceptor::from(config);
        *self.http_acceptor.write().expect("tls lock") = TlsAcceptor::from(http);
        *self.loaded.write().expect("tls lock") = stamps;
        Ok(())
    }

    fn changed(&self) -> bool {
        self.loaded
            .read()
            .expect("tls lock")
            .iter()
            .any(|(path, stamp)| modified(path) != *stamp)
    }

    /// Reloads on SIGHUP and when a file changes (checked every
    /// `tls.reload_interval`), until shutdown.
    pub async fn watch(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot catch SIGHUP; TLS files are reloaded when they change only");
                None
            }
        };
        let mut tick = tokio::time::interval(self.settings.reload_interval.get());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let why = tokio::select! {
                _ = tick.tick() => {
                    if !self.changed() { continue; }
                    "a file changed"
                }
                Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => "SIGHUP",
                _ = shutdown.wait_for(|s| *s) => return,
            };
            match self.reload() {
                Ok(()) => tracing::info!(reason = why, "reloaded the TLS certificate, key and client CAs"),
                Err(e) => {
                    // Do not retry every tick for the same files.
                    let files = Self::files(&self.settings);
                    *self.loaded.write().expect("tls lock") =
                        files.iter().map(|f| (f.clone(), modified(f))).collect();
                    tracing::error!(reason = why, error = %format!("{e:#}"), "cannot reload TLS files; keeping the previous ones")
                }
            }
        }
    }

    /// The principal of a client certificate: its subject mapped by
    /// `tls.principal_mapping_rules`, as `User:<name>`. A subject that
    /// cannot be read, or that no rule matches, fails the connection, as
    /// in Kafka.
    pub fn principal(&self, certificate: &CertificateDer<'_>) -> Result<String, String> {
        let dn = x509::subject_dn(certificate.as_ref())
            .map_err(|e| format!("cannot read the client certificate's subject: {e}"))?;
        match self.mapper.try_map(&dn) {
            Some(name) => Ok(format!("User:{name}")),
            None => Err(format!(
                "no tls.principal_mapping_rules rule matches the client certificate's subject {dn:?}"
            )),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A server configuration from the files; `client_auth`: ask for client
/// certificates when `tls.client_ca_file` is set.
fn server_config(settings: &TlsSettings, client_auth: bool) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let (Some(cert_file), Some(key_file)) = (&settings.cert_file, &settings.key_file) else {
        anyhow::bail!("tls.cert_file and tls.key_file are required");
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .with_context(|| format!("tls.cert_file {}", cert_file.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("tls.cert_file {}", cert_file.display()))?;
    if certs.is_empty() {
        anyhow::bail!("tls.cert_file {} holds no PEM certificate", cert_file.display());
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .with_context(|| format!("tls.key_file {} (a PEM private key)", key_file.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match settings.client_ca_file.as_ref().filter(|_| client_auth) {
        Some(ca_file) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca_file)
                .with_context(|| format!("tls.client_ca_file {}", ca_file.display()))?
            {
                let cert = cert.with_context(|| format!("tls.client_ca_file {}", ca_file.display()))?;
                roots
                    .add(cert)
                    .with_context(|| format!("tls.client_ca_file {}", ca_file.display()))?;
            }
            if roots.is_empty() {
                anyhow::bail!(
                    "tls.client_ca_file {} holds no PEM certificate",
                    ca_file.display()
                );
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                    .build()
                    .context("tls.client_ca_file")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certs, key)
        .with_context(|| format!("tls.cert_file and tls.key_file ({})", cert_file.display()))?;
    Ok(Arc::new(config))
}
