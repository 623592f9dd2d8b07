//! Listeners and their security: TLS, SASL and ACL settings.
//!
//! One listener is the simple case: `broker.listen` with
//! `broker.security_protocol`. Several are Kafka's three settings, as
//! strings so that environment variables can set them:
//! `broker.listeners = "EXTERNAL://0.0.0.0:9093,INTERNAL://10.0.0.5:9092"`,
//! `broker.advertised_listeners` (same form, host names clients dial) and
//! `broker.listener_security_protocol_map = "EXTERNAL:SASL_SSL,INTERNAL:PLAINTEXT"`.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::{ConfigError, Duration, lenient};

/// Kafka's security protocols.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum SecurityProtocol {
    #[default]
    #[serde(rename = "PLAINTEXT")]
    Plaintext,
    #[serde(rename = "SSL")]
    Ssl,
    #[serde(rename = "SASL_PLAINTEXT")]
    SaslPlaintext,
    #[serde(rename = "SASL_SSL")]
    SaslSsl,
}

impl SecurityProtocol {
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [Self::Plaintext, Self::Ssl, Self::SaslPlaintext, Self::SaslSsl]
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether connections are TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether clients must authenticate with SASL before anything else.
    pub fn sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

/// One Kafka listener, resolved from the settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Its name (`PLAINTEXT`, `SASL_SSL`, … for the single listener, as in
    /// Kafka where the name defaults to the protocol).
    pub name: String,
    pub listen: SocketAddr,
    pub advertised_host: String,
    pub advertised_port: u16,
    pub protocol: SecurityProtocol,
    /// The advertised address was configured and is not the listen address
    /// (a load balancer's or a NAT's in front of this gateway).
    pub advertises_elsewhere: bool,
    /// Connections begin with a PROXY protocol header naming the client
    /// (`broker.proxy_protocol_listeners`).
    pub proxy_protocol: bool,
}

/// TLS for listeners whose protocol is SSL or SASL_SSL.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    /// PEM certificate chain the listeners present (leaf first).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// PEM certificate authorities client certificates must chain to. Set:
    /// mutual TLS, every TLS client must present a certificate, and on SSL
    /// listeners its subject is the principal.
    pub client_ca_file: Option<PathBuf>,
    /// Kafka's `ssl.principal.mapping.rules`: how a certificate's subject
    /// becomes a principal name (`RULE:pattern/replacement/[LU]`, `DEFAULT`).
    #[serde(deserialize_with = "lenient::string")]
    pub principal_mapping_rules: String,
    /// How often the certificate, key and CA files are checked for changes
    /// (they are also reloaded on SIGHUP).
    pub reload_interval: Duration,
}

/// SASL on listeners whose protocol is SASL_PLAINTEXT or SASL_SSL.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SaslSettings {
    /// Enabled mechanisms: SCRAM-SHA-256, SCRAM-SHA-512, PLAIN, OAUTHBEARER.
    #[serde(deserialize_with = "lenient::string_list")]
    pub mechanisms: Vec<String>,
    /// Allow PLAIN on SASL_PLAINTEXT listeners (the password crosses the
    /// network in the clear).
    pub plain_without_tls: bool,
    /// Kafka's `connections.max.reauth.ms`: a session lasts this long, then
    /// the client must re-authenticate (KIP-368) or be disconnected. 0: forever.
    pub connections_max_reauth: Duration,
    /// Delay before answering a failed authentication (Kafka's
    /// `connection.failed.authentication.delay.ms`).
    pub failed_authentication_delay: Duration,
    /// PBKDF2 iterations of credentials `ketch users set` makes.
    pub scram_iterations: u32,
    /// OAUTHBEARER: a JWKS file with the keys tokens are signed with.
    pub oauth_jwks_file: Option<PathBuf>,
    /// OAUTHBEARER: or a PEM public key (RSA or EC).
    pub oauth_public_key_file: Option<PathBuf>,
    /// OAUTHBEARER: the `iss` tokens must carry, if set.
    #[serde(deserialize_with = "lenient::optional_string")]
    pub oauth_issuer: Option<String>,
    /// OAUTHBEARER: an `aud` tokens must carry, if set.
    #[serde(deserialize_with = "lenient::optional_string")]
    pub oauth_audience: Option<String>,
    /// OAUTHBEARER: the claim that names the principal.
    #[serde(deserialize_with = "lenient::string")]
    pub oauth_subject_claim: String,
    /// OAUTHBEARER: clock skew allowed on `exp`, `nbf` and `iat`.
    pub oauth_clock_skew: Duration,
}

