//! The decision on one request, made the same way for one policy and for many, by the service's
//! `call` and, where a limiter needs I/O or a permit falls due later, by its response future: ask
//! each policy in turn, record its [`Outcome`], conclude, and settle after the response.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use smallvec::SmallVec;

use super::headers::{policy_header, AdmittedHeaders};
use super::key::KeyError;
use super::policy::Settle;
use super::problem::problem_response;
use super::refusal::Refusal;
use super::set::{PolicyAnswer, PolicySet, QuotaOf, RefundOrSettle, SettleTo};
use super::settings::{FailMode, Limits};
use crate::body_end::Reads;
use crate::decision::{Decision, InsufficientCapacity};
use crate::head::RequestHead;
use crate::limiter::BoxReserve;
use crate::usage::AnswerScan;
use crate::BoxError;

/// What one policy said about one request.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Admitted, holding a permit (possibly one that falls due after `wait`).
    Admitted(Decision),
    /// Refused (for a shadow policy: would have been).
    Refused(Decision),
    /// The request costs more than the policy can ever admit at once.
    Unadmittable(InsufficientCapacity),
    /// The limiter failed and the layer fails open: no decision.
    Failed,
    /// The policy sat the request out: a cost of zero, or no key and the layer lets such
    /// requests through.
    Skipped,
}

impl Outcome {
    /// The policy's decision, if it made one.
    pub(crate) fn decision(&self) -> Option<&Decision> {
        match self {
            Outcome::Admitted(d) | Outcome::Refused(d) => Some(d),
            _ => None,
        }
    }

    /// Whether the policy refused the request: now, or for a cost it can never admit.
    pub(crate) fn refused(&self) -> bool {
        matches!(self, Outcome::Refused(_) | Outcome::Unadmittable(_))
    }
}

/// The outcomes of a request's policies so far, one per policy asked, in order. Up to four
/// live on the stack: most layers have one to three policies.
type Outcomes = SmallVec<[Outcome; 4]>;

/// Where the decision on a request stands.
pub(crate) enum Progress {
    /// A policy whose limiter needs I/O is deciding: [`Ledger::resume`] with what this future
    /// gives.
    Reserve(BoxReserve),
    /// Every policy admitted; the last permit falls due after this wait.
    Wait(Duration),
    /// Every policy admitted, now.
    Admit,
    /// The layer answers (a refusal, or a request it cannot judge); every permit granted has
    /// been given back. Boxed, so that the other steps, the common ones, are small to move.
    Answer(Box<Response<Bytes>>),
}

/// What a request holds while it is decided: each policy's key and cost, and each outcome so
/// far. Dropped before it is [admitted](Self::admit) (a refusal, the client went away, a key
/// extractor or a hook panicked), it gives every permit it holds back.
pub(crate) struct Ledger<P: PolicySet> {
    limits: Arc<Limits<P>>,
    keys: P::Keys,
    outcomes: Outcomes,
}

impl<P: PolicySet> Ledger<P> {
    /// A ledger for a new request under `limits`.
    pub(crate) fn new(limits: Arc<Limits<P>>) -> Self {
        Self {
            limits,
            keys: P::Keys::default(),
            outcomes: Outcomes::new(),
        }
    }

    /// Asks every policy not asked yet, in order, as far as they answer at once.
    pub(crate) fn decide(&mut self, head: &RequestHead<'_>) -> Progress {
        loop {
            let i = self.outcomes.len();
            let policies = &*self.limits.policies;
            if i == policies.count() {
                return self.conclude(head);
            }
            let answer = match policies.ask(i, head, &mut self.keys) {
                PolicyAnswer::Free => {
                    self.outcomes.push(Outcome::Skipped);
                    None
                }
                PolicyAnswer::Now(result) => self.record(result, head),
                PolicyAnswer::Later(reserve) => return Progress::Reserve(reserve),
                PolicyAnswer::NoKey(error) => self.key_error(&error, head),
            };
            if let Some(answer) = answer {
                return Progress::Answer(Box::new(answer));
            }
        }
    }

