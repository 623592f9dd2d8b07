//! The OAUTHBEARER client initial response (RFC 7628 §3.1), parsed by the
//! rules of Kafka's `OAuthBearerClientInitialResponse`:
//!
//! ```text
//! gs2-header \x01 auth=Bearer <token> \x01 [key=value \x01]* \x01
//! ```
//!
//! with gs2-header `n,[a=authzid],`. The token is only extracted here; the
//! caller validates it (see `auth::jwt`) and, as Kafka does, refuses an
//! authzid that differs from the token's principal.

/// Longest initial response we accept: a JWT is bounded by the validator
/// ([`super::jwt::MAX_TOKEN_LEN`]), plus room for the header and a few
/// extensions (the SASL frame before authentication bounds it anyway).
pub const MAX_MESSAGE_LEN: usize = super::jwt::MAX_TOKEN_LEN + 4 * 1024;

const SEPARATOR: char = '\x01';

/// Why an initial response was refused. Messages never include the token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OAuthBearerError {
    #[error("OAUTHBEARER message is {0} bytes, over the {MAX_MESSAGE_LEN}-byte limit")]
    TooLong(usize),
    #[error("OAUTHBEARER message is not valid UTF-8")]
    NotUtf8,
    #[error("invalid OAUTHBEARER gs2 header: {0}")]
    Gs2Header(&'static str),
    #[error("channel binding is not supported by OAUTHBEARER")]
    ChannelBinding,
    #[error("invalid OAUTHBEARER client first message: {0}")]
    Malformed(&'static str),
    #[error("invalid OAUTHBEARER client first message: 'auth' not specified")]
    MissingAuth,
    #[error("invalid OAUTHBEARER client first message: invalid 'auth' format")]
    InvalidAuth,
    #[error("invalid scheme in OAUTHBEARER client first message (expected Bearer)")]
    InvalidScheme,
    #[error("extension name '{0}' is invalid")]
    InvalidExtensionName(String),
    #[error("extension value for extension '{0}' is invalid")]
    InvalidExtensionValue(String),
    #[error("extension '{0}' appears twice")]
    DuplicateExtension(String),
}

/// The parts of a client initial response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialResponse {
    pub token: String,
    /// The authorization id from the gs2 header, `=2C` and `=3D` decoded.
    pub authzid: Option<String>,
    /// Extensions other than `auth`, in the order sent.
    pub extensions: Vec<(String, String)>,
}

pub fn parse(message: &[u8]) -> Result<InitialResponse, OAuthBearerError> {
    if message.len() > MAX_MESSAGE_LEN {
        return Err(OAuthBearerError::TooLong(message.len()));
    }
    let text = std::str::from_utf8(message).map_err(|_| OAuthBearerError::NotUtf8)?;
    let (gs2_header, pairs) = text
        .split_once(SEPARATOR)
        .ok_or(OAuthBearerError::Malformed("no separator after the gs2 header"))?;
    let authzid = parse_gs2_header(gs2_header)?;
    let pairs = pairs.strip_suffix(SEPARATOR).ok_or(OAuthBearerError::Malformed(
        "message does not end with the final separator",
    ))?;
    let mut token = None;
    let mut extensions: Vec<(String, String)> = Vec::new();
    for pair in split_pairs(pairs)? {
        let (key, value) = pair
            .split_once('=')
            .ok_or(OAuthBearerError::Malformed("key without '='"))?;
        if key == "auth" {
            if token.is_some() {
                return Err(OAuthBearerError::DuplicateExtension(key.to_owned()));
            }
            token = Some(parse_auth(value)?);
            continue;
        }
        check_extension(key, value)?;
        if extensions.iter().any(|(known, _)| known == key) {
            return Err(OAuthBearerError::DuplicateExtension(key.to_owned()));
        }
        extensions.push((key.to_owned(), value.to_owned()));
    }
    let token = token.ok_or(OAuthBearerError::MissingAuth)?;
    Ok(InitialResponse {
        token,
        authzid,
        extensions,
    })
}

