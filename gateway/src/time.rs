//! UTC timestamps for messages and listings, without a date-time crate.

use std::time::{SystemTime, UNIX_EPOCH};

/// A Unix time in milliseconds as UTC `YYYY-MM-DDTHH:MM:SSZ` (days to
/// civil date after Howard Hinnant's algorithm; times before 1970 too).
pub fn utc_timestamp(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// [`utc_timestamp`] of a [`SystemTime`] (one before 1970 as 1970).
pub fn utc(time: SystemTime) -> String {
    let ms = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    utc_timestamp(i64::try_from(ms).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_timestamp(1_764_547_200_000), "2025-12-01T00:00:00Z");
        assert_eq!(
            utc_timestamp(951_782_400_000 + 86_399_000),
            "2000-02-29T23:59:59Z"
        );
        assert_eq!(utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            utc(UNIX_EPOCH + Duration::from_secs(253_402_300_799)),
            "9999-12-31T23:59:59Z"
        );
    }
}
