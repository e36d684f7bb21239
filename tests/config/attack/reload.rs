//! Reloads one field at a time, checked through behaviour: what applies keeps every key's
//! state, what is refused leaves every later decision as it was, and a default written out is
//! no change.

use super::*;

#[test]
fn every_refused_change_leaves_every_later_decision_as_it_was() {
    // (text in BASE, its replacement, the path refused; a path ending in `*` is a prefix).
    let cases = [
        (
            "key = \"header:x-k\"",
            "key = \"header:x-k\"\nalgorithm = \"sliding_log\"",
            "rate_limiters.api.algorithm",
        ),
        (
            "key = \"header:x-k\"",
            "key = \"header:x-j\"",
            "rate_limiters.api.key",
        ),
        (
            "key = \"header:x-k\"",
            "key = \"global\"",
            "rate_limiters.api.key",
        ),
        (
            "key = \"header:x-k\"",
            "key = \"header:x-k\"\nmax_keys = 5",
            "rate_limiters.api.max_keys",
        ),
        (
            "key = \"header:x-k\"",
            "key = \"header:x-k\"\nhide_keys = true",
            "rate_limiters.api.hide_keys",
        ),
        (
            "queue_capacity = 4",
            "queue_capacity = 5",
            "bulkheads.q.queue_capacity",
        ),
        (
            "queue_capacity = 4",
            "queue_capacity = 4\nmax_wait = \"1s\"",
            "bulkheads.q.max_wait",
        ),
        (
            "max_wait = \"1s\"",
            "max_wait = \"2s\"",
            "pushbacks.p.max_wait",
        ),
        (
            "max_wait = \"1s\"",
            "max_wait = \"1s\"\nmax_hold = \"1m\"",
            "pushbacks.p.max_hold",
        ),
        (
            "max_wait = \"1s\"",
            "max_wait = \"1s\"\npacing = \"spread\"",
            "pushbacks.p.pacing",
        ),
        ("cost = 2", "cost = 1", "client_quotas.c.cost"),
        (
            "min_limit = 2",
            "min_limit = 3",
            "adaptive_bulkheads.a.min_limit",
        ),
        (
            "max_limit = 16",
            "max_limit = 17",
            "adaptive_bulkheads.a.max_limit",
        ),
        (
            "max_limit = 16",
            "max_limit = 16\ninitial_limit = 9",
            "adaptive_bulkheads.a.initial_limit",
        ),
        (
            "max_limit = 16",
            "max_limit = 16\nalgorithm = \"gradient\"",
            "adaptive_bulkheads.a.algorithm",
        ),
        (
            "max_limit = 16",
            "max_limit = 16\nignore_cancelled_calls = true",
            "adaptive_bulkheads.a.ignore_cancelled_calls",
        ),
        ("cost = 1 }", "cost = 2 }", "routes.r*"),
        ("[\"10.0.0.0/8\"]", "[\"10.0.0.0/9\"]", "routes.r*"),
        ("[routes.r]", "[routes.s]", "routes.*"),
        ("[pushbacks.p]", "[pushbacks.p2]", "pushbacks.*"),
        (
            "[bulkheads.q]\nmax_concurrent_calls = 3\nqueue_capacity = 4\n",
            "",
            "bulkheads.q",
        ),
        // Bad files: refused just the same.
        (
            "min_limit = 2",
            "min_limit = 2\nbogus = 1",
            "adaptive_bulkheads.a.bogus",
        ),
        (
            "\"1h\"\nalgorithm",
            "\"0s\"\nalgorithm",
            "rate_limiters.window.limit_refresh_period",
        ),
        ("[routes.r]", "[routes.r", "*"),
    ];
    let registry = Registry::from_toml_str(BASE).unwrap();
    let twin = Registry::from_toml_str(BASE).unwrap();
    for r in [&registry, &twin] {
        for _ in 0..3 {
            next(r, "api", &key("k1"));
        }
        next(r, "window", &ConfigKey::Global);
    }
    for (from, to, path) in cases {
        assert!(BASE.contains(from), "{from}");
        let text = with_quota_changes(&BASE.replacen(from, to, 1));
        let before = observed(&registry);
        let err = registry.reload_toml_str(&text).unwrap_err();
        match path.strip_suffix('*') {
            Some(prefix) => assert!(err.path().starts_with(prefix), "{path}: {err}"),
            None => assert_eq!(err.path(), path, "{err}"),
        }
        assert_located(&text, &err);
        assert_eq!(observed(&registry), before, "{text}");
        assert_eq!(observed(&registry), observed(&twin), "{text}");
        for k in [key("k1"), key("k2")] {
            assert_eq!(next(&registry, "api", &k), next(&twin, "api", &k), "{text}");
        }
        let global = ConfigKey::Global;
        assert_eq!(
            next(&registry, "window", &global),
            next(&twin, "window", &global)
        );
    }
    // The quota changes alone apply, and the window kept every permit it counted.
    let reloaded = registry.reload_toml_str(&with_quota_changes(BASE)).unwrap();
    assert_eq!(reloaded.rate_limiters, ["api", "window"]);
    assert_eq!(reloaded.bulkheads, ["b"]);
    let used = 2 + cases.len() as u64;
    assert_eq!(
        next(&registry, "window", &ConfigKey::Global),
        (true, 200, 200 - used)
    );
    assert_eq!(next(&registry, "api", &key("new")), (true, 20, 19));
}

