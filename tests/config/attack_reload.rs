//! Reloads attacked from outside, through the documented promises only: settings written out at
//! their default are no change for every kind, reloads racing each other apply whole, quotas
//! toggled under HTTP traffic never admit past the larger quota, and bulkheads resized under
//! held and waiting calls report and admit as documented.

use super::*;
use crate::common::Rng;
use crate::support::{get_from_peer, routed};

/// Reloads each file of `pairs` onto a registry of the other, both ways: every reload must be
/// `Ok(Reloaded::default())`; the refusals are listed.
fn refused_no_changes(pairs: &[(&str, &str)]) -> Vec<String> {
    let mut refused = Vec::new();
    for (short, long) in pairs {
        for (from, to) in [(short, long), (long, short)] {
            let registry = Registry::from_toml_str(from).unwrap_or_else(|e| panic!("{from}: {e}"));
            match registry.reload_toml_str(to) {
                Ok(reloaded) => assert_eq!(reloaded, Reloaded::default(), "{from}->{to}"),
                Err(e) => refused.push(format!("{from:?} -> {to:?}: {e}")),
            }
        }
    }
    refused
}

/// Promise, `src/config/reload.rs:37`: "An instance whose settings are unchanged is not touched
/// at all", and the tables of `src/config/mod.rs`: a field left out takes its default. A file
/// with the defaults of retries, an overload protection or an adaptive bulkhead written out
/// (and a breaker's duration spelled otherwise) means the same settings: reloading one onto
/// the other, either way, is no change. Holds.
#[test]
fn defaults_written_out_are_no_change_for_retries_and_overload() {
    let refused = refused_no_changes(&[
        (
            "[retries.x]\n",
            "[retries.x]\nmax_attempts = 3\nbase = \"50ms\"\ncap = \"1s\"\nmax_wait = \"5s\"\n\
             ratio = 0.2\nmin_per_second = 3\nwindow = \"10s\"\n",
        ),
        (
            "[overload.x]\n",
            "[overload.x]\nmin_limit = 8\ninitial_limit = 16\nmax_limit = 1000\n\
             probe_every = 300\ncritical_guarantee = 0.3\ndefault_guarantee = 0.1\n\
             critical_borrowing = 3\npriority_header = \"x-priority\"\n",
        ),
        (
            "[adaptive_bulkheads.x]\nmin_limit = 300\n",
            "[adaptive_bulkheads.x]\nmin_limit = 300\nmax_limit = 300\ninitial_limit = 300\n",
        ),
        (
            "[breakers.x]\nopen_for = \"1s\"\n",
            "[breakers.x]\nopen_for = \"1000ms\"\n",
        ),
    ]);
    assert!(refused.is_empty(), "{refused:#?}");
}

/// Promise, `src/config/reload.rs:37`: "An instance whose settings are unchanged is not touched
/// at all"; `src/config/mod.rs:167`-`168`: a breaker field "left out keeps the builder's
/// default", and the table (`mod.rs:181`-`187`) gives them: `window_calls` 100, `minimum_calls`
/// "20, or `window_calls` if fewer", `open_for` "1s"... Writing a default out (or leaving out
/// one written) is no change. (Found by this attack: it was refused, "`breakers.x.window_calls`
/// ... changed from None to Some(100)", and the same for `minimum_calls = 10` under
/// `window_calls = 10`; the validation now writes in what the builder filled in.)
#[test]
fn defaults_written_out_are_no_change_for_breakers() {
    let refused = refused_no_changes(&[
        (
            "[breakers.x]\n",
            "[breakers.x]\nwindow_calls = 100\nminimum_calls = 20\nfailure_rate = 0.5\n\
             slow_call_rate = 1.0\nslow_call_duration = \"10s\"\nopen_for = \"1s\"\n\
             half_open_calls = 10\n",
        ),
        (
            "[breakers.x]\nwindow_calls = 10\n",
            "[breakers.x]\nwindow_calls = 10\nminimum_calls = 10\n",
        ),
    ]);
    assert!(refused.is_empty(), "{refused:#?}");
}

