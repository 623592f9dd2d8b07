//! Durations written the human way: `500ms`, `5s`, `1m`, `2h`, `1d`.
//!
//! A bare integer in a TOML file is read as milliseconds, like Kafka's `*.ms`
//! settings.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

/// A duration setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(std::time::Duration);

impl Duration {
    pub const fn from_millis(ms: u64) -> Self {
        Self(std::time::Duration::from_millis(ms))
    }

    pub const fn from_secs(s: u64) -> Self {
        Self(std::time::Duration::from_secs(s))
    }

    pub const fn get(self) -> std::time::Duration {
        self.0
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

/// A duration string that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: expected a number followed by ms, s, m, h or d (e.g. 500ms, 5s, 1m)")]
pub struct ParseDurationError(String);

impl FromStr for Duration {
    type Err = ParseDurationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = || ParseDurationError(text.to_owned());
        let trimmed = text.trim();
        let split = trimmed.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
        let (number, unit) = trimmed.split_at(split);
        let n: u64 = number.parse().map_err(|_| err())?;
        let ms_per_unit: u64 = match unit.trim() {
            "ms" => 1,
            "s" => 1_000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(err()),
        };
        n.checked_mul(ms_per_unit).map(Self::from_millis).ok_or_else(err)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
            if ms != 0 && ms.is_multiple_of(size) {
                return write!(f, "{}{unit}", ms / size);
            }
        }
        write!(f, "{ms}ms")
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Millis(u64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Millis(ms) => Ok(Self::from_millis(ms)),
            Raw::Text(text) => text.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!("500ms".parse(), Ok(Duration::from_millis(500)));
        assert_eq!("5s".parse(), Ok(Duration::from_secs(5)));
        assert_eq!("1m".parse(), Ok(Duration::from_secs(60)));
        assert_eq!("2h".parse(), Ok(Duration::from_secs(7200)));
        assert_eq!("1d".parse(), Ok(Duration::from_secs(86_400)));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "5", "s", "5x", "-1s", "1.5s", "99999999999999999999d"] {
            assert!(bad.parse::<Duration>().is_err(), "{bad}");
        }
    }

    #[test]
    fn displays_in_the_largest_exact_unit() {
        assert_eq!(Duration::from_millis(1500).to_string(), "1500ms");
        assert_eq!(Duration::from_secs(120).to_string(), "2m");
        assert_eq!(Duration::from_millis(0).to_string(), "0ms");
    }
}
