//! SASL authentication of one connection: SaslHandshake v0–1,
//! SaslAuthenticate v0–2 (and the raw tokens of a v0 handshake), the
//! SCRAM-SHA-256/512, PLAIN and OAUTHBEARER mechanisms, and KIP-368
//! re-authentication.
//!
//! A SASL listener answers nothing but ApiVersions, SaslHandshake and
//! SaslAuthenticate until the client has authenticated; anything else
//! closes the connection, as Kafka does. A failed authentication is
//! answered with SASL_AUTHENTICATION_FAILED after
//! `sasl.failed_authentication_delay`, and the connection is closed.
//!
//! Once authenticated, a SaslHandshake starts a re-authentication only when
//! the session has a lifetime and the last re-authentication began at least
//! a second ago; otherwise it is answered ILLEGAL_SASL_STATE and the
//! connection goes on, as is a SaslAuthenticate outside an exchange (Kafka's
//! `KafkaChannel.maybeBeginServerReauthentication`, then `KafkaApis`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use ketch_config::Settings;

use super::scram::{self, Algorithm, Credential};
use super::{jwt, oauthbearer};
use crate::api::str_bytes;
use crate::storage::Storage;

/// SASL settings and counters shared by every connection of a gateway.
pub struct Sasl {
    mechanisms: Vec<String>,
    plain_without_tls: bool,
    reauth: Option<Duration>,
    failure_delay: Duration,
    /// `sasl.scram_iterations`: the key derivation an unknown user's
    /// password goes through, as a known user's does.
    scram_iterations: u32,
    jwt: Option<jwt::Validator>,
    pub successes: AtomicU64,
    pub failures: AtomicU64,
}

impl Sasl {
    pub fn new(settings: &Settings) -> anyhow::Result<Self> {
        let sasl = &settings.sasl;
        // Tokens are checked for OAUTHBEARER and for HTTP bearer
        // authentication alike.
        let jwt = if sasl.oauth_jwks_file.is_some() || sasl.oauth_public_key_file.is_some() {
            Some(
                jwt::Validator::new(&jwt::ValidatorConfig {
                    jwks_file: sasl.oauth_jwks_file.as_deref(),
                    public_key_file: sasl.oauth_public_key_file.as_deref(),
                    issuer: sasl.oauth_issuer.as_deref(),
                    audience: sasl.oauth_audience.as_deref(),
                    subject_claim: &sasl.oauth_subject_claim,
                    clock_skew: sasl.oauth_clock_skew.get(),
                })
                .map_err(|e| anyhow::anyhow!("OAUTHBEARER keys: {e}"))?,
            )
        } else {
            None
        };
        let reauth = sasl.connections_max_reauth.get();
        Ok(Self {
            mechanisms: sasl.mechanisms.clone(),
            plain_without_tls: sasl.plain_without_tls,
            reauth: (!reauth.is_zero()).then_some(reauth),
            failure_delay: sasl.failed_authentication_delay.get(),
            scram_iterations: sasl.scram_iterations,
            jwt,
            successes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        })
    }

    /// The mechanisms a client on a listener with or without TLS may use.
    fn offered(&self, tls: bool) -> Vec<&str> {
        self.mechanisms
            .iter()
            .map(String::as_str)
            .filter(|m| *m != "PLAIN" || tls || self.plain_without_tls)
            .filter(|m| *m != "OAUTHBEARER" || self.jwt.is_some())
            .collect()
    }
}

/// One connection's authentication state.
pub struct Session {
    sasl: Arc<Sasl>,
    /// Whether the connection is TLS (PLAIN is offered only then, by default).
    tls: bool,
    /// The principal: `User:ANONYMOUS` (or the client certificate's) until
    /// SASL succeeds.
    principal: Arc<str>,
    /// Whether a SASL authentication has succeeded.
    authenticated: bool,
    /// The mechanism of the first authentication (re-authentication must
    /// use it) and the exchange under way.
    mechanism: Option<Mechanism>,
    exchange: Option<Exchange>,
    /// A v0 handshake: the next frames are raw SASL tokens, not requests.
    raw_tokens: bool,
    /// When the session ends (KIP-368); the client must re-authenticate by then.
    expires: Option<Instant>,
    /// When the last re-authentication began: the next may begin a second
    /// later at the earliest (Kafka's `MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS`).
    last_reauth: Option<Instant>,
}

/// The least time between the starts of two re-authentications.
const MIN_REAUTH_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mechanism {
    Scram(Algorithm),
    Plain,
    OAuthBearer,
}

impl Mechanism {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "PLAIN" => Some(Mechanism::Plain),
            "OAUTHBEARER" => Some(Mechanism::OAuthBearer),
            other => Algorithm::from_mechanism(other).map(Mechanism::Scram),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mechanism::Scram(alg) => alg.mechanism(),
            Mechanism::Plain => "PLAIN",
            Mechanism::OAuthBearer => "OAUTHBEARER",
        }
    }
}

enum Exchange {
    /// Waiting for the client's first message.
    Start(Mechanism),
    /// OAUTHBEARER: the token was refused and the RFC 7628 error challenge
    /// sent; the client's acknowledgement (`%x01`) ends the exchange with
    /// this failure, as Kafka's OAuthBearerSaslServer does.
    OAuthRefused(String),
    /// SCRAM: server-first sent, waiting for client-final.
    ScramFinal {
        state: Box<scram::ServerFirst>,
        user: String,
        alg: Algorithm,
    },
}

/// What a SASL step produced.
pub enum Outcome {
    /// Send this response and go on.
    Answer(kafka_protocol::messages::ResponseKind),
    /// Send these raw token bytes (a v0 handshake's exchange) and go on.
    Raw(Vec<u8>),
    /// Send this response (if any), then close the connection.
    Close(Option<kafka_protocol::messages::ResponseKind>, String),
}

