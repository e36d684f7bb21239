//! `examples/llm_gateway.rs` through a real listener and a real client: keys limited in the
//! tokens they used, refusals in tokens, the upstream's body unchanged, and the upstream's own
//! quota kept by the gateway's client quota (no 429 from the upstream).

use std::net::SocketAddr;

#[path = "../../examples/llm_gateway.rs"]
#[allow(dead_code)]
mod llm_gateway;

async fn complete(
    client: &reqwest::Client,
    addr: SocketAddr,
    key: Option<&str>,
    max: u32,
) -> reqwest::Response {
    let mut request = client
        .post(format!("http://{addr}/v1/complete"))
        .body(format!(r#"{{"max_tokens": {max}, "prompt": "hello"}}"#));
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    request.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_limits_keys_in_tokens_used_and_keeps_to_the_upstreams_quota() {
    let addr = llm_gateway::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let client = reqwest::Client::new();

    let missing = complete(&client, addr, None, 10).await;
    assert_eq!(missing.status(), 401);
    assert_eq!(
        missing.headers()["content-type"],
        "application/problem+json"
    );

    // Key a: 4 000 reserved, 2 000 used each. Four fit (8 000 used); the fifth needs 4 000 where
    // 2 000 are left, and is told to come back when 2 000 more are: 12 s.
    for i in 0..4 {
        let ok = complete(&client, addr, Some("a"), 4000).await;
        assert_eq!(ok.status(), 200, "request {i}");
        let body: serde_json::Value = serde_json::from_slice(&ok.bytes().await.unwrap()).unwrap();
        assert_eq!(
            body["usage"]["total_tokens"], 2000,
            "the upstream's body, unchanged"
        );
    }
    let refused = complete(&client, addr, Some("a"), 4000).await;
    assert_eq!(refused.status(), 429);
    // The example runs on the real clock, so a few tokens may have come back since (one every
    // 6 ms): about 2 000 are left, and the wait is 12 s less what has passed.
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((11..=12).contains(&retry), "Retry-After: {retry}");
    let fields = refused.headers()["ratelimit"].to_str().unwrap().to_owned();
    let left: u64 = fields
        .split("r=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((2000..2200).contains(&left), "{fields}");
    // A smaller request still fits in what is left.
    assert_eq!(complete(&client, addr, Some("a"), 1000).await.status(), 200);

    // Keys b..h: 7 more keys of 8 000 each would take the upstream past its 60 000. The client
    // quota refuses first: the upstream never answers 429.
    let mut upstream_refusals = 0;
    let mut gateway_refusals = 0;
    for key in ["b", "c", "d", "e", "f", "g", "h"] {
        for _ in 0..4 {
            let response = complete(&client, addr, Some(key), 4000).await;
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            match status {
                200 => {}
                429 if body.contains("upstream") => upstream_refusals += 1,
                503 => gateway_refusals += 1,
                other => panic!("{other}: {body}"),
            }
        }
    }
    assert_eq!(upstream_refusals, 0);
    // 8 500 used by a; 29 000 more fit in 60 000 (2 000 each once settled, 4 000 reserved).
    assert!(
        gateway_refusals >= 1,
        "the client quota held the gateway back"
    );
}
