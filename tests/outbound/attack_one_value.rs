//! A field meant to hold one value, read by one rule wherever the crate reads one (`Date`,
//! `grpc-status`, `grpc-retry-pushback-ms`): lines that all say the same count once, lines that
//! differ, more than 16 lines or more than 4 KiB are ignored. Found by a blind attack: the
//! pushback read a `Date` on two identical lines as none, and the gRPC fields by their first
//! line only. Each test quotes the docs it holds the code to.

use std::time::Duration;

#[cfg(feature = "grpc")]
use {
    http::{HeaderMap, HeaderValue, Response},
    tower::{service_fn, Layer, ServiceExt},
    tower_bulwark::BoxError,
    tower_bulwark::{clock::ManualClock, outbound::Pushback},
};

#[cfg(feature = "grpc")]
use super::dialects_support::make;
use super::dialects_support::{held_with, http_date, rfc3339};

const MAX_HOLD: Duration = Duration::from_secs(60);

/// A Unix time far from now, above 10^9 so resets near it read as Unix times: 2004-11-09.
const T0: i64 = 1_100_000_000;

#[cfg(feature = "grpc")]
fn pushback() -> Pushback<ManualClock> {
    make(MAX_HOLD).0
}

/// The hold right after one answer of `status` and `fields`.
fn hold(status: u16, fields: &[(&str, &str)]) -> Duration {
    held_with(MAX_HOLD, status, fields)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

// src/outbound/pushback/mod.rs: "A date is read against the response's own `Date` field when it
// has one", and "Another field on several lines counts where they all say the same (a proxy and
// the server may each add it)".

#[test]
fn a_date_on_two_identical_lines_is_the_answers_date() {
    let date = http_date(T0);
    let reset = (T0 + 30).to_string();
    let anthropic = rfc3339(T0 + 30, "", 0);
    let got = [
        hold(
            200,
            &[
                ("date", &date),
                ("date", &date),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", &reset),
            ],
        ),
        hold(
            200,
            &[
                ("date", &date),
                ("date", &date),
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", &anthropic),
            ],
        ),
        hold(
            429,
            &[
                ("date", &date),
                ("date", &date),
                ("retry-after", &http_date(T0 + 30)),
            ],
        ),
    ];
    assert_eq!(
        got,
        [secs(30); 3],
        "x-ratelimit-reset, anthropic reset, Retry-After date against two identical Dates"
    );
}

// ---------------------------------------------------------------------------------------------
// Part A: repeated, huge, non-UTF-8.
// ---------------------------------------------------------------------------------------------

// src/outbound/pushback/mod.rs:137-141: "Malformed values (...fields over 4 KiB or of more than
// 16 lines) are ignored and logged; none panics. Several `Retry-After` lines are not an error:
// the longest counts. Another field on several lines counts where they all say the same ... and
// is ignored, logged, where they differ." And mod.rs:53-55: "A 429 with neither a readable

/// A gRPC answer's fields: status `code` and the pushback lines.
#[cfg(feature = "grpc")]
fn grpc(code: &str, pushback: &[&str]) -> Vec<(&'static str, String)> {
    let mut fields = vec![("grpc-status", code.to_owned())];
    fields.extend(
        pushback
            .iter()
            .map(|p| ("grpc-retry-pushback-ms", (*p).to_owned())),
    );
    fields
}

#[cfg(feature = "grpc")]
fn grpc_hold(code: &str, pushback: &[&str]) -> Duration {
    let fields = grpc(code, pushback);
    let fields: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (*n, v.as_str())).collect();
    hold(200, &fields)
}

// src/outbound/pushback/mod.rs:139-141: "Another field on several lines counts where they all
// say the same (a proxy and the server may each add it) and is ignored, logged, where they
// differ."
#[cfg(feature = "grpc")]
#[test]
fn grpc_pushback_on_differing_lines_is_ignored() {
    assert_eq!(
        grpc_hold("8", &["2000", "2000"]),
        secs(2),
        "alike lines count"
    );
    let got = [
        grpc_hold("8", &["100", "5000"]),
        grpc_hold("8", &["5000", "100"]),
        grpc_hold("8", &["-1", "5000"]),
        grpc_hold("8", &["5000", "-1"]),
    ];
    assert_eq!(
        got,
        [Duration::ZERO; 4],
        "lines [100, 5000], [5000, 100], [-1, 5000], [5000, -1]"
    );
}