/// Why one step of an exchange failed.
#[derive(Debug)]
enum Failure {
    /// Told to the client as it is: one of the messages Kafka's SASL
    /// servers tell (their `SaslAuthenticationException`s).
    Told(String),
    /// Kafka's generic message for everything else (its `SaslException`s:
    /// malformed messages, a wrong proof, an unknown user, a credential that
    /// cannot be read), "Authentication failed during authentication due to
    /// invalid credentials with SASL mechanism …" ("during
    /// re-authentication" when re-authenticating). The reason is for the
    /// log only: it may echo what the client sent.
    Invalid(Mechanism, String),
}

/// The result of one step: a challenge to send, or success.
enum Step {
    Challenge(Vec<u8>),
    Done {
        response: Vec<u8>,
        principal: String,
        /// The credential's own expiry (an OAuth token's).
        expires: Option<SystemTime>,
    },
}

impl Session {
    pub fn new(sasl: Arc<Sasl>, tls: bool, principal: Arc<str>) -> Self {
        Self {
            sasl,
            tls,
            principal,
            authenticated: false,
            mechanism: None,
            exchange: None,
            raw_tokens: false,
            expires: None,
            last_reauth: None,
        }
    }

    pub fn principal(&self) -> Arc<str> {
        self.principal.clone()
    }

    /// Whether the client may send requests other than SASL ones.
    pub fn authenticated(&self) -> bool {
        self.authenticated && self.exchange.is_none()
    }

    /// Whether a SASL exchange is under way (after its handshake).
    pub fn exchanging(&self) -> bool {
        self.exchange.is_some()
    }

    /// Whether the next frame is a raw SASL token (after a v0 handshake).
    pub fn expects_raw_token(&self) -> bool {
        self.raw_tokens
    }

    /// Whether the session lifetime has passed (the client did not
    /// re-authenticate in time): the connection must be closed unless the
    /// client is re-authenticating now.
    pub fn expired(&self) -> bool {
        self.exchange.is_none() && self.expires.is_some_and(|at| Instant::now() >= at)
    }

    /// Answers a SaslHandshake.
    pub fn handshake(&mut self, version: i16, request: &SaslHandshakeRequest) -> Outcome {
        let offered: Vec<_> = self.sasl.offered(self.tls).into_iter().map(str_bytes).collect();
        let response = |code: i16| {
            kafka_protocol::messages::ResponseKind::SaslHandshake(
                SaslHandshakeResponse::default()
                    .with_error_code(code)
                    .with_mechanisms(offered.clone()),
            )
        };
        if self.exchange.is_some() {
            return Outcome::Close(
                Some(response(ResponseError::IllegalSaslState.code())),
                "a second SaslHandshake during an exchange".to_owned(),
            );
        }
        if self.authenticated {
            // Kafka's `KafkaChannel.maybeBeginServerReauthentication`: no
            // re-authentication of a session without a lifetime, nor within
            // a second of the last one's start. The handshake then reaches
            // `KafkaApis`, which answers ILLEGAL_SASL_STATE (without
            // mechanisms) and keeps the connection, unless its session
            // expired.
            let now = Instant::now();
            let refused = if self.expires.is_none() {
                Some("the session has no lifetime (sasl.connections_max_reauth is not set)")
            } else if self
                .last_reauth
                .is_some_and(|at| now.saturating_duration_since(at) < MIN_REAUTH_INTERVAL)
            {
                Some("the last re-authentication began less than a second ago")
            } else {
                None
            };
            if let Some(why) = refused {
                if self.expired() {
                    return Outcome::Close(None, SESSION_EXPIRED.to_owned());
                }
                tracing::debug!(
                    principal = &*self.principal,
                    "SaslHandshake after authentication refused: {why}"
                );
                return Outcome::Answer(kafka_protocol::messages::ResponseKind::SaslHandshake(
                    SaslHandshakeResponse::default().with_error_code(ResponseError::IllegalSaslState.code()),
                ));
            }
            self.last_reauth = Some(now);
        }
        let name = request.mechanism.as_str();
        let Some(mechanism) = Mechanism::parse(name).filter(|_| offered.iter().any(|m| m.as_str() == name))
        else {
            return Outcome::Close(
                Some(response(ResponseError::UnsupportedSaslMechanism.code())),
                format!("unsupported SASL mechanism {name:?}"),
            );
        };
        if let Some(first) = self.mechanism
            && first != mechanism
        {
            return Outcome::Close(
                Some(response(ResponseError::IllegalSaslState.code())),
                format!(
                    "re-authentication with {} after {}",
                    mechanism.name(),
                    first.name()
                ),
            );
        }
        if version == 0 && self.authenticated {
            return Outcome::Close(
                Some(response(ResponseError::IllegalSaslState.code())),
                "re-authentication needs SaslHandshake v1".to_owned(),
            );
        }
        self.exchange = Some(Exchange::Start(mechanism));
        self.raw_tokens = version == 0;
        Outcome::Answer(response(0))
    }