/// Promise, `src/config/mod.rs` (last paragraph): "a change that cannot apply in place (any
/// setting ... of retries) ... is refused and changes nothing"; `src/config/reload.rs:37`: an
/// unchanged instance "is not touched at all". Each retries field changed is refused at its
/// path, and the budget already spent stays spent through refused and unchanged reloads.
#[tokio::test]
async fn a_changed_retries_field_is_refused_and_the_budget_is_kept() {
    let text = "[retries.x]\nmin_per_second = 2\nratio = 0\n";
    let registry = Registry::from_toml_str(text).unwrap();
    let retry = registry.retry("x").unwrap();
    let full = retry.budget_available();
    let failing = retry
        .layer()
        .layer(service_fn(|_: http::Request<()>| async {
            Ok::<_, BoxError>(http::Response::builder().status(503).body(())?)
        }));
    tokio::time::pause();
    let get = http::Request::get("/").body(()).unwrap();
    failing.oneshot(get).await.unwrap();
    let spent = registry.retry("x").unwrap().budget_available();
    assert!(
        spent < full,
        "a retry took from the budget: {spent} of {full}"
    );
    for (field, value) in [
        ("max_attempts", "4"),
        ("base", "\"10ms\""),
        ("cap", "\"2s\""),
        ("max_wait", "\"1s\""),
        ("min_per_second", "3"),
        ("window", "\"20s\""),
        ("ratio", "0.5"),
    ] {
        let changed = if text.contains(field) {
            text.replace(&format!("{field} = "), &format!("{field} = {value} #"))
        } else {
            format!("{text}{field} = {value}\n")
        };
        let err = registry.reload_toml_str(&changed).unwrap_err();
        assert_eq!(err.path(), format!("retries.x.{field}"), "{err}");
        assert_located(&changed, &err);
    }
    assert_eq!(registry.reload_toml_str(text), Ok(Reloaded::default()));
    assert_eq!(
        registry.reload_toml_str("").unwrap_err().path(),
        "retries.x"
    );
    assert_eq!(registry.retry("x").unwrap().budget_available(), spent);
}

/// The quota of `api` and the size of bulkhead `b` that `registry` runs with now.
fn running(registry: &Registry) -> (u32, usize) {
    let quota = registry.rate_limiter("api").unwrap().quota();
    let b = registry.bulkhead("b").unwrap().snapshot();
    (quota.permits(), b.max_allowed_concurrent_calls)
}

/// Promise, `src/config/reload.rs:77`: "Reloads apply one at a time", and `reload.rs:37`: an
/// instance whose settings are unchanged is not touched. Two threads reload two files that
/// each change both `api` and `b`, in opposite orders: the registry ends running one file
/// whole, never a mix, and what it runs stays what it believes it runs (reloading either file
/// afterwards applies that file exactly). Holds.
#[test]
fn racing_reloads_apply_whole_files_one_at_a_time() {
    let files = [(20, 5), (30, 7)].map(|(permits, calls)| {
        BASE.replace(
            "limit_for_period = 10",
            &format!("limit_for_period = {permits}"),
        )
        .replace(
            "max_concurrent_calls = 2\n",
            &format!("max_concurrent_calls = {calls}\n"),
        )
    });
    for round in 0..20 {
        let registry = Registry::from_toml_str(BASE).unwrap();
        std::thread::scope(|scope| {
            for first in 0..2 {
                let (registry, files) = (&registry, &files);
                scope.spawn(move || {
                    for i in 0..50 {
                        registry.reload_toml_str(&files[(first + i) % 2]).unwrap();
                    }
                });
            }
            scope.spawn(|| {
                for _ in 0..200 {
                    let (permits, calls) = running(&registry);
                    assert!([10, 20, 30].contains(&permits) && [2, 5, 7].contains(&calls));
                }
            });
        });
        let end = running(&registry);
        assert!(
            end == (20, 5) || end == (30, 7),
            "round {round}: a mix {end:?}"
        );
        for (file, expected) in files.iter().zip([(20, 5), (30, 7)]) {
            registry.reload_toml_str(file).unwrap();
            assert_eq!(running(&registry), expected, "round {round}");
        }
    }
}

