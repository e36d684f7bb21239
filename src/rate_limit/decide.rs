//! The decision on one request, made the same way by the service's `call` and by its response
//! future: ask each policy in turn, record its outcome, and conclude.

use std::sync::Arc;
use std::time::Duration;

use crate::head::RequestHead;
use bytes::Bytes;
use http::{Response, StatusCode};
use smallvec::SmallVec;

use super::key::KeyError;
use super::layer::{FailMode, Shared};
use super::policy::{BoxReserve, PolicySet};
use super::response::{problem_response, AdmittedHeaders, Outcome, Refusal};
use crate::{
    decision::{Decision, InsufficientCapacity},
    BoxError,
};

const INLINE: usize = 4;

/// Outcomes for any number of policies; the common case (up to four) does not allocate.
// Inline on purpose: it lives on the stack of `call`, and is boxed with the request when the
// decision is deferred. A `SmallVec` leaves the slots it has not filled unwritten (an array of
// four empty outcomes, built for every request, was two copies of half a kilobyte).
pub(crate) struct OutcomeList(SmallVec<[Outcome; INLINE]>);

impl OutcomeList {
    #[inline]
    pub(crate) fn new(policies: usize) -> Self {
        if policies <= INLINE {
            Self(SmallVec::new())
        } else {
            Self(SmallVec::with_capacity(policies))
        }
    }

    pub(crate) fn push(&mut self, outcome: Outcome) {
        self.0.push(outcome);
    }

    pub(crate) fn set(&mut self, i: usize, outcome: Outcome) {
        self.0[i] = outcome;
    }

    /// Takes the decision out of outcome `i` if it is an admission (leaving
    /// [`Outcome::Skipped`] in its place); any other outcome stays.
    pub(crate) fn take_admitted(&mut self, i: usize) -> Option<Decision> {
        let slot = &mut self.0[i];
        if !matches!(slot, Outcome::Admitted(_)) {
            return None;
        }
        match std::mem::replace(slot, Outcome::Skipped) {
            Outcome::Admitted(decision) => Some(decision),
            _ => None,
        }
    }