/// Authorisation.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AclSettings {
    /// Check every request against the ACLs.
    pub enabled: bool,
    /// Principals allowed everything (`User:admin`, or `admin` for short).
    #[serde(deserialize_with = "lenient::principal_list")]
    pub super_users: Vec<String>,
    /// Allow access to a resource no ACL names (Kafka's
    /// `allow.everyone.if.no.acl.found`).
    pub allow_everyone_if_no_acl_found: bool,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            cert_file: None,
            key_file: None,
            client_ca_file: None,
            principal_mapping_rules: "DEFAULT".to_owned(),
            reload_interval: Duration::from_secs(5),
        }
    }
}

impl Default for SaslSettings {
    fn default() -> Self {
        Self {
            mechanisms: vec![
                "SCRAM-SHA-256".to_owned(),
                "SCRAM-SHA-512".to_owned(),
                "PLAIN".to_owned(),
            ],
            plain_without_tls: false,
            connections_max_reauth: Duration::from_secs(0),
            failed_authentication_delay: Duration::from_millis(100),
            scram_iterations: 8192,
            oauth_jwks_file: None,
            oauth_public_key_file: None,
            oauth_issuer: None,
            oauth_audience: None,
            oauth_subject_claim: "sub".to_owned(),
            oauth_clock_skew: Duration::from_secs(30),
        }
    }
}

/// The SASL mechanisms ketch implements.
pub const MECHANISMS: &[&str] = &["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "OAUTHBEARER"];

impl AclSettings {
    /// Whether `principal` (`User:name`) is a super user.
    pub fn is_super_user(&self, principal: &str) -> bool {
        self.super_users
            .iter()
            .any(|s| normalize_principal(s) == principal)
    }
}

/// `name` as a principal: `User:name` unless it names its type already.
pub fn normalize_principal(name: &str) -> String {
    let name = name.trim();
    if name.contains(':') {
        name.to_owned()
    } else {
        format!("User:{name}")
    }
}

fn value_error(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Value {
        key: key.to_owned(),
        message: message.into(),
    }
}

/// Splits `NAME://host:port` entries.
fn parse_endpoints(key: &str, text: &str) -> Result<Vec<(String, String, u16)>, ConfigError> {
    let mut endpoints: Vec<(String, String, u16)> = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, address) = entry
            .split_once("://")
            .ok_or_else(|| value_error(key, format!("`{entry}` is not NAME://host:port")))?;
        let name = name.trim().to_ascii_uppercase();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(value_error(
                key,
                format!("`{entry}`: a listener name is letters, digits, _ and -"),
            ));
        }
        let (host, port) = address
            .rsplit_once(':')
            .ok_or_else(|| value_error(key, format!("`{entry}` has no port")))?;
        let port: u16 = port
            .parse()
            .map_err(|_| value_error(key, format!("`{entry}` has no valid port")))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        if endpoints.iter().any(|(n, ..)| *n == name) {
            return Err(value_error(key, format!("names listener {name} twice")));
        }
        endpoints.push((name, host, port));
    }
    Ok(endpoints)
}

impl crate::Settings {
    /// The Kafka listeners, in the order configured; the first is the one
    /// other gateways' forwarded requests and load balancers are described by.
    pub fn listeners(&self) -> Result<Vec<Listener>, ConfigError> {
        let mut listeners = self.listeners_as_named()?;
        let named = &self.broker.proxy_protocol_listeners;
        for name in named.iter().filter(|n| n.as_str() != "*") {
            if !listeners.iter().any(|l| l.name.eq_ignore_ascii_case(name)) {
                return Err(value_error(
                    "broker.proxy_protocol_listeners",
                    format!("names {name}, which is not a listener"),
                ));
            }
        }
        for listener in &mut listeners {
            listener.proxy_protocol = named
                .iter()
                .any(|n| n == "*" || listener.name.eq_ignore_ascii_case(n));
        }
        Ok(listeners)
    }