/// Promise, `src/config/reload.rs:27`-`28`: "the layers and services already built from them
/// see the change at once, and every key keeps its state", with the rule of
/// `src/limiter/keyed.rs:202`-`203`: "In the window of the change a key is admitted at most
/// the larger of the two quotas". Eight tasks send requests through a route layer built once
/// while a ninth reloads the quota between 10 and 5 an hour-long window: for every algorithm
/// no key is admitted more than 10, every request is answered 200 or 429 and counted once in
/// the limiter's snapshot, and once back at 10 a window algorithm admits exactly the rest of
/// 10. Holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quotas_toggled_under_traffic_never_admit_past_the_larger() {
    let peer = "192.0.2.1:4000".parse().unwrap();
    for algorithm in ["gcra", "fixed_window", "sliding_log", "sliding_counter"] {
        let file = move |permits: u32| {
            format!(
                "[rate_limiters.api]\nlimit_for_period = {permits}\n\
                 limit_refresh_period = \"100h\"\nalgorithm = \"{algorithm}\"\n\
                 key = \"header:x-k\"\n\n[routes.r]\npolicies = [\"api\"]\n"
            )
        };
        let registry = Arc::new(Registry::from_toml_str(&file(10)).unwrap());
        let app = routed(&registry, "r");
        let senders: Vec<_> = (0..8u64)
            .map(|task| {
                let app = app.clone();
                tokio::spawn(async move {
                    let mut rng = Rng(task * 7919 + 1);
                    let mut admitted = [0u64; 4];
                    let mut refused = 0;
                    for _ in 0..40 {
                        let k = rng.below(4) as usize;
                        let name = format!("k{k}");
                        let response = get_from_peer(&app, peer, &[("x-k", &name)]).await;
                        match response.status().as_u16() {
                            200 => admitted[k] += 1,
                            429 => refused += 1,
                            other => panic!("{algorithm}: answered {other}"),
                        }
                    }
                    (admitted, refused)
                })
            })
            .collect();
        let reloader = {
            let registry = Arc::clone(&registry);
            tokio::spawn(async move {
                for i in 0..200 {
                    registry.reload_toml_str(&file([5, 10][i % 2])).unwrap();
                    tokio::task::yield_now().await;
                }
            })
        };
        let (mut admitted, mut refused) = ([0u64; 4], 0);
        for sender in senders {
            let (a, r) = sender.await.unwrap();
            (0..4).for_each(|k| admitted[k] += a[k]);
            refused += r;
        }
        reloader.await.unwrap();
        assert!(
            admitted.iter().all(|&a| a <= 10),
            "{algorithm}: {admitted:?}"
        );
        let snapshot = registry.rate_limiter("api").unwrap().snapshot();
        let total: u64 = admitted.iter().sum();
        assert_eq!(
            (snapshot.allowed, snapshot.limited),
            (total, refused),
            "{algorithm}"
        );
        assert_eq!(total + refused, 320, "{algorithm}");
        registry.reload_toml_str(&file(10)).unwrap();
        for (k, before) in admitted.iter().enumerate() {
            let name = format!("k{k}");
            let mut more = 0;
            while get_from_peer(&app, peer, &[("x-k", &name)]).await.status() == 200 {
                more += 1;
            }
            let all = before + more;
            assert!(all <= 10, "{algorithm} k{k}: {all}");
            if algorithm != "gcra" {
                assert_eq!(all, 10, "{algorithm} k{k}: {before} then {more}");
            }
        }
    }
}

