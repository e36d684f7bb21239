//! The policies of one layer as one set ([`PolicySet`]): a policy, a chain of them, or a `Vec`.

use std::fmt;

use super::key::{KeyError, KeyExtractor};
use super::policy::{Cost, Policy, PolicyInfo, Settle};
use super::usage::BodyUsage;
use crate::head::RequestHead;
use crate::limiter::BoxReserve;
use crate::{decision::Decision, BoxError, Limiter, Quota};

/// The policies of one layer: one [`Policy`], several chained with
/// [`Policy::and`] (each with its own key and limiter
/// types), or a `Vec` of policies of one type (built at run time, as from a configuration).
///
/// Sealed: its methods are the layer's business.
pub trait PolicySet: sealed::Sealed + Send + Sync + 'static {
    /// The keys of one request, one slot per policy (by default, none found yet).
    #[doc(hidden)]
    type Keys: Default + Send + 'static;

    /// How many policies.
    #[doc(hidden)]
    fn count(&self) -> usize;

    /// How each policy is described to clients, in order.
    #[doc(hidden)]
    fn describe(&self, out: &mut Vec<PolicyInfo>);

    /// Asks policy `i` about the request: finds its cost and key (kept in `keys`), then its
    /// limiter's decision.
    #[doc(hidden)]
    fn ask(&self, i: usize, head: &RequestHead<'_>, keys: &mut Self::Keys) -> PolicyAnswer;

    /// Gives policy `i`'s admission back; returns the cost the policy found for the request.
    #[doc(hidden)]
    fn refund(&self, i: usize, keys: &Self::Keys, decision: Decision) -> u32;

    /// What `response` says the request cost policy `i`, if the policy settles from the
    /// response head and the head says (`None`: the estimate stands).
    #[doc(hidden)]
    fn settled_cost(&self, i: usize, response: &http::response::Parts) -> Option<u32>;

    /// Where the cost is in the response body, if policy `i` settles from the body.
    #[doc(hidden)]
    fn body_usage(&self, i: usize) -> Option<&BodyUsage>;

    /// Settles policy `i`'s admission to `cost`; returns the cost the policy found for the
    /// request (its estimate).
    #[doc(hidden)]
    fn settle(&self, i: usize, keys: &Self::Keys, decision: Decision, cost: u32) -> u32;

    /// Policy `i`'s quota for the key it found (the quota its headers advertise), or its
    /// limiter's quota if it found none.
    #[doc(hidden)]
    fn quota(&self, i: usize, keys: &Self::Keys) -> Quota;
}

/// What one policy answers when asked about a request.
#[doc(hidden)]
pub enum PolicyAnswer {
    /// The request costs the policy nothing: the policy sits it out.
    Free,
    /// The policy found no key for the request.
    NoKey(KeyError),
    /// The limiter's decision, made at once.
    Now(Result<Decision, BoxError>),
    /// The limiter's decision, to come (it needs I/O).
    Later(BoxReserve),
}

impl fmt::Debug for PolicyAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyAnswer").finish_non_exhaustive()
    }
}

/// Two sets of policies, asked in order: the type that [`Policy::and`] builds.
#[derive(Clone, Debug)]
pub struct Chain<A, B> {
    first: A,
    second: B,
}

impl<A, B> Chain<A, B> {
    pub(crate) fn new(first: A, second: B) -> Self {
        Self { first, second }
    }

    /// These policies and then `next`.
    pub fn and<Q>(self, next: Q) -> Chain<Self, Q> {
        Chain::new(self, next)
    }
}

mod sealed {
    pub trait Sealed {}
    impl<X, L> Sealed for super::Policy<X, L> {}
    impl<A, B> Sealed for super::Chain<A, B> {}
    impl<X, L> Sealed for Vec<super::Policy<X, L>> {}
}

/// What one policy keeps of one request: its key and the cost it was asked for.
pub(crate) type Slot<K> = Option<(K, u32)>;

