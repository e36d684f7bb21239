//! How exactly each algorithm takes back an admission vetoed by another policy or not counted:
//! GCRA admissions (one or two of the same request on one key, with time passing) leave the key
//! as a twin that never saw the request; a fixed-window reservation straddling two cycles stays
//! spent, never granted twice.

use crate::common::waits_up_to;
use std::time::Duration;

use http::StatusCode;
use tower_bulwark::head::RequestHead;
use tower_bulwark::rate_limit::RateLimitLayer;
use tower_bulwark::{algorithm::FixedWindow, clock::ManualClock, KeyedRateLimiter, Limiter, Quota};

use super::accounting::{body_json, call, gcra, log, policy, req, svc, Acct, Inner, Mode};
use crate::support::violated;

/// Promise (guide, GCRA refunds): "exact while the refunded admission is still the key's
/// latest ... the TAT goes back by the cost": a GCRA admission vetoed by a policy that decides
/// later, while time passes, leaves the key as a twin that never saw the request.
#[test]
fn a_gcra_admission_vetoed_while_time_passes_is_given_back_exactly() {
    let clock = ManualClock::new();
    let quota = Quota::per_second(2).unwrap().with_burst(4).unwrap();
    let vetoed = gcra(quota, clock.clone(), Mode::Now);
    let twin = gcra(quota, clock.clone(), Mode::Now);
    let veto = log(1, &clock, Mode::Later(2)).ticking(&clock, Duration::from_millis(120));
    let service = svc(
        RateLimitLayer::new(policy(0, &vetoed).and(policy(1, &veto))),
        &Inner::default(),
    );
    let key = "k".to_owned();
    assert!(twin.inner.reserve_now(&key, 1).unwrap().unwrap().allowed);
    assert_eq!(call(&service, req(&[])).unwrap().status(), StatusCode::OK);
    for _ in 0..3 {
        let refused = call(&service, req(&[])).unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            vetoed.probe("k"),
            twin.probe("k"),
            "at {:?}",
            clock.elapsed()
        );
        assert_eq!(
            vetoed.full_in("k"),
            twin.full_in("k"),
            "at {:?}",
            clock.elapsed()
        );
    }
    assert_eq!(vetoed.net("k"), 1);
}

/// Promise (module docs): a refused request "spends nothing (a GCRA policy keeps spent only what
/// the key's state cannot place: the time elapsed since, when other requests were admitted
/// meanwhile, ...)". Two policies of one request on one GCRA limiter and key (1 and 5 permits),
/// vetoed by a third that decides while 30 ms pass, with no other request on the key: a GCRA
/// refund is exact only for the key's latest admission, so the two must be given back newest
/// first. In the other order, the older one would pass for another request's and lose the
/// elapsed time, then the younger one too, leaving the key 30 ms (of a 100 ms permit) short of
/// a twin that never saw the request, after every refusal.
#[test]
fn two_admissions_of_one_request_on_one_gcra_key_are_given_back_exactly() {
    let clock = ManualClock::new();
    let quota = Quota::per_second(10).unwrap();
    let make = || gcra(quota, clock.clone(), Mode::Now);
    let shared = make();
    let twin = make();
    let veto = log(1, &clock, Mode::Later(1)).ticking(&clock, Duration::from_millis(30));
    let key = "k".to_owned();
    assert!(veto.inner.reserve_now(&key, 1).unwrap().unwrap().allowed);
    let service = svc(
        RateLimitLayer::new(vec![
            policy(0, &shared),
            policy(1, &shared).cost(5),
            policy(2, &veto),
        ]),
        &Inner::default(),
    );
    for i in 0..3 {
        let refused = call(&service, req(&[])).unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(violated(&body_json(refused)), ["p2"]);
        assert_eq!(shared.net("k"), 0);
        assert_eq!(
            shared.full_in("k"),
            twin.full_in("k"),
            "refusal {i}: the shared key is whole again later than a key that never saw it"
        );
    }
}

/// Promise: count_if "gives others their permit back": two count_if policies of one request on
/// one GCRA key (1 and 5 permits), with time passing between the admissions and the response
/// (a later policy that decides while the clock moves), and no other request on the key: the
/// response that counts for neither leaves the key exactly as a twin that never saw it: as in
/// `two_admissions_of_one_request_on_one_gcra_key_are_given_back_exactly`, the settlement must
/// give back the newest admission first.
#[test]
fn two_count_if_admissions_on_one_gcra_key_are_given_back_exactly() {
    let clock = ManualClock::new();
    let make = || gcra(Quota::per_second(10).unwrap(), clock.clone(), Mode::Now);
    let shared = make();
    let twin = make();
    let slow = log(1000, &clock, Mode::Later(1)).ticking(&clock, Duration::from_millis(30));
    let service = svc(
        RateLimitLayer::new(vec![
            policy(0, &shared).count_if(|r| r.status != StatusCode::OK),
            policy(1, &shared)
                .cost(5)
                .count_if(|r| r.status == StatusCode::UNAUTHORIZED),
            policy(2, &slow),
        ]),
        &Inner::default(),
    );
    let key = "k".to_owned();
    assert!(twin.inner.reserve_now(&key, 1).unwrap().unwrap().allowed);
    let r = call(&service, req(&[("x-status", "500")])).unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(shared.net("k"), 1);
    for i in 0..4 {
        let r = call(&service, req(&[])).unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(shared.net("k"), 1);
        assert_eq!(
            shared.full_in("k"),
            twin.full_in("k"),
            "response {i}: the key kept part of a request that never counted"
        );
    }
}

/// Documented limit (README, module docs and the guide's refund table): a fixed-window
/// reservation that straddles two cycles (one permit left in this cycle, one of the next) and is
/// vetoed by another policy stays spent: the window cannot tell which cycle's count to lower
/// without per-cycle counts. What the test holds is the direction: permits stay spent, never
/// over-granted (the next cycle's permit is not handed out twice).
#[test]
fn a_vetoed_fixed_window_reservation_straddling_two_cycles_stays_spent() {
    let clock = ManualClock::new();
    let quota = waits_up_to(Quota::per_second(2).unwrap(), Duration::from_secs(2));
    let window = Acct::new(
        KeyedRateLimiter::<String>::builder(quota)
            .algorithm::<FixedWindow>()
            .clock(clock.clone())
            .build(),
        Mode::Now,
    );
    let veto = log(1, &clock, Mode::Now);
    let header_cost = |name: &'static str| {
        move |p: &RequestHead| {
            p.headers
                .get(name)
                .map_or(0, |v| v.to_str().unwrap().parse().unwrap())
        }
    };
    let service = svc(
        RateLimitLayer::new(
            policy(0, &window)
                .cost_by(header_cost("x-window"))
                .and(policy(1, &veto).cost_by(header_cost("x-veto"))),
        ),
        &Inner::default(),
    );
    let ok = call(&service, req(&[("x-window", "1"), ("x-veto", "1")])).unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(window.probe("k"), 1, "one permit left in this cycle");
    let refused = call(&service, req(&[("x-window", "2"), ("x-veto", "1")])).unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(violated(&body_json(refused)), ["p1"]);
    assert_eq!(
        window.probe("k"),
        0,
        "the straddling reservation stays spent (documented)"
    );
    // The next cycle admits its two permits less the one the vetoed reservation held: never more.
    clock.advance(Duration::from_secs(1));
    assert_eq!(window.probe("k"), 1);
}