/// Promise, `src/config/health.rs:146`-`149` and `:161`-`166`: a bulkhead's entry is
/// `saturated` when "every permit is taken", with `availableConcurrentCalls` and
/// `maxAllowedConcurrentCalls`; `src/bulkhead/handle.rs:113`-`116` (what a reload's size
/// change does): "Lowering it below the calls in flight lets no new call in until enough of
/// them have ended ... Raising it lets waiting calls in at once." A bulkhead of 4 holding 4
/// shrunk to 2 reports 0 free of 2 and saturated until only one call is left; a queue
/// bulkhead of 1 with 3 waiting, raised to 3, lets two of them in without any call ending.
#[tokio::test]
async fn health_follows_sizes_reloaded_under_held_and_waiting_calls() {
    let file = |b: usize, q: usize| {
        format!(
            "[bulkheads.b]\nmax_concurrent_calls = {b}\n\n\
             [bulkheads.q]\nmax_concurrent_calls = {q}\nqueue_capacity = 4\n"
        )
    };
    let registry = Registry::from_toml_str(&file(4, 1)).unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let held = |name: &str, n: usize| -> Vec<_> {
        let (gate, inside) = (Arc::clone(&gate), Arc::clone(&inside));
        let service = registry
            .bulkhead(name)
            .unwrap()
            .layer()
            .layer(service_fn(move |()| {
                let (gate, inside) = (Arc::clone(&gate), Arc::clone(&inside));
                async move {
                    inside.fetch_add(1, Ordering::SeqCst);
                    gate.acquire().await.unwrap().forget();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(())
                }
            }));
        (0..n)
            .map(|_| tokio::spawn(service.clone().oneshot(())))
            .collect()
    };
    // (saturated, free, limit, queued) of bulkhead `name` in `health()` and in its JSON.
    let entry = |name: &str| {
        let health = registry.health();
        let b = health.bulkheads.iter().find(|b| b.name == name).unwrap();
        let s = &b.snapshot;
        let json = format!(
            "\"{name}\":{{\"status\":\"UP\",\"saturated\":{},\"availableConcurrentCalls\":{},\
             \"maxAllowedConcurrentCalls\":{},\"queueDepth\":{}",
            b.saturated,
            s.available_concurrent_calls,
            s.max_allowed_concurrent_calls,
            s.queue_depth
        );
        assert!(
            health.to_json().contains(&json),
            "{json} in {}",
            health.to_json()
        );
        let counts = (s.available_concurrent_calls, s.max_allowed_concurrent_calls);
        (b.saturated, counts.0, counts.1, s.queue_depth)
    };
    let calls = held("b", 4);
    settle(|| inside.load(Ordering::SeqCst) == 4).await;
    assert_eq!(
        registry.reload_toml_str(&file(2, 1)).unwrap().bulkheads,
        ["b"]
    );
    assert_eq!(entry("b"), (true, 0, 2, 0));
    gate.add_permits(2);
    settle(|| inside.load(Ordering::SeqCst) == 2).await;
    assert_eq!(entry("b"), (true, 0, 2, 0), "two in flight at a size of 2");
    gate.add_permits(1);
    settle(|| inside.load(Ordering::SeqCst) == 1).await;
    assert_eq!(entry("b"), (false, 1, 2, 0));
    gate.add_permits(1);
    for call in calls {
        call.await.unwrap().unwrap();
    }

    let calls = held("q", 4);
    settle(|| inside.load(Ordering::SeqCst) == 1 && entry("q").3 == 3).await;
    assert_eq!(entry("q"), (true, 0, 1, 3));
    assert_eq!(
        registry.reload_toml_str(&file(2, 3)).unwrap().bulkheads,
        ["q"]
    );
    settle(|| inside.load(Ordering::SeqCst) == 3).await;
    assert_eq!(
        entry("q"),
        (true, 0, 3, 1),
        "two waiting calls let in at once"
    );
    gate.add_permits(4);
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(entry("q"), (false, 3, 3, 0));
}

/// A rate limiter kept in a Redis that never answers (nothing is decided with it here).
const REDIS: &str = "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1h\"\n\
                     store = \"redis\"\nredis_url = \"redis://127.0.0.1:1/\"\n";

/// Promise, `src/config/mod.rs:56`-`58`: `redis_prefix` defaults to `bulwark:<algorithm>:`
/// (`bulwark:gcra:` here, as `tests/redis/store.rs:540` checks), `redis_timeout` to "the
/// store's default" (100 ms, `src/redis/builder.rs:28`), `redis_fail_mode` to `local`;
/// `src/config/reload.rs:37`: "An instance whose settings are unchanged is not touched at
/// all". The prefix, timeout and fail mode written out are no change. (Found by this attack:
/// the prefix and the timeout were refused, "`rate_limiters.api.redis_prefix` ... changed from
/// None to Some(\"bulwark:gcra:\")", and back; the validation now writes their defaults in.)
#[tokio::test]
async fn redis_defaults_written_out_are_no_change() {
    let refused = refused_no_changes(&[
        (REDIS, &format!("{REDIS}redis_prefix = \"bulwark:gcra:\"\n")),
        (REDIS, &format!("{REDIS}redis_timeout = \"100ms\"\n")),
        (
            REDIS,
            &format!("{REDIS}redis_fail_mode = \"local\"\nredis_leases = false\n"),
        ),
    ]);
    assert!(refused.is_empty(), "{refused:#?}");
}

