//! Offline validation of OAUTHBEARER tokens: compact JWS (RFC 7515) JWTs
//! (RFC 7519) signed with RS256/384/512 or ES256/384, checked against keys
//! read once from a JWKS file or a PEM public key. Nothing is fetched.
//!
//! The order of checks is deliberate: size, structure and algorithm first
//! (cheap, and `none`/HMAC can never reach a key), then the signature, and
//! only then the claims, so nothing an attacker wrote is trusted before the
//! signature is.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::x509::der;

/// Longest token accepted: what fits in a SASL frame before
/// authentication (Kafka's `sasl.server.max.receive.size`, 512 KiB), which
/// bounds the token there and nothing else. Real ones are a few KiB, but a
/// token with many claims (groups, roles) can pass 16 KiB.
pub const MAX_TOKEN_LEN: usize = 512 * 1024;

/// Longest key file read: a JWKS with dozens of keys is far below this.
const MAX_KEY_FILE_LEN: u64 = 1024 * 1024;

/// Latest `exp`/`nbf`/`iat` accepted (9999-12-31T23:59:59Z), so every date
/// converts to a `SystemTime` and prints.
const MAX_NUMERIC_DATE: f64 = 253_402_300_799.0;

/// RSA moduli aws-lc accepts for PKCS#1 v1.5 verification (2048 to 8192 bits).
const RSA_MODULUS_BYTES: std::ops::RangeInclusive<usize> = 256..=1024;

const OID_RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];

/// Why a configuration or a token was refused. Token errors are meant for the
/// SASL error message and logs; none include the token itself.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum JwtError {
    #[error("no token signing key configured: set a JWKS file or a public key file")]
    NoKeySource,
    #[error("cannot use key file {}: {reason}", path.display())]
    KeyFile { path: PathBuf, reason: String },
    #[error("token is {0} bytes, over the {MAX_TOKEN_LEN}-byte limit")]
    TooLarge(usize),
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    #[error("token algorithm '{0}' is not allowed")]
    AlgorithmNotAllowed(String),
    #[error("unsupported token algorithm '{0}'")]
    UnsupportedAlgorithm(String),
    #[error("token key id '{0}' names no configured key")]
    UnknownKid(String),
    #[error("key '{kid}' does not fit token algorithm {alg}")]
    KeyAlgorithmMismatch { kid: String, alg: &'static str },
    #[error("no configured key fits token algorithm {0}")]
    NoKeyForAlgorithm(&'static str),
    #[error("token signature is invalid")]
    BadSignature,
    #[error("token expired at {0}")]
    Expired(String),
    #[error("token is not valid before {0}")]
    NotYetValid(String),
    #[error("token claim '{claim}' is invalid: {reason}")]
    InvalidClaim {
        claim: &'static str,
        reason: &'static str,
    },
    #[error("token issuer {found:?} is not the expected {expected:?}")]
    WrongIssuer { expected: String, found: String },
    #[error("token audience does not include {0:?}")]
    WrongAudience(String),
    #[error("token names an audience and sasl.oauth_audience is not set")]
    UnexpectedAudience,
    #[error("token subject claim '{0}' is missing or not a non-empty string")]
    MissingSubject(String),
}

/// What [`Validator::new`] needs: where the keys are and what the claims must say.
#[derive(Debug, Clone)]
pub struct ValidatorConfig<'a> {
    /// A JWKS JSON file: {"keys":[{kty,kid,alg?,n,e} | {kty:"EC",crv,x,y}]}.
    pub jwks_file: Option<&'a Path>,
    /// Or a PEM "PUBLIC KEY" (SubjectPublicKeyInfo, RSA or EC P-256/P-384).
    pub public_key_file: Option<&'a Path>,
    pub issuer: Option<&'a str>,
    pub audience: Option<&'a str>,
    /// The claim naming the principal, "sub" unless configured otherwise.
    pub subject_claim: &'a str,
    pub clock_skew: Duration,
}

impl Default for ValidatorConfig<'_> {
    fn default() -> Self {
        Self {
            jwks_file: None,
            public_key_file: None,
            issuer: None,
            audience: None,
            subject_claim: "sub",
            clock_skew: Duration::from_secs(30),
        }
    }
}

/// A validated token's principal, expiry and scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validated {
    pub subject: String,
    pub expires_at: SystemTime,
    /// The `scope` claim: a space-separated string or an array of strings.
    pub scope: Vec<String>,
}

