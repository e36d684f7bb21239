//! A call of N tokens waits until the dependency's answers say N are left: OpenAI's and
//! Anthropic's token families read with their limits, tokens coming back at an even pace until
//! the reset, the calls in flight counted, and calls refused below giving their tokens back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Response;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::{self, Pushback, PushedBack};
use tower_bulwark::BoxError;

/// An answer with OpenAI's token fields (platform.openai.com/docs/guides/rate-limits, "Rate
/// limits in headers": `x-ratelimit-limit-tokens`, `x-ratelimit-remaining-tokens`,
/// `x-ratelimit-reset-tokens`, the time until the limit is whole again).
fn openai(limit: u64, remaining: u64, reset: &str) -> Response<()> {
    Response::builder()
        .header("x-ratelimit-limit-requests", "10000")
        .header("x-ratelimit-remaining-requests", "9999")
        .header("x-ratelimit-reset-requests", "6ms")
        .header("x-ratelimit-limit-tokens", limit.to_string())
        .header("x-ratelimit-remaining-tokens", remaining.to_string())
        .header("x-ratelimit-reset-tokens", reset)
        .body(())
        .unwrap()
}

/// A call's tokens: its request says them.
fn tokens_of(request: &u32) -> u32 {
    *request
}

/// 10 000 tokens that are whole again 9.5 s after an answer that left 500: they come back at
/// 1 000 a second. A call of 400 goes at once, one of 1 000 then waits until 900 more have come
/// back (900 ms, to the nanosecond), and with `max_wait` shorter than that it is refused with
/// that time; a call of no tokens goes whatever the tokens say.
#[tokio::test]
async fn a_call_of_n_tokens_waits_until_n_are_back() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("llm").clock(clock.clone()).build();
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let client = pushback
        .layer()
        .cost_by(tokens_of)
        .layer(service_fn(move |_: u32| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, BoxError>(Response::new(())) }
        }));
    pushback.observe(&openai(10_000, 500, "9.5s"));
    client.clone().oneshot(400).await.unwrap();
    let refused = client.clone().oneshot(1000).await.unwrap_err();
    assert!(refused.is::<PushedBack>(), "{refused}");
    assert_eq!(
        outbound::retry_after(&*refused),
        Some(Duration::from_millis(900))
    );
    client.clone().oneshot(0).await.unwrap();
    clock.advance(Duration::from_millis(899));
    assert!(
        client.clone().oneshot(1000).await.is_err(),
        "a millisecond early"
    );
    clock.advance(Duration::from_millis(1));
    client.clone().oneshot(1000).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// Without a limit, tokens come back only at the reset (Anthropic's families, with the one of
/// fewest left binding: docs.anthropic.com/en/api/rate-limits, "Response headers"). A call of
/// more tokens than are left waits for the reset; of fewer, it goes.
#[tokio::test]
async fn without_a_limit_tokens_come_back_at_the_reset() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("claude").clock(clock.clone()).build();
    let client = pushback
        .layer()
        .cost_by(tokens_of)
        .layer(service_fn(|_: u32| async {
            Ok::<_, BoxError>(Response::new(()))
        }));
    // An RFC 3339 time 30 s from now, written as the server would.
    let in_30s = time_in(30);
    let answer = Response::builder()
        .header("anthropic-ratelimit-requests-remaining", "49")
        .header("anthropic-ratelimit-requests-reset", in_30s.as_str())
        .header("anthropic-ratelimit-input-tokens-remaining", "20000")
        .header("anthropic-ratelimit-input-tokens-reset", in_30s.as_str())
        .header("anthropic-ratelimit-output-tokens-remaining", "300")
        .header("anthropic-ratelimit-output-tokens-reset", in_30s.as_str())
        .body(())
        .unwrap();
    pushback.observe(&answer);
    client.clone().oneshot(300).await.unwrap();
    let refused = client.clone().oneshot(1).await.unwrap_err();
    let wait = outbound::retry_after(&*refused).unwrap();
    assert!(
        wait > Duration::from_secs(28) && wait <= Duration::from_secs(30),
        "{wait:?}"
    );
}

/// An RFC 3339 time `ahead` seconds from now, in UTC, to the second.
fn time_in(ahead: u64) -> String {
    let at = std::time::SystemTime::now() + Duration::from_secs(ahead);
    let text = httpdate::fmt_http_date(at);
    // "Sun, 06 Nov 1994 08:49:37 GMT" to "1994-11-06T08:49:37Z".
    let parts: Vec<&str> = text.split(' ').collect();
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| *m == parts[2])
    .unwrap()
        + 1;
    format!("{}-{:02}-{}T{}Z", parts[3], month, parts[1], parts[4])
}

