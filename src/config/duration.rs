//! Durations with units, as the file writes them.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};

/// Parses a duration with units: `250ms`, `1s`, `1m30s`, `1.5s`, `2h`. Units: `ns`, `us` (or
/// `µs`), `ms`, `s`, `m`, `h`, `d`. The reader of every duration in the file (the format is
/// the guide's, in the module docs' table of fields).
///
/// # Errors
///
/// A message quoting `text` when it is empty, has a number without a unit, an unknown unit, a
/// malformed number, a fraction of a nanosecond (durations are never rounded), or is longer
/// than `u64::MAX` nanoseconds.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("is empty; write a duration such as \"500ms\"".into());
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let (number, after) = split_before(rest, |c| !numeric(c));
        if number.is_empty() {
            return Err(format!(
                "`{text}` is not a duration; write it such as \"500ms\""
            ));
        }
        let (unit, next) = split_before(after, numeric);
        let nanos = nanos(text, number, unit_scale(text, number, unit.trim())?)?;
        total = total.checked_add(nanos).ok_or_else(|| too_long(text))?;
        rest = next;
    }
    u64::try_from(total)
        .map(Duration::from_nanos)
        .map_err(|_| too_long(text))
}

/// Whether `c` belongs to a number: a digit or a point.
fn numeric(c: char) -> bool {
    c.is_ascii_digit() || c == '.'
}

/// `text` split before the first character `stop` accepts (whole, then empty, when none does),
/// as the pushback's reader of Go durations splits its bytes.
fn split_before(text: &str, stop: impl Fn(char) -> bool) -> (&str, &str) {
    text.split_at(text.find(stop).unwrap_or(text.len()))
}

/// Nanoseconds in one `unit`.
fn unit_scale(text: &str, number: &str, unit: &str) -> Result<u128, String> {
    Ok(match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        "" => return Err(no_unit(text, number)),
        other => {
            return Err(format!(
                "`{text}` has an unknown unit `{other}`; use ns, us, ms, s, m, h or d"
            ))
        }
    })
}

/// `number` (digits with at most one point) times `scale` nanoseconds, exactly.
fn nanos(text: &str, number: &str, scale: u128) -> Result<u128, String> {
    let (whole, fraction) = match number.split_once('.') {
        None => (number, ""),
        Some((whole, fraction)) if !fraction.is_empty() && !fraction.contains('.') => {
            (whole, fraction)
        }
        Some(_) => return Err(format!("`{text}` has a malformed number `{number}`")),
    };
    // Digits only, so parsing fails only when the number is too long; ".5" has a zero whole.
    let whole: u128 = match whole {
        "" => 0,
        digits => digits.parse().map_err(|_| too_long(text))?,
    };
    // A fraction finer than a nanosecond would be rounded, and "0.5ns" would silently become
    // zero (for `max_wait`: never wait): refuse it instead.
    let fraction = fraction.trim_end_matches('0');
    let fraction_nanos = (fraction.len() <= 18).then(|| {
        let scaled = fraction.parse::<u128>().unwrap_or(0) * scale;
        let divisor = 10u128.pow(fraction.len() as u32);
        (scaled % divisor == 0).then_some(scaled / divisor)
    });
    let Some(Some(fraction_nanos)) = fraction_nanos else {
        return Err(format!(
            "`{text}` is not a whole number of nanoseconds; durations are counted in nanoseconds \
             and are never rounded"
        ));
    };
    whole
        .checked_mul(scale)
        .and_then(|w| w.checked_add(fraction_nanos))
        .ok_or_else(|| too_long(text))
}

fn too_long(text: &str) -> String {
    format!("`{text}` is too long")
}

/// The error of `text`, whose last part is `number` without a unit.
fn no_unit(text: &str, number: &str) -> String {
    format!("`{text}` has no unit; write it with one, such as \"{number}ms\" or \"{number}s\"")
}

