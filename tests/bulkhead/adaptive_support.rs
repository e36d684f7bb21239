//! What the adaptive bulkhead's tests share: limits and spans, a gated inner service, a log of
//! the limit's changes, and an algorithm that records its samples.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tower::{service_fn, Service};
use tower_bulwark::bulkhead::adaptive::{
    AdaptiveBulkhead, AdaptiveBulkheadBuilder, LimitAlgorithm, LimitChanged, Limits, Sample,
};
use tower_bulwark::bulkhead::{BulkheadFull, CallFinished, CallOutcome};
use tower_bulwark::clock::ManualClock;
use tower_bulwark::BoxError;

use crate::common::response;

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn limits(min: usize, initial: usize, max: usize) -> Limits {
    Limits::new(min, initial, max).expect("valid limits")
}

/// A builder of the adaptive bulkhead `name` within `limits` on a new `ManualClock`, and the
/// clock.
pub fn on_manual_clock(name: &str, limits: Limits) -> (AdaptiveBulkheadBuilder, ManualClock) {
    let clock = ManualClock::new();
    let builder = AdaptiveBulkhead::builder(name)
        .limits(limits)
        .clock(clock.clone());
    (builder, clock)
}

/// An inner service whose calls end when the test sends them a status (or drops the sender).
pub fn gated() -> impl Service<
    oneshot::Receiver<u16>,
    Response = http::Response<()>,
    Error = BoxError,
    Future = impl Future<Output = Result<http::Response<()>, BoxError>> + Send,
> + Clone {
    service_fn(|gate: oneshot::Receiver<u16>| async move {
        let status = gate.await.map_err(|_| BoxError::from("gate dropped"))?;
        Ok::<_, BoxError>(response(status, &[]))
    })
}

/// `n` calls through `client`, none of them ended: each with the sender of the status that ends
/// it, in the order they were made.
pub fn gated_calls<S>(client: &mut S, n: usize) -> Vec<(oneshot::Sender<u16>, S::Future)>
where
    S: Service<oneshot::Receiver<u16>>,
{
    (0..n)
        .map(|_| {
            let (tx, rx) = oneshot::channel::<u16>();
            (tx, client.call(rx))
        })
        .collect()
}

/// Ends each of `calls` (of [`gated_calls`]) with `status`, in order, and waits for its answer,
/// which must be a response.
pub async fn end_all<F, R, E>(calls: Vec<(oneshot::Sender<u16>, F)>, status: u16)
where
    F: Future<Output = Result<R, E>>,
    E: std::fmt::Debug,
{
    for (tx, call) in calls {
        tx.send(status).unwrap();
        call.await.unwrap();
    }
}

/// Asserts that one more call through `client` is refused with `BulkheadFull`.
pub async fn assert_full<S>(client: &mut S)
where
    S: Service<oneshot::Receiver<u16>, Error = BoxError>,
    S::Response: std::fmt::Debug,
{
    let (_tx, rx) = oneshot::channel();
    assert!(client.call(rx).await.unwrap_err().is::<BulkheadFull>());
}

/// One round trip of 10 ms on `clock`: a call through `client` that ends with `status` (the
/// tests that make one need `metrics` or `reqwest`).
#[cfg(any(feature = "metrics", feature = "reqwest"))]
pub async fn round_trip<S>(client: &mut S, clock: &ManualClock, status: u16)
where
    S: Service<oneshot::Receiver<u16>>,
    S::Error: std::fmt::Debug,
{
    let (tx, rx) = oneshot::channel();
    let call = client.call(rx);
    clock.advance(ms(10));
    tx.send(status).unwrap();
    call.await.unwrap();
}

/// A call through `client` polled once (it waits for its gate), then dropped `after` later on
/// `clock`: a call cancelled by a timeout above the bulkhead.
pub async fn cancelled_after<S>(client: &mut S, clock: &ManualClock, after: Duration)
where
    S: Service<oneshot::Receiver<u16>>,
    S::Error: std::fmt::Debug,
{
    use tower::ServiceExt;
    let (_gate, rx) = oneshot::channel();
    let mut call = Box::pin(client.ready().await.unwrap().call(rx));
    assert!(crate::common::poll_once(call.as_mut()).is_pending());
    clock.advance(after);
    drop(call);
}

