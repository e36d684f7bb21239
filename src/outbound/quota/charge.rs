//! How a call is charged: under which key, how many permits it takes before it is sent, and
//! what it turned out to cost once its response came.
//!
//! A cost known only from the response (the tokens of an LLM API) is reserved as an estimate
//! before the call and settled where the response future gets the response, which keeps the
//! call's [`Decision`](crate::decision::Decision) until then: see
//! [`Limiter::settle`](crate::Limiter::settle).

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

/// What a call turned out to cost, read from its response: implemented for closures
/// `Fn(&Resp) -> Option<u32>` and for `()`, the cost asked for stands (the default).
pub trait QuotaSettle<Resp> {
    /// The cost `response` reports, or `None` if it says nothing readable (the estimate
    /// stands).
    fn settled(&self, response: &Resp) -> Option<u32>;
}

impl<Resp, F: Fn(&Resp) -> Option<u32>> QuotaSettle<Resp> for F {
    fn settled(&self, response: &Resp) -> Option<u32> {
        self(response)
    }
}

impl<Resp> QuotaSettle<Resp> for () {
    fn settled(&self, _: &Resp) -> Option<u32> {
        None
    }
}