    fn listeners_as_named(&self) -> Result<Vec<Listener>, ConfigError> {
        let broker = &self.broker;
        let Some(text) = broker.listeners.as_deref().filter(|t| !t.trim().is_empty()) else {
            let protocol = broker.security_protocol;
            let host_elsewhere = broker
                .advertised_host
                .as_deref()
                .is_some_and(|host| host != broker.listen.ip().to_string());
            return Ok(vec![Listener {
                name: protocol.name().to_owned(),
                listen: broker.listen,
                advertised_host: self.advertised_host(),
                advertised_port: self.advertised_port(),
                protocol,
                advertises_elsewhere: host_elsewhere || self.advertised_port() != broker.listen.port(),
                proxy_protocol: false,
            }]);
        };
        let listen = parse_endpoints("broker.listeners", text)?;
        let advertised = parse_endpoints(
            "broker.advertised_listeners",
            broker.advertised_listeners.as_deref().unwrap_or(""),
        )?;
        let mut protocols = Vec::new();
        for entry in broker
            .listener_security_protocol_map
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (name, protocol) = entry.split_once(':').ok_or_else(|| {
                value_error(
                    "broker.listener_security_protocol_map",
                    format!("`{entry}` is not NAME:PROTOCOL"),
                )
            })?;
            let protocol = SecurityProtocol::parse(protocol).ok_or_else(|| {
                value_error(
                    "broker.listener_security_protocol_map",
                    format!("`{entry}`: the protocol is PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
                )
            })?;
            protocols.push((name.trim().to_ascii_uppercase(), protocol));
        }
        if let Some((name, ..)) = advertised
            .iter()
            .find(|(name, ..)| !listen.iter().any(|(n, ..)| n == name))
        {
            return Err(value_error(
                "broker.advertised_listeners",
                format!("names {name}, which broker.listeners does not"),
            ));
        }
        let mut listeners = Vec::new();
        for (name, host, port) in listen {
            let ip: std::net::IpAddr = host.parse().map_err(|_| {
                value_error(
                    "broker.listeners",
                    format!("{name}: `{host}` is not an IP address to listen on"),
                )
            })?;
            let listen = SocketAddr::new(ip, port);
            let protocol = match protocols.iter().find(|(n, _)| *n == name) {
                Some((_, p)) => *p,
                // Kafka's default map: a listener named like a protocol has it.
                None => SecurityProtocol::parse(&name).ok_or_else(|| {
                    value_error(
                        "broker.listener_security_protocol_map",
                        format!("has no protocol for listener {name}"),
                    )
                })?,
            };
            let (advertised_host, advertised_port, advertises_elsewhere) =
                match advertised.iter().find(|(n, ..)| *n == name) {
                    Some((_, host, a_port)) => {
                        (host.clone(), *a_port, *host != ip.to_string() || *a_port != port)
                    }
                    None if ip.is_unspecified() => ("127.0.0.1".to_owned(), port, false),
                    None => (ip.to_string(), port, false),
                };
            if listeners
                .iter()
                .any(|l: &Listener| l.listen == listen && port != 0)
            {
                return Err(value_error(
                    "broker.listeners",
                    format!("{name} listens on {listen} twice"),
                ));
            }
            listeners.push(Listener {
                name,
                listen,
                advertised_host,
                advertised_port,
                protocol,
                advertises_elsewhere,
                proxy_protocol: false,
            });
        }
        if listeners.is_empty() {
            return Err(value_error("broker.listeners", "names no listener"));
        }
        Ok(listeners)
    }

