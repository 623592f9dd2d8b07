//! String settings that also accept a number.
//!
//! Environment variables and `--set` values are typed by how they look
//! (`42` is an integer), so a string setting such as `broker.cluster_id`
//! must accept one written as a number.

use serde::{Deserialize, Deserializer};

#[derive(Deserialize)]
#[serde(untagged)]
enum Lenient {
    Text(String),
    Integer(i64),
    Float(f64),
    Boolean(bool),
}

impl From<Lenient> for String {
    fn from(value: Lenient) -> Self {
        match value {
            Lenient::Text(s) => s,
            Lenient::Integer(n) => n.to_string(),
            Lenient::Float(f) => f.to_string(),
            Lenient::Boolean(b) => b.to_string(),
        }
    }
}

pub fn string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    Lenient::deserialize(deserializer).map(String::from)
}

pub fn optional_string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Option::<Lenient>::deserialize(deserializer).map(|v| v.map(String::from))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum List {
    /// One value: a comma-separated text, or a number (`12345`, how an
    /// environment variable naming one numeric user is typed).
    One(Lenient),
    Many(Vec<Lenient>),
}

fn split(text: &str, separator: char) -> Vec<String> {
    text.split(separator)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A list given as an array or as one comma-separated string (how an
/// environment variable or `--set` writes it).
pub fn string_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    Ok(match List::deserialize(deserializer)? {
        List::One(one) => split(&String::from(one), ','),
        List::Many(items) => items.into_iter().map(String::from).collect(),
    })
}

/// A list of principals given as an array or as one string: separated by
/// `;` as Kafka's `super.users` is (a certificate's name holds commas:
/// `User:CN=admin,OU=ops`), or by `,` when there is no `;` and no name
/// holds a `=`.
pub fn principal_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    Ok(match List::deserialize(deserializer)? {
        List::One(one) => {
            let text = String::from(one);
            let separator = if text.contains(';') || text.contains('=') {
                ';'
            } else {
                ','
            };
            split(&text, separator)
        }
        List::Many(items) => items.into_iter().map(String::from).collect(),
    })
}
