//! An outside tester's attack on what an HTTP client is told and how clients are keyed: exact
//! header values of a two-policy chain against a model written from the docs, a costly
//! refusal's `r`, a cost never admitted, IPv4-mapped addresses behind proxies and in exempt
//! networks, hostile `HeaderKey` bytes, key errors a closure chooses, and stacked layers.

use std::net::IpAddr;
use std::time::Duration;

use crate::common::listener::{sf_entries, sf_names};
use crate::support::{header_cost, json, keyed, peer, per_peer, retry_after, violated, Refuses};
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::Router;
use http::{HeaderValue, Request, StatusCode};
use proptest::prelude::*;
use tower::ServiceExt;
use tower_bulwark::algorithm::FixedWindow;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::{
    Cidr, FailMode, ForwardedIp, GlobalKey, HeaderKey, KeyError, PeerIp, Policy, RateLimitLayer,
};
use tower_bulwark::{clock::ManualClock, KeyedRateLimiter, Quota};

use super::layer_support::*;

/// `RateLimit` as `name;r=..;t=..` strings, in order, whatever the Structured Field spacing.
fn limits(response: &http::Response<Body>) -> Vec<String> {
    sf_entries(response.headers(), "ratelimit")
        .iter()
        .map(|(name, ps)| {
            let ps: Vec<String> = ps.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{name};{}", ps.join(";"))
        })
        .collect()
}

/// One client under two policies (GCRA 10/s at 2 permits a request, a fixed window of 5 a
/// minute), every answer checked to the digit against the docs' formulas.
///
/// Promise, `src/guide.rs:61-67`: "`RateLimit`, on an admitted response, gives for every
/// policy `r`, the permits left after this request but at most `q`, and `t`, the later of two
/// spans (at least a second): ... `ceil(reset_after)`, and ... `ceil(r · w / q)`"; `:78-84`:
/// "On a refusal `RateLimit` lists only the violated policies, each with ... `t` its own wait,
/// `max(1, ceil(retry_after))`; `Retry-After` is the longest of those ... A policy that
/// admitted the request and was vetoed by another is left out: its admission was given back".
/// Holds.
#[tokio::test]
async fn two_policies_tell_a_client_exactly_what_the_docs_formulas_say() {
    let clock = ManualClock::new();
    let burst = per_peer("burst", Quota::per_second(10).unwrap(), &clock);
    let minute = KeyedRateLimiter::<IpAddr>::builder(Quota::per_minute(5).unwrap())
        .clock(clock.clone())
        .algorithm::<FixedWindow>()
        .build();
    let minute = Policy::new("minute", PeerIp::new(), minute).unwrap();
    let app = orders(RateLimitLayer::new(burst.cost(2).and(minute)));
    let client = peer("198.51.100.20");
    // Five admissions at one instant: GCRA is whole again after `2n` tenths of a second, and
    // `r · w / q` is under a second; the cycle ends in 60 s, later than `r · 60 / 5`.
    for (n, (b, m)) in [(8, 4), (6, 3), (4, 2), (2, 1), (0, 0)]
        .into_iter()
        .enumerate()
    {
        let response = send(&app, client, &[]).await;
        assert_eq!(response.status(), StatusCode::OK, "request {n}");
        assert_eq!(
            response.headers()["ratelimit-policy"],
            r#""burst";q=10;w=1, "minute";q=5;w=60"#
        );
        let want = [format!("burst;r={b};t=1"), format!("minute;r={m};t=60")];
        assert_eq!(limits(&response), want, "request {n}");
    }
    // Both refuse: GCRA frees 2 permits in 200 ms, the cycle ends in 60 s.
    let refused = send(&app, client, &[]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some(60));
    assert_eq!(limits(&refused), ["burst;r=0;t=1", "minute;r=0;t=60"]);
    assert_eq!(violated(&json(refused).await), ["burst", "minute"]);
    // 30 s on, GCRA is whole and admits; the window vetoes: only it is listed, 30 s.
    clock.advance(Duration::from_secs(30));
    let vetoed = send(&app, client, &[]).await;
    assert_eq!(vetoed.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&vetoed), Some(30));
    assert_eq!(limits(&vetoed), ["minute;r=0;t=30"]);
    assert_eq!(vetoed.headers()["content-type"], "application/problem+json");
    // A new cycle: GCRA says 8 left, as if the vetoed request had never come.
    clock.advance(Duration::from_secs(30));
    let admitted = send(&app, client, &[]).await;
    assert_eq!(limits(&admitted), ["burst;r=8;t=1", "minute;r=4;t=60"]);
}