    /// Records `result`, the decision of the policy whose limiter needed I/O, and decides on.
    pub(crate) fn resume(
        &mut self,
        result: Result<Decision, BoxError>,
        head: &RequestHead<'_>,
    ) -> Progress {
        match self.record(result, head) {
            Some(answer) => Progress::Answer(Box::new(answer)),
            None => self.decide(head),
        }
    }

    /// Records the answer of the policy being asked. Returns the response to send at once when
    /// its limiter failed and the layer fails closed (having given back what the other policies
    /// granted).
    fn record(
        &mut self,
        result: Result<Decision, BoxError>,
        head: &RequestHead<'_>,
    ) -> Option<Response<Bytes>> {
        match result {
            Ok(decision) if decision.allowed => self.outcomes.push(Outcome::Admitted(decision)),
            Ok(decision) => {
                let info = &self.limits.settings.policies[self.outcomes.len()];
                if !info.enforced() {
                    info.would_have_refused(&decision);
                }
                self.outcomes.push(Outcome::Refused(decision));
            }
            Err(error) => return self.limiter_error(&error, head),
        }
        None
    }

    /// Records that the limiter of the policy being asked failed (or was asked for more than it
    /// can ever admit at once). Returns the response to send at once when the layer fails closed.
    fn limiter_error(
        &mut self,
        error: &BoxError,
        head: &RequestHead<'_>,
    ) -> Option<Response<Bytes>> {
        let settings = &self.limits.settings;
        let info = &settings.policies[self.outcomes.len()];
        if let Some(too_costly) = error.downcast_ref::<InsufficientCapacity>() {
            if !info.enforced() {
                tracing::info!(
                    policy = &*info.name,
                    "rate limit (shadow): the request costs more than the policy can ever admit; \
                     letting it through"
                );
            }
            self.outcomes.push(Outcome::Unadmittable(*too_costly));
            return None;
        }
        let open = !info.enforced() || settings.limiter_error_mode == FailMode::Open;
        let action = if open {
            "letting the request through"
        } else {
            "answering 503"
        };
        tracing::warn!(policy = &*info.name, %error, "rate limit: the limiter failed; {action}");
        if open {
            self.outcomes.push(Outcome::Failed);
            return None;
        }
        self.refund_all();
        Some(error_answer(
            head,
            StatusCode::SERVICE_UNAVAILABLE,
            "The rate limiter is unavailable; retry later.",
        ))
    }

    /// Records that the policy being asked found no key for the request. Returns the response to
    /// send at once when the layer fails closed (having given back what the other policies
    /// granted); otherwise the policy sits the request out.
    fn key_error(&mut self, error: &KeyError, head: &RequestHead<'_>) -> Option<Response<Bytes>> {
        let mode = self.limits.settings.key_error_mode;
        let policy = &*self.limits.settings.policies[self.outcomes.len()].name;
        let action = match mode {
            FailMode::Open => "letting the request through without it",
            FailMode::Closed => "answering with an error",
        };
        let reason = error.reason();
        // A server-side reason names server internals: it is in the log, not in the answer.
        let detail = if error.status().is_server_error() {
            tracing::error!(
                policy,
                reason,
                "rate limit: no key for the request; {action}"
            );
            "The server could not identify the client for rate limiting."
        } else {
            tracing::debug!(
                policy,
                reason,
                "rate limit: no key for the request; {action}"
            );
            reason
        };
        if mode == FailMode::Open {
            self.outcomes.push(Outcome::Skipped);
            return None;
        }
        self.refund_all();
        Some(error_answer(head, error.status(), detail))
    }

    /// What the outcomes come to, once every policy has been asked. A refusal gives every
    /// permit back.
    fn conclude(&mut self, head: &RequestHead<'_>) -> Progress {
        let mut wait = Duration::ZERO;
        let mut refused = false;
        let policies = self.limits.settings.policies.iter();
        for (_, outcome) in policies.zip(&self.outcomes).filter(|(p, _)| p.enforced()) {
            if let Outcome::Admitted(d) = outcome {
                wait = wait.max(d.wait);
            }
            refused |= outcome.refused();
        }
        if refused {
            // Every permit goes back before the refusal is built, so that the hook sees them
            // given back and a hook that panics leaks nothing.
            let outcomes = self.refund_all();
            let limits = &*self.limits;
            let refusal = Refusal {
                settings: &limits.settings,
                request: *head,
                outcomes: &outcomes,
                policy_header: policy_header(&limits.settings, &outcomes, |i| {
                    limits.policies.visit(i, &self.keys, QuotaOf)
                }),
            };
            Progress::Answer(Box::new(refusal.respond()))
        } else if wait.is_zero() {
            Progress::Admit
        } else {
            Progress::Wait(wait)
        }
    }

