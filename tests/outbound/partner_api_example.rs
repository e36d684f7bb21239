//! `examples/partner_api.rs` with shorter phases: its figures are counted at the mock partner,
//! and the test holds them to what the example claims.

use std::time::Duration;

#[path = "../../examples/partner_api.rs"]
#[allow(dead_code)]
mod partner_api;

#[tokio::test(flavor = "current_thread")]
async fn pacing_by_headers_sends_no_429_and_no_call_arrives_before_retry_after() {
    let settings = partner_api::Settings {
        pacing: Duration::from_secs(3),
        hold: Duration::from_secs(1),
        after_hold: Duration::from_millis(1500),
        verbose: false,
        ..partner_api::Settings::default()
    };
    let outcome = partner_api::run(settings.clone()).await.unwrap();
    assert_eq!(outcome.pacing_refusals, 0, "{outcome:?}");
    assert_eq!(outcome.early_calls, 0, "{outcome:?}");
    assert!(
        outcome.refusals >= 1,
        "the forced 429 was sent: {outcome:?}"
    );
    assert_eq!(outcome.failed, 0, "{outcome:?}");
    // The tasks kept the partner busy: at least the windows of phase 1 that had passed in full,
    // and at most what every window, partial ones included, allows.
    let limit = usize::try_from(settings.limit).unwrap();
    assert!(outcome.calls >= 2 * limit, "{outcome:?}");
    assert!(outcome.calls - outcome.refusals <= 7 * limit, "{outcome:?}");
}