    pub(crate) fn validate_security(&self) -> Result<(), ConfigError> {
        let listeners = self.listeners()?;
        let tls = listeners.iter().any(|l| l.protocol.tls());
        let sasl = listeners.iter().any(|l| l.protocol.sasl());
        let readable = |key: &str, path: &Option<PathBuf>| -> Result<(), ConfigError> {
            match path {
                Some(p) if !p.is_file() => Err(value_error(
                    key,
                    format!("{} is not a readable file", p.display()),
                )),
                _ => Ok(()),
            }
        };
        readable("tls.cert_file", &self.tls.cert_file)?;
        readable("tls.key_file", &self.tls.key_file)?;
        readable("tls.client_ca_file", &self.tls.client_ca_file)?;
        readable("sasl.oauth_jwks_file", &self.sasl.oauth_jwks_file)?;
        readable("sasl.oauth_public_key_file", &self.sasl.oauth_public_key_file)?;
        if tls && (self.tls.cert_file.is_none() || self.tls.key_file.is_none()) {
            return Err(value_error(
                "tls.cert_file",
                "a listener uses SSL or SASL_SSL: set tls.cert_file and tls.key_file",
            ));
        }
        if self.http.tls && self.tls.cert_file.is_none() {
            return Err(value_error("http.tls", "needs tls.cert_file and tls.key_file"));
        }
        if self.http.auth && !self.http.tls {
            return Err(value_error(
                "http.auth",
                "needs http.tls: passwords and tokens must not cross the network in the clear",
            ));
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return Err(value_error(
                "tls.key_file",
                "tls.cert_file and tls.key_file go together",
            ));
        }
        if self.tls.reload_interval.get().is_zero() {
            return Err(value_error("tls.reload_interval", "must be above zero"));
        }
        if let Some(m) = self
            .sasl
            .mechanisms
            .iter()
            .find(|m| !MECHANISMS.contains(&m.as_str()))
        {
            return Err(value_error(
                "sasl.mechanisms",
                format!("{m} is not one of {}", MECHANISMS.join(", ")),
            ));
        }
        if sasl && self.sasl.mechanisms.is_empty() {
            return Err(value_error(
                "sasl.mechanisms",
                "a listener uses SASL: enable at least one mechanism",
            ));
        }
        if sasl
            && self.sasl.mechanisms.iter().any(|m| m == "OAUTHBEARER")
            && self.sasl.oauth_jwks_file.is_none()
            && self.sasl.oauth_public_key_file.is_none()
        {
            return Err(value_error(
                "sasl.mechanisms",
                "OAUTHBEARER needs sasl.oauth_jwks_file or sasl.oauth_public_key_file to check tokens with",
            ));
        }
        if !(4096..=16384).contains(&self.sasl.scram_iterations) {
            return Err(value_error(
                "sasl.scram_iterations",
                "must be between 4096 and 16384 (Kafka's bounds)",
            ));
        }
        if self.acl.super_users.iter().any(|u| u.trim().is_empty()) {
            return Err(value_error("acl.super_users", "names an empty principal"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{Loader, SecurityProtocol};

    #[test]
    fn one_listener_is_named_by_its_protocol() {
        let s = Loader::new()
            .set("broker", "listen", "127.0.0.1:9093")
            .set("broker", "security_protocol", "SASL_PLAINTEXT")
            .load()
            .unwrap();
        let listeners = s.listeners().unwrap();
        assert_eq!(listeners.len(), 1);
        assert_eq!(listeners[0].name, "SASL_PLAINTEXT");
        assert_eq!(listeners[0].protocol, SecurityProtocol::SaslPlaintext);
        assert_eq!(
            (
                listeners[0].advertised_host.as_str(),
                listeners[0].advertised_port
            ),
            ("127.0.0.1", 9093)
        );
        assert!(!listeners[0].advertises_elsewhere);
    }

    #[test]
    fn proxy_protocol_listeners_are_named_or_all() {
        let load = |names: &str| {
            Loader::new()
                .set(
                    "broker",
                    "listeners",
                    "EXTERNAL://0.0.0.0:9093,INTERNAL://10.0.0.5:9092",
                )
                .set(
                    "broker",
                    "listener_security_protocol_map",
                    "EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT",
                )
                .set("broker", "proxy_protocol_listeners", names)
                .load()
                .map_err(|e| e.to_string())?
                .listeners()
                .map_err(|e| e.to_string())
        };
        let flags =
            |names: &str| -> Vec<bool> { load(names).unwrap().iter().map(|l| l.proxy_protocol).collect() };
        assert_eq!(flags(""), [false, false]);
        assert_eq!(flags("external"), [true, false]);
        assert_eq!(flags("*"), [true, true]);
        let refused = load("EXTERNAL,PUBLIC").unwrap_err();
        assert!(refused.contains("PUBLIC, which is not a listener"), "{refused}");
    }

    #[test]
    fn named_listeners_take_kafkas_three_settings() {
        let s = Loader::new()
            .set(
                "broker",
                "listeners",
                "EXTERNAL://0.0.0.0:9093, internal://10.0.0.5:9092",
            )
            .set(
                "broker",
                "advertised_listeners",
                "EXTERNAL://kafka.example.com:443",
            )
            .set(
                "broker",
                "listener_security_protocol_map",
                "EXTERNAL:SASL_SSL,INTERNAL:PLAINTEXT",
            )
            .set(
                "tls",
                "cert_file",
                concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
            )
            .set(
                "tls",
                "key_file",
                concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
            )
            .load()
            .unwrap();
        let l = s.listeners().unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(
            (l[0].name.as_str(), l[0].protocol),
            ("EXTERNAL", SecurityProtocol::SaslSsl)
        );
        assert_eq!(
            (l[0].advertised_host.as_str(), l[0].advertised_port),
            ("kafka.example.com", 443)
        );
        assert!(l[0].advertises_elsewhere);
        assert_eq!(
            (l[1].name.as_str(), l[1].protocol),
            ("INTERNAL", SecurityProtocol::Plaintext)
        );
        assert_eq!(
            (l[1].advertised_host.as_str(), l[1].advertised_port),
            ("10.0.0.5", 9092)
        );
        assert!(!l[1].advertises_elsewhere);
        // A listener named like a protocol needs no map entry.
        let s = Loader::new()
            .set(
                "broker",
                "listeners",
                "PLAINTEXT://127.0.0.1:1,SASL_PLAINTEXT://127.0.0.1:2",
            )
            .load()
            .unwrap();
        assert_eq!(
            s.listeners().unwrap()[1].protocol,
            SecurityProtocol::SaslPlaintext
        );
    }

    #[test]
    fn bad_listener_settings_are_refused_with_their_key() {
        let cases = [
            (
                vec![("broker", "listeners", "EXTERNAL://0.0.0.0:9093")],
                "broker.listener_security_protocol_map",
            ),
            (
                vec![("broker", "listeners", "PLAINTEXT://kafka.example.com:9092")],
                "broker.listeners",
            ),
            (
                vec![("broker", "listeners", "PLAINTEXT://0.0.0.0")],
                "broker.listeners",
            ),
            (
                vec![(
                    "broker",
                    "listeners",
                    "PLAINTEXT://0.0.0.0:1,PLAINTEXT://0.0.0.0:2",
                )],
                "broker.listeners",
            ),
            (
                vec![
                    ("broker", "listeners", "PLAINTEXT://0.0.0.0:1"),
                    ("broker", "advertised_listeners", "OTHER://h:1"),
                ],
                "broker.advertised_listeners",
            ),
            (
                vec![
                    ("broker", "listeners", "A://0.0.0.0:1"),
                    ("broker", "listener_security_protocol_map", "A:TLS"),
                ],
                "broker.listener_security_protocol_map",
            ),
            (vec![("broker", "security_protocol", "SSL")], "tls.cert_file"),
            (vec![("sasl", "mechanisms", "GSSAPI")], "sasl.mechanisms"),
            (vec![("sasl", "scram_iterations", "100")], "sasl.scram_iterations"),
            (
                vec![
                    ("broker", "security_protocol", "SASL_PLAINTEXT"),
                    ("sasl", "mechanisms", "OAUTHBEARER"),
                ],
                "sasl.mechanisms",
            ),
            (
                vec![("tls", "cert_file", "/nonexistent/cert.pem")],
                "tls.cert_file",
            ),
        ];
        for (settings, key) in cases {
            let mut loader = Loader::new();
            for (section, k, v) in &settings {
                loader = loader.set(section, k, v);
            }
            let err = loader.load().unwrap_err().to_string();
            assert!(err.contains(key), "{settings:?}: {err}");
        }
    }

    #[test]
    fn lists_are_arrays_or_comma_separated_strings() {
        let s = Loader::new()
            .set("sasl", "mechanisms", "SCRAM-SHA-512, PLAIN")
            .set("acl", "super_users", "admin,User:ops")
            .load()
            .unwrap();
        assert_eq!(s.sasl.mechanisms, ["SCRAM-SHA-512", "PLAIN"]);
        assert!(s.acl.is_super_user("User:admin") && s.acl.is_super_user("User:ops"));
        assert!(!s.acl.is_super_user("User:alice"));
        // Kafka's separator, and a certificate's name whole.
        let s = Loader::new()
            .set("acl", "super_users", "User:CN=admin,OU=ops,O=Ex; User:bob")
            .load()
            .unwrap();
        assert_eq!(s.acl.super_users, ["User:CN=admin,OU=ops,O=Ex", "User:bob"]);
        let s = Loader::new()
            .set("acl", "super_users", "User:CN=admin,OU=ops,O=Ex")
            .load()
            .unwrap();
        assert!(s.acl.is_super_user("User:CN=admin,OU=ops,O=Ex"));
        assert!(!s.acl.is_super_user("User:O=Ex"));
    }
}
