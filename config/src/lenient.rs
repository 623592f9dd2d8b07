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

/// A list given as an array or as one comma-separated string (how an
/// environment variable or `--set` writes it).
pub fn string_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum List {
        One(String),
        Many(Vec<Lenient>),
    }
    Ok(match List::deserialize(deserializer)? {
        List::One(text) => text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        List::Many(items) => items.into_iter().map(String::from).collect(),
    })
}
