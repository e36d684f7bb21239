//! A `forwarded_ip` route from a file under hostile forwarding headers: spoofs from a peer that
//! is no proxy, garbage, empty, overlong, `unknown` and obfuscated hops from a trusted proxy,
//! IPv6 and ports. No panic, a `400` where the docs say so, and never a key the client chose.
//! Bad values of the forwarding fields are errors naming the field, its line and its column.
//!
//! Each limiter grants one request per hour, so which key a request was charged to shows in
//! the next request keyed by that address: a probe sent straight from it as the TCP peer (no
//! header) is refused when, and only when, that key was spent.

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use http::StatusCode;
use tower_bulwark::config::Registry;

use super::support::{get_from_peer, routed};

const FILE: &str = r#"
[rate_limiters.xff]
limit_for_period = 1
limit_refresh_period = "1h"
key = "forwarded_ip"
trusted_proxies = ["10.0.0.0/8", "2001:db8:ffff::/48"]

[rate_limiters.rfc]
limit_for_period = 1
limit_refresh_period = "1h"
key = "forwarded_ip"
trusted_proxies = ["10.0.0.0/8", "2001:db8:ffff::/48"]
forwarded_header = "forwarded"

[routes.xff]
policies = ["xff"]

[routes.rfc]
policies = ["rfc"]
"#;

const PROXY: &str = "10.0.0.2";
const STRANGER: &str = "203.0.113.5";

/// A fresh registry's route (`xff` or `rfc`): every case starts with every budget whole.
fn route(name: &str) -> Router {
    routed(&Registry::from_toml_str(FILE).unwrap(), name)
}

async fn send(app: &Router, peer: &str, header: Option<(&str, &str)>) -> StatusCode {
    let peer: IpAddr = peer.parse().unwrap();
    let headers: &[(&str, &str)] = match &header {
        Some(field) => std::slice::from_ref(field),
        None => &[],
    };
    get_from_peer(app, SocketAddr::new(peer, 4000), headers)
        .await
        .status()
}

/// Whether the key of address `ip` has been spent: a request straight from it is refused.
async fn spent(app: &Router, ip: &str) -> bool {
    match send(app, ip, None).await {
        StatusCode::OK => false,
        StatusCode::TOO_MANY_REQUESTS => true,
        other => panic!("a probe from {ip} got {other}"),
    }
}