    /// Answers a SaslAuthenticate.
    pub async fn authenticate(
        &mut self,
        storage: &dyn Storage,
        version: i16,
        request: &SaslAuthenticateRequest,
    ) -> Outcome {
        let response = SaslAuthenticateResponse::default();
        if self.authenticated && !self.raw_tokens && self.exchange.is_none() {
            // Kafka's `KafkaApis.handleSaslAuthenticateRequest`: answered,
            // and the connection goes on (unless its session expired).
            if self.expired() {
                return Outcome::Close(None, SESSION_EXPIRED.to_owned());
            }
            return Outcome::Answer(kafka_protocol::messages::ResponseKind::SaslAuthenticate(
                response
                    .with_error_code(ResponseError::IllegalSaslState.code())
                    .with_error_message(Some(str_bytes(
                        "SaslAuthenticate request received after successful authentication",
                    ))),
            ));
        }
        if self.raw_tokens || self.exchange.is_none() {
            return Outcome::Close(
                Some(kafka_protocol::messages::ResponseKind::SaslAuthenticate(
                    response
                        .with_error_code(ResponseError::IllegalSaslState.code())
                        .with_error_message(Some(str_bytes(
                            "SaslAuthenticate without a SaslHandshake before it",
                        ))),
                )),
                "SaslAuthenticate without a handshake".to_owned(),
            );
        }
        match self.step(storage, &request.auth_bytes).await {
            Ok(Step::Challenge(bytes)) => {
                Outcome::Answer(kafka_protocol::messages::ResponseKind::SaslAuthenticate(
                    response.with_auth_bytes(bytes.into()),
                ))
            }
            Ok(Step::Done {
                response: bytes,
                principal,
                expires,
            }) => match self.complete(principal, expires) {
                Ok(lifetime) => {
                    let mut answer = response.with_auth_bytes(bytes.into());
                    if version >= 1 {
                        answer.session_lifetime_ms =
                            lifetime.map_or(0, |d| d.as_millis().min(i64::MAX as u128) as i64);
                    }
                    Outcome::Answer(kafka_protocol::messages::ResponseKind::SaslAuthenticate(answer))
                }
                Err(failure) => self.failed(failure).await,
            },
            Err(failure) => self.failed(failure).await,
        }
    }

    /// Takes a raw token (after a v0 handshake).
    pub async fn raw_token(&mut self, storage: &dyn Storage, token: &[u8]) -> Outcome {
        match self.step(storage, token).await {
            Ok(Step::Challenge(bytes)) => Outcome::Raw(bytes),
            Ok(Step::Done {
                response,
                principal,
                expires,
            }) => match self.complete(principal, expires) {
                Ok(_) => {
                    self.raw_tokens = false;
                    Outcome::Raw(response)
                }
                Err(failure) => {
                    let (_, logged) = self.explain(failure);
                    self.sasl.failures.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(self.sasl.failure_delay).await;
                    Outcome::Close(None, logged)
                }
            },
            Err(failure) => {
                // A v0 exchange has no error frame: the connection closes.
                let (_, logged) = self.explain(failure);
                self.sasl.failures.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(self.sasl.failure_delay).await;
                Outcome::Close(None, logged)
            }
        }
    }

    async fn failed(&mut self, failure: Failure) -> Outcome {
        let (told, logged) = self.explain(failure);
        self.sasl.failures.fetch_add(1, Ordering::Relaxed);
        self.exchange = None;
        tokio::time::sleep(self.sasl.failure_delay).await;
        Outcome::Close(
            Some(kafka_protocol::messages::ResponseKind::SaslAuthenticate(
                SaslAuthenticateResponse::default()
                    .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                    .with_error_message(Some(str_bytes(told))),
            )),
            logged,
        )
    }

    /// What the client is told of `failure`, and why the connection closes
    /// (for the log). Kafka's generic message says "during
    /// re-authentication" on a connection that had authenticated.
    fn explain(&self, failure: Failure) -> (String, String) {
        match failure {
            Failure::Told(message) => (message.clone(), message),
            Failure::Invalid(mechanism, reason) => {
                let told = format!(
                    "Authentication failed during {} due to invalid credentials with SASL mechanism {}",
                    if self.authenticated {
                        "re-authentication"
                    } else {
                        "authentication"
                    },
                    mechanism.name()
                );
                let logged = format!("{told} ({reason})");
                (told, logged)
            }
        }
    }

    /// Records a successful exchange; the session lifetime to report.
    fn complete(
        &mut self,
        principal: String,
        expires: Option<SystemTime>,
    ) -> Result<Option<Duration>, Failure> {
        let mechanism = self
            .mechanism
            .ok_or_else(|| Failure::Told("no SASL exchange under way".to_owned()))?;
        let principal = format!("User:{principal}");
        if self.authenticated && *self.principal != *principal {
            return Err(Failure::Told(format!(
                "re-authentication as {principal} on a connection authenticated as {}",
                self.principal
            )));
        }
        // Kafka's session lifetime: the credential's (an OAUTHBEARER
        // token's expiry) and `connections_max_reauth`, whichever is set
        // and sooner; none when neither is. A token's expiry holds without
        // `connections_max_reauth` too: a connection whose token expired
        // must re-authenticate or is closed.
        let until_expiry = expires.map(|at| at.duration_since(SystemTime::now()).unwrap_or_default());
        let lifetime = match (until_expiry, self.sasl.reauth) {
            (Some(token), Some(reauth)) => Some(token.min(reauth)),
            (token, reauth) => token.or(reauth),
        };
        self.expires = lifetime.map(|d| Instant::now() + d);
        if !self.authenticated {
            tracing::debug!(principal, mechanism = mechanism.name(), "authenticated");
        }
        self.principal = Arc::from(principal);
        self.authenticated = true;
        self.sasl.successes.fetch_add(1, Ordering::Relaxed);
        Ok(lifetime)
    }

    /// One step of the exchange under way; on success or failure the
    /// exchange is over.
    async fn step(&mut self, storage: &dyn Storage, token: &[u8]) -> Result<Step, Failure> {
        match self.exchange.take() {
            Some(Exchange::Start(mechanism)) => {
                self.mechanism.get_or_insert(mechanism);
                match mechanism {
                    Mechanism::Scram(alg) => self.scram_first(storage, alg, token).await,
                    Mechanism::Plain => plain(storage, token, self.sasl.scram_iterations).await,
                    Mechanism::OAuthBearer => self.oauthbearer(token),
                }
            }
            Some(Exchange::OAuthRefused(message)) => Err(Failure::Told(message)),
            Some(Exchange::ScramFinal { state, user, alg }) => match state.client_final(token) {
                Ok(response) => Ok(Step::Done {
                    response,
                    principal: user,
                    expires: None,
                }),
                Err(e) => {
                    tracing::info!(user, error = %e, "SCRAM authentication failed");
                    Err(Failure::Invalid(
                        Mechanism::Scram(alg),
                        "SCRAM authentication failed".to_owned(),
                    ))
                }
            },
            None => Err(Failure::Told("no SASL exchange under way".to_owned())),
        }
    }

