//! Routes in a config file: several named rate limiters on one layer, each with its key, the
//! route's cost and shadow mode, and exempt networks; bad routes are errors that name the place.

use std::net::SocketAddr;

use axum::body::Body;
use axum::Router;
use http::StatusCode;
use tower_bulwark::config::Registry;
use tower_bulwark::Limiter;

use super::support::{get_from_peer, routed};
use crate::common::listener;

const FILE: &str = r#"
[rate_limiters.per-ip]
limit_for_period = 10
limit_refresh_period = "1h"

[rate_limiters.per-key]
limit_for_period = 12
limit_refresh_period = "1h"
key = "header:x-api-key"

[rate_limiters.next-quota]
limit_for_period = 2
limit_refresh_period = "1h"

[routes.search]
policies = [
    "per-ip",
    { limiter = "per-key", cost = 5 },
    { limiter = "next-quota", shadow = true },
]
exempt_networks = ["10.0.0.0/8"]

[routes.items]
policies = ["per-ip", { limiter = "per-key", shadow = "advertised" }]
"#;

/// The response of `app` to a GET of `/` with the API key `key`, from `peer`.
async fn get_from(app: &Router, peer: [u8; 4], key: &str) -> http::Response<Body> {
    get_from_peer(app, SocketAddr::from((peer, 4000)), &[("x-api-key", key)]).await
}

fn names(response: &http::Response<Body>, header: &str) -> Vec<String> {
    listener::sf_names(response.headers(), header)
}

#[tokio::test]
async fn a_configured_route_charges_each_policy_its_cost_under_its_own_key() {
    let registry = Registry::from_toml_str(FILE).unwrap();
    let search = routed(&registry, "search");
    // The key's 12 permits hold two searches of 5; the third is refused by `per-key` only.
    for i in 0..2 {
        let ok = get_from(&search, [192, 0, 2, 1], "k1").await;
        assert_eq!(ok.status(), StatusCode::OK, "search {i}");
        // The shadow policy (2 per hour) is never in the headers, and never refuses.
        assert_eq!(names(&ok, "ratelimit"), ["per-ip", "per-key"]);
    }
    let refused = get_from(&search, [192, 0, 2, 2], "k1").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(names(&refused, "ratelimit"), ["per-key"]);
    // Another key from the same address: `per-ip` has spent 2 of 10 there, not 3.
    let other = get_from(&search, [192, 0, 2, 1], "k2").await;
    let state = listener::sf_list(other.headers()["ratelimit"].to_str().unwrap());
    assert_eq!(state[0].0, "per-ip");
    assert_eq!(state[0].1[0], ("r".to_string(), 7));
    // The shadow policy saw its quota of 2 run out and let the requests through.
    let shadow = registry.rate_limiter("next-quota").unwrap().snapshot();
    assert_eq!((shadow.allowed, shadow.limited), (2, 1));
}

#[tokio::test]
async fn exempt_networks_skip_every_policy_of_the_route() {
    let registry = Registry::from_toml_str(FILE).unwrap();
    let search = routed(&registry, "search");
    for _ in 0..20 {
        let response = get_from(&search, [10, 1, 2, 3], "internal").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers().get("ratelimit").is_none());
    }
    let per_key = registry.rate_limiter("per-key").unwrap().snapshot();
    assert_eq!(per_key.allowed, 0, "nothing was counted");
}

#[tokio::test]
async fn routes_share_their_rate_limiters() {
    let registry = Registry::from_toml_str(FILE).unwrap();
    let app = |route: &str| routed(&registry, route);
    let (search, items) = (app("search"), app("items"));
    assert_eq!(
        get_from(&search, [192, 0, 2, 9], "k").await.status(),
        StatusCode::OK
    );
    // On `items`, `per-key` is an advertised shadow: described, never refusing; it shows the 5
    // permits the search took.
    let item = get_from(&items, [192, 0, 2, 9], "k").await;
    assert_eq!(item.status(), StatusCode::OK);
    let state = listener::sf_list(item.headers()["ratelimit"].to_str().unwrap());
    assert_eq!(state[1].0, "per-key");
    assert_eq!(state[1].1[0], ("r".to_string(), 6));
}

