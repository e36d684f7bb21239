//! How a call is charged: under which key, and how many permits it takes before it is sent.
//!
//! The cost is known from the request. A cost known only from the response (the tokens of an
//! LLM API) would be reserved as an estimate here and settled where the response future gets
//! the response, keeping the call's [`Decision`](crate::decision::Decision) until then: the
//! difference given back with [`Limiter::refund`](crate::Limiter::refund) or charged as one
//! more reservation.

/// Chooses the limiter key of an outbound request; implemented for closures `Fn(&Req) -> K`
/// and for `()`, one key for every call (the whole dependency shares one quota, the default).
pub trait QuotaKey<Req> {
    /// The key handed to the limiter.
    type Key;

    /// The key of `request`.
    fn key(&self, request: &Req) -> Self::Key;
}

impl<Req, K, F: Fn(&Req) -> K> QuotaKey<Req> for F {
    type Key = K;

    fn key(&self, request: &Req) -> K {
        self(request)
    }
}

impl<Req> QuotaKey<Req> for () {
    type Key = ();

    fn key(&self, _: &Req) {}
}

/// Chooses how many permits an outbound request costs; implemented for closures
/// `Fn(&Req) -> u32` and for `u32`, the same cost for every call (one by default).
pub trait QuotaCost<Req> {
    /// The permits `request` takes.
    fn cost(&self, request: &Req) -> u32;
}

impl<Req, F: Fn(&Req) -> u32> QuotaCost<Req> for F {
    fn cost(&self, request: &Req) -> u32 {
        self(request)
    }
}

impl<Req> QuotaCost<Req> for u32 {
    fn cost(&self, _: &Req) -> u32 {
        *self
    }
}