    async fn scram_first(
        &mut self,
        storage: &dyn Storage,
        alg: Algorithm,
        token: &[u8],
    ) -> Result<Step, Failure> {
        let first = scram::parse_client_first(token).map_err(|e| match e {
            // Kafka's ScramSaslServer tells this one.
            scram::ScramError::AuthzidMismatch => Failure::Told(
                "Authentication failed: Client requested an authorization id that is different from username"
                    .to_owned(),
            ),
            // The rest, Kafka's generic message: the detail may echo what
            // the client sent.
            e => {
                tracing::debug!(mechanism = alg.mechanism(), error = %e, "invalid SCRAM client-first message");
                Failure::Invalid(
                    Mechanism::Scram(alg),
                    "invalid SCRAM client-first message".to_owned(),
                )
            }
        })?;
        let user = first.username.clone();
        let credential = stored_credential(storage, alg, &user, Mechanism::Scram(alg)).await?;
        let Some(credential) = credential else {
            tracing::info!(
                user,
                mechanism = alg.mechanism(),
                "SCRAM authentication of an unknown user"
            );
            return Err(Failure::Invalid(
                Mechanism::Scram(alg),
                "SCRAM authentication of an unknown user".to_owned(),
            ));
        };
        let (state, message) = first.server_first(alg, credential);
        self.exchange = Some(Exchange::ScramFinal {
            state: Box::new(state),
            user,
            alg,
        });
        Ok(Step::Challenge(message))
    }

    fn oauthbearer(&mut self, token: &[u8]) -> Result<Step, Failure> {
        let Some(validator) = &self.sasl.jwt else {
            return Err(Failure::Invalid(
                Mechanism::OAuthBearer,
                "OAUTHBEARER is not configured".to_owned(),
            ));
        };
        // A malformed message fails with Kafka's generic message (its
        // OAuthBearerSaslServer throws a SaslException): the detail may
        // echo what the client sent.
        let initial = oauthbearer::parse(token).map_err(|e| {
            tracing::debug!(error = %e, "invalid OAUTHBEARER message");
            Failure::Invalid(Mechanism::OAuthBearer, "invalid OAUTHBEARER message".to_owned())
        })?;
        let message = match validator.validate(&initial.token, SystemTime::now()) {
            Ok(validated) if initial.authzid.as_ref().is_none_or(|a| *a == validated.subject) => {
                return Ok(Step::Done {
                    response: Vec::new(),
                    principal: validated.subject,
                    expires: Some(validated.expires_at),
                });
            }
            Ok(_) => "the authorization id is not the token's subject".to_owned(),
            Err(e) => format!("invalid OAUTHBEARER token: {e}"),
        };
        // RFC 7628 §3.2.2: an error challenge, then the failure once the
        // client acknowledges it. The reason is logged, not told: it would
        // tell an unauthenticated client the expected issuer, audience or
        // key ids (Kafka's failure message is the challenge's JSON).
        tracing::info!(reason = message, "OAUTHBEARER token refused");
        self.exchange = Some(Exchange::OAuthRefused(INVALID_TOKEN.to_owned()));
        Ok(Step::Challenge(INVALID_TOKEN.as_bytes().to_vec()))
    }
}

/// RFC 7628's error challenge for a refused token, and Kafka's failure
/// message after the client acknowledges it.
const INVALID_TOKEN: &str = r#"{"status":"invalid_token"}"#;

impl Failure {
    /// What an HTTP request's failure is logged with (the client is told
    /// nothing of it).
    fn reason(self) -> String {
        match self {
            Failure::Told(message) | Failure::Invalid(_, message) => message,
        }
    }
}

/// Why the connection closes when the session lifetime passed without a
/// re-authentication.
pub(crate) const SESSION_EXPIRED: &str =
    "the SASL session expired without re-authentication (its token's expiry, or sasl.connections_max_reauth)";

/// `user`'s stored `alg` credential. A credential that cannot be read
/// (Redis away, a record this release cannot decode) is logged and fails
/// the exchange with `mechanism`'s generic message: the client is told no
/// more than Kafka tells it.
async fn stored_credential(
    storage: &dyn Storage,
    alg: Algorithm,
    user: &str,
    mechanism: Mechanism,
) -> Result<Option<Credential>, Failure> {
    let unreadable = |why: String| {
        tracing::warn!(
            user,
            mechanism = alg.mechanism(),
            error = why,
            "cannot read a SCRAM credential"
        );
        Failure::Invalid(
            mechanism,
            format!("the {} credential cannot be read", alg.mechanism()),
        )
    };
    let stored = storage
        .scram_credential(alg.mechanism(), user)
        .await
        .map_err(|e| unreadable(e.to_string()))?;
    match stored {
        None => Ok(None),
        Some(json) => serde_json::from_str(&json)
            .map(Some)
            .map_err(|e| unreadable(format!("unreadable: {e}"))),
    }
}