impl<X, L> PolicySet for Policy<X, L>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    type Keys = Slot<X::Key>;

    fn count(&self) -> usize {
        1
    }

    fn describe(&self, out: &mut Vec<PolicyInfo>) {
        out.push(self.info());
    }

    fn ask(&self, _: usize, head: &RequestHead<'_>, keys: &mut Self::Keys) -> PolicyAnswer {
        let cost = match &self.cost {
            Cost::Fixed(permits) => *permits,
            Cost::By(cost) => cost(head),
        };
        if cost == 0 {
            return PolicyAnswer::Free;
        }
        let key = match self.key.extract(head) {
            Ok(key) => key,
            Err(error) => return PolicyAnswer::NoKey(error),
        };
        let (key, cost) = keys.insert((key, cost));
        match self.limiter.reserve_now(key, *cost) {
            Some(result) => PolicyAnswer::Now(result),
            None => PolicyAnswer::Later(Box::pin(self.limiter.reserve(key, *cost))),
        }
    }

    fn refund(&self, _: usize, keys: &Self::Keys, decision: Decision) -> u32 {
        let (key, cost) = keys
            .as_ref()
            .expect("a policy admits a request only once its key is found");
        self.limiter.refund(key, *cost, decision);
        *cost
    }

    fn settled_cost(&self, _: usize, response: &http::response::Parts) -> Option<u32> {
        match &self.settle {
            Settle::ByHead(settled) => settled(response),
            Settle::Never | Settle::ByBody(_) => None,
        }
    }

    fn body_usage(&self, _: usize) -> Option<&BodyUsage> {
        match &self.settle {
            Settle::ByBody(usage) => Some(usage),
            Settle::Never | Settle::ByHead(_) => None,
        }
    }

    fn settle(&self, _: usize, keys: &Self::Keys, decision: Decision, cost: u32) -> u32 {
        let (key, estimate) = keys
            .as_ref()
            .expect("a policy admits a request only once its key is found");
        self.limiter.settle(key, *estimate, decision, cost);
        *estimate
    }

    fn quota(&self, _: usize, keys: &Self::Keys) -> Quota {
        match keys {
            Some((key, _)) => self.limiter.quota_for(key),
            None => self.limiter.quota(),
        }
    }
}

impl<A: PolicySet, B: PolicySet> PolicySet for Chain<A, B> {
    type Keys = (A::Keys, B::Keys);

    fn count(&self) -> usize {
        self.first.count() + self.second.count()
    }

    fn describe(&self, out: &mut Vec<PolicyInfo>) {
        self.first.describe(out);
        self.second.describe(out);
    }

    fn ask(&self, i: usize, head: &RequestHead<'_>, keys: &mut Self::Keys) -> PolicyAnswer {
        match i.checked_sub(self.first.count()) {
            None => self.first.ask(i, head, &mut keys.0),
            Some(j) => self.second.ask(j, head, &mut keys.1),
        }
    }

    fn refund(&self, i: usize, keys: &Self::Keys, decision: Decision) -> u32 {
        match i.checked_sub(self.first.count()) {
            None => self.first.refund(i, &keys.0, decision),
            Some(j) => self.second.refund(j, &keys.1, decision),
        }
    }

    fn settled_cost(&self, i: usize, response: &http::response::Parts) -> Option<u32> {
        match i.checked_sub(self.first.count()) {
            None => self.first.settled_cost(i, response),
            Some(j) => self.second.settled_cost(j, response),
        }
    }

    fn body_usage(&self, i: usize) -> Option<&BodyUsage> {
        match i.checked_sub(self.first.count()) {
            None => self.first.body_usage(i),
            Some(j) => self.second.body_usage(j),
        }
    }

    fn settle(&self, i: usize, keys: &Self::Keys, decision: Decision, cost: u32) -> u32 {
        match i.checked_sub(self.first.count()) {
            None => self.first.settle(i, &keys.0, decision, cost),
            Some(j) => self.second.settle(j, &keys.1, decision, cost),
        }
    }

    fn quota(&self, i: usize, keys: &Self::Keys) -> Quota {
        match i.checked_sub(self.first.count()) {
            None => self.first.quota(i, &keys.0),
            Some(j) => self.second.quota(j, &keys.1),
        }
    }
}

/// Policies of one type, as many as a configuration names. Each request keeps its keys in one
/// allocation; chain policies with [`Policy::and`] where
/// their number is known when the code is written.
impl<X, L> PolicySet for Vec<Policy<X, L>>
where
    X: KeyExtractor,
    L: Limiter<X::Key>,
{
    type Keys = Vec<Slot<X::Key>>;

    fn count(&self) -> usize {
        Vec::len(self)
    }

    fn describe(&self, out: &mut Vec<PolicyInfo>) {
        out.extend(self.iter().map(Policy::info));
    }

    fn ask(&self, i: usize, head: &RequestHead<'_>, keys: &mut Self::Keys) -> PolicyAnswer {
        // Policies are asked in order, the first one first: a slot for each, then.
        if keys.is_empty() {
            keys.resize_with(Vec::len(self), || None);
        }
        self[i].ask(0, head, &mut keys[i])
    }

    fn refund(&self, i: usize, keys: &Self::Keys, decision: Decision) -> u32 {
        self[i].refund(0, &keys[i], decision)
    }

    fn settled_cost(&self, i: usize, response: &http::response::Parts) -> Option<u32> {
        self[i].settled_cost(0, response)
    }

    fn body_usage(&self, i: usize) -> Option<&BodyUsage> {
        self[i].body_usage(0)
    }

    fn settle(&self, i: usize, keys: &Self::Keys, decision: Decision, cost: u32) -> u32 {
        self[i].settle(0, &keys[i], decision, cost)
    }

    fn quota(&self, i: usize, keys: &Self::Keys) -> Quota {
        self[i].quota(0, &keys[i])
    }
}
