//! The mTLS principal: a client certificate's subject name printed as Java
//! prints it, then Kafka's `ssl.principal.mapping.rules` applied to it.
//!
//! ACLs written for a Kafka cluster name principals by that exact string, so
//! both steps follow the JDK (`X500Principal.getName()`) and Kafka
//! (`SslPrincipalMapper`) rather than a generic RFC 4514 printer.

use regex::{Captures, Regex};

/// Errors reading a certificate or parsing mapping rules.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum X509Error {
    #[error("malformed certificate: {0}")]
    Der(#[from] der::DerError),
    #[error("malformed certificate: {0}")]
    Malformed(&'static str),
    #[error("invalid ssl.principal.mapping.rules rule `{rule}`: {reason}")]
    InvalidRule { rule: String, reason: String },
}

/// A small bounded DER reader, shared with the JWT module's key parsing.
/// Only what certificates and public keys need: single-byte tags, definite
/// lengths up to 4 bytes, nothing read past the end of its input.
pub(crate) mod der {
    pub(crate) const INTEGER: u8 = 0x02;
    pub(crate) const BIT_STRING: u8 = 0x03;
    pub(crate) const OID: u8 = 0x06;
    pub(crate) const SEQUENCE: u8 = 0x30;
    pub(crate) const SET: u8 = 0x31;

    #[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
    pub enum DerError {
        #[error("DER is truncated")]
        Truncated,
        #[error("DER length is indefinite or too large")]
        BadLength,
        #[error("DER multi-byte tags are not supported")]
        HighTag,
        #[error("expected DER tag {expected:#04x}, found {found:#04x}")]
        UnexpectedTag { expected: u8, found: u8 },
        #[error("unexpected bytes after a DER element")]
        TrailingData,
        #[error("malformed DER object identifier")]
        BadOid,
    }

    /// One element: its tag, its contents and its whole encoding (tag and
    /// length included), which Java prints for unknown attribute values.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Element<'a> {
        pub(crate) tag: u8,
        pub(crate) contents: &'a [u8],
        pub(crate) encoded: &'a [u8],
    }

    pub(crate) struct Reader<'a> {
        data: &'a [u8],
    }

    impl<'a> Reader<'a> {
        pub(crate) fn new(data: &'a [u8]) -> Self {
            Self { data }
        }

        pub(crate) fn is_empty(&self) -> bool {
            self.data.is_empty()
        }

        pub(crate) fn peek_tag(&self) -> Option<u8> {
            self.data.first().copied()
        }

        pub(crate) fn read(&mut self) -> Result<Element<'a>, DerError> {
            let (&tag, rest) = self.data.split_first().ok_or(DerError::Truncated)?;
            if tag & 0x1f == 0x1f {
                return Err(DerError::HighTag);
            }
            let (&first, rest) = rest.split_first().ok_or(DerError::Truncated)?;
            let (len, rest) = match first {
                0..=0x7f => (usize::from(first), rest),
                0x81..=0x84 => long_length(usize::from(first & 0x7f), rest)?,
                _ => return Err(DerError::BadLength),
            };
            if len > rest.len() {
                return Err(DerError::Truncated);
            }
            let header_len = self.data.len() - rest.len();
            let (encoded, remaining) = self.data.split_at(header_len + len);
            self.data = remaining;
            Ok(Element {
                tag,
                contents: &rest[..len],
                encoded,
            })
        }

        /// The contents of the next element, which must have tag `expected`.
        pub(crate) fn expect(&mut self, expected: u8) -> Result<&'a [u8], DerError> {
            let element = self.read()?;
            if element.tag != expected {
                return Err(DerError::UnexpectedTag {
                    expected,
                    found: element.tag,
                });
            }
            Ok(element.contents)
        }

        /// Ends reading: anything left over means the structure was not what we parsed.
        pub(crate) fn finish(self) -> Result<(), DerError> {
            if self.data.is_empty() {
                Ok(())
            } else {
                Err(DerError::TrailingData)
            }
        }
    }

    fn long_length(count: usize, bytes: &[u8]) -> Result<(usize, &[u8]), DerError> {
        if bytes.len() < count {
            return Err(DerError::Truncated);
        }
        let (len_bytes, rest) = bytes.split_at(count);
        let len = len_bytes
            .iter()
            .fold(0usize, |len, &b| (len << 8) | usize::from(b));
        Ok((len, rest))
    }

    /// Reads one complete element with tag `expected` from `data`, which must hold nothing else.
    pub(crate) fn single(data: &[u8], expected: u8) -> Result<&[u8], DerError> {
        let mut reader = Reader::new(data);
        let contents = reader.expect(expected)?;
        reader.finish()?;
        Ok(contents)
    }

    /// The dotted form of an OBJECT IDENTIFIER's contents, e.g. "2.5.4.3".
    pub(crate) fn oid_to_string(contents: &[u8]) -> Result<String, DerError> {
        let mut arcs = Vec::new();
        let mut value: u64 = 0;
        let mut continuing = false;
        for &byte in contents {
            if !continuing && byte == 0x80 {
                return Err(DerError::BadOid); // non-minimal encoding
            }
            if value > u64::MAX >> 7 {
                return Err(DerError::BadOid);
            }
            value = (value << 7) | u64::from(byte & 0x7f);
            continuing = byte & 0x80 != 0;
            if !continuing {
                arcs.push(value);
                value = 0;
            }
        }
        let (&first, rest) = arcs.split_first().ok_or(DerError::BadOid)?;
        if continuing {
            return Err(DerError::BadOid);
        }
        let (top, second) = match first {
            0..=39 => (0, first),
            40..=79 => (1, first - 40),
            _ => (2, first - 80),
        };
        let mut text = format!("{top}.{second}");
        for arc in rest {
            text.push_str(&format!(".{arc}"));
        }
        Ok(text)
    }
}

use der::{Element, Reader};

/// Attribute types Java prints by keyword in RFC 2253 form (the JDK's
/// `AVAKeyword` entries marked RFC 2253 compliant); all others are dotted OIDs.
const KEYWORDS: &[(&str, &str)] = &[
    ("2.5.4.3", "CN"),
    ("2.5.4.6", "C"),
    ("2.5.4.7", "L"),
    ("2.5.4.8", "ST"),
    ("2.5.4.10", "O"),
    ("2.5.4.11", "OU"),
    ("2.5.4.9", "STREET"),
    ("0.9.2342.19200300.100.1.25", "DC"),
    ("0.9.2342.19200300.100.1.1", "UID"),
];

const TAG_UTF8_STRING: u8 = 12;
const TAG_PRINTABLE_STRING: u8 = 19;
const TAG_TELETEX_STRING: u8 = 20;
const TAG_IA5_STRING: u8 = 22;
const TAG_GENERAL_STRING: u8 = 27;
const TAG_BMP_STRING: u8 = 30;

/// Characters Java's `AVA.toRFC2253String` escapes wherever they appear.
const ESCAPED: &str = ",=+<>#;\"\\";

