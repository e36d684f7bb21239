//! The ways dependencies write a span or an instant in their rate-limit fields: decimal seconds
//! (`2.0`, `64.57`), Go durations (`6m0s`, `20ms`, `1h2m3.5s`, as OpenAI writes its resets),
//! Unix times in seconds or milliseconds, with or without a fraction, and RFC 3339 timestamps
//! (as Anthropic writes its resets).
//!
//! Every reader here takes bytes from the network and answers `None` for anything it does not
//! recognise: no panic, no overflow (numbers saturate), no allocation.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::whole_number;

/// A reset of at least this many seconds is a Unix time (2001-09-09 or later); a smaller one is
/// a number of seconds from now. No window of a real API lasts 31 years, and no API answering
/// today sends a reset time before 2001.
const EPOCH_SECONDS_FROM: u64 = 1_000_000_000;

/// A reset of at least this many is a Unix time in milliseconds (2001-09-09 or later, read in
/// milliseconds): as seconds it would be more than 31 000 years away.
const EPOCH_MILLIS_FROM: u64 = 1_000_000_000_000;

/// A non-negative decimal number (`64`, `64.57`, `.5`): its whole part as written, saturating,
/// and its fraction in billionths, rounded up past the ninth decimal (so up to 10^9, a whole
/// one). `None` for anything else, signs and exponents included.
fn decimal(text: &[u8]) -> Option<(u64, u32)> {
    let text = text.trim_ascii();
    let mut parts = text.splitn(2, |&b| b == b'.');
    let (whole, fraction) = (parts.next()?, parts.next().unwrap_or_default());
    let all_digits = |part: &[u8]| part.iter().all(u8::is_ascii_digit);
    if !all_digits(whole) || !all_digits(fraction) || (whole.is_empty() && fraction.is_empty()) {
        return None;
    }
    let whole = whole_number(whole).unwrap_or(0);
    let digit = |i: usize| fraction.get(i).map_or(0, |d| u32::from(d - b'0'));
    let nanos = (0..9).fold(0, |nanos, i| nanos * 10 + digit(i));
    let beyond = fraction.iter().skip(9).any(|&d| d != b'0');
    Some((whole, nanos + u32::from(beyond)))
}

/// `whole` seconds and `billionths` of one, saturating.
fn in_seconds(whole: u64, billionths: u32) -> Duration {
    Duration::from_secs(whole).saturating_add(Duration::from_nanos(u64::from(billionths)))
}

/// `whole` units of `unit_nanos` nanoseconds and `billionths` of one, the fraction rounded up
/// to the nanosecond; saturating.
fn in_unit(whole: u64, billionths: u32, unit_nanos: u128) -> Duration {
    let nanos = u128::from(whole) * unit_nanos
        + (u128::from(billionths) * unit_nanos).div_ceil(1_000_000_000);
    u64::try_from(nanos).map_or(Duration::MAX, Duration::from_nanos)
}

/// Non-negative decimal seconds (`2`, `2.0`, `64.57`), rounded up to the nanosecond.
pub(super) fn seconds(text: &[u8]) -> Option<Duration> {
    decimal(text).map(|(whole, billionths)| in_seconds(whole, billionths))
}

/// A Go duration: one or more numbers, each with a unit (`h`, `m`, `s`, `ms`, `us` or `µs`,
/// `ns`), such as `1s`, `6m0s`, `20ms` or `1h2m3.5s`. Saturates rather than overflows.
pub(super) fn go_duration(text: &[u8]) -> Option<Duration> {
    let mut rest = text.trim_ascii();
    if rest.is_empty() {
        return None;
    }
    let numeric = |b: &u8| b.is_ascii_digit() || *b == b'.';
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        // An empty number, or one with no unit after it, is no duration.
        let (number, after) = split_before(rest, |b| !numeric(b));
        let (whole, billionths) = decimal(number)?;
        let (unit, after) = split_before(after, numeric);
        let nanos_per: u128 = match unit {
            b"h" => 3_600_000_000_000,
            b"m" => 60_000_000_000,
            b"s" => 1_000_000_000,
            b"ms" => 1_000_000,
            // `µs` with the micro sign (U+00B5) or the Greek mu (U+03BC), as Go reads both.
            b"us" | [0xC2, 0xB5, b's'] | [0xCE, 0xBC, b's'] => 1_000,
            b"ns" => 1,
            _ => return None,
        };
        rest = after;
        total = total.saturating_add(in_unit(whole, billionths, nanos_per));
    }
    Some(total)
}