/// Validates tokens against fixed keys and expectations.
#[derive(Debug)]
pub struct Validator {
    keys: Vec<PublicKey>,
    issuer: Option<String>,
    audience: Option<String>,
    subject_claim: String,
    clock_skew: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JwsAlgorithm {
    Rs256,
    Rs384,
    Rs512,
    Es256,
    Es384,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Curve {
    P256,
    P384,
}

#[derive(Debug)]
enum KeyMaterial {
    /// Modulus and exponent, big-endian without leading zeros.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// The uncompressed point (0x04 || x || y).
    Ec { curve: Curve, point: Vec<u8> },
}

#[derive(Debug)]
struct PublicKey {
    kid: Option<String>,
    /// The JWK's `alg`, when it restricts the key to one algorithm.
    alg: Option<JwsAlgorithm>,
    material: KeyMaterial,
}

impl JwsAlgorithm {
    /// Our algorithm for a header's `alg`; `none` and the HMAC family are
    /// refused by name, since accepting them is the classic JWT forgery.
    fn from_name(name: &str) -> Result<Self, JwtError> {
        match name {
            "RS256" => Ok(Self::Rs256),
            "RS384" => Ok(Self::Rs384),
            "RS512" => Ok(Self::Rs512),
            "ES256" => Ok(Self::Es256),
            "ES384" => Ok(Self::Es384),
            name if name.eq_ignore_ascii_case("none") || name.starts_with("HS") => {
                Err(JwtError::AlgorithmNotAllowed(printable(name)))
            }
            name => Err(JwtError::UnsupportedAlgorithm(printable(name))),
        }
    }

    /// The curve of an ECDSA algorithm; `None` for the RSA ones.
    fn curve(self) -> Option<Curve> {
        match self {
            Self::Rs256 | Self::Rs384 | Self::Rs512 => None,
            Self::Es256 => Some(Curve::P256),
            Self::Es384 => Some(Curve::P384),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Rs256 => "RS256",
            Self::Rs384 => "RS384",
            Self::Rs512 => "RS512",
            Self::Es256 => "ES256",
            Self::Es384 => "ES384",
        }
    }
}

impl PublicKey {
    /// Whether this key may verify `alg`: the right key type and curve, and
    /// the JWK's own `alg` (if any) agreeing.
    fn fits(&self, alg: JwsAlgorithm) -> bool {
        let kind_fits = match &self.material {
            KeyMaterial::Rsa { .. } => alg.curve().is_none(),
            KeyMaterial::Ec { curve, .. } => alg.curve() == Some(*curve),
        };
        kind_fits && self.alg.is_none_or(|own| own == alg)
    }

    fn verifies(&self, alg: JwsAlgorithm, message: &[u8], signature: &[u8]) -> bool {
        match &self.material {
            KeyMaterial::Rsa { n, e } => {
                let params = match alg {
                    JwsAlgorithm::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    JwsAlgorithm::Rs384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    JwsAlgorithm::Rs512 => &signature::RSA_PKCS1_2048_8192_SHA512,
                    _ => return false,
                };
                RsaPublicKeyComponents { n, e }
                    .verify(params, message, signature)
                    .is_ok()
            }
            KeyMaterial::Ec { curve, point } => UnparsedPublicKey::new(ec_algorithm(*curve), point)
                .verify(message, signature)
                .is_ok(),
        }
    }
}

/// JOSE ECDSA signatures are the fixed-width r || s, not DER.
fn ec_algorithm(curve: Curve) -> &'static signature::EcdsaVerificationAlgorithm {
    match curve {
        Curve::P256 => &signature::ECDSA_P256_SHA256_FIXED,
        Curve::P384 => &signature::ECDSA_P384_SHA384_FIXED,
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    /// Critical extensions we would have to understand; we understand
    /// none. Skipped, not built: a header of up to a whole token must not
    /// become a large tree before the signature is checked.
    crit: Option<serde::de::IgnoredAny>,
}

impl Validator {
    /// Loads the keys (at least one required; errors name the file) and the expectations.
    pub fn new(config: &ValidatorConfig) -> Result<Self, JwtError> {
        if config.jwks_file.is_none() && config.public_key_file.is_none() {
            return Err(JwtError::NoKeySource);
        }
        let mut keys = Vec::new();
        if let Some(path) = config.jwks_file {
            keys.extend(load_jwks(path)?);
        }
        if let Some(path) = config.public_key_file {
            keys.push(load_pem(path)?);
        }
        Ok(Self {
            keys,
            issuer: config.issuer.map(str::to_owned),
            audience: config.audience.map(str::to_owned),
            subject_claim: config.subject_claim.to_owned(),
            clock_skew: config.clock_skew,
        })
    }

    /// Validates a compact JWS; returns the principal name (the subject claim) and expiry.
    pub fn validate(&self, token: &str, now: SystemTime) -> Result<Validated, JwtError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(JwtError::TooLarge(token.len()));
        }
        let (signing_input, signature_b64) = token
            .rsplit_once('.')
            .ok_or(JwtError::Malformed("not three dot-separated parts"))?;
        let (header_b64, payload_b64) = signing_input
            .split_once('.')
            .ok_or(JwtError::Malformed("not three dot-separated parts"))?;
        if payload_b64.contains('.') {
            return Err(JwtError::Malformed("not three dot-separated parts"));
        }
        let header: Header = decode_json(header_b64, "header")?;
        let alg = JwsAlgorithm::from_name(&header.alg)?;
        if header.crit.is_some() {
            return Err(JwtError::Malformed(
                "critical header extensions are not supported",
            ));
        }
        let signature = decode_base64url(signature_b64, "signature")?;
        self.verify_signature(alg, header.kid.as_deref(), signing_input.as_bytes(), &signature)?;
        let claims: Map<String, Value> = decode_json(payload_b64, "payload")?;
        self.check_claims(&claims, now)
    }

    fn verify_signature(
        &self,
        alg: JwsAlgorithm,
        kid: Option<&str>,
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), JwtError> {
        let candidates = self.candidate_keys(alg, kid)?;
        if candidates.iter().any(|key| key.verifies(alg, message, signature)) {
            Ok(())
        } else {
            Err(JwtError::BadSignature)
        }
    }

