//! What the attacks on `Pushback`'s dialects share: exact holds computed independently of the
//! crate, dates written by hand, and the calls that read a pushback's refusals.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use http::{HeaderValue, Response};
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::{self, Pushback};
use tower_bulwark::BoxError;

// ---------------------------------------------------------------------------------------------
// Helpers.

/// A status, its fields, and the hold they should cause.
pub(crate) type Expected<'a> = (u16, &'a [(&'a str, &'a str)], Duration);

pub(crate) const TEN_MIN: Duration = Duration::from_secs(600);
/// A cap far above every exact value these tests compute, so that the value itself shows.
pub(crate) const HUGE: Duration = Duration::from_secs(1 << 42);
pub(crate) const S: fn(u64) -> Duration = Duration::from_secs;
pub(crate) const MS: fn(u64) -> Duration = Duration::from_millis;
pub(crate) const NS: fn(u64) -> Duration = Duration::from_nanos;
/// Stands for a reset beyond 500 years (31 000 years here): checked with `assert_cut`.
pub(crate) const SATURATED: Duration = Duration::MAX;

/// 2001-09-09T01:46:40Z, Unix time 10^9, as an HTTP-date.
pub(crate) const D1E9: &str = "Sun, 09 Sep 2001 01:46:40 GMT";

/// A `Pushback` for "attack" holding calls at most `max_hold`, on a `ManualClock`, and the
/// clock.
pub(crate) fn make(max_hold: Duration) -> (Pushback<ManualClock>, ManualClock) {
    super::hostile_support::on_manual_clock(Pushback::builder("attack").max_hold(max_hold))
}

pub(crate) fn answer(status: u16, headers: &[(&str, &[u8])]) -> Response<()> {
    let mut response = Response::new(());
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
    for (name, value) in headers {
        let value = HeaderValue::from_bytes(value).expect("a valid header value");
        response.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value,
        );
    }
    response
}

pub(crate) fn answer_str(status: u16, headers: &[(&str, &str)]) -> Response<()> {
    let bytes: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    answer(status, &bytes)
}

/// How long calls are held right after one answer, with `max_hold`.
pub(crate) fn held_with(max_hold: Duration, status: u16, headers: &[(&str, &str)]) -> Duration {
    let (pushback, _) = make(max_hold);
    pushback.observe(&answer_str(status, headers));
    pushback.held_for()
}

pub(crate) fn held(status: u16, headers: &[(&str, &str)]) -> Duration {
    held_with(TEN_MIN, status, headers)
}

thread_local! {
    static RUNTIME: RefCell<tokio::runtime::Runtime> = RefCell::new(
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    );
}

/// One call through the pushback's layer to a dependency that answers `200` with no fields:
/// `Ok` when it reached the dependency, `Err(wait)` when refused.
pub(crate) fn call(pushback: &Pushback<ManualClock>) -> Result<(), Duration> {
    let client = pushback.layer().layer(service_fn(|()| async {
        Ok::<_, BoxError>(Response::new(()))
    }));
    RUNTIME.with(|rt| {
        let rt = rt.borrow();
        let _guard = rt.enter();
        match client.oneshot(()).now_or_never().expect("decided at once") {
            Ok(_) => Ok(()),
            Err(err) => Err(outbound::retry_after(&*err).expect("only refusals fail")),
        }
    })
}