// src/outbound/pushback/mod.rs:137-139: "Malformed values (negative, not numbers, bytes that
// are not text, fields over 4 KiB or of more than 16 lines) are ignored and logged".
#[cfg(feature = "grpc")]
#[test]
fn grpc_pushback_over_4_kib_or_16_lines_is_ignored() {
    let long = format!("{}5000", "0".repeat(4100));
    let lines = vec!["5000"; 17];
    let got = [grpc_hold("8", &[&long]), grpc_hold("8", &lines)];
    assert_eq!(
        got,
        [Duration::ZERO; 2],
        "[one line of 4104 bytes, 17 lines] of grpc-retry-pushback-ms"
    );
}

// src/outbound/pushback/mod.rs:139-141 ("ignored, logged, where they differ") for the
// `grpc-status` beside the pushback: a status on two differing lines names no status.
#[cfg(feature = "grpc")]
#[test]
fn grpc_status_on_differing_lines_is_ignored() {
    let held = hold(
        200,
        &[
            ("grpc-status", "0"),
            ("grpc-status", "8"),
            ("grpc-retry-pushback-ms", "3000"),
        ],
    );
    let held_rev = hold(
        200,
        &[
            ("grpc-status", "8"),
            ("grpc-status", "0"),
            ("grpc-retry-pushback-ms", "3000"),
        ],
    );
    assert_eq!(
        [held, held_rev],
        [Duration::ZERO; 2],
        "grpc-status [0, 8] and [8, 0]"
    );
}

/// The hold after a gRPC answer of one message whose body ends with `trailers`, read to its end
/// through a pushback layer that reads trailers.
#[cfg(feature = "grpc")]
async fn held_after_trailers(trailers: &[(&'static str, &'static str)]) -> Duration {
    use http_body_util::{BodyExt, StreamBody};
    let mut map = HeaderMap::new();
    for (name, value) in trailers {
        map.append(*name, HeaderValue::from_static(value));
    }
    let p = pushback();
    let client = p.layer().read_trailers().layer(service_fn(move |_: ()| {
        let frames = vec![
            Ok::<_, BoxError>(http_body::Frame::data(bytes::Bytes::from_static(
                b"\0\0\0\0\x01x",
            ))),
            Ok(http_body::Frame::trailers(map.clone())),
        ];
        let body = StreamBody::new(futures::stream::iter(frames));
        async move { Ok::<_, BoxError>(Response::new(body)) }
    }));
    let response = client.oneshot(()).await.unwrap();
    assert_eq!(p.held_for(), Duration::ZERO, "nothing before the trailers");
    response.into_body().collect().await.unwrap();
    p.held_for()
}

// src/outbound/pushback/layer.rs: trailers are read "as the head is read"; mod.rs: "ignored,
// logged, where they differ".
#[cfg(feature = "grpc")]
#[tokio::test(start_paused = true)]
async fn grpc_pushback_in_trailers_on_differing_lines_is_ignored() {
    let alike = [
        ("grpc-status", "8"),
        ("grpc-retry-pushback-ms", "1500"),
        ("grpc-retry-pushback-ms", "1500"),
    ];
    assert_eq!(
        held_after_trailers(&alike).await,
        Duration::from_millis(1500)
    );
    let differing = [
        ("grpc-status", "8"),
        ("grpc-retry-pushback-ms", "100"),
        ("grpc-retry-pushback-ms", "5000"),
    ];
    assert_eq!(held_after_trailers(&differing).await, Duration::ZERO);
}

/// The rule is for fields of one short value: a `grpc-status-details-bin` is a serialized
/// `google.rpc.Status` and may pass 4 KiB (a `DebugInfo` beside the `RetryInfo`); its
/// `RetryInfo` still holds calls (found by a review of the rule: it was ignored).
#[cfg(feature = "grpc")]
#[test]
fn a_retry_info_in_details_over_4_kib_holds_calls() {
    use tonic_types::{ErrorDetails, StatusExt};

    let mut details = ErrorDetails::with_retry_info(Some(Duration::from_secs(30)));
    details.set_debug_info(vec!["at a frame of a long stack".to_owned(); 150], "detail");
    let status = tonic::Status::with_error_details(tonic::Code::ResourceExhausted, "busy", details);
    let trailers_only: Response<()> = status.into_http();
    let details = &trailers_only.headers()["grpc-status-details-bin"];
    assert!(details.len() > 4096, "{}", details.len());
    let p = pushback();
    p.observe(&trailers_only);
    assert_eq!(p.held_for(), secs(30));
}
