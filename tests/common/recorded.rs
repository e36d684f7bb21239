//! What a test's own `metrics` recorder saw (feature `metrics`): every series by kind, name and
//! labels, and a runtime to record under.

use std::future::Future;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

/// Every series of a snapshot as (kind, name, labels sorted, value).
pub type Series = Vec<(MetricKind, String, Vec<(String, String)>, DebugValue)>;

/// Every series `snapshotter` holds now; a counter's value is what it counted since the last
/// snapshot.
pub fn series(snapshotter: &Snapshotter) -> Series {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let mut labels: Vec<_> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            (key.kind(), key.key().name().to_owned(), labels, value)
        })
        .collect()
}

/// The value of the series `name` of `kind` with exactly `labels`, in any order.
pub fn find<'a>(
    all: &'a Series,
    kind: MetricKind,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<&'a DebugValue> {
    let mut want: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    want.sort();
    all.iter()
        .find(|(k, n, l, _)| *k == kind && n == name && *l == want)
        .map(|(_, _, _, v)| v)
}

/// The counter `name` with exactly `labels`: zero if it counted nothing.
pub fn counter(all: &Series, name: &str, labels: &[(&str, &str)]) -> u64 {
    match find(all, MetricKind::Counter, name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        other => panic!("{name} {labels:?}: {other:?}"),
    }
}

/// The counters `name` of the instance `instance` told apart by the one further label `label`:
/// for a value of it (an outcome, a kind, a reason), that counter, zero if it counted nothing.
pub fn counter_by<'a>(
    all: &'a Series,
    name: &'a str,
    instance: &'a str,
    label: &'a str,
) -> impl Fn(&str) -> u64 + 'a {
    move |value| counter(all, name, &[("name", instance), (label, value)])
}

/// The gauge `name` with exactly `labels`; a panic if there is none.
pub fn gauge(all: &Series, name: &str, labels: &[(&str, &str)]) -> f64 {
    match find(all, MetricKind::Gauge, name, labels) {
        Some(DebugValue::Gauge(v)) => v.into_inner(),
        other => panic!("{name} {labels:?}: {other:?}"),
    }
}

/// Every series `run` recorded, on a recorder of its own installed on this thread while it runs.
pub fn recorded_by(run: impl FnOnce()) -> Series {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, run);
    series(&recorder.snapshotter())
}

/// Runs `test` on `runtime` with a recorder of its own installed on this thread, which the
/// test reads through the snapshotter it is given; returns what the test returned and every
/// series as the recorder has them at its end (a counter: what it counted since the test's
/// last snapshot).
pub fn on_own_recorder<T, F: Future<Output = T>>(
    runtime: &tokio::runtime::Runtime,
    test: impl FnOnce(Snapshotter) -> F,
) -> (T, Series) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let done =
        metrics::with_local_recorder(&recorder, || runtime.block_on(test(snapshotter.clone())));
    (done, series(&snapshotter))
}

/// A current-thread runtime whose clock runs.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `each(t)` for every `t` in `0..threads` on as many OS threads, released together once
/// each has `recorder` installed as its own: what each returned, in order (a panic in one
/// fails the test).
pub fn on_racing_threads<R, T>(
    threads: usize,
    recorder: &std::sync::Arc<R>,
    each: impl Fn(usize) -> T + Send + Sync + Clone + 'static,
) -> Vec<T>
where
    R: metrics::Recorder + Send + Sync + 'static,
    T: Send + 'static,
{
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads));
    let threads: Vec<_> = (0..threads)
        .map(|t| {
            let (barrier, recorder, each) = (barrier.clone(), recorder.clone(), each.clone());
            std::thread::spawn(move || {
                metrics::with_local_recorder(&*recorder, || {
                    barrier.wait();
                    each(t)
                })
            })
        })
        .collect();
    crate::common::joined(threads)
}