/// The `r` of a policy that refused a request costing more than one permit.
///
/// Promise, `src/guide.rs:78-79`: "`r` what it has left (less than the request's cost:
/// `"tokens";r=270;t=3` for a request of 410 tokens)". With 2 of 10 permits left, a request of
/// 4 is told `r=2;t=1`. (Found by this attack: the module docs and `Refusal::headers` said
/// `r=0`; they now say what the guide says.)
#[tokio::test]
async fn a_refusal_tells_what_is_left_even_for_a_costly_request() {
    let clock = ManualClock::new();
    let policy = per_peer("tokens", Quota::per_second(10).unwrap(), &clock);
    let app = orders(RateLimitLayer::new(policy.cost_by(header_cost("x-cost"))));
    let client = peer("198.51.100.21");
    for _ in 0..2 {
        let response = send(&app, client, &[("x-cost", "4")]).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let refused = send(&app, client, &[("x-cost", "4")]).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some(1));
    assert_eq!(limits(&refused), ["tokens;r=2;t=1"]);
}

/// A limiter of a user's own refusing for longer than a `RateLimit` field can say (a second
/// past 999 999 999 999 999 seconds, and `Duration::MAX`): `Retry-After`, the field's `t` and
/// the problem's detail say one wait, the longest `t` can say.
///
/// Promise, `Refusal::retry_after_secs`: "That is also the longest effective window (`t`) in the
/// refusal's `RateLimit` field". (Found by attack: `t` stopped at 15 digits and `Retry-After`
/// went on to `u64::MAX`.)
#[tokio::test]
async fn a_wait_past_what_ratelimit_can_say_is_one_wait_in_every_field() {
    const MOST: u64 = 999_999_999_999_999;
    for wait in [Duration::from_secs(MOST + 1), Duration::MAX] {
        let policy = Policy::new("user", GlobalKey, Refuses(wait)).unwrap();
        let response = send(&orders(RateLimitLayer::new(policy)), peer("192.0.2.9"), &[]).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after(&response), Some(MOST));
        assert_eq!(limits(&response), [format!("user;r=0;t={MOST}")]);
        let detail = json(response).await["detail"].to_string();
        assert!(
            detail.contains(&format!("retry in {MOST} seconds")),
            "{detail}"
        );
    }
}

/// A request costing more than the policy's burst.
///
/// Promise, `src/rate_limit/policy.rs:131-133` and `src/guide.rs:204`: a `413 Content Too
/// Large` without a `Retry-After`, `largest-cost: 10` in the body. (Found by this attack: the
/// module docs said 429; they now say 413.)
#[tokio::test]
async fn a_cost_never_admitted_is_a_413_naming_the_largest_cost() {
    let clock = ManualClock::new();
    let policy = per_peer("p", Quota::per_second(10).unwrap(), &clock).cost(11);
    let response = send(&orders(RateLimitLayer::new(policy)), peer("192.0.2.9"), &[]).await;
    assert_eq!(retry_after(&response), None);
    assert_eq!(json_status(response).await, (413, Some(10)));
}

/// The status and `largest-cost` in a problem body.
async fn json_status(response: http::Response<Body>) -> (u64, Option<u64>) {
    let status = u64::from(response.status().as_u16());
    let problem = json(response).await;
    assert_eq!(problem["status"], status);
    (status, problem["largest-cost"].as_u64())
}