/// PLAIN (RFC 4616): `authzid NUL authcid NUL password`, checked against
/// the user's SCRAM credential.
/// `unknown_user_iterations` as for [`check_password`].
async fn plain(storage: &dyn Storage, token: &[u8], unknown_user_iterations: u32) -> Result<Step, Failure> {
    // As Kafka's PlainSaslServer: at most four NUL-separated tokens are
    // counted, three are expected, and names are read as UTF-8 with
    // invalid sequences replaced.
    let tokens: Vec<&[u8]> = token.splitn(4, |b| *b == 0).collect();
    let [authzid, user, password] = tokens[..] else {
        tracing::debug!(tokens = tokens.len(), "invalid PLAIN message");
        return Err(Failure::Told(format!(
            "Invalid SASL/PLAIN response: expected 3 tokens, got {}",
            tokens.len()
        )));
    };
    let user = String::from_utf8_lossy(user);
    let user = &*user;
    // Kafka's PlainSaslServer's messages; an empty password is refused
    // before any key derivation.
    if user.is_empty() {
        return Err(Failure::Told(
            "Authentication failed: username not specified".to_owned(),
        ));
    }
    if password.is_empty() {
        return Err(Failure::Told(
            "Authentication failed: password not specified".to_owned(),
        ));
    }
    if !authzid.is_empty() && String::from_utf8_lossy(authzid) != user {
        return Err(Failure::Told(
            "Authentication failed: Client requested an authorization id that is different from username"
                .to_owned(),
        ));
    }
    if check_password(storage, user, password, unknown_user_iterations).await? {
        return Ok(Step::Done {
            response: Vec::new(),
            principal: user.to_owned(),
            expires: None,
        });
    }
    tracing::info!(user, "PLAIN authentication failed");
    Err(Failure::Told(
        "Authentication failed: Invalid username or password".to_owned(),
    ))
}

/// At most this many password derivations (PBKDF2, up to 16384 rounds)
/// run at once, on the blocking pool: a flood of PLAIN or HTTP Basic
/// attempts waits here rather than taking the runtime's worker threads (and
/// every other connection with them) or filling the blocking pool.
static DERIVATIONS: LazyLock<tokio::sync::Semaphore> = LazyLock::new(|| {
    tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))
});

/// Whether `password` is `user`'s: it must match each SCRAM credential the
/// user has (SCRAM-SHA-512's and SCRAM-SHA-256's), so a password changed
/// for one mechanism alone (`ketch users set --mechanism`, AlterUserScram-
/// Credentials) leaves neither password taken until the other is changed
/// too, rather than the old one still taken. `Err` when the store cannot
/// be read. Every check derives one key per mechanism, for a mechanism the
/// user lacks (or a user that does not exist) at `unknown_user_iterations`
/// (`sasl.scram_iterations`), so that timing tells no user names. The
/// derivations run off the async runtime, at most [`DERIVATIONS`] at once.
async fn check_password(
    storage: &dyn Storage,
    user: &str,
    password: &[u8],
    unknown_user_iterations: u32,
) -> Result<bool, Failure> {
    const MECHANISMS: [Algorithm; 2] = [Algorithm::Sha512, Algorithm::Sha256];
    let mut known = Vec::with_capacity(MECHANISMS.len());
    for alg in MECHANISMS {
        known.push(stored_credential(storage, alg, user, Mechanism::Plain).await?);
    }
    // The semaphore is never closed.
    let permit = DERIVATIONS.acquire().await.ok();
    let password = password.to_vec();
    // The permit moves into the task: should this future be dropped, the
    // derivation still counts until it ends.
    let derived = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let mut any = false;
        let mut all = true;
        for (alg, credential) in MECHANISMS.into_iter().zip(known) {
            match credential {
                Some(credential) => {
                    any = true;
                    all &= credential.verify_password(alg, &password);
                }
                // None stored: a key derived all the same.
                None => {
                    let _ = Credential::generate(alg, &password, unknown_user_iterations);
                }
            }
        }
        any && all
    })
    .await;
    derived.map_err(|e| {
        tracing::error!(user, error = %e, "the password derivation failed");
        Failure::Invalid(Mechanism::Plain, "the password derivation failed".to_owned())
    })
}

impl Sasl {
    /// HTTP Basic: the principal when `password` is `user`'s, with the
    /// failure delay and counters of a failed SASL authentication.
    pub async fn basic(&self, storage: &dyn Storage, user: &str, password: &str) -> Result<String, String> {
        match check_password(storage, user, password.as_bytes(), self.scram_iterations).await {
            Ok(true) => {
                self.successes.fetch_add(1, Ordering::Relaxed);
                Ok(format!("User:{user}"))
            }
            Ok(false) => Err(self.fail(format!("invalid credentials for {user}")).await),
            Err(failure) => Err(self.fail(failure.reason()).await),
        }
    }

    /// A bearer token, checked as OAUTHBEARER tokens are: the principal.
    pub async fn bearer(&self, token: &str) -> Result<String, String> {
        let Some(validator) = &self.jwt else {
            return Err(self
                .fail(
                    "bearer tokens are not configured (sasl.oauth_jwks_file, sasl.oauth_public_key_file)"
                        .to_owned(),
                )
                .await);
        };
        match validator.validate(token, SystemTime::now()) {
            Ok(validated) => {
                self.successes.fetch_add(1, Ordering::Relaxed);
                Ok(format!("User:{}", validated.subject))
            }
            Err(e) => Err(self.fail(format!("invalid token: {e}")).await),
        }
    }

    /// Counts a failed authentication and waits
    /// `sasl.failed_authentication_delay`; `message`, for the log.
    pub(crate) async fn fail(&self, message: String) -> String {
        self.failures.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(self.failure_delay).await;
        message
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use kafka_protocol::messages::ResponseKind;

    use super::*;
    use crate::memory::MemoryStorage;

    fn sasl(reauth: &str) -> Arc<Sasl> {
        let mut settings = Settings::default();
        settings.sasl.plain_without_tls = true;
        settings.sasl.connections_max_reauth = reauth.parse().unwrap();
        settings.sasl.failed_authentication_delay = ketch_config::Duration::from_millis(0);
        Arc::new(Sasl::new(&settings).unwrap())
    }

    async fn storage_with(user: &str, password: &str) -> MemoryStorage {
        let storage = MemoryStorage::default();
        let credential = Credential::generate(Algorithm::Sha512, password.as_bytes(), 4096);
        storage
            .set_scram_credential(
                "SCRAM-SHA-512",
                user,
                &serde_json::to_string(&credential).unwrap(),
            )
            .await
            .unwrap();
        storage
    }

    fn handshake(mechanism: &str) -> SaslHandshakeRequest {
        SaslHandshakeRequest::default().with_mechanism(str_bytes(mechanism))
    }

    fn plain(user: &str, password: &str) -> SaslAuthenticateRequest {
        SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(format!("\0{user}\0{password}")))
    }