/// `n,,` or `n,a=authzid,` (`y` too: the client could bind but thinks we
/// cannot, which is true). `p=` asks for channel binding, which OAUTHBEARER lacks.
fn parse_gs2_header(header: &str) -> Result<Option<String>, OAuthBearerError> {
    let (flag, rest) = header
        .split_once(',')
        .ok_or(OAuthBearerError::Gs2Header("missing ','"))?;
    match flag {
        "n" | "y" => {}
        flag if flag.starts_with("p=") => return Err(OAuthBearerError::ChannelBinding),
        _ => return Err(OAuthBearerError::Gs2Header("unknown channel binding flag")),
    }
    let authzid = rest
        .strip_suffix(',')
        .ok_or(OAuthBearerError::Gs2Header("missing final ','"))?;
    if authzid.is_empty() {
        return Ok(None);
    }
    let name = authzid
        .strip_prefix("a=")
        .ok_or(OAuthBearerError::Gs2Header("bad authzid"))?;
    decode_saslname(name).map(Some)
}

/// Splits `k=v\x01k=v\x01` (the part between the gs2 header and the final
/// separator) into pairs; each pair must end with a separator.
fn split_pairs(pairs: &str) -> Result<Vec<&str>, OAuthBearerError> {
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let body = pairs
        .strip_suffix(SEPARATOR)
        .ok_or(OAuthBearerError::Malformed("unterminated key=value pair"))?;
    let split: Vec<&str> = body.split(SEPARATOR).collect();
    if split.iter().any(|pair| pair.is_empty()) {
        return Err(OAuthBearerError::Malformed("empty key=value pair"));
    }
    Ok(split)
}

/// `Bearer <token>`: scheme case-insensitive, one or more spaces, and a token
/// of the characters Kafka allows (`[-_.a-zA-Z0-9]+`, which covers every JWT).
fn parse_auth(value: &str) -> Result<String, OAuthBearerError> {
    let (scheme, token) = value.split_once(' ').ok_or(OAuthBearerError::InvalidAuth)?;
    let token = token.trim_start_matches(' ');
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let is_token = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if scheme.is_empty() || !scheme.chars().all(is_word) || token.is_empty() || !token.chars().all(is_token) {
        return Err(OAuthBearerError::InvalidAuth);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(OAuthBearerError::InvalidScheme);
    }
    Ok(token.to_owned())
}

/// Kafka's `validateExtensions`: key `[A-Za-z]+`, value `[\x21-\x7E \t\r\n]*`.
fn check_extension(key: &str, value: &str) -> Result<(), OAuthBearerError> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(OAuthBearerError::InvalidExtensionName(truncated(key)));
    }
    if !value
        .bytes()
        .all(|b| (0x21..=0x7e).contains(&b) || matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
    {
        return Err(OAuthBearerError::InvalidExtensionValue(key.to_owned()));
    }
    Ok(())
}

/// A client-chosen string cut short enough to put in an error message.
fn truncated(text: &str) -> String {
    text.chars().take(64).collect()
}

