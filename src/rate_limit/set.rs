//! The policies of one layer as one set ([`PolicySet`]): a policy, a chain of them, or a `Vec`.

use std::fmt;

use super::key::{KeyError, KeyExtractor};
use super::policy::{Cost, Policy, PolicyInfo};
use crate::head::RequestHead;
use crate::limiter::BoxReserve;
use crate::{decision::Decision, BoxError, Limiter, Quota};

/// The policies of one layer: one [`Policy`], several chained with
/// [`Policy::and`] (each with its own key and limiter
/// types), or a `Vec` of policies of one type (built at run time, as from a configuration).
///
/// Sealed: what the layer asks of it is the crate's own business.
pub trait PolicySet: sealed::Policies + Send + Sync + 'static {}

impl<P: sealed::Policies + Send + Sync + 'static> PolicySet for P {}

/// Something the layer does to one policy of a set, whatever the policy's key and limiter
/// types: give its admission back, settle it, read its quota.
pub trait Visit {
    /// What it gives back.
    type Output;

    /// Does it to a policy's `limiter`, whose key and cost for the request are in `slot` (once
    /// asked).
    fn visit<K, L: Limiter<K>>(self, limiter: &L, slot: &Slot<K>) -> Self::Output;
}

/// What one policy answers when asked about a request.
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
    use super::{PolicyAnswer, PolicyInfo, RequestHead, Visit};

    /// What the layer asks of its policies; implemented by the crate's sets alone.
    pub trait Policies {
        /// The keys of one request, one slot per policy (by default, none found yet).
        type Keys: Default + Send + 'static;

        /// How many policies.
        fn count(&self) -> usize;

        /// How each policy is described to clients, in order.
        fn describe(&self, out: &mut Vec<PolicyInfo>);

        /// Asks policy `i` about the request: finds its cost and key (kept in `keys`), then its
        /// limiter's decision.
        fn ask(&self, i: usize, head: &RequestHead<'_>, keys: &mut Self::Keys) -> PolicyAnswer;

        /// Hands policy `i`, with what it keeps of the request, to `visit`: everything the layer
        /// does to one policy but asking it goes through here, so that a new thing to do is one
        /// [`Visit`] and no new method of every set.
        fn visit<V: Visit>(&self, i: usize, keys: &Self::Keys, visit: V) -> V::Output;
    }
}

/// What one policy keeps of one request: its key and the cost it was asked for.
pub(crate) type Slot<K> = Option<(K, u32)>;

impl<X, L> sealed::Policies for Policy<X, L>
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

    fn visit<V: Visit>(&self, _: usize, keys: &Self::Keys, visit: V) -> V::Output {
        visit.visit(&self.limiter, keys)
    }
}

impl<A: PolicySet, B: PolicySet> sealed::Policies for Chain<A, B> {
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

    fn visit<V: Visit>(&self, i: usize, keys: &Self::Keys, visit: V) -> V::Output {
        match i.checked_sub(self.first.count()) {
            None => self.first.visit(i, &keys.0, visit),
            Some(j) => self.second.visit(j, &keys.1, visit),
        }
    }
}

/// Policies of one type, as many as a configuration names. Each request keeps its keys in one
/// allocation; chain policies with [`Policy::and`] where
/// their number is known when the code is written.
impl<X, L> sealed::Policies for Vec<Policy<X, L>>
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

    fn visit<V: Visit>(&self, i: usize, keys: &Self::Keys, visit: V) -> V::Output {
        visit.visit(&self[i].limiter, &keys[i])
    }
}

/// Gives an admission back, or settles it, leaving in its place what it told the client (a
/// decision that gives nothing back: [`Decision::report`]); answers the cost the policy asked
/// for.
pub(crate) struct RefundOrSettle<'a>(pub(crate) &'a mut Decision, pub(crate) SettleTo);

/// What an admission is settled to.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SettleTo {
    /// Nothing: it is given back ([`Limiter::refund`]).
    Refund,
    /// What the request turned out to cost.
    Cost(u32),
    /// The cost the policy asked for: the estimate stands.
    Estimate,
}

impl Visit for RefundOrSettle<'_> {
    type Output = u32;

    fn visit<K, L: Limiter<K>>(self, limiter: &L, slot: &Slot<K>) -> u32 {
        let admission = std::mem::replace(self.0, self.0.report());
        let (key, asked) =
            (slot.as_ref()).expect("a policy admits a request only once its key is found");
        match self.1 {
            SettleTo::Refund => limiter.refund(key, *asked, admission),
            SettleTo::Cost(cost) => limiter.settle(key, *asked, admission, cost),
            SettleTo::Estimate => limiter.settle(key, *asked, admission, *asked),
        };
        *asked
    }
}

/// The policy's quota for the key it found (what its headers advertise), or its limiter's.
pub(crate) struct QuotaOf;

impl Visit for QuotaOf {
    type Output = Quota;

    fn visit<K, L: Limiter<K>>(self, limiter: &L, slot: &Slot<K>) -> Quota {
        match slot {
            Some((key, _)) => limiter.quota_for(key),
            None => limiter.quota(),
        }
    }
}