#[test]
fn each_quota_field_applies_in_place_and_every_key_keeps_its_state() {
    for algorithm in ["fixed_window", "sliding_log", "sliding_counter", "gcra"] {
        let file = format!("[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1h\"\nalgorithm = \"{algorithm}\"\nkey = \"header:x-k\"\n");
        // GCRA keeps what was used when the emission interval stays: 20 per 2 h.
        let doubled = if algorithm == "gcra" {
            "20\nlimit_refresh_period = \"2h\""
        } else {
            "20\nlimit_refresh_period = \"1h\""
        };
        let edits = [
            ("10\nlimit_refresh_period = \"1h\"", doubled, 20),
            ("key", "max_wait = \"1s\"\nkey", 10),
            ("key", "max_wait = \"1152921504606846976ns\"\nkey", 10),
        ];
        for (from, to, limit) in edits {
            let registry = Registry::from_toml_str(&file).unwrap();
            for k in ["k1", "k1", "k1", "k2"] {
                assert!(next(&registry, "api", &key(k)).0);
            }
            let edited = file.replacen(from, to, 1);
            let reloaded = registry.reload_toml_str(&edited).unwrap();
            assert_eq!(reloaded.rate_limiters, ["api"], "{edited}");
            assert!(reloaded.bulkheads.is_empty());
            assert_eq!(
                next(&registry, "api", &key("k1")),
                (true, limit, limit - 4),
                "{edited}"
            );
            assert_eq!(
                next(&registry, "api", &key("k2")),
                (true, limit, limit - 2),
                "{edited}"
            );
            assert_eq!(
                next(&registry, "api", &key("k3")),
                (true, limit, limit - 1),
                "{edited}"
            );
            assert_eq!(
                registry.reload_toml_str(&edited).unwrap(),
                Reloaded::default()
            );
        }
        // The burst and the period reach the running limiter.
        let registry = Registry::from_toml_str(&file).unwrap();
        let edited = file
            .replacen("key", "burst = 15\nkey", 1)
            .replacen("\"1h\"", "\"30m\"", 1);
        assert_eq!(
            registry.reload_toml_str(&edited).unwrap().rate_limiters,
            ["api"]
        );
        let quota = registry.rate_limiter("api").unwrap().quota();
        assert_eq!(
            (quota.burst(), quota.period()),
            (15, Duration::from_secs(1800))
        );
    }
}

/// Pairs of files that mean the same: every default written out, and equal durations spelled
/// differently. A reload from one to the other, either way, is no change.
#[test]
fn a_default_written_out_is_no_change() {
    let lim = "[rate_limiters.a]\nlimit_for_period = 10\nlimit_refresh_period = \"1h\"\n";
    let global = format!("{lim}key = \"global\"\n");
    let pairs = [
        (lim.to_owned(), format!("{lim}burst = 10\nmax_wait = \"0s\"\nalgorithm = \"gcra\"\nkey = \"peer_ip\"\nmax_keys = 1000000\nhide_keys = false\nstore = \"memory\"\n")),
        (lim.to_owned(), lim.replace("\"1h\"", "\"60m\"")),
        (lim.to_owned(), lim.replace("\"1h\"", "\"3600000ms\"")),
        (lim.to_owned(), lim.replace("\"1h\"", "\"59m60s\"")),
        (format!("{lim}key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n"), format!("{lim}key = \"forwarded_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\nforwarded_header = \"x-forwarded-for\"\n")),
        ("[pushbacks.p]\n".to_owned(), "[pushbacks.p]\nmax_wait = \"0s\"\nmax_hold = \"10m\"\npacing = \"until_spent\"\n".to_owned()),
        ("[pushbacks.p]\nmax_hold = \"10m\"\n".to_owned(), "[pushbacks.p]\nmax_hold = \"600s\"\n".to_owned()),
        (format!("{global}[client_quotas.c]\nlimiter = \"a\"\n"), format!("{global}[client_quotas.c]\nlimiter = \"a\"\ncost = 1\n")),
        (format!("{lim}[routes.r]\npolicies = [\"a\"]\n"), format!("{lim}[routes.r]\npolicies = [{{ limiter = \"a\", cost = 1, shadow = false }}]\n")),
        ("[adaptive_bulkheads.a]\n".to_owned(), "[adaptive_bulkheads.a]\nmin_limit = 1\ninitial_limit = 8\nmax_limit = 256\nalgorithm = \"aimd\"\nignore_cancelled_calls = false\n".to_owned()),
        ("[adaptive_bulkheads.a]\nmax_limit = 4\n".to_owned(), "[adaptive_bulkheads.a]\nmax_limit = 4\ninitial_limit = 4\n".to_owned()),
        ("[bulkheads.b]\nmax_concurrent_calls = 1\nmax_wait = \"1s\"\n".to_owned(), "[bulkheads.b]\nmax_concurrent_calls = 1\nmax_wait = \"1000ms\"\n".to_owned()),
    ];
    for (short, long) in pairs {
        for (from, to) in [(&short, &long), (&long, &short)] {
            let registry = Registry::from_toml_str(from).unwrap_or_else(|e| panic!("{from}: {e}"));
            let reloaded = registry.reload_toml_str(to);
            assert_eq!(reloaded, Ok(Reloaded::default()), "{from}\n->\n{to}");
        }
    }
}