/// `text` split before the first byte `stop` accepts (whole, then empty, when none does).
fn split_before(text: &[u8], stop: impl Fn(&u8) -> bool) -> (&[u8], &[u8]) {
    text.split_at(text.iter().position(stop).unwrap_or(text.len()))
}

/// When a reset falls (or a hold ends): at an instant, or a span from now. [`reset`] reads it
/// written as a Unix time (seconds from 10^9, milliseconds from 10^12, either with a fraction),
/// as seconds from now (whole or decimal), or as a Go duration.
pub(super) enum Reset {
    At(SystemTime),
    In(Duration),
}

/// Reads a reset as [`Reset`] says; `None` for anything else.
pub(super) fn reset(text: &[u8]) -> Option<Reset> {
    let Some((whole, billionths)) = decimal(text) else {
        return go_duration(text).map(Reset::In);
    };
    // The magnitude is that of the digits written, before any rounding of the fraction
    // (`999999999.9999999999` is seconds from now, though it rounds up to 10^9).
    let since_epoch = if whole >= EPOCH_MILLIS_FROM {
        // The fraction is of a millisecond.
        in_unit(whole, billionths, 1_000_000)
    } else if whole >= EPOCH_SECONDS_FROM {
        in_seconds(whole, billionths)
    } else {
        return Some(Reset::In(in_seconds(whole, billionths)));
    };
    // A time past what `SystemTime` holds is as far away as any hold may be.
    Some(
        UNIX_EPOCH
            .checked_add(since_epoch)
            .map_or(Reset::In(Duration::MAX), Reset::At),
    )
}

/// The days of each month of a common year.
const DAYS_IN_MONTH: [u64; 12] = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