/// Decodes a saslname (`=2C` → ',', `=3D` → '='); any other '=' or a ',' is an error.
fn decode_saslname(name: &str) -> Result<String, OAuthBearerError> {
    let bad = OAuthBearerError::Gs2Header("bad authzid");
    if name.is_empty() || name.contains(',') || name.contains('\0') {
        return Err(bad);
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(position) = rest.find('=') {
        out.push_str(&rest[..position]);
        match rest.get(position..position + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(bad),
        }
        rest = &rest[position + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JWT: &str = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl";

    #[test]
    fn librdkafka_message() {
        let message = format!("n,,\x01auth=Bearer {JWT}\x01\x01");
        let parsed = parse(message.as_bytes()).unwrap();
        assert_eq!(
            parsed,
            InitialResponse {
                token: JWT.into(),
                authzid: None,
                extensions: vec![]
            }
        );
    }

    #[test]
    fn java_client_message_with_authzid_and_extensions() {
        let message = format!(
            "n,a=al=2Cice,\x01auth=bearer   {JWT}\x01traceId=abc 123\x01logicalCluster=lkc-1\x01\x01"
        );
        let parsed = parse(message.as_bytes()).unwrap();
        assert_eq!(parsed.token, JWT);
        assert_eq!(parsed.authzid.as_deref(), Some("al,ice"));
        assert_eq!(
            parsed.extensions,
            vec![
                ("traceId".into(), "abc 123".into()),
                ("logicalCluster".into(), "lkc-1".into())
            ]
        );
    }

    #[test]
    fn auth_may_follow_extensions_and_values_may_be_empty() {
        let parsed = parse(format!("n,,\x01x=\x01auth=Bearer {JWT}\x01\x01").as_bytes()).unwrap();
        assert_eq!(parsed.extensions, vec![("x".into(), String::new())]);
    }

    fn refused(message: &str) -> OAuthBearerError {
        parse(message.as_bytes()).unwrap_err()
    }

    #[test]
    fn refusals() {
        let auth = format!("auth=Bearer {JWT}");
        assert_eq!(refused("n,,\x01\x01"), OAuthBearerError::MissingAuth);
        assert_eq!(refused("n,,\x01x=y\x01\x01"), OAuthBearerError::MissingAuth);
        assert_eq!(
            refused(&format!("p=tls-unique,,\x01{auth}\x01\x01")),
            OAuthBearerError::ChannelBinding
        );
        assert_eq!(
            refused(&format!("n,,\x01auth=Basic {JWT}\x01\x01")),
            OAuthBearerError::InvalidScheme
        );
        assert_eq!(
            refused("n,,\x01auth=Bearer\x01\x01"),
            OAuthBearerError::InvalidAuth
        );
        assert_eq!(
            refused("n,,\x01auth=Bearer a/b\x01\x01"),
            OAuthBearerError::InvalidAuth
        );
        assert_eq!(
            refused("n,,\x01auth=Bearer \x01\x01"),
            OAuthBearerError::InvalidAuth
        );
        assert_eq!(
            refused(&format!("n,,\x01{auth}\x01{auth}\x01\x01")),
            OAuthBearerError::DuplicateExtension("auth".into())
        );
        assert_eq!(
            refused(&format!("n,,\x01{auth}\x01a=1\x01a=2\x01\x01")),
            OAuthBearerError::DuplicateExtension("a".into())
        );
        assert_eq!(
            refused(&format!("n,,\x01{auth}\x01k1=v\x01\x01")),
            OAuthBearerError::InvalidExtensionName("k1".into())
        );
        assert_eq!(
            refused(&format!("n,,\x01{auth}\x01k=\u{e9}\x01\x01")),
            OAuthBearerError::InvalidExtensionValue("k".into())
        );
        assert!(matches!(
            refused(&format!("n,,\x01{auth}\x01\x01\x01")),
            OAuthBearerError::Malformed(_)
        ));
        assert!(matches!(
            refused(&format!("n,,\x01{auth}\x01")),
            OAuthBearerError::Malformed(_)
        ));
        assert!(matches!(
            refused(&format!("n,,\x01{auth}\x01k\x01\x01")),
            OAuthBearerError::Malformed(_)
        ));
        assert!(matches!(
            refused(&format!("n,a=x=41,\x01{auth}\x01\x01")),
            OAuthBearerError::Gs2Header(_)
        ));
        assert!(matches!(
            refused(&format!("n,b=x,\x01{auth}\x01\x01")),
            OAuthBearerError::Gs2Header(_)
        ));
        assert!(matches!(
            refused(&format!("x,,\x01{auth}\x01\x01")),
            OAuthBearerError::Gs2Header(_)
        ));
        assert!(matches!(
            refused(&format!("n,\x01{auth}\x01\x01")),
            OAuthBearerError::Gs2Header(_)
        ));
        assert_eq!(
            parse(&[b'n', b',', b',', 1, 0xff, 1]).unwrap_err(),
            OAuthBearerError::NotUtf8
        );
        let long = format!("n,,\x01auth=Bearer {}\x01\x01", "a".repeat(MAX_MESSAGE_LEN));
        assert!(matches!(refused(&long), OAuthBearerError::TooLong(_)));
    }

    #[test]
    fn every_truncation_is_refused() {
        let message = format!("n,a=bob,\x01auth=Bearer {JWT}\x01k=v\x01\x01");
        for end in 0..message.len() {
            assert!(
                parse(&message.as_bytes()[..end]).is_err(),
                "prefix of {end} bytes"
            );
        }
    }
}