/// Promise, `src/config/reload.rs:39`-`42`: a reload that changes "a rate limiter's ...
/// `store` or Redis settings" is "refused as a whole, with an error naming the instance and
/// the field". Each Redis setting changed (and memory to Redis) is refused at its field, with
/// the quota change beside it not applied. Holds.
#[tokio::test]
async fn a_changed_redis_setting_is_refused_at_its_field() {
    let registry = Registry::from_toml_str(REDIS).unwrap();
    let cases = [
        ("redis_url = \"redis://127.0.0.1:2/\"", "redis_url"),
        ("redis_prefix = \"other:\"", "redis_prefix"),
        ("redis_timeout = \"7ms\"", "redis_timeout"),
        ("redis_fail_mode = \"open\"", "redis_fail_mode"),
        (
            "redis_fail_mode = \"fallback\"\nfallback_limit_for_period = 3",
            "redis_fail_mode",
        ),
        ("redis_leases = true", "redis_leases"),
    ];
    for (line, field) in cases {
        let field_name = line.split(" =").next().unwrap();
        let kept = REDIS
            .lines()
            .filter(|l| !l.starts_with(field_name))
            .collect::<Vec<_>>()
            .join("\n");
        let text = format!("{kept}\n{line}\n").replace("= 10", "= 20");
        let err = registry.reload_toml_str(&text).unwrap_err();
        assert_eq!(
            err.path(),
            format!("rate_limiters.api.{field}"),
            "{text}\n{err}"
        );
        assert_located(&text, &err);
        assert_eq!(registry.rate_limiter("api").unwrap().quota().permits(), 10);
    }
    let memory = REDIS.replace(
        "store = \"redis\"\nredis_url = \"redis://127.0.0.1:1/\"\n",
        "",
    );
    let err = registry.reload_toml_str(&memory).unwrap_err();
    assert!(err.path().starts_with("rate_limiters.api."), "{err}");
    let err = Registry::from_toml_str(&memory)
        .unwrap()
        .reload_toml_str(REDIS);
    assert!(err.unwrap_err().path().starts_with("rate_limiters.api."));
}

/// Promise, `src/config/mod.rs:88` and `:122`: a route's or client quota's `cost` is "at most
/// what the limiter can grant at once (its `burst` with `gcra`, its `limit_for_period` with a
/// window algorithm)"; `src/config/reload.rs:75`-`76`: a file `from_toml_str` refuses is
/// refused by a reload and "the error changes nothing". A reload that lowers a quota under a
/// cost is refused at the cost, and the other quota and bulkhead changes of the same file are
/// not applied; `Reloaded` lists what changed in name order, not file order. Holds.
#[test]
fn a_quota_lowered_under_a_cost_is_refused_whole() {
    let base = BASE.replace("[\"api\",", "[{ limiter = \"api\", cost = 2 },");
    let registry = Registry::from_toml_str(&base).unwrap();
    let before = observed(&registry);
    let lowered = [
        (
            "limit_for_period = 100\n",
            "limit_for_period = 1\n",
            "client_quotas.c.cost",
        ),
        (
            "key = \"header",
            "burst = 1\nkey = \"header",
            "routes.r.policies",
        ),
    ];
    for (from, to, path) in lowered {
        let text = with_quota_changes(&base.replacen(from, to, 1));
        let err = registry.reload_toml_str(&text).unwrap_err();
        assert!(err.path().starts_with(path), "{text}\n{err}");
        assert_located(&text, &err);
        assert_eq!(observed(&registry), before);
    }
    let renamed = |text: &str| {
        text.replacen("[rate_limiters.api]", "[rate_limiters.z]", 1)
            .replace("[bulkheads.b]", "[bulkheads.zz]")
            .replace("\"api\"", "\"z\"")
    };
    let registry = Registry::from_toml_str(&renamed(BASE)).unwrap();
    let text = renamed(&with_quota_changes(BASE)).replace("= 3\n", "= 4\n");
    let reloaded = registry.reload_toml_str(&text).unwrap();
    assert_eq!(reloaded.rate_limiters, ["window", "z"]);
    assert_eq!(reloaded.bulkheads, ["q", "zz"]);
}

/// Promise, `src/config/error.rs:13`-`15`: "an error reading the file has neither path nor
/// position", and `tests/config/files.rs:404` (from `from_path`'s "A file that cannot be
/// read"): the error names the file. A directory, a file that is not UTF-8 and a missing file,
/// given to `from_path` and to `reload_path`, are errors with no path nor position that name
/// the file; a good file at a path reloads with its changes. Holds.
#[test]
fn file_errors_name_the_file_with_no_position() {
    let dir = std::env::temp_dir().join(format!("bulwark-attack-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (bytes, good) = (dir.join("latin1.toml"), dir.join("good.toml"));
    std::fs::write(&bytes, b"[bulkheads.b]\nmax_concurrent_calls = 5 # \xe9\n").unwrap();
    std::fs::write(&good, with_quota_changes(BASE)).unwrap();
    let registry = Registry::from_toml_str(BASE).unwrap();
    for path in [&dir, &bytes, &dir.join("missing.toml")] {
        let errors = [
            Registry::from_path(path).err().unwrap(),
            registry.reload_path(path).unwrap_err(),
        ];
        for err in errors {
            assert_eq!((err.path(), err.position()), ("", None), "{err}");
            assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
        }
    }
    assert_eq!(registry.reload_path(&good).unwrap().bulkheads, ["b"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
