//! A Redis limiter's settings refused by the Redis builder are errors at their field of the file
//! (they named the instance only), and a reload cannot bring what a build refuses. Found by a
//! blind attack; no Redis server is needed (the limiters connect lazily).

use tower_bulwark::config::Registry;
use tower_bulwark::Limiter;

const REDIS: &str = "[rate_limiters.a]\nlimit_for_period = 10\nlimit_refresh_period = \"1s\"\n\
                     store = \"redis\"\nredis_url = \"redis://127.0.0.1:1/\"\n";

/// `config`'s docs: "values out of range are errors that name the instance and the field, with
/// its line and column"; `redis_lease_max_share` is "at most the burst", `redis_timeout` and
/// `redis_lease_length` above zero, `redis_prefix` "without `{` or `}`". A quota that Redis's
/// scripts cannot count (a product of fields) is an error of the instance.
#[tokio::test]
async fn a_redis_setting_out_of_range_is_an_error_at_its_field() {
    for (extra, field, line) in [
        (
            "redis_leases = true\nredis_lease_max_share = 11",
            "redis_lease_max_share",
            7,
        ),
        (
            "redis_leases = true\nredis_lease_length = \"0s\"",
            "redis_lease_length",
            7,
        ),
        ("redis_timeout = \"0s\"", "redis_timeout", 6),
        ("redis_prefix = \"a{b\"", "redis_prefix", 6),
    ] {
        let text = format!("{REDIS}{extra}\n");
        let err = Registry::from_toml_str(&text).expect_err(&text);
        assert_eq!(err.path(), format!("rate_limiters.a.{field}"), "{err}");
        // At the value, after `field = `.
        assert_eq!(err.position(), Some((line, field.len() + 4)), "{err}");
    }
    let text = REDIS.replace("\"1s\"", "\"1152921504606846976ns\"");
    let err = Registry::from_toml_str(&text).expect_err(&text);
    assert_eq!(err.path(), "rate_limiters.a", "{err}");
    assert!(
        err.message().contains("too long for the redis store"),
        "{err}"
    );
}

/// `Registry::reload_toml_str`'s errors: "A file that cannot be read, one `from_toml_str`
/// refuses, ... : the error changes nothing". A burst lowered below the file's
/// `redis_lease_max_share` is refused at that field, as a build refuses it (the reload applied
/// it, and the running registry held a file it could not be rebuilt from).
#[tokio::test]
async fn a_reload_refuses_a_burst_below_the_lease_max_share_as_a_build_does() {
    let text = format!("{REDIS}redis_leases = true\nredis_lease_max_share = 10\n");
    let registry = Registry::from_toml_str(&text).unwrap();
    let next = text.replace("limit_for_period = 10", "limit_for_period = 5");
    let built = Registry::from_toml_str(&next).expect_err(&next);
    let reloaded = registry.reload_toml_str(&next).expect_err(&next);
    assert_eq!(reloaded.path(), built.path());
    assert_eq!(reloaded.path(), "rate_limiters.a.redis_lease_max_share");
    assert_eq!(registry.rate_limiter("a").unwrap().quota().permits(), 10);
}
