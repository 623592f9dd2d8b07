//! SCRAM-SHA-256 and SCRAM-SHA-512, server side (RFC 5802, RFC 7677), with
//! the restrictions of Kafka's `ScramSaslServer`: no channel binding, no
//! authorization id other than the user itself, no delegation tokens.
//!
//! An exchange is two steps, each consuming the previous state so that a
//! step cannot be repeated or skipped:
//!
//! ```text
//! parse_client_first(msg) -> ClientFirst
//! ClientFirst::server_first(alg, credential) -> (ServerFirst, server-first message)
//! ServerFirst::client_final(msg) -> server-final message ("v=...")
//! ```
//!
//! Every message parsed here comes from an unauthenticated client: lengths are
//! bounded, nothing is indexed without a check, and proofs are compared in
//! constant time.

use std::num::NonZeroU32;

use aws_lc_rs::{constant_time, digest, hmac, pbkdf2, rand as lc_rand};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};

/// Longest client message we read. Real ones are under 200 bytes; the bound
/// keeps a hostile client from making us copy or hash megabytes.
pub const MAX_MESSAGE_LEN: usize = 4096;

/// Bytes of randomness in our server nonce (base64url-encoded, so printable and comma-free).
const SERVER_NONCE_BYTES: usize = 24;

/// Length of a salt from [`Credential::generate`].
const SALT_LEN: usize = 32;

/// Everything that can go wrong in an exchange. Messages are safe to log:
/// they never contain a proof, key or password.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("SCRAM message is {0} bytes, over the {MAX_MESSAGE_LEN}-byte limit")]
    TooLong(usize),
    #[error("SCRAM message is not valid UTF-8")]
    NotUtf8,
    #[error("invalid SCRAM {message} message: {reason}")]
    Malformed { message: &'static str, reason: String },
    #[error("channel binding is not supported (the client asked for it with gs2 flag 'p')")]
    ChannelBindingNotSupported,
    #[error("the authorization id differs from the user name, which is not supported")]
    AuthzidMismatch,
    #[error("delegation tokens are not supported")]
    DelegationTokensNotSupported,
    #[error("mandatory SCRAM extensions (m=) are not supported")]
    MandatoryExtension,
    #[error("channel binding data in the final message does not match the gs2 header")]
    ChannelBindingMismatch,
    #[error("the nonce in the final message does not match the one we sent")]
    NonceMismatch,
    #[error("invalid credentials")]
    InvalidProof,
}

/// The two hash functions Kafka offers for SCRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Sha256,
    Sha512,
}

