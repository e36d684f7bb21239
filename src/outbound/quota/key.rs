//! What a call is counted as: its key and its cost.

/// Chooses the limiter key of an outbound request; implemented for closures
/// `Fn(&Req) -> K` and for [`OneKey`].
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

/// One key, `()`, for every call: the whole dependency shares one quota. The default.
#[derive(Clone, Copy, Debug, Default)]
pub struct OneKey;

impl<Req> QuotaKey<Req> for OneKey {
    type Key = ();

    fn key(&self, _: &Req) {}
}

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
