//! `examples/plans.rs` end to end: the example's own app, served on a real listener on
//! 127.0.0.1 with connection info, called by a real `reqwest` client from several loopback
//! addresses; time is a manual clock, so nothing sleeps.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tower_bulwark::clock::ManualClock;

#[path = "../../examples/plans.rs"]
#[allow(dead_code)]
mod plans;

use crate::common::listener;

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A client whose connections come from `ip` (any 127.x address is this machine).
    fn from(ip: [u8; 4], server: SocketAddr) -> Self {
        let http = reqwest::Client::builder()
            .local_address(IpAddr::from(ip))
            .build()
            .unwrap();
        Self {
            http,
            base: format!("http://{server}"),
        }
    }

    async fn get(&self, path: &str, key: Option<&str>) -> reqwest::Response {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        request.send().await.unwrap()
    }

    async fn login(&self, password: &str) -> reqwest::StatusCode {
        self.http
            .post(format!("{}/login", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("password={password}"))
            .send()
            .await
            .unwrap()
            .status()
    }
}

async fn problem(response: reqwest::Response) -> serde_json::Value {
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

fn names(response: &reqwest::Response, header: &str) -> Vec<String> {
    listener::sf_names(response.headers(), header)
}

fn remaining(response: &reqwest::Response, policy: &str) -> i64 {
    let state = listener::sf_list(response.headers()["ratelimit"].to_str().unwrap());
    let (_, params) = state
        .iter()
        .find(|(name, _)| name == policy)
        .unwrap_or_else(|| panic!("no {policy} in {state:?}"));
    params.iter().find(|(k, _)| k == "r").unwrap().1
}

async fn start() -> (ManualClock, SocketAddr) {
    let clock = ManualClock::new();
    let (app, description) = plans::app(clock.clone()).unwrap();
    assert!(description.contains("login-failures"));
    (clock, listener::serve(app).await)
}

#[tokio::test]
async fn a_free_key_gets_twenty_permits_a_day_and_a_search_costs_five() {
    let (clock, server) = start().await;
    let alice = Client::from([127, 0, 0, 11], server);
    for i in 0..4 {
        let search = alice.get("/search", Some("free-alice")).await;
        assert_eq!(search.status(), 200, "search {i}");
        assert_eq!(remaining(&search, "plan"), 15 - 5 * i);
        assert_eq!(names(&search, "ratelimit"), ["per-ip", "plan"]);
        // The per-IP budget (10 a second) holds two searches; let it refill.
        clock.advance(Duration::from_secs(1));
    }
    let refused = alice.get("/search", Some("free-alice")).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(names(&refused, "ratelimit"), ["plan"]);
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 3600, "a day's plan refills slowly: {retry} s");
    assert_eq!(
        problem(refused).await["violated-policies"],
        serde_json::json!(["plan"])
    );
    assert_eq!(alice.get("/items", Some("free-alice")).await.status(), 429);
    // A pro key from the same address is not limited by alice's plan.
    let pro = alice.get("/search", Some("pro-bob")).await;
    assert_eq!(pro.status(), 200);
    assert_eq!(remaining(&pro, "plan"), 9_995);
}

#[tokio::test]
async fn the_per_ip_limit_binds_every_key_from_one_address() {
    let (_clock, server) = start().await;
    let client = Client::from([127, 0, 0, 12], server);
    for i in 0..6 {
        let key = format!("pro-{i}");
        assert_eq!(client.get("/items", Some(&key)).await.status(), 200, "{i}");
    }
    // Four permits left: a search (5) is refused for the IP, and spends nothing of its plan.
    let refused = client.get("/search", Some("pro-9")).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(
        problem(refused).await["violated-policies"],
        serde_json::json!(["per-ip"])
    );
    for i in 0..4 {
        assert_eq!(
            client.get("/items", Some("pro-9")).await.status(),
            200,
            "{i}"
        );
    }
    let eleventh = client.get("/items", Some("pro-9")).await;
    assert_eq!(eleventh.status(), 429);
    // pro-9 spent 4 of its plan: the refused search and the 429 took nothing.
    let other = Client::from([127, 0, 0, 13], server);
    assert_eq!(
        remaining(&other.get("/items", Some("pro-9")).await, "plan"),
        9_995
    );
}

#[tokio::test]
async fn a_planned_route_without_a_key_is_401_and_spends_nothing() {
    let (_clock, server) = start().await;
    let client = Client::from([127, 0, 0, 14], server);
    for _ in 0..20 {
        let response = client.get("/items", None).await;
        assert_eq!(response.status(), 401);
        let problem = problem(response).await;
        assert_eq!(problem["status"], 401);
        assert!(problem["detail"].as_str().unwrap().contains("x-api-key"));
    }
    // Twenty keyless requests later the address still has its whole per-IP budget.
    let first = client.get("/items", Some("free-carol")).await;
    assert_eq!(remaining(&first, "per-ip"), 9);
}

#[tokio::test]
async fn only_failed_logins_count_and_the_sixth_attempt_is_refused() {
    let (clock, server) = start().await;
    let mallory = Client::from([127, 0, 0, 15], server);
    let alice = Client::from([127, 0, 0, 16], server);
    // Successful logins never count (spread out, so the per-IP limit stays out of the way).
    for _ in 0..3 {
        for _ in 0..5 {
            assert_eq!(mallory.login("secret").await, 200);
        }
        clock.advance(Duration::from_secs(1));
    }
    for attempt in 1..=5 {
        assert_eq!(mallory.login("hunter2").await, 401, "attempt {attempt}");
    }
    clock.advance(Duration::from_secs(1));
    // The sixth attempt is refused before the handler runs, even with the right password.
    assert_eq!(mallory.login("secret").await, 429);
    assert_eq!(mallory.login("hunter3").await, 429);
    // Other clients are not affected.
    assert_eq!(alice.login("secret").await, 200);
    // A minute after the failures, the client may try again.
    clock.advance(Duration::from_secs(60));
    assert_eq!(mallory.login("secret").await, 200);
}

#[tokio::test]
async fn the_health_check_is_exempt_and_carries_no_headers() {
    let (_clock, server) = start().await;
    let client = Client::from([127, 0, 0, 17], server);
    for _ in 0..50 {
        let response = client.get("/health", None).await;
        assert_eq!(response.status(), 200);
        assert!(response.headers().get("ratelimit").is_none());
        assert!(response.headers().get("ratelimit-policy").is_none());
    }
    // The health checks spent nothing of the address's budget.
    let items = client.get("/items", Some("free-dave")).await;
    assert_eq!(remaining(&items, "per-ip"), 9);
    // And `/items` advertises only the policies that apply to it.
    assert_eq!(names(&items, "ratelimit-policy"), ["per-ip", "plan"]);
}