/// Checks the refusal promise where the pushback stands: if a call is refused with `wait`,
/// `held_for` says the same, a call a nanosecond before `wait` is still refused, and a call at
/// `wait` is admitted. Returns whether the first call was refused.
pub(crate) fn refusal_is_exact(
    pushback: &Pushback<ManualClock>,
    clock: &ManualClock,
) -> Result<bool, String> {
    let held = pushback.held_for();
    match call(pushback) {
        Ok(()) => {
            if held != Duration::ZERO {
                return Err(format!("held_for said {held:?} but a call went"));
            }
            Ok(false)
        }
        Err(wait) => {
            if held != wait {
                return Err(format!("held_for {held:?} but the refusal said {wait:?}"));
            }
            if wait == Duration::ZERO {
                return Err("refused with a wait of zero".into());
            }
            clock.advance(wait - NS(1));
            match call(pushback) {
                Err(rest) if rest == NS(1) => {}
                other => return Err(format!("1 ns before {wait:?}: {other:?}")),
            }
            clock.advance(NS(1));
            if let Err(again) = call(pushback) {
                return Err(format!(
                    "refused with {wait:?}, then at it refused again with {again:?}"
                ));
            }
            Ok(true)
        }
    }
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
pub(crate) fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        yoe + era * 400 + i64::from(month <= 2),
        month as u32,
        day as u32,
    )
}

/// A Unix time as an IMF-fixdate.
pub(crate) fn http_date(unix: i64) -> String {
    let (days, rest) = (unix.div_euclid(86_400), unix.rem_euclid(86_400));
    let (y, m, d) = civil(days);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][days.rem_euclid(7) as usize];
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ][m as usize - 1];
    format!(
        "{weekday}, {d:02} {month} {y:04} {:02}:{:02}:{:02} GMT",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

/// A Unix time as RFC 3339, written at UTC offset `offset` minutes, with `frac` (".123" or "").
pub(crate) fn rfc3339(unix: i64, frac: &str, offset: i64) -> String {
    let local = unix + offset * 60;
    let (days, rest) = (local.div_euclid(86_400), local.rem_euclid(86_400));
    let (y, m, d) = civil(days);
    let zone = if offset == 0 {
        "Z".to_string()
    } else {
        let sign = if offset < 0 { '-' } else { '+' };
        format!("{sign}{:02}:{:02}", offset.abs() / 60, offset.abs() % 60)
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}{zone}",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

/// Decimal digits after a point, as nanoseconds rounded up.
pub(crate) fn frac_nanos_up(digits: &str) -> u64 {
    let mut nanos = 0u64;
    for (i, c) in digits.chars().enumerate() {
        let digit = c.to_digit(10).unwrap() as u64;
        if i < 9 {
            nanos = nanos * 10 + digit;
        } else if digit != 0 {
            let scale = 10u64.pow(9 - digits.len().min(9) as u32);
            return nanos * scale + 1;
        }
    }
    nanos * 10u64.pow(9 - digits.len().min(9) as u32)
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// "cut to `max_hold`": exactly `max_hold` up to 500 years; above that the hold need only be
/// at least 500 years and no more than `max_hold` (it saturates at `u64::MAX` ns, ~584 years).
pub(crate) fn assert_cut(held: Duration, max_hold: Duration, case: &str) {
    const CENTURIES: Duration = Duration::from_secs(500 * 365 * 86_400);
    assert!(held <= max_hold, "{case}: {held:?} > max_hold {max_hold:?}");
    if max_hold <= CENTURIES {
        assert_eq!(held, max_hold, "{case}");
    } else {
        assert!(held >= CENTURIES, "{case}: {held:?}");
    }
}

pub(crate) fn about(held: Duration, expected: Duration) -> bool {
    held + S(2) >= expected && held <= expected + S(1)
}

#[test]
pub(crate) fn helpers_agree_with_known_dates() {
    assert_eq!(http_date(1_000_000_000), D1E9);
    assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
    assert_eq!(rfc3339(1_000_000_000, "", 0), "2001-09-09T01:46:40Z");
    assert_eq!(rfc3339(1_000_000_000, "", 60), "2001-09-09T02:46:40+01:00");
    assert_eq!(http_date(1_709_164_800), "Thu, 29 Feb 2024 00:00:00 GMT");
    assert_eq!(frac_nanos_up("5"), 500_000_000);
    assert_eq!(frac_nanos_up("123456789"), 123_456_789);
    assert_eq!(frac_nanos_up("0000000001"), 1);
    assert_eq!(frac_nanos_up("1234567890000"), 123_456_789);
}
