//! The one RFC 3339 formatter: every timestamp Airlock writes (audit `ts`, session records,
//! trust records, quarantine manifests, review-plane JSON, Postgres `timestamptz` text) is UTC
//! with a `Z` suffix and a fixed number of fraction digits (RFC 3339 §5.6, `time-secfrac`).
//! Parsing stays with the `time` crate's `Rfc3339` description, which accepts any precision.

use std::time::SystemTime;

use time::{OffsetDateTime, UtcOffset};

/// How many fraction digits follow the seconds; the fraction is truncated, never rounded, so
/// a timestamp never names a later instant than the one it records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fraction {
    /// `.482` — audit lines and everything a person reads.
    Millis,
    /// `.482113` — lossless for the review stores' microsecond clock.
    Micros,
}

/// `2026-07-24T18:03:11.482Z` (or `.482113Z` with [`Fraction::Micros`]), in UTC whatever the
/// offset of `t`.
pub fn rfc3339(t: OffsetDateTime, fraction: Fraction) -> String {
    let dt = t.to_offset(UtcOffset::UTC);
    let date = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    );
    match fraction {
        Fraction::Millis => format!("{date}.{:03}Z", dt.millisecond()),
        Fraction::Micros => format!("{date}.{:06}Z", dt.microsecond()),
    }
}

/// [`rfc3339`] with milliseconds for a system time; times before 1970 (a broken clock) are
/// written as the epoch.
pub fn rfc3339_ms(t: SystemTime) -> String {
    rfc3339(OffsetDateTime::from(t.max(SystemTime::UNIX_EPOCH)), Fraction::Millis)
}

/// Microseconds since the Unix epoch as a UTC time (out of range: the epoch).
pub fn from_micros(us: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use time::format_description::well_known::Rfc3339;

    use super::*;

    #[test]
    fn millis_and_micros_are_fixed_width_utc_and_truncated() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_784_916_191_482_999);
        assert_eq!(rfc3339_ms(t), "2026-07-24T18:03:11.482Z");
        assert_eq!(rfc3339_ms(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(from_micros(1_784_916_191_000_007), Fraction::Micros),
            "2026-07-24T18:03:11.000007Z"
        );
        // Another offset is converted, not just relabelled.
        let east = OffsetDateTime::parse("2026-07-25T02:03:11.5+08:00", &Rfc3339).unwrap();
        assert_eq!(rfc3339(east, Fraction::Millis), "2026-07-24T18:03:11.500Z");
    }

    #[test]
    fn broken_clocks_and_out_of_range_values_give_the_epoch() {
        let before = SystemTime::UNIX_EPOCH - Duration::from_secs(10);
        assert_eq!(rfc3339_ms(before), "1970-01-01T00:00:00.000Z");
        assert_eq!(from_micros(i64::MAX), OffsetDateTime::UNIX_EPOCH);
    }

    #[test]
    fn what_it_writes_parses_back_to_the_same_instant() {
        let t = from_micros(1_700_000_000_123_456);
        let text = rfc3339(t, Fraction::Micros);
        assert_eq!(OffsetDateTime::parse(&text, &Rfc3339).unwrap(), t);
    }
}
