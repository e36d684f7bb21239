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
/// with the defaults of retries, an overload protection or an adaptive bulkhead written out (and a
/// breaker's duration spelled otherwise)
/// means the same settings: reloading one onto the other, either way, is no change. Holds.
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
/// "20, or `window_calls` if fewer", `open_for` "1s"... Instead, writing a default out (or
/// leaving out one written) is refused as a change: "`breakers.x.window_calls` ... changed from
/// None to Some(100), which a running registry cannot apply in place", and the same for
/// `minimum_calls = 10` under `window_calls = 10`. An operator who spells out a default can no
/// longer reload anything.
#[test]
#[ignore = "BUG: a breaker default written out is refused as a change on reload"]
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
    let failing = retry.layer().layer(service_fn(|_: http::Request<()>| async {
        Ok::<_, BoxError>(http::Response::builder().status(503).body(())?)
    }));
    tokio::time::pause();
    let get = http::Request::get("/").body(()).unwrap();
    failing.oneshot(get).await.unwrap();
    let spent = registry.retry("x").unwrap().budget_available();
    assert!(spent < full, "a retry took from the budget: {spent} of {full}");
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
    assert_eq!(registry.reload_toml_str("").unwrap_err().path(), "retries.x");
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
        BASE.replace("limit_for_period = 10", &format!("limit_for_period = {permits}"))
            .replace("max_concurrent_calls = 2\n", &format!("max_concurrent_calls = {calls}\n"))
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
        assert!(end == (20, 5) || end == (30, 7), "round {round}: a mix {end:?}");
        for (file, expected) in files.iter().zip([(20, 5), (30, 7)]) {
            registry.reload_toml_str(file).unwrap();
            assert_eq!(running(&registry), expected, "round {round}");
        }
    }
}