/// The subject distinguished name of a DER certificate as Java's
/// X500Principal.getName() (RFC 2253) prints it: RDNs most specific first,
/// e.g. "CN=alice,OU=eng,O=Example Corp,C=US"; well-known attribute types by
/// name (CN, C, L, ST, O, OU, STREET, DC, UID), others as dotted OID=#hex;
/// RFC 2253 escaping of , + " \ < > ; = and # anywhere, leading and trailing space.
pub fn subject_dn(certificate_der: &[u8]) -> Result<String, X509Error> {
    let certificate = der::single(certificate_der, der::SEQUENCE)?;
    let mut certificate = Reader::new(certificate);
    let mut tbs = Reader::new(certificate.expect(der::SEQUENCE)?);
    if tbs.peek_tag() == Some(0xa0) {
        tbs.read()?; // [0] EXPLICIT version
    }
    tbs.expect(der::INTEGER)?; // serialNumber
    tbs.expect(der::SEQUENCE)?; // signature AlgorithmIdentifier
    tbs.expect(der::SEQUENCE)?; // issuer
    tbs.expect(der::SEQUENCE)?; // validity
    format_name(tbs.expect(der::SEQUENCE)?)
}

/// A Name (RDNSequence) in RFC 2253 order: the DER holds the least specific
/// RDN first, the string starts with the most specific.
fn format_name(name: &[u8]) -> Result<String, X509Error> {
    let mut reader = Reader::new(name);
    let mut rdns = Vec::new();
    while !reader.is_empty() {
        rdns.push(format_rdn(reader.expect(der::SET)?)?);
    }
    rdns.reverse();
    Ok(rdns.join(","))
}

/// One RelativeDistinguishedName: its attributes in encoded order, joined by '+'.
fn format_rdn(set: &[u8]) -> Result<String, X509Error> {
    let mut reader = Reader::new(set);
    let mut attributes = Vec::new();
    while !reader.is_empty() {
        attributes.push(format_attribute(reader.expect(der::SEQUENCE)?)?);
    }
    if attributes.is_empty() {
        return Err(X509Error::Malformed("empty relative distinguished name"));
    }
    Ok(attributes.join("+"))
}

/// `type=value`. As in the JDK, a value is printed as a string only when the
/// type has a keyword and the value is a string type; otherwise as '#' and the
/// lower-case hex of its whole DER encoding.
fn format_attribute(sequence: &[u8]) -> Result<String, X509Error> {
    let mut reader = Reader::new(sequence);
    let oid = der::oid_to_string(reader.expect(der::OID)?)?;
    let value = reader.read()?;
    reader.finish()?;
    let keyword = KEYWORDS
        .iter()
        .find(|(known, _)| *known == oid)
        .map(|(_, keyword)| *keyword);
    match (keyword, decode_string(&value)?) {
        (Some(keyword), Some(text)) => Ok(format!("{keyword}={}", escape_value(&text))),
        _ => Ok(format!("{}=#{}", keyword.unwrap_or(&oid), hex(value.encoded))),
    }
}

/// The text of a directory string, `None` for a value of another type.
/// Invalid encodings are errors rather than replacement characters, so two
/// different certificates cannot print as the same principal.
fn decode_string(value: &Element<'_>) -> Result<Option<String>, X509Error> {
    let bytes = value.contents;
    let text = match value.tag {
        TAG_UTF8_STRING => {
            String::from_utf8(bytes.to_vec()).map_err(|_| X509Error::Malformed("invalid UTF8String"))?
        }
        TAG_PRINTABLE_STRING | TAG_IA5_STRING | TAG_GENERAL_STRING => {
            if !bytes.is_ascii() {
                return Err(X509Error::Malformed("non-ASCII byte in an ASCII string type"));
            }
            bytes.iter().map(|&b| char::from(b)).collect()
        }
        TAG_TELETEX_STRING => bytes.iter().map(|&b| char::from(b)).collect(), // as Latin-1
        TAG_BMP_STRING => decode_bmp(bytes)?,
        _ => return Ok(None),
    };
    Ok(Some(text))
}

fn decode_bmp(bytes: &[u8]) -> Result<String, X509Error> {
    if !bytes.len().is_multiple_of(2) {
        return Err(X509Error::Malformed("BMPString of odd length"));
    }
    let units: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
        .collect();
    String::from_utf16(&units).map_err(|_| X509Error::Malformed("invalid BMPString"))
}

/// Java's RFC 2253 value escaping: a backslash before each of `,=+<>#;"\`,
/// NUL as `\00`, and a backslash before leading and trailing spaces and CRs.
fn escape_value(text: &str) -> String {
    let mut escaped: Vec<char> = Vec::with_capacity(text.len());
    for c in text.chars() {
        if ESCAPED.contains(c) {
            escaped.extend(['\\', c]);
        } else if c == '\0' {
            escaped.extend(['\\', '0', '0']);
        } else {
            escaped.push(c);
        }
    }
    let is_blank = |c: &char| *c == ' ' || *c == '\r';
    let lead = escaped.iter().take_while(|c| is_blank(c)).count();
    let trail = escaped.len() - escaped.iter().rev().take_while(|c| is_blank(c)).count();
    let mut out = String::with_capacity(escaped.len() + 2);
    for (i, c) in escaped.into_iter().enumerate() {
        if i < lead || i >= trail {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Kafka's ssl.principal.mapping.rules: a comma-separated list of
/// `RULE:pattern/replacement/` with optional `L` or `U` suffix (lower/upper-case
/// the result) and `DEFAULT` (the DN unchanged). The first rule whose pattern
/// matches the whole DN wins; replacement uses $1.. groups.
#[derive(Debug)]
pub struct PrincipalMapper {
    rules: Vec<Rule>,
}

#[derive(Debug)]
enum Rule {
    Default,
    Pattern {
        whole: Regex,
        pattern: Regex,
        replacement: Vec<Piece>,
        case: Case,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Keep,
    Lower,
    Upper,
}

/// A parsed Java replacement string.
#[derive(Debug, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Group(usize),
    Named(String),
}

/// Kafka's `SslPrincipalMapper.RULE_PATTERN`; the regex crate picks the same
/// (leftmost-first) match as Java's backtracking engine for it, so splitting
/// and parsing agree with Kafka, including commas and `\/` inside patterns.
const RULE_PATTERN: &str = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)";

impl PrincipalMapper {
    /// Parses the rules as Kafka does; an empty string gives no rules (Kafka's
    /// own default when the setting is absent is `DEFAULT`, which the caller supplies).
    pub fn parse(rules: &str) -> Result<Self, X509Error> {
        let parsed = split_rules(rules)?
            .into_iter()
            .map(parse_rule)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            rules: parsed.into_iter().flatten().collect(),
        })
    }

    /// The principal for `dn`; the DN unchanged when no rule matches (Kafka
    /// refuses the connection then; use [`Self::try_map`] for that).
    pub fn map(&self, dn: &str) -> String {
        self.try_map(dn).unwrap_or_else(|| dn.to_owned())
    }

    /// The principal for `dn`, or `None` when no rule matches, where Kafka's
    /// `SslPrincipalMapper.getName` throws `NoMatchingRule` and fails the authentication.
    pub fn try_map(&self, dn: &str) -> Option<String> {
        self.rules.iter().find_map(|rule| rule.apply(dn))
    }
}