    /// As if the last re-authentication had begun two seconds ago.
    fn backdate_reauth(session: &mut Session) {
        session.last_reauth = session
            .last_reauth
            .map(|at| at.checked_sub(Duration::from_secs(2)).unwrap_or(at));
    }

    /// The error message of a SaslAuthenticate answer.
    fn message(outcome: &Outcome) -> Option<String> {
        match outcome {
            Outcome::Answer(ResponseKind::SaslAuthenticate(r))
            | Outcome::Close(Some(ResponseKind::SaslAuthenticate(r)), _) => {
                r.error_message.as_ref().map(|m| m.to_string())
            }
            _ => None,
        }
    }

    fn code(outcome: &Outcome) -> Option<i16> {
        match outcome {
            Outcome::Answer(ResponseKind::SaslAuthenticate(r)) => Some(r.error_code),
            Outcome::Answer(ResponseKind::SaslHandshake(r)) => Some(r.error_code),
            Outcome::Close(Some(ResponseKind::SaslAuthenticate(r)), _) => Some(r.error_code),
            Outcome::Close(Some(ResponseKind::SaslHandshake(r)), _) => Some(r.error_code),
            _ => None,
        }
    }

    #[tokio::test]
    async fn plain_authenticates_against_the_scram_credential_and_reports_the_session_lifetime() {
        let storage = storage_with("alice", "pw").await;
        let mut session = Session::new(sasl("1h"), false, Arc::from("User:ANONYMOUS"));
        assert!(!session.authenticated());
        assert_eq!(code(&session.handshake(1, &handshake("PLAIN"))), Some(0));
        let outcome = session.authenticate(&storage, 1, &plain("alice", "pw")).await;
        let Outcome::Answer(ResponseKind::SaslAuthenticate(answer)) = outcome else {
            panic!("not answered")
        };
        assert_eq!(answer.error_code, 0);
        assert!(
            (3_599_000..=3_600_000).contains(&answer.session_lifetime_ms),
            "{answer:?}"
        );
        assert!(session.authenticated());
        assert_eq!(&*session.principal(), "User:alice");
        assert!(!session.expired());
    }

    /// A token's expiry bounds the session whether or not
    /// `connections_max_reauth` is set (Kafka's
    /// `calcCompletionTimesAndReturnSessionLifetimeMs`).
    #[test]
    fn a_tokens_expiry_bounds_the_session_without_a_reauth_setting() {
        let mut session = Session::new(sasl("0s"), false, Arc::from("User:ANONYMOUS"));
        session.mechanism = Some(Mechanism::OAuthBearer);
        let lifetime = session
            .complete(
                "svc".to_owned(),
                Some(SystemTime::now() + Duration::from_secs(60)),
            )
            .unwrap()
            .expect("a lifetime");
        assert!((59..=60).contains(&lifetime.as_secs()), "{lifetime:?}");
        assert!(!session.expired());
        // Already expired: a lifetime of 0, and the next request closes.
        let lifetime = session
            .complete("svc".to_owned(), Some(SystemTime::now()))
            .unwrap();
        assert_eq!(lifetime, Some(Duration::ZERO));
        assert!(session.expired());
        // No expiry and no setting: no lifetime.
        let mut plain = Session::new(sasl("0s"), false, Arc::from("User:ANONYMOUS"));
        plain.mechanism = Some(Mechanism::Plain);
        assert_eq!(plain.complete("alice".to_owned(), None).unwrap(), None);
        assert!(!plain.expired());
        // Both: the sooner.
        let mut both = Session::new(sasl("10s"), false, Arc::from("User:ANONYMOUS"));
        both.mechanism = Some(Mechanism::OAuthBearer);
        let lifetime = both
            .complete(
                "svc".to_owned(),
                Some(SystemTime::now() + Duration::from_secs(60)),
            )
            .unwrap();
        assert_eq!(lifetime, Some(Duration::from_secs(10)));
    }

