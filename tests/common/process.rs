//! What the tests of one binary share because it belongs to the process: the panic hook, the
//! `tracing` dispatcher and the cores. Each is installed once and serves every test that asks.
//! With them, what a test's own `tracing` subscriber on its thread saw: the text a DEBUG one
//! writes ([`debug_events`]), or the events of one target ([`TargetEvents`]).

use std::sync::{Arc, Mutex, Once, PoisonError};

/// Keeps the panics a test plans, those whose message starts with `prefix`, out of the test
/// output; any other panic is still reported. One hook serves every prefix of the binary.
pub fn quiet_panics_starting_with(prefix: &'static str) {
    static PREFIXES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    static HOOK: Once = Once::new();
    let mut prefixes = PREFIXES.lock().unwrap_or_else(PoisonError::into_inner);
    if !prefixes.contains(&prefix) {
        prefixes.push(prefix);
    }
    drop(prefixes);
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            let prefixes = PREFIXES.lock().unwrap_or_else(PoisonError::into_inner);
            let planned = message.is_some_and(|m| prefixes.iter().any(|p| m.starts_with(p)));
            drop(prefixes);
            if !planned {
                default(info);
            }
        }));
    });
}

/// Sends this thread's `tracing` events to `subscriber` until the guard drops, whatever the
/// binary's other tests do on their threads.
///
/// `tracing` caches per call site whether anyone listens. While a thread's own subscriber is the
/// only one registered, `tracing` asks only the registering thread's subscriber, so a call site
/// first reached by a test on another thread is cached as unheard for every thread. A global
/// subscriber that takes nothing, installed once, makes it ask every registered subscriber,
/// this one included; the cache is then rebuilt for the call sites already reached.
pub fn thread_subscriber(
    subscriber: impl tracing::Subscriber + Send + Sync + 'static,
) -> tracing::subscriber::DefaultGuard {
    static GLOBAL: Once = Once::new();
    GLOBAL.call_once(|| {
        tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default())
            .expect("no other global subscriber in a test binary");
    });
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    guard
}

/// Tests that keep both cores busy for a while (storms of calls, the adaptive example) take this
/// in turn: their assertions rely on calls being scheduled in time (an adaptive limit must see
/// healthy answers to rise), which one of them running beside another on two cores can starve:
/// the tests of one binary run side by side in one process.
pub static BOTH_CORES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Collects what a `tracing` subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a DEBUG subscriber on this thread writes while `run` runs.
pub fn debug_events(run: impl FnOnce()) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    {
        let _guard = thread_subscriber(subscriber);
        run();
    }
    let text = captured.0.lock().unwrap().clone();
    String::from_utf8(text).unwrap()
}

/// The lines of `text` (what [`debug_events`] captured) that contain `needle`.
pub fn lines_with<'a>(text: &'a str, needle: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.contains(needle)).collect()
}

/// Asserts that `needle` stands in `text` exactly once.
pub fn assert_once(text: &str, needle: &str) {
    assert_eq!(text.matches(needle).count(), 1, "{needle:?} once in {text}");
}

/// The events of one `tracing` target that a test's own subscriber saw (install it with
/// [`thread_subscriber`]): each its level and its fields, ` name=value` each.
#[derive(Clone)]
pub struct TargetEvents {
    target: &'static str,
    seen: Arc<Mutex<Vec<(tracing::Level, String)>>>,
}

impl TargetEvents {
    /// A subscriber to the events of `target`, none seen yet.
    pub fn new(target: &'static str) -> Self {
        let seen = Arc::default();
        Self { target, seen }
    }

    /// The events seen so far, in order.
    pub fn seen(&self) -> Vec<(tracing::Level, String)> {
        self.seen.lock().unwrap().clone()
    }

    /// How many of the events seen so far are `WARN` events.
    pub fn warns(&self) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(level, _)| *level == tracing::Level::WARN)
            .count()
    }

    /// How many of the events seen so far have fields that contain `what`.
    pub fn count(&self, what: &str) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(_, fields)| fields.contains(what))
            .count()
    }
}

/// Writes each field of an event as ` name=value`.
struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
}

impl tracing::Subscriber for TargetEvents {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == self.target
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = String::new();
        event.record(&mut Fields(&mut fields));
        let level = *event.metadata().level();
        self.seen.lock().unwrap().push((level, fields));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