    /// Hands the request over to the inner service: the permits now belong to it. Returns the
    /// rate-limit headers of its response, and what is left to settle once the response is
    /// known (the admissions of policies that count by outcome), if anything.
    pub(crate) fn admit(&mut self) -> (Option<AdmittedHeaders>, Option<Box<Settlement<P>>>) {
        let limits = &*self.limits;
        let headers = AdmittedHeaders::new(&limits.settings, &self.outcomes, |i| {
            limits.policies.visit(i, &self.keys, QuotaOf)
        });
        // A policy that settles, or an admission that holds its estimate or its slots until the
        // request ends.
        let settles = (limits.settings.policies.iter().zip(&self.outcomes)).any(|(info, o)| {
            let settled = !matches!(info.settle, Settle::Never);
            matches!(o, Outcome::Admitted(d) if settled || d.holds_estimate() || d.holds_slots())
        });
        // Handed over: from here, dropping the ledger gives nothing back.
        let settlement = if settles {
            // The holds go back whenever the request ends, with an answer or without: slots held
            // (a concurrency limiter's admissions, whichever policy it serves).
            let scans = (self.outcomes.iter().enumerate())
                .filter(|(_, o)| matches!(o, Outcome::Admitted(d) if d.holds_slots()))
                .map(|(policy, _)| BodyWait { policy, scan: None })
                .collect();
            Some(Box::new(Settlement {
                limits: Arc::clone(&self.limits),
                keys: std::mem::take(&mut self.keys),
                outcomes: std::mem::take(&mut self.outcomes),
                scans,
            }))
        } else {
            self.outcomes.clear();
            None
        };
        (headers, settlement)
    }

    /// Gives back every permit held, once: the outcomes are taken out first, so that a refund
    /// that panics cannot lead to a second one. The newest admission goes back first: two
    /// policies on one key and limiter each gave the request an admission, and each refund is
    /// exact while its admission is the key's latest.
    ///
    /// Returns the outcomes as they were, each admission replaced by what it told the client
    /// (a decision that gives nothing back: its permits went back here, once).
    fn refund_all(&mut self) -> Outcomes {
        let mut outcomes = std::mem::take(&mut self.outcomes);
        for (i, outcome) in outcomes.iter_mut().enumerate().rev() {
            if let Outcome::Admitted(decision) = outcome {
                let refund = RefundOrSettle(decision, SettleTo::Refund);
                self.limits.policies.visit(i, &self.keys, refund);
            }
        }
        outcomes
    }

    /// How many permits the ledger holds (one per admission).
    pub(crate) fn held(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Admitted(_)))
            .count()
    }
}

/// The layer's own answer of `status` with `detail` to `request`: a problem+json, or for a gRPC
/// call the gRPC status that means the same.
fn error_answer(request: &RequestHead<'_>, status: StatusCode, detail: &str) -> Response<Bytes> {
    #[cfg(feature = "grpc")]
    if super::grpc::is_grpc(request) {
        return super::grpc::error(status, detail);
    }
    let _ = request;
    problem_response(status, detail)
}

impl<P: PolicySet> Drop for Ledger<P> {
    fn drop(&mut self) {
        if !self.outcomes.is_empty() {
            self.refund_all();
        }
    }
}

/// The admissions of policies that settle after the response, kept until the response (or,
/// for policies that read their cost in the body, until the body ends) says what the request
/// cost. This is where whatever is known only from the response is settled. Dropped without a
/// response (the inner service failed, or the response future was dropped), every estimate
/// stands; dropped with a body half read, each body policy settles to what it read, if it read
/// its cost. An admission that holds its estimate until it is settled is settled, to its
/// estimate where nothing else was read, whatever ends the request.
pub(crate) struct Settlement<P: PolicySet> {
    limits: Arc<Limits<P>>,
    keys: P::Keys,
    outcomes: Outcomes,
    /// What waits for the body's end.
    scans: SmallVec<[BodyWait; 1]>,
}

