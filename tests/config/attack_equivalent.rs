//! Rewrites of a file that mean the same settings are no change on reload (networks listed in
//! another order, a header name in capitals), and the health report's order: found by an
//! attack by a helper that had not seen the code.

use tower_bulwark::config::Registry;

/// Promise (`src/config/reload.rs`, `Registry::reload_path`): "An instance whose settings are
/// unchanged is not touched at all"; and the module docs' table of an overload protection:
/// `priority_header` is "a header name". Header names are case-insensitive (RFC 9110 §5.1), and
/// the registry itself reads `"X-Priority"` as the header `x-priority` (the layer matches it
/// either way). Rewriting the default `"x-priority"` as `"X-Priority"` changes no setting, yet
/// the reload is refused as a change "from \"x-priority\" to \"X-Priority\"" that cannot apply
/// in place, and the operator's whole edit is thrown away. (A rate limiter's
/// `key = "header:X-Api-Key"` is normalised, so the same rewrite there is no change.)
#[test]
fn a_priority_header_rewritten_in_another_case_is_no_change() {
    let registry = Registry::from_toml_str(
        "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
         key = \"header:x-api-key\"\n[overload.api]\n",
    )
    .unwrap();
    // The rate limiter's header key, rewritten in capitals: no change, as it should be.
    let same_key = registry.reload_toml_str(
        "[rate_limiters.api]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
         key = \"header:X-Api-Key\"\n[overload.api]\n",
    );
    assert!(same_key.is_ok(), "{same_key:?}");
    // The overload protection's header, the default written out in capitals: the same header.
    let same_header = registry.reload_toml_str(
        "[rate_limiters.api]\nlimit_for_period = 20\nlimit_refresh_period = \"1s\"\n\
         key = \"header:x-api-key\"\n[overload.api]\npriority_header = \"X-Priority\"\n",
    );
    assert!(
        same_header.is_ok(),
        "the same header name in other case is no change, and the quota edit beside it \
         applies: {same_header:?}"
    );
    let limiter = registry.rate_limiter("api").unwrap();
    assert_eq!(tower_bulwark::Limiter::quota(limiter).permits(), 20);
}

/// Promise (`src/config/reload.rs`, `Registry::reload_path`): "An instance whose settings are
/// unchanged is not touched at all", and only a change of a fixed setting (`trusted_proxies`,
/// a route's `exempt_networks`) refuses a reload. `trusted_proxies` is the set of proxies whose
/// header is believed and `exempt_networks` the set of networks that skip a route: the order
/// they are listed in means nothing (`ForwardedIp` and the exemption test membership). Listing
/// the same networks in another order (or one twice) is refused as a change that cannot apply in
/// place, and the quota edit made in the same file is lost with it.
#[cfg(feature = "axum")]
#[test]
fn networks_listed_in_another_order_are_no_change() {
    let file = |permits: u32, proxies: &str, exempt: &str| {
        format!(
            "[rate_limiters.api]\nlimit_for_period = {permits}\nlimit_refresh_period = \"1s\"\n\
             key = \"forwarded_ip\"\ntrusted_proxies = [{proxies}]\n\
             [routes.search]\npolicies = [\"api\"]\nexempt_networks = [{exempt}]\n"
        )
    };
    let a = "\"10.0.0.0/8\", \"192.168.0.0/16\"";
    let b = "\"192.168.0.0/16\", \"10.0.0.0/8\"";
    let registry = Registry::from_toml_str(&file(10, a, a)).unwrap();
    let limiter = registry.rate_limiter("api").unwrap();
    for (proxies, exempt) in [(b, a), (a, b), (&*format!("{a}, \"10.0.0.0/8\""), a)] {
        let permits = tower_bulwark::Limiter::quota(limiter).permits() + 1;
        let reloaded = registry.reload_toml_str(&file(permits, proxies, exempt));
        assert!(
            reloaded.is_ok(),
            "trusted_proxies = [{proxies}], exempt_networks = [{exempt}]: the same networks; \
             the quota edit should apply: {reloaded:?}"
        );
        assert_eq!(tower_bulwark::Limiter::quota(limiter).permits(), permits);
    }
}

/// Promise (`src/config/health.rs`, `Health::bulkheads`): "One entry per bulkhead, by name."
/// (as `rate_limiters`: "One entry per rate limiter, by name.", which are in name order, and
/// `Reloaded`'s lists, "by name, in name order"). With both kinds of bulkhead configured the
/// fixed ones come first and the adaptive ones after, whatever their names: `health()` chains
/// the two maps instead of ordering the entries by name, so a dashboard or a test that reads
/// the report in name order sees `payment` before `inventory`.
#[test]
fn health_lists_bulkheads_of_both_kinds_in_name_order() {
    let registry = Registry::from_toml_str(
        "[rate_limiters.b]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\nkey = \"global\"\n\
         [rate_limiters.a]\nlimit_for_period = 1\nlimit_refresh_period = \"1s\"\nkey = \"global\"\n\
         [bulkheads.payment]\nmax_concurrent_calls = 2\n\
         [adaptive_bulkheads.inventory]\n",
    )
    .unwrap();
    let health = registry.health();
    let limiters: Vec<_> = health
        .rate_limiters
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(limiters, ["a", "b"], "rate limiters are by name");
    let bulkheads: Vec<_> = health.bulkheads.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(
        bulkheads,
        ["inventory", "payment"],
        "bulkheads should be by name too"
    );
}