/// Promise: a semaphore bulkhead's `max_wait` defaults to `"0s"`, and a default written out is
/// no change. Both directions of the reload are refused: `changed from None to Some(0ns)`.
#[test]
fn a_semaphore_bulkhead_s_default_max_wait_written_out_is_no_change() {
    let short = "[bulkheads.b]\nmax_concurrent_calls = 1\n";
    let long = "[bulkheads.b]\nmax_concurrent_calls = 1\nmax_wait = \"0s\"\n";
    let refused: Vec<String> = [(short, long), (long, short)]
        .into_iter()
        .filter_map(|(from, to)| {
            let registry = Registry::from_toml_str(from).unwrap();
            registry.reload_toml_str(to).err().map(|e| e.to_string())
        })
        .collect();
    assert!(refused.is_empty(), "{refused:#?}");
}

/// A bulkhead shrunk under the calls it holds neither loses nor doubles a permit: the calls
/// already in keep running, new ones wait for the smaller size, and every permit comes back.
#[tokio::test]
async fn a_bulkhead_resized_under_held_calls_keeps_exact_count() {
    let file = |n: usize| format!("[bulkheads.b]\nmax_concurrent_calls = {n}\n");
    let registry = Registry::from_toml_str(&file(2)).unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let open = Arc::clone(&gate);
    let service = registry
        .bulkhead("b")
        .unwrap()
        .layer()
        .layer(service_fn(move |()| {
            let gate = Arc::clone(&gate);
            async move {
                gate.acquire().await.unwrap().forget();
                Ok::<_, BoxError>(())
            }
        }));
    let snapshot = || registry.bulkhead("b").unwrap().snapshot();
    let hold = |n: usize| {
        (0..n)
            .map(|_| tokio::spawn(service.clone().oneshot(())))
            .collect::<Vec<_>>()
    };
    let held = hold(2);
    settle(|| snapshot().available_concurrent_calls == 0).await;
    assert_eq!(registry.reload_toml_str(&file(1)).unwrap().bulkheads, ["b"]);
    assert_eq!(snapshot().max_allowed_concurrent_calls, 1);
    assert_eq!(snapshot().available_concurrent_calls, 0);
    assert!(
        service.clone().oneshot(()).await.is_err(),
        "over the new size"
    );
    open.add_permits(1);
    settle(|| snapshot().total_finished == 1).await;
    // One of two held calls ended: still at the new size of 1, so still nothing free.
    assert_eq!(snapshot().available_concurrent_calls, 0);
    assert!(service.clone().oneshot(()).await.is_err(), "still full");
    open.add_permits(1);
    for call in held {
        call.await.unwrap().unwrap();
    }
    assert_eq!(snapshot().available_concurrent_calls, 1);

    assert_eq!(registry.reload_toml_str(&file(3)).unwrap().bulkheads, ["b"]);
    let held = hold(3);
    settle(|| snapshot().available_concurrent_calls == 0).await;
    assert!(service.clone().oneshot(()).await.is_err(), "a fourth call");
    open.add_permits(3);
    for call in held {
        call.await.unwrap().unwrap();
    }
    let end = snapshot();
    assert_eq!(
        (
            end.available_concurrent_calls,
            end.max_allowed_concurrent_calls
        ),
        (3, 3)
    );
    assert_eq!(
        (end.total_permitted, end.total_rejected, end.total_finished),
        (5, 3, 5)
    );
}