/// Kafka's `splitRules`: every match of `\s*(RULE_PATTERN)\s*(,\s*|$)` over the trimmed text.
fn split_rules(rules: &str) -> Result<Vec<String>, X509Error> {
    let splitter = Regex::new(&format!(r"(?-u:\s)*({RULE_PATTERN})(?-u:\s)*(,(?-u:\s)*|$)"))
        .map_err(|e| invalid_rule(rules, &e.to_string()))?;
    // Java's String.trim(): strips every char up to and including ' '.
    let trimmed = rules.trim_matches(|c| c <= ' ');
    Ok(splitter
        .captures_iter(trimmed)
        .filter_map(|captures| captures.get(1).map(|m| m.as_str().to_owned()))
        .collect())
}

/// Kafka's `parseRules` for one rule: `None` for an empty rule, which Kafka ignores.
fn parse_rule(rule: String) -> Result<Option<Rule>, X509Error> {
    let parser =
        Regex::new(&format!("^(?:{RULE_PATTERN})")).map_err(|e| invalid_rule(&rule, &e.to_string()))?;
    let captures = parser
        .captures(&rule)
        .ok_or_else(|| invalid_rule(&rule, "not a rule"))?;
    let end = captures.get(0).map_or(0, |m| m.end());
    if end != rule.len() {
        return Err(invalid_rule(
            &rule,
            &format!("unmatched substring `{}`", &rule[end..]),
        ));
    }
    if captures.get(1).is_some() {
        return Ok(Some(Rule::Default));
    }
    let Some(pattern) = captures.get(2) else {
        return Ok(None);
    };
    let replacement = captures.get(4).map_or("", |m| m.as_str());
    let case = match captures.get(6).map(|m| m.as_str()) {
        Some("L") => Case::Lower,
        Some("U") => Case::Upper,
        _ => Case::Keep,
    };
    pattern_rule(&rule, pattern.as_str(), replacement, case).map(Some)
}

fn pattern_rule(rule: &str, pattern: &str, replacement: &str, case: Case) -> Result<Rule, X509Error> {
    // A refusal from the regex crate quotes the rewritten pattern, the rule the original.
    let pattern = java_regex(pattern).map_err(|reason| invalid_rule(rule, &reason))?;
    let compile = |source: &str| Regex::new(source).map_err(|e| invalid_rule(rule, &e.to_string()));
    let compiled = compile(&pattern)?;
    let whole = compile(&format!(r"\A(?:{pattern})\z"))?;
    let replacement =
        parse_replacement(&compiled, replacement).map_err(|reason| invalid_rule(rule, &reason))?;
    Ok(Rule::Pattern {
        whole,
        pattern: compiled,
        replacement,
        case,
    })
}

/// Inline flags in force: those that change how a pattern is rewritten.
#[derive(Debug, Clone, Copy, Default)]
struct Flags {
    dot_all: bool,
    case_insensitive: bool,
}

/// Java's `.` without DOTALL, negated: the line terminators it does not match.
const JAVA_DOT: &str = r"\n\r\x{85}\x{2028}\x{2029}";
/// Java's `\s` and `\p{Space}`.
const JAVA_SPACE: &str = r"\t\n\x0B\x0C\r ";

/// Rewrites a Java regular expression, as Kafka compiles it (`Pattern.compile`
/// without flags), into the regex crate's syntax with Java's meaning. The crate
/// is Unicode-aware where Java is not: left as written, `\w` would match `K`
/// (U+212A KELVIN SIGN) and map a certificate Kafka rejects to `kafka`. So
/// the classes Java keeps to ASCII (`\w \d \s \b`, `\p{Alpha}`...) become
/// explicit ASCII classes, `.` stops at Java's line terminators, `\Q...\E`
/// becomes escaped text, syntax the two read differently (`\v`, `\<`, `~`
/// and `[:` in classes) is rewritten, and inline flags the crate lacks or
/// reads differently are refused. `(?i)` still folds case by Unicode (Java's
/// default folds ASCII only), except for the rewritten classes outside brackets.
fn java_regex(pattern: &str) -> Result<String, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() * 2);
    // The flags in force, one entry per open group: in both Java and the crate
    // an inline flag holds until the end of the group it is set in.
    let mut scopes = vec![Flags::default()];
    // Open `[` classes, and where in `out` the innermost one's first item goes
    // while it has none: a `]` there is literal, and `[:` would open a POSIX
    // class in the crate where Java has a nested class holding `:`.
    let mut classes = 0usize;
    let mut first_item: Option<usize> = None;
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        i += 1;
        let flags = scopes.last().copied().unwrap_or_default();
        let in_class = classes > 0;
        match c {
            '\\' => i = escape(&chars, i, &mut out, in_class, flags)?,
            '[' => {
                classes += 1;
                out.push('[');
                if chars.get(i) == Some(&'^') {
                    out.push('^');
                    i += 1;
                }
                first_item = Some(out.len());
                continue;
            }
            ']' if in_class => {
                if first_item != Some(out.len()) {
                    classes -= 1;
                }
                out.push(']');
            }
            // Java has no `~~` (symmetric difference) in classes.
            '~' if in_class => out.push_str(r"\~"),
            '.' if !in_class && !flags.dot_all => push_class(&mut out, JAVA_DOT, true, in_class, flags),
            '(' if !in_class => i = group(&chars, i, &mut out, &mut scopes)?,
            ')' if !in_class => {
                if scopes.len() > 1 {
                    scopes.pop();
                }
                out.push(')');
            }
            c => out.push(c),
        }
        if let Some(at) = first_item
            && out.len() > at
        {
            if out[at..].starts_with(':') {
                out.insert(at, '\\');
            }
            first_item = None;
        }
    }
    Ok(out)
}

/// One escape sequence, `chars[i]` being the character after the backslash;
/// returns the index just past it.
fn escape(chars: &[char], i: usize, out: &mut String, in_class: bool, flags: Flags) -> Result<usize, String> {
    let Some(&c) = chars.get(i) else {
        out.push('\\'); // a trailing backslash, which the crate refuses as Java does
        return Ok(i);
    };
    match c {
        'Q' => {
            // Java quotes up to `\E` or the end, inside classes too.
            let quoted = &chars[i + 1..];
            let end = quoted
                .windows(2)
                .position(|pair| pair == ['\\', 'E'])
                .unwrap_or(quoted.len());
            out.push_str(&regex::escape(&quoted[..end].iter().collect::<String>()));
            return Ok((i + 1 + end + 2).min(chars.len()));
        }
        'p' | 'P' => return property(chars, i, out, in_class, flags),
        'b' | 'B' if !in_class => out.push_str(if c == 'b' { r"(?-u:\b)" } else { r"(?-u:\B)" }),
        _ => match perl_class(c.to_ascii_lowercase()) {
            Some(body) => push_class(out, body, c.is_ascii_uppercase(), in_class, flags),
            // The crate reads the other letter and digit escapes as Java does
            // (`\t`, `\x41`, `\A`...) or refuses them (`\1`, `\Z`, `\G`...), but
            // for `\U0001F600`, which Java refuses.
            None if c.is_ascii_alphanumeric() => {
                out.push('\\');
                out.push(c);
            }
            // Any other escaped character is itself in Java; the crate refuses
            // some (`\é`) and reads `\<` and `\>` as word boundaries.
            None => out.push_str(&regex::escape(c.encode_utf8(&mut [0; 4]))),
        },
    }
    Ok(i + 1)
}