/// Reads a duration field of the file: a string with units. A bare number is refused rather
/// than guessed, because one library reads 500 as nanoseconds and another as milliseconds.
pub(super) fn with_units<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    struct WithUnits;
    impl Visitor<'_> for WithUnits {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration string such as \"500ms\"")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
            parse_duration(text).map_err(E::custom)
        }

        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Duration, E> {
            let n = n.to_string();
            Err(E::custom(no_unit(&n, &n)))
        }
    }
    d.deserialize_any(WithUnits)
}

/// [`with_units`] for a field that may be left out.
pub(super) fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    with_units(d).map(Some)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn durations_need_units() {
        let ok = [
            ("500ms", Duration::from_millis(500)),
            ("1s", Duration::from_secs(1)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5s", Duration::from_millis(1500)),
            ("2h", Duration::from_secs(7200)),
            ("250us", Duration::from_micros(250)),
            ("0s", Duration::ZERO),
            (" 10 ms ", Duration::from_millis(10)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "500",
            "ms",
            "1x",
            "1..5s",
            "-1s",
            "99999999999999999999999d",
            "1.s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should fail");
        }
        assert!(parse_duration("500").unwrap_err().contains("no unit"));
    }

    /// "0.5ns" truncated to zero would mean, for `max_wait`, never wait.
    #[test]
    fn durations_finer_than_a_nanosecond_are_refused_not_rounded() {
        for bad in ["0.5ns", "1.5ns", "0.0001us", "1.0000000001s", "0.5ns1s"] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(err.contains(bad) && err.contains("nanoseconds"), "{err}");
        }
        let ok = [
            ("0.5us", Duration::from_nanos(500)),
            ("1.000000001s", Duration::from_nanos(1_000_000_001)),
            ("1.50s", Duration::from_millis(1500)),
            ("0.0s", Duration::ZERO),
            (".5s", Duration::from_millis(500)),
            ("18446744073709551615ns", Duration::from_nanos(u64::MAX)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        assert!(parse_duration("18446744073709551616ns")
            .unwrap_err()
            .contains("too long"));
    }

    const UNITS: [(&str, u64); 8] = [
        ("ns", 1),
        ("us", 1_000),
        ("µs", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
        ("m", 60_000_000_000),
        ("h", 3_600_000_000_000),
        ("d", 86_400_000_000_000),
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4_000))]

        /// Any text, and text built from the pieces durations are made of, is a duration or an
        /// error that quotes it: never a panic.
        #[test]
        fn any_text_is_a_duration_or_an_error_naming_it(
            text in prop_oneof![
                any::<String>(),
                proptest::collection::vec(
                    prop_oneof![
                        Just("."), Just("0"), Just("9"), Just("1"), Just("ns"), Just("µs"),
                        Just("s"), Just("d"), Just(" "), Just("-"), Just("e"),
                        Just("99999999999999999999999"),
                    ],
                    0..12,
                ).prop_map(|parts| parts.concat()),
            ]
        ) {
            if let Err(message) = parse_duration(&text) {
                prop_assert!(!message.is_empty());
                if !text.trim().is_empty() {
                    prop_assert!(message.contains(&format!("`{text}`")), "{message}");
                }
            }
        }

        /// A whole number with a unit is exactly that many nanoseconds, or "too long": never
        /// wrapped, never rounded.
        #[test]
        fn whole_numbers_with_units_are_exact(n in any::<u64>(), unit in 0..UNITS.len()) {
            let (name, scale) = UNITS[unit];
            let text = format!("{n}{name}");
            match n.checked_mul(scale) {
                Some(nanos) => prop_assert_eq!(
                    parse_duration(&text),
                    Ok(Duration::from_nanos(nanos))
                ),
                None => {
                    let message = parse_duration(&text).unwrap_err();
                    prop_assert!(message.contains("too long"), "{message}");
                }
            }
        }
    }
}
