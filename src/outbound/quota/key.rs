//! Under which key a call is counted.

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