/// `text` as a number, if it is ASCII digits only (at most four here: no overflow).
fn digits(text: &[u8]) -> Option<u64> {
    (text.iter().all(u8::is_ascii_digit))
        .then(|| text.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
}

/// The leap years of the Gregorian calendar from year 1 to `year`.
fn leap_years_to(year: u64) -> u64 {
    year / 4 - year / 100 + year / 400
}

/// An RFC 3339 timestamp (`2025-08-21T12:40:59Z`, `2025-08-21T12:40:59.5+02:00`); `None` for
/// anything else, a date that does not exist included.
pub(super) fn rfc3339(text: &[u8]) -> Option<SystemTime> {
    let text = text.trim_ascii();
    let number = |range: std::ops::Range<usize>| digits(text.get(range)?);
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if separators.iter().any(|&(i, c)| text.get(i) != Some(&c))
        || !matches!(text.get(10), Some(b'T' | b't' | b' '))
    {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let mut rest = &text[19..];
    let mut nanos = 0;
    if let Some(fraction) = rest.strip_prefix(b".") {
        let (digits, after) = split_before(fraction, |b| !b.is_ascii_digit());
        nanos = decimal(&rest[..digits.len() + 1])?.1;
        rest = after;
    }
    let offset = match rest {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let minutes = digits(&rest[1..3])? * 60 + digits(&rest[4..6])?;
            i64::try_from(minutes).ok()? * if *sign == b'+' { 60 } else { -60 }
        }
        _ => return None,
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in = |month: u64| DAYS_IN_MONTH[month as usize - 1] + u64::from(month == 2 && leap);
    if !(1..=12).contains(&month)
        || !(1..=days_in(month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
        || year < 1970
    {
        return None;
    }
    // Days since 1970-01-01 of the civil date (the proleptic Gregorian calendar).
    let days_before_year = 365 * (year - 1970) + leap_years_to(year - 1) - leap_years_to(1969);
    let days = days_before_year + (1..month).map(days_in).sum::<u64>() + day - 1;
    let local = days * 86_400 + hour * 3_600 + minute * 60 + second;
    let utc = i64::try_from(local).ok()?.checked_sub(offset)?;
    UNIX_EPOCH.checked_add(Duration::new(u64::try_from(utc).ok()?, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that `parse` reads none of `texts`.
    fn rejects<T: std::fmt::Debug>(parse: impl Fn(&[u8]) -> Option<T>, texts: &[&[u8]]) {
        for text in texts {
            assert!(parse(text).is_none(), "{text:?}");
        }
    }

    #[test]
    fn decimals_round_up_past_the_nanosecond() {
        assert_eq!(seconds(b"2.0"), Some(Duration::from_secs(2)));
        assert_eq!(seconds(b" 64.57 "), Some(Duration::from_millis(64_570)));
        assert_eq!(seconds(b".5"), Some(Duration::from_millis(500)));
        assert_eq!(seconds(b"0.0000000001"), Some(Duration::from_nanos(1)));
        assert_eq!(seconds(b"0.9999999999"), Some(Duration::from_secs(1)));
        rejects(
            seconds,
            &[
                &b""[..],
                b".",
                b"-1",
                b"1e3",
                b"1.2.3",
                b"1,5",
                b"+2",
                b"NaN",
            ],
        );
        assert_eq!(seconds(&[b'9'; 40]), Some(Duration::new(u64::MAX, 0)));
    }

    #[test]
    fn go_durations_as_openai_writes_them() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration(b"1s"), Some(ms(1_000)));
        assert_eq!(go_duration(b"6m0s"), Some(ms(360_000)));
        assert_eq!(go_duration(b"20ms"), Some(ms(20)));
        assert_eq!(go_duration(b"1h2m3.5s"), Some(ms(3_723_500)));
        assert_eq!(go_duration(b"1.5us"), Some(Duration::from_nanos(1_500)));
        assert_eq!(
            go_duration("3µs".as_bytes()),
            Some(Duration::from_micros(3))
        );
        rejects(
            go_duration,
            &[&b""[..], b"1", b"s", b"1x", b"-1s", b"1 s", b"1s2", b"ms"],
        );
        let huge = format!("{}h", "9".repeat(30));
        assert_eq!(go_duration(huge.as_bytes()), Some(Duration::MAX));
    }

    #[test]
    fn resets_are_told_apart_by_magnitude() {
        let at = |d: Duration| Some(UNIX_EPOCH + d);
        let read = |text: &[u8]| match reset(text)? {
            Reset::At(at) => Some(at),
            Reset::In(_) => None,
        };
        let span = |text: &[u8]| match reset(text)? {
            Reset::In(span) => Some(span),
            Reset::At(_) => None,
        };
        assert_eq!(span(b"30"), Some(Duration::from_secs(30)));
        assert_eq!(span(b"64.57"), Some(Duration::from_millis(64_570)));
        assert_eq!(span(b"1s"), Some(Duration::from_secs(1)));
        assert_eq!(read(b"1470173023"), at(Duration::from_secs(1_470_173_023)));
        assert_eq!(
            read(b"1470173023.123"),
            at(Duration::from_millis(1_470_173_023_123))
        );
        assert_eq!(
            read(b"1470173023123"),
            at(Duration::from_millis(1_470_173_023_123))
        );
        assert!(reset(b"soon").is_none());
    }

    #[test]
    fn rfc3339_timestamps_as_anthropic_writes_them() {
        let at = |s: u64, n: u32| Some(UNIX_EPOCH + Duration::new(s, n));
        assert_eq!(rfc3339(b"2025-08-21T12:40:59Z"), at(1_755_780_059, 0));
        assert_eq!(
            rfc3339(b"2025-08-21T14:40:59.25+02:00"),
            at(1_755_780_059, 250_000_000)
        );
        assert_eq!(rfc3339(b"1970-01-01T00:00:00Z"), at(0, 0));
        assert_eq!(rfc3339(b"2024-02-29T00:00:00Z"), at(1_709_164_800, 0));
        rejects(
            rfc3339,
            &[
                &b"2025-02-29T00:00:00Z"[..],
                b"2025-13-01T00:00:00Z",
                b"2025-08-21T24:00:00Z",
                b"2025-08-21 12:40:59",
                b"2025-08-21T12:40:59+2:00",
                b"1969-12-31T23:59:59Z",
                b"",
                b"2025-08-21T12:40:59.Z",
            ],
        );
    }
}