#[test]
fn bad_routes_are_errors_that_name_the_place() {
    let limiters = "[rate_limiters.a]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\n";
    let cases = [
        (
            "[routes.r]\npolicies = [\"a\", \"b\"]\n",
            "routes.r.policies[1]",
            "`b`, which is not under `rate_limiters`",
        ),
        (
            "[routes.r]\npolicies = []\n",
            "routes.r.policies",
            "at least one",
        ),
        (
            "[routes.r]\npolicies = [\"a\", { limiter = \"a\" }]\n",
            "routes.r.policies[1]",
            "a second time",
        ),
        (
            "[routes.r]\npolicies = [{ limiter = \"a\", cost = 0 }]\n",
            "routes.r.policies[0].cost",
            "at least 1",
        ),
        (
            "[routes.r]\npolicies = [{ limiter = \"a\", shadow = \"yes\" }]\n",
            "routes.r.policies[0].shadow",
            "not \"yes\"",
        ),
        (
            "[routes.r]\npolicies = [{ name = \"a\" }]\n",
            "routes.r.policies[0].name",
            "unknown field",
        ),
        (
            "[routes.r]\npolicies = [3]\n",
            "routes.r.policies[0]",
            "integer `3`, expected a rate limiter name",
        ),
        (
            "[routes.r]\npolicies = [\"a\"]\nexempt_networks = [\"10.0.0.0/33\"]\n",
            "routes.r.exempt_networks",
            "10.0.0.0/33",
        ),
        (
            "[routes.r]\npolicies = \"a\"\n",
            "routes.r.policies",
            "string \"a\", expected a sequence",
        ),
    ];
    for (route, path, message) in cases {
        let err = Registry::from_toml_str(&format!("{limiters}{route}")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(path) && text.contains(message),
            "{route:?}: {text}"
        );
    }
}

/// A route's cost must fit what its limiter can ever grant at once (GCRA: the burst; a window
/// algorithm: the permits per window, whatever the burst says), or every request on the route
/// would be refused forever; the limit holds at the boundary and across a reload.
#[test]
fn a_route_cost_beyond_what_its_limiter_can_grant_is_refused() {
    let gcra =
        "[rate_limiters.a]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\nburst = 4\n";
    let window = "[rate_limiters.a]\nlimit_for_period = 4\nlimit_refresh_period = \"1s\"\n\
                  burst = 50\nalgorithm = \"sliding_log\"\n";
    let route =
        |cost: u32| format!("[routes.r]\npolicies = [{{ limiter = \"a\", cost = {cost} }}]\n");
    for limiter in [gcra, window] {
        Registry::from_toml_str(&format!("{limiter}{}", route(4))).unwrap();
        let err = Registry::from_toml_str(&format!("{limiter}{}", route(5))).unwrap_err();
        assert_eq!(err.path(), "routes.r.policies[0].cost", "{err}");
        assert!(err.message().contains("is 5, more than"), "{err}");
        assert!(err.message().contains("(4)"), "{err}");
        assert!(err.position().is_some(), "{err}");
    }
    // A reload that shrinks the burst under the route's cost is refused and changes nothing.
    let registry = Registry::from_toml_str(&format!("{gcra}{}", route(4))).unwrap();
    let smaller = gcra.replace("burst = 4", "burst = 3");
    let err = registry
        .reload_toml_str(&format!("{smaller}{}", route(4)))
        .unwrap_err();
    assert_eq!(err.path(), "routes.r.policies[0].cost", "{err}");
    assert_eq!(registry.rate_limiter("a").unwrap().quota().burst(), 4);
}

/// A file without a rate limiter its routes name is refused at the first route naming it
/// (routes in name order), where it names it.
#[test]
fn a_file_without_a_route_s_limiter_is_refused() {
    let (before, after) = FILE.split_once("[rate_limiters.per-key]").unwrap();
    let (_, rest) = after.split_once("\n\n").unwrap();
    let err = Registry::from_toml_str(&format!("{before}{rest}")).unwrap_err();
    assert_eq!(err.path(), "routes.items.policies[1]", "{err}");
    assert!(err.message().contains("`per-key`"), "{err}");
    assert!(err.position().is_some(), "{err}");
}