    #[tokio::test]
    async fn a_wrong_password_fails_closes_and_counts() {
        let storage = storage_with("alice", "pw").await;
        let sasl = sasl("0s");
        let mut session = Session::new(sasl.clone(), false, Arc::from("User:ANONYMOUS"));
        session.handshake(1, &handshake("PLAIN"));
        let outcome = session.authenticate(&storage, 1, &plain("alice", "nope")).await;
        assert!(matches!(outcome, Outcome::Close(Some(_), _)));
        assert_eq!(
            code(&outcome),
            Some(ResponseError::SaslAuthenticationFailed.code())
        );
        assert!(!session.authenticated());
        assert_eq!(sasl.failures.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn re_authentication_keeps_the_principal_and_the_mechanism() {
        let storage = storage_with("alice", "pw").await;
        let credential = Credential::generate(Algorithm::Sha512, b"pw2", 4096);
        storage
            .set_scram_credential(
                "SCRAM-SHA-512",
                "bob",
                &serde_json::to_string(&credential).unwrap(),
            )
            .await
            .unwrap();
        let mut session = Session::new(sasl("1h"), false, Arc::from("User:ANONYMOUS"));
        session.handshake(1, &handshake("PLAIN"));
        session.authenticate(&storage, 2, &plain("alice", "pw")).await;
        assert!(session.authenticated());
        // Re-authenticating as alice again works.
        assert_eq!(code(&session.handshake(1, &handshake("PLAIN"))), Some(0));
        assert!(!session.authenticated(), "nothing else is served mid-exchange");
        assert_eq!(
            code(&session.authenticate(&storage, 2, &plain("alice", "pw")).await),
            Some(0)
        );
        // As bob, no (a second after the last re-authentication began).
        backdate_reauth(&mut session);
        assert_eq!(code(&session.handshake(1, &handshake("PLAIN"))), Some(0));
        let outcome = session.authenticate(&storage, 2, &plain("bob", "pw2")).await;
        assert_eq!(
            code(&outcome),
            Some(ResponseError::SaslAuthenticationFailed.code())
        );
        // With another mechanism, no.
        let mut session = Session::new(sasl("1h"), false, Arc::from("User:ANONYMOUS"));
        session.handshake(1, &handshake("PLAIN"));
        session.authenticate(&storage, 2, &plain("alice", "pw")).await;
        let outcome = session.handshake(1, &handshake("SCRAM-SHA-512"));
        assert_eq!(code(&outcome), Some(ResponseError::IllegalSaslState.code()));
    }

    #[tokio::test]
    async fn handshakes_refuse_what_is_not_offered_and_authenticate_needs_one() {
        let storage = MemoryStorage::default();
        let mut session = Session::new(sasl("0s"), false, Arc::from("User:ANONYMOUS"));
        let outcome = session.authenticate(&storage, 1, &plain("a", "b")).await;
        assert_eq!(code(&outcome), Some(ResponseError::IllegalSaslState.code()));
        let outcome = session.handshake(1, &handshake("GSSAPI"));
        assert_eq!(
            code(&outcome),
            Some(ResponseError::UnsupportedSaslMechanism.code())
        );
        // PLAIN is not offered without TLS unless allowed.
        let mut settings = Settings::default();
        settings.sasl.failed_authentication_delay = ketch_config::Duration::from_millis(0);
        let strict = Arc::new(Sasl::new(&settings).unwrap());
        let mut session = Session::new(strict.clone(), false, Arc::from("User:ANONYMOUS"));
        let outcome = session.handshake(1, &handshake("PLAIN"));
        assert_eq!(
            code(&outcome),
            Some(ResponseError::UnsupportedSaslMechanism.code())
        );
        let mut session = Session::new(strict, true, Arc::from("User:ANONYMOUS"));
        assert_eq!(code(&session.handshake(1, &handshake("PLAIN"))), Some(0));
    }

    #[tokio::test]
    async fn a_v0_handshake_exchanges_raw_tokens() {
        let storage = storage_with("alice", "pw").await;
        let mut session = Session::new(sasl("0s"), false, Arc::from("User:ANONYMOUS"));
        assert_eq!(code(&session.handshake(0, &handshake("PLAIN"))), Some(0));
        assert!(session.expects_raw_token());
        let outcome = session.raw_token(&storage, b"\0alice\0pw").await;
        assert!(matches!(outcome, Outcome::Raw(ref token) if token.is_empty()));
        assert!(!session.expects_raw_token());
        assert!(session.authenticated());
        // A bad raw token closes the connection without an answer.
        let mut session = Session::new(sasl("0s"), false, Arc::from("User:ANONYMOUS"));
        session.handshake(0, &handshake("PLAIN"));
        assert!(matches!(
            session.raw_token(&storage, b"garbage").await,
            Outcome::Close(None, _)
        ));
    }

    /// KIP-368 as Kafka gates it: without a session lifetime a SaslHandshake
    /// after authentication is answered ILLEGAL_SASL_STATE (no mechanisms)
    /// and the connection goes on, as is a SaslAuthenticate after
    /// authentication; a v0 handshake too.
    #[tokio::test]
    async fn without_a_session_lifetime_sasl_requests_after_authentication_are_refused_and_kept() {
        let storage = storage_with("alice", "pw").await;
        let mut session = Session::new(sasl("0s"), false, Arc::from("User:ANONYMOUS"));
        session.handshake(1, &handshake("PLAIN"));
        let outcome = session.authenticate(&storage, 2, &plain("alice", "pw")).await;
        assert_eq!(code(&outcome), Some(0));
        for version in [1, 0] {
            let outcome = session.handshake(version, &handshake("PLAIN"));
            let Outcome::Answer(ResponseKind::SaslHandshake(answer)) = outcome else {
                panic!("v{version}: not answered and kept")
            };
            assert_eq!(answer.error_code, ResponseError::IllegalSaslState.code());
            assert!(answer.mechanisms.is_empty(), "{answer:?}");
            assert!(session.authenticated() && !session.expects_raw_token());
        }
        let outcome = session.authenticate(&storage, 2, &plain("alice", "pw")).await;
        assert!(matches!(outcome, Outcome::Answer(_)), "the connection is kept");
        assert_eq!(code(&outcome), Some(ResponseError::IllegalSaslState.code()));
        assert_eq!(
            message(&outcome).as_deref(),
            Some("SaslAuthenticate request received after successful authentication")
        );
        assert!(session.authenticated());
        assert_eq!(&*session.principal(), "User:alice");
    }

    /// A re-authentication may begin a second after the last one began at
    /// the earliest (the first right after authenticating); one that came
    /// too soon is refused and the connection kept, unless its session
    /// expired, which closes it.
    #[tokio::test]
    async fn re_authentications_are_a_second_apart_at_least() {
        let storage = storage_with("alice", "pw").await;
        let mut session = Session::new(sasl("1h"), false, Arc::from("User:ANONYMOUS"));
        session.handshake(1, &handshake("PLAIN"));
        session.authenticate(&storage, 2, &plain("alice", "pw")).await;
        assert_eq!(code(&session.handshake(1, &handshake("PLAIN"))), Some(0));
        assert_eq!(
            code(&session.authenticate(&storage, 2, &plain("alice", "pw")).await),
            Some(0)
        );
        let outcome = session.handshake(1, &handshake("PLAIN"));
        assert!(matches!(outcome, Outcome::Answer(_)));
        assert_eq!(code(&outcome), Some(ResponseError::IllegalSaslState.code()));
        assert!(session.authenticated());
        backdate_reauth(&mut session);
        assert_eq!(code(&session.handshake(1, &handshake("PLAIN"))), Some(0));
        assert_eq!(
            code(&session.authenticate(&storage, 2, &plain("alice", "pw")).await),
            Some(0)
        );
        // Too soon, and the session has run out: closed, unanswered.
        session.expires = Some(Instant::now());
        assert!(matches!(
            session.handshake(1, &handshake("PLAIN")),
            Outcome::Close(None, _)
        ));
        let outcome = session.authenticate(&storage, 2, &plain("alice", "pw")).await;
        assert!(matches!(outcome, Outcome::Close(None, _)));
    }

    /// Malformed SCRAM messages fail with Kafka's generic message, "during
    /// re-authentication" when re-authenticating; PLAIN's with Kafka's
    /// PlainSaslServer's.
    #[tokio::test]
    async fn malformed_messages_are_told_kafkas_generic_failure() {
        let storage = storage_with("alice", "pw").await;
        let garbage = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"\xff,n=x,r"));
        let mut session = Session::new(sasl("0s"), false, Arc::from("User:ANONYMOUS"));
        session.handshake(1, &handshake("SCRAM-SHA-512"));
        let outcome = session.authenticate(&storage, 2, &garbage).await;
        assert_eq!(
            code(&outcome),
            Some(ResponseError::SaslAuthenticationFailed.code())
        );
        assert_eq!(
            message(&outcome).as_deref(),
            Some(
                "Authentication failed during authentication due to invalid credentials with SASL \
                 mechanism SCRAM-SHA-512"
            )
        );
        let Outcome::Close(_, why) = &outcome else {
            panic!("not closed")
        };
        assert!(why.contains("invalid SCRAM client-first message"), "{why}");
        // Re-authenticating.
        let mut session = Session::new(sasl("1h"), false, Arc::from("User:ANONYMOUS"));
        session.authenticated = true;
        session.principal = Arc::from("User:alice");
        session.mechanism = Some(Mechanism::Scram(Algorithm::Sha512));
        session.expires = Some(Instant::now() + Duration::from_secs(3600));
        assert_eq!(code(&session.handshake(1, &handshake("SCRAM-SHA-512"))), Some(0));
        let outcome = session.authenticate(&storage, 2, &garbage).await;
        assert_eq!(
            message(&outcome).as_deref(),
            Some(
                "Authentication failed during re-authentication due to invalid credentials with SASL \
                 mechanism SCRAM-SHA-512"
            )
        );
        // An authorization id other than the user: Kafka's own message.
        let mut session = Session::new(sasl("0s"), false, Arc::from("User:ANONYMOUS"));
        session.handshake(1, &handshake("SCRAM-SHA-512"));
        let other =
            SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"n,a=bob,n=alice,r=abc"));
        let outcome = session.authenticate(&storage, 2, &other).await;
        assert_eq!(
            message(&outcome).as_deref(),
            Some(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        );
        // PLAIN.
        for (token, tokens) in [
            (&b"alice"[..], 1),
            (b"\0alice", 2),
            (b"\0alice\0pw\0", 4),
            (b"a\0b\0c\0d\0e", 4),
        ] {
            let mut session = Session::new(sasl("0s"), false, Arc::from("User:ANONYMOUS"));
            session.handshake(1, &handshake("PLAIN"));
            let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(token));
            let outcome = session.authenticate(&storage, 2, &request).await;
            assert_eq!(
                message(&outcome),
                Some(format!(
                    "Invalid SASL/PLAIN response: expected 3 tokens, got {tokens}"
                )),
                "{token:?}"
            );
        }
    }

    /// PLAIN (and HTTP Basic) take a password only when it matches every
    /// SCRAM credential the user has: one changed for one mechanism alone
    /// left the old password taken (SCRAM-SHA-512's was the only one
    /// checked) and the new one refused.
    #[tokio::test]
    async fn a_password_must_match_each_credential_the_user_has() {
        let storage = storage_with("alice", "old").await;
        let check = |password: &'static [u8]| {
            let storage = &storage;
            async move { check_password(storage, "alice", password, 4096).await.unwrap() }
        };
        assert!(check(b"old").await);
        let set = |alg, mechanism, password: &'static [u8]| {
            let storage = &storage;
            async move {
                let credential = Credential::generate(alg, password, 4096);
                storage
                    .set_scram_credential(mechanism, "alice", &serde_json::to_string(&credential).unwrap())
                    .await
                    .unwrap();
            }
        };
        set(Algorithm::Sha256, "SCRAM-SHA-256", b"new").await;
        assert!(
            !check(b"old").await,
            "the old password after SCRAM-SHA-256's changed"
        );
        assert!(!check(b"new").await, "SCRAM-SHA-512's is still the old one");
        set(Algorithm::Sha512, "SCRAM-SHA-512", b"new").await;
        assert!(check(b"new").await);
        assert!(!check(b"old").await);
    }

    /// The key derivation runs off the runtime's threads: a current-thread
    /// runtime goes on serving its other tasks meanwhile (an unknown user's
    /// password costs a derivation too).
    #[tokio::test(flavor = "current_thread")]
    async fn password_derivations_leave_the_runtime_free() {
        let storage = Arc::new(MemoryStorage::default());
        let check = tokio::spawn({
            let storage = storage.clone();
            async move {
                for _ in 0..3 {
                    let known =
                        check_password(storage.as_ref(), "nobody", b"pw", Credential::MAX_ITERATIONS).await;
                    assert!(matches!(known, Ok(false)));
                }
            }
        });
        let mut turns = 0u64;
        while !check.is_finished() {
            tokio::task::yield_now().await;
            turns += 1;
        }
        check.await.unwrap();
        assert!(
            turns > 100,
            "only {turns} turns of the runtime during three derivations"
        );
    }
}