/// IPv4-mapped IPv6 addresses behind trusted proxies: a mapped proxy peer or hop is a proxy,
/// a mapped client is the IPv4 client it is.
///
/// Promise, `src/rate_limit/key/ip.rs:61-63`: "An IPv4 client seen through a dual-stack
/// socket arrives as `::ffff:a.b.c.d`; it is an IPv4 client and is keyed as one (otherwise
/// every IPv4 client would share one /64)" (the setting "of `PeerIp` and `ForwardedIp`
/// alike", `:43-44`); `:91-92`: "IPv4-mapped IPv6 addresses are compared as the IPv4
/// addresses they are". Holds, in `X-Forwarded-For` and `Forwarded`.
#[tokio::test]
async fn mapped_addresses_behind_proxies_are_the_ipv4_hosts_they_name() {
    let clock = ManualClock::new();
    let trusted = || ["10.0.0.0/8".parse::<Cidr>().unwrap()];
    let limiter = keyed(Quota::per_second(1).unwrap(), &clock);
    let xff = ForwardedIp::x_forwarded_for(trusted());
    let app = orders(RateLimitLayer::new(
        Policy::new("c", xff, limiter.clone()).unwrap(),
    ));
    let fwd = ForwardedIp::forwarded(trusted());
    let rfc = orders(RateLimitLayer::new(Policy::new("c", fwd, limiter).unwrap()));
    let (mapped_proxy, proxy) = (peer("::ffff:10.0.0.2"), peer("10.0.0.2"));
    let cases: [(&Router, _, &str, &str, StatusCode); 9] = [
        // A dual-stack proxy peer is trusted: the key is the client it names.
        (
            &app,
            mapped_proxy,
            "x-forwarded-for",
            "198.51.100.7",
            StatusCode::OK,
        ),
        (
            &app,
            proxy,
            "x-forwarded-for",
            "198.51.100.7",
            StatusCode::TOO_MANY_REQUESTS,
        ),
        // A mapped client shares its IPv4 twin's key, and no other mapped client's.
        (
            &app,
            proxy,
            "x-forwarded-for",
            "::ffff:198.51.100.8",
            StatusCode::OK,
        ),
        (
            &app,
            proxy,
            "x-forwarded-for",
            "198.51.100.8",
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (
            &app,
            proxy,
            "x-forwarded-for",
            "::ffff:198.51.100.9",
            StatusCode::OK,
        ),
        // A mapped inner proxy hop is skipped, never the key.
        (
            &app,
            proxy,
            "x-forwarded-for",
            "198.51.100.10, ::ffff:10.0.0.3",
            StatusCode::OK,
        ),
        (
            &app,
            proxy,
            "x-forwarded-for",
            "198.51.100.10",
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (
            &rfc,
            proxy,
            "forwarded",
            r#"for="[::ffff:198.51.100.9]:80""#,
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (
            &rfc,
            mapped_proxy,
            "forwarded",
            r#"for=198.51.100.11, for="[::ffff:10.0.0.4]""#,
            StatusCode::OK,
        ),
    ];
    for (i, (app, from, header, value, status)) in cases.into_iter().enumerate() {
        assert_eq!(
            send(app, from, &[(header, value)]).await.status(),
            status,
            "case {i}"
        );
    }
}

/// `exempt_networks` reads the TCP peer only: a dual-stack peer in the network is exempt, and
/// a client outside it cannot exempt itself with forwarding headers.
///
/// Promise, `src/rate_limit/layer.rs:126-129`: "Lets requests whose TCP peer lies in one of
/// `networks` skip every policy ... The peer is the address the connection came from ...,
/// never a forwarding header"; `:94-95`: "their responses carry no rate-limit headers";
/// `src/rate_limit/key/ip.rs:91-92` (mapped addresses compared as IPv4). Holds.
#[tokio::test]
async fn exempt_networks_read_the_peer_mapped_or_not_and_never_a_forwarding_header() {
    let clock = ManualClock::new();
    let limiter = keyed(Quota::per_second(1).unwrap(), &clock);
    let layer = RateLimitLayer::new(Policy::new("per-ip", PeerIp::new(), limiter.clone()).unwrap())
        .exempt_networks(["10.0.0.0/8".parse::<Cidr>().unwrap()]);
    let app = orders(layer);
    for _ in 0..3 {
        let response = send(&app, peer("::ffff:10.1.2.3"), &[]).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("ratelimit-policy").is_none());
    }
    assert_eq!(limiter.len(), 0, "an exempt request was counted");
    let forged = [
        ("x-forwarded-for", "10.1.2.3"),
        ("forwarded", "for=10.1.2.3"),
        ("x-real-ip", "10.1.2.3"),
    ];
    let outside = peer("198.51.100.2");
    assert_eq!(send(&app, outside, &forged).await.status(), StatusCode::OK);
    let second = send(&app, outside, &forged).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A `/orders` request from one peer with header `x-api-key` given as `values`, one line each.
fn keyed_request(values: &[&[u8]]) -> Option<Request<Body>> {
    let mut request = get_orders();
    for value in values {
        let value = HeaderValue::from_bytes(value).ok()?;
        request.headers_mut().append("x-api-key", value);
    }
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(peer("192.0.2.1")));
    Some(request)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Hostile `x-api-key` bytes (non-UTF-8, empty, around `max_len`, repeated): never a
    /// panic; each answer the one the docs give.
    ///
    /// Promise, `src/rate_limit/key/header.rs:11-15`: "A request without the header, with an
    /// empty value, or with the header more than once gets a `KeyError::bad_request` ... So
    /// does a value longer than `max_len` bytes", and `:17`: "The key is a copy of the value's
    /// bytes" (any bytes a header holds are a key of their own); `src/rate_limit/mod.rs:55-58`:
    /// a `400` with a problem+json body, or through uncounted under `FailMode::Open`. Holds.
    #[test]
    fn hostile_header_key_bytes_get_their_own_budget_or_a_400(
        value in prop::collection::vec((0x20u8..=0xff).prop_filter("DEL", |b| *b != 0x7f), 0..16),
        repeat in 1usize..3,
        open in any::<bool>(),
    ) {
        let lines = vec![value.as_slice(); repeat];
        prop_assume!(keyed_request(&lines).is_some());
        let clock = ManualClock::new();
        let limiter = keyed::<HeaderValue>(Quota::per_second(1).unwrap(), &clock);
        let key = HeaderKey::new("x-api-key").unwrap().max_len(12);
        let mode = if open { FailMode::Open } else { FailMode::Closed };
        let layer = RateLimitLayer::new(Policy::new("per-key", key, limiter.clone()).unwrap());
        let app = orders(layer.key_error_mode(mode));
        let usable = !value.is_empty() && value.len() <= 12 && repeat == 1;
        crate::common::block_on(async {
            let first = app.clone().oneshot(keyed_request(&lines).unwrap()).await.unwrap();
            let second = app.clone().oneshot(keyed_request(&lines).unwrap()).await.unwrap();
            if usable {
                prop_assert_eq!(first.status(), StatusCode::OK);
                prop_assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
            } else if open {
                let both = (first.status(), second.status());
                prop_assert_eq!(both, (StatusCode::OK, StatusCode::OK));
                prop_assert_eq!(limiter.len(), 0);
            } else {
                prop_assert_eq!(json_status(second).await, (400, None));
                prop_assert_eq!(&first.headers()["content-type"], "application/problem+json");
            }
            Ok(())
        })?;
    }
}

/// A key extractor's own `KeyError`s: `unauthorized` is a 401, `internal` a 500 whose reason
/// stays in the logs.
///
/// Promise, `src/rate_limit/key/mod.rs:101-109`: "The client must say who it is first ...
/// (answered with `401`)"; "The server is not set up to find keys (answered with `500`; the
/// reason is logged, not sent)". Holds.
#[tokio::test]
async fn a_closures_key_errors_are_401_and_a_500_that_keeps_its_reason() {
    let clock = ManualClock::new();
    let limiter = keyed::<String>(Quota::per_second(1).unwrap(), &clock);
    let key = |head: &RequestHead| match head.headers.get("authorization") {
        None => Err(KeyError::unauthorized("no credentials")),
        Some(_) => Err(KeyError::internal("db at 10.9.8.7:5432 refused user admin")),
    };
    let app = orders(RateLimitLayer::new(
        Policy::new("per-user", key, limiter).unwrap(),
    ));
    let from = peer("192.0.2.3");
    let unauthorized = send(&app, from, &[]).await;
    assert_eq!(
        unauthorized.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(json_status(unauthorized).await, (401, None));
    let internal = send(&app, from, &[("authorization", "Bearer x")]).await;
    let text = String::from_utf8(body(internal).await.to_vec()).unwrap();
    let problem: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(problem["status"], 500);
    assert!(
        !text.contains("10.9.8.7") && !text.contains("admin"),
        "{text}"
    );
}

/// Two layers stacked (`layer` for everything, `route_layer` for chosen routes), a client
/// refused by the inner one, and the same two policies in one layer.
///
/// Promise, `src/rate_limit/mod.rs` ("Sharing and placement"): stacked layers decide apart:
/// the outer one counts the request the inner one refused and lists its policy beside the
/// inner's; in one layer (`global.clone().and(route)`) a refusal spends nothing and lists only
/// what refused. (Found by this attack: the docs said neither, and invited the stack.)
#[tokio::test]
async fn stacked_layers_decide_apart_and_one_layer_keeps_a_refusal_to_what_refused() {
    let clock = ManualClock::new();
    let global = keyed::<()>(Quota::per_hour(1000).unwrap(), &clock);
    let global = Policy::new("global", GlobalKey, global).unwrap();
    let route = per_peer("route", Quota::per_second(1).unwrap(), &clock);
    let stacked = orders(RateLimitLayer::new(route.clone()))
        .layer(RateLimitLayer::new(global.clone()))
        .layer(MockConnectInfo(peer("192.0.2.4")));
    let call = || stacked.clone().oneshot(get_orders());
    let first = call().await.unwrap();
    assert_eq!(
        sf_names(first.headers(), "ratelimit-policy"),
        ["route", "global"]
    );
    let refused = call().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some(1));
    assert_eq!(limits(&refused), ["route;r=0;t=1", "global;r=998;t=3593"]);
    // One layer, a second client: its refusal gives the global permit back and names the route.
    let one = orders(RateLimitLayer::new(global.and(route)));
    let client = peer("192.0.2.5");
    assert_eq!(send(&one, client, &[]).await.status(), StatusCode::OK);
    let refused = send(&one, client, &[]).await;
    assert_eq!(retry_after(&refused), Some(1));
    assert_eq!(limits(&refused), ["route;r=0;t=1"]);
    let other = send(&one, peer("192.0.2.6"), &[]).await;
    assert_eq!(limits(&other), ["global;r=996;t=3586", "route;r=0;t=1"]);
}

/// An advertised shadow that would refuse, on an admitted response: exact values.
///
/// Promise, `src/rate_limit/headers.rs:193-194`: "On an admitted response, an advertised
/// shadow policy that would have refused says `r=0` and its own wait"; `src/guide.rs:80`
/// (a wait is `max(1, ceil(retry_after))`); `src/rate_limit/policy.rs:265-270` (never
/// refuses; `Retry-After` belongs to refusals). Holds.
#[tokio::test]
async fn an_advertised_shadow_over_its_limit_says_r_0_and_its_wait_and_admits() {
    let clock = ManualClock::new();
    let watched = per_peer("new-limit", Quota::per_minute(1).unwrap(), &clock);
    let enforced = per_peer("per-ip", Quota::per_second(10).unwrap(), &clock);
    let app = orders(RateLimitLayer::new(
        watched.shadow_advertised().and(enforced),
    ));
    let client = peer("198.51.100.30");
    let first = send(&app, client, &[]).await;
    assert_eq!(limits(&first), ["new-limit;r=0;t=60", "per-ip;r=9;t=1"]);
    clock.advance(Duration::from_millis(500));
    for r in [9, 8] {
        let over = send(&app, client, &[]).await;
        assert_eq!(over.status(), StatusCode::OK);
        assert_eq!(retry_after(&over), None);
        assert_eq!(
            over.headers()["ratelimit-policy"],
            r#""new-limit";q=1;w=60, "per-ip";q=10;w=1"#
        );
        assert_eq!(
            limits(&over),
            ["new-limit;r=0;t=60".into(), format!("per-ip;r={r};t=1")]
        );
    }
}