    /// The keys to try. A `kid` must name a configured key that fits the
    /// algorithm; keys without a kid (a PEM key, say) stand in for any kid,
    /// since identity providers set a kid whether or not we know it.
    fn candidate_keys(&self, alg: JwsAlgorithm, kid: Option<&str>) -> Result<Vec<&PublicKey>, JwtError> {
        let fitting = |key: &&PublicKey| key.fits(alg);
        let Some(kid) = kid else {
            let keys: Vec<_> = self.keys.iter().filter(fitting).collect();
            return if keys.is_empty() {
                Err(JwtError::NoKeyForAlgorithm(alg.name()))
            } else {
                Ok(keys)
            };
        };
        let named: Vec<_> = self
            .keys
            .iter()
            .filter(|key| key.kid.as_deref() == Some(kid))
            .collect();
        if !named.is_empty() {
            let keys: Vec<_> = named.into_iter().filter(fitting).collect();
            if keys.is_empty() {
                return Err(JwtError::KeyAlgorithmMismatch {
                    kid: printable(kid),
                    alg: alg.name(),
                });
            }
            return Ok(keys);
        }
        let anonymous: Vec<_> = self
            .keys
            .iter()
            .filter(|key| key.kid.is_none())
            .filter(fitting)
            .collect();
        if anonymous.is_empty() {
            Err(JwtError::UnknownKid(printable(kid)))
        } else {
            Ok(anonymous)
        }
    }

    fn check_claims(&self, claims: &Map<String, Value>, now: SystemTime) -> Result<Validated, JwtError> {
        let expires_at = numeric_date(claims, "exp")?.ok_or(JwtError::InvalidClaim {
            claim: "exp",
            reason: "missing",
        })?;
        if now >= expires_at.checked_add(self.clock_skew).unwrap_or(expires_at) {
            return Err(JwtError::Expired(crate::time::utc(expires_at)));
        }
        let skewed_now = now.checked_add(self.clock_skew).unwrap_or(now);
        if let Some(not_before) = numeric_date(claims, "nbf")?
            && skewed_now < not_before
        {
            return Err(JwtError::NotYetValid(crate::time::utc(not_before)));
        }
        // Required, as Kafka's validator requires it; a time ahead of this
        // gateway's clock is taken (Kafka sets no limit on it: a token from
        // an identity provider whose clock runs ahead, without `nbf`, is
        // valid there).
        let issued_at = numeric_date(claims, "iat")?.ok_or(JwtError::InvalidClaim {
            claim: "iat",
            reason: "missing",
        })?;
        // But a token that expires before it was issued, or before it is
        // valid, is refused, as Kafka's validator (jose4j) refuses it.
        if expires_at < issued_at {
            return Err(JwtError::InvalidClaim {
                claim: "exp",
                reason: "before iat",
            });
        }
        if numeric_date(claims, "nbf")?.is_some_and(|not_before| expires_at < not_before) {
            return Err(JwtError::InvalidClaim {
                claim: "exp",
                reason: "before nbf",
            });
        }
        self.check_issuer(claims)?;
        self.check_audience(claims)?;
        // Trimmed, as Kafka takes it: `" alice"` is alice, a blank one none.
        let subject = match claims.get(&self.subject_claim) {
            Some(Value::String(subject)) if !subject.trim().is_empty() => subject.trim().to_owned(),
            _ => return Err(JwtError::MissingSubject(self.subject_claim.clone())),
        };
        Ok(Validated {
            subject,
            expires_at,
            scope: scopes(claims)?,
        })
    }

    fn check_issuer(&self, claims: &Map<String, Value>) -> Result<(), JwtError> {
        let Some(expected) = &self.issuer else {
            return Ok(());
        };
        match claims.get("iss") {
            Some(Value::String(found)) if found == expected => Ok(()),
            found => Err(JwtError::WrongIssuer {
                expected: expected.clone(),
                found: found.and_then(Value::as_str).map_or_else(String::new, printable),
            }),
        }
    }

    /// `aud` is a string or an array of strings (RFC 7519 §4.1.3).
    /// With no audience configured, a token that names one is refused, as
    /// Kafka's validator (jose4j's default) refuses it: a token minted for
    /// another service of the same identity provider does not authenticate.
    fn check_audience(&self, claims: &Map<String, Value>) -> Result<(), JwtError> {
        let Some(expected) = &self.audience else {
            return match claims.get("aud") {
                None | Some(Value::Null) => Ok(()),
                Some(_) => Err(JwtError::UnexpectedAudience),
            };
        };
        let found = match claims.get("aud") {
            Some(Value::String(aud)) => aud == expected,
            Some(Value::Array(auds)) => auds.iter().any(|aud| aud.as_str() == Some(expected)),
            _ => false,
        };
        if found {
            Ok(())
        } else {
            Err(JwtError::WrongAudience(expected.clone()))
        }
    }
}

/// A NumericDate claim (seconds since the epoch, possibly fractional), if present.
fn numeric_date(claims: &Map<String, Value>, claim: &'static str) -> Result<Option<SystemTime>, JwtError> {
    let Some(value) = claims.get(claim) else {
        return Ok(None);
    };
    let seconds = value.as_f64().ok_or(JwtError::InvalidClaim {
        claim,
        reason: "not a number",
    })?;
    if !(0.0..=MAX_NUMERIC_DATE).contains(&seconds) {
        return Err(JwtError::InvalidClaim {
            claim,
            reason: "out of range",
        });
    }
    Ok(Some(UNIX_EPOCH + Duration::from_secs_f64(seconds)))
}