/// A round at the limit of `bulkhead`: as many calls through `client` as the limit, one more
/// refused with `BulkheadFull`, then, 10 ms later on `clock`, all of them ended with `status`.
pub async fn round_at_the_limit<S>(
    bulkhead: &AdaptiveBulkhead,
    client: &mut S,
    clock: &ManualClock,
    status: u16,
) where
    S: Service<oneshot::Receiver<u16>, Error = BoxError>,
    S::Response: std::fmt::Debug,
{
    let calls = gated_calls(client, bulkhead.limit());
    assert_full(client).await;
    clock.advance(ms(10));
    end_all(calls, status).await;
}

/// Each change of the limit, as (from, to).
pub type ChangeLog = Arc<Mutex<Vec<(usize, usize)>>>;

/// Builds the bulkhead with a hook that logs each change of the limit.
pub fn with_changes(builder: AdaptiveBulkheadBuilder) -> (AdaptiveBulkhead, ChangeLog) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let bulkhead = builder
        .on_limit_changed(move |e: &LimitChanged<'_>| log.lock().unwrap().push((e.from, e.to)))
        .build();
    (bulkhead, seen)
}

/// The bulkhead `builder` builds, with its changes logged by [`with_changes`], the log, and a
/// client of [`gated`] calls through it.
pub fn gated_client(
    builder: AdaptiveBulkheadBuilder,
) -> (
    AdaptiveBulkhead,
    ChangeLog,
    impl Service<oneshot::Receiver<u16>, Response = http::Response<()>, Error = BoxError>,
) {
    let (bulkhead, changes) = with_changes(builder);
    let client = tower::ServiceBuilder::new()
        .layer(bulkhead.layer())
        .service(gated());
    (bulkhead, changes, client)
}

/// The outcome of each call as it finished.
pub type Outcomes = Arc<Mutex<Vec<CallOutcome>>>;

/// A builder of the adaptive bulkhead `name` whose algorithm is a new [`Recorder`] (it records
/// its samples and never moves the limit), and the recorder.
pub fn with_recorder(name: &str) -> (AdaptiveBulkheadBuilder, Recorder) {
    let recorder = Recorder::default();
    let builder = AdaptiveBulkhead::builder(name).algorithm(recorder.clone());
    (builder, recorder)
}

/// The adaptive bulkhead `name` whose algorithm records its samples and never moves the limit,
/// and whose hook logs each call's outcome as it finishes: the bulkhead, the recorder and the
/// outcomes.
pub fn recording(name: &str) -> (AdaptiveBulkhead, Recorder, Outcomes) {
    let (builder, recorder) = with_recorder(name);
    let finished = Outcomes::default();
    let log = finished.clone();
    let bulkhead = builder
        .hooks(|events| {
            events.on_call_finished(move |e: &CallFinished<'_>| log.lock().unwrap().push(e.outcome))
        })
        .build();
    (bulkhead, recorder, finished)
}

/// Asserts that the `n` calls through a bulkhead of [`recording`] (limit 8) all panicked and
/// were no sample, and that each gave its permit back: every permit is free, `n` finished.
pub fn assert_panics_were_no_samples(
    bulkhead: &AdaptiveBulkhead,
    recorder: &Recorder,
    finished: &Outcomes,
    n: usize,
) {
    assert!(
        recorder.0.lock().unwrap().is_empty(),
        "a panic gave a sample: {:?}",
        recorder.0.lock().unwrap()
    );
    assert_eq!(*finished.lock().unwrap(), vec![CallOutcome::Panicked; n]);
    let snapshot = bulkhead.snapshot();
    assert_eq!(snapshot.available_concurrent_calls, 8);
    assert_eq!(snapshot.total_finished, n as u64);
}

/// An algorithm that records what it is given and never moves the limit.
#[derive(Clone, Default)]
pub struct Recorder(pub Arc<Mutex<Vec<Sample>>>);

impl LimitAlgorithm for Recorder {
    fn update(&mut self, sample: &Sample, _: &Limits) -> usize {
        self.0.lock().unwrap().push(*sample);
        sample.limit
    }
}

impl Recorder {
    /// Each sample's overload verdict.
    pub fn verdicts(&self) -> Vec<bool> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.overloaded)
            .collect()
    }
}
