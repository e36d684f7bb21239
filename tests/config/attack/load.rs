//! Reloads racing with decisions and calls, and files of 10 000 instances.

use super::*;

/// Decisions from four threads race with reloads from two (quotas back and forth, and bad files
/// among them): every decision is counted once, under whichever quota, and no reload loses a
/// key's count.
#[test]
fn reloads_racing_with_decisions_lose_and_double_nothing() {
    const FILE: &str = "[rate_limiters.count]\nlimit_for_period = 100000\nlimit_refresh_period = \"1h\"\nalgorithm = \"fixed_window\"\nkey = \"header:x-k\"\n\n[rate_limiters.log]\nlimit_for_period = 100000\nlimit_refresh_period = \"1h\"\nalgorithm = \"sliding_log\"\nkey = \"global\"\n\n[bulkheads.b]\nmax_concurrent_calls = 4\n";
    const DECISIONS: u64 = 2_000;
    let registry = Registry::from_toml_str(FILE).unwrap();
    let keys = ["k0", "k1", "k2", "k3"];
    std::thread::scope(|scope| {
        for k in keys {
            let registry = &registry;
            scope.spawn(move || {
                for _ in 0..DECISIONS {
                    assert!(next(registry, "count", &key(k)).0);
                    assert!(next(registry, "log", &ConfigKey::Global).0);
                }
            });
        }
        for reloader in 0..2 {
            let registry = &registry;
            scope.spawn(move || {
                for i in 0..100 {
                    let text = match (i + reloader) % 3 {
                        0 => FILE.replace("100000", "200000").replace("= 4\n", "= 6\n"),
                        1 => FILE.to_owned(),
                        _ => FILE.replace("= 4\n", "= 0\n"),
                    };
                    match registry.reload_toml_str(&text) {
                        Ok(reloaded) => {
                            assert!(reloaded
                                .rate_limiters
                                .iter()
                                .all(|n| n == "count" || n == "log"));
                        }
                        Err(err) => assert_eq!(err.path(), "bulkheads.b.max_concurrent_calls"),
                    }
                }
            });
        }
    });
    registry.reload_toml_str(FILE).unwrap();
    for k in keys {
        assert_eq!(
            next(&registry, "count", &key(k)),
            (true, 100_000, 100_000 - DECISIONS - 1)
        );
    }
    let all = 4 * DECISIONS;
    assert_eq!(
        next(&registry, "log", &ConfigKey::Global),
        (true, 100_000, 100_000 - all - 1)
    );
    assert_eq!(
        registry.rate_limiter("count").unwrap().snapshot().allowed,
        all + 4
    );
    assert_eq!(
        registry.rate_limiter("log").unwrap().snapshot().allowed,
        all + 1
    );
    assert_eq!(
        registry
            .bulkhead("b")
            .unwrap()
            .snapshot()
            .max_allowed_concurrent_calls,
        4
    );
}

/// Calls through a bulkhead race with reloads resizing it from 1 to 4: never more calls inside
/// than the largest size, every call permitted or refused once, every permit back at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resizes_racing_with_calls_lose_and_double_nothing() {
    let file = |n: usize| format!("[bulkheads.b]\nmax_concurrent_calls = {n}\n");
    let registry = Arc::new(Registry::from_toml_str(&file(2)).unwrap());
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let (i, m, s) = (Arc::clone(&inside), Arc::clone(&most), Arc::clone(&served));
    let service = registry
        .bulkhead("b")
        .unwrap()
        .layer()
        .layer(service_fn(move |()| {
            let (inside, most, served) = (Arc::clone(&i), Arc::clone(&m), Arc::clone(&s));
            async move {
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                served.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(())
            }
        }));
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move {
                let mut refused = 0usize;
                for _ in 0..50 {
                    // Each call is a task of its own: the bulkhead's future is `Send` for any lifetime.
                    if tokio::spawn(service.clone().oneshot(()))
                        .await
                        .unwrap()
                        .is_err()
                    {
                        refused += 1;
                    }
                }
                refused
            })
        })
        .collect();
    let resizer = {
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            for i in 0..200 {
                registry.reload_toml_str(&file(1 + i % 4)).unwrap();
                tokio::task::yield_now().await;
            }
        })
    };
    let mut refused = 0;
    for caller in callers {
        refused += caller.await.unwrap();
    }
    resizer.await.unwrap();
    registry.reload_toml_str(&file(3)).unwrap();
    let end = registry.bulkhead("b").unwrap().snapshot();
    assert!(
        most.load(Ordering::SeqCst) <= 4,
        "{} inside",
        most.load(Ordering::SeqCst)
    );
    assert_eq!(
        (
            end.available_concurrent_calls,
            end.max_allowed_concurrent_calls
        ),
        (3, 3)
    );
    let served = served.load(Ordering::SeqCst) as u64;
    assert_eq!(end.total_permitted, served);
    assert_eq!(end.total_finished, served);
    assert_eq!(end.total_rejected, refused as u64);
    assert_eq!(served + refused as u64, 400);
}

/// 10 000 instances of each kind: built, reloaded unchanged, reloaded with one change and
/// refused at their last line. The times are printed (`--nocapture`) to compare sizes, never
/// asserted.
#[test]
fn ten_thousand_instances_build_reload_and_refuse() {
    let file = |n: usize, last: u32| {
        (0..n)
            .map(|i| {
                let limit = if i == n - 1 { last } else { 10 };
                format!("[rate_limiters.l{i}]\nlimit_for_period = {limit}\nlimit_refresh_period = \"1s\"\n\n[bulkheads.b{i}]\nmax_concurrent_calls = 2\n\n")
            })
            .collect::<String>()
    };
    for n in [2_500, 5_000, 10_000] {
        let text = file(n, 10);
        let start = Instant::now();
        let registry = Registry::from_toml_str(&text).unwrap();
        let built = start.elapsed();
        let start = Instant::now();
        assert_eq!(
            registry.reload_toml_str(&text).unwrap(),
            Reloaded::default()
        );
        let unchanged = start.elapsed();
        let changed = file(n, 20);
        let start = Instant::now();
        let reloaded = registry.reload_toml_str(&changed).unwrap();
        let one = start.elapsed();
        assert_eq!(reloaded.rate_limiters, [format!("l{}", n - 1)]);
        assert_eq!(
            registry
                .rate_limiter(&format!("l{}", n - 1))
                .unwrap()
                .quota()
                .permits(),
            20
        );
        let bad = format!("{changed}[bulkheads.last]\nmax_concurrent_calls = 0\n");
        let start = Instant::now();
        let err = Registry::from_toml_str(&bad).unwrap_err();
        let refused = start.elapsed();
        assert_eq!(err.path(), "bulkheads.last.max_concurrent_calls");
        assert_eq!(err.position(), Some((bad.lines().count(), 24)));
        let err = registry.reload_toml_str(&bad).unwrap_err();
        assert_eq!(err.position(), Some((bad.lines().count(), 24)));
        eprintln!("{n} instances: built {built:?}, unchanged reload {unchanged:?}, one change {one:?}, refused {refused:?}");
    }
}