/// The `scope` claim: a string of scopes or an array of them; as Kafka's
/// validator takes it, anything else (`null`, a number, an object) is no
/// scope, and only an array holding a non-string is refused.
fn scopes(claims: &Map<String, Value>) -> Result<Vec<String>, JwtError> {
    let invalid = JwtError::InvalidClaim {
        claim: "scope",
        reason: "an array holding something other than strings",
    };
    match claims.get("scope") {
        Some(Value::String(scope)) => Ok(scope.split_whitespace().map(str::to_owned).collect()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned).ok_or_else(|| invalid.clone()))
            .collect(),
        _ => Ok(Vec::new()),
    }
}

fn decode_base64url(text: &str, part: &'static str) -> Result<Vec<u8>, JwtError> {
    URL_SAFE_NO_PAD
        .decode(text.as_bytes())
        .map_err(|_| JwtError::Malformed(invalid_base64(part)))
}

fn invalid_base64(part: &'static str) -> &'static str {
    match part {
        "header" => "header is not base64url",
        "payload" => "payload is not base64url",
        _ => "signature is not base64url",
    }
}

/// A base64url JSON object from the token (the header or the claims).
fn decode_json<T: serde::de::DeserializeOwned>(text: &str, part: &'static str) -> Result<T, JwtError> {
    let bytes = decode_base64url(text, part)?;
    serde_json::from_slice(&bytes).map_err(|_| {
        JwtError::Malformed(if part == "header" {
            "header is not a valid JSON header"
        } else {
            "payload is not a JSON object"
        })
    })
}

/// An attacker-chosen string made safe for an error message: short, printable.
fn printable(text: &str) -> String {
    text.chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Reads a key file, refusing anything implausibly large.
fn read_key_file(path: &Path) -> Result<Vec<u8>, JwtError> {
    let file_error = |reason: String| JwtError::KeyFile {
        path: path.to_owned(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| file_error(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| file_error(e.to_string()))?;
    if bytes.len() as u64 > MAX_KEY_FILE_LEN {
        return Err(file_error(format!("larger than {MAX_KEY_FILE_LEN} bytes")));
    }
    Ok(bytes)
}

#[derive(Deserialize)]
struct Jwks {
    keys: Vec<Jwk>,
}

#[derive(Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    usage: Option<String>,
    n: Option<String>,
    e: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

/// The signature keys of a JWKS. Keys for encryption, of other types (oct,
/// OKP) or for other algorithms are skipped, as a provider's JWKS often has
/// some; a malformed RSA or EC key is an error, and so is a file with no usable key.
fn load_jwks(path: &Path) -> Result<Vec<PublicKey>, JwtError> {
    let file_error = |reason: String| JwtError::KeyFile {
        path: path.to_owned(),
        reason,
    };
    let jwks: Jwks = serde_json::from_slice(&read_key_file(path)?)
        .map_err(|e| file_error(format!("not a JWKS document: {e}")))?;
    let mut keys = Vec::new();
    for (index, jwk) in jwks.keys.iter().enumerate() {
        let key = jwk_to_key(jwk).map_err(|reason| {
            let name = jwk
                .kid
                .as_deref()
                .map_or_else(|| format!("key #{index}"), |kid| format!("key '{kid}'"));
            file_error(format!("{name}: {reason}"))
        })?;
        keys.extend(key);
    }
    if keys.is_empty() {
        return Err(file_error("no RSA or EC signature key".into()));
    }
    Ok(keys)
}

fn jwk_to_key(jwk: &Jwk) -> Result<Option<PublicKey>, String> {
    if jwk.usage.as_deref().is_some_and(|usage| usage != "sig") {
        return Ok(None);
    }
    let alg = match jwk.alg.as_deref().map(JwsAlgorithm::from_name) {
        None => None,
        Some(Ok(alg)) => Some(alg),
        Some(Err(_)) => return Ok(None),
    };
    let material = match jwk.kty.as_str() {
        "RSA" => {
            let n = jwk_field(&jwk.n, "n")?;
            let e = jwk_field(&jwk.e, "e")?;
            rsa_material(&n, &e)?
        }
        "EC" => {
            let curve = match jwk.crv.as_deref() {
                Some("P-256") => Curve::P256,
                Some("P-384") => Curve::P384,
                _ => return Ok(None),
            };
            let mut point = vec![0x04];
            point.extend(jwk_field(&jwk.x, "x")?);
            point.extend(jwk_field(&jwk.y, "y")?);
            ec_material(curve, point)?
        }
        _ => return Ok(None),
    };
    let key = PublicKey {
        kid: jwk.kid.clone(),
        alg,
        material,
    };
    if alg.is_some_and(|alg| !key.fits(alg)) {
        return Err(format!("its alg does not fit its kty {}", jwk.kty));
    }
    Ok(Some(key))
}

fn jwk_field(value: &Option<String>, name: &str) -> Result<Vec<u8>, String> {
    let text = value.as_deref().ok_or_else(|| format!("missing '{name}'"))?;
    URL_SAFE_NO_PAD
        .decode(text.as_bytes())
        .map_err(|_| format!("'{name}' is not base64url"))
}

fn rsa_material(n: &[u8], e: &[u8]) -> Result<KeyMaterial, String> {
    let n = strip_leading_zeros(n);
    let e = strip_leading_zeros(e);
    if !RSA_MODULUS_BYTES.contains(&n.len()) {
        return Err(format!(
            "RSA modulus of {} bits; 2048 to 8192 are supported",
            n.len() * 8
        ));
    }
    if e.is_empty() || e.len() > 8 {
        return Err("bad RSA exponent".into());
    }
    Ok(KeyMaterial::Rsa {
        n: n.to_vec(),
        e: e.to_vec(),
    })
}

/// Checks the point is on the curve now, so a bad key fails at startup, not per token.
fn ec_material(curve: Curve, point: Vec<u8>) -> Result<KeyMaterial, String> {
    UnparsedPublicKey::new(ec_algorithm(curve), &point)
        .parse()
        .map_err(|_| "invalid EC public key".to_owned())?;
    Ok(KeyMaterial::Ec { curve, point })
}

fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    &bytes[start..]
}

fn load_pem(path: &Path) -> Result<PublicKey, JwtError> {
    use rustls_pki_types::SubjectPublicKeyInfoDer;
    use rustls_pki_types::pem::PemObject as _;
    let file_error = |reason: String| JwtError::KeyFile {
        path: path.to_owned(),
        reason,
    };
    let der = SubjectPublicKeyInfoDer::from_pem_slice(&read_key_file(path)?)
        .map_err(|e| file_error(format!("no PEM PUBLIC KEY: {e}")))?;
    let material = parse_spki(der.as_ref()).map_err(file_error)?;
    Ok(PublicKey {
        kid: None,
        alg: None,
        material,
    })
}

/// SubjectPublicKeyInfo: `SEQUENCE { SEQUENCE { algorithm OID, parameters }, BIT STRING key }`.
fn parse_spki(spki: &[u8]) -> Result<KeyMaterial, String> {
    let der_error = |e: der::DerError| format!("malformed SubjectPublicKeyInfo: {e}");
    let mut reader = der::Reader::new(der::single(spki, der::SEQUENCE).map_err(der_error)?);
    let mut algorithm = der::Reader::new(reader.expect(der::SEQUENCE).map_err(der_error)?);
    let key = bit_string_bytes(reader.expect(der::BIT_STRING).map_err(der_error)?)?;
    reader.finish().map_err(der_error)?;
    let oid = algorithm.expect(der::OID).map_err(der_error)?;
    if oid == OID_RSA_ENCRYPTION {
        let mut rsa_key = der::Reader::new(der::single(key, der::SEQUENCE).map_err(der_error)?);
        let n = rsa_key.expect(der::INTEGER).map_err(der_error)?;
        let e = rsa_key.expect(der::INTEGER).map_err(der_error)?;
        rsa_key.finish().map_err(der_error)?;
        rsa_material(n, e)
    } else if oid == OID_EC_PUBLIC_KEY {
        let curve = match algorithm.expect(der::OID).map_err(der_error)? {
            OID_P256 => Curve::P256,
            OID_P384 => Curve::P384,
            _ => return Err("EC curve other than P-256 or P-384".into()),
        };
        ec_material(curve, key.to_vec())
    } else {
        Err("key type other than RSA or EC".into())
    }
}

/// A BIT STRING's bytes; keys are whole bytes, so no unused bits.
fn bit_string_bytes(contents: &[u8]) -> Result<&[u8], String> {
    match contents.split_first() {
        Some((0, bytes)) => Ok(bytes),
        _ => Err("public key BIT STRING has unused bits".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::encoding::AsDer as _;
    use aws_lc_rs::rand::SystemRandom;
    use aws_lc_rs::rsa::KeySize;
    use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair as _, RsaKeyPair};
    use base64::engine::general_purpose::STANDARD;
    use serde_json::json;

    const NOW: u64 = 1_700_000_000;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(NOW)
    }

    /// A file in a fresh temporary directory, removed when dropped.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, contents: &[u8]) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "ketch-jwt-{}-{}",
                std::process::id(),
                rand::random::<u64>()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(name);
            std::fs::write(&path, contents).unwrap();
            Self(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn pem(der: &[u8]) -> Vec<u8> {
        let body = STANDARD.encode(der);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|l| std::str::from_utf8(l).unwrap())
            .collect();
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            lines.join("\n")
        )
        .into_bytes()
    }

    fn claims() -> Value {
        json!({"sub": "alice", "exp": NOW + 600, "iat": NOW - 10, "iss": "https://idp", "aud": ["kafka", "other"],
               "scope": "produce consume"})
    }

    /// A token with `header` and `claims`, signed by `sign`.
    fn token(header: &Value, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = sign(input.as_bytes());
        format!("{input}.{}", b64(&signature))
    }

    struct EcKey(EcdsaKeyPair);

    impl EcKey {
        fn p256() -> Self {
            Self(EcdsaKeyPair::generate(&signature::ECDSA_P256_SHA256_FIXED_SIGNING).unwrap())
        }

        fn sign(&self, input: &[u8]) -> Vec<u8> {
            self.0
                .sign(&SystemRandom::new(), input)
                .unwrap()
                .as_ref()
                .to_vec()
        }

        fn jwk(&self, kid: &str, crv: &str) -> Value {
            let point = self.0.public_key().as_ref();
            let half = (point.len() - 1) / 2;
            json!({"kty": "EC", "kid": kid, "crv": crv, "x": b64(&point[1..1 + half]), "y": b64(&point[1 + half..])})
        }

        fn token(&self, kid: Option<&str>, claims: &Value) -> String {
            let mut header = json!({"alg": "ES256", "typ": "JWT"});
            if let Some(kid) = kid {
                header["kid"] = json!(kid);
            }
            token(&header, claims, |input| self.sign(input))
        }
    }

    fn config<'a>(jwks: Option<&'a Path>, pem: Option<&'a Path>) -> ValidatorConfig<'a> {
        ValidatorConfig {
            jwks_file: jwks,
            public_key_file: pem,
            issuer: Some("https://idp"),
            audience: Some("kafka"),
            ..ValidatorConfig::default()
        }
    }

    fn jwks_file(keys: &[Value]) -> TempFile {
        TempFile::new("jwks.json", json!({ "keys": keys }).to_string().as_bytes())
    }

    fn es256_setup() -> (EcKey, TempFile, Validator) {
        let key = EcKey::p256();
        let file = jwks_file(&[json!({"kty": "oct", "k": "c2VjcmV0"}), key.jwk("k1", "P-256")]);
        let validator = Validator::new(&config(Some(&file.0), None)).unwrap();
        (key, file, validator)
    }

    #[test]
    fn es256_via_jwks() {
        let (key, _file, validator) = es256_setup();
        let validated = validator
            .validate(&key.token(Some("k1"), &claims()), now())
            .unwrap();
        assert_eq!(validated.subject, "alice");
        assert_eq!(validated.expires_at, UNIX_EPOCH + Duration::from_secs(NOW + 600));
        assert_eq!(validated.scope, vec!["produce", "consume"]);
        // Without a kid, every key that fits the algorithm is tried.
        assert!(validator.validate(&key.token(None, &claims()), now()).is_ok());
    }

    /// A token with many claims is accepted up to what a SASL frame holds
    /// (Kafka sets no other bound).
    #[test]
    fn a_large_token_is_accepted() {
        let (key, _file, validator) = es256_setup();
        let mut claims = claims();
        claims["groups"] = json!((0..2_000).map(|i| format!("group-{i:05}")).collect::<Vec<_>>());
        let token = key.token(Some("k1"), &claims);
        assert!(token.len() > 32 * 1024, "{}", token.len());
        assert_eq!(validator.validate(&token, now()).unwrap().subject, "alice");
    }

    #[test]
    fn es256_via_pem_public_key() {
        let key = EcKey::p256();
        let spki = key.0.public_key().as_der().unwrap();
        let file = TempFile::new("key.pem", &pem(spki.as_ref()));
        let validator = Validator::new(&config(None, Some(&file.0))).unwrap();
        let KeyMaterial::Ec { curve, point } = &validator.keys[0].material else {
            panic!("not EC")
        };
        assert_eq!(
            (*curve, point.as_slice()),
            (Curve::P256, key.0.public_key().as_ref())
        );
        assert!(validator.validate(&key.token(None, &claims()), now()).is_ok());
        // A PEM key has no kid, so it serves tokens that carry one.
        assert!(
            validator
                .validate(&key.token(Some("rotating-kid"), &claims()), now())
                .is_ok()
        );
    }

    #[test]
    fn es384_via_pem_public_key() {
        let pair = EcdsaKeyPair::generate(&signature::ECDSA_P384_SHA384_FIXED_SIGNING).unwrap();
        let file = TempFile::new("key.pem", &pem(pair.public_key().as_der().unwrap().as_ref()));
        let validator = Validator::new(&config(None, Some(&file.0))).unwrap();
        let signed = token(&json!({"alg": "ES384"}), &claims(), |i| {
            pair.sign(&SystemRandom::new(), i).unwrap().as_ref().to_vec()
        });
        assert_eq!(validator.validate(&signed, now()).unwrap().subject, "alice");
        let as_es256 = format!(
            "{}.{}",
            b64(br#"{"alg":"ES256"}"#),
            signed.split_once('.').unwrap().1
        );
        assert_eq!(
            validator.validate(&as_es256, now()),
            Err(JwtError::NoKeyForAlgorithm("ES256"))
        );
    }

    #[test]
    fn rs256_via_jwks_and_pem() {
        let pair = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
        // The public key's bytes are a PKCS#1 RSAPublicKey: SEQUENCE { n, e }.
        let mut pkcs1 = der::Reader::new(der::single(pair.public_key().as_ref(), der::SEQUENCE).unwrap());
        let (n, e) = (
            pkcs1.expect(der::INTEGER).unwrap(),
            pkcs1.expect(der::INTEGER).unwrap(),
        );
        let jwk = json!({"kty": "RSA", "kid": "r1", "alg": "RS256", "use": "sig", "n": b64(n), "e": b64(e)});
        let jwks = jwks_file(&[jwk]);
        let pem_file = TempFile::new("rsa.pem", &pem(pair.public_key().as_der().unwrap().as_ref()));
        let pair = &pair;
        let sign = |alg: &'static signature::RsaSignatureEncoding| {
            move |input: &[u8]| {
                let mut out = vec![0; pair.public_modulus_len()];
                pair.sign(alg, &SystemRandom::new(), input, &mut out).unwrap();
                out
            }
        };
        let rs256 = token(
            &json!({"alg": "RS256", "kid": "r1"}),
            &claims(),
            sign(&signature::RSA_PKCS1_SHA256),
        );
        let from_jwks = Validator::new(&config(Some(&jwks.0), None)).unwrap();
        assert_eq!(from_jwks.validate(&rs256, now()).unwrap().subject, "alice");
        // The JWK says RS256 only.
        let rs512 = token(
            &json!({"alg": "RS512", "kid": "r1"}),
            &claims(),
            sign(&signature::RSA_PKCS1_SHA512),
        );
        assert!(matches!(
            from_jwks.validate(&rs512, now()),
            Err(JwtError::KeyAlgorithmMismatch { .. })
        ));
        let from_pem = Validator::new(&config(None, Some(&pem_file.0))).unwrap();
        assert!(from_pem.validate(&rs256, now()).is_ok());
        assert!(from_pem.validate(&rs512, now()).is_ok());
        let rs384 = token(
            &json!({"alg": "RS384"}),
            &claims(),
            sign(&signature::RSA_PKCS1_SHA256),
        );
        assert_eq!(from_pem.validate(&rs384, now()), Err(JwtError::BadSignature));
    }

    #[test]
    fn time_claims_with_skew() {
        let (key, _file, validator) = es256_setup();
        let at = |exp: u64| {
            let mut claims = claims();
            claims["exp"] = json!(exp);
            claims["iat"] = json!(NOW - 60);
            key.token(Some("k1"), &claims)
        };
        assert!(validator.validate(&at(NOW - 29), now()).is_ok()); // within the 30 s skew
        assert_eq!(
            validator.validate(&at(NOW - 30), now()),
            Err(JwtError::Expired("2023-11-14T22:12:50Z".into()))
        );
        let mut future = claims();
        future["nbf"] = json!(NOW + 31);
        assert!(matches!(
            validator.validate(&key.token(None, &future), now()),
            Err(JwtError::NotYetValid(_))
        ));
        future["nbf"] = json!(NOW + 30);
        assert!(validator.validate(&key.token(None, &future), now()).is_ok());
        // An `iat` ahead of the clock is taken, as Kafka's validator takes
        // it (a `scope` of null is no scope); one after `exp` is not.
        let mut issued = claims();
        issued["iat"] = json!(NOW + 300);
        issued["scope"] = json!(null);
        let validated = validator
            .validate(&key.token(None, &issued), now())
            .expect("valid");
        assert!(validated.scope.is_empty());
        issued["iat"] = json!(NOW + 3600);
        assert_eq!(
            validator.validate(&key.token(None, &issued), now()),
            Err(JwtError::InvalidClaim {
                claim: "exp",
                reason: "before iat"
            })
        );
        let mut no_exp = claims();
        no_exp.as_object_mut().unwrap().remove("exp");
        assert_eq!(
            validator.validate(&key.token(None, &no_exp), now()),
            Err(JwtError::InvalidClaim {
                claim: "exp",
                reason: "missing"
            })
        );
        no_exp["exp"] = json!("soon");
        assert!(matches!(
            validator.validate(&key.token(None, &no_exp), now()),
            Err(JwtError::InvalidClaim { .. })
        ));
        no_exp["exp"] = json!(1e300);
        assert!(matches!(
            validator.validate(&key.token(None, &no_exp), now()),
            Err(JwtError::InvalidClaim { .. })
        ));
        // iat is required, as Kafka's validator requires it.
        let mut no_iat = claims();
        no_iat.as_object_mut().unwrap().remove("iat");
        assert_eq!(
            validator.validate(&key.token(None, &no_iat), now()),
            Err(JwtError::InvalidClaim {
                claim: "iat",
                reason: "missing"
            })
        );
    }

    #[test]
    fn issuer_audience_and_subject() {
        let (key, _file, validator) = es256_setup();
        let with = |name: &str, value: Value| {
            let mut claims = claims();
            claims[name] = value;
            validator.validate(&key.token(Some("k1"), &claims), now())
        };
        assert_eq!(
            with("aud", json!("other")),
            Err(JwtError::WrongAudience("kafka".into()))
        );
        assert!(with("aud", json!("kafka")).is_ok());
        assert!(matches!(
            with("iss", json!("https://evil")),
            Err(JwtError::WrongIssuer { .. })
        ));
        assert_eq!(
            with("sub", json!("")),
            Err(JwtError::MissingSubject("sub".into()))
        );
        assert_eq!(
            with("sub", json!(42)),
            Err(JwtError::MissingSubject("sub".into()))
        );
        // Trimmed, as Kafka takes it.
        assert_eq!(
            with("sub", json!("   ")),
            Err(JwtError::MissingSubject("sub".into()))
        );
        assert_eq!(with("sub", json!(" alice ")).unwrap().subject, "alice");
        // No audience configured: a token that names one is refused.
        let anywhere = Validator::new(&ValidatorConfig {
            audience: None,
            ..config(Some(&_file.0), None)
        })
        .unwrap();
        assert_eq!(
            anywhere.validate(&key.token(Some("k1"), &claims()), now()),
            Err(JwtError::UnexpectedAudience)
        );
        let mut unnamed = claims();
        unnamed.as_object_mut().unwrap().remove("aud");
        assert!(anywhere.validate(&key.token(Some("k1"), &unnamed), now()).is_ok());
        assert_eq!(with("scope", json!(["a", "b"])).unwrap().scope, vec!["a", "b"]);
        // As Kafka: a scope that is neither is none; an array must hold
        // strings only.
        assert!(with("scope", json!(7)).unwrap().scope.is_empty());
        assert!(matches!(
            with("scope", json!(["a", 7])),
            Err(JwtError::InvalidClaim { claim: "scope", .. })
        ));

        let custom = ValidatorConfig {
            subject_claim: "client_id",
            ..config(Some(&_file.0), None)
        };
        let validator = Validator::new(&custom).unwrap();
        let mut claims = claims();
        claims["client_id"] = json!("svc-1");
        assert_eq!(
            validator
                .validate(&key.token(None, &claims), now())
                .unwrap()
                .subject,
            "svc-1"
        );
    }

    #[test]
    fn forged_and_malformed_tokens() {
        let (key, _file, validator) = es256_setup();
        let good = key.token(Some("k1"), &claims());
        let (header, rest) = good.split_once('.').unwrap();
        let (_, signature) = rest.split_once('.').unwrap();
        let mut admin = claims();
        admin["sub"] = json!("admin");
        let tampered = format!("{header}.{}.{signature}", b64(admin.to_string().as_bytes()));
        assert_eq!(validator.validate(&tampered, now()), Err(JwtError::BadSignature));

        let unsigned = format!(
            "{}.{}.",
            b64(br#"{"alg":"none"}"#),
            b64(admin.to_string().as_bytes())
        );
        assert_eq!(
            validator.validate(&unsigned, now()),
            Err(JwtError::AlgorithmNotAllowed("none".into()))
        );
        let hmac = token(&json!({"alg": "HS256"}), &admin, |_| vec![1; 32]);
        assert_eq!(
            validator.validate(&hmac, now()),
            Err(JwtError::AlgorithmNotAllowed("HS256".into()))
        );
        let ps256 = token(&json!({"alg": "PS256"}), &admin, |_| vec![1; 32]);
        assert_eq!(
            validator.validate(&ps256, now()),
            Err(JwtError::UnsupportedAlgorithm("PS256".into()))
        );
        assert_eq!(
            validator.validate(&key.token(Some("k2"), &claims()), now()),
            Err(JwtError::UnknownKid("k2".into()))
        );
        let rs_kid = token(&json!({"alg": "RS256", "kid": "k1"}), &claims(), |_| vec![1; 256]);
        assert!(matches!(
            validator.validate(&rs_kid, now()),
            Err(JwtError::KeyAlgorithmMismatch { .. })
        ));
        let crit = token(&json!({"alg": "ES256", "crit": ["exp"]}), &claims(), |i| {
            key.sign(i)
        });
        assert!(matches!(
            validator.validate(&crit, now()),
            Err(JwtError::Malformed(_))
        ));

        let padded = format!("{good}=");
        for bad in ["", ".", "..", "a.b", "a.b.c.d", &padded, "!!.!!.!!"] {
            assert!(
                matches!(validator.validate(bad, now()), Err(JwtError::Malformed(_))),
                "{bad:?}"
            );
        }
        let huge = "a".repeat(MAX_TOKEN_LEN + 1);
        assert_eq!(
            validator.validate(&huge, now()),
            Err(JwtError::TooLarge(MAX_TOKEN_LEN + 1))
        );
        for end in 0..good.len() {
            assert!(
                validator.validate(&good[..end], now()).is_err(),
                "prefix of {end}"
            );
        }
    }

    #[test]
    fn configuration_errors_name_the_file() {
        assert!(matches!(
            Validator::new(&ValidatorConfig::default()),
            Err(JwtError::NoKeySource)
        ));
        let missing = Path::new("/nonexistent/ketch/jwks.json");
        let error = Validator::new(&config(Some(missing), None)).unwrap_err();
        assert!(
            error.to_string().contains("/nonexistent/ketch/jwks.json"),
            "{error}"
        );

        let not_json = TempFile::new("jwks.json", b"{\"keys\": 3}");
        assert!(matches!(
            Validator::new(&config(Some(&not_json.0), None)),
            Err(JwtError::KeyFile { .. })
        ));
        let only_symmetric = jwks_file(&[json!({"kty": "oct", "k": "c2VjcmV0"})]);
        let error = Validator::new(&config(Some(&only_symmetric.0), None)).unwrap_err();
        assert!(
            error.to_string().contains("no RSA or EC signature key"),
            "{error}"
        );
        let bad_point = jwks_file(&[
            json!({"kty": "EC", "kid": "e", "crv": "P-256", "x": b64(&[1; 32]), "y": b64(&[2; 32])}),
        ]);
        let error = Validator::new(&config(Some(&bad_point.0), None)).unwrap_err();
        assert!(
            error.to_string().contains("key 'e': invalid EC public key"),
            "{error}"
        );
        let short_rsa = jwks_file(&[json!({"kty": "RSA", "n": b64(&[0xc1; 128]), "e": "AQAB"})]);
        let error = Validator::new(&config(Some(&short_rsa.0), None)).unwrap_err();
        assert!(
            error.to_string().contains("key #0: RSA modulus of 1024 bits"),
            "{error}"
        );
        let mismatched =
            jwks_file(&[json!({"kty": "RSA", "alg": "ES256", "n": b64(&[0xc1; 256]), "e": "AQAB"})]);
        assert!(Validator::new(&config(Some(&mismatched.0), None)).is_err());

        let certificate_pem = TempFile::new(
            "c.pem",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        let error = Validator::new(&config(None, Some(&certificate_pem.0))).unwrap_err();
        assert!(error.to_string().contains("c.pem"), "{error}");
    }

    #[test]
    fn spki_parsing_refuses_garbage() {
        let key = EcKey::p256();
        let spki = key.0.public_key().as_der().unwrap().as_ref().to_vec();
        assert!(parse_spki(&spki).is_ok());
        for end in 0..spki.len() {
            assert!(parse_spki(&spki[..end]).is_err(), "prefix of {end}");
        }
        let mut trailing = spki.clone();
        trailing.push(0);
        assert!(parse_spki(&trailing).is_err());
        let mut seed = 99u32;
        for _ in 0..2000 {
            let mut mutated = spki.clone();
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let index = (seed >> 8) as usize % mutated.len();
            mutated[index] ^= (seed >> 24) as u8 | 1;
            let _ = parse_spki(&mutated);
        }
    }
}