/// Java's `\d \w \s \h \v` by lower-case letter, as class bodies: ASCII, or
/// (`\h \v`) Java's own lists, where the crate's `\v` is only U+000B.
fn perl_class(letter: char) -> Option<&'static str> {
    Some(match letter {
        'd' => "0-9",
        'w' => "0-9A-Za-z_",
        's' => JAVA_SPACE,
        'h' => r" \t\x{A0}\x{1680}\x{180E}\x{2000}-\x{200A}\x{202F}\x{205F}\x{3000}",
        'v' => r"\n\x0B\x0C\r\x{85}\x{2028}\x{2029}",
        _ => return None,
    })
}

/// `\p{name}` or `\pL` (and `\P`), `chars[i]` being the `p`; returns the index just past it.
fn property(
    chars: &[char],
    i: usize,
    out: &mut String,
    in_class: bool,
    flags: Flags,
) -> Result<usize, String> {
    let close = match chars.get(i + 1) {
        Some('{') => chars[i + 1..].iter().position(|&c| c == '}').map(|at| i + 1 + at),
        _ => None,
    };
    let Some(close) = close else {
        // `\pL`: the crate reads a one-letter category as Java does, or refuses what follows.
        out.push('\\');
        out.extend(&chars[i..(i + 2).min(chars.len())]);
        return Ok((i + 2).min(chars.len()));
    };
    let name: String = chars[i + 2..close].iter().collect();
    match posix_class(&name, flags.case_insensitive)? {
        Some(body) => push_class(out, body, chars[i] == 'P', in_class, flags),
        // A Unicode category, script or property, which Java and the crate share.
        None => {
            out.push('\\');
            out.extend(&chars[i..=close]);
        }
    }
    Ok(close + 1)
}

/// Java's POSIX classes (`\p{Lower}`...), ASCII only, as class bodies; under
/// CASE_INSENSITIVE Java's `Lower` and `Upper` are both cases. Java reads
/// these names only exactly as spelled here, and the crate reads them, in any
/// spelling its loose matching accepts, as Unicode properties: so another
/// spelling (`\p{lower}`, `\p{IsAlpha}`) is refused rather than guessed at.
fn posix_class(name: &str, case_insensitive: bool) -> Result<Option<&'static str>, String> {
    Ok(Some(match name {
        "Lower" | "Upper" if case_insensitive => "A-Za-z",
        "Lower" => "a-z",
        "Upper" => "A-Z",
        "ASCII" => r"\x00-\x7F",
        "Alpha" => "A-Za-z",
        "Digit" => "0-9",
        "Alnum" => "0-9A-Za-z",
        "Punct" => r"\x21-\x2F\x3A-\x40\x5B-\x60\x7B-\x7E",
        "Graph" => r"\x21-\x7E",
        "Print" => r"\x20-\x7E",
        "Blank" => r"\t ",
        "Cntrl" => r"\x00-\x1F\x7F",
        "XDigit" => "0-9A-Fa-f",
        "Space" => JAVA_SPACE,
        _ => {
            const POSIX: [&str; 13] = [
                "lower", "upper", "ascii", "alpha", "digit", "alnum", "punct", "graph", "print", "blank",
                "cntrl", "xdigit", "space",
            ];
            let loose: String = name
                .chars()
                .filter(|c| c.is_ascii() && !matches!(c, ' ' | '_' | '-'))
                .map(|c| c.to_ascii_lowercase())
                .collect();
            let bare = loose.strip_prefix("is").unwrap_or(&loose);
            if POSIX.contains(&loose.as_str()) || POSIX.contains(&bare) {
                return Err(format!(
                    "\\p{{{name}}} is ambiguous: Java reads only the exact POSIX names \
                     (\\p{{Lower}}, \\p{{Alpha}}...) as ASCII classes, the regex crate reads \
                     this one as a Unicode property"
                ));
            }
            return Ok(None);
        }
    }))
}

/// A class from its body; outside brackets under `(?i)`, in a group that turns
/// the crate's Unicode case folding off (in brackets the whole class folds).
fn push_class(out: &mut String, body: &str, negated: bool, in_class: bool, flags: Flags) {
    let unfolded = flags.case_insensitive && !in_class;
    if unfolded {
        out.push_str("(?-i:");
    }
    out.push_str(if negated { "[^" } else { "[" });
    out.push_str(body);
    out.push(']');
    if unfolded {
        out.push(')');
    }
}

/// A `(` outside classes, `chars[i]` being the character after it: a group,
/// whose flags start as the enclosing ones, or Java's inline flags
/// `(?on-off)` / `(?on-off:...)`. Returns the index just past what it read.
fn group(chars: &[char], i: usize, out: &mut String, scopes: &mut Vec<Flags>) -> Result<usize, String> {
    let mut flags = scopes.last().copied().unwrap_or_default();
    if chars.get(i) != Some(&'?') || matches!(chars.get(i + 1), Some(':' | '<' | '=' | '!' | '>')) {
        // Capturing, named or non-capturing; the crate refuses look-around and atomic groups.
        out.push('(');
        scopes.push(flags);
        return Ok(i);
    }
    let (mut on, mut off) = (String::new(), String::new());
    let mut negated = false;
    let mut j = i + 1;
    let end = loop {
        match chars.get(j) {
            Some(&end @ (')' | ':')) => break end,
            Some('-') if !negated => negated = true,
            Some(&flag @ ('i' | 'm' | 's')) => {
                match flag {
                    'i' => flags.case_insensitive = !negated,
                    's' => flags.dot_all = !negated,
                    _ => {}
                }
                let set = if negated { &mut off } else { &mut on };
                if !set.contains(flag) {
                    set.push(flag);
                }
            }
            // Java's UNICODE_CASE: the crate always folds Unicode case (and its own `u` means Unicode mode).
            Some('u') => {}
            Some(&flag @ ('d' | 'x' | 'U' | 'c')) => {
                if !negated {
                    let name = match flag {
                        'd' => "UNIX_LINES",
                        'x' => "COMMENTS",
                        'U' => "UNICODE_CHARACTER_CLASS",
                        _ => "CANON_EQ",
                    };
                    return Err(format!("inline flag `{flag}` ({name}) is not supported"));
                }
                // Turning off what is never on.
            }
            Some(&other) => return Err(format!("unknown inline flag `{other}`")),
            None => return Err("unterminated inline flags `(?`".to_owned()),
        }
        j += 1;
    };
    on.retain(|flag| !off.contains(flag));
    let mut text = on;
    if !off.is_empty() {
        text.push('-');
        text.push_str(&off);
    }
    if end == ':' {
        out.push_str("(?");
        out.push_str(&text);
        out.push(':');
        scopes.push(flags);
    } else {
        if !text.is_empty() {
            out.push_str("(?");
            out.push_str(&text);
            out.push(')');
        }
        if let Some(top) = scopes.last_mut() {
            *top = flags;
        }
    }
    Ok(j + 1)
}