impl Algorithm {
    /// The SASL mechanism name a client puts in SaslHandshake.
    pub fn mechanism(self) -> &'static str {
        match self {
            Self::Sha256 => "SCRAM-SHA-256",
            Self::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_mechanism(name: &str) -> Option<Self> {
        match name {
            "SCRAM-SHA-256" => Some(Self::Sha256),
            "SCRAM-SHA-512" => Some(Self::Sha512),
            _ => None,
        }
    }

    /// The id Kafka's Describe/AlterUserScramCredentials use (`ScramMechanism`).
    pub fn kafka_type(self) -> i8 {
        match self {
            Self::Sha256 => 1,
            Self::Sha512 => 2,
        }
    }

    pub fn from_kafka_type(t: i8) -> Option<Self> {
        match t {
            1 => Some(Self::Sha256),
            2 => Some(Self::Sha512),
            _ => None,
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Self::Sha256 => &digest::SHA256,
            Self::Sha512 => &digest::SHA512,
        }
    }

    fn hmac(self) -> hmac::Algorithm {
        match self {
            Self::Sha256 => hmac::HMAC_SHA256,
            Self::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            Self::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Self::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    fn output_len(self) -> usize {
        self.digest().output_len()
    }

    fn hmac_of(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        hmac::sign(&hmac::Key::new(self.hmac(), key), data)
            .as_ref()
            .to_vec()
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        digest::digest(self.digest(), data).as_ref().to_vec()
    }

    /// `Hi(password, salt, i)` of RFC 5802: PBKDF2 with this hash. `None`
    /// only for zero iterations, which no valid credential has.
    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Option<Vec<u8>> {
        let iterations = NonZeroU32::new(iterations)?;
        let mut out = vec![0; self.output_len()];
        pbkdf2::derive(self.pbkdf2(), iterations, salt, password, &mut out);
        Some(out)
    }
}

/// What the store keeps for one user and mechanism: never the password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credential {
    #[serde(with = "base64_bytes")]
    salt: Vec<u8>,
    iterations: u32,
    #[serde(with = "base64_bytes")]
    stored_key: Vec<u8>,
    #[serde(with = "base64_bytes")]
    server_key: Vec<u8>,
}

impl Credential {
    /// Kafka refuses AlterUserScramCredentials outside these bounds.
    pub const MIN_ITERATIONS: u32 = 4096;
    pub const MAX_ITERATIONS: u32 = 16384;

    /// Whether Kafka would accept this iteration count in AlterUserScramCredentials
    /// (the caller answers UNACCEPTABLE_CREDENTIAL otherwise).
    pub fn acceptable_iterations(iterations: u32) -> bool {
        (Self::MIN_ITERATIONS..=Self::MAX_ITERATIONS).contains(&iterations)
    }

    /// A credential for `password` with a fresh random salt. The iteration
    /// count is clamped into Kafka's bounds so that the store never holds a
    /// credential Kafka itself would have refused (and zero cannot reach PBKDF2).
    pub fn generate(alg: Algorithm, password: &[u8], iterations: u32) -> Self {
        let iterations = iterations.clamp(Self::MIN_ITERATIONS, Self::MAX_ITERATIONS);
        let salt = random_bytes(SALT_LEN);
        let salted = alg
            .salted_password(password, &salt, iterations)
            .unwrap_or_default();
        Self::from_salted_password(alg, &salted, &salt, iterations)
    }

    /// As AlterUserScramCredentials sends it: the client already salted the password.
    pub fn from_salted_password(
        alg: Algorithm,
        salted_password: &[u8],
        salt: &[u8],
        iterations: u32,
    ) -> Self {
        let (stored_key, server_key) = derive_keys(alg, salted_password);
        Self {
            salt: salt.to_vec(),
            iterations,
            stored_key,
            server_key,
        }
    }

    pub fn iterations(&self) -> u32 {
        self.iterations
    }

    pub fn salt(&self) -> &[u8] {
        &self.salt
    }

    /// PLAIN: derive from the password and compare the stored key in constant time.
    pub fn verify_password(&self, alg: Algorithm, password: &[u8]) -> bool {
        let Some(salted) = alg.salted_password(password, &self.salt, self.iterations) else {
            return false;
        };
        let (stored_key, _) = derive_keys(alg, &salted);
        constant_time::verify_slices_are_equal(&stored_key, &self.stored_key).is_ok()
    }
}

/// StoredKey and ServerKey from SaltedPassword (RFC 5802 §3).
fn derive_keys(alg: Algorithm, salted_password: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let client_key = alg.hmac_of(salted_password, b"Client Key");
    let stored_key = alg.hash(&client_key);
    let server_key = alg.hmac_of(salted_password, b"Server Key");
    (stored_key, server_key)
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0; len];
    // aws-lc's generator does not fail in practice; should it, the rand
    // crate's OS-seeded generator is as good, and neither path panics.
    if lc_rand::fill(&mut bytes).is_err() {
        use rand::RngCore as _;
        rand::rng().fill_bytes(&mut bytes);
    }
    bytes
}

/// Serde for byte fields as standard base64 strings, which keeps a stored
/// credential readable in JSON or TOML.
mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD.decode(text.as_bytes()).map_err(serde::de::Error::custom)
    }
}