/// A peer that is no trusted proxy is keyed by itself, whatever it claims: it cannot spend
/// another client's budget (nor a proxy's), and a fresh claim gives it no fresh budget.
#[tokio::test]
async fn spoofed_headers_from_an_untrusted_peer_are_ignored() {
    let long = "198.51.100.7, ".repeat(100) + "198.51.100.7";
    for (name, header, value) in [
        ("xff", "x-forwarded-for", "198.51.100.7"),
        ("xff", "x-forwarded-for", "10.0.0.2"),
        ("xff", "x-forwarded-for", long.as_str()),
        ("xff", "x-forwarded-for", "unknown"),
        ("rfc", "forwarded", "for=198.51.100.7"),
        ("rfc", "forwarded", r#"for="[2001:db8:ffff::9]:80""#),
        ("rfc", "forwarded", "for=_hidden"),
        ("rfc", "forwarded", r#"for="\"#),
    ] {
        let app = route(name);
        let case = format!("{name}: {value:.60}");
        assert_eq!(
            send(&app, STRANGER, Some((header, value))).await,
            StatusCode::OK,
            "{case}"
        );
        assert_eq!(
            send(&app, STRANGER, Some((header, "198.51.100.99"))).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{case}: a fresh claim gave a fresh budget"
        );
        for other in ["198.51.100.7", "198.51.100.99", PROXY] {
            assert!(!spent(&app, other).await, "{case}: {other} was charged");
        }
    }
}

/// What a trusted proxy forwards: the status, and the address that must have been charged
/// (`None`: nothing was, the request being a `400`).
#[tokio::test]
async fn a_trusted_proxy_forwards_the_client_or_a_400_never_a_chosen_or_shared_key() {
    let garbage = "garbage%%;;,,\"\"";
    let long_garbage = "x".repeat(100) + &", zz".repeat(100);
    let long_chain = "192.0.2.66, ".repeat(100) + "198.51.100.7";
    let long_rfc = "for=192.0.2.66, ".repeat(100) + "for=198.51.100.7";
    let cases: Vec<(&str, &str, String, StatusCode, Option<&str>)> = vec![
        // Client bytes before the proxy's hop choose nothing.
        (
            "xff",
            "x-forwarded-for",
            "192.0.2.1, 198.51.100.7".into(),
            StatusCode::OK,
            Some("198.51.100.7"),
        ),
        (
            "xff",
            "x-forwarded-for",
            long_chain,
            StatusCode::OK,
            Some("198.51.100.7"),
        ),
        (
            "rfc",
            "forwarded",
            long_rfc,
            StatusCode::OK,
            Some("198.51.100.7"),
        ),
        (
            "xff",
            "x-forwarded-for",
            format!("{garbage}, 198.51.100.7"),
            StatusCode::OK,
            Some("198.51.100.7"),
        ),
        // Trusted hops after the client are skipped (and empty list elements, as RFC 9110
        // section 5.6.1 asks); a chain of only proxies keys the leftmost.
        (
            "xff",
            "x-forwarded-for",
            "198.51.100.7, 10.0.0.9, 10.0.0.3".into(),
            StatusCode::OK,
            Some("198.51.100.7"),
        ),
        (
            "xff",
            "x-forwarded-for",
            "198.51.100.7, , 10.0.0.3".into(),
            StatusCode::OK,
            Some("198.51.100.7"),
        ),
        (
            "xff",
            "x-forwarded-for",
            "10.0.0.9, 10.0.0.3".into(),
            StatusCode::OK,
            Some("10.0.0.9"),
        ),
        // Unreadable hops next to the proxy: a 400, not the proxy's budget.
        (
            "xff",
            "x-forwarded-for",
            "198.51.100.7, unknown".into(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "xff",
            "x-forwarded-for",
            format!("198.51.100.7, {garbage}"),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "xff",
            "x-forwarded-for",
            long_garbage.clone(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "rfc",
            "forwarded",
            "for=198.51.100.7, for=unknown".into(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "rfc",
            "forwarded",
            "for=198.51.100.7, for=_hidden".into(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "rfc",
            "forwarded",
            "for=198.51.100.7, by=10.0.0.3".into(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "rfc",
            "forwarded",
            r#"for=198.51.100.7, for="\"#.into(),
            StatusCode::BAD_REQUEST,
            None,
        ),
        (
            "rfc",
            "forwarded",
            format!("for=198.51.100.7, {long_garbage}"),
            StatusCode::BAD_REQUEST,
            None,
        ),
        // IPv6 and ports, as RFC 7239 writes them and as `for=$remote_addr` proxies do.
        (
            "rfc",
            "forwarded",
            r#"for="[2001:db8:1::7]:4711""#.into(),
            StatusCode::OK,
            Some("2001:db8:1::7"),
        ),
        (
            "rfc",
            "forwarded",
            "for=[2001:db8:1::7]".into(),
            StatusCode::OK,
            Some("2001:db8:1::7"),
        ),
        (
            "rfc",
            "forwarded",
            r#"for="198.51.100.7:4711""#.into(),
            StatusCode::OK,
            Some("198.51.100.7"),
        ),
        (
            "rfc",
            "forwarded",
            r#"for=198.51.100.7;proto=https;by="[2001:db8:ffff::1]""#.into(),
            StatusCode::OK,
            Some("198.51.100.7"),
        ),
        (
            "xff",
            "x-forwarded-for",
            "2001:db8:1::7".into(),
            StatusCode::OK,
            Some("2001:db8:1::7"),
        ),
        // The IPv6 key is the client's /64: a neighbour in it shares it, as documented.
        (
            "rfc",
            "forwarded",
            r#"for="[2001:db8:1::8]""#.into(),
            StatusCode::OK,
            Some("2001:db8:1::ffff"),
        ),
    ];
    for (name, header, value, status, charged) in cases {
        let app = route(name);
        let case = format!("{name}: {value:.80}");
        assert_eq!(
            send(&app, PROXY, Some((header, &value))).await,
            status,
            "{case}"
        );
        if let Some(client) = charged {
            assert!(
                spent(&app, client).await,
                "{case}: {client} was not charged"
            );
        }
        // Neither the proxy nor an address only the client wrote was charged.
        for other in [PROXY, "192.0.2.1", "192.0.2.66"] {
            if Some(other) != charged {
                assert!(!spent(&app, other).await, "{case}: {other} was charged");
            }
        }
    }
    // An empty header from a trusted proxy: a 400 or the proxy's own key, never a panic.
    for (name, header) in [("xff", "x-forwarded-for"), ("rfc", "forwarded")] {
        let app = route(name);
        let status = send(&app, PROXY, Some((header, ""))).await;
        assert!(
            status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
            "{name}: empty -> {status}"
        );
    }
}

/// Bad values of the forwarding fields: each error names the field, with the line and column
/// of the value (of the instance, for a field that is missing), for a configuration and for a
/// registry.
#[test]
fn bad_forwarding_values_name_the_field_line_and_column() {
    let head = "[rate_limiters.edge]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\n";
    let cases: [(&str, &str, &str, (usize, usize)); 8] = [
        (
            "key = \"forwarded_ip\"\n",
            "rate_limiters.edge.trusted_proxies",
            "required",
            (1, 16),
        ),
        (
            "key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/33\"]\n",
            "rate_limiters.edge.trusted_proxies",
            "10.0.0.0/33",
            (5, 19),
        ),
        (
            "key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.1/8\", \"::1/129\"]\n",
            "rate_limiters.edge.trusted_proxies",
            "::1/129",
            (5, 19),
        ),
        (
            "key = \"forwarded_ip\"\ntrusted_proxies = \"10.0.0.0/8\"\n",
            "rate_limiters.edge.trusted_proxies",
            "invalid type: string",
            (5, 19),
        ),
        (
            "key = \"forwarded_ip\"\ntrusted_proxies = [10]\n",
            "rate_limiters.edge.trusted_proxies",
            "integer",
            (5, 19),
        ),
        (
            "key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\nforwarded_header = 7\n",
            "rate_limiters.edge.forwarded_header",
            "integer",
            (6, 20),
        ),
        (
            "key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\nforwarded_header = \"X-Forwarded-For \"\n",
            "rate_limiters.edge.forwarded_header",
            "X-Forwarded-For ",
            (6, 20),
        ),
        (
            "key = \"forwarded-ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
            "rate_limiters.edge.key",
            "forwarded-ip",
            (4, 7),
        ),
    ];
    for (tail, path, message, (line, column)) in cases {
        let text = format!("{head}{tail}");
        let err = Registry::from_toml_str(&text).expect_err(&text);
        let shown = err.to_string();
        assert_eq!(err.path(), path, "{text}\n-> {shown}");
        assert!(shown.contains(message), "{text}\n-> {shown}");
        // The line of the value, and a column from where the value starts (an element of a
        // list may be pointed at) to the end of that line.
        let (at_line, at_column) = err.position().expect("an error from text has a position");
        let width = text.lines().nth(line - 1).unwrap().chars().count();
        assert!(
            at_line == line && (column..=width).contains(&at_column),
            "{text}\n-> {shown}: expected line {line}, column {column} or after"
        );
        assert!(
            shown.contains(&format!("(line {at_line}, column {at_column})")),
            "{shown}"
        );
        // The registry reports the same.
        assert_eq!(Registry::from_toml_str(&text).unwrap_err().path(), path);
    }
}