/// Java's `Matcher.appendReplacement` syntax after Kafka's
/// `escapeLiteralBackReferences`: `\x` is a literal x, `${name}` a named
/// group, `$n` the longest group number prefix that exists (a reference
/// beyond the pattern's groups stays literal, as Kafka makes it). What Java
/// would throw on at match time is refused here, when the rules are read.
fn parse_replacement(pattern: &Regex, replacement: &str) -> Result<Vec<Piece>, String> {
    let groups = pattern.captures_len() - 1;
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut chars = replacement.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => literal.push(chars.next().ok_or("replacement ends with a lone backslash")?),
            '$' if chars.peek() == Some(&'{') => {
                let name = named_group(pattern, &mut chars)?;
                push_group(&mut pieces, &mut literal, Piece::Named(name));
            }
            '$' if chars.peek().is_some_and(char::is_ascii_digit) => {
                let digits: String = std::iter::from_fn(|| chars.next_if(char::is_ascii_digit)).collect();
                match numbered_group(&digits, groups)? {
                    Some((number, used)) => {
                        push_group(&mut pieces, &mut literal, Piece::Group(number));
                        literal.push_str(&digits[used..]);
                    }
                    None => {
                        literal.push('$');
                        literal.push_str(&digits);
                    }
                }
            }
            '$' => return Err("'$' not followed by a group number or {name}".into()),
            c => literal.push(c),
        }
    }
    if !literal.is_empty() {
        pieces.push(Piece::Literal(literal));
    }
    Ok(pieces)
}

/// Appends the literal text gathered so far, then the group reference.
fn push_group(pieces: &mut Vec<Piece>, literal: &mut String, group: Piece) {
    if !literal.is_empty() {
        pieces.push(Piece::Literal(std::mem::take(literal)));
    }
    pieces.push(group);
}

/// The name in `${name}`, which the pattern must define (Java throws otherwise).
fn named_group(
    pattern: &Regex,
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
) -> Result<String, String> {
    chars.next(); // '{'
    let name: String = std::iter::from_fn(|| chars.next_if(|c| *c != '}')).collect();
    if chars.next() != Some('}') {
        return Err("unterminated ${name} in replacement".into());
    }
    if !pattern.capture_names().flatten().any(|known| known == name) {
        return Err(format!(
            "replacement names group '{name}', which the pattern lacks"
        ));
    }
    Ok(name)
}

/// `$digits`: the group named by the longest prefix of `digits` that exists
/// and how many digits that took (the rest are literal text), or `None` when
/// even the first digit is beyond the pattern's groups, which Kafka keeps literal.
fn numbered_group(digits: &str, groups: usize) -> Result<Option<(usize, usize)>, String> {
    let mut number = 0usize;
    let mut used = 0;
    for d in digits.bytes() {
        let candidate = number.saturating_mul(10).saturating_add(usize::from(d - b'0'));
        if used > 0 && candidate > groups {
            break;
        }
        number = candidate;
        used += 1;
    }
    if number <= groups {
        return Ok(Some((number, used)));
    }
    if groups == 0 {
        // Kafka leaves this to Java, which throws "No group" on the first match.
        return Err(format!(
            "replacement refers to group {number}, but the pattern has no groups"
        ));
    }
    Ok(None)
}

impl Rule {
    fn apply(&self, dn: &str) -> Option<String> {
        match self {
            Rule::Default => Some(dn.to_owned()),
            Rule::Pattern {
                whole,
                pattern,
                replacement,
                case,
            } => {
                if !whole.is_match(dn) {
                    return None;
                }
                let result = java_replace_all(pattern, dn, replacement);
                Some(match case {
                    Case::Keep => result,
                    Case::Lower => result.to_lowercase(),
                    Case::Upper => result.to_uppercase(),
                })
            }
        }
    }
}

/// Java's `String.replaceAll`, whose iteration differs from the regex
/// crate's: after a non-empty match, an empty match right where it ended
/// counts too, so `(.*)` matches "CN=x" twice (the whole text, then the
/// empty end). Kafka's results for such unanchored rules depend on it.
fn java_replace_all(pattern: &Regex, text: &str, replacement: &[Piece]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut from = 0;
    while from <= text.len() {
        let Some(captures) = pattern.captures_at(text, from) else {
            break;
        };
        let Some(whole) = captures.get(0) else { break };
        out.push_str(&text[copied..whole.start()]);
        out.push_str(&expand(replacement, &captures));
        copied = whole.end();
        from = if whole.is_empty() {
            next_char_boundary(text, whole.end())
        } else {
            whole.end()
        };
    }
    out.push_str(&text[copied..]);
    out
}

/// The index just past the character at `index` (past the end when at the end).
fn next_char_boundary(text: &str, index: usize) -> usize {
    text[index..]
        .chars()
        .next()
        .map_or(index + 1, |c| index + c.len_utf8())
}

/// The replacement text for one match; a group that did not participate is empty, as in Java.
fn expand(pieces: &[Piece], captures: &Captures<'_>) -> String {
    let mut out = String::new();
    for piece in pieces {
        match piece {
            Piece::Literal(text) => out.push_str(text),
            Piece::Group(n) => out.push_str(captures.get(*n).map_or("", |m| m.as_str())),
            Piece::Named(name) => out.push_str(captures.name(name).map_or("", |m| m.as_str())),
        }
    }
    out
}