/// The parsed client-first message, before we know the user's credential.
#[derive(Debug)]
pub struct ClientFirst {
    /// The user name with `=2C` and `=3D` decoded.
    pub username: String,
    gs2_header: String,
    client_nonce: String,
    client_first_bare: String,
}

/// Parses `gs2-header [m=...,] n=user,r=nonce[,ext=value]*`.
pub fn parse_client_first(message: &[u8]) -> Result<ClientFirst, ScramError> {
    let text = message_text(message)?;
    let malformed = |reason: &str| malformed("client-first", reason);
    let (flag, rest) = text.split_once(',').ok_or_else(|| malformed("no gs2 header"))?;
    check_gs2_flag(flag)?;
    let (authzid_field, bare) = rest.split_once(',').ok_or_else(|| malformed("no gs2 header"))?;
    let authzid = match authzid_field {
        "" => None,
        field => Some(decode_saslname(
            field.strip_prefix("a=").ok_or_else(|| malformed("bad authzid"))?,
        )?),
    };
    let gs2_header = format!("{flag},{authzid_field},");

    let mut attributes = bare.split(',');
    let first = attributes.next().unwrap_or_default();
    if first.starts_with("m=") {
        return Err(ScramError::MandatoryExtension);
    }
    let username = decode_saslname(attribute(first, "n", "client-first")?)?;
    if username.is_empty() {
        return Err(malformed("empty user name"));
    }
    let nonce = attribute(attributes.next().unwrap_or_default(), "r", "client-first")?;
    check_nonce(nonce, "client-first")?;
    check_client_first_extensions(attributes)?;
    if authzid.is_some_and(|authzid| authzid != username) {
        return Err(ScramError::AuthzidMismatch);
    }
    Ok(ClientFirst {
        username,
        gs2_header,
        client_nonce: nonce.to_owned(),
        client_first_bare: bare.to_owned(),
    })
}

/// The gs2 channel-binding flag: `n` (client cannot bind) and `y` (client
/// could, thinks we cannot) are fine; `p=...` asks for binding we lack.
fn check_gs2_flag(flag: &str) -> Result<(), ScramError> {
    match flag {
        "n" | "y" => Ok(()),
        flag if flag.starts_with("p=") => Err(ScramError::ChannelBindingNotSupported),
        _ => Err(malformed("client-first", "unknown gs2 channel binding flag")),
    }
}

/// Kafka knows one extension, `tokenauth`, and ignores the others; we do
/// not support delegation tokens, so `tokenauth` set true is refused.
fn check_client_first_extensions<'a>(extensions: impl Iterator<Item = &'a str>) -> Result<(), ScramError> {
    for extension in extensions {
        let (key, value) = parse_extension(extension, "client-first")?;
        // Kafka reads the flag with Boolean.parseBoolean.
        if key == "tokenauth" && value.eq_ignore_ascii_case("true") {
            return Err(ScramError::DelegationTokensNotSupported);
        }
    }
    Ok(())
}

/// One `key=value` extension: key is ASCII letters, value non-empty.
fn parse_extension<'a>(extension: &'a str, message: &'static str) -> Result<(&'a str, &'a str), ScramError> {
    match extension.split_once('=') {
        Some((key, value))
            if !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphabetic()) && !value.is_empty() =>
        {
            Ok((key, value))
        }
        _ => Err(malformed(message, "bad extension attribute")),
    }
}

impl ClientFirst {
    /// Our server-first message (r=client nonce + server nonce, s=base64 salt, i=iterations) and the state for the final step.
    pub fn server_first(self, alg: Algorithm, credential: Credential) -> (ServerFirst, Vec<u8>) {
        let server_nonce = URL_SAFE_NO_PAD.encode(random_bytes(SERVER_NONCE_BYTES));
        self.server_first_with_nonce(alg, credential, &server_nonce)
    }