/// Calls in flight hold their tokens, and a call refused below before it was sent gives them
/// back. With 1 000 left and nothing coming back before the reset: A (400) is in flight; D
/// (401) is refused below, unsent; B (400) goes, which it could not had D kept its tokens; C
/// (400) is then held, 800 being in flight.
#[tokio::test]
async fn calls_in_flight_hold_their_tokens_and_unsent_calls_give_them_back() {
    let clock = ManualClock::new();
    let pushback = Pushback::builder("llm").clock(clock.clone()).build();
    let (release, gate) = tokio::sync::watch::channel(false);
    let client = pushback
        .layer()
        .cost_by(tokens_of)
        .layer(service_fn(move |n: u32| {
            let mut gate = gate.clone();
            async move {
                if n == 401 {
                    // What a quota below says of a call it can never admit: nothing was sent.
                    let below =
                        tower_bulwark::DirectRateLimiter::new(tower_bulwark::Quota::per_hour(1)?);
                    return Err(BoxError::from(below.check_n(2).unwrap_err()));
                }
                gate.wait_for(|open| *open).await.unwrap();
                Ok::<_, BoxError>(Response::new(()))
            }
        }));
    let answer = Response::builder()
        .header("x-ratelimit-remaining-tokens", "1000")
        .header("x-ratelimit-reset-tokens", "1m0s")
        .body(())
        .unwrap();
    pushback.observe(&answer);
    let a = tokio::spawn(client.clone().oneshot(400));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(client.clone().oneshot(401).await.is_err());
    let b = tokio::spawn(client.clone().oneshot(400));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let c = client.clone().oneshot(400).await.unwrap_err();
    assert!(c.is::<PushedBack>(), "800 of 1 000 are in flight: {c}");
    let _ = release.send(true);
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
}

/// The token fields of both families, limits included.
const TOKEN_FIELDS: [&str; 13] = [
    "retry-after",
    "date",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
];

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(600))]

    /// Hostile values in the token fields (limits below what is left, absurd resets, bytes of
    /// any kind), a call of any size: nothing panics, no call is held beyond `max_hold`, and
    /// the time a refusal gives is exact: a nanosecond sooner the call is refused, then it goes.
    #[test]
    fn hostile_token_fields_hold_no_call_beyond_max_hold_and_refusals_are_exact(
        max_hold_ms in proptest::prop_oneof![proptest::strategy::Just(0u64), 1u64..10_000_000],
        status in proptest::prop_oneof![proptest::strategy::Just(200u16), proptest::strategy::Just(429)],
        fields in proptest::collection::vec(
            (0..TOKEN_FIELDS.len(), crate::dialects_mixed_hostile::hostile_value()),
            0..10,
        ),
        tokens in proptest::prop_oneof![
            proptest::strategy::Just(0u32), proptest::strategy::Just(1), 2u32..20_000, proptest::strategy::Just(u32::MAX)
        ],
    ) {
        let clock = ManualClock::new();
        let max_hold = Duration::from_millis(max_hold_ms);
        let pushback = Pushback::builder("llm").clock(clock.clone()).max_hold(max_hold).build();
        let mut response = Response::new(());
        *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
        for (field, bytes) in &fields {
            if let Ok(value) = http::HeaderValue::from_bytes(bytes) {
                response.headers_mut().append(TOKEN_FIELDS[*field], value);
            }
        }
        pushback.observe(&response);
        let client = pushback.layer().cost_by(move |_: &()| tokens).layer(service_fn(|()| async {
            Ok::<_, BoxError>(Response::new(()))
        }));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        let call = || runtime.block_on(client.clone().oneshot(()));
        if let Err(refused) = call() {
            let wait = outbound::retry_after(&*refused).expect("a pushback refusal says when");
            proptest::prop_assert!(wait > Duration::ZERO && wait <= max_hold, "{:?} against {:?}", wait, max_hold);
            clock.advance(wait - Duration::from_nanos(1));
            proptest::prop_assert!(call().is_err(), "a nanosecond before {:?}", wait);
            clock.advance(Duration::from_nanos(1));
            proptest::prop_assert!(call().is_ok(), "at {:?}", wait);
        }
    }
}