fn invalid_rule(rule: &str, reason: &str) -> X509Error {
    X509Error::InvalidRule {
        rule: rule.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER element from a tag and contents (short or two-byte long form).
    fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        match contents.len() {
            len @ 0..=0x7f => out.push(len as u8),
            len @ 0x80..=0xff => out.extend([0x81, len as u8]),
            len => out.extend([0x82, (len >> 8) as u8, len as u8]),
        }
        out.extend_from_slice(contents);
        out
    }

    fn oid(text: &str) -> Vec<u8> {
        let arcs: Vec<u64> = text.split('.').map(|a| a.parse().unwrap()).collect();
        let mut body = vec![(arcs[0] * 40 + arcs[1]) as u8];
        for &arc in &arcs[2..] {
            let mut groups = vec![(arc & 0x7f) as u8];
            let mut rest = arc >> 7;
            while rest > 0 {
                groups.push((rest & 0x7f) as u8 | 0x80);
                rest >>= 7;
            }
            body.extend(groups.into_iter().rev());
        }
        tlv(der::OID, &body)
    }

    /// An RDN from (oid, value tag, value bytes) attributes.
    fn rdn(attributes: &[(&str, u8, &[u8])]) -> Vec<u8> {
        let avas: Vec<u8> = attributes
            .iter()
            .flat_map(|(type_oid, tag, value)| {
                tlv(der::SEQUENCE, &[oid(type_oid), tlv(*tag, value)].concat())
            })
            .collect();
        tlv(der::SET, &avas)
    }

    /// A certificate skeleton around `subject` (the signature is not checked here).
    fn certificate(subject: &[u8]) -> Vec<u8> {
        let algorithm = tlv(der::SEQUENCE, &oid("1.2.840.10045.4.3.2"));
        let tbs = [
            tlv(0xa0, &tlv(der::INTEGER, &[2])),
            tlv(der::INTEGER, &[1]),
            algorithm.clone(),
            tlv(der::SEQUENCE, &rdn(&[("2.5.4.3", TAG_UTF8_STRING, b"ca")])),
            tlv(der::SEQUENCE, &[]),
            tlv(der::SEQUENCE, subject),
        ]
        .concat();
        tlv(
            der::SEQUENCE,
            &[tlv(der::SEQUENCE, &tbs), algorithm, tlv(der::BIT_STRING, &[0, 1])].concat(),
        )
    }

    fn openssl_certificate(args: &[&str]) -> Vec<u8> {
        let dir = std::env::temp_dir().join(format!(
            "ketch-x509-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let pem = dir.join("c.pem");
        let der = dir.join("c.der");
        let run = |args: &[&str]| {
            let status = std::process::Command::new("openssl")
                .args(args)
                .output()
                .expect("openssl runs");
            assert!(
                status.status.success(),
                "{}",
                String::from_utf8_lossy(&status.stderr)
            );
        };
        let key = dir.join("k.pem");
        let mut req = vec![
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        req.extend_from_slice(args);
        req.extend([
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            pem.to_str().unwrap(),
            "-days",
            "1",
        ]);
        run(&req);
        run(&[
            "x509",
            "-in",
            pem.to_str().unwrap(),
            "-outform",
            "der",
            "-out",
            der.to_str().unwrap(),
        ]);
        let bytes = std::fs::read(&der).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        bytes
    }

    #[test]
    fn openssl_certificate_subject() {
        let cert = openssl_certificate(&["-subj", "/C=US/O=Example, Inc./OU=eng/CN=alice"]);
        assert_eq!(
            subject_dn(&cert).unwrap(),
            r"CN=alice,OU=eng,O=Example\, Inc.,C=US"
        );
    }

    #[test]
    fn openssl_multi_valued_rdn_and_email() {
        let cert = openssl_certificate(&[
            "-multivalue-rdn",
            "-subj",
            "/DC=com/DC=example/OU=eng+UID=42/CN=bob/emailAddress=bob@example.com",
        ]);
        assert_eq!(
            subject_dn(&cert).unwrap(),
            "1.2.840.113549.1.9.1=#160f626f62406578616d706c652e636f6d,CN=bob,OU=eng+UID=42,DC=example,DC=com"
        );
    }

    #[test]
    fn string_types_and_unknown_types() {
        let subject = [
            rdn(&[("2.5.4.6", TAG_PRINTABLE_STRING, b"FR")]),
            rdn(&[("2.5.4.7", TAG_TELETEX_STRING, b"Orl\xe9ans")]),
            rdn(&[("2.5.4.10", TAG_BMP_STRING, &[0x00, b'Z', 0x00, 0xfc, 0x00, b'r'])]),
            rdn(&[("2.5.4.11", 28, b"\0\0\0A")]), // UniversalString: hex, as in Java
            rdn(&[("2.5.4.5", TAG_PRINTABLE_STRING, b"123")]), // serialNumber: no RFC 2253 keyword
            rdn(&[("2.5.4.3", TAG_UTF8_STRING, "Zoë".as_bytes())]),
        ]
        .concat();
        assert_eq!(
            subject_dn(&certificate(&subject)).unwrap(),
            "CN=Zoë,2.5.4.5=#1303313233,OU=#1c0400000041,O=Zür,L=Orléans,C=FR"
        );
    }

    #[test]
    fn empty_subject_is_empty_string() {
        assert_eq!(subject_dn(&certificate(&[])).unwrap(), "");
    }

    #[test]
    fn values_are_escaped_as_java_does() {
        assert_eq!(
            escape_value("a,b+c\"d\\e<f>g;h=i#j"),
            r#"a\,b\+c\"d\\e\<f\>g\;h\=i\#j"#
        );
        assert_eq!(escape_value("#x"), r"\#x");
        assert_eq!(escape_value("  x y "), r"\ \ x y\ ");
        assert_eq!(escape_value(" "), r"\ ");
        assert_eq!(escape_value("a\0b"), r"a\00b");
        assert_eq!(escape_value("under_score@x"), "under_score@x");
    }

    #[test]
    fn invalid_strings_are_refused() {
        let bad_utf8 = rdn(&[("2.5.4.3", TAG_UTF8_STRING, b"\xff")]);
        assert!(subject_dn(&certificate(&bad_utf8)).is_err());
        let odd_bmp = rdn(&[("2.5.4.3", TAG_BMP_STRING, b"\0a\0")]);
        assert!(subject_dn(&certificate(&odd_bmp)).is_err());
        let empty_rdn = tlv(der::SET, &[]);
        assert!(subject_dn(&certificate(&empty_rdn)).is_err());
    }

    #[test]
    fn truncated_and_garbage_der_are_errors() {
        let cert = openssl_certificate(&["-subj", "/CN=trunc"]);
        for end in 0..cert.len() {
            assert!(subject_dn(&cert[..end]).is_err(), "prefix of {end} bytes");
        }
        let mut trailing = cert.clone();
        trailing.push(0);
        assert_eq!(
            subject_dn(&trailing),
            Err(X509Error::Der(der::DerError::TrailingData))
        );
        assert!(subject_dn(&[0x30, 0x80, 0, 0]).is_err()); // indefinite length
        assert!(subject_dn(&[0x30, 0x85, 1, 1, 1, 1, 1]).is_err());
        assert!(subject_dn(&[0x3f, 0x01, 0x00]).is_err());
        let mut seed = 0x1234_5678u32;
        for _ in 0..2000 {
            let mut mutated = cert.clone();
            for _ in 0..4 {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let index = (seed >> 8) as usize % mutated.len();
                mutated[index] = (seed >> 24) as u8;
            }
            let _ = subject_dn(&mutated);
        }
    }

    #[test]
    fn oid_decoding() {
        assert_eq!(der::oid_to_string(&[0x55, 0x04, 0x03]).unwrap(), "2.5.4.3");
        assert_eq!(
            der::oid_to_string(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d]).unwrap(),
            "1.2.840.113549"
        );
        assert!(der::oid_to_string(&[]).is_err());
        assert!(der::oid_to_string(&[0x55, 0x84]).is_err());
        assert!(der::oid_to_string(&[0x55, 0x80, 0x01]).is_err());
        assert!(der::oid_to_string(&[0xff; 20]).is_err());
    }

    const KAFKA_RULES: &str = "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,\
        RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,\
        RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U, DEFAULT";

    #[test]
    fn kafka_documentation_rules() {
        let mapper = PrincipalMapper::parse(KAFKA_RULES).unwrap();
        assert_eq!(mapper.map("CN=Duke,OU=ServiceUsers,O=Org,C=US"), "Duke");
        assert_eq!(
            mapper.map("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US"),
            "duke@sme"
        );
        assert_eq!(mapper.map("CN=Duke,OU=JavaSoft,O=Sun Microsystems"), "DUKE");
        assert_eq!(
            mapper.map("OU=JavaSoft,O=Sun Microsystems,C=US"),
            "OU=JavaSoft,O=Sun Microsystems,C=US"
        );
    }

    #[test]
    fn no_matching_rule() {
        let mapper = PrincipalMapper::parse("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/").unwrap();
        assert_eq!(mapper.try_map("CN=x,OU=Other"), None);
        assert_eq!(mapper.map("CN=x,OU=Other"), "CN=x,OU=Other");
        assert_eq!(PrincipalMapper::parse("").unwrap().try_map("CN=x"), None);
        assert_eq!(
            PrincipalMapper::parse("DEFAULT")
                .unwrap()
                .try_map("CN=x")
                .as_deref(),
            Some("CN=x")
        );
    }

    #[test]
    fn escaped_slashes_and_commas_in_patterns() {
        let mapper =
            PrincipalMapper::parse(r"RULE:^CN=([^,]*),OU=(.*)$/$1\/$2/, RULE:^a\/b$/slash/").unwrap();
        assert_eq!(mapper.map("CN=svc,OU=eng"), "svc/eng");
        assert_eq!(mapper.map("a/b"), "slash");
    }

    #[test]
    fn replacement_group_references() {
        let mapper = PrincipalMapper::parse(r"RULE:^CN=(?<name>\w+)$/$1$2 ${name} $12 \$1/").unwrap();
        assert_eq!(mapper.map("CN=bob"), "bob$2 bob bob2 $1");
        // As Java's replaceAll: the unanchored `(.*)` also matches the empty end.
        let unanchored = PrincipalMapper::parse("RULE:(.*)/u-$1./").unwrap();
        assert_eq!(unanchored.map("CN=Bob"), "u-CN=Bob.u-.");
        let anchored = PrincipalMapper::parse("RULE:^(.*)$/u-$1./").unwrap();
        assert_eq!(anchored.map("CN=Bob"), "u-CN=Bob.");
        let group_zero = PrincipalMapper::parse(r"RULE:^CN=(\w+)$/<$0>/").unwrap();
        assert_eq!(group_zero.map("CN=bob"), "<CN=bob>");
    }

    #[test]
    fn whole_dn_must_match() {
        let mapper = PrincipalMapper::parse("RULE:CN=(\\w+)/$1/").unwrap();
        assert_eq!(mapper.try_map("CN=bob,O=x"), None);
        assert_eq!(mapper.try_map("CN=bob").as_deref(), Some("bob"));
    }

    #[test]
    fn invalid_rules_are_refused() {
        for rules in [
            "RULE:a/b",
            "RULE:^(.*$/$1/",
            "DEFAULTX",
            "RULE:a/b/Lx",
            "RULE:^(a)$/$/",
            "RULE:^(a)$/x\\/",
            "RULE:^a$/$1/",
            "RULE:^(a)$/${nope}/",
            "garbage",
        ] {
            assert!(
                matches!(PrincipalMapper::parse(rules), Err(X509Error::InvalidRule { .. })),
                "{rules} should be refused"
            );
        }
    }

    /// Whether `rules` maps `dn` to a principal.
    fn maps(rules: &str, dn: &str) -> Option<String> {
        PrincipalMapper::parse(rules).unwrap().try_map(dn)
    }

    #[test]
    fn java_patterns_are_rewritten() {
        for (java, rewritten) in [
            (r"^CN=(\w+),OU=eng$", r"^CN=([0-9A-Za-z_]+),OU=eng$"),
            (r"\d\D\s\S", r"[0-9][^0-9][\t\n\x0B\x0C\r ][^\t\n\x0B\x0C\r ]"),
            (r"a.b", r"a[^\n\r\x{85}\x{2028}\x{2029}]b"),
            (r"(?s).(?-s:.)", r"(?s).(?-s:[^\n\r\x{85}\x{2028}\x{2029}])"),
            (r"\bx\B", r"(?-u:\b)x(?-u:\B)"),
            (r"[\w.-]", r"[[0-9A-Za-z_].-]"),
            (r"a\\w\\\w", r"a\\w\\[0-9A-Za-z_]"),
            (r"\Q.*\E+", r"\.\*+"),
            (r"[[:alpha:]]", r"[[\:alpha:]]"),
            (r"(?iu)\w(?i-i)", r"(?i)(?-i:[0-9A-Za-z_])(?-i)"),
            (r"\<\>[a~b]", r"<>[a\~b]"),
            (
                r"\p{Alpha}\P{Digit}\pL\p{IsLatin}",
                r"[A-Za-z][^0-9]\pL\p{IsLatin}",
            ),
        ] {
            assert_eq!(java_regex(java).as_deref(), Ok(rewritten), "{java}");
        }
    }

    #[test]
    fn unicode_lookalikes_do_not_match_ascii_classes() {
        let rule = r"RULE:^CN=(\w+),OU=eng$/$1/L";
        let kelvin = "CN=\u{212A}afka,OU=eng";
        assert_eq!(maps(rule, kelvin), None);
        assert_eq!(maps(rule, "CN=Kafka,OU=eng").as_deref(), Some("kafka"));
        let with_default = PrincipalMapper::parse(&format!("{rule},DEFAULT")).unwrap();
        assert_eq!(with_default.map(kelvin), kelvin);
        assert_eq!(with_default.map("CN=Kafka,OU=eng"), "kafka");
    }

    #[test]
    fn perl_classes_are_ascii() {
        let digits = r"RULE:^CN=(\d+)$/$1/";
        assert_eq!(maps(digits, "CN=42").as_deref(), Some("42"));
        assert_eq!(maps(digits, "CN=\u{0664}2"), None); // ARABIC-INDIC DIGIT FOUR
        assert_eq!(maps(digits, "CN=\u{FF14}2"), None); // FULLWIDTH DIGIT FOUR
        assert!(maps(r"RULE:^CN=\D\W$/x/", "CN=\u{0664}\u{212A}").is_some());
        let space = r"RULE:^CN=a\sb$/x/";
        for dn in [
            "CN=a b",
            "CN=a\tb",
            "CN=a\nb",
            "CN=a\x0Bb",
            "CN=a\x0Cb",
            "CN=a\rb",
        ] {
            assert!(maps(space, dn).is_some(), "{dn:?}");
        }
        for dn in ["CN=a\u{A0}b", "CN=a\u{2003}b", "CN=a\u{85}b", "CN=a\u{2028}b"] {
            assert_eq!(maps(space, dn), None, "{dn:?}");
            assert!(maps(r"RULE:^CN=a\Sb$/x/", dn).is_some(), "{dn:?}");
        }
        // Java's \h and \v, where the regex crate's \v is U+000B alone.
        assert!(maps(r"RULE:^CN=a\hb$/x/", "CN=a\u{A0}b").is_some());
        assert_eq!(maps(r"RULE:^CN=a\hb$/x/", "CN=a\nb"), None);
        assert!(maps(r"RULE:^CN=a\vb\vc$/x/", "CN=a\nb\u{2028}c").is_some());
        assert_eq!(maps(r"RULE:^CN=a\Vb$/x/", "CN=a\rb"), None);
    }

    #[test]
    fn dot_stops_at_java_line_terminators() {
        let dot = "RULE:^CN=(.)$/$1/";
        for terminator in ["\n", "\r", "\u{85}", "\u{2028}", "\u{2029}"] {
            let dn = format!("CN={terminator}");
            assert_eq!(maps(dot, &dn), None, "{dn:?}");
            assert_eq!(maps("RULE:(?s)^CN=(.)$/$1/", &dn).as_deref(), Some(terminator));
        }
        for other in ["\t", "\u{0B}", "\u{0C}", "é", "\u{212A}"] {
            assert_eq!(maps(dot, &format!("CN={other}")).as_deref(), Some(other));
        }
        // A flag holds to the end of its group, as in Java.
        let scoped = "RULE:^CN=((?s).)(.)$/$1$2/";
        assert_eq!(maps(scoped, "CN=\nx").as_deref(), Some("\nx"));
        assert_eq!(maps(scoped, "CN=x\n"), None);
        assert_eq!(maps("RULE:^CN=(?s:.)(.)$/$1$2/", "CN=x\n"), None);
    }

    #[test]
    fn word_boundaries_are_ascii() {
        // é is not an ASCII word character, so there is a boundary between c and é.
        assert_eq!(
            maps(r"RULE:^CN=(\w+)\b.*$/$1/", "CN=abcé").as_deref(),
            Some("abc")
        );
        let not_boundary = r"RULE:^CN=(a)\B(.*)$/$1$2/";
        assert_eq!(maps(not_boundary, "CN=aé"), None);
        assert_eq!(maps(not_boundary, "CN=ab").as_deref(), Some("ab"));
    }

    #[test]
    fn escaped_backslash_is_not_rewritten() {
        let rule = r"RULE:^CN=a\\w$/lit/";
        assert_eq!(maps(rule, r"CN=a\w").as_deref(), Some("lit"));
        assert_eq!(maps(rule, "CN=ab"), None);
        let then_class = r"RULE:^CN=a\\\w$/lit/";
        assert_eq!(maps(then_class, r"CN=a\b").as_deref(), Some("lit"));
        assert_eq!(maps(then_class, r"CN=a\w").as_deref(), Some("lit"));
        assert_eq!(maps(then_class, "CN=a\\\u{212A}"), None);
    }

    #[test]
    fn bracketed_classes_keep_java_meaning() {
        let names = r"RULE:^CN=([\w.-]+)$/$1/";
        assert_eq!(maps(names, "CN=svc-1.prod_x").as_deref(), Some("svc-1.prod_x"));
        assert_eq!(maps(names, "CN=svc\u{212A}"), None);
        assert_eq!(maps(names, "CN=a b"), None);
        assert_eq!(maps(r"RULE:^CN=[^\d]$/x/", "CN=3"), None);
        assert!(maps(r"RULE:^CN=[^\d]$/x/", "CN=\u{0663}").is_some());
        assert_eq!(maps(r"RULE:^CN=[\s]$/x/", "CN=\u{A0}"), None);
        // In Java [[:alpha:]] is a nested class of ':', 'a', 'l', 'p' and 'h'.
        let posix = "RULE:^CN=[[:alpha:]]+$/x/";
        assert!(maps(posix, "CN=:alpha:").is_some());
        assert_eq!(maps(posix, "CN=b"), None);
        // Java has no ~~ operator, and a ] first in a class is literal.
        assert!(maps("RULE:^CN=[a~~b]$/x/", "CN=~").is_some());
        assert!(maps("RULE:^CN=[]a]+$/x/", "CN=]a").is_some());
        assert!(maps("RULE:^CN=[^]a]$/x/", "CN=b").is_some());
        assert_eq!(maps("RULE:^CN=[^]a]$/x/", "CN=]"), None);
    }

    #[test]
    fn posix_properties_are_ascii() {
        assert!(maps(r"RULE:^CN=\p{Alpha}+$/x/", "CN=abc").is_some());
        assert_eq!(maps(r"RULE:^CN=\p{Alpha}+$/x/", "CN=ébc"), None);
        assert_eq!(maps(r"RULE:^CN=\p{Lower}$/x/", "CN=\u{3C3}"), None); // GREEK SMALL LETTER SIGMA
        assert!(maps(r"RULE:^CN=\P{Digit}$/x/", "CN=\u{0663}").is_some());
        assert!(maps(r"RULE:^CN=\p{Punct}+$/x/", "CN=~!@").is_some());
        assert_eq!(maps(r"RULE:^CN=\p{Space}$/x/", "CN=\u{A0}"), None);
        assert_eq!(maps(r"RULE:^CN=\p{Cntrl}$/x/", "CN=\u{85}"), None);
        // Under (?i), Java's Lower is both ASCII cases, and no more.
        assert!(maps(r"RULE:(?i)^CN=\p{Lower}$/x/", "CN=A").is_some());
        assert_eq!(maps(r"RULE:(?i)^CN=\p{Lower}$/x/", "CN=\u{212A}"), None);
        // Unicode categories and scripts mean the same in Java.
        assert!(maps(r"RULE:^CN=\p{L}\pL\p{IsLatin}$/x/", "CN=éßa").is_some());
        for rules in [
            r"RULE:^\p{lower}$/x/",
            r"RULE:^\p{IsAlpha}$/x/",
            r"RULE:^\P{is_space}$/x/",
        ] {
            assert!(
                matches!(PrincipalMapper::parse(rules), Err(X509Error::InvalidRule { .. })),
                "{rules} should be refused"
            );
        }
    }

    #[test]
    fn quoted_text_is_literal() {
        let quoted = r"RULE:^CN=\Q.*+(\E$/q/";
        assert_eq!(maps(quoted, "CN=.*+(").as_deref(), Some("q"));
        assert_eq!(maps(quoted, "CN=abc"), None);
        assert!(maps(r"RULE:^CN=[\Q]\E]+$/q/", "CN=]]").is_some());
        assert!(maps(r"RULE:^CN=\Q\w.$/q/", r"CN=\w.$").is_some());
        assert!(maps(r"RULE:^CN=\<(\w+)\>$/$1/", "CN=<svc>").is_some());
    }

    #[test]
    fn inline_flags() {
        let insensitive = r"RULE:(?i)^CN=(\w+),OU=ENG$/$1/L";
        assert_eq!(maps(insensitive, "CN=Kafka,OU=eng").as_deref(), Some("kafka"));
        assert_eq!(maps(insensitive, "CN=\u{212A}afka,OU=eng"), None);
        assert_eq!(
            maps(r"RULE:(?iu)^cn=(\w+)$/$1/", "CN=Bob").as_deref(),
            Some("Bob")
        );
        assert_eq!(
            maps(r"RULE:(?ii-s)^cn=(\w)(?-i:x)$/$1/", "CN=bx").as_deref(),
            Some("b")
        );
        assert_eq!(maps(r"RULE:(?i)^cn=(\w)(?-i:x)$/$1/", "CN=bX"), None);
        for (rules, reason) in [
            ("RULE:(?x)^a$/b/", "COMMENTS"),
            ("RULE:(?U)^a$/b/", "UNICODE_CHARACTER_CLASS"),
            ("RULE:(?d)^a$/b/", "UNIX_LINES"),
            ("RULE:(?c)^a$/b/", "CANON_EQ"),
            ("RULE:(?P<n>a)/b/", "unknown inline flag `P`"),
            ("RULE:(?i/b/", "unterminated"),
        ] {
            match PrincipalMapper::parse(rules) {
                Err(X509Error::InvalidRule { rule, reason: got }) => {
                    assert_eq!(rule, rules);
                    assert!(got.contains(reason), "{rules}: {got}");
                }
                other => panic!("{rules} should be refused, got {other:?}"),
            }
        }
    }
}