    /// [`Self::server_first`] with a chosen server nonce, so tests can
    /// reproduce published exchanges. The nonce must be printable and without
    /// commas; the caller (test code) is trusted to ensure it.
    pub(crate) fn server_first_with_nonce(
        self,
        alg: Algorithm,
        credential: Credential,
        server_nonce: &str,
    ) -> (ServerFirst, Vec<u8>) {
        let nonce = format!("{}{}", self.client_nonce, server_nonce);
        let message = format!(
            "r={nonce},s={},i={}",
            STANDARD.encode(&credential.salt),
            credential.iterations
        );
        let state = ServerFirst {
            alg,
            credential,
            username: self.username,
            gs2_header: self.gs2_header,
            nonce,
            client_first_bare: self.client_first_bare,
            server_first: message.clone(),
        };
        (state, message.into_bytes())
    }
}

/// The exchange after we sent server-first, waiting for the client's proof.
pub struct ServerFirst {
    alg: Algorithm,
    credential: Credential,
    username: String,
    gs2_header: String,
    nonce: String,
    client_first_bare: String,
    server_first: String,
}

impl std::fmt::Debug for ServerFirst {
    /// Leaves the credential out: it does not belong in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerFirst")
            .field("alg", &self.alg)
            .field("username", &self.username)
            .finish()
    }
}

impl ServerFirst {
    /// The user being authenticated; the principal once `client_final` succeeds.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// Checks the client-final message (channel binding c= must be base64 of
    /// the gs2 header, r= must equal the combined nonce, proof verified in
    /// constant time) and returns the server-final message ("v=…").
    pub fn client_final(self, message: &[u8]) -> Result<Vec<u8>, ScramError> {
        let text = message_text(message)?;
        let (without_proof, proof) = split_proof(text)?;
        let mut attributes = without_proof.split(',');
        let binding = attribute(attributes.next().unwrap_or_default(), "c", "client-final")?;
        let binding = decode_base64(binding, "client-final")?;
        if binding != self.gs2_header.as_bytes() {
            return Err(ScramError::ChannelBindingMismatch);
        }
        let nonce = attribute(attributes.next().unwrap_or_default(), "r", "client-final")?;
        for extension in attributes {
            parse_extension(extension, "client-final")?;
        }
        // RFC 5802 wants the nonce we sent back verbatim. librdkafka before
        // 2.2 (Debian's kcat among its users) sends its own nonce in front of
        // it again, and Kafka's ScramSaslServer accepts that (it checks
        // `endsWith`), so ketch does too. The proof covers the message as
        // sent, and the suffix is our fresh nonce: nothing can be replayed.
        if !nonce.ends_with(&self.nonce) {
            return Err(ScramError::NonceMismatch);
        }
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        self.verify_proof(&proof, auth_message.as_bytes())?;
        let signature = self
            .alg
            .hmac_of(&self.credential.server_key, auth_message.as_bytes());
        Ok(format!("v={}", STANDARD.encode(signature)).into_bytes())
    }

    /// RFC 5802 §3: recover ClientKey = proof XOR HMAC(StoredKey, AuthMessage)
    /// and check that its hash is StoredKey, in constant time.
    fn verify_proof(&self, proof: &[u8], auth_message: &[u8]) -> Result<(), ScramError> {
        let client_signature = self.alg.hmac_of(&self.credential.stored_key, auth_message);
        if proof.len() != client_signature.len() {
            return Err(ScramError::InvalidProof);
        }
        let client_key: Vec<u8> = proof.iter().zip(&client_signature).map(|(p, s)| p ^ s).collect();
        constant_time::verify_slices_are_equal(&self.alg.hash(&client_key), &self.credential.stored_key)
            .map_err(|_| ScramError::InvalidProof)
    }
}

/// Splits `...,p=proof` into the part the AuthMessage covers and the decoded
/// proof. The proof is the last attribute by the grammar.
fn split_proof(text: &str) -> Result<(&str, Vec<u8>), ScramError> {
    let (without_proof, proof) = text
        .rsplit_once(",p=")
        .ok_or_else(|| malformed("client-final", "missing proof (p=)"))?;
    Ok((without_proof, decode_base64(proof, "client-final")?))
}