    pub(crate) fn as_slice(&self) -> &[Outcome] {
        &self.0
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// What a request holds while it is decided: each policy's key and cost, and each outcome so
/// far (one per policy asked, in order).
pub(crate) struct Ledger<P: PolicySet> {
    pub(crate) keys: P::Keys,
    pub(crate) outcomes: OutcomeList,
}

/// Where the decision stands after [`Ledger::drive`].
pub(crate) enum Next {
    /// A policy whose limiter needs I/O: record what this future gives, then drive on.
    Reserve(BoxReserve),
    /// Every policy has been asked.
    Done(Conclusion),
}

/// What every policy having decided comes to.
pub(crate) enum Conclusion {
    /// Refused (or unjudgeable): the answer; every permit granted has been given back.
    Answer(Response<Bytes>),
    /// Admitted once the last permit falls due.
    Wait(Duration),
    /// Admitted now.
    Admit,
}

impl<P: PolicySet> Ledger<P> {
    /// A ledger with the keys found so far and no outcome yet.
    #[inline]
    pub(crate) fn with_keys(policies: &P, keys: P::Keys) -> Self {
        Self {
            keys,
            outcomes: OutcomeList::new(policies.len()),
        }
    }

    /// Asks every policy not asked yet, in order, as far as they answer at once.
    pub(crate) fn drive(&mut self, shared: &Shared<P>, head: &RequestHead<'_>) -> Next {
        let policies = &*shared.policies;
        loop {
            let i = self.outcomes.len();
            if i == policies.len() {
                return Next::Done(self.conclude(shared, head));
            }
            match policies.prepare(i, head, &mut self.keys) {
                Ok(0) => self.outcomes.push(Outcome::Skipped),
                Ok(_) => match policies.reserve_now(i, &self.keys) {
                    Some(result) => {
                        if let Some(answer) = self.record(shared, result) {
                            return Next::Done(Conclusion::Answer(answer));
                        }
                    }
                    None => return Next::Reserve(policies.reserve(i, &self.keys)),
                },
                Err(error) => {
                    if let Some(answer) = self.key_error(shared, &error) {
                        return Next::Done(Conclusion::Answer(answer));
                    }
                }
            }
        }
    }

    /// Records that the policy being asked found no key for the request. Returns the response to
    /// send at once when the layer fails closed (having given back what the other policies
    /// granted); otherwise the policy sits the request out.
    pub(crate) fn key_error(
        &mut self,
        shared: &Shared<P>,
        error: &KeyError,
    ) -> Option<Response<Bytes>> {
        let name = &shared.meta.policies[self.outcomes.len()].name;
        log_key_error(name, error, shared.meta.key_error_mode);
        match shared.meta.key_error_mode {
            FailMode::Open => {
                self.outcomes.push(Outcome::Skipped);
                None
            }
            FailMode::Closed => {
                self.refund_all(shared);
                Some(key_error_response(error))
            }
        }
    }

    /// Records the answer of the policy being asked. Returns the response to send at once when
    /// its limiter failed and the layer fails closed (having given back what the other policies
    /// granted).
    pub(crate) fn record(
        &mut self,
        shared: &Shared<P>,
        result: Result<Decision, BoxError>,
    ) -> Option<Response<Bytes>> {
        let info = &shared.meta.policies[self.outcomes.len()];
        match result {
            Ok(decision) if decision.allowed => self.outcomes.push(Outcome::Admitted(decision)),
            Ok(decision) => {
                if !info.enforced() {
                    info.would_have_refused(&decision);
                }
                self.outcomes.push(Outcome::Refused(decision));
            }
            Err(error) => {
                if let Some(too_costly) = error.downcast_ref::<InsufficientCapacity>() {
                    if !info.enforced() {
                        tracing::info!(
                            policy = &*info.name,
                            "rate limit (shadow): the request costs more than the policy can \
                             ever admit; letting it through"
                        );
                    }
                    self.outcomes.push(Outcome::Unadmittable(*too_costly));
                    return None;
                }
                if !info.enforced() || shared.meta.limiter_error_mode == FailMode::Open {
                    tracing::warn!(
                        policy = &*info.name,
                        error = %error,
                        "rate limit: the limiter failed; letting the request through"
                    );
                    self.outcomes.push(Outcome::Failed);
                } else {
                    tracing::warn!(
                        policy = &*info.name,
                        error = %error,
                        "rate limit: the limiter failed; answering 503"
                    );
                    self.refund_all(shared);
                    return Some(problem_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The rate limiter is unavailable; retry later.",
                    ));
                }
            }
        }
        None
    }

    /// What the outcomes come to, once every policy has been asked. A refusal gives every
    /// permit back.
    fn conclude(&mut self, shared: &Shared<P>, head: &RequestHead<'_>) -> Conclusion {
        let mut wait = Duration::ZERO;
        let mut refused = false;
        for (info, outcome) in shared.meta.policies.iter().zip(self.outcomes.as_slice()) {
            if !info.enforced() {
                continue;
            }
            match outcome {
                Outcome::Admitted(d) => wait = wait.max(d.wait),
                Outcome::Refused(_) | Outcome::Unadmittable(_) => refused = true,
                Outcome::Failed | Outcome::Skipped => {}
            }
        }
        if refused {
            // Give every permit back before the refusal is built, so that the hook sees them
            // given back and a hook that panics leaks nothing.
            let outcomes = self.refund_all(shared);
            let response = Refusal {
                meta: &shared.meta,
                request: *head,
                outcomes: outcomes.as_slice(),
                policy_header: shared.meta.policy_header_for(outcomes.as_slice(), |i| {
                    shared.policies.quota(i, &self.keys)
                }),
            }
            .respond();
            Conclusion::Answer(response)
        } else if wait.is_zero() {
            Conclusion::Admit
        } else {
            Conclusion::Wait(wait)
        }
    }

    /// The rate-limit headers of the admitted response, for these keys' quotas.
    #[inline]
    pub(crate) fn admitted_headers(&self, shared: &Shared<P>) -> Option<AdmittedHeaders> {
        shared.meta.admitted_headers(self.outcomes.as_slice(), |i| {
            shared.policies.quota(i, &self.keys)
        })
    }

    /// Gives back every permit held, once: the outcomes are cleared first, so that a refund
    /// that panics cannot lead to a second one. The newest admission goes back first: two
    /// policies on one key and limiter each gave the request an admission, and each refund is
    /// exact while its admission is the key's latest.
    ///
    /// Returns the outcomes as they were, each admission replaced by what it told the client
    /// (a decision that gives nothing back: its permits went back here, once).
    pub(crate) fn refund_all(&mut self, shared: &Shared<P>) -> OutcomeList {
        let mut outcomes = std::mem::replace(&mut self.outcomes, OutcomeList::new(0));
        for i in (0..outcomes.len()).rev() {
            if let Some(decision) = outcomes.take_admitted(i) {
                outcomes.set(i, Outcome::Admitted(decision.report()));
                shared.policies.refund(i, &self.keys, decision);
            }
        }
        outcomes
    }

    /// Takes this ledger out of `self`, leaving one that holds nothing.
    pub(crate) fn take(&mut self) -> Self {
        Ledger {
            keys: std::mem::take(&mut self.keys),
            outcomes: std::mem::replace(&mut self.outcomes, OutcomeList::new(0)),
        }
    }

    /// The request has been handed to the inner service: keeps what the policies that count by
    /// outcome need to settle after the response, if any of them admitted it.
    pub(crate) fn into_settle(mut self, shared: &Arc<Shared<P>>) -> Option<Box<Settle<P>>> {
        let pending = shared.meta.settles
            && shared
                .meta
                .policies
                .iter()
                .zip(self.outcomes.as_slice())
                .any(|(info, o)| info.count_if && matches!(o, Outcome::Admitted(_)));
        if pending {
            Some(Box::new(Settle {
                shared: Arc::clone(shared),
                ledger: self,
            }))
        } else {
            self.outcomes.clear();
            None
        }
    }
}

/// The admissions of policies that count by outcome, kept until the response says whether the
/// request counts. Dropped without a response (the inner service failed, or the response future
/// was dropped), it keeps every permit spent.
pub(crate) struct Settle<P: PolicySet> {
    shared: Arc<Shared<P>>,
    ledger: Ledger<P>,
}

impl<P: PolicySet> Settle<P> {
    /// Gives back the permits of the policies that `response` does not count against, newest
    /// first, and brings `headers` (the rate-limit headers of this response) up to date with what
    /// was given back.
    ///
    /// A predicate that panics is taken to count the response (the permit stays spent, never
    /// over-granted), with an `error` log line; the other policies are settled all the same.
    pub(crate) fn apply(
        self,
        response: &http::response::Parts,
        headers: &mut Option<AdmittedHeaders>,
    ) {
        let Settle { shared, mut ledger } = self;
        let mut gave_back = false;
        for i in (0..ledger.outcomes.len()).rev() {
            let info = &shared.meta.policies[i];
            if !info.count_if || !matches!(ledger.outcomes.as_slice()[i], Outcome::Admitted(_)) {
                continue;
            }
            let counts = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                shared.policies.counts(i, response)
            }))
            .unwrap_or_else(|_| {
                tracing::error!(
                    policy = &*info.name,
                    "rate limit: the policy's count_if predicate panicked; the response counts"
                );
                true
            });
            if !counts {
                let Some(decision) = ledger.outcomes.take_admitted(i) else {
                    continue;
                };
                // The client is told the state as it is now: the permits are back.
                let cost = u64::from(shared.policies.cost(i, &ledger.keys));
                let mut after = decision.report();
                after.remaining = decision.remaining.saturating_add(cost).min(decision.limit);
                shared.policies.refund(i, &ledger.keys, decision);
                ledger.outcomes.set(i, Outcome::Admitted(after));
                gave_back = true;
            }
        }
        if gave_back && headers.is_some() {
            *headers = ledger.admitted_headers(&shared);
        }
    }
}

fn log_key_error(policy: &str, error: &KeyError, mode: FailMode) {
    let action = match mode {
        FailMode::Open => "letting the request through without it",
        FailMode::Closed => "answering with an error",
    };
    if error.status().is_server_error() {
        tracing::error!(
            policy,
            reason = error.reason(),
            "rate limit: no key for the request; {action}"
        );
    } else {
        tracing::debug!(
            policy,
            reason = error.reason(),
            "rate limit: no key for the request; {action}"
        );
    }
}

fn key_error_response(error: &KeyError) -> Response<Bytes> {
    if error.status().is_server_error() {
        // The reason names server internals; it is in the log, not in the answer.
        problem_response(
            error.status(),
            "The server could not identify the client for rate limiting.",
        )
    } else {
        problem_response(error.status(), error.reason())
    }
}