/// A policy's admission waiting for the body's end: the reader of a policy that settles from
/// the body, or none for a concurrent policy's hold, given back whole whenever the request ends.
struct BodyWait {
    policy: usize,
    scan: Option<AnswerScan>,
}

impl<P: PolicySet> Settlement<P> {
    /// Settles the policies that read their cost in the response head, newest first, and brings
    /// `headers` (the rate-limit headers of this response) up to date with what changed. Returns
    /// what is left to settle when the body ends (the policies that read the body), if anything.
    ///
    /// A function that panics leaves the estimate standing (never over-granted), with an
    /// `error` log line; the other policies are settled all the same.
    pub(crate) fn apply(
        mut self: Box<Self>,
        response: &http::response::Parts,
        headers: &mut Option<AdmittedHeaders>,
    ) -> Option<Box<Self>> {
        let limits = Arc::clone(&self.limits);
        let mut changed = false;
        for i in (0..self.outcomes.len()).rev() {
            // Slots go back whole when the request ends, whatever the policy reads.
            if !matches!(&self.outcomes[i], Outcome::Admitted(d) if !d.holds_slots()) {
                continue;
            }
            let info = &limits.settings.policies[i];
            match &info.settle {
                Settle::Never => changed |= self.settle(i, None),
                Settle::Held => {}
                Settle::ByBody(usage) => self.scans.push(BodyWait {
                    policy: i,
                    scan: Some(usage.scan_answer(response.status, &response.headers)),
                }),
                Settle::ByHead(settled) => {
                    let cost = crate::usage::read_cost(&info.name, || settled(response));
                    changed |= self.settle(i, cost);
                }
            }
        }
        if changed && headers.is_some() {
            *headers = AdmittedHeaders::new(&limits.settings, &self.outcomes, |i| {
                limits.policies.visit(i, &self.keys, QuotaOf)
            });
        }
        (!self.scans.is_empty()).then_some(self)
    }

    /// Settles policy `i`'s admission to `cost` (`None`: the estimate stands, and for a policy
    /// that settles says so in a `debug` line). Returns whether the state the client is told
    /// changed.
    fn settle(&mut self, i: usize, cost: Option<u32>) -> bool {
        let limits = &*self.limits;
        let Outcome::Admitted(decision) = &mut self.outcomes[i] else {
            return false;
        };
        let Some(cost) = cost else {
            if !matches!(limits.settings.policies[i].settle, Settle::Never) {
                tracing::debug!(
                    policy = &*limits.settings.policies[i].name,
                    "rate limit: no cost could be read from the response; the cost asked for \
                     stands"
                );
            }
            if decision.holds_estimate() {
                let settle = RefundOrSettle(decision, SettleTo::Estimate);
                limits.policies.visit(i, &self.keys, settle);
            }
            return false;
        };
        let gcra = decision.charged().by_gcra();
        let settle = RefundOrSettle(decision, SettleTo::Cost(cost));
        let estimate = limits.policies.visit(i, &self.keys, settle);
        // The client is told the state as it is now: the difference is back, or spent.
        let quota = limits.policies.visit(i, &self.keys, QuotaOf);
        decision.settle_report(estimate, cost, &quota, gcra);
        cost != estimate
    }
}

impl<P: PolicySet> Reads for Settlement<P> {
    /// Reads `bytes`, the next of the response body, for the policies that settle from it.
    fn feed(&mut self, bytes: &[u8]) {
        for scan in self.scans.iter_mut().filter_map(|wait| wait.scan.as_mut()) {
            scan.feed(bytes);
        }
    }
}

impl<P: PolicySet> Drop for Settlement<P> {
    fn drop(&mut self) {
        for wait in std::mem::take(&mut self.scans) {
            // A hold goes back whole.
            let cost = wait.scan.map_or(Some(0), |scan| scan.cost());
            self.settle(wait.policy, cost);
        }
        // What still holds its estimate (no response came, or no cost was read) settles to it.
        for i in 0..self.outcomes.len() {
            if matches!(&self.outcomes[i], Outcome::Admitted(d) if d.holds_estimate()) {
                self.settle(i, None);
            }
        }
    }
}