/// The message as text, after the size check.
fn message_text(message: &[u8]) -> Result<&str, ScramError> {
    if message.len() > MAX_MESSAGE_LEN {
        return Err(ScramError::TooLong(message.len()));
    }
    std::str::from_utf8(message).map_err(|_| ScramError::NotUtf8)
}

/// The value of `name=value`, or an error naming the attribute we expected
/// (which covers missing attributes and attributes out of order).
fn attribute<'a>(field: &'a str, name: &str, message: &'static str) -> Result<&'a str, ScramError> {
    field
        .strip_prefix(name)
        .and_then(|rest| rest.strip_prefix('='))
        .ok_or_else(|| malformed(message, &format!("expected attribute '{name}='")))
}

/// A nonce is non-empty and printable ASCII without commas (RFC 5802 §7).
fn check_nonce(nonce: &str, message: &'static str) -> Result<(), ScramError> {
    if nonce.is_empty() {
        return Err(malformed(message, "empty nonce"));
    }
    if !nonce.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',') {
        return Err(malformed(message, "nonce has non-printable characters"));
    }
    Ok(())
}

/// Decodes a saslname: `=2C` is ',' and `=3D` is '='; any other '=' is an
/// error, as RFC 5802 §5.1 requires.
fn decode_saslname(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(position) = rest.find('=') {
        out.push_str(&rest[..position]);
        let escape = rest.get(position..position + 3);
        match escape {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(malformed("client-first", "bad '=' escape in a name")),
        }
        rest = &rest[position + 3..];
    }
    out.push_str(rest);
    if out.contains('\0') {
        return Err(malformed("client-first", "NUL in a name"));
    }
    Ok(out)
}

fn decode_base64(text: &str, message: &'static str) -> Result<Vec<u8>, ScramError> {
    STANDARD
        .decode(text.as_bytes())
        .map_err(|_| malformed(message, "invalid base64"))
}