#[test]
fn an_unknown_route_and_a_changed_route_are_errors() {
    let registry = Registry::from_toml_str(FILE).unwrap();
    let err = registry.route_layer("nope").unwrap_err();
    assert_eq!(err.to_string(), "no route named `nope` is configured");
    // A reload that keeps the routes applies; one that changes a route is refused whole, and
    // the quota change that came with it is not applied.
    let same = FILE.replace("limit_for_period = 10", "limit_for_period = 20");
    assert!(registry.reload_toml_str(&same).is_ok());
    assert_eq!(
        registry.rate_limiter("per-ip").unwrap().quota().permits(),
        20
    );
    let changed = FILE
        .replace("limit_for_period = 10", "limit_for_period = 30")
        .replace("cost = 5", "cost = 4");
    let err = registry.reload_toml_str(&changed).unwrap_err();
    assert!(err.to_string().contains("routes.search"), "{err}");
    assert_eq!(
        registry.rate_limiter("per-ip").unwrap().quota().permits(),
        20,
        "a refused reload changes nothing"
    );
}

/// Behind a load balancer every connection comes from the balancer. `forwarded_ip` keys each
/// request by the client the trusted balancers forward; a peer that is not one of them is keyed
/// by its own address, whatever forwarding header it wrote.
const BEHIND_BALANCER: &str = r#"
[rate_limiters.by-xff]
limit_for_period = 2
limit_refresh_period = "1h"
key = "forwarded_ip"
trusted_proxies = ["10.0.0.0/8"]

[rate_limiters.by-forwarded]
limit_for_period = 2
limit_refresh_period = "1h"
key = "forwarded_ip"
trusted_proxies = ["10.0.0.0/8"]
forwarded_header = "forwarded"

[routes.xff]
policies = ["by-xff"]

[routes.rfc]
policies = ["by-forwarded"]
"#;

/// The status `app` answers a GET of `/` with, from `peer`, with the header `header: value`.
async fn forwarded_from(
    app: &Router,
    peer: [u8; 4],
    header: &str,
    value: &str,
) -> http::StatusCode {
    let peer = SocketAddr::from((peer, 4000));
    get_from_peer(app, peer, &[(header, value)]).await.status()
}

#[tokio::test]
async fn a_forwarded_key_gives_each_client_behind_the_balancer_its_own_budget() {
    let registry = Registry::from_toml_str(BEHIND_BALANCER).unwrap();
    let app = |route: &str| routed(&registry, route);
    let balancer = [10, 0, 0, 2];
    for (app, header, prefix) in [
        (app("xff"), "x-forwarded-for", ""),
        (app("rfc"), "forwarded", "for="),
    ] {
        let client = |ip: &str| format!("{prefix}{ip}");
        // Client A spends its 2 through the balancer.
        for _ in 0..2 {
            let status = forwarded_from(&app, balancer, header, &client("198.51.100.7")).await;
            assert_eq!(status, StatusCode::OK, "{header}");
        }
        let status = forwarded_from(&app, balancer, header, &client("198.51.100.7")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{header}");
        // Client B, through the same balancer, has a budget of its own.
        let status = forwarded_from(&app, balancer, header, &client("198.51.100.8")).await;
        assert_eq!(status, StatusCode::OK, "{header}");
        // What B wrote before the balancer's entry does not choose the key: it is still B's
        // second request, then B is refused whatever it writes.
        let spoofed = format!("{}, {}", client("192.0.2.1"), client("198.51.100.8"));
        assert_eq!(
            forwarded_from(&app, balancer, header, &spoofed).await,
            StatusCode::OK,
            "{header}"
        );
        let spoofed = format!("{}, {}", client("192.0.2.2"), client("198.51.100.8"));
        assert_eq!(
            forwarded_from(&app, balancer, header, &spoofed).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{header}"
        );

        // A peer that is no balancer, claiming to forward A (spent): keyed by itself, so it is
        // neither refused on A's budget...
        let stranger = [203, 0, 113, 5];
        assert_eq!(
            forwarded_from(&app, stranger, header, &client("198.51.100.7")).await,
            StatusCode::OK,
            "{header}"
        );
        // ...nor given a fresh budget by a fresh address each time.
        assert_eq!(
            forwarded_from(&app, stranger, header, &client("198.51.100.50")).await,
            StatusCode::OK,
            "{header}"
        );
        assert_eq!(
            forwarded_from(&app, stranger, header, &client("198.51.100.51")).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{header}"
        );
    }
}
