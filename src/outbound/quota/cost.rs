//! What a call costs: the permits it takes from the quota before it is sent.
//!
//! The cost is known from the request. A cost known only from the response (the tokens of an
//! LLM API) would be reserved as an estimate here and settled where the response future gets
//! the response, keeping the call's [`Decision`](crate::decision::Decision) until then: the
//! difference given back with [`Limiter::refund`](crate::Limiter::refund) or charged as one
//! more reservation.

/// Chooses how many permits an outbound request costs; implemented for closures
/// `Fn(&Req) -> u32` and for [`FixedCost`].
pub trait QuotaCost<Req> {
    /// The permits `request` takes.
    fn cost(&self, request: &Req) -> u32;
}

impl<Req, F: Fn(&Req) -> u32> QuotaCost<Req> for F {
    fn cost(&self, request: &Req) -> u32 {
        self(request)
    }
}

/// The same cost for every call (one by default).
#[derive(Clone, Copy, Debug)]
pub struct FixedCost(u32);

impl FixedCost {
    /// Every call costs `permits`.
    pub fn new(permits: u32) -> Self {
        Self(permits)
    }
}

impl Default for FixedCost {
    fn default() -> Self {
        Self(1)
    }
}

impl<Req> QuotaCost<Req> for FixedCost {
    fn cost(&self, _: &Req) -> u32 {
        self.0
    }
}