fn malformed(message: &'static str, reason: &str) -> ScramError {
    ScramError::Malformed {
        message,
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 §3.
    const RFC_CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
    const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    const RFC_SERVER_FIRST: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const RFC_CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
         p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const RFC_SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    /// Computed once: PBKDF2 is deliberately slow and many tests need it.
    fn rfc_credential() -> Credential {
        static CREDENTIAL: std::sync::OnceLock<Credential> = std::sync::OnceLock::new();
        CREDENTIAL
            .get_or_init(|| {
                let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
                let salted = Algorithm::Sha256.salted_password(b"pencil", &salt, 4096).unwrap();
                Credential::from_salted_password(Algorithm::Sha256, &salted, &salt, 4096)
            })
            .clone()
    }

    fn rfc_server_first() -> ServerFirst {
        let first = parse_client_first(RFC_CLIENT_FIRST.as_bytes()).unwrap();
        assert_eq!(first.username, "user");
        let (state, message) =
            first.server_first_with_nonce(Algorithm::Sha256, rfc_credential(), RFC_SERVER_NONCE);
        assert_eq!(String::from_utf8(message).unwrap(), RFC_SERVER_FIRST);
        state
    }

    #[test]
    fn rfc7677_example_reproduces_server_messages() {
        let final_message = rfc_server_first()
            .client_final(RFC_CLIENT_FINAL.as_bytes())
            .unwrap();
        assert_eq!(String::from_utf8(final_message).unwrap(), RFC_SERVER_FINAL);
    }

    #[test]
    fn rfc7677_tampered_proof_is_refused() {
        let tampered = RFC_CLIENT_FINAL.replace("p=dHzb", "p=dHzc");
        assert_eq!(
            rfc_server_first().client_final(tampered.as_bytes()),
            Err(ScramError::InvalidProof)
        );
    }

    #[test]
    fn final_message_checks_nonce_and_binding() {
        let other_nonce = RFC_CLIENT_FINAL.replace("k0,p=", "k1,p=");
        assert_eq!(
            rfc_server_first().client_final(other_nonce.as_bytes()),
            Err(ScramError::NonceMismatch)
        );
        let y_binding = RFC_CLIENT_FINAL.replace("c=biws", "c=eSws");
        assert_eq!(
            rfc_server_first().client_final(y_binding.as_bytes()),
            Err(ScramError::ChannelBindingMismatch)
        );
        let no_proof = RFC_CLIENT_FINAL.split(",p=").next().unwrap();
        assert!(matches!(
            rfc_server_first().client_final(no_proof.as_bytes()),
            Err(ScramError::Malformed { .. })
        ));
        let swapped = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,c=biws,p=AAAA";
        assert!(matches!(
            rfc_server_first().client_final(swapped.as_bytes()),
            Err(ScramError::Malformed { .. })
        ));
        let bad_base64 = RFC_CLIENT_FINAL.replace("p=dHzb", "p=*Hzb");
        assert!(matches!(
            rfc_server_first().client_final(bad_base64.as_bytes()),
            Err(ScramError::Malformed { .. })
        ));
    }

    /// Just enough of a SCRAM client to run an exchange against the server.
    struct TestClient {
        alg: Algorithm,
        password: &'static [u8],
        gs2_header: &'static str,
        client_first_bare: String,
        /// Sent in front of the server's nonce in the final message, as
        /// librdkafka before 2.2 sends its own nonce again.
        nonce_prefix: String,
    }

    impl TestClient {
        fn new(alg: Algorithm, user: &str, password: &'static [u8], gs2_header: &'static str) -> Self {
            let nonce = URL_SAFE_NO_PAD.encode(random_bytes(18));
            Self {
                alg,
                password,
                gs2_header,
                client_first_bare: format!("n={user},r={nonce}"),
                nonce_prefix: String::new(),
            }
        }

        fn first(&self) -> Vec<u8> {
            format!("{}{}", self.gs2_header, self.client_first_bare).into_bytes()
        }

        /// Returns the client-final message and the server signature expected back.
        fn last(&self, server_first: &[u8]) -> (Vec<u8>, String) {
            let server_first = std::str::from_utf8(server_first).unwrap();
            let mut parts = server_first.split(',');
            let nonce = parts.next().unwrap().strip_prefix("r=").unwrap();
            let salt = STANDARD
                .decode(parts.next().unwrap().strip_prefix("s=").unwrap())
                .unwrap();
            let iterations = parts.next().unwrap().strip_prefix("i=").unwrap().parse().unwrap();
            let salted = self
                .alg
                .salted_password(self.password, &salt, iterations)
                .unwrap();
            let without_proof = format!(
                "c={},r={}{nonce}",
                STANDARD.encode(self.gs2_header),
                self.nonce_prefix
            );
            let auth = format!("{},{server_first},{without_proof}", self.client_first_bare);
            let client_key = self.alg.hmac_of(&salted, b"Client Key");
            let signature = self.alg.hmac_of(&self.alg.hash(&client_key), auth.as_bytes());
            let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(k, s)| k ^ s).collect();
            let server_key = self.alg.hmac_of(&salted, b"Server Key");
            let expected = format!(
                "v={}",
                STANDARD.encode(self.alg.hmac_of(&server_key, auth.as_bytes()))
            );
            (
                format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes(),
                expected,
            )
        }
    }

    fn exchange(client: &TestClient, credential: Credential) -> Result<(Vec<u8>, String), ScramError> {
        let first = parse_client_first(&client.first())?;
        let (state, server_first) = first.server_first(client.alg, credential);
        let (client_final, expected) = client.last(&server_first);
        Ok((state.client_final(&client_final)?, expected))
    }

    #[test]
    fn a_final_nonce_with_the_client_nonce_repeated_in_front_is_accepted_as_kafka_does() {
        let credential = Credential::generate(Algorithm::Sha256, b"pw", 4096);
        let mut client = TestClient::new(Algorithm::Sha256, "kcat", b"pw", "n,,");
        let client_nonce = client.client_first_bare.split("r=").nth(1).unwrap().to_owned();
        client.nonce_prefix = client_nonce;
        let (server_final, expected) = exchange(&client, credential.clone()).unwrap();
        assert_eq!(String::from_utf8(server_final).unwrap(), expected);
        // Kafka accepts any prefix: the client's proof covers it, and the
        // nonce still ends with ours (a wrong ending is refused, below).
        client.nonce_prefix = "x".to_owned();
        assert!(exchange(&client, credential).is_ok());
    }

    #[test]
    fn sha512_full_exchange() {
        let credential = Credential::generate(Algorithm::Sha512, b"s3cret", 4096);
        let client = TestClient::new(Algorithm::Sha512, "alice", b"s3cret", "n,,");
        let (server_final, expected) = exchange(&client, credential).unwrap();
        assert_eq!(String::from_utf8(server_final).unwrap(), expected);
    }

    #[test]
    fn y_flag_and_matching_authzid_are_accepted() {
        let credential = Credential::generate(Algorithm::Sha256, b"pw", 4096);
        let client = TestClient::new(Algorithm::Sha256, "a=3Db", b"pw", "y,a=a=3Db,");
        let (server_final, expected) = exchange(&client, credential).unwrap();
        assert_eq!(String::from_utf8(server_final).unwrap(), expected);
    }

    #[test]
    fn wrong_password_is_refused() {
        let credential = Credential::generate(Algorithm::Sha512, b"right", 4096);
        let client = TestClient::new(Algorithm::Sha512, "alice", b"wrong", "n,,");
        assert_eq!(exchange(&client, credential), Err(ScramError::InvalidProof));
    }

    #[test]
    fn credential_for_other_algorithm_is_refused() {
        let credential = Credential::generate(Algorithm::Sha256, b"pw", 4096);
        let client = TestClient::new(Algorithm::Sha512, "alice", b"pw", "n,,");
        assert_eq!(exchange(&client, credential), Err(ScramError::InvalidProof));
    }

    #[test]
    fn verify_password_for_plain() {
        let credential = Credential::generate(Algorithm::Sha256, b"pencil", 4096);
        assert!(credential.verify_password(Algorithm::Sha256, b"pencil"));
        assert!(!credential.verify_password(Algorithm::Sha256, b"pencil "));
        assert!(!credential.verify_password(Algorithm::Sha512, b"pencil"));
        assert!(rfc_credential().verify_password(Algorithm::Sha256, b"pencil"));
    }

    #[test]
    fn generate_clamps_iterations_and_salts_randomly() {
        let low = Credential::generate(Algorithm::Sha256, b"pw", 0);
        assert_eq!(low.iterations(), Credential::MIN_ITERATIONS);
        assert!(low.verify_password(Algorithm::Sha256, b"pw"));
        let other = Credential::generate(Algorithm::Sha256, b"pw", 4096);
        assert_ne!(low.salt(), other.salt());
        assert_eq!(low.salt().len(), SALT_LEN);
        assert!(Credential::acceptable_iterations(16384));
        assert!(!Credential::acceptable_iterations(16385));
    }

    #[test]
    fn credential_round_trips_through_json_as_base64() {
        let credential = rfc_credential();
        let json = serde_json::to_string(&credential).unwrap();
        assert!(json.contains("\"salt\":\"W22ZaJ0SNY7soEsUEjb6gQ==\""), "{json}");
        assert_eq!(serde_json::from_str::<Credential>(&json).unwrap(), credential);
        assert!(serde_json::from_str::<Credential>(&json.replace("W22Z", "W2*Z")).is_err());
    }

    #[test]
    fn zero_iterations_from_storage_never_verifies() {
        let mut credential = rfc_credential();
        credential.iterations = 0;
        assert!(!credential.verify_password(Algorithm::Sha256, b"pencil"));
    }

    #[test]
    fn algorithm_names_and_kafka_ids() {
        for alg in [Algorithm::Sha256, Algorithm::Sha512] {
            assert_eq!(Algorithm::from_mechanism(alg.mechanism()), Some(alg));
            assert_eq!(Algorithm::from_kafka_type(alg.kafka_type()), Some(alg));
        }
        assert_eq!(Algorithm::Sha256.kafka_type(), 1);
        assert_eq!(Algorithm::Sha512.mechanism(), "SCRAM-SHA-512");
        assert_eq!(Algorithm::from_mechanism("SCRAM-SHA-1"), None);
        assert_eq!(Algorithm::from_kafka_type(0), None);
    }

    #[test]
    fn username_escapes_are_decoded() {
        let first = parse_client_first(b"n,,n=a=2Cb=3Dc,r=abc").unwrap();
        assert_eq!(first.username, "a,b=c");
        assert!(parse_client_first(b"n,,n=a=2,r=abc").is_err());
        assert!(parse_client_first(b"n,,n=a=41,r=abc").is_err());
    }

    fn refused(message: &str) -> ScramError {
        parse_client_first(message.as_bytes()).unwrap_err()
    }

    #[test]
    fn client_first_refusals() {
        assert_eq!(
            refused("p=tls-unique,,n=u,r=abc"),
            ScramError::ChannelBindingNotSupported
        );
        assert_eq!(refused("n,a=admin,n=u,r=abc"), ScramError::AuthzidMismatch);
        assert_eq!(
            refused("n,,n=u,r=abc,tokenauth=true"),
            ScramError::DelegationTokensNotSupported
        );
        // Other extensions are ignored, as Kafka ignores them.
        assert!(parse_client_first(b"n,,n=u,r=abc,foo=bar").is_ok());
        assert_eq!(refused("n,,m=x,n=u,r=abc"), ScramError::MandatoryExtension);
        assert!(parse_client_first(b"n,,n=u,r=abc,tokenauth=false").is_ok());
        let too_long = format!("n,,n=u,r={}", "a".repeat(MAX_MESSAGE_LEN));
        assert!(matches!(refused(&too_long), ScramError::TooLong(_)));
        for malformed in [
            "n,,n=,r=abc",        // empty user
            "n,,n=u,r=",          // empty nonce
            "n,,n=u,r=a\u{7f}c",  // non-printable nonce
            "n,,n=u,r=a c",       // space in nonce
            "n,,r=abc,n=u",       // wrong order
            "n,,n=u",             // missing nonce
            "x,,n=u,r=abc",       // unknown gs2 flag
            "n,b=x,n=u,r=abc",    // not an authzid
            "n,,n=u,r=abc,=x",    // empty extension key
            "n,,n=u,r=abc,ke1=x", // non-alphabetic key
        ] {
            assert!(
                matches!(refused(malformed), ScramError::Malformed { .. }),
                "{malformed}"
            );
        }
    }

    #[test]
    fn garbage_and_truncations_are_errors_not_panics() {
        assert_eq!(
            parse_client_first(&[0xff, 0xfe]).unwrap_err(),
            ScramError::NotUtf8
        );
        // Every prefix up to and including "r=" lacks a nonce (longer ones are valid).
        for end in 0..=RFC_CLIENT_FIRST.find("r=").unwrap() + 2 {
            assert!(
                parse_client_first(&RFC_CLIENT_FIRST.as_bytes()[..end]).is_err(),
                "{end}"
            );
        }
        for end in 0..RFC_CLIENT_FINAL.len() {
            assert!(
                rfc_server_first()
                    .client_final(&RFC_CLIENT_FINAL.as_bytes()[..end])
                    .is_err(),
                "{end}"
            );
        }
        let mut seed = 7u32;
        for _ in 0..500 {
            let garbage: Vec<u8> = (0..(seed % 64))
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    b"n,=ar2C3Dp\x01xyz"[(seed >> 16) as usize % 14]
                })
                .collect();
            let _ = parse_client_first(&garbage);
            let _ = rfc_server_first().client_final(&garbage);
        }
    }
}
