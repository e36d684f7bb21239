//! "An answer that advertises several quotas holds calls by each of them: a call starts only
//! when every one lets it, and counts against each" (`outbound::pushback`). Quotas of two
//! dialects, the pacing of several, a probe given back, and an older answer's quota of a kind
//! not in force. Time is a `ManualClock`; nothing sleeps.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use http::Response;
use tokio::sync::oneshot;
use tower::{service_fn, Layer, ServiceExt};
use tower_bulwark::bulkhead::Bulkhead;
use tower_bulwark::clock::ManualClock;
use tower_bulwark::outbound::pushback::Pacing;
use tower_bulwark::outbound::{self, Pushback, PushedBack};
use tower_bulwark::{BoxError, BulkheadFull};

use super::dialects_support::{answer_str, call, make, S, TEN_MIN};
use super::hostile_support::on_manual_clock;
use crate::common::poll_once;

/// A spent `X-RateLimit` quota of a second and a `RateLimit` quota of two calls an hour: once
/// the second has passed, two calls go and the third waits for the hour (while only the most
/// restrictive quota was kept, every call went after the second).
#[test]
fn quotas_in_two_dialects_each_hold_calls() {
    let (pushback, clock) = make(TEN_MIN * 6);
    pushback.observe(&answer_str(
        200,
        &[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset-after", "1"),
            ("ratelimit", r#""day";r=2;t=3600"#),
        ],
    ));
    assert_eq!(call(&pushback), Err(S(1)));
    clock.advance(S(1));
    assert_eq!(call(&pushback), Ok(()));
    assert_eq!(call(&pushback), Ok(()));
    assert_eq!(call(&pushback), Err(S(3599)));
}

/// Under [`Pacing::Spread`], calls are spaced by the sparsest of the quotas: two a second and
/// six a minute space them ten seconds apart, not half a second.
#[test]
fn spread_calls_keep_the_spacing_of_every_quota() {
    let (pushback, clock) = on_manual_clock(Pushback::builder("attack").pacing(Pacing::Spread));
    pushback.observe(&answer_str(
        200,
        &[("ratelimit", r#""burst";r=2;t=1, "minute";r=6;t=60"#)],
    ));
    assert_eq!(call(&pushback), Ok(()));
    assert_eq!(call(&pushback), Err(S(10)));
    clock.advance(S(10));
    assert_eq!(call(&pushback), Ok(()));
}

/// A probe (a call that goes after `max_hold` because a quota gives nothing in any window)
/// that a full bulkhead below refuses gives back the call it took of the quota it was counted
/// against, and nothing to the quota it was not: the next call still waits for the next probe.
#[tokio::test]
async fn a_probe_refused_below_gives_back_only_to_the_quotas_it_took_from() {
    let (pushback, clock) = make(S(60));
    pushback.observe(&answer_str(
        200,
        &[
            ("ratelimit", r#""a";r=0;t=5, "b";r=3;t=50"#),
            ("ratelimit-policy", r#""a";q=0;w=5, "b";q=3;w=50"#),
        ],
    ));
    let bulkhead = Bulkhead::semaphore("partner", 1).build();
    let inner = service_fn(|gate: Option<oneshot::Receiver<()>>| async move {
        if let Some(gate) = gate {
            gate.await.ok();
        }
        Ok::<_, BoxError>(Response::new(()))
    });
    // The bulkhead's one slot, held by a call that does not go through the pushback.
    let (open, gate) = oneshot::channel();
    let mut holder = Box::pin(bulkhead.layer().layer(inner).oneshot(Some(gate)));
    assert!(poll_once(holder.as_mut()).is_pending());
    let client = pushback.layer().layer(bulkhead.layer().layer(inner));
    assert_eq!(pushback.held_for(), S(60), "held until the probe");
    clock.advance(S(60));
    let probe = client.clone().oneshot(None).await.unwrap_err();
    assert!(probe.is::<BulkheadFull>(), "the probe went: {probe}");
    let next = client.clone().oneshot(None).await.unwrap_err();
    assert!(
        next.is::<PushedBack>(),
        "the quota that gives nothing still holds: {next}"
    );
    assert_eq!(outbound::retry_after(&*next), Some(S(60)));
    open.send(()).unwrap();
    holder.await.unwrap();
}

/// Answers to two calls in flight arrive in the other order: the later call's answer is in
/// force (one call each ten seconds), and the earlier one's, which may have been written after
/// it, advertises a quota of another kind (five calls in 100 s). It is kept beside the quota
/// in force, not merged into it: calls go every ten seconds until the five are spent (merged,
/// the stricter of both fields, one call would have had to wait the whole 100 s).
#[test]
fn an_older_answers_quota_of_another_kind_holds_beside_the_quotas_in_force() {
    let (pushback, clock) = make(TEN_MIN);
    let [(older, mut older_call), (newer, mut newer_call)] = two_in_flight(&pushback);
    let respond = |tx: oneshot::Sender<_>, ratelimit: &str, policy: &str| {
        let fields = [("ratelimit", ratelimit), ("ratelimit-policy", policy)];
        tx.send(answer_str(200, &fields)).unwrap();
    };
    respond(newer, r#""a";r=1;t=10"#, r#""a";q=1;w=10"#);
    assert!(matches!(poll_once(newer_call.as_mut()), Poll::Ready(Ok(_))));
    respond(older, r#""c";r=5;t=100"#, r#""c";q=5;w=100"#);
    assert!(matches!(poll_once(older_call.as_mut()), Poll::Ready(Ok(_))));
    // The newer answer counted the older call, still in flight, against its one call.
    assert_eq!(call(&pushback), Err(S(10)));
    for second in [10, 20, 30, 40, 50] {
        clock.advance(S(10));
        assert_eq!(call(&pushback), Ok(()), "at {second} s");
        let wait = if second < 50 { S(10) } else { S(50) };
        assert_eq!(call(&pushback), Err(wait), "after the call at {second} s");
    }
}

/// Two calls in flight, each answered `"burst";r=0;t=1, "day";r=2;t=3600` (with no policy, so
/// both quotas are of one dialect and no refill): the answer read second tightens what the
/// first set, each quota the quota of its name. A second later the burst is over and the day
/// has one call left for this client (two, less the call in flight when the first answer came):
/// one call goes, and the next waits for the day's window (capped at `max_hold`, ten minutes).
/// (Matched by dialect and policy alone, the day tightened the burst's lane and stretched it to
/// the day's window: no call went for ten minutes; found by a review.)
#[test]
fn an_older_answers_quotas_tighten_the_quotas_of_their_names() {
    let (pushback, clock) = make(TEN_MIN);
    let [(first, mut first_call), (second, mut second_call)] = two_in_flight(&pushback);
    for (tx, call) in [(first, &mut first_call), (second, &mut second_call)] {
        let fields = [("ratelimit", r#""burst";r=0;t=1, "day";r=2;t=3600"#)];
        tx.send(answer_str(200, &fields)).unwrap();
        assert!(matches!(poll_once(call.as_mut()), Poll::Ready(Ok(_))));
    }
    assert_eq!(call(&pushback), Err(S(1)));
    clock.advance(S(1));
    assert_eq!(call(&pushback), Ok(()));
    assert_eq!(call(&pushback), Err(S(599)));
}

/// The same with two quotas of one name (a gateway's line and the origin's, both
/// `"default"`): each quota of the answer read second tightens the quota of that name whose
/// window ends nearest its own. Four calls go in the burst's second, the fifth waits for its end
/// (both tightened the burst's, and the fifth waited ten minutes; found by a review).
#[test]
fn an_older_answers_quotas_of_one_name_tighten_the_quota_nearest_their_window() {
    let (pushback, _clock) = make(TEN_MIN);
    let [(first, mut first_call), (second, mut second_call)] = two_in_flight(&pushback);
    let answers = [
        (
            first,
            &mut first_call,
            r#""default";r=5;t=1, "default";r=50;t=3600"#,
        ),
        (
            second,
            &mut second_call,
            r#""default";r=4;t=1, "default";r=49;t=3600"#,
        ),
    ];
    for (tx, call, ratelimit) in answers {
        tx.send(answer_str(200, &[("ratelimit", ratelimit)]))
            .unwrap();
        assert!(matches!(poll_once(call.as_mut()), Poll::Ready(Ok(_))));
    }
    for _ in 0..4 {
        assert_eq!(call(&pushback), Ok(()));
    }
    assert_eq!(call(&pushback), Err(S(1)));
}

/// A call through a pushback's layer, waiting at the dependency for the answer sent on its
/// sender.
pub(crate) type InFlight = (
    oneshot::Sender<Response<()>>,
    Pin<Box<dyn Future<Output = Result<Response<()>, BoxError>> + Send>>,
);

/// Two calls started through `pushback`'s layer, the older first, each waiting at the
/// dependency for its answer.
pub(crate) fn two_in_flight(pushback: &Pushback<ManualClock>) -> [InFlight; 2] {
    let client = pushback.layer().layer(service_fn(
        |answer: oneshot::Receiver<Response<()>>| async move { Ok::<_, BoxError>(answer.await?) },
    ));
    [(); 2].map(|()| {
        let (tx, rx) = oneshot::channel();
        let mut call: InFlight = (tx, Box::pin(client.clone().oneshot(rx)));
        assert!(poll_once(call.1.as_mut()).is_pending(), "a call was held");
        call
    })
}
